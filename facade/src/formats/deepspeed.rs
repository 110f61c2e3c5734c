//! DeepSpeed ZeRO and universal checkpoints, through `ckpt-deepspeed` (read only).

use std::path::Path;

use ckpt_tensor::{PathItem, Value};

use crate::adaptor::read_all;
use crate::adaptor::{Adaptor, Content, Leaf, Source};
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

pub(crate) struct DeepSpeed;

impl Cause for ckpt_deepspeed::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_tensor::Error::from(self).at(path)
    }
}

/// The checkpoint at `path` (the tag `source` names, else `latest`'s), under `limits`.
fn open(path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<ckpt_deepspeed::DeepSpeedReader> {
    let mut options = ckpt_deepspeed::ReadOptions::default().with_torch(super::torch::read_options(limits));
    if let Some(tag) = &source.tag {
        options = options.with_tag(tag);
    }
    ckpt_deepspeed::DeepSpeedReader::open_with(path, &options).at(path)
}

impl Adaptor for DeepSpeed {
    fn format(&self) -> Format {
        Format::DeepSpeed
    }

    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        self.open_source(path, limits, &SourceOptions::default())
    }

    /// Every entry: the consolidated state dict, the module's weights, the optimizer state per parameter, the
    /// engine and client state ([`ckpt_deepspeed::DeepSpeedReader`]).
    fn open_source(&self, path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<Box<dyn Reader>> {
        Ok(Box::new(open(path, limits, source)?))
    }

    /// Every entry `ckpt inspect` lists, in its order ([`ckpt_deepspeed::DeepSpeedReader::items`]): the
    /// consolidated fp32 state dict, as DeepSpeed's `zero_to_fp32` writes it, then the module's 16-bit copies
    /// (`module.*`), the optimizer state (`optimizer.*`) and the engine and client state, each a top-level
    /// key of the state dict under its entry name. Its tensors split over ranks are made from the ranks'
    /// files one piece at a time as the target writes them. With [`SourceOptions::model_only`], the
    /// consolidated state dict alone (`--model-only`: what `transformers` loads).
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        _selection: &Selection,
    ) -> Result<Content> {
        let reader = open(path, limits, source)?;
        let leaf =
            |name: &String, value: Value| Leaf { name: name.clone(), path: vec![PathItem::Key(name.clone())], value };
        let leaves = if source.model_only {
            reader.model().iter().map(|(name, t)| leaf(name, Value::Tensor(t.clone()))).collect()
        } else {
            reader.items().iter().map(|(name, value)| leaf(name, value.clone())).collect()
        };
        Content::from_leaves(leaves, path)
    }

    /// Deep: every `torch.save` file's structure and record CRC-32s ([`ckpt_torch::verify`]); then the
    /// consolidation's checks (every rank's file there, the flat groups holding what `param_shapes` lists) and
    /// every entry read.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        progress: Progress<'_>,
    ) -> Result<()> {
        let reader = open(path, limits, &SourceOptions::default())?;
        if depth == Depth::Deep {
            for file in reader.files().at(path)? {
                absorb(report, ckpt_torch::verify(&file).at(&file)?);
            }
        }
        read_all(&Checkpoint::new(Format::DeepSpeed, path, Box::new(reader)), depth, report, progress);
        Ok(())
    }

    fn write(&self, source: &Source<'_>, _: &Path, _: &ConvertOptions) -> Result<ConvertSummary> {
        Err(Error::UnsupportedConversion {
            from: source.format(),
            to: Format::DeepSpeed,
            reason: "ckpt reads DeepSpeed checkpoints but does not write them".into(),
        })
    }
}
