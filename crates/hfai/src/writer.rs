//! Writing a checkpoint directory in hfai's layout: from one process (all parts, in parallel) or from each
//! rank of a process group (its own part), committed as a whole directory ([`ckpt_io::DirCommit`]):
//! every part is written into a staging directory beside the destination, checked, and swapped in at once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use ckpt_collective::{Collective, SingleProcess};
use ckpt_io::SaveReport;
use ckpt_io::{CommitError, DirCommit, DirOptions, Durability, MANIFEST_NAME};
use ckpt_tensor::{Dict, DictKind, Tensor, Value};
use rayon::prelude::*;

use crate::chunked::Chunked;
use crate::commit::{Report, check_staged};
use crate::contents::{Contents, Item, ModelContents, OptimizerContents, StateEntry, optimizer_value};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::part::{HEADER_KEYS, VERSION, show};
use crate::part_name::{PartName, classify, part_file_name};
use crate::partition::{assign, chunk_ranges};

/// hfai's `LARGE_SIZE`: tensors of strictly more bytes are split across the parts (256 MiB).
pub const LARGE_SIZE: u64 = 256 * (1 << 20);

/// Options for writing.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WriteOptions {
    /// Number of parts (`PART_*.pt` files) [`save`] writes, as many as hfai's ranks (default 1).
    /// [`save_rank`] writes one part per rank of its group and ignores this.
    pub world_size: usize,
    /// Strided tensors of strictly more bytes than this are flattened and split over the parts with
    /// `torch.chunk` (default [`LARGE_SIZE`], as hfai).
    pub large_size: u64,
    /// Options for each part's `torch.save` file (its record alignment and records); the parts are written
    /// with this [`WriteOptions::durability`], not the torch options' own.
    pub torch: ckpt_torch::WriteOptions,
    /// How durably the parts are written: `sync` `fdatasync`s every part and fsyncs the directories (off,
    /// the swap stays atomic for readers, but a power failure may lose the new checkpoint); `checksums`
    /// writes `ckpt.checksums.json` beside the parts (a CRC-32 of every record of every part, computed
    /// while writing; hfai's loader ignores the file) and the records' own CRC-32s; `direct_io` writes
    /// large parts with `O_DIRECT`.
    pub durability: Durability,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            world_size: 1,
            large_size: LARGE_SIZE,
            torch: ckpt_torch::WriteOptions::default(),
            durability: Durability::default(),
        }
    }
}

impl WriteOptions {
    /// These options with `world_size` parts.
    #[must_use]
    pub fn with_world_size(mut self, world_size: usize) -> Self {
        self.world_size = world_size;
        self
    }

    /// These options with another chunking threshold.
    #[must_use]
    pub fn with_large_size(mut self, bytes: u64) -> Self {
        self.large_size = bytes;
        self
    }

    /// These options with other options for each part's `torch.save` file.
    #[must_use]
    pub fn with_torch(mut self, torch: ckpt_torch::WriteOptions) -> Self {
        self.torch = torch;
        self
    }

    /// These options with `durability` ([`WriteOptions::durability`]).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    fn dir_options(&self) -> DirOptions {
        DirOptions::default().with_durability(self.durability).with_layout(OBJECT_LAYOUT)
    }

    /// The options of each part's `torch.save` file: [`WriteOptions::torch`] with this durability.
    pub(crate) fn part_options(&self) -> ckpt_torch::WriteOptions {
        self.torch.clone().with_durability(self.durability)
    }

    /// The report of a save of `counts` (the contents' tensors and values) in `parts` parts in `dir`.
    pub(crate) fn report(&self, counts: SaveReport, dir: &Path, parts: usize) -> SaveReport {
        let mut files: Vec<PathBuf> = (0..parts).map(|r| dir.join(part_file_name(r))).collect();
        if self.durability.checksums {
            files.push(dir.join(MANIFEST_NAME));
        }
        counts.with_files(files)
    }
}

/// Names an hfai checkpoint directory holds: its parts (`PART_{rank:03d}.pt`) and the checksum manifest.
/// Anything else in an existing destination is carried over into the new one; parts of an earlier, wider
/// save disappear with the old directory.
fn hfai_owned(name: &str) -> bool {
    matches!(classify(name), PartName::Rank(_)) || name == MANIFEST_NAME
}

/// How an hfai checkpoint lies on an object store: its `PART_*.pt` files, and ckpt's checksum manifest
/// written last. hfai has no commit point of its own: a checkpoint missing a part fails the reader's
/// completeness check.
pub const OBJECT_LAYOUT: ckpt_io::storage::ObjectLayout =
    ckpt_io::storage::ObjectLayout { format: "hfai", owned: hfai_owned, commit_points: &[MANIFEST_NAME] };

/// A commit error as this crate's: another rank's failure stays [`Error::RankFailed`].
fn from_commit(e: CommitError) -> Error {
    match e {
        CommitError::RankFailed { rank, message } => Error::RankFailed { rank, message },
        e => Error::Core(e.into()),
    }
}

/// Runs the completion check as a commit's `finalize` step: its own error is kept in `failure` (the commit
/// reports it as refused), so that the caller returns the specific error.
fn finalize_check(
    commit: &DirCommit,
    reports: &[Report],
    failure: &mut Option<Error>,
) -> std::result::Result<(), CommitError> {
    check_staged(commit.staging(), commit.target(), reports, commit.is_remote()).map_err(|e| {
        // The commit's `Refused` takes text; the error itself, source intact, is kept in `failure` and returned.
        let reason = e.to_string();
        *failure = Some(e);
        CommitError::Refused { path: commit.target().to_path_buf(), reason }
    })
}

/// One model to save: its state dict, and which of its keys are buffers (hfai pops every key of
/// `model.named_buffers()` and saves them whole in part 0, after rank 0's share of the parameters).
#[derive(Debug, Clone)]
pub struct ModelState {
    /// `model.state_dict()`: names to tensors (or any value), in order.
    pub state_dict: Dict,
    /// Names of the buffers among the state dict's keys, in `named_buffers()` order.
    pub buffers: Vec<String>,
}

impl ModelState {
    /// A model with no buffers.
    pub fn new(state_dict: Dict) -> Self {
        ModelState { state_dict, buffers: Vec::new() }
    }

    /// This model with `names` marked as buffers.
    #[must_use]
    pub fn with_buffers<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.buffers.extend(names.into_iter().map(Into::into));
        self
    }
}

/// What hfai's `save(fname, model, optimizer, others)` saves: models, optimizer state dicts
/// (`optimizer.state_dict()`: a dict with `"state"` and `"param_groups"`), and `others`, which go into part 0.
///
/// ```
/// use ckpt_tensor::{Dict, DictKind, Tensor, Value};
/// use ckpt_hfai::{ModelState, SaveState, WriteOptions};
/// let mut sd = Dict::new(DictKind::OrderedDict);
/// sd.insert("w", Tensor::from_slice(&[1.0f32; 6], &[2, 3]).unwrap());
/// sd.insert("bn.running_mean", Tensor::from_slice(&[0.0f32; 3], &[3]).unwrap());
/// let state = SaveState::default()
///     .with_model(ModelState::new(sd).with_buffers(["bn.running_mean"]))
///     .with_other("epoch", Value::Int(3));
/// let dir = tempfile::tempdir().unwrap();
/// let options = WriteOptions::default().with_world_size(2).with_large_size(16);
/// ckpt_hfai::save(&state, dir.path(), &options).unwrap();
/// let back = ckpt_hfai::HfaiReader::open(dir.path()).unwrap();
/// assert_eq!(back.world_size(), 2);
/// assert_eq!(back.chunked(), ["model.w"]); // 24 bytes > 16: chunked over both parts
/// assert_eq!(back.other("epoch"), Some(&Value::Int(3)));
/// ```
#[derive(Debug, Clone, Default)]
pub struct SaveState {
    /// The models (hfai's `model`: a module or a list of them).
    pub models: Vec<ModelState>,
    /// The optimizers' state dicts (hfai's `optimizer`: `None`, one, or a list).
    pub optimizers: Vec<Value>,
    /// `others`, saved by rank 0 after the header; keys may not be `__nshards__`, `__version__`, `model`
    /// or `optimizer`.
    pub others: Vec<(Value, Value)>,
}

impl SaveState {
    /// This state with one more model.
    #[must_use]
    pub fn with_model(mut self, model: ModelState) -> Self {
        self.models.push(model);
        self
    }

    /// This state with one more optimizer state dict.
    #[must_use]
    pub fn with_optimizer(mut self, state_dict: Value) -> Self {
        self.optimizers.push(state_dict);
        self
    }

    /// This state with one more `others` item.
    #[must_use]
    pub fn with_other(mut self, key: impl Into<Value>, value: impl Into<Value>) -> Self {
        self.others.push((key.into(), value.into()));
        self
    }

    /// The state hfai's `save` takes, from a training checkpoint's top-level mapping, and the top-level keys
    /// it leaves out.
    ///
    /// A mapping with a `model` mapping (or list of mappings) is laid out as hfai lays it out: `model` is the
    /// model state dict(s), `optimizer` the optimizer state dict(s) when it has `state` and `param_groups`
    /// (else it is left out: hfai's `optimizer` key holds nothing else), hfai's own header keys
    /// (`__nshards__`, `__version__`) are dropped silently (the writer writes them again), and every other
    /// item goes to `others`. Any other mapping *is* the model state dict (an `OrderedDict`, as
    /// `model.state_dict()`), so hfai's `load` returns it under `model`.
    ///
    /// ```
    /// use ckpt_tensor::{Dict, DictKind, Tensor, Value};
    /// use ckpt_hfai::SaveState;
    /// let w = Value::Tensor(Tensor::from_slice(&[1.0f32; 4], &[4]).unwrap());
    /// let top = Value::dict([("model", Value::dict([("w", w)])), ("epoch", Value::Int(3)), ("optimizer", Value::None)]);
    /// let (state, dropped) = SaveState::from_state_dict(top.as_dict().unwrap());
    /// assert_eq!((state.models.len(), state.others.len()), (1, 1));
    /// assert_eq!(dropped, ["optimizer"]);
    /// ```
    pub fn from_state_dict(top: &Dict) -> (SaveState, Vec<String>) {
        // Parts are pickled one by one: a reference from one value to an object another holds is a copy.
        let whole = Value::Dict(top.clone());
        let unshared = whole.unshared();
        let top = match unshared.as_ref() {
            Value::Dict(d) => d,
            _ => top,
        };
        let as_optimizer = |v: &Value| {
            v.as_dict().is_some_and(|d| {
                d.get("state").is_some_and(|s| s.as_dict().is_some()) && d.get("param_groups").is_some()
            })
        };
        let models: Vec<&Dict> = match top.get("model") {
            Some(Value::Dict(d)) => vec![d],
            Some(Value::List(items)) if !items.is_empty() => {
                let dicts: Vec<&Dict> = items.iter().filter_map(Value::as_dict).collect();
                if dicts.len() == items.len() { dicts } else { Vec::new() }
            }
            _ => Vec::new(),
        };
        let mut state = SaveState::default();
        let mut dropped = Vec::new();
        if models.is_empty() {
            let mut model = top.clone();
            model.kind = DictKind::OrderedDict;
            return (state.with_model(ModelState::new(model)), dropped);
        }
        for m in models {
            state = state.with_model(ModelState::new(m.clone()));
        }
        for (k, v) in &top.items {
            match k.as_str() {
                Some("model" | "__nshards__" | "__version__") => {}
                Some("optimizer") if as_optimizer(v) => state = state.with_optimizer(v.clone()),
                Some("optimizer") if v.as_sequence().is_some_and(|s| s.iter().all(as_optimizer)) => {
                    for o in v.as_sequence().unwrap_or_default() {
                        state = state.with_optimizer(o.clone());
                    }
                }
                Some("optimizer") => dropped.push("optimizer".to_owned()),
                _ => state = state.with_other(k.clone(), v.clone()),
            }
        }
        (state, dropped)
    }

    fn contents(&self) -> Result<Contents> {
        for (k, _) in &self.others {
            if let Some(k) = k.as_str().filter(|k| HEADER_KEYS.contains(k)) {
                return Err(Error::ReservedKey { key: k.to_owned() });
            }
        }
        let models = self
            .models
            .iter()
            .enumerate()
            .map(|(m, model)| {
                let is_buffer = |k: &Value| k.as_str().is_some_and(|k| model.buffers.iter().any(|b| b == k));
                let buffers = model
                    .buffers
                    .iter()
                    .map(|name| {
                        let v = model
                            .state_dict
                            .get(name)
                            .ok_or_else(|| Error::UnknownBuffer { model: m, name: name.clone() })?;
                        Ok((Value::Str(name.clone()), v.clone()))
                    })
                    .collect::<Result<_>>()?;
                let entries = model
                    .state_dict
                    .items
                    .iter()
                    .filter(|(k, _)| !is_buffer(k))
                    .map(|(k, v)| (k.clone(), Item::Value(v.clone())))
                    .collect();
                Ok(ModelContents { entries, buffers })
            })
            .collect::<Result<_>>()?;
        let optimizers = self
            .optimizers
            .iter()
            .enumerate()
            .map(|(index, sd)| {
                let bad = |problem: &str| Error::BadOptimizer { index, problem: problem.to_owned() };
                let dict = sd.as_dict().ok_or_else(|| bad(&format!("a {}, not a state dict", sd.type_name())))?;
                let state = dict.get("state").ok_or_else(|| bad("no \"state\" key"))?;
                let state = state.as_dict().ok_or_else(|| bad(&format!("\"state\" is a {}", state.type_name())))?;
                let state = state.items.iter().map(|(k, v)| (k.clone(), StateEntry::from_value(v.clone()))).collect();
                Ok(OptimizerContents { dict: dict.clone(), state })
            })
            .collect::<Result<_>>()?;
        Ok(Contents { models, optimizers, others: self.others.clone() })
    }
}

/// A model's split: small entries with their rank assignment, buffers, large tensors.
struct ModelPlan {
    small: Vec<(Value, Item)>,
    assignment: Vec<Vec<usize>>,
    buffers: Vec<(Value, Value)>,
    large: Vec<(Value, Chunked)>,
}

/// An optimizer's split: state entries (large tensors removed) with their assignment, large tensors.
struct OptimizerPlan {
    dict: Dict,
    state: Vec<(Value, StateEntry)>,
    assignment: Vec<Vec<usize>>,
    large: Vec<((Value, Value), Chunked)>,
}

/// Who writes what: the same on every rank, computed from the same state.
pub(crate) struct Plan {
    world_size: usize,
    models: Vec<ModelPlan>,
    optimizers: Vec<OptimizerPlan>,
    others: Vec<(Value, Value)>,
    /// Bytes copied to build chunks that span stored chunks, or to rejoin formerly chunked tensors.
    copied: AtomicU64,
}

/// The item as a large tensor, if it is one: a strided tensor of more than `large_size` bytes.
fn as_large(item: &Item, large_size: u64, resolve: Resolve<'_>) -> Result<Option<Chunked>> {
    Ok(match item {
        Item::Chunked(c) => (c.nbytes() > large_size).then(|| c.clone()),
        Item::Value(v) => match v.as_tensor() {
            Some(t) if t.nbytes() as u64 > large_size => Some(Chunked::from_tensor(&resolve(t)?)?),
            _ => None,
        },
    })
}

/// `torch.chunk` must give every rank a chunk (hfai's `chunk(n)[rank]` raises otherwise).
fn check_chunks(name: impl FnOnce() -> String, c: &Chunked, world_size: usize) -> Result<()> {
    let chunks = chunk_ranges(c.numel(), world_size);
    if chunks.len() < world_size {
        return Err(Error::TooFewChunks {
            key: name(),
            numel: c.numel(),
            world_size,
            chunks: chunks.len(),
            chunk_len: chunks.first().map_or(0, |r| r.len()),
        });
    }
    Ok(())
}

impl Plan {
    pub(crate) fn new(contents: Contents, world_size: usize, large_size: u64) -> Result<Plan> {
        Plan::resolved(contents, world_size, large_size, &|t| Ok(t.clone()))
    }

    /// [`Plan::new`] for a state whose tensors may be outlines (see [`save_rank_resolved`]): `resolve` gives
    /// the tensors of large items, which every rank chunks.
    pub(crate) fn resolved(
        contents: Contents,
        world_size: usize,
        large_size: u64,
        resolve: Resolve<'_>,
    ) -> Result<Plan> {
        if world_size == 0 {
            return Err(Error::ZeroShards);
        }
        let n_models = contents.models.len();
        let mut models = Vec::with_capacity(n_models);
        for (m, model) in contents.models.into_iter().enumerate() {
            let mut small = Vec::new();
            let mut large = Vec::new();
            for (k, item) in model.entries {
                match as_large(&item, large_size, resolve)? {
                    Some(c) => {
                        check_chunks(|| leaf_name("model", n_models, m, &[&k]), &c, world_size)?;
                        large.push((k, c));
                    }
                    None => small.push((k, item)),
                }
            }
            let sizes: Vec<u64> = small.iter().map(|(_, i)| i.size()).collect();
            models.push(ModelPlan { assignment: assign(&sizes, world_size), small, buffers: model.buffers, large });
        }
        let n_optimizers = contents.optimizers.len();
        let mut optimizers = Vec::with_capacity(n_optimizers);
        for (o, opt) in contents.optimizers.into_iter().enumerate() {
            let mut large = Vec::new();
            let mut state = Vec::with_capacity(opt.state.len());
            for (k1, entry) in opt.state {
                let entry = match entry {
                    StateEntry::Map { kind, attrs, items } => {
                        let mut kept = Vec::with_capacity(items.len());
                        for (k2, item) in items {
                            match as_large(&item, large_size, resolve)? {
                                Some(c) => {
                                    let name =
                                        || leaf_name("optimizer", n_optimizers, o, &[&Value::from("state"), &k1, &k2]);
                                    check_chunks(name, &c, world_size)?;
                                    large.push(((k1.clone(), k2), c));
                                }
                                None => kept.push((k2, item)),
                            }
                        }
                        StateEntry::Map { kind, attrs, items: kept }
                    }
                    other => other,
                };
                state.push((k1, entry));
            }
            let sizes: Vec<u64> = state.iter().map(|(_, e)| e.size()).collect();
            optimizers.push(OptimizerPlan { dict: opt.dict, assignment: assign(&sizes, world_size), state, large });
        }
        Ok(Plan { world_size, models, optimizers, others: contents.others, copied: AtomicU64::new(0) })
    }

    pub(crate) fn copied_bytes(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    fn item_value(&self, item: &Item) -> Result<Value> {
        match item {
            Item::Value(v) => Ok(v.clone()),
            Item::Chunked(c) => {
                let (t, copied) = c.whole()?;
                if copied {
                    self.copied.fetch_add(c.nbytes(), Ordering::Relaxed);
                }
                Ok(Value::Tensor(t))
            }
        }
    }

    /// Rank `rank`'s chunk of `c` with its stored shape: `(torch.Size, flat chunk)`.
    fn chunk(&self, c: &Chunked, rank: usize) -> Result<Value> {
        let range = chunk_ranges(c.numel(), self.world_size).get(rank).cloned().unwrap_or(0..0);
        let (t, copied) = c.range(range.start, range.len())?;
        if copied {
            self.copied.fetch_add(t.nbytes() as u64, Ordering::Relaxed);
        }
        let shape = c.shape().iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect();
        Ok(Value::Tuple(vec![Value::Size(shape), Value::Tensor(t)]))
    }

    /// The object rank `rank` saves as `PART_{rank:03d}.pt` (spec §3).
    pub(crate) fn part_value(&self, rank: usize, resolve: Resolve<'_>) -> Result<Value> {
        let mut top = Dict::new(DictKind::Dict);
        top.insert("__nshards__", Value::Int(i64::try_from(self.world_size).unwrap_or(i64::MAX)));
        top.insert("__version__", VERSION);
        let mut models = Vec::with_capacity(self.models.len());
        for m in &self.models {
            let mut params = Dict::new(DictKind::OrderedDict);
            for &i in m.assignment.get(rank).map(Vec::as_slice).unwrap_or_default() {
                if let Some((k, item)) = m.small.get(i) {
                    params.items.push((k.clone(), compact(&resolve_value(&self.item_value(item)?, resolve)?)?));
                }
            }
            if rank == 0 {
                for (k, v) in &m.buffers {
                    params.items.push((k.clone(), compact(&resolve_value(v, resolve)?)?));
                }
            }
            let mut large = Dict::new(DictKind::Dict);
            for (k, c) in &m.large {
                large.items.push((k.clone(), self.chunk(c, rank)?));
            }
            models.push(Value::Tuple(vec![Value::Dict(params), Value::Dict(large)]));
        }
        top.insert("model", Value::List(models));
        let mut optimizers = Vec::with_capacity(self.optimizers.len());
        for o in &self.optimizers {
            let mut state = Vec::new();
            for &i in o.assignment.get(rank).map(Vec::as_slice).unwrap_or_default() {
                if let Some((k, entry)) = o.state.get(i) {
                    let v = match entry {
                        StateEntry::Map { kind, attrs, items } => Value::Dict(Dict {
                            kind: *kind,
                            items: items
                                .iter()
                                .map(|(k2, i)| Ok((k2.clone(), resolve_value(&self.item_value(i)?, resolve)?)))
                                .collect::<Result<_>>()?,
                            attrs: attrs.clone(),
                        }),
                        StateEntry::Other(v) => resolve_value(v, resolve)?,
                    };
                    state.push((k.clone(), v));
                }
            }
            let mut large = Dict::new(DictKind::Dict);
            for ((k1, k2), c) in &o.large {
                large.items.push((Value::Tuple(vec![k1.clone(), k2.clone()]), self.chunk(c, rank)?));
            }
            optimizers.push(Value::Tuple(vec![optimizer_value(&o.dict, state), Value::Dict(large)]));
        }
        top.insert("optimizer", Value::List(optimizers));
        if rank == 0 {
            for (k, v) in &self.others {
                top.items.push((k.clone(), resolve_value(v, resolve)?));
            }
        }
        Ok(Value::Dict(top))
    }

    /// Writes rank `rank`'s part into the commit's staging directory (each record marked for the checksum
    /// manifest) and returns its fingerprint.
    pub(crate) fn write_part(
        &self,
        commit: &DirCommit,
        rank: usize,
        options: &WriteOptions,
        resolve: Resolve<'_>,
    ) -> Result<Fingerprint> {
        self.write_part_value(commit, rank, &self.part_value(rank, resolve)?, options)
    }

    /// [`Plan::write_part`] of the part's value.
    fn write_part_value(
        &self,
        commit: &DirCommit,
        rank: usize,
        value: &Value,
        options: &WriteOptions,
    ) -> Result<Fingerprint> {
        let name = part_file_name(rank);
        let prefix = ckpt_torch::prefix_for_path(Path::new(&name))?;
        // On the local disk even for an object store: the completeness check reads each part's tail back.
        let mut file = commit.create_staged_file(&name).map_err(from_commit)?;
        let written = ckpt_torch::save_to_durable(value, file.writer(), &prefix, &options.part_options());
        if let Some(e) = file.writer().io_error() {
            return Err(from_commit(CommitError::from_io(file.path(), e)));
        }
        written?;
        file.finish().map_err(from_commit)?;
        Fingerprint::of_file(&commit.staging().join(&name))
    }

    /// Writes every part from this process, in parallel, into a staging directory beside `dir`; checks
    /// them and swaps the directory in.
    pub(crate) fn write_all(&self, dir: &Path, options: &WriteOptions) -> Result<()> {
        let commit = DirCommit::begin(dir, &SingleProcess, &options.dir_options()).map_err(from_commit)?;
        let values: Vec<Value> =
            (0..self.world_size).map(|r| self.part_value(r, &|t| Ok(t.clone()))).collect::<Result<_>>()?;
        // Parts holding tensors made as they are written (gathers from another format, chunks joined:
        // `Buffer::deferred`) are written one after the other, so that one such tensor is in memory at a
        // time; parts of windows and owned tensors, in parallel.
        let write = |(r, v): (usize, &Value)| self.write_part_value(&commit, r, v, options);
        let results: Vec<Result<Fingerprint>> = if values.iter().any(holds_deferred) {
            values.iter().enumerate().map(write).collect()
        } else {
            values.par_iter().enumerate().map(write).collect()
        };
        let reports: Vec<Report> = results.iter().map(|r| Report::of(r, |f| vec![*f])).collect();
        for r in results {
            r?; // the commit, dropped, removes its staging directory
        }
        let mut failure = None;
        let committed = commit.commit(&SingleProcess, Ok(()), |c| finalize_check(c, &reports, &mut failure));
        committed.map_err(|e| failure.unwrap_or_else(|| from_commit(e)))
    }
}

/// Whether `value` holds a tensor whose bytes are made on demand ([`ckpt_tensor::Buffer::deferred`]).
fn holds_deferred(value: &Value) -> bool {
    match value {
        Value::Tensor(t) | Value::Parameter { tensor: t, .. } => t.storage().is_deferred(),
        Value::TensorWithState { tensor, .. } => holds_deferred(tensor),
        Value::List(v) | Value::Tuple(v) | Value::Set(v) | Value::FrozenSet(v) => v.iter().any(holds_deferred),
        Value::Dict(d) => d.items.iter().any(|(k, v)| holds_deferred(k) || holds_deferred(v)),
        _ => false,
    }
}

/// The leaf name of an entry, for messages (`model.w`, `optimizer.1.state.3.exp_avg`).
fn leaf_name(what: &str, count: usize, index: usize, keys: &[&Value]) -> String {
    let mut name = what.to_owned();
    if count > 1 {
        name.push_str(&format!(".{index}"));
    }
    for k in keys {
        name.push('.');
        name.push_str(&ckpt_tensor::flatten::python_str(k).unwrap_or_else(|_| show(k)));
    }
    name
}

/// The tensor as hfai's `.clone()` leaves it: a storage of exactly its own elements. A tensor that
/// already covers its whole storage is kept as is (with its strides, as `clone` keeps them); a contiguous
/// view becomes a window of exactly its bytes (no copy); any other view is gathered row-major.
fn compact_tensor(t: &Tensor) -> Result<Tensor> {
    if t.storage_offset() == 0 && t.storage().len() == t.nbytes() {
        return Ok(t.clone());
    }
    Ok(t.to_contiguous()?)
}

/// How a rank gets the tensors it writes from the tensors of the state it was given (see
/// [`save_rank_resolved`]).
pub type Resolve<'a> = &'a (dyn Fn(&Tensor) -> ckpt_tensor::Result<Tensor> + Sync);

/// `v` with every tensor in it (nested in mappings, lists, tuples, parameters) passed through `resolve`.
fn resolve_value(v: &Value, resolve: Resolve<'_>) -> Result<Value> {
    Ok(match v {
        Value::Tensor(t) => Value::Tensor(resolve(t)?),
        Value::Parameter { tensor, state } => Value::Parameter { tensor: resolve(tensor)?, state: state.clone() },
        Value::TensorWithState { tensor, class, state } => Value::TensorWithState {
            tensor: Box::new(resolve_value(tensor, resolve)?),
            class: class.clone(),
            state: state.clone(),
        },
        Value::Dict(d) => Value::Dict(Dict {
            kind: d.kind,
            items: d.items.iter().map(|(k, v)| Ok((k.clone(), resolve_value(v, resolve)?))).collect::<Result<_>>()?,
            attrs: d.attrs.clone(),
        }),
        Value::List(items) => Value::List(items.iter().map(|v| resolve_value(v, resolve)).collect::<Result<_>>()?),
        Value::Tuple(items) => Value::Tuple(items.iter().map(|v| resolve_value(v, resolve)).collect::<Result<_>>()?),
        other => other.clone(),
    })
}

fn compact(v: &Value) -> Result<Value> {
    Ok(match v {
        Value::Tensor(t) => Value::Tensor(compact_tensor(t)?),
        Value::Parameter { tensor, state } => {
            Value::Parameter { tensor: compact_tensor(tensor)?, state: state.clone() }
        }
        Value::TensorWithState { tensor, class, state } => {
            Value::TensorWithState { tensor: Box::new(compact(tensor)?), class: class.clone(), state: state.clone() }
        }
        other => other.clone(),
    })
}

/// Saves `state` as an hfai checkpoint of `options.world_size` parts in `dir`, from this one process: the parts
/// are built and written in parallel into `.<dir>.ckpt-staging` beside `dir`, checked on disk, and the
/// directory swapped in whole ([`ckpt_io::DirCommit`]): a crash at any point leaves the previous
/// checkpoint or the new one, parts of an earlier, wider save disappear with it, and files in `dir` that
/// are not hfai's are carried over. `ckpt.checksums.json` (a CRC-32 of every record) is written beside the
/// parts unless [`WriteOptions::durability`]'s checksums are off.
///
/// The files are what hfai's `save` run on `world_size` ranks writes (spec §2-§4): the same key-to-rank split
/// (largest first, to the least-loaded rank, ties to the lower rank, equal sizes later-key first), tensors
/// of more than `options.large_size` bytes flattened and split with `torch.chunk`, buffers whole in part 0,
/// `others` in part 0. A tensor too small for `torch.chunk` to give every rank a chunk is refused with
/// [`Error::TooFewChunks`] (hfai raises `IndexError` on the last ranks); a non-contiguous large tensor,
/// which hfai's `view(-1)` refuses, is gathered first.
///
/// # Errors
/// [`Error::ZeroShards`], [`Error::ReservedKey`], [`Error::UnknownBuffer`], [`Error::BadOptimizer`],
/// [`Error::TooFewChunks`] before anything is written; I/O and torch codec errors; the commit's errors
/// (`Error::Core` holding a `ckpt_io::CommitError`: the destination locked by another save, a full disk, ...);
/// [`Error::Incomplete`] or [`Error::ForeignFiles`] from the completion check.
pub fn save(state: &SaveState, dir: impl AsRef<Path>, options: &WriteOptions) -> Result<SaveReport> {
    let dir = dir.as_ref();
    let contents = state.contents()?;
    let counts = contents.report();
    Plan::new(contents, options.world_size, options.large_size)?.write_all(dir, options)?;
    Ok(options.report(counts, dir, options.world_size))
}

/// Saves `state` as one rank of `group`: like hfai's `save`, every rank calls it with the same state and
/// writes its own part, `PART_{rank:03d}.pt` of `group.world_size()` parts, into the staging directory rank
/// 0 prepares beside `dir`. Once every rank has written, rank 0 checks every part on disk and swaps the
/// directory in ([`ckpt_io::DirCommit`]); all ranks return the same verdict, and a rank that fails
/// (even before writing) does not leave the others waiting.
///
/// ```
/// use ckpt_tensor::{Dict, DictKind, Tensor};
/// use ckpt_collective::ThreadGroup;
/// use ckpt_hfai::{ModelState, SaveState, WriteOptions};
/// let mut sd = Dict::new(DictKind::OrderedDict);
/// sd.insert("w", Tensor::from_slice(&[1.0f32; 8], &[8]).unwrap());
/// let state = SaveState::default().with_model(ModelState::new(sd));
/// let dir = tempfile::tempdir().unwrap();
/// std::thread::scope(|s| {
///     for rank in ThreadGroup::new(3) {
///         let (state, dir) = (&state, dir.path());
///         s.spawn(move || ckpt_hfai::save_rank(state, dir, &WriteOptions::default(), &rank).unwrap());
///     }
/// });
/// assert_eq!(ckpt_hfai::HfaiReader::open(dir.path()).unwrap().world_size(), 3);
/// ```
///
/// # Errors
/// As [`save`] for this rank's own failure; [`Error::RankFailed`] naming the rank that failed otherwise.
/// Every rank returns the report of the whole checkpoint.
pub fn save_rank(
    state: &SaveState,
    dir: impl AsRef<Path>,
    options: &WriteOptions,
    group: &dyn Collective,
) -> Result<SaveReport> {
    save_rank_resolved(state, dir.as_ref(), options, group, &|t| Ok(t.clone()))
}

/// [`save_rank`] for a state whose tensors stand for data this rank reads only if it writes them: the split
/// is planned from the tensors' dtypes and shapes (which is all hfai's partition looks at), and each tensor
/// this rank writes (its entries, buffers and `others` on rank 0, every large tensor it takes a chunk of)
/// is passed through `resolve` first. A conversion gives outlines of the source's tensors and reads, in
/// `resolve`, only those of its own part; `resolve` must return a tensor of the same dtype and shape.
///
/// ```
/// use ckpt_tensor::{Dict, DictKind, Tensor};
/// use ckpt_collective::SingleProcess;
/// use ckpt_hfai::{ModelState, SaveState, WriteOptions};
/// let mut sd = Dict::new(DictKind::OrderedDict);
/// sd.insert("w", Tensor::zeros(ckpt_tensor::DType::F32, &[4]).unwrap()); // stands for the real `w`
/// let state = SaveState::default().with_model(ModelState::new(sd));
/// let dir = tempfile::tempdir().unwrap();
/// let real = |_: &Tensor| Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]);
/// ckpt_hfai::save_rank_resolved(&state, dir.path(), &WriteOptions::default(), &SingleProcess, &real).unwrap();
/// let ck = ckpt_hfai::HfaiReader::open(dir.path()).unwrap();
/// let w = ck.model().unwrap().get("w").unwrap().as_tensor().unwrap().to_vec::<f32>().unwrap();
/// assert_eq!(w, [1.0, 2.0, 3.0, 4.0]);
/// ```
///
/// # Errors
/// As [`save_rank`]; `resolve`'s errors.
pub fn save_rank_resolved(
    state: &SaveState,
    dir: &Path,
    options: &WriteOptions,
    group: &dyn Collective,
    resolve: Resolve<'_>,
) -> Result<SaveReport> {
    let contents = state.contents();
    let counts = contents.as_ref().map(Contents::report).unwrap_or_default();
    let plan = contents.and_then(|c| Plan::resolved(c, group.world_size(), options.large_size, resolve));
    write_rank(plan, dir, options, group, resolve)?;
    Ok(options.report(counts, dir, group.world_size()))
}

/// Writes this rank's part of `plan` (every rank planned the same) into the staging directory rank 0 prepares
/// beside `dir`; rank 0 checks every part on disk and swaps the directory in; every rank returns the same
/// verdict (a rank whose plan failed too).
pub(crate) fn write_rank(
    plan: Result<Plan>,
    dir: &Path,
    options: &WriteOptions,
    group: &dyn Collective,
    resolve: Resolve<'_>,
) -> Result<()> {
    let commit = DirCommit::begin(dir, group, &options.dir_options()).map_err(from_commit)?;
    let own = plan.and_then(|plan| plan.write_part(&commit, group.rank(), options, resolve));
    let payload = match &own {
        Ok(f) => Ok(f.encode().into_bytes()),
        // As its message (a RankFailure): it crosses the process group as bytes (the other ranks report it as a
        // rank failure); this rank returns its own error, source intact.
        Err(e) => Err(ckpt_io::RankFailure::from(e)),
    };
    let mut failure = None;
    let committed = commit.commit_gathered(group, payload, |c, payloads| {
        let reports: Vec<Report> = payloads
            .iter()
            .map(|p| match std::str::from_utf8(p).ok().and_then(Fingerprint::decode) {
                Some(f) => Report::Done(vec![f]),
                None => Report::Failed("sent an unreadable fingerprint".into()),
            })
            .collect();
        finalize_check(c, &reports, &mut failure)
    });
    own?;
    committed.map_err(|e| failure.unwrap_or_else(|| from_commit(e)))
}
