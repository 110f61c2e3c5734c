//! [`FileCommit`]: one file written durably and swapped in with a rename.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::durability::Durability;
use crate::error::{CommitError, at};
use crate::lock::DestinationLock;
use crate::writer::DurableWriter;
use crate::{failpoint, release, sibling, sync_dir};

/// Options of a [`FileCommit`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileOptions {
    /// How the bytes are written: `fdatasync` and `O_DIRECT`. A single file carries its format's own
    /// checksums, which the format's writer computes: the commit computes none, whatever
    /// [`Durability::checksums`] says.
    pub durability: Durability,
    /// Take the destination's advisory lock (default `true`).
    pub lock: bool,
    /// Free the replaced file's blocks and page cache on a background thread (default `true`).
    pub release_in_background: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions { durability: Durability::default(), lock: true, release_in_background: true }
    }
}

impl FileOptions {
    /// These options with `durability` (its `sync` and `direct_io`).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// These options with `fdatasync` on or off (off: the file is swapped in atomically but may be lost,
    /// or be empty, after a power failure).
    #[must_use]
    pub fn with_sync(mut self, sync: bool) -> Self {
        self.durability.sync = sync;
        self
    }

    /// These options with `O_DIRECT` allowed or not.
    #[must_use]
    pub fn with_direct_io(mut self, direct: bool) -> Self {
        self.durability.direct_io = direct;
        self
    }

    /// These options with or without the advisory lock.
    #[must_use]
    pub fn with_lock(mut self, lock: bool) -> Self {
        self.lock = lock;
        self
    }
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// A file being written durably: a temporary file beside the destination, renamed over it at
/// [`commit`](FileCommit::commit). Dropped without committing, it removes the temporary file and leaves the
/// destination untouched.
///
/// The protocol, step by step (each step is a [failpoint](crate::failpoint)):
///
/// 1. **Lock** `.<name>.ckpt-lock` (`lock.acquired`; a busy lock is [`CommitError::Locked`]).
/// 2. **Create** `.<name>.ckpt-tmp` with `O_EXCL`, after removing a stale one a crashed save left
///    (`file.create`, `file.created`); it takes the destination's permission bits.
/// 3. **Write** through a [`DurableWriter`] (`file.write` before each 8 MiB handed to the kernel).
/// 4. **`fdatasync`** the temporary file (`file.sync`, `file.synced`).
/// 5. **Open the old destination** (`O_PATH`), so the rename does not free it inline.
/// 6. **Rename** the temporary file over the destination (`file.rename`, `file.renamed`): the commit point.
/// 7. **`fsync` the directory** so the rename is durable (`file.parent_sync`).
/// 8. **Release**: unlock; the old inode's last reference is closed on a background thread, which frees
///    its blocks and page cache off the critical path (`file.done`).
///
/// A crash before step 6 leaves the old file; after it, the new one. Readers opening the destination see
/// one or the other, whole. Without the lock ([`FileOptions::lock`] off) the temporary name carries the
/// process id and a counter, and stale ones are not cleaned.
///
/// ```
/// use std::io::Write;
/// use ckpt_io::{FileCommit, FileOptions};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("weights.bin");
/// let mut commit = FileCommit::create(&path, &FileOptions::default()).unwrap();
/// commit.writer().write_all(b"new bytes").unwrap();
/// commit.commit().unwrap();
/// assert_eq!(std::fs::read(&path).unwrap(), b"new bytes");
/// ```
#[derive(Debug)]
pub struct FileCommit {
    target: PathBuf,
    tmp: PathBuf,
    writer: Option<DurableWriter>,
    options: FileOptions,
    lock: Option<DestinationLock>,
    done: bool,
    /// A URL destination: the lock object held beside it (the writer streams the object itself).
    #[cfg(feature = "remote")]
    remote: Option<crate::storage::remote_commit::RemoteCommit>,
}

impl FileCommit {
    /// Locks `target` and creates its temporary file.
    ///
    /// # Errors
    /// [`CommitError::Locked`]; [`CommitError::PermissionDenied`], [`CommitError::ReadOnly`],
    /// [`CommitError::DiskFull`] or [`CommitError::Io`] creating the temporary file.
    pub fn create(target: &Path, options: &FileOptions) -> Result<FileCommit, CommitError> {
        if let Some(url) = crate::storage::url_of_path(target)? {
            return Self::create_remote(&url, options);
        }
        let lock = if options.lock { Some(DestinationLock::acquire(target)?) } else { None };
        let tmp = if options.lock {
            sibling(target, "ckpt-tmp")?
        } else {
            let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
            sibling(target, &format!("ckpt-tmp.{}.{n}", std::process::id()))?
        };
        failpoint::hit("file.create").map_err(at(&tmp))?;
        if lock.is_some() {
            match fs::remove_file(&tmp) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(CommitError::from_io(&tmp, e)),
            }
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| CommitError::from_io(target, e))?;
        let mut commit = FileCommit {
            target: target.to_path_buf(),
            tmp,
            writer: None,
            options: options.clone(),
            lock,
            done: false,
            #[cfg(feature = "remote")]
            remote: None,
        };
        if let Ok(old) = fs::metadata(target) {
            let _ = file.set_permissions(fs::Permissions::from_mode(old.permissions().mode() & 0o7777));
        }
        commit.writer = Some(DurableWriter::new(file, target.to_path_buf(), options.durability.with_checksums(false)));
        failpoint::hit("file.created").map_err(at(&commit.tmp))?;
        Ok(commit)
    }

    /// [`FileCommit::create`] for an object-store URL: takes the lock object beside it
    /// (`.<name>.ckpt-lock.json`, `If-None-Match`), and streams the object: one put, or a multipart upload
    /// that becomes visible only when completed — the commit point of a single file.
    #[cfg(feature = "remote")]
    fn create_remote(url: &crate::storage::RemoteUrl, options: &FileOptions) -> Result<FileCommit, CommitError> {
        use crate::storage::remote_commit::{RemoteCommit, file_lock_name};
        use crate::storage::{StorageError, StorageOptions, Store};
        let target = PathBuf::from(url.redacted());
        let storage = |source| CommitError::Storage { source };
        let Some((parent, name)) = url.parent() else {
            return Err(storage(StorageError::InvalidUrl {
                url: url.redacted(),
                reason: "a file needs a key under the bucket".into(),
            }));
        };
        let store = Store::open(&parent, &StorageOptions::process_default()).map_err(storage)?;
        let lock = RemoteCommit::begin(&store, &file_lock_name(&name)).map_err(storage)?;
        failpoint::hit("file.create").map_err(at(&target))?;
        let writer = DurableWriter::to_parts(
            Box::new(store.upload(&name)),
            target.clone(),
            options.durability.with_checksums(false),
        );
        Ok(FileCommit {
            tmp: target.clone(),
            target,
            writer: Some(writer),
            options: options.clone(),
            lock: None,
            done: false,
            remote: Some(lock),
        })
    }

    #[cfg(not(feature = "remote"))]
    fn create_remote(url: &crate::storage::RemoteUrl, _: &FileOptions) -> Result<FileCommit, CommitError> {
        Err(CommitError::Refused { path: PathBuf::from(url.redacted()), reason: crate::storage::NO_REMOTE.into() })
    }

    /// The writer of the new contents.
    #[allow(clippy::expect_used)]
    pub fn writer(&mut self) -> &mut DurableWriter {
        // Invariant, not data: `writer` is only taken by `commit`, which consumes the commit.
        self.writer.as_mut().expect("a FileCommit has its writer until it is committed")
    }

    /// The destination.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The temporary file being written; for an object-store destination, its URL (redacted): the writer
    /// streams the object itself and nothing is written locally.
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    /// Finishes the file and swaps it in (steps 4 to 8). Returns the checksum digest of the file when the
    /// writer computed one.
    ///
    /// # Errors
    /// [`CommitError::DiskFull`] and the other classified I/O errors, naming the destination; the
    /// destination is then untouched and the temporary file removed.
    pub fn commit(mut self) -> Result<Option<crate::FileDigest>, CommitError> {
        let writer = self.writer.take().ok_or_else(|| CommitError::Io {
            path: self.target.clone(),
            source: io::Error::other("the commit has no writer"),
        })?;
        let digest = writer.finish().map_err(|e| CommitError::from_io(&self.target, e))?;
        #[cfg(feature = "remote")]
        if let Some(lock) = self.remote.take() {
            // The completed upload was the commit point.
            self.done = true;
            lock.finish(&[], &|_| true, &|_| false).map_err(|source| CommitError::Storage { source })?;
            failpoint::hit("file.done").map_err(at(&self.target))?;
            return Ok(digest);
        }
        let old = if self.options.release_in_background { open_path(&self.target) } else { None };
        failpoint::hit("file.rename").map_err(at(&self.target))?;
        fs::rename(&self.tmp, &self.target).map_err(|e| CommitError::from_io(&self.target, e))?;
        self.done = true;
        failpoint::hit("file.renamed").map_err(at(&self.target))?;
        if self.options.durability.sync {
            failpoint::hit("file.parent_sync").map_err(at(&self.target))?;
            sync_dir(parent_of(&self.target))?;
        }
        drop(self.lock.take());
        if let Some(old) = old {
            release::later(vec![old]);
        }
        failpoint::hit("file.done").map_err(at(&self.target))?;
        Ok(digest)
    }
}

impl Drop for FileCommit {
    fn drop(&mut self) {
        drop(self.writer.take());
        #[cfg(feature = "remote")]
        if self.remote.is_some() {
            // Nothing local: the abandoned upload was aborted with its writer; the lock goes with `remote`.
            return;
        }
        if !self.done {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// The directory holding `path` (`.` for a bare name).
pub(crate) fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// An `O_PATH` reference to `path` itself (not following a final symlink), keeping its inode alive.
pub(crate) fn open_path(path: &Path) -> Option<File> {
    #[cfg(target_os = "linux")]
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    #[cfg(not(target_os = "linux"))]
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    OpenOptions::new().read(true).custom_flags(flags).open(path).ok()
}

/// Writes `target` durably: `write` fills a [`DurableWriter`], then the file is committed
/// ([`FileCommit`]). On any error the destination is untouched and the temporary file removed. When the
/// writer saw an I/O error, that error (classified, e.g. [`CommitError::DiskFull`]) is returned instead
/// of what `write` made of it.
///
/// ```
/// use std::io::Write;
/// use ckpt_io::{self as commit, CommitError, FileOptions};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("a.txt");
/// commit::write_file(&path, &FileOptions::default(), |w| {
///     w.write_all(b"hello").map_err(|e| CommitError::from_io(w.path(), e))
/// })
/// .unwrap();
/// assert_eq!(std::fs::read(&path).unwrap(), b"hello");
/// ```
///
/// # Errors
/// Whatever `write` returns, or the [`CommitError`] of a failed step, converted into `E`.
pub fn write_file<F, E>(target: &Path, options: &FileOptions, write: F) -> Result<Option<crate::FileDigest>, E>
where
    F: FnOnce(&mut DurableWriter) -> Result<(), E>,
    E: From<CommitError>,
{
    let mut commit = FileCommit::create(target, options)?;
    if let Err(e) = write(commit.writer()) {
        if let Some(io) = commit.writer().io_error() {
            return Err(CommitError::from_io(target, io).into());
        }
        return Err(e);
    }
    Ok(commit.commit()?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use std::io::Write;

    use super::*;
    use crate::failpoint::{self, Action, Config};

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn commit_replaces_and_keeps_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pt");
        fs::write(&p, b"old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        let mut c = FileCommit::create(&p, &FileOptions::default()).unwrap();
        assert!(c.temp_path().ends_with(".m.pt.ckpt-tmp"));
        c.writer().write_all(&vec![7u8; crate::CHUNK * 2 + 3]).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"old", "readers see the old file until the commit");
        c.commit().unwrap();
        assert_eq!(fs::read(&p).unwrap().len(), crate::CHUNK * 2 + 3);
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(names(dir.path()), ["m.pt"], "no temporary or lock file is left");
    }

    #[test]
    fn drop_and_errors_leave_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pt");
        fs::write(&p, b"old").unwrap();
        let mut c = FileCommit::create(&p, &FileOptions::default()).unwrap();
        c.writer().write_all(b"partial").unwrap();
        drop(c);
        assert_eq!(fs::read(&p).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["m.pt"]);

        #[derive(Debug)]
        enum Mine {
            Custom,
            Commit(CommitError),
        }
        impl From<CommitError> for Mine {
            fn from(e: CommitError) -> Self {
                Mine::Commit(e)
            }
        }
        let r = write_file(&p, &FileOptions::default(), |_| Err::<(), _>(Mine::Custom));
        assert!(matches!(r, Err(Mine::Custom)));
        let r = write_file(Path::new("/nonexistent/dir/f"), &FileOptions::default(), |_| Ok::<(), Mine>(()));
        assert!(matches!(r, Err(Mine::Commit(CommitError::Io { .. }))), "{r:?}");
        assert_eq!(fs::read(&p).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["m.pt"]);
    }

    #[test]
    fn stale_temporary_file_is_replaced_and_locked_destination_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pt");
        fs::write(dir.path().join(".m.pt.ckpt-tmp"), b"crashed save").unwrap();
        let c = FileCommit::create(&p, &FileOptions::default()).unwrap();
        let second = FileCommit::create(&p, &FileOptions::default());
        assert!(matches!(second, Err(CommitError::Locked { .. })), "{second:?}");
        c.commit().unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"");
        assert_eq!(names(dir.path()), ["m.pt"]);
    }

    #[test]
    fn injected_failure_at_every_step_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.pt");
        for (point, committed) in [
            ("lock.acquired", false),
            ("file.create", false),
            ("file.created", false),
            ("file.write", false),
            ("file.sync", false),
            ("file.synced", false),
            ("file.rename", false),
            ("file.renamed", true),
            ("file.parent_sync", true),
            ("file.done", true),
        ] {
            fs::write(&p, b"old").unwrap();
            failpoint::configure(Some(Config::armed(point, Action::Error)));
            let r = write_file(&p, &FileOptions::default(), |w| {
                w.write_all(&vec![1u8; 3 * crate::CHUNK]).map_err(|e| CommitError::from_io(w.path(), e))
            });
            failpoint::configure(None);
            let e = r.unwrap_err();
            assert!(e.to_string().contains(&format!("injected failure at {point}")), "{point}: {e}");
            let now = fs::read(&p).unwrap();
            if committed {
                assert_eq!(now.len(), 3 * crate::CHUNK, "{point}");
            } else {
                assert_eq!(now, b"old", "{point}");
            }
            assert_eq!(names(dir.path()), ["m.pt"], "{point}: leftovers");
        }
    }
}
