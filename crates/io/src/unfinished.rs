//! What an interrupted multi-rank save left: the staging directory's markers say how many ranks the save
//! had and which of them finished their files ([`unfinished`]).

use std::fs;
use std::path::{Path, PathBuf};

use crate::sibling;

/// Written by rank 0 into a new staging directory: `{"world_size": W}`.
pub(crate) const SAVE_MARKER: &str = ".ckpt-save.json";

/// The marker rank `rank` writes into the staging directory once all its files are durable.
pub(crate) fn rank_marker(rank: usize) -> String {
    format!(".ckpt-rank-{rank}.done")
}

/// Whether `name` is one of the markers (removed before the staging directory is committed).
pub(crate) fn is_marker(name: &str) -> bool {
    name == SAVE_MARKER || (name.starts_with(".ckpt-rank-") && name.ends_with(".done"))
}

/// A save of `target` that started and never committed: its staging directory is still beside `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unfinished {
    /// The staging directory (`.<name>.ckpt-staging`).
    pub staging: PathBuf,
    /// The save's number of ranks, when its marker survived.
    pub world_size: Option<usize>,
    /// The ranks that finished writing their files, in order.
    pub finished: Vec<usize>,
    /// The ranks that did not (killed, failed or still writing), in order; empty when the world size is
    /// unknown.
    pub missing: Vec<usize>,
    /// The files the staging directory holds (markers excluded), sorted.
    pub files: Vec<String>,
}

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[usize]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        write!(f, "an unfinished save is in {}", self.staging.display())?;
        match self.world_size {
            Some(w) => {
                write!(f, ": {w} rank(s); ")?;
                if self.missing.is_empty() {
                    write!(f, "every rank finished its files, the commit did not happen")?;
                } else {
                    write!(f, "the files of rank(s) {} are missing or incomplete", list(&self.missing))?;
                    if !self.finished.is_empty() {
                        write!(f, " (rank(s) {} finished)", list(&self.finished))?;
                    }
                }
            }
            None => write!(f, ": its number of ranks is unknown")?,
        }
        write!(f, "; it holds {} file(s)", self.files.len())?;
        if !self.files.is_empty() {
            write!(f, ": {}", self.files.join(", "))?;
        }
        write!(f, ". The checkpoint at the destination is the previous one; the next save removes this")
    }
}

/// The save of `target` that a crash (a killed rank, a power loss) interrupted before its commit, if its
/// staging directory is still there: which ranks finished their files and which did not.
///
/// ```
/// let root = tempfile::tempdir().unwrap();
/// assert!(ckpt_io::unfinished(&root.path().join("ckpt")).is_none());
/// ```
pub fn unfinished(target: &Path) -> Option<Unfinished> {
    let staging = sibling(target, "ckpt-staging").ok()?;
    let entries = fs::read_dir(&staging).ok()?;
    let mut files = Vec::new();
    let mut finished = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(rank) = name.strip_prefix(".ckpt-rank-").and_then(|r| r.strip_suffix(".done")) {
            if let Ok(rank) = rank.parse::<usize>() {
                finished.push(rank);
            }
        } else if name != SAVE_MARKER {
            files.push(name);
        }
    }
    files.sort();
    finished.sort_unstable();
    let world_size = fs::read(staging.join(SAVE_MARKER))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|j| j.get("world_size")?.as_u64())
        .and_then(|w| usize::try_from(w).ok());
    let missing = match world_size {
        Some(w) => (0..w).filter(|r| finished.binary_search(r).is_err()).collect(),
        None => Vec::new(),
    };
    Some(Unfinished { staging, world_size, finished, missing, files })
}
