//! Owned memory for tensor bytes: 64-byte aligned, zero-initialized, and for large sizes fresh pages in
//! transparent huge pages where the kernel allows them.
//!
//! Filling a new buffer of `n` bytes costs the first touch of its pages. Zeroing it first with `resize` (as
//! a `Vec` of an aligned block type must) touches every page twice and takes a page fault every 4 KiB: for a
//! 1 GiB tensor, 262,144 faults, each with the kernel's own zeroing of the page. Large buffers here are
//! asked of the global allocator already zeroed (`calloc`, which maps fresh pages for them and does not
//! write them) and advised for huge pages: nothing is written until the caller writes, in 512 faults per
//! GiB. They stay the global allocator's, so whatever counts or limits heap memory sees them.

use std::alloc::Layout;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::error::{Error, Result};

/// From this size on, owned buffers are zeroed allocations advised for huge pages (one huge page is 2 MiB
/// on x86-64 and arm64 with 4 KiB pages; below it there is nothing to gain).
pub const PAGES_MIN: usize = 2 << 20;

/// 64 bytes with 64-byte alignment: the unit of small owned buffers, so that every owned buffer starts
/// aligned for any element type (and for SIMD).
#[derive(Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C, align(64))]
struct Block([u8; 64]);

enum Memory {
    /// Under [`PAGES_MIN`]: 64-byte blocks.
    Blocks(Vec<Block>),
    /// From [`PAGES_MIN`] on: [`zeroed_vec`] of 63 bytes more than needed, used from its first 64-byte
    /// aligned byte, `start`.
    Pages { bytes: Vec<u8>, start: usize },
}

/// Owned, zero-initialized bytes that start 64-byte aligned; written once, then typically handed to
/// [`Buffer::from_owner`](crate::Buffer::from_owner).
///
/// ```
/// use ckpt_tensor::{AlignedBytes, Buffer};
/// let mut b = AlignedBytes::zeroed(8 << 20).unwrap(); // fresh pages, in huge pages where allowed
/// b.as_mut_bytes()[..4].copy_from_slice(&[1, 2, 3, 4]);
/// assert_eq!(b.as_ptr() as usize % 64, 0);
/// let buffer = Buffer::from_owner(b);
/// assert_eq!(&buffer.as_bytes()[..5], &[1, 2, 3, 4, 0]);
/// ```
pub struct AlignedBytes {
    memory: Memory,
    len: usize,
}

impl AlignedBytes {
    /// `len` zero bytes.
    ///
    /// # Errors
    /// [`Error::AllocationFailed`] if the memory cannot be had.
    pub fn zeroed(len: usize) -> Result<Self> {
        let cannot = || Error::AllocationFailed { bytes: len };
        let memory = if len >= PAGES_MIN {
            let bytes = zeroed_vec(len.checked_add(63).ok_or_else(cannot)?)?;
            let start = bytes.as_ptr().align_offset(64);
            if start > 63 {
                return Err(cannot());
            }
            Memory::Pages { bytes, start }
        } else {
            let mut blocks: Vec<Block> = Vec::new();
            blocks.try_reserve_exact(len.div_ceil(64)).map_err(|_| cannot())?;
            blocks.resize(len.div_ceil(64), Block::new_zeroed());
            Memory::Blocks(blocks)
        };
        Ok(AlignedBytes { memory, len })
    }

    /// An aligned copy of `bytes`.
    ///
    /// # Errors
    /// [`Error::AllocationFailed`] if the memory cannot be had.
    pub fn copy_from(bytes: &[u8]) -> Result<Self> {
        let mut b = Self::zeroed(bytes.len())?;
        b.as_mut_bytes().copy_from_slice(bytes);
        Ok(b)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.memory {
            Memory::Blocks(blocks) => blocks.as_bytes().get(..self.len),
            Memory::Pages { bytes, start } => bytes.get(*start..start + self.len),
        }
        .unwrap_or_default()
    }

    /// The bytes, to write.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        let len = self.len;
        match &mut self.memory {
            Memory::Blocks(blocks) => blocks.as_mut_bytes().get_mut(..len),
            Memory::Pages { bytes, start } => bytes.get_mut(*start..*start + len),
        }
        .unwrap_or_default()
    }

    /// Address of the first byte (64-byte aligned).
    pub fn as_ptr(&self) -> *const u8 {
        self.as_bytes().as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for AlignedBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

/// A zeroed `Vec<u8>` of `len` bytes, for large sizes asked of the allocator already zeroed (`calloc`, which
/// maps fresh pages untouched, where `resize` would write every byte) and advised for huge pages.
///
/// # Errors
/// [`Error::AllocationFailed`] if the memory cannot be had.
pub fn zeroed_vec(len: usize) -> Result<Vec<u8>> {
    if len < PAGES_MIN {
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|_| Error::AllocationFailed { bytes: len })?;
        v.resize(len, 0);
        return Ok(v);
    }
    let layout = Layout::array::<u8>(len).map_err(|_| Error::AllocationFailed { bytes: len })?;
    // SAFETY: the layout's size is at least PAGES_MIN, not zero.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(Error::AllocationFailed { bytes: len });
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[u8; len]` (size `len`, alignment 1),
    // which is what a `Vec<u8>` of capacity `len` frees with, and its `len` bytes are initialized (zero).
    let v = unsafe { Vec::from_raw_parts(ptr, len, len) };
    advise_huge_pages(&v);
    Ok(v)
}

/// Asks for transparent huge pages over the whole pages inside `bytes`. Only advice: where the kernel has
/// them off, or the call fails, pages stay 4 KiB and nothing else changes.
fn advise_huge_pages(bytes: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = (bytes.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (bytes.as_ptr() as usize + bytes.len()) / PAGE * PAGE;
        if end > start {
            // SAFETY: `start..end` lies inside `bytes`, memory this process owns and keeps mapped for the
            // call; MADV_HUGEPAGE changes how later faults are served, never the contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}
