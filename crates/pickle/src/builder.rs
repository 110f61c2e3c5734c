//! What the machine hands its objects to: the [`Builder`] trait, and the shapes of what it hands over.

use std::borrow::Cow;

/// What a MARK-delimited or fixed-size sequence opcode builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sequence {
    /// LIST, EMPTY_LIST.
    List,
    /// TUPLE, TUPLE1-3, EMPTY_TUPLE; also the arguments of INST and OBJ.
    Tuple,
    /// EMPTY_SET.
    Set,
    /// FROZENSET.
    FrozenSet,
}

/// A call the pickle records (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ): never made, handed to
/// [`Builder::object`].
#[derive(Debug)]
pub struct Call<V> {
    /// Which opcode, with NEWOBJ_EX's keyword arguments.
    pub kind: CallKind<V>,
    /// What is called (usually a global).
    pub callable: V,
    /// The positional arguments (a tuple for every opcode but REDUCE, which takes whatever is on the stack).
    pub args: V,
}

/// The opcode of a [`Call`].
#[derive(Debug)]
pub enum CallKind<V> {
    /// REDUCE: `callable(*args)`.
    Reduce,
    /// NEWOBJ: `cls.__new__(cls, *args)`.
    NewObj,
    /// NEWOBJ_EX: `cls.__new__(cls, *args, **kwargs)`.
    NewObjEx {
        /// The keyword arguments.
        kwargs: V,
    },
    /// INST (protocol 0): the class named by the opcode, the items after the MARK as a tuple.
    Inst,
    /// OBJ (protocol 1): the first item after the MARK, the rest as a tuple.
    Obj,
}

/// The items of a container opcode, taken off the machine's stack in order.
pub type Items<'s, V> = std::vec::Drain<'s, V>;

/// The key/value pairs of DICT, SETITEM and SETITEMS, taken off the machine's stack in order.
#[derive(Debug)]
pub struct Pairs<'s, V>(pub(crate) std::vec::Drain<'s, V>);

impl<V> Iterator for Pairs<'_, V> {
    type Item = (V, V);

    fn next(&mut self) -> Option<(V, V)> {
        let k = self.0.next()?;
        let v = self.0.next()?;
        Some((k, v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.len() / 2;
        (n, Some(n))
    }
}

impl<V> ExactSizeIterator for Pairs<'_, V> {}

/// What a [`Builder`] makes of the pickle's objects, as the machine ([`crate::run`]) interprets the opcodes.
///
/// The machine owns the pickle's semantics: the stack, the marks, the memo with Python's reference semantics,
/// every [`Limits`](crate::Limits) value and every error about the pickle itself (an operand of the wrong kind
/// included: a builder is never asked to APPEND to a tuple). A builder decides only what each object becomes:
/// a [`Value`](crate::Value), a node of a [`Graph`](crate::Graph), a tensor, a format's own struct.
///
/// # Sharing
/// An object that the pickle refers to more than once (memoized and read back by a GET, or DUP'd) is
/// *shared*. Each further reference is made by [`Builder::share`], and mutations (APPEND, SETITEMS, ADDITEMS,
/// BUILD) through any reference change the one object, as in Python. A builder keeps that true by giving out
/// handles to one object (the [`Shelf`](crate::Shelf) holds such objects for a builder of trees) rather than
/// copies of anything that can still change. `share` must be cheap (a handle, or a copy of a leaf): the
/// machine counts each reference at the full size of what it refers to against the limits, but does not
/// bound how often a GET is repeated.
///
/// # Fast paths
/// A builder may declare [`Template`](crate::Template)s: shapes of objects it expects many times (a torch
/// tensor record, a dataclass of a few fields). The machine reads an object of that shape straight from the
/// bytes and hands [`Builder::template`] what it captured, instead of making each inner value.
///
/// Text and bytes borrow from the input where the pickle stores them verbatim (`Cow::Borrowed`), so a builder
/// can keep them without copying.
pub trait Builder<'a> {
    /// What the builder makes of each object.
    type Value;
    /// The builder's error; every error of the machine converts into it.
    type Error: From<crate::Error>;

    /// `None`.
    fn none(&mut self) -> Self::Value;
    /// `True` / `False`.
    fn bool(&mut self, v: bool) -> Self::Value;
    /// An integer that fits `i64`.
    fn int(&mut self, v: i64) -> Self::Value;
    /// A float.
    fn float(&mut self, v: f64) -> Self::Value;
    /// An integer that does not fit `i64` (little-endian two's complement, minimal length).
    ///
    /// # Errors
    /// The builder's refusal.
    fn big_int(&mut self, le_twos: Vec<u8>) -> Result<Self::Value, Self::Error>;
    /// A `str` (also a Python 2 `str`, decoded as [`Py2Strings`](crate::Py2Strings) says).
    ///
    /// # Errors
    /// The builder's refusal.
    fn str(&mut self, s: Cow<'a, str>) -> Result<Self::Value, Self::Error>;
    /// A `bytes` (or Python 2 `str` read as bytes), or with `bytearray` a `bytearray`.
    ///
    /// # Errors
    /// The builder's refusal.
    fn bytes(&mut self, b: Cow<'a, [u8]>, bytearray: bool) -> Result<Self::Value, Self::Error>;
    /// A global named by GLOBAL or INST (`module`, `name` exactly as written).
    ///
    /// # Errors
    /// The builder's refusal.
    fn global(&mut self, module: &'a str, name: &'a str) -> Result<Self::Value, Self::Error>;
    /// STACK_GLOBAL on two values (the machine has checked that both are `str`s).
    ///
    /// # Errors
    /// The builder's refusal.
    fn stack_global(&mut self, module: Self::Value, name: Self::Value) -> Result<Self::Value, Self::Error>;
    /// A list, tuple, set or frozenset with these items.
    ///
    /// # Errors
    /// The builder's refusal.
    fn sequence(&mut self, kind: Sequence, items: Items<'_, Self::Value>) -> Result<Self::Value, Self::Error>;
    /// A dict with these pairs.
    ///
    /// # Errors
    /// The builder's refusal.
    fn dict(&mut self, pairs: Pairs<'_, Self::Value>) -> Result<Self::Value, Self::Error>;
    /// A persistent id (BINPERSID's argument, or PERSID's text as a `str`).
    ///
    /// # Errors
    /// The builder's refusal (an id it cannot resolve).
    fn persistent_id(&mut self, pid: Self::Value) -> Result<Self::Value, Self::Error>;
    /// The result of a call.
    ///
    /// # Errors
    /// The builder's refusal.
    fn object(&mut self, call: Call<Self::Value>) -> Result<Self::Value, Self::Error>;
    /// APPEND / APPENDS on `target`, a list or an object (the machine has checked).
    ///
    /// # Errors
    /// The builder's refusal.
    fn append(&mut self, target: &mut Self::Value, items: Items<'_, Self::Value>) -> Result<(), Self::Error>;
    /// SETITEM / SETITEMS on `target`, a dict or an object (the machine has checked).
    ///
    /// # Errors
    /// The builder's refusal.
    fn set_items(&mut self, target: &mut Self::Value, pairs: Pairs<'_, Self::Value>) -> Result<(), Self::Error>;
    /// ADDITEMS on `target`, a set (the machine has checked).
    ///
    /// # Errors
    /// The builder's refusal.
    fn add_items(&mut self, target: &mut Self::Value, items: Items<'_, Self::Value>) -> Result<(), Self::Error>;
    /// BUILD on `target`, an object (the machine has checked), with `state`.
    ///
    /// # Errors
    /// The builder's refusal.
    fn build(&mut self, target: &mut Self::Value, state: Self::Value) -> Result<(), Self::Error>;
    /// One more reference to the shared object `v` (see [Sharing](Builder#sharing)). A builder may replace
    /// `v` itself (with a handle to where it moved the object) and return another handle to it.
    ///
    /// # Errors
    /// The builder's refusal.
    fn share(&mut self, v: &mut Self::Value) -> Result<Self::Value, Self::Error>;

    /// The fast paths this builder declares (see [`Template`](crate::Template)); none by default.
    fn templates(&self) -> &'static [crate::template::Template] {
        &[]
    }

    /// The object of template `template` (an index into [`Builder::templates`]) read straight from the
    /// bytes, from what it captured, in the order the template captures. Called only for builders that
    /// declare templates.
    ///
    /// # Errors
    /// The builder's refusal.
    fn template(
        &mut self,
        template: usize,
        captures: &mut crate::Captures<'a, '_, Self::Value>,
    ) -> Result<Self::Value, Self::Error> {
        let _ = (template, captures);
        Err(crate::Error::Unsupported { offset: 0, what: "a template this builder does not declare" }.into())
    }
}
