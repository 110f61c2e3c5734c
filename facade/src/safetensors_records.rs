//! What ckpt records in a safetensors file's `__metadata__` (string → string) so that a conversion through
//! safetensors loses as little as it can:
//!
//! * `ckpt.paths`: a JSON object from tensor (or value) name to its path in the source's nested state dict
//!   (`["model", "layers", 0, "weight"]`: strings are mapping keys, integers list indices);
//! * `ckpt.values`: a JSON object from name to the entry's value, for the non-tensor entries JSON can hold
//!   exactly: `None`, `bool`, `int` (within i64), finite `float` (always written with a fraction or exponent,
//!   so it reads back as a float) and `str`.
//!
//! Both are ignored by other safetensors readers. A record that is not of this shape is ignored when read
//! (the file then reads as tensors under flat names).

use std::collections::HashMap;

use ckpt_core::{PathItem, Value};

/// `__metadata__` key of the paths record.
pub(crate) const PATHS_KEY: &str = "ckpt.paths";
/// `__metadata__` key of the values record.
pub(crate) const VALUES_KEY: &str = "ckpt.values";

/// The JSON form of `value`, when it is a scalar JSON holds exactly.
pub(crate) fn value_to_json(value: &Value) -> Option<serde_json::Value> {
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

/// The `ckpt.values` record of `(name, JSON value)` pairs ([`value_to_json`]), or `None` when there are none.
pub(crate) fn values_record(values: impl IntoIterator<Item = (String, serde_json::Value)>) -> Option<String> {
    let map: serde_json::Map<String, serde_json::Value> = values.into_iter().collect();
    (!map.is_empty()).then(|| serde_json::Value::Object(map).to_string())
}

/// What ckpt recorded in a safetensors file: the path of each entry (when recorded), and the values of
/// `ckpt.values` that no tensor of the file shadows.
pub(crate) struct Records {
    paths: Option<HashMap<String, Vec<PathItem>>>,
    /// Value entries, by name.
    pub values: Vec<(String, Value)>,
}

impl Records {
    /// Reads the records of `file` (a damaged record is ignored).
    pub(crate) fn of(file: &ckpt_core::safetensors::SafetensorsFile) -> Self {
        let record = |key: &str| file.metadata.as_ref().and_then(|m| m.get(key));
        let paths = record(PATHS_KEY).and_then(|p| parse_paths(p));
        let values = record(VALUES_KEY)
            .and_then(|v| parse_values(v))
            .unwrap_or_default()
            .into_iter()
            .filter(|(name, _)| file.get(name).is_none())
            .collect();
        Records { paths, values }
    }

    /// The path of entry `name`: the recorded one, else the name as a single key.
    pub(crate) fn path_of(&self, name: &str) -> Vec<PathItem> {
        self.paths.as_ref().and_then(|p| p.get(name).cloned()).unwrap_or_else(|| vec![PathItem::Key(name.to_owned())])
    }
}

/// Parses `ckpt.values`; `None` when it is not an object of scalars.
pub(crate) fn parse_values(text: &str) -> Option<Vec<(String, Value)>> {
    let json: serde_json::Value = serde_json::from_str(text).ok()?;
    json.as_object()?.iter().map(|(name, v)| Some((name.clone(), value_from_json(v)?))).collect()
}

/// Parses `ckpt.paths` (`{"name": ["model", 0, "w"], ...}`); `None` when it is not that shape.
pub(crate) fn parse_paths(text: &str) -> Option<HashMap<String, Vec<PathItem>>> {
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

/// The `ckpt.paths` record of `(name, path)` pairs, or `None` when every path is just the name.
pub(crate) fn paths_record<'a>(entries: impl IntoIterator<Item = (&'a str, &'a [PathItem])>) -> Option<String> {
    let entries: Vec<(&str, &[PathItem])> = entries.into_iter().collect();
    if entries.iter().all(|(name, path)| matches!(path, [PathItem::Key(k)] if k == name)) {
        return None;
    }
    let map: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .map(|(name, path)| {
            let steps = path
                .iter()
                .map(|p| match p {
                    PathItem::Key(k) => serde_json::Value::String(k.clone()),
                    PathItem::Index(i) => serde_json::Value::from(*i),
                })
                .collect();
            ((*name).to_owned(), serde_json::Value::Array(steps))
        })
        .collect();
    Some(serde_json::Value::Object(map).to_string())
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
        let record = values_record(values.iter().map(|(n, v)| ((*n).to_owned(), value_to_json(v).unwrap()))).unwrap();
        let mut back = parse_values(&record).unwrap();
        back.sort_by(|a, b| a.0.cmp(&b.0));
        let mut want: Vec<(String, Value)> = values.iter().map(|(n, v)| ((*n).to_owned(), v.clone())).collect();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(back, want);
    }

    #[test]
    fn values_json_cannot_hold_are_left_out() {
        let values = [("nan", Value::Float(f64::NAN)), ("bytes", Value::Bytes(vec![1])), ("l", Value::List(vec![]))];
        assert!(values.iter().all(|(_, v)| value_to_json(v).is_none()));
        assert_eq!(values_record([]), None);
        assert!(parse_values("[1]").is_none());
        assert!(parse_values("{\"a\": [1]}").is_none());
    }

    #[test]
    fn paths_round_trip() {
        let p = vec![PathItem::Key("model".into()), PathItem::Index(0), PathItem::Key("w".into())];
        let record = paths_record([("model.0.w", p.as_slice())]).unwrap();
        assert_eq!(parse_paths(&record).unwrap()["model.0.w"], p);
        let flat = [PathItem::Key("w".into())];
        assert_eq!(paths_record([("w", flat.as_slice())]), None);
        assert!(parse_paths("{\"a\": []}").is_none());
    }
}
