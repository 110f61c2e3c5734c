//! A local copy of a checkpoint on an object store that is fetched as it is read ([`SparseMirror`]).

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{RangeFill, StatsSnapshot, StorageError, Store};

/// Missing ranges closer than this are fetched as one request (the bytes between them, already present,
/// are fetched again): a request costs more than 64 KiB of transfer on any object store.
const FILL_GAP: u64 = 64 << 10;

/// One object of a [`SparseMirror`].
#[derive(Debug)]
struct Mirrored {
    /// The local file (a sparse file of the object's size).
    path: PathBuf,
    /// The object's size, as listed.
    size: u64,
    /// The byte ranges present in the local file: sorted, disjoint, not touching.
    present: Mutex<Vec<Range<u64>>>,
}

/// A local copy of objects under a [`Store`] prefix that is fetched as it is read: each object a sparse
/// local file of its listed size, filled ([`RangeFill::fill`]) with the byte ranges a reader is about to
/// read, each byte fetched once. A fill fetches only the ranges not yet present (missing ranges closer
/// than 64 KiB as one request), cut at the store's part size, `concurrency` requests at once, each batch
/// written to the file before the next is fetched: memory stays within `concurrency × part_size`.
///
/// What was never filled reads as zeros: read such a copy only through a reader that fills first.
#[derive(Debug)]
pub struct SparseMirror {
    store: Store,
    objects: HashMap<String, Mirrored>,
}

/// `name` with empty and `.` segments dropped (`./a//b` → `a/b`), as object names are.
fn normalized(name: &str) -> String {
    name.split('/').filter(|p| !p.is_empty() && *p != ".").collect::<Vec<_>>().join("/")
}

/// The parts of `want` that `present` (sorted, disjoint) does not hold, in order.
fn missing(present: &[Range<u64>], want: &Range<u64>) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut at = want.start;
    let first = present.partition_point(|r| r.end <= want.start);
    for r in present.iter().skip(first) {
        if r.start >= want.end {
            break;
        }
        if r.start > at {
            out.push(at..r.start);
        }
        at = at.max(r.end);
    }
    if at < want.end {
        out.push(at..want.end);
    }
    out
}

/// Adds `new` to `present` (sorted, disjoint, not touching), merging what it overlaps or touches.
fn insert(present: &mut Vec<Range<u64>>, new: Range<u64>) {
    if new.start >= new.end {
        return;
    }
    let from = present.partition_point(|r| r.end < new.start);
    let to = present.partition_point(|r| r.start <= new.end);
    let mut merged = new;
    if let Some(first) = present.get(from) {
        if from < to {
            merged.start = merged.start.min(first.start);
        }
    }
    if to > from {
        if let Some(last) = present.get(to - 1) {
            merged.end = merged.end.max(last.end);
        }
    }
    present.splice(from..to, std::iter::once(merged));
}

impl SparseMirror {
    /// A mirror of objects under `store`'s prefix, holding none yet.
    pub fn new(store: Store) -> SparseMirror {
        SparseMirror { store, objects: HashMap::new() }
    }

    /// The store it fetches from.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Requests and bytes its store moved so far (this mirror's fills included).
    pub fn stats(&self) -> StatsSnapshot {
        self.store.stats()
    }

    /// Mirrors the object `name` (relative to the prefix; empty for the prefix itself as an object) of
    /// `size` bytes at the local path `local`: a sparse file of its size, nothing fetched.
    ///
    /// # Errors
    /// [`StorageError::Local`] when the file cannot be made.
    pub fn add_sparse(&mut self, name: &str, size: u64, local: &Path) -> Result<(), StorageError> {
        let io = |source| StorageError::Local { path: local.to_path_buf(), source };
        let file = std::fs::File::create(local).map_err(io)?;
        file.set_len(size).map_err(io)?;
        self.objects
            .insert(normalized(name), Mirrored { path: local.to_path_buf(), size, present: Mutex::new(Vec::new()) });
        Ok(())
    }

    /// Records that the object `name` of `size` bytes is present whole at `local` (fetched by other means):
    /// fills of it fetch nothing.
    pub fn add_present(&mut self, name: &str, size: u64, local: &Path) {
        let present = if size > 0 { std::iter::once(0..size).collect() } else { Vec::new() };
        self.objects
            .insert(normalized(name), Mirrored { path: local.to_path_buf(), size, present: Mutex::new(present) });
    }

    /// Records that the object `name` of `size` bytes is mirrored at `local`, a file of its size already
    /// made, in which the byte ranges `present` were fetched by other means (a header fetched to list the
    /// object): fills of it fetch only the rest.
    pub fn add_partial(&mut self, name: &str, size: u64, local: &Path, present: impl IntoIterator<Item = Range<u64>>) {
        let mut ranges = Vec::new();
        for r in present {
            insert(&mut ranges, r.start.min(size)..r.end.min(size));
        }
        self.objects
            .insert(normalized(name), Mirrored { path: local.to_path_buf(), size, present: Mutex::new(ranges) });
    }

    /// Bytes of the object `name` present locally (`None` for an object it does not mirror).
    pub fn present_bytes(&self, name: &str) -> Option<u64> {
        let object = self.objects.get(&normalized(name))?;
        let present = object.present.lock().ok()?;
        Some(present.iter().map(|r| r.end - r.start).sum())
    }

    /// Makes the bytes `range` of the object `name` present in its local file (see [`SparseMirror`]).
    ///
    /// # Errors
    /// [`StorageError::NotFound`] for an object it does not mirror; [`StorageError::Truncated`] when
    /// `range` ends past the object's listed size or the object on the store is shorter than it was when
    /// listed; [`StorageError::Local`] for the local file; the store's errors.
    pub fn fill_range(&self, name: &str, range: Range<u64>) -> Result<(), StorageError> {
        let key = normalized(name);
        let Some(object) = self.objects.get(&key) else {
            return Err(StorageError::NotFound { url: self.store.url_of(&key) });
        };
        if range.start >= range.end {
            return Ok(());
        }
        if range.end > object.size {
            return Err(StorageError::Truncated {
                url: self.store.url_of(&key),
                expected: range.end,
                found: object.size,
            });
        }
        let poisoned =
            || StorageError::Other { url: self.store.url_of(&key), message: "a fill of this object panicked".into() };
        let gaps = missing(&object.present.lock().map_err(|_| poisoned())?, &range);
        if gaps.is_empty() {
            return Ok(());
        }
        // Gaps closer than FILL_GAP as one range, cut at the part size; `concurrency` parts a batch.
        let mut spans: Vec<Range<u64>> = Vec::with_capacity(gaps.len());
        for g in gaps {
            match spans.last_mut() {
                Some(last) if g.start <= last.end.saturating_add(FILL_GAP) => last.end = g.end,
                _ => spans.push(g),
            }
        }
        let part = (self.store.options().part_size as u64).max(1);
        let parts: Vec<Range<u64>> = spans
            .into_iter()
            .flat_map(|r| {
                let n = (r.end - r.start).div_ceil(part);
                (0..n).map(move |i| r.start + i * part..(r.start + (i + 1) * part).min(r.end))
            })
            .collect();
        let local = |source| StorageError::Local { path: object.path.clone(), source };
        let file = std::fs::OpenOptions::new().write(true).open(&object.path).map_err(local)?;
        for batch in parts.chunks(self.store.options().concurrency.max(1)) {
            let got = match self.store.read_ranges_within(&key, batch, 0) {
                Ok(got) => got,
                Err(e) => return Err(self.shortened(&key, batch, e)),
            };
            for (r, bytes) in batch.iter().zip(&got) {
                if (bytes.len() as u64) != r.end - r.start {
                    return Err(StorageError::Truncated {
                        url: self.store.url_of(&key),
                        expected: r.end,
                        found: r.start + bytes.len() as u64,
                    });
                }
                std::os::unix::fs::FileExt::write_all_at(&file, bytes, r.start).map_err(local)?;
            }
            let mut present = object.present.lock().map_err(|_| poisoned())?;
            for r in batch {
                insert(&mut present, r.clone());
            }
        }
        Ok(())
    }
}

impl SparseMirror {
    /// The error of a failed read of `batch` of the object `key`: [`StorageError::Truncated`] when the
    /// object is now shorter than the batch's end (stores answer a range past the end in their own ways:
    /// S3's 416 InvalidRange, a short body), else `e`.
    fn shortened(&self, key: &str, batch: &[Range<u64>], e: StorageError) -> StorageError {
        if matches!(e, StorageError::Truncated { .. }) {
            return e;
        }
        let end = batch.iter().map(|r| r.end).max().unwrap_or(0);
        match self.store.head(key) {
            Ok(Some(info)) if info.size < end => {
                StorageError::Truncated { url: self.store.url_of(key), expected: end, found: info.size }
            }
            _ => e,
        }
    }
}

impl RangeFill for SparseMirror {
    fn fill(&self, file: &str, range: Range<u64>) -> std::io::Result<()> {
        self.fill_range(file, range).map_err(|e| {
            let kind = match &e {
                StorageError::Truncated { .. } => std::io::ErrorKind::UnexpectedEof,
                StorageError::NotFound { .. } => std::io::ErrorKind::NotFound,
                _ => std::io::ErrorKind::Other,
            };
            std::io::Error::new(kind, e)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::storage::{PutCondition, StorageOptions};
    use bytes::Bytes;

    #[test]
    fn ranges_missing_and_merged() {
        let mut p = Vec::new();
        insert(&mut p, 10..20);
        insert(&mut p, 30..40);
        assert_eq!(missing(&p, &(0..50)), vec![0..10, 20..30, 40..50]);
        assert_eq!(missing(&p, &(12..18)), Vec::<Range<u64>>::new());
        assert_eq!(missing(&p, &(15..35)), vec![20..30]);
        insert(&mut p, 20..30);
        assert_eq!(p, vec![10..40]);
        insert(&mut p, 0..5);
        insert(&mut p, 45..50);
        insert(&mut p, 3..47);
        assert_eq!(p, vec![0..50]);
        insert(&mut p, 60..60);
        assert_eq!(p, vec![0..50]);
    }

    #[test]
    fn fills_fetch_each_byte_once() {
        let store = crate::storage::remote::tests::memory();
        let mut options = StorageOptions::default().with_concurrency(2);
        options.part_size = 1000;
        let store = store.with_options(&options);
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        store.put("d/x.distcp", Bytes::from(data.clone()), PutCondition::Overwrite).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("x.distcp");
        let mut mirror = SparseMirror::new(store.clone());
        mirror.add_sparse("d/x.distcp", data.len() as u64, &local).unwrap();
        let before = mirror.stats();
        mirror.fill("./d/x.distcp", 100..5100).unwrap();
        let after = mirror.stats();
        assert_eq!(after.bytes_read - before.bytes_read, 5000);
        assert_eq!(after.requests - before.requests, 5, "cut at the part size");
        // Already present: nothing fetched; a wider range fetches only what is missing.
        mirror.fill("d/x.distcp", 200..300).unwrap();
        assert_eq!(mirror.stats(), after);
        mirror.fill("d/x.distcp", 600_000..700_000).unwrap();
        mirror.fill("d/x.distcp", 0..800_000).unwrap();
        // 0..100 and 5100.. lie closer than FILL_GAP: fetched as one, 100..5100 again.
        assert_eq!(mirror.stats().bytes_read - before.bytes_read, 805_000);
        assert_eq!(mirror.present_bytes("d/x.distcp"), Some(800_000));
        let back = std::fs::read(&local).unwrap();
        assert!(back[..800_000] == data[..800_000]);
        assert!(back[800_000..].iter().all(|&b| b == 0), "nothing more fetched");
        // Unknown objects and ranges past the end are errors.
        let e = mirror.fill("nope", 0..1).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        let e = mirror.fill("d/x.distcp", 999_999..1_000_001).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_shortened_object_fails_the_fill() {
        let store = crate::storage::remote::tests::memory();
        store.put("x", Bytes::from(vec![7u8; 100]), PutCondition::Overwrite).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("x");
        let mut mirror = SparseMirror::new(store.clone());
        // Listed at 200 bytes; the object now holds 100.
        mirror.add_sparse("x", 200, &local).unwrap();
        let e = mirror.fill_range("x", 50..150).unwrap_err();
        assert!(matches!(e, StorageError::Truncated { found: 100, .. }), "{e}");
        assert_eq!(mirror.present_bytes("x"), Some(0), "nothing recorded as present");
        let part = dir.path().join("p");
        std::fs::write(&part, [0u8; 100]).unwrap();
        mirror.add_partial("x", 100, &part, [10..20, 15..30, 90..200]);
        assert_eq!(mirror.present_bytes("x"), Some(30));
        let before = mirror.stats();
        mirror.fill_range("x", 12..28).unwrap();
        assert_eq!(mirror.stats(), before, "present: nothing fetched");
        let whole = dir.path().join("w");
        mirror.add_present("w", 10, &whole);
        mirror.fill_range("w", 0..10).unwrap();
    }
}
