//! Conversions: DCP to one `torch.save` file and back (what `torch.distributed.checkpoint.format_utils`'s
//! `dcp_to_torch_save` / `torch_save_to_dcp` do), and DCP to one safetensors file or to Hugging Face
//! sharded safetensors with an index. DCP-to-file conversions stream: the output's header is written from
//! the metadata, then each tensor is read (items read into memory one at a time, not mapped), written and
//! dropped, so memory stays at about the largest tensor plus a constant.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ckpt_pickle::Pickler;
use ckpt_tensor::tensor::contiguous_strides;
use ckpt_tensor::{DType, StorageClass, Value, unflatten};
use ckpt_torch::zip::ZipWriter;

use crate::error::{Error, Result};
use crate::metadata::{Metadata, StorageMetadata};
use crate::reader::{DcpReader, ReadOptions};
use crate::writer::WriteOptions;

/// What a conversion wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConvertReport {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub tensor_bytes: u64,
    /// Keys that could not go into the output (non-tensor values, for safetensors outputs).
    pub skipped: Vec<String>,
    /// Files written.
    pub files: Vec<PathBuf>,
}

/// The reader of the streaming conversions: items are windows of memory maps (page cache, not heap), so a
/// tensor split over several items is assembled once, when it is written (`Buffer::deferred`), and nothing
/// else of it is held.
fn streaming_reader(dir: &Path) -> Result<DcpReader> {
    DcpReader::open_with(dir, &ReadOptions::default())
}

/// Writes `path` atomically (temporary file, fsync, rename) with this crate's errors.
fn write_atomic(path: &Path, f: impl FnOnce(&mut ckpt_io::DurableWriter) -> Result<()>) -> Result<()> {
    ckpt_io::write_file(path, &ckpt_io::FileOptions::default(), f).map(|_| ())
}

// ---------------------------------------------------------------------------------------------------------
// DCP -> torch.save

/// Global name of the placeholder that marks tensor `i` in the skeleton state dict.
const PLACEHOLDER: &str = "\u{0}ckpt-distcp-tensor";

/// Converts the DCP checkpoint in `dir` into one `torch.save` file at `out` holding the nested state dict
/// (what `dcp_to_torch_save(dir, out)` writes; tensors come back row-major, int dict keys as strings).
/// Streams tensor by tensor; non-tensor values are read first (they are small).
///
/// # Errors
/// Read errors naming key and file; [`Error::Unwritable`] for values `torch.save` cannot hold; I/O errors.
pub fn dcp_to_torch_save(dir: &Path, out: &Path) -> Result<ConvertReport> {
    let reader = streaming_reader(dir)?;
    let md = reader.metadata();
    let mut tensor_keys = Vec::new();
    let mut leaves = Vec::with_capacity(md.state_dict_metadata.len());
    for (key, m) in &md.state_dict_metadata {
        let v = match m {
            StorageMetadata::Tensor(_) => {
                tensor_keys.push(key.clone());
                Value::Global { module: PLACEHOLDER.into(), name: (tensor_keys.len() - 1).to_string() }
            }
            StorageMetadata::Bytes => reader.read_value(key)?,
        };
        leaves.push((reader.path_of(key), v));
    }
    let skeleton = unflatten(leaves)?;
    let prefix = ckpt_torch::prefix_for_path(out)?;
    let mut report = ConvertReport { files: vec![out.to_path_buf()], ..ConvertReport::default() };
    let mut pickler = SkeletonPickler::new(md)?;
    match pickler.value(&skeleton) {
        Ok(()) => {}
        Err(Unsupported) => {
            // A value this streaming pickler does not model: fall back to the in-memory writer.
            let sd = reader.state_dict()?;
            ckpt_torch::save(&sd, out, &ckpt_torch::WriteOptions::default())?;
            report.tensors = tensor_keys.len();
            report.tensor_bytes = u64::try_from(reader.tensor_bytes()).unwrap_or(u64::MAX);
            return Ok(report);
        }
    }
    let order = std::mem::take(&mut pickler.order);
    let pkl = pickler.p.finish().map_err(|e| Error::unwritable("", format!("data.pkl: {e}")))?;
    write_atomic(out, |w| {
        let zerr = |e: ckpt_torch::zip::ZipError| Error::Torch(ckpt_torch::Error::Zip(e).at(out));
        let mut zip = ZipWriter::new(&mut *w, &prefix);
        zip.write_record("data.pkl", &pkl).map_err(zerr)?;
        zip.write_record(".format_version", b"1").map_err(zerr)?;
        zip.write_record(".storage_alignment", b"64").map_err(zerr)?;
        zip.write_record("byteorder", b"little").map_err(zerr)?;
        for (n, &t) in order.iter().enumerate() {
            let key = &tensor_keys[t];
            let tensor = reader.read_tensor(key)?;
            let data = tensor.data()?;
            zip.write_record(&format!("data/{n}"), &data).map_err(zerr)?;
            report.tensors += 1;
            report.tensor_bytes += data.len() as u64;
        }
        zip.write_record("version", b"3\n").map_err(zerr)?;
        zip.write_serialization_id().map_err(zerr)?;
        zip.finish().map_err(zerr)?;
        Ok(())
    })?;
    Ok(report)
}

/// The streaming pickler met a value it does not model.
struct Unsupported;

/// Pickles the skeleton state dict as CPython's protocol-2 pickler pickles the equivalent objects under
/// `torch.save`: dicts, lists, tuples and scalars; placeholders become `_rebuild_tensor_v2`/`v3` calls with
/// row-major strides over storage keys `"0"`, `"1"`, … in first-pickled order.
struct SkeletonPickler {
    p: Pickler<Vec<u8>>,
    dtypes: HashMap<usize, (DType, Vec<usize>)>,
    globals: HashMap<(String, String), u32>,
    interned: HashMap<String, u32>,
    /// Tensor index (into the metadata's tensor keys) of each storage key.
    order: Vec<usize>,
}

fn interned(s: &str) -> bool {
    s.is_empty()
        || (s.bytes().next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
            && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_'))
}

impl SkeletonPickler {
    fn new(md: &Metadata) -> Result<Self> {
        let mut dtypes = HashMap::new();
        for (i, t) in md.state_dict_metadata.iter().filter_map(|(_, m)| m.as_tensor()).enumerate() {
            dtypes.insert(i, (t.properties.dtype, t.size.clone()));
        }
        Ok(SkeletonPickler {
            p: Pickler::new(Vec::new(), 2).map_err(|e| Error::unwritable("", e.to_string()))?,
            dtypes,
            globals: HashMap::new(),
            interned: HashMap::new(),
            order: Vec::new(),
        })
    }

    fn global(&mut self, module: &str, name: &str) -> std::result::Result<(), Unsupported> {
        if let Some(&id) = self.globals.get(&(module.to_owned(), name.to_owned())) {
            return self.p.get(id).map_err(|_| Unsupported);
        }
        self.p.global(module, name).map_err(|_| Unsupported)?;
        let id = self.p.memoize().map_err(|_| Unsupported)?;
        self.globals.insert((module.to_owned(), name.to_owned()), id);
        Ok(())
    }

    fn str(&mut self, s: &str) -> std::result::Result<(), Unsupported> {
        if interned(s) {
            if let Some(&id) = self.interned.get(s) {
                return self.p.get(id).map_err(|_| Unsupported);
            }
        }
        self.p.str(s).map_err(|_| Unsupported)?;
        let id = self.p.memoize().map_err(|_| Unsupported)?;
        if interned(s) {
            self.interned.insert(s.to_owned(), id);
        }
        Ok(())
    }

    fn ints(&mut self, dims: &[usize]) -> std::result::Result<(), Unsupported> {
        if dims.is_empty() {
            return self.p.empty_tuple().map_err(|_| Unsupported);
        }
        self.p.begin_tuple(dims.len()).map_err(|_| Unsupported)?;
        for &d in dims {
            self.p.int(i64::try_from(d).map_err(|_| Unsupported)?).map_err(|_| Unsupported)?;
        }
        self.p.tuple(dims.len()).map_err(|_| Unsupported)?;
        self.p.memoize().map(|_| ()).map_err(|_| Unsupported)
    }

    fn tensor(&mut self, index: usize) -> std::result::Result<(), Unsupported> {
        let (dtype, shape) = self.dtypes.get(&index).cloned().ok_or(Unsupported)?;
        let key = self.order.len();
        self.order.push(index);
        let numel = ckpt_tensor::checked_numel(&shape).ok_or(Unsupported)?;
        let untyped = dtype.storage_class() == StorageClass::Untyped;
        let e = |_| Unsupported;
        self.global("torch._utils", if untyped { "_rebuild_tensor_v3" } else { "_rebuild_tensor_v2" })?;
        self.p.mark().map_err(e)?;
        // persistent id ('storage', class, key, 'cpu', numel)
        self.p.mark().map_err(e)?;
        self.str("storage")?;
        match dtype.storage_class() {
            StorageClass::Typed(name) => self.global("torch", name)?,
            StorageClass::Untyped => self.global("torch.storage", "UntypedStorage")?,
        }
        self.p.str(&key.to_string()).map_err(e)?;
        self.p.memoize().map_err(e)?;
        self.str("cpu")?;
        let count = if untyped { numel.checked_mul(dtype.size()).ok_or(Unsupported)? } else { numel };
        self.p.int(i64::try_from(count).map_err(|_| Unsupported)?).map_err(e)?;
        self.p.tuple(5).map_err(e)?;
        self.p.memoize().map_err(e)?;
        self.p.binpersid().map_err(e)?;
        self.p.int(0).map_err(e)?;
        self.ints(&shape)?;
        self.ints(&contiguous_strides(&shape))?;
        self.p.bool(false).map_err(e)?;
        self.global("collections", "OrderedDict")?;
        self.p.empty_tuple().map_err(e)?;
        self.p.reduce().map_err(e)?;
        self.p.memoize().map_err(e)?;
        if untyped {
            self.global("torch", dtype.torch_name())?;
        }
        self.p.tuple(if untyped { 7 } else { 6 }).map_err(e)?;
        self.p.memoize().map_err(e)?;
        self.p.reduce().map_err(e)?;
        self.p.memoize().map(|_| ()).map_err(e)
    }

    fn value(&mut self, v: &Value) -> std::result::Result<(), Unsupported> {
        let e = |_| Unsupported;
        match v {
            Value::None => self.p.none().map_err(e),
            Value::Bool(b) => self.p.bool(*b).map_err(e),
            Value::Int(i) => self.p.int(*i).map_err(e),
            Value::BigInt(b) => self.p.big_int(b).map_err(e),
            Value::Float(f) => self.p.float(*f).map_err(e),
            Value::Str(s) => self.str(s),
            Value::Global { module, name } if module == PLACEHOLDER => {
                self.tensor(name.parse().map_err(|_| Unsupported)?)
            }
            Value::List(items) => {
                self.p.empty_list().map_err(e)?;
                self.p.memoize().map_err(e)?;
                if let [one] = items.as_slice() {
                    self.value(one)?;
                    return self.p.append().map_err(e);
                }
                for chunk in items.chunks(1000) {
                    self.p.mark().map_err(e)?;
                    for it in chunk {
                        self.value(it)?;
                    }
                    self.p.appends().map_err(e)?;
                }
                Ok(())
            }
            Value::Tuple(items) => {
                if items.is_empty() {
                    return self.p.empty_tuple().map_err(e);
                }
                self.p.begin_tuple(items.len()).map_err(e)?;
                for it in items {
                    self.value(it)?;
                }
                self.p.tuple(items.len()).map_err(e)?;
                self.p.memoize().map(|_| ()).map_err(e)
            }
            Value::Dict(d) if d.kind == ckpt_tensor::DictKind::Dict && d.attrs.is_none() => {
                self.p.empty_dict().map_err(e)?;
                self.p.memoize().map_err(e)?;
                if let [(k, v)] = d.items.as_slice() {
                    self.value(k)?;
                    self.value(v)?;
                    return self.p.setitem().map_err(e);
                }
                let n = d.items.len();
                if n == 0 {
                    return Ok(());
                }
                let mut i = 0;
                loop {
                    self.p.mark().map_err(e)?;
                    let mut batch = 0;
                    while i < n && batch < 1000 {
                        let (k, v) = &d.items[i];
                        self.value(k)?;
                        self.value(v)?;
                        i += 1;
                        batch += 1;
                    }
                    self.p.setitems().map_err(e)?;
                    if batch < 1000 {
                        return Ok(());
                    }
                }
            }
            _ => Err(Unsupported),
        }
    }
}

/// Converts one `torch.save` file into a DCP checkpoint (what `torch_save_to_dcp(pt, dir)` does: an
/// ordinary single-rank save of the loaded object, which must be a mapping). Streams: the file is mapped
/// to read its object tree, but each tensor's storage is read from the file just before its item is
/// written and dropped after, so memory stays at about one storage plus a constant.
///
/// # Errors
/// The torch reader's errors; the writer's errors.
pub fn torch_save_to_dcp(pt: &Path, dir: &Path, options: &WriteOptions) -> Result<Metadata> {
    let value = ckpt_torch::load(pt)?;
    let file = std::fs::File::open(pt).map_err(|e| Error::io(pt, e))?;
    let source = |t: &ckpt_tensor::Tensor| -> Result<Option<ckpt_tensor::Tensor>> {
        let storage = t.storage();
        if !storage.is_mapped() {
            return Ok(None);
        }
        let mut buf = ckpt_tensor::AlignedBytes::zeroed(storage.len())?;
        crate::item::read_exact_at(&file, buf.as_mut_bytes(), storage.offset_in_backing() as u64)
            .map_err(|e| Error::io(pt, e))?;
        let owned = ckpt_tensor::Buffer::from_owner(buf);
        let t2 = ckpt_tensor::Tensor::from_parts(t.dtype(), t.shape(), t.strides(), t.storage_offset(), owned)?
            .with_requires_grad(t.requires_grad())
            .with_lazy_bits(t.is_conj(), t.is_neg())?;
        Ok(Some(t2))
    };
    crate::writer::save_with_source(&value, &HashMap::new(), dir, options, &ckpt_collective::SingleProcess, &source)
}

// ---------------------------------------------------------------------------------------------------------
// DCP -> safetensors

/// A tensor entry of the checkpoint: key, dtype, shape, bytes.
#[derive(Debug, Clone)]
struct TensorEntry {
    key: String,
    dtype: DType,
    shape: Vec<usize>,
    bytes: u64,
}

/// The safetensors header for `tensors` laid out in order, `metadata` first with its keys sorted
/// (`ckpt_safetensors::header::write`); the `8 + N` bytes before the tensors' data.
fn safetensors_header(tensors: &[TensorEntry], metadata: HashMap<String, String>) -> Result<Vec<u8>> {
    let mut metadata: Vec<(String, String)> = metadata.into_iter().collect();
    metadata.sort();
    let metadata: Vec<(&str, &str)> = metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let entries = tensors
        .iter()
        .map(|t| {
            let dtype = t
                .dtype
                .safetensors_code()
                .ok_or_else(|| Error::unwritable(&t.key, format!("safetensors cannot hold {}", t.dtype)))?;
            let nbytes = usize::try_from(t.bytes).map_err(|_| Error::unwritable(&t.key, "tensor size overflows"))?;
            Ok(ckpt_safetensors::header::Entry { name: &t.key, dtype, shape: &t.shape, nbytes })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ckpt_safetensors::header::write(&entries, &metadata, 0))
}

/// Tensor keys of the checkpoint with dtype, shape and bytes; non-tensor keys separately.
fn tensor_list(reader: &DcpReader) -> Result<(Vec<TensorEntry>, Vec<String>)> {
    let mut tensors = Vec::new();
    let mut skipped = Vec::new();
    for (k, m) in &reader.metadata().state_dict_metadata {
        match m {
            StorageMetadata::Tensor(t) => {
                let bytes = t.nbytes().ok_or_else(|| Error::unwritable(k, "tensor size overflows"))?;
                tensors.push(TensorEntry {
                    key: k.clone(),
                    dtype: t.properties.dtype,
                    shape: t.size.clone(),
                    bytes: bytes as u64,
                });
            }
            StorageMetadata::Bytes => skipped.push(k.clone()),
        }
    }
    Ok((tensors, skipped))
}

fn write_safetensors(
    reader: &DcpReader,
    out: &Path,
    tensors: &[TensorEntry],
    metadata: HashMap<String, String>,
) -> Result<u64> {
    let header = safetensors_header(tensors, metadata)?;
    let mut written = 0u64;
    write_atomic(out, |w| {
        w.write_all(&header).map_err(|e| Error::io(out, e))?;
        for entry in tensors {
            let t = reader.read_tensor(&entry.key)?;
            let data = t.data()?;
            debug_assert_eq!(data.len() as u64, entry.bytes);
            w.write_all(&data).map_err(|e| Error::io(out, e))?;
            written += data.len() as u64;
        }
        Ok(())
    })?;
    Ok(written)
}

/// Converts the DCP checkpoint in `dir` into one safetensors file at `out`, tensors under their flattened
/// keys in checkpoint order, with ckpt's safetensors convention ([`ckpt_safetensors::metadata`]:
/// `format` = `pt`, `ckpt.source` = `distcp`, the nested paths from `planner_data` in `ckpt.paths`, the
/// non-tensor values in `ckpt.values`, in its lossless typed encoding). A value holding tensors (a tuple of
/// tensors) is listed in [`ConvertReport::skipped`] (the facade's `ckpt::convert` keeps those too). Streams
/// tensor by tensor.
///
/// # Errors
/// [`Error::Unwritable`] for dtypes safetensors lacks (complex32/128, quantized, float4); read and I/O
/// errors.
pub fn dcp_to_safetensors(dir: &Path, out: &Path) -> Result<ConvertReport> {
    let reader = streaming_reader(dir)?;
    let (tensors, values) = tensor_list(&reader)?;
    let mut metadata = ckpt_safetensors::metadata::Metadata::new("distcp");
    let mut skipped = Vec::new();
    for key in &values {
        if metadata.value(key, &reader.read_value(key)?) {
            metadata.path(key, &reader.path_of(key));
        } else {
            skipped.push(key.clone());
        }
    }
    for t in &tensors {
        metadata.path(&t.key, &reader.path_of(&t.key));
    }
    let bytes = write_safetensors(&reader, out, &tensors, metadata.into_map())?;
    Ok(ConvertReport { tensors: tensors.len(), tensor_bytes: bytes, skipped, files: vec![out.to_path_buf()] })
}

/// Converts the DCP checkpoint in `dir` into Hugging Face sharded safetensors in `out_dir`, through the
/// one Hugging Face writer (`ckpt_safetensors::hf::save_entries`): `model-0000i-of-0000n.safetensors` files
/// of at most `max_shard_bytes` of tensor data each, filled in checkpoint order as `huggingface_hub` fills
/// them (a bigger tensor gets a file of its own), plus `model.safetensors.index.json` when there is more
/// than one; the directory committed whole. The `__metadata__` follows ckpt's safetensors convention
/// (`format`, `ckpt.source` = `distcp`, `ckpt.paths`); non-tensor values are listed in
/// [`ConvertReport::skipped`]. Streams shard by shard.
///
/// # Errors
/// As [`dcp_to_safetensors`].
pub fn dcp_to_hf(dir: &Path, out_dir: &Path, max_shard_bytes: u64) -> Result<ConvertReport> {
    let reader = streaming_reader(dir)?;
    let (tensors, skipped) = tensor_list(&reader)?;
    // Each tensor as the reader gives it: windows of the maps, a tensor split over items assembled only
    // when its shard is written.
    let entries = tensors
        .iter()
        .map(|t| Ok((t.key.as_str(), reader.path_of(&t.key), Value::Tensor(reader.read_tensor(&t.key)?))))
        .collect::<Result<Vec<_>>>()?;
    let options =
        ckpt_safetensors::hf::WriteOptions::default().with_source("distcp").with_max_shard_size(max_shard_bytes);
    let report = ckpt_safetensors::hf::save_entries(
        entries.iter().map(|(key, path, value)| (*key, path.as_slice(), value)),
        out_dir,
        &options,
    )
    .map_err(|e| Error::Core(e.into()))?;
    Ok(ConvertReport { tensors: report.tensors, tensor_bytes: report.bytes, skipped, files: report.files })
}
