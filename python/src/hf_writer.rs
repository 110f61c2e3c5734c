//! What `ckpt.dcp.Writer(path, to="hf")` (`python/ckpt/dcp.py`) does in each rank of a training job: the
//! coordinator plans Hugging Face shards from every rank's items ([`hf_layout`], the plan
//! `ckpt.convert(..., to="hf")` makes for the same entries), the ranks bring each shard's chunks to the
//! rank that owns it (torch collectives, in Python), and every owner writes its shards
//! ([`ckpt::hf::RankSave`]); the coordinator writes the index and commits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ckpt::hf::{RankSave, WriteOptions};
use ckpt::io::Durability;
use ckpt::storage::Target;
use ckpt::tensor::{Buffer, PathItem};
use ckpt::{DType, Format, Tensor, Value};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::destination::Destination;
use crate::errors::{IntoPy, core_to_py, usage};
use crate::remote::{shown, storage_options};
use crate::values::FromPy;

/// One rank's part of a Hugging Face save through ckpt (see the module docs).
#[pyclass(module = "ckpt._ckpt")]
pub(crate) struct HfRankSave {
    save: Mutex<Option<RankSave>>,
    /// Where errors point: the path, or the URL without credentials.
    shown: PathBuf,
    /// A URL destination's target, kept open until the commit.
    target: Mutex<Option<Target>>,
    /// The coordinator's check of the destination, completed after the commit (a staged overwrite swapped
    /// in); `None` on the other ranks.
    destination: Mutex<Option<Destination>>,
    /// The destination as given (a path or a URL).
    path: PathBuf,
    /// Where the ranks write: the destination, or the staging path of an overwrite.
    write_path: PathBuf,
}

/// An entry as `ckpt.dcp.Writer` describes it: its name, its path in the nested state dict, and either a
/// tensor's `(dtype, shape, requires_grad)`, the bytes of a BYTE_IO item (`torch.save` of the object), or
/// `None` for a value whose bytes the coordinator does not have (planning).
type EntrySpec<'py> = (String, Vec<Bound<'py, PyAny>>, Bound<'py, PyAny>);

/// A stored tensor of the layout: name, dtype (torch's name), shape.
type StoredRow = (String, String, Vec<usize>);

fn write_options(max_shard_size: Option<u64>, sync: bool, checksums: bool) -> WriteOptions {
    let mut options = WriteOptions::default()
        .with_source("distcp")
        .with_durability(Durability::default().with_sync(sync).with_checksums(checksums));
    if let Some(max) = max_shard_size {
        options = options.with_max_shard_size(max);
    }
    options
}

/// A tensor of `dtype` and `shape` standing for one whose data is elsewhere: every element one stored zero.
fn outline(dtype: DType, shape: &[usize]) -> ckpt::tensor::Result<Tensor> {
    Tensor::from_parts(dtype, shape, &vec![0; shape.len()], 0, Buffer::zeroed(16)?)
}

fn path_items(name: &str, path: &[Bound<'_, PyAny>]) -> PyResult<Vec<PathItem>> {
    if path.is_empty() {
        return Ok(vec![PathItem::Key(name.to_owned())]);
    }
    path.iter()
        .map(|p| match p.extract::<String>() {
            Ok(k) => Ok(PathItem::Key(k)),
            Err(_) => p.extract::<usize>().map(PathItem::Index),
        })
        .collect()
}

/// The entries as values: tensors as outlines, BYTE_IO items decoded (`torch.save` bytes), `None` kept.
fn entries(specs: Vec<EntrySpec<'_>>) -> PyResult<Vec<(String, Vec<PathItem>, Value)>> {
    let mut out = Vec::with_capacity(specs.len());
    for (name, path, spec) in specs {
        let path = path_items(&name, &path)?;
        let value = if spec.is_none() {
            Value::None
        } else if let Ok(b) = spec.cast::<PyBytes>() {
            let buffer = Buffer::from_vec(b.as_bytes().to_vec());
            let options = ckpt::torch::ReadOptions::default();
            ckpt::torch::TorchReader::from_buffer(&buffer, &options)
                .map(ckpt::torch::TorchReader::into_value)
                .map_err(|e| usage(format!("{name}: the object DCP pickled cannot be read: {e}"), None))?
        } else {
            let (dtype, shape, requires_grad): (String, Vec<usize>, bool) = spec.extract()?;
            let dtype = DType::from_torch_name(&dtype)
                .ok_or_else(|| usage(format!("{name}: dtype {dtype} has no safetensors equivalent"), None))?;
            let mut t = outline(dtype, &shape).map_err(|e| usage(format!("{name}: {e}"), None))?;
            if requires_grad {
                t = t.with_requires_grad(true);
            }
            Value::Tensor(t)
        };
        out.push((name, path, value));
    }
    Ok(out)
}

/// What `ckpt._ckpt.hf_layout` gives: for each entry given, its new name and dtype (torch's name; `None`
/// for a value), or `None` when the selection leaves it out; every tensor the files hold in the entries'
/// order (name, dtype, shape); the indices into those of each file; the first shard's `__metadata__`; and
/// the counts (tensors, values, entries that cannot be stored).
type LayoutRows = (
    Vec<Option<(String, Option<String>)>>,
    Vec<StoredRow>,
    Vec<Vec<usize>>,
    HashMap<String, String>,
    (usize, usize, Vec<String>),
);

/// `ckpt._ckpt.hf_layout`: the shards `ckpt.convert(..., to="hf")` would write for `entries` (see
/// [`EntrySpec`]) with the selection (`include`/`exclude` globs, `strip_prefix`/`add_prefix`, floats cast to
/// `dtype`) and `max_shard_size` ([`LayoutRows`]).
#[pyfunction]
#[pyo3(signature = (entries, max_shard_size = None, include = Vec::new(), exclude = Vec::new(), strip_prefix = None,
                    add_prefix = None, dtype = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn hf_layout(
    py: Python<'_>,
    entries: Vec<EntrySpec<'_>>,
    max_shard_size: Option<u64>,
    include: Vec<String>,
    exclude: Vec<String>,
    strip_prefix: Option<String>,
    add_prefix: Option<String>,
    dtype: Option<&str>,
) -> PyResult<LayoutRows> {
    let selection = crate::ops::selection(include, exclude, strip_prefix, add_prefix, dtype)?;
    selection.validate().map_err(|e| usage(e.to_string(), None))?;
    let mut kept = Vec::new();
    let mut names = std::collections::HashSet::new();
    let mut chosen = Vec::with_capacity(entries.len());
    for (name, path, value) in self::entries(entries)? {
        if !selection.keeps(&name) {
            chosen.push(None);
            continue;
        }
        let value = match (value, selection.dtype) {
            (Value::Tensor(t), Some(to)) if ckpt::tensor::cast::is_castable_float(t.dtype()) && t.dtype() != to => {
                let cast = outline(to, t.shape()).map_err(|e| usage(format!("{name}: {e}"), None))?;
                Value::Tensor(cast.with_requires_grad(t.requires_grad()))
            }
            (v, _) => v,
        };
        let (new_name, new_path) = selection
            .rename(&name, &path)
            .ok_or_else(|| usage(format!("strip_prefix leaves nothing of the entry {name:?}"), None))?;
        if !names.insert(new_name.clone()) {
            return Err(usage(format!("two entries would be named {new_name:?} after renaming"), None));
        }
        chosen.push(Some((new_name.clone(), value.as_tensor().map(|t| t.dtype().torch_name().to_owned()))));
        kept.push((new_name, new_path, value));
    }
    let options = write_options(max_shard_size, true, true);
    let plan = py
        .detach(|| ckpt::hf::layout(kept.iter().map(|(n, p, v)| (n.as_str(), p.as_slice(), v)), &options))
        .map_err(|e| usage(format!("Hugging Face shards: {e}"), None))?;
    let stored =
        plan.tensors.iter().map(|(n, t)| (n.clone(), t.dtype().torch_name().to_owned(), t.shape().to_vec())).collect();
    Ok((chosen, stored, plan.shards, plan.records, (plan.report.tensors, plan.report.values, plan.report.dropped)))
}

/// `ckpt._ckpt.hf_parse_size`: a `max_shard_size` as transformers reads it (`"5GB"`, `"500MB"`, bytes).
#[pyfunction]
pub(crate) fn hf_parse_size(size: &Bound<'_, PyAny>) -> PyResult<u64> {
    match size.extract::<u64>() {
        Ok(n) => Ok(n),
        Err(_) => {
            let text: String = size.extract()?;
            ckpt::hf::parse_size(&text).map_err(|e| usage(e.to_string(), None))
        }
    }
}

/// `ckpt._ckpt.hf_begin`: the coordinator begins a save of `world_size` ranks to `path`.
#[pyfunction]
#[pyo3(signature = (path, world_size, sync = true, checksums = true, storage_options = None, overwrite = false))]
pub(crate) fn hf_begin(
    py: Python<'_>,
    path: PathBuf,
    world_size: usize,
    sync: bool,
    checksums: bool,
    storage_options: Option<&Bound<'_, PyDict>>,
    overwrite: bool,
) -> PyResult<HfRankSave> {
    let how = (sync, checksums);
    HfRankSave::start(py, path, how, storage_options, Some(overwrite), |at, o| RankSave::begin(at, world_size, o))
}

/// `ckpt._ckpt.hf_join`: rank `rank` joins the save the coordinator's `ticket` describes.
#[pyfunction]
#[pyo3(signature = (path, ticket, rank, sync = true, checksums = true, storage_options = None))]
pub(crate) fn hf_join(
    py: Python<'_>,
    path: PathBuf,
    ticket: &[u8],
    rank: usize,
    sync: bool,
    checksums: bool,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<HfRankSave> {
    HfRankSave::start(py, path, (sync, checksums), storage_options, None, |at, o| RankSave::join(at, ticket, rank, o))
}

impl HfRankSave {
    /// Opens `path` for writing (a URL's store with `storage_options`) and starts this rank's part with
    /// `start` (begin or join), with the GIL released. `how`: sync and checksums.
    fn start(
        py: Python<'_>,
        path: PathBuf,
        how: (bool, bool),
        storage_options: Option<&Bound<'_, PyDict>>,
        begin: Option<bool>,
        start: impl FnOnce(&Path, &WriteOptions) -> ckpt::hf::Result<RankSave> + Send,
    ) -> PyResult<HfRankSave> {
        let storage = self::storage_options(storage_options)?;
        let options = write_options(None, how.0, how.1);
        let shown = shown(&path);
        let (destination, write_path, target) = Destination::for_rank(py, &path, Format::Hf, begin, how.0, &storage)?;
        let at = target.path().to_path_buf();
        let save = py.detach(|| start(&at, &options)).map_err(|e| core_to_py(e.into(), &shown))?;
        Ok(HfRankSave {
            save: Mutex::new(Some(save)),
            shown,
            target: Mutex::new(Some(target)),
            destination: Mutex::new(destination),
            path,
            write_path,
        })
    }

    fn with<T>(&self, f: impl FnOnce(&RankSave) -> PyResult<T>) -> PyResult<T> {
        let guard = self.save.lock().map_err(|_| usage("ckpt.dcp.Writer: a write panicked", Some(&self.shown)))?;
        match guard.as_ref() {
            Some(s) => f(s),
            None => Err(usage("ckpt.dcp.Writer: this save was committed or abandoned already", Some(&self.shown))),
        }
    }
}

#[pymethods]
impl HfRankSave {
    /// What the other ranks need to join (bytes).
    fn ticket<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.with(|s| Ok(PyBytes::new(py, &s.ticket())))
    }

    /// The file names of `n` shards (on the coordinator).
    fn shard_names(&self, n: usize) -> PyResult<Vec<String>> {
        self.with(|s| Ok(s.shard_names(n)))
    }

    /// Writes shard `file`: `tensors` (`[(name, tensor)]`, whole tensors) with `records` as its
    /// `__metadata__` (the first shard's; `None` for the others), with the GIL released.
    #[pyo3(signature = (file, tensors, records = None))]
    fn write_shard(
        &self,
        py: Python<'_>,
        file: &str,
        tensors: &Bound<'_, PyList>,
        records: Option<HashMap<String, String>>,
    ) -> PyResult<()> {
        let from = FromPy::new(py)?;
        let mut owned: Vec<(String, Tensor)> = Vec::with_capacity(tensors.len());
        for item in tensors.iter() {
            let (name, obj): (String, Bound<'_, PyAny>) = item.extract()?;
            match from.value(&obj)? {
                Value::Tensor(t) | Value::Parameter { tensor: t, .. } => owned.push((name, t)),
                _ => return Err(usage(format!("{name}: a shard holds tensors"), Some(&self.shown))),
            }
        }
        self.with(|s| py.detach(|| s.write_shard(file, &owned, records)).map_err(|e| core_to_py(e.into(), &self.shown)))
    }

    /// This rank's report for the coordinator (`error`: why it failed, or `None`).
    #[pyo3(signature = (error = None))]
    fn report<'py>(&self, py: Python<'py>, error: Option<String>) -> PyResult<Bound<'py, PyBytes>> {
        let own = match error {
            None => Ok(()),
            Some(e) => Err(ckpt::io::RankFailure::new(e)),
        };
        let bytes = self.with(|s| py.detach(|| s.report(own)).map_err(|e| core_to_py(e.into(), &self.shown)))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// The coordinator commits: the index (`total_size` and `weight_map` `[(tensor, file)]`; `total_size`
    /// `None` for a single `model.safetensors`), the shard files, and every rank's report in rank order.
    #[pyo3(signature = (total_size, weight_map, files, reports))]
    fn commit(
        &self,
        py: Python<'_>,
        total_size: Option<u64>,
        weight_map: Vec<(String, String)>,
        files: Vec<String>,
        reports: Vec<Vec<u8>>,
    ) -> PyResult<()> {
        let save =
            self.save.lock().ok().and_then(|mut s| s.take()).ok_or_else(|| {
                usage("ckpt.dcp.Writer: this save was committed or abandoned already", Some(&self.shown))
            })?;
        let map: Vec<(&str, String)> = weight_map.iter().map(|(n, f)| (n.as_str(), f.clone())).collect();
        let index = total_size.map(|t| (t, map.as_slice()));
        py.detach(|| save.commit(index, &files, reports)).map_err(|e| core_to_py(e.into(), &self.shown))?;
        if let Some(target) = self.target.lock().ok().and_then(|mut t| t.take()) {
            py.detach(|| crate::remote::published(target)).py()?;
        }
        if let Some(destination) = self.destination.lock().ok().and_then(|mut d| d.take()) {
            py.detach(|| destination.commit(&self.path)).py()?;
        }
        Ok(())
    }

    /// Gives the save up (the coordinator removes the staging directory); the previous checkpoint stays.
    fn abort(&self) {
        if let Some(s) = self.save.lock().ok().and_then(|mut s| s.take()) {
            s.abort();
        }
        if let Some(destination) = self.destination.lock().ok().and_then(|mut d| d.take()) {
            destination.abandon();
        }
    }

    /// Where every rank writes (the other ranks join the save there): the destination, or the staging path
    /// of `overwrite=True`.
    fn write_path(&self) -> String {
        self.write_path.to_string_lossy().into_owned()
    }
}
