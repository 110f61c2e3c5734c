//! Hugging Face sharded safetensors directories, through `ckpt-safetensors`' `hf` module.

use std::path::Path;

use ckpt_collective::Collective;

use super::safetensors_checks::check_safetensors_checksums;
use crate::adaptor::read_all;
use crate::adaptor::{Adaptor, Content, Leaf, Source};
use crate::agree::agree;
use crate::checkpoint::Reader;
use crate::error::{At, Cause, Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::ConvertOptions;
use crate::options::Depth;
use crate::report::ConvertSummary;
use crate::report::{Progress, VerifyReport};
use crate::select::Selection;
use crate::source::SourceOptions;

pub(crate) struct Hf;

impl Cause for ckpt_safetensors::hf::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_tensor::Error::from(self).at(path)
    }
}

impl Adaptor for Hf {
    fn format(&self) -> Format {
        Format::Hf
    }

    /// The objects of `ckpt_safetensors::hf` and its commit points.
    #[cfg(feature = "remote")]
    fn object_layout(&self) -> Option<ckpt_io::storage::ObjectLayout> {
        Some(ckpt_safetensors::hf::OBJECT_LAYOUT)
    }

    /// Its reader fills what it reads: each shard's tensors as they are read.
    #[cfg(feature = "remote")]
    fn reads_partial_copy(&self) -> bool {
        true
    }

    /// A model directory of config and tokenizer files alone ([`ckpt_safetensors::hf::MODEL_FILES`]) takes
    /// its shards beside them.
    fn joins_directory(&self, names: &[String]) -> bool {
        names.iter().all(|n| ckpt_safetensors::hf::MODEL_FILES.contains(&n.as_str()))
    }

    /// Every shard's header length checked against [`ReadLimits::max_header_bytes`] first.
    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        super::safetensors_checks::check_safetensors_headers(limits, path)?;
        Ok(Box::new(ckpt_safetensors::hf::HfReader::open(path).at(path)?))
    }

    /// As [`open`](Adaptor::open), a partial copy read through its fill hook ([`SourceOptions::fills`]):
    /// each shard's tensors are filled as they are read.
    fn open_source(&self, path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<Box<dyn Reader>> {
        super::safetensors_checks::check_safetensors_headers(limits, path)?;
        let options = ckpt_safetensors::ReadOptions::default().with_fill(source.fill_for(path));
        Ok(Box::new(ckpt_safetensors::hf::HfReader::open_with(path, &options).at(path)?))
    }

    /// Every shard's header (and the index against the shards), every entry resolved; deep, every shard's
    /// per-tensor checksums (ckpt's, [`ckpt_safetensors::checksums`]) and every byte.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        progress: Progress<'_>,
    ) -> Result<()> {
        if depth == Depth::Deep {
            super::safetensors_checks::check_safetensors_headers(limits, path)?;
            let reader = ckpt_safetensors::hf::HfReader::open(path).at(path)?;
            for file in reader.files() {
                check_safetensors_checksums(file, report);
            }
        }
        read_all(&self.checkpoint(path, limits)?, depth, report, progress);
        Ok(())
    }

    /// Every entry in the source's order (tensors of every shard, and the values ckpt recorded); the nesting
    /// from the recorded paths, else a flat dict.
    ///
    /// Read as `source` says: a partial copy read through its fill hook ([`SourceOptions::fills`]):
    /// each shard's tensors filled when their bytes are read (a selection's dropped tensors never are).
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        _selection: &Selection,
    ) -> Result<Content> {
        super::safetensors_checks::check_safetensors_headers(limits, path)?;
        let options = ckpt_safetensors::ReadOptions::default().with_fill(source.fill_for(path));
        let reader = ckpt_safetensors::hf::HfReader::open_with(path, &options).at(path)?;
        let leaves = reader.leaves().into_iter().map(|(name, path, value)| Leaf { name, path, value }).collect();
        Content::from_leaves(leaves, path)
    }

    /// Every leaf under its name, sharded as transformers shards ([`ckpt_safetensors::hf::save_entries`]), with
    /// `TargetOptions::Hf { max_shard_size }`.
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let content = source.content()?;
        let leaves = content.leaves.iter().map(|l| (l.name.as_str(), l.path.as_slice(), &l.value));
        let report = ckpt_safetensors::hf::save_entries(leaves, dst, &write_options(source, options)).at(dst)?;
        Ok(summary(report))
    }

    /// Each process writes its shards ([`ckpt_safetensors::hf::save_entries_rank`]: shards planned from the sizes, process
    /// `p` of `K` writes shards `p, p + K, ...`, reading only their tensors from the source
    /// ([`Source::outlined`])); process 0 writes the index last and commits.
    fn write_in(
        &self,
        source: &Source<'_>,
        dst: &Path,
        options: &ConvertOptions,
        group: &dyn Collective,
    ) -> Result<ConvertSummary> {
        let outlined = agree(group, source.outlined())?;
        let leaves = outlined.content.leaves.iter().map(|l| (l.name.as_str(), l.path.as_slice(), &l.value));
        let resolve = |t: &ckpt_tensor::Tensor| outlined.resolve(t);
        let report =
            ckpt_safetensors::hf::save_entries_rank(leaves, dst, &write_options(source, options), group, &resolve)
                .at(dst);
        agree(group, report).map(summary)
    }
}

fn write_options(source: &Source<'_>, options: &ConvertOptions) -> ckpt_safetensors::hf::WriteOptions {
    let mut write = ckpt_safetensors::hf::WriteOptions::default()
        .with_source(source.format().name())
        .with_durability(options.durability);
    if let crate::options::TargetOptions::Hf { max_shard_size: Some(max) } = options.target {
        write = write.with_max_shard_size(max);
    }
    write
}

fn summary(report: ckpt_safetensors::hf::SaveReport) -> ConvertSummary {
    ConvertSummary { tensors: report.tensors, bytes: report.bytes, values: report.values, dropped: report.dropped }
}

/// `ckpt convert`'s flags for Hugging Face targets.
#[cfg(feature = "cli")]
#[derive(clap::Args, Debug, Default)]
pub struct HfArgs {
    /// hf targets: the largest shard (5GB, 500MB, 64KB, 2GiB or bytes; default 5GB, as transformers).
    #[arg(long, value_name = "SIZE", value_parser = shard_size)]
    pub max_shard_size: Option<u64>,
}

/// `--max-shard-size`, read as transformers reads it.
#[cfg(feature = "cli")]
fn shard_size(text: &str) -> std::result::Result<u64, String> {
    ckpt_safetensors::hf::parse_size(text).map_err(|e| e.to_string())
}

#[cfg(feature = "cli")]
impl HfArgs {
    /// The target options these flags give, and the flags given.
    pub(crate) fn target(&self) -> (crate::options::TargetOptions, Option<&'static str>) {
        let given = self.max_shard_size.map(|_| "--max-shard-size");
        (crate::options::TargetOptions::Hf { max_shard_size: self.max_shard_size }, given)
    }
}
