//! Read and write `torch.save` files — the ZIP format of torch ≥ 1.6 and the legacy pickle stream —
//! byte-compatibly with PyTorch, without Python and without executing pickle code.
//!
//! Reading maps the file and hands out tensors that are windows of the map (zero copy); storages shared by
//! several tensors are read once. Writing reproduces `torch.save`'s exact layout for torch 2.13+ (record
//! order, 64-byte aligned data, data descriptors, zip64 end records, CRC-32) with a protocol-2 pickle that
//! `torch.load(weights_only=True)` accepts, streaming tensor bytes straight from memory. [`verify`] checks
//! every record's CRC-32 (torch never does).
//!
//! Open, read a tensor, save:
//!
//! ```
//! # let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/fixtures/torch/checkpoint.pt");
//! # let dir = tempfile::tempdir()?; let out = dir.path().join("copy.pt");
//! use ckpt_tensor::CheckpointRead;
//! let ck = ckpt_torch::TorchReader::open(&fixture)?;          // torch 2.13's file, memory-mapped
//! let w = ck.tensor("model.lin.weight")?;                               // a window of the map, no copy
//! ckpt_torch::save(ck.value(), &out, &ckpt_torch::WriteOptions::default())?; // torch.save's bytes
//! # assert_eq!(ckpt_torch::TorchReader::open(&out)?.tensor("model.lin.weight")?, w);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Views and their strides are kept:
//!
//! ```
//! use ckpt_tensor::{Tensor, Value};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("model.pt");
//! let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
//! let sd = Value::dict([("weight", Value::Tensor(w.transpose(0, 1).unwrap()))]);
//! ckpt_torch::save(&sd, &path, &ckpt_torch::WriteOptions::default()).unwrap();
//! let back = ckpt_torch::TorchReader::open(&path).unwrap();
//! let t = back.get("weight").unwrap().as_tensor().unwrap();
//! assert_eq!(t.strides(), &[1, 2]); // the view is kept
//! assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
//! ```
//!
//! # Safety on hostile input
//! Every length and offset read from a file is checked before use; the pickle decoder never executes code
//! and enforces [`ckpt_pickle::Limits`]; unknown classes become opaque [`ckpt_tensor::Value::Object`]s.
//! Quantized (per-tensor and per-channel affine), sparse (COO, CSR, CSC, BSR, BSC) and nested tensors come
//! back as [`ckpt_tensor::Value::Composite`] (their component tensors) and are written back in torch's form;
//! other tensors torch rebuilds by its own functions (meta, device and subclass tensors) as
//! [`ckpt_tensor::Value::OpaqueTensor`].

#![forbid(unsafe_code)]

mod composite;
pub mod detect;
mod error;
mod legacy;
mod module;
mod numpy;
pub mod package;
mod plain_pickle;
mod read;
mod read_options;
mod rebuild;
mod torchscript;
mod verify;
mod write;
pub mod zip;
mod zip_storages;

pub use ckpt_io::Durability;
pub use ckpt_io::{Problem, ProblemKind, SaveReport, VerifyReport};
pub use detect::{Container, detect};
pub use error::{Error, Result};
pub use module::{is_module, module_classes, module_state_dict};
pub use package::Package;
pub use read::{TorchReader, load};
pub use read_options::{DEFAULT_MAX_INFLATED_BYTES, ReadOptions};
pub use torchscript::Script;
pub use verify::verify;
pub use write::{WriteOptions, prefix_for_path, save, save_to_durable, save_to_writer};

/// Differential oracles for the fuzz targets (`cargo fuzz` builds with `--cfg fuzzing`); not API.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::read::templates_agree;
}
