//! DCP benchmarks:
//!
//! - `distcp/metadata/256x400`: decoding the `.metadata` of a large FSDP job (256 ranks × 400 row-sharded
//!   tensors: 102,400 chunks and items, with planner data) written as torch 2.13 writes it
//!   (`Metadata::from_pickle`, the single-pass decoder);
//! - `distcp/save/256MiB`: `ckpt_distcp::save` of 16 float32 tensors of 16 MiB (one rank, durable);
//! - `distcp/load/256MiB`: `DcpReader::open` + `state_dict` + every byte read.
//!
//! `cargo bench -p ckpt-benches --bench distcp` (`CKPT_BENCH_DIR=/dev/shm` for files in memory).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::path::Path;

use ckpt_distcp::{DcpReader, Metadata, Profile, WriteOptions, save};
use ckpt_tensor::{Buffer, DType, Dict, DictKind, Tensor, Value, leaves};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn bench_root() -> tempfile::TempDir {
    match std::env::var_os("CKPT_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    }
}

fn state(bytes: usize) -> Value {
    let mut sd = Dict::new(DictKind::Dict);
    let each = 16 << 20;
    for i in 0..bytes / each {
        let data: Vec<u8> = (0..each).map(|j| (j.wrapping_mul(2_654_435_761) >> 13) as u8 ^ i as u8).collect();
        let t = Tensor::from_buffer(DType::F32, &[each / 4096, 1024], Buffer::copy_from(&data).unwrap()).unwrap();
        sd.insert(format!("layers.{i}.weight"), Value::Tensor(t));
    }
    Value::dict([("model", Value::Dict(sd))])
}

fn bench(c: &mut Criterion) {
    let md = ckpt_benches::large_job_metadata(256, 400);
    let pickle = md.to_pickle(Profile::Torch213).unwrap();
    let mut g = c.benchmark_group("distcp");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(pickle.len() as u64));
    g.bench_function("metadata/256x400", |b| {
        b.iter(|| black_box(Metadata::from_pickle(black_box(&pickle), Path::new(".metadata")).unwrap()));
    });

    let root = bench_root();
    let size = 256usize << 20;
    let sd = state(size);
    g.throughput(Throughput::Bytes(size as u64));
    let dir = root.path().join("ckpt");
    g.bench_function("save/256MiB", |b| {
        b.iter(|| save(black_box(&sd), &dir, &WriteOptions::default()).unwrap());
    });
    g.bench_function("load/256MiB", |b| {
        b.iter(|| {
            let r = DcpReader::open(&dir).unwrap();
            let v = r.state_dict().unwrap();
            let mut sum = 0u64;
            for e in leaves(&v).unwrap() {
                if let Some(t) = e.value.as_tensor() {
                    sum = ckpt_benches::reads::fold_bytes(sum, &t.data().unwrap());
                }
            }
            black_box(sum)
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
