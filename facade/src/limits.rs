//! Per-call resource limits of the readers ([`ReadLimits`]): what a file may make a reader allocate or
//! parse, for [`crate::open_with`], [`crate::verify_with`], [`crate::convert`] and [`crate::reshard_with`].

/// Default of [`ReadLimits::max_header_bytes`]: 100 MB, the safetensors crate's own bound.
pub const DEFAULT_MAX_HEADER_BYTES: u64 = 100_000_000;
/// Default of [`ReadLimits::max_data_header_bytes`]: 100 MB, as safetensors (and `ckpt_recis::MAX_HEADER_LEN`).
pub const DEFAULT_MAX_DATA_HEADER_BYTES: u64 = 100_000_000;
/// Default of [`ReadLimits::max_metadata_bytes`]: 1 GiB (`ckpt_distcp::DEFAULT_MAX_METADATA_BYTES`).
pub const DEFAULT_MAX_METADATA_BYTES: u64 = 1 << 30;
/// Default of [`ReadLimits::max_inflated_bytes`]: 1 GiB (`ckpt_distcp::ReadOptions::max_object_bytes`).
pub const DEFAULT_MAX_INFLATED_BYTES: u64 = 1 << 30;

/// The resource limits of one read: the pickle decoder's and the formats' size caps. Each bound, once
/// exceeded, is its own error of [`Fault::Limit`](ckpt_tensor::Fault::Limit) naming what exceeded it; raise
/// a bound for large input you trust.
///
/// | field | bounds | error |
/// |---|---|---|
/// | `pickle` (feature `torch`) | every pickle: `torch.save` files, DCP `.metadata` and items, hfai parts, RecIS `.pt` files, PBG optimizer blobs | `ckpt::pickle::Error` |
/// | [`max_header_bytes`](ReadLimits::max_header_bytes) | the JSON header of a safetensors file (single files, hf shards, DCP's HF layout), checked before it is parsed | [`Error::LimitExceeded`](crate::Error::LimitExceeded) |
/// | [`max_data_header_bytes`](ReadLimits::max_data_header_bytes) | the JSON header of a RecIS data file | `ckpt::recis::Error::HeaderTooLarge` |
/// | [`max_metadata_bytes`](ReadLimits::max_metadata_bytes) | a DCP `.metadata` file, before it is read | `ckpt::distcp::Error::MetadataTooLarge` |
/// | [`max_inflated_bytes`](ReadLimits::max_inflated_bytes) | what a zstd-compressed DCP item other than a tensor inflates to | `ckpt::distcp::Error::DecompressedTooLarge` |
///
/// ```
/// # use ckpt::tensor::{Tensor, Value};
/// # let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("m.safetensors");
/// # let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
/// # ckpt::convert(&{ let p = dir.path().join("m.pt"); ckpt::torch::save(&sd, &p, &Default::default()).unwrap(); p }, None, &path, ckpt::Format::Safetensors, &Default::default()).unwrap();
/// let tight = ckpt::ReadLimits::default().with_max_header_bytes(16);
/// let err = ckpt::open_with(&path, &tight).err().unwrap();
/// assert!(matches!(err, ckpt::Error::LimitExceeded { limit: "max_header_bytes", .. }));
/// assert!(ckpt::open_with(&path, &ckpt::ReadLimits::default()).is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadLimits {
    /// The pickle decoder's limits (nesting depth, memo, container lengths, nodes, bytes, integer digits).
    /// Default: [`ckpt_pickle::Limits::BUILTIN`].
    #[cfg(feature = "torch")]
    pub pickle: ckpt_pickle::Limits,
    /// The largest safetensors header, in bytes ([`DEFAULT_MAX_HEADER_BYTES`]). A lower value is checked by
    /// ckpt before parsing; a higher one does not lift the `safetensors` crate's own, fixed 100 MB bound,
    /// which its parser still applies.
    pub max_header_bytes: u64,
    /// The largest RecIS data-file header, in bytes ([`DEFAULT_MAX_DATA_HEADER_BYTES`]).
    pub max_data_header_bytes: u64,
    /// The largest DCP `.metadata` file (or `__<rank>.metadata` part), in bytes ([`DEFAULT_MAX_METADATA_BYTES`]).
    pub max_metadata_bytes: u64,
    /// The largest size a zstd-compressed non-tensor DCP item may inflate to, in bytes
    /// ([`DEFAULT_MAX_INFLATED_BYTES`]; tensor items are bounded by their chunk's size).
    pub max_inflated_bytes: u64,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            #[cfg(feature = "torch")]
            pickle: ckpt_pickle::Limits::default(),
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_data_header_bytes: DEFAULT_MAX_DATA_HEADER_BYTES,
            max_metadata_bytes: DEFAULT_MAX_METADATA_BYTES,
            max_inflated_bytes: DEFAULT_MAX_INFLATED_BYTES,
        }
    }
}

impl ReadLimits {
    /// With the pickle decoder's `limits`.
    #[cfg(feature = "torch")]
    #[must_use]
    pub fn with_pickle(mut self, limits: ckpt_pickle::Limits) -> Self {
        self.pickle = limits;
        self
    }

    /// With [`ReadLimits::max_header_bytes`].
    #[must_use]
    pub fn with_max_header_bytes(mut self, bytes: u64) -> Self {
        self.max_header_bytes = bytes;
        self
    }

    /// With [`ReadLimits::max_data_header_bytes`].
    #[must_use]
    pub fn with_max_data_header_bytes(mut self, bytes: u64) -> Self {
        self.max_data_header_bytes = bytes;
        self
    }

    /// With [`ReadLimits::max_metadata_bytes`].
    #[must_use]
    pub fn with_max_metadata_bytes(mut self, bytes: u64) -> Self {
        self.max_metadata_bytes = bytes;
        self
    }

    /// With [`ReadLimits::max_inflated_bytes`].
    #[must_use]
    pub fn with_max_inflated_bytes(mut self, bytes: u64) -> Self {
        self.max_inflated_bytes = bytes;
        self
    }
}
