//! The safetensors header to the byte, read with one error per rule and written in the caller's order:
//!
//! ```text
//! u64 LE N | N bytes: a JSON object, padded with spaces | the tensors' bytes, concatenated
//! ```
//!
//! The object maps each tensor's name to `{"dtype": code, "shape": [...], "data_offsets": [begin, end]}`
//! (offsets relative to the data region), and may hold a `__metadata__` map of strings. The entries tile
//! the data region exactly: sorted by offset, each begins where the previous one ended, and the last ends
//! at the end of the file.
//!
//! [`parse`] checks all of that before anything reads a tensor, keeping the entries in the order the file
//! lists them (writers such as RecIS give that order a meaning) and each dtype code as written (RecIS writes
//! a lowercase `bool`). [`write()`] lays a header out for entries in a given order, with `__metadata__` first
//! and its keys sorted, padded to a multiple of 8 with at least the spaces the caller asks for (the
//! `safetensors` crate pads with 0 to 7, RecIS with 1 to 8). [`declared_len`] reads just the length, so a
//! limit can be checked before a header is read at all.
//!
//! ```
//! use ckpt_safetensors::header::{self, Entry};
//! let bytes = header::write(&[Entry { name: "w", dtype: "F32", shape: &[2], nbytes: 8 }], &[], 0);
//! let mut file = bytes.clone();
//! file.extend_from_slice(&[0; 8]);
//! let h = header::parse(&file, header::MAX_LEN)?;
//! assert_eq!((h.entries[0].name.as_str(), h.entries[0].data_offsets), ("w", (0, 8)));
//! assert_eq!(h.data_start(), bytes.len());
//! # Ok::<(), ckpt_safetensors::header::HeaderError>(())
//! ```

use std::io::Read;

use ckpt_tensor::FormatError;
use ckpt_tensor::{DType, Fault, checked_numel};
use serde_json::Value as Json;

/// The largest header accepted by default: the `safetensors` crate's own bound, 100 MB.
pub const MAX_LEN: u64 = 100_000_000;

/// The key of the string map a header may carry beside its tensors.
pub const METADATA_KEY: &str = "__metadata__";

/// A header that breaks one of the format's rules: which rule, with what the file says.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The file is shorter than the 8-byte header length.
    #[error("{len} bytes, too short for the 8-byte header length")]
    FileTooShort {
        /// The file's length.
        len: usize,
    },
    /// The header length is over the reader's limit.
    #[error("header length {header_len} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The header length read from the first 8 bytes.
        header_len: u64,
        /// The limit.
        limit: u64,
    },
    /// The header length points past the end of the file.
    #[error(
        "header length {header_len} runs past the end of the {file_len}-byte file: the file is truncated (a copy or \
         download cut short?) or not a safetensors file"
    )]
    PastEnd {
        /// The header length read from the first 8 bytes.
        header_len: u64,
        /// The file's length.
        file_len: usize,
    },
    /// The header is not JSON.
    #[error("the header is not JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The header is JSON, but not an object.
    #[error("the header is not a JSON object")]
    NotAnObject,
    /// `__metadata__` is not a map of strings.
    #[error("`__metadata__` is not a map of strings")]
    BadMetadata,
    /// An entry is not `{dtype, shape, data_offsets}`.
    #[error("tensor {name:?}: {reason}")]
    BadEntry {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// An entry's dtype code is not one safetensors defines.
    #[error("tensor {name:?} has unknown dtype {dtype:?}")]
    UnknownDtype {
        /// The tensor's name.
        name: String,
        /// The dtype code as written.
        dtype: String,
    },
    /// An entry of a packed dtype (`F4`: 2 values a byte; `F6_E2M3`, `F6_E3M2`: 4 values in 3 bytes) whose
    /// last dimension is not a whole number of packed elements, or that has no dimension: torch's
    /// `float4_e2m1fn_x2` (and ckpt's float6 dtypes) pack the values of the last dimension, so such a
    /// tensor has no torch shape.
    #[error(
        "tensor {name:?}: {dtype} shape {shape:?} cannot be held as packed elements: the last dimension must be \
         a multiple of {values} (torch's {torch} packs {values} values of the last dimension per element)"
    )]
    PackedShape {
        /// The tensor's name.
        name: String,
        /// The dtype code as written.
        dtype: String,
        /// The shape as written (values).
        shape: Vec<usize>,
        /// The values per packed element.
        values: usize,
        /// The packed dtype's name.
        torch: &'static str,
    },
    /// An entry's `data_offsets` do not match its dtype and shape, overlap another entry, leave a gap, or
    /// run past the data region.
    #[error("tensor {name:?}: {reason}")]
    BadOffsets {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

impl FormatError for HeaderError {
    /// Who is at fault: the reader's limit for [`HeaderError::TooLarge`], the file for every other rule.
    fn fault(&self) -> Fault {
        match self {
            HeaderError::TooLarge { .. } => Fault::Limit,
            HeaderError::PackedShape { .. } => Fault::Unsupported,
            HeaderError::FileTooShort { .. }
            | HeaderError::PastEnd { .. }
            | HeaderError::Json(_)
            | HeaderError::NotAnObject
            | HeaderError::BadMetadata
            | HeaderError::BadEntry { .. }
            | HeaderError::UnknownDtype { .. }
            | HeaderError::BadOffsets { .. } => Fault::Malformed,
        }
    }
}

/// One tensor as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderEntry {
    /// The tensor's name.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// The dtype code as written (`F32`, `BOOL`, or the lowercase `bool` some writers emit).
    pub dtype_code: String,
    /// Its shape: as the header gives it, but for packed dtypes (`F4`, `F6_*`), whose last dimension
    /// counts packed elements as torch's `float4_e2m1fn_x2` does (the header's divided by
    /// [`DType::packed_values`]).
    pub shape: Vec<usize>,
    /// Its bytes, relative to the start of the data region ([`Header::data_start`]).
    pub data_offsets: (usize, usize),
}

/// A parsed, validated header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// `N`, the header's length (padding included), as the first 8 bytes give it.
    pub len: usize,
    /// The tensors, in the order the header lists them.
    pub entries: Vec<HeaderEntry>,
    /// The `__metadata__` map, if the header has one, in the order it lists its keys.
    pub metadata: Option<Vec<(String, String)>>,
}

impl Header {
    /// Where the data region starts in the file: `8 + N`.
    pub fn data_start(&self) -> usize {
        8 + self.len
    }
}

/// The header length a file declares in its first 8 bytes; `None` when it has fewer.
///
/// # Errors
/// The reader's I/O errors other than an early end.
pub fn declared_len(file: &mut impl Read) -> std::io::Result<Option<u64>> {
    let mut prefix = [0u8; 8];
    match file.read_exact(&mut prefix) {
        Ok(()) => Ok(Some(u64::from_le_bytes(prefix))),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Parses and validates the header of the safetensors file `bytes` (the whole file, or at least its header
/// when only the header is wanted: then the data region is taken as what follows in `bytes`), accepting a
/// header of at most `max_len` bytes.
///
/// # Errors
/// The [`HeaderError`] of the first rule the header breaks.
pub fn parse(bytes: &[u8], max_len: u64) -> Result<Header, HeaderError> {
    let file_len = bytes.len();
    let Some(prefix) = bytes.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
        return Err(HeaderError::FileTooShort { len: file_len });
    };
    let n = u64::from_le_bytes(prefix);
    if n > max_len {
        return Err(HeaderError::TooLarge { header_len: n, limit: max_len });
    }
    let end = usize::try_from(n).ok().and_then(|n| n.checked_add(8)).filter(|&e| e <= file_len);
    let Some(end) = end else {
        return Err(HeaderError::PastEnd { header_len: n, file_len });
    };
    body(bytes.get(8..end).unwrap_or_default(), file_len - end)
}

/// The header's JSON `text` (padding included), validated against a data region of `data_len` bytes.
fn body(text: &[u8], data_len: usize) -> Result<Header, HeaderError> {
    let Json::Object(map) = serde_json::from_slice(text).map_err(HeaderError::Json)? else {
        return Err(HeaderError::NotAnObject);
    };
    let mut entries = Vec::with_capacity(map.len());
    let mut metadata = None;
    for (name, value) in &map {
        if name == METADATA_KEY {
            let m = value.as_object().ok_or(HeaderError::BadMetadata)?;
            let strings = m.iter().map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())));
            metadata = Some(strings.collect::<Option<Vec<_>>>().ok_or(HeaderError::BadMetadata)?);
            continue;
        }
        entries.push(entry(name, value)?);
    }
    check_tiling(&entries, data_len)?;
    Ok(Header { len: text.len(), entries, metadata })
}

/// Reads and validates the header of the safetensors file `path` without reading its data (the data
/// region's length comes from the file's length).
///
/// # Errors
/// [`ReadError::Io`], or [`ReadError::Header`] with the rule the header breaks.
pub fn read_file(path: &std::path::Path, max_len: u64) -> Result<Header, ReadError> {
    let mut file = std::fs::File::open(path)?;
    let file_len = file.metadata()?.len();
    let Some(n) = declared_len(&mut file)? else {
        return Err(HeaderError::FileTooShort { len: usize::try_from(file_len).unwrap_or(usize::MAX) }.into());
    };
    if n > max_len {
        return Err(HeaderError::TooLarge { header_len: n, limit: max_len }.into());
    }
    let past_end = || HeaderError::PastEnd { header_len: n, file_len: usize::try_from(file_len).unwrap_or(usize::MAX) };
    if n.checked_add(8).is_none_or(|end| end > file_len) {
        return Err(past_end().into());
    }
    let mut text = Vec::with_capacity(usize::try_from(n).map_err(|_| past_end())?);
    (&mut file).take(n).read_to_end(&mut text)?;
    if text.len() as u64 != n {
        return Err(past_end().into()); // the file shrank while it was read
    }
    // The entries tile the data region: the file's bytes beyond the header, checked without reading them.
    let data_len = usize::try_from(file_len - 8 - n).map_err(|_| past_end())?;
    Ok(body(&text, data_len)?)
}

/// An error of [`read_file`]: the file could not be read, or its header breaks a rule.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The operating system's error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The header breaks a rule.
    #[error(transparent)]
    Header(#[from] HeaderError),
}

fn entry(name: &str, value: &Json) -> Result<HeaderEntry, HeaderError> {
    let bad = |reason: &str| HeaderError::BadEntry { name: name.into(), reason: reason.into() };
    let obj = value.as_object().ok_or_else(|| bad("is not a JSON object"))?;
    let code = obj.get("dtype").and_then(Json::as_str).ok_or_else(|| bad("has no string `dtype`"))?;
    let dtype = DType::from_safetensors_code(code)
        .ok_or_else(|| HeaderError::UnknownDtype { name: name.into(), dtype: code.into() })?;
    let uint = |v: &Json| v.as_u64().and_then(|n| usize::try_from(n).ok());
    let values = obj
        .get("shape")
        .and_then(Json::as_array)
        .and_then(|a| a.iter().map(uint).collect::<Option<Vec<usize>>>())
        .ok_or_else(|| bad("has no `shape` array of non-negative integers"))?;
    // safetensors counts values; a packed dtype's tensor counts packed elements along the last dimension.
    let shape = dtype.shape_from_safetensors(&values).ok_or_else(|| HeaderError::PackedShape {
        name: name.into(),
        dtype: code.into(),
        shape: values.clone(),
        values: dtype.packed_values(),
        torch: dtype.torch_name(),
    })?;
    let offsets = obj
        .get("data_offsets")
        .and_then(Json::as_array)
        .and_then(|a| a.iter().map(uint).collect::<Option<Vec<usize>>>())
        .ok_or_else(|| bad("has no `data_offsets` array of non-negative integers"))?;
    let [begin, end] = offsets.as_slice() else {
        return Err(HeaderError::BadEntry {
            name: name.into(),
            reason: format!("`data_offsets` has {} numbers, expected 2", offsets.len()),
        });
    };
    let bad_offsets = |reason: String| HeaderError::BadOffsets { name: name.into(), reason };
    if end < begin {
        return Err(bad_offsets(format!("data_offsets [{begin}, {end}] end before they begin")));
    }
    let nbytes = checked_numel(&shape)
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| bad_offsets(format!("shape {values:?} overflows")))?;
    if end - begin != nbytes {
        let packing = match dtype.packed_values() {
            1 => String::new(),
            n => format!(" ({n} values in {} bytes)", dtype.size()),
        };
        return Err(bad_offsets(format!(
            "data_offsets [{begin}, {end}] hold {} bytes, but {code} {values:?}{packing} needs {nbytes}",
            end - begin
        )));
    }
    Ok(HeaderEntry { name: name.into(), dtype, dtype_code: code.into(), shape, data_offsets: (*begin, *end) })
}

/// The entries must tile `0..data_len` exactly: sorted by offset, each begins where the previous one ended,
/// the last ends at the end of the data region.
fn check_tiling(entries: &[HeaderEntry], data_len: usize) -> Result<(), HeaderError> {
    let mut order: Vec<&HeaderEntry> = entries.iter().collect();
    order.sort_by_key(|e| e.data_offsets);
    let mut cursor = 0usize;
    for e in order {
        let (b, end) = e.data_offsets;
        let bad = |reason: String| HeaderError::BadOffsets { name: e.name.clone(), reason };
        if b < cursor {
            return Err(bad(format!("data_offsets [{b}, {end}] overlap the previous block, which ends at {cursor}")));
        }
        if b > cursor {
            return Err(bad(format!(
                "data_offsets [{b}, {end}] leave a gap after the previous block, which ends at {cursor}"
            )));
        }
        if end > data_len {
            return Err(bad(format!(
                "data_offsets [{b}, {end}] run past the {data_len}-byte data region (the file is truncated?)"
            )));
        }
        cursor = end;
    }
    if cursor != data_len {
        let last = entries.iter().max_by_key(|e| e.data_offsets.1).map(|e| e.name.clone()).unwrap_or_default();
        return Err(HeaderError::BadOffsets {
            name: last,
            reason: format!("the blocks end at {cursor} but the data region has {data_len} bytes"),
        });
    }
    Ok(())
}

/// A tensor to lay out in a header: its name, dtype code, shape and byte length.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// The dtype code to write (`F32`; RecIS writes `bool` for booleans).
    pub dtype: &'a str,
    /// The tensor's shape (a packed dtype's last dimension counting packed elements, as
    /// [`HeaderEntry::shape`]: it is written as safetensors counts it, [`DType::safetensors_shape`]).
    pub shape: &'a [usize],
    /// The tensor's bytes.
    pub nbytes: usize,
}

/// The first `8 + N` bytes of a safetensors file holding `entries` in this order, their data concatenated
/// in the same order: the length, then compact JSON (`__metadata__` first, when `metadata` is not empty,
/// with its keys as given; then each entry as `{"dtype":…,"shape":[…],"data_offsets":[b,e]}`), then spaces
/// to a multiple of 8, at least `min_padding` of them (0 for the `safetensors` crate's layout, 1 for
/// RecIS's, which pads 1 to 8).
///
/// Names and strings are escaped as `serde_json` escapes them, which is what Python's `json.dumps` with
/// `ensure_ascii=False`, Rust's safetensors and nlohmann's `dump()` write.
pub fn write(entries: &[Entry<'_>], metadata: &[(&str, &str)], min_padding: usize) -> Vec<u8> {
    let mut out = String::with_capacity(2 + entries.len() * 80);
    out.push('{');
    if !metadata.is_empty() {
        out.push_str(&Json::from(METADATA_KEY).to_string());
        out.push_str(":{");
        for (i, (k, v)) in metadata.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&Json::from(*k).to_string());
            out.push(':');
            out.push_str(&Json::from(*v).to_string());
        }
        out.push('}');
    }
    let mut offset = 0usize;
    for (i, e) in entries.iter().enumerate() {
        if i > 0 || !metadata.is_empty() {
            out.push(',');
        }
        out.push_str(&Json::from(e.name).to_string());
        out.push_str(":{\"dtype\":");
        out.push_str(&Json::from(e.dtype).to_string());
        out.push_str(",\"shape\":[");
        let shape = match DType::from_safetensors_code(e.dtype) {
            Some(d) => d.safetensors_shape(e.shape).unwrap_or_else(|| e.shape.to_vec()),
            None => e.shape.to_vec(),
        };
        for (j, d) in shape.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push_str(&d.to_string());
        }
        let end = offset.saturating_add(e.nbytes);
        out.push_str(&format!("],\"data_offsets\":[{offset},{end}]}}"));
        offset = end;
    }
    out.push('}');
    let mut pad = (8 - out.len() % 8) % 8;
    while pad < min_padding {
        pad += 8;
    }
    let n = (out.len() + pad) as u64;
    let mut bytes = Vec::with_capacity(8 + out.len() + pad);
    bytes.extend_from_slice(&n.to_le_bytes());
    bytes.extend_from_slice(out.as_bytes());
    bytes.extend(std::iter::repeat_n(b' ', pad));
    bytes
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn file(header: &[u8], data: usize) -> Vec<u8> {
        let mut f = (header.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(header);
        f.extend(std::iter::repeat_n(0u8, data));
        f
    }

    #[test]
    fn writes_what_the_safetensors_crate_writes() {
        // The same layout as safetensors.serialize for tensors in its order, metadata included.
        let a = ckpt_tensor::Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let b = ckpt_tensor::Tensor::from_slice(&[3i64], &[1]).unwrap();
        let theirs = crate::to_bytes(
            &[("b".into(), b), ("a".into(), a)],
            Some([("format".to_string(), "pt".to_string())].into()),
        )
        .unwrap();
        let ours = write(
            &[
                Entry { name: "b", dtype: "I64", shape: &[1], nbytes: 8 },
                Entry { name: "a", dtype: "F32", shape: &[2], nbytes: 8 },
            ],
            &[("format", "pt")],
            0,
        );
        assert_eq!(theirs.get(..ours.len()).unwrap(), &ours[..]);
    }

    #[test]
    fn pads_to_eight_with_the_minimum_asked() {
        for min in [0, 1] {
            for name in ["a", "ab", "abc", "abcdefgh"] {
                let h = write(&[Entry { name, dtype: "U8", shape: &[3], nbytes: 3 }], &[], min);
                let n = u64::from_le_bytes(h[..8].try_into().unwrap()) as usize;
                assert_eq!((h.len() - 8, n % 8), (n, 0));
                let text = std::str::from_utf8(&h[8..]).unwrap();
                let pad = text.len() - text.trim_end().len();
                assert!(pad >= min && pad < min + 8, "{name} {min}: {pad}");
                let parsed = parse(&file(&h[8..], 3), MAX_LEN).unwrap();
                assert_eq!(parsed.entries[0].name, name);
            }
        }
    }

    #[test]
    fn keeps_file_order_codes_and_metadata() {
        let h = br#"{"z":{"dtype":"bool","shape":[2],"data_offsets":[0,2]},"__metadata__":{"k":"v","a":"b"},"a":{"dtype":"F16","shape":[],"data_offsets":[2,4]}}"#;
        let p = parse(&file(h, 4), MAX_LEN).unwrap();
        let names: Vec<_> = p.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["z", "a"]);
        assert_eq!((p.entries[0].dtype, p.entries[0].dtype_code.as_str()), (DType::Bool, "bool"));
        assert_eq!(p.metadata, Some(vec![("k".into(), "v".into()), ("a".into(), "b".into())]));
        assert_eq!((p.len, p.data_start()), (h.len(), h.len() + 8));
    }

    #[test]
    fn one_error_per_rule() {
        let e = |bytes: &[u8]| parse(bytes, MAX_LEN).unwrap_err();
        let entry = |json: &str, data: usize| parse(&file(json.as_bytes(), data), MAX_LEN).unwrap_err();
        assert!(matches!(e(b"1234"), HeaderError::FileTooShort { len: 4 }));
        assert!(matches!(parse(&file(b"{}", 0), 1).unwrap_err(), HeaderError::TooLarge { header_len: 2, limit: 1 }));
        assert!(matches!(e(&[9, 0, 0, 0, 0, 0, 0, 0, b'{']), HeaderError::PastEnd { header_len: 9, file_len: 9 }));
        assert!(matches!(e(&u64::MAX.to_le_bytes()), HeaderError::TooLarge { .. }));
        assert!(matches!(entry("{", 0), HeaderError::Json(_)));
        assert!(matches!(entry("[]", 0), HeaderError::NotAnObject));
        assert!(matches!(entry(r#"{"__metadata__":{"k":1}}"#, 0), HeaderError::BadMetadata));
        assert!(matches!(entry(r#"{"t":1}"#, 0), HeaderError::BadEntry { .. }));
        assert!(matches!(entry(r#"{"t":{"shape":[],"data_offsets":[0,4]}}"#, 4), HeaderError::BadEntry { .. }));
        assert!(matches!(
            entry(r#"{"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, 4),
            HeaderError::BadEntry { .. }
        ));
        assert!(matches!(
            entry(r#"{"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#, 4),
            HeaderError::BadEntry { .. }
        ));
        assert!(matches!(
            entry(r#"{"t":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}"#, 4),
            HeaderError::UnknownDtype { .. }
        ));
        let offsets = |json: &str, data: usize| match entry(json, data) {
            HeaderError::BadOffsets { reason, .. } => reason,
            other => panic!("{other}"),
        };
        assert!(offsets(r#"{"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#, 4).contains("end before"));
        assert!(offsets(r#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, 4).contains("needs 8"));
        assert!(
            offsets(r#"{"t":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,4]}}"#, 4)
                .contains("overflows")
        );
        let two = |a: [u32; 2], b: [u32; 2], data| {
            offsets(
                &format!(
                    r#"{{"a":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}},"b":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}}}}"#,
                    a[1] - a[0],
                    a[0],
                    a[1],
                    b[1] - b[0],
                    b[0],
                    b[1]
                ),
                data,
            )
        };
        assert!(two([0, 2], [1, 3], 3).contains("overlap"));
        assert!(two([0, 1], [2, 3], 3).contains("gap"));
        assert!(two([0, 1], [1, 3], 2).contains("run past"));
        assert!(two([0, 1], [1, 2], 3).contains("end at 2"));
        // The limit is the caller's; everything else is the file's fault.
        assert_eq!(HeaderError::TooLarge { header_len: 2, limit: 1 }.fault(), Fault::Limit);
        assert_eq!(HeaderError::NotAnObject.fault(), Fault::Malformed);
    }

    #[test]
    fn reads_a_files_header_without_its_data() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        let h = write(&[Entry { name: "w", dtype: "F32", shape: &[4], nbytes: 16 }], &[("format", "pt")], 0);
        std::fs::write(&p, file(&h[8..], 16)).unwrap();
        let header = read_file(&p, MAX_LEN).unwrap();
        assert_eq!(header.metadata, Some(vec![("format".into(), "pt".into())]));
        assert_eq!(header.entries[0].data_offsets, (0, 16));
        assert!(matches!(read_file(&p, 8), Err(ReadError::Header(HeaderError::TooLarge { .. }))));
        // A truncated data region breaks the tiling, found from the file's length alone.
        std::fs::write(&p, file(&h[8..], 15)).unwrap();
        assert!(matches!(read_file(&p, MAX_LEN), Err(ReadError::Header(HeaderError::BadOffsets { .. }))));
        std::fs::write(&p, b"short").unwrap();
        assert!(matches!(read_file(&p, MAX_LEN), Err(ReadError::Header(HeaderError::FileTooShort { len: 5 }))));
        std::fs::write(&p, 100u64.to_le_bytes()).unwrap();
        assert!(matches!(read_file(&p, MAX_LEN), Err(ReadError::Header(HeaderError::PastEnd { .. }))));
        assert!(matches!(read_file(&dir.path().join("none"), MAX_LEN), Err(ReadError::Io(_))));
        let mut short: &[u8] = b"abc";
        assert_eq!(declared_len(&mut short).unwrap(), None);
    }

    #[test]
    fn packed_dtypes_count_values_in_the_header_and_elements_in_the_tensor() {
        // F4 [2, 8] is 16 values, 8 bytes: torch's float4_e2m1fn_x2 [2, 4]; written back as F4 [2, 8].
        let h = write(&[Entry { name: "q", dtype: "F4", shape: &[2, 4], nbytes: 8 }], &[], 0);
        assert!(std::str::from_utf8(&h[8..]).unwrap().contains(r#""dtype":"F4","shape":[2,8]"#));
        let header = parse(&file(&h[8..], 8), MAX_LEN).unwrap();
        assert_eq!((header.entries[0].dtype, header.entries[0].shape.clone()), (DType::F4E2M1FnX2, vec![2, 4]));
        // F6: 4 values in 3 bytes.
        let h = br#"{"s":{"dtype":"F6_E3M2","shape":[8],"data_offsets":[0,6]}}"#;
        let header = parse(&file(h, 6), MAX_LEN).unwrap();
        assert_eq!((header.entries[0].dtype, header.entries[0].shape.clone()), (DType::F6E3M2FnX4, vec![2]));
        // An odd last dimension has no torch shape: its own error, ckpt's limit rather than the file's fault.
        let h = br#"{"q":{"dtype":"F4","shape":[4,1],"data_offsets":[0,2]}}"#;
        let e = parse(&file(h, 2), MAX_LEN).unwrap_err();
        assert!(matches!(&e, HeaderError::PackedShape { name, values: 2, .. } if name == "q"), "{e}");
        assert_eq!(e.fault(), Fault::Unsupported);
        assert!(e.to_string().contains("float4_e2m1fn_x2"), "{e}");
        // Truncated FP4 data: the bytes the packed shape needs, named.
        let h = br#"{"q":{"dtype":"F4","shape":[2,8],"data_offsets":[0,7]}}"#;
        let e = parse(&file(h, 7), MAX_LEN).unwrap_err();
        assert!(matches!(e, HeaderError::BadOffsets { .. }), "{e}");
        assert!(e.to_string().contains("F4 [2, 8] (2 values in 1 bytes) needs 8"), "{e}");
    }
}
