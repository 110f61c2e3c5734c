//! What a checkpoint holds, listed: every entry with its kind, dtype, shape and size, the format's details,
//! and the totals ([`InspectReport`], `ckpt inspect`, whose `--json` is [`InspectReport::to_json`]).

use std::path::PathBuf;

use ckpt_tensor::{DType, EntryKind};

use crate::checkpoint::Checkpoint;
use crate::format::Format;
use crate::select::Selection;

/// What [`inspect`] found.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct InspectReport {
    /// The format.
    pub format: Format,
    /// The path the checkpoint was opened from.
    pub path: PathBuf,
    /// The format's details (version, ranks, shards, ...), as its reader names them.
    pub details: Vec<(String, String)>,
    /// The entries the selection keeps, in the checkpoint's order.
    pub entries: Vec<InspectedEntry>,
    /// Counts over those entries.
    pub totals: Totals,
}

/// One entry of an [`InspectReport`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct InspectedEntry {
    /// The entry's name.
    pub name: String,
    /// What it is.
    pub kind: InspectedKind,
    /// Why it cannot be read, where that is known without reading it (a data file that is missing); the
    /// entry is still listed, from the metadata.
    pub unreadable: Option<String>,
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum InspectedKind {
    /// A dense tensor.
    Tensor {
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        shape: Vec<usize>,
        /// Its bytes.
        nbytes: usize,
    },
    /// A tensor ckpt lists but does not read as dense data (sparse, quantized, nested, meta), by kind.
    OpaqueTensor {
        /// The kind, lower case (`sparse`, ...).
        kind: String,
    },
    /// A quantized, sparse or nested tensor: its layout, dtype and dense shape, and its components.
    Composite {
        /// torch's name of the layout (`per_tensor_affine`, `sparse_csr`, `nested`, ...).
        layout: &'static str,
        /// Its dtype (`quint8`, the values' dtype).
        dtype: DType,
        /// Its dense shape (a nested tensor's: its number of tensors).
        shape: Vec<usize>,
        /// Each component's name, dtype and shape.
        components: Vec<(&'static str, DType, Vec<usize>)>,
        /// The bytes of its components.
        nbytes: usize,
    },
    /// Any other value, by its Python type name (`int`, `dict`, ...).
    Value {
        /// The type name.
        type_name: &'static str,
    },
}

/// The counts of an [`InspectReport`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Totals {
    /// Dense tensors.
    pub tensors: usize,
    /// Their bytes.
    pub nbytes: usize,
    /// Other values.
    pub values: usize,
    /// Opaque tensors.
    pub opaque_tensors: usize,
}

/// Lists the entries of `checkpoint` that `selection` keeps, with the totals.
///
/// ```
/// use ckpt::tensor::{Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("m.pt");
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap())), ("step", Value::Int(3))]);
/// ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
/// let report = ckpt::inspect(&ckpt::open(&path)?, &ckpt::Selection::default());
/// assert_eq!((report.totals.tensors, report.totals.nbytes, report.totals.values), (1, 8, 1));
/// assert_eq!(report.to_json()["entries"][1]["type"], "int");
/// # Ok::<(), ckpt::Error>(())
/// ```
pub fn inspect(checkpoint: &Checkpoint, selection: &Selection) -> InspectReport {
    let mut totals = Totals::default();
    let entries = checkpoint
        .entries()
        .into_iter()
        .filter(|e| selection.keeps(&e.name))
        .map(|e| {
            let kind = match &e.kind {
                EntryKind::Tensor(t) => {
                    totals.tensors += 1;
                    totals.nbytes = totals.nbytes.saturating_add(t.nbytes());
                    InspectedKind::Tensor { dtype: t.dtype, shape: t.shape.clone(), nbytes: t.nbytes() }
                }
                EntryKind::Composite(c) => {
                    totals.tensors += 1;
                    let nbytes = c.components.iter().fold(0usize, |n, (_, t)| n.saturating_add(t.nbytes()));
                    totals.nbytes = totals.nbytes.saturating_add(nbytes);
                    InspectedKind::Composite {
                        layout: c.layout.name(),
                        dtype: c.dtype,
                        shape: c.shape.clone(),
                        components: c.components.iter().map(|(n, t)| (*n, t.dtype, t.shape.clone())).collect(),
                        nbytes,
                    }
                }
                EntryKind::OpaqueTensor(k) => {
                    totals.opaque_tensors += 1;
                    InspectedKind::OpaqueTensor { kind: format!("{k:?}").to_lowercase() }
                }
                _ => {
                    totals.values += 1;
                    let type_name = match checkpoint.unreadable(&e.name) {
                        Some(_) => "value",
                        None => checkpoint.value(&e.name).map(|v| v.type_name()).unwrap_or("value"),
                    };
                    InspectedKind::Value { type_name }
                }
            };
            let unreadable = checkpoint.unreadable(&e.name);
            InspectedEntry { name: e.name, kind, unreadable }
        })
        .collect();
    InspectReport {
        format: checkpoint.format(),
        path: checkpoint.path().to_path_buf(),
        details: checkpoint.reader().details(),
        entries,
        totals,
    }
}

impl InspectReport {
    /// The report as `ckpt inspect --json` prints it:
    /// `{"format", "path", "details": {..}, "entries": [{"name", "kind", "dtype", "shape", "nbytes"} ..],
    /// "totals": {"tensors", "nbytes", "values", "opaque_tensors"}}`; a value entry has its `type`, an
    /// opaque tensor its `opaque` kind, and both a null dtype, shape and size; a quantized, sparse or nested
    /// tensor is a `tensor` with its `layout` and `components` (`[{"name", "dtype", "shape"}]`), its size the
    /// components' bytes.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let entries: Vec<serde_json::Value> = self
            .entries
            .iter()
            .map(|e| {
                let mut row = match &e.kind {
                InspectedKind::Tensor { dtype, shape, nbytes } => json!({
                    "name": e.name, "kind": "tensor", "dtype": dtype.torch_name(), "shape": shape, "nbytes": nbytes,
                }),
                InspectedKind::Composite { layout, dtype, shape, components, nbytes } => json!({
                    "name": e.name, "kind": "tensor", "layout": layout, "dtype": dtype.torch_name(), "shape": shape,
                    "nbytes": nbytes,
                    "components": components.iter().map(|(n, d, s)| json!({"name": n, "dtype": d.torch_name(), "shape": s})).collect::<Vec<_>>(),
                }),
                InspectedKind::OpaqueTensor { kind } => json!({
                    "name": e.name, "kind": "opaque_tensor", "opaque": kind, "dtype": null, "shape": null, "nbytes": null,
                }),
                InspectedKind::Value { type_name } => json!({
                    "name": e.name, "kind": "value", "type": type_name, "dtype": null, "shape": null, "nbytes": null,
                }),
                };
                if let (Some(why), Some(map)) = (&e.unreadable, row.as_object_mut()) {
                    map.insert("unreadable".into(), json!(why));
                }
                row
            })
            .collect();
        let details: serde_json::Map<String, serde_json::Value> =
            self.details.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
        let t = &self.totals;
        json!({
            "format": self.format.name(),
            "path": self.path.display().to_string(),
            "details": details,
            "entries": entries,
            "totals": {"tensors": t.tensors, "nbytes": t.nbytes, "values": t.values, "opaque_tensors": t.opaque_tensors},
        })
    }
}
