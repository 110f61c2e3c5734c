//! Helpers for the conformance suite: where the fixtures and the Python environment are, running the
//! Python originals, and rendering ckpt's values in the fixtures' typed-tree JSON.
//!
//! The suite never skips: if the Python environment is missing, tests fail and say how to create it
//! (`bash scripts/setup.sh`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod crash;
pub mod s3;

use std::path::{Path, PathBuf};
use std::process::Command;

use ckpt_tensor::flatten::join_path;
use ckpt_tensor::flatten::python_str;
use ckpt_tensor::{DictKind, OpaqueTensorKind, PathItem, Value};
use serde_json::{Value as Json, json};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("conformance/ has a parent").to_path_buf()
}

/// `conformance/fixtures/<format>`.
pub fn fixtures(format: &str) -> PathBuf {
    repo_root().join("conformance").join("fixtures").join(format)
}

/// `conformance/bad`.
pub fn bad_dir() -> PathBuf {
    repo_root().join("conformance").join("bad")
}

/// The project's Python (`.venv/bin/python`); panics with the set-up command when it is missing.
pub fn python() -> PathBuf {
    let p = repo_root().join(".venv").join("bin").join("python");
    assert!(
        p.exists(),
        "the conformance suite needs the project's Python environment at {}: run `bash scripts/setup.sh`",
        p.display()
    );
    p
}

/// Runs a script from `conformance/python/` with the project's Python; returns stdout, panics with the
/// script's output when it fails.
pub fn run_python(script: &str, args: &[&Path]) -> String {
    let script_path = repo_root().join("conformance").join("python").join(script);
    let out = Command::new(python())
        .arg(&script_path)
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script_path.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Python's `float.hex()`.
pub fn float_hex(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    let bits = f.to_bits();
    let exp = ((bits >> 52) & 0x7FF) as i64;
    let man = bits & ((1u64 << 52) - 1);
    if exp == 0 && man == 0 {
        return format!("{sign}0x0.0p+0");
    }
    let (lead, e) = if exp == 0 { (0, -1022) } else { (1, exp - 1023) };
    let digits = format!("{man:013x}");
    let esign = if e < 0 { '-' } else { '+' };
    format!("{sign}0x{lead}.{digits}p{esign}{}", e.abs())
}

/// Renders a value in the typed-tree JSON of the fixture manifests; tensors are referenced by their
/// full-traversal path. A shared object is rendered where it is defined and again at each reference to it
/// (as Python's walk of the loaded object meets the one object at each place).
pub fn typed_tree(v: &Value) -> Json {
    let resolved = v.unshared();
    render(&resolved, &mut Vec::new())
}

fn items(vs: &[Value], path: &mut Vec<PathItem>) -> Vec<Json> {
    vs.iter()
        .enumerate()
        .map(|(i, v)| {
            path.push(PathItem::Index(i));
            let j = render(v, path);
            path.pop();
            j
        })
        .collect()
}

/// The manifests' name for an opaque tensor: `sparse_coo`/`sparse_csr`/... from the layout argument of
/// `_rebuild_sparse_tensor`, else the kind.
fn opaque_name(kind: OpaqueTensorKind, o: &ckpt_tensor::Object) -> String {
    if kind == OpaqueTensorKind::Sparse {
        // args[0] is `torch.serialization._get_layout('torch.sparse_coo')`
        if let Some(Value::Object(layout)) = o.args.as_sequence().and_then(|a| a.first()) {
            if let Some(Value::Str(l)) = layout.args.as_sequence().and_then(|a| a.first()) {
                return l.trim_start_matches("torch.").to_owned();
            }
        }
    }
    format!("{kind:?}").to_lowercase()
}

fn render(v: &Value, path: &mut Vec<PathItem>) -> Json {
    match v {
        Value::None => json!({"t": "none"}),
        Value::Bool(b) => json!({"t": "bool", "v": b}),
        Value::Int(i) => json!({"t": "int", "v": i.to_string()}),
        Value::BigInt(b) => json!({"t": "int", "v": ckpt_tensor::value::bigint_decimal(b)}),
        Value::Float(f) => json!({"t": "float", "v": float_hex(*f)}),
        Value::Complex(re, im) => json!({"t": "complex", "re": float_hex(*re), "im": float_hex(*im)}),
        Value::Str(s) => json!({"t": "str", "v": s}),
        Value::Bytes(b) => json!({"t": "bytes", "v": hex::encode(b)}),
        Value::ByteArray(b) => json!({"t": "bytearray", "v": hex::encode(b)}),
        Value::List(vs) => json!({"t": "list", "items": items(vs, path)}),
        Value::Tuple(vs) => json!({"t": "tuple", "items": items(vs, path)}),
        Value::Set(vs) => json!({"t": "set", "items": vs.iter().map(typed_tree).collect::<Vec<_>>()}),
        Value::FrozenSet(vs) => json!({"t": "frozenset", "items": vs.iter().map(typed_tree).collect::<Vec<_>>()}),
        Value::Dict(d) => {
            let pairs: Vec<Json> = d
                .items
                .iter()
                .map(|(k, val)| {
                    path.push(PathItem::Key(python_str(k).unwrap_or_default()));
                    let j = json!([typed_tree(k), render(val, path)]);
                    path.pop();
                    j
                })
                .collect();
            match d.kind {
                DictKind::OrderedDict => {
                    json!({"t": "odict", "items": pairs, "attrs": d.attrs.as_deref().map(typed_tree)})
                }
                DictKind::Counter => json!({"t": "counter", "items": pairs}),
                _ => json!({"t": "dict", "items": pairs}),
            }
        }
        Value::Tensor(_) => json!({"t": "tensor", "path": join_path(path)}),
        Value::Parameter { state, .. } => {
            json!({"t": "parameter", "path": join_path(path), "state": state.as_deref().map(typed_tree)})
        }
        Value::TensorWithState { state, .. } => {
            json!({"t": "tensor_with_state", "path": join_path(path), "state": typed_tree(state)})
        }
        Value::OpaqueTensor { kind, object } => json!({"t": "opaque", "kind": opaque_name(*kind, object)}),
        // The manifests name quantized tensors by kind and sparse ones by layout, as opaque tensors were.
        Value::Composite(c) => json!({"t": "opaque", "kind": match c.layout {
            ckpt_tensor::Layout::PerTensorAffine | ckpt_tensor::Layout::PerChannelAffine => "quantized",
            other => other.name(),
        }}),
        Value::Size(d) => json!({"t": "size", "v": d}),
        Value::DType(d) => json!({"t": "dtype", "v": d.torch_name()}),
        Value::Device { kind, index } => json!({"t": "device", "type": kind, "index": index}),
        Value::Global { module, name } => json!({"t": "global", "v": format!("{module}.{name}")}),
        other => json!({"t": "object", "type": other.type_name()}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_floats() {
        assert_eq!(float_hex(1.0), "0x1.0000000000000p+0");
        assert_eq!(float_hex(0.1), "0x1.999999999999ap-4");
        assert_eq!(float_hex(-0.0), "-0x0.0p+0");
        assert_eq!(float_hex(5e-324), "0x0.0000000000001p-1022");
        assert_eq!(float_hex(f64::NEG_INFINITY), "-inf");
    }

    #[test]
    fn bigints() {
        use ckpt_tensor::value::bigint_decimal;
        assert_eq!(bigint_decimal(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), "18446744073709551616");
        assert_eq!(bigint_decimal(&[0xff]), "-1");
        assert_eq!(bigint_decimal(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0xff]), "-9223372036854775808");
        assert_eq!(bigint_decimal(&[]), "0");
    }
}
