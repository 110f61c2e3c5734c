//! `torch.distributed.checkpoint` directories, through `ckpt-distcp`.

use std::path::Path;

use std::collections::HashMap;

use ckpt_collective::{Collective, host_ranks, hosted_ranks};
use ckpt_distcp::{RankState, WriteOptions};
use ckpt_tensor::{PathItem, Value};

use crate::adaptor::{Adaptor, Content, Leaf, Source};
#[cfg(any(feature = "hfai", feature = "hf"))]
use crate::adaptor::{Outlined, outline};
use crate::agree::agree;
use crate::checkpoint::Reader;
use crate::error::{At, Cause, Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::Depth;
use crate::options::{ConvertOptions, DcpProfile};
use crate::report::ConvertSummary;
use crate::report::{Progress, VerifyReport, absorb};
use crate::select::Selection;
use crate::source::SourceOptions;

pub(crate) struct Distcp;

impl Cause for ckpt_distcp::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_tensor::Error::from(self).at(path)
    }
}

impl Adaptor for Distcp {
    fn format(&self) -> Format {
        Format::Distcp
    }

    /// The objects of `ckpt_distcp` and its commit points.
    #[cfg(feature = "remote")]
    fn object_layout(&self) -> Option<ckpt_io::storage::ObjectLayout> {
        Some(ckpt_distcp::OBJECT_LAYOUT)
    }

    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        Ok(Box::new(open(path, limits)?))
    }

    /// As [`open`](Adaptor::open), a partial copy read through its fill hook ([`SourceOptions::fills`]).
    fn open_source(&self, path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<Box<dyn Reader>> {
        let options = read_options(path, limits)?.with_fill(source.fill_for(path));
        Ok(Box::new(ckpt_distcp::DcpReader::open_with(path, &options).at(path)?))
    }

    /// Every key with its path from `planner_data`; the state dict they nest into.
    ///
    /// Read as `source` says: a partial copy read through its fill hook ([`SourceOptions::fills`]),
    /// the keys `selection` does not keep left unread (a tensor's items are read, so fetched, when it is).
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        selection: &Selection,
    ) -> Result<Content> {
        let options = read_options(path, limits)?.with_fill(source.fill_for(path));
        content_of(&ckpt_distcp::DcpReader::open_with(path, &options).at(path)?, path, selection)
    }

    /// As [`read_source`](Adaptor::read_source), every tensor stored in several items (which the reader would assemble)
    /// an outline.
    #[cfg(any(feature = "hfai", feature = "hf"))]
    fn read_outlined(&self, path: &Path, limits: &ReadLimits) -> Result<Outlined> {
        let reader = open(path, limits)?;
        let keys: Vec<String> = reader.keys().map(str::to_owned).collect();
        let mut leaves = Vec::with_capacity(keys.len());
        let mut outlines = Vec::new();
        for name in keys {
            let value = match reader.storage_metadata(&name).at(path)? {
                ckpt_distcp::StorageMetadata::Tensor(md) if md.chunks.len() > 1 => {
                    let t = outline(md.properties.dtype, &md.size).at(path)?;
                    outlines.push((t.clone(), name.clone()));
                    Value::Tensor(t)
                }
                _ => reader.read_value(&name).at(path)?,
            };
            leaves.push(Leaf { path: reader.path_of(&name), name, value });
        }
        let content = Content::from_leaves(leaves, path)?;
        Ok(Outlined::new(content, Box::new(reader), outlines))
    }

    /// The source's state dict (a mapping) with DCP's flattening rules, from one process; with a world size
    /// `N > 1`, as `N` ranks holding every tensor of at least `N` rows `Shard(0)` would save it
    /// ([`ckpt_distcp::save_sharded`]). DCP cannot save sparse, quantized, nested or meta tensors (neither
    /// can torch's `dcp.save`): they are reported as dropped.
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let (s, tree, write) = prepare(source, dst, options)?;
        ckpt_distcp::save_sharded(&tree, dst, options.world_size, &write).at(dst)?;
        Ok(s)
    }

    /// Each process builds the `Shard(0)` state of the ranks it hosts ([`ckpt_distcp::shard_state_dict`]:
    /// views of the lazily opened source) and saves them with [`ckpt_distcp::save_rank`].
    fn write_in(
        &self,
        source: &Source<'_>,
        dst: &Path,
        options: &ConvertOptions,
        group: &dyn Collective,
    ) -> Result<ConvertSummary> {
        let world = options.world_size;
        let prepared = prepare(source, dst, options).and_then(|(s, tree, write)| {
            let states = hosted_ranks(group.rank(), group.world_size(), world)
                .into_iter()
                .map(|rank| {
                    if world == 1 {
                        // As `save_sharded` for one rank: the state dict whole, nothing marked as sharded.
                        Ok((tree.clone(), HashMap::new()))
                    } else {
                        ckpt_distcp::shard_state_dict(&tree, rank, world).at(dst)
                    }
                })
                .collect::<Result<Vec<RankState>>>()?;
            Ok((s, states, write))
        });
        let (s, states, write) = agree(group, prepared)?;
        save_hosted(group, &states, dst, world, &write)?;
        Ok(s)
    }

    /// [`ckpt_distcp::verify`]: chunks covering their tensors, items inside their files, CRCs, contents.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        _: Progress<'_>,
    ) -> Result<()> {
        let r = match depth {
            Depth::Structure => ckpt_distcp::verify_structure_with(path, &read_options(path, limits)?),
            Depth::Deep => ckpt_distcp::verify_with(path, &read_options(path, limits)?),
        }
        .at(path)?;
        report.records = r.records;
        report.bytes = r.bytes;
        absorb(report, r);
        Ok(())
    }

    /// Every tensor sharded on its first dimension as `Shard(0)`, each rank's box read from the items it
    /// overlaps ([`ckpt_distcp::reshard`]).
    fn reshard(&self, src: &Path, dst: &Path, world: usize, limits: &ReadLimits) -> Result<()> {
        let options = ckpt_distcp::ReshardOptions::default().with_read(read_options(src, limits)?);
        ckpt_distcp::reshard(src, dst, world, &options).map(|_| ()).at(src)
    }

    /// Each process reads the `Shard(0)` boxes of the ranks it hosts from the items they overlap
    /// ([`ckpt_distcp::DcpReader::shard_state`]) and saves them with [`ckpt_distcp::save_rank`]; as in
    /// [`ckpt_distcp::reshard`], every state is read before anything is written.
    fn reshard_in(
        &self,
        src: &Path,
        dst: &Path,
        world: usize,
        limits: &ReadLimits,
        group: &dyn Collective,
    ) -> Result<()> {
        let states = open(src, limits).and_then(|reader| {
            hosted_ranks(group.rank(), group.world_size(), world)
                .into_iter()
                .map(|rank| reader.shard_state(rank, world).at(src))
                .collect::<Result<Vec<RankState>>>()
        });
        let states = agree(group, states)?;
        save_hosted(group, &states, dst, world, &ckpt_distcp::WriteOptions::default())
    }
}

/// The content of the checkpoint `reader` reads (at `path`): every key with its path from `planner_data`,
/// the keys `selection` does not keep unread (`None`, dropped by the selection).
fn content_of(reader: &ckpt_distcp::DcpReader, path: &Path, selection: &Selection) -> Result<Content> {
    let keys: Vec<String> = reader.keys().map(str::to_owned).collect();
    let mut leaves = Vec::with_capacity(keys.len());
    for name in keys {
        let value = if selection.keeps(&name) { reader.read_value(&name).at(path)? } else { Value::None };
        leaves.push(Leaf { path: reader.path_of(&name), name, value });
    }
    Content::from_leaves(leaves, path)
}

/// The reader options of the checkpoint at `path` under `limits` (pickle limits, `.metadata` size, inflated
/// item size), once the headers of its safetensors files (the Hugging Face layout) are within theirs.
pub(crate) fn read_options(path: &Path, limits: &ReadLimits) -> Result<ckpt_distcp::ReadOptions> {
    super::safetensors_checks::check_safetensors_headers(limits, path)?;
    Ok(ckpt_distcp::ReadOptions::default()
        .with_limits(limits.pickle)
        .with_max_metadata_bytes(limits.max_metadata_bytes)
        .with_max_object_bytes(limits.max_inflated_bytes))
}

/// The checkpoint at `path`, opened under `limits`.
fn open(path: &Path, limits: &ReadLimits) -> Result<ckpt_distcp::DcpReader> {
    ckpt_distcp::DcpReader::open_with(path, &read_options(path, limits)?).at(path)
}

/// The content of `source` as a distcp target takes it: what it writes (counted), the state dict, and the
/// write options. Creates nothing: the save commits `dst` whole.
fn prepare(source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<(ConvertSummary, Value, WriteOptions)> {
    let content = source.content()?;
    source.top_mapping(&content, Format::Distcp)?;
    let profile = match profile_of(options) {
        DcpProfile::MaxCompat => ckpt_distcp::Profile::MaxCompat,
        DcpProfile::Torch213 => ckpt_distcp::Profile::Torch213,
    };
    let write = WriteOptions::default().with_profile(profile).with_durability(options.durability);
    let mut s = ConvertSummary::default();
    let mut flat: Vec<(Vec<PathItem>, Value)> = Vec::new();
    for e in ckpt_tensor::flatten(&content.tree).at(dst)? {
        // DCP saves dense tensors only (`--dense` makes quantized and sparse ones dense before this).
        if matches!(e.value, Value::OpaqueTensor { .. } | Value::Composite(_)) {
            s.dropped.push(e.key);
        } else {
            flat.push((e.path, e.value.clone()));
        }
    }
    for (_, v) in &flat {
        match v.as_tensor() {
            Some(t) => {
                s.tensors += 1;
                s.bytes += t.nbytes() as u64;
            }
            None => s.values += 1,
        }
    }
    let tree = if s.dropped.is_empty() { content.tree } else { ckpt_tensor::unflatten(flat).at(dst)? };
    Ok((s, tree, write))
}

/// Saves the states of the ranks this process hosts (`states[i]` for its `i`-th rank), every process of
/// `group` together forming the `world` ranks of the save; every process returns the same verdict.
fn save_hosted(
    group: &dyn Collective,
    states: &[RankState],
    dst: &Path,
    world: usize,
    write: &WriteOptions,
) -> Result<()> {
    let mine = hosted_ranks(group.rank(), group.world_size(), world);
    let ran = host_ranks(group, world, |g| {
        let i = mine.iter().position(|&r| r == g.rank()).unwrap_or(0);
        match states.get(i) {
            Some((sd, shards)) => ckpt_distcp::save_rank(sd, shards, dst, write, g).map(|_| ()),
            None => Err(ckpt_distcp::Error::RankFailed { rank: g.rank(), message: "has no state".into() }),
        }
    });
    let own = ran.at(dst).and_then(|results| {
        // A rank's own error wins over the "another rank failed" the others report.
        let mut first = None;
        for (_, r) in results {
            match r {
                Err(e) if !matches!(e, ckpt_distcp::Error::RankFailed { .. }) => return Err(e).at(dst),
                Err(e) => first = first.or(Some(e)),
                Ok(()) => {}
            }
        }
        first.map_or(Ok(()), |e| Err(e).at(dst))
    });
    agree(group, own)
}

/// The `.metadata` layout the options ask of a distcp target.
fn profile_of(options: &ConvertOptions) -> DcpProfile {
    match options.target {
        crate::options::TargetOptions::Distcp { profile } => profile,
        _ => DcpProfile::default(),
    }
}

/// `ckpt convert`'s flags for distcp targets.
#[cfg(feature = "cli")]
#[derive(clap::Args, Debug, Default)]
pub struct DistcpArgs {
    /// distcp targets: the `.metadata` layout (default max-compat).
    #[arg(long, value_enum)]
    pub dcp_profile: Option<DcpProfile>,
}

#[cfg(feature = "cli")]
impl DistcpArgs {
    /// The target options these flags give, and the flags given.
    pub(crate) fn target(&self) -> (crate::options::TargetOptions, Option<&'static str>) {
        let given = self.dcp_profile.map(|_| "--dcp-profile");
        (crate::options::TargetOptions::Distcp { profile: self.dcp_profile.unwrap_or_default() }, given)
    }
}
