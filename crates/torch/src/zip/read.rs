//! Central-directory based, zero-copy reader for torch ZIP archives.

use std::cmp::Ordering;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

use super::{
    CENTRAL_HEADER_LEN, CENTRAL_HEADER_SIG, DEFAULT_ALIGNMENT, EOCD_LEN, EOCD_SIG, FLAG_ENCRYPTED, LOCAL_HEADER_LEN,
    LOCAL_HEADER_SIG, METHOD_DEFLATE, U32_SENTINEL, ZIP64_EOCD_LEN, ZIP64_EOCD_SIG, ZIP64_EXTRA_ID, ZIP64_LOCATOR_LEN,
    ZIP64_LOCATOR_SIG, ZipError, torch_data_offset,
};

/// Longest ZIP comment; the EOCD is searched for within the last `MAX_COMMENT + 22` bytes.
const MAX_COMMENT: u64 = 0xFFFF;

/// Pseudo record name used in [`ZipError::Overlap`] for the central directory.
const CENTRAL_DIRECTORY: &str = "<central directory>";

/// From this many records on, [`Archive::parse_overlapped`] reads the local headers on a second thread;
/// below it, a thread costs more than the headers.
const OVERLAP_MIN_RECORDS: usize = 512;

/// One entry of the archive, as described by its central directory entry and its local header.
///
/// All offsets are relative to the first byte of the slice given to [`Archive::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    name: String,
    short_start: usize,
    data_offset: u64,
    size: u64,
    compressed_size: u64,
    crc32: u32,
    method: u16,
    flags: u16,
    local_header_offset: u64,
}

impl Record {
    /// Full entry name, e.g. `"archive/data/0"`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Entry name without the archive prefix and its `/`, e.g. `"data/0"`.
    pub fn short_name(&self) -> &str {
        self.name.get(self.short_start..).unwrap_or_default()
    }

    /// Offset of the first data byte (local header offset + 30 + local name length + local extra
    /// length).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Uncompressed size from the central directory (zip64 value where applicable).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Compressed size from the central directory: the number of bytes the record occupies after
    /// [`data_offset`](Self::data_offset). Equals [`size`](Self::size) for stored records.
    pub fn compressed_size(&self) -> u64 {
        self.compressed_size
    }

    /// Range of the record's (possibly compressed) bytes within the archive slice.
    pub fn data_range(&self) -> Range<u64> {
        // `parse` checked that this sum does not overflow and lies inside the slice.
        self.data_offset..self.data_offset.saturating_add(self.compressed_size)
    }

    /// CRC-32 from the central directory; 0 means "not computed" for torch-written archives
    /// (`set_crc32_options(False)`, `skip_data`).
    pub fn crc32(&self) -> u32 {
        self.crc32
    }

    /// Compression method (0 = stored, 8 = deflate).
    pub fn method(&self) -> u16 {
        self.method
    }

    /// General purpose bit flags from the central directory (torch: `0x0808`, or `0x0800` for
    /// empty records).
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// Offset of the record's local file header.
    pub fn local_header_offset(&self) -> u64 {
        self.local_header_offset
    }
}

/// Parsed central directory of a torch ZIP archive. Holds no reference to the bytes: pass the same
/// slice again to [`Archive::data`] / [`Archive::verify_crc`].
#[derive(Debug, Clone)]
pub struct Archive {
    prefix: String,
    records: Vec<Record>,
    /// Indices into `records`, sorted by short name (for `get`).
    by_name: Vec<usize>,
    /// Length of the slice the archive was parsed from.
    len: u64,
    /// Number of bytes found before the archive proper (prepended junk).
    shift: u64,
    /// Offset of the central directory (shift applied).
    cd_offset: u64,
}

/// Where [`Archive::parse_overlapped`] reads the local headers from.
#[derive(Clone, Copy)]
pub enum HeaderSource<'a> {
    /// The slice itself. After each batch of headers, the function gets the range of the slice they were
    /// read from, less `data.pkl`'s record (which the work reads meanwhile): the owner of a memory map can
    /// drop those pages from the process's page tables ([`ckpt_tensor::Buffer::forget_mapped_pages`]), rather
    /// than pay for them when the map is unmapped.
    Slice(&'a (dyn Fn(Range<u64>) + Sync)),
    /// Reads of the same bytes as the slice's that map nothing: the function fills its buffer with the bytes
    /// at an offset of the slice and says whether it could. For a memory-mapped file, a positioned read
    /// (`pread`) of the file: a local header lies on a page of its own in an archive of 10 KiB records, and
    /// one `pread` of it costs about half of what mapping that page and unmapping it later cost. A header
    /// that cannot be read so, or is not the well-formed header of the record the central directory names,
    /// is read again from the slice, which gives the precise error.
    ReadAt(&'a (dyn Fn(u64, &mut [u8]) -> bool + Sync)),
}

impl fmt::Debug for HeaderSource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HeaderSource::Slice(_) => "HeaderSource::Slice",
            HeaderSource::ReadAt(_) => "HeaderSource::ReadAt",
        })
    }
}

/// Bounds-checked little-endian reader over a region `[0, end)` of the archive slice.
struct Cur<'a> {
    buf: &'a [u8],
    pos: u64,
    what: &'static str,
    start: u64,
}

impl<'a> Cur<'a> {
    /// Reader for the structure `what` starting at `pos` that must end before `buf.len()`.
    fn new(buf: &'a [u8], pos: u64, what: &'static str) -> Self {
        Cur { buf, pos, what, start: pos }
    }

    /// Error for a structure that needs `needed` bytes from its start.
    fn truncated(&self, needed: u64) -> ZipError {
        ZipError::Truncated {
            what: self.what,
            offset: self.start,
            needed,
            available: (self.buf.len() as u64).saturating_sub(self.start),
        }
    }

    fn bytes(&mut self, n: u64) -> Result<&'a [u8], ZipError> {
        let end = self.pos.checked_add(n);
        let slice = end.and_then(|end| {
            let (from, to) = (usize::try_from(self.pos).ok()?, usize::try_from(end).ok()?);
            self.buf.get(from..to)
        });
        match (slice, end) {
            (Some(s), Some(end)) => {
                self.pos = end;
                Ok(s)
            }
            _ => Err(self.truncated(self.pos.saturating_add(n).saturating_sub(self.start))),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ZipError> {
        let s = self.bytes(N as u64)?;
        <[u8; N]>::try_from(s).map_err(|_| self.truncated(N as u64))
    }

    fn u16(&mut self) -> Result<u16, ZipError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, ZipError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, ZipError> {
        self.array().map(u64::from_le_bytes)
    }

    /// Reads a signature and checks it.
    fn sig(&mut self, expected: u32) -> Result<(), ZipError> {
        let offset = self.pos;
        let found = self.u32()?;
        if found == expected {
            Ok(())
        } else {
            Err(ZipError::BadSignature { what: self.what, offset, expected, found })
        }
    }
}

/// Little-endian u32 at `pos`, if there are 4 bytes there.
fn peek_u32(bytes: &[u8], pos: u64) -> Option<u32> {
    Cur::new(bytes, pos, "").u32().ok()
}

/// Offset of the last EOCD signature that leaves room for a 22-byte EOCD, searching at most
/// `MAX_COMMENT + 22` bytes back from the end (miniz and Python's `zipfile` do the same).
fn find_eocd(bytes: &[u8]) -> Option<u64> {
    let len = bytes.len() as u64;
    let last = len.checked_sub(EOCD_LEN)?;
    let first = last.saturating_sub(MAX_COMMENT);
    let window = bytes.get(usize::try_from(first).ok()?..usize::try_from(last).ok()?.checked_add(4)?)?;
    let sig = EOCD_SIG.to_le_bytes();
    window.windows(4).rposition(|w| w == sig).map(|i| first + i as u64)
}

/// Values from the end records that the central directory parse needs.
struct EndRecords {
    entries: u64,
    cd_size: u64,
    cd_offset: u64,
    /// Offset of the first end record (zip64 EOCD if present, else EOCD).
    start: u64,
}

fn multi_disk(what: &'static str, value: u64) -> ZipError {
    ZipError::MultiDisk { what, value }
}

/// Reads the classic EOCD at `eocd_pos` and, if a zip64 locator precedes it, the zip64 EOCD.
fn read_end_records(bytes: &[u8], eocd_pos: u64) -> Result<EndRecords, ZipError> {
    let mut c = Cur::new(bytes, eocd_pos, "end of central directory record");
    c.sig(EOCD_SIG)?;
    let disk = c.u16()?;
    let cd_disk = c.u16()?;
    let entries_disk = c.u16()?;
    let entries = c.u16()?;
    let cd_size = c.u32()?;
    let cd_offset = c.u32()?;
    // The comment length is not checked: trailing bytes after the archive are tolerated.

    let locator_pos = eocd_pos.checked_sub(ZIP64_LOCATOR_LEN);
    let locator = locator_pos.filter(|&p| peek_u32(bytes, p) == Some(ZIP64_LOCATOR_SIG));
    let Some(locator_pos) = locator else {
        if disk != 0 || cd_disk != 0 {
            return Err(multi_disk("EOCD disk number", u64::from(disk.max(cd_disk))));
        }
        if entries_disk != entries {
            return Err(multi_disk("EOCD entries on this disk", u64::from(entries_disk)));
        }
        return Ok(EndRecords {
            entries: u64::from(entries),
            cd_size: u64::from(cd_size),
            cd_offset: u64::from(cd_offset),
            start: eocd_pos,
        });
    };

    let mut c = Cur::new(bytes, locator_pos, "zip64 end of central directory locator");
    c.sig(ZIP64_LOCATOR_SIG)?;
    let zip64_disk = c.u32()?;
    let recorded_pos = c.u64()?;
    let disks = c.u32()?;
    if zip64_disk != 0 {
        return Err(multi_disk("zip64 locator disk", u64::from(zip64_disk)));
    }
    if disks > 1 {
        return Err(multi_disk("zip64 locator total disks", u64::from(disks)));
    }
    // Python's zipfile expects the zip64 EOCD right before the locator (this survives prepended
    // bytes); miniz follows the recorded offset (this survives extensible data). Try both.
    let adjacent = locator_pos.checked_sub(ZIP64_EOCD_LEN);
    let zip64_pos = match adjacent {
        Some(p) if peek_u32(bytes, p) == Some(ZIP64_EOCD_SIG) => p,
        _ => recorded_pos,
    };
    if zip64_pos >= locator_pos {
        return Err(ZipError::BadSignature {
            what: "zip64 end of central directory record",
            offset: zip64_pos,
            expected: ZIP64_EOCD_SIG,
            found: peek_u32(bytes, zip64_pos).unwrap_or(0),
        });
    }
    let mut c = Cur::new(bytes, zip64_pos, "zip64 end of central directory record");
    c.sig(ZIP64_EOCD_SIG)?;
    let _record_size = c.u64()?;
    let _made_by = c.u16()?;
    let _needed = c.u16()?;
    let disk = c.u32()?;
    let cd_disk = c.u32()?;
    let entries_disk = c.u64()?;
    let entries = c.u64()?;
    let cd_size = c.u64()?;
    let cd_offset = c.u64()?;
    if disk != 0 || cd_disk != 0 {
        return Err(multi_disk("zip64 EOCD disk number", u64::from(disk.max(cd_disk))));
    }
    if entries_disk != entries {
        return Err(multi_disk("zip64 EOCD entries on this disk", entries_disk));
    }
    Ok(EndRecords { entries, cd_size, cd_offset, start: zip64_pos })
}

/// The zip64 values of a central directory entry that replace 32-bit sentinels.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Zip64Fields {
    pub(super) size: Option<u64>,
    pub(super) compressed_size: Option<u64>,
    pub(super) local_header_offset: Option<u64>,
    pub(super) disk: Option<u32>,
}

/// Resolves the sentinel fields of an entry from its extra field (APPNOTE 4.5.3: the zip64 block
/// holds, in this order, only the fields whose 32-bit value is the sentinel).
pub(super) fn parse_zip64_extra(
    name: &str,
    extra: &[u8],
    need_size: bool,
    need_csize: bool,
    need_offset: bool,
    need_disk: bool,
) -> Result<Zip64Fields, ZipError> {
    let mut out = Zip64Fields::default();
    let mut block = None;
    let mut at = 0usize;
    // Blocks of (u16 id, u16 len, data). Fewer than 4 trailing bytes are ignored (as zipfile does).
    while let Some(head) = extra.get(at..at.saturating_add(4)) {
        let id = u16::from_le_bytes([head.first().copied().unwrap_or(0), head.get(1).copied().unwrap_or(0)]);
        let len =
            usize::from(u16::from_le_bytes([head.get(2).copied().unwrap_or(0), head.get(3).copied().unwrap_or(0)]));
        let data_start = at.saturating_add(4);
        let data = extra
            .get(data_start..data_start.saturating_add(len))
            .ok_or_else(|| ZipError::MalformedExtra { name: name.to_owned(), at })?;
        if id == ZIP64_EXTRA_ID && block.is_none() {
            block = Some(data);
        }
        at = data_start.saturating_add(len);
    }
    if !(need_size || need_csize || need_offset || need_disk) {
        return Ok(out);
    }
    let block = block.unwrap_or_default();
    let mut c = Cur::new(block, 0, "zip64 extra field");
    let missing = |field| ZipError::Zip64ExtraMissing { name: name.to_owned(), field };
    if need_size {
        out.size = Some(c.u64().map_err(|_| missing("uncompressed size"))?);
    }
    if need_csize {
        out.compressed_size = Some(c.u64().map_err(|_| missing("compressed size"))?);
    }
    if need_offset {
        out.local_header_offset = Some(c.u64().map_err(|_| missing("local header offset"))?);
    }
    if need_disk {
        out.disk = Some(c.u32().map_err(|_| missing("disk number start"))?);
    }
    Ok(out)
}

impl Archive {
    /// Parses a torch ZIP archive occupying the whole of `bytes` (which may be a window of a larger
    /// file: all offsets are relative to `bytes[0]`).
    ///
    /// Trailing bytes after the end of central directory record are tolerated (the record is
    /// searched for backwards within the maximum comment size), and so are bytes prepended before
    /// the archive (detected like Python's `zipfile`: offsets are shifted by the distance between
    /// where the central directory should end and where the end records are).
    pub fn parse(bytes: &[u8]) -> Result<Archive, ZipError> {
        let archive = Self::parse_central(bytes, LocalHeaders::Read)?;
        check_overlaps(&archive.records, archive.cd_offset, archive.len)?;
        Ok(archive)
    }

    /// Parses the central directory of a torch ZIP archive and takes each record's data offset from
    /// torch's layout rule (after a local header of the record's full name, its zip64 field and the `FB`
    /// field aligning the data to 64 bytes) without reading any local header. For a listing from a partial
    /// copy of an archive (its central directory, and then `data.pkl` and the small records, fetched from an
    /// object store; the tensor records not): check the records read with [`Archive::check_predicted`].
    ///
    /// # Errors
    /// [`Archive::parse`]'s, but those of local headers.
    pub fn parse_predicted(bytes: &[u8]) -> Result<Archive, ZipError> {
        let archive = Self::parse_central(bytes, LocalHeaders::Predict)?;
        check_overlaps(&archive.records, archive.cd_offset, archive.len)?;
        Ok(archive)
    }

    /// Checks that the local header of the record `name_without_prefix` puts its data where
    /// [`Archive::parse_predicted`] took it to be. A missing record passes.
    ///
    /// # Errors
    /// The local header's own errors; [`ZipError::Unpredicted`] when it puts the data elsewhere.
    pub fn check_predicted(&self, bytes: &[u8], name_without_prefix: &str) -> Result<(), ZipError> {
        let Some(rec) = self.get(name_without_prefix) else { return Ok(()) };
        Self::check_predicted_record(bytes, rec)
    }

    /// [`Archive::check_predicted`] of the record `rec` (of this archive): its local header, once present
    /// in `bytes`, puts its data where [`Archive::parse_predicted`] took it to be.
    ///
    /// # Errors
    /// As [`Archive::check_predicted`].
    pub fn check_predicted_record(bytes: &[u8], rec: &Record) -> Result<(), ZipError> {
        let at = local_data_offset(bytes, rec)?;
        if at != rec.data_offset {
            return Err(ZipError::Unpredicted { name: rec.name.clone(), predicted: rec.data_offset, found: at });
        }
        Ok(())
    }

    /// Where the central directory of the archive ending `bytes` lies, from its end records alone (the last
    /// 64 KiB and 22 bytes of the archive hold them, with zip64's): what a reader fetches from an object
    /// store before anything else of a `.pt`. Offsets are relative to `bytes[0]`, as the end records give them.
    ///
    /// # Errors
    /// [`ZipError::NotZip`] without end records; their own errors.
    pub fn central_directory_range(bytes: &[u8]) -> Result<Range<u64>, ZipError> {
        let eocd_pos = find_eocd(bytes).ok_or(ZipError::NotZip { len: bytes.len() as u64 })?;
        let end = read_end_records(bytes, eocd_pos)?;
        let cd_end = end.cd_offset.checked_add(end.cd_size).ok_or(ZipError::CentralDirectoryMisplaced {
            cd_offset: end.cd_offset,
            cd_size: end.cd_size,
            end_records: end.start,
        })?;
        Ok(end.cd_offset..cd_end)
    }

    /// Parses like [`Archive::parse`] and runs `work` on the archive while a second thread reads the
    /// local headers, which for an archive of many small records is most of what parsing costs (a page
    /// of the file every record).
    ///
    /// `work` first sees each record's data where torch's writer puts it, which the central directory
    /// gives: after a local header of the record's full name, its zip64 field and the `FB` field that
    /// aligns the data to 64 bytes. If a local header says otherwise (another writer, another
    /// alignment), `work` runs again, on the offsets the local headers give; so what is returned was
    /// always computed from those. Errors are [`Archive::parse`]'s; archives of fewer than 512 records,
    /// and archives whose `data.pkl` is not where torch would put it, are parsed first and worked on
    /// after.
    ///
    /// The headers are read in batches, by the second thread and, once `work` is done, by this one too,
    /// from where `headers` says ([`HeaderSource`]).
    ///
    /// ```
    /// use ckpt_torch::zip::{Archive, HeaderSource, ZipWriter};
    /// let mut w = ZipWriter::new(Vec::new(), "archive");
    /// w.write_record("data.pkl", b"pickle").unwrap();
    /// let bytes = w.finish().unwrap();
    /// let data_pkl_len = |a: &Archive| a.data(&bytes, a.get("data.pkl").unwrap()).unwrap().len();
    /// let (archive, n) = Archive::parse_overlapped(&bytes, HeaderSource::Slice(&|_| {}), data_pkl_len).unwrap();
    /// assert_eq!((archive.records().len(), n), (1, 6));
    /// ```
    pub fn parse_overlapped<T>(
        bytes: &[u8],
        headers: HeaderSource<'_>,
        work: impl FnMut(&Archive) -> T,
    ) -> Result<(Archive, T), ZipError> {
        Self::parse_overlapped_from(bytes, OVERLAP_MIN_RECORDS, headers, work)
    }

    /// [`Archive::parse_overlapped`] with the second thread used from `min_records` records on (0: for
    /// every archive whose `data.pkl` is where torch puts it; for tests and fuzzing of that path).
    pub fn parse_overlapped_from<T>(
        bytes: &[u8],
        min_records: usize,
        headers: HeaderSource<'_>,
        mut work: impl FnMut(&Archive) -> T,
    ) -> Result<(Archive, T), ZipError> {
        let mut archive = Self::parse_central(bytes, LocalHeaders::Predict)?;
        let pkl_predicted =
            archive.get("data.pkl").map(|r| local_data_offset(bytes, r).is_ok_and(|at| at == r.data_offset));
        if archive.records.len() < min_records || pkl_predicted != Some(true) {
            for i in 0..archive.records.len() {
                if let Some(r) = archive.records.get(i) {
                    let at = local_data_offset(bytes, r)?;
                    if let Some(r) = archive.records.get_mut(i) {
                        r.data_offset = at;
                    }
                }
            }
            check_overlaps(&archive.records, archive.cd_offset, archive.len)?;
            let out = work(&archive);
            return Ok((archive, out));
        }
        // Both threads take the headers in batches from one counter: the second thread from the start, this
        // one once `work` is done, so neither waits while the other has headers left.
        let next = AtomicUsize::new(0);
        let pkl = archive.get("data.pkl").map_or(0..0, |r| r.local_header_offset..r.data_range().end);
        let scan = || scan_headers(bytes, &archive.records, &next, &pkl, headers);
        let (theirs, out, mine) = std::thread::scope(|s| {
            let headers = s.spawn(scan);
            let out = work(&archive);
            let mine = scan();
            (headers.join(), out, mine)
        });
        // The header reader does not panic; if it did, read every header here.
        let theirs = theirs.unwrap_or_else(|_| {
            scan_headers(bytes, &archive.records, &AtomicUsize::new(0), &pkl, HeaderSource::Slice(&|_| {}))
        });
        let moved = match (theirs, mine) {
            (Ok(mut a), Ok(b)) => {
                a.extend(b);
                Ok(a)
            }
            // The first error in central-directory order: every batch before the one that failed was read
            // whole, by one thread or the other.
            (Err((i, e)), Err((j, f))) => Err(if i <= j { e } else { f }),
            (Err((_, e)), Ok(_)) | (Ok(_), Err((_, e))) => Err(e),
        };
        let moved = moved?;
        for &(i, at) in &moved {
            if let Some(r) = archive.records.get_mut(i) {
                r.data_offset = at;
            }
        }
        check_overlaps(&archive.records, archive.cd_offset, archive.len)?;
        let out = if moved.is_empty() { out } else { work(&archive) };
        Ok((archive, out))
    }

    /// The central directory, each record's data offset read from its local header or predicted.
    fn parse_central(bytes: &[u8], locals: LocalHeaders) -> Result<Archive, ZipError> {
        let len = bytes.len() as u64;
        let eocd_pos = find_eocd(bytes).ok_or(ZipError::NotZip { len: bytes.len() as u64 })?;
        let end = read_end_records(bytes, eocd_pos)?;

        let misplaced = || ZipError::CentralDirectoryMisplaced {
            cd_offset: end.cd_offset,
            cd_size: end.cd_size,
            end_records: end.start,
        };
        let cd_end_claimed = end.cd_offset.checked_add(end.cd_size).ok_or_else(misplaced)?;
        let shift = end.start.checked_sub(cd_end_claimed).ok_or_else(misplaced)?;
        let cd_offset = end.cd_offset.saturating_add(shift);
        let cd_end = end.start;

        let max = end.cd_size / CENTRAL_HEADER_LEN;
        if end.entries > max {
            return Err(ZipError::EntryCountTooLarge { claimed: end.entries, cd_size: end.cd_size, max });
        }
        if end.entries == 0 {
            return Err(ZipError::Empty);
        }
        // Bounded by cd_size / 46 <= len / 46.
        let capacity = usize::try_from(end.entries).map_err(|_| ZipError::TooLarge { what: "entry count" })?;
        let cd_region = bytes.get(..usize::try_from(cd_end).unwrap_or(usize::MAX)).ok_or(ZipError::Truncated {
            what: "central directory",
            offset: cd_offset,
            needed: end.cd_size,
            available: len.saturating_sub(cd_offset),
        })?;

        let mut records: Vec<Record> = Vec::with_capacity(capacity);
        let mut prefix: Option<String> = None;
        let mut pos = cd_offset;
        for _ in 0..end.entries {
            let (mut record, next) = read_central_entry(cd_region, pos, shift, &mut prefix)?;
            if locals == LocalHeaders::Read {
                record.data_offset = local_data_offset(bytes, &record)?;
            }
            records.push(record);
            pos = next;
        }
        let prefix = prefix.unwrap_or_default();

        // Names: sorted index for lookup, duplicates rejected. Sorted by length, then bytes (any total order
        // serves a binary search): torch's `data/0`, `data/1`, ... are then already in order, a few runs that
        // the sort merges in linear time, where byte order (`data/10` before `data/2`) costs n log n
        // comparisons.
        let mut by_name: Vec<usize> = (0..records.len()).collect();
        let short = |i: &usize| records.get(*i).map(Record::short_name).unwrap_or_default();
        by_name.sort_by(|a, b| name_order(short(a), short(b)));
        for pair in by_name.windows(2) {
            if let [a, b] = pair {
                if short(a) == short(b) {
                    return Err(ZipError::DuplicateName {
                        name: records.get(*b).map(|r| r.name.clone()).unwrap_or_default(),
                    });
                }
            }
        }

        Ok(Archive { prefix, records, by_name, len, shift, cd_offset })
    }

    /// The archive prefix: everything before the first `/` of the first central-directory entry
    /// (`"archive"` for buffers, the file stem for paths).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// All records, in central-directory order (for torch files: write order).
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Looks a record up by its name without prefix (`"data.pkl"`, `"data/0"`, `"version"`,
    /// `".data/version"`), in O(log n).
    pub fn get(&self, name_without_prefix: &str) -> Option<&Record> {
        let idx = self
            .by_name
            .binary_search_by(|&i| {
                self.records.get(i).map_or(Ordering::Less, |r| name_order(r.short_name(), name_without_prefix))
            })
            .ok()?;
        self.records.get(*self.by_name.get(idx)?)
    }

    /// Number of bytes found in front of the archive proper (0 for normal archives; positive for
    /// self-extractor style files). Already included in every offset this archive reports.
    pub fn prepended_len(&self) -> u64 {
        self.shift
    }

    /// Offset of the central directory within the slice.
    pub fn central_directory_offset(&self) -> u64 {
        self.cd_offset
    }

    /// The bytes of a stored record: a sub-slice of `bytes`, which must be the slice this archive
    /// was parsed from. Compressed records give [`ZipError::Compressed`] ([`Archive::record_bytes`]
    /// inflates DEFLATE ones), encrypted ones [`ZipError::Encrypted`].
    pub fn data<'a>(&self, bytes: &'a [u8], rec: &Record) -> Result<&'a [u8], ZipError> {
        if bytes.len() as u64 != self.len {
            return Err(ZipError::BufferMismatch { parsed: self.len, given: bytes.len() as u64 });
        }
        if rec.flags & FLAG_ENCRYPTED != 0 {
            return Err(ZipError::Encrypted { name: rec.name.clone() });
        }
        if rec.method != 0 {
            return Err(ZipError::Compressed { name: rec.name.clone(), method: rec.method });
        }
        Cur::new(bytes, rec.data_offset, "record data").bytes(rec.size)
    }

    /// The bytes of a record, stored or DEFLATE-compressed (method 8): a sub-slice of `bytes` for a stored
    /// one, the inflated bytes for a compressed one, whose uncompressed size (from the central directory)
    /// is checked against what its compressed bytes can hold and against `max_inflated` before anything is
    /// allocated, and whose stream must inflate to exactly that size.
    pub fn record_bytes<'a>(
        &self,
        bytes: &'a [u8],
        rec: &Record,
        max_inflated: u64,
    ) -> Result<std::borrow::Cow<'a, [u8]>, ZipError> {
        if rec.method != METHOD_DEFLATE {
            return self.data(bytes, rec).map(std::borrow::Cow::Borrowed);
        }
        if bytes.len() as u64 != self.len {
            return Err(ZipError::BufferMismatch { parsed: self.len, given: bytes.len() as u64 });
        }
        if rec.flags & FLAG_ENCRYPTED != 0 {
            return Err(ZipError::Encrypted { name: rec.name.clone() });
        }
        let compressed = Cur::new(bytes, rec.data_offset, "record data").bytes(rec.compressed_size)?;
        // A DEFLATE block expands at most 1032 times (258 bytes from a 2-bit code).
        let limit = rec.compressed_size.saturating_mul(1032).saturating_add(64).min(max_inflated);
        if rec.size > limit {
            return Err(ZipError::InflatedTooLarge {
                name: rec.name.clone(),
                size: rec.size,
                compressed: rec.compressed_size,
                limit,
            });
        }
        let size = usize::try_from(rec.size).map_err(|_| ZipError::InflatedTooLarge {
            name: rec.name.clone(),
            size: rec.size,
            compressed: rec.compressed_size,
            limit: usize::MAX as u64,
        })?;
        let inflate_err = |reason: String| ZipError::Inflate { name: rec.name.clone(), size: rec.size, reason };
        let mut out = vec![0u8; size];
        let mut z = flate2::Decompress::new(false);
        let status = z
            .decompress(compressed, &mut out, flate2::FlushDecompress::Finish)
            .map_err(|e| inflate_err(e.to_string()))?;
        if status != flate2::Status::StreamEnd || z.total_out() != rec.size {
            return Err(inflate_err(format!("it inflates to {} bytes or more", z.total_out())));
        }
        Ok(std::borrow::Cow::Owned(out))
    }

    /// Checks a record's bytes (inflated, for a DEFLATE record) against the CRC-32 from the central
    /// directory.
    ///
    /// A recorded CRC of 0 means "not computed" (torch writes 0 under
    /// `torch.serialization.set_crc32_options(False)` and `skip_data`) and is accepted without
    /// reading the data; an empty record, whose true CRC is 0, is therefore always accepted too.
    pub fn verify_crc(&self, bytes: &[u8], rec: &Record) -> Result<(), ZipError> {
        let data = self.record_bytes(bytes, rec, crate::read_options::DEFAULT_MAX_INFLATED_BYTES)?;
        if rec.crc32 == 0 {
            return Ok(());
        }
        let actual = crc32fast::hash(&data);
        if actual == rec.crc32 {
            Ok(())
        } else {
            Err(ZipError::CrcMismatch { name: rec.name.clone(), expected: rec.crc32, actual })
        }
    }
}

/// The order of [`Archive`]'s name index: by length, then by bytes.
fn name_order(a: &str, b: &str) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Whether [`Archive::parse_central`] reads each record's local header or predicts where its data is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LocalHeaders {
    Read,
    /// Where torch's writer puts it ([`torch_data_offset`]); `u64::MAX` where that overflows.
    Predict,
}

/// Parses the central directory entry at `pos` (inside `cd_region`). Returns the record, its data offset
/// predicted as torch's writer places data (the local header is read by [`local_data_offset`]), and the
/// offset of the next entry.
fn read_central_entry(
    cd_region: &[u8],
    pos: u64,
    shift: u64,
    prefix: &mut Option<String>,
) -> Result<(Record, u64), ZipError> {
    let mut c = Cur::new(cd_region, pos, "central directory entry");
    c.sig(CENTRAL_HEADER_SIG)?;
    let _made_by = c.u16()?;
    let _needed = c.u16()?;
    let flags = c.u16()?;
    let method = c.u16()?;
    let _time = c.u16()?;
    let _date = c.u16()?;
    let crc32 = c.u32()?;
    let csize32 = c.u32()?;
    let size32 = c.u32()?;
    let name_len = c.u16()?;
    let extra_len = c.u16()?;
    let comment_len = c.u16()?;
    let disk16 = c.u16()?;
    let _internal_attr = c.u16()?;
    let _external_attr = c.u32()?;
    let offset32 = c.u32()?;
    let name_bytes = c.bytes(u64::from(name_len))?;
    let extra = c.bytes(u64::from(extra_len))?;
    let _comment = c.bytes(u64::from(comment_len))?;

    let name = std::str::from_utf8(name_bytes).map_err(|_| ZipError::InvalidName { offset: pos })?.to_owned();

    let z = parse_zip64_extra(
        &name,
        extra,
        u64::from(size32) == U32_SENTINEL,
        u64::from(csize32) == U32_SENTINEL,
        u64::from(offset32) == U32_SENTINEL,
        disk16 == 0xFFFF,
    )?;
    let size = z.size.unwrap_or(u64::from(size32));
    let compressed_size = z.compressed_size.unwrap_or(u64::from(csize32));
    let local_offset = z.local_header_offset.unwrap_or(u64::from(offset32));
    let disk = z.disk.unwrap_or(u32::from(disk16));
    if disk != 0 {
        return Err(multi_disk("entry disk number start", u64::from(disk)));
    }

    // Prefix rules of PyTorchStreamReader.
    let short_start = match prefix {
        None => {
            let slash = name.find('/').ok_or_else(|| ZipError::NotInSubdirectory { name: name.clone() })?;
            *prefix = Some(name.get(..slash).unwrap_or_default().to_owned());
            slash.saturating_add(1)
        }
        Some(p) => {
            let under = name.strip_prefix(p.as_str()).is_some_and(|rest| rest.starts_with('/'));
            if !under {
                if !name.contains('/') {
                    return Err(ZipError::NotInSubdirectory { name });
                }
                return Err(ZipError::MixedPrefix { prefix: p.clone(), name });
            }
            p.len().saturating_add(1)
        }
    };

    if method == 0 && size != compressed_size {
        return Err(ZipError::StoredSizeMismatch { name, compressed: compressed_size, uncompressed: size });
    }

    let local_header_offset = local_offset.checked_add(shift).ok_or(ZipError::Truncated {
        what: "local file header",
        offset: local_offset,
        needed: LOCAL_HEADER_LEN,
        available: 0,
    })?;
    // Torch's offsets count from the start of the archive proper, before any prepended bytes.
    let data_offset = torch_data_offset(local_offset, u64::from(name_len), size, DEFAULT_ALIGNMENT)
        .and_then(|at| at.checked_add(shift))
        .unwrap_or(u64::MAX);

    let record =
        Record { name, short_start, data_offset, size, compressed_size, crc32, method, flags, local_header_offset };
    Ok((record, c.pos))
}

/// Reads the local header of `rec`: its signature, and its name, which must be the central directory's.
/// Returns where the data starts (its sizes are not trusted, as torch does not fill them in).
fn local_data_offset(bytes: &[u8], rec: &Record) -> Result<u64, ZipError> {
    let mut l = Cur::new(bytes, rec.local_header_offset, "local file header");
    let (local_name, local_extra_len) = local_header_name(&mut l)?;
    if local_name != rec.name.as_bytes() {
        return Err(ZipError::LocalNameMismatch {
            central: rec.name.clone(),
            local: String::from_utf8_lossy(local_name).into_owned(),
            offset: rec.local_header_offset,
        });
    }
    l.bytes(u64::from(local_extra_len))?;
    Ok(l.pos)
}

/// The local header `l` starts at, up to its name: checks the signature, returns the name and the length of
/// the extra field after it.
fn local_header_name<'a>(l: &mut Cur<'a>) -> Result<(&'a [u8], u16), ZipError> {
    l.sig(LOCAL_HEADER_SIG)?;
    l.bytes(22)?; // version, flags, method, time, date, crc, sizes: not trusted
    let name_len = l.u16()?;
    let extra_len = l.u16()?;
    Ok((l.bytes(u64::from(name_len))?, extra_len))
}

/// [`local_data_offset`] through `read_at` ([`read_local_header`]); a header that cannot be read so, or is not
/// well formed, is read again from the slice, which gives the same answer or the precise error.
fn local_data_offset_read(
    bytes: &[u8],
    rec: &Record,
    read_at: &dyn Fn(u64, &mut [u8]) -> bool,
    scratch: &mut Vec<u8>,
) -> Result<u64, ZipError> {
    match read_local_header(bytes.len() as u64, rec, read_at, scratch) {
        Some(at) => Ok(at),
        None => local_data_offset(bytes, rec),
    }
}

/// Where `rec`'s data starts, by its local header read with one call of `read_at` (the fixed part and the
/// name the central directory gives, into `scratch`) from an archive of `len` bytes. `None` where the read
/// fails, or the header is not well formed with that name and inside the archive, its extra field included.
fn read_local_header(
    len: u64,
    rec: &Record,
    read_at: &dyn Fn(u64, &mut [u8]) -> bool,
    scratch: &mut Vec<u8>,
) -> Option<u64> {
    let name = rec.name.as_bytes();
    let want = (LOCAL_HEADER_LEN as usize).saturating_add(name.len());
    let name_end = rec.local_header_offset.checked_add(want as u64)?;
    if name_end > len {
        return None;
    }
    scratch.resize(want, 0);
    if !read_at(rec.local_header_offset, scratch) {
        return None;
    }
    // `scratch` holds the header up to the central directory's name: a longer local name does not fit.
    let (local_name, extra_len) = local_header_name(&mut Cur::new(scratch, 0, "local file header")).ok()?;
    let at = name_end.checked_add(u64::from(extra_len))?;
    (local_name == name && at <= len).then_some(at)
}

/// Records whose local headers one take of [`scan_headers`] reads.
const HEADER_BATCH: usize = 512;

/// Reads local headers from `source` in batches of [`HEADER_BATCH`] records taken from `next` until none are
/// left; for [`HeaderSource::Slice`], after each batch hands its function the span of the slice it read them
/// from (less `skip`, `data.pkl`'s record, which the decoder reads meanwhile). Returns the records whose data
/// is not where their `data_offset` says (index, offset the header gives), or the first error this call met,
/// with its record's index.
fn scan_headers(
    bytes: &[u8],
    records: &[Record],
    next: &AtomicUsize,
    skip: &Range<u64>,
    source: HeaderSource<'_>,
) -> Result<Vec<(usize, u64)>, (usize, ZipError)> {
    let len = bytes.len() as u64;
    let mut moved = Vec::new();
    let mut scratch = Vec::new();
    loop {
        let start = next.fetch_add(HEADER_BATCH, AtomicOrdering::Relaxed);
        let Some(batch) = records.get(start..records.len().min(start.saturating_add(HEADER_BATCH))) else {
            return Ok(moved);
        };
        let (mut first, mut last) = (u64::MAX, 0);
        for (i, r) in (start..).zip(batch) {
            let at = match source {
                HeaderSource::Slice(_) => local_data_offset(bytes, r),
                HeaderSource::ReadAt(read_at) => local_data_offset_read(bytes, r, read_at, &mut scratch),
            }
            .map_err(|e| (i, e))?;
            if at != r.data_offset {
                moved.push((i, at));
            }
            first = first.min(r.local_header_offset);
            last = last.max(at);
        }
        let HeaderSource::Slice(scanned) = source else { continue };
        let span = first..last.min(len);
        for part in [span.start..skip.start.clamp(span.start, span.end), skip.end.clamp(span.start, span.end)..span.end]
        {
            if part.start < part.end {
                scanned(part);
            }
        }
    }
}

/// Rejects records that extend past the end of the slice, overlap the central directory, or
/// overlap each other (each record spans its local header and its data).
fn check_overlaps(records: &[Record], cd_offset: u64, len: u64) -> Result<(), ZipError> {
    let mut spans: Vec<(u64, u64, &str)> = Vec::with_capacity(records.len());
    for r in records {
        let end = r.data_offset.checked_add(r.compressed_size);
        match end {
            Some(end) if end <= cd_offset => spans.push((r.local_header_offset, end, &r.name)),
            Some(end) if end <= len => {
                return Err(ZipError::Overlap { a: r.name.clone(), b: CENTRAL_DIRECTORY.to_owned() });
            }
            _ => {
                return Err(ZipError::Truncated {
                    what: "record data",
                    offset: r.data_offset,
                    needed: r.compressed_size,
                    available: len.saturating_sub(r.data_offset),
                });
            }
        }
    }
    spans.sort_unstable_by_key(|&(start, end, _)| (start, end));
    for pair in spans.windows(2) {
        if let [(_, a_end, a), (b_start, _, b)] = pair {
            if a_end > b_start {
                return Err(ZipError::Overlap { a: (*a).to_owned(), b: (*b).to_owned() });
            }
        }
    }
    Ok(())
}
