//! [`Durability`]: how durably a save writes, the knobs every writer and commit of this crate takes.

/// How durably a save writes: the one set of knobs every format crate's `WriteOptions` carries as its
/// `durability` field, and the commits of this crate ([`FileOptions`](crate::FileOptions),
/// [`DirOptions`](crate::DirOptions)) take.
///
/// The default is the crash-safe save: everything on. Each knob trades safety for speed on its own:
///
/// | knob | on (default) | off |
/// |---|---|---|
/// | [`sync`](Durability::sync) | `fdatasync` every file and fsync the directories before the save returns | the swap stays atomic for readers, but a power failure may lose the new checkpoint (torch's `sync_files=False`) |
/// | [`checksums`](Durability::checksums) | checksums computed while writing, for `verify --deep`: `ckpt.checksums.json` beside directory formats, the format's own in single files (torch's record CRC-32s, CRC32C in safetensors headers) | none written (torch's `set_crc32_options(False)`) |
/// | [`direct_io`](Durability::direct_io) | `O_DIRECT` for files larger than one buffer, where the file system allows it: the page cache is not filled with a checkpoint nobody reads back | buffered writes |
///
/// ```
/// use ckpt_io::Durability;
/// let scratch = Durability::default().with_sync(false);
/// assert!(!scratch.sync && scratch.checksums && scratch.direct_io);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Durability {
    /// `fdatasync` every file and fsync the directories that name them before the save returns (default
    /// `true`). Off only for scratch output that may be lost.
    pub sync: bool,
    /// Compute checksums while writing (default `true`): the chunk checksums of a directory commit's
    /// `ckpt.checksums.json` ([`DurableWriter::mark`](crate::DurableWriter::mark)), or a single-file format's own checksums.
    pub checksums: bool,
    /// Use `O_DIRECT` for files larger than one buffer where the file system supports it (default
    /// `true`).
    pub direct_io: bool,
}

impl Default for Durability {
    fn default() -> Self {
        Durability { sync: true, checksums: true, direct_io: true }
    }
}

impl Durability {
    /// This durability with `fdatasync` on or off ([`Durability::sync`]).
    #[must_use]
    pub fn with_sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }

    /// This durability with checksums on or off ([`Durability::checksums`]).
    #[must_use]
    pub fn with_checksums(mut self, checksums: bool) -> Self {
        self.checksums = checksums;
        self
    }

    /// This durability with `O_DIRECT` allowed or not ([`Durability::direct_io`]).
    #[must_use]
    pub fn with_direct_io(mut self, direct_io: bool) -> Self {
        self.direct_io = direct_io;
        self
    }
}
