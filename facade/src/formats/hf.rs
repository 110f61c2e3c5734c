//! Hugging Face sharded safetensors directories, through `ckpt-hf`.

use std::path::Path;

use crate::adaptor::{Adaptor, Content, Leaf, Reader, Source};
use crate::convert::{ConvertOptions, ConvertSummary};
use crate::error::{At, Cause, Error, Result};
use crate::verify::{Depth, Progress, VerifyReport, check_safetensors_checksums, read_all};
use crate::{Format, ReadLimits};

pub(crate) struct Hf;

impl Cause for ckpt_hf::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_core::Error::from(self).at(path)
    }
}

impl Adaptor for Hf {
    fn format(&self) -> Format {
        Format::Hf
    }

    /// Every shard's header length checked against [`ReadLimits::max_header_bytes`] first.
    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        limits.check_safetensors_headers(path)?;
        Ok(Box::new(ckpt_hf::HfReader::open(path).at(path)?))
    }

    /// Every shard's header (and the index against the shards), every entry resolved; deep, every shard's
    /// per-tensor checksums (ckpt's, [`ckpt_core::safetensors::checksums`]) and every byte.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        progress: Progress<'_>,
    ) -> Result<()> {
        if depth == Depth::Deep {
            limits.check_safetensors_headers(path)?;
            let reader = ckpt_hf::HfReader::open(path).at(path)?;
            for file in reader.files() {
                check_safetensors_checksums(file, report);
            }
        }
        read_all(&self.checkpoint(path, limits)?, depth, report, progress);
        Ok(())
    }

    /// Every entry in the source's order (tensors of every shard, and the values ckpt recorded); the nesting
    /// from the recorded paths, else a flat dict.
    fn read(&self, path: &Path, limits: &ReadLimits) -> Result<Content> {
        limits.check_safetensors_headers(path)?;
        let reader = ckpt_hf::HfReader::open(path).at(path)?;
        let leaves = reader.leaves().into_iter().map(|(name, path, value)| Leaf { name, path, value }).collect();
        Content::from_leaves(leaves, path)
    }

    /// Every leaf under its name, sharded as transformers shards ([`ckpt_hf::save_entries`]), with
    /// [`ConvertOptions::hf_max_shard_size`].
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let content = source.content()?;
        let leaves = content.leaves.iter().map(|l| (l.name.as_str(), l.path.as_slice(), &l.value));
        let mut write = ckpt_hf::WriteOptions::default().with_source(source.format.name());
        if let Some(max) = options.hf_max_shard_size {
            write = write.with_max_shard_size(max);
        }
        let report = ckpt_hf::save_entries(leaves, dst, &write).at(dst)?;
        Ok(ConvertSummary {
            tensors: report.tensors,
            bytes: report.bytes,
            values: report.values,
            dropped: report.dropped,
        })
    }
}
