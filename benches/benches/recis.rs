//! RecIS benchmarks on one hash table of 10^6 ids with 16-float embeddings and two AdamW slots (about
//! 200 MiB of rows), in one shard of 4 data files:
//!
//! - `recis/save/1M-ids`: `save_tables` (data files written in parallel, atomically);
//! - `recis/load/1M-ids`: `SparseCheckpoint::open` (data files mapped and checked in parallel) + the table
//!   read back (`child`) + every row byte read.
//!
//! `cargo bench -p ckpt-benches --bench recis` (`CKPT_BENCH_DIR=/dev/shm` for files in memory).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use ckpt_collective::SingleProcess;
use ckpt_recis::name::SliceInfo;
use ckpt_recis::table::TableChild;
use ckpt_recis::writer::save_tables;
use ckpt_recis::{HashTable, Slot, SparseCheckpoint, WriteOptions};
use ckpt_tensor::Tensor;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const IDS: usize = 1_000_000;
const DIM: usize = 16;

fn rows(k: usize) -> Tensor {
    let v: Vec<f32> = (0..IDS * DIM).map(|i| ((i + k) % 251) as f32 / 7.0).collect();
    Tensor::from_slice(&v, &[IDS, DIM]).unwrap()
}

fn bench(c: &mut Criterion) {
    let ids: Vec<i64> = (0..IDS as i64).map(|i| i * 7919 + 3).collect();
    let child = TableChild::new(
        "item",
        ids,
        vec![
            Slot::new("embedding", rows(0)).unwrap(),
            Slot::new("sparse_adamw_exp_avg", rows(1)).unwrap(),
            Slot::new("sparse_adamw_exp_avg_sq", rows(2)).unwrap(),
        ],
    )
    .unwrap();
    let tables = [HashTable::single(SliceInfo::full(65536).unwrap(), child)];
    let step = ("sparse_adamw_step".to_string(), Tensor::from_slice(&[42i64], &[1]).unwrap());
    let root = match std::env::var_os("CKPT_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let dir = root.path().join("ckpt");
    let bytes = (IDS * (8 + 3 * DIM * 4)) as u64;
    let mut g = c.benchmark_group("recis");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("save/1M-ids", |b| {
        b.iter(|| {
            save_tables(
                black_box(&tables),
                std::slice::from_ref(&step),
                &dir,
                &WriteOptions::default(),
                &SingleProcess,
            )
            .unwrap();
        });
    });
    g.bench_function("load/1M-ids", |b| {
        b.iter(|| {
            let ckpt = SparseCheckpoint::open(&dir).unwrap();
            let t = ckpt.child("item").unwrap();
            let mut sum = 0u64;
            for name in ["embedding", "sparse_adamw_exp_avg", "sparse_adamw_exp_avg_sq"] {
                let data = t.slot(name).unwrap().tensor().data().unwrap().into_owned();
                sum = ckpt_benches::reads::fold_bytes(sum, &data);
            }
            black_box(sum)
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
