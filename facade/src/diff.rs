//! Comparing two checkpoints of any formats: entries on one side only, dtype and shape changes, value
//! differences within numpy `allclose` tolerances.

use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::limits::ReadLimits;
use crate::report::Progress;
use ckpt_tensor::{DType, EntryKind, Tensor};

/// Tolerances of [`diff`]: two tensor elements `a` (first checkpoint) and `b` (second) are equal when
/// `|a - b| <= atol + rtol * |b|` (numpy's `allclose`), or both NaN, or both the same infinity. Non-tensor
/// values are compared exactly ([`crate::Value::same`]: same kinds, floats bit for bit).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DiffOptions {
    /// Relative tolerance (numpy's default 1e-5).
    pub rtol: f64,
    /// Absolute tolerance (numpy's default 1e-8).
    pub atol: f64,
    /// The resource limits both checkpoints are read under (default [`ReadLimits::default`]).
    pub limits: ReadLimits,
    /// How both checkpoints are read (a DeepSpeed tag, Megatron's layers, a name map; formats they do not
    /// apply to ignore them).
    pub source: crate::source::SourceOptions,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            rtol: 1e-5,
            atol: 1e-8,
            limits: ReadLimits::default(),
            source: crate::source::SourceOptions::default(),
        }
    }
}

impl DiffOptions {
    /// These options reading both checkpoints as `source` says.
    #[must_use]
    pub fn with_source(mut self, source: crate::source::SourceOptions) -> Self {
        self.source = source;
        self
    }

    /// These options reading both checkpoints under `limits`.
    #[must_use]
    pub fn with_limits(mut self, limits: ReadLimits) -> Self {
        self.limits = limits;
        self
    }

    /// These options with relative tolerance `rtol`.
    #[must_use]
    pub fn with_rtol(mut self, rtol: f64) -> Self {
        self.rtol = rtol;
        self
    }

    /// These options with absolute tolerance `atol`.
    #[must_use]
    pub fn with_atol(mut self, atol: f64) -> Self {
        self.atol = atol;
        self
    }
}

/// How the values of one tensor present on both sides compare.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TensorDiff {
    /// Entry name.
    pub name: String,
    /// Dtype on each side.
    pub dtype: (DType, DType),
    /// Shape on each side.
    pub shape: (Vec<usize>, Vec<usize>),
    /// Largest `|a - b|` (infinite where one side is NaN or infinite and the other not); 0 when the shapes
    /// differ (values not compared).
    pub max_abs: f64,
    /// Largest `|a - b| / |b|` (infinite where `b` is 0 and `a` is not).
    pub max_rel: f64,
    /// Elements outside the tolerance (for dtypes without a numeric value, elements whose bytes differ).
    pub mismatched: usize,
    /// Elements compared.
    pub numel: usize,
    /// Whether the values were compared as bytes (packed, quantized and opaque dtypes).
    pub bytewise: bool,
}

impl TensorDiff {
    /// Whether the two tensors are equal within the tolerance: same dtype, same shape, no mismatch.
    pub fn is_equal(&self) -> bool {
        self.dtype.0 == self.dtype.1 && self.shape.0 == self.shape.1 && self.mismatched == 0
    }
}

/// What [`diff`] found.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DiffReport {
    /// Entries only in the first checkpoint.
    pub only_a: Vec<String>,
    /// Entries only in the second checkpoint.
    pub only_b: Vec<String>,
    /// Entries that are a tensor on one side and a value (or opaque tensor) on the other: name, kinds.
    pub kind_changes: Vec<(String, String, String)>,
    /// Every tensor on both sides, compared.
    pub tensors: Vec<TensorDiff>,
    /// Non-tensor values on both sides that differ.
    pub values_differ: Vec<String>,
    /// Non-tensor values compared equal.
    pub values_equal: usize,
    /// Entries that failed to read on either side: name, error.
    pub unreadable: Vec<(String, String)>,
    /// Hash tables (RecIS's `<table>@id` with its `<table>@<slot>` rows) whose rows are in another order on
    /// each side (another shard layout) and were compared id by id.
    pub aligned_by_id: Vec<String>,
}

impl DiffReport {
    /// Whether both checkpoints hold the same entries, with equal values within the tolerance.
    pub fn is_equal(&self) -> bool {
        self.only_a.is_empty()
            && self.only_b.is_empty()
            && self.kind_changes.is_empty()
            && self.values_differ.is_empty()
            && self.unreadable.is_empty()
            && self.tensors.iter().all(TensorDiff::is_equal)
    }
}

/// Compares the checkpoints at `a` and `b` (formats detected, possibly different), entry by entry, by the
/// names each reader lists.
///
/// ```
/// use ckpt::tensor::{Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let (a, b) = (dir.path().join("a.pt"), dir.path().join("b.pt"));
/// let t = |v: f32| Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, v], &[2]).unwrap()))]);
/// ckpt::torch::save(&t(2.0), &a, &ckpt::torch::WriteOptions::default()).unwrap();
/// ckpt::torch::save(&t(2.5), &b, &ckpt::torch::WriteOptions::default()).unwrap();
/// let d = ckpt::diff(&a, &b, &ckpt::DiffOptions::default()).unwrap();
/// assert!(!d.is_equal());
/// assert_eq!(d.tensors[0].max_abs, 0.5);
/// assert!(ckpt::diff(&a, &b, &ckpt::DiffOptions::default().with_atol(0.5)).unwrap().is_equal());
/// ```
///
/// # Errors
/// When either checkpoint cannot be opened; entries that fail to read are listed in
/// [`DiffReport::unreadable`].
pub fn diff(a: &Path, b: &Path, options: &DiffOptions) -> Result<DiffReport> {
    diff_with_progress(a, b, options, &|_, _| {})
}

/// [`diff`], reporting progress over the entries compared.
///
/// # Errors
/// As [`diff`].
pub fn diff_with_progress(a: &Path, b: &Path, options: &DiffOptions, progress: Progress<'_>) -> Result<DiffReport> {
    let ca = crate::open::open_source(a, None, &options.limits, &options.source)?;
    let cb = crate::open::open_source(b, None, &options.limits, &options.source)?;
    diff_checkpoints(&ca, &cb, options, progress)
}

fn kind_name(k: &EntryKind) -> String {
    match k {
        EntryKind::Tensor(t) => format!("tensor {} {:?}", t.dtype.torch_name(), t.shape),
        EntryKind::OpaqueTensor(o) => format!("{o:?} tensor").to_lowercase(),
        _ => "value".into(),
    }
}

fn diff_checkpoints(
    ca: &Checkpoint,
    cb: &Checkpoint,
    options: &DiffOptions,
    progress: Progress<'_>,
) -> Result<DiffReport> {
    let ea = ca.entries();
    let eb = cb.entries();
    let kinds_b: std::collections::HashMap<&str, &EntryKind> = eb.iter().map(|e| (e.name.as_str(), &e.kind)).collect();
    let names_a: std::collections::HashSet<&str> = ea.iter().map(|e| e.name.as_str()).collect();
    let mut report = DiffReport {
        only_b: eb.iter().filter(|e| !names_a.contains(e.name.as_str())).map(|e| e.name.clone()).collect(),
        ..DiffReport::default()
    };
    let alignments = id_alignments(ca, cb, &ea, &kinds_b);
    report.aligned_by_id = alignments.keys().cloned().collect();
    report.aligned_by_id.sort();
    let total = ea.len() as u64;
    for (i, e) in ea.iter().enumerate() {
        progress(i as u64, total);
        let Some(kb) = kinds_b.get(e.name.as_str()) else {
            report.only_a.push(e.name.clone());
            continue;
        };
        let name = &e.name;
        match (&e.kind, kb) {
            (EntryKind::Tensor(_), EntryKind::Tensor(_)) => match (ca.tensor(name), cb.tensor(name)) {
                (Ok(ta), Ok(tb)) => {
                    match aligned(name, tb, &alignments).and_then(|tb| compare(name, &ta, &tb, options)) {
                        Ok(d) => report.tensors.push(d),
                        Err(err) => report.unreadable.push((name.clone(), err.to_string())),
                    }
                }
                (Err(err), _) | (_, Err(err)) => report.unreadable.push((name.clone(), err.to_string())),
            },
            (EntryKind::OpaqueTensor(x), EntryKind::OpaqueTensor(y)) if x == y => {
                report.values_equal += 1;
            }
            (ka @ (EntryKind::Tensor(_) | EntryKind::OpaqueTensor(_)), kb)
            | (ka, kb @ (EntryKind::Tensor(_) | EntryKind::OpaqueTensor(_))) => {
                report.kind_changes.push((name.clone(), kind_name(ka), kind_name(kb)));
            }
            _ => match (ca.value(name), cb.value(name)) {
                (Ok(va), Ok(vb)) => {
                    if va.same(&vb) {
                        report.values_equal += 1;
                    } else {
                        report.values_differ.push(name.clone());
                    }
                }
                (Err(err), _) | (_, Err(err)) => report.unreadable.push((name.clone(), err.to_string())),
            },
        }
    }
    progress(total, total);
    Ok(report)
}

/// For every hash table `<table>@id` (1-D int64) on both sides holding the same ids in another order: the
/// position in `b` of each id of `a`, by table name.
fn id_alignments(
    ca: &Checkpoint,
    cb: &Checkpoint,
    ea: &[ckpt_tensor::Entry],
    kinds_b: &std::collections::HashMap<&str, &EntryKind>,
) -> std::collections::HashMap<String, Vec<usize>> {
    let mut out = std::collections::HashMap::new();
    for e in ea {
        let Some(table) = e.name.strip_suffix("@id") else {
            continue;
        };
        let is_ids = |k: &EntryKind| matches!(k, EntryKind::Tensor(t) if t.dtype == DType::I64 && t.shape.len() == 1);
        if !is_ids(&e.kind) || !kinds_b.get(e.name.as_str()).is_some_and(|k| is_ids(k)) {
            continue;
        }
        let ids = |c: &Checkpoint| c.tensor(&e.name).ok().and_then(|t| t.to_vec::<i64>().ok());
        let (Some(a), Some(b)) = (ids(ca), ids(cb)) else {
            continue;
        };
        if a.len() != b.len() || a == b {
            continue;
        }
        let position: std::collections::HashMap<i64, usize> = b.iter().enumerate().map(|(k, id)| (*id, k)).collect();
        if position.len() != b.len() {
            continue; // duplicate ids: no one-to-one alignment
        }
        if let Some(perm) = a.iter().map(|id| position.get(id).copied()).collect::<Option<Vec<usize>>>() {
            out.insert(table.to_owned(), perm);
        }
    }
    out
}

/// A rule of a diff that the checkpoints break; it converts into the core error as
/// [`ckpt_tensor::Error::Format`] with its [`DiffError::fault`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiffError {
    /// A row of an aligned table past the rows of the entry.
    #[error("invalid argument: {name}: row {row} beyond {rows} rows")]
    RowBeyond {
        /// The entry.
        name: String,
        /// The row.
        row: usize,
        /// The entry's rows.
        rows: usize,
    },
}

impl DiffError {
    /// Who is at fault.
    pub fn fault(&self) -> ckpt_tensor::Fault {
        match self {
            DiffError::RowBeyond { .. } => ckpt_tensor::Fault::InvalidArgument,
        }
    }
}

/// The core error, keeping this error as its source ([`ckpt_tensor::Error::Format`]).
impl From<DiffError> for ckpt_tensor::Error {
    fn from(e: DiffError) -> Self {
        ckpt_tensor::Error::format(e.fault(), e)
    }
}

/// `b`'s entry `name` with its rows in the order of `a`'s ids, when `name` is `<table>@...` of an aligned
/// table and has one row per id; else `b` as it is.
fn aligned(
    name: &str,
    b: Tensor,
    alignments: &std::collections::HashMap<String, Vec<usize>>,
) -> ckpt_tensor::Result<Tensor> {
    let Some(perm) = name.split_once('@').and_then(|(table, _)| alignments.get(table)) else {
        return Ok(b);
    };
    if b.shape().first() != Some(&perm.len()) {
        return Ok(b);
    }
    let data = b.data()?;
    let row = data.len() / perm.len().max(1);
    let mut out = Vec::with_capacity(data.len());
    for &k in perm {
        let bytes = data.get(k * row..(k + 1) * row).ok_or_else(|| DiffError::RowBeyond {
            name: name.to_owned(),
            row: k,
            rows: perm.len(),
        })?;
        out.extend_from_slice(bytes);
    }
    Tensor::from_buffer(b.dtype(), b.shape(), ckpt_tensor::Buffer::from_vec(out))
}

/// The real dtype of a complex dtype's components.
fn component(dtype: DType) -> Option<DType> {
    match dtype {
        DType::C32 => Some(DType::F16),
        DType::C64 => Some(DType::F32),
        DType::C128 => Some(DType::F64),
        _ => None,
    }
}

/// The dtype values are decoded as (complex as two components), when numeric.
fn numeric(dtype: DType) -> Option<DType> {
    let d = component(dtype).unwrap_or(dtype);
    crate::display::element_f64(d, &[0; 8]).map(|_| d)
}

fn compare(name: &str, a: &Tensor, b: &Tensor, options: &DiffOptions) -> ckpt_tensor::Result<TensorDiff> {
    let mut d = TensorDiff {
        name: name.to_owned(),
        dtype: (a.dtype(), b.dtype()),
        shape: (a.shape().to_vec(), b.shape().to_vec()),
        max_abs: 0.0,
        max_rel: 0.0,
        mismatched: 0,
        numel: 0,
        bytewise: false,
    };
    if a.shape() != b.shape() {
        d.mismatched = a.numel().max(b.numel());
        return Ok(d);
    }
    d.numel = a.numel();
    let (da, db) = (a.data()?, b.data()?);
    if a.dtype() == b.dtype() && da == db {
        // Identical bytes: every element equal (NaN payloads included), nothing to decode.
        return Ok(d);
    }
    let (na, nb) = (numeric(a.dtype()), numeric(b.dtype()));
    let complex = (component(a.dtype()).is_some(), component(b.dtype()).is_some());
    match (na, nb) {
        (Some(xa), Some(xb)) if complex.0 == complex.1 => {
            let (sa, sb) = (xa.size(), xb.size());
            // Blocks of elements decoded to f64 (one dtype dispatch per block), then compared.
            const BLOCK: usize = 1 << 14;
            let (mut va, mut vb) = (Vec::with_capacity(BLOCK), Vec::with_capacity(BLOCK));
            for (ba, bb) in da.chunks(BLOCK * sa).zip(db.chunks(BLOCK * sb)) {
                decode(xa, ba, &mut va);
                decode(xb, bb, &mut vb);
                for (&x, &y) in va.iter().zip(&vb) {
                    let (abs, ok) = close(x, y, options);
                    d.mismatched += usize::from(!ok);
                    d.max_abs = d.max_abs.max(abs);
                    if abs != 0.0 {
                        d.max_rel = d.max_rel.max(abs / y.abs());
                    }
                }
            }
        }
        _ => {
            d.bytewise = true;
            if a.dtype() != b.dtype() {
                d.mismatched = d.numel;
            } else {
                let es = a.dtype().size().max(1);
                d.mismatched = da.chunks(es).zip(db.chunks(es)).filter(|(x, y)| x != y).count();
            }
            if d.mismatched > 0 {
                d.max_abs = f64::INFINITY;
                d.max_rel = f64::INFINITY;
            }
        }
    }
    Ok(d)
}

/// Decodes little-endian elements of a numeric dtype into `out` (cleared first).
fn decode(dtype: DType, bytes: &[u8], out: &mut Vec<f64>) {
    out.clear();
    fn each<const N: usize>(bytes: &[u8], out: &mut Vec<f64>, f: impl Fn([u8; N]) -> f64) {
        out.extend(bytes.chunks_exact(N).map(|c| <[u8; N]>::try_from(c).map_or(f64::NAN, &f)));
    }
    match dtype {
        DType::F32 => each(bytes, out, |b| f64::from(f32::from_le_bytes(b))),
        DType::F64 => each(bytes, out, f64::from_le_bytes),
        DType::I32 => each(bytes, out, |b| f64::from(i32::from_le_bytes(b))),
        _ => {
            let size = dtype.size().max(1);
            out.extend(bytes.chunks_exact(size).map(|c| crate::display::element_f64(dtype, c).unwrap_or(f64::NAN)));
        }
    }
}

/// `|a - b|` and whether `a` is close to `b` (numpy `isclose` with `equal_nan`).
fn close(a: f64, b: f64, o: &DiffOptions) -> (f64, bool) {
    if a == b || (a.is_nan() && b.is_nan()) {
        return (0.0, true);
    }
    if !a.is_finite() || !b.is_finite() {
        return (f64::INFINITY, false);
    }
    let abs = (a - b).abs();
    (abs, abs <= o.atol + o.rtol * b.abs())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn allclose_semantics() {
        let o = DiffOptions::default();
        assert!(close(f64::NAN, f64::NAN, &o).1);
        assert!(close(f64::INFINITY, f64::INFINITY, &o).1);
        assert!(!close(f64::INFINITY, f64::NEG_INFINITY, &o).1);
        assert!(!close(1.0, f64::NAN, &o).1);
        assert!(close(1.0, 1.0 + 1e-6, &o).1);
        assert!(!close(1.0, 1.001, &o).1);
        // Asymmetric, like numpy: the tolerance scales with b.
        let o = DiffOptions::default().with_rtol(0.5).with_atol(0.0);
        assert!(close(1.0, 2.0, &o).1);
        assert!(!close(2.0, 1.0, &o).1);
    }

    #[test]
    fn dtypes_compare_as_values() {
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let b = Tensor::from_slice(&[1i64, 2, 4], &[3]).unwrap();
        let d = compare("x", &a, &b, &DiffOptions::default()).unwrap();
        assert_eq!((d.max_abs, d.mismatched), (1.0, 1));
        assert!(!d.is_equal(), "a dtype change is a difference");
        let c = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        assert!(!compare("x", &a, &c, &DiffOptions::default()).unwrap().is_equal());
    }
}
