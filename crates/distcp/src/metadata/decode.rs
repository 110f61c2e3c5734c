//! Decoding `.metadata` pickles: the inert pickle tree from `ckpt-pickle`, mapped class by class onto the
//! typed structs. Nothing is imported or executed; an unknown class where a DCP class belongs is an
//! [`Error::UnexpectedClass`]; unknown objects inside `storage_meta` stay opaque values.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use ckpt_core::{DType, PathItem, Value};
use ckpt_pickle::{Object, ObjectKind, Value as P, normalize_global};

use super::{
    ChunkStorageMetadata, FILESYSTEM_MODULE, LEGACY_PROPERTIES_MODULE, METADATA_MODULE, MemoryFormat, Metadata,
    MetadataIndex, PlannerData, StorageInfo, StorageMeta, StorageMetadata, TensorProperties, TensorStorageMetadata,
};
use crate::error::{Error, Result};

pub(super) fn decode(bytes: &[u8], path: &Path, limits: &ckpt_pickle::Limits) -> Result<Metadata> {
    let (root, _) = ckpt_pickle::decode_with(bytes, limits)
        .map_err(|source| Error::MetadataPickle { path: path.to_path_buf(), source })?;
    Decoder { path }.metadata(&root)
}

struct Decoder<'p> {
    path: &'p Path,
}

/// A short description of a pickle value for error messages.
fn describe(v: &P) -> String {
    match v {
        P::Object(o) => match class_name(o) {
            Some((m, n)) => format!("an object of class {m}.{n}"),
            None => "an object of an unnamed class".to_owned(),
        },
        P::Global { module, name } => format!("the global {module}.{name}"),
        P::Str(s) if s.len() <= 40 => format!("the str {s:?}"),
        P::Int(i) => format!("the int {i}"),
        other => format!("a {}", other.type_name()),
    }
}

/// The class an object instantiates: the callable of NEWOBJ / REDUCE, or the class argument of
/// `copyreg._reconstructor` / `copyreg.__newobj__` (protocols 0 and 1).
fn class_name(o: &Object) -> Option<(String, String)> {
    let (m, n) = o.callable_name()?;
    let (m, n) = normalize_global(m, n);
    if m == "copyreg" && (n == "_reconstructor" || n == "__newobj__") {
        let cls = o.args_tuple()?.first()?;
        let (cm, cn) = cls.as_global()?;
        return Some(normalize_global(cm, cn));
    }
    Some((m, n))
}

impl Decoder<'_> {
    fn path(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn bad(&self, context: &str, expected: impl Into<String>, found: &P) -> Error {
        Error::BadField {
            path: self.path(),
            context: context.to_owned(),
            expected: expected.into(),
            found: describe(found),
        }
    }

    /// The object, if `v` instantiates one of `classes` (`(module, name)`), else UnexpectedClass.
    fn object<'v>(
        &self,
        v: &'v P,
        context: &str,
        classes: &[(&str, &str)],
        expected: &'static str,
    ) -> Result<(&'v Object, usize)> {
        if let P::Object(o) = v {
            if let Some((m, n)) = class_name(o) {
                if let Some(i) = classes.iter().position(|(cm, cn)| *cm == m && *cn == n) {
                    return Ok((o, i));
                }
            }
        }
        Err(Error::UnexpectedClass { path: self.path(), context: context.to_owned(), expected, found: describe(v) })
    }

    /// The `__dict__` state of a dataclass instance: `(field, value)` pairs with str keys (empty when the
    /// pickle has no BUILD).
    fn fields<'v>(&self, o: &'v Object, context: &str) -> Result<Vec<(&'v str, &'v P)>> {
        let state = match &o.state {
            None => return Ok(Vec::new()),
            Some(s) => s,
        };
        // A `(None, slots)` or `(dict, slots)` state would come from __slots__ classes; DCP has none.
        let pairs = state.as_dict().ok_or_else(|| self.bad(context, "a dict of fields", state))?;
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            let k = k.as_str().ok_or_else(|| self.bad(context, "str field names", k))?;
            out.push((k, v));
        }
        Ok(out)
    }

    fn field<'v>(&self, fields: &[(&str, &'v P)], name: &str) -> Option<&'v P> {
        fields.iter().rev().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    fn required<'v>(&self, fields: &[(&str, &'v P)], name: &'static str, context: &str) -> Result<&'v P> {
        self.field(fields, name).ok_or_else(|| Error::MissingField {
            path: self.path(),
            context: context.to_owned(),
            field: name,
        })
    }

    fn uint(&self, v: &P, context: &str) -> Result<usize> {
        match v {
            P::Int(i) if *i >= 0 => usize::try_from(*i).map_err(|_| self.bad(context, "an int that fits usize", v)),
            P::Bool(b) => Ok(usize::from(*b)),
            other => Err(self.bad(context, "a non-negative int", other)),
        }
    }

    fn u64(&self, v: &P, context: &str) -> Result<u64> {
        match v {
            P::Int(i) if *i >= 0 => u64::try_from(*i).map_err(|_| self.bad(context, "a non-negative int", v)),
            other => Err(self.bad(context, "a non-negative int", other)),
        }
    }

    fn bool(&self, v: &P, context: &str) -> Result<bool> {
        match v {
            P::Bool(b) => Ok(*b),
            P::Int(i) => Ok(*i != 0),
            other => Err(self.bad(context, "a bool", other)),
        }
    }

    fn string(&self, v: &P, context: &str) -> Result<String> {
        v.as_str().map(str::to_owned).ok_or_else(|| self.bad(context, "a str", v))
    }

    fn opt_string(&self, v: Option<&P>, context: &str) -> Result<Option<String>> {
        match v {
            None | Some(P::None) => Ok(None),
            Some(v) => self.string(v, context).map(Some),
        }
    }

    /// A `torch.Size` (REDUCE of `torch.Size` on a tuple of ints), or a plain tuple/list of ints.
    fn size(&self, v: &P, context: &str) -> Result<Vec<usize>> {
        let dims = match v {
            P::Tuple(items) | P::List(items) => items.as_slice(),
            P::Object(o) => {
                let (m, n) = class_name(o).unwrap_or_default();
                if (m.as_str(), n.as_str()) != ("torch", "Size") {
                    return Err(Error::UnexpectedClass {
                        path: self.path(),
                        context: context.to_owned(),
                        expected: "torch.Size",
                        found: describe(v),
                    });
                }
                match o.args_tuple() {
                    Some([P::Tuple(items) | P::List(items)]) => items.as_slice(),
                    Some([]) => &[],
                    _ => return Err(self.bad(context, "torch.Size applied to a tuple of ints", &o.args)),
                }
            }
            other => return Err(self.bad(context, "a torch.Size", other)),
        };
        dims.iter().map(|d| self.uint(d, context)).collect()
    }

    fn dtype(&self, v: &P, context: &str) -> Result<DType> {
        let Some((m, n)) = v.as_global() else {
            return Err(self.bad(context, "a torch dtype global", v));
        };
        if m != "torch" {
            return Err(self.bad(context, "a torch dtype global", v));
        }
        DType::from_torch_name(n).ok_or_else(|| Error::UnknownDType {
            path: self.path(),
            context: context.to_owned(),
            name: n.to_owned(),
        })
    }

    fn layout(&self, v: &P, context: &str) -> Result<String> {
        let text = match v {
            P::Global { module, name } if module == "torch" => Some(name.clone()),
            P::Object(o) if o.kind == ObjectKind::Reduce => match (o.callable_name(), o.args_tuple()) {
                (Some(("torch.serialization", "_get_layout")), Some([P::Str(s)])) => {
                    Some(s.strip_prefix("torch.").unwrap_or(s).to_owned())
                }
                _ => None,
            },
            _ => None,
        };
        text.ok_or_else(|| self.bad(context, "a torch layout (_get_layout('torch.strided'))", v))
    }

    fn memory_format(&self, v: &P, context: &str) -> Result<MemoryFormat> {
        match v {
            // torch.memory_format objects pickle as globals (dict-shaped state, defensive).
            P::Global { module, name } if module == "torch" => match name.as_str() {
                "contiguous_format" => Ok(MemoryFormat::Contiguous),
                "channels_last" => Ok(MemoryFormat::ChannelsLast),
                "preserve_format" => Ok(MemoryFormat::Preserve),
                _ => Err(self.bad(context, "a memory format", v)),
            },
            P::Object(_) => {
                let (o, _) = self.object(
                    v,
                    context,
                    &[(METADATA_MODULE, "_MEM_FORMAT_ENCODING"), (LEGACY_PROPERTIES_MODULE, "MEM_FORMAT_ENCODING")],
                    "_MEM_FORMAT_ENCODING or MEM_FORMAT_ENCODING",
                )?;
                match o.args_tuple() {
                    Some([P::Int(code)]) => MemoryFormat::from_code(*code)
                        .ok_or_else(|| self.bad(context, "a memory format code 0, 1 or 2", &o.args)),
                    _ => Err(self.bad(context, "the enum applied to an int", &o.args)),
                }
            }
            other => Err(self.bad(context, "a memory format", other)),
        }
    }

    fn strides(&self, v: &P, context: &str) -> Result<Option<Vec<usize>>> {
        match v {
            P::None => Ok(None),
            P::Tuple(items) | P::List(items) => {
                items.iter().map(|d| self.uint(d, context)).collect::<Result<_>>().map(Some)
            }
            other => Err(self.bad(context, "a tuple of ints or None", other)),
        }
    }

    fn properties(&self, v: &P, context: &str) -> Result<TensorProperties> {
        let (o, which) = self.object(
            v,
            context,
            &[(METADATA_MODULE, "TensorProperties"), (LEGACY_PROPERTIES_MODULE, "TensorProperties")],
            "TensorProperties",
        )?;
        let legacy_class = which == 1;
        let state = o.state.as_ref().ok_or_else(|| Error::MissingField {
            path: self.path(),
            context: context.to_owned(),
            field: "__setstate__ tuple",
        })?;
        match state {
            P::Tuple(items) if items.len() == 5 || items.len() == 6 => {
                let ctx = |f: &str| format!("{context}.{f}");
                let strides = match items.get(5) {
                    Some(s) => self.strides(s, &ctx("strides"))?,
                    None => None,
                };
                Ok(TensorProperties {
                    dtype: self.dtype(&items[0], &ctx("dtype"))?,
                    layout: self.layout(&items[1], &ctx("layout"))?,
                    requires_grad: self.bool(&items[2], &ctx("requires_grad"))?,
                    memory_format: self.memory_format(&items[3], &ctx("memory_format"))?,
                    pin_memory: self.bool(&items[4], &ctx("pin_memory"))?,
                    strides,
                    legacy_class,
                })
            }
            P::Dict(_) => {
                // A plain dataclass __dict__ (no custom __getstate__): accepted defensively.
                let f = self.fields(o, context)?;
                let ctx = |f: &str| format!("{context}.{f}");
                Ok(TensorProperties {
                    dtype: self.dtype(self.required(&f, "dtype", context)?, &ctx("dtype"))?,
                    layout: match self.field(&f, "layout") {
                        Some(l) => self.layout(l, &ctx("layout"))?,
                        None => "strided".into(),
                    },
                    requires_grad: match self.field(&f, "requires_grad") {
                        Some(b) => self.bool(b, &ctx("requires_grad"))?,
                        None => false,
                    },
                    memory_format: match self.field(&f, "memory_format") {
                        Some(m) => self.memory_format(m, &ctx("memory_format"))?,
                        None => MemoryFormat::Contiguous,
                    },
                    pin_memory: match self.field(&f, "pin_memory") {
                        Some(b) => self.bool(b, &ctx("pin_memory"))?,
                        None => false,
                    },
                    strides: match self.field(&f, "strides") {
                        Some(s) => self.strides(s, &ctx("strides"))?,
                        None => None,
                    },
                    legacy_class,
                })
            }
            other => Err(self.bad(context, "a 5- or 6-tuple state", other)),
        }
    }

    fn chunk(&self, v: &P, context: &str) -> Result<ChunkStorageMetadata> {
        let (o, _) = self.object(v, context, &[(METADATA_MODULE, "ChunkStorageMetadata")], "ChunkStorageMetadata")?;
        let f = self.fields(o, context)?;
        let offsets = self.size(self.required(&f, "offsets", context)?, &format!("{context}.offsets"))?;
        let sizes = self.size(self.required(&f, "sizes", context)?, &format!("{context}.sizes"))?;
        Ok(ChunkStorageMetadata { offsets, sizes })
    }

    fn storage_metadata(&self, v: &P, context: &str) -> Result<StorageMetadata> {
        let (o, which) = self.object(
            v,
            context,
            &[(METADATA_MODULE, "TensorStorageMetadata"), (METADATA_MODULE, "BytesStorageMetadata")],
            "TensorStorageMetadata or BytesStorageMetadata",
        )?;
        if which == 1 {
            return Ok(StorageMetadata::Bytes);
        }
        let f = self.fields(o, context)?;
        let properties =
            self.properties(self.required(&f, "properties", context)?, &format!("{context}.properties"))?;
        let size = self.size(self.required(&f, "size", context)?, &format!("{context}.size"))?;
        let chunks_v = self.required(&f, "chunks", context)?;
        let items = chunks_v
            .as_list()
            .or_else(|| chunks_v.as_tuple())
            .ok_or_else(|| self.bad(&format!("{context}.chunks"), "a list of ChunkStorageMetadata", chunks_v))?;
        let chunks = items
            .iter()
            .enumerate()
            .map(|(i, c)| self.chunk(c, &format!("{context}.chunks[{i}]")))
            .collect::<Result<_>>()?;
        Ok(StorageMetadata::Tensor(TensorStorageMetadata { properties, size, chunks }))
    }

    fn metadata_index(&self, v: &P, context: &str) -> Result<MetadataIndex> {
        let (o, _) = self.object(v, context, &[(METADATA_MODULE, "MetadataIndex")], "MetadataIndex")?;
        let f = self.fields(o, context)?;
        let fqn = self.string(self.required(&f, "fqn", context)?, &format!("{context}.fqn"))?;
        let offset = match self.field(&f, "offset") {
            None | Some(P::None) => None,
            Some(s) => Some(self.size(s, &format!("{context}.offset"))?),
        };
        let index = match self.field(&f, "index") {
            None | Some(P::None) => None,
            Some(i) => Some(self.uint(i, &format!("{context}.index"))?),
        };
        Ok(MetadataIndex { fqn, offset, index })
    }

    fn storage_info(&self, v: &P, context: &str) -> Result<StorageInfo> {
        let (o, _) = self.object(v, context, &[(FILESYSTEM_MODULE, "_StorageInfo")], "_StorageInfo")?;
        let f = self.fields(o, context)?;
        let relative_path =
            self.string(self.required(&f, "relative_path", context)?, &format!("{context}.relative_path"))?;
        let offset = self.u64(self.required(&f, "offset", context)?, &format!("{context}.offset"))?;
        let length = self.u64(self.required(&f, "length", context)?, &format!("{context}.length"))?;
        let transform_descriptors = match self.field(&f, "transform_descriptors") {
            None | Some(P::None) => Vec::new(),
            Some(P::List(items) | P::Tuple(items)) => items
                .iter()
                .map(|d| self.string(d, &format!("{context}.transform_descriptors")))
                .collect::<Result<_>>()?,
            Some(other) => {
                return Err(self.bad(&format!("{context}.transform_descriptors"), "a list of str", other));
            }
        };
        Ok(StorageInfo { relative_path, offset, length, transform_descriptors })
    }

    fn storage_meta(&self, v: &P, context: &str) -> Result<Option<StorageMeta>> {
        if v.is_none() {
            return Ok(None);
        }
        let (o, _) = self.object(v, context, &[(METADATA_MODULE, "StorageMeta")], "StorageMeta")?;
        let f = self.fields(o, context)?;
        let checkpoint_id = self.field(&f, "checkpoint_id").map(to_core_value).unwrap_or(Value::None);
        let save_id = self.opt_string(self.field(&f, "save_id"), &format!("{context}.save_id"))?;
        let load_id = self.opt_string(self.field(&f, "load_id"), &format!("{context}.load_id"))?;
        let modules = match self.field(&f, "modules") {
            None | Some(P::None) => None,
            Some(P::List(items) | P::Tuple(items)) => {
                Some(items.iter().map(|m| self.string(m, &format!("{context}.modules"))).collect::<Result<_>>()?)
            }
            Some(other) => return Err(self.bad(&format!("{context}.modules"), "a list of str", other)),
        };
        Ok(Some(StorageMeta { checkpoint_id, save_id, load_id, modules }))
    }

    fn planner_data(&self, v: Option<&P>) -> Result<Option<PlannerData>> {
        let pairs = match v {
            None | Some(P::None) => return Ok(None),
            Some(P::Dict(pairs)) => pairs,
            Some(other) => return Err(self.bad("planner_data", "a dict or None", other)),
        };
        let mut out = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            let Some(key) = k.as_str() else { continue };
            let path: Option<Vec<PathItem>> = v.as_tuple().or_else(|| v.as_list()).and_then(|items| {
                items
                    .iter()
                    .map(|p| match p {
                        P::Str(s) => Some(PathItem::Key(s.clone())),
                        P::Int(i) => usize::try_from(*i).ok().map(PathItem::Index),
                        _ => None,
                    })
                    .collect()
            });
            // Entries a custom planner filled with other objects are left out (the key then maps to itself).
            if let Some(path) = path.filter(|p| !p.is_empty()) {
                out.push((key.to_owned(), path));
            }
        }
        Ok(Some(out))
    }

    fn metadata(&self, root: &P) -> Result<Metadata> {
        let (o, _) = self.object(root, "the pickled object", &[(METADATA_MODULE, "Metadata")], "Metadata")?;
        let f = self.fields(o, "Metadata")?;

        let sdm = self.required(&f, "state_dict_metadata", "Metadata")?;
        let sdm_pairs = sdm.as_dict().ok_or_else(|| self.bad("state_dict_metadata", "a dict", sdm))?;
        let mut state_dict_metadata = Vec::with_capacity(sdm_pairs.len());
        let mut seen = HashSet::with_capacity(sdm_pairs.len());
        for (k, v) in sdm_pairs {
            let key = self.string(k, "state_dict_metadata key")?;
            let context = format!("state_dict_metadata[{key:?}]");
            if !seen.insert(key.clone()) {
                return Err(self.bad(&context, "unique keys", k));
            }
            let md = self.storage_metadata(v, &context)?;
            state_dict_metadata.push((key, md));
        }

        let sd = self.required(&f, "storage_data", "Metadata")?;
        let sd_pairs = sd.as_dict().ok_or_else(|| self.bad("storage_data", "a dict", sd))?;
        let mut storage_data = Vec::with_capacity(sd_pairs.len());
        for (i, (k, v)) in sd_pairs.iter().enumerate() {
            let index = self.metadata_index(k, &format!("storage_data key #{i}"))?;
            let info = self.storage_info(v, &format!("storage_data[{:?}]", index.fqn))?;
            storage_data.push((index, info));
        }

        let planner_data = self.planner_data(self.field(&f, "planner_data"))?;
        let storage_meta = match self.field(&f, "storage_meta") {
            None => None,
            Some(v) => self.storage_meta(v, "storage_meta")?,
        };
        let version = self.opt_string(self.field(&f, "version"), "version")?;
        Ok(Metadata { state_dict_metadata, planner_data, storage_data, storage_meta, version })
    }
}

/// Converts an inert pickle value into the core value tree (for `storage_meta` contents). A
/// `pathlib.*Path` object becomes the string of its path.
pub(crate) fn to_core_value(v: &P) -> Value {
    match v {
        P::None => Value::None,
        P::Bool(b) => Value::Bool(*b),
        P::Int(i) => Value::Int(*i),
        P::BigInt(b) => Value::BigInt(b.clone()),
        P::Float(f) => Value::Float(*f),
        P::Str(s) => Value::Str(s.clone()),
        P::Bytes(b) => Value::Bytes(b.clone()),
        P::ByteArray(b) => Value::ByteArray(b.clone()),
        P::List(items) => Value::List(items.iter().map(to_core_value).collect()),
        P::Tuple(items) => Value::Tuple(items.iter().map(to_core_value).collect()),
        P::Set(items) => Value::Set(items.iter().map(to_core_value).collect()),
        P::FrozenSet(items) => Value::FrozenSet(items.iter().map(to_core_value).collect()),
        P::Dict(pairs) => Value::Dict(ckpt_core::Dict {
            kind: ckpt_core::DictKind::Dict,
            items: pairs.iter().map(|(k, v)| (to_core_value(k), to_core_value(v))).collect(),
            attrs: None,
        }),
        P::Global { module, name } => Value::Global { module: module.clone(), name: name.clone() },
        P::PersistentId(inner) => Value::Tuple(vec![Value::Str("persistent_id".into()), to_core_value(inner)]),
        P::Object(o) => {
            if let Some(path) = pathlib_string(o) {
                return Value::Str(path);
            }
            Value::Object(Box::new(ckpt_core::Object {
                callable: to_core_value(&o.callable),
                args: to_core_value(&o.args),
                newobj: !matches!(o.kind, ObjectKind::Reduce),
                state: o.state.as_ref().map(to_core_value),
                list_items: o.list_items.iter().map(to_core_value).collect(),
                dict_items: o.dict_items.iter().map(|(k, v)| (to_core_value(k), to_core_value(v))).collect(),
            }))
        }
    }
}

/// The path string of a `pathlib.PosixPath(*parts)` / `pathlib._local.PosixPath(path)` object (CPython
/// 3.11-3.14; Windows paths joined with `\`).
fn pathlib_string(o: &Object) -> Option<String> {
    let (m, n) = o.callable_name()?;
    if !(m == "pathlib" || m.starts_with("pathlib.")) || !n.ends_with("Path") {
        return None;
    }
    let parts: Vec<&str> = o.args_tuple()?.iter().map(P::as_str).collect::<Option<_>>()?;
    let sep = if n.contains("Windows") { '\\' } else { '/' };
    let mut out = String::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 && !out.ends_with(sep) {
            out.push(sep);
        }
        out.push_str(p);
    }
    Some(out)
}
