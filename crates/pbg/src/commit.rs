//! The commit protocol: write every file of version `V+1`, make them durable, rewrite the version file (the
//! commit point), optionally snapshot the new version, then drop version `V` unless it is preserved.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use ckpt_io::{DestinationLock, Durability, FileDigest, MANIFEST_NAME, Manifest};
use rayon::prelude::*;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::metadata::{Iteration, Metadata};
use crate::model::Model;
use crate::names::{FileName, check_entity_name};
use crate::partition::EntityPartition;
use crate::storage::{FileCheckpointStorage, dir_sync, write_via_temp};

/// How the version file is rewritten at the commit point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VersionWrite {
    /// Temporary file, fsync, rename, directory fsync (ckpt's default: never an empty version file).
    #[default]
    Rename,
    /// Truncate, write, fsync in place — PBG's own protocol, for shared file systems without metadata
    /// consistency (GlusterFS).
    InPlace,
}

/// Choices of how a new version is written ([`Commit::finish`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WriteOptions {
    /// Keep the files of the old version `V` (PBG: the checkpoint consumed by the first iteration of a
    /// preserved epoch). Files a snapshot links to are always kept.
    pub preserve_old: bool,
    /// After committing, snapshot the new version as `epoch_<k>/`.
    pub snapshot_epoch: Option<u64>,
    /// Copy the files of version `V` that the commit does not rewrite to version `V+1` (default), so the
    /// new version is complete: PBG reads every partition at the committed version.
    pub carry_over: bool,
    /// How the version file is written.
    pub version_write: VersionWrite,
    /// [`crate::save`]: the training config that defines the layout, instead of the entries' `config`.
    /// A commit does not use it.
    pub config: Option<Config>,
    /// [`crate::save`] and [`crate::save_rank`]: how durably the directory is written (`sync`: files and
    /// directories fsync'd; `checksums`: the manifest `ckpt.checksums.json`; `direct_io`). A commit of PBG's
    /// own training protocol always syncs its files and version file, as PBG does.
    pub durability: Durability,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            preserve_old: false,
            snapshot_epoch: None,
            carry_over: true,
            version_write: VersionWrite::Rename,
            config: None,
            durability: Durability::default(),
        }
    }
}

impl WriteOptions {
    /// Keep or drop the old version.
    #[must_use]
    pub fn with_preserve_old(mut self, preserve: bool) -> Self {
        self.preserve_old = preserve;
        self
    }

    /// Snapshot the new version as `epoch_<epoch>/`.
    #[must_use]
    pub fn with_snapshot_epoch(mut self, epoch: Option<u64>) -> Self {
        self.snapshot_epoch = epoch;
        self
    }

    /// Carry unchanged files over to the new version, or not.
    #[must_use]
    pub fn with_carry_over(mut self, carry: bool) -> Self {
        self.carry_over = carry;
        self
    }

    /// How to write the version file.
    #[must_use]
    pub fn with_version_write(mut self, how: VersionWrite) -> Self {
        self.version_write = how;
        self
    }

    /// These options with `durability` ([`WriteOptions::durability`]).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// [`crate::save`] lays the checkpoint out as `config` says.
    #[must_use]
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }
}

/// What a finished commit did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommitReport {
    /// The version now committed.
    pub version: u64,
    /// The version it replaced.
    pub previous: u64,
    /// Files written from the data given to the commit.
    pub written: Vec<PathBuf>,
    /// Files of the old version copied to the new one.
    pub carried_over: Vec<PathBuf>,
    /// Files of the old version deleted.
    pub dropped: Vec<PathBuf>,
    /// Files of the new version left by an earlier attempt that crashed before its commit, deleted
    /// because this commit neither wrote nor carried them over.
    pub leftovers: Vec<PathBuf>,
    /// The snapshot directory created, if any.
    pub snapshot: Option<PathBuf>,
}

/// A new version under construction: give it partitions and a model, then [`finish`](Commit::finish).
///
/// Writing follows PBG's protocol, so PBG can resume from the result and a crash at any point leaves the
/// committed version intact: (0) `v{V+1}` files left by an earlier attempt that crashed before its commit,
/// and that this commit neither writes nor carries over, are deleted; (1) every `v{V+1}` file is written (in parallel; each to a temporary name,
/// fsync'd, renamed); (2) the directory is fsync'd; (3) `checkpoint_version.txt` is rewritten — the commit
/// point; (4) the new version is snapshotted if asked; (5) the `v{V}` files are deleted unless preserved,
/// `V` is 0 (v0 files are user data), or a snapshot links to them.
///
/// Files given without metadata get the metadata PBG would write for the iteration that produces version
/// `V+1` ([`Commit::next_metadata`]), when it can be derived.
///
/// ```
/// use ckpt_tensor::Tensor;
/// use ckpt_pbg::{WriteOptions, EntityPartition, FileCheckpointStorage, Model};
/// let dir = tempfile::tempdir().unwrap();
/// let storage = FileCheckpointStorage::new(dir.path());
/// storage.prepare().unwrap();
/// for step in 0..3 {
///     let mut commit = storage.begin_commit().unwrap();
///     let e = Tensor::from_slice(&[step as f32; 4], &[2, 2]).unwrap();
///     commit.partition("user", 0, EntityPartition::new(e)).unwrap();
///     commit.model(Model::default());
///     let report = commit.finish(&WriteOptions::default()).unwrap();
///     assert_eq!(report.version, step + 1);
/// }
/// assert_eq!(storage.load_version().unwrap(), 3);
/// assert!(!storage.entity_partition_file(2, "user", 0).exists()); // v2 dropped
/// ```
#[derive(Debug)]
pub struct Commit<'s> {
    storage: &'s FileCheckpointStorage,
    previous: u64,
    partitions: Vec<(String, u32, EntityPartition)>,
    model: Option<Model>,
    next_metadata: Option<Metadata>,
    /// Held from [`FileCheckpointStorage::begin_commit`] to the end of [`Commit::finish`].
    lock: Option<DestinationLock>,
}

impl FileCheckpointStorage {
    /// Starts a commit of version `V+1` on top of the committed version `V`, holding the destination's
    /// advisory lock (`.<dir>.ckpt-lock` beside the directory, [`ckpt_io::DestinationLock`]) until
    /// the commit is finished or dropped: a second writer of the same directory gets a lock error naming
    /// the holder instead of racing this one.
    ///
    /// # Errors
    /// [`Error::BadVersionFile`], [`Error::Io`]; `Error::Core` holding a `ckpt_io::CommitError` when another
    /// save holds the lock.
    pub fn begin_commit(&self) -> Result<Commit<'_>> {
        let lock = DestinationLock::acquire(self.path()).map_err(|e| Error::Core(e.into()))?;
        let mut commit = self.begin_commit_unlocked()?;
        commit.lock = Some(lock);
        Ok(commit)
    }

    /// [`FileCheckpointStorage::begin_commit`] without the lock (for a directory the caller has locked).
    pub(crate) fn begin_commit_unlocked(&self) -> Result<Commit<'_>> {
        let previous = self.load_version()?;
        let next_metadata = self.derive_next_metadata(previous);
        Ok(Commit { storage: self, previous, partitions: Vec::new(), model: None, next_metadata, lock: None })
    }

    /// The metadata PBG writes into the files of version `previous + 1`: the config text from the previous
    /// model file's `config/json` (else `config.json`) and the iteration with index `previous`.
    fn derive_next_metadata(&self, previous: u64) -> Option<Metadata> {
        let old = if previous > 0 { self.load_model(previous).ok().map(|m| m.metadata) } else { None };
        let text = old.as_ref().and_then(|m| m.config_json().map(str::to_owned)).or_else(|| self.load_config().ok())?;
        let chunks = old.as_ref().and_then(|m| m.iteration()).and_then(|it| u64::try_from(it.num_edge_chunks).ok());
        metadata_for(&text, previous, chunks)
    }
}

/// The metadata PBG writes into the files of version `previous + 1` of a new checkpoint whose config is
/// `config_json` (what [`FileCheckpointStorage::begin_commit`] derives in a directory holding only the
/// config), when it can be derived.
pub(crate) fn next_metadata(config_json: &str, previous: u64) -> Option<Metadata> {
    metadata_for(config_json, previous, None)
}

/// The metadata of version `previous + 1` from the config text, the edge chunk count the config's or
/// `chunks`.
fn metadata_for(text: &str, previous: u64, chunks: Option<u64>) -> Option<Metadata> {
    let config = crate::config::Config::parse(text).ok()?;
    let chunks = config.num_edge_chunks().or(chunks)?;
    let it = Iteration::from_index(previous, config.num_epochs(), &config.edge_paths(), chunks)?;
    Some(Metadata::for_iteration(text, &it))
}

/// Snapshots version `version` of `storage` as `epoch_<epoch>/` (links to its files and its version file).
pub(crate) fn snapshot_version(storage: &FileCheckpointStorage, version: u64, epoch: u64) -> Result<PathBuf> {
    storage.prepare_snapshot(epoch)?;
    for (name, _) in storage.list()?.into_iter().filter(|(n, _)| n.version() == Some(version)) {
        match &name {
            FileName::Embeddings { entity, partition, .. } => {
                storage.copy_entity_partition_to_snapshot(version, entity, *partition, epoch)?;
            }
            FileName::Model { .. } => storage.copy_model_to_snapshot(version, epoch)?,
            _ => {}
        }
    }
    storage.copy_version_to_snapshot(version, epoch)?;
    Ok(storage.snapshot_path(epoch))
}

impl Commit<'_> {
    /// The version being written (`V+1`).
    pub fn version(&self) -> u64 {
        self.previous + 1
    }

    /// The committed version this commit builds on.
    pub fn previous(&self) -> u64 {
        self.previous
    }

    /// The metadata given to files that come without any.
    pub fn next_metadata(&self) -> Option<&Metadata> {
        self.next_metadata.as_ref()
    }

    /// Replaces the metadata given to files that come without any.
    pub fn set_next_metadata(&mut self, metadata: Option<Metadata>) {
        self.next_metadata = metadata;
    }

    /// Adds (or replaces) the new version of an entity partition.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for unusable entity names.
    pub fn partition(&mut self, entity: &str, partition: u32, data: EntityPartition) -> Result<&mut Self> {
        check_entity_name(entity)?;
        self.partitions.retain(|(e, p, _)| !(e == entity && *p == partition));
        self.partitions.push((entity.to_owned(), partition, data));
        Ok(self)
    }

    /// Sets the new version of the model.
    pub fn model(&mut self, model: Model) -> &mut Self {
        self.model = Some(model);
        self
    }

    /// Writes, commits, snapshots and cleans up (see [`Commit`]).
    ///
    /// # Errors
    /// Any write error before the commit point leaves version `V` committed and intact (the partial `V+1`
    /// files are overwritten by the next attempt); [`Error::InvalidInput`] if another writer committed in
    /// the meantime.
    pub fn finish(mut self, options: &WriteOptions) -> Result<CommitReport> {
        let storage = self.storage;
        let (old, new) = (self.previous, self.previous + 1);
        if let Some(meta) = &self.next_metadata {
            for (_, _, p) in &mut self.partitions {
                if p.metadata.attrs.is_empty() {
                    p.metadata = meta.clone();
                }
            }
            if let Some(m) = &mut self.model {
                if m.metadata.attrs.is_empty() {
                    m.metadata = meta.clone();
                }
            }
        }

        // 0. Leftovers of a crashed attempt at the same version are not part of this one.
        let given: BTreeSet<FileName> = self
            .partitions
            .iter()
            .map(|(e, p, _)| FileName::Embeddings { entity: e.clone(), partition: *p, version: new })
            .chain(self.model.as_ref().map(|_| FileName::Model { version: new }))
            .collect();
        let carried: BTreeSet<FileName> = if options.carry_over && old > 0 {
            storage
                .list()?
                .into_iter()
                .filter(|(n, _)| n.version() == Some(old))
                .map(|(n, _)| with_version(&n, new))
                .collect()
        } else {
            BTreeSet::new()
        };
        let mut leftovers = Vec::new();
        for (name, path) in storage.list()? {
            if name.version() == Some(new) && !given.contains(&name) && !carried.contains(&name) {
                fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                leftovers.push(path);
            }
        }

        // 1. Every file of the new version, in parallel; but partitions whose embeddings are made on demand
        // (a DCP region, rows gathered from several sources) one after the other, so that one of them at a
        // time is in memory.
        // `written` keeps the partitions' order.
        let write = |(i, (e, p, data)): (usize, &(String, u32, EntityPartition))| -> Result<(usize, PathBuf)> {
            let path = storage.write_entity_partition(new, e, *p, data)?;
            crash_point("pbg.file", storage)?;
            Ok((i, path))
        };
        let (made, held): (Vec<_>, Vec<_>) =
            self.partitions.iter().enumerate().partition(|(_, (_, _, data))| data.embeddings.storage().is_deferred());
        let mut numbered: Vec<(usize, PathBuf)> = held.into_par_iter().map(write).collect::<Result<_>>()?;
        for part in made {
            numbered.push(write(part)?);
        }
        numbered.sort_by_key(|(i, _)| *i);
        let mut written: Vec<PathBuf> = numbered.into_iter().map(|(_, path)| path).collect();
        if let Some(m) = &self.model {
            written.push(storage.write_model(new, m)?);
        }
        let mut carried_over = Vec::new();
        if options.carry_over && old > 0 {
            let olds: Vec<(FileName, PathBuf)> = storage
                .list()?
                .into_iter()
                .filter(|(n, _)| n.version() == Some(old))
                .filter(|(n, _)| !given.contains(&with_version(n, new)))
                .collect();
            carried_over = olds
                .par_iter()
                .map(|(n, src)| {
                    let src = storage.resolve(src);
                    let dst = storage.path().join(with_version(n, new).to_string());
                    write_via_temp(&dst, |tmp| {
                        fs::copy(&src, tmp).map_err(|e| Error::io(&src, e))?;
                        fs::File::open(tmp).and_then(|f| f.sync_all()).map_err(|e| Error::io(tmp, e))
                    })?;
                    Ok(dst)
                })
                .collect::<Result<_>>()?;
        }
        dir_sync(storage.path())?;
        // A directory with a checksum manifest (written by `ckpt_pbg::save`) keeps it current: the new
        // version's files are read back once (libhdf5 writes by path; ckpt cannot hash while it writes).
        let new_digests = match Manifest::read(storage.path()).map_err(Error::Core)? {
            Some(_) => Some(
                written
                    .iter()
                    .chain(&carried_over)
                    .map(|p| {
                        let mut d = FileDigest::of_file(p).map_err(|e| Error::io(p, e))?;
                        d.file = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                        Ok(d)
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
            None => None,
        };
        crash_point("pbg.written", storage)?;

        // 2. The commit point.
        if storage.load_version()? != old {
            return Err(Error::InvalidInput {
                what: format!("version {new} of {}", storage.path().display()),
                reason: "another writer committed a version since this commit began".into(),
            });
        }
        match options.version_write {
            VersionWrite::Rename => storage.save_version(new)?,
            VersionWrite::InPlace => storage.save_version_in_place(new)?,
        }
        crash_point("pbg.committed", storage)?;

        // 3. Snapshot of the new version.
        let snapshot = match options.snapshot_epoch {
            Some(epoch) => Some(snapshot_version(storage, new, epoch)?),
            None => None,
        };

        // 4. Drop the old version; the checksum manifest, if the directory has one, is rewritten first for
        // the files that stay (a crash in between leaves old files it does not list, never listed files
        // that are gone).
        let mut to_drop = Vec::new();
        if !options.preserve_old && old > 0 {
            let kept: BTreeSet<String> = storage.snapshot_targets()?.into_iter().collect();
            for (name, path) in storage.list()? {
                if name.version() == Some(old) && !kept.contains(&name.to_string()) {
                    to_drop.push(path);
                }
            }
        }
        if let Some(digests) = new_digests {
            update_manifest(storage, digests, &to_drop)?;
        }
        let mut dropped = Vec::new();
        for path in to_drop {
            fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            dropped.push(path);
        }
        crash_point("pbg.done", storage)?;
        Ok(CommitReport { version: new, previous: old, written, carried_over, dropped, leftovers, snapshot })
    }
}

/// Whether the checksum manifest lists `name`: the versioned HDF5 files and `config.json`, which do not
/// change once written; not the version file (the commit pointer, rewritten by every commit: a manifest
/// entry for it would be stale between the commit point and the manifest's rewrite) nor
/// `training_stats.json` (PBG's trainer appends to it).
pub(crate) fn in_manifest(name: &str) -> bool {
    matches!(FileName::parse(name), Some(FileName::Embeddings { .. } | FileName::Model { .. } | FileName::Config))
}

/// Rewrites the checksum manifest of `storage`'s directory (atomically): `digests` added or replaced, the
/// entries of `dropping` and of files that no longer exist removed.
fn update_manifest(storage: &FileCheckpointStorage, digests: Vec<FileDigest>, dropping: &[PathBuf]) -> Result<()> {
    let dir = storage.path();
    let mut m = Manifest::read(dir).map_err(Error::Core)?.unwrap_or_default();
    let gone: BTreeSet<String> =
        dropping.iter().filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
    m.files.retain(|name, _| in_manifest(name) && !gone.contains(name) && dir.join(name).is_file());
    for d in digests {
        m.insert(d);
    }
    let path = dir.join(MANIFEST_NAME);
    let json = m.to_json();
    ckpt_io::write_file(&path, &ckpt_io::FileOptions::default(), |w| {
        std::io::Write::write_all(w, &json).map_err(|e| ckpt_tensor::Error::io(&path, e))
    })
    .map(|_| ())
    .map_err(Error::Core)
}

/// A [failpoint](ckpt_io::failpoint) between the steps of a commit, for crash tests.
fn crash_point(name: &'static str, storage: &FileCheckpointStorage) -> Result<()> {
    ckpt_io::failpoint::hit(name).map_err(|e| Error::io(storage.path(), e))
}

/// The same file at another version.
fn with_version(name: &FileName, version: u64) -> FileName {
    match name {
        FileName::Embeddings { entity, partition, .. } => {
            FileName::Embeddings { entity: entity.clone(), partition: *partition, version }
        }
        FileName::Model { .. } => FileName::Model { version },
        other => other.clone(),
    }
}
