//! Decoding the `.metadata` that torch writes with a pickle machine made for it: the first of the three
//! decoders, and the one a large job's metadata (hundreds of thousands of chunks, tens of MB) goes through.
//!
//! # How it runs
//! - **One scan for the memo keys read.** Before running, the opcodes are scanned (the stream is context
//!   free) for the keys some `GET` reads. A large job's pickle memoizes about 16 objects per chunk and reads
//!   a few hundred keys in all, so the memo holds only those, in a dense table indexed by rank.
//! - **A heap, the way Python has one.** A container or an object is one heap record; the stack, the memo
//!   and every container hold small copyable values pointing into it. Strings are borrowed from the input,
//!   tuples (immutable) live in one pool, and a dict or list filled by one `SETITEMS` or `APPENDS` keeps its
//!   items in that pool too. `torch.Size`, `_MEM_FORMAT_ENCODING` and `_get_layout` calls become their
//!   values when called.
//! - **DCP objects become structs at `BUILD`.** A `ChunkStorageMetadata`, `MetadataIndex`, `_StorageInfo`,
//!   `TensorProperties`, `TensorStorageMetadata`, `StorageMeta` or `Metadata` is made from its state when
//!   its `BUILD` runs, and everything the pickle created since the object's `NEWOBJ` is dropped (no memo key
//!   that is read, and no older container, can point into it). So the machine holds what is still open, not
//!   the whole pickle. Chunks appended to a list and `(MetadataIndex, _StorageInfo)` pairs set into a dict
//!   are moved into typed vectors, which become the [`Metadata`]'s own.
//! - **The three objects of every chunk are read straight from their bytes.** A `ChunkStorageMetadata`,
//!   `MetadataIndex` or `_StorageInfo` pickled the way CPython pickles a dataclass, with the field values
//!   torch writes, is made into its struct at its `NEWOBJ` without the stack, the heap or the memo
//!   ([`Vm::typed_object`]); anything else in it (a key that is read, a value of another kind) leaves the
//!   object to the general way, from its `NEWOBJ`, as if the fast path had not looked. Sizes, creations and
//!   limits are counted exactly as the general way counts them (a test checks every limit value).
//!
//! # What it accepts
//! A subset of what the full decoder ([`super::decode`]) accepts, building exactly the same [`Metadata`].
//! Anything else returns `None` and the caller tries the next decoder: an opcode torch does not write here,
//! a container changed after it was put into another, a DCP object used twice or referenced by a memo key
//! that is read, a field that is not what torch writes, input beyond a [`Limits`] value. The limits are
//! counted as the single-pass decoder counts them: each value's size as the full decoder materialises it
//! (nodes, payload bytes, depth; a shared value counted at each use) when the value is used, and the
//! strings, globals, containers and objects the pickle creates.

use std::collections::HashSet;

use ckpt_core::{DType, PathItem, Value};
use ckpt_pickle::opcode::{self as op, Argument};
use ckpt_pickle::{Limits, normalize_global};

use super::single_pass::{Class, class_of};
use super::{
    ChunkStorageMetadata, MemoryFormat, Metadata, MetadataIndex, PlannerData, StorageInfo, StorageMeta,
    StorageMetadata, TensorProperties, TensorStorageMetadata,
};

/// Decodes a `.metadata` pickle, or `None` when another decoder must (see the module docs).
pub(super) fn decode(bytes: &[u8], limits: &Limits) -> Option<Metadata> {
    let reads = MemoReads::scan(bytes)?;
    let mut vm = Vm::new(bytes, limits, reads);
    vm.run()
}

/// The memo keys that some `GET` reads, with each one's slot in the memo table.
struct MemoReads {
    bits: Vec<u64>,
    /// Keys read in the words before each word.
    rank: Vec<u32>,
    /// The slots of keys read recently, by key modulo its length: a pickle reads the same few keys (field
    /// names, classes) again and again.
    recent: [(usize, usize); 256],
}

impl MemoReads {
    /// Scans the opcodes up to the first `STOP`; `None` for a byte that is no opcode, a text `GET` (the
    /// machine runs neither), or a key no valid pickle of this length can have.
    fn scan(data: &[u8]) -> Option<MemoReads> {
        // A key is at most the number of values memoized, which is below the length; the table grows to
        // the largest key read.
        let mut bits: Vec<u64> = Vec::new();
        let mut pos = 0usize;
        let skip_line =
            |pos: usize| -> Option<usize> { Some(pos + data.get(pos..)?.iter().position(|&b| b == b'\n')? + 1) };
        loop {
            let code = *data.get(pos)?;
            pos += 1;
            match op::argument(code) {
                Argument::Fixed(n) => pos += usize::from(n),
                Argument::Counted(w) => {
                    let w = usize::from(w);
                    let n = usize::try_from(op::le_at(data, pos, w)?).ok()?;
                    pos = pos.checked_add(w)?.checked_add(n)?;
                }
                Argument::SignedCounted => {
                    let n = usize::try_from(i32::try_from(op::le_at(data, pos, 4)?).ok()?).ok()?;
                    pos = pos.checked_add(4)?.checked_add(n)?;
                }
                Argument::Lines(n) => {
                    for _ in 0..n {
                        pos = skip_line(pos)?;
                    }
                }
                Argument::Get(w) => {
                    let w = usize::from(w);
                    let key = usize::try_from(op::le_at(data, pos, w)?).ok()?;
                    pos += w;
                    if key >= data.len() {
                        return None;
                    }
                    if key / 64 >= bits.len() {
                        bits.resize(key / 64 + 1, 0);
                    }
                    *bits.get_mut(key / 64)? |= 1 << (key % 64);
                }
                Argument::Stop => break,
                // A text GET (protocol 0), which the machine does not run, or no opcode at all.
                Argument::GetLine | Argument::Invalid => return None,
            }
        }
        let mut rank = Vec::with_capacity(bits.len());
        let mut n = 0u32;
        for w in &bits {
            rank.push(n);
            n = n.checked_add(w.count_ones())?;
        }
        Some(MemoReads { bits, rank, recent: [(usize::MAX, 0); 256] })
    }

    /// The memo slot of `key`, if some `GET` reads it.
    fn slot(&self, key: usize) -> Option<usize> {
        let w = *self.bits.get(key / 64)?;
        let bit = 1u64 << (key % 64);
        if w & bit == 0 {
            return None;
        }
        Some(*self.rank.get(key / 64)? as usize + (w & (bit - 1)).count_ones() as usize)
    }

    /// [`Self::slot`] for a `GET`, through the recent keys.
    fn read_slot(&mut self, key: usize) -> Option<usize> {
        let i = key % self.recent.len();
        if let Some(&(k, slot)) = self.recent.get(i)
            && k == key
        {
            return Some(slot);
        }
        let slot = self.slot(key)?;
        *self.recent.get_mut(i)? = (key, slot);
        Some(slot)
    }

    fn count(&self) -> usize {
        self.rank.last().copied().unwrap_or(0) as usize + self.bits.last().map_or(0, |w| w.count_ones() as usize)
    }
}

/// A value on the stack, in the memo or in a container. `repr(C, u8)` puts every payload at offset 8, so a
/// value moves as two aligned words (the default layout packs some payloads at offset 1, and the unaligned
/// copies of those stall store forwarding on every push).
#[derive(Debug, Clone, Copy)]
#[repr(C, u8)]
enum V {
    None,
    Bool(bool),
    Int(i64),
    /// Index into the strings.
    Str(u32),
    /// A value no DCP field holds (bytes, a float), with its payload length.
    Scalar(u32),
    /// Index into the globals.
    Global(u32),
    /// Index into the tuples.
    Tuple(u32),
    /// `torch.Size(dims)`: index of the tuple of dims (every item an int >= 0 or a bool).
    Size(u32),
    /// `_MEM_FORMAT_ENCODING(code)`.
    MemFormat(MemoryFormat),
    /// `torch.serialization._get_layout('torch.strided')`, prefix removed: index into the strings.
    Layout(u32),
    /// `pathlib.*Path(parts)`: index into the paths.
    Path(u32),
    /// Index into the heap: a list, a dict or an object.
    Heap(u32),
    /// A DCP object made into its struct at `BUILD`.
    Made(Made),
    /// A memo slot not written yet (never on the stack).
    Unset,
}

/// A DCP object made at `BUILD`: its class, and its struct's slot in that class's table.
#[derive(Debug, Clone, Copy)]
struct Made {
    class: Class,
    slot: u32,
}

/// The size of a value as the full decoder materialises it: nodes, payload bytes and depth.
#[derive(Debug, Clone, Copy)]
struct Size {
    nodes: u64,
    bytes: u64,
    depth: u64,
}

/// A [`Size`] in 10 bytes; a saturated field reads back as too large for any limit.
#[derive(Debug, Clone, Copy)]
struct SmallSize {
    nodes: u32,
    bytes: u32,
    depth: u16,
}

impl Size {
    const fn leaf(bytes: u64) -> Size {
        Size { nodes: 1, bytes, depth: 1 }
    }

    /// A container holding what it held plus `child`.
    fn add(&mut self, child: Size) {
        self.nodes = self.nodes.saturating_add(child.nodes);
        self.bytes = self.bytes.saturating_add(child.bytes);
        self.depth = self.depth.max(child.depth.saturating_add(1));
    }

    /// A call's value (object, callable, argument tuple) around `inner`, its argument.
    fn around(inner: Size, nodes: u64, bytes: u64) -> Size {
        Size {
            nodes: inner.nodes.saturating_add(nodes),
            bytes: inner.bytes.saturating_add(bytes),
            depth: inner.depth.saturating_add(2),
        }
    }

    fn small(self) -> SmallSize {
        SmallSize {
            nodes: u32::try_from(self.nodes).unwrap_or(u32::MAX),
            bytes: u32::try_from(self.bytes).unwrap_or(u32::MAX),
            depth: u16::try_from(self.depth).unwrap_or(u16::MAX),
        }
    }
}

impl SmallSize {
    fn size(self) -> Size {
        let wide = |v: u64, max: u64| if v == max { u64::MAX } else { v };
        Size {
            nodes: wide(u64::from(self.nodes), u64::from(u32::MAX)),
            bytes: wide(u64::from(self.bytes), u64::from(u32::MAX)),
            depth: wide(u64::from(self.depth), u64::from(u16::MAX)),
        }
    }
}

fn wide(limit: usize) -> u64 {
    u64::try_from(limit).unwrap_or(u64::MAX)
}

/// A tuple: its items in the pool.
#[derive(Debug)]
struct Tuple {
    start: u32,
    len: u32,
    size: Size,
}

/// The items of a heap list (values) or dict (keys and values, alternating).
#[derive(Debug)]
enum Items {
    /// A range of the pool (one batch of items, or several written one after the other).
    Pooled { start: u32, len: u32 },
    /// Items added in batches that other items came between.
    Owned(Vec<V>),
    /// A list of made chunks only.
    Chunks(Vec<ChunkStorageMetadata>),
    /// A dict of made `MetadataIndex` keys and `_StorageInfo` values only.
    Storage(Vec<(MetadataIndex, StorageInfo)>),
}

#[derive(Debug)]
enum Kind {
    List(Items),
    Dict(Items),
    /// An instance of a DCP class, with its `BUILD` state once set (only `BytesStorageMetadata` keeps it),
    /// and where the pickle stood when it was created.
    Typed {
        class: Class,
        state: Option<V>,
        region: Region,
    },
    /// Any other object: its contents are counted, never looked at.
    Other,
}

/// Where the pickle stood when a DCP object was created: what its `BUILD` may drop.
#[derive(Debug, Clone, Copy)]
struct Region {
    pool: usize,
    tuples: usize,
    read_puts: u64,
    heap_gets: u64,
}

#[derive(Debug)]
struct HeapObject {
    kind: Kind,
    size: Size,
    /// Whether it was put into another value: it may not change after that (see the module docs).
    used: bool,
    /// Whether it is memoized under a key that is read.
    memo_read: bool,
}

#[derive(Debug)]
struct Global<'a> {
    module: &'a str,
    name: &'a str,
    class: Class,
    copyreg: bool,
}

/// A table of made structs; a slot is taken once and then reused.
#[derive(Debug)]
struct Slab<T> {
    items: Vec<Option<T>>,
    /// The size of each slot's object (see [`Size`]).
    sizes: Vec<SmallSize>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { items: Vec::new(), sizes: Vec::new(), free: Vec::new() }
    }
}

impl<T> Slab<T> {
    fn put(&mut self, v: T, size: Size) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            *self.items.get_mut(slot as usize)? = Some(v);
            *self.sizes.get_mut(slot as usize)? = size.small();
            return Some(slot);
        }
        let slot = u32::try_from(self.items.len()).ok()?;
        self.items.push(Some(v));
        self.sizes.push(size.small());
        Some(slot)
    }

    fn size(&self, slot: u32) -> Option<Size> {
        self.sizes.get(slot as usize).map(|s| s.size())
    }

    fn take(&mut self, slot: u32) -> Option<T> {
        let v = self.items.get_mut(slot as usize)?.take()?;
        self.free.push(slot);
        Some(v)
    }
}

/// The made structs, by class.
#[derive(Debug, Default)]
struct Tables {
    chunks: Slab<ChunkStorageMetadata>,
    indexes: Slab<MetadataIndex>,
    infos: Slab<StorageInfo>,
    properties: Slab<TensorProperties>,
    tensors: Slab<TensorStorageMetadata>,
    storage_metas: Slab<StorageMeta>,
    metadata: Option<(Metadata, Size)>,
}

impl Tables {
    /// The size of a made object.
    fn size(&self, m: Made) -> Option<Size> {
        match m.class {
            Class::Chunk => self.chunks.size(m.slot),
            Class::Index => self.indexes.size(m.slot),
            Class::Info => self.infos.size(m.slot),
            Class::Properties { .. } => self.properties.size(m.slot),
            Class::TensorStorage => self.tensors.size(m.slot),
            Class::StorageMeta => self.storage_metas.size(m.slot),
            Class::Metadata => self.metadata.as_ref().map(|(_, s)| *s),
            _ => None,
        }
    }
}

/// The fields a DCP class's state is read for, and a number naming the list (1 to 255, for
/// [`Vm::fields_in`]'s memory).
struct Fields<const N: usize> {
    id: u8,
    names: [&'static str; N],
}

const CHUNK: Fields<2> = Fields { id: 1, names: ["offsets", "sizes"] };
const INDEX: Fields<3> = Fields { id: 2, names: ["fqn", "offset", "index"] };
const INFO: Fields<4> = Fields { id: 3, names: ["relative_path", "offset", "length", "transform_descriptors"] };
const PROPERTIES: Fields<6> =
    Fields { id: 4, names: ["dtype", "layout", "requires_grad", "memory_format", "pin_memory", "strides"] };
const STORAGE_META: Fields<4> = Fields { id: 5, names: ["checkpoint_id", "save_id", "load_id", "modules"] };
const TENSOR: Fields<3> = Fields { id: 6, names: ["properties", "size", "chunks"] };
const METADATA: Fields<5> =
    Fields { id: 7, names: ["state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"] };

/// The empty tuple, made once.
const EMPTY_TUPLE: u32 = 0;

struct Vm<'a, 'l> {
    data: &'a [u8],
    pos: usize,
    limits: &'l Limits,
    /// The largest size accepted: each limit.
    max: Size,
    /// Values the machine may create (strings, globals, containers, objects), and those it created.
    max_created: u64,
    created: u64,
    reads: MemoReads,
    stack: Vec<V>,
    marks: Vec<usize>,
    /// The values of the keys that are read, by slot.
    memo: Vec<V>,
    /// Keys written so far (`MEMOIZE` writes this key).
    memo_len: usize,
    pool: Vec<V>,
    tuples: Vec<Tuple>,
    heap: Vec<HeapObject>,
    globals: Vec<Global<'a>>,
    /// Every string read (borrowed from the input), by index (never dropped: a string memoized under a key
    /// that is read may be used anywhere later).
    strs: Vec<&'a str>,
    paths: Vec<(String, Size)>,
    made: Tables,
    /// Payload bytes read (strings, bytes, names).
    payload: u64,
    /// Values memoized under keys that are read, so far.
    read_puts: u64,
    /// `GET`s of heap objects (which could then be given newer values), so far.
    heap_gets: u64,
    /// Which field each recently seen key string is ([`Vm::fields_in`]): `string index << 16 | list << 8 |
    /// position`, by string index modulo the length; `u64::MAX` when empty.
    field_of: [std::cell::Cell<u64>; 64],
    /// Whether the common DCP objects are read straight from their bytes ([`Vm::typed_object`]); tests turn
    /// it off to run the general way on everything.
    fast: bool,
}

impl<'a, 'l> Vm<'a, 'l> {
    fn new(data: &'a [u8], limits: &'l Limits, reads: MemoReads) -> Self {
        let slots = reads.count();
        Vm {
            data,
            pos: 0,
            limits,
            max: Size {
                nodes: wide(limits.max_nodes),
                bytes: wide(limits.max_alloc_bytes),
                depth: wide(limits.max_depth),
            },
            max_created: wide(limits.max_nodes.min(u32::MAX as usize)),
            created: 0,
            memo: vec![V::Unset; slots],
            reads,
            stack: Vec::with_capacity(256),
            marks: Vec::with_capacity(16),
            memo_len: 0,
            pool: Vec::with_capacity(1024),
            tuples: vec![Tuple { start: 0, len: 0, size: Size::leaf(0) }],
            heap: Vec::with_capacity(256),
            globals: Vec::new(),
            strs: Vec::with_capacity(256),
            paths: Vec::new(),
            made: Tables::default(),
            payload: 0,
            read_puts: 0,
            heap_gets: 0,
            field_of: [const { std::cell::Cell::new(u64::MAX) }; 64],
            fast: true,
        }
    }

    // ----- input -----

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let b = self.data.get(self.pos..end)?;
        self.pos = end;
        Some(b)
    }

    fn arr<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        let b = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// The unsigned little-endian argument of `code`: a length (the `*BINUNICODE*` and `*BINBYTES*` opcodes) or
    /// a memo key (`BINPUT`, `LONG_BINPUT`, `BINGET`, `LONG_BINGET`), as wide as its opcode says.
    #[inline]
    fn arg_uint(&mut self, code: u8) -> Option<usize> {
        let v = match code {
            op::SHORT_BINUNICODE | op::SHORT_BINBYTES | op::BINPUT | op::BINGET => u64::from(self.u8()?),
            op::BINUNICODE | op::BINBYTES | op::LONG_BINPUT | op::LONG_BINGET => {
                u64::from(u32::from_le_bytes(self.arr()?))
            }
            op::BINUNICODE8 | op::BINBYTES8 => u64::from_le_bytes(self.arr()?),
            _ => return None,
        };
        usize::try_from(v).ok()
    }

    /// Counts `n` payload bytes read.
    fn payload(&mut self, n: usize) -> Option<()> {
        self.payload = self.payload.saturating_add(n as u64);
        (self.payload <= self.max.bytes).then_some(())
    }

    /// Counts a string, global, container or object made by the pickle.
    fn created(&mut self) -> Option<()> {
        self.created += 1;
        (self.created < self.max_created).then_some(())
    }

    /// A string of `n` bytes: the value, counted as created and as payload.
    fn str(&mut self, n: usize) -> Option<V> {
        self.created()?;
        let s = std::str::from_utf8(self.take(n)?).ok()?;
        self.payload(n)?;
        Some(V::Str(self.new_str(s)?))
    }

    fn new_str(&mut self, s: &'a str) -> Option<u32> {
        let id = u32::try_from(self.strs.len()).ok()?;
        self.strs.push(s);
        Some(id)
    }

    fn text(&self, id: u32) -> Option<&'a str> {
        self.strs.get(id as usize).copied()
    }

    fn blob(&mut self, n: usize) -> Option<()> {
        self.created()?;
        self.take(n)?;
        self.payload(n)?;
        self.push(V::Scalar(u32::try_from(n).ok()?))
    }

    // ----- stack -----

    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn push(&mut self, v: V) -> Option<()> {
        if self.stack.len() >= self.limits.max_container_len {
            return None;
        }
        self.stack.push(v);
        Some(())
    }

    fn pop(&mut self) -> Option<V> {
        if self.stack.len() <= self.fence() {
            return None;
        }
        self.stack.pop()
    }

    fn top(&self) -> Option<V> {
        if self.stack.len() <= self.fence() {
            return None;
        }
        self.stack.last().copied()
    }

    fn pop_mark(&mut self) -> Option<usize> {
        let m = self.marks.pop()?;
        (m <= self.stack.len()).then_some(m)
    }

    /// The stack index of the value a mutation at stack index `m` (its first item) applies to.
    fn target_below(&self, m: usize) -> Option<usize> {
        (m > 0 && m > self.fence()).then(|| m - 1)
    }

    /// The stack index of the top value, above the innermost mark.
    fn top_index(&self) -> Option<usize> {
        self.stack.len().checked_sub(1).filter(|&v| v >= self.fence())
    }

    fn check(&self, s: Size) -> Option<Size> {
        (s.nodes <= self.max.nodes && s.bytes <= self.max.bytes && s.depth <= self.max.depth).then_some(s)
    }

    /// The size of `v`, which is being put into another value: a heap object is frozen from now on.
    fn used(&mut self, v: V) -> Option<Size> {
        if let V::Heap(id) = v {
            let o = self.heap.get_mut(id as usize)?;
            o.used = true;
            return Some(o.size);
        }
        self.size_of(v)
    }

    /// The size of a value that is not a heap object.
    #[inline]
    fn size_of(&self, v: V) -> Option<Size> {
        Some(match v {
            V::None | V::Bool(_) | V::Int(_) => Size::leaf(0),
            V::Str(id) => Size::leaf(self.text(id)?.len() as u64),
            V::Scalar(n) => Size::leaf(u64::from(n)),
            V::Global(id) => {
                let g = self.globals.get(id as usize)?;
                Size::leaf((g.module.len() + g.name.len()) as u64)
            }
            V::Tuple(id) => self.tuples.get(id as usize)?.size,
            // The call's object, its global (`torch` `Size`) and its argument tuple around the dims.
            V::Size(id) => Size::around(self.tuples.get(id as usize)?.size, 3, 9),
            // The call's object, global and argument tuple around an int or a string, bytes rounded up.
            V::MemFormat(_) => Size { nodes: 4, bytes: 128, depth: 3 },
            V::Layout(id) => Size { nodes: 4, bytes: 64 + self.text(id)?.len() as u64, depth: 3 },
            V::Path(id) => self.paths.get(id as usize)?.1,
            V::Made(m) => self.made.size(m)?,
            V::Heap(_) | V::Unset => return None,
        })
    }

    /// The size of a container of the stack's values from `from` up, starting from `size`.
    fn sizes_from(&mut self, from: usize, mut size: Size) -> Option<Size> {
        for i in from..self.stack.len() {
            let v = *self.stack.get(i)?;
            size.add(self.used(v)?);
        }
        self.check(size)
    }

    fn tuple_from(&mut self, from: usize) -> Option<()> {
        self.created()?;
        let len = self.stack.len().checked_sub(from)?;
        if len > self.limits.max_container_len {
            return None;
        }
        let size = self.sizes_from(from, Size::leaf(0))?;
        let start = u32::try_from(self.pool.len()).ok()?;
        self.pool.extend_from_slice(self.stack.get(from..)?);
        self.stack.truncate(from);
        u32::try_from(self.pool.len()).ok()?;
        let id = u32::try_from(self.tuples.len()).ok()?;
        self.tuples.push(Tuple { start, len: u32::try_from(len).ok()?, size });
        self.push(V::Tuple(id))
    }

    fn push_heap(&mut self, kind: Kind, size: Size) -> Option<()> {
        self.created()?;
        let id = u32::try_from(self.heap.len()).ok()?;
        self.heap.push(HeapObject { kind, size, used: false, memo_read: false });
        self.push(V::Heap(id))
    }

    /// Where the pickle stands now.
    fn region(&self) -> Region {
        Region {
            pool: self.pool.len(),
            tuples: self.tuples.len(),
            read_puts: self.read_puts,
            heap_gets: self.heap_gets,
        }
    }

    // ----- mutation -----

    /// The heap object at stack index `t`, if it may still change.
    fn mutable(&self, t: usize) -> Option<u32> {
        match self.stack.get(t)? {
            V::Heap(id) if !self.heap.get(*id as usize)?.used => Some(*id),
            _ => None,
        }
    }

    /// Appends the stack's values from `from` up to the list (`dict == false`) or dict at stack index `t`,
    /// and drops them from the stack.
    fn extend(&mut self, t: usize, from: usize, dict: bool) -> Option<()> {
        let id = self.mutable(t)?;
        let n = self.stack.len().checked_sub(from)?;
        if dict && n % 2 != 0 {
            return None;
        }
        let obj_size = self.heap.get(id as usize)?.size;
        let size = self.sizes_from(from, obj_size)?;
        let Vm { stack, pool, heap, limits, made, .. } = self;
        let obj = heap.get_mut(id as usize)?;
        obj.size = size;
        let items = match &mut obj.kind {
            Kind::List(items) if !dict => items,
            Kind::Dict(items) if dict => items,
            Kind::Other => {
                stack.truncate(from);
                return Some(());
            }
            _ => return None,
        };
        let new = stack.get(from..)?;
        let per = if dict { 2 } else { 1 };
        let len = match items {
            Items::Pooled { len, .. } => *len as usize / per,
            Items::Owned(v) => v.len() / per,
            Items::Chunks(v) => v.len(),
            Items::Storage(v) => v.len(),
        };
        if len.checked_add(new.len() / per)? > limits.max_container_len {
            return None;
        }
        let empty = matches!(items, Items::Pooled { len: 0, .. });
        if !dict && (empty || matches!(items, Items::Chunks(_))) && new.iter().all(|v| is_made(v, Class::Chunk)) {
            // Chunks of a tensor: moved into the list's own vector.
            if empty {
                *items = Items::Chunks(Vec::with_capacity(new.len()));
            }
            let Items::Chunks(chunks) = items else { return None };
            for v in new {
                let V::Made(m) = v else { return None };
                chunks.push(made.chunks.take(m.slot)?);
            }
        } else if dict
            && (empty || matches!(items, Items::Storage(_)))
            && new.chunks_exact(2).all(|p| matches!(p, [k, v] if is_made(k, Class::Index) && is_made(v, Class::Info)))
        {
            // `storage_data`: moved into the dict's own vector.
            if empty {
                *items = Items::Storage(Vec::with_capacity(new.len() / 2));
            }
            let Items::Storage(pairs) = items else { return None };
            for p in new.chunks_exact(2) {
                let [V::Made(k), V::Made(v)] = p else { return None };
                pairs.push((made.indexes.take(k.slot)?, made.infos.take(v.slot)?));
            }
        } else {
            match items {
                Items::Pooled { start, len } => {
                    if *len == 0 {
                        *start = u32::try_from(pool.len()).ok()?;
                        pool.extend_from_slice(new);
                    } else if *start as usize + *len as usize == pool.len() {
                        pool.extend_from_slice(new);
                    } else {
                        let from_pool = pool.get(*start as usize..*start as usize + *len as usize)?;
                        let mut owned = Vec::with_capacity(from_pool.len() + new.len());
                        owned.extend_from_slice(from_pool);
                        owned.extend_from_slice(new);
                        *items = Items::Owned(owned);
                        stack.truncate(from);
                        return Some(());
                    }
                    u32::try_from(pool.len()).ok()?;
                    *len = u32::try_from(*len as usize + new.len()).ok()?;
                }
                Items::Owned(v) => v.extend_from_slice(new),
                Items::Chunks(_) | Items::Storage(_) => return None,
            }
        }
        stack.truncate(from);
        Some(())
    }

    fn build(&mut self) -> Option<()> {
        let v = self.top_index()?;
        let t = self.target_below(v)?;
        let id = self.mutable(t)?;
        let state = self.pop()?;
        let state_size = self.used(state)?;
        let obj = self.heap.get_mut(id as usize)?;
        let mut size = obj.size;
        size.add(state_size);
        let size = self.check(size)?;
        let obj = self.heap.get_mut(id as usize)?;
        obj.size = size;
        let (class, region) = match &mut obj.kind {
            Kind::Other => return Some(()),
            // Its state is never looked at; it stays an object (a second BUILD is declined).
            Kind::Typed { class: Class::BytesStorage, state: slot @ None, .. } => {
                *slot = Some(state);
                return Some(());
            }
            Kind::Typed { class, state: None, region } if !obj.memo_read => (*class, *region),
            _ => return None,
        };
        let slot = match class {
            Class::Chunk => {
                let c = self.chunk(self.dict(state)?)?;
                self.made.chunks.put(c, size)?
            }
            Class::Index => {
                let i = self.index(self.dict(state)?)?;
                self.made.indexes.put(i, size)?
            }
            Class::Info => {
                let i = self.info(self.dict(state)?)?;
                self.made.infos.put(i, size)?
            }
            Class::Properties { legacy } => {
                let p = self.properties(state, legacy)?;
                self.made.properties.put(p, size)?
            }
            Class::StorageMeta => {
                let m = self.storage_meta(state)?;
                self.made.storage_metas.put(m, size)?
            }
            Class::TensorStorage => {
                let t = self.tensor(state)?;
                self.made.tensors.put(t, size)?
            }
            Class::Metadata => {
                let md = self.metadata(state)?;
                if self.made.metadata.replace((md, size)).is_some() {
                    return None;
                }
                0
            }
            _ => return None,
        };
        // The object and everything created since it are dropped when nothing else can point there.
        let value = V::Made(Made { class, slot });
        if region.read_puts == self.read_puts && region.heap_gets == self.heap_gets {
            self.pool.truncate(region.pool);
            self.tuples.truncate(region.tuples);
            self.heap.truncate(id as usize);
        }
        *self.stack.get_mut(t)? = value;
        Some(())
    }

    // ----- memo -----

    fn memo_put(&mut self, key: usize) -> Option<()> {
        let v = self.top()?;
        match key.cmp(&self.memo_len) {
            std::cmp::Ordering::Less => {}
            std::cmp::Ordering::Equal if self.memo_len < self.limits.max_memo => self.memo_len += 1,
            _ => return None,
        }
        if let Some(slot) = self.reads.slot(key) {
            *self.memo.get_mut(slot)? = v;
            match v {
                // What can point at the pool, the tuples or the heap (see `build`).
                V::Tuple(_) | V::Size(_) => self.read_puts += 1,
                V::Heap(id) => {
                    self.read_puts += 1;
                    self.heap.get_mut(id as usize)?.memo_read = true;
                }
                _ => {}
            }
        }
        Some(())
    }

    fn memo_get(&mut self, key: usize) -> Option<()> {
        if key >= self.memo_len {
            return None;
        }
        let v = *self.memo.get(self.reads.read_slot(key)?)?;
        if matches!(v, V::Unset) {
            return None;
        }
        if matches!(v, V::Heap(_)) {
            self.heap_gets += 1;
        }
        self.push(v)
    }

    // ----- globals and calls -----

    fn stack_global(&mut self) -> Option<()> {
        let (V::Str(name), V::Str(module)) = (self.pop()?, self.pop()?) else { return None };
        let (name, module) = (self.text(name)?, self.text(module)?);
        self.new_global(module, name)
    }

    /// `GLOBAL`: the module and name on two lines.
    fn global_lines(&mut self) -> Option<()> {
        let mut line = || -> Option<&'a str> {
            let rest = self.data.get(self.pos..)?;
            let i = rest.iter().position(|&b| b == b'\n')?;
            self.pos += i + 1;
            std::str::from_utf8(rest.get(..i)?).ok()
        };
        let (module, name) = (line()?, line()?);
        if module.is_empty() || name.is_empty() {
            return None;
        }
        self.payload(module.len() + name.len())?;
        self.new_global(module, name)
    }

    fn new_global(&mut self, module: &'a str, name: &'a str) -> Option<()> {
        self.created()?;
        let (m, n) = normalize_global(module, name);
        let class = class_of(&m, &n);
        let copyreg = m == "copyreg" && (n == "_reconstructor" || n == "__newobj__");
        let id = u32::try_from(self.globals.len()).ok()?;
        self.globals.push(Global { module, name, class, copyreg });
        self.push(V::Global(id))
    }

    /// The items of tuple `v`.
    fn tuple_items(&self, v: V) -> Option<&[V]> {
        let V::Tuple(id) = v else { return None };
        let t = self.tuples.get(id as usize)?;
        self.pool.get(t.start as usize..t.start as usize + t.len as usize)
    }

    /// REDUCE (`reduce`) or NEWOBJ of `callable` with `args`: what the single-pass decoder's `object` makes.
    fn call(&mut self, reduce: bool, callable: V, args: V) -> Option<()> {
        self.created()?;
        let mut size = Size::leaf(0);
        size.add(self.used(callable)?);
        size.add(self.used(args)?);
        let size = self.check(size)?;
        let global = match callable {
            V::Global(id) => self.globals.get(id as usize),
            _ => None,
        };
        let Some(g) = global else { return self.push_heap(Kind::Other, size) };
        if g.class == Class::Other && !g.copyreg {
            if reduce && g.module == "torch.serialization" && g.name == "_get_layout" {
                let s = match self.tuple_items(args) {
                    Some([V::Str(s)]) => self.text(*s)?,
                    _ => return self.push_heap(Kind::Other, size),
                };
                let id = self.new_str(s.strip_prefix("torch.").unwrap_or(s))?;
                return self.push(V::Layout(id));
            }
            if (g.module == "pathlib" || g.module.starts_with("pathlib.")) && g.name.ends_with("Path") {
                let sep = if g.name.contains("Windows") { '\\' } else { '/' };
                let Some(parts) = self.tuple_items(args) else { return self.push_heap(Kind::Other, size) };
                let mut out = String::new();
                for (i, p) in parts.iter().enumerate() {
                    let V::Str(p) = p else { return self.push_heap(Kind::Other, size) };
                    let p = self.text(*p)?;
                    if i > 0 && !out.ends_with(sep) {
                        out.push(sep);
                    }
                    out.push_str(p);
                }
                let id = u32::try_from(self.paths.len()).ok()?;
                self.paths.push((out, size));
                return self.push(V::Path(id));
            }
            return self.push_heap(Kind::Other, size);
        }
        let class = if g.copyreg {
            match self.tuple_items(args).and_then(|a| a.first()) {
                Some(V::Global(cls)) => self.globals.get(*cls as usize).map_or(Class::Other, |c| c.class),
                _ => Class::Other,
            }
        } else {
            g.class
        };
        let v = match class {
            Class::Size => match self.tuple_items(args) {
                Some([inner @ V::Tuple(id)]) => {
                    let dims = self.tuple_items(*inner)?;
                    if dims.iter().all(|d| matches!(d, V::Int(i) if *i >= 0) || matches!(d, V::Bool(_))) {
                        V::Size(*id)
                    } else {
                        return self.push_heap(Kind::Other, size);
                    }
                }
                // A list of dims: valid, but torch never writes it.
                Some([V::Heap(_)]) => return None,
                Some([]) => V::Size(EMPTY_TUPLE),
                _ => return self.push_heap(Kind::Other, size),
            },
            Class::MemFormat => match self.tuple_items(args) {
                Some([V::Int(code)]) => match MemoryFormat::from_code(*code) {
                    Some(m) => V::MemFormat(m),
                    None => return self.push_heap(Kind::Other, size),
                },
                _ => return self.push_heap(Kind::Other, size),
            },
            Class::Other => return self.push_heap(Kind::Other, size),
            typed => {
                let region = self.region();
                return self.push_heap(Kind::Typed { class: typed, state: None, region }, size);
            }
        };
        self.push(v)
    }

    // ----- the machine -----

    fn run(&mut self) -> Option<Metadata> {
        loop {
            let code = self.u8()?;
            match code {
                op::MARK => {
                    if self.marks.len() >= self.limits.max_mark_depth {
                        return None;
                    }
                    self.marks.push(self.stack.len());
                }
                op::STOP => {
                    if !self.marks.is_empty() {
                        return None;
                    }
                    let root = self.pop()?;
                    let size = self.used(root)?;
                    self.check(size)?;
                    return match root {
                        V::Made(Made { class: Class::Metadata, .. }) => self.made.metadata.take().map(|(md, _)| md),
                        _ => None,
                    };
                }
                op::POP => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                op::POP_MARK => {
                    let m = self.pop_mark()?;
                    self.stack.truncate(m);
                }
                op::BININT | op::BININT1 | op::BININT2 | op::LONG1 => {
                    let v = self.int_op(code)?;
                    self.push(V::Int(v))?;
                }
                op::NONE => self.push(V::None)?,
                op::NEWTRUE => self.push(V::Bool(true))?,
                op::NEWFALSE => self.push(V::Bool(false))?,
                op::BINFLOAT => {
                    self.take(8)?;
                    self.push(V::Scalar(0))?;
                }
                op::SHORT_BINUNICODE | op::BINUNICODE | op::BINUNICODE8 => {
                    let n = self.arg_uint(code)?;
                    let v = self.str(n)?;
                    self.push(v)?;
                }
                op::SHORT_BINBYTES | op::BINBYTES | op::BINBYTES8 => {
                    let n = self.arg_uint(code)?;
                    self.blob(n)?;
                }
                op::EMPTY_TUPLE => {
                    self.created()?;
                    self.push(V::Tuple(EMPTY_TUPLE))?;
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1) + 1;
                    let from = self.stack.len().checked_sub(n).filter(|&f| f >= self.fence())?;
                    self.tuple_from(from)?;
                }
                op::TUPLE => {
                    let m = self.pop_mark()?;
                    self.tuple_from(m)?;
                }
                op::EMPTY_LIST => self.push_heap(Kind::List(Items::Pooled { start: 0, len: 0 }), Size::leaf(0))?,
                op::EMPTY_DICT => self.push_heap(Kind::Dict(Items::Pooled { start: 0, len: 0 }), Size::leaf(0))?,
                op::APPEND => {
                    let v = self.top_index()?;
                    let t = self.target_below(v)?;
                    self.extend(t, v, false)?;
                }
                op::APPENDS => {
                    let m = self.pop_mark()?;
                    let t = self.target_below(m)?;
                    if self.stack.len() > m {
                        self.extend(t, m, false)?;
                    }
                }
                op::SETITEM => {
                    let k = self.stack.len().checked_sub(2).filter(|&k| k >= self.fence())?;
                    let t = self.target_below(k)?;
                    self.extend(t, k, true)?;
                }
                op::SETITEMS => {
                    let m = self.pop_mark()?;
                    let t = self.target_below(m)?;
                    if self.stack.len() > m {
                        self.extend(t, m, true)?;
                    }
                }
                op::BUILD => self.build()?,
                op::STACK_GLOBAL => self.stack_global()?,
                op::GLOBAL => self.global_lines()?,
                op::NEWOBJ if self.fast && self.typed_object()? => {}
                op::NEWOBJ | op::REDUCE => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    self.call(code == op::REDUCE, callable, args)?;
                }
                op::MEMOIZE => self.memo_put(self.memo_len)?,
                op::BINPUT | op::LONG_BINPUT => {
                    let key = self.arg_uint(code)?;
                    self.memo_put(key)?;
                }
                op::BINGET | op::LONG_BINGET => {
                    let key = self.arg_uint(code)?;
                    self.memo_get(key)?;
                }
                op::PROTO => {
                    if self.u8()? > op::HIGHEST_PROTOCOL {
                        return None;
                    }
                }
                op::FRAME => {
                    let n = u64::from_le_bytes(self.arr()?);
                    if n > (self.data.len() - self.pos.min(self.data.len())) as u64 {
                        return None;
                    }
                }
                _ => return None,
            }
        }
    }

    // ----- the common DCP objects, read straight from their bytes -----

    /// At a `NEWOBJ`: a `ChunkStorageMetadata`, `MetadataIndex` or `_StorageInfo` pickled the way CPython
    /// pickles a dataclass (`NEWOBJ`, `EMPTY_DICT`, `MARK`, fields, `SETITEMS`, `BUILD`, each object and dict
    /// memoized under a key no `GET` reads), with the field values torch writes (strings, ints, `None`,
    /// `torch.Size`s), made into its struct without the stack, the heap or the pool. `Some(true)`: done, the
    /// made object is on the stack. `Some(false)`: anything else, nothing changed (the `NEWOBJ` runs the
    /// general way). Each value's size, what it creates and every limit are counted exactly as the general
    /// way counts them.
    fn typed_object(&mut self) -> Option<bool> {
        // The class and its arguments, above the innermost mark (as `NEWOBJ` pops them).
        let above_mark = self.stack.get(self.fence()..).unwrap_or_default();
        let [.., callable, V::Tuple(EMPTY_TUPLE)] = above_mark else { return Some(false) };
        let Some(g) = self.global(*callable) else { return Some(false) };
        let class = g.class;
        if g.copyreg || !matches!(class, Class::Chunk | Class::Index | Class::Info) {
            return Some(false);
        }
        let global_bytes = (g.module.len() + g.name.len()) as u64;
        // Room for what the general way would push and mark (the object's and a `torch.Size`'s `MARK`).
        if self.stack.len() + 40 >= self.limits.max_container_len || self.marks.len() + 2 > self.limits.max_mark_depth {
            return Some(false);
        }
        let saved = (self.pos, self.memo_len, self.created, self.payload, self.strs.len());
        let (pool, tuples) = (self.pool.len(), self.tuples.len());
        let made = self.typed_object_fields(class, global_bytes);
        self.pool.truncate(pool);
        self.tuples.truncate(tuples);
        let Some(slot) = made else {
            (self.pos, self.memo_len, self.created, self.payload) = (saved.0, saved.1, saved.2, saved.3);
            // String indexes are given again: forget what was learnt about them.
            self.strs.truncate(saved.4);
            for cell in &self.field_of {
                cell.set(u64::MAX);
            }
            return Some(false);
        };
        self.stack.truncate(self.stack.len() - 2);
        self.push(V::Made(Made { class, slot }))?;
        Some(true)
    }

    /// The body of [`Self::typed_object`]: `None` to leave the object to the general way.
    fn typed_object_fields(&mut self, class: Class, global_bytes: u64) -> Option<u32> {
        // NEWOBJ: the object, its class and the empty tuple.
        self.created()?;
        let mut object = Size::leaf(0);
        object.add(Size::leaf(global_bytes));
        object.add(Size::leaf(0));
        self.check(object)?;
        self.fresh_put(None)?;
        if self.u8()? != op::EMPTY_DICT {
            return None;
        }
        self.created()?;
        self.fresh_put(None)?;
        if self.u8()? != op::MARK {
            return None;
        }
        let mut pairs = [V::None; 16];
        let mut n = 0;
        let mut state = Size::leaf(0);
        loop {
            let code = *self.data.get(self.pos)?;
            if code == op::SETITEMS {
                self.pos += 1;
                break;
            }
            let v = self.field_value()?;
            if n % 2 == 0 && !matches!(v, V::Str(_)) {
                return None;
            }
            state.add(self.size_of(v)?);
            *pairs.get_mut(n)? = v;
            n += 1;
        }
        if n % 2 != 0 || n / 2 > self.limits.max_container_len {
            return None;
        }
        let state = self.check(state)?;
        if self.u8()? != op::BUILD {
            return None;
        }
        object.add(state);
        let object = self.check(object)?;
        let pairs = pairs.get(..n)?;
        match class {
            Class::Chunk => {
                let c = self.chunk(pairs)?;
                self.made.chunks.put(c, object)
            }
            Class::Index => {
                let i = self.index(pairs)?;
                self.made.indexes.put(i, object)
            }
            Class::Info => {
                let i = self.info(pairs)?;
                self.made.infos.put(i, object)
            }
            _ => None,
        }
    }

    /// An optional `MEMOIZE` / `BINPUT` / `LONG_BINPUT` of a new key after a value: for a key some `GET`
    /// reads, `value` is what it holds (a string or a scalar; anything else is left to the general way).
    fn fresh_put(&mut self, value: Option<V>) -> Option<()> {
        let code = *self.data.get(self.pos)?;
        let key = match code {
            op::MEMOIZE => {
                self.pos += 1;
                self.memo_len
            }
            op::BINPUT | op::LONG_BINPUT => {
                self.pos += 1;
                self.arg_uint(code)?
            }
            _ => return Some(()),
        };
        if key != self.memo_len || self.memo_len >= self.limits.max_memo {
            return None;
        }
        self.memo_len += 1;
        if let Some(slot) = self.reads.slot(key) {
            match value {
                Some(v @ (V::Str(_) | V::Int(_) | V::None | V::Bool(_))) => *self.memo.get_mut(slot)? = v,
                _ => return None,
            }
        }
        Some(())
    }

    /// An int opcode's value (`None` for an integer wider than 64 bits: no DCP field holds one).
    fn int_op(&mut self, code: u8) -> Option<i64> {
        Some(match code {
            op::BININT1 => i64::from(self.u8()?),
            op::BININT2 => i64::from(u16::from_le_bytes(self.arr()?)),
            op::BININT => i64::from(i32::from_le_bytes(self.arr()?)),
            op::LONG1 => {
                let n = usize::from(self.u8()?);
                let b = self.take(n)?;
                if n > 8 {
                    return None;
                }
                let fill = if b.last().is_some_and(|&h| h & 0x80 != 0) { 0xff } else { 0 };
                let mut le = [fill; 8];
                le.get_mut(..n)?.copy_from_slice(b);
                i64::from_le_bytes(le)
            }
            _ => return None,
        })
    }

    /// One field key or value: a `GET` of a string or scalar, a new string, an int, `None`, a bool, or a
    /// `torch.Size` call.
    fn field_value(&mut self) -> Option<V> {
        let code = self.u8()?;
        Some(match code {
            op::BINGET | op::LONG_BINGET => {
                let key = self.arg_uint(code)?;
                if key >= self.memo_len {
                    return None;
                }
                match *self.memo.get(self.reads.read_slot(key)?)? {
                    v @ (V::Str(_) | V::Int(_) | V::None | V::Bool(_) | V::Size(_)) => v,
                    V::Global(g) => return self.size_call(g),
                    _ => return None,
                }
            }
            op::SHORT_BINUNICODE | op::BINUNICODE => {
                let n = self.arg_uint(code)?;
                let v = self.str(n)?;
                self.fresh_put(Some(v))?;
                v
            }
            op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => V::Int(self.int_op(code)?),
            op::NONE => V::None,
            op::NEWTRUE => V::Bool(true),
            op::NEWFALSE => V::Bool(false),
            _ => return None,
        })
    }

    /// `torch.Size((dims...))` after a `GET` of the global `g`: `(dims)` from ints (`TUPLE1`-`TUPLE3`, a
    /// `MARK`ed `TUPLE`, or `EMPTY_TUPLE`), `TUPLE1`, `REDUCE`, each optionally memoized under a key no `GET`
    /// reads. The dims' tuple goes to the pool (dropped with the object once it is made).
    fn size_call(&mut self, g: u32) -> Option<V> {
        let g = self.globals.get(g as usize)?;
        if g.class != Class::Size || g.copyreg {
            return None;
        }
        let global_bytes = (g.module.len() + g.name.len()) as u64;
        let mut dims = [0i64; 8];
        let mut n = 0;
        let marked = *self.data.get(self.pos)? == op::MARK;
        if marked {
            self.pos += 1;
        }
        loop {
            let code = self.u8()?;
            match code {
                op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => {
                    *dims.get_mut(n)? = self.int_op(code)?;
                    n += 1;
                }
                op::TUPLE if marked => break,
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 if !marked && usize::from(code - op::TUPLE1) + 1 == n => break,
                op::EMPTY_TUPLE if !marked && n == 0 => break,
                _ => return None,
            }
        }
        let dims = dims.get(..n)?;
        if dims.iter().any(|&d| d < 0) || n > self.limits.max_container_len || self.limits.max_container_len == 0 {
            return None;
        }
        // The dims' tuple, then the argument tuple around it, then the call (as `tuple_from` and `call`).
        self.created()?;
        let mut inner = Size::leaf(0);
        for _ in dims {
            inner.add(Size::leaf(0));
        }
        let inner = self.check(inner)?;
        let start = u32::try_from(self.pool.len()).ok()?;
        self.pool.extend(dims.iter().map(|&d| V::Int(d)));
        let id = u32::try_from(self.tuples.len()).ok()?;
        self.tuples.push(Tuple { start, len: u32::try_from(n).ok()?, size: inner });
        self.fresh_put(None)?;
        if self.u8()? != op::TUPLE1 {
            return None;
        }
        self.created()?;
        let mut args = Size::leaf(0);
        args.add(inner);
        let args = self.check(args)?;
        self.fresh_put(None)?;
        if self.u8()? != op::REDUCE {
            return None;
        }
        self.created()?;
        let mut call = Size::leaf(0);
        call.add(Size::leaf(global_bytes));
        call.add(args);
        self.check(call)?;
        self.fresh_put(None)?;
        Some(V::Size(id))
    }

    // ----- the DCP structs, from BUILD states -----

    /// The items of a tuple, or of a list of values.
    fn seq(&self, v: V) -> Option<&[V]> {
        match v {
            V::Tuple(_) => self.tuple_items(v),
            V::Heap(id) => match &self.heap.get(id as usize)?.kind {
                Kind::List(items) => self.values(items),
                _ => None,
            },
            _ => None,
        }
    }

    fn values<'s>(&'s self, items: &'s Items) -> Option<&'s [V]> {
        match items {
            Items::Pooled { start, len } => self.pool.get(*start as usize..*start as usize + *len as usize),
            Items::Owned(v) => Some(v),
            Items::Chunks(_) | Items::Storage(_) => None,
        }
    }

    /// The keys and values (alternating) of a dict of values.
    fn dict(&self, v: V) -> Option<&[V]> {
        let V::Heap(id) = v else { return None };
        match &self.heap.get(id as usize)?.kind {
            Kind::Dict(items) => self.values(items),
            _ => None,
        }
    }

    /// The values of the fields of a dataclass `__dict__` state (the last of equal names wins); `None`
    /// unless the state is a dict whose every key is a str.
    fn fields<const N: usize>(&self, state: V, fields: &Fields<N>) -> Option<[Option<V>; N]> {
        self.fields_in(self.dict(state)?, fields)
    }

    /// [`Self::fields`] of a dict's keys and values (alternating). Which field a key string is, is
    /// remembered by the string's index (torch writes each field name once and reads it from the memo after
    /// that), so a chunk's objects compare no names.
    fn fields_in<const N: usize>(&self, pairs: &[V], fields: &Fields<N>) -> Option<[Option<V>; N]> {
        let mut out = [None; N];
        for pair in pairs.chunks_exact(2) {
            let [V::Str(id), v] = pair else { return None };
            let cell = self.field_of.get(*id as usize % self.field_of.len())?;
            let tag = (u64::from(*id) << 16) | (u64::from(fields.id) << 8);
            let known = cell.get();
            let pos = if known & !0xff == tag {
                (known & 0xff) as usize
            } else {
                let k = self.text(*id)?;
                let pos = fields.names.iter().position(|n| *n == k).unwrap_or(0xff);
                cell.set(tag | pos as u64);
                pos
            };
            if let Some(slot) = out.get_mut(pos) {
                *slot = Some(*v);
            }
        }
        Some(out)
    }

    fn global(&self, v: V) -> Option<&Global<'a>> {
        let V::Global(id) = v else { return None };
        self.globals.get(id as usize)
    }

    /// A `torch.Size`, or a plain tuple/list of ints.
    fn size(&self, v: V) -> Option<Vec<usize>> {
        let items = match v {
            V::Size(id) => self.tuple_items(V::Tuple(id))?,
            other => self.seq(other)?,
        };
        let mut dims = Vec::with_capacity(items.len());
        for d in items {
            dims.push(uint(*d)?);
        }
        Some(dims)
    }

    fn dtype(&self, v: V) -> Option<DType> {
        let g = self.global(v)?;
        if g.module != "torch" {
            return None;
        }
        DType::from_torch_name(g.name)
    }

    fn layout(&self, v: V) -> Option<String> {
        match v {
            V::Global(_) => {
                let g = self.global(v)?;
                (g.module == "torch").then(|| g.name.to_owned())
            }
            V::Layout(s) => Some(self.text(s)?.to_owned()),
            _ => None,
        }
    }

    fn memory_format(&self, v: V) -> Option<MemoryFormat> {
        match v {
            V::Global(_) => {
                let g = self.global(v)?;
                if g.module != "torch" {
                    return None;
                }
                match g.name {
                    "contiguous_format" => Some(MemoryFormat::Contiguous),
                    "channels_last" => Some(MemoryFormat::ChannelsLast),
                    "preserve_format" => Some(MemoryFormat::Preserve),
                    _ => None,
                }
            }
            V::MemFormat(m) => Some(m),
            _ => None,
        }
    }

    fn strides(&self, v: V) -> Option<Option<Vec<usize>>> {
        match v {
            V::None => Some(None),
            other => self.seq(other)?.iter().map(|d| uint(*d)).collect::<Option<Vec<_>>>().map(Some),
        }
    }

    fn properties(&self, state: V, legacy: bool) -> Option<TensorProperties> {
        if let V::Tuple(_) = state {
            let items = self.tuple_items(state)?;
            if items.len() != 5 && items.len() != 6 {
                return None;
            }
            let item = |i: usize| items.get(i).copied();
            return Some(TensorProperties {
                dtype: self.dtype(item(0)?)?,
                layout: self.layout(item(1)?)?,
                requires_grad: bool_of(item(2)?)?,
                memory_format: self.memory_format(item(3)?)?,
                pin_memory: bool_of(item(4)?)?,
                strides: match item(5) {
                    Some(s) => self.strides(s)?,
                    None => None,
                },
                legacy_class: legacy,
            });
        }
        let [dtype, layout, requires_grad, memory_format, pin_memory, strides] = self.fields(state, &PROPERTIES)?;
        Some(TensorProperties {
            dtype: self.dtype(dtype?)?,
            layout: match layout {
                Some(l) => self.layout(l)?,
                None => "strided".into(),
            },
            requires_grad: match requires_grad {
                Some(b) => bool_of(b)?,
                None => false,
            },
            memory_format: match memory_format {
                Some(m) => self.memory_format(m)?,
                None => MemoryFormat::Contiguous,
            },
            pin_memory: match pin_memory {
                Some(b) => bool_of(b)?,
                None => false,
            },
            strides: match strides {
                Some(s) => self.strides(s)?,
                None => None,
            },
            legacy_class: legacy,
        })
    }

    fn chunk(&self, state: &[V]) -> Option<ChunkStorageMetadata> {
        let [offsets, sizes] = self.fields_in(state, &CHUNK)?;
        Some(ChunkStorageMetadata { offsets: self.size(offsets?)?, sizes: self.size(sizes?)? })
    }

    fn index(&self, state: &[V]) -> Option<MetadataIndex> {
        let [fqn, offset, index] = self.fields_in(state, &INDEX)?;
        let V::Str(fqn) = fqn? else { return None };
        let fqn = self.text(fqn)?;
        Some(MetadataIndex {
            fqn: fqn.to_owned(),
            offset: match offset {
                None | Some(V::None) => None,
                Some(s) => Some(self.size(s)?),
            },
            index: match index {
                None | Some(V::None) => None,
                Some(i) => Some(uint(i)?),
            },
        })
    }

    fn info(&self, state: &[V]) -> Option<StorageInfo> {
        let [path, offset, length, transforms] = self.fields_in(state, &INFO)?;
        let V::Str(path) = path? else { return None };
        let path = self.text(path)?;
        Some(StorageInfo {
            relative_path: path.to_owned(),
            offset: u64_of(offset?)?,
            length: u64_of(length?)?,
            transform_descriptors: match transforms {
                None | Some(V::None) => Vec::new(),
                Some(t) => self.strings(t)?,
            },
        })
    }

    /// `None` / absent -> `Some(None)`; a str -> `Some(Some)`; anything else -> `None` (decline).
    fn opt_string(&self, v: Option<V>) -> Option<Option<String>> {
        match v {
            None | Some(V::None) => Some(None),
            Some(V::Str(s)) => Some(Some(self.text(s)?.to_owned())),
            Some(_) => None,
        }
    }

    /// A list or tuple of str.
    fn strings(&self, v: V) -> Option<Vec<String>> {
        self.seq(v)?.iter().map(|s| if let V::Str(s) = s { self.text(*s).map(str::to_owned) } else { None }).collect()
    }

    fn storage_meta(&self, state: V) -> Option<StorageMeta> {
        let [checkpoint_id, save_id, load_id, modules] = self.fields(state, &STORAGE_META)?;
        Some(StorageMeta {
            checkpoint_id: match checkpoint_id {
                None | Some(V::None) => Value::None,
                Some(V::Str(s)) => Value::Str(self.text(s)?.to_owned()),
                Some(V::Path(id)) => Value::Str(self.paths.get(id as usize)?.0.clone()),
                Some(V::Int(i)) => Value::Int(i),
                Some(V::Bool(b)) => Value::Bool(b),
                Some(_) => return None,
            },
            save_id: self.opt_string(save_id)?,
            load_id: self.opt_string(load_id)?,
            modules: match modules {
                None | Some(V::None) => None,
                Some(m) => Some(self.strings(m)?),
            },
        })
    }

    /// A list or tuple of made chunks, taken (a list of them is used only once: it is not memoized under a
    /// key that is read, and a typed object is built only before it is used).
    fn take_chunks(&mut self, v: V) -> Option<Vec<ChunkStorageMetadata>> {
        if let V::Heap(id) = v {
            let obj = self.heap.get_mut(id as usize)?;
            if obj.memo_read {
                return None;
            }
            if let Kind::List(items @ Items::Chunks(_)) = &mut obj.kind {
                let Items::Chunks(chunks) = std::mem::replace(items, Items::Owned(Vec::new())) else { return None };
                return Some(chunks);
            }
        }
        let values = self.seq(v)?.to_vec();
        values
            .iter()
            .map(|v| match v {
                V::Made(m) if m.class == Class::Chunk => self.made.chunks.take(m.slot),
                _ => None,
            })
            .collect()
    }

    fn tensor(&mut self, state: V) -> Option<TensorStorageMetadata> {
        let [properties, size, chunks] = self.fields(state, &TENSOR)?;
        let size = self.size(size?)?;
        let properties = match properties? {
            V::Made(m) if matches!(m.class, Class::Properties { .. }) => self.made.properties.take(m.slot)?,
            _ => return None,
        };
        let chunks = self.take_chunks(chunks?)?;
        Some(TensorStorageMetadata { properties, size, chunks })
    }

    fn planner_data(&self, v: Option<V>) -> Option<Option<PlannerData>> {
        let pairs = match v {
            None | Some(V::None) => return Some(None),
            Some(d) => self.dict(d)?,
        };
        let mut out = Vec::with_capacity(pairs.len() / 2);
        for pair in pairs.chunks_exact(2) {
            let [V::Str(key), path] = pair else { continue };
            let key = self.text(*key)?;
            let Some(items) = self.seq(*path) else { continue };
            let path: Option<Vec<PathItem>> = items
                .iter()
                .map(|p| match p {
                    V::Str(s) => self.text(*s).map(|s| PathItem::Key(s.to_owned())),
                    V::Int(i) => usize::try_from(*i).ok().map(PathItem::Index),
                    _ => None,
                })
                .collect();
            if let Some(path) = path.filter(|p| !p.is_empty()) {
                out.push((key.to_owned(), path));
            }
        }
        Some(Some(out))
    }

    /// `storage_data`: a dict of made index / info pairs, taken.
    fn take_storage(&mut self, v: V) -> Option<Vec<(MetadataIndex, StorageInfo)>> {
        let V::Heap(id) = v else { return None };
        let obj = self.heap.get_mut(id as usize)?;
        if obj.memo_read {
            return None;
        }
        if let Kind::Dict(items @ Items::Storage(_)) = &mut obj.kind {
            let Items::Storage(pairs) = std::mem::replace(items, Items::Owned(Vec::new())) else { return None };
            return Some(pairs);
        }
        let values = self.dict(v)?.to_vec();
        let mut out = Vec::with_capacity(values.len() / 2);
        for pair in values.chunks_exact(2) {
            let [V::Made(k), V::Made(i)] = pair else { return None };
            if k.class != Class::Index || i.class != Class::Info {
                return None;
            }
            out.push((self.made.indexes.take(k.slot)?, self.made.infos.take(i.slot)?));
        }
        Some(out)
    }

    fn storage_metadata(&mut self, v: V) -> Option<StorageMetadata> {
        match v {
            V::Made(m) if m.class == Class::TensorStorage => {
                self.made.tensors.take(m.slot).map(StorageMetadata::Tensor)
            }
            V::Heap(id) => match self.heap.get(id as usize)?.kind {
                Kind::Typed { class: Class::BytesStorage, .. } => Some(StorageMetadata::Bytes),
                _ => None,
            },
            _ => None,
        }
    }

    fn metadata(&mut self, state: V) -> Option<Metadata> {
        let [sdm, planner, storage, meta, version] = self.fields(state, &METADATA)?;
        let sdm = self.dict(sdm?)?.to_vec();
        let mut state_dict_metadata = Vec::with_capacity(sdm.len() / 2);
        let mut seen = HashSet::with_capacity(sdm.len() / 2);
        for pair in sdm.chunks_exact(2) {
            let [V::Str(key), v] = pair else { return None };
            let key = self.text(*key)?;
            if !seen.insert(key) {
                return None;
            }
            state_dict_metadata.push((key.to_owned(), self.storage_metadata(*v)?));
        }
        let storage_data = self.take_storage(storage?)?;
        let storage_meta = match meta {
            None | Some(V::None) => None,
            Some(V::Made(m)) if m.class == Class::StorageMeta => Some(self.made.storage_metas.take(m.slot)?),
            Some(V::Heap(id)) => match self.heap.get(id as usize)?.kind {
                Kind::Typed { class: Class::StorageMeta, state: None, .. } => {
                    Some(StorageMeta { checkpoint_id: Value::None, save_id: None, load_id: None, modules: None })
                }
                _ => return None,
            },
            Some(_) => return None,
        };
        Some(Metadata {
            state_dict_metadata,
            planner_data: self.planner_data(planner)?,
            storage_data,
            storage_meta,
            version: self.opt_string(version)?,
        })
    }
}

fn is_made(v: &V, class: Class) -> bool {
    matches!(v, V::Made(m) if m.class == class)
}

fn uint(v: V) -> Option<usize> {
    match v {
        V::Int(i) if i >= 0 => usize::try_from(i).ok(),
        V::Bool(b) => Some(usize::from(b)),
        _ => None,
    }
}

fn u64_of(v: V) -> Option<u64> {
    match v {
        V::Int(i) if i >= 0 => u64::try_from(i).ok(),
        _ => None,
    }
}

fn bool_of(v: V) -> Option<bool> {
    match v {
        V::Bool(b) => Some(b),
        V::Int(i) => Some(i != 0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::path::Path;

    use super::*;
    use crate::metadata::single_pass::tests::{fixtures, full_decode, info_used_twice, mutated_fixtures, sharded};
    use crate::metadata::{METADATA_MODULE, Profile};

    /// [`decode`], the common objects read straight from their bytes (`fast`) or the general way.
    fn decode_as(bytes: &[u8], limits: &Limits, fast: bool) -> Option<Metadata> {
        let mut vm = Vm::new(bytes, limits, MemoReads::scan(bytes)?);
        vm.fast = fast;
        vm.run()
    }

    #[test]
    fn builds_what_the_full_decoder_builds_for_every_fixture() {
        let fixtures = fixtures();
        assert!(fixtures.len() >= 20, "{}", fixtures.len());
        for fast in [true, false] {
            for (path, bytes) in &fixtures {
                let made = decode_as(bytes, &Limits::default(), fast)
                    .unwrap_or_else(|| panic!("{} declined (fast: {fast})", path.display()));
                assert_eq!(made, full_decode(bytes).unwrap(), "{}", path.display());
            }
            for profile in [Profile::MaxCompat, Profile::Torch213] {
                let bytes = sharded(16, 7).to_pickle(profile).unwrap();
                let made = decode_as(&bytes, &Limits::default(), fast).unwrap();
                assert_eq!(made, full_decode(&bytes).unwrap());
            }
        }
    }

    #[test]
    fn holds_what_is_open_not_the_whole_pickle() {
        // 64 ranks × 50 keys: 3200 chunks and items. What a BUILD made drops everything created since its
        // object, so at the end the machine holds about the open containers, not one record per chunk.
        for (profile, fast) in [Profile::MaxCompat, Profile::Torch213].into_iter().flat_map(|p| [(p, true), (p, false)])
        {
            let md = sharded(64, 50);
            let bytes = md.to_pickle(profile).unwrap();
            let reads = MemoReads::scan(&bytes).unwrap();
            assert!(reads.count() < 200, "{} memo keys read", reads.count());
            let limits = Limits::default();
            let mut vm = Vm::new(&bytes, &limits, reads);
            vm.fast = fast;
            let back = vm.run().unwrap();
            assert_eq!(back.storage_data, md.storage_data);
            assert_eq!(back.state_dict_metadata.len(), 50);
            assert!(vm.heap.len() < 300, "{} heap records", vm.heap.len());
            assert!(vm.pool.len() < 2000, "{} pooled values", vm.pool.len());
            assert!(vm.tuples.len() < 600, "{} tuples", vm.tuples.len());
            assert!(vm.made.chunks.items.len() < 100, "{} chunk slots", vm.made.chunks.items.len());
        }
    }

    #[test]
    fn declines_or_agrees_on_mutated_fixtures() {
        let (mut agreed, mut declined) = (0, 0);
        for data in mutated_fixtures(0x9e37_79b9_7f4a_7c15, 6000) {
            for fast in [true, false] {
                match decode_as(&data, &Limits::default(), fast) {
                    None => declined += 1,
                    Some(made) => {
                        let full =
                            full_decode(&data).unwrap_or_else(|e| panic!("the machine accepted what fails: {e}"));
                        assert_eq!(made, full, "fast: {fast}");
                        agreed += 1;
                    }
                }
            }
        }
        assert!(agreed > 100 && declined > 100, "{agreed} agreed, {declined} declined");
    }

    #[test]
    fn a_typed_object_used_twice_is_left_to_the_other_decoders() {
        let (bytes, shared) = info_used_twice();
        assert!(decode(&shared, &Limits::default()).is_none());
        let full = full_decode(&shared).unwrap();
        assert_eq!(full.storage_data[1].1, full.storage_data[0].1);
        assert_eq!(Metadata::from_pickle(&shared, Path::new("t")).unwrap(), full);
        // Truncation is a decline, never a panic.
        assert!(decode(&bytes[..bytes.len() / 2], &Limits::default()).is_none());
    }

    #[test]
    fn the_fast_objects_count_every_limit_as_the_general_way() {
        // At every value of each limit, reading the common objects straight from their bytes accepts exactly
        // when the general way does (their sizes, creations and payload are counted the same).
        let mut inputs: Vec<Vec<u8>> = fixtures().into_iter().map(|(_, b)| b).take(6).collect();
        inputs.push(sharded(4, 3).to_pickle(Profile::Torch213).unwrap());
        inputs.push(sharded(4, 3).to_pickle(Profile::MaxCompat).unwrap());
        for bytes in &inputs {
            let same = |limits: Limits| {
                let (fast, general) = (decode_as(bytes, &limits, true), decode_as(bytes, &limits, false));
                assert_eq!(fast.is_some(), general.is_some(), "{limits:?}");
                fast.is_some()
            };
            let mut accepted = 0;
            for n in (1..4000).step_by(7) {
                accepted += usize::from(same(Limits { max_nodes: n, ..Limits::default() }));
                accepted += usize::from(same(Limits { max_alloc_bytes: n, ..Limits::default() }));
            }
            for n in 1..30 {
                accepted += usize::from(same(Limits { max_depth: n, ..Limits::default() }));
                accepted += usize::from(same(Limits { max_mark_depth: n, ..Limits::default() }));
                accepted += usize::from(same(Limits { max_memo: n * 10, ..Limits::default() }));
                accepted += usize::from(same(Limits { max_container_len: n, ..Limits::default() }));
            }
            assert!(accepted > 0);
        }
    }

    #[test]
    fn a_mark_before_newobj_is_seen_by_both_ways() {
        // `NEWOBJ` pops its class and arguments from above the innermost mark: with a MARK put just before
        // it, both ways decline (the full decoder fails too).
        let bytes = sharded(2, 2).to_pickle(Profile::Torch213).unwrap();
        let at: Vec<usize> =
            bytes.windows(2).enumerate().filter(|(_, w)| w == &[b')', 0x81]).map(|(i, _)| i + 1).collect();
        assert!(at.len() > 4);
        for i in at {
            let mut marked = bytes.clone();
            marked.insert(i, b'(');
            for fast in [true, false] {
                assert!(decode_as(&marked, &Limits::default(), fast).is_none(), "fast: {fast}");
            }
            assert!(full_decode(&marked).is_err());
        }
    }

    #[test]
    fn the_fast_objects_take_their_class_from_above_the_mark_only() {
        // A chunk's bytes after its NEWOBJ, its `torch.Size`s called through memo key 0; on the stack the
        // class and the empty tuple, as NEWOBJ finds them.
        let body =
            b"\x94}\x94(\x8c\x07offsetsh\x00K\x00\x85\x94\x85\x94R\x94\x8c\x05sizesh\x00K\x01\x85\x94\x85\x94R\x94ub.";
        let limits = Limits::default();
        let run = |mark_before_class: bool| {
            let mut vm = Vm::new(body, &limits, MemoReads::scan(body).unwrap());
            vm.new_global("torch", "Size").unwrap();
            let size = vm.pop().unwrap();
            vm.memo_len = 1;
            vm.memo[0] = size;
            if mark_before_class {
                vm.marks.push(vm.stack.len());
            }
            vm.new_global(METADATA_MODULE, "ChunkStorageMetadata").unwrap();
            vm.push(V::Tuple(EMPTY_TUPLE)).unwrap();
            if !mark_before_class {
                vm.marks.push(vm.stack.len());
            }
            (vm.typed_object(), vm.stack.last().copied())
        };
        // Class and arguments above the mark: made. Below it (NEWOBJ would fail to pop them): left alone.
        let (made, top) = run(true);
        assert_eq!(made, Some(true));
        assert!(matches!(top, Some(V::Made(Made { class: Class::Chunk, .. }))));
        assert_eq!(run(false).0, Some(false));
    }

    #[test]
    fn limits_are_kept_as_the_full_decoder_keeps_them() {
        let bytes = sharded(8, 4).to_pickle(Profile::Torch213).unwrap();
        for limits in [
            Limits { max_nodes: 200, ..Limits::default() },
            Limits { max_depth: 4, ..Limits::default() },
            Limits { max_alloc_bytes: 300, ..Limits::default() },
            Limits { max_memo: 10, ..Limits::default() },
            Limits { max_mark_depth: 1, ..Limits::default() },
            Limits { max_container_len: 3, ..Limits::default() },
        ] {
            // Whatever the full decoder refuses, the machine declines; what it accepts, the machine builds
            // the same or declines.
            for fast in [true, false] {
                match (decode_as(&bytes, &limits, fast), Metadata::from_pickle_full(&bytes, Path::new("t"), &limits)) {
                    (None, _) => {}
                    (Some(made), Ok(full)) => assert_eq!(made, full),
                    (Some(_), Err(e)) => panic!("the machine accepted what the full decoder refuses ({e}): {limits:?}"),
                }
            }
        }
        // A memo bomb: a list holding itself 2^40 times over, through a memoized list, declines at once.
        let mut bomb = vec![0x80, 4, b']', 0x94];
        for _ in 0..40 {
            bomb.extend_from_slice(&[b']', 0x94, b'(', b'h', 0, b'h', 0, b'e', 0x94]);
            // Rebind memo 0 to the new list, so the next level holds it twice.
            bomb.extend_from_slice(&[b'q', 0]);
        }
        bomb.push(b'.');
        assert!(decode(&bomb, &Limits::default()).is_none());
    }
}
