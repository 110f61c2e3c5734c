//! The single-pass decoder: a pickle VM that hands every object it creates to a [`Builder`], which decides
//! what the object becomes (a [`Value`](crate::Value), or a caller's own compact struct), so a consumer that
//! knows the classes it expects never holds a generic tree of the whole pickle.
//!
//! # How it keeps the memo's semantics without a graph
//! Before running, the VM scans the opcode stream (the stream is context-free, like `pickletools.genops`)
//! for the memo keys that some GET reads. A MEMOIZE/PUT of any other key only counts towards
//! [`Limits::max_memo`]: nothing can ever see it again, so the object stays *owned* by whoever consumes it and
//! can be built in place. An object memoized under a key that is read is moved to a *shared* table; GETs
//! push references to it, and mutations (APPEND, SETITEMS, BUILD, ...) through any reference change it there.
//! When a shared object is consumed (put into a container, passed to a call, ...) the builder makes a copy
//! ([`Builder::share`]) and the object is *frozen*: a later mutation would have to be seen through the copy,
//! which a tree cannot express, so the VM [declines](Declined) instead (CPython writes that only for
//! self-referencing structures). The same holds for DUP.
//!
//! # Constructs read straight from the input
//! A builder that knows a run of opcodes by heart can read it itself ([`Builder::construct`], at a GET):
//! torch's tensor record, for one, is thirty-odd opcodes of one shape. It reports each opcode to a [`Tally`],
//! which counts what the VM would have counted, and the VM takes the construct's value only if those counts
//! pass every limit and no memo key the construct writes is ever read; otherwise it runs the opcodes itself.
//!
//! # Limits and errors
//! Every [`Limits`] value is enforced, conservatively: the materialised node count, payload bytes and depth are
//! computed on the fly (a memoized object consumed `k` times counts `k` times, before it is copied), so memo
//! bombs and deep nesting are refused before anything is built. The VM never reports *why* it stopped: any
//! malformed input, exceeded limit, unsupported opcode or builder refusal ends in [`Declined`], and the caller
//! runs the full decoder ([`decode_with`](crate::decode_with)), which gives the precise [`Error`](crate::Error)
//! (or, for the rare valid pickle this VM declines, the value). [`decode_with`](crate::decode_with) itself does
//! exactly that with a builder of [`Value`](crate::Value)s.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use crate::bigint::{IntRepr, from_le_twos};
use crate::limits::Limits;
use crate::opcode as op;
use crate::text;

mod construct;
mod values;

pub use construct::{Construct, Memo, Tally};
pub(crate) use values::ValueBuilder;

/// The single-pass decoder gave up on this input; decode it with [`decode_with`](crate::decode_with), which
/// returns the precise error (or the value, for the few valid pickles this path does not handle: an object
/// mutated after a copy of it was taken, a second BUILD, a builder's refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the single-pass pickle decoder declined this input")
    }
}

impl std::error::Error for Declined {}

/// What a MARK-delimited or fixed-size sequence opcode builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sequence {
    /// LIST, EMPTY_LIST.
    List,
    /// TUPLE, TUPLE1-3, EMPTY_TUPLE; also the arguments of INST and OBJ.
    Tuple,
    /// EMPTY_SET.
    Set,
    /// FROZENSET.
    FrozenSet,
}

/// A call the pickle records (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ): never made, handed to
/// [`Builder::object`].
#[derive(Debug)]
pub struct Call<V> {
    /// Which opcode, with NEWOBJ_EX's keyword arguments.
    pub kind: CallKind<V>,
    /// What is called (usually a global).
    pub callable: V,
    /// The positional arguments (a tuple for every opcode but REDUCE, which takes whatever is on the stack).
    pub args: V,
}

/// The opcode of a [`Call`].
#[derive(Debug)]
pub enum CallKind<V> {
    /// REDUCE: `callable(*args)`.
    Reduce,
    /// NEWOBJ: `cls.__new__(cls, *args)`.
    NewObj,
    /// NEWOBJ_EX: `cls.__new__(cls, *args, **kwargs)`.
    NewObjEx {
        /// The keyword arguments.
        kwargs: V,
    },
    /// INST (protocol 0): the class named by the opcode, the items after the MARK as a tuple.
    Inst,
    /// OBJ (protocol 1): the first item after the MARK, the rest as a tuple.
    Obj,
}

/// The items of a container opcode, taken off the VM's stack in order.
pub type Items<'s, V> = std::vec::Drain<'s, V>;

/// The key/value pairs of DICT, SETITEM and SETITEMS, taken off the VM's stack in order.
#[derive(Debug)]
pub struct Pairs<'s, V>(std::vec::Drain<'s, V>);

impl<V> Iterator for Pairs<'_, V> {
    type Item = (V, V);

    fn next(&mut self) -> Option<(V, V)> {
        let k = self.0.next()?;
        let v = self.0.next()?;
        Some((k, v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.len() / 2;
        (n, Some(n))
    }
}

impl<V> ExactSizeIterator for Pairs<'_, V> {}

/// Builds the values of a pickle as [`build`] runs it. Every method may refuse with [`Declined`] (for
/// example a mutation of something that cannot be mutated, or a shape the builder does not model), which
/// stops the run.
///
/// Text and bytes borrow from the input where the pickle stores them verbatim (`Cow::Borrowed`), so a builder
/// can keep them without copying.
pub trait Builder<'a> {
    /// What the builder makes.
    type Value;

    /// `None`.
    fn none(&mut self) -> Self::Value;
    /// `True` / `False`.
    fn bool(&mut self, v: bool) -> Self::Value;
    /// An integer that fits `i64`.
    fn int(&mut self, v: i64) -> Self::Value;
    /// A float.
    fn float(&mut self, v: f64) -> Self::Value;
    /// An integer that does not fit `i64` (little-endian two's complement, minimal length).
    fn big_int(&mut self, le_twos: Vec<u8>) -> Result<Self::Value, Declined>;
    /// A `str`.
    fn str(&mut self, s: Cow<'a, str>) -> Result<Self::Value, Declined>;
    /// A `bytes` (or Python 2 `str`), or with `bytearray` a `bytearray`.
    fn bytes(&mut self, b: Cow<'a, [u8]>, bytearray: bool) -> Result<Self::Value, Declined>;
    /// A global named by GLOBAL or INST (`module`, `name` exactly as written).
    fn global(&mut self, module: &'a str, name: &'a str) -> Result<Self::Value, Declined>;
    /// STACK_GLOBAL on two values (which must be `str`s).
    fn stack_global(&mut self, module: Self::Value, name: Self::Value) -> Result<Self::Value, Declined>;
    /// A list, tuple, set or frozenset with these items.
    fn sequence(&mut self, kind: Sequence, items: Items<'_, Self::Value>) -> Result<Self::Value, Declined>;
    /// A dict with these pairs.
    fn dict(&mut self, pairs: Pairs<'_, Self::Value>) -> Result<Self::Value, Declined>;
    /// A persistent id (BINPERSID's argument, or PERSID's text as a `str`).
    fn persistent_id(&mut self, pid: Self::Value) -> Result<Self::Value, Declined>;
    /// The result of a call.
    fn object(&mut self, call: Call<Self::Value>) -> Result<Self::Value, Declined>;
    /// APPEND / APPENDS on `target` (a list, or an object that records appended items).
    fn append(&mut self, target: &mut Self::Value, items: Items<'_, Self::Value>) -> Result<(), Declined>;
    /// SETITEM / SETITEMS on `target` (a dict, or an object that records set items).
    fn set_items(&mut self, target: &mut Self::Value, pairs: Pairs<'_, Self::Value>) -> Result<(), Declined>;
    /// ADDITEMS on `target` (a set).
    fn add_items(&mut self, target: &mut Self::Value, items: Items<'_, Self::Value>) -> Result<(), Declined>;
    /// BUILD on `target` (an object) with `state`.
    fn build(&mut self, target: &mut Self::Value, state: Self::Value) -> Result<(), Declined>;
    /// A copy of `v` for one more reference to it (the VM has checked, before calling, that the copy stays
    /// within the limits).
    fn share(&mut self, v: &Self::Value) -> Result<Self::Value, Declined>;

    /// Reads the construct that starts with the GET at `at` (`data[at]` is BINGET or LONG_BINGET) straight
    /// from the input, if the builder knows it, reporting every opcode it reads to a [`Tally`] (see
    /// [`Construct`]'s module); `None` lets the VM run the opcodes. The VM takes the construct only if the same
    /// opcodes would have passed every limit and no memo key it writes is ever read, and runs the opcodes
    /// itself otherwise: so the value must be exactly what the VM's calls to the builder would have made of
    /// them, and nothing the builder does here may change what its later calls do. The default reads none.
    fn construct(&mut self, data: &'a [u8], at: usize, memo: &Memo<'_, Self::Value>) -> Option<Construct<Self::Value>> {
        let _ = (data, at, memo);
        None
    }
}

/// Runs the pickle at the start of `data` under `limits`, handing every object to `builder`; returns what the
/// builder made of the pickled object and the number of bytes consumed (the position just after STOP).
///
/// # Errors
/// [`Declined`] for malformed input, exceeded limits, unsupported opcodes, the builder's refusals and the
/// memo patterns described in the [module docs](self); [`decode_with`](crate::decode_with) then gives the
/// precise error or the value.
pub fn build<'a, B: Builder<'a>>(
    data: &'a [u8],
    limits: &Limits,
    builder: &mut B,
) -> Result<(B::Value, usize), Declined> {
    if limits.max_depth == 0 {
        return Err(Declined);
    }
    let reads = memo_reads(data)?;
    let mut vm = Vm {
        data,
        pos: 0,
        limits,
        builder,
        vals: Vec::new(),
        meta: Vec::new(),
        marks: Vec::new(),
        shared: Vec::new(),
        memo: MemoIds::new(reads),
        written: Written::default(),
        vm_nodes: 0,
        vm_bytes: 0,
        copy_budget: (
            usize_u64(data.len()).saturating_mul(COPY_BUDGET_PER_BYTE).saturating_add(1 << 16),
            usize_u64(data.len()).saturating_mul(COPY_BUDGET_PER_BYTE).saturating_add(1 << 24),
        ),
    };
    let root = vm.run()?;
    Ok((root, vm.pos))
}

/// How many nodes and payload bytes copies of shared objects may take per input byte. A real pickle copies a
/// few globals and short strings per object (a DCP `.metadata` copies about 2.5 bytes per input byte, a
/// `data.pkl` less than one); a memo bomb would copy exponentially many.
const COPY_BUDGET_PER_BYTE: u64 = 16;

// ----- the memo-read scan -----

/// A set of memo keys: a bitmap for the small keys CPython writes, a (randomly seeded) hash set for sparse
/// huge ones.
#[derive(Default)]
struct KeySet {
    bits: Vec<u64>,
    sparse: HashSet<u64>,
    len: usize,
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

/// The memo keys PUT so far. CPython writes keys 0, 1, 2, ... in order (MEMOIZE always does), which needs
/// no set; anything else switches to a [`KeySet`].
#[derive(Default)]
struct Written {
    /// Keys `0..prefix` are written (and, while `set` is `None`, no others).
    prefix: u64,
    set: Option<KeySet>,
}

impl Written {
    /// Whether `key` was written.
    fn contains(&self, key: u64) -> bool {
        match &self.set {
            Some(set) => set.contains(key),
            None => key < self.prefix,
        }
    }

    fn len(&self) -> usize {
        match &self.set {
            Some(set) => set.len,
            None => usize::try_from(self.prefix).unwrap_or(usize::MAX),
        }
    }

    /// Inserts `key`; whether it was new.
    #[inline]
    fn insert(&mut self, key: u64) -> bool {
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

/// The memo keys that GET, BINGET and LONG_BINGET read before the first STOP.
fn memo_reads(data: &[u8]) -> Result<KeySet, Declined> {
    let mut keys = KeySet::default();
    let len = data.len();
    // Memo keys are at most one per opcode in what CPython writes; a bitmap up to 8 keys per input byte costs
    // at most the input's size.
    let limit = (len as u64).saturating_mul(8).saturating_add(4096);
    let mut pos = 0usize;
    let line_end = |pos: usize| -> Result<usize, Declined> {
        let rest = data.get(pos..).ok_or(Declined)?;
        rest.iter().position(|&b| b == b'\n').map(|i| pos + i + 1).ok_or(Declined)
    };
    loop {
        let &code = data.get(pos).ok_or(Declined)?;
        pos += 1;
        match op::argument(code) {
            op::Argument::Fixed(n) => pos += usize::from(n),
            op::Argument::Get(n) => {
                let n = usize::from(n);
                keys.insert_with_limit(op::le_at(data, pos, n).ok_or(Declined)?, limit);
                pos += n;
            }
            op::Argument::Counted(n) => {
                let n = usize::from(n);
                let count = op::le_at(data, pos, n).ok_or(Declined)?;
                let count = usize::try_from(count).map_err(|_| Declined)?;
                pos = pos.checked_add(n).and_then(|p| p.checked_add(count)).ok_or(Declined)?;
            }
            op::Argument::SignedCounted => {
                let count = op::le_at(data, pos, 4).ok_or(Declined)?;
                if count > i32::MAX as u64 {
                    return Err(Declined);
                }
                pos = pos.checked_add(4 + count as usize).ok_or(Declined)?;
            }
            op::Argument::Lines(n) => {
                pos = line_end(pos)?;
                if n == 2 {
                    pos = line_end(pos)?;
                }
            }
            op::Argument::GetLine => {
                let end = line_end(pos)?;
                let line = data.get(pos..end - 1).ok_or(Declined)?;
                match text::parse_py_int(line, 10, 40) {
                    Ok(IntRepr::Small(v)) if v >= 0 => {
                        keys.insert_with_limit(v as u64, limit);
                    }
                    _ => return Err(Declined),
                }
                pos = end;
            }
            op::Argument::Stop => return Ok(keys),
            op::Argument::Invalid => return Err(Declined),
        }
        if pos > len {
            return Err(Declined);
        }
    }
}

/// The memo keys some GET reads, each with the shared-table id it holds (once PUT).
struct MemoIds {
    reads: KeySet,
    /// Number of read keys in the bitmap before each bitmap word (rank of the word's first bit).
    ranks: Vec<u32>,
    /// Shared-table id per read key of the bitmap, by rank.
    dense: Vec<u32>,
    /// Shared-table id per read key outside the bitmap.
    sparse: HashMap<u64, u32>,
}

const NO_ID: u32 = u32::MAX;

impl MemoIds {
    fn new(reads: KeySet) -> Self {
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
    fn is_read(&self, key: u64) -> bool {
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

    #[inline]
    fn get(&self, key: u64) -> Option<u32> {
        let id = match self.dense_slot(key) {
            Some(slot) => self.dense.get(slot).copied().unwrap_or(NO_ID),
            None => self.sparse.get(&key).copied().unwrap_or(NO_ID),
        };
        (id != NO_ID).then_some(id)
    }

    fn set(&mut self, key: u64, id: u32) {
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

// ----- the VM -----

/// What the VM knows about a value: its expanded size and depth (for the limits) and, while it is being
/// filled, its length; for a stack slot, which shared object it refers to.
#[derive(Debug, Clone, Copy)]
struct Meta {
    nodes: u64,
    bytes: u64,
    /// Items (saturating).
    len: u32,
    depth: u32,
    shared: u32,
    /// A scalar, string, bytes, big int or global: nothing can mutate it.
    leaf: bool,
}

impl Meta {
    const SCALAR: Meta = Meta { nodes: 1, bytes: 0, len: 0, depth: 1, shared: NO_ID, leaf: true };

    fn leaf(bytes: usize) -> Meta {
        Meta { bytes: bytes as u64, ..Meta::SCALAR }
    }
}

/// Sum of the sizes and maximum depth of a group of children.
#[derive(Debug, Clone, Copy, Default)]
struct Children {
    nodes: u64,
    bytes: u64,
    depth: u32,
    count: u64,
}

impl Children {
    fn add(&mut self, m: &Meta) {
        self.nodes = self.nodes.saturating_add(m.nodes);
        self.bytes = self.bytes.saturating_add(m.bytes);
        self.depth = self.depth.max(m.depth);
        self.count += 1;
    }

    /// The meta of a new container holding these children (with `own` payload bytes).
    fn container(&self, own: usize) -> Meta {
        Meta {
            nodes: self.nodes.saturating_add(1),
            bytes: self.bytes.saturating_add(own as u64),
            len: u32::try_from(self.count).unwrap_or(u32::MAX),
            depth: self.depth.saturating_add(1),
            shared: NO_ID,
            leaf: false,
        }
    }
}

/// What a mutation opcode does to its target.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    Append,
    SetItems,
    AddItems,
    Build,
}

struct Shared<V> {
    value: V,
    meta: Meta,
    frozen: bool,
}

struct Vm<'a, 'l, 'b, B: Builder<'a>> {
    data: &'a [u8],
    pos: usize,
    limits: &'l Limits,
    builder: &'b mut B,
    /// The stack's values; a slot referring to a shared object holds a placeholder (`none`).
    vals: Vec<B::Value>,
    /// The stack's metadata, one per value.
    meta: Vec<Meta>,
    marks: Vec<usize>,
    shared: Vec<Shared<B::Value>>,
    memo: MemoIds,
    /// Memo keys PUT so far (for `max_memo` and MEMOIZE's key).
    written: Written,
    vm_nodes: u64,
    vm_bytes: u64,
    /// Nodes and payload bytes that copies of shared objects may still take.
    copy_budget: (u64, u64),
}

type R<T> = Result<T, Declined>;

fn usize_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl<'a, B: Builder<'a>> Vm<'a, '_, '_, B> {
    // ----- input -----

    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(Declined)?;
        let s = self.data.get(self.pos..end).ok_or(Declined)?;
        self.pos = end;
        Ok(s)
    }

    fn take_len(&mut self, n: u64) -> R<&'a [u8]> {
        self.take(usize::try_from(n).map_err(|_| Declined)?)
    }

    fn arr<const N: usize>(&mut self) -> R<[u8; N]> {
        let s = self.take(N)?;
        <[u8; N]>::try_from(s).map_err(|_| Declined)
    }

    fn u8(&mut self) -> R<u8> {
        Ok(self.arr::<1>()?[0])
    }

    fn u16(&mut self) -> R<u16> {
        self.arr().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> R<u32> {
        self.arr().map(u32::from_le_bytes)
    }

    fn i32(&mut self) -> R<i32> {
        self.arr().map(i32::from_le_bytes)
    }

    fn u64(&mut self) -> R<u64> {
        self.arr().map(u64::from_le_bytes)
    }

    fn line(&mut self) -> R<&'a [u8]> {
        let rest = self.data.get(self.pos..).ok_or(Declined)?;
        let i = rest.iter().position(|&b| b == b'\n').ok_or(Declined)?;
        self.pos += i + 1;
        rest.get(..i).ok_or(Declined)
    }

    // ----- limits -----

    fn check(&self, m: &Meta) -> R<()> {
        let l = self.limits;
        if m.nodes > usize_u64(l.max_nodes)
            || m.bytes > usize_u64(l.max_alloc_bytes)
            || m.depth as usize > l.max_depth
            || u64::from(m.len) > usize_u64(l.max_container_len)
        {
            return Err(Declined);
        }
        Ok(())
    }

    /// Counts a node the VM creates with `bytes` of payload (the VM-side node and payload limits).
    fn count_node(&mut self, bytes: usize) -> R<()> {
        self.vm_nodes += 1;
        self.vm_bytes = self.vm_bytes.saturating_add(usize_u64(bytes));
        if self.vm_nodes >= usize_u64(self.limits.max_nodes.min(u32::MAX as usize))
            || self.vm_bytes > usize_u64(self.limits.max_alloc_bytes)
        {
            return Err(Declined);
        }
        Ok(())
    }

    // ----- stack -----

    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn push(&mut self, v: B::Value, m: Meta) -> R<()> {
        if self.vals.len() >= self.limits.max_container_len {
            return Err(Declined);
        }
        self.check(&m)?;
        self.vals.push(v);
        self.meta.push(m);
        Ok(())
    }

    fn push_scalar(&mut self, v: B::Value) -> R<()> {
        // A scalar is within every limit (`build` has checked that depth 1 is allowed).
        if self.vals.len() >= self.limits.max_container_len {
            return Err(Declined);
        }
        self.vals.push(v);
        self.meta.push(Meta::SCALAR);
        Ok(())
    }

    /// Pushes a new leaf node (string, bytes, ...) with `bytes` of payload.
    fn push_leaf(&mut self, v: B::Value, bytes: usize) -> R<()> {
        // The VM's payload limit, checked here, bounds the leaf's bytes too.
        self.count_node(bytes)?;
        if self.vals.len() >= self.limits.max_container_len {
            return Err(Declined);
        }
        self.vals.push(v);
        self.meta.push(Meta::leaf(bytes));
        Ok(())
    }

    /// Makes slot `i` an owned value: a shared reference becomes a copy of the shared object, which is frozen.
    fn own(&mut self, i: usize) -> R<Meta> {
        let m = *self.meta.get(i).ok_or(Declined)?;
        if m.shared == NO_ID {
            return Ok(m);
        }
        let s = self.shared.get_mut(m.shared as usize).ok_or(Declined)?;
        // Copies are paid for from a budget proportional to the input, so that sharing cannot make this
        // decoder do more than linear work (memo bombs are left to the full decoder, which measures them
        // without copying).
        self.copy_budget.0 = self.copy_budget.0.checked_sub(s.meta.nodes).ok_or(Declined)?;
        self.copy_budget.1 = self.copy_budget.1.checked_sub(s.meta.bytes).ok_or(Declined)?;
        s.frozen = true;
        let copy = self.builder.share(&s.value)?;
        let sm = Meta { shared: NO_ID, ..s.meta };
        let slot = self.vals.get_mut(i).ok_or(Declined)?;
        *slot = copy;
        if let Some(mm) = self.meta.get_mut(i) {
            *mm = sm;
        }
        Ok(sm)
    }

    /// Pops one value above the innermost MARK, owned.
    fn pop(&mut self) -> R<(B::Value, Meta)> {
        if self.vals.len() <= self.fence() {
            return Err(Declined);
        }
        let m = self.own(self.vals.len() - 1)?;
        let v = self.vals.pop().ok_or(Declined)?;
        self.meta.pop();
        Ok((v, m))
    }

    /// Pops the innermost MARK and returns the stack index it marked, with every value above it owned and
    /// the sizes of those values.
    fn pop_mark(&mut self) -> R<(usize, Children)> {
        let m = self.marks.pop().ok_or(Declined)?;
        if m > self.vals.len() {
            return Err(Declined);
        }
        let c = self.own_from(m)?;
        Ok((m, c))
    }

    /// Makes every value from stack index `from` up owned, and returns their sizes.
    fn own_from(&mut self, from: usize) -> R<Children> {
        let mut c = Children::default();
        let mut shared = false;
        for m in self.meta.get(from..).unwrap_or_default() {
            shared |= m.shared != NO_ID;
            c.add(m);
        }
        if !shared {
            return Ok(c);
        }
        // Some are references to shared objects: copy them, and count the copies' sizes.
        let mut c = Children::default();
        for i in from..self.vals.len() {
            let mm = self.own(i)?;
            c.add(&mm);
        }
        Ok(c)
    }

    /// Builds a new container from the (owned) values from stack index `from` up, which it replaces.
    fn container(&mut self, kind: Option<Sequence>, from: usize, meta: Meta) -> R<()> {
        self.check(&meta)?;
        self.count_node(0)?;
        if from > self.vals.len() {
            return Err(Declined);
        }
        self.meta.truncate(from);
        let Vm { vals, builder, .. } = self;
        let v = match kind {
            Some(k) => builder.sequence(k, vals.drain(from..))?,
            None => {
                if (vals.len() - from) % 2 != 0 {
                    return Err(Declined);
                }
                builder.dict(Pairs(vals.drain(from..)))?
            }
        };
        // `meta` was checked above; the stack just shrank, so it has room.
        self.vals.push(v);
        self.meta.push(meta);
        Ok(())
    }

    /// Applies `what` to the value at stack index `t` (owned in place, or the shared object it refers to)
    /// with the (owned) values from stack index `from` up, which it removes, after checking that growing the
    /// target by `add` stays within the limits.
    fn mutate(&mut self, t: usize, from: usize, add: Children, what: Mutation) -> R<()> {
        if t >= from || from > self.vals.len() {
            return Err(Declined);
        }
        if matches!(what, Mutation::SetItems) && (self.vals.len() - from) % 2 != 0 {
            return Err(Declined);
        }
        let m = *self.meta.get(t).ok_or(Declined)?;
        let meta = if m.shared == NO_ID {
            self.meta.get_mut(t).ok_or(Declined)?
        } else {
            let s = self.shared.get_mut(m.shared as usize).ok_or(Declined)?;
            if s.frozen {
                return Err(Declined);
            }
            &mut s.meta
        };
        if meta.leaf {
            return Err(Declined);
        }
        let grown = Meta {
            nodes: meta.nodes.saturating_add(add.nodes),
            bytes: meta.bytes.saturating_add(add.bytes),
            len: meta.len.saturating_add(u32::try_from(add.count).unwrap_or(u32::MAX)),
            depth: meta.depth.max(add.depth.saturating_add(1)),
            shared: meta.shared,
            leaf: false,
        };
        let l = self.limits;
        if grown.nodes > usize_u64(l.max_nodes)
            || grown.bytes > usize_u64(l.max_alloc_bytes)
            || grown.depth as usize > l.max_depth
            || u64::from(grown.len) > usize_u64(l.max_container_len)
        {
            return Err(Declined);
        }
        *meta = grown;
        self.meta.truncate(from);
        let Vm { vals, builder, shared, .. } = self;
        // An owned target is taken out of the stack while the items above it are drained.
        let mut owned = None;
        let target = if m.shared == NO_ID {
            let placeholder = builder.none();
            owned.insert(std::mem::replace(vals.get_mut(t).ok_or(Declined)?, placeholder))
        } else {
            &mut shared.get_mut(m.shared as usize).ok_or(Declined)?.value
        };
        let result = {
            let mut items = vals.drain(from..);
            match what {
                Mutation::Append => builder.append(target, items),
                Mutation::SetItems => builder.set_items(target, Pairs(items)),
                Mutation::AddItems => builder.add_items(target, items),
                Mutation::Build => match items.next() {
                    Some(state) => builder.build(target, state),
                    None => Err(Declined),
                },
            }
        };
        if let Some(o) = owned {
            *vals.get_mut(t).ok_or(Declined)? = o;
        }
        result
    }

    /// The stack index of the value just below the items of a MARK at `m` (the target of APPENDS, ...).
    fn target_below(&self, m: usize) -> R<usize> {
        if m == 0 || m <= self.fence() {
            return Err(Declined);
        }
        Ok(m - 1)
    }

    fn top_index(&self) -> R<usize> {
        if self.vals.len() <= self.fence() {
            return Err(Declined);
        }
        Ok(self.vals.len() - 1)
    }

    // ----- memo -----

    fn memo_put(&mut self, key: u64) -> R<()> {
        let t = self.top_index()?;
        if self.written.insert(key) && self.written.len() > self.limits.max_memo {
            return Err(Declined);
        }
        if !self.memo.is_read(key) {
            return Ok(());
        }
        let m = *self.meta.get(t).ok_or(Declined)?;
        let id = if m.shared == NO_ID {
            let id = u32::try_from(self.shared.len()).map_err(|_| Declined)?;
            let placeholder = self.builder.none();
            let value = std::mem::replace(self.vals.get_mut(t).ok_or(Declined)?, placeholder);
            self.shared.push(Shared { value, meta: m, frozen: false });
            if let Some(mm) = self.meta.get_mut(t) {
                mm.shared = id;
            }
            id
        } else {
            m.shared
        };
        self.memo.set(key, id);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> R<()> {
        let id = self.memo.get(key).ok_or(Declined)?;
        let s = self.shared.get_mut(id as usize).ok_or(Declined)?;
        if s.meta.leaf {
            // Nothing can change a leaf: copy it now.
            let m = Meta { shared: NO_ID, ..s.meta };
            self.copy_budget.0 = self.copy_budget.0.checked_sub(m.nodes).ok_or(Declined)?;
            self.copy_budget.1 = self.copy_budget.1.checked_sub(m.bytes).ok_or(Declined)?;
            let copy = self.builder.share(&s.value)?;
            if self.vals.len() >= self.limits.max_container_len {
                return Err(Declined);
            }
            self.vals.push(copy);
            self.meta.push(m);
            return Ok(());
        }
        let placeholder = self.builder.none();
        self.push(placeholder, Meta { shared: id, ..Meta::SCALAR })
    }

    fn text_key(&mut self) -> R<u64> {
        let line = self.line()?;
        match text::parse_py_int(line, 10, self.limits.max_int_digits) {
            Ok(IntRepr::Small(v)) => u64::try_from(v).map_err(|_| Declined),
            _ => Err(Declined),
        }
    }

    // ----- values -----

    fn int(&mut self, repr: IntRepr) -> R<()> {
        match repr {
            IntRepr::Small(v) => {
                let v = self.builder.int(v);
                self.push_scalar(v)
            }
            IntRepr::Big(b) => {
                let n = b.len();
                let v = self.builder.big_int(b)?;
                self.push_leaf(v, n)
            }
        }
    }

    fn str_bytes(&mut self, b: &'a [u8]) -> R<()> {
        let s = std::str::from_utf8(b).map_err(|_| Declined)?;
        let v = self.builder.str(Cow::Borrowed(s))?;
        self.push_leaf(v, b.len())
    }

    fn bytes(&mut self, b: &'a [u8], bytearray: bool) -> R<()> {
        let v = self.builder.bytes(Cow::Borrowed(b), bytearray)?;
        self.push_leaf(v, b.len())
    }

    fn global_names(&mut self) -> R<(&'a str, &'a str)> {
        let module = self.line()?;
        let name = self.line()?;
        if module.is_empty() || name.is_empty() {
            return Err(Declined);
        }
        let m = std::str::from_utf8(module).map_err(|_| Declined)?;
        let n = std::str::from_utf8(name).map_err(|_| Declined)?;
        Ok((m, n))
    }

    /// Pushes a new sequence of the values above the MARK at `m`.
    fn sequence_from(&mut self, kind: Sequence, m: usize, c: Children) -> R<()> {
        self.container(Some(kind), m, c.container(0))
    }

    fn empty(&mut self, kind: Option<Sequence>) -> R<()> {
        let len = self.vals.len();
        self.container(kind, len, Children::default().container(0))
    }

    fn object(
        &mut self,
        kind: CallKind<B::Value>,
        callable: (B::Value, Meta),
        args: (B::Value, Meta),
        extra: Option<Meta>,
    ) -> R<()> {
        let mut c = Children::default();
        c.add(&callable.1);
        c.add(&args.1);
        if let Some(e) = extra {
            c.add(&e);
        }
        let meta = Meta { len: 0, ..c.container(0) };
        self.check(&meta)?;
        self.count_node(0)?;
        let v = self.builder.object(Call { kind, callable: callable.0, args: args.0 })?;
        self.push(v, meta)
    }

    // ----- constructs -----

    /// Takes the construct the builder reads at `at` ([`Builder::construct`]) if the VM would have run its
    /// opcodes within every limit and none of the memo keys it writes is read: its value is pushed, its
    /// counts added, its keys written, and the input continues after it. Whether it was taken.
    fn construct(&mut self, at: usize) -> bool {
        let data = self.data;
        let Vm { builder, memo, shared, .. } = self;
        let view = Memo { ids: memo, shared };
        let Some(c) = builder.construct(data, at, &view) else { return false };
        let t = &c.tally;
        let Some(meta) = t.result() else { return false };
        let l = self.limits;
        let puts = t.puts();
        // What the opcodes would have checked one by one, checked on their totals (every check is monotonic:
        // the value holds everything made on the way, the counters only grow).
        let fits = self.check(&meta).is_ok()
            && t.longest <= usize_u64(l.max_container_len)
            && self.vals.len().saturating_add(t.max_stack) <= l.max_container_len
            && self.marks.len().saturating_add(t.max_marks) <= l.max_mark_depth
            && self.vm_nodes.saturating_add(t.made_nodes) < usize_u64(l.max_nodes.min(u32::MAX as usize))
            && self.vm_bytes.saturating_add(t.made_bytes) <= usize_u64(l.max_alloc_bytes)
            && t.copied_nodes <= self.copy_budget.0
            && t.copied_bytes <= self.copy_budget.1
            && self.written.len().saturating_add(puts.len()) <= l.max_memo
            // New keys, in increasing order (so each once), never read: anything else takes the VM.
            && puts.windows(2).all(|w| w.first() < w.get(1))
            && puts.iter().all(|&k| !self.memo.is_read(k) && !self.written.contains(k));
        if !fits {
            return false;
        }
        for &k in puts {
            self.written.insert(k);
        }
        self.vm_nodes += t.made_nodes;
        self.vm_bytes = self.vm_bytes.saturating_add(t.made_bytes);
        self.copy_budget.0 -= t.copied_nodes;
        self.copy_budget.1 -= t.copied_bytes;
        self.vals.push(c.value);
        self.meta.push(meta);
        self.pos = c.end;
        true
    }

    // ----- the interpreter -----

    #[allow(clippy::too_many_lines)]
    fn run(&mut self) -> R<B::Value> {
        loop {
            let &code = self.data.get(self.pos).ok_or(Declined)?;
            self.pos += 1;
            match code {
                op::MARK => {
                    if self.marks.len() >= self.limits.max_mark_depth {
                        return Err(Declined);
                    }
                    self.marks.push(self.vals.len());
                }
                op::STOP => {
                    if !self.marks.is_empty() {
                        return Err(Declined);
                    }
                    let t = self.top_index()?;
                    let m = *self.meta.get(t).ok_or(Declined)?;
                    if m.shared != NO_ID {
                        // The last use of a shared object: move it out.
                        let s = self.shared.get_mut(m.shared as usize).ok_or(Declined)?;
                        let placeholder = self.builder.none();
                        return Ok(std::mem::replace(&mut s.value, placeholder));
                    }
                    return self.vals.pop().ok_or(Declined);
                }
                op::POP => {
                    if self.marks.last() == Some(&self.vals.len()) {
                        self.marks.pop();
                    } else {
                        self.top_index()?;
                        self.vals.pop();
                        self.meta.pop();
                    }
                }
                op::POP_MARK => {
                    let m = self.marks.pop().ok_or(Declined)?;
                    if m > self.vals.len() {
                        return Err(Declined);
                    }
                    self.vals.truncate(m);
                    self.meta.truncate(m);
                }
                op::DUP => {
                    // Two references to one object: make it shared (it may be mutated through either).
                    let t = self.top_index()?;
                    let m = *self.meta.get(t).ok_or(Declined)?;
                    let id = if m.shared == NO_ID {
                        let id = u32::try_from(self.shared.len()).map_err(|_| Declined)?;
                        let placeholder = self.builder.none();
                        let value = std::mem::replace(self.vals.get_mut(t).ok_or(Declined)?, placeholder);
                        self.shared.push(Shared { value, meta: m, frozen: false });
                        if let Some(mm) = self.meta.get_mut(t) {
                            mm.shared = id;
                        }
                        id
                    } else {
                        m.shared
                    };
                    let placeholder = self.builder.none();
                    self.push(placeholder, Meta { shared: id, ..Meta::SCALAR })?;
                }
                op::FLOAT => {
                    let line = self.line()?;
                    let f = text::parse_float(line).ok_or(Declined)?;
                    let v = self.builder.float(f);
                    self.push_scalar(v)?;
                }
                op::INT => {
                    let line = self.line()?;
                    if line.is_empty() {
                        return Err(Declined);
                    }
                    match text::strtol_full(line) {
                        Some(v @ (0 | 1)) if line.len() == 2 => {
                            let v = self.builder.bool(v == 1);
                            self.push_scalar(v)?;
                        }
                        Some(v) => {
                            let v = self.builder.int(v);
                            self.push_scalar(v)?;
                        }
                        None => {
                            let repr = text::parse_py_int(line, 0, self.limits.max_int_digits).map_err(|_| Declined)?;
                            self.int(repr)?;
                        }
                    }
                }
                op::BININT => {
                    let v = self.i32()?;
                    let v = self.builder.int(i64::from(v));
                    self.push_scalar(v)?;
                }
                op::BININT1 => {
                    let v = self.u8()?;
                    let v = self.builder.int(i64::from(v));
                    self.push_scalar(v)?;
                }
                op::BININT2 => {
                    let v = self.u16()?;
                    let v = self.builder.int(i64::from(v));
                    self.push_scalar(v)?;
                }
                op::LONG => {
                    let mut line = self.line()?;
                    if line.is_empty() {
                        return Err(Declined);
                    }
                    if let [rest @ .., b'L'] = line {
                        line = rest;
                    }
                    let repr = text::parse_py_int(line, 0, self.limits.max_int_digits).map_err(|_| Declined)?;
                    self.int(repr)?;
                }
                op::LONG1 => {
                    let n = self.u8()?;
                    let b = self.take(usize::from(n))?;
                    self.int(from_le_twos(b))?;
                }
                op::LONG4 => {
                    let n = u64::try_from(self.i32()?).map_err(|_| Declined)?;
                    let b = self.take_len(n)?;
                    self.int(from_le_twos(b))?;
                }
                op::NONE => {
                    let v = self.builder.none();
                    self.push_scalar(v)?;
                }
                op::NEWTRUE | op::NEWFALSE => {
                    let v = self.builder.bool(code == op::NEWTRUE);
                    self.push_scalar(v)?;
                }
                op::PERSID => {
                    let line = self.line()?;
                    if !line.is_ascii() {
                        return Err(Declined);
                    }
                    let s = std::str::from_utf8(line).map_err(|_| Declined)?;
                    self.count_node(line.len())?;
                    let id = self.builder.str(Cow::Borrowed(s))?;
                    let meta =
                        Meta { nodes: 2, bytes: usize_u64(line.len()), len: 0, depth: 2, shared: NO_ID, leaf: false };
                    self.check(&meta)?;
                    self.count_node(0)?;
                    let v = self.builder.persistent_id(id)?;
                    self.push(v, meta)?;
                }
                op::BINPERSID => {
                    let (pid, pm) = self.pop()?;
                    let mut c = Children::default();
                    c.add(&pm);
                    let meta = Meta { len: 0, ..c.container(0) };
                    self.check(&meta)?;
                    self.count_node(0)?;
                    let v = self.builder.persistent_id(pid)?;
                    self.push(v, meta)?;
                }
                op::REDUCE => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    self.object(CallKind::Reduce, callable, args, None)?;
                }
                op::STRING => {
                    let line = self.line()?;
                    let b = text::decode_string_literal(line).map_err(|_| Declined)?;
                    let n = b.len();
                    let v = self.builder.bytes(Cow::Owned(b), false)?;
                    self.push_leaf(v, n)?;
                }
                op::BINSTRING => {
                    let n = u64::try_from(self.i32()?).map_err(|_| Declined)?;
                    let b = self.take_len(n)?;
                    self.bytes(b, false)?;
                }
                op::SHORT_BINSTRING | op::SHORT_BINBYTES => {
                    let n = self.u8()?;
                    let b = self.take(usize::from(n))?;
                    self.bytes(b, false)?;
                }
                op::UNICODE => {
                    let line = self.line()?;
                    let s = text::decode_raw_unicode_escape(line).map_err(|_| Declined)?;
                    let n = s.len();
                    let v = self.builder.str(Cow::Owned(s))?;
                    self.push_leaf(v, n)?;
                }
                op::BINUNICODE => {
                    let n = self.u32()?;
                    let b = self.take_len(u64::from(n))?;
                    self.str_bytes(b)?;
                }
                op::SHORT_BINUNICODE => {
                    let n = self.u8()?;
                    let b = self.take(usize::from(n))?;
                    self.str_bytes(b)?;
                }
                op::BINUNICODE8 => {
                    let n = self.u64()?;
                    let b = self.take_len(n)?;
                    self.str_bytes(b)?;
                }
                op::BINBYTES => {
                    let n = self.u32()?;
                    let b = self.take_len(u64::from(n))?;
                    self.bytes(b, false)?;
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = self.u64()?;
                    let b = self.take_len(n)?;
                    self.bytes(b, code == op::BYTEARRAY8)?;
                }
                op::APPEND => {
                    let v = self.top_index()?;
                    let t = self.target_below(v)?;
                    let c = self.own_from(v)?;
                    self.mutate(t, v, c, Mutation::Append)?;
                }
                op::APPENDS => {
                    let (m, c) = self.pop_mark()?;
                    let t = self.target_below(m)?;
                    if self.vals.len() > m {
                        self.mutate(t, m, c, Mutation::Append)?;
                    }
                }
                op::BUILD => {
                    let v = self.top_index()?;
                    let t = self.target_below(v)?;
                    let mut c = self.own_from(v)?;
                    c.count = 0;
                    self.mutate(t, v, c, Mutation::Build)?;
                }
                op::GLOBAL => {
                    let (m, n) = self.global_names()?;
                    let v = self.builder.global(m, n)?;
                    self.push_leaf(v, m.len() + n.len())?;
                }
                op::STACK_GLOBAL => {
                    let (name, nm) = self.pop()?;
                    let (module, mm) = self.pop()?;
                    let v = self.builder.stack_global(module, name)?;
                    let n = usize::try_from(mm.bytes.saturating_add(nm.bytes)).map_err(|_| Declined)?;
                    self.push_leaf(v, n)?;
                }
                op::DICT => {
                    let (m, c) = self.pop_mark()?;
                    let meta = Meta { len: u32::try_from(c.count / 2).unwrap_or(u32::MAX), ..c.container(0) };
                    self.container(None, m, meta)?;
                }
                op::EMPTY_DICT => self.empty(None)?,
                op::EMPTY_LIST => self.empty(Some(Sequence::List))?,
                op::EMPTY_TUPLE => self.empty(Some(Sequence::Tuple))?,
                op::EMPTY_SET => self.empty(Some(Sequence::Set))?,
                op::GET => {
                    let key = self.text_key()?;
                    self.memo_get(key)?;
                }
                op::BINGET => {
                    if self.construct(self.pos - 1) {
                        continue;
                    }
                    let key = self.u8()?;
                    self.memo_get(u64::from(key))?;
                }
                op::LONG_BINGET => {
                    if self.construct(self.pos - 1) {
                        continue;
                    }
                    let key = self.u32()?;
                    self.memo_get(u64::from(key))?;
                }
                op::INST => {
                    let (module, name) = self.global_names()?;
                    let (m, c) = self.pop_mark()?;
                    let cls = self.builder.global(module, name)?;
                    self.count_node(module.len() + name.len())?;
                    self.container(Some(Sequence::Tuple), m, c.container(0))?;
                    let args = self.pop()?;
                    self.object(CallKind::Inst, (cls, Meta::leaf(module.len() + name.len())), args, None)?;
                }
                op::OBJ => {
                    let (m, _) = self.pop_mark()?;
                    let cls_meta = *self.meta.get(m).ok_or(Declined)?;
                    let mut c = Children::default();
                    for mm in self.meta.get(m + 1..).unwrap_or_default() {
                        c.add(mm);
                    }
                    self.container(Some(Sequence::Tuple), m + 1, c.container(0))?;
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    self.object(CallKind::Obj, (cls.0, cls_meta), args, None)?;
                }
                op::LIST => {
                    let (m, c) = self.pop_mark()?;
                    self.sequence_from(Sequence::List, m, c)?;
                }
                op::TUPLE => {
                    let (m, c) = self.pop_mark()?;
                    self.sequence_from(Sequence::Tuple, m, c)?;
                }
                op::FROZENSET => {
                    let (m, c) = self.pop_mark()?;
                    self.sequence_from(Sequence::FrozenSet, m, c)?;
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1) + 1;
                    if self.vals.len() < self.fence() + n {
                        return Err(Declined);
                    }
                    let from = self.vals.len() - n;
                    let c = self.own_from(from)?;
                    self.sequence_from(Sequence::Tuple, from, c)?;
                }
                op::PUT => {
                    let key = self.text_key()?;
                    self.memo_put(key)?;
                }
                op::BINPUT => {
                    let key = self.u8()?;
                    self.memo_put(u64::from(key))?;
                }
                op::LONG_BINPUT => {
                    let key = self.u32()?;
                    self.memo_put(u64::from(key))?;
                }
                op::MEMOIZE => {
                    let key = usize_u64(self.written.len());
                    self.memo_put(key)?;
                }
                op::SETITEM => {
                    if self.vals.len() < self.fence() + 2 {
                        return Err(Declined);
                    }
                    let k = self.vals.len() - 2;
                    let t = self.target_below(k)?;
                    let mut c = self.own_from(k)?;
                    c.count = 1;
                    self.mutate(t, k, c, Mutation::SetItems)?;
                }
                op::SETITEMS => {
                    let (m, mut c) = self.pop_mark()?;
                    let t = self.target_below(m)?;
                    if self.vals.len() > m {
                        c.count = usize_u64((self.vals.len() - m) / 2);
                        self.mutate(t, m, c, Mutation::SetItems)?;
                    }
                }
                op::ADDITEMS => {
                    let (m, c) = self.pop_mark()?;
                    let t = self.target_below(m)?;
                    if self.vals.len() > m {
                        self.mutate(t, m, c, Mutation::AddItems)?;
                    }
                }
                op::BINFLOAT => {
                    let f = f64::from_be_bytes(self.arr()?);
                    let v = self.builder.float(f);
                    self.push_scalar(v)?;
                }
                op::PROTO => {
                    if self.u8()? > op::HIGHEST_PROTOCOL {
                        return Err(Declined);
                    }
                }
                op::NEWOBJ => {
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    self.object(CallKind::NewObj, cls, args, None)?;
                }
                op::NEWOBJ_EX => {
                    let (kwargs, km) = self.pop()?;
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    self.object(CallKind::NewObjEx { kwargs }, cls, args, Some(km))?;
                }
                op::FRAME => {
                    let n = self.u64()?;
                    if n > usize_u64(self.data.len() - self.pos.min(self.data.len())) {
                        return Err(Declined);
                    }
                }
                _ => return Err(Declined),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::decode::decode_graph;
    use crate::{EncodeOptions, Object, Sharing, Value, encode_with};

    fn s(text: &str) -> Value {
        Value::Str(text.to_owned())
    }

    /// Values with every kind of node, sharing-friendly repetition, and a torch-like tensor record.
    fn sample() -> Value {
        let tensor = |key: &str| {
            Value::from(Object::reduce(
                Value::global("torch._utils", "_rebuild_tensor_v2"),
                Value::Tuple(vec![
                    Value::PersistentId(Box::new(Value::Tuple(vec![
                        s("storage"),
                        Value::global("torch", "FloatStorage"),
                        s(key),
                        s("cpu"),
                        Value::Int(6),
                    ]))),
                    Value::Int(0),
                    Value::Tuple(vec![Value::Int(2), Value::Int(3)]),
                    Value::Tuple(vec![Value::Int(3), Value::Int(1)]),
                    Value::Bool(false),
                    Value::from(Object::reduce(Value::global("collections", "OrderedDict"), Value::Tuple(vec![]))),
                ]),
            ))
        };
        let record =
            Value::Dict(vec![(s("k"), Value::Tuple(vec![Value::Int(1), Value::Int(2)])), (s("l"), Value::None)]);
        Value::Dict(vec![
            (
                s("a"),
                Value::List(vec![
                    Value::Int(1),
                    Value::Int(-300),
                    Value::Int(1 << 40),
                    Value::Float(2.5),
                    s("x"),
                    s("ünï"),
                    Value::Bytes(b"y".to_vec()),
                    Value::ByteArray(b"zz".to_vec()),
                    Value::None,
                    Value::Bool(true),
                ]),
            ),
            (s("b"), Value::Set(vec![Value::Int(1), Value::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1])])),
            (s("f"), Value::FrozenSet(vec![s("q")])),
            (s("r1"), record.clone()),
            (s("r2"), record.clone()),
            (s("r3"), Value::List(vec![record.clone(), record])),
            (
                s("o"),
                Value::from(
                    Object::new_obj(Value::global("m", "C"), Value::Tuple(vec![]))
                        .with_state(Value::Dict(vec![(s("k"), Value::Tuple(vec![Value::Int(1), Value::Int(2)]))])),
                ),
            ),
            (s("t0"), tensor("0")),
            (s("t1"), tensor("1")),
            (s("p"), Value::PersistentId(Box::new(Value::Tuple(vec![s("storage"), Value::Int(3)])))),
        ])
    }

    fn corpus() -> Vec<Vec<u8>> {
        let v = sample();
        let mut out = Vec::new();
        for p in 2..=5 {
            for sharing in [Sharing::Distinct, Sharing::Identifiers, Sharing::Strings, Sharing::Structural] {
                out.push(encode_with(&v, &EncodeOptions::new(p).with_sharing(sharing)).unwrap());
            }
        }
        out.push(b"(dp0\nS'k'\np1\n(S'v'\nimod\nFoo\np2\nsS'k2'\ng2\ns.".to_vec());
        out.push(b"(I1\nI2\nlp0\n0g0\n(I9\n12\x86.".to_vec());
        out.push(b"(I01\nI00\nI010\nI99999999999999999999\nL-5\nF1.5\nV\\u20ac\nPpid\n(cmod\nFoo\nI5\nol.".to_vec());
        // Memo reference semantics: filled after memoizing; mutated after an alias was taken; BUILD through
        // an alias; DUP.
        out.push(
            b"\x80\x02}q\x00(X\x01\x00\x00\x00xq\x01}q\x02X\x01\x00\x00\x00aq\x03K\x01sX\x01\x00\x00\x00yq\x04h\x02u."
                .to_vec(),
        );
        out.push(b"\x80\x02]q\x00(}q\x01h\x01eh\x01X\x01\x00\x00\x00aK\x01s0.".to_vec());
        out.push(b"\x80\x02cm\nC\n)\x81q\x00]q\x01(h\x00h\x00eh\x00}X\x01\x00\x00\x00kK\x07sb0.".to_vec());
        out.push(b"]2K\x01a\x85.".to_vec());
        out.push(b"cm\nC\n)\x81}X\x01\x00\x00\x00aK\x01sb}X\x01\x00\x00\x00bK\x02sb.".to_vec());
        out
    }

    /// The single-pass decoder either declines or agrees with the full decoder (value and end offset).
    fn agree(data: &[u8], limits: &Limits) -> bool {
        match build(data, limits, &mut ValueBuilder) {
            Err(Declined) => false,
            Ok((v, end)) => {
                let (w, wend) = decode_graph(data, limits).unwrap_or_else(|e| {
                    panic!("single pass accepted what the full decoder rejects ({e}): {data:02x?}")
                });
                assert_eq!(format!("{v:?}"), format!("{w:?}"), "{data:02x?}");
                assert_eq!(end, wend);
                true
            }
        }
    }

    #[test]
    fn agrees_with_the_full_decoder_on_valid_pickles() {
        let limits = Limits::default();
        let corpus = corpus();
        let accepted = corpus.iter().filter(|d| agree(d, &limits)).count();
        // Everything CPython's pickler writes for a tree goes through the single pass, and so do a container
        // filled after it was memoized and a DUP; mutations after an alias was taken and a second BUILD are
        // declined.
        assert_eq!(accepted, corpus.len() - 3, "accepted {accepted} of {}", corpus.len());
        for declined in [16 + 3 + 1, 16 + 3 + 2, corpus.len() - 1] {
            assert!(build(&corpus[declined], &limits, &mut ValueBuilder).is_err());
        }
    }

    #[test]
    fn agrees_with_the_full_decoder_on_mutated_pickles() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let alphabet: Vec<u8> = (0u8..=255).filter(|&b| op::name(b).is_some()).collect();
        let corpus = corpus();
        let limits = Limits::default();
        let tight =
            Limits { max_depth: 4, max_nodes: 40, max_container_len: 5, max_alloc_bytes: 64, ..Limits::default() };
        let mut accepted = 0;
        for i in 0..40_000 {
            let mut data = corpus[next() as usize % corpus.len()].clone();
            for _ in 0..=(next() % 3) {
                if data.is_empty() {
                    break;
                }
                let at = next() as usize % data.len();
                match next() % 4 {
                    0 => data[at] = next() as u8,
                    1 => data[at] = alphabet[next() as usize % alphabet.len()],
                    2 => {
                        data.remove(at);
                    }
                    _ => data.insert(at, alphabet[next() as usize % alphabet.len()]),
                }
            }
            if agree(&data, if i % 4 == 0 { &tight } else { &limits }) {
                accepted += 1;
            }
        }
        assert!(accepted > 1000, "{accepted}");
    }

    #[test]
    fn limits_are_enforced_before_building() {
        // Every limit of the full decoder's tests: the single pass declines (the full decoder reports).
        let small = |f: fn(&mut Limits)| {
            let mut l = Limits::default();
            f(&mut l);
            l
        };
        assert!(build(b"Nq\x00q\x01q\x02.", &small(|l| l.max_memo = 2), &mut ValueBuilder).is_err());
        assert!(build(b"Nq\x00q\x01q\x00.", &small(|l| l.max_memo = 2), &mut ValueBuilder).is_ok());
        assert!(build(b"]]]].", &small(|l| l.max_nodes = 3), &mut ValueBuilder).is_err());
        assert!(build(b"\x8c\x05hello.", &small(|l| l.max_alloc_bytes = 4), &mut ValueBuilder).is_err());
        assert!(build(b"](NNe(NNe.", &small(|l| l.max_container_len = 3), &mut ValueBuilder).is_err());
        assert!(build(b"NNNN.", &small(|l| l.max_container_len = 3), &mut ValueBuilder).is_err());
        assert!(build(b"((((", &small(|l| l.max_mark_depth = 3), &mut ValueBuilder).is_err());
        assert!(build(b"]]]aa.", &small(|l| l.max_depth = 3), &mut ValueBuilder).is_ok());
        assert!(build(b"]]]]aaa.", &small(|l| l.max_depth = 3), &mut ValueBuilder).is_err());
        // A memo bomb stops after a copy budget proportional to the input, long before 2^40 values.
        let mut data = b"\x80\x02Nq\x00".to_vec();
        for i in 0u8..40 {
            data.extend_from_slice(&[b']', b'(', b'h', i, b'h', i, b'e', b'q', i + 1]);
        }
        data.push(b'.');
        assert!(build(&data, &Limits::default(), &mut ValueBuilder).is_err());
    }

    #[test]
    fn unread_memo_entries_stay_owned() {
        // Protocol 4 memoizes everything; only keys some GET reads are kept.
        let data = encode_with(&sample(), &EncodeOptions::new(4)).unwrap();
        let reads = memo_reads(&data).unwrap();
        let written = data.iter().filter(|&&b| b == op::MEMOIZE).count();
        assert!(reads.len < written / 2, "{} of {written}", reads.len);
        assert_eq!(decode_graph(&data, &Limits::default()).unwrap().0.desugar(), sample());
        assert_eq!(build(&data, &Limits::default(), &mut ValueBuilder).unwrap().0.desugar(), sample());
    }
}
