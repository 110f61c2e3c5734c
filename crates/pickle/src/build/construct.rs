//! Constructs a [`Builder`](super::Builder) reads straight from the input
//! ([`Builder::construct`](super::Builder::construct)): a run of opcodes that a consumer knows by heart
//! (torch's tensor rebuild call, say), turned into its value without the VM's dispatch, stack and
//! per-object values.
//!
//! The builder reports every opcode it reads to a [`Tally`], which keeps what the VM would have kept for
//! them: the size and depth of each value, the objects made and their payload, the shared leaves copied,
//! the stack and mark depths, the longest container, the memo keys written. The VM takes the construct only
//! if every limit that the same opcodes would have been checked against holds and no key it writes is ever
//! read; otherwise it runs the opcodes itself, so what it accepts and declines is the same either way.

use super::{Children, MemoIds, Meta, NO_ID, Shared};

/// The most values a construct may have on its stack at once, marks open, and memo keys written.
const STACK: usize = 16;
const MARKS: usize = 8;
const PUTS: usize = 16;

/// The memo as a construct sees it: the leaves (strings, bytes, globals, numbers) that GETs read.
pub struct Memo<'v, V> {
    pub(super) ids: &'v MemoIds,
    pub(super) shared: &'v [Shared<V>],
}

impl<V> Memo<'_, V> {
    /// Whether some GET reads `key`.
    pub fn is_read(&self, key: u64) -> bool {
        self.ids.is_read(key)
    }

    /// The leaf memoized under `key`, if some GET reads `key` and the object is a leaf (a string, bytes, a
    /// global, a number: nothing can change it, so a GET copies it at once); for a builder to look before it
    /// reads (a GET that it reads goes through [`Tally::get`]).
    pub fn leaf_value(&self, key: u64) -> Option<&V> {
        self.leaf(key).map(|(v, _)| v)
    }

    /// The leaf memoized under `key` and what the VM knows of it (see [`Memo::leaf_value`]).
    fn leaf(&self, key: u64) -> Option<(&V, Meta)> {
        let s = self.shared.get(self.ids.get(key)? as usize)?;
        s.meta.leaf.then_some((&s.value, s.meta))
    }
}

/// What the VM would have counted for the opcodes of a construct (see the [module docs](self)): the builder
/// calls one method per opcode, in order; each returns `None` where the VM would not have gone on (a stack
/// or mark underflow) or where the construct is larger than a tally holds, and the builder then gives up.
#[derive(Debug, Clone)]
pub struct Tally {
    stack: [Meta; STACK],
    len: usize,
    marks: [usize; MARKS],
    open: usize,
    pub(super) max_stack: usize,
    pub(super) max_marks: usize,
    pub(super) longest: u64,
    pub(super) made_nodes: u64,
    pub(super) made_bytes: u64,
    pub(super) copied_nodes: u64,
    pub(super) copied_bytes: u64,
    puts: [u64; PUTS],
    nputs: usize,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            stack: [Meta::SCALAR; STACK],
            len: 0,
            marks: [0; MARKS],
            open: 0,
            max_stack: 0,
            max_marks: 0,
            longest: 0,
            made_nodes: 0,
            made_bytes: 0,
            copied_nodes: 0,
            copied_bytes: 0,
            puts: [0; PUTS],
            nputs: 0,
        }
    }
}

impl Tally {
    /// An empty tally: nothing read yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, m: Meta) -> Option<()> {
        *self.stack.get_mut(self.len)? = m;
        self.len += 1;
        self.max_stack = self.max_stack.max(self.len);
        Some(())
    }

    fn fence(&self) -> usize {
        self.open.checked_sub(1).and_then(|i| self.marks.get(i).copied()).unwrap_or(0)
    }

    fn pop(&mut self) -> Option<Meta> {
        if self.len <= self.fence() {
            return None;
        }
        self.len -= 1;
        self.stack.get(self.len).copied()
    }

    /// Replaces the values from `from` up with the container the VM makes of them.
    fn container(&mut self, from: usize) -> Option<()> {
        let mut c = Children::default();
        for m in self.stack.get(from..self.len)? {
            c.add(m);
        }
        self.longest = self.longest.max(c.count);
        self.len = from;
        self.made_nodes += 1;
        self.push(c.container(0))
    }

    /// A GET of `key` (BINGET, LONG_BINGET): the memoized leaf, copied onto the stack.
    pub fn get<'m, V>(&mut self, memo: &'m Memo<'_, V>, key: u64) -> Option<&'m V> {
        let (v, m) = memo.leaf(key)?;
        self.copied_nodes = self.copied_nodes.saturating_add(m.nodes);
        self.copied_bytes = self.copied_bytes.saturating_add(m.bytes);
        self.push(Meta { shared: NO_ID, ..m })?;
        Some(v)
    }

    /// A string of `len` bytes (BINUNICODE, SHORT_BINUNICODE, ...).
    pub fn string(&mut self, len: usize) -> Option<()> {
        self.made_nodes += 1;
        self.made_bytes = self.made_bytes.saturating_add(len as u64);
        self.push(Meta::leaf(len))
    }

    /// An integer that fits `i64`, or a bool, or `None`.
    pub fn scalar(&mut self) -> Option<()> {
        self.push(Meta::SCALAR)
    }

    /// MARK.
    pub fn mark(&mut self) -> Option<()> {
        *self.marks.get_mut(self.open)? = self.len;
        self.open += 1;
        self.max_marks = self.max_marks.max(self.open);
        Some(())
    }

    /// TUPLE: the values above the innermost MARK, which it closes.
    pub fn tuple(&mut self) -> Option<()> {
        self.open = self.open.checked_sub(1)?;
        let from = *self.marks.get(self.open)?;
        self.container(from)
    }

    /// EMPTY_TUPLE (`n` = 0) and TUPLE1 to TUPLE3: the top `n` values.
    pub fn tuple_n(&mut self, n: usize) -> Option<()> {
        let from = self.len.checked_sub(n).filter(|&f| f >= self.fence())?;
        self.container(from)
    }

    /// BINPERSID: the persistent id of the top value.
    pub fn persistent_id(&mut self) -> Option<()> {
        let m = self.pop()?;
        let mut c = Children::default();
        c.add(&m);
        self.made_nodes += 1;
        self.push(Meta { len: 0, ..c.container(0) })
    }

    /// REDUCE: the call of the value below the top with the top as its arguments.
    pub fn reduce(&mut self) -> Option<()> {
        let args = self.pop()?;
        let callable = self.pop()?;
        let mut c = Children::default();
        c.add(&callable);
        c.add(&args);
        self.made_nodes += 1;
        self.push(Meta { len: 0, ..c.container(0) })
    }

    /// BINPUT, LONG_BINPUT of `key` (on the top value).
    pub fn put(&mut self, key: u64) -> Option<()> {
        if self.len <= self.fence() {
            return None;
        }
        *self.puts.get_mut(self.nputs)? = key;
        self.nputs += 1;
        Some(())
    }

    /// The memo keys written, in order.
    pub(super) fn puts(&self) -> &[u64] {
        self.puts.get(..self.nputs).unwrap_or_default()
    }

    /// What the construct leaves: one value, every MARK closed.
    pub(super) fn result(&self) -> Option<Meta> {
        (self.len == 1 && self.open == 0).then(|| self.stack.first().copied()).flatten()
    }
}

/// A construct read by a builder ([`Builder::construct`](super::Builder::construct)): its value, the
/// position just after its last opcode, and the [`Tally`] of its opcodes.
#[derive(Debug)]
pub struct Construct<V> {
    /// What the construct makes.
    pub value: V,
    /// The position just after its last opcode.
    pub end: usize,
    /// What the VM would have counted.
    pub tally: Tally,
}
