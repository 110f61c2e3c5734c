//! Verifying a checkpoint of any format: structure, coverage, checksums, the format's own commit state,
//! and that every entry reads.

use std::path::Path;

use crate::error::At;
use crate::{Checkpoint, EntryKind, Format, Result};

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

/// Verifies the checkpoint at `path` (format detected):
///
/// - torch: the archive's structure, every record's CRC-32, every tensor readable;
/// - safetensors: the header (dtypes, shapes, offsets covering the data) and every tensor readable;
/// - distcp: chunks covering their tensors, items in their files, CRCs, contents;
/// - hfai: every part's CRCs, the parts complete and consistent, every entry readable;
/// - pbg: the committed version complete, counts against the entity path when it is found, every file
///   valid, every entry readable;
/// - recis: every `.pt` file's CRCs, the index, tensor keys and data files validated, every entry readable.
///
/// ```
/// use ckpt::core::{Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("m.pt");
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
/// ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
/// let report = ckpt::verify(&path).unwrap();
/// assert!(report.is_ok(), "{:?}", report.problems);
/// ```
///
/// # Errors
/// When the checkpoint cannot be opened at all (not a checkpoint, unreadable structure, I/O); problems found
/// once it is open are listed in [`VerifyReport::problems`].
pub fn verify(path: &Path) -> Result<VerifyReport> {
    verify_with_progress(path, &|_, _| {})
}

/// [`verify`], reporting progress over the entries read.
///
/// # Errors
/// As [`verify`].
pub fn verify_with_progress(path: &Path, progress: Progress<'_>) -> Result<VerifyReport> {
    let format = crate::detect(path)?;
    let adaptor = crate::formats::adaptor(format, path)?;
    let mut report = VerifyReport::new(format);
    adaptor.verify(path, &mut report, progress)?;
    Ok(report)
}

impl VerifyReport {
    /// A record of a file that failed its checksum, as a problem.
    #[cfg_attr(not(any(feature = "torch", feature = "hfai", feature = "recis")), allow(dead_code))]
    pub(crate) fn record_problem(&mut self, file: &Path, record: &str, error: &dyn std::fmt::Display) {
        self.problems.push(format!("{}: record {record}: {error}", file.display()));
    }
}

/// Reads every entry: tensors to their last byte, values decoded.
pub(crate) fn read_all(ck: &Checkpoint, report: &mut VerifyReport, progress: Progress<'_>) {
    let entries = ck.entries();
    let total = entries.len() as u64;
    for (i, e) in entries.iter().enumerate() {
        match &e.kind {
            EntryKind::Tensor(_) => match ck.tensor(&e.name).and_then(|t| t.data().map(|d| d.len()).at(ck.path())) {
                Ok(n) => report.bytes += n as u64,
                Err(err) => report.problems.push(format!("{}: {}", e.name, chain(&err))),
            },
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
