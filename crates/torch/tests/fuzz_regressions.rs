//! Inputs the fuzzer (`fuzz/`, target `torch_zip` / `torch_legacy`) found, kept as regression tests that run
//! under plain `cargo test`: each goes through the same public API as the fuzz target.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use ckpt_tensor::{Buffer, CheckpointRead, Value};
use ckpt_torch::{ReadOptions, TorchReader, WriteOptions, save_to_writer};

/// Reading every entry of a file looked each one up by walking all leaves: quadratic in the number of
/// entries (a 100 KB pickle of 40 000 small items took minutes, a fuzzer timeout). Look-ups go through a
/// leaf index now; this reads every entry of a 50 000-entry file and checks each value.
/// The options the regressions are read with.
fn both_paths() -> [ReadOptions; 1] {
    [ReadOptions::default()]
}

#[test]
fn fuzz_every_entry_of_a_wide_file_reads_in_linear_time() {
    let n = 50_000;
    let value = Value::List((0..n).map(Value::Int).collect());
    let bytes = Buffer::from_vec(save_to_writer(&value, Vec::new(), "archive", &WriteOptions::default()).unwrap());
    for options in both_paths() {
        let file = TorchReader::from_buffer(&bytes, &options).unwrap();
        let entries = file.entries();
        assert_eq!(entries.len(), n as usize);
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(CheckpointRead::value(&file, &e.name).unwrap(), Value::Int(i as i64));
        }
        assert!(CheckpointRead::value(&file, "50000").is_err());
    }
}

/// A dict with a repeated key (`{"w": a, "w": b}`: the fuzzer renamed key `b` of a golden file to `w`).
/// Unpickling sets items one after the other, so torch.load returns `{"w": b}`, `w` in its first position;
/// ckpt listed both and read the first, so the entry listed as `[3]` read as the `[2, 3]` tensor.
/// (`tests/fuzz/duplicate_key.pt` is `conformance/fixtures/torch/bytesio.pt` with that one key renamed
/// and the CRCs fixed; torch 2.13 loads it as `{'w': <the former b>, 'n': 7}`.)
#[test]
fn fuzz_repeated_dict_key_keeps_the_last_value_like_torch_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let original = TorchReader::open(dir.join("../../../../conformance/fixtures/torch/bytesio.pt")).unwrap();
    for options in both_paths() {
        let file = TorchReader::open_with(dir.join("duplicate_key.pt"), &options).unwrap();
        let names: Vec<String> = file.entries().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["w", "n"]);
        let w = file.tensor("w").unwrap();
        assert_eq!(w.shape(), [3]);
        assert!(w.bitwise_eq(&original.tensor("b").unwrap()));
        assert_eq!(CheckpointRead::value(&file, "n").unwrap(), Value::Int(7));
    }
}

/// The same rule for an `OrderedDict` (every state dict), whose items come from its constructor's argument
/// and from items set later: `OrderedDict([("a", 1), ("b", 2), ("a", 3)])` then `["b"] = 4` is `{"a": 3, "b": 4}`.
#[test]
fn fuzz_repeated_ordered_dict_key_keeps_the_last_value() {
    use ckpt_tensor::{Dict, DictKind};
    let mut d = Dict::new(DictKind::OrderedDict);
    for (k, v) in [("a", 1), ("b", 2), ("a", 3), ("b", 4)] {
        d.insert(k, Value::Int(v)); // appended: the pickle holds every pair
    }
    let bytes = save_to_writer(&Value::Dict(d), Vec::new(), "archive", &WriteOptions::default()).unwrap();
    let bytes = Buffer::from_vec(bytes);
    for options in both_paths() {
        let file = TorchReader::from_buffer(&bytes, &options).unwrap();
        let Value::Dict(read) = file.value() else { panic!("{:?}", file.value()) };
        assert_eq!(read.kind, DictKind::OrderedDict);
        assert_eq!(read.items, [(Value::from("a"), Value::Int(3)), (Value::from("b"), Value::Int(4))]);
        let names: Vec<String> = file.entries().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["a", "b"]);
    }
}
