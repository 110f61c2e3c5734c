//! Non-recursive tree plumbing: a container [`Value`] splits into a [`Shape`] and its children, and is rebuilt
//! from them. Used by the materialiser (children come from the VM arena), [`Value::desugar`] and the encoder, so
//! that no traversal recurses on data-controlled depth.

use crate::value::{Object, ObjectKind, Value, normalize_global};

/// What a container is, minus its children.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    List,
    Tuple,
    Set,
    FrozenSet,
    /// Children: `k0, v0, k1, v1, ...`.
    Dict,
    /// One child.
    PersistentId,
    /// One child: the object shared under this id.
    Shared(u32),
    /// Children: callable, args, kwargs (NEWOBJ_EX only), `n_states` BUILD states, `n_list` appended items,
    /// `n_dict` set pairs (flattened).
    Object {
        kind: KindShape,
        n_states: usize,
        n_list: usize,
        n_dict: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KindShape {
    Reduce,
    NewObj,
    NewObjEx,
    Inst,
    Obj,
}

/// Splits a container into shape and children; a leaf is returned unchanged as `Err`.
pub(crate) fn decompose(v: Value) -> Result<(Shape, Vec<Value>), Value> {
    match v {
        Value::List(items) => Ok((Shape::List, items)),
        Value::Tuple(items) => Ok((Shape::Tuple, items)),
        Value::Set(items) => Ok((Shape::Set, items)),
        Value::FrozenSet(items) => Ok((Shape::FrozenSet, items)),
        Value::Dict(pairs) => Ok((Shape::Dict, flatten_pairs(pairs))),
        Value::PersistentId(inner) => Ok((Shape::PersistentId, vec![*inner])),
        Value::Shared { id, value } => Ok((Shape::Shared(id), vec![*value])),
        Value::Object(o) => {
            let Object { callable, args, kind, state, list_items, dict_items } = *o;
            let n_list = list_items.len();
            let n_dict = dict_items.len();
            let mut children = Vec::with_capacity(4 + n_list + 2 * n_dict);
            children.push(callable);
            children.push(args);
            let kind = match kind {
                ObjectKind::Reduce => KindShape::Reduce,
                ObjectKind::NewObj => KindShape::NewObj,
                ObjectKind::NewObjEx { kwargs } => {
                    children.push(kwargs);
                    KindShape::NewObjEx
                }
                ObjectKind::Inst => KindShape::Inst,
                ObjectKind::Obj => KindShape::Obj,
            };
            let n_states = usize::from(state.is_some());
            children.extend(state);
            children.extend(list_items);
            children.extend(flatten_pairs(dict_items));
            Ok((Shape::Object { kind, n_states, n_list, n_dict }, children))
        }
        leaf => Err(leaf),
    }
}

fn flatten_pairs(pairs: Vec<(Value, Value)>) -> Vec<Value> {
    let mut out = Vec::with_capacity(pairs.len() * 2);
    for (k, v) in pairs {
        out.push(k);
        out.push(v);
    }
    out
}

fn pairs_from(it: &mut impl Iterator<Item = Value>, n: usize) -> Vec<(Value, Value)> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let k = it.next().unwrap_or_default();
        let v = it.next().unwrap_or_default();
        out.push((k, v));
    }
    out
}

/// Rebuilds a container from its shape and (already built) children. Several BUILD states are merged: two
/// dicts concatenate (`__dict__.update`), otherwise the later state wins.
pub(crate) fn reassemble(shape: Shape, children: Vec<Value>) -> Value {
    match shape {
        Shape::List => Value::List(children),
        Shape::Tuple => Value::Tuple(children),
        Shape::Set => Value::Set(children),
        Shape::FrozenSet => Value::FrozenSet(children),
        Shape::Dict => {
            let n = children.len() / 2;
            Value::Dict(pairs_from(&mut children.into_iter(), n))
        }
        Shape::PersistentId => Value::PersistentId(Box::new(children.into_iter().next().unwrap_or_default())),
        Shape::Shared(id) => Value::Shared { id, value: Box::new(children.into_iter().next().unwrap_or_default()) },
        Shape::Object { kind, n_states, n_list, n_dict } => {
            let mut it = children.into_iter();
            let callable = it.next().unwrap_or_default();
            let args = it.next().unwrap_or_default();
            let kind = match kind {
                KindShape::Reduce => ObjectKind::Reduce,
                KindShape::NewObj => ObjectKind::NewObj,
                KindShape::NewObjEx => ObjectKind::NewObjEx { kwargs: it.next().unwrap_or_default() },
                KindShape::Inst => ObjectKind::Inst,
                KindShape::Obj => ObjectKind::Obj,
            };
            let mut state: Option<Value> = None;
            for _ in 0..n_states {
                let s = it.next().unwrap_or_default();
                state = Some(match (state, s) {
                    (Some(Value::Dict(mut acc)), Value::Dict(more)) => {
                        acc.extend(more);
                        Value::Dict(acc)
                    }
                    (_, s) => s,
                });
            }
            let list_items: Vec<Value> = it.by_ref().take(n_list).collect();
            let dict_items = pairs_from(&mut it, n_dict);
            Value::Object(Box::new(Object { callable, args, kind, state, list_items, dict_items }))
        }
    }
}

/// Rebuilds a tree bottom-up without recursion: `split` turns a node into its shape and children, or into
/// the finished value of a leaf; `f` is applied to every value once its children are done.
fn post_order<T>(
    root: T,
    mut split: impl FnMut(T) -> Result<(Shape, Vec<T>), Value>,
    mut f: impl FnMut(Value) -> Value,
) -> Value {
    struct Frame<T> {
        shape: Shape,
        children: std::vec::IntoIter<T>,
        out: Vec<Value>,
    }
    let mut stack: Vec<Frame<T>> = Vec::new();
    let mut next = Some(root);
    loop {
        // Descend into `next`, or produce it if it is a leaf.
        let mut done = match next.take() {
            Some(v) => match split(v) {
                Ok((shape, children)) => {
                    let n = children.len();
                    stack.push(Frame { shape, children: children.into_iter(), out: Vec::with_capacity(n) });
                    None
                }
                Err(leaf) => Some(f(leaf)),
            },
            None => None,
        };
        // Hand finished values to their parents until a parent has another child to visit.
        loop {
            let Some(top) = stack.last_mut() else {
                return done.unwrap_or_default();
            };
            if let Some(d) = done.take() {
                top.out.push(d);
            }
            if let Some(child) = top.children.next() {
                next = Some(child);
                break;
            }
            let Some(frame) = stack.pop() else {
                return Value::None;
            };
            done = Some(f(reassemble(frame.shape, frame.out)));
        }
    }
}

/// Rebuilds `v` bottom-up without recursion, applying `f` to every value after its children were processed.
pub(crate) fn map_post_order(v: Value, f: impl FnMut(Value) -> Value) -> Value {
    post_order(v, decompose, f)
}

/// Splits a container into shape and borrowed children (in [`decompose`] order); `None` for a leaf.
pub(crate) fn split_ref(v: &Value) -> Option<(Shape, Vec<&Value>)> {
    Some(match v {
        Value::List(items) => (Shape::List, items.iter().collect()),
        Value::Tuple(items) => (Shape::Tuple, items.iter().collect()),
        Value::Set(items) => (Shape::Set, items.iter().collect()),
        Value::FrozenSet(items) => (Shape::FrozenSet, items.iter().collect()),
        Value::Dict(p) => (Shape::Dict, pair_refs(p)),
        Value::PersistentId(inner) => (Shape::PersistentId, vec![&**inner]),
        Value::Shared { id, value } => (Shape::Shared(*id), vec![&**value]),
        Value::Object(o) => {
            let mut children = vec![&o.callable, &o.args];
            let kind = match &o.kind {
                ObjectKind::Reduce => KindShape::Reduce,
                ObjectKind::NewObj => KindShape::NewObj,
                ObjectKind::NewObjEx { kwargs } => {
                    children.push(kwargs);
                    KindShape::NewObjEx
                }
                ObjectKind::Inst => KindShape::Inst,
                ObjectKind::Obj => KindShape::Obj,
            };
            children.extend(o.state.iter());
            children.extend(o.list_items.iter());
            children.extend(pair_refs(&o.dict_items));
            let shape = Shape::Object {
                kind,
                n_states: usize::from(o.state.is_some()),
                n_list: o.list_items.len(),
                n_dict: o.dict_items.len(),
            };
            (shape, children)
        }
        _ => return None,
    })
}

fn pair_refs(p: &[(Value, Value)]) -> Vec<&Value> {
    p.iter().flat_map(|(k, x)| [k, x]).collect()
}

/// Copies a leaf (a value with no [`Value`] children).
fn clone_leaf(v: &Value) -> Value {
    match v {
        Value::None => Value::None,
        Value::Bool(b) => Value::Bool(*b),
        Value::Int(i) => Value::Int(*i),
        Value::BigInt(b) => Value::BigInt(b.clone()),
        Value::Float(f) => Value::Float(*f),
        Value::Str(s) => Value::Str(s.clone()),
        Value::Bytes(b) => Value::Bytes(b.clone()),
        Value::ByteArray(b) => Value::ByteArray(b.clone()),
        Value::Global { module, name } => Value::Global { module: module.clone(), name: name.clone() },
        Value::Ref(id) => Value::Ref(*id),
        // Containers are never passed here; an empty copy keeps this total.
        Value::List(_) => Value::List(Vec::new()),
        Value::Tuple(_) => Value::Tuple(Vec::new()),
        Value::Dict(_) => Value::Dict(Vec::new()),
        Value::Set(_) => Value::Set(Vec::new()),
        Value::FrozenSet(_) => Value::FrozenSet(Vec::new()),
        Value::Object(_) | Value::PersistentId(_) | Value::Shared { .. } => Value::None,
    }
}

// Clone and equality walk the tree with an explicit stack, so deep values cannot overflow the call stack.
impl Clone for Value {
    fn clone(&self) -> Self {
        deep_clone(self)
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        deep_eq(self, other)
    }
}

/// A deep copy without recursion.
pub(crate) fn deep_clone(v: &Value) -> Value {
    post_order(v, |v| split_ref(v).ok_or_else(|| clone_leaf(v)), |v| v)
}

/// Equality without recursion, with the semantics a derived `PartialEq` would have (`f64` compared with `==`).
pub(crate) fn deep_eq(a: &Value, b: &Value) -> bool {
    let mut stack: Vec<(&Value, &Value)> = vec![(a, b)];
    while let Some((x, y)) = stack.pop() {
        match (split_ref(x), split_ref(y)) {
            (Some((sx, cx)), Some((sy, cy))) => {
                if sx != sy || cx.len() != cy.len() {
                    return false;
                }
                stack.extend(cx.into_iter().zip(cy));
            }
            (None, None) => {
                let equal = match (x, y) {
                    (Value::None, Value::None) => true,
                    (Value::Bool(p), Value::Bool(q)) => p == q,
                    (Value::Int(p), Value::Int(q)) => p == q,
                    (Value::Float(p), Value::Float(q)) => p == q,
                    (Value::BigInt(p), Value::BigInt(q))
                    | (Value::Bytes(p), Value::Bytes(q))
                    | (Value::ByteArray(p), Value::ByteArray(q)) => p == q,
                    (Value::Str(p), Value::Str(q)) => p == q,
                    (Value::Ref(p), Value::Ref(q)) => p == q,
                    (Value::Global { module: pm, name: pn }, Value::Global { module: qm, name: qn }) => {
                        pm == qm && pn == qn
                    }
                    _ => false,
                };
                if !equal {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

// The walks of a whole value that its API offers.
impl Value {
    /// This value as a tree, every shared object copied into each place that refers to it (what a value was
    /// before identity was kept), or `None` when an object refers to itself (a cycle has no tree), or when
    /// the copies would take more than `max_nodes` values.
    ///
    /// ```
    /// use ckpt_pickle::Value;
    /// let inner = Value::List(vec![Value::Int(1)]);
    /// let v = Value::Tuple(vec![Value::Shared { id: 0, value: Box::new(inner.clone()) }, Value::Ref(0)]);
    /// assert_eq!(v.unshare(1000), Some(Value::Tuple(vec![inner.clone(), inner])));
    /// let cycle = Value::Shared { id: 0, value: Box::new(Value::List(vec![Value::Ref(0)])) };
    /// assert_eq!(cycle.unshare(1000), None);
    /// ```
    #[must_use]
    pub fn unshare(self, max_nodes: usize) -> Option<Value> {
        let mut defined: std::collections::HashMap<u32, Value> = std::collections::HashMap::new();
        let mut nodes = 0usize;
        let mut ok = true;
        let v = map_post_order(self, |v| {
            nodes = nodes.saturating_add(1);
            match v {
                Value::Shared { id, value } => {
                    defined.insert(id, (*value).clone());
                    *value
                }
                Value::Ref(id) => match defined.get(&id) {
                    Some(d) => {
                        nodes = nodes.saturating_add(d.node_count());
                        if nodes > max_nodes {
                            ok = false;
                            return Value::None;
                        }
                        d.clone()
                    }
                    None => {
                        ok = false;
                        Value::None
                    }
                },
                other => other,
            }
        });
        (ok && nodes <= max_nodes).then_some(v)
    }

    /// The number of values in this tree (each container and each leaf counts one).
    #[must_use]
    pub fn node_count(&self) -> usize {
        let mut n = 0usize;
        let mut stack = vec![self];
        while let Some(v) = stack.pop() {
            n += 1;
            if let Some((_, children)) = split_ref(v) {
                stack.extend(children);
            }
        }
        n
    }

    /// Rewrites the REDUCE forms CPython uses for builtin types that have no opcode in older protocols back into
    /// the direct variants, recursively (bottom-up):
    ///
    /// | REDUCE form (after [`normalize_global`]) | becomes |
    /// |---|---|
    /// | `_codecs.encode(s: str, 'latin1')` with every char of `s` below U+0100 | `Bytes` (protocols 0-2) |
    /// | `builtins.bytes()` | `Bytes([])` (protocols 0-2) |
    /// | `builtins.bytearray()` / `builtins.bytearray(b: bytes)` | `ByteArray` (protocols 0-4) |
    /// | `builtins.set([items])` / `builtins.frozenset([items])` | `Set` / `FrozenSet` (protocols 0-3) |
    ///
    /// Only plain REDUCE objects with no BUILD state and no appended/set items are rewritten. After this,
    /// `decode(&encode(v, p)?)?.desugar() == v` holds for every protocol (for canonical `v`).
    ///
    /// An object the pickle shared that becomes a string or bytes this way is no longer shared: it is a copy
    /// at each of its places, as the decoder makes every immutable value.
    ///
    /// Unsharing can make a form exact that was not (`bytearray(b)` where `b` was a shared object that became
    /// bytes), so the two steps repeat until nothing more is unshared; each round removes shared objects, so
    /// there are at most as many rounds as the pickle shared leaves, and one in the common case.
    #[must_use]
    pub fn desugar(self) -> Value {
        let mut v = self;
        loop {
            v = map_post_order(v, |v| match v {
                Value::Object(obj) => desugar_object(*obj),
                other => other,
            });
            match unshare_leaves(v) {
                (done, false) => return done,
                (more, true) => v = more,
            }
        }
    }
}

/// `v` with every [`Value::Shared`] whose object is a leaf that nothing can change (a string, bytes, a
/// number) replaced by the object, and every [`Value::Ref`] to it by a copy; and whether there was one.
fn unshare_leaves(v: Value) -> (Value, bool) {
    let is_leaf = |v: &Value| {
        matches!(
            v,
            Value::None
                | Value::Bool(_)
                | Value::Int(_)
                | Value::BigInt(_)
                | Value::Float(_)
                | Value::Str(_)
                | Value::Bytes(_)
        )
    };
    let mut leaves: std::collections::HashMap<u32, Value> = std::collections::HashMap::new();
    let mut stack = vec![&v];
    while let Some(x) = stack.pop() {
        if let Value::Shared { id, value } = x {
            if is_leaf(value) {
                leaves.insert(*id, (**value).clone());
            }
        }
        if let Some((_, children)) = split_ref(x) {
            stack.extend(children);
        }
    }
    if leaves.is_empty() {
        return (v, false);
    }
    // The shared objects that stay, numbered again from 0 in the order a depth-first walk meets them.
    let mut renumber: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    let mut stack = vec![&v];
    while let Some(x) = stack.pop() {
        if let Value::Shared { id, .. } = x {
            if !leaves.contains_key(id) {
                let next = u32::try_from(renumber.len()).unwrap_or(u32::MAX);
                renumber.entry(*id).or_insert(next);
            }
        }
        if let Some((_, children)) = split_ref(x) {
            stack.extend(children.into_iter().rev());
        }
    }
    let v = map_post_order(v, |x| match x {
        Value::Shared { id, value } if leaves.contains_key(&id) => *value,
        Value::Shared { id, value } => Value::Shared { id: renumber.get(&id).copied().unwrap_or(id), value },
        Value::Ref(id) => match leaves.get(&id) {
            Some(leaf) => leaf.clone(),
            None => Value::Ref(renumber.get(&id).copied().unwrap_or(id)),
        },
        other => other,
    });
    (v, true)
}

/// Rewrites one object whose children are already desugared.
fn desugar_object(obj: Object) -> Value {
    enum Rewrite {
        Bytes(Vec<u8>),
        ByteArrayEmpty,
        ByteArrayFrom,
        Set,
        FrozenSet,
    }
    let plain =
        obj.kind == ObjectKind::Reduce && obj.state.is_none() && obj.list_items.is_empty() && obj.dict_items.is_empty();
    let target = obj.callable.as_global().filter(|_| plain).map(|(m, n)| normalize_global(m, n));
    let rewrite = match (target, &obj.args) {
        (Some((m, n)), Value::Tuple(args)) => match (m.as_str(), n.as_str(), args.as_slice()) {
            ("_codecs", "encode", [Value::Str(s), Value::Str(enc)]) if enc == "latin1" => {
                s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect::<Option<Vec<u8>>>().map(Rewrite::Bytes)
            }
            ("builtins", "bytes", []) => Some(Rewrite::Bytes(Vec::new())),
            ("builtins", "bytearray", []) => Some(Rewrite::ByteArrayEmpty),
            ("builtins", "bytearray", [Value::Bytes(_)]) => Some(Rewrite::ByteArrayFrom),
            ("builtins", "set", [Value::List(_)]) => Some(Rewrite::Set),
            ("builtins", "frozenset", [Value::List(_)]) => Some(Rewrite::FrozenSet),
            _ => None,
        },
        _ => None,
    };
    let Some(rewrite) = rewrite else {
        return Value::Object(Box::new(obj));
    };
    let only_arg = || match obj.args {
        Value::Tuple(args) => args.into_iter().next().unwrap_or_default(),
        _ => Value::None,
    };
    match rewrite {
        Rewrite::Bytes(b) => Value::Bytes(b),
        Rewrite::ByteArrayEmpty => Value::ByteArray(Vec::new()),
        Rewrite::ByteArrayFrom => match only_arg() {
            Value::Bytes(b) => Value::ByteArray(b),
            _ => Value::None,
        },
        Rewrite::Set => match only_arg() {
            Value::List(items) => Value::Set(items),
            _ => Value::None,
        },
        Rewrite::FrozenSet => match only_arg() {
            Value::List(items) => Value::FrozenSet(items),
            _ => Value::None,
        },
    }
}
