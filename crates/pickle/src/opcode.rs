//! Pickle opcode bytes (protocols 0-5), named as in CPython's `pickle.py` / `pickletools`.

#![allow(missing_docs)] // The names are the documentation; see `pickletools` for each opcode.

use crate::error::Error;

// Protocol 0 and 1.
pub const MARK: u8 = b'(';
pub const STOP: u8 = b'.';
pub const POP: u8 = b'0';
pub const POP_MARK: u8 = b'1';
pub const DUP: u8 = b'2';
pub const FLOAT: u8 = b'F';
pub const INT: u8 = b'I';
pub const BININT: u8 = b'J';
pub const BININT1: u8 = b'K';
pub const LONG: u8 = b'L';
pub const BININT2: u8 = b'M';
pub const NONE: u8 = b'N';
pub const PERSID: u8 = b'P';
pub const BINPERSID: u8 = b'Q';
pub const REDUCE: u8 = b'R';
pub const STRING: u8 = b'S';
pub const BINSTRING: u8 = b'T';
pub const SHORT_BINSTRING: u8 = b'U';
pub const UNICODE: u8 = b'V';
pub const BINUNICODE: u8 = b'X';
pub const APPEND: u8 = b'a';
pub const BUILD: u8 = b'b';
pub const GLOBAL: u8 = b'c';
pub const DICT: u8 = b'd';
pub const EMPTY_DICT: u8 = b'}';
pub const APPENDS: u8 = b'e';
pub const GET: u8 = b'g';
pub const BINGET: u8 = b'h';
pub const INST: u8 = b'i';
pub const LONG_BINGET: u8 = b'j';
pub const LIST: u8 = b'l';
pub const EMPTY_LIST: u8 = b']';
pub const OBJ: u8 = b'o';
pub const PUT: u8 = b'p';
pub const BINPUT: u8 = b'q';
pub const LONG_BINPUT: u8 = b'r';
pub const SETITEM: u8 = b's';
pub const TUPLE: u8 = b't';
pub const EMPTY_TUPLE: u8 = b')';
pub const SETITEMS: u8 = b'u';
pub const BINFLOAT: u8 = b'G';

// Protocol 2.
pub const PROTO: u8 = 0x80;
pub const NEWOBJ: u8 = 0x81;
pub const EXT1: u8 = 0x82;
pub const EXT2: u8 = 0x83;
pub const EXT4: u8 = 0x84;
pub const TUPLE1: u8 = 0x85;
pub const TUPLE2: u8 = 0x86;
pub const TUPLE3: u8 = 0x87;
pub const NEWTRUE: u8 = 0x88;
pub const NEWFALSE: u8 = 0x89;
pub const LONG1: u8 = 0x8a;
pub const LONG4: u8 = 0x8b;

// Protocol 3.
pub const BINBYTES: u8 = b'B';
pub const SHORT_BINBYTES: u8 = b'C';

// Protocol 4.
pub const SHORT_BINUNICODE: u8 = 0x8c;
pub const BINUNICODE8: u8 = 0x8d;
pub const BINBYTES8: u8 = 0x8e;
pub const EMPTY_SET: u8 = 0x8f;
pub const ADDITEMS: u8 = 0x90;
pub const FROZENSET: u8 = 0x91;
pub const NEWOBJ_EX: u8 = 0x92;
pub const STACK_GLOBAL: u8 = 0x93;
pub const MEMOIZE: u8 = 0x94;
pub const FRAME: u8 = 0x95;

// Protocol 5.
pub const BYTEARRAY8: u8 = 0x96;
pub const NEXT_BUFFER: u8 = 0x97;
pub const READONLY_BUFFER: u8 = 0x98;

/// The highest protocol this crate decodes (and CPython 3.8+ writes).
pub const HIGHEST_PROTOCOL: u8 = 5;

/// The `pickletools` name of an opcode byte, or `None` for a byte that is not an opcode.
#[must_use]
pub fn name(op: u8) -> Option<&'static str> {
    Some(match op {
        MARK => "MARK",
        STOP => "STOP",
        POP => "POP",
        POP_MARK => "POP_MARK",
        DUP => "DUP",
        FLOAT => "FLOAT",
        INT => "INT",
        BININT => "BININT",
        BININT1 => "BININT1",
        LONG => "LONG",
        BININT2 => "BININT2",
        NONE => "NONE",
        PERSID => "PERSID",
        BINPERSID => "BINPERSID",
        REDUCE => "REDUCE",
        STRING => "STRING",
        BINSTRING => "BINSTRING",
        SHORT_BINSTRING => "SHORT_BINSTRING",
        UNICODE => "UNICODE",
        BINUNICODE => "BINUNICODE",
        APPEND => "APPEND",
        BUILD => "BUILD",
        GLOBAL => "GLOBAL",
        DICT => "DICT",
        EMPTY_DICT => "EMPTY_DICT",
        APPENDS => "APPENDS",
        GET => "GET",
        BINGET => "BINGET",
        INST => "INST",
        LONG_BINGET => "LONG_BINGET",
        LIST => "LIST",
        EMPTY_LIST => "EMPTY_LIST",
        OBJ => "OBJ",
        PUT => "PUT",
        BINPUT => "BINPUT",
        LONG_BINPUT => "LONG_BINPUT",
        SETITEM => "SETITEM",
        TUPLE => "TUPLE",
        EMPTY_TUPLE => "EMPTY_TUPLE",
        SETITEMS => "SETITEMS",
        BINFLOAT => "BINFLOAT",
        PROTO => "PROTO",
        NEWOBJ => "NEWOBJ",
        EXT1 => "EXT1",
        EXT2 => "EXT2",
        EXT4 => "EXT4",
        TUPLE1 => "TUPLE1",
        TUPLE2 => "TUPLE2",
        TUPLE3 => "TUPLE3",
        NEWTRUE => "NEWTRUE",
        NEWFALSE => "NEWFALSE",
        LONG1 => "LONG1",
        LONG4 => "LONG4",
        BINBYTES => "BINBYTES",
        SHORT_BINBYTES => "SHORT_BINBYTES",
        SHORT_BINUNICODE => "SHORT_BINUNICODE",
        BINUNICODE8 => "BINUNICODE8",
        BINBYTES8 => "BINBYTES8",
        EMPTY_SET => "EMPTY_SET",
        ADDITEMS => "ADDITEMS",
        FROZENSET => "FROZENSET",
        NEWOBJ_EX => "NEWOBJ_EX",
        STACK_GLOBAL => "STACK_GLOBAL",
        MEMOIZE => "MEMOIZE",
        FRAME => "FRAME",
        BYTEARRAY8 => "BYTEARRAY8",
        NEXT_BUFFER => "NEXT_BUFFER",
        READONLY_BUFFER => "READONLY_BUFFER",
        _ => return None,
    })
}

/// The opcodes torch's `weights_only` unpickler implements (torch-save spec §6.2); a protocol-2 file that uses
/// only these (and only allowlisted globals) loads with `torch.load(weights_only=True)`.
pub const WEIGHTS_ONLY_OPCODES: &[u8] = &[
    PROTO,
    STOP,
    GLOBAL,
    NEWOBJ,
    REDUCE,
    BUILD,
    APPEND,
    APPENDS,
    SETITEM,
    SETITEMS,
    MARK,
    TUPLE,
    TUPLE1,
    TUPLE2,
    TUPLE3,
    NONE,
    NEWFALSE,
    NEWTRUE,
    EMPTY_TUPLE,
    EMPTY_LIST,
    EMPTY_DICT,
    EMPTY_SET,
    BININT,
    BININT1,
    BININT2,
    BINFLOAT,
    BINUNICODE,
    SHORT_BINSTRING,
    BINPERSID,
    BINGET,
    LONG_BINGET,
    BINPUT,
    LONG_BINPUT,
    LONG1,
];

/// Walks the opcodes of the pickle at the start of `data` up to and including STOP, without interpreting them
/// (like `pickletools.genops`), and returns each opcode with its offset. Useful for checking which opcodes a
/// pickle uses (e.g. against [`WEIGHTS_ONLY_OPCODES`]).
///
/// # Errors
/// [`Error::UnknownOpcode`], [`Error::UnexpectedEof`], [`Error::Malformed`] (negative length),
/// [`Error::NoStop`].
pub fn scan(data: &[u8]) -> Result<Vec<(usize, u8)>, Error> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    let eof = |offset: usize, needed: u64| Error::UnexpectedEof { offset, needed };
    let skip = |pos: usize, n: u64| -> Result<usize, Error> {
        let remaining = (data.len() - pos.min(data.len())) as u64;
        if n > remaining {
            return Err(eof(pos, n - remaining));
        }
        Ok(pos + n as usize)
    };
    let le = |pos: usize, n: usize| -> Result<u64, Error> {
        let b = data.get(pos..pos + n).ok_or_else(|| eof(pos, n as u64))?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    };
    let line = |pos: usize| -> Result<usize, Error> {
        let rest = data.get(pos..).unwrap_or(&[]);
        rest.iter().position(|&b| b == b'\n').map(|i| pos + i + 1).ok_or_else(|| eof(data.len(), 1))
    };
    loop {
        let at = pos;
        let Some(&code) = data.get(pos) else {
            return Err(Error::NoStop { offset: data.len() });
        };
        if name(code).is_none() {
            return Err(Error::UnknownOpcode { offset: at, opcode: code });
        }
        out.push((at, code));
        pos += 1;
        pos = match code {
            STOP => return Ok(out),
            FLOAT | INT | LONG | PERSID | STRING | UNICODE | GET | PUT => line(pos)?,
            GLOBAL | INST => line(line(pos)?)?,
            BININT1 | BINGET | BINPUT | PROTO | EXT1 => skip(pos, 1)?,
            BININT2 | EXT2 => skip(pos, 2)?,
            BININT | LONG_BINGET | LONG_BINPUT | EXT4 => skip(pos, 4)?,
            BINFLOAT | FRAME => skip(pos, 8)?,
            LONG1 | SHORT_BINSTRING | SHORT_BINUNICODE | SHORT_BINBYTES => skip(pos + 1, le(pos, 1)?)?,
            BINUNICODE | BINBYTES => skip(pos + 4, le(pos, 4)?)?,
            LONG4 | BINSTRING => {
                // A signed 32-bit length: the top bit set means negative.
                let n = le(pos, 4)?;
                if n > i32::MAX as u64 {
                    return Err(Error::Malformed { offset: at, what: "negative length" });
                }
                skip(pos + 4, n)?
            }
            BINUNICODE8 | BINBYTES8 | BYTEARRAY8 => skip(pos + 8, le(pos, 8)?)?,
            _ => pos,
        };
    }
}

/// How an opcode's argument is laid out: what a scan of the opcode stream (like `pickletools.genops`) skips
/// after each opcode byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argument {
    /// Not an opcode of protocols 0-5.
    Invalid,
    /// STOP: the end of the pickle.
    Stop,
    /// No argument, or a fixed number of bytes.
    Fixed(u8),
    /// One or two `\n`-terminated lines.
    Lines(u8),
    /// A little-endian unsigned length of this many bytes, then that many bytes.
    Counted(u8),
    /// A signed 4-byte length (negative is malformed), then that many bytes.
    SignedCounted,
    /// BINGET / LONG_BINGET: the key in this many bytes.
    Get(u8),
    /// GET: the key as a decimal line.
    GetLine,
}

/// [`Argument`] of every byte.
pub(crate) static ARGUMENTS: [Argument; 256] = {
    let mut t = [Argument::Invalid; 256];
    let none = [
        MARK,
        POP,
        POP_MARK,
        DUP,
        NONE,
        BINPERSID,
        REDUCE,
        APPEND,
        BUILD,
        DICT,
        EMPTY_DICT,
        APPENDS,
        LIST,
        EMPTY_LIST,
        OBJ,
        SETITEM,
        TUPLE,
        EMPTY_TUPLE,
        SETITEMS,
        NEWOBJ,
        TUPLE1,
        TUPLE2,
        TUPLE3,
        NEWTRUE,
        NEWFALSE,
        EMPTY_SET,
        ADDITEMS,
        FROZENSET,
        NEWOBJ_EX,
        STACK_GLOBAL,
        MEMOIZE,
        NEXT_BUFFER,
        READONLY_BUFFER,
    ];
    let mut i = 0;
    while i < none.len() {
        t[none[i] as usize] = Argument::Fixed(0);
        i += 1;
    }
    t[STOP as usize] = Argument::Stop;
    t[BININT1 as usize] = Argument::Fixed(1);
    t[BINPUT as usize] = Argument::Fixed(1);
    t[PROTO as usize] = Argument::Fixed(1);
    t[EXT1 as usize] = Argument::Fixed(1);
    t[BININT2 as usize] = Argument::Fixed(2);
    t[EXT2 as usize] = Argument::Fixed(2);
    t[BININT as usize] = Argument::Fixed(4);
    t[LONG_BINPUT as usize] = Argument::Fixed(4);
    t[EXT4 as usize] = Argument::Fixed(4);
    t[BINFLOAT as usize] = Argument::Fixed(8);
    t[FRAME as usize] = Argument::Fixed(8);
    let line = [FLOAT, INT, LONG, PERSID, STRING, UNICODE, PUT];
    let mut i = 0;
    while i < line.len() {
        t[line[i] as usize] = Argument::Lines(1);
        i += 1;
    }
    t[GLOBAL as usize] = Argument::Lines(2);
    t[INST as usize] = Argument::Lines(2);
    t[LONG1 as usize] = Argument::Counted(1);
    t[SHORT_BINSTRING as usize] = Argument::Counted(1);
    t[SHORT_BINUNICODE as usize] = Argument::Counted(1);
    t[SHORT_BINBYTES as usize] = Argument::Counted(1);
    t[BINUNICODE as usize] = Argument::Counted(4);
    t[BINBYTES as usize] = Argument::Counted(4);
    t[BINUNICODE8 as usize] = Argument::Counted(8);
    t[BINBYTES8 as usize] = Argument::Counted(8);
    t[BYTEARRAY8 as usize] = Argument::Counted(8);
    t[LONG4 as usize] = Argument::SignedCounted;
    t[BINSTRING as usize] = Argument::SignedCounted;
    t[BINGET as usize] = Argument::Get(1);
    t[LONG_BINGET as usize] = Argument::Get(4);
    t[GET as usize] = Argument::GetLine;
    t
};

/// How opcode `code`'s argument is laid out ([`Argument::Invalid`] for a byte that is no opcode of
/// protocols 0-5).
///
/// ```
/// use ckpt_pickle::opcode::{argument, Argument, BINGET, SHORT_BINUNICODE};
/// assert_eq!(argument(BINGET), Argument::Get(1));
/// assert_eq!(argument(SHORT_BINUNICODE), Argument::Counted(1));
/// ```
#[inline]
pub fn argument(code: u8) -> Argument {
    ARGUMENTS[code as usize]
}

/// The little-endian unsigned integer of the `n` bytes (1, 2, 4 or 8; others up to 8 are read too) at
/// `pos`: an opcode's length or key argument. `None` when the data ends first.
///
/// ```
/// assert_eq!(ckpt_pickle::opcode::le_at(&[0x68, 0x34, 0x12], 1, 2), Some(0x1234));
/// ```
#[inline]
pub fn le_at(data: &[u8], pos: usize, n: usize) -> Option<u64> {
    let b = data.get(pos..pos.checked_add(n)?)?;
    Some(match *b {
        [a] => u64::from(a),
        [a, b] => u64::from(u16::from_le_bytes([a, b])),
        [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
        [a, b, c, d, e, f, g, h] => u64::from_le_bytes([a, b, c, d, e, f, g, h]),
        _ if n <= 8 => b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn scan_lists_opcodes() {
        let ops = super::scan(b"\x80\x02]q\x00(K\x01X\x01\x00\x00\x00ae.rest").unwrap();
        let codes: Vec<u8> = ops.iter().map(|&(_, c)| c).collect();
        assert_eq!(codes, vec![PROTO, EMPTY_LIST, BINPUT, MARK, BININT1, BINUNICODE, APPENDS, STOP]);
        assert_eq!(ops.last().unwrap().0, 15);
        assert!(matches!(super::scan(b"X\xff\xff\xff\xff"), Err(Error::UnexpectedEof { .. })));
        assert!(matches!(super::scan(b"\xff"), Err(Error::UnknownOpcode { opcode: 0xff, .. })));
        assert!(matches!(super::scan(b"N"), Err(Error::NoStop { .. })));
        assert!(matches!(super::scan(b"\x8b\xff\xff\xff\xff."), Err(Error::Malformed { .. })));
    }

    #[test]
    fn names_cover_all_68_opcodes() {
        let n = (0u8..=255).filter(|&b| super::name(b).is_some()).count();
        assert_eq!(n, 68);
    }
}
