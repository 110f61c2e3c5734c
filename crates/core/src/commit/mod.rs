//! The durable commit path: how every ckpt writer puts a checkpoint on disk so that a crash at any
//! instant leaves the previous checkpoint or the new one, whole, and never costs more than the disk's own
//! speed.
//!
//! - [`FileCommit`] / [`write_file`]: one file. Temporary file beside the destination, written by a
//!   [`DurableWriter`], `fdatasync`, rename over the destination, fsync of the directory; the replaced
//!   file is freed on a background thread.
//! - [`DirCommit`]: a directory format (distcp, hfai, recis, PBG as converted, Hugging Face shards). The
//!   whole directory is staged beside the destination — every rank of a [`Collective`](crate::Collective)
//!   writes its own files into it — and rank 0 swaps it in with `renameat2(RENAME_EXCHANGE)` after a
//!   gather; every rank learns the outcome.
//! - [`DestinationLock`]: an advisory lock per destination; a second writer gets [`CommitError::Locked`]
//!   naming the holder.
//! - [`checksum`]: the `ckpt.checksums.json` manifest (CRC-32 per named byte range), computed while
//!   writing, merged across ranks, verified by readers.
//! - [`failpoint`]: named points at every step, for crash tests (`CKPT_FAILPOINT`).
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
//! fsync'd before the save returns. Turning syncing off ([`WriterOptions::sync`]) keeps the swap atomic for
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
//! The writers still on [`crate::atomic`] (per-file atomic renames inside the destination) move over so:
//!
//! - **hfai** (`save`, `save_rank`): `DirCommit::begin(dir, group)`; each rank writes `PART_{rank:03}.pt`
//!   with `create_file` and `ckpt_torch::save_to_writer` (marking each record); `finish_collective`'s
//!   report exchange becomes the `own` outcome of `commit` (its fingerprint check runs in `finalize` on the
//!   staged files); stale wider parts disappear with the old directory, so `remove_stale_parts` goes;
//!   `owned`: `PART_*.pt` and the manifest.
//! - **recis** (`CheckpointManager::save`, `writer::save`): the manager's own `.<id>.tmp` staging and
//!   rename become `DirCommit` on `<root>/<id>` (the exchange replaces its rename-away-then-rename), with
//!   `index`, `tensorkey.json` and the torch-rank JSON written in `finalize`; the `checkpoint` list stays a
//!   [`FileCommit`] after the swap (the format's own commit point).
//! - **PBG as converted** (facade conversions into a fresh directory): `DirCommit` on the output
//!   directory. PBG's in-place training protocol (`crates/pbg/src/commit.rs`: versioned files, the version
//!   file as commit point) stays, with its per-file writes moved to [`FileCommit`] (lock, `O_DIRECT`,
//!   classified errors) through [`crate::atomic`], which it already uses.
//! - **Hugging Face shards** (`ckpt_distcp::hf`, facade exports): `DirCommit` on the output directory with
//!   `model.safetensors.index.json` written in `finalize`, `owned` = `*.safetensors` and the index.
//! - **facade conversions and reshards**: nothing of their own; they get the protocol through the format
//!   writers they call. A reshard in place (source = destination) becomes safe for free: the staging
//!   directory is written while the source is still whole.

pub mod checksum;
mod dir;
mod error;
pub mod failpoint;
mod file;
mod lock;
mod release;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};

pub use checksum::{ChunkDigest, FileDigest, MANIFEST_NAME, Manifest, Mismatch};
pub use dir::{DirCommit, DirOptions, StagedFile, recover};
pub use error::CommitError;
pub use file::{FileCommit, FileOptions, write_file};
pub use lock::DestinationLock;
pub use release::wait_for_releases;
pub use writer::{CHUNK, DurableWriter, WriterOptions};

/// `.<name>.<suffix>` beside `target`.
pub(crate) fn sibling(target: &Path, suffix: &str) -> Result<PathBuf, CommitError> {
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
