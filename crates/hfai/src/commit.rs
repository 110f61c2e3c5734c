//! The completion check that hfai lacks: once every rank has written its part into the staging directory,
//! rank 0 checks that each part there is the one its rank reported writing (length and the CRC-32 of its
//! tail, as seen from rank 0: on a shared file system, what the other ranks wrote is visible) before the
//! directory is swapped in ([`ckpt_io::DirCommit`]); every rank then gets the same verdict. Ranks
//! opening a checkpoint together use the same fingerprints to agree that they read the same files.

use std::fs;
use std::path::Path;

use ckpt_collective::Collective;

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::part_name::{PartName, classify, part_file_name};

/// What a rank tells the others: the fingerprints of the parts it wrote or read, or its error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    Done(Vec<Fingerprint>),
    Failed(String),
}

impl Report {
    pub(crate) fn of<T>(r: &Result<T>, fingerprints: impl FnOnce(&T) -> Vec<Fingerprint>) -> Report {
        match r {
            Ok(v) => Report::Done(fingerprints(v)),
            // As text: it crosses the process group as bytes (the other ranks report it as a rank failure); this rank
            // returns its own error, source intact.
            Err(e) => Report::Failed(e.to_string()),
        }
    }

    fn encode(&self) -> Vec<u8> {
        match self {
            Report::Done(f) => {
                let parts: Vec<String> = f.iter().map(Fingerprint::encode).collect();
                format!("ok {}", parts.join(" ")).into_bytes()
            }
            Report::Failed(m) => format!("err {m}").into_bytes(),
        }
    }

    fn decode(bytes: &[u8]) -> Report {
        let text = String::from_utf8_lossy(bytes);
        if let Some(rest) = text.strip_prefix("ok") {
            let f: Option<Vec<Fingerprint>> = rest.split_whitespace().map(Fingerprint::decode).collect();
            if let Some(f) = f {
                return Report::Done(f);
            }
        }
        Report::Failed(text.strip_prefix("err ").unwrap_or("an unreadable report").to_owned())
    }

    fn count(&self) -> usize {
        match self {
            Report::Done(f) => f.len(),
            Report::Failed(_) => 0,
        }
    }

    /// Every rank's report, in rank order.
    pub(crate) fn exchange(&self, group: &dyn Collective) -> Result<Vec<Report>> {
        Ok(group.all_gather(self.encode())?.iter().map(|b| Report::decode(b)).collect())
    }
}

/// Rank 0's check before the swap. `reports[r]` is rank `r`'s report of the part it wrote into `staging`;
/// `target` is the destination, whose `PART_*.pt` names hfai does not write (`PART_1.pt`) would be carried
/// into the new checkpoint and make hfai's loader reject it.
///
/// `private`: each rank staged its parts in a directory of its own (an object-store destination, where each
/// rank uploads what it wrote): a part of another rank is then not here to read back, and its rank's
/// report (the fingerprint of what it uploaded) stands for it.
pub(crate) fn check_staged(staging: &Path, target: &Path, reports: &[Report], private: bool) -> Result<()> {
    for (rank, r) in reports.iter().enumerate() {
        if let Report::Failed(message) = r {
            return Err(Error::RankFailed { rank, message: message.clone() });
        }
    }
    refuse_foreign_parts(target)?;
    for (rank, r) in reports.iter().enumerate() {
        let path = target.join(part_file_name(rank));
        let incomplete = |problem: String| Error::Incomplete { path: path.clone(), problem };
        let expected = match r {
            Report::Done(f) if f.len() == 1 => f[0],
            _ => return Err(incomplete(format!("rank {rank} reported {} parts", r.count()))),
        };
        let found = match Fingerprint::of_file(&staging.join(part_file_name(rank))) {
            Ok(f) => f,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                if private {
                    continue;
                }
                return Err(incomplete("the file is missing".into()));
            }
            Err(e) => return Err(e),
        };
        if found.len != expected.len {
            return Err(incomplete(format!("{} bytes on disk, rank {rank} wrote {}", found.len, expected.len)));
        }
        if found != expected {
            return Err(incomplete(format!("its tail is not what rank {rank} wrote (overwritten by another save?)")));
        }
    }
    Ok(())
}

/// [`Error::ForeignFiles`] when `dir` (if it exists) holds names matching `PART_*.pt` that hfai does not
/// write.
fn refuse_foreign_parts(dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut foreign = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let PartName::Foreign = classify(&name) {
            foreign.push(name);
        }
    }
    if !foreign.is_empty() {
        foreign.sort();
        return Err(Error::ForeignFiles { dir: dir.to_path_buf(), names: foreign });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reports_round_trip() {
        let f = Fingerprint::of_bytes(b"hello");
        for r in [Report::Done(vec![f, f]), Report::Done(vec![]), Report::Failed("boom: x".into())] {
            assert_eq!(Report::decode(&r.encode()), r);
        }
        assert_eq!(Report::decode(b"garbage"), Report::Failed("an unreadable report".into()));
    }

    #[test]
    fn check_finds_missing_changed_foreign_and_failed_parts() {
        let dir = tempfile::tempdir().unwrap();
        let (d, target) = (dir.path().join("staging"), dir.path().join("ck"));
        fs::create_dir(&d).unwrap();
        let write = |r: usize, bytes: &[u8]| {
            fs::write(d.join(part_file_name(r)), bytes).unwrap();
            Report::Done(vec![Fingerprint::of_bytes(bytes)])
        };
        let reports = vec![write(0, b"part zero"), write(1, b"part one")];
        check_staged(&d, &target, &reports, false).unwrap();

        fs::write(d.join("PART_001.pt"), b"part 1ne").unwrap(); // same size, other bytes
        let e = check_staged(&d, &target, &reports, false).unwrap_err();
        assert!(matches!(&e, Error::Incomplete { problem, .. } if problem.contains("overwritten")), "{e}");
        fs::write(d.join("PART_001.pt"), b"part one, longer").unwrap();
        let e = check_staged(&d, &target, &reports, false).unwrap_err();
        assert!(matches!(&e, Error::Incomplete { problem, .. } if problem.contains("16 bytes on disk")), "{e}");
        fs::remove_file(d.join("PART_001.pt")).unwrap();
        let e = check_staged(&d, &target, &reports, false).unwrap_err();
        assert!(matches!(&e, Error::Incomplete { problem, .. } if problem.contains("missing")), "{e}");
        // Staged privately (an object-store destination): another rank's part is not here; its report stands.
        check_staged(&d, &target, &reports, true).unwrap();

        let failed = vec![reports[0].clone(), Report::Failed("disk full".into())];
        let e = check_staged(&d, &target, &failed, false).unwrap_err();
        assert!(matches!(&e, Error::RankFailed { rank: 1, message } if message == "disk full"), "{e}");

        fs::create_dir(&target).unwrap();
        fs::write(target.join("PART_1.pt"), b"not hfai's").unwrap();
        let e = check_staged(&d, &target, &reports[..1], false).unwrap_err();
        assert!(matches!(&e, Error::ForeignFiles { names, .. } if names == &["PART_1.pt"]), "{e}");
    }

    #[test]
    fn file_and_bytes_agree() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&p, &data).unwrap();
        assert_eq!(Fingerprint::of_file(&p).unwrap(), Fingerprint::of_bytes(&data));
        fs::write(&p, b"").unwrap();
        assert_eq!(Fingerprint::of_file(&p).unwrap(), Fingerprint::of_bytes(b""));
    }
}
