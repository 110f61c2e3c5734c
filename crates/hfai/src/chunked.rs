//! A large tensor held as the flat chunks its parts store: sliced and concatenated without copying where
//! a range lies inside one chunk.

use ckpt_tensor::{Buffer, DType, Tensor};
use rayon::prelude::*;

use crate::error::{Error, Result};

/// A tensor of `shape` whose row-major elements are the concatenation of flat `pieces` (the chunks of the
/// parts, in rank order).
#[derive(Debug, Clone)]
pub(crate) struct Chunked {
    dtype: DType,
    shape: Vec<usize>,
    /// 1-D, contiguous, offset-0 windows.
    pieces: Vec<Tensor>,
    /// First element of each piece.
    starts: Vec<usize>,
    numel: usize,
    requires_grad: bool,
}

impl Chunked {
    /// Checks that `pieces` (1-D, of `dtype`) add up to `shape`. `key` names the tensor in errors.
    pub(crate) fn new(key: &str, dtype: DType, shape: Vec<usize>, pieces: Vec<Tensor>) -> Result<Self> {
        let mut starts = Vec::with_capacity(pieces.len());
        let mut numel = 0usize;
        let mut flat = Vec::with_capacity(pieces.len());
        for p in pieces {
            starts.push(numel);
            numel = numel.saturating_add(p.numel());
            flat.push(p.to_contiguous()?);
        }
        let expected = ckpt_tensor::checked_numel(&shape).unwrap_or(usize::MAX);
        if expected != numel {
            return Err(Error::ChunkSizeMismatch {
                key: key.to_owned(),
                shape,
                expected,
                found: numel,
                world_size: flat.len(),
            });
        }
        let requires_grad = flat.iter().any(Tensor::requires_grad);
        Ok(Chunked { dtype, shape, pieces: flat, starts, numel, requires_grad })
    }

    /// A chunked view of a whole contiguous tensor (one piece).
    pub(crate) fn from_tensor(t: &Tensor) -> Result<Self> {
        let flat = t.reshape(&[t.numel()])?;
        Ok(Chunked {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            starts: vec![0],
            numel: t.numel(),
            requires_grad: t.requires_grad(),
            pieces: vec![flat],
        })
    }

    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub(crate) fn numel(&self) -> usize {
        self.numel
    }

    pub(crate) fn nbytes(&self) -> u64 {
        self.numel as u64 * self.dtype.size() as u64
    }

    /// Elements `start .. start + len` as a flat tensor with a storage of exactly those bytes, and whether
    /// they had to be copied (the range spans pieces) rather than handed out as a window.
    pub(crate) fn range(&self, start: usize, len: usize) -> Result<(Tensor, bool)> {
        let end = start.checked_add(len).filter(|&e| e <= self.numel).ok_or(Error::ElementsOutOfRange {
            start,
            len,
            numel: self.numel,
        })?;
        let es = self.dtype.size();
        // pieces overlapping [start, end), skipping empty ones
        let mut overlapping = self
            .pieces
            .iter()
            .zip(&self.starts)
            .filter(|&(p, &s)| p.numel() > 0 && s < end && s + p.numel() > start)
            .peekable();
        let first = overlapping.peek().map(|&(p, &s)| (p.clone(), s));
        let rest = overlapping.clone().count();
        let (buffer, copied) = match first {
            Some((p, s)) if rest == 1 => (p.storage().slice_len((start - s) * es, len * es)?, false),
            _ => {
                // The range spans pieces: concatenated when its bytes are asked for
                // ([`Buffer::deferred_ranged`]), so that a writer streaming such tensors holds a piece of
                // one at a time. The pieces are windows this reader holds anyway; the part of each that a
                // range asks for is copied into its own section, in parallel.
                let mut parts = Vec::new();
                for (p, &s) in overlapping {
                    let (from, to) = (start.max(s) - s, end.min(s + p.numel()) - s);
                    parts.push(p.storage().slice(from * es..to * es)?);
                }
                if parts.iter().map(Buffer::len).sum::<usize>() != len * es {
                    return Err(Error::OverlappingChunkRanges);
                }
                let fill_at = move |offset: usize, out: &mut [u8]| -> ckpt_tensor::Result<()> {
                    let end = offset + out.len();
                    let mut sections = Vec::with_capacity(parts.len());
                    let (mut rest, mut at, mut rest_at) = (out, 0, offset);
                    for src in &parts {
                        let (lo, hi) = (offset.max(at), end.min(at + src.len()));
                        if lo < hi {
                            let Some((dst, tail)) = rest.split_at_mut_checked(hi - rest_at) else {
                                return Err(Error::OverlappingChunkRanges.into());
                            };
                            sections.push((dst, src.slice(lo - at..hi - at)?));
                            rest = tail;
                            rest_at = hi;
                        }
                        at += src.len();
                    }
                    if !rest.is_empty() {
                        return Err(Error::OverlappingChunkRanges.into());
                    }
                    sections.into_par_iter().try_for_each(|(dst, src)| {
                        dst.copy_from_slice(&src.bytes()?);
                        Ok(())
                    })
                };
                (Buffer::deferred_ranged(len * es, fill_at), len > 0)
            }
        };
        Ok((Tensor::from_buffer(self.dtype, &[len], buffer)?.with_requires_grad(self.requires_grad), copied))
    }

    /// The whole tensor in its stored shape, and whether it had to be concatenated (copied).
    pub(crate) fn whole(&self) -> Result<(Tensor, bool)> {
        let (flat, copied) = self.range(0, self.numel)?;
        Ok((flat.reshape(&self.shape)?, copied))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pieces(lens: &[usize]) -> (Vec<Tensor>, Vec<f32>) {
        let mut all = Vec::new();
        let mut out = Vec::new();
        for &n in lens {
            let v: Vec<f32> = (all.len()..all.len() + n).map(|i| i as f32).collect();
            all.extend_from_slice(&v);
            out.push(Tensor::from_slice(&v, &[n]).unwrap());
        }
        (out, all)
    }

    #[test]
    fn windows_inside_one_piece() {
        let (p, all) = pieces(&[4, 0, 4, 3]);
        let c = Chunked::new("w", DType::F32, vec![11], p.clone()).unwrap();
        let (t, copied) = c.range(5, 2).unwrap();
        assert!(!copied);
        assert!(t.storage().same_backing(p[2].storage()));
        assert_eq!(t.to_vec::<f32>().unwrap(), &all[5..7]);
        let (t, copied) = c.range(2, 7).unwrap();
        assert!(copied);
        assert_eq!(t.to_vec::<f32>().unwrap(), &all[2..9]);
        let (t, copied) = c.range(4, 4).unwrap();
        assert!(!copied, "a whole piece after an empty one is a window");
        assert_eq!(t.storage().len(), 16);
        assert!(c.range(10, 2).is_err());
        let (w, copied) = c.whole().unwrap();
        assert!(copied);
        assert_eq!(w.to_vec::<f32>().unwrap(), all);
    }

    /// A concatenated range makes any byte range of itself from the pieces it spans alone, and streams in
    /// pieces of any size (`Buffer::deferred_ranged`).
    #[test]
    fn concatenated_ranges_make_any_sub_range() {
        let (p, all) = pieces(&[3, 0, 5, 1, 4]);
        let c = Chunked::new("w", DType::F32, vec![13], p).unwrap();
        let (t, copied) = c.range(1, 11).unwrap();
        assert!(copied);
        let want = all[1..12].iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        let storage = t.storage();
        for a in 0..want.len() {
            for b in a..=want.len() {
                assert_eq!(&*storage.slice(a..b).unwrap().bytes().unwrap(), &want[a..b], "{a}..{b}");
            }
        }
        for piece in [1, 5, 16, 1 << 20] {
            let mut streamed = Vec::new();
            t.data_pieces(piece, |d| {
                streamed.extend_from_slice(d);
                Ok::<(), ckpt_tensor::Error>(())
            })
            .unwrap();
            assert_eq!(streamed, want, "piece {piece}");
        }
        assert!(storage.is_deferred(), "nothing kept");
    }

    #[test]
    fn one_piece_is_zero_copy() {
        let (p, all) = pieces(&[6]);
        let c = Chunked::new("w", DType::F32, vec![2, 3], p.clone()).unwrap();
        let (w, copied) = c.whole().unwrap();
        assert!(!copied);
        assert_eq!(w.shape(), &[2, 3]);
        assert!(w.storage().same_storage(p[0].storage()));
        assert_eq!(w.to_vec::<f32>().unwrap(), all);
    }

    #[test]
    fn sizes_must_add_up() {
        let (p, _) = pieces(&[3, 3]);
        let e = Chunked::new("w", DType::F32, vec![2, 4], p).unwrap_err();
        assert!(matches!(e, Error::ChunkSizeMismatch { expected: 8, found: 6, world_size: 2, .. }), "{e}");
    }
}
