//! Flattening nested state dicts to dotted keys and back, with `torch.distributed.checkpoint`'s rules
//! (torch 2.4+ `flatten_state_dict` / `traverse_state_dict`, and `set_element` for the way back).

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::error::{Error, Result};
use crate::value::{Dict, DictKind, Value};

/// One step of a path into a nested state dict: a mapping key (always a string, as DCP applies `str()`) or
/// a list index.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathItem {
    /// A mapping key, after `str()`.
    Key(String),
    /// A list (or tuple) index.
    Index(usize),
}

impl fmt::Display for PathItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathItem::Key(k) => f.write_str(k),
            PathItem::Index(i) => write!(f, "{i}"),
        }
    }
}

/// The dotted key of a path: `".".join(map(str, path))`.
pub fn join_path(path: &[PathItem]) -> String {
    let mut s = String::new();
    for (i, p) in path.iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        s.push_str(&p.to_string());
    }
    s
}

/// One leaf of a flattened state dict.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatEntry<'a> {
    /// The dotted key (`model.layers.0.weight`).
    pub key: String,
    /// The path that leads to the leaf (DCP's `planner_data[key]`).
    pub path: Vec<PathItem>,
    /// The leaf: a tensor, or any other value (DCP writes those as BYTE_IO items).
    pub value: &'a Value,
}

/// Python's `str()` of a mapping key, for the common key types.
///
/// # Errors
/// [`Error::Unsupported`] for key types whose `str()` this library does not reproduce (objects, tensors).
pub fn python_str(v: &Value) -> Result<String> {
    Ok(match v {
        Value::Str(s) => s.clone(),
        other => python_repr(other)?,
    })
}

/// Python's `repr()` for simple values (used for `str()` of non-string keys).
fn python_repr(v: &Value) -> Result<String> {
    Ok(match v {
        Value::None => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Int(i) => i.to_string(),
        Value::BigInt(b) => crate::value::bigint_decimal(b),
        Value::Float(f) => float_repr(*f),
        Value::Str(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Complex(re, im) => complex_repr(*re, *im, float_repr),
        // numpy's str() of its scalars: float32 and complex64 with float32's shortest digits.
        Value::Numpy(n) if !n.is_array() => match (n.dtype, &n.value) {
            (crate::DType::F32, Value::Float(f)) => float32_repr(*f as f32),
            (crate::DType::C64, Value::Complex(re, im)) => complex_repr(*re, *im, |x| float32_repr(x as f32)),
            _ => python_repr(&n.value)?,
        },
        Value::Tuple(items) => {
            let parts: Result<Vec<String>> = items.iter().map(python_repr).collect();
            let parts = parts?;
            if parts.len() == 1 { format!("({},)", parts[0]) } else { format!("({})", parts.join(", ")) }
        }
        other => {
            return Err(Error::Unsupported(format!("str() of a {} mapping key", other.type_name())));
        }
    })
}

/// Python's `repr(complex)`: `(re+imj)`, or `imj` when the real part is +0.0; the parts without a trailing
/// `.0`.
fn complex_repr(re: f64, im: f64, part: impl Fn(f64) -> String) -> String {
    let part = |x: f64| {
        let s = part(x);
        s.strip_suffix(".0").map(str::to_owned).unwrap_or(s)
    };
    if re == 0.0 && !re.is_sign_negative() {
        return format!("{}j", part(im));
    }
    let sign = if im.is_sign_negative() && !im.is_nan() { '-' } else { '+' };
    format!("({}{sign}{}j)", part(re), part(im.abs()))
}

/// `repr()` of a float32 as numpy prints it: float32's shortest round-trip digits, Python's notation.
fn float32_repr(f: f32) -> String {
    if !f.is_finite() || f == 0.0 {
        return float_repr(f64::from(f));
    }
    python_notation(f)
}

/// Python's `repr(float)`: shortest round-trip digits, scientific notation outside `1e-4 <= |x| < 1e16`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    python_notation(f)
}

/// A finite, non-zero float in Python's notation: its shortest round-trip digits, scientific outside
/// `1e-4 <= |x| < 1e16`.
fn python_notation<F: std::fmt::Display + std::fmt::LowerExp>(f: F) -> String {
    let sci = format!("{f:e}"); // shortest digits, e.g. "1.2345e-5"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') { s } else { format!("{s}.0") }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// Flattens a state dict with DCP's rules (torch 2.4+):
///
/// - a mapping is always descended into, keys through `str()`; an empty mapping disappears;
/// - a list is descended into (by index) only if one of its items is a tensor, a mapping, or a list that is
///   itself descended into; otherwise the whole list is one leaf;
/// - tuples and every other value are leaves (a tuple of tensors is one leaf).
///
/// The top level must be a mapping.
///
/// ```
/// use ckpt_core::{flatten, Value, Tensor};
/// let t = Tensor::from_slice(&[1.0f32], &[1]).unwrap();
/// let sd = Value::dict([
///     ("model", Value::dict([("w", Value::Tensor(t))])),
///     ("opt", Value::dict([("hp", Value::dict([("name", Value::from("adam"))]))])),
///     ("lst", Value::List(vec![Value::from(1i64), Value::from(2i64)])),
/// ]);
/// let keys: Vec<String> = flatten(&sd).unwrap().into_iter().map(|e| e.key).collect();
/// assert_eq!(keys, ["model.w", "opt.hp.name", "lst"]);
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`] if the top level is not a mapping or two leaves get the same key (DCP's
/// "duplicated flatten key"); [`Error::Unsupported`] for a key whose `str()` is not reproduced.
pub fn flatten(state_dict: &Value) -> Result<Vec<FlatEntry<'_>>> {
    let Value::Dict(top) = state_dict else {
        return Err(Error::InvalidArgument(format!("a state dict must be a mapping, got {}", state_dict.type_name())));
    };
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut path = Vec::new();
    for (k, v) in &top.items {
        path.push(PathItem::Key(python_str(k)?));
        traverse(&mut path, v, &mut out, &mut seen)?;
        path.pop();
    }
    Ok(out)
}

/// DCP's `_is_terminal` with `keep_traversing = is tensor`.
fn is_terminal(v: &Value) -> bool {
    match v {
        Value::Dict(_) => false,
        Value::List(items) => {
            !items.iter().any(|e| e.is_tensor_like() || matches!(e, Value::Dict(_) | Value::List(_)) && !is_terminal(e))
        }
        _ => true,
    }
}

fn traverse<'a>(
    path: &mut Vec<PathItem>,
    v: &'a Value,
    out: &mut Vec<FlatEntry<'a>>,
    seen: &mut HashSet<String>,
) -> Result<()> {
    if let Value::Dict(d) = v {
        for (k, child) in &d.items {
            path.push(PathItem::Key(python_str(k)?));
            traverse(path, child, out, seen)?;
            path.pop();
        }
    } else if is_terminal(v) {
        let key = join_path(path);
        if !seen.insert(key.clone()) {
            return Err(Error::InvalidArgument(format!("duplicated flatten key {key}")));
        }
        out.push(FlatEntry { key, path: path.clone(), value: v });
    } else if let Value::List(items) | Value::Tuple(items) = v {
        for (i, child) in items.iter().enumerate() {
            path.push(PathItem::Index(i));
            traverse(path, child, out, seen)?;
            path.pop();
        }
    }
    Ok(())
}

/// Every leaf of a value with its path, descending into every mapping, list and tuple (unlike [`flatten`],
/// which keeps tuples and tensor-free lists whole). Tensors of every kind are leaves; so are empty
/// containers, sets and all other values. A top level that is not a container is one leaf with an empty
/// key.
///
/// This names every tensor of a `torch.save` file, wherever it sits.
///
/// # Errors
/// [`Error::Unsupported`] for a mapping key whose `str()` is not reproduced.
pub fn leaves(value: &Value) -> Result<Vec<FlatEntry<'_>>> {
    fn walk<'a>(path: &mut Vec<PathItem>, v: &'a Value, out: &mut Vec<FlatEntry<'a>>) -> Result<()> {
        match v {
            Value::Dict(d) if !d.items.is_empty() => {
                for (k, child) in &d.items {
                    path.push(PathItem::Key(python_str(k)?));
                    walk(path, child, out)?;
                    path.pop();
                }
            }
            Value::List(items) | Value::Tuple(items) if !items.is_empty() => {
                for (i, child) in items.iter().enumerate() {
                    path.push(PathItem::Index(i));
                    walk(path, child, out)?;
                    path.pop();
                }
            }
            _ => out.push(FlatEntry { key: join_path(path), path: path.clone(), value: v }),
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(&mut Vec::new(), value, &mut out)?;
    Ok(out)
}

/// Walks every leaf of `value` in order, naming it as [`leaves`] does, and calls `f` with its name, the child
/// position taken at each level and the leaf. The name is built in one buffer (pushed and truncated), not
/// joined from a path per leaf.
fn walk_leaves<'v>(value: &'v Value, f: &mut dyn FnMut(&str, &[u32], &'v Value)) -> Result<()> {
    fn step(key: &mut String, depth: usize, part: &str) {
        if depth > 0 {
            key.push('.');
        }
        key.push_str(part);
    }
    fn position(i: usize) -> u32 {
        // A container of 2^32 items cannot be decoded under the pickle limits; saturate rather than wrap.
        u32::try_from(i).unwrap_or(u32::MAX)
    }
    fn walk<'v>(
        key: &mut String,
        at: &mut Vec<u32>,
        v: &'v Value,
        f: &mut dyn FnMut(&str, &[u32], &'v Value),
    ) -> Result<()> {
        match v {
            Value::Dict(d) if !d.items.is_empty() => {
                for (i, (k, child)) in d.items.iter().enumerate() {
                    let len = key.len();
                    match k {
                        Value::Str(s) => step(key, at.len(), s),
                        other => step(key, at.len(), &python_str(other)?),
                    }
                    at.push(position(i));
                    walk(key, at, child, f)?;
                    at.pop();
                    key.truncate(len);
                }
            }
            Value::List(items) | Value::Tuple(items) if !items.is_empty() => {
                for (i, child) in items.iter().enumerate() {
                    let len = key.len();
                    step(key, at.len(), &i.to_string());
                    at.push(position(i));
                    walk(key, at, child, f)?;
                    at.pop();
                    key.truncate(len);
                }
            }
            _ => f(key, at, v),
        }
        Ok(())
    }
    walk(&mut String::new(), &mut Vec::new(), value, f)
}

/// Every leaf's name and value, in order, exactly as [`leaves`] names them, without building a path per leaf
/// (for listing entries).
///
/// ```
/// use ckpt_core::{Value, leaf_names};
/// let v = Value::dict([("model", Value::dict([("w", Value::Int(1))])), ("step", Value::List(vec![]))]);
/// let names: Vec<String> = leaf_names(&v).unwrap().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["model.w", "step"]);
/// ```
///
/// # Errors
/// As [`leaves`].
pub fn leaf_names(value: &Value) -> Result<Vec<(String, &Value)>> {
    let mut out = Vec::new();
    walk_leaves(value, &mut |name, _, v| out.push((name.to_owned(), v)))?;
    Ok(out)
}

/// The leaves of a value by name, for reading many entries: one walk (naming leaves as [`leaves`] does),
/// then each look-up is a hash probe and a descent of the leaf's depth, instead of a walk per look-up. The
/// index holds only positions, not the value: pass the same value to [`LeafIndex::get`]. Where two leaves
/// share a name the first wins, as with a search of [`leaves`].
///
/// ```
/// use ckpt_core::{LeafIndex, Value};
/// let v = Value::dict([("model", Value::dict([("w", Value::Int(1))])), ("step", Value::Int(7))]);
/// let index = LeafIndex::new(&v).unwrap();
/// assert_eq!(index.get(&v, "model.w"), Some(&Value::Int(1)));
/// assert_eq!(index.get(&v, "model"), None);
/// ```
#[derive(Debug, Clone, Default)]
pub struct LeafIndex {
    /// Leaf name → the child position taken at each level.
    positions: HashMap<String, Box<[u32]>>,
}

impl LeafIndex {
    /// Indexes every leaf of `value` (named as [`leaves`] names them).
    ///
    /// # Errors
    /// As [`leaves`].
    pub fn new(value: &Value) -> Result<Self> {
        let mut positions = HashMap::new();
        walk_leaves(value, &mut |name, at, _| {
            if !positions.contains_key(name) {
                positions.insert(name.to_owned(), at.into());
            }
        })?;
        Ok(LeafIndex { positions })
    }

    /// The leaf named `name` of `value` (the value the index was built from).
    pub fn get<'a>(&self, value: &'a Value, name: &str) -> Option<&'a Value> {
        let mut v = value;
        for &i in self.positions.get(name)?.iter() {
            let i = i as usize;
            v = match v {
                Value::Dict(d) => &d.items.get(i)?.1,
                Value::List(items) | Value::Tuple(items) => items.get(i)?,
                _ => return None,
            };
        }
        Some(v)
    }

    /// Number of distinct leaf names.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// Whether there is no leaf.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }
}

/// Largest list index [`unflatten`] pads up to; a larger index in a file is an error, not an allocation.
pub const MAX_UNFLATTEN_INDEX: usize = 1 << 24;

/// Rebuilds the nested state dict from `(path, value)` leaves, as DCP's `set_element` does: a string step
/// creates a `dict`, an index step a `list` padded with `None`.
///
/// # Errors
/// [`Error::InvalidArgument`] for an empty path, a path that crosses a leaf, a first step that is an index,
/// or an index above [`MAX_UNFLATTEN_INDEX`].
pub fn unflatten(leaves: impl IntoIterator<Item = (Vec<PathItem>, Value)>) -> Result<Value> {
    let mut root = Value::Dict(Dict::new(DictKind::Dict));
    for (path, value) in leaves {
        if !matches!(path.first(), Some(PathItem::Key(_))) {
            return Err(Error::InvalidArgument(format!("path {} must start with a key", join_path(&path))));
        }
        set_element(&mut root, &path, value)?;
    }
    Ok(root)
}

fn set_element(root: &mut Value, path: &[PathItem], value: Value) -> Result<()> {
    let mut cur = root;
    let Some((last, inner)) = path.split_last() else {
        return Err(Error::InvalidArgument("empty path".into()));
    };
    for (i, step) in inner.iter().enumerate() {
        let next_is_key = matches!(path.get(i + 1), Some(PathItem::Key(_)));
        let default = || {
            if next_is_key { Value::Dict(Dict::new(DictKind::Dict)) } else { Value::List(Vec::new()) }
        };
        let slot = child_slot(cur, step, path)?;
        if matches!(slot, Value::None) {
            *slot = default();
        }
        cur = slot;
    }
    *child_slot(cur, last, path)? = value;
    Ok(())
}

/// The slot for `step` inside `container`, created (`None`) when missing.
fn child_slot<'v>(container: &'v mut Value, step: &PathItem, path: &[PathItem]) -> Result<&'v mut Value> {
    match (container, step) {
        (Value::Dict(d), PathItem::Key(k)) => {
            let pos = match d.items.iter().position(|(key, _)| key.as_str() == Some(k)) {
                Some(p) => p,
                None => {
                    d.items.push((Value::Str(k.clone()), Value::None));
                    d.items.len() - 1
                }
            };
            Ok(&mut d.items[pos].1)
        }
        (Value::List(items), PathItem::Index(i)) => {
            if *i > MAX_UNFLATTEN_INDEX {
                return Err(Error::InvalidArgument(format!(
                    "list index {i} in path {} is above the limit {MAX_UNFLATTEN_INDEX}",
                    join_path(path)
                )));
            }
            if items.len() <= *i {
                items.resize(i + 1, Value::None);
            }
            Ok(&mut items[*i])
        }
        (other, step) => Err(Error::InvalidArgument(format!(
            "path {} crosses a {} at step {step}",
            join_path(path),
            other.type_name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::Tensor;

    fn t() -> Value {
        Value::Tensor(Tensor::from_slice(&[1.0f32], &[1]).unwrap())
    }

    #[test]
    fn leaf_index_finds_what_a_search_of_leaves_finds() {
        let mut d = Dict::new(DictKind::OrderedDict);
        d.insert(Value::Int(0), t());
        d.insert(Value::Int(1), Value::dict::<&str>([]));
        d.insert("0", Value::Int(5)); // same name as the int key 0: the first wins
        let v = Value::dict([
            ("a", Value::Dict(d)),
            ("a.0", Value::Int(6)),
            ("l", Value::List(vec![t(), Value::Int(3), Value::Tuple(vec![])])),
            ("n", Value::List(vec![Value::List(vec![t()]), Value::None])),
        ]);
        let index = LeafIndex::new(&v).unwrap();
        let all = leaves(&v).unwrap();
        let names = leaf_names(&v).unwrap();
        assert_eq!(names.len(), all.len());
        for ((name, value), leaf) in names.iter().zip(&all) {
            assert_eq!(name, &leaf.key);
            assert!(std::ptr::eq(*value, leaf.value), "{name}");
        }
        for leaf in &all {
            let first = all.iter().find(|l| l.key == leaf.key).unwrap();
            assert!(std::ptr::eq(index.get(&v, &leaf.key).unwrap(), first.value), "{}", leaf.key);
        }
        assert_eq!(index.len(), 7);
        assert_eq!(index.get(&v, "a"), None);
        assert_eq!(index.get(&v, "x"), None);
        assert_eq!(index.get(&Value::None, "l.0"), None, "another value: no panic");
        let scalar = Value::Int(1);
        assert_eq!(LeafIndex::new(&scalar).unwrap().get(&scalar, ""), Some(&scalar));
        let mut bad = Dict::new(DictKind::Dict);
        bad.insert(Value::List(vec![]), Value::Int(1));
        let bad = Value::Dict(bad);
        assert!(LeafIndex::new(&bad).is_err() && leaf_names(&bad).is_err() && leaves(&bad).is_err());
    }

    #[test]
    fn rules() {
        let mut d = Dict::new(DictKind::OrderedDict);
        d.insert(Value::Int(0), t());
        d.insert(Value::Int(1), Value::dict::<&str>([]));
        let sd = Value::dict([
            ("a", Value::Dict(d)),
            ("l", Value::List(vec![t(), Value::Int(3)])),
            ("tup", Value::Tuple(vec![t(), t()])),
            ("nested", Value::List(vec![Value::List(vec![t()]), Value::Int(1)])),
            ("plain", Value::List(vec![Value::List(vec![Value::Int(1)])])),
            ("emptydictlist", Value::List(vec![Value::dict::<&str>([])])),
        ]);
        let flat = flatten(&sd).unwrap();
        let keys: Vec<&str> = flat.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a.0", "l.0", "l.1", "tup", "nested.0.0", "nested.1", "plain"]);
        assert_eq!(flat[1].path, vec![PathItem::Key("l".into()), PathItem::Index(0)]);
    }

    #[test]
    fn duplicates_rejected() {
        let sd = Value::dict([("a.b", t()), ("a", Value::dict([("b", t())]))]);
        assert!(flatten(&sd).is_err());
        assert!(flatten(&t()).is_err());
    }

    #[test]
    fn unflatten_round_trip() {
        let sd = Value::dict([
            ("m", Value::dict([("w", t()), ("b", t())])),
            ("l", Value::List(vec![t(), Value::Int(3)])),
            ("x", Value::Int(7)),
        ]);
        let leaves: Vec<(Vec<PathItem>, Value)> =
            flatten(&sd).unwrap().into_iter().map(|e| (e.path, e.value.clone())).collect();
        assert_eq!(unflatten(leaves).unwrap(), sd);
        let padded = unflatten([(vec![PathItem::Key("l".into()), PathItem::Index(2)], Value::Int(1))]).unwrap();
        assert_eq!(padded, Value::dict([("l", Value::List(vec![Value::None, Value::None, Value::Int(1)]))]));
        assert!(unflatten([(vec![PathItem::Key("l".into()), PathItem::Index(usize::MAX)], Value::None)]).is_err());
        assert!(unflatten([(vec![PathItem::Index(0)], Value::None)]).is_err());
    }

    #[test]
    fn leaves_descend_everything() {
        let sd = Value::dict([
            ("tup", Value::Tuple(vec![t(), Value::Int(1)])),
            ("e", Value::List(vec![])),
            ("l", Value::List(vec![Value::Int(1)])),
        ]);
        let keys: Vec<String> = leaves(&sd).unwrap().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["tup.0", "tup.1", "e", "l.0"]);
        assert_eq!(leaves(&t()).unwrap()[0].key, "");
    }

    #[test]
    fn float_reprs() {
        assert_eq!(float_repr(1.0), "1.0");
        assert_eq!(float_repr(0.001), "0.001");
        assert_eq!(float_repr(1e-5), "1e-05");
        assert_eq!(float_repr(1e16), "1e+16");
        assert_eq!(float_repr(123456.5), "123456.5");
        assert_eq!(float_repr(-2.5e-10), "-2.5e-10");
    }
}
