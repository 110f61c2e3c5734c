//! Checking a `torch.save` file's integrity without decoding it: every ZIP record's CRC-32 against the
//! central directory (torch itself never checks them).

use std::path::Path;

use ckpt_io::{Problem, ProblemKind, VerifyReport};
use ckpt_tensor::Buffer;

use crate::detect::{Container, detect};
use crate::error::{Error, Result};
use crate::zip::{Archive, ZipError};

/// Checks every record CRC-32 of the `torch.save` file at `path` (legacy files have none). The archive's
/// structure must parse (its central directory, every record inside the file); records whose data does not
/// match are listed in [`VerifyReport::problems`] rather than failing the call, so every bad record is
/// named: [`ProblemKind::ChecksumMismatch`] (or [`ProblemKind::Unreadable`] for a record reaching outside
/// the file) at the record's full name (`archive/data/0`). A legacy file carries no checksums: its report
/// has one [`ProblemKind::Unchecked`] warning and no records.
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("m.pt");
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
/// ckpt_torch::save(&sd, &path, &ckpt_torch::WriteOptions::default()).unwrap();
/// let report = ckpt_torch::verify(&path).unwrap();
/// assert!(report.is_ok() && report.records > 3);
///
/// let mut bytes = std::fs::read(&path).unwrap();
/// let at = bytes.windows(4).position(|w| w == 2.0f32.to_le_bytes()).unwrap();
/// bytes[at] ^= 1;
/// std::fs::write(&path, &bytes).unwrap();
/// let report = ckpt_torch::verify(&path).unwrap();
/// assert_eq!(report.problems[0].entry.as_deref(), Some("m/data/0"));
/// ```
///
/// # Errors
/// [`Error::Io`] if the file cannot be mapped; the [`detect`] errors for files that are not `torch.save`
/// output; [`Error::Zip`] for an archive whose structure does not parse. Each names the path.
pub fn verify(path: impl AsRef<Path>) -> Result<VerifyReport> {
    let path = path.as_ref();
    let buffer = Buffer::map_file(path).map_err(|e| match e {
        ckpt_tensor::Error::Io { path, source } => Error::Io { path, source },
        e => Error::Core(e),
    })?;
    let bytes = buffer.as_bytes();
    let container = detect(bytes).map_err(|e| e.at(path))?;
    let mut report = VerifyReport::new("torch", path);
    report.files = 1;
    if container != Container::Zip {
        let what = if container == Container::Pickle { "a plain pickle" } else { "a legacy torch.save file" };
        report.push(Problem::new(ProblemKind::Unchecked, format!("{what} carries no checksums")).in_file(path));
        return Ok(report);
    }
    let archive = Archive::parse(bytes).map_err(|e| Error::from(e).at(path))?;
    for rec in archive.records() {
        match archive.verify_crc(bytes, rec) {
            Ok(()) => {
                report.records += 1;
                report.bytes += rec.size();
            }
            Err(e) => report.push(record_problem(path, rec.name(), &e)),
        }
    }
    Ok(report)
}

/// A record that failed its check, as a problem of the file at `path`.
fn record_problem(path: &Path, record: &str, e: &ZipError) -> Problem {
    let kind = match e {
        ZipError::CrcMismatch { .. } => ProblemKind::ChecksumMismatch,
        _ => ProblemKind::Unreadable,
    };
    Problem::from_error(kind, e).in_file(path).at_entry(record)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use ckpt_tensor::{Tensor, Value};

    #[test]
    fn every_flipped_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("two.pt");
        let a = Tensor::from_slice(&[1.5f32; 16], &[16]).unwrap();
        let b = Tensor::from_slice(&[7i64; 8], &[8]).unwrap();
        let sd = Value::dict([("a", Value::Tensor(a)), ("b", Value::Tensor(b))]);
        crate::save(&sd, &path, &crate::WriteOptions::default()).unwrap();
        let clean = verify(&path).unwrap();
        assert!(clean.is_ok());
        assert_eq!((clean.files, clean.problems.len()), (1, 0));
        let mut bytes = std::fs::read(&path).unwrap();
        for needle in [1.5f32.to_le_bytes().to_vec(), 7i64.to_le_bytes().to_vec()] {
            let at = bytes.windows(needle.len()).position(|w| w == needle.as_slice()).unwrap();
            bytes[at] ^= 0x80;
        }
        std::fs::write(&path, &bytes).unwrap();
        let bad = verify(&path).unwrap();
        let names: Vec<&str> = bad.problems.iter().filter_map(|p| p.entry.as_deref()).collect();
        assert_eq!(names, ["two/data/0", "two/data/1"]);
        assert!(
            bad.problems.iter().all(|p| p.kind == ProblemKind::ChecksumMismatch && p.file.as_deref() == Some(&*path))
        );
        assert_eq!(bad.records, clean.records - 2);
    }

    #[test]
    fn legacy_files_have_nothing_to_check_and_other_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pt");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(verify(&empty).unwrap_err().kind(), Error::Empty));
        assert!(matches!(verify(dir.path().join("missing.pt")), Err(Error::Io { .. })));
        let legacy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/fixtures/torch/legacy.pt");
        let r = verify(&legacy).unwrap();
        assert_eq!(r.records, 0);
        assert!(r.is_ok());
        assert_eq!(r.of_kind(ProblemKind::Unchecked).count(), 1);
    }
}
