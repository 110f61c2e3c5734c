//! torch.package archives (`PackageExporter`), through `ckpt-torch`'s reader: each pickled resource's tensors
//! under `<resource path>.<attribute path>`, a module as its state dict names, a TorchScript module as its
//! weights; the code listed, never run. Read only: a conversion writes another format.

use std::path::Path;

use crate::adaptor::{Adaptor, Content, Source};
use crate::checkpoint::Reader;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::formats::torch::Torch;
use crate::limits::ReadLimits;
use crate::options::ConvertOptions;
use crate::report::ConvertSummary;
use crate::select::Selection;
use crate::source::SourceOptions;

pub(crate) struct TorchPackage;

impl Adaptor for TorchPackage {
    fn format(&self) -> Format {
        Format::Package
    }

    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        Torch.open(path, limits)
    }

    /// Every resource's leaves, by path.
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        selection: &Selection,
    ) -> Result<Content> {
        Torch.read_source(path, limits, source, selection)
    }

    fn write(&self, source: &Source<'_>, _: &Path, _: &ConvertOptions) -> Result<ConvertSummary> {
        Err(Error::UnsupportedConversion {
            from: source.format(),
            to: Format::Package,
            reason: "ckpt reads torch.package archives but does not write them; convert to torch, safetensors or hf"
                .into(),
        })
    }
}
