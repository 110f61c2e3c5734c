//! ckpt's `Value` tree as Python objects, and Python objects as a `Value` tree (for `ckpt.save`).
//!
//! To Python: `None`, `bool`, `int`, `float`, `complex`, `str`, `bytes`, `bytearray`, `list`, `tuple`, `set`,
//! `frozenset`, `dict` (`OrderedDict` and `Counter` kept), tensors as numpy arrays or torch tensors
//! ([`Framework`]), numpy scalars and arrays as numpy's, and what only torch or an unknown class can be —
//! `torch.Size`, dtypes, devices, globals, objects, opaque (sparse, quantized) tensors — as torch's objects
//! with `framework="pt"`, else as the small classes of `ckpt._values`.

use ckpt::tensor::{Buffer, DType, Dict, DictKind, Numpy, Object, Tensor, Value};
use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyComplex, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString, PyTuple,
};

use crate::arrays;
use crate::errors::usage;

/// What tensors become.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framework {
    /// numpy arrays (read-only over the map where they can be).
    Numpy,
    /// torch tensors (copy-on-write over the file where they can be, `ckpt._torch`).
    Torch,
}

impl Framework {
    /// `"np"`/`"numpy"` or `"pt"`/`"torch"`.
    pub(crate) fn parse(name: &str) -> PyResult<Framework> {
        match name {
            "np" | "numpy" => Ok(Framework::Numpy),
            "pt" | "torch" => Ok(Framework::Torch),
            other => Err(usage(format!("framework {other:?}: use \"np\" (numpy) or \"pt\" (torch)"), None)),
        }
    }
}

/// The Python objects conversions make: `ckpt._values`' classes and `collections`' mappings.
struct Classes {
    ordered_dict: Py<PyAny>,
    counter: Py<PyAny>,
    values: Py<PyModule>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let collections = py.import("collections")?;
        Ok(Classes {
            ordered_dict: collections.getattr("OrderedDict")?.unbind(),
            counter: collections.getattr("Counter")?.unbind(),
            values: crate::helpers::values(py)?.unbind(),
        })
    })
}

/// How values become Python objects: the framework, and for torch, the converter of one checkpoint
/// (`ckpt._torch.Converter`, which maps its file copy-on-write).
pub(crate) struct ToPy<'py> {
    framework: Framework,
    torch: Option<Bound<'py, PyAny>>,
    /// The objects made of [`Value::Shared`] values so far, by id: each [`Value::Ref`] to one is that same
    /// Python object, as unpickling makes it (shared lists and dicts, and cycles through them).
    shared: std::cell::RefCell<std::collections::HashMap<u32, Bound<'py, PyAny>>>,
}

impl<'py> ToPy<'py> {
    /// Values as objects of `framework`, torch tensors made by `torch` (`ckpt._torch.Converter`).
    pub(crate) fn new(framework: Framework, torch: Option<Bound<'py, PyAny>>) -> Self {
        ToPy { framework, torch, shared: Default::default() }
    }

    /// A tensor: a numpy array, or a torch tensor (`requires_grad` kept).
    pub(crate) fn tensor(&self, py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
        match (&self.framework, &self.torch) {
            (Framework::Torch, Some(convert)) => convert.call1(arrays::torch_parts(py, t)?),
            _ => arrays::array(py, t, false),
        }
    }

    /// `ckpt._values.<name>(pt, *args)`: what a value only torch or an unknown class can be becomes.
    fn helper<A>(&self, py: Python<'py>, name: &str, args: A) -> PyResult<Bound<'py, PyAny>>
    where
        A: IntoPyObject<'py, Target = PyTuple, Output = Bound<'py, PyTuple>, Error = PyErr>,
    {
        let pt = self.framework == Framework::Torch;
        let args = args.into_pyobject(py)?;
        let mut all = vec![PyBool::new(py, pt).to_owned().into_any()];
        all.extend(args.try_iter()?.collect::<PyResult<Vec<_>>>()?);
        classes(py)?.values.bind(py).getattr(name)?.call1(PyTuple::new(py, all)?)
    }

    /// `v` as a Python object.
    pub(crate) fn value(&self, py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
        Ok(match v {
            Value::None => py.None().into_bound(py),
            Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
            Value::Int(i) => i.into_bound_py_any(py)?,
            Value::BigInt(le) => {
                let int = py.get_type::<PyInt>();
                int.call_method("from_bytes", (PyBytes::new(py, le), "little"), Some(&signed(py)?))?
            }
            Value::Float(f) => PyFloat::new(py, *f).into_any(),
            Value::Complex(re, im) => PyComplex::from_doubles(py, *re, *im).into_any(),
            Value::Str(s) => PyString::new(py, s).into_any(),
            Value::Bytes(b) => PyBytes::new(py, b).into_any(),
            Value::ByteArray(b) => PyByteArray::new(py, b).into_any(),
            Value::List(items) => PyList::new(py, self.all(py, items)?)?.into_any(),
            Value::Tuple(items) => PyTuple::new(py, self.all(py, items)?)?.into_any(),
            Value::Set(items) => PySet::new(py, self.all(py, items)?)?.into_any(),
            Value::FrozenSet(items) => PyFrozenSet::new(py, self.all(py, items)?)?.into_any(),
            Value::Dict(d) => self.dict(py, d)?,
            Value::Tensor(t) => self.tensor(py, t)?,
            Value::Parameter { tensor, state } => {
                let t = self.tensor(py, tensor)?;
                let state = state.as_deref().map(|s| self.value(py, s)).transpose()?;
                self.helper(py, "parameter", (t, tensor.requires_grad(), state))?
            }
            Value::TensorWithState { tensor, class, state } => {
                let t = self.value(py, tensor)?;
                self.helper(py, "tensor_with_state", (t, self.value(py, class)?, self.value(py, state)?))?
            }
            Value::OpaqueTensor { kind, object } => {
                let object = self.object(py, object)?;
                self.helper(py, "opaque_tensor", (format!("{kind:?}").to_lowercase(), object))?
            }
            Value::Composite(c) => {
                let components =
                    c.named_components().map(|(n, t)| Ok((n, self.tensor(py, t)?))).collect::<PyResult<Vec<_>>>()?;
                let args = (c.layout.name(), c.dtype.torch_name(), c.shape.clone(), components, c.axis, c.coalesced);
                let (layout, dtype, shape, components, axis, coalesced) = args;
                self.helper(py, "composite", (layout, dtype, shape, components, axis, coalesced, c.requires_grad))?
            }
            Value::Storage { dtype, data } => {
                let t = Tensor::from_buffer(*dtype, &[data.len() / dtype.size().max(1)], data.clone())
                    .map_err(|e| usage(e.to_string(), None))?;
                self.helper(py, "storage", (self.tensor(py, &t)?, dtype.torch_name()))?
            }
            Value::Size(dims) => self.helper(py, "size", (dims.clone(),))?,
            Value::DType(d) => self.helper(py, "dtype", (d.torch_name(),))?,
            Value::Device { kind, index } => self.helper(py, "device", (kind.as_str(), *index))?,
            Value::Global { module, name } => self.helper(py, "global_", (module.as_str(), name.as_str()))?,
            Value::Object(o) => self.object(py, o)?,
            Value::Numpy(n) => self.numpy(py, n)?,
            Value::Shared { id, value } => self.shared(py, *id, value)?,
            Value::Ref(id) => match self.shared.borrow().get(id) {
                Some(obj) => obj.clone(),
                // A reference to an object still being made that is not a list or dict (cycles through
                // sets, tuples or objects): named, as the pickle decoder names it.
                None => self.helper(py, "ref", (*id,))?,
            },
            // A kind of value this build of the package does not know yet: its debug form, named.
            other => self.helper(py, "unknown", (other.type_name(), format!("{other:?}")))?,
        })
    }

    /// The object of [`Value::Shared`] `id`: a list or dict is made empty and remembered before its items,
    /// so that references inside it (a cycle) are the object itself; anything else is remembered once made.
    fn shared(&self, py: Python<'py>, id: u32, value: &Value) -> PyResult<Bound<'py, PyAny>> {
        let remember = |obj: &Bound<'py, PyAny>| {
            self.shared.borrow_mut().insert(id, obj.clone());
        };
        match value {
            Value::List(items) => {
                let out = PyList::empty(py).into_any();
                remember(&out);
                for v in items {
                    out.call_method1("append", (self.value(py, v)?,))?;
                }
                Ok(out)
            }
            Value::Dict(d) => {
                let out = self.empty_dict(py, d.kind)?;
                remember(&out);
                self.fill_dict(py, &out, d)?;
                Ok(out)
            }
            other => {
                let out = self.value(py, other)?;
                remember(&out);
                Ok(out)
            }
        }
    }

    fn all(&self, py: Python<'py>, items: &[Value]) -> PyResult<Vec<Bound<'py, PyAny>>> {
        items.iter().map(|v| self.value(py, v)).collect()
    }

    fn dict(&self, py: Python<'py>, d: &Dict) -> PyResult<Bound<'py, PyAny>> {
        let out = self.empty_dict(py, d.kind)?;
        self.fill_dict(py, &out, d)?;
        Ok(out)
    }

    fn empty_dict(&self, py: Python<'py>, kind: DictKind) -> PyResult<Bound<'py, PyAny>> {
        Ok(match kind {
            DictKind::OrderedDict => classes(py)?.ordered_dict.bind(py).call0()?,
            DictKind::Counter => classes(py)?.counter.bind(py).call0()?,
            _ => PyDict::new(py).into_any(),
        })
    }

    fn fill_dict(&self, py: Python<'py>, out: &Bound<'py, PyAny>, d: &Dict) -> PyResult<()> {
        for (k, v) in &d.items {
            out.set_item(self.value(py, k)?, self.value(py, v)?)?;
        }
        if let Some(attrs) = d.attrs.as_deref() {
            // The attributes `__setstate__` set on the mapping (an OrderedDict state dict's `_metadata`).
            if let Some(attrs) = attrs.as_dict() {
                for (k, v) in &attrs.items {
                    if let Some(name) = k.as_str() {
                        let _ = out.setattr(name, self.value(py, v)?);
                    }
                }
            }
        }
        Ok(())
    }

    fn object(&self, py: Python<'py>, o: &Object) -> PyResult<Bound<'py, PyAny>> {
        let state = o.state.as_ref().map(|s| self.value(py, s)).transpose()?;
        let dict_items: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> =
            o.dict_items.iter().map(|(k, v)| Ok((self.value(py, k)?, self.value(py, v)?))).collect::<PyResult<_>>()?;
        self.helper(
            py,
            "object_",
            (
                self.value(py, &o.callable)?,
                self.value(py, &o.args)?,
                o.newobj,
                state,
                self.all(py, &o.list_items)?,
                dict_items,
            ),
        )
    }

    fn numpy(&self, py: Python<'py>, n: &Numpy) -> PyResult<Bound<'py, PyAny>> {
        match n.value.as_tensor() {
            // numpy arrays stay numpy arrays, whatever the framework (torch.load gives them so too).
            Some(t) => arrays::array(py, t, false),
            None => {
                let dtype = arrays::numpy_dtype(py, n.dtype)?;
                dtype.getattr("type")?.call1((self.value(py, &n.value)?,))
            }
        }
    }
}

/// `{"signed": True}` for `int.from_bytes`.
fn signed(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("signed", true)?;
    Ok(d)
}

/// A numpy array or torch tensor handed to `ckpt.save`, kept alive while ckpt reads its bytes (the writers
/// run with the GIL released; the object is only referenced, never touched, then).
struct PyBytesOwner {
    _owner: Py<PyAny>,
    ptr: usize,
    len: usize,
}

impl AsRef<[u8]> for PyBytesOwner {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr + len` is the C-contiguous data of the numpy array `_owner` (made by
        // `ckpt._values.tensor_parts`, which returns a contiguous uint8 array and its address); holding the
        // reference keeps that memory alive and in place (a numpy array's data never moves while referenced).
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

/// The deepest nesting `ckpt.save` walks (the pickle decoder's default depth limit).
const MAX_DEPTH: usize = 1000;

/// Python objects as a `Value` tree, for `ckpt.save`.
pub(crate) struct FromPy<'py> {
    parts: Bound<'py, PyAny>,
    /// The containers being walked (their addresses): one met again inside itself is a cycle.
    open: std::cell::RefCell<Vec<usize>>,
}

impl<'py> FromPy<'py> {
    pub(crate) fn new(py: Python<'py>) -> PyResult<Self> {
        Ok(FromPy { parts: classes(py)?.values.bind(py).getattr("parts")?, open: Default::default() })
    }

    /// `obj` as a value; a container that contains itself, or nesting deeper than [`MAX_DEPTH`], is a
    /// usage error (the walk would not end, or would exhaust the stack).
    pub(crate) fn value(&self, obj: &Bound<'py, PyAny>) -> PyResult<Value> {
        let id = obj.as_ptr() as usize;
        {
            let mut open = self.open.borrow_mut();
            if open.contains(&id) {
                return Err(usage(
                    format!(
                        "ckpt.save: a {} contains itself; save a state dict without cycles",
                        obj.get_type().name()?
                    ),
                    None,
                ));
            }
            if open.len() >= MAX_DEPTH {
                return Err(usage(format!("ckpt.save: values nested deeper than {MAX_DEPTH} levels"), None));
            }
            open.push(id);
        }
        let out = self.walk(obj);
        self.open.borrow_mut().pop();
        out
    }

    fn walk(&self, obj: &Bound<'py, PyAny>) -> PyResult<Value> {
        let py = obj.py();
        if obj.is_none() {
            return Ok(Value::None);
        }
        if let Ok(b) = obj.cast::<PyBool>() {
            return Ok(Value::Bool(b.is_true()));
        }
        if obj.is_exact_instance_of::<PyInt>() {
            return Ok(match obj.extract::<i64>() {
                Ok(i) => Value::Int(i),
                Err(_) => {
                    let nbytes = (obj.call_method0("bit_length")?.extract::<usize>()? + 8) / 8;
                    let kwargs = signed(py)?;
                    let le: Vec<u8> = obj.call_method("to_bytes", (nbytes, "little"), Some(&kwargs))?.extract()?;
                    Value::BigInt(minimal(le))
                }
            });
        }
        if obj.is_exact_instance_of::<PyFloat>() {
            return Ok(Value::Float(obj.extract()?));
        }
        if let Ok(c) = obj.cast::<PyComplex>() {
            if obj.is_exact_instance_of::<PyComplex>() {
                return Ok(Value::Complex(c.real(), c.imag()));
            }
        }
        if let Ok(s) = obj.cast_exact::<PyString>() {
            return Ok(Value::Str(s.extract()?));
        }
        if let Ok(b) = obj.cast_exact::<PyBytes>() {
            return Ok(Value::Bytes(b.as_bytes().to_vec()));
        }
        if let Ok(b) = obj.cast_exact::<PyByteArray>() {
            return Ok(Value::ByteArray(b.to_vec()));
        }
        if let Ok(l) = obj.cast_exact::<PyList>() {
            return Ok(Value::List(l.iter().map(|x| self.value(&x)).collect::<PyResult<_>>()?));
        }
        if let Ok(t) = obj.cast_exact::<PyTuple>() {
            return Ok(Value::Tuple(t.iter().map(|x| self.value(&x)).collect::<PyResult<_>>()?));
        }
        if let Ok(s) = obj.cast_exact::<PySet>() {
            return Ok(Value::Set(s.iter().map(|x| self.value(&x)).collect::<PyResult<_>>()?));
        }
        if let Ok(s) = obj.cast_exact::<PyFrozenSet>() {
            return Ok(Value::FrozenSet(s.iter().map(|x| self.value(&x)).collect::<PyResult<_>>()?));
        }
        if let Ok(d) = obj.cast::<PyDict>() {
            let c = classes(py)?;
            let kind = if obj.is_instance(c.counter.bind(py))? {
                DictKind::Counter
            } else if obj.is_instance(c.ordered_dict.bind(py))? {
                DictKind::OrderedDict
            } else {
                DictKind::Dict
            };
            let mut out = Dict::new(kind);
            for (k, v) in d.iter() {
                out.items.push((self.value(&k)?, self.value(&v)?));
            }
            return Ok(Value::Dict(out));
        }
        // Everything else (arrays, tensors, numpy scalars, torch's and ckpt's value classes, namedtuples):
        // `ckpt._values.parts` says what it is.
        let parts = self.parts.call1((obj,))?;
        let kind: String = parts.get_item(0)?.extract()?;
        let args = parts.get_item(1)?;
        match kind.as_str() {
            "tensor" | "parameter" => {
                let (data, ptr, len, dtype, shape, requires_grad): (Py<PyAny>, usize, usize, String, Vec<usize>, bool) =
                    args.extract()?;
                let dtype =
                    DType::from_torch_name(&dtype).ok_or_else(|| usage(format!("unknown dtype {dtype}"), None))?;
                let buf = Buffer::from_owner(PyBytesOwner { _owner: data, ptr, len });
                let t = Tensor::from_buffer(dtype, &shape, buf)
                    .map_err(|e| usage(e.to_string(), None))?
                    .with_requires_grad(requires_grad);
                Ok(if kind == "parameter" { Value::Parameter { tensor: t, state: None } } else { Value::Tensor(t) })
            }
            "numpy_scalar" => {
                let (value, dtype, module): (Bound<'py, PyAny>, String, String) = args.extract()?;
                let dtype =
                    DType::from_torch_name(&dtype).ok_or_else(|| usage(format!("unknown dtype {dtype}"), None))?;
                Ok(Value::Numpy(Box::new(Numpy { value: self.value(&value)?, dtype, module })))
            }
            "size" => Ok(Value::Size(args.extract()?)),
            "dtype" => {
                let name: String = args.extract()?;
                DType::from_torch_name(&name)
                    .map(Value::DType)
                    .ok_or_else(|| usage(format!("unknown dtype {name}"), None))
            }
            "device" => {
                let (kind, index): (String, Option<i64>) = args.extract()?;
                Ok(Value::Device { kind, index })
            }
            "global" => {
                let (module, name): (String, String) = args.extract()?;
                Ok(Value::Global { module, name })
            }
            "object" => {
                let (callable, a, newobj, state, list_items, dict_items): ObjectParts<'py> = args.extract()?;
                Ok(Value::Object(Box::new(Object {
                    callable: self.value(&callable)?,
                    args: self.value(&a)?,
                    newobj,
                    state: state.map(|s| self.value(&s)).transpose()?,
                    list_items: list_items.iter().map(|x| self.value(x)).collect::<PyResult<_>>()?,
                    dict_items: dict_items
                        .iter()
                        .map(|(k, v)| Ok((self.value(k)?, self.value(v)?)))
                        .collect::<PyResult<_>>()?,
                })))
            }
            // A tuple subclass (namedtuple, torch.return_types): a tuple.
            "tuple" => Ok(Value::Tuple(args.try_iter()?.map(|x| self.value(&x?)).collect::<PyResult<_>>()?)),
            "list" => Ok(Value::List(args.try_iter()?.map(|x| self.value(&x?)).collect::<PyResult<_>>()?)),
            "str" => Ok(Value::Str(args.extract()?)),
            "int" => self.value(&args),
            "float" => Ok(Value::Float(args.extract()?)),
            _ => Err(usage(
                format!("ckpt.save cannot save a {}: save tensors, arrays and Python values", obj.get_type().name()?),
                None,
            )),
        }
    }
}

/// `ckpt._values.parts` of an object: callable, args, whether made by `__new__`, state, list items, dict items.
type ObjectParts<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    bool,
    Option<Bound<'py, PyAny>>,
    Vec<Bound<'py, PyAny>>,
    Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
);

/// Two's complement little-endian bytes without redundant sign bytes (ckpt's `BigInt` form).
fn minimal(mut le: Vec<u8>) -> Vec<u8> {
    while le.len() > 1 {
        let (last, prev) = (le[le.len() - 1], le[le.len() - 2]);
        if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
            le.pop();
        } else {
            break;
        }
    }
    le
}
