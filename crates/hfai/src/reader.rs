//! Reading a checkpoint directory: every part is mapped and checked (in parallel), then the parts are merged
//! exactly as hfai's `load` merges them.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ckpt_collective::Collective;
use ckpt_tensor::flatten::LeafIndex;
use ckpt_tensor::{CheckpointRead, DType, Dict, Entry, Tensor, Value, entry_kind, leaves};
use ckpt_torch::ReadOptions;
use rayon::prelude::*;

use crate::chunked::Chunked;
use crate::commit::Report;
use crate::contents::{Contents, Item, ModelContents, OptimizerContents, StateEntry};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::part::{HEADER_KEYS, LargeChunk, Part, VERSION, show};
use crate::part_name::{PartName, classify, part_file_name};
use crate::partition::chunk_ranges;

/// An hfai checkpoint, read: the value hfai's `load` returns, and facts about the parts.
///
/// [`HfaiReader::value`] is the dict `hfai.checkpoint.load` returns: PART_000.pt's dict (header,
/// `others`) with `"model"` replaced by the merged state dict (a `dict`: rank 0's small entries and
/// buffers, rank 1's, ..., then the large tensors) or a list of them when several models were saved, and
/// `"optimizer"` by the merged optimizer state dict (`"state"` an `OrderedDict`, `param_groups` from rank 0)
/// or a list, or the raw `[]` when none was saved.
///
/// Tensors that are whole in one part are windows of that part's memory map (zero copy); large tensors
/// stored as chunks are concatenated, in parallel, into new memory (one window when there is one part).
///
/// ```no_run
/// use ckpt_hfai::HfaiReader;
/// let ckpt = HfaiReader::open("latest.pt")?;
/// let model = ckpt.model().expect("one model");
/// println!("{} parts, {} entries, epoch {:?}", ckpt.world_size(), model.items.len(), ckpt.other("epoch"));
/// # Ok::<(), ckpt_hfai::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct HfaiReader {
    dir: PathBuf,
    world_size: usize,
    value: Value,
    chunked: Vec<String>,
    concatenated_bytes: u64,
    fingerprints: Vec<Fingerprint>,
    /// Leaves by name, built on the first look-up (reading every entry stays linear).
    leaf_index: OnceLock<Option<LeafIndex>>,
}

/// The parts of a checkpoint merged, with large tensors still in their chunks.
pub(crate) struct Merged {
    pub(crate) world_size: usize,
    /// PART_000.pt's top-level dict, unchanged.
    pub(crate) top: Dict,
    pub(crate) contents: Contents,
    /// Leaf names of the chunked tensors in the loaded value.
    pub(crate) chunked: Vec<String>,
    pub(crate) fingerprints: Vec<Fingerprint>,
}

/// Identity of a dict key, for Python's `dict.update` semantics (`1`, `1.0` and `True` are one key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum KeyId {
    None,
    Int(i64),
    Float(u64),
    Big(Vec<u8>),
    Str(String),
    Tuple(Vec<KeyId>),
    Other(String),
}

impl KeyId {
    fn of(v: &Value) -> KeyId {
        match v {
            Value::None => KeyId::None,
            Value::Bool(b) => KeyId::Int(i64::from(*b)),
            Value::Int(i) => KeyId::Int(*i),
            Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => KeyId::Int(*f as i64),
            Value::Float(f) => KeyId::Float(f.to_bits()),
            Value::BigInt(b) => KeyId::Big(b.clone()),
            Value::Str(s) => KeyId::Str(s.clone()),
            Value::Tuple(items) => KeyId::Tuple(items.iter().map(KeyId::of).collect()),
            other => KeyId::Other(format!("{other:?}")),
        }
    }
}

/// An insertion-ordered map with Python's `update` semantics: a new key is appended, an existing key keeps
/// its position and takes the new value.
struct OrderedMap<V> {
    items: Vec<(Value, V)>,
    index: HashMap<KeyId, usize>,
}

impl<V> OrderedMap<V> {
    fn new() -> Self {
        OrderedMap { items: Vec::new(), index: HashMap::new() }
    }

    fn set(&mut self, key: Value, value: V) {
        match self.index.get(&KeyId::of(&key)) {
            Some(&i) => {
                if let Some(slot) = self.items.get_mut(i) {
                    slot.1 = value;
                }
            }
            None => {
                self.index.insert(KeyId::of(&key), self.items.len());
                self.items.push((key, value));
            }
        }
    }

    fn get_mut(&mut self, key: &Value) -> Option<&mut V> {
        let i = *self.index.get(&KeyId::of(key))?;
        self.items.get_mut(i).map(|(_, v)| v)
    }

    fn contains(&self, key: &Value) -> bool {
        self.index.contains_key(&KeyId::of(key))
    }
}

/// The chunks of one large tensor gathered over the parts, checked as they come; `K` is the original key
/// (a name for a model, `(param_id, name)` for an optimizer).
struct LargeAcc<K> {
    key: K,
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    pieces: Vec<Tensor>,
}

impl<K> LargeAcc<K> {
    /// Adds `part`'s chunk of the tensor that `id` identifies.
    fn add(
        accs: &mut OrderedMap<LargeAcc<K>>,
        id: Value,
        key: K,
        name: String,
        large: &LargeChunk,
        part: &Path,
    ) -> Result<()> {
        let chunk = &large.chunk;
        let at = || part.to_path_buf();
        if chunk.dim() != 1 {
            return Err(Error::ChunkNotFlat { path: at(), key: name, shape: chunk.shape().to_vec() });
        }
        let Some(acc) = accs.get_mut(&id) else {
            let (dtype, shape, pieces) = (chunk.dtype(), large.shape.clone(), vec![chunk.clone()]);
            accs.set(id, LargeAcc { key, name, dtype, shape, pieces });
            return Ok(());
        };
        if acc.dtype != chunk.dtype() {
            return Err(Error::ChunkDType { path: at(), key: name, expected: acc.dtype, found: chunk.dtype() });
        }
        if acc.shape != large.shape {
            let (expected, found) = (acc.shape.clone(), large.shape.clone());
            return Err(Error::ShapeMismatch { path: at(), key: name, expected, found });
        }
        acc.pieces.push(chunk.clone());
        Ok(())
    }

    fn finish(self) -> Result<(K, String, Chunked)> {
        let chunked = Chunked::new(&self.name, self.dtype, self.shape, self.pieces)?;
        Ok((self.key, self.name, chunked))
    }
}

/// Lists the directory: the ranks of the part files present, and other names matching `PART_*.pt`.
fn list_parts(dir: &Path) -> Result<(Vec<usize>, Vec<String>)> {
    let meta = fs::metadata(dir).map_err(|e| Error::io(dir, e))?;
    if !meta.is_dir() {
        return Err(Error::NotADirectory { path: dir.to_path_buf() });
    }
    let mut ranks = Vec::new();
    let mut foreign = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let name = entry.map_err(|e| Error::io(dir, e))?.file_name().to_string_lossy().into_owned();
        match classify(&name) {
            PartName::Rank(r) => ranks.push(r),
            PartName::Foreign => foreign.push(name),
            PartName::Other => {}
        }
    }
    ranks.sort_unstable();
    foreign.sort();
    Ok((ranks, foreign))
}

/// Reads every part of `dir` and merges them, leaving large tensors in their chunks.
///
/// The parts are opened one by one, by path: a save that swaps a new checkpoint in meanwhile
/// ([`ckpt_io::DirCommit`]) could hand this reader parts of two generations. The directory is
/// pinned first and checked after: if the path names another directory by then, the parts are read again
/// (up to three times), so what is returned is one generation's.
pub(crate) fn read_merged(dir: &Path, options: &ReadOptions) -> Result<Merged> {
    for _ in 0..3 {
        let pinned = ckpt_io::PinnedDir::open(dir).ok();
        let merged = read_merged_once(dir, options);
        if pinned.as_ref().is_none_or(|p| !p.is_replaced()) {
            return merged;
        }
    }
    Err(Error::io(dir, std::io::Error::other("replaced by other saves three times while being read")))
}

fn read_merged_once(dir: &Path, options: &ReadOptions) -> Result<Merged> {
    let (ranks, foreign) = list_parts(dir)?;
    let path = |r: usize| dir.join(part_file_name(r));
    if ranks.first() != Some(&0) {
        return Err(Error::MissingPart { path: path(0), rank: 0, world_size: None });
    }
    let part0 = Part::open(&path(0), options)?;
    let world_size = part0.world_size;
    if let Some(rank) = (0..world_size).find(|r| ranks.binary_search(r).is_err()) {
        return Err(Error::MissingPart { path: path(rank), rank, world_size: Some(world_size) });
    }
    let mut extra: Vec<String> = ranks.iter().filter(|&&r| r >= world_size).map(|&r| part_file_name(r)).collect();
    extra.extend(foreign);
    if !extra.is_empty() {
        return Err(Error::ExtraParts { dir: dir.to_path_buf(), names: extra, world_size });
    }
    let rest: Vec<Part> =
        (1..world_size).into_par_iter().map(|r| Part::open(&path(r), options)).collect::<Result<_>>()?;
    merge(part0, rest)
}

/// hfai's `load` merge (spec §5), checked: headers agree, chunks add up, nothing is both whole and chunked.
fn merge(first: Part, rest: Vec<Part>) -> Result<Merged> {
    let parts: Vec<&Part> = std::iter::once(&first).chain(&rest).collect();
    let world_size = first.world_size;
    let (n_models, n_optimizers) = (first.models.len(), first.optimizers.len());
    for p in &parts {
        if p.world_size != world_size {
            return Err(Error::NshardsMismatch { path: p.path.clone(), expected: world_size, found: p.world_size });
        }
        for (what, expected, found) in
            [("model", n_models, p.models.len()), ("optimizer", n_optimizers, p.optimizers.len())]
        {
            if expected != found {
                return Err(Error::CountMismatch { path: p.path.clone(), what, expected, found });
            }
        }
    }
    let model_name = |m: usize, k: &Value| match n_models {
        1 => format!("model.{}", show_key(k)),
        _ => format!("model.{m}.{}", show_key(k)),
    };
    let optimizer_name = |o: usize, k1: &Value, k2: &Value| match n_optimizers {
        1 => format!("optimizer.state.{}.{}", show_key(k1), show_key(k2)),
        _ => format!("optimizer.{o}.state.{}.{}", show_key(k1), show_key(k2)),
    };
    let mut chunked = Vec::new();

    let mut models = Vec::with_capacity(n_models);
    for m in 0..n_models {
        let mut entries: OrderedMap<Item> = OrderedMap::new();
        let mut large: OrderedMap<LargeAcc<()>> = OrderedMap::new();
        for p in &parts {
            let Some(share) = p.models.get(m) else { continue };
            for (k, v) in &share.params {
                entries.set(k.clone(), Item::Value(v.clone()));
            }
            for (k, l) in &share.large {
                LargeAcc::add(&mut large, k.clone(), (), model_name(m, k), l, &p.path)?;
            }
        }
        for (k, acc) in large.items {
            if entries.contains(&k) {
                return Err(Error::DuplicateKey { key: acc.name });
            }
            let ((), name, tensor) = acc.finish()?;
            chunked.push(name);
            entries.set(k, Item::Chunked(tensor));
        }
        models.push(ModelContents { entries: entries.items, buffers: Vec::new() });
    }

    let mut optimizers = Vec::with_capacity(n_optimizers);
    for (o, base) in first.optimizers.iter().enumerate() {
        let mut state: OrderedMap<Value> = OrderedMap::new();
        let mut large: OrderedMap<LargeAcc<(Value, Value)>> = OrderedMap::new();
        for p in &parts {
            let Some(share) = p.optimizers.get(o) else { continue };
            for (k, v) in &share.state {
                state.set(k.clone(), v.clone());
            }
            for ((k1, k2), l) in &share.large {
                let id = Value::Tuple(vec![k1.clone(), k2.clone()]);
                LargeAcc::add(&mut large, id, (k1.clone(), k2.clone()), optimizer_name(o, k1, k2), l, &p.path)?;
            }
        }
        let mut entries: OrderedMap<StateEntry> = OrderedMap::new();
        for (k, v) in state.items {
            entries.set(k, StateEntry::from_value(v));
        }
        for (_, acc) in large.items {
            let ((k1, k2), name, tensor) = acc.finish()?;
            let orphan = |problem| Error::OrphanChunk { key: name.clone(), param: show(&k1), problem };
            let Some(entry) = entries.get_mut(&k1) else { return Err(orphan("no part holds")) };
            let StateEntry::Map { items, .. } = entry else { return Err(orphan("is not a dict")) };
            if items.iter().any(|(k, _)| KeyId::of(k) == KeyId::of(&k2)) {
                return Err(Error::DuplicateKey { key: name });
            }
            chunked.push(name);
            items.push((k2, Item::Chunked(tensor)));
        }
        optimizers.push(OptimizerContents { dict: base.dict.clone(), state: entries.items });
    }

    let fingerprints = parts.iter().map(|p| p.fingerprint).collect();
    let top = first.top;
    let others =
        top.items.iter().filter(|(k, _)| !k.as_str().is_some_and(|k| HEADER_KEYS.contains(&k))).cloned().collect();
    Ok(Merged { world_size, top, contents: Contents { models, optimizers, others }, chunked, fingerprints })
}

/// A key as it appears in leaf names (`str(key)`).
fn show_key(k: &Value) -> String {
    ckpt_tensor::flatten::python_str(k).unwrap_or_else(|_| show(k))
}

impl HfaiReader {
    /// Reads the checkpoint directory `dir` with default options.
    ///
    /// # Errors
    /// A specific [`Error`] for a missing part, parts that disagree on `__nshards__`, stale parts, a 1.0.0 or
    /// unknown `__version__`, chunks that do not add up to their stored shape, a part that is not a
    /// readable `torch.save` file, and every other departure from the layout hfai writes.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        Self::open_with(dir, &ReadOptions::default())
    }

    /// Reads the checkpoint directory `dir`, each part with `options` (CRC verification, pickle limits).
    ///
    /// # Errors
    /// As [`HfaiReader::open`].
    pub fn open_with(dir: impl AsRef<Path>, options: &ReadOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let merged = read_merged(dir, options)?;
        let (models, optimizers, concatenated_bytes) = merged.contents.materialize()?;
        let mut top = merged.top;
        let (mut models, mut optimizers) = (Some(models), Some(optimizers).filter(|o| !o.is_empty()));
        for (k, v) in &mut top.items {
            let merged = match k.as_str() {
                Some("model") => models.take(),
                Some("optimizer") => optimizers.take(), // none saved: the raw [] stays, as in hfai
                _ => None,
            };
            if let Some(merged) = merged {
                *v = unwrap_one(merged);
            }
        }
        Ok(HfaiReader {
            dir: dir.to_path_buf(),
            world_size: merged.world_size,
            value: Value::Dict(top),
            chunked: merged.chunked,
            concatenated_bytes,
            fingerprints: merged.fingerprints,
            leaf_index: OnceLock::new(),
        })
    }

    /// Reads `dir` on every rank of `group` (each rank gets the whole checkpoint, as with hfai's `load`), and
    /// checks that all ranks read the same part files. A rank that fails does not leave the others waiting:
    /// they all return an error.
    ///
    /// # Errors
    /// As [`HfaiReader::open`] for this rank's own failure; [`Error::RankFailed`] when another rank
    /// failed; [`Error::Inconsistent`] when a rank read different files than rank 0.
    pub fn open_collective(dir: impl AsRef<Path>, options: &ReadOptions, group: &dyn Collective) -> Result<Self> {
        let dir = dir.as_ref();
        let own = Self::open_with(dir, options);
        let reports = Report::of(&own, |c| c.fingerprints.clone()).exchange(group)?;
        let ckpt = own?;
        for (rank, r) in reports.iter().enumerate() {
            match r {
                Report::Failed(message) => return Err(Error::RankFailed { rank, message: message.clone() }),
                Report::Done(f) if Some(r) != reports.first() => {
                    let problem = format!("{} part(s) or different file sizes/contents", f.len());
                    return Err(Error::Inconsistent { dir: dir.to_path_buf(), rank, problem });
                }
                Report::Done(_) => {}
            }
        }
        Ok(ckpt)
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of parts (`__nshards__`).
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The layout version (always `"2.0.0"`: other versions are rejected).
    pub fn version(&self) -> &'static str {
        VERSION
    }

    /// The value hfai's `load` returns.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The value hfai's `load` returns, by value.
    pub fn into_value(self) -> Value {
        self.value
    }

    fn top(&self) -> Option<&Dict> {
        self.value.as_dict()
    }

    /// The merged state dict of every model, in save order.
    pub fn models(&self) -> Vec<&Dict> {
        match self.top().and_then(|t| t.get("model")) {
            Some(Value::Dict(d)) => vec![d],
            Some(Value::List(items)) => items.iter().filter_map(Value::as_dict).collect(),
            _ => Vec::new(),
        }
    }

    /// The merged state dict of the model, when exactly one model was saved.
    pub fn model(&self) -> Option<&Dict> {
        match self.models().as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }

    /// The merged state dict of every optimizer, in save order (empty when none was saved).
    pub fn optimizers(&self) -> Vec<&Dict> {
        match self.top().and_then(|t| t.get("optimizer")) {
            Some(Value::Dict(d)) => vec![d],
            Some(Value::List(items)) => items.iter().filter_map(Value::as_dict).collect(),
            _ => Vec::new(),
        }
    }

    /// The `others` items saved by rank 0, in order.
    pub fn others(&self) -> impl Iterator<Item = (&Value, &Value)> {
        self.top()
            .into_iter()
            .flat_map(|t| t.items.iter())
            .filter(|(k, _)| !k.as_str().is_some_and(|k| HEADER_KEYS.contains(&k)))
            .map(|(k, v)| (k, v))
    }

    /// The `others` item with string key `key`.
    pub fn other(&self, key: &str) -> Option<&Value> {
        self.others().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }

    /// What hfai's `save` would take to write this checkpoint again: the models, the optimizers and the
    /// `others` items. Which model entries are buffers is not recorded in a checkpoint (see
    /// [`crate::ReshardOptions::buffers`]): none is marked.
    pub fn save_state(&self) -> crate::SaveState {
        let mut state = crate::SaveState::default();
        for m in self.models() {
            state = state.with_model(crate::ModelState::new(m.clone()));
        }
        for o in self.optimizers() {
            state = state.with_optimizer(Value::Dict(o.clone()));
        }
        for (k, v) in self.others() {
            state = state.with_other(k.clone(), v.clone());
        }
        state
    }

    /// Leaf names (as [`CheckpointRead::entries`] names them) of the tensors that were stored in chunks.
    pub fn chunked(&self) -> &[String] {
        &self.chunked
    }

    /// Bytes copied to concatenate chunks; every other tensor byte is a window of a part's memory map.
    pub fn concatenated_bytes(&self) -> u64 {
        self.concatenated_bytes
    }
}

/// One element unwrapped, several as a list (hfai's `load`).
fn unwrap_one(mut values: Vec<Value>) -> Value {
    if values.len() == 1 { values.pop().unwrap_or(Value::None) } else { Value::List(values) }
}

/// Reads the checkpoint directory `dir` and returns the value hfai's `load` returns (see
/// [`HfaiReader::value`]).
///
/// # Errors
/// As [`HfaiReader::open`].
pub fn load(dir: &Path) -> Result<Value> {
    HfaiReader::open(dir).map(HfaiReader::into_value)
}

impl CheckpointRead for HfaiReader {
    fn format_name(&self) -> &'static str {
        "hfai"
    }

    fn entries(&self) -> Vec<Entry> {
        leaves(&self.value)
            .map(|l| l.into_iter().map(|e| Entry { kind: entry_kind(e.value), name: e.key }).collect())
            .unwrap_or_default()
    }

    fn details(&self) -> Vec<(String, String)> {
        vec![
            ("version".into(), VERSION.into()),
            ("parts".into(), self.world_size.to_string()),
            ("models".into(), self.models().len().to_string()),
            ("optimizers".into(), self.optimizers().len().to_string()),
            ("others".into(), self.others().count().to_string()),
            ("chunked tensors".into(), self.chunked.len().to_string()),
            ("concatenated bytes".into(), self.concatenated_bytes.to_string()),
        ]
    }

    fn tensor(&self, name: &str) -> ckpt_tensor::Result<Tensor> {
        match self.find(name)? {
            Value::OpaqueTensor { kind, .. } => Err(Error::OpaqueTensor { name: name.to_owned(), kind: *kind }.into()),
            v => v
                .as_tensor()
                .cloned()
                .ok_or_else(|| Error::NotATensor { name: name.to_owned(), type_name: v.type_name() }.into()),
        }
    }

    fn value(&self, name: &str) -> ckpt_tensor::Result<Value> {
        self.find(name).cloned()
    }
}

impl HfaiReader {
    fn find(&self, name: &str) -> ckpt_tensor::Result<&Value> {
        let missing = || ckpt_tensor::Error::from(Error::NoSuchEntry { name: name.to_owned() });
        match self.leaf_index.get_or_init(|| LeafIndex::new(&self.value).ok()) {
            Some(index) => index.get(&self.value, name).ok_or_else(missing),
            // A key whose str() is not reproduced: leaves() names the error.
            None => Err(leaves(&self.value).err().unwrap_or_else(missing)),
        }
    }
}

/// One large tensor's chunk that a part holds: flat elements `range` of the tensor `name` of `shape`.
#[derive(Debug, Clone)]
pub struct PartChunk {
    /// The tensor's leaf name, as [`HfaiReader`]'s entries name it (`model.<key>`,
    /// `optimizer.state.<param>.<name>`).
    pub name: String,
    /// The whole tensor's shape.
    pub shape: Vec<usize>,
    /// The part holding the chunk.
    pub part: usize,
    /// The chunk's elements in the flattened tensor (`torch.chunk`'s `part`-th piece).
    pub range: std::ops::Range<usize>,
    /// The chunk, 1-D: a window of the part's memory map.
    pub tensor: Tensor,
}

/// What one process of a job reads of an hfai checkpoint: only the parts of the ranks it hosts (process `p`
/// of `K` hosts parts `p, p + K, ...`, [`ckpt_collective::hosted_ranks`]); no other part is opened.
///
/// [`RankShare::value`] is laid out as [`HfaiReader::value`], holding only what those parts hold: the model
/// and optimizer entries whole in them, and, when the process hosts part 0, the model buffers and the
/// `others` items. The chunks of large tensors are in [`RankShare::chunks`]. With one process per part (the
/// job that saved it), process `r` gets exactly what rank `r` saved as its own.
#[derive(Debug, Clone)]
pub struct RankShare {
    world_size: usize,
    parts: Vec<usize>,
    value: Value,
    chunks: Vec<PartChunk>,
}

impl RankShare {
    /// Reads the parts process `process` of `processes` hosts. The number of parts is what the directory
    /// lists, checked against every part read (`__nshards__`), so a missing last part is an error, not a
    /// smaller checkpoint.
    ///
    /// # Errors
    /// As [`HfaiReader::open`], for the parts read: [`Error::MissingPart`] when the listed parts are not
    /// `0..n`, [`Error::NshardsMismatch`] when a part read says otherwise, a part that is not readable.
    pub fn read(dir: &Path, options: &ReadOptions, process: usize, processes: usize) -> Result<RankShare> {
        let (ranks, foreign) = list_parts(dir)?;
        let world_size = ranks.len();
        if let Some(rank) = (0..world_size).find(|r| ranks.binary_search(r).is_err()) {
            return Err(Error::MissingPart { path: dir.join(part_file_name(rank)), rank, world_size: None });
        }
        if world_size == 0 {
            return Err(Error::MissingPart { path: dir.join(part_file_name(0)), rank: 0, world_size: None });
        }
        if !foreign.is_empty() {
            return Err(Error::ExtraParts { dir: dir.to_path_buf(), names: foreign, world_size });
        }
        let mine = ckpt_collective::hosted_ranks(process, processes, world_size);
        let parts: Vec<Part> =
            mine.par_iter().map(|&r| Part::open(&dir.join(part_file_name(r)), options)).collect::<Result<_>>()?;
        for p in &parts {
            if p.world_size != world_size {
                return Err(Error::NshardsMismatch { path: p.path.clone(), expected: world_size, found: p.world_size });
            }
        }
        let (value, chunks) = share(&mine, &parts, world_size)?;
        Ok(RankShare { world_size, parts: mine, value, chunks })
    }

    /// [`RankShare::read`] on every process of `group`, each reading its own parts; a process that fails
    /// does not leave the others waiting: they all return an error.
    ///
    /// # Errors
    /// As [`RankShare::read`] for this process's own failure; [`Error::RankFailed`] when another failed.
    pub fn read_collective(dir: &Path, options: &ReadOptions, group: &dyn Collective) -> Result<RankShare> {
        let own = Self::read(dir, options, group.rank(), group.world_size());
        let reports = Report::of(&own, |_| Vec::new()).exchange(group)?;
        let share = own?;
        for (rank, r) in reports.iter().enumerate() {
            if let Report::Failed(message) = r {
                return Err(Error::RankFailed { rank, message: message.clone() });
            }
        }
        Ok(share)
    }

    /// The checkpoint's number of parts.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The parts read, in order.
    pub fn parts(&self) -> &[usize] {
        &self.parts
    }

    /// The parts' entries, laid out as [`HfaiReader::value`].
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The model entries whole in the parts read (one model saved), by key.
    pub fn model(&self) -> Option<&Dict> {
        self.value.as_dict().and_then(|t| t.get("model")).and_then(Value::as_dict)
    }

    /// The `others` item with string key `key` (only the process hosting part 0 has them).
    pub fn other(&self, key: &str) -> Option<&Value> {
        let top = self.value.as_dict()?;
        top.items
            .iter()
            .filter(|(k, _)| !k.as_str().is_some_and(|k| HEADER_KEYS.contains(&k)))
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// The chunks of large tensors held by the parts read, in part order.
    pub fn chunks(&self) -> &[PartChunk] {
        &self.chunks
    }
}

/// The value and chunks of `parts` (the parts `ranks` of `world_size`), merged as hfai's `load` merges, large
/// tensors left as chunks.
fn share(ranks: &[usize], parts: &[Part], world_size: usize) -> Result<(Value, Vec<PartChunk>)> {
    let n_models = parts.iter().map(|p| p.models.len()).max().unwrap_or(0);
    let n_optimizers = parts.iter().map(|p| p.optimizers.len()).max().unwrap_or(0);
    let mut chunks = Vec::new();
    let mut chunk = |name: String, large: &LargeChunk, rank: usize| {
        let numel = ckpt_tensor::checked_numel(&large.shape).unwrap_or(0);
        let range = chunk_ranges(numel, world_size).get(rank).cloned().unwrap_or(0..0);
        if range.len() != large.chunk.numel() {
            return Err(Error::ChunkSizeMismatch {
                key: name,
                shape: large.shape.clone(),
                expected: range.len(),
                found: large.chunk.numel(),
                world_size,
            });
        }
        chunks.push(PartChunk { name, shape: large.shape.clone(), part: rank, range, tensor: large.chunk.clone() });
        Ok(())
    };
    let mut models = Vec::with_capacity(n_models);
    for m in 0..n_models {
        let mut entries: OrderedMap<Item> = OrderedMap::new();
        for (p, &rank) in parts.iter().zip(ranks) {
            let Some(share) = p.models.get(m) else { continue };
            for (k, v) in &share.params {
                entries.set(k.clone(), Item::Value(v.clone()));
            }
            for (k, l) in &share.large {
                let name =
                    if n_models == 1 { format!("model.{}", show_key(k)) } else { format!("model.{m}.{}", show_key(k)) };
                chunk(name, l, rank)?;
            }
        }
        models.push(ModelContents { entries: entries.items, buffers: Vec::new() });
    }
    let mut optimizers = Vec::with_capacity(n_optimizers);
    for o in 0..n_optimizers {
        let mut state: OrderedMap<Value> = OrderedMap::new();
        let mut base = None;
        for (p, &rank) in parts.iter().zip(ranks) {
            let Some(share) = p.optimizers.get(o) else { continue };
            base = base.or(Some(&share.dict));
            for (k, v) in &share.state {
                state.set(k.clone(), v.clone());
            }
            for ((k1, k2), l) in &share.large {
                let name = match n_optimizers {
                    1 => format!("optimizer.state.{}.{}", show_key(k1), show_key(k2)),
                    _ => format!("optimizer.{o}.state.{}.{}", show_key(k1), show_key(k2)),
                };
                chunk(name, l, rank)?;
            }
        }
        let dict = base.cloned().unwrap_or_else(|| Dict::new(ckpt_tensor::DictKind::Dict));
        let state = state.items.into_iter().map(|(k, v)| (k, StateEntry::from_value(v))).collect();
        optimizers.push(OptimizerContents { dict, state });
    }
    let contents = Contents { models, optimizers, others: Vec::new() };
    let (models, optimizers, _) = contents.materialize()?;
    // Part 0's dict (header, `others`) when it was read, else the header alone.
    let mut top = match ranks.first().zip(parts.first()) {
        Some((0, p)) => p.top.clone(),
        _ => {
            let mut top = Dict::new(ckpt_tensor::DictKind::Dict);
            top.insert("__nshards__", Value::Int(i64::try_from(world_size).unwrap_or(i64::MAX)));
            top.insert("__version__", VERSION);
            top.insert("model", Value::List(Vec::new()));
            top.insert("optimizer", Value::List(Vec::new()));
            top
        }
    };
    let (mut models, mut optimizers) = (Some(models), Some(optimizers).filter(|o| !o.is_empty()));
    for (k, v) in &mut top.items {
        let merged = match k.as_str() {
            Some("model") => models.take(),
            Some("optimizer") => optimizers.take(),
            _ => None,
        };
        if let Some(merged) = merged {
            *v = unwrap_one(merged);
        }
    }
    Ok((Value::Dict(top), chunks))
}
