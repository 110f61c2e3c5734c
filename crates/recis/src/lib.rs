//! Read, write and reshard RecIS sparse hash-table and dense checkpoints.
