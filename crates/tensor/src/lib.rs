//! The tensor model every ckpt crate shares: dtypes, zero-copy buffers, strided tensors, the Python value
//! tree that checkpoints carry, DCP-style flattening, and torch's float casts.
//!
//! Nothing here knows a checkpoint format, a file system or a process group: format crates (`ckpt-torch`,
//! `ckpt-distcp`, ...) build on it, durable writes are `ckpt-io`'s, process groups `ckpt-collective`'s and
//! safetensors `ckpt-safetensors`'.
//!
//! - [`DType`]: every torch dtype with its names in torch, legacy storages, safetensors and numpy.
//! - [`Buffer`]: owned (64-byte aligned) or memory-mapped bytes; clone and slice without copying;
//!   [`AlignedBytes`]: the owned memory, fresh huge pages for large tensors.
//! - [`Tensor`]: dtype, shape, strides, storage offset over a shared [`Buffer`].
//! - [`Composite`]: quantized, sparse and nested tensors, as named component tensors with a [`Layout`].
//! - [`Value`]: the Python object tree (dict vs OrderedDict, tuple vs list, `torch.Size`, unknown objects).
//! - [`flatten()`] / [`unflatten`]: `torch.distributed.checkpoint`'s key rules.
//! - [`CheckpointRead`]: what every format's reader offers (entries, tensors by name).
//! - [`TensorView`]: what every writer takes a tensor as (a dtype, a shape, bytes, as safetensors' `View`):
//!   any library's tensor reaches any ckpt writer through it ([`Tensor::from_view`], [`state_dict_of_views`]).
//! - [`cast_float`]: torch's float conversions, bit for bit.
//! - [`Error`] and [`Fault`]: the model's errors, and the fault class every ckpt error has.
//!
//! ```
//! use ckpt_tensor::{DType, Tensor};
//! let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! assert_eq!((t.dtype(), t.shape()), (DType::F32, &[2, 2][..]));
//! assert_eq!(t.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
//! # Ok::<(), ckpt_tensor::Error>(())
//! ```
//!
//! # Feature flags
//! - `tch`: convert [`Tensor`] to and from `tch::Tensor` (module `tch_interop`).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod aligned;
pub mod brief;
mod buffer;
pub mod cast;
mod checkpoint;
pub mod composite;
mod dtype;
mod error;
pub mod flatten;
mod layout;
#[cfg(feature = "tch")]
pub mod tch_interop;
pub mod tensor;
pub mod value;
mod view;

pub use aligned::AlignedBytes;
pub use brief::brief;
pub use buffer::Buffer;
pub use cast::cast_float;
pub use checkpoint::{CheckpointRead, CompositeInfo, Entry, EntryKind, TensorInfo, entry_kind};
pub use composite::Composite;
pub use dtype::{DType, StorageClass};
pub use error::error_chain;
pub use error::{Error, Fault, FormatError, Result};
pub use flatten::{FlatEntry, PathItem, flatten, leaves, unflatten};
pub use layout::Layout;
pub use tensor::{Element, Tensor, checked_numel};
pub use value::{Dict, DictKind, Numpy, Object, OpaqueTensorKind, Value, ValueShape};
pub use view::{TensorView, state_dict_of_views};
