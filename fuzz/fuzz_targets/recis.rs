//! A RecIS checkpoint directory built from the input (a file-set; bytes before the first separator are
//! `index`): `index`, `tensorkey.json` and every data file parsed in memory, then the directory opened,
//! every entry read, every hash table rebuilt; a `checkpoint` list is opened through the manager.
#![no_main]

use std::path::Path;

use ckpt_recis::{CheckpointManager, DataFile, Index, RecisReader, TensorKey};
use ckpt_tensor::Buffer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let files = ckpt_fuzz::split_files(data, "index");
    for f in &files {
        let path = Path::new(&f.name);
        if f.name.ends_with("index") {
            if let Ok(index) = Index::parse(f.bytes, path) {
                let _ = index.file_names();
                let _ = index.to_json();
            }
        } else if f.name.ends_with("tensorkey.json") {
            let _ = TensorKey::parse(f.bytes, path).map(|k| k.to_json());
        } else if f.name.ends_with(".safetensors")
            && let Ok(file) = DataFile::from_buffer(Buffer::from_vec(f.bytes.to_vec()), path)
        {
            for e in file.entries() {
                let _ = file.tensor(&e.key).map(|t| ckpt_fuzz::read_tensor(&t));
            }
        }
    }
    let dir = ckpt_fuzz::write_dir("recis", &files);
    if let Ok(ck) = RecisReader::open(&dir) {
        ckpt_fuzz::read_all(&ck);
        let sparse = ck.sparse();
        for child in sparse.children() {
            if let Ok(table) = sparse.child(child) {
                for id in table.ids().iter().take(64) {
                    let _ = table.position(*id);
                }
            }
            let _ = sparse.child_slices(child);
        }
    }
    if dir.join("checkpoint").is_file()
        && let Ok(ck) = CheckpointManager::new(&dir).open_latest()
    {
        ckpt_fuzz::read_all(&ck);
    }
});
