//! What the facade does with a format, as one trait ([`Adaptor`]) implemented once per format in
//! `formats/<format>.rs`, and what conversions pass between formats ([`Source`], [`Content`]).

use std::any::Any;
use std::path::Path;

use ckpt_core::{CheckpointRead, Dict, EntryKind, PathItem, Value, unflatten};

use crate::convert::{ConvertOptions, ConvertSummary};
use crate::error::{At, Error, Result};
use crate::verify::{Progress, VerifyReport, read_all};
use crate::{Checkpoint, Format};

/// A format's reader, type-erased but downcastable to the format crate's concrete type.
pub(crate) trait Reader: CheckpointRead + Send + Sync {
    /// The concrete reader.
    fn as_any(&self) -> &dyn Any;
}

impl<T: CheckpointRead + Send + Sync + 'static> Reader for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What the facade does with one format: open it, read its content for a conversion, write a converted
/// content, verify it, reshard it. One implementation per format, in `formats/<format>.rs`, listed in the
/// registry (`formats.rs`); nothing else in the facade names a format crate.
///
/// Call protocol: [`open`](Adaptor::open), [`read`](Adaptor::read), [`verify`](Adaptor::verify),
/// [`reshard`](Adaptor::reshard) and [`stream_to_torch_save`](Adaptor::stream_to_torch_save) take a path
/// detected (or declared) as this adaptor's format; [`write`](Adaptor::write) takes a [`Source`] of any
/// format and writes this format at `dst`; [`explain`](Adaptor::explain) takes any file no format
/// recognised. Capabilities a format lacks have defaults: the generic reading of every entry, no streaming,
/// no resharding (asked only of formats the registry marks as sharded).
pub(crate) trait Adaptor: Sync {
    /// The format.
    fn format(&self) -> Format;

    /// Opens `path` for reading: the format crate's reader behind the generic interface.
    fn open(&self, path: &Path) -> Result<Box<dyn Reader>>;

    /// The content of `path` for a conversion: every entry as a leaf, and the nested state dict. Default: one
    /// leaf per entry of [`open`](Adaptor::open), the state dict rebuilt from the names.
    fn read(&self, path: &Path) -> Result<Content> {
        let ck = self.checkpoint(path)?;
        let mut leaves = Vec::new();
        for e in ck.entries() {
            let value = match e.kind {
                EntryKind::Tensor(_) => Value::Tensor(ck.tensor(&e.name)?),
                _ => ck.value(&e.name)?,
            };
            leaves.push(Leaf { path: vec![PathItem::Key(e.name.clone())], name: e.name, value });
        }
        Content::from_leaves(leaves, path)
    }

    /// Writes the content of `source` (any format) as this format at `dst`: a file for single-file formats, a
    /// directory (created if needed) for the others. What the target cannot hold is reported in
    /// [`ConvertSummary::dropped`], or refused with [`Error::UnsupportedConversion`].
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary>;

    /// Writes the checkpoint at `src` as one `torch.save` file at `dst` without building its state dict in
    /// memory, when the format can (`None`: it cannot, and the torch target reads the content whole).
    // Asked by the torch target only.
    #[cfg_attr(not(feature = "torch"), allow(dead_code))]
    fn stream_to_torch_save(&self, _src: &Path, _dst: &Path) -> Option<Result<ConvertSummary>> {
        None
    }

    /// Checks `path` end to end into `report`: the format's own checks (checksums, coverage, commit state),
    /// then, by default, every entry read to its last byte.
    fn verify(&self, path: &Path, report: &mut VerifyReport, progress: Progress<'_>) -> Result<()> {
        read_all(&self.checkpoint(path)?, report, progress);
        Ok(())
    }

    /// Rewrites the checkpoint at `src` in `dst` for `world` ranks, shards or parts, in the format's own
    /// layout. Asked only of formats the registry marks as sharded.
    fn reshard(&self, src: &Path, _dst: &Path, _world: usize) -> Result<()> {
        Err(Error::InvalidArgument {
            path: src.to_path_buf(),
            reason: format!("a {} checkpoint has no shards to reshard", self.format()),
        })
    }

    /// What a file no format recognised is instead (a git-LFS pointer, an HTML page, ...), when this format
    /// can tell from its leading bytes.
    fn explain(&self, _head: &[u8], _path: &Path) -> Option<Error> {
        None
    }

    /// `path` opened as this format.
    fn checkpoint(&self, path: &Path) -> Result<Checkpoint> {
        Ok(Checkpoint::new(self.format(), path, self.open(path)?))
    }
}

/// The checkpoint a conversion reads from.
pub(crate) struct Source<'a> {
    /// Its path.
    pub path: &'a Path,
    /// Its format.
    // Read by the targets that name the source in what they report.
    #[cfg_attr(
        not(any(feature = "safetensors", feature = "distcp", feature = "hfai", feature = "pbg", feature = "recis")),
        allow(dead_code)
    )]
    pub format: Format,
    adaptor: &'a dyn Adaptor,
}

impl<'a> Source<'a> {
    /// The checkpoint at `path`, of `format`, read through `adaptor`.
    pub fn new(path: &'a Path, adaptor: &'a dyn Adaptor) -> Self {
        Source { path, format: adaptor.format(), adaptor }
    }

    /// Its content: every entry, and the nested state dict.
    pub fn content(&self) -> Result<Content> {
        self.adaptor.read(self.path)
    }

    /// Writes it as a `torch.save` file at `dst` streaming, when its format can
    /// ([`Adaptor::stream_to_torch_save`]).
    #[cfg_attr(not(feature = "torch"), allow(dead_code))]
    pub fn stream_to_torch_save(&self, dst: &Path) -> Option<Result<ConvertSummary>> {
        self.adaptor.stream_to_torch_save(self.path, dst)
    }

    /// The top-level mapping of its state dict, or the reason a `to` checkpoint, which holds one, cannot
    /// hold it.
    // For the targets whose checkpoints hold a mapping.
    #[cfg_attr(not(any(feature = "distcp", feature = "hfai", feature = "recis")), allow(dead_code))]
    pub fn top_mapping<'c>(&self, content: &'c Content, to: Format) -> Result<&'c Dict> {
        content.tree.as_dict().ok_or_else(|| Error::UnsupportedConversion {
            from: self.format,
            to,
            reason: format!(
                "{to} checkpoints hold a mapping; the source's top level is a {}",
                content.tree.type_name()
            ),
        })
    }
}

/// One entry of a source: its name (as [`Checkpoint::entries`] names it), its path in the nested state dict,
/// and its value (tensors are views, usually of a memory map).
#[derive(Debug, Clone)]
pub(crate) struct Leaf {
    pub name: String,
    pub path: Vec<PathItem>,
    pub value: Value,
}

/// A source's content.
pub(crate) struct Content {
    /// The nested value the format holds, or the state dict rebuilt from the leaves' paths.
    pub tree: Value,
    /// Every entry, in the source's order.
    pub leaves: Vec<Leaf>,
}

impl Content {
    /// The content of a nested value: its leaves are every value in it (each mapping, list and tuple
    /// descended into), named as torch and hfai name their entries.
    #[cfg_attr(not(any(feature = "torch", feature = "hfai")), allow(dead_code))]
    pub fn from_tree(tree: Value, path: &Path) -> Result<Content> {
        let leaves = ckpt_core::leaves(&tree)
            .at(path)?
            .into_iter()
            .map(|l| Leaf { name: l.key, path: l.path, value: l.value.clone() })
            .collect();
        Ok(Content { tree, leaves })
    }

    /// The content of `leaves`: the nested state dict their paths make (DCP's `set_element`), or a flat
    /// `dict` by name when the paths do not nest consistently (a path crossing a leaf, a first step that is an
    /// index).
    pub fn from_leaves(leaves: Vec<Leaf>, path: &Path) -> Result<Content> {
        let tree = match unflatten(leaves.iter().map(|l| (l.path.clone(), l.value.clone()))) {
            Ok(v) => v,
            Err(_) => {
                unflatten(leaves.iter().map(|l| (vec![PathItem::Key(l.name.clone())], l.value.clone()))).at(path)?
            }
        };
        Ok(Content { tree, leaves })
    }
}

/// The summary of a target that writes every one of `leaves`.
#[cfg_attr(not(any(feature = "torch", feature = "hfai", feature = "pbg", feature = "recis")), allow(dead_code))]
pub(crate) fn count<'a>(leaves: impl IntoIterator<Item = &'a Leaf>) -> ConvertSummary {
    let mut s = ConvertSummary::default();
    for l in leaves {
        match l.value.as_tensor() {
            Some(t) => {
                s.tensors += 1;
                s.bytes += t.nbytes() as u64;
            }
            None => s.values += 1,
        }
    }
    s
}
