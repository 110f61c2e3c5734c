//! Verifying a checkpoint of any format: structure, coverage, checksums, the format's own commit state,
//! and that every entry reads.

use std::path::Path;

use crate::error::Result;
use crate::limits::ReadLimits;
use crate::options::Depth;
use crate::report::{Problem, ProblemKind, Progress, VerifyReport};

/// Options of [`verify_with`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct VerifyOptions {
    /// How much to check (default [`Depth::Deep`]; the `ckpt verify` command's default is
    /// [`Depth::Structure`], `--deep` asks for the rest).
    pub depth: Depth,
    /// The resource limits the checkpoint is read under (default [`ReadLimits::default`]).
    pub limits: ReadLimits,
}

impl VerifyOptions {
    /// The structural check only ([`Depth::Structure`]).
    pub fn structure() -> Self {
        VerifyOptions { depth: Depth::Structure, limits: ReadLimits::default() }
    }

    /// Every byte and every checksum ([`Depth::Deep`], the default).
    pub fn deep() -> Self {
        VerifyOptions { depth: Depth::Deep, limits: ReadLimits::default() }
    }

    /// With `depth`.
    pub fn with_depth(mut self, depth: Depth) -> Self {
        self.depth = depth;
        self
    }

    /// With the resource `limits` the checkpoint is read under.
    #[must_use]
    pub fn with_limits(mut self, limits: ReadLimits) -> Self {
        self.limits = limits;
        self
    }
}

/// Verifies the checkpoint at `path` (format detected) deeply ([`Depth::Deep`]): every byte read and every
/// checksum the format has checked. [`verify_with`] takes the depth:
///
/// - torch: the archive's structure and every tensor's record; deep: every record's CRC-32;
/// - safetensors: the header (dtypes, shapes, offsets covering the data); deep: every byte, and the
///   per-tensor checksums ckpt writes in `__metadata__` (files written elsewhere have none);
/// - hf: the index and every shard's header; deep: as safetensors, per shard;
/// - distcp: chunks covering their tensors, items inside their files; deep: every item's CRCs and contents;
/// - hfai: the parts complete and consistent; deep: every part's CRCs, every entry read;
/// - pbg: the committed version complete, counts against the entity path when it is found, every file
///   valid; deep: every entry read;
/// - recis: the index, tensor keys and data files validated; deep: every `.pt` file's CRCs, every entry
///   read;
/// - and, in every format, the checksum manifest `ckpt.checksums.json` (ckpt writes one beside distcp,
///   hfai, recis and pbg checkpoints): every listed file present with its size; deep: every byte of every
///   listed file against its checksum.
///
/// ```
/// use ckpt::tensor::{Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("m.pt");
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
/// ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
/// let report = ckpt::verify(&path).unwrap();
/// assert!(report.is_ok(), "{:?}", report.problems);
/// let quick = ckpt::verify_with(&path, &ckpt::VerifyOptions::structure()).unwrap();
/// assert!(quick.is_ok());
/// ```
///
/// # Errors
/// When the checkpoint cannot be opened at all (not a checkpoint, unreadable structure, I/O); problems found
/// once it is open are listed in [`VerifyReport::problems`]. A save of `path` that never committed (a
/// killed rank) is reported as a [`ProblemKind::Unfinished`] warning, naming the ranks whose files are missing
/// ([`ckpt_io::unfinished`]); when there is no checkpoint at `path` at all, it is the error.
pub fn verify(path: impl AsRef<Path>) -> Result<VerifyReport> {
    verify_with(path, &VerifyOptions::default())
}

/// [`verify`] to the depth of `options`, under its limits.
///
/// # Errors
/// As [`verify`].
pub fn verify_with(path: impl AsRef<Path>, options: &VerifyOptions) -> Result<VerifyReport> {
    verify_with_progress(path, options, &|_, _| {})
}

/// [`verify_with`], reporting progress over the entries checked.
///
/// # Errors
/// As [`verify`].
pub fn verify_with_progress(
    path: impl AsRef<Path>,
    options: &VerifyOptions,
    progress: Progress<'_>,
) -> Result<VerifyReport> {
    let path = path.as_ref();
    if !path.exists() {
        if let Some(u) = ckpt_io::unfinished(path) {
            // A first save that never committed: nothing to verify but what it left.
            return Err(crate::error::Error::InvalidArgument { path: path.to_path_buf(), reason: u.to_string() });
        }
    }
    let format = crate::formats::detect(path)?;
    let adaptor = crate::formats::adaptor(format, path)?;
    let mut report = VerifyReport::new(format.name(), path);
    adaptor.verify(path, options.depth, &options.limits, &mut report, progress)?;
    check_manifest(&adaptor.manifest_dir(path), options.depth, &mut report);
    if let Some(u) = ckpt_io::unfinished(path) {
        // The checkpoint at `path` is whole (the previous one); the new one never committed.
        // The message names the destination and its staging directory.
        report.push(Problem::new(ProblemKind::Unfinished, u.to_string()));
    }
    Ok(report)
}

/// Checks the checksum manifest ckpt writes beside formats without checksums of their own
/// ([`ckpt_io::Manifest`]), when `dir` has one: every listed file present with its size, and,
/// deep, every byte of it against the checksum of its chunk. A manifest that cannot be read is a problem;
/// none at all is not (the originals write none).
fn check_manifest(dir: &Path, depth: Depth, report: &mut VerifyReport) {
    if !dir.is_dir() {
        return;
    }
    let name = ckpt_io::MANIFEST_NAME;
    let check = |m: ckpt_io::Manifest| match depth {
        Depth::Structure => m.verify_sizes(dir),
        Depth::Deep => m.verify_dir(dir),
    };
    match ckpt_io::Manifest::read(dir).and_then(|m| m.map(check).transpose()) {
        Ok(None) => {}
        Ok(Some(mismatches)) => report.problems.extend(mismatches.iter().map(|m| {
            let kind = match m {
                ckpt_io::Mismatch::Missing { .. } => ProblemKind::Missing,
                ckpt_io::Mismatch::Size { .. } | ckpt_io::Mismatch::Chunk { .. } => ProblemKind::ChecksumMismatch,
            };
            Problem::new(kind, format!("{m} (per {name})")).in_file(dir.join(m.file()))
        })),
        Err(e) => report.push(Problem::from_error(ProblemKind::Unreadable, &e).in_file(dir.join(name))),
    }
}
