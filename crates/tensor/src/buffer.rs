//! Cheap-to-clone, sliceable bytes: owned and 64-byte aligned, a window of a memory-mapped file, or bytes
//! made on demand ([`Buffer::deferred`]).

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use zerocopy::{FromBytes, Immutable, KnownLayout};

use crate::aligned::{AlignedBytes, zeroed_vec};
use crate::error::{Error, Result};

/// The memory behind a [`Buffer`].
enum Backing {
    /// Owned, 64-byte aligned.
    Owned(AlignedBytes),
    /// A read-only memory map of a file.
    Mapped(memmap2::Mmap),
    /// Any other owner of bytes (for example `Vec<u8>` handed over without copying, at its own alignment).
    Shared(Box<dyn AsRef<[u8]> + Send + Sync>),
    /// `len` bytes that `fill` makes when they are needed: kept in `made` once borrowed
    /// ([`Buffer::as_bytes`]), made afresh for each caller of [`Buffer::bytes`] until then.
    Deferred { len: usize, fill: Fill, made: OnceLock<std::result::Result<AlignedBytes, Arc<Error>>> },
}

/// Makes all the bytes of a deferred buffer into the slice it is given.
type WholeFill = dyn Fn(&mut [u8]) -> Result<()> + Send + Sync;
/// Makes the bytes of a deferred buffer from the offset it is given on into the slice it is given.
type RangeFill = dyn Fn(usize, &mut [u8]) -> Result<()> + Send + Sync;

/// What makes the bytes of a deferred buffer.
enum Fill {
    /// All of them at once.
    Whole(Box<WholeFill>),
    /// Any range of them.
    Ranged(Box<RangeFill>),
}

impl Fill {
    fn whole(&self, out: &mut [u8]) -> Result<()> {
        match self {
            Fill::Whole(f) => f(out),
            Fill::Ranged(f) => f(0, out),
        }
    }
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Owned(bytes) => bytes.as_bytes(),
            Backing::Mapped(m) => m,
            Backing::Shared(s) => (**s).as_ref(),
            // A fill that failed leaves no bytes: every view of them is then outside its storage, which
            // `Tensor::data` reports; `Buffer::bytes` reports the fill's own error.
            Backing::Deferred { len, fill, made } => match made.get_or_init(|| make_blocks(*len, fill)) {
                Ok(bytes) => bytes.as_bytes(),
                Err(_) => &[],
            },
        }
    }
}

/// `len` bytes made by `fill` into aligned memory.
fn make_blocks(len: usize, fill: &Fill) -> std::result::Result<AlignedBytes, Arc<Error>> {
    let mut bytes = AlignedBytes::zeroed(len).map_err(Arc::new)?;
    fill.whole(bytes.as_mut_bytes()).map_err(Arc::new)?;
    Ok(bytes)
}

/// Reference-counted bytes with a window: cloning and slicing never copy.
///
/// A `Buffer` is either owned (allocated 64-byte aligned) or a window of a memory-mapped file. Tensors that
/// share a storage share one `Buffer`; [`Buffer::same_storage`] tells whether two buffers are the same window
/// of the same memory.
///
/// ```
/// use ckpt_tensor::Buffer;
/// let b = Buffer::from_vec(vec![1u8, 2, 3, 4]);
/// let s = b.slice(1..3).unwrap();
/// assert_eq!(s.as_bytes(), &[2, 3]);
/// assert!(b.slice(2..9).is_err());
/// ```
#[derive(Clone)]
pub struct Buffer {
    backing: Arc<Backing>,
    start: usize,
    len: usize,
}

impl Buffer {
    /// A zero-filled owned buffer of `len` bytes, 64-byte aligned.
    ///
    /// # Errors
    /// [`Error::AllocationFailed`] if the allocation fails.
    pub fn zeroed(len: usize) -> Result<Self> {
        Ok(Buffer { backing: Arc::new(Backing::Owned(AlignedBytes::zeroed(len)?)), start: 0, len })
    }

    /// An owned, 64-byte aligned copy of `bytes`.
    ///
    /// # Errors
    /// [`Error::AllocationFailed`] if the allocation fails.
    pub fn copy_from(bytes: &[u8]) -> Result<Self> {
        let len = bytes.len();
        Ok(Buffer { backing: Arc::new(Backing::Owned(AlignedBytes::copy_from(bytes)?)), start: 0, len })
    }

    /// Wraps a vector without copying. Its alignment is the allocator's (at least 8 on common platforms when
    /// the vector came from a wider type, 1 in general); typed access checks alignment and
    /// [`Tensor::to_contiguous`](crate::Tensor::to_contiguous) copies into an aligned buffer when needed.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        Buffer { backing: Arc::new(Backing::Shared(Box::new(v))), start: 0, len }
    }

    /// Wraps any owner of bytes without copying.
    pub fn from_owner(owner: impl AsRef<[u8]> + Send + Sync + 'static) -> Self {
        let len = owner.as_ref().len();
        Buffer { backing: Arc::new(Backing::Shared(Box::new(owner))), start: 0, len }
    }

    /// `len` bytes made by `fill` when they are first needed: a gather of several sources, for example, that a
    /// writer streams out without the whole set of them being in memory at once.
    ///
    /// [`Buffer::bytes`] (and through it [`Tensor::data`](crate::Tensor::data) and what writers stream)
    /// makes the bytes for its caller alone and keeps nothing; [`Buffer::as_bytes`], which lends them for as
    /// long as the buffer lives, makes them once and keeps them. `fill` must write every byte of the slice it
    /// is given (which starts zeroed).
    ///
    /// ```
    /// use ckpt_tensor::Buffer;
    /// let b = Buffer::deferred(4, |out: &mut [u8]| {
    ///     out.copy_from_slice(&[1, 2, 3, 4]);
    ///     Ok(())
    /// });
    /// assert!(b.is_deferred());
    /// assert_eq!(&*b.slice(1..3).unwrap().bytes().unwrap(), &[2, 3]); // made for this call only
    /// assert!(b.is_deferred());
    /// assert_eq!(b.as_bytes(), &[1, 2, 3, 4]); // made and kept
    /// assert!(!b.is_deferred());
    /// ```
    pub fn deferred(len: usize, fill: impl Fn(&mut [u8]) -> Result<()> + Send + Sync + 'static) -> Self {
        let backing = Backing::Deferred { len, fill: Fill::Whole(Box::new(fill)), made: OnceLock::new() };
        Buffer { backing: Arc::new(backing), start: 0, len }
    }

    /// Like [`Buffer::deferred`], with a `fill_at(offset, out)` that makes any range: the bytes from
    /// `offset` on, `out.len()` of them. A window ([`Buffer::slice`]) then makes only its own bytes, and
    /// [`Buffer::pieces`] streams the buffer out a piece at a time: a writer holds one piece, not the
    /// whole buffer.
    ///
    /// ```
    /// use ckpt_tensor::Buffer;
    /// let b = Buffer::deferred_ranged(1000, |offset, out: &mut [u8]| {
    ///     for (i, o) in out.iter_mut().enumerate() {
    ///         *o = ((offset + i) % 251) as u8;
    ///     }
    ///     Ok(())
    /// });
    /// assert_eq!(&*b.slice(500..503).unwrap().bytes().unwrap(), &[249, 250, 0]);
    /// let mut streamed = Vec::new();
    /// b.pieces(64, |piece| {
    ///     assert!(piece.len() <= 64);
    ///     streamed.extend_from_slice(piece);
    ///     Ok::<(), ckpt_tensor::Error>(())
    /// })
    /// .unwrap();
    /// assert_eq!(streamed, b.bytes().unwrap().into_owned());
    /// assert!(b.is_deferred());
    /// ```
    pub fn deferred_ranged(
        len: usize,
        fill_at: impl Fn(usize, &mut [u8]) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        let backing = Backing::Deferred { len, fill: Fill::Ranged(Box::new(fill_at)), made: OnceLock::new() };
        Buffer { backing: Arc::new(backing), start: 0, len }
    }

    /// The buffers `parts` one after another, made on demand ([`Buffer::deferred_ranged`]): a range asked for
    /// makes only the ranges of the parts it covers (of a deferred part, only that range), one part at a time,
    /// so a writer streaming the result holds one piece, never the whole.
    ///
    /// ```
    /// use ckpt_tensor::Buffer;
    /// let b = Buffer::concat(vec![Buffer::from_vec(vec![1, 2]), Buffer::from_vec(vec![3, 4, 5])]);
    /// assert_eq!(b.len(), 5);
    /// assert_eq!(&*b.slice(1..4).unwrap().bytes().unwrap(), &[2, 3, 4]);
    /// assert!(b.is_deferred());
    /// ```
    pub fn concat(parts: Vec<Buffer>) -> Self {
        let total = parts.iter().map(Buffer::len).sum();
        // Where each part starts, for a binary search of the first part a range touches.
        let starts: Vec<usize> = parts
            .iter()
            .scan(0usize, |at, p| {
                let s = *at;
                *at += p.len();
                Some(s)
            })
            .collect();
        Buffer::deferred_ranged(total, move |offset, out: &mut [u8]| {
            let end = offset.checked_add(out.len()).filter(|&e| e <= total).ok_or(Error::ByteRangeOutOfRange {
                offset,
                len: out.len(),
                total,
            })?;
            let first = starts.partition_point(|&s| s <= offset).saturating_sub(1);
            for (part, &at) in parts.iter().zip(&starts).skip(first) {
                if at >= end {
                    break;
                }
                let (lo, hi) = (offset.max(at), end.min(at + part.len()));
                if lo < hi {
                    let src = part.slice(lo - at..hi - at)?;
                    if let Some(dst) = out.get_mut(lo - offset..hi - offset) {
                        dst.copy_from_slice(&src.bytes()?);
                    }
                }
            }
            Ok(())
        })
    }

    /// Hands the bytes of this window to `f` in order: in pieces of at most `piece` bytes made one at a time
    /// (into one reused allocation) for a range-made deferred buffer not kept yet
    /// ([`Buffer::deferred_ranged`]), at once otherwise (as [`Buffer::bytes`] gives them).
    ///
    /// # Errors
    /// The first error of `f`, or of making the bytes.
    pub fn pieces<E: From<Error>>(
        &self,
        piece: usize,
        mut f: impl FnMut(&[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let Backing::Deferred { fill: Fill::Ranged(fill_at), made, .. } = &*self.backing else {
            return f(&self.bytes()?);
        };
        if made.get().is_some() {
            return f(&self.bytes()?);
        }
        let piece = piece.clamp(1, self.len.max(1));
        let mut v = Vec::new();
        v.try_reserve_exact(piece).map_err(|_| Error::AllocationFailed { bytes: piece })?;
        let mut at = 0;
        while at < self.len {
            let n = piece.min(self.len - at);
            v.clear();
            v.resize(n, 0u8);
            fill_at(self.start + at, &mut v)?;
            f(&v)?;
            at += n;
        }
        Ok(())
    }

    /// Whether the bytes of this buffer are made on demand and have not been kept yet ([`Buffer::deferred`]).
    pub fn is_deferred(&self) -> bool {
        matches!(&*self.backing, Backing::Deferred { made, .. } if made.get().is_none())
    }

    /// The bytes of this window: borrowed, or, for a deferred buffer whose bytes are not kept, made for
    /// this call alone (the whole buffer is made, then cut to the window; only the window for
    /// [`Buffer::deferred_ranged`]) and dropped with the result.
    ///
    /// # Errors
    /// The fill's error (as [`Error::DeferredFill`] once the bytes are kept), or [`Error::AllocationFailed`] if the bytes cannot be allocated.
    pub fn bytes(&self) -> Result<Cow<'_, [u8]>> {
        match &*self.backing {
            Backing::Deferred { fill: Fill::Ranged(fill_at), made, .. } if made.get().is_none() => {
                // Only this window's bytes.
                let mut v = zeroed_vec(self.len)?;
                fill_at(self.start, &mut v)?;
                Ok(Cow::Owned(v))
            }
            Backing::Deferred { len, fill, made } if made.get().is_none() => {
                let mut v = zeroed_vec(*len)?;
                fill.whole(&mut v)?;
                if self.start != 0 || self.len != *len {
                    v.truncate(self.start + self.len);
                    v.drain(..self.start);
                }
                Ok(Cow::Owned(v))
            }
            Backing::Deferred { made, .. } => match made.get() {
                Some(Err(e)) => Err(Error::DeferredFill { source: Arc::clone(e) }),
                _ => Ok(Cow::Borrowed(self.as_bytes())),
            },
            _ => Ok(Cow::Borrowed(self.as_bytes())),
        }
    }

    /// Maps a whole file read-only.
    ///
    /// The map is private and read-only. As with every memory map, the file must not be truncated or
    /// modified by another process while the map (or any buffer sliced from it) is alive.
    ///
    /// # Errors
    /// [`Error::Io`] naming `path`.
    pub fn map_file(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        Self::map(&file, path)
    }

    /// Maps an open file read-only; `path` is used in error messages only.
    ///
    /// # Errors
    /// [`Error::Io`] naming `path`.
    pub fn map(file: &File, path: &Path) -> Result<Self> {
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len == 0 {
            // mmap of an empty file fails on Linux; an empty owned buffer is equivalent.
            return Self::zeroed(0);
        }
        // SAFETY: the map is read-only and private. The file may be modified by another process while mapped;
        // that is the documented contract of this function (as of every memory-mapped reader), and no
        // invariant of this crate depends on the bytes staying the same.
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| Error::io(path, e))?;
        let len = map.len();
        Ok(Buffer { backing: Arc::new(Backing::Mapped(map)), start: 0, len })
    }

    /// For a window of a memory map: drops this process's page-table entries for the whole pages inside
    /// `range` of the window, as a scan that will not come back to them soon can (a reader of a file's
    /// local headers, say). The file's pages stay in the page cache, and a later read maps them again,
    /// with the same bytes: the map is private and read-only, so the process loses nothing. Unmapping
    /// the map costs less after, as there is less to unmap. Other buffers, and a range outside the
    /// window: nothing.
    pub fn forget_mapped_pages(&self, range: Range<usize>) {
        const PAGE: usize = 4096;
        let Backing::Mapped(map) = &*self.backing else { return };
        if range.start > range.end || range.end > self.len {
            return;
        }
        let start = (self.start + range.start).next_multiple_of(PAGE);
        let end = (self.start + range.end) / PAGE * PAGE;
        if end > start {
            // SAFETY: MADV_DONTNEED on a private, read-only file mapping drops page-table entries only:
            // no page of it was ever written, so the next access maps the file's page-cache page again,
            // with the bytes every borrow of the map saw (the file must not change while mapped, the
            // contract of `Buffer::map`). The range lies inside the map. The result is advice; a failure
            // changes nothing.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }

    /// The bytes of this window.
    pub fn as_bytes(&self) -> &[u8] {
        self.backing.bytes().get(self.start..self.start + self.len).unwrap_or_default()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this buffer is a window of a memory-mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(*self.backing, Backing::Mapped(_))
    }

    /// A sub-window, without copying.
    ///
    /// # Errors
    /// [`Error::SliceOutOfRange`] if `range` is not inside this window.
    pub fn slice(&self, range: Range<usize>) -> Result<Self> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::SliceOutOfRange { start: range.start, end: range.end, len: self.len });
        }
        Ok(Buffer { backing: Arc::clone(&self.backing), start: self.start + range.start, len: range.end - range.start })
    }

    /// A sub-window given as offset and length, with overflow checked.
    ///
    /// # Errors
    /// [`Error::SliceOverflow`] or [`Error::SliceOutOfRange`] if the window is not inside this buffer.
    pub fn slice_len(&self, offset: usize, len: usize) -> Result<Self> {
        let end = offset.checked_add(len).ok_or(Error::SliceOverflow { offset, len })?;
        self.slice(offset..end)
    }

    /// Whether `self` and `other` are the same window of the same memory (same storage).
    pub fn same_storage(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.backing, &other.backing) && self.start == other.start && self.len == other.len
    }

    /// Whether `self` and `other` are windows of the same memory (the same map or allocation).
    pub fn same_backing(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.backing, &other.backing)
    }

    /// An identity for the storage: equal for buffers where [`Buffer::same_storage`] holds.
    pub fn storage_id(&self) -> (usize, usize, usize) {
        (Arc::as_ptr(&self.backing) as *const u8 as usize, self.start, self.len)
    }

    /// Offset of this window inside its backing memory (inside the file, for a mapped buffer).
    pub fn offset_in_backing(&self) -> usize {
        self.start
    }

    /// Reinterprets the bytes as a slice of `T` without copying.
    ///
    /// # Errors
    /// [`Error::NotTypedSlice`] if the window is not aligned for `T` or its length is not a multiple of
    /// `size_of::<T>()`.
    pub fn typed<T: FromBytes + Immutable + KnownLayout>(&self) -> Result<&[T]> {
        <[T]>::ref_from_bytes(self.as_bytes()).map_err(|_| Error::NotTypedSlice {
            len: self.len,
            address: self.as_bytes().as_ptr() as usize,
            type_name: std::any::type_name::<T>(),
        })
    }

    /// Copies the bytes into a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match *self.backing {
            Backing::Owned(_) => "owned",
            Backing::Mapped(_) => "mapped",
            Backing::Shared(_) => "shared",
            Backing::Deferred { .. } => "deferred",
        };
        f.debug_struct("Buffer").field("kind", &kind).field("start", &self.start).field("len", &self.len).finish()
    }
}

impl PartialEq for Buffer {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl From<Vec<u8>> for Buffer {
    fn from(v: Vec<u8>) -> Self {
        Buffer::from_vec(v)
    }
}
