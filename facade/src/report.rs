//! What the operations report that adaptors fill in: a conversion's summary, a verification's report
//! and the progress callback, and an error's chain of causes as one line.

use crate::format::Format;

/// What a conversion did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ConvertSummary {
    /// Tensors written.
    pub tensors: usize,
    /// Tensor bytes written.
    pub bytes: u64,
    /// Non-tensor values written.
    pub values: usize,
    /// Entries the target format cannot hold, by name (for example non-tensor values in safetensors).
    pub dropped: Vec<String>,
}

/// What [`verify`](crate::verify) found.
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

    pub(crate) fn new(format: Format) -> Self {
        VerifyReport { format, checked: 0, bytes: 0, problems: Vec::new(), warnings: Vec::new() }
    }
}

impl VerifyReport {
    /// A record of a file that failed its checksum, as a problem.
    #[cfg(any(feature = "torch", feature = "hfai", feature = "recis"))]
    pub(crate) fn record_problem(&mut self, file: &std::path::Path, record: &str, error: &dyn std::fmt::Display) {
        self.problems.push(format!("{}: record {record}: {error}", file.display()));
    }
}

/// Progress of a long operation: called with (done, total) units of work.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// An error's message and its causes, on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    error_chain(e, ": ")
}

/// An error's message followed by each of its causes ([`source`](std::error::Error::source)) that the
/// message does not already include, joined by `separator` (`": "` on one line; the `ckpt` tool puts each
/// cause on a line of its own).
pub fn error_chain(e: &dyn std::error::Error, separator: &str) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(separator);
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}
