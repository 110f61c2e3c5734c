//! torch.save codec benchmarks: `torch/read/<size>` (open + read every tensor byte), `torch/write/<size>`,
//! and for 20,000 tensors of 10 KiB `torch/open/20k-tensors` (open + list every name, dtype and shape),
//! `torch/read/20k-tensors` and `torch/write/20k-tensors`.
//!
//! `cargo bench -p ckpt-benches --bench torch_save`; compare with torch itself through
//! `benches/python/side_by_side.py`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use ckpt_tensor::{CheckpointRead, EntryKind};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn many_tensors(n: usize, numel: usize) -> ckpt_tensor::Value {
    use ckpt_tensor::{Dict, DictKind, Tensor, Value};
    let mut sd = Dict::new(DictKind::OrderedDict);
    for i in 0..n {
        let v: Vec<f32> = (0..numel).map(|j| ((i + j) % 251) as f32).collect();
        sd.insert(format!("layers.{}.w{}", i / 8, i % 8), Value::Tensor(Tensor::from_slice(&v, &[numel]).unwrap()));
    }
    Value::Dict(sd)
}

fn read_all(path: &std::path::Path) -> u64 {
    let f = ckpt_torch::TorchReader::open(path).unwrap();
    let mut sum = 0u64;
    for e in f.entries() {
        if let EntryKind::Tensor(_) = e.kind {
            let t = f.tensor(&e.name).unwrap();
            sum = ckpt_benches::reads::fold_bytes(sum, &t.data().unwrap());
        }
    }
    sum
}

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
        g.bench_function(format!("read/{label}"), |b| b.iter(|| black_box(read_all(&path))));
        g.bench_function(format!("write/{label}"), |b| {
            let out = dir.path().join(format!("out_{label}.pt"));
            b.iter(|| ckpt_torch::save(black_box(&sd), &out, &ckpt_torch::WriteOptions::default()).unwrap());
        });
        g.finish();
    }

    let n = 20_000;
    let sd = many_tensors(n, 2560);
    let path = dir.path().join("many.pt");
    ckpt_torch::save(&sd, &path, &ckpt_torch::WriteOptions::default()).unwrap();
    let mut g = c.benchmark_group("torch");
    g.sample_size(10);
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("open/20k-tensors", |b| {
        b.iter(|| {
            let f = ckpt_torch::TorchReader::open(&path).unwrap();
            let entries = f.entries();
            black_box(entries.iter().filter(|e| matches!(e.kind, EntryKind::Tensor(_))).count())
        });
    });
    g.bench_function("read/20k-tensors", |b| b.iter(|| black_box(read_all(&path))));
    g.bench_function("write/20k-tensors", |b| {
        let out = dir.path().join("many_out.pt");
        b.iter(|| ckpt_torch::save(black_box(&sd), &out, &ckpt_torch::WriteOptions::default()).unwrap());
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
