//! The reports of one shape that every format crate returns: what a save wrote ([`SaveReport`]), what a
//! verification found ([`VerifyReport`], its [`Problem`]s), and what a reshard did ([`ReshardReport`]).
//!
//! A format crate fills in what its format has (a torch file has one file and no manifest; PyTorch-BigGraph
//! has versions); the shapes are the same, so a tool that saves, verifies or reshards any format reads one
//! report.

use std::fmt;
use std::path::{Path, PathBuf};

use ckpt_tensor::{Value, error_chain, leaves};

/// What a save wrote.
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_io::SaveReport;
/// let sd = Value::dict([
///     ("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap())),
///     ("step", Value::Int(3)),
/// ]);
/// let report = SaveReport::of_value(&sd);
/// assert_eq!((report.tensors, report.bytes, report.values), (1, 8, 1));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SaveReport {
    /// The files written, in the order the format writes them (for a directory format, the paths under
    /// the destination; for a single file, the file). A `save_rank` lists the files of its own rank, and
    /// rank 0 the metadata files it wrote last.
    pub files: Vec<PathBuf>,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes: u64,
    /// Other values written (numbers, strings, optimizer hyperparameters...).
    pub values: usize,
    /// Entries the format cannot hold and left out, by name.
    pub dropped: Vec<String>,
}

impl SaveReport {
    /// The tensors, tensor bytes and other values of `value`, counted over its [`leaves`] (a tensor
    /// shared by two entries is counted at each), with no files.
    pub fn of_value(value: &Value) -> SaveReport {
        let mut report = SaveReport::default();
        report.count(value);
        report
    }

    /// Adds the tensors, tensor bytes and other values of `value` to this report ([`SaveReport::of_value`]).
    pub fn count(&mut self, value: &Value) {
        // A key whose `str()` is not reproduced fails the walk; the save itself reports that, so the
        // counts are then the top level's.
        let leaves = leaves(value).unwrap_or_default();
        for leaf in leaves {
            match leaf.value.as_tensor() {
                Some(t) => {
                    self.tensors += 1;
                    self.bytes += t.nbytes() as u64;
                }
                None => self.values += 1,
            }
        }
    }

    /// This report with `files` as the files written.
    #[must_use]
    pub fn with_files(mut self, files: Vec<PathBuf>) -> SaveReport {
        self.files = files;
        self
    }

    /// Adds another report's counts, files and dropped entries to this one (the reports of several ranks).
    pub fn merge(&mut self, other: SaveReport) {
        self.files.extend(other.files);
        self.tensors += other.tensors;
        self.bytes += other.bytes;
        self.values += other.values;
        self.dropped.extend(other.dropped);
    }
}

/// How serious a [`Problem`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    /// The checkpoint does not load as it was saved: a changed byte, a missing file, data that contradicts
    /// its metadata.
    Error,
    /// The checkpoint loads, but something beside it needs attention: the leftovers of an interrupted
    /// save, stale files, a dangling snapshot link, a file written without checksums.
    Warning,
}

/// What kind of problem a verification found. One variant per rule a checkpoint can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// Bytes that do not match the checksum recorded for them (a record's CRC-32, a manifest chunk, a
    /// safetensors tensor's CRC32C).
    ChecksumMismatch,
    /// A file, partition or entry the checkpoint's metadata names is absent.
    Missing,
    /// A file or entry that does not parse or cannot be read.
    Unreadable,
    /// Data that contradicts the checkpoint's metadata (a shape, a size, a count, a chunk outside its
    /// tensor, chunks that overlap or leave a gap).
    Inconsistent,
    /// Files of a save that never committed (a newer version, a staging directory, a killed rank's part).
    Unfinished,
    /// Files of an older checkpoint nothing refers to any more.
    Stale,
    /// A link whose target is gone.
    DanglingLink,
    /// Data without checksums (a legacy file, a file written with checksums off): nothing to check.
    Unchecked,
}

impl ProblemKind {
    /// The kind's name as the `ckpt` tool prints it (`checksum-mismatch`, `missing`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ProblemKind::ChecksumMismatch => "checksum-mismatch",
            ProblemKind::Missing => "missing",
            ProblemKind::Unreadable => "unreadable",
            ProblemKind::Inconsistent => "inconsistent",
            ProblemKind::Unfinished => "unfinished",
            ProblemKind::Stale => "stale",
            ProblemKind::DanglingLink => "dangling-link",
            ProblemKind::Unchecked => "unchecked",
        }
    }

    /// The severity a problem of this kind has: [`Severity::Warning`] for what leaves the checkpoint
    /// loadable (unfinished saves, stale files, dangling links, unchecked data), [`Severity::Error`] for
    /// the rest.
    pub fn severity(self) -> Severity {
        match self {
            ProblemKind::ChecksumMismatch
            | ProblemKind::Missing
            | ProblemKind::Unreadable
            | ProblemKind::Inconsistent => Severity::Error,
            ProblemKind::Unfinished | ProblemKind::Stale | ProblemKind::DanglingLink | ProblemKind::Unchecked => {
                Severity::Warning
            }
        }
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One thing a verification found: what kind, where (a file, an entry or record in it), and the
/// format's own message.
///
/// ```
/// use ckpt_io::{Problem, ProblemKind, Severity};
/// let p = Problem::new(ProblemKind::ChecksumMismatch, "CRC-32 0x1 != 0x2").in_file("m.pt").at_entry("archive/data/0");
/// assert_eq!(p.severity(), Severity::Error);
/// assert_eq!(p.to_string(), "m.pt: archive/data/0: CRC-32 0x1 != 0x2 [checksum-mismatch]");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// What rule is broken.
    pub kind: ProblemKind,
    /// The file it is in, when it is in one.
    pub file: Option<PathBuf>,
    /// The entry, record, item or partition, when it is one.
    pub entry: Option<String>,
    /// The format's own description (an error's message with its causes).
    pub message: String,
}

impl Problem {
    /// A problem of `kind`, described by `message`, not yet placed.
    pub fn new(kind: ProblemKind, message: impl Into<String>) -> Problem {
        Problem { kind, file: None, entry: None, message: message.into() }
    }

    /// A problem of `kind` described by `error` and each of its causes that its message does not already
    /// include.
    pub fn from_error(kind: ProblemKind, error: &(dyn std::error::Error + 'static)) -> Problem {
        Problem::new(kind, error_chain(error, ": "))
    }

    /// This problem placed in `file`.
    #[must_use]
    pub fn in_file(mut self, file: impl AsRef<Path>) -> Problem {
        self.file = Some(file.as_ref().to_path_buf());
        self
    }

    /// This problem placed at `entry` (an entry, record, item or partition).
    #[must_use]
    pub fn at_entry(mut self, entry: impl Into<String>) -> Problem {
        self.entry = Some(entry.into());
        self
    }

    /// How serious it is ([`ProblemKind::severity`]).
    pub fn severity(&self) -> Severity {
        self.kind.severity()
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        if let Some(entry) = &self.entry {
            write!(f, "{entry}: ")?;
        }
        write!(f, "{} [{}]", self.message, self.kind)
    }
}

/// What a verification found.
///
/// ```
/// use ckpt_io::{Problem, ProblemKind, VerifyReport};
/// let mut report = VerifyReport::new("distcp", "ckpt/");
/// report.records = 4;
/// report.push(Problem::new(ProblemKind::Stale, "old file").in_file("ckpt/old.bin"));
/// assert!(report.is_ok());
/// report.push(Problem::new(ProblemKind::Missing, "no such file").in_file("ckpt/__1_0.distcp"));
/// assert!(!report.is_ok());
/// assert_eq!(report.errors().count(), 1);
/// assert_eq!(report.warnings().count(), 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The format verified, by its name in ckpt (`torch`, `distcp`, `hfai`, `pbg`, `recis`, `safetensors`,
    /// `hf`, ...).
    pub format: &'static str,
    /// The checkpoint verified (a file or a directory).
    pub path: PathBuf,
    /// Files checked.
    pub files: usize,
    /// Units checked on their own: torch records, DCP items, RecIS blocks, safetensors tensors, PBG files.
    pub records: usize,
    /// Bytes of data checked.
    pub bytes: u64,
    /// Every problem found, errors and warnings, in the order found.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// An empty report for the checkpoint of `format` at `path`.
    pub fn new(format: &'static str, path: impl AsRef<Path>) -> VerifyReport {
        VerifyReport { format, path: path.as_ref().to_path_buf(), ..VerifyReport::default() }
    }

    /// Whether no problem of [`Severity::Error`] was found: the checkpoint loads as it was saved.
    pub fn is_ok(&self) -> bool {
        self.errors().next().is_none()
    }

    /// Adds a problem.
    pub fn push(&mut self, problem: Problem) {
        self.problems.push(problem);
    }

    /// The problems of [`Severity::Error`].
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| p.severity() == Severity::Error)
    }

    /// The problems of [`Severity::Warning`].
    pub fn warnings(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| p.severity() == Severity::Warning)
    }

    /// The problems of `kind`.
    pub fn of_kind(&self, kind: ProblemKind) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(move |p| p.kind == kind)
    }

    /// Adds another report's counts and problems to this one (the files of a directory, checked one by
    /// one).
    pub fn merge(&mut self, other: VerifyReport) {
        self.files += other.files;
        self.records += other.records;
        self.bytes += other.bytes;
        self.problems.extend(other.problems);
    }
}

/// What a reshard did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReshardReport {
    /// Ranks, shards or parts of the source.
    pub from: usize,
    /// Ranks, shards or parts written.
    pub to: usize,
    /// What was written (tensors, bytes, files).
    pub saved: SaveReport,
    /// Bytes of tensor data copied through memory rather than written straight from the source's memory
    /// maps (a new chunk spanning stored chunks, a re-partitioned row); `None` when the format does not
    /// count them.
    pub copied_bytes: Option<u64>,
}

impl ReshardReport {
    /// A reshard from `from` to `to` ranks that wrote `saved`.
    pub fn new(from: usize, to: usize, saved: SaveReport) -> ReshardReport {
        ReshardReport { from, to, saved, copied_bytes: None }
    }
}
