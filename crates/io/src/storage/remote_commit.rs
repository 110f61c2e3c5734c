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

use std::path::PathBuf;
use std::sync::Mutex;

use bytes::Bytes;

use super::{ObjectInfo, PutCondition, StorageError, Store};

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

/// A save in progress to one destination prefix: holds its lock object until [`RemoteCommit::finish`] or
/// drop.
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

    /// Step 3 of a save that kept the previous checkpoint's commit points (its files did not collide with
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

    /// Steps 4 and 5: removes the objects of `before` (the destination's listing when the save began)
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
        let before = store.list().unwrap();
        let data = vec![write("__0_0.distcp", "data")];
        assert_eq!(upload_files(&store, &data).unwrap(), 4);
        assert_eq!(&store.read(".metadata", 0..2).unwrap()[..], b"m0", "the previous commit point stands until step 3");
        let points = vec![write(".metadata", "m1")];
        let (written, _) = commit.replace_commit_points(&points, &[".metadata"], &before).unwrap();
        assert_eq!(written, vec![".metadata".to_owned()]);
        let removed = commit.finish(&before, &|n| n == "__0_0.distcp" || n == ".metadata", &owned).unwrap();
        assert_eq!(removed, vec!["old.distcp".to_owned()]);
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
