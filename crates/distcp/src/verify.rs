//! Verifying a checkpoint end to end: the metadata-level rules of [`DcpReader::open`] (all problems, not
//! just the first), then every item: a valid `torch.save` archive with correct CRC-32s, holding a tensor of
//! its chunk's dtype and shape (or an object that unpickles).

use std::collections::HashSet;
use std::path::Path;

use rayon::prelude::*;

use ckpt_io::{Problem, ProblemKind, VerifyReport};

use crate::error::{Error, Result};
use crate::metadata::StorageMetadata;
use crate::reader::{DcpReader, ReadOptions};

/// Verifies the checkpoint in `dir`: chunks inside their tensors, not overlapping and covering them;
/// items inside their files; data file paths relative and inside the directory; every item parses as a
/// `torch.save` archive whose records match their CRC-32, and holds what the metadata says.
///
/// # Errors
/// Only when the metadata itself cannot be read (missing, not a pickle, unknown classes); everything else
/// is reported in [`VerifyReport::problems`].
pub fn verify(dir: impl AsRef<Path>) -> Result<VerifyReport> {
    verify_with(dir, &ReadOptions::default())
}

/// [`verify`], reading with `options` (its limits; CRC checking is always on).
///
/// # Errors
/// As [`verify`].
pub fn verify_with(dir: impl AsRef<Path>, options: &ReadOptions) -> Result<VerifyReport> {
    let dir = dir.as_ref();
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
    Ok(report(dir, md, items, bytes, problems))
}

/// The structural part of [`verify`]: the metadata's rules (chunks inside their tensors, not overlapping
/// and covering them; data file paths relative and inside the directory; every data file present and every
/// item inside its file), without reading any item.
///
/// # Errors
/// As [`verify`].
pub fn verify_structure(dir: impl AsRef<Path>) -> Result<VerifyReport> {
    verify_structure_with(dir, &ReadOptions::default())
}

/// [`verify_structure`], reading the metadata with `options` (its limits).
///
/// # Errors
/// As [`verify`].
pub fn verify_structure_with(dir: impl AsRef<Path>, options: &ReadOptions) -> Result<VerifyReport> {
    let dir = dir.as_ref();
    let reader = DcpReader::open_unchecked(dir, options)?;
    let problems = reader.metadata_problems(false);
    let md = reader.metadata();
    let items = md.storage_data.len();
    let bytes = md.storage_data.iter().map(|(_, s)| s.length).sum();
    Ok(report(dir, md, items, bytes, problems))
}

/// The report of a verification of `dir` that checked `items` items of `bytes` bytes and found `problems`.
fn report(dir: &Path, md: &crate::metadata::Metadata, items: usize, bytes: u64, problems: Vec<Error>) -> VerifyReport {
    let mut report = VerifyReport::new("distcp", dir);
    let files: HashSet<&str> = md.storage_data.iter().map(|(_, s)| s.relative_path.as_str()).collect();
    report.files = files.len() + 1;
    report.records = items;
    report.bytes = bytes;
    report.problems = problems.iter().map(|e| problem(dir, e)).collect();
    report
}

/// A problem the reader found, placed at its key and file.
fn problem(dir: &Path, e: &Error) -> Problem {
    let kind = match e {
        Error::MissingFile { .. } | Error::MissingItem { .. } => ProblemKind::Missing,
        Error::BadItem { source, .. }
            if matches!(source.kind(), ckpt_torch::Error::Zip(ckpt_torch::zip::ZipError::CrcMismatch { .. })) =>
        {
            ProblemKind::ChecksumMismatch
        }
        Error::BadItem { .. } | Error::Zstd { .. } | Error::UnknownTransform { .. } => ProblemKind::Unreadable,
        _ => ProblemKind::Inconsistent,
    };
    let mut p = Problem::from_error(kind, e);
    let key = match e {
        Error::BadItem { key, .. }
        | Error::ItemNotTensor { key, .. }
        | Error::ChunkShapeMismatch { key, .. }
        | Error::DTypeMismatch { key, .. }
        | Error::UnknownTransform { key, .. }
        | Error::Zstd { key, .. } => Some(key.clone()),
        e => problem_key(e),
    };
    if let Some(key) = key {
        p = p.at_entry(key);
    }
    match e {
        Error::BadItem { file, .. }
        | Error::ItemNotTensor { file, .. }
        | Error::ChunkShapeMismatch { file, .. }
        | Error::DTypeMismatch { file, .. }
        | Error::Zstd { file, .. } => p.in_file(dir.join(file)),
        _ => p,
    }
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
