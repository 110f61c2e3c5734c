//! PyTorch-BigGraph partition benchmarks on one embedding partition of 1,048,576 × 64 float32 (256 MiB)
//! with its RowAdagrad state, the counterpart of h5py's `create_dataset` / `[...]` on the same shapes
//! (`benches/python/read_side_by_side.py pbg-read=...` times h5py's read side by side):
//!
//! - `pbg/partition_write/256MiB`: `write_partition_file` (libhdf5, contiguous dataset);
//! - `pbg/partition_read/256MiB`: `read_partition_file` (the embeddings a window of the mapped file) +
//!   every byte read.
//!
//! `cargo bench -p ckpt-benches --bench pbg_partition` (`CKPT_BENCH_DIR=/dev/shm` for files in memory).
//! The whole-checkpoint commit/open/export benchmarks are in `crates/pbg/benches/throughput.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use ckpt_pbg::{EntityPartition, OptimizerState, StateDict, read_partition_file, write_partition_file};
use ckpt_tensor::Tensor;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const ROWS: usize = 1 << 20;
const DIM: usize = 64;

fn bench(c: &mut Criterion) {
    let v: Vec<f32> = (0..ROWS * DIM).map(|i| (i % 251) as f32 / 64.0).collect();
    let mut p = EntityPartition::new(Tensor::from_slice(&v, &[ROWS, DIM]).unwrap());
    let sum = Tensor::from_slice(&vec![1.0f32; ROWS], &[ROWS]).unwrap();
    p.optimizer = Some(OptimizerState::encode(&StateDict::row_adagrad(sum, 0.1)).unwrap());
    let root = match std::env::var_os("CKPT_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let path = root.path().join("embeddings_node_0.v1.h5");
    let mut g = c.benchmark_group("pbg");
    g.sample_size(10);
    g.throughput(Throughput::Bytes((ROWS * DIM * 4) as u64));
    g.bench_function("partition_write/256MiB", |b| b.iter(|| write_partition_file(&path, black_box(&p)).unwrap()));
    g.bench_function("partition_read/256MiB", |b| {
        b.iter(|| {
            let p = read_partition_file(&path).unwrap();
            black_box(ckpt_benches::reads::fold_bytes(0, &p.embeddings.data().unwrap()))
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
