//! The files of a DeepSpeed checkpoint: the root's `latest` file and tag directories, the tag directory's
//! model states files (`mp_rank_00_model_states.pt`, ZeRO 3's `zero_pp_rank_R_mp_rank_00_model_states.pt`)
//! and optimizer states files (`[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt`), and the reading of the
//! values inside them.

use std::path::{Path, PathBuf};

use ckpt_tensor::{Dict, Value};

use crate::error::{Error, Result};

/// The name of the file at a checkpoint root that holds the tag of the last save.
pub const LATEST: &str = "latest";
/// What `ds_to_universal` writes beside a universal tag directory instead of `latest`.
pub const LATEST_UNIVERSAL: &str = "latest_universal";

/// Where a checkpoint's tag directory is: `path` itself when it is one, else the tag `tag` (or the one the
/// root's `latest`, then `latest_universal`, names) under the root `path`. Returns the tag directory and the
/// tag.
pub(crate) fn tag_dir(path: &Path, tag: Option<&str>) -> Result<(PathBuf, String)> {
    let io = |e| Error::Io { path: path.to_path_buf(), source: e };
    if !path.is_dir() {
        return Err(Error::NotACheckpoint { path: path.to_path_buf() });
    }
    if let Some(tag) = tag {
        let dir = path.join(tag);
        if !dir.is_dir() {
            return Err(Error::MissingTag { dir: path.to_path_buf(), tag: tag.to_owned(), from: "--tag" });
        }
        return Ok((dir, tag.to_owned()));
    }
    if is_tag_dir(path)? {
        let tag = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        return Ok((path.to_path_buf(), tag));
    }
    for (latest, from) in [(LATEST, "latest"), (LATEST_UNIVERSAL, "latest_universal")] {
        let file = path.join(latest);
        if file.is_file() {
            let text = std::fs::read_to_string(&file).map_err(io)?;
            let tag = text.trim().to_owned();
            let dir = path.join(&tag);
            if tag.is_empty() || tag.contains('/') || !dir.is_dir() {
                return Err(Error::MissingTag { dir: path.to_path_buf(), tag, from });
            }
            return Ok((dir, tag));
        }
    }
    Err(Error::NotACheckpoint { path: path.to_path_buf() })
}

/// Whether `dir` is a tag directory: it holds model or optimizer states files, or is a universal checkpoint
/// (`zero/`).
pub(crate) fn is_tag_dir(dir: &Path) -> Result<bool> {
    Ok(names(dir)?.iter().any(|n| n.ends_with("_model_states.pt") || n.ends_with("_optim_states.pt"))
        || dir.join("zero").is_dir())
}

/// The file names in `dir`, sorted.
pub(crate) fn names(dir: &Path) -> Result<Vec<String>> {
    let io = |e| Error::Io { path: dir.to_path_buf(), source: e };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        out.push(entry.map_err(io)?.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}

/// A per-rank file of a tag directory: `[<prefix>_]zero_pp_rank_<rank>_mp_rank_<mp>_<kind>.pt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankFile {
    /// The data-parallel rank.
    pub rank: usize,
    /// The file.
    pub path: PathBuf,
}

/// The per-rank files of `dir` whose names end in `_<kind>.pt` (`optim_states`, `model_states`), ordered by
/// rank; files of another model-parallel rank than 0 and expert-parallel files are refused, as DeepSpeed's
/// consolidation does not handle them either.
pub(crate) fn rank_files(dir: &Path, kind: &str) -> Result<Vec<RankFile>> {
    let suffix = format!("_mp_rank_00_{kind}.pt");
    let mut out = Vec::new();
    for name in names(dir)? {
        if !name.ends_with(&format!("_{kind}.pt")) || name == format!("mp_rank_00_{kind}.pt") {
            continue;
        }
        let unsupported = |what: String| Error::Unsupported { path: dir.join(&name), what };
        let Some(stem) = name.strip_suffix(&suffix) else {
            return Err(unsupported(
                "a model-parallel rank other than 0 (tensor or pipeline parallel checkpoints are not consolidated)"
                    .into(),
            ));
        };
        let Some((_, rank)) = stem.rsplit_once("zero_pp_rank_") else {
            return Err(unsupported("not a zero_pp_rank file (expert-parallel files are not consolidated)".into()));
        };
        let rank: usize = rank.parse().map_err(|_| unsupported(format!("rank {rank:?} is not a number")))?;
        out.push(RankFile { rank, path: dir.join(&name) });
    }
    out.sort_by_key(|f| f.rank);
    for (i, f) in out.iter().enumerate() {
        if f.rank != i {
            return Err(Error::MissingFile {
                path: dir.join(format!("zero_pp_rank_{i}{suffix}")),
                why: format!("ranks are numbered from 0; the next file found is rank {}", f.rank),
            });
        }
    }
    Ok(out)
}

/// A `torch.save` file read whole (tensors are windows of its memory map).
pub(crate) fn load(path: &Path, options: &ckpt_torch::ReadOptions) -> Result<Value> {
    Ok(ckpt_torch::TorchReader::open_with(path, options)?.into_value())
}

/// A value in a file, with the path of the file and where in it, for errors.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub file: &'a Path,
    pub at: &'a str,
    pub value: &'a Value,
}

impl<'a> At<'a> {
    /// The top-level value of `file`.
    pub fn top(file: &'a Path, value: &'a Value) -> Self {
        At { file, at: "", value }
    }

    fn layout(&self, expected: &'static str) -> Error {
        Error::Layout {
            path: self.file.to_path_buf(),
            at: if self.at.is_empty() { "the top level".into() } else { self.at.to_owned() },
            expected,
            found: self.value.type_name().to_owned(),
        }
    }

    /// The mapping this is.
    pub fn dict(&self) -> Result<&'a Dict> {
        self.value.as_dict().ok_or_else(|| self.layout("a dict"))
    }

    /// The item `key` of this mapping, or `None` when it has none.
    pub fn opt(&self, key: &str, at: &'a str) -> Result<Option<At<'a>>> {
        Ok(self.dict()?.get(key).map(|value| At { file: self.file, at, value }))
    }

    /// The item `key` of this mapping (`at` names it in errors).
    pub fn get(&self, key: &str, at: &'a str) -> Result<At<'a>> {
        self.opt(key, at)?.ok_or_else(|| Error::Layout {
            path: self.file.to_path_buf(),
            at: at.to_owned(),
            expected: "an item of this name",
            found: "none".into(),
        })
    }

    /// The items of this list or tuple.
    pub fn list(&self) -> Result<Vec<At<'a>>> {
        let items = self.value.as_sequence().ok_or_else(|| self.layout("a list"))?;
        Ok(items.iter().map(|value| At { value, ..*self }).collect())
    }

    /// The tensor this is.
    pub fn tensor(&self) -> Result<&'a ckpt_tensor::Tensor> {
        self.value.as_tensor().ok_or_else(|| self.layout("a tensor"))
    }

    /// The string this is.
    pub fn str(&self) -> Result<&'a str> {
        self.value.as_str().ok_or_else(|| self.layout("a str"))
    }

    /// The non-negative integer this is: an `int`, or an enum member holding one (`ZeroStageEnum.weights`
    /// pickles as the class called with its value).
    pub fn count(&self) -> Result<usize> {
        let int = match self.value {
            Value::Object(o) => o.args.as_sequence().and_then(|a| a.first()).and_then(Value::as_int),
            v => v.as_int(),
        };
        int.and_then(|i| usize::try_from(i).ok()).ok_or_else(|| self.layout("a non-negative int"))
    }

    /// The shape this `torch.Size` (or list of ints) is.
    pub fn shape(&self) -> Result<Vec<usize>> {
        let dims: Option<Vec<usize>> = match self.value {
            Value::Size(d) => d.iter().map(|&x| usize::try_from(x).ok()).collect(),
            Value::List(v) | Value::Tuple(v) => {
                v.iter().map(|x| x.as_int().and_then(|i| usize::try_from(i).ok())).collect()
            }
            _ => None,
        };
        dims.ok_or_else(|| self.layout("a torch.Size"))
    }

    /// The `(name, value)` items of this mapping whose keys are strings.
    pub fn named(&self) -> Result<Vec<(&'a str, At<'a>)>> {
        self.dict()?
            .items
            .iter()
            .map(|(k, value)| {
                k.as_str().map(|k| (k, At { value, ..*self })).ok_or_else(|| self.layout("a dict with str keys"))
            })
            .collect()
    }
}

/// A list of per-group mappings (`param_shapes`: a list of OrderedDicts, or one mapping in old files).
pub(crate) fn groups(v: At<'_>) -> Result<Vec<At<'_>>> {
    match v.value {
        Value::Dict(_) => Ok(vec![v]),
        _ => v.list(),
    }
}
