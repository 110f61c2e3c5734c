//! The one `__metadata__` convention of the safetensors files ckpt writes (from any format: the facade's
//! conversions, `ckpt_pbg::export_safetensors`, `ckpt_distcp::convert`), so that a checkpoint converted
//! through safetensors loses as little as it can and reads back the same whoever wrote it. `__metadata__` is
//! a string → string map:
//!
//! | key | value |
//! |---|---|
//! | `format` | `pt`, what Hugging Face loaders expect |
//! | `ckpt.source` | the format the checkpoint was converted from (`torch`, `distcp`, `pbg`, ...), when known |
//! | `ckpt.paths` | when the source was nested: a JSON object from each entry name to its path in the nested state dict (`["model", "layers", 0, "weight"]`: strings are mapping keys, integers list indices) |
//! | `ckpt.values` | a JSON object from name to value, for the non-tensor entries JSON holds exactly: `None`, `bool`, `int` (within i64), finite `float` (always written with a fraction or exponent, so it reads back as a float) and `str` |
//!
//! Other safetensors readers ignore the `ckpt.*` keys. A record that is not of this shape is ignored when
//! read (the file then reads as tensors under flat names).
//!
//! ```
//! use ckpt_core::safetensors::{self, metadata};
//! use ckpt_core::{CheckpointRead, PathItem, Tensor, Value};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("m.safetensors");
//! let w = Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap());
//! let sd = Value::dict([("model", Value::dict([("w", w)])), ("epoch", Value::Int(3)), ("raw", Value::Bytes(vec![1]))]);
//! let options = metadata::WriteOptions::default().with_source("torch");
//! let report = metadata::save(&sd, &path, &options).unwrap();
//! assert_eq!((report.tensors, report.values, report.dropped.clone()), (1, 1, vec!["raw".to_owned()]));
//!
//! let back = safetensors::SafetensorsReader::open(&path).unwrap();
//! assert_eq!(back.metadata.as_ref().unwrap()["ckpt.source"], "torch");
//! let names: Vec<String> = back.entries().into_iter().map(|e| e.name).collect();
//! assert_eq!(names, ["model.w", "epoch"]);
//! assert_eq!(back.records().path_of("model.w"), [PathItem::Key("model".into()), PathItem::Key("w".into())]);
//! assert_eq!(back.value("epoch").unwrap(), Value::Int(3));
//! ```

use std::collections::HashMap;
use std::path::Path;

use crate::flatten::{PathItem, leaves};
use crate::value::Value;

use super::write_file;
use crate::error::Result;

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

/// The JSON form of `value`, when it is a scalar JSON holds exactly (what `ckpt.values` keeps).
pub fn value_to_json(value: &Value) -> Option<serde_json::Value> {
    Some(match value {
        Value::None => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Int(i) => serde_json::Value::from(*i),
        Value::Float(f) if f.is_finite() => serde_json::Value::from(*f),
        Value::Str(s) => serde_json::Value::String(s.clone()),
        _ => return None,
    })
}

fn value_from_json(json: &serde_json::Value) -> Option<Value> {
    Some(match json {
        serde_json::Value::Null => Value::None,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            // serde_json writes an f64 with a fraction or exponent (`3.0`), so an integer literal was an int.
            Some(i) if !n.is_f64() => Value::Int(i),
            _ => Value::Float(n.as_f64()?),
        },
        serde_json::Value::String(s) => Value::Str(s.clone()),
        _ => return None,
    })
}

/// The `__metadata__` of a file ckpt writes, built entry by entry.
///
/// ```
/// use ckpt_core::safetensors::metadata::Metadata;
/// use ckpt_core::{PathItem, Value};
/// let mut m = Metadata::new("distcp");
/// m.path("model.w", &[PathItem::Key("model".into()), PathItem::Key("w".into())]);
/// assert!(m.value("step", &Value::Int(3)));
/// assert!(!m.value("names", &Value::List(vec![])));          // JSON cannot hold it exactly: not recorded
/// let map = m.into_map();
/// assert_eq!((map["format"].as_str(), map["ckpt.values"].as_str()), ("pt", r#"{"step":3}"#));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    source: Option<String>,
    paths: Vec<(String, Vec<PathItem>)>,
    values: serde_json::Map<String, serde_json::Value>,
}

impl Metadata {
    /// The metadata of a conversion from format `source` (without one, [`Metadata::default`]).
    pub fn new(source: &str) -> Self {
        Metadata { source: Some(source.to_owned()), ..Metadata::default() }
    }

    /// Records the path of entry `name` (every entry written, tensor or value).
    pub fn path(&mut self, name: &str, path: &[PathItem]) {
        self.paths.push((name.to_owned(), path.to_vec()));
    }

    /// Records the non-tensor entry `name`, when JSON holds it exactly; whether it did.
    pub fn value(&mut self, name: &str, value: &Value) -> bool {
        match value_to_json(value) {
            Some(json) => {
                self.values.insert(name.to_owned(), json);
                true
            }
            None => false,
        }
    }

    /// The `__metadata__` map: `format`, `ckpt.source` (when known), and `ckpt.paths` (unless every path is
    /// just its name) and `ckpt.values` (unless there are none).
    pub fn into_map(self) -> HashMap<String, String> {
        let mut map = HashMap::from([(FORMAT_KEY.to_owned(), FORMAT_PT.to_owned())]);
        if let Some(source) = self.source {
            map.insert(SOURCE_KEY.to_owned(), source);
        }
        let nested = self.paths.iter().any(|(name, path)| !matches!(path.as_slice(), [PathItem::Key(k)] if k == name));
        if nested {
            let paths: serde_json::Map<String, serde_json::Value> = self
                .paths
                .into_iter()
                .map(|(name, path)| {
                    let steps = path
                        .into_iter()
                        .map(|p| match p {
                            PathItem::Key(k) => serde_json::Value::String(k),
                            PathItem::Index(i) => serde_json::Value::from(i),
                        })
                        .collect();
                    (name, serde_json::Value::Array(steps))
                })
                .collect();
            map.insert(PATHS_KEY.to_owned(), serde_json::Value::Object(paths).to_string());
        }
        if !self.values.is_empty() {
            map.insert(VALUES_KEY.to_owned(), serde_json::Value::Object(self.values).to_string());
        }
        map
    }
}

/// What ckpt recorded in a file: the path of each entry (when recorded), and the values of `ckpt.values`
/// that no tensor of the file shadows.
#[derive(Debug, Clone, Default)]
pub struct Records {
    paths: Option<HashMap<String, Vec<PathItem>>>,
    /// Value entries, by name, in the record's order.
    pub values: Vec<(String, Value)>,
}

impl Records {
    /// Reads the records of a file's `__metadata__`, whose tensors are named `tensors` (a damaged record
    /// is ignored).
    pub fn read(metadata: Option<&HashMap<String, String>>, is_tensor: impl Fn(&str) -> bool) -> Self {
        let record = |key: &str| metadata.and_then(|m| m.get(key));
        let paths = record(PATHS_KEY).and_then(|p| parse_paths(p));
        let values = record(VALUES_KEY)
            .and_then(|v| parse_values(v))
            .unwrap_or_default()
            .into_iter()
            .filter(|(name, _)| !is_tensor(name))
            .collect();
        Records { paths, values }
    }

    /// The path of entry `name`: the recorded one, else the name as a single key.
    pub fn path_of(&self, name: &str) -> Vec<PathItem> {
        self.paths.as_ref().and_then(|p| p.get(name).cloned()).unwrap_or_else(|| vec![PathItem::Key(name.to_owned())])
    }
}

/// Parses `ckpt.values`; `None` when it is not an object of scalars.
fn parse_values(text: &str) -> Option<Vec<(String, Value)>> {
    let json: serde_json::Value = serde_json::from_str(text).ok()?;
    json.as_object()?.iter().map(|(name, v)| Some((name.clone(), value_from_json(v)?))).collect()
}

/// Parses `ckpt.paths` (`{"name": ["model", 0, "w"], ...}`); `None` when it is not that shape.
fn parse_paths(text: &str) -> Option<HashMap<String, Vec<PathItem>>> {
    let json: serde_json::Value = serde_json::from_str(text).ok()?;
    let mut out = HashMap::new();
    for (name, steps) in json.as_object()? {
        let steps = steps.as_array()?;
        let mut path = Vec::with_capacity(steps.len());
        for s in steps {
            path.push(match s {
                serde_json::Value::String(k) => PathItem::Key(k.clone()),
                serde_json::Value::Number(n) => PathItem::Index(usize::try_from(n.as_u64()?).ok()?),
                _ => return None,
            });
        }
        if path.is_empty() {
            return None;
        }
        out.insert(name.clone(), path);
    }
    Some(out)
}

/// Options of [`save`] and [`save_entries`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteOptions {
    /// The format the checkpoint is converted from (`ckpt.source`), when known.
    pub source: Option<String>,
}

impl WriteOptions {
    /// These options recording `source` as the format converted from.
    #[must_use]
    pub fn with_source(mut self, source: &str) -> Self {
        self.source = Some(source.to_owned());
        self
    }
}

/// What [`save_entries`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SaveReport {
    /// Tensors written.
    pub tensors: usize,
    /// Tensor bytes written.
    pub bytes: u64,
    /// Non-tensor values recorded in `ckpt.values`.
    pub values: usize,
    /// Entries a safetensors file cannot hold, by name: values JSON does not hold exactly, opaque tensors,
    /// dtypes safetensors lacks.
    pub dropped: Vec<String>,
}

/// Writes `entries` (name, path in the nested state dict, value) as one safetensors file at `path`
/// (atomically), following the convention: tensors of dtypes safetensors
/// has under their names, values JSON holds exactly in `ckpt.values`, the paths in `ckpt.paths`; every
/// other entry is listed in [`SaveReport::dropped`], never silently lost.
///
/// # Errors
/// As [`write_file`].
pub fn save_entries<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a [PathItem], &'a Value)>,
    path: &Path,
    options: &WriteOptions,
) -> Result<SaveReport> {
    let mut report = SaveReport::default();
    let mut metadata = Metadata { source: options.source.clone(), ..Metadata::default() };
    let mut tensors = Vec::new();
    for (name, item_path, value) in entries {
        let kept = match value.as_tensor() {
            Some(t) if t.dtype().to_safetensors().is_ok() => {
                report.tensors += 1;
                report.bytes += t.nbytes() as u64;
                tensors.push((name.to_owned(), t.clone()));
                true
            }
            Some(_) => false,
            None if metadata.value(name, value) => {
                report.values += 1;
                true
            }
            None => false,
        };
        if kept {
            metadata.path(name, item_path);
        } else {
            report.dropped.push(name.to_owned());
        }
    }
    write_file(&tensors, Some(metadata.into_map()), path)?;
    Ok(report)
}

/// Writes the state dict `value` as one safetensors file at `path`: [`save_entries`] of its leaves (every
/// mapping, list and tuple descended into, names joined with `.`).
///
/// # Errors
/// As [`save_entries`]; [`crate::Error::InvalidArgument`] for keys that cannot name a leaf.
pub fn save(value: &Value, path: &Path, options: &WriteOptions) -> Result<SaveReport> {
    let leaves = leaves(value)?;
    save_entries(leaves.iter().map(|l| (l.key.as_str(), l.path.as_slice(), l.value)), path, options)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn values_round_trip_with_their_types() {
        let values = [
            ("n", Value::None),
            ("b", Value::Bool(true)),
            ("i", Value::Int(-3)),
            ("f", Value::Float(3.0)),
            ("g", Value::Float(1e-300)),
            ("s", Value::Str("{\"json\": 1}".into())),
        ];
        let mut m = Metadata::new("torch");
        for (n, v) in &values {
            assert!(m.value(n, v));
        }
        let map = m.into_map();
        let mut back = parse_values(&map[VALUES_KEY]).unwrap();
        back.sort_by(|a, b| a.0.cmp(&b.0));
        let mut want: Vec<(String, Value)> = values.iter().map(|(n, v)| ((*n).to_owned(), v.clone())).collect();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(back, want);
    }

    #[test]
    fn values_json_cannot_hold_are_left_out() {
        let values = [("nan", Value::Float(f64::NAN)), ("bytes", Value::Bytes(vec![1])), ("l", Value::List(vec![]))];
        assert!(values.iter().all(|(_, v)| value_to_json(v).is_none()));
        let map = Metadata::new("torch").into_map();
        assert!(!map.contains_key(VALUES_KEY) && !map.contains_key(PATHS_KEY));
        assert_eq!((map[FORMAT_KEY].as_str(), map[SOURCE_KEY].as_str()), ("pt", "torch"));
        assert!(parse_values("[1]").is_none());
        assert!(parse_values("{\"a\": [1]}").is_none());
    }

    #[test]
    fn paths_round_trip() {
        let p = vec![PathItem::Key("model".into()), PathItem::Index(0), PathItem::Key("w".into())];
        let mut m = Metadata::new("torch");
        m.path("model.0.w", &p);
        let map = m.into_map();
        assert_eq!(parse_paths(&map[PATHS_KEY]).unwrap()["model.0.w"], p);
        let mut flat = Metadata::new("torch");
        flat.path("w", &[PathItem::Key("w".into())]);
        assert!(!flat.into_map().contains_key(PATHS_KEY));
        assert!(parse_paths("{\"a\": []}").is_none());
        // A damaged record is ignored: names are their own paths.
        let damaged = HashMap::from([(PATHS_KEY.to_owned(), "{".to_owned())]);
        assert_eq!(Records::read(Some(&damaged), |_| false).path_of("a.b"), [PathItem::Key("a.b".into())]);
    }
}
