//! A [`DirCommit`] in separate steps, for a caller whose ranks exchange messages themselves: a training
//! job saving through `torch.distributed.checkpoint`, whose planner scatters plans to every rank and
//! gathers their write results on the coordinator. Nothing here talks to a process group:
//!
//! 1. rank 0 [prepares](DirCommit::prepare) the commit (lock, recovery, staging directory) and hands its
//!    [ticket](DirCommit::ticket) to the others, in the plan it sends them;
//! 2. every other rank [joins](DirCommit::join) with the ticket and writes its files;
//! 3. every rank makes its [report](DirCommit::report) (its outcome and checksums), which travels with its
//!    write results;
//! 4. rank 0 [commits](DirCommit::commit_reports) once it holds every rank's report.
//!
//! A rank that dies at any step leaves the previous checkpoint whole; the next save removes what it left.

use std::fs;
use std::path::{Path, PathBuf};

use super::{DirCommit, DirOptions, prepare};
use crate::error::{CommitError, RankFailure, TicketRule};
use crate::sibling;

/// What a rank needs to join a save that rank 0 [prepared](DirCommit::prepare): the destination, the
/// staging directory, the number of ranks and, for an object-store destination, the save's id. It travels
/// as bytes ([`CommitTicket::to_bytes`], [`CommitTicket::from_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitTicket {
    target: PathBuf,
    staging: PathBuf,
    world: usize,
    save_id: Option<String>,
}

impl CommitTicket {
    /// The ticket as bytes (JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        let json = serde_json::json!({
            "target": self.target.to_string_lossy(),
            "staging": self.staging.to_string_lossy(),
            "world": self.world,
            "save_id": self.save_id,
        });
        json.to_string().into_bytes()
    }

    /// A ticket from [`CommitTicket::to_bytes`]'s bytes.
    ///
    /// # Errors
    /// [`CommitError::TicketUnreadable`] for anything else.
    pub fn from_bytes(bytes: &[u8]) -> Result<CommitTicket, CommitError> {
        let bad = |field: &'static str| CommitError::TicketUnreadable { field };
        let json: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|source| CommitError::TicketNotJson { source })?;
        let text = |key: &'static str| json.get(key).and_then(serde_json::Value::as_str).ok_or_else(|| bad(key));
        let world = json.get("world").and_then(serde_json::Value::as_u64).ok_or_else(|| bad("world"))?;
        let save_id = match json.get("save_id") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(v.as_str().ok_or_else(|| bad("save_id"))?.to_owned()),
        };
        Ok(CommitTicket {
            target: PathBuf::from(text("target")?),
            staging: PathBuf::from(text("staging")?),
            world: usize::try_from(world).map_err(|_| bad("world"))?,
            save_id,
        })
    }

    /// The destination.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// How many ranks write.
    pub fn world_size(&self) -> usize {
        self.world
    }
}

impl DirCommit {
    /// Step 1 on rank 0 of `world_size` ranks, without a process group: as [`DirCommit::begin`] does on
    /// rank 0 (lock, recovery of what a crashed save left, checks, the staging directory). Hand
    /// [`DirCommit::ticket`] to the other ranks.
    ///
    /// # Errors
    /// As [`DirCommit::begin`] on rank 0.
    pub fn prepare(target: &Path, world_size: usize, options: &DirOptions) -> Result<DirCommit, CommitError> {
        if let Some(url) = crate::storage::url_of_path(target)? {
            return Self::prepare_remote(&url, world_size, options);
        }
        let target = match target.file_name() {
            Some(_) => target.to_path_buf(),
            None => fs::canonicalize(target).map_err(crate::error::at(target))?,
        };
        let staging = sibling(&target, "ckpt-staging")?;
        let lock = prepare(&target, &staging, options)?;
        let marker = format!("{{\"world_size\": {world_size}}}");
        fs::write(staging.join(crate::unfinished::SAVE_MARKER), marker).map_err(crate::error::at(&target))?;
        Ok(DirCommit::assembled(target, staging, (0, world_size.max(1)), options, Some(lock)))
    }

    #[cfg(feature = "remote")]
    fn prepare_remote(
        url: &crate::storage::RemoteUrl,
        world_size: usize,
        options: &DirOptions,
    ) -> Result<DirCommit, CommitError> {
        let id = crate::dir_remote::new_save_id();
        let remote = crate::dir_remote::RemoteDir::begin(url, true, options.commit_points, id)?;
        let target = PathBuf::from(url.redacted());
        let mut commit = DirCommit::assembled(target, super::private_dir()?, (0, world_size.max(1)), options, None);
        commit.remote = Some(remote);
        Ok(commit)
    }

    #[cfg(not(feature = "remote"))]
    fn prepare_remote(url: &crate::storage::RemoteUrl, _: usize, _: &DirOptions) -> Result<DirCommit, CommitError> {
        Err(CommitError::Refused { path: PathBuf::from(url.redacted()), reason: crate::storage::NO_REMOTE.into() })
    }

    /// What the other ranks need to [join](DirCommit::join) this save.
    pub fn ticket(&self) -> CommitTicket {
        CommitTicket {
            target: self.target.clone(),
            staging: self.staging.clone(),
            world: self.world,
            save_id: self.save_id().map(str::to_owned),
        }
    }

    /// Step 2 on rank `rank` (not 0) of a save rank 0 prepared: its files then go into the staging directory
    /// (or, for an object store, to their objects). `target` is this rank's own spelling of the destination
    /// (the path or the URL it was given), which must name the ticket's.
    ///
    /// # Errors
    /// [`CommitError::TicketMismatch`] for a ticket of another destination or a rank outside it;
    /// [`CommitError::StagingNotShared`] when this rank does not see rank 0's staging directory (the ranks
    /// do not share the file system).
    pub fn join(
        target: &Path,
        ticket: &CommitTicket,
        rank: usize,
        options: &DirOptions,
    ) -> Result<DirCommit, CommitError> {
        let mismatch = |rule: TicketRule| CommitError::TicketMismatch { path: target.to_path_buf(), rule };
        if rank == 0 || rank >= ticket.world {
            return Err(mismatch(TicketRule::RankOutside { rank, world: ticket.world }));
        }
        if let Some(url) = crate::storage::url_of_path(target)? {
            return Self::join_remote(&url, ticket, rank, options);
        }
        let mine = match target.file_name() {
            Some(_) => target.to_path_buf(),
            None => fs::canonicalize(target).map_err(crate::error::at(target))?,
        };
        let same = mine == ticket.target
            || (fs::canonicalize(parent_or_dot(&mine)).ok().zip(fs::canonicalize(parent_or_dot(&ticket.target)).ok()))
                .is_some_and(|(a, b)| a == b && mine.file_name() == ticket.target.file_name());
        if !same {
            return Err(mismatch(TicketRule::OtherDestination { target: ticket.target.clone() }));
        }
        if !ticket.staging.join(crate::unfinished::SAVE_MARKER).is_file() {
            return Err(CommitError::StagingNotShared { path: ticket.target.clone(), staging: ticket.staging.clone() });
        }
        Ok(DirCommit::assembled(ticket.target.clone(), ticket.staging.clone(), (rank, ticket.world), options, None))
    }

    #[cfg(feature = "remote")]
    fn join_remote(
        url: &crate::storage::RemoteUrl,
        ticket: &CommitTicket,
        rank: usize,
        options: &DirOptions,
    ) -> Result<DirCommit, CommitError> {
        let target = PathBuf::from(url.redacted());
        let Some(id) = ticket.save_id.clone().filter(|_| target == ticket.target) else {
            return Err(CommitError::TicketMismatch {
                path: target,
                rule: TicketRule::OtherDestination { target: ticket.target.clone() },
            });
        };
        let remote = crate::dir_remote::RemoteDir::begin(url, false, options.commit_points, id)?;
        let mut commit = DirCommit::assembled(target, super::private_dir()?, (rank, ticket.world), options, None);
        commit.remote = Some(remote);
        Ok(commit)
    }

    #[cfg(not(feature = "remote"))]
    fn join_remote(
        url: &crate::storage::RemoteUrl,
        _: &CommitTicket,
        _: usize,
        _: &DirOptions,
    ) -> Result<DirCommit, CommitError> {
        Err(no_remote(url))
    }

    /// Step 3 on every rank, once its files are finished (`own`: its outcome; on success, bytes of its own
    /// that rank 0's `finalize` gets): the report to carry to rank 0. For an object store, the files written
    /// by path are uploaded first. After this, the rank writes nothing more.
    ///
    /// # Errors
    /// The upload's error (this rank failed: it reports nothing, rank 0 must not commit).
    pub fn report(&self, own: Result<Vec<u8>, RankFailure>) -> Result<Vec<u8>, CommitError> {
        #[cfg(feature = "remote")]
        if let (Ok(_), Some(remote)) = (&own, &self.remote) {
            remote.upload_staged(&self.staging)?;
        }
        Ok(self.report_bytes(&own))
    }

    /// Step 4 on rank 0, with every rank's [report](DirCommit::report) in rank order (its own included):
    /// writes the format's final files through `finalize` (which gets each rank's bytes), the manifest, and
    /// swaps the staging directory in, as [`DirCommit::commit_gathered`] does. On failure the staging
    /// directory is removed (every rank has reported: none writes any more).
    ///
    /// # Errors
    /// [`CommitError::TicketMismatch`] on another rank or for a count of reports other than the number of
    /// ranks; [`CommitError::RankFailed`] naming the first rank that reported a failure; the commit's own
    /// errors.
    pub fn commit_reports<F>(mut self, reports: Vec<Vec<u8>>, finalize: F) -> Result<(), CommitError>
    where
        F: FnOnce(&DirCommit, Vec<Vec<u8>>) -> Result<(), CommitError>,
    {
        if self.rank != 0 || reports.len() != self.world {
            return Err(CommitError::TicketMismatch {
                path: self.target.clone(),
                rule: TicketRule::ReportCount { rank: self.rank, reports: reports.len(), world: self.world },
            });
        }
        let r = self.commit_as_root(reports, finalize);
        if r.is_err() {
            let _ = fs::remove_dir_all(&self.staging);
        }
        self.finished = true;
        drop(self.lock.take());
        r
    }
}

/// Without the `remote` feature a URL destination is refused.
#[cfg(not(feature = "remote"))]
fn no_remote(url: &crate::storage::RemoteUrl) -> CommitError {
    CommitError::Refused { path: PathBuf::from(url.redacted()), reason: crate::storage::NO_REMOTE.into() }
}

fn parent_or_dot(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::io::Write;

    use super::*;

    fn write(c: &DirCommit, name: &str, data: &[u8]) {
        let mut f = c.create_file(name).unwrap();
        f.writer().write_all(data).unwrap();
        f.finish().unwrap();
    }

    #[test]
    fn three_ranks_commit_through_tickets() {
        let root = tempfile::tempdir().unwrap();
        let dst = root.path().join("ckpt");
        std::fs::create_dir(&dst).unwrap();
        std::fs::write(dst.join("old"), b"previous").unwrap();
        let options = DirOptions::default().with_checksums(true);
        let c0 = DirCommit::prepare(&dst, 3, &options).unwrap();
        let ticket = CommitTicket::from_bytes(&c0.ticket().to_bytes()).unwrap();
        assert_eq!(ticket, c0.ticket());
        let c1 = DirCommit::join(&dst, &ticket, 1, &options).unwrap();
        let c2 = DirCommit::join(&dst, &ticket, 2, &options).unwrap();
        write(&c0, "part0", b"zero");
        write(&c1, "part1", b"one");
        write(&c2, "part2", b"two");
        // The previous checkpoint stands until the commit.
        assert_eq!(std::fs::read(dst.join("old")).unwrap(), b"previous");
        let reports = vec![
            c0.report(Ok(b"a".to_vec())).unwrap(),
            c1.report(Ok(b"b".to_vec())).unwrap(),
            c2.report(Ok(b"c".to_vec())).unwrap(),
        ];
        drop((c1, c2));
        c0.commit_reports(reports, |c, payloads| {
            assert_eq!(payloads, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
            write(c, "index", b"abc");
            Ok(())
        })
        .unwrap();
        for (name, data) in [("part0", "zero"), ("part1", "one"), ("part2", "two"), ("index", "abc")] {
            assert_eq!(std::fs::read_to_string(dst.join(name)).unwrap(), data);
        }
        let manifest = std::fs::read_to_string(dst.join(crate::MANIFEST_NAME)).unwrap();
        assert!(manifest.contains("part1") && manifest.contains("part2"), "{manifest}");
        assert!(!sibling(&dst, "ckpt-staging").unwrap().exists());
    }

    #[test]
    fn a_failed_rank_keeps_the_previous_checkpoint_and_the_next_save_cleans_up() {
        let root = tempfile::tempdir().unwrap();
        let dst = root.path().join("ckpt");
        std::fs::create_dir(&dst).unwrap();
        std::fs::write(dst.join("part0"), b"previous").unwrap();
        let options = DirOptions::default();
        let c0 = DirCommit::prepare(&dst, 2, &options).unwrap();
        let c1 = DirCommit::join(&dst, &c0.ticket(), 1, &options).unwrap();
        write(&c1, "part1", b"half");
        let failed = c1.report(Err(RankFailure::new("disk on fire"))).unwrap();
        // The wire format of a failure is the tag 0 and the message, as before the failure had a type.
        assert_eq!(failed, b"\0disk on fire");
        let reports = vec![c0.report(Ok(Vec::new())).unwrap(), failed];
        let e = c0.commit_reports(reports, |_, _| Ok(())).unwrap_err();
        assert!(matches!(&e, CommitError::RankFailed { rank: 1, message } if message == "disk on fire"), "{e}");
        assert_eq!(std::fs::read(dst.join("part0")).unwrap(), b"previous");
        assert!(!dst.join("part1").exists());
        // A save whose ranks were killed before the commit: the next save removes what they left.
        let c0 = DirCommit::prepare(&dst, 2, &options).unwrap();
        write(&c0, "partial", b"x");
        drop(c0);
        let staging = sibling(&dst, "ckpt-staging").unwrap();
        assert!(staging.join("partial").exists());
        let c0 = DirCommit::prepare(&dst, 2, &options).unwrap();
        assert!(!staging.join("partial").exists());
        c0.abort();
        assert!(!staging.exists());
        assert_eq!(std::fs::read(dst.join("part0")).unwrap(), b"previous");
    }

    #[test]
    fn joining_needs_the_same_destination_and_a_shared_staging_directory() {
        let root = tempfile::tempdir().unwrap();
        let dst = root.path().join("ckpt");
        let c0 = DirCommit::prepare(&dst, 2, &DirOptions::default()).unwrap();
        let ticket = c0.ticket();
        let other = root.path().join("elsewhere");
        let e = DirCommit::join(&other, &ticket, 1, &DirOptions::default()).unwrap_err();
        assert!(matches!(e, CommitError::TicketMismatch { .. }), "{e}");
        let e = DirCommit::join(&dst, &ticket, 2, &DirOptions::default()).unwrap_err();
        assert!(matches!(e, CommitError::TicketMismatch { .. }), "{e}");
        // A rank on another machine: rank 0's staging directory is not there.
        let mut json: serde_json::Value = serde_json::from_slice(&ticket.to_bytes()).unwrap();
        json["staging"] = serde_json::json!(root.path().join(".not-here").to_string_lossy());
        let moved = CommitTicket::from_bytes(json.to_string().as_bytes()).unwrap();
        let e = DirCommit::join(&dst, &moved, 1, &DirOptions::default()).unwrap_err();
        assert!(matches!(e, CommitError::StagingNotShared { .. }), "{e}");
        assert!(e.to_string().contains("share"), "{e}");
        assert!(matches!(CommitTicket::from_bytes(b"{}"), Err(CommitError::TicketUnreadable { .. })));
        c0.abort();
        assert!(!sibling(&dst, "ckpt-staging").unwrap().exists());
    }
}
