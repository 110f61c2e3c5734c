//! Comparing two checkpoints of any formats: entries on one side only, dtype and shape changes, value
//! differences within numpy `allclose` tolerances.

use std::collections::HashMap;
use std::path::Path;

use crate::adaptor::Layout;
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::report::Progress;
use ckpt_tensor::FormatError;
use ckpt_tensor::{DType, Entry, EntryKind, Tensor, Value};

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
    /// What is compared: the state each format's layout carries (default), or every entry as listed.
    pub layout: DiffLayout,
}

/// What [`diff`] compares of two checkpoints ([`DiffOptions::layout`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DiffLayout {
    /// The state each format's layout carries: entries paired by their names, else by the names the state
    /// has in its format (hfai nests a plain state dict under `model.`, RecIS keeps `model.pt`'s entries
    /// bare); the format's own bookkeeping (hfai's `__nshards__`, `__version__`, its empty `optimizer`) left
    /// out of the comparison and listed in [`DiffReport::layout_a`] and [`DiffReport::layout_b`]. A
    /// conversion diffs equal to its source in every target format.
    #[default]
    State,
    /// Every entry as its reader lists it, by its own name (layout keys are differences too).
    Raw,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            rtol: 1e-5,
            atol: 1e-8,
            limits: ReadLimits::default(),
            source: crate::source::SourceOptions::default(),
            layout: DiffLayout::State,
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

    /// These options comparing what `layout` says ([`DiffLayout::Raw`]: every entry as listed).
    #[must_use]
    pub fn with_layout(mut self, layout: DiffLayout) -> Self {
        self.layout = layout;
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
    /// The first element outside the tolerance, as an index into the (common) shape; `None` when every
    /// element is within it or the shapes differ.
    pub first_index: Option<Vec<usize>>,
    /// The values of both sides at [`TensorDiff::first_index`] (`None` for values compared as bytes).
    pub first_values: Option<(f64, f64)>,
}

impl TensorDiff {
    /// Whether the two tensors are equal within the tolerance: same dtype, same shape, no mismatch.
    pub fn is_equal(&self) -> bool {
        self.dtype.0 == self.dtype.1 && self.shape.0 == self.shape.1 && self.mismatched == 0
    }

    /// How the tensors compare, as `ckpt diff` says it: `dtype float32 vs float64`, `shape [2] vs [3]`, the
    /// largest differences (`max abs diff 0.25, max rel diff 0.2, 1 of 4 elements outside tolerance`) and
    /// the first element outside the tolerance (`first at [1, 0]: 1.0 vs 1.25`).
    pub fn shown(&self) -> String {
        let mut notes = Vec::new();
        if self.dtype.0 != self.dtype.1 {
            notes.push(format!("dtype {} vs {}", self.dtype.0.torch_name(), self.dtype.1.torch_name()));
        }
        if self.shape.0 != self.shape.1 {
            notes.push(format!("shape {:?} vs {:?} (values not compared)", self.shape.0, self.shape.1));
            return notes.join("; ");
        }
        if self.bytewise {
            notes.push(format!("{} of {} elements differ (compared as bytes)", self.mismatched, self.numel));
        } else {
            notes.push(format!(
                "max abs diff {}, max rel diff {}, {} of {} elements outside tolerance",
                shown_number(self.max_abs),
                shown_number(self.max_rel),
                self.mismatched,
                self.numel
            ));
        }
        if let Some(index) = &self.first_index {
            let values = self.first_values.map_or_else(String::new, |(a, b)| format!(": {a:?} vs {b:?}"));
            notes.push(format!("first at {index:?}{values}"));
        }
        notes.join("; ")
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
    /// Non-tensor values on both sides that differ, with both values.
    pub values_differ: Vec<ValueDiff>,
    /// Non-tensor values compared equal.
    pub values_equal: usize,
    /// Entries that failed to read on either side: name, error.
    pub unreadable: Vec<(String, String)>,
    /// Tables of rows keyed by ids (as a format's layout declares them: RecIS's hash tables) whose rows are
    /// in another order on each side (another shard layout) and were compared id by id.
    pub aligned_by_id: Vec<String>,
    /// The first checkpoint's layout: its format, and its layout keys (not compared, not differences).
    pub layout_a: LayoutKeys,
    /// The second checkpoint's layout.
    pub layout_b: LayoutKeys,
}

/// A non-tensor value present on both sides that differs ([`DiffReport::values_differ`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ValueDiff {
    /// Entry name.
    pub name: String,
    /// The first checkpoint's value.
    pub a: Value,
    /// The second checkpoint's value.
    pub b: Value,
}

impl ValueDiff {
    /// A difference of `name`: `a` in the first checkpoint, `b` in the second.
    pub fn new(name: impl Into<String>, a: Value, b: Value) -> Self {
        ValueDiff { name: name.into(), a, b }
    }

    /// Both values as Python's `repr` shows them, each shortened when long: `0.0 vs 0.01`, with the types when
    /// they differ (`1 (int) vs 1.0 (float)`).
    ///
    /// ```
    /// use ckpt::diff::ValueDiff;
    /// use ckpt::tensor::Value;
    /// assert_eq!(ValueDiff::new("wd", Value::Float(0.0), Value::Float(0.01)).shown(), "0.0 vs 0.01");
    /// assert_eq!(ValueDiff::new("n", Value::Int(1), Value::Float(1.0)).shown(), "1 (int) vs 1.0 (float)");
    /// ```
    pub fn shown(&self) -> String {
        let (ta, tb) = (self.a.type_name(), self.b.type_name());
        let (a, b) = (shown_value(&self.a, &self.name), shown_value(&self.b, &self.name));
        if ta == tb { format!("{a} vs {b}") } else { format!("{a} ({ta}) vs {b} ({tb})") }
    }
}

/// The most characters of one value [`ValueDiff::shown`] prints.
const SHOWN_CHARS: usize = 60;

/// `v` as Python's `repr` on one line, shortened to [`SHOWN_CHARS`] characters (`...` where cut).
fn shown_value(v: &Value, name: &str) -> String {
    let text = ckpt_tensor::flatten::python_repr_of(v).unwrap_or_else(|| {
        let text = crate::outline::format_value(v, name);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        lines.join(" ").replace(", }", " }").replace(", ]", " ]").replace(", )", " )")
    });
    if text.chars().count() <= SHOWN_CHARS {
        return text;
    }
    let cut: String = text.chars().take(SHOWN_CHARS - 3).collect();
    format!("{cut}...")
}

/// A number as a diff prints it: `0`, `0.25`, `1.5e-7`, `inf`.
pub fn shown_number(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if !x.is_finite() || (1e-4..1e6).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

/// One side's layout in a [`DiffReport`]: the entries its format keeps as bookkeeping beside the state
/// (hfai's `__nshards__`, `__version__`), left out of the comparison, and the prefix it nests the state
/// under, if any. Empty with [`DiffLayout::Raw`].
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct LayoutKeys {
    /// The checkpoint's format.
    pub format: Option<Format>,
    /// Its layout keys, in its order.
    pub keys: Vec<String>,
    /// The prefix (`model.`) under which its format nests the whole state, stripped from its names when
    /// pairing them with the other side's.
    pub nested_under: Option<String>,
}

impl LayoutKeys {
    /// Whether the side has neither layout keys nor a nesting prefix.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.nested_under.is_none()
    }
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

    /// How many differences the report holds: entries on one side only, kind changes, tensors and values
    /// that differ, unreadable entries.
    pub fn differences(&self) -> usize {
        self.only_a.len()
            + self.only_b.len()
            + self.kind_changes.len()
            + self.tensors.iter().filter(|t| !t.is_equal()).count()
            + self.values_differ.len()
            + self.unreadable.len()
    }

    /// The report as `ckpt diff` prints it, one line each: every difference with both sides (`value differs:
    /// lr: 0.001 vs 0.01`, `differs: w: max abs diff 0.5, ...`), the equal tensors too when `all`, each side's
    /// layout keys unless `quiet`, then the verdict (`equal: ...` unless `quiet`, or `DIFFERENT: N
    /// differences; ...`). `a` and `b` name the two checkpoints; `options` are the diff's (its tolerances).
    pub fn lines(&self, a: &str, b: &str, options: &DiffOptions, all: bool, quiet: bool) -> Vec<String> {
        let mut out = Vec::new();
        out.extend(self.only_a.iter().map(|n| format!("only in {a}: {n}")));
        out.extend(self.only_b.iter().map(|n| format!("only in {b}: {n}")));
        out.extend(self.kind_changes.iter().map(|(n, ka, kb)| format!("kind changed: {n}: {ka} vs {kb}")));
        for t in self.tensors.iter().filter(|t| all || !t.is_equal()) {
            out.push(format!("{}: {}: {}", if t.is_equal() { "equal" } else { "differs" }, t.name, t.shown()));
        }
        out.extend(self.values_differ.iter().map(|v| format!("value differs: {}: {}", v.name, v.shown())));
        out.extend(self.unreadable.iter().map(|(n, e)| format!("unreadable: {n}: {e}")));
        if !quiet && !self.aligned_by_id.is_empty() {
            out.push(format!("rows compared by id (another shard layout): {}", self.aligned_by_id.join(", ")));
        }
        // Each side's layout: its format's bookkeeping (not compared) and the prefix it nests the state under.
        for (side, l) in [("a", &self.layout_a), ("b", &self.layout_b)] {
            if quiet || l.is_empty() {
                continue;
            }
            let format = l.format.map_or_else(String::new, |f| format!(" ({f})"));
            if !l.keys.is_empty() {
                out.push(format!("layout keys: {side}: {}{format}", l.keys.join(", ")));
            }
            if let Some(prefix) = &l.nested_under {
                out.push(format!("state nested under: {side}: {prefix}{format}"));
            }
        }
        let equal = self.is_equal();
        if !quiet || !equal {
            let compared = format!(
                "{} tensors, {} values compared (rtol {}, atol {})",
                self.tensors.len(),
                self.values_equal + self.values_differ.len(),
                shown_number(options.rtol),
                shown_number(options.atol),
            );
            if equal {
                out.push(format!("equal: {compared}"));
            } else {
                let n = self.differences();
                out.push(format!("DIFFERENT: {n} difference{}; {compared}", if n == 1 { "" } else { "s" }));
            }
        }
        out
    }
}

/// Compares the checkpoints at `a` and `b` (formats detected, possibly different), entry by entry: by the
/// names each reader lists, else by the names the state has in each format's layout; the layout keys of
/// each format (its bookkeeping) are listed apart, not compared ([`DiffOptions::layout`]).
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
pub fn diff(a: impl AsRef<Path>, b: impl AsRef<Path>, options: &DiffOptions) -> Result<DiffReport> {
    diff_with_progress(a, b, options, &|_, _| {})
}

/// [`diff`], reporting progress over the entries compared.
///
/// # Errors
/// As [`diff`].
pub fn diff_with_progress(
    a: impl AsRef<Path>,
    b: impl AsRef<Path>,
    options: &DiffOptions,
    progress: Progress<'_>,
) -> Result<DiffReport> {
    let (a, b) = (a.as_ref(), b.as_ref());
    let ca = crate::open::open_source(a, None, &options.limits, &options.source)?;
    let cb = crate::open::open_source(b, None, &options.limits, &options.source)?;
    diff_checkpoints(&ca, &cb, options, progress)
}

fn kind_name(k: &EntryKind) -> String {
    match k {
        EntryKind::Tensor(t) => format!("tensor {} {:?}", t.dtype.torch_name(), t.shape),
        EntryKind::OpaqueTensor(o) => format!("{o:?} tensor").to_lowercase(),
        EntryKind::Composite(c) => format!("{} tensor {} {:?}", c.layout, c.dtype.torch_name(), c.shape),
        _ => "value".into(),
    }
}

fn diff_checkpoints(
    ca: &Checkpoint,
    cb: &Checkpoint,
    options: &DiffOptions,
    progress: Progress<'_>,
) -> Result<DiffReport> {
    let (la, lb) = (layout_of(ca, options)?, layout_of(cb, options)?);
    let ea = ca.entries();
    let eb = cb.entries();
    let pairing = pair(&ea, &eb, &la, &lb);
    let mut report = DiffReport {
        only_a: pairing.only_a,
        only_b: pairing.only_b,
        layout_a: side(ca, &la, pairing.keys_a),
        layout_b: side(cb, &lb, pairing.keys_b),
        ..DiffReport::default()
    };
    let alignments = id_alignments(ca, cb, &pairing.pairs, &la, &lb);
    report.aligned_by_id = alignments.tables.clone();
    let total = pairing.pairs.len() as u64;
    for (i, (x, y)) in pairing.pairs.iter().enumerate() {
        progress(i as u64, total);
        let (na, nb) = (&ea[*x].name, &eb[*y].name);
        let name = na.clone();
        match (&ea[*x].kind, &eb[*y].kind) {
            (EntryKind::Tensor(_), EntryKind::Tensor(_)) => match (ca.tensor(na), cb.tensor(nb)) {
                (Ok(ta), Ok(tb)) => {
                    match alignments.aligned(&name, tb).and_then(|tb| compare(&name, &ta, &tb, options)) {
                        Ok(d) => report.tensors.push(d),
                        Err(err) => report.unreadable.push((name, err.to_string())),
                    }
                }
                (Err(err), _) | (_, Err(err)) => report.unreadable.push((name, err.to_string())),
            },
            (EntryKind::OpaqueTensor(p), EntryKind::OpaqueTensor(q)) if p == q => {
                report.values_equal += 1;
            }
            // Quantized, sparse and nested tensors of one layout, dtype and shape: component by component
            // (`<name>.<component>`), the per-channel axis as a value.
            (EntryKind::Composite(p), EntryKind::Composite(q))
                if (p.layout, p.dtype, &p.shape) == (q.layout, q.dtype, &q.shape) =>
            {
                match (ca.value(na), cb.value(nb)) {
                    (Ok(Value::Composite(a)), Ok(Value::Composite(b))) => {
                        if a.axis != b.axis {
                            let axis = |x: Option<usize>| {
                                x.and_then(|x| i64::try_from(x).ok()).map_or(Value::None, Value::Int)
                            };
                            report.values_differ.push(ValueDiff::new(
                                format!("{name} (axis)"),
                                axis(a.axis),
                                axis(b.axis),
                            ));
                        }
                        for ((component, ta), tb) in a.named_components().zip(&b.components) {
                            let at = format!("{name}.{component}");
                            match compare(&at, ta, tb, options) {
                                Ok(d) => report.tensors.push(d),
                                Err(err) => report.unreadable.push((at, err.to_string())),
                            }
                        }
                    }
                    (Err(err), _) | (_, Err(err)) => report.unreadable.push((name, err.to_string())),
                    _ => report.unreadable.push((name, "listed as a composite tensor, read as another value".into())),
                }
            }
            // A tensor one format keeps as a value holding it (a numpy array in DCP's pickled items).
            (EntryKind::Tensor(_), kb) if !is_tensor_kind(kb) && value_tensor(cb, nb).is_some() => {
                match (ca.tensor(na), value_tensor(cb, nb)) {
                    (Ok(ta), Some(tb)) => match compare(&name, &ta, &tb, options) {
                        Ok(d) => report.tensors.push(d),
                        Err(err) => report.unreadable.push((name, err.to_string())),
                    },
                    (Err(err), _) => report.unreadable.push((name, err.to_string())),
                    (_, None) => {}
                }
            }
            (ka, EntryKind::Tensor(_)) if !is_tensor_kind(ka) && value_tensor(ca, na).is_some() => {
                match (value_tensor(ca, na), cb.tensor(nb)) {
                    (Some(ta), Ok(tb)) => match compare(&name, &ta, &tb, options) {
                        Ok(d) => report.tensors.push(d),
                        Err(err) => report.unreadable.push((name, err.to_string())),
                    },
                    (_, Err(err)) => report.unreadable.push((name, err.to_string())),
                    (None, _) => {}
                }
            }
            (ka @ (EntryKind::Tensor(_) | EntryKind::OpaqueTensor(_) | EntryKind::Composite(_)), kb)
            | (ka, kb @ (EntryKind::Tensor(_) | EntryKind::OpaqueTensor(_) | EntryKind::Composite(_))) => {
                report.kind_changes.push((name, kind_name(ka), kind_name(kb)));
            }
            _ => match (ca.value(na), cb.value(nb)) {
                (Ok(va), Ok(vb)) => {
                    if va.same(&vb) {
                        report.values_equal += 1;
                    } else {
                        report.values_differ.push(ValueDiff::new(name, va, vb));
                    }
                }
                (Err(err), _) | (_, Err(err)) => report.unreadable.push((name, err.to_string())),
            },
        }
    }
    if options.layout == DiffLayout::State {
        expand(ca, cb, &la, &lb, options, &mut report);
    }
    progress(total, total);
    Ok(report)
}

/// Whether an entry kind is a tensor's.
fn is_tensor_kind(k: &EntryKind) -> bool {
    matches!(k, EntryKind::Tensor(_) | EntryKind::OpaqueTensor(_) | EntryKind::Composite(_))
}

/// The tensor the value entry `name` of `ck` holds (a numpy array), if any.
fn value_tensor(ck: &Checkpoint, name: &str) -> Option<Tensor> {
    ck.value(name).ok().and_then(|v| v.as_tensor().cloned())
}

/// The entries of either side a format keeps otherwise than the other: a container one format keeps as one
/// value entry (DCP's tuples and tensor-free lists, its legacy mappings) and the other as one entry per
/// item (`tup` against `tup.0`, `tup.1`), compared item by item; empty containers, which some formats do
/// not keep, hold no state and are no difference.
fn expand(ca: &Checkpoint, cb: &Checkpoint, la: &Layout, lb: &Layout, options: &DiffOptions, report: &mut DiffReport) {
    let (ka, kb) = (kinds(ca), kinds(cb));
    let mut only_a = std::mem::take(&mut report.only_a);
    let mut only_b = std::mem::take(&mut report.only_b);
    for flip in [false, true] {
        // `x`: the side whose value entries are expanded, `y`: the side whose entries are their items.
        let (cx, cy, lx, ly, kx, ky) = if flip { (cb, ca, lb, la, &kb, &ka) } else { (ca, cb, la, lb, &ka, &kb) };
        let (xs, ys) = if flip { (&mut only_b, &mut only_a) } else { (&mut only_a, &mut only_b) };
        let by_name: HashMap<&str, &String> =
            ys.iter().flat_map(|y| ly.names(y).into_iter().map(move |n| (n, y))).collect();
        let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut expanded = Vec::new();
        for x in xs.iter() {
            if kx.get(x.as_str()).is_none_or(is_tensor_kind) {
                continue;
            }
            let Ok(value) = cx.value(x) else { continue };
            let Ok(items) = ckpt_tensor::leaves(&value) else { continue };
            // Every item is an entry of the other side, under one of the container's names.
            let Some(matched) = lx.names(x).into_iter().find_map(|prefix| {
                items
                    .iter()
                    .map(|l| by_name.get(format!("{prefix}.{}", l.key).as_str()).map(|y| (l, *y)))
                    .collect::<Option<Vec<_>>>()
                    .filter(|m| !m.is_empty() && m.iter().all(|(_, y)| !taken.contains(y.as_str())))
            }) else {
                continue;
            };
            for (item, y) in matched {
                taken.insert(y.clone());
                let name = if flip { y.clone() } else { format!("{x}.{}", item.key) };
                let other = ky.get(y.as_str()).is_some_and(is_tensor_kind);
                match (item.value.as_tensor(), other) {
                    (Some(t), true) => {
                        let d = cy.tensor(y).map_err(|e| e.to_string()).and_then(|u| {
                            let (ta, tb) = if flip { (&u, t) } else { (t, &u) };
                            compare(&name, ta, tb, options).map_err(|e| e.to_string())
                        });
                        match d {
                            Ok(d) => report.tensors.push(d),
                            Err(err) => report.unreadable.push((name, err)),
                        }
                    }
                    (None, false) => match cy.value(y) {
                        Ok(v) if v.same(item.value) => report.values_equal += 1,
                        Ok(v) => {
                            let (va, vb) = if flip { (v, item.value.clone()) } else { (item.value.clone(), v) };
                            report.values_differ.push(ValueDiff::new(name, va, vb));
                        }
                        Err(err) => report.unreadable.push((name, err.to_string())),
                    },
                    (_, _) => report.kind_changes.push((name, "value".into(), "tensor".into())),
                }
            }
            expanded.push(x.clone());
        }
        xs.retain(|x| !expanded.contains(x));
        ys.retain(|y| !taken.contains(y));
    }
    // Empty containers hold no state.
    only_a.retain(|n| !is_empty_container(ca, &ka, n));
    only_b.retain(|n| !is_empty_container(cb, &kb, n));
    report.only_a = only_a;
    report.only_b = only_b;
}

/// The kind of every entry of `ck`, by name.
fn kinds(ck: &Checkpoint) -> HashMap<String, EntryKind> {
    ck.entries().into_iter().map(|e| (e.name, e.kind)).collect()
}

/// Whether the entry `name` of `ck` is an empty mapping, list or tuple.
fn is_empty_container(ck: &Checkpoint, kinds: &HashMap<String, EntryKind>, name: &str) -> bool {
    if kinds.get(name).is_none_or(is_tensor_kind) {
        return false;
    }
    match ck.value(name) {
        Ok(ckpt_tensor::Value::Dict(d)) => d.items.is_empty(),
        Ok(ckpt_tensor::Value::List(v) | ckpt_tensor::Value::Tuple(v)) => v.is_empty(),
        _ => false,
    }
}

/// The layout `options` compares `ck` under: its adaptor's ([`crate::adaptor::Adaptor::layout`]), or with
/// [`DiffLayout::Raw`] only its keyed rows (every entry compared under its own name).
fn layout_of(ck: &Checkpoint, options: &DiffOptions) -> Result<Layout> {
    let layout = crate::formats::adaptor(ck.format(), ck.path())?.layout(ck, &options.limits)?;
    Ok(match options.layout {
        DiffLayout::State => layout,
        DiffLayout::Raw => Layout { keyed: layout.keyed, ..Layout::default() },
    })
}

/// One side's layout as a report says it: its format, its layout keys, the prefix it nests the state under.
fn side(ck: &Checkpoint, layout: &Layout, keys: Vec<String>) -> LayoutKeys {
    LayoutKeys { format: Some(ck.format()), keys, nested_under: layout.nested_under.clone() }
}

/// How the entries of two checkpoints pair up ([`pair`]).
#[derive(Debug, Default)]
struct Pairing {
    /// Indices of an entry of `a` and of the entry of `b` holding the same state, in `a`'s order.
    pairs: Vec<(usize, usize)>,
    only_a: Vec<String>,
    only_b: Vec<String>,
    /// Layout keys of each side (never compared).
    keys_a: Vec<String>,
    keys_b: Vec<String>,
}

/// Pairs the entries of `a` and `b`: by their own names first, then by the names their layouts give their
/// state (an entry's name on one side may be the other's state name: a state nested under `model.` in one
/// format and written as it is by another). Layout keys are never compared: they are set apart, on the side
/// whose layout names them, with the entry they pair with on the other side (another format's copy).
fn pair(ea: &[Entry], eb: &[Entry], la: &Layout, lb: &Layout) -> Pairing {
    let mut p = Pairing::default();
    let by_name: HashMap<&str, usize> = eb.iter().enumerate().map(|(i, e)| (e.name.as_str(), i)).collect();
    let mut used_b = vec![false; eb.len()];
    let mut open_a = Vec::new();
    let set_apart = |p: &mut Pairing, a: &str, b: &str| {
        p.keys_a.push(a.to_owned());
        p.keys_b.push(b.to_owned());
    };
    for (i, e) in ea.iter().enumerate() {
        match by_name.get(e.name.as_str()) {
            Some(&j) => {
                used_b[j] = true;
                if la.is_key(&e.name) || lb.is_key(&e.name) {
                    set_apart(&mut p, &e.name, &e.name);
                } else {
                    p.pairs.push((i, j));
                }
            }
            None => open_a.push(i),
        }
    }
    // The entries of `b` left, by every name of their state.
    let mut left_b: HashMap<&str, usize> = HashMap::new();
    for (j, e) in eb.iter().enumerate().filter(|(j, _)| !used_b[*j]) {
        for n in lb.names(&e.name) {
            left_b.entry(n).or_insert(j);
        }
    }
    for i in open_a {
        let name = ea[i].name.as_str();
        let found = la.names(name).into_iter().find_map(|n| left_b.get(n).copied().filter(|&j| !used_b[j]));
        match found {
            Some(j) => {
                used_b[j] = true;
                if la.is_key(name) || lb.is_key(&eb[j].name) {
                    set_apart(&mut p, name, &eb[j].name);
                } else {
                    p.pairs.push((i, j));
                }
            }
            None if la.is_key(name) => p.keys_a.push(name.to_owned()),
            None => p.only_a.push(name.to_owned()),
        }
    }
    for (e, _) in eb.iter().zip(&used_b).filter(|(_, used)| !**used) {
        if lb.is_key(&e.name) {
            p.keys_b.push(e.name.clone());
        } else {
            p.only_b.push(e.name.clone());
        }
    }
    p.pairs.sort_unstable();
    p
}

/// The keyed rows of two checkpoints aligned ([`id_alignments`]).
#[derive(Debug, Default)]
struct Alignments {
    /// The tables aligned, sorted.
    tables: Vec<String>,
    /// For each entry (by `a`'s name) of an aligned table, the position in `b` of each id of `a`.
    rows: HashMap<String, std::sync::Arc<Vec<usize>>>,
}

/// For every table of keyed rows ([`Layout::keyed`], either side's) whose ids are on both sides, the same ids
/// in another order: the position in `b` of each id of `a`, for each of its row entries.
fn id_alignments(ca: &Checkpoint, cb: &Checkpoint, pairs: &[(usize, usize)], la: &Layout, lb: &Layout) -> Alignments {
    let ea = ca.entries();
    let eb = cb.entries();
    // `b`'s entry paired with each of `a`'s, and `a`'s with each of `b`'s.
    let paired: HashMap<&str, &str> = pairs.iter().map(|&(i, j)| (ea[i].name.as_str(), eb[j].name.as_str())).collect();
    let b_to_a: HashMap<&str, &str> = paired.iter().map(|(a, b)| (*b, *a)).collect();
    let mut out = Alignments::default();
    // Each table by `a`'s entry names.
    let to_a = |n: &String| b_to_a.get(n.as_str()).map_or_else(|| n.clone(), |a| (*a).to_owned());
    let tables = la.keyed.iter().map(|k| (k.table.clone(), k.ids.clone(), k.rows.clone()));
    let tables =
        tables.chain(lb.keyed.iter().map(|k| (k.table.clone(), to_a(&k.ids), k.rows.iter().map(to_a).collect())));
    for (table, ids_a, rows) in tables {
        if out.tables.contains(&table) {
            continue;
        }
        let Some(&ids_b) = paired.get(ids_a.as_str()) else { continue };
        let ids = |c: &Checkpoint, n: &str| {
            c.tensor(n)
                .ok()
                .filter(|t| t.dtype() == DType::I64 && t.shape().len() == 1)
                .and_then(|t| t.to_vec::<i64>().ok())
        };
        let (Some(a), Some(b)) = (ids(ca, &ids_a), ids(cb, ids_b)) else { continue };
        if a.len() != b.len() || a == b {
            continue;
        }
        let position: HashMap<i64, usize> = b.iter().enumerate().map(|(k, id)| (*id, k)).collect();
        if position.len() != b.len() {
            continue; // duplicate ids: no one-to-one alignment
        }
        let Some(perm) = a.iter().map(|id| position.get(id).copied()).collect::<Option<Vec<usize>>>() else {
            continue;
        };
        let perm = std::sync::Arc::new(perm);
        for row in rows.into_iter().chain([ids_a]) {
            out.rows.insert(row, perm.clone());
        }
        out.tables.push(table);
    }
    out.tables.sort();
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

impl FormatError for DiffError {
    /// Who is at fault.
    fn fault(&self) -> ckpt_tensor::Fault {
        match self {
            DiffError::RowBeyond { .. } => ckpt_tensor::Fault::InvalidArgument,
        }
    }
}

impl Alignments {
    /// `b`'s entry (paired with `a`'s entry `name`) with its rows in the order of `a`'s ids, when it is
    /// a row entry of an aligned table with one row per id; else `b` as it is.
    fn aligned(&self, name: &str, b: Tensor) -> ckpt_tensor::Result<Tensor> {
        let Some(perm) = self.rows.get(name) else {
            return Ok(b);
        };
        if b.shape().first() != Some(&perm.len()) {
            return Ok(b);
        }
        let b = b.to_contiguous()?;
        let data = b.data()?;
        let row = data.len() / perm.len().max(1);
        let mut out = Vec::with_capacity(data.len());
        for &k in perm.iter() {
            let bytes = data.get(k * row..(k + 1) * row).ok_or_else(|| DiffError::RowBeyond {
                name: name.to_owned(),
                row: k,
                rows: perm.len(),
            })?;
            out.extend_from_slice(bytes);
        }
        Tensor::from_buffer(b.dtype(), b.shape(), ckpt_tensor::Buffer::from_vec(out))
    }
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
        first_index: None,
        first_values: None,
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
            // Complex elements decode as two components each.
            let per_element = if complex.0 { 2 } else { 1 };
            for (block, (ba, bb)) in da.chunks(BLOCK * sa).zip(db.chunks(BLOCK * sb)).enumerate() {
                decode(xa, ba, &mut va);
                decode(xb, bb, &mut vb);
                for (k, (&x, &y)) in va.iter().zip(&vb).enumerate() {
                    let (abs, ok) = close(x, y, options);
                    if !ok && d.first_index.is_none() {
                        d.first_index = Some(unravel((block * BLOCK + k) / per_element, a.shape()));
                        d.first_values = Some((x, y));
                    }
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
                let mut differing = da.chunks(es).zip(db.chunks(es)).enumerate().filter(|(_, (x, y))| x != y);
                if let Some((first, _)) = differing.next() {
                    // Packed dtypes hold several elements a byte: the index only where bytes are elements.
                    d.first_index = (da.len() / es == d.numel).then(|| unravel(first, a.shape()));
                    d.mismatched = 1 + differing.count();
                }
            }
            if d.mismatched > 0 {
                d.max_abs = f64::INFINITY;
                d.max_rel = f64::INFINITY;
            }
        }
    }
    Ok(d)
}

/// The index into `shape` of the `flat`-th element in row-major order.
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (i, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            if let Some(slot) = index.get_mut(i) {
                *slot = flat % n;
            }
            flat /= n;
        }
    }
    index
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
