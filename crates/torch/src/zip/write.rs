//! Writer reproducing `PyTorchStreamWriter`'s miniz output byte for byte.

use std::collections::HashSet;
use std::io::Write;

use super::sid::{combined_name_hash, hash_combine};
use super::{
    CENTRAL_HEADER_SIG, DATA_DESCRIPTOR_SIG, DEFAULT_ALIGNMENT, EOCD_SIG, FLAG_DATA_DESCRIPTOR, FLAG_UTF8,
    LOCAL_HEADER_LEN, LOCAL_HEADER_SIG, MAX_ALIGNMENT, SERIALIZATION_ID_RECORD, U32_SENTINEL, ZIP64_EOCD_LEN,
    ZIP64_EOCD_SIG, ZIP64_EXTRA_ID, ZIP64_LOCATOR_SIG, ZipError, padding_len, torch_data_offset, zip64_local_extra_len,
};

/// Records of at least this many bytes get their CRC-32 computed on a second thread, overlapped with the
/// write.
const PARALLEL_CRC_MIN: u64 = 4 << 20;

/// Options of a [`ZipWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// Data alignment in bytes, relative to the writer's start (torch:
    /// `torch.utils.serialization.config.save.storage_alignment`, default 64). 1 to
    /// [`MAX_ALIGNMENT`](super::MAX_ALIGNMENT); need not be a power of two.
    pub alignment: u64,
    /// Compute CRC-32s (default `true`). `false` writes 0 into every descriptor and central entry,
    /// like `torch.serialization.set_crc32_options(False)`.
    pub compute_crc32: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions { alignment: DEFAULT_ALIGNMENT, compute_crc32: true }
    }
}

/// Where a streamed record's pieces go, in order ([`ZipWriter::write_record_streamed`]).
pub type Sink<'a> = dyn FnMut(&[u8]) -> std::io::Result<()> + 'a;

/// Makes a streamed record's data: hands every piece, in order, to the sink it is given.
pub type Producer<'a> = dyn FnMut(&mut Sink<'_>) -> std::io::Result<()> + 'a;

/// The data of a record: slices written back to back, or pieces made as they are written.
enum Body<'a> {
    Parts(&'a [&'a [u8]]),
    Streamed(&'a mut Producer<'a>),
}

/// What the central directory needs to know about a written record.
#[derive(Debug)]
struct Entry {
    full_name: String,
    crc32: u32,
    size: u64,
    local_header_offset: u64,
    flags: u16,
}

/// Streaming writer of torch ZIP archives (stored records only), byte-identical to torch's
/// `PyTorchStreamWriter` for the same sequence of records.
///
/// Offsets are counted from the first byte this writer writes (torch does the same, so an archive
/// can be embedded in a larger stream, e.g. a DCP `.distcp` file). The writer never seeks. It does
/// not add records on its own: unlike `PyTorchStreamWriter::writeEndOfFile`, [`finish`](Self::finish)
/// writes no `version`, `byteorder` or `.data/serialization_id` record; write them (e.g. with
/// [`write_serialization_id`](Self::write_serialization_id)) before finishing.
///
/// Unlike torch's `writeRecord`, which silently ignores a `.data/serialization_id` record written
/// before `writeEndOfFile`, [`write_record`](Self::write_record) writes whatever it is given.
///
/// After an I/O error the writer is poisoned: every later call returns [`ZipError::Poisoned`].
#[derive(Debug)]
pub struct ZipWriter<W: Write> {
    out: W,
    prefix: String,
    opts: WriterOptions,
    /// Bytes written so far (visible to the tests, which move it to provoke overflows).
    pub(super) pos: u64,
    entries: Vec<Entry>,
    names: HashSet<String>,
    /// torch's `combined_uncomp_crc32_`.
    combined_crc: u64,
    poisoned: bool,
    /// Scratch buffer for headers (reused).
    buf: Vec<u8>,
    /// Called with the output and a record's full name before the record's local header is written, and
    /// with [`CENTRAL_DIRECTORY_MARK`] before the central directory.
    marker: Option<fn(&mut W, &str)>,
}

/// The name [`ZipWriter::set_record_marker`]'s marker is given before the central directory.
pub const CENTRAL_DIRECTORY_MARK: &str = "(central directory)";

fn put16(buf: &mut Vec<u8>, v: u16) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

/// `min(v, 0xFFFF_FFFF)` as u32 (miniz's `MZ_MIN(v, MZ_UINT32_MAX)`).
fn clamp32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Appends a zip64 extra field with the given values, if any (miniz
/// `mz_zip_writer_create_zip64_extra_data`: size, compressed size, local header offset).
fn put_zip64_extra(buf: &mut Vec<u8>, fields: &[u64]) {
    if fields.is_empty() {
        return;
    }
    put16(buf, ZIP64_EXTRA_ID);
    put16(buf, (fields.len() * 8) as u16);
    for &f in fields {
        put64(buf, f);
    }
}

impl<W: Write> ZipWriter<W> {
    /// Writer for records named `<prefix>/<name>`, data aligned to 64 bytes, CRC-32s computed.
    /// torch uses the file stem for paths and `"archive"` for buffers. An invalid prefix (empty, or
    /// containing `/` or `\`) makes the first write fail with [`ZipError::InvalidPrefix`].
    pub fn new(out: W, prefix: &str) -> Self {
        Self::with_options(out, prefix, WriterOptions::default())
    }

    /// Writer with explicit [`WriterOptions`]. An invalid alignment makes the first write fail with
    /// [`ZipError::InvalidAlignment`].
    pub fn with_options(out: W, prefix: &str, opts: WriterOptions) -> Self {
        ZipWriter {
            out,
            prefix: prefix.to_owned(),
            opts,
            pos: 0,
            entries: Vec::new(),
            names: HashSet::new(),
            combined_crc: 0,
            poisoned: false,
            buf: Vec::new(),
            marker: None,
        }
    }

    /// Calls `marker` with the output and each record's full name (`<prefix>/<name>`) just before the
    /// record's first byte, and with [`CENTRAL_DIRECTORY_MARK`] before the central directory: how a
    /// checksumming output ([`ckpt_io::DurableWriter::mark`]) learns where each record starts.
    pub fn set_record_marker(&mut self, marker: fn(&mut W, &str)) {
        self.marker = Some(marker);
    }

    /// Bytes written so far, i.e. the offset the next local header will have.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Turns CRC-32 computation on or off for the records written from now on (torch's
    /// `skip_data` writes real CRCs for metadata records and 0 for storages).
    pub fn set_compute_crc32(&mut self, on: bool) {
        self.opts.compute_crc32 = on;
    }

    /// The archive prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Offset at which the data of a record `name` of `size` bytes would start if it were written
    /// next (what `PyTorchStreamWriter::writeRecordMetadata` returns).
    pub fn next_data_offset(&self, name: &str, size: u64) -> Result<u64, ZipError> {
        let full_len = self.check_name(name)?;
        torch_data_offset(self.pos, full_len, size, self.opts.alignment)
            .ok_or(ZipError::TooLarge { what: "archive offset" })
    }

    /// Validates prefix, alignment and name; returns the full name's length.
    fn check_name(&self, name: &str) -> Result<u64, ZipError> {
        if self.prefix.is_empty() || self.prefix.contains(['/', '\\']) {
            return Err(ZipError::InvalidPrefix { prefix: self.prefix.clone() });
        }
        if self.opts.alignment == 0 || self.opts.alignment > MAX_ALIGNMENT {
            return Err(ZipError::InvalidAlignment { alignment: self.opts.alignment });
        }
        let len = self.prefix.len().saturating_add(1).saturating_add(name.len());
        if len > usize::from(u16::MAX) {
            return Err(ZipError::NameTooLong { name: name.to_owned(), len });
        }
        Ok(len as u64)
    }

    /// Writes one stored record named `<prefix>/<name>` (see [`write_record_parts`](Self::write_record_parts)).
    pub fn write_record(&mut self, name: &str, data: &[u8]) -> Result<(), ZipError> {
        self.write_record_parts(name, &[data])
    }

    /// Writes one stored record named `<prefix>/<name>` whose data is `parts` back to back: local
    /// header (flags `0x0808`, or `0x0800` for an empty record; zip64 extra if the size or the
    /// header offset is `>= 0xFFFF_FFFF`; `FB` padding extra so that the data is aligned), the parts
    /// straight from the slices (no staging copy), then the data descriptor (16 bytes, 24 with
    /// zip64, none for an empty record).
    pub fn write_record_parts(&mut self, name: &str, parts: &[&[u8]]) -> Result<(), ZipError> {
        let too_large = || ZipError::TooLarge { what: "archive offset" };
        let size = parts.iter().try_fold(0u64, |acc, p| acc.checked_add(p.len() as u64)).ok_or_else(too_large)?;
        self.write_record_body(name, size, Body::Parts(parts))
    }

    /// Writes one stored record named `<prefix>/<name>` of `size` bytes that `produce` makes piece by
    /// piece: it hands each piece, in order, to the sink it is given, which writes it at once (the bytes
    /// are never all in memory: a storage gathered on demand is written as it is made). The archive is
    /// the same as [`write_record`](Self::write_record) of the pieces back to back.
    ///
    /// # Errors
    /// As [`write_record_parts`](Self::write_record_parts); `produce`'s error, or [`ZipError::Io`] when it
    /// hands other than `size` bytes. The writer is poisoned after any of them.
    pub fn write_record_streamed(&mut self, name: &str, size: u64, produce: &mut Producer<'_>) -> Result<(), ZipError> {
        self.write_record_body(name, size, Body::Streamed(produce))
    }

    fn write_record_body(&mut self, name: &str, size: u64, body: Body<'_>) -> Result<(), ZipError> {
        if self.poisoned {
            return Err(ZipError::Poisoned);
        }
        let full_len = self.check_name(name)?;
        if self.names.contains(name) {
            return Err(ZipError::DuplicateName { name: name.to_owned() });
        }
        if self.entries.len() as u64 >= u64::from(u32::MAX) - 1 {
            return Err(ZipError::TooLarge { what: "number of records" });
        }
        let too_large = || ZipError::TooLarge { what: "archive offset" };
        let cursor = self.pos;
        let big_size = size >= U32_SENTINEL;
        let big_offset = cursor >= U32_SENTINEL;
        let pad = padding_len(cursor, full_len, size, self.opts.alignment).ok_or_else(too_large)?;
        let extra_len = zip64_local_extra_len(cursor, size) + 4 + pad;
        let extra_len16 =
            u16::try_from(extra_len).map_err(|_| ZipError::InvalidAlignment { alignment: self.opts.alignment })?;
        let pad16 = u16::try_from(pad).map_err(|_| ZipError::InvalidAlignment { alignment: self.opts.alignment })?;
        if let Some(mark) = self.marker {
            mark(&mut self.out, &format!("{}/{name}", self.prefix));
        }
        let descriptor_len: u64 = match (size, big_size || big_offset) {
            (0, _) => 0,
            (_, false) => 16,
            (_, true) => 24,
        };
        let header_len = LOCAL_HEADER_LEN + full_len + extra_len;
        let end = cursor
            .checked_add(header_len)
            .and_then(|v| v.checked_add(size))
            .and_then(|v| v.checked_add(descriptor_len))
            .ok_or_else(too_large)?;
        let flags = if size == 0 { FLAG_UTF8 } else { FLAG_UTF8 | FLAG_DATA_DESCRIPTOR };
        let full_name = format!("{}/{}", self.prefix, name);

        // Local header: version 0, method 0 (stored), time/date 0, CRC and sizes 0 (the data
        // descriptor carries them), then the name and the extra fields.
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        put32(&mut buf, LOCAL_HEADER_SIG);
        put16(&mut buf, 0); // version needed
        put16(&mut buf, flags);
        put16(&mut buf, 0); // method
        put16(&mut buf, 0); // time
        put16(&mut buf, 0); // date
        put32(&mut buf, 0); // crc
        put32(&mut buf, 0); // compressed size
        put32(&mut buf, 0); // uncompressed size
        put16(&mut buf, full_len as u16);
        put16(&mut buf, extra_len16);
        buf.extend_from_slice(full_name.as_bytes());
        let mut zip64 = Vec::with_capacity(3);
        if big_size {
            zip64.push(size);
            zip64.push(0); // compressed size is not known yet when miniz writes the header
        }
        if big_offset {
            zip64.push(cursor);
        }
        put_zip64_extra(&mut buf, &zip64);
        buf.extend_from_slice(b"FB");
        put16(&mut buf, pad16);
        buf.resize(buf.len().saturating_add(usize::from(pad16)), b'Z');

        let result = match body {
            Body::Parts(parts) => self.emit(&buf, parts, size, big_size || big_offset),
            Body::Streamed(produce) => self.emit_streamed(&buf, produce, size, big_size || big_offset),
        };
        self.buf = buf;
        let crc32 = match result {
            Ok(crc) => crc,
            Err(e) => {
                self.poisoned = true;
                return Err(e);
            }
        };
        self.pos = end;
        self.names.insert(name.to_owned());
        self.entries.push(Entry { full_name, crc32, size, local_header_offset: cursor, flags });
        Ok(())
    }

    /// Writes header, data and descriptor; returns the CRC recorded. Updates the combined CRC the
    /// way torch's write callback does (see [`serialization_id`](super::serialization_id)).
    fn emit(&mut self, header: &[u8], parts: &[&[u8]], size: u64, zip64: bool) -> Result<u32, ZipError> {
        self.out.write_all(header)?;
        // torch's callback treats any write of >= 8 bytes that starts with the descriptor
        // signature as a descriptor; miniz writes stored data in one call.
        let head: Vec<u8> = parts.iter().flat_map(|p| p.iter()).take(8).copied().collect();
        self.descriptor_quirk(&head);
        let crc = if self.opts.compute_crc32 && size >= PARALLEL_CRC_MIN {
            // Large records: the CRC-32 is computed on a second thread while the data is written, so the
            // checksum costs no time on the writing thread (torch computes it inline).
            let out = &mut self.out;
            std::thread::scope(|s| {
                let crc = s.spawn(|| {
                    let mut h = crc32fast::Hasher::new();
                    parts.iter().for_each(|p| h.update(p));
                    h.finalize()
                });
                let written = parts.iter().try_for_each(|p| out.write_all(p));
                let crc = crc.join().unwrap_or_else(|_| {
                    let mut h = crc32fast::Hasher::new();
                    parts.iter().for_each(|p| h.update(p));
                    h.finalize()
                });
                written.map(|()| crc)
            })?
        } else {
            let mut hasher = self.opts.compute_crc32.then(crc32fast::Hasher::new);
            for part in parts {
                if let Some(h) = hasher.as_mut() {
                    h.update(part);
                }
                self.out.write_all(part)?;
            }
            hasher.map_or(0, crc32fast::Hasher::finalize)
        };
        self.end_record(crc, size, zip64)
    }

    /// [`emit`](Self::emit) of a record whose data `produce` hands over piece by piece; the CRC-32 is
    /// computed inline, on each piece while it is in the cache.
    fn emit_streamed(
        &mut self,
        header: &[u8],
        produce: &mut Producer<'_>,
        size: u64,
        zip64: bool,
    ) -> Result<u32, ZipError> {
        self.out.write_all(header)?;
        let mut head = Vec::with_capacity(8);
        let mut hasher = self.opts.compute_crc32.then(crc32fast::Hasher::new);
        let mut written = 0u64;
        let out = &mut self.out;
        produce(&mut |piece: &[u8]| {
            if head.len() < 8 {
                head.extend(piece.iter().take(8 - head.len()));
            }
            if let Some(h) = hasher.as_mut() {
                h.update(piece);
            }
            written = written.saturating_add(piece.len() as u64);
            out.write_all(piece)
        })?;
        if written != size {
            return Err(std::io::Error::other(format!("a record of {size} bytes was made with {written}")).into());
        }
        self.descriptor_quirk(&head);
        self.end_record(hasher.map_or(0, crc32fast::Hasher::finalize), size, zip64)
    }

    /// torch's callback treats any write of >= 8 bytes that starts with the descriptor signature as a
    /// descriptor: the data's first 8 bytes then enter the combined CRC.
    fn descriptor_quirk(&mut self, head: &[u8]) {
        if let [s0, s1, s2, s3, c0, c1, c2, c3] = head {
            if u32::from_le_bytes([*s0, *s1, *s2, *s3]) == DATA_DESCRIPTOR_SIG {
                let quirk = u32::from_le_bytes([*c0, *c1, *c2, *c3]);
                self.combined_crc = hash_combine(self.combined_crc, u64::from(quirk));
            }
        }
    }

    /// Writes the data descriptor of a record of `size` bytes with CRC `crc`; returns the CRC.
    fn end_record(&mut self, crc: u32, size: u64, zip64: bool) -> Result<u32, ZipError> {
        if size > 0 {
            let mut d = Vec::with_capacity(24);
            put32(&mut d, DATA_DESCRIPTOR_SIG);
            put32(&mut d, crc);
            if zip64 {
                put64(&mut d, size);
                put64(&mut d, size);
            } else {
                put32(&mut d, clamp32(size));
                put32(&mut d, clamp32(size));
            }
            self.out.write_all(&d)?;
            self.combined_crc = hash_combine(self.combined_crc, u64::from(crc));
        }
        Ok(crc)
    }

    /// Full names and CRC-32s of the records written so far, in write order (CRC 0 when CRCs are
    /// disabled).
    pub fn record_crcs(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.entries.iter().map(|e| (e.full_name.as_str(), e.crc32))
    }

    /// The `.data/serialization_id` torch would write now, after the records written so far
    /// (see [`serialization_id`](super::serialization_id)).
    pub fn serialization_id(&self) -> String {
        let skip = self.prefix.len().saturating_add(1);
        let names = self.entries.iter().map(|e| e.full_name.get(skip..).unwrap_or_default());
        format!("{:020}{:020}", combined_name_hash(names), self.combined_crc)
    }

    /// Writes the `.data/serialization_id` record (as `writeEndOfFile` does, after `version` and
    /// `byteorder`) and returns its value.
    pub fn write_serialization_id(&mut self) -> Result<String, ZipError> {
        let id = self.serialization_id();
        self.write_record(SERIALIZATION_ID_RECORD, id.as_bytes())?;
        Ok(id)
    }

    /// Writes the central directory, the zip64 end of central directory record and locator, and
    /// the end of central directory record (always all three, as miniz does in zip64 mode), flushes
    /// and returns the inner writer.
    pub fn finish(mut self) -> Result<W, ZipError> {
        if self.poisoned {
            return Err(ZipError::Poisoned);
        }
        if let Some(mark) = self.marker {
            mark(&mut self.out, CENTRAL_DIRECTORY_MARK);
        }
        let cd_offset = if self.entries.is_empty() { 0 } else { self.pos };
        let mut cd = Vec::new();
        for e in &self.entries {
            let big_size = e.size >= U32_SENTINEL;
            let big_offset = e.local_header_offset >= U32_SENTINEL;
            let mut zip64 = Vec::with_capacity(3);
            if big_size {
                zip64.push(e.size);
                zip64.push(e.size);
            }
            if big_offset {
                zip64.push(e.local_header_offset);
            }
            let extra_len = if zip64.is_empty() { 0 } else { 4 + 8 * zip64.len() };
            put32(&mut cd, CENTRAL_HEADER_SIG);
            put16(&mut cd, 0); // version made by
            put16(&mut cd, 0); // version needed
            put16(&mut cd, e.flags);
            put16(&mut cd, 0); // method
            put16(&mut cd, 0); // time
            put16(&mut cd, 0); // date
            put32(&mut cd, e.crc32);
            put32(&mut cd, clamp32(e.size));
            put32(&mut cd, clamp32(e.size));
            put16(&mut cd, e.full_name.len() as u16);
            put16(&mut cd, extra_len as u16);
            put16(&mut cd, 0); // comment length
            put16(&mut cd, 0); // disk number start
            put16(&mut cd, 0); // internal attributes
            put32(&mut cd, 0); // external attributes
            put32(&mut cd, clamp32(e.local_header_offset));
            cd.extend_from_slice(e.full_name.as_bytes());
            put_zip64_extra(&mut cd, &zip64);
        }
        let cd_size = cd.len() as u64;
        if cd_size >= U32_SENTINEL {
            return Err(ZipError::TooLarge { what: "central directory" });
        }
        let zip64_eocd_offset = cd_offset.checked_add(cd_size).ok_or(ZipError::TooLarge { what: "archive offset" })?;
        let n = self.entries.len() as u64;

        let mut end = Vec::with_capacity(98);
        put32(&mut end, ZIP64_EOCD_SIG);
        put64(&mut end, ZIP64_EOCD_LEN - 12); // size of the remaining record
        put16(&mut end, 0x031E); // version made by (miniz: always "Unix, 3.0")
        put16(&mut end, 0x002D); // version needed: 4.5
        put32(&mut end, 0); // this disk
        put32(&mut end, 0); // disk with the central directory
        put64(&mut end, n);
        put64(&mut end, n);
        put64(&mut end, cd_size);
        put64(&mut end, cd_offset);
        put32(&mut end, ZIP64_LOCATOR_SIG);
        put32(&mut end, 0); // disk with the zip64 EOCD
        put64(&mut end, zip64_eocd_offset);
        put32(&mut end, 1); // total disks
        put32(&mut end, EOCD_SIG);
        put16(&mut end, 0); // this disk
        put16(&mut end, 0); // disk with the central directory
        let n16 = u16::try_from(n).unwrap_or(u16::MAX);
        put16(&mut end, n16);
        put16(&mut end, n16);
        put32(&mut end, clamp32(cd_size));
        put32(&mut end, clamp32(cd_offset));
        put16(&mut end, 0); // comment length

        let res = (|| -> std::io::Result<()> {
            self.out.write_all(&cd)?;
            self.out.write_all(&end)?;
            self.out.flush()
        })();
        if let Err(e) = res {
            self.poisoned = true;
            return Err(e.into());
        }
        self.pos = zip64_eocd_offset.saturating_add(end.len() as u64);
        Ok(self.out)
    }
}
