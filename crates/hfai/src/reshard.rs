//! Resharding: rewriting an N-part checkpoint as M parts, offline, from one process ([`reshard`]) or one
//! call per rank ([`reshard_rank`]).

use std::path::Path;

use ckpt_collective::Collective;
use ckpt_io::{ReshardReport, SaveReport};
use ckpt_tensor::Value;
use ckpt_torch::ReadOptions;

use crate::contents::Item;
use crate::error::{Error, Result};
use crate::reader::read_merged;
use crate::writer::{Plan, WriteOptions, write_rank};

/// Options for [`reshard`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReshardOptions {
    /// How the source parts are read.
    pub read: ReadOptions,
    /// How the new parts are written (the chunking threshold, torch options).
    pub write: WriteOptions,
    /// Per model (in save order), the names of its buffers, which go whole into part 0 as hfai puts them.
    /// An hfai checkpoint does not record which entries are buffers; entries not named here are spread over
    /// the parts like parameters, which every loader accepts (it takes the union of the parts).
    pub buffers: Vec<Vec<String>>,
}

impl ReshardOptions {
    /// These options with `write` as the write options.
    #[must_use]
    pub fn with_write(mut self, write: WriteOptions) -> Self {
        self.write = write;
        self
    }

    /// These options with `names` as model `model`'s buffers.
    #[must_use]
    pub fn with_buffers<S: Into<String>>(mut self, model: usize, names: impl IntoIterator<Item = S>) -> Self {
        if self.buffers.len() <= model {
            self.buffers.resize(model + 1, Vec::new());
        }
        if let Some(b) = self.buffers.get_mut(model) {
            b.extend(names.into_iter().map(Into::into));
        }
        self
    }
}

/// Rewrites the checkpoint in `src` as `world_size` parts in `dst`, from one process. `dst` may be `src`: the
/// new parts are staged beside it and swapped in whole ([`save`](crate::save)), while the old ones stay
/// mapped until the reshard is done.
///
/// The result is what hfai's `save` would write on `world_size` ranks for the same state: small entries
/// re-partitioned over the new parts, large tensors re-chunked with `torch.chunk`, `others` in part 0.
/// Nothing is materialised that does not need it: small entries are written straight from the source's
/// memory maps, and a new chunk that lies inside one stored chunk is a window of it; only new chunks
/// spanning stored chunks are copied (see [`ReshardReport::copied_bytes`](ckpt_io::ReshardReport::copied_bytes)).
///
/// # Errors
/// Any error of [`HfaiReader::open`](crate::HfaiReader::open) for `src` or of [`save`](crate::save)
/// for `dst`; [`Error::UnknownBuffer`] for a buffer name that is not an entry of its model.
pub fn reshard(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    world_size: usize,
    options: &ReshardOptions,
) -> Result<ReshardReport> {
    let dst = dst.as_ref();
    let (from, counts, plan) = plan(src.as_ref(), world_size, options)?;
    plan.write_all(dst, &options.write)?;
    let mut report = ReshardReport::new(from, world_size, options.write.report(counts, dst, world_size));
    report.copied_bytes = Some(plan.copied_bytes());
    Ok(report)
}

/// [`reshard`] as one rank of a job of `group.world_size()` ranks (the new part count), one call per rank
/// (threads, processes under MPI, [`ckpt_collective::host_ranks`]): every rank plans the split from the source's
/// parts (their memory maps; nothing is read but the pickles), rank `r` writes `PART_{r:03d}.pt`, reading
/// only its entries and chunks, into the staging directory beside `dst`; rank 0 checks every part on disk
/// and swaps the directory in. The parts are [`reshard`]'s, byte for byte. Every rank returns the same
/// verdict: a failure on any rank is an error on every rank.
///
/// ```
/// use ckpt_collective::ThreadGroup;
/// # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/hfai/single_n3/ckpt");
/// let dir = tempfile::tempdir().unwrap();
/// let (one, two) = (dir.path().join("one"), dir.path().join("two"));
/// let options = ckpt_hfai::ReshardOptions::default();
/// ckpt_hfai::reshard(fixture, &one, 2, &options).unwrap();
/// std::thread::scope(|s| {
///     for g in ThreadGroup::new(2) {
///         let (two, options) = (&two, &options);
///         s.spawn(move || ckpt_hfai::reshard_rank(fixture, two, options, &g).unwrap());
///     }
/// });
/// for part in ["PART_000.pt", "PART_001.pt"] {
///     assert_eq!(std::fs::read(one.join(part)).unwrap(), std::fs::read(two.join(part)).unwrap());
/// }
/// ```
///
/// # Errors
/// As [`reshard`]; [`Error::RankFailed`] naming the rank that failed on the others.
pub fn reshard_rank(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &ReshardOptions,
    group: &dyn Collective,
) -> Result<ReshardReport> {
    let dst = dst.as_ref();
    let planned = plan(src.as_ref(), group.world_size(), options);
    let (from, counts) = planned.as_ref().map(|(from, counts, _)| (*from, counts.clone())).unwrap_or_default();
    write_rank(planned.map(|(_, _, plan)| plan), dst, &options.write, group, &|t| Ok(t.clone()))?;
    Ok(ReshardReport::new(from, group.world_size(), options.write.report(counts, dst, group.world_size())))
}

/// The source's part count, its contents' counts, and the split of its contents into `world_size` parts.
fn plan(src: &Path, world_size: usize, options: &ReshardOptions) -> Result<(usize, SaveReport, Plan)> {
    let merged = read_merged(src, &options.read)?;
    let mut contents = merged.contents;
    for (m, names) in options.buffers.iter().enumerate() {
        let Some(model) = contents.models.get_mut(m) else {
            if let Some(name) = names.first() {
                return Err(Error::UnknownBuffer { model: m, name: name.clone() });
            }
            continue;
        };
        for name in names {
            let i = model
                .entries
                .iter()
                .position(|(k, _)| k.as_str() == Some(name))
                .ok_or_else(|| Error::UnknownBuffer { model: m, name: name.clone() })?;
            let (k, item) = model.entries.remove(i);
            let v = match item {
                Item::Value(v) => v,
                Item::Chunked(c) => Value::Tensor(c.whole()?.0),
            };
            model.buffers.push((k, v));
        }
    }
    let counts = contents.report();
    Ok((merged.world_size, counts, Plan::new(contents, world_size, options.write.large_size)?))
}
