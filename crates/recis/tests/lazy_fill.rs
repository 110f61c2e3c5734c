//! Reading a partial copy of a RecIS checkpoint through a fill hook (`ReadOptions::fill`), as the facade
//! reads one on an object store: the copy holds the small files whole, each data file's header and each
//! `.pt` file's ZIP index (every record but the tensors'); reading a tensor fills only its bytes, and a
//! failed fill is an error, never zeros.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ckpt_io::storage::RangeFill;
use ckpt_recis::{DataFile, ReadOptions, RecisReader, WriteOptions};
use ckpt_tensor::{CheckpointRead, Tensor, Value};

/// Copies the ranges asked for from the complete checkpoint `from` into the partial copy `to` (file names
/// relative to both), recording them; once `fail` is set, every fill fails.
#[derive(Debug)]
struct CopyFill {
    from: PathBuf,
    to: PathBuf,
    filled: Mutex<Vec<(String, Range<u64>)>>,
    fail: AtomicBool,
}

impl CopyFill {
    /// A fill of the partial copy `to` from the whole checkpoint `from`, counting what it fills.
    fn new(from: &Path, to: &Path) -> Arc<CopyFill> {
        Arc::new(CopyFill {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            filled: Mutex::new(Vec::new()),
            fail: AtomicBool::new(false),
        })
    }
}

impl RangeFill for CopyFill {
    fn fill(&self, file: &str, range: Range<u64>) -> std::io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the object is shorter"));
        }
        let src = std::fs::File::open(self.from.join(file))?;
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        src.read_exact_at(&mut buf, range.start)?;
        std::fs::OpenOptions::new().write(true).open(self.to.join(file))?.write_all_at(&buf, range.start)?;
        self.filled.lock().unwrap().push((file.to_owned(), range));
        Ok(())
    }
}

impl CopyFill {
    /// The fills made so far.
    fn fills(&self) -> Vec<(String, Range<u64>)> {
        self.filled.lock().unwrap().clone()
    }
}

/// The length of the prefix and header of the safetensors file at `path`.
fn header_end(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap())
}

/// A copy of `from` at `to` as an object-store lazy fetch leaves it: data files as sparse files holding
/// their headers alone, `.pt` files with their tensor records (`data/<key>`, local header and data) zeroed,
/// everything else whole.
fn partial_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().unwrap().is_dir() {
            partial_copy(&src, &dst);
        } else if name.ends_with(".safetensors") {
            let bytes = std::fs::read(&src).unwrap();
            let f = std::fs::File::create(&dst).unwrap();
            f.set_len(bytes.len() as u64).unwrap();
            f.write_all_at(&bytes[..header_end(&src) as usize], 0).unwrap();
        } else if name.ends_with(".pt") {
            let mut bytes = std::fs::read(&src).unwrap();
            let archive = ckpt_torch::zip::Archive::parse(&bytes).unwrap();
            let tensors: Vec<Range<usize>> = archive
                .records()
                .iter()
                .filter(|r| r.short_name().starts_with("data/"))
                .map(|r| r.local_header_offset() as usize..r.data_range().end as usize)
                .collect();
            for r in tensors {
                bytes[r].fill(0);
            }
            std::fs::write(&dst, bytes).unwrap();
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

fn f32s(rows: usize, cols: usize, from: f32) -> Tensor {
    let v: Vec<f32> = (0..rows * cols).map(|i| from + i as f32).collect();
    Tensor::from_slice(&v, &[rows, cols]).unwrap()
}

/// An output root holding a `checkpoint` list and `ckpt_7/`, a two-shard checkpoint of two hash tables
/// (`user`, 4 MiB of embeddings and as much of `exp_avg`; `item`), a sparse-side dense tensor, `model.pt`
/// and `extra.pt`.
fn output_root(root: &Path) {
    let users = 4096;
    let ids: Vec<i64> = (0..users as i64).map(|i| i * 7 - 100).collect();
    let items: Vec<i64> = (0..512).collect();
    let sd = Value::dict([
        ("user@id", Value::Tensor(Tensor::from_slice(&ids, &[users]).unwrap())),
        ("user@embedding", Value::Tensor(f32s(users, 256, 0.0))),
        ("user@exp_avg", Value::Tensor(f32s(users, 256, 1e7))),
        ("item@id", Value::Tensor(Tensor::from_slice(&items, &[512]).unwrap())),
        ("item@embedding", Value::Tensor(f32s(512, 16, 2e7))),
        ("sparse_adamw_step", Value::Tensor(Tensor::from_slice(&[42i64], &[1]).unwrap())),
        ("model", Value::dict([("w", Value::Tensor(f32s(1024, 256, 3e7))), ("b", Value::Tensor(f32s(1, 256, 4e7)))])),
        ("step", Value::Int(7)),
    ]);
    ckpt_recis::save(&sd, root.join("ckpt_7"), &WriteOptions::default().with_world_size(2).with_parallel(2)).unwrap();
    std::fs::write(root.join("checkpoint"), "ckpt_7\n").unwrap();
}

/// The byte ranges of the blocks of tensor `name` in the data files of the checkpoint directory `dir`, by
/// the data file's name.
fn block_ranges(dir: &Path, name: &str) -> Vec<(String, Range<u64>)> {
    let sparse = ckpt_recis::SparseCheckpoint::open(dir).unwrap();
    let mut out = Vec::new();
    for b in sparse.blocks().iter().filter(|b| b.tensor_name == name) {
        let file: &DataFile = &sparse.data_files()[&b.file_id];
        let (start, end) = file.entry(&b.key).unwrap().data_offsets;
        let base = 8 + file.header_len() as u64;
        out.push((b.file_name.clone(), base + start as u64..base + end as u64));
    }
    out
}

/// The bytes `fills` cover, each byte counted once.
fn covered(fills: &[(String, Range<u64>)]) -> u64 {
    let mut sorted = fills.to_vec();
    sorted.sort_by(|a, b| (&a.0, a.1.start).cmp(&(&b.0, b.1.start)));
    let mut total = 0;
    let mut last: Option<(String, u64)> = None;
    for (file, r) in sorted {
        let from = match &last {
            Some((f, end)) if *f == file => r.start.max(*end),
            _ => r.start,
        };
        total += r.end.saturating_sub(from);
        let end = match &last {
            Some((f, end)) if *f == file => r.end.max(*end),
            _ => r.end,
        };
        last = Some((file, end));
    }
    total
}

#[test]
fn reading_a_tensor_fills_only_its_bytes_and_everything_reads_as_the_local_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    output_root(&root);
    let local = RecisReader::open(&root).unwrap();
    assert_eq!(local.dir(), root.join("ckpt_7"));
    let copy = tmp.path().join("copy");
    partial_copy(&root, &copy);
    let fill = CopyFill::new(&root, &copy);
    let hook: Arc<dyn RangeFill> = fill.clone();
    let lazy = RecisReader::open_with(&copy, &ReadOptions::default().with_fill(Some(hook))).unwrap();

    // Opening fills the data files' headers and the .pt files' records but their tensors' (present in the
    // copy already), each file named by its path under the root opened.
    let opened = fill.fills();
    let total: u64 = walk(&root).iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    for (file, r) in &opened {
        assert!(file.starts_with("ckpt_7/"), "{file}");
        if file.ends_with(".safetensors") {
            assert!(r.end <= header_end(&root.join(file)), "{file} {r:?}: past the header");
        }
    }
    let metadata = covered(&opened);
    assert!(metadata < 64 << 10, "opening filled {metadata} bytes of {total}");
    assert_eq!(lazy.entries(), local.entries());
    // The state dict (what a conversion reads) holds tensors made when their bytes are read: nothing filled.
    let state = lazy.state_dict().unwrap();
    assert_eq!(fill.fills().len(), opened.len(), "the state dict read no tensor bytes");
    drop(state);

    // One table slot, split over both shards' files: exactly its blocks' bytes.
    let embedding = lazy.tensor("user@embedding").unwrap();
    assert_eq!(embedding, local.tensor("user@embedding").unwrap());
    let read: Vec<(String, Range<u64>)> = fill.fills().split_off(opened.len());
    let blocks = block_ranges(&root.join("ckpt_7"), "user@embedding");
    assert_eq!(blocks.len(), 2, "a slice a shard: {blocks:?}");
    for (file, r) in &read {
        let inside = blocks.iter().any(|(f, b)| file == &format!("ckpt_7/{f}") && b.start <= r.start && r.end <= b.end);
        assert!(inside, "{file} {r:?} is not user@embedding's: {blocks:?}");
    }
    let need = 4096 * 256 * 4;
    assert_eq!(covered(&read), need, "{read:?}");
    assert!(need * 2 < total, "the checkpoint ({total} bytes) is more than the tensor read");

    // A tensor of model.pt: its record alone (the local header and the data).
    let before = fill.fills().len();
    assert_eq!(lazy.tensor("w").unwrap(), local.tensor("w").unwrap());
    let read: Vec<(String, Range<u64>)> = fill.fills().split_off(before);
    assert!(read.iter().all(|(f, _)| f == "ckpt_7/model.pt"), "{read:?}");
    let w = 1024 * 256 * 4;
    assert!(covered(&read) >= w && covered(&read) <= w + 4096, "{read:?}");

    // Every entry, the state dict, the tables: as the local copy reads them; the copy is then whole.
    for e in local.entries() {
        assert_eq!(lazy.value(&e.name).unwrap(), local.value(&e.name).unwrap(), "{}", e.name);
    }
    assert_eq!(lazy.state_dict().unwrap(), local.state_dict().unwrap());
    assert_eq!(lazy.sparse().child("user").unwrap(), local.sparse().child("user").unwrap());
    for path in walk(&root) {
        let rel = path.strip_prefix(&root).unwrap();
        if rel.to_string_lossy().ends_with(".safetensors") {
            assert_eq!(std::fs::read(copy.join(rel)).unwrap(), std::fs::read(&path).unwrap(), "{rel:?}");
        }
    }

    // A reshard of the partial copy (dense files copied byte for byte: filled first) equals the local one.
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let partial = tmp.path().join("copy2");
    partial_copy(&root, &partial);
    let fill2: Arc<dyn RangeFill> = Arc::new(CopyFill {
        from: root.clone(),
        to: partial.clone(),
        filled: Mutex::new(Vec::new()),
        fail: AtomicBool::new(false),
    });
    let lazy_read = ReadOptions::default().with_fill(Some(fill2));
    ckpt_recis::reshard(&partial, &a, 3, &ckpt_recis::ReshardOptions::default().with_read(lazy_read)).unwrap();
    ckpt_recis::reshard(&root, &b, 3, &ckpt_recis::ReshardOptions::default()).unwrap();
    let (a, b) = (RecisReader::open(&a).unwrap(), RecisReader::open(&b).unwrap());
    assert_eq!(a.state_dict().unwrap(), b.state_dict().unwrap());
}

#[test]
fn a_failed_fill_is_an_error_never_zeros() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    output_root(&root);
    let copy = tmp.path().join("copy");
    partial_copy(&root, &copy);
    let fill = CopyFill::new(&root, &copy);
    let hook: Arc<dyn RangeFill> = fill.clone();
    let options = ReadOptions::default().with_fill(Some(hook));
    let lazy = RecisReader::open_with(&copy, &options).unwrap();
    fill.fail.store(true, Ordering::SeqCst);
    for name in ["user@embedding", "item@embedding", "user@id", "sparse_adamw_step", "w", "b"] {
        let read = lazy.tensor(name).and_then(|t| Ok(t.stored_data()?.into_owned()));
        let e = read.expect_err(name);
        assert!(format!("{e:?}").contains("the object is shorter"), "{name}: {e:?}");
    }
    // Opening fails too when the headers cannot be filled.
    let e = RecisReader::open_with(&copy, &options).unwrap_err();
    assert!(format!("{e:?}").contains("shorter"), "{e:?}");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}
