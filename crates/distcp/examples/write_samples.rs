//! Writes sample checkpoints for loading by other torch releases (a manual compatibility check):
//!
//! ```text
//! cargo run -p ckpt-distcp --example write_samples -- OUTDIR
//! PYTHON conformance/python/distcp/check_load.py OUTDIR/jobs.json
//! ```
//!
//! OUTDIR gets `compat/` (one process) and `compat-3rank/` (3 ranks, DTensor-style shards, an empty
//! shard) in the default maximum-compatibility profile, `torch213/` in the torch 2.13 profile, the
//! `torch.save` files of what each holds (`*.expected.pt`), and `jobs.json` for `check_load.py`; plus
//! `torch213-zstd/` (zstd items, torch 2.7+ with `zstandard`) and its own `jobs-zstd.json`. Only
//! dtypes every torch 2.x has are used, and no tensor-free nested dict (whose keys differ before 2.4).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::Path;

use ckpt_collective::{Collective, ThreadGroup};
use ckpt_distcp::{Profile, ShardSpec, WriteOptions, save, save_rank, shard_box};
use ckpt_tensor::{Buffer, DType, Tensor, Value, flatten, unflatten};

fn det(dtype: DType, shape: &[usize], k: u8) -> Tensor {
    let n = shape.iter().product::<usize>() * dtype.size();
    let bytes: Vec<u8> = (0..n)
        .map(|i| {
            let b = (i as u8).wrapping_mul(37).wrapping_add(k.wrapping_mul(11));
            if dtype == DType::Bool { b & 1 } else { b & 0x3f }
        })
        .collect();
    Tensor::from_buffer(dtype, shape, Buffer::copy_from(&bytes).unwrap()).unwrap()
}

fn single() -> Value {
    let classic = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
        DType::C128,
    ];
    let grid = det(DType::F32, &[4, 6], 9);
    Value::dict([
        (
            "model",
            Value::dict([
                ("w", Value::Tensor(det(DType::F32, &[3, 4], 1))),
                ("t", Value::Tensor(grid.transpose(0, 1).unwrap())),
            ]),
        ),
        (
            "dtypes",
            Value::dict(
                classic.iter().enumerate().map(|(i, d)| (d.torch_name(), Value::Tensor(det(*d, &[2, 3], i as u8)))),
            ),
        ),
        (
            "opt",
            Value::dict([
                ("lr", Value::Float(0.1)),
                ("betas", Value::Tuple(vec![Value::Float(0.9), Value::Float(0.999)])),
                ("state", Value::dict([("0", Value::dict([("exp_avg", Value::Tensor(det(DType::F32, &[2, 2], 3)))]))])),
            ]),
        ),
        ("lst", Value::List(vec![Value::Tensor(det(DType::I64, &[3], 4)), Value::Tensor(det(DType::F32, &[], 5))])),
        ("col", Value::Tensor(grid.narrow(1, 2, 1).unwrap())),
        ("empty", Value::Tensor(Tensor::zeros(DType::F32, &[0, 3]).unwrap())),
        ("step", Value::Int(7)),
        ("name", Value::from("run")),
    ])
}

fn sharded(dir: &Path, world: usize) -> Value {
    let global = Value::dict([
        ("row", Value::Tensor(det(DType::F32, &[7, 4], 1))),
        ("col", Value::Tensor(det(DType::BF16, &[4, 5], 2))),
        ("emp", Value::Tensor(det(DType::F32, &[2, 3], 3))),
        ("rep", Value::Tensor(det(DType::I64, &[3], 4))),
        ("step", Value::Int(3)),
    ]);
    let placement = [("row", 0), ("col", 1), ("emp", 0)];
    let flat = flatten(&global).unwrap();
    std::thread::scope(|s| {
        for g in ThreadGroup::new(world) {
            let flat = &flat;
            s.spawn(move || {
                let mut shards = HashMap::new();
                let leaves: Vec<_> = flat
                    .iter()
                    .map(|e| match (e.value.as_tensor(), placement.iter().find(|p| p.0 == e.key)) {
                        (Some(t), Some(&(_, dim))) => {
                            let (off, len) = shard_box(t.shape(), dim, g.rank(), world);
                            shards.insert(e.key.clone(), ShardSpec::new(t.shape(), &off));
                            (e.path.clone(), Value::Tensor(t.region(&off, &len).unwrap()))
                        }
                        _ => (e.path.clone(), e.value.clone()),
                    })
                    .collect();
                save_rank(&unflatten(leaves).unwrap(), &shards, dir, &WriteOptions::default(), &g).unwrap();
            });
        }
    });
    global
}

fn main() {
    let out = std::env::args().nth(1).expect("usage: write_samples OUTDIR");
    let out = Path::new(&out);
    std::fs::create_dir_all(out).unwrap();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let mut jobs = Vec::new();
    let sd = single();
    ckpt_torch::save(&sd, out.join("single.expected.pt"), &ckpt_torch::WriteOptions::default()).unwrap();
    for (name, options) in
        [("compat", WriteOptions::default()), ("torch213", WriteOptions::default().with_profile(Profile::Torch213))]
    {
        save(&sd, out.join(name), &options).unwrap();
        jobs.push(serde_json::json!({"kind": "dcp", "name": name, "dir": s(&out.join(name)), "expected": s(&out.join("single.expected.pt"))}));
    }
    let global = sharded(&out.join("compat-3rank"), 3);
    ckpt_torch::save(&global, out.join("sharded.expected.pt"), &ckpt_torch::WriteOptions::default()).unwrap();
    jobs.push(serde_json::json!({"kind": "dcp", "name": "compat-3rank", "dir": s(&out.join("compat-3rank")), "expected": s(&out.join("sharded.expected.pt"))}));
    std::fs::write(out.join("jobs.json"), serde_json::to_vec_pretty(&jobs).unwrap()).unwrap();
    // zstd items (`stream.zstd/1`) need torch 2.7+ with the `zstandard` package: a separate job list.
    let zstd = out.join("torch213-zstd");
    save(&sd, &zstd, &WriteOptions::default().with_profile(Profile::Torch213).with_zstd(3)).unwrap();
    let zjobs = [
        serde_json::json!({"kind": "dcp", "name": "torch213-zstd", "dir": s(&zstd), "expected": s(&out.join("single.expected.pt"))}),
    ];
    std::fs::write(out.join("jobs-zstd.json"), serde_json::to_vec_pretty(&zjobs).unwrap()).unwrap();
    println!("wrote {} checkpoints to {}", jobs.len(), out.display());
}
