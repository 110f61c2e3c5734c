//! Hash tables as RecIS stores them (`csrc/serialize/write_block.cc`): per child table, an id block and one
//! block per slot (embedding first, then optimizer and filter slots), row k of every slot belonging to id k.
//!
//! A [`TableChild`] is that pair of ids and slot rows, with O(1) look-up of a row by id once its id index is
//! built (lazily, on the first look-up). A [`HashTable`] is what one RecIS `HashtableImpl` saves: one child,
//! or several for a coalesced table, sharing one [`SliceInfo`].

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, OnceLock};

use ckpt_tensor::{Buffer, DType, Tensor};
use zerocopy::IntoBytes;

use crate::error::{Error, NameRule, Result, SlotRule};
use crate::name::{ID_SLOT, SliceInfo, check_name};

/// Bits of a coalesced id that hold the user id (`ChildrenInfo::IdBitsNum`).
pub const ID_BITS: u32 = 52;

/// Mask of the user-id bits of a coalesced id (`ChildrenInfo::IdMask`).
pub const ID_MASK: i64 = (1i64 << ID_BITS) - 1;

/// Most children a coalesced table may have (`ChildrenInfo::Validate`: fewer than `2^12 - 1`).
pub const MAX_CHILDREN: usize = (1 << (64 - ID_BITS)) - 2;

/// Encodes `id` for child `index` of a coalesced table: its low 52 bits, with the child index in the top 12
/// (`ChildrenInfo::EncodeId`). The id's own top 12 bits are lost, as in RecIS.
///
/// ```
/// use ckpt_recis::table::{decode_id, encode_id};
/// let e = encode_id(9, 1);
/// assert_eq!(e, (1 << 52) + 9);
/// assert_eq!(decode_id(e), (1, 9));
/// ```
pub fn encode_id(id: i64, index: usize) -> i64 {
    (id & ID_MASK) | ((index as i64) << ID_BITS)
}

/// Splits a coalesced id into `(child index, id)`. The index is the top 12 bits read as **unsigned**
/// (RecIS shifts a signed int64, so an index ≥ 2048 comes out negative there: a latent bug).
pub fn decode_id(encoded: i64) -> (usize, i64) {
    (((encoded as u64) >> ID_BITS) as usize, encoded & ID_MASK)
}

/// One slot of a table child: `[n, …row shape]` rows, row k belonging to the child's id k.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    name: String,
    tensor: Tensor,
}

impl Slot {
    /// A slot called `name` holding `tensor`'s rows (dimension 0). The tensor is kept row-major (a copy is
    /// made only when it is a non-contiguous view).
    ///
    /// # Errors
    /// [`Error::BadName`] for an empty name, a name containing `@` or `^`, or the reserved name `id`;
    /// [`Error::ScalarSlot`] for a 0-dim tensor.
    pub fn new(name: impl Into<String>, tensor: Tensor) -> Result<Self> {
        let name = name.into();
        check_slot_name(&name)?;
        if tensor.dim() == 0 {
            return Err(Error::ScalarSlot { slot: name });
        }
        Ok(Slot { name, tensor: tensor.to_contiguous()? })
    }

    /// The slot's name (`embedding`, `sparse_adamw_exp_avg`, `step_filter`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All rows, `[n, …]`, row-major.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.tensor.shape().first().copied().unwrap_or(0)
    }

    /// The shape of one row (`[3]` for a 3-wide embedding, `[1]` for a filter step).
    pub fn row_shape(&self) -> &[usize] {
        self.tensor.shape().get(1..).unwrap_or_default()
    }

    /// Bytes of one row.
    pub fn row_len(&self) -> usize {
        self.row_shape().iter().product::<usize>() * self.dtype().size()
    }

    /// The bytes of row `k`, or `None` past the end.
    pub fn row_bytes(&self, k: usize) -> Option<&[u8]> {
        let len = self.row_len();
        let start = k.checked_mul(len)?;
        self.tensor.storage().as_bytes().get(start..start.checked_add(len)?)
    }

    /// Row `k` as a tensor of the row shape (a view, no copy).
    ///
    /// # Errors
    /// [`Error::RowOutOfRange`] past the end.
    pub fn row(&self, k: usize) -> Result<Tensor> {
        if k >= self.rows() {
            return Err(Error::RowOutOfRange { slot: self.name.clone(), row: k, rows: self.rows() });
        }
        let bytes = self.tensor.storage().slice_len(k * self.row_len(), self.row_len())?;
        Ok(Tensor::from_buffer(self.dtype(), self.row_shape(), bytes)?)
    }

    /// The rows at `positions`, in that order, as a new slot.
    pub(crate) fn gather(&self, positions: &Arc<[usize]>) -> Result<Slot> {
        let len = self.row_len();
        let source = self.tensor.storage().clone();
        if let Some(&p) = positions
            .iter()
            .find(|&&p| p.checked_add(1).and_then(|e| e.checked_mul(len)).is_none_or(|e| e > source.len()))
        {
            return Err(Error::RowOutOfRange { slot: self.name.clone(), row: p, rows: self.rows() });
        }
        let nbytes = positions
            .len()
            .checked_mul(len)
            .ok_or_else(|| Error::GatherOverflow { slot: self.name.clone(), rows: positions.len() })?;
        let rows = Arc::clone(positions);
        // The rows are copied when the slot's bytes are asked for (`Buffer::deferred_ranged`): a writer
        // streaming the slots of a shard makes one piece of one slot at a time, instead of every slot of
        // every table being copied first.
        let fill_at = move |offset: usize, out: &mut [u8]| -> ckpt_tensor::Result<()> {
            if out.is_empty() {
                return Ok(());
            }
            let bytes = source.bytes()?;
            let outside = |row: usize| ckpt_tensor::Error::from(Error::RowOutsideSlot { row, slot_bytes: bytes.len() });
            let (mut row, mut skip) = (offset / len.max(1), offset % len.max(1));
            let mut done = 0;
            while done < out.len() {
                let &p = rows.get(row).ok_or(Error::RowPastGather { row })?;
                let src = bytes.get(p * len + skip..(p + 1) * len).ok_or_else(|| outside(p))?;
                let n = src.len().min(out.len() - done);
                let (Some(d), Some(src)) = (out.get_mut(done..done + n), src.get(..n)) else {
                    return Err(outside(p));
                };
                d.copy_from_slice(src);
                done += n;
                row += 1;
                skip = 0;
            }
            Ok(())
        };
        let mut shape = self.tensor.shape().to_vec();
        if let Some(d) = shape.first_mut() {
            *d = positions.len();
        }
        let tensor = Tensor::from_buffer(self.dtype(), &shape, Buffer::deferred_ranged(nbytes, fill_at))?;
        Ok(Slot { name: self.name.clone(), tensor })
    }

    /// Slots with equal names, dtypes and row shapes, rows concatenated.
    pub(crate) fn concat(parts: &[&Slot]) -> Result<Slot> {
        let Some(first) = parts.first() else {
            return Err(Error::NothingToConcat { what: "slots" });
        };
        // Copied when the slot's bytes are asked for ([`Buffer::concat`]): of each part only the range asked
        // for is made (when the part is itself deferred), one part at a time.
        let es = first.dtype().size();
        let windows =
            parts.iter().map(|p| p.tensor.storage().slice_len(p.tensor.storage_offset() * es, p.tensor.nbytes()));
        let out = Buffer::concat(windows.collect::<ckpt_tensor::Result<_>>()?);
        let mut shape = first.tensor.shape().to_vec();
        if let Some(d) = shape.first_mut() {
            *d = parts.iter().map(|s| s.rows()).sum();
        }
        Ok(Slot { name: first.name.clone(), tensor: Tensor::from_buffer(first.dtype(), &shape, out)? })
    }
}

/// Hashing for id look-ups: a splitmix64 finaliser of the id mixed with a per-process random seed (fast,
/// and not predictable from file contents).
#[derive(Debug, Clone, Copy)]
struct IdHashState(u64);

impl Default for IdHashState {
    fn default() -> Self {
        static SEED: OnceLock<u64> = OnceLock::new();
        IdHashState(*SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)))
    }
}

impl BuildHasher for IdHashState {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(self.0)
    }
}

struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }
    fn write_i64(&mut self, i: i64) {
        self.0 = mix(self.0 ^ i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

type IdIndex = HashMap<i64, usize, IdHashState>;

/// Owned ids with their natural alignment, handed to a [`Buffer`] without copying.
struct IdVec(Vec<i64>);

impl AsRef<[u8]> for IdVec {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// One child table: ids and, per slot, the row of each id.
///
/// ```
/// use ckpt_tensor::Tensor;
/// use ckpt_recis::Slot;
/// use ckpt_recis::table::TableChild;
/// let emb = Tensor::from_slice(&[1.0f32, 1.5, 5.0, 5.5], &[2, 2]).unwrap();
/// let t = TableChild::new("user", vec![1, 5], vec![Slot::new("embedding", emb).unwrap()]).unwrap();
/// assert_eq!(t.position(5).unwrap(), Some(1));
/// let row = t.slot("embedding").unwrap().row(1).unwrap();
/// assert_eq!(row.to_vec::<f32>().unwrap(), vec![5.0, 5.5]);
/// ```
pub struct TableChild {
    name: String,
    ids: Tensor,
    slots: Vec<Slot>,
    index: OnceLock<std::result::Result<IdIndex, i64>>,
}

impl std::fmt::Debug for TableChild {
    /// The name, the id count and the slots (not every id).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableChild")
            .field("name", &self.name)
            .field("ids", &self.len())
            .field("slots", &self.slots.iter().map(|s| (s.name(), s.dtype(), s.row_shape())).collect::<Vec<_>>())
            .field("indexed", &self.index.get().is_some())
            .finish()
    }
}

impl Clone for TableChild {
    fn clone(&self) -> Self {
        TableChild { name: self.name.clone(), ids: self.ids.clone(), slots: self.slots.clone(), index: OnceLock::new() }
    }
}

impl PartialEq for TableChild {
    /// Same name, ids in the same order and equal slots (names, dtypes, shapes, bytes).
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.ids() == other.ids() && self.slots == other.slots
    }
}

impl TableChild {
    /// A child table called `name` with `ids` and `slots` (usually `embedding` first, then optimizer and
    /// filter slots, in the table's slot order).
    ///
    /// # Errors
    /// [`Error::BadName`] for a name that is empty or contains `^`; [`Error::RowCountMismatch`] if a slot
    /// has a row count other than `ids.len()`; [`Error::DuplicateBlock`] for two slots of one name.
    pub fn new(name: impl Into<String>, ids: Vec<i64>, slots: Vec<Slot>) -> Result<Self> {
        let n = ids.len();
        let ids = Tensor::from_buffer(DType::I64, &[n], Buffer::from_owner(IdVec(ids)))?;
        Self::with_id_tensor(name.into(), ids, slots, None)
    }

    /// Like [`TableChild::new`] with the ids as a 1-D int64 tensor (a window of a file is kept without
    /// copying when it is aligned).
    ///
    /// # Errors
    /// As [`TableChild::new`], plus [`Error::BadIds`] if `ids` is not a 1-D int64 tensor.
    pub fn from_tensors(name: impl Into<String>, ids: Tensor, slots: Vec<Slot>) -> Result<Self> {
        Self::with_id_tensor(name.into(), ids, slots, None)
    }

    pub(crate) fn with_id_tensor(name: String, ids: Tensor, slots: Vec<Slot>, slice: Option<&str>) -> Result<Self> {
        check_name(&name, "table")?;
        if ids.dtype() != DType::I64 || ids.dim() != 1 {
            return Err(Error::BadIds { table: name, dtype: ids.dtype(), shape: ids.shape().to_vec() });
        }
        // Typed access needs contiguous, 8-aligned ids; copy only when the window is not.
        let ids = if ids.as_slice::<i64>().is_ok() {
            ids
        } else {
            let v = ids.to_vec::<i64>()?;
            let n = v.len();
            Tensor::from_buffer(DType::I64, &[n], Buffer::from_owner(IdVec(v)))?
        };
        let n = ids.numel();
        let mut seen = std::collections::HashSet::new();
        for s in &slots {
            if s.rows() != n {
                return Err(Error::RowCountMismatch {
                    child: name,
                    slice: slice.unwrap_or("-").into(),
                    ids: n,
                    slot: s.name.clone(),
                    rows: s.rows(),
                });
            }
            if !seen.insert(s.name.as_str()) {
                return Err(Error::DuplicateBlock {
                    key: format!("{name}@{}", s.name),
                    detail: "slot given twice".into(),
                });
            }
        }
        Ok(TableChild { name, ids, slots, index: OnceLock::new() })
    }

    /// The child's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ids, in stored order.
    pub fn ids(&self) -> &[i64] {
        // Construction guarantees a contiguous, aligned int64 tensor.
        self.ids.as_slice::<i64>().unwrap_or_default()
    }

    /// The ids as a 1-D int64 tensor.
    pub fn id_tensor(&self) -> &Tensor {
        &self.ids
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.ids.numel()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slots, in slot order.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The slot called `name`.
    pub fn slot(&self, name: &str) -> Option<&Slot> {
        self.slots.iter().find(|s| s.name == name)
    }

    /// Builds the id → row index now (it is otherwise built on the first look-up).
    ///
    /// # Errors
    /// [`Error::DuplicateId`] if an id occurs twice.
    pub fn build_index(&self) -> Result<()> {
        self.id_index().map(|_| ())
    }

    fn id_index(&self) -> Result<&IdIndex> {
        let built = self.index.get_or_init(|| {
            let ids = self.ids();
            let mut map = IdIndex::with_capacity_and_hasher(ids.len(), IdHashState::default());
            for (k, &id) in ids.iter().enumerate() {
                if map.insert(id, k).is_some() {
                    return Err(id);
                }
            }
            Ok(map)
        });
        built.as_ref().map_err(|&id| Error::DuplicateId { child: self.name.clone(), id })
    }

    /// The row of `id`, in O(1).
    ///
    /// # Errors
    /// [`Error::DuplicateId`] if the ids are not unique.
    pub fn position(&self, id: i64) -> Result<Option<usize>> {
        Ok(self.id_index()?.get(&id).copied())
    }

    /// The bytes of `id`'s row in slot `slot`; `None` if the id or the slot is absent.
    ///
    /// # Errors
    /// [`Error::DuplicateId`] if the ids are not unique.
    pub fn row_bytes(&self, id: i64, slot: &str) -> Result<Option<&[u8]>> {
        let Some(k) = self.position(id)? else {
            return Ok(None);
        };
        Ok(self.slot(slot).and_then(|s| s.row_bytes(k)))
    }

    /// The ids (and their rows) for which `keep` holds, in stored order.
    ///
    /// # Errors
    /// Allocation failures.
    pub fn filter(&self, keep: impl Fn(i64) -> bool) -> Result<TableChild> {
        let positions: Arc<[usize]> =
            self.ids().iter().enumerate().filter(|(_, id)| keep(**id)).map(|(k, _)| k).collect();
        if positions.len() == self.len() {
            return Ok(self.clone());
        }
        let all = self.ids();
        let ids: Vec<i64> = positions.iter().filter_map(|&k| all.get(k).copied()).collect();
        let slots = self.slots.iter().map(|s| s.gather(&positions)).collect::<Result<Vec<_>>>()?;
        TableChild::new(self.name.clone(), ids, slots)
    }

    /// A copy named `name`.
    pub fn renamed(&self, name: impl Into<String>) -> Result<TableChild> {
        Self::with_id_tensor(name.into(), self.ids.clone(), self.slots.clone(), None)
    }

    /// Children with the same name and slots, rows concatenated in order (`parts` must be non-empty).
    pub(crate) fn concat(parts: &[TableChild]) -> Result<TableChild> {
        let Some(first) = parts.first() else {
            return Err(Error::NothingToConcat { what: "tables" });
        };
        if parts.len() == 1 {
            return Ok(first.clone());
        }
        let ids: Vec<i64> = parts.iter().flat_map(|p| p.ids().iter().copied()).collect();
        let mut slots = Vec::with_capacity(first.slots.len());
        for s in &first.slots {
            let mut same = Vec::with_capacity(parts.len());
            for p in parts {
                let o = p.slot(&s.name).ok_or_else(|| Error::SlotMismatch {
                    child: first.name.clone(),
                    slot: s.name.clone(),
                    rule: SlotRule::MissingInSlice,
                })?;
                check_same_slot(&first.name, s, o)?;
                same.push(o);
            }
            slots.push(Slot::concat(&same)?);
        }
        if let Some(p) = parts.iter().find(|p| p.slots.len() != first.slots.len()) {
            let extra =
                p.slots.iter().find(|s| first.slot(&s.name).is_none()).map(|s| s.name.clone()).unwrap_or_default();
            return Err(Error::SlotMismatch { child: first.name.clone(), slot: extra, rule: SlotRule::MissingInSlice });
        }
        TableChild::new(first.name.clone(), ids, slots)
    }
}

/// Checks a slot's name: a name ([`check_name`]) without `@`, other than `id` (the id block's slot).
pub(crate) fn check_slot_name(name: &str) -> Result<()> {
    check_name(name, "slot")?;
    if name.contains('@') || name == ID_SLOT {
        return Err(Error::BadName { name: name.into(), rule: NameRule::SlotReserved });
    }
    Ok(())
}

/// Checks that two slots of one name agree in dtype and row shape.
pub(crate) fn check_same_slot(child: &str, a: &Slot, b: &Slot) -> Result<()> {
    check_same_rows(child, &a.name, (a.dtype(), a.row_shape()), (b.dtype(), b.row_shape()))
}

/// Checks that two places' rows of the slot `slot` of `child`, each a dtype and a row shape, agree.
pub(crate) fn check_same_rows(child: &str, slot: &str, a: (DType, &[usize]), b: (DType, &[usize])) -> Result<()> {
    if a != b {
        return Err(Error::SlotMismatch {
            child: child.into(),
            slot: slot.into(),
            rule: SlotRule::RowsDiffer { first: (a.0, a.1.to_vec()), second: (b.0, b.1.to_vec()) },
        });
    }
    Ok(())
}

/// What one RecIS hash table saves: its slice and its children (one, or several for a coalesced table), in
/// child order.
#[derive(Debug, Clone, PartialEq)]
pub struct HashTable {
    slice: SliceInfo,
    children: Vec<TableChild>,
}

impl HashTable {
    /// A table holding `slice` of the key space, with `children` (one for an ordinary table).
    ///
    /// # Errors
    /// [`Error::ChildCount`] without children or with more than [`MAX_CHILDREN`];
    /// [`Error::DuplicateBlock`] for two children of one name.
    pub fn new(slice: SliceInfo, children: Vec<TableChild>) -> Result<Self> {
        if children.is_empty() || children.len() > MAX_CHILDREN {
            return Err(Error::ChildCount { count: children.len(), max: MAX_CHILDREN });
        }
        let mut seen = std::collections::HashSet::new();
        for c in &children {
            if !seen.insert(c.name()) {
                return Err(Error::DuplicateBlock { key: c.name().into(), detail: "child table given twice".into() });
            }
        }
        Ok(HashTable { slice, children })
    }

    /// An ordinary (non-coalesced) table with one child.
    pub fn single(slice: SliceInfo, child: TableChild) -> Self {
        HashTable { slice, children: vec![child] }
    }

    /// Splits a coalesced table's snapshot into its children, as RecIS's writer does: the child of each id
    /// is its top 12 bits, and only the low 52 bits are kept. `names[i]` is child `i`; `slots` hold one row
    /// per encoded id. Row order within a child follows `encoded_ids`.
    ///
    /// # Errors
    /// [`Error::BadChildIndex`] for an id whose child index is not below `names.len()`;
    /// [`Error::RowCountMismatch`] if a slot's row count differs from the id count.
    pub fn from_coalesced(slice: SliceInfo, names: &[&str], encoded_ids: &[i64], slots: &[Slot]) -> Result<Self> {
        if let Some(s) = slots.iter().find(|s| s.rows() != encoded_ids.len()) {
            return Err(Error::RowCountMismatch {
                child: names.join(","),
                slice: slice.to_string(),
                ids: encoded_ids.len(),
                slot: s.name.clone(),
                rows: s.rows(),
            });
        }
        let mut positions: Vec<Vec<usize>> = vec![Vec::new(); names.len()];
        let mut ids: Vec<Vec<i64>> = vec![Vec::new(); names.len()];
        for (k, &e) in encoded_ids.iter().enumerate() {
            let (index, id) = decode_id(e);
            let (Some(p), Some(i)) = (positions.get_mut(index), ids.get_mut(index)) else {
                return Err(Error::BadChildIndex { encoded: e, index, children: names.len() });
            };
            p.push(k);
            i.push(id);
        }
        let mut children = Vec::with_capacity(names.len());
        for ((name, pos), ids) in names.iter().zip(positions).zip(ids) {
            let pos: Arc<[usize]> = pos.into();
            let rows = slots.iter().map(|s| s.gather(&pos)).collect::<Result<Vec<_>>>()?;
            children.push(TableChild::new(*name, ids, rows)?);
        }
        Self::new(slice, children)
    }

    /// The slice of the key space this table holds.
    pub fn slice(&self) -> SliceInfo {
        self.slice
    }

    /// The children, in child order.
    pub fn children(&self) -> &[TableChild] {
        &self.children
    }
}

/// Joins children into one coalesced snapshot: child `i`'s ids encoded with index `i` (see [`encode_id`]),
/// rows concatenated in child order. This is how a loader fills a coalesced target from per-child tables.
///
/// # Errors
/// [`Error::ChildCount`] without children or with more than [`MAX_CHILDREN`]; [`Error::SlotMismatch`]
/// if the children's slots differ in names, dtypes or row shapes.
pub fn coalesce(children: &[TableChild]) -> Result<(Vec<i64>, Vec<Slot>)> {
    let Some(first) = children.first() else {
        return Err(Error::ChildCount { count: 0, max: MAX_CHILDREN });
    };
    if children.len() > MAX_CHILDREN {
        return Err(Error::ChildCount { count: children.len(), max: MAX_CHILDREN });
    }
    let encoded: Vec<i64> =
        children.iter().enumerate().flat_map(|(i, c)| c.ids().iter().map(move |&id| encode_id(id, i))).collect();
    let renamed = children.iter().map(|c| c.renamed(first.name())).collect::<Result<Vec<_>>>()?;
    let joined = TableChild::concat(&renamed)?;
    Ok((encoded, joined.slots))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn emb(rows: &[[f32; 2]]) -> Slot {
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        Slot::new("embedding", Tensor::from_slice(&flat, &[rows.len(), 2]).unwrap()).unwrap()
    }

    #[test]
    fn lookups_and_filters() {
        let t = TableChild::new("t", vec![5, 1, 65541], vec![emb(&[[5.0, 5.5], [1.0, 1.5], [7.0, 7.5]])]).unwrap();
        assert_eq!(t.position(65541).unwrap(), Some(2));
        assert_eq!(t.position(2).unwrap(), None);
        assert_eq!(t.row_bytes(1, "embedding").unwrap().unwrap(), [1.0f32, 1.5].as_bytes());
        assert_eq!(t.row_bytes(1, "nope").unwrap(), None);
        let f = t.filter(|id| id != 1).unwrap();
        assert_eq!(f.ids(), &[5, 65541]);
        assert_eq!(f.slot("embedding").unwrap().tensor().to_vec::<f32>().unwrap(), vec![5.0, 5.5, 7.0, 7.5]);
        assert_eq!(f.slot("embedding").unwrap().tensor().as_slice::<f32>().unwrap().len(), 4);
        let dup = TableChild::new("d", vec![1, 1], vec![emb(&[[0.0, 0.0], [1.0, 1.0]])]).unwrap();
        assert!(matches!(dup.position(1), Err(Error::DuplicateId { id: 1, .. })));
    }

    /// Gathered and concatenated slots make any byte range on its own (`Buffer::deferred_ranged`): every
    /// range, row-aligned or not, and every streamed piece size equal the same bytes of the whole.
    #[test]
    fn gathers_and_concats_make_any_range() {
        let rows: Vec<[f32; 2]> = (0..9).map(|r| [r as f32, r as f32 + 0.5]).collect();
        let slot = emb(&rows);
        let picked: Arc<[usize]> = Arc::from(vec![8, 0, 3, 3, 5]);
        let gathered = slot.gather(&picked).unwrap();
        let tail = slot.gather(&Arc::from(vec![1, 2])).unwrap();
        let joined = Slot::concat(&[&gathered, &tail]).unwrap();
        let want: Vec<f32> = [8, 0, 3, 3, 5, 1, 2].iter().flat_map(|&r| rows[r]).collect();
        let want = want.as_bytes();
        for (made, whole) in [(&gathered, &want[..40]), (&joined, want)] {
            let storage = made.tensor().storage();
            assert!(storage.is_deferred());
            for start in 0..whole.len() {
                for end in start..=whole.len() {
                    assert_eq!(&*storage.slice(start..end).unwrap().bytes().unwrap(), &whole[start..end]);
                }
            }
            for piece in [1, 3, 8, 13, 64] {
                let mut streamed = Vec::new();
                made.tensor()
                    .data_pieces(piece, |p| {
                        assert!(p.len() <= piece);
                        streamed.extend_from_slice(p);
                        Ok::<(), ckpt_tensor::Error>(())
                    })
                    .unwrap();
                assert_eq!(streamed, whole, "piece {piece}");
            }
            assert!(storage.is_deferred(), "streaming keeps nothing");
        }
        assert!(slot.gather(&Arc::from(vec![9])).is_err(), "a row past the slot");
    }

    #[test]
    fn rejects_bad_tables() {
        assert!(matches!(
            TableChild::new("t", vec![1, 2, 3], vec![emb(&[[0.0, 0.0]])]),
            Err(Error::RowCountMismatch { ids: 3, rows: 1, .. })
        ));
        assert!(matches!(TableChild::new("a^b", vec![], vec![]), Err(Error::BadName { .. })));
        assert!(matches!(Slot::new("id", Tensor::zeros(DType::F32, &[1]).unwrap()), Err(Error::BadName { .. })));
        assert!(matches!(Slot::new("a@b", Tensor::zeros(DType::F32, &[1]).unwrap()), Err(Error::BadName { .. })));
        assert!(Slot::new("s", Tensor::zeros(DType::F32, &[]).unwrap()).is_err());
        assert!(matches!(
            TableChild::new("t", vec![1], vec![emb(&[[0.0, 0.0]]), emb(&[[0.0, 0.0]])]),
            Err(Error::DuplicateBlock { .. })
        ));
    }

    #[test]
    fn coalesced_split_and_join() {
        let s = SliceInfo::full(65536).unwrap();
        let encoded = [encode_id(3, 0), encode_id(9, 1), encode_id(11, 1)];
        let rows = emb(&[[3.0, 3.0], [9.0, 9.0], [11.0, 11.0]]);
        let t = HashTable::from_coalesced(s, &["ca", "cb"], &encoded, std::slice::from_ref(&rows)).unwrap();
        assert_eq!(t.children()[0].ids(), &[3]);
        assert_eq!(t.children()[1].ids(), &[9, 11]);
        assert_eq!(
            t.children()[1].slot("embedding").unwrap().tensor().to_vec::<f32>().unwrap(),
            vec![9.0, 9.0, 11.0, 11.0]
        );
        let (ids, slots) = coalesce(t.children()).unwrap();
        assert_eq!(ids, encoded);
        assert_eq!(slots[0], rows);
        assert!(matches!(
            HashTable::from_coalesced(s, &["ca"], &encoded, &[rows]),
            Err(Error::BadChildIndex { index: 1, .. })
        ));
        // The top 12 bits of a user id are lost, as in RecIS; indices >= 2048 decode as unsigned.
        assert_eq!(decode_id(encode_id(-1, 3)), (3, ID_MASK));
        assert_eq!(decode_id(encode_id(7, 3000)), (3000, 7));
    }
}
