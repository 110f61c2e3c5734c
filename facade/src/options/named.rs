//! Options by name: the one table of what `ckpt convert`, `save`, `reshard` and the reading commands take
//! ([`OPTIONS`]), and the one parser from `(name, text)` pairs to [`ConvertOptions`], [`TargetOptions`] and
//! [`ReadLimits`] ([`convert_options`], [`read_limits`]). The `ckpt` tool passes its flags' values by name,
//! the Python package its keyword arguments; both get the same validation and the same errors: a name no
//! command takes is [`Error::UnknownOption`] with the names near it (and, for `torch.load`'s `map_location`
//! and `weights_only`, what ckpt does instead), an option of another target format or source format is
//! [`Error::OptionNotApplicable`] with the reason ([`check_target`], [`check_source`]).
//!
//! ```
//! use ckpt::{Format, named_options::{Command, convert_options}};
//! let named = [("world_size", "2"), ("hfai_large_size", "1024"), ("include", "model.*")];
//! let options = convert_options(Command::Convert, Format::Hfai, named)?;
//! assert_eq!(options.world_size, 2);
//! let refused = convert_options(Command::Convert, Format::Distcp, [("hfai_large_size", "1024")]).unwrap_err();
//! assert!(refused.to_string().contains("hfai targets"));
//! let typo = convert_options(Command::Convert, Format::Hfai, [("world_sizes", "2")]).unwrap_err();
//! assert!(typo.to_string().contains("did you mean: world_size"));
//! # Ok::<(), ckpt::Error>(())
//! ```

use std::path::PathBuf;

use ckpt_io::Durability;

use crate::error::{Error, Result};
use crate::format::Format;
use crate::limits::ReadLimits;
use crate::options::{ConvertOptions, DcpProfile, TargetOptions};
use crate::select::Selection;
use crate::source::{NameMap, SourceOptions};

/// What an option is about, which says where it applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scope {
    /// The target's layout, whatever its format (`world_size`: checked by [`check_target`]).
    Layout,
    /// The options of one target format.
    Target(Format),
    /// Which entries are written, under which names, in which dtype (`convert` only).
    Selection,
    /// How the source is read (`convert` and the reading commands; checked by [`check_source`]).
    Source,
    /// How durably, and over what, the target is written (`convert`, `save`, `reshard`).
    Write,
    /// The readers' resource limits (every command that reads).
    Limit,
}

/// An option of [`OPTIONS`]: its name (snake case: Python's keyword, the CLI's flag with `-` for `_`) and
/// what it is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionName {
    /// The name, `world_size` (`--world-size`).
    pub name: &'static str,
    /// What it is about.
    pub scope: Scope,
}

const fn opt(name: &'static str, scope: Scope) -> OptionName {
    OptionName { name, scope }
}

/// Every option of every command, each spelled once.
pub const OPTIONS: &[OptionName] = &[
    opt("world_size", Scope::Layout),
    opt("dcp_profile", Scope::Target(Format::Distcp)),
    opt("hfai_large_size", Scope::Target(Format::Hfai)),
    opt("parallel", Scope::Target(Format::Recis)),
    opt("slice_size", Scope::Target(Format::Recis)),
    opt("pbg_config", Scope::Target(Format::Pbg)),
    opt("max_shard_size", Scope::Target(Format::Hf)),
    opt("quant", Scope::Target(Format::Gguf)),
    opt("include", Scope::Selection),
    opt("exclude", Scope::Selection),
    opt("strip_prefix", Scope::Selection),
    opt("add_prefix", Scope::Selection),
    opt("dtype", Scope::Selection),
    opt("dense", Scope::Selection),
    opt("rename", Scope::Selection),
    opt("model_only", Scope::Source),
    opt("tag", Scope::Source),
    opt("unstack_layers", Scope::Source),
    opt("name_map", Scope::Source),
    opt("no_sync", Scope::Write),
    opt("no_checksums", Scope::Write),
    opt("sync", Scope::Write),
    opt("checksums", Scope::Write),
    opt("overwrite", Scope::Write),
    opt("max_depth", Scope::Limit),
    opt("max_memo", Scope::Limit),
    opt("max_container_len", Scope::Limit),
    opt("max_nodes", Scope::Limit),
    opt("max_alloc_bytes", Scope::Limit),
    opt("max_int_digits", Scope::Limit),
    opt("trusted", Scope::Limit),
    opt("max_header_bytes", Scope::Limit),
    opt("max_data_header_bytes", Scope::Limit),
    opt("max_metadata_bytes", Scope::Limit),
    opt("max_inflated_bytes", Scope::Limit),
];

/// The command options are parsed for, which says which of [`OPTIONS`] it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// `convert`: every option.
    Convert,
    /// `save` (a state dict in memory): the layout, target and write options.
    Save,
    /// `reshard`: the write options and the limits (its world size is its own argument).
    Reshard,
    /// `inspect`, `load`, `open`, `verify`, `diff`: the source options and the limits.
    Read,
}

impl Command {
    /// Whether this command takes options about `scope`.
    fn takes(self, scope: Scope) -> bool {
        match self {
            Command::Convert => true,
            Command::Save => matches!(scope, Scope::Layout | Scope::Target(_) | Scope::Write),
            Command::Reshard => matches!(scope, Scope::Write | Scope::Limit),
            Command::Read => matches!(scope, Scope::Source | Scope::Limit),
        }
    }

    /// The names of the options this command takes.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        OPTIONS.iter().filter(move |o| self.takes(o.scope)).map(|o| o.name)
    }
}

/// What ckpt does instead of `torch.load`'s keyword arguments, which people bring along.
const TORCH_LOAD_HABITS: &[(&str, &str)] = &[
    (
        "map_location",
        "ckpt reads tensors on the CPU, as read-only numpy arrays over the file's map; for torch tensors pass \
         framework=\"pt\" and move them with `.to(device)` (`ckpt.load(path, framework=\"pt\")`)",
    ),
    (
        "weights_only",
        "ckpt never runs pickle code: every checkpoint is read as torch.load(weights_only=True) reads it, and \
         objects it cannot rebuild are kept as data, not executed",
    ),
];

/// The error for an option name `command` does not take: the names near it, or what ckpt does instead of
/// a `torch.load` habit.
pub fn unknown_option(command: Command, name: &str) -> Error {
    if let Some((_, instead)) = TORCH_LOAD_HABITS.iter().find(|(habit, _)| *habit == name) {
        return Error::UnknownOption { option: name.to_owned(), hint: format!(": {instead}") };
    }
    let near = crate::suggest::did_you_mean(name, command.names(), 3);
    let hint = if near.is_empty() {
        format!("; the options are {}", command.names().collect::<Vec<_>>().join(", "))
    } else {
        format!("; did you mean: {}?", near.join(", "))
    };
    Error::UnknownOption { option: name.to_owned(), hint }
}

/// The [`OptionName`] of `name` if `command` takes it.
fn known(command: Command, name: &str) -> Result<&'static OptionName> {
    OPTIONS.iter().find(|o| o.name == name && command.takes(o.scope)).ok_or_else(|| unknown_option(command, name))
}

fn invalid(option: &str, value: &str, expected: impl Into<String>) -> Error {
    Error::InvalidOptionValue { option: option.to_owned(), value: value.to_owned(), expected: expected.into() }
}

fn number<T: std::str::FromStr>(option: &str, value: &str) -> Result<T> {
    value.trim().parse().map_err(|_| invalid(option, value, "a whole number"))
}

fn positive<T: std::str::FromStr + PartialEq + Default>(option: &str, value: &str) -> Result<T> {
    let n: T = number(option, value)?;
    if n == T::default() {
        return Err(invalid(option, value, "a whole number of at least 1"));
    }
    Ok(n)
}

fn flag(option: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(invalid(option, value, "true or false")),
    }
}

/// A float dtype by ckpt's, numpy's or torch's name.
fn float_dtype(value: &str) -> Result<ckpt_tensor::DType> {
    Ok(match value.trim().trim_start_matches("torch.") {
        "bf16" | "bfloat16" => ckpt_tensor::DType::BF16,
        "f16" | "fp16" | "float16" | "half" => ckpt_tensor::DType::F16,
        "f32" | "fp32" | "float32" | "float" => ckpt_tensor::DType::F32,
        "f64" | "fp64" | "float64" | "double" => ckpt_tensor::DType::F64,
        _ => return Err(invalid("dtype", value, "bf16, f16, f32 or f64 (floats are cast to it)")),
    })
}

/// `FROM=TO`, a rename rule, checked as [`Selection::validate`] checks it.
pub fn rename_rule(value: &str) -> Result<(String, String)> {
    let (from, to) = value.split_once('=').ok_or_else(|| invalid("rename", value, "FROM=TO"))?;
    Selection::default()
        .with_rename(from, to)
        .validate()
        .map_err(|e| invalid("rename", value, format!("a rule ckpt can apply: {e}")))?;
    Ok((from.to_owned(), to.to_owned()))
}

/// The target options given for every format (each with the first of its options given, as
/// [`TargetOptions::pick`] takes them).
#[derive(Default)]
struct Offered {
    profile: Option<DcpProfile>,
    large_size: Option<u64>,
    parallel: Option<usize>,
    slice_size: Option<u32>,
    pbg_config: Option<PathBuf>,
    max_shard_size: Option<u64>,
    quant: Option<String>,
    given: Vec<&'static str>,
}

impl Offered {
    fn first(&self, format: Format) -> Option<&'static str> {
        self.given.iter().copied().find(|n| OPTIONS.iter().any(|o| o.name == *n && o.scope == Scope::Target(format)))
    }

    fn pick(self, to: Format) -> Result<TargetOptions> {
        let offered = [
            (TargetOptions::Distcp { profile: self.profile.unwrap_or_default() }, self.first(Format::Distcp)),
            (TargetOptions::Hfai { large_size: self.large_size }, self.first(Format::Hfai)),
            (TargetOptions::Recis { parallel: self.parallel, slice_size: self.slice_size }, self.first(Format::Recis)),
            (TargetOptions::Pbg { config: self.pbg_config.clone() }, self.first(Format::Pbg)),
            (TargetOptions::Hf { max_shard_size: self.max_shard_size }, self.first(Format::Hf)),
            (TargetOptions::Gguf { quant: self.quant.clone() }, self.first(Format::Gguf)),
        ];
        TargetOptions::pick(to, offered)
    }
}

/// The options of a `command` (`convert` or `save`) to `to` from `named`, `(name, text)` pairs as
/// [`OPTIONS`] names them; a repeatable option (`include`, `exclude`, `rename`) is given once per value.
/// Flags read `true`/`false`. The world size is checked against `to` ([`check_target`]); the source options
/// are checked against the source once its format is known ([`check_source`], which the conversion does).
///
/// # Errors
/// [`Error::UnknownOption`] for a name `command` does not take, [`Error::InvalidOptionValue`] for a value
/// that does not parse, [`Error::OptionNotApplicable`] for an option of another target format.
pub fn convert_options<'a>(
    command: Command,
    to: Format,
    named: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<ConvertOptions> {
    let mut out = ConvertOptions::default();
    let mut offered = Offered::default();
    let mut selection = Selection::default();
    let mut source = SourceOptions::default();
    let mut limits = Vec::new();
    let (mut sync, mut checksums) = (true, true);
    for (name, value) in named {
        let option = known(command, name)?;
        if option.scope == Scope::Limit {
            limits.push((name, value));
            continue;
        }
        if let Scope::Target(_) = option.scope {
            offered.given.push(option.name);
        }
        match name {
            "world_size" => out.world_size = positive(name, value)?,
            "dcp_profile" => {
                offered.profile = Some(match value.trim() {
                    "max-compat" | "max_compat" => DcpProfile::MaxCompat,
                    "torch213" => DcpProfile::Torch213,
                    _ => return Err(invalid(name, value, "max-compat or torch213")),
                });
            }
            "hfai_large_size" => offered.large_size = Some(number(name, value)?),
            "parallel" => offered.parallel = Some(positive(name, value)?),
            "slice_size" => offered.slice_size = Some(positive(name, value)?),
            "pbg_config" => offered.pbg_config = Some(PathBuf::from(value)),
            "max_shard_size" => {
                offered.max_shard_size = Some(
                    ckpt_safetensors::hf::parse_size(value)
                        .map_err(|e| invalid(name, value, format!("a size such as 5GB, 500MB or bytes ({e})")))?,
                );
            }
            "quant" => offered.quant = Some(quant(value)?),
            "include" => selection.include.push(value.to_owned()),
            "exclude" => selection.exclude.push(value.to_owned()),
            "strip_prefix" => selection.strip_prefix = Some(value.to_owned()),
            "add_prefix" => selection.add_prefix = Some(value.to_owned()),
            "dtype" => selection.dtype = Some(float_dtype(value)?),
            "dense" => selection.dense = flag(name, value)?,
            "rename" => {
                let (from, to) = rename_rule(value)?;
                selection = selection.with_rename(&from, &to);
            }
            "model_only" => source = source.with_model_only(flag(name, value)?),
            "tag" => source = source.with_tag(value),
            "unstack_layers" => source = source.with_unstack_layers(flag(name, value)?),
            "name_map" => {
                source = source.with_name_map(match value.trim() {
                    "llama" => NameMap::Llama,
                    _ => return Err(invalid(name, value, "llama")),
                });
            }
            "no_sync" => sync = !flag(name, value)?,
            "no_checksums" => checksums = !flag(name, value)?,
            "sync" => sync = flag(name, value)?,
            "checksums" => checksums = flag(name, value)?,
            "overwrite" => out.overwrite = flag(name, value)?,
            // Every name of OPTIONS is matched above; one added to the table without its arm is refused.
            _ => return Err(unknown_option(command, name)),
        }
    }
    check_target(to, out.world_size)?;
    out.target = offered.pick(to)?;
    out.selection = selection;
    out.source = source;
    out.limits = read_limits(Command::Read, limits)?;
    out.durability = Durability::default().with_sync(sync).with_checksums(checksums);
    Ok(out)
}

/// `quant`, a ggml type ckpt writes.
fn quant(value: &str) -> Result<String> {
    const TYPES: &str = "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or mxfp4";
    #[cfg(feature = "gguf")]
    {
        let t = ckpt_gguf::GgmlType::from_name(value)
            .filter(|t| ckpt_gguf::quantize::can_quantize(*t))
            .ok_or_else(|| invalid("quant", value, TYPES))?;
        Ok(t.name().to_ascii_lowercase())
    }
    #[cfg(not(feature = "gguf"))]
    {
        let lower = value.trim().to_ascii_lowercase();
        if TYPES.replace(" or", ",").split(", ").any(|t| t == lower) {
            Ok(lower)
        } else {
            Err(invalid("quant", value, TYPES))
        }
    }
}

/// The read limits named in `named` (the `--max-*` flags and `trusted`), the defaults for those not
/// named; `trusted` lifts every pickle limit but the depth first, whatever its place.
///
/// # Errors
/// [`Error::UnknownOption`] for a name `command` does not take, [`Error::OptionNotApplicable`] for an option
/// that is not a limit, and [`Error::InvalidOptionValue`] for a value that is not a whole number
/// (`true`/`false` for `trusted`).
pub fn read_limits<'a>(command: Command, named: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<ReadLimits> {
    let named: Vec<(&str, &str)> = named.into_iter().collect();
    let mut l = ReadLimits::default();
    for &(name, value) in &named {
        if known(command, name)?.scope != Scope::Limit {
            return Err(Error::OptionNotApplicable {
                option: name.to_owned(),
                reason: "it is not a read limit; this call takes the limits alone".into(),
            });
        }
        // Without the torch format there is no pickle decoder to trust; the value is still checked.
        if name == "trusted" && flag(name, value)? {
            #[cfg(feature = "torch")]
            {
                l.pickle = ckpt_pickle::Limits::trusted();
            }
        }
    }
    for (name, value) in named {
        match name {
            #[cfg(feature = "torch")]
            "max_depth" => l.pickle.max_depth = number(name, value)?,
            #[cfg(feature = "torch")]
            "max_memo" => l.pickle.max_memo = number(name, value)?,
            #[cfg(feature = "torch")]
            "max_container_len" => l.pickle.max_container_len = number(name, value)?,
            #[cfg(feature = "torch")]
            "max_nodes" => l.pickle.max_nodes = number(name, value)?,
            #[cfg(feature = "torch")]
            "max_alloc_bytes" => l.pickle.max_alloc_bytes = number(name, value)?,
            #[cfg(feature = "torch")]
            "max_int_digits" => l.pickle.max_int_digits = number(name, value)?,
            "trusted" => {
                flag(name, value)?;
            }
            "max_header_bytes" => l.max_header_bytes = number(name, value)?,
            "max_data_header_bytes" => l.max_data_header_bytes = number(name, value)?,
            "max_metadata_bytes" => l.max_metadata_bytes = number(name, value)?,
            "max_inflated_bytes" => l.max_inflated_bytes = number(name, value)?,
            // A pickle limit in a build without the torch format: no reader it bounds.
            _ => {
                number::<u64>(name, value)?;
            }
        }
    }
    Ok(l)
}

/// The read limits and the source options named in `named`, as the reading commands take them (`inspect`,
/// `cat`, `diff`; Python's `open`, `diff`): the source options as [`convert_options`] reads them, the limits
/// as [`read_limits`]. The source options are checked against the source when it is opened
/// ([`check_source`]).
///
/// # Errors
/// As [`convert_options`] and [`read_limits`].
pub fn read_options<'a>(named: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<(ReadLimits, SourceOptions)> {
    let (mut limits, mut source) = (Vec::new(), Vec::new());
    for (name, value) in named {
        match known(Command::Read, name)?.scope {
            Scope::Limit => limits.push((name, value)),
            _ => source.push((name, value)),
        }
    }
    let options = convert_options(Command::Read, Format::Torch, source.into_iter().chain(limits))?;
    Ok((options.limits, options.source))
}

/// Refuses a world size of more than one rank for a target that has no ranks (torch, safetensors, hf,
/// gguf, pbg, whose partitions its config sets): only the sharded formats ([`Format::is_sharded`]) take one.
///
/// # Errors
/// [`Error::OptionNotApplicable`] naming `world_size`.
pub fn check_target(to: Format, world_size: usize) -> Result<()> {
    if world_size > 1 && !to.is_sharded() {
        let sharded: Vec<&str> = Format::ALL.iter().filter(|f| f.is_sharded()).map(|f| f.name()).collect();
        return Err(Error::OptionNotApplicable {
            option: "world_size".into(),
            reason: format!(
                "a {to} target has no ranks; the world size is the number of ranks, parts or shards of a {} target",
                sharded.join(", ")
            ),
        });
    }
    Ok(())
}

/// Refuses the source options that do not apply to a source of format `from`: a tag to DeepSpeed roots
/// alone, unstacked layers and name maps to Megatron checkpoints alone, the model's weights alone
/// (`model_only`) to both.
///
/// # Errors
/// [`Error::OptionNotApplicable`] naming the first such option.
pub fn check_source(source: &SourceOptions, from: Format) -> Result<()> {
    let refused = |option: &str, formats: &[Format]| {
        let names: Vec<&str> = formats.iter().map(|f| f.name()).collect();
        Error::OptionNotApplicable {
            option: option.to_owned(),
            reason: format!("it is read by {} sources alone; this source is {from}", names.join(" and ")),
        }
    };
    if source.tag.is_some() && from != Format::DeepSpeed {
        return Err(refused("tag", &[Format::DeepSpeed]));
    }
    if source.unstack_layers && from != Format::Megatron {
        return Err(refused("unstack_layers", &[Format::Megatron]));
    }
    if source.name_map.is_some() && from != Format::Megatron {
        return Err(refused("name_map", &[Format::Megatron]));
    }
    if source.model_only && !matches!(from, Format::DeepSpeed | Format::Megatron) {
        return Err(refused("model_only", &[Format::DeepSpeed, Format::Megatron]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A value each option reads.
    fn sample(name: &str) -> &'static str {
        match name {
            "dcp_profile" => "torch213",
            "max_shard_size" => "2GB",
            "quant" => "q8_0",
            "pbg_config" => "config.json",
            "include" | "exclude" | "strip_prefix" | "add_prefix" | "tag" => "model.",
            "dtype" => "bf16",
            "rename" => "a.=b.",
            "name_map" => "llama",
            "dense" | "model_only" | "unstack_layers" | "no_sync" | "no_checksums" | "sync" | "checksums"
            | "overwrite" | "trusted" => "true",
            _ => "2",
        }
    }

    #[test]
    fn every_option_reads_its_sample() {
        for o in OPTIONS {
            let to = match o.scope {
                Scope::Target(f) => f,
                _ => Format::Distcp,
            };
            let parsed = convert_options(Command::Convert, to, [(o.name, sample(o.name))]);
            assert!(parsed.is_ok(), "{}: {parsed:?}", o.name);
        }
    }

    #[test]
    fn every_target_option_is_refused_for_another_target() {
        for o in OPTIONS {
            let Scope::Target(theirs) = o.scope else { continue };
            for to in Format::ALL.into_iter().filter(|f| f.writable() && *f != theirs) {
                let e = convert_options(Command::Convert, to, [(o.name, sample(o.name))]).unwrap_err();
                assert!(
                    matches!(&e, Error::OptionNotApplicable { option, .. } if option == o.name),
                    "{} to {to}: {e}",
                    o.name
                );
                assert!(e.to_string().contains(&format!("{theirs} targets")), "{e}");
                assert_eq!(e.fault(), ckpt_tensor::Fault::InvalidArgument);
            }
        }
    }

    #[test]
    fn world_size_is_refused_for_a_target_without_ranks() {
        for to in Format::ALL.into_iter().filter(|f| f.writable()) {
            let parsed = convert_options(Command::Convert, to, [("world_size", "4")]);
            if to.is_sharded() {
                assert_eq!(parsed.unwrap().world_size, 4);
            } else {
                let e = parsed.unwrap_err();
                assert!(matches!(&e, Error::OptionNotApplicable { option, .. } if option == "world_size"), "{e}");
                assert!(e.to_string().contains(&format!("a {to} target has no ranks")), "{e}");
            }
        }
        assert!(convert_options(Command::Convert, Format::Torch, [("world_size", "1")]).is_ok());
    }

    #[test]
    fn every_source_option_is_refused_for_another_source() {
        let readers: &[(&str, &[Format])] = &[
            ("tag", &[Format::DeepSpeed]),
            ("unstack_layers", &[Format::Megatron]),
            ("name_map", &[Format::Megatron]),
            ("model_only", &[Format::DeepSpeed, Format::Megatron]),
        ];
        for o in OPTIONS.iter().filter(|o| o.scope == Scope::Source) {
            let (_, formats) = readers.iter().find(|(n, _)| *n == o.name).expect("every source option is listed");
            let (_, source) = read_options([(o.name, sample(o.name))]).unwrap();
            for from in Format::ALL {
                let checked = check_source(&source, from);
                if formats.contains(&from) {
                    assert!(checked.is_ok(), "{} from {from}", o.name);
                } else {
                    let e = checked.unwrap_err();
                    assert!(matches!(&e, Error::OptionNotApplicable { option, .. } if option == o.name), "{e}");
                    assert!(e.to_string().contains(&format!("this source is {from}")), "{e}");
                }
            }
        }
    }

    #[test]
    fn an_unknown_option_gets_the_names_near_it() {
        let e = convert_options(Command::Convert, Format::Distcp, [("world_sizes", "2")]).unwrap_err();
        assert!(matches!(e, Error::UnknownOption { .. }));
        assert_eq!(e.to_string(), "unknown option world_sizes; did you mean: world_size?");
        let e = convert_options(Command::Convert, Format::Hfai, [("hfai_large", "2")]).unwrap_err();
        assert!(e.to_string().contains("did you mean: hfai_large_size"), "{e}");
        // An option of another command is unknown to this one, with the names this one takes.
        let e = convert_options(Command::Save, Format::Torch, [("include", "a")]).unwrap_err();
        assert!(matches!(e, Error::UnknownOption { .. }), "{e}");
        let e = read_limits(Command::Read, [("max_deph", "3")]).unwrap_err();
        assert!(e.to_string().contains("did you mean: max_depth"), "{e}");
        let e = read_limits(Command::Read, [("zzzz", "3")]).unwrap_err();
        assert!(e.to_string().contains("the options are "), "{e}");
    }

    #[test]
    fn torch_load_habits_get_what_ckpt_does_instead() {
        let e = unknown_option(Command::Read, "map_location");
        assert!(e.to_string().contains("on the CPU") && e.to_string().contains("framework=\"pt\""), "{e}");
        let e = unknown_option(Command::Read, "weights_only");
        assert!(e.to_string().contains("never runs pickle code"), "{e}");
    }

    #[test]
    fn values_are_checked() {
        for (name, value) in [
            ("world_size", "0"),
            ("world_size", "four"),
            ("dcp_profile", "torch999"),
            ("dtype", "int8"),
            ("rename", "no-equals"),
            ("name_map", "gpt2"),
            ("overwrite", "maybe"),
        ] {
            let e = convert_options(Command::Convert, Format::Distcp, [(name, value)]).unwrap_err();
            assert_eq!(e.fault(), ckpt_tensor::Fault::InvalidArgument, "{name}={value}: {e}");
        }
        let e = convert_options(Command::Convert, Format::Hf, [("max_shard_size", "lots")]).unwrap_err();
        assert!(matches!(e, Error::InvalidOptionValue { .. }), "{e}");
    }

    #[test]
    fn values_reach_their_options() {
        let named = [
            ("world_size", "3"),
            ("parallel", "2"),
            ("slice_size", "4096"),
            ("include", "model.*"),
            ("include", "step"),
            ("rename", "a.*=b.*"),
            ("dtype", "bfloat16"),
            ("no_sync", "true"),
            ("tag", "global_step2"),
            ("max_depth", "7"),
            ("max_header_bytes", "99"),
        ];
        let o = convert_options(Command::Convert, Format::Recis, named).unwrap();
        assert_eq!(o.world_size, 3);
        assert_eq!(o.target, TargetOptions::Recis { parallel: Some(2), slice_size: Some(4096) });
        assert_eq!(o.selection.include, ["model.*", "step"]);
        assert_eq!(o.selection.dtype, Some(ckpt_tensor::DType::BF16));
        assert!(!o.durability.sync && o.durability.checksums);
        assert_eq!(o.source.tag.as_deref(), Some("global_step2"));
        assert_eq!(o.limits.max_header_bytes, 99);
        #[cfg(feature = "torch")]
        assert_eq!(o.limits.pickle.max_depth, 7);
        // `trusted` lifts the pickle limits whatever its place; a limit named beside it still applies.
        #[cfg(feature = "torch")]
        {
            let l = read_limits(Command::Read, [("max_nodes", "5"), ("trusted", "true")]).unwrap();
            assert_eq!(l.pickle.max_nodes, 5);
            assert!(l.pickle.max_memo > ckpt_pickle::Limits::BUILTIN.max_memo);
        }
    }
}
