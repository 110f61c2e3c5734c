//! Conversions and reshards split over the processes of a [`Collective`] (an MPI job, threads, one
//! process): [`convert_in`], [`reshard_in`].

use std::path::Path;

use ckpt_collective::Collective;

use crate::adaptor::Source;
use crate::agree::{agree, agree_with_root};
use crate::destination::{self, Plan};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::options::ConvertOptions;
use crate::report::ConvertSummary;
use crate::reshard::ReshardOptions;

/// [`crate::convert`] split over the processes of `group`: every process calls it with the same arguments.
///
/// The target's `W` ranks ([`ConvertOptions::world_size`]) are hosted round-robin by the `K` processes
/// ([`ckpt_collective::host_ranks`]): each process reads the source regions of its ranks and writes their files,
/// and rank 0 writes the shared metadata after every rank's files are durable, then commits the directory
/// atomically. The files are byte for byte those of [`crate::convert`] in one process.
///
/// - distcp targets: each rank writes its `Shard(0)` rows of every tensor (a distcp source is read region
///   by region; other sources are opened lazily, so a rank touches only the pages of its rows).
/// - hfai targets: each rank writes its `PART_{rank:03d}.pt`, reading from the source only the tensors of its
///   part (`ckpt::hfai::save_rank_resolved`; the split is planned from dtypes and shapes).
/// - hf targets: the shards are the files: shard `i` is written by process `i mod K`, which alone reads its
///   tensors (`ckpt::hf::save_entries_in`); process 0 writes the index.
/// - RecIS targets: shard `r` (its data files) is written by the process of rank `r`, reading only the ids of
///   its slice and their rows (`ckpt::recis::save_rank`, or `ckpt::recis::reshard_rank` from a RecIS
///   source); process 0 writes `model.pt`, `extra.pt`, and the merged `index` last.
/// - PyTorch-BigGraph targets: the `i`-th entity partition file is written by process `i mod K`, reading only
///   its rows (`ckpt::pbg::save_rank`); process 0 writes `config.json`, the model file, and the version file
///   last.
/// - one-file targets (torch, safetensors, hf with one shard): the process of rank 0 writes it; the others
///   wait for its verdict.
///
/// Every process returns the same verdict: a failure on any process makes every process return an error
/// ([`Error::RankFailed`](crate::Error::RankFailed) on the others), none is left waiting.
///
/// ```
/// use ckpt::collective::SingleProcess;
/// use ckpt::tensor::{Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let pt = dir.path().join("m.pt");
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap()))]);
/// ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
/// let options = ckpt::ConvertOptions::default().with_world_size(2);
/// ckpt::convert_in(&pt, None, &dir.path().join("dcp"), "distcp".parse()?, &options, &SingleProcess)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`crate::convert`]; [`Error::RankFailed`](crate::Error::RankFailed) when another process failed.
pub fn convert_in(
    src: &Path,
    from: Option<Format>,
    dst: &Path,
    to: Format,
    options: &ConvertOptions,
    group: &dyn Collective,
) -> Result<ConvertSummary> {
    if group.world_size() == 1 {
        return crate::convert::convert(src, from, dst, to, options);
    }
    let prepared = crate::formats::refuse_special(src).and_then(|()| crate::convert::plan(src, from, dst, to, options));
    let (source, target) = agree(group, prepared)?;
    let plan = destination_plan(group, dst, to, options.overwrite)?;
    let written = target.write_in(
        &Source::new(src, source, &options.selection, &options.limits, &options.source),
        plan.path(dst),
        options,
        group,
    );
    finish(group, &plan, dst, options.durability.sync, written)
}

/// Rank 0 checks the destination ([`destination::check`]); every process learns the verdict and the plan.
fn destination_plan(group: &dyn Collective, dst: &Path, to: Format, overwrite: bool) -> Result<Plan> {
    shared_plan(group, dst, (group.rank() == 0).then(|| destination::check(dst, to, overwrite)))
}

/// Rank 0's verdict on a write (`own`, `None` elsewhere: the plan, or why not), shared: every process gets
/// the error or the same plan.
fn shared_plan(group: &dyn Collective, dst: &Path, own: Option<Result<Plan>>) -> Result<Plan> {
    let replace = own.as_ref().map(|r| r.as_ref().map(|p| matches!(p, Plan::Replace(_))).map_err(clone_error));
    let replace = agree_with_root(group, replace, dst)?;
    match own {
        Some(plan) => plan,
        None => destination::plan_of_root(dst, replace),
    }
}

/// An error to broadcast, as text with its fault (the original stays with the caller).
fn clone_error(e: &Error) -> Error {
    Error::RankFailed { rank: 0, fault: e.fault(), message: e.to_string() }
}

/// After every process wrote (`written`, the same verdict everywhere): rank 0 swaps a replacing write's
/// staging path in ([`destination::commit`]), or removes it when the write failed; every process learns
/// the outcome.
fn finish<T>(group: &dyn Collective, plan: &Plan, dst: &Path, sync: bool, written: Result<T>) -> Result<T> {
    if matches!(plan, Plan::Direct) {
        return written;
    }
    let out = match written {
        Ok(out) => out,
        Err(e) => {
            if group.rank() == 0 {
                destination::abandon(plan);
            }
            return Err(e);
        }
    };
    let committed =
        (group.rank() == 0).then(|| destination::commit(plan, dst, sync).inspect_err(|_| destination::abandon(plan)));
    agree_with_root(group, committed, dst)?;
    Ok(out)
}

/// [`crate::reshard`] split over the processes of `group`, as [`convert_in`] splits a conversion, the
/// `world_size` ranks hosted round-robin by the processes: for distcp each rank reads only the regions of its
/// `Shard(0)` box from the source and writes its own data files, rank 0 writes `.metadata` last; for hfai
/// each rank writes its part (`ckpt::hfai::reshard_rank`); for RecIS each rank writes its shard's data
/// files, reading only the ids of its slice (`ckpt::recis::reshard_rank`), rank 0 the merged `index` last.
/// The files are those of [`crate::reshard`] in one process.
///
/// # Errors
/// As [`crate::reshard`]; [`Error::RankFailed`](crate::Error::RankFailed) when another process failed.
pub fn reshard_in(
    src: &Path,
    dst: &Path,
    world_size: usize,
    group: &dyn Collective,
) -> Result<crate::reshard::ReshardSummary> {
    reshard_in_with(src, dst, world_size, &crate::limits::ReadLimits::default(), group)
}

/// [`reshard_in`], reading the source under `limits`.
///
/// # Errors
/// As [`reshard_in`].
pub fn reshard_in_with(
    src: &Path,
    dst: &Path,
    world_size: usize,
    limits: &crate::limits::ReadLimits,
    group: &dyn Collective,
) -> Result<crate::reshard::ReshardSummary> {
    reshard_in_with_options(src, dst, world_size, &ReshardOptions::default().with_limits(*limits), group)
}

/// [`reshard_in`] with its options ([`ReshardOptions`]: the read limits, and whether to replace what
/// stands at `dst`).
///
/// # Errors
/// As [`reshard_in`].
pub fn reshard_in_with_options(
    src: &Path,
    dst: &Path,
    world_size: usize,
    options: &ReshardOptions,
    group: &dyn Collective,
) -> Result<crate::reshard::ReshardSummary> {
    if group.world_size() == 1 {
        return crate::reshard::reshard_with_options(src, dst, world_size, options);
    }
    let limits = &options.limits;
    // Rank 0 checks the request and the destination; everyone learns the outcome before anything is written.
    let checked = (group.rank() == 0).then(|| crate::reshard::check(src, dst, world_size, options.overwrite));
    let plan = shared_plan(group, dst, checked.map(|r| r.map(|c| c.2)))?;
    let (format, adaptor) = crate::reshard::check_format(src)?;
    let (tensors, bytes) = crate::reshard::count(adaptor, src, limits)?;
    let written = adaptor.reshard_in(src, plan.path(dst), world_size, limits, group);
    finish(group, &plan, dst, true, written)?;
    Ok(crate::reshard::ReshardSummary { format, world_size, tensors, bytes })
}
