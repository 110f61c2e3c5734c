//! The decoded pickle object model.

/// A decoded pickle value: a faithful, lossless, inert description of what the pickle builds. Nothing is ever
/// imported, called or resolved: classes and functions are [`Value::Global`] names, calls are [`Value::Object`]
/// records, persistent ids are [`Value::PersistentId`].
///
/// # Shared objects and cycles
/// An object the pickle refers to from more than one place keeps Python's identity where identity can be
/// seen: a list, dict, set or object (something a program can change in place) that is referred to from
/// several places is [`Value::Shared`] at the first place, in the order a depth-first walk of the value
/// meets them, and [`Value::Ref`] with the same id everywhere else; so is any object on a cycle that several
/// places refer to, of any kind (an omegaconf node: its parent holds it and its children's `_parent` links
/// point back). An object on a cycle that only one place holds stays in place (the cycle closes at another
/// of its objects). Immutable values (strings, numbers, tuples of them) that the pickle shares appear as
/// equal copies. Ids are numbered from 0 in that walk order, so equal object graphs compare equal.
///
/// `Clone` and `PartialEq` walk the tree with an explicit stack (no recursion). Equality is structural with
/// `f64` semantics (`NaN != NaN`, `0.0 == -0.0`).
#[derive(Debug, Default)]
pub enum Value {
    /// `None`.
    #[default]
    None,
    /// `True` / `False` (NEWTRUE/NEWFALSE, or protocol-0 `I01`/`I00`).
    Bool(bool),
    /// An integer that fits `i64`.
    Int(i64),
    /// An integer that does not fit `i64`: little-endian two's complement, minimal length (the LONG1/LONG4
    /// payload form, as CPython's `encode_long` writes it).
    BigInt(Vec<u8>),
    /// A float (BINFLOAT, or protocol-0 FLOAT text).
    Float(f64),
    /// A `str` (BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, protocol-0 UNICODE). Strings containing lone
    /// surrogates (which CPython writes with `surrogatepass`) are rejected with
    /// [`Error::InvalidUtf8`](crate::Error::InvalidUtf8).
    Str(String),
    /// A `bytes` (BINBYTES, SHORT_BINBYTES, BINBYTES8), and also a Python 2 `str` (STRING, BINSTRING,
    /// SHORT_BINSTRING), which is undecoded bytes; decoding it (ASCII, latin-1, UTF-8) is the consumer's choice,
    /// like `Unpickler(encoding=...)`.
    Bytes(Vec<u8>),
    /// A `bytearray` (BYTEARRAY8, protocol 5).
    ByteArray(Vec<u8>),
    /// A `list`.
    List(Vec<Value>),
    /// A `tuple`.
    Tuple(Vec<Value>),
    /// A `dict`: pairs in insertion order; duplicate keys are kept as written (a consumer wanting Python's
    /// semantics lets the last one win).
    Dict(Vec<(Value, Value)>),
    /// A `set` (EMPTY_SET + ADDITEMS), items in pickle order.
    Set(Vec<Value>),
    /// A `frozenset` (FROZENSET), items in pickle order.
    FrozenSet(Vec<Value>),
    /// A class or function reference (GLOBAL, STACK_GLOBAL, and the class of INST), names exactly as written
    /// (see [`normalize_global`] for Python 2 names).
    Global {
        /// The module, e.g. `"torch._utils"`.
        module: String,
        /// The (possibly dotted) qualified name, e.g. `"_rebuild_tensor_v2"`.
        name: String,
    },
    /// The result of REDUCE, NEWOBJ, NEWOBJ_EX, INST or OBJ: never called, kept symbolically together with the
    /// APPEND/SETITEM/BUILD operations applied to it.
    Object(Box<Object>),
    /// The argument of BINPERSID (any value) or PERSID (its text line, as [`Value::Str`]), unresolved.
    PersistentId(Box<Value>),
    /// An object that other places refer to by `id` ([`Value::Ref`]), at the first place it appears.
    Shared {
        /// The number the [`Value::Ref`]s to it carry.
        id: u32,
        /// The object.
        value: Box<Value>,
    },
    /// The object [`Value::Shared`] with this id (earlier in a depth-first walk, or an enclosing one).
    Ref(u32),
}

/// How an [`Object`] was created.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ObjectKind {
    /// REDUCE: `callable(*args)`.
    Reduce,
    /// NEWOBJ: `cls.__new__(cls, *args)`; `callable` is `cls`.
    NewObj,
    /// NEWOBJ_EX: `cls.__new__(cls, *args, **kwargs)`; `callable` is `cls`.
    NewObjEx {
        /// The keyword arguments (normally a [`Value::Dict`] with string keys).
        kwargs: Value,
    },
    /// INST (protocol 0): `callable` is the [`Value::Global`] named by the opcode, `args` the tuple of the items
    /// after the MARK.
    Inst,
    /// OBJ (protocol 1): `callable` is the first item after the MARK, `args` the tuple of the rest.
    Obj,
}

/// A call recorded by REDUCE/NEWOBJ/NEWOBJ_EX/INST/OBJ, with what the pickle later did to its result.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// What is called: usually a [`Value::Global`].
    pub callable: Value,
    /// The positional arguments: usually a [`Value::Tuple`] (REDUCE takes whatever is on the stack).
    pub args: Value,
    /// Which opcode created the object.
    pub kind: ObjectKind,
    /// The argument of BUILD (`__setstate__` / `__dict__.update`), if any. If the pickle applies BUILD more than
    /// once (CPython never writes that), two dict states are merged by concatenating their pairs (the
    /// `__dict__.update` semantics, last key wins); otherwise the last state is kept.
    pub state: Option<Value>,
    /// Items APPENDed to the object (Python calls its `append`/`extend`), in order.
    pub list_items: Vec<Value>,
    /// Pairs SETITEMed on the object (Python calls `__setitem__`), in order.
    pub dict_items: Vec<(Value, Value)>,
}

impl Object {
    /// An object of `kind` with no state and no items.
    #[must_use]
    pub fn new(kind: ObjectKind, callable: Value, args: Value) -> Self {
        Object { callable, args, kind, state: None, list_items: Vec::new(), dict_items: Vec::new() }
    }

    /// `callable(*args)` (REDUCE).
    #[must_use]
    pub fn reduce(callable: Value, args: Value) -> Self {
        Object::new(ObjectKind::Reduce, callable, args)
    }

    /// `cls.__new__(cls, *args)` (NEWOBJ).
    #[must_use]
    pub fn new_obj(cls: Value, args: Value) -> Self {
        Object::new(ObjectKind::NewObj, cls, args)
    }

    /// Sets the BUILD state.
    #[must_use]
    pub fn with_state(mut self, state: Value) -> Self {
        self.state = Some(state);
        self
    }

    /// Sets the SETITEM pairs.
    #[must_use]
    pub fn with_dict_items(mut self, items: Vec<(Value, Value)>) -> Self {
        self.dict_items = items;
        self
    }

    /// Sets the APPENDed items.
    #[must_use]
    pub fn with_list_items(mut self, items: Vec<Value>) -> Self {
        self.list_items = items;
        self
    }

    /// `(module, name)` of the callable when it is a [`Value::Global`].
    #[must_use]
    pub fn callable_name(&self) -> Option<(&str, &str)> {
        self.callable.as_global()
    }

    /// The positional arguments when they are a tuple.
    #[must_use]
    pub fn args_tuple(&self) -> Option<&[Value]> {
        match &self.args {
            Value::Tuple(items) => Some(items),
            _ => None,
        }
    }
}

impl From<Object> for Value {
    fn from(o: Object) -> Self {
        Value::Object(Box::new(o))
    }
}

impl Value {
    /// A [`Value::Global`].
    #[must_use]
    pub fn global(module: impl Into<String>, name: impl Into<String>) -> Self {
        Value::Global { module: module.into(), name: name.into() }
    }

    /// A [`Value::Str`].
    #[must_use]
    pub fn str(s: impl Into<String>) -> Self {
        Value::Str(s.into())
    }

    /// `(module, name)` of a [`Value::Global`].
    #[must_use]
    pub fn as_global(&self) -> Option<(&str, &str)> {
        match self {
            Value::Global { module, name } => Some((module, name)),
            _ => None,
        }
    }

    /// The string of a [`Value::Str`].
    #[must_use]
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer of a [`Value::Int`] (not of a `Bool`, unlike Python).
    #[must_use]
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The boolean of a [`Value::Bool`].
    #[must_use]
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The float of a [`Value::Float`].
    #[must_use]
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The payload of a [`Value::Bytes`] or [`Value::ByteArray`].
    #[must_use]
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) | Value::ByteArray(b) => Some(b),
            _ => None,
        }
    }

    /// The items of a [`Value::Tuple`].
    #[must_use]
    pub fn as_tuple(&self) -> Option<&[Value]> {
        match self {
            Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The items of a [`Value::List`].
    #[must_use]
    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) => Some(v),
            _ => None,
        }
    }

    /// The pairs of a [`Value::Dict`].
    #[must_use]
    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(v) => Some(v),
            _ => None,
        }
    }

    /// The object of a [`Value::Object`].
    #[must_use]
    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    /// Whether this is [`Value::None`].
    #[must_use]
    pub fn is_none(&self) -> bool {
        matches!(self, Value::None)
    }

    /// A short name of the variant, for error messages (`"dict"`, `"str"`, `"object"`, ...).
    #[must_use]
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::ByteArray(_) => "bytearray",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
            Value::FrozenSet(_) => "frozenset",
            Value::Global { .. } => "global",
            Value::Object(_) => "object",
            Value::PersistentId(_) => "persistent id",
            Value::Shared { value, .. } => value.type_name(),
            Value::Ref(_) => "reference",
        }
    }
}

/// Maps a Python 2 global name to its Python 3 equivalent the way CPython's unpickler does for protocols < 3
/// (`fix_imports=True`, tables from `_compat_pickle`): first `NAME_MAPPING` on the pair, else `IMPORT_MAPPING`
/// on the module. Names with no mapping are returned unchanged, so `normalize_global("__builtin__", "set")`
/// and `normalize_global("builtins", "set")` both give `("builtins", "set")`, and
/// `normalize_global("copy_reg", "_reconstructor")` gives `("copyreg", "_reconstructor")`.
#[must_use]
pub fn normalize_global(module: &str, name: &str) -> (String, String) {
    if module == "exceptions" && PY2_EXCEPTIONS.contains(&name) {
        return ("builtins".to_owned(), name.to_owned());
    }
    if let Some(&(_, (m, n))) = NAME_MAPPING.iter().find(|((m, n), _)| *m == module && *n == name) {
        return (m.to_owned(), n.to_owned());
    }
    if let Some(&(_, m)) = IMPORT_MAPPING.iter().find(|(m, _)| *m == module) {
        return (m.to_owned(), name.to_owned());
    }
    (module.to_owned(), name.to_owned())
}

/// `_compat_pickle.IMPORT_MAPPING` (Python 2 module -> Python 3 module), CPython 3.11.
const IMPORT_MAPPING: &[(&str, &str)] = &[
    ("BaseHTTPServer", "http.server"),
    ("CGIHTTPServer", "http.server"),
    ("ConfigParser", "configparser"),
    ("Cookie", "http.cookies"),
    ("Dialog", "tkinter.dialog"),
    ("DocXMLRPCServer", "xmlrpc.server"),
    ("FileDialog", "tkinter.filedialog"),
    ("HTMLParser", "html.parser"),
    ("Queue", "queue"),
    ("ScrolledText", "tkinter.scrolledtext"),
    ("SimpleDialog", "tkinter.simpledialog"),
    ("SimpleHTTPServer", "http.server"),
    ("SimpleXMLRPCServer", "xmlrpc.server"),
    ("SocketServer", "socketserver"),
    ("StringIO", "io"),
    ("Tix", "tkinter.tix"),
    ("Tkconstants", "tkinter.constants"),
    ("Tkdnd", "tkinter.dnd"),
    ("Tkinter", "tkinter"),
    ("UserDict", "collections"),
    ("UserList", "collections"),
    ("UserString", "collections"),
    ("__builtin__", "builtins"),
    ("_abcoll", "collections.abc"),
    ("_elementtree", "xml.etree.ElementTree"),
    ("_winreg", "winreg"),
    ("anydbm", "dbm"),
    ("cPickle", "pickle"),
    ("cStringIO", "io"),
    ("commands", "subprocess"),
    ("cookielib", "http.cookiejar"),
    ("copy_reg", "copyreg"),
    ("dbhash", "dbm.bsd"),
    ("dbm", "dbm.ndbm"),
    ("dumbdbm", "dbm.dumb"),
    ("dummy_thread", "_dummy_thread"),
    ("gdbm", "dbm.gnu"),
    ("htmlentitydefs", "html.entities"),
    ("httplib", "http.client"),
    ("markupbase", "_markupbase"),
    ("repr", "reprlib"),
    ("robotparser", "urllib.robotparser"),
    ("test.test_support", "test.support"),
    ("thread", "_thread"),
    ("tkColorChooser", "tkinter.colorchooser"),
    ("tkCommonDialog", "tkinter.commondialog"),
    ("tkFileDialog", "tkinter.filedialog"),
    ("tkFont", "tkinter.font"),
    ("tkMessageBox", "tkinter.messagebox"),
    ("tkSimpleDialog", "tkinter.simpledialog"),
    ("ttk", "tkinter.ttk"),
    ("urllib2", "urllib.request"),
    ("urlparse", "urllib.parse"),
    ("whichdb", "dbm"),
    ("xmlrpclib", "xmlrpc.client"),
];

/// `_compat_pickle.NAME_MAPPING` ((module, name) -> (module, name)), CPython 3.11, except the
/// `exceptions.<Name>` -> `builtins.<Name>` entries, which are [`PY2_EXCEPTIONS`].
/// `(module, name)`.
type Name = (&'static str, &'static str);

const NAME_MAPPING: &[(Name, Name)] = &[
    (("UserDict", "IterableUserDict"), ("collections", "UserDict")),
    (("UserDict", "UserDict"), ("collections", "UserDict")),
    (("UserList", "UserList"), ("collections", "UserList")),
    (("UserString", "UserString"), ("collections", "UserString")),
    (("__builtin__", "basestring"), ("builtins", "str")),
    (("__builtin__", "intern"), ("sys", "intern")),
    (("__builtin__", "long"), ("builtins", "int")),
    (("__builtin__", "reduce"), ("functools", "reduce")),
    (("__builtin__", "unichr"), ("builtins", "chr")),
    (("__builtin__", "unicode"), ("builtins", "str")),
    (("__builtin__", "xrange"), ("builtins", "range")),
    (("_multiprocessing", "Connection"), ("multiprocessing.connection", "Connection")),
    (("_socket", "fromfd"), ("socket", "fromfd")),
    (("exceptions", "StandardError"), ("builtins", "Exception")),
    (("itertools", "ifilter"), ("builtins", "filter")),
    (("itertools", "ifilterfalse"), ("itertools", "filterfalse")),
    (("itertools", "imap"), ("builtins", "map")),
    (("itertools", "izip"), ("builtins", "zip")),
    (("itertools", "izip_longest"), ("itertools", "zip_longest")),
    (("multiprocessing", "AuthenticationError"), ("multiprocessing.context", "AuthenticationError")),
    (("multiprocessing", "BufferTooShort"), ("multiprocessing.context", "BufferTooShort")),
    (("multiprocessing", "ProcessError"), ("multiprocessing.context", "ProcessError")),
    (("multiprocessing", "TimeoutError"), ("multiprocessing.context", "TimeoutError")),
    (("multiprocessing.forking", "Popen"), ("multiprocessing.popen_fork", "Popen")),
    (("multiprocessing.process", "Process"), ("multiprocessing.context", "Process")),
    (("socket", "_socketobject"), ("socket", "SocketType")),
    (("urllib", "ContentTooShortError"), ("urllib.error", "ContentTooShortError")),
    (("urllib", "getproxies"), ("urllib.request", "getproxies")),
    (("urllib", "pathname2url"), ("urllib.request", "pathname2url")),
    (("urllib", "quote"), ("urllib.parse", "quote")),
    (("urllib", "quote_plus"), ("urllib.parse", "quote_plus")),
    (("urllib", "unquote"), ("urllib.parse", "unquote")),
    (("urllib", "unquote_plus"), ("urllib.parse", "unquote_plus")),
    (("urllib", "url2pathname"), ("urllib.request", "url2pathname")),
    (("urllib", "urlcleanup"), ("urllib.request", "urlcleanup")),
    (("urllib", "urlencode"), ("urllib.parse", "urlencode")),
    (("urllib", "urlopen"), ("urllib.request", "urlopen")),
    (("urllib", "urlretrieve"), ("urllib.request", "urlretrieve")),
    (("urllib2", "HTTPError"), ("urllib.error", "HTTPError")),
    (("urllib2", "URLError"), ("urllib.error", "URLError")),
    (("whichdb", "whichdb"), ("dbm", "whichdb")),
];

/// Python 2 `exceptions` names that map to the same name in `builtins`.
const PY2_EXCEPTIONS: &[&str] = &[
    "ArithmeticError",
    "AssertionError",
    "AttributeError",
    "BaseException",
    "BufferError",
    "BytesWarning",
    "DeprecationWarning",
    "EOFError",
    "EnvironmentError",
    "Exception",
    "FloatingPointError",
    "FutureWarning",
    "GeneratorExit",
    "IOError",
    "ImportError",
    "ImportWarning",
    "IndentationError",
    "IndexError",
    "KeyError",
    "KeyboardInterrupt",
    "LookupError",
    "MemoryError",
    "NameError",
    "NotImplementedError",
    "OSError",
    "OverflowError",
    "PendingDeprecationWarning",
    "ReferenceError",
    "RuntimeError",
    "RuntimeWarning",
    "StopIteration",
    "SyntaxError",
    "SyntaxWarning",
    "SystemError",
    "SystemExit",
    "TabError",
    "TypeError",
    "UnboundLocalError",
    "UnicodeDecodeError",
    "UnicodeEncodeError",
    "UnicodeError",
    "UnicodeTranslateError",
    "UnicodeWarning",
    "UserWarning",
    "ValueError",
    "Warning",
    "ZeroDivisionError",
];

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn pair(m: &str, n: &str) -> (String, String) {
        (m.to_owned(), n.to_owned())
    }

    #[test]
    fn normalize_global_maps_python2_names() {
        assert_eq!(normalize_global("__builtin__", "set"), pair("builtins", "set"));
        assert_eq!(normalize_global("builtins", "set"), pair("builtins", "set"));
        assert_eq!(normalize_global("copy_reg", "_reconstructor"), pair("copyreg", "_reconstructor"));
        assert_eq!(normalize_global("__builtin__", "unicode"), pair("builtins", "str"));
        assert_eq!(normalize_global("__builtin__", "xrange"), pair("builtins", "range"));
        assert_eq!(normalize_global("__builtin__", "reduce"), pair("functools", "reduce"));
        assert_eq!(normalize_global("exceptions", "ValueError"), pair("builtins", "ValueError"));
        assert_eq!(normalize_global("exceptions", "StandardError"), pair("builtins", "Exception"));
        assert_eq!(normalize_global("UserDict", "UserDict"), pair("collections", "UserDict"));
        assert_eq!(normalize_global("UserDict", "IterableUserDict"), pair("collections", "UserDict"));
        assert_eq!(normalize_global("cPickle", "loads"), pair("pickle", "loads"));
        assert_eq!(normalize_global("torch._utils", "_rebuild_tensor_v2"), pair("torch._utils", "_rebuild_tensor_v2"));
        assert_eq!(normalize_global("exceptions", "NotAnException"), pair("exceptions", "NotAnException"));
    }

    #[test]
    fn accessors() {
        let g = Value::global("collections", "OrderedDict");
        assert_eq!(g.as_global(), Some(("collections", "OrderedDict")));
        assert_eq!(Value::None.as_global(), None);
        let o = Object::reduce(g.clone(), Value::Tuple(vec![Value::Int(1)]));
        assert_eq!(o.callable_name(), Some(("collections", "OrderedDict")));
        assert_eq!(o.args_tuple(), Some(&[Value::Int(1)][..]));
        let v = Value::from(o);
        assert_eq!(v.as_object().unwrap().kind, ObjectKind::Reduce);
        assert_eq!(v.type_name(), "object");
        assert_eq!(Value::str("x").as_str(), Some("x"));
        assert_eq!(Value::Int(3).as_int(), Some(3));
        assert_eq!(Value::Bool(true).as_int(), None);
        assert_eq!(Value::Bytes(vec![1]).as_bytes(), Some(&[1u8][..]));
        assert!(Value::default().is_none());
    }

    #[test]
    fn desugar_rewrites_only_exact_reduce_forms() {
        let reduce =
            |m: &str, n: &str, args: Vec<Value>| Value::from(Object::reduce(Value::global(m, n), Value::Tuple(args)));
        let latin1 = |s: &str| reduce("_codecs", "encode", vec![Value::str(s), Value::str("latin1")]);
        assert_eq!(latin1("a\u{ff}").desugar(), Value::Bytes(vec![b'a', 0xff]));
        // Not representable in latin-1: left alone.
        assert_eq!(latin1("\u{20ac}").desugar(), latin1("\u{20ac}"));
        assert_eq!(reduce("__builtin__", "bytes", vec![]).desugar(), Value::Bytes(vec![]));
        assert_eq!(reduce("builtins", "bytearray", vec![]).desugar(), Value::ByteArray(vec![]));
        assert_eq!(reduce("__builtin__", "bytearray", vec![latin1("xy")]).desugar(), Value::ByteArray(b"xy".to_vec()));
        let items = vec![Value::Int(1), latin1("z")];
        assert_eq!(
            reduce("__builtin__", "set", vec![Value::List(items.clone())]).desugar(),
            Value::Set(vec![Value::Int(1), Value::Bytes(b"z".to_vec())])
        );
        assert_eq!(reduce("builtins", "frozenset", vec![Value::List(vec![])]).desugar(), Value::FrozenSet(vec![]));
        // With state, items, another kind or other arguments: untouched (children are still desugared).
        let with_state = Value::from(
            Object::reduce(Value::global("builtins", "set"), Value::Tuple(vec![Value::List(vec![])]))
                .with_state(latin1("s")),
        );
        let Value::Object(o) = with_state.desugar() else { panic!() };
        assert_eq!(o.state, Some(Value::Bytes(b"s".to_vec())));
        let newobj =
            Value::from(Object::new_obj(Value::global("builtins", "set"), Value::Tuple(vec![Value::List(vec![])])));
        assert_eq!(newobj.clone().desugar(), newobj);
        let odd = reduce("builtins", "set", vec![Value::Int(1)]);
        assert_eq!(odd.clone().desugar(), odd);
        // Inside containers and persistent ids.
        let nested = Value::PersistentId(Box::new(Value::Dict(vec![(latin1("k"), Value::Tuple(vec![latin1("v")]))])));
        assert_eq!(
            nested.desugar(),
            Value::PersistentId(Box::new(Value::Dict(vec![(
                Value::Bytes(b"k".to_vec()),
                Value::Tuple(vec![Value::Bytes(b"v".to_vec())])
            )])))
        );
    }

    #[test]
    fn clone_and_eq_are_deep() {
        let mut v = Value::Int(0);
        for i in 0..100_000 {
            v = if i % 2 == 0 {
                Value::List(vec![v, Value::Float(f64::from(i))])
            } else {
                Object::reduce(Value::global("m", "f"), Value::Tuple(vec![v])).with_state(Value::None).into()
            };
        }
        let w = v.clone();
        assert!(w == v);
        let mut x = Value::Int(0);
        for _ in 0..100 {
            x = Value::List(vec![x]);
        }
        assert!(x != Value::List(vec![]));
        assert!(Value::Float(f64::NAN) != Value::Float(f64::NAN));
        assert_eq!(Value::Float(0.0), Value::Float(-0.0));
        // Drop a deep value without recursing: take it apart iteratively.
        let mut stack = vec![v, w];
        while let Some(v) = stack.pop() {
            match v {
                Value::List(items) => stack.extend(items),
                Value::Object(o) => stack.push(o.args),
                Value::Tuple(items) => stack.extend(items),
                _ => {}
            }
        }
    }
}
