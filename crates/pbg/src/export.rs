//! Export: entity embeddings and relation parameters to TSV exactly as `torchbiggraph_export_to_tsv`
//! writes them, and the whole checkpoint to safetensors.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use ckpt_safetensors as safetensors;
use ckpt_tensor::Tensor;
use rayon::prelude::*;

use crate::config::Config;
use crate::entity_path::EntityStorage;
use crate::error::{Error, Result};
use crate::reader::PbgReader;

/// Rows formatted per parallel task.
const ROWS_PER_TASK: usize = 1024;
/// Tasks formatted before their text is written (bounds the memory held by formatted rows).
const TASKS_PER_BATCH: usize = 64;

/// Appends `x` as Python's `"%.9f" % x` prints it (C's `printf`: the exact binary value rounded half to
/// even at the 9th decimal; `nan`, `inf`, `-inf`; a minus sign on negative values that round to zero).
fn push_f9(out: &mut String, x: f64) {
    if x.is_nan() {
        out.push_str("nan");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "inf" } else { "-inf" });
    } else {
        let _ = write!(out, "{x:.9}");
    }
}

/// [`push_f9`] for a float32, with exact integer arithmetic for |x| < 2^64 (every embedding in practice):
/// the value is `m * 2^e` with a 24-bit `m`, so `x * 10^9 = m * 10^9 * 2^e` is an integer shifted by a
/// power of two, rounded half to even.
fn push_f9_f32(out: &mut String, x: f32) {
    let bits = x.to_bits();
    let negative = bits >> 31 == 1;
    let exp_bits = (bits >> 23) & 0xff;
    let frac = u128::from(bits & 0x7f_ffff);
    if exp_bits == 0xff || exp_bits >= 127 + 64 {
        return push_f9(out, f64::from(x));
    }
    // x = m * 2^e exactly.
    let (m, e) = if exp_bits == 0 { (frac, -149i32) } else { (frac | 0x80_0000, exp_bits as i32 - 150) };
    let scaled = m * 1_000_000_000;
    let q: u128 = if e >= 0 {
        scaled << e
    } else {
        let k = e.unsigned_abs();
        if k >= 127 {
            0 // below 2^-103: rounds to zero
        } else {
            let q = scaled >> k;
            let rem = scaled & ((1u128 << k) - 1);
            let half = 1u128 << (k - 1);
            if rem > half || (rem == half && q & 1 == 1) { q + 1 } else { q }
        }
    };
    if negative {
        out.push('-');
    }
    let _ = write!(out, "{}.{:09}", q / 1_000_000_000, q % 1_000_000_000);
}

/// One line of PBG's `write()`: `"\t".join(key) + "\t" + "\t".join("%.9f" % v) + "\n"`.
fn push_line(out: &mut String, key: &[&str], values: impl Iterator<Item = f32>) {
    out.push_str(&key.join("\t"));
    out.push('\t');
    for (i, v) in values.enumerate() {
        if i > 0 {
            out.push('\t');
        }
        push_f9_f32(out, v);
    }
    out.push('\n');
}

fn float_values(t: &Tensor, what: &str) -> Result<Vec<f32>> {
    t.to_vec::<f32>().map_err(|_| Error::InvalidInput {
        what: what.to_owned(),
        reason: format!("export needs float32 values, found {}", t.dtype()),
    })
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|e| Error::io(path, e))
}

/// Writes the entities TSV: for each entity type of the config, each partition, each row, the entity's
/// name and its embedding (plus the type's global embedding when the config has `global_emb`), every value
/// as `%.9f`. Partitions are formatted in parallel; the output is streamed in order.
///
/// # Errors
/// [`Error::CouldNotLoad`] for a missing partition or names file, [`Error::NamesMismatch`],
/// [`Error::MissingParameter`] when a global embedding is missing, [`Error::Io`].
pub fn write_entities_tsv<W: Write>(
    checkpoint: &PbgReader,
    config: &Config,
    entities: &EntityStorage,
    out: W,
    out_path: &Path,
) -> Result<W> {
    let mut out = BufWriter::with_capacity(1 << 20, out);
    let parts: Vec<(String, u32)> =
        config.entities().iter().flat_map(|e| (0..e.num_partitions).map(move |p| (e.name.clone(), p))).collect();
    // Names of every partition, loaded in parallel.
    let names: Vec<Vec<String>> = parts.par_iter().map(|(e, p)| entities.load_names(e, *p)).collect::<Result<_>>()?;
    for ((entity, partition), names) in parts.iter().zip(names) {
        let entry = checkpoint.partition(entity, *partition).ok_or_else(|| Error::CouldNotLoad {
            path: checkpoint.storage().entity_partition_file(checkpoint.version(), entity, *partition),
        })?;
        let embs = &entry.data.embeddings;
        let rows = entry.data.len();
        let dim = entry.data.dimension();
        if names.len() != rows {
            return Err(Error::NamesMismatch {
                path: entities.names_file(entity, *partition),
                entity: entity.clone(),
                partition: *partition,
                names: names.len(),
                rows,
            });
        }
        let global = if config.global_emb() {
            let g = checkpoint
                .model()
                .and_then(|m| m.global_embedding(entity))
                .ok_or_else(|| Error::MissingParameter(format!("entities/{entity}/global_embedding")))?;
            Some(float_values(g, &format!("global embedding of {entity}"))?)
        } else {
            None
        };
        let cow;
        let values: &[f32] = match embs.as_slice::<f32>() {
            Ok(s) => s,
            Err(_) => {
                cow = float_values(embs, &format!("embeddings of {entity} {partition}"))?;
                &cow
            }
        };
        let tasks: Vec<(usize, usize)> =
            (0..rows).step_by(ROWS_PER_TASK).map(|s| (s, (s + ROWS_PER_TASK).min(rows))).collect();
        for batch in tasks.chunks(TASKS_PER_BATCH) {
            let texts: Vec<String> = batch
                .par_iter()
                .map(|&(start, end)| {
                    let mut s = String::with_capacity((end - start) * (dim * 13 + 16));
                    for (row, name) in names.iter().enumerate().take(end).skip(start) {
                        let r = values.get(row * dim..(row + 1) * dim).unwrap_or_default();
                        match &global {
                            Some(g) => push_line(&mut s, &[name], r.iter().zip(g).map(|(a, b)| a + b)),
                            None => push_line(&mut s, &[name], r.iter().copied()),
                        }
                    }
                    s
                })
                .collect();
            for t in texts {
                io(out_path, out.write_all(t.as_bytes()))?;
            }
        }
    }
    io(out_path, out.into_inner().map_err(std::io::IntoInnerError::into_error))
}

/// The parameters of each operator, in PBG's `named_parameters()` order (the model file keeps only the
/// top-level creation order, so it cannot tell).
fn operator_params(operator: &str, dynamic: bool) -> Option<&'static [&'static str]> {
    Some(match (operator, dynamic) {
        ("none", _) => &[],
        ("diagonal", false) => &["diagonal"],
        ("diagonal", true) => &["diagonals"],
        ("translation", false) => &["translation"],
        ("translation", true) => &["translations"],
        ("linear", false) => &["linear_transformation"],
        ("linear", true) => &["linear_transformations"],
        ("affine", false) => &["linear_transformation", "translation"],
        ("affine", true) => &["linear_transformations", "translations"],
        ("complex_diagonal", _) => &["real", "imag"],
        _ => return None,
    })
}

fn shape_text(shape: &[usize]) -> String {
    shape.iter().map(usize::to_string).collect::<Vec<_>>().join("x")
}

/// The parameters of relation `index`'s operator on `side`, in `named_parameters()` order (unknown
/// operators: the model file's order).
fn ordered_params<'c>(
    checkpoint: &'c PbgReader,
    index: usize,
    side: &str,
    operator: &str,
    dynamic: bool,
) -> Vec<(String, &'c Tensor)> {
    let Some(model) = checkpoint.model() else { return Vec::new() };
    let found = model.operator_parameters(index, side);
    match operator_params(operator, dynamic) {
        Some(order) => order
            .iter()
            .filter_map(|n| found.iter().find(|(m, _)| m == n).map(|(m, t)| ((*m).to_owned(), *t)))
            .collect(),
        None => found.into_iter().map(|(n, t)| (n.to_owned(), t)).collect(),
    }
}

/// Writes the relation-types TSV like `torchbiggraph_export_to_tsv` (with the parameter flattening of
/// PBG master; 1.0.0 crashes on 2-D parameters): for dynamic relations, each side, each parameter, each
/// relation type its row; otherwise each relation's right-hand operator's parameters. The names come from
/// `dynamic_rel_names.json`, or for non-dynamic configs without that file, from the config.
///
/// # Errors
/// [`Error::RelationNameMismatch`] if the names file disagrees with the config, [`Error::MissingParameter`]
/// for an operator parameter absent from the model, [`Error::Io`].
pub fn write_relation_types_tsv<W: Write>(
    checkpoint: &PbgReader,
    config: &Config,
    entities: &EntityStorage,
    out: W,
    out_path: &Path,
) -> Result<W> {
    let mut out = BufWriter::new(out);
    let dynamic = config.dynamic_relations();
    let names = match entities.load_relation_names()? {
        Some(n) => n,
        None if !dynamic => config.relations().iter().map(|r| r.name.clone()).collect(),
        None => return Err(Error::CouldNotLoad { path: entities.relation_names_file() }),
    };
    let mut text = String::new();
    if dynamic {
        let rel = config.relations().first().ok_or_else(|| Error::MissingParameter("relations[0]".into()))?;
        for side in ["lhs", "rhs"] {
            for (param, t) in ordered_params(checkpoint, 0, side, &rel.operator, true) {
                let values = float_values(t, &param)?;
                let rows = t.shape().first().copied().unwrap_or(0);
                let per = values.len().checked_div(rows).unwrap_or(0);
                let row_shape = shape_text(t.shape().get(1..).unwrap_or_default());
                for (r, name) in names.iter().enumerate().take(rows) {
                    let v = values.get(r * per..(r + 1) * per).unwrap_or_default();
                    push_line(&mut text, &[name, side, &rel.operator, &param, &row_shape], v.iter().copied());
                }
            }
        }
    } else {
        for (index, (name, rel)) in names.iter().zip(config.relations()).enumerate() {
            if name != &rel.name {
                return Err(Error::RelationNameMismatch { index, expected: rel.name.clone(), found: name.clone() });
            }
            let expected = operator_params(&rel.operator, false).unwrap_or_default();
            let params = ordered_params(checkpoint, index, "rhs", &rel.operator, false);
            if let Some(missing) = expected.iter().find(|n| !params.iter().any(|(m, _)| m == *n)) {
                return Err(Error::MissingParameter(format!("relations/{index}/operator/rhs/{missing}")));
            }
            for (param, t) in params {
                let values = float_values(t, &param)?;
                push_line(&mut text, &[name, "rhs", &rel.operator, &param, &shape_text(t.shape())], values.into_iter());
            }
        }
    }
    io(out_path, out.write_all(text.as_bytes()))?;
    io(out_path, out.into_inner().map_err(std::io::IntoInnerError::into_error))
}

fn create_new(path: &Path) -> Result<File> {
    OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => Error::AlreadyExists { path: path.to_path_buf() },
        _ => Error::io(path, e),
    })
}

/// `torchbiggraph_export_to_tsv`: writes both TSV files, which must not exist yet (PBG opens them with
/// mode `"xt"`).
///
/// # Errors
/// [`Error::AlreadyExists`], and as [`write_entities_tsv`] and [`write_relation_types_tsv`].
pub fn export_tsv(
    checkpoint: &PbgReader,
    config: &Config,
    entities: &EntityStorage,
    entities_output: &Path,
    relation_types_output: &Path,
) -> Result<()> {
    let e = create_new(entities_output)?;
    let r = create_new(relation_types_output)?;
    write_entities_tsv(checkpoint, config, entities, e, entities_output)?
        .sync_all()
        .map_err(|err| Error::io(entities_output, err))?;
    write_relation_types_tsv(checkpoint, config, entities, r, relation_types_output)?
        .sync_all()
        .map_err(|err| Error::io(relation_types_output, err))
}

/// Everything in one safetensors file, under the [`PbgReader`] entry names, with ckpt's safetensors
/// convention ([`ckpt_safetensors::metadata`]: `format` = `pt`, `ckpt.source` = `pbg`, the non-tensor
/// entries (`config`, `version`, the optimizers' scalars) in `ckpt.values`), so the file converts back into
/// a PBG checkpoint ([`crate::save`]). Returns the names of the entries it could not hold (a non-finite
/// float optimizer scalar).
///
/// ```
/// # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/pbg/ckpt");
/// use ckpt_tensor::CheckpointRead;
/// let ck = ckpt_pbg::PbgReader::open(&fixture).unwrap();
/// let dir = tempfile::tempdir().unwrap();
/// let out = dir.path().join("pbg.safetensors");
/// assert!(ckpt_pbg::export_safetensors(&ck, &out).unwrap().is_empty());
/// let st = ckpt_safetensors::SafetensorsReader::open(&out).unwrap();
/// assert_eq!(st.value("version").unwrap(), ckpt_tensor::Value::Int(4));
/// ```
///
/// # Errors
/// [`Error::Core`] for safetensors failures and I/O.
pub fn export_safetensors(checkpoint: &PbgReader, path: &Path) -> Result<Vec<String>> {
    let entries = checkpoint.entry_values();
    let paths: Vec<[ckpt_tensor::PathItem; 1]> =
        entries.iter().map(|(name, _)| [ckpt_tensor::PathItem::Key(name.clone())]).collect();
    let report = safetensors::metadata::save_entries(
        entries.iter().zip(&paths).map(|((name, value), p)| (name.as_str(), p.as_slice(), value)),
        path,
        &safetensors::metadata::WriteOptions::default().with_source("pbg"),
    )?;
    Ok(report.dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_path_agrees_with_exact_formatting() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let check = |x: f32| {
            let (mut a, mut b) = (String::new(), String::new());
            push_f9_f32(&mut a, x);
            push_f9(&mut b, f64::from(x));
            assert_eq!(a, b, "{x:e} ({:#x})", x.to_bits());
        };
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            check(f32::from_bits(state as u32));
        }
        for m in 1..40 {
            for k in (1..64).step_by(2) {
                check(k as f32 / (1u64 << m) as f32);
                check(-(k as f32) / (1u64 << m) as f32);
            }
        }
        for x in [0.0, -0.0, f32::MIN_POSITIVE, -f32::from_bits(1), f32::MAX, 1.8446744e19, 5e-10, -5e-10, 0.0000000005]
        {
            check(x);
        }
    }

    #[test]
    fn percent_nine_f() {
        let mut s = String::new();
        for x in [0.0, -0.0, 1.0 / 1024.0, 0.123_456_789_5, -2.5e-10, 1e20, f64::NAN, f64::NEG_INFINITY] {
            push_f9(&mut s, x);
            s.push(' ');
        }
        assert_eq!(
            s,
            "0.000000000 -0.000000000 0.000976562 0.123456789 -0.000000000 100000000000000000000.000000000 nan -inf "
        );
    }
}
