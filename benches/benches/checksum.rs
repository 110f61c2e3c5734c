//! Throughput of the checksum candidates for `ckpt.checksums.json` (issue 12 point 4): `crc32fast`'s
//! CRC-32 (what the manifest uses), the `crc32c` crate's CRC32C and `xxhash-rust`'s XXH3-64, over 64 MiB of
//! pseudo-random bytes fed in 8 MiB pieces, as the durable writer feeds its chunks. The benchmark ids
//! interleave the three, so a busy machine slows them alike; compare ratios, not absolute numbers.

#![allow(missing_docs, clippy::unwrap_used)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

const TOTAL: usize = 64 << 20;
const PIECE: usize = 8 << 20;

fn payload() -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut v = vec![0u8; TOTAL];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    v
}

fn checksums(c: &mut Criterion) {
    let data = payload();
    let mut g = c.benchmark_group("checksum_64MiB");
    g.throughput(Throughput::Bytes(TOTAL as u64));
    g.sample_size(20);
    g.bench_function("crc32fast_crc32", |b| {
        b.iter(|| {
            let mut h = crc32fast::Hasher::new();
            for p in data.chunks(PIECE) {
                h.update(black_box(p));
            }
            h.finalize()
        });
    });
    g.bench_function("crc32c_crc32c", |b| {
        b.iter(|| data.chunks(PIECE).fold(0u32, |crc, p| crc32c::crc32c_append(crc, black_box(p))));
    });
    g.bench_function("xxhash_rust_xxh3_64", |b| {
        b.iter(|| {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for p in data.chunks(PIECE) {
                h.update(black_box(p));
            }
            h.digest()
        });
    });
    g.finish();
}

criterion_group!(benches, checksums);
criterion_main!(benches);
