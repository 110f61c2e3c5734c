//! Errors of the RecIS checkpoint codec: one variant per rule, each naming the file or block and saying what
//! was expected and what was found.

use std::path::PathBuf;

use ckpt_tensor::Fault;
use ckpt_tensor::FormatError;

/// What went wrong reading, writing or resharding a RecIS checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O error on a path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file the checkpoint needs is not there (`index`, `tensorkey.json`, `io_state_count`, ...).
    #[error("{}: missing; {what}", path.display())]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
        /// Why it is needed.
        what: &'static str,
    },
    /// `index` names a data file that does not exist.
    #[error("{}: the index names data file {file:?} (file id {file_id}), which does not exist", index.display())]
    MissingDataFile {
        /// The `index` file.
        index: PathBuf,
        /// The data file's name.
        file: String,
        /// Its id in `file_index`.
        file_id: u64,
    },
    /// A JSON file (`index`, `tensorkey.json`, a data-file header) is not valid JSON.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error: serde_json's (with line and column), or the UTF-8 decoder's.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// `index` is JSON, but not `{"block_index": {key: file id}, "file_index": {file name: file id}}`.
    #[error("{}: not a RecIS index: {rule}", path.display())]
    BadIndex {
        /// The `index` file.
        path: PathBuf,
        /// The rule it breaks.
        rule: IndexRule,
    },
    /// `index` is a newline-separated list of data files: the pre-`tensorkey.json` ("v1") layout.
    #[error(
        "{}: this is a legacy (v1) RecIS index, a list of data-file paths; only the current layout with \
         tensorkey.json is supported (convert it with RecIS's convert_v1_to_v2 first)",
        path.display()
    )]
    LegacyIndex {
        /// The `index` file.
        path: PathBuf,
    },
    /// `tensorkey.json` is JSON, but not an object of strings.
    #[error("{}: not a RecIS tensorkey.json: {rule}", path.display())]
    BadTensorKey {
        /// The file.
        path: PathBuf,
        /// The rule it breaks.
        rule: TensorKeyRule,
    },
    /// A block of `index` refers to a file id that `file_index` does not define.
    #[error("block {key:?} is in file id {file_id}, which file_index does not define")]
    UnknownFileId {
        /// The on-disk block key.
        key: String,
        /// The file id.
        file_id: u64,
    },
    /// Two data files share a file id in `file_index`.
    #[error("file_index gives id {file_id} to both {first:?} and {second:?}")]
    DuplicateFileId {
        /// The id.
        file_id: u64,
        /// One file.
        first: String,
        /// The other.
        second: String,
    },
    /// An internal block name has no `^` separating the tensor name from the slice string.
    #[error("block {key:?}: internal block name {name:?} is not `tensor^slice` (expected exactly one `^`)")]
    BlockNameWithoutCaret {
        /// The on-disk key.
        key: String,
        /// The internal block name (after `tensorkey.json`).
        name: String,
    },
    /// A slice string is not `begin@end@size` with `0 <= begin <= end <= size`, `0 < size <= i32::MAX`.
    #[error("slice string {slice:?}: {rule}")]
    BadSlice {
        /// The slice string.
        slice: String,
        /// The rule it breaks.
        rule: SliceRule,
    },
    /// A name cannot be used: a sparse tensor name without `child@slot`, a name containing `^`, ...
    #[error("name {name:?}: {rule}")]
    BadName {
        /// The name.
        name: String,
        /// The rule it breaks.
        rule: NameRule,
    },
    /// A data file is shorter than its 8-byte header length.
    #[error("{}: {len} bytes, too short for the 8-byte header length", path.display())]
    FileTooShort {
        /// The data file.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// A data file's header length points past the end of the file.
    #[error("{}: header length {header_len} runs past the end of the {file_len}-byte file", path.display())]
    HeaderPastEnd {
        /// The data file.
        path: PathBuf,
        /// The header length read from the first 8 bytes.
        header_len: u64,
        /// The file's length.
        file_len: usize,
    },
    /// A data file's header length is over the limit (100 MB by default, as in safetensors; `DataFile::open_with`).
    #[error("{}: header length {header_len} exceeds the limit of {limit} bytes", path.display())]
    HeaderTooLarge {
        /// The data file.
        path: PathBuf,
        /// The header length.
        header_len: u64,
        /// The limit.
        limit: u64,
    },
    /// A data file's header is JSON but not a map of `{dtype, shape, data_offsets}` entries.
    #[error("{}: bad header: {reason}", path.display())]
    BadHeader {
        /// The data file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A block's dtype string is not one RecIS (or safetensors) defines.
    #[error("{}: block {key:?} has unknown dtype {dtype:?}", path.display())]
    UnknownDtype {
        /// The data file.
        path: PathBuf,
        /// The block key.
        key: String,
        /// The dtype string.
        dtype: String,
    },
    /// A block's `data_offsets` do not match its dtype and shape, overlap another block, leave a gap, or run
    /// past the data region.
    #[error("{}: block {key:?}: {reason}", path.display())]
    BadOffsets {
        /// The data file.
        path: PathBuf,
        /// The block key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// `index` places a block in a data file whose header does not list it.
    #[error("{}: the index places block {key:?} here, but the file's header does not list it", path.display())]
    BlockNotInFile {
        /// The data file.
        path: PathBuf,
        /// The block key.
        key: String,
    },
    /// Two blocks have the same key or the same internal name (two shards writing one table slice).
    #[error("block {key:?} is defined twice ({detail})")]
    DuplicateBlock {
        /// The key or internal block name.
        key: String,
        /// Where.
        detail: String,
    },
    /// A table's id block and one of its slot blocks (or an id list and a slot given by the caller) have
    /// different row counts.
    #[error("table {child:?} slice {slice}: {ids} ids but slot {slot:?} has {rows} rows")]
    RowCountMismatch {
        /// The child table.
        child: String,
        /// The slice string.
        slice: String,
        /// Number of ids.
        ids: usize,
        /// The slot.
        slot: String,
        /// Its row count.
        rows: usize,
    },
    /// A table slice has slot blocks but no `id` block.
    #[error("table {child:?} slice {slice}: slot blocks without an `{child}@id` block")]
    MissingIdBlock {
        /// The child table.
        child: String,
        /// The slice string.
        slice: String,
    },
    /// A table slice has an `id` block but no slot block (RecIS's loader rejects this too).
    #[error("table {child:?} slice {slice}: an id block without any slot block")]
    NoSlotBlocks {
        /// The child table.
        child: String,
        /// The slice string.
        slice: String,
    },
    /// An id block is not a 1-D int64 tensor.
    #[error("table {child:?} slice {slice}: the id block is {dtype} {shape:?}, expected a 1-D int64 tensor")]
    BadIdBlock {
        /// The child table.
        child: String,
        /// The slice string.
        slice: String,
        /// Its dtype.
        dtype: ckpt_tensor::DType,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A slot's dtype or row shape differs between slices of one table, or is not what the caller expects.
    #[error("table {child:?} slot {slot:?}: {rule}")]
    SlotMismatch {
        /// The child table.
        child: String,
        /// The slot.
        slot: String,
        /// What differs.
        rule: SlotRule,
    },
    /// An id occurs twice in one table.
    #[error("table {child:?}: id {id} occurs more than once")]
    DuplicateId {
        /// The child table.
        child: String,
        /// The id.
        id: i64,
    },
    /// A coalesced id names a child index the table does not have.
    #[error("coalesced id {encoded:#x} has child index {index}, but the table has {children} children")]
    BadChildIndex {
        /// The encoded id.
        encoded: i64,
        /// The child index in its top 12 bits.
        index: usize,
        /// Number of children.
        children: usize,
    },
    /// A table's slices do not share one `slice_size`, or it differs from the one asked for.
    #[error("table {child:?}: slice_size {found} where {expected} is needed (RecIS skips such blocks silently)")]
    SliceSizeMismatch {
        /// The child table.
        child: String,
        /// The slice size needed.
        expected: u32,
        /// The slice size found.
        found: u32,
    },
    /// The checkpoint has no tensor, table or entry by that name.
    #[error("no {what} named {name:?} in the checkpoint")]
    NotFound {
        /// What was looked for (`tensor`, `table`, `entry`, ...).
        what: &'static str,
        /// The name.
        name: String,
    },
    /// RecIS cannot write (or read back) a tensor of this dtype.
    #[error("{name:?}: RecIS cannot store dtype {dtype} (only float64/32/16, bfloat16, int64/32/16/8, uint8, bool)")]
    UnsupportedDtype {
        /// The tensor.
        name: String,
        /// Its dtype.
        dtype: ckpt_tensor::DType,
    },
    /// A state dict given to [`crate::save`] that cannot be laid out as a RecIS checkpoint.
    #[error("{reason}")]
    StateDict {
        /// Why.
        reason: String,
    },
    /// A shard index that is not below the shard count (or a shard count of 0).
    #[error("invalid argument: shard index {index} must be below the shard count {num}")]
    BadShard {
        /// The shard index.
        index: usize,
        /// The shard count.
        num: usize,
    },
    /// A slice bound of a shard that does not fit `u32`.
    #[error("invalid argument: slice bound {bound}")]
    SliceBoundTooLarge {
        /// The bound.
        bound: u64,
    },
    /// A save or reshard into 0 shards.
    #[error("invalid argument: {action} 0 shards")]
    ZeroShards {
        /// What was asked (`writing`, `resharding into`).
        action: &'static str,
    },
    /// An entry asked for as a tensor that is not one.
    #[error("invalid argument: entry {name:?} is not a tensor")]
    NotATensor {
        /// The entry's name.
        name: String,
    },
    /// A slot of a 0-dim tensor, which has no rows.
    #[error("invalid argument: slot {slot:?}: a 0-dim tensor has no rows")]
    ScalarSlot {
        /// The slot's name.
        slot: String,
    },
    /// A row index past the end of a slot.
    #[error("invalid argument: row {row} of slot {slot:?} with {rows} rows")]
    RowOutOfRange {
        /// The slot's name.
        slot: String,
        /// The row asked for.
        row: usize,
        /// The slot's rows.
        rows: usize,
    },
    /// A gather whose byte count overflows `usize`.
    #[error("invalid argument: {rows} rows of slot {slot:?} overflow")]
    GatherOverflow {
        /// The slot's name.
        slot: String,
        /// The rows gathered.
        rows: usize,
    },
    /// A gathered row found outside its slot's bytes when the gather is made.
    #[error("malformed data: row {row} outside its slot of {slot_bytes} bytes")]
    RowOutsideSlot {
        /// The row.
        row: usize,
        /// The slot's bytes.
        slot_bytes: usize,
    },
    /// A byte range past the rows of a gather.
    #[error("malformed data: row {row} past the gather")]
    RowPastGather {
        /// The row of the gather.
        row: usize,
    },
    /// A concatenation of nothing.
    #[error("invalid argument: concatenating no {what}")]
    NothingToConcat {
        /// What was to be concatenated (`slots`, `tables`).
        what: &'static str,
    },
    /// A hash table, or a coalesce, with no children or more than [`crate::table::MAX_CHILDREN`].
    #[error("invalid argument: a hash table has 1 to {max} children, not {count}")]
    ChildCount {
        /// The children given.
        count: usize,
        /// The most children a table has.
        max: usize,
    },
    /// Table ids that are not a 1-D int64 tensor.
    #[error("invalid argument: table {table:?}: ids must be a 1-D int64 tensor, got {dtype} {shape:?}")]
    BadIds {
        /// The table's name.
        table: String,
        /// The ids' dtype.
        dtype: ckpt_tensor::DType,
        /// The ids' shape.
        shape: Vec<usize>,
    },
    /// A `parallel` of 0 files per shard.
    #[error("invalid argument: parallel must be at least 1")]
    ZeroParallel,
    /// More data files than `usize` counts.
    #[error("invalid argument: {parallel} files for each of {shards} shards")]
    TooManyFiles {
        /// The files per shard.
        parallel: usize,
        /// The shards.
        shards: usize,
    },
    /// Another shard of a multi-shard save failed.
    #[error("shard {shard} failed: {message}")]
    ShardFailed {
        /// The shard that failed.
        shard: usize,
        /// Its error.
        message: String,
    },
    /// The shards of a multi-shard save disagree or are incomplete.
    #[error("shard metadata: {0}")]
    BadShardMeta(String),
    /// A checkpoint id cannot be used as a directory name or a line of the `checkpoint` list.
    #[error("checkpoint id {id:?}: {reason}")]
    BadCheckpointId {
        /// The id.
        id: String,
        /// Why.
        reason: &'static str,
    },
    /// The `checkpoint` list is missing or empty, so there is no latest checkpoint.
    #[error("{}: no checkpoint is listed", path.display())]
    NoCheckpoint {
        /// The `checkpoint` list file.
        path: PathBuf,
    },
    /// `io_state_count` does not hold a shard count.
    #[error("{}: holds {text:?}, not a shard count", path.display())]
    IoStateCount {
        /// The `io_state_count` file.
        path: PathBuf,
        /// What it holds (lossily decoded).
        text: String,
    },
    /// `io_state_count` differs from the count the caller runs with.
    #[error(
        "{}: io states were saved by {saved} workers; this job has {running} (RecIS cannot reshard io states)",
        path.display()
    )]
    IoStateWorkers {
        /// The `io_state_count` file.
        path: PathBuf,
        /// The workers that saved the io states.
        saved: usize,
        /// The workers of this job.
        running: usize,
    },
    /// A `model.pt` / `extra.pt` / `io_state_*.pt` file could not be read or written.
    #[error(transparent)]
    Torch(#[from] ckpt_torch::Error),
    /// A tensor operation failed (allocation, bad view).
    #[error(transparent)]
    Core(#[from] ckpt_tensor::Error),
}

impl Error {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}

/// `Result` with the RecIS codec's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How `index` breaks its layout ([`Error::BadIndex`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexRule {
    /// The top level is not an object.
    #[error("the top level is not a JSON object")]
    NotAnObject,
    /// A section (`block_index`, `file_index`) is missing or not an object.
    #[error("no `{section}` object")]
    NoSection {
        /// The section.
        section: &'static str,
    },
    /// A section maps a name to something other than a file id.
    #[error("`{section}` maps {key:?} to {value}, not a file id")]
    NotAFileId {
        /// The section.
        section: &'static str,
        /// The name.
        key: String,
        /// The value, as JSON.
        value: String,
    },
    /// A data file name that is not a plain file name in the checkpoint directory.
    #[error("data file name {name:?} is not a plain file name in the checkpoint directory")]
    DataFileName {
        /// The name.
        name: String,
    },
}

/// How `tensorkey.json` breaks its layout ([`Error::BadTensorKey`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorKeyRule {
    /// The top level is not an object.
    #[error("the top level is not a JSON object")]
    NotAnObject,
    /// A key maps to something other than a string.
    #[error("{key:?} maps to {value}, not a string")]
    NotAString {
        /// The key.
        key: String,
        /// The value, as JSON.
        value: String,
    },
}

/// How a slice string breaks `begin@end@size` ([`Error::BadSlice`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SliceRule {
    /// A `slice_size` of 0.
    #[error("slice_size must be positive")]
    SizeZero,
    /// A `slice_size` above `i32::MAX`.
    #[error("slice_size must fit in int32 (RecIS parses it with std::stoi)")]
    SizeTooLarge,
    /// Bounds out of order.
    #[error("expected begin <= end <= size")]
    Order,
    /// Not three `@`-separated parts.
    #[error("expected three `@`-separated numbers begin@end@size")]
    NotThreeNumbers,
    /// A part that is not decimal digits.
    #[error("{token:?} is not a decimal number")]
    NotDecimal {
        /// The part.
        token: String,
    },
    /// A part too large for `u64`.
    #[error("{token:?} is too large")]
    TooLarge {
        /// The part.
        token: String,
    },
    /// A part above `i32::MAX`.
    #[error("{token} does not fit in int32")]
    NotInt32 {
        /// The part.
        token: String,
    },
    /// Parsed bounds out of order, or a size of 0.
    #[error("expected begin <= end <= size and size > 0")]
    Bounds,
}

/// How a slot's slices or places differ ([`Error::SlotMismatch`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SlotRule {
    /// The slot is in one slice of the table and not in another.
    #[error("present in one slice, missing in another")]
    MissingInSlice,
    /// Two places hold rows of another dtype or row shape.
    #[error("{} rows of {:?} in one place, {} rows of {:?} in another", first.0, first.1, second.0, second.1)]
    RowsDiffer {
        /// The dtype and row shape of one place.
        first: (ckpt_tensor::DType, Vec<usize>),
        /// The dtype and row shape of the other.
        second: (ckpt_tensor::DType, Vec<usize>),
    },
    /// A slice whose dtype or shape is not the first slice's rows.
    #[error("slices of {dtype} rows of {row_shape:?} and of {other_dtype} of {other_shape:?}")]
    SlicesDiffer {
        /// The first slice's dtype.
        dtype: ckpt_tensor::DType,
        /// The first slice's row shape.
        row_shape: Vec<usize>,
        /// The other slice's dtype.
        other_dtype: ckpt_tensor::DType,
        /// The other slice's whole shape.
        other_shape: Vec<usize>,
    },
}

/// Why a name cannot be used ([`Error::BadName`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameRule {
    /// A table tensor name that is not `child@slot`.
    #[error("a table tensor name must be `child@slot`")]
    NotChildAtSlot,
    /// An empty name.
    #[error("{what} name is empty")]
    Empty {
        /// What the name names (`table`, `slot`, `tensor`).
        what: &'static str,
    },
    /// A name with `^`.
    #[error("{what} name contains `^`, which separates tensor and slice in RecIS block names")]
    Caret {
        /// What the name names (`table`, `slot`, `tensor`).
        what: &'static str,
    },
    /// A slot name with `@`.
    #[error("slot names may not contain `@`")]
    SlotWithAt,
    /// A slot name with `@`, or the id block's slot `id`.
    #[error("slot names may not contain `@` or be `id` (the id block's slot)")]
    SlotReserved,
    /// A dense name with `/part_`.
    #[error("dense names may not contain `/part_` (RecIS writes such a block under a key it cannot load)")]
    DensePart,
}

impl FormatError for Error {
    /// Who is at fault.
    fn fault(&self) -> Fault {
        match self {
            Error::Io { .. } => Fault::Io,
            Error::Core(c) => c.fault(),
            Error::Torch(t) => t.fault(),
            Error::NotFound { .. }
            | Error::BadName { .. }
            | Error::BadCheckpointId { .. }
            | Error::StateDict { .. }
            | Error::BadShard { .. }
            | Error::SliceBoundTooLarge { .. }
            | Error::ZeroShards { .. }
            | Error::NotATensor { .. }
            | Error::ScalarSlot { .. }
            | Error::RowOutOfRange { .. }
            | Error::GatherOverflow { .. }
            | Error::NothingToConcat { .. }
            | Error::ChildCount { .. }
            | Error::BadIds { .. }
            | Error::ZeroParallel
            | Error::TooManyFiles { .. } => Fault::InvalidArgument,
            Error::UnsupportedDtype { .. } | Error::LegacyIndex { .. } => Fault::Unsupported,
            Error::HeaderTooLarge { .. } => Fault::Limit,
            Error::MissingFile { .. }
            | Error::MissingDataFile { .. }
            | Error::Json { .. }
            | Error::BadIndex { .. }
            | Error::BadTensorKey { .. }
            | Error::UnknownFileId { .. }
            | Error::DuplicateFileId { .. }
            | Error::BlockNameWithoutCaret { .. }
            | Error::BadSlice { .. }
            | Error::FileTooShort { .. }
            | Error::HeaderPastEnd { .. }
            | Error::BadHeader { .. }
            | Error::UnknownDtype { .. }
            | Error::BadOffsets { .. }
            | Error::BlockNotInFile { .. }
            | Error::DuplicateBlock { .. }
            | Error::RowCountMismatch { .. }
            | Error::MissingIdBlock { .. }
            | Error::NoSlotBlocks { .. }
            | Error::BadIdBlock { .. }
            | Error::SlotMismatch { .. }
            | Error::DuplicateId { .. }
            | Error::BadChildIndex { .. }
            | Error::SliceSizeMismatch { .. }
            | Error::RowOutsideSlot { .. }
            | Error::RowPastGather { .. }
            | Error::ShardFailed { .. }
            | Error::BadShardMeta(_)
            | Error::NoCheckpoint { .. }
            | Error::IoStateCount { .. }
            | Error::IoStateWorkers { .. } => Fault::Malformed,
        }
    }

    /// A core error carried through ([`Error::Core`]) is given back as it was.
    fn into_core(self) -> std::result::Result<ckpt_tensor::Error, Self> {
        match self {
            Error::Core(c) => Ok(c),
            e => Err(e),
        }
    }
}

impl From<ckpt_io::CommitError> for Error {
    /// A durable commit's error, as the tensor model holds it ([`Error::Core`]): plain I/O as
    /// `ckpt_tensor::Error::Io`, the rest (disk full, locked, ...) kept whole, found with
    /// `format_error::<ckpt_io::CommitError>()`.
    fn from(e: ckpt_io::CommitError) -> Self {
        Error::Core(e.into())
    }
}
