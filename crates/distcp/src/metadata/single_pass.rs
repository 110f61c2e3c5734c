//! Decoding `.metadata` in one pass: the DCP classes are built straight from the pickle's opcodes
//! ([`ckpt_pickle::build`]) into the typed structs, each object as soon as its BUILD state arrives, so no
//! generic tree of the whole pickle (hundreds of thousands of objects for a large job) is ever held. Strings
//! are borrowed from the input until the final structs own them, classes are recognised once per global.
//!
//! This path accepts a subset of what [`super::decode`] accepts and builds exactly the same [`Metadata`]:
//! whenever anything is not what torch writes (an unknown class where a DCP class belongs, a malformed field,
//! a typed object used twice, a pickle the single-pass VM declines), it returns `None` and the caller runs the
//! full decoder, which gives the precise error or the value.

use std::borrow::Cow;
use std::collections::HashSet;

use ckpt_core::{DType, PathItem, Value};
use ckpt_pickle::build::{Builder, Call, CallKind, Declined, Items, Pairs, Sequence, build};
use ckpt_pickle::normalize_global;

use super::{
    ChunkStorageMetadata, FILESYSTEM_MODULE, LEGACY_PROPERTIES_MODULE, METADATA_MODULE, MemoryFormat, Metadata,
    MetadataIndex, PlannerData, StorageInfo, StorageMeta, StorageMetadata, TensorProperties, TensorStorageMetadata,
};

/// Decodes a `.metadata` pickle, or `None` when the full decoder must (see the module docs).
pub(super) fn decode(bytes: &[u8], limits: &ckpt_pickle::Limits) -> Option<Metadata> {
    let mut b = DcpBuilder::default();
    let (root, _) = build(bytes, limits, &mut b).ok()?;
    match root {
        D::Metadata(md) => Some(*md),
        D::New(Class::Metadata) => None, // no BUILD state: required fields are missing
        _ => None,
    }
}

/// The classes this decoder knows, after `normalize_global` and the `copyreg` constructors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
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

pub(super) fn class_of(module: &str, name: &str) -> Class {
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

/// A global as written, and what it names after Python 2 -> 3 mapping.
#[derive(Debug)]
struct Global<'a> {
    module: Cow<'a, str>,
    name: Cow<'a, str>,
    /// The class of `normalize_global(module, name)`.
    class: Class,
    /// Whether it is `copyreg._reconstructor` or `copyreg.__newobj__` (after mapping).
    copyreg: bool,
}

/// A value under construction. Typed records live in the builder's tables until their container takes
/// them (each exactly once).
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
    Dict(Vec<(D<'a>, D<'a>)>),
    /// An instance of a DCP class without its BUILD state yet.
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
    /// Anything this decoder does not model (floats, bytes, sets, persistent ids, other objects): fine where
    /// the full decoder ignores it, a decline where it would look at it.
    Other,
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

/// The items of a tuple or list, as the full decoder would see them.
enum Seq<'s, 'a> {
    Items(&'s [D<'a>]),
    Ints(&'s [u32]),
}

/// A tuple's or list's items.
fn seq<'s, 'a>(v: &'s D<'a>) -> Option<Seq<'s, 'a>> {
    match v {
        D::Tuple(items) | D::List(items) => Some(Seq::Items(items)),
        D::Ints(i) => Some(Seq::Ints(i.as_slice())),
        _ => None,
    }
}

/// Takes record `id` out of a table (each record is used once).
fn take<T>(table: &mut [Option<T>], id: u32) -> Option<T> {
    table.get_mut(id as usize)?.take()
}

fn push<T>(table: &mut Vec<Option<T>>, v: T) -> Result<u32, Declined> {
    let id = u32::try_from(table.len()).map_err(|_| Declined)?;
    table.push(Some(v));
    Ok(id)
}

#[derive(Default)]
struct DcpBuilder<'a> {
    globals: Vec<Global<'a>>,
    properties: Vec<Option<TensorProperties>>,
    chunks: Vec<Option<ChunkStorageMetadata>>,
    tensors: Vec<Option<TensorStorageMetadata>>,
    indexes: Vec<Option<MetadataIndex>>,
    infos: Vec<Option<StorageInfo>>,
    storage_metas: Vec<Option<StorageMeta>>,
}

/// The `(field, value)` pairs of a dataclass `__dict__` state, later duplicates winning (as the full
/// decoder's `field` does); `None` unless every key is a `str`.
fn fields<'s, 'a>(state: &'s [(D<'a>, D<'a>)]) -> Option<Vec<(&'s str, &'s D<'a>)>> {
    state.iter().map(|(k, v)| if let D::Str(k) = k { Some((k.as_ref(), v)) } else { None }).collect()
}

/// Moves the values of the named fields out of a dataclass `__dict__` state (the last of equal names wins,
/// as in the full decoder's `field`); `None` unless every key is a `str`.
fn take_fields<'a, const N: usize>(state: Vec<(D<'a>, D<'a>)>, names: [&str; N]) -> Option<[Option<D<'a>>; N]> {
    let mut out = [const { None }; N];
    for (k, v) in state {
        let D::Str(k) = k else { return None };
        if let Some(i) = names.iter().position(|n| *n == k.as_ref()) {
            if let Some(slot) = out.get_mut(i) {
                *slot = Some(v);
            }
        }
    }
    Some(out)
}

fn field<'s, 'a>(fields: &[(&str, &'s D<'a>)], name: &str) -> Option<&'s D<'a>> {
    fields.iter().rev().find(|(k, _)| *k == name).map(|(_, v)| *v)
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

fn string(v: &D<'_>) -> Option<String> {
    match v {
        D::Str(s) => Some(s.as_ref().to_owned()),
        _ => None,
    }
}

/// `None` / absent -> `Ok(None)`; a str -> `Ok(Some)`; anything else -> `Err`.
fn opt_string(v: Option<&D<'_>>) -> Result<Option<String>, Declined> {
    match v {
        None | Some(D::None) => Ok(None),
        Some(v) => string(v).map(Some).ok_or(Declined),
    }
}

fn dims(s: Seq<'_, '_>) -> Option<Vec<usize>> {
    match s {
        Seq::Items(items) => items.iter().map(uint).collect(),
        Seq::Ints(ints) => Some(ints.iter().map(|&i| i as usize).collect()),
    }
}

/// A `torch.Size`, or a plain tuple/list of ints.
fn size(v: &D<'_>) -> Option<Vec<usize>> {
    match v {
        D::Size(d) => Some(d.clone()),
        other => dims(seq(other)?),
    }
}

/// [`size`], moving the dims out when the value is a `torch.Size`.
fn size_owned(v: D<'_>) -> Option<Vec<usize>> {
    match v {
        D::Size(d) => Some(d),
        other => size(&other),
    }
}

impl<'a> DcpBuilder<'a> {
    fn global(&self, id: u32) -> Option<&Global<'a>> {
        self.globals.get(id as usize)
    }

    /// The class a call instantiates: its callable, or the class argument of the `copyreg` constructors.
    fn class_of_call(&self, callable: &D<'a>, args: &D<'a>) -> Class {
        let D::Global(id) = callable else { return Class::Other };
        let Some(g) = self.global(*id) else { return Class::Other };
        if g.copyreg {
            return match args {
                D::Tuple(items) => match items.first() {
                    Some(D::Global(cls)) => self.global(*cls).map_or(Class::Other, |c| c.class),
                    _ => Class::Other,
                },
                _ => Class::Other,
            };
        }
        g.class
    }

    fn dtype(&self, v: &D<'a>) -> Option<DType> {
        let D::Global(id) = v else { return None };
        let g = self.global(*id)?;
        if g.module != "torch" {
            return None;
        }
        DType::from_torch_name(&g.name)
    }

    fn layout(&self, v: &D<'a>) -> Option<String> {
        match v {
            D::Global(id) => {
                let g = self.global(*id)?;
                (g.module == "torch").then(|| g.name.as_ref().to_owned())
            }
            D::Layout(s) => Some(s.as_ref().to_owned()),
            _ => None,
        }
    }

    fn memory_format(&self, v: &D<'a>) -> Option<MemoryFormat> {
        match v {
            D::Global(id) => {
                let g = self.global(*id)?;
                if g.module != "torch" {
                    return None;
                }
                match g.name.as_ref() {
                    "contiguous_format" => Some(MemoryFormat::Contiguous),
                    "channels_last" => Some(MemoryFormat::ChannelsLast),
                    "preserve_format" => Some(MemoryFormat::Preserve),
                    _ => None,
                }
            }
            D::MemFormat(m) => Some(*m),
            _ => None,
        }
    }

    fn strides(v: &D<'a>) -> Option<Option<Vec<usize>>> {
        match v {
            D::None => Some(None),
            other => dims(seq(other)?).map(Some),
        }
    }

    fn properties(&self, state: &D<'a>, legacy_class: bool) -> Option<TensorProperties> {
        match state {
            D::Tuple(items) if items.len() == 5 || items.len() == 6 => Some(TensorProperties {
                dtype: self.dtype(items.first()?)?,
                layout: self.layout(items.get(1)?)?,
                requires_grad: bool_of(items.get(2)?)?,
                memory_format: self.memory_format(items.get(3)?)?,
                pin_memory: bool_of(items.get(4)?)?,
                strides: match items.get(5) {
                    Some(s) => Self::strides(s)?,
                    None => None,
                },
                legacy_class,
            }),
            D::Dict(pairs) => {
                let f = fields(pairs)?;
                Some(TensorProperties {
                    dtype: self.dtype(field(&f, "dtype")?)?,
                    layout: match field(&f, "layout") {
                        Some(l) => self.layout(l)?,
                        None => "strided".into(),
                    },
                    requires_grad: match field(&f, "requires_grad") {
                        Some(b) => bool_of(b)?,
                        None => false,
                    },
                    memory_format: match field(&f, "memory_format") {
                        Some(m) => self.memory_format(m)?,
                        None => MemoryFormat::Contiguous,
                    },
                    pin_memory: match field(&f, "pin_memory") {
                        Some(b) => bool_of(b)?,
                        None => false,
                    },
                    strides: match field(&f, "strides") {
                        Some(s) => Self::strides(s)?,
                        None => None,
                    },
                    legacy_class,
                })
            }
            _ => None,
        }
    }

    fn chunk(state: Vec<(D<'a>, D<'a>)>) -> Option<ChunkStorageMetadata> {
        let [offsets, sizes] = take_fields(state, ["offsets", "sizes"])?;
        Some(ChunkStorageMetadata { offsets: size_owned(offsets?)?, sizes: size_owned(sizes?)? })
    }

    fn index(state: Vec<(D<'a>, D<'a>)>) -> Option<MetadataIndex> {
        let [fqn, offset, index] = take_fields(state, ["fqn", "offset", "index"])?;
        let fqn = match fqn? {
            D::Str(s) => s.into_owned(),
            _ => return None,
        };
        let offset = match offset {
            None | Some(D::None) => None,
            Some(s) => Some(size_owned(s)?),
        };
        let index = match index {
            None | Some(D::None) => None,
            Some(i) => Some(uint(&i)?),
        };
        Some(MetadataIndex { fqn, offset, index })
    }

    fn info(state: Vec<(D<'a>, D<'a>)>) -> Option<StorageInfo> {
        let [path, offset, length, transforms] =
            take_fields(state, ["relative_path", "offset", "length", "transform_descriptors"])?;
        Some(StorageInfo {
            relative_path: match path? {
                D::Str(s) => s.into_owned(),
                _ => return None,
            },
            offset: u64_of(&offset?)?,
            length: u64_of(&length?)?,
            transform_descriptors: match transforms.as_ref() {
                None | Some(D::None) => Vec::new(),
                Some(D::List(items) | D::Tuple(items)) => items.iter().map(string).collect::<Option<_>>()?,
                Some(_) => return None,
            },
        })
    }

    fn storage_meta(&self, state: &[(D<'a>, D<'a>)]) -> Option<StorageMeta> {
        let f = fields(state)?;
        let checkpoint_id = match field(&f, "checkpoint_id") {
            None | Some(D::None) => Value::None,
            Some(D::Str(s)) => Value::Str(s.as_ref().to_owned()),
            Some(D::Path(p)) => Value::Str(p.clone()),
            Some(D::Int(i)) => Value::Int(*i),
            Some(D::Bool(b)) => Value::Bool(*b),
            Some(_) => return None,
        };
        Some(StorageMeta {
            checkpoint_id,
            save_id: opt_string(field(&f, "save_id")).ok()?,
            load_id: opt_string(field(&f, "load_id")).ok()?,
            modules: match field(&f, "modules") {
                None | Some(D::None) => None,
                Some(D::List(items) | D::Tuple(items)) => Some(items.iter().map(string).collect::<Option<_>>()?),
                Some(_) => return None,
            },
        })
    }

    fn tensor(&mut self, state: Vec<(D<'a>, D<'a>)>) -> Option<TensorStorageMetadata> {
        let [properties, size_v, chunks] = take_fields(state, ["properties", "size", "chunks"])?;
        let properties = match properties? {
            D::Properties(id) => take(&mut self.properties, id)?,
            _ => return None,
        };
        let size = size_owned(size_v?)?;
        let chunks = match chunks? {
            D::List(items) | D::Tuple(items) => items
                .into_iter()
                .map(|c| match c {
                    D::Chunk(id) => take(&mut self.chunks, id),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?,
            _ => return None,
        };
        Some(TensorStorageMetadata { properties, size, chunks })
    }

    fn storage_metadata(&mut self, v: D<'a>) -> Option<StorageMetadata> {
        match v {
            D::Tensor(id) => take(&mut self.tensors, id).map(StorageMetadata::Tensor),
            D::New(Class::BytesStorage) => Some(StorageMetadata::Bytes),
            _ => None,
        }
    }

    fn planner_data(v: Option<D<'a>>) -> Option<Option<PlannerData>> {
        let pairs = match v {
            None | Some(D::None) => return Some(None),
            Some(D::Dict(pairs)) => pairs,
            Some(_) => return None,
        };
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            let D::Str(key) = k else { continue };
            let path: Option<Vec<PathItem>> = match v {
                D::Ints(ints) => Some(ints.as_slice().iter().map(|&i| PathItem::Index(i as usize)).collect()),
                D::Tuple(items) | D::List(items) => items
                    .into_iter()
                    .map(|p| match p {
                        D::Str(s) => Some(PathItem::Key(s.into_owned())),
                        D::Int(i) => usize::try_from(i).ok().map(PathItem::Index),
                        _ => None,
                    })
                    .collect(),
                _ => None,
            };
            if let Some(path) = path.filter(|p| !p.is_empty()) {
                out.push((key.into_owned(), path));
            }
        }
        Some(Some(out))
    }

    fn metadata(&mut self, state: Vec<(D<'a>, D<'a>)>) -> Option<Metadata> {
        let [sdm, planner, storage, meta, version] =
            take_fields(state, ["state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"])?;
        let D::Dict(sdm) = sdm? else { return None };
        let D::Dict(storage) = storage? else { return None };
        let mut state_dict_metadata = Vec::with_capacity(sdm.len());
        let mut seen = HashSet::with_capacity(sdm.len());
        for (k, v) in sdm {
            let D::Str(key) = k else { return None };
            let key = key.into_owned();
            if !seen.insert(key.clone()) {
                return None;
            }
            state_dict_metadata.push((key, self.storage_metadata(v)?));
        }
        let mut storage_data = Vec::with_capacity(storage.len());
        for (k, v) in storage {
            let (D::Index(i), D::Info(j)) = (k, v) else { return None };
            storage_data.push((take(&mut self.indexes, i)?, take(&mut self.infos, j)?));
        }
        let storage_meta = match meta {
            None | Some(D::None) => None,
            Some(D::StorageMeta(id)) => Some(take(&mut self.storage_metas, id)?),
            Some(D::New(Class::StorageMeta)) => {
                Some(StorageMeta { checkpoint_id: Value::None, save_id: None, load_id: None, modules: None })
            }
            Some(_) => return None,
        };
        Some(Metadata {
            state_dict_metadata,
            planner_data: Self::planner_data(planner)?,
            storage_data,
            storage_meta,
            version: opt_string(version.as_ref()).ok()?,
        })
    }

    /// The value of a REDUCE-style call of a class whose instance is complete without BUILD.
    fn reduced(&self, class: Class, call: &Call<D<'a>>) -> D<'a> {
        let args = match &call.args {
            D::Tuple(items) => Some(Seq::Items(items.as_slice())),
            D::Ints(ints) => Some(Seq::Ints(ints.as_slice())),
            _ => None,
        };
        match class {
            Class::Size => match args {
                Some(Seq::Items([inner])) => seq(inner).and_then(dims).map_or(D::Other, D::Size),
                Some(Seq::Items([])) => D::Size(Vec::new()),
                _ => D::Other,
            },
            Class::MemFormat => match args {
                Some(Seq::Items([D::Int(code)])) => MemoryFormat::from_code(*code).map_or(D::Other, D::MemFormat),
                Some(Seq::Ints(&[code])) => MemoryFormat::from_code(i64::from(code)).map_or(D::Other, D::MemFormat),
                _ => D::Other,
            },
            _ => D::Other,
        }
    }

    /// `torch.serialization._get_layout(s)` and `pathlib.*Path(*parts)`, recognised by their callable.
    fn special_call(&self, call: &Call<D<'a>>) -> Option<D<'a>> {
        let D::Global(id) = call.callable else { return None };
        let g = self.global(id)?;
        if g.class != Class::Other || g.copyreg {
            return None;
        }
        let D::Tuple(args) = &call.args else { return None };
        if matches!(call.kind, CallKind::Reduce) && g.module == "torch.serialization" && g.name == "_get_layout" {
            return match args.as_slice() {
                [D::Str(s)] => Some(D::Layout(match s {
                    Cow::Borrowed(b) => Cow::Borrowed(b.strip_prefix("torch.").unwrap_or(b)),
                    Cow::Owned(o) => Cow::Owned(o.strip_prefix("torch.").unwrap_or(o).to_owned()),
                })),
                _ => Some(D::Other),
            };
        }
        if (g.module == "pathlib" || g.module.starts_with("pathlib.")) && g.name.ends_with("Path") {
            let parts: Option<Vec<&str>> =
                args.iter().map(|a| if let D::Str(s) = a { Some(s.as_ref()) } else { None }).collect();
            let Some(parts) = parts else { return Some(D::Other) };
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
}

impl<'a> Builder<'a> for DcpBuilder<'a> {
    type Value = D<'a>;

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
        D::Other
    }

    fn big_int(&mut self, _: Vec<u8>) -> Result<D<'a>, Declined> {
        Ok(D::Other)
    }

    fn str(&mut self, s: Cow<'a, str>) -> Result<D<'a>, Declined> {
        Ok(D::Str(s))
    }

    fn bytes(&mut self, _: Cow<'a, [u8]>, _: bool) -> Result<D<'a>, Declined> {
        Ok(D::Other)
    }

    fn global(&mut self, module: &'a str, name: &'a str) -> Result<D<'a>, Declined> {
        self.new_global(Cow::Borrowed(module), Cow::Borrowed(name))
    }

    fn stack_global(&mut self, module: D<'a>, name: D<'a>) -> Result<D<'a>, Declined> {
        match (module, name) {
            (D::Str(m), D::Str(n)) => self.new_global(m, n),
            _ => Err(Declined),
        }
    }

    fn sequence(&mut self, kind: Sequence, items: Items<'_, D<'a>>) -> Result<D<'a>, Declined> {
        Ok(match kind {
            Sequence::List => D::List(items.collect()),
            Sequence::Tuple => match Ints::of(items.as_slice()) {
                Some(ints) => D::Ints(ints),
                None => D::Tuple(items.collect()),
            },
            Sequence::Set | Sequence::FrozenSet => D::Other,
        })
    }

    fn dict(&mut self, pairs: Pairs<'_, D<'a>>) -> Result<D<'a>, Declined> {
        Ok(D::Dict(pairs.collect()))
    }

    fn persistent_id(&mut self, _: D<'a>) -> Result<D<'a>, Declined> {
        Ok(D::Other)
    }

    fn object(&mut self, call: Call<D<'a>>) -> Result<D<'a>, Declined> {
        if let Some(v) = self.special_call(&call) {
            return Ok(v);
        }
        let class = self.class_of_call(&call.callable, &call.args);
        Ok(match class {
            Class::Size | Class::MemFormat => self.reduced(class, &call),
            Class::Other => D::Other,
            typed => D::New(typed),
        })
    }

    fn append(&mut self, target: &mut D<'a>, items: Items<'_, D<'a>>) -> Result<(), Declined> {
        match target {
            D::List(v) => v.extend(items),
            // Appends to anything else are recorded by the full decoder and never looked at by its DCP
            // decoding (a torch.Size with appended items is still read from its arguments).
            D::Other | D::Size(_) | D::MemFormat(_) | D::Layout(_) | D::Path(_) => {}
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn set_items(&mut self, target: &mut D<'a>, pairs: Pairs<'_, D<'a>>) -> Result<(), Declined> {
        match target {
            D::Dict(v) => v.extend(pairs),
            D::Other | D::Size(_) | D::MemFormat(_) | D::Layout(_) | D::Path(_) => {}
            _ => return Err(Declined),
        }
        Ok(())
    }

    fn add_items(&mut self, target: &mut D<'a>, _: Items<'_, D<'a>>) -> Result<(), Declined> {
        match target {
            D::Other => Ok(()),
            _ => Err(Declined),
        }
    }

    fn build(&mut self, target: &mut D<'a>, state: D<'a>) -> Result<(), Declined> {
        let class = match target {
            D::New(c) => *c,
            D::Other | D::Size(_) | D::MemFormat(_) | D::Layout(_) | D::Path(_) => return Ok(()),
            _ => return Err(Declined),
        };
        let built = match (class, state) {
            (Class::Properties { legacy }, state) => {
                let p = self.properties(&state, legacy).ok_or(Declined)?;
                D::Properties(push(&mut self.properties, p)?)
            }
            (Class::Chunk, D::Dict(s)) => D::Chunk(push(&mut self.chunks, Self::chunk(s).ok_or(Declined)?)?),
            (Class::Index, D::Dict(s)) => D::Index(push(&mut self.indexes, Self::index(s).ok_or(Declined)?)?),
            (Class::Info, D::Dict(s)) => D::Info(push(&mut self.infos, Self::info(s).ok_or(Declined)?)?),
            (Class::StorageMeta, D::Dict(s)) => {
                let sm = self.storage_meta(&s).ok_or(Declined)?;
                D::StorageMeta(push(&mut self.storage_metas, sm)?)
            }
            (Class::TensorStorage, D::Dict(s)) => {
                let t = self.tensor(s).ok_or(Declined)?;
                D::Tensor(push(&mut self.tensors, t)?)
            }
            (Class::Metadata, D::Dict(s)) => D::Metadata(Box::new(self.metadata(s).ok_or(Declined)?)),
            // BytesStorageMetadata's state is never looked at.
            (Class::BytesStorage, _) => D::New(Class::BytesStorage),
            _ => return Err(Declined),
        };
        *target = built;
        Ok(())
    }

    fn share(&mut self, v: &D<'a>) -> Result<D<'a>, Declined> {
        Ok(v.clone())
    }
}

impl<'a> DcpBuilder<'a> {
    fn new_global(&mut self, module: Cow<'a, str>, name: Cow<'a, str>) -> Result<D<'a>, Declined> {
        let (m, n) = normalize_global(&module, &name);
        let class = class_of(&m, &n);
        let copyreg = m == "copyreg" && (n == "_reconstructor" || n == "__newobj__");
        let id = u32::try_from(self.globals.len()).map_err(|_| Declined)?;
        self.globals.push(Global { module, name, class, copyreg });
        Ok(D::Global(id))
    }
}

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::path::{Path, PathBuf};

    use super::*;
    use crate::metadata::{Profile, decode as full};

    /// Every `.metadata` pickle of the conformance fixtures (torch 2.0 to 2.15 layouts).
    pub(in crate::metadata) fn fixtures() -> Vec<(PathBuf, Vec<u8>)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/fixtures/distcp");
        let mut out = Vec::new();
        let mut dirs = vec![root];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.file_name().is_some_and(|n| n.to_string_lossy().ends_with(".metadata")) {
                    out.push((p.clone(), std::fs::read(&p).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    /// A large-job metadata: `ranks` row shards of `keys` tensors, with planner data.
    pub(in crate::metadata) fn sharded(ranks: usize, keys: usize) -> Metadata {
        let mut state_dict_metadata = Vec::new();
        let mut storage_data = Vec::new();
        for k in 0..keys {
            let key = format!("model.layers.{k}.w");
            let chunks: Vec<ChunkStorageMetadata> =
                (0..ranks).map(|r| ChunkStorageMetadata { offsets: vec![r * 4, 0], sizes: vec![4, 8] }).collect();
            for (r, c) in chunks.iter().enumerate() {
                storage_data.push((
                    MetadataIndex { fqn: key.clone(), offset: Some(c.offsets.clone()), index: Some(r) },
                    StorageInfo {
                        relative_path: format!("__{r}_0.distcp"),
                        offset: (k * 100) as u64,
                        length: 100,
                        transform_descriptors: Vec::new(),
                    },
                ));
            }
            state_dict_metadata.push((
                key,
                StorageMetadata::Tensor(TensorStorageMetadata {
                    properties: TensorProperties::new(DType::BF16),
                    size: vec![ranks * 4, 8],
                    chunks,
                }),
            ));
        }
        let planner_data =
            Some((0..keys).map(|k| (format!("model.layers.{k}.w"), vec![PathItem::Key("model".into())])).collect());
        Metadata { state_dict_metadata, planner_data, storage_data, storage_meta: None, version: None }
    }

    pub(in crate::metadata) fn full_decode(bytes: &[u8]) -> crate::Result<Metadata> {
        full::decode(bytes, Path::new("t"), &ckpt_pickle::Limits::default())
    }

    #[test]
    fn builds_what_the_full_decoder_builds_for_every_fixture() {
        let fixtures = fixtures();
        assert!(fixtures.len() >= 20, "{}", fixtures.len());
        for (path, bytes) in &fixtures {
            let fast =
                decode(bytes, &ckpt_pickle::Limits::default()).unwrap_or_else(|| panic!("{} declined", path.display()));
            assert_eq!(fast, full_decode(bytes).unwrap(), "{}", path.display());
        }
        for profile in [Profile::MaxCompat, Profile::Torch213] {
            let md = sharded(16, 7);
            let bytes = md.to_pickle(profile).unwrap();
            let fast = decode(&bytes, &ckpt_pickle::Limits::default()).unwrap();
            assert_eq!(fast, full_decode(&bytes).unwrap());
            let mut back = fast.clone();
            if profile == Profile::Torch213 {
                back.storage_meta = None;
                back.version = None;
                for (_, md) in &mut back.state_dict_metadata {
                    if let StorageMetadata::Tensor(t) = md {
                        t.properties.legacy_class = false;
                    }
                }
            }
            assert_eq!(back.storage_data, md.storage_data);
        }
    }

    /// `n` mutations (one or two bytes set, flipped or removed) of the fixtures and of two encoded jobs,
    /// from the xorshift state `seed`.
    pub(in crate::metadata) fn mutated_fixtures(seed: u64, n: usize) -> Vec<Vec<u8>> {
        let mut state = seed;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        };
        let mut corpus: Vec<Vec<u8>> = fixtures().into_iter().map(|(_, b)| b).collect();
        corpus.push(sharded(3, 2).to_pickle(Profile::MaxCompat).unwrap());
        corpus.push(sharded(3, 2).to_pickle(Profile::Torch213).unwrap());
        (0..n)
            .map(|_| {
                let mut data = corpus[next() as usize % corpus.len()].clone();
                for _ in 0..=(next() % 2) {
                    let at = next() as usize % data.len();
                    match next() % 3 {
                        0 => data[at] = next() as u8,
                        1 => data[at] ^= 1 << (next() % 8),
                        _ => {
                            data.remove(at);
                        }
                    }
                }
                data
            })
            .collect()
    }

    #[test]
    fn declines_or_agrees_on_mutated_fixtures() {
        let (mut agreed, mut declined) = (0, 0);
        for data in mutated_fixtures(0x2545_f491_4f6c_dd1d, 6000) {
            match decode(&data, &ckpt_pickle::Limits::default()) {
                None => declined += 1,
                Some(fast) => {
                    let full = full_decode(&data).unwrap_or_else(|e| panic!("single pass accepted what fails: {e}"));
                    assert_eq!(fast, full);
                    agreed += 1;
                }
            }
        }
        assert!(agreed > 100 && declined > 100, "{agreed} agreed, {declined} declined");
    }

    /// A torch 2.13 `.metadata` of 2 chunks (and the same with two `storage_data` keys holding one
    /// `_StorageInfo`, written once and referenced twice).
    pub(in crate::metadata) fn info_used_twice() -> (Vec<u8>, Vec<u8>) {
        use ckpt_pickle::{EncodeOptions, Sharing, Value as P};
        let bytes = sharded(2, 1).to_pickle(Profile::Torch213).unwrap();
        let mut root = ckpt_pickle::decode(&bytes).unwrap();
        let P::Object(o) = &mut root else { panic!() };
        let Some(P::Dict(fields)) = &mut o.state else { panic!() };
        let (_, P::Dict(storage)) = fields.iter_mut().find(|(k, _)| k.as_str() == Some("storage_data")).unwrap() else {
            panic!()
        };
        let first = storage[0].1.clone();
        storage[1].1 = first;
        let shared = ckpt_pickle::encode_with(&root, &EncodeOptions::new(4).with_sharing(Sharing::Structural)).unwrap();
        (bytes, shared)
    }

    #[test]
    fn a_typed_object_used_twice_is_left_to_the_full_decoder() {
        let (bytes, shared) = info_used_twice();
        assert!(decode(&shared, &ckpt_pickle::Limits::default()).is_none());
        let full = full_decode(&shared).unwrap();
        assert_eq!(full.storage_data[1].1, full.storage_data[0].1);
        assert_eq!(Metadata::from_pickle(&shared, Path::new("t")).unwrap(), full);
        // Truncation is a decline, never a panic.
        assert!(decode(&bytes[..bytes.len() / 2], &ckpt_pickle::Limits::default()).is_none());
    }
}
