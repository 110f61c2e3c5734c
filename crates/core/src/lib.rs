//! The tensor model shared by every ckpt format crate: dtypes, zero-copy buffers, strided tensors, the
//! Python value tree that checkpoints carry, DCP-style flattening, collectives, and safetensors interchange.
//!
//! Nothing here knows a checkpoint format; format crates (`ckpt-torch`, `ckpt-distcp`, ...) build on it.
//!
//! - [`DType`]: every torch dtype with its names in torch, legacy storages, safetensors and numpy.
//! - [`Buffer`]: owned (64-byte aligned) or memory-mapped bytes; clone and slice without copying;
//!   [`AlignedBytes`]: the owned memory, fresh huge pages for large tensors.
//! - [`Tensor`]: dtype, shape, strides, storage offset over a shared [`Buffer`].
//! - [`Value`]: the Python object tree (dict vs OrderedDict, tuple vs list, `torch.Size`, unknown objects).
//! - [`flatten`] / [`unflatten`]: `torch.distributed.checkpoint`'s key rules.
//! - [`Collective`]: rank, world size, barrier, gather, broadcast — one process, threads, or MPI;
//!   [`host_ranks`] runs a job of `W` ranks on the processes of a group of any size.
//! - [`safetensors`]: read and write `.safetensors` files, with ckpt's lossless metadata convention.
//! - [`select`]: selecting, renaming and casting the entries of a checkpoint; [`cast_float`]: torch's float
//!   conversions, bit for bit.
//! - [`commit`]: the durable commit path every writer uses — crash-safe file and directory commits at the
//!   disk's speed, advisory locks, checksum manifests, failpoints.
//!
//! # Feature flags
//! - `tch`: convert [`Tensor`] to and from `tch::Tensor` (module [`tch_interop`]).
//! - `mpi`: [`MpiCollective`], the processes of an MPI job (`mpirun`) as a [`Collective`] (needs an MPI
//!   library and libclang to build).

#![deny(unsafe_op_in_unsafe_fn)]

mod aligned;
pub mod atomic;
mod buffer;
mod cast;
mod checkpoint;
mod collective;
pub mod commit;
mod display;
mod dtype;
mod error;
mod flatten;
mod hosted;
#[cfg(feature = "mpi")]
mod mpi_collective;
mod outline;
pub mod safetensors;
pub mod select;
#[cfg(feature = "tch")]
pub mod tch_interop;
mod tensor;
mod value;

pub use aligned::{AlignedBytes, PAGES_MIN, zeroed_vec};
pub use buffer::Buffer;
pub use cast::{cast_float, cast_float_lazy, is_castable_float};
pub use checkpoint::{CheckpointRead, Entry, EntryKind, TensorInfo, entry_kind};
pub use collective::{Collective, SingleProcess, ThreadGroup};
pub use display::{BRIEF, brief, element_f64, format_tensor};
pub use dtype::{DType, StorageClass};
pub use error::{Error, Fault, Result};
pub use flatten::{
    FlatEntry, LeafIndex, MAX_UNFLATTEN_INDEX, PathItem, entry_names, flatten, float_repr, join_path, leaf_names,
    leaves, object_parts, object_tensors, python_str, unflatten,
};
pub use hosted::{host_ranks, hosted_ranks};
#[cfg(feature = "mpi")]
pub use mpi_collective::{MpiCollective, TIMEOUT_ENV as MPI_TIMEOUT_ENV, launched_by_mpi};
pub use outline::{format_value, format_value_with, shared_paths};
pub use tensor::{Element, Tensor, checked_numel, contiguous_strides, required_storage_elements};
pub use value::{
    Dict, DictKind, NUMPY_MULTIARRAY, Numpy, Object, OpaqueTensorKind, Value, ValueShape, bigint_decimal,
    numpy_dtype_code, numpy_unsupported,
};
