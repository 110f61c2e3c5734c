//! Reading the serializer's part of a checkpoint directory (`index`, `tensorkey.json`, data files), as
//! RecIS's `LoadBundle` / `CheckpointReader` do, with the whole index validated up front.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use ckpt_tensor::{Buffer, DType, Tensor};
use rayon::prelude::*;

use crate::data_file::DataFile;
use crate::error::{Error, IndexRule, Result, SlotRule};
use crate::index::{INDEX_FILE, Index};
use crate::name::{
    BlockSlice, ID_SLOT, IdPartition, SliceInfo, check_name, parse_block_name, parse_data_file_name, part_shard,
    split_tensor_name,
};
use crate::options::ReadOptions;
use crate::table::{Slot, TableChild, check_same_rows, check_slot_name};
use crate::tensorkey::{TENSORKEY_FILE, TensorKey};
use crate::writer::Block;

/// One block of the checkpoint, as the index, `tensorkey.json` and its file's header describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRecord {
    /// The on-disk key (part name or `name^ `).
    pub key: String,
    /// The internal tensor name (`tbl@embedding`, `w`).
    pub tensor_name: String,
    /// The slice (dense, or the table slice from `tensorkey.json`).
    pub slice: BlockSlice,
    /// The id of its data file in `index`.
    pub file_id: u64,
    /// Its data file's name.
    pub file_name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// The shard that wrote it, when the file names tell (`model-X-of-Y`, with the shard count from the
    /// part names); dense blocks belong to shard 0.
    pub shard: Option<usize>,
}

impl BlockRecord {
    /// For a table block, `(child, slot)`.
    pub fn table_slot(&self) -> Option<(&str, &str)> {
        match self.slice {
            BlockSlice::Dense => None,
            BlockSlice::Table(_) => split_tensor_name(&self.tensor_name).ok(),
        }
    }
}

/// The serializer's part of a RecIS checkpoint, opened and validated.
///
/// Opening reads `tensorkey.json` and `index`, maps every data file `index` names, validates every header,
/// resolves every block through `tensorkey.json`, and checks every table slice (an id block, at least one
/// slot block, equal row counts, consistent slot dtypes and row shapes) before anything is handed out.
/// Tensors are zero-copy windows of the mapped files.
///
/// Blocks are listed in the order RecIS appended them (recovered from the round-robin file layout when the
/// file names follow RecIS's pattern), so [`SparseCheckpoint::shard_blocks`] gives back what each shard
/// wrote, in order, and rewriting them gives identical files.
///
/// ```no_run
/// use ckpt_recis::SparseCheckpoint;
/// use ckpt_recis::name::{IdPartition, gen_slice};
/// let ckpt = SparseCheckpoint::open("ckpt_1000").unwrap();
/// let user = ckpt.child("user").unwrap(); // every slice
/// let k = user.position(42).unwrap();
/// // What shard 1 of a new 3-shard job loads:
/// let part = ckpt.load_child("user", gen_slice(1, 3, 65536).unwrap(), IdPartition::Unsigned).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct SparseCheckpoint {
    dir: PathBuf,
    index: Index,
    tensorkey: TensorKey,
    files: BTreeMap<u64, DataFile>,
    blocks: Vec<BlockRecord>,
    by_tensor: BTreeMap<String, Vec<usize>>,
    children: Vec<String>,
    shard_num: Option<usize>,
    parallel: Option<usize>,
}

impl SparseCheckpoint {
    /// Opens the checkpoint directory `dir`.
    ///
    /// # Errors
    /// [`Error::MissingFile`] without `index` or `tensorkey.json`, [`Error::MissingDataFile`], and the
    /// variant of the first rule broken.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        Self::open_with(dir, &ReadOptions::default())
    }

    /// [`SparseCheckpoint::open`], accepting data-file headers of at most `options.max_header_len` bytes
    /// ([`DataFile::open_with`]).
    ///
    /// # Errors
    /// As [`SparseCheckpoint::open`].
    pub fn open_with(dir: impl AsRef<Path>, options: &ReadOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let index_path = dir.join(INDEX_FILE);
        let index_bytes = read_required(&index_path, "a RecIS checkpoint directory has an `index` file")?;
        let tk_path = dir.join(TENSORKEY_FILE);
        let tk_bytes = read_required(&tk_path, "RecIS's loader needs tensorkey.json to find table slices")?;
        let tensorkey = TensorKey::parse(&tk_bytes, &tk_path)?;
        let index = Index::parse(&index_bytes, &index_path)?;
        let names = index.file_names()?;
        let mut paths = Vec::with_capacity(names.len());
        for (&id, &name) in &names {
            if !is_plain_file_name(name) {
                return Err(Error::BadIndex { path: index_path, rule: IndexRule::DataFileName { name: name.into() } });
            }
            let path = dir.join(name);
            if !path.is_file() {
                return Err(Error::MissingDataFile { index: index_path, file: name.into(), file_id: id });
            }
            paths.push((id, path));
        }
        // The data files are mapped and their headers checked in parallel; the first failure in file order
        // is reported, as a sequential open would.
        let opened: Vec<Result<DataFile>> =
            paths.par_iter().map(|(_, path)| DataFile::open_with(path, options)).collect();
        let mut files = BTreeMap::new();
        for ((id, _), file) in paths.into_iter().zip(opened) {
            files.insert(id, file?);
        }
        Self::build(dir.into(), index, tensorkey, files)
    }

    /// A checkpoint without sparse state (no `index`): no blocks.
    pub fn empty(dir: &Path) -> Self {
        SparseCheckpoint {
            dir: dir.into(),
            index: Index::default(),
            tensorkey: TensorKey::default(),
            files: BTreeMap::new(),
            blocks: Vec::new(),
            by_tensor: BTreeMap::new(),
            children: Vec::new(),
            shard_num: None,
            parallel: None,
        }
    }

    fn build(dir: PathBuf, index: Index, tensorkey: TensorKey, files: BTreeMap<u64, DataFile>) -> Result<Self> {
        let names = index.file_names()?.into_iter().map(|(k, v)| (k, v.to_owned())).collect::<BTreeMap<_, _>>();
        // 1. Every block: its file, its header entry, its internal name.
        let mut by_key: HashMap<&str, BlockRecord> = HashMap::with_capacity(index.block_index.len());
        let mut internal_seen: HashMap<String, String> = HashMap::new();
        for (key, &file_id) in &index.block_index {
            let file = files.get(&file_id).ok_or_else(|| Error::UnknownFileId { key: key.clone(), file_id })?;
            let entry =
                file.entry(key).ok_or_else(|| Error::BlockNotInFile { path: file.path().into(), key: key.clone() })?;
            let internal = tensorkey.resolve(key);
            let (tensor, slice) = parse_block_name(key, internal)?;
            if let BlockSlice::Table(_) = slice {
                split_tensor_name(tensor)?;
            }
            if let Some(other) = internal_seen.insert(crate::name::block_name(tensor, &slice), key.clone()) {
                return Err(Error::DuplicateBlock {
                    key: internal.into(),
                    detail: format!("both {other:?} and {key:?} resolve to it"),
                });
            }
            by_key.insert(
                key,
                BlockRecord {
                    key: key.clone(),
                    tensor_name: tensor.into(),
                    slice,
                    file_id,
                    file_name: names.get(&file_id).cloned().unwrap_or_default(),
                    dtype: entry.dtype,
                    shape: entry.shape.clone(),
                    shard: None,
                },
            );
        }
        // 2. The order RecIS appended them in.
        let shard_num = common_shard_num(by_key.keys().copied());
        let (order, parallel) = recover_order(&index, &files, &names, shard_num);
        let mut blocks = Vec::with_capacity(order.len());
        for (key, shard) in order {
            if let Some(mut r) = by_key.remove(key.as_str()) {
                r.shard = shard.or_else(|| part_shard(&r.key).map(|(i, _)| i)).or(match r.slice {
                    BlockSlice::Dense => Some(0),
                    BlockSlice::Table(_) => None,
                });
                blocks.push(r);
            }
        }
        let mut rest: Vec<BlockRecord> = by_key.into_values().collect();
        rest.sort_by(|a, b| a.key.cmp(&b.key));
        blocks.extend(rest);
        // 3. Lookups.
        let mut by_tensor: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut children = Vec::new();
        let mut child_seen = std::collections::HashSet::new();
        for (i, b) in blocks.iter().enumerate() {
            by_tensor.entry(b.tensor_name.clone()).or_default().push(i);
            if let Some((child, _)) = b.table_slot() {
                if child_seen.insert(child.to_owned()) {
                    children.push(child.to_owned());
                }
            }
        }
        for list in by_tensor.values_mut() {
            list.sort_by_key(|&i| blocks.get(i).map(|b| b.slice.to_string()).unwrap_or_default());
        }
        let ckpt = SparseCheckpoint { dir, index, tensorkey, files, blocks, by_tensor, children, shard_num, parallel };
        // 4. Every table slice is loadable, from the blocks' dtypes and shapes alone (no data is read: a
        // partial copy read through a fill hook fetches nothing more to open).
        for child in &ckpt.children {
            let slices = ckpt.child_blocks(child)?;
            if let Some(first) = slices.first() {
                for other in slices.iter().skip(1) {
                    let missing = |a: &ChildBlocks<'_>, b: &ChildBlocks<'_>| {
                        a.slots.iter().find(|(s, _)| b.slot(s).is_none()).map(|(s, _)| Error::SlotMismatch {
                            child: child.clone(),
                            slot: (*s).into(),
                            rule: SlotRule::MissingInSlice,
                        })
                    };
                    if let Some(e) = missing(first, other).or_else(|| missing(other, first)) {
                        return Err(e);
                    }
                    for (slot, b) in &first.slots {
                        if let Some(o) = other.slot(slot) {
                            check_same_rows(child, slot, rows_of(b), rows_of(o))?;
                        }
                    }
                }
            }
        }
        Ok(ckpt)
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed `index`.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The parsed `tensorkey.json`.
    pub fn tensorkey(&self) -> &TensorKey {
        &self.tensorkey
    }

    /// The data files, by file id.
    pub fn data_files(&self) -> &BTreeMap<u64, DataFile> {
        &self.files
    }

    /// Every block, in the order RecIS appended them (shard by shard).
    pub fn blocks(&self) -> &[BlockRecord] {
        &self.blocks
    }

    /// The number of shards that wrote the checkpoint, from the part names (`None` without table blocks,
    /// or if they disagree).
    pub fn shard_num(&self) -> Option<usize> {
        self.shard_num
    }

    /// Data files per shard (`parallel`), when the file names follow RecIS's pattern.
    pub fn parallel(&self) -> Option<usize> {
        self.parallel
    }

    /// The blocks shard `shard` wrote, in the order it appended them.
    pub fn shard_blocks(&self, shard: usize) -> Vec<&BlockRecord> {
        self.blocks.iter().filter(|b| b.shard == Some(shard)).collect()
    }

    /// The blocks shard `shard` wrote, in order, ready to be written again (by
    /// [`write_shard_files`](crate::writer::write_shard_files) or [`save`](crate::save)): rewriting every shard's
    /// blocks with the same `parallel` gives files identical to the originals.
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] for a block RecIS could not have written (U16, ...).
    pub fn writable_blocks(&self, shard: usize) -> Result<Vec<Block>> {
        self.shard_blocks(shard)
            .into_iter()
            .map(|b| {
                let t = self.block_tensor(b)?;
                match (b.slice, b.table_slot()) {
                    (BlockSlice::Table(s), Some((child, slot))) => Block::table(child, slot, s, t),
                    _ => Block::dense(&b.tensor_name, t),
                }
            })
            .collect()
    }

    /// The data of a block (a zero-copy window of its file).
    ///
    /// # Errors
    /// [`Error::NotFound`] for a record of another checkpoint.
    pub fn block_tensor(&self, block: &BlockRecord) -> Result<Tensor> {
        let file =
            self.files.get(&block.file_id).ok_or_else(|| Error::NotFound { what: "block", name: block.key.clone() })?;
        file.tensor(&block.key)
    }

    /// The internal tensor names RecIS's `CheckpointReader.tensor_names()` lists: `child@slot` for table
    /// slots (`child@id` included) and dense names, in block order.
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut seen = std::collections::HashSet::new();
        self.blocks.iter().map(|b| b.tensor_name.as_str()).filter(|n| seen.insert(*n)).collect()
    }

    /// The dtype and shape [`SparseCheckpoint::read_tensor`] returns for `name`, without reading data.
    pub fn tensor_info(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        let list = self.by_tensor.get(name)?;
        let first = self.blocks.get(*list.first()?)?;
        let mut shape = first.shape.clone();
        if let (Some(d), BlockSlice::Table(_)) = (shape.first_mut(), first.slice) {
            *d = list.iter().filter_map(|&i| self.blocks.get(i)?.shape.first().copied()).sum();
        }
        Some((first.dtype, shape))
    }

    /// A tensor by internal name, as `CheckpointReader.read_tensor`: a dense tensor as stored; a table slot
    /// (or `child@id`) as its slices concatenated along dimension 0, slices in slice-string order (begin
    /// order), so `child@id` and every `child@slot` come out row-aligned. The name must match exactly
    /// (RecIS's prefix match would mix `…exp_avg` with `…exp_avg_sq`).
    ///
    /// # Errors
    /// [`Error::NotFound`].
    pub fn read_tensor(&self, name: &str) -> Result<Tensor> {
        let list = self.by_tensor.get(name).ok_or_else(|| Error::NotFound { what: "tensor", name: name.into() })?;
        let tensors = list
            .iter()
            .filter_map(|&i| self.blocks.get(i))
            .map(|b| self.block_tensor(b))
            .collect::<Result<Vec<_>>>()?;
        match tensors.as_slice() {
            [one] => Ok(one.clone()),
            _ => concat_rows(name, tensors),
        }
    }

    /// The names of the dense blocks, in block order.
    pub fn dense_names(&self) -> Vec<&str> {
        self.blocks.iter().filter(|b| b.slice == BlockSlice::Dense).map(|b| b.tensor_name.as_str()).collect()
    }

    /// A dense block.
    ///
    /// # Errors
    /// [`Error::NotFound`].
    pub fn dense(&self, name: &str) -> Result<Tensor> {
        let b = self
            .blocks
            .iter()
            .find(|b| b.slice == BlockSlice::Dense && b.tensor_name == name)
            .ok_or_else(|| Error::NotFound { what: "dense tensor", name: name.into() })?;
        self.block_tensor(b)
    }

    /// The child tables, in block order.
    pub fn children(&self) -> &[String] {
        &self.children
    }

    /// The slices a child table is stored in, each with its ids and slot rows (zero-copy windows of the
    /// files where the ids are aligned), in slice-string order.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::MissingIdBlock`], [`Error::NoSlotBlocks`], [`Error::BadIdBlock`],
    /// [`Error::RowCountMismatch`].
    pub fn child_slices(&self, child: &str) -> Result<Vec<(SliceInfo, TableChild)>> {
        let groups = self.child_blocks(child)?;
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            let ids = self.block_tensor(g.ids)?;
            let mut slots = Vec::with_capacity(g.slots.len());
            for (slot, b) in g.slots {
                slots.push(Slot::new(slot, self.block_tensor(b)?)?);
            }
            out.push((g.slice, TableChild::with_id_tensor(child.into(), ids, slots, Some(&g.text))?));
        }
        Ok(out)
    }

    /// The blocks of each slice of a child table, in slice-string order, checked from their dtypes and
    /// shapes (no data read): an id block of int64 ids, at least one slot block, each with as many rows as
    /// ids.
    fn child_blocks(&self, child: &str) -> Result<Vec<ChildBlocks<'_>>> {
        let mut groups: BTreeMap<String, SliceGroup<'_>> = BTreeMap::new();
        for b in &self.blocks {
            let (BlockSlice::Table(slice), Some((c, slot))) = (b.slice, b.table_slot()) else {
                continue;
            };
            if c != child {
                continue;
            }
            let g = groups.entry(slice.to_string()).or_insert((slice, None, Vec::new()));
            if slot == ID_SLOT {
                g.1 = Some(b);
            } else {
                g.2.push((slot, b));
            }
        }
        if groups.is_empty() {
            return Err(Error::NotFound { what: "table", name: child.into() });
        }
        check_name(child, "table")?;
        let mut out = Vec::with_capacity(groups.len());
        for (text, (slice, id_block, slots)) in groups {
            let id_block =
                id_block.ok_or_else(|| Error::MissingIdBlock { child: child.into(), slice: text.clone() })?;
            if slots.is_empty() {
                return Err(Error::NoSlotBlocks { child: child.into(), slice: text });
            }
            let (DType::I64, [ids]) = (id_block.dtype, id_block.shape.as_slice()) else {
                return Err(Error::BadIdBlock {
                    child: child.into(),
                    slice: text,
                    dtype: id_block.dtype,
                    shape: id_block.shape.clone(),
                });
            };
            for (slot, b) in &slots {
                check_slot_name(slot)?;
                let rows = b.shape.first().copied().unwrap_or(0);
                if b.shape.is_empty() || rows != *ids {
                    return Err(Error::RowCountMismatch {
                        child: child.into(),
                        slice: text,
                        ids: *ids,
                        slot: (*slot).into(),
                        rows,
                    });
                }
            }
            out.push(ChildBlocks { slice, text, ids: id_block, slots });
        }
        Ok(out)
    }

    /// The `slice_size` of a child table (all its slices must agree).
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::SliceSizeMismatch`] if its slices disagree.
    pub fn slice_size(&self, child: &str) -> Result<u32> {
        let mut size = None;
        for b in &self.blocks {
            let (BlockSlice::Table(s), Some((c, _))) = (b.slice, b.table_slot()) else {
                continue;
            };
            if c != child {
                continue;
            }
            match size {
                None => size = Some(s.size()),
                Some(z) if z != s.size() => {
                    return Err(Error::SliceSizeMismatch { child: child.into(), expected: z, found: s.size() });
                }
                Some(_) => {}
            }
        }
        size.ok_or_else(|| Error::NotFound { what: "table", name: child.into() })
    }

    /// A whole child table: every slice, in slice-string order, rows concatenated (zero copy when there is
    /// one slice).
    ///
    /// # Errors
    /// As [`SparseCheckpoint::child_slices`].
    pub fn child(&self, child: &str) -> Result<TableChild> {
        let parts: Vec<TableChild> = self.child_slices(child)?.into_iter().map(|(_, t)| t).collect();
        TableChild::concat(&parts)
    }

    /// What a shard holding `target` loads of a child table: the ids `x` (and their rows) for which
    /// `partition(x)` lies in `[target.begin, target.end)`, from every slice, in slice-string order then
    /// stored order. With [`IdPartition::Unsigned`] this is RecIS's loader rule `(u64)x % slice_size`.
    ///
    /// Unlike RecIS, slices whose range does not intersect `target` are read too: a table partitioned by
    /// another rule (CPU training puts negative ids by `abs(fmod)`) can hold ids there that belong to
    /// `target`, and RecIS would silently lose them. On tables partitioned by the same rule the result is
    /// RecIS's.
    ///
    /// # Errors
    /// [`Error::SliceSizeMismatch`] if the table's `slice_size` is not `target`'s (RecIS skips such blocks
    /// silently, loading nothing); as [`SparseCheckpoint::child_slices`].
    pub fn load_child(&self, child: &str, target: SliceInfo, partition: IdPartition) -> Result<TableChild> {
        let size = self.slice_size(child)?;
        if size != target.size() {
            return Err(Error::SliceSizeMismatch { child: child.into(), expected: target.size(), found: size });
        }
        let parts = self
            .child_slices(child)?
            .into_iter()
            .map(|(_, t)| t.filter(|id| target.holds(id, partition)))
            .collect::<Result<Vec<_>>>()?;
        TableChild::concat(&parts)
    }
}

/// Bytes of a block copied at a time when a concatenation is made ([`concat_rows`]).
const CONCAT_PIECE: usize = 1 << 20;

/// The slices `parts` of the table slot `name` (row-major blocks of one dtype and row shape, as opening
/// checked) concatenated along dimension 0: a tensor made when its bytes are first read, each block's bytes
/// read then (through the fill hook of a partial copy), so that listing or dropping it reads nothing.
fn concat_rows(name: &str, parts: Vec<Tensor>) -> Result<Tensor> {
    let Some(first) = parts.first() else { return Err(Error::NotFound { what: "tensor", name: name.into() }) };
    let (dtype, row_shape) = (first.dtype(), first.shape().get(1..).unwrap_or_default().to_vec());
    let mut rows = 0usize;
    let mut nbytes = 0usize;
    for p in &parts {
        let (r, rest) = p.shape().split_first().unwrap_or((&0, &[]));
        if p.dtype() != dtype || rest != row_shape.as_slice() || p.dim() == 0 {
            return Err(Error::SlotMismatch {
                child: name.into(),
                slot: name.into(),
                rule: SlotRule::SlicesDiffer {
                    dtype,
                    row_shape: row_shape.clone(),
                    other_dtype: p.dtype(),
                    other_shape: p.shape().to_vec(),
                },
            });
        }
        rows = rows.saturating_add(*r);
        nbytes = nbytes.saturating_add(p.nbytes());
    }
    let mut shape = vec![rows];
    shape.extend(row_shape);
    let made = Buffer::deferred(nbytes, move |out: &mut [u8]| {
        let mut at = 0usize;
        for p in &parts {
            p.data_pieces(CONCAT_PIECE, |piece| {
                let end = at.saturating_add(piece.len());
                let len = out.len();
                let dst = out.get_mut(at..end).ok_or(ckpt_tensor::Error::SliceOutOfRange { start: at, end, len })?;
                dst.copy_from_slice(piece);
                at = end;
                Ok::<(), ckpt_tensor::Error>(())
            })?;
        }
        Ok(())
    });
    Ok(Tensor::from_buffer(dtype, &shape, made)?)
}

/// A slice's blocks as [`SparseCheckpoint::child_blocks`] gathers them: the slice, its id block if any,
/// its slot blocks with their slots' names.
type SliceGroup<'a> = (SliceInfo, Option<&'a BlockRecord>, Vec<(&'a str, &'a BlockRecord)>);

/// The blocks of one slice of a child table ([`SparseCheckpoint::child_blocks`]).
struct ChildBlocks<'a> {
    /// The slice.
    slice: SliceInfo,
    /// The slice as written in block names (`begin@end@size`), which errors name.
    text: String,
    /// The id block.
    ids: &'a BlockRecord,
    /// The slot blocks, each with its slot's name, in block order.
    slots: Vec<(&'a str, &'a BlockRecord)>,
}

impl ChildBlocks<'_> {
    /// The block of the slot `name`.
    fn slot(&self, name: &str) -> Option<&BlockRecord> {
        self.slots.iter().find(|(s, _)| *s == name).map(|(_, b)| *b)
    }
}

/// A slot block's rows: its dtype and row shape (its shape less the first dimension).
fn rows_of(b: &BlockRecord) -> (DType, &[usize]) {
    (b.dtype, b.shape.get(1..).unwrap_or_default())
}

fn read_required(path: &Path, what: &'static str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::MissingFile { path: path.into(), what }
        } else {
            Error::io(path, e)
        }
    })
}

/// A single normal path component (no directories, no `..`): data files live in the checkpoint directory.
fn is_plain_file_name(name: &str) -> bool {
    let mut c = Path::new(name).components();
    matches!((c.next(), c.next()), (Some(Component::Normal(_)), None)) && !name.contains(['/', '\\'])
}

/// The shard count all part names agree on.
fn common_shard_num<'a>(keys: impl Iterator<Item = &'a str>) -> Option<usize> {
    let mut n = None;
    for k in keys {
        if let Some((_, num)) = part_shard(k) {
            match n {
                None => n = Some(num),
                Some(m) if m != num => return None,
                Some(_) => {}
            }
        }
    }
    n
}

/// The blocks of `index` in the order RecIS appended them, with their shard.
///
/// RecIS deals shard s's k-th block to writer `k % P`, which writes file `model-{s*P+w}-of-{S*P}`; each
/// file lists its blocks in append order. So, when every file name follows that pattern, interleaving each
/// shard's files round robin gives back the append order. Otherwise blocks are taken file by file (by file
/// id) in header order.
fn recover_order(
    index: &Index,
    files: &BTreeMap<u64, DataFile>,
    names: &BTreeMap<u64, String>,
    shard_num: Option<usize>,
) -> (Vec<(String, Option<usize>)>, Option<usize>) {
    let listed = |id: u64| -> Vec<String> {
        files
            .get(&id)
            .map(|f| {
                f.entries()
                    .iter()
                    .filter(|e| index.block_index.get(&e.key) == Some(&id))
                    .map(|e| e.key.clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    let parsed: Option<Vec<(u64, usize, usize)>> =
        names.iter().map(|(&id, n)| parse_data_file_name(n).map(|(num, total)| (id, num, total))).collect();
    let total = parsed.as_ref().and_then(|p| {
        let t = p.first().map(|x| x.2)?;
        p.iter().all(|x| x.2 == t).then_some(t)
    });
    let layout = match (parsed, total) {
        (Some(p), Some(t)) if t > 0 => {
            let s = shard_num.unwrap_or(1);
            (t % s == 0 && p.iter().all(|x| x.1 < t)).then(|| (p, s, t / s))
        }
        _ => None,
    };
    let Some((parsed, shards, parallel)) = layout else {
        let order = names.keys().flat_map(|&id| listed(id)).map(|k| (k, None)).collect();
        return (order, None);
    };
    let mut order = Vec::new();
    for s in 0..shards {
        let mut writers: Vec<(usize, std::vec::IntoIter<String>)> = parsed
            .iter()
            .filter(|x| x.1 / parallel == s)
            .map(|&(id, num, _)| (num % parallel, listed(id).into_iter()))
            .collect();
        writers.sort_by_key(|w| w.0);
        loop {
            let mut any = false;
            for (_, it) in &mut writers {
                if let Some(k) = it.next() {
                    order.push((k, Some(s)));
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
    }
    (order, Some(parallel))
}
