//! `torch.save` files, through `ckpt-torch`.

use std::path::Path;

use crate::Format;
use crate::adaptor::{Adaptor, Content, Reader, Source, count};
use crate::convert::{ConvertOptions, ConvertSummary};
use crate::error::{At, Cause, Error, Result};
use crate::verify::{Progress, VerifyReport, read_all};

pub(crate) struct Torch;

impl Cause for ckpt_torch::Error {
    fn at(self, path: &Path) -> Error {
        ckpt_core::Error::from(self).at(path)
    }
}

impl Adaptor for Torch {
    fn format(&self) -> Format {
        Format::Torch
    }

    fn open(&self, path: &Path) -> Result<Box<dyn Reader>> {
        Ok(Box::new(ckpt_torch::TorchReader::open(path).at(path)?))
    }

    /// The saved object, and its leaves.
    fn read(&self, path: &Path) -> Result<Content> {
        Content::from_tree(ckpt_torch::TorchReader::open(path).at(path)?.into_value(), path)
    }

    /// The source's state dict, as `torch.save` writes it; a source that can streams itself instead.
    fn write(&self, source: &Source<'_>, dst: &Path, _: &ConvertOptions) -> Result<ConvertSummary> {
        if let Some(streamed) = source.stream_to_torch_save(dst) {
            return streamed;
        }
        let content = source.content()?;
        ckpt_torch::save(&content.tree, dst, &ckpt_torch::WriteOptions::default()).at(dst)?;
        Ok(count(&content.leaves))
    }

    /// The archive's structure and every record's CRC-32 ([`ckpt_torch::verify`]), then every entry read.
    fn verify(&self, path: &Path, report: &mut VerifyReport, progress: Progress<'_>) -> Result<()> {
        let crcs = ckpt_torch::verify(path).at(path)?;
        for (record, e) in &crcs.problems {
            report.record_problem(&crcs.path, record, e);
        }
        read_all(&self.checkpoint(path)?, report, progress);
        Ok(())
    }

    /// The torch codec names the wrong-file cases: a git-LFS pointer, an HTML page, a TAR-era archive, an
    /// empty file.
    fn explain(&self, head: &[u8], path: &Path) -> Option<Error> {
        ckpt_torch::detect(head).err().map(|e| Cause::at(e, path))
    }
}
