//! The advisory lock that keeps two saves from writing the same destination at once.
//!
//! Protocol: the lock is `flock(LOCK_EX | LOCK_NB)` on `.<name>.ckpt-lock` beside the destination. After
//! locking, the holder checks that the path still names the inode it locked (a previous holder unlinks the
//! file before unlocking; a waiter that locked the unlinked inode retries), then records
//! `pid <pid> on <host>` in it. A busy lock is an immediate [`CommitError::Locked`] naming the holder.
//! Released on drop: unlink while still locked, then close. A crashed holder's lock is released by the
//! kernel with its last file descriptor; its file is reused by the next save.
//!
//! `flock` locks are advisory and per open file description; they work across processes on local file
//! systems and, through the lock manager, on NFSv4. Where the file system has no `flock` (`ENOLCK`,
//! `EOPNOTSUPP`), the save goes on unlocked.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{CommitError, at};
use crate::{failpoint, sibling};

/// A held advisory lock on a destination (see the module documentation).
#[derive(Debug)]
pub struct DestinationLock {
    path: PathBuf,
    file: Option<File>,
}

impl DestinationLock {
    /// Locks `destination` (a file or directory path, existing or not) for writing.
    ///
    /// # Errors
    /// [`CommitError::Locked`] when another save holds it; an I/O error on the lock file (the directory
    /// must exist and be writable).
    pub fn acquire(destination: &Path) -> Result<Self, CommitError> {
        let path = sibling(destination, "ckpt-lock")?;
        for _ in 0..64 {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(at(destination))?;
            // SAFETY: flock on an fd we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EWOULDBLOCK) => {
                        let mut holder = String::new();
                        let _ = file.read_to_string(&mut holder);
                        let holder = Some(holder.trim().to_owned()).filter(|h| !h.is_empty());
                        return Err(CommitError::Locked { path: destination.to_path_buf(), holder });
                    }
                    // A file system without flock (some network and FUSE mounts): save unlocked, as
                    // before locks existed, rather than refuse to save.
                    Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS) => {
                        return Ok(DestinationLock { path, file: Some(file) });
                    }
                    _ => return Err(CommitError::from_io(&path, e)),
                }
            }
            // The previous holder may have unlinked the file between our open and our flock.
            let locked = file.metadata().map_err(at(destination))?;
            match fs::symlink_metadata(&path) {
                Ok(now) if now.ino() == locked.ino() && now.dev() == locked.dev() => {}
                _ => continue,
            }
            let holder = format!("pid {} on {}", std::process::id(), hostname());
            let _ = file.set_len(0);
            let _ = file.seek(SeekFrom::Start(0));
            let _ = file.write_all(holder.as_bytes());
            let lock = DestinationLock { path, file: Some(file) };
            failpoint::hit("lock.acquired").map_err(at(&lock.path))?;
            return Ok(lock);
        }
        Err(CommitError::Locked { path: destination.to_path_buf(), holder: None })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DestinationLock {
    fn drop(&mut self) {
        // Unlink while still holding the lock, so a waiter that opened this inode sees it is stale.
        let _ = fs::remove_file(&self.path);
        drop(self.file.take());
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(buf.get(..end).unwrap_or_default()).into_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn second_lock_is_refused_with_the_holder_then_released() {
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join("model.pt");
        let first = DestinationLock::acquire(&dst).unwrap();
        assert!(first.path().ends_with(".model.pt.ckpt-lock"));
        match DestinationLock::acquire(&dst) {
            Err(CommitError::Locked { path, holder }) => {
                assert_eq!(path, dst);
                assert!(holder.unwrap().starts_with(&format!("pid {} on ", std::process::id())));
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(first);
        assert!(!dir.path().join(".model.pt.ckpt-lock").exists(), "the lock file is removed on release");
        let again = DestinationLock::acquire(&dst).unwrap();
        drop(again);
        // A stale lock file from a crashed holder (no flock held) does not block.
        fs::write(dir.path().join(".model.pt.ckpt-lock"), "pid 1 on gone").unwrap();
        drop(DestinationLock::acquire(&dst).unwrap());
    }
}
