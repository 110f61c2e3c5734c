//! Turning the decoded `data.pkl` into tensors and values: the reader's side of `torch._utils`'s rebuild
//! functions, resolving persistent ids to storages without executing anything.

use ckpt_core::{Buffer, DType, Dict, DictKind, Object, OpaqueTensorKind, Tensor, Value};
use ckpt_pickle::Value as P;

use crate::error::{Error, Result};

/// Resolves a persistent id (a storage reference) to the storage's bytes and dtype.
pub(crate) trait StorageSource {
    /// The storage a persistent id names: its bytes (a window of the file) and the dtype of its class
    /// (`U8` for an untyped storage).
    fn storage(&mut self, pid: &P) -> Result<(Buffer, DType)>;
}

/// `(module, name)` of a global after Python 2 → 3 name mapping (`__builtin__` → `builtins`).
pub(crate) fn global_name(v: &P) -> Option<(String, String)> {
    match v {
        P::Global { module, name } => Some(ckpt_pickle::normalize_global(module, name)),
        _ => None,
    }
}

/// The dtype of a storage class global (`torch FloatStorage`, `torch.cuda.HalfStorage`,
/// `torch.storage UntypedStorage`).
pub(crate) fn storage_class_dtype(module: &str, name: &str) -> Result<DType> {
    let known_module = matches!(module, "torch" | "torch.cuda" | "torch.storage");
    if known_module && matches!(name, "UntypedStorage" | "_UntypedStorage") {
        return Ok(DType::U8);
    }
    if known_module {
        if let Some(d) = DType::from_legacy_storage_name(name) {
            return Ok(d);
        }
    }
    Err(Error::UnknownStorageType { module: module.to_owned(), name: name.to_owned() })
}

/// Converts the decoded pickle into the core value tree.
pub(crate) struct Rebuilder<'s, S: StorageSource> {
    pub(crate) source: &'s mut S,
}

fn bad(function: &str, reason: impl Into<String>) -> Error {
    Error::BadRebuild { function: function.to_owned(), reason: reason.into() }
}

fn arg<'a>(args: &'a [P], i: usize, function: &str) -> Result<&'a P> {
    args.get(i).ok_or_else(|| bad(function, format!("missing argument {i} (got {})", args.len())))
}

fn int_arg(args: &[P], i: usize, function: &str) -> Result<usize> {
    match arg(args, i, function)? {
        P::Int(v) if *v >= 0 => usize::try_from(*v).map_err(|_| bad(function, "integer out of range")),
        other => Err(bad(function, format!("argument {i} must be a non-negative int, got {other:?}"))),
    }
}

fn dims_arg(args: &[P], i: usize, function: &str) -> Result<Vec<usize>> {
    let items = match arg(args, i, function)? {
        P::Tuple(items) | P::List(items) => items,
        other => return Err(bad(function, format!("argument {i} must be a tuple of ints, got {other:?}"))),
    };
    items
        .iter()
        .map(|d| match d {
            P::Int(v) if *v >= 0 => usize::try_from(*v).map_err(|_| bad(function, "dimension out of range")),
            other => Err(bad(function, format!("dimension must be a non-negative int, got {other:?}"))),
        })
        .collect()
}

fn bool_arg(args: &[P], i: usize, function: &str) -> Result<bool> {
    match arg(args, i, function)? {
        P::Bool(b) => Ok(*b),
        P::Int(v) => Ok(*v != 0),
        other => Err(bad(function, format!("argument {i} must be a bool, got {other:?}"))),
    }
}

fn tuple_items(v: &P) -> &[P] {
    match v {
        P::Tuple(items) | P::List(items) => items,
        _ => &[],
    }
}

/// Latin-1 encoding of a str (what `_codecs.encode(s, 'latin1')` does), `None` for characters above U+00FF.
pub(crate) fn latin1(s: &str) -> Option<Vec<u8>> {
    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

impl<S: StorageSource> Rebuilder<'_, S> {
    /// Converts a pickle value.
    pub(crate) fn value(&mut self, v: &P) -> Result<Value> {
        Ok(match v {
            P::None => Value::None,
            P::Bool(b) => Value::Bool(*b),
            P::Int(i) => Value::Int(*i),
            P::BigInt(b) => Value::BigInt(b.clone()),
            P::Float(f) => Value::Float(*f),
            P::Str(s) => Value::Str(s.clone()),
            P::Bytes(b) => Value::Bytes(b.clone()),
            P::ByteArray(b) => Value::ByteArray(b.clone()),
            P::List(items) => Value::List(self.values(items)?),
            P::Tuple(items) => Value::Tuple(self.values(items)?),
            P::Set(items) => Value::Set(self.values(items)?),
            P::FrozenSet(items) => Value::FrozenSet(self.values(items)?),
            // Python's dict: a repeated key keeps its first position and takes its last value.
            P::Dict(items) => Value::Dict(Dict::from_python_items(DictKind::Dict, self.pairs(items)?)),
            P::Global { module, name } => {
                let (module, name) = ckpt_pickle::normalize_global(module, name);
                match DType::from_torch_name(&name).filter(|_| module == "torch") {
                    Some(d) if !name.ends_with("Storage") => Value::DType(d),
                    _ => Value::Global { module, name },
                }
            }
            P::PersistentId(pid) => {
                let (data, dtype) = self.source.storage(pid)?;
                Value::Storage { dtype, data }
            }
            P::Object(obj) => self.object(obj)?,
            #[allow(unreachable_patterns)]
            other => return Err(bad("pickle", format!("unexpected value {other:?}"))),
        })
    }

    fn values(&mut self, items: &[P]) -> Result<Vec<Value>> {
        items.iter().map(|v| self.value(v)).collect()
    }

    fn pairs(&mut self, items: &[(P, P)]) -> Result<Vec<(Value, Value)>> {
        items.iter().map(|(k, v)| Ok((self.value(k)?, self.value(v)?))).collect()
    }

    /// A generic object, kept symbolically.
    fn generic(&mut self, obj: &ckpt_pickle::Object) -> Result<Value> {
        Ok(Value::Object(Box::new(Object {
            callable: self.value(&obj.callable)?,
            args: self.value(&obj.args)?,
            newobj: !matches!(obj.kind, ckpt_pickle::ObjectKind::Reduce),
            state: obj.state.as_ref().map(|s| self.value(s)).transpose()?,
            list_items: self.values(&obj.list_items)?,
            dict_items: self.pairs(&obj.dict_items)?,
        })))
    }

    fn object(&mut self, obj: &ckpt_pickle::Object) -> Result<Value> {
        let Some((module, name)) = global_name(&obj.callable) else {
            return self.generic(obj);
        };
        let args = tuple_items(&obj.args);
        let plain = obj.state.is_none() && obj.list_items.is_empty() && obj.dict_items.is_empty();
        let reduce = matches!(obj.kind, ckpt_pickle::ObjectKind::Reduce);
        match (module.as_str(), name.as_str()) {
            ("collections", "OrderedDict" | "Counter") if reduce && obj.list_items.is_empty() => {
                let kind = if name == "Counter" { DictKind::Counter } else { DictKind::OrderedDict };
                let mut items = Vec::new();
                match args.first() {
                    None | Some(P::None) => {}
                    Some(P::Dict(pairs)) => items = self.pairs(pairs)?,
                    Some(P::List(seq) | P::Tuple(seq)) => {
                        for pair in seq {
                            match tuple_items(pair) {
                                [k, v] => items.push((self.value(k)?, self.value(v)?)),
                                _ => return self.generic(obj),
                            }
                        }
                    }
                    Some(_) => return self.generic(obj),
                }
                items.extend(self.pairs(&obj.dict_items)?);
                let attrs = obj.state.as_ref().map(|s| self.value(s)).transpose()?.map(Box::new);
                Ok(Value::Dict(Dict { attrs, ..Dict::from_python_items(kind, items) }))
            }
            ("builtins", "set" | "frozenset") if reduce && plain && args.len() <= 1 => {
                let items = match args.first() {
                    Some(seq) => self.values(tuple_items(seq))?,
                    None => Vec::new(),
                };
                Ok(if name == "set" { Value::Set(items) } else { Value::FrozenSet(items) })
            }
            ("_codecs", "encode") if reduce && plain => match args {
                [P::Str(s), P::Str(enc)] if matches!(enc.as_str(), "latin1" | "latin-1" | "iso-8859-1") => {
                    match latin1(s) {
                        Some(b) => Ok(Value::Bytes(b)),
                        None => self.generic(obj),
                    }
                }
                [P::Str(s), P::Str(enc)] if matches!(enc.as_str(), "utf-8" | "utf8") => {
                    Ok(Value::Bytes(s.as_bytes().to_vec()))
                }
                _ => self.generic(obj),
            },
            ("builtins", "bytearray") if reduce && plain => match args {
                [] => Ok(Value::ByteArray(Vec::new())),
                [P::Bytes(b)] => Ok(Value::ByteArray(b.clone())),
                [P::Str(s), P::Str(_)] => match latin1(s) {
                    Some(b) => Ok(Value::ByteArray(b)),
                    None => self.generic(obj),
                },
                [inner @ P::Object(_)] => match self.value(inner)? {
                    Value::Bytes(b) => Ok(Value::ByteArray(b)),
                    _ => self.generic(obj),
                },
                _ => self.generic(obj),
            },
            ("builtins", "complex") if reduce && plain => match args {
                [re, im] => match (self.value(re)?.as_f64(), self.value(im)?.as_f64()) {
                    (Some(re), Some(im)) => Ok(Value::Complex(re, im)),
                    _ => self.generic(obj),
                },
                _ => self.generic(obj),
            },
            ("torch", "Size") if reduce && plain => match args {
                [P::Tuple(dims) | P::List(dims)] => {
                    let dims: Option<Vec<i64>> =
                        dims.iter().map(|d| if let P::Int(i) = d { Some(*i) } else { None }).collect();
                    match dims {
                        Some(d) => Ok(Value::Size(d)),
                        None => self.generic(obj),
                    }
                }
                _ => self.generic(obj),
            },
            ("torch", "device") if reduce && plain => match args {
                [P::Str(kind)] => Ok(Value::Device { kind: kind.clone(), index: None }),
                [P::Str(kind), P::Int(i)] => Ok(Value::Device { kind: kind.clone(), index: Some(*i) }),
                _ => self.generic(obj),
            },
            ("torch._utils", "_rebuild_tensor_v2" | "_rebuild_tensor_v3" | "_rebuild_tensor") if reduce && plain => {
                self.dense_tensor(&name, args, obj)
            }
            ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") if reduce && plain => {
                let data = self.value(arg(args, 0, &name)?)?;
                let requires_grad = bool_arg(args, 1, &name)?;
                let Value::Tensor(tensor) = data else {
                    return Err(bad(&name, format!("data must be a dense tensor, got {}", data.type_name())));
                };
                let state = match name.as_str() {
                    "_rebuild_parameter_with_state" => Some(Box::new(self.value(arg(args, 3, &name)?)?)),
                    _ => None,
                };
                Ok(Value::Parameter { tensor: tensor.with_requires_grad(requires_grad), state })
            }
            ("torch._tensor", "_rebuild_from_type_v2") if reduce && plain => {
                let func = arg(args, 0, &name)?.clone();
                let class = self.value(arg(args, 1, &name)?)?;
                let inner_args = arg(args, 2, &name)?.clone();
                let state = self.value(arg(args, 3, &name)?)?;
                let inner = ckpt_pickle::Object {
                    callable: func,
                    args: inner_args,
                    kind: ckpt_pickle::ObjectKind::Reduce,
                    state: None,
                    list_items: Vec::new(),
                    dict_items: Vec::new(),
                };
                let tensor = self.object(&inner)?;
                if !tensor.is_tensor_like() {
                    return Err(bad(&name, format!("rebuilds a {}, not a tensor", tensor.type_name())));
                }
                Ok(Value::TensorWithState { tensor: Box::new(tensor), class: Box::new(class), state: Box::new(state) })
            }
            ("torch._utils", function) if opaque_kind(function).is_some() => {
                let kind = opaque_kind(function).unwrap_or(OpaqueTensorKind::Other);
                match self.generic(obj)? {
                    Value::Object(object) => Ok(Value::OpaqueTensor { kind, object }),
                    other => Ok(other),
                }
            }
            _ => self.generic(obj),
        }
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])`,
    /// `_rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])` and the
    /// pre-0.4 `_rebuild_tensor(storage, offset, size, stride)`.
    fn dense_tensor(&mut self, name: &str, args: &[P], obj: &ckpt_pickle::Object) -> Result<Value> {
        let (data, storage_dtype) = match self.value(arg(args, 0, name)?)? {
            Value::Storage { dtype, data } => (data, dtype),
            other => return Err(bad(name, format!("argument 0 must be a storage, got {}", other.type_name()))),
        };
        let offset = int_arg(args, 1, name)?;
        let size = dims_arg(args, 2, name)?;
        let stride = dims_arg(args, 3, name)?;
        let (dtype, requires_grad, metadata) = match name {
            "_rebuild_tensor" => (storage_dtype, false, None),
            "_rebuild_tensor_v2" => (storage_dtype, bool_arg(args, 4, name)?, args.get(6)),
            _ => {
                let dtype = match self.value(arg(args, 6, name)?)? {
                    Value::DType(d) => d,
                    Value::Global { name: n, .. } => return Err(Error::UnknownDType(n)),
                    other => return Err(bad(name, format!("argument 6 must be a dtype, got {}", other.type_name()))),
                };
                (dtype, bool_arg(args, 4, name)?, args.get(7))
            }
        };
        // Metadata {'conj': True} / {'neg': True}: torch's lazy conjugation and negation bits, kept on the
        // tensor (the storage stays shared; reading the data applies them). Anything else stays opaque.
        let (mut conj, mut neg) = (false, false);
        if let Some(P::Dict(items)) = metadata {
            for (k, v) in items {
                match (k, v) {
                    (P::Str(k), P::Bool(b)) if k == "conj" => conj = *b,
                    (P::Str(k), P::Bool(b)) if k == "neg" => neg = *b,
                    _ => {
                        return match self.generic(obj)? {
                            Value::Object(object) => Ok(Value::OpaqueTensor { kind: OpaqueTensorKind::Other, object }),
                            other => Ok(other),
                        };
                    }
                }
            }
        }
        let tensor = Tensor::from_parts(dtype, &size, &stride, offset, data)
            .and_then(|t| t.with_lazy_bits(conj, neg))
            .map_err(|e| Error::ViewOutOfBounds(format!("{name}: {e}")))?;
        Ok(Value::Tensor(tensor.with_requires_grad(requires_grad)))
    }
}

/// What kind of opaque tensor a `torch._utils` rebuild function makes, if it makes one.
pub(crate) fn opaque_kind(function: &str) -> Option<OpaqueTensorKind> {
    Some(match function {
        "_rebuild_sparse_tensor" | "_rebuild_sparse_csr_tensor" => OpaqueTensorKind::Sparse,
        "_rebuild_qtensor" => OpaqueTensorKind::Quantized,
        "_rebuild_nested_tensor" => OpaqueTensorKind::Nested,
        "_rebuild_meta_tensor_no_storage" => OpaqueTensorKind::Meta,
        "_rebuild_wrapper_subclass"
        | "_rebuild_device_tensor_from_cpu_tensor"
        | "_rebuild_device_tensor_from_numpy"
        | "_rebuild_xla_tensor"
        | "_rebuild_mtia_tensor" => OpaqueTensorKind::Other,
        _ => return None,
    })
}
