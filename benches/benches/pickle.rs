//! Pickle codec benchmarks on a 20,000-entry optimizer state dict (Adam-shaped: `state` with `step`,
//! `exp_avg` and `exp_avg_sq` per parameter, the moments as storage persistent ids as `torch.save` writes
//! them, and one `param_groups` entry listing every parameter):
//!
//! - `pickle/decode/optim-20k`: `ckpt_pickle::decode_with` (the pickle machine with the value builder);
//! - `pickle/encode/optim-20k`: `ckpt_pickle::encode_with` at protocol 2 (what `torch.save` writes).
//!
//! `cargo bench -p ckpt-benches --bench pickle`

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use ckpt_pickle::{EncodeOptions, Limits, Sharing, Value, decode_with, encode_with};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn bench(c: &mut Criterion) {
    let state = ckpt_benches::optimizer_state_pickle(20_000);
    let bytes = encode_with(&state, &EncodeOptions::new(2).with_sharing(Sharing::Identifiers)).unwrap();
    let mut g = c.benchmark_group("pickle");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.sample_size(20);
    g.bench_function("decode/optim-20k", |b| {
        b.iter(|| {
            let (v, _) = decode_with(black_box(&bytes), &Limits::default()).unwrap();
            black_box(matches!(v, Value::Dict(_)))
        });
    });
    g.bench_function("encode/optim-20k", |b| {
        b.iter(|| encode_with(black_box(&state), &EncodeOptions::new(2).with_sharing(Sharing::Identifiers)).unwrap());
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
