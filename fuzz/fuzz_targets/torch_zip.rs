//! A `torch.save` file held in memory (ZIP, or legacy when the bytes say so): the ZIP layer alone (every
//! record's bytes and CRC, and the parse that reads local headers on a second thread against the plain
//! one); then the reader twice, with the single-pass `data.pkl` reader (the default) and with the full
//! decoder and rebuilder alone (`ReadOptions::with_full_decoder`): both must build the same value, or both
//! fail. Then everything is read: entries, every tensor and value.
#![no_main]

use ckpt_core::Buffer;
use ckpt_torch::{ReadOptions, TorchReader, zip::Archive};
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
    match (&parsed, Archive::parse_overlapped_from(data, 0, &|_| {}, read_all)) {
        (Ok(a), Ok((b, lens))) => {
            assert_eq!(a.records(), b.records(), "parse_overlapped found other records");
            assert_eq!(lens, read_all(a), "the work's last run read other bytes");
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("parse and parse_overlapped disagree: {:?} / {:?}", a.as_ref().err(), b.err()),
    }
    let Ok(buffer) = Buffer::copy_from(data) else { return };
    let fast = TorchReader::from_buffer(&buffer, &ReadOptions::default());
    let full = TorchReader::from_buffer(&buffer, &ReadOptions::default().with_full_decoder(true));
    match (&fast, &full) {
        // Debug renderings: dtypes, shapes, strides, offsets and storages; NaN floats equal.
        (Ok(a), Ok(b)) => assert_eq!(
            format!("{:?}", a.value()),
            format!("{:?}", b.value()),
            "the single pass and the full decoder build different values"
        ),
        (Err(_), Err(_)) => {}
        (Ok(a), Err(e)) => panic!("the single pass builds {:?} where the full decoder fails: {e}", a.value()),
        (Err(e), Ok(b)) => panic!("the single pass fails ({e}) where the full decoder builds {:?}", b.value()),
    }
    if let Ok(file) = fast {
        ckpt_fuzz::read_all(&file);
    }
});
