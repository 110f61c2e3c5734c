//! Checking a `torch.save` file's integrity without decoding it: every ZIP record's CRC-32 against the
//! central directory (torch itself never checks them).

use std::path::{Path, PathBuf};

use ckpt_tensor::Buffer;

use crate::detect::{Container, detect};
use crate::error::{Error, Result};
use crate::zip::{Archive, ZipError};

/// What [`verify`] found.
#[derive(Debug)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The file.
    pub path: PathBuf,
    /// The container: legacy files carry no checksums, so nothing was checked.
    pub container: Container,
    /// Records whose CRC-32 was checked (records written with CRC 0, by `set_crc32_options(False)`, are not).
    pub records: usize,
    /// Bytes of record data checked.
    pub bytes: u64,
    /// Every record that failed its check, by full record name (`archive/data/0`), with the error
    /// ([`ZipError::CrcMismatch`], or a record reaching outside the file).
    pub problems: Vec<(String, ZipError)>,
}

impl VerifyReport {
    /// Whether every record checked out.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks every record CRC-32 of the `torch.save` file at `path` (legacy files have none). The archive's
/// structure must parse (its central directory, every record inside the file); records whose data does not
/// match are listed in [`VerifyReport::problems`] rather than failing the call, so every bad record is
/// named.
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
/// assert_eq!(report.problems[0].0, "m/data/0");
/// ```
///
/// # Errors
/// [`Error::Io`] if the file cannot be mapped; the [`detect`] errors for files that are not `torch.save`
/// output; [`Error::Zip`] for an archive whose structure does not parse. Each names the path.
pub fn verify(path: &Path) -> Result<VerifyReport> {
    let buffer = Buffer::map_file(path).map_err(|e| match e {
        ckpt_tensor::Error::Io { path, source } => Error::Io { path, source },
        e => Error::Core(e),
    })?;
    let bytes = buffer.as_bytes();
    let container = detect(bytes).map_err(|e| e.at(path))?;
    let mut report = VerifyReport { path: path.to_path_buf(), container, records: 0, bytes: 0, problems: Vec::new() };
    if container != Container::Zip {
        return Ok(report);
    }
    let archive = Archive::parse(bytes).map_err(|e| Error::from(e).at(path))?;
    for rec in archive.records() {
        match archive.verify_crc(bytes, rec) {
            Ok(()) => {
                report.records += 1;
                report.bytes += rec.size();
            }
            Err(e) => report.problems.push((rec.name().to_owned(), e)),
        }
    }
    Ok(report)
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
        assert_eq!(clean.container, Container::Zip);
        let mut bytes = std::fs::read(&path).unwrap();
        for needle in [1.5f32.to_le_bytes().to_vec(), 7i64.to_le_bytes().to_vec()] {
            let at = bytes.windows(needle.len()).position(|w| w == needle.as_slice()).unwrap();
            bytes[at] ^= 0x80;
        }
        std::fs::write(&path, &bytes).unwrap();
        let bad = verify(&path).unwrap();
        let names: Vec<&str> = bad.problems.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["two/data/0", "two/data/1"]);
        assert!(bad.problems.iter().all(|(_, e)| matches!(e, ZipError::CrcMismatch { .. })));
        assert_eq!(bad.records, clean.records - 2);
    }

    #[test]
    fn legacy_files_have_nothing_to_check_and_other_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pt");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(verify(&empty).unwrap_err().kind(), Error::Empty));
        assert!(matches!(verify(&dir.path().join("missing.pt")), Err(Error::Io { .. })));
        let legacy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/fixtures/torch/legacy.pt");
        let r = verify(&legacy).unwrap();
        assert_eq!((r.container, r.records), (Container::Legacy, 0));
    }
}
