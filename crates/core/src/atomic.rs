//! Atomic file commits, kept for the writers that have not moved to [`crate::commit`] yet: both functions
//! run the [`FileCommit`] protocol (lock, temporary file, `fdatasync`, rename, directory fsync, the old
//! file freed in the background) and report plain I/O errors as [`Error::Io`], the specific ones (disk
//! full, read-only, permission, locked) as [`Error::Commit`].

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::commit::{CommitError, DurableWriter, FileCommit, FileOptions};
use crate::error::{Error, Result};

/// The temporary path a commit of `path` writes: `.<name>.ckpt-tmp` beside it (unique per destination,
/// since the destination's lock admits one writer).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.ckpt-tmp"))
}

/// Writes `path` atomically: `write` fills a [`DurableWriter`] on a temporary file in the same directory,
/// which is then `fdatasync`'d and renamed over `path`; finally the directory is fsync'd so the rename is
/// durable. On any error the temporary file is removed and `path` is untouched.
///
/// The closure's error type is the caller's own (any `E: From<ckpt_core::Error>`), so format crates pass
/// their errors through unchanged.
///
/// # Errors
/// Whatever `write` returns, or the commit's error (converted into `E`) naming the path that failed.
pub fn write_atomic<F, E>(path: &Path, write: F) -> std::result::Result<(), E>
where
    F: FnOnce(&mut DurableWriter) -> std::result::Result<(), E>,
    E: From<Error>,
{
    let mut commit = FileCommit::create(path, &FileOptions::default()).map_err(Error::from)?;
    if let Err(e) = write(commit.writer()) {
        if let Some(io) = commit.writer().io_error() {
            return Err(Error::from(CommitError::from_io(path, io)).into());
        }
        return Err(e);
    }
    commit.commit().map_err(Error::from)?;
    Ok(())
}

/// Like [`write_atomic`] for writers that insist on a path: `write` creates and fills the temporary path it
/// is given (it may replace the file there); the file is then fsync'd and renamed over `path`, and the
/// directory fsync'd.
///
/// # Errors
/// Whatever `write` returns, or the commit's error (converted into `E`) naming the path that failed.
pub fn write_atomic_path<F, E>(path: &Path, write: F) -> std::result::Result<(), E>
where
    F: FnOnce(&Path) -> std::result::Result<(), E>,
    E: From<Error>,
{
    let commit = FileCommit::create(path, &FileOptions::default().with_sync(false)).map_err(Error::from)?;
    let tmp = commit.temp_path().to_path_buf();
    write(&tmp)?;
    // `write` may have replaced the file at `tmp` (renamed its own temporary file there): sync what the
    // path names now, then let the commit rename and fsync the directory.
    File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| Error::from(CommitError::from_io(path, e)))?;
    commit.commit().map_err(Error::from)?;
    crate::commit::sync_dir(tmp.parent().unwrap_or(Path::new("."))).map_err(Error::from)?;
    Ok(())
}

/// fsyncs a directory so renames and creations inside it are durable.
///
/// # Errors
/// [`Error::Io`] naming the directory.
pub fn sync_dir(dir: &Path) -> Result<()> {
    crate::commit::sync_dir(dir).map_err(Error::from)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::fs;
    use std::io::Write;

    use super::*;

    #[test]
    fn commits_or_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        write_atomic(&p, |w| w.write_all(b"abc").map_err(|e| Error::io("x", e))).unwrap();
        // the caller's own error type passes through unchanged
        #[derive(Debug, PartialEq)]
        enum Mine {
            Custom,
            Core,
        }
        impl From<Error> for Mine {
            fn from(_: Error) -> Self {
                Mine::Core
            }
        }
        assert_eq!(write_atomic(&p, |_| Err(Mine::Custom)), Err(Mine::Custom));
        assert_eq!(write_atomic(Path::new("/nonexistent/dir/f"), |_| Ok::<(), Mine>(())), Err(Mine::Core));
        assert_eq!(fs::read(&p).unwrap(), b"abc");
        let r = write_atomic(&p, |w| {
            w.write_all(b"zzz").unwrap();
            Err(Error::InvalidArgument("boom".into()))
        });
        assert!(r.is_err());
        assert_eq!(fs::read(&p).unwrap(), b"abc");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        write_atomic_path(&p, |tmp| fs::write(tmp, b"via path").map_err(|e| Error::io(tmp, e))).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"via path");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(matches!(
            write_atomic(Path::new("/nonexistent/dir/f"), |_| Ok::<(), Error>(())),
            Err(Error::Io { .. })
        ));
    }
}
