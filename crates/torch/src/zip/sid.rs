//! The `.data/serialization_id` record of `PyTorchStreamWriter` (`writeSerializationId`).
//!
//! The id is 40 ASCII digits: two `u64`s, each zero-padded to 20 decimal digits.
//!
//! 1. A combined hash of the record names (names *without* the archive prefix, as inserted into the
//!    writer's `std::unordered_set<std::string> files_written_`), taken in that set's iteration
//!    order: `acc = hash_combine(acc, std::hash<std::string>(name))`, starting from 0.
//! 2. A combined hash of the CRC-32s found in data descriptors, in write order:
//!    `acc = hash_combine(acc, crc)`, starting from 0. Empty records have no descriptor and do not
//!    contribute. Quirk: torch's write callback recognises a descriptor by the first four bytes of a
//!    write call, so a stored record of at least 8 bytes whose data starts with `PK\x07\x08` also
//!    contributes the `u32` at data bytes 4..8, just before its real CRC.
//!
//! `hash_combine(seed, v) = seed ^ (v + 0x9e3779b9 + (seed << 6) + (seed >> 2))` (c10, wrapping
//! 64-bit arithmetic). `std::hash<std::string>` and the set's iteration order are libstdc++'s
//! (64-bit `_Hash_bytes` with seed `0xc70f6907`; `_Hashtable` with the prime rehash policy), so the
//! first half is what torch wheels for Linux produce; builds against another C++ standard library
//! (MSVC, libc++) produce other values. torch only logs the id, it never checks it.

use std::collections::HashSet;

/// `c10::hash_combine` on 64-bit `size_t`.
pub(super) fn hash_combine(seed: u64, value: u64) -> u64 {
    seed ^ value.wrapping_add(0x9e37_79b9).wrapping_add(seed << 6).wrapping_add(seed >> 2)
}

/// libstdc++'s `std::hash<std::string>` on LP64 targets: `_Hash_bytes(data, len, 0xc70f6907)`, a
/// 64-bit Murmur-style hash (little-endian loads).
pub(super) fn std_string_hash(data: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4_a793_u64 << 32) + 0x5bd1_e995;
    const SEED: u64 = 0xc70f_6907;
    fn shift_mix(v: u64) -> u64 {
        v ^ (v >> 47)
    }
    let mut hash = SEED ^ (data.len() as u64).wrapping_mul(MUL);
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let v = shift_mix(u64::from_le_bytes(word).wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= v;
        hash = hash.wrapping_mul(MUL);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let v = tail.iter().rev().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        hash ^= v;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

/// Bucket counts a libstdc++ `unordered_set` grows through when elements are inserted one at a
/// time with the default max load factor 1.0: 13 on the first insertion, then, whenever the size
/// would exceed the bucket count `B`, the first prime of libstdc++'s prime table that is `>= 2B`.
/// (Measured from libstdc++; enough for more than `u32::MAX` elements, which miniz cannot write.)
const BUCKET_GROWTH: [u64; 29] = [
    13,
    29,
    59,
    127,
    257,
    541,
    1109,
    2357,
    5087,
    10273,
    20753,
    42043,
    85229,
    172_933,
    351_061,
    712_697,
    1_447_153,
    2_938_679,
    5_967_347,
    12_117_689,
    24_607_243,
    49_969_847,
    101_473_717,
    206_062_531,
    418_451_333,
    849_749_479,
    1_725_587_117,
    3_504_151_727,
    8_589_934_583,
];

const NIL: usize = usize::MAX;
const HEAD: usize = usize::MAX - 1;

/// Simulation of libstdc++'s `_Hashtable` node list for unique keys: only the order of the
/// singly linked node list matters (that is the iteration order).
struct StdUnorderedSet {
    hashes: Vec<u64>,
    next: Vec<usize>,
    /// `_M_before_begin._M_nxt`.
    head: usize,
    /// Per bucket: the node *before* the bucket's first node (`HEAD` for the sentinel), or `NIL`.
    buckets: Vec<usize>,
    /// Index into `BUCKET_GROWTH` of the current bucket count; `None` = initial single bucket.
    growth: Option<usize>,
}

impl StdUnorderedSet {
    fn new() -> Self {
        StdUnorderedSet { hashes: Vec::new(), next: Vec::new(), head: NIL, buckets: vec![NIL], growth: None }
    }

    fn bucket_count(&self) -> u64 {
        self.buckets.len() as u64
    }

    fn next_of(&self, node: usize) -> usize {
        if node == HEAD { self.head } else { self.next.get(node).copied().unwrap_or(NIL) }
    }

    fn set_next(&mut self, node: usize, to: usize) {
        if node == HEAD {
            self.head = to;
        } else if let Some(slot) = self.next.get_mut(node) {
            *slot = to;
        }
    }

    fn bucket_of(&self, node: usize, count: u64) -> usize {
        let h = self.hashes.get(node).copied().unwrap_or(0);
        // h % count < count <= buckets.len(), which fits usize.
        usize::try_from(h % count.max(1)).unwrap_or(0)
    }

    /// `_M_rehash_aux(n, true_type)`.
    fn rehash(&mut self, count: u64) {
        let Ok(n) = usize::try_from(count) else {
            return;
        };
        let mut new_buckets = vec![NIL; n];
        let mut p = self.head;
        self.head = NIL;
        let mut bbegin_bkt = 0usize;
        while p != NIL {
            let following = self.next_of(p);
            let bkt = self.bucket_of(p, count);
            let before = new_buckets.get(bkt).copied().unwrap_or(NIL);
            if before == NIL {
                self.set_next(p, self.head);
                self.head = p;
                if let Some(b) = new_buckets.get_mut(bkt) {
                    *b = HEAD;
                }
                if self.next_of(p) != NIL {
                    if let Some(b) = new_buckets.get_mut(bbegin_bkt) {
                        *b = p;
                    }
                }
                bbegin_bkt = bkt;
            } else {
                self.set_next(p, self.next_of(before));
                self.set_next(before, p);
            }
            p = following;
        }
        self.buckets = new_buckets;
    }

    /// `_M_insert_unique_node`: grow if needed, then `_M_insert_bucket_begin`.
    fn insert_new(&mut self, hash: u64) {
        let node = self.hashes.len();
        self.hashes.push(hash);
        self.next.push(NIL);
        let size_after = node as u64 + 1;
        if size_after > self.bucket_count() || self.growth.is_none() {
            let idx = self.growth.map_or(0, |i| i.saturating_add(1));
            if let Some(&count) = BUCKET_GROWTH.get(idx) {
                self.growth = Some(idx);
                self.rehash(count);
            }
        }
        let count = self.bucket_count();
        let bkt = self.bucket_of(node, count);
        let before = self.buckets.get(bkt).copied().unwrap_or(NIL);
        if before != NIL {
            self.set_next(node, self.next_of(before));
            self.set_next(before, node);
        } else {
            self.set_next(node, self.head);
            self.head = node;
            let following = self.next_of(node);
            if following != NIL {
                let fb = self.bucket_of(following, count);
                if let Some(b) = self.buckets.get_mut(fb) {
                    *b = node;
                }
            }
            if let Some(b) = self.buckets.get_mut(bkt) {
                *b = HEAD;
            }
        }
    }

    /// Node indices (= insertion indices) in iteration order.
    fn iter_order(&self) -> impl Iterator<Item = usize> + '_ {
        let mut p = self.head;
        std::iter::from_fn(move || {
            if p == NIL || p == HEAD {
                return None;
            }
            let cur = p;
            p = self.next_of(cur);
            Some(cur)
        })
    }
}

/// Combined name hash: names inserted into a libstdc++ `unordered_set` in the given order
/// (duplicates ignored, as the set does), hashes combined in the set's iteration order.
pub(super) fn combined_name_hash<'a>(names: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut seen: HashSet<&str> = HashSet::new();
    let mut set = StdUnorderedSet::new();
    for name in names {
        if seen.insert(name) {
            set.insert_new(std_string_hash(name.as_bytes()));
        }
    }
    set.iter_order().map(|i| set.hashes.get(i).copied().unwrap_or(0)).fold(0, hash_combine)
}

/// The `.data/serialization_id` torch would write (see the module documentation for the rules).
///
/// - `names`: names *without* the archive prefix of all records written so far, in write order
///   (not including `.data/serialization_id` itself).
/// - `descriptor_crcs`: the CRC-32 of every non-empty record in write order, as written to its data
///   descriptor (0 everywhere when CRCs are disabled), plus the `PK\x07\x08` quirk values.
///
/// [`ZipWriter::serialization_id`](super::ZipWriter::serialization_id) tracks both for you.
pub fn serialization_id<'a>(
    names: impl IntoIterator<Item = &'a str>,
    descriptor_crcs: impl IntoIterator<Item = u32>,
) -> String {
    let crc_hash = descriptor_crcs.into_iter().fold(0, |acc, crc| hash_combine(acc, u64::from(crc)));
    format!("{:020}{:020}", combined_name_hash(names), crc_hash)
}
