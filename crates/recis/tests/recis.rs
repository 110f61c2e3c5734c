//! ckpt-recis without Python: bad input (each rule a specific error, no panic on any truncation), writing
//! from many shards through a collective, the checkpoint manager (list, rotation across processes, atomic
//! commits, dense state), resharding (M → N, negative ids), and the generic `CheckpointRead` view.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};

use ckpt_collective::{Collective, SingleProcess, ThreadGroup};
use ckpt_recis::data_file::write as write_data_file;
use ckpt_recis::manager::{ShardState, checkpoint_id};
use ckpt_recis::name::{IdPartition, SliceInfo, gen_slice};
use ckpt_recis::table::TableChild;
use ckpt_recis::writer::{Block, save_blocks, save_tables, write_meta, write_shard_files};
use ckpt_recis::{
    CheckpointManager, Error, HashTable, Index, RecisReader, ReshardOptions, Shard, Slot, SparseCheckpoint, TensorKey,
    WriteOptions, reshard,
};
use ckpt_recis::{load_shard, reshard_sparse};
use ckpt_tensor::{CheckpointRead, DType, EntryKind, Tensor, Value};

fn emb(ids: &[i64], width: usize) -> Slot {
    let v: Vec<f32> = ids.iter().flat_map(|&i| (0..width).map(move |j| i as f32 + j as f32 / 10.0)).collect();
    Slot::new("embedding", Tensor::from_slice(&v, &[ids.len(), width]).unwrap()).unwrap()
}

fn table(name: &str, ids: &[i64], slice: SliceInfo) -> HashTable {
    let steps: Vec<i64> = ids.iter().map(|i| i & 7).collect();
    let child = TableChild::new(
        name,
        ids.to_vec(),
        vec![emb(ids, 3), Slot::new("step_filter", Tensor::from_slice(&steps, &[ids.len(), 1]).unwrap()).unwrap()],
    )
    .unwrap();
    HashTable::single(slice, child)
}

fn full() -> SliceInfo {
    SliceInfo::full(65536).unwrap()
}

/// A small valid single-shard checkpoint in `dir`.
fn small(dir: &Path) {
    let dense = [("w".to_string(), Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap())];
    save_tables(
        &[table("t", &[1, 2, 3], full())],
        &dense,
        dir,
        &WriteOptions::default().with_parallel(2),
        &SingleProcess,
    )
    .unwrap();
}

fn on_ranks<T: Send + 'static>(world: usize, f: impl Fn(ThreadGroup) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = std::sync::Arc::new(f);
    let handles: Vec<_> = ThreadGroup::new(world)
        .into_iter()
        .map(|g| {
            let f = std::sync::Arc::clone(&f);
            std::thread::spawn(move || f(g))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn open_err(dir: &Path) -> Error {
    SparseCheckpoint::open(dir).expect_err("the checkpoint must be rejected")
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut j: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    f(&mut j);
    fs::write(path, j.to_string()).unwrap();
}

// ---------------------------------------------------------------------------------------------------------
// Bad input: the five rules of the issue, then the others.

#[test]
fn index_naming_a_missing_file() {
    let d = tempfile::tempdir().unwrap();
    small(d.path());
    fs::remove_file(d.path().join("model-000001-of-000002.safetensors")).unwrap();
    match open_err(d.path()) {
        Error::MissingDataFile { file, file_id, .. } => {
            assert_eq!(file, "model-000001-of-000002.safetensors");
            assert_eq!(file_id, 1);
        }
        e => panic!("{e}"),
    }
}

#[test]
fn block_name_without_caret() {
    let d = tempfile::tempdir().unwrap();
    small(d.path());
    edit_json(&d.path().join("tensorkey.json"), |j| j["t.id/part_0_1"] = "t@id".into());
    match open_err(d.path()) {
        Error::BlockNameWithoutCaret { key, name } => {
            assert_eq!((key.as_str(), name.as_str()), ("t.id/part_0_1", "t@id"))
        }
        e => panic!("{e}"),
    }
}

#[test]
fn slice_string_that_does_not_parse() {
    for bad in ["0@x@65536", "0@65536", "5@4@65536", "0@65537@65536", "0@1@99999999999"] {
        let d = tempfile::tempdir().unwrap();
        small(d.path());
        edit_json(&d.path().join("tensorkey.json"), |j| {
            j["t.embedding/part_0_1"] = format!("t@embedding^{bad}").into()
        });
        match open_err(d.path()) {
            Error::BadSlice { slice, .. } => assert_eq!(slice, bad),
            e => panic!("{bad}: {e}"),
        }
    }
}

/// Writes a single-file checkpoint of raw blocks (key, internal name or None for dense, tensor) without any
/// validation, so the reader meets what a broken writer could leave.
fn craft(dir: &Path, blocks: &[(&str, Option<&str>, Tensor)]) {
    let file = "model-000000-of-000001.safetensors";
    let list: Vec<(String, Tensor)> = blocks.iter().map(|(k, _, t)| (k.to_string(), t.clone())).collect();
    write_data_file(&dir.join(file), &list).unwrap();
    let mut index = Index::default();
    index.file_index.insert(file.into(), 0);
    let mut tk = TensorKey::default();
    for (k, internal, _) in blocks {
        index.block_index.insert(k.to_string(), 0);
        if let Some(i) = internal {
            tk.map.insert(k.to_string(), i.to_string());
        }
    }
    fs::write(dir.join("index"), index.to_json()).unwrap();
    fs::write(dir.join("tensorkey.json"), tk.to_json()).unwrap();
}

fn ids(v: &[i64]) -> Tensor {
    Tensor::from_slice(v, &[v.len()]).unwrap()
}

fn rows(n: usize) -> Tensor {
    Tensor::zeros(DType::F32, &[n, 3]).unwrap()
}

const S: &str = "00000@65536@65536";

#[test]
fn ids_and_slot_rows_of_different_lengths() {
    let d = tempfile::tempdir().unwrap();
    craft(
        d.path(),
        &[
            ("t.id/part_0_1", Some(&format!("t@id^{S}")), ids(&[1, 2, 3])),
            ("t.embedding/part_0_1", Some(&format!("t@embedding^{S}")), rows(2)),
        ],
    );
    match open_err(d.path()) {
        Error::RowCountMismatch { child, ids, slot, rows, .. } => {
            assert_eq!((child.as_str(), ids, slot.as_str(), rows), ("t", 3, "embedding", 2));
        }
        e => panic!("{e}"),
    }
    // The writer refuses to produce such a table, at every level.
    assert!(matches!(
        TableChild::new("t", vec![1, 2, 3], vec![Slot::new("embedding", rows(2)).unwrap()]),
        Err(Error::RowCountMismatch { .. })
    ));
    let blocks = [
        Block::table("t", "id", full(), ids(&[1, 2, 3])).unwrap(),
        Block::table("t", "embedding", full(), rows(2)).unwrap(),
    ];
    let out = tempfile::tempdir().unwrap();
    assert!(matches!(write_shard_files(out.path(), Shard::single(), 1, &blocks), Err(Error::RowCountMismatch { .. })));
    assert_eq!(fs::read_dir(out.path()).unwrap().count(), 0, "nothing written");
}

#[test]
fn header_length_past_the_end() {
    let d = tempfile::tempdir().unwrap();
    small(d.path());
    let p = d.path().join("model-000000-of-000002.safetensors");
    let mut bytes = fs::read(&p).unwrap();
    let len = bytes.len() as u64;
    bytes[..8].copy_from_slice(&(len).to_le_bytes());
    fs::write(&p, &bytes).unwrap();
    match open_err(d.path()) {
        Error::HeaderPastEnd { header_len, file_len, path } => {
            assert_eq!((header_len, file_len as u64), (len, len));
            assert_eq!(path, p);
        }
        e => panic!("{e}"),
    }
}

#[test]
fn other_rules_each_have_their_error() {
    type Edit = fn(&Path);
    type Check = fn(&Error) -> bool;
    let cases: Vec<(&str, Edit, Check)> = vec![
        ("missing index", |d| fs::remove_file(d.join("index")).unwrap(), |e| matches!(e, Error::MissingFile { .. })),
        (
            "missing tensorkey",
            |d| fs::remove_file(d.join("tensorkey.json")).unwrap(),
            |e| matches!(e, Error::MissingFile { .. }),
        ),
        (
            "legacy index",
            |d| fs::write(d.join("index"), "/data/ckpt/0.safetensors\n/data/ckpt/1.safetensors\n").unwrap(),
            |e| matches!(e, Error::LegacyIndex { .. }),
        ),
        (
            "index not JSON",
            |d| fs::write(d.join("index"), "{\"block_index\":").unwrap(),
            |e| matches!(e, Error::Json { .. }),
        ),
        (
            "index wrong shape",
            |d| fs::write(d.join("index"), "{\"files\":{}}").unwrap(),
            |e| matches!(e, Error::BadIndex { .. }),
        ),
        (
            "tensorkey not strings",
            |d| fs::write(d.join("tensorkey.json"), "{\"a\":[1]}").unwrap(),
            |e| matches!(e, Error::BadTensorKey { .. }),
        ),
        (
            "unknown file id",
            |d| edit_json(&d.join("index"), |j| j["block_index"]["w^ "] = 9.into()),
            |e| matches!(e, Error::UnknownFileId { file_id: 9, .. }),
        ),
        (
            "block not in its file",
            |d| edit_json(&d.join("index"), |j| j["block_index"]["w^ "] = 0.into()),
            |e| matches!(e, Error::BlockNotInFile { .. }),
        ),
        (
            "duplicate file id",
            |d| edit_json(&d.join("index"), |j| j["file_index"]["model-000001-of-000002.safetensors"] = 0.into()),
            |e| matches!(e, Error::DuplicateFileId { .. }),
        ),
        (
            "file outside the directory",
            |d| edit_json(&d.join("index"), |j| j["file_index"]["../model-000000-of-000002.safetensors"] = 7.into()),
            |e| matches!(e, Error::BadIndex { .. }),
        ),
        (
            "two keys, one internal name",
            |d| {
                edit_json(&d.join("tensorkey.json"), |j| {
                    j["t.embedding/part_0_1"] = format!("t@step_filter^{S}").into()
                })
            },
            |e| matches!(e, Error::DuplicateBlock { .. }),
        ),
        (
            "table name without @",
            |d| edit_json(&d.join("tensorkey.json"), |j| j["t.embedding/part_0_1"] = format!("tembedding^{S}").into()),
            |e| matches!(e, Error::BadName { .. }),
        ),
        (
            "data file too short",
            |d| fs::write(d.join("model-000000-of-000002.safetensors"), [1, 2, 3]).unwrap(),
            |e| matches!(e, Error::FileTooShort { .. }),
        ),
        (
            "header too large",
            |d| {
                let p = d.join("model-000000-of-000002.safetensors");
                let mut b = fs::read(&p).unwrap();
                b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
                fs::write(p, b).unwrap();
            },
            |e| matches!(e, Error::HeaderTooLarge { .. }),
        ),
        (
            "trailing garbage in a data file",
            |d| {
                let p = d.join("model-000000-of-000002.safetensors");
                let mut b = fs::read(&p).unwrap();
                b.extend_from_slice(b"junk");
                fs::write(p, b).unwrap();
            },
            |e| matches!(e, Error::BadOffsets { .. }),
        ),
        (
            "unknown dtype",
            |d| {
                let p = d.join("model-000000-of-000002.safetensors");
                let b = fs::read(&p).unwrap();
                let text = String::from_utf8_lossy(&b[8..]).into_owned();
                let at = text.find("\"I64\"").unwrap() + 8;
                let mut b = b.clone();
                b[at + 1..at + 4].copy_from_slice(b"Q64");
                fs::write(p, b).unwrap();
            },
            |e| matches!(e, Error::UnknownDtype { .. }),
        ),
    ];
    for (name, edit, check) in cases {
        let d = tempfile::tempdir().unwrap();
        small(d.path());
        edit(d.path());
        let e = open_err(d.path());
        assert!(check(&e), "{name}: unexpected error {e}");
        // Every error converts to the core error without losing its message.
        let core: ckpt_tensor::Error = e.into();
        assert!(!core.to_string().is_empty());
    }
}

#[test]
fn table_slices_are_validated() {
    let id = |s: &str| format!("t@id^{s}");
    let e = |s: &str| format!("t@embedding^{s}");
    let half = "00000@32768@65536";
    let other = "32768@65536@65536";
    type Case<'a> = (&'a str, Vec<(&'a str, Option<String>, Tensor)>, fn(&Error) -> bool);
    let cases: Vec<Case> = vec![
        ("slots without ids", vec![("t.embedding/part_0_1", Some(e(S)), rows(1))], |e| {
            matches!(e, Error::MissingIdBlock { .. })
        }),
        ("ids without slots", vec![("t.id/part_0_1", Some(id(S)), ids(&[1]))], |e| {
            matches!(e, Error::NoSlotBlocks { .. })
        }),
        (
            "float ids",
            vec![("t.id/part_0_1", Some(id(S)), rows(1)), ("t.embedding/part_0_1", Some(e(S)), rows(1))],
            |e| matches!(e, Error::BadIdBlock { .. }),
        ),
        (
            "slot dtype differs between slices",
            vec![
                ("t.id/part_0_2", Some(id(half)), ids(&[1])),
                ("t.embedding/part_0_2", Some(e(half)), rows(1)),
                ("t.id/part_1_2", Some(id(other)), ids(&[40000])),
                ("t.embedding/part_1_2", Some(e(other)), Tensor::zeros(DType::F64, &[1, 3]).unwrap()),
            ],
            |e| matches!(e, Error::SlotMismatch { .. }),
        ),
        (
            "slot missing in one slice",
            vec![
                ("t.id/part_0_2", Some(id(half)), ids(&[1])),
                ("t.embedding/part_0_2", Some(e(half)), rows(1)),
                ("t.m/part_0_2", Some(format!("t@m^{half}")), rows(1)),
                ("t.id/part_1_2", Some(id(other)), ids(&[40000])),
                ("t.embedding/part_1_2", Some(e(other)), rows(1)),
            ],
            |e| matches!(e, Error::SlotMismatch { .. }),
        ),
        (
            "slot only in a later slice",
            vec![
                ("t.id/part_0_2", Some(id(half)), ids(&[1])),
                ("t.embedding/part_0_2", Some(e(half)), rows(1)),
                ("t.id/part_1_2", Some(id(other)), ids(&[40000])),
                ("t.embedding/part_1_2", Some(e(other)), rows(1)),
                ("t.m/part_1_2", Some(format!("t@m^{other}")), rows(1)),
            ],
            |e| matches!(e, Error::SlotMismatch { slot, .. } if slot == "m"),
        ),
    ];
    for (name, blocks, check) in cases {
        let d = tempfile::tempdir().unwrap();
        let b: Vec<(&str, Option<&str>, Tensor)> =
            blocks.iter().map(|(k, i, t)| (*k, i.as_deref(), t.clone())).collect();
        craft(d.path(), &b);
        let err = open_err(d.path());
        assert!(check(&err), "{name}: unexpected error {err}");
    }

    // Duplicate ids are found at the first look-up; a slice_size other than the target's is an error.
    let d = tempfile::tempdir().unwrap();
    craft(d.path(), &[("t.id/part_0_1", Some(&id(S)), ids(&[4, 4])), ("t.embedding/part_0_1", Some(&e(S)), rows(2))]);
    let c = SparseCheckpoint::open(d.path()).unwrap();
    assert!(matches!(c.child("t").unwrap().position(4), Err(Error::DuplicateId { id: 4, .. })));
    let target = SliceInfo::full(1000).unwrap();
    assert!(matches!(c.load_child("t", target, IdPartition::Unsigned), Err(Error::SliceSizeMismatch { .. })));
    assert!(matches!(c.child("nope"), Err(Error::NotFound { .. })));
    assert!(matches!(c.read_tensor("t@sparse"), Err(Error::NotFound { .. })));
}

#[test]
fn no_truncation_or_bit_flip_panics() {
    let d = tempfile::tempdir().unwrap();
    small(d.path());
    let p = d.path().join("model-000000-of-000002.safetensors");
    let original = fs::read(&p).unwrap();
    for len in 0..original.len() {
        fs::write(&p, &original[..len]).unwrap();
        assert!(SparseCheckpoint::open(d.path()).is_err(), "a {len}-byte prefix must be rejected");
    }
    for i in 0..original.len() {
        let mut b = original.clone();
        b[i] ^= 0x5a;
        fs::write(&p, &b).unwrap();
        // Flips inside tensor data are valid files; elsewhere they must be errors, never panics.
        let _ = SparseCheckpoint::open(d.path()).map(|c| c.child("t").map(|t| t.position(1)));
    }
    let idx = d.path().join("index");
    let original = fs::read(&idx).unwrap();
    for len in 0..original.len() {
        fs::write(&idx, &original[..len]).unwrap();
        assert!(SparseCheckpoint::open(d.path()).is_err(), "index prefix {len}");
    }
}

// ---------------------------------------------------------------------------------------------------------
// Writing from many shards.

#[test]
fn shards_write_their_files_and_shard_0_merges() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    // 3 ranks, parallel 4: each shard has fewer blocks than writers (RecIS INIT deadlocks here).
    on_ranks(3, {
        let dir = dir.clone();
        move |g| {
            let shard = Shard::new(g.rank(), 3).unwrap();
            let all: Vec<i64> = (0..300).map(|i| i * 37 - 100).collect();
            let slice = gen_slice(shard.index(), 3, 65536).unwrap();
            let mine: Vec<i64> = all.iter().copied().filter(|&i| slice.holds(i, IdPartition::Unsigned)).collect();
            let dense = [("step".to_string(), Tensor::from_slice(&[5i64], &[1]).unwrap())];
            save_tables(&[table("t", &mine, slice)], &dense, &dir, &WriteOptions::default().with_parallel(4), &g)
                .unwrap();
        }
    });
    let mut names: Vec<String> =
        fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "ckpt.checksums.json",
            "index",
            "model-000000-of-000012.safetensors",
            "model-000001-of-000012.safetensors",
            "model-000002-of-000012.safetensors",
            "model-000003-of-000012.safetensors",
            "model-000004-of-000012.safetensors",
            "model-000005-of-000012.safetensors",
            "model-000006-of-000012.safetensors",
            "model-000008-of-000012.safetensors",
            "model-000009-of-000012.safetensors",
            "model-000010-of-000012.safetensors",
            "tensorkey.json",
            "torch_rank_weights_embs_table_multi_shard.json",
        ],
        "shard 0 has 4 blocks (3 table + 1 dense), the others 3: their 4th writer writes nothing"
    );
    let c = SparseCheckpoint::open(&dir).unwrap();
    assert_eq!((c.shard_num(), c.parallel()), (Some(3), Some(4)));
    let t = c.child("t").unwrap();
    assert_eq!(t.len(), 300);
    assert_eq!(c.dense_names(), ["step"]);
    for s in 0..3 {
        let keys: Vec<String> = c.shard_blocks(s).iter().map(|b| b.key.clone()).collect();
        let mut want =
            vec![format!("t.id/part_{s}_3"), format!("t.embedding/part_{s}_3"), format!("t.step_filter/part_{s}_3")];
        if s == 0 {
            want.push("step^ ".into());
        }
        assert_eq!(keys, want);
    }
    // File ids follow the shards in order.
    assert_eq!(c.index().file_index["model-000004-of-000012.safetensors"], 4);
    assert_eq!(c.index().file_index["model-000010-of-000012.safetensors"], 9);
}

#[test]
fn a_failing_shard_fails_every_shard_without_hanging() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    let results = on_ranks(3, move |g| {
        let mut blocks = vec![
            Block::table("t", "id", full(), ids(&[1])).unwrap(),
            Block::table("t", "embedding", full(), rows(1)).unwrap(),
        ];
        if g.rank() == 1 {
            // The same block twice: rank 1's writer rejects it.
            blocks.push(blocks[1].clone());
        }
        save_blocks(&blocks, &dir, &WriteOptions::default(), &g)
    });
    assert!(matches!(results[1], Err(Error::DuplicateBlock { .. })), "{:?}", results[1]);
    for r in [0, 2] {
        match &results[r] {
            Err(Error::ShardFailed { shard: 1, message }) => {
                assert!(message.contains("twice"), "{message}")
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
    assert!(!d.path().join("index").exists(), "no index for a failed save");
    assert!(matches!(Block::dense("u", Tensor::zeros(DType::U16, &[1]).unwrap()), Err(Error::UnsupportedDtype { .. })));
    assert!(matches!(Block::dense("a/part_0_1", rows(1)), Err(Error::BadName { .. })));
    assert!(matches!(Block::dense("a^b", rows(1)), Err(Error::BadName { .. })));
}

#[test]
fn two_shards_cannot_write_one_slice() {
    let d = tempfile::tempdir().unwrap();
    let metas: Vec<_> = (0..2)
        .map(|s| {
            write_shard_files(
                d.path(),
                Shard::new(s, 2).unwrap(),
                1,
                &ckpt_recis::writer::table_blocks(&table("t", &[1], full())).unwrap(),
            )
            .unwrap()
        })
        .collect();
    assert!(matches!(write_meta(d.path(), &metas, &WriteOptions::default()), Err(Error::DuplicateBlock { .. })));
    assert!(matches!(write_meta(d.path(), &metas[1..], &WriteOptions::default()), Err(Error::BadShardMeta(_))));
}

// ---------------------------------------------------------------------------------------------------------
// The checkpoint manager.

fn state(step: i64) -> ShardState {
    ShardState {
        tables: vec![table("t", &[step, step + 1], full())],
        dense: vec![("step".into(), Tensor::from_slice(&[step], &[1]).unwrap())],
        model: Some(Value::dict([("w", Value::Tensor(Tensor::from_slice(&[step as f32], &[1]).unwrap()))])),
        extra: Some(Value::dict([("global_step", Value::Tensor(Tensor::from_slice(&[step], &[]).unwrap()))])),
        io_state: None,
    }
}

fn dirs(root: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn rotation_reads_the_list_from_disk() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    // An earlier RecIS process left two checkpoints and a list (with an empty line and spaces).
    for id in ["ckpt_10", "ckpt_20"] {
        let d = r.join(id);
        fs::create_dir(&d).unwrap();
        small(&d);
    }
    fs::write(r.join("checkpoint"), "ckpt_10\n\n ckpt_20 \n").unwrap();
    let a = CheckpointManager::new(r).with_max_keep(3);
    assert_eq!(a.latest().unwrap().as_deref(), Some("ckpt_20"));
    a.save(&state(30), &checkpoint_id(30), &SingleProcess).unwrap();
    assert_eq!(a.list().unwrap(), ["ckpt_10", "ckpt_20", "ckpt_30"]);
    // A second process (a new manager, nothing in memory) evicts the oldest, whoever saved it.
    let b = CheckpointManager::new(r).with_max_keep(3);
    b.save(&state(40), &checkpoint_id(40), &SingleProcess).unwrap();
    assert_eq!(b.list().unwrap(), ["ckpt_20", "ckpt_30", "ckpt_40"]);
    assert_eq!(fs::read_to_string(r.join("checkpoint")).unwrap(), "ckpt_20\nckpt_30\nckpt_40\n");
    // A smaller max_keep evicts several at once.
    let c = CheckpointManager::new(r).with_max_keep(1);
    c.save(&state(50), &checkpoint_id(50), &SingleProcess).unwrap();
    assert_eq!(c.list().unwrap(), ["ckpt_50"]);
    assert_eq!(dirs(r), ["checkpoint", "ckpt_50"], "evicted directories removed, no temporaries left");
    // Saving an id again replaces it and keeps one line; max_keep 0 keeps everything.
    let keep_all = CheckpointManager::new(r).with_max_keep(0);
    keep_all.save(&state(60), "ckpt_60", &SingleProcess).unwrap();
    keep_all.save(&state(51), "ckpt_50", &SingleProcess).unwrap();
    assert_eq!(keep_all.list().unwrap(), ["ckpt_60", "ckpt_50"]);
    let latest = keep_all.open_latest().unwrap();
    assert_eq!(latest.sparse().dense("step").unwrap().to_vec::<i64>().unwrap(), vec![51]);
    assert_eq!(keep_all.open("ckpt_60").unwrap().sparse().child("t").unwrap().ids(), &[60, 61]);
    assert!(matches!(keep_all.save(&state(1), "../x", &SingleProcess), Err(Error::BadCheckpointId { .. })));
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(CheckpointManager::new(empty.path()).open_latest(), Err(Error::NoCheckpoint { .. })));
}

#[test]
fn an_interrupted_save_is_never_listed() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let m = CheckpointManager::new(r).with_max_keep(2);
    m.save(&state(1), "ckpt_1", &SingleProcess).unwrap();
    // A crash mid-save leaves a staging directory and no list entry.
    let bad = ShardState { dense: vec![("u".into(), Tensor::zeros(DType::U16, &[1]).unwrap())], ..state(2) };
    assert!(matches!(m.save(&bad, "ckpt_2", &SingleProcess), Err(Error::UnsupportedDtype { .. })));
    assert_eq!(m.list().unwrap(), ["ckpt_1"]);
    assert_eq!(dirs(r), ["checkpoint", "ckpt_1"], "the failed save's staging directory is removed");
    // A process killed mid-save leaves its staging directory; the next save of that id starts clean.
    fs::create_dir(r.join(".ckpt_2.ckpt-staging")).unwrap();
    fs::write(r.join(".ckpt_2.ckpt-staging").join("model-000007-of-000009.safetensors"), b"partial").unwrap();
    assert_eq!(m.latest().unwrap().as_deref(), Some("ckpt_1"), "never listed");
    m.save(&state(2), "ckpt_2", &SingleProcess).unwrap();
    assert_eq!(m.list().unwrap(), ["ckpt_1", "ckpt_2"]);
    assert_eq!(dirs(r), ["checkpoint", "ckpt_1", "ckpt_2"]);
    assert_eq!(
        dirs(&r.join("ckpt_2")),
        [
            "ckpt.checksums.json",
            "extra.pt",
            "index",
            "model-000000-of-000004.safetensors",
            "model-000001-of-000004.safetensors",
            "model-000002-of-000004.safetensors",
            "model-000003-of-000004.safetensors",
            "model.pt",
            "tensorkey.json",
            "torch_rank_weights_embs_table_multi_shard.json"
        ]
    );
}

#[test]
fn many_ranks_save_dense_and_io_state() {
    let root = tempfile::tempdir().unwrap();
    let r: PathBuf = root.path().into();
    let results = on_ranks(3, {
        let r = r.clone();
        move |g| {
            let shard = Shard::new(g.rank(), 3).unwrap();
            let slice = gen_slice(shard.index(), 3, 65536).unwrap();
            let all: Vec<i64> = (0..90).collect();
            let mine: Vec<i64> = all.into_iter().filter(|&i| slice.holds(i, IdPartition::Unsigned)).collect();
            let st = ShardState {
                tables: vec![table("t", &mine, slice)],
                io_state: Some(Value::dict([("train_io", Value::Int(g.rank() as i64))])),
                ..state(7)
            };
            CheckpointManager::new(&r).with_max_keep(5).save(&st, "ckpt_7", &g).map(|_| ())
        }
    });
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let c = RecisReader::open(r.join("ckpt_7")).unwrap();
    assert_eq!(c.io_state_count(), Some(3));
    for s in 0..3 {
        assert_eq!(c.io_state(s).unwrap(), &Value::dict([("train_io", Value::Int(s as i64))]));
        assert!(ckpt_recis::dense::read_io_state(c.dir(), Shard::new(s, 3).unwrap()).unwrap().is_some());
    }
    assert!(matches!(
        ckpt_recis::dense::read_io_state(c.dir(), Shard::new(0, 2).unwrap()),
        Err(Error::IoStateWorkers { saved: 3, running: 2, .. })
    ));
    assert_eq!(c.sparse().child("t").unwrap().len(), 90);
    assert_eq!(c.sparse().shard_num(), Some(3));

    // The generic view.
    let names: Vec<String> = c.entries().into_iter().map(|e| e.name).collect();
    for n in ["t@id", "t@embedding", "t@step_filter", "step", "w", "extra/global_step", "io_state_2/train_io"] {
        assert!(names.contains(&n.to_string()), "{n} in {names:?}");
    }
    let e = c.entries().into_iter().find(|e| e.name == "t@embedding").unwrap();
    assert_eq!(e.kind, EntryKind::Tensor(ckpt_tensor::TensorInfo { dtype: DType::F32, shape: vec![90, 3] }));
    assert_eq!(c.tensor("t@id").unwrap().shape(), &[90]);
    assert_eq!(c.tensor("w").unwrap().to_vec::<f32>().unwrap(), vec![7.0]);
    assert_eq!(c.value("io_state_1/train_io").unwrap(), Value::Int(1));
    assert!(c.tensor("nope").is_err());
    assert_eq!(c.format_name(), "recis");
    assert!(c.details().iter().any(|(k, v)| k == "shards" && v == "3"));
}

// ---------------------------------------------------------------------------------------------------------
// Resharding.

fn owner(id: i64, n: usize, size: u32, p: IdPartition) -> usize {
    (0..n).find(|&r| gen_slice(r, n, size).unwrap().holds(id, p)).unwrap()
}

#[test]
fn any_shard_count_into_any_other() {
    let all: Vec<i64> =
        (0..2000i64).map(|i| (i * 104_729) ^ (i << 40)).chain([-1, -65536, -65537, i64::MIN, i64::MAX]).collect();
    for m in [1usize, 2, 3, 5] {
        let src = tempfile::tempdir().unwrap();
        let dir = src.path().to_path_buf();
        let ids = all.clone();
        on_ranks(m, move |g| {
            let slice = gen_slice(g.rank(), g.world_size(), 65536).unwrap();
            let mine: Vec<i64> = ids.iter().copied().filter(|&i| slice.holds(i, IdPartition::Unsigned)).collect();
            save_tables(&[table("t", &mine, slice)], &[], &dir, &WriteOptions::default().with_parallel(2), &g).unwrap();
        });
        let c = SparseCheckpoint::open(src.path()).unwrap();
        let reference = c.child("t").unwrap();
        for n in [1usize, 2, 3, 4, 7] {
            let dst = tempfile::tempdir().unwrap();
            reshard_sparse(&c, dst.path(), n, &ReshardOptions::default()).unwrap();
            let out = SparseCheckpoint::open(dst.path()).unwrap();
            assert_eq!(out.shard_num(), Some(n));
            let mut count = 0;
            for (slice, part) in out.child_slices("t").unwrap() {
                let r = (0..n).find(|&r| gen_slice(r, n, 65536).unwrap() == slice).unwrap();
                for &id in part.ids() {
                    assert_eq!(owner(id, n, 65536, IdPartition::Unsigned), r, "{m}->{n}: id {id}");
                    let k = reference.position(id).unwrap().unwrap();
                    assert_eq!(
                        part.row_bytes(id, "embedding").unwrap().unwrap(),
                        reference.slots()[0].row_bytes(k).unwrap()
                    );
                }
                count += part.len();
            }
            assert_eq!(count, all.len(), "{m}->{n}: every id exactly once");
        }
    }
}

#[test]
fn negative_ids_follow_the_chosen_partition() {
    // A CPU trainer (abs(fmod)) put -1 in shard 0 of 2 and 40000 in shard 1.
    let src = tempfile::tempdir().unwrap();
    let s0 = gen_slice(0, 2, 65536).unwrap();
    let s1 = gen_slice(1, 2, 65536).unwrap();
    assert!(s0.holds(-1, IdPartition::AbsFmod) && s1.holds(-1, IdPartition::Unsigned));
    for (r, (slice, ids)) in [(s0, vec![-1i64, 5]), (s1, vec![40000])].into_iter().enumerate() {
        let meta = write_shard_files(
            src.path(),
            Shard::new(r, 2).unwrap(),
            1,
            &ckpt_recis::writer::table_blocks(&table("t", &ids, slice)).unwrap(),
        )
        .unwrap();
        fs::write(src.path().join(format!("meta{r}")), meta.to_bytes()).unwrap();
    }
    let metas: Vec<_> = (0..2)
        .map(|r| {
            ckpt_recis::writer::ShardMeta::from_bytes(&fs::read(src.path().join(format!("meta{r}"))).unwrap()).unwrap()
        })
        .collect();
    write_meta(src.path(), &metas, &WriteOptions::default()).unwrap();
    let c = SparseCheckpoint::open(src.path()).unwrap();
    // RecIS's loader rule moves -1 to the shard holding 65535; it is not lost although RecIS would skip its
    // source slice (which does not intersect the target).
    let unsigned: Vec<Vec<i64>> = (0..2)
        .map(|r| {
            load_shard(&c, Shard::new(r, 2).unwrap(), IdPartition::Unsigned).unwrap()[0].children()[0].ids().to_vec()
        })
        .collect();
    assert_eq!(unsigned, [vec![5], vec![-1, 40000]]);
    // The CPU rule keeps it where the CPU trainer looks it up.
    let cpu: Vec<Vec<i64>> = (0..2)
        .map(|r| {
            load_shard(&c, Shard::new(r, 2).unwrap(), IdPartition::AbsFmod).unwrap()[0].children()[0].ids().to_vec()
        })
        .collect();
    assert_eq!(cpu, [vec![-1, 5], vec![40000]]);
    let dst = tempfile::tempdir().unwrap();
    reshard_sparse(&c, dst.path(), 3, &ReshardOptions::default().with_partition(IdPartition::AbsFmod)).unwrap();
    let out = SparseCheckpoint::open(dst.path()).unwrap();
    assert_eq!(out.child_slices("t").unwrap()[0].1.ids(), &[-1, 5]);
}

#[test]
fn reshard_dir_copies_dense_state() {
    let root = tempfile::tempdir().unwrap();
    let m = CheckpointManager::new(root.path());
    let src = m.save(&ShardState { io_state: Some(Value::Int(1)), ..state(3) }, "ckpt_3", &SingleProcess).unwrap();
    let dst = root.path().join("resharded");
    reshard(&src, &dst, 2, &ReshardOptions::default()).unwrap();
    for f in ["model.pt", "extra.pt"] {
        assert_eq!(fs::read(src.join(f)).unwrap(), fs::read(dst.join(f)).unwrap(), "{f}");
    }
    assert!(!dst.join("io_state_0.pt").exists(), "io states belong to the old workers");
    let c = RecisReader::open(&dst).unwrap();
    assert_eq!(c.sparse().shard_num(), Some(2));
    assert_eq!(c.sparse().dense("step").unwrap().to_vec::<i64>().unwrap(), vec![3]);
}

#[test]
fn save_lays_a_state_dict_out_as_recis_does() {
    let root = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = vec![3, 70_000, -5, 999, 1000];
    let emb = emb(&ids, 2).tensor().clone();
    let w = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let step = Tensor::from_slice(&[7i64], &[1]).unwrap();
    // A training checkpoint: tables and sparse-optimizer scalars to the serializer, `model` to model.pt, the
    // rest to extra.pt.
    let sd = Value::dict([
        ("tbl@id", Value::Tensor(Tensor::from_slice(&ids, &[ids.len()]).unwrap())),
        ("tbl@embedding", Value::Tensor(emb.clone())),
        ("sparse_adamw_step", Value::Tensor(step.clone())),
        ("model", Value::dict([("dense.w", Value::Tensor(w.clone()))])),
        ("epoch", Value::Int(2)),
    ]);
    let dir = root.path().join("a");
    let options = WriteOptions::default().with_world_size(3).with_parallel(2).with_slice_size(1000);
    let report = ckpt_recis::save(&sd, &dir, &options).unwrap();
    assert!(report.dropped.is_empty());
    let ck = RecisReader::open(&dir).unwrap();
    let sparse = ck.sparse();
    assert_eq!((sparse.shard_num(), sparse.parallel(), sparse.slice_size("tbl").unwrap()), (Some(3), Some(2), 1000));
    assert_eq!(sparse.child("tbl").unwrap().len(), ids.len());
    assert_eq!(sparse.dense("sparse_adamw_step").unwrap(), step);
    assert_eq!(ck.tensor("dense.w").unwrap(), w);
    assert_eq!(ck.value("extra/epoch").unwrap(), Value::Int(2));
    // A RecIS-shaped state dict (how a RecIS checkpoint reads as one): parts as they are, io states dropped.
    let shaped = Value::dict([
        (
            "sparse",
            Value::dict([
                ("tbl@id", Value::Tensor(Tensor::from_slice(&ids, &[5]).unwrap())),
                ("tbl@embedding", Value::Tensor(emb)),
            ]),
        ),
        ("model", Value::dict([("dense.w", Value::Tensor(w.clone()))])),
        ("io_state_0", Value::dict([("pos", Value::Int(4))])),
    ]);
    let report = ckpt_recis::save(&shaped, root.path().join("b"), &WriteOptions::default()).unwrap();
    assert_eq!(report.dropped, ["io_state_0"]);
    assert_eq!(RecisReader::open(root.path().join("b")).unwrap().sparse().child("tbl").unwrap().len(), 5);
    // What cannot be laid out is refused before anything is written.
    let orphan = Value::dict([("tbl@embedding", Value::Tensor(Tensor::zeros(DType::F32, &[2, 2]).unwrap()))]);
    let e = ckpt_recis::save(&orphan, root.path().join("c"), &WriteOptions::default()).unwrap_err();
    assert!(matches!(&e, Error::StateDict { reason } if reason.contains("no ids `tbl@id`")), "{e}");
    let e = ckpt_recis::save(&Value::List(vec![]), root.path().join("d"), &WriteOptions::default()).unwrap_err();
    assert!(matches!(&e, Error::StateDict { reason } if reason.contains("top level is a list")), "{e}");
    assert!(!root.path().join("c").exists() && !root.path().join("d").exists());
}

#[test]
fn an_output_root_names_its_latest_checkpoint_everywhere() {
    let root = tempfile::tempdir().unwrap();
    let m = CheckpointManager::new(root.path()).with_max_keep(0);
    let st = |step: i64| ShardState {
        tables: vec![table("t", &[1, 2, step], full())],
        model: Some(Value::dict([("step", Value::Int(step))])),
        ..Default::default()
    };
    m.save(&st(10), "ckpt_10", &SingleProcess).unwrap();
    m.save(&st(20), "ckpt_20", &SingleProcess).unwrap();
    // One rule: a root names its latest listed checkpoint, a checkpoint directory itself.
    assert_eq!(ckpt_recis::checkpoint_dir(root.path()).unwrap(), root.path().join("ckpt_20"));
    assert_eq!(ckpt_recis::checkpoint_dir(&root.path().join("ckpt_10")).unwrap(), root.path().join("ckpt_10"));
    let ck = RecisReader::open(root.path()).unwrap();
    assert_eq!((ck.dir(), ck.value("step").unwrap()), (root.path().join("ckpt_20").as_path(), Value::Int(20)));
    let dst = root.path().join("resharded");
    reshard(root.path(), &dst, 2, &ReshardOptions::default()).unwrap();
    assert_eq!(RecisReader::open(&dst).unwrap().value("step").unwrap(), Value::Int(20));
    let report = ckpt_recis::verify(root.path()).unwrap();
    assert!(report.is_ok());
    assert_eq!((report.path, report.files), (root.path().join("ckpt_20"), 1));
    // An empty list names no checkpoint.
    let empty = tempfile::tempdir().unwrap();
    fs::write(empty.path().join("checkpoint"), "\n").unwrap();
    assert!(matches!(RecisReader::open(empty.path()), Err(Error::NoCheckpoint { .. })));
    assert!(matches!(ckpt_recis::verify(empty.path()), Err(Error::NoCheckpoint { .. })));
}

#[test]
fn verify_names_a_flipped_record_of_model_pt() {
    let dir = tempfile::tempdir().unwrap();
    small(dir.path());
    let w: Vec<f32> = (0..32).map(|i| i as f32).collect();
    ckpt_recis::dense::write_model(
        dir.path(),
        &Value::dict([("w", Value::Tensor(Tensor::from_slice(&w, &[32]).unwrap()))]),
    )
    .unwrap();
    assert!(ckpt_recis::verify(dir.path()).unwrap().is_ok());
    let path = dir.path().join("model.pt");
    let mut bytes = fs::read(&path).unwrap();
    let at = bytes.windows(4).position(|x| x == 31.0f32.to_le_bytes()).unwrap();
    bytes[at] ^= 1;
    fs::write(&path, &bytes).unwrap();
    let report = ckpt_recis::verify(dir.path()).unwrap();
    assert!(!report.is_ok());
    assert_eq!(report.problems[0].entry.as_deref(), Some("model/data/0"));
}
