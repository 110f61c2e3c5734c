//! hfai `PART_*.pt` directories, through `ckpt-hfai`.

use std::path::Path;

use ckpt_core::PathItem;

use crate::Format;
use crate::adaptor::{Adaptor, Content, Leaf, Reader, Source, count};
use crate::convert::{ConvertOptions, ConvertSummary};
use crate::error::{At, Cause, Error, Result};
use crate::verify::{Progress, VerifyReport, read_all};

pub(crate) struct Hfai;

impl Cause for ckpt_hfai::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_core::Error::from(self).at(path)
    }
}

impl Adaptor for Hfai {
    fn format(&self) -> Format {
        Format::Hfai
    }

    fn open(&self, path: &Path) -> Result<Box<dyn Reader>> {
        Ok(Box::new(ckpt_hfai::HfaiReader::open(path).at(path)?))
    }

    /// What hfai's `load` returns, and its leaves.
    fn read(&self, path: &Path) -> Result<Content> {
        Content::from_tree(ckpt_hfai::load(path).at(path)?, path)
    }

    /// The source's state dict laid out as hfai's `save` takes it ([`ckpt_hfai::SaveState::from_state_dict`]),
    /// in as many parts as the world size.
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let content = source.content()?;
        let top = source.top_mapping(&content, Format::Hfai)?;
        let (state, dropped_keys) = ckpt_hfai::SaveState::from_state_dict(top);
        let mut write = ckpt_hfai::WriteOptions::default().with_nshards(options.world_size);
        if let Some(large) = options.hfai_large_size {
            write = write.with_large_size(large);
        }
        ckpt_hfai::save(&state, dst, &write).at(dst)?;
        let (lost, kept): (Vec<&Leaf>, Vec<&Leaf>) = content
            .leaves
            .iter()
            .partition(|l| matches!(l.path.first(), Some(PathItem::Key(p)) if dropped_keys.contains(p)));
        let mut s = count(kept);
        s.dropped = lost.into_iter().map(|l| l.name.clone()).collect();
        Ok(s)
    }

    /// Every part's record CRC-32s ([`ckpt_hfai::verify`]), then the parts merged and every entry read.
    fn verify(&self, path: &Path, report: &mut VerifyReport, progress: Progress<'_>) -> Result<()> {
        for part in &ckpt_hfai::verify(path).at(path)?.parts {
            for (record, e) in &part.problems {
                report.record_problem(&part.path, record, e);
            }
        }
        read_all(&self.checkpoint(path)?, report, progress);
        Ok(())
    }

    /// hfai's key split and `torch.chunk` chunking for `world` parts ([`ckpt_hfai::reshard`]).
    fn reshard(&self, src: &Path, dst: &Path, world: usize) -> Result<()> {
        ckpt_hfai::reshard(src, dst, world, &ckpt_hfai::ReshardOptions::default()).map(|_| ()).at(src)
    }
}
