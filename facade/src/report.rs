//! What the operations report that adaptors fill in: a conversion's summary, a verification's report
//! and the progress callback, and an error's chain of causes as one line.

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

pub use ckpt_io::{Problem, ProblemKind, Severity, VerifyReport};
/// What [`verify`](crate::verify) found: the report every format crate returns, one shape
/// ([`ckpt_io::VerifyReport`]), with the facade's own findings (entries that do not read, the checksum
/// manifest, a save that never committed) among its problems.
pub use ckpt_tensor::error_chain;

/// Takes a format crate's verification of the checkpoint's files into the facade's `report`: its files
/// and problems (the facade counts the entries it reads itself). Every format that has one reads
/// `torch.save` files.
#[cfg(feature = "torch")]
pub(crate) fn absorb(report: &mut VerifyReport, checked: VerifyReport) {
    report.files += checked.files;
    report.problems.extend(checked.problems);
}

/// Progress of a long operation: called with (done, total) units of work.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// An error's message and its causes, on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    error_chain(e, ": ")
}
