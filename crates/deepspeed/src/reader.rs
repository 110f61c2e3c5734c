//! [`DeepSpeedReader`]: a checkpoint opened, its entries named, its tensors made when read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ckpt_tensor::{CheckpointRead, Entry, Tensor, Value, entry_kind};

use crate::error::{Error, Result};
use crate::files::{At, tag_dir};
use crate::zero::{Consolidated, ENGINE_KEYS, LAYOUT_KEYS, push_leaves};

/// Options of [`DeepSpeedReader::open_with`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReadOptions {
    /// The tag to read under a checkpoint root (`global_step14`); default: the one `latest` names.
    pub tag: Option<String>,
    /// How the `torch.save` files are read (pickle limits).
    pub torch: ckpt_torch::ReadOptions,
}

impl ReadOptions {
    /// Reads the tag `tag` instead of the one `latest` names.
    #[must_use]
    pub fn with_tag(mut self, tag: &str) -> Self {
        self.tag = Some(tag.to_owned());
        self
    }

    /// Reads the `torch.save` files with `options`.
    #[must_use]
    pub fn with_torch(mut self, options: ckpt_torch::ReadOptions) -> Self {
        self.torch = options;
        self
    }
}

/// What kind of checkpoint a tag directory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// A ZeRO checkpoint as `engine.save_checkpoint` writes it.
    Zero,
    /// A universal checkpoint (`ds_to_universal`).
    Universal,
    /// A checkpoint `engine.save_checkpoint` writes with DeepSpeed's `BF16_Optimizer` (bf16 with fp32
    /// gradient accumulation, ZeRO stage 1): flat fp32 partitions joined by `param_slice_mappings`.
    Bf16Optimizer,
}

/// A DeepSpeed checkpoint, opened: the consolidated state dict, the module's own weights, the optimizer
/// state per parameter and the rest of the model states file (engine and client state), as entries.
///
/// Entries, in this order:
/// - `<param>`: the consolidated state dict, named as `model.named_parameters()` and `named_buffers()` name
///   them, equal bit for bit to `get_fp32_state_dict_from_zero_checkpoint` (buffers, frozen parameters,
///   trained parameters, tied parameters under each name) — [`DeepSpeedReader::model`];
/// - `module.<name>`: the module's weights as stored (fp16/bf16 for mixed precision; ZeRO 3 stores only the
///   buffers);
/// - `optimizer.state.<param>.<key>`: the optimizer state of each trained parameter (`exp_avg`,
///   `exp_avg_sq`, `step`), and `optimizer.<key>...`: the optimizer's other values (`loss_scaler`,
///   `zero_stage`, `param_groups.<i>.lr`, ...);
/// - every other item of the model states file by its flattened name: the engine's (`global_steps`,
///   `ds_config.zero_optimization.stage`, `ds_version`, ...) and the client state's.
///
/// An entry whose name an earlier one already has is left out (a parameter named like an engine key).
pub struct DeepSpeedReader {
    dir: PathBuf,
    tag: String,
    kind: Kind,
    stage: usize,
    world: usize,
    model: Vec<(String, Tensor)>,
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    client: Vec<(String, Value)>,
    details: Vec<(String, String)>,
}

impl std::fmt::Debug for DeepSpeedReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeepSpeedReader")
            .field("dir", &self.dir)
            .field("tag", &self.tag)
            .field("kind", &self.kind)
            .field("stage", &self.stage)
            .field("world", &self.world)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl DeepSpeedReader {
    /// Opens the checkpoint at `path`: a checkpoint root (its `latest` tag, or `latest_universal`'s) or a
    /// tag directory.
    ///
    /// # Errors
    /// [`Error::NotACheckpoint`], [`Error::MissingTag`], and what reading the files finds wrong.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::open_with(path, &ReadOptions::default())
    }

    /// [`DeepSpeedReader::open`] with `options` (the tag, pickle limits).
    ///
    /// # Errors
    /// As [`DeepSpeedReader::open`].
    pub fn open_with(path: impl AsRef<Path>, options: &ReadOptions) -> Result<Self> {
        let path = path.as_ref();
        let (dir, tag) = tag_dir(path, options.tag.as_deref())?;
        let universal = dir.join("zero").is_dir();
        let c = if universal {
            crate::universal::read(&dir, &options.torch)?
        } else {
            // ZeRO's optimizer states, or BF16_Optimizer's: the first rank's file says which.
            let (files, optim) = crate::zero::optim_states(&dir, &options.torch)?;
            let bf16 = match crate::zero::rank_osds(&files, &optim)?.first() {
                Some(osd0) => crate::bf16_optimizer::is_bf16_optimizer(*osd0)?,
                None => false,
            };
            if bf16 {
                crate::bf16_optimizer::read(&dir, &files, &optim, &options.torch)?
            } else {
                crate::zero::read(&dir, &files, &optim, &options.torch)?
            }
        };
        let kind = if universal {
            Kind::Universal
        } else if c.bf16_optimizer {
            Kind::Bf16Optimizer
        } else {
            Kind::Zero
        };
        Self::from_parts(dir, tag, kind, c)
    }

    fn from_parts(dir: PathBuf, tag: String, kind: Kind, c: Consolidated) -> Result<Self> {
        let Consolidated { stage, world, model, module, optimizer, model_states, .. } = c;
        let mut entries: Vec<(String, Value)> = Vec::new();
        let mut index = HashMap::new();
        // The consolidated state dict must be whole: a repeated name there is a broken checkpoint.
        for (name, t) in &model {
            if index.contains_key(name) {
                return Err(Error::DuplicateName { dir, name: name.clone() });
            }
            index.insert(name.clone(), entries.len());
            entries.push((name.clone(), Value::Tensor(t.clone())));
        }
        let push =
            |entries: &mut Vec<(String, Value)>, index: &mut HashMap<String, usize>, name: String, value: Value| {
                if let std::collections::hash_map::Entry::Vacant(slot) = index.entry(name.clone()) {
                    slot.insert(entries.len());
                    entries.push((name, value));
                }
            };
        for (name, v) in module.into_iter().chain(optimizer) {
            push(&mut entries, &mut index, name, v);
        }
        let mut client = Vec::new();
        let mut details = vec![("tag".to_owned(), tag.clone())];
        if let Value::Dict(_) = &model_states {
            let at = At::top(&dir, &model_states);
            for (k, v) in at.named()? {
                if LAYOUT_KEYS.contains(&k) {
                    continue;
                }
                let mut leaves = Vec::new();
                push_leaves(k, v.value, &mut leaves)?;
                for (name, value) in leaves {
                    push(&mut entries, &mut index, name, value);
                }
                if !ENGINE_KEYS.contains(&k) {
                    client.push((k.to_owned(), v.value.clone()));
                }
                if k == "ds_version" {
                    if let Some(s) = v.value.as_str() {
                        details.push(("ds_version".into(), s.to_owned()));
                    }
                }
            }
        }
        let kind_name = match kind {
            Kind::Zero => "zero",
            Kind::Universal => "universal",
            Kind::Bf16Optimizer => "zero (BF16_Optimizer)",
        };
        details.push(("kind".into(), kind_name.into()));
        if stage > 0 {
            details.push(("zero stage".into(), stage.to_string()));
        }
        if world > 0 {
            details.push(("data-parallel ranks".into(), world.to_string()));
        }
        let sixteen = entries
            .iter()
            .filter(|(n, _)| n.starts_with("module."))
            .filter_map(|(_, v)| v.as_tensor())
            .map(Tensor::dtype)
            .find(|d| matches!(d, ckpt_tensor::DType::BF16 | ckpt_tensor::DType::F16));
        if let Some(d) = sixteen {
            details.push(("precision".into(), format!("{d} with fp32 master weights")));
        }
        details.push(("parameters".into(), model.len().to_string()));
        Ok(DeepSpeedReader { dir, tag, kind, stage, world, model, entries, index, client, details })
    }

    /// The tag directory read.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every `torch.save` file of the tag directory (a universal checkpoint's `zero/<param>/*.pt` too), sorted.
    ///
    /// # Errors
    /// [`Error::Io`] when a directory cannot be listed.
    pub fn files(&self) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        let mut dirs = vec![self.dir.clone()];
        while let Some(d) = dirs.pop() {
            for name in crate::files::names(&d)? {
                let p = d.join(&name);
                if p.is_dir() {
                    dirs.push(p);
                } else if name.ends_with(".pt") {
                    out.push(p);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The tag read (`global_step14`).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// A ZeRO, `BF16_Optimizer` or universal checkpoint.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The ZeRO stage (1, 2 or 3; for `BF16_Optimizer`, the stage its configuration names; 0 when a
    /// universal checkpoint does not say).
    pub fn stage(&self) -> usize {
        self.stage
    }

    /// The data-parallel world size of the save (0 when a universal checkpoint does not say).
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The consolidated state dict, as `get_fp32_state_dict_from_zero_checkpoint` returns it: buffers
    /// (floating-point ones as float32), frozen parameters, fp32 master weights, tied parameters under each
    /// of their names. Tensors split over ranks are made from the ranks' files when their bytes are read,
    /// any range at a time, so that a writer streaming them holds a piece of one at a time.
    pub fn model(&self) -> &[(String, Tensor)] {
        &self.model
    }

    /// The client state: the items of the model states file that the engine did not write itself
    /// (`save_checkpoint(client_state=...)`).
    pub fn client_state(&self) -> &[(String, Value)] {
        &self.client
    }

    /// Every entry (see the type's documentation), in order.
    pub fn items(&self) -> &[(String, Value)] {
        &self.entries
    }

    fn get(&self, name: &str) -> Result<&Value> {
        self.index
            .get(name)
            .and_then(|&i| self.entries.get(i))
            .map(|(_, v)| v)
            .ok_or_else(|| Error::NoEntry { name: name.to_owned() })
    }
}

impl CheckpointRead for DeepSpeedReader {
    fn format_name(&self) -> &'static str {
        "deepspeed"
    }

    fn entries(&self) -> Vec<Entry> {
        self.entries.iter().map(|(name, v)| Entry { name: name.clone(), kind: entry_kind(v) }).collect()
    }

    fn details(&self) -> Vec<(String, String)> {
        self.details.clone()
    }

    fn tensor(&self, name: &str) -> ckpt_tensor::Result<Tensor> {
        let v = self.get(name)?;
        v.as_tensor().cloned().ok_or_else(|| {
            Error::WrongKind { name: name.to_owned(), expected: "a tensor", found: v.type_name() }.into()
        })
    }

    fn value(&self, name: &str) -> ckpt_tensor::Result<Value> {
        Ok(self.get(name)?.clone())
    }
}
