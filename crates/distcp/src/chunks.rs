//! Chunk geometry: boxes of a tensor in global coordinates, their validation (bounds, overlaps,
//! coverage), DTensor's `Shard` split, and copying one box of a strided tensor into a dense one.

use ckpt_tensor::tensor::contiguous_strides;
use ckpt_tensor::{AlignedBytes, Buffer, DType, Tensor};

use crate::error::{Error, Result};
use crate::metadata::ChunkStorageMetadata;

/// The part of dimension `len` that rank `rank` of `world` holds under DTensor's `Shard(dim)` placement
/// (`torch.chunk` semantics: pieces of `ceil(len / world)`, the last ones shorter or empty): `(offset,
/// size)`. An empty piece starts at `len`.
///
/// ```
/// use ckpt_distcp::shard_range;
/// assert_eq!(shard_range(5, 0, 2), (0, 3));
/// assert_eq!(shard_range(5, 1, 2), (3, 2));
/// assert_eq!(shard_range(1, 1, 2), (1, 0));
/// assert_eq!(shard_range(2, 2, 3), (2, 0));
/// ```
pub fn shard_range(len: usize, rank: usize, world: usize) -> (usize, usize) {
    if world == 0 {
        return (0, len);
    }
    let piece = len.div_ceil(world);
    let start = rank.saturating_mul(piece).min(len);
    (start, piece.min(len - start))
}

/// The box rank `rank` of `world` holds of a tensor of `shape` sharded on `dim` (`Shard(dim)`):
/// `(offsets, sizes)`; every other dimension is whole.
pub fn shard_box(shape: &[usize], dim: usize, rank: usize, world: usize) -> (Vec<usize>, Vec<usize>) {
    let mut offsets = vec![0; shape.len()];
    let mut sizes = shape.to_vec();
    if let (Some(o), Some(s)) = (offsets.get_mut(dim), sizes.get_mut(dim)) {
        let (start, len) = shard_range(*s, rank, world);
        *o = start;
        *s = len;
    }
    (offsets, sizes)
}

/// Whether a box has no elements.
pub(crate) fn is_empty(sizes: &[usize]) -> bool {
    sizes.contains(&0)
}

/// The intersection of two boxes, `(offsets, sizes)`, if it has elements (a 0-d box intersects itself).
pub(crate) fn intersect(
    a_off: &[usize],
    a_size: &[usize],
    b_off: &[usize],
    b_size: &[usize],
) -> Option<(Vec<usize>, Vec<usize>)> {
    let n = a_off.len();
    if a_size.len() != n || b_off.len() != n || b_size.len() != n {
        return None;
    }
    let mut off = Vec::with_capacity(n);
    let mut len = Vec::with_capacity(n);
    for d in 0..n {
        let lo = a_off[d].max(b_off[d]);
        let hi = a_off[d].saturating_add(a_size[d]).min(b_off[d].saturating_add(b_size[d]));
        if hi <= lo {
            return None;
        }
        off.push(lo);
        len.push(hi - lo);
    }
    Some((off, len))
}

/// Number of elements of a box as u128 (cannot overflow for any realistic rank).
fn volume(sizes: &[usize]) -> u128 {
    sizes.iter().fold(1u128, |acc, &s| acc.saturating_mul(s as u128))
}

/// Checks the chunks of tensor `key` of `shape`: every chunk has the tensor's rank and lies inside it,
/// no two non-empty chunks overlap, and together they cover every element.
pub(crate) fn check_chunks(key: &str, shape: &[usize], chunks: &[ChunkStorageMetadata]) -> Result<()> {
    check_bounds(key, shape, chunks)?;
    check_overlaps(key, chunks)?;
    check_coverage(key, shape, chunks)
}

/// Rank and bounds of every chunk.
pub(crate) fn check_bounds(key: &str, shape: &[usize], chunks: &[ChunkStorageMetadata]) -> Result<()> {
    for (i, c) in chunks.iter().enumerate() {
        if c.offsets.len() != shape.len() || c.sizes.len() != shape.len() {
            return Err(Error::ChunkRank {
                key: key.to_owned(),
                chunk: i,
                expected: shape.len(),
                found: if c.offsets.len() != shape.len() { c.offsets.len() } else { c.sizes.len() },
            });
        }
        let inside =
            c.offsets.iter().zip(&c.sizes).zip(shape).all(|((&o, &s), &d)| o.checked_add(s).is_some_and(|e| e <= d));
        if !inside {
            return Err(Error::ChunkOutOfBounds {
                key: key.to_owned(),
                chunk: i,
                offsets: c.offsets.clone(),
                sizes: c.sizes.clone(),
                shape: shape.to_vec(),
            });
        }
    }
    Ok(())
}

/// No two non-empty chunks overlap. A sweep along the dimension with the most distinct offsets keeps this
/// near-linear for the usual layouts (every rank's shard starts at a different offset of one dimension).
pub(crate) fn check_overlaps(key: &str, chunks: &[ChunkStorageMetadata]) -> Result<()> {
    let mut live: Vec<usize> = (0..chunks.len()).filter(|&i| !is_empty(&chunks[i].sizes)).collect();
    if live.len() < 2 {
        return Ok(());
    }
    let ndim = chunks[live[0]].offsets.len();
    let sweep = (0..ndim)
        .max_by_key(|&d| {
            let mut offs: Vec<usize> = live.iter().map(|&i| chunks[i].offsets[d]).collect();
            offs.sort_unstable();
            offs.dedup();
            offs.len()
        })
        .unwrap_or(0);
    let start = |i: usize| chunks[i].offsets.get(sweep).copied().unwrap_or(0);
    let end = |i: usize| start(i).saturating_add(chunks[i].sizes.get(sweep).copied().unwrap_or(1));
    live.sort_by_key(|&i| (start(i), i));
    for (n, &a) in live.iter().enumerate() {
        for &b in &live[n + 1..] {
            if ndim > 0 && start(b) >= end(a) {
                break;
            }
            if intersect(&chunks[a].offsets, &chunks[a].sizes, &chunks[b].offsets, &chunks[b].sizes).is_some() {
                let (a, b) = (a.min(b), a.max(b));
                return Err(Error::OverlappingChunks {
                    key: key.to_owned(),
                    a,
                    a_offsets: chunks[a].offsets.clone(),
                    b,
                    b_offsets: chunks[b].offsets.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The chunks (in bounds, not overlapping) cover the whole tensor: their volumes add up to its size.
pub(crate) fn check_coverage(key: &str, shape: &[usize], chunks: &[ChunkStorageMetadata]) -> Result<()> {
    let total = volume(shape);
    let covered: u128 = chunks.iter().map(|c| volume(&c.sizes)).fold(0u128, u128::saturating_add);
    if covered != total {
        return Err(Error::IncompleteCoverage { key: key.to_owned(), covered, total });
    }
    Ok(())
}

/// A dense tensor of `dtype` and `shape` made over `bytes` (assembled chunks), without copying.
pub(crate) fn dense_tensor(bytes: AlignedBytes, dtype: DType, shape: &[usize]) -> Result<Tensor> {
    Ok(Tensor::from_buffer(dtype, shape, Buffer::from_owner(bytes))?)
}

/// Copies the box `src_start .. src_start + len` of `src` (any strides) into the box `dst_start ..` of the
/// dense row-major `dst` of `dst_shape` (elements of `src`'s dtype).
pub(crate) fn copy_box(
    src: &Tensor,
    src_start: &[usize],
    len: &[usize],
    dst: &mut [u8],
    dst_shape: &[usize],
    dst_start: &[usize],
) -> Result<()> {
    let es = src.dtype().size();
    let n = len.len();
    let bad = || Error::ChunkCopyOutside;
    if src.dim() != n || dst_shape.len() != n || src_start.len() != n || dst_start.len() != n {
        return Err(bad());
    }
    if is_empty(len) {
        return Ok(());
    }
    let sstr = src.strides();
    let dstr = contiguous_strides(dst_shape);
    let src_bytes = src.storage().as_bytes();
    let mut sbase = src.storage_offset();
    let mut dbase = 0usize;
    for d in 0..n {
        sbase += src_start[d] * sstr[d];
        dbase += dst_start[d] * dstr[d];
    }
    if n == 0 {
        let s = src_bytes.get(sbase * es..(sbase + 1) * es).ok_or_else(bad)?;
        dst.get_mut(..es).ok_or_else(bad)?.copy_from_slice(s);
        return Ok(());
    }
    // Innermost run: merge trailing dimensions while both sides stay contiguous.
    let mut k = n - 1;
    let mut run = len[k];
    let unit = sstr[k] == 1 || len[k] == 1;
    if unit {
        while k > 0 && len[k] == dst_shape[k] && (sstr[k - 1] == run || len[k - 1] == 1) {
            k -= 1;
            run *= len[k];
        }
    }
    let outer = if unit { k } else { n - 1 };
    let run_elems = if unit { run } else { 1 };
    let inner_count = if unit { 1 } else { len[n - 1] };
    let mut idx = vec![0usize; outer];
    loop {
        let mut s = sbase;
        let mut t = dbase;
        for d in 0..outer {
            s += idx[d] * sstr[d];
            t += idx[d] * dstr[d];
        }
        for j in 0..inner_count {
            let (ss, tt) = if unit { (s, t) } else { (s + j * sstr[n - 1], t + j) };
            let from = src_bytes.get(ss * es..(ss + run_elems) * es).ok_or_else(bad)?;
            dst.get_mut(tt * es..(tt + run_elems) * es).ok_or_else(bad)?.copy_from_slice(from);
        }
        // Odometer over the outer dimensions.
        let mut d = outer;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < len[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// A copy of `t` in a storage of exactly its own bytes, as torch's `clone()` (preserve format) makes it:
/// strides are kept when the view is non-overlapping and dense (a transpose, a permutation), otherwise the
/// copy is row-major.
pub(crate) fn clone_dense(t: &Tensor) -> Result<Tensor> {
    let n = t.dim();
    let mut order: Vec<usize> = (0..n).filter(|&d| t.shape()[d] != 1).collect();
    order.sort_by_key(|&d| std::cmp::Reverse(t.strides()[d]));
    let mut expected = 1usize;
    let mut dense = true;
    for &d in order.iter().rev() {
        if t.strides()[d] != expected {
            dense = false;
            break;
        }
        expected = expected.saturating_mul(t.shape()[d]);
    }
    if t.numel() == 0 {
        return Ok(Tensor::from_parts(t.dtype(), t.shape(), t.strides(), 0, Buffer::zeroed(0)?)?);
    }
    if !dense || order.len() <= 1 {
        return Ok(t.to_contiguous()?.with_requires_grad(t.requires_grad()));
    }
    // Permute so the strides decrease, gather row-major, then view with the original strides.
    let mut perm: Vec<usize> = order.clone();
    perm.extend((0..n).filter(|&d| t.shape()[d] == 1));
    let pshape: Vec<usize> = perm.iter().map(|&d| t.shape()[d]).collect();
    let pstrides: Vec<usize> = perm.iter().map(|&d| t.strides()[d]).collect();
    let permuted = Tensor::from_parts(t.dtype(), &pshape, &pstrides, t.storage_offset(), t.storage().clone())?;
    let packed = permuted.to_contiguous()?;
    let strides = {
        let mut s = vec![0usize; n];
        let cs = contiguous_strides(&pshape);
        for (i, &d) in perm.iter().enumerate() {
            s[d] = cs[i];
        }
        s
    };
    Ok(Tensor::from_parts(t.dtype(), t.shape(), &strides, 0, packed.storage().clone())?
        .with_requires_grad(t.requires_grad()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn chunk(offsets: &[usize], sizes: &[usize]) -> ChunkStorageMetadata {
        ChunkStorageMetadata { offsets: offsets.to_vec(), sizes: sizes.to_vec() }
    }

    #[test]
    fn validation_rules() {
        let shape = [5, 4];
        let good = [chunk(&[0, 0], &[3, 4]), chunk(&[3, 0], &[2, 4]), chunk(&[5, 0], &[0, 4])];
        check_chunks("k", &shape, &good).unwrap();
        let over = [chunk(&[0, 0], &[3, 4]), chunk(&[2, 0], &[3, 4])];
        assert!(matches!(check_chunks("k", &shape, &over), Err(Error::OverlappingChunks { a: 0, b: 1, .. })));
        let gap = [chunk(&[0, 0], &[3, 4])];
        assert!(matches!(
            check_chunks("k", &shape, &gap),
            Err(Error::IncompleteCoverage { covered: 12, total: 20, .. })
        ));
        let out = [chunk(&[0, 0], &[6, 4])];
        assert!(matches!(check_chunks("k", &shape, &out), Err(Error::ChunkOutOfBounds { .. })));
        let rank = [chunk(&[0], &[5])];
        assert!(matches!(check_chunks("k", &shape, &rank), Err(Error::ChunkRank { .. })));
        let huge = [chunk(&[usize::MAX, 0], &[2, 4])];
        assert!(matches!(check_chunks("k", &shape, &huge), Err(Error::ChunkOutOfBounds { .. })));
        check_chunks("s", &[], &[chunk(&[], &[])]).unwrap();
        assert!(check_chunks("s", &[], &[chunk(&[], &[]), chunk(&[], &[])]).is_err());
        // columns: the sweep picks dimension 1
        let cols: Vec<_> = (0..8).map(|i| chunk(&[0, i], &[3, 1])).collect();
        check_chunks("c", &[3, 8], &cols).unwrap();
    }

    #[test]
    fn shards() {
        assert_eq!(shard_box(&[3, 6], 1, 1, 2), (vec![0, 3], vec![3, 3]));
        assert_eq!(shard_range(7, 2, 3), (6, 1));
        assert_eq!(shard_range(0, 0, 2), (0, 0));
    }

    #[test]
    fn copies_strided_boxes() {
        let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let t = Tensor::from_slice(&v, &[4, 6]).unwrap();
        let tt = t.transpose(0, 1).unwrap(); // [6, 4]
        let mut dst = vec![0u8; 6 * 4 * 4];
        copy_box(&tt, &[1, 1], &[2, 3], &mut dst, &[6, 4], &[0, 0]).unwrap();
        let out: Vec<f32> = dst.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(&out[..3], &[7.0, 13.0, 19.0]);
        assert_eq!(&out[4..7], &[8.0, 14.0, 20.0]);
        let mut whole = vec![0u8; 24 * 4];
        copy_box(&t, &[0, 0], &[4, 6], &mut whole, &[4, 6], &[0, 0]).unwrap();
        assert_eq!(whole, t.data().unwrap().to_vec());
    }

    #[test]
    fn clones_like_torch() {
        let v: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let t = Tensor::from_slice(&v, &[2, 3]).unwrap();
        let tt = t.transpose(0, 1).unwrap();
        let c = clone_dense(&tt).unwrap();
        assert_eq!(c.strides(), &[1, 3]);
        assert_eq!(c.to_vec::<f32>().unwrap(), tt.to_vec::<f32>().unwrap());
        let col = t.narrow(1, 1, 1).unwrap();
        let c = clone_dense(&col).unwrap();
        assert_eq!(c.storage().len(), 8);
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.0, 4.0]);
        let sl = Tensor::from_slice(&(0..10).collect::<Vec<i32>>(), &[10]).unwrap().narrow(0, 2, 3).unwrap();
        let c = clone_dense(&sl).unwrap();
        assert_eq!((c.storage().len(), c.storage_offset()), (12, 0));
        assert_eq!(c.to_vec::<i32>().unwrap(), vec![2, 3, 4]);
    }
}
