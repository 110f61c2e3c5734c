//! Plain pickles of models and tensors (`pickle.dump`), through `ckpt-torch`'s reader: the pickle's tensors
//! (each storage a `torch.storage._load_from_bytes` stream), numpy arrays, and whole modules as their state
//! dicts, as a `torch.save` file's. Read only: a conversion writes another format.

use std::path::Path;

use ckpt_tensor::{CheckpointRead, PathItem, Value};

use crate::adaptor::{Adaptor, Content, Layout, Leaf, Source, count};
use crate::checkpoint::{Checkpoint, Reader};
use crate::error::{At, Error, Result};
use crate::format::Format;
use crate::formats::torch::{Torch, read_options};
use crate::limits::ReadLimits;
use crate::options::ConvertOptions;
use crate::report::ConvertSummary;
use crate::select::Selection;
use crate::source::SourceOptions;

pub(crate) struct Pickle;

impl Adaptor for Pickle {
    fn format(&self) -> Format {
        Format::Pickle
    }

    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        Torch.open(path, limits)
    }

    /// As a `torch.save` file's: the pickled object's leaves, a whole module as its state dict. A pickle whose
    /// top level is another object (an estimator wrapper holding its module) is its entries, each a leaf by
    /// its name: the tensors inside the object, as `inspect` lists them.
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        selection: &Selection,
    ) -> Result<Content> {
        let options = read_options(limits).with_fill(source.fill_for(path));
        let reader = ckpt_torch::TorchReader::open_with(path, &options).at(path)?;
        if reader.module_state_dict().is_some() || !matches!(reader.value(), Value::Object(_) | Value::Shared { .. }) {
            return Torch.read_source(path, limits, source, selection);
        }
        let mut leaves = Vec::new();
        for e in reader.entries() {
            if e.name.is_empty() {
                continue;
            }
            let value = reader.get(&e.name).at(path)?.clone();
            leaves.push(Leaf { path: vec![PathItem::Key(e.name.clone())], name: e.name, value });
        }
        Content::from_leaves(leaves, path)
    }

    /// The pickled object written whole by `torch.save` (its classes named, never imported): what
    /// `torch.load` of the result gives is what `pickle.load` of the pickle gives.
    fn object_for_torch_save(&self, src: &Path, limits: &ReadLimits) -> Option<Result<(Value, ConvertSummary)>> {
        Some((|| {
            let reader = ckpt_torch::TorchReader::open_with(src, &read_options(limits)).at(src)?;
            let content = self.read_source(src, limits, &SourceOptions::default(), &Selection::default())?;
            Ok((reader.value().clone(), count(&content.leaves)))
        })())
    }

    /// A top-level object is the pickle's structure around its entries (each converted on its own): not
    /// state a comparison looks at.
    fn layout(&self, ck: &Checkpoint, _: &ReadLimits) -> Result<Layout> {
        let keys = ck.entries().into_iter().map(|e| e.name).filter(String::is_empty).collect();
        Ok(Layout { keys, ..Layout::default() })
    }

    fn write(&self, source: &Source<'_>, _: &Path, _: &ConvertOptions) -> Result<ConvertSummary> {
        Err(Error::UnsupportedConversion {
            from: source.format(),
            to: Format::Pickle,
            reason: "ckpt reads plain pickles but does not write them; convert to torch, safetensors or hf".into(),
        })
    }
}
