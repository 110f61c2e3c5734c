//! Reading `torch.save` files: ZIP archives (zero copy over a memory map) and the legacy pickle stream.

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use ckpt_core::{Buffer, CheckpointRead, DType, Entry, LeafIndex, Tensor, Value, entry_kind, leaves};
use ckpt_pickle::Value as P;

use crate::detect::{Container, detect};
use crate::error::{Error, Result};
use crate::legacy;
use crate::rebuild::{Rebuilder, StorageSource, global_name, storage_class_dtype};
use crate::zip::Archive;

/// Options for reading.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Check every record's CRC-32 against the central directory (records with CRC 0, written by
    /// `set_crc32_options(False)`, are not checked). Off by default, as in torch, which never checks.
    pub verify_crc: bool,
    /// Limits for the pickle decoder.
    pub limits: ckpt_pickle::Limits,
}

impl ReadOptions {
    /// Default options with CRC verification switched on or off.
    pub fn with_verify_crc(mut self, verify: bool) -> Self {
        self.verify_crc = verify;
        self
    }
}

/// A `torch.save` file, read.
///
/// Tensors are windows of the file's memory map: nothing is copied, and a storage shared by several tensors
/// is one window.
///
/// ```no_run
/// use ckpt_core::CheckpointRead;
/// let f = ckpt_torch::TorchFile::open("model.pt".as_ref()).unwrap();
/// for e in f.entries() {
///     println!("{} {:?}", e.name, e.kind);
/// }
/// let w = f.tensor("layer.weight").unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct TorchFile {
    value: Value,
    container: Container,
    prefix: Option<String>,
    version: Option<u64>,
    records: Vec<String>,
    /// Leaves by name, built on the first look-up (reading every entry stays linear).
    leaf_index: OnceLock<Option<LeafIndex>>,
}

impl TorchFile {
    /// Maps and reads a file with default options.
    ///
    /// # Errors
    /// [`Error::At`] naming the path, with the cause.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, &ReadOptions::default())
    }

    /// Maps and reads a file.
    ///
    /// # Errors
    /// [`Error::At`] naming the path, with the cause.
    pub fn open_with(path: &Path, options: &ReadOptions) -> Result<Self> {
        let buffer = Buffer::map_file(path).map_err(|e| match e {
            ckpt_core::Error::Io { path, source } => Error::Io { path, source },
            e => Error::Core(e),
        })?;
        Self::from_buffer(&buffer, options).map_err(|e| e.at(path))
    }

    /// Reads a `torch.save` output held in `buffer` (a whole file, or an item embedded in a bigger file as
    /// DCP stores them: ZIP offsets are relative to the buffer's start).
    ///
    /// # Errors
    /// A specific [`Error`] for each kind of wrong or malformed input.
    pub fn from_buffer(buffer: &Buffer, options: &ReadOptions) -> Result<Self> {
        match detect(buffer.as_bytes())? {
            Container::Zip => read_zip(buffer, options),
            Container::Legacy => {
                let value = legacy::read(buffer, options)?;
                Ok(TorchFile {
                    value,
                    container: Container::Legacy,
                    prefix: None,
                    version: None,
                    records: Vec::new(),
                    leaf_index: OnceLock::new(),
                })
            }
        }
    }

    /// The saved object.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The saved object, by value.
    pub fn into_value(self) -> Value {
        self.value
    }

    /// ZIP or legacy.
    pub fn container(&self) -> Container {
        self.container
    }

    /// The ZIP record prefix (`archive`, or the file stem torch saved under).
    pub fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// The archive's `version` record.
    pub fn version(&self) -> Option<u64> {
        self.version
    }

    /// Record names in the archive (without the prefix), in archive order.
    pub fn records(&self) -> &[String] {
        &self.records
    }

    /// The leaf named `name` (every dict, list and tuple is descended into; keys joined by `.`).
    ///
    /// # Errors
    /// [`Error::NoSuchEntry`].
    pub fn get(&self, name: &str) -> Result<&Value> {
        match self.leaf_index.get_or_init(|| LeafIndex::new(&self.value).ok()) {
            Some(index) => index.get(&self.value, name).ok_or_else(|| Error::NoSuchEntry(name.to_owned())),
            // A key whose str() is not reproduced: leaves() names the error.
            None => Err(leaves(&self.value).err().map_or_else(|| Error::NoSuchEntry(name.to_owned()), Error::from)),
        }
    }
}

impl CheckpointRead for TorchFile {
    fn format_name(&self) -> &'static str {
        "torch"
    }

    fn entries(&self) -> Vec<Entry> {
        leaves(&self.value)
            .map(|l| l.into_iter().map(|e| Entry { kind: entry_kind(e.value), name: e.key }).collect())
            .unwrap_or_default()
    }

    fn details(&self) -> Vec<(String, String)> {
        let mut d = vec![(
            "container".to_owned(),
            match self.container {
                Container::Zip => "zip".to_owned(),
                Container::Legacy => "legacy".to_owned(),
            },
        )];
        if let Some(p) = &self.prefix {
            d.push(("prefix".into(), p.clone()));
        }
        if let Some(v) = self.version {
            d.push(("version".into(), v.to_string()));
        }
        d.push(("top level".into(), self.value.type_name().to_owned()));
        d
    }

    fn tensor(&self, name: &str) -> ckpt_core::Result<Tensor> {
        let v = self.get(name).map_err(to_core)?;
        match v {
            Value::OpaqueTensor { kind, .. } => {
                Err(to_core(Error::OpaqueTensor { name: name.to_owned(), kind: *kind }))
            }
            other => other.as_tensor().cloned().ok_or_else(|| to_core(Error::NoSuchTensor(name.to_owned()))),
        }
    }

    fn value(&self, name: &str) -> ckpt_core::Result<Value> {
        self.get(name).cloned().map_err(to_core)
    }
}

/// Maps a torch codec error into the core error, by fault.
pub fn to_core(e: Error) -> ckpt_core::Error {
    match e {
        Error::Core(c) => c,
        Error::Io { path, source } => ckpt_core::Error::Io { path, source },
        e @ (Error::NoSuchEntry(_) | Error::NoSuchTensor(_) | Error::Unwritable(_)) => {
            ckpt_core::Error::InvalidArgument(e.to_string())
        }
        e @ (Error::OpaqueTensor { .. } | Error::TarFormat | Error::PreviewFormat | Error::BigEndian { .. }) => {
            ckpt_core::Error::Unsupported(e.to_string())
        }
        e => ckpt_core::Error::Malformed(e.to_string()),
    }
}

/// Reads the storage records of a ZIP archive.
struct ZipStorages<'a> {
    archive: &'a Archive,
    buffer: &'a Buffer,
    cache: HashMap<String, Buffer>,
}

impl ZipStorages<'_> {
    fn record(&self, name: &str) -> Result<Buffer> {
        let rec = self.archive.get(name).ok_or_else(|| Error::MissingRecord { name: name.to_owned() })?;
        let bytes = self.archive.data(self.buffer.as_bytes(), rec).map_err(|e| match e {
            crate::zip::ZipError::Compressed { method, .. } => Error::Compressed { name: name.to_owned(), method },
            e => Error::Zip(e),
        })?;
        // `data` returned a subslice of the buffer: turn it into a window of the same memory.
        let start = bytes.as_ptr() as usize - self.buffer.as_bytes().as_ptr() as usize;
        Ok(self.buffer.slice_len(start, bytes.len())?)
    }
}

impl StorageSource for ZipStorages<'_> {
    fn storage(&mut self, pid: &P) -> Result<(Buffer, DType)> {
        let items = match pid {
            P::Tuple(items) => items.as_slice(),
            other => return Err(Error::BadPersistentId(format!("expected a tuple, got {other:?}"))),
        };
        let [P::Str(tag), class, P::Str(key), _location, P::Int(numel)] = items else {
            return Err(Error::BadPersistentId(format!(
                "expected ('storage', class, key, location, numel), got {items:?}"
            )));
        };
        if tag != "storage" {
            return Err(Error::BadPersistentId(format!("tag {tag:?} is not 'storage'")));
        }
        let (module, name) = global_name(class)
            .ok_or_else(|| Error::BadPersistentId(format!("storage class is not a global: {class:?}")))?;
        let dtype = storage_class_dtype(&module, &name)?;
        let expected = u64::try_from(*numel)
            .ok()
            .and_then(|n| n.checked_mul(dtype.size() as u64))
            .ok_or_else(|| Error::BadPersistentId(format!("storage {key}: bad element count {numel}")))?;
        let data = match self.cache.get(key) {
            Some(b) => b.clone(),
            None => {
                let b = self.record(&format!("data/{key}"))?;
                self.cache.insert(key.clone(), b.clone());
                b
            }
        };
        if data.len() as u64 != expected {
            return Err(Error::StorageSize { key: key.clone(), expected, actual: data.len() as u64 });
        }
        Ok((data, dtype))
    }
}

fn read_zip(buffer: &Buffer, options: &ReadOptions) -> Result<TorchFile> {
    let bytes = buffer.as_bytes();
    let archive = Archive::parse(bytes)?;
    if archive.get("constants.pkl").is_some() {
        return Err(Error::TorchScript);
    }
    if options.verify_crc {
        for rec in archive.records() {
            archive.verify_crc(bytes, rec)?;
        }
    }
    let mut storages = ZipStorages { archive: &archive, buffer, cache: HashMap::new() };
    let version_name = if archive.get(".data/version").is_some() { ".data/version" } else { "version" };
    let version_text = storages.record(version_name)?;
    let version_str = String::from_utf8_lossy(version_text.as_bytes()).trim_end_matches(['\n', '\r']).to_owned();
    let version = version_str
        .parse::<u64>()
        .ok()
        .filter(|v| (1..=10).contains(v))
        .ok_or(Error::BadVersion { found: version_str })?;
    if archive.get("byteorder").is_some() {
        let order = storages.record("byteorder")?;
        let order = String::from_utf8_lossy(order.as_bytes()).into_owned();
        if order != "little" {
            return Err(Error::BigEndian { found: order });
        }
    }
    let pkl = storages.record("data.pkl")?;
    let (pickled, _) = ckpt_pickle::decode_with(pkl.as_bytes(), &options.limits)
        .map_err(|source| Error::Pickle { part: "data.pkl", source })?;
    let value = Rebuilder { source: &mut storages }.value(&pickled)?;
    Ok(TorchFile {
        value,
        container: Container::Zip,
        prefix: Some(archive.prefix().to_owned()),
        version: Some(version),
        records: archive.records().iter().map(|r| r.short_name().to_owned()).collect(),
        leaf_index: OnceLock::new(),
    })
}

/// Reads a `torch.save` file and returns the saved object (a convenience for [`TorchFile::open`]).
///
/// # Errors
/// As [`TorchFile::open`].
pub fn load(path: &Path) -> Result<Value> {
    TorchFile::open(path).map(TorchFile::into_value)
}
