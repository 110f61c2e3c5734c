//! What `ckpt.dcp.Writer` (a `torch.distributed.checkpoint.StorageWriter`, `python/ckpt/dcp.py`) does in
//! each rank of a training job: one rank's part of a save whose plans and results DCP exchanges itself
//! ([`ckpt::distcp::RankSave`]). The coordinator begins the save in `prepare_global_plan` and puts its
//! ticket into every rank's plan; every rank writes its items (tensors straight from their memory, with the
//! GIL released) and reports; the coordinator commits in `finish` with DCP's metadata and every report.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ckpt::distcp::metadata::DCP_VERSION;
use ckpt::distcp::{
    ChunkStorageMetadata, ItemData, MemoryFormat, Metadata, MetadataIndex, Profile, RankItem, RankSave, StorageInfo,
    StorageMeta, StorageMetadata, TensorProperties, TensorStorageMetadata, WriteOptions,
};
use ckpt::io::Durability;
use ckpt::storage::Target;
use ckpt::tensor::PathItem;
use ckpt::{DType, Format, Tensor, Value};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::destination::Destination;
use crate::errors::{IntoPy, usage};
use crate::remote::{shown, storage_options};
use crate::values::FromPy;

/// One rank's part of a DCP save through ckpt (see the module docs).
#[pyclass(module = "ckpt._ckpt")]
pub(crate) struct DcpRankSave {
    save: Mutex<Option<RankSave>>,
    /// Where errors point: the path, or the URL without credentials.
    shown: PathBuf,
    profile: Profile,
    checkpoint_id: String,
    /// A URL destination's target, kept open until the commit.
    target: Mutex<Option<Target>>,
    /// The coordinator's check of the destination, completed after the commit (a staged overwrite swapped
    /// in); `None` on the other ranks.
    destination: Mutex<Option<Destination>>,
    /// Where the ranks write: the destination, or the staging path of an overwrite.
    write_path: PathBuf,
}

fn options(profile: Option<&str>, sync: bool, checksums: bool, path: &Path) -> PyResult<(WriteOptions, Profile)> {
    let profile = match profile {
        None | Some("max-compat") | Some("max_compat") => Profile::MaxCompat,
        Some("torch213") => Profile::Torch213,
        Some(other) => return Err(usage(format!("dcp_profile {other:?}: max-compat or torch213"), Some(path))),
    };
    let durability = Durability::default().with_sync(sync).with_checksums(checksums);
    Ok((WriteOptions::default().with_profile(profile).with_durability(durability).with_overwrite(true), profile))
}

fn failed(path: &Path, e: ckpt::distcp::Error) -> PyErr {
    crate::errors::to_py(ckpt::Error::Format { path: path.to_path_buf(), source: e.into() })
}

/// `ckpt._ckpt.dcp_begin`: the coordinator begins a save of `world_size` ranks to `path`, after checking
/// what stands there (`overwrite`: replace anything, whole).
#[pyfunction]
#[pyo3(signature = (path, world_size, dcp_profile = None, sync = true, checksums = true, storage_options = None,
    overwrite = false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dcp_begin(
    py: Python<'_>,
    path: PathBuf,
    world_size: usize,
    dcp_profile: Option<&str>,
    sync: bool,
    checksums: bool,
    storage_options: Option<&Bound<'_, pyo3::types::PyDict>>,
    overwrite: bool,
) -> PyResult<DcpRankSave> {
    let how = (dcp_profile, sync, checksums);
    let begin = Some(overwrite);
    DcpRankSave::start(py, path, how, storage_options, begin, |at, options| RankSave::begin(at, world_size, options))
}

/// `ckpt._ckpt.dcp_join`: rank `rank` joins the save the coordinator's `ticket` describes.
#[pyfunction]
#[pyo3(signature = (path, ticket, rank, dcp_profile = None, sync = true, checksums = true, storage_options = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dcp_join(
    py: Python<'_>,
    path: PathBuf,
    ticket: &[u8],
    rank: usize,
    dcp_profile: Option<&str>,
    sync: bool,
    checksums: bool,
    storage_options: Option<&Bound<'_, pyo3::types::PyDict>>,
) -> PyResult<DcpRankSave> {
    let how = (dcp_profile, sync, checksums);
    DcpRankSave::start(py, path, how, storage_options, None, |at, options| RankSave::join(at, ticket, rank, options))
}

/// A row of `Metadata.state_dict_metadata` as `ckpt.dcp.Writer.finish` passes it: the key, then for a
/// tensor its dtype's torch name, global size, chunks (`(offsets, sizes)`) and `requires_grad`; `None` for
/// the rest of a BYTE_IO item.
type EntryRow = (String, Option<String>, Option<Vec<usize>>, Option<Vec<(Vec<usize>, Vec<usize>)>>, bool);

/// Where [`DcpRankSave::write`] put an item: file, offset, length, stream transforms.
type Placed = (String, u64, u64, Vec<String>);

/// A row of `Metadata.storage_data`: key, chunk offsets, chunk index, file, offset, length, transforms.
type StorageRow = (String, Option<Vec<usize>>, Option<usize>, String, u64, u64, Vec<String>);

impl DcpRankSave {
    /// Opens `path` for writing (a URL's store with `storage_options`) and starts this rank's part with
    /// `start` (begin or join), with the GIL released. `how`: the DCP profile, sync and checksums. `begin`:
    /// on the coordinator, whether to overwrite what stands at `path` (checked first); on the other ranks
    /// `None`, and `path` is where the coordinator writes ([`DcpRankSave::write_path`]).
    fn start(
        py: Python<'_>,
        path: PathBuf,
        how: (Option<&str>, bool, bool),
        storage_options: Option<&Bound<'_, pyo3::types::PyDict>>,
        begin: Option<bool>,
        start: impl FnOnce(&Path, &WriteOptions) -> ckpt::distcp::Result<RankSave> + Send,
    ) -> PyResult<DcpRankSave> {
        let storage = self::storage_options(storage_options)?;
        let (options, profile) = options(how.0, how.1, how.2, &path)?;
        let shown = shown(&path);
        let (destination, write_path, target) =
            Destination::for_rank(py, &path, Format::Distcp, begin, how.1, &storage)?;
        let at = target.path().to_path_buf();
        let save = py.detach(|| start(&at, &options)).map_err(|e| failed(&shown, e))?;
        Ok(DcpRankSave {
            save: Mutex::new(Some(save)),
            shown,
            profile,
            checkpoint_id: path.to_string_lossy().into_owned(),
            target: Mutex::new(Some(target)),
            destination: Mutex::new(destination),
            write_path,
        })
    }

    fn take(&self) -> PyResult<RankSave> {
        self.save
            .lock()
            .ok()
            .and_then(|mut s| s.take())
            .ok_or_else(|| usage("ckpt.dcp.Writer: this save was committed or abandoned already", Some(&self.shown)))
    }

    fn with<T>(&self, f: impl FnOnce(&RankSave) -> PyResult<T>) -> PyResult<T> {
        let guard = self.save.lock().map_err(|_| usage("ckpt.dcp.Writer: a write panicked", Some(&self.shown)))?;
        match guard.as_ref() {
            Some(s) => f(s),
            None => Err(usage("ckpt.dcp.Writer: this save was committed or abandoned already", Some(&self.shown))),
        }
    }

    fn metadata(
        &self,
        entries: Vec<EntryRow>,
        storage: Vec<StorageRow>,
        planner_data: Option<Vec<(String, Vec<Bound<'_, PyAny>>)>>,
        save_id: Option<String>,
    ) -> PyResult<Metadata> {
        let mut md = Metadata::default();
        let legacy = self.profile == Profile::MaxCompat;
        for (fqn, dtype, size, chunks, requires_grad) in entries {
            let stored = match (dtype, size, chunks) {
                (Some(dtype), Some(size), Some(chunks)) => {
                    let dtype = DType::from_torch_name(&dtype).ok_or_else(|| {
                        usage(format!("{fqn}: dtype {dtype} has no DCP equivalent"), Some(&self.shown))
                    })?;
                    let mut properties = TensorProperties::new(dtype);
                    properties.requires_grad = requires_grad;
                    properties.memory_format = MemoryFormat::Contiguous;
                    properties.legacy_class = legacy;
                    let chunks =
                        chunks.into_iter().map(|(offsets, sizes)| ChunkStorageMetadata { offsets, sizes }).collect();
                    StorageMetadata::Tensor(TensorStorageMetadata { properties, size, chunks })
                }
                _ => StorageMetadata::Bytes,
            };
            md.state_dict_metadata.push((fqn, stored));
        }
        for (fqn, offset, index, relative_path, start, length, transform_descriptors) in storage {
            md.storage_data.push((
                MetadataIndex { fqn, offset, index },
                StorageInfo { relative_path, offset: start, length, transform_descriptors },
            ));
        }
        if let Some(rows) = planner_data {
            let mut out = Vec::with_capacity(rows.len());
            for (fqn, path) in rows {
                let mut items = Vec::with_capacity(path.len());
                for p in path {
                    items.push(match p.extract::<String>() {
                        Ok(k) => PathItem::Key(k),
                        Err(_) => PathItem::Index(p.extract::<usize>()?),
                    });
                }
                out.push((fqn, items));
            }
            md.planner_data = Some(out);
        }
        if self.profile == Profile::Torch213 {
            md.storage_meta = Some(StorageMeta {
                checkpoint_id: Value::Str(self.checkpoint_id.clone()),
                save_id,
                load_id: None,
                modules: Some(Vec::new()),
            });
            md.version = Some(DCP_VERSION.to_owned());
        }
        Ok(md)
    }
}

#[pymethods]
impl DcpRankSave {
    /// What the other ranks need to join (bytes).
    fn ticket<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.with(|s| Ok(PyBytes::new(py, &s.ticket())))
    }

    /// Writes this rank's items (`[(key, chunk offsets or None, tensor | array | bytes)]`) into its data
    /// file with the GIL released; returns `[(file, offset, length, transforms)]` in the same order.
    fn write(&self, py: Python<'_>, items: &Bound<'_, PyList>) -> PyResult<Vec<Placed>> {
        enum Data {
            Tensor(Tensor),
            Bytes(Vec<u8>),
        }
        let from = FromPy::new(py)?;
        let mut owned: Vec<(String, Option<Vec<usize>>, Data)> = Vec::with_capacity(items.len());
        for item in items.iter() {
            let (fqn, offsets, obj): (String, Option<Vec<usize>>, Bound<'_, PyAny>) = item.extract()?;
            let data = if let Ok(b) = obj.cast::<PyBytes>() {
                Data::Bytes(b.as_bytes().to_vec())
            } else {
                match from.value(&obj)? {
                    Value::Tensor(t) | Value::Parameter { tensor: t, .. } => Data::Tensor(t),
                    _ => return Err(usage(format!("{fqn}: a write item is a tensor or bytes"), Some(&self.shown))),
                }
            };
            owned.push((fqn, offsets, data));
        }
        let items: Vec<RankItem<'_>> = owned
            .iter()
            .map(|(fqn, offsets, data)| RankItem {
                fqn: fqn.clone(),
                offsets: offsets.clone(),
                data: match data {
                    Data::Tensor(t) => ItemData::Tensor(t),
                    Data::Bytes(b) => ItemData::Bytes(b),
                },
            })
            .collect();
        let infos = self.with(|s| py.detach(|| s.write(&items)).map_err(|e| failed(&self.shown, e)))?;
        Ok(infos.into_iter().map(|i| (i.relative_path, i.offset, i.length, i.transform_descriptors)).collect())
    }

    /// This rank's report for the coordinator (`error`: why it failed, or `None`).
    #[pyo3(signature = (error = None))]
    fn report<'py>(&self, py: Python<'py>, error: Option<String>) -> PyResult<Bound<'py, PyBytes>> {
        let own = match error {
            None => Ok(()),
            Some(e) => Err(ckpt::io::RankFailure::new(e)),
        };
        let bytes = self.with(|s| py.detach(|| s.report(own)).map_err(|e| failed(&self.shown, e)))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// The coordinator commits: DCP's metadata (as rows) and every rank's report, in rank order. Returns
    /// `(tensors, bytes, values)` of the checkpoint.
    #[pyo3(signature = (entries, storage, planner_data, save_id, reports))]
    fn commit(
        &self,
        py: Python<'_>,
        entries: Vec<EntryRow>,
        storage: Vec<StorageRow>,
        planner_data: Option<Vec<(String, Vec<Bound<'_, PyAny>>)>>,
        save_id: Option<String>,
        reports: Vec<Vec<u8>>,
    ) -> PyResult<(usize, u64, usize)> {
        let md = self.metadata(entries, storage, planner_data, save_id)?;
        let save = self.take()?;
        let report = py.detach(|| save.commit(&md, reports)).map_err(|e| failed(&self.shown, e))?;
        if let Some(target) = self.target.lock().ok().and_then(|mut t| t.take()) {
            py.detach(|| crate::remote::published(target)).py()?;
        }
        if let Some(destination) = self.destination.lock().ok().and_then(|mut d| d.take()) {
            let path = PathBuf::from(&self.checkpoint_id);
            py.detach(|| destination.commit(&path)).py()?;
        }
        Ok((report.tensors, report.bytes, report.values))
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
