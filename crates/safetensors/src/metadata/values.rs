//! The typed JSON encoding of values in `ckpt.values`: every [`Value`] kind, losslessly, with the tensors a
//! value holds stored as tensors of the same file and referred to by name.
//!
//! # Grammar
//!
//! A value is encoded as one JSON value:
//!
//! | JSON | value |
//! |---|---|
//! | `null`, `true`, `false` | `None`, `bool` |
//! | an integer literal (`3`, `-7`) | `int` within i64 |
//! | a number with a fraction or an exponent (`3.0`, `1e-300`, `-0.0`) | a finite `float` (the shortest text that reads back to the same bits) |
//! | a string | `str` |
//! | an array | `list` of the encoded items |
//! | an object with exactly one *tag* key (below), and that tag's *fields* | every other kind |
//!
//! | tag | payload | fields | value |
//! |---|---|---|---|
//! | `int` | decimal string | | `int` beyond i64 |
//! | `float` | `"nan"`, `"inf"`, `"-inf"`, or `"0x"` + 16 hex digits of the IEEE bits (a NaN with another sign or payload) | | non-finite `float` |
//! | `complex` | `[re, im]`, each a float encoding | | `complex` |
//! | `bytes`, `bytearray` | lowercase hex, or `{"tensor": name}` (a 1-D `U8` tensor of the file, for more than 4096 bytes) | | `bytes`, `bytearray` |
//! | `tuple`, `set`, `frozenset` | array of items | | `tuple`, `set`, `frozenset` (items in stored order) |
//! | `dict`, `odict`, `counter` | an object (string keys, in order) or an array of `[key, value]` pairs (any keys) | `attrs`: the mapping's `__dict__` | `dict`, `collections.OrderedDict`, `collections.Counter` |
//! | `torch.Size` | array of ints | | `torch.Size` |
//! | `torch.dtype` | torch's name (`"bfloat16"`) | | `torch.dtype` |
//! | `torch.device` | torch's text (`"cpu"`, `"cuda:1"`) | | `torch.device` |
//! | `tensor` | the name of a tensor of the file | `dtype`, `shape` (when stored as another dtype, below), `requires_grad` (when true) | a dense tensor |
//! | `parameter` | a `tensor` encoding | `state` (the `__dict__`, when set) | `torch.nn.Parameter` |
//! | `tensor_with_state` | the tensor's encoding | `class`, `state` | a tensor rebuilt by `_rebuild_from_type_v2` |
//! | `opaque_tensor` | `"sparse"`, `"quantized"`, `"nested"`, `"meta"` or `"other"` | `rebuild`: an `object` encoding | a sparse, quantized, ... tensor |
//! | `composite` | the layout (`per_tensor_affine`, `per_channel_affine`, `sparse_coo`, `sparse_csr`, `sparse_csc`, `sparse_bsr`, `sparse_bsc`, `nested`) | `dtype`, `shape`, `components` (an object from each component's name to its `tensor` encoding), `axis` (per-channel), `coalesced` (COO), `requires_grad` (when true) | a quantized, sparse or nested tensor: a quantized tensor's int representation stored under the entry's own name, every other component under `<entry>.<component>` (`w.scale`, `w.zero_point`, `m.crow_indices`) |
//! | `storage` | `{"tensor": name}` (its bytes, a 1-D `U8` tensor of the file) | `dtype` | a bare storage |
//! | `global` | `[module, qualified name]` | | a class or function |
//! | `numpy` | the value: a scalar's encoding, or a `tensor` encoding for an array | `dtype` (the numpy dtype by torch's name of it), `module` (`numpy._core.multiarray` or `numpy.core.multiarray`) | a numpy scalar or array |
//! | `object` | the callable's encoding | `args`, `newobj` (when created by `cls.__new__`), `state`, `list_items`, `dict_items` (when present) | any other object, as pickle rebuilds it |
//! | `shared` | the object's encoding | `id`: its number | an object other places refer to (`Value::Shared`) |
//! | `ref` | the number of a `shared` object | | a reference to it (`Value::Ref`) |
//!
//! A tensor whose dtype safetensors lacks is stored as the bytes of its contiguous values under a dtype it
//! has, and its encoding gives the real `dtype` and `shape`: `complex32` and `complex128` as `F16` / `F64` with
//! a last dimension of 2 (torch's `view_as_real`), `bits16` as `U16`, `qint32` as `I32`, every other one-byte
//! dtype (`float4_e2m1fn_x2`, `bits8`, ...) as `U8`.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value as Json};

use ckpt_tensor::DType;
use ckpt_tensor::Result;
use ckpt_tensor::Tensor;
use ckpt_tensor::value::bigint_decimal;
use ckpt_tensor::{Dict, DictKind, Object, OpaqueTensorKind, Value};

use crate::SafetensorsError;

/// Bytes values longer than this are stored as a tensor of the file instead of hex.
pub const BYTES_INLINE_MAX: usize = 4096;

/// The tag keys of the encoding.
const TAGS: &[&str] = &[
    "int",
    "float",
    "complex",
    "bytes",
    "bytearray",
    "tuple",
    "set",
    "frozenset",
    "dict",
    "odict",
    "counter",
    "torch.Size",
    "torch.dtype",
    "torch.device",
    "tensor",
    "parameter",
    "tensor_with_state",
    "opaque_tensor",
    "composite",
    "storage",
    "global",
    "object",
    "numpy",
    "shared",
    "ref",
];

/// Encodes values, collecting the tensors they hold under names no other entry of the file uses.
#[derive(Debug, Default)]
pub(crate) struct Encoder {
    /// Names of the file already used: every entry's, and every stored tensor's.
    pub taken: HashSet<String>,
    /// Tensors the encodings refer to, to write into the file.
    pub stored: Vec<(String, Tensor)>,
}

impl Encoder {
    /// A fresh name derived from `hint` (`hint`, else `hint~1`, `hint~2`, ...).
    fn fresh(&mut self, hint: &str) -> String {
        let mut name = hint.to_owned();
        let mut k = 0usize;
        while self.taken.contains(&name) {
            k += 1;
            name = format!("{hint}~{k}");
        }
        self.taken.insert(name.clone());
        name
    }

    /// Stores `t` under `name` (already reserved) or a fresh name derived from `hint`; returns its encoding.
    fn store_tensor(&mut self, t: &Tensor, name: Option<&str>, hint: &str) -> Result<Json> {
        let contiguous = t.to_contiguous()?;
        let (stored, logical) = carrier(&contiguous)?;
        let name = match name {
            Some(n) => n.to_owned(),
            None => self.fresh(hint),
        };
        self.stored.push((name.clone(), stored));
        let mut o = Map::new();
        o.insert("tensor".into(), Json::String(name));
        if let Some(dtype) = logical {
            o.insert("dtype".into(), Json::String(dtype.torch_name().to_owned()));
            o.insert("shape".into(), Json::from(t.shape().to_vec()));
        }
        if t.requires_grad() {
            o.insert("requires_grad".into(), Json::Bool(true));
        }
        Ok(Json::Object(o))
    }

    /// Stores raw bytes as a 1-D `U8` tensor; returns `{"tensor": name}`.
    fn store_bytes(&mut self, bytes: &ckpt_tensor::Buffer, hint: &str) -> Result<Json> {
        let t = Tensor::from_buffer(DType::U8, &[bytes.len()], bytes.clone())?;
        let name = self.fresh(hint);
        self.stored.push((name.clone(), t));
        Ok(tagged("tensor", Json::String(name)))
    }

    /// The encoding of entry `name`'s value: a tensor at its top is stored under `name` itself (reserved by
    /// the caller), tensors inside it under `name.<position>`.
    pub fn entry(&mut self, name: &str, value: &Value) -> Result<Json> {
        self.encode(value, name, Some(name))
    }

    fn encode(&mut self, v: &Value, at: &str, own: Option<&str>) -> Result<Json> {
        let child = |i: &dyn std::fmt::Display| format!("{at}.{i}");
        Ok(match v {
            Value::None => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Int(i) => Json::from(*i),
            Value::BigInt(b) => tagged("int", Json::String(bigint_decimal(b))),
            Value::Float(f) => float(*f),
            Value::Complex(re, im) => tagged("complex", Json::Array(vec![float(*re), float(*im)])),
            Value::Str(s) => Json::String(s.clone()),
            Value::Bytes(b) | Value::ByteArray(b) => {
                let tag = if matches!(v, Value::Bytes(_)) { "bytes" } else { "bytearray" };
                if b.len() > BYTES_INLINE_MAX {
                    let payload = self.store_bytes(&ckpt_tensor::Buffer::copy_from(b)?, &child(&tag))?;
                    tagged(tag, payload)
                } else {
                    tagged(tag, Json::String(hex(b)))
                }
            }
            Value::List(items) => Json::Array(self.items(items, at)?),
            Value::Tuple(items) => tagged("tuple", Json::Array(self.items(items, at)?)),
            Value::Set(items) => tagged("set", Json::Array(self.items(items, at)?)),
            Value::FrozenSet(items) => tagged("frozenset", Json::Array(self.items(items, at)?)),
            Value::Dict(d) => {
                let mut o = Map::new();
                o.insert(dict_tag(d.kind).into(), self.dict_items(&d.items, at)?);
                if let Some(attrs) = &d.attrs {
                    o.insert("attrs".into(), self.encode(attrs, &child(&"attrs"), None)?);
                }
                Json::Object(o)
            }
            Value::Tensor(t) => self.store_tensor(t, own, at)?,
            Value::Parameter { tensor, state } => {
                let mut o = Map::new();
                o.insert("parameter".into(), self.store_tensor(tensor, own, at)?);
                if let Some(s) = state {
                    o.insert("state".into(), self.encode(s, &child(&"state"), None)?);
                }
                Json::Object(o)
            }
            Value::TensorWithState { tensor, class, state } => {
                let mut o = Map::new();
                o.insert("tensor_with_state".into(), self.encode(tensor, at, own)?);
                o.insert("class".into(), self.encode(class, &child(&"class"), None)?);
                o.insert("state".into(), self.encode(state, &child(&"state"), None)?);
                Json::Object(o)
            }
            Value::OpaqueTensor { kind, object } => {
                let kind = match kind {
                    OpaqueTensorKind::Sparse => "sparse",
                    OpaqueTensorKind::Quantized => "quantized",
                    OpaqueTensorKind::Nested => "nested",
                    OpaqueTensorKind::Meta => "meta",
                    _ => "other",
                };
                let mut o = Map::new();
                o.insert("opaque_tensor".into(), Json::String(kind.into()));
                o.insert("rebuild".into(), self.object(object, at)?);
                Json::Object(o)
            }
            Value::Composite(c) => {
                let mut components = Map::new();
                for (i, (component, t)) in c.named_components().enumerate() {
                    // A quantized tensor's int representation is the entry itself; the rest are `<entry>.<name>`.
                    let json = if i == 0 && c.layout.is_quantized() {
                        self.store_tensor(t, own, at)?
                    } else {
                        self.store_tensor(t, None, &child(&component))?
                    };
                    components.insert(component.into(), json);
                }
                let mut o = Map::new();
                o.insert("composite".into(), Json::String(c.layout.name().into()));
                o.insert("dtype".into(), Json::String(c.dtype.torch_name().into()));
                o.insert("shape".into(), Json::from(c.shape.clone()));
                o.insert("components".into(), Json::Object(components));
                if let Some(axis) = c.axis {
                    o.insert("axis".into(), Json::from(axis));
                }
                if let Some(coalesced) = c.coalesced {
                    o.insert("coalesced".into(), Json::Bool(coalesced));
                }
                if c.requires_grad {
                    o.insert("requires_grad".into(), Json::Bool(true));
                }
                Json::Object(o)
            }
            Value::Storage { dtype, data } => {
                let mut o = Map::new();
                o.insert("storage".into(), self.store_bytes(data, &child(&"storage"))?);
                o.insert("dtype".into(), Json::String(dtype.torch_name().into()));
                Json::Object(o)
            }
            Value::Size(dims) => tagged("torch.Size", Json::from(dims.clone())),
            Value::DType(d) => tagged("torch.dtype", Json::String(d.torch_name().into())),
            Value::Device { kind, index } => {
                let text = match index {
                    Some(i) => format!("{kind}:{i}"),
                    None => kind.clone(),
                };
                tagged("torch.device", Json::String(text))
            }
            Value::Global { module, name } => {
                tagged("global", Json::Array(vec![Json::String(module.clone()), Json::String(name.clone())]))
            }
            Value::Object(o) => self.object(o, at)?,
            Value::Numpy(n) => {
                let mut o = serde_json::Map::new();
                o.insert("numpy".into(), self.encode(&n.value, at, own)?);
                o.insert("dtype".into(), Json::String(n.dtype.torch_name().into()));
                o.insert("module".into(), Json::String(n.module.clone()));
                Json::Object(o)
            }
            Value::Shared { id, value } => {
                let mut o = serde_json::Map::new();
                o.insert("shared".into(), self.encode(value, at, own)?);
                o.insert("id".into(), Json::from(*id));
                Json::Object(o)
            }
            Value::Ref(id) => tagged("ref", Json::from(*id)),
            // `Value` is non-exhaustive: a kind added to the model after this encoding is refused, not dropped.
            other => {
                return Err(SafetensorsError::UnrecordableValue {
                    at: at.to_owned(),
                    value: ckpt_tensor::brief(other),
                }
                .into());
            }
        })
    }

    fn items(&mut self, items: &[Value], at: &str) -> Result<Vec<Json>> {
        items.iter().enumerate().map(|(i, v)| self.encode(v, &format!("{at}.{i}"), None)).collect()
    }

    fn dict_items(&mut self, items: &[(Value, Value)], at: &str) -> Result<Json> {
        self.dict_items_in(items, at, false)
    }

    /// The items of a mapping at `at`; in a module's state (`module`), the values of `_parameters`,
    /// `_buffers` and `_modules` are named at `at` itself.
    fn dict_items_in(&mut self, items: &[(Value, Value)], at: &str, module: bool) -> Result<Json> {
        let child = |k: &str| {
            if module && matches!(k, "_parameters" | "_buffers" | "_modules") {
                at.to_owned()
            } else {
                format!("{at}.{k}")
            }
        };
        let mut keys = HashSet::new();
        let by_name = items.iter().all(|(k, _)| k.as_str().is_some_and(|s| keys.insert(s)));
        if by_name {
            let mut o = Map::new();
            for (k, v) in items {
                let k = k.as_str().unwrap_or_default();
                o.insert(k.to_owned(), self.encode(v, &child(k), None)?);
            }
            return Ok(Json::Object(o));
        }
        let mut pairs = Vec::with_capacity(items.len());
        for (i, (k, v)) in items.iter().enumerate() {
            let name = ckpt_tensor::flatten::python_str(k).unwrap_or_else(|_| i.to_string());
            let k = self.encode(k, &format!("{at}.{i}.key"), None)?;
            let v = self.encode(v, &child(&name), None)?;
            pairs.push(Json::Array(vec![k, v]));
        }
        Ok(Json::Array(pairs))
    }

    /// An object's encoding. Tensors inside it are named where [`ckpt_tensor::flatten::entry_names`] names them (its
    /// arguments and items by position, its attributes and keys by name, a module's parameters and buffers
    /// as `state_dict()` does), so that the file stores them under the names the source lists.
    fn object(&mut self, o: &Object, at: &str) -> Result<Json> {
        let mut m = Map::new();
        m.insert("object".into(), self.encode(&o.callable, &format!("{at}.callable"), None)?);
        m.insert("args".into(), self.encode(&o.args, at, None)?);
        if o.newobj {
            m.insert("newobj".into(), Json::Bool(true));
        }
        if let Some(s) = &o.state {
            m.insert("state".into(), self.state(s, at)?);
        }
        if !o.list_items.is_empty() {
            m.insert("list_items".into(), Json::Array(self.items(&o.list_items, at)?));
        }
        if !o.dict_items.is_empty() {
            m.insert("dict_items".into(), self.dict_items_pairs(&o.dict_items, at)?);
        }
        Ok(Json::Object(m))
    }

    /// An object's state: attributes named under the object's own name (a module's `_parameters`,
    /// `_buffers` and `_modules` passed through, as [`ckpt_tensor::flatten::object_parts`] names them).
    fn state(&mut self, state: &Value, at: &str) -> Result<Json> {
        Ok(match state {
            Value::Shared { id, value } => {
                let mut o = Map::new();
                o.insert("shared".into(), self.state(value, at)?);
                o.insert("id".into(), Json::from(*id));
                Json::Object(o)
            }
            Value::Dict(d) => {
                let module = ["_parameters", "_buffers", "_modules"].iter().all(|f| {
                    matches!(d.get(f), Some(Value::Dict(_)))
                        || matches!(d.get(f), Some(Value::Shared { value, .. }) if matches!(**value, Value::Dict(_)))
                });
                let mut o = Map::new();
                o.insert(dict_tag(d.kind).into(), self.dict_items_in(&d.items, at, module)?);
                if let Some(attrs) = &d.attrs {
                    o.insert("attrs".into(), self.encode(attrs, &format!("{at}.attrs"), None)?);
                }
                Json::Object(o)
            }
            Value::Tuple(parts) if parts.len() == 2 => {
                tagged("tuple", Json::Array(parts.iter().map(|p| self.state(p, at)).collect::<Result<_>>()?))
            }
            other => self.encode(other, at, None)?,
        })
    }

    fn dict_items_pairs(&mut self, items: &[(Value, Value)], at: &str) -> Result<Json> {
        let mut pairs = Vec::with_capacity(items.len());
        for (i, (k, v)) in items.iter().enumerate() {
            let name = ckpt_tensor::flatten::python_str(k).unwrap_or_else(|_| i.to_string());
            let k = self.encode(k, &format!("{at}.{i}.key"), None)?;
            let v = self.encode(v, &format!("{at}.{name}"), None)?;
            pairs.push(Json::Array(vec![k, v]));
        }
        Ok(Json::Array(pairs))
    }
}

/// The tensor safetensors stores for a contiguous `t`, and `t`'s dtype when the stored one is another.
fn carrier(t: &Tensor) -> Result<(Tensor, Option<DType>)> {
    let t = t.clone().with_requires_grad(false);
    if crate::safetensors_dtype(t.dtype()).is_ok() {
        return Ok((t, None));
    }
    let mut shape = t.shape().to_vec();
    let dtype = match t.dtype() {
        DType::C32 => {
            shape.push(2);
            DType::F16
        }
        DType::C128 => {
            shape.push(2);
            DType::F64
        }
        DType::Bits16 => DType::U16,
        DType::QInt32 => DType::I32,
        d if d.size() == 1 => DType::U8,
        d => return Err(SafetensorsError::NoStandInDtype { dtype: d }.into()),
    };
    Ok((Tensor::from_buffer(dtype, &shape, t.storage().clone())?, Some(t.dtype())))
}

fn tagged(tag: &str, payload: Json) -> Json {
    let mut o = Map::new();
    o.insert(tag.to_owned(), payload);
    Json::Object(o)
}

/// A float: a JSON number when finite, else tagged.
fn float(f: f64) -> Json {
    if f.is_finite() {
        if let Some(n) = serde_json::Number::from_f64(f) {
            return Json::Number(n);
        }
    }
    let text = if f.is_nan() && f.to_bits() == f64::NAN.to_bits() {
        "nan".to_owned()
    } else if f == f64::INFINITY {
        "inf".to_owned()
    } else if f == f64::NEG_INFINITY {
        "-inf".to_owned()
    } else {
        format!("0x{:016x}", f.to_bits())
    };
    tagged("float", Json::String(text))
}

/// The tag of a mapping's encoding.
fn dict_tag(kind: DictKind) -> &'static str {
    match kind {
        DictKind::OrderedDict => "odict",
        DictKind::Counter => "counter",
        _ => "dict",
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes().chunks_exact(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

/// Little-endian two's complement bytes of minimal length (a [`Value::BigInt`] payload) of a decimal integer.
pub(crate) fn bigint_from_decimal(text: &str) -> Option<Vec<u8>> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) || digits.len() > 100_000 {
        return None;
    }
    // Magnitude, little-endian base 256.
    let mut mag: Vec<u8> = Vec::new();
    for c in digits.bytes() {
        let mut carry = u32::from(c - b'0');
        for b in &mut mag {
            let v = u32::from(*b) * 10 + carry;
            *b = (v & 0xFF) as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            mag.push((carry & 0xFF) as u8);
            carry >>= 8;
        }
    }
    // One more byte so the sign bit is free, then two's complement.
    mag.push(0);
    if negative {
        let mut carry = 1u16;
        for b in &mut mag {
            let v = u16::from(!*b) + carry;
            *b = (v & 0xFF) as u8;
            carry = v >> 8;
        }
    }
    // Minimal: drop a top byte that only repeats the sign of the byte below it.
    while mag.len() > 1 {
        let (top, below) = (mag[mag.len() - 1], mag[mag.len() - 2]);
        if (top == 0 && below & 0x80 == 0) || (top == 0xFF && below & 0x80 != 0) {
            mag.pop();
        } else {
            break;
        }
    }
    if mag == [0] {
        mag.clear();
    }
    Some(mag)
}

/// Decodes values, resolving tensor names against the file's tensors and noting which it used.
pub(crate) struct Decoder<'a> {
    tensors: &'a HashMap<&'a str, &'a Tensor>,
    /// Names of the file's tensors the decoded values refer to.
    pub used: HashSet<String>,
}

type Decoded = std::result::Result<Value, String>;

impl<'a> Decoder<'a> {
    pub fn new(tensors: &'a HashMap<&'a str, &'a Tensor>) -> Self {
        Decoder { tensors, used: HashSet::new() }
    }

    pub fn decode(&mut self, j: &Json) -> Decoded {
        Ok(match j {
            Json::Null => Value::None,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => {
                if let Some(i) = n.as_i64().filter(|_| !n.is_f64()) {
                    Value::Int(i)
                } else if let Some(u) = n.as_u64().filter(|_| !n.is_f64()) {
                    Value::BigInt(bigint_from_decimal(&u.to_string()).ok_or("bad integer")?)
                } else {
                    Value::Float(n.as_f64().ok_or("bad number")?)
                }
            }
            Json::String(s) => Value::Str(s.clone()),
            Json::Array(items) => Value::List(self.items(items)?),
            Json::Object(o) => self.tagged(o)?,
        })
    }

    fn items(&mut self, items: &[Json]) -> std::result::Result<Vec<Value>, String> {
        items.iter().map(|i| self.decode(i)).collect()
    }

    fn tagged(&mut self, o: &Map<String, Json>) -> Decoded {
        let mut tags = o.keys().filter(|k| TAGS.contains(&k.as_str()));
        let (Some(tag), None) = (tags.next(), tags.next()) else {
            return Err(format!("an object needs exactly one type tag, got keys {:?}", o.keys().collect::<Vec<_>>()));
        };
        let payload = &o[tag];
        let field = |name: &str| o.get(name);
        let text = |j: &Json| j.as_str().map(str::to_owned).ok_or_else(|| format!("{tag}: expected a string"));
        let array = |j: &'_ Json| j.as_array().cloned().ok_or_else(|| format!("{tag}: expected an array"));
        Ok(match tag.as_str() {
            "int" => Value::BigInt(bigint_from_decimal(&text(payload)?).ok_or("int: bad decimal")?),
            "float" => Value::Float(float_text(&text(payload)?)?),
            "complex" => match array(payload)?.as_slice() {
                [re, im] => Value::Complex(float_from(re)?, float_from(im)?),
                _ => return Err("complex: expected [re, im]".into()),
            },
            "bytes" | "bytearray" => {
                let bytes = match payload {
                    Json::String(h) => unhex(h).ok_or("bytes: bad hex")?,
                    other => self.tensor_bytes(other)?.to_vec(),
                };
                if tag == "bytes" { Value::Bytes(bytes) } else { Value::ByteArray(bytes) }
            }
            "tuple" => Value::Tuple(self.items(&array(payload)?)?),
            "set" => Value::Set(self.items(&array(payload)?)?),
            "frozenset" => Value::FrozenSet(self.items(&array(payload)?)?),
            "dict" | "odict" | "counter" => {
                let kind = match tag.as_str() {
                    "dict" => DictKind::Dict,
                    "odict" => DictKind::OrderedDict,
                    _ => DictKind::Counter,
                };
                let items = self.pairs(payload)?;
                let attrs = field("attrs").map(|a| self.decode(a)).transpose()?.map(Box::new);
                Value::Dict(Dict { kind, items, attrs })
            }
            "torch.Size" => Value::Size(
                array(payload)?
                    .iter()
                    .map(|d| d.as_i64().ok_or("torch.Size: expected ints"))
                    .collect::<Result<_, _>>()?,
            ),
            "torch.dtype" => Value::DType(dtype_from(payload)?),
            "torch.device" => {
                let t = text(payload)?;
                match t.split_once(':') {
                    Some((kind, i)) => Value::Device {
                        kind: kind.to_owned(),
                        index: Some(i.parse().map_err(|_| "torch.device: bad index")?),
                    },
                    None => Value::Device { kind: t, index: None },
                }
            }
            "tensor" => Value::Tensor(self.tensor(o)?),
            "parameter" => {
                let Json::Object(inner) = payload else { return Err("parameter: expected a tensor".into()) };
                let tensor = self.tensor(inner)?;
                let state = field("state").map(|s| self.decode(s)).transpose()?.map(Box::new);
                Value::Parameter { tensor, state }
            }
            "tensor_with_state" => Value::TensorWithState {
                tensor: Box::new(self.decode(payload)?),
                class: Box::new(self.decode(field("class").ok_or("tensor_with_state: no class")?)?),
                state: Box::new(self.decode(field("state").ok_or("tensor_with_state: no state")?)?),
            },
            "opaque_tensor" => {
                let kind = match text(payload)?.as_str() {
                    "sparse" => OpaqueTensorKind::Sparse,
                    "quantized" => OpaqueTensorKind::Quantized,
                    "nested" => OpaqueTensorKind::Nested,
                    "meta" => OpaqueTensorKind::Meta,
                    _ => OpaqueTensorKind::Other,
                };
                let object = match self.decode(field("rebuild").ok_or("opaque_tensor: no rebuild")?)? {
                    Value::Object(o) => o,
                    _ => return Err("opaque_tensor: rebuild is not an object".into()),
                };
                Value::OpaqueTensor { kind, object }
            }
            "composite" => {
                let layout = text(payload)?;
                let layout =
                    ckpt_tensor::Layout::from_name(&layout).ok_or_else(|| format!("unknown layout {layout:?}"))?;
                let dtype = dtype_from(field("dtype").ok_or("composite: no dtype")?)?;
                let shape: Vec<usize> = field("shape")
                    .and_then(Json::as_array)
                    .ok_or("composite: no shape")?
                    .iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()).ok_or("composite: bad shape"))
                    .collect::<Result<_, _>>()?;
                let parts = field("components").and_then(Json::as_object).ok_or("composite: no components")?;
                let mut components = Vec::with_capacity(layout.components().len());
                for name in layout.components() {
                    let part = parts.get(*name).and_then(Json::as_object);
                    components.push(self.tensor(part.ok_or_else(|| format!("composite: no component {name}"))?)?);
                }
                let mut c = ckpt_tensor::Composite::new(layout, dtype, shape, components).map_err(|e| e.to_string())?;
                c.axis = match field("axis") {
                    Some(a) => Some(a.as_u64().and_then(|a| usize::try_from(a).ok()).ok_or("composite: bad axis")?),
                    None => None,
                };
                c.coalesced = field("coalesced").and_then(Json::as_bool);
                c.requires_grad = field("requires_grad").and_then(Json::as_bool) == Some(true);
                Value::Composite(Box::new(c))
            }
            "storage" => Value::Storage {
                dtype: dtype_from(field("dtype").ok_or("storage: no dtype")?)?,
                data: self.tensor_bytes(payload)?,
            },
            "global" => match array(payload)?.as_slice() {
                [Json::String(module), Json::String(name)] => {
                    Value::Global { module: module.clone(), name: name.clone() }
                }
                _ => return Err("global: expected [module, name]".into()),
            },
            "object" => {
                let list_items = match field("list_items") {
                    Some(j) => self.items(&array(j)?)?,
                    None => Vec::new(),
                };
                let dict_items = match field("dict_items") {
                    Some(j) => self.pairs(j)?,
                    None => Vec::new(),
                };
                Value::Object(Box::new(Object {
                    callable: self.decode(payload)?,
                    args: self.decode(field("args").ok_or("object: no args")?)?,
                    newobj: field("newobj").and_then(Json::as_bool).unwrap_or(false),
                    state: field("state").map(|s| self.decode(s)).transpose()?,
                    list_items,
                    dict_items,
                }))
            }
            "numpy" => Value::Numpy(Box::new(ckpt_tensor::Numpy {
                value: self.decode(payload)?,
                dtype: dtype_from(field("dtype").ok_or("numpy: no dtype")?)?,
                module: field("module").and_then(Json::as_str).ok_or("numpy: no module")?.to_owned(),
            })),
            "shared" => Value::Shared {
                id: field("id").and_then(Json::as_u64).and_then(|i| u32::try_from(i).ok()).ok_or("shared: no id")?,
                value: Box::new(self.decode(payload)?),
            },
            "ref" => Value::Ref(payload.as_u64().and_then(|i| u32::try_from(i).ok()).ok_or("ref: expected an id")?),
            other => return Err(format!("unknown tag {other}")),
        })
    }

    fn pairs(&mut self, payload: &Json) -> std::result::Result<Vec<(Value, Value)>, String> {
        match payload {
            Json::Object(items) => items.iter().map(|(k, v)| Ok((Value::Str(k.clone()), self.decode(v)?))).collect(),
            Json::Array(pairs) => pairs
                .iter()
                .map(|p| match p.as_array().map(Vec::as_slice) {
                    Some([k, v]) => Ok((self.decode(k)?, self.decode(v)?)),
                    _ => Err("a mapping item must be [key, value]".to_owned()),
                })
                .collect(),
            _ => Err("a mapping must be an object or an array of pairs".into()),
        }
    }

    fn stored(&mut self, name: &Json) -> std::result::Result<&'a Tensor, String> {
        let name = name.as_str().ok_or("tensor: expected a name")?;
        let t = self.tensors.get(name).copied().ok_or_else(|| format!("no tensor named {name:?} in the file"))?;
        self.used.insert(name.to_owned());
        Ok(t)
    }

    /// A `{"tensor": name, ...}` object.
    fn tensor(&mut self, o: &Map<String, Json>) -> std::result::Result<Tensor, String> {
        let stored = self.stored(o.get("tensor").ok_or("expected a tensor")?)?.clone();
        let mut t = match o.get("dtype") {
            None => stored,
            Some(d) => {
                let dtype = dtype_from(d)?;
                let shape: Vec<usize> = o
                    .get("shape")
                    .and_then(Json::as_array)
                    .ok_or("tensor: a dtype needs a shape")?
                    .iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()).ok_or("tensor: bad shape"))
                    .collect::<Result<_, _>>()?;
                let bytes = stored.to_contiguous().map_err(|e| e.to_string())?;
                Tensor::from_buffer(dtype, &shape, bytes.storage().clone()).map_err(|e| e.to_string())?
            }
        };
        if o.get("requires_grad").and_then(Json::as_bool) == Some(true) {
            t.set_requires_grad(true);
        }
        Ok(t)
    }

    /// The bytes of a `{"tensor": name}` reference.
    fn tensor_bytes(&mut self, j: &Json) -> std::result::Result<ckpt_tensor::Buffer, String> {
        let name = j.get("tensor").ok_or("expected {\"tensor\": name}")?;
        let t = self.stored(name)?.to_contiguous().map_err(|e| e.to_string())?;
        Ok(t.storage().clone())
    }
}

fn float_from(j: &Json) -> std::result::Result<f64, String> {
    match j {
        Json::Number(n) => n.as_f64().ok_or_else(|| "bad float".to_owned()),
        Json::Object(o) => match o.get("float").and_then(Json::as_str) {
            Some(text) => float_text(text),
            None => Err("expected a float".into()),
        },
        _ => Err("expected a float".into()),
    }
}

/// The payload of a `float` tag.
fn float_text(text: &str) -> std::result::Result<f64, String> {
    match text {
        "nan" => Ok(f64::NAN),
        "inf" => Ok(f64::INFINITY),
        "-inf" => Ok(f64::NEG_INFINITY),
        bits => bits
            .strip_prefix("0x")
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(f64::from_bits)
            .ok_or_else(|| format!("float: bad text {bits:?}")),
    }
}

fn dtype_from(j: &Json) -> std::result::Result<DType, String> {
    let name = j.as_str().ok_or("expected a dtype name")?;
    DType::from_torch_name(name).ok_or_else(|| format!("unknown dtype {name:?}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn numpy_values_round_trip_with_dtype_and_module() {
        use ckpt_tensor::Numpy;
        let array = Tensor::from_slice(&[1i16, -2, 3, -4], &[2, 2]).unwrap();
        let values = [
            Numpy { value: Value::Float(0.8125), dtype: DType::F64, module: "numpy._core.multiarray".into() },
            Numpy { value: Value::Complex(1.5, -0.25), dtype: DType::C64, module: "numpy.core.multiarray".into() },
            Numpy {
                value: Value::BigInt(bigint_from_decimal("9223372036854775813").unwrap()),
                dtype: DType::U64,
                module: "numpy._core.multiarray".into(),
            },
            Numpy { value: Value::Tensor(array), dtype: DType::I16, module: "numpy._core.multiarray".into() },
        ];
        for n in values {
            let v = Value::Numpy(Box::new(n));
            let mut enc = Encoder::default();
            enc.taken.insert("x".into());
            let j = enc.entry("x", &v).unwrap();
            assert!(j.get("numpy").is_some(), "{j}");
            let stored: HashMap<&str, &Tensor> = enc.stored.iter().map(|(k, t)| (k.as_str(), t)).collect();
            let back = Decoder::new(&stored).decode(&j).unwrap();
            assert!(back.same(&v), "{back:?} != {v:?}");
            // An array is stored as the entry's own tensor, which other safetensors readers see.
            if v.as_tensor().is_some() {
                assert_eq!(enc.stored.len(), 1);
                assert_eq!(enc.stored[0].0, "x");
            }
        }
    }

    #[test]
    fn bigints_round_trip() {
        for text in [
            "9223372036854775808",
            "-9223372036854775809",
            "18446744073709551617",
            "-1267650600228229401496703205376",
            "255",
            "-256",
            "0",
        ] {
            let b = bigint_from_decimal(text).unwrap();
            assert_eq!(bigint_decimal(&b), text, "{b:?}");
        }
        assert_eq!(bigint_from_decimal("255").unwrap(), [0xFF, 0x00]);
        assert_eq!(bigint_from_decimal("-256").unwrap(), [0x00, 0xFF]);
        assert_eq!(bigint_from_decimal("9223372036854775808").unwrap(), [0, 0, 0, 0, 0, 0, 0, 0x80, 0]);
        assert!(bigint_from_decimal("12a").is_none() && bigint_from_decimal("-").is_none());
    }

    #[test]
    fn floats_keep_their_bits() {
        for f in [
            0.0,
            -0.0,
            1.5,
            1e-300,
            5e-324,
            f64::MAX,
            f64::NAN,
            -f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::from_bits(0x7ff0_0000_0000_0001),
        ] {
            let text = float(f).to_string();
            let back: Json = serde_json::from_str(&text).unwrap();
            assert_eq!(float_from(&back).unwrap().to_bits(), f.to_bits(), "{text}");
        }
        assert_eq!(float(3.0).to_string(), "3.0");
    }
}
