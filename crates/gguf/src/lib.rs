//! GGUF files, the format of llama.cpp and ggml (written by gguf-py's `GGUFWriter` and llama.cpp), for ckpt:
//! the header, every metadata value and tensor read zero-copy over a memory map, and ggml's quantized blocks
//! dequantized to f32 bit for bit as gguf-py's `gguf.quants.dequantize`.
//!
//! - [`Reader`]: [`Reader::open`] maps a file and checks its whole header ([`header`]) before any tensor is
//!   handed out: every count against the bytes left, every tensor's type, shape, offset, alignment and extent,
//!   no overlaps, no name or key twice.
//! - [`metadata`]: the key-value pairs, every GGUF value type (nested arrays included).
//! - [`Reader`] is a [`ckpt_tensor::CheckpointRead`]: the metadata as values ([`python_value`]), the tensors
//!   under their names.
//! - [`GgmlType`]: the ggml types, their codes and blocks.
//! - [`dequantize()`]: blocks to f32 for F32, F16, BF16, F64, I8 to I64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to
//!   Q6_K, TQ1_0, TQ2_0, MXFP4 and NVFP4. The IQ types, Q8_1, Q8_K and Q1_0 are not dequantized yet
//!   ([`GgufError::NotDequantized`]); their raw blocks read ([`Reader::raw`]).
//!
//! - [`save`]: a GGUF v3 file written streaming and durably, float tensors quantized ([`quantize()`]) to F32,
//!   F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or MXFP4 bit for bit as gguf-py's `gguf.quants.quantize`.
//!
//! # Shapes
//!
//! GGUF stores a tensor's dimensions innermost first (`ne[0]` is the length of a row, [`TensorInfo::dims`]).
//! ckpt shows the logical shape in torch order, the reverse ([`TensorInfo::shape`]): `ne = [4096, 32000]` is
//! shape `[32000, 4096]`, as gguf-py's numpy arrays and transformers have it.
//!
//! # Limitations
//!
//! Little-endian files only (a big-endian file is refused, [`GgufError::BigEndian`]); versions 2 and 3.

#![forbid(unsafe_code)]

mod checkpoint;
mod cursor;
pub mod dequantize;
mod error;
mod ggml_type;
pub mod header;
pub mod metadata;
pub mod quantize;
mod reader;
pub mod writer;

pub use checkpoint::python_value;
pub use dequantize::dequantize;
pub use error::GgufError;
pub use ggml_type::GgmlType;
pub use header::{DEFAULT_ALIGNMENT, Header, MAX_DIMS, TensorInfo};
pub use metadata::{MAX_ARRAY_DEPTH, MetadataValue, ValueType, summarize};
pub use quantize::quantize;
pub use reader::Reader;
pub use writer::{WriteOptions, save};
