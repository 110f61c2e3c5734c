//! The Python object tree that checkpoints carry besides tensors, kept losslessly.

use std::collections::hash_map::Entry;

use crate::buffer::Buffer;
use crate::composite::Composite;
use crate::dtype::DType;
use crate::tensor::Tensor;

/// Which Python mapping type a [`Dict`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DictKind {
    /// `dict`.
    Dict,
    /// `collections.OrderedDict` (every `nn.Module.state_dict()`).
    OrderedDict,
    /// `collections.Counter`.
    Counter,
}

/// A Python mapping: its kind, its items in insertion order, and the attributes set on it (an
/// `OrderedDict` state dict carries `{'_metadata': ...}`, restored by `__setstate__`).
#[derive(Debug, Clone, PartialEq)]
pub struct Dict {
    /// dict, OrderedDict or Counter.
    pub kind: DictKind,
    /// Items in insertion order; keys may be any value (int keys stay ints).
    pub items: Vec<(Value, Value)>,
    /// The object's `__dict__` when it has one (set through `__setstate__`), else `None`.
    pub attrs: Option<Box<Value>>,
}

impl Dict {
    /// An empty mapping of `kind`.
    pub fn new(kind: DictKind) -> Self {
        Dict { kind, items: Vec::new(), attrs: None }
    }

    /// The value of the first item whose key is the string `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.items.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }

    /// Appends an item (no deduplication, like a pickle stream).
    pub fn insert(&mut self, key: impl Into<Value>, value: impl Into<Value>) {
        self.items.push((key.into(), value.into()));
    }

    /// The mapping Python builds from `items` set one after the other (`d[k] = v`, as unpickling does): a key
    /// equal to an earlier one keeps the earlier position and takes the later value. Keys are equal as
    /// Python compares them (`1`, `1.0`, `True` and `1+0j` are one key; `str` and `bytes` never equal); keys
    /// compared by identity (objects, tensors, NaN) are all distinct.
    ///
    /// ```
    /// use ckpt_tensor::{Dict, DictKind, Value};
    /// let w = || Value::Str("w".into());
    /// let items = [(w(), Value::Int(1)), (Value::Int(1), Value::Int(2)), (w(), Value::Int(3)), (Value::Float(1.0), Value::Int(4))];
    /// let d = Dict::from_python_items(DictKind::Dict, items);
    /// assert_eq!(d.items, vec![(w(), Value::Int(3)), (Value::Int(1), Value::Int(4))]);
    /// ```
    pub fn from_python_items(kind: DictKind, items: impl IntoIterator<Item = (Value, Value)>) -> Self {
        let mut items: Vec<(Value, Value)> = items.into_iter().collect();
        // Where each repeated key's value goes: (the later item, the earlier one it repeats). Found with
        // borrowed keys, so a mapping without repeats (every real state dict) is returned as it came.
        let repeats: Vec<(usize, usize)> = {
            let mut first: foldhash::HashMap<KeyId<'_>, usize> =
                foldhash::HashMap::with_capacity_and_hasher(items.len(), foldhash::fast::RandomState::default());
            let mut repeats = Vec::new();
            for (i, (k, _)) in items.iter().enumerate() {
                if let Some(id) = KeyId::of(k) {
                    match first.entry(id) {
                        Entry::Occupied(at) => repeats.push((i, *at.get())),
                        Entry::Vacant(slot) => {
                            slot.insert(i);
                        }
                    }
                }
            }
            repeats
        };
        if !repeats.is_empty() {
            // Later values first move into their first positions (the last repeat of a key is applied last),
            // then the repeated items go.
            let mut drop = vec![false; items.len()];
            for &(later, earlier) in &repeats {
                let value = items.get_mut(later).map(|(_, v)| std::mem::replace(v, Value::None));
                if let (Some(value), Some((_, slot))) = (value, items.get_mut(earlier)) {
                    *slot = value;
                }
                if let Some(d) = drop.get_mut(later) {
                    *d = true;
                }
            }
            let mut keep = drop.into_iter().map(|d| !d);
            items.retain(|_| keep.next().unwrap_or(true));
        }
        Dict { kind, items, attrs: None }
    }
}

/// A hashable key's identity under Python's `==` (`None` for keys compared by identity), borrowing the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum KeyId<'a> {
    None,
    /// `bool`, `int` within i64, integral `float`, `complex` with integral real part and no imaginary part.
    Int(i64),
    BigInt(&'a [u8]),
    /// Other floats (and complex numbers without imaginary part), by bits; never NaN.
    Float(u64),
    Complex(u64, u64),
    Str(&'a str),
    Bytes(&'a [u8]),
    Tuple(Vec<KeyId<'a>>),
    /// Classes, functions and dtypes: one object per name.
    Global(&'a str, &'a str),
    DType(DType),
}

impl<'a> KeyId<'a> {
    fn of(v: &'a Value) -> Option<KeyId<'a>> {
        fn float(f: f64) -> Option<KeyId<'static>> {
            if f.is_nan() {
                None
            } else if f.fract() == 0.0 && f.abs() < 9.0e18 {
                Some(KeyId::Int(f as i64))
            } else {
                Some(KeyId::Float(f.to_bits()))
            }
        }
        Some(match v {
            Value::None => KeyId::None,
            Value::Bool(b) => KeyId::Int(i64::from(*b)),
            Value::Int(i) => KeyId::Int(*i),
            Value::BigInt(b) => KeyId::BigInt(b),
            Value::Float(f) => float(*f)?,
            Value::Complex(re, im) if *im == 0.0 => float(*re)?,
            Value::Complex(re, im) if re.is_nan() || im.is_nan() => return None,
            Value::Complex(re, im) => KeyId::Complex((re + 0.0).to_bits(), im.to_bits()),
            Value::Str(s) => KeyId::Str(s),
            Value::Bytes(b) => KeyId::Bytes(b),
            Value::Tuple(items) => KeyId::Tuple(items.iter().map(KeyId::of).collect::<Option<_>>()?),
            Value::Global { module, name } => KeyId::Global(module, name),
            Value::DType(d) => KeyId::DType(*d),
            _ => return None,
        })
    }
}

/// An object of a class the library does not model, kept symbolically so it can be written back exactly:
/// `callable(*args)` or `cls.__new__(cls, *args)`, then items appended or set, then
/// `__setstate__(state)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// What was called: usually a [`Value::Global`].
    pub callable: Value,
    /// The arguments, usually a [`Value::Tuple`].
    pub args: Value,
    /// Created with `cls.__new__(cls, *args)` rather than by calling `callable(*args)`.
    pub newobj: bool,
    /// The state given to `__setstate__`, if any.
    pub state: Option<Value>,
    /// Items appended after creation.
    pub list_items: Vec<Value>,
    /// Items set after creation.
    pub dict_items: Vec<(Value, Value)>,
}

impl Object {
    /// Whether two objects are the same ([`Value::same`] on every part).
    pub fn same(&self, other: &Object) -> bool {
        Ids::default().object(self, other)
    }

    /// `(module, name)` of the callable when it is a global.
    pub fn callable_name(&self) -> Option<(&str, &str)> {
        match &self.callable {
            Value::Global { module, name } => Some((module, name)),
            _ => None,
        }
    }
}

/// The correspondence of shared-object ids between two values [`Value::same`] compares, both ways.
#[derive(Default)]
struct Ids {
    a_to_b: std::collections::HashMap<u32, u32>,
    b_to_a: std::collections::HashMap<u32, u32>,
}

impl Ids {
    /// Pairs `a` with `b`, or checks that they were paired.
    fn pair(&mut self, a: u32, b: u32) -> bool {
        match (self.a_to_b.get(&a), self.b_to_a.get(&b)) {
            (None, None) => {
                self.a_to_b.insert(a, b);
                self.b_to_a.insert(b, a);
                true
            }
            (Some(&x), Some(&y)) => x == b && y == a,
            _ => false,
        }
    }

    fn all(&mut self, a: &[Value], b: &[Value]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| self.same(x, y))
    }

    fn pairs(&mut self, a: &[(Value, Value)], b: &[(Value, Value)]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|((k, v), (l, w))| self.same(k, l) && self.same(v, w))
    }

    fn opt(&mut self, a: Option<&Value>, b: Option<&Value>) -> bool {
        match (a, b) {
            (Some(x), Some(y)) => self.same(x, y),
            (None, None) => true,
            _ => false,
        }
    }

    fn object(&mut self, a: &Object, b: &Object) -> bool {
        a.newobj == b.newobj
            && self.same(&a.callable, &b.callable)
            && self.same(&a.args, &b.args)
            && self.opt(a.state.as_ref(), b.state.as_ref())
            && self.all(&a.list_items, &b.list_items)
            && self.pairs(&a.dict_items, &b.dict_items)
    }

    fn same(&mut self, a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
            (Value::Complex(a, b), Value::Complex(c, d)) => a.to_bits() == c.to_bits() && b.to_bits() == d.to_bits(),
            (Value::List(a), Value::List(b))
            | (Value::Tuple(a), Value::Tuple(b))
            | (Value::Set(a), Value::Set(b))
            | (Value::FrozenSet(a), Value::FrozenSet(b)) => self.all(a, b),
            (Value::Dict(a), Value::Dict(b)) => {
                a.kind == b.kind && self.pairs(&a.items, &b.items) && self.opt(a.attrs.as_deref(), b.attrs.as_deref())
            }
            (Value::Parameter { tensor: a, state: s }, Value::Parameter { tensor: b, state: t }) => {
                a == b && self.opt(s.as_deref(), t.as_deref())
            }
            (
                Value::TensorWithState { tensor: a, class: c, state: s },
                Value::TensorWithState { tensor: b, class: d, state: t },
            ) => self.same(a, b) && self.same(c, d) && self.same(s, t),
            (Value::OpaqueTensor { kind: k, object: a }, Value::OpaqueTensor { kind: l, object: b }) => {
                k == l && self.object(a, b)
            }
            (Value::Object(a), Value::Object(b)) => self.object(a, b),
            (Value::Numpy(a), Value::Numpy(b)) => {
                a.dtype == b.dtype && a.module == b.module && self.same(&a.value, &b.value)
            }
            (Value::Storage { dtype: d, data: a }, Value::Storage { dtype: e, data: b }) => {
                d == e && a.as_bytes() == b.as_bytes()
            }
            (Value::Shared { id: i, value: a }, Value::Shared { id: j, value: b }) => {
                self.pair(*i, *j) && self.same(a, b)
            }
            (Value::Ref(i), Value::Ref(j)) => self.pair(*i, *j),
            (a, b) => a == b,
        }
    }
}

/// A numpy scalar or array unpickled from a checkpoint (`numpy.core.multiarray.scalar` or `_reconstruct`,
/// numpy 2's `numpy._core.multiarray`), kept so that writing it back pickles the same numpy object.
#[derive(Debug, Clone, PartialEq)]
pub struct Numpy {
    /// A scalar's value (`Bool`, `Int`, `BigInt` for a `uint64` above `i64`, `Float` or `Complex`), or an
    /// array's data as a [`Value::Tensor`] of the numpy dtype (Fortran-ordered arrays keep their strides).
    pub value: Value,
    /// The numpy dtype, as the torch dtype of the same name (`bool`, `int8` ... `uint64`, `float16`,
    /// `float32`, `float64`, `complex64`, `complex128`).
    pub dtype: DType,
    /// The module numpy pickled it under: `numpy._core.multiarray` (numpy 2) or `numpy.core.multiarray`.
    pub module: String,
}

impl Numpy {
    /// Whether this is an array (else a scalar).
    pub fn is_array(&self) -> bool {
        matches!(self.value, Value::Tensor(_))
    }

    /// numpy's name of the value's type: `numpy.ndarray`, `numpy.float64`, `numpy.int64`, `numpy.bool` ...
    pub fn type_name(&self) -> &'static str {
        if self.is_array() {
            return "numpy.ndarray";
        }
        match self.dtype {
            DType::Bool => "numpy.bool",
            DType::I8 => "numpy.int8",
            DType::I16 => "numpy.int16",
            DType::I32 => "numpy.int32",
            DType::I64 => "numpy.int64",
            DType::U8 => "numpy.uint8",
            DType::U16 => "numpy.uint16",
            DType::U32 => "numpy.uint32",
            DType::U64 => "numpy.uint64",
            DType::F16 => "numpy.float16",
            DType::F32 => "numpy.float32",
            DType::F64 => "numpy.float64",
            DType::C64 => "numpy.complex64",
            DType::C128 => "numpy.complex128",
            _ => "numpy.generic",
        }
    }
}

/// The modules numpy pickles `scalar` and `_reconstruct` under (numpy 2, numpy 1).
pub const NUMPY_MULTIARRAY: [&str; 2] = ["numpy._core.multiarray", "numpy.core.multiarray"];

/// `(type code, byte order)` of a pickled `numpy.dtype(code, False, True)` with its `__setstate__` state.
pub fn numpy_dtype_code(v: &Value) -> Option<(&str, &str)> {
    let Value::Object(o) = v else { return None };
    if o.callable_name() != Some(("numpy", "dtype")) {
        return None;
    }
    let Value::Tuple(args) = &o.args else { return None };
    let code = args.first()?.as_str()?;
    let order = match &o.state {
        Some(Value::Tuple(s)) => s.get(1).and_then(Value::as_str).unwrap_or("|"),
        _ => "|",
    };
    Some((code, order))
}

fn multiarray(o: &Object, name: &str) -> bool {
    o.callable_name().is_some_and(|(m, n)| n == name && NUMPY_MULTIARRAY.contains(&m))
}

/// Why a pickled numpy object has no value here, naming its dtype: `Some` for a numpy scalar or array that
/// ckpt-torch's reader left as an object (object arrays, structured dtypes, strings, big-endian data).
pub fn numpy_unsupported(v: &Value) -> Option<String> {
    let Value::Object(o) = v else { return None };
    let (what, dtype) = if multiarray(o, "scalar") {
        let Value::Tuple(args) = &o.args else { return None };
        ("scalar", args.first()?)
    } else if multiarray(o, "_reconstruct") {
        let Some(Value::Tuple(state)) = &o.state else { return Some("a numpy array without its state".into()) };
        ("array", state.get(2)?)
    } else {
        return None;
    };
    let Some((code, order)) = numpy_dtype_code(dtype) else {
        return Some(format!("a numpy {what} of an unreadable dtype"));
    };
    let kind = match code.chars().next() {
        Some('O') => "object",
        Some('V') => "structured",
        Some('U') | Some('S') => "string",
        Some('M') | Some('m') => "datetime",
        _ if order == ">" => "big-endian",
        _ => "unsupported",
    };
    Some(format!(
        "a numpy {what} of {kind} dtype '{order}{code}' is not supported: only bool, integer, float16/32/64 and \
         complex64/128 numpy values are read"
    ))
}

/// Why a tensor's data cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpaqueTensorKind {
    /// A sparse tensor (COO, CSR, CSC, BSR, BSC).
    Sparse,
    /// A quantized tensor.
    Quantized,
    /// A nested tensor.
    Nested,
    /// A meta tensor (no storage).
    Meta,
    /// A tensor subclass or device tensor the library does not model.
    Other,
}

/// A Python value as found in a checkpoint.
///
/// Distinctions that matter for round trips are kept: dict vs `OrderedDict` ([`DictKind`]), tuple vs list,
/// int vs float, `torch.Size` vs tuple, dtypes, devices, and any unknown object ([`Object`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// `None`.
    None,
    /// `bool`.
    Bool(bool),
    /// `int` within i64.
    Int(i64),
    /// `int` beyond i64: little-endian two's complement bytes, minimal length.
    BigInt(Vec<u8>),
    /// `float`.
    Float(f64),
    /// `complex`.
    Complex(f64, f64),
    /// `str`.
    Str(String),
    /// `bytes`.
    Bytes(Vec<u8>),
    /// `bytearray`.
    ByteArray(Vec<u8>),
    /// `list`.
    List(Vec<Value>),
    /// `tuple`.
    Tuple(Vec<Value>),
    /// `set`, items in the order they were stored.
    Set(Vec<Value>),
    /// `frozenset`.
    FrozenSet(Vec<Value>),
    /// `dict`, `OrderedDict` or `Counter`.
    Dict(Dict),
    /// A dense tensor (`requires_grad` is on the tensor).
    Tensor(Tensor),
    /// A `torch.nn.Parameter`; `state` is the Python `__dict__` when the parameter had attributes
    /// (`_rebuild_parameter_with_state`).
    Parameter {
        /// The data; its `requires_grad` is the parameter's.
        tensor: Tensor,
        /// Python attributes, if any.
        state: Option<Box<Value>>,
    },
    /// A tensor rebuilt through `torch._tensor._rebuild_from_type_v2`: a plain tensor with Python attributes
    /// (`class` = `torch.Tensor`) or a tensor subclass.
    TensorWithState {
        /// The tensor (a [`Value::Tensor`] or [`Value::Parameter`]).
        tensor: Box<Value>,
        /// The Python type, usually `torch.Tensor`.
        class: Box<Value>,
        /// The Python `__dict__` / state.
        state: Box<Value>,
    },
    /// A tensor whose data the library cannot materialise (sparse, quantized, nested, ...), kept as the
    /// object that rebuilds it. Reading its data is an error naming the kind.
    OpaqueTensor {
        /// What kind of tensor.
        kind: OpaqueTensorKind,
        /// The rebuild call, for writing it back.
        object: Box<Object>,
    },
    /// A quantized, sparse or nested tensor, as its named component tensors ([`Composite`]): listed as one
    /// entry with its layout, dtype and shape; its components are readable, and its dense form where it has one.
    Composite(Box<Composite>),
    /// A bare storage (a `torch.UntypedStorage` or typed storage saved directly).
    Storage {
        /// Element type (`U8` for an untyped storage).
        dtype: DType,
        /// The bytes.
        data: Buffer,
    },
    /// `torch.Size`.
    Size(Vec<i64>),
    /// A `torch.dtype`.
    DType(DType),
    /// A `torch.device`.
    Device {
        /// Device type (`cpu`, `cuda`, ...).
        kind: String,
        /// Device index, if given.
        index: Option<i64>,
    },
    /// A reference to a global (a class or function) that is not itself a value the library models.
    Global {
        /// Module path.
        module: String,
        /// Qualified name.
        name: String,
    },
    /// An object of an unmodelled class.
    Object(Box<Object>),
    /// A numpy scalar or array.
    Numpy(Box<Numpy>),
    /// An object that other places of the checkpoint refer to ([`Value::Ref`] with the same `id`), at the
    /// first place a depth-first walk meets it: a list, dict, set or object the pickle shares between places,
    /// or any object on a cycle that more than one place refers to (an omegaconf node: its parent holds it
    /// and its children link back through `_parent`). An object on a cycle that one place holds stays in
    /// place. Immutable values the pickle shares (strings, numbers, tuples, tensors) are copies instead.
    Shared {
        /// The number [`Value::Ref`]s to it carry (0, 1, ... in walk order).
        id: u32,
        /// The object.
        value: Box<Value>,
    },
    /// The object [`Value::Shared`] with this id: earlier in a depth-first walk, or enclosing this place.
    Ref(u32),
}

/// What a container [`Value`] is without the values it holds ([`Value::into_parts`]).
#[derive(Debug, Clone)]
pub struct ValueShape(Shape);

#[derive(Debug, Clone)]
enum Shape {
    List,
    Tuple,
    Set,
    FrozenSet,
    /// Children: the items' keys and values alternating, then the attributes when `attrs`.
    Dict {
        kind: DictKind,
        attrs: bool,
    },
    /// Children: callable, args, the state when `state`, the list items, the dict items' keys and values.
    Object {
        newobj: bool,
        state: bool,
        list: usize,
    },
    /// Children: the state when `state`.
    Parameter {
        tensor: Tensor,
        state: bool,
    },
    /// Children: tensor, class, state.
    TensorWithState,
    /// Children: the object's, as [`Shape::Object`].
    OpaqueTensor {
        kind: OpaqueTensorKind,
        newobj: bool,
        state: bool,
        list: usize,
    },
    /// Children: the value.
    Numpy {
        dtype: DType,
        module: String,
    },
    /// Children: the value.
    Shared(u32),
}

fn object_children(o: Object, out: &mut Vec<Value>) -> (bool, bool, usize) {
    let Object { callable, args, newobj, state, list_items, dict_items } = o;
    let parts = (newobj, state.is_some(), list_items.len());
    out.push(callable);
    out.push(args);
    out.extend(state);
    out.extend(list_items);
    for (k, v) in dict_items {
        out.push(k);
        out.push(v);
    }
    parts
}

fn object_from(it: &mut std::vec::IntoIter<Value>, newobj: bool, state: bool, list: usize) -> Object {
    let callable = it.next().unwrap_or(Value::None);
    let args = it.next().unwrap_or(Value::None);
    let state = if state { it.next() } else { None };
    let list_items: Vec<Value> = it.by_ref().take(list).collect();
    let mut dict_items = Vec::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        dict_items.push((k, v));
    }
    Object { callable, args, newobj, state, list_items, dict_items }
}

fn object_refs<'a>(o: &'a Object, out: &mut Vec<&'a Value>) {
    out.push(&o.callable);
    out.push(&o.args);
    out.extend(o.state.iter());
    out.extend(o.list_items.iter());
    for (k, v) in &o.dict_items {
        out.push(k);
        out.push(v);
    }
}

impl Value {
    /// Pushes the values directly inside this one to `out`, in order (a dict's keys and values alternating,
    /// then its attributes; an object's callable, arguments, state, items), as [`Value::into_parts`] splits
    /// them. Walking with this and a stack visits every value without recursion.
    pub fn children_into<'a>(&'a self, out: &mut Vec<&'a Value>) {
        match self {
            Value::List(items) | Value::Tuple(items) | Value::Set(items) | Value::FrozenSet(items) => {
                out.extend(items.iter());
            }
            Value::Dict(d) => {
                for (k, v) in &d.items {
                    out.push(k);
                    out.push(v);
                }
                if let Some(a) = &d.attrs {
                    out.push(a);
                }
            }
            Value::Object(o) | Value::OpaqueTensor { object: o, .. } => object_refs(o, out),
            Value::Parameter { state, .. } => out.extend(state.as_deref()),
            Value::TensorWithState { tensor, class, state } => {
                out.push(tensor);
                out.push(class);
                out.push(state);
            }
            Value::Numpy(n) => out.push(&n.value),
            Value::Shared { value, .. } => out.push(value),
            _ => {}
        }
    }

    /// Takes a container apart into its shape and the values it holds (in [`Value::children_into`]'s
    /// order), to be put together again with [`Value::from_parts`]; a value that holds none comes back as
    /// `Err`.
    ///
    /// # Errors
    /// The value itself (boxed), when it holds no values.
    pub fn into_parts(self) -> std::result::Result<(ValueShape, Vec<Value>), Box<Value>> {
        let mut out = Vec::new();
        let shape = match self {
            Value::List(items) => return Ok((ValueShape(Shape::List), items)),
            Value::Tuple(items) => return Ok((ValueShape(Shape::Tuple), items)),
            Value::Set(items) => return Ok((ValueShape(Shape::Set), items)),
            Value::FrozenSet(items) => return Ok((ValueShape(Shape::FrozenSet), items)),
            Value::Dict(d) => {
                let Dict { kind, items, attrs } = d;
                out.reserve(items.len() * 2 + 1);
                for (k, v) in items {
                    out.push(k);
                    out.push(v);
                }
                let has = attrs.is_some();
                out.extend(attrs.map(|a| *a));
                Shape::Dict { kind, attrs: has }
            }
            Value::Object(o) => {
                let (newobj, state, list) = object_children(*o, &mut out);
                Shape::Object { newobj, state, list }
            }
            Value::OpaqueTensor { kind, object } => {
                let (newobj, state, list) = object_children(*object, &mut out);
                Shape::OpaqueTensor { kind, newobj, state, list }
            }
            Value::Parameter { tensor, state } => {
                let has = state.is_some();
                out.extend(state.map(|s| *s));
                Shape::Parameter { tensor, state: has }
            }
            Value::TensorWithState { tensor, class, state } => {
                out.extend([*tensor, *class, *state]);
                Shape::TensorWithState
            }
            Value::Numpy(n) => {
                let Numpy { value, dtype, module } = *n;
                out.push(value);
                Shape::Numpy { dtype, module }
            }
            Value::Shared { id, value } => {
                out.push(*value);
                Shape::Shared(id)
            }
            leaf => return Err(Box::new(leaf)),
        };
        Ok((ValueShape(shape), out))
    }

    /// Puts together what [`Value::into_parts`] took apart (with the same number of values).
    pub fn from_parts(shape: ValueShape, children: Vec<Value>) -> Value {
        let mut it = children.into_iter();
        match shape.0 {
            Shape::List => Value::List(it.collect()),
            Shape::Tuple => Value::Tuple(it.collect()),
            Shape::Set => Value::Set(it.collect()),
            Shape::FrozenSet => Value::FrozenSet(it.collect()),
            Shape::Dict { kind, attrs } => {
                let mut rest: Vec<Value> = it.collect();
                let attrs = if attrs { rest.pop().map(Box::new) } else { None };
                let mut items = Vec::with_capacity(rest.len() / 2);
                let mut pairs = rest.into_iter();
                while let (Some(k), Some(v)) = (pairs.next(), pairs.next()) {
                    items.push((k, v));
                }
                Value::Dict(Dict { kind, items, attrs })
            }
            Shape::Object { newobj, state, list } => Value::Object(Box::new(object_from(&mut it, newobj, state, list))),
            Shape::OpaqueTensor { kind, newobj, state, list } => {
                Value::OpaqueTensor { kind, object: Box::new(object_from(&mut it, newobj, state, list)) }
            }
            Shape::Parameter { tensor, state } => {
                Value::Parameter { tensor, state: if state { it.next().map(Box::new) } else { None } }
            }
            Shape::TensorWithState => {
                let tensor = Box::new(it.next().unwrap_or(Value::None));
                let class = Box::new(it.next().unwrap_or(Value::None));
                let state = Box::new(it.next().unwrap_or(Value::None));
                Value::TensorWithState { tensor, class, state }
            }
            Shape::Numpy { dtype, module } => {
                Value::Numpy(Box::new(Numpy { value: it.next().unwrap_or(Value::None), dtype, module }))
            }
            Shape::Shared(id) => Value::Shared { id, value: Box::new(it.next().unwrap_or(Value::None)) },
        }
    }

    /// Whether the value holds a [`Value::Ref`] anywhere (without recursion).
    pub fn has_refs(&self) -> bool {
        let mut stack = vec![self];
        let mut children = Vec::new();
        while let Some(v) = stack.pop() {
            if matches!(v, Value::Ref(_)) {
                return true;
            }
            children.clear();
            v.children_into(&mut children);
            stack.extend(children.iter().copied());
        }
        false
    }

    /// This value with every reference to a shared object that does not contain itself replaced by a copy
    /// of the object, and the definitions nothing refers to any more unwrapped: what a format that writes
    /// parts of a checkpoint to separate files (DCP items, hfai parts) can write part by part. Objects on a
    /// cycle stay shared (a reference to one from another part is written by that part's writer as it can).
    /// Borrowed when there is no reference.
    pub fn unshared(&self) -> std::borrow::Cow<'_, Value> {
        if !self.has_refs() {
            return std::borrow::Cow::Borrowed(self);
        }
        // Every definition, and the references inside each (to find the ones on a cycle).
        let mut defs: std::collections::HashMap<u32, &Value> = std::collections::HashMap::new();
        let mut stack = vec![self];
        let mut children = Vec::new();
        while let Some(v) = stack.pop() {
            if let Value::Shared { id, value } = v {
                defs.insert(*id, value);
            }
            children.clear();
            v.children_into(&mut children);
            stack.extend(children.iter().copied());
        }
        let refs_in = |v: &Value| {
            let mut out = Vec::new();
            let mut stack = vec![v];
            let mut children = Vec::new();
            while let Some(v) = stack.pop() {
                if let Value::Ref(id) = v {
                    out.push(*id);
                }
                children.clear();
                v.children_into(&mut children);
                stack.extend(children.iter().copied());
            }
            out
        };
        let edges: std::collections::HashMap<u32, Vec<u32>> = defs.iter().map(|(&id, v)| (id, refs_in(v))).collect();
        // A definition is on a cycle when its references lead back to it.
        let cyclic = |start: u32| {
            let mut seen = std::collections::HashSet::new();
            let mut todo: Vec<u32> = edges.get(&start).cloned().unwrap_or_default();
            while let Some(id) = todo.pop() {
                if id == start {
                    return true;
                }
                if seen.insert(id) {
                    todo.extend(edges.get(&id).into_iter().flatten().copied());
                }
            }
            false
        };
        let keep: std::collections::HashSet<u32> = defs.keys().copied().filter(|&id| cyclic(id)).collect();
        std::borrow::Cow::Owned(expand_refs(self.clone(), &defs, &keep))
    }

    /// Whether a program can change this value in place (a list, dict, set, bytearray or object), which is
    /// what makes it a [`Value::Shared`] object when several places refer to it.
    pub fn is_mutable(&self) -> bool {
        matches!(self, Value::List(_) | Value::Dict(_) | Value::Set(_) | Value::ByteArray(_) | Value::Object(_))
    }
}

impl Value {
    /// The string, if this is a `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is an `int` within i64 (a `bool` is not an int here), or a numpy integer scalar.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Numpy(n) => n.value.as_int(),
            _ => None,
        }
    }

    /// The float, if this is a `float` (or an `int` converted), or a numpy float or integer scalar.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            Value::Numpy(n) => n.value.as_f64(),
            _ => None,
        }
    }

    /// The mapping, if this is a dict-like value.
    pub fn as_dict(&self) -> Option<&Dict> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// The items of a list or tuple.
    pub fn as_sequence(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The dense tensor inside a tensor, parameter, tensor-with-state value or numpy array.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) | Value::Parameter { tensor: t, .. } => Some(t),
            Value::TensorWithState { tensor, .. } => tensor.as_tensor(),
            Value::Numpy(n) => n.value.as_tensor(),
            _ => None,
        }
    }

    /// Whether this is any kind of tensor, including opaque ones (DCP treats all of them as leaves).
    pub fn is_tensor_like(&self) -> bool {
        matches!(
            self,
            Value::Tensor(_)
                | Value::Parameter { .. }
                | Value::TensorWithState { .. }
                | Value::OpaqueTensor { .. }
                | Value::Composite(_)
        )
    }

    /// A short Python-like type name, for messages (`dict`, `OrderedDict`, `Tensor`, `int`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Complex(..) => "complex",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::ByteArray(_) => "bytearray",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Set(_) => "set",
            Value::FrozenSet(_) => "frozenset",
            Value::Dict(d) => match d.kind {
                DictKind::Dict => "dict",
                DictKind::OrderedDict => "OrderedDict",
                DictKind::Counter => "Counter",
            },
            Value::Tensor(_) => "Tensor",
            Value::Parameter { .. } => "Parameter",
            Value::TensorWithState { .. } => "Tensor (with state)",
            Value::OpaqueTensor { .. } => "Tensor (opaque)",
            Value::Composite(c) => match c.layout {
                crate::Layout::PerTensorAffine | crate::Layout::PerChannelAffine => "Tensor (quantized)",
                crate::Layout::Nested => "Tensor (nested)",
                _ => "Tensor (sparse)",
            },
            Value::Storage { .. } => "Storage",
            Value::Size(_) => "torch.Size",
            Value::DType(_) => "torch.dtype",
            Value::Device { .. } => "torch.device",
            Value::Global { .. } => "global",
            Value::Object(_) => "object",
            Value::Numpy(n) => n.type_name(),
            Value::Shared { value, .. } => value.type_name(),
            Value::Ref(_) => "reference",
        }
    }

    /// Whether two values are the same, as a lossless round trip must keep them: like `==`, but floats
    /// (and complex parts) compare by their bits, so NaN equals a NaN of the same bits and `-0.0` differs
    /// from `0.0`. Tensors compare by dtype, shape, values and `requires_grad` (`==` on [`Tensor`]). Shared
    /// objects compare as a graph: the ids may differ, but each shared object of one side must be one shared
    /// object of the other at the same places, and every reference must point to the corresponding one.
    ///
    /// ```
    /// use ckpt_tensor::Value;
    /// let cyc = |id| Value::Shared { id, value: Box::new(Value::List(vec![Value::Ref(id)])) };
    /// assert!(cyc(0).same(&cyc(7)));
    /// assert!(!cyc(0).same(&Value::Shared { id: 0, value: Box::new(Value::List(vec![Value::Ref(1)])) }));
    /// ```
    pub fn same(&self, other: &Value) -> bool {
        Ids::default().same(self, other)
    }

    /// A plain `dict` built from string keys.
    pub fn dict<K: Into<String>>(items: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Dict(Dict {
            kind: DictKind::Dict,
            items: items.into_iter().map(|(k, v)| (Value::Str(k.into()), v)).collect(),
            attrs: None,
        })
    }
}

/// Decimal text of a little-endian two's complement integer (a [`Value::BigInt`]'s payload).
///
/// ```
/// assert_eq!(ckpt_tensor::value::bigint_decimal(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), "18446744073709551616");
/// ```
pub fn bigint_decimal(le: &[u8]) -> String {
    let negative = le.last().is_some_and(|b| b & 0x80 != 0);
    // magnitude as little-endian bytes
    let mut mag: Vec<u8> = le.to_vec();
    if negative {
        let mut carry = 1u16;
        for b in &mut mag {
            let v = u16::from(!*b) + carry;
            *b = v as u8;
            carry = v >> 8;
        }
    }
    // repeated division by 10 on big-endian digits
    let mut be: Vec<u8> = mag.into_iter().rev().skip_while(|&b| b == 0).collect();
    if be.is_empty() {
        return "0".into();
    }
    let mut out = Vec::new();
    while !be.is_empty() {
        let mut rem = 0u32;
        let mut next = Vec::with_capacity(be.len());
        for &b in &be {
            let cur = (rem << 8) | u32::from(b);
            let q = cur / 10;
            rem = cur % 10;
            if !(next.is_empty() && q == 0) {
                next.push(q as u8);
            }
        }
        out.push(b'0' + rem as u8);
        be = next;
    }
    if negative {
        out.push(b'-');
    }
    out.reverse();
    out.into_iter().map(char::from).collect()
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Self {
        Value::Tensor(t)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<Dict> for Value {
    fn from(d: Dict) -> Self {
        Value::Dict(d)
    }
}

/// `v` with every reference to a definition not in `keep` replaced by a copy of the definition (itself
/// expanded), and those definitions unwrapped; without recursion.
fn expand_refs(
    v: Value,
    defs: &std::collections::HashMap<u32, &Value>,
    keep: &std::collections::HashSet<u32>,
) -> Value {
    enum Step {
        Visit(Value, usize),
        Join(ValueShape, usize),
    }
    let mut steps = vec![Step::Visit(v, 0)];
    let mut done: Vec<Value> = Vec::new();
    while let Some(step) = steps.pop() {
        match step {
            Step::Visit(v, depth) => match v {
                Value::Ref(id) if !keep.contains(&id) && depth < 1000 => match defs.get(&id) {
                    Some(def) => steps.push(Step::Visit((*def).clone(), depth + 1)),
                    None => done.push(Value::Ref(id)),
                },
                Value::Shared { id, value } if !keep.contains(&id) => steps.push(Step::Visit(*value, depth)),
                other => match other.into_parts() {
                    Ok((shape, children)) => {
                        steps.push(Step::Join(shape, children.len()));
                        steps.extend(children.into_iter().rev().map(|c| Step::Visit(c, depth + 1)));
                    }
                    Err(leaf) => done.push(*leaf),
                },
            },
            Step::Join(shape, n) => {
                let children = done.split_off(done.len().saturating_sub(n));
                done.push(Value::from_parts(shape, children));
            }
        }
    }
    done.pop().unwrap_or(Value::None)
}
