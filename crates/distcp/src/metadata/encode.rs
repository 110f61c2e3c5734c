//! Encoding `.metadata` pickles in two profiles: the maximum-compatibility profile every torch 2.0 to 2.15
//! loads (spec section 10), and torch 2.13's own output, memo for memo.

use std::collections::HashMap;

use ckpt_pickle::Pickler;
use ckpt_tensor::{PathItem, Value};

use super::{
    ChunkStorageMetadata, FILESYSTEM_MODULE, LEGACY_PROPERTIES_MODULE, METADATA_MODULE, Metadata, MetadataIndex,
    StorageInfo, StorageMeta, StorageMetadata, TensorProperties, TensorStorageMetadata,
};
use crate::error::{Error, Result};

/// How the writer lays out `.metadata` (and its data items).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Profile {
    /// Loads in every torch from 2.0 to 2.15 (spec section 10): protocol-2 pickle without memo, the legacy
    /// `torch.distributed._shard.sharded_tensor.metadata.TensorProperties` with a 5-tuple state, no
    /// `storage_meta` and no `version`; items are minimal `torch.save` archives (`data.pkl`, `data/N`,
    /// `version`).
    ///
    /// Keys follow torch 2.4+'s flattening, so a nested dict that holds no tensor (`{"hp": {"name":
    /// "adam"}}` → `hp.name`) loads in torch 2.4+ only: torch 2.0-2.3 flatten it differently, and no key
    /// layout loads in both (spec section 9). Such values aside, and with dtypes torch 2.0 knows, the
    /// output loads in every release.
    #[default]
    MaxCompat,
    /// What torch 2.13 writes: protocol 4 with CPython's memo and framing, `TensorProperties` from
    /// `torch.distributed.checkpoint.metadata`, `storage_meta` (`PosixPath` checkpoint id, uuid4 save id,
    /// `modules=[]`) and `version="1.0.0"`; items are torch 2.13 `torch.save` archives. Loads in torch 2.3
    /// and later (2.4+ for `storage_meta`).
    Torch213,
}

impl Metadata {
    /// Encodes this metadata as a `.metadata` pickle in `profile`.
    ///
    /// # Errors
    /// [`crate::Error::Unwritable`] for values the pickle cannot hold.
    pub fn to_pickle(&self, profile: Profile) -> crate::Result<Vec<u8>> {
        encode(self, profile)
    }
}

pub(super) fn encode(md: &Metadata, profile: Profile) -> Result<Vec<u8>> {
    match profile {
        Profile::MaxCompat => MaxCompat::new()?.metadata(md),
        Profile::Torch213 => Torch213::new()?.metadata(md),
    }
}

fn perr(e: ckpt_pickle::Error) -> Error {
    Error::unwritable("", format!(".metadata pickle: {e}"))
}

fn int_of(v: usize, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::unwritable("", format!("{what} {v} does not fit a Python int64")))
}

fn u64_int(v: u64, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::unwritable("", format!("{what} {v} does not fit a Python int64")))
}

/// The parts of a path as Python's `pathlib.PurePosixPath(path).parts` gives them.
fn posix_parts(path: &str) -> Vec<String> {
    let mut parts = Vec::new();
    if path.starts_with('/') {
        // POSIX keeps exactly two leading slashes distinct; everything else collapses to one.
        let root = if path.starts_with("//") && !path.starts_with("///") { "//" } else { "/" };
        parts.push(root.to_owned());
    }
    parts.extend(path.split('/').filter(|p| !p.is_empty() && *p != ".").map(str::to_owned));
    parts
}

// ---------------------------------------------------------------------------------------------------------
// Maximum-compatibility profile: protocol 2, no memo, every dict and list filled in marked batches, as
// CPython's pickler fills them (the reference emitter of the spec's fixtures k_plain / k_aligned).

struct MaxCompat {
    p: Pickler<Vec<u8>>,
}

impl MaxCompat {
    fn new() -> Result<Self> {
        Ok(MaxCompat { p: Pickler::new(Vec::new(), 2).map_err(perr)? })
    }

    fn newobj(&mut self, module: &str, name: &str) -> Result<()> {
        self.p.global(module, name).map_err(perr)?;
        self.p.empty_tuple().map_err(perr)?;
        self.p.newobj().map_err(perr)
    }

    /// Starts a dict state: an empty dict, then the mark of its batch of items.
    fn dict_start(&mut self) -> Result<()> {
        self.p.empty_dict().map_err(perr)?;
        self.p.mark().map_err(perr)
    }

    fn dict_end_build(&mut self) -> Result<()> {
        self.p.setitems().map_err(perr)?;
        self.p.build().map_err(perr)
    }

    fn key(&mut self, s: &str) -> Result<()> {
        self.p.str(s).map_err(perr)
    }

    fn size(&mut self, dims: &[usize]) -> Result<()> {
        self.p.global("torch", "Size").map_err(perr)?;
        self.p.begin_tuple(dims.len()).map_err(perr)?;
        for &d in dims {
            self.p.int(int_of(d, "dimension")?).map_err(perr)?;
        }
        self.p.tuple(dims.len()).map_err(perr)?;
        self.p.tuple(1).map_err(perr)?;
        self.p.reduce().map_err(perr)
    }

    fn properties(&mut self, props: &TensorProperties) -> Result<()> {
        self.newobj(LEGACY_PROPERTIES_MODULE, "TensorProperties")?;
        self.p.begin_tuple(5).map_err(perr)?;
        self.p.global("torch", props.dtype.torch_name()).map_err(perr)?;
        self.p.global("torch.serialization", "_get_layout").map_err(perr)?;
        self.p.str(&format!("torch.{}", props.layout)).map_err(perr)?;
        self.p.tuple(1).map_err(perr)?;
        self.p.reduce().map_err(perr)?;
        self.p.bool(props.requires_grad).map_err(perr)?;
        self.p.global(LEGACY_PROPERTIES_MODULE, "MEM_FORMAT_ENCODING").map_err(perr)?;
        self.p.int(props.memory_format.code()).map_err(perr)?;
        self.p.tuple(1).map_err(perr)?;
        self.p.reduce().map_err(perr)?;
        self.p.bool(props.pin_memory).map_err(perr)?;
        self.p.tuple(5).map_err(perr)?;
        self.p.build().map_err(perr)
    }

    fn chunk(&mut self, c: &ChunkStorageMetadata) -> Result<()> {
        self.newobj(METADATA_MODULE, "ChunkStorageMetadata")?;
        self.dict_start()?;
        self.key("offsets")?;
        self.size(&c.offsets)?;
        self.key("sizes")?;
        self.size(&c.sizes)?;
        self.dict_end_build()
    }

    fn tensor_md(&mut self, t: &TensorStorageMetadata) -> Result<()> {
        self.newobj(METADATA_MODULE, "TensorStorageMetadata")?;
        self.dict_start()?;
        self.key("properties")?;
        self.properties(&t.properties)?;
        self.key("size")?;
        self.size(&t.size)?;
        self.key("chunks")?;
        self.p.empty_list().map_err(perr)?;
        self.p.mark().map_err(perr)?;
        for c in &t.chunks {
            self.chunk(c)?;
        }
        self.p.appends().map_err(perr)?;
        self.dict_end_build()
    }

    fn index(&mut self, i: &MetadataIndex) -> Result<()> {
        self.newobj(METADATA_MODULE, "MetadataIndex")?;
        self.dict_start()?;
        self.key("fqn")?;
        self.p.str(&i.fqn).map_err(perr)?;
        self.key("index")?;
        match i.index {
            Some(n) => self.p.int(int_of(n, "chunk index")?).map_err(perr)?,
            None => self.p.none().map_err(perr)?,
        }
        if let Some(off) = &i.offset {
            self.key("offset")?;
            self.size(off)?;
        }
        self.dict_end_build()
    }

    fn info(&mut self, s: &StorageInfo) -> Result<()> {
        self.newobj(FILESYSTEM_MODULE, "_StorageInfo")?;
        self.dict_start()?;
        self.key("relative_path")?;
        self.p.str(&s.relative_path).map_err(perr)?;
        self.key("offset")?;
        self.p.int(u64_int(s.offset, "item offset")?).map_err(perr)?;
        self.key("length")?;
        self.p.int(u64_int(s.length, "item length")?).map_err(perr)?;
        if !s.transform_descriptors.is_empty() {
            self.key("transform_descriptors")?;
            self.p.empty_list().map_err(perr)?;
            self.p.mark().map_err(perr)?;
            for d in &s.transform_descriptors {
                self.p.str(d).map_err(perr)?;
            }
            self.p.appends().map_err(perr)?;
        }
        self.dict_end_build()
    }

    fn metadata(mut self, md: &Metadata) -> Result<Vec<u8>> {
        self.newobj(METADATA_MODULE, "Metadata")?;
        self.dict_start()?;
        self.key("state_dict_metadata")?;
        self.p.empty_dict().map_err(perr)?;
        self.p.mark().map_err(perr)?;
        for (k, v) in &md.state_dict_metadata {
            self.key(k)?;
            match v {
                StorageMetadata::Tensor(t) => self.tensor_md(t)?,
                StorageMetadata::Bytes => {
                    self.newobj(METADATA_MODULE, "BytesStorageMetadata")?;
                    self.dict_start()?;
                    self.dict_end_build()?;
                }
            }
        }
        self.p.setitems().map_err(perr)?;
        // planner_data is always a dict (torch 2.3-2.7 dcp_to_torch_save needs it).
        self.key("planner_data")?;
        self.p.empty_dict().map_err(perr)?;
        self.p.mark().map_err(perr)?;
        let empty = Vec::new();
        for (k, path) in md.planner_data.as_ref().unwrap_or(&empty) {
            self.key(k)?;
            self.p.begin_tuple(path.len()).map_err(perr)?;
            for step in path {
                match step {
                    PathItem::Key(s) => self.p.str(s).map_err(perr)?,
                    PathItem::Index(i) => self.p.int(int_of(*i, "list index")?).map_err(perr)?,
                }
            }
            self.p.tuple(path.len()).map_err(perr)?;
        }
        self.p.setitems().map_err(perr)?;
        self.key("storage_data")?;
        self.p.empty_dict().map_err(perr)?;
        self.p.mark().map_err(perr)?;
        for (i, s) in &md.storage_data {
            self.index(i)?;
            self.info(s)?;
        }
        self.p.setitems().map_err(perr)?;
        self.dict_end_build()?;
        self.p.finish().map_err(perr)
    }
}

// ---------------------------------------------------------------------------------------------------------
// torch 2.13 profile: protocol 4, CPython's memo. Identity model (what CPython shares by object identity in
// the Metadata object graph torch builds): class globals, dtype globals, the strided layout object and each
// memory-format enum member are one object each; field names, keys, path elements and relative paths are
// shared by value (interned attribute names, one key string per fqn, dict keys shared along a path);
// `torch.Size`'s module string `'torch'` is its own object, apart from the dtypes' `'torch'`; every
// `torch.Size`, tuple, list, dict and dataclass instance is a fresh object.

struct Torch213 {
    p: Pickler<Vec<u8>>,
    strings: HashMap<String, u32>,
    layouts: HashMap<String, u32>,
    mem_formats: HashMap<i64, u32>,
    size_global: Option<u32>,
}

impl Torch213 {
    fn new() -> Result<Self> {
        Ok(Torch213 {
            p: Pickler::new(Vec::new(), 4).map_err(perr)?,
            strings: HashMap::new(),
            layouts: HashMap::new(),
            mem_formats: HashMap::new(),
            size_global: None,
        })
    }

    fn memo(&mut self) -> Result<u32> {
        self.p.memoize().map_err(perr)
    }

    /// A string shared by value among the keys, field names, paths and file names (but not with the
    /// module and class names of globals, which CPython takes from other objects).
    fn s(&mut self, s: &str) -> Result<()> {
        if let Some(&id) = self.strings.get(s) {
            return self.p.get(id).map_err(perr);
        }
        self.p.str(s).map_err(perr)?;
        let id = self.memo()?;
        self.strings.insert(s.to_owned(), id);
        Ok(())
    }

    /// `cls.__new__(cls)`: the class global, `()`, the `__new__` call, memoized.
    fn newobj(&mut self, module: &str, name: &str) -> Result<()> {
        self.p.global_memo(module, name).map_err(perr)?;
        self.p.empty_tuple().map_err(perr)?;
        self.p.newobj().map_err(perr)?;
        self.memo().map(|_| ())
    }

    /// CPython's `batch_dict_exact` over `n` items written by `item(self, i)`: one item set alone, otherwise
    /// marked batches of 1000 items, with the trailing empty batch CPython writes when `n` is a multiple of
    /// 1000.
    fn setitems(&mut self, n: usize, mut item: impl FnMut(&mut Self, usize) -> Result<()>) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if n == 1 {
            item(self, 0)?;
            return self.p.setitem().map_err(perr);
        }
        let mut i = 0;
        loop {
            self.p.mark().map_err(perr)?;
            let mut batch = 0;
            while i < n {
                item(self, i)?;
                i += 1;
                batch += 1;
                if batch == 1000 {
                    break;
                }
            }
            self.p.setitems().map_err(perr)?;
            if batch != 1000 {
                return Ok(());
            }
        }
    }

    /// CPython's `batch_list_exact`: one item appended alone, otherwise marked batches of 1000 items.
    fn appends(&mut self, n: usize, mut item: impl FnMut(&mut Self, usize) -> Result<()>) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if n == 1 {
            item(self, 0)?;
            return self.p.append().map_err(perr);
        }
        let mut i = 0;
        while i < n {
            self.p.mark().map_err(perr)?;
            let end = (i + 1000).min(n);
            while i < end {
                item(self, i)?;
                i += 1;
            }
            self.p.appends().map_err(perr)?;
        }
        Ok(())
    }

    /// A dataclass `__dict__` state: an empty dict (memoized), the fields, then `__setstate__`.
    fn build_fields(&mut self, n: usize, item: impl FnMut(&mut Self, usize) -> Result<()>) -> Result<()> {
        self.p.empty_dict().map_err(perr)?;
        self.memo()?;
        self.setitems(n, item)?;
        self.p.build().map_err(perr)
    }

    /// A non-empty tuple of ints (memoized), or the empty tuple.
    fn int_tuple(&mut self, dims: &[usize]) -> Result<()> {
        if dims.is_empty() {
            return self.p.empty_tuple().map_err(perr);
        }
        self.p.begin_tuple(dims.len()).map_err(perr)?;
        for &d in dims {
            self.p.int(int_of(d, "dimension")?).map_err(perr)?;
        }
        self.p.tuple(dims.len()).map_err(perr)?;
        self.memo().map(|_| ())
    }

    fn size(&mut self, dims: &[usize]) -> Result<()> {
        match self.size_global {
            Some(id) => self.p.get(id).map_err(perr)?,
            None => {
                // torch.Size.__module__ is a different str object from the 'torch' the dtypes use.
                self.p.boundary().map_err(perr)?;
                self.p.str("torch").map_err(perr)?;
                self.memo()?;
                self.p.shared_str("Size").map_err(perr)?;
                self.p.stack_global().map_err(perr)?;
                let id = self.memo()?;
                self.size_global = Some(id);
            }
        }
        self.int_tuple(dims)?;
        self.p.tuple(1).map_err(perr)?;
        self.memo()?;
        self.p.reduce().map_err(perr)?;
        self.memo().map(|_| ())
    }

    fn layout(&mut self, layout: &str) -> Result<()> {
        if let Some(&id) = self.layouts.get(layout) {
            return self.p.get(id).map_err(perr);
        }
        self.p.global_memo("torch.serialization", "_get_layout").map_err(perr)?;
        self.p.str(&format!("torch.{layout}")).map_err(perr)?;
        self.memo()?;
        self.p.tuple(1).map_err(perr)?;
        self.memo()?;
        self.p.reduce().map_err(perr)?;
        let id = self.memo()?;
        self.layouts.insert(layout.to_owned(), id);
        Ok(())
    }

    fn mem_format(&mut self, code: i64) -> Result<()> {
        if let Some(&id) = self.mem_formats.get(&code) {
            return self.p.get(id).map_err(perr);
        }
        self.p.global_memo(METADATA_MODULE, "_MEM_FORMAT_ENCODING").map_err(perr)?;
        self.p.int(code).map_err(perr)?;
        self.p.tuple(1).map_err(perr)?;
        self.memo()?;
        self.p.reduce().map_err(perr)?;
        let id = self.memo()?;
        self.mem_formats.insert(code, id);
        Ok(())
    }

    fn properties(&mut self, props: &TensorProperties) -> Result<()> {
        self.newobj(METADATA_MODULE, "TensorProperties")?;
        self.p.begin_tuple(5).map_err(perr)?;
        self.p.global_memo("torch", props.dtype.torch_name()).map_err(perr)?;
        self.layout(&props.layout)?;
        self.p.bool(props.requires_grad).map_err(perr)?;
        self.mem_format(props.memory_format.code())?;
        self.p.bool(props.pin_memory).map_err(perr)?;
        self.p.tuple(5).map_err(perr)?;
        self.memo()?;
        self.p.build().map_err(perr)
    }

    fn chunk(&mut self, c: &ChunkStorageMetadata) -> Result<()> {
        self.newobj(METADATA_MODULE, "ChunkStorageMetadata")?;
        self.build_fields(2, |me, i| {
            if i == 0 {
                me.s("offsets")?;
                me.size(&c.offsets)
            } else {
                me.s("sizes")?;
                me.size(&c.sizes)
            }
        })
    }

    fn tensor_md(&mut self, t: &TensorStorageMetadata) -> Result<()> {
        self.newobj(METADATA_MODULE, "TensorStorageMetadata")?;
        self.build_fields(3, |me, i| match i {
            0 => {
                me.s("properties")?;
                me.properties(&t.properties)
            }
            1 => {
                me.s("size")?;
                me.size(&t.size)
            }
            _ => {
                me.s("chunks")?;
                me.p.empty_list().map_err(perr)?;
                me.memo()?;
                me.appends(t.chunks.len(), |me, j| me.chunk(&t.chunks[j]))
            }
        })
    }

    fn index(&mut self, ix: &MetadataIndex) -> Result<()> {
        self.newobj(METADATA_MODULE, "MetadataIndex")?;
        let n = if ix.offset.is_some() { 3 } else { 2 };
        self.build_fields(n, |me, i| match i {
            0 => {
                me.s("fqn")?;
                me.s(&ix.fqn)
            }
            1 => {
                me.s("index")?;
                match ix.index {
                    Some(v) => me.p.int(int_of(v, "chunk index")?).map_err(perr),
                    None => me.p.none().map_err(perr),
                }
            }
            _ => {
                me.s("offset")?;
                me.size(ix.offset.as_deref().unwrap_or_default())
            }
        })
    }

    fn info(&mut self, s: &StorageInfo) -> Result<()> {
        self.newobj(FILESYSTEM_MODULE, "_StorageInfo")?;
        let n = if s.transform_descriptors.is_empty() { 3 } else { 4 };
        self.build_fields(n, |me, i| match i {
            0 => {
                me.s("relative_path")?;
                me.s(&s.relative_path)
            }
            1 => {
                me.s("offset")?;
                me.p.int(u64_int(s.offset, "item offset")?).map_err(perr)
            }
            2 => {
                me.s("length")?;
                me.p.int(u64_int(s.length, "item length")?).map_err(perr)
            }
            _ => {
                me.s("transform_descriptors")?;
                me.p.empty_list().map_err(perr)?;
                me.memo()?;
                me.appends(s.transform_descriptors.len(), |me, j| me.s(&s.transform_descriptors[j]))
            }
        })
    }

    fn checkpoint_id(&mut self, v: &Value) -> Result<()> {
        match v {
            Value::None => self.p.none().map_err(perr),
            Value::Str(path) => {
                self.p.global_memo("pathlib", "PosixPath").map_err(perr)?;
                let parts = posix_parts(path);
                if parts.is_empty() {
                    self.p.empty_tuple().map_err(perr)?;
                } else {
                    self.p.begin_tuple(parts.len()).map_err(perr)?;
                    for part in &parts {
                        self.p.str(part).map_err(perr)?;
                        self.memo()?;
                    }
                    self.p.tuple(parts.len()).map_err(perr)?;
                    self.memo()?;
                }
                self.p.reduce().map_err(perr)?;
                self.memo().map(|_| ())
            }
            other => Err(Error::unwritable(
                "",
                format!("storage_meta.checkpoint_id must be a path string or None, not a {}", other.type_name()),
            )),
        }
    }

    fn opt_str(&mut self, v: Option<&str>) -> Result<()> {
        match v {
            Some(s) => {
                self.p.str(s).map_err(perr)?;
                self.memo().map(|_| ())
            }
            None => self.p.none().map_err(perr),
        }
    }

    fn storage_meta(&mut self, sm: Option<&StorageMeta>) -> Result<()> {
        let Some(sm) = sm else {
            return self.p.none().map_err(perr);
        };
        self.newobj(METADATA_MODULE, "StorageMeta")?;
        let empty = Vec::new();
        let modules = sm.modules.as_ref().unwrap_or(&empty);
        self.build_fields(4, |me, i| match i {
            0 => {
                me.s("checkpoint_id")?;
                me.checkpoint_id(&sm.checkpoint_id)
            }
            1 => {
                me.s("save_id")?;
                me.opt_str(sm.save_id.as_deref())
            }
            2 => {
                me.s("load_id")?;
                me.opt_str(sm.load_id.as_deref())
            }
            _ => {
                me.s("modules")?;
                me.p.empty_list().map_err(perr)?;
                me.memo()?;
                me.appends(modules.len(), |me, j| me.s(&modules[j]))
            }
        })
    }

    fn path(&mut self, path: &[PathItem]) -> Result<()> {
        if path.is_empty() {
            return self.p.empty_tuple().map_err(perr);
        }
        self.p.begin_tuple(path.len()).map_err(perr)?;
        for step in path {
            match step {
                PathItem::Key(k) => self.s(k)?,
                PathItem::Index(i) => self.p.int(int_of(*i, "list index")?).map_err(perr)?,
            }
        }
        self.p.tuple(path.len()).map_err(perr)?;
        self.memo().map(|_| ())
    }

    fn metadata(mut self, md: &Metadata) -> Result<Vec<u8>> {
        self.newobj(METADATA_MODULE, "Metadata")?;
        self.build_fields(5, |me, i| match i {
            0 => {
                me.s("state_dict_metadata")?;
                me.p.empty_dict().map_err(perr)?;
                me.memo()?;
                me.setitems(md.state_dict_metadata.len(), |me, j| {
                    let (k, v) = &md.state_dict_metadata[j];
                    me.s(k)?;
                    match v {
                        StorageMetadata::Tensor(t) => me.tensor_md(t),
                        // BytesStorageMetadata has an empty __dict__: no state is set.
                        StorageMetadata::Bytes => me.newobj(METADATA_MODULE, "BytesStorageMetadata"),
                    }
                })
            }
            1 => {
                me.s("planner_data")?;
                match &md.planner_data {
                    None => me.p.none().map_err(perr),
                    Some(pd) => {
                        me.p.empty_dict().map_err(perr)?;
                        me.memo()?;
                        me.setitems(pd.len(), |me, j| {
                            let (k, path) = &pd[j];
                            me.s(k)?;
                            me.path(path)
                        })
                    }
                }
            }
            2 => {
                me.s("storage_data")?;
                me.p.empty_dict().map_err(perr)?;
                me.memo()?;
                me.setitems(md.storage_data.len(), |me, j| {
                    let (ix, info) = &md.storage_data[j];
                    me.index(ix)?;
                    me.info(info)
                })
            }
            3 => {
                me.s("storage_meta")?;
                me.storage_meta(md.storage_meta.as_ref())
            }
            _ => {
                me.s("version")?;
                me.opt_str(md.version.as_deref())
            }
        })?;
        self.p.finish().map_err(perr)
    }
}

#[cfg(test)]
mod tests {
    use super::posix_parts;

    #[test]
    fn pathlib_parts() {
        assert_eq!(posix_parts("c215"), ["c215"]);
        assert_eq!(posix_parts("/tmp/x/"), ["/", "tmp", "x"]);
        assert_eq!(posix_parts("./a//b/."), ["a", "b"]);
        assert_eq!(posix_parts("//srv"), ["//", "srv"]);
        assert_eq!(posix_parts("."), Vec::<String>::new());
        assert_eq!(posix_parts("a/../b"), ["a", "..", "b"]);
    }
}
