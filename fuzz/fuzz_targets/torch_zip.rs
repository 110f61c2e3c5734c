//! A `torch.save` file held in memory (ZIP, or legacy when the bytes say so): the ZIP layer alone (every
//! record's bytes and CRC, and the parse that reads local headers on a second thread against the plain
//! one, with the headers read from the slice and read as `pread` reads a file); then `data.pkl` rebuilt with
//! the tensor-record templates and without (the pickle machine runs every opcode), which must give the same
//! value or the same error; then the reader, and everything read: entries, every tensor and value.
#![no_main]

use ckpt_tensor::Buffer;
use ckpt_torch::zip::{Archive, HeaderSource};
use ckpt_torch::{ReadOptions, TorchReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = Archive::parse(data);
    if let Ok(archive) = &parsed {
        for rec in archive.records() {
            let _ = archive.data(data, rec);
            let _ = archive.verify_crc(data, rec);
        }
    }
    // The local headers read on a second thread while a work reads every record at the predicted offsets:
    // the same records as the plain parse (the work's last run saw them), or an error where it fails.
    let read_all = |a: &Archive| a.records().iter().map(|r| a.data(data, r).ok().map(<[u8]>::len)).collect::<Vec<_>>();
    let from_slice = Archive::parse_overlapped_from(data, 0, HeaderSource::Slice(&|_| {}), read_all);
    match (&parsed, &from_slice) {
        (Ok(a), Ok((b, lens))) => {
            assert_eq!(a.records(), b.records(), "parse_overlapped found other records");
            assert_eq!(*lens, read_all(a), "the work's last run read other bytes");
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("parse and parse_overlapped disagree: {:?} / {:?}", a.as_ref().err(), b.as_ref().err()),
    }
    // The headers read as `pread` reads a file (copies, none past the end): the same result, error included.
    let read_at = |at: u64, out: &mut [u8]| {
        let src = usize::try_from(at).ok().and_then(|at| data.get(at..at.checked_add(out.len())?));
        src.map(|src| out.copy_from_slice(src)).is_some()
    };
    let from_reads = Archive::parse_overlapped_from(data, 0, HeaderSource::ReadAt(&read_at), read_all);
    match (&from_slice, &from_reads) {
        (Ok((a, x)), Ok((b, y))) => assert!(a.records() == b.records() && x == y, "the headers read differently"),
        (Err(e), Err(f)) => assert_eq!(e.to_string(), f.to_string(), "the headers read fail differently"),
        (a, b) => panic!("headers from the slice and read: {:?} / {:?}", a.as_ref().err(), b.as_ref().err()),
    }
    let Ok(buffer) = Buffer::copy_from(data) else { return };
    ckpt_torch::fuzzing::templates_agree(&buffer);
    if let Ok(file) = TorchReader::from_buffer(&buffer, &ReadOptions::default()) {
        ckpt_fuzz::read_all(&file);
    }
});
