//! torch's side of unpickling: the [`Builder`] that turns a `torch.save` pickle into [`ckpt_tensor::Value`]s as
//! the pickle machine runs it, applying the rebuild functions of `torch._utils` (tensors, parameters,
//! storages by persistent id) and torch's other reduce forms (`OrderedDict`, `torch.Size`, `torch.device`,
//! sets, latin-1 bytes, complex numbers) once, without importing or running anything.
//!
//! Strings stay borrowed from the pickle and globals are named once until something keeps them. A tensor is
//! rebuilt when it is called (its arguments are final there); any other call waits until nothing can change
//! it (appended or set items and `__setstate__` apply to it while it is open). Objects the pickle shares (a
//! module referred to twice, an omegaconf node whose children link back to it) are kept on a [`Shelf`] and
//! placed at the end, as [`Value::Shared`] and [`Value::Ref`] where identity matters.
//!
//! The tensor record `torch.save` writes for every tensor after the first is a [`Template`], read by the
//! machine straight from the bytes.

use std::borrow::Cow;

use ckpt_pickle::{Builder, Call, CallKind, Captures, Items, Pairs, Pattern, Sequence, Shelf, Template, Tree};
use ckpt_tensor::{Buffer, DType, Dict, DictKind, Object, OpaqueTensorKind, Tensor, Value};

use crate::error::Error;
use crate::read_options::{NestedRead, ReadOptions};

/// Where the bytes of the storages a pickle refers to come from.
pub(crate) trait StorageSource {
    /// The bytes of storage `key`, which holds `numel` elements of `dtype` (its class's dtype).
    ///
    /// # Errors
    /// A missing record, or one of another size.
    fn storage(&mut self, dtype: DType, key: &str, numel: i64) -> Result<Buffer, Error>;

    /// The value of torch.package's other persistent id, `('reduce_package', id, function, args)`: what
    /// `function(importer, *args)` makes, read without running it; `None` when this source makes nothing of
    /// `function` (the call is kept as an opaque object). Default: `None`.
    fn reduce_package(&mut self, _function: (&str, &str), _args: &Value) -> Option<Result<Value, Error>> {
        None
    }
}

/// Why a pickle could not be rebuilt: the machine's error about the pickle itself, or a rebuild rule's.
#[derive(Debug)]
pub(crate) enum Failure {
    Pickle(ckpt_pickle::Error),
    Torch(Error),
}

impl From<ckpt_pickle::Error> for Failure {
    fn from(e: ckpt_pickle::Error) -> Self {
        Failure::Pickle(e)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Torch(e)
    }
}

impl From<ckpt_tensor::Error> for Failure {
    fn from(e: ckpt_tensor::Error) -> Self {
        Failure::Torch(Error::Core(e))
    }
}

impl Failure {
    /// The torch error, naming the pickle (`data.pkl`, `legacy object`, ...) for a pickle error.
    pub(crate) fn into_error(self, part: &'static str) -> Error {
        match self {
            Failure::Pickle(source) => Error::Pickle { part, source },
            Failure::Torch(e) => e,
        }
    }
}

type R<T> = Result<T, Failure>;

/// Decodes a `torch.save` pickle and rebuilds its objects, reading storages from `storages`.
///
/// # Errors
/// The pickle's error (named `part`), or a rebuild rule's.
pub(crate) fn rebuild(
    pkl: &[u8],
    options: &ReadOptions,
    storages: &mut dyn StorageSource,
    part: &'static str,
) -> Result<Value, Error> {
    let nested = Nested { options: options.pickle(), depth: options.nesting, read: options.nested_read };
    rebuild_in(pkl, nested, storages, true).0.map_err(|e| e.into_error(part))
}

#[cfg(any(test, fuzzing))]
/// [`rebuild`], with tensor records read straight from the bytes (`templates`) or all run by the machine (for
/// tests that compare the two), nested streams read by `read`; and how many records were read from the bytes.
pub(crate) fn rebuild_with(
    pkl: &[u8],
    options: &ckpt_pickle::Options,
    storages: &mut dyn StorageSource,
    templates: bool,
    read: NestedRead,
) -> (R<Value>, usize) {
    rebuild_in(pkl, Nested { options: *options, depth: 0, read: Some(read) }, storages, templates)
}

/// The most `torch.storage._load_from_bytes` streams nested inside each other (a pickled storage holds one
/// stream, which holds the storage alone).
pub(crate) const MAX_NESTING: usize = 4;

/// How a pickle is read: the machine's options, how deep inside `_load_from_bytes` streams it is, and the
/// reader of the streams nested in it.
struct Nested {
    options: ckpt_pickle::Options,
    depth: usize,
    read: Option<NestedRead>,
}

fn rebuild_in(pkl: &[u8], nested: Nested, storages: &mut dyn StorageSource, templates: bool) -> (R<Value>, usize) {
    let options = &nested.options;
    let mut b = TorchBuilder {
        nesting: nested.depth,
        nested_read: nested.read,
        pickle: *options,
        storages,
        globals: Vec::new(),
        shelf: Shelf::default(),
        templates,
        templated: 0,
        class_dtypes: Vec::new(),
    };
    let value = ckpt_pickle::run(pkl, options, &mut b)
        .and_then(|(root, end)| b.finish_root(root, options.limits.max_depth, end));
    (value, b.templated)
}

/// A global: what it becomes as a value, and what the rebuild rules make of its Python 3 name.
struct Global {
    value: Value,
    known: Known,
    /// The dtype of a storage class (`torch.FloatStorage`, `torch.storage.UntypedStorage`).
    storage: Option<DType>,
    /// Module and name (after Python 2 → 3 mapping), for messages.
    module: String,
    name: String,
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
    /// `torch.storage._load_from_bytes(b)`: a storage pickled by itself, `b` a whole `torch.save` stream.
    LoadFromBytes,
    /// `numpy.core.multiarray.scalar` and `_reconstruct` (numpy 2: `numpy._core.multiarray`).
    Numpy,
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
        ("torch.storage", "_load_from_bytes") => Known::LoadFromBytes,
        ("torch._utils", f) => opaque_kind(f).map_or(Known::Other, Known::Opaque),
        (m, "scalar" | "_reconstruct") if ckpt_tensor::value::NUMPY_MULTIARRAY.contains(&m) => Known::Numpy,
        (m, "_frombuffer") if crate::numpy::NUMPY_NUMERIC.iter().any(|(n, _)| *n == m) => Known::Numpy,
        _ => Known::Other,
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

/// The dtype of a storage class global (`torch FloatStorage`, `torch.cuda.HalfStorage`,
/// `torch.storage UntypedStorage`).
pub(crate) fn storage_class_dtype(module: &str, name: &str) -> Result<DType, Error> {
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

/// Latin-1 encoding of a str (what `_codecs.encode(s, 'latin1')` does), `None` for characters above U+00FF.
pub(crate) fn latin1(s: &str) -> Option<Vec<u8>> {
    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

/// A call whose rebuild waits until nothing can add to it.
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
    Storage(DType, Buffer),
    /// Anything else, finished: tensors, bytes, big ints, sets.
    V(Box<Value>),
    /// An object on the shelf.
    Handle(u32),
}

struct TorchBuilder<'s, 'a> {
    /// How deep inside `_load_from_bytes` streams this pickle is (0: the file's own).
    nesting: usize,
    /// The reader of the streams inside `_load_from_bytes` (the file reader's entry point).
    nested_read: Option<NestedRead>,
    /// The machine's options, for the streams inside `_load_from_bytes`.
    pickle: ckpt_pickle::Options,
    storages: &'s mut dyn StorageSource,
    globals: Vec<Global>,
    shelf: Shelf<T<'a>>,
    /// Whether tensor records are read straight from the bytes.
    templates: bool,
    /// Tensor records read that way.
    templated: usize,
    /// The dtype of the storage class a tensor record names, by where its name is in the input (a record
    /// fetches the same memoized class each time).
    class_dtypes: Vec<((usize, usize), DType)>,
}

fn bad(function: &str, reason: impl Into<String>) -> Failure {
    Failure::Torch(Error::BadRebuild { function: function.to_owned(), reason: reason.into() })
}

/// A tensor's sizes or strides: up to [`Dims::INLINE`] of them without an allocation.
struct Dims {
    inline: [usize; Dims::INLINE],
    len: usize,
    more: Vec<usize>,
}

impl Dims {
    const INLINE: usize = 8;

    fn new() -> Self {
        Dims { inline: [0; Dims::INLINE], len: 0, more: Vec::new() }
    }

    fn push(&mut self, v: usize) {
        match self.inline.get_mut(self.len) {
            Some(slot) if self.more.is_empty() => *slot = v,
            _ => {
                if self.more.is_empty() {
                    self.more.extend_from_slice(&self.inline);
                }
                self.more.push(v);
            }
        }
        self.len += 1;
    }

    fn as_slice(&self) -> &[usize] {
        if self.more.is_empty() { self.inline.get(..self.len).unwrap_or_default() } else { &self.more }
    }
}

/// Where a tensor's elements are in its storage.
struct View<'d> {
    size: &'d [usize],
    stride: &'d [usize],
    offset: usize,
}

/// The tensor `_rebuild_tensor*` makes of its arguments.
fn tensor_value(
    function: &str,
    dtype: DType,
    View { size, stride, offset }: View<'_>,
    data: Buffer,
    (conj, neg): (bool, bool),
    requires_grad: bool,
) -> R<Value> {
    let tensor = Tensor::from_parts(dtype, size, stride, offset, data)
        .and_then(|t| t.with_lazy_bits(conj, neg))
        .map_err(|source| Failure::Torch(Error::BadView { function: function.to_owned(), source: Box::new(source) }))?;
    Ok(Value::Tensor(tensor.with_requires_grad(requires_grad)))
}

/// The template of `torch.save`'s tensor record: `_rebuild_tensor_v2(('storage', <class>, key, location,
/// numel), offset, size, stride, requires_grad, OrderedDict())`.
static TEMPLATES: [Template; 1] = [Template {
    pattern: Pattern::Reduce(
        &Pattern::Global("torch._utils", "_rebuild_tensor_v2"),
        &Pattern::Tuple(&[
            Pattern::PersistentId(&Pattern::Tuple(&[
                Pattern::StrEq("storage"),
                Pattern::AnyGlobal,
                Pattern::Str,
                Pattern::Str,
                Pattern::Int,
            ])),
            Pattern::Int,
            Pattern::Ints,
            Pattern::Ints,
            Pattern::Bool,
            Pattern::Reduce(&Pattern::Global("collections", "OrderedDict"), &Pattern::Tuple(&[])),
        ]),
    ),
}];

impl<'a> TorchBuilder<'_, 'a> {
    /// [`storage_class_dtype`] of a storage class named in the input (Python 2 names mapped first),
    /// remembered by where the names are.
    fn class_dtype(&mut self, module: &'a str, name: &'a str) -> R<DType> {
        let at = (module.as_ptr() as usize, name.as_ptr() as usize);
        if let Some(&(_, d)) = self.class_dtypes.iter().find(|(k, _)| *k == at) {
            return Ok(d);
        }
        let (m, n) = ckpt_pickle::normalize_global(module, name);
        let dtype = storage_class_dtype(&m, &n)?;
        if self.class_dtypes.len() < 64 {
            self.class_dtypes.push((at, dtype));
        }
        Ok(dtype)
    }

    fn global_of(&self, t: &T<'_>) -> Option<&Global> {
        match t {
            T::Global(id) => self.globals.get(*id as usize),
            T::Handle(h) => self.shelf.get(*h).and_then(|t| match t {
                T::Global(id) => self.globals.get(*id as usize),
                _ => None,
            }),
            _ => None,
        }
    }

    /// The object behind a handle, or `t` itself (for looking, not changing).
    fn look<'t>(&'t self, t: &'t T<'a>) -> &'t T<'a> {
        match t {
            T::Handle(h) => self.shelf.get(*h).unwrap_or(t),
            _ => t,
        }
    }

    /// The items of a tuple or list (through a handle); nothing for anything else.
    fn seq_items<'t>(&'t self, v: &'t T<'a>) -> &'t [T<'a>] {
        match self.look(v) {
            T::Tuple(items) | T::List(items) => items,
            _ => &[],
        }
    }

    /// Moves what may become a mutable object inside the tuple `v` (lists, dicts, calls, finished objects;
    /// through nested tuples) to the shelf, each replaced by its handle.
    fn shelve_inside(&mut self, v: &mut T<'a>) -> R<()> {
        let mut stack: Vec<&mut T<'a>> = Vec::new();
        if let T::Tuple(items) = v {
            stack.extend(items.iter_mut());
        }
        while let Some(c) = stack.pop() {
            match c {
                T::Tuple(items) => stack.extend(items.iter_mut()),
                T::List(_) | T::Dict(_) | T::Call(_) => {
                    let h = self.shelf.put(std::mem::replace(c, T::None))?;
                    *c = T::Handle(h);
                }
                T::V(value) if value.is_mutable() => {
                    let h = self.shelf.put(std::mem::replace(c, T::None))?;
                    *c = T::Handle(h);
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn new_global(&mut self, module: &str, name: &str) -> R<u32> {
        let (module, name) = ckpt_pickle::normalize_global(module, name);
        let value = match DType::from_torch_name(&name).filter(|_| module == "torch") {
            Some(d) if !name.ends_with("Storage") => Value::DType(d),
            _ => Value::Global { module: module.clone(), name: name.clone() },
        };
        let id = u32::try_from(self.globals.len()).map_err(|_| bad("pickle", "too many globals"))?;
        let known = known(&module, &name);
        let storage = storage_class_dtype(&module, &name).ok();
        self.globals.push(Global { value, known, storage, module, name });
        Ok(id)
    }

    /// The finished value of `root`, with every shelved object placed (see the module docs).
    fn finish_root(&mut self, root: T<'a>, max_depth: usize, end: usize) -> R<Value> {
        let root = self.finish(root)?;
        if self.shelf.is_empty() {
            return Ok(root);
        }
        // Rules may look through handles in arguments while the shelved objects are finished: they look at
        // the objects as the pickle left them.
        let snapshot = self.shelf.clone();
        let shelf = std::mem::replace(&mut self.shelf, snapshot);
        let finished = shelf.try_map(|t| self.finish(t))?;
        Ok(finished.splice::<CoreTree>(root, max_depth.min(usize::from(u16::MAX - 1)), end)?)
    }

    /// The value `t` becomes.
    fn finish(&mut self, t: T<'a>) -> R<Value> {
        Ok(match t {
            T::None => Value::None,
            T::Bool(b) => Value::Bool(b),
            T::Int(i) => Value::Int(i),
            T::Float(f) => Value::Float(f),
            T::Str(s) => Value::Str(s.into_owned()),
            T::Global(id) => self.globals.get(id as usize).map_or(Value::None, |g| g.value.clone()),
            T::Tuple(items) => Value::Tuple(self.finish_all(items)?),
            T::List(items) => Value::List(self.finish_all(items)?),
            // Python's dict: a repeated key keeps its first position and takes its last value.
            T::Dict(pairs) => Value::Dict(Dict::from_python_items(DictKind::Dict, self.finish_pairs(pairs)?)),
            T::Call(p) => self.rebuild(*p)?,
            T::Storage(dtype, data) => Value::Storage { dtype, data },
            T::V(v) => *v,
            // Placed by the splice at the end.
            T::Handle(h) => Value::Ref(h),
        })
    }

    fn finish_ref(&mut self, t: &T<'a>) -> R<Value> {
        let t = self.look(t).clone();
        self.finish(t)
    }

    fn finish_all(&mut self, items: Vec<T<'a>>) -> R<Vec<Value>> {
        let mut out = Vec::with_capacity(items.len());
        for t in items {
            out.push(self.finish(t)?);
        }
        Ok(out)
    }

    fn finish_pairs(&mut self, pairs: Vec<(T<'a>, T<'a>)>) -> R<Vec<(Value, Value)>> {
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            out.push((self.finish(k)?, self.finish(v)?));
        }
        Ok(out)
    }

    /// The value of `t` with the tuples, lists and calls it holds looked at through the shelf, `depth` levels
    /// down (deeper, or an object with state or items: `None`): a rebuild call's arguments as a rule reads
    /// them, without changing what the shelf holds.
    fn resolve(&mut self, t: &T<'a>, depth: usize) -> R<Value> {
        let t = self.look(t).clone();
        Ok(match t {
            T::Tuple(items) if depth > 0 => Value::Tuple(self.resolve_all(&items, depth - 1)?),
            T::List(items) if depth > 0 => Value::List(self.resolve_all(&items, depth - 1)?),
            T::Call(p) if depth > 0 && p.state.is_none() && p.list_items.is_empty() && p.dict_items.is_empty() => {
                let global = self.global_of(&p.callable).map(|g| (g.known, g.value.clone()));
                match global {
                    Some((Known::Size, _)) => self.rebuild(*p)?,
                    Some((_, callable)) => Value::Object(Box::new(Object {
                        callable,
                        args: self.resolve(&p.args, depth - 1)?,
                        newobj: !p.reduce,
                        state: None,
                        list_items: Vec::new(),
                        dict_items: Vec::new(),
                    })),
                    None => Value::None,
                }
            }
            T::Tuple(_) | T::List(_) | T::Call(_) | T::Dict(_) | T::Handle(_) => Value::None,
            other => self.finish(other)?,
        })
    }

    /// [`TorchBuilder::resolve`] of each of `items`.
    fn resolve_all(&mut self, items: &[T<'a>], depth: usize) -> R<Vec<Value>> {
        items.iter().map(|i| self.resolve(i, depth)).collect()
    }

    /// The object kept symbolically.
    fn generic(&mut self, p: Pending<'a>) -> R<Value> {
        Ok(Value::Object(Box::new(Object {
            callable: self.finish(p.callable)?,
            args: self.finish(p.args)?,
            newobj: !p.reduce,
            state: p.state.map(|s| self.finish(s)).transpose()?,
            list_items: self.finish_all(p.list_items)?,
            dict_items: self.finish_pairs(p.dict_items)?,
        })))
    }

    fn arg<'t>(&'t self, args: &'t [T<'a>], i: usize, function: &str) -> R<&'t T<'a>> {
        args.get(i)
            .map(|a| self.look(a))
            .ok_or_else(|| bad(function, format!("missing argument {i} (got {})", args.len())))
    }

    fn int_arg(&self, args: &[T<'a>], i: usize, function: &str) -> R<usize> {
        match self.arg(args, i, function)? {
            T::Int(v) if *v >= 0 => usize::try_from(*v).map_err(|_| bad(function, "integer out of range")),
            other => {
                Err(bad(function, format!("argument {i} must be a non-negative int, got {}", self.describe(other))))
            }
        }
    }

    fn dims_arg(&self, args: &[T<'a>], i: usize, function: &str) -> R<Dims> {
        let (T::Tuple(items) | T::List(items)) = self.arg(args, i, function)? else {
            return Err(bad(function, format!("argument {i} must be a tuple of ints")));
        };
        let mut dims = Dims::new();
        for d in items {
            match d {
                T::Int(v) if *v >= 0 => {
                    dims.push(usize::try_from(*v).map_err(|_| bad(function, "dimension out of range"))?);
                }
                other => {
                    return Err(bad(
                        function,
                        format!("dimension must be a non-negative int, got {}", self.describe(other)),
                    ));
                }
            }
        }
        Ok(dims)
    }

    fn bool_arg(&self, args: &[T<'a>], i: usize, function: &str) -> R<bool> {
        match self.arg(args, i, function)? {
            T::Bool(b) => Ok(*b),
            T::Int(v) => Ok(*v != 0),
            other => Err(bad(function, format!("argument {i} must be a bool, got {}", self.describe(other)))),
        }
    }

    /// A short description of a value for messages.
    fn describe(&self, t: &T<'_>) -> String {
        match t {
            T::None => "None".into(),
            T::Bool(b) => format!("{b}"),
            T::Int(i) => format!("{i}"),
            T::Float(f) => format!("{f}"),
            T::Str(s) => format!("{s:?}"),
            T::Global(id) => {
                self.globals.get(*id as usize).map_or_else(|| "a global".into(), |g| format!("{}.{}", g.module, g.name))
            }
            T::Tuple(_) => "a tuple".into(),
            T::List(_) => "a list".into(),
            T::Dict(_) => "a dict".into(),
            T::Call(_) => "an object".into(),
            T::Storage(..) => "a storage".into(),
            T::V(v) => format!("a {}", v.type_name()),
            T::Handle(_) => "a shared object".into(),
        }
    }

    /// torch's rebuild of one call.
    #[allow(clippy::too_many_lines)]
    fn rebuild(&mut self, p: Pending<'a>) -> R<Value> {
        let Some(g) = self.global_of(&p.callable) else { return self.generic(p) };
        let known = g.known;
        let plain = p.state.is_none() && p.list_items.is_empty() && p.dict_items.is_empty();
        let reduce = p.reduce;
        match known {
            Known::OrderedDict | Known::Counter if reduce && p.list_items.is_empty() => {
                let kind = if known == Known::Counter { DictKind::Counter } else { DictKind::OrderedDict };
                let first = self.seq_items(&p.args).first().map(|a| self.look(a).clone());
                let mut items = match first {
                    None | Some(T::None) => Vec::new(),
                    Some(T::Dict(pairs)) => self.finish_pairs(pairs)?,
                    Some(T::List(seq) | T::Tuple(seq)) => {
                        let mut items = Vec::with_capacity(seq.len());
                        for pair in &seq {
                            match self.seq_items(pair) {
                                [k, v] => {
                                    let (k, v) = (k.clone(), v.clone());
                                    let k = self.finish_ref(&k)?;
                                    let v = self.finish_ref(&v)?;
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
            Known::Set | Known::FrozenSet if reduce && plain && self.seq_items(&p.args).len() <= 1 => {
                let items = match self.seq_items(&p.args).first() {
                    Some(seq) => {
                        let seq = self.seq_items(seq).to_vec();
                        self.finish_all(seq)?
                    }
                    None => Vec::new(),
                };
                Ok(if known == Known::Set { Value::Set(items) } else { Value::FrozenSet(items) })
            }
            Known::CodecsEncode if reduce && plain => {
                let args: Vec<T<'a>> = self.seq_items(&p.args).iter().map(|a| self.look(a).clone()).collect();
                match args.as_slice() {
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
                }
            }
            Known::ByteArray if reduce && plain => {
                let args: Vec<T<'a>> = self.seq_items(&p.args).iter().map(|a| self.look(a).clone()).collect();
                match args.as_slice() {
                    [] => Ok(Value::ByteArray(Vec::new())),
                    [T::V(v)] if matches!(**v, Value::Bytes(_)) => match &**v {
                        Value::Bytes(b) => Ok(Value::ByteArray(b.clone())),
                        _ => self.generic(p),
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
                }
            }
            Known::Complex if reduce && plain => match self.seq_items(&p.args) {
                [re, im] => {
                    let (re, im) = (re.clone(), im.clone());
                    let re = self.finish_ref(&re)?.as_f64();
                    let im = self.finish_ref(&im)?.as_f64();
                    match (re, im) {
                        (Some(re), Some(im)) => Ok(Value::Complex(re, im)),
                        _ => self.generic(p),
                    }
                }
                _ => self.generic(p),
            },
            Known::Size if reduce && plain => {
                let dims = match self.seq_items(&p.args) {
                    [d] => self
                        .seq_items(d)
                        .iter()
                        .map(|d| if let T::Int(i) = d { Some(*i) } else { None })
                        .collect::<Option<Vec<i64>>>()
                        .filter(|_| matches!(self.look(d), T::Tuple(_) | T::List(_))),
                    _ => None,
                };
                match dims {
                    Some(d) => Ok(Value::Size(d)),
                    None => self.generic(p),
                }
            }
            Known::Device if reduce && plain => {
                let args: Vec<T<'a>> = self.seq_items(&p.args).iter().map(|a| self.look(a).clone()).collect();
                match args.as_slice() {
                    [T::Str(kind)] => Ok(Value::Device { kind: kind.as_ref().to_owned(), index: None }),
                    [T::Str(kind), T::Int(i)] => Ok(Value::Device { kind: kind.as_ref().to_owned(), index: Some(*i) }),
                    _ => self.generic(p),
                }
            }
            Known::RebuildTensor | Known::RebuildTensorV2 | Known::RebuildTensorV3 if reduce && plain => {
                self.dense_tensor(known, p)
            }
            Known::RebuildParameter | Known::RebuildParameterWithState if reduce && plain => {
                let name = if known == Known::RebuildParameter {
                    "_rebuild_parameter"
                } else {
                    "_rebuild_parameter_with_state"
                };
                let args = self.seq_items(&p.args).to_vec();
                let data = self.arg(&args, 0, name)?.clone();
                let data = self.finish(data)?;
                let requires_grad = self.bool_arg(&args, 1, name)?;
                let Value::Tensor(tensor) = data else {
                    return Err(bad(name, format!("data must be a dense tensor, got {}", data.type_name())));
                };
                let state = match known {
                    Known::RebuildParameterWithState => {
                        let s = self.arg(&args, 3, name)?.clone();
                        Some(Box::new(self.finish(s)?))
                    }
                    _ => None,
                };
                Ok(Value::Parameter { tensor: tensor.with_requires_grad(requires_grad), state })
            }
            Known::RebuildFromTypeV2 if reduce && plain => {
                let name = "_rebuild_from_type_v2";
                let args = self.seq_items(&p.args).to_vec();
                let func = self.arg(&args, 0, name)?.clone();
                let class = self.arg(&args, 1, name)?.clone();
                let class = self.finish(class)?;
                let inner_args = self.arg(&args, 2, name)?.clone();
                let state = self.arg(&args, 3, name)?.clone();
                let state = self.finish(state)?;
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
                    return Err(bad(name, format!("rebuilds a {}, not a tensor", tensor.type_name())));
                }
                Ok(Value::TensorWithState { tensor: Box::new(tensor), class: Box::new(class), state: Box::new(state) })
            }
            Known::Numpy if p.list_items.is_empty() && p.dict_items.is_empty() => {
                // numpy's reduce forms: looked at with the objects they name (a dtype numpy shares between its
                // values) in place.
                let args: Vec<T<'a>> = self.seq_items(&p.args).iter().map(|a| self.look(a).clone()).collect();
                let state = p
                    .state
                    .as_ref()
                    .map(|s| self.seq_items(s).iter().map(|a| self.look(a).clone()).collect::<Vec<_>>());
                let probe = Object {
                    callable: self.finish_ref(&p.callable)?,
                    args: Value::Tuple(self.finish_all(args)?),
                    newobj: !p.reduce,
                    state: state.map(|s| self.finish_all(s)).transpose()?.map(Value::Tuple),
                    list_items: Vec::new(),
                    dict_items: Vec::new(),
                };
                match crate::numpy::numpy_of(&probe) {
                    Some(n) => Ok(Value::Numpy(Box::new(n))),
                    None => self.generic(p),
                }
            }
            Known::Opaque(kind) if reduce && plain => {
                let items = self.seq_items(&p.args).to_vec();
                let args = self.resolve_all(&items, 3)?;
                match crate::composite::raise(kind, &args)? {
                    Some(c) => Ok(Value::Composite(Box::new(c))),
                    None => match self.generic(p)? {
                        Value::Object(object) => Ok(Value::OpaqueTensor { kind, object }),
                        other => Ok(other),
                    },
                }
            }
            Known::Opaque(kind) => match self.generic(p)? {
                Value::Object(object) => Ok(Value::OpaqueTensor { kind, object }),
                other => Ok(other),
            },
            _ => self.generic(p),
        }
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])`,
    /// `_rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])` and the
    /// torch ≤ 0.3 `_rebuild_tensor(storage, offset, size, stride)`.
    fn dense_tensor(&mut self, known: Known, p: Pending<'a>) -> R<Value> {
        let name = match known {
            Known::RebuildTensor => "_rebuild_tensor",
            Known::RebuildTensorV2 => "_rebuild_tensor_v2",
            _ => "_rebuild_tensor_v3",
        };
        let args = self.seq_items(&p.args);
        let (data, storage_dtype) = match self.arg(args, 0, name)? {
            T::Storage(dtype, data) => (data.clone(), *dtype),
            other => return Err(bad(name, format!("argument 0 must be a storage, got {}", self.describe(other)))),
        };
        let offset = self.int_arg(args, 1, name)?;
        let size = self.dims_arg(args, 2, name)?;
        let stride = self.dims_arg(args, 3, name)?;
        let (dtype, requires_grad, metadata) = match known {
            Known::RebuildTensor => (storage_dtype, false, None),
            Known::RebuildTensorV2 => (storage_dtype, self.bool_arg(args, 4, name)?, args.get(6)),
            _ => {
                let dtype = match self.arg(args, 6, name)? {
                    g @ T::Global(_) => match self.global_of(g).map(|g| &g.value) {
                        Some(Value::DType(d)) => *d,
                        Some(Value::Global { name: n, .. }) => {
                            return Err(Failure::Torch(Error::UnknownDType(n.clone())));
                        }
                        _ => return Err(bad(name, "argument 6 must be a dtype")),
                    },
                    other => {
                        return Err(bad(name, format!("argument 6 must be a dtype, got {}", self.describe(other))));
                    }
                };
                (dtype, self.bool_arg(args, 4, name)?, args.get(7))
            }
        };
        // Metadata {'conj': True} / {'neg': True}: torch's lazy conjugation and negation bits, kept on the
        // tensor (the storage stays shared; reading the data applies them). Anything else stays opaque.
        let (mut conj, mut neg) = (false, false);
        if let Some(T::Dict(items)) = metadata.map(|m| self.look(m)) {
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
        let view = View { size: size.as_slice(), stride: stride.as_slice(), offset };
        tensor_value(name, dtype, view, data, (conj, neg), requires_grad)
    }

    /// The storage a persistent id names: `('storage', class, key, location, numel)` (what `torch.save`
    /// writes), or with a sixth item, the legacy format's view `(view_key, offset, size)` of the storage.
    fn storage(&mut self, pid: &T<'a>) -> R<T<'a>> {
        let items: Vec<T<'a>> = self.seq_items(pid).iter().map(|i| self.look(i).clone()).collect();
        if !matches!(self.look(pid), T::Tuple(_)) {
            return Err(Failure::Torch(Error::BadPersistentId(format!(
                "expected a tuple, got {}",
                self.describe(pid)
            ))));
        }
        if let [T::Str(tag), _id, function, args] = items.as_slice() {
            if tag == "reduce_package" {
                return self.reduce_package(function, args);
            }
        }
        let (tag, class, key, numel, view) = match items.as_slice() {
            // (torch.package names its storages by int keys.)
            [T::Str(tag), class, key @ (T::Str(_) | T::Int(_)), _location, T::Int(numel)] => {
                (tag, class, key, *numel, None)
            }
            [T::Str(tag), class, key @ (T::Str(_) | T::Int(_)), _location, T::Int(numel), view] => {
                (tag, class, key, *numel, Some(view))
            }
            [T::Str(tag), ..] if tag != "storage" => {
                return Err(Failure::Torch(Error::BadPersistentId(format!("tag {tag:?} is not 'storage'"))));
            }
            _ => {
                return Err(Failure::Torch(Error::BadPersistentId(format!(
                    "expected ('storage', class, key, location, numel), got {} items",
                    items.len()
                ))));
            }
        };
        if tag != "storage" {
            return Err(Failure::Torch(Error::BadPersistentId(format!("tag {tag:?} is not 'storage'"))));
        }
        let key: Cow<'_, str> = match key {
            T::Int(i) => Cow::Owned(i.to_string()),
            T::Str(s) => Cow::Borrowed(s.as_ref()),
            other => {
                return Err(Failure::Torch(Error::BadPersistentId(format!("storage key {}", self.describe(other)))));
            }
        };
        let dtype = match self.global_of(class) {
            Some(g) => match g.storage {
                Some(d) => d,
                None => {
                    return Err(Failure::Torch(Error::UnknownStorageType {
                        module: g.module.clone(),
                        name: g.name.clone(),
                    }));
                }
            },
            None => {
                return Err(Failure::Torch(Error::BadPersistentId(format!(
                    "storage class is not a global: {}",
                    self.describe(class)
                ))));
            }
        };
        let data = self.storages.storage(dtype, &key, numel)?;
        let data = match view {
            None | Some(T::None) => data,
            Some(T::Tuple(v)) => match v.as_slice() {
                [_view_key, T::Int(offset), T::Int(size)] => {
                    let es = dtype.size() as i64;
                    let start = offset.checked_mul(es).and_then(|s| usize::try_from(s).ok());
                    let len = size.checked_mul(es).and_then(|s| usize::try_from(s).ok());
                    match (start, len) {
                        (Some(s), Some(l)) => data.slice_len(s, l)?,
                        _ => return Err(Failure::Torch(Error::Legacy(format!("storage view of {key} out of range")))),
                    }
                }
                _ => {
                    return Err(Failure::Torch(Error::BadPersistentId(format!("bad view metadata for storage {key}"))));
                }
            },
            Some(other) => {
                return Err(Failure::Torch(Error::BadPersistentId(format!(
                    "bad view metadata {}",
                    self.describe(other)
                ))));
            }
        };
        Ok(T::Storage(dtype, data))
    }

    /// `torch.storage._load_from_bytes(b)`: `torch.load(io.BytesIO(b))`, with `b` read by this crate's reader
    /// (a legacy or ZIP `torch.save` stream; a plain pickle is not one). A storage stays a storage for the
    /// `_rebuild_tensor_v2` around it; anything else the stream holds is its value.
    fn load_from_bytes(&mut self, p: &Pending<'a>) -> R<T<'a>> {
        let name = "_load_from_bytes";
        let args = self.seq_items(&p.args).to_vec();
        let arg = self.arg(&args, 0, name)?.clone();
        let bytes = match self.finish_ref(&arg)? {
            Value::Bytes(b) | Value::ByteArray(b) => b,
            other => return Err(bad(name, format!("argument 0 must be bytes, got {}", other.type_name()))),
        };
        if self.nesting >= MAX_NESTING {
            return Err(Failure::Torch(Error::NestedTooDeep { max: MAX_NESTING }));
        }
        let len = bytes.len();
        let fail = |source: Error| Failure::Torch(Error::LoadFromBytes { len, source: Box::new(source) });
        match crate::detect::detect(&bytes) {
            Ok(crate::detect::Container::Pickle) => {
                let head = bytes.get(..bytes.len().min(16)).unwrap_or_default().to_vec();
                return Err(fail(Error::Unrecognized { head }));
            }
            Err(e) => return Err(fail(e)),
            Ok(_) => {}
        }
        let Some(read) = self.nested_read else {
            return Err(bad(name, "a torch.save stream inside a pickle read without a torch.save reader"));
        };
        let mut options =
            ReadOptions::default().with_limits(self.pickle.limits).with_py2_strings(self.pickle.py2_strings);
        options.nesting = self.nesting + 1;
        let buffer = Buffer::from_vec(bytes);
        let value = read(&buffer, &options).map_err(fail)?;
        Ok(match value {
            Value::Storage { dtype, data } => T::Storage(dtype, data),
            other => T::V(Box::new(other)),
        })
    }

    /// torch.package's `('reduce_package', id, function, args)` persistent id: what the storage source makes
    /// of `function` and `args` (a TorchScript module's weights), or the call kept as an opaque object.
    fn reduce_package(&mut self, function: &T<'a>, args: &T<'a>) -> R<T<'a>> {
        let Some(g) = self.global_of(function) else {
            let what = format!("reduce_package function is not a global: {}", self.describe(function));
            return Err(Failure::Torch(Error::BadPersistentId(what)));
        };
        let (module, name, callable) = (g.module.clone(), g.name.clone(), g.value.clone());
        let args = self.finish_ref(args)?;
        let value = match self.storages.reduce_package((&module, &name), &args) {
            Some(made) => made?,
            None => Value::Object(Box::new(Object {
                callable,
                args,
                newobj: false,
                state: None,
                list_items: Vec::new(),
                dict_items: Vec::new(),
            })),
        };
        Ok(T::V(Box::new(value)))
    }

    /// The object behind a handle, or `t` itself, to change.
    fn target<'t>(&'t mut self, t: &'t mut T<'a>) -> &'t mut T<'a> {
        match t {
            T::Handle(h) => {
                let h = *h;
                match self.shelf.get_mut(h) {
                    Some(v) => v,
                    None => t,
                }
            }
            _ => t,
        }
    }
}

impl<'a> Builder<'a> for TorchBuilder<'_, 'a> {
    type Value = T<'a>;
    type Error = Failure;

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
        let text = |b: &Self, t: &T<'a>| match b.look(t) {
            T::Str(s) => s.to_string(),
            _ => String::new(),
        };
        let (m, n) = (text(self, &module), text(self, &name));
        self.new_global(&m, &n).map(T::Global)
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
        self.storage(&pid)
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
        // A tensor's rebuild is applied at once: its arguments are final (the machine hands over owned values,
        // and shared ones are immutable tuples here), and nothing the pickle may still do to the result (a
        // `__setstate__`, appended or set items) is something torch's tensors take.
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
        if p.reduce && self.global_of(&p.callable).is_some_and(|g| g.known == Known::LoadFromBytes) {
            return self.load_from_bytes(&p);
        }
        Ok(T::Call(Box::new(p)))
    }

    fn append(&mut self, target: &mut T<'a>, items: Items<'_, T<'a>>) -> R<()> {
        match self.target(target) {
            T::List(v) => v.extend(items),
            T::Call(p) => p.list_items.extend(items),
            other => {
                let what = format!("list items appended to {}", describe_static(other));
                return Err(bad("pickle", what));
            }
        }
        Ok(())
    }

    fn set_items(&mut self, target: &mut T<'a>, pairs: Pairs<'_, T<'a>>) -> R<()> {
        match self.target(target) {
            T::Dict(v) => v.extend(pairs),
            T::Call(p) => p.dict_items.extend(pairs),
            other => {
                let what = format!("dict items set on {}", describe_static(other));
                return Err(bad("pickle", what));
            }
        }
        Ok(())
    }

    fn add_items(&mut self, target: &mut T<'a>, items: Items<'_, T<'a>>) -> R<()> {
        let items = self.finish_all(items.collect())?;
        match self.target(target) {
            T::V(v) => match &mut **v {
                Value::Set(v) => v.extend(items),
                _ => return Err(bad("pickle", "set items added to a value that is not a set")),
            },
            _ => return Err(bad("pickle", "set items added to a value that is not a set")),
        }
        Ok(())
    }

    fn build(&mut self, target: &mut T<'a>, state: T<'a>) -> R<()> {
        if matches!(self.target(target), T::V(v) if v.is_tensor_like()) {
            // `Tensor.__setstate__(state)` on a rebuilt tensor: a tensor with a Python state, as
            // `_rebuild_from_type_v2` makes one.
            let state = self.finish(state)?;
            let t = self.target(target);
            if let T::V(v) = t {
                let tensor = std::mem::replace(&mut **v, Value::None);
                **v = Value::TensorWithState {
                    tensor: Box::new(tensor),
                    class: Box::new(Value::Global { module: "torch".into(), name: "Tensor".into() }),
                    state: Box::new(state),
                };
            }
            return Ok(());
        }
        match self.target(target) {
            T::Call(p) => {
                // A second state update (`__setstate__`) updates a dict state made for this object (`__dict__.update`).
                match (p.state.as_mut(), state) {
                    (Some(T::Dict(acc)), T::Dict(more)) => acc.extend(more),
                    (_, state) => p.state = Some(state),
                }
            }
            other => {
                let what = format!("__setstate__ on {}", describe_static(other));
                return Err(bad("pickle", what));
            }
        }
        Ok(())
    }

    fn share(&mut self, v: &mut T<'a>) -> R<T<'a>> {
        Ok(match v {
            T::None => T::None,
            T::Bool(b) => T::Bool(*b),
            T::Int(i) => T::Int(*i),
            T::Float(f) => T::Float(*f),
            T::Str(Cow::Borrowed(s)) => T::Str(Cow::Borrowed(s)),
            T::Global(g) => T::Global(*g),
            T::Storage(d, b) => T::Storage(*d, b.clone()),
            T::Handle(h) => T::Handle(*h),
            // A finished tensor is a handle to its storage already: copies share the bytes.
            T::V(value) if value.is_tensor_like() => T::V(value.clone()),
            // A tuple is copied to each place it is fetched to: the objects it holds go to the shelf first, so
            // that the copies hold the one object each (Python's identity).
            T::Tuple(_) => {
                self.shelve_inside(v)?;
                let h = self.shelf.put(std::mem::replace(v, T::None))?;
                *v = T::Handle(h);
                T::Handle(h)
            }
            _ => {
                let h = self.shelf.put(std::mem::replace(v, T::None))?;
                *v = T::Handle(h);
                T::Handle(h)
            }
        })
    }

    fn templates(&self) -> &'static [Template] {
        if self.templates { &TEMPLATES } else { &[] }
    }

    fn template(&mut self, _template: usize, c: &mut Captures<'a, '_, T<'a>>) -> R<T<'a>> {
        // What `storage` and `dense_tensor` make of the same arguments.
        let malformed = || bad("_rebuild_tensor_v2", "malformed tensor record");
        let (module, name) = c.global().ok_or_else(malformed)?;
        let key = c.str().ok_or_else(malformed)?;
        let _location = c.str().ok_or_else(malformed)?;
        let numel = c.int().ok_or_else(malformed)?;
        let offset = c.int().ok_or_else(malformed)?;
        let size = c.ints().ok_or_else(malformed)?;
        let stride = c.ints().ok_or_else(malformed)?;
        let requires_grad = c.bool().ok_or_else(malformed)?;
        let dtype = self.class_dtype(module, name)?;
        let data = self.storages.storage(dtype, key, numel)?;
        let function = "_rebuild_tensor_v2";
        let offset = usize::try_from(offset)
            .map_err(|_| bad(function, format!("argument 1 must be a non-negative int, got {offset}")))?;
        let dims = |ints: &ckpt_pickle::Ints| -> R<Dims> {
            let mut d = Dims::new();
            for &v in ints.as_slice() {
                d.push(
                    usize::try_from(v)
                        .map_err(|_| bad(function, format!("dimension must be a non-negative int, got {v}")))?,
                );
            }
            Ok(d)
        };
        let (size, stride) = (dims(&size)?, dims(&stride)?);
        let view = View { size: size.as_slice(), stride: stride.as_slice(), offset };
        let tensor = tensor_value(function, dtype, view, data, (false, false), requires_grad)?;
        self.templated += 1;
        Ok(T::V(Box::new(tensor)))
    }
}

fn describe_static(t: &T<'_>) -> &'static str {
    match t {
        T::V(v) => v.type_name(),
        T::Storage(..) => "a storage",
        T::Str(_) => "a str",
        _ => "a value that does not take it",
    }
}

/// [`Tree`] for checkpoint [`Value`]s: how [`Shelf::splice`] places shared objects.
struct CoreTree;

impl Tree<Value> for CoreTree {
    type Shape = ckpt_tensor::ValueShape;

    fn handle(v: &Value) -> Option<u32> {
        match v {
            Value::Ref(h) => Some(*h),
            _ => None,
        }
    }

    fn children<'v>(v: &'v Value, out: &mut Vec<&'v Value>) {
        v.children_into(out);
    }

    fn split(v: Value) -> Result<(Self::Shape, Vec<Value>), Value> {
        v.into_parts().map_err(|leaf| *leaf)
    }

    fn join(shape: Self::Shape, children: Vec<Value>) -> Value {
        Value::from_parts(shape, children)
    }

    fn is_mutable(v: &Value) -> bool {
        v.is_mutable()
    }

    fn shared(id: u32, v: Value) -> Value {
        Value::Shared { id, value: Box::new(v) }
    }

    fn reference(id: u32) -> Value {
        Value::Ref(id)
    }

    fn copy(v: &Value) -> Value {
        v.clone()
    }

    fn placeholder() -> Value {
        Value::None
    }
}
