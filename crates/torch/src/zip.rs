//! ZIP container of `torch.save` files: a zero-copy reader for hostile input and a writer that
//! reproduces PyTorch's `PyTorchStreamWriter` (miniz, `MZ_ZIP_FLAG_WRITE_ZIP64`) layout byte for byte.
//!
//! Layout reference: `shared/specs/torch-save.md` §2.
//!
//! # Reading
//!
//! [`Archive::parse`] reads the central directory of an archive that occupies a whole byte slice (which
//! may itself be a window of a larger file, e.g. one item of a DCP `.distcp` file). All offsets are
//! relative to the first byte of that slice. Record bytes are returned as sub-slices
//! ([`Archive::data`]); nothing is copied and nothing is inflated. Every offset and size read from the
//! file is bounds-checked before use, and the parser never allocates more than the input can justify.
//!
//! Rules enforced (each failure has its own [`ZipError`] variant):
//! - the end of central directory record (EOCD) is found by scanning backwards over at most
//!   65 535 + 22 bytes, so trailing bytes after the archive are tolerated;
//! - zip64 is honoured (EOCD locator → zip64 EOCD, zip64 extra fields for sizes/offsets);
//! - bytes prepended to the archive (self-extractor style) are detected the way Python's `zipfile`
//!   does (the central directory is assumed to end where the end records start) and every offset is
//!   shifted accordingly;
//! - sizes come from the central directory only (torch writes 0 into local headers and uses data
//!   descriptors); each record's data offset comes from its *local* header, whose signature and name
//!   are checked;
//! - one archive prefix: the text before the first `/` of the first central-directory entry; every
//!   entry must start with that prefix and `/` (as `PyTorchStreamReader` requires);
//! - no duplicate names, no records overlapping each other or the central directory.
//!
//! # Writing
//!
//! [`ZipWriter`] emits exactly what torch ≥ 2.7 emits for the same record sequence: local header
//! with flags `0x0808` (`0x0800` for empty records), zeroed time/date/CRC/sizes, an optional zip64
//! extra field, the `FB` padding extra field that aligns the data (64 bytes by default), the data,
//! a data descriptor (16 bytes, or 24 when zip64 applies, none for empty records), and at the end
//! the central directory followed by a zip64 EOCD, a zip64 EOCD locator and a classic EOCD.
//! [`ZipWriter::serialization_id`] reproduces the `.data/serialization_id` record of torch wheels
//! built against libstdc++ (Linux).

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

mod read;
mod sid;
mod write;

#[cfg(test)]
mod tests;

pub use read::{Archive, HeaderSource, Record};
pub use sid::serialization_id;
pub use write::{CENTRAL_DIRECTORY_MARK, Producer, Sink, WriterOptions, ZipWriter};

/// Alignment of record data used by torch (`torch.utils.serialization.config.save.storage_alignment`).
pub const DEFAULT_ALIGNMENT: u64 = 64;

/// Name (without prefix) of the record holding torch's serialization id.
pub const SERIALIZATION_ID_RECORD: &str = ".data/serialization_id";

/// Largest alignment [`ZipWriter`] accepts: the padding must fit the local header's 16-bit extra
/// length together with the 4-byte `FB` header and a 28-byte zip64 extra field.
pub const MAX_ALIGNMENT: u64 = 0x8000;

/// Signature of a local file header (`PK\3\4`).
const LOCAL_HEADER_SIG: u32 = 0x0403_4b50;
/// Signature of a central directory file header (`PK\1\2`).
const CENTRAL_HEADER_SIG: u32 = 0x0201_4b50;
/// Signature of the classic end of central directory record (`PK\5\6`).
const EOCD_SIG: u32 = 0x0605_4b50;
/// Signature of the zip64 end of central directory record (`PK\6\6`).
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
/// Signature of the zip64 end of central directory locator (`PK\6\7`).
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
/// Signature of a data descriptor (`PK\7\8`).
const DATA_DESCRIPTOR_SIG: u32 = 0x0807_4b50;

/// Fixed part of a local file header.
const LOCAL_HEADER_LEN: u64 = 30;
/// Fixed part of a central directory file header.
const CENTRAL_HEADER_LEN: u64 = 46;
/// Classic EOCD without comment.
const EOCD_LEN: u64 = 22;
/// Zip64 EOCD record without extensible data.
const ZIP64_EOCD_LEN: u64 = 56;
/// Zip64 EOCD locator.
const ZIP64_LOCATOR_LEN: u64 = 20;
/// Header id of the zip64 extended information extra field.
const ZIP64_EXTRA_ID: u16 = 0x0001;
/// Sentinel for 32-bit sizes and offsets that live in the zip64 extra field instead.
const U32_SENTINEL: u64 = 0xFFFF_FFFF;

/// General purpose flag: data descriptor follows the data.
const FLAG_DATA_DESCRIPTOR: u16 = 0x0008;
/// General purpose flag: name is UTF-8.
const FLAG_UTF8: u16 = 0x0800;
/// General purpose flag: entry is encrypted.
const FLAG_ENCRYPTED: u16 = 0x0001;
/// Compression method 8: DEFLATE.
const METHOD_DEFLATE: u16 = 8;

/// Everything that can go wrong reading or writing a torch ZIP archive.
///
/// Offsets are relative to the start of the archive slice (reader) or of the writer's output
/// (writer). Names are full entry names (including the prefix) unless stated otherwise.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZipError {
    /// No end of central directory signature in the last 65 557 bytes: a ZIP archive cut short, or not one.
    #[error(
        "no end of central directory record found: the file is truncated ({len} bytes; a copy or download cut \
         short?) or not a ZIP archive"
    )]
    NotZip {
        /// The archive's length in bytes.
        len: u64,
    },

    /// A structure extends past the end of the available bytes.
    #[error("truncated archive: {what} at offset {offset} needs {needed} bytes, only {available} available")]
    Truncated {
        /// The structure being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
        /// How many bytes there are from `offset` to the end of the relevant region.
        available: u64,
    },

    /// A structure does not start with its signature.
    #[error("bad signature for {what} at offset {offset}: expected {expected:#010x}, found {found:#010x}")]
    BadSignature {
        /// The structure expected at `offset`.
        what: &'static str,
        /// Where it was expected.
        offset: u64,
        /// The signature it should have.
        expected: u32,
        /// The four bytes found there (little-endian).
        found: u32,
    },

    /// The archive spans several disks (split archive), which torch never writes.
    #[error("multi-disk archives are not supported ({what} = {value})")]
    MultiDisk {
        /// The field that reveals it.
        what: &'static str,
        /// Its value.
        value: u64,
    },

    /// The central directory does not fit before the end records.
    #[error(
        "central directory at offset {cd_offset} with size {cd_size} does not end before the end records at offset {end_records}"
    )]
    CentralDirectoryMisplaced {
        /// Offset of the central directory as recorded in the EOCD.
        cd_offset: u64,
        /// Size of the central directory as recorded in the EOCD.
        cd_size: u64,
        /// Where the (zip64) end records actually start.
        end_records: u64,
    },

    /// The end records claim more entries than the central directory can hold (46 bytes each).
    #[error(
        "end of central directory claims {claimed} entries, but a {cd_size}-byte central directory holds at most {max}"
    )]
    EntryCountTooLarge {
        /// Entry count from the end records.
        claimed: u64,
        /// Central directory size from the end records.
        cd_size: u64,
        /// How many entries fit.
        max: u64,
    },

    /// The archive contains no entries (torch: "archive does not contain any files").
    #[error("archive does not contain any records")]
    Empty,

    /// An extra field block claims more bytes than the extra field has.
    #[error("malformed extra field in entry {name:?}: block at byte {at} of the extra field overruns it")]
    MalformedExtra {
        /// Entry name.
        name: String,
        /// Position of the bad block inside the extra field.
        at: usize,
    },

    /// A 32-bit field holds the zip64 sentinel but the zip64 extra field lacks the value.
    #[error("entry {name:?}: {field} is 0xFFFFFFFF but the zip64 extra field does not provide it")]
    Zip64ExtraMissing {
        /// Entry name.
        name: String,
        /// The field that needed the zip64 value.
        field: &'static str,
    },

    /// An entry name is not valid UTF-8.
    #[error("entry name of the central directory entry at offset {offset} is not valid UTF-8")]
    InvalidName {
        /// Offset of the central directory entry.
        offset: u64,
    },

    /// The first entry's name has no `/`, so there is no archive prefix.
    #[error("record {name:?} is not in a subdirectory")]
    NotInSubdirectory {
        /// Entry name.
        name: String,
    },

    /// An entry is not under the prefix taken from the first entry.
    #[error("record {name:?} is not in the archive directory {prefix:?}/")]
    MixedPrefix {
        /// Prefix of the archive (from the first entry).
        prefix: String,
        /// The offending entry.
        name: String,
    },

    /// Two entries have the same name.
    #[error("duplicate record name {name:?}")]
    DuplicateName {
        /// The name (full name when reading; name without prefix when writing).
        name: String,
    },

    /// The local header names a different file than the central directory entry that points at it.
    #[error("local header at offset {offset} names {local:?}, central directory says {central:?}")]
    LocalNameMismatch {
        /// Name in the central directory.
        central: String,
        /// Name in the local header (lossily decoded).
        local: String,
        /// Offset of the local header.
        offset: u64,
    },

    /// A record's local header puts its data elsewhere than torch's layout rule does, where a reader
    /// trusted the rule ([`Archive::parse_predicted`]).
    #[error("record {name:?}: data at offset {found}, not where torch's writer puts it ({predicted})")]
    Unpredicted {
        /// The record's full name.
        name: String,
        /// The offset the layout rule gives.
        predicted: u64,
        /// The offset its local header gives.
        found: u64,
    },

    /// A stored (method 0) entry whose compressed and uncompressed sizes differ.
    #[error("stored record {name:?} has compressed size {compressed} but uncompressed size {uncompressed}")]
    StoredSizeMismatch {
        /// Entry name.
        name: String,
        /// Compressed size from the central directory.
        compressed: u64,
        /// Uncompressed size from the central directory.
        uncompressed: u64,
    },

    /// Two records (local header + data), or a record and the central directory, share bytes.
    #[error("record {a:?} overlaps {b:?}")]
    Overlap {
        /// First record (lower offset).
        a: String,
        /// Second record, or `"<central directory>"`.
        b: String,
    },

    /// The record uses a compression method other than stored (0) and DEFLATE (8).
    #[error("record {name:?} uses compression method {method}; only stored (0) and DEFLATE (8) records can be read")]
    Compressed {
        /// Entry name.
        name: String,
        /// Compression method.
        method: u16,
    },

    /// A DEFLATE record claims an uncompressed size that its compressed bytes cannot hold (DEFLATE expands
    /// by at most 1032 times), or more than the reader allows.
    #[error("DEFLATE record {name:?} claims {size} uncompressed bytes from {compressed}; at most {limit} allowed")]
    InflatedTooLarge {
        /// Entry name.
        name: String,
        /// Uncompressed size from the central directory.
        size: u64,
        /// Compressed size.
        compressed: u64,
        /// The bound it crossed.
        limit: u64,
    },

    /// A DEFLATE record's stream is corrupt, or inflates to another size than the central directory says.
    #[error("DEFLATE record {name:?} does not inflate to its {size} bytes: {reason}")]
    Inflate {
        /// Entry name.
        name: String,
        /// Uncompressed size from the central directory.
        size: u64,
        /// What went wrong.
        reason: String,
    },

    /// The record is encrypted.
    #[error("record {name:?} is encrypted")]
    Encrypted {
        /// Entry name.
        name: String,
    },

    /// [`Archive::data`] / [`Archive::verify_crc`] was given a slice of another length than the one parsed.
    #[error("archive was parsed from {parsed} bytes but {given} bytes were passed")]
    BufferMismatch {
        /// Length of the slice given to [`Archive::parse`].
        parsed: u64,
        /// Length of the slice given now.
        given: u64,
    },

    /// The record's bytes do not have the CRC-32 recorded in the central directory.
    #[error("CRC-32 mismatch in record {name:?}: expected {expected:#010x}, computed {actual:#010x}")]
    CrcMismatch {
        /// Entry name.
        name: String,
        /// CRC-32 from the central directory.
        expected: u32,
        /// CRC-32 of the data.
        actual: u32,
    },

    /// Writer: invalid archive prefix (empty, or containing `/` or `\`).
    #[error("invalid archive prefix {prefix:?}")]
    InvalidPrefix {
        /// The prefix given to the writer.
        prefix: String,
    },

    /// Writer: the full record name does not fit the 16-bit name length.
    #[error("record name {name:?} is {len} bytes long, more than 65535")]
    NameTooLong {
        /// Name without prefix.
        name: String,
        /// Length of the full name in bytes.
        len: usize,
    },

    /// Writer: the alignment is 0 or larger than [`MAX_ALIGNMENT`].
    #[error("invalid alignment {alignment}: must be between 1 and {MAX_ALIGNMENT}")]
    InvalidAlignment {
        /// The alignment asked for.
        alignment: u64,
    },

    /// Writer: the archive would exceed what ZIP64 (or miniz) can describe.
    #[error("archive too large: {what}")]
    TooLarge {
        /// What overflowed.
        what: &'static str,
    },

    /// Writer: an earlier write failed, the output is incomplete and the writer refuses more work.
    #[error("an earlier write failed; the archive is incomplete")]
    Poisoned,

    /// Writer: I/O error from the underlying writer.
    #[error("I/O error writing archive: {0}")]
    Io(#[from] std::io::Error),
}

/// Length of the `Z` padding torch puts into the `FB` extra field of a local header written at
/// `cursor` (offset of the local header) for a record whose full name is `full_name_len` bytes long
/// and whose data is `size` bytes (`detail::getPadding` in `caffe2/serialize/inline_container.cc`).
///
/// The data of that record then starts at
/// `cursor + 30 + full_name_len + zip64_extra_len + 4 + padding`, a multiple of `alignment`.
/// Note the `>=`: a record of exactly `0xFFFF_FFFF` bytes already gets a zip64 extra field.
/// Returns `None` when `alignment` is 0 or the arithmetic overflows.
pub fn padding_len(cursor: u64, full_name_len: u64, size: u64, alignment: u64) -> Option<u64> {
    let header_end = cursor
        .checked_add(LOCAL_HEADER_LEN)?
        .checked_add(full_name_len)?
        .checked_add(4)?
        .checked_add(zip64_local_extra_len(cursor, size))?;
    let rem = header_end.checked_rem(alignment)?;
    Some(if rem == 0 { 0 } else { alignment - rem })
}

/// Where torch's writer puts the data of a record whose local header it writes at `cursor`: after the
/// 30-byte header, the full name, the zip64 extra field if any, and the `FB` padding field that aligns the
/// data to `alignment` ([`padding_len`]). `None` when `alignment` is 0 or the arithmetic overflows.
pub fn torch_data_offset(cursor: u64, full_name_len: u64, size: u64, alignment: u64) -> Option<u64> {
    let pad = padding_len(cursor, full_name_len, size, alignment)?;
    cursor
        .checked_add(LOCAL_HEADER_LEN)?
        .checked_add(full_name_len)?
        .checked_add(zip64_local_extra_len(cursor, size))?
        .checked_add(4)?
        .checked_add(pad)
}

/// Size of the zip64 extra field (header included) miniz puts into a local header at `cursor` for a
/// record of `size` bytes: `[u64 size, u64 compressed size = 0]` when `size >= 0xFFFF_FFFF`,
/// `[u64 local header offset]` when `cursor >= 0xFFFF_FFFF`.
fn zip64_local_extra_len(cursor: u64, size: u64) -> u64 {
    let big_size = size >= U32_SENTINEL;
    let big_offset = cursor >= U32_SENTINEL;
    if !big_size && !big_offset {
        return 0;
    }
    4 + if big_size { 16 } else { 0 } + if big_offset { 8 } else { 0 }
}
