//! TorchScript archives (`torch.jit.save`): `data.pkl` holds the module as objects of `__torch__` classes
//! (each module's attributes, parameters and buffers among them, in its `__dict__`), `constants.pkl` the
//! tensor constants of its code (storages under `constants/`), and `code/` the code, which is listed and
//! never run. Read as the module's state dict: its parameters and buffers named by attribute path, as
//! `torch.jit.load(f).state_dict()` names them. Its other tensors are listed apart, under their own prefixes
//! ([`Script::EXTRA_PREFIXES`]): tensor attributes that are neither (`_state`, `_context`) as
//! `attributes.<path>`, the tensor constants of `constants.pkl` as `constants.<i>`. They read by name and
//! stay out of a conversion unless it asks for them ([`Script::is_extra`]).

use ckpt_tensor::flatten::entry_names;
use ckpt_tensor::{Dict, DictKind, Value};

use crate::zip::Archive;

/// What a TorchScript archive holds besides its tensors ([`crate::TorchReader::script`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Script {
    /// The code records (`code/__torch__/....py`), without the prefix.
    pub code: Vec<String>,
    /// Names of the module's parameters (`lin.weight`), from each class's `__parameters__`.
    pub parameters: Vec<String>,
    /// Names of its buffers, from each class's `__buffers__`.
    pub buffers: Vec<String>,
    /// Number of tensor constants.
    pub constants: usize,
    /// Names of the module's tensor attributes that are neither parameters nor buffers (`inner._state`),
    /// listed as `attributes.<name>`.
    pub attributes: Vec<String>,
}

impl Script {
    /// The prefixes of the entries a TorchScript archive lists besides its state dict: tensor attributes
    /// that are neither parameters nor buffers, and tensor constants.
    pub const EXTRA_PREFIXES: [&'static str; 2] = ["attributes.", "constants."];

    /// Whether the entry `name` of a TorchScript archive is one of its tensors outside the state dict
    /// (`attributes.<path>`, `constants.<i>`), which a conversion leaves out unless asked for.
    pub fn is_extra(name: &str) -> bool {
        Self::EXTRA_PREFIXES.iter().any(|p| name.starts_with(p))
    }
}

/// The module's tensors (every tensor among its attributes, nested modules' by their path) and its
/// constants, as one state dict; and what the archive declares of them.
pub(crate) fn read(archive: &Archive, bytes: &[u8], module: &Value, constants: &Value) -> (Value, Script) {
    read_in(archive, bytes, "code/", module, constants)
}

/// [`read`], the code under `code_dir` (`code/`; `.data/ts_code/code/` in a torch.package archive).
pub(crate) fn read_in(
    archive: &Archive,
    bytes: &[u8],
    code_dir: &str,
    module: &Value,
    constants: &Value,
) -> (Value, Script) {
    let declared = declarations(archive, bytes, code_dir);
    let mut script = Script {
        code: archive
            .records()
            .iter()
            .map(|r| r.short_name())
            .filter(|n| n.starts_with(code_dir) && n.ends_with(".py"))
            .map(str::to_owned)
            .collect(),
        ..Script::default()
    };
    // Which of the module's tensors are parameters and buffers: each module object's class declares its own.
    classify(module, "", &declared, &mut script, 0);
    let mut sd = Dict::new(DictKind::OrderedDict);
    let mut attributes = Vec::new();
    for (name, v) in entry_names(module).unwrap_or_default() {
        if !v.is_tensor_like() || name.is_empty() {
            continue;
        }
        // (Code that declares no class cannot tell: every tensor is taken as the state dict's.)
        if declared.is_empty() || script.parameters.contains(&name) || script.buffers.contains(&name) {
            sd.insert(name, v.clone());
        } else {
            attributes.push((name, v.clone()));
        }
    }
    for (name, v) in attributes {
        sd.insert(format!("attributes.{name}"), v);
        script.attributes.push(name);
    }
    let items: &[Value] = match constants {
        Value::Tuple(items) | Value::List(items) => items,
        _ => &[],
    };
    for (i, c) in items.iter().enumerate() {
        if c.is_tensor_like() {
            sd.insert(format!("constants.{i}"), c.clone());
            script.constants += 1;
        }
    }
    (Value::Dict(sd), script)
}

/// `(qualified class, parameters, buffers)` of every class the code declares: `class Linear(Module):`
/// followed by `__parameters__ = ["weight", "bias", ]` and `__buffers__ = [...]` in
/// `code/__torch__/torch/nn/modules/linear.py` (class `__torch__.torch.nn.modules.linear.Linear`).
type Declared = Vec<(String, Vec<String>, Vec<String>)>;

fn declarations(archive: &Archive, bytes: &[u8], code_dir: &str) -> Declared {
    let mut out = Vec::new();
    for rec in archive.records() {
        let name = rec.short_name();
        let Some(path) = name.strip_prefix(code_dir).and_then(|p| p.strip_suffix(".py")) else { continue };
        // The code is small; a record that does not inflate is not described (its tensors still read).
        let Ok(text) = archive.record_bytes(bytes, rec, 16 << 20) else { continue };
        let Ok(text) = std::str::from_utf8(&text) else { continue };
        let module = path.replace('/', ".");
        let mut current: Option<usize> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("class ") {
                let class = rest.split(['(', ':']).next().unwrap_or_default().trim();
                out.push((format!("{module}.{class}"), Vec::new(), Vec::new()));
                current = Some(out.len() - 1);
                continue;
            }
            let Some(entry) = current.and_then(|i| out.get_mut(i)) else { continue };
            let line = line.trim();
            if let Some(list) = line.strip_prefix("__parameters__ = ") {
                entry.1 = names_in(list);
            } else if let Some(list) = line.strip_prefix("__buffers__ = ") {
                entry.2 = names_in(list);
            }
        }
    }
    out
}

/// The strings of a Python list literal of strings (`["weight", "bias", ]`).
fn names_in(list: &str) -> Vec<String> {
    list.trim_matches(|c| c == '[' || c == ']' || c == ' ')
        .split(',')
        .map(|s| s.trim().trim_matches('"').trim_matches('\''))
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Notes the parameters and buffers of the module object `v` (at `prefix`) and of the modules it holds.
fn classify(v: &Value, prefix: &str, declared: &Declared, script: &mut Script, depth: usize) {
    let v = match v {
        Value::Shared { value, .. } => value,
        other => other,
    };
    let Value::Object(o) = v else { return };
    if depth > 256 {
        return;
    }
    let Some((module, class)) = o.callable_name() else { return };
    let qualified = format!("{module}.{class}");
    let Some(Value::Dict(state)) = o.state.as_ref().map(|s| match s {
        Value::Shared { value, .. } => &**value,
        other => other,
    }) else {
        return;
    };
    if let Some((_, parameters, buffers)) = declared.iter().find(|(c, _, _)| *c == qualified) {
        for p in parameters {
            if state.get(p).is_some_and(Value::is_tensor_like) {
                script.parameters.push(format!("{prefix}{p}"));
            }
        }
        for b in buffers {
            if state.get(b).is_some_and(Value::is_tensor_like) {
                script.buffers.push(format!("{prefix}{b}"));
            }
        }
    }
    for (k, child) in &state.items {
        if let Some(k) = k.as_str() {
            classify(child, &format!("{prefix}{k}."), declared, script, depth + 1);
        }
    }
}
