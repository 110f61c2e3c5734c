//! Safe Python pickle decoder (protocols 0-5) and CPython-compatible encoder (protocols 2-5) for the `ckpt`
//! checkpoint library.
//!
//! # Decoding
//! [`decode`] / [`decode_with`] interpret a pickle into an inert [`Value`] tree. Nothing is ever imported or
//! called: classes and functions stay [`Value::Global`] names, calls stay [`Value::Object`] records, persistent
//! ids stay [`Value::PersistentId`]. Every opcode of protocols 0-5 is implemented, except the two features that
//! need external state (the copyreg extension registry, EXT1/2/4, and out-of-band buffers, NEXT_BUFFER /
//! READONLY_BUFFER), which fail with [`Error::Unsupported`]. The memo has reference semantics (a container
//! memoized before it is filled is seen filled by later GETs), and every resource a hostile input could inflate
//! is bounded by [`Limits`]: no recursion on file-controlled depth in the interpreter, every length checked
//! against the remaining input before allocation, memo bombs rejected before anything is copied, cycles
//! rejected with [`Error::Recursive`]. No input makes the decoder panic.
//!
//! # Encoding
//! [`Pickler`] is a low-level opcode writer that mirrors CPython's C pickler (opcode choice, memo numbering,
//! protocol-4 framing), so a caller can reproduce `torch.save`'s `data.pkl` byte for byte. [`encode`] /
//! [`encode_with`] write any [`Value`] the way CPython's `pickle.dumps` writes the equivalent Python object.
//!
//! ```
//! use ckpt_pickle::{decode, encode, Value};
//! let v = Value::Dict(vec![(Value::str("w"), Value::List(vec![Value::Int(1), Value::Float(2.5)]))]);
//! let bytes = encode(&v, 2)?;
//! assert_eq!(decode(&bytes)?, v);
//! # Ok::<(), ckpt_pickle::Error>(())
//! ```

mod bigint;
mod decode;
mod encode;
mod error;
mod limits;
pub mod opcode;
mod pickler;
mod text;
mod value;

pub use decode::{decode, decode_with};
pub use encode::{EncodeOptions, Sharing, encode, encode_into, encode_with};
pub use error::{Error, ErrorKind};
pub use limits::Limits;
pub use pickler::Pickler;
pub use value::{Object, ObjectKind, Value, normalize_global};
