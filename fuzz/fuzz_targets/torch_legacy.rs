//! The legacy (torch < 1.6) `torch.save` stream held in memory: inputs that do not start like one get the
//! legacy magic number prepended, so every input reaches the legacy reader.
#![no_main]

use ckpt_tensor::Buffer;
use ckpt_torch::{Container, ReadOptions, TorchReader, detect};
use libfuzzer_sys::fuzz_target;

/// Protocol 2, then the magic number as a long integer (the first of the stream's five pickles).
const LEGACY_HEAD: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e";

fuzz_target!(|data: &[u8]| {
    let bytes =
        if matches!(detect(data), Ok(Container::Legacy)) { data.to_vec() } else { [LEGACY_HEAD, data].concat() };
    let Ok(buffer) = Buffer::copy_from(&bytes) else { return };
    if let Ok(file) = TorchReader::from_buffer(&buffer, &ReadOptions::default()) {
        ckpt_fuzz::read_all(&file);
    }
});
