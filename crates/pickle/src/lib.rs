//! Safe Python pickle decoder (protocols 0-5) and CPython-compatible encoder (protocols 2-5), for reading and
//! writing the pickles inside PyTorch checkpoints (`torch.save`'s `data.pkl`, DCP `.metadata`).
//!
//! # Decoding
//! [`decode`] / [`decode_with`] interpret a pickle into an inert [`Value`] tree. Nothing is ever imported or
//! called: classes and functions stay [`Value::Global`] names (exactly as written; [`normalize_global`] maps
//! Python 2 names such as `__builtin__.set`), calls stay [`Value::Object`] records with the APPEND/SETITEM/BUILD
//! operations applied to them, persistent ids stay [`Value::PersistentId`]. Python 2 `str` (STRING, BINSTRING,
//! SHORT_BINSTRING) is kept as [`Value::Bytes`]. [`Value::desugar`] turns the REDUCE forms CPython uses for
//! `bytes`, `bytearray`, `set` and `frozenset` at older protocols back into those variants.
//!
//! Every opcode of protocols 0-5 is implemented, except the two features that need state from outside the
//! pickle (the copyreg extension registry: EXT1/EXT2/EXT4; out-of-band buffers: NEXT_BUFFER/READONLY_BUFFER),
//! which fail with [`Error::Unsupported`]. The memo has reference semantics (a container memoized before it is
//! filled is seen filled by later GETs). Self-referential structures fail with [`Error::Recursive`].
//!
//! [`build::build`] runs the same opcodes in a single pass and hands every object to a [`build::Builder`], so
//! a consumer that knows the classes it expects (a DCP `.metadata`, a `torch.save` `data.pkl`) builds its own
//! compact structs directly, without a [`Value`] tree of the whole pickle; it declines the rare inputs that
//! need the full decoder (which [`decode_with`] then runs, and which it runs itself first with a builder of
//! [`Value`]s).
//!
//! # Security
//! The decoder is meant for untrusted files. It never panics on any input, never recurses on file-controlled
//! depth, checks every length against the remaining input before allocating, and bounds everything a hostile
//! file could inflate with [`Limits`] (depth, open MARKs, memo size, container length, node count, payload
//! bytes, decimal digits). Memo bombs (exponential sharing) are measured on the shared graph and rejected
//! before anything is copied.
//!
//! # Encoding
//! [`Pickler`] is a low-level opcode writer that mirrors CPython's C pickler (opcode choice, memo numbering,
//! protocol-4 framing), so a caller issuing the same operations as CPython's `save()` reproduces its output
//! byte for byte (e.g. `torch.save`'s `data.pkl`). [`encode`] / [`encode_with`] / [`encode_into`] write a whole
//! [`Value`] the way `pickle.dumps` writes the equivalent Python object; since a `Value` carries no object
//! identity, [`Sharing`] chooses which equal values are written once. `decode(&encode(v, p)?)?.desugar() == v`
//! for every value and protocol.
//!
//! ```
//! use ckpt_pickle::{decode, encode, Value};
//! let v = Value::Dict(vec![(Value::str("w"), Value::List(vec![Value::Int(1), Value::Float(2.5)]))]);
//! let bytes = encode(&v, 2)?;
//! assert_eq!(bytes[..2], [0x80, 2]);
//! assert_eq!(decode(&bytes)?, v);
//! # Ok::<(), ckpt_pickle::Error>(())
//! ```

mod bigint;
pub mod build;
mod decode;
mod encode;
mod error;
mod limits;
pub mod opcode;
mod pickler;
mod text;
mod tree;
mod value;

pub use decode::{decode, decode_graph, decode_with};
pub use encode::{EncodeOptions, Sharing, encode, encode_into, encode_with};
pub use error::{Error, ErrorKind};
pub use limits::Limits;
pub use pickler::Pickler;
pub use value::{Object, ObjectKind, Value, normalize_global};
