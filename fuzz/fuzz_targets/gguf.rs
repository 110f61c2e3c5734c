//! GGUF files: the header parsed and checked whole (counts, value types, nested arrays, tensor infos,
//! alignment, extents, overlaps), then every tensor read, its blocks dequantized, and every metadata value
//! converted and printed; seeded from the gguf-py fixtures.
#![no_main]

use ckpt_tensor::{Buffer, CheckpointRead};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(reader) = ckpt_gguf::Reader::from_buffer(Buffer::from_vec(data.to_vec())) else { return };
    let _ = reader.details();
    for entry in reader.entries() {
        let _ = reader.value(&entry.name);
    }
    for t in reader.tensors() {
        if let Ok(tensor) = reader.tensor(&t.name) {
            let _ = tensor.data();
        }
        let _ = reader.dequantize(&t.name, ckpt_tensor::DType::BF16).and_then(|t| t.data().map(|d| d.len()));
    }
});
