//! `torch.save` files, through `ckpt-torch`.

use std::path::Path;

use crate::adaptor::read_all;
use crate::adaptor::{Adaptor, Content, Layout, Source, count};
use crate::checkpoint::Checkpoint;
use crate::checkpoint::Reader;
use crate::error::{At, Cause, Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::ConvertOptions;
use crate::options::Depth;
use crate::report::ConvertSummary;
use crate::report::{Progress, VerifyReport, absorb};
use crate::select::Selection;
use crate::source::SourceOptions;
use ckpt_tensor::Value;

pub(crate) struct Torch;

/// A file the torch codec does not recognise (nor detection any other format) says what it looks like
/// ([`crate::format::looks_like`]); any other error is the codec's.
impl Cause for ckpt_torch::Error {
    fn at(self, path: &Path) -> Error {
        match unrecognized(&self) {
            Some(head) => {
                Error::NotACheckpoint { path: path.to_path_buf(), looks_like: crate::format::looks_like(head) }
            }
            None => ckpt_tensor::Error::from(self).at(path),
        }
    }
}

impl Adaptor for Torch {
    fn format(&self) -> Format {
        Format::Torch
    }

    /// Its reader fills what it reads: each tensor record as it is read (its ZIP index fetched first).
    #[cfg(feature = "remote")]
    fn reads_partial_copy(&self) -> bool {
        true
    }

    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        Ok(Box::new(ckpt_torch::TorchReader::open_with(path, &read_options(limits)).at(path)?))
    }

    /// As [`Adaptor::open`]; a listing ([`SourceOptions::listing_only`]) trusts torch's ZIP layout; a
    /// partial copy is read through its fill hook ([`SourceOptions::fills`]): each tensor record filled
    /// (its local header checked) as it is read.
    fn open_source(&self, path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<Box<dyn Reader>> {
        let options = read_options(limits).with_trust_layout(source.listing_only).with_fill(source.fill_for(path));
        Ok(Box::new(ckpt_torch::TorchReader::open_with(path, &options).at(path)?))
    }

    /// The saved object, and its leaves; for a whole pickled module (`torch.save(model)`), its state dict as
    /// `model.state_dict()` returns it (the whole object goes only to a torch target, through
    /// [`Adaptor::object_for_torch_save`]).
    ///
    /// Read as `source` says: a partial copy read through its fill hook ([`SourceOptions::fills`]):
    /// each tensor record filled when its bytes are read (a selection's dropped tensors never are).
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        selection: &Selection,
    ) -> Result<Content> {
        let options = read_options(limits).with_fill(source.fill_for(path));
        let reader = ckpt_torch::TorchReader::open_with(path, &options).at(path)?;
        match (reader.module_state_dict(), reader.script()) {
            (Some(Value::Dict(state_dict)), Some(_)) => {
                Content::from_tree(Value::Dict(script_selected(state_dict, selection)), path)
            }
            (Some(state_dict), _) => Content::from_tree(state_dict.clone(), path),
            (None, _) => Content::from_tree(reader.into_value(), path),
        }
    }

    /// A TorchScript archive's tensors outside its state dict (`attributes.*`, `constants.*`) are its own
    /// bookkeeping to a comparison, as they are left out of a conversion by default.
    fn layout(&self, ck: &Checkpoint, _: &ReadLimits) -> Result<Layout> {
        let scripted = ck.downcast_ref::<ckpt_torch::TorchReader>().is_some_and(|r| r.script().is_some());
        let keys = if scripted {
            ck.entries().into_iter().map(|e| e.name).filter(|n| ckpt_torch::Script::is_extra(n)).collect()
        } else {
            Vec::new()
        };
        Ok(Layout { keys, ..Layout::default() })
    }

    /// A whole pickled module is written back whole (the module objects, not only their state dict); any
    /// other file, a TorchScript archive among them (its weights), goes through its content.
    fn object_for_torch_save(&self, src: &Path, limits: &ReadLimits) -> Option<Result<(Value, ConvertSummary)>> {
        let reader = match ckpt_torch::TorchReader::open_with(src, &read_options(limits)).at(src) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        // A TorchScript module's objects are `__torch__` classes only its code defines: weights only.
        if reader.script().is_some() {
            return None;
        }
        let state_dict = reader.module_state_dict()?;
        Some(Content::from_tree(state_dict.clone(), src).map(|c| (reader.value().clone(), count(&c.leaves))))
    }

    /// The source's state dict, as `torch.save` writes it (or the object its format holds beyond it,
    /// [`Adaptor::object_for_torch_save`]), through the torch writer with the conversion's durability.
    /// Tensors are written as the source gives them: a lazily read source's (a DCP checkpoint's tensors
    /// assembled from several items) are made when the writer writes them and dropped after, whatever the
    /// options.
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let write = ckpt_torch::WriteOptions::default().with_durability(options.durability);
        if let Some(object) = source.object_for_torch_save() {
            let (object, summary) = object?;
            ckpt_torch::save(&object, dst, &write).at(dst)?;
            return Ok(summary);
        }
        let content = source.content()?;
        ckpt_torch::save(&content.tree, dst, &write).at(dst)?;
        Ok(count(&content.leaves))
    }

    /// The archive's structure and every record's CRC-32 ([`ckpt_torch::verify`]), then every entry read.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        progress: Progress<'_>,
    ) -> Result<()> {
        if depth == Depth::Deep {
            absorb(report, ckpt_torch::verify(path).at(path)?);
        }
        read_all(&self.checkpoint(path, limits)?, depth, report, progress);
        Ok(())
    }

    /// The torch codec names the torch files of old that it does not read: a TAR-era archive, a preview
    /// release's (what other files look like, detection says: [`crate::format::looks_like`]).
    fn explain(&self, head: &[u8], path: &Path) -> Option<Error> {
        match ckpt_torch::detect(head) {
            Err(e @ (ckpt_torch::Error::TarFormat | ckpt_torch::Error::PreviewFormat)) => Some(Cause::at(e, path)),
            _ => None,
        }
    }
}

/// A TorchScript archive's state dict as a conversion takes it: its parameters and buffers, and of the
/// tensors it lists besides them ([`ckpt_torch::Script::is_extra`]: `attributes.*`, `constants.*`) those an
/// `--include` glob names.
fn script_selected(state_dict: &ckpt_tensor::Dict, selection: &Selection) -> ckpt_tensor::Dict {
    let mut out = state_dict.clone();
    out.items.retain(|(k, _)| {
        let name = k.as_str().unwrap_or_default();
        !ckpt_torch::Script::is_extra(name) || (!selection.include.is_empty() && selection.keeps(name))
    });
    out
}

/// The leading bytes of a file the torch codec did not recognise (an empty one: none), when that is the error.
fn unrecognized(e: &ckpt_torch::Error) -> Option<&[u8]> {
    match e {
        ckpt_torch::Error::At { source, .. } => unrecognized(source),
        ckpt_torch::Error::Unrecognized { head } => Some(head),
        ckpt_torch::Error::Empty => Some(&[]),
        _ => None,
    }
}

/// The `torch.save` reader's options under `limits` (its pickle limits); the formats made of `torch.save`
/// files (hfai parts, RecIS `.pt` files, DeepSpeed's) read them with these too.
pub(crate) fn read_options(limits: &ReadLimits) -> ckpt_torch::ReadOptions {
    ckpt_torch::ReadOptions::default().with_limits(limits.pickle)
}

/// Where the central directory of the `torch.save` ZIP archive whose bytes (its tail at least) are `bytes`
/// lies, or `None` when they are not such an archive's. For a fetch of an archive's listing alone.
#[cfg(feature = "remote")]
pub(crate) fn zip_central_directory(bytes: &[u8]) -> Option<std::ops::Range<u64>> {
    ckpt_torch::zip::Archive::central_directory_range(bytes).ok()
}

/// The byte ranges (each with its local header, within the archive's `size`) of every record but the
/// tensors' (`data/<key>`) of the `torch.save` ZIP archive whose central directory `bytes` hold, or `None`
/// when it does not parse. For a fetch of an archive's listing alone.
#[cfg(feature = "remote")]
pub(crate) fn zip_records_but_tensors(bytes: &[u8], size: u64) -> Option<Vec<std::ops::Range<u64>>> {
    let archive = ckpt_torch::zip::Archive::parse_predicted(bytes).ok()?;
    Some(
        archive
            .records()
            .iter()
            .filter(|r| !r.short_name().starts_with("data/"))
            .map(|r| r.local_header_offset()..r.data_offset().saturating_add(r.compressed_size()).min(size))
            .collect(),
    )
}
