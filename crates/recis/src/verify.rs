//! Checking a checkpoint directory's `torch.save` files (`model.pt`, `extra.pt`, io states) record by
//! record. The serializer's part has no checksums; [`crate::RecisReader::open`] validates it whole
//! (index, tensor keys, every data file's header and block offsets).

use std::path::Path;

use ckpt_io::VerifyReport;

use crate::error::{Error, Result};

/// Checks the CRC-32 of every record of every `*.pt` file of the checkpoint directory `path` names
/// ([`crate::checkpoint_dir`]).
///
/// ```
/// use ckpt_tensor::Value;
/// let dir = tempfile::tempdir().unwrap();
/// ckpt_recis::dense::write_model(dir.path(), &Value::dict([("step", Value::Int(3))])).unwrap();
/// let report = ckpt_recis::verify(dir.path()).unwrap();
/// assert!(report.is_ok());
/// assert_eq!(report.files, 1);
/// ```
///
/// # Errors
/// As [`crate::checkpoint_dir`]; [`Error::Io`] listing the directory; [`Error::Torch`] for a `*.pt` file
/// that is not a `torch.save` archive at all.
pub fn verify(path: impl AsRef<Path>) -> Result<VerifyReport> {
    let dir = crate::manager::checkpoint_dir(path.as_ref())?;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
        let entry = entry.map_err(|e| Error::io(&dir, e))?;
        if entry.file_name().to_str().is_some_and(|n| n.ends_with(".pt")) && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    let mut report = VerifyReport::new("recis", &dir);
    for file in &files {
        report.merge(ckpt_torch::verify(file)?);
    }
    Ok(report)
}
