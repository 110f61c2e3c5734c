//! Templates: shapes of pickled objects that a builder expects many times (torch's tensor record, a
//! dataclass of a few fields), read straight from the bytes at the GET of their global, so that the builder
//! makes the object from what the template captured instead of from every inner value.
//!
//! The reader follows the machine's rules exactly: every value it reads is sized and counted as the
//! machine would size and count it (objects created, payload bytes, stack and MARK depth, memo keys
//! written, each container's size at the limits), and it takes the object only if every limit holds and no
//! memo key it writes is read by a later GET. Anything else, any opcode the template does not expect,
//! leaves the input to the machine's loop from the same GET, as if the template had not looked; so what is
//! accepted, and every error, is the same either way.

use super::memo::NO_ID;
use super::{Children, Kind, Machine, Meta, usize_u64};
use crate::builder::Builder;
use crate::opcode as op;

/// A shape of pickled value, for a [`Template`].
///
/// Each variant reads one value, in the forms CPython's pickler writes it (protocols 2 to 5); a value made
/// by the pickle may be memoized right after it (PUT, BINPUT, LONG_BINPUT, MEMOIZE) under a key that no GET
/// reads. Leaves that vary are *captured*, in the order they are read (see [`Captures`]).
#[derive(Debug, Clone, Copy)]
pub enum Pattern {
    /// A GET of this global (memoized earlier in the pickle). Not captured.
    Global(&'static str, &'static str),
    /// A GET of any global: captured as [`Capture::Global`].
    AnyGlobal,
    /// A `str` written here (SHORT_BINUNICODE, BINUNICODE) or a GET of one: captured as [`Capture::Str`].
    Str,
    /// A `str` equal to this (written here or a GET). Not captured.
    StrEq(&'static str),
    /// An int that fits `i64` (BININT1, BININT2, BININT, LONG1): captured as [`Capture::Int`].
    Int,
    /// NEWTRUE or NEWFALSE: captured as [`Capture::Bool`].
    Bool,
    /// NONE: captured as [`Capture::None`].
    None,
    /// A tuple of up to 8 ints made here (EMPTY_TUPLE, TUPLE1-3, MARK ... TUPLE): captured as
    /// [`Capture::Ints`].
    Ints,
    /// A tuple of these values (TUPLE1-3 or MARK ... TUPLE; EMPTY_TUPLE for none).
    Tuple(&'static [Pattern]),
    /// BINPERSID of this value.
    PersistentId(&'static Pattern),
    /// REDUCE: this callable with these arguments.
    Reduce(&'static Pattern, &'static Pattern),
    /// An object pickled the way CPython pickles a dataclass or plain class instance: the class,
    /// EMPTY_TUPLE, NEWOBJ, then an EMPTY_DICT filled with these fields (SETITEM for one, MARK ... SETITEMS
    /// for more; in any order, each at most once, none other) and BUILD. Captures each field's value in the
    /// order the fields are declared, [`Capture::Absent`] for a field the state does not have.
    Object {
        /// The class (normally [`Pattern::Global`]).
        class: &'static Pattern,
        /// Field names and what each holds.
        fields: &'static [(&'static str, Pattern)],
    },
    /// The first of these alternatives that reads: captured as [`Capture::Choice`] (its index), then the
    /// alternative's own captures.
    Choice(&'static [Pattern]),
    /// A GET of any memoized value: captured as [`Capture::Value`], the builder's own reference to it
    /// ([`Builder::share`]).
    Memo,
}

/// A fast path a [`Builder`] declares ([`Builder::templates`]): a [`Pattern::Reduce`] or
/// [`Pattern::Object`] whose callable or class is a [`Pattern::Global`], read at each GET of that global.
#[derive(Debug, Clone, Copy)]
pub struct Template {
    /// What the object looks like.
    pub pattern: Pattern,
}

impl Template {
    /// The global whose GET starts this template.
    fn global(&self) -> Option<(&'static str, &'static str)> {
        match self.pattern {
            Pattern::Reduce(Pattern::Global(m, n), _) | Pattern::Object { class: Pattern::Global(m, n), .. } => {
                Some((m, n))
            }
            _ => None,
        }
    }
}

/// Up to 8 ints of a tuple read by [`Pattern::Ints`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ints {
    len: u8,
    items: [i64; 8],
}

impl Ints {
    /// The ints.
    #[must_use]
    pub fn as_slice(&self) -> &[i64] {
        self.items.get(..usize::from(self.len)).unwrap_or_default()
    }

    fn push(&mut self, v: i64) -> Option<()> {
        *self.items.get_mut(usize::from(self.len))? = v;
        self.len += 1;
        Some(())
    }
}

/// One value a [`Pattern`] captured.
#[derive(Debug)]
pub enum Capture<'a, V> {
    /// [`Pattern::None`].
    None,
    /// [`Pattern::Bool`].
    Bool(bool),
    /// [`Pattern::Int`].
    Int(i64),
    /// [`Pattern::Str`], borrowed from the input.
    Str(&'a str),
    /// [`Pattern::AnyGlobal`]: module and name as written.
    Global(&'a str, &'a str),
    /// [`Pattern::Ints`].
    Ints(Ints),
    /// [`Pattern::Memo`]: the builder's reference to the memoized value.
    Value(V),
    /// [`Pattern::Choice`]: which alternative read.
    Choice(usize),
    /// A field of a [`Pattern::Object`] that the object's state does not have.
    Absent,
    /// A memoized value before the builder shared it (never handed to a builder).
    Shared(u32),
    /// Taken already.
    Taken,
}

/// What a template captured, in order, for [`Builder::template`].
#[derive(Debug)]
pub struct Captures<'a, 'c, V> {
    items: &'c mut [Capture<'a, V>],
    next: usize,
}

impl<'a, V> Captures<'a, '_, V> {
    /// The next capture (`None` after the last).
    pub fn next_capture(&mut self) -> Option<Capture<'a, V>> {
        let c = self.items.get_mut(self.next)?;
        self.next += 1;
        Some(std::mem::replace(c, Capture::Taken))
    }

    /// The next capture as an int.
    pub fn int(&mut self) -> Option<i64> {
        match self.next_capture()? {
            Capture::Int(v) => Some(v),
            _ => None,
        }
    }

    /// The next capture as a bool.
    pub fn bool(&mut self) -> Option<bool> {
        match self.next_capture()? {
            Capture::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The next capture as a string.
    pub fn str(&mut self) -> Option<&'a str> {
        match self.next_capture()? {
            Capture::Str(v) => Some(v),
            _ => None,
        }
    }

    /// The next capture as a global's module and name.
    pub fn global(&mut self) -> Option<(&'a str, &'a str)> {
        match self.next_capture()? {
            Capture::Global(m, n) => Some((m, n)),
            _ => None,
        }
    }

    /// The next capture as a tuple of ints.
    pub fn ints(&mut self) -> Option<Ints> {
        match self.next_capture()? {
            Capture::Ints(v) => Some(v),
            _ => None,
        }
    }

    /// The next capture as the index of a [`Pattern::Choice`]'s alternative.
    pub fn choice(&mut self) -> Option<usize> {
        match self.next_capture()? {
            Capture::Choice(v) => Some(v),
            _ => None,
        }
    }

    /// Whether the next capture is [`Capture::Absent`] (which it then takes).
    pub fn absent(&mut self) -> bool {
        if matches!(self.items.get(self.next), Some(Capture::Absent)) {
            self.next += 1;
            return true;
        }
        false
    }

    /// The next capture as a memoized value.
    pub fn value(&mut self) -> Option<V> {
        match self.next_capture()? {
            Capture::Value(v) => Some(v),
            _ => None,
        }
    }
}

/// The builder's templates, by the global that starts each.
pub(crate) struct Index {
    starts: Vec<(&'static str, &'static str, usize)>,
}

impl Index {
    pub(crate) fn new(templates: &'static [Template]) -> Self {
        Index { starts: templates.iter().enumerate().filter_map(|(i, t)| t.global().map(|(m, n)| (m, n, i))).collect() }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The template that starts with a GET of `module.name`.
    pub(crate) fn starting_with(&self, module: &str, name: &str) -> Option<usize> {
        self.starts.iter().find(|(m, n, _)| *m == module && *n == name).map(|&(_, _, i)| i)
    }
}

/// The most values a template holds on the stack at once, MARKs it opens, and memo keys it writes.
const STACK: usize = 24;
const MARKS: usize = 8;
const PUTS: usize = 32;
const CAPTURES: usize = 32;

/// What the machine would have counted for the opcodes read so far.
struct Tally<'a> {
    stack: [Meta; STACK],
    len: usize,
    marks: [usize; MARKS],
    open: usize,
    nodes: u64,
    bytes: u64,
    puts: [u64; PUTS],
    nputs: usize,
    captures: [Capture<'a, ()>; CAPTURES],
    ncaptures: usize,
}

/// Where a read stood, to try a [`Pattern::Choice`]'s next alternative from.
#[derive(Clone, Copy)]
struct Mark {
    pos: usize,
    len: usize,
    open: usize,
    nodes: u64,
    bytes: u64,
    nputs: usize,
    ncaptures: usize,
}

/// Reads template `t` at the GET at `at` (the machine has read the GET's key). Whether it did: `false`
/// leaves the machine at the GET's argument, as it was.
pub(crate) fn read<'a, B: Builder<'a>>(m: &mut Machine<'a, '_, '_, B>, t: usize, at: usize) -> Result<bool, B::Error> {
    let Some(template) = m.builder.templates().get(t).copied() else { return Ok(false) };
    let after_get = m.pos;
    let mut r = Reader {
        m,
        pos: at,
        t: Tally {
            stack: [Meta::SCALAR; STACK],
            len: 0,
            marks: [0; MARKS],
            open: 0,
            nodes: 0,
            bytes: 0,
            puts: [0; PUTS],
            nputs: 0,
            captures: std::array::from_fn(|_| Capture::Taken),
            ncaptures: 0,
        },
    };
    let read = r.value(&template.pattern).is_some() && r.t.len == 1 && r.t.open == 0;
    let end = r.pos;
    let Reader { m, t: tally, .. } = r;
    let Some(meta) = read.then_some(tally.stack[0]) else {
        m.pos = after_get;
        return Ok(false);
    };
    // Every check was made opcode by opcode but the memo's: written keys must be new, and the total within
    // the limit.
    let puts = tally.puts.get(..tally.nputs).unwrap_or_default();
    if m.written.len().saturating_add(puts.len()) > m.limits.max_memo
        || !puts.windows(2).all(|w| w.first() < w.get(1))
        || puts.iter().any(|&k| m.written.contains(k))
    {
        m.pos = after_get;
        return Ok(false);
    }
    for &k in puts {
        m.written.insert(k);
    }
    m.vm_nodes += tally.nodes;
    m.vm_bytes = m.vm_bytes.saturating_add(tally.bytes);
    m.pos = end;
    // The memoized values it read become the builder's references; then the builder makes the object.
    let mut captures = std::mem::take(&mut m.captures);
    captures.clear();
    for c in tally.captures.into_iter().take(tally.ncaptures) {
        captures.push(match c {
            Capture::None => Capture::None,
            Capture::Bool(v) => Capture::Bool(v),
            Capture::Int(v) => Capture::Int(v),
            Capture::Str(v) => Capture::Str(v),
            Capture::Global(a, b) => Capture::Global(a, b),
            Capture::Ints(v) => Capture::Ints(v),
            Capture::Choice(v) => Capture::Choice(v),
            Capture::Absent => Capture::Absent,
            Capture::Shared(id) => match m.shared.get_mut(id as usize) {
                Some(s) => Capture::Value(m.builder.share(&mut s.value)?),
                None => Capture::Taken,
            },
            Capture::Value(()) | Capture::Taken => Capture::Taken,
        });
    }
    let value = m.builder.template(t, &mut Captures { items: &mut captures, next: 0 });
    captures.clear();
    m.captures = captures;
    let value = value?;
    if m.vals.len() >= m.limits.max_container_len {
        return Err(m.limit("stack items", m.limits.max_container_len, at).into());
    }
    m.vals.push(value);
    m.meta.push(meta);
    Ok(true)
}

struct Reader<'m, 'a, 'l, 'b, B: Builder<'a>> {
    m: &'m mut Machine<'a, 'l, 'b, B>,
    pos: usize,
    t: Tally<'a>,
}

impl<'a, B: Builder<'a>> Reader<'_, 'a, '_, '_, B> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.m.data.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn peek(&self) -> Option<u8> {
        self.m.data.get(self.pos).copied()
    }

    fn le(&mut self, n: usize) -> Option<u64> {
        let v = op::le_at(self.m.data, self.pos, n)?;
        self.pos += n;
        Some(v)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.m.data.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    fn mark_state(&self) -> Mark {
        Mark {
            pos: self.pos,
            len: self.t.len,
            open: self.t.open,
            nodes: self.t.nodes,
            bytes: self.t.bytes,
            nputs: self.t.nputs,
            ncaptures: self.t.ncaptures,
        }
    }

    fn reset(&mut self, s: Mark) {
        self.pos = s.pos;
        self.t.len = s.len;
        self.t.open = s.open;
        self.t.nodes = s.nodes;
        self.t.bytes = s.bytes;
        self.t.nputs = s.nputs;
        self.t.ncaptures = s.ncaptures;
    }

    fn capture(&mut self, c: Capture<'a, ()>) -> Option<()> {
        *self.t.captures.get_mut(self.t.ncaptures)? = c;
        self.t.ncaptures += 1;
        Some(())
    }

    // ----- what the machine counts -----

    fn push(&mut self, meta: Meta) -> Option<()> {
        if self.m.vals.len().saturating_add(self.t.len) >= self.m.limits.max_container_len {
            return None;
        }
        *self.t.stack.get_mut(self.t.len)? = meta;
        self.t.len += 1;
        Some(())
    }

    fn fence(&self) -> usize {
        self.t.open.checked_sub(1).and_then(|i| self.t.marks.get(i).copied()).unwrap_or(0)
    }

    fn pop(&mut self) -> Option<Meta> {
        if self.t.len <= self.fence() {
            return None;
        }
        self.t.len -= 1;
        self.t.stack.get(self.t.len).copied()
    }

    fn mark(&mut self) -> Option<()> {
        if self.m.marks.len().saturating_add(self.t.open) >= self.m.limits.max_mark_depth {
            return None;
        }
        *self.t.marks.get_mut(self.t.open)? = self.t.len;
        self.t.open += 1;
        Some(())
    }

    fn close_mark(&mut self) -> Option<usize> {
        self.t.open = self.t.open.checked_sub(1)?;
        self.t.marks.get(self.t.open).copied()
    }

    /// An object the machine creates, with `bytes` of payload.
    fn created(&mut self, bytes: usize) -> Option<()> {
        self.t.nodes += 1;
        self.t.bytes = self.t.bytes.saturating_add(usize_u64(bytes));
        let cap = usize_u64(self.m.limits.max_nodes.min(u32::MAX as usize));
        let ok = self.m.vm_nodes.saturating_add(self.t.nodes) <= cap
            && self.m.vm_bytes.saturating_add(self.t.bytes) <= usize_u64(self.m.limits.max_alloc_bytes);
        ok.then_some(())
    }

    fn checked(&self, meta: Meta) -> Option<Meta> {
        self.m.check(&meta, 0).is_ok().then_some(meta)
    }

    /// The values from stack index `from` up become a container of `kind`.
    fn container(&mut self, kind: Kind, from: usize) -> Option<()> {
        let mut c = Children::default();
        for meta in self.t.stack.get(from..self.t.len)? {
            c.add(meta);
        }
        self.t.len = from;
        self.created(0)?;
        let meta = self.checked(c.container(kind))?;
        self.push(meta)
    }

    /// A call of the value below the top with the top as its arguments (REDUCE, NEWOBJ).
    fn call(&mut self) -> Option<()> {
        let args = self.pop()?;
        let callable = self.pop()?;
        let mut c = Children::default();
        c.add(&callable);
        c.add(&args);
        self.created(0)?;
        let meta = self.checked(Meta { len: 0, ..c.container(Kind::Object) })?;
        self.push(meta)
    }

    /// An optional memo write of the value just made, under a new key that no GET reads.
    fn put(&mut self) -> Option<()> {
        let key = match self.peek() {
            Some(op::BINPUT) => {
                self.pos += 1;
                self.le(1)?
            }
            Some(op::LONG_BINPUT) => {
                self.pos += 1;
                self.le(4)?
            }
            Some(op::MEMOIZE) => {
                self.pos += 1;
                usize_u64(self.m.written.len()).saturating_add(usize_u64(self.t.nputs))
            }
            _ => return Some(()),
        };
        if self.m.memo.is_read(key) || self.t.len <= self.fence() {
            return None;
        }
        *self.t.puts.get_mut(self.t.nputs)? = key;
        self.t.nputs += 1;
        Some(())
    }

    /// A GET: the memoized object's id and size (it must have been written).
    fn get(&mut self) -> Option<(u32, Meta)> {
        let key = match self.byte()? {
            op::BINGET => self.le(1)?,
            op::LONG_BINGET => self.le(4)?,
            _ => return None,
        };
        if !self.m.written.contains(key) {
            return None;
        }
        let id = self.m.memo.get(key)?;
        let meta = self.m.shared.get(id as usize)?.meta;
        Some((id, meta))
    }

    fn int_value(&mut self) -> Option<i64> {
        Some(match self.byte()? {
            op::BININT1 => i64::try_from(self.le(1)?).ok()?,
            op::BININT2 => i64::try_from(self.le(2)?).ok()?,
            op::BININT => i64::from(i32::from_le_bytes(u32::try_from(self.le(4)?).ok()?.to_le_bytes())),
            op::LONG1 => {
                let n = usize::from(u8::try_from(self.le(1)?).ok()?);
                if n > 8 {
                    return None;
                }
                let b = self.take(n)?;
                let fill = if b.last().is_some_and(|&h| h & 0x80 != 0) { 0xff } else { 0 };
                let mut le = [fill; 8];
                le.get_mut(..n)?.copy_from_slice(b);
                i64::from_le_bytes(le)
            }
            _ => return None,
        })
    }

    /// A string written here or read from the memo; its text.
    fn str_value(&mut self) -> Option<&'a str> {
        let n = match self.peek()? {
            op::SHORT_BINUNICODE => {
                self.pos += 1;
                usize::try_from(self.le(1)?).ok()?
            }
            op::BINUNICODE => {
                self.pos += 1;
                usize::try_from(self.le(4)?).ok()?
            }
            _ => {
                let (_, meta) = self.get()?;
                let text = self.m.text_of(&meta)?;
                self.push(meta)?;
                return Some(text);
            }
        };
        let start = self.pos;
        let s = std::str::from_utf8(self.take(n)?).ok()?;
        self.created(n)?;
        self.push(Meta { link: u32::try_from(start).unwrap_or(NO_ID), ..Meta::leaf(Kind::Str, n) })?;
        self.put()?;
        Some(s)
    }

    /// Reads one value of `pattern`.
    fn value(&mut self, pattern: &Pattern) -> Option<()> {
        match *pattern {
            Pattern::Global(module, name) => {
                let (_, meta) = self.get()?;
                let &(m, n) = self.m.globals.get(meta.link as usize).filter(|_| meta.kind == Kind::Global)?;
                if m != module || n != name {
                    return None;
                }
                self.push(meta)
            }
            Pattern::AnyGlobal => {
                let (_, meta) = self.get()?;
                let &(m, n) = self.m.globals.get(meta.link as usize).filter(|_| meta.kind == Kind::Global)?;
                self.capture(Capture::Global(m, n))?;
                self.push(meta)
            }
            Pattern::Str => {
                let s = self.str_value()?;
                self.capture(Capture::Str(s))
            }
            Pattern::StrEq(want) => (self.str_value()? == want).then_some(()),
            Pattern::Int => {
                let v = self.int_value()?;
                self.capture(Capture::Int(v))?;
                self.push(Meta::SCALAR)
            }
            Pattern::Bool => {
                let v = match self.byte()? {
                    op::NEWTRUE => true,
                    op::NEWFALSE => false,
                    _ => return None,
                };
                self.capture(Capture::Bool(v))?;
                self.push(Meta::SCALAR)
            }
            Pattern::None => {
                (self.byte()? == op::NONE).then_some(())?;
                self.capture(Capture::None)?;
                self.push(Meta::SCALAR)
            }
            Pattern::Ints => self.ints(),
            Pattern::Tuple(items) => self.tuple(items),
            Pattern::PersistentId(inner) => {
                self.value(inner)?;
                (self.byte()? == op::BINPERSID).then_some(())?;
                let pid = self.pop()?;
                let mut c = Children::default();
                c.add(&pid);
                self.created(0)?;
                let meta = self.checked(Meta { len: 0, ..c.container(Kind::PersistentId) })?;
                self.push(meta)?;
                self.put()
            }
            Pattern::Reduce(callable, args) => {
                self.value(callable)?;
                self.value(args)?;
                (self.byte()? == op::REDUCE).then_some(())?;
                self.call()?;
                self.put()
            }
            Pattern::Object { class, fields } => self.object(class, fields),
            Pattern::Choice(alternatives) => {
                let start = self.mark_state();
                for (i, alternative) in alternatives.iter().enumerate() {
                    self.capture(Capture::Choice(i))?;
                    if self.value(alternative).is_some() {
                        return Some(());
                    }
                    self.reset(start);
                }
                None
            }
            Pattern::Memo => {
                let (id, meta) = self.get()?;
                self.capture(Capture::Shared(id))?;
                self.push(meta)
            }
        }
    }

    /// A tuple of ints made here.
    fn ints(&mut self) -> Option<()> {
        let from = self.t.len;
        let marked = self.peek()? == op::MARK;
        if marked {
            self.pos += 1;
            self.mark()?;
        }
        let mut ints = Ints::default();
        loop {
            match self.peek()? {
                op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => {
                    let v = self.int_value()?;
                    ints.push(v)?;
                    self.push(Meta::SCALAR)?;
                }
                op::TUPLE if marked => {
                    self.pos += 1;
                    let m = self.close_mark()?;
                    self.container(Kind::Tuple, m)?;
                    break;
                }
                code @ (op::TUPLE1 | op::TUPLE2 | op::TUPLE3)
                    if !marked && usize::from(code - op::TUPLE1) + 1 == usize::from(ints.len) =>
                {
                    self.pos += 1;
                    self.container(Kind::Tuple, from)?;
                    break;
                }
                op::EMPTY_TUPLE if !marked && ints.len == 0 => {
                    self.pos += 1;
                    self.container(Kind::Tuple, from)?;
                    break;
                }
                _ => return None,
            }
        }
        self.put()?;
        self.capture(Capture::Ints(ints))
    }

    /// A tuple of `items`.
    fn tuple(&mut self, items: &'static [Pattern]) -> Option<()> {
        if items.is_empty() {
            (self.byte()? == op::EMPTY_TUPLE).then_some(())?;
            self.container(Kind::Tuple, self.t.len)?;
            return self.put();
        }
        let from = self.t.len;
        let marked = self.peek()? == op::MARK;
        if marked {
            self.pos += 1;
            self.mark()?;
        }
        for item in items {
            self.value(item)?;
        }
        let code = self.byte()?;
        if marked {
            (code == op::TUPLE).then_some(())?;
            let m = self.close_mark()?;
            self.container(Kind::Tuple, m)?;
        } else {
            let n = match code {
                op::TUPLE1 => 1,
                op::TUPLE2 => 2,
                op::TUPLE3 => 3,
                _ => return None,
            };
            (n == items.len()).then_some(())?;
            self.container(Kind::Tuple, from)?;
        }
        self.put()
    }

    /// A dataclass-like object: class, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT filled with `fields`, BUILD.
    fn object(&mut self, class: &Pattern, fields: &'static [(&'static str, Pattern)]) -> Option<()> {
        self.value(class)?;
        (self.byte()? == op::EMPTY_TUPLE).then_some(())?;
        self.container(Kind::Tuple, self.t.len)?;
        (self.byte()? == op::NEWOBJ).then_some(())?;
        self.call()?;
        self.put()?;
        let object = self.t.len - 1;
        (self.byte()? == op::EMPTY_DICT).then_some(())?;
        self.container(Kind::Dict, self.t.len)?;
        self.put()?;
        let dict = self.t.len;
        // One field: SETITEM; more: MARK ... SETITEMS (CPython's batching of a dict's items).
        let marked = match self.peek()? {
            op::MARK => {
                self.pos += 1;
                self.mark()?;
                true
            }
            _ => false,
        };
        // Where each field's captures are, by declared field.
        let first = self.t.ncaptures;
        let mut at: [Option<(usize, usize)>; MAX_FIELDS] = [None; MAX_FIELDS];
        if fields.len() > MAX_FIELDS {
            return None;
        }
        let mut read = 0usize;
        loop {
            if (marked && self.peek()? == op::SETITEMS) || (!marked && read == 1) {
                break;
            }
            let key = self.str_value()?;
            let f = fields.iter().position(|(name, _)| *name == key)?;
            let slot = at.get_mut(f)?;
            if slot.is_some() {
                return None;
            }
            let start = self.t.ncaptures;
            self.value(&fields.get(f)?.1)?;
            *at.get_mut(f)? = Some((start, self.t.ncaptures));
            read += 1;
        }
        if read == 0 {
            return None;
        }
        self.order_fields(first, &at, fields.len())?;
        let close = if marked { op::SETITEMS } else { op::SETITEM };
        (self.byte()? == close).then_some(())?;
        if marked {
            self.close_mark()?;
        }
        // The dict takes the pairs (SETITEMS), then the object takes the dict (BUILD).
        let mut pairs = Children::default();
        for meta in self.t.stack.get(dict..self.t.len)? {
            pairs.add(meta);
        }
        pairs.count /= 2;
        self.t.len = dict;
        let d = *self.t.stack.get(dict - 1)?;
        let grown = self.checked(grow(d, &pairs))?;
        *self.t.stack.get_mut(dict - 1)? = grown;
        (self.byte()? == op::BUILD).then_some(())?;
        let state = self.pop()?;
        let mut s = Children::default();
        s.add(&state);
        s.count = 0;
        let o = *self.t.stack.get(object)?;
        let grown = self.checked(grow(o, &s))?;
        *self.t.stack.get_mut(object)? = grown;
        Some(())
    }
}

/// The most fields a [`Pattern::Object`] declares.
const MAX_FIELDS: usize = 8;

impl<'a, B: Builder<'a>> Reader<'_, 'a, '_, '_, B> {
    /// Puts the captures of an object's fields (from `first` on, at `at` by declared field) in declared
    /// order, with [`Capture::Absent`] for fields not read.
    fn order_fields(&mut self, first: usize, at: &[Option<(usize, usize)>; MAX_FIELDS], n: usize) -> Option<()> {
        let taken: Vec<Capture<'a, ()>> = self
            .t
            .captures
            .get_mut(first..self.t.ncaptures)?
            .iter_mut()
            .map(|c| std::mem::replace(c, Capture::Taken))
            .collect();
        self.t.ncaptures = first;
        let mut taken: Vec<Option<Capture<'a, ()>>> = taken.into_iter().map(Some).collect();
        for field in at.iter().take(n) {
            match field {
                Some((start, end)) => {
                    for i in *start..*end {
                        let c = taken.get_mut(i - first)?.take()?;
                        self.capture(c)?;
                    }
                }
                None => self.capture(Capture::Absent)?,
            }
        }
        Some(())
    }
}

/// A container's meta after it takes `add`.
fn grow(target: Meta, add: &Children) -> Meta {
    Meta {
        nodes: target.nodes.saturating_add(add.nodes),
        bytes: target.bytes.saturating_add(add.bytes),
        len: target.len.saturating_add(u32::try_from(add.count).unwrap_or(u32::MAX)),
        depth: target.depth.max(add.depth.saturating_add(1)),
        ..target
    }
}
