//! The unit of writing: [`CHUNK`], the size of a write buffer and of each write handed to the kernel, and the
//! span each chunk checksum covers.

/// Size of one write buffer, and of each write handed to the kernel.
pub const CHUNK: usize = 8 << 20;
