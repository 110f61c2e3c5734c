//! RecIS checkpoint directories (or an output root with a `checkpoint` list: its latest checkpoint, by
//! [`ckpt_recis::checkpoint_dir`]'s rule), through `ckpt-recis`.

use std::path::Path;

use ckpt_collective::{Collective, host_ranks};
use ckpt_tensor::{CheckpointRead, PathItem};

use crate::adaptor::read_all;
use crate::adaptor::{Adaptor, Content, KeyedRows, Layout, Leaf, Source, count};
use crate::agree::{agree, agree_with_root, hosted_outcome};
use crate::checkpoint::{Checkpoint, Reader};
use crate::error::{At, Cause, Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::ConvertOptions;
use crate::options::Depth;
use crate::report::ConvertSummary;
use crate::report::{Progress, VerifyReport, absorb};
use crate::select::Selection;
use crate::source::SourceOptions;

pub(crate) struct Recis;

impl Cause for ckpt_recis::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_tensor::Error::from(self).at(path)
    }
}

impl Adaptor for Recis {
    fn format(&self) -> Format {
        Format::Recis
    }

    /// The objects of `ckpt_recis` and its commit points.
    #[cfg(feature = "remote")]
    fn object_layout(&self) -> Option<ckpt_io::storage::ObjectLayout> {
        Some(ckpt_recis::OBJECT_LAYOUT)
    }

    /// Its reader fills what it reads: its data files' and `.pt` files' bytes as they are read.
    #[cfg(feature = "remote")]
    fn reads_partial_copy(&self) -> bool {
        true
    }

    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        Ok(Box::new(open(path, limits)?))
    }

    /// As [`open`](Adaptor::open), a partial copy read through its fill hook ([`SourceOptions::fills`]):
    /// each data file's blocks and each `.pt` file's tensor records filled as they are read.
    fn open_source(&self, path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<Box<dyn Reader>> {
        Ok(Box::new(open_filled(path, limits, source)?))
    }

    /// The RecIS-shaped state dict ([`ckpt_recis::RecisReader::state_dict`]: `sparse`, `model`, `extra`,
    /// `io_state_<s>`), its leaves named as the reader's entries: the serializer's tensors by their own
    /// names, `model.pt`'s leaves bare, the others under `extra/` and `io_state_<s>/`.
    ///
    /// Read as `source` says: a partial copy read through its fill hook ([`SourceOptions::fills`]):
    /// the state dict's tensors are made when their bytes are read (a table slot's slices concatenated
    /// then), so a selection's dropped tensors fetch nothing.
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        _selection: &Selection,
    ) -> Result<Content> {
        let tree = open_filled(path, limits, source)?.state_dict().at(path)?;
        let mut leaves = Vec::new();
        for (key, value) in tree.as_dict().map(|d| d.items.as_slice()).unwrap_or_default() {
            let key = key.as_str().unwrap_or_default();
            if let ("sparse", Some(sparse)) = (key, value.as_dict()) {
                for (name, t) in &sparse.items {
                    let name = name.as_str().unwrap_or_default().to_owned();
                    let path = vec![PathItem::Key("sparse".into()), PathItem::Key(name.clone())];
                    leaves.push(Leaf { name, path, value: t.clone() });
                }
                continue;
            }
            let prefix = if key == "model" { String::new() } else { format!("{key}/") };
            for l in ckpt_tensor::leaves(value).at(path)? {
                let mut item_path = vec![PathItem::Key(key.to_owned())];
                item_path.extend(l.path);
                leaves.push(Leaf { name: format!("{prefix}{}", l.key), path: item_path, value: l.value.clone() });
            }
        }
        Ok(Content { tree, leaves })
    }

    /// From a RecIS source without a new `slice_size`: re-sharded from the files themselves
    /// ([`ckpt_recis::reshard`]: the sparse part, `model.pt` and `extra.pt`; io states belong to the old
    /// workers and are dropped). From any other source: the state dict laid out as RecIS lays it out
    /// ([`ckpt_recis::save`]), in as many shards as the world size.
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        if copies_files(source, options) {
            return reshard_files(source.path, dst, options, source.limits);
        }
        let content = source.content()?;
        source.top_mapping(&content, Format::Recis)?;
        let report = match ckpt_recis::save(&content.tree, dst, &write_options(options)) {
            Ok(r) => r,
            Err(e) => return Err(save_error(source, dst, e)),
        };
        Ok(summary(&content, &report))
    }

    /// Each process writes the shards of the ranks it hosts (shard `r` by the rank `r` of a job of
    /// [`ConvertOptions::world_size`] ranks, [`host_ranks`]), reading from the source only the ids of its
    /// slice and their rows: from a RecIS source [`ckpt_recis::reshard_rank`], from any other
    /// [`ckpt_recis::save_rank`] (the state dict's tensors are windows of the lazily opened source). Rank 0
    /// writes `model.pt`, `extra.pt`, then the merged `index` last, and commits.
    fn write_in(
        &self,
        source: &Source<'_>,
        dst: &Path,
        options: &ConvertOptions,
        group: &dyn Collective,
    ) -> Result<ConvertSummary> {
        let world = options.world_size;
        if copies_files(source, options) {
            let (src, limits) = (source.path, source.limits);
            let parallel = agree(group, source_parallel(src, options, limits))?;
            let reshard = ckpt_recis::ReshardOptions::default()
                .with_write(
                    ckpt_recis::WriteOptions::default().with_parallel(parallel).with_durability(options.durability),
                )
                .with_read(read_options(limits));
            let ran = host_ranks(group, world, |g| ckpt_recis::reshard_rank(src, dst, &reshard, g));
            agree(group, hosted_outcome(ran, is_other_rank, dst))?;
            return files_summary(src, dst, limits);
        }
        let content = agree(
            group,
            source.content().and_then(|c| {
                source.top_mapping(&c, Format::Recis)?;
                Ok(c)
            }),
        )?;
        let write = write_options(options);
        let ran = host_ranks(group, world, |g| ckpt_recis::save_rank(&content.tree, dst, &write, g));
        let ran = ran.map(|all| {
            all.into_iter().map(|(r, out)| (r, out.map_err(|e| save_error(source, dst, e)))).collect::<Vec<_>>()
        });
        let reports = agree(group, hosted_outcome(ran, |e| matches!(e, Error::RankFailed { .. }), dst))?;
        // Rank 0's report, on the process that hosts it, goes to every process (one may host no rank).
        let own = (group.rank() == 0).then(|| {
            reports.first().map(|r| summary(&content, r)).ok_or_else(|| Error::RankFailed {
                rank: 0,
                fault: ckpt_tensor::Fault::Io,
                message: "hosted no rank of the save".into(),
            })
        });
        agree_with_root(group, own, dst)
    }

    /// Every `torch.save` file's record CRC-32s ([`ckpt_recis::verify`]); the index, tensor keys and data
    /// files validated by opening; every entry read.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        progress: Progress<'_>,
    ) -> Result<()> {
        let ck = self.checkpoint(path, limits)?;
        if depth == Depth::Deep {
            absorb(report, ckpt_recis::verify(path).at(path)?);
        }
        read_all(&ck, depth, report, progress);
        Ok(())
    }

    /// RecIS's entries under the names of the state dict it reads as ([`ckpt_recis::RecisReader::state_dict`]:
    /// the serializer's tensors under `sparse.`, `model.pt`'s bare names under `model.`, `extra/k` as
    /// `extra.k`, `io_state_<s>/k` as `io_state_<s>.k`); every hash table's `<table>@<slot>` rows keyed by
    /// its `<table>@id`, their order that of the shard layout ([`layout_of`]).
    fn layout(&self, ck: &Checkpoint, limits: &ReadLimits) -> Result<Layout> {
        // The reader the checkpoint was opened with (a partial copy's, with its fill hook), else reopened.
        if let Some(reader) = ck.downcast_ref::<ckpt_recis::RecisReader>() {
            return Ok(layout_of(reader));
        }
        Ok(layout_of(&open(ck.path(), limits)?))
    }

    /// The checkpoint directory (an output root's latest checkpoint).
    fn manifest_dir(&self, path: &Path) -> std::path::PathBuf {
        ckpt_recis::checkpoint_dir(path).unwrap_or_else(|_| path.to_path_buf())
    }

    /// Ids re-partitioned by RecIS's loader rule, `model.pt` and `extra.pt` copied ([`ckpt_recis::reshard`]).
    fn reshard(&self, src: &Path, dst: &Path, world: usize, limits: &ReadLimits) -> Result<()> {
        let options = ckpt_recis::ReshardOptions::default().with_read(read_options(limits));
        ckpt_recis::reshard(src, dst, world, &options).map(|_| ()).at(src)
    }

    /// Each process writes the new shards of the ranks it hosts, reading only their ids and rows
    /// ([`ckpt_recis::reshard_rank`]); rank 0 copies `model.pt` and `extra.pt` and writes `index` last.
    fn reshard_in(
        &self,
        src: &Path,
        dst: &Path,
        world: usize,
        limits: &ReadLimits,
        group: &dyn Collective,
    ) -> Result<()> {
        let options = ckpt_recis::ReshardOptions::default().with_read(read_options(limits));
        let ran = host_ranks(group, world, |g| ckpt_recis::reshard_rank(src, dst, &options, g));
        agree(group, hosted_outcome(ran, is_other_rank, src).map(|_| ()))
    }
}

/// The layout of the RecIS checkpoint `reader` reads ([`Adaptor::layout`]).
fn layout_of(reader: &ckpt_recis::RecisReader) -> Layout {
    let mut layout = Layout::default();
    let sparse = reader.sparse();
    let names = sparse.tensor_names();
    for name in &names {
        layout.aliases.insert((*name).to_owned(), vec![format!("sparse.{name}")]);
    }
    let parts = [("model", "", reader.model()), ("extra", "extra/", reader.extra())];
    let io_states =
        reader.io_states().iter().map(|(s, v)| (format!("io_state_{s}"), format!("io_state_{s}/"), Some(v)));
    let parts = parts.into_iter().map(|(k, p, v)| (k.to_owned(), p.to_owned(), v)).chain(io_states);
    for (key, prefix, value) in parts {
        // `model.pt`'s bare names are already the source's; `extra.pt` and the io states hold a source's
        // other top-level items.
        for l in value.and_then(|v| ckpt_tensor::leaves(v).ok()).unwrap_or_default() {
            let mut aliases = vec![format!("{key}.{}", l.key)];
            if !prefix.is_empty() {
                aliases.push(l.key.clone());
            }
            layout.aliases.insert(format!("{prefix}{}", l.key), aliases);
        }
    }
    // A hash table's ids and the rows of each of its slots (`<table>@<slot>`), in the order of its shards.
    for table in sparse.children() {
        let ids = format!("{table}{ID_SUFFIX}");
        if !names.contains(&ids.as_str()) {
            continue;
        }
        let head = format!("{table}@");
        let rows = names.iter().filter(|n| n.starts_with(&head) && **n != ids).map(|n| (*n).to_owned()).collect();
        layout.keyed.push(KeyedRows { table: table.clone(), ids, rows });
    }
    layout
}

/// The slot of a hash table's ids: the entry `<table>@id`.
const ID_SUFFIX: &str = "@id";

/// Whether a conversion into RecIS copies a RecIS source by its own files (resharding them) instead of
/// reading its content.
fn copies_files(source: &Source<'_>, options: &ConvertOptions) -> bool {
    source.format() == Format::Recis && recis_of(options).1.is_none() && source.is_whole()
}

/// Another rank's failure, as a rank reports it.
fn is_other_rank(e: &ckpt_recis::Error) -> bool {
    matches!(e, ckpt_recis::Error::ShardFailed { .. })
}

/// The write options of a conversion into RecIS.
fn write_options(options: &ConvertOptions) -> ckpt_recis::WriteOptions {
    let mut write =
        ckpt_recis::WriteOptions::default().with_world_size(options.world_size).with_durability(options.durability);
    if let Some(parallel) = recis_of(options).0 {
        write = write.with_parallel(parallel);
    }
    if let Some(size) = recis_of(options).1 {
        write = write.with_slice_size(size);
    }
    write
}

/// A save's error: a state dict RecIS cannot hold is an unsupported conversion; another rank's failure is
/// [`Error::RankFailed`].
fn save_error(source: &Source<'_>, dst: &Path, e: ckpt_recis::Error) -> Error {
    match e {
        ckpt_recis::Error::StateDict { reason } => {
            Error::UnsupportedConversion { from: source.format(), to: Format::Recis, reason }
        }
        ckpt_recis::Error::ShardFailed { shard, message } => {
            Error::RankFailed { rank: shard, fault: ckpt_tensor::Fault::Io, message }
        }
        e => e.at(dst),
    }
}

/// What a conversion into RecIS from `content` wrote.
fn summary(content: &Content, report: &ckpt_recis::SaveReport) -> ConvertSummary {
    let dropped = |l: &Leaf| matches!(l.path.first(), Some(PathItem::Key(k)) if report.dropped.contains(k));
    let (lost, kept): (Vec<&Leaf>, Vec<&Leaf>) = content.leaves.iter().partition(|l| dropped(l));
    let mut s = count(kept);
    s.dropped = lost.into_iter().map(|l| l.name.clone()).collect();
    s
}

/// The data files per shard of a RecIS to RecIS conversion: the options', else the source's.
fn source_parallel(src: &Path, options: &ConvertOptions, limits: &ReadLimits) -> Result<usize> {
    match recis_of(options).0 {
        Some(p) => Ok(p),
        None => {
            let before = open(src, limits)?;
            Ok(before.sparse().parallel().unwrap_or(ckpt_recis::WriteOptions::default().parallel))
        }
    }
}

/// The checkpoint at `path` under `limits`: its `.pt` files' pickle limits, its data files' header bound.
fn open(path: &Path, limits: &ReadLimits) -> Result<ckpt_recis::RecisReader> {
    ckpt_recis::RecisReader::open_with(path, &read_options(limits)).at(path)
}

/// [`open`], a partial copy read through its fill hook ([`SourceOptions::fill_for`]).
fn open_filled(path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<ckpt_recis::RecisReader> {
    let options = read_options(limits).with_fill(source.fill_for(path));
    ckpt_recis::RecisReader::open_with(path, &options).at(path)
}

/// The reader options under `limits`: the `.pt` files' pickle limits, the data files' header bound.
fn read_options(limits: &ReadLimits) -> ckpt_recis::ReadOptions {
    ckpt_recis::ReadOptions::default()
        .with_torch(super::torch::read_options(limits))
        .with_max_header_len(limits.max_data_header_bytes)
}

/// RecIS to RecIS: each table keeping its `slice_size`, the data files per shard the source's unless given.
fn reshard_files(src: &Path, dst: &Path, options: &ConvertOptions, limits: &ReadLimits) -> Result<ConvertSummary> {
    let write = ckpt_recis::WriteOptions::default()
        .with_parallel(source_parallel(src, options, limits)?)
        .with_durability(options.durability);
    let reshard = ckpt_recis::ReshardOptions::default().with_write(write).with_read(read_options(limits));
    ckpt_recis::reshard(src, dst, options.world_size, &reshard).at(dst)?;
    files_summary(src, dst, limits)
}

/// Whether `dst` is an object-store URL (written by streaming, not read back).
fn is_url(dst: &Path) -> bool {
    dst.to_str().is_some_and(|d| d.contains("://"))
}

/// What a RecIS to RecIS conversion from `src` (read under `limits`) wrote at `dst`.
fn files_summary(src: &Path, dst: &Path, limits: &ReadLimits) -> Result<ConvertSummary> {
    let before = open(src, limits)?;
    // An object-store destination is not read back: a reshard keeps every entry of the source.
    let kept = if is_url(dst) { before.entries() } else { ckpt_recis::RecisReader::open(dst).at(dst)?.entries() };
    let mut s = ConvertSummary::default();
    for e in &kept {
        match e.tensor_info() {
            Some(t) => {
                s.tensors += 1;
                s.bytes += t.nbytes() as u64;
            }
            None => s.values += 1,
        }
    }
    s.dropped =
        before.entries().into_iter().filter(|e| !kept.iter().any(|k| k.name == e.name)).map(|e| e.name).collect();
    Ok(s)
}

/// The data files per shard and the key space the options give a RecIS target, each if set.
fn recis_of(options: &ConvertOptions) -> (Option<usize>, Option<u32>) {
    match options.target {
        crate::options::TargetOptions::Recis { parallel, slice_size } => (parallel, slice_size),
        _ => (None, None),
    }
}

/// `ckpt convert`'s flags for RecIS targets.
#[cfg(feature = "cli")]
#[derive(clap::Args, Debug, Default)]
pub struct RecisArgs {
    /// recis targets: data files per shard (default: the source's, else 4).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub parallel: Option<u32>,
    /// recis targets: the id key space of every hash table (default: the source's, else 65536).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub slice_size: Option<u32>,
}

#[cfg(feature = "cli")]
impl RecisArgs {
    /// The target options these flags give, and the flags given.
    pub(crate) fn target(&self) -> (crate::options::TargetOptions, Option<&'static str>) {
        let given = self.parallel.map(|_| "--parallel").or(self.slice_size.map(|_| "--slice-size"));
        let parallel = self.parallel.map(|p| p as usize);
        (crate::options::TargetOptions::Recis { parallel, slice_size: self.slice_size }, given)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ckpt_tensor::{Tensor, Value};

    #[test]
    fn hash_tables_are_keyed_rows_and_entries_have_their_state_names() {
        let dir = tempfile::tempdir().unwrap();
        let ids = Tensor::from_slice(&[3i64, 70_000, -5], &[3]).unwrap();
        let emb = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]).unwrap();
        let w = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let sd = Value::dict([
            ("tbl@id", Value::Tensor(ids)),
            ("tbl@embedding", Value::Tensor(emb)),
            ("model", Value::dict([("w", Value::Tensor(w))])),
            ("step", Value::Int(4)),
        ]);
        ckpt_recis::save(&sd, dir.path(), &ckpt_recis::WriteOptions::default().with_world_size(2)).unwrap();
        let layout = layout_of(&ckpt_recis::RecisReader::open(dir.path()).unwrap());
        assert_eq!(
            layout.keyed,
            [KeyedRows { table: "tbl".into(), ids: "tbl@id".into(), rows: vec!["tbl@embedding".into()] }]
        );
        assert!(layout.keys.is_empty() && layout.nested_under.is_none());
        assert_eq!(layout.names("tbl@id"), ["sparse.tbl@id", "tbl@id"]);
        assert_eq!(layout.names("w"), ["model.w", "w"]);
        assert_eq!(layout.names("extra/step"), ["extra.step", "step", "extra/step"]);
    }
}
