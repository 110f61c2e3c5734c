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
use crate::template::{Cap, Captures, Ints, Pattern, Template};

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

/// What the machine would have counted for the opcodes read so far (one per machine, reused).
pub(crate) struct Tally<'a> {
    stack: [Meta; STACK],
    len: usize,
    marks: [usize; MARKS],
    open: usize,
    nodes: u64,
    bytes: u64,
    puts: [u64; PUTS],
    nputs: usize,
    captures: [Cap<'a>; CAPTURES],
    ncaptures: usize,
    ints: [Ints; INTS],
    nints: usize,
    /// Text comparisons made before: (link, wanted text's address, salt, equal). Links are where strings
    /// are in this input and indices of its globals; the cache lives as long as one machine.
    eq_cache: [(u32, usize, usize, bool); EQ_CACHE],
    /// Field look-ups made before: (key's link, fields' address, field index or `u8::MAX`).
    field_cache: [(u32, usize, u8); EQ_CACHE],
    /// Texts of memoized strings validated before, by their place in the input.
    text_cache: [(u32, &'a str); EQ_CACHE],
}

/// The most [`Pattern::Ints`] a template captures.
const INTS: usize = 8;

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
    nints: usize,
}

impl Tally<'_> {
    fn new() -> Self {
        Tally {
            stack: [Meta::SCALAR; STACK],
            len: 0,
            marks: [0; MARKS],
            open: 0,
            nodes: 0,
            bytes: 0,
            puts: [0; PUTS],
            nputs: 0,
            captures: [Cap::Taken; CAPTURES],
            ncaptures: 0,
            ints: [Ints::default(); INTS],
            nints: 0,
            eq_cache: [(NO_ID, 0, 0, false); EQ_CACHE],
            field_cache: [(NO_ID, 0, u8::MAX); EQ_CACHE],
            text_cache: [(NO_ID, ""); EQ_CACHE],
        }
    }

    /// Empty again (what was read before is never looked at past the counts).
    fn reset(&mut self) {
        self.len = 0;
        self.open = 0;
        self.nodes = 0;
        self.bytes = 0;
        self.nputs = 0;
        self.ncaptures = 0;
        self.nints = 0;
    }
}

/// Reads template `t` at the GET at `at` (the machine has read the GET's key). Whether it did: `false`
/// leaves the machine at the GET's argument, as it was.
pub(crate) fn read<'a, B: Builder<'a>>(m: &mut Machine<'a, '_, '_, B>, t: usize, at: usize) -> Result<bool, B::Error> {
    let Some(template) = m.builder.templates().get(t).copied() else { return Ok(false) };
    let after_get = m.pos;
    let mut tally = m.tally.take().unwrap_or_else(|| Box::new(Tally::new()));
    tally.reset();
    let mut r = Reader { m, pos: at, t: tally };
    let read = r.value(&template.pattern).is_some() && r.t.len == 1 && r.t.open == 0;
    let end = r.pos;
    let Reader { m, t: mut tally, .. } = r;
    let result = finish(m, &mut tally, read, t, at, after_get, end);
    m.tally = Some(tally);
    result
}

/// Takes what a template read (`read`: whether it matched, up to `end`) into the machine and hands its
/// captures to the builder, or leaves the machine at the GET's argument (`after_get`).
fn finish<'a, B: Builder<'a>>(
    m: &mut Machine<'a, '_, '_, B>,
    tally: &mut Tally<'a>,
    read: bool,
    t: usize,
    at: usize,
    after_get: usize,
    end: usize,
) -> Result<bool, B::Error> {
    let Some(meta) = read.then_some(tally.stack[0]) else {
        m.pos = after_get;
        return Ok(false);
    };
    // Every check was made opcode by opcode but the memo's: written keys must be new, and the total within
    // the limit.
    let puts = tally.puts.get(..tally.nputs).unwrap_or_default();
    if m.written.len().saturating_add(puts.len()) > m.limits.max_memo {
        m.pos = after_get;
        return Ok(false);
    }
    // The keys CPython writes (MEMOIZE, or PUTs numbered as it numbers them) continue the keys written:
    // taken at once; any others one by one, each new and in increasing order.
    if !m.written.extend_run(puts) {
        if !puts.windows(2).all(|w| w.first() < w.get(1)) || puts.iter().any(|&k| m.written.contains(k)) {
            m.pos = after_get;
            return Ok(false);
        }
        for &k in puts {
            m.written.insert(k);
        }
    }
    m.vm_nodes += tally.nodes;
    m.vm_bytes = m.vm_bytes.saturating_add(tally.bytes);
    m.pos = end;
    // The memoized values it read become the builder's references; then the builder makes the object.
    let mut values = std::mem::take(&mut m.captures);
    values.clear();
    for c in tally.captures.iter_mut().take(tally.ncaptures) {
        if let Cap::Shared(id) = *c {
            let Some(s) = m.shared.get_mut(id as usize) else {
                *c = Cap::Taken;
                continue;
            };
            let index = u32::try_from(values.len()).unwrap_or(u32::MAX);
            values.push(Some(m.builder.share(&mut s.value)?));
            *c = Cap::Shared(index);
        }
    }
    let caps = tally.captures.get(..tally.ncaptures).unwrap_or_default();
    let ints = tally.ints.get(..tally.nints).unwrap_or_default();
    let mut captures = Captures { caps, ints, globals: &m.globals, values: &mut values, next: 0 };
    let value = m.builder.template(t, &mut captures);
    values.clear();
    m.captures = values;
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
    t: Box<Tally<'a>>,
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
            nints: self.t.nints,
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
        self.t.nints = s.nints;
    }

    fn capture(&mut self, c: Cap<'a>) -> Option<()> {
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

    /// Whether the value at stack index `i` is within the limits.
    fn check_at(&self, i: usize) -> Option<()> {
        self.m.check(self.t.stack.get(i)?, 0).is_ok().then_some(())
    }

    /// The values from stack index `from` up become a container of `kind`, in their place.
    fn container(&mut self, kind: Kind, from: usize) -> Option<()> {
        if from < self.fence() || self.m.vals.len().saturating_add(from) >= self.m.limits.max_container_len {
            return None;
        }
        let mut c = Children::default();
        for meta in self.t.stack.get(from..self.t.len)? {
            c.add(meta);
        }
        self.created(0)?;
        *self.t.stack.get_mut(from)? = c.container(kind);
        self.t.len = from + 1;
        self.check_at(from)
    }

    /// A call of the value below the top with the top as its arguments (REDUCE, NEWOBJ), in their place.
    fn call(&mut self) -> Option<()> {
        let at = self.t.len.checked_sub(2)?;
        if at < self.fence() {
            return None;
        }
        let mut c = Children::default();
        for meta in self.t.stack.get(at..self.t.len)? {
            c.add(meta);
        }
        self.created(0)?;
        *self.t.stack.get_mut(at)? = Meta { len: 0, ..c.container(Kind::Object) };
        self.t.len = at + 1;
        self.check_at(at)
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

    /// A GET: the memoized object's id (it must have been written).
    fn get(&mut self) -> Option<u32> {
        let key = match self.byte()? {
            op::BINGET => self.le(1)?,
            op::LONG_BINGET => self.le(4)?,
            _ => return None,
        };
        if !self.m.written.contains(key) {
            return None;
        }
        self.m.memo.get(key)
    }

    /// The size of the memoized object `id`.
    fn meta_of(&self, id: u32) -> Option<&Meta> {
        self.m.shared.get(id as usize).map(|s| &s.meta)
    }

    /// A GET of a global: its index in the machine's globals.
    fn get_global(&mut self) -> Option<u32> {
        let id = self.get()?;
        let meta = *self.meta_of(id)?;
        if meta.kind != Kind::Global || meta.link as usize >= self.m.globals.len() {
            return None;
        }
        self.push(meta)?;
        Some(meta.link)
    }

    /// Whether the text at `link` (a string's input offset, a global's index: `salt` tells them apart) is
    /// `want`, remembered for the next time the same object is asked about.
    fn is_text(&mut self, link: u32, salt: usize, text: impl FnOnce(&Self) -> Option<bool>, want: usize) -> bool {
        let key = (link as usize) ^ want.rotate_left(17) ^ salt;
        let slot = key % EQ_CACHE;
        if let Some(&(l, w, s, eq)) = self.t.eq_cache.get(slot) {
            if l == link && w == want && s == salt && link != NO_ID {
                return eq;
            }
        }
        let eq = text(self).unwrap_or(false);
        if let Some(e) = self.t.eq_cache.get_mut(slot) {
            *e = (link, want, salt, eq);
        }
        eq
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

    /// The text of a memoized string, validated once per string object (remembered by its place).
    fn text_at(&mut self, meta: &Meta) -> Option<&'a str> {
        let slot = (meta.link as usize) % EQ_CACHE;
        if let Some(&(link, text)) = self.t.text_cache.get(slot) {
            if link == meta.link && link != NO_ID && meta.kind == Kind::Str && usize_u64(text.len()) == meta.bytes {
                return Some(text);
            }
        }
        let text = self.m.text_of(meta)?;
        if let Some(e) = self.t.text_cache.get_mut(slot) {
            *e = (meta.link, text);
        }
        Some(text)
    }

    /// A string written here or read from the memo; its text and where it is in the input.
    fn str_value(&mut self) -> Option<(&'a str, u32)> {
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
                let id = self.get()?;
                let meta = *self.meta_of(id)?;
                let text = self.text_at(&meta)?;
                self.push(meta)?;
                return Some((text, meta.link));
            }
        };
        let start = self.pos;
        let s = std::str::from_utf8(self.take(n)?).ok()?;
        self.created(n)?;
        let link = u32::try_from(start).unwrap_or(NO_ID);
        self.push(Meta { link, ..Meta::leaf(Kind::Str, n) })?;
        self.put()?;
        Some((s, link))
    }

    /// Reads one value of `pattern`.
    fn value(&mut self, pattern: &Pattern) -> Option<()> {
        match *pattern {
            Pattern::Global(module, name) => {
                let link = self.get_global()?;
                let is = |r: &Self| r.m.globals.get(link as usize).map(|&(m, n)| m == module && n == name);
                self.is_text(link, 1, is, module.as_ptr() as usize ^ name.as_ptr() as usize).then_some(())
            }
            Pattern::AnyGlobal => {
                let link = self.get_global()?;
                self.capture(Cap::Global(link))
            }
            Pattern::Str => {
                let (s, _) = self.str_value()?;
                self.capture(Cap::Str(s))
            }
            Pattern::StrEq(want) => {
                let (s, link) = self.str_value()?;
                self.is_text(link, 0, |_| Some(s == want), want.as_ptr() as usize).then_some(())
            }
            Pattern::Int => {
                let v = self.int_value()?;
                self.capture(Cap::Int(v))?;
                self.push(Meta::SCALAR)
            }
            Pattern::Bool => {
                let v = match self.byte()? {
                    op::NEWTRUE => true,
                    op::NEWFALSE => false,
                    _ => return None,
                };
                self.capture(Cap::Bool(v))?;
                self.push(Meta::SCALAR)
            }
            Pattern::None => {
                (self.byte()? == op::NONE).then_some(())?;
                self.capture(Cap::None)?;
                self.push(Meta::SCALAR)
            }
            Pattern::Ints => self.ints(),
            Pattern::Tuple(items) => self.tuple(items),
            Pattern::PersistentId(inner) => {
                self.value(inner)?;
                (self.byte()? == op::BINPERSID).then_some(())?;
                let at = self.t.len.checked_sub(1).filter(|&at| at >= self.fence())?;
                let mut c = Children::default();
                c.add(self.t.stack.get(at)?);
                self.created(0)?;
                *self.t.stack.get_mut(at)? = Meta { len: 0, ..c.container(Kind::PersistentId) };
                self.check_at(at)?;
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
                    self.capture(Cap::Choice(u32::try_from(i).ok()?))?;
                    if self.value(alternative).is_some() {
                        return Some(());
                    }
                    self.reset(start);
                }
                None
            }
            Pattern::Memo => {
                let id = self.get()?;
                let meta = *self.meta_of(id)?;
                self.capture(Cap::Shared(id))?;
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
        *self.t.ints.get_mut(self.t.nints)? = ints;
        let index = u8::try_from(self.t.nints).ok()?;
        self.t.nints += 1;
        self.capture(Cap::Ints(index))
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
            let (key, link) = self.str_value()?;
            let f = self.field_of(fields, key, link)?;
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
        self.t.stack.get_mut(dict - 1)?.grow(&pairs);
        self.check_at(dict - 1)?;
        (self.byte()? == op::BUILD).then_some(())?;
        let state = self.pop()?;
        let mut s = Children::default();
        s.add(&state);
        s.count = 0;
        self.t.stack.get_mut(object)?.grow(&s);
        self.check_at(object)?;
        Some(())
    }
}

/// The most fields a [`Pattern::Object`] declares.
const MAX_FIELDS: usize = 8;

/// Entries of the caches of text comparisons and field look-ups (direct mapped).
const EQ_CACHE: usize = 64;

impl<'a, B: Builder<'a>> Reader<'_, 'a, '_, '_, B> {
    /// Which of `fields` the key `key` (at `link` in the input) names; remembered for the same key object.
    fn field_of(&mut self, fields: &'static [(&'static str, Pattern)], key: &str, link: u32) -> Option<usize> {
        let id = fields.as_ptr() as usize;
        let slot = ((link as usize) ^ id.rotate_left(17)) % EQ_CACHE;
        if let Some(&(l, f, i)) = self.t.field_cache.get(slot) {
            if l == link && f == id && link != NO_ID {
                return (i != u8::MAX).then_some(usize::from(i));
            }
        }
        let found = fields.iter().position(|(name, _)| *name == key);
        if let Some(e) = self.t.field_cache.get_mut(slot) {
            *e = (link, id, found.and_then(|i| u8::try_from(i).ok()).unwrap_or(u8::MAX));
        }
        found
    }
}

impl<'a, B: Builder<'a>> Reader<'_, 'a, '_, '_, B> {
    /// Puts the captures of an object's fields (from `first` on, at `at` by declared field) in declared
    /// order, with [`Capture::Absent`] for fields not read.
    fn order_fields(&mut self, first: usize, at: &[Option<(usize, usize)>; MAX_FIELDS], n: usize) -> Option<()> {
        // The fields read in declared order (what CPython writes for a dataclass): in place, with an
        // [`Cap::Absent`] put where each missing field goes, from the back.
        let mut next = first;
        let mut missing = 0;
        let in_order = at.iter().take(n).all(|f| match *f {
            Some((start, end)) if start == next => {
                next = end;
                true
            }
            Some(_) => false,
            None => {
                missing += 1;
                true
            }
        });
        if in_order && missing == 0 {
            return Some(());
        }
        if in_order {
            let total = self.t.ncaptures.checked_add(missing).filter(|&t| t <= CAPTURES)?;
            let mut w = total;
            for field in at.iter().take(n).rev() {
                match *field {
                    Some((start, end)) => {
                        let len = end - start;
                        w -= len;
                        if w != start {
                            self.t.captures.copy_within(start..end, w);
                        }
                    }
                    None => {
                        w -= 1;
                        *self.t.captures.get_mut(w)? = Cap::Absent;
                    }
                }
            }
            self.t.ncaptures = total;
            return Some(());
        }
        let taken: Vec<Cap<'a>> = self.t.captures.get(first..self.t.ncaptures)?.to_vec();
        self.t.ncaptures = first;
        let mut taken: Vec<Option<Cap<'a>>> = taken.into_iter().map(Some).collect();
        for field in at.iter().take(n) {
            match field {
                Some((start, end)) => {
                    for i in *start..*end {
                        let c = taken.get_mut(i - first)?.take()?;
                        self.capture(c)?;
                    }
                }
                None => self.capture(Cap::Absent)?,
            }
        }
        Some(())
    }
}
