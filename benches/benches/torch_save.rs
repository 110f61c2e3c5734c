//! torch.save codec benchmarks: `torch/read/<size>` (open + touch every tensor) and `torch/write/<size>`.
//!
//! `cargo bench -p ckpt-benches --bench torch_save`; compare with torch itself through
//! `benches/python/side_by_side.py`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use ckpt_core::{CheckpointRead, EntryKind};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    for (label, size) in [("16MiB", 16usize << 20), ("256MiB", 256 << 20)] {
        let sd = ckpt_benches::model_state_dict(size).unwrap();
        let path = dir.path().join(format!("model_{label}.pt"));
        ckpt_torch::save(&sd, &path, &ckpt_torch::WriteOptions::default()).unwrap();
        let bytes = std::fs::metadata(&path).unwrap().len();
        let mut g = c.benchmark_group("torch");
        g.throughput(Throughput::Bytes(bytes));
        g.sample_size(10);
        g.bench_function(format!("read/{label}"), |b| {
            b.iter(|| {
                let f = ckpt_torch::TorchReader::open(&path).unwrap();
                let mut sum = 0u64;
                for e in f.entries() {
                    if let EntryKind::Tensor(_) = e.kind {
                        let t = f.tensor(&e.name).unwrap();
                        let d = t.data().unwrap();
                        sum = sum.wrapping_add(u64::from(d[d.len() / 2]));
                    }
                }
                black_box(sum)
            });
        });
        g.bench_function(format!("write/{label}"), |b| {
            let out = dir.path().join(format!("out_{label}.pt"));
            b.iter(|| ckpt_torch::save(black_box(&sd), &out, &ckpt_torch::WriteOptions::default()).unwrap());
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
