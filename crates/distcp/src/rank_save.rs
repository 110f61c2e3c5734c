//! One rank's part of a save driven by `torch.distributed.checkpoint` itself: DCP's planner decides the
//! items and exchanges plans and write results between the ranks; ckpt writes each rank's data file
//! durably and commits the checkpoint, with the commit steps of [`ckpt_io::DirCommit`] in the order DCP's
//! own calls come:
//!
//! | DCP calls (`StorageWriter`)        | here                                                         |
//! |------------------------------------|--------------------------------------------------------------|
//! | `prepare_global_plan` (coordinator) | [`RankSave::begin`]; its [`RankSave::ticket`] goes into every rank's plan |
//! | `write_data` (every rank)           | [`RankSave::join`] (ranks other than 0), [`RankSave::write`], [`RankSave::report`] |
//! | `finish` (coordinator)              | [`RankSave::commit`] with DCP's metadata and every rank's report |
//!
//! Nothing here talks to a process group. Until the commit the destination holds the previous checkpoint,
//! whole; a rank killed at any point leaves it so, and the next save removes what the killed one left.

use std::io::Write;
use std::path::{Path, PathBuf};

use ckpt_io::{CommitError, CommitTicket, DirCommit, SaveReport};
use ckpt_tensor::Tensor;

use crate::error::{Error, Result};
use crate::metadata::{Metadata, StorageInfo, ZSTD_TRANSFORM};
use crate::planner::Payload;
use crate::writer::{WriteOptions, data_file_name, dir_options, from_commit, item_name, save_report, write_item};

/// What one write item holds: a tensor (written as torch writes it, a `torch.save` archive of the tensor)
/// or bytes that are already an item (a BYTE_IO item: torch's own `torch.save` of the object, written as
/// they are).
#[derive(Debug, Clone, Copy)]
pub enum ItemData<'a> {
    /// A tensor or tensor chunk.
    Tensor(&'a Tensor),
    /// The bytes of a BYTE_IO item.
    Bytes(&'a [u8]),
}

/// One item a rank writes: its key, the chunk's offsets for a tensor chunk (they name it in the checksum
/// manifest), and its data.
#[derive(Debug, Clone)]
pub struct RankItem<'a> {
    /// The flattened key (`model.layers.0.weight`).
    pub fqn: String,
    /// The chunk's offsets in the whole tensor (`None` for a whole tensor or a BYTE_IO item).
    pub offsets: Option<Vec<usize>>,
    /// What to write.
    pub data: ItemData<'a>,
}

/// One rank's part of a save whose plans and results travel by other means (see the module docs).
#[derive(Debug)]
pub struct RankSave {
    commit: DirCommit,
    rank: usize,
    dir: PathBuf,
    options: WriteOptions,
    written: std::sync::atomic::AtomicBool,
}

impl RankSave {
    /// On the coordinator (rank 0) of `world_size` ranks: locks `dir`, removes what a killed save left, and
    /// creates the staging directory every rank writes into. Hand [`RankSave::ticket`] to the other ranks.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] when `dir` holds a checkpoint and `options` do not allow overwriting; the
    /// commit's errors (locked, refused destination, I/O).
    pub fn begin(dir: impl AsRef<Path>, world_size: usize, options: &WriteOptions) -> Result<RankSave> {
        let dir = dir.as_ref();
        if world_size == 0 {
            return Err(Error::NoRanks);
        }
        if !options.overwrite && dir.join(".metadata").exists() {
            return Err(Error::AlreadyExists { path: dir.join(".metadata") });
        }
        let commit = DirCommit::prepare(dir, world_size, &dir_options(options)).map_err(from_commit)?;
        Ok(RankSave::new(commit, 0, dir, options))
    }

    /// On rank `rank` (not 0), with the coordinator's ticket: writes go into the same staging directory.
    ///
    /// # Errors
    /// The ticket's errors: unreadable, another destination, a rank outside the save, a staging directory
    /// this rank does not see (the ranks do not share the file system).
    pub fn join(dir: impl AsRef<Path>, ticket: &[u8], rank: usize, options: &WriteOptions) -> Result<RankSave> {
        let dir = dir.as_ref();
        let ticket = CommitTicket::from_bytes(ticket).map_err(from_commit)?;
        let commit = DirCommit::join(dir, &ticket, rank, &dir_options(options)).map_err(from_commit)?;
        Ok(RankSave::new(commit, rank, dir, options))
    }

    fn new(commit: DirCommit, rank: usize, dir: &Path, options: &WriteOptions) -> RankSave {
        RankSave {
            commit,
            rank,
            dir: dir.to_path_buf(),
            options: options.clone(),
            written: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// What the other ranks need to [join](RankSave::join) this save (bytes to put in their plans).
    pub fn ticket(&self) -> Vec<u8> {
        self.commit.ticket().to_bytes()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Writes this rank's items into its data file (`__{rank}_0.distcp`, with the save's id on an object
    /// store), durably (`fdatasync` before it returns, unless the options say not to sync), and returns
    /// where each item lies, in the order given: what DCP's `WriteResult.storage_data` holds. Call it once.
    ///
    /// # Errors
    /// [`Error::Unwritable`] for a second call or an item torch cannot save; I/O errors naming the file.
    pub fn write(&self, items: &[RankItem<'_>]) -> Result<Vec<StorageInfo>> {
        if self.written.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Err(Error::unwritable("", "this rank's items were written already: a RankSave writes once"));
        }
        let name = data_file_name(self.rank, 0, self.commit.save_id());
        let mut file = self.commit.create_file(&name).map_err(from_commit)?;
        let path = file.path().to_path_buf();
        let descriptors = if self.options.zstd_level.is_some() { vec![ZSTD_TRANSFORM.to_owned()] } else { Vec::new() };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let w = file.writer();
            let start = w.position();
            w.mark(item_name(&item.fqn, item.offsets.as_deref()));
            let written = match item.data {
                ItemData::Tensor(t) => write_item(w, &item.fqn, &Payload::Tensor(t), &self.options, &|_| Ok(None)),
                ItemData::Bytes(b) => w.write_all(b).map_err(|e| from_commit(CommitError::from_io(&path, e))),
            };
            if let Some(e) = w.io_error() {
                return Err(from_commit(CommitError::from_io(&path, e)));
            }
            written?;
            let length = file.writer().position() - start;
            out.push(StorageInfo {
                relative_path: name.clone(),
                offset: start,
                length,
                transform_descriptors: descriptors.clone(),
            });
        }
        file.finish().map_err(from_commit)?;
        Ok(out)
    }

    /// This rank's report for the coordinator (`own`: whether it wrote its items; why not, if it did not),
    /// to travel with its write results. After it, the rank writes nothing more.
    ///
    /// # Errors
    /// For an object store, the upload of what this rank wrote by path.
    pub fn report(&self, own: std::result::Result<(), ckpt_io::RankFailure>) -> Result<Vec<u8>> {
        self.commit.report(own.map(|()| Vec::new())).map_err(from_commit)
    }

    /// On the coordinator, with every rank's report (rank order): writes `.metadata` (DCP's `metadata`, whose
    /// `storage_data` says where every item lies, encoded in the options' profile), then swaps the new
    /// checkpoint in (or commits it on the object store). Returns the save's report.
    ///
    /// # Errors
    /// [`Error::RankFailed`] naming the first rank that reported a failure; the commit's errors. On any
    /// error the staging directory is removed and the previous checkpoint stays.
    pub fn commit(self, metadata: &Metadata, reports: Vec<Vec<u8>>) -> Result<SaveReport> {
        let profile = self.options.profile;
        let dir = self.dir.clone();
        let bytes = metadata.to_pickle(profile)?;
        self.commit
            .commit_reports(reports, |c, _| {
                let mut f = c.create_file(".metadata")?;
                f.writer().mark(".metadata");
                f.writer().write_all(&bytes).map_err(|e| CommitError::from_io(f.path(), e))?;
                f.finish().map(|_| ())
            })
            .map_err(from_commit)?;
        Ok(save_report(metadata, &dir))
    }

    /// Gives the save up (on the coordinator: removes the staging directory and releases the lock), once no
    /// rank writes any more. The previous checkpoint stays.
    pub fn abort(self) {
        self.commit.abort();
    }
}
