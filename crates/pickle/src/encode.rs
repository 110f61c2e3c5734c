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
    /// Every value is a distinct object, except CPython's singletons: the empty str, one-character strs below
    /// U+0100 (as produced by decoding, slicing, `chr`, `json`, `pickle.loads`), and the empty bytes. Matches
    /// CPython for objects built at run time (parsed, computed, loaded); the default.
    #[default]
    Distinct,
    /// Additionally, strs that look like Python identifiers (ASCII letters, digits and `_`, not starting with a
    /// digit) are one object per value, as CPython interns identifier-like code constants and attribute names
    /// (the keys of a `BUILD` state dict, class and field names). A good model of objects built by Python code.
    Identifiers,
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
}

impl EncodeOptions {
    /// Options for `protocol` with [`Sharing::Distinct`].
    #[must_use]
    pub fn new(protocol: u8) -> Self {
        EncodeOptions { protocol, sharing: Sharing::Distinct }
    }

    /// Sets the sharing policy.
    #[must_use]
    pub fn with_sharing(mut self, sharing: Sharing) -> Self {
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
/// [`Value::BigInt`] that fits `i64` is written as an int. INST/OBJ objects are written with INST/OBJ. The
/// encoder does not recurse, so any depth can be written (but [`decode`](crate::decode) only reads back what
/// [`Limits::max_depth`](crate::Limits::max_depth) allows).
///
/// At protocol 2, a value made only of None, bool, int (up to 255 bytes), float, str, list, tuple, dict, globals,
/// REDUCE/NEWOBJ objects with BUILD state and persistent ids uses only opcodes that torch's `weights_only`
/// unpickler implements.
///
/// # Errors
/// [`Error::Unencodable`] (protocol outside 2-5, NEWOBJ_EX below protocol 4, INST whose callable is not a global
/// or whose args are not a tuple, OBJ with non-tuple args, bad global names); [`Error::Io`].
pub fn encode_into<W: Write>(value: &Value, writer: W, options: &EncodeOptions) -> Result<W> {
    let pickler = Pickler::new(writer, options.protocol)?;
    let hashes = if options.sharing == Sharing::Structural { structural_hashes(value) } else { HashMap::new() };
    let mut enc = Encoder {
        p: pickler,
        sharing: options.sharing,
        hashes,
        seen: HashMap::new(),
        tasks: Vec::new(),
        shared: HashMap::new(),
        shared_at: HashMap::new(),
        shared_memo: HashMap::new(),
        memo_at: HashMap::new(),
    };
    enc.run(value)?;
    enc.p.finish()
}

/// A pending step of the encoder (a stack of these replaces recursion).
enum Task<'a> {
    Save(&'a Value),
    Mark,
    Append,
    Appends,
    SetItem,
    SetItems,
    AddItems,
    FrozenSet,
    Tuple(usize),
    /// The end of a non-empty tuple: TUPLE and memoize it, or, when one of its items referred back to it
    /// (so it was written, and memoized, inside itself), discard its items and read it from the memo.
    TupleEnd(&'a Value, usize),
    Reduce,
    NewObj,
    NewObjEx,
    Inst(&'a str, &'a str),
    Obj,
    Build,
    BinPersId,
    /// Memoize the top of the stack; with `Some(v)`, remember `v` for structural sharing.
    Memoize(Option<&'a Value>),
}

struct Encoder<'a, W: Write> {
    p: Pickler<W>,
    sharing: Sharing,
    /// Structural sharing: hash of every container, by address.
    hashes: HashMap<*const Value, u64>,
    /// Structural sharing: hash -> values written and their memo ids.
    seen: HashMap<u64, Vec<(&'a Value, u32)>>,
    tasks: Vec<Task<'a>>,
    /// Each [`Value::Shared`] being or having been written: its value, by id.
    shared: HashMap<u32, &'a Value>,
    /// The id of each [`Value::Shared`]'s value, by address.
    shared_at: HashMap<*const Value, u32>,
    /// The memo id each shared object was written under.
    shared_memo: HashMap<u32, u32>,
    /// The memo id of every value written and memoized, by address: a value met again at the same address
    /// (inside a shared tuple written again inside itself) is read from the memo, as CPython's memo by `id`.
    memo_at: HashMap<*const Value, u32>,
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

/// ASCII Python identifier (what CPython interns among string constants).
fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && bytes.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

impl<'a, W: Write> Encoder<'a, W> {
    fn run(&mut self, root: &'a Value) -> Result<()> {
        self.tasks.push(Task::Save(root));
        while let Some(task) = self.tasks.pop() {
            match task {
                Task::Save(v) => self.save(v)?,
                Task::Mark => self.p.mark()?,
                Task::Append => self.p.append()?,
                Task::Appends => self.p.appends()?,
                Task::SetItem => self.p.setitem()?,
                Task::SetItems => self.p.setitems()?,
                Task::AddItems => self.p.additems()?,
                Task::FrozenSet => self.p.frozenset()?,
                Task::Tuple(n) => self.p.tuple(n)?,
                Task::TupleEnd(v, n) => match self.shared_at.get(&std::ptr::from_ref(v)) {
                    Some(id) if self.shared_memo.contains_key(id) => {
                        let memo = self.shared_memo.get(id).copied().unwrap_or_default();
                        self.p.discard_tuple(n)?;
                        self.p.get(memo)?;
                    }
                    _ => {
                        self.p.tuple(n)?;
                        let id = self.p.memoize()?;
                        self.remember(v, id);
                    }
                },
                Task::Reduce => self.p.reduce()?,
                Task::NewObj => self.p.newobj()?,
                Task::NewObjEx => self.p.newobj_ex()?,
                Task::Inst(m, n) => self.p.inst(m, n)?,
                Task::Obj => self.p.obj()?,
                Task::Build => self.p.build()?,
                Task::BinPersId => self.p.binpersid()?,
                Task::Memoize(v) => {
                    let id = self.p.memoize()?;
                    if let Some(v) = v {
                        self.remember(v, id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Queues `steps` to run next, in order.
    fn then(&mut self, steps: Vec<Task<'a>>) {
        self.tasks.extend(steps.into_iter().rev());
    }

    fn remember(&mut self, v: &'a Value, id: u32) {
        if !self.shared_at.is_empty() {
            self.memo_at.insert(std::ptr::from_ref(v), id);
        }
        if let Some(&shared) = self.shared_at.get(&std::ptr::from_ref(v)) {
            self.shared_memo.insert(shared, id);
        }
        if let Some(&h) = self.hashes.get(&std::ptr::from_ref(v)) {
            self.seen.entry(h).or_default().push((v, id));
        }
    }

    /// Structural sharing: the memo id of an equal value already written.
    fn written_before(&self, v: &Value) -> Option<u32> {
        let h = self.hashes.get(&std::ptr::from_ref(v))?;
        self.seen.get(h)?.iter().find(|(o, _)| same(o, v)).map(|&(_, id)| id)
    }

    /// CPython's `save(obj)`: writes what can be written now and queues the rest.
    fn save(&mut self, v: &'a Value) -> Result<()> {
        self.p.boundary()?;
        match v {
            Value::Shared { id, value } => {
                if let Some(&memo) = self.shared_memo.get(id) {
                    // Written already (this is a tuple being written again inside itself): read it.
                    return self.p.get(memo);
                }
                self.shared.insert(*id, value);
                self.shared_at.insert(std::ptr::from_ref(&**value), *id);
                self.tasks.push(Task::Save(value));
                return Ok(());
            }
            Value::Ref(id) => {
                if let Some(&memo) = self.shared_memo.get(id) {
                    return self.p.get(memo);
                }
                return match self.shared.get(id).copied() {
                    // Not memoized: a value written without a memo entry (a scalar, a singleton or interned
                    // string, a global), which is written again; or a tuple or frozenset that is still
                    // being written, which is written again inside itself (as CPython's `save_tuple`
                    // does), its items then reading the objects around it from the memo.
                    Some(Value::FrozenSet(_)) => Err(Error::Unencodable {
                        what: "a frozenset that contains itself",
                        protocol: self.p.protocol(),
                    }),
                    // A shared persistent id is memoized as soon as it is loaded: one not memoized yet is
                    // still being written, and its id cannot hold the object it is the id of.
                    Some(Value::PersistentId(_)) => Err(Error::Unencodable {
                        what: "a persistent id whose id holds the object it loads",
                        protocol: self.p.protocol(),
                    }),
                    Some(shared) => {
                        self.tasks.push(Task::Save(shared));
                        Ok(())
                    }
                    None => Err(Error::Unencodable {
                        what: "a Value::Ref before (outside) the Value::Shared it refers to",
                        protocol: self.p.protocol(),
                    }),
                };
            }
            Value::None => return self.p.none(),
            Value::Bool(b) => return self.p.bool(*b),
            Value::Int(i) => return self.p.int(*i),
            Value::BigInt(b) => {
                return match from_le_twos(b) {
                    IntRepr::Small(i) => self.p.int(i),
                    IntRepr::Big(m) => self.p.big_int(&m),
                };
            }
            Value::Float(f) => return self.p.float(*f),
            Value::Str(s) => {
                let shared = match self.sharing {
                    Sharing::Distinct => is_singleton_str(s),
                    Sharing::Identifiers => is_singleton_str(s) || is_identifier(s),
                    Sharing::Strings | Sharing::Structural => true,
                };
                if shared {
                    return self.p.shared_str(s);
                }
                self.p.str(s)?;
                let id = self.p.memoize()?;
                self.remember(v, id);
                return Ok(());
            }
            Value::Bytes(b) if b.is_empty() => return self.p.shared_bytes(b),
            Value::Tuple(items) if items.is_empty() => return self.p.empty_tuple(),
            Value::Global { module, name } => return self.p.global_memo(module, name),
            Value::PersistentId(inner) => {
                // CPython's pickler never memoizes a persistent id's object: each place loads it again. One
                // the pickle shared (it was memoized and fetched again) is memoized after it, so that every
                // reference reads the one object, as the decoded pickle had it.
                let mut steps = vec![Task::Save(inner), Task::BinPersId];
                if self.shared_at.contains_key(&std::ptr::from_ref(v)) {
                    steps.push(Task::Memoize(Some(v)));
                }
                self.then(steps);
                return Ok(());
            }
            _ => {}
        }
        if let Some(&id) = self.memo_at.get(&std::ptr::from_ref(v)) {
            return self.p.get(id);
        }
        if self.sharing == Sharing::Structural {
            if let Some(id) = self.written_before(v) {
                return self.p.get(id);
            }
        }
        let protocol = self.p.protocol();
        match v {
            Value::Bytes(b) => {
                self.p.bytes(b)?;
                let id = self.p.memoize()?;
                self.remember(v, id);
            }
            Value::ByteArray(b) => {
                self.p.bytearray(b)?;
                let id = self.p.memoize()?;
                self.remember(v, id);
            }
            Value::List(items) => {
                self.p.empty_list()?;
                let id = self.p.memoize()?;
                self.remember(v, id);
                let steps = list_batches_exact(items);
                self.then(steps);
            }
            Value::Tuple(items) => {
                self.p.begin_tuple(items.len())?;
                let mut steps: Vec<Task<'a>> = items.iter().map(Task::Save).collect();
                steps.push(Task::TupleEnd(v, items.len()));
                self.then(steps);
            }
            Value::Dict(pairs) => {
                self.p.empty_dict()?;
                let id = self.p.memoize()?;
                self.remember(v, id);
                let steps = dict_batches_exact(pairs);
                self.then(steps);
            }
            Value::Set(items) | Value::FrozenSet(items) if protocol < 4 => {
                // CPython: save_reduce(set, (list(obj),), obj=obj).
                let module = if protocol < 3 { "__builtin__" } else { "builtins" };
                let name = if matches!(v, Value::Set(_)) { "set" } else { "frozenset" };
                self.p.global_memo(module, name)?;
                self.p.empty_list()?;
                self.p.memoize()?;
                let mut steps = list_batches_exact(items);
                steps.extend([Task::Tuple(1), Task::Memoize(None), Task::Reduce, Task::Memoize(Some(v))]);
                self.then(steps);
            }
            Value::Set(items) => {
                self.p.empty_set()?;
                let id = self.p.memoize()?;
                self.remember(v, id);
                let steps = set_batches(items);
                self.then(steps);
            }
            Value::FrozenSet(items) => {
                self.p.mark()?;
                let mut steps: Vec<Task<'a>> = items.iter().map(Task::Save).collect();
                steps.push(Task::FrozenSet);
                steps.push(Task::Memoize(Some(v)));
                self.then(steps);
            }
            Value::Object(o) => self.save_object(v, o)?,
            // Handled above.
            _ => {}
        }
        Ok(())
    }

    fn save_object(&mut self, v: &'a Value, o: &'a Object) -> Result<()> {
        let protocol = self.p.protocol();
        let mut steps: Vec<Task<'a>> = Vec::new();
        match &o.kind {
            ObjectKind::Reduce => steps.extend([Task::Save(&o.callable), Task::Save(&o.args), Task::Reduce]),
            ObjectKind::NewObj => steps.extend([Task::Save(&o.callable), Task::Save(&o.args), Task::NewObj]),
            ObjectKind::NewObjEx { kwargs } => {
                if protocol < 4 {
                    return Err(Error::Unencodable { what: "NEWOBJ_EX needs protocol 4", protocol });
                }
                steps.extend([Task::Save(&o.callable), Task::Save(&o.args), Task::Save(kwargs), Task::NewObjEx]);
            }
            ObjectKind::Inst => {
                let (Some((module, name)), Value::Tuple(args)) = (o.callable.as_global(), &o.args) else {
                    return Err(Error::Unencodable {
                        what: "an INST object needs a global callable and tuple args",
                        protocol,
                    });
                };
                steps.push(Task::Mark);
                steps.extend(args.iter().map(Task::Save));
                steps.push(Task::Inst(module, name));
            }
            ObjectKind::Obj => {
                let Value::Tuple(args) = &o.args else {
                    return Err(Error::Unencodable { what: "an OBJ object needs tuple args", protocol });
                };
                steps.push(Task::Mark);
                steps.push(Task::Save(&o.callable));
                steps.extend(args.iter().map(Task::Save));
                steps.push(Task::Obj);
            }
        }
        steps.push(Task::Memoize(Some(v)));
        list_batches_generic(&o.list_items, &mut steps);
        dict_batches_generic(&o.dict_items, &mut steps);
        if let Some(state) = &o.state {
            steps.push(Task::Save(state));
            steps.push(Task::Build);
        }
        self.then(steps);
        Ok(())
    }
}

/// `batch_list_exact`: one item → APPEND; otherwise MARK ... APPENDS per 1000 items.
fn list_batches_exact(items: &[Value]) -> Vec<Task<'_>> {
    let mut steps = Vec::with_capacity(items.len() + 2 * items.len().div_ceil(BATCH));
    if let [only] = items {
        steps.push(Task::Save(only));
        steps.push(Task::Append);
        return steps;
    }
    for chunk in items.chunks(BATCH) {
        steps.push(Task::Mark);
        steps.extend(chunk.iter().map(Task::Save));
        steps.push(Task::Appends);
    }
    steps
}

/// `batch_dict_exact`: one pair → SETITEM; otherwise MARK ... SETITEMS per 1000 pairs, repeated while the
/// previous batch was full (so a multiple of 1000 pairs ends with an empty `MARK SETITEMS`).
fn dict_batches_exact(pairs: &[(Value, Value)]) -> Vec<Task<'_>> {
    let mut steps = Vec::with_capacity(2 * pairs.len() + 2 * (pairs.len() / BATCH + 1));
    match pairs {
        [] => return steps,
        [(k, v)] => {
            steps.extend([Task::Save(k), Task::Save(v), Task::SetItem]);
            return steps;
        }
        _ => {}
    }
    let mut rest = pairs;
    loop {
        let n = rest.len().min(BATCH);
        let (chunk, tail) = rest.split_at(n);
        steps.push(Task::Mark);
        for (k, v) in chunk {
            steps.push(Task::Save(k));
            steps.push(Task::Save(v));
        }
        steps.push(Task::SetItems);
        rest = tail;
        if n < BATCH {
            return steps;
        }
    }
}

/// `save_set` (protocol ≥ 4): MARK ... ADDITEMS per 1000 items, repeated while the previous batch was full.
fn set_batches(items: &[Value]) -> Vec<Task<'_>> {
    let mut steps = Vec::with_capacity(items.len() + 2 * (items.len() / BATCH + 1));
    if items.is_empty() {
        return steps;
    }
    let mut rest = items;
    loop {
        let n = rest.len().min(BATCH);
        let (chunk, tail) = rest.split_at(n);
        steps.push(Task::Mark);
        steps.extend(chunk.iter().map(Task::Save));
        steps.push(Task::AddItems);
        rest = tail;
        if n < BATCH {
            return steps;
        }
    }
}

/// Generic `batch_list` (REDUCE list items): per batch of 1000, MARK ... APPENDS, or APPEND for a batch of 1.
fn list_batches_generic<'a>(items: &'a [Value], steps: &mut Vec<Task<'a>>) {
    for chunk in items.chunks(BATCH) {
        if let [only] = chunk {
            steps.push(Task::Save(only));
            steps.push(Task::Append);
        } else {
            steps.push(Task::Mark);
            steps.extend(chunk.iter().map(Task::Save));
            steps.push(Task::Appends);
        }
    }
}

/// Generic `batch_dict` (REDUCE dict items, e.g. OrderedDict): per batch of 1000, MARK ... SETITEMS, or
/// SETITEM for a batch of 1.
fn dict_batches_generic<'a>(pairs: &'a [(Value, Value)], steps: &mut Vec<Task<'a>>) {
    for chunk in pairs.chunks(BATCH) {
        if let [(k, v)] = chunk {
            steps.extend([Task::Save(k), Task::Save(v), Task::SetItem]);
        } else {
            steps.push(Task::Mark);
            for (k, v) in chunk {
                steps.push(Task::Save(k));
                steps.push(Task::Save(v));
            }
            steps.push(Task::SetItems);
        }
    }
}

/// Children of a value, in a fixed order (for hashing and comparison).
fn children(v: &Value) -> Vec<&Value> {
    match v {
        Value::List(items) | Value::Tuple(items) | Value::Set(items) | Value::FrozenSet(items) => {
            items.iter().collect()
        }
        Value::Dict(pairs) => pairs.iter().flat_map(|(k, x)| [k, x]).collect(),
        Value::PersistentId(inner) | Value::Shared { value: inner, .. } => vec![inner],
        Value::Object(o) => {
            let mut out = vec![&o.callable, &o.args];
            if let ObjectKind::NewObjEx { kwargs } = &o.kind {
                out.push(kwargs);
            }
            out.extend(o.state.iter());
            out.extend(o.list_items.iter());
            out.extend(o.dict_items.iter().flat_map(|(k, x)| [k, x]));
            out
        }
        _ => Vec::new(),
    }
}

/// Hashes what distinguishes `v` from another value with the same children (floats by bits).
fn hash_shallow<H: Hasher>(v: &Value, h: &mut H) {
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
        }
        Value::Dict(pairs) => pairs.len().hash(h),
        Value::Global { module, name } => {
            module.hash(h);
            name.hash(h);
        }
        Value::Object(o) => {
            std::mem::discriminant(&o.kind).hash(h);
            o.state.is_some().hash(h);
            o.list_items.len().hash(h);
            o.dict_items.len().hash(h);
        }
        Value::PersistentId(_) => {}
        Value::Shared { id, .. } | Value::Ref(id) => id.hash(h),
    }
}

/// Structural hashes of every container in `root`, computed bottom-up without recursion.
fn structural_hashes(root: &Value) -> HashMap<*const Value, u64> {
    let mut hashes: HashMap<*const Value, u64> = HashMap::new();
    let mut stack: Vec<(&Value, bool)> = vec![(root, false)];
    while let Some((v, expanded)) = stack.pop() {
        let kids = children(v);
        if kids.is_empty() && !matches!(v, Value::PersistentId(_)) && !is_container(v) {
            continue;
        }
        if !expanded {
            stack.push((v, true));
            stack.extend(kids.into_iter().map(|k| (k, false)));
            continue;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        hash_shallow(v, &mut h);
        for k in kids {
            match hashes.get(&std::ptr::from_ref(k)) {
                Some(kh) => kh.hash(&mut h),
                None => hash_shallow(k, &mut h),
            }
        }
        hashes.insert(std::ptr::from_ref(v), h.finish());
    }
    // Leaves that are memoized and shared structurally (bytes, bytearray) hash shallowly on demand.
    let mut leaves: Vec<&Value> = Vec::new();
    let mut stack = vec![root];
    while let Some(v) = stack.pop() {
        if matches!(v, Value::Bytes(_) | Value::ByteArray(_)) {
            leaves.push(v);
        }
        stack.extend(children(v));
    }
    for v in leaves {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        hash_shallow(v, &mut h);
        hashes.insert(std::ptr::from_ref(v), h.finish());
    }
    hashes
}

fn is_container(v: &Value) -> bool {
    matches!(
        v,
        Value::List(_)
            | Value::Tuple(_)
            | Value::Set(_)
            | Value::FrozenSet(_)
            | Value::Dict(_)
            | Value::Object(_)
            | Value::PersistentId(_)
            | Value::Shared { .. }
    )
}

/// Structural equality without recursion, floats compared by bits (so `0.0` and `-0.0` differ and NaN equals
/// itself).
fn same(a: &Value, b: &Value) -> bool {
    let mut stack: Vec<(&Value, &Value)> = vec![(a, b)];
    while let Some((x, y)) = stack.pop() {
        if std::ptr::eq(x, y) {
            continue;
        }
        let shallow_equal = match (x, y) {
            (Value::Float(p), Value::Float(q)) => p.to_bits() == q.to_bits(),
            (Value::Object(p), Value::Object(q)) => {
                std::mem::discriminant(&p.kind) == std::mem::discriminant(&q.kind)
                    && p.state.is_some() == q.state.is_some()
                    && p.list_items.len() == q.list_items.len()
                    && p.dict_items.len() == q.dict_items.len()
            }
            (Value::List(p), Value::List(q))
            | (Value::Tuple(p), Value::Tuple(q))
            | (Value::Set(p), Value::Set(q))
            | (Value::FrozenSet(p), Value::FrozenSet(q)) => p.len() == q.len(),
            (Value::Dict(p), Value::Dict(q)) => p.len() == q.len(),
            (Value::PersistentId(_), Value::PersistentId(_)) => true,
            (Value::Shared { id: p, .. }, Value::Shared { id: q, .. }) | (Value::Ref(p), Value::Ref(q)) => p == q,
            (Value::None, Value::None) => true,
            (Value::Bool(p), Value::Bool(q)) => p == q,
            (Value::Int(p), Value::Int(q)) => p == q,
            (Value::BigInt(p), Value::BigInt(q)) | (Value::Bytes(p), Value::Bytes(q)) => p == q,
            (Value::ByteArray(p), Value::ByteArray(q)) => p == q,
            (Value::Str(p), Value::Str(q)) => p == q,
            (Value::Global { module: pm, name: pn }, Value::Global { module: qm, name: qn }) => pm == qm && pn == qn,
            _ => false,
        };
        if !shallow_equal {
            return false;
        }
        let (cx, cy) = (children(x), children(y));
        if cx.len() != cy.len() {
            return false;
        }
        stack.extend(cx.into_iter().zip(cy));
    }
    true
}
