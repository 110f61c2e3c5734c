//! A torch.package archive held in memory: the ZIP layer, `.data/extern_modules`, the modules' sources told
//! apart from mocks, every pickled resource rebuilt with its `.data/<key>.storage` storages and the
//! TorchScript modules under `.data/ts_code/`, the module check; then entries, every tensor and value. Inputs
//! that are no ZIP archive are read as a resource: they become `models/model.pkl` of a minimal package.
#![no_main]

use ckpt_tensor::Buffer;
use ckpt_torch::{ReadOptions, TorchReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = if data.starts_with(b"PK") { data.to_vec() } else { ckpt_fuzz::torch_package_of(data) };
    let Ok(buffer) = Buffer::copy_from(&bytes) else { return };
    if let Ok(file) = TorchReader::from_buffer(&buffer, &ReadOptions::default()) {
        ckpt_fuzz::read_all(&file);
    }
});
