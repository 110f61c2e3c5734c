//! Data files `model-XXXXXX-of-YYYYYY.safetensors` (`csrc/serialize/table_writer.cc`, `table_reader.cc`).
//!
//! A data file is a valid safetensors file laid out by RecIS's own rules:
//!
//! ```text
//! u64 LE N | N bytes: compact JSON + 1..8 spaces (never 0) | block data, concatenated in header order
//! ```
//!
//! The JSON is `{"<key>":{"dtype":…,"shape":[…],"data_offsets":[b,e]},…}` with no whitespace, keys in the
//! order the blocks were appended, and no `__metadata__` entry (RecIS cannot load a file that has one).
//! Offsets are cumulative byte counts, so blocks are not aligned.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ckpt_io::storage::RangeFill;
use ckpt_tensor::{Buffer, DType, Tensor};

use crate::dtype;
use crate::error::{Error, Result};
pub use crate::options::MAX_HEADER_LEN;
use crate::options::ReadOptions;

/// One block as a data-file header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderEntry {
    /// The on-disk key: a part name (`tbl.embedding/part_0_2`) or a dense key (`w^ `).
    pub key: String,
    /// The element type.
    pub dtype: DType,
    /// The dtype string as written (`F32`, `BOOL`, or RecIS's buggy `bool`).
    pub dtype_str: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// Byte range of the data, relative to the start of the data region (`8 + N`).
    pub data_offsets: (usize, usize),
}

/// A data file, mapped and validated: every header entry has a known dtype, a size that matches its shape,
/// and the entries tile the data region exactly (no gaps, no overlaps, nothing after the last one).
///
/// Tensors are zero-copy windows of the map. Blocks are not aligned in the file; use
/// [`Tensor::to_vec`] or [`Tensor::to_contiguous`] when typed slices are needed. A partial local copy
/// opened with a fill hook ([`ReadOptions::fill`]) has its header filled when it is opened and its blocks'
/// bytes filled as they are read.
#[derive(Debug, Clone)]
pub struct DataFile {
    path: PathBuf,
    buffer: Buffer,
    header_len: usize,
    entries: Vec<HeaderEntry>,
    by_key: HashMap<String, usize>,
    /// [`ReadOptions::fill`] and the file's name for it.
    fill: Option<(Arc<dyn RangeFill>, String)>,
}

impl DataFile {
    /// Maps and validates a data file.
    ///
    /// # Errors
    /// [`Error::Io`], or the variant for the first rule the file breaks ([`Error::FileTooShort`],
    /// [`Error::HeaderTooLarge`], [`Error::HeaderPastEnd`], [`Error::Json`], [`Error::BadHeader`],
    /// [`Error::UnknownDtype`], [`Error::BadOffsets`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::open_with(path, &ReadOptions::default())
    }

    /// [`DataFile::open`], accepting a header of at most `options.max_header_len` bytes; a partial local
    /// copy read through `options.fill` (the file named to it by its name in the checkpoint directory).
    ///
    /// # Errors
    /// As [`DataFile::open`]; [`Error::Core`] holding a `ckpt_safetensors::SafetensorsError::Fetch` when
    /// the header's fill fails.
    pub fn open_with(path: impl AsRef<Path>, options: &ReadOptions) -> Result<Self> {
        let path = path.as_ref();
        let buffer = Buffer::map_file(path).map_err(from_core)?;
        let Some(fill) = &options.fill else { return Self::from_buffer_with(buffer, path, options) };
        let name = options.fill_name(&path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
        ckpt_safetensors::fill_header(&buffer, &name, fill.as_ref(), options.max_header_len).map_err(from_core)?;
        let mut file = Self::from_buffer_with(buffer, path, options)?;
        file.fill = Some((Arc::clone(fill), name));
        Ok(file)
    }

    /// Validates a data file held in `buffer`; `path` names it in errors.
    ///
    /// # Errors
    /// As [`DataFile::open`].
    pub fn from_buffer(buffer: Buffer, path: &Path) -> Result<Self> {
        Self::from_buffer_with(buffer, path, &ReadOptions::default())
    }

    /// [`DataFile::from_buffer`], accepting a header of at most `options.max_header_len` bytes.
    ///
    /// # Errors
    /// As [`DataFile::open`].
    pub fn from_buffer_with(buffer: Buffer, path: &Path, options: &ReadOptions) -> Result<Self> {
        use ckpt_safetensors::header::{self, HeaderError};
        let parsed = header::parse(buffer.as_bytes(), options.max_header_len).map_err(|e| {
            let path = path.to_path_buf();
            match e {
                HeaderError::FileTooShort { len } => Error::FileTooShort { path, len },
                HeaderError::TooLarge { header_len, limit } => Error::HeaderTooLarge { path, header_len, limit },
                HeaderError::PastEnd { header_len, file_len } => Error::HeaderPastEnd { path, header_len, file_len },
                HeaderError::Json(e) => Error::Json { path, source: e.into() },
                HeaderError::UnknownDtype { name, dtype } => Error::UnknownDtype { path, key: name, dtype },
                HeaderError::BadOffsets { name, reason } => Error::BadOffsets { path, key: name, reason },
                HeaderError::BadEntry { name, reason } => {
                    Error::BadHeader { path, reason: format!("block {name:?}: {reason}") }
                }
                // NotAnObject, BadMetadata, and rules added later: the header is not RecIS's map of blocks.
                other => Error::BadHeader { path, reason: other.to_string() },
            }
        })?;
        // A `__metadata__` map is not a block: RecIS never writes one (and cannot load a file that has
        // one); other safetensors writers do, and the header parser keeps it apart.
        let entries: Vec<HeaderEntry> = parsed
            .entries
            .into_iter()
            .map(|e| HeaderEntry {
                key: e.name,
                dtype: e.dtype,
                dtype_str: e.dtype_code,
                shape: e.shape,
                data_offsets: e.data_offsets,
            })
            .collect();
        let by_key = entries.iter().enumerate().map(|(i, e)| (e.key.clone(), i)).collect();
        Ok(DataFile { path: path.into(), buffer, header_len: parsed.len, entries, by_key, fill: None })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The header length N (JSON plus padding).
    pub fn header_len(&self) -> usize {
        self.header_len
    }

    /// The N header bytes as stored, padding included.
    pub fn header_bytes(&self) -> &[u8] {
        self.buffer.as_bytes().get(8..8 + self.header_len).unwrap_or_default()
    }

    /// The blocks, in header order.
    pub fn entries(&self) -> &[HeaderEntry] {
        &self.entries
    }

    /// The block with on-disk key `key`.
    pub fn entry(&self, key: &str) -> Option<&HeaderEntry> {
        self.by_key.get(key).and_then(|&i| self.entries.get(i))
    }

    /// The block with on-disk key `key`, as a zero-copy tensor.
    ///
    /// # Errors
    /// [`Error::NotFound`] if the header has no such block.
    pub fn tensor(&self, key: &str) -> Result<Tensor> {
        let entry = self.entry(key).ok_or_else(|| Error::NotFound { what: "block", name: key.into() })?;
        self.tensor_of(entry)
    }

    /// The tensor of one of this file's entries: a window of the map, or of a partial copy, made on demand
    /// by filling what is read first.
    pub(crate) fn tensor_of(&self, entry: &HeaderEntry) -> Result<Tensor> {
        let (b, e) = entry.data_offsets;
        // The header is validated: the blocks tile the data region, inside the buffer.
        let (start, len) = (8 + self.header_len + b, e - b);
        let window = match &self.fill {
            None => self.buffer.slice_len(start, len)?,
            Some((fill, name)) => ckpt_safetensors::filled_window(&self.buffer, name, fill, start, len)?,
        };
        Ok(Tensor::from_buffer(entry.dtype, &entry.shape, window)?)
    }
}

/// The header JSON RecIS writes for `blocks` (key, header dtype string, shape, byte length), in order:
/// compact, insertion-ordered, offsets cumulative from 0.
pub fn header_json(blocks: &[(&str, &str, &[usize], usize)]) -> String {
    let prefix = header_prefix_of(blocks);
    // The JSON is the prefix less the length and the padding (which follows a closing brace).
    String::from_utf8_lossy(prefix.get(8..).unwrap_or_default()).trim_end_matches(' ').to_owned()
}

/// The first `8 + N` bytes of a data file for a header JSON: the length as u64 LE, the JSON, and RecIS's
/// padding of `8 - len % 8` spaces (1 to 8, never 0).
pub fn header_prefix(json: &str) -> Vec<u8> {
    let pad = 8 - json.len() % 8;
    let n = (json.len() + pad) as u64;
    let mut out = Vec::with_capacity(8 + json.len() + pad);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out
}

/// [`header_prefix`] of [`header_json`]: the safetensors header layout (`ckpt_safetensors::header::write`)
/// in the blocks' order, with RecIS's padding of at least one space.
fn header_prefix_of(blocks: &[(&str, &str, &[usize], usize)]) -> Vec<u8> {
    let entries: Vec<ckpt_safetensors::header::Entry<'_>> = blocks
        .iter()
        .map(|&(name, dtype, shape, nbytes)| ckpt_safetensors::header::Entry { name, dtype, shape, nbytes })
        .collect();
    ckpt_safetensors::header::write(&entries, &[], 1)
}

/// Writes a data file holding `blocks` (on-disk key, tensor) in order, byte for byte as RecIS's
/// `TableWriter` would, atomically (temporary file, fsync, rename). Tensor bytes are streamed from memory;
/// non-contiguous tensors are written in row-major order (RecIS would write their storage order, a bug).
/// Returns the file's length.
///
/// # Errors
/// [`Error::UnsupportedDtype`] for dtypes RecIS cannot store; [`Error::Io`] naming the path.
pub fn write(path: &Path, blocks: &[(String, Tensor)]) -> Result<u64> {
    let mut written = 0;
    ckpt_io::write_file(path, &ckpt_io::FileOptions::default(), |w| {
        written = write_to(w, path, blocks)?;
        Ok(())
    })
    .map_err(|e| match e {
        Error::Core(c) => from_core(c),
        e => e,
    })?;
    Ok(written)
}

/// Writes the data file holding `blocks` into `out` (of the file `path`, which errors name), marking the
/// header and each block for the checksum manifest. Returns the file's length.
pub(crate) fn write_to(out: &mut ckpt_io::DurableWriter, path: &Path, blocks: &[(String, Tensor)]) -> Result<u64> {
    let mut meta = Vec::with_capacity(blocks.len());
    for (key, t) in blocks {
        meta.push((key.as_str(), dtype::to_header(t.dtype(), key)?, t.shape(), t.nbytes()));
    }
    let prefix = header_prefix_of(&meta);
    let io = |e: std::io::Error| Error::io(path, e);
    out.mark(HEADER_MARK);
    out.write_all(&prefix).map_err(io)?;
    let mut written = prefix.len() as u64;
    for (key, t) in blocks {
        out.mark(key.as_str());
        // Gathered rows are made a piece at a time as they are written (`Tensor::data_pieces`).
        t.data_pieces(STREAM_PIECE, |data| {
            out.write_all(data).map_err(io)?;
            written += data.len() as u64;
            Ok::<(), Error>(())
        })?;
    }
    Ok(written)
}

/// Bytes of a gathered block made and written at a time: fits the L2 cache, so the writer's copy reads
/// what the gather just wrote.
const STREAM_PIECE: usize = 1 << 20;

/// The checksum manifest's name for a data file's header (its blocks are named by their keys).
pub(crate) const HEADER_MARK: &str = "(header)";

/// A core error as this crate's: I/O errors keep their path.
pub(crate) fn from_core(e: ckpt_tensor::Error) -> Error {
    match e {
        ckpt_tensor::Error::Io { path, source } => Error::Io { path, source },
        e => Error::Core(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use ckpt_tensor::FormatError;

    fn file(bytes: Vec<u8>) -> Result<DataFile> {
        DataFile::from_buffer(Buffer::from_vec(bytes), Path::new("x.safetensors"))
    }

    #[test]
    fn padding_is_one_to_eight() {
        for len in 0..32 {
            let json = "x".repeat(len);
            let p = header_prefix(&json);
            let n = u64::from_le_bytes(p[..8].try_into().unwrap()) as usize;
            assert_eq!(n % 8, 0);
            assert!((1..=8).contains(&(n - len)), "{len}");
            assert_eq!(p.len(), 8 + n);
        }
    }

    #[test]
    fn round_trip_and_zero_copy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model-000000-of-000001.safetensors");
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3]).unwrap();
        let b = Tensor::from_slice(&[7i64, -1], &[2]).unwrap();
        let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap().transpose(0, 1).unwrap();
        let blocks = vec![("a/part_0_1".to_string(), a.clone()), ("b^ ".into(), b.clone()), ("t^ ".into(), t.clone())];
        let len = write(&p, &blocks).unwrap();
        assert_eq!(len, std::fs::metadata(&p).unwrap().len());
        let f = DataFile::open(&p).unwrap();
        assert_eq!(f.entries().iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["a/part_0_1", "b^ ", "t^ "]);
        assert_eq!(f.tensor("a/part_0_1").unwrap(), a);
        assert_eq!(f.tensor("b^ ").unwrap().to_vec::<i64>().unwrap(), vec![7, -1]);
        assert_eq!(f.tensor("t^ ").unwrap().to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
        assert!(f.tensor("a/part_0_1").unwrap().storage().is_mapped());
        assert_eq!(f.entry("b^ ").unwrap().data_offsets, (12, 28));
        assert!(matches!(f.tensor("nope"), Err(Error::NotFound { .. })));
        let c = Tensor::zeros(DType::U32, &[1]).unwrap();
        assert!(matches!(write(&p, &[("c".into(), c)]), Err(Error::UnsupportedDtype { .. })));
        // The failed write left the previous file intact and no temporary behind.
        assert!(DataFile::open(&p).is_ok());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn header_limit_is_the_callers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model-000000-of-000001.safetensors");
        write(&p, &[("a/part_0_1".to_string(), Tensor::from_slice(&[1.0f32], &[1]).unwrap())]).unwrap();
        let header_len = u64::from_le_bytes(std::fs::read(&p).unwrap()[..8].try_into().unwrap());
        let limit = |n: u64| ReadOptions::default().with_max_header_len(n);
        let e = DataFile::open_with(&p, &limit(header_len - 1)).unwrap_err();
        assert!(matches!(e, Error::HeaderTooLarge { limit, .. } if limit == header_len - 1), "{e}");
        assert_eq!(e.fault(), ckpt_tensor::Fault::Limit);
        assert!(DataFile::open_with(&p, &limit(header_len)).is_ok());
        let sparse_dir = tempfile::tempdir().unwrap();
        let sd = ckpt_tensor::Value::dict([
            ("t@id", ckpt_tensor::Value::Tensor(Tensor::from_slice(&[1i64, 2], &[2]).unwrap())),
            ("t@embedding", ckpt_tensor::Value::Tensor(Tensor::from_slice(&[0.5f32; 4], &[2, 2]).unwrap())),
        ]);
        crate::save(&sd, sparse_dir.path(), &crate::WriteOptions::default()).unwrap();
        let e = crate::SparseCheckpoint::open_with(sparse_dir.path(), &limit(16)).unwrap_err();
        assert!(matches!(e, Error::HeaderTooLarge { limit: 16, .. }), "{e}");
        assert!(crate::SparseCheckpoint::open_with(sparse_dir.path(), &limit(MAX_HEADER_LEN)).is_ok());
    }

    #[test]
    fn rejects_bad_files() {
        assert!(matches!(file(vec![1, 2, 3]), Err(Error::FileTooShort { len: 3, .. })));
        let mut past = 64u64.to_le_bytes().to_vec();
        past.extend_from_slice(b"{}      ");
        assert!(matches!(file(past), Err(Error::HeaderPastEnd { header_len: 64, file_len: 16, .. })));
        assert!(matches!(file(u64::MAX.to_le_bytes().to_vec()), Err(Error::HeaderTooLarge { .. })));
        let with = |json: &str, data: usize| {
            let mut v = header_prefix(json);
            v.extend(std::iter::repeat_n(0u8, data));
            file(v)
        };
        assert!(with("{}", 0).unwrap().entries().is_empty());
        assert!(matches!(with("{", 0), Err(Error::Json { .. })));
        assert!(matches!(with("[]", 0), Err(Error::BadHeader { .. })));
        assert!(matches!(with(r#"{"a":{"shape":[1],"data_offsets":[0,4]}}"#, 4), Err(Error::BadHeader { .. })));
        assert!(matches!(
            with(r#"{"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}"#, 4),
            Err(Error::UnknownDtype { .. })
        ));
        assert!(matches!(
            with(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, 4),
            Err(Error::BadOffsets { .. })
        ));
        assert!(matches!(
            with(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#, 8),
            Err(Error::BadOffsets { .. })
        ));
        assert!(matches!(
            with(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}"#,
                6
            ),
            Err(Error::BadOffsets { .. })
        ));
        assert!(matches!(
            with(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#, 8),
            Err(Error::BadOffsets { .. })
        ));
        assert!(matches!(
            with(r#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}}"#, 4),
            Err(Error::BadOffsets { .. })
        ));
        // Trailing bytes other than spaces after the JSON.
        let mut v = 8u64.to_le_bytes().to_vec();
        v.extend_from_slice(b"{}    xx");
        assert!(matches!(file(v), Err(Error::Json { .. })));
        // __metadata__ is skipped, the lower-case bool accepted.
        let ok = with(r#"{"__metadata__":{"format":"pt"},"f^ ":{"dtype":"bool","shape":[2],"data_offsets":[0,2]}}"#, 2)
            .unwrap();
        assert_eq!(ok.entries().len(), 1);
        assert_eq!(ok.entries()[0].dtype, DType::Bool);
        assert_eq!(ok.entries()[0].dtype_str, "bool");
    }
}
