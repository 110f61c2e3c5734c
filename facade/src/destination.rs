//! What stands at a write's destination, and whether the write may go there: a destination is a
//! checkpoint of the target format (replaced whole, crash-safe) or it is new (nothing there, or an empty
//! directory for a directory format). Anything else (a file that is not a checkpoint, a directory that is
//! not a checkpoint of the target format, a checkpoint of another format) is refused with
//! [`Error::DestinationTaken`], unless the caller asked to overwrite it, in which case the write goes to a
//! staging path beside it and is swapped in whole ([`ckpt_io::replace_whole`]). Every write path of the
//! facade (`convert`, `save`, `reshard` and their `_in` variants) asks [`check`] first.

use std::path::{Path, PathBuf};

use crate::error::{At, Error, Result};
use crate::format::Format;

/// What stands at a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Nothing: no file, or an empty directory where the target is a directory (for `hf`, also a model
    /// directory of config and tokenizer files alone, [`ckpt_safetensors::hf::MODEL_FILES`]).
    Nothing,
    /// A checkpoint of the target format, which the write replaces (its writer's crash-safe replace).
    Same,
    /// Something else, in words ("a text file", "an hfai checkpoint", ...).
    Other(String),
}

/// How a write reaches its destination once [`check`] allowed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Write at the destination itself: it is new, or a checkpoint of the target format.
    Direct,
    /// Write at this staging path beside the destination, then [`commit`] swaps it in whole.
    Replace(PathBuf),
}

impl Plan {
    /// Where the writer writes.
    pub fn path<'a>(&'a self, dst: &'a Path) -> &'a Path {
        match self {
            Plan::Direct => dst,
            Plan::Replace(staging) => staging,
        }
    }
}

/// Whether `to` writes one file (torch, safetensors, gguf) rather than a directory.
pub(crate) fn is_one_file(to: Format) -> bool {
    to.one_file_name().is_some()
}

/// Whether a directory holding only the files `names` takes a checkpoint of `to` beside them as an empty
/// directory would ([`Adaptor::joins_directory`](crate::adaptor::Adaptor::joins_directory): a Hugging Face
/// model directory of config and tokenizer files takes its shards).
pub(crate) fn joins_directory(to: Format, names: &[String]) -> bool {
    crate::formats::enabled(to).is_some_and(|a| a.joins_directory(names))
}

/// What stands at `dst`, for a write of format `to`.
///
/// # Errors
/// [`Error::Io`] when `dst` or the directory at it cannot be read.
pub fn standing(dst: &Path, to: Format) -> Result<Standing> {
    let meta = match std::fs::metadata(dst) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Standing::Nothing),
        Err(e) => return Err(Error::Io { path: dst.to_path_buf(), source: e }),
    };
    if meta.is_dir() {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dst).at(dst)? {
            names.push(entry.at(dst)?.file_name().to_string_lossy().into_owned());
        }
        if names.is_empty() {
            return Ok(if is_one_file(to) { Standing::Other("an empty directory".into()) } else { Standing::Nothing });
        }
        // A Hugging Face model directory without its weights yet (config.json, the tokenizer): shards go in
        // beside them.
        if joins_directory(to, &names) {
            return Ok(Standing::Nothing);
        }
        // The names already read say which format it is, as detection would from them.
        return Ok(match crate::format::recognise(&crate::format::Probe::Dir(dst, &names)) {
            Some(found) if found == to => Standing::Same,
            Some(found) => Standing::Other(a_checkpoint(found)),
            None => {
                names.sort();
                let shown: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
                let more = if names.len() > 3 { ", ..." } else { "" };
                let files = if names.len() == 1 { "1 file".to_owned() } else { format!("{} files", names.len()) };
                Standing::Other(format!("a directory of {files} that is not a checkpoint ({}{more})", shown.join(", ")))
            }
        });
    }
    // Detection reads the file's head once and says what anything else is (a special file, a text file, ...).
    match crate::formats::detect(dst) {
        Ok(found) if found == to => Ok(Standing::Same),
        Ok(found) => Ok(Standing::Other(a_checkpoint(found))),
        Err(Error::NotACheckpoint { looks_like, .. }) => Ok(Standing::Other(looks_like)),
        Err(Error::SpecialFile { kind, .. }) => Ok(Standing::Other(kind.into())),
        Err(Error::Io { path, source }) => Err(Error::Io { path, source }),
        // A file of a format ckpt recognises but does not read (a TAR-era torch file).
        Err(_) => Ok(Standing::Other("a file that is not a checkpoint ckpt reads".into())),
    }
}

/// "a torch checkpoint", "an hfai checkpoint".
pub(crate) fn a_checkpoint(format: Format) -> String {
    let name = format.name();
    // Read aloud: "an hfai", "an hf", "a gguf", "a safetensors".
    let article = if name.starts_with(['a', 'e', 'i', 'o', 'u', 'h']) { "an" } else { "a" };
    format!("{article} {name} checkpoint")
}

/// Checks the destination `dst` of a write of format `to`, and says how to write there: directly (new, or a
/// checkpoint of `to`), or, with `overwrite` and something at `dst`, at a staging path swapped in whole by
/// [`commit`].
///
/// # Errors
/// [`Error::InvalidArgument`] for a path ending in `/` where `to` writes one file;
/// [`Error::DestinationTaken`] for anything else than a checkpoint of `to` at `dst` without `overwrite`;
/// I/O errors reading the destination.
pub fn check(dst: &Path, to: Format, overwrite: bool) -> Result<Plan> {
    if is_one_file(to) && dst.as_os_str().to_string_lossy().ends_with('/') {
        return Err(Error::InvalidArgument {
            path: dst.to_path_buf(),
            reason: format!(
                "a directory path, and a {to} checkpoint is one file: name a file (such as {}), or pick a \
                 directory format",
                dst.join(to.one_file_name().unwrap_or("model.pt")).display()
            ),
        });
    }
    let standing = standing(dst, to)?;
    match (standing, overwrite) {
        (Standing::Nothing, _) => Ok(Plan::Direct),
        // A writer that writes a new directory only (PyTorch-BigGraph's: a checkpoint's next version is its
        // own commit) replaces a checkpoint of its format by the swap instead.
        (Standing::Same, false) if crate::formats::enabled(to).is_some_and(|a| !a.writes_over_itself()) => {
            Ok(Plan::Replace(ckpt_io::overwrite_staging(dst).map_err(|e| commit_error(dst, e))?))
        }
        (Standing::Same, false) => Ok(Plan::Direct),
        (Standing::Same | Standing::Other(_), true) => {
            Ok(Plan::Replace(ckpt_io::overwrite_staging(dst).map_err(|e| commit_error(dst, e))?))
        }
        (Standing::Other(what), false) => Err(Error::DestinationTaken { path: dst.to_path_buf(), what, to }),
    }
}

/// Completes a write planned by [`check`]: with [`Plan::Replace`], swaps the staged checkpoint in for
/// whatever stands at `dst` and removes the old content (after the new is committed).
///
/// # Errors
/// The commit's errors, about `dst`.
pub fn commit(plan: &Plan, dst: &Path, sync: bool) -> Result<()> {
    match plan {
        Plan::Direct => Ok(()),
        Plan::Replace(staging) => ckpt_io::replace_whole(staging, dst, sync).map_err(|e| commit_error(dst, e)),
    }
}

/// The plan rank 0's [`check`] chose, on another process of a group: whether it replaces (`replace`, as
/// rank 0 broadcast it), at the same staging path.
///
/// # Errors
/// As [`ckpt_io::sibling`], about `dst`.
pub(crate) fn plan_of_root(dst: &Path, replace: bool) -> Result<Plan> {
    if !replace {
        return Ok(Plan::Direct);
    }
    Ok(Plan::Replace(ckpt_io::sibling(dst, "ckpt-overwrite").map_err(|e| commit_error(dst, e))?))
}

/// Removes what a failed [`Plan::Replace`] write left at its staging path (the destination is untouched).
pub fn abandon(plan: &Plan) {
    if let Plan::Replace(staging) = plan {
        let _ = std::fs::remove_dir_all(staging).or_else(|_| std::fs::remove_file(staging));
    }
}

/// A commit error about `dst`, as the writers report theirs.
fn commit_error(dst: &Path, e: ckpt_io::CommitError) -> Error {
    Error::Format { path: dst.to_path_buf(), source: e.into() }
}

/// Runs `write` at the path [`check`] chose for `dst`, then [`commit`]s; a failed write leaves the
/// destination as it was.
///
/// # Errors
/// As [`check`], `write` and [`commit`].
pub(crate) fn write_checked<T>(
    dst: &Path,
    to: Format,
    overwrite: bool,
    sync: bool,
    write: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    let plan = check(dst, to, overwrite)?;
    let out = write(plan.path(dst)).inspect_err(|_| abandon(&plan))?;
    commit(&plan, dst, sync).inspect_err(|_| abandon(&plan))?;
    Ok(out)
}
