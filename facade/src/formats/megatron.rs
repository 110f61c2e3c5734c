//! Megatron-Core `torch_dist` checkpoints, through `ckpt-distcp`'s Megatron profile (read only).

use std::path::Path;

use ckpt_distcp::megatron::{MegatronOptions, MegatronReader};
use ckpt_tensor::{PathItem, Value};

use crate::adaptor::{Adaptor, Content, Leaf, Source};
use crate::checkpoint::Reader;
use crate::error::{At, Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::ConvertOptions;
use crate::options::Depth;
use crate::report::ConvertSummary;
use crate::report::{Problem, ProblemKind, Progress, VerifyReport};
use crate::select::Selection;
use crate::source::{NameMap, SourceOptions};

pub(crate) struct Megatron;

/// The checkpoint at `path`, under `limits`, read as `source` says (layers unstacked, Llama's names).
fn open(path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<MegatronReader> {
    let options = MegatronOptions::default()
        .with_unstack_layers(source.unstack_layers)
        .with_llama(source.name_map == Some(NameMap::Llama));
    let read = super::distcp::read_options(path, limits)?.with_fill(source.fill_for(path));
    MegatronReader::open(path, &read, options).at(path)
}

impl Adaptor for Megatron {
    fn format(&self) -> Format {
        Format::Megatron
    }

    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        self.open_source(path, limits, &SourceOptions::default())
    }

    /// Every DCP entry (tensor-parallel shards joined), `common.pt`'s values, layers unstacked and names
    /// mapped as `source` says.
    fn open_source(&self, path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<Box<dyn Reader>> {
        Ok(Box::new(open(path, limits, source)?))
    }

    /// Every entry `ckpt inspect` lists, in its order: the model's and the optimizer's tensors, read when the
    /// target writes them (a layer of a stacked tensor, or the rows of a split one, one at a time),
    /// `common.pt`'s values and the `_extra_state` objects, each a top-level key of the state dict under its
    /// entry name. With [`SourceOptions::model_only`], the model's tensors alone (`--model-only`: what
    /// `transformers` loads).
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        _selection: &Selection,
    ) -> Result<Content> {
        let reader = open(path, limits, source)?;
        let mut leaves = Vec::new();
        for e in ckpt_tensor::CheckpointRead::entries(&reader) {
            if source.model_only && !reader.is_model_tensor(&e.name) {
                continue;
            }
            let value = match e.kind {
                ckpt_tensor::EntryKind::Tensor(_) => Value::Tensor(reader.read_tensor(&e.name).at(path)?),
                _ => ckpt_tensor::CheckpointRead::value(&reader, &e.name).at(path)?,
            };
            leaves.push(Leaf { path: vec![PathItem::Key(e.name.clone())], name: e.name, value });
        }
        Content::from_leaves(leaves, path)
    }

    /// The DCP checks ([`ckpt_distcp::verify`]: chunks covering their tensors, items inside their files, CRCs
    /// when deep), then `common.pt` and every entry read.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        progress: Progress<'_>,
    ) -> Result<()> {
        super::distcp::Distcp.verify(path, depth, limits, report, progress)?;
        let reader = open(path, limits, &SourceOptions::default())?;
        for e in ckpt_tensor::CheckpointRead::entries(&reader) {
            if matches!(e.kind, ckpt_tensor::EntryKind::Value) {
                if let Err(err) = ckpt_tensor::CheckpointRead::value(&reader, &e.name) {
                    report.push(Problem::from_error(ProblemKind::Unreadable, &err).at_entry(&e.name));
                }
            }
        }
        Ok(())
    }

    fn write(&self, source: &Source<'_>, _: &Path, _: &ConvertOptions) -> Result<ConvertSummary> {
        Err(Error::UnsupportedConversion {
            from: source.format(),
            to: Format::Megatron,
            reason: "ckpt reads Megatron-Core checkpoints but does not write them".into(),
        })
    }
}
