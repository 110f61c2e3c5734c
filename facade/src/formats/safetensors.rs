//! safetensors files, through `ckpt-core`'s safetensors module and its one metadata convention
//! ([`ckpt_core::safetensors::metadata`]).

use std::path::Path;

use ckpt_core::Value;
use ckpt_core::safetensors::{SafetensorsReader, metadata};

use crate::Format;
use crate::adaptor::{Adaptor, Content, Leaf, Reader, Source};
use crate::convert::{ConvertOptions, ConvertSummary};
use crate::error::{At, Result};

pub(crate) struct Safetensors;

impl Adaptor for Safetensors {
    fn format(&self) -> Format {
        Format::Safetensors
    }

    fn open(&self, path: &Path) -> Result<Box<dyn Reader>> {
        Ok(Box::new(SafetensorsReader::open(path).at(path)?))
    }

    /// The tensors, then the values ckpt recorded; the nesting from the recorded paths, else a flat dict.
    fn read(&self, path: &Path) -> Result<Content> {
        let file = SafetensorsReader::open(path).at(path)?;
        let records = file.records();
        let mut leaves: Vec<Leaf> = Vec::with_capacity(file.tensors.len() + records.values.len());
        for (name, t) in &file.tensors {
            leaves.push(Leaf { path: records.path_of(name), name: name.clone(), value: Value::Tensor(t.clone()) });
        }
        for (name, value) in &records.values {
            leaves.push(Leaf { path: records.path_of(name), name: name.clone(), value: value.clone() });
        }
        Content::from_leaves(leaves, path)
    }

    /// Every leaf under its name, with the convention's metadata ([`metadata::save_entries`]).
    fn write(&self, source: &Source<'_>, dst: &Path, _: &ConvertOptions) -> Result<ConvertSummary> {
        let content = source.content()?;
        let leaves = content.leaves.iter().map(|l| (l.name.as_str(), l.path.as_slice(), &l.value));
        let options = metadata::WriteOptions::default().with_source(source.format.name());
        let report = metadata::save_entries(leaves, dst, &options).at(dst)?;
        Ok(ConvertSummary {
            tensors: report.tensors,
            bytes: report.bytes,
            values: report.values,
            dropped: report.dropped,
        })
    }
}
