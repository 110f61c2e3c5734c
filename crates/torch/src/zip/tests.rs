//! Tests of the zip module. Torch-made fixtures live in `crates/torch/tests/zipdata/` (see its
//! README for the commands that produced them).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

use std::io::Write;

use super::read::parse_zip64_extra;
use super::sid::{combined_name_hash, hash_combine, std_string_hash};
use super::*;

// ------------------------------------------------------------------------------------------------
// helpers

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/zipdata/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn assert_same_bytes(ours: &[u8], theirs: &[u8]) {
    if let Some(i) = ours.iter().zip(theirs).position(|(a, b)| a != b) {
        let lo = i.saturating_sub(16);
        panic!(
            "first difference at byte {i}: ours {:02x?} vs torch {:02x?}",
            &ours[lo..(i + 16).min(ours.len())],
            &theirs[lo..(i + 16).min(theirs.len())]
        );
    }
    assert_eq!(ours.len(), theirs.len(), "same prefix, different lengths");
}

fn set16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn set32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}

fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn get64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Builds a classic ZIP (no zip64, no data descriptors, like Python's `zipfile`) of stored
/// entries. `hook(i, entry)` may rewrite central directory entry `i` (46-byte header + name; it may
/// append an extra field if it also sets the extra length at byte 30).
fn build(entries: &[(&[u8], &[u8])], hook: impl Fn(usize, &mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (i, (name, data)) in entries.iter().enumerate() {
        let lho = out.len() as u32;
        let crc = crc32fast::hash(data);
        out.extend_from_slice(&LOCAL_HEADER_SIG.to_le_bytes());
        out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(data);

        let mut e = Vec::new();
        e.extend_from_slice(&CENTRAL_HEADER_SIG.to_le_bytes());
        e.extend_from_slice(&[20, 3, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        e.extend_from_slice(&crc.to_le_bytes());
        e.extend_from_slice(&(data.len() as u32).to_le_bytes());
        e.extend_from_slice(&(data.len() as u32).to_le_bytes());
        e.extend_from_slice(&(name.len() as u16).to_le_bytes());
        e.extend_from_slice(&[0; 12]);
        e.extend_from_slice(&lho.to_le_bytes());
        e.extend_from_slice(name);
        hook(i, &mut e);
        central.push(e);
    }
    let cd_offset = out.len() as u32;
    let cd: Vec<u8> = central.concat();
    out.extend_from_slice(&cd);
    out.extend_from_slice(&EOCD_SIG.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(cd.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

const SIMPLE: &[(&[u8], &[u8])] =
    &[(b"a/data.pkl", b"pickle bytes"), (b"a/data/0", b"0123456789abcdef"), (b"a/version", b"3\n")];

fn no_hook(_: usize, _: &mut Vec<u8>) {}

/// Offset of the classic EOCD (archives built here have no comment).
fn eocd_pos(b: &[u8]) -> usize {
    b.len() - 22
}

/// Offset of central directory entry `i` of an archive (walks the directory).
fn cd_entry(b: &[u8], i: usize) -> usize {
    let ar = Archive::parse(b).unwrap();
    let mut pos = ar.central_directory_offset() as usize;
    for _ in 0..i {
        pos += 46 + get16(b, pos + 28) as usize + get16(b, pos + 30) as usize + get16(b, pos + 32) as usize;
    }
    pos
}

fn writer_output(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = ZipWriter::new(Vec::new(), "archive");
    for (name, data) in records {
        w.write_record(name, data).unwrap();
    }
    w.finish().unwrap()
}

const TORCH_LIKE: &[(&str, &[u8])] = &[
    ("data.pkl", b"\x80\x02}q\x00."),
    ("byteorder", b"little"),
    ("data/0", &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
    ("data/1", b""),
    ("version", b"3\n"),
];

/// Sink that only counts, keeping the bytes of small writes (headers, descriptors, end records).
#[derive(Default)]
struct Capture {
    pos: u64,
    writes: Vec<(u64, Vec<u8>)>,
}

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() < 4096 {
            self.writes.push((self.pos, buf.to_vec()));
        }
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    /// The captured write that starts at `pos`.
    fn at(&self, pos: u64) -> &[u8] {
        &self.writes.iter().find(|(p, _)| *p == pos).unwrap_or_else(|| panic!("no write at {pos}")).1
    }
}

/// Sink that keeps the bytes before and after a hole and discards the hole.
struct Holey {
    pos: u64,
    hole: std::ops::Range<u64>,
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl Write for Holey {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (start, end) = (self.pos, self.pos + buf.len() as u64);
        if start < self.hole.start {
            let n = (end.min(self.hole.start) - start) as usize;
            self.head.extend_from_slice(&buf[..n]);
        }
        if end > self.hole.end {
            let from = (start.max(self.hole.end) - start) as usize;
            self.tail.extend_from_slice(&buf[from..]);
        }
        self.pos = end;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writer that fails after `left` bytes.
struct FailAfter {
    left: usize,
}

impl Write for FailAfter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Err(std::io::Error::other("disk full"));
        }
        let n = buf.len().min(self.left);
        self.left -= n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------------
// byte-for-byte against torch 2.13

/// Re-writes every record of a torch file with our writer (same prefix, order and bytes; the
/// serialization id computed by us) and returns the output.
fn rewrite(original: &[u8], opts: WriterOptions) -> Vec<u8> {
    let ar = Archive::parse(original).unwrap();
    let mut w = ZipWriter::with_options(Vec::new(), ar.prefix(), opts);
    for r in ar.records() {
        let data = ar.data(original, r).unwrap();
        if r.short_name() == SERIALIZATION_ID_RECORD {
            let id = w.write_serialization_id().unwrap();
            assert_eq!(id.as_bytes(), data, "serialization id");
        } else {
            w.write_record(r.short_name(), data).unwrap();
        }
    }
    w.finish().unwrap()
}

#[test]
fn torch_ref_pt_listing() {
    // `python -m zipfile`-style listing of ref.pt: name, header offset, size, CRC.
    let expected: &[(&str, u64, u64, u32)] = &[
        ("ref/data.pkl", 0, 220, 0x2be6_05a7),
        ("ref/.format_version", 300, 1, 0x83dc_efb7),
        ("ref/.storage_alignment", 401, 2, 0xe971_773f),
        ("ref/byteorder", 530, 6, 0x19e3_3d85),
        ("ref/data/0", 662, 24, 0x91e7_9017),
        ("ref/data/1", 808, 12, 0x7bd5_c66f),
        ("ref/version", 924, 2, 0x5567_9ed1),
        ("ref/.data/serialization_id", 1042, 40, 0x85cb_6554),
    ];
    let bytes = fixture("ref.pt");
    let ar = Archive::parse(&bytes).unwrap();
    assert_eq!(ar.prefix(), "ref");
    assert_eq!(ar.prepended_len(), 0);
    assert_eq!(ar.records().len(), expected.len());
    for (r, &(name, lho, size, crc)) in ar.records().iter().zip(expected) {
        assert_eq!((r.name(), r.local_header_offset(), r.size(), r.crc32()), (name, lho, size, crc));
        assert_eq!(r.method(), 0);
        assert_eq!(r.flags(), 0x0808);
        assert_eq!(r.data_offset() % 64, 0, "{name} aligned");
        ar.verify_crc(&bytes, r).unwrap();
    }
    let w = ar.get("data/0").unwrap();
    let floats: Vec<f32> =
        ar.data(&bytes, w).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(floats, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(ar.data(&bytes, ar.get("version").unwrap()).unwrap(), b"3\n");
    assert_eq!(ar.data(&bytes, ar.get(".format_version").unwrap()).unwrap(), b"1");
    assert!(ar.get("data/2").is_none());
    assert!(ar.get("ref/data/0").is_none());
}

#[test]
fn torch_byte_identical_ref() {
    let original = fixture("ref.pt");
    assert_same_bytes(&rewrite(&original, WriterOptions::default()), &original);
}

#[test]
fn torch_byte_identical_many_records() {
    // 45 records: the name hash goes through three rehashes of the C++ unordered_set.
    let original = fixture("many.pt");
    assert_same_bytes(&rewrite(&original, WriterOptions::default()), &original);
}

#[test]
fn torch_byte_identical_descriptor_quirk() {
    // data/0 starts with PK\x07\x08: torch's callback hashes its bytes 4..8 as if a CRC.
    let original = fixture("quirk.pt");
    assert_same_bytes(&rewrite(&original, WriterOptions::default()), &original);
}

#[test]
fn torch_byte_identical_no_crc_and_empty_record() {
    // set_crc32_options(False), buffer target ("archive/"), a 0-byte storage (flags 0x0800, no
    // descriptor).
    let original = fixture("nocrc.pt");
    let ar = Archive::parse(&original).unwrap();
    assert_eq!(ar.prefix(), "archive");
    let empty = ar.get("data/0").unwrap();
    assert_eq!((empty.size(), empty.flags(), empty.crc32()), (0, 0x0800, 0));
    assert!(ar.records().iter().all(|r| r.crc32() == 0));
    let opts = WriterOptions { compute_crc32: false, ..WriterOptions::default() };
    assert_same_bytes(&rewrite(&original, opts), &original);
}

#[test]
fn torch_byte_identical_alignment_16() {
    let original = fixture("align16.pt");
    let opts = WriterOptions { alignment: 16, ..WriterOptions::default() };
    assert_same_bytes(&rewrite(&original, opts), &original);
}

#[test]
fn torch_byte_identical_zip64_record_over_4_gib() {
    // torch.save of a 4 GiB + 10 B uint8 tensor and a 3-float tensor under skip_data (data CRCs 0):
    // the fixture holds the bytes before and after the big record's data.
    let head = fixture("big_head.bin");
    let tail = fixture("big_tail.bin");
    let big: u64 = (1 << 32) + 10;
    let hole = head.len() as u64..head.len() as u64 + big;
    let sink = Holey { pos: 0, hole, head: Vec::new(), tail: Vec::new() };
    let mut w = ZipWriter::new(sink, "big");
    let pkl = &head[64..64 + 263];
    w.write_record("data.pkl", pkl).unwrap();
    w.write_record(".format_version", b"1").unwrap();
    w.write_record(".storage_alignment", b"64").unwrap();
    w.write_record("byteorder", b"little").unwrap();
    assert_eq!(w.next_data_offset("data/0", big).unwrap(), head.len() as u64);
    w.set_compute_crc32(false);
    let zeros = vec![0u8; 1 << 20];
    let mut parts: Vec<&[u8]> = vec![&zeros[..]; 4096];
    parts.push(&zeros[..10]);
    w.write_record_parts("data/0", &parts).unwrap();
    w.write_record("data/1", &[0; 12]).unwrap();
    w.set_compute_crc32(true);
    w.write_record("version", b"3\n").unwrap();
    w.write_serialization_id().unwrap();
    let sink = w.finish().unwrap();
    assert_same_bytes(&sink.head, &head);
    assert_same_bytes(&sink.tail, &tail);
}

// ------------------------------------------------------------------------------------------------
// writer

#[test]
fn writer_layout_and_round_trip() {
    let bytes = writer_output(TORCH_LIKE);
    let ar = Archive::parse(&bytes).unwrap();
    assert_eq!(ar.prefix(), "archive");
    assert_eq!(ar.records().len(), TORCH_LIKE.len());
    for (r, (name, data)) in ar.records().iter().zip(TORCH_LIKE) {
        assert_eq!(r.short_name(), *name);
        assert_eq!(r.name(), format!("archive/{name}"));
        assert_eq!(ar.data(&bytes, r).unwrap(), *data);
        assert_eq!(r.data_offset() % 64, 0);
        assert_eq!(r.crc32(), crc32fast::hash(data));
        ar.verify_crc(&bytes, r).unwrap();
        let lho = r.local_header_offset() as usize;
        assert_eq!(get16(&bytes, lho + 6), r.flags());
        // Local header: everything but flags, name and extra length is zero.
        assert!(bytes[lho + 8..lho + 26].iter().all(|&b| b == 0));
        let name_len = get16(&bytes, lho + 26) as usize;
        assert_eq!(&bytes[lho + 30 + name_len..lho + 32 + name_len], b"FB");
        let end = (r.data_offset() + r.size()) as usize;
        if data.is_empty() {
            assert_eq!(r.flags(), 0x0800);
        } else {
            assert_eq!(r.flags(), 0x0808);
            assert_eq!(get32(&bytes, end), DATA_DESCRIPTOR_SIG);
            assert_eq!(get32(&bytes, end + 4), r.crc32());
            assert_eq!(get32(&bytes, end + 8), data.len() as u32);
            assert_eq!(get32(&bytes, end + 12), data.len() as u32);
        }
    }
    // End records: zip64 EOCD (56) + locator (20) + EOCD (22), no comment.
    let n = bytes.len();
    let z = n - 98;
    assert_eq!(get32(&bytes, z), ZIP64_EOCD_SIG);
    assert_eq!(get64(&bytes, z + 4), 44);
    assert_eq!(get16(&bytes, z + 12), 0x031E);
    assert_eq!(get16(&bytes, z + 14), 45);
    assert_eq!(get64(&bytes, z + 24), TORCH_LIKE.len() as u64);
    assert_eq!(get64(&bytes, z + 48), ar.central_directory_offset());
    assert_eq!(get32(&bytes, n - 42), ZIP64_LOCATOR_SIG);
    assert_eq!(get64(&bytes, n - 34), z as u64);
    assert_eq!(get32(&bytes, n - 26), 1);
    assert_eq!(get32(&bytes, n - 22), EOCD_SIG);
    assert_eq!(get16(&bytes, n - 2), 0);
}

#[test]
fn writer_parts_equal_single_slice() {
    let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    let mut a = ZipWriter::new(Vec::new(), "m");
    a.write_record("data/0", &data).unwrap();
    let mut b = ZipWriter::new(Vec::new(), "m");
    b.write_record_parts("data/0", &[&data[..3], &[], &data[3..700], &data[700..]]).unwrap();
    assert_eq!(a.serialization_id(), b.serialization_id());
    assert_eq!(a.record_crcs().collect::<Vec<_>>(), b.record_crcs().collect::<Vec<_>>());
    assert_eq!(a.finish().unwrap(), b.finish().unwrap());
}

#[test]
fn writer_alignments() {
    for alignment in [1u64, 2, 16, 64, 100, 4096, MAX_ALIGNMENT] {
        let opts = WriterOptions { alignment, ..WriterOptions::default() };
        let mut w = ZipWriter::with_options(Vec::new(), "al", opts);
        let mut predicted = Vec::new();
        for (i, len) in [0usize, 1, 7, 300, 64].into_iter().enumerate() {
            let name = format!("data/{i}");
            predicted.push(w.next_data_offset(&name, len as u64).unwrap());
            w.write_record(&name, &vec![i as u8; len]).unwrap();
        }
        let bytes = w.finish().unwrap();
        let ar = Archive::parse(&bytes).unwrap();
        for (r, p) in ar.records().iter().zip(predicted) {
            assert_eq!(r.data_offset(), p);
            assert_eq!(r.data_offset() % alignment, 0, "alignment {alignment}");
            ar.verify_crc(&bytes, r).unwrap();
        }
    }
}

#[test]
fn writer_next_data_offset_matches() {
    let mut w = ZipWriter::new(Vec::new(), "archive");
    let mut predicted = Vec::new();
    for (name, data) in TORCH_LIKE {
        predicted.push(w.next_data_offset(name, data.len() as u64).unwrap());
        w.write_record(name, data).unwrap();
    }
    let bytes = w.finish().unwrap();
    let ar = Archive::parse(&bytes).unwrap();
    let actual: Vec<u64> = ar.records().iter().map(Record::data_offset).collect();
    assert_eq!(actual, predicted);
}

#[test]
fn writer_record_crcs_and_position() {
    let mut w =
        ZipWriter::with_options(Vec::new(), "p", WriterOptions { compute_crc32: false, ..WriterOptions::default() });
    assert_eq!(w.position(), 0);
    w.write_record("a", b"xyz").unwrap();
    w.set_compute_crc32(true);
    w.write_record("b", b"xyz").unwrap();
    let crcs: Vec<(String, u32)> = w.record_crcs().map(|(n, c)| (n.to_owned(), c)).collect();
    assert_eq!(crcs, [("p/a".to_owned(), 0), ("p/b".to_owned(), crc32fast::hash(b"xyz"))]);
    let pos = w.position();
    let out = w.finish().unwrap();
    assert_eq!(out.len() as u64, pos + 2 * 46 + 6 + 98);
}

#[test]
fn writer_no_records() {
    let bytes = ZipWriter::new(Vec::new(), "archive").finish().unwrap();
    assert_eq!(bytes.len(), 98);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::Empty)));
}

#[test]
fn writer_errors() {
    let mut w = ZipWriter::new(Vec::new(), "");
    assert!(matches!(w.write_record("x", b""), Err(ZipError::InvalidPrefix { .. })));
    let mut w = ZipWriter::new(Vec::new(), "a/b");
    assert!(matches!(w.write_record("x", b""), Err(ZipError::InvalidPrefix { .. })));

    for alignment in [0, MAX_ALIGNMENT + 1] {
        let opts = WriterOptions { alignment, ..WriterOptions::default() };
        let mut w = ZipWriter::with_options(Vec::new(), "a", opts);
        assert!(matches!(
            w.write_record("x", b""),
            Err(ZipError::InvalidAlignment { alignment: a }) if a == alignment
        ));
    }

    let mut w = ZipWriter::new(Vec::new(), "a");
    let long = "n".repeat(65535 - 1);
    assert!(matches!(w.write_record(&long, b""), Err(ZipError::NameTooLong { len: 65536, .. })));
    w.write_record(&long[1..], b"ok").unwrap(); // 65535 bytes: fits

    let mut w = ZipWriter::new(Vec::new(), "a");
    w.write_record("data/0", b"1").unwrap();
    let before = w.position();
    assert!(matches!(
        w.write_record("data/0", b"2"),
        Err(ZipError::DuplicateName { name }) if name == "data/0"
    ));
    assert_eq!(w.position(), before, "a refused record writes nothing");
    w.write_record("data/1", b"2").unwrap();
}

#[test]
fn writer_too_large() {
    let mut w = ZipWriter::new(Vec::new(), "a");
    w.pos = u64::MAX - 100;
    assert!(matches!(w.write_record("x", b"abc"), Err(ZipError::TooLarge { what: "archive offset" })));
    assert!(matches!(w.next_data_offset("x", 3), Err(ZipError::TooLarge { .. })));
    w.pos = u64::MAX - 200;
    assert!(matches!(w.write_record("x", &[0; 300]), Err(ZipError::TooLarge { .. })));
    assert_eq!(w.position(), u64::MAX - 200, "nothing written");
}

#[test]
fn writer_io_error_poisons() {
    let mut w = ZipWriter::new(FailAfter { left: 100 }, "a");
    w.write_record("data.pkl", b"abc").unwrap(); // 64 + 3 + 16 bytes
    assert!(matches!(w.write_record("data/0", &[0; 64]), Err(ZipError::Io(_))));
    assert!(matches!(w.write_record("data/1", b""), Err(ZipError::Poisoned)));
    assert!(matches!(w.finish(), Err(ZipError::Poisoned)));

    let mut w = ZipWriter::new(FailAfter { left: 83 }, "a");
    w.write_record("data.pkl", b"abc").unwrap();
    assert!(matches!(w.finish(), Err(ZipError::Io(_))));
}

#[test]
fn padding_formula_matches_spec() {
    // spec §2.3: start = cursor + 30 + len(name) + 4 (+4 +16 if size >= 0xFFFFFFFF, +8 if cursor
    // >= 0xFFFFFFFF, the +4 once if either); pad = (align - start % align) % align.
    fn spec(cursor: u64, name: u64, size: u64, align: u64) -> u64 {
        let mut start = cursor + 30 + name + 4;
        if size >= 0xFFFF_FFFF || cursor >= 0xFFFF_FFFF {
            start += 4;
            if size >= 0xFFFF_FFFF {
                start += 16;
            }
            if cursor >= 0xFFFF_FFFF {
                start += 8;
            }
        }
        (align - start % align) % align
    }
    let cursors = [0, 1, 300, 0xFFFF_FFFE, 0xFFFF_FFFF, 0x1_0000_0000, 0x1_2345_6789];
    let sizes = [0, 12, 0xFFFF_FFFE, 0xFFFF_FFFF, 0x1_0000_000A];
    for cursor in cursors {
        for size in sizes {
            for name in [8u64, 14, 26] {
                for align in [1u64, 16, 64, 100, 4096] {
                    assert_eq!(
                        padding_len(cursor, name, size, align),
                        Some(spec(cursor, name, size, align)),
                        "cursor {cursor} size {size} name {name} align {align}"
                    );
                }
            }
        }
    }
    // observed: big/data/0 at 726, 4 GiB + 10 bytes -> 42 bytes of padding, data at 832.
    assert_eq!(padding_len(726, 10, (1 << 32) + 10, 64), Some(42));
    assert_eq!(padding_len(0, 1, 1, 0), None);
    assert_eq!(padding_len(u64::MAX - 10, 1, 1, 64), None);
}

#[test]
fn writer_zip64_headers() {
    // A record of exactly 0xFFFFFFFF bytes already takes the zip64 path (>=); the record after it
    // starts beyond 4 GiB and gets an offset-only zip64 extra. Nothing is written for real: the
    // sink counts and keeps the small writes.
    let zeros = vec![0u8; 1 << 20];
    let mut parts: Vec<&[u8]> = vec![&zeros[..]; 4095];
    parts.push(&zeros[..(1 << 20) - 1]);
    let size: u64 = 0xFFFF_FFFF;
    let opts = WriterOptions { compute_crc32: false, ..WriterOptions::default() };
    let mut w = ZipWriter::with_options(Capture::default(), "archive", opts);
    w.write_record("data.pkl", b"pkl").unwrap();
    let big_lho = w.position(); // 83
    w.write_record_parts("data/0", &parts).unwrap();
    let small_lho = w.position();
    w.write_record("data/1", b"tail").unwrap();
    let cd_offset = w.position();
    let sink = w.finish().unwrap();

    // Local header of the big record: name "archive/data/0" (14), zip64 extra [size, 0], FB.
    let h = sink.at(big_lho);
    assert_eq!(get32(h, 0), LOCAL_HEADER_SIG);
    assert_eq!(get16(h, 6), 0x0808);
    assert_eq!(get32(h, 18), 0, "local sizes stay 0");
    assert_eq!(get32(h, 22), 0);
    assert_eq!(get16(h, 26), 14);
    let extra = &h[44..];
    assert_eq!(get16(extra, 0), 1);
    assert_eq!(get16(extra, 2), 16);
    assert_eq!(get64(extra, 4), size);
    assert_eq!(get64(extra, 12), 0);
    assert_eq!(&extra[20..22], b"FB");
    let pad = get16(extra, 22) as u64;
    assert_eq!(pad, padding_len(big_lho, 14, size, 64).unwrap());
    assert_eq!(extra.len() as u64, 24 + pad);
    let data_start = big_lho + h.len() as u64;
    assert_eq!(data_start % 64, 0);
    // 24-byte descriptor with u64 sizes.
    let d = sink.at(data_start + size);
    assert_eq!(d.len(), 24);
    assert_eq!((get32(d, 0), get32(d, 4)), (DATA_DESCRIPTOR_SIG, 0));
    assert_eq!((get64(d, 8), get64(d, 16)), (size, size));
    assert_eq!(small_lho, data_start + size + 24);
    assert!(small_lho >= 0xFFFF_FFFF);

    // The next local header: zip64 extra with the header offset only; 24-byte descriptor too.
    let h = sink.at(small_lho);
    let extra = &h[44..];
    assert_eq!((get16(extra, 0), get16(extra, 2)), (1, 8));
    assert_eq!(get64(extra, 4), small_lho);
    assert_eq!(&extra[12..14], b"FB");
    let data_start = small_lho + h.len() as u64;
    assert_eq!(data_start % 64, 0);
    assert_eq!(sink.at(data_start), b"tail");
    let d = sink.at(data_start + 4);
    assert_eq!(d.len(), 24);
    assert_eq!((get64(d, 8), get64(d, 16)), (4, 4));

    // Central directory (one write) and end records (one write).
    let cd = sink.at(cd_offset);
    let e0 = 0;
    assert_eq!((get16(cd, e0 + 28), get16(cd, e0 + 30)), (16, 0));
    assert_eq!(get32(cd, e0 + 42), 0);
    let e1 = e0 + 46 + 16;
    assert_eq!((get32(cd, e1 + 20), get32(cd, e1 + 24)), (u32::MAX, u32::MAX));
    assert_eq!((get16(cd, e1 + 28), get16(cd, e1 + 30)), (14, 20));
    assert_eq!(get32(cd, e1 + 42), big_lho as u32);
    let x = e1 + 46 + 14;
    assert_eq!((get16(cd, x), get16(cd, x + 2)), (1, 16));
    assert_eq!((get64(cd, x + 4), get64(cd, x + 12)), (size, size));
    let e2 = x + 20;
    assert_eq!((get32(cd, e2 + 20), get32(cd, e2 + 24)), (4, 4));
    assert_eq!((get16(cd, e2 + 28), get16(cd, e2 + 30)), (14, 12));
    assert_eq!(get32(cd, e2 + 42), u32::MAX);
    let x = e2 + 46 + 14;
    assert_eq!((get16(cd, x), get16(cd, x + 2), get64(cd, x + 4)), (1, 8, small_lho));
    assert_eq!(cd.len(), x + 12);

    // The three parsers' view of the central directory entries.
    let z = parse_zip64_extra("archive/data/0", &cd[e1 + 60..e1 + 80], true, true, false, false).unwrap();
    assert_eq!((z.size, z.compressed_size, z.local_header_offset), (Some(size), Some(size), None));

    let end = sink.at(cd_offset + cd.len() as u64);
    assert_eq!(end.len(), 98);
    assert_eq!(get64(end, 24), 3);
    assert_eq!(get64(end, 40), cd.len() as u64);
    assert_eq!(get64(end, 48), cd_offset);
    assert_eq!(get64(end, 56 + 8), cd_offset + cd.len() as u64);
    assert_eq!(get32(end, 76 + 16), u32::MAX, "EOCD cd offset clamps to 0xFFFFFFFF");
    assert_eq!(get16(end, 76 + 10), 3);
}

#[test]
fn writer_size_just_below_zip64() {
    // 0xFFFFFFFE bytes: no zip64 for the size, 16-byte descriptor; the next header is at >= 4 GiB.
    let zeros = vec![0u8; 1 << 20];
    let mut parts: Vec<&[u8]> = vec![&zeros[..]; 4095];
    parts.push(&zeros[..(1 << 20) - 2]);
    let opts = WriterOptions { compute_crc32: false, ..WriterOptions::default() };
    let mut w = ZipWriter::with_options(Capture::default(), "archive", opts);
    w.write_record_parts("data/0", &parts).unwrap();
    let next = w.position();
    let sink = w.finish().unwrap();
    let h = sink.at(0);
    assert_eq!(get16(h, 28) as usize, h.len() - 30 - 14);
    assert_eq!(&h[44..46], b"FB");
    let d = sink.at(next - 16);
    assert_eq!(d.len(), 16);
    assert_eq!(get32(d, 8), 0xFFFF_FFFE);
    assert_eq!(next, 64 + 0xFFFF_FFFE + 16);
}

// ------------------------------------------------------------------------------------------------
// serialization id

#[test]
fn std_string_hash_matches_libstdcxx() {
    // Values printed by a C++ program (g++ 12, libstdc++) for std::hash<std::string>.
    let cases: &[(&str, u64)] = &[
        ("version", 1_565_691_551_459_181_974),
        ("data/0", 476_597_642_816_643_211),
        ("data/1", 6_305_553_231_566_356_347),
        ("data.pkl", 4_941_642_132_189_851_806),
        ("byteorder", 17_475_754_552_457_364_548),
        (".storage_alignment", 6_538_796_466_453_296_957),
        (".format_version", 17_551_914_330_364_864_604),
    ];
    for &(s, h) in cases {
        assert_eq!(std_string_hash(s.as_bytes()), h, "{s}");
    }
    // hash_combine(0, h) = h + 0x9e3779b9
    assert_eq!(hash_combine(0, std_string_hash(b"abcdefgh")), 8_664_279_050_701_771_380);
    assert_eq!(hash_combine(0, std_string_hash(b"abcdefghi")), 13_036_955_928_578_229_352);
    assert_eq!(hash_combine(0, std_string_hash(SERIALIZATION_ID_RECORD.as_bytes())), 6_612_201_022_957_128_951);
}

#[test]
fn name_hash_follows_unordered_set_iteration() {
    // Names data.pkl, .format_version, .storage_alignment, byteorder, data/0..data/{n-1}, version
    // inserted into a std::unordered_set<std::string>; combined hash printed by C++ (libstdc++).
    let expected: &[(usize, u64)] = &[
        (0, 2_908_468_677_762_923_104),
        (1, 15_728_199_511_854_643_026),
        (9, 1_977_860_353_369_201_443),
        (10, 12_377_610_408_694_458_067),
        (25, 14_750_728_607_576_356_699),
        (60, 137_648_793_660_415_785),
        (130, 10_899_235_613_604_673_089),
        (600, 13_395_798_791_159_975_732),
        (1200, 7_006_458_023_395_743_877),
        (2500, 1_829_473_768_194_672_803),
        (5100, 14_612_777_795_382_059_050),
    ];
    for &(n, h) in expected {
        let mut names: Vec<String> =
            ["data.pkl", ".format_version", ".storage_alignment", "byteorder"].iter().map(|s| s.to_string()).collect();
        names.extend((0..n).map(|i| format!("data/{i}")));
        names.push("version".into());
        assert_eq!(combined_name_hash(names.iter().map(String::as_str)), h, "n = {n}");
    }
    // Duplicates are ignored, as by the set.
    assert_eq!(combined_name_hash(["a", "b", "a"]), combined_name_hash(["a", "b"]));
}

#[test]
fn serialization_id_free_function() {
    // ref.pt: names in write order and descriptor CRCs -> the id torch wrote.
    let names = ["data.pkl", ".format_version", ".storage_alignment", "byteorder", "data/0", "data/1", "version"];
    let crcs = [0x2be6_05a7, 0x83dc_efb7, 0xe971_773f, 0x19e3_3d85, 0x91e7_9017, 0x7bd5_c66f, 0x5567_9ed1];
    assert_eq!(serialization_id(names, crcs), "0561108523619670529415180900430020000284");
    assert_eq!(serialization_id([], []), format!("{:020}{:020}", 0, 0));
}

// ------------------------------------------------------------------------------------------------
// reader: layouts it must accept

#[test]
fn reads_python_zipfile_layout() {
    let bytes = build(SIMPLE, no_hook);
    let ar = Archive::parse(&bytes).unwrap();
    assert_eq!(ar.prefix(), "a");
    for (r, (name, data)) in ar.records().iter().zip(SIMPLE) {
        assert_eq!(r.name().as_bytes(), *name);
        assert_eq!(ar.data(&bytes, r).unwrap(), *data);
        ar.verify_crc(&bytes, r).unwrap();
    }
    assert_eq!(ar.get("data/0").unwrap().local_header_offset(), 30 + 10 + 12);
}

#[test]
fn tolerates_trailing_bytes() {
    let archive = writer_output(TORCH_LIKE);
    for trailing in [1usize, 21, 1000, 65535] {
        let mut bytes = archive.clone();
        bytes.resize(archive.len() + trailing, 0);
        let ar = Archive::parse(&bytes).unwrap();
        assert_eq!(ar.prepended_len(), 0);
        assert_eq!(ar.data(&bytes, ar.get("data/0").unwrap()).unwrap(), TORCH_LIKE[2].1);
    }
    // Beyond the longest possible comment the EOCD is not searched for.
    let mut bytes = archive.clone();
    bytes.resize(archive.len() + 65536, 0);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::NotZip { .. })));
}

#[test]
fn handles_prepended_bytes() {
    // zip64 end records (our writer) and classic ones (zipfile layout).
    for archive in [writer_output(TORCH_LIKE), build(SIMPLE, no_hook)] {
        let junk = vec![0xAAu8; 1000];
        let bytes = [junk.as_slice(), archive.as_slice()].concat();
        let plain = Archive::parse(&archive).unwrap();
        let ar = Archive::parse(&bytes).unwrap();
        assert_eq!(ar.prepended_len(), 1000);
        for (a, b) in ar.records().iter().zip(plain.records()) {
            assert_eq!(a.data_offset(), b.data_offset() + 1000);
            assert_eq!(a.local_header_offset(), b.local_header_offset() + 1000);
            assert_eq!(ar.data(&bytes, a).unwrap(), plain.data(&archive, b).unwrap());
            ar.verify_crc(&bytes, a).unwrap();
        }
    }
}

#[test]
fn parses_a_window_of_a_larger_file() {
    // Like one item of a DCP .distcp file: offsets are relative to the window.
    let archive = writer_output(TORCH_LIKE);
    let file = [vec![7u8; 1261], archive.clone(), vec![9u8; 500]].concat();
    let window = &file[1261..1261 + archive.len()];
    let ar = Archive::parse(window).unwrap();
    assert_eq!(ar.prepended_len(), 0);
    let r = ar.get("data/0").unwrap();
    assert_eq!(r.data_offset() % 64, 0);
    assert_eq!(ar.data(window, r).unwrap(), TORCH_LIKE[2].1);
}

#[test]
fn zip64_extra_in_central_directory() {
    // Sentinels in the central entry with the real values in a zip64 extra field that follows an
    // unrelated extra block.
    let bytes = build(SIMPLE, |i, e| {
        if i == 1 {
            let size = get32(e, 24);
            let lho = get32(e, 42);
            set32(e, 20, u32::MAX);
            set32(e, 24, u32::MAX);
            set32(e, 42, u32::MAX);
            let mut extra = vec![0x55, 0x54, 5, 0, 1, 2, 3, 4, 5];
            extra.extend_from_slice(&[1, 0, 24, 0]);
            extra.extend_from_slice(&u64::from(size).to_le_bytes());
            extra.extend_from_slice(&u64::from(size).to_le_bytes());
            extra.extend_from_slice(&u64::from(lho).to_le_bytes());
            set16(e, 30, extra.len() as u16);
            e.extend_from_slice(&extra);
        }
    });
    let ar = Archive::parse(&bytes).unwrap();
    let r = ar.get("data/0").unwrap();
    assert_eq!(r.size(), 16);
    assert_eq!(r.local_header_offset(), 52);
    assert_eq!(ar.data(&bytes, r).unwrap(), b"0123456789abcdef");
}

#[test]
fn zip64_extra_parsing() {
    let mut block = vec![1, 0, 28, 0];
    for v in [0x1_0000_000Au64, 0x1_0000_000B, 0x2_0000_0000] {
        block.extend_from_slice(&v.to_le_bytes());
    }
    block.extend_from_slice(&7u32.to_le_bytes());
    let z = parse_zip64_extra("n", &block, true, true, true, true).unwrap();
    assert_eq!(z.size, Some(0x1_0000_000A));
    assert_eq!(z.compressed_size, Some(0x1_0000_000B));
    assert_eq!(z.local_header_offset, Some(0x2_0000_0000));
    assert_eq!(z.disk, Some(7));
    // Only the sentinel fields are present, in order: an offset-only block.
    let z = parse_zip64_extra("n", &[1, 0, 8, 0, 9, 0, 0, 0, 1, 0, 0, 0], false, false, true, false).unwrap();
    assert_eq!(z.local_header_offset, Some(0x1_0000_0009));
    assert_eq!(z.size, None);
    // Nothing needed: the block is not read.
    assert_eq!(parse_zip64_extra("n", &[], false, false, false, false).unwrap(), Default::default());
    // Trailing bytes shorter than a block header are ignored.
    parse_zip64_extra("n", &[1, 0, 0, 0, 0xFF], false, false, false, false).unwrap();
    // Too short for what is needed.
    assert!(matches!(
        parse_zip64_extra("n", &[1, 0, 8, 0, 9, 0, 0, 0, 1, 0, 0, 0], true, true, false, false),
        Err(ZipError::Zip64ExtraMissing { field: "compressed size", .. })
    ));
    assert!(matches!(
        parse_zip64_extra("n", &[0x55, 0x54, 1, 0, 0], false, false, true, false),
        Err(ZipError::Zip64ExtraMissing { field: "local header offset", .. })
    ));
}

// ------------------------------------------------------------------------------------------------
// reader: one test per error

#[test]
fn err_not_zip() {
    for bytes in [&b""[..], b"PK\x03\x04", &[0u8; 100], b"version https://git-lfs.github.com/spec/v1\n"] {
        assert!(matches!(Archive::parse(bytes), Err(ZipError::NotZip { .. })));
    }
}

#[test]
fn err_empty() {
    let mut eocd = EOCD_SIG.to_le_bytes().to_vec();
    eocd.extend_from_slice(&[0; 18]);
    assert!(matches!(Archive::parse(&eocd), Err(ZipError::Empty)));
}

#[test]
fn err_truncated() {
    // A central entry whose name runs past the central directory.
    let mut bytes = build(SIMPLE, no_hook);
    let e = cd_entry(&bytes, 2);
    set16(&mut bytes, e + 28, 0x4000);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::Truncated { what: "central directory entry", .. })));
    // Record data beyond the end of the slice.
    let bytes = build(SIMPLE, |i, e| {
        if i == 0 {
            set32(e, 20, 0x7FFF_FFFF);
            set32(e, 24, 0x7FFF_FFFF);
        }
    });
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::Truncated { what: "record data", needed: 0x7FFF_FFFF, .. })
    ));
    // A local header offset that leaves less than 4 bytes.
    let n = build(SIMPLE, no_hook).len() as u32;
    let bytes = build(SIMPLE, |i, e| {
        if i == 2 {
            set32(e, 42, n - 2);
        }
    });
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::Truncated { what: "local file header", .. })));
    // Cut in the middle of the central directory: the EOCD is gone.
    let bytes = build(SIMPLE, no_hook);
    assert!(matches!(Archive::parse(&bytes[..bytes.len() - 30]), Err(ZipError::NotZip { .. })));
}

#[test]
fn err_bad_signature() {
    let mut bytes = build(SIMPLE, no_hook);
    let lho = Archive::parse(&bytes).unwrap().get("version").unwrap().local_header_offset() as usize;
    bytes[lho] = b'Q';
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::BadSignature { what: "local file header", offset, expected: LOCAL_HEADER_SIG, .. })
            if offset == lho as u64
    ));

    let mut bytes = build(SIMPLE, no_hook);
    let e = cd_entry(&bytes, 1);
    bytes[e + 1] = 0;
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::BadSignature { what: "central directory entry", expected: CENTRAL_HEADER_SIG, .. })
    ));

    // zip64 EOCD neither before the locator nor where the locator says.
    let mut bytes = writer_output(TORCH_LIKE);
    let z = bytes.len() - 98;
    bytes[z] = 0;
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::BadSignature { what: "zip64 end of central directory record", .. })
    ));
}

#[test]
fn err_multi_disk() {
    let mut bytes = build(SIMPLE, no_hook);
    let eocd = eocd_pos(&bytes);
    set16(&mut bytes, eocd + 4, 1);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::MultiDisk { .. })));

    let mut bytes = writer_output(TORCH_LIKE);
    let locator = bytes.len() - 42;
    set32(&mut bytes, locator + 16, 3);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::MultiDisk { what: "zip64 locator total disks", value: 3 })));
}

#[test]
fn err_central_directory_misplaced() {
    let mut bytes = build(SIMPLE, no_hook);
    let eocd = eocd_pos(&bytes);
    set32(&mut bytes, eocd + 16, 0xFFFF_FF00);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::CentralDirectoryMisplaced { cd_offset: 0xFFFF_FF00, .. })));
    // zip64: cd_offset + cd_size overflows u64.
    let mut bytes = writer_output(TORCH_LIKE);
    let z = bytes.len() - 98;
    bytes[z + 48..z + 56].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::CentralDirectoryMisplaced { .. })));
}

#[test]
fn err_entry_count_too_large() {
    let mut bytes = build(SIMPLE, no_hook);
    let eocd = eocd_pos(&bytes);
    set16(&mut bytes, eocd + 8, 5000);
    set16(&mut bytes, eocd + 10, 5000);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::EntryCountTooLarge { claimed: 5000, max: 3, .. })));
    // zip64 count of u64::MAX: refused before any allocation.
    let mut bytes = writer_output(TORCH_LIKE);
    let z = bytes.len() - 98;
    bytes[z + 24..z + 40].copy_from_slice(&[0xFF; 16]);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::EntryCountTooLarge { claimed: u64::MAX, .. })));
}

#[test]
fn err_malformed_extra() {
    let bytes = build(SIMPLE, |i, e| {
        if i == 0 {
            set16(e, 30, 7);
            e.extend_from_slice(&[1, 0, 32, 0, 1, 2, 3]);
        }
    });
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::MalformedExtra { name, at: 0 }) if name == "a/data.pkl"
    ));
}

#[test]
fn err_zip64_extra_missing() {
    let bytes = build(SIMPLE, |i, e| {
        if i == 2 {
            set32(e, 24, u32::MAX);
        }
    });
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::Zip64ExtraMissing { name, field: "uncompressed size" }) if name == "a/version"
    ));
}

#[test]
fn err_invalid_name() {
    let bytes = build(&[(b"a/\xff\xfe", b"x")], no_hook);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::InvalidName { .. })));
}

#[test]
fn err_not_in_subdirectory() {
    let bytes = build(&[(b"data.pkl", b"x"), (b"a/version", b"3\n")], no_hook);
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::NotInSubdirectory { name }) if name == "data.pkl"
    ));
    let bytes = build(&[(b"a/data.pkl", b"x"), (b"version", b"3\n")], no_hook);
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::NotInSubdirectory { name }) if name == "version"
    ));
}

#[test]
fn err_mixed_prefix() {
    let bytes = build(&[(b"a/data.pkl", b"x"), (b"b/data/0", b"y")], no_hook);
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::MixedPrefix { prefix, name }) if prefix == "a" && name == "b/data/0"
    ));
    // A longer prefix that merely starts with the same characters is another directory.
    let bytes = build(&[(b"a/data.pkl", b"x"), (b"ab/data/0", b"y")], no_hook);
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::MixedPrefix { .. })));
}

#[test]
fn err_duplicate_name() {
    let bytes = build(&[(b"a/data/0", b"x"), (b"a/data.pkl", b"p"), (b"a/data/0", b"y")], no_hook);
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::DuplicateName { name }) if name == "a/data/0"
    ));
}

#[test]
fn err_local_name_mismatch() {
    let bytes = build(SIMPLE, |i, e| {
        if i == 1 {
            let last = e.len() - 1;
            e[last] = b'1'; // central "a/data/1", local "a/data/0"
        }
    });
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::LocalNameMismatch { central, local, offset: 52 })
            if central == "a/data/1" && local == "a/data/0"
    ));
}

#[test]
fn err_stored_size_mismatch() {
    let bytes = build(SIMPLE, |i, e| {
        if i == 1 {
            set32(e, 20, 15);
        }
    });
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::StoredSizeMismatch { compressed: 15, uncompressed: 16, .. })
    ));
}

#[test]
fn err_overlap() {
    // data.pkl claims 20 more bytes: it runs into the local header of data/0.
    let bytes = build(SIMPLE, |i, e| {
        if i == 0 {
            set32(e, 20, 32);
            set32(e, 24, 32);
        }
    });
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::Overlap { a, b }) if a == "a/data.pkl" && b == "a/data/0"
    ));
    // version runs into the central directory.
    let bytes = build(SIMPLE, |i, e| {
        if i == 2 {
            set32(e, 20, 12);
            set32(e, 24, 12);
        }
    });
    assert!(matches!(
        Archive::parse(&bytes),
        Err(ZipError::Overlap { a, b }) if a == "a/version" && b == "<central directory>"
    ));
    // Two entries sharing one local header (the name check passes for both: same name is caught
    // as a duplicate, so use a second entry pointing into the first's data).
    let bytes = build(SIMPLE, |i, e| {
        if i == 2 {
            set32(e, 42, 0);
        }
    });
    assert!(matches!(Archive::parse(&bytes), Err(ZipError::LocalNameMismatch { .. })));
}

#[test]
fn err_compressed_and_encrypted() {
    let bytes = build(SIMPLE, |i, e| match i {
        1 => set16(e, 10, 8),
        2 => set16(e, 8, 1),
        _ => {}
    });
    let ar = Archive::parse(&bytes).unwrap();
    let r = ar.get("data/0").unwrap();
    assert_eq!(r.method(), 8);
    assert!(matches!(ar.data(&bytes, r), Err(ZipError::Compressed { method: 8, .. })));
    // Marked DEFLATE, but its bytes are no DEFLATE stream: the inflater says so.
    assert!(matches!(ar.verify_crc(&bytes, r), Err(ZipError::Inflate { .. })));
    assert!(matches!(ar.record_bytes(&bytes, r, 1 << 20), Err(ZipError::Inflate { .. })));
    assert_eq!(r.data_range(), 90..106, "the raw range is still available");
    let r = ar.get("version").unwrap();
    assert!(matches!(ar.data(&bytes, r), Err(ZipError::Encrypted { name }) if name == "a/version"));
    let bytes = build(SIMPLE, |i, e| {
        if i == 1 {
            set16(e, 10, 12); // bzip2
        }
    });
    let ar = Archive::parse(&bytes).unwrap();
    let r = ar.get("data/0").unwrap();
    assert!(matches!(ar.record_bytes(&bytes, r, 1 << 20), Err(ZipError::Compressed { method: 12, .. })));
}

#[test]
fn err_buffer_mismatch() {
    let bytes = build(SIMPLE, no_hook);
    let ar = Archive::parse(&bytes).unwrap();
    let r = ar.get("data/0").unwrap();
    assert!(matches!(ar.data(&bytes[..10], r), Err(ZipError::BufferMismatch { given: 10, .. })));
}

#[test]
fn err_crc_mismatch_and_crc_zero() {
    let mut bytes = build(SIMPLE, no_hook);
    let ar = Archive::parse(&bytes).unwrap();
    let r = ar.get("data/0").unwrap().clone();
    bytes[r.data_offset() as usize] ^= 1;
    assert!(matches!(
        ar.verify_crc(&bytes, &r),
        Err(ZipError::CrcMismatch { name, expected, actual })
            if name == "a/data/0" && expected == crc32fast::hash(b"0123456789abcdef") && actual != expected
    ));
    // CRC 0 = not computed (torch under set_crc32_options(False)): accepted.
    let bytes = build(SIMPLE, |_, e| set32(e, 16, 0));
    let ar = Archive::parse(&bytes).unwrap();
    for r in ar.records() {
        ar.verify_crc(&bytes, r).unwrap();
    }
}

#[test]
fn never_panics_on_mutations() {
    // Every single-byte corruption and every truncation of a small archive either parses or fails
    // with an error; reading the records of what parses never panics either.
    let archive = writer_output(TORCH_LIKE);
    let check = |bytes: &[u8]| {
        if let Ok(ar) = Archive::parse(bytes) {
            for r in ar.records() {
                let _ = ar.data(bytes, r);
                let _ = ar.verify_crc(bytes, r);
                assert!(ar.get(r.short_name()).is_some());
            }
        }
    };
    for i in 0..archive.len() {
        for v in [0x00, 0xFF, 0x01] {
            let mut b = archive.clone();
            b[i] ^= v;
            check(&b);
        }
        check(&archive[..i]);
        check(&archive[i..]);
    }
}

#[test]
fn large_records_crc_computed_in_parallel_matches() {
    let a: Vec<u8> = (0..(3usize << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8).collect();
    let b: Vec<u8> = (0..(2usize << 20) + 17).map(|i| (i.wrapping_mul(40_503) >> 3) as u8).collect();
    let mut w = ZipWriter::new(Vec::new(), "archive");
    w.write_record_parts("big", &[&a, &b]).unwrap();
    w.write_record("small", &a[..100]).unwrap();
    let crcs: Vec<(String, u32)> = w.record_crcs().map(|(n, c)| (n.to_owned(), c)).collect();
    let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
    assert_eq!(crcs[0], ("archive/big".to_owned(), crc32fast::hash(&whole)));
    assert_eq!(crcs[1], ("archive/small".to_owned(), crc32fast::hash(&a[..100])));
    let bytes = w.finish().unwrap();
    let ar = Archive::parse(&bytes).unwrap();
    let rec = ar.get("big").unwrap();
    assert_eq!(ar.data(&bytes, rec).unwrap(), &whole[..]);
    ar.verify_crc(&bytes, rec).unwrap();
}

/// [`rewrite`] with every record streamed in pieces of `piece` bytes.
fn rewrite_streamed(original: &[u8], opts: WriterOptions, piece: usize) -> Vec<u8> {
    let ar = Archive::parse(original).unwrap();
    let mut w = ZipWriter::with_options(Vec::new(), ar.prefix(), opts);
    for r in ar.records() {
        let data = ar.data(original, r).unwrap();
        if r.short_name() == SERIALIZATION_ID_RECORD {
            w.write_serialization_id().unwrap();
        } else {
            w.write_record_streamed(r.short_name(), data.len() as u64, &mut |sink| {
                data.chunks(piece).try_for_each(&mut *sink)
            })
            .unwrap();
        }
    }
    w.finish().unwrap()
}

#[test]
fn streamed_records_are_torch_byte_identical() {
    // Every fixture, pieces of 1 byte (the descriptor quirk's 8 bytes then span 8 pieces), 3 and 4096.
    let fixtures = [
        ("ref.pt", WriterOptions::default()),
        ("many.pt", WriterOptions::default()),
        ("quirk.pt", WriterOptions::default()),
        ("nocrc.pt", WriterOptions { compute_crc32: false, ..WriterOptions::default() }),
        ("align16.pt", WriterOptions { alignment: 16, ..WriterOptions::default() }),
    ];
    for (name, opts) in fixtures {
        let original = fixture(name);
        for piece in [1, 3, 4096] {
            assert_same_bytes(&rewrite_streamed(&original, opts, piece), &original);
        }
    }
}

#[test]
fn a_streamed_record_of_the_wrong_size_poisons_the_writer() {
    let mut w = ZipWriter::new(Vec::new(), "archive");
    let e = w.write_record_streamed("data/0", 8, &mut |sink| sink(b"1234")).unwrap_err();
    assert!(matches!(e, ZipError::Io(_)), "{e}");
    assert!(matches!(w.write_record("data/1", b"x"), Err(ZipError::Poisoned)));
    let mut w = ZipWriter::new(Vec::new(), "archive");
    let e = w.write_record_streamed("data/0", 4, &mut |_| Err(std::io::Error::other("the gather failed"))).unwrap_err();
    assert!(e.to_string().contains("the gather failed"), "{e}");
}

// ------------------------------------------------------------------------------------------------
// parse_overlapped: local headers read on a second thread

/// A torch-laid-out archive of `data.pkl` and `n` storages of assorted sizes (so paddings vary).
fn many_records(n: usize, opts: WriterOptions) -> Vec<u8> {
    let mut w = ZipWriter::with_options(Vec::new(), "archive", opts);
    w.write_record("data.pkl", b"\x80\x02}q\x00.").unwrap();
    for i in 0..n {
        w.write_record(&format!("data/{i}"), &vec![i as u8; 1 + (i * 7) % 200]).unwrap();
    }
    w.write_record("version", b"3\n").unwrap();
    w.finish().unwrap()
}

/// What [`overlapped_from`] saw: the archive, what the last run of the work read, how many times the work ran,
/// and the ranges handed to `scanned`.
type Overlapped = (Archive, Vec<Vec<u8>>, usize, Vec<std::ops::Range<u64>>);

/// How [`overlapped_from`] reads the local headers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reads {
    /// From the slice ([`HeaderSource::Slice`]).
    Slice,
    /// Copies of the slice's bytes, as `pread` of the file gives them ([`HeaderSource::ReadAt`]).
    Copies,
    /// Copies, but every third read fails.
    SomeFail,
    /// Zeros: no header read so is well formed.
    Zeros,
}

const READS: [Reads; 4] = [Reads::Slice, Reads::Copies, Reads::SomeFail, Reads::Zeros];

/// `parse_overlapped` with a work that reads every record, the local headers read as `reads` says.
fn overlapped_from(bytes: &[u8], reads: Reads) -> Result<Overlapped, ZipError> {
    let scanned = std::sync::Mutex::new(Vec::new());
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let forget = |r| scanned.lock().unwrap().push(r);
    let read_at = |at: u64, out: &mut [u8]| {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(src) = bytes.get(at as usize..at as usize + out.len()) else { return false };
        match reads {
            Reads::Zeros => out.fill(0),
            Reads::SomeFail if n % 3 == 0 => return false,
            _ => out.copy_from_slice(src),
        }
        true
    };
    let source = if reads == Reads::Slice { HeaderSource::Slice(&forget) } else { HeaderSource::ReadAt(&read_at) };
    let mut runs = 0;
    let (ar, data) = Archive::parse_overlapped(bytes, source, |a| {
        runs += 1;
        a.records().iter().map(|r| a.data(bytes, r).map(<[u8]>::to_vec).unwrap_or_default()).collect::<Vec<_>>()
    })?;
    Ok((ar, data, runs, scanned.into_inner().unwrap()))
}

fn records_data(bytes: &[u8]) -> Vec<Vec<u8>> {
    let ar = Archive::parse(bytes).unwrap();
    ar.records().iter().map(|r| ar.data(bytes, r).unwrap().to_vec()).collect()
}

#[test]
fn overlapped_parse_of_a_torch_layout_runs_the_work_once_on_the_parsed_offsets() {
    for (n, reads) in [3, 600, 2000].into_iter().flat_map(|n| READS.map(|r| (n, r))) {
        let bytes = many_records(n, WriterOptions::default());
        let (ar, data, runs, scanned) = overlapped_from(&bytes, reads).unwrap();
        assert_eq!(ar.records(), Archive::parse(&bytes).unwrap().records(), "{reads:?}");
        assert_eq!(data, records_data(&bytes));
        assert_eq!(runs, 1);
        if n < 512 || reads != Reads::Slice {
            assert!(scanned.is_empty(), "no second thread for {n} records, no pages to drop after reads");
            continue;
        }
        // The scanned ranges cover the storages' headers and leave data.pkl's record to the work.
        let pkl = ar.get("data.pkl").unwrap();
        assert!(!scanned.is_empty());
        for r in &scanned {
            assert!(r.start < r.end && r.end <= bytes.len() as u64, "{r:?}");
            assert!(r.end <= pkl.local_header_offset() || r.start >= pkl.data_range().end, "{r:?} overlaps data.pkl");
        }
        let last = ar.records().iter().map(Record::local_header_offset).max().unwrap();
        assert!(scanned.iter().any(|r| r.contains(&last)));
    }
}

#[test]
fn overlapped_parse_of_another_alignment_reads_the_headers_first() {
    // data.pkl is not where a 64-byte alignment puts it: the headers are read before the work runs.
    for reads in READS {
        let bytes = many_records(700, WriterOptions { alignment: 4096, ..WriterOptions::default() });
        let (ar, data, runs, scanned) = overlapped_from(&bytes, reads).unwrap();
        assert_eq!(ar.records(), Archive::parse(&bytes).unwrap().records());
        assert_eq!(data, records_data(&bytes));
        assert_eq!((runs, scanned.len()), (1, 0));
        // At 16 bytes data.pkl's header happens to end on a multiple of 64 too: the work runs on the
        // predicted offsets, then again on the headers' (every storage moved), with the same result.
        let bytes = many_records(700, WriterOptions { alignment: 16, ..WriterOptions::default() });
        let (ar, data, runs, _) = overlapped_from(&bytes, reads).unwrap();
        assert_eq!(ar.records(), Archive::parse(&bytes).unwrap().records());
        assert_eq!(data, records_data(&bytes));
        assert_eq!(runs, 2, "{reads:?}");
    }
}

#[test]
fn overlapped_parse_reruns_the_work_when_a_local_header_moves_the_data() {
    let mut bytes = many_records(800, WriterOptions::default());
    let ar = Archive::parse(&bytes).unwrap();
    // A storage whose FB padding has at least 4 bytes: its local header, 4 bytes shorter, puts the data
    // 4 bytes earlier (a valid archive, not torch's layout).
    let rec = ar
        .records()
        .iter()
        .find(|r| {
            let lho = r.local_header_offset() as usize;
            r.short_name().starts_with("data/") && get16(&bytes, lho + 28) >= 8
        })
        .unwrap();
    let lho = rec.local_header_offset() as usize;
    let extra_len = get16(&bytes, lho + 28);
    set16(&mut bytes, lho + 28, extra_len - 4);
    let parsed = Archive::parse(&bytes).unwrap();
    assert_eq!(parsed.get(rec.short_name()).unwrap().data_offset(), rec.data_offset() - 4);
    for reads in READS {
        let (ar2, data, runs, _) = overlapped_from(&bytes, reads).unwrap();
        assert_eq!(runs, 2, "the work ran on the predicted offsets, then on the headers' ({reads:?})");
        assert_eq!(ar2.records(), parsed.records());
        assert_eq!(data, records_data(&bytes));
    }
}

#[test]
fn overlapped_parse_reports_a_broken_local_header_like_parse() {
    let good = many_records(600, WriterOptions::default());
    let ar = Archive::parse(&good).unwrap();
    let victim = ar.get("data/300").unwrap().local_header_offset() as usize;
    // A bad signature, and a name that is not the central directory's.
    let mut bad_sig = good.clone();
    bad_sig[victim] ^= 0xFF;
    let mut bad_name = good.clone();
    let at = victim + 30 + "archive/data/".len();
    bad_name[at] = b'9';
    // A name as long as the central directory's but other, and an extra field that runs past the end.
    let mut other_name_len = good.clone();
    set16(&mut other_name_len, victim + 26, get16(&good, victim + 26) + 1);
    let last = ar.records().iter().map(Record::local_header_offset).max().unwrap() as usize;
    let mut long_extra = good.clone();
    set16(&mut long_extra, last + 28, 0xFFFF);
    // (The last record's data and the central directory after it are shorter than 64 KiB.)
    assert!(good.len() - last < 0xFFFF);
    let cases = [bad_sig, bad_name, other_name_len, long_extra];
    for (bytes, reads) in cases.iter().flat_map(|b| READS.map(|r| (b, r))) {
        let expected = Archive::parse(bytes).unwrap_err().to_string();
        let got = overlapped_from(bytes, reads).map(|_| ()).unwrap_err().to_string();
        assert_eq!(got, expected, "{reads:?}");
    }
}

/// A DEFLATE record (as Python's `zipfile` writes one) inflates to its bytes and passes its CRC; one that
/// claims more than DEFLATE can expand, or more than the caller allows, is refused before anything is
/// allocated; one cut short or inflating to another size is an error.
#[test]
fn deflate_records_inflate_within_their_bounds() {
    use std::io::Write;
    let payload: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(&payload).unwrap();
    let deflated = enc.finish().unwrap();
    // A one-record archive: local header, data, central directory, end record.
    let archive = |method: u16, size: u32, data: &[u8], crc: u32| {
        let name = b"a/data/0";
        let mut out = Vec::new();
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&[20, 0, 0, 0]);
        out.extend_from_slice(&method.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(name);
        out.extend_from_slice(data);
        let cd = out.len() as u32;
        out.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        out.extend_from_slice(&[20, 0, 20, 0, 0, 0]);
        out.extend_from_slice(&method.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0; 12]);
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(name);
        let cd_len = out.len() as u32 - cd;
        out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
        out.extend_from_slice(&[0, 0, 0, 0, 1, 0, 1, 0]);
        out.extend_from_slice(&cd_len.to_le_bytes());
        out.extend_from_slice(&cd.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out
    };
    let crc = crc32fast::hash(&payload);
    let good = archive(8, payload.len() as u32, &deflated, crc);
    let ar = Archive::parse(&good).unwrap();
    let r = ar.get("data/0").unwrap();
    assert_eq!(ar.record_bytes(&good, r, 1 << 20).unwrap().as_ref(), payload.as_slice());
    ar.verify_crc(&good, r).unwrap();
    // Within DEFLATE's ratio but above what the caller allows.
    assert!(matches!(ar.record_bytes(&good, r, 4999), Err(ZipError::InflatedTooLarge { limit: 4999, .. })));
    // A claimed size no DEFLATE stream of these bytes can reach.
    let bomb = archive(8, u32::MAX - 1, &deflated, crc);
    let ar = Archive::parse(&bomb).unwrap();
    let r = ar.get("data/0").unwrap();
    assert!(matches!(ar.record_bytes(&bomb, r, u64::MAX), Err(ZipError::InflatedTooLarge { .. })));
    // Another size than the stream's, and a truncated stream.
    for (size, data) in
        [(payload.len() as u32 - 1, &deflated[..]), (payload.len() as u32, &deflated[..deflated.len() / 2])]
    {
        let bad = archive(8, size, data, crc);
        let ar = Archive::parse(&bad).unwrap();
        let r = ar.get("data/0").unwrap();
        assert!(matches!(ar.record_bytes(&bad, r, 1 << 20), Err(ZipError::Inflate { .. })), "{size}");
    }
    // A wrong CRC is caught on the inflated bytes.
    let bad_crc = archive(8, payload.len() as u32, &deflated, crc ^ 1);
    let ar = Archive::parse(&bad_crc).unwrap();
    let r = ar.get("data/0").unwrap();
    assert!(matches!(ar.verify_crc(&bad_crc, r), Err(ZipError::CrcMismatch { .. })));
}

// ------------------------------------------------------------------------------------------------
// listing from a partial copy (object storage): central directory range, predicted offsets

#[test]
fn a_listing_needs_the_tail_the_central_directory_and_the_small_records() {
    let payload = vec![7u8; 5000];
    let bytes =
        writer_output(&[("data.pkl", b"pickle"), ("data/0", &payload), ("data/1", &payload), ("version", b"3\n")]);
    let whole = Archive::parse(&bytes).unwrap();
    let cd = Archive::central_directory_range(&bytes).unwrap();
    assert_eq!(cd.start, whole.central_directory_offset());
    // A copy holding only the end records, the central directory and the records but the tensors'.
    let mut partial = vec![0u8; bytes.len()];
    let keep = |p: &mut Vec<u8>, r: std::ops::Range<u64>| {
        let r = r.start as usize..r.end as usize;
        p[r.clone()].copy_from_slice(&bytes[r]);
    };
    keep(&mut partial, cd.start..bytes.len() as u64);
    let predicted = Archive::parse_predicted(&partial).unwrap();
    for r in predicted.records() {
        let whole_r = whole.get(r.short_name()).unwrap();
        assert_eq!(r.data_offset(), whole_r.data_offset(), "{}", r.name());
        if !r.short_name().starts_with("data/") {
            keep(&mut partial, r.local_header_offset()..r.data_offset() + r.compressed_size());
        }
    }
    predicted.check_predicted(&partial, "data.pkl").unwrap();
    assert_eq!(predicted.data(&partial, predicted.get("data.pkl").unwrap()).unwrap(), b"pickle");
    // A tensor's header was not fetched: checking it fails rather than trusting zeros.
    assert!(predicted.check_predicted(&partial, "data/0").is_err());
    // data.pkl where the rule does not put it: its header says so.
    let mut moved = bytes.clone();
    let pkl = whole.get("data.pkl").unwrap();
    let extra_len_at = pkl.local_header_offset() as usize + 28;
    let extra_len = get16(&moved, extra_len_at);
    set16(&mut moved, extra_len_at, extra_len + 4);
    assert!(matches!(
        Archive::parse_predicted(&moved).unwrap().check_predicted(&moved, "data.pkl"),
        Err(ZipError::Unpredicted { .. } | ZipError::Truncated { .. } | ZipError::BadSignature { .. })
    ));
    assert!(matches!(Archive::central_directory_range(b"not a zip"), Err(ZipError::NotZip { .. })));
}
