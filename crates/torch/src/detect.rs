//! Telling `torch.save` containers (and the usual wrong files) apart from their first bytes.

use crate::error::Error;

/// The container a `torch.save` file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Container {
    /// ZIP archive (torch >= 1.6).
    Zip,
    /// Legacy pickle stream (`_use_new_zipfile_serialization=False`, torch 0.1.10–1.5).
    Legacy,
    /// A plain pickle (`pickle.dump(obj)`), not a `torch.save` stream: `torch.load` refuses it, `pickle.load`
    /// reads it (each tensor's storage a `torch.storage._load_from_bytes` of a whole `torch.save` stream).
    Pickle,
}

/// The pickle-protocol-2 encoding of torch's legacy `MAGIC_NUMBER` (0x1950A86A20F9469CFC6C) without the
/// The pickle protocol prefix, searched for in the first bytes.
const LEGACY_MAGIC: &[u8] = &[0x8A, 0x0A, 0x6C, 0xFC, 0x9C, 0x46, 0xF9, 0x20, 0x6A, 0xA8, 0x50, 0x19];
/// The same number in protocol 0's text form.
const LEGACY_MAGIC_TEXT: &[u8] = b"L119547037146038801333356L";

/// One row of the signature table: a byte pattern at an offset, and what it means.
struct Signature {
    offset: usize,
    bytes: &'static [u8],
    verdict: fn() -> Result<Container, Error>,
}

/// The signature table, checked in order.
const SIGNATURES: &[Signature] = &[
    Signature { offset: 0, bytes: b"PK\x03\x04", verdict: || Ok(Container::Zip) },
    Signature { offset: 0, bytes: b"PK\x05\x06", verdict: || Ok(Container::Zip) },
    Signature { offset: 257, bytes: b"ustar", verdict: || Err(Error::TarFormat) },
    Signature { offset: 0, bytes: b"PYTORCH1", verdict: || Err(Error::PreviewFormat) },
    Signature { offset: 0, bytes: b"version https://git-lfs", verdict: || Err(Error::GitLfsPointer) },
];

/// Detects the container of `bytes` (the start of a file or an embedded item).
///
/// # Errors
/// A specific error for the common wrong inputs: empty file, git-LFS pointer, HTML page, safetensors,
/// TAR-era checkpoint, preview archive, and [`Error::Unrecognized`] otherwise.
pub fn detect(bytes: &[u8]) -> Result<Container, Error> {
    if bytes.is_empty() {
        return Err(Error::Empty);
    }
    for sig in SIGNATURES {
        if bytes.get(sig.offset..sig.offset + sig.bytes.len()) == Some(sig.bytes) {
            return (sig.verdict)();
        }
    }
    let head = bytes.get(..bytes.len().min(64)).unwrap_or(bytes);
    if head.first() == Some(&0x80) && (contains(head, LEGACY_MAGIC)) || contains(head, LEGACY_MAGIC_TEXT) {
        return Ok(Container::Legacy);
    }
    if looks_like_pickle(head) {
        return Ok(Container::Pickle);
    }
    let text = String::from_utf8_lossy(head).trim_start().to_ascii_lowercase();
    if text.starts_with("<!doctype html")
        || text.starts_with("<html")
        || text.starts_with("<?xml")
        || text.starts_with('<')
    {
        return Err(Error::Html);
    }
    if looks_like_safetensors(bytes) {
        return Err(Error::Safetensors);
    }
    Err(Error::Unrecognized { head: bytes.get(..bytes.len().min(16)).unwrap_or(bytes).to_vec() })
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Whether `head` starts a plain pickle: a PROTO opcode of protocol 2 to 5, or what a protocol 0 or 1 pickle of
/// a container or an object starts with (`(dp0`, `(lp0`, `}q\x00`, `]q\x00`, `ccopy_reg\n_reconstructor`,
/// `c<module>\n<name>\n`). Text that merely starts with one of those bytes is not taken.
pub fn looks_like_pickle(head: &[u8]) -> bool {
    match head {
        [0x80, 2..=5, ..] => true,
        [b'(', b'd' | b'l', b'p', d, ..] => d.is_ascii_digit(),
        [b'}' | b']', b'q' | b'r' | b'(' | b'.', ..] => true,
        [b'(', b'c', global @ ..] | [b'c', global @ ..] => starts_with_global(global),
        _ => false,
    }
}

/// Whether `rest` (after a GLOBAL opcode) is a dotted module name, a newline, a name and a newline.
fn starts_with_global(rest: &[u8]) -> bool {
    let mut lines = rest.splitn(3, |&b| b == b'\n');
    let ident = |s: &[u8]| !s.is_empty() && s.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    matches!((lines.next(), lines.next(), lines.next()), (Some(m), Some(n), Some(_)) if ident(m) && ident(n))
}

/// 8-byte little-endian header length followed by `{`.
fn looks_like_safetensors(bytes: &[u8]) -> bool {
    let Some(len) = bytes.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes) else {
        return false;
    };
    bytes.get(8) == Some(&b'{') && len >= 2 && len.checked_add(8).is_some_and(|end| end <= bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn table() {
        assert_eq!(detect(b"PK\x03\x04rest").unwrap(), Container::Zip);
        let mut legacy = vec![0x80, 0x02];
        legacy.extend_from_slice(LEGACY_MAGIC);
        assert_eq!(detect(&legacy).unwrap(), Container::Legacy);
        assert!(matches!(detect(b""), Err(Error::Empty)));
        assert!(matches!(detect(b"version https://git-lfs.github.com/spec/v1\n"), Err(Error::GitLfsPointer)));
        assert!(matches!(detect(b"<!DOCTYPE html><html>"), Err(Error::Html)));
        let mut tar = vec![0u8; 300];
        tar[257..262].copy_from_slice(b"ustar");
        assert!(matches!(detect(&tar), Err(Error::TarFormat)));
        let mut st = 2u64.to_le_bytes().to_vec();
        st.extend_from_slice(b"{}");
        assert!(matches!(detect(&st), Err(Error::Safetensors)));
        assert!(matches!(detect(b"\x00\x01garbage"), Err(Error::Unrecognized { .. })));
        // Plain pickles of every protocol; text that starts with a pickle opcode's byte is not one.
        for head in
            [&b"\x80\x02}q\x00."[..], b"\x80\x05\x95", b"(dp0\n", b"}q\x00(", b"ccopy_reg\n_reconstructor\np0\n"]
        {
            assert_eq!(detect(head).unwrap(), Container::Pickle, "{head:?}");
        }
        for text in [&b"(hello"[..], b"}{", b"cat file\n", b"\x80\x06"] {
            assert!(matches!(detect(text), Err(Error::Unrecognized { .. })), "{text:?}");
        }
    }
}
