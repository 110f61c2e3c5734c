//! Verifying a checkpoint of any format: structure, coverage, checksums, the format's own commit state,
//! and that every entry reads.

use std::path::Path;

use crate::error::At;
use crate::{Checkpoint, EntryKind, Format, ReadLimits, Result};

/// What [`verify`] found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The format verified.
    pub format: Format,
    /// Entries (or items, for formats that store several per entry) checked.
    pub checked: usize,
    /// Bytes of tensor data checked.
    pub bytes: u64,
    /// Every problem found, each naming its entry or file. Empty when the checkpoint is sound.
    pub problems: Vec<String>,
    /// Findings that do not make the checkpoint unusable (leftovers of an interrupted save, stale files).
    pub warnings: Vec<String>,
}

impl VerifyReport {
    /// Whether no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn new(format: Format) -> Self {
        VerifyReport { format, checked: 0, bytes: 0, problems: Vec::new(), warnings: Vec::new() }
    }
}

/// Progress of a long operation: called with (done, total) units of work.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// How much [`verify_with`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Depth {
    /// The structure, without reading tensor data: every header and metadata parsed, every entry resolved
    /// (its storage or item present, inside its file, large enough for its dtype and shape), every file a
    /// checkpoint references present with the right size, and the checksum manifest consistent with the
    /// files it lists. Fast (reads headers only); misses changed bytes inside tensor data.
    Structure,
    /// [`Depth::Structure`], then every byte of every file read and every checksum the format has checked:
    /// ZIP CRC-32s of `torch.save` records (torch, DCP items, hfai parts, RecIS `.pt` files), ckpt's
    /// checksum manifest (`ckpt.checksums.json`, beside distcp, hfai, recis and pbg checkpoints), and the
    /// per-tensor checksums ckpt records in safetensors headers (single files and hf shards).
    #[default]
    Deep,
}

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
/// let quick = ckpt::verify_with(&path, &ckpt::VerifyOptions::structure(), &|_, _| {}).unwrap();
/// assert!(quick.is_ok());
/// ```
///
/// # Errors
/// When the checkpoint cannot be opened at all (not a checkpoint, unreadable structure, I/O); problems found
/// once it is open are listed in [`VerifyReport::problems`]. A save of `path` that never committed (a
/// killed rank) is reported in [`VerifyReport::warnings`], naming the ranks whose files are missing
/// ([`ckpt_io::unfinished`]); when there is no checkpoint at `path` at all, it is the error.
pub fn verify(path: &Path) -> Result<VerifyReport> {
    verify_with(path, &VerifyOptions::default(), &|_, _| {})
}

/// [`verify`] (deep), reporting progress over the entries read.
///
/// # Errors
/// As [`verify`].
pub fn verify_with_progress(path: &Path, progress: Progress<'_>) -> Result<VerifyReport> {
    verify_with(path, &VerifyOptions::default(), progress)
}

/// [`verify`] to the depth of `options`, reporting progress over the entries checked.
///
/// # Errors
/// As [`verify`].
pub fn verify_with(path: &Path, options: &VerifyOptions, progress: Progress<'_>) -> Result<VerifyReport> {
    if !path.exists() {
        if let Some(u) = ckpt_io::unfinished(path) {
            // A first save that never committed: nothing to verify but what it left.
            return Err(crate::Error::InvalidArgument { path: path.to_path_buf(), reason: u.to_string() });
        }
    }
    let format = crate::detect(path)?;
    let adaptor = crate::formats::adaptor(format, path)?;
    let mut report = VerifyReport::new(format);
    adaptor.verify(path, options.depth, &options.limits, &mut report, progress)?;
    check_manifest(&adaptor.manifest_dir(path), options.depth, &mut report);
    if let Some(u) = ckpt_io::unfinished(path) {
        // The checkpoint at `path` is whole (the previous one); the new one never committed.
        report.warnings.push(u.to_string());
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
        Ok(Some(mismatches)) => report.problems.extend(mismatches.iter().map(|m| format!("{name}: {m}"))),
        Err(e) => report.problems.push(format!("{name}: {}", chain(&e))),
    }
}

impl VerifyReport {
    /// A record of a file that failed its checksum, as a problem.
    #[cfg_attr(not(any(feature = "torch", feature = "hfai", feature = "recis")), allow(dead_code))]
    pub(crate) fn record_problem(&mut self, file: &Path, record: &str, error: &dyn std::fmt::Display) {
        self.problems.push(format!("{}: record {record}: {error}", file.display()));
    }
}

/// Resolves every entry: values decoded, tensors located (their bytes present); deep, every tensor read to
/// its last byte.
pub(crate) fn read_all(ck: &Checkpoint, depth: Depth, report: &mut VerifyReport, progress: Progress<'_>) {
    let entries = ck.entries();
    let total = entries.len() as u64;
    for (i, e) in entries.iter().enumerate() {
        match &e.kind {
            EntryKind::Tensor(_) => {
                let read = ck.tensor(&e.name).and_then(|t| match depth {
                    Depth::Deep => t.data().map(|d| touch(&d)).at(ck.path()),
                    Depth::Structure => Ok(t.nbytes()),
                });
                match read {
                    Ok(n) => report.bytes += n as u64,
                    Err(err) => report.problems.push(format!("{}: {}", e.name, chain(&err))),
                }
            }
            EntryKind::OpaqueTensor(_) => {}
            _ => {
                if let Err(err) = ck.value(&e.name) {
                    report.problems.push(format!("{}: {}", e.name, chain(&err)));
                }
            }
        }
        report.checked += 1;
        progress(i as u64 + 1, total);
    }
}

/// Checks the per-tensor checksums ckpt records in a safetensors header
/// ([`ckpt_safetensors::checksums`]) of the file at `file`, reading every byte of its tensors; a file
/// without them (written by another library) has nothing to check.
#[cfg_attr(not(any(feature = "safetensors", feature = "hf")), allow(dead_code))]
pub(crate) fn check_safetensors_checksums(file: &Path, report: &mut VerifyReport) {
    match ckpt_safetensors::SafetensorsReader::open(file).and_then(|r| ckpt_safetensors::checksums(&r)) {
        Ok(None) => {}
        Ok(Some(problems)) => report.problems.extend(problems.iter().map(|p| format!("{}: {p}", file.display()))),
        Err(e) => report.problems.push(format!("{}: {}", file.display(), chain(&e))),
    }
}

/// Reads one byte of every page of `bytes` (mapped data reaches the disk), returning its length.
fn touch(bytes: &[u8]) -> usize {
    let mut x = 0u8;
    for b in bytes.iter().step_by(4096) {
        x ^= *b;
    }
    std::hint::black_box(x);
    bytes.len()
}

/// An error's message and its causes, on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}
