//! What every format's reader exposes: entries known before any data is read, then lazy reads.

use crate::composite::{Composite, Layout};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;
use crate::value::{OpaqueTensorKind, Value};

/// Metadata of a tensor entry, known without reading its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of the tensor's elements.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

/// Metadata of a quantized, sparse or nested tensor entry ([`crate::Composite`]), known without reading
/// its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompositeInfo {
    /// How its components make its values.
    pub layout: Layout,
    /// Its dtype as torch reports it (`quint8`, the values' dtype of a sparse tensor).
    pub dtype: DType,
    /// The dense shape (a nested tensor's: its number of tensors).
    pub shape: Vec<usize>,
    /// Each component's name ([`Layout::components`]) and metadata.
    pub components: Vec<(&'static str, TensorInfo)>,
}

/// What an entry holds.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EntryKind {
    /// A dense tensor.
    Tensor(TensorInfo),
    /// A tensor whose data cannot be read (sparse, quantized, ...).
    OpaqueTensor(OpaqueTensorKind),
    /// A quantized, sparse or nested tensor, read as its components ([`CheckpointRead::value`] gives the
    /// [`Value::Composite`]).
    Composite(CompositeInfo),
    /// Any other value (DCP calls these BYTE_IO items).
    Value,
}

/// One flattened entry of a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Flattened name (`model.layers.0.weight`).
    pub name: String,
    /// What it holds.
    pub kind: EntryKind,
}

impl Entry {
    /// The tensor metadata, if this is a dense tensor.
    pub fn tensor_info(&self) -> Option<&TensorInfo> {
        match &self.kind {
            EntryKind::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// Read access to a checkpoint of any format.
///
/// Call order: open (format-specific), then [`entries`](CheckpointRead::entries) — available without
/// reading tensor data — then [`tensor`](CheckpointRead::tensor) / [`value`](CheckpointRead::value) for the
/// entries wanted, in any order, as often as wanted.
pub trait CheckpointRead {
    /// Short format name (`torch`, `distcp`, `safetensors`, ...).
    fn format_name(&self) -> &'static str;

    /// Every entry, in the format's order.
    fn entries(&self) -> Vec<Entry>;

    /// Format-specific facts worth showing a user (`("container", "zip")`, `("version", "3")`, ...).
    fn details(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Why the entry `name` cannot be read, known without reading it (a data file of a directory format
    /// that is missing); `None` when nothing is known against it. Listing shows it beside the entry.
    fn unreadable(&self, _name: &str) -> Option<String> {
        None
    }

    /// The tensor entry `name`.
    ///
    /// # Errors
    /// If there is no such tensor entry, it is opaque, or its data is invalid.
    fn tensor(&self, name: &str) -> Result<Tensor>;

    /// The non-tensor entry `name`.
    ///
    /// # Errors
    /// If there is no such entry or it cannot be decoded.
    fn value(&self, name: &str) -> Result<Value>;
}

/// The entry a flattened leaf becomes.
pub fn entry_kind(v: &Value) -> EntryKind {
    match v {
        Value::OpaqueTensor { kind, .. } => EntryKind::OpaqueTensor(*kind),
        Value::Composite(c) => EntryKind::Composite(composite_info(c)),
        other => match other.as_tensor() {
            Some(t) => EntryKind::Tensor(TensorInfo { dtype: t.dtype(), shape: t.shape().to_vec() }),
            None => EntryKind::Value,
        },
    }
}

/// The entry metadata of a composite tensor.
pub fn composite_info(c: &Composite) -> CompositeInfo {
    CompositeInfo {
        layout: c.layout,
        dtype: c.dtype,
        shape: c.shape.clone(),
        components: c
            .named_components()
            .map(|(n, t)| (n, TensorInfo { dtype: t.dtype(), shape: t.shape().to_vec() }))
            .collect(),
    }
}
