//! The pickle virtual machine: an iterative interpreter over an arena of nodes, then a bounded materialisation
//! into a [`Value`] tree.
//!
//! Objects the VM creates live in `arena` and are referred to by index, so the memo has reference semantics
//! (torch-save spec §5.10): a container memoized before it is filled is seen filled by every later GET. At STOP,
//! the graph reachable from the result is analysed without recursion (cycles, depth, expanded node and byte
//! counts — all checked against [`Limits`] before anything is copied), then materialised; nodes referenced more
//! than once are built once and cloned.

use std::collections::HashMap;

use crate::bigint::{IntRepr, from_le_twos};
use crate::error::Error;
use crate::limits::Limits;
use crate::opcode as op;
use crate::text::{self, TextError};
use crate::tree::{KindShape, Shape, reassemble};
use crate::value::Value;

type Result<T, E = Error> = std::result::Result<T, E>;

/// Decodes one pickle with [`Limits::default`]. Bytes after the STOP opcode are ignored (use [`decode_with`] to
/// learn where the pickle ended).
///
/// # Errors
/// Any [`Error`] describing malformed input, unsupported features or exceeded limits.
pub fn decode(data: &[u8]) -> Result<Value> {
    decode_with(data, &Limits::default()).map(|(v, _)| v)
}

/// Decodes one pickle from the start of `data` under `limits`; returns the value and the number of bytes
/// consumed (the position just after STOP), so that concatenated pickles (the legacy torch format) can be read
/// one after another.
///
/// # Errors
/// Any [`Error`] describing malformed input, unsupported features or exceeded limits.
pub fn decode_with(data: &[u8], limits: &Limits) -> Result<(Value, usize)> {
    match crate::build::build(data, limits, &mut crate::build::ValueBuilder) {
        Ok(done) => Ok(done),
        Err(crate::build::Declined) => decode_graph(data, limits),
    }
}

/// The full decoder alone: runs the pickle into an arena graph, analyses it (cycles, depth, expanded size)
/// and materialises it. Handles every pickle the single-pass decoder ([`crate::build`]) declines, and gives
/// the precise error for bad input. [`decode_with`] runs it when the single pass declines; calling it directly
/// is for differential tests (both must give the same value, or both an error) and diagnosis.
///
/// ```
/// let bytes = ckpt_pickle::encode(&ckpt_pickle::Value::Int(7), 2)?;
/// let limits = ckpt_pickle::Limits::default();
/// assert_eq!(ckpt_pickle::decode_graph(&bytes, &limits)?, ckpt_pickle::decode_with(&bytes, &limits)?);
/// # Ok::<(), ckpt_pickle::Error>(())
/// ```
///
/// # Errors
/// As [`decode_with`].
pub fn decode_graph(data: &[u8], limits: &Limits) -> Result<(Value, usize)> {
    let mut vm = Vm::new(data, limits);
    let (root, stop_at) = vm.run()?;
    let value = vm.finish(root, stop_at)?;
    Ok((value, vm.pos))
}

/// A stack / memo / container slot: scalars inline, everything else by arena index.
#[derive(Debug, Clone, Copy)]
enum Item {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Node(u32),
}

#[derive(Debug)]
enum Node {
    /// Already moved into the result.
    Taken,
    BigInt(Vec<u8>),
    Str(String),
    Bytes(Vec<u8>),
    ByteArray(Vec<u8>),
    List(Vec<Item>),
    Tuple(Vec<Item>),
    Dict(Vec<(Item, Item)>),
    Set(Vec<Item>),
    FrozenSet(Vec<Item>),
    Global(Box<(String, String)>),
    Object(Box<ObjNode>),
    PersistentId(Item),
}

#[derive(Debug)]
enum KindNode {
    Reduce,
    NewObj,
    NewObjEx(Item),
    Inst,
    Obj,
}

#[derive(Debug)]
struct ObjNode {
    callable: Item,
    args: Item,
    kind: KindNode,
    /// Every BUILD argument, in order (merged at materialisation).
    states: Vec<Item>,
    list_items: Vec<Item>,
    dict_items: Vec<(Item, Item)>,
}

impl ObjNode {
    fn new(kind: KindNode, callable: Item, args: Item) -> Self {
        ObjNode { callable, args, kind, states: Vec::new(), list_items: Vec::new(), dict_items: Vec::new() }
    }
}

impl Node {
    /// The `i`-th child slot, for the graph walk.
    fn child(&self, i: usize) -> Option<Item> {
        match self {
            Node::List(v) | Node::Tuple(v) | Node::Set(v) | Node::FrozenSet(v) => v.get(i).copied(),
            Node::Dict(pairs) => pairs.get(i / 2).map(|p| if i % 2 == 0 { p.0 } else { p.1 }),
            Node::PersistentId(inner) => (i == 0).then_some(*inner),
            Node::Object(o) => {
                let head: &[Item] = match &o.kind {
                    KindNode::NewObjEx(kwargs) => &[o.callable, o.args, *kwargs],
                    _ => &[o.callable, o.args],
                };
                if let Some(it) = head.get(i) {
                    return Some(*it);
                }
                let i = i - head.len();
                if let Some(it) = o.states.get(i) {
                    return Some(*it);
                }
                let i = i - o.states.len();
                if let Some(it) = o.list_items.get(i) {
                    return Some(*it);
                }
                let i = i - o.list_items.len();
                o.dict_items.get(i / 2).map(|p| if i % 2 == 0 { p.0 } else { p.1 })
            }
            _ => None,
        }
    }

    /// Payload bytes owned by this node itself.
    fn own_bytes(&self) -> u64 {
        let n = match self {
            Node::BigInt(b) | Node::Bytes(b) | Node::ByteArray(b) => b.len(),
            Node::Str(s) => s.len(),
            Node::Global(g) => g.0.len().saturating_add(g.1.len()),
            _ => 0,
        };
        n as u64
    }
}

/// The memo: dense for the sequential keys CPython writes, a map for sparse (hostile) keys.
#[derive(Default)]
struct Memo {
    dense: Vec<Option<Item>>,
    sparse: HashMap<u64, Item>,
    count: usize,
}

impl Memo {
    fn get(&self, key: u64) -> Option<Item> {
        if let Some(Some(it)) = usize::try_from(key).ok().and_then(|k| self.dense.get(k)) {
            return Some(*it);
        }
        self.sparse.get(&key).copied()
    }

    /// Stores `item` under `key`; `Err(())` when that would exceed `max` distinct keys.
    fn put(&mut self, key: u64, item: Item, max: usize) -> Result<(), ()> {
        if !self.sparse.is_empty() {
            if let Some(slot) = self.sparse.get_mut(&key) {
                *slot = item;
                return Ok(());
            }
        }
        let k = usize::try_from(key).unwrap_or(usize::MAX);
        if let Some(slot) = self.dense.get_mut(k) {
            if slot.is_none() {
                if self.count >= max {
                    return Err(());
                }
                self.count += 1;
            }
            *slot = Some(item);
            return Ok(());
        }
        if self.count >= max {
            return Err(());
        }
        self.count += 1;
        // Grow the dense part only proportionally to the number of entries (a LONG_BINPUT of 0xffffffff must
        // not allocate 4 Gi slots).
        if k <= self.count.saturating_mul(2).saturating_add(1024) {
            self.dense.resize(k, None);
            self.dense.push(Some(item));
        } else {
            self.sparse.insert(key, item);
        }
        Ok(())
    }
}

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    limits: &'a Limits,
    stack: Vec<Item>,
    marks: Vec<usize>,
    arena: Vec<Node>,
    memo: Memo,
    payload: u64,
}

fn name_of(opcode: u8) -> &'static str {
    op::name(opcode).unwrap_or("?")
}

fn usize_to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl<'a> Vm<'a> {
    fn new(data: &'a [u8], limits: &'a Limits) -> Self {
        Vm {
            data,
            pos: 0,
            limits,
            stack: Vec::new(),
            marks: Vec::new(),
            arena: Vec::new(),
            memo: Memo::default(),
            payload: 0,
        }
    }

    // ----- input -----

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let remaining = self.data.len() - self.pos.min(self.data.len());
        if n > remaining {
            return Err(Error::UnexpectedEof { offset: self.pos, needed: usize_to_u64(n - remaining) });
        }
        let s = self.data.get(self.pos..self.pos + n).ok_or(Error::UnexpectedEof { offset: self.pos, needed: 1 })?;
        self.pos += n;
        Ok(s)
    }

    /// Takes a file-controlled 64-bit length, checked against the remaining input before anything is allocated.
    fn take_len(&mut self, n: u64) -> Result<&'a [u8]> {
        let remaining = usize_to_u64(self.data.len() - self.pos.min(self.data.len()));
        if n > remaining {
            return Err(Error::UnexpectedEof { offset: self.pos, needed: n - remaining });
        }
        // n <= remaining <= usize::MAX
        self.take(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn arr<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.arr::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.arr()?))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr()?))
    }

    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.arr()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr()?))
    }

    /// One text line without its `\n`.
    fn line(&mut self) -> Result<&'a [u8]> {
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

    // ----- stack -----

    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn push(&mut self, item: Item, at: usize) -> Result<()> {
        if self.stack.len() >= self.limits.max_container_len {
            return Err(self.limit("stack items", self.limits.max_container_len, at));
        }
        self.stack.push(item);
        Ok(())
    }

    fn pop(&mut self, at: usize, opcode: u8) -> Result<Item> {
        if self.stack.len() <= self.fence() {
            return Err(Error::StackUnderflow { offset: at, opcode: name_of(opcode) });
        }
        self.stack.pop().ok_or(Error::StackUnderflow { offset: at, opcode: name_of(opcode) })
    }

    fn top(&self, at: usize, opcode: u8) -> Result<Item> {
        if self.stack.len() <= self.fence() {
            return Err(Error::StackUnderflow { offset: at, opcode: name_of(opcode) });
        }
        self.stack.last().copied().ok_or(Error::StackUnderflow { offset: at, opcode: name_of(opcode) })
    }

    /// Pops the innermost MARK and everything above it.
    fn pop_mark(&mut self, at: usize, opcode: u8) -> Result<Vec<Item>> {
        let m = self.marks.pop().ok_or(Error::MarkNotFound { offset: at, opcode: name_of(opcode) })?;
        if m > self.stack.len() {
            return Err(Error::StackUnderflow { offset: at, opcode: name_of(opcode) });
        }
        Ok(self.stack.split_off(m))
    }

    /// For APPENDS/SETITEMS/ADDITEMS: pops the MARK and the items above it, and returns them with the stack
    /// index of the target just below the MARK (which must itself be above the next MARK).
    fn pop_mark_with_target(&mut self, at: usize, opcode: u8) -> Result<(usize, Vec<Item>)> {
        let items = self.pop_mark(at, opcode)?;
        let target = self.stack.len();
        if target <= self.fence() {
            return Err(Error::StackUnderflow { offset: at, opcode: name_of(opcode) });
        }
        Ok((target - 1, items))
    }

    fn limit(&self, what: &'static str, limit: usize, at: usize) -> Error {
        Error::Limit { what, limit: usize_to_u64(limit), offset: at }
    }

    // ----- arena -----

    fn node(&mut self, node: Node, at: usize) -> Result<Item> {
        let cap = self.limits.max_nodes.min(u32::MAX as usize);
        if self.arena.len() >= cap {
            return Err(self.limit("nodes", self.limits.max_nodes, at));
        }
        let extra = node.own_bytes();
        self.payload = self.payload.saturating_add(extra);
        if self.payload > usize_to_u64(self.limits.max_alloc_bytes) {
            return Err(self.limit("payload bytes", self.limits.max_alloc_bytes, at));
        }
        if let Node::List(v) | Node::Tuple(v) | Node::Set(v) | Node::FrozenSet(v) = &node {
            self.check_len(v.len(), at)?;
        }
        if let Node::Dict(v) = &node {
            self.check_len(v.len(), at)?;
        }
        let id = u32::try_from(self.arena.len()).map_err(|_| self.limit("nodes", self.limits.max_nodes, at))?;
        self.arena.push(node);
        Ok(Item::Node(id))
    }

    fn push_node(&mut self, node: Node, at: usize) -> Result<()> {
        let it = self.node(node, at)?;
        self.push(it, at)
    }

    fn check_len(&self, len: usize, at: usize) -> Result<()> {
        if len > self.limits.max_container_len {
            return Err(self.limit("container length", self.limits.max_container_len, at));
        }
        Ok(())
    }

    fn arena_mut(&mut self, item: Item) -> Option<&mut Node> {
        match item {
            Item::Node(id) => self.arena.get_mut(id as usize),
            _ => None,
        }
    }

    fn str_node(&mut self, bytes: &[u8], at_payload: usize, at: usize) -> Result<()> {
        let s = match std::str::from_utf8(bytes) {
            Ok(s) => s.to_owned(),
            Err(e) => {
                return Err(Error::InvalidUtf8 { offset: at_payload + e.valid_up_to() });
            }
        };
        self.push_node(Node::Str(s), at)
    }

    fn int(&mut self, repr: IntRepr, at: usize) -> Result<()> {
        match repr {
            IntRepr::Small(v) => self.push(Item::Int(v), at),
            IntRepr::Big(b) => self.push_node(Node::BigInt(b), at),
        }
    }

    fn text_err(&self, e: TextError, at: usize) -> Error {
        match e {
            TextError::Bad(what) => Error::BadText { offset: at, what },
            TextError::TooManyDigits => self.limit("integer text digits", self.limits.max_int_digits, at),
            TextError::Surrogate(i) => Error::InvalidUtf8 { offset: at + 1 + i },
        }
    }

    fn memo_put(&mut self, key: u64, at: usize, opcode: u8) -> Result<()> {
        let item = self.top(at, opcode)?;
        self.memo
            .put(key, item, self.limits.max_memo)
            .map_err(|()| self.limit("memo entries", self.limits.max_memo, at))
    }

    fn memo_get(&mut self, key: u64, at: usize) -> Result<()> {
        let item = self.memo.get(key).ok_or(Error::MemoMissing { offset: at, key })?;
        self.push(item, at)
    }

    fn text_key(&mut self, at: usize) -> Result<u64> {
        let line = self.line()?;
        match text::parse_py_int(line, 10, self.limits.max_int_digits) {
            Ok(IntRepr::Small(v)) => {
                u64::try_from(v).map_err(|_| Error::BadText { offset: at, what: "negative memo key" })
            }
            Ok(IntRepr::Big(_)) => Err(Error::BadText { offset: at, what: "memo key out of range" }),
            Err(e) => Err(self.text_err(e, at)),
        }
    }

    fn global_names(&mut self, at: usize) -> Result<(String, String)> {
        let module = self.line()?;
        let name = self.line()?;
        if module.is_empty() || name.is_empty() {
            return Err(Error::BadText { offset: at, what: "empty module or name in GLOBAL/INST" });
        }
        let m = std::str::from_utf8(module).map_err(|_| Error::InvalidUtf8 { offset: at })?;
        let n = std::str::from_utf8(name).map_err(|_| Error::InvalidUtf8 { offset: at })?;
        Ok((m.to_owned(), n.to_owned()))
    }

    // ----- mutation of memoized containers -----

    fn append_to(&mut self, target: Item, items: Vec<Item>, at: usize, opcode: u8) -> Result<()> {
        let max = self.limits.max_container_len;
        let cap_err = self.limit("container length", max, at);
        let v = match self.arena_mut(target) {
            Some(Node::List(v)) => v,
            Some(Node::Object(o)) => &mut o.list_items,
            _ => {
                return Err(Error::BadOperand { offset: at, opcode: name_of(opcode), expected: "a list or object" });
            }
        };
        if v.len().saturating_add(items.len()) > max {
            return Err(cap_err);
        }
        v.extend(items);
        Ok(())
    }

    fn set_items(&mut self, target: Item, pairs: Vec<(Item, Item)>, at: usize, opcode: u8) -> Result<()> {
        let max = self.limits.max_container_len;
        let cap_err = self.limit("container length", max, at);
        let v = match self.arena_mut(target) {
            Some(Node::Dict(v)) => v,
            Some(Node::Object(o)) => &mut o.dict_items,
            _ => {
                return Err(Error::BadOperand { offset: at, opcode: name_of(opcode), expected: "a dict or object" });
            }
        };
        if v.len().saturating_add(pairs.len()) > max {
            return Err(cap_err);
        }
        v.extend(pairs);
        Ok(())
    }

    fn pairs(items: Vec<Item>, at: usize, opcode: u8) -> Result<Vec<(Item, Item)>> {
        if items.len() % 2 != 0 {
            return Err(Error::Malformed { offset: at, what: odd_items_message(opcode) });
        }
        let mut out = Vec::with_capacity(items.len() / 2);
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            out.push((k, v));
        }
        Ok(out)
    }

    fn object(&mut self, obj: ObjNode, at: usize) -> Result<()> {
        self.push_node(Node::Object(Box::new(obj)), at)
    }

    // ----- the interpreter -----

    /// Runs to STOP; returns the result item and the STOP offset.
    #[allow(clippy::too_many_lines)]
    fn run(&mut self) -> Result<(Item, usize)> {
        loop {
            let at = self.pos;
            let Some(&code) = self.data.get(at) else {
                return Err(Error::NoStop { offset: self.data.len() });
            };
            self.pos += 1;
            match code {
                op::MARK => {
                    if self.marks.len() >= self.limits.max_mark_depth {
                        return Err(Error::DepthExceeded { limit: self.limits.max_mark_depth, offset: at });
                    }
                    self.marks.push(self.stack.len());
                }
                op::STOP => {
                    if !self.marks.is_empty() {
                        return Err(Error::TrailingMark { offset: at, marks: self.marks.len() });
                    }
                    let root = self.pop(at, code)?;
                    return Ok((root, at));
                }
                op::POP => {
                    // CPython: a MARK on top of the stack is popped instead of an item.
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop(at, code)?;
                    }
                }
                op::POP_MARK => {
                    self.pop_mark(at, code)?;
                }
                op::DUP => {
                    let top = self.top(at, code)?;
                    self.push(top, at)?;
                }
                op::FLOAT => {
                    let line = self.line()?;
                    let v = text::parse_float(line).ok_or(Error::BadText { offset: at, what: "invalid FLOAT" })?;
                    self.push(Item::Float(v), at)?;
                }
                op::INT => {
                    let line = self.line()?;
                    if line.is_empty() {
                        return Err(Error::BadText { offset: at, what: "empty INT" });
                    }
                    match text::strtol_full(line) {
                        Some(v @ (0 | 1)) if line.len() == 2 => self.push(Item::Bool(v == 1), at)?,
                        Some(v) => self.push(Item::Int(v), at)?,
                        None => {
                            let repr = text::parse_py_int(line, 0, self.limits.max_int_digits)
                                .map_err(|e| self.text_err(e, at))?;
                            self.int(repr, at)?;
                        }
                    }
                }
                op::BININT => {
                    let v = self.i32()?;
                    self.push(Item::Int(i64::from(v)), at)?;
                }
                op::BININT1 => {
                    let v = self.u8()?;
                    self.push(Item::Int(i64::from(v)), at)?;
                }
                op::BININT2 => {
                    let v = self.u16()?;
                    self.push(Item::Int(i64::from(v)), at)?;
                }
                op::LONG => {
                    let mut line = self.line()?;
                    if line.is_empty() {
                        return Err(Error::BadText { offset: at, what: "empty LONG" });
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
                op::NONE => self.push(Item::None, at)?,
                op::NEWTRUE => self.push(Item::Bool(true), at)?,
                op::NEWFALSE => self.push(Item::Bool(false), at)?,
                op::PERSID => {
                    let line = self.line()?;
                    if !line.is_ascii() {
                        return Err(Error::BadText { offset: at, what: "PERSID must be ASCII" });
                    }
                    let s = String::from_utf8_lossy(line).into_owned();
                    let id = self.node(Node::Str(s), at)?;
                    self.push_node(Node::PersistentId(id), at)?;
                }
                op::BINPERSID => {
                    let pid = self.pop(at, code)?;
                    self.push_node(Node::PersistentId(pid), at)?;
                }
                op::REDUCE => {
                    let args = self.pop(at, code)?;
                    let callable = self.pop(at, code)?;
                    self.object(ObjNode::new(KindNode::Reduce, callable, args), at)?;
                }
                op::STRING => {
                    let line = self.line()?;
                    let b = text::decode_string_literal(line).map_err(|e| self.text_err(e, at))?;
                    self.push_node(Node::Bytes(b), at)?;
                }
                op::BINSTRING => {
                    let n = self.i32()?;
                    let n = u64::try_from(n)
                        .map_err(|_| Error::Malformed { offset: at, what: "BINSTRING with negative length" })?;
                    let b = self.take_len(n)?;
                    self.push_node(Node::Bytes(b.to_vec()), at)?;
                }
                op::SHORT_BINSTRING => {
                    let n = self.u8()?;
                    let b = self.take(usize::from(n))?;
                    self.push_node(Node::Bytes(b.to_vec()), at)?;
                }
                op::UNICODE => {
                    let line = self.line()?;
                    let s = text::decode_raw_unicode_escape(line).map_err(|e| self.text_err(e, at))?;
                    self.push_node(Node::Str(s), at)?;
                }
                op::BINUNICODE => {
                    let n = self.u32()?;
                    let start = self.pos;
                    let b = self.take_len(u64::from(n))?;
                    self.str_node(b, start, at)?;
                }
                op::SHORT_BINUNICODE => {
                    let n = self.u8()?;
                    let start = self.pos;
                    let b = self.take(usize::from(n))?;
                    self.str_node(b, start, at)?;
                }
                op::BINUNICODE8 => {
                    let n = self.u64()?;
                    let start = self.pos;
                    let b = self.take_len(n)?;
                    self.str_node(b, start, at)?;
                }
                op::BINBYTES => {
                    let n = self.u32()?;
                    let b = self.take_len(u64::from(n))?;
                    self.push_node(Node::Bytes(b.to_vec()), at)?;
                }
                op::SHORT_BINBYTES => {
                    let n = self.u8()?;
                    let b = self.take(usize::from(n))?;
                    self.push_node(Node::Bytes(b.to_vec()), at)?;
                }
                op::BINBYTES8 => {
                    let n = self.u64()?;
                    let b = self.take_len(n)?;
                    self.push_node(Node::Bytes(b.to_vec()), at)?;
                }
                op::BYTEARRAY8 => {
                    let n = self.u64()?;
                    let b = self.take_len(n)?;
                    self.push_node(Node::ByteArray(b.to_vec()), at)?;
                }
                op::APPEND => {
                    let value = self.pop(at, code)?;
                    let target = self.top(at, code)?;
                    self.append_to(target, vec![value], at, code)?;
                }
                op::APPENDS => {
                    let (t, items) = self.pop_mark_with_target(at, code)?;
                    if !items.is_empty() {
                        let target = self.stack.get(t).copied().unwrap_or(Item::None);
                        self.append_to(target, items, at, code)?;
                    }
                }
                op::BUILD => {
                    let state = self.pop(at, code)?;
                    let target = self.top(at, code)?;
                    match self.arena_mut(target) {
                        Some(Node::Object(o)) => o.states.push(state),
                        _ => {
                            return Err(Error::BadOperand {
                                offset: at,
                                opcode: name_of(code),
                                expected: "an object (REDUCE/NEWOBJ/INST/OBJ result)",
                            });
                        }
                    }
                }
                op::GLOBAL => {
                    let (m, n) = self.global_names(at)?;
                    self.push_node(Node::Global(Box::new((m, n))), at)?;
                }
                op::DICT => {
                    let items = self.pop_mark(at, code)?;
                    let pairs = Self::pairs(items, at, code)?;
                    self.push_node(Node::Dict(pairs), at)?;
                }
                op::EMPTY_DICT => self.push_node(Node::Dict(Vec::new()), at)?,
                op::GET => {
                    let key = self.text_key(at)?;
                    self.memo_get(key, at)?;
                }
                op::BINGET => {
                    let key = self.u8()?;
                    self.memo_get(u64::from(key), at)?;
                }
                op::LONG_BINGET => {
                    let key = self.u32()?;
                    self.memo_get(u64::from(key), at)?;
                }
                op::INST => {
                    let (m, n) = self.global_names(at)?;
                    let items = self.pop_mark(at, code)?;
                    let cls = self.node(Node::Global(Box::new((m, n))), at)?;
                    let args = self.node(Node::Tuple(items), at)?;
                    self.object(ObjNode::new(KindNode::Inst, cls, args), at)?;
                }
                op::OBJ => {
                    let mut items = self.pop_mark(at, code)?;
                    if items.is_empty() {
                        return Err(Error::StackUnderflow { offset: at, opcode: name_of(code) });
                    }
                    let cls = items.remove(0);
                    let args = self.node(Node::Tuple(items), at)?;
                    self.object(ObjNode::new(KindNode::Obj, cls, args), at)?;
                }
                op::LIST => {
                    let items = self.pop_mark(at, code)?;
                    self.push_node(Node::List(items), at)?;
                }
                op::EMPTY_LIST => self.push_node(Node::List(Vec::new()), at)?,
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
                    let key = usize_to_u64(self.memo.count);
                    self.memo_put(key, at, code)?;
                }
                op::SETITEM => {
                    let value = self.pop(at, code)?;
                    let key = self.pop(at, code)?;
                    let target = self.top(at, code)?;
                    self.set_items(target, vec![(key, value)], at, code)?;
                }
                op::SETITEMS => {
                    let (t, items) = self.pop_mark_with_target(at, code)?;
                    if !items.is_empty() {
                        let pairs = Self::pairs(items, at, code)?;
                        let target = self.stack.get(t).copied().unwrap_or(Item::None);
                        self.set_items(target, pairs, at, code)?;
                    }
                }
                op::TUPLE => {
                    let items = self.pop_mark(at, code)?;
                    self.push_node(Node::Tuple(items), at)?;
                }
                op::EMPTY_TUPLE => self.push_node(Node::Tuple(Vec::new()), at)?,
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1) + 1;
                    if self.stack.len() < self.fence() + n {
                        return Err(Error::StackUnderflow { offset: at, opcode: name_of(code) });
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push_node(Node::Tuple(items), at)?;
                }
                op::BINFLOAT => {
                    let v = f64::from_be_bytes(self.arr()?);
                    self.push(Item::Float(v), at)?;
                }
                op::PROTO => {
                    let p = self.u8()?;
                    if p > op::HIGHEST_PROTOCOL {
                        return Err(Error::Unsupported { offset: at, what: "pickle protocol above 5" });
                    }
                }
                op::NEWOBJ => {
                    let args = self.pop(at, code)?;
                    let cls = self.pop(at, code)?;
                    self.object(ObjNode::new(KindNode::NewObj, cls, args), at)?;
                }
                op::NEWOBJ_EX => {
                    let kwargs = self.pop(at, code)?;
                    let args = self.pop(at, code)?;
                    let cls = self.pop(at, code)?;
                    self.object(ObjNode::new(KindNode::NewObjEx(kwargs), cls, args), at)?;
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
                    });
                }
                op::EMPTY_SET => self.push_node(Node::Set(Vec::new()), at)?,
                op::ADDITEMS => {
                    let (t, items) = self.pop_mark_with_target(at, code)?;
                    if !items.is_empty() {
                        let target = self.stack.get(t).copied().unwrap_or(Item::None);
                        let max = self.limits.max_container_len;
                        let cap_err = self.limit("container length", max, at);
                        match self.arena_mut(target) {
                            Some(Node::Set(v)) => {
                                if v.len().saturating_add(items.len()) > max {
                                    return Err(cap_err);
                                }
                                v.extend(items);
                            }
                            _ => {
                                return Err(Error::BadOperand { offset: at, opcode: name_of(code), expected: "a set" });
                            }
                        }
                    }
                }
                op::FROZENSET => {
                    let items = self.pop_mark(at, code)?;
                    self.push_node(Node::FrozenSet(items), at)?;
                }
                op::STACK_GLOBAL => {
                    let name = self.pop(at, code)?;
                    let module = self.pop(at, code)?;
                    let (m, n) = match (self.str_of(module), self.str_of(name)) {
                        (Some(m), Some(n)) => (m.to_owned(), n.to_owned()),
                        _ => {
                            return Err(Error::BadOperand { offset: at, opcode: name_of(code), expected: "two str" });
                        }
                    };
                    self.push_node(Node::Global(Box::new((m, n))), at)?;
                }
                op::FRAME => {
                    let n = self.u64()?;
                    let remaining = usize_to_u64(self.data.len() - self.pos.min(self.data.len()));
                    if n > remaining {
                        return Err(Error::UnexpectedEof { offset: self.pos, needed: n - remaining });
                    }
                }
                op::NEXT_BUFFER => {
                    return Err(Error::Unsupported { offset: at, what: "NEXT_BUFFER (out-of-band buffers)" });
                }
                op::READONLY_BUFFER => {
                    return Err(Error::Unsupported { offset: at, what: "READONLY_BUFFER (out-of-band buffers)" });
                }
                _ => {
                    return Err(Error::UnknownOpcode { offset: at, opcode: code });
                }
            }
        }
    }

    fn str_of(&self, item: Item) -> Option<&str> {
        match item {
            Item::Node(id) => match self.arena.get(id as usize) {
                Some(Node::Str(s)) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    // ----- result -----

    fn finish(&mut self, root: Item, stop_at: usize) -> Result<Value> {
        let Item::Node(root_id) = root else {
            return Ok(scalar(root));
        };
        let refs = self.analyse(root_id, stop_at)?;
        let mut m = Materializer { arena: &mut self.arena, refs, cache: HashMap::default() };
        Ok(m.run(root_id))
    }

    /// Walks the graph reachable from `root` iteratively: rejects cycles, checks depth, expanded node count and
    /// expanded payload bytes against the limits, and returns each node's incoming-reference count.
    fn analyse(&self, root: u32, stop_at: usize) -> Result<Vec<u32>> {
        #[derive(Clone, Copy)]
        struct Info {
            nodes: u64,
            bytes: u64,
            depth: u64,
        }
        struct Frame {
            id: u32,
            next: usize,
            acc: Info,
        }
        const UNSEEN: u8 = 0;
        const ACTIVE: u8 = 1;
        const DONE: u8 = 2;

        let n = self.arena.len();
        let mut state = vec![UNSEEN; n];
        let mut info = vec![Info { nodes: 0, bytes: 0, depth: 0 }; n];
        let mut refs = vec![0u32; n];
        let max_nodes = usize_to_u64(self.limits.max_nodes);
        let max_bytes = usize_to_u64(self.limits.max_alloc_bytes);
        let max_depth = self.limits.max_depth;
        let depth_err = Error::DepthExceeded { limit: max_depth, offset: stop_at };
        if max_depth == 0 {
            return Err(depth_err);
        }

        let zero = Info { nodes: 0, bytes: 0, depth: 0 };
        let mut stack: Vec<Frame> = vec![Frame { id: root, next: 0, acc: zero }];
        if let Some(s) = state.get_mut(root as usize) {
            *s = ACTIVE;
        }
        if let Some(r) = refs.get_mut(root as usize) {
            *r = 1;
        }
        while let Some(frame) = stack.last_mut() {
            let node = self.arena.get(frame.id as usize);
            let child = node.and_then(|nd| nd.child(frame.next));
            match child {
                Some(item) => {
                    frame.next += 1;
                    let Item::Node(c) = item else {
                        frame.acc.nodes = frame.acc.nodes.saturating_add(1);
                        frame.acc.depth = frame.acc.depth.max(1);
                        continue;
                    };
                    let ci = c as usize;
                    if let Some(r) = refs.get_mut(ci) {
                        *r = r.saturating_add(1);
                    }
                    match state.get(ci).copied() {
                        Some(DONE) => {
                            let ch = info.get(ci).copied().unwrap_or(zero);
                            frame.acc.nodes = frame.acc.nodes.saturating_add(ch.nodes);
                            frame.acc.bytes = frame.acc.bytes.saturating_add(ch.bytes);
                            frame.acc.depth = frame.acc.depth.max(ch.depth);
                            if frame.acc.nodes > max_nodes {
                                return Err(Error::Limit {
                                    what: "materialised nodes",
                                    limit: max_nodes,
                                    offset: stop_at,
                                });
                            }
                            if frame.acc.bytes > max_bytes {
                                return Err(Error::Limit {
                                    what: "materialised payload bytes",
                                    limit: max_bytes,
                                    offset: stop_at,
                                });
                            }
                        }
                        Some(ACTIVE) => return Err(Error::Recursive { offset: stop_at }),
                        Some(_) => {
                            // The child sits at depth stack.len() + 1.
                            if stack.len() >= max_depth {
                                return Err(depth_err);
                            }
                            if let Some(s) = state.get_mut(ci) {
                                *s = ACTIVE;
                            }
                            stack.push(Frame { id: c, next: 0, acc: zero });
                        }
                        None => {}
                    }
                }
                None => {
                    let own = node.map_or(0, Node::own_bytes);
                    let done = Info {
                        nodes: frame.acc.nodes.saturating_add(1),
                        bytes: frame.acc.bytes.saturating_add(own),
                        depth: frame.acc.depth.saturating_add(1),
                    };
                    let id = frame.id as usize;
                    if done.nodes > max_nodes {
                        return Err(Error::Limit { what: "materialised nodes", limit: max_nodes, offset: stop_at });
                    }
                    if done.bytes > max_bytes {
                        return Err(Error::Limit {
                            what: "materialised payload bytes",
                            limit: max_bytes,
                            offset: stop_at,
                        });
                    }
                    if done.depth > usize_to_u64(max_depth) {
                        return Err(depth_err);
                    }
                    if let Some(s) = state.get_mut(id) {
                        *s = DONE;
                    }
                    if let Some(i) = info.get_mut(id) {
                        *i = done;
                    }
                    stack.pop();
                    if let Some(parent) = stack.last_mut() {
                        parent.acc.nodes = parent.acc.nodes.saturating_add(done.nodes);
                        parent.acc.bytes = parent.acc.bytes.saturating_add(done.bytes);
                        parent.acc.depth = parent.acc.depth.max(done.depth);
                        if parent.acc.nodes > max_nodes {
                            return Err(Error::Limit { what: "materialised nodes", limit: max_nodes, offset: stop_at });
                        }
                    }
                }
            }
        }
        Ok(refs)
    }
}

fn odd_items_message(opcode: u8) -> &'static str {
    if opcode == op::DICT { "odd number of items for DICT" } else { "odd number of items for SETITEMS" }
}

fn scalar(item: Item) -> Value {
    match item {
        Item::None => Value::None,
        Item::Bool(b) => Value::Bool(b),
        Item::Int(i) => Value::Int(i),
        Item::Float(f) => Value::Float(f),
        Item::Node(_) => Value::None,
    }
}

/// Builds the [`Value`] tree without recursion. Every node is built at most once: a node referenced once is
/// moved out of the arena; a shared node is built on first use, cached, cloned for further uses, and moved out
/// of the cache on its last use.
struct Materializer<'a> {
    arena: &'a mut Vec<Node>,
    refs: Vec<u32>,
    cache: HashMap<u32, Value, IdHash>,
}

/// A hasher for `u32` arena ids (already unique and well spread).
#[derive(Default, Clone, Copy)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }
}

type IdHash = std::hash::BuildHasherDefault<IdHasher>;

/// A container under construction.
struct Frame {
    id: u32,
    shape: Shape,
    children: std::vec::IntoIter<Item>,
    out: Vec<Value>,
}

/// The result of visiting a node: a finished value, or a container to fill.
enum Visit {
    Ready(Value),
    Open(Frame),
}

impl Materializer<'_> {
    fn run(&mut self, root: u32) -> Value {
        let mut stack: Vec<Frame> = Vec::new();
        let mut done = match self.visit(root) {
            Visit::Ready(v) => return v,
            Visit::Open(frame) => {
                stack.push(frame);
                None
            }
        };
        loop {
            let Some(top) = stack.last_mut() else {
                return done.unwrap_or_default();
            };
            if let Some(d) = done.take() {
                top.out.push(d);
            }
            match top.children.next() {
                Some(Item::Node(c)) => match self.visit(c) {
                    Visit::Ready(v) => done = Some(v),
                    Visit::Open(frame) => stack.push(frame),
                },
                Some(scalar_item) => done = Some(scalar(scalar_item)),
                None => {
                    let Some(frame) = stack.pop() else {
                        return Value::None;
                    };
                    let v = reassemble(frame.shape, frame.out);
                    done = Some(self.built(frame.id, v));
                }
            }
        }
    }

    /// One use of node `id`.
    fn visit(&mut self, id: u32) -> Visit {
        let Some(r) = self.refs.get_mut(id as usize) else {
            return Visit::Ready(Value::None);
        };
        *r = r.saturating_sub(1);
        let remaining = *r;
        if self.cache.contains_key(&id) {
            // Built before: clone, or move out on the last use.
            let v = if remaining == 0 {
                self.cache.remove(&id).unwrap_or_default()
            } else {
                self.cache.get(&id).cloned().unwrap_or_default()
            };
            return Visit::Ready(v);
        }
        let Some(slot) = self.arena.get_mut(id as usize) else {
            return Visit::Ready(Value::None);
        };
        let (shape, children) = match std::mem::replace(slot, Node::Taken) {
            Node::Taken => return Visit::Ready(Value::None),
            Node::BigInt(b) => return Visit::Ready(self.built(id, Value::BigInt(b))),
            Node::Str(s) => return Visit::Ready(self.built(id, Value::Str(s))),
            Node::Bytes(b) => return Visit::Ready(self.built(id, Value::Bytes(b))),
            Node::ByteArray(b) => return Visit::Ready(self.built(id, Value::ByteArray(b))),
            Node::Global(g) => {
                let (module, name) = *g;
                return Visit::Ready(self.built(id, Value::Global { module, name }));
            }
            Node::List(v) => (Shape::List, v),
            Node::Tuple(v) => (Shape::Tuple, v),
            Node::Set(v) => (Shape::Set, v),
            Node::FrozenSet(v) => (Shape::FrozenSet, v),
            Node::Dict(pairs) => {
                let mut flat = Vec::with_capacity(pairs.len() * 2);
                for (k, v) in pairs {
                    flat.push(k);
                    flat.push(v);
                }
                (Shape::Dict, flat)
            }
            Node::PersistentId(inner) => (Shape::PersistentId, vec![inner]),
            Node::Object(o) => {
                let ObjNode { callable, args, kind, states, list_items, dict_items } = *o;
                let mut flat = Vec::with_capacity(3 + states.len() + list_items.len() + 2 * dict_items.len());
                flat.push(callable);
                flat.push(args);
                let kind = match kind {
                    KindNode::Reduce => KindShape::Reduce,
                    KindNode::NewObj => KindShape::NewObj,
                    KindNode::NewObjEx(kw) => {
                        flat.push(kw);
                        KindShape::NewObjEx
                    }
                    KindNode::Inst => KindShape::Inst,
                    KindNode::Obj => KindShape::Obj,
                };
                let shape =
                    Shape::Object { kind, n_states: states.len(), n_list: list_items.len(), n_dict: dict_items.len() };
                flat.extend(states);
                flat.extend(list_items);
                for (k, v) in dict_items {
                    flat.push(k);
                    flat.push(v);
                }
                (shape, flat)
            }
        };
        let n = children.len();
        Visit::Open(Frame { id, shape, children: children.into_iter(), out: Vec::with_capacity(n) })
    }

    /// Node `id` is complete: keep a copy if it is used again.
    fn built(&mut self, id: u32, v: Value) -> Value {
        if self.refs.get(id as usize).copied().unwrap_or(0) > 0 {
            self.cache.insert(id, v.clone());
        }
        v
    }
}
