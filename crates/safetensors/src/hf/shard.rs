//! How a state dict is split into shards, and how shard sizes are written: as `huggingface_hub` and
//! `transformers` do.
//!
//! Shards are filled greedily in the state dict's order by `huggingface_hub`'s
//! `split_state_dict_into_shards_factory` (`huggingface_hub/serialization/_base.py`, which
//! `split_torch_state_dict_into_shards` and `transformers`' `PreTrainedModel.save_pretrained` use): a tensor
//! larger than the maximum gets a shard of its own, appended at once (before the shard being filled); a
//! tensor that would take the current shard over the maximum closes it; `total_size` is the sum of the
//! tensors' sizes. A tensor's size is the bytes safetensors stores for it (`get_torch_storage_size` of every
//! tensor a safetensors file loads: each has its own storage). Files are named
//! `model-{i:05}-of-{n:05}.safetensors`, or `model.safetensors` when there is one shard (then no index).

use crate::hf::error::{Error, Result};

/// The default maximum shard size: 5 GB (`huggingface_hub`'s `MAX_SHARD_SIZE = "5GB"`, decimal).
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 5_000_000_000;

/// A shard size as `transformers` reads one (`transformers.utils.hub.convert_file_size_to_int`): an
/// integer is bytes; `KiB`, `MiB`, `GiB`, `TiB` are binary and `KB`, `MB`, `GB`, `TB` decimal (units in any
/// case); a unit ending in a lowercase `b` counts bits (`5Gb` is 625,000,000 bytes). A fractional number
/// (`1.5GB`) is accepted as `huggingface_hub`'s `parse_size_to_int` accepts it, truncated to whole bytes.
///
/// ```
/// use ckpt_safetensors::hf::parse_size;
/// assert_eq!(parse_size("5GB").unwrap(), 5_000_000_000);
/// assert_eq!(parse_size("500MB").unwrap(), 500_000_000);
/// assert_eq!(parse_size("64KB").unwrap(), 64_000);
/// assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
/// assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
/// assert_eq!(parse_size("4096").unwrap(), 4096);
/// assert!(parse_size("5 parsecs").is_err());
/// ```
///
/// # Errors
/// [`Error::BadSize`].
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = || Error::BadSize { text: text.to_owned() };
    let t = text.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    let upper = t.to_ascii_uppercase();
    const BINARY: [(&str, u32); 4] = [("TIB", 40), ("GIB", 30), ("MIB", 20), ("KIB", 10)];
    const DECIMAL: [(&str, u32); 4] = [("TB", 12), ("GB", 9), ("MB", 6), ("KB", 3)];
    let (number, scale, bits) = if let Some((unit, shift)) = BINARY.iter().find(|(u, _)| upper.ends_with(u)) {
        (&t[..t.len() - unit.len()], 2f64.powi(*shift as i32), false)
    } else if let Some((unit, exp)) = DECIMAL.iter().find(|(u, _)| upper.ends_with(u)) {
        (&t[..t.len() - unit.len()], 10f64.powi(*exp as i32), t.ends_with('b'))
    } else {
        return Err(bad());
    };
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    let bytes = (value * scale).trunc();
    if bytes > u64::MAX as f64 {
        return Err(bad());
    }
    let bytes = bytes as u64;
    Ok(if bits { bytes / 8 } else { bytes })
}

/// The shards of tensors of `sizes` (in the state dict's order) for a maximum of `max` bytes: each shard is
/// the indices of its tensors, shards in file order (`split_state_dict_into_shards_factory`).
///
/// ```
/// // huggingface_hub's own example: [6, 6, 2, 6, 2, 2] GB under 10 GB -> [6], [6+2], [6+2+2].
/// let shards = ckpt_safetensors::hf::shard::plan(&[6, 6, 2, 6, 2, 2], 10);
/// assert_eq!(shards, [vec![0], vec![1, 2], vec![3, 4, 5]]);
/// // A tensor over the maximum gets its own shard, ahead of the one being filled.
/// assert_eq!(ckpt_safetensors::hf::shard::plan(&[1, 20, 1], 10), [vec![1], vec![0, 2]]);
/// ```
pub fn plan(sizes: &[u64], max: u64) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut current_size = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        if size > max {
            shards.push(vec![i]);
            continue;
        }
        if current_size.saturating_add(size) > max {
            shards.push(std::mem::take(&mut current));
            current_size = 0;
        }
        current.push(i);
        current_size += size;
    }
    if !current.is_empty() {
        shards.push(current);
    }
    shards
}

/// The file name of shard `i` (from 0) of `n`: `model-00001-of-00003.safetensors`, or `model.safetensors`
/// when `n` is 1.
pub fn file_name(i: usize, n: usize) -> String {
    if n == 1 { crate::hf::SINGLE_FILE.to_owned() } else { format!("model-{:05}-of-{:05}.safetensors", i + 1, n) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sizes_as_transformers_parses_them() {
        assert_eq!(parse_size("5gb").unwrap(), 625_000_000); // lowercase b: bits
        assert_eq!(parse_size("5Gb").unwrap(), 625_000_000);
        assert_eq!(parse_size("1mib").unwrap(), 1 << 20);
        assert_eq!(parse_size(" 3 KB ").unwrap(), 3000);
        assert!(parse_size("-1GB").is_err() && parse_size("GB").is_err() && parse_size("").is_err());
    }

    #[test]
    fn plans() {
        assert!(plan(&[], 10).is_empty());
        assert_eq!(plan(&[0, 0, 10, 0], 10), [vec![0, 1, 2, 3]]);
        assert_eq!(plan(&[5, 6], 10), [vec![0], vec![1]]);
        assert_eq!(plan(&[11], 10), [vec![0]]);
        assert_eq!(file_name(0, 1), "model.safetensors");
        assert_eq!(file_name(1, 3), "model-00002-of-00003.safetensors");
    }
}
