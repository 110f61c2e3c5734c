//! The names of the torch-saved files in a RecIS checkpoint directory (beside the data files and the index),
//! which [`crate::dense`] reads and writes and every save lists.

/// The dense model state dict.
pub const MODEL_FILE: &str = "model.pt";
/// The extra state.
pub const EXTRA_FILE: &str = "extra.pt";
/// The io-state shard count.
pub const IO_STATE_COUNT_FILE: &str = "io_state_count";
