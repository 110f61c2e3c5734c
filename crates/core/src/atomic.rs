//! Atomic file commits: write to a temporary file beside the target, fsync, rename, fsync the directory.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The temporary path used while `path` is being written: a hidden sibling with the process id, so two
/// processes writing the same target never share a temporary file.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
}

/// Writes `path` atomically: `write` fills a buffered temporary file in the same directory, which is then
/// flushed, fsync'd and renamed over `path`; finally the directory is fsync'd so the rename is durable.
/// On any error the temporary file is removed and `path` is untouched.
///
/// The closure's error type is the caller's own (any `E: From<ckpt_core::Error>`), so format crates pass
/// their errors through unchanged.
///
/// # Errors
/// Whatever `write` returns, or [`Error::Io`] (converted into `E`) naming the path that failed.
pub fn write_atomic<F, E>(path: &Path, write: F) -> std::result::Result<(), E>
where
    F: FnOnce(&mut BufWriter<File>) -> std::result::Result<(), E>,
    E: From<Error>,
{
    let tmp = temp_path(path);
    let result = (|| {
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        write(&mut w)?;
        w.flush().map_err(|e| Error::io(&tmp, e))?;
        let file = w.into_inner().map_err(|e| Error::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        Ok(sync_dir(path.parent().unwrap_or(Path::new(".")))?)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Like [`write_atomic`] for writers that insist on a path: `write` creates and fills the temporary path it
/// is given; the file is then fsync'd and renamed over `path`, and the directory fsync'd.
///
/// # Errors
/// Whatever `write` returns, or [`Error::Io`] (converted into `E`) naming the path that failed.
pub fn write_atomic_path<F, E>(path: &Path, write: F) -> std::result::Result<(), E>
where
    F: FnOnce(&Path) -> std::result::Result<(), E>,
    E: From<Error>,
{
    let tmp = temp_path(path);
    let result = (|| {
        write(&tmp)?;
        File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| Error::io(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        Ok(sync_dir(path.parent().unwrap_or(Path::new(".")))?)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// fsyncs a directory so renames and creations inside it are durable.
///
/// # Errors
/// [`Error::Io`] naming the directory.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
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
    }
}
