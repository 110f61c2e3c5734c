//! The one `__metadata__` convention of the safetensors files ckpt writes (from any format: the facade's
//! conversions, `ckpt_pbg::export_safetensors`, `ckpt_distcp::convert`, Hugging Face shards), so that a
//! checkpoint converted through safetensors loses nothing and reads back the same whoever wrote it.
//! `__metadata__` is a string → string map:
//!
//! | key | value |
//! |---|---|
//! | `format` | `pt`, what Hugging Face loaders expect |
//! | `ckpt.source` | the format the checkpoint was converted from (`torch`, `distcp`, `pbg`, ...), when known |
//! | `ckpt.paths` | a JSON object from each entry name to its path in the nested state dict (`["model", "layers", 0, "weight"]`: strings are mapping keys, integers list indices), in the source's entry order; left out when every path is its name and the file's own order is the source's |
//! | `ckpt.values` | a JSON object from entry name to value, in the typed encoding of [`values`], for every entry that is not a plain tensor stored under its name: non-tensor values (`None`, bools, ints of any size, floats with NaN, infinities and -0.0, strings, bytes, tuples, lists, sets, dicts with their kind, key types and attributes, `torch.Size`, dtypes, devices, globals, any pickled object), parameters, tensors with `requires_grad` or attributes, tensors of dtypes safetensors lacks, quantized, sparse and nested tensors (their layout, dtype, shape and axis; their components are tensors of the file: `<name>` the int representation, `<name>.scale`, `<name>.zero_point`, `<name>.indices`, ...), opaque (meta, ...) tensors |
//!
//! Tensors an encoded value holds (a tuple of tensors, a parameter's data, the storages of a sparse tensor)
//! are tensors of the file that the encoding names; a value's top-level tensor is stored under the entry's
//! own name, tensors inside it under `<entry>.<position>`. Other safetensors readers ignore the `ckpt.*`
//! keys and see every stored tensor. Files of earlier ckpt versions, whose `ckpt.values` held JSON scalars
//! only, are a subset of this encoding and read the same. A record that is not of this shape is ignored when
//! read (the file then reads as tensors under flat names).
//!
//! Nothing is dropped except what cannot be read at all (a tensor whose data cannot be gathered).
//!
//! ```
//! use ckpt_safetensors::{self as safetensors, metadata};
//! use ckpt_tensor::{CheckpointRead, PathItem, Tensor, Value};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("m.safetensors");
//! let w = Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap());
//! let betas = Value::Tuple(vec![Value::Float(0.9), Value::Float(0.999)]);
//! let sd = Value::dict([("model", Value::dict([("w", w)])), ("betas", betas.clone()), ("raw", Value::Bytes(vec![1]))]);
//! let options = metadata::WriteOptions::default().with_source("distcp");
//! // DCP's flattening keeps a tuple whole: one entry `betas`.
//! let flat = ckpt_tensor::flatten(&sd).unwrap();
//! let report = metadata::save_entries(flat.iter().map(|e| (e.key.as_str(), e.path.as_slice(), e.value)), &path, &options).unwrap();
//! assert_eq!((report.tensors, report.values, report.dropped.len()), (1, 2, 0));
//!
//! let back = safetensors::SafetensorsReader::open(&path).unwrap();
//! assert_eq!(back.metadata.as_ref().unwrap()["ckpt.source"], "distcp");
//! let names: Vec<String> = back.entries().into_iter().map(|e| e.name).collect();
//! assert_eq!(names, ["model.w", "betas", "raw"]);
//! assert_eq!(back.records().path_of("model.w"), [PathItem::Key("model".into()), PathItem::Key("w".into())]);
//! assert_eq!(back.value("betas").unwrap(), betas);
//! assert_eq!(back.value("raw").unwrap(), Value::Bytes(vec![1]));
//! ```

pub mod values;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde_json::Value as Json;

use ckpt_io::Durability;
use ckpt_tensor::Result;
use ckpt_tensor::{Entry, EntryKind, TensorInfo, entry_kind};

use crate::SafetensorsError;
use ckpt_io::SaveReport;
use ckpt_tensor::{PathItem, leaves};
use ckpt_tensor::{Tensor, Value};
use values::{Decoder, Encoder};

use crate::write::write_file_with;

/// `__metadata__` key of the format tag.
pub const FORMAT_KEY: &str = "format";
/// The format tag ckpt writes: `pt`.
pub const FORMAT_PT: &str = "pt";
/// `__metadata__` key of the source format.
pub const SOURCE_KEY: &str = "ckpt.source";
/// `__metadata__` key of the paths record.
pub const PATHS_KEY: &str = "ckpt.paths";
/// `__metadata__` key of the values record.
pub const VALUES_KEY: &str = "ckpt.values";

/// Whether a file written by ckpt keeps `value` as a plain tensor under its name (no `ckpt.values` record):
/// a dense tensor of a dtype safetensors has, without `requires_grad`.
pub fn is_plain_tensor(value: &Value) -> bool {
    matches!(value, Value::Tensor(t) if !t.requires_grad() && crate::safetensors_dtype(t.dtype()).is_ok())
}

/// The `__metadata__` of a file ckpt writes, built entry by entry.
///
/// Record every entry's name ([`Metadata::path`]) before the values, so that the tensors a value holds get
/// names no entry has.
///
/// ```
/// use ckpt_safetensors::metadata::Metadata;
/// use ckpt_tensor::{PathItem, Value};
/// let mut m = Metadata::new("distcp");
/// m.path("model.w", &[PathItem::Key("model".into()), PathItem::Key("w".into())]);
/// m.path("step", &[PathItem::Key("step".into())]);
/// assert!(m.value("step", &Value::Int(3)));
/// let map = m.into_map();
/// assert_eq!((map["format"].as_str(), map["ckpt.values"].as_str()), ("pt", r#"{"step":3}"#));
/// ```
#[derive(Debug, Default)]
pub struct Metadata {
    source: Option<String>,
    paths: Vec<(String, Vec<PathItem>)>,
    values: serde_json::Map<String, Json>,
    encoder: Encoder,
    /// Whether the entries' order differs from the order of the file's tensors.
    reordered: bool,
}

impl Metadata {
    /// The metadata of a conversion from format `source` (without one, [`Metadata::default`]).
    pub fn new(source: &str) -> Self {
        Metadata { source: Some(source.to_owned()), ..Metadata::default() }
    }

    /// Records the path of entry `name` (every entry written, tensor or value), in the source's order.
    pub fn path(&mut self, name: &str, path: &[PathItem]) {
        self.encoder.taken.insert(name.to_owned());
        self.paths.push((name.to_owned(), path.to_vec()));
    }

    /// Records that the file's tensors are not in the order of the entries ([`Metadata::path`]), so that
    /// `ckpt.paths` is written even for flat names.
    pub fn set_reordered(&mut self) {
        self.reordered = true;
    }

    /// Records the entry `name` when its encoding holds no tensor (every value but tensors and values holding
    /// tensors); whether it did.
    pub fn value(&mut self, name: &str, value: &Value) -> bool {
        let mut probe = Encoder { taken: self.encoder.taken.clone(), stored: Vec::new() };
        match probe.entry(name, value) {
            Ok(json) if probe.stored.is_empty() => {
                self.values.insert(name.to_owned(), json);
                true
            }
            _ => false,
        }
    }

    /// Records the entry `name` whatever it holds; returns the tensors its encoding refers to, which the
    /// caller writes into the same file under the names given (a top-level tensor under `name` itself).
    ///
    /// # Errors
    /// When a tensor's data cannot be gathered, or a dtype has no safetensors carrier.
    pub fn value_with_tensors(&mut self, name: &str, value: &Value) -> Result<Vec<(String, Tensor)>> {
        let json = self.encoder.entry(name, value)?;
        self.values.insert(name.to_owned(), json);
        Ok(std::mem::take(&mut self.encoder.stored))
    }

    /// The `__metadata__` map: `format`, `ckpt.source` (when known), and `ckpt.paths` (unless every path is
    /// just its name in the file's order) and `ckpt.values` (unless there are none).
    pub fn into_map(self) -> HashMap<String, String> {
        let mut map = HashMap::from([(FORMAT_KEY.to_owned(), FORMAT_PT.to_owned())]);
        if let Some(source) = self.source {
            map.insert(SOURCE_KEY.to_owned(), source);
        }
        let nested = self.paths.iter().any(|(name, path)| !matches!(path.as_slice(), [PathItem::Key(k)] if k == name));
        if nested || self.reordered || !self.values.is_empty() {
            let paths: serde_json::Map<String, Json> = self
                .paths
                .into_iter()
                .map(|(name, path)| {
                    let steps = path
                        .into_iter()
                        .map(|p| match p {
                            PathItem::Key(k) => Json::String(k),
                            PathItem::Index(i) => Json::from(i),
                        })
                        .collect();
                    (name, Json::Array(steps))
                })
                .collect();
            map.insert(PATHS_KEY.to_owned(), Json::Object(paths).to_string());
        }
        if !self.values.is_empty() {
            map.insert(VALUES_KEY.to_owned(), Json::Object(self.values).to_string());
        }
        map
    }
}

/// What ckpt recorded in a file: the entries in the source's order with their paths, and the values of
/// `ckpt.values` with the tensors they hold resolved.
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// Entry names with their paths, in the source's order (empty when not recorded).
    order: Vec<(String, Vec<PathItem>)>,
    paths: HashMap<String, usize>,
    /// Value entries, by name, in the record's order.
    pub values: Vec<(String, Value)>,
    /// Tensors of the file that values hold under other names (not entries of their own).
    hidden: HashSet<String>,
    /// Where each value is in `values`, and each tensor in the tensors given to [`Records::read`], by name:
    /// looking an entry up takes constant time, not a scan (20,000-tensor files are read entry by entry).
    value_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
    /// The tensors inside each object value, by the value's name: entries of their own after it, named as
    /// [`ckpt_tensor::flatten::entry_names`] names them (the names the writer stored them under), as a torch file's reader
    /// lists them.
    inside: Vec<(String, Vec<(String, Value)>)>,
}

impl Records {
    /// Reads the records of a file's `__metadata__`, whose tensors are `tensors` (a damaged record is
    /// ignored).
    pub fn read(metadata: Option<&HashMap<String, String>>, tensors: &[(String, Tensor)]) -> Self {
        let record = |key: &str| metadata.and_then(|m| m.get(key));
        let order = record(PATHS_KEY).and_then(|p| parse_paths(p)).unwrap_or_default();
        let by_name: HashMap<&str, &Tensor> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut decoder = Decoder::new(&by_name);
        let values = record(VALUES_KEY).and_then(|v| parse_values(v, &mut decoder)).unwrap_or_default();
        let value_names: HashSet<&str> = values.iter().map(|(n, _)| n.as_str()).collect();
        // A value whose name is a tensor's must be that tensor's record (it refers to it); else the tensor wins.
        let values: Vec<(String, Value)> = values
            .iter()
            .filter(|(name, _)| !by_name.contains_key(name.as_str()) || decoder.used.contains(name))
            .cloned()
            .collect();
        let hidden =
            decoder.used.iter().filter(|n| !value_names.contains(n.as_str())).cloned().collect::<HashSet<String>>();
        let paths = order.iter().enumerate().map(|(i, (n, _))| (n.clone(), i)).collect();
        let value_index = values.iter().enumerate().map(|(i, (n, _))| (n.clone(), i)).collect();
        let tensor_index = tensors.iter().enumerate().map(|(i, (n, _))| (n.clone(), i)).collect();
        let inside = values
            .iter()
            .filter_map(|(name, v)| {
                let tensors = tensors_inside(name, v, &decoder.used);
                (!tensors.is_empty()).then(|| (name.clone(), tensors))
            })
            .collect();
        Records { order, paths, values, hidden, value_index, tensor_index, inside }
    }

    /// The tensors inside the object value `name` ([`Records::inside`]).
    fn inside_of(&self, name: &str) -> &[(String, Value)] {
        self.inside.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_slice()).unwrap_or_default()
    }

    /// The path of entry `name`: the recorded one, else the name as a single key.
    pub fn path_of(&self, name: &str) -> Vec<PathItem> {
        match self.paths.get(name).and_then(|&i| self.order.get(i)) {
            Some((_, p)) => p.clone(),
            None => vec![PathItem::Key(name.to_owned())],
        }
    }

    /// Whether the file's tensor `name` is held by a value rather than an entry of its own.
    pub fn is_hidden(&self, name: &str) -> bool {
        self.hidden.contains(name)
    }

    /// Every entry of a file with `tensors`, as (name, value): in the recorded order, then tensors not
    /// recorded (file order), then values not recorded. Values win over the tensors they hold.
    pub fn entries<'a>(&'a self, tensors: &'a [(String, Tensor)]) -> Vec<(&'a str, EntryRef<'a>)> {
        let values: HashMap<&str, &Value> = self.values.iter().map(|(n, v)| (n.as_str(), v)).collect();
        let stored: HashMap<&str, &Tensor> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut out = Vec::with_capacity(tensors.len() + self.values.len());
        let mut seen: HashSet<&str> = HashSet::new();
        let mut push = |name: &'a str, out: &mut Vec<(&'a str, EntryRef<'a>)>| {
            if seen.contains(name) {
                return;
            }
            if let Some(v) = values.get(name) {
                seen.insert(name);
                out.push((name, EntryRef::Value(v)));
                for (inner, t) in self.inside_of(name) {
                    if seen.insert(inner.as_str()) {
                        out.push((inner.as_str(), EntryRef::Value(t)));
                    }
                }
            } else if let Some(t) = stored.get(name).filter(|_| !self.hidden.contains(name)) {
                seen.insert(name);
                out.push((name, EntryRef::Tensor(t)));
            }
        };
        for (name, _) in &self.order {
            push(name, &mut out);
        }
        for (name, _) in tensors {
            push(name, &mut out);
        }
        for (name, _) in &self.values {
            push(name, &mut out);
        }
        out
    }

    /// The entry `name` of a file with `tensors`: a recorded value, or a stored tensor that no value holds.
    pub fn entry<'a>(&'a self, tensors: &'a [(String, Tensor)], name: &str) -> Option<EntryRef<'a>> {
        let indexed = self.value_index.get(name).and_then(|&i| self.values.get(i)).filter(|(n, _)| n == name);
        if let Some((_, v)) = indexed.or_else(|| self.values.iter().find(|(n, _)| n == name)) {
            return Some(EntryRef::Value(v));
        }
        if let Some((_, t)) = self.inside.iter().flat_map(|(_, t)| t).find(|(n, _)| n == name) {
            return Some(EntryRef::Value(t));
        }
        if self.hidden.contains(name) {
            return None;
        }
        // The index is of the tensors the records were read with; other tensors are searched.
        let indexed = self.tensor_index.get(name).and_then(|&i| tensors.get(i)).filter(|(n, _)| n == name);
        indexed.or_else(|| tensors.iter().find(|(n, _)| n == name)).map(|(_, t)| EntryRef::Tensor(t))
    }

    /// Every entry as (name, path in the nested state dict, value), in [`Records::entries`]' order.
    pub fn leaves(&self, tensors: &[(String, Tensor)]) -> Vec<(String, Vec<PathItem>, Value)> {
        self.entries(tensors).into_iter().map(|(name, e)| (name.to_owned(), self.path_of(name), e.to_value())).collect()
    }

    /// Every entry's name and kind, in [`Records::entries`]' order (what a reader lists).
    pub fn entry_list(&self, tensors: &[(String, Tensor)]) -> Vec<Entry> {
        self.entries(tensors).into_iter().map(|(name, e)| Entry { name: name.to_owned(), kind: e.kind() }).collect()
    }

    /// The dense tensor of entry `name`.
    ///
    /// # Errors
    /// [`SafetensorsError::NoSuchTensor`] when there is no such entry, [`SafetensorsError::NotADenseTensor`]
    /// when it is not a dense tensor.
    pub fn tensor(&self, tensors: &[(String, Tensor)], name: &str) -> Result<Tensor> {
        match self.entry(tensors, name) {
            Some(EntryRef::Tensor(t)) => Ok(t.clone()),
            Some(EntryRef::Value(Value::Composite(c))) => {
                Err(SafetensorsError::CompositeTensor { name: name.to_owned(), layout: c.layout }.into())
            }
            Some(EntryRef::Value(v)) => {
                v.as_tensor().cloned().ok_or_else(|| SafetensorsError::NotADenseTensor { name: name.to_owned() }.into())
            }
            None => Err(SafetensorsError::NoSuchTensor { name: name.to_owned() }.into()),
        }
    }

    /// The value of entry `name`.
    ///
    /// # Errors
    /// [`SafetensorsError::NoSuchEntry`] when there is no such entry.
    pub fn value(&self, tensors: &[(String, Tensor)], name: &str) -> Result<Value> {
        self.entry(tensors, name)
            .map(EntryRef::to_value)
            .ok_or_else(|| SafetensorsError::NoSuchEntry { name: name.to_owned() }.into())
    }
}

/// The tensors inside the object value `v` of entry `name` ([`ckpt_tensor::flatten::object_tensors`]) that the file stores
/// under those names (`used`: the stored tensors the values refer to).
fn tensors_inside(name: &str, v: &Value, used: &HashSet<String>) -> Vec<(String, Value)> {
    ckpt_tensor::flatten::object_tensors(v)
        .into_iter()
        .map(|(inner, t)| (format!("{name}.{inner}"), t))
        .filter(|(n, _)| used.contains(n))
        .map(|(n, t)| (n, t.clone()))
        .collect()
}

/// An entry of a file: a stored tensor, or a recorded value.
#[derive(Debug, Clone, Copy)]
pub enum EntryRef<'a> {
    /// A plain tensor stored under the entry's name.
    Tensor(&'a Tensor),
    /// A value of `ckpt.values` (its tensors resolved).
    Value(&'a Value),
}

impl EntryRef<'_> {
    /// The entry as a value (a tensor as [`Value::Tensor`]).
    pub fn to_value(self) -> Value {
        match self {
            EntryRef::Tensor(t) => Value::Tensor(t.clone()),
            EntryRef::Value(v) => v.clone(),
        }
    }

    /// What a reader lists for the entry.
    pub fn kind(self) -> EntryKind {
        match self {
            EntryRef::Tensor(t) => EntryKind::Tensor(TensorInfo { dtype: t.dtype(), shape: t.shape().to_vec() }),
            EntryRef::Value(v) => entry_kind(v),
        }
    }
}

/// Parses `ckpt.values`; `None` when it is not an object of encoded values.
fn parse_values(text: &str, decoder: &mut Decoder<'_>) -> Option<Vec<(String, Value)>> {
    let json: Json = serde_json::from_str(text).ok()?;
    json.as_object()?.iter().map(|(name, v)| Some((name.clone(), decoder.decode(v).ok()?))).collect()
}

/// Parses `ckpt.paths` (`{"name": ["model", 0, "w"], ...}`); `None` when it is not that shape.
fn parse_paths(text: &str) -> Option<Vec<(String, Vec<PathItem>)>> {
    let json: Json = serde_json::from_str(text).ok()?;
    let mut out = Vec::new();
    for (name, steps) in json.as_object()? {
        let steps = steps.as_array()?;
        let mut path = Vec::with_capacity(steps.len());
        for s in steps {
            path.push(match s {
                Json::String(k) => PathItem::Key(k.clone()),
                Json::Number(n) => PathItem::Index(usize::try_from(n.as_u64()?).ok()?),
                _ => return None,
            });
        }
        if path.is_empty() {
            return None;
        }
        out.push((name.clone(), path));
    }
    Some(out)
}

/// Options of [`save`] and [`save_entries`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteOptions {
    /// The format the checkpoint is converted from (`ckpt.source`), when known.
    pub source: Option<String>,
    /// How durably the file is written. With [`Durability::checksums`] (the default) the CRC32C of every
    /// tensor is recorded in the header ([`super::CHECKSUMS_KEY`]), so that a changed byte of tensor data
    /// is detected by `ckpt verify --deep`. Every safetensors reader loads the file either way; off, the
    /// file is byte for byte what the `safetensors` crate's `serialize` writes.
    pub durability: Durability,
}

impl WriteOptions {
    /// These options with `durability` ([`WriteOptions::durability`]).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// These options recording `source` as the format converted from.
    #[must_use]
    pub fn with_source(mut self, source: &str) -> Self {
        self.source = Some(source.to_owned());
        self
    }
}

/// What [`prepare`] gives: the file's tensors by name, its `__metadata__`, and what was written or dropped.
pub type Prepared = (Vec<(String, Tensor)>, HashMap<String, String>, SaveReport);

/// The tensors and metadata of a ckpt safetensors file for `entries` (name, path in the nested state dict,
/// value), without writing it: plain tensors under their names, everything else in `ckpt.values` with the
/// tensors it holds.
///
/// # Errors
/// Never for values; the report lists entries that could not be encoded.
pub fn prepare<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a [PathItem], &'a Value)>,
    options: &WriteOptions,
) -> Result<Prepared> {
    let entries: Vec<(&str, &[PathItem], &Value)> = entries.into_iter().collect();
    let mut report = SaveReport::default();
    let mut metadata = Metadata { source: options.source.clone(), ..Metadata::default() };
    let mut names = HashSet::new();
    for (name, path, _) in &entries {
        if !names.insert(*name) {
            return Err(SafetensorsError::DuplicateEntry { name: (*name).to_owned() }.into());
        }
        metadata.path(name, path);
    }
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let mut kept_paths = Vec::with_capacity(entries.len());
    for (name, path, value) in entries {
        if is_plain_tensor(value) {
            if let Some(t) = value.as_tensor() {
                tensors.push((name.to_owned(), t.clone()));
                report.tensors += 1;
                kept_paths.push((name, path));
                continue;
            }
        }
        match metadata.value_with_tensors(name, value) {
            Ok(stored) => {
                if value.as_tensor().is_some() || matches!(value, Value::Composite(_)) {
                    report.tensors += 1;
                } else {
                    report.values += 1;
                    // An object's tensors are entries of their own when the file is read back.
                    report.tensors += ckpt_tensor::flatten::object_tensors(value).len();
                }
                tensors.extend(stored);
                kept_paths.push((name, path));
            }
            Err(_) => report.dropped.push(name.to_owned()),
        }
    }
    report.bytes = tensors.iter().map(|(_, t)| t.nbytes() as u64).sum();
    // Only the entries written keep a path, in the source's order.
    metadata.paths = kept_paths.into_iter().map(|(n, p)| (n.to_owned(), p.to_vec())).collect();
    if !in_file_order(&tensors, &metadata.paths) {
        metadata.set_reordered();
    }
    Ok((tensors, metadata.into_map(), report))
}

/// Whether the entries (all tensors) are already in the order the file stores tensors in (the `safetensors`
/// crate's: descending dtype alignment, then name).
fn in_file_order(tensors: &[(String, Tensor)], paths: &[(String, Vec<PathItem>)]) -> bool {
    if tensors.len() != paths.len() {
        return false;
    }
    let key = |(n, t): &(String, Tensor)| (std::cmp::Reverse(crate::safetensors_dtype(t.dtype()).ok()), n.clone());
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by_key(|e| key(e));
    sorted.iter().zip(paths).all(|((n, _), (p, _))| n == p)
}

/// Writes `entries` (name, path in the nested state dict, value) as one safetensors file at `path`
/// (atomically), following the convention ([`prepare`]).
///
/// # Errors
/// As [`write_file`](super::write_file); [`SafetensorsError::DuplicateEntry`] for two entries of one name.
pub fn save_entries<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a [PathItem], &'a Value)>,
    path: &Path,
    options: &WriteOptions,
) -> Result<SaveReport> {
    let (tensors, metadata, report) = prepare(entries, options)?;
    write_file_with(&tensors, Some(metadata), path, &options.durability)?;
    Ok(report.with_files(vec![path.to_path_buf()]))
}

/// Writes the state dict `value` as one safetensors file at `path`: [`save_entries`] of its leaves (every
/// mapping, list and tuple descended into, names joined with `.`).
///
/// # Errors
/// As [`save_entries`]; [`Fault::InvalidArgument`](ckpt_tensor::Fault::InvalidArgument) for keys that cannot name a leaf.
pub fn save(value: &Value, path: impl AsRef<Path>, options: &WriteOptions) -> Result<SaveReport> {
    let path = path.as_ref();
    let leaves = leaves(value)?;
    save_entries(leaves.iter().map(|l| (l.key.as_str(), l.path.as_slice(), l.value)), path, options)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use ckpt_tensor::{DType, Dict, DictKind, Object, OpaqueTensorKind};

    fn round_trip(entries: &[(&str, Value)]) -> (Vec<(String, Value)>, HashMap<String, String>) {
        let paths: Vec<Vec<PathItem>> = entries.iter().map(|(n, _)| vec![PathItem::Key((*n).to_owned())]).collect();
        let (tensors, meta, report) =
            prepare(entries.iter().zip(&paths).map(|((n, v), p)| (*n, p.as_slice(), v)), &WriteOptions::default())
                .unwrap();
        assert!(report.dropped.is_empty(), "{:?}", report.dropped);
        let bytes = super::super::to_bytes(&tensors, Some(meta.clone())).unwrap();
        let file = super::super::read(&ckpt_tensor::Buffer::from_vec(bytes)).unwrap();
        let got = file
            .records()
            .entries(&file.tensors)
            .into_iter()
            .map(|(n, e)| {
                let v = match e {
                    EntryRef::Tensor(t) => Value::Tensor(t.clone()),
                    EntryRef::Value(v) => v.clone(),
                };
                (n.to_owned(), v)
            })
            .collect();
        (got, meta)
    }

    #[test]
    fn every_value_kind_round_trips() {
        let t = Tensor::from_slice(&[1.0f32, -2.0], &[2]).unwrap();
        let c128 = Tensor::from_slice(&[1.0f64, 2.0, -0.0, f64::NAN], &[4]).unwrap().reshape(&[4]).unwrap();
        let c128 = Tensor::from_buffer(DType::C128, &[2], c128.storage().clone()).unwrap();
        let mut od = Dict::new(DictKind::OrderedDict);
        od.insert(Value::Int(0), Value::Str("zero".into()));
        od.insert(Value::Tuple(vec![Value::Int(1)]), Value::None);
        od.attrs = Some(Box::new(Value::dict([(
            "_metadata",
            Value::dict([("", Value::dict([("version", Value::Int(1))]))]),
        )])));
        let object = Object {
            callable: Value::Global { module: "my.mod".into(), name: "Thing".into() },
            args: Value::Tuple(vec![]),
            newobj: true,
            state: Some(Value::dict([("x", Value::Float(f64::NEG_INFINITY))])),
            list_items: vec![Value::Int(1)],
            dict_items: vec![(Value::Str("k".into()), Value::Bool(false))],
        };
        let storage = Value::Storage { dtype: DType::F32, data: t.storage().clone() };
        let entries = vec![
            ("none", Value::None),
            ("flag", Value::Bool(true)),
            ("int", Value::Int(-3)),
            ("big", Value::BigInt(bigint_from("-1267650600228229401496703205376"))),
            ("floats", Value::List(vec![Value::Float(-0.0), Value::Float(f64::NAN), Value::Float(1e-310)])),
            ("complex", Value::Complex(1.5, f64::INFINITY)),
            ("str", Value::Str("h\u{e9}llo\u{0}".into())),
            ("bytes", Value::Bytes(vec![0, 255, 128])),
            ("big_bytes", Value::ByteArray((0..5000u32).map(|i| (i % 251) as u8).collect())),
            ("betas", Value::Tuple(vec![Value::Float(0.9), Value::Float(0.999)])),
            ("set", Value::Set(vec![Value::Int(1), Value::Str("a".into())])),
            ("frozen", Value::FrozenSet(vec![])),
            ("odict", Value::Dict(od)),
            ("size", Value::Size(vec![2, 3])),
            ("dtype", Value::DType(DType::BF16)),
            (
                "devices",
                Value::List(vec![
                    Value::Device { kind: "cuda".into(), index: Some(1) },
                    Value::Device { kind: "cpu".into(), index: None },
                ]),
            ),
            ("tup", Value::Tuple(vec![Value::Tensor(t.clone()), Value::Int(1)])),
            (
                "param",
                Value::Parameter {
                    tensor: t.clone().with_requires_grad(true),
                    state: Some(Box::new(Value::dict([("tag", Value::Str("tied".into()))]))),
                },
            ),
            ("grad", Value::Tensor(t.clone().with_requires_grad(true))),
            ("c128", Value::Tensor(c128)),
            (
                "opaque",
                Value::OpaqueTensor {
                    kind: OpaqueTensorKind::Sparse,
                    object: Box::new(Object {
                        callable: Value::Global {
                            module: "torch._utils".into(),
                            name: "_rebuild_sparse_tensor".into(),
                        },
                        args: Value::Tuple(vec![storage.clone()]),
                        newobj: false,
                        state: None,
                        list_items: vec![],
                        dict_items: vec![],
                    }),
                },
            ),
            ("object", Value::Object(Box::new(object))),
            ("storage", storage),
            ("plain", Value::Tensor(t)),
        ];
        let (got, meta) = round_trip(&entries);
        let want: Vec<(String, Value)> = entries.iter().map(|(n, v)| ((*n).to_owned(), v.clone())).collect();
        assert_eq!(got.len(), want.len());
        for ((gn, gv), (wn, wv)) in got.iter().zip(&want) {
            assert_eq!(gn, wn);
            assert!(gv.same(wv), "{gn}: {gv:?} != {wv:?}");
        }
        assert!(meta[VALUES_KEY].contains(r#""betas":{"tuple":[0.9,0.999]}"#), "{}", meta[VALUES_KEY]);
        assert!(!meta[VALUES_KEY].contains("\"plain\""));
    }

    fn bigint_from(text: &str) -> Vec<u8> {
        values::bigint_from_decimal(text).unwrap()
    }

    #[test]
    fn old_scalar_records_still_read() {
        let meta = HashMap::from([
            (VALUES_KEY.to_owned(), r#"{"epoch": 3, "lr": 0.001, "name": "x", "none": null, "flag": true}"#.to_owned()),
            (PATHS_KEY.to_owned(), r#"{"w": ["model", "w"], "epoch": ["epoch"]}"#.to_owned()),
        ]);
        let t = Tensor::from_slice(&[1.0f32], &[1]).unwrap();
        let r = Records::read(Some(&meta), &[("w".to_owned(), t)]);
        assert_eq!(r.values[0], ("epoch".to_owned(), Value::Int(3)));
        assert_eq!(r.values[1], ("lr".to_owned(), Value::Float(0.001)));
        assert_eq!(r.path_of("w"), [PathItem::Key("model".into()), PathItem::Key("w".into())]);
        // A damaged record is ignored: names are their own paths.
        let damaged =
            HashMap::from([(PATHS_KEY.to_owned(), "{".to_owned()), (VALUES_KEY.to_owned(), "[1]".to_owned())]);
        let r = Records::read(Some(&damaged), &[]);
        assert_eq!(r.path_of("a.b"), [PathItem::Key("a.b".into())]);
        assert!(r.values.is_empty());
    }

    #[test]
    fn flat_tensors_in_file_order_need_no_paths() {
        let a = Tensor::from_slice(&[1.0f32], &[1]).unwrap();
        let b = Tensor::from_slice(&[1u8], &[1]).unwrap();
        let key = [PathItem::Key("a".into())];
        let keyb = [PathItem::Key("b".into())];
        let va = Value::Tensor(a);
        let vb = Value::Tensor(b);
        let (_, meta, _) = prepare([("a", &key[..], &va), ("b", &keyb[..], &vb)], &WriteOptions::default()).unwrap();
        assert!(!meta.contains_key(PATHS_KEY));
        // U8 sorts after F32 in the file; the other order is recorded.
        let (_, meta, _) = prepare([("b", &keyb[..], &vb), ("a", &key[..], &va)], &WriteOptions::default()).unwrap();
        assert_eq!(meta[PATHS_KEY], r#"{"b":["b"],"a":["a"]}"#);
        assert!(prepare([("a", &key[..], &va), ("a", &key[..], &vb)], &WriteOptions::default()).is_err());
    }
}
