//! Data items: the bytes `[offset, offset + length)` of a data file, with stream transforms undone, parsed
//! as the `torch.save` archive they are (or, in the Hugging Face layout, as raw tensor bytes).

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use ckpt_io::PinnedDir;
use ckpt_io::storage::RangeFill;
use ckpt_tensor::{Buffer, Tensor, Value};
use ckpt_torch::TorchReader;

use crate::error::{Error, Result};
use crate::metadata::{StorageInfo, ZSTD_TRANSFORM};

/// `relative_path` joined to `dir`, or `None` if it is empty, absolute, or has a `..`, root or drive
/// component.
pub(crate) fn safe_join(dir: &Path, relative: &str) -> Option<PathBuf> {
    let rel = Path::new(relative);
    if relative.is_empty() || relative.contains('\0') {
        return None;
    }
    let mut out = dir.to_path_buf();
    for c in rel.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (out != dir).then_some(out)
}

/// How item bytes are fetched.
enum Handle {
    /// The whole file, mapped; items are windows (zero copy).
    Mapped(Buffer),
    /// An open file; items are read into owned buffers (bounded memory for streaming conversions).
    Open(File),
}

/// The data files of one checkpoint directory, opened lazily and shared between threads.
///
/// Files are opened in the directory pinned when the reader opened ([`PinnedDir`]): a checkpoint swapped in
/// at the same path meanwhile is never mixed in; files of a pinned directory that was removed meanwhile
/// are missing.
///
/// With a fill hook ([`RangeFill`], a partial local copy of a checkpoint on an object store), every item's
/// bytes are filled before they are read ([`DataFiles::raw`]); [`DataFiles::window`] hands out an item's
/// bytes unfilled, for a reader that fills the parts it reads itself ([`DataFiles::fill`]).
pub(crate) struct DataFiles {
    dir: PathBuf,
    pinned: Arc<PinnedDir>,
    mmap: bool,
    fill: Option<Arc<dyn RangeFill>>,
    open: Mutex<HashMap<String, Arc<Handle>>>,
}

impl DataFiles {
    pub(crate) fn new(pinned: Arc<PinnedDir>, mmap: bool, fill: Option<Arc<dyn RangeFill>>) -> Self {
        DataFiles { dir: pinned.path().to_path_buf(), pinned, mmap, fill, open: Mutex::new(HashMap::new()) }
    }

    /// The fill hook, if the data files are a partial copy.
    pub(crate) fn fill_hook(&self) -> Option<&dyn RangeFill> {
        self.fill.as_deref()
    }

    /// Makes the bytes `range` of the item `info` (relative to the item's start, clamped to its length)
    /// present: nothing to do without a fill hook.
    pub(crate) fn fill(&self, key: &str, info: &StorageInfo, range: std::ops::Range<u64>) -> Result<()> {
        let Some(fill) = &self.fill else { return Ok(()) };
        let (start, end) = (range.start.min(info.length), range.end.min(info.length));
        if start >= end {
            return Ok(());
        }
        let (Some(start), Some(end)) = (info.offset.checked_add(start), info.offset.checked_add(end)) else {
            return Err(Error::ItemOutOfFile {
                key: key.to_owned(),
                file: info.relative_path.clone(),
                offset: info.offset,
                length: info.length,
                file_len: u64::MAX,
            });
        };
        fill.fill(&info.relative_path, start..end).map_err(|source| Error::Fetch {
            key: key.to_owned(),
            file: info.relative_path.clone(),
            start,
            end,
            source,
        })
    }

    /// The item's bytes as a window of the mapped file, nothing filled (the file is mapped for this even
    /// when the reader does not map: a partial reader touches only what it filled).
    pub(crate) fn window(&self, key: &str, info: &StorageInfo) -> Result<Buffer> {
        let handle = self.handle(key, &info.relative_path)?;
        let map = match &*handle {
            Handle::Mapped(map) => map.clone(),
            Handle::Open(f) => Buffer::map(f, &self.dir.join(&info.relative_path))?,
        };
        let out_of_file = || Error::ItemOutOfFile {
            key: key.to_owned(),
            file: info.relative_path.clone(),
            offset: info.offset,
            length: info.length,
            file_len: map.len() as u64,
        };
        let (Ok(off), Ok(len)) = (usize::try_from(info.offset), usize::try_from(info.length)) else {
            return Err(out_of_file());
        };
        map.slice_len(off, len).map_err(|_| out_of_file())
    }

    /// The length of the data file `file` (a path the metadata gives, already checked by [`safe_join`]):
    /// `None` when the pinned directory has no regular file of that name.
    pub(crate) fn file_len(&self, file: &str) -> std::io::Result<Option<u64>> {
        match self.pinned.open_file(file).and_then(|f| f.metadata()) {
            Ok(m) => Ok(m.is_file().then_some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn handle(&self, key: &str, file: &str) -> Result<Arc<Handle>> {
        if let Ok(open) = self.open.lock() {
            if let Some(h) = open.get(file) {
                return Ok(Arc::clone(h));
            }
        }
        let path = safe_join(&self.dir, file)
            .ok_or_else(|| Error::UnsafePath { key: key.to_owned(), file: file.to_owned() })?;
        let f = self.pinned.open_file(file).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::MissingFile { key: key.to_owned(), file: file.to_owned() }
            } else {
                Error::io(&path, e)
            }
        })?;
        if !self.mmap {
            // Not cached: a checkpoint with one file per item can have more files than descriptors.
            return Ok(Arc::new(Handle::Open(f)));
        }
        // A failed map (e.g. the process's map count limit) falls back to reading.
        let handle = Arc::new(match Buffer::map(&f, &path) {
            Ok(map) => Handle::Mapped(map),
            Err(_) => Handle::Open(f),
        });
        if let Ok(mut open) = self.open.lock() {
            open.insert(file.to_owned(), Arc::clone(&handle));
        }
        Ok(handle)
    }

    /// The stored (possibly transformed) bytes of an item: a window of the file map, or a fresh buffer.
    pub(crate) fn raw(&self, key: &str, info: &StorageInfo) -> Result<Buffer> {
        let handle = self.handle(key, &info.relative_path)?;
        self.fill(key, info, 0..info.length)?;
        let out_of_file = |file_len: u64| Error::ItemOutOfFile {
            key: key.to_owned(),
            file: info.relative_path.clone(),
            offset: info.offset,
            length: info.length,
            file_len,
        };
        match &*handle {
            Handle::Mapped(map) => {
                let file_len = map.len() as u64;
                let (Ok(off), Ok(len)) = (usize::try_from(info.offset), usize::try_from(info.length)) else {
                    return Err(out_of_file(file_len));
                };
                map.slice_len(off, len).map_err(|_| out_of_file(file_len))
            }
            Handle::Open(f) => {
                let file_len = f.metadata().map_err(|e| Error::io(self.dir.join(&info.relative_path), e))?.len();
                if info.offset.checked_add(info.length).is_none_or(|end| end > file_len) {
                    return Err(out_of_file(file_len));
                }
                let len = usize::try_from(info.length).map_err(|_| out_of_file(file_len))?;
                let mut buf = ckpt_tensor::AlignedBytes::zeroed(len)?;
                read_exact_at(f, buf.as_mut_bytes(), info.offset)
                    .map_err(|e| Error::io(self.dir.join(&info.relative_path), e))?;
                Ok(Buffer::from_owner(buf))
            }
        }
    }

    /// The item bytes with every stream transform undone. `limit` bounds what a transform may inflate to.
    pub(crate) fn item(&self, key: &str, info: &StorageInfo, limit: u64) -> Result<Buffer> {
        let mut data = self.raw(key, info)?;
        for descriptor in &info.transform_descriptors {
            data = undo_transform(key, &info.relative_path, descriptor, &data, limit)?;
        }
        Ok(data)
    }
}

#[cfg(unix)]
pub(crate) fn read_exact_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
}

#[cfg(not(unix))]
pub(crate) fn read_exact_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut f = f.try_clone()?;
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(buf)
}

/// Undoes one transform (`name[@domain]/version`; only `stream.zstd` major version 1 exists).
fn undo_transform(key: &str, file: &str, descriptor: &str, data: &Buffer, limit: u64) -> Result<Buffer> {
    let (name, version) = descriptor.rsplit_once('/').unwrap_or((descriptor, ""));
    let name = name.split('@').next().unwrap_or(name);
    let major = version.split('.').next().unwrap_or("");
    if name != "stream.zstd" || major != "1" {
        return Err(Error::UnknownTransform { key: key.to_owned(), descriptor: descriptor.to_owned() });
    }
    debug_assert!(ZSTD_TRANSFORM.starts_with("stream.zstd"));
    let zerr = |source| Error::Zstd { key: key.to_owned(), file: file.to_owned(), source };
    let decoder = zstd::stream::read::Decoder::new(data.as_bytes()).map_err(zerr)?;
    let mut out = Vec::new();
    decoder.take(limit.saturating_add(1)).read_to_end(&mut out).map_err(zerr)?;
    if out.len() as u64 > limit {
        return Err(Error::DecompressedTooLarge { key: key.to_owned(), file: file.to_owned(), limit });
    }
    // Re-home the bytes in an aligned buffer so typed tensor access works.
    Ok(Buffer::copy_from(&out)?)
}

/// Parses an item as a `torch.save` archive.
pub(crate) fn parse(key: &str, file: &str, data: &Buffer, options: &ckpt_torch::ReadOptions) -> Result<Value> {
    TorchReader::from_buffer(data, options).map(TorchReader::into_value).map_err(|e| Error::BadItem {
        key: key.to_owned(),
        file: file.to_owned(),
        source: Box::new(e),
    })
}

/// The tensor an item holds.
pub(crate) fn tensor_of(key: &str, file: &str, v: Value) -> Result<Tensor> {
    match v {
        Value::Tensor(t) => Ok(t),
        other => match other.as_tensor() {
            Some(t) => Ok(t.clone()),
            None => Err(Error::ItemNotTensor {
                key: key.to_owned(),
                file: file.to_owned(),
                found: other.type_name().to_owned(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_only_inside() {
        let d = Path::new("/ckpt");
        assert_eq!(safe_join(d, "__0_0.distcp"), Some(PathBuf::from("/ckpt/__0_0.distcp")));
        assert_eq!(safe_join(d, "./sub/x"), Some(PathBuf::from("/ckpt/sub/x")));
        assert_eq!(safe_join(d, "../x"), None);
        assert_eq!(safe_join(d, "a/../../x"), None);
        assert_eq!(safe_join(d, "/etc/passwd"), None);
        assert_eq!(safe_join(d, ""), None);
        assert_eq!(safe_join(d, "."), None);
    }
}
