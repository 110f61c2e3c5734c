//! [`PartWriter`]: a [`DurableWriter`](crate::DurableWriter) whose bytes go to an object store's multipart
//! upload ([`PartSink`]) instead of a local file.
//!
//! Bytes are gathered into parts of the sink's part size; parts `1..` are sent as they fill (the sink keeps
//! a bounded number in flight), part 0 is kept until the end, when the patches of a header (a
//! safetensors header's checksums) are applied to it and it is sent with the completion. Memory: two
//! parts (the first and the one filling) plus what the sink has in flight. Chunk checksums are computed
//! as the bytes arrive, as for a file.

use std::io;
use std::path::{Path, PathBuf};

use crate::checksum::{ChunkHasher, FileDigest};
use crate::durability::Durability;
use crate::failpoint;

/// The parts of a [`DurableWriter`](crate::DurableWriter) writing to an object store: a multipart upload whose parts may be sent
/// in any order (`object_store`'s `MultipartStore`). The writer sends parts `1..` as they fill and part 0
/// (where a header's patches land) last, at [`PartSink::finish`]. Dropping a sink without finishing it
/// abandons the upload: nothing becomes visible.
pub trait PartSink: Send {
    /// The size of every part but the last (at least 5 MiB on S3).
    fn part_size(&self) -> usize;
    /// Sends part `index` (its place in the object: part 0 holds the first bytes, and is never sent here),
    /// returning once it is under way; blocks while the sink's bound of parts in flight is reached.
    ///
    /// # Errors
    /// The failure of this part or of an earlier one.
    fn send(&mut self, index: usize, part: Vec<u8>) -> io::Result<()>;
    /// Completes the object: `first` is part 0, `parts` the number of parts (1: `first` is the whole
    /// object, sent as one put).
    ///
    /// # Errors
    /// The failure of any part or of the completion; nothing becomes visible then.
    fn finish(self: Box<Self>, first: Vec<u8>, parts: usize) -> io::Result<()>;
}

/// The remote writer of a [`DurableWriter`](crate::DurableWriter).
pub(crate) struct PartWriter {
    sink: Option<Box<dyn PartSink>>,
    path: PathBuf,
    part_size: usize,
    /// Part 0, once full (kept until [`PartWriter::finish`]).
    first: Option<Vec<u8>>,
    /// The part being filled.
    current: Vec<u8>,
    /// The index of the part being filled.
    index: usize,
    pos: u64,
    hasher: Option<ChunkHasher>,
    patches: Vec<(u64, Vec<u8>)>,
    error: Option<(io::ErrorKind, String)>,
}

impl PartWriter {
    pub(crate) fn new(sink: Box<dyn PartSink>, path: PathBuf, options: Durability) -> PartWriter {
        let part_size = sink.part_size().max(1);
        PartWriter {
            sink: Some(sink),
            path,
            part_size,
            first: None,
            current: Vec::new(),
            index: 0,
            pos: 0,
            hasher: options.checksums.then(ChunkHasher::new),
            patches: Vec::new(),
            error: None,
        }
    }

    pub(crate) fn position(&self) -> u64 {
        self.pos
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn mark(&mut self, name: String) {
        if let Some(h) = self.hasher.as_mut() {
            h.mark(name, self.pos);
        }
    }

    pub(crate) fn patch(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let end = offset.checked_add(bytes.len() as u64);
        if end.is_none_or(|end| end > self.pos) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "patch past the bytes written"));
        }
        self.patches.push((offset, bytes.to_vec()));
        Ok(())
    }

    pub(crate) fn io_error(&self) -> Option<io::Error> {
        self.error.as_ref().map(|(kind, message)| io::Error::new(*kind, message.clone()))
    }

    fn fail(&mut self, e: io::Error) -> io::Error {
        if self.error.is_none() {
            self.error = Some((e.kind(), e.to_string()));
        }
        // Abandons the upload at once: the parts in flight are aborted with it.
        drop(self.sink.take());
        e
    }

    pub(crate) fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        if let Some(e) = self.io_error() {
            return Err(e);
        }
        match self.write_inner(data) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn write_inner(&mut self, mut data: &[u8]) -> io::Result<()> {
        if let Some(h) = self.hasher.as_mut() {
            h.update(data);
        }
        self.pos += data.len() as u64;
        while !data.is_empty() {
            if self.current.capacity() == 0 {
                self.current.reserve_exact(self.part_size);
            }
            let n = (self.part_size - self.current.len()).min(data.len());
            let (now, rest) = data.split_at(n);
            self.current.extend_from_slice(now);
            data = rest;
            if self.current.len() == self.part_size {
                let full = std::mem::take(&mut self.current);
                if self.index == 0 {
                    self.first = Some(full);
                } else {
                    failpoint::hit("file.write")?;
                    let sink = self.sink.as_mut().ok_or_else(|| io::Error::other("the upload was abandoned"))?;
                    sink.send(self.index, full)?;
                }
                self.index += 1;
            }
        }
        Ok(())
    }

    pub(crate) fn finish(mut self) -> io::Result<Option<FileDigest>> {
        if let Some(e) = self.io_error() {
            return Err(e);
        }
        match self.finish_inner() {
            Ok(()) => Ok(self.hasher.take().map(|h| h.finish(self.pos))),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn finish_inner(&mut self) -> io::Result<()> {
        let part = self.part_size as u64;
        let mut first = self.first.take();
        let mut last = std::mem::take(&mut self.current);
        let last_start = self.index as u64 * part;
        for (offset, bytes) in std::mem::take(&mut self.patches) {
            // Each patch lands in part 0 (kept) or the part still filling; a part already sent is gone.
            let (target, base) = match (&mut first, offset >= last_start) {
                (_, true) => (&mut last, last_start),
                (Some(f), false) if offset + bytes.len() as u64 <= part => (f, 0),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("a patch at byte {offset} lies in a part already sent to the object store"),
                    ));
                }
            };
            let at = usize::try_from(offset - base).map_err(io::Error::other)?;
            let end = at + bytes.len();
            target.get_mut(at..end).ok_or_else(|| io::Error::other("patch outside its part"))?.copy_from_slice(&bytes);
        }
        failpoint::hit("file.write")?;
        let mut sink = self.sink.take().ok_or_else(|| io::Error::other("the upload was abandoned"))?;
        let (first, parts) = match first {
            None => (last, 1),
            Some(first) => {
                if last.is_empty() {
                    (first, self.index)
                } else {
                    sink.send(self.index, last)?;
                    (first, self.index + 1)
                }
            }
        };
        failpoint::hit("file.sync")?;
        sink.finish(first, parts)?;
        failpoint::hit("file.synced")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// Parts received by index, and the completion.
    #[derive(Default)]
    struct Received {
        parts: Vec<(usize, Vec<u8>)>,
        completed: Option<usize>,
    }

    struct Recorder {
        part: usize,
        got: Arc<Mutex<Received>>,
        fail_at: Option<usize>,
    }

    impl PartSink for Recorder {
        fn part_size(&self) -> usize {
            self.part
        }
        fn send(&mut self, index: usize, part: Vec<u8>) -> io::Result<()> {
            if self.fail_at == Some(index) {
                return Err(io::Error::new(io::ErrorKind::ConnectionReset, "dropped"));
            }
            self.got.lock().unwrap().parts.push((index, part));
            Ok(())
        }
        fn finish(self: Box<Self>, first: Vec<u8>, parts: usize) -> io::Result<()> {
            let mut got = self.got.lock().unwrap();
            got.parts.push((0, first));
            got.completed = Some(parts);
            Ok(())
        }
    }

    fn written(sizes: &[usize], part: usize, patch: Option<(u64, &[u8])>) -> (Vec<u8>, Received) {
        let got = Arc::new(Mutex::new(Received::default()));
        let sink = Box::new(Recorder { part, got: Arc::clone(&got), fail_at: None });
        let mut w = crate::DurableWriter::to_parts(sink, "s3://b/x".into(), Durability::default());
        let mut expected = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let bytes: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
            w.write_all(&bytes).unwrap();
            expected.extend_from_slice(&bytes);
        }
        if let Some((at, bytes)) = patch {
            w.patch(at, bytes).unwrap();
            let at = at as usize;
            expected[at..at + bytes.len()].copy_from_slice(bytes);
        }
        assert_eq!(w.position(), expected.len() as u64);
        assert!(w.finish().unwrap().is_some(), "checksums computed");
        let got = std::mem::take(&mut *got.lock().unwrap());
        (expected, got)
    }

    fn joined(got: &Received) -> Vec<u8> {
        let mut parts = got.parts.clone();
        parts.sort_by_key(|(i, _)| *i);
        parts.into_iter().flat_map(|(_, p)| p).collect()
    }

    #[test]
    fn parts_in_order_first_last_patches_applied() {
        for sizes in [&[][..], &[3], &[10], &[25], &[7, 7, 7, 7], &[30, 1]] {
            let (expected, got) = written(sizes, 10, None);
            assert!(joined(&got) == expected, "{sizes:?}");
            assert_eq!(got.completed, Some(expected.len().div_ceil(10).max(1)), "{sizes:?}");
            assert_eq!(got.parts.last().map(|p| p.0), Some(0), "part 0 goes last");
            assert!(got.parts[..got.parts.len() - 1].iter().all(|(_, p)| p.len() == 10 || p.len() < 10));
        }
        let (expected, got) = written(&[25], 10, Some((2, b"ab")));
        assert!(joined(&got) == expected);
        let (expected, got) = written(&[25], 10, Some((21, b"z")));
        assert!(joined(&got) == expected, "a patch in the part still filling");
    }

    #[test]
    fn a_patch_in_a_sent_part_and_a_failed_part_fail() {
        let got = Arc::new(Mutex::new(Received::default()));
        let sink = Box::new(Recorder { part: 10, got: Arc::clone(&got), fail_at: None });
        let mut w = crate::DurableWriter::to_parts(sink, "s3://b/x".into(), Durability::default());
        w.write_all(&[1u8; 35]).unwrap();
        w.patch(12, b"x").unwrap();
        assert_eq!(w.finish().unwrap_err().kind(), io::ErrorKind::Unsupported);
        assert!(got.lock().unwrap().completed.is_none(), "nothing completed");

        let sink = Box::new(Recorder { part: 10, got: Arc::clone(&got), fail_at: Some(2) });
        let mut w = crate::DurableWriter::to_parts(sink, "s3://b/x".into(), Durability::default());
        let e = w.write_all(&[1u8; 35]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        assert_eq!(w.write_all(b"x").unwrap_err().kind(), io::ErrorKind::ConnectionReset, "sticky");
        assert!(w.io_error().is_some());
        assert!(w.finish().is_err());
    }
}
