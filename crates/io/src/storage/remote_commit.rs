//! How a checkpoint commits on an object store, where nothing can be renamed: each format's own commit
//! point is written last, and the destination's lock object refuses a concurrent writer.
//!
//! A save to the prefix `<url>/` (a `DirCommit` or `FileCommit` given the URL as its path; `ckpt_io`'s
//! `dir_remote` drives these steps):
//! 1. takes the lock: `<url>/.ckpt-lock.json` put with `If-None-Match: *` (a second writer gets
//!    [`StorageError::Locked`] naming the holder; a lock whose holder was a process of this host that no
//!    longer runs is taken over with `If-Match` on its entity tag), and lists what the prefix holds;
//! 2. streams every file to its object as the format writes it (a multipart upload, visible only when
//!    completed, whole), each process its own files. The previous checkpoint's commit points stay until
//!    a new file is about to replace one of its objects: then they are deleted first
//!    ([`RemoteCommit::delete_commit_points`]), so that readers find no checkpoint rather than a mix.
//!    Formats whose file names can carry the save's id never replace an object of the previous
//!    checkpoint (DCP's data files `__<rank>_<n>.<save id>.distcp`, named by `.metadata`; PBG's files are
//!    versioned): the previous checkpoint stays whole and loadable until step 3;
//! 3. writes ckpt's checksum manifest and then the format's commit points last, in order, each with
//!    `If-Match` on the entity tag the listing of step 1 gave (another writer's change is refused,
//!    [`StorageError::Conflict`]), or `If-None-Match: *` where there was none
//!    ([`RemoteCommit::replace_commit_points`]):
//!
//!    | format | commit point |
//!    |---|---|
//!    | distcp | `.metadata` |
//!    | Hugging Face shards | `model.safetensors.index.json` |
//!    | RecIS | `index` |
//!    | PyTorch-BigGraph | `checkpoint_version.txt` |
//!    | hfai | `.hfai_meta` markers are its own; ckpt's `ckpt.checksums.json` manifest |
//!    | a single file (`.pt`, `.safetensors`) | the object itself: one put or a completed multipart upload |
//! 4. removes what the destination held that the new checkpoint does not: the files of the previous
//!    checkpoint and those a killed save left (objects the format owns, and ckpt's own `.ckpt-*`
//!    objects); anything else under the prefix is left alone;
//! 5. deletes the lock.
//!
//! A save killed at any step leaves the previous checkpoint whole (when none of its objects was
//! replaced), or no commit point (readers find no checkpoint), or the new checkpoint whole. [`leftovers`]
//! lists what it wrote, for `verify` (objects without a commit point, or that the committed checkpoint's
//! manifest does not name); the next save removes them.
//!
//! [`RemoteCommit::publish`] runs the same steps for a checkpoint already written to a local directory.

use std::path::PathBuf;
use std::sync::Mutex;

use bytes::Bytes;

use super::{ObjectInfo, PutCondition, StorageError, Store};

/// A file to publish: its name under the prefix, and the local file.
type Staged = (String, PathBuf);

/// The lock object's name inside a destination prefix.
pub const LOCK_NAME: &str = ".ckpt-lock.json";

/// The lock object's name beside the single file `name` in its prefix (`.<name>.ckpt-lock.json`).
pub fn file_lock_name(name: &str) -> String {
    format!(".{name}{LOCK_NAME}")
}

/// Whether the object `name` (its last segment) is the lock of a save: [`LOCK_NAME`] or a
/// [`file_lock_name`].
pub fn is_lock(name: &str) -> bool {
    name.rsplit('/').next().is_some_and(|n| n.starts_with('.') && n.ends_with(LOCK_NAME))
}

/// What a published checkpoint moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// The objects written, by name under the prefix, commit points last.
    pub files: Vec<String>,
    /// Bytes uploaded.
    pub bytes: u64,
    /// Objects of a previous checkpoint or of a killed save removed.
    pub removed: Vec<String>,
}

/// A save in progress to one destination prefix: holds its lock object until [`RemoteCommit::publish`]
/// or drop.
#[derive(Debug)]
pub struct RemoteCommit {
    store: Store,
    lock: String,
    held: bool,
}

/// `pid <pid> on <host>`, and the parts.
fn holder() -> (u32, String) {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    (std::process::id(), host)
}

/// Whether the process `pid` of this host still runs.
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: kill with signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl RemoteCommit {
    /// Takes the lock of the destination `store` (a prefix), with `lock` as the lock object's name
    /// ([`LOCK_NAME`] for a directory; [`file_lock_name`] beside a single file).
    ///
    /// # Errors
    /// [`StorageError::Locked`] while another save holds it; the classified store error.
    pub fn begin(store: &Store, lock: &str) -> Result<RemoteCommit, StorageError> {
        let (pid, host) = holder();
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let body = serde_json::json!({ "pid": pid, "host": host, "started": started }).to_string();
        let take = |condition| store.put(lock, Bytes::from(body.clone()), condition);
        match take(PutCondition::Create) {
            Ok(_) => return Ok(RemoteCommit { store: store.clone(), lock: lock.to_owned(), held: true }),
            Err(StorageError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
        // Held: by a live writer, or left by a killed one of this host.
        let info = store.head(lock)?;
        let text = match &info {
            Some(i) => {
                store.read(lock, 0..i.size).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
            }
            None => String::new(),
        };
        let recorded: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let their_pid = recorded.get("pid").and_then(serde_json::Value::as_u64).and_then(|p| u32::try_from(p).ok());
        let their_host = recorded.get("host").and_then(serde_json::Value::as_str).unwrap_or("?").to_owned();
        let dead_here = their_host == host && their_pid.is_some_and(|p| p != pid && !alive(p));
        if let (true, Some(etag)) = (dead_here, info.and_then(|i| i.etag)) {
            take(PutCondition::Update(etag))?;
            return Ok(RemoteCommit { store: store.clone(), lock: lock.to_owned(), held: true });
        }
        if text.is_empty() {
            // Released between our put and our read: try once more.
            if take(PutCondition::Create).is_ok() {
                return Ok(RemoteCommit { store: store.clone(), lock: lock.to_owned(), held: true });
            }
        }
        Err(StorageError::Locked {
            url: store.url().redacted(),
            holder: format!("pid {} on {their_host}", their_pid.map_or("?".to_owned(), |p| p.to_string())),
            lock: store.url_of(lock),
        })
    }

    /// The destination.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Publishes a checkpoint: `files` (name under the prefix, local file) uploaded in parallel, then
    /// `commit_points` (names among `files`) in order, with `If-None-Match: *`; then the objects the
    /// destination held before that `owned` claims (or that are ckpt's own `.ckpt-*`) and the new
    /// checkpoint lacks are removed, and the lock released. The module documentation has the steps.
    ///
    /// # Errors
    /// The first failure; the lock is released, the commit points were not written, and the next save
    /// removes what this one uploaded.
    pub fn publish(
        self,
        files: &[(String, PathBuf)],
        commit_points: &[&str],
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<PublishReport, StorageError> {
        let before = self.clear_commit_points(commit_points)?;
        let (last, first): (Vec<Staged>, Vec<Staged>) =
            files.iter().cloned().partition(|(n, _)| commit_points.contains(&n.as_str()));
        let mut report = PublishReport {
            bytes: self.upload_files(&first)?,
            files: first.iter().map(|(n, _)| n.clone()).collect(),
            removed: Vec::new(),
        };
        let (points, bytes) = self.put_commit_points(&last, commit_points)?;
        report.files.extend(points);
        report.bytes += bytes;
        report.removed = self.finish(&before, &|n| files.iter().any(|(f, _)| f == n), owned)?;
        Ok(report)
    }

    /// Step 2: deletes the previous checkpoint's commit points (readers then find no checkpoint rather than
    /// a mix). Returns what the destination held before, for [`RemoteCommit::finish`].
    ///
    /// # Errors
    /// The classified store error.
    pub fn clear_commit_points(&self, commit_points: &[&str]) -> Result<Vec<ObjectInfo>, StorageError> {
        let before = self.store.list()?;
        for point in commit_points {
            if before.iter().any(|o| o.name == *point) {
                self.store.delete(point)?;
            }
        }
        Ok(before)
    }

    /// Step 4: writes the commit points among `files` in the order of `commit_points`, each with
    /// `If-None-Match: *`. Returns their names and bytes.
    ///
    /// # Errors
    /// [`StorageError::Conflict`] when a concurrent writer wrote one; [`StorageError::Local`]; the
    /// classified store error.
    pub fn put_commit_points(
        &self,
        files: &[(String, PathBuf)],
        commit_points: &[&str],
    ) -> Result<(Vec<String>, u64), StorageError> {
        let (mut names, mut bytes) = (Vec::new(), 0);
        for point in commit_points {
            let Some((name, path)) = files.iter().find(|(n, _)| n == point) else { continue };
            let data = std::fs::read(path).map_err(|source| StorageError::Local { path: path.clone(), source })?;
            bytes += data.len() as u64;
            self.store.put(name, Bytes::from(data), PutCondition::Create)?;
            names.push(name.clone());
        }
        Ok((names, bytes))
    }

    /// Step 4 of a save that kept the previous checkpoint's commit points (its files did not collide with
    /// the new one's): writes the commit points among `files` in the order of `commit_points`, each
    /// replacing the previous one only if it is still the one `before` listed (`If-Match` on its entity
    /// tag), or created with `If-None-Match: *` where there was none (or a collision removed it). Readers
    /// see the previous checkpoint until then, the new one after. Returns their names and bytes.
    ///
    /// # Errors
    /// [`StorageError::Conflict`] when another writer changed a commit point meanwhile;
    /// [`StorageError::Local`]; the classified store error.
    pub fn replace_commit_points(
        &self,
        files: &[(String, PathBuf)],
        commit_points: &[&str],
        before: &[ObjectInfo],
    ) -> Result<(Vec<String>, u64), StorageError> {
        let (mut names, mut bytes) = (Vec::new(), 0);
        for point in commit_points {
            let Some((name, path)) = files.iter().find(|(n, _)| n == point) else { continue };
            let expected = before.iter().find(|o| o.name == *name).and_then(|o| o.etag.clone());
            let condition = match (self.store.head(name)?, expected) {
                (None, _) => PutCondition::Create,
                (Some(now), Some(tag)) if now.etag.as_ref() == Some(&tag) => PutCondition::Update(tag),
                // A store without entity tags: the lock object is the only guard.
                (Some(now), None) if now.etag.is_none() => PutCondition::Overwrite,
                (Some(_), _) => return Err(StorageError::Conflict { url: self.store.url_of(name) }),
            };
            let data = std::fs::read(path).map_err(|source| StorageError::Local { path: path.clone(), source })?;
            bytes += data.len() as u64;
            self.store.put(name, Bytes::from(data), condition)?;
            self.store.count_completed();
            names.push(name.clone());
        }
        Ok((names, bytes))
    }

    /// Step 2 deferred: deletes the previous checkpoint's commit points only now, when a new file is about
    /// to replace one of its objects (readers then find no checkpoint rather than a mix).
    ///
    /// # Errors
    /// The classified store error.
    pub fn delete_commit_points(store: &Store, commit_points: &[&str]) -> Result<(), StorageError> {
        for point in commit_points {
            store.delete(point)?;
        }
        Ok(())
    }

    /// Steps 5 and 6: removes the objects of `before` (the listing of [`RemoteCommit::clear_commit_points`])
    /// that the new checkpoint has not `written` and that `owned` claims (or that are ckpt's own
    /// `.ckpt-*`), and releases the lock. Returns the names removed.
    ///
    /// # Errors
    /// The classified store error.
    pub fn finish(
        mut self,
        before: &[ObjectInfo],
        written: &dyn Fn(&str) -> bool,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<String>, StorageError> {
        let mut removed = Vec::new();
        for old in before {
            let ours = old.name.rsplit('/').next().is_some_and(|n| n.starts_with(".ckpt-"));
            if old.name != self.lock && !written(&old.name) && (ours || owned(&old.name)) {
                self.store.delete(&old.name)?;
                removed.push(old.name.clone());
            }
        }
        self.release()?;
        Ok(removed)
    }

    /// Uploads one file as the object this commit's destination names (a single-file destination: the
    /// store is the parent prefix and `name` the file), then releases the lock.
    ///
    /// # Errors
    /// The classified store error; nothing becomes visible unless the upload completed.
    pub fn publish_file(mut self, name: &str, path: &std::path::Path) -> Result<PublishReport, StorageError> {
        let bytes = self.store.upload_file(name, path)?;
        self.release()?;
        Ok(PublishReport { files: vec![name.to_owned()], bytes, removed: Vec::new() })
    }

    /// Step 3 for files staged on the local disk ([`upload_files`]).
    ///
    /// # Errors
    /// The first failure.
    pub fn upload_files(&self, files: &[(String, PathBuf)]) -> Result<u64, StorageError> {
        upload_files(&self.store, files)
    }

    fn release(&mut self) -> Result<(), StorageError> {
        if self.held {
            self.held = false;
            self.store.delete(&self.lock)?;
        }
        Ok(())
    }
}

impl Drop for RemoteCommit {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// Uploads files staged on the local disk (name under `store`'s prefix, local file) in parallel: four at a
/// time, their parts sharing the store's concurrency, so memory stays within `concurrency × part_size`.
/// Returns the bytes sent.
///
/// # Errors
/// The first failure.
pub fn upload_files(store: &Store, files: &[(String, PathBuf)]) -> Result<u64, StorageError> {
    let options = store.options();
    let workers = files.len().clamp(1, 4);
    // Each worker's parts share the store's concurrency, so memory stays within concurrency × part size.
    let per_file = options.clone().with_concurrency(options.concurrency / workers);
    let store = store.with_options(&per_file);
    let next = Mutex::new(files.iter());
    let total = Mutex::new(Ok::<u64, StorageError>(0));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let item = match next.lock() {
                        Ok(mut it) => it.next(),
                        Err(_) => None,
                    };
                    let Some((name, path)) = item else { break };
                    if total.lock().map(|t| t.is_err()).unwrap_or(true) {
                        break;
                    }
                    let sent = store.upload_file(name, path);
                    if let Ok(mut t) = total.lock() {
                        match (sent, t.as_mut()) {
                            (Ok(n), Ok(sum)) => *sum += n,
                            (Err(e), Ok(_)) => *t = Err(e),
                            (_, Err(_)) => {}
                        }
                    }
                }
            });
        }
    });
    total.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// What an unfinished save left under a destination prefix: its lock object, and — when none of
/// `commit_points` exists — every object `owned` claims; when the checkpoint is committed and has ckpt's
/// checksum manifest (which lists every file of it), the objects `owned` claims that the manifest does not
/// list (a later save that died before its commit, having left the previous checkpoint whole). Empty for
/// a committed checkpoint whose save finished.
///
/// # Errors
/// The classified store error of the listing or of reading the manifest.
pub fn leftovers(
    store: &Store,
    commit_points: &[&str],
    owned: &dyn Fn(&str) -> bool,
) -> Result<Vec<ObjectInfo>, StorageError> {
    let listed = store.list()?;
    let committed = commit_points.iter().any(|p| listed.iter().any(|o| o.name == *p));
    let manifest = match listed.iter().find(|o| o.name == crate::MANIFEST_NAME) {
        Some(m) if committed => crate::Manifest::from_json(&store.read(&m.name, 0..m.size)?).ok(),
        _ => None,
    };
    let stray = |name: &str| {
        manifest.as_ref().is_some_and(|m| {
            owned(name) && name != crate::MANIFEST_NAME && !commit_points.contains(&name) && !m.files.contains_key(name)
        })
    };
    Ok(listed.into_iter().filter(|o| is_lock(&o.name) || (!committed && owned(&o.name)) || stray(&o.name)).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::super::{Location, StorageOptions};
    use super::*;
    use std::sync::Arc;

    fn memory() -> Store {
        let Location::Remote(url) = Location::parse("memory://t/dst").unwrap() else { panic!() };
        Store::from_parts(
            Arc::new(object_store::memory::InMemory::new()),
            object_store::path::Path::from("dst"),
            url,
            &StorageOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn commit_points_last_old_files_removed_lock_refuses() {
        let store = memory();
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, body: &str| {
            let p = dir.path().join(name.replace('/', "_"));
            std::fs::write(&p, body).unwrap();
            (name.to_owned(), p)
        };
        store.put("old.distcp", Bytes::from_static(b"old"), PutCondition::Overwrite).unwrap();
        store.put("notes.txt", Bytes::from_static(b"mine"), PutCondition::Overwrite).unwrap();
        store.put(".metadata", Bytes::from_static(b"m0"), PutCondition::Overwrite).unwrap();
        let owned = |n: &str| n.ends_with(".distcp") || n == ".metadata";

        let commit = RemoteCommit::begin(&store, LOCK_NAME).unwrap();
        assert!(matches!(RemoteCommit::begin(&store, LOCK_NAME), Err(StorageError::Locked { .. })));
        let files = vec![write("__0_0.distcp", "data"), write(".metadata", "m1")];
        let report = commit.publish(&files, &[".metadata"], &owned).unwrap();
        assert_eq!(report.files, vec!["__0_0.distcp".to_owned(), ".metadata".to_owned()]);
        assert_eq!(report.removed, vec!["old.distcp".to_owned()]);
        let names: Vec<String> = store.list().unwrap().into_iter().map(|o| o.name).collect();
        assert_eq!(names, vec![".metadata", "__0_0.distcp", "notes.txt"]);
        assert_eq!(&store.read(".metadata", 0..2).unwrap()[..], b"m1");
        assert!(leftovers(&store, &[".metadata"], &owned).unwrap().is_empty());
        assert!(is_lock(LOCK_NAME) && is_lock("runs/.ckpt-lock.json") && is_lock(&file_lock_name("m.pt")));
        assert!(!is_lock("__0_0.distcp") && !is_lock(".metadata"));
    }

    #[test]
    fn a_dead_holder_of_this_host_is_taken_over() {
        let store = memory();
        let (_, host) = holder();
        // A pid that cannot run: above the kernel's maximum.
        let body = serde_json::json!({ "pid": 4_194_304 + 7, "host": host, "started": 0 }).to_string();
        store.put(LOCK_NAME, Bytes::from(body), PutCondition::Create).unwrap();
        store.put("__0_0.distcp", Bytes::from_static(b"half"), PutCondition::Overwrite).unwrap();
        let owned = |n: &str| n.ends_with(".distcp");
        let left = leftovers(&store, &[".metadata"], &owned).unwrap();
        assert_eq!(left.len(), 2);
        let commit = RemoteCommit::begin(&store, LOCK_NAME).unwrap();
        drop(commit);
        assert!(store.head(LOCK_NAME).unwrap().is_none());
        let other = serde_json::json!({ "pid": 1, "host": "elsewhere", "started": 0 }).to_string();
        store.put(LOCK_NAME, Bytes::from(other), PutCondition::Create).unwrap();
        let e = RemoteCommit::begin(&store, LOCK_NAME).unwrap_err();
        assert!(e.to_string().contains("pid 1 on elsewhere"), "{e}");
    }
}
