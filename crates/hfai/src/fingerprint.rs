//! A part file's identity, its length and the CRC-32 of its tail: what a rank reports of the part it wrote or
//! read, and what rank 0 checks the staged files against ([`crate::commit`]).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{Error, Result};

/// Bytes at the end of a part that the fingerprint covers: the ZIP end records and the end of the
/// central directory, whose entries carry every record's CRC-32 (the last one is `.data/serialization_id`,
/// itself derived from all records' CRCs).
pub(crate) const TAIL: u64 = 64 * 1024;

/// Identity of a part file: its length and the CRC-32 of its tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    /// The file's length in bytes.
    pub(crate) len: u64,
    /// The CRC-32 of its last [`TAIL`] bytes.
    pub(crate) tail_crc: u32,
}

impl Fingerprint {
    pub(crate) fn of_bytes(bytes: &[u8]) -> Self {
        let len = bytes.len() as u64;
        let tail = bytes.get(bytes.len().saturating_sub(TAIL as usize)..).unwrap_or_default();
        Fingerprint { len, tail_crc: crc32fast::hash(tail) }
    }

    pub(crate) fn of_file(path: &Path) -> Result<Self> {
        let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        let start = len.saturating_sub(TAIL);
        f.seek(SeekFrom::Start(start)).map_err(|e| Error::io(path, e))?;
        let mut tail = Vec::new();
        f.take(TAIL).read_to_end(&mut tail).map_err(|e| Error::io(path, e))?;
        if tail.len() as u64 != len - start {
            return Err(Error::io(path, std::io::ErrorKind::UnexpectedEof.into()));
        }
        Ok(Fingerprint { len, tail_crc: crc32fast::hash(&tail) })
    }

    pub(crate) fn encode(&self) -> String {
        format!("{}:{}", self.len, self.tail_crc)
    }

    pub(crate) fn decode(s: &str) -> Option<Self> {
        let (len, crc) = s.split_once(':')?;
        Some(Fingerprint { len: len.parse().ok()?, tail_crc: crc.parse().ok()? })
    }
}
