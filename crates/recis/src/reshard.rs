//! Resharding: any shard count into any other, with RecIS's loader rule.
//!
//! A shard r of N holds, of every child table, the ids `x` with `partition(x)` in `gen_slice(r, N,
//! slice_size)`; with [`IdPartition::Unsigned`] that is `(x as u64) % slice_size`, what RecIS's loader
//! keeps (`MarkIdAcceptable`). Every source slice is scanned, so every id lands in exactly one target shard
//! whatever rule placed it in the source (see [`SparseCheckpoint::load_child`] and [`IdPartition`] on
//! negative ids). Dense blocks go to shard 0. `slice_size` is kept per table.

use std::path::Path;

use ckpt_collective::Collective;
use ckpt_io::DirCommit;
use ckpt_io::{ReshardReport, SaveReport};
use ckpt_tensor::Tensor;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::name::{IdPartition, Shard, gen_slice};
use crate::options::ReadOptions;
use crate::sparse::SparseCheckpoint;
use crate::table::{HashTable, TableChild};
use crate::writer::{
    ShardMeta, Target, WriteOptions, commit_local, commit_shards, from_commit, is_checkpoint_file, is_sparse_file,
    shard_blocks, write_shard_files_to,
};

/// Options of a reshard.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReshardOptions {
    /// How the new shards are written.
    pub write: WriteOptions,
    /// The partition rule deciding which new shard holds an id.
    pub partition: IdPartition,
    /// How the source is read (its data files' header bound; its `torch.save` files are copied as bytes).
    pub read: ReadOptions,
}

impl ReshardOptions {
    /// These options with `partition`.
    #[must_use]
    pub fn with_partition(mut self, partition: IdPartition) -> Self {
        self.partition = partition;
        self
    }

    /// These options with `read` as how the source is read.
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

/// What shard `shard` of a new job loads from `src`: every child table restricted to the shard's slice
/// (`gen_slice(shard, shards, slice_size)` of the table's own `slice_size`), in child order.
///
/// # Errors
/// As [`SparseCheckpoint::load_child`].
pub fn load_shard(src: &SparseCheckpoint, shard: Shard, partition: IdPartition) -> Result<Vec<HashTable>> {
    src.children()
        .iter()
        .map(|child| {
            let size = src.slice_size(child)?;
            let slice = gen_slice(shard.index(), shard.num(), size)?;
            let table: TableChild = src.load_child(child, slice, partition)?;
            Ok(HashTable::single(slice, table))
        })
        .collect()
}

/// Writes `src`'s tables and dense blocks into `dst` as `shards` shards, each holding its [`load_shard`]
/// part, shards written in parallel, the directory committed whole (staged beside `dst` and swapped in;
/// files of an existing `dst` other than the serializer's are carried over).
///
/// # Errors
/// [`Error::ZeroShards`] for 0 shards; as [`load_shard`] and [`write_sharded`]; the commit's errors.
pub fn reshard_sparse(src: &SparseCheckpoint, dst: &Path, shards: usize, options: &ReshardOptions) -> Result<()> {
    if shards == 0 {
        return Err(Error::ZeroShards { action: "resharding into" });
    }
    commit_local(dst, &options.write, is_sparse_file, |target| reshard_sparse_to(target, src, shards, options))
}

fn reshard_sparse_to(
    target: Target<'_>,
    src: &SparseCheckpoint,
    shards: usize,
    options: &ReshardOptions,
) -> Result<Vec<ShardMeta>> {
    let dense: Vec<(String, Tensor)> =
        src.dense_names().into_iter().map(|n| Ok((n.to_owned(), src.dense(n)?))).collect::<Result<_>>()?;
    (0..shards)
        .into_par_iter()
        .map(|r| {
            let shard = Shard::new(r, shards)?;
            let tables = load_shard(src, shard, options.partition)?;
            let blocks = shard_blocks(&tables, &dense, shard)?;
            write_shard_files_to(target, shard, options.write.parallel, &blocks)
        })
        .collect()
}

/// Writes whole tables (each child with its `slice_size`) and dense tensors into `dst` as `shards` shards:
/// shard r holds, of every child, the ids whose partition value lies in `gen_slice(r, shards, slice_size)`
/// (under `options.partition`), and shard 0 the dense tensors — what `shards` RecIS workers holding these
/// tables would save. Shards are written in parallel; the directory is committed whole (staged beside `dst`
/// and swapped in; files of an existing `dst` other than the serializer's are carried over).
///
/// ```
/// use ckpt_tensor::Tensor;
/// use ckpt_recis::{ReshardOptions, Slot, SparseCheckpoint};
/// use ckpt_recis::write_sharded;
/// use ckpt_recis::table::TableChild;
/// let dir = tempfile::tempdir().unwrap();
/// let emb = Tensor::from_slice(&[0.0f32, 1.0, 2.0], &[3, 1]).unwrap();
/// let tbl = TableChild::new("tbl", vec![7, 40000, 3], vec![Slot::new("embedding", emb).unwrap()]).unwrap();
/// write_sharded(dir.path(), &[(tbl, 65536)], &[], 2, &ReshardOptions::default()).unwrap();
/// let ck = SparseCheckpoint::open(dir.path()).unwrap();
/// assert_eq!(ck.shard_num(), Some(2));
/// assert_eq!(ck.child("tbl").unwrap().len(), 3);
/// ```
///
/// # Errors
/// [`Error::ZeroShards`] for 0 shards; [`Error::BadSlice`] for a bad `slice_size`; as
/// [`write_shard_files`](crate::writer::write_shard_files) and [`write_meta`](crate::writer::write_meta); the commit's errors.
pub fn write_sharded(
    dst: &Path,
    tables: &[(TableChild, u32)],
    dense: &[(String, Tensor)],
    shards: usize,
    options: &ReshardOptions,
) -> Result<()> {
    if shards == 0 {
        return Err(Error::ZeroShards { action: "writing" });
    }
    commit_local(dst, &options.write, is_sparse_file, |target| write_sharded_to(target, tables, dense, shards, options))
}

/// [`write_sharded`] into a [`Target`]; returns every shard's metadata (for `index`, written by the caller).
pub(crate) fn write_sharded_to(
    target: Target<'_>,
    tables: &[(TableChild, u32)],
    dense: &[(String, Tensor)],
    shards: usize,
    options: &ReshardOptions,
) -> Result<Vec<ShardMeta>> {
    if shards == 0 {
        return Err(Error::ZeroShards { action: "writing" });
    }
    (0..shards)
        .into_par_iter()
        .map(|r| write_shard_to(target, tables, dense, Shard::new(r, shards)?, options))
        .collect()
}

/// Shard `shard` of [`write_sharded_to`]: of every child the ids of the shard's slice (their rows copied
/// once, the others never touched), and on shard 0 the dense tensors.
pub(crate) fn write_shard_to(
    target: Target<'_>,
    tables: &[(TableChild, u32)],
    dense: &[(String, Tensor)],
    shard: Shard,
    options: &ReshardOptions,
) -> Result<ShardMeta> {
    let parts = tables
        .iter()
        .map(|(child, size)| {
            let slice = gen_slice(shard.index(), shard.num(), *size)?;
            let part = child.filter(|id| slice.holds(id, options.partition))?;
            Ok(HashTable::single(slice, part))
        })
        .collect::<Result<Vec<_>>>()?;
    let blocks = shard_blocks(&parts, dense, shard)?;
    write_shard_files_to(target, shard, options.write.parallel, &blocks)
}

/// Reshards a whole checkpoint directory: the sparse part as [`reshard_sparse`] does, and `model.pt` and
/// `extra.pt` copied unchanged, into one directory commit (staged beside `dst` and swapped in whole). Io
/// states are not copied: they belong to the old workers, and RecIS refuses to load them with another
/// worker count. `src` may be an output root: its latest checkpoint is resharded ([`crate::checkpoint_dir`]).
/// `dst` may be `src` itself: the source stays mapped until the new directory is in place.
///
/// # Errors
/// As [`reshard_sparse`] and [`crate::checkpoint_dir`], plus [`Error::Io`].
pub fn reshard(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    world_size: usize,
    options: &ReshardOptions,
) -> Result<ReshardReport> {
    let dst = dst.as_ref();
    let (given, src) = (src.as_ref(), &crate::manager::checkpoint_dir(src.as_ref())?);
    if world_size == 0 {
        return Err(Error::ZeroShards { action: "resharding into" });
    }
    let read = options.read.for_dir(given, src);
    let sparse = open_sparse(src, &read)?;
    // The dense files, opened before anything is written (so that an in-place reshard copies the old ones).
    let dense_files = open_dense_files(src, &read)?;
    let counts = sparse_counts(&sparse);
    commit_local(dst, &options.write, is_checkpoint_file, |target| {
        let metas = reshard_sparse_to(target, &sparse, world_size, options)?;
        copy_dense_files(target, dense_files)?;
        Ok(metas)
    })?;
    Ok(reshard_report(&sparse, world_size, counts, dst))
}

/// The tensors (every table slot and dense tensor of the serializer's part) and their bytes.
fn sparse_counts(sparse: &SparseCheckpoint) -> SaveReport {
    let mut counts = SaveReport::default();
    for name in sparse.tensor_names() {
        if let Some((dtype, shape)) = sparse.tensor_info(name) {
            counts.tensors += 1;
            let numel = ckpt_tensor::checked_numel(&shape).unwrap_or(0) as u64;
            counts.bytes = counts.bytes.saturating_add(numel.saturating_mul(dtype.size() as u64));
        }
    }
    counts
}

/// The report of a reshard of `sparse` into `world_size` shards in the committed directory `dst`.
fn reshard_report(sparse: &SparseCheckpoint, world_size: usize, counts: SaveReport, dst: &Path) -> ReshardReport {
    let saved = counts.with_files(ckpt_io::owned_files(dst, is_checkpoint_file));
    ReshardReport::new(sparse.shard_num().unwrap_or(0), world_size, saved)
}

/// [`reshard`] as one rank of a job of `collective.world_size()` ranks, one call per rank (threads, processes
/// under MPI, [`ckpt_collective::host_ranks`]): rank `r` reads from `src` only the ids of the new shard `r`'s slice
/// and their rows ([`load_shard`]) and writes shard `r`'s data files into the staging directory beside `dst`;
/// rank 0 also copies `model.pt` and `extra.pt`, then, once every rank's files are durable, merges every
/// shard's metadata into `index` (last), `tensorkey.json` and the torch-rank JSON and commits the directory
/// whole. The files are those of [`reshard`] into `collective.world_size()` shards, byte for byte. Every rank
/// returns the same verdict: a failure on any rank is an error on every rank, none is left waiting.
///
/// ```
/// use ckpt_collective::{Collective, ThreadGroup};
/// # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/recis/golden/two_shard_adamw");
/// let dir = tempfile::tempdir().unwrap();
/// let (one, three) = (dir.path().join("one"), dir.path().join("three"));
/// let options = ckpt_recis::ReshardOptions::default();
/// ckpt_recis::reshard(fixture, &one, 3, &options).unwrap();
/// std::thread::scope(|s| {
///     for g in ThreadGroup::new(3) {
///         let (three, options) = (&three, &options);
///         s.spawn(move || ckpt_recis::reshard_rank(fixture, three, options, &g).unwrap());
///     }
/// });
/// for f in ["index", "tensorkey.json", "model-000002-of-000012.safetensors"] {
///     assert_eq!(std::fs::read(one.join(f)).unwrap(), std::fs::read(three.join(f)).unwrap(), "{f}");
/// }
/// ```
///
/// # Errors
/// As [`reshard`]; [`Error::ShardFailed`] naming the rank that failed on the others.
pub fn reshard_rank(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &ReshardOptions,
    group: &dyn Collective,
) -> Result<ReshardReport> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let group: &dyn Collective = &group;
    let rank = group.rank();
    // Read before the commit begins, so that an in-place reshard reads the old files.
    let opened = crate::manager::checkpoint_dir(src).and_then(|dir| {
        let read = options.read.for_dir(src, &dir);
        let dense = if rank == 0 { open_dense_files(&dir, &read)? } else { Vec::new() };
        Ok((open_sparse(&dir, &read)?, dense))
    });
    let commit = DirCommit::begin(dst, group, &options.write.dir_options(is_checkpoint_file)).map_err(from_commit)?;
    let target = Target::Staged(&commit);
    let mut source = None;
    let local = opened.and_then(|(sparse, dense_files)| {
        let shard = Shard::new(rank, group.world_size())?;
        let tables = load_shard(&sparse, shard, options.partition)?;
        let dense: Vec<(String, Tensor)> = if rank == 0 {
            sparse.dense_names().into_iter().map(|n| Ok((n.to_owned(), sparse.dense(n)?))).collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let blocks = shard_blocks(&tables, &dense, shard)?;
        let meta = write_shard_files_to(target, shard, options.write.parallel, &blocks)?;
        copy_dense_files(target, dense_files)?;
        source = Some((sparse_counts(&sparse), sparse));
        Ok(meta)
    });
    commit_shards(commit, group, local, &options.write)?;
    let (counts, sparse) = source.unwrap_or_else(|| (SaveReport::default(), SparseCheckpoint::empty(src)));
    Ok(reshard_report(&sparse, group.world_size(), counts, dst))
}

/// The serializer's part of the checkpoint directory `src` (empty without an `index`), accepting data-file
/// headers of at most `options.max_header_len` bytes.
fn open_sparse(src: &Path, options: &ReadOptions) -> Result<SparseCheckpoint> {
    if src.join(crate::index::INDEX_FILE).is_file() {
        SparseCheckpoint::open_with(src, options)
    } else {
        Ok(SparseCheckpoint::empty(src))
    }
}

/// `model.pt` and `extra.pt` of `src`, those it has, opened; in a partial local copy
/// ([`ReadOptions::fill`]), filled whole first (they are copied byte for byte).
fn open_dense_files(
    src: &Path,
    options: &ReadOptions,
) -> Result<Vec<(&'static str, std::path::PathBuf, std::fs::File)>> {
    let mut dense_files = Vec::new();
    for f in [crate::dense::MODEL_FILE, crate::dense::EXTRA_FILE] {
        let from = src.join(f);
        match std::fs::File::open(&from) {
            Ok(file) => {
                if let Some(fill) = &options.fill {
                    let len = file.metadata().map_err(|e| Error::io(&from, e))?.len();
                    fill.fill(&options.fill_name(f), 0..len).map_err(|e| Error::io(&from, e))?;
                }
                dense_files.push((f, from, file));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(from, e)),
        }
    }
    Ok(dense_files)
}

/// Copies [`open_dense_files`]' files into `target` unchanged.
fn copy_dense_files(target: Target<'_>, files: Vec<(&'static str, std::path::PathBuf, std::fs::File)>) -> Result<()> {
    for (name, from, mut file) in files {
        target.write(name, |w| {
            w.mark(name);
            std::io::copy(&mut file, w).map(|_| ()).map_err(|e| Error::io(&from, e))
        })?;
    }
    Ok(())
}
