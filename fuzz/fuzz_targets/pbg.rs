//! PyTorch-BigGraph, as far as ckpt's own code goes: libhdf5's parser (a system C library) is kept out.
//!
//! The input is a file-set (bytes before the first separator are `checkpoint_version.txt`). In memory:
//! every file goes through the checks made before libhdf5 sees a file (signature, superblock EOF) and
//! [`FileName::parse`]; `*.json` files through the config parser and its accessors; `*.blob` files through
//! the optimizer-blob decoder and the state-dict accessors; an `attrs` file (`name=value` lines, typed as int,
//! float or str) through the root-attribute metadata (`config/json`, `iteration/*`). Then the directory is
//! written — each file that would pass the pre-checks gets its signature broken first, so libhdf5 never
//! parses fuzzer bytes — and opened as a checkpoint, verified, its entity files read and a commit begun.
#![no_main]

use std::path::Path;

use ckpt_pbg::h5::check_header;
use ckpt_pbg::{
    AttrValue, Config, EntityStorage, FileCheckpointStorage, FileName, Iteration, Metadata, OptimizerState, PbgReader,
};
use ckpt_tensor::Buffer;
use libfuzzer_sys::fuzz_target;

fn config(text: &str) {
    let Ok(c) = Config::parse(text) else { return };
    let _ = (c.dimension(), c.global_emb(), c.dynamic_relations(), c.entity_path(), c.checkpoint_path());
    let _ = (c.num_epochs(), c.num_edge_chunks(), c.checkpoint_preservation_interval(), c.lr());
    for e in c.entities() {
        let _ = c.entity_dimension(&e.name);
    }
    let paths = c.edge_paths();
    for index in [0, 1, 7, u64::MAX] {
        if let Some(it) = Iteration::from_index(index, c.num_epochs(), &paths, c.num_edge_chunks().unwrap_or(1)) {
            let _ = (it.iteration_idx(), it.should_preserve(c.checkpoint_preservation_interval()));
        }
    }
    let _ = Config::from_json(&serde_json::Value::Object(c.json().clone()));
}

fn attrs(text: &str) {
    let mut metadata = Metadata::new();
    for line in text.lines().take(32) {
        let Some((name, value)) = line.split_once('=') else { continue };
        let value = if let Ok(i) = value.parse::<i64>() {
            AttrValue::Int(i)
        } else if let Ok(f) = value.parse::<f64>() {
            AttrValue::Float(f)
        } else {
            AttrValue::Str(value.to_owned())
        };
        metadata.set(name, value);
    }
    if let Some(text) = metadata.config_json() {
        config(text);
    }
    if let Some(it) = metadata.iteration() {
        let _ = (it.iteration_idx(), it.should_preserve(Some(1)));
    }
}

fn optimizer(bytes: &[u8]) {
    let Ok(sd) = OptimizerState::from_bytes(Buffer::from_vec(bytes.to_vec())).decode() else { return };
    for index in sd.indices() {
        let _ = (sd.param_state(index), sd.step(index));
        if let Some(sum) = sd.sum(index) {
            ckpt_fuzz::read_tensor(sum);
        }
    }
    for g in 0..sd.param_groups().len() {
        let _ = sd.lr(g);
    }
    let _ = OptimizerState::encode(&sd);
}

fuzz_target!(|data: &[u8]| {
    let files = ckpt_fuzz::split_files(data, "checkpoint_version.txt");
    for f in &files {
        let base = f.name.rsplit('/').next().unwrap_or_default();
        let _ = FileName::parse(base);
        let _ = check_header(Path::new(&f.name), f.bytes);
        let text = std::str::from_utf8(f.bytes).ok();
        match (base, text) {
            ("attrs", Some(t)) => attrs(t),
            (b, Some(t)) if b.ends_with(".json") => config(t),
            (b, _) if b.ends_with(".blob") => optimizer(f.bytes),
            _ => {}
        }
    }
    let dir = ckpt_fuzz::write_dir_without_hdf5("pbg", &files);
    if let Ok(ck) = PbgReader::open(&dir) {
        ckpt_fuzz::read_all(&ck);
    }
    let storage = FileCheckpointStorage::new(&dir);
    let entities = EntityStorage::new(&dir);
    let _ = storage.verify(Some(&entities));
    let _ = (storage.snapshots(), storage.load_stats(), storage.begin_commit().map(|c| c.next_metadata().cloned()));
    if let Ok(parts) = entities.partitions() {
        for (entity, part) in parts.iter().take(8) {
            let _ = (entities.load_count(entity, *part), entities.load_names(entity, *part));
        }
    }
    let _ = (entities.load_relation_names(), entities.load_relation_count());
});
