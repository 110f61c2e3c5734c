//! [`GraphBuilder`]: the pickle as an arena [`Graph`], one [`Node`] per object the pickle makes, every
//! reference an index. Nothing is ever copied or moved: what the pickle shares, mutates after sharing or
//! makes refer to itself is simply a node several items point to. It is the simplest correct builder, which
//! the others are checked against ([`Graph::to_value`] gives what [`ValueBuilder`](crate::ValueBuilder)
//! gives).

use std::borrow::Cow;

use crate::builder::{Builder, Call, CallKind, Items, Pairs, Sequence};
use crate::builders::value::ValueTree;
use crate::error::Error;
use crate::shelf::Shelf;
use crate::value::{Object, ObjectKind, Value};

/// A value in the graph: a scalar, or a node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Item {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An int that fits `i64`.
    Int(i64),
    /// A float.
    Float(f64),
    /// Node `n` of [`Graph::nodes`].
    Node(u32),
}

/// An object of the pickle.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// An int beyond `i64` (little-endian two's complement).
    BigInt(Vec<u8>),
    /// A str.
    Str(String),
    /// A bytes (or Python 2 str read as bytes).
    Bytes(Vec<u8>),
    /// A bytearray.
    ByteArray(Vec<u8>),
    /// A global.
    Global {
        /// Module, as written.
        module: String,
        /// Name, as written.
        name: String,
    },
    /// A list.
    List(Vec<Item>),
    /// A tuple.
    Tuple(Vec<Item>),
    /// A dict (pairs in order).
    Dict(Vec<(Item, Item)>),
    /// A set.
    Set(Vec<Item>),
    /// A frozenset.
    FrozenSet(Vec<Item>),
    /// A persistent id.
    PersistentId(Item),
    /// A call's result and what the pickle did to it.
    Object {
        /// REDUCE, NEWOBJ, ... (`NewObjEx`'s kwargs are in `kwargs`).
        kind: ObjectKind,
        /// NEWOBJ_EX's keyword arguments.
        kwargs: Option<Item>,
        /// What was called.
        callable: Item,
        /// Its arguments.
        args: Item,
        /// The BUILD state.
        state: Option<Item>,
        /// APPENDed items.
        list_items: Vec<Item>,
        /// SETITEMed pairs.
        dict_items: Vec<(Item, Item)>,
    },
}

/// A decoded pickle as an object graph.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    /// Every object the pickle made, in the order it made them.
    pub nodes: Vec<Node>,
    /// Whether each node was referred to from more than one place (memoized and read back, or DUP'd).
    pub shared: Vec<bool>,
}

impl Graph {
    /// The [`Value`] of `root` (see the [`Value`] docs on sharing), nested at most `max_depth` deep.
    ///
    /// # Errors
    /// [`Error::DepthExceeded`].
    pub fn to_value(&self, root: Item, max_depth: usize) -> Result<Value, Error> {
        let mut shelf: Shelf<Value> = Shelf::default();
        for node in &self.nodes {
            shelf.put(node_value(node))?;
        }
        shelf.splice::<ValueTree>(item_value(root), max_depth, 0)
    }
}

fn item_value(i: Item) -> Value {
    match i {
        Item::None => Value::None,
        Item::Bool(b) => Value::Bool(b),
        Item::Int(v) => Value::Int(v),
        Item::Float(f) => Value::Float(f),
        Item::Node(n) => Value::Ref(n),
    }
}

/// A node as a value whose children are handles.
fn node_value(node: &Node) -> Value {
    let items = |v: &[Item]| v.iter().copied().map(item_value).collect::<Vec<_>>();
    let pairs = |v: &[(Item, Item)]| v.iter().map(|&(k, x)| (item_value(k), item_value(x))).collect::<Vec<_>>();
    match node {
        Node::BigInt(b) => Value::BigInt(b.clone()),
        Node::Str(s) => Value::Str(s.clone()),
        Node::Bytes(b) => Value::Bytes(b.clone()),
        Node::ByteArray(b) => Value::ByteArray(b.clone()),
        Node::Global { module, name } => Value::Global { module: module.clone(), name: name.clone() },
        Node::List(v) => Value::List(items(v)),
        Node::Tuple(v) => Value::Tuple(items(v)),
        Node::Dict(v) => Value::Dict(pairs(v)),
        Node::Set(v) => Value::Set(items(v)),
        Node::FrozenSet(v) => Value::FrozenSet(items(v)),
        Node::PersistentId(i) => Value::PersistentId(Box::new(item_value(*i))),
        Node::Object { kind, kwargs, callable, args, state, list_items, dict_items } => {
            let kind = match (kind, kwargs) {
                (ObjectKind::NewObjEx { .. }, Some(k)) => ObjectKind::NewObjEx { kwargs: item_value(*k) },
                (k, _) => k.clone(),
            };
            Value::Object(Box::new(Object {
                callable: item_value(*callable),
                args: item_value(*args),
                kind,
                state: state.map(item_value),
                list_items: items(list_items),
                dict_items: pairs(dict_items),
            }))
        }
    }
}

/// Builds a [`Graph`].
///
/// ```
/// use ckpt_pickle::{GraphBuilder, Options, Value};
/// // l = []; l.append(l)
/// let mut b = GraphBuilder::default();
/// let (root, _) = ckpt_pickle::run(b"]q\x00h\x00a.", &Options::default(), &mut b)?;
/// assert_eq!(b.graph().to_value(root, 100)?, Value::Shared { id: 0, value: Box::new(Value::List(vec![Value::Ref(0)])) });
/// # Ok::<(), ckpt_pickle::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct GraphBuilder {
    graph: Graph,
}

impl GraphBuilder {
    /// The graph built so far.
    #[must_use]
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The graph.
    #[must_use]
    pub fn into_graph(self) -> Graph {
        self.graph
    }

    fn node(&mut self, n: Node) -> Result<Item, Error> {
        let id = u32::try_from(self.graph.nodes.len()).map_err(|_| Error::Limit {
            what: "nodes",
            limit: u64::from(u32::MAX),
            offset: 0,
        })?;
        self.graph.nodes.push(n);
        self.graph.shared.push(false);
        Ok(Item::Node(id))
    }

    fn node_mut(&mut self, i: Item) -> Option<&mut Node> {
        match i {
            Item::Node(n) => self.graph.nodes.get_mut(n as usize),
            _ => None,
        }
    }

    fn is_shared(&self, i: Item) -> bool {
        match i {
            Item::Node(n) => self.graph.shared.get(n as usize).copied().unwrap_or(false),
            _ => false,
        }
    }

    fn text(&self, i: Item) -> String {
        match i {
            Item::Node(n) => match self.graph.nodes.get(n as usize) {
                Some(Node::Str(s)) => s.clone(),
                _ => String::new(),
            },
            _ => String::new(),
        }
    }
}

impl<'a> Builder<'a> for GraphBuilder {
    type Value = Item;
    type Error = Error;

    fn none(&mut self) -> Item {
        Item::None
    }

    fn bool(&mut self, v: bool) -> Item {
        Item::Bool(v)
    }

    fn int(&mut self, v: i64) -> Item {
        Item::Int(v)
    }

    fn float(&mut self, v: f64) -> Item {
        Item::Float(v)
    }

    fn big_int(&mut self, le_twos: Vec<u8>) -> Result<Item, Error> {
        self.node(Node::BigInt(le_twos))
    }

    fn str(&mut self, s: Cow<'a, str>) -> Result<Item, Error> {
        self.node(Node::Str(s.into_owned()))
    }

    fn bytes(&mut self, b: Cow<'a, [u8]>, bytearray: bool) -> Result<Item, Error> {
        let b = b.into_owned();
        self.node(if bytearray { Node::ByteArray(b) } else { Node::Bytes(b) })
    }

    fn global(&mut self, module: &'a str, name: &'a str) -> Result<Item, Error> {
        self.node(Node::Global { module: module.to_owned(), name: name.to_owned() })
    }

    fn stack_global(&mut self, module: Item, name: Item) -> Result<Item, Error> {
        let (module, name) = (self.text(module), self.text(name));
        self.node(Node::Global { module, name })
    }

    fn sequence(&mut self, kind: Sequence, items: Items<'_, Item>) -> Result<Item, Error> {
        let items = items.collect();
        self.node(match kind {
            Sequence::List => Node::List(items),
            Sequence::Tuple => Node::Tuple(items),
            Sequence::Set => Node::Set(items),
            Sequence::FrozenSet => Node::FrozenSet(items),
        })
    }

    fn dict(&mut self, pairs: Pairs<'_, Item>) -> Result<Item, Error> {
        self.node(Node::Dict(pairs.collect()))
    }

    fn persistent_id(&mut self, pid: Item) -> Result<Item, Error> {
        self.node(Node::PersistentId(pid))
    }

    fn object(&mut self, call: Call<Item>) -> Result<Item, Error> {
        let (kind, kwargs) = match call.kind {
            CallKind::Reduce => (ObjectKind::Reduce, None),
            CallKind::NewObj => (ObjectKind::NewObj, None),
            CallKind::NewObjEx { kwargs } => (ObjectKind::NewObjEx { kwargs: Value::None }, Some(kwargs)),
            CallKind::Inst => (ObjectKind::Inst, None),
            CallKind::Obj => (ObjectKind::Obj, None),
        };
        self.node(Node::Object {
            kind,
            kwargs,
            callable: call.callable,
            args: call.args,
            state: None,
            list_items: Vec::new(),
            dict_items: Vec::new(),
        })
    }

    fn append(&mut self, target: &mut Item, items: Items<'_, Item>) -> Result<(), Error> {
        if let Some(Node::List(v) | Node::Object { list_items: v, .. }) = self.node_mut(*target) {
            v.extend(items);
        }
        Ok(())
    }

    fn set_items(&mut self, target: &mut Item, pairs: Pairs<'_, Item>) -> Result<(), Error> {
        if let Some(Node::Dict(v) | Node::Object { dict_items: v, .. }) = self.node_mut(*target) {
            v.extend(pairs);
        }
        Ok(())
    }

    fn add_items(&mut self, target: &mut Item, items: Items<'_, Item>) -> Result<(), Error> {
        if let Some(Node::Set(v)) = self.node_mut(*target) {
            v.extend(items);
        }
        Ok(())
    }

    fn build(&mut self, target: &mut Item, state: Item) -> Result<(), Error> {
        // As `apply_state` on trees: a dict state made for this object takes a later dict state's pairs.
        let current = match self.node_mut(*target) {
            Some(Node::Object { state: s, .. }) => *s,
            _ => return Ok(()),
        };
        let mergeable = |b: &Self, i: Option<Item>| {
            i.is_some_and(|i| !b.is_shared(i) && matches!(b.graph.nodes.get(node_index(i)), Some(Node::Dict(_))))
        };
        if mergeable(self, current) && mergeable(self, Some(state)) {
            let more = match self.node_mut(state) {
                Some(Node::Dict(p)) => std::mem::take(p),
                _ => Vec::new(),
            };
            if let Some(Node::Dict(acc)) = current.and_then(|c| self.node_mut(c)) {
                acc.extend(more);
            }
            return Ok(());
        }
        if let Some(Node::Object { state: s, .. }) = self.node_mut(*target) {
            *s = Some(state);
        }
        Ok(())
    }

    fn share(&mut self, v: &mut Item) -> Result<Item, Error> {
        if let Item::Node(n) = *v {
            if let Some(s) = self.graph.shared.get_mut(n as usize) {
                *s = true;
            }
        }
        Ok(*v)
    }
}

fn node_index(i: Item) -> usize {
    match i {
        Item::Node(n) => n as usize,
        _ => usize::MAX,
    }
}
