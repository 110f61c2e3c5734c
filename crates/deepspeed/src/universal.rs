//! Universal checkpoints (`ds_to_universal`'s output): a tag directory with `zero/<param>/fp32.pt` (the whole
//! fp32 parameter, a tensor or `{"param": tensor, "cat_dim": ...}`), the optimizer state beside it
//! (`exp_avg.pt`, `exp_avg_sq.pt`, `step.pt`), `zero/optimizer_state.pt` (the optimizer's other values and
//! param groups) and the model states file(s) copied from the source checkpoint. ZeRO 3's universal files
//! hold flat parameters and state: they take the shapes the model states file records (`param_shapes`).

use std::path::Path;

use ckpt_tensor::{Tensor, Value};

use crate::error::{Error, Result};
use crate::files::{At, load, names};
use crate::zero::{Consolidated, push_leaves};

/// The tensor a universal file holds: the tensor itself, or the `param` of a `{"param", "cat_dim"}` dict.
fn param_of(path: &Path, v: &Value) -> Result<Tensor> {
    let at = At::top(path, v);
    match v {
        Value::Dict(_) => Ok(at.get("param", "param")?.tensor()?.clone()),
        _ => Ok(at.tensor()?.clone()),
    }
}

fn param_numel(shape: &[usize]) -> usize {
    ckpt_tensor::checked_numel(shape).unwrap_or(usize::MAX)
}

/// Reads the universal checkpoint in the tag directory `dir`.
pub(crate) fn read(dir: &Path, options: &ckpt_torch::ReadOptions) -> Result<Consolidated> {
    let zero = dir.join("zero");
    let states_name = names(dir)?
        .into_iter()
        .filter(|n| n.ends_with("_model_states.pt"))
        .min_by_key(|n| (n != "mp_rank_00_model_states.pt", n.clone()));
    let model_states = match &states_name {
        Some(n) => load(&dir.join(n), options)?,
        None => Value::None,
    };
    // Parameter order: the module's, then any other parameter directory by name.
    let mut order: Vec<String> = Vec::new();
    let states_path = states_name.as_ref().map(|n| dir.join(n));
    if let Some(p) = &states_path {
        let states = At::top(p, &model_states);
        if let Some(module) = states.opt("module", "module")? {
            order.extend(module.named()?.into_iter().map(|(k, _)| k.to_owned()));
        }
    }
    // ZeRO 3's universal files hold flat parameters: they take the shapes of the model states file.
    let mut shapes: std::collections::HashMap<String, Vec<usize>> = std::collections::HashMap::new();
    if let Some(p) = &states_path {
        let states = At::top(p, &model_states);
        if let Some(groups) = states.opt("param_shapes", "param_shapes")? {
            for g in crate::files::groups(groups)? {
                for (n, s) in g.named()? {
                    shapes.insert(n.to_owned(), s.shape()?);
                }
            }
        }
    }
    let dirs: Vec<String> = names(&zero)?.into_iter().filter(|n| zero.join(n).join("fp32.pt").is_file()).collect();
    let mut params: Vec<String> = order.iter().filter(|n| dirs.contains(n)).cloned().collect();
    params.extend(dirs.iter().filter(|n| !order.contains(n)).cloned());

    let mut model = Vec::with_capacity(params.len());
    let mut optimizer = Vec::new();
    for name in &params {
        let pdir = zero.join(name);
        let fp32 = pdir.join("fp32.pt");
        let mut param = param_of(&fp32, &load(&fp32, options)?)?;
        if let Some(shape) = shapes.get(name) {
            if param.dim() == 1 && param.shape() != shape.as_slice() && param.numel() == param_numel(shape) {
                param = param.reshape(shape)?;
            }
        }
        let shape = param.shape().to_vec();
        model.push((name.clone(), param));
        for key in ["exp_avg", "exp_avg_sq", "step"] {
            let file = pdir.join(format!("{key}.pt"));
            if file.is_file() {
                let v = load(&file, options)?;
                // ZeRO 3's universal state is flat: it takes the parameter's shape, as ZeRO's does.
                let value = match &v {
                    Value::Dict(_) => Value::Tensor(param_of(&file, &v)?),
                    Value::Tensor(t)
                        if t.dim() == 1 && t.numel() == param_numel(&shape) && t.shape() != shape.as_slice() =>
                    {
                        Value::Tensor(t.reshape(&shape)?)
                    }
                    other => other.clone(),
                };
                optimizer.push((format!("optimizer.state.{name}.{key}"), value));
            }
        }
    }
    if let Some(p) = &states_path {
        let states = At::top(p, &model_states);
        if let Some(pairs) = states.opt("shared_params", "shared_params")? {
            if !matches!(pairs.value, Value::None) {
                for (alias, target) in pairs.named()? {
                    let target = target.str()?;
                    if model.iter().any(|(n, _)| n == alias) {
                        continue;
                    }
                    if let Some(t) = model.iter().find(|(n, _)| n == target).map(|(_, t)| t.clone()) {
                        model.push((alias.to_owned(), t));
                    }
                }
            }
        }
    }
    let common = zero.join("optimizer_state.pt");
    let (mut stage, mut world) = (0, 0);
    if common.is_file() {
        let v = load(&common, options)?;
        let at = At::top(&common, &v);
        for (k, item) in at.named()? {
            match k {
                "zero_stage" => stage = item.count()?,
                "partition_count" => {
                    world = match item.value {
                        Value::List(_) | Value::Tuple(_) => item
                            .list()?
                            .iter()
                            .map(At::count)
                            .collect::<Result<Vec<_>>>()?
                            .into_iter()
                            .max()
                            .unwrap_or(0),
                        _ => item.count()?,
                    }
                }
                "optimizer_state_dict" => {
                    if let Some(groups) = item.opt("param_groups", "optimizer_state_dict.param_groups")? {
                        push_leaves("optimizer.param_groups", groups.value, &mut optimizer)?;
                    }
                    continue;
                }
                _ => {}
            }
            push_leaves(&format!("optimizer.{k}"), item.value, &mut optimizer)?;
        }
    }
    if model.is_empty() {
        return Err(Error::MissingFile {
            path: zero.join("<param>").join("fp32.pt"),
            why: "a universal checkpoint holds one fp32.pt per parameter".into(),
        });
    }
    let module = Vec::new();
    Ok(Consolidated { stage, world, model, module, optimizer, model_states, bf16_optimizer: false })
}
