//! ckpt-torch on its own: embedded archives, prefixes, options, and the legacy stream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use ckpt_tensor::{Buffer, DType, Tensor, Value};
use ckpt_torch::{Container, Error, ReadOptions, TorchReader, WriteOptions, prefix_for_path, save_to_writer};

fn sample() -> Value {
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    Value::dict([
        ("w", Value::Tensor(w.clone())),
        ("wt", Value::Tensor(w.transpose(0, 1).unwrap())),
        ("step", Value::Int(7)),
    ])
}

/// DCP stores torch.save outputs back to back inside one file; each is read from its window.
#[test]
fn reads_archives_embedded_at_an_offset() {
    let a = save_to_writer(&sample(), Vec::new(), "archive", &WriteOptions::default()).unwrap();
    let b =
        save_to_writer(&Value::dict([("x", Value::Int(1))]), Vec::new(), "archive", &WriteOptions::default()).unwrap();
    let mut file = b"leading junk of odd length".to_vec();
    let a_at = file.len();
    file.extend_from_slice(&a);
    let b_at = file.len();
    file.extend_from_slice(&b);
    file.extend_from_slice(b"trailing");
    let whole = Buffer::from_vec(file);
    let fa = TorchReader::from_buffer(&whole.slice_len(a_at, a.len()).unwrap(), &ReadOptions::default()).unwrap();
    assert_eq!(fa.value(), &sample());
    assert_eq!(fa.prefix(), Some("archive"));
    let wt = fa.value().as_dict().unwrap().get("wt").unwrap().as_tensor().unwrap();
    // zero copy: the tensor's storage is a window of the big buffer
    assert!(wt.storage().same_backing(&whole));
    let fb = TorchReader::from_buffer(&whole.slice_len(b_at, b.len()).unwrap(), &ReadOptions::default()).unwrap();
    assert_eq!(fb.value(), &Value::dict([("x", Value::Int(1))]));
}

#[test]
fn prefixes_follow_torch() {
    assert_eq!(prefix_for_path(Path::new("/a/my_model.pt")).unwrap(), "my_model");
    assert_eq!(prefix_for_path(Path::new("model.tar.gz")).unwrap(), "model.tar");
    assert_eq!(prefix_for_path(Path::new("noext")).unwrap(), "noext");
    assert_eq!(prefix_for_path(Path::new("dir.with.dots/file")).unwrap(), "file");
    assert_eq!(prefix_for_path(Path::new("modèle.pt")).unwrap(), "archive");
    assert!(matches!(prefix_for_path(Path::new(".hidden")), Err(Error::Unwritable(_))));
}

#[test]
fn minimal_archive_and_crc_options() {
    let opts = WriteOptions::default()
        .with_durability(ckpt_torch::Durability::default().with_checksums(false))
        .with_torch_2_13_records(false);
    let bytes = save_to_writer(&sample(), Vec::new(), "archive", &opts).unwrap();
    let f = TorchReader::from_buffer(&Buffer::from_vec(bytes), &ReadOptions::default().with_verify_crc(true)).unwrap();
    assert_eq!(f.records(), ["data.pkl", "data/0", "version"]);
    assert_eq!(f.value(), &sample());
}

#[test]
fn saves_atomically_and_reports_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.pt");
    ckpt_torch::save(&sample(), &path, &ckpt_torch::WriteOptions::default()).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left behind");
    let f = TorchReader::open(&path).unwrap();
    assert_eq!(f.container(), Container::Zip);
    assert_eq!(f.prefix(), Some("m"));
    let bad = Value::Tensor(Tensor::zeros(DType::QInt8, &[2]).unwrap());
    let err = ckpt_torch::save(&bad, &path, &ckpt_torch::WriteOptions::default()).unwrap_err();
    assert!(err.to_string().contains("m.pt"), "{err}");
    // the failed save left the old file intact
    assert_eq!(TorchReader::open(&path).unwrap().value(), &sample());
}
