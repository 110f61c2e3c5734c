//! PyTorch-BigGraph checkpoint directories, through `ckpt-pbg`.

use std::collections::HashSet;
use std::path::Path;

use ckpt_collective::{Collective, host_ranks};
use ckpt_tensor::Value;

use crate::adaptor::read_all;
use crate::adaptor::{Adaptor, Leaf, Source, count};
use crate::agree::{agree, agree_with_root, hosted_outcome};
use crate::checkpoint::Reader;
use crate::error::{At, Cause, Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::ConvertOptions;
use crate::options::Depth;
use crate::report::ConvertSummary;
use crate::report::{Problem, ProblemKind, Progress, VerifyReport, absorb};

pub(crate) struct Pbg;

impl Cause for ckpt_pbg::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_tensor::Error::from(self).at(path)
    }
}

impl Adaptor for Pbg {
    fn format(&self) -> Format {
        Format::Pbg
    }

    /// The objects of `ckpt_pbg` and its commit points.
    #[cfg(feature = "remote")]
    fn object_layout(&self) -> Option<ckpt_io::storage::ObjectLayout> {
        Some(ckpt_pbg::OBJECT_LAYOUT)
    }

    /// `ckpt_pbg::save` writes a new directory only (a checkpoint's next version is PBG's own commit,
    /// `begin_commit`).
    fn writes_over_itself(&self) -> bool {
        false
    }

    /// The optimizer blobs decoded under the pickle limits (no other limit applies to PBG).
    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        let options = ckpt_pbg::ReadOptions::default().with_limits(limits.pickle);
        Ok(Box::new(ckpt_pbg::PbgReader::open_with(path, &options).at(path)?))
    }

    /// The source's entries under [`ckpt_pbg::PbgReader`]'s names, which every other format keeps of a PBG
    /// checkpoint, written by [`ckpt_pbg::save`] in the layout of the source's config or of
    /// [`ConvertOptions::pbg_config`] (re-partitioned, optimizer state rebuilt; the crate has the details).
    /// A source without entity partitions or model parameters, or without a config, is refused with the
    /// reason.
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let (leaves, write) = prepare(source, options)?;
        let report = ckpt_pbg::save(&entries(&leaves), dst, &write).map_err(|e| save_error(source, dst, options, e))?;
        Ok(summary(&leaves, report))
    }

    /// The entity partition files are dealt round robin over the processes ([`ckpt_pbg::save_rank`], one rank
    /// per process): each reads from the source only the rows of its files (the entries are windows of the
    /// lazily opened source) and writes them; process 0 writes `config.json` and the model file, then the
    /// version file last, and commits.
    fn write_in(
        &self,
        source: &Source<'_>,
        dst: &Path,
        options: &ConvertOptions,
        group: &dyn Collective,
    ) -> Result<ConvertSummary> {
        let (leaves, write) = agree(group, prepare(source, options))?;
        let entries = entries(&leaves);
        let ran = host_ranks(group, group.world_size(), |g| {
            ckpt_pbg::save_rank(&entries, dst, &write, g).map_err(|e| save_error(source, dst, options, e))
        });
        let reports = agree(group, hosted_outcome(ran, |e| matches!(e, Error::RankFailed { .. }), dst))?;
        let own = (group.rank() == 0).then(|| {
            reports.into_iter().next().map(|r| summary(&leaves, r)).ok_or_else(|| Error::RankFailed {
                rank: 0,
                fault: ckpt_tensor::Fault::Io,
                message: "hosted no rank of the save".into(),
            })
        });
        agree_with_root(group, own, dst)
    }

    /// The storage's own check of the committed version ([`ckpt_pbg::FileCheckpointStorage::verify`]: the
    /// version complete, counts against the entity path when the config's resolves
    /// ([`ckpt_pbg::ConfigFile`]), every file valid), then every entry read.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        _: Progress<'_>,
    ) -> Result<()> {
        let storage = ckpt_pbg::FileCheckpointStorage::new(path);
        let entity_path = ckpt_pbg::ConfigFile::locate(path).ok().and_then(|c| c.entity_path()).filter(|p| p.is_dir());
        let entities = entity_path.map(ckpt_pbg::EntityStorage::new);
        if entities.is_none() {
            report.push(
                Problem::new(
                    ProblemKind::Unchecked,
                    "entity path not found (config.json's entity_path, relative to the working directory or the \
                     checkpoint's parent): embedding counts not checked",
                )
                .in_file(path),
            );
        }
        absorb(report, storage.verify(entities.as_ref()).at(path)?);
        // Every file of the committed version: opened, and deep, read.
        read_all(&self.checkpoint(path, limits)?, depth, report, &|_, _| {});
        Ok(())
    }
}

/// The source's entries by name and the write options of a conversion into PBG.
fn prepare(source: &Source<'_>, options: &ConvertOptions) -> Result<(Vec<Leaf>, ckpt_pbg::WriteOptions)> {
    let content = source.content()?;
    let mut write = ckpt_pbg::WriteOptions::default().with_durability(options.durability);
    if let Some(path) = config_of(options) {
        let text = std::fs::read_to_string(path).at(path)?;
        write = write.with_config(ckpt_pbg::Config::parse(&text).at(path)?);
    }
    Ok((content.leaves, write))
}

/// The leaves by name, as [`ckpt_pbg::save`] takes them.
fn entries(leaves: &[Leaf]) -> Vec<(String, Value)> {
    leaves.iter().map(|l| (l.name.clone(), l.value.clone())).collect()
}

/// A save's error, said as a conversion's: what the source lacks for a PBG checkpoint, a target that holds
/// one already.
fn save_error(source: &Source<'_>, dst: &Path, options: &ConvertOptions, e: ckpt_pbg::Error) -> Error {
    let from = source.format();
    let unsupported = |reason: String| Error::UnsupportedConversion { from, to: Format::Pbg, reason };
    match e {
        ckpt_pbg::Error::NoEmbeddings => unsupported(format!(
            "a PyTorch-BigGraph checkpoint is entity embedding partitions and relation operators; this \
             {from} checkpoint has no `embeddings/<entity>/<partition>` or `model/<parameter>` entries \
             (the names a PBG checkpoint converted to {from} keeps)"
        )),
        ckpt_pbg::Error::NoConfig => unsupported(
            "the source has no PyTorch-BigGraph `config` entry, and a PBG checkpoint needs the training \
             config that defines its entities, partitions and relations: give one \
             (TargetOptions::Pbg, `ckpt convert --pbg-config config.json`)"
                .into(),
        ),
        ckpt_pbg::Error::LayoutMismatch { reason } => {
            let config = config_of(options).map_or_else(|| dst.join(ckpt_pbg::names::CONFIG_FILE), Path::to_path_buf);
            unsupported(format!("{reason} (config {})", config.display()))
        }
        ckpt_pbg::Error::AlreadyExists { path } => Error::AlreadyExists {
            path,
            reason: "the target already holds a PyTorch-BigGraph checkpoint; convert into a new directory".into(),
        },
        e => e.at(dst),
    }
}

/// What a conversion into PBG wrote.
fn summary(leaves: &[Leaf], report: ckpt_pbg::SaveReport) -> ConvertSummary {
    let dropped: HashSet<&str> = report.dropped.iter().map(String::as_str).collect();
    let mut s = count(leaves.iter().filter(|l| !dropped.contains(l.name.as_str())));
    s.dropped = report.dropped;
    s
}

/// The `config.json` the options give a PyTorch-BigGraph target, if any.
fn config_of(options: &ConvertOptions) -> Option<&Path> {
    match &options.target {
        crate::options::TargetOptions::Pbg { config } => config.as_deref(),
        _ => None,
    }
}

/// `ckpt convert`'s flags for PyTorch-BigGraph targets.
#[cfg(feature = "cli")]
#[derive(clap::Args, Debug, Default)]
pub struct PbgArgs {
    /// pbg targets: the config.json defining entities, partition counts and relations (default: the
    /// source's own config).
    #[arg(long, value_name = "FILE")]
    pub pbg_config: Option<std::path::PathBuf>,
}

#[cfg(feature = "cli")]
impl PbgArgs {
    /// The target options these flags give, and the flags given.
    pub(crate) fn target(&self) -> (crate::options::TargetOptions, Option<&'static str>) {
        let given = self.pbg_config.as_ref().map(|_| "--pbg-config");
        (crate::options::TargetOptions::Pbg { config: self.pbg_config.clone() }, given)
    }
}
