//! The read operations the side-by-side timer runs, each returning a check value derived from what it read.

use std::path::Path;

use ckpt_tensor::{CheckpointRead, EntryKind, Tensor};
use rayon::prelude::*;

/// Any error of the read paths, as text.
pub type Result<T> = std::result::Result<T, String>;

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Folds every byte of a tensor's data into a checksum: the cheapest way to read all of it (four independent
/// 64-bit lanes over 32-byte blocks, which the compiler turns into vector adds).
pub fn fold_bytes(acc: u64, bytes: &[u8]) -> u64 {
    let mut lanes = [0u64; 4];
    let mut blocks = bytes.chunks_exact(32);
    for b in &mut blocks {
        for (lane, w) in lanes.iter_mut().zip(b.chunks_exact(8)) {
            let mut a = [0u8; 8];
            a.copy_from_slice(w);
            *lane = lane.wrapping_add(u64::from_le_bytes(a));
        }
    }
    let mut sum = acc;
    for lane in lanes {
        sum = sum.wrapping_add(lane);
    }
    for &b in blocks.remainder() {
        sum = sum.wrapping_add(u64::from(b));
    }
    sum
}

fn fold_tensor(acc: u64, t: &Tensor) -> Result<u64> {
    Ok(fold_bytes(acc, &t.data().map_err(text)?))
}

/// Opens a `torch.save` file and lists every entry's name, dtype and shape; the check is the number of
/// entries plus the sum of their ranks.
///
/// # Errors
/// Any read error, as text.
pub fn pt_list(path: &Path) -> Result<u64> {
    let f = ckpt_torch::TorchReader::open(path).map_err(text)?;
    let mut check = 0u64;
    for e in f.entries() {
        check += 1 + e.name.len() as u64 % 2;
        if let EntryKind::Tensor(t) = &e.kind {
            check += t.shape.len() as u64 + t.dtype.size() as u64;
        }
    }
    Ok(check)
}

/// Opens a `torch.save` file and reads every tensor byte.
///
/// # Errors
/// Any read error, as text.
pub fn pt_read(path: &Path) -> Result<u64> {
    let f = ckpt_torch::TorchReader::open(path).map_err(text)?;
    let mut sum = 0u64;
    for e in f.entries() {
        if let EntryKind::Tensor(_) = e.kind {
            sum = fold_tensor(sum, &f.tensor(&e.name).map_err(text)?)?;
        }
    }
    Ok(sum)
}

/// Opens a DCP checkpoint (metadata decoded and validated); the check is the number of items.
///
/// # Errors
/// Any read error, as text.
pub fn dcp_open(path: &Path) -> Result<u64> {
    let r = ckpt_distcp::DcpReader::open(path).map_err(text)?;
    Ok(r.metadata().storage_data.len() as u64 + r.entries().len() as u64)
}

/// Opens a DCP checkpoint and reads every tensor byte, the tensors in parallel (items are parsed and their
/// files' pages read on every core).
///
/// # Errors
/// Any read error, as text.
pub fn dcp_read(path: &Path) -> Result<u64> {
    let r = ckpt_distcp::DcpReader::open(path).map_err(text)?;
    let keys: Vec<&str> = r.keys().filter(|k| r.tensor_metadata(k).is_ok()).collect();
    let sums: Vec<u64> = keys
        .par_iter()
        .map(|k| r.read_tensor(k).map_err(text).and_then(|t| fold_tensor(0, &t)))
        .collect::<Result<_>>()?;
    Ok(sums.into_iter().fold(0, u64::wrapping_add))
}

/// Opens an hfai checkpoint directory (parts mapped and merged in parallel) and reads every model and
/// optimizer tensor byte, the tensors in parallel. A tensor stored as chunks in several parts is read from
/// its parts' maps a piece at a time (`Tensor::data_pieces`, as ckpt's writers and conversions read it),
/// not joined into fresh memory first: like every other tensor here, and like `pt_read`'s, it is read
/// where it lies.
///
/// # Errors
/// Any read error, as text.
pub fn hfai_read(path: &Path) -> Result<u64> {
    const PIECE: usize = 4 << 20;
    let c = ckpt_hfai::HfaiReader::open(path).map_err(text)?;
    let tensors: Vec<&Tensor> = c
        .models()
        .into_iter()
        .chain(c.optimizers())
        .flat_map(|d| d.items.iter().filter_map(|(_, v)| v.as_tensor()))
        .collect();
    let fold_pieces = |t: &&Tensor| {
        let mut sum = 0u64;
        t.data_pieces(PIECE, |piece| {
            sum = fold_bytes(sum, piece);
            Ok::<(), ckpt_tensor::Error>(())
        })
        .map_err(text)?;
        Ok(sum)
    };
    let sums: Vec<u64> = tensors.par_iter().map(fold_pieces).collect::<Result<_>>()?;
    Ok(sums.into_iter().fold(0, u64::wrapping_add))
}

/// Reads a PyTorch-BigGraph embedding partition file whole (embeddings and optimizer state) and reads
/// every embedding byte.
///
/// # Errors
/// Any read error, as text.
pub fn pbg_read(path: &Path) -> Result<u64> {
    let p = ckpt_pbg::read_partition_file(path).map_err(text)?;
    fold_tensor(0, &p.embeddings)
}
