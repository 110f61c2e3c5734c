//! Checking the parts of a checkpoint record by record: every `PART_*.pt` file's CRC-32s. Their structure
//! and consistency (headers, `__nshards__`, chunks adding up) are checked whole by
//! [`crate::HfaiReader::open`].

use std::path::Path;

use ckpt_io::VerifyReport;

use crate::error::{Error, Result};

/// Checks the CRC-32 of every record of every `PART_*.pt` file in `dir` (stale parts included: hfai's
/// loader counts them too).
///
/// ```
/// use ckpt_tensor::{Dict, DictKind, Tensor};
/// use ckpt_hfai::{ModelState, SaveState, WriteOptions};
/// let mut sd = Dict::new(DictKind::OrderedDict);
/// sd.insert("w", Tensor::from_slice(&[1.0f32; 8], &[8]).unwrap());
/// let dir = tempfile::tempdir().unwrap();
/// let state = SaveState::default().with_model(ModelState::new(sd));
/// ckpt_hfai::save(&state, dir.path(), &WriteOptions::default().with_world_size(2)).unwrap();
/// let report = ckpt_hfai::verify(dir.path()).unwrap();
/// assert!(report.is_ok());
/// assert_eq!(report.files, 2);
/// ```
///
/// # Errors
/// [`Error::Io`] listing the directory; [`Error::Torch`] for a part that is not a `torch.save` archive at
/// all.
pub fn verify(dir: impl AsRef<Path>) -> Result<VerifyReport> {
    let dir = dir.as_ref();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let is_part = entry.file_name().to_str().is_some_and(|n| n.starts_with("PART_") && n.ends_with(".pt"));
        if is_part && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    let mut report = VerifyReport::new("hfai", dir);
    for file in &files {
        report.merge(ckpt_torch::verify(file)?);
    }
    Ok(report)
}
