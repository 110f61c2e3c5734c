//! Resource limits for the decoder.

/// Resource limits enforced by [`decode_with`](crate::decode_with). Every limit fails with
/// [`Error::Limit`](crate::Error::Limit) (or [`Error::DepthExceeded`](crate::Error::DepthExceeded) for the two
/// depth limits) *before* the corresponding memory is allocated.
///
/// The defaults accept anything CPython's pickler writes with default settings for checkpoints of realistic size
/// (a `data.pkl` for a million tensors, a DCP `.metadata` with tens of millions of chunks), while bounding what a
/// hostile file can make the decoder do. Construct with struct-update syntax to change one value:
/// `Limits { max_depth: 200, ..Limits::default() }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Maximum nesting depth of the materialised [`Value`](crate::Value) tree (a scalar at top level has depth 1,
    /// `[1]` has depth 2). Default **1000**, CPython's default recursion limit, which also bounds what CPython
    /// itself can pickle. The decoder itself never recurses, and `Value`'s `Clone`/`PartialEq` do not either,
    /// but dropping a `Value` (and code that walks it recursively, like `Debug`) uses stack per level: this
    /// limit keeps that bounded (1000 levels drop comfortably on a 2 MiB thread stack, even unoptimised).
    pub max_depth: usize,
    /// Maximum number of simultaneously open MARKs. Default **1000** (a legitimate pickle opens at most one MARK
    /// per nesting level). Stops `((((…` inputs from growing the mark stack without bound.
    pub max_mark_depth: usize,
    /// Maximum number of distinct memo keys. Default **1 << 24** (16 Mi; CPython memoizes roughly 10-20 objects
    /// per tensor in a `data.pkl`). Stops memo tables growing without bound; sparse huge keys
    /// (`LONG_BINPUT 0xffffffff`) are stored in a map, so they cost one entry, not 4 Gi.
    pub max_memo: usize,
    /// Maximum number of items in any one container (list, tuple, dict pairs, set, object items), and in the VM
    /// stack. Default **1 << 25** (32 Mi).
    pub max_container_len: usize,
    /// Maximum number of nodes: objects created by the VM (strings, containers, objects, globals) and, separately,
    /// [`Value`](crate::Value)s in the materialised tree, where a memoized object referenced `k` times counts `k`
    /// times, each at its size when it is referenced (an object that grows afterwards is not counted again, so
    /// the same value can count more when a pickle writes a shared object whole before referring to it). Default **1 << 25** (32 Mi values, about 1 GiB of `Value`s). Stops memo bombs (`[x, x]` nested 40
    /// levels deep via BINGET describes 2^40 values in a few hundred bytes): the expanded size is computed on the
    /// shared graph before anything is copied, so such input fails in microseconds.
    pub max_nodes: usize,
    /// Maximum total payload bytes (strings, bytes, big-integer digits, global names), counted both for the VM
    /// (what was read from the input) and for the materialised tree (where a shared 1 MiB string referenced 1000
    /// times counts 1000 MiB). Default **4 GiB** (saturated to `usize::MAX` on 32-bit targets).
    pub max_alloc_bytes: usize,
    /// Maximum number of decimal digits in a protocol-0 INT/LONG text argument. Default **4300**, CPython's
    /// `sys.int_info.default_max_str_digits`. Stops quadratic-time decimal-to-binary conversion.
    pub max_int_digits: usize,
}

impl Default for Limits {
    /// [`Limits::BUILTIN`]. Limits are passed explicitly: a program that trusts its input more (the `ckpt`
    /// command's `--max-*` flags) gives its readers other limits through their options.
    fn default() -> Self {
        Limits::BUILTIN
    }
}

impl Limits {
    /// The built-in defaults (the values documented on each field).
    pub const BUILTIN: Limits = Limits {
        max_depth: 1000,
        max_mark_depth: 1000,
        max_memo: 1 << 24,
        max_container_len: 1 << 25,
        max_nodes: 1 << 25,
        max_alloc_bytes: if usize::BITS >= 64 { 4 << 30 } else { usize::MAX },
        max_int_digits: 4300,
    };

    /// Limits that only guard against crashes (depth, which protects the stack, stays at its default); every
    /// other limit is `usize::MAX`. For trusted input whose size exceeds the defaults.
    #[must_use]
    pub fn trusted() -> Self {
        Limits {
            max_mark_depth: usize::MAX,
            max_memo: usize::MAX,
            max_container_len: usize::MAX,
            max_nodes: usize::MAX,
            max_alloc_bytes: usize::MAX,
            max_int_digits: usize::MAX,
            ..Limits::BUILTIN
        }
    }
}
