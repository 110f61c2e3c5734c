//! One `PART_{rank:03d}.pt` file: its name, its header (`__nshards__`, `__version__`) and the rank's share
//! of each model and optimizer, read and checked against the layout hfai writes.

use std::path::{Path, PathBuf};

use ckpt_tensor::flatten::python_str;
use ckpt_tensor::{Buffer, Dict, Tensor, Value};
use ckpt_torch::{ReadOptions, TorchReader};

use crate::error::{Error, Result};
use crate::fingerprint::{self, Fingerprint};

/// hfai's layout version, the `__version__` of every part.
pub const VERSION: &str = "2.0.0";

/// Keys of the part header; every other top-level key of PART_000.pt is one of `others`.
pub(crate) const HEADER_KEYS: [&str; 4] = ["__nshards__", "__version__", "model", "optimizer"];

/// A large tensor's share in one part: the stored `torch.Size` and this rank's flat chunk.
#[derive(Debug, Clone)]
pub(crate) struct LargeChunk {
    pub(crate) shape: Vec<usize>,
    pub(crate) chunk: Tensor,
}

/// One model's share: `(params_i, large_params_i)`.
#[derive(Debug, Clone)]
pub(crate) struct ModelPart {
    pub(crate) params: Vec<(Value, Value)>,
    pub(crate) large: Vec<(Value, LargeChunk)>,
}

/// One optimizer's share: `(opt_state_j, large_tensors_j)`; `state` is `opt_state_j["state"]`'s items.
#[derive(Debug, Clone)]
pub(crate) struct OptimizerPart {
    pub(crate) dict: Dict,
    pub(crate) state: Vec<(Value, Value)>,
    /// Keyed by `(param_id, name)`.
    pub(crate) large: Vec<((Value, Value), LargeChunk)>,
}

/// One part file, read and checked.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub(crate) path: PathBuf,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) world_size: usize,
    /// The whole top-level dict (rank 0's holds `others` after the header).
    pub(crate) top: Dict,
    pub(crate) models: Vec<ModelPart>,
    pub(crate) optimizers: Vec<OptimizerPart>,
}

/// Python-like text of a value for messages.
pub(crate) fn show(v: &Value) -> String {
    match v {
        Value::Str(s) => format!("{s:?}"),
        other => python_str(other).unwrap_or_else(|_| other.type_name().to_owned()),
    }
}

struct Checker<'a> {
    path: &'a Path,
}

impl Checker<'_> {
    fn layout(&self, at: impl Into<String>, expected: &'static str, found: &Value) -> Error {
        Error::Layout { path: self.path.to_path_buf(), at: at.into(), expected, found: describe(found) }
    }

    fn dict<'v>(&self, v: &'v Value, at: &str) -> Result<&'v Dict> {
        v.as_dict().ok_or_else(|| self.layout(at, "a dict", v))
    }

    fn pair<'v>(&self, v: &'v Value, at: &str, expected: &'static str) -> Result<(&'v Value, &'v Value)> {
        match v.as_sequence() {
            Some([a, b]) => Ok((a, b)),
            _ => Err(self.layout(at, expected, v)),
        }
    }

    fn list<'v>(&self, top: &'v Dict, key: &'static str) -> Result<&'v [Value]> {
        let v = top.get(key).ok_or_else(|| self.layout(format!("[{key:?}]"), "a list of pairs", &Value::None))?;
        v.as_sequence().ok_or_else(|| self.layout(format!("[{key:?}]"), "a list of pairs", v))
    }

    fn large(&self, v: &Value, at: &str) -> Result<LargeChunk> {
        let (shape, chunk) = self.pair(v, at, "a (torch.Size, tensor) pair")?;
        let shape = match shape {
            Value::Size(d) => d.iter().map(|&x| usize::try_from(x).ok()).collect::<Option<Vec<_>>>(),
            Value::Tuple(d) | Value::List(d) => {
                d.iter().map(|x| x.as_int().and_then(|x| usize::try_from(x).ok())).collect()
            }
            _ => None,
        }
        .ok_or_else(|| self.layout(format!("{at}[0]"), "a torch.Size", shape))?;
        let chunk = chunk.as_tensor().ok_or_else(|| self.layout(format!("{at}[1]"), "a tensor", chunk))?;
        Ok(LargeChunk { shape, chunk: chunk.clone() })
    }
}

/// A short description of a value for layout errors.
fn describe(v: &Value) -> String {
    match v {
        Value::None => "nothing".into(),
        Value::Int(_) | Value::Str(_) | Value::Bool(_) | Value::Float(_) => format!("{} {}", v.type_name(), show(v)),
        Value::List(x) | Value::Tuple(x) => format!("a {} of {} item(s)", v.type_name(), x.len()),
        other => format!("a {}", other.type_name()),
    }
}

impl Part {
    /// Maps and reads `path`, checking the header and the layout of every model and optimizer share.
    pub(crate) fn open(path: &Path, options: &ReadOptions) -> Result<Part> {
        let file = std::fs::File::open(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
        let buffer = Buffer::map(&file, path).map_err(|e| match e {
            ckpt_tensor::Error::Io { path, source } => Error::Io { path, source },
            e => Error::Core(e),
        })?;
        // A partial local copy ([`ReadOptions::fill`]): the part's name in its directory is what the hook
        // knows it by, and the tail the fingerprint covers is filled first.
        let named;
        let options = match &options.fill {
            Some(fill) if options.fill_file.is_none() => {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let len = buffer.len() as u64;
                fill.fill(&name, len.saturating_sub(fingerprint::TAIL)..len)
                    .map_err(|source| Error::Io { path: path.to_owned(), source })?;
                named = options.clone().with_fill_file(Some(name));
                &named
            }
            _ => options,
        };
        let fingerprint = Fingerprint::of_bytes(buffer.as_bytes());
        let value = TorchReader::from_map(&file, &buffer, options).map_err(|e| e.at(path))?.into_value();
        let c = Checker { path };
        let top = match value {
            Value::Dict(d) => d,
            other => return Err(c.layout("the top level", "a dict", &other)),
        };
        match top.get("__version__") {
            None => return Err(Error::Version1 { path: path.to_path_buf() }),
            Some(Value::Str(v)) if v == VERSION => {}
            Some(other) => return Err(Error::UnsupportedVersion { path: path.to_path_buf(), found: show(other) }),
        }
        let world_size = match top.get("__nshards__") {
            Some(Value::Int(n)) if *n >= 1 => usize::try_from(*n).unwrap_or(usize::MAX),
            other => {
                return Err(c.layout("[\"__nshards__\"]", "a positive int", other.unwrap_or(&Value::None)));
            }
        };

        let mut models = Vec::new();
        for (m, share) in c.list(&top, "model")?.iter().enumerate() {
            let at = format!("[\"model\"][{m}]");
            let (params, large) = c.pair(share, &at, "a (params, large_params) pair")?;
            let params = c.dict(params, &format!("{at}[0]"))?.items.clone();
            let large = c
                .dict(large, &format!("{at}[1]"))?
                .items
                .iter()
                .map(|(k, v)| Ok((k.clone(), c.large(v, &format!("{at}[1][{}]", show(k)))?)))
                .collect::<Result<_>>()?;
            models.push(ModelPart { params, large });
        }

        let mut optimizers = Vec::new();
        for (o, share) in c.list(&top, "optimizer")?.iter().enumerate() {
            let at = format!("[\"optimizer\"][{o}]");
            let (dict, large) = c.pair(share, &at, "a (state_dict, large_tensors) pair")?;
            let dict = c.dict(dict, &format!("{at}[0]"))?.clone();
            let state_value = dict.get("state").unwrap_or(&Value::None);
            let state = c.dict(state_value, &format!("{at}[0][\"state\"]"))?.items.clone();
            let large = c
                .dict(large, &format!("{at}[1]"))?
                .items
                .iter()
                .map(|(k, v)| {
                    let kat = format!("{at}[1][{}]", show(k));
                    let (k1, k2) = c.pair(k, &kat, "a (param_id, name) key")?;
                    Ok(((k1.clone(), k2.clone()), c.large(v, &kat)?))
                })
                .collect::<Result<_>>()?;
            optimizers.push(OptimizerPart { dict, state, large });
        }
        Ok(Part { path: path.to_path_buf(), fingerprint, world_size, top, models, optimizers })
    }
}
