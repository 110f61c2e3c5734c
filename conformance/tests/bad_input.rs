//! Hostile and wrong inputs: every file in conformance/bad gives its specific error, and no prefix or
//! corruption of a valid file makes the reader panic.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;

use ckpt_conformance::{bad_dir, fixtures};
use ckpt_pickle::Error as PickleError;
use ckpt_tensor::Buffer;
use ckpt_torch::zip::ZipError;
use ckpt_torch::{Error, ReadOptions, TorchReader};

/// Whether `e` is the error the tag in conformance/bad/EXPECTED.json names.
fn matches_tag(tag: &str, e: &Error) -> bool {
    let pickle = |f: fn(&PickleError) -> bool| matches!(e, Error::Pickle { source, .. } if f(source));
    match tag {
        "big_endian" => matches!(e, Error::BigEndian { .. }),
        "crc_mismatch" => matches!(e, Error::Zip(ZipError::CrcMismatch { .. })),
        "depth" => pickle(|p| matches!(p, PickleError::DepthExceeded { .. } | PickleError::Limit { .. })),
        "memo_bomb" => pickle(|p| matches!(p, PickleError::Limit { .. })),
        "empty" => matches!(e, Error::Empty),
        "git_lfs_pointer" => matches!(e, Error::GitLfsPointer),
        "html" => matches!(e, Error::Html),
        "missing_record" => matches!(e, Error::MissingRecord { .. }),
        "overlap" => matches!(e, Error::Zip(ZipError::Overlap { .. })),
        "not_a_checkpoint" => matches!(e, Error::Unrecognized { .. }),
        "out_of_bounds" => matches!(e, Error::Zip(ZipError::Truncated { .. } | ZipError::StoredSizeMismatch { .. })),
        "record_too_short" => matches!(e, Error::StorageSize { .. }),
        "tar_legacy" => matches!(e, Error::TarFormat),
        "truncated" => matches!(e, Error::Zip(ZipError::Truncated { .. } | ZipError::NotZip { .. })),
        "view_out_of_bounds" => matches!(e, Error::BadView { .. }),
        other => panic!("unknown tag {other} in EXPECTED.json"),
    }
}

#[test]
fn every_bad_file_gives_its_specific_error() {
    let expected: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&fs::read(bad_dir().join("EXPECTED.json")).unwrap()).unwrap();
    assert!(expected.len() >= 15, "expected the bad inputs in {}", bad_dir().display());
    let options = ReadOptions::default().with_verify_crc(true);
    let mut failures = Vec::new();
    for (file, tag) in &expected {
        let tag = tag.as_str().unwrap();
        let path = bad_dir().join(file);
        match TorchReader::open_with(&path, &options) {
            Ok(_) => failures.push(format!("{file}: read without error, expected {tag}")),
            Err(e) => {
                let inner = e.kind();
                if !matches_tag(tag, inner) {
                    failures.push(format!("{file}: expected {tag}, got {inner:?} ({e})"));
                }
                // The error names the file.
                assert!(e.to_string().contains(file.as_str()), "{file}: message lacks the path: {e}");
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A tiny deterministic PRNG (xorshift64*), so corruption tests are reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn read_bytes(bytes: &[u8]) -> Result<TorchReader, Error> {
    TorchReader::from_buffer(&Buffer::copy_from(bytes).unwrap(), &ReadOptions::default().with_verify_crc(true))
}

#[test]
fn prefixes_and_corruptions_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut attempts = 0;
    for name in ["module.pt", "nested.pt", "legacy.pt", "views.pt", "proto4.pt", "special.pt"] {
        let bytes = fs::read(fixtures("torch").join(name)).unwrap();
        assert!(read_bytes(&bytes).is_ok(), "{name} must read");
        for len in (0..bytes.len()).step_by(37) {
            let _ = read_bytes(&bytes[..len]);
            attempts += 1;
        }
        for _ in 0..300 {
            let mut b = bytes.clone();
            for _ in 0..1 + rng.next() % 4 {
                let i = (rng.next() % b.len() as u64) as usize;
                b[i] = rng.next() as u8;
            }
            let _ = read_bytes(&b);
            attempts += 1;
        }
    }
    assert!(attempts > 1000);
}
