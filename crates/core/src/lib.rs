//! The tensor model shared by every ckpt format crate: dtypes, zero-copy buffers, strided tensors, the
//! Python value tree that checkpoints carry, DCP-style flattening, collectives, and safetensors interchange.
//!
//! Nothing here knows a checkpoint format; format crates (`ckpt-torch`, `ckpt-distcp`, ...) build on it.
//!
//! - [`DType`]: every torch dtype with its names in torch, legacy storages, safetensors and numpy.
//! - [`Buffer`]: owned (64-byte aligned) or memory-mapped bytes; clone and slice without copying.
//! - [`Tensor`]: dtype, shape, strides, storage offset over a shared [`Buffer`].
//! - [`Value`]: the Python object tree (dict vs OrderedDict, tuple vs list, `torch.Size`, unknown objects).
//! - [`flatten`] / [`unflatten`]: `torch.distributed.checkpoint`'s key rules.
//! - [`Collective`]: rank, world size, barrier, gather, broadcast — one process, threads, or MPI.
//! - [`safetensors`]: read and write `.safetensors` files.
//! - [`commit`]: the durable commit path every writer uses — crash-safe file and directory commits at the
//!   disk's speed, advisory locks, checksum manifests, failpoints.
//!
//! # Feature flags
//! - `tch`: convert [`Tensor`] to and from `tch::Tensor` (module [`tch_interop`]).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod atomic;
mod buffer;
mod checkpoint;
mod collective;
pub mod commit;
mod display;
mod dtype;
mod error;
mod flatten;
pub mod safetensors;
#[cfg(feature = "tch")]
pub mod tch_interop;
mod tensor;
mod value;

pub use buffer::Buffer;
pub use checkpoint::{CheckpointRead, Entry, EntryKind, TensorInfo, entry_kind};
pub use collective::{Collective, SingleProcess, ThreadGroup};
pub use display::{element_f64, format_tensor};
pub use dtype::{DType, StorageClass};
pub use error::{Error, Fault, Result};
pub use flatten::{
    FlatEntry, LeafIndex, MAX_UNFLATTEN_INDEX, PathItem, flatten, float_repr, join_path, leaf_names, leaves,
    python_str, unflatten,
};
pub use tensor::{Element, Tensor, checked_numel, contiguous_strides, required_storage_elements};
pub use value::{Dict, DictKind, Object, OpaqueTensorKind, Value, bigint_decimal};
