//! The completion check that hfai lacks: after every rank has written its part (atomically) and passed the
//! barrier, rank 0 removes stale parts of an earlier, wider save and checks that each part on disk is the
//! one its rank reported writing; every rank then gets the same verdict. Ranks opening a checkpoint
//! together use the same fingerprints to agree that they read the same files.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use ckpt_core::Collective;

use crate::error::{Error, Result};
use crate::part::{PartName, classify, part_file_name};

/// Bytes at the end of a part that the fingerprint covers: the ZIP end records and the end of the
/// central directory, whose entries carry every record's CRC-32 (the last one is `.data/serialization_id`,
/// itself derived from all records' CRCs).
const TAIL: u64 = 64 * 1024;

/// Identity of a part file: its length and the CRC-32 of its tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    len: u64,
    tail_crc: u32,
}

impl Fingerprint {
    pub(crate) fn of_bytes(bytes: &[u8]) -> Self {
        let len = bytes.len() as u64;
        let tail = bytes.get(bytes.len().saturating_sub(TAIL as usize)..).unwrap_or_default();
        Fingerprint { len, tail_crc: crc32fast::hash(tail) }
    }

    pub(crate) fn of_file(path: &Path) -> Result<Self> {
        let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        let start = len.saturating_sub(TAIL);
        f.seek(SeekFrom::Start(start)).map_err(|e| Error::io(path, e))?;
        let mut tail = Vec::new();
        f.take(TAIL).read_to_end(&mut tail).map_err(|e| Error::io(path, e))?;
        if tail.len() as u64 != len - start {
            return Err(Error::io(path, std::io::ErrorKind::UnexpectedEof.into()));
        }
        Ok(Fingerprint { len, tail_crc: crc32fast::hash(&tail) })
    }

    fn encode(&self) -> String {
        format!("{}:{}", self.len, self.tail_crc)
    }

    fn decode(s: &str) -> Option<Self> {
        let (len, crc) = s.split_once(':')?;
        Some(Fingerprint { len: len.parse().ok()?, tail_crc: crc.parse().ok()? })
    }
}

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

/// Rank 0's check after the barrier. `reports[r]` is rank `r`'s report of the part it wrote.
pub(crate) fn check_saved(dir: &Path, reports: &[Report]) -> Result<()> {
    for (rank, r) in reports.iter().enumerate() {
        if let Report::Failed(message) = r {
            return Err(Error::RankFailed { rank, message: message.clone() });
        }
    }
    let nshards = reports.len();
    remove_stale_parts(dir, nshards)?;
    for (rank, r) in reports.iter().enumerate() {
        let path = dir.join(part_file_name(rank));
        let incomplete = |problem: String| Error::Incomplete { path: path.clone(), problem };
        let expected = match r {
            Report::Done(f) if f.len() == 1 => f[0],
            _ => return Err(incomplete(format!("rank {rank} reported {} parts", r.count()))),
        };
        let found = match Fingerprint::of_file(&path) {
            Ok(f) => f,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
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

/// Removes `PART_k.pt` for `k >= nshards` (left by an earlier save with more ranks, they would make hfai's
/// loader reject the directory); other names matching `PART_*.pt` are an error, not removed.
fn remove_stale_parts(dir: &Path, nshards: usize) -> Result<()> {
    let mut removed = false;
    let mut foreign = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        match classify(&name) {
            PartName::Rank(k) if k >= nshards => {
                fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
                removed = true;
            }
            PartName::Foreign => foreign.push(name),
            _ => {}
        }
    }
    if removed {
        ckpt_core::atomic::sync_dir(dir)?;
    }
    if !foreign.is_empty() {
        foreign.sort();
        return Err(Error::ForeignFiles { dir: dir.to_path_buf(), names: foreign });
    }
    Ok(())
}

/// The collective end of a save: exchange reports (the barrier), rank 0 checks, every rank returns the
/// same verdict (its own error first, if it failed itself).
pub(crate) fn finish_collective(group: &dyn Collective, dir: &Path, own: Result<Fingerprint>) -> Result<()> {
    let reports = Report::of(&own, |f| vec![*f]).exchange(group)?;
    let verdict = if group.rank() == 0 { check_saved(dir, &reports) } else { Ok(()) };
    let message = match &verdict {
        Ok(()) => Vec::new(),
        Err(e) => e.to_string().into_bytes(),
    };
    let message = group.broadcast(message, 0)?;
    own?;
    if group.rank() == 0 || message.is_empty() {
        return verdict;
    }
    Err(Error::RankFailed { rank: 0, message: String::from_utf8_lossy(&message).into_owned() })
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
    fn check_finds_missing_changed_and_failed_parts() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let write = |r: usize, bytes: &[u8]| {
            fs::write(d.join(part_file_name(r)), bytes).unwrap();
            Report::Done(vec![Fingerprint::of_bytes(bytes)])
        };
        let reports = vec![write(0, b"part zero"), write(1, b"part one")];
        fs::write(d.join("PART_002.pt"), b"stale").unwrap();
        check_saved(d, &reports).unwrap();
        assert!(!d.join("PART_002.pt").exists(), "stale part removed");

        fs::write(d.join("PART_001.pt"), b"part 1ne").unwrap(); // same size, other bytes
        let e = check_saved(d, &reports).unwrap_err();
        assert!(matches!(&e, Error::Incomplete { problem, .. } if problem.contains("overwritten")), "{e}");
        fs::write(d.join("PART_001.pt"), b"part one, longer").unwrap();
        let e = check_saved(d, &reports).unwrap_err();
        assert!(matches!(&e, Error::Incomplete { problem, .. } if problem.contains("16 bytes on disk")), "{e}");
        fs::remove_file(d.join("PART_001.pt")).unwrap();
        let e = check_saved(d, &reports).unwrap_err();
        assert!(matches!(&e, Error::Incomplete { problem, .. } if problem.contains("missing")), "{e}");

        let failed = vec![reports[0].clone(), Report::Failed("disk full".into())];
        let e = check_saved(d, &failed).unwrap_err();
        assert!(matches!(&e, Error::RankFailed { rank: 1, message } if message == "disk full"), "{e}");
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
