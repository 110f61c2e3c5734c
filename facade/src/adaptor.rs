//! What the facade does with a format, as one trait ([`Adaptor`]) implemented once per format in
//! `formats/<format>.rs`, and what conversions pass between formats ([`Source`], [`Content`]).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use ckpt_collective::Collective;
#[cfg(feature = "remote")]
use ckpt_io::storage::ObjectLayout;
use ckpt_tensor::flatten::python_str;
use ckpt_tensor::{Dict, EntryKind, PathItem, Value, unflatten};

use crate::checkpoint::{Checkpoint, Reader};
use crate::error::{At, Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::{ConvertOptions, Depth};
use crate::report::{ConvertSummary, Problem, ProblemKind, Progress, VerifyReport};
use crate::select::Selection;
use crate::source::SourceOptions;

/// What the facade does with one format: open it, read its content for a conversion, write a converted
/// content, verify it, reshard it. One implementation per format, in `formats/<format>.rs`, listed in the
/// registry (`formats.rs`); nothing else in the facade names a format crate.
///
/// Call protocol: [`open`](Adaptor::open), [`read_source`](Adaptor::read_source), [`verify`](Adaptor::verify),
/// [`reshard`](Adaptor::reshard) and [`object_for_torch_save`](Adaptor::object_for_torch_save) take a path
/// detected (or declared) as this adaptor's format; [`write`](Adaptor::write) takes a [`Source`] of any
/// format and writes this format at `dst`; [`explain`](Adaptor::explain) takes any file no format
/// recognised. Capabilities a format lacks have defaults: the generic reading of every entry, no streaming,
/// no resharding (asked only of formats the registry marks as sharded). Every method that reads takes the
/// call's [`ReadLimits`] and hands them to the format crate's reader options.
pub(crate) trait Adaptor: Sync {
    /// The format.
    fn format(&self) -> Format;

    /// Opens `path` for reading: the format crate's reader behind the generic interface.
    fn open(&self, path: &Path, limits: &ReadLimits) -> Result<Box<dyn Reader>>;

    /// [`open`](Adaptor::open), read as `source` says (a tag, unstacked layers, a name map). Default: the
    /// options do not apply to the format, which opens as it is.
    fn open_source(&self, path: &Path, limits: &ReadLimits, _source: &SourceOptions) -> Result<Box<dyn Reader>> {
        self.open(path, limits)
    }

    /// The content of `path` for a conversion, read as `source` says (a partial copy through its fill
    /// hook, [`SourceOptions::fills`]): every entry as a leaf, and the nested state dict. A format may leave
    /// the entries `selection` drops unread, their leaves `None` (which [`Content::select`] drops), so that
    /// a partial copy fetches nothing of them. Default: one leaf per entry of [`open`](Adaptor::open), the
    /// state dict rebuilt from the names; the options do not apply, every entry is read.
    fn read_source(
        &self,
        path: &Path,
        limits: &ReadLimits,
        _source: &SourceOptions,
        _selection: &Selection,
    ) -> Result<Content> {
        let ck = self.checkpoint(path, limits)?;
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

    /// [`read_source`](Adaptor::read_source) (default options, every entry) for a target that reads a tensor only where it writes it: tensors the reader
    /// would assemble into new memory may be outlines (their dtype and shape, no data) that
    /// [`Outlined::resolve`] reads when the target writes them. Default: [`read_source`](Adaptor::read_source), no outlines
    /// (tensors are windows of memory maps, whose pages are read only when touched). Asked by the targets
    /// that write split over processes.
    #[cfg(any(feature = "hfai", feature = "hf"))]
    fn read_outlined(&self, path: &Path, limits: &ReadLimits) -> Result<Outlined> {
        Ok(Outlined::whole(self.read_source(path, limits, &SourceOptions::default(), &Selection::default())?))
    }

    /// Writes the content of `source` (any format) as this format at `dst`: a file for single-file formats, a
    /// directory (created if needed) for the others. What the target cannot hold is reported in
    /// [`ConvertSummary::dropped`], or refused with [`Error::UnsupportedConversion`].
    fn write(&self, source: &Source<'_>, dst: &Path, options: &ConvertOptions) -> Result<ConvertSummary>;

    /// The object a `torch.save` target writes for the whole checkpoint at `src` instead of its content's
    /// state dict, and what writing it counts, when the format holds more than its content (a whole pickled
    /// module: its module objects, not only their state dict). `None`: the torch target writes the content.
    /// A choice of what to write, not of how: the target writes either through its writer with the
    /// conversion's options.
    // Asked by the torch target only.
    #[cfg(feature = "torch")]
    fn object_for_torch_save(&self, _src: &Path, _: &ReadLimits) -> Option<Result<(Value, ConvertSummary)>> {
        None
    }

    /// Checks `path` into `report` to `depth`: the format's own structural checks (coverage, commit state),
    /// and deep, its checksums; then, by default, every entry resolved ([`Depth::Structure`]) or read to its
    /// last byte ([`Depth::Deep`]).
    fn verify(
        &self,
        path: &Path,
        depth: Depth,
        limits: &ReadLimits,
        report: &mut VerifyReport,
        progress: Progress<'_>,
    ) -> Result<()> {
        read_all(&self.checkpoint(path, limits)?, depth, report, progress);
        Ok(())
    }

    /// The directory whose `ckpt.checksums.json` covers the checkpoint at `path` (default: `path` itself;
    /// a file has none beside it).
    fn manifest_dir(&self, path: &Path) -> std::path::PathBuf {
        path.to_path_buf()
    }

    /// Rewrites the checkpoint at `src` in `dst` for `world` ranks, shards or parts, in the format's own
    /// layout. Asked only of formats the registry marks as sharded.
    fn reshard(&self, src: &Path, _dst: &Path, _world: usize, _: &ReadLimits) -> Result<()> {
        Err(Error::InvalidArgument {
            path: src.to_path_buf(),
            reason: format!("a {} checkpoint has no shards to reshard", self.format()),
        })
    }

    /// [`write`](Adaptor::write) split over the processes of `group` (see [`crate::convert_in`]). Default: the
    /// process of rank 0 writes everything, the others wait for its verdict.
    fn write_in(
        &self,
        source: &Source<'_>,
        dst: &Path,
        options: &ConvertOptions,
        group: &dyn Collective,
    ) -> Result<ConvertSummary> {
        let own = if group.rank() == 0 { Some(self.write(source, dst, options)) } else { None };
        crate::agree::agree_with_root(group, own, dst)
    }

    /// [`reshard`](Adaptor::reshard) split over the processes of `group` (see [`crate::reshard_in`]).
    /// Default: the process of rank 0 does it all, the others wait for its verdict.
    fn reshard_in(
        &self,
        src: &Path,
        dst: &Path,
        world: usize,
        limits: &ReadLimits,
        group: &dyn Collective,
    ) -> Result<()> {
        let own = if group.rank() == 0 { Some(self.reshard(src, dst, world, limits)) } else { None };
        crate::agree::agree_with_root(group, own, dst)
    }

    /// What a file no format recognised is instead (a git-LFS pointer, an HTML page, ...), when this format
    /// can tell from its leading bytes.
    fn explain(&self, _head: &[u8], _path: &Path) -> Option<Error> {
        None
    }

    /// How the checkpoint `ck` (of this format) lays its state out: which of its entries are the format's
    /// bookkeeping, under which prefix it nests the state, which entries are rows keyed by ids. What `diff`
    /// leaves out of a comparison and how it names entries to compare them with another format's. Default:
    /// every entry is state, under its own name.
    fn layout(&self, _ck: &Checkpoint, _: &ReadLimits) -> Result<Layout> {
        Ok(Layout::default())
    }

    /// How a checkpoint of this format lies on an object store: the objects under its prefix that are its
    /// own and its commit points (the format crate's `OBJECT_LAYOUT`). Default: `None`, every object its
    /// own and no commit point (a file format, or a directory format that commits no objects last).
    #[cfg(feature = "remote")]
    fn object_layout(&self) -> Option<ObjectLayout> {
        None
    }

    /// Whether this format's reader reads a partial local copy of a checkpoint on an object store (its
    /// safetensors headers and ZIP indexes fetched, the rest sparse) through the copy's fill hook, fetching
    /// each tensor's bytes as it reads them. Default: no; such a copy is fetched whole before it is read.
    #[cfg(feature = "remote")]
    fn reads_partial_copy(&self) -> bool {
        false
    }

    /// Whether a directory holding only the files `names` takes a checkpoint of this format beside them as
    /// an empty directory would (a Hugging Face model directory of config and tokenizer files takes its
    /// shards). Default: no.
    fn joins_directory(&self, _names: &[String]) -> bool {
        false
    }

    /// Whether this format's writer writes over a checkpoint of its own in place (it replaces what it
    /// rewrites); when not, such a checkpoint is replaced whole by a staging copy swapped in. Default: in
    /// place.
    fn writes_over_itself(&self) -> bool {
        true
    }

    /// `path` opened as this format.
    fn checkpoint(&self, path: &Path, limits: &ReadLimits) -> Result<Checkpoint> {
        Ok(Checkpoint::new(self.format(), path, self.open(path, limits)?))
    }
}

/// How a checkpoint lays its state out ([`Adaptor::layout`]): the format's own bookkeeping beside the state,
/// and the names the state has in it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Layout {
    /// Entries that are the format's bookkeeping, not state (hfai's `__nshards__`, `__version__`, the empty
    /// `optimizer` it writes when it saved none), in the checkpoint's order.
    pub keys: Vec<String>,
    /// The prefix (`model.`) under which the format nests a whole state that has no such level of its own:
    /// an entry under it has the state's name less it.
    pub nested_under: Option<String>,
    /// Entries the format names otherwise than the state they hold: (entry, the names the state has, the
    /// likeliest first). RecIS keeps `model.pt`'s entries bare (`w`, the state dict's `model.w`) and another
    /// format's top-level values in `extra.pt` (`extra/step`: `extra.step`, or the source's `step`).
    pub aliases: HashMap<String, Vec<String>>,
    /// Tables whose rows are keyed by ids, in an order that depends on the checkpoint's shard layout.
    pub keyed: Vec<KeyedRows>,
}

impl Layout {
    /// Every name the state of the entry `name` may have in another format: its aliases, its name less the
    /// nesting prefix, its own name.
    pub fn names<'n>(&'n self, name: &'n str) -> Vec<&'n str> {
        let mut out: Vec<&str> =
            self.aliases.get(name).map(|a| a.iter().map(String::as_str).collect()).unwrap_or_default();
        out.extend(self.nested_under.as_deref().and_then(|p| name.strip_prefix(p)));
        out.push(name);
        out
    }

    /// Whether the entry `name` is the format's bookkeeping.
    pub fn is_key(&self, name: &str) -> bool {
        self.keys.iter().any(|k| k == name)
    }
}

/// A table of rows keyed by ids ([`Layout::keyed`]): its rows are equal to another checkpoint's when, id by
/// id, they hold the same row, in whatever order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeyedRows {
    /// The table's name (what a report names).
    pub table: String,
    /// The entry of its ids: 1-D, int64, one per row, each once.
    pub ids: String,
    /// Its entries holding one row (first dimension) per id.
    pub rows: Vec<String>,
}

/// The checkpoint a conversion reads from.
pub(crate) struct Source<'a> {
    /// Its path.
    pub path: &'a Path,
    origin: Origin<'a>,
    selection: &'a Selection,
    /// The limits it is read under.
    pub limits: &'a ReadLimits,
    /// How it is read (a tag, unstacked layers, a name map).
    options: &'a SourceOptions,
}

/// Where a [`Source`]'s content comes from.
enum Origin<'a> {
    /// The checkpoint at the source's path, read through its format's adaptor.
    File(&'a dyn Adaptor),
    /// A state dict held in memory ([`crate::save`]).
    Memory(&'a Value),
}

impl<'a> Source<'a> {
    /// The checkpoint at `path`, of `format`, read through `adaptor` under `limits`, the entries `selection`
    /// keeps.
    pub fn new(
        path: &'a Path,
        adaptor: &'a dyn Adaptor,
        selection: &'a Selection,
        limits: &'a ReadLimits,
        options: &'a SourceOptions,
    ) -> Self {
        Source { path, origin: Origin::File(adaptor), selection, limits, options }
    }

    /// The state dict `tree` held in memory, as `torch.save` would hold it (its format is [`Format::IN_MEMORY`]),
    /// to be written at `dst` (the path its errors name), the entries `selection` keeps.
    pub fn in_memory(
        tree: &'a Value,
        dst: &'a Path,
        selection: &'a Selection,
        limits: &'a ReadLimits,
        options: &'a SourceOptions,
    ) -> Self {
        Source { path: dst, origin: Origin::Memory(tree), selection, limits, options }
    }

    /// Its format: its adaptor's, or [`Format::IN_MEMORY`] for a state dict in memory. Asked by the targets
    /// that name their source in what they write or report.
    #[cfg(any(
        feature = "safetensors",
        feature = "distcp",
        feature = "hfai",
        feature = "pbg",
        feature = "recis",
        feature = "deepspeed",
        feature = "pickle",
        feature = "package",
        feature = "gguf"
    ))]
    pub fn format(&self) -> Format {
        match self.origin {
            Origin::File(adaptor) => adaptor.format(),
            Origin::Memory(_) => Format::IN_MEMORY,
        }
    }

    /// Its content: every entry the selection keeps (renamed and cast as it says), and the nested state dict.
    /// This is where every target reads its content from, so a selection applies to every target.
    pub fn content(&self) -> Result<Content> {
        let content = match self.origin {
            Origin::File(adaptor) => adaptor.read_source(self.path, self.limits, self.options, self.selection)?,
            Origin::Memory(tree) => Content::from_tree(tree.clone(), self.path)?,
        };
        content.select(self.selection, self.path)
    }

    /// Its content as [`Source::content`], with the tensors its format would assemble left as outlines
    /// ([`Adaptor::read_outlined`]) for a target that reads only what it writes. With a dtype cast the
    /// content is read whole (a cast reads every value anyway).
    // For the targets split over processes.
    #[cfg(any(feature = "hfai", feature = "hf"))]
    pub fn outlined(&self) -> Result<Outlined> {
        if self.selection.dtype.is_some() || *self.options != SourceOptions::default() {
            return Ok(Outlined::whole(self.content()?));
        }
        let Origin::File(adaptor) = self.origin else { return Ok(Outlined::whole(self.content()?)) };
        let mut outlined = adaptor.read_outlined(self.path, self.limits)?;
        outlined.content = outlined.content.select(self.selection, self.path)?;
        Ok(outlined)
    }

    /// Whether the whole checkpoint is converted as it is (no selection), so that a target may copy it by
    /// its own means instead of reading [`Source::content`] (never for a state dict in memory).
    #[cfg(feature = "torch")]
    pub fn is_whole(&self) -> bool {
        matches!(self.origin, Origin::File(_)) && self.selection.is_identity()
    }

    /// The object a `torch.save` target writes instead of [`Source::content`]'s state dict, when its format
    /// holds more than its content ([`Adaptor::object_for_torch_save`]) and nothing is selected.
    #[cfg(feature = "torch")]
    pub fn object_for_torch_save(&self) -> Option<Result<(Value, ConvertSummary)>> {
        let Origin::File(adaptor) = self.origin else { return None };
        if !self.is_whole() {
            return None;
        }
        adaptor.object_for_torch_save(self.path, self.limits)
    }

    /// The top-level mapping of its state dict, or the reason a `to` checkpoint, which holds one, cannot
    /// hold it.
    // For the targets whose checkpoints hold a mapping.
    #[cfg(any(feature = "distcp", feature = "hfai", feature = "recis"))]
    pub fn top_mapping<'c>(&self, content: &'c Content, to: Format) -> Result<&'c Dict> {
        content.tree.as_dict().ok_or_else(|| Error::UnsupportedConversion {
            from: self.format(),
            to,
            reason: format!(
                "{to} checkpoints hold a mapping; the source's top level is a {}",
                content.tree.type_name()
            ),
        })
    }
}

/// A source's content in which some tensors are outlines: tensors of the right dtype and shape whose data
/// is read from the source only when [`Outlined::resolve`] is asked for it. For the targets that write split
/// over processes.
#[cfg(any(feature = "hfai", feature = "hf"))]
pub(crate) struct Outlined {
    /// The content; its summary counts ([`count`]) are those of the data.
    pub content: Content,
    /// The source entry each outline stands for, by the outline's storage.
    outlines: HashMap<(usize, usize, usize), String>,
    /// Where outlines are read from.
    reader: Option<Box<dyn Reader>>,
}

#[cfg(any(feature = "hfai", feature = "hf"))]
impl Outlined {
    /// Content without outlines.
    pub fn whole(content: Content) -> Self {
        Outlined { content, outlines: HashMap::new(), reader: None }
    }

    /// `content`, in which each of `outlines` (made by [`outline`]) stands for the entry it names in
    /// `reader`.
    #[cfg(feature = "distcp")]
    pub fn new(content: Content, reader: Box<dyn Reader>, outlines: Vec<(ckpt_tensor::Tensor, String)>) -> Self {
        let outlines = outlines.into_iter().map(|(t, name)| (t.storage().storage_id(), name)).collect();
        Outlined { content, outlines, reader: Some(reader) }
    }

    /// The tensor `t` stands for: the source's data for an outline, `t` itself otherwise.
    pub fn resolve(&self, t: &ckpt_tensor::Tensor) -> ckpt_tensor::Result<ckpt_tensor::Tensor> {
        match (self.outlines.get(&t.storage().storage_id()), &self.reader) {
            (Some(name), Some(reader)) => reader.tensor(name),
            _ => Ok(t.clone()),
        }
    }
}

/// An outline of a tensor of `dtype` and `shape` ([`Outlined`]): every element one stored zero (stride 0), in
/// a storage of its own.
#[cfg(all(feature = "distcp", any(feature = "hfai", feature = "hf")))]
pub(crate) fn outline(dtype: ckpt_tensor::DType, shape: &[usize]) -> ckpt_tensor::Result<ckpt_tensor::Tensor> {
    ckpt_tensor::Tensor::from_parts(dtype, shape, &vec![0; shape.len()], 0, ckpt_tensor::Buffer::zeroed(16)?)
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
    pub fn from_tree(tree: Value, path: &Path) -> Result<Content> {
        let leaves = ckpt_tensor::leaves(&tree)
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

impl Content {
    /// The part of this content `selection` keeps: entries kept by name, renamed, floating-point tensors cast.
    /// Without renaming, the tree keeps its shape (mapping kinds, tuples, attributes) less what is not kept
    /// (an emptied container goes too; list and tuple items after a dropped one move up); with renaming, the
    /// nesting is rebuilt from the new paths (`Content::from_leaves`).
    pub fn select(self, selection: &Selection, path: &Path) -> Result<Content> {
        if selection.is_identity() {
            return Ok(self);
        }
        let invalid = |reason: String| Error::InvalidArgument { path: path.to_path_buf(), reason };
        // Kept whole as the source (a `SelectionError`, of `Fault::InvalidArgument`).
        selection.validate().at(path)?;
        // A selection that selects nothing is refused, with the names nearest what it asked for.
        selection.check_selects(&self.leaves.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), path)?;
        let mut leaves = Vec::new();
        let mut kept: HashMap<Vec<PathItem>, Value> = HashMap::new();
        let mut names = HashSet::new();
        for l in self.leaves {
            if !selection.keeps(&l.name) {
                continue;
            }
            let value = match l.value {
                Value::Composite(c) if selection.dense => Value::Tensor(c.to_dense().at(path)?),
                other => other,
            };
            let value = match selection.dtype {
                Some(to) => cast(value, to).at(path)?,
                None => value,
            };
            let (name, new_path) = match selection.rename(&l.name, &l.path) {
                Some(renamed) => renamed,
                None => return Err(invalid(format!("--strip-prefix leaves nothing of the entry {:?}", l.name))),
            };
            if !names.insert(name.clone()) {
                return Err(invalid(format!("two entries would be named {name:?} after renaming")));
            }
            kept.insert(l.path, value.clone());
            leaves.push(Leaf { name, path: new_path, value });
        }
        if selection.renames() {
            return Content::from_leaves(leaves, path);
        }
        let tree = prune(&self.tree, &mut Vec::new(), &kept)
            .unwrap_or_else(|| Value::Dict(Dict::new(ckpt_tensor::DictKind::Dict)));
        Ok(Content { tree, leaves })
    }
}

/// `value` with its floating-point tensor (a tensor, a parameter's, a tensor-with-state's) cast to `to`.
fn cast(value: Value, to: ckpt_tensor::DType) -> ckpt_tensor::Result<Value> {
    // Every floating-point tensor: a packed float4/float6 one is refused by the cast (torch converts neither).
    let castable = |t: &ckpt_tensor::Tensor| t.dtype().is_floating_point();
    Ok(match value {
        Value::Tensor(t) if castable(&t) => Value::Tensor(ckpt_tensor::cast::cast_float_lazy(&t, to)?),
        Value::Parameter { tensor, state } if castable(&tensor) => {
            Value::Parameter { tensor: ckpt_tensor::cast::cast_float_lazy(&tensor, to)?, state }
        }
        Value::TensorWithState { tensor, class, state } => {
            Value::TensorWithState { tensor: Box::new(cast(*tensor, to)?), class, state }
        }
        other => other,
    })
}

/// `value` (at `at`) less every leaf not in `kept`, kept leaves replaced by their new value; `None` when
/// nothing of it is kept.
fn prune(value: &Value, at: &mut Vec<PathItem>, kept: &HashMap<Vec<PathItem>, Value>) -> Option<Value> {
    if let Some(v) = kept.get(at.as_slice()) {
        return Some(v.clone());
    }
    match value {
        Value::Dict(d) => {
            let mut items = Vec::new();
            for (k, child) in &d.items {
                at.push(PathItem::Key(python_str(k).ok()?));
                if let Some(v) = prune(child, at, kept) {
                    items.push((k.clone(), v));
                }
                at.pop();
            }
            (!items.is_empty()).then(|| Value::Dict(Dict { kind: d.kind, items, attrs: d.attrs.clone() }))
        }
        Value::List(items) | Value::Tuple(items) => {
            let mut out = Vec::new();
            for (i, child) in items.iter().enumerate() {
                at.push(PathItem::Index(i));
                if let Some(v) = prune(child, at, kept) {
                    out.push(v);
                }
                at.pop();
            }
            if out.is_empty() {
                None
            } else if matches!(value, Value::List(_)) {
                Some(Value::List(out))
            } else {
                Some(Value::Tuple(out))
            }
        }
        _ => None,
    }
}

/// The summary of a target that writes every one of `leaves`.
#[cfg(any(feature = "torch", feature = "hfai", feature = "pbg", feature = "recis"))]
pub(crate) fn count<'a>(leaves: impl IntoIterator<Item = &'a Leaf>) -> ConvertSummary {
    let mut s = ConvertSummary::default();
    for l in leaves {
        if let Value::Composite(c) = &l.value {
            s.tensors += 1;
            s.bytes += c.components.iter().map(|t| t.nbytes() as u64).sum::<u64>();
            continue;
        }
        match l.value.as_tensor() {
            Some(t) => {
                s.tensors += 1;
                s.bytes += t.nbytes() as u64;
            }
            None => {
                s.values += 1;
                // The tensors inside an object are entries of their own.
                for (_, t) in ckpt_tensor::flatten::object_tensors(&l.value) {
                    s.tensors += 1;
                    s.bytes += t.as_tensor().map_or(0, |t| t.nbytes() as u64);
                }
            }
        }
    }
    s
}

/// Resolves every entry: values decoded, tensors located (their bytes present); deep, every tensor read to
/// its last byte.
pub(crate) fn read_all(ck: &Checkpoint, depth: Depth, report: &mut VerifyReport, progress: Progress<'_>) {
    let entries = ck.entries();
    let total = entries.len() as u64;
    for (i, e) in entries.iter().enumerate() {
        match &e.kind {
            EntryKind::Tensor(_) => {
                let read = ck.tensor(&e.name).and_then(|t| match depth {
                    Depth::Deep => t.data().map(|d| touch(&d)).at(ck.path()),
                    Depth::Structure => Ok(t.nbytes()),
                });
                match read {
                    Ok(n) => report.bytes += n as u64,
                    Err(err) => report.push(Problem::from_error(ProblemKind::Unreadable, &err).at_entry(&e.name)),
                }
            }
            EntryKind::OpaqueTensor(_) => {}
            // A quantized, sparse or nested tensor: its components, each read as a tensor is.
            EntryKind::Composite(_) => {
                let read = ck.value(&e.name).and_then(|v| match v {
                    Value::Composite(c) => c.components.iter().try_fold(0usize, |n, t| match depth {
                        Depth::Deep => t.data().map(|d| n + touch(&d)).at(ck.path()),
                        Depth::Structure => Ok(n + t.nbytes()),
                    }),
                    _ => Ok(0),
                });
                match read {
                    Ok(n) => report.bytes += n as u64,
                    Err(err) => report.push(Problem::from_error(ProblemKind::Unreadable, &err).at_entry(&e.name)),
                }
            }
            _ => {
                if let Err(err) = ck.value(&e.name) {
                    report.push(Problem::from_error(ProblemKind::Unreadable, &err).at_entry(&e.name));
                }
            }
        }
        report.records += 1;
        progress(i as u64 + 1, total);
    }
}

/// Reads one byte of every page of `bytes` (mapped data reaches the disk), returning its length.
fn touch(bytes: &[u8]) -> usize {
    let mut x = 0u8;
    for b in bytes.iter().step_by(4096) {
        x ^= *b;
    }
    std::hint::black_box(x);
    bytes.len()
}
