//! The hook through which a reader of a partial local copy of a checkpoint has the bytes it is about to
//! read made present first ([`RangeFill`]): how an object-store checkpoint is read lazily.

use std::ops::Range;

/// Makes byte ranges of a checkpoint's files present in a local copy before they are read.
///
/// A reader given one calls [`RangeFill::fill`] for every byte range it is about to read of a data file,
/// then reads the local file as usual. The local copy of a checkpoint on an object store
/// (`SparseMirror`, feature `remote`) holds sparse files of the objects' sizes: what was never filled reads
/// as zeros, so a reader of such a copy reads nothing it did not fill first, and a failed fill is an
/// error of the read, never zeros.
pub trait RangeFill: Send + Sync + std::fmt::Debug {
    /// Makes the bytes `range` of the checkpoint's file `file` (a name relative to the checkpoint: a data
    /// file's relative path as the checkpoint's metadata gives it) present in the local copy. Bytes
    /// already present are not fetched again. Returns once they can be read.
    ///
    /// # Errors
    /// The transfer's error (kind [`std::io::ErrorKind::UnexpectedEof`] when the object is shorter than
    /// `range`, [`std::io::ErrorKind::NotFound`] for a file the copy does not have).
    fn fill(&self, file: &str, range: Range<u64>) -> std::io::Result<()>;
}
