//! Decoding `.metadata`: the DCP classes built straight from the pickle as the pickle machine runs it, each
//! object when its state is set (`__setstate__`), so no generic tree of the whole pickle (hundreds of
//! thousands of objects for a large job) is held. Strings stay borrowed from the input until the structs own
//! them; classes are recognised once per global; chunks put into a list and `(MetadataIndex, _StorageInfo)`
//! pairs set into a dict move into typed vectors at once. The three objects every chunk has
//! (`ChunkStorageMetadata`, `MetadataIndex`, `_StorageInfo`) are [`Template`]s, which the machine reads
//! straight from their bytes.
//!
//! Nothing is imported or executed. What torch does not write is an error naming where it is
//! (`state_dict_metadata["w"].properties.dtype`): an object finds a problem when its state is set, before
//! anything says where it sits, so it carries the problem with a context relative to itself, and each object
//! that takes it adds its own place, up to the [`Metadata`].

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::Path;

use ckpt_pickle::{
    Builder, Call, CallKind, Captures, Items, Pairs, Pattern, Sequence, Shelf, Template, normalize_global,
};
use ckpt_tensor::{DType, PathItem, Value};

use super::{
    ChunkStorageMetadata, FILESYSTEM_MODULE, LEGACY_PROPERTIES_MODULE, METADATA_MODULE, MemoryFormat, Metadata,
    MetadataIndex, PlannerData, StorageInfo, StorageMeta, StorageMetadata, TensorProperties, TensorStorageMetadata,
};
use crate::error::{Error, Result};

impl Metadata {
    /// Decodes a `.metadata` pickle (protocols 2 to 5). `path` names the file in errors.
    ///
    /// # Errors
    /// [`crate::Error::MetadataPickle`] for a truncated or corrupt pickle; [`crate::Error::UnexpectedClass`]
    /// when an unknown class appears where a DCP class is expected; [`crate::Error::BadField`],
    /// [`crate::Error::MissingField`] and [`crate::Error::UnknownDType`] for malformed fields.
    pub fn from_pickle(bytes: &[u8], path: &std::path::Path) -> crate::Result<Metadata> {
        Self::from_pickle_with(bytes, path, &ckpt_pickle::Limits::default())
    }

    /// [`Metadata::from_pickle`] with explicit pickle decoder limits (for metadata of tens of millions of
    /// chunks, beyond the defaults).
    ///
    /// # Errors
    /// As [`Metadata::from_pickle`].
    pub fn from_pickle_with(
        bytes: &[u8],
        path: &std::path::Path,
        limits: &ckpt_pickle::Limits,
    ) -> crate::Result<Metadata> {
        decode(bytes, path, limits)
    }

    /// The fuzz targets' oracle: `bytes` decoded with the per-chunk objects read straight from the bytes
    /// (templates) and all made by the pickle machine; panics unless both give the same metadata or the same
    /// error (`cargo fuzz` builds with `--cfg fuzzing`; not API).
    #[cfg(fuzzing)]
    #[doc(hidden)]
    pub fn templates_agree(bytes: &[u8], limits: &ckpt_pickle::Limits) {
        let path = std::path::Path::new(".metadata");
        let render = |r: crate::Result<Metadata>| match r {
            Ok(m) => format!("{m:?}"),
            Err(e) => format!("{e:?}"),
        };
        let with = render(decode_with(bytes, path, limits, true));
        let without = render(decode_with(bytes, path, limits, false));
        assert_eq!(with, without, "the chunk templates and the machine decode differently");
    }
}

/// Decodes a `.metadata` pickle; `path` names the file in errors.
pub(super) fn decode(bytes: &[u8], path: &Path, limits: &ckpt_pickle::Limits) -> Result<Metadata> {
    decode_with(bytes, path, limits, true)
}

/// [`decode`], with the per-chunk objects read straight from the bytes (`templates`) or all made by the
/// machine, for tests that compare the two.
pub(super) fn decode_with(
    bytes: &[u8],
    path: &Path,
    limits: &ckpt_pickle::Limits,
    templates: bool,
) -> Result<Metadata> {
    let mut b = DcpBuilder { templates, ..DcpBuilder::default() };
    let options = ckpt_pickle::Options::from(*limits);
    let root = match ckpt_pickle::run(bytes, &options, &mut b) {
        Ok((root, _)) => root,
        Err(Failure::Pickle(source)) => return Err(Error::MetadataPickle { path: path.to_path_buf(), source }),
    };
    b.root(root).map_err(|p| p.error(path))
}

/// The classes this decoder knows, after `normalize_global` and the `copyreg` constructors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Metadata,
    TensorStorage,
    BytesStorage,
    Chunk,
    Properties { legacy: bool },
    Index,
    Info,
    StorageMeta,
    MemFormat,
    Size,
    Other,
}

fn class_of(module: &str, name: &str) -> Class {
    match (module, name) {
        (METADATA_MODULE, "Metadata") => Class::Metadata,
        (METADATA_MODULE, "TensorStorageMetadata") => Class::TensorStorage,
        (METADATA_MODULE, "BytesStorageMetadata") => Class::BytesStorage,
        (METADATA_MODULE, "ChunkStorageMetadata") => Class::Chunk,
        (METADATA_MODULE, "TensorProperties") => Class::Properties { legacy: false },
        (LEGACY_PROPERTIES_MODULE, "TensorProperties") => Class::Properties { legacy: true },
        (METADATA_MODULE, "MetadataIndex") => Class::Index,
        (FILESYSTEM_MODULE, "_StorageInfo") => Class::Info,
        (METADATA_MODULE, "StorageMeta") => Class::StorageMeta,
        (METADATA_MODULE, "_MEM_FORMAT_ENCODING") | (LEGACY_PROPERTIES_MODULE, "MEM_FORMAT_ENCODING") => {
            Class::MemFormat
        }
        ("torch", "Size") => Class::Size,
        _ => Class::Other,
    }
}

/// The Python name of a class, for messages.
fn class_name(class: Class) -> &'static str {
    match class {
        Class::Metadata => "torch.distributed.checkpoint.metadata.Metadata",
        Class::TensorStorage => "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
        Class::BytesStorage => "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
        Class::Chunk => "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
        Class::Properties { legacy: false } => "torch.distributed.checkpoint.metadata.TensorProperties",
        Class::Properties { legacy: true } => "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
        Class::Index => "torch.distributed.checkpoint.metadata.MetadataIndex",
        Class::Info => "torch.distributed.checkpoint.filesystem._StorageInfo",
        Class::StorageMeta => "torch.distributed.checkpoint.metadata.StorageMeta",
        Class::MemFormat => "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
        Class::Size => "torch.Size",
        Class::Other => "an unknown class",
    }
}

/// A global as written, and what it names after Python 2 → 3 mapping.
#[derive(Debug)]
struct Global<'a> {
    module: Cow<'a, str>,
    name: Cow<'a, str>,
    /// The class of `normalize_global(module, name)`.
    class: Class,
    /// Whether it is `copyreg._reconstructor` or `copyreg.__newobj__` (after mapping).
    copyreg: bool,
}

/// What a value this decoder does not model is, for messages.
#[derive(Debug, Clone, Copy)]
enum Desc {
    /// A value of this Python type (`float`, `bytes`, `set`, ...).
    Type(&'static str),
    /// An object whose callable is the global with this id (or of an unnamed class).
    Object(Option<u32>),
}

/// What went wrong, and where relative to the object that found it (`["properties", "dtype"]`).
#[derive(Debug, Clone)]
struct Problem {
    kind: ProblemKind,
    context: Vec<String>,
}

#[derive(Debug, Clone)]
enum ProblemKind {
    UnexpectedClass { expected: &'static str, found: String },
    BadField { expected: String, found: String },
    MissingField { field: &'static str },
    UnknownDType { name: String },
}

impl Problem {
    fn at(kind: ProblemKind, context: &str) -> Box<Problem> {
        Box::new(Problem { kind, context: if context.is_empty() { Vec::new() } else { vec![context.to_owned()] } })
    }

    /// The problem, found inside a value placed at `place` of the object that reports it.
    fn within(mut self: Box<Self>, place: &str) -> Box<Problem> {
        if !place.is_empty() {
            self.context.insert(0, place.to_owned());
        }
        self
    }

    fn error(self, path: &Path) -> Error {
        let path = path.to_path_buf();
        let context = self.context.join(".");
        match self.kind {
            ProblemKind::UnexpectedClass { expected, found } => {
                Error::UnexpectedClass { path, context, expected, found }
            }
            ProblemKind::BadField { expected, found } => Error::BadField { path, context, expected, found },
            ProblemKind::MissingField { field } => Error::MissingField { path, context, field },
            ProblemKind::UnknownDType { name } => Error::UnknownDType { path, context, name },
        }
    }
}

/// Why the machine stopped: the pickle's error (a problem with a DCP class is a value, reported where it
/// is placed).
#[derive(Debug)]
enum Failure {
    Pickle(ckpt_pickle::Error),
}

impl From<ckpt_pickle::Error> for Failure {
    fn from(e: ckpt_pickle::Error) -> Self {
        Failure::Pickle(e)
    }
}

type R<T> = std::result::Result<T, Failure>;
type P<T> = std::result::Result<T, Box<Problem>>;

/// A value under construction. Made structs live in the builder's tables until their container takes them.
#[derive(Debug, Clone)]
enum D<'a> {
    None,
    Bool(bool),
    Int(i64),
    Str(Cow<'a, str>),
    /// Index into the builder's globals.
    Global(u32),
    Tuple(Vec<D<'a>>),
    /// A non-empty tuple of at most [`Ints::CAP`] ints in `0..2^32` (offsets, sizes), without allocating.
    Ints(Ints),
    List(Vec<D<'a>>),
    /// A list of made chunks only.
    Chunks(Vec<ChunkStorageMetadata>),
    Dict(Vec<(D<'a>, D<'a>)>),
    /// A dict of made `(MetadataIndex, _StorageInfo)` pairs only.
    StoragePairs(Vec<(MetadataIndex, StorageInfo)>),
    /// An instance of a DCP class whose state is not set yet.
    New(Class),
    /// `torch.Size(dims)`.
    Size(Vec<usize>),
    /// `_MEM_FORMAT_ENCODING(code)`.
    MemFormat(MemoryFormat),
    /// `torch.serialization._get_layout('torch.strided')`, prefix removed.
    Layout(Cow<'a, str>),
    /// `pathlib.*Path(parts)` as its path string.
    Path(String),
    Properties(u32),
    Chunk(u32),
    Tensor(u32),
    Index(u32),
    Info(u32),
    StorageMeta(u32),
    Metadata(Box<Metadata>),
    /// An object whose state had a problem, reported where the object is placed.
    Invalid(Box<Problem>),
    /// Anything this decoder does not model (floats, bytes, sets, persistent ids, other objects).
    Other(Desc),
    /// An object the pickle refers to from several places, on the shelf.
    Handle(u32),
}

/// The items of a short tuple of small non-negative ints, inline.
#[derive(Debug, Clone, Copy)]
struct Ints {
    len: u8,
    v: [u32; Ints::CAP],
}

impl Ints {
    const CAP: usize = 5;

    /// The ints, if every item is one in range and there are 1 to `CAP` of them.
    fn of(items: &[D<'_>]) -> Option<Ints> {
        if items.is_empty() || items.len() > Self::CAP {
            return None;
        }
        let mut v = [0u32; Self::CAP];
        for (slot, item) in v.iter_mut().zip(items) {
            let D::Int(i) = item else { return None };
            *slot = u32::try_from(*i).ok()?;
        }
        Some(Ints { len: items.len() as u8, v })
    }

    fn as_slice(&self) -> &[u32] {
        self.v.get(..usize::from(self.len)).unwrap_or_default()
    }
}

/// A table of made structs: a slot is taken once, then reused.
#[derive(Debug)]
struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { items: Vec::new(), free: Vec::new() }
    }
}

impl<T: Clone> Slab<T> {
    fn put(&mut self, v: T) -> R<u32> {
        if let Some(slot) = self.free.pop() {
            if let Some(s) = self.items.get_mut(slot as usize) {
                *s = Some(v);
                return Ok(slot);
            }
        }
        let slot = u32::try_from(self.items.len()).map_err(|_| too_many())?;
        self.items.push(Some(v));
        Ok(slot)
    }

    /// The struct in `slot`: moved out when the value held it alone, copied when it came through a handle
    /// (another place may take it too).
    fn take(&mut self, slot: u32, shared: bool) -> Option<T> {
        if shared {
            return self.items.get(slot as usize)?.clone();
        }
        let v = self.items.get_mut(slot as usize)?.take()?;
        self.free.push(slot);
        Some(v)
    }
}

fn too_many() -> Failure {
    Failure::Pickle(ckpt_pickle::Error::Limit { what: "DCP objects", limit: u64::from(u32::MAX), offset: 0 })
}

#[derive(Default)]
struct DcpBuilder<'a> {
    globals: Vec<Global<'a>>,
    properties: Slab<TensorProperties>,
    chunks: Slab<ChunkStorageMetadata>,
    tensors: Slab<TensorStorageMetadata>,
    indexes: Slab<MetadataIndex>,
    infos: Slab<StorageInfo>,
    storage_metas: Slab<StorageMeta>,
    shelf: Shelf<D<'a>>,
    /// Whether the per-chunk objects are read straight from the bytes.
    templates: bool,
}

fn uint(v: &D<'_>) -> Option<usize> {
    match v {
        D::Int(i) if *i >= 0 => usize::try_from(*i).ok(),
        D::Bool(b) => Some(usize::from(*b)),
        _ => None,
    }
}

fn u64_of(v: &D<'_>) -> Option<u64> {
    match v {
        D::Int(i) if *i >= 0 => u64::try_from(*i).ok(),
        _ => None,
    }
}

fn bool_of(v: &D<'_>) -> Option<bool> {
    match v {
        D::Bool(b) => Some(*b),
        D::Int(i) => Some(*i != 0),
        _ => None,
    }
}

/// The per-chunk objects' templates, by field: a `torch.Size` made here or read from the memo.
const SIZE: Pattern = Pattern::Choice(&[
    Pattern::Reduce(&Pattern::Global("torch", "Size"), &Pattern::Tuple(&[Pattern::Ints])),
    Pattern::Memo,
]);

static TEMPLATES: [Template; 3] = [
    Template {
        pattern: Pattern::Object {
            class: &Pattern::Global(METADATA_MODULE, "ChunkStorageMetadata"),
            fields: &[("offsets", SIZE), ("sizes", SIZE)],
        },
    },
    Template {
        pattern: Pattern::Object {
            class: &Pattern::Global(METADATA_MODULE, "MetadataIndex"),
            // In the order torch pickles them (another order still reads, reordered).
            fields: &[
                ("fqn", Pattern::Str),
                ("index", Pattern::Choice(&[Pattern::None, Pattern::Int])),
                ("offset", Pattern::Choice(&[Pattern::None, SIZE])),
            ],
        },
    },
    Template {
        pattern: Pattern::Object {
            class: &Pattern::Global(FILESYSTEM_MODULE, "_StorageInfo"),
            fields: &[
                ("relative_path", Pattern::Str),
                ("offset", Pattern::Int),
                ("length", Pattern::Int),
                ("transform_descriptors", Pattern::None),
            ],
        },
    },
];

impl<'a> DcpBuilder<'a> {
    fn global(&self, id: u32) -> Option<&Global<'a>> {
        self.globals.get(id as usize)
    }

    /// `v`, looking through a handle (a copy of the shelved value); whether it came through one.
    fn resolve(&self, v: D<'a>) -> (D<'a>, bool) {
        match v {
            D::Handle(h) => (self.shelf.get(h).cloned().unwrap_or(D::None), true),
            other => (other, false),
        }
    }

    /// `v`, looking through a handle, to read.
    fn look<'v>(&'v self, v: &'v D<'a>) -> &'v D<'a> {
        match v {
            D::Handle(h) => self.shelf.get(*h).unwrap_or(v),
            _ => v,
        }
    }

    /// A short description of a value for messages.
    fn describe(&self, v: &D<'a>) -> String {
        match self.look(v) {
            D::None => "a None".into(),
            D::Bool(_) => "a bool".into(),
            D::Int(i) => format!("the int {i}"),
            D::Str(s) if s.len() <= 40 => format!("the str {s:?}"),
            D::Str(_) => "a str".into(),
            D::Global(id) => match self.global(*id) {
                Some(g) => format!("the global {}.{}", g.module, g.name),
                None => "a global".into(),
            },
            D::Tuple(_) | D::Ints(_) => "a tuple".into(),
            D::List(_) | D::Chunks(_) => "a list".into(),
            D::Dict(_) | D::StoragePairs(_) => "a dict".into(),
            D::New(c) => format!("an object of class {}", class_name(*c)),
            D::Size(_) => "an object of class torch.Size".into(),
            D::MemFormat(_) => format!("an object of class {}", class_name(Class::MemFormat)),
            D::Layout(_) => "an object of class torch.serialization._get_layout".into(),
            D::Path(_) => "an object of class pathlib.Path".into(),
            D::Properties(_) => format!("an object of class {}", class_name(Class::Properties { legacy: false })),
            D::Chunk(_) => format!("an object of class {}", class_name(Class::Chunk)),
            D::Tensor(_) => format!("an object of class {}", class_name(Class::TensorStorage)),
            D::Index(_) => format!("an object of class {}", class_name(Class::Index)),
            D::Info(_) => format!("an object of class {}", class_name(Class::Info)),
            D::StorageMeta(_) => format!("an object of class {}", class_name(Class::StorageMeta)),
            D::Metadata(_) => format!("an object of class {}", class_name(Class::Metadata)),
            D::Invalid(_) => "an invalid object".into(),
            D::Other(Desc::Type(t)) => format!("a {t}"),
            D::Other(Desc::Object(Some(id))) => match self.global(*id) {
                Some(g) => {
                    let (m, n) = normalize_global(&g.module, &g.name);
                    format!("an object of class {m}.{n}")
                }
                None => "an object of an unnamed class".into(),
            },
            D::Other(Desc::Object(None)) => "an object of an unnamed class".into(),
            D::Handle(_) => "a shared object".into(),
        }
    }

    fn bad(&self, context: &str, expected: impl Into<String>, found: &D<'a>) -> Box<Problem> {
        Problem::at(ProblemKind::BadField { expected: expected.into(), found: self.describe(found) }, context)
    }

    fn unexpected(&self, context: &str, expected: &'static str, found: &D<'a>) -> Box<Problem> {
        Problem::at(ProblemKind::UnexpectedClass { expected, found: self.describe(found) }, context)
    }

    fn missing(context: &str, field: &'static str) -> Box<Problem> {
        Problem::at(ProblemKind::MissingField { field }, context)
    }

    /// The class a call instantiates: its callable, or the class argument of the `copyreg` constructors.
    fn class_of_call(&self, callable: &D<'a>, args: &D<'a>) -> Class {
        let D::Global(id) = self.look(callable) else { return Class::Other };
        let Some(g) = self.global(*id) else { return Class::Other };
        if g.copyreg {
            return match self.look(args) {
                D::Tuple(items) => match items.first().map(|i| self.look(i)) {
                    Some(D::Global(cls)) => self.global(*cls).map_or(Class::Other, |c| c.class),
                    _ => Class::Other,
                },
                _ => Class::Other,
            };
        }
        g.class
    }

    /// The state's `(field, value)` pairs, in order (empty when no state was set). `context` is where the object is.
    fn fields(&self, state: D<'a>, context: &str) -> P<Vec<(Cow<'a, str>, D<'a>)>> {
        let pairs = match self.resolve(state).0 {
            D::Dict(pairs) => pairs,
            other => return Err(self.bad(context, "a dict of fields", &other)),
        };
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            match self.resolve(k).0 {
                D::Str(k) => out.push((k, v)),
                other => return Err(self.bad(context, "str field names", &other)),
            }
        }
        Ok(out)
    }

    /// Moves the values of the named fields out (the last of equal names wins).
    fn take_fields<const N: usize>(fields: Vec<(Cow<'a, str>, D<'a>)>, names: [&str; N]) -> [Option<D<'a>>; N] {
        let mut out = [const { None }; N];
        for (k, v) in fields {
            if let Some(i) = names.iter().position(|n| *n == k.as_ref()) {
                if let Some(slot) = out.get_mut(i) {
                    *slot = Some(v);
                }
            }
        }
        out
    }

    fn string(&self, v: D<'a>, context: &str) -> P<String> {
        match self.resolve(v).0 {
            D::Str(s) => Ok(s.into_owned()),
            other => Err(self.bad(context, "a str", &other)),
        }
    }

    fn opt_string(&self, v: Option<D<'a>>, context: &str) -> P<Option<String>> {
        match v.map(|v| self.resolve(v).0) {
            None | Some(D::None) => Ok(None),
            Some(v) => self.string(v, context).map(Some),
        }
    }

    fn strings(&self, v: D<'a>, context: &str) -> P<Vec<String>> {
        match self.resolve(v).0 {
            D::List(items) | D::Tuple(items) => items.into_iter().map(|s| self.string(s, context)).collect(),
            other => Err(self.bad(context, "a list of str", &other)),
        }
    }

    fn uint_field(&self, v: &D<'a>, context: &str) -> P<usize> {
        let v = self.look(v);
        match v {
            D::Int(i) if *i >= 0 => usize::try_from(*i).map_err(|_| self.bad(context, "an int that fits usize", v)),
            D::Bool(b) => Ok(usize::from(*b)),
            other => Err(self.bad(context, "a non-negative int", other)),
        }
    }

    fn u64_field(&self, v: &D<'a>, context: &str) -> P<u64> {
        u64_of(self.look(v)).ok_or_else(|| self.bad(context, "a non-negative int", v))
    }

    fn bool_field(&self, v: &D<'a>, context: &str) -> P<bool> {
        bool_of(self.look(v)).ok_or_else(|| self.bad(context, "a bool", v))
    }

    /// Dims of a tuple or list of ints.
    fn dims(&self, v: &D<'a>, context: &str) -> Option<P<Vec<usize>>> {
        Some(match self.look(v) {
            D::Ints(i) => Ok(i.as_slice().iter().map(|&i| i as usize).collect()),
            D::Tuple(items) | D::List(items) => items.iter().map(|d| self.uint_field(d, context)).collect(),
            _ => return None,
        })
    }

    /// A `torch.Size` (`torch.Size` called on a tuple of ints), or a plain tuple or list of ints.
    fn size(&self, v: D<'a>, context: &str) -> P<Vec<usize>> {
        let (v, _) = self.resolve(v);
        match v {
            D::Size(d) => Ok(d),
            D::Invalid(p) => Err(p.within(context)),
            D::New(_) | D::Other(Desc::Object(_)) | D::MemFormat(_) | D::Layout(_) | D::Path(_) => {
                Err(self.unexpected(context, "torch.Size", &v))
            }
            other => self.dims(&other, context).unwrap_or_else(|| Err(self.bad(context, "a torch.Size", &other))),
        }
    }

    fn dtype(&self, v: &D<'a>, context: &str) -> P<DType> {
        let g = match self.look(v) {
            D::Global(id) => self.global(*id).filter(|g| g.module == "torch"),
            _ => None,
        };
        let g = g.ok_or_else(|| self.bad(context, "a torch dtype global", v))?;
        DType::from_torch_name(&g.name)
            .ok_or_else(|| Problem::at(ProblemKind::UnknownDType { name: g.name.as_ref().to_owned() }, context))
    }

    fn layout(&self, v: &D<'a>, context: &str) -> P<String> {
        match self.look(v) {
            D::Global(id) => self.global(*id).filter(|g| g.module == "torch").map(|g| g.name.as_ref().to_owned()),
            D::Layout(s) => Some(s.as_ref().to_owned()),
            _ => None,
        }
        .ok_or_else(|| self.bad(context, "a torch layout (_get_layout('torch.strided'))", v))
    }

    fn memory_format(&self, v: &D<'a>, context: &str) -> P<MemoryFormat> {
        match self.look(v) {
            D::Global(id) => {
                let g = self.global(*id).filter(|g| g.module == "torch");
                match g.map(|g| g.name.as_ref()) {
                    Some("contiguous_format") => Ok(MemoryFormat::Contiguous),
                    Some("channels_last") => Ok(MemoryFormat::ChannelsLast),
                    Some("preserve_format") => Ok(MemoryFormat::Preserve),
                    _ => Err(self.bad(context, "a memory format", v)),
                }
            }
            D::MemFormat(m) => Ok(*m),
            D::Invalid(p) => Err(p.clone().within(context)),
            found @ (D::New(_) | D::Other(Desc::Object(_)) | D::Size(_) | D::Layout(_) | D::Path(_)) => {
                Err(self.unexpected(context, "_MEM_FORMAT_ENCODING or MEM_FORMAT_ENCODING", found))
            }
            other => Err(self.bad(context, "a memory format", other)),
        }
    }

    fn strides(&self, v: &D<'a>, context: &str) -> P<Option<Vec<usize>>> {
        match self.look(v) {
            D::None => Ok(None),
            other => self
                .dims(other, context)
                .map_or_else(|| Err(self.bad(context, "a tuple of ints or None", other)), |d| d.map(Some)),
        }
    }

    fn properties(&self, state: D<'a>, legacy_class: bool) -> P<TensorProperties> {
        let (state, _) = self.resolve(state);
        match state {
            D::Tuple(items) if items.len() == 5 || items.len() == 6 => {
                let item = |i: usize| items.get(i).unwrap_or(&D::None);
                let strides = match items.get(5) {
                    Some(s) => self.strides(s, "strides")?,
                    None => None,
                };
                Ok(TensorProperties {
                    dtype: self.dtype(item(0), "dtype")?,
                    layout: self.layout(item(1), "layout")?,
                    requires_grad: self.bool_field(item(2), "requires_grad")?,
                    memory_format: self.memory_format(item(3), "memory_format")?,
                    pin_memory: self.bool_field(item(4), "pin_memory")?,
                    strides,
                    legacy_class,
                })
            }
            state @ D::Dict(_) => {
                // A plain dataclass __dict__ (no custom __getstate__): accepted defensively.
                let f = self.fields(state, "")?;
                let [dtype, layout, requires_grad, memory_format, pin_memory, strides] = Self::take_fields(
                    f,
                    ["dtype", "layout", "requires_grad", "memory_format", "pin_memory", "strides"],
                );
                Ok(TensorProperties {
                    dtype: self.dtype(&dtype.ok_or_else(|| Self::missing("", "dtype"))?, "dtype")?,
                    layout: match layout {
                        Some(l) => self.layout(&l, "layout")?,
                        None => "strided".into(),
                    },
                    requires_grad: match requires_grad {
                        Some(b) => self.bool_field(&b, "requires_grad")?,
                        None => false,
                    },
                    memory_format: match memory_format {
                        Some(m) => self.memory_format(&m, "memory_format")?,
                        None => MemoryFormat::Contiguous,
                    },
                    pin_memory: match pin_memory {
                        Some(b) => self.bool_field(&b, "pin_memory")?,
                        None => false,
                    },
                    strides: match strides {
                        Some(s) => self.strides(&s, "strides")?,
                        None => None,
                    },
                    legacy_class,
                })
            }
            other => Err(self.bad("", "a 5- or 6-tuple state", &other)),
        }
    }

    fn chunk(&self, state: D<'a>) -> P<ChunkStorageMetadata> {
        let [offsets, sizes] = Self::take_fields(self.fields(state, "")?, ["offsets", "sizes"]);
        let offsets = self.size(offsets.ok_or_else(|| Self::missing("", "offsets"))?, "offsets")?;
        let sizes = self.size(sizes.ok_or_else(|| Self::missing("", "sizes"))?, "sizes")?;
        Ok(ChunkStorageMetadata { offsets, sizes })
    }

    fn index(&self, state: D<'a>) -> P<MetadataIndex> {
        let [fqn, offset, index] = Self::take_fields(self.fields(state, "")?, ["fqn", "offset", "index"]);
        let fqn = self.string(fqn.ok_or_else(|| Self::missing("", "fqn"))?, "fqn")?;
        let offset = match offset.map(|o| self.resolve(o).0) {
            None | Some(D::None) => None,
            Some(s) => Some(self.size(s, "offset")?),
        };
        let index = match index {
            Some(i) if !matches!(self.look(&i), D::None) => Some(self.uint_field(&i, "index")?),
            _ => None,
        };
        Ok(MetadataIndex { fqn, offset, index })
    }

    fn info(&self, state: D<'a>) -> P<StorageInfo> {
        let [path, offset, length, transforms] =
            Self::take_fields(self.fields(state, "")?, ["relative_path", "offset", "length", "transform_descriptors"]);
        Ok(StorageInfo {
            relative_path: self.string(path.ok_or_else(|| Self::missing("", "relative_path"))?, "relative_path")?,
            offset: self.u64_field(&offset.ok_or_else(|| Self::missing("", "offset"))?, "offset")?,
            length: self.u64_field(&length.ok_or_else(|| Self::missing("", "length"))?, "length")?,
            transform_descriptors: match transforms.map(|t| self.resolve(t).0) {
                None | Some(D::None) => Vec::new(),
                Some(t) => self.strings(t, "transform_descriptors")?,
            },
        })
    }

    fn storage_meta(&self, state: D<'a>) -> P<StorageMeta> {
        let [checkpoint_id, save_id, load_id, modules] =
            Self::take_fields(self.fields(state, "")?, ["checkpoint_id", "save_id", "load_id", "modules"]);
        let checkpoint_id = match checkpoint_id.map(|c| self.resolve(c).0) {
            None | Some(D::None) => Value::None,
            Some(D::Str(s)) => Value::Str(s.into_owned()),
            Some(D::Path(p)) => Value::Str(p),
            Some(D::Int(i)) => Value::Int(i),
            Some(D::Bool(b)) => Value::Bool(b),
            // Provenance only, never used to find data: anything else is kept as its description.
            Some(other) => Value::Str(self.describe(&other)),
        };
        Ok(StorageMeta {
            checkpoint_id,
            save_id: self.opt_string(save_id, "save_id")?,
            load_id: self.opt_string(load_id, "load_id")?,
            modules: match modules.map(|m| self.resolve(m).0) {
                None | Some(D::None) => None,
                Some(m) => Some(self.strings(m, "modules")?),
            },
        })
    }

    fn tensor(&mut self, state: D<'a>) -> P<TensorStorageMetadata> {
        let [properties, size, chunks] = Self::take_fields(self.fields(state, "")?, ["properties", "size", "chunks"]);
        let properties = self.take_properties(properties.ok_or_else(|| Self::missing("", "properties"))?)?;
        let size = self.size(size.ok_or_else(|| Self::missing("", "size"))?, "size")?;
        let chunks = self.take_chunks(chunks.ok_or_else(|| Self::missing("", "chunks"))?)?;
        Ok(TensorStorageMetadata { properties, size, chunks })
    }

    fn take_properties(&mut self, v: D<'a>) -> P<TensorProperties> {
        let context = "properties";
        let (v, shared) = self.resolve(v);
        match v {
            D::Properties(slot) => self
                .properties
                .take(slot, shared)
                .ok_or_else(|| self.bad(context, "TensorProperties", &D::Properties(slot))),
            D::Invalid(p) => Err(p.within(context)),
            D::New(Class::Properties { .. }) => Err(Self::missing(context, "__setstate__ tuple")),
            other => Err(self.unexpected(context, "TensorProperties", &other)),
        }
    }

    fn take_chunk(&mut self, v: D<'a>, context: &str) -> P<ChunkStorageMetadata> {
        let (v, shared) = self.resolve(v);
        match v {
            D::Chunk(slot) => {
                self.chunks.take(slot, shared).ok_or_else(|| self.bad(context, "a chunk", &D::Chunk(slot)))
            }
            D::Invalid(p) => Err(p.within(context)),
            D::New(Class::Chunk) => Err(Self::missing(context, "offsets")),
            other => Err(self.unexpected(context, "ChunkStorageMetadata", &other)),
        }
    }

    fn take_chunks(&mut self, v: D<'a>) -> P<Vec<ChunkStorageMetadata>> {
        let (v, _) = self.resolve(v);
        match v {
            D::Chunks(c) => Ok(c),
            D::List(items) | D::Tuple(items) => {
                items.into_iter().enumerate().map(|(i, c)| self.take_chunk(c, &format!("chunks[{i}]"))).collect()
            }
            other => Err(self.bad("chunks", "a list of ChunkStorageMetadata", &other)),
        }
    }

    fn take_index(&mut self, v: D<'a>, context: &str) -> P<MetadataIndex> {
        let (v, shared) = self.resolve(v);
        match v {
            D::Index(slot) => {
                self.indexes.take(slot, shared).ok_or_else(|| self.bad(context, "an index", &D::Index(slot)))
            }
            D::Invalid(p) => Err(p.within(context)),
            D::New(Class::Index) => Err(Self::missing(context, "fqn")),
            other => Err(self.unexpected(context, "MetadataIndex", &other)),
        }
    }

    fn take_info(&mut self, v: D<'a>, context: &str) -> P<StorageInfo> {
        let (v, shared) = self.resolve(v);
        match v {
            D::Info(slot) => {
                self.infos.take(slot, shared).ok_or_else(|| self.bad(context, "a storage info", &D::Info(slot)))
            }
            D::Invalid(p) => Err(p.within(context)),
            D::New(Class::Info) => Err(Self::missing(context, "relative_path")),
            other => Err(self.unexpected(context, "_StorageInfo", &other)),
        }
    }

    fn storage_metadata(&mut self, v: D<'a>, context: &str) -> P<StorageMetadata> {
        let (v, shared) = self.resolve(v);
        match v {
            D::Tensor(slot) => self
                .tensors
                .take(slot, shared)
                .map(StorageMetadata::Tensor)
                .ok_or_else(|| self.bad(context, "a tensor", &D::Tensor(slot))),
            D::New(Class::BytesStorage) => Ok(StorageMetadata::Bytes),
            D::Invalid(p) => Err(p.within(context)),
            D::New(Class::TensorStorage) => Err(Self::missing(context, "properties")),
            other => Err(self.unexpected(context, "TensorStorageMetadata or BytesStorageMetadata", &other)),
        }
    }

    fn planner_data(&self, v: Option<D<'a>>) -> P<Option<PlannerData>> {
        let pairs = match v.map(|v| self.resolve(v).0) {
            None | Some(D::None) => return Ok(None),
            Some(D::Dict(pairs)) => pairs,
            Some(other) => return Err(self.bad("planner_data", "a dict or None", &other)),
        };
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            let D::Str(key) = self.resolve(k).0 else { continue };
            let path: Option<Vec<PathItem>> = match self.resolve(v).0 {
                D::Ints(ints) => Some(ints.as_slice().iter().map(|&i| PathItem::Index(i as usize)).collect()),
                D::Tuple(items) | D::List(items) => items
                    .into_iter()
                    .map(|p| match self.resolve(p).0 {
                        D::Str(s) => Some(PathItem::Key(s.into_owned())),
                        D::Int(i) => usize::try_from(i).ok().map(PathItem::Index),
                        _ => None,
                    })
                    .collect(),
                _ => None,
            };
            // Entries a custom planner filled with other objects are left out (the key then maps to itself).
            if let Some(path) = path.filter(|p| !p.is_empty()) {
                out.push((key.into_owned(), path));
            }
        }
        Ok(Some(out))
    }

    fn metadata(&mut self, state: D<'a>) -> P<Metadata> {
        let fields = self.fields(state, "Metadata")?;
        let [sdm, planner, storage, meta, version] = Self::take_fields(
            fields,
            ["state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"],
        );
        let sdm = sdm.ok_or_else(|| Self::missing("Metadata", "state_dict_metadata"))?;
        let sdm = match self.resolve(sdm).0 {
            D::Dict(pairs) => pairs,
            other => return Err(self.bad("state_dict_metadata", "a dict", &other)),
        };
        let mut state_dict_metadata = Vec::with_capacity(sdm.len());
        let mut seen = HashSet::with_capacity(sdm.len());
        for (k, v) in sdm {
            let key = self.string(k, "state_dict_metadata key")?;
            let context = format!("state_dict_metadata[{key:?}]");
            if !seen.insert(key.clone()) {
                return Err(self.bad(&context, "unique keys", &D::Str(Cow::Owned(key))));
            }
            let md = self.storage_metadata(v, &context)?;
            state_dict_metadata.push((key, md));
        }
        let storage = storage.ok_or_else(|| Self::missing("Metadata", "storage_data"))?;
        let storage_data = match self.resolve(storage).0 {
            D::StoragePairs(pairs) => pairs,
            D::Dict(pairs) => {
                let mut out = Vec::with_capacity(pairs.len());
                for (i, (k, v)) in pairs.into_iter().enumerate() {
                    let index = self.take_index(k, &format!("storage_data key #{i}"))?;
                    let info = self.take_info(v, &format!("storage_data[{:?}]", index.fqn))?;
                    out.push((index, info));
                }
                out
            }
            other => return Err(self.bad("storage_data", "a dict", &other)),
        };
        let planner_data = self.planner_data(planner)?;
        let storage_meta = match meta.map(|m| self.resolve(m)) {
            None | Some((D::None, _)) => None,
            Some((D::StorageMeta(slot), shared)) => self.storage_metas.take(slot, shared),
            Some((D::New(Class::StorageMeta), _)) => {
                Some(StorageMeta { checkpoint_id: Value::None, save_id: None, load_id: None, modules: None })
            }
            Some((D::Invalid(p), _)) => return Err(p.within("storage_meta")),
            Some((other, _)) => return Err(self.unexpected("storage_meta", "StorageMeta", &other)),
        };
        let version = self.opt_string(version, "version")?;
        Ok(Metadata { state_dict_metadata, planner_data, storage_data, storage_meta, version })
    }

    /// The decoded metadata from the pickled object.
    fn root(&mut self, root: D<'a>) -> P<Metadata> {
        let context = "the pickled object";
        match self.resolve(root).0 {
            D::Metadata(md) => Ok(*md),
            D::Invalid(p) => Err(p),
            D::New(Class::Metadata) => Err(Self::missing("Metadata", "state_dict_metadata")),
            other => Err(self.unexpected(context, "Metadata", &other)),
        }
    }

    /// The value of a call of a class whose instance is complete without a state.
    fn reduced(&self, class: Class, call: &Call<D<'a>>) -> D<'a> {
        let args = self.look(&call.args);
        let one = match args {
            D::Tuple(items) => match items.as_slice() {
                [only] => Some(self.look(only)),
                [] => None,
                _ if class == Class::Size => {
                    return D::Invalid(self.bad("", "torch.Size applied to a tuple of ints", &call.args));
                }
                _ => return D::Invalid(self.bad("", "the enum applied to an int", &call.args)),
            },
            D::Ints(ints) if class == Class::MemFormat => {
                return match ints.as_slice() {
                    &[code] => match MemoryFormat::from_code(i64::from(code)) {
                        Some(m) => D::MemFormat(m),
                        None => D::Invalid(self.bad("", "a memory format code 0, 1 or 2", &call.args)),
                    },
                    _ => D::Invalid(self.bad("", "the enum applied to an int", &call.args)),
                };
            }
            _ if class == Class::Size => {
                return D::Invalid(self.bad("", "torch.Size applied to a tuple of ints", &call.args));
            }
            _ => return D::Invalid(self.bad("", "the enum applied to an int", &call.args)),
        };
        match (class, one) {
            (Class::Size, None) => D::Size(Vec::new()),
            (Class::Size, Some(inner)) => match self.dims(inner, "") {
                Some(Ok(d)) => D::Size(d),
                Some(Err(p)) => D::Invalid(p),
                None => D::Invalid(self.bad("", "torch.Size applied to a tuple of ints", &call.args)),
            },
            (Class::MemFormat, Some(D::Int(code))) => match MemoryFormat::from_code(*code) {
                Some(m) => D::MemFormat(m),
                None => D::Invalid(self.bad("", "a memory format code 0, 1 or 2", &call.args)),
            },
            _ => D::Invalid(self.bad("", "the enum applied to an int", &call.args)),
        }
    }

    fn callable_id(&self, call: &Call<D<'a>>) -> Option<u32> {
        match self.look(&call.callable) {
            D::Global(id) => Some(*id),
            _ => None,
        }
    }

    /// `torch.serialization._get_layout(s)` and `pathlib.*Path(*parts)`, recognised by their callable.
    fn special_call(&self, call: &Call<D<'a>>) -> Option<D<'a>> {
        let id = self.callable_id(call)?;
        let g = self.global(id)?;
        if g.class != Class::Other || g.copyreg {
            return None;
        }
        let D::Tuple(args) = self.look(&call.args) else { return None };
        if matches!(call.kind, CallKind::Reduce) && g.module == "torch.serialization" && g.name == "_get_layout" {
            return match args.as_slice() {
                [s] => match self.look(s) {
                    D::Str(s) => Some(D::Layout(match s {
                        Cow::Borrowed(b) => Cow::Borrowed(b.strip_prefix("torch.").unwrap_or(b)),
                        Cow::Owned(o) => Cow::Owned(o.strip_prefix("torch.").unwrap_or(o).to_owned()),
                    })),
                    _ => None,
                },
                _ => None,
            };
        }
        if (g.module == "pathlib" || g.module.starts_with("pathlib.")) && g.name.ends_with("Path") {
            let parts: Option<Vec<&str>> =
                args.iter().map(|a| if let D::Str(s) = self.look(a) { Some(s.as_ref()) } else { None }).collect();
            let parts = parts?;
            let sep = if g.name.contains("Windows") { '\\' } else { '/' };
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                if i > 0 && !out.ends_with(sep) {
                    out.push(sep);
                }
                out.push_str(p);
            }
            return Some(D::Path(out));
        }
        None
    }

    fn new_global(&mut self, module: Cow<'a, str>, name: Cow<'a, str>) -> R<D<'a>> {
        let (m, n) = normalize_global(&module, &name);
        let class = class_of(&m, &n);
        let copyreg = m == "copyreg" && (n == "_reconstructor" || n == "__newobj__");
        let id = u32::try_from(self.globals.len()).map_err(|_| too_many())?;
        self.globals.push(Global { module, name, class, copyreg });
        Ok(D::Global(id))
    }

    /// Takes the value `target` is (or the shelved object it stands for) out, to change it.
    fn take_target(&mut self, target: &mut D<'a>) -> D<'a> {
        match target {
            D::Handle(h) => self.shelf.get_mut(*h).map_or(D::None, |t| std::mem::replace(t, D::None)),
            other => std::mem::replace(other, D::None),
        }
    }

    /// Puts a value taken by [`Self::take_target`] back.
    fn put_target(&mut self, target: &mut D<'a>, v: D<'a>) {
        match target {
            D::Handle(h) => {
                if let Some(t) = self.shelf.get_mut(*h) {
                    *t = v;
                }
            }
            other => *other = v,
        }
    }

    /// The object behind a handle, or `v` itself, to change.
    fn target<'t>(&'t mut self, t: &'t mut D<'a>) -> &'t mut D<'a> {
        match t {
            D::Handle(h) => {
                let h = *h;
                match self.shelf.get_mut(h) {
                    Some(v) => v,
                    None => t,
                }
            }
            _ => t,
        }
    }

    /// Moves the chunks of a list of made chunks into one vector, if every item is one.
    fn chunk_list(&mut self, items: &mut Vec<D<'a>>) -> Option<Vec<ChunkStorageMetadata>> {
        if items.is_empty() || !items.iter().all(|c| matches!(c, D::Chunk(_))) {
            return None;
        }
        let mut out = Vec::with_capacity(items.len());
        for c in items.drain(..) {
            if let D::Chunk(slot) = c {
                out.push(self.chunks.take(slot, false)?);
            }
        }
        Some(out)
    }
}

impl<'a> Builder<'a> for DcpBuilder<'a> {
    type Value = D<'a>;
    type Error = Failure;

    fn none(&mut self) -> D<'a> {
        D::None
    }

    fn bool(&mut self, v: bool) -> D<'a> {
        D::Bool(v)
    }

    fn int(&mut self, v: i64) -> D<'a> {
        D::Int(v)
    }

    fn float(&mut self, _: f64) -> D<'a> {
        D::Other(Desc::Type("float"))
    }

    fn big_int(&mut self, _: Vec<u8>) -> R<D<'a>> {
        Ok(D::Other(Desc::Type("int")))
    }

    fn str(&mut self, s: Cow<'a, str>) -> R<D<'a>> {
        Ok(D::Str(s))
    }

    fn bytes(&mut self, _: Cow<'a, [u8]>, bytearray: bool) -> R<D<'a>> {
        Ok(D::Other(Desc::Type(if bytearray { "bytearray" } else { "bytes" })))
    }

    fn global(&mut self, module: &'a str, name: &'a str) -> R<D<'a>> {
        self.new_global(Cow::Borrowed(module), Cow::Borrowed(name))
    }

    fn stack_global(&mut self, module: D<'a>, name: D<'a>) -> R<D<'a>> {
        let text = |b: &Self, v: D<'a>| match b.resolve(v).0 {
            D::Str(s) => s,
            _ => Cow::Borrowed(""),
        };
        let (m, n) = (text(self, module), text(self, name));
        self.new_global(m, n)
    }

    fn sequence(&mut self, kind: Sequence, items: Items<'_, D<'a>>) -> R<D<'a>> {
        Ok(match kind {
            Sequence::List => {
                let mut items: Vec<D<'a>> = items.collect();
                match self.chunk_list(&mut items) {
                    Some(chunks) => D::Chunks(chunks),
                    None => D::List(items),
                }
            }
            Sequence::Tuple => match Ints::of(items.as_slice()) {
                Some(ints) => D::Ints(ints),
                None => D::Tuple(items.collect()),
            },
            Sequence::Set => D::Other(Desc::Type("set")),
            Sequence::FrozenSet => D::Other(Desc::Type("frozenset")),
        })
    }

    fn dict(&mut self, pairs: Pairs<'_, D<'a>>) -> R<D<'a>> {
        Ok(D::Dict(pairs.collect()))
    }

    fn persistent_id(&mut self, _: D<'a>) -> R<D<'a>> {
        Ok(D::Other(Desc::Type("persistent id")))
    }

    fn object(&mut self, call: Call<D<'a>>) -> R<D<'a>> {
        if let Some(v) = self.special_call(&call) {
            return Ok(v);
        }
        let class = self.class_of_call(&call.callable, &call.args);
        Ok(match class {
            Class::Size | Class::MemFormat => self.reduced(class, &call),
            Class::Other => D::Other(Desc::Object(self.callable_id(&call))),
            typed => D::New(typed),
        })
    }

    fn append(&mut self, target: &mut D<'a>, items: Items<'_, D<'a>>) -> R<()> {
        let mut items: Vec<D<'a>> = items.collect();
        let current = self.take_target(target);
        let grown = match (current, self.chunk_list(&mut items)) {
            (D::Chunks(mut c), Some(more)) => {
                c.extend(more);
                D::Chunks(c)
            }
            (D::List(v), Some(more)) if v.is_empty() => D::Chunks(more),
            (D::Chunks(made), None) => {
                // Something else joins a list of chunks: it becomes a list of values again.
                let mut v = Vec::with_capacity(made.len() + items.len());
                for c in made {
                    v.push(D::Chunk(self.chunks.put(c)?));
                }
                v.extend(items);
                D::List(v)
            }
            (D::List(mut v), Some(more)) => {
                for c in more {
                    v.push(D::Chunk(self.chunks.put(c)?));
                }
                D::List(v)
            }
            (D::List(mut v), None) => {
                v.extend(items);
                D::List(v)
            }
            // Appends to anything else never change what the DCP classes are read from.
            (other, _) => other,
        };
        self.put_target(target, grown);
        Ok(())
    }

    fn set_items(&mut self, target: &mut D<'a>, pairs: Pairs<'_, D<'a>>) -> R<()> {
        let pairs: Vec<(D<'a>, D<'a>)> = pairs.collect();
        let typed = !pairs.is_empty() && pairs.iter().all(|(k, v)| matches!((k, v), (D::Index(_), D::Info(_))));
        let current = self.take_target(target);
        let grown = match (current, typed) {
            (D::StoragePairs(mut made), true) => {
                self.take_pairs(pairs, &mut made);
                D::StoragePairs(made)
            }
            (D::Dict(v), true) if v.is_empty() => {
                let mut made = Vec::with_capacity(pairs.len());
                self.take_pairs(pairs, &mut made);
                D::StoragePairs(made)
            }
            (D::StoragePairs(made), false) => {
                let mut v = Vec::with_capacity(made.len() + pairs.len());
                for (i, s) in made {
                    v.push((D::Index(self.indexes.put(i)?), D::Info(self.infos.put(s)?)));
                }
                v.extend(pairs);
                D::Dict(v)
            }
            (D::Dict(mut v), _) => {
                v.extend(pairs);
                D::Dict(v)
            }
            (other, _) => other,
        };
        self.put_target(target, grown);
        Ok(())
    }

    fn add_items(&mut self, _: &mut D<'a>, _: Items<'_, D<'a>>) -> R<()> {
        // Sets are never looked at.
        Ok(())
    }

    fn build(&mut self, target: &mut D<'a>, state: D<'a>) -> R<()> {
        let class = match self.target(target) {
            D::New(c) => *c,
            _ => return Ok(()),
        };
        let built = match class {
            Class::Properties { legacy } => match self.properties(state, legacy) {
                Ok(p) => D::Properties(self.properties.put(p)?),
                Err(p) => D::Invalid(p),
            },
            Class::Chunk => match self.chunk(state) {
                Ok(c) => D::Chunk(self.chunks.put(c)?),
                Err(p) => D::Invalid(p),
            },
            Class::Index => match self.index(state) {
                Ok(i) => D::Index(self.indexes.put(i)?),
                Err(p) => D::Invalid(p),
            },
            Class::Info => match self.info(state) {
                Ok(i) => D::Info(self.infos.put(i)?),
                Err(p) => D::Invalid(p),
            },
            Class::StorageMeta => match self.storage_meta(state) {
                Ok(s) => D::StorageMeta(self.storage_metas.put(s)?),
                Err(p) => D::Invalid(p),
            },
            Class::TensorStorage => match self.tensor(state) {
                Ok(t) => D::Tensor(self.tensors.put(t)?),
                Err(p) => D::Invalid(p),
            },
            Class::Metadata => match self.metadata(state) {
                Ok(md) => D::Metadata(Box::new(md)),
                Err(p) => D::Invalid(p),
            },
            // BytesStorageMetadata's state is never looked at.
            Class::BytesStorage => D::New(Class::BytesStorage),
            _ => return Ok(()),
        };
        *self.target(target) = built;
        Ok(())
    }

    fn share(&mut self, v: &mut D<'a>) -> R<D<'a>> {
        Ok(match v {
            D::None => D::None,
            D::Bool(b) => D::Bool(*b),
            D::Int(i) => D::Int(*i),
            D::Str(Cow::Borrowed(s)) => D::Str(Cow::Borrowed(s)),
            D::Global(g) => D::Global(*g),
            D::Ints(i) => D::Ints(*i),
            D::Size(s) if s.len() <= 8 => D::Size(s.clone()),
            D::MemFormat(m) => D::MemFormat(*m),
            D::Other(d) => D::Other(*d),
            D::Handle(h) => D::Handle(*h),
            _ => {
                let h = self.shelf.put(std::mem::replace(v, D::None))?;
                *v = D::Handle(h);
                D::Handle(h)
            }
        })
    }

    fn templates(&self) -> &'static [Template] {
        if self.templates { &TEMPLATES } else { &[] }
    }

    fn template(&mut self, template: usize, c: &mut Captures<'a, '_, D<'a>>) -> R<D<'a>> {
        // What `chunk`, `index` and `info` make of the same fields, problems included, in the same order.
        let malformed = || Failure::Pickle(ckpt_pickle::Error::Malformed { offset: 0, what: "a DCP template" });
        Ok(match template {
            0 => {
                if c.absent() {
                    return Ok(D::Invalid(Self::missing("", "offsets")));
                }
                let offsets = match self.size_capture(c, "offsets")? {
                    Ok(d) => d,
                    Err(p) => return Ok(D::Invalid(p)),
                };
                if c.absent() {
                    return Ok(D::Invalid(Self::missing("", "sizes")));
                }
                let sizes = match self.size_capture(c, "sizes")? {
                    Ok(d) => d,
                    Err(p) => return Ok(D::Invalid(p)),
                };
                D::Chunk(self.chunks.put(ChunkStorageMetadata { offsets, sizes })?)
            }
            1 => {
                if c.absent() {
                    return Ok(D::Invalid(Self::missing("", "fqn")));
                }
                let fqn = c.str().ok_or_else(malformed)?.to_owned();
                // Captured in the order torch pickles the fields (fqn, index, offset); a problem of
                // `offset` is reported before one of `index`, as `index` reports them.
                let index = if c.absent() {
                    Ok(None)
                } else {
                    match c.choice().ok_or_else(malformed)? {
                        0 => {
                            c.next_capture();
                            Ok(None)
                        }
                        _ => {
                            let i = c.int().ok_or_else(malformed)?;
                            uint(&D::Int(i)).map(Some).ok_or(i)
                        }
                    }
                };
                let offset = if c.absent() {
                    None
                } else {
                    match c.choice().ok_or_else(malformed)? {
                        0 => {
                            c.next_capture();
                            None
                        }
                        _ => match self.size_capture(c, "offset")? {
                            Ok(d) => Some(d),
                            Err(p) => return Ok(D::Invalid(p)),
                        },
                    }
                };
                let index = match index {
                    Ok(index) => index,
                    Err(i) => return Ok(D::Invalid(self.bad("index", "a non-negative int", &D::Int(i)))),
                };
                D::Index(self.indexes.put(MetadataIndex { fqn, offset, index })?)
            }
            _ => {
                if c.absent() {
                    return Ok(D::Invalid(Self::missing("", "relative_path")));
                }
                let relative_path = c.str().ok_or_else(malformed)?.to_owned();
                let mut number = |field: &'static str| -> R<P<u64>> {
                    if c.absent() {
                        return Ok(Err(Self::missing("", field)));
                    }
                    let v = c.int().ok_or_else(malformed)?;
                    Ok(u64_of(&D::Int(v)).ok_or_else(|| self.bad(field, "a non-negative int", &D::Int(v))))
                };
                let offset = match number("offset")? {
                    Ok(v) => v,
                    Err(p) => return Ok(D::Invalid(p)),
                };
                let length = match number("length")? {
                    Ok(v) => v,
                    Err(p) => return Ok(D::Invalid(p)),
                };
                D::Info(self.infos.put(StorageInfo {
                    relative_path,
                    offset,
                    length,
                    transform_descriptors: Vec::new(),
                })?)
            }
        })
    }
}

impl<'a> DcpBuilder<'a> {
    /// A `torch.Size` a template captured for `field`: its dims, or the memoized value it read.
    fn size_capture(&mut self, c: &mut Captures<'a, '_, D<'a>>, field: &str) -> R<P<Vec<usize>>> {
        let malformed = || Failure::Pickle(ckpt_pickle::Error::Malformed { offset: 0, what: "a DCP template" });
        Ok(match c.choice().ok_or_else(malformed)? {
            0 => {
                let ints = c.ints().ok_or_else(malformed)?;
                ints.as_slice()
                    .iter()
                    .map(|&d| usize::try_from(d).map_err(|_| self.bad(field, "a non-negative int", &D::Int(d))))
                    .collect()
            }
            _ => {
                let v = c.value().ok_or_else(malformed)?;
                self.size(v, field)
            }
        })
    }

    /// Moves made `(MetadataIndex, _StorageInfo)` pairs out of their tables into `made`.
    fn take_pairs(&mut self, pairs: Vec<(D<'a>, D<'a>)>, made: &mut Vec<(MetadataIndex, StorageInfo)>) {
        made.reserve(pairs.len());
        for (k, v) in pairs {
            if let (D::Index(i), D::Info(j)) = (k, v) {
                if let (Some(i), Some(j)) = (self.indexes.take(i, false), self.infos.take(j, false)) {
                    made.push((i, j));
                }
            }
        }
    }
}
