//! [`ReadOptions`]: how `torch.save` files are read (pickle limits, Python 2 strings, the bound on inflated
//! records), which every reader of this crate takes.

use std::sync::Arc;

use ckpt_io::storage::RangeFill;
use ckpt_tensor::{Buffer, Value};

use crate::error::Error;

/// How a `torch.save` stream inside a pickle (`torch.storage._load_from_bytes`) is read: by the reader's entry
/// point, which hands itself down in the options ([`ReadOptions::nested_read`]) to the rebuilder beneath it,
/// so that the rebuilder never names the reader (no import cycle between them).
pub(crate) type NestedRead = fn(&Buffer, &ReadOptions) -> Result<Value, Error>;

/// Options for reading.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Check every record's CRC-32 against the central directory (records with CRC 0, written by
    /// `set_crc32_options(False)`, are not checked). Off by default, as in torch, which never checks.
    pub verify_crc: bool,
    /// Limits for the pickle decoder.
    pub limits: ckpt_pickle::Limits,
    /// How Python 2 strings (legacy files pickled by Python 2) are read: `torch.load`'s `encoding=`
    /// argument, UTF-8 text by default as in torch.
    pub py2_strings: ckpt_pickle::Py2Strings,
    /// The most bytes one DEFLATE-compressed record may inflate to (torch writes stored records; some
    /// other writers compress them). Default [`DEFAULT_MAX_INFLATED_BYTES`].
    pub max_inflated_bytes: u64,
    /// Take each ZIP record's data offset from torch's layout rule instead of reading every local header
    /// ([`Archive::parse_predicted`](crate::zip::Archive::parse_predicted); `data.pkl`'s header is still checked). For listing a partial copy of a
    /// file, as `ckpt inspect` of an object-store URL fetches it (central directory, `data.pkl` and the
    /// small records, no tensor data): tensors read from such a reader come from where the rule says. Off
    /// by default.
    pub trust_layout: bool,
    /// The hook that makes a partial local copy's bytes present before they are read (a `.pt` on an object
    /// store fetched as it is read: its end records, central directory and every record but the tensors'
    /// `data/<key>` present when it is opened). With one, a ZIP archive is read as with
    /// [`ReadOptions::trust_layout`], every record but `data/` ones is filled and its local header checked
    /// when the file is opened, and each `data/<key>` storage is made on demand: its first read fills the
    /// record's local header and checks it puts the data where torch's layout rule did, and every read
    /// fills the bytes it reads first, so nothing unfilled is handed out. Default `None`: a local file,
    /// whose storages are windows of the map.
    pub fill: Option<Arc<dyn RangeFill>>,
    /// The file's name as [`ReadOptions::fill`] knows it (its path relative to the checkpoint). `None`:
    /// the last component of the path [`TorchReader::open_with`](crate::TorchReader::open_with) opens (empty for a buffer).
    pub fill_file: Option<String>,
    /// How deep inside `torch.storage._load_from_bytes` streams the buffer read is (0: a file).
    pub(crate) nesting: usize,
    /// The reader of the streams nested in this one's pickle, set by the reader's entry point (`None`
    /// before it: the rebuilder then refuses a nested stream).
    pub(crate) nested_read: Option<NestedRead>,
}

/// The default bound on one DEFLATE record's inflated size: 4 GiB.
pub const DEFAULT_MAX_INFLATED_BYTES: u64 = 4 << 30;

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            verify_crc: false,
            limits: ckpt_pickle::Limits::default(),
            py2_strings: ckpt_pickle::Py2Strings::default(),
            max_inflated_bytes: DEFAULT_MAX_INFLATED_BYTES,
            trust_layout: false,
            fill: None,
            fill_file: None,
            nesting: 0,
            nested_read: None,
        }
    }
}

impl ReadOptions {
    /// These options with CRC verification switched on or off.
    #[must_use]
    pub fn with_verify_crc(mut self, verify: bool) -> Self {
        self.verify_crc = verify;
        self
    }

    /// These options with Python 2 strings read as `py2_strings` says (`torch.load(encoding=...)`).
    #[must_use]
    pub fn with_py2_strings(mut self, py2_strings: ckpt_pickle::Py2Strings) -> Self {
        self.py2_strings = py2_strings;
        self
    }

    /// These options with ZIP data offsets taken from torch's layout rule ([`ReadOptions::trust_layout`]).
    #[must_use]
    pub fn with_trust_layout(mut self, trust: bool) -> Self {
        self.trust_layout = trust;
        self
    }

    /// These options with a fill hook ([`ReadOptions::fill`]).
    #[must_use]
    pub fn with_fill(mut self, fill: Option<Arc<dyn RangeFill>>) -> Self {
        self.fill = fill;
        self
    }

    /// These options with the file's name as the fill hook knows it ([`ReadOptions::fill_file`]).
    #[must_use]
    pub fn with_fill_file(mut self, file: Option<String>) -> Self {
        self.fill_file = file;
        self
    }

    /// The pickle machine's options.
    pub(crate) fn pickle(&self) -> ckpt_pickle::Options {
        ckpt_pickle::Options { limits: self.limits, py2_strings: self.py2_strings }
    }

    /// These options with other limits for the pickle decoder.
    #[must_use]
    pub fn with_limits(mut self, limits: ckpt_pickle::Limits) -> Self {
        self.limits = limits;
        self
    }
}
