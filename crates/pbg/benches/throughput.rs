//! Commit, open and export throughput of a 512 MiB PBG checkpoint (the counterpart of
//! `conformance/python/pbg/bench.py`, which times torchbiggraph's `FileCheckpointStorage` and
//! `make_tsv` on the same shapes).
//!
//! The checkpoint: entity type `node` with 8 partitions of 262144 x 64 float32 embeddings (64 MiB each)
//! and their `RowAdagrad` sums, plus a small model. The TSV export runs on 2 partitions of 65536 x 64.
//!
//! ```text
//! cargo bench -p ckpt-pbg --bench throughput                          # files under the system temp dir
//! CKPT_BENCH_DIR=/dev/shm cargo bench -p ckpt-pbg --bench throughput  # in memory (tmpfs)
//! ```
//!
//! Benchmarks: `pbg/commit/512MiB-8parts` (a new version: 9 files written in parallel, each fsync'd and
//! renamed, then the version file), `pbg/open/512MiB-8parts` (`PbgReader::open`: every header validated,
//! every file mapped, every optimizer blob decoded), `pbg/open+read/512MiB-8parts` (then every embedding
//! byte summed) and `pbg/export_tsv/32MiB-2parts`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use ckpt_pbg::{
    Config, EntityPartition, EntityStorage, FileCheckpointStorage, Model, ModelParameter, OptimizerState, PbgReader,
    StateDict, WriteOptions, export_tsv,
};
use ckpt_tensor::Tensor;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const DIM: usize = 64;

fn partition(rows: usize, k: usize) -> EntityPartition {
    let v: Vec<f32> = (0..rows * DIM).map(|i| ((i + k) % 251) as f32 / 64.0).collect();
    let mut p = EntityPartition::new(Tensor::from_slice(&v, &[rows, DIM]).unwrap());
    let sum = Tensor::from_slice(&vec![1.0f32; rows], &[rows]).unwrap();
    p.optimizer = Some(OptimizerState::encode(&StateDict::row_adagrad(sum, 0.1)).unwrap());
    p
}

fn bench_root() -> tempfile::TempDir {
    match std::env::var_os("CKPT_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(PathBuf::from(d)).unwrap(),
        None => tempfile::tempdir().unwrap(),
    }
}

fn commit(storage: &FileCheckpointStorage, parts: &[EntityPartition]) {
    let mut c = storage.begin_commit().unwrap();
    for (i, p) in parts.iter().enumerate() {
        c.partition("node", i as u32, p.clone()).unwrap();
    }
    let t = Tensor::from_slice(&[0.5f32; DIM], &[DIM]).unwrap();
    c.model(Model {
        parameters: Some(vec![ModelParameter::new("rhs_operators.0.translation", t).unwrap()]),
        ..Model::default()
    });
    c.finish(&WriteOptions::default()).unwrap();
}

fn config(parts: u32) -> String {
    format!(
        r#"{{"entities": {{"node": {{"num_partitions": {parts}}}}}, "relations": [{{"name": "r", "lhs": "node",
        "rhs": "node", "operator": "translation"}}], "dimension": {DIM}, "global_emb": false, "entity_path": "data",
        "edge_paths": ["e"], "checkpoint_path": "ckpt"}}"#
    )
}

fn checksum(ckpt: &PbgReader) -> u64 {
    let mut sum = 0u64;
    for p in ckpt.partitions() {
        for c in p.data.embeddings.data().unwrap().chunks_exact(8) {
            sum = sum.wrapping_add(u64::from_le_bytes(c.try_into().unwrap()));
        }
    }
    sum
}

fn benches(c: &mut Criterion) {
    let root = bench_root();
    let parts: Vec<EntityPartition> = (0..8).map(|k| partition(1 << 18, k)).collect();
    let bytes = (8 * (1usize << 18) * DIM * 4) as u64;
    let storage = FileCheckpointStorage::new(root.path().join("ckpt"));
    storage.prepare().unwrap();
    let mut g = c.benchmark_group("pbg");
    g.sample_size(10).measurement_time(Duration::from_secs(20)).throughput(Throughput::Bytes(bytes));
    g.bench_function("commit/512MiB-8parts", |b| b.iter(|| commit(&storage, &parts)));
    g.bench_function("open/512MiB-8parts", |b| b.iter(|| PbgReader::open(storage.path()).unwrap()));
    g.bench_function("open+read/512MiB-8parts", |b| b.iter(|| checksum(&PbgReader::open(storage.path()).unwrap())));

    // TSV export of a smaller checkpoint.
    let small = root.path().join("small");
    let s = FileCheckpointStorage::new(small.join("ckpt"));
    s.prepare().unwrap();
    let small_parts: Vec<EntityPartition> = (0..2).map(|k| partition(1 << 16, k)).collect();
    commit(&s, &small_parts);
    let entities = EntityStorage::new(small.join("data"));
    std::fs::create_dir_all(entities.path()).unwrap();
    for p in 0..2u32 {
        let names: Vec<String> = (0..1usize << 16).map(|i| format!("n{p}_{i}")).collect();
        entities.save_names("node", p, &names).unwrap();
    }
    let cfg = Config::parse(&config(2)).unwrap();
    let ckpt = PbgReader::open(s.path()).unwrap();
    let out = |n: &str| -> PathBuf { small.join(n) };
    g.throughput(Throughput::Bytes((2 * (1usize << 16) * DIM * 4) as u64));
    g.bench_function("export_tsv/32MiB-2parts", |b| {
        b.iter(|| {
            let (e, r) = (out("e.tsv"), out("r.tsv"));
            let _ = std::fs::remove_file(&e);
            let _ = std::fs::remove_file(&r);
            export_tsv(&ckpt, &cfg, &entities, Path::new(&e), Path::new(&r)).unwrap();
        });
    });
    g.finish();
}

criterion_group!(pbg, benches);
criterion_main!(pbg);
