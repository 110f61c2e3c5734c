//! GGUF files (llama.cpp, ggml), through `ckpt-gguf`'s reader: the metadata as values under their keys, the
//! tensors under their names in torch-order shapes, quantized ones dequantized to float32 as they are read.
//! Read only: a conversion writes another format.

use std::path::Path;

use ckpt_gguf::Reader as GgufReader;

use crate::adaptor::{Adaptor, Layout, Source};
use crate::checkpoint::{Checkpoint, Reader};
use crate::error::{At, Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::{ConvertOptions, Depth};
use crate::report::{ConvertSummary, Problem, ProblemKind, Progress, VerifyReport};

pub(crate) struct Gguf;

impl Adaptor for Gguf {
    fn format(&self) -> Format {
        Format::Gguf
    }

    /// The whole header checked at open: counts, types, offsets, alignment, extents, overlaps.
    fn open(&self, path: &Path, _: &ReadLimits) -> Result<Box<dyn Reader>> {
        Ok(Box::new(GgufReader::open(path).at(path)?))
    }

    fn write(&self, source: &Source<'_>, _: &Path, _: &ConvertOptions) -> Result<ConvertSummary> {
        Err(Error::UnsupportedConversion {
            from: source.format(),
            to: Format::Gguf,
            reason: "ckpt reads GGUF files but does not write them yet; convert to safetensors, hf or torch".into(),
        })
    }

    /// The header (checked whole at open), the data laid out as llama.cpp loads it (each tensor where the
    /// previous one ends, padded to the alignment); deep, every block of every tensor read.
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        _: &ReadLimits,
        report: &mut VerifyReport,
        progress: Progress<'_>,
    ) -> Result<()> {
        let file = GgufReader::open(path).at(path)?;
        report.files += 1;
        let alignment = file.header().alignment;
        let mut expected = 0u64;
        let total = file.tensors().len() as u64;
        for (i, t) in file.tensors().iter().enumerate() {
            if t.offset != expected {
                report.push(
                    Problem::new(
                        ProblemKind::Inconsistent,
                        format!(
                            "tensor data at offset {} where llama.cpp expects {expected} (the end of the previous \
                             tensor, padded to {alignment}): llama.cpp refuses the file; ckpt and gguf-py read it",
                            t.offset
                        ),
                    )
                    .at_entry(&t.name),
                );
            }
            expected = t.offset.saturating_add(t.n_bytes.div_ceil(alignment).saturating_mul(alignment));
            match file.raw(&t.name) {
                Ok(raw) => {
                    if depth == Depth::Deep {
                        let mut x = 0u8;
                        for b in raw.as_bytes() {
                            x ^= *b;
                        }
                        std::hint::black_box(x);
                    }
                    report.bytes += raw.len() as u64;
                }
                Err(e) => report.push(Problem::from_error(ProblemKind::Unreadable, &e).at_entry(&t.name)),
            }
            report.records += 1;
            progress(i as u64 + 1, total);
        }
        Ok(())
    }

    /// The metadata keys are the file's own description, not state: `diff` leaves them out.
    fn layout(&self, ck: &Checkpoint, _: &ReadLimits) -> Result<Layout> {
        let keys = ck
            .downcast_ref::<GgufReader>()
            .map(|r| r.metadata().iter().map(|(k, _)| k.clone()).collect())
            .unwrap_or_default();
        Ok(Layout { keys, ..Layout::default() })
    }
}
