//! How a RecIS checkpoint is read: [`ReadOptions`], which every reader of the crate takes (data files,
//! the sparse part, the whole checkpoint, a reshard's source).

use std::path::Path;
use std::sync::Arc;

use ckpt_io::storage::RangeFill;

/// The largest header accepted by default (as the safetensors library: 100 MB); [`DataFile::open_with`](crate::DataFile::open_with)
/// takes another.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// How a RecIS checkpoint is read: its `torch.save` files (`model.pt`, `extra.pt`, io states) and its data
/// files' headers; for a partial local copy, the hook that fills what is read.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReadOptions {
    /// How the `torch.save` files are read (CRC verification, pickle limits, and their fill hook: set it
    /// with [`ReadOptions::with_fill`], which names each file to the hook as the data files are).
    pub torch: ckpt_torch::ReadOptions,
    /// The largest data-file header accepted, in bytes (default [`crate::MAX_HEADER_LEN`], the
    /// `safetensors` crate's bound).
    pub max_header_len: u64,
    /// The hook that makes a partial local copy's bytes present before they are read (a checkpoint on an
    /// object store fetched as it is read: its small files whole, each data file's header and each `.pt`
    /// file's ZIP index present, the rest sparse). With one, each data file's length prefix and header
    /// are filled before they are parsed ([`ckpt_safetensors::fill_header`]), and every block's bytes are
    /// made on demand ([`ckpt_safetensors::filled_window`]): each range read is filled first, so nothing
    /// unfilled is ever handed out and a failed fill is an error of the read, never zeros. Files are named
    /// to the hook by their path relative to the path opened (`model-000000-of-000001.safetensors`, or
    /// `<ckpt_id>/model.pt` under an output root). Default `None`: local files, read as windows of their
    /// maps.
    pub fill: Option<Arc<dyn RangeFill>>,
    /// The checkpoint directory's path as [`ReadOptions::fill`] knows it (`<ckpt_id>` under an output
    /// root), prefixed to each file's name; empty: the directory opened. Set by the readers.
    pub(crate) fill_dir: String,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            torch: ckpt_torch::ReadOptions::default(),
            max_header_len: MAX_HEADER_LEN,
            fill: None,
            fill_dir: String::new(),
        }
    }
}

impl ReadOptions {
    /// These options reading the `torch.save` files with `torch` (its fill hook replaced by these
    /// options', if they have one).
    #[must_use]
    pub fn with_torch(mut self, torch: ckpt_torch::ReadOptions) -> Self {
        self.torch = match &self.fill {
            Some(fill) => torch.with_fill(Some(Arc::clone(fill))),
            None => torch,
        };
        self
    }

    /// These options accepting data-file headers of at most `bytes` ([`ReadOptions::max_header_len`]).
    #[must_use]
    pub fn with_max_header_len(mut self, bytes: u64) -> Self {
        self.max_header_len = bytes;
        self
    }

    /// These options reading a partial local copy through `fill` ([`ReadOptions::fill`]), its data files
    /// and its `torch.save` files alike; `None` reads local files as they are.
    #[must_use]
    pub fn with_fill(mut self, fill: Option<Arc<dyn RangeFill>>) -> Self {
        self.torch = self.torch.with_fill(fill.clone());
        self.fill = fill;
        self
    }

    /// The name [`ReadOptions::fill`] knows the file `name` of the checkpoint directory by.
    pub(crate) fn fill_name(&self, name: &str) -> String {
        if self.fill_dir.is_empty() { name.to_owned() } else { format!("{}/{name}", self.fill_dir) }
    }

    /// These options for the checkpoint directory `dir` opened as `opened` (an output root, or `dir`
    /// itself): files named to the fill hook relative to `opened`.
    pub(crate) fn for_dir(&self, opened: &Path, dir: &Path) -> ReadOptions {
        let mut options = self.clone();
        if self.fill.is_some() {
            let relative = dir.strip_prefix(opened).ok().and_then(Path::to_str).unwrap_or_default();
            options.fill_dir = relative.trim_matches('/').to_owned();
        }
        options
    }

    /// The `torch.save` file options for the file `name` of the checkpoint directory: with a fill hook,
    /// the file named to it ([`ReadOptions::fill_name`]).
    pub(crate) fn torch_for(&self, name: &str) -> ckpt_torch::ReadOptions {
        match &self.fill {
            Some(_) => self.torch.clone().with_fill_file(Some(self.fill_name(name))),
            None => self.torch.clone(),
        }
    }
}
