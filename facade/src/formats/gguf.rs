//! GGUF files (llama.cpp, ggml), through `ckpt-gguf`'s reader: the metadata as values under their keys, the
//! tensors under their names in torch-order shapes, quantized ones dequantized to float32 as they are read;
//! written from any format with `--quant`, streaming and durably (`ckpt_gguf::save`).

use std::path::Path;

use ckpt_gguf::{GgmlType, Reader as GgufReader, WriteOptions};
use ckpt_tensor::Value;

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

    /// Every tensor under its name (torch-order shapes written as GGUF's reversed dimensions) in its own type,
    /// or with `--quant` float tensors of two or more dimensions in its type; the metadata of a GGUF source carried over as it was. Other
    /// values have no place in GGUF and are reported dropped.
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary> {
        let quant = quant(options, dst)?;
        let metadata = if source.format() == Format::Gguf {
            GgufReader::open(source.path).at(source.path)?.metadata().to_vec()
        } else {
            Vec::new()
        };
        let content = source.content()?;
        let mut tensors = Vec::new();
        let mut dropped = Vec::new();
        for leaf in &content.leaves {
            match &leaf.value {
                Value::Tensor(t) | Value::Parameter { tensor: t, .. } => {
                    // A dtype GGUF has no type for (bool, unsigned, complex) is left out, and named.
                    if ckpt_gguf::writer::tensor_type(&leaf.name, t.dtype(), t.shape(), quant).is_ok() {
                        tensors.push((leaf.name.clone(), t.clone()));
                    } else {
                        dropped.push(leaf.name.clone());
                    }
                }
                _ if metadata.iter().any(|(k, _)| *k == leaf.name) => {}
                _ => dropped.push(leaf.name.clone()),
            }
        }
        let values = metadata.len();
        let mut write = WriteOptions::default().with_metadata(metadata).with_durability(options.durability);
        if let Some(quant) = quant {
            write = write.with_quant(quant);
        }
        let report = ckpt_gguf::save(&tensors, dst, &write).at(dst)?;
        Ok(ConvertSummary { tensors: report.tensors, bytes: report.bytes, values, dropped })
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

/// The ggml type `--quant` names (`None`: every tensor keeps its own type).
fn quant(options: &ConvertOptions, dst: &Path) -> Result<Option<GgmlType>> {
    let name = match &options.target {
        crate::options::TargetOptions::Gguf { quant: Some(name) } => name.as_str(),
        _ => return Ok(None),
    };
    GgmlType::from_name(name).filter(|t| ckpt_gguf::quantize::can_quantize(*t)).map(Some).ok_or_else(|| {
        Error::InvalidArgument {
            path: dst.to_path_buf(),
            reason: format!("--quant {name}: GGUF targets take f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or mxfp4"),
        }
    })
}

/// `ckpt convert`'s flags for GGUF targets.
#[cfg(feature = "cli")]
#[derive(clap::Args, Debug, Default)]
pub struct GgufArgs {
    /// gguf targets: the type of the float tensors of two or more dimensions whose rows are whole blocks of it
    /// (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, mxfp4); 1-D tensors become f32, as llama.cpp's converter
    /// keeps them. Quantized bit for bit as gguf-py's gguf.quants.quantize. Default: every tensor in its own
    /// type (f32, f16, bf16, f64, integers), losslessly.
    #[arg(long, value_name = "TYPE", value_parser = quant_name)]
    pub quant: Option<GgmlType>,
}

/// `--quant`, a type ckpt writes.
#[cfg(feature = "cli")]
fn quant_name(name: &str) -> std::result::Result<GgmlType, String> {
    GgmlType::from_name(name)
        .filter(|t| ckpt_gguf::quantize::can_quantize(*t))
        .ok_or_else(|| format!("{name}: GGUF targets take f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or mxfp4"))
}

#[cfg(feature = "cli")]
impl GgufArgs {
    /// The target options these flags give, and the flags given.
    pub(crate) fn target(&self) -> (crate::options::TargetOptions, Option<&'static str>) {
        let given = self.quant.as_ref().map(|_| "--quant");
        let quant = self.quant.map(|t| t.name().to_ascii_lowercase());
        (crate::options::TargetOptions::Gguf { quant }, given)
    }
}
