//! How hfai spreads a checkpoint over ranks: the byte size of an entry (`count_size`), the greedy
//! key-to-rank partition (`split_dict` / `divide_almost_equally`) and `torch.chunk`'s split of a large tensor.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

use ckpt_tensor::Value;

/// hfai's `count_size`: bytes of a tensor (`numel × element size`), the sum over a dict's values or a
/// list's / tuple's items (`torch.Size` is a tuple), 8 for an `int`, `float` or `bool`, 0 for anything else
/// (strings, `None`, and tensors whose data the library cannot see, such as sparse ones).
///
/// ```
/// use ckpt_tensor::{Tensor, Value};
/// let t = Value::Tensor(Tensor::zeros(ckpt_tensor::DType::F32, &[3, 4]).unwrap());
/// let entry = Value::dict([("step", Value::Int(3)), ("exp_avg", t)]);
/// assert_eq!(ckpt_hfai::count_size(&entry), 8 + 48);
/// ```
pub fn count_size(v: &Value) -> u64 {
    match v {
        Value::Dict(d) => d.items.iter().map(|(_, v)| count_size(v)).sum(),
        Value::List(items) | Value::Tuple(items) => items.iter().map(count_size).sum(),
        Value::Size(dims) => 8 * dims.len() as u64,
        Value::Int(_) | Value::BigInt(_) | Value::Float(_) | Value::Bool(_) => 8,
        other => other.as_tensor().map_or(0, |t| t.nbytes() as u64),
    }
}

/// hfai's `divide_almost_equally`: greedy longest-processing-time partition of `sizes` over `world_size`
/// ranks. Entries are taken largest first, each going to the rank with the smallest load so far (ties: the
/// lower rank). Returns, per rank, the indices of its entries in the order they were assigned.
///
/// Among equal sizes the later index goes first: hfai sorts with `np.argsort(sizes)[::-1]`, which for up
/// to 16 entries (numpy's stable insertion-sort path) gives exactly that order. For more entries numpy's
/// order among ties depends on its version and the CPU, so an assignment cannot be reproduced from the
/// Python side in general; loaders do not care where a key lives.
///
/// ```
/// // sizes 4, 4, 2, 1 over two ranks: index 1 (the later 4) first, to rank 0; index 0 to rank 1; ...
/// assert_eq!(ckpt_hfai::assign(&[4, 4, 2, 1], 2), vec![vec![1, 2], vec![0, 3]]);
/// ```
pub fn assign(sizes: &[u64], world_size: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| Reverse((sizes.get(i).copied().unwrap_or(0), i)));
    let mut sets: Vec<Vec<usize>> = vec![Vec::new(); world_size];
    let mut heap: BinaryHeap<Reverse<(u128, usize)>> = (0..world_size).map(|r| Reverse((0, r))).collect();
    for i in order {
        let Some(Reverse((load, rank))) = heap.pop() else { break };
        if let Some(set) = sets.get_mut(rank) {
            set.push(i);
        }
        heap.push(Reverse((load + u128::from(sizes.get(i).copied().unwrap_or(0)), rank)));
    }
    sets
}

/// The element ranges `torch.chunk(world_size)` gives a flat tensor of `numel` elements: chunks of
/// `ceil(numel / world_size)` elements, the last one shorter, and only `ceil(numel / chunk)` of them, which can
/// be fewer than `world_size` (torch gives `world_size` empty chunks for an empty tensor).
///
/// ```
/// assert_eq!(ckpt_hfai::chunk_ranges(10, 4), vec![0..3, 3..6, 6..9, 9..10]);
/// assert_eq!(ckpt_hfai::chunk_ranges(5, 4), vec![0..2, 2..4, 4..5]); // 3 chunks for 4 ranks
/// ```
pub fn chunk_ranges(numel: usize, world_size: usize) -> Vec<Range<usize>> {
    if world_size == 0 {
        return Vec::new();
    }
    if numel == 0 {
        return vec![0..0; world_size];
    }
    let q = numel.div_ceil(world_size);
    (0..numel.div_ceil(q)).map(|k| k * q..((k + 1) * q).min(numel)).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ckpt_tensor::{DType, Tensor};

    #[test]
    fn sizes_follow_count_size() {
        let t = |n: usize| Value::Tensor(Tensor::zeros(DType::BF16, &[n]).unwrap());
        assert_eq!(count_size(&t(5)), 10);
        assert_eq!(count_size(&Value::List(vec![t(1), Value::Float(1.0), Value::Bool(true)])), 18);
        assert_eq!(count_size(&Value::Str("abc".into())), 0);
        assert_eq!(count_size(&Value::None), 0);
        assert_eq!(count_size(&Value::Size(vec![2, 3])), 16);
        assert_eq!(count_size(&Value::dict([("a", Value::dict([("b", t(2))]))])), 4);
    }

    #[test]
    fn lpt_assignment() {
        // the first world_size largest go to ranks 0, 1, 2; then each to the lightest rank
        assert_eq!(assign(&[10, 50, 30, 20, 5], 3), vec![vec![1], vec![2, 4], vec![3, 0]]);
        // ties between loads go to the lower rank; ties between sizes take the later index first
        assert_eq!(assign(&[1, 1, 1, 1], 2), vec![vec![3, 1], vec![2, 0]]);
        assert_eq!(assign(&[], 3), vec![Vec::<usize>::new(); 3]);
        assert_eq!(assign(&[7, 0, 0], 1), vec![vec![0, 2, 1]]);
        // more ranks than entries: the last ranks stay empty
        assert_eq!(assign(&[3, 4], 4), vec![vec![1], vec![0], vec![], vec![]]);
    }

    #[test]
    fn chunks_match_torch() {
        // torch.arange(N).chunk(n) lengths, checked against torch 2.13
        let lens = |n, k| chunk_ranges(n, k).iter().map(|r| r.len()).collect::<Vec<_>>();
        assert_eq!(lens(512, 3), vec![171, 171, 170]);
        assert_eq!(lens(768, 3), vec![256, 256, 256]);
        assert_eq!(lens(10, 4), vec![3, 3, 3, 1]);
        assert_eq!(lens(6, 4), vec![2, 2, 2]);
        assert_eq!(lens(1, 3), vec![1]);
        assert_eq!(lens(0, 3), vec![0, 0, 0]);
        for n in 1..60 {
            for k in 1..9 {
                let r = chunk_ranges(n, k);
                assert_eq!(r.first().unwrap().start, 0);
                assert_eq!(r.last().unwrap().end, n);
                assert!(r.windows(2).all(|w| w[0].end == w[1].start));
                assert!(r.len() <= k);
            }
        }
    }
}
