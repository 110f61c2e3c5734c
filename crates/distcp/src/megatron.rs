//! Megatron-Core `torch_dist` checkpoints: a DCP checkpoint (`.metadata`, `__R_N.distcp`) written by
//! `megatron.core.dist_checkpointing.save`, with `metadata.json` (`{"sharded_backend": "torch_dist", ...}`)
//! and `common.pt` (the state that is not sharded: `iteration`, `args`, `checkpoint_version`, ...) beside it.
//!
//! DCP already joins tensor-parallel shards into global tensors from their chunks, and tolerates the
//! `all_local_plans` Megatron adds to `.metadata`. This profile adds what Megatron means:
//!
//! - `common.pt`'s values as entries (by their flattened path: `iteration`, `args`, ...);
//! - layer-stacked tensors — Megatron saves the layers of a `TransformerBlock` under one key with a leading
//!   layer axis (`decoder.layers.self_attention.linear_qkv.weight` of shape `[layers, ...]`) — split per
//!   layer on request ([`MegatronOptions::unstack_layers`]: `decoder.layers.<i>.self_attention...`, each read
//!   as its own region, so a writer holds one layer at a time), and the per-layer `ShardedObject`s
//!   (`..._extra_state/shard_<i>_<layers>`) named the same way;
//! - a GPT model's names mapped onto Llama's ([`MegatronOptions::llama`]): `linear_qkv` split into
//!   `q_proj`/`k_proj`/`v_proj` by the head layout in `args` (Megatron interleaves the query heads of a group
//!   with its key and value head: per query group, `heads / groups` query heads then one key and one value
//!   head, each `kv_channels` rows), a gated `linear_fc1` (SwiGLU: the gate's rows, then the up projection's)
//!   into `gate_proj`/`up_proj`.
//!
//! The layouts of megatron-core's distributed optimizer are plain DCP entries and are listed as they are:
//! `dp_reshardable` saves flat per-bucket buffers as tensors, `dp_zero_gather_scatter` each rank's state as
//! objects (both tested on megatron-core 0.16.1's own checkpoints); `fully_sharded_model_space` would save
//! `optimizer.state.<exp_avg|...>.<param>` tensors, read as any DCP tensor (megatron-core 0.16.1 does not
//! save it on a CPU, so no fixture has it).

use std::collections::HashMap;
use std::path::Path;

use ckpt_tensor::{Buffer, CheckpointRead, DType, Entry, EntryKind, Tensor, TensorInfo, Value, entry_kind};

use crate::error::{Error, Result};
use crate::metadata::StorageMetadata;
use crate::reader::{DcpReader, ReadOptions};

/// The file beside a Megatron-Core checkpoint's DCP files that names its backend.
pub const METADATA_JSON: &str = "metadata.json";
/// The file that holds a Megatron-Core checkpoint's state that is not sharded.
pub const COMMON_PT: &str = "common.pt";

/// How a Megatron-Core checkpoint is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MegatronOptions {
    /// Split layer-stacked tensors (`...layers.<name>` with a leading layer axis) into one entry per layer
    /// (`...layers.<i>.<name>`).
    pub unstack_layers: bool,
    /// Name a GPT model's tensors as a Llama model's (implies [`MegatronOptions::unstack_layers`]); the
    /// `_extra_state` objects, which Llama has no place for, are left out.
    pub llama: bool,
}

impl MegatronOptions {
    /// Splits layer-stacked tensors per layer.
    #[must_use]
    pub fn with_unstack_layers(mut self, on: bool) -> Self {
        self.unstack_layers = on;
        self
    }

    /// Maps a GPT model's names onto Llama's.
    #[must_use]
    pub fn with_llama(mut self, on: bool) -> Self {
        self.llama = on;
        self
    }
}

/// Where an entry's data is.
#[derive(Debug, Clone)]
enum Source {
    /// A DCP entry as it is.
    Key(String),
    /// Layer `layer` of a layer-stacked tensor, rows `rows` (all when `None`) of it, the runs concatenated.
    Rows { key: String, layer: Option<usize>, rows: Option<Vec<(usize, usize)>> },
    /// A value of `common.pt`.
    Common(Value),
}

/// One entry: its name, what it is, where it comes from.
#[derive(Debug, Clone)]
struct Item {
    name: String,
    kind: EntryKind,
    source: Source,
}

/// A Megatron-Core `torch_dist` checkpoint, opened (module docs).
pub struct MegatronReader {
    dcp: DcpReader,
    metadata: serde_json::Value,
    common: Value,
    items: Vec<Item>,
    index: HashMap<String, usize>,
    options: MegatronOptions,
}

impl std::fmt::Debug for MegatronReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MegatronReader")
            .field("dir", &self.dcp.dir())
            .field("entries", &self.items.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// The most layers a layer-stacked tensor may have to be split per layer ([`MegatronOptions::unstack_layers`]):
/// published models have a few hundred; the leading dimension of a crafted file could ask for billions of
/// entries while holding no data (`[N, 0]`).
pub const MAX_STACKED_LAYERS: usize = 1 << 16;

/// Whether `dir` holds a Megatron-Core checkpoint's `metadata.json` (any backend).
pub fn is_megatron(dir: &Path) -> bool {
    dir.join(METADATA_JSON).is_file()
}

/// The layer-stacked part of a key: `(prefix up to and including "layers.", the rest)` when the component
/// after a `layers` component is not a layer number (`decoder.layers.mlp.linear_fc1.weight`).
fn stacked(key: &str) -> Option<(&str, &str)> {
    let mut from = 0;
    while let Some(i) = key[from..].find("layers.") {
        let at = from + i;
        let starts_component = at == 0 || key.as_bytes().get(at - 1) == Some(&b'.');
        let rest = &key[at + "layers.".len()..];
        if starts_component && !rest.is_empty() && !rest.starts_with(|c: char| c.is_ascii_digit()) {
            return Some((&key[..at + "layers.".len()], rest));
        }
        from = at + 1;
    }
    None
}

/// The layer of a per-layer `ShardedObject` key (`<key>/shard_<i>_<n>` or `/shard_<i>.<j>_<n>.<m>`) and the
/// key without its shard suffix.
fn sharded_object(key: &str) -> Option<(&str, usize)> {
    let (base, shard) = key.rsplit_once("/shard_")?;
    let (index, _) = shard.split_once('_')?;
    let layer = index.split('.').next()?.parse().ok()?;
    Some((base, layer))
}

impl MegatronReader {
    /// Opens the Megatron-Core checkpoint in `dir`.
    ///
    /// # Errors
    /// [`Error::MegatronMetadata`] for a missing or unreadable `metadata.json` or another backend than
    /// `torch_dist`; the DCP reader's errors; `common.pt`'s.
    pub fn open(dir: impl AsRef<Path>, read: &ReadOptions, options: MegatronOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let path = dir.join(METADATA_JSON);
        let text = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let metadata: serde_json::Value =
            serde_json::from_slice(&text).map_err(|source| Error::MegatronJson { path: path.clone(), source })?;
        match metadata.get("sharded_backend").and_then(serde_json::Value::as_str) {
            Some("torch_dist") => {}
            Some(other) => {
                return Err(Error::MegatronMetadata {
                    path,
                    problem: format!("sharded backend {other:?}: only the torch_dist backend is read"),
                });
            }
            None => return Err(Error::MegatronMetadata { path, problem: "no \"sharded_backend\"".into() }),
        }
        let dcp = DcpReader::open_with(dir, read)?;
        let common_path = dir.join(COMMON_PT);
        let common = if common_path.is_file() {
            ckpt_torch::TorchReader::open_with(
                &common_path,
                &ckpt_torch::ReadOptions::default().with_limits(read.limits),
            )?
            .into_value()
        } else {
            Value::None
        };
        let mut r = MegatronReader { dcp, metadata, common, items: Vec::new(), index: HashMap::new(), options };
        r.items = r.list()?;
        for (i, item) in r.items.iter().enumerate() {
            r.index.entry(item.name.clone()).or_insert(i);
        }
        Ok(r)
    }

    /// The DCP reader underneath.
    pub fn dcp(&self) -> &DcpReader {
        &self.dcp
    }

    /// `metadata.json`.
    pub fn metadata_json(&self) -> &serde_json::Value {
        &self.metadata
    }

    /// `common.pt`'s value (`None` when the checkpoint has no `common.pt`).
    pub fn common(&self) -> &Value {
        &self.common
    }

    /// The options it was opened with.
    pub fn options(&self) -> MegatronOptions {
        self.options
    }

    /// Whether entry `name` is a tensor of the model (not of the optimizer, not an object or a value of
    /// `common.pt`): what a conversion of the model takes.
    pub fn is_model_tensor(&self, name: &str) -> bool {
        self.index.get(name).and_then(|&i| self.items.get(i)).is_some_and(|item| {
            matches!(item.kind, EntryKind::Tensor(_))
                && !matches!(item.source, Source::Common(_))
                && !name.starts_with("optimizer.")
        })
    }

    /// The integer (or float, truncated; or bool as 0/1) `args.<name>` of `common.pt`, when present.
    pub fn arg(&self, name: &str) -> Option<ArgValue> {
        let args = match &self.common {
            Value::Dict(d) => d.get("args")?,
            _ => return None,
        };
        let attrs = match args {
            Value::Object(o) => o.state.as_ref()?,
            other => other,
        };
        let v = match attrs {
            Value::Dict(d) => d.get(name)?,
            _ => return None,
        };
        match v {
            Value::Bool(b) => Some(ArgValue::Bool(*b)),
            Value::None => Some(ArgValue::None),
            v => v.as_int().map(ArgValue::Int),
        }
    }

    fn tensor_info(&self, key: &str) -> Option<TensorInfo> {
        match self.dcp.storage_metadata(key).ok()? {
            StorageMetadata::Tensor(md) => Some(TensorInfo { dtype: md.properties.dtype, shape: md.size.clone() }),
            StorageMetadata::Bytes => None,
        }
    }

    /// Every entry, named as the options say.
    fn list(&self) -> Result<Vec<Item>> {
        let unstack = self.options.unstack_layers || self.options.llama;
        let mut items = Vec::new();
        let keys: Vec<String> = self.dcp.keys().map(str::to_owned).collect();
        for key in keys {
            match self.tensor_info(&key) {
                Some(info) => match stacked(&key).filter(|_| unstack && !info.shape.is_empty()) {
                    Some((prefix, rest)) => {
                        let layers = info.shape[0];
                        if layers > MAX_STACKED_LAYERS {
                            return Err(Error::MegatronTooManyLayers { key, layers, max: MAX_STACKED_LAYERS });
                        }
                        let shape = info.shape[1..].to_vec();
                        for i in 0..layers {
                            items.push(Item {
                                name: format!("{prefix}{i}.{rest}"),
                                kind: EntryKind::Tensor(TensorInfo { dtype: info.dtype, shape: shape.clone() }),
                                source: Source::Rows { key: key.clone(), layer: Some(i), rows: None },
                            });
                        }
                    }
                    None => {
                        items.push(Item { name: key.clone(), kind: EntryKind::Tensor(info), source: Source::Key(key) })
                    }
                },
                None => {
                    let name = match sharded_object(&key).filter(|_| unstack) {
                        Some((base, layer)) => match stacked(base) {
                            Some((prefix, rest)) => format!("{prefix}{layer}.{rest}"),
                            None => key.clone(),
                        },
                        None => key.clone(),
                    };
                    items.push(Item { name, kind: EntryKind::Value, source: Source::Key(key) });
                }
            }
        }
        if self.options.llama {
            items = self.llama(items)?;
        }
        if let Value::Dict(_) = &self.common {
            for leaf in ckpt_tensor::leaves(&self.common)? {
                items.push(Item {
                    name: leaf.key.clone(),
                    kind: entry_kind(leaf.value),
                    source: Source::Common(leaf.value.clone()),
                });
            }
        }
        Ok(items)
    }

    /// The head layout of the attention: `(query groups, query heads per group, kv_channels)`, from `args`.
    fn head_layout(&self, key: &str, hidden: Option<usize>) -> Result<(usize, usize, usize)> {
        let missing = |what: &str| Error::MegatronLayout {
            key: key.to_owned(),
            problem: format!("splitting linear_qkv needs args.{what} in common.pt"),
        };
        let int = |name: &str| match self.arg(name) {
            Some(ArgValue::Int(i)) => usize::try_from(i).ok(),
            _ => None,
        };
        let heads = int("num_attention_heads").filter(|&h| h > 0).ok_or_else(|| missing("num_attention_heads"))?;
        let groups = match self.arg("group_query_attention") {
            Some(ArgValue::Bool(false)) => heads,
            _ => int("num_query_groups").unwrap_or(heads),
        };
        let channels = match int("kv_channels") {
            Some(c) => c,
            None => {
                let h = int("hidden_size").or(hidden).ok_or_else(|| missing("kv_channels"))?;
                h / heads
            }
        };
        if groups == 0 || heads % groups != 0 || channels == 0 {
            return Err(Error::MegatronLayout {
                key: key.to_owned(),
                problem: format!("{heads} attention heads in {groups} query groups of {channels} channels"),
            });
        }
        Ok((groups, heads / groups, channels))
    }

    /// Whether the MLP is gated (SwiGLU): `args.swiglu` / `args.gated_linear_unit`, else `linear_fc1` has
    /// twice the rows `linear_fc2` has columns.
    fn gated(&self, fc1_rows: usize, fc2_cols: Option<usize>) -> bool {
        for name in ["swiglu", "gated_linear_unit"] {
            if let Some(ArgValue::Bool(b)) = self.arg(name) {
                return b;
            }
        }
        fc2_cols.is_some_and(|c| fc1_rows == 2 * c)
    }

    /// `items` (unstacked) under Llama's names.
    fn llama(&self, items: Vec<Item>) -> Result<Vec<Item>> {
        let fc2_cols: HashMap<String, usize> = items
            .iter()
            .filter_map(|i| {
                let layer = i.name.strip_prefix("module.").unwrap_or(&i.name).strip_suffix(".mlp.linear_fc2.weight")?;
                match &i.kind {
                    EntryKind::Tensor(t) => t.shape.get(1).map(|&c| (layer.to_owned(), c)),
                    _ => None,
                }
            })
            .collect();
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let EntryKind::Tensor(info) = &item.kind else { continue }; // _extra_state and other objects
            // Megatron's DDP wrapper names the model `module.` in its state dict.
            let unwrapped = item.name.strip_prefix("module.").unwrap_or(&item.name);
            let Some(rest) = unwrapped.strip_prefix("decoder.layers.") else {
                let name = match unwrapped {
                    "embedding.word_embeddings.weight" => "model.embed_tokens.weight".to_owned(),
                    "decoder.final_layernorm.weight" => "model.norm.weight".to_owned(),
                    "decoder.final_layernorm.bias" => "model.norm.bias".to_owned(),
                    "output_layer.weight" => "lm_head.weight".to_owned(),
                    _ => item.name.clone(),
                };
                out.push(Item { name, ..item });
                continue;
            };
            let Some((layer, tail)) = rest.split_once('.') else {
                out.push(item);
                continue;
            };
            let to = |t: &str| format!("model.layers.{layer}.{t}");
            let (rows, Source::Rows { key, layer: l, .. }) = (info.shape.first().copied().unwrap_or(0), &item.source)
            else {
                out.push(item);
                continue;
            };
            let part = |name: String, runs: Vec<(usize, usize)>| {
                let n: usize = runs.iter().map(|r| r.1).sum();
                let mut shape = info.shape.clone();
                if let Some(s) = shape.first_mut() {
                    *s = n;
                }
                Item {
                    name,
                    kind: EntryKind::Tensor(TensorInfo { dtype: info.dtype, shape }),
                    source: Source::Rows { key: key.clone(), layer: *l, rows: Some(runs) },
                }
            };
            match tail {
                "self_attention.linear_qkv.weight" | "self_attention.linear_qkv.bias" => {
                    let (groups, per_group, d) = self.head_layout(key, info.shape.get(1).copied())?;
                    let stride = (per_group + 2) * d;
                    if rows != groups * stride {
                        return Err(Error::MegatronLayout {
                            key: key.clone(),
                            problem: format!(
                                "{rows} rows, but {groups} query groups of {per_group} query heads, a key and a value \
                                 head of {d} channels make {}",
                                groups * stride
                            ),
                        });
                    }
                    let suffix = tail.rsplit('.').next().unwrap_or("weight");
                    let q = (0..groups).map(|g| (g * stride, per_group * d)).collect();
                    let k = (0..groups).map(|g| (g * stride + per_group * d, d)).collect();
                    let v = (0..groups).map(|g| (g * stride + (per_group + 1) * d, d)).collect();
                    out.push(part(to(&format!("self_attn.q_proj.{suffix}")), q));
                    out.push(part(to(&format!("self_attn.k_proj.{suffix}")), k));
                    out.push(part(to(&format!("self_attn.v_proj.{suffix}")), v));
                }
                "mlp.linear_fc1.weight" | "mlp.linear_fc1.bias" => {
                    let suffix = tail.rsplit('.').next().unwrap_or("weight");
                    let layer_key = format!("decoder.layers.{layer}");
                    if self.gated(rows, fc2_cols.get(&layer_key).copied()) && rows % 2 == 0 {
                        out.push(part(to(&format!("mlp.gate_proj.{suffix}")), vec![(0, rows / 2)]));
                        out.push(part(to(&format!("mlp.up_proj.{suffix}")), vec![(rows / 2, rows / 2)]));
                    } else {
                        out.push(Item { name: to(&format!("mlp.up_proj.{suffix}")), ..item });
                    }
                }
                _ => {
                    let name = match tail {
                        "input_layernorm.weight" | "self_attention.linear_qkv.layer_norm_weight" => {
                            to("input_layernorm.weight")
                        }
                        "input_layernorm.bias" | "self_attention.linear_qkv.layer_norm_bias" => {
                            to("input_layernorm.bias")
                        }
                        "pre_mlp_layernorm.weight" | "mlp.linear_fc1.layer_norm_weight" => {
                            to("post_attention_layernorm.weight")
                        }
                        "pre_mlp_layernorm.bias" | "mlp.linear_fc1.layer_norm_bias" => {
                            to("post_attention_layernorm.bias")
                        }
                        "self_attention.linear_proj.weight" => to("self_attn.o_proj.weight"),
                        "self_attention.linear_proj.bias" => to("self_attn.o_proj.bias"),
                        "self_attention.q_layernorm.weight" => to("self_attn.q_norm.weight"),
                        "self_attention.k_layernorm.weight" => to("self_attn.k_norm.weight"),
                        "mlp.linear_fc2.weight" => to("mlp.down_proj.weight"),
                        "mlp.linear_fc2.bias" => to("mlp.down_proj.bias"),
                        _ => item.name.clone(),
                    };
                    out.push(Item { name, ..item });
                }
            }
        }
        Ok(out)
    }

    fn item(&self, name: &str) -> Result<&Item> {
        self.index.get(name).and_then(|&i| self.items.get(i)).ok_or_else(|| Error::NoSuchEntry(name.to_owned()))
    }

    /// The tensor `name`: a DCP tensor as DCP assembles it, one layer of a stacked tensor (a region read), or
    /// runs of rows of one (read and concatenated when its bytes are asked for).
    ///
    /// # Errors
    /// [`Error::NoSuchEntry`], [`Error::NotATensor`], and the DCP reader's errors.
    pub fn read_tensor(&self, name: &str) -> Result<Tensor> {
        let item = self.item(name)?;
        let EntryKind::Tensor(info) = &item.kind else { return Err(Error::NotATensor(name.to_owned())) };
        match &item.source {
            Source::Key(key) => self.dcp.read_tensor(key),
            Source::Common(v) => v.as_tensor().cloned().ok_or_else(|| Error::NotATensor(name.to_owned())),
            Source::Rows { key, layer, rows } => {
                let md = self.dcp.tensor_metadata(key)?;
                let full = md.size.clone();
                let inner: Vec<usize> = if layer.is_some() { full[1..].to_vec() } else { full.clone() };
                let region = |start: usize, len: usize| -> Result<Tensor> {
                    let mut offsets = vec![0; full.len()];
                    let mut sizes = full.clone();
                    let row_dim = usize::from(layer.is_some());
                    if let Some(l) = layer {
                        offsets[0] = *l;
                        sizes[0] = 1;
                    }
                    if let (Some(o), Some(s)) = (offsets.get_mut(row_dim), sizes.get_mut(row_dim)) {
                        *o = start;
                        *s = len;
                    }
                    self.dcp.read_region(key, &offsets, &sizes)
                };
                let runs = rows.clone().unwrap_or_else(|| vec![(0, inner.first().copied().unwrap_or(0))]);
                let runs = if inner.is_empty() { vec![(0, 1)] } else { runs };
                if inner.is_empty() {
                    // A stacked scalar: one element per layer.
                    let mut offsets = vec![0; full.len()];
                    let mut sizes = full.clone();
                    if let Some(l) = layer {
                        offsets[0] = *l;
                        sizes[0] = 1;
                    }
                    return Ok(self.dcp.read_region(key, &offsets, &sizes)?.reshape(&[])?);
                }
                if let [(start, len)] = runs.as_slice() {
                    return Ok(region(*start, *len)?.reshape(&info.shape)?);
                }
                let parts: Vec<Tensor> = runs.iter().map(|&(s, l)| region(s, l)).collect::<Result<_>>()?;
                concat_rows(info.dtype, &info.shape, parts)
            }
        }
    }
}

/// The concatenation of `parts` (each made contiguous when its bytes are asked for) as one tensor of
/// `shape`, made when its bytes are asked for.
fn concat_rows(dtype: DType, shape: &[usize], parts: Vec<Tensor>) -> Result<Tensor> {
    // Each part's bytes as a buffer without making them now: a view of a row-major part, a deferred gather of
    // a strided one.
    let bytes = |p: Tensor| -> Result<Buffer> {
        if p.is_contiguous() {
            return Ok(p.to_contiguous()?.storage().clone());
        }
        Ok(Buffer::deferred(p.nbytes(), move |out| {
            out.copy_from_slice(&p.data()?);
            Ok(())
        }))
    };
    let parts = parts.into_iter().map(bytes).collect::<Result<Vec<_>>>()?;
    Ok(Tensor::from_buffer(dtype, shape, Buffer::concat(parts))?)
}

/// A value of `args` in `common.pt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgValue {
    /// An int (a float truncated is not taken).
    Int(i64),
    /// A bool.
    Bool(bool),
    /// `None`.
    None,
}

impl CheckpointRead for MegatronReader {
    fn format_name(&self) -> &'static str {
        "megatron"
    }

    fn entries(&self) -> Vec<Entry> {
        self.items.iter().map(|i| Entry { name: i.name.clone(), kind: i.kind.clone() }).collect()
    }

    fn details(&self) -> Vec<(String, String)> {
        let mut d = Vec::new();
        if let serde_json::Value::Object(m) = &self.metadata {
            for (k, v) in m {
                d.push((k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned)));
            }
        }
        if let Value::Dict(c) = &self.common {
            if let Some(it) = c.get("iteration").and_then(Value::as_int) {
                d.push(("iteration".into(), it.to_string()));
            }
        }
        d.push(("tensor-parallel chunks joined".into(), "yes".into()));
        if self.options.llama {
            d.push(("names".into(), "llama".into()));
        } else if self.options.unstack_layers {
            d.push(("layers".into(), "unstacked".into()));
        }
        d.extend(self.dcp.details());
        d
    }

    fn tensor(&self, name: &str) -> ckpt_tensor::Result<Tensor> {
        Ok(self.read_tensor(name)?)
    }

    fn value(&self, name: &str) -> ckpt_tensor::Result<Value> {
        let item = self.item(name)?;
        Ok(match &item.source {
            Source::Common(v) => v.clone(),
            Source::Key(key) => self.dcp.read_value(key)?,
            Source::Rows { .. } => Value::Tensor(self.read_tensor(name)?),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use ckpt_tensor::Fault;
    use ckpt_tensor::FormatError;

    #[test]
    fn stacked_keys() {
        assert_eq!(stacked("decoder.layers.mlp.linear_fc1.weight"), Some(("decoder.layers.", "mlp.linear_fc1.weight")));
        assert_eq!(stacked("decoder.layers.0.mlp.linear_fc1.weight"), None);
        assert_eq!(stacked("embedding.word_embeddings.weight"), None);
        assert_eq!(stacked("mtp.layers.enorm.weight"), Some(("mtp.layers.", "enorm.weight")));
        assert_eq!(stacked("decoder.sublayers.x"), None);
        assert_eq!(
            sharded_object("decoder.layers.mlp.linear_fc1._extra_state/shard_1_2"),
            Some(("decoder.layers.mlp.linear_fc1._extra_state", 1))
        );
        assert_eq!(sharded_object("a/shard_0.1_2.2"), Some(("a", 0)));
        assert_eq!(sharded_object("a.b"), None);
    }

    /// A stacked tensor of shape `[N, 0]` holds no data but would split into `N` entries: over
    /// [`MAX_STACKED_LAYERS`] it is refused as a limit when unstacking, and read as one entry otherwise.
    #[test]
    fn a_stacked_tensor_of_too_many_layers_is_refused_when_unstacking() {
        let dir = tempfile::tempdir().unwrap();
        let layers = MAX_STACKED_LAYERS + 1;
        let t = Tensor::zeros(DType::F32, &[layers, 0]).unwrap();
        let sd = Value::dict([("decoder.layers.mlp.weight", Value::Tensor(t))]);
        crate::save(&sd, dir.path(), &crate::WriteOptions::default()).unwrap();
        std::fs::write(dir.path().join(METADATA_JSON), br#"{"sharded_backend": "torch_dist"}"#).unwrap();
        let read = ReadOptions::default();
        let e =
            MegatronReader::open(dir.path(), &read, MegatronOptions::default().with_unstack_layers(true)).unwrap_err();
        assert!(
            matches!(&e, Error::MegatronTooManyLayers { key, layers: l, max }
                if key == "decoder.layers.mlp.weight" && *l == layers && *max == MAX_STACKED_LAYERS),
            "{e}"
        );
        assert_eq!(e.fault(), Fault::Limit);
        let r = MegatronReader::open(dir.path(), &read, MegatronOptions::default()).unwrap();
        assert_eq!(r.items.len(), 1);
        // At the limit, the split is made.
        let t = Tensor::zeros(DType::F32, &[MAX_STACKED_LAYERS, 0]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        crate::save(&Value::dict([("decoder.layers.mlp.weight", Value::Tensor(t))]), dir.path(), &Default::default())
            .unwrap();
        std::fs::write(dir.path().join(METADATA_JSON), br#"{"sharded_backend": "torch_dist"}"#).unwrap();
        let r = MegatronReader::open(dir.path(), &read, MegatronOptions::default().with_unstack_layers(true)).unwrap();
        assert_eq!(r.items.len(), MAX_STACKED_LAYERS);
    }
}
