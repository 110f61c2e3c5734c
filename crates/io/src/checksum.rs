//! The checksum manifest `ckpt.checksums.json`: a CRC32C per named byte range ("chunk") of every file of
//! a checkpoint directory, for formats that carry no checksums of their own (distcp, hfai, recis, pbg).
//!
//! The algorithm runs on every byte of every save and must cost under 5% of it. It is CRC32C (Castagnoli)
//! through the `crc-fast` crate, which folds the data with carry-less multiplication (PCLMULQDQ, or
//! VPCLMULQDQ on AVX-512 CPUs, on x86-64; PMULL on ARMv8), picked at run time, and falls back to a
//! table-driven CRC on any other CPU: the same value everywhere, so a manifest written on one machine
//! checks on every other. The hash runs where the bytes are hot: the durable writer copies the caller's
//! data into its write buffer in 128 KiB pieces and hashes each piece right after copying it (still in
//! L1/L2), and its buffered path hashes each 1 MiB piece right before `write(2)` reads it; a separate pass
//! over cold memory (what an earlier version did) cost 3× more. Hashing a copied piece costs 3–12 ms per
//! 512 MiB with `crc-fast` against 22–33 ms with the `crc32c` crate (its `crc32` instruction), measured
//! in `benches/README.md` ("Checksum cost on save"). CRC32C detects every error burst up to 32 bits,
//! which covers a flipped bit or a torn sector boundary.
//!
//! Manifests written before CRC32C (algorithm `"crc32"`: CRC-32/IEEE through `crc32fast`) are still read
//! and checked; [`Algorithm`] says which one a file's chunks use.
//!
//! Chunks are computed while writing: a [`DurableWriter`](crate::DurableWriter) with checksums on hashes
//! every byte it is given, and the format writer [marks](crate::DurableWriter::mark) item boundaries (a
//! tensor chunk, a record), so each file is covered completely by consecutive chunks. In a multi-rank save
//! each rank sends the digests of its files to the coordinator, which writes the merged manifest into the
//! staging directory before the swap ([`DirCommit::commit`](crate::DirCommit::commit)).
//!
//! The file (JSON, written by ckpt, ignored by torch and the other originals):
//!
//! ```json
//! {"format": "ckpt.checksums", "version": 1, "algorithm": "crc32c",
//!  "files": {"__0_0.distcp": {"size": 1536, "chunks": [["w", 0, 1024, "8d3ad5f4"], ["b", 1024, 512, "..."]]}}}
//! ```
//!
//! Each chunk is `[name, offset, length, checksum as 8 hex digits]`. A file entry may carry its own
//! `"algorithm"` (a manifest updated in place keeps the older files' digests). [`Manifest::verify_dir`]
//! reads every byte of every listed file and reports what differs; readers that read one item can check
//! just its range with [`Manifest::chunk_at`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value as Json, json};

use ckpt_tensor::FormatError;
use ckpt_tensor::{Error, Fault, Result};

/// The manifest's file name.
pub const MANIFEST_NAME: &str = "ckpt.checksums.json";
/// The algorithm ckpt writes manifests with.
pub const ALGORITHM: Algorithm = Algorithm::Crc32c;

/// A checksum algorithm of the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// CRC32C (Castagnoli, CRC-32/ISCSI), the `crc-fast` crate: what ckpt writes.
    #[default]
    Crc32c,
    /// CRC-32 (IEEE, the ZIP polynomial), `crc32fast`: manifests written by earlier versions of ckpt.
    Crc32,
}

impl Algorithm {
    /// The name recorded in the manifest (`"crc32c"`, `"crc32"`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32c => "crc32c",
            Algorithm::Crc32 => "crc32",
        }
    }

    /// The algorithm of a manifest name.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        match name {
            "crc32c" => Some(Algorithm::Crc32c),
            "crc32" => Some(Algorithm::Crc32),
            _ => None,
        }
    }

    /// The checksum of `bytes`.
    pub fn hash(self, bytes: &[u8]) -> u32 {
        self.append(0, bytes)
    }

    /// The checksum of the bytes hashed to `crc` followed by `bytes`.
    pub fn append(self, crc: u32, bytes: &[u8]) -> u32 {
        match self {
            Algorithm::Crc32c => {
                // The running register of a reflected CRC with an all-ones final XOR is the checksum
                // so far, inverted.
                let mut d = crc_fast::Digest::new_with_init_state(
                    crc_fast::CrcAlgorithm::Crc32Iscsi,
                    u64::from(crc ^ u32::MAX),
                );
                d.update(bytes);
                // A 32-bit CRC's value fits 32 bits.
                u32::try_from(d.finalize()).unwrap_or_default()
            }
            Algorithm::Crc32 => {
                let mut h = crc32fast::Hasher::new_with_initial(crc);
                h.update(bytes);
                h.finalize()
            }
        }
    }
}

/// The checksum of one named byte range of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkDigest {
    /// What the range holds (a tensor chunk's key, an item name); `""` for bytes before the first mark.
    pub name: String,
    /// Offset in the file.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
    /// The range's checksum, by its file's [`Algorithm`] ([`FileDigest::algorithm`]).
    pub checksum: u32,
}

impl ChunkDigest {
    /// Whether `bytes` (the range's contents) match, hashed with `algorithm` (the file's).
    pub fn matches(&self, algorithm: Algorithm, bytes: &[u8]) -> bool {
        bytes.len() as u64 == self.length && algorithm.hash(bytes) == self.checksum
    }
}

/// The checksums of one file: its size and consecutive chunks covering it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    /// The file's name relative to the checkpoint directory (set by the directory commit).
    pub file: String,
    /// The file's size.
    pub size: u64,
    /// The algorithm of its chunks' checksums.
    pub algorithm: Algorithm,
    /// Consecutive chunks from offset 0 to `size`.
    pub chunks: Vec<ChunkDigest>,
}

impl FileDigest {
    /// The digest of the file at `path` as it is on disk, in chunks of [`CHUNK`](crate::chunk::CHUNK) bytes named
    /// by their number: for files another library wrote (HDF5), which ckpt could not hash while writing.
    ///
    /// # Errors
    /// The I/O error of reading it.
    pub fn of_file(path: &Path) -> std::io::Result<FileDigest> {
        use std::io::Read;
        let mut f = std::fs::File::open(path)?;
        let mut h = ChunkHasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let (mut pos, mut next_mark) = (0u64, 0u64);
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            let mut rest = buf.get(..n).unwrap_or_default();
            while !rest.is_empty() {
                if pos == next_mark {
                    h.mark(format!("{}", pos / crate::chunk::CHUNK as u64), pos);
                    next_mark += crate::chunk::CHUNK as u64;
                }
                let take = rest.len().min(usize::try_from(next_mark - pos).unwrap_or(usize::MAX));
                let (now, later) = rest.split_at(take);
                h.update(now);
                pos += now.len() as u64;
                rest = later;
            }
        }
        Ok(h.finish(pos))
    }
}

/// Hashes a stream into named consecutive chunks.
#[derive(Default)]
pub(crate) struct ChunkHasher {
    crc: u32,
    name: String,
    start: u64,
    touched: bool,
    chunks: Vec<ChunkDigest>,
}

impl ChunkHasher {
    pub(crate) fn new() -> Self {
        ChunkHasher::default()
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        self.crc = ALGORITHM.append(self.crc, data);
        self.touched |= !data.is_empty();
    }

    fn close(&mut self, end: u64) {
        if end > self.start || (self.touched && end == self.start) || !self.name.is_empty() {
            let name = std::mem::take(&mut self.name);
            self.chunks.push(ChunkDigest { name, offset: self.start, length: end - self.start, checksum: self.crc });
        }
        self.crc = 0;
        self.touched = false;
        self.start = end;
    }

    pub(crate) fn mark(&mut self, name: String, pos: u64) {
        self.close(pos);
        self.name = name;
    }

    pub(crate) fn finish(mut self, size: u64) -> FileDigest {
        self.close(size);
        FileDigest { file: String::new(), size, algorithm: ALGORITHM, chunks: self.chunks }
    }
}

/// A checkpoint directory's checksum manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Per file, by name.
    pub files: BTreeMap<String, FileDigest>,
}

/// One thing [`Manifest::verify_dir`] found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// A listed file is missing or unreadable.
    Missing {
        /// The file.
        file: String,
        /// The error.
        error: String,
    },
    /// A listed file has another size (truncated or appended to).
    Size {
        /// The file.
        file: String,
        /// The size recorded.
        expected: u64,
        /// The size found.
        found: u64,
    },
    /// A chunk's bytes differ (a flipped bit, an overwritten range).
    Chunk {
        /// The file.
        file: String,
        /// The chunk's name.
        name: String,
        /// Its offset.
        offset: u64,
        /// Its length.
        length: u64,
    },
}

impl Mismatch {
    /// The file the mismatch is in, by its name in the manifest (relative to the manifest's directory).
    pub fn file(&self) -> &str {
        match self {
            Mismatch::Missing { file, .. } | Mismatch::Size { file, .. } | Mismatch::Chunk { file, .. } => file,
        }
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Missing { file, error } => write!(f, "{file}: missing ({error})"),
            Mismatch::Size { file, expected, found } => {
                write!(f, "{file}: {found} bytes, the manifest says {expected}")
            }
            Mismatch::Chunk { file, name, offset, length } => {
                write!(f, "{file}: bytes {offset}..{} ({name:?}) do not match their checksum", offset + length)
            }
        }
    }
}

/// The rules of a checksum manifest ([`MANIFEST_NAME`]), one variant each.
///
/// They convert into the core error as [`Error::Format`] with their [`ManifestError::fault`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The manifest is not JSON.
    #[error("malformed data: {MANIFEST_NAME}: {source}")]
    NotJson {
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// JSON whose `format` is not `ckpt.checksums`.
    #[error("malformed data: {MANIFEST_NAME}: not a ckpt checksum manifest")]
    NotAManifest,
    /// A manifest version other than 1.
    #[error("unsupported: {MANIFEST_NAME} version {version:?}")]
    UnsupportedVersion {
        /// The `version` field, if any.
        version: Option<Json>,
    },
    /// A checksum algorithm this library does not compute.
    #[error("unsupported: {MANIFEST_NAME} algorithm {algorithm:?}")]
    UnsupportedAlgorithm {
        /// The `algorithm` field, if any.
        algorithm: Option<Json>,
    },
    /// No `files` object.
    #[error("malformed data: {MANIFEST_NAME}: no \"files\" object")]
    NoFiles,
    /// A file entry without a size.
    #[error("malformed data: {MANIFEST_NAME}: {file}: no size")]
    NoSize {
        /// The file.
        file: String,
    },
    /// A file entry without a chunk list.
    #[error("malformed data: {MANIFEST_NAME}: {file}: no chunks")]
    NoChunks {
        /// The file.
        file: String,
    },
    /// A chunk that is not `[name, offset, length, hash]`.
    #[error("malformed data: {MANIFEST_NAME}: {file}: a chunk is not [name, offset, length, hash]")]
    BadChunk {
        /// The file.
        file: String,
    },
    /// A chunk checksum that is not 8 hex digits.
    #[error("malformed data: {MANIFEST_NAME}: {file}: a checksum is not 8 hex digits")]
    BadChecksum {
        /// The file.
        file: String,
    },
    /// A chunk whose end overflows.
    #[error("malformed data: {MANIFEST_NAME}: {file}: a chunk overflows")]
    ChunkOverflow {
        /// The file.
        file: String,
    },
    /// Chunks with gaps, overlaps, or past the file's size.
    #[error("malformed data: {MANIFEST_NAME}: {file}: chunks are not consecutive within the file")]
    ChunksNotConsecutive {
        /// The file.
        file: String,
    },
    /// Chunks that end before the file does.
    #[error("malformed data: {MANIFEST_NAME}: {file}: chunks do not cover the file")]
    ChunksIncomplete {
        /// The file.
        file: String,
    },
    /// A file name that leaves the checkpoint directory (`..`, an absolute path, empty).
    #[error("malformed data: {MANIFEST_NAME}: file name {name:?} leaves the checkpoint directory")]
    UnsafeName {
        /// The file name.
        name: String,
    },
}

impl FormatError for ManifestError {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            ManifestError::UnsupportedVersion { .. } | ManifestError::UnsupportedAlgorithm { .. } => Fault::Unsupported,
            ManifestError::NotJson { .. }
            | ManifestError::NotAManifest
            | ManifestError::NoFiles
            | ManifestError::NoSize { .. }
            | ManifestError::NoChunks { .. }
            | ManifestError::BadChunk { .. }
            | ManifestError::BadChecksum { .. }
            | ManifestError::ChunkOverflow { .. }
            | ManifestError::ChunksNotConsecutive { .. }
            | ManifestError::ChunksIncomplete { .. }
            | ManifestError::UnsafeName { .. } => Fault::Malformed,
        }
    }
}

impl Manifest {
    /// Adds a file's digest (replacing an earlier one of the same name).
    pub fn insert(&mut self, digest: FileDigest) {
        self.files.insert(digest.file.clone(), digest);
    }

    /// The chunk of `file` that starts at `offset`, if listed.
    pub fn chunk_at(&self, file: &str, offset: u64) -> Option<&ChunkDigest> {
        let chunks = &self.files.get(file)?.chunks;
        let i = chunks.binary_search_by_key(&offset, |c| c.offset).ok()?;
        chunks.get(i)
    }

    /// The manifest as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        let files: serde_json::Map<String, Json> = self
            .files
            .iter()
            .map(|(name, d)| {
                let chunks: Vec<Json> = d
                    .chunks
                    .iter()
                    .map(|c| json!([c.name, c.offset, c.length, format!("{:08x}", c.checksum)]))
                    .collect();
                let mut entry = json!({"size": d.size, "chunks": chunks});
                if d.algorithm != ALGORITHM {
                    entry["algorithm"] = json!(d.algorithm.name());
                }
                (name.clone(), entry)
            })
            .collect();
        let doc = json!({"format": "ckpt.checksums", "version": 1, "algorithm": ALGORITHM.name(), "files": files});
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// Parses a manifest, checking its structure (every chunk in bounds, consecutive, covering the file).
    ///
    /// # Errors
    /// [`ManifestError`]: [`Fault::Malformed`] for a broken structure, [`Fault::Unsupported`] for another
    /// algorithm or version.
    pub fn from_json(bytes: &[u8]) -> Result<Manifest> {
        let doc: Json = serde_json::from_slice(bytes).map_err(|source| ManifestError::NotJson { source })?;
        if doc.get("format").and_then(Json::as_str) != Some("ckpt.checksums") {
            return Err(ManifestError::NotAManifest.into());
        }
        if doc.get("version").and_then(Json::as_u64) != Some(1) {
            return Err(ManifestError::UnsupportedVersion { version: doc.get("version").cloned() }.into());
        }
        let algorithm_of = |v: Option<&Json>| {
            v.and_then(Json::as_str)
                .and_then(Algorithm::from_name)
                .ok_or_else(|| ManifestError::UnsupportedAlgorithm { algorithm: v.cloned() })
        };
        let default_algorithm = algorithm_of(doc.get("algorithm"))?;
        let files = doc.get("files").and_then(Json::as_object).ok_or(ManifestError::NoFiles)?;
        let mut manifest = Manifest::default();
        for (name, entry) in files {
            let file = || name.clone();
            let size =
                entry.get("size").and_then(Json::as_u64).ok_or_else(|| ManifestError::NoSize { file: file() })?;
            let algorithm = match entry.get("algorithm") {
                None => default_algorithm,
                Some(a) => algorithm_of(Some(a))?,
            };
            let list =
                entry.get("chunks").and_then(Json::as_array).ok_or_else(|| ManifestError::NoChunks { file: file() })?;
            let mut chunks = Vec::with_capacity(list.len());
            let mut at = 0u64;
            for c in list {
                let (Some(n), Some(offset), Some(length), Some(hash)) = (
                    c.get(0).and_then(Json::as_str),
                    c.get(1).and_then(Json::as_u64),
                    c.get(2).and_then(Json::as_u64),
                    c.get(3).and_then(Json::as_str),
                ) else {
                    return Err(ManifestError::BadChunk { file: file() }.into());
                };
                let checksum =
                    u32::from_str_radix(hash, 16).map_err(|_| ManifestError::BadChecksum { file: file() })?;
                let end = offset.checked_add(length).ok_or_else(|| ManifestError::ChunkOverflow { file: file() })?;
                if offset != at || end > size {
                    return Err(ManifestError::ChunksNotConsecutive { file: file() }.into());
                }
                at = end;
                chunks.push(ChunkDigest { name: n.to_owned(), offset, length, checksum });
            }
            if at != size {
                return Err(ManifestError::ChunksIncomplete { file: file() }.into());
            }
            manifest.files.insert(name.clone(), FileDigest { file: name.clone(), size, algorithm, chunks });
        }
        Ok(manifest)
    }

    /// Reads `dir/ckpt.checksums.json`; `None` when there is none.
    ///
    /// # Errors
    /// [`Error::Io`]; as [`Manifest::from_json`].
    pub fn read(dir: &Path) -> Result<Option<Manifest>> {
        let path = dir.join(MANIFEST_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => Manifest::from_json(&bytes).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// Reads every byte of every listed file under `dir` and returns what does not match (empty: all
    /// good). File names must stay inside `dir`.
    ///
    /// # Errors
    /// [`ManifestError::UnsafeName`] for a file name that leaves the directory.
    pub fn verify_dir(&self, dir: &Path) -> Result<Vec<Mismatch>> {
        self.check_dir(dir, true)
    }

    /// The structural part of [`Manifest::verify_dir`]: every listed file is present with its recorded
    /// size; no byte is read.
    ///
    /// # Errors
    /// As [`Manifest::verify_dir`].
    pub fn verify_sizes(&self, dir: &Path) -> Result<Vec<Mismatch>> {
        self.check_dir(dir, false)
    }

    fn check_dir(&self, dir: &Path, read_bytes: bool) -> Result<Vec<Mismatch>> {
        let mut problems = Vec::new();
        for (name, digest) in &self.files {
            let path = safe_join(dir, name)?;
            let map = match std::fs::File::open(&path).and_then(|f| {
                let len = f.metadata()?.len();
                // SAFETY: read-only map of a file nobody should be writing; a concurrent truncation
                // is the caller's risk, as for every mapped read in ckpt.
                let map = if len == 0 || !read_bytes { None } else { Some(unsafe { memmap2::Mmap::map(&f)? }) };
                Ok((len, map))
            }) {
                Ok(m) => m,
                Err(e) => {
                    problems.push(Mismatch::Missing { file: name.clone(), error: e.to_string() });
                    continue;
                }
            };
            let (len, map) = map;
            if len != digest.size {
                problems.push(Mismatch::Size { file: name.clone(), expected: digest.size, found: len });
                continue;
            }
            if !read_bytes {
                continue;
            }
            let bytes: &[u8] = map.as_deref().unwrap_or_default();
            for c in &digest.chunks {
                let range = usize::try_from(c.offset).ok().zip(usize::try_from(c.offset + c.length).ok());
                let ok = range.and_then(|(a, b)| bytes.get(a..b)).is_some_and(|b| c.matches(digest.algorithm, b));
                if !ok {
                    problems.push(Mismatch::Chunk {
                        file: name.clone(),
                        name: c.name.clone(),
                        offset: c.offset,
                        length: c.length,
                    });
                }
            }
        }
        Ok(problems)
    }
}

/// `dir/name` for a plain relative name (no `..`, no absolute path).
fn safe_join(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = Path::new(name);
    let plain = p.components().all(|c| matches!(c, std::path::Component::Normal(_)));
    if name.is_empty() || !plain {
        return Err(ManifestError::UnsafeName { name: name.to_owned() }.into());
    }
    Ok(dir.join(p))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn chunks_cover_the_stream_and_round_trip() {
        let mut h = ChunkHasher::new();
        h.update(b"head");
        h.mark("a".into(), 4);
        h.update(b"aaaa");
        h.update(b"aa");
        h.mark("b".into(), 10);
        h.mark("empty".into(), 10);
        h.mark("c".into(), 10);
        h.update(b"c");
        let mut d = h.finish(11);
        d.file = "x.bin".into();
        let names: Vec<_> = d.chunks.iter().map(|c| (c.name.as_str(), c.offset, c.length)).collect();
        assert_eq!(names, [("", 0, 4), ("a", 4, 6), ("b", 10, 0), ("empty", 10, 0), ("c", 10, 1)]);
        assert_eq!(d.algorithm, Algorithm::Crc32c);
        assert!(d.chunks[1].matches(Algorithm::Crc32c, b"aaaaaa"));
        assert!(!d.chunks[1].matches(Algorithm::Crc32c, b"aaaaab"));
        assert_eq!(d.chunks[1].checksum, crc_fast::crc32_iscsi(b"aaaaaa"));
        let mut m = Manifest::default();
        m.insert(d);
        let back = Manifest::from_json(&m.to_json()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.chunk_at("x.bin", 4).unwrap().name, "a");

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x.bin"), b"headaaaaaac").unwrap();
        assert!(m.verify_dir(dir.path()).unwrap().is_empty());
        std::fs::write(dir.path().join("x.bin"), b"headaaXaaac").unwrap();
        assert!(m.verify_sizes(dir.path()).unwrap().is_empty(), "sizes only: no byte read");
        let p = m.verify_dir(dir.path()).unwrap();
        assert_eq!(p, [Mismatch::Chunk { file: "x.bin".into(), name: "a".into(), offset: 4, length: 6 }]);
        assert_eq!(p[0].to_string(), "x.bin: bytes 4..10 (\"a\") do not match their checksum");
        std::fs::write(dir.path().join("x.bin"), b"head").unwrap();
        assert!(matches!(m.verify_dir(dir.path()).unwrap()[0], Mismatch::Size { found: 4, .. }));
        assert!(matches!(m.verify_sizes(dir.path()).unwrap()[0], Mismatch::Size { found: 4, .. }));
        std::fs::remove_file(dir.path().join("x.bin")).unwrap();
        assert!(matches!(m.verify_dir(dir.path()).unwrap()[0], Mismatch::Missing { .. }));
    }

    #[test]
    fn reads_crc32_manifests_of_earlier_versions_and_mixed_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("old.bin"), b"abcdef").unwrap();
        std::fs::write(dir.path().join("new.bin"), b"xyz").unwrap();
        // What ckpt wrote before CRC32C: CRC-32/IEEE, named "crc32" at the top.
        let old = format!(
            r#"{{"format":"ckpt.checksums","version":1,"algorithm":"crc32","files":{{"old.bin":{{"size":6,"chunks":[["t",0,6,"{:08x}"]]}}}}}}"#,
            crc32fast::hash(b"abcdef")
        );
        let mut m = Manifest::from_json(old.as_bytes()).unwrap();
        assert_eq!(m.files["old.bin"].algorithm, Algorithm::Crc32);
        assert!(m.verify_dir(dir.path()).unwrap().is_empty());
        // Updated in place with a CRC32C digest: each file keeps its own algorithm through a round trip.
        let mut h = ChunkHasher::new();
        h.update(b"xyz");
        let mut d = h.finish(3);
        d.file = "new.bin".into();
        m.insert(d);
        let json = m.to_json();
        let text = String::from_utf8_lossy(&json);
        assert!(text.contains(r#""algorithm":"crc32c""#) && text.contains(r#""algorithm":"crc32""#), "{text}");
        let back = Manifest::from_json(&json).unwrap();
        assert_eq!(back, m);
        assert!(back.verify_dir(dir.path()).unwrap().is_empty());
        std::fs::write(dir.path().join("old.bin"), b"abcdeF").unwrap();
        assert_eq!(back.verify_dir(dir.path()).unwrap().len(), 1);
    }

    #[test]
    fn crc32c_is_the_castagnoli_crc() {
        // The check value of CRC-32C ("123456789"), whichever implementation the CPU gets.
        assert_eq!(Algorithm::Crc32c.hash(b"123456789"), 0xe306_9283);
        assert_eq!(Algorithm::Crc32.hash(b"123456789"), 0xcbf4_3926);
        assert_eq!(Algorithm::Crc32c.append(Algorithm::Crc32c.hash(b"1234"), b"56789"), 0xe306_9283);
    }

    #[test]
    fn crc32c_appends_across_every_split_and_matches_the_reference_crate() {
        // Lengths around the carry-less multiplication kernels' block sizes (16, 64, 128, 256 bytes and
        // beyond), split at every kind of boundary; the `crc32c` crate (the `crc32` instruction or its
        // tables) is the reference.
        let data: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 7, 15, 16, 17, 63, 64, 65, 127, 128, 255, 256, 257, 1023, 4096, 65_537, 70_000] {
            let whole = &data[..len];
            let expected = crc32c::crc32c(whole);
            assert_eq!(Algorithm::Crc32c.hash(whole), expected, "length {len}");
            for cut in [0, 1, 3, 16, 100, 255, 4095, len / 2, len.saturating_sub(1), len] {
                let cut = cut.min(len);
                let (a, b) = whole.split_at(cut);
                let appended = Algorithm::Crc32c.append(Algorithm::Crc32c.hash(a), b);
                assert_eq!(appended, expected, "length {len} cut {cut}");
            }
        }
    }

    #[test]
    fn rejects_bad_manifests() {
        for bad in [
            &br#"{"format":"x"}"#[..],
            br#"{"format":"ckpt.checksums","version":1,"algorithm":"crc32","files":{"a":{"size":3,"chunks":[["",0,2,"00"]]}}}"#,
            br#"{"format":"ckpt.checksums","version":1,"algorithm":"crc32","files":{"a":{"size":3,"chunks":[["",1,2,"00"]]}}}"#,
            br#"{"format":"ckpt.checksums","version":1,"algorithm":"crc32","files":{"a":{"size":3,"chunks":[["",0,3,"zz"]]}}}"#,
            b"not json",
        ] {
            assert!(Manifest::from_json(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let other = br#"{"format":"ckpt.checksums","version":1,"algorithm":"xxh3-64","files":{}}"#;
        assert!(matches!(
            Manifest::from_json(other),
            Err(e) if matches!(e.format_error(), Some(ManifestError::UnsupportedAlgorithm { .. }))
        ));
        let other = br#"{"format":"ckpt.checksums","version":1,"algorithm":"crc32c","files":{"a":{"algorithm":"md5","size":0,"chunks":[]}}}"#;
        assert!(matches!(Manifest::from_json(other), Err(e) if e.fault() == Fault::Unsupported));
        let m = Manifest::from_json(
            br#"{"format":"ckpt.checksums","version":1,"algorithm":"crc32","files":{"../x":{"size":0,"chunks":[]}}}"#,
        )
        .unwrap();
        assert!(m.verify_dir(Path::new("/tmp")).is_err());
    }
}
