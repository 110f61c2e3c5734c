//! A sharded training state saved by an MPI job in distcp, hfai and RecIS, and loaded back by a job with
//! another number of ranks, every value checked.
//!
//! ```text
//! cargo build -p ckpt --features mpi,distcp,hfai,recis --example mpi_roundtrip
//! mpirun -np 4 target/debug/examples/mpi_roundtrip save /tmp/state      # distcp/, hfai/, recis/ in /tmp/state
//! mpirun -np 2 target/debug/examples/mpi_roundtrip load /tmp/state      # or -np 3: each rank checks its part
//! mpirun -np 4 target/debug/examples/mpi_roundtrip resume /tmp/state    # each rank its own `rank_state` row
//! mpirun -np 2 target/debug/examples/mpi_roundtrip load-distcp DIR      # any DCP checkpoint of this state
//! ```
//!
//! The state, the same formulas on every rank (`V` = 1000 rows of width `D` = 16):
//!
//! - `model.emb` `[V, D]` f32, row-sharded (`Shard(0)`) over the ranks: `emb[i][j] = 16 i + j`;
//! - `model.dense.weight` `[32, D]` and `model.dense.bias` `[32]` f32, replicated: `k + 0.25` and `-k` for flat
//!   index `k`;
//! - AdamW state, per rank for the sharded embedding: `optim.emb.exp_avg = -(16 i + j)`,
//!   `optim.emb.exp_avg_sq = 16 i + j + 0.5` (sharded like `emb`), `optim.dense.exp_avg = k + 0.25`
//!   (replicated), `optim.step` (i64, the step given with `--step`, default 1);
//! - `rank_state` `[W, 4]` i64 in distcp: each rank's own state (RNG seed, data-loader position), which only
//!   a job of the same `W` ranks can take back (`resume`; another rank count gets
//!   `ckpt_distcp::Error::RankCountMismatch`).
//!
//! In RecIS the embedding is a hash table of ids `67 i` (rows and AdamW slots by id, ranks holding the ids
//! of their slice of RecIS's key space); in hfai every rank passes the whole state (hfai's `save` takes
//! the full model on every rank; the embedding shards are all-gathered first) and writes its own part.
//!
//! Failure injection for the test suite: `--fail-rank R` makes rank `R`'s distcp write fail (every rank must
//! then report the error); `--kill-rank R` kills rank `R` at its first file sync (the previous checkpoint
//! must stay loadable, `ckpt verify` must name the rank). Exit status 0 when every value checked.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ckpt::collective::{Collective, MpiCollective};
use ckpt::distcp::{DcpReader, ShardSpec, WriteOptions, save_rank, shard_box};
use ckpt::hfai::{HfaiReader, ModelState, SaveState};
use ckpt::io::failpoint::{self, Action, Config};
use ckpt::recis::name::{IdPartition, SliceInfo, gen_slice};
use ckpt::recis::table::TableChild;
use ckpt::recis::writer::save_tables;
use ckpt::recis::{HashTable, Slot, SparseCheckpoint};
use ckpt::tensor::{Dict, DictKind, Tensor, Value};

const V: usize = 1000;
const D: usize = 16;
const DENSE: usize = 32;
const SLICE_SIZE: u32 = 65536;

type Failure = Box<dyn std::error::Error>;

fn emb(i: usize, j: usize) -> f32 {
    (i * D + j) as f32
}
fn dense_w(k: usize) -> f32 {
    k as f32 + 0.25
}
fn dense_b(k: usize) -> f32 {
    -(k as f32)
}
fn exp_avg(i: usize, j: usize) -> f32 {
    -emb(i, j)
}
fn exp_avg_sq(i: usize, j: usize) -> f32 {
    emb(i, j) + 0.5
}
/// Rank `rank`'s own state: `[seed, position, step, rank]`.
fn rank_row(rank: usize, step: i64) -> [i64; 4] {
    [1234 + rank as i64, 1000 * step + rank as i64, step, rank as i64]
}
fn recis_id(i: usize) -> i64 {
    (i * 67) as i64
}
/// Row `id` of the RecIS table's slot `slot` (0 embedding, 1 exp_avg, 2 exp_avg_sq).
fn recis_row(id: i64, slot: usize) -> Vec<f32> {
    (0..D)
        .map(|j| {
            let v = (id as usize * D + j) as f32;
            match slot {
                0 => v,
                1 => -v,
                _ => v + 0.5,
            }
        })
        .collect()
}

/// Rows `rows` of a `[V, D]` table given by `f`.
fn rows(rows: std::ops::Range<usize>, f: fn(usize, usize) -> f32) -> Result<Tensor, Failure> {
    let n = rows.len();
    let data: Vec<f32> = rows.flat_map(|i| (0..D).map(move |j| f(i, j))).collect();
    Ok(Tensor::from_slice(&data, &[n, D])?)
}

fn dense(n: usize, shape: &[usize], f: fn(usize) -> f32) -> Result<Tensor, Failure> {
    Ok(Tensor::from_slice(&(0..n).map(f).collect::<Vec<_>>(), shape)?)
}

fn main() -> ExitCode {
    let mpi = match MpiCollective::init() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("mpi_roundtrip: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&mpi, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One write, so that mpirun does not interleave it with other ranks' lines.
            let line = format!("rank {}: error: {e}\n", mpi.rank());
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            ExitCode::FAILURE
        }
    }
}

fn flag(args: &[String], name: &str) -> Option<usize> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

fn run(mpi: &MpiCollective, args: &[String]) -> Result<(), Failure> {
    let usage = "usage: mpi_roundtrip save|load|resume|load-distcp|load-hfai-parts DIR [--step N] [--fail-rank R] [--kill-rank R]";
    let (cmd, dir) = match args {
        [cmd, dir, ..] => (cmd.as_str(), PathBuf::from(dir)),
        _ => return Err(usage.into()),
    };
    let step = flag(args, "--step").unwrap_or(1) as i64;
    match cmd {
        "save" => {
            if flag(args, "--fail-rank") == Some(mpi.rank()) {
                failpoint::configure(Some(Config::armed("file.sync", Action::Error)));
            }
            if flag(args, "--kill-rank") == Some(mpi.rank()) {
                failpoint::configure(Some(Config::armed("file.sync", Action::Kill)));
            }
            save_dcp(mpi, &dir.join("distcp"), step)?;
            failpoint::configure(None);
            save_hfai(mpi, &dir.join("hfai"), step)?;
            save_recis(mpi, &dir.join("recis"), step)?;
            println!("rank {} of {}: saved distcp, hfai and recis at step {step}", mpi.rank(), mpi.world_size());
        }
        "load" => {
            let n = load_dcp(mpi, &dir.join("distcp"), step)?;
            let h = load_hfai(mpi, &dir.join("hfai"), step)?;
            let r = load_recis(mpi, &dir.join("recis"), step)?;
            println!(
                "rank {} of {}: checked {n} distcp, {h} hfai and {r} recis values at step {step}",
                mpi.rank(),
                mpi.world_size()
            );
        }
        "resume" => {
            // A restart with the same ranks: each rank takes back its own state (RNG, data-loader position).
            let r = DcpReader::open(dir.join("distcp"))?;
            let own = r.read_rank_row("rank_state", mpi.rank(), mpi.world_size())?.to_vec::<i64>()?;
            if own != rank_row(mpi.rank(), step) {
                return Err(format!("rank_state is {own:?}, expected {:?}", rank_row(mpi.rank(), step)).into());
            }
            println!("rank {} of {}: resumed its own state {own:?}", mpi.rank(), mpi.world_size());
        }
        "load-hfai-parts" => {
            // Each process reads only the hfai parts it hosts (here without agreeing with the others: a
            // process whose part is damaged fails alone, the others still check theirs).
            let share =
                ckpt::hfai::RankShare::read(&dir.join("hfai"), &Default::default(), mpi.rank(), mpi.world_size());
            let (parts, n) =
                share.map_err(Failure::from).and_then(|s| Ok((s.parts().to_vec(), check_hfai_share(&s, step)?)))?;
            println!("rank {} of {}: checked {n} hfai values of parts {parts:?}", mpi.rank(), mpi.world_size());
        }
        "load-distcp" => {
            let n = load_dcp(mpi, &dir, step)?;
            println!("rank {} of {}: checked {n} distcp values at step {step}", mpi.rank(), mpi.world_size());
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}

/// This rank's rows of the embedding: `(first row, row count)`.
fn my_rows(g: &dyn Collective) -> (usize, usize) {
    let (off, len) = shard_box(&[V, D], 0, g.rank(), g.world_size());
    (off.first().copied().unwrap_or(0), len.first().copied().unwrap_or(0))
}

/// The training state as this rank holds it, and which tensors are shards.
fn rank_state(g: &dyn Collective, step: i64) -> Result<(Value, HashMap<String, ShardSpec>), Failure> {
    let (start, n) = my_rows(g);
    let shard = ShardSpec::new(&[V, D], &[start, 0]);
    let model = Value::dict([
        ("emb", Value::Tensor(rows(start..start + n, emb)?)),
        ("dense.weight", Value::Tensor(dense(DENSE * D, &[DENSE, D], dense_w)?)),
        ("dense.bias", Value::Tensor(dense(DENSE, &[DENSE], dense_b)?)),
    ]);
    let optim = Value::dict([
        (
            "emb",
            Value::dict([
                ("exp_avg", Value::Tensor(rows(start..start + n, exp_avg)?)),
                ("exp_avg_sq", Value::Tensor(rows(start..start + n, exp_avg_sq)?)),
            ]),
        ),
        ("dense", Value::dict([("exp_avg", Value::Tensor(dense(DENSE * D, &[DENSE, D], dense_w)?))])),
        ("step", Value::Tensor(Tensor::from_slice(&[step], &[])?)),
    ]);
    let mut shards: HashMap<String, ShardSpec> = ["model.emb", "optim.emb.exp_avg", "optim.emb.exp_avg_sq"]
        .into_iter()
        .map(|k| (k.to_string(), shard.clone()))
        .collect();
    // This rank's own state (its RNG, its data-loader position): row `rank` of a `[world, 4]` tensor.
    let own = Tensor::from_slice(&rank_row(g.rank(), step), &[1, 4])?;
    shards.insert("rank_state".into(), ShardSpec::new(&[g.world_size(), 4], &[g.rank(), 0]));
    Ok((Value::dict([("model", model), ("optim", optim), ("rank_state", Value::Tensor(own))]), shards))
}

fn save_dcp(g: &dyn Collective, dir: &Path, step: i64) -> Result<(), Failure> {
    let (sd, shards) = rank_state(g, step)?;
    save_rank(&sd, &shards, dir, &WriteOptions::default(), g)?;
    Ok(())
}

fn check(what: &str, got: &[f32], want: impl Iterator<Item = f32>) -> Result<usize, Failure> {
    let want: Vec<f32> = want.collect();
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, expected {}", got.len(), want.len()).into());
    }
    if let Some(k) = (0..got.len()).find(|&k| got.get(k).map(|v| v.to_bits()) != want.get(k).map(|v| v.to_bits())) {
        return Err(format!("{what}: value {k} is {:?}, expected {:?}", got.get(k), want.get(k)).into());
    }
    Ok(got.len())
}

fn table_values(start: usize, n: usize, f: fn(usize, usize) -> f32) -> impl Iterator<Item = f32> {
    (start..start + n).flat_map(move |i| (0..D).map(move |j| f(i, j)))
}

/// Loads this rank's region of every tensor (only the items it overlaps are read) and checks it.
fn load_dcp(g: &dyn Collective, dir: &Path, step: i64) -> Result<usize, Failure> {
    let r = DcpReader::open(dir)?;
    let (start, n) = my_rows(g);
    let region = |key: &str| r.read_region(key, &[start, 0], &[n, D]).map(|t| t.to_vec::<f32>());
    let mut checked = 0;
    checked += check("model.emb", &region("model.emb")??, table_values(start, n, emb))?;
    checked += check("optim.emb.exp_avg", &region("optim.emb.exp_avg")??, table_values(start, n, exp_avg))?;
    checked += check("optim.emb.exp_avg_sq", &region("optim.emb.exp_avg_sq")??, table_values(start, n, exp_avg_sq))?;
    let w = r.read_tensor("model.dense.weight")?.to_vec::<f32>()?;
    checked += check("model.dense.weight", &w, (0..DENSE * D).map(dense_w))?;
    let b = r.read_tensor("model.dense.bias")?.to_vec::<f32>()?;
    checked += check("model.dense.bias", &b, (0..DENSE).map(dense_b))?;
    let m = r.read_tensor("optim.dense.exp_avg")?.to_vec::<f32>()?;
    checked += check("optim.dense.exp_avg", &m, (0..DENSE * D).map(dense_w))?;
    let s = r.read_tensor("optim.step")?.to_vec::<i64>()?;
    if s != [step] {
        return Err(format!("optim.step is {s:?}, expected {step}").into());
    }
    Ok(checked + 1)
}

/// Every rank's rows of a sharded table, all-gathered into the whole `[V, D]` table.
fn all_gathered(g: &dyn Collective, f: fn(usize, usize) -> f32) -> Result<Tensor, Failure> {
    let (start, n) = my_rows(g);
    let mine = rows(start..start + n, f)?;
    let parts = g.all_gather(mine.data()?.to_vec())?;
    let bytes: Vec<u8> = parts.concat();
    let floats: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(Tensor::from_slice(&floats, &[V, D])?)
}

fn save_hfai(g: &dyn Collective, dir: &Path, step: i64) -> Result<(), Failure> {
    let mut model = Dict::new(DictKind::OrderedDict);
    model.insert("emb.weight", all_gathered(g, emb)?);
    model.insert("dense.weight", dense(DENSE * D, &[DENSE, D], dense_w)?);
    model.insert("dense.bias", dense(DENSE, &[DENSE], dense_b)?);
    let param_state = |avg: Tensor, sq: Option<Tensor>| {
        let mut d = vec![
            ("step", Value::Tensor(Tensor::from_slice(&[step as f32], &[]).ok()?)),
            ("exp_avg", Value::Tensor(avg)),
        ];
        if let Some(sq) = sq {
            d.push(("exp_avg_sq", Value::Tensor(sq)));
        }
        Some(Value::dict(d))
    };
    let mut state = Dict::new(DictKind::Dict);
    state.insert(
        Value::Int(0),
        param_state(all_gathered(g, exp_avg)?, Some(all_gathered(g, exp_avg_sq)?)).ok_or("step")?,
    );
    state.insert(Value::Int(1), param_state(dense(DENSE * D, &[DENSE, D], dense_w)?, None).ok_or("step")?);
    let state = Value::Dict(state);
    let groups = Value::List(vec![Value::dict([
        ("lr", Value::Float(1e-3)),
        ("weight_decay", Value::Float(0.01)),
        ("params", Value::List(vec![Value::Int(0), Value::Int(1), Value::Int(2)])),
    ])]);
    let optimizer = Value::dict([("state", state), ("param_groups", groups)]);
    let save = SaveState::default()
        .with_model(ModelState::new(model))
        .with_optimizer(optimizer)
        .with_other("step", Value::Int(step));
    ckpt::hfai::save_rank(&save, dir, &ckpt::hfai::WriteOptions::default().with_large_size(16 * 1024), g)?;
    Ok(())
}

/// hfai's `load` on every rank (the whole model, as hfai loads it); each rank checks its rows.
fn load_hfai(g: &dyn Collective, dir: &Path, step: i64) -> Result<usize, Failure> {
    let ck = HfaiReader::open_collective(dir, &Default::default(), g)?;
    if ck.other("step") != Some(&Value::Int(step)) {
        return Err(format!("hfai step is {:?}, expected {step}", ck.other("step")).into());
    }
    let model = ck.model().ok_or("the hfai checkpoint has no model")?;
    let t = |d: &Dict, k: &str| -> Result<Tensor, Failure> {
        Ok(d.get(k).and_then(Value::as_tensor).ok_or_else(|| format!("hfai: no tensor {k}"))?.clone())
    };
    let (start, n) = my_rows(g);
    let mut checked = 0;
    let e = t(model, "emb.weight")?.narrow(0, start, n)?.to_vec::<f32>()?;
    checked += check("hfai emb.weight", &e, table_values(start, n, emb))?;
    checked += check("hfai dense.bias", &t(model, "dense.bias")?.to_vec::<f32>()?, (0..DENSE).map(dense_b))?;
    let opt = ck.optimizers().into_iter().next().ok_or("the hfai checkpoint has no optimizer")?;
    let p0 = opt
        .get("state")
        .and_then(Value::as_dict)
        .and_then(|s| s.items.iter().find(|(k, _)| matches!(k, Value::Int(0))).map(|(_, v)| v))
        .and_then(Value::as_dict)
        .ok_or("hfai: no optimizer state for parameter 0")?;
    let sq = t(p0, "exp_avg_sq")?.narrow(0, start, n)?.to_vec::<f32>()?;
    checked += check("hfai exp_avg_sq", &sq, table_values(start, n, exp_avg_sq))?;
    Ok(checked)
}

/// The entries and chunks of the hfai parts one process read, each against the values saved.
fn check_hfai_share(share: &ckpt::hfai::RankShare, step: i64) -> Result<usize, Failure> {
    let mut checked = 0;
    if share.parts().contains(&0) != (share.other("step") == Some(&Value::Int(step))) {
        return Err(format!("hfai step is {:?} with parts {:?}", share.other("step"), share.parts()).into());
    }
    let model = share.model().ok_or("the hfai parts hold no model")?;
    for (k, v) in &model.items {
        let got = v.as_tensor().ok_or_else(|| format!("hfai: {k:?} is not a tensor"))?.to_vec::<f32>()?;
        checked += match k.as_str() {
            Some("dense.weight") => check("hfai dense.weight", &got, (0..DENSE * D).map(dense_w))?,
            Some("dense.bias") => check("hfai dense.bias", &got, (0..DENSE).map(dense_b))?,
            _ => return Err(format!("hfai: unexpected whole entry {k:?}").into()),
        };
    }
    for c in share.chunks() {
        let f = match c.name.as_str() {
            "model.emb.weight" => emb,
            "optimizer.state.0.exp_avg" => exp_avg,
            "optimizer.state.0.exp_avg_sq" => exp_avg_sq,
            other => return Err(format!("hfai: unexpected chunk of {other}").into()),
        };
        let want = table_values(0, V, f).skip(c.range.start).take(c.range.len());
        checked += check(&format!("hfai {} part {}", c.name, c.part), &c.tensor.to_vec::<f32>()?, want)?;
    }
    Ok(checked)
}

/// This rank's slice of RecIS's id key space in a job of `g.world_size()` ranks.
fn my_slice(g: &dyn Collective) -> Result<SliceInfo, Failure> {
    Ok(gen_slice(g.rank(), g.world_size(), SLICE_SIZE)?)
}

fn save_recis(g: &dyn Collective, dir: &Path, step: i64) -> Result<(), Failure> {
    let slice = my_slice(g)?;
    let ids: Vec<i64> = (0..V).map(recis_id).filter(|&id| slice.holds(id, IdPartition::Unsigned)).collect();
    let slot = |name: &str, s: usize| -> Result<Slot, Failure> {
        let data: Vec<f32> = ids.iter().flat_map(|&id| recis_row(id, s)).collect();
        Ok(Slot::new(name, Tensor::from_slice(&data, &[ids.len(), D])?)?)
    };
    let child = TableChild::new(
        "emb",
        ids.clone(),
        vec![slot("embedding", 0)?, slot("sparse_adamw_exp_avg", 1)?, slot("sparse_adamw_exp_avg_sq", 2)?],
    )?;
    let step = ("sparse_adamw_step".to_string(), Tensor::from_slice(&[step], &[1])?);
    std::fs::create_dir_all(dir)?; // RecIS's writer writes into an existing directory
    save_tables(&[HashTable::single(slice, child)], &[step], dir, &ckpt::recis::WriteOptions::default(), g)?;
    Ok(())
}

/// The ids of this rank's slice and their rows only ([`SparseCheckpoint::load_child`]).
fn load_recis(g: &dyn Collective, dir: &Path, step: i64) -> Result<usize, Failure> {
    let ck = SparseCheckpoint::open(dir)?;
    let slice = my_slice(g)?;
    let t = ck.load_child("emb", slice, IdPartition::Unsigned)?;
    let mut want: Vec<i64> = (0..V).map(recis_id).filter(|&id| slice.holds(id, IdPartition::Unsigned)).collect();
    let mut got = t.ids().to_vec();
    want.sort_unstable();
    got.sort_unstable();
    if got != want {
        return Err(format!("recis: rank holds {} ids, expected {}", got.len(), want.len()).into());
    }
    let mut checked = 0;
    for (s, name) in ["embedding", "sparse_adamw_exp_avg", "sparse_adamw_exp_avg_sq"].into_iter().enumerate() {
        let slot = t.slot(name).ok_or_else(|| format!("recis: no slot {name}"))?;
        for &id in t.ids() {
            let k = t.position(id)?.ok_or("recis: id without a row")?;
            checked += check(
                &format!("recis {name} of id {id}"),
                &slot.row(k)?.to_vec::<f32>()?,
                recis_row(id, s).into_iter(),
            )?;
        }
    }
    let steps = ck.read_tensor("sparse_adamw_step")?.to_vec::<i64>()?;
    if steps != [step] {
        return Err(format!("recis sparse_adamw_step is {steps:?}, expected {step}").into());
    }
    Ok(checked + 1)
}
