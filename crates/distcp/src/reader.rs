//! Reading a DCP directory lazily: `open` reads only the metadata (and validates it whole), entries are
//! known before any data is read, and each read maps only the items it needs.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ckpt_io::PinnedDir;
use ckpt_io::storage::RangeFill;
use ckpt_tensor::{
    AlignedBytes, Buffer, CheckpointRead, Entry, EntryKind, PathItem, Tensor, TensorInfo, Value, unflatten,
};
use rayon::prelude::*;

use crate::chunks::{self, copy_box, dense_tensor, intersect, is_empty};
use crate::error::{Error, Result};
use crate::item::{self, DataFiles, safe_join};
use crate::metadata::{Metadata, StorageInfo, StorageMetadata, TensorStorageMetadata};

/// Options for opening a checkpoint.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Map data files and hand out tensors that are windows of the map (zero copy). `false` reads each
    /// item into its own buffer instead, so memory stays bounded by what is being read (streaming
    /// conversions use this). Default `true`.
    pub mmap: bool,
    /// Check the CRC-32 of every `torch.save` record read (torch never does). Default `false`.
    pub verify_crc: bool,
    /// Largest size a zstd-compressed non-tensor item may inflate to (tensor items are bounded by their
    /// chunk size plus 64 MiB). Default 1 GiB.
    pub max_object_bytes: u64,
    /// Largest `.metadata` file (and `__<rank>.metadata` part) read, in bytes; a larger one is
    /// [`Error::MetadataTooLarge`] before anything of it is read. Default 1 GiB.
    pub max_metadata_bytes: u64,
    /// Limits for the pickle decoder (`.metadata` and items).
    pub limits: ckpt_pickle::Limits,
    /// The data files are a partial local copy (a checkpoint on an object store): every byte range of a
    /// data file is filled through this hook before it is read, and a region read
    /// ([`DcpReader::read_region`]) fills only the parts of the items it reads (each item's ZIP end
    /// records, central directory and small records, and the bytes of the region's elements), copying the
    /// region out so that nothing unfilled is handed out. Default `None`: local files, read as they are.
    pub fill: Option<Arc<dyn RangeFill>>,
}

/// The default of [`ReadOptions::max_metadata_bytes`]: 1 GiB.
pub const DEFAULT_MAX_METADATA_BYTES: u64 = 1 << 30;

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            mmap: true,
            verify_crc: false,
            max_object_bytes: 1 << 30,
            max_metadata_bytes: DEFAULT_MAX_METADATA_BYTES,
            limits: Default::default(),
            fill: None,
        }
    }
}

impl ReadOptions {
    /// Sets [`ReadOptions::mmap`].
    #[must_use]
    pub fn with_mmap(mut self, mmap: bool) -> Self {
        self.mmap = mmap;
        self
    }

    /// Sets [`ReadOptions::verify_crc`].
    #[must_use]
    pub fn with_verify_crc(mut self, verify: bool) -> Self {
        self.verify_crc = verify;
        self
    }

    /// Sets [`ReadOptions::max_object_bytes`].
    #[must_use]
    pub fn with_max_object_bytes(mut self, bytes: u64) -> Self {
        self.max_object_bytes = bytes;
        self
    }

    /// Sets [`ReadOptions::max_metadata_bytes`].
    #[must_use]
    pub fn with_max_metadata_bytes(mut self, bytes: u64) -> Self {
        self.max_metadata_bytes = bytes;
        self
    }

    /// Sets [`ReadOptions::limits`].
    #[must_use]
    pub fn with_limits(mut self, limits: ckpt_pickle::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets [`ReadOptions::fill`].
    #[must_use]
    pub fn with_fill(mut self, fill: Option<Arc<dyn RangeFill>>) -> Self {
        self.fill = fill;
        self
    }

    fn torch(&self) -> ckpt_torch::ReadOptions {
        ckpt_torch::ReadOptions::default().with_verify_crc(self.verify_crc).with_limits(self.limits)
    }
}

/// Where the metadata came from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetadataSource {
    /// The global `.metadata` pickle, and its pickle protocol.
    Global {
        /// Pickle protocol of the file.
        protocol: u8,
    },
    /// Per-rank `__{rank}.metadata` files (`use_collectives=False`, torch 2.9+), merged.
    PerRank {
        /// The ranks whose files were merged.
        ranks: Vec<usize>,
    },
    /// The Hugging Face safetensors layout (no pickle; built from the safetensors headers).
    HfSafetensors,
}

/// A DCP checkpoint directory, open for reading.
///
/// Opening reads the metadata only (`.metadata`; or every `__{rank}.metadata`, merged; or the safetensors
/// headers of the Hugging Face layout) and validates it whole before anything is handed out: data file
/// paths stay inside the directory, items lie inside their files, chunks lie inside their tensors, do not
/// overlap and cover them, and every chunk has an item. Tensors and values are read on demand, each read
/// touching only the items it needs.
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// use ckpt_distcp::{DcpReader, WriteOptions, save};
/// let dir = tempfile::tempdir().unwrap();
/// let w = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]).unwrap();
/// let sd = Value::dict([("model", Value::dict([("w", Value::Tensor(w))])), ("step", Value::Int(7))]);
/// save(&sd, dir.path(), &WriteOptions::default()).unwrap();
///
/// let r = DcpReader::open(dir.path()).unwrap();
/// assert_eq!(r.keys().collect::<Vec<_>>(), ["model.w", "step"]);
/// let row = r.read_region("model.w", &[1, 0], &[1, 3]).unwrap();
/// assert_eq!(row.to_vec::<f32>().unwrap(), vec![3.0, 4.0, 5.0]);
/// assert_eq!(r.state_dict().unwrap(), sd);
/// ```
pub struct DcpReader {
    dir: PathBuf,
    metadata: Metadata,
    source: MetadataSource,
    keys: HashMap<String, usize>,
    /// Per key (as numbered in `keys`), the indices of its `storage_data` entries sorted by chunk offsets,
    /// the last of equal entries only.
    items: Vec<Vec<u32>>,
    paths: HashMap<String, Vec<PathItem>>,
    files: DataFiles,
    options: ReadOptions,
    /// Data files the metadata names that do not exist (found at open): their entries cannot be read, the
    /// others can.
    missing: std::collections::BTreeSet<String>,
}

impl std::fmt::Debug for DcpReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcpReader")
            .field("dir", &self.dir)
            .field("source", &self.source)
            .field("keys", &self.metadata.state_dict_metadata.len())
            .field("items", &self.metadata.storage_data.len())
            .finish_non_exhaustive()
    }
}

/// Per-rank metadata files `__{rank}.metadata` in `dir`, sorted by rank.
fn rank_metadata_files(dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let rank = name
            .strip_prefix("__")
            .and_then(|n| n.strip_suffix(".metadata"))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(rank) = rank {
            out.push((rank, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The metadata file `name` of the pinned directory.
fn read_pinned_metadata(pinned: &PinnedDir, name: &str, options: &ReadOptions) -> Result<(Metadata, u8)> {
    let path = pinned.path().join(name);
    let file = pinned.open_file(name).map_err(|e| Error::io(&path, e))?;
    // Mapped, not read: the pickle is decoded from the page cache where it lies (no copy into fresh memory,
    // whose first touch costs a page fault per 4 KiB: a sixth of the open of a 67 MB `.metadata`). Mapping
    // reads nothing, so the size limit is checked on the map. The map lives until the `Metadata`, which owns
    // its data, is made.
    let bytes = Buffer::map(&file, &path)?;
    if bytes.len() as u64 > options.max_metadata_bytes {
        return Err(Error::MetadataTooLarge { path, len: bytes.len() as u64, limit: options.max_metadata_bytes });
    }
    parse_metadata(bytes.as_bytes(), &path, &options.limits)
}

fn parse_metadata(bytes: &[u8], path: &Path, limits: &ckpt_pickle::Limits) -> Result<(Metadata, u8)> {
    let protocol = match bytes {
        [0x80, p, ..] => *p,
        _ => 0,
    };
    Ok((Metadata::from_pickle_with(bytes, path, limits)?, protocol))
}

/// A data file as [`DcpReader::metadata_problems`] checks it: `None` for an unsafe path, else its length
/// (`None` when it is not a file) or the error looking at it.
type FileCheck = Option<std::result::Result<Option<u64>, std::io::ErrorKind>>;

/// The per-key index of `storage_data` (see [`DcpReader`]'s `items`). Items of keys that
/// `state_dict_metadata` does not have are never looked up and are left out.
fn item_index(metadata: &Metadata, keys: &HashMap<String, usize>) -> Result<Vec<Vec<u32>>> {
    let mut items: Vec<Vec<u32>> = vec![Vec::new(); keys.len()];
    let mut last: Option<(&str, usize)> = None;
    for (i, (ix, _)) in metadata.storage_data.iter().enumerate() {
        let i = u32::try_from(i).map_err(|_| Error::TooManyStorageItems)?;
        let k = match last {
            Some((fqn, k)) if fqn == ix.fqn => Some(k),
            _ => keys.get(ix.fqn.as_str()).copied(),
        };
        if let Some(k) = k {
            last = Some((ix.fqn.as_str(), k));
            if let Some(list) = items.get_mut(k) {
                list.push(i);
            }
        }
    }
    let offset = |i: &u32| metadata.storage_data.get(*i as usize).and_then(|(ix, _)| ix.offset.as_deref());
    for list in &mut items {
        // Stable: equal entries stay in file order. Of equal entries (a `MetadataIndex` key compares by fqn
        // and offset) the last is kept, as the dict torch unpickles keeps the last value; DCP never writes
        // two, a damaged or hand-made file may.
        // Torch writes a key's items in rank order, which for row shards is offset order: check before
        // sorting.
        if !list.is_sorted_by(|a, b| offset(a) <= offset(b)) {
            list.sort_by(|a, b| offset(a).cmp(&offset(b)));
        }
        list.dedup_by(|later, kept| {
            let same = offset(later) == offset(kept);
            if same {
                *kept = *later;
            }
            same
        });
    }
    Ok(items)
}

/// Merges per-rank metadata (every rank describes only its own items): tensors gain the chunks of every
/// rank (a chunk saved by several ranks is kept once, from the lowest rank), items likewise.
fn merge(parts: Vec<Metadata>) -> Result<Metadata> {
    let mut out = Metadata {
        state_dict_metadata: Vec::new(),
        planner_data: None,
        storage_data: Vec::new(),
        storage_meta: None,
        version: None,
    };
    let mut pos: HashMap<String, usize> = HashMap::new();
    let mut items: HashSet<(String, Option<Vec<usize>>)> = HashSet::new();
    for part in parts {
        if out.storage_meta.is_none() {
            out.storage_meta = part.storage_meta.clone();
        }
        if out.version.is_none() {
            out.version = part.version.clone();
        }
        for (k, md) in part.state_dict_metadata {
            match pos.get(&k) {
                None => {
                    pos.insert(k.clone(), out.state_dict_metadata.len());
                    out.state_dict_metadata.push((k, md));
                }
                Some(&p) => match (&mut out.state_dict_metadata[p].1, md) {
                    (StorageMetadata::Bytes, StorageMetadata::Bytes) => {}
                    (StorageMetadata::Tensor(have), StorageMetadata::Tensor(new)) => {
                        if have.size != new.size || have.properties.dtype != new.properties.dtype {
                            return Err(Error::MergeConflict {
                                key: k,
                                detail: format!(
                                    "{} {:?} in one file, {} {:?} in another",
                                    have.properties.dtype, have.size, new.properties.dtype, new.size
                                ),
                            });
                        }
                        for c in new.chunks {
                            if !have.chunks.contains(&c) {
                                have.chunks.push(c);
                            }
                        }
                    }
                    _ => {
                        return Err(Error::MergeConflict {
                            key: k,
                            detail: "a tensor in one file, a non-tensor value in another".into(),
                        });
                    }
                },
            }
        }
        for (mut ix, info) in part.storage_data {
            if items.insert((ix.fqn.clone(), ix.offset.clone())) {
                ix.index = None;
                out.storage_data.push((ix, info));
            }
        }
        if let Some(pd) = part.planner_data {
            let have = out.planner_data.get_or_insert_with(Vec::new);
            let known: HashSet<String> = have.iter().map(|(k, _)| k.clone()).collect();
            have.extend(pd.into_iter().filter(|(k, _)| !known.contains(k)));
        }
    }
    // Index hints refer to each rank's own chunk lists; recompute them for the merged lists.
    for (ix, _) in &mut out.storage_data {
        if let (Some(off), Some(&p)) = (&ix.offset, pos.get(&ix.fqn)) {
            if let StorageMetadata::Tensor(t) = &out.state_dict_metadata[p].1 {
                ix.index = t.chunks.iter().position(|c| &c.offsets == off);
            }
        }
    }
    Ok(out)
}

impl DcpReader {
    /// Opens `dir` with default options.
    ///
    /// # Errors
    /// [`Error::NotACheckpoint`] if `dir` holds no DCP metadata; the metadata decoder's errors; the first
    /// validation failure (see the type docs), naming the key and the file.
    pub fn open(dir: impl AsRef<Path>) -> Result<DcpReader> {
        let dir = dir.as_ref();
        Self::open_with(dir, &ReadOptions::default())
    }

    /// Opens `dir`.
    ///
    /// # Errors
    /// As [`DcpReader::open`].
    ///
    /// A data file that does not exist does not stop the open: the entries whose items it holds cannot be
    /// read ([`DcpReader::missing_files`], [`CheckpointRead::unreadable`]); every other entry reads.
    pub fn open_with(dir: impl AsRef<Path>, options: &ReadOptions) -> Result<DcpReader> {
        let dir = dir.as_ref();
        let mut r = Self::open_unchecked(dir, options)?;
        let mut missing = std::collections::BTreeSet::new();
        for e in r.metadata_problems(false) {
            match e {
                Error::MissingFile { file, .. } => {
                    missing.insert(file);
                }
                e => return Err(e),
            }
        }
        r.missing = missing;
        Ok(r)
    }

    /// The data files the metadata names that do not exist, sorted.
    pub fn missing_files(&self) -> impl Iterator<Item = &str> {
        self.missing.iter().map(String::as_str)
    }

    /// Reads the metadata without validating it (for [`crate::verify`], which reports every problem).
    pub(crate) fn open_unchecked(dir: &Path, options: &ReadOptions) -> Result<DcpReader> {
        if !dir.is_dir() {
            return Err(Error::io(dir, std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory")));
        }
        // Every file is opened in the directory pinned now: a checkpoint committed at this path while the
        // reader lives is never mixed with this one.
        let pinned = Arc::new(PinnedDir::open(dir).map_err(|e| Error::io(dir, e))?);
        let (metadata, source) = if pinned.file_len(".metadata").is_some() {
            let (md, protocol) = read_pinned_metadata(&pinned, ".metadata", options)?;
            (md, MetadataSource::Global { protocol })
        } else {
            let ranks = rank_metadata_files(dir)?;
            if !ranks.is_empty() {
                let mut parts = Vec::with_capacity(ranks.len());
                for (_, path) in &ranks {
                    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    parts.push(read_pinned_metadata(&pinned, &name, options)?.0);
                }
                (merge(parts)?, MetadataSource::PerRank { ranks: ranks.iter().map(|(r, _)| *r).collect() })
            } else if crate::hf::detect(dir) {
                (crate::hf::metadata(dir)?.0, MetadataSource::HfSafetensors)
            } else {
                return Err(Error::NotACheckpoint { dir: dir.to_path_buf() });
            }
        };
        let keys: HashMap<String, usize> =
            metadata.state_dict_metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let items = item_index(&metadata, &keys)?;
        let paths = metadata.planner_data.iter().flatten().map(|(k, p)| (k.clone(), p.clone())).collect();
        Ok(DcpReader {
            dir: dir.to_path_buf(),
            files: DataFiles::new(pinned, options.mmap, options.fill.clone()),
            metadata,
            source,
            keys,
            items,
            paths,
            options: options.clone(),
            missing: std::collections::BTreeSet::new(),
        })
    }

    /// Every metadata-level problem (or just the first): unsafe paths, missing files, items past the end
    /// of their file, chunk rank/bounds/overlap/coverage, chunks and values without an item.
    pub(crate) fn metadata_problems(&self, first_only: bool) -> Vec<Error> {
        let mut problems = Vec::new();
        // Per data file: whether its path is safe, and its length if it is a file (each looked up once).
        let mut files: HashMap<&str, FileCheck> = HashMap::new();
        // Items of one file usually follow each other (torch merges the ranks' write results in order).
        let mut last: Option<(&str, FileCheck)> = None;
        for (ix, info) in &self.metadata.storage_data {
            let path = info.relative_path.as_str();
            let file = match last {
                Some((p, file)) if p == path => file,
                _ => {
                    let file = *files.entry(path).or_insert_with(|| {
                        safe_join(&self.dir, path).map(|_| self.files.file_len(path).map_err(|e| e.kind()))
                    });
                    last = Some((path, file));
                    file
                }
            };
            let Some(len) = file else {
                problems.push(Error::UnsafePath { key: ix.fqn.clone(), file: info.relative_path.clone() });
                if first_only {
                    return problems;
                }
                continue;
            };
            match len {
                Err(kind) => problems.push(Error::io(self.dir.join(&info.relative_path), kind.into())),
                Ok(None) => problems.push(Error::MissingFile { key: ix.fqn.clone(), file: info.relative_path.clone() }),
                Ok(Some(l)) if info.offset.checked_add(info.length).is_none_or(|end| end > l) => {
                    problems.push(Error::ItemOutOfFile {
                        key: ix.fqn.clone(),
                        file: info.relative_path.clone(),
                        offset: info.offset,
                        length: info.length,
                        file_len: l,
                    });
                }
                Ok(Some(_)) => {}
            }
            if first_only && !problems.is_empty() {
                return problems;
            }
        }
        for (k, (key, md)) in self.metadata.state_dict_metadata.iter().enumerate() {
            // The key's number in `keys` (the first of duplicate keys, which only a merge can produce).
            let k = self.keys.get(key).copied().unwrap_or(k);
            match md {
                StorageMetadata::Tensor(t) => {
                    if let Err(e) = chunks::check_chunks(key, &t.size, &t.chunks) {
                        problems.push(e);
                    }
                    // Chunks usually come in the items' order: try the item after the last one found first.
                    let mut next = 0;
                    for c in &t.chunks {
                        if self.item_after(k, Some(&c.offsets), &mut next).is_none() {
                            problems.push(Error::MissingItem { key: key.clone(), offsets: Some(c.offsets.clone()) });
                        }
                    }
                }
                StorageMetadata::Bytes => {
                    if self.item_of(k, None).is_none() {
                        problems.push(Error::MissingItem { key: key.clone(), offsets: None });
                    }
                }
            }
            if first_only && !problems.is_empty() {
                problems.truncate(1);
                return problems;
            }
        }
        problems
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The decoded metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Where the metadata came from.
    pub fn source(&self) -> &MetadataSource {
        &self.source
    }

    /// The flattened keys, in the metadata's order.
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.metadata.state_dict_metadata.iter().map(|(k, _)| k.as_str())
    }

    /// What `key` stores.
    ///
    /// # Errors
    /// [`Error::NoSuchEntry`].
    pub fn storage_metadata(&self, key: &str) -> Result<&StorageMetadata> {
        self.keys
            .get(key)
            .and_then(|&i| self.metadata.state_dict_metadata.get(i))
            .map(|(_, md)| md)
            .ok_or_else(|| Error::NoSuchEntry(key.to_owned()))
    }

    /// The tensor metadata of `key` (dtype, global shape, chunks).
    ///
    /// # Errors
    /// [`Error::NoSuchEntry`], [`Error::NotATensor`].
    pub fn tensor_metadata(&self, key: &str) -> Result<&TensorStorageMetadata> {
        self.storage_metadata(key)?.as_tensor().ok_or_else(|| Error::NotATensor(key.to_owned()))
    }

    /// The path of `key` in the nested state dict (`planner_data`, or the key itself).
    pub fn path_of(&self, key: &str) -> Vec<PathItem> {
        self.paths.get(key).cloned().unwrap_or_else(|| vec![PathItem::Key(key.to_owned())])
    }

    pub(crate) fn storage_info(&self, key: &str, offsets: Option<&[usize]>) -> Result<&StorageInfo> {
        self.item(key, offsets)
            .and_then(|i| self.metadata.storage_data.get(i))
            .map(|(_, info)| info)
            .ok_or_else(|| Error::MissingItem { key: key.to_owned(), offsets: offsets.map(<[usize]>::to_vec) })
    }

    /// The index in `storage_data` of the item of `key` at `offsets` (the last, if several: torch's rule).
    fn item(&self, key: &str, offsets: Option<&[usize]>) -> Option<usize> {
        self.item_of(*self.keys.get(key)?, offsets)
    }

    /// [`Self::item_of`], trying position `next` of the key's items first (chunks usually come in their
    /// items' order), and setting `next` past the item looked at.
    fn item_after(&self, key: usize, offsets: Option<&[usize]>, next: &mut usize) -> Option<usize> {
        let list = self.items.get(key)?;
        let offset = |i: u32| self.metadata.storage_data.get(i as usize).and_then(|(ix, _)| ix.offset.as_deref());
        let at = match list.get(*next) {
            Some(&i) if offset(i) == offsets => *next,
            _ => list.partition_point(|&i| offset(i) < offsets),
        };
        let &i = list.get(at)?;
        *next = at + 1;
        (offset(i) == offsets).then_some(i as usize)
    }

    /// [`Self::item`] by the key's number.
    fn item_of(&self, key: usize, offsets: Option<&[usize]>) -> Option<usize> {
        let mut no_hint = usize::MAX;
        self.item_after(key, offsets, &mut no_hint)
    }

    /// The tensor stored for chunk `chunk` of `key`, as stored (its strides kept), zero copy when the data
    /// files are mapped and the item is not transformed.
    ///
    /// # Errors
    /// [`Error::NoSuchEntry`], [`Error::NotATensor`], or an item error naming the key and the file.
    pub fn read_chunk(&self, key: &str, chunk: usize) -> Result<Tensor> {
        let md = self.tensor_metadata(key)?;
        let c = md.chunks.get(chunk).ok_or_else(|| Error::NoSuchEntry(format!("{key} chunk {chunk}")))?;
        let info = self.storage_info(key, Some(&c.offsets))?;
        let file = &info.relative_path;
        let dtype = md.properties.dtype;
        let t = if self.source == MetadataSource::HfSafetensors {
            let data = self.files.raw(key, info)?;
            Tensor::from_buffer(dtype, &c.sizes, data).map_err(|_| Error::ChunkShapeMismatch {
                key: key.to_owned(),
                file: file.clone(),
                expected: c.sizes.clone(),
                found: vec![info.length as usize / dtype.size().max(1)],
            })?
        } else {
            let chunk_bytes = c.numel().and_then(|n| n.checked_mul(dtype.size())).unwrap_or(usize::MAX) as u64;
            let data = self.files.item(key, info, chunk_bytes.saturating_add(64 << 20))?;
            let value = item::parse(key, file, &data, &self.options.torch())?;
            item::tensor_of(key, file, value)?
        };
        if t.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                key: key.to_owned(),
                file: file.clone(),
                expected: dtype,
                found: t.dtype(),
            });
        }
        if t.shape() != c.sizes.as_slice() {
            return Err(Error::ChunkShapeMismatch {
                key: key.to_owned(),
                file: file.clone(),
                expected: c.sizes.clone(),
                found: t.shape().to_vec(),
            });
        }
        Ok(t)
    }

    /// The whole tensor `key`. When one chunk holds all of it, this is that chunk's tensor as stored (zero
    /// copy from the map; strides kept); otherwise the chunks are assembled into a new row-major tensor.
    ///
    /// # Errors
    /// [`Error::NoSuchEntry`], [`Error::NotATensor`], or an item error naming the key and the file.
    pub fn read_tensor(&self, key: &str) -> Result<Tensor> {
        let md = self.tensor_metadata(key)?;
        let zeros = vec![0; md.size.len()];
        self.read_region(key, &zeros, &md.size)
    }

    /// Makes present, in few fills, the whole items of every chunk that one of `regions` (`(key, offsets,
    /// sizes)`, as [`Self::read_region`] takes them) covers entirely, before the regions are read: a
    /// partial copy (a checkpoint on an object store) then fetches a rank's own items as one range per run
    /// of items in a data file (items less than 64 KiB apart are one run), cut by the fill hook at its part
    /// size, instead of a few small ranges per box. Chunks a region covers only in part are left to
    /// [`Self::read_region`], which fetches the box's bytes alone. Nothing to do without a fill hook; keys
    /// that are not tensors are left to the read, which reports them.
    ///
    /// # Errors
    /// [`Error::Fetch`] (naming the run's first key) when a fill fails.
    pub fn prefetch_regions(&self, regions: &[(&str, &[usize], &[usize])]) -> Result<()> {
        /// Items closer than this in one file are fetched as one range (the bytes between them too).
        const RUN_GAP: u64 = 64 << 10;
        let Some(fill) = self.files.fill_hook() else { return Ok(()) };
        let mut wanted: HashMap<&str, Vec<(u64, u64, &str)>> = HashMap::new();
        for &(key, offsets, sizes) in regions {
            let Ok(md) = self.tensor_metadata(key) else { continue };
            for c in &md.chunks {
                let Some((at, len)) = intersect(&c.offsets, &c.sizes, offsets, sizes) else { continue };
                if at != c.offsets || len != c.sizes {
                    continue;
                }
                let info = self.storage_info(key, Some(&c.offsets))?;
                if !info.transform_descriptors.is_empty() {
                    continue;
                }
                let Some(end) = info.offset.checked_add(info.length) else { continue };
                wanted.entry(info.relative_path.as_str()).or_default().push((info.offset, end, key));
            }
        }
        for (file, mut items) in wanted {
            items.sort_unstable();
            let mut runs: Vec<(u64, u64, &str)> = Vec::new();
            for (start, end, key) in items {
                match runs.last_mut() {
                    Some(last) if start <= last.1.saturating_add(RUN_GAP) => last.1 = last.1.max(end),
                    _ => runs.push((start, end, key)),
                }
            }
            for (start, end, key) in runs {
                fill.fill(file, start..end).map_err(|source| Error::Fetch {
                    key: key.to_owned(),
                    file: file.to_owned(),
                    start,
                    end,
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// The region `offsets .. offsets + sizes` of tensor `key`, in global coordinates, reading only the
    /// items whose chunks overlap it. A region inside a single chunk is a view of that chunk (zero copy
    /// from the map); otherwise the overlapping parts are copied into a new row-major tensor.
    ///
    /// This is how a job with another number of ranks loads its own shard (see [`crate::shard_box`]).
    ///
    /// # Errors
    /// [`Error::RegionOutOfBounds`]; [`Error::IncompleteCoverage`] if chunks leave part of the region
    /// uncovered; item errors naming the key and the file.
    pub fn read_region(&self, key: &str, offsets: &[usize], sizes: &[usize]) -> Result<Tensor> {
        let md = self.tensor_metadata(key)?;
        let dtype = md.properties.dtype;
        let inside = offsets.len() == md.size.len()
            && sizes.len() == md.size.len()
            && offsets.iter().zip(sizes).zip(&md.size).all(|((&o, &s), &d)| o.checked_add(s).is_some_and(|e| e <= d));
        if !inside {
            return Err(Error::RegionOutOfBounds {
                key: key.to_owned(),
                offsets: offsets.to_vec(),
                sizes: sizes.to_vec(),
                shape: md.size.clone(),
            });
        }
        if is_empty(sizes) {
            return Ok(Tensor::zeros(dtype, sizes)?);
        }
        let hits: Vec<(usize, Vec<usize>, Vec<usize>)> = md
            .chunks
            .iter()
            .enumerate()
            .filter_map(|(i, c)| intersect(&c.offsets, &c.sizes, offsets, sizes).map(|(o, l)| (i, o, l)))
            .collect();
        let covered: u128 = hits.iter().map(|(_, _, l)| l.iter().map(|&x| x as u128).product::<u128>()).sum();
        let total: u128 = sizes.iter().map(|&x| x as u128).product();
        if covered != total {
            return Err(Error::IncompleteCoverage { key: key.to_owned(), covered, total });
        }
        if self.files.fill_hook().is_some() {
            return self.read_region_filled(key, sizes, offsets, &hits);
        }
        // One chunk holds the whole region: a view of it.
        if let [(i, o, l)] = hits.as_slice() {
            let c = &md.chunks[*i];
            let t = self.read_chunk(key, *i)?;
            let rel: Vec<usize> = o.iter().zip(&c.offsets).map(|(a, b)| a - b).collect();
            return Ok(t.region(&rel, l)?);
        }
        let nbytes = ckpt_tensor::checked_numel(sizes)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| Error::RegionTooLarge { key: key.to_owned(), sizes: sizes.to_vec() })?;
        let copy = |out: &mut AlignedBytes, i: usize, o: &[usize], l: &[usize], t: &Tensor| {
            // Lazy conjugation/negation bits are resolved before the raw bytes are copied.
            let resolved;
            let t = if t.is_conj() || t.is_neg() {
                resolved = t.to_contiguous()?;
                &resolved
            } else {
                t
            };
            let c = &md.chunks[i];
            let src: Vec<usize> = o.iter().zip(&c.offsets).map(|(a, b)| a - b).collect();
            let dst: Vec<usize> = o.iter().zip(offsets).map(|(a, b)| a - b).collect();
            copy_box(t, &src, l, out.as_mut_bytes(), sizes, &dst)
        };
        if self.options.mmap {
            // Items are windows of the maps: decode them in parallel, then copy.
            let tensors: Vec<Tensor> =
                hits.par_iter().map(|(i, _, _)| self.read_chunk(key, *i)).collect::<Result<_>>()?;
            if tensors.iter().all(|t| t.storage().is_mapped() && !t.is_conj() && !t.is_neg()) {
                // Every part is a window of a map: the region is assembled when its bytes are asked for
                // ([`Buffer::deferred`]), so that a writer streaming many such regions holds one at a time.
                let mut parts = Vec::with_capacity(hits.len());
                for ((i, o, l), t) in hits.iter().zip(tensors) {
                    let c = &md.chunks[*i];
                    let src: Vec<usize> = o.iter().zip(&c.offsets).map(|(a, b)| a - b).collect();
                    let dst: Vec<usize> = o.iter().zip(offsets).map(|(a, b)| a - b).collect();
                    parts.push((t, src, l.clone(), dst));
                }
                let shape = sizes.to_vec();
                let fill = move |out: &mut [u8]| -> ckpt_tensor::Result<()> {
                    for (t, src, l, dst) in &parts {
                        copy_box(t, src, l, out, &shape, dst)?;
                    }
                    Ok(())
                };
                return Ok(Tensor::from_buffer(dtype, sizes, Buffer::deferred(nbytes, fill))?);
            }
            let mut out = AlignedBytes::zeroed(nbytes)?;
            for ((i, o, l), t) in hits.iter().zip(&tensors) {
                copy(&mut out, *i, o, l, t)?;
            }
            dense_tensor(out, dtype, sizes)
        } else {
            // Items are read into memory: one at a time, so at most one chunk is held besides the result.
            let mut out = AlignedBytes::zeroed(nbytes)?;
            for (i, o, l) in &hits {
                let t = self.read_chunk(key, *i)?;
                copy(&mut out, *i, o, l, &t)?;
            }
            dense_tensor(out, dtype, sizes)
        }
    }

    /// [`Self::read_region`] of a partial copy (a fill hook): each overlapping part read with
    /// [`Self::read_box_filled`], the parts copied into a new row-major tensor (a single part is the result).
    fn read_region_filled(
        &self,
        key: &str,
        sizes: &[usize],
        offsets: &[usize],
        hits: &[(usize, Vec<usize>, Vec<usize>)],
    ) -> Result<Tensor> {
        let md = self.tensor_metadata(key)?;
        let dtype = md.properties.dtype;
        let rel = |i: usize, o: &[usize]| -> Vec<usize> {
            md.chunks.get(i).map(|c| o.iter().zip(&c.offsets).map(|(a, b)| a - b).collect()).unwrap_or_default()
        };
        if let [(i, o, l)] = hits {
            return self.read_box_filled(key, *i, &rel(*i, o), l);
        }
        let nbytes = ckpt_tensor::checked_numel(sizes)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| Error::RegionTooLarge { key: key.to_owned(), sizes: sizes.to_vec() })?;
        // One part at a time (each fill is itself parallel): memory stays at the result and one part.
        let mut out = AlignedBytes::zeroed(nbytes)?;
        for (i, o, l) in hits {
            let part = self.read_box_filled(key, *i, &rel(*i, o), l)?;
            let part = if part.is_conj() || part.is_neg() { part.to_contiguous()? } else { part };
            let dst: Vec<usize> = o.iter().zip(offsets).map(|(a, b)| a - b).collect();
            copy_box(&part, &vec![0; l.len()], l, out.as_mut_bytes(), sizes, &dst)?;
        }
        dense_tensor(out, dtype, sizes)
    }

    /// The box `rel .. rel + len` of chunk `chunk` of `key` from a partial copy, filling only what it reads:
    /// for an untransformed item, the item's ZIP end records, central directory and records but the tensor
    /// data's (torch.save items; nothing of the Hugging Face layout's raw items), then the bytes from the
    /// box's first element to its last. The box is copied out unless the item's whole storage was filled,
    /// so that no tensor handed out has unfilled bytes in its storage. Anything else (a transformed item,
    /// CRC checks, an item the partial parse does not read as expected) fills the whole item and reads it
    /// as [`Self::read_chunk`] does.
    fn read_box_filled(&self, key: &str, chunk: usize, rel: &[usize], len: &[usize]) -> Result<Tensor> {
        let whole = || -> Result<Tensor> { Ok(self.read_chunk(key, chunk)?.region(rel, len)?) };
        let md = self.tensor_metadata(key)?;
        let c = md.chunks.get(chunk).ok_or_else(|| Error::NoSuchEntry(format!("{key} chunk {chunk}")))?;
        let info = self.storage_info(key, Some(&c.offsets))?;
        if !info.transform_descriptors.is_empty() || self.options.verify_crc {
            return whole();
        }
        let window = self.files.window(key, info)?;
        let dtype = md.properties.dtype;
        let stored = if self.source == MetadataSource::HfSafetensors {
            Tensor::from_buffer(dtype, &c.sizes, window.clone()).ok()
        } else {
            self.parse_filled(key, info, &window)?
        };
        let Some(t) = stored.filter(|t| t.dtype() == dtype && t.shape() == c.sizes.as_slice()) else {
            return whole();
        };
        let view = t.region(rel, len)?;
        let storage = view.storage();
        // The storage must be a window of the item (not a copy the parse made of unfilled bytes).
        let inside = storage.same_backing(&window)
            && storage.offset_in_backing() >= window.offset_in_backing()
            && storage.offset_in_backing() + storage.len() <= window.offset_in_backing() + window.len();
        if !inside || view.numel() == 0 {
            return whole();
        }
        let base = (storage.offset_in_backing() - window.offset_in_backing()) as u64;
        let size = dtype.size() as u64;
        let last: u64 = view.shape().iter().zip(view.strides()).map(|(&l, &s)| (l.saturating_sub(1) * s) as u64).sum();
        let first = view.storage_offset() as u64;
        let span = base + first * size..base + (first + last + 1) * size;
        if span.end > base + storage.len() as u64 {
            return whole();
        }
        self.files.fill(key, info, span.clone())?;
        if span.start == base && span.end == base + storage.len() as u64 {
            return Ok(view);
        }
        let data = view.stored_data()?;
        let owned = Tensor::from_buffer(dtype, len, Buffer::copy_from(&data)?)?;
        Ok(owned.with_requires_grad(view.requires_grad()).with_lazy_bits(view.is_conj(), view.is_neg())?)
    }

    /// The tensor of the torch.save item `info` held by `window` (unfilled), parsed after filling the end
    /// records, the central directory and every record's local header, and the data of every record but the
    /// tensor data (`data/<key>`). `None` when it does not parse so (the caller reads it whole); fill
    /// errors are errors.
    fn parse_filled(&self, key: &str, info: &StorageInfo, window: &Buffer) -> Result<Option<Tensor>> {
        use ckpt_torch::zip::Archive;
        /// Where the end records of an item lie: in its last 4 KiB (with the central directory of a few
        /// records) unless a comment is long; always in its last 64 KiB and 98 bytes (the longest comment,
        /// the end record and zip64's two).
        const SHORT_TAIL: u64 = 4 << 10;
        const ZIP_TAIL: u64 = (64 << 10) + 98;
        /// Ranges of small records closer than this are filled as one.
        const GAP: u64 = 64 << 10;
        let len = window.len() as u64;
        self.files.fill(key, info, len.saturating_sub(SHORT_TAIL)..len)?;
        let cd = match Archive::central_directory_range(window.as_bytes()) {
            Ok(cd) => cd,
            Err(_) => {
                self.files.fill(key, info, len.saturating_sub(ZIP_TAIL)..len)?;
                let Ok(cd) = Archive::central_directory_range(window.as_bytes()) else { return Ok(None) };
                cd
            }
        };
        if cd.end > len {
            return Ok(None);
        }
        self.files.fill(key, info, cd)?;
        let Ok(archive) = Archive::parse_predicted(window.as_bytes()) else { return Ok(None) };
        let mut wanted: Vec<std::ops::Range<u64>> = archive
            .records()
            .iter()
            .map(|r| {
                let end = if r.short_name().starts_with("data/") {
                    r.data_offset()
                } else {
                    r.data_offset().saturating_add(r.compressed_size())
                };
                r.local_header_offset()..end.min(len)
            })
            .collect();
        wanted.sort_by_key(|r| r.start);
        let mut merged: Vec<std::ops::Range<u64>> = Vec::with_capacity(wanted.len());
        for r in wanted {
            match merged.last_mut() {
                Some(last) if r.start <= last.end.saturating_add(GAP) => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        for r in merged {
            self.files.fill(key, info, r)?;
        }
        if !window.as_bytes().starts_with(b"PK\x03\x04") {
            return Ok(None);
        }
        let file = &info.relative_path;
        let Ok(value) = item::parse(key, file, window, &self.options.torch()) else { return Ok(None) };
        Ok(item::tensor_of(key, file, value).ok())
    }

    /// The non-tensor value stored under `key` (a BYTE_IO item, unpickled), or the tensor for a tensor key.
    ///
    /// # Errors
    /// [`Error::NoSuchEntry`], or an item error naming the key and the file.
    pub fn read_value(&self, key: &str) -> Result<Value> {
        match self.storage_metadata(key)? {
            StorageMetadata::Tensor(_) => self.read_tensor(key).map(Value::Tensor),
            StorageMetadata::Bytes => {
                let info = self.storage_info(key, None)?;
                let data = self.files.item(key, info, self.options.max_object_bytes)?;
                item::parse(key, &info.relative_path, &data, &self.options.torch())
            }
        }
    }

    /// The nested state dict: every entry read, placed at its `planner_data` path (torch's
    /// `_EmptyStateDictLoadPlanner` + `set_element`; int dict keys come back as strings).
    ///
    /// # Errors
    /// Any read error; an invalid path.
    pub fn state_dict(&self) -> Result<Value> {
        let keys: Vec<&str> = self.keys().collect();
        let values: Vec<Value> = keys.par_iter().map(|k| self.read_value(k)).collect::<Result<_>>()?;
        let leaves = keys.iter().zip(values).map(|(k, v)| (self.path_of(k), v));
        Ok(unflatten(leaves)?)
    }

    /// Bytes of every tensor entry's data (sum of dtype size × elements).
    pub fn tensor_bytes(&self) -> u128 {
        self.metadata
            .state_dict_metadata
            .iter()
            .filter_map(|(_, md)| md.as_tensor())
            .map(|t| t.size.iter().fold(t.properties.dtype.size() as u128, |a, &d| a.saturating_mul(d as u128)))
            .sum()
    }

    /// The torch releases whose writer produces this metadata's layout (inferred from the classes and
    /// fields present).
    pub fn writer_hint(&self) -> &'static str {
        if self.source == MetadataSource::HfSafetensors {
            return "HuggingFaceStorageWriter (torch 2.7+)";
        }
        let props = self.metadata.state_dict_metadata.iter().filter_map(|(_, m)| m.as_tensor()).map(|t| &t.properties);
        let (mut legacy, mut strides) = (false, false);
        for p in props {
            legacy |= p.legacy_class;
            strides |= p.strides.is_some();
        }
        match (&self.metadata.storage_meta, &self.metadata.version) {
            _ if strides => "torch 2.15+",
            (_, Some(_)) => "torch 2.9-2.14",
            (Some(sm), None) if sm.modules.is_some() => "torch 2.7-2.8",
            (Some(_), None) => "torch 2.4-2.6",
            (None, None) if legacy => "torch 2.0-2.2 (or a maximum-compatibility writer)",
            (None, None) => "torch 2.3",
        }
    }
}

impl CheckpointRead for DcpReader {
    fn format_name(&self) -> &'static str {
        "distcp"
    }

    fn unreadable(&self, name: &str) -> Option<String> {
        if self.missing.is_empty() {
            return None;
        }
        let k = *self.keys.get(name)?;
        let items = self.items.get(k)?;
        items.iter().find_map(|&i| {
            let (_, info) = self.metadata.storage_data.get(i as usize)?;
            self.missing.contains(&info.relative_path).then(|| format!("data file {:?} is missing", info.relative_path))
        })
    }

    fn entries(&self) -> Vec<Entry> {
        self.metadata
            .state_dict_metadata
            .iter()
            .map(|(k, md)| Entry {
                name: k.clone(),
                kind: match md {
                    StorageMetadata::Tensor(t) => {
                        EntryKind::Tensor(TensorInfo { dtype: t.properties.dtype, shape: t.size.clone() })
                    }
                    StorageMetadata::Bytes => EntryKind::Value,
                },
            })
            .collect()
    }

    fn details(&self) -> Vec<(String, String)> {
        let md = &self.metadata;
        let mut d = Vec::new();
        d.push((
            "metadata".to_owned(),
            match &self.source {
                MetadataSource::Global { protocol } => format!(".metadata (pickle protocol {protocol})"),
                MetadataSource::PerRank { ranks } => {
                    format!("{} per-rank __<rank>.metadata files, merged (use_collectives=False)", ranks.len())
                }
                MetadataSource::HfSafetensors => "Hugging Face safetensors headers".to_owned(),
            },
        ));
        d.push(("writer".into(), self.writer_hint().to_owned()));
        if !self.missing.is_empty() {
            let files: Vec<&str> = self.missing_files().collect();
            d.push(("missing data files".into(), files.join(", ")));
        }
        if let Some(v) = &md.version {
            d.push(("version".into(), v.clone()));
        }
        if let Some(sm) = &md.storage_meta {
            if let Some(id) = &sm.save_id {
                d.push(("save_id".into(), id.clone()));
            }
            if let Value::Str(p) = &sm.checkpoint_id {
                d.push(("checkpoint_id".into(), p.clone()));
            }
        }
        let tensors = md.state_dict_metadata.iter().filter(|(_, m)| m.as_tensor().is_some()).count();
        d.push(("tensors".into(), tensors.to_string()));
        d.push(("objects".into(), (md.state_dict_metadata.len() - tensors).to_string()));
        d.push(("tensor bytes".into(), self.tensor_bytes().to_string()));
        // Items of one file usually follow each other: hash a path only when it changes.
        let mut files: HashSet<&str> = HashSet::new();
        let mut last = None;
        for (_, s) in &md.storage_data {
            if last != Some(s.relative_path.as_str()) {
                last = Some(s.relative_path.as_str());
                files.insert(s.relative_path.as_str());
            }
        }
        d.push(("items".into(), md.storage_data.len().to_string()));
        d.push(("data files".into(), files.len().to_string()));
        let transforms: HashSet<&str> =
            md.storage_data.iter().flat_map(|(_, s)| s.transform_descriptors.iter().map(String::as_str)).collect();
        if !transforms.is_empty() {
            let mut t: Vec<&str> = transforms.into_iter().collect();
            t.sort_unstable();
            d.push(("transforms".into(), t.join(", ")));
        }
        d.push(("planner_data".into(), if md.planner_data.is_some() { "yes" } else { "no" }.into()));
        d
    }

    fn tensor(&self, name: &str) -> ckpt_tensor::Result<Tensor> {
        Ok(self.read_tensor(name)?)
    }

    fn value(&self, name: &str) -> ckpt_tensor::Result<Value> {
        Ok(self.read_value(name)?)
    }
}
