//! A `torch.save` file held in memory (ZIP, or legacy when the bytes say so): the ZIP layer alone (every
//! record's bytes and CRC); then the reader twice, with the single-pass `data.pkl` reader (the default) and
//! with the full decoder and rebuilder alone (`ReadOptions::with_full_decoder`): both must build the same
//! value, or both fail. Then everything is read: entries, every tensor and value.
#![no_main]

use ckpt_core::Buffer;
use ckpt_torch::{ReadOptions, TorchReader, zip::Archive};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(archive) = Archive::parse(data) {
        for rec in archive.records() {
            let _ = archive.data(data, rec);
            let _ = archive.verify_crc(data, rec);
        }
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
