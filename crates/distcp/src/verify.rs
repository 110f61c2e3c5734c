//! Verifying a checkpoint end to end: the metadata-level rules of [`DcpReader::open`] (all problems, not
//! just the first), then every item: a valid `torch.save` archive with correct CRC-32s, holding a tensor of
//! its chunk's dtype and shape (or an object that unpickles).

use std::collections::HashSet;
use std::path::Path;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::metadata::StorageMetadata;
use crate::reader::{DcpReader, ReadOptions};

/// What [`verify`] found.
#[derive(Debug)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Keys checked.
    pub keys: usize,
    /// Items read and checked.
    pub items: usize,
    /// Bytes of the items checked (as stored).
    pub bytes: u64,
    /// Every problem, each naming its key and file.
    pub problems: Vec<Error>,
}

impl VerifyReport {
    /// Whether no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Verifies the checkpoint in `dir`: chunks inside their tensors, not overlapping and covering them;
/// items inside their files; data file paths relative and inside the directory; every item parses as a
/// `torch.save` archive whose records match their CRC-32, and holds what the metadata says.
///
/// # Errors
/// Only when the metadata itself cannot be read (missing, not a pickle, unknown classes); everything else
/// is reported in [`VerifyReport::problems`].
pub fn verify(dir: &Path) -> Result<VerifyReport> {
    verify_with(dir, &ReadOptions::default())
}

/// [`verify`], reading with `options` (its limits; CRC checking is always on).
///
/// # Errors
/// As [`verify`].
pub fn verify_with(dir: &Path, options: &ReadOptions) -> Result<VerifyReport> {
    let reader = DcpReader::open_unchecked(dir, &options.clone().with_verify_crc(true))?;
    let mut problems = reader.metadata_problems(false);
    let bad_keys: HashSet<String> = problems.iter().filter_map(problem_key).collect();
    let md = reader.metadata();
    let checks: Vec<(usize, u64, Vec<Error>)> = md
        .state_dict_metadata
        .par_iter()
        .filter(|(k, _)| !bad_keys.contains(k))
        .map(|(k, m)| match m {
            StorageMetadata::Tensor(t) => {
                let mut errs = Vec::new();
                let mut bytes = 0;
                for (i, c) in t.chunks.iter().enumerate() {
                    bytes += reader.storage_info(k, Some(&c.offsets)).map_or(0, |s| s.length);
                    if let Err(e) = reader.read_chunk(k, i) {
                        errs.push(e);
                    }
                }
                (t.chunks.len(), bytes, errs)
            }
            StorageMetadata::Bytes => {
                let bytes = reader.storage_info(k, None).map_or(0, |s| s.length);
                (1, bytes, reader.read_value(k).err().into_iter().collect())
            }
        })
        .collect();
    let mut items = 0;
    let mut bytes = 0;
    for (n, b, errs) in checks {
        items += n;
        bytes += b;
        problems.extend(errs);
    }
    Ok(VerifyReport { keys: md.state_dict_metadata.len(), items, bytes, problems })
}

/// The structural part of [`verify`]: the metadata's rules (chunks inside their tensors, not overlapping
/// and covering them; data file paths relative and inside the directory; every data file present and every
/// item inside its file), without reading any item.
///
/// # Errors
/// As [`verify`].
pub fn verify_structure(dir: &Path) -> Result<VerifyReport> {
    verify_structure_with(dir, &ReadOptions::default())
}

/// [`verify_structure`], reading the metadata with `options` (its limits).
///
/// # Errors
/// As [`verify`].
pub fn verify_structure_with(dir: &Path, options: &ReadOptions) -> Result<VerifyReport> {
    let reader = DcpReader::open_unchecked(dir, options)?;
    let problems = reader.metadata_problems(false);
    let md = reader.metadata();
    let items = md.storage_data.len();
    let bytes = md.storage_data.iter().map(|(_, s)| s.length).sum();
    Ok(VerifyReport { keys: md.state_dict_metadata.len(), items, bytes, problems })
}

/// The key a problem is about, if any.
fn problem_key(e: &Error) -> Option<String> {
    match e {
        Error::UnsafePath { key, .. }
        | Error::MissingFile { key, .. }
        | Error::ItemOutOfFile { key, .. }
        | Error::ChunkRank { key, .. }
        | Error::ChunkOutOfBounds { key, .. }
        | Error::OverlappingChunks { key, .. }
        | Error::IncompleteCoverage { key, .. }
        | Error::MissingItem { key, .. } => Some(key.clone()),
        _ => None,
    }
}
