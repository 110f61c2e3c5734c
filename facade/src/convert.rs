//! Converting a checkpoint of any format into any other whose model can hold it.

use std::path::Path;

use crate::{Error, Format, Result};

/// Choices for the target layout of [`convert`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConvertOptions {
    /// Number of ranks/shards/parts for distcp, hfai and recis targets (default 1).
    pub world_size: usize,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions { world_size: 1 }
    }
}

impl ConvertOptions {
    /// Sets the number of ranks/shards/parts of the target.
    #[must_use]
    pub fn with_world_size(mut self, n: usize) -> Self {
        self.world_size = n;
        self
    }
}

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

/// Converts the checkpoint at `src` (format detected unless `from` is given) to `to` at `dst`.
///
/// # Errors
/// [`Error::UnsupportedConversion`] when the target cannot hold the source's data, or the formats' own errors.
pub fn convert(src: &Path, from: Option<Format>, dst: &Path, to: Format, options: &ConvertOptions) -> Result<ConvertSummary> {
    let _ = (dst, options);
    let from = match from {
        Some(f) => f,
        None => crate::detect(src)?,
    };
    Err(Error::UnsupportedConversion { from, to, reason: "not implemented yet".into() })
}
