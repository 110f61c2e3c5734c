//! Converting a checkpoint of any format into any other whose model can hold it.
//!
//! # What goes where
//!
//! | from \ to | torch | safetensors | hf | distcp | hfai | pbg | recis |
//! |---|---|---|---|---|---|---|---|
//! | torch | ✓ ¹⁰ | ✓ ¹ | ✓ ¹¹ | ✓ ² | ✓ ³ | ✓ ⁷ | ✓ ⁸ |
//! | safetensors | ✓ ⁴ | ✓ | ✓ ¹¹ | ✓ | ✓ ³ | ✓ ⁷ | ✓ ⁸ |
//! | hf | ✓ ⁴ | ✓ | ✓ (re-shard) ¹¹ | ✓ | ✓ ³ | ✓ ⁷ | ✓ ⁸ |
//! | distcp | ✓ ⁵ | ✓ ¹ | ✓ ¹¹ | ✓ (re-shard) | ✓ ³ | ✓ ⁷ | ✓ ⁸ |
//! | hfai | ✓ | ✓ ¹ | ✓ ¹¹ | ✓ | ✓ (re-shard) | ✓ ⁷ | ✓ ⁸ |
//! | pbg | ✓ | ✓ ¹ | ✓ ¹¹ | ✓ | ✓ ³ | ✓ (re-partition) ⁷ | ✓ ⁸ |
//! | recis | ✓ ⁹ | ✓ ¹ | ✓ ¹¹ | ✓ ⁹ | ✓ ³ | — | ✓ (re-shard) ⁶ |
//!
//! 1. safetensors holds tensors; ckpt keeps every other entry losslessly in `__metadata__` under
//!    `ckpt.values`, in a typed JSON encoding (tuples vs lists, dicts with their kind and key types, big ints,
//!    NaN and infinities, bytes, `torch.Size`, dtypes, devices, parameters, opaque tensors, any pickled object;
//!    the tensors a value holds are tensors of the file it names). A quantized, sparse or nested tensor is
//!    stored as its components (`<name>` the int representation, `<name>.scale`, `<name>.zero_point`;
//!    `<name>.indices`, `<name>.crow_indices`, ...; `<name>.buffer`, `<name>.sizes`, ...) with its layout,
//!    dtype, shape and axis in `ckpt.values`, and converts back to the torch tensor; with
//!    [`Selection::dense`] it is written dense instead. Tensors of dtypes safetensors lacks are
//!    stored as their bytes under a dtype it has, their real dtype recorded. Only what cannot be read at all
//!    is listed in [`ConvertSummary::dropped`]. Tensor names are the source's entry names
//!    ([`crate::Checkpoint::entries`]). The file's `__metadata__` holds `format = "pt"` (what Hugging Face
//!    loaders expect), `ckpt.source = <format>`, and, when the source was nested (a `torch.save` dict of
//!    dicts, a DCP state dict, an hfai checkpoint) or ordered otherwise than the file, `ckpt.paths`: a JSON
//!    object from each entry name to its path (`["model", "layers", 0, "weight"]`: strings are mapping keys,
//!    integers list indices), so that converting back rebuilds the nesting and the order: ckpt's one
//!    safetensors convention ([`crate::safetensors::metadata`]), which every ckpt writer of safetensors
//!    files follows.
//! 2. distcp targets take the state dict with DCP's flattening rules ([`crate::core::flatten`]); the top level
//!    must be a mapping. With [`ConvertOptions::world_size`] `N > 1` the checkpoint is written as `N` ranks
//!    would write it: every tensor with at least `N` rows is split on dimension 0 with DTensor's
//!    `Shard(0)` rule ([`crate::distcp::save_sharded`]), every other entry is replicated and written once.
//! 3. hfai targets: a source whose top level is a mapping with a `model` mapping (hfai's own layout, and
//!    the usual `{"model": ..., "optimizer": ..., "epoch": ...}` training checkpoint) keeps it: `model` is the
//!    model state dict, `optimizer` (when it is an optimizer state dict with `state` and `param_groups`)
//!    the optimizer, every other top-level item goes to hfai's `others`. Any other mapping *is* the model
//!    state dict, so entry names gain a `model.` prefix (hfai's `load` returns `{"model": state_dict}`).
//!    [`ConvertOptions::world_size`] is the number of `PART_*.pt` files.
//! 4. safetensors to torch: with `ckpt.paths` the nesting is rebuilt (DCP's `set_element`: keys make
//!    dicts, indices make lists), else the file becomes a flat `dict` of name → tensor (what
//!    `torch.save(safetensors.torch.load_file(f))` writes); `ckpt.values` entries come back as the values
//!    they were.
//! 5. every target writes through its format's writer with the options' durability and the source read
//!    lazily: a distcp source's tensor is assembled from its items when the writer writes it and dropped
//!    after, so a conversion holds about its largest tensor whatever the options.
//! 6. recis to recis re-shards the sparse tables into [`ConvertOptions::world_size`] shards of
//!    [`ConvertOptions::recis_parallel`] data files ([`crate::recis::reshard`]), each table keeping its
//!    `slice_size` unless [`ConvertOptions::recis_slice_size`] sets one; `model.pt` and `extra.pt` are
//!    copied; the IO states belong to the old workers and are listed in [`ConvertSummary::dropped`].
//! 7. pbg targets read the source's entries under [`crate::pbg::PbgReader`]'s names
//!    (`embeddings/<entity>/<part>`, `model/<public name>`, `optimizer/...`, `config`, `version`), which a PBG
//!    checkpoint keeps in every other format. The layout is the config's (the source's `config`, or
//!    [`ConvertOptions::pbg_config`]); an entity with another partition count is re-partitioned, and missing
//!    optimizer `param_groups` are rebuilt as PBG's trainer writes them. A source without entity partitions
//!    or model parameters is refused with the reason ([`Error::UnsupportedConversion`]), as is RecIS, whose
//!    hash tables have no PBG counterpart. [`crate::pbg::save`] has the details.
//! 8. recis targets lay the top-level mapping out as RecIS does: `{"sparse", "model", "extra"}` (what a RecIS
//!    source becomes, see ⁹) goes back to the serializer, `model.pt` and `extra.pt`; otherwise tensors named
//!    `<table>@id` / `<table>@<slot>` form hash tables and RecIS's sparse-optimizer scalars
//!    (`sparse_adamw_step`, ...) its dense blocks, `model` (or the whole mapping) goes to `model.pt` and the
//!    rest to `extra.pt`. Tables are split over [`ConvertOptions::world_size`] shards by RecIS's loader rule,
//!    with [`ConvertOptions::recis_slice_size`] and [`ConvertOptions::recis_parallel`].
//!    [`crate::recis::save`] has the details.
//! 9. A RecIS checkpoint converts as the state dict `{"sparse": {<RecIS tensor name>: tensor}, "model":
//!    <model.pt>, "extra": <extra.pt>, "io_state_<s>": <io_state_<s>.pt>}` (parts it lacks left out); flat
//!    targets (safetensors) name entries as [`crate::recis::RecisReader`] does.
//! 10. A whole pickled module (`torch.save(model)`) converts as its state dict, named as
//!     `model.state_dict()` names it (`0.weight`, `1.running_mean`); a torch target without a selection gets
//!     the whole module object back. numpy scalars and arrays inside `.pt` files are values and tensors of
//!     their numpy dtype; safetensors keeps them as numpy values (`ckpt.values`), so converting back gives
//!     the numpy objects again.
//! 11. hf targets write what a safetensors target writes, sharded as `huggingface_hub` splits a state dict
//!     (`model-0000i-of-0000n.safetensors` and `model.safetensors.index.json` as `transformers` writes it,
//!     or one `model.safetensors`) at `TargetOptions::Hf { max_shard_size }` (default 5 GB); ckpt's metadata
//!     (`ckpt.source`, `ckpt.paths`, `ckpt.values`) goes into the first shard's `__metadata__`.
//!
//! # Selection
//! [`ConvertOptions::selection`] applies to every target, to the entries as [`crate::Checkpoint::entries`]
//! names them: `include`/`exclude` globs, `strip_prefix`/`add_prefix`, and `dtype` for floating-point tensors
//! ([`Selection`] says what happens to non-tensor structure: entries are kept or dropped whole, optimizer
//! indices are not renumbered). With a selection, the distcp → torch and RecIS → RecIS conversions read the
//! content instead of copying tensors by their own means. A selection that selects nothing is refused
//! ([`Error::EmptySelection`], with the names nearest its patterns): an include pattern that matches no entry
//! (even when the others match: a typo), or excludes that remove every entry.
//!
//! # What is dropped
//! Every entry of the source's listing ([`crate::Checkpoint::entries`], what `ckpt inspect` lists) is
//! converted (a DeepSpeed checkpoint's 16-bit `module.*` copies, optimizer state and engine and client
//! state too; a Megatron checkpoint's optimizer state and `common.pt` values), unless the selection leaves
//! it out; what the target cannot hold is named in [`ConvertSummary::dropped`].
//!
//! # Memory
//! Sources are opened lazily: torch, hfai, safetensors, PyTorch-BigGraph and RecIS tensors are windows of
//! memory maps, so writing a target touches each tensor's pages once and memory stays bounded by the page
//! cache, except for gathers: hfai tensors stored in chunks are concatenated by the reader, DCP tensors
//! split over several items are assembled, non-contiguous tensors are made contiguous for safetensors,
//! RecIS tables are split per shard (rows copied once) and re-partitioned PBG entities are concatenated.
//! distcp → torch streams one tensor at a time.

use std::path::Path;

use ckpt_tensor::Value;

use crate::adaptor::{Adaptor, Source};
use crate::destination::write_checked;
use crate::error::{Error, Result};
use crate::format::{Format, unsupported_reason};
use crate::formats::adaptor;
use crate::limits::ReadLimits;
use crate::options::ConvertOptions;
use crate::report::ConvertSummary;
use crate::select::Selection;
use crate::source::SourceOptions;

/// Converts the checkpoint at `src` (format detected unless `from` is given) to `to` at `dst`.
///
/// `dst` is a file for torch, safetensors and gguf targets and a directory (created if needed) for the
/// others. It is new, an empty directory (for a directory target), or a checkpoint of `to`, which is replaced
/// whole (crash-safe); anything else there is refused unless [`ConvertOptions::overwrite`] is set, which
/// replaces it whole.
/// The module documentation of `convert` lists the pairs and what each keeps.
///
/// ```
/// use ckpt::tensor::{Tensor, Value};
/// use ckpt::ConvertOptions;
/// let dir = tempfile::tempdir().unwrap();
/// let pt = dir.path().join("m.pt");
/// let sd = Value::dict([
///     ("model", Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))])),
///     ("epoch", Value::Int(3)),
///     ("note", Value::Bytes(b"raw".to_vec())),
/// ]);
/// ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
///
/// // Formats by name, as on the command line (`ckpt::Format` has a variant for each).
/// let st = dir.path().join("m.safetensors");
/// let summary = ckpt::convert(&pt, None, &st, "safetensors".parse()?, &ConvertOptions::default())?;
/// assert_eq!((summary.tensors, summary.bytes, summary.values), (1, 8, 2)); // `epoch`, `note` in `ckpt.values`
/// assert!(summary.dropped.is_empty()); // nothing lost
///
/// // Back to torch: the nesting comes back from the file's `ckpt.paths` metadata.
/// let back = dir.path().join("back.pt");
/// ckpt::convert(&st, None, &back, "torch".parse()?, &ConvertOptions::default())?;
/// assert_eq!(ckpt::open(&back)?.entries()[0].name, "model.w");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`Error::UnsupportedConversion`] when the target cannot hold the source's data (see the table above),
/// [`Error::FeatureDisabled`] when this build lacks a format, [`Error::DestinationTaken`] when `dst` holds
/// something else than a checkpoint of `to` (without [`ConvertOptions::overwrite`]), or the formats' own
/// errors.
pub fn convert(
    src: impl AsRef<Path>,
    from: Option<Format>,
    dst: impl AsRef<Path>,
    to: Format,
    options: &ConvertOptions,
) -> Result<ConvertSummary> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    crate::formats::refuse_special(src)?;
    let (source, target) = plan(src, from, dst, to, options)?;
    let source = Source::new(src, source, &options.selection, &options.limits, &options.source);
    write_checked(dst, to, options.overwrite, options.durability.sync, |at| target.write(&source, at, options))
}

/// Writes the state dict `state_dict` (a nested [`Value`], as `torch.save` would hold it) as a checkpoint
/// of format `to` at `dst`, through the writers of [`convert`], with its options (the target's layout, and
/// the selection, applied to the state dict's entries as [`Checkpoint::entries`](crate::Checkpoint::entries)
/// would name them in a `torch.save` file). The Python package's `ckpt.save` is this function.
///
/// ```
/// use ckpt::tensor::{Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap())), ("step", Value::Int(3))]);
/// let summary = ckpt::save(&sd, &dir.path().join("dcp"), ckpt::Format::Distcp, &Default::default())?;
/// assert_eq!((summary.tensors, summary.values), (1, 1));
/// assert_eq!(ckpt::open(&dir.path().join("dcp"))?.tensor("w")?.to_vec::<f32>()?, [1.0, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`convert`]: [`Error::UnsupportedConversion`] when `to` cannot hold the state dict, the writers' own.
pub fn save(state_dict: &Value, dst: impl AsRef<Path>, to: Format, options: &ConvertOptions) -> Result<ConvertSummary> {
    let dst = dst.as_ref();
    let (_, target) = plan(dst, Some(Format::IN_MEMORY), dst, to, options)?;
    let source = Source::in_memory(state_dict, dst, &options.selection, &options.limits, &options.source);
    write_checked(dst, to, options.overwrite, options.durability.sync, |at| target.write(&source, at, options))
}

/// About how many bytes converting `src` (of `from`, or detected) writes: every tensor the selection keeps,
/// in the dtype it is written in. The targets add their headers and metadata, so this is what a progress
/// display measures [`ckpt_io::bytes_written`] against, not an exact size. Reads the source's listing only.
///
/// ```
/// # std::env::set_current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).unwrap();
/// let src = std::path::Path::new("conformance/fixtures/distcp/golden/d215");
/// let all = ckpt::output_estimate(src, None, &ckpt::ConvertOptions::default())?;
/// let bf16 = ckpt::ConvertOptions::default().with_selection(ckpt::Selection::default().with_dtype(ckpt::DType::BF16));
/// let half = ckpt::output_estimate(src, None, &bf16)?;
/// assert!(all > 0 && half < all);
/// # Ok::<(), ckpt::Error>(())
/// ```
///
/// # Errors
/// As [`crate::open_source`].
pub fn output_estimate(src: &Path, from: Option<Format>, options: &ConvertOptions) -> Result<u64> {
    let ck = crate::open::open_source(src, from, &options.limits, &options.source)?;
    let mut total = 0u64;
    for e in ck.entries() {
        let Some(info) = e.tensor_info() else { continue };
        if !options.selection.keeps(&e.name) {
            continue;
        }
        let bytes = match options.selection.dtype {
            Some(to) if ckpt_tensor::cast::is_castable_float(info.dtype) => info.numel().saturating_mul(to.size()),
            _ => info.nbytes(),
        };
        total = total.saturating_add(bytes as u64);
    }
    Ok(total)
}

/// The nested state dict of the checkpoint at `path` (format detected): what a conversion to a `torch.save`
/// file writes, with the entries `selection` keeps, read under `limits`. Tensors are read lazily where the
/// format allows (windows of memory maps). The Python package's `ckpt.load` is this function.
///
/// ```
/// # std::env::set_current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).unwrap();
/// let sd = ckpt::state_dict("conformance/fixtures/distcp/golden/d215".as_ref(), &Default::default(), &Default::default())?;
/// assert!(sd.as_dict().is_some_and(|d| d.get("row").is_some()));
/// # Ok::<(), ckpt::Error>(())
/// ```
///
/// # Errors
/// As [`crate::open`]; [`Error::InvalidArgument`] for a selection that renames two entries alike.
pub fn state_dict(path: &Path, selection: &Selection, limits: &ReadLimits) -> Result<Value> {
    let format = crate::formats::detect(path)?;
    let source = adaptor(format, path)?;
    Ok(Source::new(path, source, selection, limits, &SourceOptions::default()).content()?.tree)
}

/// The source and target adaptors of a conversion, once the source format is known (`from`, or detected),
/// the world size is at least 1, the target options are for `to` (or the defaults) and the conversion is
/// supported.
pub(crate) fn plan(
    src: &Path,
    from: Option<Format>,
    dst: &Path,
    to: Format,
    options: &ConvertOptions,
) -> Result<(&'static dyn Adaptor, &'static dyn Adaptor)> {
    let from = match from {
        Some(f) => f,
        None => crate::formats::detect(src)?,
    };
    if options.world_size == 0 {
        return Err(Error::InvalidArgument {
            path: dst.to_path_buf(),
            reason: "world size 0: a target needs at least one rank".into(),
        });
    }
    crate::options::named::check_source(&options.source, from)?;
    if let Some(theirs) = options.target.format().filter(|&f| f != to) {
        return Err(Error::InvalidArgument {
            path: dst.to_path_buf(),
            reason: format!("the options are for a {theirs} target, and this conversion writes {to}"),
        });
    }
    let (source, target) = (adaptor(from, src)?, adaptor(to, src)?);
    if let Some(reason) = unsupported_reason(from, to) {
        return Err(Error::UnsupportedConversion { from, to, reason });
    }
    Ok((source, target))
}
