//! Rules fuzzing established (`fuzz/`, target `distcp`) for decoding `.metadata`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;

use ckpt_distcp::{DcpReader, Metadata, Profile, WriteOptions, save};
use ckpt_tensor::{CheckpointRead, Tensor, Value};

/// A `.metadata` decoded, or `None` for an error.
fn both(path: &Path) -> Option<Metadata> {
    let bytes = fs::read(path).unwrap();
    Metadata::from_pickle_with(&bytes, path, &ckpt_pickle::Limits::default()).ok()
}

/// Two `storage_data` entries for one item (same fqn and offsets): torch unpickles a dict, whose key (a
/// frozen `MetadataIndex` dataclass) compares by fqn and offsets, so the later entry's location wins. DCP
/// never writes this; a damaged or hand-made file may. The decoder keeps both entries as written; the reader
/// reads the later one.
#[test]
fn fuzz_repeated_storage_data_entry_reads_the_last_like_torch() {
    let d = tempfile::tempdir().unwrap();
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let b = Tensor::from_slice(&[5.0f32, 6.0, 7.0, 8.0], &[4]).unwrap();
    let sd = Value::dict([("a", Value::Tensor(a)), ("b", Value::Tensor(b.clone()))]);
    save(&sd, d.path(), &WriteOptions::default()).unwrap();
    let md_path = d.path().join(".metadata");
    let mut md = both(&md_path).unwrap();
    let info_b = md.storage_data.iter().find(|(ix, _)| ix.fqn == "b").unwrap().1.clone();
    let index_a = md.storage_data.iter().find(|(ix, _)| ix.fqn == "a").unwrap().0.clone();
    md.storage_data.push((index_a, info_b));
    fs::write(&md_path, md.to_pickle(Profile::MaxCompat).unwrap()).unwrap();
    // The checksum manifest describes the file as saved; this test is about the metadata alone.
    let _ = fs::remove_file(d.path().join("ckpt.checksums.json"));

    let decoded = both(&md_path).unwrap();
    assert_eq!(decoded.storage_data.iter().filter(|(ix, _)| ix.fqn == "a").count(), 2);
    let r = DcpReader::open(d.path()).unwrap();
    let read = r.tensor("a").unwrap();
    assert!(read.bitwise_eq(&b), "{read:?}");
}

/// A repeated `state_dict_metadata` key is an error that names it.
#[test]
fn fuzz_repeated_state_dict_key_is_an_error_in_both_paths() {
    let d = tempfile::tempdir().unwrap();
    let a = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    save(&Value::dict([("a", Value::Tensor(a))]), d.path(), &WriteOptions::default()).unwrap();
    let md_path = d.path().join(".metadata");
    let mut md = both(&md_path).unwrap();
    let first = md.state_dict_metadata[0].clone();
    md.state_dict_metadata.push(first);
    fs::write(&md_path, md.to_pickle(Profile::MaxCompat).unwrap()).unwrap();
    assert!(both(&md_path).is_none());
    let bytes = fs::read(&md_path).unwrap();
    let e = Metadata::from_pickle(&bytes, &md_path).unwrap_err();
    assert!(e.to_string().contains("unique keys"), "{e}");
}
