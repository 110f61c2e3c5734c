//! The reader of GGUF's little-endian fields (integers, strings, counts), which the header and its metadata
//! values are made of: each read is checked against the bytes left.

use crate::GgufError;

/// A reader of the header's little-endian fields, each read checked against the bytes left.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.at
    }

    fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.at)
    }

    pub(crate) fn take(&mut self, len: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let truncated = || GgufError::Truncated {
            what: what.to_owned(),
            at: self.at as u64,
            needed: len,
            available: self.remaining() as u64,
        };
        let len = usize::try_from(len).map_err(|_| truncated())?;
        let end = self.at.checked_add(len).ok_or_else(truncated)?;
        let bytes = self.bytes.get(self.at..end).ok_or_else(truncated)?;
        self.at = end;
        Ok(bytes)
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(&format!("the length of {what}"))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::NotUtf8 { what: what.to_owned() })
    }

    /// `count` items of at least `min_size` bytes each, checked against the bytes left before anything is
    /// allocated for them.
    pub(crate) fn check_count(&self, what: &str, count: u64, min_size: u64) -> Result<usize, GgufError> {
        let available = self.remaining() as u64;
        let most = available / min_size.max(1);
        if count > most {
            return Err(GgufError::CountTooLarge { what: what.to_owned(), count, most, available });
        }
        usize::try_from(count).map_err(|_| GgufError::CountTooLarge { what: what.to_owned(), count, most, available })
    }
}
