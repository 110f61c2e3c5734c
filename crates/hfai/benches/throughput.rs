//! Save and load throughput of a 1 GiB, 4-part hfai checkpoint (the counterpart of
//! `conformance/python/hfai/bench.py`, which times the Python reference on the same state).
//!
//! The state: one float32 tensor of 512 MiB (`big`, 32768 x 4096: chunked, 128 MiB per part) and 32
//! float32 tensors of 16 MiB (`layers.i`: 8 whole tensors per part), 2^30 bytes in all.
//!
//! ```text
//! cargo bench -p ckpt-hfai --bench throughput                       # files under the system temp dir
//! CKPT_BENCH_DIR=/dev/shm cargo bench -p ckpt-hfai --bench throughput  # in memory (tmpfs)
//! ```
//!
//! Benchmarks: `hfai/save/1GiB-4parts` (one process writes the 4 parts in parallel, each atomically
//! with fsync), `hfai/save_rank/1GiB-4parts` (4 ranks of a `ThreadGroup`), `hfai/load/1GiB-4parts`
//! (`HfaiReader::open`: small tensors stay windows of the mapped parts, the chunked one is
//! concatenated) and `hfai/load+read/1GiB-4parts` (open, then read every tensor byte).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use ckpt_collective::ThreadGroup;
use ckpt_hfai::{HfaiReader, ModelState, SaveState, WriteOptions};
use ckpt_tensor::{Dict, DictKind, Tensor, Value};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const TOTAL: u64 = 1 << 30;

fn pattern(k: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i + k) % 251) as f32).collect();
    Tensor::from_slice(&v, shape).unwrap()
}

fn state() -> SaveState {
    let mut sd = Dict::new(DictKind::OrderedDict);
    sd.insert("big", pattern(0, &[32768, 4096]));
    for i in 0..32 {
        sd.insert(format!("layers.{i}"), pattern(i + 1, &[1024, 4096]));
    }
    SaveState::default().with_model(ModelState::new(sd)).with_other("step", Value::Int(1))
}

fn bench_root() -> tempfile::TempDir {
    match std::env::var_os("CKPT_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(PathBuf::from(d)).unwrap(),
        None => tempfile::tempdir().unwrap(),
    }
}

fn checksum(ckpt: &HfaiReader) -> u64 {
    let mut sum = 0u64;
    for (_, v) in &ckpt.model().unwrap().items {
        let data = v.as_tensor().unwrap().data().unwrap();
        for c in data.chunks_exact(8) {
            sum = sum.wrapping_add(u64::from_le_bytes(c.try_into().unwrap()));
        }
    }
    sum
}

fn throughput(c: &mut Criterion) {
    let state = state();
    let root = bench_root();
    let dir = root.path().join("ckpt");
    let opts = WriteOptions::default().with_world_size(4);
    let mut g = c.benchmark_group("hfai");
    // few iterations: on a disk, dozens of back-to-back 1 GiB saves measure the device's sustained write-back
    // rate rather than the save
    g.throughput(Throughput::Bytes(TOTAL))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10));

    g.bench_function("save/1GiB-4parts", |b| b.iter(|| ckpt_hfai::save(&state, &dir, &opts).unwrap()));
    g.bench_function("save_rank/1GiB-4parts", |b| {
        b.iter(|| {
            std::thread::scope(|s| {
                for rank in ThreadGroup::new(4) {
                    let (state, dir, opts) = (&state, &dir, &opts);
                    s.spawn(move || ckpt_hfai::save_rank(state, dir, opts, &rank).unwrap());
                }
            });
        });
    });
    ckpt_hfai::save(&state, &dir, &opts).unwrap(); // for the load benches when run alone
    g.bench_function("load/1GiB-4parts", |b| b.iter(|| HfaiReader::open(&dir).unwrap()));
    g.bench_function("load+read/1GiB-4parts", |b| b.iter(|| checksum(&HfaiReader::open(&dir).unwrap())));
    g.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
