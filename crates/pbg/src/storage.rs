//! `FileCheckpointStorage`: PBG's checkpoint directory, operation for operation (prepare, version file,
//! entity partitions, model, config, stats, snapshots), with snapshot links that survive moving the
//! directory.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::{Model, read_model_file, write_model_file};
use crate::names::{CONFIG_FILE, FileName, STATS_FILE, VERSION_FILE, check_entity_name};
use crate::partition::{EntityPartition, read_partition_file, write_partition_file};

/// A checkpoint directory, as PBG's `FileCheckpointStorage` sees it.
///
/// Every operation of the original is here under the same name. Where the original is unsafe on a local
/// file system, ckpt is stricter but stays readable by PBG: data files are written to a temporary name,
/// fsync'd and renamed (PBG truncates them in place); [`save_version`](Self::save_version) commits by
/// rename (the original's in-place rewrite is [`save_version_in_place`](Self::save_version_in_place), for
/// shared file systems without metadata consistency); snapshot links are relative (the original's are
/// absolute).
///
/// Reading follows snapshot links, and when a link is dangling — PBG wrote an absolute link and the
/// directory was moved or copied since — it resolves the link by its file name in the checkpoint
/// directory.
///
/// ```
/// use ckpt_tensor::Tensor;
/// use ckpt_pbg::{EntityPartition, FileCheckpointStorage};
/// let dir = tempfile::tempdir().unwrap();
/// let storage = FileCheckpointStorage::new(dir.path());
/// storage.prepare().unwrap();
/// assert_eq!(storage.load_version().unwrap(), 0);
/// let embs = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
/// storage.save_entity_partition(1, "user", 0, &EntityPartition::new(embs.clone())).unwrap();
/// storage.save_version(1).unwrap();
/// let p = storage.load_entity_partition(storage.load_version().unwrap(), "user", 0).unwrap();
/// assert_eq!(p.embeddings, embs);
/// ```
#[derive(Debug, Clone)]
pub struct FileCheckpointStorage {
    path: PathBuf,
    /// Where dangling links are resolved by file name: the main checkpoint directory for a snapshot.
    link_base: PathBuf,
}

fn not_found_to_could_not_load(path: &Path, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::NotFound => Error::CouldNotLoad { path: path.to_path_buf() },
        _ => Error::io(path, e),
    }
}

/// Python's `int(text.strip())` for a version: digits (with `_` separators and an optional `+`).
pub(crate) fn parse_version(path: &Path, text: &str) -> Result<u64> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(0);
    }
    let digits = t.strip_prefix('+').unwrap_or(t);
    let ok = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__");
    ok.then(|| digits.replace('_', "").parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| Error::BadVersionFile { path: path.to_path_buf(), content: t.chars().take(64).collect() })
}

/// Writes `path` through a temporary sibling: `write` fills the temporary file (and fsyncs it), which is
/// then renamed over `path`. The directory is not fsync'd (callers batch that).
pub(crate) fn write_via_temp(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = ckpt_io::sibling(path, "ckpt-tmp")?;
    let result = write(&tmp).and_then(|()| fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn write_text_synced(path: &Path, text: &str) -> Result<()> {
    write_via_temp(path, |tmp| {
        let mut f = File::create(tmp).map_err(|e| Error::io(tmp, e))?;
        f.write_all(text.as_bytes()).map_err(|e| Error::io(tmp, e))?;
        f.sync_all().map_err(|e| Error::io(tmp, e))
    })
}

pub(crate) fn dir_sync(dir: &Path) -> Result<()> {
    ckpt_io::sync_dir(dir).map_err(|e| match e {
        ckpt_io::CommitError::Io { path, source } => Error::Io { path, source },
        other => Error::from(other),
    })
}

impl FileCheckpointStorage {
    /// The storage at `url`: a path or a `file://` URL, made absolute (symbolic links resolved where the
    /// path exists), as PBG's `Path(path).resolve(strict=False)`. A directory named `epoch_<k>` is taken
    /// for a snapshot: its dangling links resolve in its parent directory.
    pub fn new(url: impl AsRef<Path>) -> Self {
        let p = url.as_ref();
        let p = p.to_str().and_then(|s| s.strip_prefix("file://")).map_or_else(|| p.to_path_buf(), PathBuf::from);
        let path = fs::canonicalize(&p).or_else(|_| std::path::absolute(&p)).unwrap_or(p);
        let is_snapshot = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| matches!(FileName::parse(n), Some(FileName::Snapshot { .. })));
        let link_base = match (is_snapshot, path.parent()) {
            (true, Some(parent)) => parent.to_path_buf(),
            _ => path.clone(),
        };
        FileCheckpointStorage { path, link_base }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `checkpoint_version.txt`.
    pub fn version_file(&self) -> PathBuf {
        self.path.join(VERSION_FILE)
    }

    /// `config.json`.
    pub fn config_file(&self) -> PathBuf {
        self.path.join(CONFIG_FILE)
    }

    /// `training_stats.json`.
    pub fn stats_file(&self) -> PathBuf {
        self.path.join(STATS_FILE)
    }

    /// `embeddings_<entity>_<partition>.v<version>.h5`.
    pub fn entity_partition_file(&self, version: u64, entity: &str, partition: u32) -> PathBuf {
        self.path.join(FileName::Embeddings { entity: entity.to_owned(), partition, version }.to_string())
    }

    /// `model.v<version>.h5`.
    pub fn model_file(&self, version: u64) -> PathBuf {
        self.path.join(FileName::Model { version }.to_string())
    }

    /// `epoch_<epoch>/`.
    pub fn snapshot_path(&self, epoch: u64) -> PathBuf {
        self.path.join(FileName::Snapshot { epoch }.to_string())
    }

    /// The storage of snapshot `epoch_<epoch>` (its links resolve in this directory).
    pub fn snapshot(&self, epoch: u64) -> FileCheckpointStorage {
        FileCheckpointStorage { path: self.snapshot_path(epoch), link_base: self.link_base.clone() }
    }

    /// The file to read for `path`: itself when it exists (following links); for a dangling link, the file
    /// of the same name in the checkpoint directory when that exists; else `path` unchanged.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.exists() {
            return path.to_path_buf();
        }
        let is_link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        if is_link {
            let target = fs::read_link(path).ok();
            let name = target.as_deref().and_then(Path::file_name).or_else(|| path.file_name());
            if let Some(name) = name {
                let candidate = self.link_base.join(name);
                if candidate.exists() {
                    return candidate;
                }
            }
        }
        path.to_path_buf()
    }

    /// Creates the directory (and its parents).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn prepare(&self) -> Result<()> {
        fs::create_dir_all(&self.path).map_err(|e| Error::io(&self.path, e))
    }

    /// Commits `version`: writes `"{version}\n"` to a temporary file, fsyncs it, renames it over
    /// `checkpoint_version.txt` and fsyncs the directory. Readers see the old or the new version, never an
    /// empty file.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn save_version(&self, version: u64) -> Result<()> {
        write_text_synced(&self.version_file(), &format!("{version}\n"))?;
        dir_sync(&self.path)
    }

    /// Commits `version` exactly as PBG does: truncate `checkpoint_version.txt`, write `"{version}\n"`,
    /// flush, fsync. Meant for shared file systems that offer close/open data consistency but no metadata
    /// consistency (PBG's reason not to rename); a reader racing with it may see an empty file, which reads
    /// as version 0.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn save_version_in_place(&self, version: u64) -> Result<()> {
        let path = self.version_file();
        let mut f =
            OpenOptions::new().write(true).create(true).truncate(true).open(&path).map_err(|e| Error::io(&path, e))?;
        f.write_all(format!("{version}\n").as_bytes()).map_err(|e| Error::io(&path, e))?;
        f.sync_all().map_err(|e| Error::io(&path, e))
    }

    /// The committed version: 0 when `checkpoint_version.txt` is missing or blank (as PBG reads it).
    ///
    /// # Errors
    /// [`Error::BadVersionFile`] for other non-numbers, [`Error::Io`].
    pub fn load_version(&self) -> Result<u64> {
        let path = self.resolve(&self.version_file());
        match fs::read_to_string(&path) {
            Ok(text) => parse_version(&path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// Writes an entity partition's file at `version` (temporary name, fsync, rename, directory fsync).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::InvalidInput`] for non-float32 or non-2-D embeddings, [`Error::Hdf5`],
    /// [`Error::Io`].
    pub fn save_entity_partition(
        &self,
        version: u64,
        entity: &str,
        partition: u32,
        data: &EntityPartition,
    ) -> Result<()> {
        self.write_entity_partition(version, entity, partition, data)?;
        dir_sync(&self.path)
    }

    /// [`save_entity_partition`](Self::save_entity_partition) without the directory fsync (for batches).
    pub(crate) fn write_entity_partition(
        &self,
        version: u64,
        entity: &str,
        partition: u32,
        data: &EntityPartition,
    ) -> Result<PathBuf> {
        check_entity_name(entity)?;
        let path = self.entity_partition_file(version, entity, partition);
        // Atomic and durable on its own (temporary file `.<name>.ckpt-tmp`, fdatasync, rename, directory
        // fsync), with the data through the commit's O_DIRECT writer.
        write_partition_file(&path, data)?;
        Ok(path)
    }

    /// Reads an entity partition's file at `version`, validated (see [`read_partition_file`]).
    ///
    /// # Errors
    /// [`Error::CouldNotLoad`] if it does not exist, or the file's own error.
    pub fn load_entity_partition(&self, version: u64, entity: &str, partition: u32) -> Result<EntityPartition> {
        check_entity_name(entity)?;
        read_partition_file(&self.resolve(&self.entity_partition_file(version, entity, partition)))
    }

    /// Deletes an entity partition's file at `version` if it exists.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn drop_entity_partition(&self, version: u64, entity: &str, partition: u32) -> Result<()> {
        check_entity_name(entity)?;
        remove_if_exists(&self.entity_partition_file(version, entity, partition))
    }

    /// Writes the model file at `version` (temporary name, fsync, rename, directory fsync).
    ///
    /// # Errors
    /// As [`write_model_file`].
    pub fn save_model(&self, version: u64, model: &Model) -> Result<()> {
        self.write_model(version, model)?;
        dir_sync(&self.path)
    }

    pub(crate) fn write_model(&self, version: u64, model: &Model) -> Result<PathBuf> {
        let path = self.model_file(version);
        write_via_temp(&path, |tmp| write_model_file(tmp, model))?;
        Ok(path)
    }

    /// Reads the model file at `version`, validated (see [`read_model_file`]).
    ///
    /// # Errors
    /// [`Error::CouldNotLoad`] if it does not exist, or the file's own error.
    pub fn load_model(&self, version: u64) -> Result<Model> {
        read_model_file(&self.resolve(&self.model_file(version)))
    }

    /// Deletes the model file at `version` if it exists.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn drop_model(&self, version: u64) -> Result<()> {
        remove_if_exists(&self.model_file(version))
    }

    /// Writes `config.json` (atomically; PBG writes it without fsync at every trainer start).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn save_config(&self, config_json: &str) -> Result<()> {
        write_text_synced(&self.config_file(), config_json)?;
        dir_sync(&self.path)
    }

    /// The text of `config.json`.
    ///
    /// # Errors
    /// [`Error::CouldNotLoad`] if it does not exist, [`Error::Io`].
    pub fn load_config(&self) -> Result<String> {
        let path = self.config_file();
        fs::read_to_string(&path).map_err(|e| not_found_to_could_not_load(&path, e))
    }

    /// `config.json`, parsed.
    ///
    /// # Errors
    /// As [`load_config`](Self::load_config), plus [`Error::BadConfig`].
    pub fn read_config(&self) -> Result<Config> {
        Config::read(&self.config_file())
    }

    /// Appends lines to `training_stats.json` (one `\n` after each).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn append_stats(&self, lines: &[String]) -> Result<()> {
        let path = self.stats_file();
        let mut f = OpenOptions::new().append(true).create(true).open(&path).map_err(|e| Error::io(&path, e))?;
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        f.write_all(text.as_bytes()).map_err(|e| Error::io(&path, e))
    }

    /// The lines of `training_stats.json` (with their newlines, as Python iterates a file).
    ///
    /// # Errors
    /// [`Error::CouldNotLoad`] if it does not exist, [`Error::Io`].
    pub fn load_stats(&self) -> Result<Vec<String>> {
        let path = self.stats_file();
        let text = fs::read_to_string(&path).map_err(|e| not_found_to_could_not_load(&path, e))?;
        Ok(text.split_inclusive('\n').map(str::to_owned).collect())
    }

    /// Creates `epoch_<epoch>/`.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn prepare_snapshot(&self, epoch: u64) -> Result<()> {
        let p = self.snapshot_path(epoch);
        fs::create_dir_all(&p).map_err(|e| Error::io(&p, e))
    }

    fn link_into_snapshot(&self, name: &str, epoch: u64) -> Result<()> {
        let dst = self.snapshot_path(epoch).join(name);
        let target = Path::new("..").join(name);
        std::os::unix::fs::symlink(&target, &dst).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Error::AlreadyExists { path: dst.clone() },
            _ => Error::io(&dst, e),
        })
    }

    /// Links `epoch_<epoch>/embeddings_...v<version>.h5` to the file in this directory (a relative link, so
    /// the snapshot survives moving the directory).
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] if the link exists (as PBG's `FileExistsError`), [`Error::Io`].
    pub fn copy_entity_partition_to_snapshot(
        &self,
        version: u64,
        entity: &str,
        partition: u32,
        epoch: u64,
    ) -> Result<()> {
        check_entity_name(entity)?;
        let name = FileName::Embeddings { entity: entity.to_owned(), partition, version }.to_string();
        self.link_into_snapshot(&name, epoch)
    }

    /// Links `epoch_<epoch>/model.v<version>.h5` to the file in this directory.
    ///
    /// # Errors
    /// As [`copy_entity_partition_to_snapshot`](Self::copy_entity_partition_to_snapshot).
    pub fn copy_model_to_snapshot(&self, version: u64, epoch: u64) -> Result<()> {
        self.link_into_snapshot(&FileName::Model { version }.to_string(), epoch)
    }

    /// Writes `epoch_<epoch>/checkpoint_version.txt`.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn copy_version_to_snapshot(&self, version: u64, epoch: u64) -> Result<()> {
        let dir = self.snapshot_path(epoch);
        write_text_synced(&dir.join(VERSION_FILE), &format!("{version}\n"))?;
        dir_sync(&dir)
    }

    /// Every file of the directory whose name is part of the format, sorted by name kind, then version.
    ///
    /// # Errors
    /// [`Error::Io`] if the directory cannot be listed.
    pub fn list(&self) -> Result<Vec<(FileName, PathBuf)>> {
        let mut out = Vec::new();
        let dir = fs::read_dir(&self.path).map_err(|e| not_found_to_could_not_load(&self.path, e))?;
        for entry in dir {
            let entry = entry.map_err(|e| Error::io(&self.path, e))?;
            if let Some(name) = entry.file_name().to_str().and_then(FileName::parse) {
                out.push((name, entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The epochs that have a snapshot directory, ascending.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn snapshots(&self) -> Result<Vec<u64>> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|(_, p)| p.is_dir())
            .filter_map(|(n, _)| if let FileName::Snapshot { epoch } = n { Some(epoch) } else { None })
            .collect())
    }

    /// The names of the files that snapshots link to (by file name of the link target).
    pub(crate) fn snapshot_targets(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for epoch in self.snapshots()? {
            let snap = self.snapshot(epoch);
            for (name, path) in snap.list()? {
                if name.version().is_none() {
                    continue;
                }
                let target = fs::read_link(&path).ok();
                let base = target.as_deref().and_then(Path::file_name).or_else(|| path.file_name());
                if let Some(b) = base.and_then(|b| b.to_str()) {
                    names.push(b.to_owned());
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// Whether `dir` looks like a PBG checkpoint directory (or snapshot): it has a `checkpoint_version.txt`, or a
/// file named like an embeddings or model file that starts with the HDF5 signature. For format detection.
pub fn is_checkpoint_dir(dir: &Path) -> bool {
    if dir.join(VERSION_FILE).is_file() {
        return true;
    }
    let Ok(entries) = fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        let versioned = e.file_name().to_str().and_then(FileName::parse).is_some_and(|n| n.version().is_some());
        versioned && {
            let mut head = [0u8; 8];
            File::open(e.path()).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head)).is_ok()
                && head == crate::h5::HDF5_SIGNATURE
        }
    })
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ckpt_tensor::Tensor;

    #[test]
    fn version_file_rules() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileCheckpointStorage::new(dir.path());
        assert_eq!(s.load_version().unwrap(), 0);
        fs::write(s.version_file(), "").unwrap();
        assert_eq!(s.load_version().unwrap(), 0);
        fs::write(s.version_file(), " \n").unwrap();
        assert_eq!(s.load_version().unwrap(), 0);
        fs::write(s.version_file(), "12").unwrap();
        assert_eq!(s.load_version().unwrap(), 12);
        fs::write(s.version_file(), "x\n").unwrap();
        assert!(matches!(s.load_version(), Err(Error::BadVersionFile { .. })));
        s.save_version(7).unwrap();
        assert_eq!(fs::read_to_string(s.version_file()).unwrap(), "7\n");
        s.save_version_in_place(8).unwrap();
        assert_eq!(fs::read_to_string(s.version_file()).unwrap(), "8\n");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn snapshots_survive_moves_and_absolute_links() {
        let root = tempfile::tempdir().unwrap();
        let a = root.path().join("a");
        let s = FileCheckpointStorage::new(&a);
        s.prepare().unwrap();
        let e = Tensor::from_slice(&[1.0f32, 2.0], &[1, 2]).unwrap();
        s.save_entity_partition(3, "x", 0, &EntityPartition::new(e.clone())).unwrap();
        s.save_model(3, &Model::default()).unwrap();
        s.save_version(3).unwrap();
        s.prepare_snapshot(1).unwrap();
        s.copy_entity_partition_to_snapshot(3, "x", 0, 1).unwrap();
        s.copy_model_to_snapshot(3, 1).unwrap();
        s.copy_version_to_snapshot(3, 1).unwrap();
        assert!(matches!(s.copy_model_to_snapshot(3, 1), Err(Error::AlreadyExists { .. })));
        // An absolute link as PBG writes it, pointing into the old location.
        std::os::unix::fs::symlink(a.join("model.v3.h5"), s.snapshot_path(1).join("model.v4.h5")).unwrap();
        let b = root.path().join("b");
        fs::rename(&a, &b).unwrap();
        let moved = FileCheckpointStorage::new(b.join("epoch_1"));
        assert_eq!(moved.load_version().unwrap(), 3);
        assert_eq!(moved.load_entity_partition(3, "x", 0).unwrap().embeddings, e);
        assert!(moved.load_model(3).unwrap().parameters.is_none());
        assert!(moved.load_model(4).is_ok(), "dangling absolute link resolved by name");
        assert!(matches!(moved.load_model(5), Err(Error::CouldNotLoad { .. })));
        let main = FileCheckpointStorage::new(&b);
        assert!(is_checkpoint_dir(&b) && is_checkpoint_dir(&b.join("epoch_1")));
        assert!(!is_checkpoint_dir(root.path()));
        assert_eq!(main.snapshots().unwrap(), vec![1]);
        assert_eq!(main.snapshot_targets().unwrap(), vec!["embeddings_x_0.v3.h5", "model.v3.h5"]);
    }
}
