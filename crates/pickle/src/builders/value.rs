//! [`ValueBuilder`]: the pickle as a [`Value`] tree, objects built in place, shared ones kept on a
//! [`Shelf`] until the end.

use std::borrow::Cow;

use crate::builder::{Builder, Call, CallKind, Items, Pairs, Sequence};
use crate::error::Error;
use crate::shelf::{Shelf, Tree};
use crate::value::{Object, ObjectKind, Value};

/// Builds a [`Value`] (see [`decode_with`](crate::decode_with), which runs it). Objects the pickle refers to
/// from several places go to a [`Shelf`] at their first [`share`](Builder::share) and are represented by
/// [`Value::Ref`] handles while the pickle runs; [`ValueBuilder::finish`] places them (see the [`Value`]
/// docs on sharing).
#[derive(Debug, Default)]
pub struct ValueBuilder {
    shelf: Shelf<Value>,
    limits_depth: Option<usize>,
}

impl ValueBuilder {
    /// A builder whose finished tree may be at most `max_depth` deep (the machine's own limit bounds the
    /// values as they are made; placing shared objects can nest them deeper).
    #[must_use]
    pub fn with_max_depth(max_depth: usize) -> Self {
        ValueBuilder { shelf: Shelf::default(), limits_depth: Some(max_depth) }
    }

    /// The finished value: `root` with every shared object placed.
    ///
    /// # Errors
    /// [`Error::DepthExceeded`] when placing shared objects makes the tree deeper than the limit.
    pub fn finish(self, root: Value) -> Result<Value, Error> {
        self.finish_at(root, 0)
    }

    /// [`ValueBuilder::finish`], for a pickle that ended at `end` (the offset a depth error reports).
    ///
    /// # Errors
    /// As [`ValueBuilder::finish`].
    pub fn finish_at(self, root: Value, end: usize) -> Result<Value, Error> {
        let depth = self.limits_depth.unwrap_or(crate::Limits::BUILTIN.max_depth);
        self.shelf.splice::<ValueTree>(root, depth.min(usize::from(crate::machine::MAX_DEPTH)), end)
    }

    /// The object behind a handle, or `v` itself.
    fn target<'v>(&'v mut self, v: &'v mut Value) -> &'v mut Value {
        match v {
            Value::Ref(h) => {
                let h = *h;
                match self.shelf.get_mut(h) {
                    Some(t) => t,
                    None => v,
                }
            }
            _ => v,
        }
    }
}

/// [`Tree`] for [`Value`]: how [`Shelf::splice`] walks and makes values.
#[derive(Debug)]
pub(crate) struct ValueTree;

impl Tree<Value> for ValueTree {
    type Shape = crate::tree::Shape;

    fn handle(v: &Value) -> Option<u32> {
        match v {
            Value::Ref(h) => Some(*h),
            _ => None,
        }
    }

    fn children<'v>(v: &'v Value, out: &mut Vec<&'v Value>) {
        if let Some((_, children)) = crate::tree::split_ref(v) {
            out.extend(children);
        }
    }

    fn split(v: Value) -> Result<(Self::Shape, Vec<Value>), Value> {
        crate::tree::decompose(v)
    }

    fn join(shape: Self::Shape, children: Vec<Value>) -> Value {
        crate::tree::reassemble(shape, children)
    }

    fn is_mutable(v: &Value) -> bool {
        matches!(v, Value::List(_) | Value::Dict(_) | Value::Set(_) | Value::Object(_) | Value::ByteArray(_))
    }

    fn shared(id: u32, v: Value) -> Value {
        Value::Shared { id, value: Box::new(v) }
    }

    fn reference(id: u32) -> Value {
        Value::Ref(id)
    }

    fn copy(v: &Value) -> Value {
        v.clone()
    }

    fn placeholder() -> Value {
        Value::None
    }
}

impl ValueBuilder {
    /// Moves the mutable objects inside the immutable `v` (through tuples, frozensets and persistent ids) to
    /// the shelf, each replaced by its handle.
    fn shelve_inside(&mut self, v: &mut Value) -> Result<(), Error> {
        let mut stack: Vec<&mut Value> = Vec::new();
        match v {
            Value::Tuple(items) | Value::FrozenSet(items) => stack.extend(items.iter_mut()),
            Value::PersistentId(inner) => stack.push(inner),
            _ => {}
        }
        while let Some(c) = stack.pop() {
            match c {
                Value::Tuple(items) | Value::FrozenSet(items) => stack.extend(items.iter_mut()),
                Value::PersistentId(inner) => stack.push(inner),
                c if ValueTree::is_mutable(c) => {
                    let h = self.shelf.put(std::mem::take(c))?;
                    *c = Value::Ref(h);
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Whether `v` is immutable and holds no object the pickle may share: a scalar, string, bytes, big int or
/// global, or a tuple of such (looked into `depth` levels).
fn is_plain(v: &Value, depth: usize) -> bool {
    match v {
        Value::None
        | Value::Bool(_)
        | Value::Int(_)
        | Value::Float(_)
        | Value::BigInt(_)
        | Value::Str(_)
        | Value::Bytes(_)
        | Value::Global { .. } => true,
        Value::Tuple(items) => depth > 0 && items.len() <= 16 && items.iter().all(|i| is_plain(i, depth - 1)),
        _ => false,
    }
}

/// BUILD's effect on an object's state: a second dict state updates the first (`__dict__.update`), anything
/// else replaces it.
pub(crate) fn apply_state(slot: &mut Option<Value>, state: Value) {
    match (slot.as_mut(), state) {
        (Some(Value::Dict(acc)), Value::Dict(more)) => acc.extend(more),
        (_, state) => *slot = Some(state),
    }
}

impl<'a> Builder<'a> for ValueBuilder {
    type Value = Value;
    type Error = Error;

    fn none(&mut self) -> Value {
        Value::None
    }

    fn bool(&mut self, v: bool) -> Value {
        Value::Bool(v)
    }

    fn int(&mut self, v: i64) -> Value {
        Value::Int(v)
    }

    fn float(&mut self, v: f64) -> Value {
        Value::Float(v)
    }

    fn big_int(&mut self, le_twos: Vec<u8>) -> Result<Value, Error> {
        Ok(Value::BigInt(le_twos))
    }

    fn str(&mut self, s: Cow<'a, str>) -> Result<Value, Error> {
        Ok(Value::Str(s.into_owned()))
    }

    fn bytes(&mut self, b: Cow<'a, [u8]>, bytearray: bool) -> Result<Value, Error> {
        Ok(if bytearray { Value::ByteArray(b.into_owned()) } else { Value::Bytes(b.into_owned()) })
    }

    fn global(&mut self, module: &'a str, name: &'a str) -> Result<Value, Error> {
        Ok(Value::Global { module: module.to_owned(), name: name.to_owned() })
    }

    fn stack_global(&mut self, module: Value, name: Value) -> Result<Value, Error> {
        let text = |b: &mut Self, v: Value| match v {
            Value::Str(s) => s,
            Value::Ref(h) => b.shelf.get(h).and_then(Value::as_str).map(str::to_owned).unwrap_or_default(),
            _ => String::new(),
        };
        let module = text(self, module);
        let name = text(self, name);
        Ok(Value::Global { module, name })
    }

    fn sequence(&mut self, kind: Sequence, items: Items<'_, Value>) -> Result<Value, Error> {
        let items = items.collect();
        Ok(match kind {
            Sequence::List => Value::List(items),
            Sequence::Tuple => Value::Tuple(items),
            Sequence::Set => Value::Set(items),
            Sequence::FrozenSet => Value::FrozenSet(items),
        })
    }

    fn dict(&mut self, pairs: Pairs<'_, Value>) -> Result<Value, Error> {
        Ok(Value::Dict(pairs.collect()))
    }

    fn persistent_id(&mut self, pid: Value) -> Result<Value, Error> {
        Ok(Value::PersistentId(Box::new(pid)))
    }

    fn object(&mut self, call: Call<Value>) -> Result<Value, Error> {
        let kind = match call.kind {
            CallKind::Reduce => ObjectKind::Reduce,
            CallKind::NewObj => ObjectKind::NewObj,
            CallKind::NewObjEx { kwargs } => ObjectKind::NewObjEx { kwargs },
            CallKind::Inst => ObjectKind::Inst,
            CallKind::Obj => ObjectKind::Obj,
        };
        Ok(Value::Object(Box::new(Object::new(kind, call.callable, call.args))))
    }

    fn append(&mut self, target: &mut Value, items: Items<'_, Value>) -> Result<(), Error> {
        match self.target(target) {
            Value::List(v) => v.extend(items),
            Value::Object(o) => o.list_items.extend(items),
            _ => {}
        }
        Ok(())
    }

    fn set_items(&mut self, target: &mut Value, pairs: Pairs<'_, Value>) -> Result<(), Error> {
        match self.target(target) {
            Value::Dict(v) => v.extend(pairs),
            Value::Object(o) => o.dict_items.extend(pairs),
            _ => {}
        }
        Ok(())
    }

    fn add_items(&mut self, target: &mut Value, items: Items<'_, Value>) -> Result<(), Error> {
        if let Value::Set(v) = self.target(target) {
            v.extend(items);
        }
        Ok(())
    }

    fn build(&mut self, target: &mut Value, state: Value) -> Result<(), Error> {
        if let Value::Object(o) = self.target(target) {
            apply_state(&mut o.state, state);
        }
        Ok(())
    }

    fn share(&mut self, v: &mut Value) -> Result<Value, Error> {
        Ok(match v {
            Value::None => Value::None,
            Value::Bool(b) => Value::Bool(*b),
            Value::Int(i) => Value::Int(*i),
            Value::Float(f) => Value::Float(*f),
            Value::Ref(h) => Value::Ref(*h),
            // What nothing can change and nothing inside refers to is a copy wherever it goes (the shelf
            // would copy it there too).
            v if is_plain(v, 2) => v.clone(),
            _ => {
                // An immutable value is copied to each place it is fetched to: the objects it holds go to the
                // shelf first, so that the copies hold the one object each (Python's identity).
                if !ValueTree::is_mutable(v) {
                    self.shelve_inside(v)?;
                }
                let h = self.shelf.put(std::mem::take(v))?;
                *v = Value::Ref(h);
                Value::Ref(h)
            }
        })
    }
}
