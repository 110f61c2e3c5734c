//! Whole `nn.Module` objects saved by `torch.save(model)`: the pickled module tree (each module an object of
//! its class created by `cls.__new__`, its `__dict__` restored by BUILD with `_parameters`, `_buffers`,
//! `_non_persistent_buffers_set` and `_modules`) read as the state dict `model.state_dict()` would return,
//! without importing or running any class.

use std::collections::HashSet;

use ckpt_core::{Dict, DictKind, Object, Value};

/// The `__dict__` of a pickled module: the BUILD state of an object that has `_parameters`, `_buffers` and
/// `_modules` mappings.
fn module_dict(v: &Value) -> Option<(&Object, &Dict)> {
    let Value::Object(o) = v else { return None };
    let Some(Value::Dict(state)) = &o.state else { return None };
    let is_map = |k: &str| matches!(state.get(k), Some(Value::Dict(_)));
    (is_map("_parameters") && is_map("_buffers") && is_map("_modules")).then_some((o.as_ref(), state))
}

/// Whether `v` is a pickled `nn.Module`.
pub fn is_module(v: &Value) -> bool {
    module_dict(v).is_some()
}

/// The state dict of a pickled module, as `module.state_dict()` builds it: for each module (depth first, in
/// `_modules` order) its parameters, then its persistent buffers, named by their dotted path (`0.weight`,
/// `1.running_mean`); `None` entries are skipped, parameters become plain tensors (what `state_dict()`'s
/// `detach()` gives). An `OrderedDict`, as torch returns; `None` when `v` is not a module.
pub fn module_state_dict(v: &Value) -> Option<Value> {
    module_dict(v)?;
    let mut out = Dict::new(DictKind::OrderedDict);
    collect(v, "", &mut out, 0);
    Some(Value::Dict(out))
}

/// How deep module trees are followed (a pickled tree is finite, but a hostile one can be deep).
const MAX_DEPTH: usize = 512;

fn collect(v: &Value, prefix: &str, out: &mut Dict, depth: usize) {
    let Some((_, state)) = module_dict(v) else { return };
    if depth > MAX_DEPTH {
        return;
    }
    let items = |k: &str| match state.get(k) {
        Some(Value::Dict(d)) => d.items.as_slice(),
        _ => &[],
    };
    let non_persistent: HashSet<&str> = match state.get("_non_persistent_buffers_set") {
        Some(Value::Set(s)) => s.iter().filter_map(Value::as_str).collect(),
        _ => HashSet::new(),
    };
    for (k, p) in items("_parameters") {
        let (Some(name), false) = (k.as_str(), matches!(p, Value::None)) else { continue };
        let value = match p {
            Value::Parameter { tensor, .. } => Value::Tensor(tensor.clone().with_requires_grad(false)),
            other => other.clone(),
        };
        out.insert(format!("{prefix}{name}"), value);
    }
    for (k, b) in items("_buffers") {
        let (Some(name), false) = (k.as_str(), matches!(b, Value::None)) else { continue };
        if !non_persistent.contains(name) {
            out.insert(format!("{prefix}{name}"), b.clone());
        }
    }
    for (k, m) in items("_modules") {
        if let Some(name) = k.as_str() {
            collect(m, &format!("{prefix}{name}."), out, depth + 1);
        }
    }
}

/// The classes of a pickled module tree (`torch.nn.modules.container.Sequential`, ...), each once, in the
/// order they first appear depth first; empty when `v` is not a module.
pub fn module_classes(v: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>, depth: usize) {
        let Some((o, state)) = module_dict(v) else { return };
        if depth > MAX_DEPTH {
            return;
        }
        if let Some((module, name)) = o.callable_name() {
            let class = format!("{module}.{name}");
            if !out.contains(&class) {
                out.push(class);
            }
        }
        if let Some(Value::Dict(children)) = state.get("_modules") {
            for (_, m) in &children.items {
                walk(m, out, depth + 1);
            }
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out, 0);
    out
}
