//! Read, write and reshard hfai sharded PART_*.pt checkpoints.
