//! hfai `PART_*.pt` directories, through `ckpt-hfai`.

use std::path::Path;

use ckpt_collective::{Collective, host_ranks};
use ckpt_tensor::PathItem;

use crate::adaptor::read_all;
use crate::adaptor::{Adaptor, Content, Layout, Leaf, Source, count};
use crate::agree::agree;
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

pub(crate) struct Hfai;

impl Cause for ckpt_hfai::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_tensor::Error::from(self).at(path)
    }
}

impl Adaptor for Hfai {
    fn format(&self) -> Format {
        Format::Hfai
    }

    /// The objects of `ckpt_hfai` and its commit points.
    #[cfg(feature = "remote")]
    fn object_layout(&self) -> Option<ckpt_io::storage::ObjectLayout> {
        Some(ckpt_hfai::OBJECT_LAYOUT)
    }

    /// Its reader fills what it reads: each part's tensor records as they are read.
    #[cfg(feature = "remote")]
    fn reads_partial_copy(&self) -> bool {
        true
    }

    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>> {
        Ok(Box::new(ckpt_hfai::HfaiReader::open_with(path, &super::torch::read_options(limits)).at(path)?))
    }

    /// As [`open`](Adaptor::open), a partial copy read through its fill hook ([`SourceOptions::fills`]):
    /// each part's tensor records filled as they are read (chunks of a tensor split across parts are
    /// concatenated, so filled, when the checkpoint is opened).
    fn open_source(&self, path: &Path, limits: &ReadLimits, source: &SourceOptions) -> Result<Box<dyn Reader>> {
        let options = super::torch::read_options(limits).with_fill(source.fill_for(path));
        Ok(Box::new(ckpt_hfai::HfaiReader::open_with(path, &options).at(path)?))
    }

    /// What hfai's `load` returns, and its leaves.
    ///
    /// Read as `source` says: a partial copy read through its fill hook ([`SourceOptions::fills`]):
    /// each part's tensor records filled when their bytes are read (chunked tensors when it is opened).
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        source: &SourceOptions,
        _selection: &Selection,
    ) -> Result<Content> {
        let options = super::torch::read_options(limits).with_fill(source.fill_for(path));
        let reader = ckpt_hfai::HfaiReader::open_with(path, &options).at(path)?;
        Content::from_tree(reader.into_value(), path)
    }

    /// The source's state dict laid out as hfai's `save` takes it ([`ckpt_hfai::SaveState::from_state_dict`]),
    /// in as many parts as the world size.
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let (s, state, write) = prepare(source, &source.content()?, options)?;
        ckpt_hfai::save(&state, dst, &write).at(dst)?;
        Ok(s)
    }

    /// Each process writes the parts of the ranks it hosts ([`ckpt_hfai::save_rank_resolved`]): every rank
    /// plans the whole split from the source's dtypes and shapes ([`Source::outlined`]) and reads only the
    /// tensors of its part (and its chunk's tensors); the others are never read, or are windows of the lazily
    /// opened source whose pages are not touched.
    fn write_in(
        &self,
        source: &Source<'_>,
        dst: &Path,
        options: &ConvertOptions,
        group: &dyn Collective,
    ) -> Result<ConvertSummary> {
        let prepared = source.outlined().and_then(|o| {
            let (s, state, write) = prepare(source, &o.content, options)?;
            Ok((s, state, write, o))
        });
        let (s, state, write, outlined) = agree(group, prepared)?;
        let resolve = |t: &ckpt_tensor::Tensor| outlined.resolve(t);
        let ran =
            host_ranks(group, options.world_size, |g| ckpt_hfai::save_rank_resolved(&state, dst, &write, g, &resolve));
        let own = ran.at(dst).and_then(|results| {
            // A rank's own error wins over the "another rank failed" the others report.
            let mut first = None;
            for (_, r) in results {
                match r {
                    Err(e) if !matches!(e, ckpt_hfai::Error::RankFailed { .. }) => return Err(e).at(dst),
                    Err(e) => first = first.or(Some(e)),
                    Ok(_) => {}
                }
            }
            first.map_or(Ok(()), |e| Err(e).at(dst))
        });
        agree(group, own)?;
        Ok(s)
    }

    /// Every part's record CRC-32s ([`ckpt_hfai::verify`]), then the parts merged and every entry read.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        progress: Progress<'_>,
    ) -> Result<()> {
        if depth == Depth::Deep {
            absorb(report, ckpt_hfai::verify(path).at(path)?);
        }
        read_all(&self.checkpoint(path, limits)?, depth, report, progress);
        Ok(())
    }

    /// hfai's header (`__nshards__`, `__version__`), and the `optimizer` it writes empty when it saved none,
    /// are layout keys; a checkpoint of one model and nothing else holds a plain state dict, which hfai
    /// nests under `model.` ([`layout_of`]).
    fn layout(&self, ck: &Checkpoint, limits: &ReadLimits) -> Result<Layout> {
        // The reader the checkpoint was opened with (a partial copy's, with its fill hook), else reopened.
        if let Some(reader) = ck.downcast_ref::<ckpt_hfai::HfaiReader>() {
            return Ok(layout_of(reader));
        }
        let path = ck.path();
        let reader = ckpt_hfai::HfaiReader::open_with(path, &super::torch::read_options(limits)).at(path)?;
        Ok(layout_of(&reader))
    }

    /// hfai's key split and `torch.chunk` chunking for `world` parts ([`ckpt_hfai::reshard`]).
    fn reshard(&self, src: &Path, dst: &Path, world: usize, limits: &ReadLimits) -> Result<()> {
        let mut options = ckpt_hfai::ReshardOptions::default();
        options.read = super::torch::read_options(limits);
        ckpt_hfai::reshard(src, dst, world, &options).map(|_| ()).at(src)
    }

    /// Each process writes the new parts of the ranks it hosts ([`ckpt_hfai::reshard_rank`]), reading only
    /// their entries and chunks from the source's parts; rank 0 checks every part and commits.
    fn reshard_in(
        &self,
        src: &Path,
        dst: &Path,
        world: usize,
        limits: &ReadLimits,
        group: &dyn Collective,
    ) -> Result<()> {
        let mut options = ckpt_hfai::ReshardOptions::default();
        options.read = super::torch::read_options(limits);
        let ran = host_ranks(group, world, |g| ckpt_hfai::reshard_rank(src, dst, &options, g));
        let own = crate::agree::hosted_outcome(ran, |e| matches!(e, ckpt_hfai::Error::RankFailed { .. }), src);
        agree(group, own.map(|_| ()))
    }
}

/// The layout of the hfai checkpoint `reader` reads ([`Adaptor::layout`]).
fn layout_of(reader: &ckpt_hfai::HfaiReader) -> Layout {
    let top = reader.value().as_dict();
    let get = |k: &str| top.and_then(|d| d.get(k));
    let mut keys: Vec<String> = HEADER.iter().filter(|k| get(k).is_some()).map(|k| (*k).to_owned()).collect();
    let empty = |v: &ckpt_tensor::Value| {
        v.as_sequence().is_some_and(<[ckpt_tensor::Value]>::is_empty) || v.as_dict().is_some_and(|d| d.items.is_empty())
    };
    if reader.optimizers().is_empty() && get(OPTIMIZER).is_some_and(empty) {
        keys.push(OPTIMIZER.to_owned());
    }
    // One model and nothing else: a plain state dict, nested under `model`.
    let one_model = matches!(get(MODEL), Some(ckpt_tensor::Value::Dict(_)));
    let nested = one_model && reader.others().next().is_none() && reader.optimizers().is_empty();
    Layout { keys, nested_under: nested.then(|| format!("{MODEL}.")), ..Layout::default() }
}

/// hfai's header keys, which its `save` writes whatever it saves.
const HEADER: [&str; 2] = ["__nshards__", "__version__"];
/// The key of hfai's model state dict(s).
const MODEL: &str = "model";
/// The key of hfai's optimizer state dict(s), an empty list when it saved none.
const OPTIMIZER: &str = "optimizer";

/// The content of `source` as an hfai target takes it: what it writes (counted, dropped named), the state
/// laid out as hfai's `save` takes it, the write options for `options.world_size` parts.
fn prepare(
    source: &Source<'_>,
    content: &Content,
    options: &ConvertOptions,
) -> Result<(ConvertSummary, ckpt_hfai::SaveState, ckpt_hfai::WriteOptions)> {
    let top = source.top_mapping(content, Format::Hfai)?;
    let (state, dropped_keys) = ckpt_hfai::SaveState::from_state_dict(top);
    let mut write =
        ckpt_hfai::WriteOptions::default().with_world_size(options.world_size).with_durability(options.durability);
    if let crate::options::TargetOptions::Hfai { large_size: Some(large) } = options.target {
        write = write.with_large_size(large);
    }
    let (lost, kept): (Vec<&Leaf>, Vec<&Leaf>) = content
        .leaves
        .iter()
        .partition(|l| matches!(l.path.first(), Some(PathItem::Key(p)) if dropped_keys.contains(p)));
    let mut s = count(kept);
    s.dropped = lost.into_iter().map(|l| l.name.clone()).collect();
    Ok((s, state, write))
}

/// `ckpt convert`'s flags for hfai targets.
#[cfg(feature = "cli")]
#[derive(clap::Args, Debug, Default)]
pub struct HfaiArgs {
    /// hfai targets: tensors above this many bytes are split over the parts (default: hfai's 256 MiB).
    #[arg(long, value_name = "BYTES")]
    pub hfai_large_size: Option<u64>,
}

#[cfg(feature = "cli")]
impl HfaiArgs {
    /// The target options these flags give, and the flags given.
    pub(crate) fn target(&self) -> (crate::options::TargetOptions, Option<&'static str>) {
        let given = self.hfai_large_size.map(|_| "--hfai-large-size");
        (crate::options::TargetOptions::Hfai { large_size: self.hfai_large_size }, given)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ckpt_tensor::{Tensor, Value};

    fn saved(top: &Value, world: usize) -> (tempfile::TempDir, ckpt_hfai::HfaiReader) {
        let dir = tempfile::tempdir().unwrap();
        let (state, _) = ckpt_hfai::SaveState::from_state_dict(top.as_dict().unwrap());
        let path = dir.path().join("h");
        ckpt_hfai::save(&state, &path, &ckpt_hfai::WriteOptions::default().with_world_size(world)).unwrap();
        let reader = ckpt_hfai::HfaiReader::open(&path).unwrap();
        (dir, reader)
    }

    #[test]
    fn a_plain_state_dict_is_nested_under_model_beside_layout_keys() {
        let w = Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap());
        let (_dir, reader) = saved(&Value::dict([("w", w.clone())]), 3);
        let layout = layout_of(&reader);
        assert_eq!(layout.keys, ["__nshards__", "__version__", "optimizer"]);
        assert_eq!(layout.nested_under.as_deref(), Some("model."));
        assert_eq!(layout.names("model.w"), ["w", "model.w"]);
        assert!(layout.is_key("__nshards__") && !layout.is_key("model.w"));
        // A training checkpoint (a model and other state): no nesting, only the header.
        let top = Value::dict([("model", Value::dict([("w", w)])), ("epoch", Value::Int(3))]);
        let (_dir, reader) = saved(&top, 2);
        let layout = layout_of(&reader);
        assert_eq!(layout.keys, ["__nshards__", "__version__", "optimizer"]);
        assert_eq!(layout.nested_under, None);
        assert_eq!(layout.names("model.w"), ["model.w"]);
    }
}
