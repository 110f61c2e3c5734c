//! `RankSave`: a save whose plans and results travel outside ckpt (as in `dcp.save` through
//! `ckpt.dcp.Writer`): three ranks' items, committed by the coordinator with the metadata, read back whole;
//! a failed rank leaves the previous checkpoint.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_distcp::{
    ChunkStorageMetadata, DcpReader, Error, ItemData, Metadata, MetadataIndex, RankItem, RankSave, StorageMetadata,
    TensorProperties, TensorStorageMetadata, WriteOptions, save,
};
use ckpt_tensor::{DType, PathItem, Tensor, Value};

/// A torch.save of the int 7, as torch's planner hands a BYTE_IO item over (ckpt writes it the same way).
fn bytes_item() -> Vec<u8> {
    let mut out = Vec::new();
    ckpt_torch::save_to_writer(&Value::Int(7), &mut out, "archive", &ckpt_torch::WriteOptions::default()).unwrap();
    out
}

fn metadata(world: usize, rows: usize) -> Metadata {
    let chunks =
        (0..world).map(|r| ChunkStorageMetadata { offsets: vec![r * rows, 0], sizes: vec![rows, 3] }).collect();
    Metadata {
        state_dict_metadata: vec![
            (
                "model.w".into(),
                StorageMetadata::Tensor(TensorStorageMetadata {
                    properties: TensorProperties::new(DType::F32),
                    size: vec![world * rows, 3],
                    chunks,
                }),
            ),
            ("step".into(), StorageMetadata::Bytes),
        ],
        planner_data: Some(vec![
            ("model.w".into(), vec![PathItem::Key("model".into()), PathItem::Key("w".into())]),
            ("step".into(), vec![PathItem::Key("step".into())]),
        ]),
        ..Metadata::default()
    }
}

#[test]
fn three_ranks_write_their_chunks_and_the_coordinator_commits() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("step-1");
    let (world, rows) = (3, 2);
    let full: Vec<f32> = (0..world * rows * 3).map(|i| i as f32).collect();
    let options = WriteOptions::default().with_overwrite(true);
    let coordinator = RankSave::begin(&dir, world, &options).unwrap();
    let ticket = coordinator.ticket();
    let ranks: Vec<RankSave> = std::iter::once(coordinator)
        .chain((1..world).map(|r| RankSave::join(&dir, &ticket, r, &options).unwrap()))
        .collect();
    let step = bytes_item();
    let mut metadata = metadata(world, rows);
    let mut reports = Vec::new();
    for (r, rank) in ranks.iter().enumerate() {
        let chunk = Tensor::from_slice(&full[r * rows * 3..(r + 1) * rows * 3], &[rows, 3]).unwrap();
        let mut items =
            vec![RankItem { fqn: "model.w".into(), offsets: Some(vec![r * rows, 0]), data: ItemData::Tensor(&chunk) }];
        if r == 0 {
            items.push(RankItem { fqn: "step".into(), offsets: None, data: ItemData::Bytes(&step) });
        }
        let infos = rank.write(&items).unwrap();
        assert_eq!(infos.len(), items.len());
        assert!(matches!(rank.write(&items), Err(Error::Unwritable { .. })), "a second write is refused");
        for (item, info) in items.iter().zip(infos) {
            assert_eq!(info.relative_path, format!("__{r}_0.distcp"));
            let index = MetadataIndex { fqn: item.fqn.clone(), offset: item.offsets.clone(), index: None };
            metadata.storage_data.push((index, info));
        }
        reports.push(rank.report(Ok(())).unwrap());
    }
    // Nothing is visible before the commit.
    assert!(!dir.exists());
    let mut ranks = ranks.into_iter();
    let coordinator = ranks.next().unwrap();
    drop(ranks);
    let report = coordinator.commit(&metadata, reports).unwrap();
    assert_eq!((report.tensors, report.values), (1, 1));
    let r = DcpReader::open(&dir).unwrap();
    assert_eq!(r.read_tensor("model.w").unwrap(), Tensor::from_slice(&full, &[world * rows, 3]).unwrap());
    assert_eq!(r.read_value("step").unwrap(), Value::Int(7));
    assert!(dir.join("ckpt.checksums.json").exists());
}

#[test]
fn a_rank_that_fails_leaves_the_previous_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("step-1");
    let previous = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
    save(&previous, &dir, &WriteOptions::default()).unwrap();
    let before = DcpReader::open(&dir).unwrap().read_tensor("w").unwrap();

    let options = WriteOptions::default().with_overwrite(true);
    let coordinator = RankSave::begin(&dir, 2, &options).unwrap();
    let other = RankSave::join(&dir, &coordinator.ticket(), 1, &options).unwrap();
    let t = Tensor::from_slice(&[5.0f32; 6], &[2, 3]).unwrap();
    coordinator
        .write(&[RankItem { fqn: "model.w".into(), offsets: Some(vec![0, 0]), data: ItemData::Tensor(&t) }])
        .unwrap();
    let reports = vec![
        coordinator.report(Ok(())).unwrap(),
        other.report(Err(ckpt_io::RankFailure::new("CUDA out of memory"))).unwrap(),
    ];
    let e = coordinator.commit(&metadata(2, 2), reports).unwrap_err();
    assert!(matches!(&e, Error::RankFailed { rank: 1, message } if message.contains("out of memory")), "{e}");
    assert_eq!(DcpReader::open(&dir).unwrap().read_tensor("w").unwrap(), before);

    // Without overwrite, an existing checkpoint is refused before anything is written.
    let e = RankSave::begin(&dir, 2, &WriteOptions::default().with_overwrite(false)).unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
}
