//! The read operations the side-by-side timer runs, each returning a check value derived from what it read.

use std::path::Path;

use ckpt_core::{CheckpointRead, EntryKind, Tensor};

/// Any error of the read paths, as text.
pub type Result<T> = std::result::Result<T, String>;

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Folds every byte of a tensor's data into a checksum (reads all of it, 8 bytes at a time).
pub fn fold_bytes(acc: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = acc;
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        sum = sum.wrapping_add(u64::from_le_bytes(a));
    }
    for &b in words.remainder() {
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
    let f = ckpt_torch::TorchFile::open(path).map_err(text)?;
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
    let f = ckpt_torch::TorchFile::open(path).map_err(text)?;
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

/// Opens a DCP checkpoint and reads every tensor byte.
///
/// # Errors
/// Any read error, as text.
pub fn dcp_read(path: &Path) -> Result<u64> {
    let r = ckpt_distcp::DcpReader::open(path).map_err(text)?;
    let keys: Vec<String> = r.keys().map(str::to_owned).collect();
    let mut sum = 0u64;
    for k in &keys {
        if r.tensor_metadata(k).is_ok() {
            sum = fold_tensor(sum, &r.read_tensor(k).map_err(text)?)?;
        }
    }
    Ok(sum)
}
