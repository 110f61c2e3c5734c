//! Parameters cut out of the ranks' flat groups: a parameter is a run of elements of one flat sequence (the
//! ranks' partitions of a param group one after the other, ZeRO 1 and 2) or one run per rank (ZeRO 3), and
//! its tensor is made from those windows of the files' memory maps only when its bytes are read.

use ckpt_tensor::{Buffer, DType, Tensor};

use crate::error::{Error, Result};

/// The elements `start .. start + len` of the sequence `flats` makes when laid one after the other, as views
/// of the flat tensors (1-D, one dtype); `None` when the sequence is shorter.
pub(crate) fn run(flats: &[Tensor], start: usize, len: usize) -> Result<Option<Vec<Tensor>>> {
    let mut pieces = Vec::new();
    let (mut skip, mut left) = (start, len);
    for flat in flats {
        if left == 0 {
            break;
        }
        let n = flat.numel();
        if skip >= n {
            skip -= n;
            continue;
        }
        let take = (n - skip).min(left);
        pieces.push(flat.narrow(0, skip, take)?);
        left -= take;
        skip = 0;
    }
    Ok((left == 0).then_some(pieces))
}

/// The tensor of `dtype` and `shape` whose elements are the first `numel(shape)` elements of `pieces` (1-D
/// views, in order; there may be more elements, the padding DeepSpeed adds, which is left out). A parameter
/// held by one piece is a view of it; otherwise the tensor's bytes are made on demand, any range of them from
/// the pieces it overlaps ([`Buffer::deferred_ranged`]), so that a writer streaming it holds a piece of it at
/// a time.
pub(crate) fn assemble(name: &str, dtype: DType, shape: &[usize], pieces: Vec<Tensor>) -> Result<Tensor> {
    let numel = ckpt_tensor::checked_numel(shape)
        .ok_or_else(|| Error::ShapeOverflow { name: name.to_owned(), shape: shape.to_vec() })?;
    let mut kept = Vec::with_capacity(pieces.len());
    let mut left = numel;
    for p in pieces {
        if left == 0 {
            break;
        }
        if p.dtype() != dtype || p.dim() != 1 {
            return Err(Error::BadFlatPiece {
                name: name.to_owned(),
                dtype,
                found_dtype: p.dtype(),
                found_shape: p.shape().to_vec(),
            });
        }
        let take = p.numel().min(left);
        kept.push(p.narrow(0, 0, take)?.to_contiguous()?);
        left -= take;
    }
    if left != 0 {
        return Err(Error::FlatGroupsShort { name: name.to_owned(), held: numel - left, numel });
    }
    match kept.as_slice() {
        [] => Ok(Tensor::zeros(dtype, shape)?),
        [one] => Ok(one.reshape(shape)?),
        _ => {
            let parts = kept.iter().map(|p| p.storage().slice_len(p.storage_offset() * dtype.size(), p.nbytes()));
            Ok(Tensor::from_buffer(dtype, shape, Buffer::concat(parts.collect::<ckpt_tensor::Result<_>>()?))?)
        }
    }
}

/// DeepSpeed's partition of a parameter of `numel` elements over `world` ranks in ZeRO 3: each rank holds
/// `ceil(numel / world)` elements (the last ones padding).
pub(crate) fn zero3_partition(numel: usize, world: usize) -> usize {
    numel.div_ceil(world.max(1))
}

/// The error of a flat sequence too short for what a layout asks of it.
pub(crate) fn short(dir: &std::path::Path, group: usize, name: &str, start: usize, len: usize, have: usize) -> Error {
    Error::FlatGroups {
        dir: dir.to_path_buf(),
        group,
        problem: format!("{name} needs elements {start}..{} of a flat sequence of {have}", start.saturating_add(len)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn flat(v: &[f32]) -> Tensor {
        Tensor::from_slice(v, &[v.len()]).unwrap()
    }

    #[test]
    fn runs_cross_flat_tensors() {
        let flats = [flat(&[0.0, 1.0, 2.0]), flat(&[3.0, 4.0]), flat(&[5.0])];
        let pieces = run(&flats, 2, 3).unwrap().unwrap();
        let t = assemble("p", DType::F32, &[3], pieces).unwrap();
        assert!(t.storage().is_deferred());
        assert_eq!(t.to_vec::<f32>().unwrap(), [2.0, 3.0, 4.0]);
        assert!(run(&flats, 4, 3).unwrap().is_none());
        let one = assemble("p", DType::F32, &[1, 2], run(&flats, 3, 2).unwrap().unwrap()).unwrap();
        assert!(!one.storage().is_deferred(), "one piece is a view");
        assert_eq!(one.to_vec::<f32>().unwrap(), [3.0, 4.0]);
    }

    #[test]
    fn assembled_bytes_stream_in_any_range() {
        let pieces = vec![flat(&[1.0, 2.0]), flat(&[3.0, 4.0, 9.0])];
        let t = assemble("p", DType::F32, &[2, 2], pieces).unwrap();
        let window = t.storage().slice(4..12).unwrap();
        assert_eq!(&*window.bytes().unwrap(), [2.0f32, 3.0].map(f32::to_le_bytes).concat().as_slice());
        assert!(assemble("p", DType::F32, &[9], vec![flat(&[1.0])]).is_err());
        assert_eq!(zero3_partition(5, 2), 3);
    }
}
