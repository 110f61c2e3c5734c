//! Writing the serializer's part of a checkpoint, as RecIS's `Saver` (`csrc/serialize/saver.cc`,
//! `save_bundle.cc`) does, byte for byte: per shard, blocks go round robin to `parallel` data files; shard 0
//! merges every shard's index and tensor keys into `index`, `tensorkey.json` and
//! `torch_rank_weights_embs_table_multi_shard.json`.
//!
//! Differences from RecIS, all on the safe side: the save functions ([`save_blocks`], [`save_tables`],
//! [`crate::save`], [`crate::reshard`], [`crate::CheckpointManager::save`]) commit the checkpoint directory
//! whole ([`ckpt_io::DirCommit`]: every shard writes into a staging directory beside it, shard 0
//! merges the metadata and swaps it in), with a checksum manifest `ckpt.checksums.json` (a CRC-32 of every
//! block, which RecIS ignores); shards exchange their metadata through a [`Collective`] instead of polling
//! the file system every 100 s (so there is no deadlock when a shard has fewer blocks than `parallel`);
//! `index` is written last, so its presence means the other files are complete; names, dtypes and duplicate
//! blocks that RecIS would write but could not load back are rejected; bool tensors are written as `BOOL`.
//! The building blocks [`write_shard_files`] and [`write_meta`] write into an existing directory, each file
//! atomically, for callers with a commit protocol of their own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt_collective::{Collective, SingleProcess};
use ckpt_io::{CommitError, DirCommit, DirOptions, Durability, DurableWriter, MANIFEST_NAME};
use ckpt_tensor::{DType, Tensor};
use rayon::prelude::*;
use serde_json::{Value as Json, json};

use crate::data_file;
use crate::dtype;
use crate::error::{Error, NameRule, Result};
use crate::files::{EXTRA_FILE, IO_STATE_COUNT_FILE, MODEL_FILE};
use crate::index::{INDEX_FILE, Index};
use crate::name::{
    BlockSlice, DEFAULT_SLICE_SIZE, ID_SLOT, Shard, SliceInfo, block_name, check_name, data_file_name, dense_key,
    parse_data_file_name, part_name, slot_tensor_name, split_tensor_name,
};
use crate::table::HashTable;
use crate::tensorkey::{TENSORKEY_FILE, TensorKey};
use crate::torch_rank::{self, RankEntry, TORCH_RANK_FILE};

/// Options for writing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteOptions {
    /// Data files per shard (RecIS's `parallel` / `concurrency`); blocks are dealt to them round robin and
    /// they are written in parallel. Default 4, as RecIS's checkpoint manager.
    pub parallel: usize,
    /// Also write `torch_rank_weights_embs_table_multi_shard.json` (informational; RecIS never reads it).
    /// Default `true`.
    pub torch_rank_json: bool,
    /// [`crate::save`]: the number of shards to write, as many as RecIS workers (default 1). A save through
    /// a collective writes one shard per rank and ignores this.
    pub world_size: usize,
    /// [`crate::save`]: the id key space (`slice_size`) of every hash table it builds (default
    /// [`DEFAULT_SLICE_SIZE`], RecIS's).
    pub slice_size: u32,
    /// How durably the checkpoint is written: `checksums` writes `ckpt.checksums.json` beside the
    /// checkpoint's files (a CRC-32 of every block of every data file and of every record of the
    /// `torch.save` files, computed while writing; RecIS ignores the file); `sync` `fdatasync`s every file
    /// and fsyncs the directories (off, a commit stays atomic for readers, but a power failure may lose the
    /// new checkpoint); `direct_io` writes large data files with `O_DIRECT`.
    pub durability: Durability,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            parallel: 4,
            torch_rank_json: true,
            world_size: 1,
            slice_size: DEFAULT_SLICE_SIZE,
            durability: Durability::default(),
        }
    }
}

impl WriteOptions {
    /// These options with `parallel` data files per shard.
    #[must_use]
    pub fn with_parallel(mut self, parallel: usize) -> Self {
        self.parallel = parallel;
        self
    }

    /// These options, writing the torch-rank JSON or not.
    #[must_use]
    pub fn with_torch_rank_json(mut self, write: bool) -> Self {
        self.torch_rank_json = write;
        self
    }

    /// These options with `world_size` shards ([`crate::save`]).
    #[must_use]
    pub fn with_world_size(mut self, world_size: usize) -> Self {
        self.world_size = world_size;
        self
    }

    /// These options with `slice_size` as every built table's id key space ([`crate::save`]).
    #[must_use]
    pub fn with_slice_size(mut self, slice_size: u32) -> Self {
        self.slice_size = slice_size;
        self
    }

    /// These options with `durability` ([`WriteOptions::durability`]).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The directory commit of a save: whole checkpoints (`owned`: [`is_checkpoint_file`]) or the
    /// serializer's part alone ([`is_sparse_file`]); other files of an existing destination are carried over.
    pub(crate) fn dir_options(&self, owned: fn(&str) -> bool) -> DirOptions {
        DirOptions::default().with_durability(self.durability).with_layout(OBJECT_LAYOUT).with_owned(owned)
    }
}

/// Whether `name` is a file of the serializer's part of a checkpoint directory (a data file, `index`,
/// `tensorkey.json`, the torch-rank JSON) or the checksum manifest.
pub(crate) fn is_sparse_file(name: &str) -> bool {
    parse_data_file_name(name).is_some() || [INDEX_FILE, TENSORKEY_FILE, TORCH_RANK_FILE, MANIFEST_NAME].contains(&name)
}

/// Whether `name` is a file of a RecIS checkpoint directory: the serializer's part, `model.pt`, `extra.pt`,
/// `io_state_<s>.pt`, `io_state_count`, the checksum manifest.
pub(crate) fn is_checkpoint_file(name: &str) -> bool {
    let io_state = name
        .strip_prefix("io_state_")
        .and_then(|n| n.strip_suffix(".pt"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()));
    is_sparse_file(name) || io_state || [MODEL_FILE, EXTRA_FILE, IO_STATE_COUNT_FILE].contains(&name)
}

/// How a RecIS checkpoint directory lies on an object store: its files, and the `index` written last
/// (the reader starts from it). A manager's root rewrites its `checkpoint` list after that, as on disk.
pub const OBJECT_LAYOUT: ckpt_io::storage::ObjectLayout = ckpt_io::storage::ObjectLayout {
    format: "recis",
    owned: is_checkpoint_file,
    commit_points: &[crate::index::INDEX_FILE],
};

/// Where a writer puts a checkpoint's files: an existing directory, each file committed on its own
/// ([`ckpt_io::write_file`]), or the staging directory of a directory commit.
#[derive(Clone, Copy)]
pub(crate) enum Target<'a> {
    /// An existing directory.
    Dir(&'a Path),
    /// A directory commit's staging directory.
    Staged(&'a DirCommit),
}

impl Target<'_> {
    /// The path `name` will have in the checkpoint (what errors name).
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        match self {
            Target::Dir(dir) => dir.join(name),
            Target::Staged(c) => c.target().join(name),
        }
    }

    /// Writes the file `name` through `write`.
    pub(crate) fn write(&self, name: &str, write: impl FnOnce(&mut DurableWriter) -> Result<()>) -> Result<()> {
        match self {
            Target::Dir(dir) => ckpt_io::write_file(&dir.join(name), &ckpt_io::FileOptions::default(), write)
                .map(|_| ())
                .map_err(|e| match e {
                    Error::Core(c) => data_file::from_core(c),
                    e => e,
                }),
            Target::Staged(c) => {
                let mut file = c.create_file(name).map_err(from_commit)?;
                let written = write(file.writer());
                if let Some(e) = file.writer().io_error() {
                    return Err(from_commit(CommitError::from_io(file.path(), e)));
                }
                written?;
                file.finish().map(|_| ()).map_err(from_commit)
            }
        }
    }
}

/// A commit error as this crate's: another rank's failure is [`Error::ShardFailed`].
pub(crate) fn from_commit(e: CommitError) -> Error {
    match e {
        CommitError::RankFailed { rank, message } => Error::ShardFailed { shard: rank, message },
        e => data_file::from_core(e.into()),
    }
}

/// The end of a multi-shard directory commit: every rank sends its metadata (or its error) to rank 0,
/// which merges them into `index`, `tensorkey.json` and the torch-rank JSON in the staging directory and
/// swaps the directory in; every rank returns the same verdict (its own error first).
pub(crate) fn commit_shards(
    commit: DirCommit,
    group: &dyn Collective,
    local: Result<ShardMeta>,
    options: &WriteOptions,
) -> Result<()> {
    let payload = match &local {
        Ok(m) => Ok(m.to_bytes()),
        // As its message (a RankFailure): it crosses the process group as bytes (the other ranks report it as a
        // rank failure); this rank returns its own error, source intact.
        Err(e) => Err(ckpt_io::RankFailure::from(e)),
    };
    let mut failure = None;
    let committed = commit.commit_gathered(group, payload, |c, payloads| {
        let metas = payloads.iter().map(|p| ShardMeta::from_bytes(p)).collect::<Result<Vec<_>>>();
        finalize(c, metas.and_then(|m| write_meta_to(Target::Staged(c), &m, options)), &mut failure)
    });
    local?;
    committed.map_err(|e| failure.unwrap_or_else(|| from_commit(e)))
}

/// Commits `dir` whole from this one process: `write` puts every shard's files into the staging directory
/// and returns their metadata, merged into `index` (last), `tensorkey.json` and the torch-rank JSON.
pub(crate) fn commit_local(
    dir: &Path,
    options: &WriteOptions,
    owned: fn(&str) -> bool,
    write: impl FnOnce(Target<'_>) -> Result<Vec<ShardMeta>>,
) -> Result<()> {
    let commit = DirCommit::begin(dir, &SingleProcess, &options.dir_options(owned)).map_err(from_commit)?;
    let metas = write(Target::Staged(&commit))?; // on error the commit, dropped, removes its staging directory
    let mut failure = None;
    let committed = commit.commit(&SingleProcess, Ok(()), |c| {
        finalize(c, write_meta_to(Target::Staged(c), &metas, options), &mut failure)
    });
    committed.map_err(|e| failure.unwrap_or_else(|| from_commit(e)))
}

/// The outcome of a commit's `finalize` step; this crate's error is kept in `failure` (the commit reports it
/// as refused) so that the save returns it.
fn finalize(commit: &DirCommit, r: Result<()>, failure: &mut Option<Error>) -> std::result::Result<(), CommitError> {
    r.map_err(|e| {
        // The commit's `Refused` takes text; the error itself, source intact, is kept in `failure` and returned.
        let reason = e.to_string();
        *failure = Some(e);
        CommitError::Refused { path: commit.target().to_path_buf(), reason }
    })
}

/// One block to write: an internal tensor name (`child@slot`, or a dense name), its slice, and its data.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    tensor_name: String,
    slice: BlockSlice,
    tensor: Tensor,
}

impl Block {
    /// The block of slot `slot` (or `id`) of table child `child`, holding `slice`.
    ///
    /// # Errors
    /// [`Error::BadName`] for names RecIS could not load back; [`Error::UnsupportedDtype`].
    pub fn table(child: &str, slot: &str, slice: SliceInfo, tensor: Tensor) -> Result<Self> {
        check_name(child, "table")?;
        check_name(slot, "slot")?;
        if slot.contains('@') {
            return Err(Error::BadName { name: slot.into(), rule: NameRule::SlotWithAt });
        }
        let tensor_name = slot_tensor_name(child, slot);
        dtype::to_header(tensor.dtype(), &tensor_name)?;
        Ok(Block { tensor_name, slice: BlockSlice::Table(slice), tensor })
    }

    /// A dense tensor block (written only by shard 0, under the key `name^ `).
    ///
    /// # Errors
    /// [`Error::BadName`] for a name containing `^` or `/part_` (RecIS would write a key its loader cannot
    /// find); [`Error::UnsupportedDtype`].
    pub fn dense(name: &str, tensor: Tensor) -> Result<Self> {
        check_name(name, "tensor")?;
        if name.contains("/part_") {
            return Err(Error::BadName { name: name.into(), rule: NameRule::DensePart });
        }
        dtype::to_header(tensor.dtype(), name)?;
        Ok(Block { tensor_name: name.into(), slice: BlockSlice::Dense, tensor })
    }

    /// The internal tensor name (`tbl@embedding`, `w`).
    pub fn tensor_name(&self) -> &str {
        &self.tensor_name
    }

    /// The slice (dense or a table slice).
    pub fn slice(&self) -> BlockSlice {
        self.slice
    }

    /// The data.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Whether this is a dense block.
    pub fn is_dense(&self) -> bool {
        self.slice == BlockSlice::Dense
    }

    /// The internal block name (`tbl@embedding^00000@32768@65536`, `w^ `).
    pub fn block_name(&self) -> String {
        block_name(&self.tensor_name, &self.slice)
    }

    /// The on-disk key this block gets when `shard` writes it: a part name, or `name^ `.
    pub fn key(&self, shard: Shard) -> String {
        match self.slice {
            BlockSlice::Dense => dense_key(&self.tensor_name),
            BlockSlice::Table(_) => part_name(&self.tensor_name, shard),
        }
    }
}

/// A table's blocks in RecIS's order: for each child, its id block, then one block per slot.
///
/// # Errors
/// [`Error::BadName`] or [`Error::UnsupportedDtype`] from [`Block::table`].
pub fn table_blocks(table: &HashTable) -> Result<Vec<Block>> {
    let slice = table.slice();
    let mut out = Vec::new();
    for child in table.children() {
        out.push(Block::table(child.name(), ID_SLOT, slice, child.id_tensor().clone())?);
        for s in child.slots() {
            out.push(Block::table(child.name(), s.name(), slice, s.tensor().clone())?);
        }
    }
    Ok(out)
}

/// The blocks one shard writes, in RecIS's order (`Saver::MakeWriteBlocks`): every table's blocks in
/// table order, then, on shard 0 only, the dense tensors in order (other shards drop theirs, as RecIS does).
///
/// # Errors
/// As [`table_blocks`] and [`Block::dense`].
pub fn shard_blocks(tables: &[HashTable], dense: &[(String, Tensor)], shard: Shard) -> Result<Vec<Block>> {
    let mut out = Vec::new();
    for t in tables {
        out.extend(table_blocks(t)?);
    }
    if shard.index() == 0 {
        for (name, t) in dense {
            out.push(Block::dense(name, t.clone())?);
        }
    }
    Ok(out)
}

/// What one shard wrote, for shard 0 to merge: its index (local file ids), its tensor keys, and its
/// header entries (for the torch-rank JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct ShardMeta {
    /// The shard.
    pub shard: Shard,
    /// The shard's index: its data files with local ids `0..`, in order of first use.
    pub index: Index,
    /// Part name → internal block name for the shard's table blocks.
    pub tensorkey: TensorKey,
    /// Every block written, with its offsets.
    pub entries: Vec<RankEntry>,
}

impl ShardMeta {
    /// Serializes for exchange between shards.
    pub fn to_bytes(&self) -> Vec<u8> {
        let entries: Vec<Json> = self
            .entries
            .iter()
            .map(|e| json!([e.key, e.dtype, e.shape, [e.data_offsets.0, e.data_offsets.1], e.dense]))
            .collect();
        json!({
            "shard": [self.shard.index(), self.shard.num()],
            "index": self.index.to_json(),
            "tensorkey": self.tensorkey.map,
            "entries": entries,
        })
        .to_string()
        .into_bytes()
    }

    /// Parses [`ShardMeta::to_bytes`] output.
    ///
    /// # Errors
    /// [`Error::BadShardMeta`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = |what: &str| Error::BadShardMeta(format!("cannot decode a shard's metadata: {what}"));
        let j: Json = serde_json::from_slice(bytes).map_err(|e| bad(&e.to_string()))?;
        let uint = |v: &Json| v.as_u64().and_then(|n| usize::try_from(n).ok());
        let shard = j.get("shard").and_then(Json::as_array).ok_or_else(|| bad("shard"))?;
        let (Some(i), Some(n)) = (shard.first().and_then(uint), shard.get(1).and_then(uint)) else {
            return Err(bad("shard"));
        };
        let shard = Shard::new(i, n)?;
        let index_text = j.get("index").and_then(Json::as_str).ok_or_else(|| bad("index"))?;
        let index = Index::parse(index_text.as_bytes(), Path::new(INDEX_FILE))?;
        let tk = j.get("tensorkey").map(Json::to_string).ok_or_else(|| bad("tensorkey"))?;
        let tensorkey = TensorKey::parse(tk.as_bytes(), Path::new(TENSORKEY_FILE))?;
        let mut entries = Vec::new();
        for e in j.get("entries").and_then(Json::as_array).ok_or_else(|| bad("entries"))? {
            let a = e.as_array().ok_or_else(|| bad("entry"))?;
            let key = a.first().and_then(Json::as_str).ok_or_else(|| bad("entry key"))?;
            let dtype = a.get(1).and_then(Json::as_str).ok_or_else(|| bad("entry dtype"))?;
            let shape = a
                .get(2)
                .and_then(Json::as_array)
                .and_then(|s| s.iter().map(uint).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad("entry shape"))?;
            let off = a.get(3).and_then(Json::as_array).ok_or_else(|| bad("entry offsets"))?;
            let (Some(b), Some(end)) = (off.first().and_then(uint), off.get(1).and_then(uint)) else {
                return Err(bad("entry offsets"));
            };
            let dense = a.get(4).and_then(Json::as_bool).ok_or_else(|| bad("entry dense"))?;
            entries.push(RankEntry { key: key.into(), dtype: dtype.into(), shape, data_offsets: (b, end), dense });
        }
        Ok(ShardMeta { shard, index, tensorkey, entries })
    }
}

/// Writes one shard's data files into `dir` (which must exist): block k goes to writer `k % parallel`,
/// writer i writes `model-{shard*parallel+i:06}-of-{shards*parallel:06}.safetensors` (writers without blocks
/// write nothing), all writers in parallel, each file atomically. Returns the shard's metadata for
/// [`write_meta`].
///
/// # Errors
/// [`Error::ZeroParallel`] for `parallel` 0; [`Error::DuplicateBlock`] for two blocks with one key;
/// [`Error::Io`].
pub fn write_shard_files(dir: &Path, shard: Shard, parallel: usize, blocks: &[Block]) -> Result<ShardMeta> {
    write_shard_files_to(Target::Dir(dir), shard, parallel, blocks)
}

/// [`write_shard_files`] into a [`Target`].
pub(crate) fn write_shard_files_to(
    target: Target<'_>,
    shard: Shard,
    parallel: usize,
    blocks: &[Block],
) -> Result<ShardMeta> {
    if parallel == 0 {
        return Err(Error::ZeroParallel);
    }
    let total = parallel.checked_mul(shard.num()).ok_or(Error::TooManyFiles { parallel, shards: shard.num() })?;
    check_tables(blocks)?;
    let mut tensorkey = TensorKey::default();
    let mut index = Index::default();
    let mut writers: Vec<Vec<(String, Tensor)>> = vec![Vec::new(); parallel.min(blocks.len())];
    let mut seen = std::collections::HashSet::new();
    for (k, b) in blocks.iter().enumerate() {
        let key = b.key(shard);
        if !seen.insert(key.clone()) {
            return Err(Error::DuplicateBlock { key, detail: format!("twice in shard {}", shard.index()) });
        }
        if !b.is_dense() {
            tensorkey.map.insert(key.clone(), b.block_name());
        }
        let w = k % parallel;
        let file = data_file_name(shard.index() * parallel + w, total);
        let next = index.file_index.len() as u64;
        let id = *index.file_index.entry(file).or_insert(next);
        index.block_index.insert(key.clone(), id);
        if let Some(list) = writers.get_mut(w) {
            list.push((key, b.tensor.clone()));
        }
    }
    let results: Vec<Result<Vec<RankEntry>>> = writers
        .par_iter()
        .enumerate()
        .map(|(w, list)| {
            let name = data_file_name(shard.index() * parallel + w, total);
            target.write(&name, |out| data_file::write_to(out, &target.path(&name), list).map(|_| ()))?;
            let mut offset = 0;
            let mut entries = Vec::with_capacity(list.len());
            for ((key, t), b) in list.iter().zip(blocks.iter().skip(w).step_by(parallel)) {
                let end = offset + t.nbytes();
                entries.push(RankEntry {
                    key: key.clone(),
                    dtype: dtype::to_header(t.dtype(), key)?.into(),
                    shape: t.shape().to_vec(),
                    data_offsets: (offset, end),
                    dense: b.is_dense(),
                });
                offset = end;
            }
            Ok(entries)
        })
        .collect();
    let mut entries = Vec::new();
    for r in results {
        entries.extend(r?);
    }
    Ok(ShardMeta { shard, index, tensorkey, entries })
}

/// Every table slice among `blocks` must load back: an int64 1-D id block, at least one slot block, every
/// slot with one row per id.
fn check_tables(blocks: &[Block]) -> Result<()> {
    /// (child, slice string) → (id block, slot blocks).
    type Groups<'a> = BTreeMap<(&'a str, String), (Option<&'a Tensor>, Vec<(&'a str, &'a Tensor)>)>;
    let mut groups: Groups = BTreeMap::new();
    for b in blocks {
        let BlockSlice::Table(slice) = b.slice else {
            continue;
        };
        let (child, slot) = split_tensor_name(&b.tensor_name)?;
        let g = groups.entry((child, slice.to_string())).or_default();
        if slot == ID_SLOT {
            g.0 = Some(&b.tensor);
        } else {
            g.1.push((slot, &b.tensor));
        }
    }
    for ((child, slice), (ids, slots)) in groups {
        let ids = ids.ok_or_else(|| Error::MissingIdBlock { child: child.into(), slice: slice.clone() })?;
        if ids.dtype() != DType::I64 || ids.dim() != 1 {
            return Err(Error::BadIdBlock {
                child: child.into(),
                slice,
                dtype: ids.dtype(),
                shape: ids.shape().to_vec(),
            });
        }
        if slots.is_empty() {
            return Err(Error::NoSlotBlocks { child: child.into(), slice });
        }
        for (slot, t) in slots {
            let rows = t.shape().first().copied().unwrap_or(0);
            if t.dim() == 0 || rows != ids.numel() {
                return Err(Error::RowCountMismatch {
                    child: child.into(),
                    slice,
                    ids: ids.numel(),
                    slot: slot.into(),
                    rows,
                });
            }
        }
    }
    Ok(())
}

/// Merges every shard's metadata (in shard order, as RecIS's shard 0 does when all shards' files are
/// present) and writes `tensorkey.json`, the torch-rank JSON (if asked) and, last, `index`, each atomically.
///
/// # Errors
/// [`Error::BadShardMeta`] unless `metas` are shards `0..n` of `n`, in order; [`Error::DuplicateBlock`] if
/// two shards wrote one block or one table slice; [`Error::Io`].
pub fn write_meta(dir: &Path, metas: &[ShardMeta], options: &WriteOptions) -> Result<()> {
    write_meta_to(Target::Dir(dir), metas, options)
}

/// [`write_meta`] into a [`Target`].
pub(crate) fn write_meta_to(target: Target<'_>, metas: &[ShardMeta], options: &WriteOptions) -> Result<()> {
    let n = metas.len();
    for (i, m) in metas.iter().enumerate() {
        if m.shard.index() != i || m.shard.num() != n {
            return Err(Error::BadShardMeta(format!(
                "expected shards 0..{n} of {n} in order, got shard {} of {} at position {i}",
                m.shard.index(),
                m.shard.num()
            )));
        }
    }
    let mut index = Index::default();
    let mut tensorkey = TensorKey::default();
    let mut entries = Vec::new();
    for m in metas {
        index.merge_from(&m.index)?;
        tensorkey.merge_from(&m.tensorkey)?;
        entries.extend(m.entries.iter().cloned());
    }
    write_text(target, TENSORKEY_FILE, &tensorkey.to_json())?;
    if options.torch_rank_json {
        write_text(target, TORCH_RANK_FILE, &torch_rank::to_json(&entries))?;
    }
    write_text(target, INDEX_FILE, &index.to_json())
}

/// Writes `text` as the file `name` of `target`.
pub(crate) fn write_text(target: Target<'_>, name: &str, text: &str) -> Result<()> {
    target.write(name, |w| {
        w.mark(name);
        std::io::Write::write_all(w, text.as_bytes()).map_err(|e| Error::io(target.path(name), e))
    })
}

/// Saves this rank's blocks as shard `collective.rank()` of `collective.world_size()` in `dir`, committed as
/// a whole ([`ckpt_io::DirCommit`]): every rank writes its data files into the staging directory
/// beside `dir`, then rank 0 merges every shard's metadata, writes `index`, `tensorkey.json`, the torch-rank
/// JSON and the checksum manifest there, and swaps it in. Every rank returns once the checkpoint is
/// committed, with the same outcome (a failure on any rank is reported on every rank, and no rank waits for
/// ever). Files of an existing `dir` other than the serializer's (`model.pt`, ...) are carried over.
///
/// Blocks must be in RecIS's order for RecIS-identical files ([`shard_blocks`] builds them); dense blocks
/// are written only by rank 0, as in RecIS.
///
/// # Errors
/// This rank's own error, or [`Error::ShardFailed`] naming the rank that failed; the commit's errors
/// (`Error::Core` holding a `ckpt_io::CommitError`: the destination locked by another save, a full disk, ...).
pub fn save_blocks(blocks: &[Block], dir: &Path, options: &WriteOptions, group: &dyn Collective) -> Result<()> {
    let group: &dyn Collective = &group;
    let commit = DirCommit::begin(dir, group, &options.dir_options(is_sparse_file)).map_err(from_commit)?;
    let local = Shard::new(group.rank(), group.world_size()).and_then(|shard| {
        let blocks: Vec<Block> = blocks.iter().filter(|b| shard.index() == 0 || !b.is_dense()).cloned().collect();
        write_shard_files_to(Target::Staged(&commit), shard, options.parallel, &blocks)
    });
    commit_shards(commit, group, local, options)
}

/// Saves hash tables and dense tensors as shard `collective.rank()`: [`shard_blocks`] then [`save_blocks`].
///
/// # Errors
/// As [`save_blocks`].
pub fn save_tables(
    tables: &[HashTable],
    dense: &[(String, Tensor)],
    dir: &Path,
    options: &WriteOptions,
    group: &dyn Collective,
) -> Result<()> {
    let group: &dyn Collective = &group;
    let commit = DirCommit::begin(dir, group, &options.dir_options(is_sparse_file)).map_err(from_commit)?;
    let local = Shard::new(group.rank(), group.world_size()).and_then(|shard| {
        let blocks = shard_blocks(tables, dense, shard)?;
        write_shard_files_to(Target::Staged(&commit), shard, options.parallel, &blocks)
    });
    commit_shards(commit, group, local, options)
}
