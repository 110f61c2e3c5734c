//! One rank's part of a Hugging Face save driven by another system's planner (`torch.distributed.checkpoint`
//! with `ckpt.dcp.Writer(path, to="hf")`): the coordinator plans the shards from every rank's items
//! ([`layout`], over outlines: tensors of the right dtype and shape without their data), the ranks move the
//! chunks of each shard to the rank that owns it by their own means, and each owner writes its shards durably
//! into one staging directory; the coordinator writes the index and commits. The steps are those of
//! [`ckpt_io::DirCommit`] in separate calls:
//!
//! | DCP calls (`StorageWriter`)         | here                                                          |
//! |-------------------------------------|---------------------------------------------------------------|
//! | `prepare_global_plan` (coordinator) | [`layout`] of every rank's items, [`RankSave::begin`], [`RankSave::shard_names`]; the ticket into every plan |
//! | `write_data` (every rank)           | [`RankSave::join`] (ranks other than 0), [`RankSave::write_shard`] for each owned shard, [`RankSave::report`] |
//! | `finish` (coordinator)              | [`RankSave::commit`] with the index and every rank's report    |
//!
//! The files are those [`crate::hf::save_entries`] writes for the same entries (same shards, names, headers,
//! `__metadata__` and index), so a checkpoint saved from a sharded job equals the conversion of the same
//! state. Nothing here talks to a process group; until the commit the destination holds the previous
//! checkpoint, whole.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ckpt_io::{CommitError, CommitTicket, DirCommit, SaveReport};
use ckpt_tensor::Tensor;

use crate::hf::error::Result;
pub use crate::hf::write::{Layout, layout};
use crate::hf::write::{WriteOptions, dir_options, index_json, shard_file_name};
use crate::metadata::{FORMAT_KEY, FORMAT_PT};

/// One rank's part of a Hugging Face save whose plan and data travel by other means (see the module docs).
#[derive(Debug)]
pub struct RankSave {
    commit: DirCommit,
    rank: usize,
    dir: PathBuf,
    options: WriteOptions,
}

impl RankSave {
    /// On the coordinator (rank 0) of `world_size` ranks: locks `dir`, removes what a killed save left, and
    /// creates the staging directory every rank writes into. Hand [`RankSave::ticket`] to the other ranks.
    ///
    /// # Errors
    /// The commit's errors (locked, refused destination, I/O).
    pub fn begin(dir: impl AsRef<Path>, world_size: usize, options: &WriteOptions) -> Result<RankSave> {
        let dir = dir.as_ref();
        let commit =
            DirCommit::prepare(dir, world_size.max(1), &dir_options(options)).map_err(ckpt_tensor::Error::from)?;
        Ok(RankSave { commit, rank: 0, dir: dir.to_path_buf(), options: options.clone() })
    }

    /// On rank `rank` (not 0), with the coordinator's ticket: its shards go into the same staging directory.
    ///
    /// # Errors
    /// The ticket's errors: unreadable, another destination, a rank outside the save, a staging directory
    /// this rank does not see (the ranks do not share the file system).
    pub fn join(dir: impl AsRef<Path>, ticket: &[u8], rank: usize, options: &WriteOptions) -> Result<RankSave> {
        let dir = dir.as_ref();
        let ticket = CommitTicket::from_bytes(ticket).map_err(ckpt_tensor::Error::from)?;
        let commit = DirCommit::join(dir, &ticket, rank, &dir_options(options)).map_err(ckpt_tensor::Error::from)?;
        Ok(RankSave { commit, rank, dir: dir.to_path_buf(), options: options.clone() })
    }

    /// What the other ranks need to [join](RankSave::join) this save (bytes to put in their plans).
    pub fn ticket(&self) -> Vec<u8> {
        self.commit.ticket().to_bytes()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// On the coordinator: the file names of `n` shards (`model-00001-of-0000n.safetensors`, or
    /// `model.safetensors`; on an object store, a name the previous checkpoint holds takes the save's id, so
    /// that the previous checkpoint stays whole until the new index replaces its own).
    pub fn shard_names(&self, n: usize) -> Vec<String> {
        (0..n).map(|i| shard_file_name(&self.commit, i, n)).collect()
    }

    /// Writes one shard, `file`, holding `tensors` in this order (whole tensors, contiguous or not) and
    /// `records` as its `__metadata__` (the first shard's are the [`Layout::records`]; the others' `None`:
    /// `format = "pt"` alone), durably (`fdatasync` before it returns unless the options say not to sync).
    ///
    /// # Errors
    /// Errors of the tensors' data; I/O errors naming the file.
    pub fn write_shard(
        &self,
        file: &str,
        tensors: &[(String, Tensor)],
        records: Option<HashMap<String, String>>,
    ) -> Result<()> {
        let meta = records.unwrap_or_else(|| HashMap::from([(FORMAT_KEY.to_owned(), FORMAT_PT.to_owned())]));
        let mut staged = self.commit.create_file(file).map_err(ckpt_tensor::Error::from)?;
        let path = staged.path().to_path_buf();
        if self.options.durability.checksums {
            crate::write_checksummed_to(tensors, Some(meta), staged.writer(), &path)?;
        } else {
            crate::write_to(tensors, Some(meta), staged.writer(), &path)?;
        }
        staged.finish().map_err(ckpt_tensor::Error::from)?;
        Ok(())
    }

    /// This rank's report for the coordinator (`own`: whether it wrote its shards; why not, if it did
    /// not), to travel with its write results. After it, the rank writes nothing more.
    ///
    /// # Errors
    /// For an object store, the upload of what this rank wrote by path.
    pub fn report(&self, own: std::result::Result<(), ckpt_io::RankFailure>) -> Result<Vec<u8>> {
        Ok(self.commit.report(own.map(|()| Vec::new())).map_err(ckpt_tensor::Error::from)?)
    }

    /// On the coordinator, with every rank's report (rank order): writes `model.safetensors.index.json`
    /// (`index`: the total size and the weight map, [`Layout::weight_map`]; `None` for a single
    /// `model.safetensors`), then swaps the new checkpoint in (or commits it on the object store).
    /// `files`: the shard names, for the report.
    ///
    /// # Errors
    /// [`ckpt_io::CommitError::RankFailed`] (inside the error) naming the first rank that reported a failure;
    /// the commit's errors. On any error the staging directory is removed and the previous checkpoint stays.
    pub fn commit(
        self,
        index: Option<(u64, &[(&str, String)])>,
        files: &[String],
        reports: Vec<Vec<u8>>,
    ) -> Result<SaveReport> {
        let text = index.map(|(total, map)| index_json(total, map));
        self.commit
            .commit_reports(reports, |c, _| {
                if let Some(text) = &text {
                    let mut f = c.create_file(crate::hf::INDEX_FILE)?;
                    let path = f.path().to_path_buf();
                    f.writer().write_all(text.as_bytes()).map_err(|e| CommitError::from_io(&path, e))?;
                    f.finish()?;
                }
                Ok(())
            })
            .map_err(ckpt_tensor::Error::from)?;
        let mut names: Vec<PathBuf> = files.iter().map(|f| self.dir.join(f)).collect();
        if text.is_some() {
            names.push(self.dir.join(crate::hf::INDEX_FILE));
        }
        Ok(SaveReport::default().with_files(names))
    }

    /// Gives the save up (on the coordinator: removes the staging directory and releases the lock), once no
    /// rank writes any more. The previous checkpoint stays.
    pub fn abort(self) {
        self.commit.abort();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
    use super::*;
    use ckpt_tensor::{CheckpointRead, PathItem, Value};

    fn entry(name: &str, v: Value) -> (String, Vec<PathItem>, Value) {
        (name.to_owned(), vec![PathItem::Key(name.to_owned())], v)
    }

    /// Three ranks save through tickets, each writing the shards it owns: the files equal `save_entries`'s for
    /// the same entries, byte for byte.
    #[test]
    fn ranks_write_what_save_entries_writes() {
        let t = |n: usize, x: f32| Value::Tensor(Tensor::from_slice(&vec![x; n], &[n]).unwrap());
        let entries = [
            entry("a", t(4, 1.0)),
            entry("b", t(8, 2.0)),
            entry("step", Value::Int(7)),
            entry("c", t(2, 3.0)),
            entry("d", t(6, 4.0)),
        ];
        let options = WriteOptions::default().with_max_shard_size(48).with_source("distcp");
        let as_refs = || entries.iter().map(|(n, p, v)| (n.as_str(), p.as_slice(), v));
        let tmp = tempfile::tempdir().unwrap();
        let (one, ranks) = (tmp.path().join("one"), tmp.path().join("ranks"));
        crate::hf::save_entries(as_refs(), &one, &options).unwrap();

        let plan = layout(as_refs(), &options).unwrap();
        assert_eq!(plan.shards.len(), 2);
        let coordinator = RankSave::begin(&ranks, 3, &options).unwrap();
        let names = coordinator.shard_names(plan.shards.len());
        let ticket = coordinator.ticket();
        let others: Vec<RankSave> = (1..3).map(|r| RankSave::join(&ranks, &ticket, r, &options).unwrap()).collect();
        // Shard 0 (with the records) on rank 0, shard 1 on rank 2; rank 1 writes nothing.
        let shard =
            |i: usize| -> Vec<(String, Tensor)> { plan.shards[i].iter().map(|&k| plan.tensors[k].clone()).collect() };
        coordinator.write_shard(&names[0], &shard(0), Some(plan.records.clone())).unwrap();
        others[1].write_shard(&names[1], &shard(1), None).unwrap();
        let mut reports = vec![coordinator.report(Ok(())).unwrap()];
        reports.extend(others.iter().map(|s| s.report(Ok(())).unwrap()));
        let map = plan.weight_map(&names);
        coordinator.commit(Some((plan.total_size(), &map)), &names, reports).unwrap();

        // The same headers (`__metadata__` is a map: its keys' order is not kept) and the same data.
        for f in &names {
            let (a, b) = (std::fs::read(one.join(f)).unwrap(), std::fs::read(ranks.join(f)).unwrap());
            let split = |bytes: &[u8]| {
                let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
                let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
                (header, bytes[8 + n..].to_vec())
            };
            assert_eq!(split(&a), split(&b), "{f}");
        }
        let index = crate::hf::INDEX_FILE;
        assert_eq!(std::fs::read(one.join(index)).unwrap(), std::fs::read(ranks.join(index)).unwrap());
        let back = crate::hf::HfReader::open(&ranks).unwrap();
        assert_eq!(back.value("step").unwrap(), Value::Int(7));
    }

    /// A rank that reports a failure: nothing is committed, the previous checkpoint stays, and the next save
    /// succeeds.
    #[test]
    fn a_failed_rank_keeps_the_previous_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("hf");
        let old = Value::Tensor(Tensor::from_slice(&[1.0f32; 4], &[4]).unwrap());
        crate::hf::save_entries([("w", &[PathItem::Key("w".into())][..], &old)], &dst, &WriteOptions::default())
            .unwrap();
        let options = WriteOptions::default();
        let coordinator = RankSave::begin(&dst, 2, &options).unwrap();
        let other = RankSave::join(&dst, &coordinator.ticket(), 1, &options).unwrap();
        let new = Tensor::from_slice(&[2.0f32; 4], &[4]).unwrap();
        coordinator.write_shard("model.safetensors", &[("w".into(), new)], None).unwrap();
        let reports = vec![
            coordinator.report(Ok(())).unwrap(),
            other.report(Err(ckpt_io::RankFailure::new("out of memory"))).unwrap(),
        ];
        let err = coordinator.commit(None, &["model.safetensors".into()], reports).unwrap_err();
        assert!(err.to_string().contains("out of memory"), "{err}");
        let back = crate::hf::HfReader::open(&dst).unwrap();
        assert_eq!(back.tensor("w").unwrap().to_vec::<f32>().unwrap(), vec![1.0; 4]);
        let again = RankSave::begin(&dst, 1, &options).unwrap();
        again
            .write_shard("model.safetensors", &[("w".into(), Tensor::from_slice(&[3.0f32; 4], &[4]).unwrap())], None)
            .unwrap();
        let reports = vec![again.report(Ok(())).unwrap()];
        again.commit(None, &["model.safetensors".into()], reports).unwrap();
        let back = crate::hf::HfReader::open(&dst).unwrap();
        assert_eq!(back.tensor("w").unwrap().to_vec::<f32>().unwrap(), vec![3.0; 4]);
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }
}
