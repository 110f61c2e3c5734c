//! Names, as RecIS's `csrc/serialize/name.cc` and `csrc/embedding/slice_info.cc` build them: slice strings,
//! internal tensor and block names, part names, dense keys, data-file names, and the id partition
//! (`gen_slice`, `(u64)id % slice_size`).

use std::fmt;

use crate::error::{Error, NameRule, Result, SliceRule};

/// The default `slice_size` of every RecIS table (`kSliceSize`, `gen_slice`'s default).
pub const DEFAULT_SLICE_SIZE: u32 = 65536;

/// The slot name of a table's id block (`HTIdSlotName`).
pub const ID_SLOT: &str = "id";

/// The name of every table's first slot (`SlotGroup::EmbSlotName`).
pub const EMBEDDING_SLOT: &str = "embedding";

/// The slice string of dense blocks (`EmptySliceInfo`): one space.
pub const DENSE_SLICE: &str = " ";

/// The range of ids one shard of a table holds: ids `x` with `begin <= partition(x) < end`, where
/// `partition(x)` is `(x as u64) % size` (see [`IdPartition`]).
///
/// Written as RecIS's slice string `begin@end@size`, with `begin` and `end` left-padded with `0` to the
/// decimal width of `size`:
///
/// ```
/// use ckpt_recis::name::SliceInfo;
/// let s = SliceInfo::new(0, 32768, 65536).unwrap();
/// assert_eq!(s.to_string(), "00000@32768@65536");
/// assert_eq!("32768@65536@65536".parse::<SliceInfo>().unwrap(), SliceInfo::new(32768, 65536, 65536).unwrap());
/// assert!("1@2".parse::<SliceInfo>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceInfo {
    begin: u32,
    end: u32,
    size: u32,
}

impl SliceInfo {
    /// A slice `[begin, end)` of `0..size`.
    ///
    /// # Errors
    /// [`Error::BadSlice`] unless `begin <= end <= size` and `0 < size <= i32::MAX` (RecIS parses slice
    /// strings with `std::stoi`).
    pub fn new(begin: u32, end: u32, size: u32) -> Result<Self> {
        let bad = |rule: SliceRule| Error::BadSlice { slice: format!("{begin}@{end}@{size}"), rule };
        if size == 0 {
            return Err(bad(SliceRule::SizeZero));
        }
        if i32::try_from(size).is_err() {
            return Err(bad(SliceRule::SizeTooLarge));
        }
        if begin > end || end > size {
            return Err(bad(SliceRule::Order));
        }
        Ok(SliceInfo { begin, end, size })
    }

    /// The whole key space `[0, size)`: what a single-shard table holds.
    ///
    /// # Errors
    /// As [`SliceInfo::new`].
    pub fn full(size: u32) -> Result<Self> {
        Self::new(0, size, size)
    }

    /// First partition value held.
    pub fn begin(&self) -> u32 {
        self.begin
    }

    /// One past the last partition value held.
    pub fn end(&self) -> u32 {
        self.end
    }

    /// The size of the key space (`slice_size`).
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Whether `id` belongs to this slice under `partition`.
    pub fn holds(&self, id: i64, partition: IdPartition) -> bool {
        let p = partition.of(id, self.size);
        p >= u64::from(self.begin) && p < u64::from(self.end)
    }

    /// Whether the ranges `[begin, end)` of two slices intersect (RecIS's test for reading a block).
    pub fn intersects(&self, other: &SliceInfo) -> bool {
        self.begin.max(other.begin) < self.end.min(other.end)
    }
}

impl fmt::Display for SliceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.size.to_string().len();
        write!(f, "{:0w$}@{:0w$}@{}", self.begin, self.end, self.size)
    }
}

impl std::str::FromStr for SliceInfo {
    type Err = Error;

    /// Parses `begin@end@size` (decimal digits only; padding optional).
    fn from_str(s: &str) -> Result<Self> {
        let bad = |rule: SliceRule| Error::BadSlice { slice: s.to_owned(), rule };
        let parts: Vec<&str> = s.split('@').collect();
        let [b, e, z] = parts.as_slice() else {
            return Err(bad(SliceRule::NotThreeNumbers));
        };
        let num = |t: &str| -> Result<u32> {
            if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad(SliceRule::NotDecimal { token: t.to_owned() }));
            }
            let v: u64 = t.parse().map_err(|_| bad(SliceRule::TooLarge { token: t.to_owned() }))?;
            u32::try_from(v)
                .ok()
                .filter(|v| i32::try_from(*v).is_ok())
                .ok_or_else(|| bad(SliceRule::NotInt32 { token: t.to_owned() }))
        };
        SliceInfo::new(num(b)?, num(e)?, num(z)?).map_err(|_| bad(SliceRule::Bounds))
    }
}

/// How an id is mapped into `0..slice_size` to decide which shard holds it.
///
/// RecIS has two rules that agree on non-negative ids and differ on negative ones:
///
/// * [`IdPartition::Unsigned`] (the default): `(id as u64) % slice_size`. RecIS's **loader** uses it
///   (`MarkIdAcceptable`) and so does the GPU training partition (`x & 0xFFFF`). `-1` maps to `65535`.
/// * [`IdPartition::AbsFmod`]: `abs(fmod(id, slice_size))`, the **CPU** training partition
///   (`ids_partition_cpu`). `-1` maps to `1`.
///
/// A table trained on CPU with negative ids holds them in the shard chosen by `AbsFmod`; reading it back
/// with RecIS's loader (or with `Unsigned`) moves them to another shard, where a CPU trainer never looks
/// them up. Reshard with `AbsFmod` to keep such a table consistent with a CPU trainer.
///
/// ```
/// use ckpt_recis::name::IdPartition;
/// assert_eq!(IdPartition::Unsigned.of(-1, 65536), 65535);
/// assert_eq!(IdPartition::AbsFmod.of(-1, 65536), 1);
/// assert_eq!(IdPartition::Unsigned.of(100_000, 65536), 34464);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum IdPartition {
    /// `(id as u64) % slice_size`: RecIS's loader and GPU partition.
    #[default]
    Unsigned,
    /// `abs(fmod(id, slice_size))`: RecIS's CPU partition.
    AbsFmod,
}

impl IdPartition {
    /// The partition value of `id` in `0..size` (`size` > 0; 0 gives 0).
    pub fn of(self, id: i64, size: u32) -> u64 {
        if size == 0 {
            return 0;
        }
        match self {
            // Two's complement reinterpretation, as the C++ `(uint64_t)x`.
            IdPartition::Unsigned => (id as u64) % u64::from(size),
            // Truncated remainder (sign of the dividend) then its magnitude; `i64::MIN % size` is exact.
            IdPartition::AbsFmod => (id % i64::from(size)).unsigned_abs(),
        }
    }
}

/// The slice shard `index` of `num` holds, as RecIS's `gen_slice`: the key space `0..slice_size` is cut
/// into `num` consecutive ranges of `slice_size / num`, the first `slice_size % num` one larger.
///
/// ```
/// use ckpt_recis::name::gen_slice;
/// let s: Vec<String> = (0..3).map(|r| gen_slice(r, 3, 65536).unwrap().to_string()).collect();
/// assert_eq!(s, ["00000@21846@65536", "21846@43691@65536", "43691@65536@65536"]);
/// ```
///
/// # Errors
/// [`Error::BadShard`] if `num` is 0 or `index >= num`; [`Error::BadSlice`] for a bad `slice_size`.
pub fn gen_slice(index: usize, num: usize, slice_size: u32) -> Result<SliceInfo> {
    if num == 0 || index >= num {
        return Err(Error::BadShard { index, num });
    }
    let size = u64::from(slice_size);
    let n = num as u64;
    let i = index as u64;
    let (base, rem) = (size / n, size % n);
    let begin = i * base + i.min(rem);
    let end = begin + base + u64::from(i < rem);
    let to_u32 = |bound: u64| u32::try_from(bound).map_err(|_| Error::SliceBoundTooLarge { bound });
    SliceInfo::new(to_u32(begin)?, to_u32(end)?, slice_size)
}

/// One shard of a multi-shard save: `index` of `num`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    index: usize,
    num: usize,
}

impl Shard {
    /// Shard `index` of `num`.
    ///
    /// # Errors
    /// [`Error::BadShard`] unless `index < num`.
    pub fn new(index: usize, num: usize) -> Result<Self> {
        if index >= num {
            return Err(Error::BadShard { index, num });
        }
        Ok(Shard { index, num })
    }

    /// The only shard of a single-process save.
    pub fn single() -> Self {
        Shard { index: 0, num: 1 }
    }

    /// This shard's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The number of shards.
    pub fn num(&self) -> usize {
        self.num
    }
}

/// The slice part of an internal block name: a table slice, or `" "` for a dense tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockSlice {
    /// A dense tensor (slice string `" "`).
    Dense,
    /// A slice of a hash table.
    Table(SliceInfo),
}

impl fmt::Display for BlockSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockSlice::Dense => f.write_str(DENSE_SLICE),
            BlockSlice::Table(s) => s.fmt(f),
        }
    }
}

/// The internal tensor name of a table slot: `child@slot` (`HTSlotNameEncode`).
pub fn slot_tensor_name(child: &str, slot: &str) -> String {
    format!("{child}@{slot}")
}

/// Splits an internal sparse tensor name `child@slot` on its **last** `@` (slot names contain none).
///
/// # Errors
/// [`Error::BadName`] if there is no `@` or either side is empty.
pub fn split_tensor_name(name: &str) -> Result<(&str, &str)> {
    match name.rsplit_once('@') {
        Some((child, slot)) if !child.is_empty() && !slot.is_empty() => Ok((child, slot)),
        _ => Err(Error::BadName { name: name.to_owned(), rule: NameRule::NotChildAtSlot }),
    }
}

/// The internal block name `tensor^slice` (`BlockNameEncode`): `tbl@embedding^00000@32768@65536`, `w^ `.
pub fn block_name(tensor: &str, slice: &BlockSlice) -> String {
    format!("{tensor}^{slice}")
}

/// Splits an internal block name into tensor name and slice, as `TensorNameFromBlockName` /
/// `SliceInfoFromBlockName` (split on `^`, empty tokens skipped, exactly two tokens) followed by
/// `SliceInfo::FromString`. `key` is the on-disk key, for the error message.
///
/// # Errors
/// [`Error::BlockNameWithoutCaret`] unless there are exactly two tokens; [`Error::BadSlice`] for a slice
/// string that does not parse.
pub fn parse_block_name<'a>(key: &str, name: &'a str) -> Result<(&'a str, BlockSlice)> {
    let tokens: Vec<&str> = name.split('^').filter(|t| !t.is_empty()).collect();
    let [tensor, slice] = tokens.as_slice() else {
        return Err(Error::BlockNameWithoutCaret { key: key.to_owned(), name: name.to_owned() });
    };
    if *slice == DENSE_SLICE {
        return Ok((tensor, BlockSlice::Dense));
    }
    Ok((tensor, BlockSlice::Table(slice.parse()?)))
}

/// The on-disk key of a table block: the internal tensor name with its **first** `@` replaced by `.`,
/// then `/part_<shard>_<shards>` (`SaveBundle::AddBlock`): `tbl@embedding` → `tbl.embedding/part_0_2`.
pub fn part_name(tensor: &str, shard: Shard) -> String {
    let replaced = tensor.replacen('@', ".", 1);
    format!("{replaced}/part_{}_{}", shard.index, shard.num)
}

/// The shard `(index, num)` a part name was written by, from its `/part_<i>_<n>` suffix.
pub fn part_shard(key: &str) -> Option<(usize, usize)> {
    let (_, suffix) = key.rsplit_once("/part_")?;
    let (i, n) = suffix.split_once('_')?;
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit());
    if !digits(i) || !digits(n) {
        return None;
    }
    Some((i.parse().ok()?, n.parse().ok()?))
}

/// The on-disk key of a dense block: `name^ ` (name, caret, space).
pub fn dense_key(name: &str) -> String {
    format!("{name}^{DENSE_SLICE}")
}

/// A data file's name, `model-%06d-of-%06d.safetensors` (`DataFileName`).
pub fn data_file_name(number: usize, total: usize) -> String {
    format!("model-{number:06}-of-{total:06}.safetensors")
}

/// The `(number, total)` of a data-file name written by [`data_file_name`].
pub fn parse_data_file_name(name: &str) -> Option<(usize, usize)> {
    let body = name.strip_prefix("model-")?.strip_suffix(".safetensors")?;
    let (a, b) = body.split_once("-of-")?;
    let digits = |t: &str| t.len() >= 6 && t.bytes().all(|c| c.is_ascii_digit());
    if !digits(a) || !digits(b) {
        return None;
    }
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Checks a name the writer is given: non-empty, no `^` (it separates tensor and slice in block names).
pub(crate) fn check_name(name: &str, what: &'static str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::BadName { name: name.into(), rule: NameRule::Empty { what } });
    }
    if name.contains('^') {
        return Err(Error::BadName { name: name.into(), rule: NameRule::Caret { what } });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn slice_strings() {
        assert_eq!(SliceInfo::new(0, 32768, 65536).unwrap().to_string(), "00000@32768@65536");
        assert_eq!(SliceInfo::new(7, 9, 10).unwrap().to_string(), "07@09@10");
        assert_eq!(SliceInfo::new(0, 5, 5).unwrap().to_string(), "0@5@5");
        let s: SliceInfo = "00000@65536@65536".parse().unwrap();
        assert_eq!((s.begin(), s.end(), s.size()), (0, 65536, 65536));
        for bad in
            ["", "1@2", "1@2@3@4", "a@1@2", "-1@2@3", "3@2@5", "0@6@5", "0@0@0", "0@1@9999999999", "@1@2", " 1@2@3"]
        {
            assert!(matches!(bad.parse::<SliceInfo>(), Err(Error::BadSlice { .. })), "{bad:?}");
        }
        assert!(SliceInfo::new(0, 1, u32::MAX).is_err());
    }

    #[test]
    fn gen_slice_matches_recis() {
        for n in 1..=7usize {
            let mut prev = 0;
            for r in 0..n {
                let s = gen_slice(r, n, 65536).unwrap();
                assert_eq!(s.begin(), prev);
                prev = s.end();
            }
            assert_eq!(prev, 65536);
        }
        assert_eq!(gen_slice(1, 2, 65536).unwrap().to_string(), "32768@65536@65536");
        assert!(gen_slice(2, 2, 65536).is_err());
        assert!(gen_slice(0, 0, 65536).is_err());
        // More shards than keys: some get empty ranges, as in RecIS.
        assert_eq!(gen_slice(3, 4, 3).unwrap().to_string(), "3@3@3");
    }

    #[test]
    fn partitions() {
        for id in [0i64, 1, 5, 65535, 65536, 100_000, i64::MAX] {
            assert_eq!(IdPartition::Unsigned.of(id, 65536), IdPartition::AbsFmod.of(id, 65536));
        }
        assert_eq!(IdPartition::Unsigned.of(-1, 65536), 65535);
        assert_eq!(IdPartition::AbsFmod.of(-1, 65536), 1);
        assert_eq!(IdPartition::Unsigned.of(i64::MIN, 65536), 0);
        assert_eq!(IdPartition::AbsFmod.of(i64::MIN, 65536), 0);
        assert_eq!(IdPartition::Unsigned.of(-65537, 65536), 65535);
        assert_eq!(IdPartition::AbsFmod.of(-65537, 65536), 1);
        assert_eq!(IdPartition::Unsigned.of(-3, 10), (u64::MAX - 2) % 10);
        let s = SliceInfo::new(32768, 65536, 65536).unwrap();
        assert!(s.holds(-1, IdPartition::Unsigned));
        assert!(!s.holds(-1, IdPartition::AbsFmod));
    }

    #[test]
    fn block_and_part_names() {
        let (t, s) = parse_block_name("k", "tbl@embedding^00000@32768@65536").unwrap();
        assert_eq!(t, "tbl@embedding");
        assert_eq!(s, BlockSlice::Table(SliceInfo::new(0, 32768, 65536).unwrap()));
        assert_eq!(parse_block_name("w^ ", "w^ ").unwrap(), ("w", BlockSlice::Dense));
        assert!(matches!(parse_block_name("k", "tbl@id"), Err(Error::BlockNameWithoutCaret { .. })));
        assert!(matches!(parse_block_name("k", "a^b^c"), Err(Error::BlockNameWithoutCaret { .. })));
        assert!(matches!(parse_block_name("k", "tbl@id^1@2"), Err(Error::BadSlice { .. })));
        assert_eq!(block_name("w", &BlockSlice::Dense), "w^ ");
        let sh = Shard::new(1, 2).unwrap();
        assert_eq!(part_name("tbl@sparse_adamw_exp_avg", sh), "tbl.sparse_adamw_exp_avg/part_1_2");
        assert_eq!(part_name("a@b@c", sh), "a.b@c/part_1_2");
        assert_eq!(part_shard("tbl.id/part_1_2"), Some((1, 2)));
        assert_eq!(part_shard("w^ "), None);
        assert_eq!(split_tensor_name("a.b@c@id").unwrap(), ("a.b@c", "id"));
        assert!(split_tensor_name("nocaret").is_err());
        assert_eq!(data_file_name(3, 4), "model-000003-of-000004.safetensors");
        assert_eq!(parse_data_file_name("model-000003-of-000004.safetensors"), Some((3, 4)));
        assert_eq!(parse_data_file_name("model-3-of-4.safetensors"), None);
        assert_eq!(dense_key("w"), "w^ ");
        assert!(Shard::new(2, 2).is_err());
    }
}
