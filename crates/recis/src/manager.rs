//! The output directory of RecIS's checkpoint manager (`recis/framework/checkpoint_manager.py`): one
//! directory per checkpoint id (`ckpt_<global_step>`), and the `checkpoint` list, one id per line, latest
//! last.
//!
//! The commit protocol, two steps:
//! 1. **The checkpoint directory, whole** ([`ckpt_io::DirCommit`]): shard 0 locks
//!    `<root>/.<id>.ckpt-lock` and creates the staging directory `<root>/.<id>.ckpt-staging`; every shard
//!    writes its data files and io state there (each `fdatasync`'d), shard 0 also `model.pt`, `extra.pt` and
//!    `io_state_count`; after the exchange shard 0 merges the shards' metadata into `index` (written last),
//!    `tensorkey.json`, the torch-rank JSON and `ckpt.checksums.json`, and swaps the directory in with
//!    `renameat2(RENAME_EXCHANGE)` (`RENAME_NOREPLACE` for a new id), then fsyncs the root.
//! 2. **The `checkpoint` list, the format's own commit point**: shard 0 rewrites it with the id last
//!    (temporary file, fsync, rename, directory fsync), then removes the checkpoints rotated out by
//!    `max_keep`. Every shard returns once the list is written, with the same outcome.
//!
//! A crash before step 1's swap leaves the previous checkpoint of that id (if any) and the list as they
//! were; between the swap and the list, a complete checkpoint that the list does not name yet (readers and
//! RecIS load the listed latest); after the list, the new one. Readers of the root never see a listed but
//! incomplete checkpoint.
//!
//! The root may be an object-store URL spelled as a path (`s3://bucket/run`, with ckpt-io's `remote`
//! feature): each checkpoint is then the prefix `<root>/<id>/`, streamed and committed with its `index`
//! last (ckpt-io's commit on an object store), the list one object rewritten after it (read back from the
//! bucket, so ids saved by earlier processes stay listed), and a checkpoint rotated out is every object
//! under its prefix, deleted. A save of a new id never touches the listed ones: a crash leaves the previous
//! checkpoint whole and listed.
//!
//! Differences from RecIS, all on the safe side:
//! * **Atomic checkpoints** (above); RecIS writes into `<id>` in place and lists it when done.
//! * **Rotation across processes.** `max_keep` is applied to the list read from disk, not to an in-memory
//!   list, so checkpoints saved by earlier processes are evicted too. The list is rewritten without the
//!   evicted ids before their directories are removed.
//! * Saving an id that is already listed replaces its directory whole and moves it to the end instead of
//!   listing it twice.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use ckpt_collective::Collective;
use ckpt_tensor::{Tensor, Value};

use ckpt_io::DirCommit;

use crate::dense::{EXTRA_FILE, IO_STATE_COUNT_FILE, MODEL_FILE, io_state_file, write_torch_to};
use crate::error::{Error, Result};
use crate::name::Shard;
use crate::table::HashTable;
use crate::writer::{
    ShardMeta, Target, WriteOptions, commit_shards, from_commit, is_checkpoint_file, shard_blocks,
    write_shard_files_to, write_text,
};

/// The name of the list file.
pub const CHECKPOINT_LIST: &str = "checkpoint";

/// The largest `checkpoint` list read (a million ids of 16 bytes).
const MAX_LIST_BYTES: u64 = 16 << 20;

/// The id RecIS's trainer gives the checkpoint of a global step: `ckpt_<step>`.
pub fn checkpoint_id(step: i64) -> String {
    format!("ckpt_{step}")
}

/// The global step of a `ckpt_<step>` id.
pub fn checkpoint_step(id: &str) -> Option<i64> {
    id.strip_prefix("ckpt_")?.parse().ok()
}

/// The checkpoint directory `path` names, by one rule used wherever ckpt-recis takes a path to read
/// ([`RecisReader::open`](crate::RecisReader::open), [`crate::reshard`], [`crate::verify`]):
///
/// * a directory holding a `checkpoint` list and no `index` of its own is an output root of RecIS's
///   checkpoint manager (`output_dir`), and names its latest listed checkpoint, `<root>/<last id>`, which is
///   what RecIS's manager loads;
/// * any other path names itself (a checkpoint directory `<root>/ckpt_<step>`).
///
/// ```
/// let root = tempfile::tempdir().unwrap();
/// std::fs::write(root.path().join("checkpoint"), "ckpt_100\nckpt_200\n").unwrap();
/// assert_eq!(ckpt_recis::checkpoint_dir(root.path()).unwrap(), root.path().join("ckpt_200"));
/// let dir = root.path().join("ckpt_100");
/// assert_eq!(ckpt_recis::checkpoint_dir(&dir).unwrap(), dir);
/// ```
///
/// # Errors
/// [`Error::NoCheckpoint`] for a root whose list names no checkpoint; [`Error::BadCheckpointId`] for a
/// latest id that is not a plain directory name; [`Error::Io`] reading the list.
pub fn checkpoint_dir(path: &Path) -> Result<PathBuf> {
    let is_root = path.join(CHECKPOINT_LIST).is_file() && !path.join(crate::index::INDEX_FILE).is_file();
    if !is_root {
        return Ok(path.to_path_buf());
    }
    let manager = CheckpointManager::new(path);
    let id = manager.latest()?.ok_or_else(|| Error::NoCheckpoint { path: path.join(CHECKPOINT_LIST) })?;
    manager.path_of(&id)
}

/// What one shard saves: its hash tables, the sparse-side dense tensors (optimizer scalars; written by
/// shard 0 only), and the torch-saved state (`model.pt` and `extra.pt` by shard 0, each shard's io state).
#[derive(Debug, Clone, Default)]
pub struct ShardState {
    /// This shard's hash tables, in state-dict order.
    pub tables: Vec<HashTable>,
    /// Dense tensors saved in the data files (`sparse_adamw_step`, `sparse_adamw_beta1`, ...).
    pub dense: Vec<(String, Tensor)>,
    /// `model.pt`: the dense model state dict (shard 0).
    pub model: Option<Value>,
    /// `extra.pt`: `{name: state}` (shard 0).
    pub extra: Option<Value>,
    /// `io_state_<shard>.pt`: `{io name: io state}`; shard 0 also writes `io_state_count` when it has one.
    pub io_state: Option<Value>,
}

/// A checkpoint output directory.
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_collective::SingleProcess;
/// use ckpt_recis::{CheckpointManager, HashTable, Slot};
/// use ckpt_recis::manager::{ShardState, checkpoint_id};
/// use ckpt_recis::name::SliceInfo;
/// use ckpt_recis::table::TableChild;
/// let root = tempfile::tempdir().unwrap();
/// let manager = CheckpointManager::new(root.path()).with_max_keep(2);
/// let emb = Tensor::from_slice(&[0.5f32, 1.5], &[2, 1]).unwrap();
/// let child = TableChild::new("user", vec![7, 9], vec![Slot::new("embedding", emb).unwrap()]).unwrap();
/// let state = ShardState { tables: vec![HashTable::single(SliceInfo::full(65536).unwrap(), child)], ..Default::default() };
/// for step in [100, 200, 300] {
///     manager.save(&state, &checkpoint_id(step), &SingleProcess).unwrap();
/// }
/// assert_eq!(manager.list().unwrap(), ["ckpt_200", "ckpt_300"]);
/// let latest = manager.open_latest().unwrap();
/// assert_eq!(latest.sparse().child("user").unwrap().position(9).unwrap(), Some(1));
/// ```
#[derive(Debug, Clone)]
pub struct CheckpointManager {
    root: PathBuf,
    max_keep: Option<NonZeroUsize>,
    options: WriteOptions,
}

impl CheckpointManager {
    /// The output directory `root`, keeping the latest checkpoint only (RecIS's default `max_keep=1`).
    pub fn new(root: impl AsRef<Path>) -> Self {
        CheckpointManager {
            root: root.as_ref().to_path_buf(),
            max_keep: NonZeroUsize::new(1),
            options: WriteOptions::default(),
        }
    }

    /// Keeps the latest `max_keep` checkpoints; 0 keeps every checkpoint.
    #[must_use]
    pub fn with_max_keep(mut self, max_keep: usize) -> Self {
        self.max_keep = NonZeroUsize::new(max_keep);
        self
    }

    /// Saves with `options` (data files per shard, torch-rank JSON).
    #[must_use]
    pub fn with_write_options(mut self, options: WriteOptions) -> Self {
        self.options = options;
        self
    }

    /// The output directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The listed checkpoint ids, oldest first (non-empty lines, trimmed, as RecIS reads them). Empty when
    /// there is no list yet.
    ///
    /// The root may be an object-store URL spelled as a path (`s3://bucket/run`): the list is then read
    /// from its object.
    ///
    /// # Errors
    /// [`Error::Io`]; `Error::Core` for a list larger than 16 MiB or the object store's errors.
    pub fn list(&self) -> Result<Vec<String>> {
        let path = self.root.join(CHECKPOINT_LIST);
        let Some(bytes) = ckpt_io::storage::read_small_file(&path, MAX_LIST_BYTES).map_err(from_commit)? else {
            return Ok(Vec::new());
        };
        Ok(String::from_utf8_lossy(&bytes)
            .split('\n')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// The latest checkpoint id (the last non-empty line of the list).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn latest(&self) -> Result<Option<String>> {
        Ok(self.list()?.pop())
    }

    /// The directory of checkpoint `id`.
    ///
    /// # Errors
    /// [`Error::BadCheckpointId`].
    pub fn path_of(&self, id: &str) -> Result<PathBuf> {
        check_id(id)?;
        Ok(self.root.join(id))
    }

    /// Saves checkpoint `id`: every rank of `collective` calls it with its own state (rank r is shard r of
    /// `world_size`), and every rank returns once the checkpoint is complete, listed and rotated, with the
    /// same outcome. Returns the checkpoint's directory.
    ///
    /// The module documentation has the commit protocol: the directory `<root>/<id>` staged and swapped in
    /// whole, then the `checkpoint` list rewritten and old checkpoints rotated out.
    ///
    /// # Errors
    /// [`Error::BadCheckpointId`]; this rank's own error; [`Error::ShardFailed`] naming a rank that failed;
    /// the commit's errors (`Error::Core` holding a `ckpt_io::CommitError`: another save of the same id in
    /// progress, a full disk, ...).
    pub fn save(&self, state: &ShardState, id: &str, group: &dyn Collective) -> Result<PathBuf> {
        check_id(id)?;
        let final_dir = self.root.join(id);
        let group: &dyn Collective = &group;
        let options = self.options.dir_options(is_checkpoint_file);
        let commit = DirCommit::begin(&final_dir, group, &options).map_err(from_commit)?;
        let local = Shard::new(group.rank(), group.world_size())
            .and_then(|shard| self.write_shard(Target::Staged(&commit), shard, state));
        commit_shards(commit, group, local, &self.options)?;
        // The format's own commit point: the list, written by shard 0; every shard learns the outcome.
        let listed = if group.rank() == 0 { self.list_and_rotate(id) } else { Ok(()) };
        let message = match &listed {
            Ok(()) => Vec::new(),
            // As text: it crosses the process group as bytes (the other ranks report it as a rank failure); this rank
            // returns its own error, source intact.
            Err(e) => e.to_string().into_bytes(),
        };
        let message = group.broadcast(message, 0).map_err(crate::data_file::from_core)?;
        listed?;
        if !message.is_empty() {
            return Err(Error::ShardFailed { shard: 0, message: String::from_utf8_lossy(&message).into() });
        }
        Ok(final_dir)
    }

    fn write_shard(&self, target: Target<'_>, shard: Shard, state: &ShardState) -> Result<ShardMeta> {
        let blocks = shard_blocks(&state.tables, &state.dense, shard)?;
        let meta = write_shard_files_to(target, shard, self.options.parallel, &blocks)?;
        if let Some(io) = &state.io_state {
            write_torch_to(target, &io_state_file(shard.index()), io)?;
        }
        if shard.index() == 0 {
            if let Some(m) = &state.model {
                write_torch_to(target, MODEL_FILE, m)?;
            }
            if let Some(e) = &state.extra {
                write_torch_to(target, EXTRA_FILE, e)?;
            }
            if state.io_state.is_some() {
                write_text(target, IO_STATE_COUNT_FILE, &shard.num().to_string())?;
            }
        }
        Ok(meta)
    }

    /// Shard 0, after the checkpoint directory is in place: list the id last, rotate.
    fn list_and_rotate(&self, id: &str) -> Result<()> {
        let mut list = self.list()?;
        list.retain(|l| l != id);
        list.push(id.to_owned());
        let mut evicted = Vec::new();
        if let Some(keep) = self.max_keep {
            while list.len() > keep.get() {
                evicted.push(list.remove(0));
            }
        }
        self.write_list(&list)?;
        for old in evicted {
            // Ids from a hand-edited list may not be valid directory names; never touch those.
            if check_id(&old).is_err() {
                continue;
            }
            ckpt_io::storage::remove_tree(&self.root.join(&old)).map_err(from_commit)?;
        }
        Ok(())
    }

    fn write_list(&self, ids: &[String]) -> Result<()> {
        let text: String = ids.iter().map(|id| format!("{id}\n")).collect();
        write_text(Target::Dir(&self.root), CHECKPOINT_LIST, &text)
    }
}

/// A checkpoint id must be one plain directory name that fits on one line of the list.
fn check_id(id: &str) -> Result<()> {
    let bad = |reason| Err(Error::BadCheckpointId { id: id.into(), reason });
    if id.is_empty() || id.trim() != id {
        return bad("must be non-empty without surrounding whitespace");
    }
    if id.contains(['/', '\\', '\n', '\r', '\0']) {
        return bad("must be a single directory name on one line");
    }
    if id.starts_with('.') {
        return bad("may not start with `.` (reserved for staging directories, `.` and `..`)");
    }
    if id == CHECKPOINT_LIST {
        return bad("is the name of the checkpoint list");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn ids() {
        assert_eq!(checkpoint_id(1000), "ckpt_1000");
        assert_eq!(checkpoint_step("ckpt_1000"), Some(1000));
        assert_eq!(checkpoint_step("best"), None);
        for bad in ["", "a/b", "..", ".x", " a", "a\nb", "checkpoint"] {
            assert!(matches!(check_id(bad), Err(Error::BadCheckpointId { .. })), "{bad:?}");
        }
        check_id("ckpt_5").unwrap();
    }
}
