//! Whole `nn.Module` objects saved by `torch.save(model)`: the pickled module tree (each module an object of
//! its class created by `cls.__new__`, its `__dict__` restored by `__setstate__` with `_parameters`, `_buffers`,
//! `_non_persistent_buffers_set` and `_modules`) read as the state dict `model.state_dict()` would return,
//! without importing or running any class.

use std::collections::HashSet;

use ckpt_tensor::{Dict, DictKind, Object, Value};

/// The `__dict__` of a pickled module: the `__setstate__` state of an object that has `_parameters`, `_buffers` and
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use ckpt_tensor::Tensor;

    use super::*;

    fn t(v: f32) -> Tensor {
        Tensor::from_slice(&[v], &[1]).unwrap()
    }

    fn module(
        class: &str,
        params: Vec<(&str, Value)>,
        buffers: Vec<(&str, Value)>,
        non_persistent: &[&str],
        children: Vec<(&str, Value)>,
    ) -> Value {
        let map = |items: Vec<(&str, Value)>| {
            let mut d = Dict::new(DictKind::Dict);
            for (k, v) in items {
                d.insert(k, v);
            }
            Value::Dict(d)
        };
        let mut state = Dict::new(DictKind::Dict);
        state.insert("training", Value::Bool(true));
        state.insert("_parameters", map(params));
        state.insert("_buffers", map(buffers));
        state.insert(
            "_non_persistent_buffers_set",
            Value::Set(non_persistent.iter().map(|s| Value::Str((*s).into())).collect()),
        );
        state.insert("_modules", map(children));
        Value::Object(Box::new(Object {
            callable: Value::Global { module: "torch.nn.modules.x".into(), name: class.into() },
            args: Value::Tuple(vec![]),
            newobj: true,
            state: Some(Value::Dict(state)),
            list_items: vec![],
            dict_items: vec![],
        }))
    }

    #[test]
    fn state_dict_names_order_and_skips_as_torch() {
        let param = |v| Value::Parameter { tensor: t(v).with_requires_grad(true), state: None };
        let inner = module("Linear", vec![("weight", param(3.0)), ("bias", Value::None)], vec![], &[], vec![]);
        let bn = module(
            "BatchNorm1d",
            vec![("weight", param(1.0))],
            vec![("running_mean", Value::Tensor(t(2.0))), ("scratch", Value::Tensor(t(9.0))), ("gone", Value::None)],
            &["scratch"],
            vec![],
        );
        let top = module(
            "Sequential",
            vec![],
            vec![],
            &[],
            vec![("0", bn), ("1", module("ReLU", vec![], vec![], &[], vec![])), ("2", Value::None), ("3", inner)],
        );
        assert!(is_module(&top));
        let Some(Value::Dict(sd)) = module_state_dict(&top) else { panic!() };
        assert_eq!(sd.kind, DictKind::OrderedDict);
        let names: Vec<&str> = sd.items.iter().map(|(k, _)| k.as_str().unwrap()).collect();
        assert_eq!(names, ["0.weight", "0.running_mean", "3.weight"]);
        // Parameters become plain tensors, as state_dict()'s detach() gives.
        let Value::Tensor(w) = &sd.items[2].1 else { panic!("{:?}", sd.items[2].1) };
        assert!(!w.requires_grad());
        assert_eq!(w.to_vec::<f32>().unwrap(), [3.0]);
        assert_eq!(
            module_classes(&top),
            [
                "torch.nn.modules.x.Sequential",
                "torch.nn.modules.x.BatchNorm1d",
                "torch.nn.modules.x.ReLU",
                "torch.nn.modules.x.Linear"
            ]
        );
        // Not modules: a state dict, an object without the module attributes.
        assert!(module_state_dict(&Value::dict([("w", Value::Tensor(t(1.0)))])).is_none());
        let Value::Object(mut o) = top else { panic!() };
        o.state = Some(Value::dict([("_parameters", Value::Int(1))]));
        assert!(!is_module(&Value::Object(o)));
    }
}
