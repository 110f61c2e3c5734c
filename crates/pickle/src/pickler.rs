//! Low-level pickle writer that mirrors CPython's C pickler (`Modules/_pickle.c`) opcode for opcode.

use std::collections::HashMap;
use std::io::Write;

use crate::bigint::i64_to_le_min;
use crate::error::Error;
use crate::opcode as op;

type Result<T, E = Error> = std::result::Result<T, E>;

/// CPython's `_FRAME_SIZE_TARGET`: a frame is committed at the first save boundary after it reaches this size,
/// and a str/bytes payload at least this large is written outside any frame.
pub(crate) const FRAME_SIZE_TARGET: usize = 64 * 1024;
/// CPython's `_FRAME_SIZE_MIN`: smaller frames are written without a FRAME header.
const FRAME_SIZE_MIN: usize = 4;

/// Writes pickle opcodes to `W` exactly as CPython's C pickler does, so a caller that issues the same sequence
/// of operations as CPython's `save()` produces byte-identical output (e.g. `torch.save`'s `data.pkl`).
///
/// Conventions:
/// - **Atoms** (`none`, `bool`, `int`, `big_int`, `float`, `str`, `bytes`, `bytearray`, `global`, `empty_*`,
///   `get`, and the `shared_*`/`global_memo` helpers) push one object and begin with a *save boundary*, as each
///   starts a CPython `save()`. Structural ops (`mark`, `tuple`, `append(s)`, `setitem(s)`, `reduce`, `build`,
///   `memoize`, ...) do not. When an object starts with MARK (a tuple of more than 3 items, a frozenset, INST,
///   OBJ), call [`Pickler::boundary`] (or [`Pickler::begin_tuple`]) before the MARK. Boundaries only matter for
///   protocol ≥ 4 framing.
/// - Nothing is memoized implicitly except by the `shared_*`/`global_memo` helpers and inside the protocol-2/3
///   forms of `bytes`/`bytearray` (where CPython memoizes the helper objects it creates); call
///   [`Pickler::memoize`] after each object CPython would memoize (every str, bytes, bytearray, non-empty tuple,
///   list, dict, set, frozenset, global and REDUCE/NEWOBJ result).
/// - Protocols 2 to 5 are supported. Protocol 4+ output is framed like CPython's (frames are committed at the
///   first boundary at which they hold at least 64 KiB; a str/bytes payload of 64 KiB or more is written outside
///   any frame; frames under 4 bytes get no FRAME header).
pub struct Pickler<W: Write> {
    out: W,
    protocol: u8,
    framing: bool,
    /// Pending output: the current frame when framing, otherwise a write buffer.
    buf: Vec<u8>,
    frame_open: bool,
    flushed: u64,
    next_memo: u32,
    globals: HashMap<(String, String), u32>,
    strings: HashMap<String, u32>,
    small_bytes: HashMap<Vec<u8>, u32>,
    stopped: bool,
}

impl<W: Write> std::fmt::Debug for Pickler<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pickler")
            .field("protocol", &self.protocol)
            .field("position", &self.position())
            .field("next_memo", &self.next_memo)
            .finish_non_exhaustive()
    }
}

impl<W: Write> Pickler<W> {
    /// Starts a pickle of `protocol` (2 to 5) on `out` and writes the PROTO opcode.
    ///
    /// # Errors
    /// [`Error::Unencodable`] for another protocol; [`Error::Io`].
    pub fn new(out: W, protocol: u8) -> Result<Self> {
        if !(2..=op::HIGHEST_PROTOCOL).contains(&protocol) {
            return Err(Error::Unencodable { what: "the encoder supports protocols 2 to 5", protocol });
        }
        let mut p = Pickler {
            out,
            protocol,
            framing: false,
            buf: Vec::with_capacity(8 * 1024),
            frame_open: false,
            flushed: 0,
            next_memo: 0,
            globals: HashMap::new(),
            strings: HashMap::new(),
            small_bytes: HashMap::new(),
            stopped: false,
        };
        p.raw(&[op::PROTO, protocol])?;
        p.flush_buf()?;
        p.framing = protocol >= 4;
        Ok(p)
    }

    /// The protocol being written.
    #[must_use]
    pub fn protocol(&self) -> u8 {
        self.protocol
    }

    /// The memo id the next [`Pickler::memoize`] will assign.
    #[must_use]
    pub fn next_memo_id(&self) -> u32 {
        self.next_memo
    }

    /// Bytes produced so far: written to `W` plus buffered, not counting the 9-byte FRAME header of the frame
    /// still being filled (protocol ≥ 4). After [`Pickler::finish`] this is the size of the pickle.
    #[must_use]
    pub fn position(&self) -> u64 {
        self.flushed.saturating_add(self.buf.len() as u64)
    }

    /// Same as [`Pickler::position`].
    #[must_use]
    pub fn bytes_written(&self) -> u64 {
        self.position()
    }

    // ----- output plumbing -----

    fn raw(&mut self, data: &[u8]) -> Result<()> {
        if self.framing && !self.frame_open {
            self.frame_open = true;
        }
        self.buf.extend_from_slice(data);
        if !self.framing && self.buf.len() >= FRAME_SIZE_TARGET {
            self.flush_buf()?;
        }
        Ok(())
    }

    fn flush_buf(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.out.write_all(&self.buf)?;
            self.flushed = self.flushed.saturating_add(self.buf.len() as u64);
            self.buf.clear();
        }
        Ok(())
    }

    fn write_out(&mut self, data: &[u8]) -> Result<()> {
        self.out.write_all(data)?;
        self.flushed = self.flushed.saturating_add(data.len() as u64);
        Ok(())
    }

    fn commit_frame(&mut self) -> Result<()> {
        if !(self.framing && self.frame_open) {
            return Ok(());
        }
        if self.buf.len() >= FRAME_SIZE_MIN {
            let mut header = [0u8; 9];
            header[0] = op::FRAME;
            header[1..].copy_from_slice(&(self.buf.len() as u64).to_le_bytes());
            self.write_out(&header)?;
        }
        self.flush_buf()?;
        self.frame_open = false;
        Ok(())
    }

    /// A save boundary (the start of CPython's `save()`): with framing, commits the current frame if it has
    /// reached 64 KiB. Atoms call this themselves.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn boundary(&mut self) -> Result<()> {
        if self.framing && self.frame_open && self.buf.len() >= FRAME_SIZE_TARGET {
            self.commit_frame()?;
        }
        Ok(())
    }

    /// `_Pickler_write_bytes`: payloads of 64 KiB or more bypass the frame.
    fn header_payload(&mut self, header: &[u8], payload: &[u8]) -> Result<()> {
        if payload.len() >= FRAME_SIZE_TARGET {
            if self.framing {
                self.commit_frame()?;
            }
            self.flush_buf()?;
            self.write_out(header)?;
            self.write_out(payload)
        } else {
            self.raw(header)?;
            self.raw(payload)
        }
    }

    fn op(&mut self, code: u8) -> Result<()> {
        self.raw(&[code])
    }

    fn need(&self, min: u8, what: &'static str) -> Result<()> {
        if self.protocol < min {
            return Err(Error::Unencodable { what, protocol: self.protocol });
        }
        Ok(())
    }

    // ----- atoms -----

    /// NONE.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn none(&mut self) -> Result<()> {
        self.boundary()?;
        self.op(op::NONE)
    }

    /// NEWTRUE / NEWFALSE.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn bool(&mut self, b: bool) -> Result<()> {
        self.boundary()?;
        self.op(if b { op::NEWTRUE } else { op::NEWFALSE })
    }

    /// BININT1 (0..=255), BININT2 (256..=65535), BININT (other `i32`), else LONG1 with the minimal two's
    /// complement bytes — CPython's `save_long` choice.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn int(&mut self, v: i64) -> Result<()> {
        self.boundary()?;
        if let Ok(b) = u8::try_from(v) {
            self.raw(&[op::BININT1, b])
        } else if let Ok(w) = u16::try_from(v) {
            let [a, b] = w.to_le_bytes();
            self.raw(&[op::BININT2, a, b])
        } else if let Ok(d) = i32::try_from(v) {
            let [a, b, c, e] = d.to_le_bytes();
            self.raw(&[op::BININT, a, b, c, e])
        } else {
            let bytes = i64_to_le_min(v);
            self.long(&bytes)
        }
    }

    fn long(&mut self, le: &[u8]) -> Result<()> {
        if let Ok(n) = u8::try_from(le.len()) {
            self.raw(&[op::LONG1, n])?;
        } else {
            let n = i32::try_from(le.len())
                .map_err(|_| Error::Unencodable { what: "integer longer than 2 GiB", protocol: self.protocol })?;
            let mut h = [op::LONG4, 0, 0, 0, 0];
            h[1..].copy_from_slice(&n.to_le_bytes());
            self.raw(&h)?;
        }
        self.raw(le)
    }

    /// LONG1 (fewer than 256 bytes) or LONG4 with `le` (little-endian two's complement) written as given; pass
    /// the minimal form to match CPython (see [`Value::BigInt`](crate::Value::BigInt)).
    ///
    /// # Errors
    /// [`Error::Unencodable`] beyond 2 GiB; [`Error::Io`].
    pub fn big_int(&mut self, le: &[u8]) -> Result<()> {
        self.boundary()?;
        self.long(le)
    }

    /// BINFLOAT (big-endian IEEE-754 double).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn float(&mut self, v: f64) -> Result<()> {
        self.boundary()?;
        let mut b = [0u8; 9];
        b[0] = op::BINFLOAT;
        b[1..].copy_from_slice(&v.to_be_bytes());
        self.raw(&b)
    }

    /// A str: SHORT_BINUNICODE (protocol ≥ 4 and under 256 bytes), BINUNICODE, or BINUNICODE8 (protocol ≥ 4,
    /// over 4 GiB). Not memoized.
    ///
    /// # Errors
    /// [`Error::Unencodable`] for a string over 4 GiB below protocol 4; [`Error::Io`].
    pub fn str(&mut self, s: &str) -> Result<()> {
        self.boundary()?;
        let b = s.as_bytes();
        let n = b.len() as u64;
        if n <= 0xff && self.protocol >= 4 {
            self.header_payload(&[op::SHORT_BINUNICODE, n as u8], b)
        } else if let Ok(n32) = u32::try_from(n) {
            let mut h = [op::BINUNICODE, 0, 0, 0, 0];
            h[1..].copy_from_slice(&n32.to_le_bytes());
            self.header_payload(&h, b)
        } else {
            self.need(4, "a str over 4 GiB needs protocol 4")?;
            let mut h = [0u8; 9];
            h[0] = op::BINUNICODE8;
            h[1..].copy_from_slice(&n.to_le_bytes());
            self.header_payload(&h, b)
        }
    }

    /// A bytes object. Protocol ≥ 3: SHORT_BINBYTES / BINBYTES / BINBYTES8. Protocol 2: CPython's
    /// `_codecs.encode(latin1_str, 'latin1')` REDUCE (or `__builtin__.bytes()` for empty input), memoizing the
    /// global, the str, `'latin1'` and the argument tuple exactly as CPython does. The bytes object itself is
    /// not memoized.
    ///
    /// # Errors
    /// [`Error::Unencodable`] for bytes over 4 GiB below protocol 4; [`Error::Io`].
    pub fn bytes(&mut self, b: &[u8]) -> Result<()> {
        self.boundary()?;
        if self.protocol < 3 {
            if b.is_empty() {
                self.global_memo("__builtin__", "bytes")?;
                self.empty_tuple()?;
                return self.reduce();
            }
            self.global_memo("_codecs", "encode")?;
            let text: String = b.iter().map(|&c| char::from(c)).collect();
            if b.len() == 1 {
                // A one-character latin-1 str is a CPython singleton.
                self.shared_str(&text)?;
            } else {
                self.str(&text)?;
                self.memoize()?;
            }
            self.shared_str("latin1")?;
            self.tuple(2)?;
            self.memoize()?;
            return self.reduce();
        }
        let n = b.len() as u64;
        if n <= 0xff {
            self.header_payload(&[op::SHORT_BINBYTES, n as u8], b)
        } else if let Ok(n32) = u32::try_from(n) {
            let mut h = [op::BINBYTES, 0, 0, 0, 0];
            h[1..].copy_from_slice(&n32.to_le_bytes());
            self.header_payload(&h, b)
        } else {
            self.need(4, "bytes over 4 GiB need protocol 4")?;
            let mut h = [0u8; 9];
            h[0] = op::BINBYTES8;
            h[1..].copy_from_slice(&n.to_le_bytes());
            self.header_payload(&h, b)
        }
    }

    /// A bytearray. Protocol 5: BYTEARRAY8. Below: CPython's `bytearray(bytes)` REDUCE (`bytearray()` when
    /// empty) with the global `__builtin__.bytearray` (protocol 2) / `builtins.bytearray` (3-4), memoizing what
    /// CPython memoizes. The bytearray itself is not memoized.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn bytearray(&mut self, b: &[u8]) -> Result<()> {
        self.boundary()?;
        if self.protocol >= 5 {
            let mut h = [0u8; 9];
            h[0] = op::BYTEARRAY8;
            h[1..].copy_from_slice(&(b.len() as u64).to_le_bytes());
            return self.header_payload(&h, b);
        }
        let module = if self.protocol < 3 { "__builtin__" } else { "builtins" };
        self.global_memo(module, "bytearray")?;
        if b.is_empty() {
            self.empty_tuple()?;
        } else {
            self.bytes(b)?;
            self.memoize()?;
            self.tuple(1)?;
            self.memoize()?;
        }
        self.reduce()
    }

    /// A global reference: GLOBAL `module\nname\n` (protocols 2-3; ASCII names below 3, UTF-8 at 3) or, at
    /// protocol ≥ 4, the module and name strings (each through [`Pickler::shared_str`], as CPython's interned
    /// names are shared) followed by STACK_GLOBAL. The global itself is not memoized: use
    /// [`Pickler::global_memo`] to do what CPython does for classes and functions.
    ///
    /// # Errors
    /// [`Error::Unencodable`] for names containing a newline or (protocol 2) non-ASCII; [`Error::Io`].
    pub fn global(&mut self, module: &str, name: &str) -> Result<()> {
        self.boundary()?;
        if self.protocol >= 4 {
            self.shared_str(module)?;
            self.shared_str(name)?;
            return self.op(op::STACK_GLOBAL);
        }
        self.check_text_name(module)?;
        self.check_text_name(name)?;
        self.op(op::GLOBAL)?;
        self.raw(module.as_bytes())?;
        self.raw(b"\n")?;
        self.raw(name.as_bytes())?;
        self.raw(b"\n")
    }

    fn check_text_name(&self, s: &str) -> Result<()> {
        if s.contains('\n') || s.is_empty() {
            return Err(Error::Unencodable {
                what: "global name that is empty or contains a newline",
                protocol: self.protocol,
            });
        }
        if self.protocol < 3 && !s.is_ascii() {
            return Err(Error::Unencodable { what: "non-ASCII global name below protocol 3", protocol: self.protocol });
        }
        Ok(())
    }

    /// A global written once: the first call for `(module, name)` writes [`Pickler::global`] and memoizes it,
    /// later calls write a GET of that memo entry (CPython memoizes classes and functions by identity).
    ///
    /// # Errors
    /// As [`Pickler::global`].
    pub fn global_memo(&mut self, module: &str, name: &str) -> Result<()> {
        if let Some(&id) = self.globals.get(&(module.to_owned(), name.to_owned())) {
            return self.get(id);
        }
        self.global(module, name)?;
        let id = self.memoize()?;
        self.globals.insert((module.to_owned(), name.to_owned()), id);
        Ok(())
    }

    /// A str written once per distinct value (an interned / singleton string in CPython): the first call writes
    /// [`Pickler::str`] and memoizes it, later calls write a GET.
    ///
    /// # Errors
    /// As [`Pickler::str`].
    pub fn shared_str(&mut self, s: &str) -> Result<()> {
        if let Some(&id) = self.strings.get(s) {
            return self.get(id);
        }
        self.str(s)?;
        let id = self.memoize()?;
        self.strings.insert(s.to_owned(), id);
        Ok(())
    }

    /// A bytes object written once per distinct value (CPython's empty bytes is a singleton): the first call
    /// writes [`Pickler::bytes`] and memoizes it, later calls write a GET.
    ///
    /// # Errors
    /// As [`Pickler::bytes`].
    pub fn shared_bytes(&mut self, b: &[u8]) -> Result<()> {
        if let Some(&id) = self.small_bytes.get(b) {
            return self.get(id);
        }
        self.bytes(b)?;
        let id = self.memoize()?;
        self.small_bytes.insert(b.to_vec(), id);
        Ok(())
    }

    /// STACK_GLOBAL alone (protocol ≥ 4), for a caller that pushed the module and name strings itself: CPython
    /// shares those strings by identity, not by value, so two equal module names can be two memo entries
    /// (DCP's `.metadata` pickles `torch.Size`'s `'torch'` apart from the dtypes' `'torch'`).
    ///
    /// # Errors
    /// [`Error::Unencodable`] below protocol 4; [`Error::Io`].
    pub fn stack_global(&mut self) -> Result<()> {
        self.need(4, "STACK_GLOBAL needs protocol 4")?;
        self.op(op::STACK_GLOBAL)
    }

    /// EMPTY_TUPLE.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn empty_tuple(&mut self) -> Result<()> {
        self.boundary()?;
        self.op(op::EMPTY_TUPLE)
    }

    /// EMPTY_LIST.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn empty_list(&mut self) -> Result<()> {
        self.boundary()?;
        self.op(op::EMPTY_LIST)
    }

    /// EMPTY_DICT.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn empty_dict(&mut self) -> Result<()> {
        self.boundary()?;
        self.op(op::EMPTY_DICT)
    }

    /// EMPTY_SET (protocol ≥ 4).
    ///
    /// # Errors
    /// [`Error::Unencodable`] below protocol 4; [`Error::Io`].
    pub fn empty_set(&mut self) -> Result<()> {
        self.need(4, "EMPTY_SET needs protocol 4")?;
        self.boundary()?;
        self.op(op::EMPTY_SET)
    }

    /// BINGET (id < 256) or LONG_BINGET.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn get(&mut self, id: u32) -> Result<()> {
        self.boundary()?;
        if let Ok(b) = u8::try_from(id) {
            self.raw(&[op::BINGET, b])
        } else {
            let [a, b, c, d] = id.to_le_bytes();
            self.raw(&[op::LONG_BINGET, a, b, c, d])
        }
    }

    // ----- structure -----

    /// MARK (no boundary; see the type docs).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn mark(&mut self) -> Result<()> {
        self.op(op::MARK)
    }

    /// Starts a tuple of `n` items the way CPython's `save_tuple` does: a boundary, and MARK when `n > 3`.
    /// Follow with the `n` items and [`Pickler::tuple`]`(n)`.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn begin_tuple(&mut self, n: usize) -> Result<()> {
        self.boundary()?;
        if n > 3 { self.mark() } else { Ok(()) }
    }

    /// Ends a tuple of `n` items: EMPTY_TUPLE for 0 (nothing must precede it), TUPLE1/TUPLE2/TUPLE3 for 1-3,
    /// TUPLE (closing a MARK issued before the items, see [`Pickler::begin_tuple`]) for more.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn tuple(&mut self, n: usize) -> Result<()> {
        match n {
            0 => self.empty_tuple(),
            1 => self.op(op::TUPLE1),
            2 => self.op(op::TUPLE2),
            3 => self.op(op::TUPLE3),
            _ => self.op(op::TUPLE),
        }
    }

    /// APPEND.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn append(&mut self) -> Result<()> {
        self.op(op::APPEND)
    }

    /// APPENDS (closing a MARK).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn appends(&mut self) -> Result<()> {
        self.op(op::APPENDS)
    }

    /// SETITEM.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn setitem(&mut self) -> Result<()> {
        self.op(op::SETITEM)
    }

    /// SETITEMS (closing a MARK).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn setitems(&mut self) -> Result<()> {
        self.op(op::SETITEMS)
    }

    /// ADDITEMS (closing a MARK; protocol ≥ 4).
    ///
    /// # Errors
    /// [`Error::Unencodable`] below protocol 4; [`Error::Io`].
    pub fn additems(&mut self) -> Result<()> {
        self.need(4, "ADDITEMS needs protocol 4")?;
        self.op(op::ADDITEMS)
    }

    /// FROZENSET (closing a MARK; protocol ≥ 4).
    ///
    /// # Errors
    /// [`Error::Unencodable`] below protocol 4; [`Error::Io`].
    pub fn frozenset(&mut self) -> Result<()> {
        self.need(4, "FROZENSET needs protocol 4")?;
        self.op(op::FROZENSET)
    }

    /// REDUCE.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn reduce(&mut self) -> Result<()> {
        self.op(op::REDUCE)
    }

    /// NEWOBJ.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn newobj(&mut self) -> Result<()> {
        self.op(op::NEWOBJ)
    }

    /// NEWOBJ_EX (protocol ≥ 4).
    ///
    /// # Errors
    /// [`Error::Unencodable`] below protocol 4; [`Error::Io`].
    pub fn newobj_ex(&mut self) -> Result<()> {
        self.need(4, "NEWOBJ_EX needs protocol 4")?;
        self.op(op::NEWOBJ_EX)
    }

    /// INST `module\nname\n` (closing a MARK that precedes the constructor arguments).
    ///
    /// # Errors
    /// [`Error::Unencodable`] for names with newlines (or non-ASCII below protocol 3); [`Error::Io`].
    pub fn inst(&mut self, module: &str, name: &str) -> Result<()> {
        self.check_text_name(module)?;
        self.check_text_name(name)?;
        self.op(op::INST)?;
        self.raw(module.as_bytes())?;
        self.raw(b"\n")?;
        self.raw(name.as_bytes())?;
        self.raw(b"\n")
    }

    /// OBJ (closing a MARK followed by the class and the constructor arguments).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn obj(&mut self) -> Result<()> {
        self.op(op::OBJ)
    }

    /// BUILD.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn build(&mut self) -> Result<()> {
        self.op(op::BUILD)
    }

    /// BINPERSID (after the persistent id object).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn binpersid(&mut self) -> Result<()> {
        self.op(op::BINPERSID)
    }

    /// Discards what a tuple of `n` items pushed since [`Pickler::begin_tuple`]: POP_MARK for a MARKed tuple
    /// (`n > 3`), else POP `n` times; CPython's `save_tuple` does this when an item turned out to refer back
    /// to the tuple, which is then read from the memo instead.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn discard_tuple(&mut self, n: usize) -> Result<()> {
        if n > 3 {
            return self.op(op::POP_MARK);
        }
        for _ in 0..n {
            self.op(op::POP)?;
        }
        Ok(())
    }

    /// Memoizes the top of the stack under the next sequential id and returns it: MEMOIZE at protocol ≥ 4,
    /// else BINPUT (id < 256) / LONG_BINPUT.
    ///
    /// # Errors
    /// [`Error::Unencodable`] after 2^32 memo entries; [`Error::Io`].
    pub fn memoize(&mut self) -> Result<u32> {
        let id = self.next_memo;
        self.next_memo = id
            .checked_add(1)
            .ok_or(Error::Unencodable { what: "more than 2^32 memo entries", protocol: self.protocol })?;
        if self.protocol >= 4 {
            self.op(op::MEMOIZE)?;
        } else if let Ok(b) = u8::try_from(id) {
            self.raw(&[op::BINPUT, b])?;
        } else {
            let [a, b, c, d] = id.to_le_bytes();
            self.raw(&[op::LONG_BINPUT, a, b, c, d])?;
        }
        Ok(id)
    }

    /// STOP. [`Pickler::finish`] writes it if this was not called.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn stop(&mut self) -> Result<()> {
        self.stopped = true;
        self.op(op::STOP)
    }

    /// Writes STOP (unless [`Pickler::stop`] was called), commits the last frame, flushes, and returns the
    /// writer.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn finish(mut self) -> Result<W> {
        if !self.stopped {
            self.stop()?;
        }
        self.commit_frame()?;
        self.flush_buf()?;
        self.out.flush()?;
        Ok(self.out)
    }
}
