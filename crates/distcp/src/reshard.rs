//! Writing a checkpoint for another number of ranks: every tensor split on its first dimension as DTensor's
//! `Shard(0)` places it ([`shard_box`]), what a job of that world size with row-sharded tensors saves.
//!
//! Two sources: a state dict in memory ([`shard_state_dict`], [`save_sharded`]), and a DCP checkpoint read
//! region by region ([`DcpReader::shard_state`], [`reshard`]). Each builds one rank's state at a time, so a
//! multi-process job gives every rank its own part and saves it with [`crate::save_rank`]; the
//! one-process functions build every rank's part (views: no tensor data is copied for a state dict) and
//! save them with [`save_ranks`].

use std::collections::HashMap;
use std::path::Path;

use ckpt_io::{ReshardReport, SaveReport};
use ckpt_tensor::{PathItem, Value, flatten, unflatten};

use crate::chunks::shard_box;
use crate::error::{Error, Result};
use crate::metadata::{Metadata, StorageMetadata};
use crate::planner::ShardSpec;
use crate::reader::{DcpReader, ReadOptions};
use crate::writer::{WriteOptions, save_ranks};

/// One rank's part of a sharded save: its state dict and which of its tensors are chunks of bigger ones, as
/// [`crate::save_rank`] takes them.
pub type RankState = (Value, HashMap<String, ShardSpec>);

/// Rank `rank`'s part of `state_dict` in a job of `world` ranks: every tensor with at least `world` rows is
/// split on dimension 0 (`Shard(0)`, [`shard_box`]) and the rank holds its rows (a view, no copy); every
/// other entry is replicated (and written once by the save).
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// let w = Tensor::from_slice(&(0..10).map(|i| i as f32).collect::<Vec<_>>(), &[5, 2]).unwrap();
/// let sd = Value::dict([("w", Value::Tensor(w)), ("step", Value::Int(3))]);
/// let (local, shards) = ckpt_distcp::shard_state_dict(&sd, 1, 2).unwrap();
/// // 5 rows over 2 ranks: rows 3 and 4 on rank 1.
/// let part = local.as_dict().unwrap().get("w").unwrap().as_tensor().unwrap();
/// assert_eq!(part.to_vec::<f32>().unwrap(), [6.0, 7.0, 8.0, 9.0]);
/// assert_eq!(shards["w"].offsets, [3, 0]);
/// ```
///
/// # Errors
/// [`Error::Unwritable`] when `world` is 0 or `rank` is not below it; [`Error::Core`] when the state dict
/// cannot be flattened (DCP's rules) or rebuilt.
pub fn shard_state_dict(state_dict: &Value, rank: usize, world: usize) -> Result<RankState> {
    check_rank(rank, world)?;
    let mut leaves: Vec<(Vec<PathItem>, Value)> = Vec::new();
    let mut specs = HashMap::new();
    for e in flatten(state_dict)? {
        let value = match e.value.as_tensor().filter(|t| t.shape().first().is_some_and(|&rows| rows >= world)) {
            Some(t) => {
                let (offsets, sizes) = shard_box(t.shape(), 0, rank, world);
                let (start, rows) = (offsets.first().copied().unwrap_or(0), sizes.first().copied().unwrap_or(0));
                specs.insert(e.key.clone(), ShardSpec::new(t.shape(), &offsets));
                Value::Tensor(t.narrow(0, start, rows)?.with_requires_grad(t.requires_grad()))
            }
            None => e.value.clone(),
        };
        leaves.push((e.path, value));
    }
    Ok((unflatten(leaves)?, specs))
}

/// Saves `state_dict` as `world` ranks holding it row-sharded would ([`shard_state_dict`]), from one process.
/// With `world` 1 this is [`crate::save`].
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_distcp::{DcpReader, WriteOptions};
/// let dir = tempfile::tempdir().unwrap();
/// let w = Tensor::from_slice(&(0..15).map(|i| i as f32).collect::<Vec<_>>(), &[5, 3]).unwrap();
/// let sd = Value::dict([("w", Value::Tensor(w.clone()))]);
/// ckpt_distcp::save_sharded(&sd, dir.path(), 3, &WriteOptions::default()).unwrap();
/// let r = DcpReader::open(dir.path()).unwrap();
/// assert_eq!(r.tensor_metadata("w").unwrap().chunks.len(), 3); // 2 + 2 + 1 rows
/// assert_eq!(r.read_tensor("w").unwrap(), w);
/// ```
///
/// # Errors
/// As [`shard_state_dict`] and [`save_ranks`].
pub fn save_sharded(
    state_dict: &Value,
    dir: impl AsRef<Path>,
    world: usize,
    options: &WriteOptions,
) -> Result<SaveReport> {
    let dir = dir.as_ref();
    if world == 1 {
        return crate::save(state_dict, dir, options);
    }
    // Rank states are views (narrowed tensors): building them all first costs no tensor data, and a failure
    // leaves nothing written.
    let ranks = (0..world).map(|rank| shard_state_dict(state_dict, rank, world)).collect::<Result<Vec<_>>>()?;
    save_ranks(&ranks, dir, options)
}

impl DcpReader {
    /// Rank `rank`'s part of this checkpoint in a job of `world` ranks: every tensor with at least one
    /// dimension split on dimension 0 (`Shard(0)`, [`shard_box`]), the rank's box read with
    /// [`DcpReader::read_region`] (only the items it overlaps are read); scalars and non-tensor values whole
    /// (written once by the save).
    ///
    /// # Errors
    /// [`Error::Unwritable`] when `world` is 0 or `rank` is not below it; read errors.
    pub fn shard_state(&self, rank: usize, world: usize) -> Result<RankState> {
        check_rank(rank, world)?;
        let keys: Vec<&str> = self.keys().collect();
        let mut leaves = Vec::with_capacity(keys.len());
        let mut shards = HashMap::new();
        for key in keys {
            let value = match self.storage_metadata(key)? {
                StorageMetadata::Tensor(t) if !t.size.is_empty() => {
                    let (offsets, sizes) = shard_box(&t.size, 0, rank, world);
                    shards.insert(key.to_owned(), ShardSpec::new(&t.size, &offsets));
                    Value::Tensor(self.read_region(key, &offsets, &sizes)?)
                }
                StorageMetadata::Tensor(_) => Value::Tensor(self.read_tensor(key)?),
                StorageMetadata::Bytes => self.read_value(key)?,
            };
            leaves.push((self.path_of(key), value));
        }
        Ok((unflatten(leaves)?, shards))
    }
}

impl DcpReader {
    /// Rank `rank`'s row of the per-rank state `key` in a job of `world` ranks: a tensor of shape
    /// `[saved ranks, ...]` holding one row per rank of the job that saved it (RNG states, data-loader
    /// positions, a rank's own optimizer counters: what each rank saved with a `ShardSpec` of row `rank`).
    /// Only the items of that row are read. Such state belongs to a rank and cannot be split or merged.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use ckpt_tensor::{Tensor, Value};
    /// use ckpt_collective::{Collective, ThreadGroup};
    /// use ckpt_distcp::{DcpReader, Error, ShardSpec, WriteOptions, save_rank};
    /// let dir = tempfile::tempdir().unwrap();
    /// std::thread::scope(|s| {
    ///     for g in ThreadGroup::new(2) {
    ///         let dir = dir.path();
    ///         s.spawn(move || {
    ///             let mine = Tensor::from_slice(&[g.rank() as i64 * 10], &[1, 1]).unwrap();
    ///             let shards = HashMap::from([("rng".to_string(), ShardSpec::new(&[2, 1], &[g.rank(), 0]))]);
    ///             save_rank(&Value::dict([("rng", Value::Tensor(mine))]), &shards, dir, &WriteOptions::default(), &g)
    ///                 .unwrap();
    ///         });
    ///     }
    /// });
    /// let r = DcpReader::open(dir.path()).unwrap();
    /// assert_eq!(r.read_rank_row("rng", 1, 2).unwrap().to_vec::<i64>().unwrap(), [10]);
    /// assert!(matches!(r.read_rank_row("rng", 0, 3), Err(Error::RankCountMismatch { saved: 2, ranks: 3, .. })));
    /// ```
    ///
    /// # Errors
    /// [`Error::RankCountMismatch`] when the first dimension is not `world`; [`Error::NotATensor`] for a value
    /// without dimensions; [`Error::Unwritable`] for a `rank` not below `world`; read errors.
    pub fn read_rank_row(&self, key: &str, rank: usize, world: usize) -> Result<ckpt_tensor::Tensor> {
        check_rank(rank, world)?;
        let t = self.tensor_metadata(key)?;
        let saved = match t.size.first() {
            Some(&n) => n,
            None => return Err(Error::NotATensor(key.to_owned())),
        };
        if saved != world {
            return Err(Error::RankCountMismatch { key: key.to_owned(), saved, ranks: world });
        }
        let mut offsets = vec![0; t.size.len()];
        let mut sizes = t.size.clone();
        if let (Some(o), Some(s)) = (offsets.first_mut(), sizes.first_mut()) {
            *o = rank;
            *s = 1;
        }
        let row = self.read_region(key, &offsets, &sizes)?;
        Ok(row.reshape(sizes.get(1..).unwrap_or_default())?)
    }
}

/// Options of [`reshard`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReshardOptions {
    /// How the source is read.
    pub read: ReadOptions,
    /// How the new checkpoint is written.
    pub write: WriteOptions,
}

impl ReshardOptions {
    /// These options with `read` as the read options.
    #[must_use]
    pub fn with_read(mut self, read: ReadOptions) -> Self {
        self.read = read;
        self
    }

    /// These options with `write` as the write options.
    #[must_use]
    pub fn with_write(mut self, write: WriteOptions) -> Self {
        self.write = write;
        self
    }
}

/// Rewrites the checkpoint in `src` for `world` ranks in `dst` (created if needed), every tensor sharded on
/// its first dimension ([`DcpReader::shard_state`]), from one process. Every rank's state is read before
/// anything is written, so a read error leaves no partial checkpoint.
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_distcp::{DcpReader, ReshardOptions, WriteOptions};
/// let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
/// let w = Tensor::from_slice(&(0..8).map(|i| i as f32).collect::<Vec<_>>(), &[4, 2]).unwrap();
/// ckpt_distcp::save(&Value::dict([("w", Value::Tensor(w.clone()))]), src.path(), &WriteOptions::default()).unwrap();
/// ckpt_distcp::reshard(src.path(), dst.path(), 2, &ReshardOptions::default()).unwrap();
/// let r = DcpReader::open(dst.path()).unwrap();
/// assert_eq!(r.tensor_metadata("w").unwrap().chunks.len(), 2);
/// assert_eq!(r.read_tensor("w").unwrap(), w);
/// ```
///
/// # Errors
/// As [`DcpReader::open`], [`DcpReader::shard_state`] and [`save_ranks`].
pub fn reshard(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    world_size: usize,
    options: &ReshardOptions,
) -> Result<ReshardReport> {
    check_rank(0, world_size)?;
    let reader = DcpReader::open_with(src, &options.read)?;
    let from = source_ranks(reader.metadata());
    let states = (0..world_size).map(|rank| reader.shard_state(rank, world_size)).collect::<Result<Vec<_>>>()?;
    // No `create_dir_all(dst)`: the commit creates the parent and swaps the whole directory in, so a crash
    // leaves no empty destination behind.
    let saved = save_ranks(&states, dst, &options.write)?;
    Ok(ReshardReport::new(from, world_size, saved))
}

/// The ranks that wrote a checkpoint: the distinct `R` of its `__R_*.distcp` data files (at least 1; a
/// checkpoint written with other file names counts its distinct files).
fn source_ranks(metadata: &Metadata) -> usize {
    let files: std::collections::HashSet<&str> =
        metadata.storage_data.iter().map(|(_, info)| info.relative_path.as_str()).collect();
    let ranks: std::collections::HashSet<&str> = files
        .iter()
        .filter_map(|f| f.strip_prefix("__").and_then(|r| r.split_once('_')).map(|(rank, _)| rank))
        .collect();
    if ranks.is_empty() { files.len().max(1) } else { ranks.len() }
}

fn check_rank(rank: usize, world: usize) -> Result<()> {
    if rank >= world {
        return Err(Error::unwritable("", format!("rank {rank} of a world of {world}: needs 0 <= rank < world")));
    }
    Ok(())
}
