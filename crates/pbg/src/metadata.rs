//! The metadata attributes on the root of every checkpoint file: `config/json` and the `iteration/*` keys
//! (PBG's `ConfigMetadataProvider` and `IterationManager`).

use std::fmt;

/// The value of a root attribute, typed as h5py stores Python values.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    /// A Python `int` (stored as int64; read from any integer type that fits).
    Int(i64),
    /// A Python `float` (float64).
    Float(f64),
    /// A Python `str` (stored as a variable-length UTF-8 string; read from fixed or variable length, ASCII or
    /// UTF-8 strings).
    Str(String),
    /// Anything else found in a file (arrays, booleans, ...), described; it cannot be written back.
    Other(String),
}

impl AttrValue {
    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            AttrValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            AttrValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::Int(i) => write!(f, "{i}"),
            AttrValue::Float(x) => write!(f, "{x:?}"),
            AttrValue::Str(s) => write!(f, "{s:?}"),
            AttrValue::Other(d) => write!(f, "<{d}>"),
        }
    }
}

impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::Int(v)
    }
}

impl From<&str> for AttrValue {
    fn from(v: &str) -> Self {
        AttrValue::Str(v.to_owned())
    }
}

impl From<String> for AttrValue {
    fn from(v: String) -> Self {
        AttrValue::Str(v)
    }
}

/// Name of the attribute holding the config (`json.dumps(config.to_dict(), indent=4)`).
pub const CONFIG_JSON_ATTR: &str = "config/json";
/// Name of the format version attribute (always 1).
pub const FORMAT_VERSION_ATTR: &str = "format_version";
/// The only format version PBG knows.
pub const FORMAT_VERSION: i64 = 1;

/// The position of one training iteration (PBG's `IterationManager`), as stored in the `iteration/*`
/// attributes of the files that iteration wrote.
///
/// ```
/// use ckpt_pbg::Iteration;
/// let paths = vec!["data/edges".to_string()];
/// let it = Iteration::from_index(3, 2, &paths, 2).unwrap();
/// assert_eq!((it.epoch_idx, it.edge_path_idx, it.edge_chunk_idx), (1, 0, 1));
/// assert_eq!(it.iteration_idx(), 3);
/// assert!(Iteration::from_index(4, 2, &paths, 2).is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iteration {
    /// `config.num_epochs`.
    pub num_epochs: i64,
    /// 0-based epoch.
    pub epoch_idx: i64,
    /// `len(config.edge_paths)`.
    pub num_edge_paths: i64,
    /// 0-based edge path.
    pub edge_path_idx: i64,
    /// The edge path, as written in the config.
    pub edge_path: String,
    /// The effective number of edge chunks.
    pub num_edge_chunks: i64,
    /// 0-based edge chunk.
    pub edge_chunk_idx: i64,
}

impl Iteration {
    /// `(epoch_idx * num_edge_paths + edge_path_idx) * num_edge_chunks + edge_chunk_idx`: the version this
    /// iteration consumed (it writes version `iteration_idx() + 1`).
    pub fn iteration_idx(&self) -> i64 {
        (self.epoch_idx * self.num_edge_paths + self.edge_path_idx) * self.num_edge_chunks + self.edge_chunk_idx
    }

    /// The iteration with index `index`; `None` once training is over (`index >= num_epochs × paths ×
    /// chunks`) or for empty arguments.
    pub fn from_index(index: u64, num_epochs: u64, edge_paths: &[String], num_edge_chunks: u64) -> Option<Iteration> {
        let paths = edge_paths.len() as u64;
        let total = num_epochs.checked_mul(paths)?.checked_mul(num_edge_chunks)?;
        if index >= total {
            return None;
        }
        let chunk = index % num_edge_chunks;
        let path = (index / num_edge_chunks) % paths;
        let epoch = index / (num_edge_chunks * paths);
        Some(Iteration {
            num_epochs: i64::try_from(num_epochs).ok()?,
            epoch_idx: i64::try_from(epoch).ok()?,
            num_edge_paths: i64::try_from(paths).ok()?,
            edge_path_idx: i64::try_from(path).ok()?,
            edge_path: edge_paths.get(usize::try_from(path).ok()?)?.clone(),
            num_edge_chunks: i64::try_from(num_edge_chunks).ok()?,
            edge_chunk_idx: i64::try_from(chunk).ok()?,
        })
    }

    /// Whether PBG keeps the checkpoint this iteration consumes (`should_preserve_old_checkpoint`): the
    /// first iteration of an epoch that is a multiple of `interval`.
    pub fn should_preserve(&self, interval: Option<u64>) -> bool {
        match interval {
            Some(k) if k > 0 => {
                u64::try_from(self.epoch_idx).is_ok_and(|e| e % k == 0)
                    && self.edge_path_idx == 0
                    && self.edge_chunk_idx == 0
            }
            _ => false,
        }
    }
}

/// The metadata attributes of a checkpoint file, in order (everything on the root except
/// `format_version`).
///
/// Files written by PBG carry `config/json` and the seven `iteration/*` keys; files made by users (warm
/// starts, `init_path`) may carry none. Reading keeps whatever is there, in libhdf5's name order (HDF5 keeps
/// no creation order for these attributes); writing keeps the order given. Equality ignores the order, as
/// for any mapping.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    /// `(name, value)` pairs; names may contain `/`.
    pub attrs: Vec<(String, AttrValue)>,
}

impl PartialEq for Metadata {
    fn eq(&self, other: &Self) -> bool {
        self.attrs.len() == other.attrs.len() && self.attrs.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl Metadata {
    /// No attributes.
    pub fn new() -> Self {
        Self::default()
    }

    /// What PBG's trainer writes: `config/json` then the `iteration/*` keys, in its providers' order.
    pub fn for_iteration(config_json: &str, iteration: &Iteration) -> Self {
        let mut m = Metadata::new();
        m.set(CONFIG_JSON_ATTR, config_json);
        m.set("iteration/num_epochs", iteration.num_epochs);
        m.set("iteration/epoch_idx", iteration.epoch_idx);
        m.set("iteration/num_edge_paths", iteration.num_edge_paths);
        m.set("iteration/edge_path_idx", iteration.edge_path_idx);
        m.set("iteration/edge_path", iteration.edge_path.as_str());
        m.set("iteration/num_edge_chunks", iteration.num_edge_chunks);
        m.set("iteration/edge_chunk_idx", iteration.edge_chunk_idx);
        m
    }

    /// The value of attribute `name`.
    pub fn get(&self, name: &str) -> Option<&AttrValue> {
        self.attrs.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Sets attribute `name`, replacing its value in place or appending it.
    pub fn set(&mut self, name: &str, value: impl Into<AttrValue>) {
        let value = value.into();
        match self.attrs.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.attrs.push((name.to_owned(), value)),
        }
    }

    /// The `config/json` text.
    pub fn config_json(&self) -> Option<&str> {
        self.get(CONFIG_JSON_ATTR).and_then(AttrValue::as_str)
    }

    /// The iteration that wrote the file, when all seven `iteration/*` keys are present with their types.
    pub fn iteration(&self) -> Option<Iteration> {
        let int = |k: &str| self.get(&format!("iteration/{k}")).and_then(AttrValue::as_int);
        Some(Iteration {
            num_epochs: int("num_epochs")?,
            epoch_idx: int("epoch_idx")?,
            num_edge_paths: int("num_edge_paths")?,
            edge_path_idx: int("edge_path_idx")?,
            edge_path: self.get("iteration/edge_path").and_then(AttrValue::as_str)?.to_owned(),
            num_edge_chunks: int("num_edge_chunks")?,
            edge_chunk_idx: int("edge_chunk_idx")?,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn iteration_round_trip() {
        let paths = vec!["a".to_string(), "b".to_string()];
        for i in 0..12 {
            let it = Iteration::from_index(i, 2, &paths, 3).unwrap();
            assert_eq!(it.iteration_idx(), i as i64);
            let m = Metadata::for_iteration("{}", &it);
            assert_eq!(m.iteration().unwrap(), it);
            assert_eq!(m.config_json(), Some("{}"));
            assert_eq!(m.attrs.len(), 8);
        }
        assert!(Iteration::from_index(0, 1, &[], 1).is_none());
        let first = Iteration::from_index(6, 2, &paths, 3).unwrap();
        assert!(first.should_preserve(Some(1)));
        assert!(!first.should_preserve(Some(2)));
        assert!(!first.should_preserve(None));
        assert!(!Iteration::from_index(7, 2, &paths, 3).unwrap().should_preserve(Some(1)));
    }
}
