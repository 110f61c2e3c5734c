//! [`ObjectUpload`]: one object written straight to a store, part by part, as a
//! [`DurableWriter`](crate::DurableWriter) produces it.
//!
//! An object of one part is one put. A larger one is a multipart upload through the store's
//! `MultipartStore` interface, whose parts may be sent in any order: parts `1..` go as they fill, at most
//! `concurrency` at a time (the writer blocks beyond that, so memory stays within `concurrency × part_size`
//! plus the writer's two parts), and part 0 last, with the completion. A multipart upload becomes visible
//! only when completed, whole; one abandoned (an error, a drop) is aborted, so nothing of it is seen.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use object_store::multipart::{MultipartStore, PartId};
use object_store::{MultipartId, PutPayload};
use tokio::task::JoinHandle;

use super::{PutCondition, StorageError, Store};
use crate::part_writer::PartSink;

impl Store {
    /// A streaming upload of the object `name` ([`ObjectUpload`]): the sink of a
    /// [`DurableWriter`](crate::DurableWriter) writing straight to the store.
    pub fn upload(&self, name: &str) -> ObjectUpload {
        ObjectUpload::new(self.clone(), name)
    }
}

/// A part on its way: its index and the task sending it.
type InFlight = (usize, JoinHandle<Result<PartId, object_store::Error>>);

/// The streaming upload of one object ([`Store::upload`]); a [`PartSink`] for
/// [`DurableWriter::to_parts`](crate::DurableWriter::to_parts).
pub struct ObjectUpload {
    store: Store,
    name: String,
    part_size: usize,
    /// The multipart upload, once the first part beyond part 0 is sent.
    started: Option<(Arc<dyn MultipartStore>, MultipartId)>,
    in_flight: VecDeque<InFlight>,
    sent: Vec<(usize, PartId)>,
    completed: bool,
}

impl std::fmt::Debug for ObjectUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectUpload")
            .field("url", &self.store.url_of(&self.name))
            .field("parts_sent", &self.sent.len())
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

fn io_error(e: StorageError) -> io::Error {
    io::Error::other(e)
}

impl ObjectUpload {
    pub(crate) fn new(store: Store, name: &str) -> ObjectUpload {
        // S3 refuses parts under 5 MiB (but the last).
        let part_size = store.options().part_size.max(5 << 20);
        ObjectUpload {
            store,
            name: name.to_owned(),
            part_size,
            started: None,
            in_flight: VecDeque::new(),
            sent: Vec::new(),
            completed: false,
        }
    }

    /// The URL of the object, redacted.
    pub fn url(&self) -> String {
        self.store.url_of(&self.name)
    }

    fn start(&mut self) -> Result<(Arc<dyn MultipartStore>, MultipartId), StorageError> {
        if let Some((m, id)) = &self.started {
            return Ok((Arc::clone(m), id.clone()));
        }
        let Some(m) = self.store.multipart_store().cloned() else {
            return Err(StorageError::NotSupported {
                url: self.url(),
                message: "objects larger than one part need a store with multipart uploads".into(),
            });
        };
        self.store.count_request();
        let path = self.store.object_path(&self.name);
        let id = self.store.block_on(m.create_multipart(&path)).map_err(|e| self.store.classify(&self.name, e))?;
        self.started = Some((Arc::clone(&m), id.clone()));
        Ok((m, id))
    }

    fn spawn(&mut self, index: usize, part: Vec<u8>) -> Result<(), StorageError> {
        let (m, id) = self.start()?;
        let path = self.store.object_path(&self.name);
        let len = part.len() as u64;
        self.store.count_request();
        let store = self.store.clone();
        let task = self.store.runtime().spawn(async move {
            let r = m.put_part(&path, &id, index, PutPayload::from_bytes(Bytes::from(part))).await;
            if r.is_ok() {
                store.count_written(len);
            }
            r
        });
        self.in_flight.push_back((index, task));
        Ok(())
    }

    /// Waits for the oldest part in flight.
    fn reap_one(&mut self) -> Result<(), StorageError> {
        let Some((index, task)) = self.in_flight.pop_front() else { return Ok(()) };
        let joined = self.store.block_on(task).map_err(|e| StorageError::Other {
            url: self.url(),
            message: format!("the upload of part {index} stopped: {e}"),
        })?;
        let id = joined.map_err(|e| self.store.classify(&self.name, e))?;
        self.sent.push((index, id));
        Ok(())
    }

    fn finish_inner(&mut self, first: Vec<u8>, parts: usize) -> Result<(), StorageError> {
        if parts <= 1 && self.started.is_none() {
            self.store.put(&self.name, Bytes::from(first), PutCondition::Overwrite)?;
            self.store.count_completed();
            self.completed = true;
            return Ok(());
        }
        self.spawn(0, first)?;
        while !self.in_flight.is_empty() {
            self.reap_one()?;
        }
        self.sent.sort_by_key(|(i, _)| *i);
        let complete = self.sent.len() == parts && self.sent.iter().enumerate().all(|(n, (i, _))| n == *i);
        if !complete {
            return Err(StorageError::Other {
                url: self.url(),
                message: format!("{} of {parts} parts were sent", self.sent.len()),
            });
        }
        let (m, id) = self.start()?;
        let ids: Vec<PartId> = self.sent.iter().map(|(_, p)| p.clone()).collect();
        let path = self.store.object_path(&self.name);
        self.store.count_request();
        self.store.block_on(m.complete_multipart(&path, &id, ids)).map_err(|e| self.store.classify(&self.name, e))?;
        self.store.count_completed();
        self.completed = true;
        Ok(())
    }
}

impl PartSink for ObjectUpload {
    fn part_size(&self) -> usize {
        self.part_size
    }

    fn send(&mut self, index: usize, part: Vec<u8>) -> io::Result<()> {
        while self.in_flight.len() >= self.store.options().concurrency.max(1) {
            self.reap_one().map_err(io_error)?;
        }
        self.spawn(index, part).map_err(io_error)
    }

    fn finish(mut self: Box<Self>, first: Vec<u8>, parts: usize) -> io::Result<()> {
        self.finish_inner(first, parts).map_err(io_error)
    }
}

impl Drop for ObjectUpload {
    fn drop(&mut self) {
        for (_, task) in self.in_flight.drain(..) {
            task.abort();
        }
        if self.completed {
            return;
        }
        if let Some((m, id)) = self.started.take() {
            let path = self.store.object_path(&self.name);
            self.store.count_request();
            let _ = self.store.block_on(m.abort_multipart(&path, &id));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::super::{Location, StorageOptions};
    use super::*;
    use crate::{Durability, DurableWriter};
    use std::io::Write;

    fn memory(part: usize) -> Store {
        let Location::Remote(url) = Location::parse("memory://t/dst").unwrap() else { panic!() };
        let mem = Arc::new(object_store::memory::InMemory::new());
        let options = StorageOptions::default().with_part_size(part).with_concurrency(2);
        Store::from_parts(mem.clone(), object_store::path::Path::from("dst"), url, &options)
            .unwrap()
            .with_multipart(mem)
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 253) as u8).collect()
    }

    #[test]
    fn streamed_objects_round_trip_and_patch_the_first_part() {
        let store = memory(5 << 20);
        for (name, size) in [("small", 1000usize), ("one", 5 << 20), ("big", (12 << 20) + 3)] {
            let mut w = DurableWriter::to_parts(Box::new(store.upload(name)), name.into(), Durability::default());
            let mut data = pattern(size);
            for piece in data.chunks(777_777) {
                w.write_all(piece).unwrap();
            }
            w.patch(3, b"HDR").unwrap();
            data[3..6].copy_from_slice(b"HDR");
            assert!(w.finish().unwrap().is_some());
            let back = store.read(name, 0..size as u64).unwrap();
            assert!(back[..] == data[..], "{name}");
        }
        assert_eq!(store.stats().bytes_written, 1000 + (5 << 20) + (12 << 20) + 3);
    }

    #[test]
    fn an_abandoned_upload_leaves_nothing() {
        let store = memory(5 << 20);
        let mut w = DurableWriter::to_parts(Box::new(store.upload("gone")), "gone".into(), Durability::default());
        w.write_all(&pattern(11 << 20)).unwrap();
        drop(w);
        assert!(store.head("gone").unwrap().is_none());
        assert!(store.list().unwrap().is_empty());
    }

    #[test]
    fn a_store_without_multipart_takes_one_part_objects_only() {
        let Location::Remote(url) = Location::parse("memory://t/dst").unwrap() else { panic!() };
        let options = StorageOptions::default().with_part_size(5 << 20);
        let store = Store::from_parts(
            Arc::new(object_store::memory::InMemory::new()),
            object_store::path::Path::from("dst"),
            url,
            &options,
        )
        .unwrap();
        let mut w = DurableWriter::to_parts(Box::new(store.upload("a")), "a".into(), Durability::default());
        w.write_all(b"small").unwrap();
        w.finish().unwrap();
        let mut w = DurableWriter::to_parts(Box::new(store.upload("b")), "b".into(), Durability::default());
        let e = w.write_all(&pattern(11 << 20)).unwrap_err();
        let storage = e.get_ref().and_then(|e| e.downcast_ref::<StorageError>());
        assert!(matches!(storage, Some(StorageError::NotSupported { .. })), "{e}");
    }
}
