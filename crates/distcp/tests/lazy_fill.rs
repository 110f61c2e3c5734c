//! Reading a partial copy of a checkpoint through a fill hook (`ReadOptions::fill`), as the facade reads a
//! checkpoint on an object store: only the bytes a read needs are filled, and a failed fill is an error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_tensor::FormatError;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ckpt_distcp::{DcpReader, Error, ReadOptions, WriteOptions, save, save_sharded};
use ckpt_io::storage::RangeFill;
use ckpt_tensor::{Tensor, Value};

/// Copies the ranges asked for from the complete checkpoint `from` into the sparse copy `to`, counting them.
#[derive(Debug)]
struct CopyFill {
    from: PathBuf,
    to: PathBuf,
    filled: Mutex<Vec<(String, Range<u64>)>>,
    fail: bool,
}

impl CopyFill {
    fn bytes(&self) -> u64 {
        self.filled.lock().unwrap().iter().map(|(_, r)| r.end - r.start).sum()
    }
}

impl RangeFill for CopyFill {
    fn fill(&self, file: &str, range: Range<u64>) -> std::io::Result<()> {
        if self.fail {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the object is shorter"));
        }
        let src = std::fs::File::open(self.from.join(file))?;
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        src.read_exact_at(&mut buf, range.start)?;
        let dst = std::fs::OpenOptions::new().write(true).open(self.to.join(file))?;
        dst.write_all_at(&buf, range.start)?;
        self.filled.lock().unwrap().push((file.to_owned(), range));
        Ok(())
    }
}

/// A copy of the checkpoint `dir` whose `.distcp` files are sparse (zeros), and a fill from `dir`.
fn sparse_copy(dir: &Path, at: &Path, fail: bool) -> Arc<CopyFill> {
    std::fs::create_dir_all(at).unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name.to_string_lossy().ends_with(".distcp") {
            let f = std::fs::File::create(at.join(&name)).unwrap();
            f.set_len(e.metadata().unwrap().len()).unwrap();
        } else {
            std::fs::copy(e.path(), at.join(&name)).unwrap();
        }
    }
    Arc::new(CopyFill { from: dir.to_path_buf(), to: at.to_path_buf(), filled: Mutex::new(Vec::new()), fail })
}

fn f32s(rows: usize, cols: usize, from: f32) -> Tensor {
    let v: Vec<f32> = (0..rows * cols).map(|i| from + i as f32).collect();
    Tensor::from_slice(&v, &[rows, cols]).unwrap()
}

#[test]
fn a_region_fills_only_its_rows_and_the_item_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("full");
    let (a, b) = (f32s(4096, 256, 0.0), f32s(1024, 256, 1e6));
    let sd = Value::dict([("a", Value::Tensor(a.clone())), ("b", Value::Tensor(b.clone())), ("step", Value::Int(3))]);
    save(&sd, &dir, &WriteOptions::default()).unwrap();
    let local = DcpReader::open(&dir).unwrap();

    for mmap in [true, false] {
        let copy = tmp.path().join(format!("sparse-{mmap}"));
        let fill = sparse_copy(&dir, &copy, false);
        let hook: Arc<dyn RangeFill> = fill.clone();
        let r = DcpReader::open_with(&copy, &ReadOptions::default().with_mmap(mmap).with_fill(Some(hook))).unwrap();
        assert_eq!(fill.bytes(), 0, "opening reads the metadata alone");

        // 256 of a's 4096 rows: 256 KiB of a 4 MiB item.
        let region = r.read_region("a", &[1000, 0], &[256, 256]).unwrap();
        assert_eq!(region, local.read_region("a", &[1000, 0], &[256, 256]).unwrap());
        let need = 256 * 256 * 4;
        let filled = fill.bytes();
        assert!(filled >= need && filled <= need + (8 << 10), "filled {filled} for {need}");

        // A column slice: the rows it spans, no more (and the item's metadata again: this fill, unlike the
        // object store's mirror, does not remember what it filled).
        let before = fill.bytes();
        let col = r.read_region("a", &[10, 5], &[3, 2]).unwrap();
        assert_eq!(col, local.read_region("a", &[10, 5], &[3, 2]).unwrap());
        let last = fill.filled.lock().unwrap().last().cloned().unwrap().1;
        assert_eq!(last.end - last.start, (2 * 256 + 2) * 4, "from (10, 5) to (12, 6)");
        assert!(fill.bytes() - before <= 3 * 256 * 4 + (8 << 10), "{}", fill.bytes() - before);

        // Whole tensors and values: equal to the local read.
        assert_eq!(r.read_tensor("b").unwrap(), b);
        assert_eq!(r.read_tensor("a").unwrap(), a);
        assert_eq!(r.read_value("step").unwrap(), Value::Int(3));
        assert_eq!(r.state_dict().unwrap(), sd);
    }
}

#[test]
fn regions_over_several_chunks_fill_each_part() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("full");
    let w = f32s(4096, 64, 0.0);
    let sd = Value::dict([("w", Value::Tensor(w.clone()))]);
    save_sharded(&sd, &dir, 4, &WriteOptions::default()).unwrap();
    let local = DcpReader::open(&dir).unwrap();
    assert_eq!(local.tensor_metadata("w").unwrap().chunks.len(), 4);
    let copy = tmp.path().join("sparse");
    let fill = sparse_copy(&dir, &copy, false);
    let hook: Arc<dyn RangeFill> = fill.clone();
    let r = DcpReader::open_with(&copy, &ReadOptions::default().with_fill(Some(hook))).unwrap();
    // Rows 1000..1100 cross the first two chunks (1024 rows each).
    let region = r.read_region("w", &[1000, 0], &[100, 64]).unwrap();
    assert_eq!(region, local.read_region("w", &[1000, 0], &[100, 64]).unwrap());
    let need = 100 * 64 * 4;
    // Each of the two items: its metadata (its last 4 KiB, its first records) and its rows.
    assert!(fill.bytes() <= need + 2 * (8 << 10), "filled {} for {need}", fill.bytes());
    let files: std::collections::HashSet<String> = fill.filled.lock().unwrap().iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(files.len(), 2, "two of the four ranks' files: {files:?}");
    assert_eq!(r.read_tensor("w").unwrap(), w);
}

#[test]
fn a_failed_fill_is_an_error_never_zeros() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("full");
    let sd = Value::dict([("a", Value::Tensor(f32s(64, 64, 1.0)))]);
    save(&sd, &dir, &WriteOptions::default()).unwrap();
    let fill = sparse_copy(&dir, &tmp.path().join("sparse"), true);
    let hook: Arc<dyn RangeFill> = fill;
    let r = DcpReader::open_with(tmp.path().join("sparse"), &ReadOptions::default().with_fill(Some(hook))).unwrap();
    for e in [r.read_tensor("a").unwrap_err(), r.read_region("a", &[1, 1], &[2, 2]).unwrap_err()] {
        match &e {
            Error::Fetch { key, source, .. } => {
                assert_eq!(key, "a");
                assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
            }
            other => panic!("{other}"),
        }
        assert_eq!(e.fault(), ckpt_tensor::Fault::Malformed);
    }
}

#[test]
fn prefetch_fills_a_ranks_whole_items_as_one_range_per_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("full");
    let ts: Vec<Tensor> = (0..6).map(|i| f32s(512, 64, i as f32 * 1e5)).collect();
    let sd = Value::dict(ts.iter().enumerate().map(|(i, t)| (format!("t{i}"), Value::Tensor(t.clone()))));
    save_sharded(&sd, &dir, 2, &WriteOptions::default()).unwrap();
    let local = DcpReader::open(&dir).unwrap();
    assert_eq!(local.tensor_metadata("t0").unwrap().chunks.len(), 2);
    let copy = tmp.path().join("sparse");
    let fill = sparse_copy(&dir, &copy, false);
    let hook: Arc<dyn RangeFill> = fill.clone();
    let r = DcpReader::open_with(&copy, &ReadOptions::default().with_fill(Some(hook))).unwrap();

    // Rank 1's boxes: rows 256..512 of every tensor (its own chunks, whole), and a part of a chunk of t0.
    let keys: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    let (off, size) = ([256usize, 0], [256usize, 64]);
    let mut regions: Vec<(&str, &[usize], &[usize])> = keys.iter().map(|k| (k.as_str(), &off[..], &size[..])).collect();
    let (part_off, part_size) = ([10usize, 0], [20usize, 64]);
    regions.push(("t0", &part_off[..], &part_size[..]));
    regions.push(("no-such-key", &off[..], &size[..]));
    r.prefetch_regions(&regions).unwrap();
    let fills = fill.filled.lock().unwrap().clone();
    assert_eq!(fills.len(), 1, "one range for the six items of one file: {fills:?}");
    let items = 6 * 256 * 64 * 4;
    let got = fill.bytes();
    assert!(got >= items as u64 && got <= items as u64 + 6 * (8 << 10), "filled {got} for {items} bytes of data");

    // The boxes read equal to the local read, and every range they fill lies inside the prefetched one (a
    // mirror that remembers what it holds, as the object store's does, fetches nothing more; this fill
    // copies again).
    let (file, run) = fills[0].clone();
    for k in &keys {
        assert_eq!(r.read_region(k, &off, &size).unwrap(), local.read_region(k, &off, &size).unwrap());
    }
    for (f, later) in fill.filled.lock().unwrap().iter().skip(1) {
        assert!(*f == file && later.start >= run.start && later.end <= run.end, "{f} {later:?} outside {run:?}");
    }
    assert_eq!(
        r.read_region("t0", &part_off, &part_size).unwrap(),
        local.read_region("t0", &part_off, &part_size).unwrap()
    );

    // A failed fill is an error naming the item and the file.
    let failing = sparse_copy(&dir, &tmp.path().join("failing"), true);
    let hook: Arc<dyn RangeFill> = failing;
    let r = DcpReader::open_with(tmp.path().join("failing"), &ReadOptions::default().with_fill(Some(hook))).unwrap();
    assert!(matches!(r.prefetch_regions(&regions[..1]), Err(Error::Fetch { .. })));

    // Without a fill hook: nothing to do.
    local.prefetch_regions(&regions).unwrap();
}
