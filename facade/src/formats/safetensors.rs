//! safetensors files, through `ckpt-tensor`'s safetensors module and its one metadata convention
//! ([`ckpt_safetensors::metadata`]).

use std::path::Path;

use ckpt_safetensors::{SafetensorsReader, metadata};

use super::safetensors_checks::check_safetensors_checksums;
use crate::adaptor::read_all;
use crate::adaptor::{Adaptor, Content, Leaf, Source};
use crate::checkpoint::Reader;
use crate::error::{At, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::ConvertOptions;
use crate::options::Depth;
use crate::report::ConvertSummary;
use crate::report::{Progress, VerifyReport};
use crate::select::Selection;
use crate::source::SourceOptions;

pub(crate) struct Safetensors;

impl Adaptor for Safetensors {
    fn format(&self) -> Format {
        Format::Safetensors
    }

    /// Its reader fills what it reads: each tensor's bytes as they are read.
    #[cfg(feature = "remote")]
    fn reads_partial_copy(&self) -> bool {
        true
    }

    /// The header's length checked against [`ReadLimits::max_header_bytes`] first.
    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        super::safetensors_checks::check_safetensors_headers(limits, path)?;
        Ok(Box::new(SafetensorsReader::open(path).at(path)?))
    }

    /// As [`open`](Adaptor::open), a partial copy read through its fill hook ([`SourceOptions::fills`]):
    /// each tensor's bytes are filled as they are read.
    fn open_source(&self, path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<Box<dyn Reader>> {
        super::safetensors_checks::check_safetensors_headers(limits, path)?;
        let options = ckpt_safetensors::ReadOptions::default().with_fill(source.fill_for(path));
        Ok(Box::new(SafetensorsReader::open_with(path, &options).at(path)?))
    }

    /// The header (dtypes, shapes, offsets covering the data), every entry resolved; deep, the per-tensor
    /// checksums ckpt records ([`ckpt_safetensors::checksums`]) and every byte.
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
            check_safetensors_checksums(path, report);
        }
        read_all(&self.checkpoint(path, limits)?, depth, report, progress);
        Ok(())
    }

    /// Every entry in the source's order (tensors and the values ckpt recorded, [`metadata`]); the nesting
    /// from the recorded paths, else a flat dict.
    ///
    /// Read as `source` says: a partial copy read through its fill hook ([`SourceOptions::fills`]):
    /// each tensor's bytes filled when they are read (a selection's dropped tensors never are).
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        _selection: &Selection,
    ) -> Result<Content> {
        super::safetensors_checks::check_safetensors_headers(limits, path)?;
        let options = ckpt_safetensors::ReadOptions::default().with_fill(source.fill_for(path));
        let file = SafetensorsReader::open_with(path, &options).at(path)?;
        let leaves = file.leaves().into_iter().map(|(name, path, value)| Leaf { name, path, value }).collect();
        Content::from_leaves(leaves, path)
    }

    /// Every leaf under its name, with the convention's metadata ([`metadata::save_entries`]).
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let content = source.content()?;
        let leaves = content.leaves.iter().map(|l| (l.name.as_str(), l.path.as_slice(), &l.value));
        let options =
            metadata::WriteOptions::default().with_source(source.format().name()).with_durability(options.durability);
        let report = metadata::save_entries(leaves, dst, &options).at(dst)?;
        Ok(ConvertSummary {
            tensors: report.tensors,
            bytes: report.bytes,
            values: report.values,
            dropped: report.dropped,
        })
    }
}
