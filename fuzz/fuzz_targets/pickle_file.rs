//! A plain pickle (`pickle.dump`, any protocol) read as a checkpoint, held in memory: inputs that do not start
//! like one get a protocol-4 PROTO prepended, so every input reaches the plain-pickle reader and its rebuild
//! rules (`torch.storage._load_from_bytes` streams read by the torch.save reader, nested to its bound; numpy
//! `_frombuffer` arrays); then entries, every tensor and value.
#![no_main]

use ckpt_tensor::Buffer;
use ckpt_torch::{Container, ReadOptions, TorchReader, detect};
use libfuzzer_sys::fuzz_target;

/// PROTO 4.
const PICKLE_HEAD: &[u8] = b"\x80\x04";

fuzz_target!(|data: &[u8]| {
    let bytes =
        if matches!(detect(data), Ok(Container::Pickle)) { data.to_vec() } else { [PICKLE_HEAD, data].concat() };
    let Ok(buffer) = Buffer::copy_from(&bytes) else { return };
    if let Ok(file) = TorchReader::from_buffer(&buffer, &ReadOptions::default()) {
        ckpt_fuzz::read_all(&file);
    }
});
