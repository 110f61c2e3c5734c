//! `embeddings_<entity>_<part>.v<version>.h5`: one entity partition's embeddings, its `RowAdagrad` state and
//! the metadata attributes.

use std::path::Path;

use ckpt_tensor::{DType, Tensor};

use crate::error::{Error, Result};
use crate::h5::{Element, Reader, Writer};
use crate::metadata::{AttrValue, FORMAT_VERSION, FORMAT_VERSION_ATTR, Metadata};
use crate::optimizer::OptimizerState;

/// Name of the embeddings dataset.
pub const EMBEDDINGS_DATASET: &str = "embeddings";
/// Name of the optimizer blob dataset (in both file kinds).
pub const OPTIMIZER_DATASET: &str = "optimizer/state_dict";

/// The contents of an embeddings file.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityPartition {
    /// float32 `[N, D]`: row `i` is the entity at offset `i` of the partition. Read from a file, this is a
    /// window of the file's memory map.
    pub embeddings: Tensor,
    /// The `RowAdagrad` state blob, if the file has one (trainer-written files always do; files made by
    /// users for `init_path` often do not).
    pub optimizer: Option<OptimizerState>,
    /// The root attributes besides `format_version`.
    pub metadata: Metadata,
}

impl EntityPartition {
    /// Embeddings without optimizer state or metadata (what users write for warm starts).
    pub fn new(embeddings: Tensor) -> Self {
        EntityPartition { embeddings, optimizer: None, metadata: Metadata::new() }
    }

    /// Number of entities (rows).
    pub fn len(&self) -> usize {
        self.embeddings.shape().first().copied().unwrap_or(0)
    }

    /// Whether the partition has no entities.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The embedding dimension (columns).
    pub fn dimension(&self) -> usize {
        self.embeddings.shape().get(1).copied().unwrap_or(0)
    }
}

/// Checks the root `format_version` the way PBG does (`hf.attrs.get("format_version") != 1` is an error;
/// any number equal to 1 passes), and returns the other attributes as metadata.
pub(crate) fn check_format_version(path: &Path, attrs: Vec<(String, AttrValue)>) -> Result<Metadata> {
    let mut metadata = Metadata::new();
    let mut version = None;
    for (name, value) in attrs {
        if name == FORMAT_VERSION_ATTR {
            version = Some(value);
        } else {
            metadata.attrs.push((name, value));
        }
    }
    match version {
        Some(AttrValue::Int(FORMAT_VERSION)) => Ok(metadata),
        Some(AttrValue::Float(f)) if f == FORMAT_VERSION as f64 => Ok(metadata),
        Some(other) => Err(Error::FormatVersion { path: path.to_path_buf(), found: other.to_string() }),
        None => Err(Error::FormatVersion { path: path.to_path_buf(), found: "no such attribute".into() }),
    }
}

/// Reads the optional optimizer blob of an open file.
pub(crate) fn read_optimizer(r: &Reader) -> Result<Option<OptimizerState>> {
    if !r.exists(OPTIMIZER_DATASET) {
        return Ok(None);
    }
    let ds = r.dataset(OPTIMIZER_DATASET)?;
    let info = r.info(OPTIMIZER_DATASET, &ds)?;
    let size = match info.element {
        Element::Opaque { size } => size,
        Element::Numeric { dtype: DType::U8 | DType::I8, .. } => 1,
        ref other => {
            return Err(Error::WrongDtype {
                path: r.path().to_path_buf(),
                name: OPTIMIZER_DATASET.into(),
                expected: "opaque bytes (numpy V1)",
                found: other.describe(),
            });
        }
    };
    if info.shape.len() != 1 {
        return Err(Error::WrongRank {
            path: r.path().to_path_buf(),
            name: OPTIMIZER_DATASET.into(),
            expected: 1,
            found: info.shape.len(),
            shape: info.shape,
        });
    }
    Ok(Some(OptimizerState::from_bytes(r.read_bytes(&ds, &info, size)?)))
}

/// Reads an embeddings file like PBG's `load_entity_partition`, validating everything before returning:
/// the HDF5 signature, `format_version`, the `embeddings` dataset (a float type, converted to float32 if
/// needed, rank 2) and the optional optimizer blob (opaque bytes, rank 1; decoded only on demand).
///
/// # Errors
/// [`Error::CouldNotLoad`] if the file does not exist, [`Error::NotHdf5`], [`Error::FormatVersion`],
/// [`Error::MissingDataset`], [`Error::WrongDtype`], [`Error::WrongRank`], [`Error::BadStorage`],
/// [`Error::Hdf5`].
pub fn read_partition_file(path: &Path) -> Result<EntityPartition> {
    let r = Reader::open(path)?;
    let metadata = check_format_version(path, r.root_attrs()?)?;
    let ds = r.dataset(EMBEDDINGS_DATASET)?;
    let info = r.info(EMBEDDINGS_DATASET, &ds)?;
    if !matches!(info.element, Element::Numeric { dtype: DType::F32 | DType::F64 | DType::F16, .. }) {
        return Err(Error::WrongDtype {
            path: path.to_path_buf(),
            name: EMBEDDINGS_DATASET.into(),
            expected: "float32 (or another float type, converted)",
            found: info.element.describe(),
        });
    }
    if info.shape.len() != 2 {
        return Err(Error::WrongRank {
            path: path.to_path_buf(),
            name: EMBEDDINGS_DATASET.into(),
            expected: 2,
            found: info.shape.len(),
            shape: info.shape,
        });
    }
    let embeddings = r.read_f32(&ds, &info)?;
    let optimizer = read_optimizer(&r)?;
    Ok(EntityPartition { embeddings, optimizer, metadata })
}

/// Writes an embeddings file like PBG's `save_entity_partition` (`format_version` = 1 first, then the
/// metadata, then `embeddings`, then `optimizer/state_dict`) at `path`, durably and atomically: a
/// temporary file beside it, written through ckpt's durable writer (`O_DIRECT` where the file system allows
/// it), `fdatasync`, rename over `path`, fsync of the directory ([`ckpt_io::FileCommit`]). A crash
/// leaves the old file or the new one.
///
/// # Errors
/// [`Error::InvalidInput`] unless the embeddings are float32 of rank 2; [`Error::Hdf5`], [`Error::Io`].
pub fn write_partition_file(path: &Path, partition: &EntityPartition) -> Result<()> {
    let e = &partition.embeddings;
    if e.dtype() != DType::F32 || e.dim() != 2 {
        return Err(Error::InvalidInput {
            what: format!("embeddings for {}", path.display()),
            reason: format!("PBG embeddings are float32 [N, D], got {} {:?}", e.dtype(), e.shape()),
        });
    }
    let mut w = Writer::create_durable(path)?;
    let root = w.root()?;
    w.set_attr(&root, FORMAT_VERSION_ATTR, &AttrValue::Int(FORMAT_VERSION))?;
    for (k, v) in &partition.metadata.attrs {
        w.set_attr(&root, k, v)?;
    }
    w.add_tensor(&root, EMBEDDINGS_DATASET, e)?;
    if let Some(opt) = &partition.optimizer {
        w.add_opaque(&root, OPTIMIZER_DATASET, opt.bytes().as_bytes())?;
    }
    drop(root);
    w.finish()
}
