//! Writing `torch.save` files: the ZIP layout torch 2.13+ produces, with `data.pkl` pickled the way
//! CPython's protocol-2 pickler pickles the equivalent Python objects, using only what
//! `torch.load(weights_only=True)` accepts.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use ckpt_io::Durability;
use ckpt_io::SaveReport;
use ckpt_pickle::Pickler;
use ckpt_tensor::{Buffer, DType, Dict, DictKind, Object, StorageClass, Tensor, Value};

use crate::error::{Error, Result};
use crate::zip::{WriterOptions, ZipWriter};

/// Options for writing.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WriteOptions {
    /// How durably [`save`] writes: `sync` and `direct_io` for the file's commit, and `checksums` for the
    /// records' CRC-32s (torch's default; off writes 0 everywhere, like
    /// `torch.serialization.set_crc32_options(False)`).
    pub durability: Durability,
    /// Data alignment of every record (torch's `storage_alignment`, default 64).
    pub storage_alignment: u64,
    /// Write the `.format_version`, `.storage_alignment` and `byteorder` records and
    /// `.data/serialization_id`, as torch 2.13+ does. Off gives the minimal archive older readers expect.
    pub torch_2_13_records: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { durability: Durability::default(), storage_alignment: 64, torch_2_13_records: true }
    }
}

impl WriteOptions {
    /// These options with `durability` ([`WriteOptions::durability`]).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Data alignment of every record (default 64; torch's `storage_alignment`).
    #[must_use]
    pub fn with_storage_alignment(mut self, alignment: u64) -> Self {
        self.storage_alignment = alignment;
        self
    }

    /// Write torch 2.13's `.format_version`, `.storage_alignment`, `byteorder` and `.data/serialization_id`
    /// records (default), or only `data.pkl`, the storages and `version`.
    #[must_use]
    pub fn with_torch_2_13_records(mut self, on: bool) -> Self {
        self.torch_2_13_records = on;
        self
    }
}

/// The archive prefix torch uses when saving to `path`: the file name without its last extension
/// (`model.pt` → `model`, `model.tar.gz` → `model.tar`); names that are not ASCII get `archive`, as torch
/// writes them through a Python file object.
///
/// # Errors
/// [`Error::Unwritable`] for a path without a usable file name (`.hidden`, `..`).
pub fn prefix_for_path(path: &Path) -> Result<String> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Unwritable(format!("invalid file name {}", path.display())))?;
    if !name.is_ascii() {
        return Ok("archive".into());
    }
    let stem = match name.rfind('.') {
        Some(0) => return Err(Error::Unwritable(format!("invalid file name {name:?}"))),
        Some(i) => &name[..i],
        None => name,
    };
    Ok(stem.to_owned())
}

/// Saves `value` to `path` like `torch.save(value, path)`, durably and atomically: through
/// [`ckpt_io`] (an advisory lock, a temporary file beside `path` written with `O_DIRECT` where the
/// file system allows, `fdatasync`, rename, directory fsync). A crash leaves the old file or the new one.
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_torch::WriteOptions;
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("w.pt");
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
/// let report = ckpt_torch::save(&sd, &path, &WriteOptions::default()).unwrap();
/// assert_eq!((report.tensors, report.bytes, report.files.len()), (1, 8, 1));
/// assert_eq!(ckpt_torch::load(&path).unwrap(), sd);
/// ```
///
/// # Errors
/// [`Error::Unwritable`] for values the format cannot hold; [`Error::Io`] naming the path;
/// `Error::Core` holding a `ckpt_io::CommitError` for a full disk (or `RLIMIT_FSIZE`), a read-only file system,
/// a permission error, or another save holding the destination's lock.
pub fn save(value: &Value, path: impl AsRef<Path>, options: &WriteOptions) -> Result<SaveReport> {
    let path = path.as_ref();
    let prefix = prefix_for_path(path)?;
    // The durable commit (ckpt_io): lock, temporary file, O_DIRECT pipeline, fdatasync, rename,
    // directory fsync, the replaced file freed in the background.
    let file_options = ckpt_io::FileOptions::default().with_durability(options.durability);
    ckpt_io::write_file(path, &file_options, |file| save_to_writer(value, &mut *file, &prefix, options).map(|_| ()))
        .map(|_| SaveReport::of_value(value).with_files(vec![path.to_path_buf()]))
        .map_err(|e: Error| match e {
            // Disk full, read-only, permission, locked: already name the path, and stay matchable.
            Error::Core(c) if c.format_error::<ckpt_io::CommitError>().is_some() => Error::Core(c),
            e => e.at(path),
        })
}

/// Writes `torch.save` output for `value` to `out` with record prefix `prefix` (torch uses `archive` for
/// file objects and buffers). Storage bytes are written straight from each tensor's buffer. Returns `out`.
///
/// # Errors
/// [`Error::Unwritable`] for values the format cannot hold; I/O errors from `out`.
pub fn save_to_writer<W: Write>(value: &Value, out: W, prefix: &str, options: &WriteOptions) -> Result<W> {
    save_marked(value, out, prefix, options, None)
}

/// [`save_to_writer`] into a durable commit's file, [marking](ckpt_io::DurableWriter::mark) each
/// record's start with its full name (and the central directory's with
/// [`CENTRAL_DIRECTORY_MARK`](crate::zip::CENTRAL_DIRECTORY_MARK)), so that a checksum manifest
/// ([`ckpt_io::checksum`]) has one chunk per record.
///
/// ```
/// use std::io::Write;
/// use ckpt_io::{DirCommit, DirOptions};
/// use ckpt_tensor::Value;
/// use ckpt_collective::SingleProcess;
/// let root = tempfile::tempdir().unwrap();
/// let dst = root.path().join("ck");
/// let c = DirCommit::begin(&dst, &SingleProcess, &DirOptions::default().with_checksums(true)).unwrap();
/// let mut f = c.create_file("part.pt").unwrap();
/// ckpt_torch::save_to_durable(&Value::Int(3), f.writer(), "part", &Default::default()).unwrap();
/// f.finish().unwrap();
/// c.commit(&SingleProcess, Ok(()), |_| Ok(())).unwrap();
/// let m = ckpt_io::Manifest::read(&dst).unwrap().unwrap();
/// assert_eq!(m.files["part.pt"].chunks[0].name, "part/data.pkl");
/// ```
///
/// # Errors
/// As [`save_to_writer`].
pub fn save_to_durable(
    value: &Value,
    out: &mut ckpt_io::DurableWriter,
    prefix: &str,
    options: &WriteOptions,
) -> Result<()> {
    fn mark(w: &mut &mut ckpt_io::DurableWriter, name: &str) {
        w.mark(name);
    }
    save_marked(value, out, prefix, options, Some(mark)).map(|_| ())
}

fn save_marked<W: Write>(
    value: &Value,
    out: W,
    prefix: &str,
    options: &WriteOptions,
    marker: Option<fn(&mut W, &str)>,
) -> Result<W> {
    let mut pickler = DataPickler::new()?;
    pickler.value(value)?;
    let storages = std::mem::take(&mut pickler.storages);
    let pkl = pickler.finish()?;
    let opts = WriterOptions { alignment: options.storage_alignment, compute_crc32: options.durability.checksums };
    let mut zip = ZipWriter::with_options(out, prefix, opts);
    if let Some(m) = marker {
        zip.set_record_marker(m);
    }
    zip.write_record("data.pkl", &pkl)?;
    if options.torch_2_13_records {
        zip.write_record(".format_version", b"1")?;
        zip.write_record(".storage_alignment", options.storage_alignment.to_string().as_bytes())?;
        zip.write_record("byteorder", b"little")?;
    }
    for (key, storage) in storages.iter().enumerate() {
        let name = format!("data/{key}");
        if storage.data.is_deferred() {
            // A storage made on demand (`Buffer::deferred`) is made for this record alone, and one that
            // can make any range (`Buffer::deferred_ranged`, rows gathered by a reshard) a piece at a time
            // as it is written.
            let data = &storage.data;
            zip.write_record_streamed(&name, data.len() as u64, &mut |sink| {
                data.pieces(STREAM_PIECE, |piece| sink(piece).map_err(Streamed::Io)).map_err(Streamed::into_io)
            })?;
        } else {
            zip.write_record(&name, storage.data.as_bytes())?;
        }
    }
    zip.write_record("version", b"3\n")?;
    if options.torch_2_13_records {
        zip.write_serialization_id()?;
    }
    Ok(zip.finish()?)
}

/// Bytes of a storage made on demand that are made and written at a time: fits the L2 cache, so the
/// writer's copy (and the CRC-32) read what the gather just wrote.
const STREAM_PIECE: usize = 1 << 20;

/// An error while a storage is streamed into its record: of the sink (the archive's writer) or of making
/// the bytes.
enum Streamed {
    Io(std::io::Error),
    Core(ckpt_tensor::Error),
}

impl From<ckpt_tensor::Error> for Streamed {
    fn from(e: ckpt_tensor::Error) -> Self {
        Streamed::Core(e)
    }
}

impl Streamed {
    fn into_io(self) -> std::io::Error {
        match self {
            Streamed::Io(e) => e,
            Streamed::Core(e) => std::io::Error::other(e),
        }
    }
}

/// One storage to write, in key order.
struct StorageEntry {
    data: Buffer,
    /// The typed storage dtype it was first pickled as (`None` for untyped storages).
    typed: Option<DType>,
    /// Memo id of its key string, once pickled.
    key_memo: Option<u32>,
}

/// Pickles a value tree the way CPython's protocol-2 pickler pickles the equivalent objects under
/// `torch.save`, with a memo that reproduces CPython's object identities where they are knowable:
/// globals by name, interned strings (identifiers and the empty string) by value, storage keys by storage,
/// and a tensor repeated with the same view of the same storage by tensor.
struct DataPickler {
    p: Pickler<Vec<u8>>,
    globals: HashMap<(String, String), u32>,
    interned: HashMap<String, u32>,
    storages: Vec<StorageEntry>,
    storage_index: HashMap<(usize, usize, usize), usize>,
    /// Tensors pickled so far with their memo ids, by storage and offset (a repeated view is one object).
    tensors: HashMap<ViewKey, Vec<(Tensor, u32)>>,
    /// The objects of [`Value::Shared`] definitions being written, by address, with their ids: memoized as
    /// the objects themselves are (before what they hold, so that a cycle reads them back).
    shared_def: HashMap<*const Value, u32>,
    /// The memo id of each shared object written.
    shared_memo: HashMap<u32, u32>,
    /// Shared values written without a memo entry of their own (a string, a tensor), written again where
    /// they are referred to.
    shared_copy: HashMap<u32, Value>,
}

/// A tensor's storage identity and storage offset: where repeated views are looked up.
type ViewKey = ((usize, usize, usize), usize);

/// Whether CPython would hand out one shared object for this string constant: identifiers made of ASCII
/// name characters (interned code constants and attribute names) and the empty string.
fn interned(s: &str) -> bool {
    s.is_empty()
        || (s.bytes().next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
            && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_'))
}

fn unwritable(what: impl Into<String>) -> Error {
    Error::Unwritable(what.into())
}

impl DataPickler {
    fn new() -> Result<Self> {
        Ok(DataPickler {
            p: Pickler::new(Vec::new(), 2).map_err(io)?,
            globals: HashMap::new(),
            interned: HashMap::new(),
            storages: Vec::new(),
            storage_index: HashMap::new(),
            tensors: HashMap::new(),
            shared_def: HashMap::new(),
            shared_memo: HashMap::new(),
            shared_copy: HashMap::new(),
        })
    }

    fn finish(self) -> Result<Vec<u8>> {
        self.p.finish().map_err(|e| unwritable(format!("pickle: {e}")))
    }

    fn memoize(&mut self) -> Result<u32> {
        self.p.memoize().map_err(io)
    }

    /// Memoizes the object `owner` just made (when there is one), noting the memo id of a shared object.
    fn memoize_of(&mut self, owner: Option<&Value>) -> Result<u32> {
        let id = self.memoize()?;
        if let Some(shared) = owner.and_then(|v| self.shared_def.remove(&std::ptr::from_ref(v))) {
            self.shared_memo.insert(shared, id);
        }
        Ok(id)
    }

    fn global(&mut self, module: &str, name: &str) -> Result<()> {
        if let Some(&id) = self.globals.get(&(module.to_owned(), name.to_owned())) {
            return self.p.get(id).map_err(io);
        }
        self.p.global(module, name).map_err(io)?;
        let id = self.memoize()?;
        self.globals.insert((module.to_owned(), name.to_owned()), id);
        Ok(())
    }

    fn str(&mut self, s: &str) -> Result<()> {
        if interned(s) {
            if let Some(&id) = self.interned.get(s) {
                return self.p.get(id).map_err(io);
            }
        }
        self.p.str(s).map_err(io)?;
        let id = self.memoize()?;
        if interned(s) {
            self.interned.insert(s.to_owned(), id);
        }
        Ok(())
    }

    /// A tuple of already-known length whose items `items` pickles; memoized unless empty (CPython).
    fn tuple(&mut self, n: usize, items: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        self.tuple_of(None, n, items)
    }

    /// [`Self::tuple`], for the value `owner` when it is one.
    fn tuple_of(&mut self, owner: Option<&Value>, n: usize, items: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        if n == 0 {
            return self.p.empty_tuple().map_err(io);
        }
        if n > 3 {
            self.p.mark().map_err(io)?;
        }
        items(self)?;
        self.p.tuple(n).map_err(io)?;
        self.memoize_of(owner).map(|_| ())
    }

    fn ints(&mut self, dims: &[usize]) -> Result<()> {
        self.tuple(dims.len(), |me| {
            for &d in dims {
                let d = i64::try_from(d).map_err(|_| unwritable("dimension above i64"))?;
                me.p.int(d).map_err(io)?;
            }
            Ok(())
        })
    }

    /// `_batch_appends`: a single item appended alone, otherwise marked batches of 1000.
    fn appends(&mut self, items: &[Value]) -> Result<()> {
        for chunk in items.chunks(1000) {
            if let [one] = chunk {
                self.value(one)?;
                self.p.append().map_err(io)?;
            } else {
                self.p.mark().map_err(io)?;
                for v in chunk {
                    self.value(v)?;
                }
                self.p.appends().map_err(io)?;
            }
        }
        Ok(())
    }

    /// `_batch_setitems`: a single item set alone, otherwise marked batches of 1000.
    fn setitems(&mut self, items: &[(Value, Value)]) -> Result<()> {
        for chunk in items.chunks(1000) {
            if let [(k, v)] = chunk {
                self.value(k)?;
                self.value(v)?;
                self.p.setitem().map_err(io)?;
            } else {
                self.p.mark().map_err(io)?;
                for (k, v) in chunk {
                    self.value(k)?;
                    self.value(v)?;
                }
                self.p.setitems().map_err(io)?;
            }
        }
        Ok(())
    }

    /// `save_reduce(func, args)` for a global func and a tuple of args, then memoize the result.
    fn reduce(
        &mut self,
        module: &str,
        name: &str,
        n: usize,
        args: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<u32> {
        self.reduce_of(None, module, name, n, args)
    }

    /// [`Self::reduce`], making the value `owner` when it is one.
    fn reduce_of(
        &mut self,
        owner: Option<&Value>,
        module: &str,
        name: &str,
        n: usize,
        args: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<u32> {
        self.global(module, name)?;
        self.tuple(n, args)?;
        self.p.reduce().map_err(io)?;
        self.memoize_of(owner)
    }

    fn value(&mut self, v: &Value) -> Result<()> {
        let me = Some(v);
        match v {
            Value::Shared { id, value } => {
                let at = std::ptr::from_ref(&**value);
                self.shared_def.insert(at, *id);
                self.value(value)?;
                if self.shared_def.remove(&at).is_some() {
                    // Not memoized as an object of its own: written again where it is referred to.
                    self.shared_copy.insert(*id, (**value).clone());
                }
                Ok(())
            }
            Value::Ref(id) => {
                if let Some(&memo) = self.shared_memo.get(id) {
                    return self.p.get(memo).map_err(io);
                }
                match self.shared_copy.get(id).cloned() {
                    Some(v) => self.value(&v),
                    None => Err(unwritable(
                        "a reference to an object not written before it (a tuple that contains itself, or a \
                         Value::Ref outside its Value::Shared)",
                    )),
                }
            }
            Value::None => self.p.none().map_err(io),
            Value::Bool(b) => self.p.bool(*b).map_err(io),
            Value::Int(i) => self.p.int(*i).map_err(io),
            Value::BigInt(b) => self.p.big_int(b).map_err(io),
            Value::Float(f) => self.p.float(*f).map_err(io),
            Value::Str(s) => self.str(s),
            Value::Bytes(b) => self.bytes(b),
            Value::ByteArray(b) => {
                // bytearray.__reduce_ex__(2) → (bytearray, (bytes(self),))
                self.reduce_of(me, "__builtin__", "bytearray", 1, |me| me.bytes(b)).map(|_| ())
            }
            Value::Complex(re, im) => self
                .reduce_of(me, "__builtin__", "complex", 2, |me| {
                    me.p.float(*re).map_err(io)?;
                    me.p.float(*im).map_err(io)
                })
                .map(|_| ()),
            Value::List(items) => {
                self.p.empty_list().map_err(io)?;
                self.memoize_of(me)?;
                self.appends(items)
            }
            Value::Tuple(items) => self.tuple_of(me, items.len(), |me| items.iter().try_for_each(|i| me.value(i))),
            Value::Set(items) | Value::FrozenSet(items) => {
                let name = if matches!(v, Value::Set(_)) { "set" } else { "frozenset" };
                self.reduce_of(me, "__builtin__", name, 1, |me| {
                    me.p.empty_list().map_err(io)?;
                    me.memoize()?;
                    me.appends(items)
                })
                .map(|_| ())
            }
            Value::Dict(d) => self.dict(v, d),
            Value::Tensor(t) => self.tensor(t),
            Value::Parameter { tensor, state } => self.parameter(tensor, state.as_deref()),
            Value::TensorWithState { tensor, class, state } => {
                let inner = tensor.as_tensor().ok_or_else(|| unwritable("tensor-with-state without a dense tensor"))?;
                if matches!(tensor.as_ref(), Value::Parameter { .. }) {
                    return Err(unwritable("a Parameter subclass with _rebuild_from_type_v2"));
                }
                self.reduce("torch._tensor", "_rebuild_from_type_v2", 4, |me| {
                    let (module, name) = rebuild_fn(inner);
                    me.global(module, name)?;
                    me.value(class)?;
                    me.tensor_args(inner, inner.requires_grad())?;
                    me.value(state)
                })
                .map(|_| ())
            }
            Value::OpaqueTensor { object, .. } => self.object(None, object),
            Value::Composite(c) => self.object(None, &crate::composite::lower(c)?),
            Value::Storage { dtype, data } => self.persistent_id(data, *dtype),
            Value::Size(dims) => self
                .reduce_of(me, "torch", "Size", 1, |me| {
                    me.tuple(dims.len(), |me| dims.iter().try_for_each(|&d| me.p.int(d).map_err(io)))
                })
                .map(|_| ()),
            Value::DType(d) => self.global("torch", d.torch_name()),
            Value::Device { kind, index } => {
                let n = if index.is_some() { 2 } else { 1 };
                self.reduce_of(me, "torch", "device", n, |me| {
                    me.p.str(kind).map_err(io)?;
                    me.memoize()?;
                    match index {
                        Some(i) => me.p.int(*i).map_err(io),
                        None => Ok(()),
                    }
                })
                .map(|_| ())
            }
            Value::Global { module, name } => self.global(module, name),
            Value::Object(o) => self.object(me, o),
            Value::Numpy(n) => {
                let o = crate::numpy::lower(n).ok_or_else(|| {
                    unwritable(format!("a {} holding a {} value", n.type_name(), n.value.type_name()))
                })?;
                self.object(None, &o)
            }
            other => Err(unwritable(format!("a {} value", other.type_name()))),
        }
    }

    /// CPython's protocol-2 `save_bytes`: `_codecs.encode(latin1_str, 'latin1')`. (CPython pickles `b''` as
    /// `bytes()`, which `weights_only` rejects; the `_codecs.encode('', 'latin1')` form is used for it too.)
    fn bytes(&mut self, b: &[u8]) -> Result<()> {
        let s: String = b.iter().map(|&c| char::from(c)).collect();
        self.reduce("_codecs", "encode", 2, |me| {
            me.p.str(&s).map_err(io)?;
            me.memoize()?;
            me.str("latin1")
        })
        .map(|_| ())
    }

    fn dict(&mut self, v: &Value, d: &Dict) -> Result<()> {
        match d.kind {
            DictKind::Dict => {
                self.p.empty_dict().map_err(io)?;
                self.memoize_of(Some(v))?;
                self.setitems(&d.items)?;
            }
            DictKind::OrderedDict => {
                // OrderedDict.__reduce__ → (OrderedDict, (), vars(self) or None, None, iter(items))
                self.reduce_of(Some(v), "collections", "OrderedDict", 0, |_| Ok(()))?;
                self.setitems(&d.items)?;
            }
            DictKind::Counter => {
                // Counter.__reduce__ → (Counter, (dict(self),))
                self.reduce_of(Some(v), "collections", "Counter", 1, |me| {
                    me.p.empty_dict().map_err(io)?;
                    me.memoize()?;
                    me.setitems(&d.items)
                })?;
            }
            _ => return Err(unwritable("an unknown mapping kind")),
        }
        if let Some(attrs) = &d.attrs {
            self.value(attrs)?;
            self.p.build().map_err(io)?;
        }
        Ok(())
    }

    fn object(&mut self, owner: Option<&Value>, o: &Object) -> Result<()> {
        self.value(&o.callable)?;
        self.value(&o.args)?;
        if o.newobj { self.p.newobj() } else { self.p.reduce() }.map_err(io)?;
        self.memoize_of(owner)?;
        self.appends(&o.list_items)?;
        self.setitems(&o.dict_items)?;
        if let Some(state) = &o.state {
            self.value(state)?;
            self.p.build().map_err(io)?;
        }
        Ok(())
    }

    fn storage_key(&mut self, data: &Buffer, dtype: DType) -> Result<usize> {
        let typed = match dtype.storage_class() {
            StorageClass::Typed(_) => Some(dtype),
            StorageClass::Untyped => None,
        };
        if let Some(&k) = self.storage_index.get(&data.storage_id()) {
            let first = self.storages.get(k).and_then(|s| s.typed);
            if first != typed && !data.is_empty() {
                return Err(unwritable(
                    "cannot save multiple tensors or storages that view the same data as different types",
                ));
            }
            return Ok(k);
        }
        let k = self.storages.len();
        self.storages.push(StorageEntry { data: data.clone(), typed, key_memo: None });
        self.storage_index.insert(data.storage_id(), k);
        Ok(k)
    }

    /// The persistent id `('storage', storage_class, key, 'cpu', numel)`.
    fn persistent_id(&mut self, data: &Buffer, dtype: DType) -> Result<()> {
        let k = self.storage_key(data, dtype)?;
        let (module, class, numel) = match dtype.storage_class() {
            StorageClass::Typed(name) => {
                if data.len() % dtype.size() != 0 {
                    return Err(unwritable(format!("a {dtype} storage of {} bytes", data.len())));
                }
                ("torch", name, data.len() / dtype.size())
            }
            StorageClass::Untyped => ("torch.storage", "UntypedStorage", data.len()),
        };
        self.p.mark().map_err(io)?;
        self.str("storage")?;
        self.global(module, class)?;
        match self.storages.get(k).and_then(|s| s.key_memo) {
            Some(id) => self.p.get(id).map_err(io)?,
            None => {
                self.p.str(&k.to_string()).map_err(io)?;
                let id = self.memoize()?;
                if let Some(s) = self.storages.get_mut(k) {
                    s.key_memo = Some(id);
                }
            }
        }
        self.str("cpu")?;
        self.p.int(i64::try_from(numel).map_err(|_| unwritable("storage above i64 elements"))?).map_err(io)?;
        self.p.tuple(5).map_err(io)?;
        self.memoize()?;
        self.p.binpersid().map_err(io)
    }

    /// The argument tuple of `_rebuild_tensor_v2`/`v3` for `t`, with the `{'conj': True, 'neg': True}`
    /// metadata argument when a lazy bit is set.
    fn tensor_args(&mut self, t: &Tensor, requires_grad: bool) -> Result<()> {
        let dtype = t.dtype();
        if matches!(dtype, DType::QInt8 | DType::QUInt8 | DType::QInt32 | DType::QUInt4x2 | DType::QUInt2x4) {
            return Err(unwritable(format!(
                "a plain {dtype} tensor (quantized dtypes exist only inside quantized tensors)"
            )));
        }
        if !dtype.in_torch() {
            return Err(unwritable(format!(
                "a {dtype} tensor: torch has no dtype for safetensors' {} (keep it in safetensors, or leave it out)",
                dtype.safetensors_code().unwrap_or("F6")
            )));
        }
        let untyped = t.dtype().storage_class() == StorageClass::Untyped;
        let bits: Vec<&str> =
            [("conj", t.is_conj()), ("neg", t.is_neg())].into_iter().filter_map(|(k, on)| on.then_some(k)).collect();
        let n = if untyped { 7 } else { 6 } + usize::from(!bits.is_empty());
        self.tuple(n, |me| {
            me.persistent_id(t.storage(), t.dtype())?;
            me.p.int(i64::try_from(t.storage_offset()).map_err(|_| unwritable("offset above i64"))?).map_err(io)?;
            me.ints(t.shape())?;
            me.ints(t.strides())?;
            me.p.bool(requires_grad).map_err(io)?;
            me.reduce("collections", "OrderedDict", 0, |_| Ok(()))?;
            if untyped {
                me.global("torch", t.dtype().torch_name())?;
            }
            if !bits.is_empty() {
                me.p.empty_dict().map_err(io)?;
                me.memoize()?;
                let items: Vec<(Value, Value)> =
                    bits.iter().map(|k| (Value::Str((*k).to_owned()), Value::Bool(true))).collect();
                me.setitems(&items)?;
            }
            Ok(())
        })
    }

    fn tensor(&mut self, t: &Tensor) -> Result<()> {
        let key = (t.storage().storage_id(), t.storage_offset());
        if let Some(&(_, id)) = self.tensors.get(&key).and_then(|seen| seen.iter().find(|(s, _)| same_view(s, t))) {
            return self.p.get(id).map_err(io);
        }
        let (module, name) = rebuild_fn(t);
        self.global(module, name)?;
        self.tensor_args(t, t.requires_grad())?;
        self.p.reduce().map_err(io)?;
        let id = self.memoize()?;
        self.tensors.entry(key).or_default().push((t.clone(), id));
        Ok(())
    }

    fn parameter(&mut self, t: &Tensor, state: Option<&Value>) -> Result<()> {
        let (name, n) = if state.is_some() { ("_rebuild_parameter_with_state", 4) } else { ("_rebuild_parameter", 3) };
        self.reduce("torch._utils", name, n, |me| {
            // `self.data` is a fresh, detached tensor: requires_grad False, never shared by identity.
            let (module, f) = rebuild_fn(t);
            me.global(module, f)?;
            me.tensor_args(t, false)?;
            me.p.reduce().map_err(io)?;
            me.memoize()?;
            me.p.bool(t.requires_grad()).map_err(io)?;
            me.reduce("collections", "OrderedDict", 0, |_| Ok(()))?;
            if let Some(s) = state {
                me.value(s)?;
            }
            Ok(())
        })
        .map(|_| ())
    }
}

/// The rebuild function torch pickles a dense tensor with.
fn rebuild_fn(t: &Tensor) -> (&'static str, &'static str) {
    match t.dtype().storage_class() {
        StorageClass::Typed(_) => ("torch._utils", "_rebuild_tensor_v2"),
        StorageClass::Untyped => ("torch._utils", "_rebuild_tensor_v3"),
    }
}

/// Whether two tensors are the same view of the same storage (treated as one Python object).
fn same_view(a: &Tensor, b: &Tensor) -> bool {
    a.shares_storage_with(b)
        && a.dtype() == b.dtype()
        && a.shape() == b.shape()
        && a.strides() == b.strides()
        && a.storage_offset() == b.storage_offset()
        && a.requires_grad() == b.requires_grad()
        && a.is_conj() == b.is_conj()
        && a.is_neg() == b.is_neg()
}

fn io(e: impl std::fmt::Display) -> Error {
    unwritable(format!("pickle: {e}"))
}
