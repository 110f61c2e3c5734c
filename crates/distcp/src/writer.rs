//! Writing DCP checkpoints like `FileSystemWriter`: every rank writes its own data files (in parallel,
//! tensor bytes straight from memory), the coordinator writes `.metadata`; replicated items are written
//! once.
//!
//! The commit is ckpt-tensor's directory commit ([`ckpt_io::DirCommit`]), not torch's in-place
//! writes: the coordinator locks the destination and creates `.<dir>.ckpt-staging` beside it; every rank
//! writes and `fdatasync`s its `__{rank}_{n}.distcp` files there; after the exchange of write results the
//! coordinator writes `.metadata` and `ckpt.checksums.json` (a CRC-32 per item, computed while writing)
//! into it and swaps it with the destination (`renameat2(RENAME_EXCHANGE)`), then fsyncs the parent. A
//! crash at any point leaves the previous checkpoint or the new one, whole; files in the destination that
//! are not DCP's (anything but `.metadata`, `*.distcp`, `__*.metadata`, the manifest) are carried over.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use ckpt_collective::{Collective, SingleProcess, ThreadGroup};
use ckpt_io::SaveReport;
use ckpt_io::{CommitError, DirCommit, DirOptions, Durability};
use ckpt_tensor::{Tensor, Value};
use rayon::prelude::*;
use serde_json::{Value as Json, json};

use crate::chunks::clone_dense;
use crate::error::{Error, Result};
use crate::metadata::{
    DCP_VERSION, Metadata, MetadataIndex, Profile, StorageInfo, StorageMeta, StorageMetadata, ZSTD_TRANSFORM,
};
use crate::planner::{self, LocalPlan, Payload, ShardSpec};

/// Options for writing (torch's `FileSystemWriter` settings, plus the output profile).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WriteOptions {
    /// The `.metadata` and item layout. Default [`Profile::MaxCompat`] (loads in torch 2.0 to 2.15).
    pub profile: Profile,
    /// `true` (default): each rank writes `thread_count` files; `false`: one file per item.
    pub single_file_per_rank: bool,
    /// Number of data files per rank with `single_file_per_rank` (torch's `thread_count`, default 1);
    /// items are split as torch splits them. The files are written in parallel.
    pub thread_count: usize,
    /// Compress every item with zstd at this level (torch 2.7+'s `_extensions=[ZStandard()]`, descriptor
    /// `stream.zstd/1`). Default `None`. Such checkpoints load in torch 2.7+ only (with `zstandard`).
    pub zstd_level: Option<i32>,
    /// How durably the checkpoint is written: `sync` fsyncs data files, `.metadata.tmp` and the directory
    /// (torch's `sync_files`, default `true`); `checksums` writes `ckpt.checksums.json` (a CRC-32 per item,
    /// computed while writing; torch ignores the file); `direct_io` writes large files with `O_DIRECT`.
    pub durability: Durability,
    /// Replace an existing checkpoint in the directory (torch's `overwrite`, default `true`).
    pub overwrite: bool,
    /// Deduplicate replicated items to the lowest rank (torch's `dedup_save_to_lowest_rank`) instead of
    /// the rank with the fewest bytes so far (torch 2.3+'s default). Default `false`.
    pub dedup_to_lowest_rank: bool,
    /// [`Profile::Torch213`]: the `storage_meta.save_id` to record (default: a random uuid4).
    pub save_id: Option<String>,
    /// [`Profile::Torch213`]: the `storage_meta.checkpoint_id` path to record (default: the directory as
    /// given).
    pub checkpoint_id: Option<String>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            profile: Profile::MaxCompat,
            single_file_per_rank: true,
            thread_count: 1,
            zstd_level: None,
            durability: Durability::default(),
            overwrite: true,
            dedup_to_lowest_rank: false,
            save_id: None,
            checkpoint_id: None,
        }
    }
}

impl WriteOptions {
    /// Sets the profile.
    #[must_use]
    pub fn with_profile(mut self, profile: Profile) -> Self {
        self.profile = profile;
        self
    }

    /// `true` (default): `thread_count` files per rank; `false`: one file per item
    /// (`single_file_per_rank=False`).
    #[must_use]
    pub fn with_single_file_per_rank(mut self, single: bool) -> Self {
        self.single_file_per_rank = single;
        self
    }

    /// `n` data files per rank.
    #[must_use]
    pub fn with_thread_count(mut self, n: usize) -> Self {
        self.thread_count = n;
        self
    }

    /// zstd-compressed items at `level`.
    #[must_use]
    pub fn with_zstd(mut self, level: i32) -> Self {
        self.zstd_level = Some(level);
        self
    }

    /// These options with `durability` ([`WriteOptions::durability`]; torch's `sync_files` is its `sync`).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets `overwrite`.
    #[must_use]
    pub fn with_overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }

    /// Sets `dedup_to_lowest_rank`.
    #[must_use]
    pub fn with_dedup_to_lowest_rank(mut self, lowest: bool) -> Self {
        self.dedup_to_lowest_rank = lowest;
        self
    }

    /// Sets the recorded save id and checkpoint id ([`Profile::Torch213`]).
    #[must_use]
    pub fn with_storage_meta(mut self, save_id: &str, checkpoint_id: &str) -> Self {
        self.save_id = Some(save_id.to_owned());
        self.checkpoint_id = Some(checkpoint_id.to_owned());
        self
    }
}

/// Saves a state dict from one process, like `dcp.save(state_dict, checkpoint_id=dir, no_dist=True)`.
/// Returns what was written ([`save_report`]).
///
/// Keys follow torch 2.4+'s flattening ([`ckpt_tensor::flatten()`]); tensors become one item each, every other
/// leaf a BYTE_IO item (a `torch.save` of the value).
///
/// # Errors
/// [`Error::Unwritable`] for values DCP cannot store; [`Error::AlreadyExists`]; I/O errors naming the
/// path.
pub fn save(state_dict: &Value, dir: impl AsRef<Path>, options: &WriteOptions) -> Result<SaveReport> {
    save_rank(state_dict, &HashMap::new(), dir, options, &SingleProcess)
}

/// What the checkpoint `metadata` describes in the directory `dir`, as a save's report: its data files (in
/// the order items name them) and `.metadata`, its tensors with the bytes of their global shapes, and its
/// other values (BYTE_IO items).
pub fn save_report(metadata: &Metadata, dir: &Path) -> SaveReport {
    let mut report = SaveReport::default();
    for (_, stored) in &metadata.state_dict_metadata {
        match stored {
            StorageMetadata::Tensor(t) => {
                report.tensors += 1;
                report.bytes += t.nbytes().unwrap_or(0) as u64;
            }
            StorageMetadata::Bytes => report.values += 1,
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut files: Vec<std::path::PathBuf> = metadata
        .storage_data
        .iter()
        .filter(|(_, info)| seen.insert(info.relative_path.as_str()))
        .map(|(_, info)| dir.join(&info.relative_path))
        .collect();
    files.push(dir.join(".metadata"));
    report.with_files(files)
}

/// One rank's part of a multi-rank save, like `dcp.save` in every process of a group. Every rank of
/// `group` calls this with its own state dict; `shards` says which of its tensors are chunks of bigger
/// tensors (keyed by flattened key; a tensor not listed is whole, and if several ranks hold it, it is
/// written once). Rank 0 writes `.metadata` after all data files are durable. Every rank returns the
/// report of the whole checkpoint ([`save_report`]).
///
/// ```
/// use std::collections::HashMap;
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_collective::{Collective, ThreadGroup};
/// use ckpt_distcp::{DcpReader, ShardSpec, WriteOptions, save_rank, shard_box};
/// let dir = tempfile::tempdir().unwrap();
/// let full: Vec<f32> = (0..10).map(|i| i as f32).collect();
/// std::thread::scope(|s| {
///     for g in ThreadGroup::new(2) {
///         let (dir, full) = (dir.path(), &full);
///         s.spawn(move || {
///             let (off, len) = shard_box(&[10], 0, g.rank(), 2);
///             let local = Tensor::from_slice(&full[off[0]..off[0] + len[0]], &len).unwrap();
///             let sd = Value::dict([("w", Value::Tensor(local))]);
///             let shards = HashMap::from([("w".to_string(), ShardSpec::new(&[10], &off))]);
///             save_rank(&sd, &shards, dir, &WriteOptions::default(), &g).unwrap();
///         });
///     }
/// });
/// let r = DcpReader::open(dir.path()).unwrap();
/// assert_eq!(r.read_tensor("w").unwrap().to_vec::<f32>().unwrap(), full);
/// ```
///
/// # Errors
/// As [`save`]; [`Error::RankFailed`] when another rank failed; collective errors.
pub fn save_rank(
    state_dict: &Value,
    shards: &HashMap<String, ShardSpec>,
    dir: impl AsRef<Path>,
    options: &WriteOptions,
    group: &dyn Collective,
) -> Result<SaveReport> {
    let dir = dir.as_ref();
    save_with_source(state_dict, shards, dir, options, group, &|_| Ok(None)).map(|m| save_report(&m, dir))
}

/// Writes a multi-rank checkpoint from one process: one thread per rank of a [`ThreadGroup`], rank `r` saving
/// `ranks[r]` (its state dict and shard specs, as for [`save_rank`]). This is how a checkpoint for
/// another world size is written offline (resharding, conversion).
///
/// ```
/// use std::collections::HashMap;
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_distcp::{DcpReader, ShardSpec, WriteOptions, save_ranks, shard_box};
/// let dir = tempfile::tempdir().unwrap();
/// let full = Tensor::from_slice(&(0..10).map(|i| i as f32).collect::<Vec<_>>(), &[10]).unwrap();
/// let ranks: Vec<_> = (0..3)
///     .map(|r| {
///         let (off, len) = shard_box(&[10], 0, r, 3);
///         let sd = Value::dict([("w", Value::Tensor(full.narrow(0, off[0], len[0]).unwrap()))]);
///         (sd, HashMap::from([("w".to_string(), ShardSpec::new(&[10], &off))]))
///     })
///     .collect();
/// save_ranks(&ranks, dir.path(), &WriteOptions::default()).unwrap();
/// assert_eq!(DcpReader::open(dir.path()).unwrap().read_tensor("w").unwrap(), full);
/// ```
///
/// # Errors
/// The root cause when a rank fails (a rank's own error, not the [`Error::RankFailed`] the other ranks
/// report); [`Error::Core`] with an invalid argument for no ranks or a panicking rank.
pub fn save_ranks(
    ranks: &[(Value, HashMap<String, ShardSpec>)],
    dir: impl AsRef<Path>,
    options: &WriteOptions,
) -> Result<SaveReport> {
    let dir = dir.as_ref();
    if ranks.is_empty() {
        return Err(Error::NoRanks);
    }
    let results: Vec<Result<SaveReport>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ThreadGroup::new(ranks.len())
            .into_iter()
            .zip(ranks)
            .map(|(group, (sd, shards))| scope.spawn(move || save_rank(sd, shards, dir, options, &group)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::WriterPanicked))).collect()
    });
    let mut metadata = None;
    let mut first_err = None;
    for r in results {
        match r {
            Ok(m) => metadata = metadata.or(Some(m)),
            // A rank's own error wins over the "another rank failed" the others report.
            Err(e) if !matches!(e, Error::RankFailed { .. }) => return Err(e),
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    match (first_err, metadata) {
        (Some(e), _) => Err(e),
        (None, Some(m)) => Ok(m),
        (None, None) => Err(Error::NoRankReturned),
    }
}

/// Supplies, just before a tensor item is written, the tensor to write in place of the state dict's
/// tensor (`None`: write it as is). The replacement is dropped right after its item is written, so a
/// source that reads data on demand keeps memory bounded by one tensor.
pub(crate) type TensorSource<'s> = dyn Fn(&Tensor) -> Result<Option<Tensor>> + Sync + 's;

/// [`save_rank`] with a [`TensorSource`].
pub(crate) fn save_with_source(
    state_dict: &Value,
    shards: &HashMap<String, ShardSpec>,
    dir: &Path,
    options: &WriteOptions,
    group: &dyn Collective,
    source: &TensorSource<'_>,
) -> Result<Metadata> {
    let rank = group.rank();
    let coordinator = 0;
    // Items are pickled one by one: a reference from one to an object another holds is written as a copy.
    let state_dict = &*state_dict.unshared();

    // 1. Local plans, gathered everywhere; every rank computes the same global plan.
    let local = plan_locally(state_dict, shards, dir, options, rank == coordinator);
    let msg = match &local {
        Ok((plan, _)) => {
            let mut m = json!({"plan": planner::plan_to_json(plan)});
            if rank == coordinator {
                m["save_id"] = json!(options.save_id.clone().unwrap_or_else(uuid4));
            }
            m
        }
        // As text: it crosses the process group as bytes (the other ranks report it as a rank failure); this rank
        // returns its own error, source intact.
        Err(e) => json!({"error": e.to_string()}),
    };
    let gathered = exchange(group, &msg)?;
    let (plan, payloads) = local?;
    let mut plans = Vec::with_capacity(gathered.len());
    let mut save_id = None;
    for (r, m) in gathered.iter().enumerate() {
        check_peer(r, m)?;
        plans.push(
            m.get("plan")
                .and_then(planner::plan_from_json)
                .ok_or_else(|| Error::RankFailed { rank: r, message: "sent an unreadable plan".into() })?,
        );
        if r == coordinator {
            save_id = m.get("save_id").and_then(Json::as_str).map(str::to_owned);
        }
    }
    let mut global = planner::global_plan(&plans, options.dedup_to_lowest_rank)?;
    let legacy = options.profile == Profile::MaxCompat;
    for (_, md) in &mut global.metadata.state_dict_metadata {
        if let crate::metadata::StorageMetadata::Tensor(t) = md {
            t.properties.legacy_class = legacy;
        }
    }

    // 2. The coordinator prepares the staging directory; every rank writes its items into it; the write
    //    results are gathered everywhere.
    let commit = DirCommit::begin(dir, group, &dir_options(options)).map_err(from_commit)?;
    let mine = global.assignment.get(rank).cloned().unwrap_or_default();
    let written = write_rank(&RankWrite {
        commit: &commit,
        rank,
        plan: &plan,
        payloads: &payloads,
        assignment: &mine,
        options,
        source,
    });
    if written.is_ok() {
        commit.files_done(); // before the exchange: a killed peer leaves it waiting there
    }
    let msg = match &written {
        Ok(results) => json!({"results": planner::results_to_json(results)}),
        // As text: it crosses the process group as bytes (the other ranks report it as a rank failure); this rank
        // returns its own error, source intact.
        Err(e) => json!({"error": e.to_string()}),
    };
    let gathered = exchange(group, &msg);
    let outcome = gathered.and_then(|gathered| {
        written?;
        let mut results = Vec::new();
        for (r, m) in gathered.iter().enumerate() {
            check_peer(r, m)?;
            results.push(
                m.get("results")
                    .and_then(planner::results_from_json)
                    .ok_or_else(|| Error::RankFailed { rank: r, message: "sent unreadable write results".into() })?,
            );
        }
        Ok(results)
    });
    let results = match outcome {
        Ok(r) => r,
        Err(e) => {
            // Every rank has stopped writing (the exchange is a barrier): drop the staging directory.
            commit.abort();
            return Err(e);
        }
    };
    let mut metadata = global.metadata;
    for r in results {
        metadata.storage_data.extend(r);
    }
    if options.profile == Profile::Torch213 {
        let checkpoint_id = options.checkpoint_id.clone().unwrap_or_else(|| dir.to_string_lossy().into_owned());
        metadata.storage_meta = Some(StorageMeta {
            checkpoint_id: Value::Str(checkpoint_id),
            save_id,
            load_id: None,
            modules: Some(Vec::new()),
        });
        metadata.version = Some(DCP_VERSION.to_owned());
    }

    // 3. The coordinator writes `.metadata` into the staging directory and swaps it in; everyone learns the
    //    outcome.
    let profile = options.profile;
    let committed = commit.commit(group, Ok(()), |c| {
        let bytes = metadata.to_pickle(profile).map_err(|e| CommitError::Refused {
            path: dir.join(".metadata"),
            reason: format!("cannot encode the metadata: {e}"),
        })?;
        let mut f = c.create_file(".metadata")?;
        f.writer().mark(".metadata");
        f.writer().write_all(&bytes).map_err(|e| CommitError::from_io(f.path(), e))?;
        f.finish().map(|_| ())
    });
    committed.map_err(from_commit)?;
    Ok(metadata)
}

/// Names a DCP checkpoint directory holds; anything else in an existing destination is carried over.
fn dcp_owned(name: &str) -> bool {
    name == ".metadata"
        || name == ".metadata.tmp"
        || name == ckpt_io::MANIFEST_NAME
        || name.ends_with(".distcp")
        || (name.starts_with("__") && name.ends_with(".metadata"))
}

/// How a DCP checkpoint lies on an object store: its files, and `.metadata` written last (the commit
/// point of torch's own writers).
pub const OBJECT_LAYOUT: ckpt_io::storage::ObjectLayout =
    ckpt_io::storage::ObjectLayout { format: "distcp", owned: dcp_owned, commit_points: &[".metadata"] };

pub(crate) fn dir_options(options: &WriteOptions) -> DirOptions {
    DirOptions::default().with_durability(options.durability).with_layout(OBJECT_LAYOUT)
}

/// A commit error as this crate's: another rank's failure stays [`Error::RankFailed`].
pub(crate) fn from_commit(e: CommitError) -> Error {
    match e {
        CommitError::RankFailed { rank, message } => Error::RankFailed { rank, message },
        e => Error::Core(e.into()),
    }
}

fn exchange(group: &dyn Collective, msg: &Json) -> Result<Vec<Json>> {
    let bytes = serde_json::to_vec(msg).map_err(|e| Error::unwritable("", format!("plan message: {e}")))?;
    let all = group.all_gather(bytes)?;
    Ok(all.iter().map(|b| serde_json::from_slice(b).unwrap_or(Json::Null)).collect())
}

fn check_peer(rank: usize, m: &Json) -> Result<()> {
    match m.get("error") {
        Some(e) => Err(Error::RankFailed { rank, message: e.as_str().unwrap_or("unknown error").to_owned() }),
        None if m.is_null() => Err(Error::RankFailed { rank, message: "sent an unreadable message".into() }),
        None => Ok(()),
    }
}

fn plan_locally<'a>(
    state_dict: &'a Value,
    shards: &HashMap<String, ShardSpec>,
    dir: &Path,
    options: &WriteOptions,
    coordinator: bool,
) -> Result<(LocalPlan, Vec<Payload<'a>>)> {
    if options.single_file_per_rank && options.thread_count == 0 {
        return Err(Error::unwritable("", "thread_count must be at least 1"));
    }
    if coordinator && !options.overwrite && dir.join(".metadata").exists() {
        return Err(Error::AlreadyExists { path: dir.join(".metadata") });
    }
    planner::local_plan(state_dict, shards)
}

/// The files a rank writes: lists of item positions, each file's objects first, then its tensors.
fn file_layout(plan: &LocalPlan, assignment: &[Option<Option<usize>>], options: &WriteOptions) -> Vec<Vec<usize>> {
    let kept: Vec<(usize, Option<u64>)> = plan
        .items
        .iter()
        .enumerate()
        .filter(|(i, _)| matches!(assignment.get(*i), Some(Some(_))))
        .map(|(i, it)| (i, it.storage_size()))
        .collect();
    if !options.single_file_per_rank {
        return kept.iter().map(|(i, _)| vec![*i]).collect();
    }
    planner::split_buckets(options.thread_count, &kept)
        .into_iter()
        .map(|bucket| {
            let (objects, tensors): (Vec<usize>, Vec<usize>) =
                bucket.into_iter().partition(|&i| plan.items.get(i).is_some_and(|it| it.tensor.is_none()));
            objects.into_iter().chain(tensors).collect()
        })
        .collect()
}

/// What one rank writes: its local plan, the payload of every item, which items it keeps (and their
/// chunk indexes), and how.
struct RankWrite<'a, 'v, 's> {
    commit: &'a DirCommit,
    rank: usize,
    plan: &'a LocalPlan,
    payloads: &'a [Payload<'v>],
    assignment: &'a [Option<Option<usize>>],
    options: &'a WriteOptions,
    source: &'a TensorSource<'s>,
}

fn write_rank(w: &RankWrite<'_, '_, '_>) -> Result<Vec<(MetadataIndex, StorageInfo)>> {
    let files = file_layout(w.plan, w.assignment, w.options);
    let per_file: Vec<Vec<(MetadataIndex, StorageInfo)>> = files
        .par_iter()
        .enumerate()
        .map(|(n, items)| write_file(w, &data_file_name(w.rank, n, w.commit.save_id()), items))
        .collect::<Result<_>>()?;
    Ok(per_file.into_iter().flatten().collect())
}

/// The name of rank `rank`'s data file `n`: torch's `__{rank}_{n}.distcp`, with the save's id before the
/// suffix on an object store (`__0_0.5f3a9c01b2d4.distcp`), so that a save to the URL of a previous
/// checkpoint never replaces one of its objects and the previous checkpoint stays loadable until the new
/// `.metadata` replaces its own (readers take the names from `.metadata`).
pub(crate) fn data_file_name(rank: usize, n: usize, save_id: Option<&str>) -> String {
    match save_id {
        Some(id) => format!("__{rank}_{n}.{id}.distcp"),
        None => format!("__{rank}_{n}.distcp"),
    }
}

fn write_file(rw: &RankWrite<'_, '_, '_>, name: &str, items: &[usize]) -> Result<Vec<(MetadataIndex, StorageInfo)>> {
    let RankWrite { plan, payloads, assignment, options, source, .. } = *rw;
    let mut file = rw.commit.create_file(name).map_err(from_commit)?;
    let path = file.path().to_path_buf();
    let mut results = Vec::with_capacity(items.len());
    for &i in items {
        let (Some(it), Some(payload)) = (plan.items.get(i), payloads.get(i)) else { continue };
        let w = file.writer();
        let start = w.position();
        w.mark(item_name(&it.fqn, it.tensor.as_ref().map(|t| t.offsets.as_slice())));
        let written = write_item(w, &it.fqn, payload, options, source);
        if let Some(e) = w.io_error() {
            return Err(from_commit(CommitError::from_io(&path, e)));
        }
        written.map_err(|e| match e {
            Error::Torch(t) => match t.kind() {
                ckpt_torch::Error::Io { .. } => Error::Torch(t),
                _ => Error::unwritable(&it.fqn, t.to_string()),
            },
            e => e,
        })?;
        let index = MetadataIndex {
            fqn: it.fqn.clone(),
            offset: it.tensor.as_ref().map(|t| t.offsets.clone()),
            index: assignment.get(i).copied().flatten().flatten(),
        };
        let info = StorageInfo {
            relative_path: name.to_owned(),
            offset: start,
            length: file.writer().position() - start,
            transform_descriptors: if options.zstd_level.is_some() {
                vec![ZSTD_TRANSFORM.to_owned()]
            } else {
                Vec::new()
            },
        };
        results.push((index, info));
    }
    file.finish().map_err(from_commit)?;
    Ok(results)
}

/// The checksum chunk name of an item: its key, and the chunk's offsets for a tensor chunk (`w@0,5`).
pub(crate) fn item_name(fqn: &str, offsets: Option<&[usize]>) -> String {
    match offsets {
        Some(o) if !o.is_empty() => {
            let o: Vec<String> = o.iter().map(usize::to_string).collect();
            format!("{fqn}@{}", o.join(","))
        }
        _ => fqn.to_owned(),
    }
}

/// The tensor torch saves for a write item: detached, and cloned into a storage of exactly its bytes when
/// it views a bigger storage.
fn item_tensor(t: &Tensor) -> Result<Tensor> {
    let t = if t.storage().len() != t.nbytes() { clone_dense(t)? } else { t.clone() };
    Ok(t.with_requires_grad(false))
}

pub(crate) fn write_item<W: Write>(
    w: &mut W,
    key: &str,
    payload: &Payload<'_>,
    options: &WriteOptions,
    source: &TensorSource<'_>,
) -> Result<()> {
    let tensor_value;
    let value = match payload {
        Payload::Tensor(t) => {
            let supplied = source(t)?;
            tensor_value = Value::Tensor(item_tensor(supplied.as_ref().unwrap_or(t))?);
            &tensor_value
        }
        Payload::Object(v) => *v,
    };
    let mut topts = ckpt_torch::WriteOptions::default();
    topts.torch_2_13_records = options.profile == Profile::Torch213;
    match options.zstd_level {
        None => {
            ckpt_torch::save_to_writer(value, &mut *w, "archive", &topts)?;
        }
        Some(level) => {
            let zerr = |e: std::io::Error| Error::unwritable(key, format!("zstd: {e}"));
            let enc = zstd::stream::write::Encoder::new(&mut *w, level).map_err(zerr)?;
            let enc = ckpt_torch::save_to_writer(value, enc, "archive", &topts)?;
            enc.finish().map_err(zerr)?;
        }
    }
    Ok(())
}

/// A random uuid4 string (`str(uuid.uuid4())`).
fn uuid4() -> String {
    let mut b = [0u8; 16];
    let from_os = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok();
    if !from_os {
        use std::hash::{BuildHasher, Hasher};
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        for (i, chunk) in b.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(nanos);
            h.write_usize(i);
            h.write_u32(std::process::id());
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn uuid_shape() {
        let u = uuid4();
        assert_eq!(u.len(), 36);
        assert_eq!(u.as_bytes()[14], b'4');
        assert!(matches!(u.as_bytes()[19], b'8' | b'9' | b'a' | b'b'));
        assert_ne!(u, uuid4());
    }
}
