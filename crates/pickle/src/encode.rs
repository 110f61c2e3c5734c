//! High-level encoder: writes a [`Value`] tree the way CPython's `pickle.dumps` writes the equivalent object.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;

use crate::bigint::{IntRepr, from_le_twos};
use crate::error::Error;
use crate::pickler::Pickler;
use crate::value::{Object, ObjectKind, Value};

type Result<T, E = Error> = std::result::Result<T, E>;

/// CPython's `_BATCHSIZE`.
const BATCH: usize = 1000;

/// Which equal values the encoder writes once and refers to with GET afterwards.
///
/// A [`Value`] tree carries no object identity, while CPython's memo is keyed by identity; each policy
/// reproduces CPython's output for one way the Python object could have been built. Globals are always written
/// once per `(module, name)` (a class is one object), and so are the module/name strings of protocol-4
/// STACK_GLOBALs (they are interned in CPython).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Sharing {
    /// Every value is a distinct object, except CPython's singletons: the empty str and one-character strs
    /// below U+0100, empty and one-byte bytes. Matches CPython for objects built at run time (parsed, computed,
    /// loaded); the default.
    #[default]
    Distinct,
    /// Additionally, equal strs are one object (as if all were interned), e.g. dict keys shared across many
    /// records written from string literals.
    Strings,
    /// Additionally, any two equal memoizable values (str, bytes, bytearray, non-empty tuple, list, dict, set,
    /// frozenset, object) are one object: the most compact output, and what CPython writes when the structure
    /// really was shared (`{'x': inner, 'y': inner}`). Floats are compared by bits. Costs one hash of each
    /// container's subtree.
    Structural,
}

/// Options for [`encode_with`] / [`encode_into`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Pickle protocol, 2 to 5. Protocol 2 is what `torch.save` writes and what `torch.load(weights_only=True)`
    /// reads; protocol 4 is what DCP `.metadata` uses.
    pub protocol: u8,
    /// Which equal values are written once.
    pub sharing: Sharing,
    /// Maximum nesting depth of the value (counted like [`Limits::max_depth`](crate::Limits::max_depth)).
    /// Default 1000. The encoder recurses once per level.
    pub max_depth: usize,
}

impl EncodeOptions {
    /// Options for `protocol` with [`Sharing::Distinct`] and depth limit 1000.
    #[must_use]
    pub fn new(protocol: u8) -> Self {
        EncodeOptions { protocol, sharing: Sharing::Distinct, max_depth: 1000 }
    }

    /// Sets the sharing policy.
    #[must_use]
    pub fn sharing(mut self, sharing: Sharing) -> Self {
        self.sharing = sharing;
        self
    }
}

/// Encodes `value` with `protocol` (2 to 5) and [`Sharing::Distinct`].
///
/// # Errors
/// See [`encode_into`].
pub fn encode(value: &Value, protocol: u8) -> Result<Vec<u8>> {
    encode_with(value, &EncodeOptions::new(protocol))
}

/// Encodes `value` into a new buffer.
///
/// # Errors
/// See [`encode_into`].
pub fn encode_with(value: &Value, options: &EncodeOptions) -> Result<Vec<u8>> {
    encode_into(value, Vec::new(), options)
}

/// Encodes `value` to `writer` and returns the writer.
///
/// Output matches CPython's `pickle.dumps(obj, protocol)` for the Python object the value describes (under the
/// chosen [`Sharing`]): opcode choice, memo numbering (every str, bytes, bytearray, non-empty tuple, list, dict,
/// set, frozenset, global and object is memoized), batches of 1000 with CPython's exact batching rules for
/// `dict`/`list`/`set` and for REDUCE list/dict items, protocol-4 framing. Types without an opcode at the chosen
/// protocol use CPython's REDUCE forms (`bytes` at protocol 2, `bytearray` below 5, `set`/`frozenset` below 4;
/// see [`Value::desugar`] for reading them back). [`Value::Global`] names are written exactly as given. A
/// [`Value::BigInt`] that fits `i64` is written as an int. INST/OBJ objects are written with INST/OBJ.
///
/// At protocol 2, a value made only of None, bool, int (up to 255 bytes), float, str, list, tuple, dict, globals,
/// REDUCE/NEWOBJ objects with BUILD state and persistent ids uses only opcodes that torch's `weights_only`
/// unpickler implements.
///
/// # Errors
/// [`Error::Unencodable`] (protocol outside 2-5, NEWOBJ_EX below protocol 4, INST whose callable is not a global
/// or whose args are not a tuple, OBJ with non-tuple args, bad global names); [`Error::DepthExceeded`];
/// [`Error::Io`].
pub fn encode_into<W: Write>(value: &Value, writer: W, options: &EncodeOptions) -> Result<W> {
    check_depth(value, options.max_depth)?;
    let pickler = Pickler::new(writer, options.protocol)?;
    let mut enc = Encoder { p: pickler, sharing: options.sharing, structural: HashMap::new() };
    enc.save(value)?;
    enc.p.finish()
}

/// Rejects values nested deeper than `max` without recursing.
fn check_depth(value: &Value, max: usize) -> Result<()> {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 1)];
    while let Some((v, d)) = stack.pop() {
        if d > max {
            return Err(Error::DepthExceeded { limit: max, offset: 0 });
        }
        let d = d + 1;
        match v {
            Value::List(items) | Value::Tuple(items) | Value::Set(items) | Value::FrozenSet(items) => {
                stack.extend(items.iter().map(|i| (i, d)));
            }
            Value::Dict(pairs) => {
                for (k, x) in pairs {
                    stack.push((k, d));
                    stack.push((x, d));
                }
            }
            Value::PersistentId(inner) => stack.push((inner, d)),
            Value::Object(o) => {
                stack.push((&o.callable, d));
                stack.push((&o.args, d));
                if let ObjectKind::NewObjEx { kwargs } = &o.kind {
                    stack.push((kwargs, d));
                }
                if let Some(s) = &o.state {
                    stack.push((s, d));
                }
                stack.extend(o.list_items.iter().map(|i| (i, d)));
                for (k, x) in &o.dict_items {
                    stack.push((k, d));
                    stack.push((x, d));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

struct Encoder<'a, W: Write> {
    p: Pickler<W>,
    sharing: Sharing,
    /// Structural sharing: subtree hash -> (value, memo id).
    structural: HashMap<u64, Vec<(&'a Value, u32)>>,
}

/// CPython's one-character latin-1 strs and the empty str are singletons.
fn is_singleton_str(s: &str) -> bool {
    let mut it = s.chars();
    match (it.next(), it.next()) {
        (None, _) => true,
        (Some(c), None) => u32::from(c) < 0x100,
        _ => false,
    }
}

impl<'a, W: Write> Encoder<'a, W> {
    fn save(&mut self, v: &'a Value) -> Result<()> {
        self.p.boundary()?;
        match v {
            Value::None => self.p.none(),
            Value::Bool(b) => self.p.bool(*b),
            Value::Int(i) => self.p.int(*i),
            Value::BigInt(b) => match from_le_twos(b) {
                IntRepr::Small(i) => self.p.int(i),
                IntRepr::Big(m) => self.p.big_int(&m),
            },
            Value::Float(f) => self.p.float(*f),
            Value::Str(s) => self.save_str(s),
            Value::Bytes(b) => self.save_bytes(v, b),
            Value::Tuple(items) if items.is_empty() => self.p.empty_tuple(),
            Value::Global { module, name } => self.p.global_memo(module, name),
            Value::PersistentId(inner) => {
                self.save(inner)?;
                self.p.binpersid()
            }
            _ => self.save_memoizable(v),
        }
    }

    fn save_str(&mut self, s: &str) -> Result<()> {
        if self.sharing != Sharing::Distinct || is_singleton_str(s) {
            return self.p.shared_str(s);
        }
        self.p.str(s)?;
        self.p.memoize().map(drop)
    }

    fn save_bytes(&mut self, v: &'a Value, b: &[u8]) -> Result<()> {
        if b.len() <= 1 {
            return self.p.shared_bytes(b);
        }
        self.shared_or(v, |e| {
            e.p.bytes(b)?;
            e.p.memoize()
        })
    }

    /// Runs `write` (which must write `v` and return its memo id) unless structural sharing finds an equal value
    /// already written, in which case a GET is written.
    fn shared_or(&mut self, v: &'a Value, write: impl FnOnce(&mut Self) -> Result<u32>) -> Result<()> {
        if self.sharing != Sharing::Structural {
            return write(self).map(drop);
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        hash_value(v, &mut h);
        let key = h.finish();
        if let Some(id) = self.structural.get(&key).and_then(|c| c.iter().find(|(o, _)| same(o, v)).map(|x| x.1)) {
            return self.p.get(id);
        }
        let id = write(self)?;
        self.structural.entry(key).or_default().push((v, id));
        Ok(())
    }

    fn save_memoizable(&mut self, v: &'a Value) -> Result<()> {
        self.shared_or(v, |e| match v {
            Value::ByteArray(b) => {
                e.p.bytearray(b)?;
                e.p.memoize()
            }
            Value::List(items) => {
                e.p.empty_list()?;
                let id = e.p.memoize()?;
                e.list_items_exact(items)?;
                Ok(id)
            }
            Value::Tuple(items) => {
                e.p.begin_tuple(items.len())?;
                for it in items {
                    e.save(it)?;
                }
                e.p.tuple(items.len())?;
                e.p.memoize()
            }
            Value::Dict(pairs) => {
                e.p.empty_dict()?;
                let id = e.p.memoize()?;
                e.dict_items_exact(pairs)?;
                Ok(id)
            }
            Value::Set(items) => e.save_set(items, false),
            Value::FrozenSet(items) => e.save_set(items, true),
            Value::Object(o) => e.save_object(o),
            // Not reached: `save` handles the other variants.
            _ => Err(Error::Unencodable { what: "internal: not a memoizable value", protocol: e.p.protocol() }),
        })
    }

    /// `batch_list_exact`: one item → APPEND; otherwise MARK ... APPENDS per 1000 items.
    fn list_items_exact(&mut self, items: &'a [Value]) -> Result<()> {
        if let [only] = items {
            self.save(only)?;
            return self.p.append();
        }
        for chunk in items.chunks(BATCH) {
            self.p.mark()?;
            for it in chunk {
                self.save(it)?;
            }
            self.p.appends()?;
        }
        Ok(())
    }

    /// `batch_dict_exact`: one pair → SETITEM; otherwise MARK ... SETITEMS per 1000 pairs, repeated while the
    /// previous batch was full (so a multiple of 1000 ends with an empty `MARK SETITEMS`).
    fn dict_items_exact(&mut self, pairs: &'a [(Value, Value)]) -> Result<()> {
        match pairs {
            [] => return Ok(()),
            [(k, v)] => {
                self.save(k)?;
                self.save(v)?;
                return self.p.setitem();
            }
            _ => {}
        }
        let mut rest = pairs;
        loop {
            let n = rest.len().min(BATCH);
            let (chunk, tail) = rest.split_at(n);
            self.p.mark()?;
            for (k, v) in chunk {
                self.save(k)?;
                self.save(v)?;
            }
            self.p.setitems()?;
            rest = tail;
            if n < BATCH {
                return Ok(());
            }
        }
    }

    /// Generic `batch_list` (REDUCE list items): per batch of 1000, MARK ... APPENDS, or APPEND for a batch of 1.
    fn list_items_generic(&mut self, items: &'a [Value]) -> Result<()> {
        for chunk in items.chunks(BATCH) {
            if let [only] = chunk {
                self.save(only)?;
                self.p.append()?;
            } else {
                self.p.mark()?;
                for it in chunk {
                    self.save(it)?;
                }
                self.p.appends()?;
            }
        }
        Ok(())
    }

    /// Generic `batch_dict` (REDUCE dict items, e.g. OrderedDict): per batch of 1000, MARK ... SETITEMS, or
    /// SETITEM for a batch of 1.
    fn dict_items_generic(&mut self, pairs: &'a [(Value, Value)]) -> Result<()> {
        for chunk in pairs.chunks(BATCH) {
            if let [(k, v)] = chunk {
                self.save(k)?;
                self.save(v)?;
                self.p.setitem()?;
            } else {
                self.p.mark()?;
                for (k, v) in chunk {
                    self.save(k)?;
                    self.save(v)?;
                }
                self.p.setitems()?;
            }
        }
        Ok(())
    }

    fn save_set(&mut self, items: &'a [Value], frozen: bool) -> Result<u32> {
        let protocol = self.p.protocol();
        if protocol < 4 {
            // CPython: save_reduce(set, (list(obj),), obj=obj).
            let module = if protocol < 3 { "__builtin__" } else { "builtins" };
            self.p.global_memo(module, if frozen { "frozenset" } else { "set" })?;
            self.p.boundary()?;
            self.p.empty_list()?;
            self.p.memoize()?;
            self.list_items_exact(items)?;
            self.p.tuple(1)?;
            self.p.memoize()?;
            self.p.reduce()?;
            return self.p.memoize();
        }
        if frozen {
            self.p.mark()?;
            for it in items {
                self.save(it)?;
            }
            self.p.frozenset()?;
            return self.p.memoize();
        }
        self.p.empty_set()?;
        let id = self.p.memoize()?;
        if items.is_empty() {
            return Ok(id);
        }
        let mut rest = items;
        loop {
            let n = rest.len().min(BATCH);
            let (chunk, tail) = rest.split_at(n);
            self.p.mark()?;
            for it in chunk {
                self.save(it)?;
            }
            self.p.additems()?;
            rest = tail;
            if n < BATCH {
                return Ok(id);
            }
        }
    }

    fn save_object(&mut self, o: &'a Object) -> Result<u32> {
        let protocol = self.p.protocol();
        match &o.kind {
            ObjectKind::Reduce => {
                self.save(&o.callable)?;
                self.save(&o.args)?;
                self.p.reduce()?;
            }
            ObjectKind::NewObj => {
                self.save(&o.callable)?;
                self.save(&o.args)?;
                self.p.newobj()?;
            }
            ObjectKind::NewObjEx { kwargs } => {
                if protocol < 4 {
                    return Err(Error::Unencodable { what: "NEWOBJ_EX needs protocol 4", protocol });
                }
                self.save(&o.callable)?;
                self.save(&o.args)?;
                self.save(kwargs)?;
                self.p.newobj_ex()?;
            }
            ObjectKind::Inst => {
                let (Some((module, name)), Value::Tuple(args)) = (o.callable.as_global(), &o.args) else {
                    return Err(Error::Unencodable {
                        what: "an INST object needs a global callable and tuple args",
                        protocol,
                    });
                };
                self.p.mark()?;
                for a in args {
                    self.save(a)?;
                }
                self.p.inst(module, name)?;
            }
            ObjectKind::Obj => {
                let Value::Tuple(args) = &o.args else {
                    return Err(Error::Unencodable { what: "an OBJ object needs tuple args", protocol });
                };
                self.p.mark()?;
                self.save(&o.callable)?;
                for a in args {
                    self.save(a)?;
                }
                self.p.obj()?;
            }
        }
        let id = self.p.memoize()?;
        self.list_items_generic(&o.list_items)?;
        self.dict_items_generic(&o.dict_items)?;
        if let Some(state) = &o.state {
            self.save(state)?;
            self.p.build()?;
        }
        Ok(id)
    }
}

/// Structural hash (floats by bits), consistent with [`same`]. Depth is bounded by `check_depth`.
fn hash_value<H: Hasher>(v: &Value, h: &mut H) {
    std::mem::discriminant(v).hash(h);
    match v {
        Value::None => {}
        Value::Bool(b) => b.hash(h),
        Value::Int(i) => i.hash(h),
        Value::Float(f) => f.to_bits().hash(h),
        Value::BigInt(b) | Value::Bytes(b) | Value::ByteArray(b) => b.hash(h),
        Value::Str(s) => s.hash(h),
        Value::List(items) | Value::Tuple(items) | Value::Set(items) | Value::FrozenSet(items) => {
            items.len().hash(h);
            for i in items {
                hash_value(i, h);
            }
        }
        Value::Dict(pairs) => hash_pairs(pairs, h),
        Value::Global { module, name } => {
            module.hash(h);
            name.hash(h);
        }
        Value::Object(o) => {
            hash_value(&o.callable, h);
            hash_value(&o.args, h);
            std::mem::discriminant(&o.kind).hash(h);
            if let ObjectKind::NewObjEx { kwargs } = &o.kind {
                hash_value(kwargs, h);
            }
            match &o.state {
                Some(s) => {
                    1u8.hash(h);
                    hash_value(s, h);
                }
                None => 0u8.hash(h),
            }
            o.list_items.len().hash(h);
            for i in &o.list_items {
                hash_value(i, h);
            }
            hash_pairs(&o.dict_items, h);
        }
        Value::PersistentId(inner) => hash_value(inner, h),
    }
}

fn hash_pairs<H: Hasher>(pairs: &[(Value, Value)], h: &mut H) {
    pairs.len().hash(h);
    for (k, v) in pairs {
        hash_value(k, h);
        hash_value(v, h);
    }
}

/// Structural equality with floats compared by bits (so `0.0` and `-0.0` differ and NaN equals itself).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::List(x), Value::List(y))
        | (Value::Tuple(x), Value::Tuple(y))
        | (Value::Set(x), Value::Set(y))
        | (Value::FrozenSet(x), Value::FrozenSet(y)) => same_seq(x, y),
        (Value::Dict(x), Value::Dict(y)) => same_pairs(x, y),
        (Value::PersistentId(x), Value::PersistentId(y)) => same(x, y),
        (Value::Object(x), Value::Object(y)) => {
            let kinds = match (&x.kind, &y.kind) {
                (ObjectKind::NewObjEx { kwargs: kx }, ObjectKind::NewObjEx { kwargs: ky }) => same(kx, ky),
                (kx, ky) => std::mem::discriminant(kx) == std::mem::discriminant(ky),
            };
            let states = match (&x.state, &y.state) {
                (Some(sx), Some(sy)) => same(sx, sy),
                (None, None) => true,
                _ => false,
            };
            kinds
                && states
                && same(&x.callable, &y.callable)
                && same(&x.args, &y.args)
                && same_seq(&x.list_items, &y.list_items)
                && same_pairs(&x.dict_items, &y.dict_items)
        }
        (Value::None, Value::None) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::BigInt(x), Value::BigInt(y)) | (Value::Bytes(x), Value::Bytes(y)) => x == y,
        (Value::ByteArray(x), Value::ByteArray(y)) => x == y,
        (Value::Str(x), Value::Str(y)) => x == y,
        (Value::Global { module: mx, name: nx }, Value::Global { module: my, name: ny }) => mx == my && nx == ny,
        _ => false,
    }
}

fn same_seq(x: &[Value], y: &[Value]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
}

fn same_pairs(x: &[(Value, Value)], y: &[(Value, Value)]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|((ka, va), (kb, vb))| same(ka, kb) && same(va, vb))
}
