//! The memo as the machine keeps it: a scan for the keys that some GET reads, so that only those objects are
//! kept for later (everything else stays owned by whoever consumes it), and the count of keys written.

use std::collections::{HashMap, HashSet};

use crate::bigint::IntRepr;
use crate::opcode as op;
use crate::text;

/// A set of memo keys: a bitmap for the small keys CPython writes, a (randomly seeded) hash set for sparse
/// huge ones.
#[derive(Default)]
pub(crate) struct KeySet {
    bits: Vec<u64>,
    sparse: HashSet<u64>,
    pub(crate) len: usize,
}

impl KeySet {
    /// Keys up to this bound live in the bitmap as it grows; it grows with the number of keys (a LONG_BINPUT
    /// of 0xffffffff must not allocate 512 MiB).
    fn dense_bound(&self) -> u64 {
        (self.len as u64).saturating_mul(4).saturating_add(4096)
    }

    #[inline]
    fn contains(&self, key: u64) -> bool {
        let word = usize::try_from(key / 64).ok().and_then(|w| self.bits.get(w));
        match word {
            Some(w) if w & (1u64 << (key % 64)) != 0 => true,
            _ => !self.sparse.is_empty() && self.sparse.contains(&key),
        }
    }

    /// Inserts `key`; whether it was new.
    fn insert(&mut self, key: u64) -> bool {
        self.insert_with_limit(key, self.dense_bound())
    }

    fn insert_with_limit(&mut self, key: u64, dense_limit: u64) -> bool {
        let word = usize::try_from(key / 64).unwrap_or(usize::MAX);
        let bit = 1u64 << (key % 64);
        if let Some(w) = self.bits.get_mut(word) {
            if *w & bit != 0 {
                return false;
            }
            *w |= bit;
        } else if key <= dense_limit {
            self.bits.resize(word + 1, 0);
            if let Some(w) = self.bits.get_mut(word) {
                *w |= bit;
            }
        } else if !self.sparse.insert(key) {
            return false;
        }
        self.len += 1;
        true
    }
}

/// The memo keys PUT so far. CPython writes keys 0, 1, 2, ... in order (MEMOIZE always does), which needs no
/// set; anything else switches to a [`KeySet`].
#[derive(Default)]
pub(crate) struct Written {
    /// Keys `0..prefix` are written (and, while `set` is `None`, no others).
    prefix: u64,
    set: Option<KeySet>,
}

impl Written {
    /// Whether `key` was written.
    pub(crate) fn contains(&self, key: u64) -> bool {
        match &self.set {
            Some(set) => set.contains(key),
            None => key < self.prefix,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match &self.set {
            Some(set) => set.len,
            None => usize::try_from(self.prefix).unwrap_or(usize::MAX),
        }
    }

    /// Inserts `key`; whether it was new.
    #[inline]
    pub(crate) fn insert(&mut self, key: u64) -> bool {
        if let Some(set) = &mut self.set {
            return set.insert(key);
        }
        if key < self.prefix {
            return false;
        }
        if key == self.prefix {
            self.prefix += 1;
            return true;
        }
        let mut set = KeySet::default();
        let full_words = usize::try_from(self.prefix / 64).unwrap_or(0);
        set.bits = vec![u64::MAX; full_words];
        set.len = full_words * 64;
        for k in (full_words as u64 * 64)..self.prefix {
            set.insert(k);
        }
        let new = set.insert(key);
        self.set = Some(set);
        new
    }
}

/// The memo keys that GET, BINGET and LONG_BINGET read before the first STOP. The scan reads the opcode stream
/// without interpreting it (it is context free, like `pickletools.genops`) and stops quietly at anything it
/// cannot step over: the machine reaches that place too, and reports it there.
pub(crate) fn memo_reads(data: &[u8]) -> KeySet {
    let mut keys = KeySet::default();
    let len = data.len();
    // Memo keys are at most one per opcode in what CPython writes; a bitmap up to 8 keys per input byte costs
    // at most the input's size.
    let limit = (len as u64).saturating_mul(8).saturating_add(4096);
    let mut pos = 0usize;
    let line_end = |pos: usize| -> Option<usize> {
        let rest = data.get(pos..)?;
        rest.iter().position(|&b| b == b'\n').map(|i| pos + i + 1)
    };
    let step = |pos: &mut usize, keys: &mut KeySet| -> Option<bool> {
        let &code = data.get(*pos)?;
        *pos += 1;
        match op::argument(code) {
            op::Argument::Fixed(n) => *pos += usize::from(n),
            op::Argument::Get(n) => {
                let n = usize::from(n);
                keys.insert_with_limit(op::le_at(data, *pos, n)?, limit);
                *pos += n;
            }
            op::Argument::Counted(n) => {
                let n = usize::from(n);
                let count = usize::try_from(op::le_at(data, *pos, n)?).ok()?;
                *pos = pos.checked_add(n)?.checked_add(count)?;
            }
            op::Argument::SignedCounted => {
                let count = op::le_at(data, *pos, 4)?;
                if count > i32::MAX as u64 {
                    return None;
                }
                *pos = pos.checked_add(4 + count as usize)?;
            }
            op::Argument::Lines(n) => {
                *pos = line_end(*pos)?;
                if n == 2 {
                    *pos = line_end(*pos)?;
                }
            }
            op::Argument::GetLine => {
                let end = line_end(*pos)?;
                let line = data.get(*pos..end - 1)?;
                if let Ok(IntRepr::Small(v)) = text::parse_py_int(line, 10, 40) {
                    if let Ok(key) = u64::try_from(v) {
                        keys.insert_with_limit(key, limit);
                    }
                }
                *pos = end;
            }
            op::Argument::Stop | op::Argument::Invalid => return Some(false),
        }
        (*pos <= len).then_some(true)
    };
    while let Some(true) = step(&mut pos, &mut keys) {}
    keys
}

/// The memo keys some GET reads, each with the shared-table id it holds (once PUT).
pub(crate) struct MemoIds {
    reads: KeySet,
    /// Number of read keys in the bitmap before each bitmap word (rank of the word's first bit).
    ranks: Vec<u32>,
    /// Shared-table id per read key of the bitmap, by rank.
    dense: Vec<u32>,
    /// Shared-table id per read key outside the bitmap.
    sparse: HashMap<u64, u32>,
}

/// No shared object.
pub(crate) const NO_ID: u32 = u32::MAX;

impl MemoIds {
    pub(crate) fn new(reads: KeySet) -> Self {
        let mut ranks = Vec::with_capacity(reads.bits.len());
        let mut total = 0u32;
        for w in &reads.bits {
            ranks.push(total);
            total = total.saturating_add(w.count_ones());
        }
        MemoIds { dense: vec![NO_ID; total as usize], ranks, reads, sparse: HashMap::new() }
    }

    /// Whether some GET reads `key`.
    #[inline]
    pub(crate) fn is_read(&self, key: u64) -> bool {
        self.reads.contains(key)
    }

    /// The slot of a read key in the bitmap.
    #[inline]
    fn dense_slot(&self, key: u64) -> Option<usize> {
        let word = usize::try_from(key / 64).ok()?;
        let bits = *self.reads.bits.get(word)?;
        let bit = 1u64 << (key % 64);
        if bits & bit == 0 {
            return None;
        }
        let rank = *self.ranks.get(word)? as usize + (bits & (bit - 1)).count_ones() as usize;
        Some(rank)
    }

    /// The shared object memoized under `key`, if the key is read and was written.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        let id = match self.dense_slot(key) {
            Some(slot) => self.dense.get(slot).copied().unwrap_or(NO_ID),
            None => self.sparse.get(&key).copied().unwrap_or(NO_ID),
        };
        (id != NO_ID).then_some(id)
    }

    pub(crate) fn set(&mut self, key: u64, id: u32) {
        match self.dense_slot(key) {
            Some(slot) => {
                if let Some(s) = self.dense.get_mut(slot) {
                    *s = id;
                }
            }
            None => {
                self.sparse.insert(key, id);
            }
        }
    }
}
