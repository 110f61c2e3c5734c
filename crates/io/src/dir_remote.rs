//! A [`DirCommit`](crate::DirCommit) whose destination is an object-store URL: files stream straight to
//! their objects, the format's commit points are written last ([`remote_commit`]'s protocol).
//!
//! Files a format creates with [`DirCommit::create_file`](crate::DirCommit::create_file) are multipart
//! uploads to their final names, written as the format produces them (no local copy). Files written by
//! path into [`DirCommit::staging`](crate::DirCommit::staging) (libhdf5's, a format that reads its files
//! back before committing) and the commit points (small: DCP's `.metadata`, an index) are kept in a
//! private local directory of each rank and uploaded at the commit: a rank's own files before it reports,
//! the commit points by rank 0 last, each with `If-None-Match: *`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::checksum::MANIFEST_NAME;
use crate::durability::Durability;
use crate::error::CommitError;
use crate::storage::remote_commit::{self, LOCK_NAME, RemoteCommit};
use crate::storage::{ObjectInfo, RemoteUrl, StorageOptions, Store};
use crate::writer::DurableWriter;

/// The object-store side of a [`DirCommit`](crate::DirCommit).
#[derive(Debug)]
pub(crate) struct RemoteDir {
    store: Store,
    commit_points: &'static [&'static str],
    /// Rank 0: the lock held.
    held: Mutex<Option<RemoteCommit>>,
    /// What the destination held when the save began.
    before: Vec<ObjectInfo>,
    /// Whether this rank deleted the previous checkpoint's commit points (a new file replaced one of its
    /// objects).
    cleared: AtomicBool,
    /// Names this rank wrote (streamed or uploaded).
    written: Mutex<BTreeSet<String>>,
    /// The save's name, the same on every rank ([`RemoteDir::save_id`]).
    save_id: String,
}

/// A new save id: 12 hex digits from the clock, the process and a counter, hashed.
pub(crate) fn new_save_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    h.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

fn storage(e: crate::storage::StorageError) -> CommitError {
    CommitError::Storage { source: e }
}

impl RemoteDir {
    /// Opens the store of `url` and lists what it holds; on rank 0 (`root`), takes the lock first.
    /// `save_id` names the save (rank 0 chooses it, every rank gets it).
    pub(crate) fn begin(
        url: &RemoteUrl,
        root: bool,
        commit_points: &'static [&'static str],
        save_id: String,
    ) -> Result<RemoteDir, CommitError> {
        let store = Store::open(url, &StorageOptions::process_default()).map_err(storage)?;
        let held = if root { Some(RemoteCommit::begin(&store, LOCK_NAME).map_err(storage)?) } else { None };
        let mut before = store.list().map_err(storage)?;
        if root {
            // Some servers list no entity tags: the commit points' are asked for, to replace them with
            // `If-Match` at the commit.
            let last: Vec<&str> = std::iter::once(MANIFEST_NAME).chain(commit_points.iter().copied()).collect();
            for o in before.iter_mut().filter(|o| o.etag.is_none() && last.contains(&o.name.as_str())) {
                o.etag = store.head(&o.name).map_err(storage)?.and_then(|h| h.etag);
            }
        }
        Ok(RemoteDir {
            store,
            commit_points,
            held: Mutex::new(held),
            before,
            cleared: AtomicBool::new(false),
            written: Mutex::new(BTreeSet::new()),
            save_id,
        })
    }

    /// A name for this save, unique at its destination and the same on every rank: formats whose file
    /// names it can enter (DCP's data files, named by `.metadata`) never replace an object of the previous
    /// checkpoint, which then stays whole and loadable until the new commit point replaces its own.
    pub(crate) fn save_id(&self) -> &str {
        &self.save_id
    }

    /// Whether the destination held an object named `name` when the save began.
    pub(crate) fn held_before(&self, name: &str) -> bool {
        self.before.iter().any(|o| o.name == name)
    }

    /// Before `name` is written: if the previous checkpoint has an object of that name, its commit points
    /// are deleted first (once), so that no reader ever sees its commit point over a replaced file.
    fn replacing(&self, name: &str) -> Result<(), CommitError> {
        if self.cleared.load(Ordering::Acquire) || !self.held_before(name) {
            return Ok(());
        }
        RemoteCommit::delete_commit_points(&self.store, self.commit_points).map_err(storage)?;
        self.cleared.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether `name` is written last, from the local staging directory: the format's commit points, and
    /// ckpt's checksum manifest before them (it describes the new checkpoint's files, so it must not
    /// replace the previous one's before the new checkpoint commits).
    pub(crate) fn is_commit_point(&self, name: &str) -> bool {
        name == MANIFEST_NAME || self.commit_points.contains(&name)
    }

    /// The objects written last, in order: the manifest, then the format's commit points.
    fn last_written(&self) -> Vec<&'static str> {
        let mut order = vec![MANIFEST_NAME];
        order.extend(self.commit_points.iter().copied().filter(|p| *p != MANIFEST_NAME));
        order
    }

    /// A writer streaming the object `name` (`path` names it in errors).
    pub(crate) fn create(&self, name: &str, path: &Path, durability: Durability) -> Result<DurableWriter, CommitError> {
        let fresh = self.written.lock().map(|mut w| w.insert(name.to_owned())).unwrap_or(false);
        if !fresh {
            return Err(CommitError::Refused { path: path.to_path_buf(), reason: "written twice in one save".into() });
        }
        self.replacing(name)?;
        Ok(DurableWriter::to_parts(Box::new(self.store.upload(name)), path.to_path_buf(), durability))
    }

    /// The names this rank wrote.
    pub(crate) fn names(&self) -> Vec<String> {
        self.written.lock().map(|w| w.iter().cloned().collect()).unwrap_or_default()
    }

    /// The regular files of the local `staging` directory but the commit points and ckpt's markers.
    fn staged(&self, staging: &Path, points: bool) -> Result<Vec<(String, PathBuf)>, CommitError> {
        let mut out = Vec::new();
        let at = |e| CommitError::from_io(staging, e);
        for entry in std::fs::read_dir(staging).map_err(at)? {
            let entry = entry.map_err(at)?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
            if crate::unfinished::is_marker(&name) {
                continue;
            }
            if entry.file_type().map_err(at)?.is_file() && self.is_commit_point(&name) == points {
                out.push((name, entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Uploads the files written by path into `staging` that are not commit points and were not uploaded
    /// yet. Their local copies stay until the commit ends (a format may read them back in its final step).
    pub(crate) fn upload_staged(&self, staging: &Path) -> Result<(), CommitError> {
        let done = self.names();
        let files: Vec<(String, PathBuf)> =
            self.staged(staging, false)?.into_iter().filter(|(n, _)| !done.contains(n)).collect();
        for (name, _) in &files {
            self.replacing(name)?;
        }
        remote_commit::upload_files(&self.store, &files).map_err(storage)?;
        if let Ok(mut w) = self.written.lock() {
            w.extend(files.into_iter().map(|(n, _)| n));
        }
        Ok(())
    }

    /// Rank 0's commit: uploads what `staging` still holds, then the commit points in order, removes what
    /// the previous checkpoint had that the new one (`names`, every rank's) lacks, releases the lock.
    pub(crate) fn commit(
        &self,
        staging: &Path,
        mut names: BTreeSet<String>,
        owned: Option<fn(&str) -> bool>,
    ) -> Result<(), CommitError> {
        self.upload_staged(staging)?;
        names.extend(self.names());
        let points = self.staged(staging, true)?;
        let Some(commit) = self.held.lock().ok().and_then(|mut h| h.take()) else {
            return Err(CommitError::Refused {
                path: PathBuf::from(self.store.url().redacted()),
                reason: "committed twice".into(),
            });
        };
        commit.replace_commit_points(&points, &self.last_written(), &self.before).map_err(storage)?;
        names.extend(points.into_iter().map(|(n, _)| n));
        let owned = |n: &str| owned.is_none_or(|o| o(n));
        commit.finish(&self.before, &|n| names.contains(n), &owned).map_err(storage)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use std::io::Write;
    use std::sync::Arc;

    use bytes::Bytes;
    use ckpt_collective::{Collective, SingleProcess, ThreadGroup};
    use object_store::memory::InMemory;

    use crate::storage::{BuiltStore, Location, ObjectLayout, PutCondition, StorageOptions, Store, registry};
    use crate::{CommitError, DirCommit, DirOptions};

    const LAYOUT: ObjectLayout = ObjectLayout {
        format: "test",
        owned: |n: &str| n.ends_with(".distcp") || n == ".metadata" || n == "by_path.bin",
        commit_points: &[".metadata"],
    };

    /// An in-memory store served for `<scheme>://…` URLs, and a handle on `<scheme>://b/ckpt`.
    fn memory(scheme: &str) -> Store {
        let mem = Arc::new(InMemory::new());
        let served = Arc::clone(&mem);
        let prefix = format!("{scheme}://");
        registry().register(
            scheme,
            Arc::new(move |url, _| {
                let root = url.as_given().trim_start_matches(&prefix).trim_matches('/').to_owned();
                Ok(BuiltStore { store: served.clone(), multipart: Some(served.clone()), root: root.as_str().into() })
            }),
        );
        let Location::Remote(url) = Location::parse(&format!("{scheme}://b/ckpt")).unwrap() else { panic!() };
        Store::open(&url, &StorageOptions::default()).unwrap()
    }

    fn names(store: &Store) -> Vec<String> {
        store.list().unwrap().into_iter().map(|o| o.name).collect()
    }

    #[test]
    fn files_stream_to_their_objects_and_the_commit_point_goes_last() {
        let store = memory("memtest-a");
        store.put("old.distcp", Bytes::from_static(b"old"), PutCondition::Overwrite).unwrap();
        store.put(".metadata", Bytes::from_static(b"m0"), PutCondition::Overwrite).unwrap();
        store.put("notes.txt", Bytes::from_static(b"mine"), PutCondition::Overwrite).unwrap();
        let dst = std::path::Path::new("memtest-a://b/ckpt");
        let commit = DirCommit::begin(dst, &SingleProcess, &DirOptions::default().with_layout(LAYOUT)).unwrap();
        assert!(commit.is_remote() && commit.save_id().is_some_and(|id| id.len() == 12));
        assert!(store.head(".ckpt-lock.json").unwrap().is_some(), "the lock object is held");
        // What the destination held at the start: a format names its files around them.
        assert!(commit.replaces("old.distcp") && commit.replaces(".metadata") && !commit.replaces("new.distcp"));
        let mut f = commit.create_file("new.distcp").unwrap();
        f.writer().write_all(b"x").unwrap();
        f.finish().unwrap();
        assert_eq!(&store.read(".metadata", 0..2).unwrap()[..], b"m0", "no collision: the old checkpoint stands");
        assert_eq!(&store.read("old.distcp", 0..3).unwrap()[..], b"old");
        store.put("__0_0.distcp", Bytes::from_static(b"previous"), PutCondition::Overwrite).unwrap();
        // (The listing at the save's start did not have it: no collision either.)
        assert!(!commit.replaces("__0_0.distcp") && !commit.replaces("new.distcp"));

        // 20 MiB: a multipart upload of two 16 MiB parts, none of it on the local disk.
        let data: Vec<u8> = (0..20u32 << 20).map(|i| (i % 251) as u8).collect();
        let mut f = commit.create_file("__0_0.distcp").unwrap();
        for piece in data.chunks(3 << 20) {
            f.writer().write_all(piece).unwrap();
        }
        assert_eq!(f.finish().unwrap(), data.len() as u64);
        assert_eq!(std::fs::read_dir(commit.staging()).unwrap().count(), 0, "no local copy");
        std::fs::write(commit.staging().join("by_path.bin"), b"hdf5").unwrap();
        commit.record_file("by_path.bin").unwrap();
        assert!(matches!(commit.create_file("__0_0.distcp"), Err(CommitError::Refused { .. })));

        let staging = commit.staging().to_path_buf();
        commit
            .commit(&SingleProcess, Ok(()), |c| {
                let mut m = c.create_file(".metadata")?;
                m.writer().write_all(b"m1").unwrap();
                m.finish().map(|_| ())
            })
            .unwrap();
        assert!(!staging.exists(), "the private staging directory is removed");
        assert_eq!(
            names(&store),
            vec![".metadata", "__0_0.distcp", "by_path.bin", "ckpt.checksums.json", "new.distcp", "notes.txt"],
            "old.distcp removed, the lock released, a foreign object kept"
        );
        assert_eq!(&store.read(".metadata", 0..2).unwrap()[..], b"m1");
        assert!(store.read("__0_0.distcp", 0..data.len() as u64).unwrap()[..] == data[..]);
        let manifest = store.read("ckpt.checksums.json", 0..store.head("ckpt.checksums.json").unwrap().unwrap().size);
        let manifest = crate::Manifest::from_json(&manifest.unwrap()).unwrap();
        assert!(manifest.files.contains_key("__0_0.distcp") && manifest.files.contains_key("by_path.bin"));
    }

    /// Writes `files` (name, bytes) and `.metadata` = `meta` to `dst` in one save; `commit`: whether it
    /// commits (else it is dropped, as by a killed process).
    fn save(dst: &str, files: &[(&str, &[u8])], meta: &[u8], commit: bool) {
        let c = DirCommit::begin(std::path::Path::new(dst), &SingleProcess, &DirOptions::default().with_layout(LAYOUT))
            .unwrap();
        for (name, bytes) in files {
            let mut f = c.create_file(name).unwrap();
            f.writer().write_all(bytes).unwrap();
            f.finish().unwrap();
        }
        if commit {
            c.commit(&SingleProcess, Ok(()), |c| {
                let mut m = c.create_file(".metadata")?;
                m.writer().write_all(meta).unwrap();
                m.finish().map(|_| ())
            })
            .unwrap();
        }
    }

    #[test]
    fn a_killed_save_leaves_the_previous_checkpoint_whole_unless_it_replaced_a_file() {
        let store = memory("memtest-c");
        let dst = "memtest-c://b/ckpt";
        save(dst, &[("a.1.distcp", b"one")], b"meta 1", true);
        // New names: the previous checkpoint stays whole while the new one is written and after it dies.
        save(dst, &[("a.2.distcp", b"two")], b"meta 2", false);
        assert_eq!(&store.read(".metadata", 0..6).unwrap()[..], b"meta 1");
        assert_eq!(&store.read("a.1.distcp", 0..3).unwrap()[..], b"one");
        let manifest = store.read("ckpt.checksums.json", 0..10).unwrap();
        assert!(!manifest.is_empty(), "the previous manifest too");
        // What the killed save left is listed (the manifest of the committed checkpoint does not name it).
        let left = crate::storage::remote_commit::leftovers(&store, LAYOUT.commit_points, &LAYOUT.owned).unwrap();
        assert_eq!(left.into_iter().map(|o| o.name).collect::<Vec<_>>(), vec!["a.2.distcp"]);
        // The next save removes what the killed one left, and the previous checkpoint's files.
        save(dst, &[("a.3.distcp", b"three")], b"meta 3", true);
        assert_eq!(names(&store), vec![".metadata", "a.3.distcp", "ckpt.checksums.json"]);
        // A save that replaces a file of the previous checkpoint deletes its commit point first.
        save(dst, &[("a.3.distcp", b"THREE")], b"meta 4", false);
        assert!(store.head(".metadata").unwrap().is_none(), "no checkpoint rather than a mix");
        save(dst, &[("a.3.distcp", b"three")], b"meta 5", true);
        assert_eq!(&store.read(".metadata", 0..6).unwrap()[..], b"meta 5");
        // Another writer changed the commit point meanwhile: refused.
        let c = DirCommit::begin(std::path::Path::new(dst), &SingleProcess, &DirOptions::default().with_layout(LAYOUT))
            .unwrap();
        store.put(".metadata", Bytes::from_static(b"theirs"), PutCondition::Overwrite).unwrap();
        let e = c
            .commit(&SingleProcess, Ok(()), |c| {
                let mut m = c.create_file(".metadata")?;
                m.writer().write_all(b"mine").unwrap();
                m.finish().map(|_| ())
            })
            .unwrap_err();
        assert!(matches!(e, CommitError::Storage { source: crate::storage::StorageError::Conflict { .. } }), "{e}");
        assert_eq!(&store.read(".metadata", 0..6).unwrap()[..], b"theirs");
    }

    #[test]
    fn every_rank_streams_its_own_files_and_a_failed_rank_commits_nothing() {
        let store = memory("memtest-b");
        let dst = std::path::Path::new("memtest-b://b/ckpt");
        for fail in [false, true] {
            let outcomes: Vec<Result<(), CommitError>> = std::thread::scope(|s| {
                let handles: Vec<_> = ThreadGroup::new(3)
                    .into_iter()
                    .map(|g| {
                        s.spawn(move || {
                            let c = DirCommit::begin(dst, &g, &DirOptions::default().with_layout(LAYOUT))?;
                            let mut f = c.create_file(&format!("__{}_0.distcp", g.rank()))?;
                            f.writer().write_all(&[g.rank() as u8; 1000]).unwrap();
                            f.finish()?;
                            let own = if fail && g.rank() == 2 {
                                Err(crate::RankFailure::new("disk on fire"))
                            } else {
                                Ok(())
                            };
                            c.commit(&g, own, |c| {
                                let mut m = c.create_file(".metadata")?;
                                m.writer().write_all(b"meta").unwrap();
                                m.finish().map(|_| ())
                            })
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            if fail {
                assert!(outcomes.iter().all(|o| matches!(o, Err(CommitError::RankFailed { rank: 2, .. }))));
                assert!(!names(&store).contains(&".metadata".to_owned()), "nothing committed");
                assert!(store.head(".ckpt-lock.json").unwrap().is_none(), "the lock released");
            } else {
                assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
                let n = names(&store);
                assert!(n.contains(&".metadata".to_owned()) && n.contains(&"__2_0.distcp".to_owned()), "{n:?}");
            }
        }
    }
}
