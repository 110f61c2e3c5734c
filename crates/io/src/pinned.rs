//! [`PinnedDir`]: the reader's side of the directory swap. A reader that opens a checkpoint directory's
//! files one by one, by path, can open the first ones before a [`DirCommit`](crate::DirCommit) swaps a new
//! checkpoint in and the rest after it: a silent mix of two generations. A reader that pins the directory
//! (an open descriptor of it) and opens every file relative to that descriptor (`openat(2)`) sees one
//! generation whole: the one it pinned. If that generation is removed meanwhile (the commit removes the
//! replaced directory), files not opened yet are missing, an error, never a mix; files already open stay
//! readable.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::{Component, Path, PathBuf};

/// An open checkpoint directory whose files are opened relative to it (see the module documentation).
///
/// ```
/// use ckpt_io::PinnedDir;
/// let root = tempfile::tempdir().unwrap();
/// let dst = root.path().join("ck");
/// std::fs::create_dir(&dst).unwrap();
/// std::fs::write(dst.join("a"), b"old").unwrap();
/// let pinned = PinnedDir::open(&dst).unwrap();
/// // A commit swaps a new directory in.
/// std::fs::rename(&dst, root.path().join("old")).unwrap();
/// std::fs::create_dir(&dst).unwrap();
/// std::fs::write(dst.join("a"), b"new").unwrap();
/// assert_eq!(pinned.read("a").unwrap(), b"old");
/// assert!(pinned.is_replaced());
/// ```
#[derive(Debug)]
pub struct PinnedDir {
    path: PathBuf,
    dir: File,
}

impl PinnedDir {
    /// Opens (pins) the directory `path`.
    ///
    /// # Errors
    /// The I/O error of opening it (`ENOTDIR` for something that is not a directory).
    pub fn open(path: &Path) -> io::Result<PinnedDir> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: open(2) on a NUL-terminated path; the descriptor is owned by the File below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let dir = unsafe { File::from_raw_fd(fd) };
        Ok(PinnedDir { path: path.to_path_buf(), dir })
    }

    /// The path the directory was opened by (what errors name).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `relative` (a path inside the directory, without `..` or a leading `/`) for reading, in the
    /// pinned directory.
    ///
    /// # Errors
    /// `InvalidInput` for a path that leaves the directory; the I/O error of opening it.
    pub fn open_file(&self, relative: impl AsRef<Path>) -> io::Result<File> {
        let relative = relative.as_ref();
        let inside = relative.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !inside || relative.as_os_str().is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a path outside the checkpoint directory"));
        }
        let c = CString::new(relative.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: openat(2) relative to our own directory descriptor, NUL-terminated path.
        let fd = unsafe { libc::openat(self.dir.as_raw_fd(), c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Reads the whole file `relative` of the pinned directory.
    ///
    /// # Errors
    /// As [`PinnedDir::open_file`], and read errors.
    pub fn read(&self, relative: impl AsRef<Path>) -> io::Result<Vec<u8>> {
        let mut f = self.open_file(relative)?;
        let mut v = Vec::new();
        io::Read::read_to_end(&mut f, &mut v)?;
        Ok(v)
    }

    /// Whether `relative` is a regular file of the pinned directory, and its length.
    pub fn file_len(&self, relative: impl AsRef<Path>) -> Option<u64> {
        let m = self.open_file(relative).and_then(|f| f.metadata()).ok()?;
        m.is_file().then_some(m.len())
    }

    /// Whether the path no longer names the pinned directory (a commit swapped another one in, or it was
    /// removed).
    pub fn is_replaced(&self) -> bool {
        match (std::fs::metadata(&self.path), self.dir.metadata()) {
            (Ok(now), Ok(pinned)) => now.dev() != pinned.dev() || now.ino() != pinned.ino(),
            _ => true,
        }
    }
}
