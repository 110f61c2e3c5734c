//! Safe Python pickle machine (protocols 0-5) with pluggable builders, and a CPython-compatible encoder
//! (protocols 2-5), for reading and writing the pickles inside PyTorch checkpoints (`torch.save`'s
//! `data.pkl`, DCP `.metadata`).
//!
//! # Decoding
//! One interpreter, [`run`], reads the opcodes and hands every object it makes to a [`Builder`], which
//! decides what the object becomes, in the spirit of serde's `Visitor`: the general [`ValueBuilder`] makes
//! an inert [`Value`] tree ([`decode`] / [`decode_with`] run it); [`GraphBuilder`] makes an arena [`Graph`]
//! with one node per object; a format crate plugs in its own builder (torch's rebuild rules, DCP's metadata
//! tables) and never sees an opcode. Nothing is ever imported or called: classes and functions stay
//! [`Value::Global`] names (exactly as written; [`normalize_global`] maps Python 2 names such as
//! `__builtin__.set`), calls stay [`Value::Object`] records with the APPEND/SETITEM/BUILD operations applied
//! to them, persistent ids stay [`Value::PersistentId`]. Python 2 `str` (STRING, BINSTRING,
//! SHORT_BINSTRING) is decoded as [`Py2Strings`] says: as text, UTF-8 by default, like `torch.load`.
//! [`Value::desugar`] turns the REDUCE forms CPython uses for `bytes`, `bytearray`, `set` and `frozenset` at
//! older protocols back into those variants.
//!
//! The memo has Python's reference semantics: an object shared through it, mutated after it was shared, or
//! made to refer to itself (a parent link, a cache) is one object. A [`Value`] keeps that identity with
//! [`Value::Shared`] and [`Value::Ref`]; see the [`Value`] docs. Builders declare
//! [`Template`]s for objects they expect many times, which the machine reads straight from the bytes.
//!
//! Every opcode of protocols 0-5 is implemented, except the two features that need state from outside the
//! pickle (the copyreg extension registry: EXT1/EXT2/EXT4; out-of-band buffers: NEXT_BUFFER/READONLY_BUFFER),
//! which fail with [`Error::Unsupported`].
//!
//! # Security
//! The machine is meant for untrusted files. It never panics on any input, never recurses on file-controlled
//! depth, checks every length against the remaining input before allocating, and bounds everything a hostile
//! file could inflate with [`Limits`] (depth, open MARKs, memo size, container length, node count, payload
//! bytes, decimal digits). Memo bombs (exponential sharing) are measured as they are built and refused at the
//! opcode that crosses a limit, before anything is copied.
//!
//! # Encoding
//! [`Pickler`] is a low-level opcode writer that mirrors CPython's C pickler (opcode choice, memo numbering,
//! protocol-4 framing), so a caller issuing the same operations as CPython's `save()` reproduces its output
//! byte for byte (e.g. `torch.save`'s `data.pkl`). [`encode`] / [`encode_with`] / [`encode_into`] write a whole
//! [`Value`] the way `pickle.dumps` writes the equivalent Python object, shared objects and cycles included;
//! [`Sharing`] chooses which other equal values are written once. `decode(&encode(v, p)?)?.desugar() == v`
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

#![forbid(unsafe_code)]

mod bigint;
mod builder;
mod builders;
mod encode;
mod error;
mod limits;
mod machine;
pub mod opcode;
mod pickler;
mod shelf;
mod template;
mod text;
mod tree;
mod value;

pub use builder::{Builder, Call, CallKind, Items, Pairs, Sequence};
pub use builders::{Graph, GraphBuilder, Item, Node, ValueBuilder};
pub use encode::{EncodeOptions, Sharing, encode, encode_into, encode_with};
pub use error::{Error, ErrorKind};
pub use limits::Limits;
pub use machine::{Options, Py2Strings, run};
pub use pickler::Pickler;
pub use shelf::{Shelf, Tree};
pub use template::{Capture, Captures, Ints, Pattern, Template};
pub use value::{Object, ObjectKind, Value, normalize_global};

/// Decodes one pickle into a [`Value`] with [`Limits::default`] (Python 2 strings as UTF-8 text). Bytes after
/// the STOP opcode are ignored (use [`decode_with`] to learn where the pickle ended).
///
/// # Errors
/// Any [`Error`] describing malformed input, unsupported features or exceeded limits.
pub fn decode(data: &[u8]) -> Result<Value, Error> {
    decode_with(data, &Limits::default()).map(|(v, _)| v)
}

/// Decodes one pickle from the start of `data` under `limits`; returns the value and the number of bytes
/// consumed (the position just after STOP), so that concatenated pickles (the legacy torch format) can be read
/// one after another.
///
/// # Errors
/// Any [`Error`] describing malformed input, unsupported features or exceeded limits.
pub fn decode_with(data: &[u8], limits: &Limits) -> Result<(Value, usize), Error> {
    decode_options(data, &Options::from(*limits))
}

/// [`decode_with`] under `options` (limits, and how Python 2 strings are read).
///
/// # Errors
/// Any [`Error`] describing malformed input, unsupported features or exceeded limits.
pub fn decode_options(data: &[u8], options: &Options) -> Result<(Value, usize), Error> {
    let mut builder = ValueBuilder::with_max_depth(options.limits.max_depth);
    let (root, end) = run(data, options, &mut builder)?;
    Ok((builder.finish_at(root, end)?, end))
}
