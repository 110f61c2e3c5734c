//! DeepSpeed's `BF16_Optimizer` (`runtime/bf16_optimizer.py`): what bf16 training with ZeRO stage 1 and fp32
//! gradient accumulation (`"data_types": {"grad_accum_dtype": "fp32"}`) saves instead of the ZeRO
//! optimizer's state. Each rank's `bf16_zero_pp_rank_R_mp_rank_00_optim_states.pt` holds, per param group:
//!
//! - `single_partition_of_fp32_groups[g]`: the rank's equal partition of the group's flat fp32 master
//!   weights, the group's trained parameters one after the other (`param_shapes` order, no padding between
//!   them), padded at the end to a multiple of 2 × world elements: the padding is the end of the last rank's
//!   partition (`group_paddings[g]`, 0 on the other ranks);
//! - `param_slice_mappings[g]`: `name → fragment_address(numel, start)`, where in the rank's partition each
//!   parameter with elements on this rank has them;
//! - `base_optimizer_state`: the wrapped optimizer's `state_dict()`, its per-element state (`exp_avg`, ...) a
//!   flat tensor the size of the partition per group.
//!
//! There is no `zero_stage` (DeepSpeed's own `zero_to_fp32` refuses these files). A parameter's fp32 weights
//! are its fragments on the ranks, in rank order (a partition boundary may cut it); each fragment must sit
//! where the group's layout puts that part of the parameter, and together they must hold all of it. Its
//! optimizer state is cut from the same places of the wrapped optimizer's flat state.

use std::path::Path;

use ckpt_tensor::{DType, Tensor, Value};

use crate::error::{Error, Result};
use crate::files::{At, RankFile, groups, load};
use crate::gather::assemble;
use crate::zero::{
    Consolidated, buffers, flat_list, frozen_shapes, group_states, missing_group, module_copies, numel,
    optimizer_values, param_groups, rank_osds, shared,
};

/// Whether the `optimizer_state_dict` of an optimizer states file is `BF16_Optimizer`'s: flat fp32
/// partitions and `param_slice_mappings`, no `zero_stage`.
pub(crate) fn is_bf16_optimizer(osd: At<'_>) -> Result<bool> {
    Ok(osd.opt("zero_stage", "optimizer_state_dict.zero_stage")?.is_none()
        && osd.opt("param_slice_mappings", "optimizer_state_dict.param_slice_mappings")?.is_some()
        && osd
            .opt("single_partition_of_fp32_groups", "optimizer_state_dict.single_partition_of_fp32_groups")?
            .is_some())
}

/// Where a rank's partition holds a piece of a parameter (DeepSpeed's `fragment_address`).
#[derive(Debug, Clone, Copy)]
struct Fragment {
    start: usize,
    numel: usize,
}

/// A `fragment_address(numel, start)`: a dataclass, pickled as an inert object whose state holds its fields.
fn fragment(v: At<'_>) -> Result<Fragment> {
    let state = match v.value {
        Value::Object(o) => o.state.as_ref(),
        _ => None,
    };
    let Some(state) = state else {
        return Err(Error::Layout {
            path: v.file.to_path_buf(),
            at: v.at.to_owned(),
            expected: "a fragment_address(numel, start)",
            found: v.value.type_name().to_owned(),
        });
    };
    let fields = At { value: state, ..v };
    Ok(Fragment {
        start: fields.get("start", "param_slice_mappings: fragment_address.start")?.count()?,
        numel: fields.get("numel", "param_slice_mappings: fragment_address.numel")?.count()?,
    })
}

/// The data-parallel world size an optimizer state dict declares (`partition_count`: one per param group).
fn partition_count(osd: At<'_>) -> Result<Vec<usize>> {
    let pc = osd.get("partition_count", "optimizer_state_dict.partition_count")?;
    match pc.value {
        Value::List(_) | Value::Tuple(_) => pc.list()?.iter().map(At::count).collect(),
        _ => Ok(vec![pc.count()?]),
    }
}

/// The ZeRO stage the saving engine's configuration names (`ds_config.zero_optimization.stage`), 0 when it
/// names none.
fn configured_stage(top: At<'_>) -> Result<usize> {
    let stage = top
        .opt("ds_config", "ds_config")?
        .and_then(|c| c.value.as_dict())
        .and_then(|c| c.get("zero_optimization"))
        .and_then(Value::as_dict)
        .and_then(|z| z.get("stage"))
        .and_then(Value::as_int)
        .and_then(|s| usize::try_from(s).ok());
    Ok(stage.unwrap_or(0))
}

/// One rank's view of the checkpoint: its partition, padding and fragments of each param group.
struct Rank<'a> {
    flats: Vec<&'a Tensor>,
    paddings: Vec<usize>,
    mappings: Vec<Vec<(&'a str, At<'a>)>>,
}

fn rank<'a>(osd: At<'a>) -> Result<Rank<'a>> {
    let flats = flat_list(osd.get("single_partition_of_fp32_groups", "single_partition_of_fp32_groups")?)?;
    let paddings = osd
        .get("group_paddings", "optimizer_state_dict.group_paddings")?
        .list()?
        .iter()
        .map(At::count)
        .collect::<Result<_>>()?;
    let mappings = groups(osd.get("param_slice_mappings", "optimizer_state_dict.param_slice_mappings")?)?
        .iter()
        .map(At::named)
        .collect::<Result<_>>()?;
    Ok(Rank { flats, paddings, mappings })
}

/// Reads and consolidates the `BF16_Optimizer` checkpoint in the tag directory `dir`, whose optimizer states
/// files (one per rank, in rank order) are `optim_files`, read as `optim`.
pub(crate) fn read(
    dir: &Path,
    optim_files: &[RankFile],
    optim: &[Value],
    options: &ckpt_torch::ReadOptions,
) -> Result<Consolidated> {
    let osds = rank_osds(optim_files, optim)?;
    let counts = osds.iter().map(|o| partition_count(*o)).collect::<Result<Vec<_>>>()?;
    let world = counts.first().and_then(|c| c.iter().copied().max()).unwrap_or(0);
    if world != optim_files.len() {
        return Err(Error::RankCount { dir: dir.to_path_buf(), expected: world, found: optim_files.len() });
    }
    for ((f, c), osd) in optim_files.iter().zip(&counts).zip(&osds).skip(1) {
        if Some(c) != counts.first() || !is_bf16_optimizer(*osd)? {
            return Err(Error::Layout {
                path: f.path.clone(),
                at: "optimizer_state_dict".into(),
                expected: "BF16_Optimizer's state with the partition count of rank 0's file",
                found: format!("partition count {c:?} (rank 0: {:?})", counts.first()),
            });
        }
    }
    let model_path = dir.join("mp_rank_00_model_states.pt");
    if !model_path.is_file() {
        return Err(Error::MissingFile {
            path: model_path,
            why: "the model states of a BF16_Optimizer checkpoint".into(),
        });
    }
    let model_states = load(&model_path, options)?;
    let states = At::top(&model_path, &model_states);
    let groups = param_groups(states)?;
    let ranks = osds.iter().map(|o| rank(*o)).collect::<Result<Vec<_>>>()?;
    let bases: Vec<Option<At<'_>>> =
        osds.iter().map(|o| o.opt("base_optimizer_state", "base_optimizer_state")).collect::<Result<_>>()?;
    let rank_states: Option<Vec<Vec<At<'_>>>> = bases
        .iter()
        .map(|b| b.map(|b| group_states(b, groups.len())))
        .collect::<Option<Result<Vec<_>>>>()
        .transpose()?;

    let mut model = buffers(states)?;
    for (name, _) in frozen_shapes(states)? {
        let frags = states.get("frozen_param_fragments", "frozen_param_fragments")?;
        model.push((name.clone(), frags.get(&name, "frozen_param_fragments[name]")?.tensor()?.clone()));
    }
    let mut opt_entries = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let flat_problem = |problem: String| Error::FlatGroups { dir: dir.to_path_buf(), group: g, problem };
        // Every rank's partition of the group: the same size, the padding within it.
        let mut partitions = Vec::with_capacity(world);
        let mut padding = 0usize;
        for (r, rk) in ranks.iter().enumerate() {
            let flat = rk.flats.get(g).copied().ok_or_else(|| missing_group(dir, g))?;
            let pad =
                rk.paddings.get(g).copied().ok_or_else(|| {
                    flat_problem(format!("rank {r}'s group_paddings has {} entries", rk.paddings.len()))
                })?;
            if flat.dim() != 1 || flat.dtype() != DType::F32 || pad > flat.numel() {
                return Err(flat_problem(format!(
                    "rank {r}'s partition is {} of shape {:?} with a padding of {pad}; expected a 1-D float32 \
                     tensor at least that long",
                    flat.dtype(),
                    flat.shape()
                )));
            }
            padding += pad;
            partitions.push(flat);
        }
        let size = partitions.first().map_or(0, |t| t.numel());
        if let Some((r, t)) = partitions.iter().enumerate().find(|(_, t)| t.numel() != size) {
            return Err(flat_problem(format!("rank {r}'s partition holds {} elements, rank 0's {size}", t.numel())));
        }
        let held = size.saturating_mul(world).saturating_sub(padding);
        let wanted =
            group.params.iter().try_fold(0usize, |acc, (n, s)| Ok::<_, Error>(acc.saturating_add(numel(n, s)?)))?;
        if held != wanted {
            return Err(flat_problem(format!(
                "the parameters have {wanted} elements, the ranks' partitions hold {held} ({world} × {size} less \
                 {padding} padding)"
            )));
        }
        for (r, rk) in ranks.iter().enumerate() {
            let mapping = rk.mappings.get(g).ok_or_else(|| missing_group(dir, g))?;
            if let Some((name, _)) = mapping.iter().find(|(n, _)| !group.params.iter().any(|(p, _)| p == n)) {
                return Err(flat_problem(format!(
                    "rank {r}'s param_slice_mappings names {name:?}, which param_shapes does not list in this group"
                )));
            }
        }
        // The wrapped optimizer's flat state (exp_avg, ...) of each rank, and its per-group scalars (step).
        let mut flat_state: Vec<(String, Vec<Tensor>)> = Vec::new();
        let mut scalar_state: Vec<(String, Value)> = Vec::new();
        if let Some(rs) = &rank_states {
            for (key, v) in rs[0].get(g).ok_or_else(|| missing_group(dir, g))?.named()? {
                match v.value.as_tensor() {
                    Some(t) if t.dim() == 1 => {
                        let per_rank = rs
                            .iter()
                            .map(|states| {
                                let s = states.get(g).ok_or_else(|| missing_group(dir, g))?;
                                Ok(s.get(key, "base_optimizer_state.state")?.tensor()?.clone())
                            })
                            .collect::<Result<_>>()?;
                        flat_state.push((key.to_owned(), per_rank));
                    }
                    _ => scalar_state.push((key.to_owned(), v.value.clone())),
                }
            }
        }
        let mut offset = 0usize;
        for (name, shape) in &group.params {
            let n = numel(name, shape)?;
            let mut pieces = Vec::new();
            let mut state_pieces: Vec<Vec<Tensor>> = vec![Vec::new(); flat_state.len()];
            let mut got = 0usize;
            for (r, rk) in ranks.iter().enumerate() {
                let Some((_, at)) = rk.mappings.get(g).and_then(|m| m.iter().find(|(n, _)| n == name)) else {
                    continue;
                };
                let f = fragment(*at)?;
                let end = f.start.checked_add(f.numel).filter(|&e| e <= size);
                let place = r.checked_mul(size).and_then(|x| x.checked_add(f.start));
                if end.is_none() || f.numel == 0 {
                    return Err(flat_problem(format!(
                        "{name}: rank {r}'s fragment (start {}, numel {}) is not within its partition of {size}",
                        f.start, f.numel
                    )));
                }
                if place != Some(offset + got) {
                    return Err(flat_problem(format!(
                        "{name}: rank {r}'s fragment starts at element {} of the group's flat weights, where \
                         param_shapes' layout puts element {} (its element {got})",
                        place.unwrap_or(usize::MAX),
                        offset + got
                    )));
                }
                pieces.push(partitions[r].narrow(0, f.start, f.numel)?);
                for ((_, per_rank), out) in flat_state.iter().zip(&mut state_pieces) {
                    if let Some(t) = per_rank.get(r) {
                        out.push(t.narrow(0, f.start, f.numel)?);
                    }
                }
                got += f.numel;
            }
            if got != n {
                return Err(flat_problem(format!(
                    "{name}: the ranks' param_slice_mappings hold {got} of its {n} elements"
                )));
            }
            model.push((name.clone(), assemble(name, DType::F32, shape, pieces)?));
            for ((key, per_rank), pieces) in flat_state.iter().zip(state_pieces) {
                let dtype = per_rank.first().map_or(DType::F32, Tensor::dtype);
                let t = assemble(name, dtype, shape, pieces)?;
                opt_entries.push((format!("optimizer.state.{name}.{key}"), Value::Tensor(t)));
            }
            for (key, v) in &scalar_state {
                opt_entries.push((format!("optimizer.state.{name}.{key}"), v.clone()));
            }
            offset += n;
        }
    }
    shared(states, &mut model)?;
    let module = module_copies(states)?;
    optimizer_values(osds[0], bases[0], &mut opt_entries)?;
    let stage = configured_stage(At::top(&optim_files[0].path, &optim[0]))?;
    Ok(Consolidated { stage, world, model, module, optimizer: opt_entries, model_states, bf16_optimizer: true })
}
