//! PyTorch-BigGraph checkpoint directories, through `ckpt-pbg`.

use std::collections::HashSet;
use std::path::Path;

use ckpt_core::Value;

use crate::adaptor::{Adaptor, Reader, Source, count};
use crate::convert::{ConvertOptions, ConvertSummary};
use crate::error::{At, Cause, Error, Result};
use crate::verify::{Depth, Progress, VerifyReport, chain, read_all};
use crate::{Format, ReadLimits};

pub(crate) struct Pbg;

impl Cause for ckpt_pbg::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_core::Error::from(self).at(path)
    }
}

impl Adaptor for Pbg {
    fn format(&self) -> Format {
        Format::Pbg
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
        let from = source.format;
        let unsupported = |reason: String| Error::UnsupportedConversion { from, to: Format::Pbg, reason };
        let content = source.content()?;
        let entries: Vec<(String, Value)> = content.leaves.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
        let mut write = ckpt_pbg::WriteOptions::default();
        if let Some(path) = &options.pbg_config {
            let text = std::fs::read_to_string(path).at(path)?;
            write = write.with_config(ckpt_pbg::Config::parse(&text).at(path)?);
        }
        let report = match ckpt_pbg::save(&entries, dst, &write) {
            Ok(r) => r,
            Err(ckpt_pbg::Error::NoEmbeddings) => {
                return Err(unsupported(format!(
                    "a PyTorch-BigGraph checkpoint is entity embedding partitions and relation operators; this \
                     {from} checkpoint has no `embeddings/<entity>/<partition>` or `model/<parameter>` entries \
                     (the names a PBG checkpoint converted to {from} keeps)"
                )));
            }
            Err(ckpt_pbg::Error::NoConfig) => {
                return Err(unsupported(
                    "the source has no PyTorch-BigGraph `config` entry, and a PBG checkpoint needs the training \
                     config that defines its entities, partitions and relations: give one \
                     (ConvertOptions::with_pbg_config, `ckpt convert --pbg-config config.json`)"
                        .into(),
                ));
            }
            Err(ckpt_pbg::Error::LayoutMismatch { reason }) => {
                let config = options.pbg_config.clone().unwrap_or_else(|| dst.join(ckpt_pbg::CONFIG_FILE));
                return Err(unsupported(format!("{reason} (config {})", config.display())));
            }
            Err(ckpt_pbg::Error::AlreadyExists { path }) => {
                return Err(Error::AlreadyExists {
                    path,
                    reason: "the target already holds a PyTorch-BigGraph checkpoint; convert into a new directory"
                        .into(),
                });
            }
            Err(e) => return Err(e).at(dst),
        };
        let dropped: HashSet<&str> = report.dropped.iter().map(String::as_str).collect();
        let mut s = count(content.leaves.iter().filter(|l| !dropped.contains(l.name.as_str())));
        s.dropped = report.dropped;
        Ok(s)
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
            report.warnings.push(
                "entity path not found (config.json's entity_path, relative to the working directory or the \
                 checkpoint's parent): embedding counts not checked"
                    .into(),
            );
        }
        let r = storage.verify(entities.as_ref()).at(path)?;
        for (entity, part) in &r.missing {
            report.problems.push(format!("version {}: missing partition {part} of entity {entity}", r.version));
        }
        if r.missing_model {
            report.problems.push(format!("version {}: missing model.v{}.h5", r.version, r.version));
        }
        for (name, e) in &r.invalid {
            report.problems.push(format!("{name}: {}", chain(e)));
        }
        for name in &r.partial {
            report.warnings.push(format!("{name}: uncommitted (newer than version {})", r.version));
        }
        for name in &r.stale {
            report.warnings.push(format!("{name}: stale (older version no snapshot links to)"));
        }
        for link in &r.dangling_links {
            report.warnings.push(format!("{}: dangling snapshot link", link.display()));
        }
        // Every file of the committed version: opened, and deep, read.
        read_all(&self.checkpoint(path, limits)?, depth, report, &|_, _| {});
        Ok(())
    }
}
