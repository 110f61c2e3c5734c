//! Reading `data.pkl` in one pass: the pickle's objects become [`ckpt_core::Value`]s as [`ckpt_pickle::build`]
//! runs it, with torch's rebuild functions applied to each call once nothing can change it any more, so no
//! pickle tree is built and then converted. Strings stay borrowed from the pickle and globals are named once
//! until something keeps them (a storage's persistent id, a tensor's rebuild arguments never become values);
//! storages are resolved as they appear.
//!
//! Tensor records after the first ([`construct`]) are read straight from their bytes, without the VM's
//! dispatch and intermediate values.
//!
//! The result is exactly what [`crate::rebuild::Rebuilder`] makes of the decoded pickle: this module applies
//! the same rules to the same arguments. Whatever it cannot reproduce exactly (an error of any kind, a second
//! BUILD, a memo pattern the single-pass VM declines) makes it return `None`, and the caller runs the full
//! decoder and the [`Rebuilder`](crate::rebuild::Rebuilder), which give the value or the precise error.

use std::borrow::Cow;

use ckpt_core::{Buffer, DType, Dict, DictKind, Object, OpaqueTensorKind, Tensor, Value};
use ckpt_pickle::build::{Builder, Call, CallKind, Construct, Declined, Items, Memo, Pairs, Sequence, build};

use crate::rebuild::{latin1, opaque_kind};

mod construct;

/// Resolves a storage's persistent id to its bytes and dtype.
pub(crate) trait CoreStorages {
    /// The bytes of storage `key` of `numel` elements of `dtype` (its class's), or `None` for anything the
    /// full path would reject.
    fn storage(&mut self, dtype: DType, key: &str, numel: i64) -> Option<ckpt_core::Buffer>;
}

/// Decodes and rebuilds a ZIP `data.pkl`, or `None` when the full path must (see the module docs).
pub(crate) fn rebuild(pkl: &[u8], limits: &ckpt_pickle::Limits, storages: &mut dyn CoreStorages) -> Option<Value> {
    rebuild_counting(pkl, limits, storages, true).0
}

/// [`rebuild`], with tensor records read straight from the bytes ([`construct`]) or, `constructs` false, all
/// run by the VM (for tests that compare the two); and how many records were read that way (each of which
/// the VM took, or ran itself).
pub(crate) fn rebuild_counting(
    pkl: &[u8],
    limits: &ckpt_pickle::Limits,
    storages: &mut dyn CoreStorages,
    constructs: bool,
) -> (Option<Value>, usize) {
    let mut b = TorchBuilder { storages, globals: Vec::new(), constructs, read: 0 };
    let value = build(pkl, limits, &mut b).ok().and_then(|(root, _)| b.finish(root).ok());
    (value, b.read)
}

/// A global: what it becomes as a value, and what the rebuild rules make of its Python 3 name.
struct Global {
    value: Value,
    known: Known,
    /// The dtype of a storage class (`torch.FloatStorage`, `torch.storage.UntypedStorage`).
    storage: Option<DType>,
}

/// The callables the rebuild rules name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    OrderedDict,
    Counter,
    Set,
    FrozenSet,
    CodecsEncode,
    ByteArray,
    Complex,
    Size,
    Device,
    RebuildTensor,
    RebuildTensorV2,
    RebuildTensorV3,
    RebuildParameter,
    RebuildParameterWithState,
    RebuildFromTypeV2,
    Opaque(OpaqueTensorKind),
    Other,
}

fn known(module: &str, name: &str) -> Known {
    match (module, name) {
        ("collections", "OrderedDict") => Known::OrderedDict,
        ("collections", "Counter") => Known::Counter,
        ("builtins", "set") => Known::Set,
        ("builtins", "frozenset") => Known::FrozenSet,
        ("_codecs", "encode") => Known::CodecsEncode,
        ("builtins", "bytearray") => Known::ByteArray,
        ("builtins", "complex") => Known::Complex,
        ("torch", "Size") => Known::Size,
        ("torch", "device") => Known::Device,
        ("torch._utils", "_rebuild_tensor") => Known::RebuildTensor,
        ("torch._utils", "_rebuild_tensor_v2") => Known::RebuildTensorV2,
        ("torch._utils", "_rebuild_tensor_v3") => Known::RebuildTensorV3,
        ("torch._utils", "_rebuild_parameter") => Known::RebuildParameter,
        ("torch._utils", "_rebuild_parameter_with_state") => Known::RebuildParameterWithState,
        ("torch._tensor", "_rebuild_from_type_v2") => Known::RebuildFromTypeV2,
        ("torch._utils", f) => opaque_kind(f).map_or(Known::Other, Known::Opaque),
        _ => Known::Other,
    }
}

/// A call whose rebuild waits until nothing can add to it (APPEND, SETITEMS and BUILD apply to it while it is
/// on the stack).
#[derive(Debug, Clone)]
pub(crate) struct Pending<'a> {
    reduce: bool,
    callable: T<'a>,
    args: T<'a>,
    state: Option<T<'a>>,
    list_items: Vec<T<'a>>,
    dict_items: Vec<(T<'a>, T<'a>)>,
}

/// A value under construction: the pickle's own shapes (text still borrowed, globals by index) until
/// something keeps it as a [`Value`].
#[derive(Debug, Clone)]
pub(crate) enum T<'a> {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Cow<'a, str>),
    /// Index into the builder's globals.
    Global(u32),
    Tuple(Vec<T<'a>>),
    List(Vec<T<'a>>),
    /// A pickle dict (objects are never this).
    Dict(Vec<(T<'a>, T<'a>)>),
    Call(Box<Pending<'a>>),
    /// A persistent id resolved to its storage.
    Storage(DType, ckpt_core::Buffer),
    /// Anything else, converted: bytes, big ints, sets.
    V(Box<Value>),
}

struct TorchBuilder<'s> {
    storages: &'s mut dyn CoreStorages,
    globals: Vec<Global>,
    /// Whether tensor records are read straight from the bytes ([`construct`]).
    constructs: bool,
    /// Tensor records read that way.
    read: usize,
}

type R<T> = Result<T, Declined>;

fn arg<'t, 'a>(args: &'t [T<'a>], i: usize) -> R<&'t T<'a>> {
    args.get(i).ok_or(Declined)
}

/// Argument `i`, moved out (what is left in its place is `None`).
fn take_arg<'a>(args: &mut [T<'a>], i: usize) -> R<T<'a>> {
    args.get_mut(i).map(|t| std::mem::replace(t, T::None)).ok_or(Declined)
}

fn int_arg(args: &[T<'_>], i: usize) -> R<usize> {
    match arg(args, i)? {
        T::Int(v) if *v >= 0 => usize::try_from(*v).map_err(|_| Declined),
        _ => Err(Declined),
    }
}

/// A tensor's sizes or strides: up to [`Dims::INLINE`] of them without an allocation.
struct Dims {
    inline: [usize; Dims::INLINE],
    len: usize,
    more: Vec<usize>,
}

impl Dims {
    const INLINE: usize = 8;

    fn as_slice(&self) -> &[usize] {
        if self.more.is_empty() { self.inline.get(..self.len).unwrap_or_default() } else { &self.more }
    }
}

fn dims_arg(args: &[T<'_>], i: usize) -> R<Dims> {
    let (T::Tuple(items) | T::List(items)) = arg(args, i)? else { return Err(Declined) };
    let dim = |d: &T<'_>| match d {
        T::Int(v) if *v >= 0 => usize::try_from(*v).map_err(|_| Declined),
        _ => Err(Declined),
    };
    let mut dims = Dims { inline: [0; Dims::INLINE], len: items.len(), more: Vec::new() };
    if items.len() <= Dims::INLINE {
        for (slot, d) in dims.inline.iter_mut().zip(items) {
            *slot = dim(d)?;
        }
    } else {
        dims.more = items.iter().map(dim).collect::<R<_>>()?;
    }
    Ok(dims)
}

fn bool_arg(args: &[T<'_>], i: usize) -> R<bool> {
    match arg(args, i)? {
        T::Bool(b) => Ok(*b),
        T::Int(v) => Ok(*v != 0),
        _ => Err(Declined),
    }
}

/// The items of a tuple or list; nothing for anything else (the full path's `tuple_items`).
fn seq_items<'t, 'a>(v: &'t T<'a>) -> &'t [T<'a>] {
    match v {
        T::Tuple(items) | T::List(items) => items,
        _ => &[],
    }
}

impl TorchBuilder<'_> {
    fn global_of(&self, t: &T<'_>) -> Option<&Global> {
        match t {
            T::Global(id) => self.globals.get(*id as usize),
            _ => None,
        }
    }

    fn new_global(&mut self, module: &str, name: &str) -> R<u32> {
        let (module, name) = ckpt_pickle::normalize_global(module, name);
        let value = match DType::from_torch_name(&name).filter(|_| module == "torch") {
            Some(d) if !name.ends_with("Storage") => Value::DType(d),
            _ => Value::Global { module: module.clone(), name: name.clone() },
        };
        let id = u32::try_from(self.globals.len()).map_err(|_| Declined)?;
        let known = known(&module, &name);
        let storage = crate::rebuild::storage_class_dtype(&module, &name).ok();
        self.globals.push(Global { value, known, storage });
        Ok(id)
    }

    /// The value `t` becomes (the full path's `Rebuilder::value`).
    fn finish(&mut self, t: T<'_>) -> R<Value> {
        Ok(match t {
            T::None => Value::None,
            T::Bool(b) => Value::Bool(b),
            T::Int(i) => Value::Int(i),
            T::Float(f) => Value::Float(f),
            T::Str(s) => Value::Str(s.into_owned()),
            T::Global(id) => self.globals.get(id as usize).ok_or(Declined)?.value.clone(),
            T::Tuple(items) => Value::Tuple(self.finish_all(items)?),
            T::List(items) => Value::List(self.finish_all(items)?),
            // Python's dict: a repeated key keeps its first position and takes its last value.
            T::Dict(pairs) => Value::Dict(Dict::from_python_items(DictKind::Dict, self.finish_pairs(pairs)?)),
            T::Call(p) => self.rebuild(*p)?,
            T::Storage(dtype, data) => Value::Storage { dtype, data },
            T::V(v) => *v,
        })
    }

    fn finish_ref(&mut self, t: &T<'_>) -> R<Value> {
        self.finish(t.clone())
    }

    fn finish_all(&mut self, items: Vec<T<'_>>) -> R<Vec<Value>> {
        let mut out = Vec::with_capacity(items.len());
        for t in items {
            out.push(self.finish(t)?);
        }
        Ok(out)
    }

    fn finish_pairs(&mut self, pairs: Vec<(T<'_>, T<'_>)>) -> R<Vec<(Value, Value)>> {
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            out.push((self.finish(k)?, self.finish(v)?));
        }
        Ok(out)
    }

    /// The object kept symbolically (the full path's `Rebuilder::generic`).
    fn generic(&mut self, p: Pending<'_>) -> R<Value> {
        Ok(Value::Object(Box::new(Object {
            callable: self.finish(p.callable)?,
            args: self.finish(p.args)?,
            newobj: !p.reduce,
            state: p.state.map(|s| self.finish(s)).transpose()?,
            list_items: self.finish_all(p.list_items)?,
            dict_items: self.finish_pairs(p.dict_items)?,
        })))
    }

    /// torch's rebuild of one call (the rules of `Rebuilder::object`).
    #[allow(clippy::too_many_lines)]
    fn rebuild(&mut self, p: Pending<'_>) -> R<Value> {
        let Some(g) = self.global_of(&p.callable) else { return self.generic(p) };
        let known = g.known;
        let plain = p.state.is_none() && p.list_items.is_empty() && p.dict_items.is_empty();
        let reduce = p.reduce;
        match known {
            Known::OrderedDict | Known::Counter if reduce && p.list_items.is_empty() => {
                let kind = if known == Known::Counter { DictKind::Counter } else { DictKind::OrderedDict };
                let args = seq_items(&p.args);
                let mut items = match args.first() {
                    None | Some(T::None) => Vec::new(),
                    Some(T::Dict(pairs)) => self.finish_pairs(pairs.clone())?,
                    Some(T::List(seq) | T::Tuple(seq)) => {
                        let mut items = Vec::with_capacity(seq.len());
                        for pair in seq {
                            match seq_items(pair) {
                                [k, v] => {
                                    let k = self.finish_ref(k)?;
                                    let v = self.finish_ref(v)?;
                                    items.push((k, v));
                                }
                                _ => return self.generic(p),
                            }
                        }
                        items
                    }
                    Some(_) => return self.generic(p),
                };
                items.extend(self.finish_pairs(p.dict_items)?);
                let attrs = p.state.map(|s| self.finish(s)).transpose()?.map(Box::new);
                Ok(Value::Dict(Dict { attrs, ..Dict::from_python_items(kind, items) }))
            }
            Known::Set | Known::FrozenSet if reduce && plain && seq_items(&p.args).len() <= 1 => {
                let items = match seq_items(&p.args).first() {
                    Some(seq) => self.finish_all(seq_items(seq).to_vec())?,
                    None => Vec::new(),
                };
                Ok(if known == Known::Set { Value::Set(items) } else { Value::FrozenSet(items) })
            }
            Known::CodecsEncode if reduce && plain => match seq_items(&p.args) {
                [T::Str(s), T::Str(enc)] if matches!(enc.as_ref(), "latin1" | "latin-1" | "iso-8859-1") => {
                    match latin1(s) {
                        Some(b) => Ok(Value::Bytes(b)),
                        None => self.generic(p),
                    }
                }
                [T::Str(s), T::Str(enc)] if matches!(enc.as_ref(), "utf-8" | "utf8") => {
                    Ok(Value::Bytes(s.as_bytes().to_vec()))
                }
                _ => self.generic(p),
            },
            Known::ByteArray if reduce && plain => match seq_items(&p.args) {
                [] => Ok(Value::ByteArray(Vec::new())),
                [T::V(v)] if matches!(**v, Value::Bytes(_)) => match &**v {
                    Value::Bytes(b) => Ok(Value::ByteArray(b.clone())),
                    _ => Err(Declined),
                },
                [T::Str(s), T::Str(_)] => match latin1(s) {
                    Some(b) => Ok(Value::ByteArray(b)),
                    None => self.generic(p),
                },
                [inner @ T::Call(_)] => match self.finish_ref(inner)? {
                    Value::Bytes(b) => Ok(Value::ByteArray(b)),
                    _ => self.generic(p),
                },
                _ => self.generic(p),
            },
            Known::Complex if reduce && plain => match seq_items(&p.args) {
                [re, im] => {
                    let re = self.finish_ref(re)?.as_f64();
                    let im = self.finish_ref(im)?.as_f64();
                    match (re, im) {
                        (Some(re), Some(im)) => Ok(Value::Complex(re, im)),
                        _ => self.generic(p),
                    }
                }
                _ => self.generic(p),
            },
            Known::Size if reduce && plain => match seq_items(&p.args) {
                [T::Tuple(dims) | T::List(dims)] => {
                    let dims: Option<Vec<i64>> =
                        dims.iter().map(|d| if let T::Int(i) = d { Some(*i) } else { None }).collect();
                    match dims {
                        Some(d) => Ok(Value::Size(d)),
                        None => self.generic(p),
                    }
                }
                _ => self.generic(p),
            },
            Known::Device if reduce && plain => match seq_items(&p.args) {
                [T::Str(kind)] => Ok(Value::Device { kind: kind.as_ref().to_owned(), index: None }),
                [T::Str(kind), T::Int(i)] => Ok(Value::Device { kind: kind.as_ref().to_owned(), index: Some(*i) }),
                _ => self.generic(p),
            },
            Known::RebuildTensor | Known::RebuildTensorV2 | Known::RebuildTensorV3 if reduce && plain => {
                self.dense_tensor(known, p)
            }
            Known::RebuildParameter | Known::RebuildParameterWithState if reduce && plain => {
                let mut args = match p.args {
                    T::Tuple(items) | T::List(items) => items,
                    _ => Vec::new(),
                };
                let Value::Tensor(tensor) = self.finish(take_arg(&mut args, 0)?)? else { return Err(Declined) };
                let requires_grad = bool_arg(&args, 1)?;
                let state = match known {
                    Known::RebuildParameterWithState => Some(Box::new(self.finish(take_arg(&mut args, 3)?)?)),
                    _ => None,
                };
                Ok(Value::Parameter { tensor: tensor.with_requires_grad(requires_grad), state })
            }
            Known::RebuildFromTypeV2 if reduce && plain => {
                let args = seq_items(&p.args);
                let func = arg(args, 0)?.clone();
                let class = self.finish_ref(arg(args, 1)?)?;
                let inner_args = arg(args, 2)?.clone();
                let state = self.finish_ref(arg(args, 3)?)?;
                let inner = Pending {
                    reduce: true,
                    callable: func,
                    args: inner_args,
                    state: None,
                    list_items: Vec::new(),
                    dict_items: Vec::new(),
                };
                let tensor = self.rebuild(inner)?;
                if !tensor.is_tensor_like() {
                    return Err(Declined);
                }
                Ok(Value::TensorWithState { tensor: Box::new(tensor), class: Box::new(class), state: Box::new(state) })
            }
            Known::Opaque(kind) => match self.generic(p)? {
                Value::Object(object) => Ok(Value::OpaqueTensor { kind, object }),
                other => Ok(other),
            },
            _ => self.generic(p),
        }
    }

    /// `_rebuild_tensor_v2`, `_rebuild_tensor_v3` and `_rebuild_tensor` (the rules of
    /// `Rebuilder::dense_tensor`).
    fn dense_tensor(&mut self, known: Known, p: Pending<'_>) -> R<Value> {
        let args = seq_items(&p.args);
        let (data, storage_dtype) = match arg(args, 0)? {
            T::Storage(dtype, data) => (data.clone(), *dtype),
            _ => return Err(Declined),
        };
        let offset = int_arg(args, 1)?;
        let size = dims_arg(args, 2)?;
        let stride = dims_arg(args, 3)?;
        let (dtype, requires_grad, metadata) = match known {
            Known::RebuildTensor => (storage_dtype, false, None),
            Known::RebuildTensorV2 => (storage_dtype, bool_arg(args, 4)?, args.get(6)),
            _ => match self.global_of(arg(args, 6)?).map(|g| &g.value) {
                Some(Value::DType(d)) => (*d, bool_arg(args, 4)?, args.get(7)),
                _ => return Err(Declined),
            },
        };
        let (mut conj, mut neg) = (false, false);
        if let Some(T::Dict(items)) = metadata {
            for (k, v) in items {
                match (k, v) {
                    (T::Str(k), T::Bool(b)) if k == "conj" => conj = *b,
                    (T::Str(k), T::Bool(b)) if k == "neg" => neg = *b,
                    _ => {
                        return match self.generic(p)? {
                            Value::Object(object) => Ok(Value::OpaqueTensor { kind: OpaqueTensorKind::Other, object }),
                            other => Ok(other),
                        };
                    }
                }
            }
        }
        tensor_value(dtype, size.as_slice(), stride.as_slice(), offset, data, (conj, neg), requires_grad)
    }
}

/// The tensor `_rebuild_tensor*` makes of its arguments.
fn tensor_value(
    dtype: DType,
    size: &[usize],
    stride: &[usize],
    offset: usize,
    data: Buffer,
    (conj, neg): (bool, bool),
    requires_grad: bool,
) -> R<Value> {
    let tensor = Tensor::from_parts(dtype, size, stride, offset, data)
        .and_then(|t| t.with_lazy_bits(conj, neg))
        .map_err(|_| Declined)?;
    Ok(Value::Tensor(tensor.with_requires_grad(requires_grad)))
}

impl<'a> Builder<'a> for TorchBuilder<'_> {
    type Value = T<'a>;

    fn none(&mut self) -> T<'a> {
        T::None
    }

    fn bool(&mut self, v: bool) -> T<'a> {
        T::Bool(v)
    }

    fn int(&mut self, v: i64) -> T<'a> {
        T::Int(v)
    }

    fn float(&mut self, v: f64) -> T<'a> {
        T::Float(v)
    }

    fn big_int(&mut self, le_twos: Vec<u8>) -> R<T<'a>> {
        Ok(T::V(Box::new(Value::BigInt(le_twos))))
    }

    fn str(&mut self, s: Cow<'a, str>) -> R<T<'a>> {
        Ok(T::Str(s))
    }

    fn bytes(&mut self, b: Cow<'a, [u8]>, bytearray: bool) -> R<T<'a>> {
        let b = b.into_owned();
        Ok(T::V(Box::new(if bytearray { Value::ByteArray(b) } else { Value::Bytes(b) })))
    }

    fn global(&mut self, module: &'a str, name: &'a str) -> R<T<'a>> {
        self.new_global(module, name).map(T::Global)
    }

    fn stack_global(&mut self, module: T<'a>, name: T<'a>) -> R<T<'a>> {
        match (module, name) {
            (T::Str(m), T::Str(n)) => self.new_global(&m, &n).map(T::Global),
            _ => Err(Declined),
        }
    }

    fn sequence(&mut self, kind: Sequence, items: Items<'_, T<'a>>) -> R<T<'a>> {
        Ok(match kind {
            Sequence::List => T::List(items.collect()),
            Sequence::Tuple => T::Tuple(items.collect()),
            Sequence::Set => T::V(Box::new(Value::Set(self.finish_all(items.collect())?))),
            Sequence::FrozenSet => T::V(Box::new(Value::FrozenSet(self.finish_all(items.collect())?))),
        })
    }

    fn dict(&mut self, pairs: Pairs<'_, T<'a>>) -> R<T<'a>> {
        Ok(T::Dict(pairs.collect()))
    }

    fn persistent_id(&mut self, pid: T<'a>) -> R<T<'a>> {
        // ('storage', class, key, location, numel): the rules of `StorageSource::storage`.
        let T::Tuple(items) = &pid else { return Err(Declined) };
        let [T::Str(tag), class, T::Str(key), _location, T::Int(numel)] = items.as_slice() else {
            return Err(Declined);
        };
        if tag != "storage" {
            return Err(Declined);
        }
        let dtype = self.global_of(class).and_then(|g| g.storage).ok_or(Declined)?;
        let data = self.storages.storage(dtype, key, *numel).ok_or(Declined)?;
        Ok(T::Storage(dtype, data))
    }

    fn object(&mut self, call: Call<T<'a>>) -> R<T<'a>> {
        let p = Pending {
            reduce: matches!(call.kind, CallKind::Reduce),
            callable: call.callable,
            args: call.args,
            state: None,
            list_items: Vec::new(),
            dict_items: Vec::new(),
        };
        // A tensor's rebuild is applied at once: its arguments are final (the VM hands over owned values, and
        // freezes any shared one), and the only thing that could still change the call is a BUILD, APPEND or
        // SETITEMS on the result, which a finished value declines, so the full path decides those.
        let eager = p.reduce
            && self.global_of(&p.callable).is_some_and(|g| {
                matches!(
                    g.known,
                    Known::RebuildTensor
                        | Known::RebuildTensorV2
                        | Known::RebuildTensorV3
                        | Known::RebuildParameter
                        | Known::RebuildParameterWithState
                )
            });
        if eager {
            return self.rebuild(p).map(|v| T::V(Box::new(v)));
        }
        Ok(T::Call(Box::new(p)))
    }

    fn append(&mut self, target: &mut T<'a>, items: Items<'_, T<'a>>) -> R<()> {
        match target {
            T::List(v) => v.extend(items),
            T::Call(p) => p.list_items.extend(items),
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn set_items(&mut self, target: &mut T<'a>, pairs: Pairs<'_, T<'a>>) -> R<()> {
        match target {
            T::Dict(v) => v.extend(pairs),
            T::Call(p) => p.dict_items.extend(pairs),
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn add_items(&mut self, target: &mut T<'a>, items: Items<'_, T<'a>>) -> R<()> {
        let items = self.finish_all(items.collect())?;
        match target {
            T::V(v) => match &mut **v {
                Value::Set(v) => v.extend(items),
                _ => return Err(Declined),
            },
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn build(&mut self, target: &mut T<'a>, state: T<'a>) -> R<()> {
        match target {
            // A second BUILD merges dict states in the full decoder: left to it.
            T::Call(p) if p.state.is_none() => p.state = Some(state),
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn share(&mut self, v: &T<'a>) -> R<T<'a>> {
        Ok(v.clone())
    }

    fn construct(&mut self, data: &'a [u8], at: usize, memo: &Memo<'_, T<'a>>) -> Option<Construct<T<'a>>> {
        if !self.constructs {
            return None;
        }
        let c = construct::tensor_v2(self, data, at, memo)?;
        self.read += 1;
        Some(c)
    }
}
