//! safetensors for ckpt: `.safetensors` files read zero copy and written durably through the `safetensors`
//! crate, ckpt's lossless `__metadata__` convention ([`metadata`]), and Hugging Face sharded checkpoints
//! ([`hf`]).
//!
//! This is the one safetensors codec of the workspace: the format crates and the facade read and write
//! headers through it.
//!
//! - [`SafetensorsReader`] / [`read`] / [`read_file`]: a file's tensors, each a window of the mapped file.
//! - [`to_bytes`] / [`write_file`] / [`write_file_checksummed`]: a file, committed by `ckpt-io`.
//! - [`metadata`]: the entries ckpt records beside the tensors (nested paths, non-tensor values), so a
//!   state dict survives the trip.
//! - [`hf`]: `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`, sharded as `transformers`'
//!   `save_pretrained` shards.
//! - [`header`]: the header to the byte, parsed with one error per rule and laid out in a given order (for
//!   readers that check limits before reading, and writers with their own order or padding, as RecIS).
//! - [`safetensors_dtype`] / [`torch_dtype`]: the `safetensors` crate's dtypes and ckpt's.
//!
//! Errors are the tensor model's [`Error`]; an invalid header keeps the `safetensors` crate's
//! `SafeTensorError` as the source of an [`Error::Format`] (find it with [`Error::format_error`]).

#![forbid(unsafe_code)]

mod dtype;
mod error;
pub mod header;
pub mod hf;
pub mod metadata;
mod write;

pub use ckpt_io::Durability;
pub use ckpt_io::SaveReport;
pub use dtype::{safetensors_dtype, torch_dtype};
pub use error::SafetensorsError;
pub use write::{
    CHECKSUMS_KEY, to_bytes, write_checksummed_to, write_file, write_file_checksummed, write_file_with, write_to,
};

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use ckpt_io::Algorithm;
use ckpt_io::storage::RangeFill;
use ckpt_tensor::Buffer;
use ckpt_tensor::FormatError;
use ckpt_tensor::Tensor;
use ckpt_tensor::Value;
use ckpt_tensor::{CheckpointRead, Entry};
use ckpt_tensor::{Error, Result};
use metadata::Records;

/// A safetensors file, read: tensors in file order and the `__metadata__` string map, and, behind
/// [`CheckpointRead`], the entries ckpt recorded ([`metadata`]): the tensors, then the `ckpt.values` values.
#[derive(Debug, Clone)]
pub struct SafetensorsReader {
    /// Tensors in the order of their data in the file; each is a zero-copy window of the file's buffer.
    pub tensors: Vec<(String, Tensor)>,
    /// The `__metadata__` map, if the file has one.
    pub metadata: Option<HashMap<String, String>>,
    records: Records,
}

impl SafetensorsReader {
    /// Maps and reads the file at `path` ([`read_file`]).
    ///
    /// # Errors
    /// As [`read`], plus [`Error::Io`] naming the path.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        read_file(path)
    }

    /// Maps and reads the file at `path` as `options` say ([`read_file_with`]).
    ///
    /// # Errors
    /// As [`read_file_with`].
    pub fn open_with(path: impl AsRef<Path>, options: &ReadOptions) -> Result<Self> {
        read_file_with(path.as_ref(), options)
    }

    /// What ckpt recorded in the file's `__metadata__` (paths of nested entries, values).
    pub fn records(&self) -> &Records {
        &self.records
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        match self.records.entry(&self.tensors, name) {
            Some(metadata::EntryRef::Tensor(t)) => Some(t),
            _ => self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t),
        }
    }

    /// Every entry as (name, path in the nested state dict, value), in the source's order when ckpt recorded
    /// it: plain tensors, and the values of `ckpt.values` with the tensors they hold ([`metadata`]).
    pub fn leaves(&self) -> Vec<(String, Vec<ckpt_tensor::PathItem>, Value)> {
        self.records.leaves(&self.tensors)
    }
}

/// Parses a safetensors file held in `buffer`. The whole header is validated by [`header::parse`] (the
/// `safetensors` crate's header size cap, one error per rule: offsets tiling the data region, sizes
/// matching shapes, known dtypes) before any tensor is handed out; tensors are windows of `buffer`, in the
/// order of their data.
///
/// # Errors
/// [`Error::Format`] holding the [`header::HeaderError`] for an invalid file (its fault: the file's, the
/// limit's for a header over [`header::MAX_LEN`], unsupported for a packed `F4`/`F6_*` tensor whose last
/// dimension is not a whole number of packed elements). A packed tensor's shape counts packed elements
/// (`F4 [4, 16]` reads as `float4_e2m1fn_x2 [4, 8]`, as `safetensors.torch` loads it).
pub fn read(buffer: &Buffer) -> Result<SafetensorsReader> {
    read_with(buffer, "", &ReadOptions::default())
}

/// How a safetensors file is read ([`read_with`], [`read_file_with`]).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReadOptions {
    /// The hook that makes a partial local copy's bytes present before they are read (a checkpoint on an
    /// object store fetched as it is read: only the length prefix and the header are present when the file
    /// is opened). With one, every tensor's bytes are made on demand ([`Buffer::deferred_ranged`]): each
    /// range of a tensor read is filled (the file's bytes `8 + header length + data offset + …`) before it
    /// is copied out of the mapped file, so nothing unfilled is ever handed out. Default `None`: a local
    /// file, whose tensors are windows of the map.
    pub fill: Option<Arc<dyn RangeFill>>,
}

impl ReadOptions {
    /// Sets [`ReadOptions::fill`].
    #[must_use]
    pub fn with_fill(mut self, fill: Option<Arc<dyn RangeFill>>) -> Self {
        self.fill = fill;
        self
    }
}

/// The bytes `offset..offset + len` of `buffer` (a partial local copy of the file `file`), made on demand
/// by filling each range asked for through `fill` first, then copying it out of `buffer`: nothing unfilled
/// is ever handed out, and a failed fill is an error of the read ([`SafetensorsError::Fetch`]), never
/// zeros. For readers of safetensors-laid-out files (a tensor's bytes, `8 + header length + data offset`).
///
/// # Errors
/// [`Error::SliceOutOfRange`] (or `SliceOverflow`) when the window is
/// not inside `buffer`; reading the window's bytes later fails with [`SafetensorsError::Fetch`] when its
/// fill fails.
pub fn filled_window(
    buffer: &Buffer,
    file: &str,
    fill: &Arc<dyn RangeFill>,
    offset: usize,
    len: usize,
) -> Result<Buffer> {
    // Checked here, so that every range asked for later lies inside the buffer.
    let window = buffer.slice_len(offset, len)?;
    let fill = Arc::clone(fill);
    let file = file.to_owned();
    Ok(Buffer::deferred_ranged(len, move |at, out: &mut [u8]| {
        let src = window.slice_len(at, out.len())?;
        let start = offset.saturating_add(at) as u64;
        let end = start.saturating_add(out.len() as u64);
        fill.fill(&file, start..end).map_err(|source| SafetensorsError::Fetch {
            file: file.clone(),
            start,
            end,
            source,
        })?;
        out.copy_from_slice(src.as_bytes());
        Ok(())
    }))
}

/// Makes the length prefix and the header of the safetensors file `file`, a partial local copy held in
/// `buffer`, present through `fill`: its first 8 bytes, then the header they give (not past `max_len`
/// bytes nor the end of `buffer`: a longer header is left for [`header::parse`] to refuse), for a reader
/// that does not rely on the copy holding its headers already (as an object-store fetch's copy does: the
/// mirror fetches nothing for bytes present).
///
/// # Errors
/// [`SafetensorsError::Fetch`] when a fill fails.
pub fn fill_header(buffer: &Buffer, file: &str, fill: &dyn RangeFill, max_len: u64) -> Result<()> {
    let size = buffer.len() as u64;
    let fetch = |start: u64, end: u64| {
        fill.fill(file, start..end).map_err(|source| SafetensorsError::Fetch {
            file: file.to_owned(),
            start,
            end,
            source,
        })
    };
    let prefix_end = size.min(8);
    fetch(0, prefix_end)?;
    let len = buffer.as_bytes().get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map_or(0, u64::from_le_bytes);
    let end = len.min(max_len).saturating_add(8).min(size);
    if end > prefix_end {
        fetch(prefix_end, end)?;
    }
    Ok(())
}

/// [`read`] as `options` say: with a fill hook ([`ReadOptions::fill`]), `buffer` is a partial local copy
/// of the file named `file` (as the hook knows it: its path relative to the checkpoint) whose header is
/// present, and each tensor's bytes are filled when they are read.
///
/// # Errors
/// As [`read`]; reading a tensor's bytes later fails with [`SafetensorsError::Fetch`] when its fill fails.
pub fn read_with(buffer: &Buffer, file: &str, options: &ReadOptions) -> Result<SafetensorsReader> {
    let header = header::parse(buffer.as_bytes(), header::MAX_LEN)
        .map_err(|e| Error::Format { fault: e.fault(), source: Box::new(e) })?;
    let data_start = header.data_start();
    let mut entries = header.entries;
    entries.sort_by(|a, b| (a.data_offsets, &a.name).cmp(&(b.data_offsets, &b.name)));
    let mut tensors = Vec::with_capacity(entries.len());
    for e in entries {
        let (begin, end) = e.data_offsets;
        // The header is validated: the entries tile the data region, inside the buffer.
        let window = match &options.fill {
            None => buffer.slice_len(data_start + begin, end - begin)?,
            Some(fill) => filled_window(buffer, file, fill, data_start + begin, end - begin)?,
        };
        let t = Tensor::from_buffer(e.dtype, &e.shape, window)?;
        tensors.push((e.name, t));
    }
    let metadata = header.metadata.map(|m| m.into_iter().collect::<HashMap<String, String>>());
    let records = Records::read(metadata.as_ref(), &tensors);
    Ok(SafetensorsReader { tensors, metadata, records })
}

/// Maps and parses a safetensors file.
///
/// # Errors
/// As [`read`], each error but [`Error::Io`] (which names the path already) as [`Error::Format`] holding an
/// [`InFile`] that names the file, with the same [`Fault`](ckpt_tensor::Fault).
pub fn read_file(path: &Path) -> Result<SafetensorsReader> {
    read_file_with(path, &ReadOptions::default())
}

/// [`read_file`] as `options` say ([`read_with`]); the fill hook, if any, is given the file's name (its
/// last path component: a single file's name, or a shard's name in its directory).
///
/// # Errors
/// As [`read_file`].
pub fn read_file_with(path: &Path, options: &ReadOptions) -> Result<SafetensorsReader> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    read_with(&Buffer::map_file(path)?, &name, options).map_err(|e| match e {
        e @ Error::Io { .. } => e,
        e => Error::Format { fault: e.fault(), source: Box::new(InFile { path: path.to_path_buf(), source: e }) },
    })
}

/// An error of the file `path`: its message names the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct InFile {
    /// The file.
    pub path: std::path::PathBuf,
    /// What is wrong with it.
    #[source]
    pub source: Error,
}

/// Checks the per-tensor checksums ckpt recorded in a file's header ([`write_file_checksummed`]) against
/// the tensors' bytes (reading every byte). `None` when the file has none (written by another library, or
/// without them); else the problems found, each naming its tensor (empty: every tensor matches).
///
/// # Errors
/// A tensor whose bytes cannot be read.
pub fn checksums(file: &SafetensorsReader) -> Result<Option<Vec<String>>> {
    let Some(digits) = file.metadata.as_ref().and_then(|m| m.get(CHECKSUMS_KEY)) else { return Ok(None) };
    let mut problems = Vec::new();
    if digits.len() != 8 * file.tensors.len() || !digits.is_ascii() {
        problems.push(format!(
            "{CHECKSUMS_KEY}: {} hex digits for {} tensors (8 per tensor)",
            digits.len(),
            file.tensors.len()
        ));
        return Ok(Some(problems));
    }
    for (i, (name, t)) in file.tensors.iter().enumerate() {
        let Some(expected) = digits.get(8 * i..8 * i + 8).and_then(|d| u32::from_str_radix(d, 16).ok()) else {
            problems.push(format!("{CHECKSUMS_KEY}: the checksum of tensor {name:?} is not 8 hex digits"));
            continue;
        };
        let actual = Algorithm::Crc32c.hash(&t.data()?);
        if actual != expected {
            problems.push(format!(
                "tensor {name:?}: bytes do not match their CRC32C (recorded {expected:08x}, found {actual:08x})"
            ));
        }
    }
    Ok(Some(problems))
}

impl CheckpointRead for SafetensorsReader {
    fn format_name(&self) -> &'static str {
        "safetensors"
    }

    fn entries(&self) -> Vec<Entry> {
        self.records.entry_list(&self.tensors)
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        self.records.tensor(&self.tensors, name)
    }

    fn value(&self, name: &str) -> Result<Value> {
        self.records.value(&self.tensors, name)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ckpt_tensor::DType;

    #[test]
    fn round_trip_with_metadata_and_views() {
        let base = Tensor::from_slice(&(0..12).map(|i| i as f32).collect::<Vec<_>>(), &[3, 4]).unwrap();
        let t = base.transpose(0, 1).unwrap();
        let n = base.narrow(0, 1, 1).unwrap();
        let h = Tensor::from_slice(&[half::bf16::from_f32(1.5)], &[1]).unwrap();
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let tensors = vec![("t".to_string(), t.clone()), ("n".into(), n.clone()), ("h".into(), h.clone())];
        let bytes = to_bytes(&tensors, Some(meta.clone())).unwrap();
        let back = read(&Buffer::from_vec(bytes)).unwrap();
        assert_eq!(back.metadata, Some(meta));
        assert_eq!(back.get("t").unwrap(), &t);
        assert_eq!(back.get("n").unwrap(), &n);
        assert_eq!(back.get("h").unwrap(), &h);
        let c = Tensor::zeros(DType::C128, &[1]).unwrap();
        assert!(matches!(
            to_bytes(&[("c".into(), c)], None),
            Err(e) if matches!(e.format_error(), Some(SafetensorsError::UnstorableDtype { dtype: DType::C128 }))
        ));
    }

    #[test]
    fn file_is_byte_identical_to_the_crate_serializer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let big = Tensor::from_slice(&(0..3_000_000).map(|i| i as f32).collect::<Vec<_>>(), &[1000, 3000]).unwrap();
        let tensors = vec![
            ("b".to_string(), Tensor::from_slice(&[1u8, 2, 3], &[3]).unwrap()),
            ("a".to_string(), big.transpose(0, 1).unwrap()),
            ("h".to_string(), Tensor::from_slice(&[half::bf16::from_f32(1.5)], &[1]).unwrap()),
        ];
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        write_file(&tensors, Some(meta.clone()), &path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), to_bytes(&tensors, Some(meta)).unwrap());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["m.safetensors"]);
    }

    #[test]
    fn checksummed_file_detects_a_flipped_bit_of_each_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let big = Tensor::from_slice(&(0..3_000_000).map(|i| i as f32).collect::<Vec<_>>(), &[1000, 3000]).unwrap();
        let tensors = vec![
            ("b".to_string(), Tensor::from_slice(&[1u8, 2, 3], &[3]).unwrap()),
            ("a".to_string(), big.transpose(0, 1).unwrap()),
            ("h".to_string(), Tensor::from_slice(&[half::bf16::from_f32(1.5)], &[1]).unwrap()),
        ];
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        write_file_checksummed(&tensors, Some(meta), &path).unwrap();
        let back = read_file(&path).unwrap();
        assert_eq!(checksums(&back).unwrap().unwrap(), Vec::<String>::new());
        assert_eq!(back.metadata.as_ref().unwrap()["format"], "pt");
        for (name, t) in &tensors {
            assert_eq!(back.get(name).unwrap(), &t.to_contiguous().unwrap(), "{name}");
        }
        // The same tensors and header keys as the plain writer's, one more metadata string.
        let plain = read(&Buffer::from_vec(to_bytes(&tensors, None).unwrap())).unwrap();
        assert!(checksums(&plain).unwrap().is_none());
        let bytes = std::fs::read(&path).unwrap();
        let header_end = 8 + usize::try_from(u64::from_le_bytes(bytes[..8].try_into().unwrap())).unwrap();
        for (name, _) in &tensors {
            let mut bad = bytes.clone();
            let t = back.get(name).unwrap();
            let start =
                header_end + back.tensors.iter().take_while(|(n, _)| n != name).map(|(_, t)| t.nbytes()).sum::<usize>();
            bad[start + t.nbytes() / 2] ^= 0x10;
            let problems = checksums(&read(&Buffer::from_vec(bad)).unwrap()).unwrap().unwrap();
            assert_eq!(problems.len(), 1, "{name}: {problems:?}");
            assert!(problems[0].contains(&format!("tensor {name:?}")), "{problems:?}");
        }
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["m.safetensors"]);
    }

    /// A fill hook over a copy of `from` whose data region is zeroed: copies each range asked for in.
    #[derive(Debug)]
    struct CopyIn {
        from: std::path::PathBuf,
        to: std::path::PathBuf,
        asked: std::sync::Mutex<Vec<(String, std::ops::Range<u64>)>>,
    }

    impl RangeFill for CopyIn {
        fn fill(&self, file: &str, range: std::ops::Range<u64>) -> std::io::Result<()> {
            use std::os::unix::fs::FileExt;
            self.asked.lock().unwrap().push((file.to_owned(), range.clone()));
            let bytes = std::fs::read(&self.from)?;
            let part = bytes.get(range.start as usize..range.end as usize).ok_or(std::io::ErrorKind::UnexpectedEof)?;
            std::fs::OpenOptions::new().write(true).open(&self.to)?.write_all_at(part, range.start)
        }
    }

    #[test]
    fn a_partial_copy_is_filled_tensor_by_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("full.safetensors");
        let to = dir.path().join("m.safetensors");
        let a = Tensor::from_slice(&(0..1000).map(|i| i as f32).collect::<Vec<_>>(), &[10, 100]).unwrap();
        let b = Tensor::from_slice(&[7u8, 8, 9], &[3]).unwrap();
        write_file(&[("a".to_string(), a.clone()), ("b".to_string(), b.clone())], None, &from).unwrap();
        let mut bytes = std::fs::read(&from).unwrap();
        let data_start = 8 + usize::try_from(u64::from_le_bytes(bytes[..8].try_into().unwrap())).unwrap();
        bytes[data_start..].fill(0);
        std::fs::write(&to, &bytes).unwrap();
        let hook = Arc::new(CopyIn { from: from.clone(), to: to.clone(), asked: Default::default() });
        let fill: Arc<dyn RangeFill> = hook.clone();
        let back = read_file_with(&to, &ReadOptions::default().with_fill(Some(fill))).unwrap();
        assert!(hook.asked.lock().unwrap().is_empty(), "opening reads the header alone");
        assert_eq!(back.get("b").unwrap(), &b);
        let asked = hook.asked.lock().unwrap().clone();
        // b (u8) comes after a (f32) in the data: its 3 bytes at the end.
        let end = bytes.len() as u64;
        assert_eq!(asked, vec![("m.safetensors".to_string(), end - 3..end)]);
        assert_eq!(back.get("a").unwrap(), &a);
        assert_eq!(std::fs::read(&to).unwrap(), std::fs::read(&from).unwrap());
        // A failed fill is an error of the read, never zeros.
        bytes[data_start..].fill(0);
        std::fs::write(&to, &bytes).unwrap();
        let fill: Arc<dyn RangeFill> =
            Arc::new(CopyIn { from: dir.path().join("gone"), to: to.clone(), asked: Default::default() });
        let back = read_file_with(&to, &ReadOptions::default().with_fill(Some(fill))).unwrap();
        let e = back.get("a").unwrap().to_vec::<f32>().unwrap_err();
        assert!(matches!(e.format_error(), Some(SafetensorsError::Fetch { .. })), "{e}");
    }

    #[test]
    fn float4_is_f4_with_the_last_dimension_counting_values() {
        let bytes: Vec<u8> = (0..32).collect();
        let t = Tensor::from_buffer(DType::F4E2M1FnX2, &[4, 8], Buffer::from_vec(bytes.clone())).unwrap();
        let file = to_bytes(&[("q".into(), t.clone())], None).unwrap();
        let h = header::parse(&file, header::MAX_LEN).unwrap();
        assert_eq!((h.entries[0].dtype_code.as_str(), h.entries[0].data_offsets), ("F4", (0, 32)));
        // The `safetensors` crate reads the header as values: [4, 16].
        let st = safetensors::SafeTensors::deserialize(&file).unwrap();
        assert_eq!(st.tensor("q").unwrap().shape(), [4, 16]);
        let back = read(&Buffer::from_vec(file)).unwrap();
        assert_eq!(back.get("q").unwrap(), &t);
        // A 0-dimensional FP4 tensor has no safetensors shape (safetensors refuses it too).
        let scalar = Tensor::from_buffer(DType::F4E2M1FnX2, &[], Buffer::from_vec(vec![7])).unwrap();
        let e = to_bytes(&[("s".into(), scalar)], None).unwrap_err();
        assert!(matches!(e.format_error(), Some(SafetensorsError::PackedScalar { .. })), "{e}");
    }

    #[test]
    fn rejects_bad_header() {
        let mut bytes = to_bytes(&[("a".into(), Tensor::zeros(DType::F32, &[2]).unwrap())], None).unwrap();
        bytes.truncate(bytes.len() - 1);
        assert!(matches!(
            read(&Buffer::from_vec(bytes)),
            Err(e) if matches!(e.format_error::<header::HeaderError>(), Some(header::HeaderError::BadOffsets { .. }))
        ));
        assert!(read(&Buffer::from_vec(vec![255; 8])).is_err());
    }
}
