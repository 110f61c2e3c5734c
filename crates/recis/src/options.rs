//! How a RecIS checkpoint is read: [`ReadOptions`], which every reader of the crate takes (data files,
//! the sparse part, the whole checkpoint, a reshard's source).

/// How a RecIS checkpoint is read: its `torch.save` files (`model.pt`, `extra.pt`, io states) and its data
/// files' headers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReadOptions {
    /// How the `torch.save` files are read (CRC verification, pickle limits).
    pub torch: ckpt_torch::ReadOptions,
    /// The largest data-file header accepted, in bytes (default [`crate::MAX_HEADER_LEN`], the
    /// `safetensors` crate's bound).
    pub max_header_len: u64,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { torch: ckpt_torch::ReadOptions::default(), max_header_len: crate::data_file::MAX_HEADER_LEN }
    }
}

impl ReadOptions {
    /// These options reading the `torch.save` files with `torch`.
    #[must_use]
    pub fn with_torch(mut self, torch: ckpt_torch::ReadOptions) -> Self {
        self.torch = torch;
        self
    }

    /// These options accepting data-file headers of at most `bytes` ([`ReadOptions::max_header_len`]).
    #[must_use]
    pub fn with_max_header_len(mut self, bytes: u64) -> Self {
        self.max_header_len = bytes;
        self
    }
}
