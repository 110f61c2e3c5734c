//! The package's operations on whole checkpoints — load, save, convert, verify, reshard, diff — each the
//! facade's function with the `ckpt` command's options, run with the GIL released, with a progress bar on
//! stderr when it is a terminal. Every path may be an object-storage URL, read and written as the command
//! does (`remote`), with the command's `--storage-option`s as the `storage_options` keyword argument.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ckpt::named_options::{self, Command};
use ckpt::storage::Fetch;
use ckpt::{ConvertOptions, DiffOptions, Format, ReadLimits, Selection, Value, VerifyOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::destination::Destination;
use crate::errors::{About, IntoPy, usage};
use crate::remote::{fetched, published, shown, storage_options, target};
use crate::values::{Framework, FromPy, ToPy};

/// A keyword argument's value as the option text the facade's parser reads ([`ckpt::named_options`]):
/// `True`/`False` as `true`/`false`, numbers and strings as they print, paths as paths.
pub(crate) fn option_text(name: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(b) = value.extract::<bool>() {
        return Ok(if b { "true" } else { "false" }.into());
    }
    if let Ok(n) = value.extract::<i128>() {
        return Ok(n.to_string());
    }
    if let Ok(p) = value.extract::<PathBuf>() {
        return Ok(p.to_string_lossy().into_owned());
    }
    Err(usage(format!("{name}: expected a str, a number or a bool, not {}", value.get_type().name()?), None))
}

/// The read limits named in `limits` (the `ckpt` command's `--max-*` and `--trusted` flags, without `--`,
/// with `_` for `-`), read by the facade's parser as the command's flags are; the defaults for those not
/// named.
pub(crate) fn read_limits(limits: Option<&Bound<'_, PyDict>>) -> PyResult<ReadLimits> {
    let named = option_pairs(limits)?;
    let named = named.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    named_options::read_limits(Command::Read, named).map_err(|e| usage(e.to_string(), None))
}

/// The read limits and the source options (`tag`, `unstack_layers`, `name_map`, `model_only`) named in
/// `options`, as the reading commands take them ([`ckpt::named_options::read_options`]).
pub(crate) fn read_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<(ReadLimits, ckpt::SourceOptions)> {
    let named = option_pairs(options)?;
    named_options::read_options(named.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| usage(e.to_string(), None))
}

/// The keyword arguments in `options` as `(name, text)` pairs ([`option_text`]), `None` values left out.
fn option_pairs(options: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, String)>> {
    let mut named = Vec::new();
    for (k, v) in options.map(|l| l.iter()).into_iter().flatten() {
        let key: String = k.extract()?;
        if !v.is_none() {
            let text = option_text(&key, &v)?;
            named.push((key, text));
        }
    }
    Ok(named)
}

/// The selection of `include`/`exclude` globs, prefixes and float dtype, read by the facade's parser.
pub(crate) fn selection(
    include: Vec<String>,
    exclude: Vec<String>,
    strip_prefix: Option<String>,
    add_prefix: Option<String>,
    dtype: Option<&str>,
) -> PyResult<Selection> {
    let mut named: Vec<(&str, &str)> = include.iter().map(|g| ("include", g.as_str())).collect();
    named.extend(exclude.iter().map(|g| ("exclude", g.as_str())));
    named.extend(strip_prefix.as_deref().map(|p| ("strip_prefix", p)));
    named.extend(add_prefix.as_deref().map(|p| ("add_prefix", p)));
    named.extend(dtype.map(|d| ("dtype", d)));
    let options = named_options::convert_options(Command::Convert, Format::Torch, named);
    Ok(options.map_err(|e| usage(e.to_string(), None))?.selection)
}

/// The command whose options `ckpt.option_names` and `ckpt.unknown_option` are about, by name.
fn command(name: &str) -> PyResult<Command> {
    Ok(match name {
        "convert" => Command::Convert,
        "save" => Command::Save,
        "reshard" => Command::Reshard,
        "read" => Command::Read,
        other => return Err(usage(format!("{other:?}: the commands are convert, save, reshard and read"), None)),
    })
}

/// The names of the options `command` takes (`"convert"`, `"save"`, `"reshard"`, `"read"`), as the
/// facade's table has them ([`ckpt::named_options::OPTIONS`]).
#[pyfunction]
pub(crate) fn option_names(name: &str) -> PyResult<Vec<&'static str>> {
    Ok(command(name)?.names().collect())
}

/// What a keyword argument `command` does not take is told ([`ckpt::named_options::unknown_option`]):
/// the names near it, or what ckpt does instead of a `torch.load` habit.
#[pyfunction]
pub(crate) fn unknown_option(name: &str, option: &str) -> PyResult<String> {
    Ok(named_options::unknown_option(command(name)?, option).to_string())
}

/// The options `named` (`(name, text)` pairs, [`ckpt::named_options::convert_options`]) of a `command`
/// to `to`.
fn convert_options(command: Command, to: Format, named: &[(String, String)], path: &Path) -> PyResult<ConvertOptions> {
    let named = named.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    named_options::convert_options(command, to, named).map_err(|e| usage(e.to_string(), Some(path)))
}

fn format_of(name: &str, path: &Path) -> PyResult<Format> {
    name.parse::<Format>().map_err(|e| usage(e.to_string(), Some(path)))
}

/// `f` run without the GIL, with a bar on stderr of the bytes it writes out of `estimate`'s (`show`: `None`
/// when stderr is a terminal; a spinner when there is no estimate), hidden otherwise.
fn with_progress<T: Send>(
    py: Python<'_>,
    show: Option<bool>,
    what: String,
    estimate: impl FnOnce() -> Option<u64> + Send,
    f: impl FnOnce() -> T + Send,
) -> T {
    if !show.unwrap_or_else(|| std::io::stderr().is_terminal()) {
        return py.detach(f);
    }
    py.detach(|| match estimate() {
        Some(total) => ckpt::progress::with_write_meter(true, total, &what, f),
        None => with_spinner(what, f),
    })
}

/// A spinner on stderr while `f` runs.
fn with_spinner<T>(what: String, f: impl FnOnce() -> T) -> T {
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.set_message(what);
    pb.enable_steady_tick(Duration::from_millis(100));
    let out = f();
    pb.finish_and_clear();
    out
}

/// Bytes of the tensors of a state dict held in memory, those inside objects included.
fn tensor_bytes(tree: &Value) -> u64 {
    ckpt::tensor::flatten::entry_names(tree)
        .unwrap_or_default()
        .iter()
        .filter_map(|(_, v)| v.as_tensor())
        .map(|t| t.nbytes() as u64)
        .sum()
}

/// A progress bar on stderr over `total` units (`show` as [`with_spinner`]).
fn bar(show: Option<bool>, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    if !show.unwrap_or_else(|| std::io::stderr().is_terminal()) {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed}, {eta} left)") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_owned());
    pb
}

/// `ckpt.load`: the nested state dict of the checkpoint at `path`, the entries `include`/`exclude` keep.
/// At a URL, every object is fetched first (arrays over a fetched file's map keep its memory once its
/// temporary directory is gone).
#[pyfunction]
#[pyo3(signature = (path, framework = "np", include = Vec::new(), exclude = Vec::new(), torch = None, limits = None,
    storage_options = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load<'py>(
    py: Python<'py>,
    path: PathBuf,
    framework: &str,
    include: Vec<String>,
    exclude: Vec<String>,
    torch: Option<Bound<'py, PyAny>>,
    limits: Option<&Bound<'py, PyDict>>,
    storage_options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let to = ToPy::new(Framework::parse(framework)?, torch);
    let limits = read_limits(limits)?;
    let storage = self::storage_options(storage_options)?;
    let selection = selection(include, exclude, None, None, None)?;
    let tree = py
        .detach(|| -> Result<Value, About> {
            let staged = fetched(&path, &storage, Fetch::Whole)?;
            Ok(ckpt::state_dict(staged.path(), &selection, &limits)?)
        })
        .py()?;
    to.value(py, &tree)
}

/// A conversion's summary as `(tensors, bytes, values, dropped)`.
type Summary = (usize, u64, usize, Vec<String>);

fn summary(s: ckpt::ConvertSummary) -> Summary {
    (s.tensors, s.bytes, s.values, s.dropped)
}

/// `ckpt.convert`: the checkpoint at `src` converted to `to` at `dst`, with the options `options` named as
/// the `ckpt convert` flags (`(name, text)` pairs, read by the facade's parser).
#[pyfunction]
#[pyo3(signature = (src, dst, to, from_ = None, options = Vec::new(), progress = None, storage_options = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn convert(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    to: &str,
    from_: Option<&str>,
    options: Vec<(String, String)>,
    progress: Option<bool>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Summary> {
    let storage = self::storage_options(storage_options)?;
    let to = format_of(to, &dst)?;
    let from = from_.map(|f| format_of(f, &src)).transpose()?;
    let options = convert_options(Command::Convert, to, &options, &dst)?;
    let overwrite = options.overwrite;
    // As `ckpt convert`: the source fetched, the target streamed to.
    let what = format!("converting {} to {to}", shown(&src).display());
    let staged = py.detach(|| fetched(&src, &storage, Fetch::Whole)).py()?;
    let target = target(&dst, &storage).py()?;
    let remote = py.detach(|| Destination::remote(&dst, to, overwrite, &storage)).py()?;
    let estimate = || ckpt::output_estimate(staged.path(), from, &options).ok();
    let s =
        with_progress(py, progress, what, estimate, || ckpt::convert(staged.path(), from, target.path(), to, &options))
            .py()?;
    py.detach(|| published(target)).py()?;
    py.detach(|| remote.commit(&dst)).py()?;
    Ok(summary(s))
}

/// `ckpt.save`: the state dict `state_dict` (nested dicts, lists, tuples, numpy arrays, torch tensors, Python
/// values) written as a checkpoint of `format` at `path`, with `convert`'s target options (`options`).
#[pyfunction]
#[pyo3(signature = (state_dict, path, format = "torch", options = Vec::new(), progress = None,
    storage_options = None))]
pub(crate) fn save(
    py: Python<'_>,
    state_dict: &Bound<'_, PyAny>,
    path: PathBuf,
    format: &str,
    options: Vec<(String, String)>,
    progress: Option<bool>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Summary> {
    let storage = self::storage_options(storage_options)?;
    let to = format_of(format, &path)?;
    let tree = FromPy::new(py)?.value(state_dict)?;
    let options = convert_options(Command::Save, to, &options, &path)?;
    let overwrite = options.overwrite;
    let what = format!("saving {} as {to}", shown(&path).display());
    let target = target(&path, &storage).py()?;
    let remote = py.detach(|| Destination::remote(&path, to, overwrite, &storage)).py()?;
    let estimate = || Some(tensor_bytes(&tree));
    let s = with_progress(py, progress, what, estimate, || ckpt::save(&tree, target.path(), to, &options)).py()?;
    py.detach(|| published(target)).py()?;
    py.detach(|| remote.commit(&path)).py()?;
    Ok(summary(s))
}

/// A verification's report as `(format, checked, bytes, problems, warnings)`.
type Report = (&'static str, usize, u64, Vec<String>, Vec<String>);

/// `ckpt.verify`: its [`Report`].
#[pyfunction]
#[pyo3(signature = (path, deep = false, limits = None, progress = None, storage_options = None))]
pub(crate) fn verify(
    py: Python<'_>,
    path: PathBuf,
    deep: bool,
    limits: Option<&Bound<'_, PyDict>>,
    progress: Option<bool>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Report> {
    let options =
        if deep { VerifyOptions::deep() } else { VerifyOptions::structure() }.with_limits(read_limits(limits)?);
    let storage = self::storage_options(storage_options)?;
    let staged = py.detach(|| fetched(&path, &storage, Fetch::Whole)).py()?;
    let pb = bar(progress, &format!("verifying {}", shown(&path).display()));
    let report = py.detach(|| {
        ckpt::verify_with_progress(staged.path(), &options, &|done, total| {
            pb.set_length(total);
            pb.set_position(done);
        })
    });
    pb.finish_and_clear();
    // At a URL, as `ckpt verify`: what a save that did not finish left beside the checkpoint (its lock,
    // objects without a commit point) joins the report, as warnings of kind `unfinished` (the next save
    // removes them).
    let left = py
        .detach(|| -> Result<Vec<ckpt::Problem>, About> {
            match crate::remote::place(&path)? {
                ckpt::storage::Location::Remote(url) => {
                    let format = ckpt::detect(staged.path()).ok();
                    ckpt::storage::unfinished(&url, format, &storage)
                        .map_err(|e| About::at(e, &ckpt::storage::Location::Remote(url.clone())))
                }
                ckpt::storage::Location::Local(_) => Ok(Vec::new()),
            }
        })
        .py()?;
    let mut r = report.py()?;
    r.problems.extend(left);
    let text = |problems: Vec<&ckpt::Problem>| problems.into_iter().map(ToString::to_string).collect();
    Ok((r.format, r.records, r.bytes, text(r.errors().collect()), text(r.warnings().collect())))
}

/// `ckpt.reshard`: `(format, world_size, tensors, bytes)`.
#[pyfunction]
#[pyo3(signature = (src, dst, world_size, limits = None, progress = None, storage_options = None, overwrite = false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn reshard(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    world_size: usize,
    limits: Option<&Bound<'_, PyDict>>,
    progress: Option<bool>,
    storage_options: Option<&Bound<'_, PyDict>>,
    overwrite: bool,
) -> PyResult<(&'static str, usize, usize, u64)> {
    let limits = read_limits(limits)?;
    let storage = self::storage_options(storage_options)?;
    let what = format!("resharding {} for {world_size}", shown(&src).display());
    let staged = py.detach(|| fetched(&src, &storage, Fetch::Whole)).py()?;
    let target = target(&dst, &storage).py()?;
    let format = ckpt::detect(staged.path()).map_err(About::from).py()?;
    let remote = py.detach(|| Destination::remote(&dst, format, overwrite, &storage)).py()?;
    let estimate = || {
        let options = ckpt::ConvertOptions::default().with_limits(limits);
        ckpt::output_estimate(staged.path(), None, &options).ok()
    };
    let s = with_progress(py, progress, what, estimate, || {
        let options = ckpt::ReshardOptions::default().with_limits(limits).with_overwrite(overwrite);
        ckpt::reshard_with_options(staged.path(), target.path(), world_size, &options)
    })
    .py()?;
    py.detach(|| published(target)).py()?;
    py.detach(|| remote.commit(&dst)).py()?;
    Ok((s.format.name(), s.world_size, s.tensors, s.bytes))
}

/// `ckpt.diff`: the report's parts, each a list (see `ckpt.DiffReport`).
#[pyfunction]
#[pyo3(signature = (a, b, rtol = 1e-5, atol = 1e-8, limits = None, progress = None, raw = false,
    storage_options = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn diff<'py>(
    py: Python<'py>,
    a: PathBuf,
    b: PathBuf,
    rtol: f64,
    atol: f64,
    limits: Option<&Bound<'py, PyDict>>,
    progress: Option<bool>,
    raw: bool,
    storage_options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let storage = self::storage_options(storage_options)?;
    let layout = if raw { ckpt::diff::DiffLayout::Raw } else { ckpt::diff::DiffLayout::State };
    let (limits, source) = read_options(limits)?;
    let options = DiffOptions::default()
        .with_rtol(rtol)
        .with_atol(atol)
        .with_limits(limits)
        .with_source(source)
        .with_layout(layout);
    let (a_staged, b_staged) = py
        .detach(|| Ok::<_, About>((fetched(&a, &storage, Fetch::Whole)?, fetched(&b, &storage, Fetch::Whole)?)))
        .py()?;
    let pb = bar(progress, &format!("comparing {} and {}", shown(&a).display(), shown(&b).display()));
    let report = py
        .detach(|| {
            ckpt::diff_with_progress(a_staged.path(), b_staged.path(), &options, &|done, total| {
                pb.set_length(total);
                pb.set_position(done);
            })
        })
        .py();
    pb.finish_and_clear();
    let r = report?;
    let out = PyDict::new(py);
    out.set_item("only_a", r.only_a.clone())?;
    out.set_item("only_b", r.only_b.clone())?;
    out.set_item("kind_changes", r.kind_changes.clone())?;
    let tensors = PyList::empty(py);
    for t in &r.tensors {
        let d = PyDict::new(py);
        d.set_item("name", &t.name)?;
        d.set_item("dtype", (t.dtype.0.torch_name(), t.dtype.1.torch_name()))?;
        d.set_item("shape", (t.shape.0.clone(), t.shape.1.clone()))?;
        d.set_item("max_abs", t.max_abs)?;
        d.set_item("max_rel", t.max_rel)?;
        d.set_item("mismatched", t.mismatched)?;
        d.set_item("numel", t.numel)?;
        d.set_item("bytewise", t.bytewise)?;
        d.set_item("equal", t.is_equal())?;
        d.set_item("first_index", t.first_index.clone())?;
        d.set_item("first_values", t.first_values)?;
        d.set_item("shown", t.shown())?;
        tensors.append(d)?;
    }
    out.set_item("tensors", tensors)?;
    // Each differing value with both sides, as numpy values.
    let to = ToPy::new(Framework::Numpy, None);
    let values = PyList::empty(py);
    for v in &r.values_differ {
        let d = PyDict::new(py);
        d.set_item("name", &v.name)?;
        d.set_item("a", to.value(py, &v.a)?)?;
        d.set_item("b", to.value(py, &v.b)?)?;
        d.set_item("shown", v.shown())?;
        values.append(d)?;
    }
    out.set_item("values_differ", values)?;
    let text = r.lines(&shown(&a).display().to_string(), &shown(&b).display().to_string(), &options, false, false);
    out.set_item("text", text.join("\n"))?;
    out.set_item("values_equal", r.values_equal)?;
    out.set_item("unreadable", r.unreadable.clone())?;
    out.set_item("aligned_by_id", r.aligned_by_id.clone())?;
    for (key, l) in [("layout_a", &r.layout_a), ("layout_b", &r.layout_b)] {
        let d = PyDict::new(py);
        d.set_item("format", l.format.map(ckpt::Format::name))?;
        d.set_item("keys", l.keys.clone())?;
        d.set_item("nested_under", l.nested_under.clone())?;
        out.set_item(key, d)?;
    }
    out.set_item("equal", r.is_equal())?;
    Ok(out)
}

/// The format of the checkpoint at `path`, by name, from its marker files and leading bytes (at a URL, from
/// what listing it needs: a DCP checkpoint's `.metadata`, a `.pt`'s records but its tensors', headers).
#[pyfunction]
#[pyo3(signature = (path, storage_options = None))]
pub(crate) fn detect(
    py: Python<'_>,
    path: PathBuf,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<&'static str> {
    let storage = self::storage_options(storage_options)?;
    py.detach(|| -> Result<Format, About> {
        let staged = fetched(&path, &storage, Fetch::Index)?;
        Ok(ckpt::detect(staged.path())?)
    })
    .py()
    .map(|f| f.name())
}

/// Every format's `(name, about, sharded)`.
#[pyfunction]
pub(crate) fn formats() -> Vec<(&'static str, &'static str, bool)> {
    Format::ALL.iter().map(|f| (f.name(), f.about(), ckpt::reshard_formats().contains(f))).collect()
}

/// `ckpt.Checkpoint`'s did-you-mean: the names of `names` near `wanted`, best first, at most `n`
/// (`ckpt::suggest::did_you_mean`, the CLI's ranking).
#[pyfunction]
pub(crate) fn did_you_mean(wanted: &str, names: Vec<String>, n: usize) -> Vec<String> {
    ckpt::suggest::did_you_mean(wanted, names.iter().map(String::as_str), n).into_iter().map(str::to_owned).collect()
}
