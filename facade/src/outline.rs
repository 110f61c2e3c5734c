//! Printing any value as indented, Python-like text (`ckpt cat` of a non-tensor entry): tensors by dtype and
//! shape, objects by their class, a shared object labelled `&<id>` where it is defined and every reference
//! to it printed as `*<id>` with the path of that place, so a cycle (an omegaconf node's `_parent`) reads
//! as where it points.

use std::collections::HashMap;
use std::fmt::Write as _;

use ckpt_tensor::flatten::object_parts;
use ckpt_tensor::flatten::python_repr_of;
use ckpt_tensor::{Dict, DictKind, Object, Value};

/// Containers nested deeper than this print as `...` (a value decoded under the default limits nests at
/// most 1000 deep; the printer recurses).
const MAX_DEPTH: usize = 200;

/// Bytes of a `bytes` value printed before `...`.
const MAX_BYTES: usize = 64;

/// The text of `v`, the value named `name` (an entry name; empty for a whole checkpoint): Python's repr for
/// scalars and strings, containers one item per line indented by two spaces, tensors as
/// `tensor(float32, [2, 3])`, objects as `module.Class(args) state={...}`, a shared object as `&<id> ...`
/// and a reference to it as `*<id> (-> path)`: the path of its definition (`name`, then dict keys,
/// positions and attribute names joined by `.`; `<top>` for the whole of an unnamed value).
///
/// ```
/// use ckpt::outline::format_value;
/// use ckpt::tensor::Value;
/// let node = Value::Shared { id: 0, value: Box::new(Value::dict([("parent", Value::Ref(0))])) };
/// let text = format_value(&Value::dict([("cfg", node)]), "hparams");
/// assert_eq!(text, "{\n  'cfg': &0 {\n    'parent': *0 (-> hparams.cfg),\n  },\n}");
/// ```
pub fn format_value(v: &Value, name: &str) -> String {
    format_value_naming(v, name, &HashMap::new())
}

/// [`format_value`], with the paths of shared objects defined outside `v` ([`shared_paths`] of the whole
/// checkpoint): a reference from an entry to an object that encloses it is printed with that object's path.
pub fn format_value_naming(v: &Value, name: &str, outside: &HashMap<u32, String>) -> String {
    let mut paths = outside.clone();
    definitions(v, &mut name.to_owned(), &mut paths, 0);
    let mut out = String::new();
    // An entry that is an object defined at another place (a second reference to it) says so first.
    if let Value::Shared { id, .. } = v {
        if let Some(at) = outside.get(id).filter(|at| at.as_str() != name) {
            let _ = write!(out, "*{id} (-> {at}), the object ");
        }
    }
    Printer { paths: &paths, out: &mut out }.value(v, 0);
    out
}

/// The path of every shared object ([`Value::Shared`]) of `root`, by id, as [`format_value`] names them.
///
/// ```
/// use ckpt::outline::shared_paths;
/// use ckpt::tensor::Value;
/// let cyclic = Value::Shared { id: 4, value: Box::new(Value::List(vec![Value::Ref(4)])) };
/// assert_eq!(shared_paths(&Value::dict([("cyc", cyclic)]))[&4], "cyc");
/// ```
pub fn shared_paths(root: &Value) -> HashMap<u32, String> {
    let mut paths = HashMap::new();
    definitions(root, &mut String::new(), &mut paths, 0);
    paths
}

/// The path of every [`Value::Shared`] definition in `v` (`path` is `v`'s).
fn definitions(v: &Value, path: &mut String, paths: &mut HashMap<u32, String>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    if let Value::Shared { id, value } = v {
        // Where the whole checkpoint defines it, if known, else here.
        paths.entry(*id).or_insert_with(|| if path.is_empty() { "<top>".into() } else { path.clone() });
        return definitions(value, path, paths, depth + 1);
    }
    each_child(v, &mut |segment, child| {
        let len = path.len();
        if let Some(segment) = segment {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(&segment);
        }
        definitions(child, path, paths, depth + 1);
        path.truncate(len);
    });
}

/// Calls `f` with the path segment (`None`: the names continue the parent's) and value of every child of
/// `v`; objects' parts named as [`ckpt_tensor::flatten::entry_names`] names the tensors inside them.
fn each_child(v: &Value, f: &mut dyn FnMut(Option<String>, &Value)) {
    let items = |items: &[Value], f: &mut dyn FnMut(Option<String>, &Value)| {
        for (i, item) in items.iter().enumerate() {
            f(Some(i.to_string()), item);
        }
    };
    match v {
        Value::List(xs) | Value::Tuple(xs) | Value::Set(xs) | Value::FrozenSet(xs) => items(xs, f),
        Value::Dict(d) => {
            for (k, v) in &d.items {
                f(Some(key_segment(k)), v);
            }
            if let Some(attrs) = &d.attrs {
                f(Some("__dict__".into()), attrs);
            }
        }
        Value::Parameter { state: Some(state), .. } => f(Some("__dict__".into()), state),
        Value::TensorWithState { tensor, state, .. } => {
            f(None, tensor);
            f(Some("__dict__".into()), state);
        }
        Value::Object(o) | Value::OpaqueTensor { object: o, .. } => {
            for (step, part) in object_parts(o) {
                f(step, part);
            }
        }
        Value::Numpy(n) => f(None, &n.value),
        Value::Shared { value, .. } => each_child(value, f),
        _ => {}
    }
}

fn key_segment(k: &Value) -> String {
    match k {
        Value::Str(s) => s.clone(),
        other => python_repr_of(other).unwrap_or_else(|| format!("<{}>", other.type_name())),
    }
}

struct Printer<'a> {
    paths: &'a HashMap<u32, String>,
    out: &'a mut String,
}

impl Printer<'_> {
    fn indent(&mut self, depth: usize) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
    }

    /// `open`, then each item on its own line (`key: value,`), then `close` at `depth`'s indentation.
    fn block(&mut self, open: &str, close: &str, items: &[(Option<&Value>, &Value)], depth: usize) {
        if items.is_empty() {
            self.out.push_str(open);
            self.out.push_str(close);
            return;
        }
        self.out.push_str(open);
        self.out.push('\n');
        for (key, value) in items {
            self.indent(depth + 1);
            if let Some(k) = key {
                self.value(k, depth + 1);
                self.out.push_str(": ");
            }
            self.value(value, depth + 1);
            self.out.push_str(",\n");
        }
        self.indent(depth);
        self.out.push_str(close);
    }

    fn seq(&mut self, open: &str, close: &str, xs: &[Value], depth: usize) {
        let items: Vec<(Option<&Value>, &Value)> = xs.iter().map(|x| (None, x)).collect();
        self.block(open, close, &items, depth);
    }

    fn dict(&mut self, d: &Dict, depth: usize) {
        let items: Vec<(Option<&Value>, &Value)> = d.items.iter().map(|(k, v)| (Some(k), v)).collect();
        let (open, close) = match d.kind {
            DictKind::Dict => ("{", "}"),
            DictKind::OrderedDict => ("OrderedDict({", "})"),
            DictKind::Counter => ("Counter({", "})"),
            // A dict kind added to the model later prints as a mapping of an unnamed class.
            _ => ("<mapping>({", "})"),
        };
        self.block(open, close, &items, depth);
        if let Some(attrs) = &d.attrs {
            self.out.push_str(" with __dict__ ");
            self.value(attrs, depth);
        }
    }

    fn object(&mut self, o: &Object, depth: usize) {
        match &o.callable {
            Value::Global { module, name } => {
                let _ = write!(self.out, "{module}.{name}");
            }
            other => {
                self.out.push('<');
                self.value(other, depth);
                self.out.push('>');
            }
        }
        if o.newobj {
            self.out.push_str(".__new__");
        }
        match &o.args {
            Value::Tuple(args) => self.seq("(", ")", args, depth),
            other => {
                self.out.push_str("(*");
                self.value(other, depth);
                self.out.push(')');
            }
        }
        if let Some(state) = &o.state {
            self.out.push_str(" state=");
            self.value(state, depth);
        }
        if !o.list_items.is_empty() {
            self.out.push_str(" items=");
            self.seq("[", "]", &o.list_items, depth);
        }
        if !o.dict_items.is_empty() {
            self.out.push_str(" items=");
            let items: Vec<(Option<&Value>, &Value)> = o.dict_items.iter().map(|(k, v)| (Some(k), v)).collect();
            self.block("{", "}", &items, depth);
        }
    }

    fn value(&mut self, v: &Value, depth: usize) {
        if depth > MAX_DEPTH {
            self.out.push_str("...");
            return;
        }
        if let Some(text) = python_repr_of(v) {
            self.out.push_str(&text);
            return;
        }
        match v {
            Value::Bytes(b) => self.bytes(b),
            Value::ByteArray(b) => {
                self.out.push_str("bytearray(");
                self.bytes(b);
                self.out.push(')');
            }
            Value::List(xs) => self.seq("[", "]", xs, depth),
            Value::Tuple(xs) => self.seq("(", ")", xs, depth),
            Value::Set(xs) if xs.is_empty() => self.out.push_str("set()"),
            Value::Set(xs) => self.seq("{", "}", xs, depth),
            Value::FrozenSet(xs) => self.seq("frozenset({", "})", xs, depth),
            Value::Dict(d) => self.dict(d, depth),
            Value::Tensor(t) => {
                let _ = write!(self.out, "tensor({}, {:?})", t.dtype().torch_name(), t.shape());
            }
            Value::Parameter { tensor, state } => {
                let _ = write!(self.out, "Parameter({}, {:?})", tensor.dtype().torch_name(), tensor.shape());
                if let Some(state) = state {
                    self.out.push_str(" with __dict__ ");
                    self.value(state, depth);
                }
            }
            Value::TensorWithState { tensor, class, state } => {
                self.value(class, depth);
                self.out.push('(');
                self.value(tensor, depth);
                self.out.push_str(") with __dict__ ");
                self.value(state, depth);
            }
            Value::OpaqueTensor { kind, object } => {
                let _ = write!(self.out, "<{kind:?} tensor> ");
                self.object(object, depth);
            }
            Value::Storage { dtype, data } => {
                let _ = write!(self.out, "storage({}, {} bytes)", dtype.torch_name(), data.len());
            }
            Value::Size(dims) => {
                let _ = write!(self.out, "torch.Size({dims:?})");
            }
            Value::DType(d) => {
                let _ = write!(self.out, "torch.{}", d.torch_name());
            }
            Value::Device { kind, index } => match index {
                Some(i) => {
                    let _ = write!(self.out, "device('{kind}:{i}')");
                }
                None => {
                    let _ = write!(self.out, "device('{kind}')");
                }
            },
            Value::Global { module, name } => {
                let _ = write!(self.out, "{module}.{name}");
            }
            Value::Object(o) => self.object(o, depth),
            Value::Numpy(n) => {
                self.out.push_str(n.type_name());
                self.out.push('(');
                self.value(&n.value, depth);
                self.out.push(')');
            }
            Value::Shared { id, value } => {
                let _ = write!(self.out, "&{id} ");
                self.value(value, depth);
            }
            Value::Ref(id) => match self.paths.get(id) {
                Some(path) => {
                    let _ = write!(self.out, "*{id} (-> {path})");
                }
                None => {
                    let _ = write!(self.out, "*{id} (-> not in this value)");
                }
            },
            // Scalars and strings printed by `python_repr_of` above.
            _ => {
                let _ = write!(self.out, "<{}>", v.type_name());
            }
        }
    }

    /// Python's `repr(bytes)`, the first [`MAX_BYTES`] bytes of a longer value then `...`.
    fn bytes(&mut self, b: &[u8]) {
        self.out.push_str("b'");
        for &c in b.iter().take(MAX_BYTES) {
            match c {
                b'\\' => self.out.push_str("\\\\"),
                b'\'' => self.out.push_str("\\'"),
                b'\n' => self.out.push_str("\\n"),
                b'\r' => self.out.push_str("\\r"),
                b'\t' => self.out.push_str("\\t"),
                0x20..=0x7e => self.out.push(char::from(c)),
                _ => {
                    let _ = write!(self.out, "\\x{c:02x}");
                }
            }
        }
        self.out.push('\'');
        if b.len() > MAX_BYTES {
            let _ = write!(self.out, "... ({} bytes)", b.len());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ckpt_tensor::Tensor;

    #[test]
    fn a_cycle_prints_where_it_points() {
        let child = Value::Shared { id: 1, value: Box::new(Value::dict([("_parent", Value::Ref(0))])) };
        let root = Value::Shared { id: 0, value: Box::new(Value::dict([("model", child), ("again", Value::Ref(1))])) };
        let text = format_value(&Value::dict([("hp", root)]), "");
        assert!(text.contains("'hp': &0 {"), "{text}");
        assert!(text.contains("'model': &1 {"), "{text}");
        assert!(text.contains("'_parent': *0 (-> hp)"), "{text}");
        assert!(text.contains("'again': *1 (-> hp.model)"), "{text}");
    }

    #[test]
    fn objects_tensors_and_scalars() {
        let obj = Value::Object(Box::new(Object {
            callable: Value::Global { module: "m".into(), name: "C".into() },
            args: Value::Tuple(vec![Value::Int(3)]),
            newobj: false,
            state: Some(Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))])),
            list_items: vec![],
            dict_items: vec![],
        }));
        let text = format_value(&Value::List(vec![obj, Value::Bytes(b"a\x00'".to_vec()), Value::Set(vec![])]), "x");
        assert_eq!(
            text,
            "[\n  m.C(\n    3,\n  ) state={\n    'w': tensor(float32, [2]),\n  },\n  b'a\\x00\\'',\n  set(),\n]"
        );
    }

    #[test]
    fn deep_values_stop_printing_instead_of_overflowing() {
        let mut v = Value::None;
        for _ in 0..10_000 {
            v = Value::List(vec![v]);
        }
        let text = format_value(&v, "");
        assert!(text.contains("..."));
        // Dropping the nested lists recursively is the test's own business: leak it.
        std::mem::forget(v);
    }
}
