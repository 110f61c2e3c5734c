//! A small command-line tool over the crate, for measurements (`/usr/bin/time -v`) and manual use:
//!
//! ```text
//! cargo run --release -p ckpt-distcp --example dcp_tool -- make-big DIR MIB RANKS   # sharded f32 checkpoint
//! cargo run --release -p ckpt-distcp --example dcp_tool -- to-pt DIR OUT.pt          # dcp_to_torch_save
//! cargo run --release -p ckpt-distcp --example dcp_tool -- to-safetensors DIR OUT.safetensors
//! cargo run --release -p ckpt-distcp --example dcp_tool -- to-hf DIR OUTDIR SHARD_MIB
//! cargo run --release -p ckpt-distcp --example dcp_tool -- from-pt IN.pt DIR         # torch_save_to_dcp
//! cargo run --release -p ckpt-distcp --example dcp_tool -- read DIR                  # read every tensor
//! cargo run --release -p ckpt-distcp --example dcp_tool -- verify DIR
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use ckpt_collective::{Collective, ThreadGroup};
use ckpt_distcp::{DcpReader, ShardSpec, WriteOptions, convert, save_rank, shard_box, verify};
use ckpt_tensor::{Buffer, DType, Tensor, Value};

fn mib(bytes: u64, secs: f64) -> String {
    format!("{:.1} MiB in {secs:.2} s = {:.0} MiB/s", bytes as f64 / 1048576.0, bytes as f64 / 1048576.0 / secs)
}

/// A checkpoint of `total_mib` MiB of f32 tensors (one of a quarter of the total, the rest 16 MiB each),
/// sharded over `ranks` thread-ranks on dimension 0.
fn make_big(dir: &Path, total_mib: usize, ranks: usize) -> u64 {
    let mut sizes = vec![total_mib / 4];
    let mut left = total_mib - total_mib / 4;
    while left > 0 {
        sizes.push(left.min(16));
        left -= left.min(16);
    }
    let tensors: Vec<(String, Tensor)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &m)| {
            let rows = m * 1024;
            let bytes: Vec<u8> =
                (0..rows * 256 * 4).map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8) & 0x3f).collect();
            (
                format!("layers.{i}.weight"),
                Tensor::from_buffer(DType::F32, &[rows, 256], Buffer::copy_from(&bytes).unwrap()).unwrap(),
            )
        })
        .collect();
    let total: u64 = tensors.iter().map(|(_, t)| t.nbytes() as u64).sum();
    std::thread::scope(|s| {
        for g in ThreadGroup::new(ranks) {
            let tensors = &tensors;
            s.spawn(move || {
                let mut shards = HashMap::new();
                let mut items = Vec::new();
                for (k, t) in tensors {
                    let (off, len) = shard_box(t.shape(), 0, g.rank(), ranks);
                    shards.insert(format!("model.{k}"), ShardSpec::new(t.shape(), &off));
                    items.push((k.clone(), Value::Tensor(t.region(&off, &len).unwrap())));
                }
                let sd = Value::dict([("model", Value::dict(items)), ("step", Value::Int(1))]);
                save_rank(&sd, &shards, dir, &WriteOptions::default(), &g).unwrap();
            });
        }
    });
    total
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let p = |i: usize| Path::new(&a[i]);
    let t = Instant::now();
    match a.get(1).map(String::as_str) {
        Some("make-big") => {
            let n = make_big(p(2), a[3].parse().unwrap(), a[4].parse().unwrap());
            println!("save: {}", mib(n, t.elapsed().as_secs_f64()));
        }
        Some("to-pt") => {
            let r = convert::dcp_to_torch_save(p(2), p(3), &ckpt_torch::WriteOptions::default()).unwrap();
            println!("dcp_to_torch_save: {} tensors, {}", r.tensors, mib(r.tensor_bytes, t.elapsed().as_secs_f64()));
        }
        Some("to-safetensors") => {
            let r = convert::dcp_to_safetensors(p(2), p(3), &ckpt_io::Durability::default()).unwrap();
            println!("dcp_to_safetensors: {} tensors, {}", r.tensors, mib(r.tensor_bytes, t.elapsed().as_secs_f64()));
        }
        Some("to-hf") => {
            let shard: u64 = a[4].parse().unwrap();
            let r = convert::dcp_to_hf(
                p(2),
                p(3),
                &ckpt_safetensors::hf::WriteOptions::default().with_max_shard_size(shard << 20),
            )
            .unwrap();
            println!("dcp_to_hf: {} files, {}", r.files.len(), mib(r.tensor_bytes, t.elapsed().as_secs_f64()));
        }
        Some("from-pt") => {
            let md = convert::torch_save_to_dcp(p(2), p(3), &WriteOptions::default()).unwrap();
            let n: u64 = md.storage_data.iter().map(|(_, s)| s.length).sum();
            println!("torch_save_to_dcp: {}", mib(n, t.elapsed().as_secs_f64()));
        }
        Some("read") => {
            let r = DcpReader::open(p(2)).unwrap();
            let mut n = 0u64;
            let mut check = 0u64;
            for k in r.keys().map(str::to_owned).collect::<Vec<_>>() {
                if let Ok(t) = r.read_tensor(&k) {
                    let d = t.data().unwrap();
                    check = check.wrapping_add(d.iter().step_by(4096).map(|&b| u64::from(b)).sum::<u64>());
                    n += d.len() as u64;
                }
            }
            println!("read: {} (checksum {check})", mib(n, t.elapsed().as_secs_f64()));
        }
        Some("verify") => {
            let r = verify(p(2)).unwrap();
            println!(
                "verify: {} items, {} problems, {}",
                r.records,
                r.problems.len(),
                mib(r.bytes, t.elapsed().as_secs_f64())
            );
        }
        _ => eprintln!("usage: see the header of examples/dcp_tool.rs"),
    }
}
