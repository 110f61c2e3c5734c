//! ZeRO stages 1, 2 and 3: the parameters, optimizer state and module weights of a tag directory, laid out
//! as DeepSpeed's `zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint` consolidates them.
//!
//! - Stages 1 and 2 (`mp_rank_00_model_states.pt`, `*zero_pp_rank_R_mp_rank_00_optim_states.pt`): each param
//!   group is one flat fp32 tensor split in equal partitions over the ranks, the last one without its
//!   padding (`single_partition_of_fp32_groups`); the ranks' partitions one after the other hold the group's
//!   parameters in `param_shapes` order, each followed by its `param_alignment_paddings`. Frozen parameters
//!   are whole in the model states file (`frozen_param_fragments`).
//! - Stage 3 (one model states file per rank): each parameter is split in `ceil(numel / world)` elements per
//!   rank, the last ones padding, laid one after the other in every rank's flat groups (`fp32_flat_groups`);
//!   frozen parameters are split the same way in the ranks' `frozen_param_fragments`.
//!
//! The consolidated state dict holds, in this order, the buffers (floating-point ones as float32), the frozen
//! parameters, the trained parameters, and the shared (tied) parameters under each of their names.

use std::collections::HashMap;
use std::path::Path;

use ckpt_tensor::{DType, Tensor, Value};

use crate::error::{Error, Result};
use crate::files::{At, RankFile, groups, load, rank_files};
use crate::gather::{assemble, run, short, zero3_partition};

/// Keys of the model states file that describe the layout (read, not exposed as entries).
pub(crate) const LAYOUT_KEYS: [&str; 6] =
    ["module", "buffer_names", "param_shapes", "frozen_param_shapes", "shared_params", "frozen_param_fragments"];
/// Keys of an optimizer state dict that hold the flat groups and per-group state (exposed per parameter).
const FLAT_KEYS: [&str; 5] = [
    "single_partition_of_fp32_groups",
    "fp32_flat_groups",
    "base_optimizer_state",
    "optimizer_state_dict",
    "param_slice_mappings",
];
/// The keys of the model states file DeepSpeed's engine writes itself; any other top-level key is the client
/// state (`save_checkpoint(client_state=...)`).
pub(crate) const ENGINE_KEYS: [&str; 20] = [
    "module",
    "buffer_names",
    "optimizer",
    "param_shapes",
    "frozen_param_shapes",
    "shared_params",
    "frozen_param_fragments",
    "lr_scheduler",
    "data_sampler",
    "random_ltd",
    "sparse_tensor_module_names",
    "skipped_steps",
    "global_steps",
    "global_samples",
    "dp_world_size",
    "mp_world_size",
    "ds_config",
    "ds_version",
    "checkpoint_parallel_dimensions",
    "ds_checkpoint_version",
];

/// What a tag directory holds, consolidated.
pub(crate) struct Consolidated {
    /// The ZeRO stage.
    pub stage: usize,
    /// The data-parallel world size.
    pub world: usize,
    /// The consolidated state dict (`get_fp32_state_dict_from_zero_checkpoint`'s, in its order).
    pub model: Vec<(String, Tensor)>,
    /// The module's own weights as the model states file stores them (stages 1 and 2; stage 3 stores only
    /// its buffers).
    pub module: Vec<(String, Value)>,
    /// Per-parameter optimizer state (`<param>.exp_avg`, ...) and the optimizer's other values, named
    /// under `optimizer.`.
    pub optimizer: Vec<(String, Value)>,
    /// The model states file (rank 0's), whole.
    pub model_states: Value,
    /// Whether DeepSpeed's `BF16_Optimizer` wrote the optimizer states (not the ZeRO optimizer).
    pub bf16_optimizer: bool,
}

/// The parameters of a param group, in order, with their shapes.
pub(crate) struct Group {
    /// `(name, shape)` of each parameter.
    pub params: Vec<(String, Vec<usize>)>,
}

pub(crate) fn param_groups(states: At<'_>) -> Result<Vec<Group>> {
    let mut out = Vec::new();
    for g in groups(states.get("param_shapes", "param_shapes")?)? {
        let params = g.named()?.into_iter().map(|(n, s)| Ok((n.to_owned(), s.shape()?))).collect::<Result<_>>()?;
        out.push(Group { params });
    }
    Ok(out)
}

pub(crate) fn numel(name: &str, shape: &[usize]) -> Result<usize> {
    ckpt_tensor::checked_numel(shape)
        .ok_or_else(|| Error::ShapeOverflow { name: name.to_owned(), shape: shape.to_vec() })
}

/// The buffers of the model states file, floating-point ones cast to float32 (as `zero_to_fp32` does).
pub(crate) fn buffers(states: At<'_>) -> Result<Vec<(String, Tensor)>> {
    let names: Vec<&str> =
        states.get("buffer_names", "buffer_names")?.list()?.iter().map(At::str).collect::<Result<_>>()?;
    let mut out = Vec::new();
    for (name, v) in states.get("module", "module")?.named()? {
        if !names.contains(&name) {
            continue;
        }
        let t = v.tensor()?;
        let t = if ckpt_tensor::cast::is_castable_float(t.dtype()) {
            ckpt_tensor::cast_float(t, DType::F32)?
        } else {
            t.clone()
        };
        out.push((name.to_owned(), t));
    }
    Ok(out)
}

/// The optimizer's values other than its flat state, named `optimizer.<key>...` (and the param groups of
/// the wrapped optimizer, `optimizer.param_groups.<i>...`).
pub(crate) fn optimizer_values(osd: At<'_>, base: Option<At<'_>>, out: &mut Vec<(String, Value)>) -> Result<()> {
    for (k, v) in osd.named()? {
        if FLAT_KEYS.contains(&k) {
            continue;
        }
        push_leaves(&format!("optimizer.{k}"), v.value, out)?;
    }
    // An elastic checkpoint's base state is a list of per-group states, without param groups.
    let base = base.filter(|b| matches!(b.value, Value::Dict(_)));
    if let Some(groups) = base.map(|b| b.opt("param_groups", "param_groups")).transpose()?.flatten() {
        push_leaves("optimizer.param_groups", groups.value, out)?;
    }
    Ok(())
}

/// Every leaf of `value` (DCP's flattening: mapping keys and list indices joined with `.`), named under
/// `prefix`.
pub(crate) fn push_leaves(prefix: &str, value: &Value, out: &mut Vec<(String, Value)>) -> Result<()> {
    let leaves = ckpt_tensor::leaves(value)?;
    for l in leaves {
        let name = if l.key.is_empty() { prefix.to_owned() } else { format!("{prefix}.{}", l.key) };
        out.push((name, l.value.clone()));
    }
    Ok(())
}

/// The shared parameters (`shared_params`: name → the name of the parameter it is), appended under each
/// alias whose target is in `model`.
/// The module's own (16-bit) copies of the weights, as `module.<name>` entries.
pub(crate) fn module_copies(states: At<'_>) -> Result<Vec<(String, Value)>> {
    Ok(states
        .get("module", "module")?
        .named()?
        .into_iter()
        .map(|(n, v)| (format!("module.{n}"), v.value.clone()))
        .collect())
}

pub(crate) fn shared(states: At<'_>, model: &mut Vec<(String, Tensor)>) -> Result<()> {
    let Some(pairs) = states.opt("shared_params", "shared_params")? else { return Ok(()) };
    if matches!(pairs.value, Value::None) {
        return Ok(());
    }
    for (alias, target) in pairs.named()? {
        let target = target.str()?;
        if let Some(t) = model.iter().find(|(n, _)| n == target).map(|(_, t)| t.clone()) {
            model.push((alias.to_owned(), t));
        }
    }
    Ok(())
}

/// The frozen parameters' shapes, in order (`frozen_param_shapes`, absent or None when there are none).
pub(crate) fn frozen_shapes(states: At<'_>) -> Result<Vec<(String, Vec<usize>)>> {
    match states.opt("frozen_param_shapes", "frozen_param_shapes")? {
        Some(v) if !matches!(v.value, Value::None) => {
            v.named()?.into_iter().map(|(n, s)| Ok((n.to_owned(), s.shape()?))).collect()
        }
        _ => Ok(Vec::new()),
    }
}

/// A tag directory without optimizer states files.
fn no_optim_states(dir: &Path) -> Error {
    Error::MissingFile {
        path: dir.join("zero_pp_rank_0_mp_rank_00_optim_states.pt"),
        why: "a ZeRO checkpoint has one *_optim_states.pt file per data-parallel rank".into(),
    }
}

/// The optimizer states files of the checkpoint in the tag directory `dir` (ZeRO's or `BF16_Optimizer`'s, one
/// per data-parallel rank, in rank order), and each one read.
pub(crate) fn optim_states(dir: &Path, options: &ckpt_torch::ReadOptions) -> Result<(Vec<RankFile>, Vec<Value>)> {
    let optim_files = rank_files(dir, "optim_states")?;
    if optim_files.is_empty() {
        return Err(no_optim_states(dir));
    }
    let optim: Vec<Value> = optim_files.iter().map(|f| load(&f.path, options)).collect::<Result<_>>()?;
    Ok((optim_files, optim))
}

/// Consolidates the ZeRO checkpoint in the tag directory `dir`, whose optimizer states files (one per rank, in
/// rank order, at least one) are `optim_files`, read as `optim`.
pub(crate) fn read(
    dir: &Path,
    optim_files: &[RankFile],
    optim: &[Value],
    options: &ckpt_torch::ReadOptions,
) -> Result<Consolidated> {
    let Some(osd0) = rank_osds(optim_files, optim)?.into_iter().next() else {
        return Err(no_optim_states(dir));
    };
    let stage = osd0.get("zero_stage", "optimizer_state_dict.zero_stage")?.count()?;
    let pc = osd0.get("partition_count", "optimizer_state_dict.partition_count")?;
    let world = match pc.value {
        Value::List(_) | Value::Tuple(_) => {
            pc.list()?.iter().map(At::count).collect::<Result<Vec<_>>>()?.into_iter().max()
        }
        _ => Some(pc.count()?),
    }
    .unwrap_or(0);
    if world != optim_files.len() {
        return Err(Error::RankCount { dir: dir.to_path_buf(), expected: world, found: optim_files.len() });
    }
    // Every rank's file must come from the same save: the same stage and world size.
    for (f, v) in optim_files.iter().zip(optim).skip(1) {
        let osd = At::top(&f.path, v).get("optimizer_state_dict", "optimizer_state_dict")?;
        let s = osd.get("zero_stage", "optimizer_state_dict.zero_stage")?.count()?;
        let pc = osd.get("partition_count", "optimizer_state_dict.partition_count")?;
        let w = match pc.value {
            Value::List(_) | Value::Tuple(_) => {
                pc.list()?.iter().map(At::count).collect::<Result<Vec<_>>>()?.into_iter().max()
            }
            _ => Some(pc.count()?),
        };
        if s != stage || w != Some(world) {
            return Err(Error::Layout {
                path: f.path.clone(),
                at: "optimizer_state_dict".into(),
                expected: "the ZeRO stage and partition count of rank 0's file",
                found: format!("stage {s}, partition count {w:?} (rank 0: stage {stage}, {world} ranks)"),
            });
        }
    }
    match stage {
        1 | 2 => read_stage12(dir, stage, optim_files, optim, options),
        3 => read_stage3(dir, optim_files, optim, options),
        _ => Err(Error::Unsupported {
            path: optim_files[0].path.clone(),
            what: format!("ZeRO stage {stage} (stages 1, 2 and 3 are read)"),
        }),
    }
}

/// The `optimizer_state_dict` of every rank's optimizer states file.
pub(crate) fn rank_osds<'a>(files: &'a [crate::files::RankFile], optim: &'a [Value]) -> Result<Vec<At<'a>>> {
    files
        .iter()
        .zip(optim)
        .map(|(f, v)| At::top(&f.path, v).get("optimizer_state_dict", "optimizer_state_dict"))
        .collect()
}

/// The tensors of a list of flat groups.
pub(crate) fn flat_list<'a>(v: At<'a>) -> Result<Vec<&'a Tensor>> {
    v.list()?.iter().map(At::tensor).collect()
}

/// Per-element and per-group state of the wrapped optimizer: for each group, its state mapping on each rank.
pub(crate) fn group_states<'a>(base: At<'a>, ngroups: usize) -> Result<Vec<At<'a>>> {
    match base.value {
        // Elastic checkpoints: a list of per-group states without padding.
        Value::List(_) | Value::Tuple(_) => base.list(),
        _ => {
            let state = base.get("state", "optimizer state")?;
            let d = state.dict()?;
            (0..ngroups)
                .map(|g| {
                    d.items
                        .iter()
                        .find(|(k, _)| k.as_int() == i64::try_from(g).ok())
                        .map(|(_, value)| At { value, ..state })
                        .ok_or_else(|| Error::Layout {
                            path: state.file.to_path_buf(),
                            at: format!("optimizer state of param group {g}"),
                            expected: "a state for every param group",
                            found: "none".into(),
                        })
                })
                .collect()
        }
    }
}

fn read_stage12(
    dir: &Path,
    stage: usize,
    optim_files: &[crate::files::RankFile],
    optim: &[Value],
    options: &ckpt_torch::ReadOptions,
) -> Result<Consolidated> {
    let model_path = dir.join("mp_rank_00_model_states.pt");
    if !model_path.is_file() {
        return Err(Error::MissingFile {
            path: model_path,
            why: format!("the model states of a ZeRO {stage} checkpoint"),
        });
    }
    let model_states = load(&model_path, options)?;
    let states = At::top(&model_path, &model_states);
    let world = optim.len();
    let osds = rank_osds(optim_files, optim)?;
    let groups = param_groups(states)?;
    let flats: Vec<Vec<&Tensor>> = osds
        .iter()
        .map(|o| flat_list(o.get("single_partition_of_fp32_groups", "single_partition_of_fp32_groups")?))
        .collect::<Result<_>>()?;
    let paddings: Option<Vec<Vec<usize>>> = match osds[0].opt("param_alignment_paddings", "param_alignment_paddings")? {
        Some(p) if !matches!(p.value, Value::None) => {
            Some(p.list()?.iter().map(|g| g.list()?.iter().map(At::count).collect()).collect::<Result<_>>()?)
        }
        _ => None,
    };
    // Per-group state of the wrapped optimizer on every rank.
    let bases: Vec<Option<At<'_>>> =
        osds.iter().map(|o| o.opt("base_optimizer_state", "base_optimizer_state")).collect::<Result<_>>()?;
    let rank_states: Option<Vec<Vec<At<'_>>>> = bases
        .iter()
        .map(|b| b.map(|b| group_states(b, groups.len())))
        .collect::<Option<Result<Vec<_>>>>()
        .transpose()?;
    let elastic_step = osds[0].opt("base_optimizer_state_step", "base_optimizer_state_step")?;

    let mut model = buffers(states)?;
    for (name, _) in frozen_shapes(states)? {
        let frags = states.get("frozen_param_fragments", "frozen_param_fragments")?;
        model.push((name.clone(), frags.get(&name, "frozen_param_fragments[name]")?.tensor()?.clone()));
    }
    let mut opt_entries = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let seq: Vec<Tensor> = flats
            .iter()
            .map(|f| f.get(g).map(|t| (*t).clone()).ok_or_else(|| missing_group(dir, g)))
            .collect::<Result<_>>()?;
        let total: usize = seq.iter().map(Tensor::numel).sum();
        // The wrapped optimizer's flat state (exp_avg, ...) of each rank, cut to the rank's fp32 partition.
        let mut flat_state: Vec<(String, Vec<Tensor>)> = Vec::new();
        let mut scalar_state: Vec<(String, Value)> = Vec::new();
        if let Some(rs) = &rank_states {
            for (key, v) in rs[0].get(g).ok_or_else(|| missing_group(dir, g))?.named()? {
                match v.value.as_tensor() {
                    Some(t) if t.dim() == 1 => {
                        let mut per_rank = Vec::with_capacity(world);
                        for (r, states) in rs.iter().enumerate() {
                            let s = states.get(g).ok_or_else(|| missing_group(dir, g))?;
                            let t = s.get(key, "optimizer state")?.tensor()?;
                            per_rank.push(t.narrow(0, 0, seq[r].numel().min(t.numel()))?);
                        }
                        flat_state.push((key.to_owned(), per_rank));
                    }
                    _ => scalar_state.push((key.to_owned(), v.value.clone())),
                }
            }
            if let Some(step) = elastic_step {
                scalar_state.push(("step".into(), step.value.clone()));
            }
        }
        let mut offset = 0usize;
        for (i, (name, shape)) in group.params.iter().enumerate() {
            let n = numel(name, shape)?;
            let pieces = run(&seq, offset, n)?.ok_or_else(|| short(dir, g, name, offset, n, total))?;
            model.push((name.clone(), assemble(name, DType::F32, shape, pieces)?));
            for (key, per_rank) in &flat_state {
                if let Some(pieces) = run(per_rank, offset, n)? {
                    let t = assemble(name, per_rank[0].dtype(), shape, pieces)?;
                    opt_entries.push((format!("optimizer.state.{name}.{key}"), Value::Tensor(t)));
                }
            }
            for (key, v) in &scalar_state {
                opt_entries.push((format!("optimizer.state.{name}.{key}"), v.clone()));
            }
            offset += n;
            if let Some(p) = paddings.as_ref().and_then(|p| p.get(g)) {
                let padding = p.get(i).copied().ok_or_else(|| Error::FlatGroups {
                    dir: dir.to_path_buf(),
                    group: g,
                    problem: format!("{} parameter alignment paddings for {} parameters", p.len(), group.params.len()),
                })?;
                // A padding is read from the file: past the flat group, the next run (or the check below) fails.
                offset = offset.saturating_add(padding);
            }
        }
        // DeepSpeed's own check: the group is used up to its alignment (2 * world elements).
        let align = |x: usize| x.div_ceil(2 * world).saturating_mul(2 * world);
        if align(offset) != align(total) {
            return Err(Error::FlatGroups {
                dir: dir.to_path_buf(),
                group: g,
                problem: format!("the parameters use {offset} elements of the {total} the ranks' partitions hold"),
            });
        }
    }
    shared(states, &mut model)?;
    let module = module_copies(states)?;
    optimizer_values(osds[0], bases[0], &mut opt_entries)?;
    Ok(Consolidated { stage, world, model, module, optimizer: opt_entries, model_states, bf16_optimizer: false })
}

pub(crate) fn missing_group(dir: &Path, g: usize) -> Error {
    Error::FlatGroups { dir: dir.to_path_buf(), group: g, problem: "a rank has no flat tensor for it".into() }
}

fn read_stage3(
    dir: &Path,
    optim_files: &[crate::files::RankFile],
    optim: &[Value],
    options: &ckpt_torch::ReadOptions,
) -> Result<Consolidated> {
    let world = optim.len();
    let model_files = rank_files(dir, "model_states")?;
    if model_files.len() != world {
        return Err(Error::RankCount { dir: dir.to_path_buf(), expected: world, found: model_files.len() });
    }
    let model_values: Vec<Value> = model_files.iter().map(|f| load(&f.path, options)).collect::<Result<_>>()?;
    let rank_models: Vec<At<'_>> = model_files.iter().zip(&model_values).map(|(f, v)| At::top(&f.path, v)).collect();
    let states = rank_models[0];
    let osds = rank_osds(optim_files, optim)?;
    let groups = param_groups(states)?;
    let flats: Vec<Vec<Tensor>> = osds
        .iter()
        .map(|o| Ok(flat_list(o.get("fp32_flat_groups", "fp32_flat_groups")?)?.into_iter().cloned().collect()))
        .collect::<Result<_>>()?;
    let have: usize = flats[0].iter().map(Tensor::numel).sum();
    for (r, f) in flats.iter().enumerate() {
        let n: usize = f.iter().map(Tensor::numel).sum();
        if n != have || f.len() != flats[0].len() {
            return Err(Error::FlatGroups {
                dir: dir.to_path_buf(),
                group: 0,
                problem: format!(
                    "rank {r} holds {} flat groups of {n} elements, rank 0 {} of {have}",
                    f.len(),
                    flats[0].len()
                ),
            });
        }
    }

    let mut model = buffers(states)?;
    let frozen = frozen_shapes(states)?;
    for (name, shape) in &frozen {
        let mut pieces = Vec::with_capacity(world);
        for m in &rank_models {
            let frag =
                m.get("frozen_param_fragments", "frozen_param_fragments")?.get(name, "frozen_param_fragments[name]")?;
            let t = frag.tensor()?;
            pieces.push(t.reshape(&[t.numel()])?);
        }
        let dtype = pieces.first().map_or(DType::F32, Tensor::dtype);
        model.push((name.clone(), assemble(name, dtype, shape, pieces)?));
    }
    // The wrapped optimizer's state: per rank, per group.
    let inner: Vec<Option<At<'_>>> = osds
        .iter()
        .map(|o| o.opt("optimizer_state_dict", "optimizer_state_dict.optimizer_state_dict"))
        .collect::<Result<_>>()?;
    let rank_states: Option<Vec<Vec<At<'_>>>> = inner
        .iter()
        .map(|b| b.map(|b| group_states(b, groups.len())))
        .collect::<Option<Result<Vec<_>>>>()
        .transpose()?;
    // For each state key: every rank's flat sequence over the groups.
    let mut flat_state: Vec<(String, Vec<Vec<Tensor>>)> = Vec::new();
    let mut scalar_state: HashMap<usize, Vec<(String, Value)>> = HashMap::new();
    if let Some(rs) = &rank_states {
        if let Some(first) = rs[0].first() {
            for (key, v) in first.named()? {
                if v.value.as_tensor().is_some_and(|t| t.dim() == 1) {
                    let mut per_rank = Vec::with_capacity(world);
                    for states in rs {
                        let seq = (0..groups.len())
                            .map(|g| {
                                let s = states.get(g).ok_or_else(|| missing_group(dir, g))?;
                                Ok(s.get(key, "optimizer state")?.tensor()?.clone())
                            })
                            .collect::<Result<Vec<_>>>()?;
                        per_rank.push(seq);
                    }
                    flat_state.push((key.to_owned(), per_rank));
                }
            }
        }
        for (g, s) in rs[0].iter().enumerate() {
            let scalars = s
                .named()?
                .into_iter()
                .filter(|(_, v)| v.value.as_tensor().is_none_or(|t| t.dim() != 1))
                .map(|(k, v)| (k.to_owned(), v.value.clone()))
                .collect();
            scalar_state.insert(g, scalars);
        }
    }
    let mut opt_entries = Vec::new();
    let mut offset = 0usize;
    for (g, group) in groups.iter().enumerate() {
        for (name, shape) in &group.params {
            let n = numel(name, shape)?;
            let part = zero3_partition(n, world);
            let mut pieces = Vec::with_capacity(world);
            for f in &flats {
                let have_r: usize = f.iter().map(Tensor::numel).sum();
                pieces.extend(run(f, offset, part)?.ok_or_else(|| short(dir, g, name, offset, part, have_r))?);
            }
            model.push((name.clone(), assemble(name, DType::F32, shape, pieces)?));
            for (key, per_rank) in &flat_state {
                let mut pieces = Vec::with_capacity(world);
                for seq in per_rank {
                    if let Some(p) = run(seq, offset, part)? {
                        pieces.extend(p);
                    }
                }
                if let Some(dtype) = pieces.first().map(Tensor::dtype) {
                    let t = assemble(name, dtype, shape, pieces)?;
                    opt_entries.push((format!("optimizer.state.{name}.{key}"), Value::Tensor(t)));
                }
            }
            for (key, v) in scalar_state.get(&g).into_iter().flatten() {
                opt_entries.push((format!("optimizer.state.{name}.{key}"), v.clone()));
            }
            offset += part;
        }
    }
    if offset != have {
        return Err(Error::FlatGroups {
            dir: dir.to_path_buf(),
            group: groups.len().saturating_sub(1),
            problem: format!("the parameters use {offset} elements of each rank's {have}"),
        });
    }
    shared(states, &mut model)?;
    // Stage 3 stores the partitioned parameters' placeholders in `module`: only the buffers are weights.
    let buffer_names: Vec<&str> =
        states.get("buffer_names", "buffer_names")?.list()?.iter().map(At::str).collect::<Result<_>>()?;
    let module = states
        .get("module", "module")?
        .named()?
        .into_iter()
        .filter(|(n, _)| buffer_names.contains(n))
        .map(|(n, v)| (format!("module.{n}"), v.value.clone()))
        .collect();
    optimizer_values(osds[0], inner[0], &mut opt_entries)?;
    let stage = 3;
    drop(rank_models);
    let model_states = model_values.into_iter().next().unwrap_or(Value::None);
    Ok(Consolidated { stage, world, model, module, optimizer: opt_entries, model_states, bf16_optimizer: false })
}
