//! Throughput of the checksum candidates for `ckpt.checksums.json` and the safetensors per-tensor checksums
//! (issue 12 point 4): CRC32C by `crc-fast` (carry-less multiplication: what ckpt writes) and by the
//! `crc32c` crate (the `crc32` instruction: what ckpt wrote before), `crc32fast`'s CRC-32 (what earlier
//! manifests used) and `xxhash-rust`'s XXH3-64, over 64 MiB of pseudo-random bytes fed in 8 MiB pieces
//! (cold: larger than the cache) and in 128 KiB pieces hashed right after they are copied into a buffer,
//! as the durable writer does (hot). The benchmark ids interleave the candidates, so a busy machine slows them
//! alike; compare ratios, not absolute numbers.

#![allow(missing_docs, clippy::unwrap_used)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

const TOTAL: usize = 64 << 20;
const PIECE: usize = 8 << 20;
/// The durable writer's copy-and-hash step.
const HOT: usize = 128 << 10;

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
    g.bench_function("crc_fast_crc32c", |b| {
        b.iter(|| {
            let mut h = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
            for p in data.chunks(PIECE) {
                h.update(black_box(p));
            }
            h.finalize()
        });
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

    // What the durable writer does: copy the caller's bytes into its 8 MiB write buffer in 128 KiB pieces,
    // hashing each piece right after copying it (hot in L1/L2). `copy` alone is the writer without
    // checksums: the ratio of each to it is the checksum's share of the writer's CPU time.
    let mut buf = vec![0u8; PIECE];
    let mut g = c.benchmark_group("copy_and_hash_64MiB");
    g.throughput(Throughput::Bytes(TOTAL as u64));
    g.sample_size(20);
    let mut run = |name: &str, hash: &dyn Fn(u64, &[u8]) -> u64| {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut acc = 0u64;
                for p in data.chunks(PIECE) {
                    for (d, s) in buf.chunks_mut(HOT).zip(p.chunks(HOT)) {
                        d.copy_from_slice(s);
                        acc = hash(acc, black_box(d));
                    }
                }
                acc
            });
        });
    };
    run("copy", &|acc, d| acc ^ u64::from(d.first().copied().unwrap_or(0)));
    run("copy+crc32c", &|acc, d| u64::from(crc32c::crc32c_append(acc as u32, d)));
    run("copy+crc_fast_crc32c", &|acc, d| u64::from(ckpt_io::Algorithm::Crc32c.append(acc as u32, d)));
    run("copy+crc32fast", &|acc, d| {
        let mut h = crc32fast::Hasher::new_with_initial(acc as u32);
        h.update(d);
        u64::from(h.finalize())
    });
    run("copy+xxh3", &|acc, d| acc ^ xxhash_rust::xxh3::xxh3_64(d));
    g.finish();
}

criterion_group!(benches, checksums);
criterion_main!(benches);
