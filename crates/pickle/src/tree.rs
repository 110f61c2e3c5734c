//! Non-recursive tree plumbing: a container [`Value`] splits into a [`Shape`] and its children, and is rebuilt
//! from them. Used by the materialiser (children come from the VM arena), [`Value::desugar`] and the encoder, so
//! that no traversal recurses on data-controlled depth.

use crate::value::{Object, ObjectKind, Value};

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
