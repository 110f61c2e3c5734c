//! The durable commit path: how every ckpt writer puts a checkpoint on disk so that a crash at any
//! instant leaves the previous checkpoint or the new one, whole, and never costs more than the disk's own
//! speed (and, feature `remote`, on an object store, where readers see a checkpoint whole or not at all);
//! and what a write or a check of one reports.
//!
//! - [`FileCommit`] / [`write_file`]: one file. Temporary file beside the destination, written by a
//!   [`DurableWriter`], `fdatasync`, rename over the destination, fsync of the directory; the replaced
//!   file is freed on a background thread.
//! - [`DirCommit`]: a directory format (distcp, hfai, recis, PBG as converted, Hugging Face shards). The
//!   whole directory is staged beside the destination — every rank of a [`Collective`](ckpt_collective::Collective)
//!   writes its own files into it — and rank 0 swaps it in with `renameat2(RENAME_EXCHANGE)` after a
//!   gather; every rank learns the outcome.
//! - [`DestinationLock`]: an advisory lock per destination; a second writer gets [`CommitError::Locked`]
//!   naming the holder.
//! - [`checksum`]: the `ckpt.checksums.json` manifest (CRC-32 per named byte range), computed while
//!   writing, merged across ranks, verified by readers.
//! - [`failpoint`]: named points at every step, for crash tests (`CKPT_FAILPOINT`).
//! - [`unfinished`]: what a save that never committed left (a killed rank): which ranks finished their
//!   files (markers in the staging directory: `.ckpt-save.json` from rank 0, `.ckpt-rank-<r>.done` from each
//!   rank whose files are durable; removed before the commit).
//! - [`report`]: the reports of one shape every format crate returns: [`SaveReport`] (the files a save
//!   wrote, its tensors, bytes and values), [`VerifyReport`] with structured [`Problem`]s (what rule, which
//!   file and entry), [`ReshardReport`].
//! - [`storage`]: where checkpoints live: a local path or an object-store URL ([`storage::Location`]),
//!   and with the `remote` feature the stores by URL scheme (S3, GCS, Azure, HTTP), ranged reads,
//!   multipart uploads, conditional writes, and how a checkpoint commits on an object store.
//! - [`CommitError`]: disk full, read-only, permission denied, locked — matchable, with the OS error as
//!   the source.
//!
//! # Names beside a destination `<dir>/<name>`
//!
//! | name | what | after a crash |
//! |---|---|---|
//! | `.<name>.ckpt-lock` | the advisory lock file (removed on release) | reused by the next save |
//! | `.<name>.ckpt-tmp` | a file commit's temporary file | removed by the next save |
//! | `.<name>.ckpt-staging` | a directory commit's staging directory | removed by the next save |
//! | `.<name>.ckpt-ready` | fallback swap only: the complete new copy | renamed into place if the destination is missing |
//! | `.<name>.ckpt-old` | the replaced copy being removed | removed, or renamed back if the destination is missing |
//!
//! All start with `.` and carry `ckpt-`: no reader takes them for a checkpoint.
//!
//! # Durability
//! Data is `fdatasync`'d before the rename that publishes it, and the directory holding the new name is
//! fsync'd before the save returns. Turning syncing off ([`Durability::sync`]) keeps the swap atomic for
//! readers but lets a power failure lose the new data; the default never turns it off.
//!
//! # How a writer adopts it
//! A single-file format calls [`write_file`] with a closure that serialises into the [`DurableWriter`]
//! (any `std::io::Write` serialiser works; large slices go to the kernel without a staging copy in
//! buffered mode, and through reused aligned buffers with `O_DIRECT`). A directory format calls
//! [`DirCommit::begin`] on every rank, writes each of the rank's files with [`DirCommit::create_file`]
//! (calling [`DurableWriter::mark`] at each item boundary when checksums are on), and ends with
//! [`DirCommit::commit`], passing rank 0's metadata writer as the `finalize` closure. A failure the format
//! finds in its own exchanges (after every rank stopped writing) ends with [`DirCommit::abort`]. `ckpt-distcp`'s
//! writer is the reference (`crates/distcp/src/writer.rs`).
//!
//! Every directory writer commits through [`DirCommit`]: distcp, hfai (`save`, `save_rank`, `reshard`: the
//! completion check runs in `finalize` on the staged parts), RecIS (every save; the manager's `checkpoint`
//! list, rewritten after the swap, stays the format's own commit point) and `ckpt_pbg::save` (libhdf5
//! writes by path into the staging directory; [`DirCommit::record_file`] reads each file back for the
//! manifest). PBG's in-place training protocol (`ckpt_pbg::Commit`: versioned files, the version file as
//! commit point) stays, holding the [`DestinationLock`]. Hugging Face shards (`ckpt-safetensors`' `hf`,
//! which `ckpt_distcp::convert::dcp_to_hf` writes through too) commit their directory the same way. Single
//! files (`torch.save`, safetensors, DCP's conversions to one file) go through [`write_file`]. Facade
//! conversions and reshards get the protocol through the format writers they call.
//!
//! Readers that open a directory's files one by one pin it ([`PinnedDir`]) so that a swap never hands
//! them two generations: the DCP reader opens every file relative to the pinned directory, the hfai and
//! RecIS readers read again when the path names another directory after they are done.

pub mod checksum;
mod chunk;
mod dir;
#[cfg(feature = "remote")]
mod dir_remote;
mod durability;
mod error;
pub mod failpoint;
mod file;
mod lock;
mod part_writer;
mod pinned;
mod release;
pub mod report;
pub mod storage;
mod unfinished;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};

pub use checksum::{Algorithm, ChunkDigest, FileDigest, MANIFEST_NAME, Manifest, ManifestError, Mismatch};
pub use chunk::CHUNK;
pub use dir::{CommitTicket, DirCommit, DirOptions, StagedFile, overwrite_staging, recover, replace_whole};
pub use durability::Durability;
pub use error::{CommitError, RankFailure, TicketRule};
pub use file::{FileCommit, FileOptions, write_file};
pub use lock::DestinationLock;
pub use part_writer::PartSink;
pub use pinned::PinnedDir;
pub use release::wait_for_releases;
pub use report::{Problem, ProblemKind, ReshardReport, SaveReport, Severity, VerifyReport};
pub use unfinished::{Unfinished, unfinished};
pub use writer::{DurableWriter, bytes_written, release_idle_buffers};

/// The files of the directory `dir` whose names `owned` claims (a format's names, as
/// [`DirOptions::owned`] takes them), in name order: what a save that committed `dir` reports as written.
/// A directory that cannot be listed has none.
pub fn owned_files(dir: &Path, owned: fn(&str) -> bool) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()) && e.file_name().to_str().is_some_and(owned))
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// `.<name>.<suffix>` beside `target`: the names this crate gives its lock, temporary and staging files
/// (`ckpt-lock`, `ckpt-tmp`, `ckpt-staging`; the module documentation's table), which no reader takes for a
/// checkpoint.
///
/// # Errors
/// [`CommitError::Refused`] when `target` has no file name.
pub fn sibling(target: &Path, suffix: &str) -> Result<PathBuf, CommitError> {
    let name = target.file_name().ok_or_else(|| CommitError::Refused {
        path: target.to_path_buf(),
        reason: "has no file name to save under".into(),
    })?;
    let mut n = std::ffi::OsString::from(".");
    n.push(name);
    n.push(".");
    n.push(suffix);
    Ok(target.with_file_name(n))
}

/// fsyncs a directory so the renames and creations inside it are durable.
///
/// # Errors
/// The classified I/O error, naming the directory.
pub fn sync_dir(dir: &Path) -> Result<(), CommitError> {
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| CommitError::from_io(dir, e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn sibling_names() {
        assert_eq!(sibling(Path::new("/a/b/m.pt"), "ckpt-tmp").unwrap(), Path::new("/a/b/.m.pt.ckpt-tmp"));
        assert_eq!(sibling(Path::new("ck/"), "ckpt-staging").unwrap(), Path::new(".ck.ckpt-staging"));
        assert!(matches!(sibling(Path::new("/"), "x"), Err(CommitError::Refused { .. })));
        sync_dir(Path::new("")).unwrap();
    }
}
