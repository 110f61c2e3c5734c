//! What the ckpt fuzz targets share: a container that turns one fuzzer input into several named files, a
//! scratch directory on tmpfs to write them to (for readers that take a path), and helpers that read
//! everything a reader hands out, as a user of the public API would.
//!
//! # The file-set container
//! An input is a sequence of files, each introduced by [`SEPARATOR`] followed by the file's name and a
//! newline; the file's bytes run to the next separator or the end of the input. Bytes before the first
//! separator are a file with the target's default name (so a raw `.metadata` or `PART_000.pt` is a valid
//! input on its own). `fuzz/seed.sh` builds seeds in this format from the golden fixtures, e.g.
//!
//! ```text
//! <.metadata bytes>\xff\x00CKF:__0_0.distcp\n<data file bytes>
//! ```
//!
//! Names are restricted to plain path components (`[A-Za-z0-9._@+-]`, no `.`/`..`), at most
//! [`MAX_DEPTH`] deep, at most [`MAX_FILES`] files; later duplicates are dropped.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ckpt_tensor::{CheckpointRead, EntryKind, Tensor, Value};

/// Introduces a file in a file-set input (also in every target's dictionary).
pub const SEPARATOR: &[u8] = b"\xff\x00CKF:";
/// Most files one input may describe.
pub const MAX_FILES: usize = 16;
/// Most path components in a file name (`epoch_1/model.v1.h5`, `ckpt_10/index`).
pub const MAX_DEPTH: usize = 3;
/// Longest file name.
pub const MAX_NAME: usize = 96;
/// Tensors with more logical bytes than this are checked but not gathered: a stride-0 view of a few bytes
/// may legitimately describe gigabytes, and gathering it is the caller's explicit choice, not the reader's.
pub const MAX_GATHER_BYTES: usize = 64 << 20;

/// One file of a file-set input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry<'a> {
    /// Relative path (components joined by `/`).
    pub name: String,
    /// Contents.
    pub bytes: &'a [u8],
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let rest = hay.get(from..)?;
    rest.windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

fn valid_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('/').collect();
    !name.is_empty()
        && name.len() <= MAX_NAME
        && parts.len() <= MAX_DEPTH
        && parts.iter().all(|p| {
            !p.is_empty()
                && *p != "."
                && *p != ".."
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"._@+-".contains(&b))
        })
}

/// Splits a file-set input into files (see the crate docs); `default_name` names the bytes before the first
/// separator (dropped when empty and other files follow).
pub fn split_files<'a>(data: &'a [u8], default_name: &str) -> Vec<FileEntry<'a>> {
    let mut out: Vec<FileEntry<'a>> = Vec::new();
    let push = |name: String, bytes: &'a [u8], out: &mut Vec<FileEntry<'a>>| {
        let clash = |other: &FileEntry<'_>| {
            other.name == name
                || name.strip_prefix(other.name.as_str()).is_some_and(|r| r.starts_with('/'))
                || other.name.strip_prefix(name.as_str()).is_some_and(|r| r.starts_with('/'))
        };
        if out.len() < MAX_FILES && valid_name(&name) && !out.iter().any(clash) {
            out.push(FileEntry { name, bytes });
        }
    };
    let first = find(data, SEPARATOR, 0).unwrap_or(data.len());
    let head = data.get(..first).unwrap_or_default();
    if !head.is_empty() || first == data.len() {
        push(default_name.to_owned(), head, &mut out);
    }
    let mut at = first;
    while at < data.len() {
        let start = at + SEPARATOR.len();
        let end = find(data, SEPARATOR, start).unwrap_or(data.len());
        let chunk = data.get(start..end).unwrap_or_default();
        if let Some(nl) = chunk.iter().position(|&b| b == b'\n')
            && let (Ok(name), Some(bytes)) = (std::str::from_utf8(&chunk[..nl]), chunk.get(nl + 1..))
        {
            push(name.to_owned(), bytes, &mut out);
        }
        at = end;
    }
    out
}

/// Encodes files as a file-set input (the inverse of [`split_files`] with the first file as the default).
pub fn join_files(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, bytes) in files {
        out.extend_from_slice(SEPARATOR);
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(bytes);
    }
    out
}

static SCRATCH: OnceLock<PathBuf> = OnceLock::new();

/// This process's scratch directory: `$CKPT_FUZZ_SCRATCH` (set by `scripts/fuzz.sh`, removed after the run),
/// else `/dev/shm`, else the system temporary directory; one subdirectory per target and process.
fn scratch(target: &str) -> &'static Path {
    SCRATCH.get_or_init(|| {
        let base = std::env::var_os("CKPT_FUZZ_SCRATCH")
            .map(PathBuf::from)
            .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
            .unwrap_or_else(std::env::temp_dir);
        base.join(format!("ckpt-fuzz-{target}-{}", std::process::id()))
    })
}

/// Writes `files` into a fresh directory (emptied before every input) and returns its path. A file that
/// cannot be written (a name used both as a file and a directory) is left out.
pub fn write_dir(target: &str, files: &[FileEntry<'_>]) -> PathBuf {
    let dir = scratch(target).join("ckpt");
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        // Nothing can be tested without the scratch directory: a set-up failure, not a finding.
        eprintln!("cannot create the scratch directory {}: {e}", dir.display());
        std::process::exit(2);
    }
    for f in files {
        let path = dir.join(&f.name);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = std::fs::write(&path, f.bytes);
    }
    dir
}

/// [`write_dir`], after breaking the HDF5 signature of every file that would pass ckpt-pbg's checks and
/// reach libhdf5's parser: the targets cover ckpt's code; libhdf5 is a system C library with its own fuzzing.
pub fn write_dir_without_hdf5(target: &str, files: &[FileEntry<'_>]) -> PathBuf {
    let defused: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|f| {
            let mut bytes = f.bytes.to_vec();
            while let Ok(offset) = ckpt_pbg::h5::check_header(Path::new(&f.name), &bytes) {
                match bytes.get_mut(offset) {
                    Some(b) => *b ^= 0xff,
                    None => break,
                }
            }
            (f.name.clone(), bytes)
        })
        .collect();
    let entries: Vec<FileEntry<'_>> = defused.iter().map(|(n, b)| FileEntry { name: n.clone(), bytes: b }).collect();
    write_dir(target, &entries)
}

/// Reads a tensor's bytes as a user would (`data()`: gathered when strided, lazy bits applied), for tensors
/// up to [`MAX_GATHER_BYTES`]; larger ones get their metadata checked only. Returns a digest so that the
/// reads cannot be optimised away.
pub fn read_tensor(t: &Tensor) -> u64 {
    let mut digest = t.numel() as u64 ^ (t.dim() as u64) << 32;
    if t.nbytes() <= MAX_GATHER_BYTES {
        if let Ok(bytes) = t.data() {
            digest = bytes.iter().fold(digest, |h, &b| h.rotate_left(5) ^ u64::from(b));
        }
        if let Ok(c) = t.to_contiguous() {
            digest ^= c.nbytes() as u64;
        }
    }
    digest
}

/// Walks a value (every tensor in it read with [`read_tensor`]) and renders it as `ckpt inspect` would.
pub fn read_value(v: &Value) -> u64 {
    let mut digest = 0u64;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        digest = digest.rotate_left(3) ^ v.type_name().len() as u64;
        if let Some(t) = v.as_tensor() {
            digest ^= read_tensor(t);
        }
        match v {
            Value::List(items) | Value::Tuple(items) | Value::Set(items) | Value::FrozenSet(items) => {
                stack.extend(items.iter());
            }
            Value::Dict(d) => {
                for (k, v) in &d.items {
                    stack.push(k);
                    stack.push(v);
                }
            }
            _ => {}
        }
    }
    digest ^ ckpt_tensor::flatten::python_str(v).map(|s| s.len() as u64).unwrap_or(0)
}

/// What every target does with an opened checkpoint: list the entries, then read every one of them (tensors
/// through [`read_tensor`], values through [`read_value`]) and the format's details. A tensor read must have
/// the dtype and shape its entry announced (checked for the first entry of each name).
pub fn read_all(r: &dyn CheckpointRead) -> u64 {
    let mut digest = r.format_name().len() as u64;
    for (k, v) in r.details() {
        digest ^= (k.len() + v.len()) as u64;
    }
    let mut seen = std::collections::HashSet::new();
    for e in r.entries() {
        digest = digest.rotate_left(7) ^ e.name.len() as u64;
        // Two leaves may flatten to one name (`{"a.b": x, "a": {"b": y}}`); a read by name finds the first.
        let first = seen.insert(e.name.clone());
        match e.kind {
            EntryKind::Tensor(info) if first => {
                if let Ok(t) = r.tensor(&e.name) {
                    assert_eq!(
                        (t.dtype(), t.shape()),
                        (info.dtype, info.shape.as_slice()),
                        "entry {:?}: the tensor read differs from its listed dtype and shape",
                        e.name
                    );
                    digest ^= read_tensor(&t);
                }
            }
            _ => {
                if let Ok(v) = r.value(&e.name) {
                    digest ^= read_value(&v);
                }
            }
        }
    }
    digest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_sets_round_trip() {
        let data = join_files(&[(".metadata", b"abc"), ("__0_0.distcp", b"PK\x03\x04"), ("sub/x", b"")]);
        let files = split_files(&data, "ignored");
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, [".metadata", "__0_0.distcp", "sub/x"]);
        assert_eq!(files[1].bytes, b"PK\x03\x04");
        let raw = split_files(b"raw", "PART_000.pt");
        assert_eq!(raw, [FileEntry { name: "PART_000.pt".into(), bytes: b"raw" }]);
        let bad = join_files(&[("../x", b"1"), ("a", b"2"), ("a/b", b"3"), ("a", b"4")]);
        let files = split_files(&bad, "d");
        assert_eq!(files, [FileEntry { name: "a".into(), bytes: b"2" }]);
    }
}

/// A minimal torch.package archive whose one pickled resource, `models/model.pkl`, is `pickle` (and whose
/// storages are none): the externs torch's own pickles name, a version, `byteorder`.
pub fn torch_package_of(pickle: &[u8]) -> Vec<u8> {
    let mut zip = ckpt_torch::zip::ZipWriter::new(Vec::new(), "package");
    let records: [(&str, &[u8]); 4] = [
        ("models/model.pkl", pickle),
        (".data/extern_modules", b"torch\ncollections\nbuiltins\n"),
        (".data/version", b"6\n"),
        ("byteorder", b"little"),
    ];
    for (name, data) in records {
        if zip.write_record(name, data).is_err() {
            return Vec::new();
        }
    }
    zip.finish().unwrap_or_default()
}
