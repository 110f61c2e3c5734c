//! The error type of the decoder and the encoder.

/// Errors from [`decode`](crate::decode) / [`decode_with`](crate::decode_with) and from the encoder.
///
/// Decoding errors carry `offset`, the byte position in the input of the opcode (or argument byte) where the
/// problem was found. Encoding errors that are not I/O carry what could not be encoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input ended inside an opcode's argument (or a FRAME claims more bytes than remain).
    #[error("pickle data truncated at offset {offset}: {needed} more byte(s) needed")]
    UnexpectedEof {
        /// Where the missing bytes should have started.
        offset: usize,
        /// How many more bytes the argument needs (saturated; may be far more than any real file).
        needed: u64,
    },
    /// A byte that is not a pickle opcode (protocols 0-5).
    #[error("unknown pickle opcode 0x{opcode:02x} at offset {offset}")]
    UnknownOpcode {
        /// Offset of the byte.
        offset: usize,
        /// The byte.
        opcode: u8,
    },
    /// An opcode needed more stack items (above the innermost MARK) than there were.
    #[error("pickle stack underflow: {opcode} at offset {offset}")]
    StackUnderflow {
        /// Offset of the opcode.
        offset: usize,
        /// Its `pickletools` name.
        opcode: &'static str,
    },
    /// An opcode that pops to the innermost MARK (APPENDS, TUPLE, POP_MARK, ...) found no MARK.
    #[error("{opcode} at offset {offset} found no MARK")]
    MarkNotFound {
        /// Offset of the opcode.
        offset: usize,
        /// Its `pickletools` name.
        opcode: &'static str,
    },
    /// A GET/BINGET/LONG_BINGET of a memo key that was never PUT.
    #[error("memo key {key} not found (offset {offset})")]
    MemoMissing {
        /// Offset of the opcode.
        offset: usize,
        /// The key.
        key: u64,
    },
    /// A resource limit from [`Limits`](crate::Limits) was exceeded.
    #[error("pickle limit exceeded at offset {offset}: {what} exceeds {limit}")]
    Limit {
        /// Which limit (`"nodes"`, `"memo entries"`, `"payload bytes"`, ...).
        what: &'static str,
        /// The configured value.
        limit: u64,
        /// Offset of the opcode that crossed it (for limits checked when the result is built: the STOP).
        offset: usize,
    },
    /// Nesting deeper than [`Limits::max_depth`](crate::Limits::max_depth) (materialised value) or
    /// [`Limits::max_mark_depth`](crate::Limits::max_mark_depth) (open MARKs), or, when encoding, deeper than
    /// the encoder's depth limit.
    #[error("nesting deeper than {limit} (offset {offset})")]
    DepthExceeded {
        /// The configured limit.
        limit: usize,
        /// Offset of the opcode (MARK, or STOP for the materialised value); output position when encoding.
        offset: usize,
    },
    /// A string argument is not valid UTF-8 (this includes UTF-8-encoded lone surrogates, which CPython writes
    /// with `surrogatepass`), or a protocol-0 `\u` escape names a surrogate.
    #[error("invalid UTF-8 / non-scalar code point in pickle string at offset {offset}")]
    InvalidUtf8 {
        /// Offset of the first offending byte.
        offset: usize,
    },
    /// A Python 2 `str` (STRING, BINSTRING, SHORT_BINSTRING) that is not valid in the encoding the reader was
    /// asked to decode it with ([`Py2Strings`](crate::Py2Strings)); `Py2Strings::Latin1` or `Bytes` read it.
    #[error("Python 2 string at offset {offset} is not valid {encoding} (read it as latin1 or bytes)")]
    Py2String {
        /// Offset of the first offending byte (of the opcode, for a protocol-0 STRING).
        offset: usize,
        /// The encoding, as Python names it.
        encoding: &'static str,
    },
    /// A protocol-0 text argument (INT, LONG, FLOAT, STRING, UNICODE, GET, PUT, GLOBAL, PERSID) is malformed.
    #[error("bad text argument at offset {offset}: {what}")]
    BadText {
        /// Offset of the opcode.
        offset: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// A valid pickle feature this crate deliberately does not support (extension registry, out-of-band
    /// buffers, protocol > 5).
    #[error("unsupported pickle feature at offset {offset}: {what}")]
    Unsupported {
        /// Offset of the opcode.
        offset: usize,
        /// What it was.
        what: &'static str,
    },
    /// An opcode applied to an operand of the wrong kind (APPEND to a tuple, STACK_GLOBAL of non-strings, ...).
    #[error("{opcode} at offset {offset}: expected {expected}")]
    BadOperand {
        /// Offset of the opcode.
        offset: usize,
        /// Its `pickletools` name.
        opcode: &'static str,
        /// What it needed.
        expected: &'static str,
    },
    /// A structurally invalid argument (negative length, odd SETITEMS item count, ...).
    #[error("malformed pickle at offset {offset}: {what}")]
    Malformed {
        /// Offset of the opcode.
        offset: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// STOP was reached with MARKs still open.
    #[error("STOP at offset {offset} with {marks} unclosed MARK(s)")]
    TrailingMark {
        /// Offset of the STOP.
        offset: usize,
        /// How many MARKs were open.
        marks: usize,
    },
    /// The input ended between opcodes without a STOP.
    #[error("pickle data ended at offset {offset} without STOP")]
    NoStop {
        /// The input length.
        offset: usize,
    },
    /// The encoder was asked for something the chosen protocol (or pickle itself) cannot express.
    #[error("cannot encode with pickle protocol {protocol}: {what}")]
    Unencodable {
        /// What could not be encoded.
        what: &'static str,
        /// The protocol in use.
        protocol: u8,
    },
    /// The encoder's writer failed.
    #[error("I/O error while writing pickle: {0}")]
    Io(#[from] std::io::Error),
}

/// Coarse classification of an [`Error`], for mapping onto a caller's error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The input is not a valid pickle.
    Malformed,
    /// The input is a valid pickle using something this crate does not support.
    Unsupported,
    /// A configured resource limit was hit.
    Limit,
    /// The caller asked the encoder for something impossible.
    InvalidArgument,
    /// The writer failed.
    Io,
}

impl Error {
    /// Which broad class this error belongs to.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Limit { .. } | Error::DepthExceeded { .. } => ErrorKind::Limit,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::Unencodable { .. } => ErrorKind::InvalidArgument,
            Error::Io(_) => ErrorKind::Io,
            Error::UnexpectedEof { .. }
            | Error::UnknownOpcode { .. }
            | Error::StackUnderflow { .. }
            | Error::MarkNotFound { .. }
            | Error::MemoMissing { .. }
            | Error::InvalidUtf8 { .. }
            | Error::Py2String { .. }
            | Error::BadText { .. }
            | Error::BadOperand { .. }
            | Error::Malformed { .. }
            | Error::TrailingMark { .. }
            | Error::NoStop { .. } => ErrorKind::Malformed,
        }
    }
}
