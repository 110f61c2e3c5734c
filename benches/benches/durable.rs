//! The durable commit path (`ckpt_io`): `commit/<what>/<size>` for a raw `write` + `fsync` of the
//! same bytes, a [`FileCommit`](ckpt_io::FileCommit) with `O_DIRECT` and buffered, a durable
//! `ckpt_torch::save`, and a one-file [`DirCommit`](ckpt_io::DirCommit) with and without the
//! checksum manifest.
//!
//! `cargo bench -p ckpt-benches --bench durable` (scratch files go to `$TMPDIR`). The disk dominates and is
//! noisy on shared machines: compare within one run, and use `src/bin/durable_save.rs` for interleaved
//! medians against torch.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::fs::File;
use std::hint::black_box;
use std::io::Write;

use ckpt_collective::SingleProcess;
use ckpt_io::{self as commit, CommitError, DirCommit, DirOptions, FileOptions};
use ckpt_tensor::{Buffer, DType, Tensor, Value};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn payload(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut v = vec![0u8; n];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    v
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let size = 64usize << 20;
    let bytes = payload(size);
    let tensors = 4;
    let each = size / tensors;
    let sd = Value::dict((0..tensors).map(|i| {
        let t =
            Tensor::from_buffer(DType::F32, &[each / 4], Buffer::copy_from(&bytes[i * each..(i + 1) * each]).unwrap());
        (format!("w{i}"), Value::Tensor(t.unwrap()))
    }));
    let mut g = c.benchmark_group("commit");
    g.throughput(Throughput::Bytes(size as u64));
    g.sample_size(10);
    let raw = dir.path().join("raw.bin");
    g.bench_function("raw_write_fsync/64MiB", |b| {
        b.iter(|| {
            let mut f = File::create(&raw).unwrap();
            bytes.chunks(8 << 20).for_each(|c| f.write_all(c).unwrap());
            f.sync_all().unwrap();
        });
    });
    for (name, direct) in [("file_commit_direct/64MiB", true), ("file_commit_buffered/64MiB", false)] {
        let path = dir.path().join(format!("{direct}.bin"));
        let options = FileOptions::default().with_direct_io(direct);
        g.bench_function(name, |b| {
            b.iter(|| {
                commit::write_file(&path, &options, |w| {
                    w.write_all(black_box(&bytes)).map_err(|e| CommitError::from_io(w.path(), e))
                })
                .unwrap();
                commit::wait_for_releases();
            });
        });
    }
    let pt = dir.path().join("m.pt");
    g.bench_function("torch_save/64MiB", |b| {
        b.iter(|| {
            ckpt_torch::save(black_box(&sd), &pt, &ckpt_torch::WriteOptions::default()).unwrap();
            commit::wait_for_releases();
        });
    });
    for (name, sums) in [("dir_commit_checksums/64MiB", true), ("dir_commit_plain/64MiB", false)] {
        let dst = dir.path().join(format!("ck_{sums}"));
        let options = DirOptions::default().with_checksums(sums);
        g.bench_function(name, |b| {
            b.iter(|| {
                let dc = DirCommit::begin(&dst, &SingleProcess, &options).unwrap();
                let mut f = dc.create_file("data").unwrap();
                for (i, chunk) in bytes.chunks(each).enumerate() {
                    f.writer().mark(format!("w{i}"));
                    f.writer().write_all(chunk).unwrap();
                }
                f.finish().unwrap();
                dc.commit(&SingleProcess, Ok(()), |_| Ok(())).unwrap();
                commit::wait_for_releases();
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
