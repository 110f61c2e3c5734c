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
/// [`Error::UnsupportedKey`] for key types whose `str()` this library does not reproduce (objects, tensors).
pub fn python_str(v: &Value) -> Result<String> {
    Ok(match v {
        Value::Str(s) => s.clone(),
        other => python_repr(other)?,
    })
}

/// Python's `repr()` of a scalar or string (`None` for containers, tuples included, and objects).
pub fn python_repr_of(v: &Value) -> Option<String> {
    match v {
        Value::Tuple(_) => None,
        other => python_repr(other).ok(),
    }
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
            return Err(Error::UnsupportedKey { type_name: other.type_name() });
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
/// Objects the checkpoint shares ([`Value::Shared`]) are walked where they are defined, and again at each
/// [`Value::Ref`] to them (as Python's own walk of the state dict would meet the one object at each place);
/// a reference to an object that encloses it (a cycle) is a leaf. The top level must be a mapping.
///
/// ```
/// use ckpt_tensor::{flatten, Value, Tensor};
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
/// [`Error::StateDictNotMapping`] if the top level is not a mapping, [`Error::DuplicateFlattenKey`] if two
/// leaves get the same key (DCP's "duplicated flatten key"); [`Error::UnsupportedKey`] for a key whose `str()` is not reproduced.
pub fn flatten(state_dict: &Value) -> Result<Vec<FlatEntry<'_>>> {
    if !matches!(look_through(state_dict), Value::Dict(_)) {
        return Err(Error::StateDictNotMapping { type_name: state_dict.type_name() });
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    Walker::new(Walk::Flatten).run(state_dict, &mut |leaf| {
        if !seen.insert(leaf.name.to_owned()) {
            return Err(Error::DuplicateFlattenKey { key: leaf.name.to_owned() });
        }
        out.push(FlatEntry { key: leaf.name.to_owned(), path: leaf.path.to_vec(), value: leaf.value });
        Ok(())
    })?;
    Ok(out)
}

/// A [`Value::Shared`]'s object, or the value itself.
fn look_through(v: &Value) -> &Value {
    match v {
        Value::Shared { value, .. } => value,
        other => other,
    }
}

/// DCP's `_is_terminal` with `keep_traversing = is tensor`.
fn is_terminal(v: &Value) -> bool {
    match look_through(v) {
        Value::Dict(_) => false,
        Value::List(items) => !items.iter().any(|e| {
            let e = look_through(e);
            e.is_tensor_like() || matches!(e, Value::Dict(_) | Value::List(_)) && !is_terminal(e)
        }),
        _ => true,
    }
}

/// Every leaf of a value with its path, descending into every mapping, list and tuple (unlike [`flatten()`],
/// which keeps tuples and tensor-free lists whole). Tensors of every kind are leaves; so are empty
/// containers, sets, objects and all other values. Shared objects and references are walked as [`flatten()`]
/// walks them. A top level that is not a container is one leaf with an empty key.
///
/// These are the parts a checkpoint converts as; [`entry_names`] also names the tensors objects hold.
///
/// # Errors
/// [`Error::UnsupportedKey`] for a mapping key whose `str()` is not reproduced.
pub fn leaves(value: &Value) -> Result<Vec<FlatEntry<'_>>> {
    let mut out = Vec::new();
    Walker::new(Walk::Leaves).run(value, &mut |leaf| {
        out.push(FlatEntry { key: leaf.name.to_owned(), path: leaf.path.to_vec(), value: leaf.value });
        Ok(())
    })?;
    Ok(out)
}

/// Every entry of a checkpoint's value and its name, in order: the [`leaves`], and after each object among
/// them, every tensor it holds, named by where it sits in the object (see [`object_parts`]): a module's
/// parameters and buffers as `state_dict()` names them, other attributes and keys by name, items by
/// position. So every tensor of a checkpoint is an entry, and a converted checkpoint stores each under the
/// same name.
///
/// ```
/// use ckpt_tensor::{Value, flatten::entry_names};
/// let v = Value::dict([("model", Value::dict([("w", Value::Int(1))])), ("step", Value::List(vec![]))]);
/// let names: Vec<String> = entry_names(&v).unwrap().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["model.w", "step"]);
/// ```
///
/// # Errors
/// As [`leaves`].
pub fn entry_names(value: &Value) -> Result<Vec<(String, &Value)>> {
    let mut out = Vec::new();
    Walker::new(Walk::Entries).run(value, &mut |leaf| {
        out.push((leaf.name.to_owned(), leaf.value));
        Ok(())
    })?;
    Ok(out)
}

/// The tensors inside an object (a [`Value::Object`], shared or not), named below it as [`entry_names`]
/// names them (`metric.total`, `encoder.0.weight`): the entries a reader lists after the object. Empty for
/// any other value.
///
/// ```
/// use ckpt_tensor::{Object, Tensor, Value, flatten::object_tensors};
/// let t = Value::Tensor(Tensor::from_slice(&[1.0f32], &[1]).unwrap());
/// let metric = Value::Object(Box::new(Object {
///     callable: Value::Global { module: "m".into(), name: "Metric".into() },
///     args: Value::Tuple(vec![]),
///     newobj: true,
///     state: Some(Value::dict([("total", t), ("name", Value::from("mae"))])),
///     list_items: vec![],
///     dict_items: vec![],
/// }));
/// let names: Vec<String> = object_tensors(&metric).into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["total"]);
/// ```
pub fn object_tensors(v: &Value) -> Vec<(String, &Value)> {
    if !matches!(look_through(v), Value::Object(_)) {
        return Vec::new();
    }
    entry_names(v).unwrap_or_default().into_iter().filter(|(name, t)| !name.is_empty() && t.is_tensor_like()).collect()
}

/// [`entry_names`] (the name this crate's earlier versions gave it).
///
/// # Errors
/// As [`leaves`].
pub fn leaf_names(value: &Value) -> Result<Vec<(String, &Value)>> {
    entry_names(value)
}

/// The entries of a value by name, for reading many entries: one walk (naming entries as [`entry_names`]
/// does), then each look-up is a hash probe and a descent of the entry's depth, instead of a walk per
/// look-up. The index holds only positions, not the value: pass the same value to [`LeafIndex::get`].
/// Where two entries share a name the first wins, as with a search of [`entry_names`].
///
/// ```
/// use ckpt_tensor::{flatten::LeafIndex, Value};
/// let v = Value::dict([("model", Value::dict([("w", Value::Int(1))])), ("step", Value::Int(7))]);
/// let index = LeafIndex::new(&v).unwrap();
/// assert_eq!(index.get(&v, "model.w"), Some(&Value::Int(1)));
/// assert_eq!(index.get(&v, "model"), None);
/// ```
#[derive(Debug, Clone, Default)]
pub struct LeafIndex {
    /// Entry name → the child position taken at each level ([`Value::children_into`] order; [`FOLLOW`] at a
    /// reference, then the positions inside the object it refers to).
    positions: HashMap<String, Box<[u32]>>,
    /// Where each shared object is defined, by id (positions from the root to its [`Value::Shared`]).
    shared: HashMap<u32, Box<[u32]>>,
}

/// The position that follows a [`Value::Ref`] to its object.
const FOLLOW: u32 = u32::MAX;

impl LeafIndex {
    /// Indexes every entry of `value` (named as [`entry_names`] names them).
    ///
    /// # Errors
    /// As [`leaves`].
    pub fn new(value: &Value) -> Result<Self> {
        let mut positions = HashMap::new();
        let mut walker = Walker::new(Walk::Entries);
        walker.run(value, &mut |leaf| {
            if !positions.contains_key(leaf.name) {
                positions.insert(leaf.name.to_owned(), leaf.positions.into());
            }
            Ok(())
        })?;
        let shared = walker.shared_at.into_iter().map(|(id, p)| (id, p.into_boxed_slice())).collect();
        Ok(LeafIndex { positions, shared })
    }

    /// The entry named `name` of `value` (the value the index was built from).
    pub fn get<'a>(&self, value: &'a Value, name: &str) -> Option<&'a Value> {
        self.at(value, self.positions.get(name)?, 0)
    }

    fn at<'a>(&self, root: &'a Value, positions: &[u32], jumps: usize) -> Option<&'a Value> {
        let mut v = root;
        let mut children = Vec::new();
        for (k, &i) in positions.iter().enumerate() {
            if i == FOLLOW {
                // A reference: continue inside the object it refers to.
                let Value::Ref(id) = v else { return None };
                if jumps > 64 {
                    return None;
                }
                let target = self.at(root, self.shared.get(id)?, jumps + 1)?;
                let rest = positions.get(k + 1..)?;
                return self.at_from(root, target, rest, jumps + 1);
            }
            children.clear();
            v.children_into(&mut children);
            v = children.get(i as usize)?;
        }
        Some(v)
    }

    fn at_from<'a>(&self, root: &'a Value, from: &'a Value, positions: &[u32], jumps: usize) -> Option<&'a Value> {
        let mut v = from;
        let mut children = Vec::new();
        for (k, &i) in positions.iter().enumerate() {
            if i == FOLLOW {
                let Value::Ref(id) = v else { return None };
                if jumps > 64 {
                    return None;
                }
                let target = self.at(root, self.shared.get(id)?, jumps + 1)?;
                return self.at_from(root, target, positions.get(k + 1..)?, jumps + 1);
            }
            children.clear();
            v.children_into(&mut children);
            v = children.get(i as usize)?;
        }
        Some(v)
    }

    /// Number of distinct entry names.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }
}

/// The parts of an object that may hold tensors, each with the name step it adds (`None`: none, its names
/// continue the object's), as [`entry_names`] names the tensors inside objects:
///
/// - the call's arguments by position;
/// - the state (`__dict__`): each attribute by name; for a module (a state with `_parameters`, `_buffers`
///   and `_modules` mappings) the items of those three by their own names, as `state_dict()` names them;
///   the `(dict, slots)` state of a class with `__slots__` by the names in both;
/// - items appended to a list subclass by position; items set on a mapping subclass by key.
pub fn object_parts(o: &crate::value::Object) -> Vec<(Option<String>, &Value)> {
    parts_of(o).into_iter().map(|p| (p.step, p.value)).collect()
}

/// A part of an object: its name step, where it is ([`Value::children_into`] positions from the object),
/// and the value.
struct Part<'v> {
    step: Option<String>,
    at: Vec<u32>,
    value: &'v Value,
}

/// Positions into `v` that pass through a [`Value::Shared`] to its object.
fn into_shared(v: &Value, at: &mut Vec<u32>) {
    if matches!(v, Value::Shared { .. }) {
        at.push(0);
    }
}

fn parts_of(o: &crate::value::Object) -> Vec<Part<'_>> {
    let mut out = Vec::new();
    let key = |k: &Value| python_str(look_through(k)).ok();
    // Items of a mapping at `at` (module mappings passed through).
    fn dict_parts<'v>(d: &'v Dict, at: &[u32], module_level: bool, out: &mut Vec<Part<'v>>) {
        let is_module = module_level
            && ["_parameters", "_buffers", "_modules"]
                .iter()
                .all(|f| matches!(d.get(f).map(look_through), Some(Value::Dict(_))));
        for (i, (k, v)) in d.items.iter().enumerate() {
            let name = python_str(look_through(k)).ok();
            let mut here = at.to_vec();
            here.push(position(2 * i + 1));
            if is_module && matches!(name.as_deref(), Some("_parameters" | "_buffers" | "_modules")) {
                into_shared(v, &mut here);
                if let Value::Dict(inner) = look_through(v) {
                    dict_parts(inner, &here, false, out);
                }
            } else {
                out.push(Part { step: name, at: here, value: v });
            }
        }
    }
    let mut at = vec![1];
    into_shared(&o.args, &mut at);
    if let Value::Tuple(items) = look_through(&o.args) {
        for (i, a) in items.iter().enumerate() {
            let mut here = at.clone();
            here.push(position(i));
            out.push(Part { step: Some(i.to_string()), at: here, value: a });
        }
    }
    let mut next = 2u32;
    if let Some(state) = &o.state {
        let mut at = vec![next];
        next += 1;
        into_shared(state, &mut at);
        match look_through(state) {
            Value::Dict(d) => dict_parts(d, &at, true, &mut out),
            Value::Tuple(parts) if parts.len() == 2 => {
                for (k, p) in parts.iter().enumerate() {
                    let mut here = at.clone();
                    here.push(position(k));
                    into_shared(p, &mut here);
                    match look_through(p) {
                        Value::Dict(d) => dict_parts(d, &here, true, &mut out),
                        Value::None => {}
                        other => out.push(Part { step: None, at: here, value: other }),
                    }
                }
            }
            other => out.push(Part { step: None, at, value: other }),
        }
    }
    for (i, item) in o.list_items.iter().enumerate() {
        out.push(Part { step: Some(i.to_string()), at: vec![next.saturating_add(position(i))], value: item });
    }
    let next = next.saturating_add(position(o.list_items.len()));
    for (i, (k, v)) in o.dict_items.iter().enumerate() {
        out.push(Part { step: key(k), at: vec![next.saturating_add(position(2 * i + 1))], value: v });
    }
    out
}

/// Which walk [`Walker`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// DCP's flattening.
    Flatten,
    /// Every mapping, list and tuple descended; objects are leaves.
    Leaves,
    /// [`Walk::Leaves`], and the tensors inside objects after each object.
    Entries,
}

/// One leaf a walk meets.
struct Leaf<'w, 'v> {
    name: &'w str,
    path: &'w [PathItem],
    positions: &'w [u32],
    value: &'v Value,
}

/// How deep a walk goes (references can nest an object deeper than the pickle machine allowed): what is
/// deeper is a leaf.
const MAX_WALK_DEPTH: usize = 1000;

/// The walks of this module, in one place: names built in one buffer, shared objects walked where they
/// are defined and at each reference, references to enclosing objects as leaves.
struct Walker<'v> {
    mode: Walk,
    name: String,
    path: Vec<PathItem>,
    positions: Vec<u32>,
    /// The shared objects passed so far (their [`Value::Shared`]).
    defs: HashMap<u32, &'v Value>,
    /// Where each is defined (positions), for [`LeafIndex`].
    shared_at: HashMap<u32, Vec<u32>>,
    /// The shared objects being walked (a reference to one of them is a cycle).
    active: HashSet<u32>,
    /// Inside an object ([`Walk::Entries`]): only tensors are leaves.
    in_object: bool,
}

type Emit<'e, 'v> = dyn FnMut(&Leaf<'_, 'v>) -> Result<()> + 'e;

impl<'v> Walker<'v> {
    fn new(mode: Walk) -> Self {
        Walker {
            mode,
            name: String::new(),
            path: Vec::new(),
            positions: Vec::new(),
            defs: HashMap::new(),
            shared_at: HashMap::new(),
            active: HashSet::new(),
            in_object: false,
        }
    }

    fn run(&mut self, root: &'v Value, f: &mut Emit<'_, 'v>) -> Result<()> {
        self.walk(root, f)
    }

    fn emit(&self, v: &'v Value, f: &mut Emit<'_, 'v>) -> Result<()> {
        // Inside an object, its tensors (numpy arrays among them) are entries; its other attributes are not.
        let inner = look_through(v);
        if self.in_object && !inner.is_tensor_like() && !matches!(inner, Value::Numpy(n) if n.is_array()) {
            return Ok(());
        }
        f(&Leaf { name: &self.name, path: &self.path, positions: &self.positions, value: v })
    }

    /// Walks `child` (at `position` of the current value) under the name step `step`, if any.
    fn step(&mut self, step: Option<PathItem>, position: u32, child: &'v Value, f: &mut Emit<'_, 'v>) -> Result<()> {
        self.step_at(step, &[position], child, f)
    }

    /// [`Self::step`] for a child several positions down.
    fn step_at(&mut self, step: Option<PathItem>, at: &[u32], child: &'v Value, f: &mut Emit<'_, 'v>) -> Result<()> {
        let (name_len, path_len, positions_len) = (self.name.len(), self.path.len(), self.positions.len());
        if let Some(step) = step {
            if !self.path.is_empty() || !self.name.is_empty() {
                self.name.push('.');
            }
            match &step {
                PathItem::Key(k) => self.name.push_str(k),
                PathItem::Index(i) => self.name.push_str(&i.to_string()),
            }
            self.path.push(step);
        }
        self.positions.extend_from_slice(at);
        let r = self.walk(child, f);
        self.positions.truncate(positions_len);
        self.path.truncate(path_len);
        self.name.truncate(name_len);
        r
    }

    fn walk(&mut self, v: &'v Value, f: &mut Emit<'_, 'v>) -> Result<()> {
        if self.positions.len() > MAX_WALK_DEPTH {
            return self.emit(v, f);
        }
        match v {
            Value::Shared { id, value } => {
                // Met again when a reference is followed: where it is defined stays where it was first met.
                if !self.defs.contains_key(id) {
                    self.defs.insert(*id, v);
                    self.shared_at.insert(*id, self.positions.clone());
                }
                // A shared container is walked as the container; anything else is a leaf as it is, with its
                // definition (so that a leaf written or printed on its own keeps the objects inside it that
                // refer back to it); an object's tensors are entries of their own.
                let container = match &**value {
                    Value::Dict(_) => true,
                    Value::List(_) => self.mode != Walk::Flatten || !is_terminal(value),
                    Value::Tuple(items) => self.mode != Walk::Flatten && !items.is_empty(),
                    _ => false,
                };
                if !container && !matches!(&**value, Value::Object(_)) {
                    return self.emit(v, f);
                }
                if !container {
                    return self.object_tensors(v, value, f);
                }
                self.active.insert(*id);
                self.positions.push(0);
                let r = self.walk(value, f);
                self.positions.pop();
                self.active.remove(id);
                r
            }
            Value::Ref(id) => match self.defs.get(id).copied() {
                Some(def) if !self.active.contains(id) => {
                    self.active.insert(*id);
                    self.positions.push(FOLLOW);
                    let r = self.walk(def, f);
                    self.positions.pop();
                    self.active.remove(id);
                    r
                }
                // A cycle (or an object not met yet): the reference itself.
                _ => self.emit(v, f),
            },
            Value::Dict(d) if self.mode == Walk::Flatten || !d.items.is_empty() || self.in_object => {
                for (i, (k, child)) in d.items.iter().enumerate() {
                    let name = match k {
                        Value::Str(s) => s.clone(),
                        other => python_str(other)?,
                    };
                    self.step(Some(PathItem::Key(name)), position(2 * i + 1), child, f)?;
                }
                Ok(())
            }
            Value::List(items) if self.flatten_list(v) || (self.mode != Walk::Flatten && !items.is_empty()) => {
                for (i, child) in items.iter().enumerate() {
                    self.step(Some(PathItem::Index(i)), position(i), child, f)?;
                }
                Ok(())
            }
            Value::Tuple(items) if self.mode != Walk::Flatten && !items.is_empty() => {
                for (i, child) in items.iter().enumerate() {
                    self.step(Some(PathItem::Index(i)), position(i), child, f)?;
                }
                Ok(())
            }
            Value::Object(_) if self.mode == Walk::Entries => self.object_tensors(v, v, f),
            _ => self.emit(v, f),
        }
    }

    /// DCP's rule for descending into a list.
    fn flatten_list(&self, v: &Value) -> bool {
        self.mode == Walk::Flatten && !is_terminal(v)
    }

    /// An object as an entry (`v`, which may be its shared definition), then the tensors inside it.
    fn object_tensors(&mut self, v: &'v Value, object: &'v Value, f: &mut Emit<'_, 'v>) -> Result<()> {
        self.emit(v, f)?;
        if self.mode != Walk::Entries {
            return Ok(());
        }
        let Value::Object(o) = object else { return Ok(()) };
        let was = std::mem::replace(&mut self.in_object, true);
        let shared = match v {
            Value::Shared { id, .. } => Some(*id),
            _ => None,
        };
        if let Some(id) = shared {
            self.active.insert(id);
            self.positions.push(0);
        }
        let mut r = Ok(());
        for part in parts_of(o) {
            r = self.step_at(part.step.map(PathItem::Key), &part.at, part.value, f);
            if r.is_err() {
                break;
            }
        }
        if shared.is_some() {
            self.positions.pop();
        }
        if let Some(id) = shared {
            self.active.remove(&id);
        }
        self.in_object = was;
        r
    }
}

fn position(i: usize) -> u32 {
    // A container of 2^32 items cannot be decoded under the pickle limits; saturate rather than wrap.
    u32::try_from(i).unwrap_or(u32::MAX - 1)
}

/// Largest list index [`unflatten`] pads up to; a larger index in a file is an error, not an allocation.
pub const MAX_UNFLATTEN_INDEX: usize = 1 << 24;

/// Rebuilds the nested state dict from `(path, value)` leaves, as DCP's `set_element` does: a string step
/// creates a `dict`, an index step a `list` padded with `None`.
///
/// # Errors
/// [`Error::EmptyPath`], [`Error::PathCrossesValue`], [`Error::PathNotKeyFirst`], [`Error::ListIndexTooLarge`]
/// (all [`Fault::InvalidArgument`](crate::Fault::InvalidArgument)) for an empty path, a path that crosses a
/// leaf, a first step that is an index,
/// or an index above [`MAX_UNFLATTEN_INDEX`].
pub fn unflatten(leaves: impl IntoIterator<Item = (Vec<PathItem>, Value)>) -> Result<Value> {
    let mut root = Value::Dict(Dict::new(DictKind::Dict));
    for (path, value) in leaves {
        if !matches!(path.first(), Some(PathItem::Key(_))) {
            return Err(Error::PathNotKeyFirst { path: join_path(&path) });
        }
        set_element(&mut root, &path, value)?;
    }
    Ok(root)
}

fn set_element(root: &mut Value, path: &[PathItem], value: Value) -> Result<()> {
    let mut cur = root;
    let Some((last, inner)) = path.split_last() else {
        return Err(Error::EmptyPath);
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
                return Err(Error::ListIndexTooLarge { index: *i, path: join_path(path), limit: MAX_UNFLATTEN_INDEX });
            }
            if items.len() <= *i {
                items.resize(i + 1, Value::None);
            }
            Ok(&mut items[*i])
        }
        (other, step) => {
            Err(Error::PathCrossesValue { path: join_path(path), type_name: other.type_name(), step: step.to_string() })
        }
    }
}
