//! [`DurableWriter`]: how bytes reach the disk in a durable commit.
//!
//! The writer gathers what it is given into 8 MiB, 4 KiB-aligned buffers (reused across saves). A file
//! that ends within the first buffer is written with one plain `write` (small files never pay for more).
//! Once a buffer fills, the writer switches the file to `O_DIRECT` and hands full buffers to a background
//! thread that `pwrite`s them while the caller fills the next one (three buffers in all): the copy into
//! the buffer replaces the kernel's copy into the page cache, the disk works while the caller serialises,
//! and the final `fdatasync` only has the metadata left to write. The last, partial buffer is padded to
//! the 4 KiB block and the file truncated back to its length.
//!
//! The buffers are shared by the process: at most six are allocated for writing ahead (48 MiB), however
//! many files are written at once. A writer that finds the budget spent waits for its own oldest buffer
//! instead (never for another writer's), so the memory of a save stays bounded when a directory format
//! writes many files in parallel. Idle buffers stay pooled for the next save
//! ([`release_idle_buffers`] frees them).
//!
//! Why `O_DIRECT` (measured, see `benches/README.md`): on the development VM a buffered 1 GiB save spent
//! 80% of its time in `copy_folio_from_iter_atomic` — first touch of page-cache pages the hypervisor had
//! taken back (free page reporting) — and took 0.9 to 9 s from run to run, while `O_DIRECT` from reused
//! buffers took 1.04 s every time. Where `O_DIRECT` is not supported (tmpfs, some FUSE and network file
//! systems: `EINVAL` when set or on the first write), or when [`Durability::direct_io`] is off, the
//! writer stays buffered: large writes go straight from the caller's slice to `write(2)`, and every 8 MiB
//! written is started towards the disk with `sync_file_range(SYNC_FILE_RANGE_WRITE)` so the final
//! `fdatasync` is short.
//!
//! Chunk checksums ([`DurableWriter::mark`]) are computed on the caller's thread, overlapped with the
//! background writes, on bytes still in the cache: each 128 KiB piece is hashed right after it is copied
//! into the write buffer, and a large buffered write is handed to `write(2)` in 1 MiB pieces, each hashed
//! just before.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::checksum::{ChunkHasher, FileDigest};
use crate::chunk::CHUNK;
use crate::durability::Durability;
use crate::failpoint;
use crate::part_writer::PartSink;

/// Alignment of `O_DIRECT` buffers, offsets and lengths.
const BLOCK: usize = 4096;
/// Buffers per writer: one being filled, up to two queued or being written.
const BUFFERS: usize = 3;
/// Copy-and-hash step (fits the L2 cache).
const HASH_PIECE: usize = 128 << 10;
/// Hash-then-write step of large buffered writes with checksums (fits the L2 cache).
const WRITE_HASH_PIECE: usize = 1 << 20;
/// Idle buffers kept for the next save (no first-touch cost then): enough for two writers at once (a
/// directory format writes its files in parallel, e.g. RecIS's data files on a 2-core machine). With three,
/// every RecIS save freed three buffers (`munmap`) and faulted three fresh ones in: about 14% of its time.
const POOL_MAX: usize = 2 * BUFFERS;
/// Buffers allocated in the process, beyond which a writer stops taking write-ahead buffers: the memory
/// of the writers stays at most 48 MiB (plus one buffer per open writer) however many files are written
/// at once. Two writers still have three buffers each; a third writes its buffers one at a time (it
/// still overlaps with the other two). Measured: `ckpt reshard` of a 2-rank DCP checkpoint to 3 ranks
/// held nine buffers (72 MiB) with three ranks writing at once, over its bound of largest tensor + 64 MiB.
const LIVE_MAX: usize = 2 * BUFFERS;

/// An owned, 4 KiB-aligned buffer of [`CHUNK`] bytes.
struct AlignedBuf {
    ptr: NonNull<u8>,
}

// SAFETY: the buffer is uniquely owned heap memory.
unsafe impl Send for AlignedBuf {}

static POOL: Mutex<Vec<AlignedBuf>> = Mutex::new(Vec::new());
/// Buffers allocated and not yet freed (in use or in the pool).
static LIVE: AtomicUsize = AtomicUsize::new(0);

impl AlignedBuf {
    fn layout() -> std::alloc::Layout {
        // CHUNK and BLOCK are non-zero powers of two.
        std::alloc::Layout::from_size_align(CHUNK, BLOCK).unwrap_or_else(|_| std::alloc::Layout::new::<u8>())
    }

    fn take() -> io::Result<AlignedBuf> {
        if let Some(b) = POOL.lock().ok().and_then(|mut p| p.pop()) {
            return Ok(b);
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(Self::layout()) };
        let buf = NonNull::new(ptr).map(|ptr| AlignedBuf { ptr });
        if buf.is_some() {
            LIVE.fetch_add(1, Ordering::Relaxed);
        }
        buf.ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))
    }

    /// A write-ahead buffer: one from the pool, or a new one while fewer than [`LIVE_MAX`] are allocated;
    /// `None` when the budget is spent (the caller then reuses its own buffer once it is written).
    fn take_ahead() -> Option<io::Result<AlignedBuf>> {
        if let Some(b) = POOL.lock().ok().and_then(|mut p| p.pop()) {
            return Some(Ok(b));
        }
        (LIVE.load(Ordering::Relaxed) < LIVE_MAX).then(AlignedBuf::take)
    }

    fn give_back(self) {
        if let Ok(mut p) = POOL.lock() {
            if p.len() < POOL_MAX {
                p.push(self);
            }
        }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to CHUNK bytes we own; u8 has no invalid values (the bytes may be stale data
        // of an earlier save, never uninitialised reads: only bytes written in this use are read).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), CHUNK) }
    }

    fn as_slice(&self, len: usize) -> &[u8] {
        // SAFETY: as above; len <= CHUNK by construction.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len.min(CHUNK)) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `take`.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout()) }
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Frees the idle write buffers the writers keep for the next save (up to 48 MiB after a large save), and
/// returns how many bytes that released. Call it after the last save of a long-lived process that wants
/// the memory back; the next save allocates fresh buffers (and pays their first touch).
///
/// ```
/// let freed = ckpt_io::release_idle_buffers();
/// assert_eq!(freed % ckpt_io::CHUNK, 0);
/// ```
pub fn release_idle_buffers() -> usize {
    let idle = POOL.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default();
    idle.len() * CHUNK
}

/// A write job for the background writer: `len` bytes of the buffer at file offset `offset`.
struct Job {
    buf: AlignedBuf,
    len: usize,
    offset: u64,
}

/// The background `O_DIRECT` writer.
struct Pipeline {
    submit: Option<SyncSender<Job>>,
    done: Receiver<(AlignedBuf, io::Result<()>)>,
    in_flight: usize,
    thread: Option<JoinHandle<()>>,
}

impl Pipeline {
    fn start(file: File) -> io::Result<Pipeline> {
        let (submit, jobs) = sync_channel::<Job>(BUFFERS);
        let (finished, done) = sync_channel(BUFFERS);
        let thread = std::thread::Builder::new().name("ckpt-direct-writer".into()).spawn(move || {
            let mut failed = false;
            for job in jobs {
                // After a failure, later jobs are returned unwritten (the commit is abandoned anyway).
                let r = if failed { Ok(()) } else { pwrite_all(&file, job.buf.as_slice(job.len), job.offset) };
                failed |= r.is_err();
                if finished.send((job.buf, r)).is_err() {
                    break;
                }
            }
        })?;
        Ok(Pipeline { submit: Some(submit), done, in_flight: 0, thread: Some(thread) })
    }

    /// Waits for one finished job; returns its buffer, or its error.
    fn reap_one(&mut self) -> io::Result<AlignedBuf> {
        let (buf, r) = self.done.recv().map_err(|_| io::Error::other("the background writer stopped"))?;
        self.in_flight -= 1;
        match r {
            Ok(()) => Ok(buf),
            Err(e) => {
                buf.give_back();
                Err(e)
            }
        }
    }

    fn stop(&mut self) {
        drop(self.submit.take());
        while self.in_flight > 0 {
            match self.done.recv() {
                Ok((buf, _)) => {
                    self.in_flight -= 1;
                    buf.give_back();
                }
                Err(_) => break,
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.stop();
    }
}

enum Mode {
    /// Nothing handed to the kernel yet: everything is in the first buffer.
    Pending,
    /// Plain `write(2)` at the file offset, `sync_file_range` behind it.
    Buffered,
    /// `O_DIRECT` through the background writer.
    Direct(Pipeline),
}

/// Bytes accepted by every [`DurableWriter`] of this process ([`bytes_written`]).
static WRITTEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes every [`DurableWriter`] of this process has accepted so far (monotonic): the meter a progress
/// display samples before a save and while it runs, since every format's writers write through one. Saves
/// running at the same time in one process add up.
///
/// ```
/// use std::io::Write;
/// let before = ckpt_io::bytes_written();
/// let dir = tempfile::tempdir().unwrap();
/// let mut commit = ckpt_io::FileCommit::create(&dir.path().join("f"), &Default::default()).unwrap();
/// commit.writer().write_all(&[0u8; 1000]).unwrap();
/// commit.commit().unwrap();
/// assert!(ckpt_io::bytes_written() - before >= 1000);
/// ```
pub fn bytes_written() -> u64 {
    WRITTEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// A writer that hands bytes to the kernel the fastest durable way the file system allows (see the
/// module documentation). Obtained from [`FileCommit::writer`](crate::FileCommit::writer) or a staged
/// file of a [`DirCommit`](crate::DirCommit); the commit finishes it. A destination on an object store
/// (feature `remote`) gets the same writer, sending its bytes as the parts of a multipart upload
/// ([`PartSink`]) instead of writing a local file.
///
/// After an I/O error every later write fails with the same error kind: the commit is abandoned.
pub struct DurableWriter {
    sink: Sink,
}

/// Where a [`DurableWriter`]'s bytes go.
enum Sink {
    Disk(DiskWriter),
    Remote(crate::part_writer::PartWriter),
}

/// The local file writer of a [`DurableWriter`].
struct DiskWriter {
    file: File,
    /// The path named in errors.
    path: PathBuf,
    options: Durability,
    mode: Mode,
    buf: Option<AlignedBuf>,
    filled: usize,
    /// Bytes accepted so far (the logical file length).
    pos: u64,
    /// Bytes handed to the kernel so far (the offset of the buffer being filled).
    handed: u64,
    /// Buffered mode: bytes already started towards the disk with `sync_file_range`.
    started: u64,
    /// The first I/O error, kept to fail every later call.
    error: Option<(io::ErrorKind, Option<i32>, String)>,
    hasher: Option<ChunkHasher>,
    /// Bytes to overwrite at offsets already written, applied before the final sync ([`DurableWriter::patch`]).
    patches: Vec<(u64, Vec<u8>)>,
}

impl std::fmt::Debug for DurableWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableWriter")
            .field("path", &self.path())
            .field("pos", &self.position())
            .field("remote", &matches!(self.sink, Sink::Remote(_)))
            .finish_non_exhaustive()
    }
}

impl DurableWriter {
    pub(crate) fn new(file: File, path: PathBuf, options: Durability) -> DurableWriter {
        DurableWriter { sink: Sink::Disk(DiskWriter::new(file, path, options)) }
    }

    /// A writer whose bytes go to `sink` as parts of `sink.part_size()` bytes (an object store's multipart
    /// upload), named `path` in errors. Checksums are computed as for a file.
    pub fn to_parts(sink: Box<dyn PartSink>, path: PathBuf, options: Durability) -> DurableWriter {
        DurableWriter { sink: Sink::Remote(crate::part_writer::PartWriter::new(sink, path, options)) }
    }

    /// Bytes written so far: the offset the next byte will have in the file.
    pub fn position(&self) -> u64 {
        match &self.sink {
            Sink::Disk(w) => w.pos,
            Sink::Remote(w) => w.position(),
        }
    }

    /// Starts a new checksum chunk named `name` at the current position (the previous chunk ends
    /// here). Format writers mark each item (a tensor chunk, a record) so that the checksum manifest names
    /// byte ranges readers can check on their own. Bytes before the first mark form a chunk named `""`.
    /// Does nothing when checksums are off.
    pub fn mark(&mut self, name: impl Into<String>) {
        match &mut self.sink {
            Sink::Disk(w) => w.mark(name.into()),
            Sink::Remote(w) => w.mark(name.into()),
        }
    }

    /// Overwrites `bytes` at `offset` of what was already written, before the file is synced and committed:
    /// for a header whose fixed-width placeholder (a checksum of the data after it) is only known at the
    /// end. Chunk checksums ([`DurableWriter::mark`]) keep the bytes first written, so a patched range should
    /// not be covered by them (the safetensors writer, the one user, writes without chunk checksums). On an
    /// object store, a patch must lie within the first part (a header), which is sent last.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] when the range reaches past what was written.
    pub fn patch(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        match &mut self.sink {
            Sink::Disk(w) => w.patch(offset, bytes),
            Sink::Remote(w) => w.patch(offset, bytes),
        }
    }

    /// The path errors name.
    pub fn path(&self) -> &std::path::Path {
        match &self.sink {
            Sink::Disk(w) => &w.path,
            Sink::Remote(w) => w.path(),
        }
    }

    /// Whether the writer has failed with an I/O error, and which.
    pub fn io_error(&self) -> Option<io::Error> {
        match &self.sink {
            Sink::Disk(w) => w.io_error(),
            Sink::Remote(w) => w.io_error(),
        }
    }

    /// Writes what is buffered, waits for the background writer, trims the `O_DIRECT` padding and
    /// `fdatasync`s (when syncing), and closes the file; on an object store, sends the last parts and
    /// completes the upload. Returns its checksum digest (when computed).
    pub(crate) fn finish(self) -> io::Result<Option<FileDigest>> {
        match self.sink {
            Sink::Disk(w) => w.finish(),
            Sink::Remote(w) => w.finish(),
        }
    }
}

impl Write for DurableWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write_all(data).map(|()| data.len())
    }

    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        WRITTEN.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        match &mut self.sink {
            Sink::Disk(w) => w.write_all(data),
            Sink::Remote(w) => w.write_all(data),
        }
    }

    /// Does nothing: data reaches the kernel in whole buffers (or the store in whole parts), and the disk
    /// at the commit.
    fn flush(&mut self) -> io::Result<()> {
        match self.io_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl DiskWriter {
    fn new(file: File, path: PathBuf, options: Durability) -> DiskWriter {
        DiskWriter {
            file,
            path,
            options,
            mode: Mode::Pending,
            buf: None,
            filled: 0,
            pos: 0,
            handed: 0,
            started: 0,
            error: None,
            hasher: options.checksums.then(ChunkHasher::new),
            patches: Vec::new(),
        }
    }

    fn mark(&mut self, name: String) {
        if let Some(h) = self.hasher.as_mut() {
            h.mark(name, self.pos);
        }
    }

    fn patch(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let end = offset.checked_add(bytes.len() as u64);
        if end.is_none_or(|end| end > self.pos) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "patch past the bytes written"));
        }
        self.patches.push((offset, bytes.to_vec()));
        Ok(())
    }

    fn io_error(&self) -> Option<io::Error> {
        self.error.as_ref().map(|(kind, raw, msg)| match raw {
            Some(n) => io::Error::from_raw_os_error(*n),
            None => io::Error::new(*kind, msg.clone()),
        })
    }

    fn fail(&mut self, e: io::Error) -> io::Error {
        if self.error.is_none() {
            self.error = Some((e.kind(), e.raw_os_error(), e.to_string()));
        }
        e
    }

    fn check(&self) -> io::Result<()> {
        match self.io_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn buffer(&mut self) -> io::Result<&mut AlignedBuf> {
        if self.buf.is_none() {
            self.buf = Some(AlignedBuf::take()?);
        }
        self.buf.as_mut().ok_or_else(|| io::Error::other("no buffer"))
    }

    /// Hands the full buffer to the kernel.
    fn flush_full(&mut self) -> io::Result<()> {
        failpoint::hit("file.write")?;
        let Some(buf) = self.buf.take() else { return Ok(()) };
        let len = self.filled;
        if matches!(self.mode, Mode::Pending) {
            self.mode = Mode::Buffered;
            if self.options.direct_io && len == CHUNK && self.handed == 0 && set_direct(&self.file, true).is_ok() {
                // The first direct write is synchronous: EINVAL means the file system (or its block size)
                // does not allow O_DIRECT here, and the writer falls back to buffered writes.
                match pwrite_all(&self.file, buf.as_slice(len), 0) {
                    Ok(()) => {
                        self.handed = len as u64;
                        self.filled = 0;
                        self.buf = Some(buf);
                        let clone = self.file.try_clone()?;
                        self.mode = Mode::Direct(Pipeline::start(clone)?);
                        return Ok(());
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        set_direct(&self.file, false)?;
                    }
                    Err(e) => {
                        self.buf = Some(buf);
                        return Err(e);
                    }
                }
            }
        }
        match &mut self.mode {
            Mode::Direct(p) => {
                // Waiting for this writer's own oldest buffer never waits on another writer: no deadlock
                // however many writers share the budget.
                let ahead = if p.in_flight + 1 >= BUFFERS { None } else { AlignedBuf::take_ahead() };
                let next = match ahead {
                    Some(b) => Some(b?),
                    None if p.in_flight > 0 => Some(p.reap_one()?),
                    // Nothing in flight and the budget spent: write this buffer now and fill it again.
                    None => None,
                };
                match next {
                    Some(next) => {
                        let submit =
                            p.submit.as_ref().ok_or_else(|| io::Error::other("the background writer stopped"))?;
                        submit
                            .send(Job { buf, len, offset: self.handed })
                            .map_err(|_| io::Error::other("the background writer stopped"))?;
                        p.in_flight += 1;
                        self.buf = Some(next);
                    }
                    None => {
                        let r = pwrite_all(&self.file, buf.as_slice(len), self.handed);
                        self.buf = Some(buf);
                        r?;
                    }
                }
            }
            _ => {
                let r = pwrite_all(&self.file, buf.as_slice(len), self.handed);
                self.buf = Some(buf);
                r?;
            }
        }
        self.handed += len as u64;
        self.filled = 0;
        self.start_writeback();
        Ok(())
    }

    /// Writes the filled part of the buffer with a plain `pwrite` (buffered mode, or the end of a small
    /// file).
    fn write_partial(&mut self) -> io::Result<()> {
        if self.filled == 0 {
            return Ok(());
        }
        let Some(buf) = self.buf.take() else { return Ok(()) };
        let r = pwrite_all(&self.file, buf.as_slice(self.filled), self.handed);
        self.buf = Some(buf);
        r?;
        self.handed += self.filled as u64;
        self.filled = 0;
        Ok(())
    }

    /// Buffered mode: starts writeback of everything handed to the kernel since the last call, in
    /// [`CHUNK`] steps, without waiting.
    fn start_writeback(&mut self) {
        if !self.options.sync || !matches!(self.mode, Mode::Buffered) {
            return;
        }
        if self.handed - self.started >= CHUNK as u64 {
            start_range(&self.file, self.started, self.handed - self.started);
            self.started = self.handed;
        }
    }

    fn write_inner(&mut self, mut data: &[u8]) -> io::Result<()> {
        self.pos += data.len() as u64;
        // Buffered: large writes go straight from the caller's memory to the kernel.
        if matches!(self.mode, Mode::Buffered) && data.len() >= CHUNK {
            self.write_partial()?;
            // With checksums, write in pieces that fit the L2 cache, each hashed right before `write(2)`
            // reads it: one pass over cold memory instead of two.
            let piece = if self.hasher.is_some() { WRITE_HASH_PIECE } else { CHUNK };
            while !data.is_empty() {
                failpoint::hit("file.write")?;
                let n = data.len().min(piece);
                let (now, rest) = data.split_at(n);
                if let Some(h) = self.hasher.as_mut() {
                    h.update(now);
                }
                pwrite_all(&self.file, now, self.handed)?;
                self.handed += n as u64;
                data = rest;
                self.start_writeback();
            }
            return Ok(());
        }
        while !data.is_empty() {
            let filled = self.filled;
            self.buffer()?;
            let Some(buf) = self.buf.as_mut().map(AlignedBuf::as_mut) else {
                return Err(io::Error::other("no buffer"));
            };
            let room = CHUNK - filled;
            let n = room.min(data.len());
            let (now, rest) = data.split_at(n);
            if let Some(dst) = buf.get_mut(filled..filled + n) {
                match self.hasher.as_mut() {
                    None => dst.copy_from_slice(now),
                    Some(h) => {
                        // Copy and hash in cache-sized pieces: the hash reads the copy while it is still in
                        // the cache, instead of reading the caller's memory a second time.
                        for (d, s) in dst.chunks_mut(HASH_PIECE).zip(now.chunks(HASH_PIECE)) {
                            d.copy_from_slice(s);
                            h.update(d);
                        }
                    }
                }
            }
            self.filled += n;
            data = rest;
            if self.filled == CHUNK {
                self.flush_full()?;
            }
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<Option<FileDigest>> {
        self.check()?;
        let r = self.finish_inner();
        if let Err(e) = r {
            return Err(self.fail(e));
        }
        let digest = self.hasher.take().map(|h| h.finish(self.pos));
        if let Some(b) = self.buf.take() {
            b.give_back();
        }
        Ok(digest)
    }

    fn finish_inner(&mut self) -> io::Result<()> {
        let filled = self.filled;
        if let Mode::Direct(_) = self.mode {
            if filled > 0 {
                failpoint::hit("file.write")?;
                let padded = filled.div_ceil(BLOCK) * BLOCK;
                let buf = self.buffer()?.as_mut();
                if let Some(pad) = buf.get_mut(filled..padded) {
                    pad.fill(0);
                }
                let Mode::Direct(p) = &mut self.mode else { return Ok(()) };
                let buf = self.buf.take().ok_or_else(|| io::Error::other("no buffer"))?;
                let submit = p.submit.as_ref().ok_or_else(|| io::Error::other("the background writer stopped"))?;
                submit
                    .send(Job { buf, len: padded, offset: self.handed })
                    .map_err(|_| io::Error::other("the background writer stopped"))?;
                p.in_flight += 1;
            }
            let Mode::Direct(p) = &mut self.mode else { return Ok(()) };
            let mut first_err = None;
            while p.in_flight > 0 {
                match p.reap_one() {
                    Ok(b) => b.give_back(),
                    Err(e) => first_err = first_err.or(Some(e)),
                }
            }
            p.stop();
            if let Some(e) = first_err {
                return Err(e);
            }
            self.handed += filled as u64;
            self.filled = 0;
            if self.handed % BLOCK as u64 != 0 {
                self.file.set_len(self.handed)?;
            }
        } else if filled > 0 {
            failpoint::hit("file.write")?;
            self.write_partial()?;
        }
        if !self.patches.is_empty() {
            // Small, unaligned writes: never through O_DIRECT.
            if matches!(self.mode, Mode::Direct(_)) {
                set_direct(&self.file, false)?;
            }
            for (offset, bytes) in std::mem::take(&mut self.patches) {
                failpoint::hit("file.write")?;
                pwrite_all(&self.file, &bytes, offset)?;
            }
        }
        if self.options.sync {
            failpoint::hit("file.sync")?;
            fdatasync(&self.file)?;
            failpoint::hit("file.synced")?;
        }
        Ok(())
    }
}

impl DiskWriter {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.check()?;
        match self.write_inner(data) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(e)),
        }
    }
}

impl Drop for DiskWriter {
    fn drop(&mut self) {
        if let Mode::Direct(p) = &mut self.mode {
            p.stop();
        }
        if let Some(b) = self.buf.take() {
            b.give_back();
        }
    }
}

fn pwrite_all(file: &File, mut data: &[u8], mut offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    while !data.is_empty() {
        match file.write_at(data, offset) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => {
                data = data.get(n..).unwrap_or_default();
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Turns `O_DIRECT` on or off for the open file (Linux allows it through `F_SETFL`).
#[cfg(target_os = "linux")]
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on an fd we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on { flags | libc::O_DIRECT } else { flags & !libc::O_DIRECT };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn set_direct(_file: &File, on: bool) -> io::Result<()> {
    if on { Err(io::Error::from_raw_os_error(libc::EINVAL)) } else { Ok(()) }
}

/// Starts writeback of a byte range without waiting (best effort).
#[cfg(target_os = "linux")]
fn start_range(file: &File, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    // SAFETY: sync_file_range on an fd we own; failure only loses the head start.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
fn start_range(_file: &File, _offset: u64, _len: u64) {}

/// `fdatasync(2)`: the data and the metadata needed to read it back (size, allocation).
pub(crate) fn fdatasync(file: &File) -> io::Result<()> {
    file.sync_data()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn pattern(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn roundtrip(options: Durability, pieces: &[usize]) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        let mut w = DurableWriter::new(file, path.clone(), options);
        let mut expected = Vec::new();
        for (i, &n) in pieces.iter().enumerate() {
            let p = pattern(n, i as u64 + 7);
            w.write_all(&p).unwrap();
            expected.extend_from_slice(&p);
        }
        assert_eq!(w.position(), expected.len() as u64);
        w.finish().unwrap();
        let back = std::fs::read(&path).unwrap();
        assert_eq!(back.len(), expected.len());
        assert!(back == expected, "contents differ");
    }

    #[test]
    fn every_size_and_mode_round_trips() {
        for direct_io in [true, false] {
            let o = Durability { direct_io, ..Durability::default() };
            roundtrip(o, &[]);
            roundtrip(o, &[1]);
            roundtrip(o, &[100, 5000, 3]);
            roundtrip(o, &[CHUNK]);
            roundtrip(o, &[CHUNK - 1, 1, 1]);
            roundtrip(o, &[3 * CHUNK + 17]);
            roundtrip(o, &[10, 2 * CHUNK, 4095, CHUNK + 4096, 1 << 20, 12345]);
        }
        roundtrip(Durability { sync: false, ..Durability::default() }, &[CHUNK + 5]);
    }

    #[test]
    fn errors_are_sticky() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // A read-only descriptor: every write fails with EBADF.
        File::create(&path).unwrap();
        let file = File::open(&path).unwrap();
        let mut w = DurableWriter::new(file, path, Durability::default());
        w.write_all(&[1u8; 10]).unwrap(); // buffered, nothing handed to the kernel yet
        let e = w.write_all(&vec![0u8; CHUNK]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        assert_eq!(w.write_all(b"x").unwrap_err().raw_os_error(), Some(libc::EBADF));
        assert!(w.io_error().is_some());
        assert!(w.finish().is_err());
    }
}
