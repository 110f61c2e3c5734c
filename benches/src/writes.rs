//! The write operations the side-by-side timer runs, and the in-memory sources they save.
//!
//! A source is loaded once (outside the timing) and every one of its bytes touched, so a save reads its
//! tensors from memory, as `torch.save` does from tensors in memory. Each save is the format's default,
//! durable one (temporary file or staging directory, fsync, rename, directory fsync).

use std::path::Path;

use ckpt_collective::SingleProcess;
use ckpt_recis::name::SliceInfo;
use ckpt_recis::table::TableChild;
use ckpt_recis::{HashTable, Slot};
use ckpt_tensor::{Tensor, Value};

use crate::reads::{Result, fold_bytes};

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Every tensor of a value, depth first.
pub fn tensors<'a>(v: &'a Value, out: &mut Vec<&'a Tensor>) {
    match v {
        Value::Tensor(t) | Value::Parameter { tensor: t, .. } => out.push(t),
        Value::TensorWithState { tensor, .. } => tensors(tensor, out),
        Value::Dict(d) => d.items.iter().for_each(|(_, x)| tensors(x, out)),
        Value::List(xs) | Value::Tuple(xs) => xs.iter().for_each(|x| tensors(x, out)),
        _ => {}
    }
}

/// Reads every tensor byte of a value (faulting in mapped pages); returns a checksum.
///
/// # Errors
/// A tensor whose data cannot be read.
pub fn touch(v: &Value) -> Result<u64> {
    let mut ts = Vec::new();
    tensors(v, &mut ts);
    ts.iter().try_fold(0u64, |acc, t| Ok(fold_bytes(acc, &t.data().map_err(text)?)))
}

/// Loads a `torch.save` file as the state a save starts from, every byte touched.
///
/// # Errors
/// Any read error, as text.
pub fn load_state(path: &Path) -> Result<Value> {
    let v = ckpt_torch::load(path).map_err(text)?;
    touch(&v)?;
    Ok(v)
}

/// Durable `ckpt_torch::save`; waits for the replaced file's release afterwards (outside the caller's
/// timing only if the caller stops its clock first, as the timer does).
///
/// # Errors
/// Any write error, as text.
pub fn pt_save(v: &Value, dst: &Path) -> Result<()> {
    ckpt_torch::save(v, dst, &ckpt_torch::WriteOptions::default()).map(|_| ()).map_err(text)
}

/// A one-rank DCP save (`ckpt_distcp::save`, default options: checksum manifest, durable commit).
///
/// # Errors
/// Any write error, as text.
pub fn dcp_save(v: &Value, dst: &Path) -> Result<()> {
    ckpt_distcp::save(v, dst, &ckpt_distcp::WriteOptions::default()).map(|_| ()).map_err(text)
}

/// The hfai save state of a model state dict: the dict as the model, `step` as the one other entry.
///
/// # Errors
/// If the value is not a dict.
pub fn hfai_state(v: &Value) -> Result<ckpt_hfai::SaveState> {
    let Value::Dict(d) = v else { return Err("an hfai save needs a state dict".into()) };
    Ok(ckpt_hfai::SaveState::default()
        .with_model(ckpt_hfai::ModelState::new(d.clone()))
        .with_other("step", Value::Int(1)))
}

/// A 4-part hfai save (`ckpt_hfai::save`, the parts written in parallel, each atomically with fsync).
///
/// # Errors
/// Any write error, as text.
pub fn hfai_save(state: &ckpt_hfai::SaveState, dst: &Path) -> Result<()> {
    ckpt_hfai::save(state, dst, &ckpt_hfai::WriteOptions::default().with_world_size(4)).map(|_| ()).map_err(text)
}

/// Loads a PyTorch-BigGraph partition as the state a partition write starts from, every byte touched.
///
/// # Errors
/// Any read error, as text.
pub fn load_partition(path: &Path) -> Result<ckpt_pbg::EntityPartition> {
    let p = ckpt_pbg::read_partition_file(path).map_err(text)?;
    fold_bytes(0, &p.embeddings.data().map_err(text)?);
    Ok(p)
}

/// `ckpt_pbg::write_partition_file`.
///
/// # Errors
/// Any write error, as text.
pub fn pbg_write(p: &ckpt_pbg::EntityPartition, dst: &Path) -> Result<()> {
    ckpt_pbg::write_partition_file(dst, p).map_err(text)
}

/// Embedding width of the RecIS table workload.
pub const RECIS_DIM: usize = 16;

/// The values the RecIS table workload holds for `ids` ids: `ids[i] = i * 7919 + 3` (int64) and three
/// float32 `[ids, 16]` slots whose element `j` of slot `k` is `((j + k) % 251) / 7`. The Python side
/// (`benches/python/compare.py`) builds the same arrays.
///
/// # Errors
/// An invalid table (never for `ids` ≥ 1).
pub fn recis_table(ids: usize) -> Result<HashTable> {
    let rows = |k: usize| -> Result<Tensor> {
        let v: Vec<f32> = (0..ids * RECIS_DIM).map(|i| ((i + k) % 251) as f32 / 7.0).collect();
        Tensor::from_slice(&v, &[ids, RECIS_DIM]).map_err(text)
    };
    let id: Vec<i64> = (0..ids as i64).map(|i| i * 7919 + 3).collect();
    let child = TableChild::new(
        "item",
        id,
        vec![
            Slot::new("embedding", rows(0)?).map_err(text)?,
            Slot::new("sparse_adamw_exp_avg", rows(1)?).map_err(text)?,
            Slot::new("sparse_adamw_exp_avg_sq", rows(2)?).map_err(text)?,
        ],
    )
    .map_err(text)?;
    Ok(HashTable::single(SliceInfo::full(65536).map_err(text)?, child))
}

/// `ckpt_recis::writer::save_tables` of one table and the AdamW step (data files written in parallel, atomically).
///
/// # Errors
/// Any write error, as text.
pub fn recis_save(table: &HashTable, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst).map_err(text)?;
    let step = ("sparse_adamw_step".to_string(), Tensor::from_slice(&[42i64], &[1]).map_err(text)?);
    ckpt_recis::writer::save_tables(
        std::slice::from_ref(table),
        std::slice::from_ref(&step),
        dst,
        &ckpt_recis::WriteOptions::default(),
        &SingleProcess,
    )
    .map(|_| ())
    .map_err(text)
}

/// Opens a RecIS checkpoint and reads every byte of the `item` table's three slots.
///
/// # Errors
/// Any read error, as text.
pub fn recis_read(dir: &Path) -> Result<u64> {
    let ckpt = ckpt_recis::SparseCheckpoint::open(dir).map_err(text)?;
    let t = ckpt.child("item").map_err(text)?;
    let mut sum = 0u64;
    for name in ["embedding", "sparse_adamw_exp_avg", "sparse_adamw_exp_avg_sq"] {
        let slot = t.slot(name).ok_or_else(|| format!("no slot {name}"))?;
        let data = slot.tensor().data().map_err(text)?;
        sum = fold_bytes(sum, &data);
    }
    Ok(sum)
}
