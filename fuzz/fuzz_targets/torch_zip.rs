//! A `torch.save` file held in memory (ZIP, or legacy when the bytes say so): the ZIP layer alone (every
//! record's bytes and CRC), then the whole reader: entries, every tensor and value.
#![no_main]

use ckpt_core::Buffer;
use ckpt_torch::{ReadOptions, TorchFile, zip::Archive};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(archive) = Archive::parse(data) {
        for rec in archive.records() {
            let _ = archive.data(data, rec);
            let _ = archive.verify_crc(data, rec);
        }
    }
    let Ok(buffer) = Buffer::copy_from(data) else { return };
    if let Ok(file) = TorchFile::from_buffer(&buffer, &ReadOptions::default()) {
        ckpt_fuzz::read_all(&file);
    }
});
