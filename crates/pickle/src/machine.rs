//! The pickle machine: the one interpreter of pickle opcodes, handing every object it makes to a
//! [`Builder`].
//!
//! # Memo
//! Before running, the machine scans the opcode stream (it is context free, like `pickletools.genops`) for
//! the memo keys that some GET reads. A PUT of any other key only counts towards [`Limits::max_memo`]:
//! nothing can see that object again, so it stays *owned* by whoever consumes it and is built in place. An
//! object memoized under a key that is read (or DUP'd) moves to the *shared* table; the stack then holds
//! references to it, each use is made by [`Builder::share`], and mutations (APPEND, SETITEMS, ADDITEMS,
//! BUILD) through any reference change it there, as in Python. Cycles are no different: an object that
//! comes to hold a reference to itself is just a shared object the builder was asked to share.
//!
//! # Limits
//! Every [`Limits`] value is enforced before the memory is taken. Each value on the stack carries its size
//! as a tree would materialise it (nodes, payload bytes, depth, items; a shared object counted at its size
//! at each use), checked whenever a container is made or grows, so memo bombs and deep nesting are refused
//! at the opcode that crosses a limit. What the machine itself creates (strings, containers, objects,
//! globals) is counted separately against the same node and byte limits.
//!
//! # Fast paths
//! A builder's [`Template`](crate::Template)s are read straight from the bytes at the GET of their global
//! (see [`template`]): their opcodes are counted against every limit exactly as this loop would count them,
//! and anything that does not fit the template is left to this loop.

use std::borrow::Cow;

use crate::bigint::{IntRepr, from_le_twos};
use crate::builder::{Builder, Call, CallKind, Pairs, Sequence};
use crate::error::Error;
use crate::limits::Limits;
use crate::opcode as op;
use crate::text::{self, TextError};

mod memo;
pub(crate) mod template;

use memo::{MemoIds, NO_ID, Written};

type R<T, E> = std::result::Result<T, E>;

/// How the Python 2 `str` opcodes (STRING, BINSTRING, SHORT_BINSTRING) are decoded: what `torch.load`'s and
/// `pickle.Unpickler`'s `encoding=` argument chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Py2Strings {
    /// Text, decoded as UTF-8 (strictly: invalid UTF-8 is an error). `torch.load`'s default.
    #[default]
    Utf8,
    /// Text, each byte one character U+0000-U+00FF (`encoding='latin1'`): never fails; what reads Python 2
    /// pickles of numpy arrays and datetimes.
    Latin1,
    /// Text, ASCII only (`encoding='ASCII'`, `pickle.loads`'s default): a byte above 0x7f is an error.
    Ascii,
    /// Bytes, undecoded (`encoding='bytes'`).
    Bytes,
}

impl Py2Strings {
    /// The name Python gives the encoding (`'utf-8'`, `'latin1'`, `'ASCII'`, `'bytes'`).
    #[must_use]
    pub fn python_name(self) -> &'static str {
        match self {
            Py2Strings::Utf8 => "utf-8",
            Py2Strings::Latin1 => "latin1",
            Py2Strings::Ascii => "ASCII",
            Py2Strings::Bytes => "bytes",
        }
    }
}

/// How the machine reads a pickle: its [`Limits`], and how Python 2 strings are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// The resource limits.
    pub limits: Limits,
    /// How STRING, BINSTRING and SHORT_BINSTRING are read.
    pub py2_strings: Py2Strings,
}

impl Options {
    /// These options with `limits`.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// These options with Python 2 strings read as `py2_strings` says.
    #[must_use]
    pub fn with_py2_strings(mut self, py2_strings: Py2Strings) -> Self {
        self.py2_strings = py2_strings;
        self
    }
}

impl From<Limits> for Options {
    fn from(limits: Limits) -> Self {
        Options { limits, py2_strings: Py2Strings::default() }
    }
}

/// Runs the pickle at the start of `data`, handing every object to `builder`; returns what the builder made
/// of the pickled object and the number of bytes consumed (the position just after STOP), so that
/// concatenated pickles (the legacy torch format) can be read one after another. Bytes after STOP are not
/// looked at.
///
/// ```
/// use ckpt_pickle::{Options, ValueBuilder, Value};
/// let bytes = ckpt_pickle::encode(&Value::List(vec![Value::Int(7)]), 2)?;
/// let mut builder = ValueBuilder::default();
/// let (root, end) = ckpt_pickle::run(&bytes, &Options::default(), &mut builder)?;
/// assert_eq!(builder.finish(root)?, Value::List(vec![Value::Int(7)]));
/// assert_eq!(end, bytes.len());
/// # Ok::<(), ckpt_pickle::Error>(())
/// ```
///
/// # Errors
/// The first [`Error`] of the pickle (malformed input, an unsupported feature, an exceeded limit), with the
/// offset where it was found, converted into the builder's error; or the builder's own refusal.
pub fn run<'a, B: Builder<'a>>(data: &'a [u8], options: &Options, builder: &mut B) -> R<(B::Value, usize), B::Error> {
    let limits = &options.limits;
    let templates = template::Index::new(builder.templates());
    let mut m = Machine {
        data,
        pos: 0,
        limits,
        py2_strings: options.py2_strings,
        max_depth: limits.max_depth.min(usize::from(MAX_DEPTH)),
        builder,
        vals: Vec::new(),
        meta: Vec::new(),
        marks: Vec::new(),
        shared: Vec::new(),
        memo: MemoIds::new(memo::memo_reads(data)),
        written: Written::default(),
        vm_nodes: 0,
        vm_bytes: 0,
        globals: Vec::new(),
        templates,
        captures: Vec::new(),
    };
    let root = m.run()?;
    Ok((root, m.pos))
}

/// The deepest value the machine counts (depth is kept in 16 bits); a larger [`Limits::max_depth`] is
/// taken as this.
pub(crate) const MAX_DEPTH: u16 = u16::MAX - 1;

/// What kind of object a value is, as far as the pickle's own rules go (which opcodes may apply to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// None, bool, int, float.
    Scalar,
    BigInt,
    Str,
    Bytes,
    ByteArray,
    Global,
    List,
    Tuple,
    Dict,
    Set,
    FrozenSet,
    /// The result of a call (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ), or of a template.
    Object,
    PersistentId,
    /// A reference to a shared object (`link` is its id in the shared table).
    Shared,
}

/// What the machine knows about a value: its size as a tree would materialise it (for the limits), its kind
/// and, for a string or global whose text it saw, where that text is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    pub(crate) nodes: u64,
    pub(crate) bytes: u64,
    /// Items (saturating).
    pub(crate) len: u32,
    /// A string's offset in the input (its length is `bytes`), a global's index in the machine's table of
    /// names, a shared reference's id; [`NO_ID`] for anything else.
    pub(crate) link: u32,
    /// Depth (saturating).
    pub(crate) depth: u16,
    pub(crate) kind: Kind,
}

impl Meta {
    pub(crate) const SCALAR: Meta = Meta { nodes: 1, bytes: 0, len: 0, link: NO_ID, depth: 1, kind: Kind::Scalar };

    pub(crate) fn leaf(kind: Kind, bytes: usize) -> Meta {
        Meta { bytes: usize_u64(bytes), kind, ..Meta::SCALAR }
    }
}

/// Sum of the sizes and maximum depth of a group of children.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Children {
    pub(crate) nodes: u64,
    pub(crate) bytes: u64,
    pub(crate) depth: u16,
    pub(crate) count: u64,
}

impl Children {
    pub(crate) fn add(&mut self, m: &Meta) {
        self.nodes = self.nodes.saturating_add(m.nodes);
        self.bytes = self.bytes.saturating_add(m.bytes);
        self.depth = self.depth.max(m.depth);
        self.count += 1;
    }

    /// The meta of a new container of `kind` holding these children.
    pub(crate) fn container(&self, kind: Kind) -> Meta {
        Meta {
            nodes: self.nodes.saturating_add(1),
            bytes: self.bytes,
            len: u32::try_from(self.count).unwrap_or(u32::MAX),
            link: NO_ID,
            depth: self.depth.saturating_add(1),
            kind,
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

pub(crate) struct Shared<V> {
    pub(crate) value: V,
    pub(crate) meta: Meta,
}

pub(crate) struct Machine<'a, 'l, 'b, B: Builder<'a>> {
    pub(crate) data: &'a [u8],
    pub(crate) pos: usize,
    pub(crate) limits: &'l Limits,
    py2_strings: Py2Strings,
    /// [`Limits::max_depth`], at most [`MAX_DEPTH`].
    pub(crate) max_depth: usize,
    pub(crate) builder: &'b mut B,
    /// The stack's values; a slot referring to a shared object holds a placeholder (`none`).
    pub(crate) vals: Vec<B::Value>,
    /// The stack's metadata, one per value.
    pub(crate) meta: Vec<Meta>,
    pub(crate) marks: Vec<usize>,
    pub(crate) shared: Vec<Shared<B::Value>>,
    pub(crate) memo: MemoIds,
    /// Memo keys PUT so far (for `max_memo` and MEMOIZE's key).
    pub(crate) written: Written,
    /// Objects the machine created, and their payload bytes.
    pub(crate) vm_nodes: u64,
    pub(crate) vm_bytes: u64,
    /// `(module, name)` of the globals whose names the machine saw (a [`Kind::Global`] meta's `link`).
    pub(crate) globals: Vec<(&'a str, &'a str)>,
    templates: template::Index,
    /// What a template captured, handed to the builder (kept to be reused).
    pub(crate) captures: Vec<template::Capture<'a, B::Value>>,
}

pub(crate) fn usize_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn name_of(opcode: u8) -> &'static str {
    op::name(opcode).unwrap_or("?")
}

fn underflow(at: usize, code: u8) -> Error {
    Error::StackUnderflow { offset: at, opcode: name_of(code) }
}

impl<'a, B: Builder<'a>> Machine<'a, '_, '_, B> {
    // ----- input -----

    fn take(&mut self, n: usize) -> R<&'a [u8], Error> {
        let remaining = self.data.len() - self.pos.min(self.data.len());
        if n > remaining {
            return Err(Error::UnexpectedEof { offset: self.pos, needed: usize_u64(n - remaining) });
        }
        let s = self.data.get(self.pos..self.pos + n).ok_or(Error::UnexpectedEof { offset: self.pos, needed: 1 })?;
        self.pos += n;
        Ok(s)
    }

    /// Takes a file-controlled 64-bit length, checked against the remaining input before anything is used.
    fn take_len(&mut self, n: u64) -> R<&'a [u8], Error> {
        let remaining = usize_u64(self.data.len() - self.pos.min(self.data.len()));
        if n > remaining {
            return Err(Error::UnexpectedEof { offset: self.pos, needed: n - remaining });
        }
        self.take(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn arr<const N: usize>(&mut self) -> R<[u8; N], Error> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> R<u8, Error> {
        Ok(self.arr::<1>()?[0])
    }

    fn u16(&mut self) -> R<u16, Error> {
        Ok(u16::from_le_bytes(self.arr()?))
    }

    fn u32(&mut self) -> R<u32, Error> {
        Ok(u32::from_le_bytes(self.arr()?))
    }

    fn i32(&mut self) -> R<i32, Error> {
        Ok(i32::from_le_bytes(self.arr()?))
    }

    fn u64(&mut self) -> R<u64, Error> {
        Ok(u64::from_le_bytes(self.arr()?))
    }

    /// One text line without its `\n`.
    fn line(&mut self) -> R<&'a [u8], Error> {
        let rest = self.data.get(self.pos..).unwrap_or(&[]);
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                let l = rest.get(..i).unwrap_or(&[]);
                self.pos += i + 1;
                Ok(l)
            }
            None => Err(Error::UnexpectedEof { offset: self.data.len(), needed: 1 }),
        }
    }

    // ----- limits -----

    pub(crate) fn limit(&self, what: &'static str, limit: usize, at: usize) -> Error {
        Error::Limit { what, limit: usize_u64(limit), offset: at }
    }

    /// Checks the size of a value that is being made or grown.
    pub(crate) fn check(&self, m: &Meta, at: usize) -> R<(), Error> {
        let l = self.limits;
        if u64::from(m.len) > usize_u64(l.max_container_len) {
            return Err(self.limit("container length", l.max_container_len, at));
        }
        if m.nodes > usize_u64(l.max_nodes) {
            return Err(self.limit("materialised nodes", l.max_nodes, at));
        }
        if m.bytes > usize_u64(l.max_alloc_bytes) {
            return Err(self.limit("materialised payload bytes", l.max_alloc_bytes, at));
        }
        if usize::from(m.depth) > self.max_depth {
            return Err(Error::DepthExceeded { limit: self.max_depth, offset: at });
        }
        Ok(())
    }

    /// Counts an object the machine creates, with `bytes` of payload.
    pub(crate) fn count_node(&mut self, bytes: usize, at: usize) -> R<(), Error> {
        let cap = usize_u64(self.limits.max_nodes.min(u32::MAX as usize));
        if self.vm_nodes >= cap {
            return Err(self.limit("nodes", self.limits.max_nodes, at));
        }
        self.vm_nodes += 1;
        self.vm_bytes = self.vm_bytes.saturating_add(usize_u64(bytes));
        if self.vm_bytes > usize_u64(self.limits.max_alloc_bytes) {
            return Err(self.limit("payload bytes", self.limits.max_alloc_bytes, at));
        }
        Ok(())
    }

    // ----- stack -----

    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn push(&mut self, v: B::Value, m: Meta, at: usize) -> R<(), Error> {
        if self.vals.len() >= self.limits.max_container_len {
            return Err(self.limit("stack items", self.limits.max_container_len, at));
        }
        self.vals.push(v);
        self.meta.push(m);
        Ok(())
    }

    fn push_scalar(&mut self, v: B::Value, at: usize) -> R<(), Error> {
        self.push(v, Meta::SCALAR, at)
    }

    /// Pushes a new leaf (string, bytes, ...) with `bytes` of payload, created by the machine.
    fn push_leaf(&mut self, v: B::Value, kind: Kind, bytes: usize, link: u32, at: usize) -> R<(), Error> {
        self.count_node(bytes, at)?;
        self.push(v, Meta { link, ..Meta::leaf(kind, bytes) }, at)
    }

    /// The meta of the value at stack slot `i`, looking through a shared reference.
    fn meta_of(&self, i: usize) -> Option<Meta> {
        let m = *self.meta.get(i)?;
        if m.kind == Kind::Shared { self.shared.get(m.link as usize).map(|s| s.meta) } else { Some(m) }
    }

    /// Makes slot `i` an owned value: a shared reference becomes the builder's new reference to the object.
    fn own(&mut self, i: usize) -> R<Meta, B::Error> {
        let Some(&m) = self.meta.get(i) else { return Ok(Meta::SCALAR) };
        if m.kind != Kind::Shared {
            return Ok(m);
        }
        let Some(s) = self.shared.get_mut(m.link as usize) else { return Ok(Meta::SCALAR) };
        let sm = s.meta;
        let copy = self.builder.share(&mut s.value)?;
        if let Some(slot) = self.vals.get_mut(i) {
            *slot = copy;
        }
        if let Some(mm) = self.meta.get_mut(i) {
            *mm = sm;
        }
        Ok(sm)
    }

    /// Pops one value above the innermost MARK, owned.
    fn pop(&mut self, at: usize, code: u8) -> R<(B::Value, Meta), B::Error> {
        if self.vals.len() <= self.fence() {
            return Err(underflow(at, code).into());
        }
        let m = self.own(self.vals.len() - 1)?;
        let v = self.vals.pop().ok_or_else(|| underflow(at, code))?;
        self.meta.pop();
        Ok((v, m))
    }

    fn top_index(&self, at: usize, code: u8) -> R<usize, Error> {
        if self.vals.len() <= self.fence() {
            return Err(underflow(at, code));
        }
        Ok(self.vals.len() - 1)
    }

    /// Pops the innermost MARK; returns the stack index it marked.
    fn pop_mark(&mut self, at: usize, code: u8) -> R<usize, Error> {
        let m = self.marks.pop().ok_or(Error::MarkNotFound { offset: at, opcode: name_of(code) })?;
        if m > self.vals.len() {
            return Err(underflow(at, code));
        }
        Ok(m)
    }

    /// The stack index of the value just below a MARK at `m` (the target of APPENDS, ...), which must itself
    /// be above the next MARK.
    fn target_below(&self, m: usize, at: usize, code: u8) -> R<usize, Error> {
        if m == 0 || m <= self.fence() {
            return Err(underflow(at, code));
        }
        Ok(m - 1)
    }

    /// Makes every value from stack index `from` up owned, and returns their sizes.
    fn own_from(&mut self, from: usize) -> R<Children, B::Error> {
        let mut c = Children::default();
        let mut shared = false;
        for m in self.meta.get(from..).unwrap_or_default() {
            shared |= m.kind == Kind::Shared;
            c.add(m);
        }
        if !shared {
            return Ok(c);
        }
        let mut c = Children::default();
        for i in from..self.vals.len() {
            let mm = self.own(i)?;
            c.add(&mm);
        }
        Ok(c)
    }

    /// Builds a new container of `kind` from the values from stack index `from` up, which it replaces.
    fn container(&mut self, kind: Kind, from: usize, at: usize) -> R<(), B::Error> {
        let c = self.own_from(from)?;
        let meta = match kind {
            Kind::Dict => Meta { len: u32::try_from(c.count / 2).unwrap_or(u32::MAX), ..c.container(kind) },
            _ => c.container(kind),
        };
        self.count_node(0, at)?;
        self.check(&meta, at)?;
        self.meta.truncate(from);
        let Machine { vals, builder, .. } = self;
        let items = vals.drain(from..);
        let v = match kind {
            Kind::List => builder.sequence(Sequence::List, items)?,
            Kind::Tuple => builder.sequence(Sequence::Tuple, items)?,
            Kind::Set => builder.sequence(Sequence::Set, items)?,
            Kind::FrozenSet => builder.sequence(Sequence::FrozenSet, items)?,
            _ => builder.dict(Pairs(items))?,
        };
        // The stack just shrank, so it has room.
        self.vals.push(v);
        self.meta.push(meta);
        Ok(())
    }

    /// Applies `what` to the value at stack index `t` (owned in place, or the shared object it refers to)
    /// with the values from stack index `from` up, which it removes.
    fn mutate(&mut self, t: usize, from: usize, what: Mutation, at: usize, code: u8) -> R<(), B::Error> {
        if t >= from || from > self.vals.len() {
            return Err(underflow(at, code).into());
        }
        if matches!(what, Mutation::SetItems) && (self.vals.len() - from) % 2 != 0 {
            return Err(Error::Malformed { offset: at, what: "odd number of items for SETITEMS" }.into());
        }
        let target = self.meta_of(t).ok_or_else(|| underflow(at, code))?;
        let (ok, expected) = match what {
            Mutation::Append => (matches!(target.kind, Kind::List | Kind::Object), "a list or object"),
            Mutation::SetItems => (matches!(target.kind, Kind::Dict | Kind::Object), "a dict or object"),
            Mutation::AddItems => (target.kind == Kind::Set, "a set"),
            Mutation::Build => (target.kind == Kind::Object, "an object (REDUCE/NEWOBJ/INST/OBJ result)"),
        };
        if !ok {
            return Err(Error::BadOperand { offset: at, opcode: name_of(code), expected }.into());
        }
        let mut add = self.own_from(from)?;
        add.count = match what {
            Mutation::SetItems => add.count / 2,
            Mutation::Build => 0,
            _ => add.count,
        };
        let grown = Meta {
            nodes: target.nodes.saturating_add(add.nodes),
            bytes: target.bytes.saturating_add(add.bytes),
            len: target.len.saturating_add(u32::try_from(add.count).unwrap_or(u32::MAX)),
            depth: target.depth.max(add.depth.saturating_add(1)),
            ..target
        };
        self.check(&grown, at)?;
        let slot = *self.meta.get(t).ok_or_else(|| underflow(at, code))?;
        if slot.kind == Kind::Shared {
            if let Some(s) = self.shared.get_mut(slot.link as usize) {
                s.meta = grown;
            }
        } else if let Some(mm) = self.meta.get_mut(t) {
            *mm = grown;
        }
        self.meta.truncate(from);
        let Machine { vals, builder, shared, .. } = self;
        // An owned target is taken out of the stack while the items above it are drained.
        let placeholder = builder.none();
        let mut owned = None;
        let target = if slot.kind == Kind::Shared {
            match shared.get_mut(slot.link as usize) {
                Some(s) => &mut s.value,
                None => return Err(underflow(at, code).into()),
            }
        } else {
            match vals.get_mut(t) {
                Some(v) => owned.insert(std::mem::replace(v, placeholder)),
                None => return Err(underflow(at, code).into()),
            }
        };
        let result = {
            let mut items = vals.drain(from..);
            match what {
                Mutation::Append => builder.append(target, items),
                Mutation::SetItems => builder.set_items(target, Pairs(items)),
                Mutation::AddItems => builder.add_items(target, items),
                Mutation::Build => match items.next() {
                    Some(state) => builder.build(target, state),
                    None => Err(underflow(at, code).into()),
                },
            }
        };
        if let (Some(o), Some(slot)) = (owned, vals.get_mut(t)) {
            *slot = o;
        }
        result
    }

    // ----- memo -----

    /// Moves the value at stack slot `t` to the shared table (if it is not there yet); its id.
    fn make_shared(&mut self, t: usize, at: usize, code: u8) -> R<u32, Error> {
        let m = *self.meta.get(t).ok_or_else(|| underflow(at, code))?;
        if m.kind == Kind::Shared {
            return Ok(m.link);
        }
        let id = u32::try_from(self.shared.len()).map_err(|_| self.limit("memo entries", self.limits.max_memo, at))?;
        let placeholder = self.builder.none();
        let value = std::mem::replace(self.vals.get_mut(t).ok_or_else(|| underflow(at, code))?, placeholder);
        self.shared.push(Shared { value, meta: m });
        if let Some(mm) = self.meta.get_mut(t) {
            *mm = Meta { kind: Kind::Shared, link: id, ..Meta::SCALAR };
        }
        Ok(id)
    }

    fn memo_put(&mut self, key: u64, at: usize, code: u8) -> R<(), Error> {
        let t = self.top_index(at, code)?;
        if self.written.insert(key) && self.written.len() > self.limits.max_memo {
            return Err(self.limit("memo entries", self.limits.max_memo, at));
        }
        if self.memo.is_read(key) {
            let id = self.make_shared(t, at, code)?;
            self.memo.set(key, id);
        }
        Ok(())
    }

    fn memo_get(&mut self, key: u64, at: usize) -> R<(), Error> {
        let id = match self.memo.get(key) {
            Some(id) if self.written.contains(key) => id,
            _ => return Err(Error::MemoMissing { offset: at, key }),
        };
        let placeholder = self.builder.none();
        self.push(placeholder, Meta { kind: Kind::Shared, link: id, ..Meta::SCALAR }, at)
    }

    fn text_key(&mut self, at: usize) -> R<u64, Error> {
        let line = self.line()?;
        match text::parse_py_int(line, 10, self.limits.max_int_digits) {
            Ok(IntRepr::Small(v)) => {
                u64::try_from(v).map_err(|_| Error::BadText { offset: at, what: "negative memo key" })
            }
            Ok(IntRepr::Big(_)) => Err(Error::BadText { offset: at, what: "memo key out of range" }),
            Err(e) => Err(self.text_err(e, at)),
        }
    }

    fn text_err(&self, e: TextError, at: usize) -> Error {
        match e {
            TextError::Bad(what) => Error::BadText { offset: at, what },
            TextError::TooManyDigits => self.limit("integer text digits", self.limits.max_int_digits, at),
            TextError::Surrogate(i) => Error::InvalidUtf8 { offset: at + 1 + i },
        }
    }

    // ----- values -----

    fn int(&mut self, repr: IntRepr, at: usize) -> R<(), B::Error> {
        match repr {
            IntRepr::Small(v) => {
                let v = self.builder.int(v);
                Ok(self.push_scalar(v, at)?)
            }
            IntRepr::Big(b) => {
                let n = b.len();
                let v = self.builder.big_int(b)?;
                Ok(self.push_leaf(v, Kind::BigInt, n, NO_ID, at)?)
            }
        }
    }

    /// A `str` written verbatim as UTF-8 at `start` (BINUNICODE, SHORT_BINUNICODE, BINUNICODE8).
    fn str_at(&mut self, b: &'a [u8], start: usize, at: usize) -> R<(), B::Error> {
        let s = std::str::from_utf8(b).map_err(|e| Error::InvalidUtf8 { offset: start + e.valid_up_to() })?;
        let link = u32::try_from(start).unwrap_or(NO_ID);
        let v = self.builder.str(Cow::Borrowed(s))?;
        Ok(self.push_leaf(v, Kind::Str, b.len(), link, at)?)
    }

    fn owned_str(&mut self, s: String, at: usize) -> R<(), B::Error> {
        let n = s.len();
        let v = self.builder.str(Cow::Owned(s))?;
        Ok(self.push_leaf(v, Kind::Str, n, NO_ID, at)?)
    }

    fn bytes(&mut self, b: Cow<'a, [u8]>, bytearray: bool, at: usize) -> R<(), B::Error> {
        let n = b.len();
        let v = self.builder.bytes(b, bytearray)?;
        let kind = if bytearray { Kind::ByteArray } else { Kind::Bytes };
        Ok(self.push_leaf(v, kind, n, NO_ID, at)?)
    }

    /// A Python 2 `str` (STRING, BINSTRING, SHORT_BINSTRING), read as [`Py2Strings`] says; `start` is where
    /// its bytes are in the input when they are there verbatim.
    fn py2_str(&mut self, b: Cow<'a, [u8]>, start: Option<usize>, at: usize) -> R<(), B::Error> {
        let bad = |offset| Error::Py2String { offset, encoding: self.py2_strings.python_name() };
        match self.py2_strings {
            Py2Strings::Bytes => self.bytes(b, false, at),
            Py2Strings::Latin1 if b.is_ascii() => self.py2_utf8(b, start, at),
            Py2Strings::Latin1 => self.owned_str(b.iter().map(|&c| char::from(c)).collect(), at),
            Py2Strings::Ascii => match b.iter().position(|c| !c.is_ascii()) {
                Some(i) => Err(bad(start.unwrap_or(at) + if start.is_some() { i } else { 0 }).into()),
                None => self.py2_utf8(b, start, at),
            },
            Py2Strings::Utf8 => self.py2_utf8(b, start, at),
        }
    }

    /// A Python 2 `str` decoded as UTF-8.
    fn py2_utf8(&mut self, b: Cow<'a, [u8]>, start: Option<usize>, at: usize) -> R<(), B::Error> {
        let encoding = self.py2_strings.python_name();
        let bad =
            |e: std::str::Utf8Error| Error::Py2String { offset: start.map_or(at, |s| s + e.valid_up_to()), encoding };
        match (b, start) {
            (Cow::Borrowed(b), Some(start)) => {
                std::str::from_utf8(b).map_err(bad)?;
                self.str_at(b, start, at)
            }
            (b, _) => {
                let s = String::from_utf8(b.into_owned()).map_err(|e| bad(e.utf8_error()))?;
                self.owned_str(s, at)
            }
        }
    }

    fn global_names(&mut self, at: usize) -> R<(&'a str, &'a str), Error> {
        let module = self.line()?;
        let name = self.line()?;
        if module.is_empty() || name.is_empty() {
            return Err(Error::BadText { offset: at, what: "empty module or name in GLOBAL/INST" });
        }
        let m = std::str::from_utf8(module).map_err(|_| Error::InvalidUtf8 { offset: at })?;
        let n = std::str::from_utf8(name).map_err(|_| Error::InvalidUtf8 { offset: at })?;
        Ok((m, n))
    }

    /// The `link` of a global whose names the machine saw.
    fn global_link(&mut self, module: &'a str, name: &'a str) -> u32 {
        match u32::try_from(self.globals.len()) {
            Ok(id) if id != NO_ID => {
                self.globals.push((module, name));
                id
            }
            _ => NO_ID,
        }
    }

    /// The text of a string value the machine saw verbatim in the input.
    pub(crate) fn text_of(&self, m: &Meta) -> Option<&'a str> {
        if m.kind != Kind::Str || m.link == NO_ID {
            return None;
        }
        let start = m.link as usize;
        let b = self.data.get(start..start.checked_add(usize::try_from(m.bytes).ok()?)?)?;
        std::str::from_utf8(b).ok()
    }

    fn object(
        &mut self,
        kind: CallKind<B::Value>,
        callable: (B::Value, Meta),
        args: (B::Value, Meta),
        kwargs: Option<Meta>,
        at: usize,
    ) -> R<(), B::Error> {
        let mut c = Children::default();
        c.add(&callable.1);
        c.add(&args.1);
        if let Some(k) = kwargs {
            c.add(&k);
        }
        let meta = Meta { len: 0, ..c.container(Kind::Object) };
        self.count_node(0, at)?;
        self.check(&meta, at)?;
        let v = self.builder.object(Call { kind, callable: callable.0, args: args.0 })?;
        Ok(self.push(v, meta, at)?)
    }

    // ----- the interpreter -----

    #[allow(clippy::too_many_lines)]
    fn run(&mut self) -> R<B::Value, B::Error> {
        if self.max_depth == 0 {
            return Err(Error::DepthExceeded { limit: 0, offset: 0 }.into());
        }
        loop {
            let at = self.pos;
            let Some(&code) = self.data.get(at) else {
                return Err(Error::NoStop { offset: self.data.len() }.into());
            };
            self.pos += 1;
            match code {
                op::MARK => {
                    if self.marks.len() >= self.limits.max_mark_depth {
                        return Err(Error::DepthExceeded { limit: self.limits.max_mark_depth, offset: at }.into());
                    }
                    self.marks.push(self.vals.len());
                }
                op::STOP => {
                    if !self.marks.is_empty() {
                        return Err(Error::TrailingMark { offset: at, marks: self.marks.len() }.into());
                    }
                    let t = self.top_index(at, code)?;
                    let m = *self.meta.get(t).ok_or_else(|| underflow(at, code))?;
                    if m.kind == Kind::Shared {
                        // The last use of a shared object: the builder's reference to it.
                        self.own(t)?;
                    }
                    return self.vals.pop().ok_or_else(|| underflow(at, code).into());
                }
                op::POP => {
                    // CPython: a MARK on top of the stack is popped instead of an item.
                    if self.marks.last() == Some(&self.vals.len()) {
                        self.marks.pop();
                    } else {
                        self.top_index(at, code)?;
                        self.vals.pop();
                        self.meta.pop();
                    }
                }
                op::POP_MARK => {
                    let m = self.pop_mark(at, code)?;
                    self.vals.truncate(m);
                    self.meta.truncate(m);
                }
                op::DUP => {
                    // Two references to one object: make it shared (it may be changed through either).
                    let t = self.top_index(at, code)?;
                    let id = self.make_shared(t, at, code)?;
                    let placeholder = self.builder.none();
                    self.push(placeholder, Meta { kind: Kind::Shared, link: id, ..Meta::SCALAR }, at)?;
                }
                op::FLOAT => {
                    let line = self.line()?;
                    let f = text::parse_float(line).ok_or(Error::BadText { offset: at, what: "invalid FLOAT" })?;
                    let v = self.builder.float(f);
                    self.push_scalar(v, at)?;
                }
                op::INT => {
                    let line = self.line()?;
                    if line.is_empty() {
                        return Err(Error::BadText { offset: at, what: "empty INT" }.into());
                    }
                    match text::strtol_full(line) {
                        Some(v @ (0 | 1)) if line.len() == 2 => {
                            let v = self.builder.bool(v == 1);
                            self.push_scalar(v, at)?;
                        }
                        Some(v) => {
                            let v = self.builder.int(v);
                            self.push_scalar(v, at)?;
                        }
                        None => {
                            let repr = text::parse_py_int(line, 0, self.limits.max_int_digits)
                                .map_err(|e| self.text_err(e, at))?;
                            self.int(repr, at)?;
                        }
                    }
                }
                op::BININT => {
                    let v = self.i32()?;
                    let v = self.builder.int(i64::from(v));
                    self.push_scalar(v, at)?;
                }
                op::BININT1 => {
                    let v = self.u8()?;
                    let v = self.builder.int(i64::from(v));
                    self.push_scalar(v, at)?;
                }
                op::BININT2 => {
                    let v = self.u16()?;
                    let v = self.builder.int(i64::from(v));
                    self.push_scalar(v, at)?;
                }
                op::LONG => {
                    let mut line = self.line()?;
                    if line.is_empty() {
                        return Err(Error::BadText { offset: at, what: "empty LONG" }.into());
                    }
                    if let [rest @ .., b'L'] = line {
                        line = rest;
                    }
                    let repr =
                        text::parse_py_int(line, 0, self.limits.max_int_digits).map_err(|e| self.text_err(e, at))?;
                    self.int(repr, at)?;
                }
                op::LONG1 => {
                    let n = self.u8()?;
                    let b = self.take(usize::from(n))?;
                    self.int(from_le_twos(b), at)?;
                }
                op::LONG4 => {
                    let n = self.i32()?;
                    let n = u64::try_from(n)
                        .map_err(|_| Error::Malformed { offset: at, what: "LONG4 with negative byte count" })?;
                    let b = self.take_len(n)?;
                    self.int(from_le_twos(b), at)?;
                }
                op::NONE => {
                    let v = self.builder.none();
                    self.push_scalar(v, at)?;
                }
                op::NEWTRUE | op::NEWFALSE => {
                    let v = self.builder.bool(code == op::NEWTRUE);
                    self.push_scalar(v, at)?;
                }
                op::BINFLOAT => {
                    let f = f64::from_be_bytes(self.arr()?);
                    let v = self.builder.float(f);
                    self.push_scalar(v, at)?;
                }
                op::PERSID => {
                    let start = self.pos;
                    let line = self.line()?;
                    if !line.is_ascii() {
                        return Err(Error::BadText { offset: at, what: "PERSID must be ASCII" }.into());
                    }
                    let s = std::str::from_utf8(line).map_err(|_| Error::InvalidUtf8 { offset: at })?;
                    self.count_node(line.len(), at)?;
                    let id = self.builder.str(Cow::Borrowed(s))?;
                    let link = u32::try_from(start).unwrap_or(NO_ID);
                    let mut c = Children::default();
                    c.add(&Meta { link, ..Meta::leaf(Kind::Str, line.len()) });
                    let meta = Meta { len: 0, ..c.container(Kind::PersistentId) };
                    self.count_node(0, at)?;
                    self.check(&meta, at)?;
                    let v = self.builder.persistent_id(id)?;
                    self.push(v, meta, at)?;
                }
                op::BINPERSID => {
                    let (pid, pm) = self.pop(at, code)?;
                    let mut c = Children::default();
                    c.add(&pm);
                    let meta = Meta { len: 0, ..c.container(Kind::PersistentId) };
                    self.count_node(0, at)?;
                    self.check(&meta, at)?;
                    let v = self.builder.persistent_id(pid)?;
                    self.push(v, meta, at)?;
                }
                op::REDUCE => {
                    let args = self.pop(at, code)?;
                    let callable = self.pop(at, code)?;
                    self.object(CallKind::Reduce, callable, args, None, at)?;
                }
                op::STRING => {
                    let line = self.line()?;
                    let b = text::decode_string_literal(line).map_err(|e| self.text_err(e, at))?;
                    self.py2_str(Cow::Owned(b), None, at)?;
                }
                op::BINSTRING => {
                    let n = self.i32()?;
                    let n = u64::try_from(n)
                        .map_err(|_| Error::Malformed { offset: at, what: "BINSTRING with negative length" })?;
                    let start = self.pos;
                    let b = self.take_len(n)?;
                    self.py2_str(Cow::Borrowed(b), Some(start), at)?;
                }
                op::SHORT_BINSTRING => {
                    let n = self.u8()?;
                    let start = self.pos;
                    let b = self.take(usize::from(n))?;
                    self.py2_str(Cow::Borrowed(b), Some(start), at)?;
                }
                op::UNICODE => {
                    let line = self.line()?;
                    let s = text::decode_raw_unicode_escape(line).map_err(|e| self.text_err(e, at))?;
                    self.owned_str(s, at)?;
                }
                op::BINUNICODE => {
                    let n = self.u32()?;
                    let start = self.pos;
                    let b = self.take_len(u64::from(n))?;
                    self.str_at(b, start, at)?;
                }
                op::SHORT_BINUNICODE => {
                    let n = self.u8()?;
                    let start = self.pos;
                    let b = self.take(usize::from(n))?;
                    self.str_at(b, start, at)?;
                }
                op::BINUNICODE8 => {
                    let n = self.u64()?;
                    let start = self.pos;
                    let b = self.take_len(n)?;
                    self.str_at(b, start, at)?;
                }
                op::BINBYTES => {
                    let n = self.u32()?;
                    let b = self.take_len(u64::from(n))?;
                    self.bytes(Cow::Borrowed(b), false, at)?;
                }
                op::SHORT_BINBYTES => {
                    let n = self.u8()?;
                    let b = self.take(usize::from(n))?;
                    self.bytes(Cow::Borrowed(b), false, at)?;
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = self.u64()?;
                    let b = self.take_len(n)?;
                    self.bytes(Cow::Borrowed(b), code == op::BYTEARRAY8, at)?;
                }
                op::APPEND => {
                    let v = self.top_index(at, code)?;
                    let t = self.target_below(v, at, code)?;
                    self.mutate(t, v, Mutation::Append, at, code)?;
                }
                op::APPENDS => {
                    let m = self.pop_mark(at, code)?;
                    let t = self.target_below(m, at, code)?;
                    if self.vals.len() > m {
                        self.mutate(t, m, Mutation::Append, at, code)?;
                    }
                }
                op::BUILD => {
                    let v = self.top_index(at, code)?;
                    let t = self.target_below(v, at, code)?;
                    self.mutate(t, v, Mutation::Build, at, code)?;
                }
                op::GLOBAL => {
                    let (m, n) = self.global_names(at)?;
                    let v = self.builder.global(m, n)?;
                    let link = self.global_link(m, n);
                    self.push_leaf(v, Kind::Global, m.len() + n.len(), link, at)?;
                }
                op::STACK_GLOBAL => {
                    let len = self.vals.len();
                    if len < self.fence() + 2 {
                        return Err(underflow(at, code).into());
                    }
                    let (module, name) = (self.meta_of(len - 2), self.meta_of(len - 1));
                    let (Some(mm), Some(nm)) = (module, name) else { return Err(underflow(at, code).into()) };
                    if mm.kind != Kind::Str || nm.kind != Kind::Str {
                        return Err(Error::BadOperand { offset: at, opcode: name_of(code), expected: "two str" }.into());
                    }
                    let (name, nm) = self.pop(at, code)?;
                    let (module, mm) = self.pop(at, code)?;
                    let link = match (self.text_of(&mm), self.text_of(&nm)) {
                        (Some(m), Some(n)) => self.global_link(m, n),
                        _ => NO_ID,
                    };
                    let v = self.builder.stack_global(module, name)?;
                    let n = usize::try_from(mm.bytes.saturating_add(nm.bytes)).unwrap_or(usize::MAX);
                    self.push_leaf(v, Kind::Global, n, link, at)?;
                }
                op::DICT => {
                    let m = self.pop_mark(at, code)?;
                    if (self.vals.len() - m) % 2 != 0 {
                        return Err(Error::Malformed { offset: at, what: "odd number of items for DICT" }.into());
                    }
                    self.container(Kind::Dict, m, at)?;
                }
                op::EMPTY_DICT => self.container(Kind::Dict, self.vals.len(), at)?,
                op::EMPTY_LIST => self.container(Kind::List, self.vals.len(), at)?,
                op::EMPTY_TUPLE => self.container(Kind::Tuple, self.vals.len(), at)?,
                op::EMPTY_SET => self.container(Kind::Set, self.vals.len(), at)?,
                op::LIST => {
                    let m = self.pop_mark(at, code)?;
                    self.container(Kind::List, m, at)?;
                }
                op::TUPLE => {
                    let m = self.pop_mark(at, code)?;
                    self.container(Kind::Tuple, m, at)?;
                }
                op::FROZENSET => {
                    let m = self.pop_mark(at, code)?;
                    self.container(Kind::FrozenSet, m, at)?;
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1) + 1;
                    if self.vals.len() < self.fence() + n {
                        return Err(underflow(at, code).into());
                    }
                    self.container(Kind::Tuple, self.vals.len() - n, at)?;
                }
                op::GET => {
                    let key = self.text_key(at)?;
                    self.memo_get(key, at)?;
                }
                op::BINGET => {
                    let key = u64::from(self.u8()?);
                    if !self.fast_path(key, at)? {
                        self.memo_get(key, at)?;
                    }
                }
                op::LONG_BINGET => {
                    let key = u64::from(self.u32()?);
                    if !self.fast_path(key, at)? {
                        self.memo_get(key, at)?;
                    }
                }
                op::PUT => {
                    let key = self.text_key(at)?;
                    self.memo_put(key, at, code)?;
                }
                op::BINPUT => {
                    let key = self.u8()?;
                    self.memo_put(u64::from(key), at, code)?;
                }
                op::LONG_BINPUT => {
                    let key = self.u32()?;
                    self.memo_put(u64::from(key), at, code)?;
                }
                op::MEMOIZE => {
                    let key = usize_u64(self.written.len());
                    self.memo_put(key, at, code)?;
                }
                op::INST => {
                    let (module, name) = self.global_names(at)?;
                    let m = self.pop_mark(at, code)?;
                    self.container(Kind::Tuple, m, at)?;
                    let args = self.pop(at, code)?;
                    let cls = self.builder.global(module, name)?;
                    let bytes = module.len() + name.len();
                    self.count_node(bytes, at)?;
                    let link = self.global_link(module, name);
                    let cls_meta = Meta { link, ..Meta::leaf(Kind::Global, bytes) };
                    self.object(CallKind::Inst, (cls, cls_meta), args, None, at)?;
                }
                op::OBJ => {
                    let m = self.pop_mark(at, code)?;
                    if self.vals.len() <= m {
                        return Err(underflow(at, code).into());
                    }
                    self.container(Kind::Tuple, m + 1, at)?;
                    let args = self.pop(at, code)?;
                    let cls = self.pop(at, code)?;
                    self.object(CallKind::Obj, cls, args, None, at)?;
                }
                op::SETITEM => {
                    if self.vals.len() < self.fence() + 2 {
                        return Err(underflow(at, code).into());
                    }
                    let k = self.vals.len() - 2;
                    let t = self.target_below(k, at, code)?;
                    self.mutate(t, k, Mutation::SetItems, at, code)?;
                }
                op::SETITEMS => {
                    let m = self.pop_mark(at, code)?;
                    let t = self.target_below(m, at, code)?;
                    if self.vals.len() > m {
                        self.mutate(t, m, Mutation::SetItems, at, code)?;
                    }
                }
                op::ADDITEMS => {
                    let m = self.pop_mark(at, code)?;
                    let t = self.target_below(m, at, code)?;
                    if self.vals.len() > m {
                        self.mutate(t, m, Mutation::AddItems, at, code)?;
                    }
                }
                op::PROTO => {
                    if self.u8()? > op::HIGHEST_PROTOCOL {
                        return Err(Error::Unsupported { offset: at, what: "pickle protocol above 5" }.into());
                    }
                }
                op::NEWOBJ => {
                    let args = self.pop(at, code)?;
                    let cls = self.pop(at, code)?;
                    self.object(CallKind::NewObj, cls, args, None, at)?;
                }
                op::NEWOBJ_EX => {
                    let (kwargs, km) = self.pop(at, code)?;
                    let args = self.pop(at, code)?;
                    let cls = self.pop(at, code)?;
                    self.object(CallKind::NewObjEx { kwargs }, cls, args, Some(km), at)?;
                }
                op::FRAME => {
                    let n = self.u64()?;
                    let remaining = usize_u64(self.data.len() - self.pos.min(self.data.len()));
                    if n > remaining {
                        return Err(Error::UnexpectedEof { offset: self.pos, needed: n - remaining }.into());
                    }
                }
                op::EXT1 | op::EXT2 | op::EXT4 => {
                    match code {
                        op::EXT1 => drop(self.u8()?),
                        op::EXT2 => drop(self.u16()?),
                        _ => drop(self.u32()?),
                    }
                    return Err(Error::Unsupported {
                        offset: at,
                        what: "EXT1/EXT2/EXT4 (copyreg extension registry codes)",
                    }
                    .into());
                }
                op::NEXT_BUFFER => {
                    return Err(Error::Unsupported { offset: at, what: "NEXT_BUFFER (out-of-band buffers)" }.into());
                }
                op::READONLY_BUFFER => {
                    return Err(Error::Unsupported { offset: at, what: "READONLY_BUFFER (out-of-band buffers)" }.into());
                }
                _ => return Err(Error::UnknownOpcode { offset: at, opcode: code }.into()),
            }
        }
    }

    /// At a GET of `key` at `at`: reads the builder's template that starts with the memoized global, if one
    /// does and the bytes fit it (see [`template`]). Whether it did.
    fn fast_path(&mut self, key: u64, at: usize) -> R<bool, B::Error> {
        if self.templates.is_empty() {
            return Ok(false);
        }
        let Some(id) = self.memo.get(key) else { return Ok(false) };
        let Some(s) = self.shared.get(id as usize) else { return Ok(false) };
        if s.meta.kind != Kind::Global || s.meta.link == NO_ID || !self.written.contains(key) {
            return Ok(false);
        }
        let Some(&(module, name)) = self.globals.get(s.meta.link as usize) else { return Ok(false) };
        let Some(t) = self.templates.starting_with(module, name) else { return Ok(false) };
        template::read(self, t, at)
    }
}
