//! The `ckpt` command: inspect, print, verify, compare, convert and reshard PyTorch training checkpoints.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use ckpt::collective::Collective;
use ckpt::{Checkpoint, Format};
use clap::builder::TypedValueParser as _;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

const TOP_EXAMPLES: &str = "Examples:
  ckpt inspect model.pt
  ckpt inspect dcp_checkpoint/ --json
  ckpt cat model.pt layer.weight --limit 8
  ckpt verify dcp_checkpoint/
  ckpt diff model.pt converted.safetensors --atol 1e-6
  ckpt convert hfai_ckpt/ model.safetensors --to safetensors
  ckpt reshard dcp_checkpoint/ dcp_4ranks/ --world-size 4
  mpirun -np 2 ckpt reshard dcp_checkpoint/ dcp_4ranks/ --world-size 4   (built with feature mpi)
    (under mpirun, every multi-file target is split: distcp ranks, hfai parts, hf shards, recis shards and
     pbg partition files are written by all processes, each its own files, process 0 the metadata last;
     single-file targets (torch, safetensors, one-shard hf) by process 0)
  ckpt export-tsv pbg/config.json --entities-output entities.tsv --relation-types-output relation_types.tsv
  ckpt inspect s3://bucket/runs/step-100      (AWS_* variables or --storage-option configure the store)
  ckpt convert dcp_checkpoint/ s3://bucket/hf_model --to hf --verbose

Exit codes: 0 success, 1 a check failed (verify, diff), 2 usage error, 3 bad input, 4 I/O error.";

/// Read, inspect and convert PyTorch training checkpoints without Python.
#[derive(Parser)]
#[command(name = "ckpt", version, about, long_about = None, after_help = TOP_EXAMPLES)]
struct Cli {
    /// Print nothing but results and errors.
    #[arg(long, short, global = true)]
    quiet: bool,
    // Each group's flags under its own heading in every command's help, in this order after the command's
    // own: how the source is read, the readers' limits, object storage.
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    storage: StorageArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every entry of a checkpoint: name, dtype, shape and size, with totals.
    #[command(
        after_help = "Examples:\n  ckpt inspect model.pt\n  ckpt inspect checkpoint_dir --json | jq '.entries[].name'\n  \
                      ckpt inspect last.ckpt --include 'state_dict.*' --exclude '*.num_batches_tracked'"
    )]
    Inspect {
        /// A checkpoint file or directory.
        path: PathBuf,
        /// Print JSON: {"format", "details", "entries": [{"name", "dtype", "shape", "nbytes"}], "totals"}.
        #[arg(long)]
        json: bool,
        /// List only entries whose name matches this glob (repeatable; `*` matches dots too).
        #[arg(long, value_name = "GLOB")]
        include: Vec<String>,
        /// Leave out entries whose name matches this glob (repeatable).
        #[arg(long, value_name = "GLOB")]
        exclude: Vec<String>,
    },
    /// Print a tensor's values, numpy-style, or a value (strings as they are, others as Python's repr).
    #[command(after_help = "Examples:\n  ckpt cat model.pt fc.weight\n  ckpt cat model.pt fc.weight --limit 4\n  \
                            ckpt cat pbg/ckpt config   # the training config.json")]
    Cat {
        /// A checkpoint file or directory.
        path: PathBuf,
        /// The entry name, as `ckpt inspect` lists it.
        name: String,
        /// Show at most this many values per dimension edge (numpy's edgeitems); 0 shows everything.
        #[arg(long, default_value_t = 3)]
        limit: usize,
    },
    /// Check a checkpoint's structure (every header and metadata parsed, every entry resolved, every
    /// referenced file present with its size, the checksum manifest consistent, the format's commit state)
    /// without reading tensor data; `--deep` also reads every byte and checks every checksum. Exits 0 when
    /// everything holds, 1 listing each problem, 3 when it cannot be read at all.
    #[command(after_help = "Examples:\n  ckpt verify model.pt\n  ckpt verify --deep dcp_checkpoint/\n  \
                            ckpt verify pbg/ckpt   # the committed version, counts against config.json's entity path")]
    Verify {
        /// A checkpoint file or directory.
        path: PathBuf,
        /// Also read every byte and check every checksum the format has: ZIP CRC-32s (torch, DCP items,
        /// hfai parts, RecIS `.pt` files), ckpt's `ckpt.checksums.json` beside distcp, hfai, recis and pbg
        /// checkpoints, and the per-tensor checksums ckpt writes into safetensors headers.
        #[arg(long)]
        deep: bool,
    },
    /// Compare two checkpoints, of any formats: entries on one side only, dtype and shape changes, the largest
    /// absolute and relative difference of each tensor, non-tensor values. The state each format's layout
    /// carries is compared: entries pair by name, else by the name the state has in its format (hfai nests a
    /// plain state dict under `model.`); a format's bookkeeping (hfai's `__nshards__`, `__version__`) is
    /// listed as layout keys, not as differences (`--raw`: every entry as listed). Exits 0 when equal within
    /// tolerance (numpy allclose: |a - b| <= atol + rtol * |b|, NaN equal to NaN), 1 otherwise.
    #[command(after_help = "Examples:\n  ckpt diff a.pt b.pt\n  \
                            ckpt diff model.pt model.safetensors --rtol 1e-3 --atol 1e-5\n  \
                            ckpt diff dcp_checkpoint/ hfai_ckpt/ --all\n  \
                            ckpt diff dcp_checkpoint/ hfai_ckpt/ --raw")]
    Diff {
        /// First checkpoint (`a`).
        a: PathBuf,
        /// Second checkpoint (`b`, the reference of the relative tolerance).
        b: PathBuf,
        /// Relative tolerance.
        #[arg(long, default_value_t = 1e-5)]
        rtol: f64,
        /// Absolute tolerance.
        #[arg(long, default_value_t = 1e-8)]
        atol: f64,
        /// Also list the tensors that are equal, with their differences.
        #[arg(long)]
        all: bool,
        /// Compare every entry as its reader lists it, layout keys included (hfai's `__nshards__`, its
        /// `model.` nesting, ...), instead of the state each format's layout carries.
        #[arg(long)]
        raw: bool,
    },
    /// Convert a checkpoint into another format.
    #[command(after_help = convert_help())]
    Convert {
        /// The source checkpoint.
        src: PathBuf,
        /// The destination file or directory.
        dst: PathBuf,
        /// The target format (one that ckpt writes).
        #[arg(long, value_parser = target_parser())]
        to: Format,
        /// The source format (detected when omitted).
        #[arg(long, value_parser = format_parser())]
        from: Option<Format>,
        /// Replace whatever is at DST, whole (by default DST must be new, an empty directory, or a
        /// checkpoint of the target format).
        #[arg(long)]
        overwrite: bool,
        #[command(flatten)]
        layout: LayoutArgs,
        #[command(flatten)]
        select: SelectArgs,
    },
    /// Rewrite a sharded checkpoint for another number of ranks, parts or shards.
    #[command(about = reshard_about(), after_help = "Examples:\n  ckpt reshard dcp_checkpoint/ dcp_3ranks/ --world-size 3\n  \
                            ckpt reshard hfai_ckpt/ hfai_2parts/ --world-size 2\n  \
                            ckpt reshard recis_ckpt/ recis_4shards/ --world-size 4")]
    Reshard {
        /// The source checkpoint directory.
        path: PathBuf,
        /// The destination directory (new, empty, or a checkpoint of the source's format).
        dst: PathBuf,
        /// The new number of ranks, parts or shards.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        world_size: u32,
        /// Replace whatever is at DST, whole.
        #[arg(long)]
        overwrite: bool,
    },
    /// Export a PyTorch-BigGraph checkpoint's embeddings and relation parameters as TSV, as
    /// torchbiggraph_export_to_tsv does (outputs must not exist, unless --overwrite).
    #[command(
        name = "export-tsv",
        after_help = "CONFIG is PBG's config file (checkpoint_path and entity_path resolved against the working\n\
                            directory, then the config's directory), or a checkpoint directory (its config.json).\n\n\
                            Examples:\n  \
                            ckpt export-tsv config.json --entities-output entities.tsv --relation-types-output relation_types.tsv\n  \
                            ckpt export-tsv pbg/ckpt --entities-output e.tsv --relation-types-output r.tsv"
    )]
    ExportTsv {
        /// PBG's config file, or a checkpoint directory.
        config: PathBuf,
        /// Where to write the entity embeddings.
        #[arg(long)]
        entities_output: PathBuf,
        /// Where to write the relation type parameters.
        #[arg(long)]
        relation_types_output: PathBuf,
        /// Replace the outputs if they exist.
        #[arg(long)]
        overwrite: bool,
    },
}

/// `--from`: a format by name, the possible values (with what each is) from the registry.
fn format_parser() -> impl clap::builder::TypedValueParser<Value = Format> {
    formats_parser(Format::ALL.into_iter())
}

/// `--to`: a format that ckpt writes ([`Format::writable`]), by name; the read-only formats are not offered.
fn target_parser() -> impl clap::builder::TypedValueParser<Value = Format> {
    formats_parser(Format::ALL.into_iter().filter(|f| f.writable()))
}

/// A parser of the names of `formats`, each offered with what it is.
fn formats_parser(formats: impl Iterator<Item = Format>) -> impl clap::builder::TypedValueParser<Value = Format> {
    let values: Vec<_> = formats.map(|f| clap::builder::PossibleValue::new(f.name()).help(f.about())).collect();
    clap::builder::PossibleValuesParser::new(values).try_map(|name| name.parse::<Format>())
}

fn convert_help() -> String {
    let names = |writable: bool| {
        let names: Vec<&str> = Format::ALL.iter().filter(|f| f.writable() == writable).map(|f| f.name()).collect();
        names.join(", ")
    };
    format!(
        "Targets: {}. Read only: {}.\n\n\
         Examples:\n  ckpt convert model.pt model.safetensors --to safetensors\n  \
         ckpt convert dcp_checkpoint/ hf_model/ --to hf --max-shard-size 2GB\n  \
         ckpt convert hfai_ckpt/ out_dcp/ --to distcp --world-size 2\n  \
         ckpt convert last.ckpt model.safetensors --to safetensors --include 'state_dict.*' --strip-prefix state_dict.model. --dtype bf16",
        names(true),
        names(false)
    )
}

/// The formats `reshard` handles, from the registry: `distcp, hfai or recis`.
fn sharded_formats() -> String {
    let names: Vec<&str> = ckpt::reshard_formats().iter().map(|f| f.name()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

fn reshard_about() -> String {
    format!("Rewrite a {} checkpoint for another number of ranks, parts or shards", sharded_formats())
}

fn world_size_help() -> String {
    format!("Ranks, shards or parts of a {} target", sharded_formats())
}

/// Exit codes: 0 success, 1 a check failed, 2 usage error (clap), 3 bad input, 4 I/O error.
const EXIT_SUCCESS: u8 = 0;
const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_BAD_INPUT: u8 = 3;
const EXIT_IO: u8 = 4;

fn main() -> ExitCode {
    ExitCode::from(run(std::env::args_os()))
}

/// Runs the command line `args` (the program's name first, as [`std::env::args_os`] gives them) and returns
/// the exit code. The Python package's `ckpt` command is this function: its extension compiles this file
/// (`python/src/cli.rs`) and passes it `sys.argv`.
pub fn run(args: impl IntoIterator<Item = std::ffi::OsString>) -> u8 {
    let cli = Cli::parse_from(args);
    let limits = &match cli.limits.read_limits() {
        Ok(limits) => limits,
        Err(e) => {
            let e = as_flags(e);
            eprintln!("error: {e}");
            return exit_code(&e);
        }
    };
    let source = &cli.source.options();
    let storage = &match cli.storage.options() {
        Ok(options) => Storage { options, verbose: cli.storage.verbose },
        Err(e) => {
            let e = as_flags(e);
            eprintln!("error: {e}");
            return exit_code(&e);
        }
    };
    let group = match Launch::start() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let group = group.collective();
    if group.rank() != 0 && !matches!(cli.command, Command::Convert { .. } | Command::Reshard { .. }) {
        // Under mpirun, commands other than convert and reshard run once, on rank 0.
        return EXIT_SUCCESS;
    }
    // Under mpirun, only rank 0 reports.
    let quiet = cli.quiet || group.rank() != 0;
    let result = match &cli.command {
        Command::Inspect { path, json, include, exclude } => {
            let mut selection = ckpt::Selection::default();
            selection.include.clone_from(include);
            selection.exclude.clone_from(exclude);
            // At a URL, only what listing needs is fetched (indexes, headers, ZIP central directories); the
            // readers trust the rest, and fetch what they do read (an hfai tensor split across parts).
            let listing = source.clone().with_listing_only(!place(path).is_ok_and(|p| p.is_local()));
            fetched_for(path, storage, ckpt::storage::Fetch::Lazy)
                .and_then(|staged| {
                    let listing = listing.with_fill(staged.path(), staged.fill());
                    Ok((ckpt::open_source(staged.path(), None, limits, &listing)?, staged))
                })
                .and_then(|(c, staged)| {
                    inspect(&c, path, *json, &selection)?;
                    report_lazy(path, storage, &staged)?;
                    // The process ends next: freeing a large checkpoint's metadata (hundreds of thousands of
                    // chunks) would only add to its time. A reader holds nothing that needs its destructor.
                    std::mem::forget(c);
                    Ok(())
                })
                .map(|()| true)
        }
        // At a URL, a DCP checkpoint's data is fetched as it is read: the tensors shown, no more.
        Command::Cat { path, name, limit } => fetched_for(path, storage, ckpt::storage::Fetch::Lazy)
            .and_then(|staged| {
                let source = source.clone().with_fill(staged.path(), staged.fill());
                cat(&ckpt::open_source(staged.path(), None, limits, &source)?, name, *limit)?;
                report_lazy(path, storage, &staged)
            })
            .map(|()| true),
        Command::Verify { path, deep } => verify(path, *deep, limits, storage, quiet),
        Command::Diff { a, b, rtol, atol, all, raw } => {
            let layout = if *raw { ckpt::diff::DiffLayout::Raw } else { ckpt::diff::DiffLayout::State };
            diff(a, b, *rtol, *atol, *all, layout, limits, source, storage, quiet)
        }
        Command::Convert { src, dst, to, from, overwrite, layout, select } => match layout.options(*to) {
            Ok(options) => {
                let source = source.clone().with_model_only(select.model_only);
                let options = options.with_selection(select.selection()).with_limits(*limits).with_source(source);
                let options = options.with_overwrite(*overwrite);
                convert(src, dst, *to, *from, &options, storage, quiet, group)
            }
            Err(e) => {
                let e = as_flags(e);
                eprintln!("error: {e}");
                return exit_code(&e);
            }
        },
        Command::Reshard { path, dst, world_size, overwrite } => {
            let options = ckpt::ReshardOptions::default().with_limits(*limits).with_overwrite(*overwrite);
            reshard(path, dst, *world_size, &options, source, storage, quiet, group)
        }
        Command::ExportTsv { config, entities_output, relation_types_output, overwrite } => {
            let outputs = (entities_output.as_path(), relation_types_output.as_path());
            export_tsv(config, outputs, *overwrite, limits, storage, quiet)
        }
    };
    match result {
        Ok(true) => EXIT_SUCCESS,
        Ok(false) => EXIT_FAILED,
        // `ckpt inspect x --json | head`: the reader went away; that is not an error.
        Err(ckpt::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => EXIT_SUCCESS,
        Err(e) => {
            let e = as_flags(e);
            eprintln!("error: {}", ckpt::error_chain(&e, "\n  caused by: "));
            exit_code(&e)
        }
    }
}

/// An option error in the words of the command line: the facade's parser names options as Python does
/// (`world_size`), the tool as its flags (`--world-size`).
fn as_flags(e: ckpt::Error) -> ckpt::Error {
    let flag = |option: String| {
        if option.starts_with('-') { option } else { format!("--{}", option.replace('_', "-")) }
    };
    match e {
        ckpt::Error::OptionNotApplicable { option, reason } => {
            ckpt::Error::OptionNotApplicable { option: flag(option), reason }
        }
        ckpt::Error::InvalidOptionValue { option, value, expected } => {
            ckpt::Error::InvalidOptionValue { option: flag(option), value, expected }
        }
        e => e,
    }
}

/// The exit code of an error, from who is at fault ([`ckpt::Error::fault`]): the caller (2, as a usage
/// error), the operating system (4), or the input, a limit or the library (3).
fn exit_code(e: &ckpt::Error) -> u8 {
    match e.fault() {
        ckpt::Fault::InvalidArgument => EXIT_USAGE,
        ckpt::Fault::Io => EXIT_IO,
        ckpt::Fault::Malformed | ckpt::Fault::Unsupported | ckpt::Fault::Limit => EXIT_BAD_INPUT,
        // A class added later: the input's, as malformed data is.
        _ => EXIT_BAD_INPUT,
    }
}

/// A progress bar on stderr over `total` units, hidden when quiet or when stderr is not a terminal.
fn bar(quiet: bool, total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if quiet || !std::io::stderr().is_terminal() {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} ({elapsed})") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_owned());
    pb
}

/// Runs `write` with a bar of the bytes written against `estimate` on stderr (one process; a spinner
/// when several share the work or the estimate fails), hidden like [`bar`].
fn write_progress<T>(
    quiet: bool,
    group: &dyn Collective,
    what: &str,
    estimate: impl FnOnce() -> ckpt::Result<u64>,
    write: impl FnOnce() -> T,
) -> T {
    let show = !quiet && std::io::stderr().is_terminal();
    match (show && group.world_size() == 1).then(estimate) {
        Some(Ok(total)) => ckpt::progress::with_write_meter(true, total, what, write),
        _ => {
            let pb = spinner(quiet, what);
            let out = write();
            pb.finish_and_clear();
            out
        }
    }
}

/// A spinner on stderr for work whose size is not known, hidden like [`bar`].
fn spinner(quiet: bool, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if quiet || !std::io::stderr().is_terminal() {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    } else {
        pb.enable_steady_tick(Duration::from_millis(100));
    }
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.set_message(what.to_owned());
    pb
}

fn stdout_err(e: std::io::Error) -> ckpt::Error {
    ckpt::Error::Io { path: "<stdout>".into(), source: e }
}

fn verify(path: &Path, deep: bool, limits: &ckpt::ReadLimits, storage: &Storage, quiet: bool) -> ckpt::Result<bool> {
    let staged = fetched(path, storage)?;
    let pb = bar(quiet, 0, &format!("verifying {}", path.display()));
    let progress = |done: u64, total: u64| {
        pb.set_length(total);
        pb.set_position(done);
    };
    let depth = if deep { ckpt::Depth::Deep } else { ckpt::Depth::Structure };
    let options = ckpt::VerifyOptions::default().with_depth(depth).with_limits(*limits);
    let report = ckpt::verify_with_progress(staged.path(), &options, &progress);
    pb.finish_and_clear();
    // At a URL: what a save that did not finish left beside the checkpoint (its lock, objects without a
    // commit point), listed also when what is there cannot be read as a checkpoint at all.
    let left = match place(path)? {
        ckpt::storage::Location::Remote(url) => {
            ckpt::storage::unfinished(&url, ckpt::detect(staged.path()).ok(), &storage.options)?
        }
        ckpt::storage::Location::Local(_) => Vec::new(),
    };
    let mut report = match report {
        Ok(r) => r,
        Err(e) => {
            for p in &left {
                println!("problem: {p}");
            }
            return Err(e);
        }
    };
    report.problems.extend(left);
    let mut out = std::io::stdout().lock();
    for w in report.warnings() {
        if !quiet {
            writeln!(out, "warning: {w}").map_err(stdout_err)?;
        }
    }
    for p in report.errors() {
        writeln!(out, "problem: {p}").map_err(stdout_err)?;
    }
    let what = format!("{} checkpoint {}", report.format, path.display());
    if report.is_ok() {
        if !quiet {
            writeln!(out, "ok: {what}: {} entries, {} verified", report.records, human_bytes(report.bytes))
                .map_err(stdout_err)?;
        }
    } else {
        let n = report.errors().count();
        writeln!(out, "FAILED: {what}: {n} problem{}", if n == 1 { "" } else { "s" }).map_err(stdout_err)?;
    }
    Ok(report.is_ok())
}

#[allow(clippy::too_many_arguments)]
fn diff(
    a: &Path,
    b: &Path,
    rtol: f64,
    atol: f64,
    all: bool,
    layout: ckpt::diff::DiffLayout,
    limits: &ckpt::ReadLimits,
    source: &ckpt::SourceOptions,
    storage: &Storage,
    quiet: bool,
) -> ckpt::Result<bool> {
    let lazy = ckpt::storage::Fetch::Lazy;
    let (a_staged, b_staged) = (fetched_for(a, storage, lazy)?, fetched_for(b, storage, lazy)?);
    let source = source.clone().with_fill(a_staged.path(), a_staged.fill()).with_fill(b_staged.path(), b_staged.fill());
    let options = ckpt::DiffOptions::default()
        .with_rtol(rtol)
        .with_atol(atol)
        .with_limits(*limits)
        .with_source(source)
        .with_layout(layout);
    let pb = bar(quiet, 0, "comparing");
    let progress = |done: u64, total: u64| {
        pb.set_length(total);
        pb.set_position(done);
    };
    let report = ckpt::diff_with_progress(a_staged.path(), b_staged.path(), &options, &progress);
    pb.finish_and_clear();
    report_lazy(a, storage, &a_staged)?;
    report_lazy(b, storage, &b_staged)?;
    let report = report?;
    let mut out = std::io::stdout().lock();
    for line in report.lines(&a.display().to_string(), &b.display().to_string(), &options, all, quiet) {
        writeln!(out, "{line}").map_err(stdout_err)?;
    }
    let equal = report.is_equal();
    Ok(equal)
}

/// The target layout of `ckpt convert`: its number of ranks, and the target format's own flags (each
/// format's are declared with its adaptor in the library, `ckpt::TargetArgs`).
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Target")]
struct LayoutArgs {
    #[arg(long, help = world_size_help(), default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    world_size: u32,
    /// Do not fsync the files written (faster; the new checkpoint still replaces the old one atomically, but
    /// a power failure may lose it).
    #[arg(long)]
    no_sync: bool,
    /// Write no checksums (no `ckpt.checksums.json`, CRC-32 0 in `torch.save` records, no CRC32C in
    /// safetensors headers): `ckpt verify --deep` then has nothing to check the bytes against.
    #[arg(long)]
    no_checksums: bool,
    #[command(flatten)]
    target: ckpt::TargetArgs,
}

impl LayoutArgs {
    /// The conversion's options for a target of format `to`, or why the flags do not fit it.
    fn options(&self, to: ckpt::Format) -> ckpt::Result<ckpt::ConvertOptions> {
        ckpt::named_options::check_target(to, self.world_size as usize)?;
        let target = self.target.options(to)?;
        let durability = ckpt::io::Durability::default().with_sync(!self.no_sync).with_checksums(!self.no_checksums);
        Ok(ckpt::ConvertOptions::default()
            .with_world_size(self.world_size as usize)
            .with_target(target)
            .with_durability(durability))
    }
}

/// Which entries `ckpt convert` writes, under which names, in which float dtype.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Selection")]
struct SelectArgs {
    /// Convert only entries whose name (as `ckpt inspect` lists it) matches this glob (repeatable; `*`
    /// matches dots too, `?` one character, `[..]` a set).
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Leave out entries whose name matches this glob (repeatable; applied after --include).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// deepspeed, megatron: convert the model's weights only (DeepSpeed's consolidated fp32 state dict,
    /// Megatron's model tensors), what transformers loads: not the optimizer state, the 16-bit module.*
    /// copies, the engine and client state (default: every entry `ckpt inspect` lists).
    #[arg(long)]
    model_only: bool,
    /// Remove this prefix from entry names that start with it (DDP's `module.`, Lightning's `model.`).
    #[arg(long, value_name = "PREFIX")]
    strip_prefix: Option<String>,
    /// Prepend this to every entry name (after --strip-prefix).
    #[arg(long, value_name = "PREFIX")]
    add_prefix: Option<String>,
    /// Cast floating-point tensors to this dtype, rounding to nearest even as torch's `.to()` does (other
    /// tensors and values are left as they are).
    #[arg(long, value_parser = dtype_parser())]
    dtype: Option<ckpt::DType>,
    /// Make quantized and sparse tensors dense: quantized ones dequantized to float32 as torch's
    /// `dequantize()` does, sparse ones as `to_dense()` (without it, their components are written: `<name>`,
    /// `<name>.scale`, `<name>.zero_point`, `<name>.indices`, ...). Nested tensors have no dense form.
    #[arg(long)]
    dense: bool,
    /// Rename entries: FROM=TO (repeatable; the first rule that matches a name applies). With `*` in FROM
    /// the whole name must match and each `*` in TO takes what the `*` of FROM matched, in order
    /// (`'decoder.layers.*.mlp.*=model.layers.*.mlp.*'`); without, FROM is a prefix replaced by TO.
    #[arg(long, value_name = "FROM=TO", value_parser = rename_rule)]
    rename: Vec<(String, String)>,
}

/// `--rename FROM=TO`, read by the facade's parser ([`ckpt::named_options::rename_rule`]).
fn rename_rule(text: &str) -> Result<(String, String), String> {
    ckpt::named_options::rename_rule(text).map_err(|e| e.to_string())
}

/// How a checkpoint is read (every command): a DeepSpeed root's tag, Megatron's layers, a name map.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Source")]
struct SourceArgs {
    /// deepspeed: the tag (save) to read under a checkpoint root, e.g. global_step14 (default: the one
    /// `latest` names).
    #[arg(long, global = true, value_name = "TAG")]
    tag: Option<String>,
    /// megatron: split tensors stacked over layers (`decoder.layers.<name>` with a leading layer axis) into
    /// one entry per layer (`decoder.layers.<i>.<name>`).
    #[arg(long, global = true)]
    unstack_layers: bool,
    /// megatron: name a GPT model's tensors as this Hugging Face model family names them (llama: q/k/v_proj
    /// split from linear_qkv by the head layout in args, gate/up_proj from a gated linear_fc1; layers
    /// unstacked).
    #[arg(long, global = true, value_enum, value_name = "MAP")]
    name_map: Option<ckpt::NameMap>,
}

impl SourceArgs {
    fn options(&self) -> ckpt::SourceOptions {
        let mut o = ckpt::SourceOptions::default().with_unstack_layers(self.unstack_layers);
        if let Some(t) = &self.tag {
            o = o.with_tag(t);
        }
        if let Some(m) = self.name_map {
            o = o.with_name_map(m);
        }
        o
    }
}

impl SelectArgs {
    fn selection(&self) -> ckpt::Selection {
        let mut s = ckpt::Selection::default();
        s.include.clone_from(&self.include);
        s.exclude.clone_from(&self.exclude);
        s.strip_prefix.clone_from(&self.strip_prefix);
        s.add_prefix.clone_from(&self.add_prefix);
        s.dtype = self.dtype;
        s.dense = self.dense;
        for (from, to) in &self.rename {
            s = s.with_rename(from, to);
        }
        s
    }
}

/// `--dtype`: bf16, f16, f32, f64 (or torch's names).
fn dtype_parser() -> impl clap::builder::TypedValueParser<Value = ckpt::DType> {
    let values = [
        ("bf16", "bfloat16", ckpt::DType::BF16),
        ("f16", "float16", ckpt::DType::F16),
        ("f32", "float32", ckpt::DType::F32),
        ("f64", "float64", ckpt::DType::F64),
    ];
    let possible = values.map(|(short, long, _)| clap::builder::PossibleValue::new(short).alias(long));
    clap::builder::PossibleValuesParser::new(possible).map(move |name: String| {
        values.iter().find(|(short, long, _)| *short == name || *long == name).map_or(ckpt::DType::F32, |v| v.2)
    })
}

#[allow(clippy::too_many_arguments)]
fn convert(
    src: &Path,
    dst: &Path,
    to: Format,
    from: Option<Format>,
    options: &ckpt::ConvertOptions,
    storage: &Storage,
    quiet: bool,
    group: &dyn Collective,
) -> ckpt::Result<bool> {
    let what = format!("converting {} to {to}", src.display());
    // At a URL, a selection of some entries fetches what it reads: the formats read lazily fetch their
    // indexes, then the kept tensors' bytes as the target writes them (the others are fetched whole).
    let lazy = options.selection.filters();
    let staged =
        fetched_for(src, storage, if lazy { ckpt::storage::Fetch::Lazy } else { ckpt::storage::Fetch::Whole })?;
    let options = &options.clone().with_source(options.source.clone().with_fill(staged.path(), staged.fill()));
    let target = target(dst, storage)?;
    let remote = ckpt::storage::check_destination(&place(dst)?, to, options.overwrite, &storage.options)?;
    let summary = write_progress(
        quiet,
        group,
        &what,
        || ckpt::output_estimate(staged.path(), from, options),
        || ckpt::convert_in(staged.path(), from, target.path(), to, options, group),
    )?;
    published(target, storage, group)?;
    removed_stale(remote, group)?;
    if group.rank() == 0 {
        report_lazy(src, storage, &staged)?;
    }
    let mut out = std::io::stdout().lock();
    if !summary.dropped.is_empty() && group.rank() == 0 {
        // One line, the count and the first names (a big optimizer state can drop thousands of values);
        // `--verbose`: every name, one a line.
        const SHOWN: usize = 12;
        let n = summary.dropped.len();
        let entries = if n == 1 { "entry" } else { "entries" };
        if storage.verbose {
            writeln!(out, "dropped {n} {entries} a {to} checkpoint cannot hold:").map_err(stdout_err)?;
            for name in &summary.dropped {
                writeln!(out, "  {name}").map_err(stdout_err)?;
            }
        } else {
            let names: Vec<&str> = summary.dropped.iter().take(SHOWN).map(String::as_str).collect();
            let tail = if n > SHOWN { ", ... (--verbose lists all)" } else { "" };
            writeln!(out, "dropped {n} {entries} a {to} checkpoint cannot hold: {}{tail}", names.join(", "))
                .map_err(stdout_err)?;
        }
    }
    if !quiet {
        writeln!(
            out,
            "converted {} to {to} {}: {} tensors ({}), {} values{}",
            src.display(),
            dst.display(),
            summary.tensors,
            human_bytes(summary.bytes),
            summary.values,
            if summary.dropped.is_empty() { String::new() } else { format!(", {} dropped", summary.dropped.len()) }
        )
        .map_err(stdout_err)?;
    }
    Ok(true)
}

#[allow(clippy::too_many_arguments)]
fn reshard(
    src: &Path,
    dst: &Path,
    world: u32,
    options: &ckpt::ReshardOptions,
    source: &ckpt::SourceOptions,
    storage: &Storage,
    quiet: bool,
    group: &dyn Collective,
) -> ckpt::Result<bool> {
    let what = format!("resharding {} for {world}", src.display());
    let staged = fetched(src, storage)?;
    let target = target(dst, storage)?;
    let format = ckpt::detect(staged.path())?;
    // The global flags of how a source is read apply to no format reshard takes: refused, not ignored.
    ckpt::named_options::check_source(source, format)?;
    let remote = ckpt::storage::check_destination(&place(dst)?, format, options.overwrite, &storage.options)?;
    let limits = options.limits;
    let estimate = || ckpt::output_estimate(staged.path(), None, &ckpt::ConvertOptions::default().with_limits(limits));
    let summary = write_progress(quiet, group, &what, estimate, || {
        ckpt::reshard_in_with_options(staged.path(), target.path(), world as usize, options, group)
    })?;
    published(target, storage, group)?;
    removed_stale(remote, group)?;
    if !quiet {
        writeln!(
            std::io::stdout().lock(),
            "resharded {} checkpoint {} into {} for world size {}: {} tensors ({})",
            summary.format,
            src.display(),
            dst.display(),
            summary.world_size,
            summary.tensors,
            human_bytes(summary.bytes)
        )
        .map_err(stdout_err)?;
    }
    Ok(true)
}

#[cfg(not(feature = "pbg"))]
fn export_tsv(
    config: &Path,
    _: (&Path, &Path),
    _: bool,
    _: &ckpt::ReadLimits,
    _: &Storage,
    _: bool,
) -> ckpt::Result<bool> {
    Err(ckpt::Error::FeatureDisabled { path: config.to_path_buf(), format: ckpt::Format::Pbg, feature: "pbg" })
}

#[cfg(feature = "pbg")]
fn export_tsv(
    config: &Path,
    (entities_output, relation_types_output): (&Path, &Path),
    overwrite: bool,
    limits: &ckpt::ReadLimits,
    storage: &Storage,
    quiet: bool,
) -> ckpt::Result<bool> {
    let shown = (config, entities_output, relation_types_output);
    let staged = fetched(config, storage)?;
    let config = staged.path();
    let entities = ckpt::storage::staged_target(&place(entities_output)?, &storage.options)?;
    let relations = ckpt::storage::staged_target(&place(relation_types_output)?, &storage.options)?;
    // An output that exists is refused, or with --overwrite written beside it and swapped in whole.
    let entities_tsv = TsvOutput::new(entities.path(), overwrite)?;
    let relations_tsv = TsvOutput::new(relations.path(), overwrite)?;
    let (entities_output, relation_types_output) = (entities_tsv.path(), relations_tsv.path());
    let pbg = |path: &Path| {
        let path = path.to_path_buf();
        move |source: ckpt::pbg::Error| ckpt::Error::Format { path, source: source.into() }
    };
    let located = ckpt::pbg::ConfigFile::locate(config).map_err(pbg(config))?;
    let cfg = located.config();
    let checkpoint_dir = located.checkpoint_dir();
    let entity_path = located.entity_path().unwrap_or_else(|| located.resolve("."));
    let pb = spinner(quiet, "exporting");
    let read = ckpt::pbg::ReadOptions::default().with_limits(limits.pickle);
    let result = ckpt::pbg::PbgReader::open_with(&checkpoint_dir, &read).map_err(pbg(&checkpoint_dir)).and_then(|ck| {
        let entities = ckpt::pbg::EntityStorage::new(&entity_path);
        ckpt::pbg::export_tsv(&ck, cfg, &entities, entities_output, relation_types_output)
            .map_err(pbg(&checkpoint_dir))
            .map(|()| ck.version())
    });
    pb.finish_and_clear();
    let version = result?;
    entities_tsv.commit()?;
    relations_tsv.commit()?;
    let group = ckpt::collective::SingleProcess;
    published(entities, storage, &group)?;
    published(relations, storage, &group)?;
    if !quiet {
        writeln!(
            std::io::stdout().lock(),
            "exported version {version} of {}: {} and {}",
            shown.0.display(),
            shown.1.display(),
            shown.2.display()
        )
        .map_err(stdout_err)?;
    }
    Ok(true)
}

/// One TSV output of `export-tsv`: new, or (with `--overwrite`) written at a staging path beside what is
/// there and swapped in whole by [`TsvOutput::commit`].
#[cfg(feature = "pbg")]
struct TsvOutput {
    target: std::path::PathBuf,
    staging: Option<std::path::PathBuf>,
}

#[cfg(feature = "pbg")]
impl TsvOutput {
    fn new(target: &Path, overwrite: bool) -> ckpt::Result<TsvOutput> {
        let commit = |e: ckpt::io::CommitError| ckpt::Error::Io {
            path: target.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        };
        if std::fs::symlink_metadata(target).is_err() {
            return Ok(TsvOutput { target: target.to_path_buf(), staging: None });
        }
        if !overwrite {
            return Err(ckpt::Error::AlreadyExists {
                path: target.to_path_buf(),
                reason: "the output exists; pass --overwrite to replace it, or write to another path".into(),
            });
        }
        let staging = ckpt::io::overwrite_staging(target).map_err(commit)?;
        Ok(TsvOutput { target: target.to_path_buf(), staging: Some(staging) })
    }

    /// Where the export writes.
    fn path(&self) -> &Path {
        self.staging.as_deref().unwrap_or(&self.target)
    }

    fn commit(&self) -> ckpt::Result<()> {
        let Some(staging) = &self.staging else { return Ok(()) };
        ckpt::io::replace_whole(staging, &self.target, true)
            .map_err(|e| ckpt::Error::Io { path: self.target.clone(), source: std::io::Error::other(e.to_string()) })
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

/// Prints [`ckpt::inspect`]'s report: as JSON, or as a table with the totals.
/// More details than this are listed one per line by `inspect`, not in parentheses after the path.
const LONG_DETAILS: usize = 8;

fn inspect(c: &Checkpoint, shown: &Path, json: bool, selection: &ckpt::Selection) -> ckpt::Result<()> {
    let entries = c.entries();
    selection.check_selects(&entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), shown)?;
    let mut report = ckpt::inspect(c, selection);
    // The path or URL as given, not the local copy a URL was fetched into.
    shown.clone_into(&mut report.path);
    let mut out = std::io::stdout().lock();
    let io = |e| ckpt::Error::Io { path: "<stdout>".into(), source: e };
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report.to_json()).unwrap_or_default()).map_err(io)?;
        return Ok(());
    }
    let detail_text: Vec<String> = report.details.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    if detail_text.is_empty() {
        writeln!(out, "{} checkpoint {}", report.format, report.path.display()).map_err(io)?;
    } else if detail_text.len() > LONG_DETAILS {
        // Many details (a GGUF file's metadata and ggml types): one per line.
        writeln!(out, "{} checkpoint {}", report.format, report.path.display()).map_err(io)?;
        for line in &detail_text {
            writeln!(out, "  {line}").map_err(io)?;
        }
    } else {
        writeln!(out, "{} checkpoint {} ({})", report.format, report.path.display(), detail_text.join(", "))
            .map_err(io)?;
    }
    let rows: Vec<[String; 4]> = report
        .entries
        .iter()
        .map(|e| match &e.kind {
            ckpt::inspect::InspectedKind::Tensor { dtype, shape, nbytes } => {
                [e.name.clone(), dtype.torch_name().to_owned(), format!("{shape:?}"), human_bytes(*nbytes as u64)]
            }
            ckpt::inspect::InspectedKind::OpaqueTensor { kind } => {
                [e.name.clone(), format!("{kind} tensor"), "-".into(), "-".into()]
            }
            // A quantized, sparse or nested tensor: its dtype and layout, its dense shape (a nested tensor's
            // components: its buffer's and sizes' shapes), its components' bytes.
            ckpt::inspect::InspectedKind::Composite { layout, dtype, shape, components, nbytes } => {
                let shape = if *layout == "nested" {
                    let parts: Vec<String> = components.iter().take(2).map(|(n, _, s)| format!("{n} {s:?}")).collect();
                    format!("{shape:?} ({})", parts.join(", "))
                } else {
                    format!("{shape:?}")
                };
                [e.name.clone(), format!("{} ({layout})", dtype.torch_name()), shape, human_bytes(*nbytes as u64)]
            }
            ckpt::inspect::InspectedKind::Value { type_name } => {
                [e.name.clone(), (*type_name).to_owned(), "-".into(), "-".into()]
            }
            // A kind added to the report later: listed by name.
            _ => [e.name.clone(), "?".into(), "-".into(), "-".into()],
        })
        .collect();
    let header = ["NAME".to_owned(), "DTYPE".into(), "SHAPE".into(), "SIZE".into()];
    let mut widths = [0usize; 4];
    for r in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let notes = std::iter::once(None).chain(report.entries.iter().map(|e| e.unreadable.as_deref()));
    for (r, note) in std::iter::once(&header).chain(&rows).zip(notes) {
        write!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        )
        .map_err(io)?;
        match note {
            Some(why) => writeln!(out, "  (unreadable: {why})").map_err(io)?,
            None => writeln!(out).map_err(io)?,
        }
    }
    let t = report.totals;
    let plural = |n: usize, word: &str| if n == 1 { format!("{n} {word}") } else { format!("{n} {word}s") };
    let opaque_text =
        if t.opaque_tensors > 0 { format!("; {}", plural(t.opaque_tensors, "opaque tensor")) } else { String::new() };
    writeln!(
        out,
        "{}, {}; {}{opaque_text}",
        plural(t.tensors, "tensor"),
        human_bytes(t.nbytes as u64),
        plural(t.values, "other value")
    )
    .map_err(io)?;
    Ok(())
}

fn cat(c: &Checkpoint, name: &str, limit: usize) -> ckpt::Result<()> {
    // A prefix of entries (`state_dict` of `state_dict.model.w`): every entry under it, each after its name.
    let under = c.entries_under(name);
    if !under.is_empty() {
        for (i, full) in under.iter().enumerate() {
            let mut out = std::io::stdout().lock();
            let gap = if i == 0 { "" } else { "\n" };
            writeln!(out, "{gap}{full}:").map_err(|e| ckpt::Error::Io { path: "<stdout>".into(), source: e })?;
            drop(out);
            cat(c, full, limit)?;
        }
        return Ok(());
    }
    // A numpy value of a dtype with no tensor counterpart is asked as a tensor, whose error names the dtype.
    let is_tensor = c.entries().iter().find(|e| e.name == name).is_none_or(|e| e.tensor_info().is_some())
        || c.value(name).is_ok_and(|v| ckpt::tensor::value::numpy_unsupported(&v).is_some());
    let text = if is_tensor {
        ckpt::display::format_tensor(&c.tensor(name)?, limit)
    } else {
        // A value: strings as they are (a PBG config prints as its JSON), others as Python's repr.
        match c.value(name)? {
            ckpt::Value::Str(s) => s,
            // A quantized, sparse or nested tensor: its components.
            ckpt::Value::Composite(c) => ckpt::display::format_composite(&c, limit),
            // A value holding a tensor (a numpy array a format keeps pickled, as DCP's BYTE_IO items).
            v if v.as_tensor().is_some() => {
                v.as_tensor().map(|t| ckpt::display::format_tensor(t, limit)).unwrap_or_default()
            }
            // Containers and objects indented, a shared object labelled where it is defined and every
            // reference to it printed with that place's path.
            v => ckpt::tensor::flatten::python_str(&v).unwrap_or_else(|_| {
                // A reference out of the entry points to an object that encloses it: named from the top.
                let outside = c
                    .downcast_ref::<ckpt::torch::TorchReader>()
                    .filter(|_| v.has_refs())
                    .map(|t| ckpt::outline::shared_paths(t.module_state_dict().unwrap_or(t.value())))
                    .unwrap_or_default();
                ckpt::outline::format_value_naming(&v, name, &outside)
            }),
        }
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").map_err(|e| ckpt::Error::Io { path: "<stdout>".into(), source: e })
}

/// Object storage: every checkpoint path may be a URL (`s3://bucket/key`, `gs://`, `az://`, `https://` for
/// reads), configured by each cloud's environment variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...)
/// and these options.
#[derive(clap::Args)]
#[command(next_help_heading = "Storage")]
struct StorageArgs {
    /// A configuration key of the URL's store (`aws_endpoint=http://127.0.0.1:9000`, `aws_region=...`,
    /// `allow_http=true`; repeatable). Values are never printed.
    #[arg(long = "storage-option", global = true, value_name = "KEY=VALUE")]
    storage_option: Vec<String>,
    /// Report what object storage moved: objects, bytes and requests of each URL read or written; and
    /// list every entry a conversion drops (by default the count and the first names).
    #[arg(long, short, global = true)]
    verbose: bool,
}

impl StorageArgs {
    fn options(&self) -> ckpt::Result<ckpt::storage::StorageOptions> {
        ckpt::place::storage_options(self.storage_option.iter().map(String::as_str))
    }
}

/// A command's path argument as a place ([`ckpt::place::place`]).
fn place(path: &Path) -> ckpt::Result<ckpt::storage::Location> {
    ckpt::place::place(path)
}

/// The checkpoint at `path` ready to read (a URL's objects fetched), reporting the transfer if `verbose`.
fn fetched(path: &Path, storage: &Storage) -> ckpt::Result<ckpt::storage::Source> {
    fetched_for(path, storage, ckpt::storage::Fetch::Whole)
}

/// [`fetched`], fetching what `what` says (`inspect`: the metadata alone where the format allows).
fn fetched_for(path: &Path, storage: &Storage, what: ckpt::storage::Fetch) -> ckpt::Result<ckpt::storage::Source> {
    let source = ckpt::place::fetched(path, &storage.options, what)?;
    if let (true, Some(t), None) = (storage.verbose, source.transfer(), source.fill()) {
        eprintln!("fetched {}: {t}", place(path)?);
    }
    Ok(source)
}

/// For a copy fetched as it is read ([`ckpt::storage::Fetch::Lazy`]): reports, if `verbose`, what the reads
/// fetched in all (the metadata and every fill), once the command has read what it reads.
fn report_lazy(path: &Path, storage: &Storage, source: &ckpt::storage::Source) -> ckpt::Result<()> {
    if let (true, Some(t), Some(_)) = (storage.verbose, source.transfer(), source.fill()) {
        eprintln!("fetched {} (as read): {t}", place(path)?);
    }
    Ok(())
}

/// Where to write `path` (a URL: the writers stream to it; [`published`] reports the transfer). Under
/// mpirun every process writes its own files to it and rank 0 commits.
fn target(path: &Path, storage: &Storage) -> ckpt::Result<ckpt::storage::Target> {
    ckpt::place::target(path, &storage.options)
}

/// Reports what writing `target` moved (rank 0 only) if `verbose`.
fn published(target: ckpt::storage::Target, storage: &Storage, group: &dyn Collective) -> ckpt::Result<()> {
    if group.rank() != 0 {
        return Ok(());
    }
    let location = target.location().clone();
    if let (true, Some(t)) = (storage.verbose, target.publish()?) {
        eprintln!("published {location}: {t}");
    }
    Ok(())
}

/// After a write with `--overwrite` to a URL is committed: rank 0 removes the objects of what stood there.
fn removed_stale(remote: Option<ckpt::storage::RemoteDestination>, group: &dyn Collective) -> ckpt::Result<()> {
    match remote {
        Some(remote) if group.rank() == 0 => remote.remove_stale(),
        _ => Ok(()),
    }
}

/// The storage options and `--verbose`, as every command uses them.
struct Storage {
    options: ckpt::storage::StorageOptions,
    verbose: bool,
}

/// Resource limits of the readers (README, "Resource limits"): raise them for large input you trust.
#[derive(clap::Args)]
#[command(next_help_heading = "Read limits")]
struct LimitArgs {
    /// Pickle: the deepest nesting of values (default 1000).
    #[arg(long, global = true, value_name = "N")]
    max_depth: Option<usize>,
    /// Pickle: distinct memo entries (default 16777216).
    #[arg(long, global = true, value_name = "N")]
    max_memo: Option<usize>,
    /// Pickle: items in one container, and on the VM stack (default 33554432).
    #[arg(long, global = true, value_name = "N")]
    max_container_len: Option<usize>,
    /// Pickle: objects created, and values in the decoded tree (default 33554432).
    #[arg(long, global = true, value_name = "N")]
    max_nodes: Option<usize>,
    /// Pickle: bytes of strings, bytes and big integers, read and materialised (default 4 GiB).
    #[arg(long, global = true, value_name = "BYTES")]
    max_alloc_bytes: Option<usize>,
    /// Pickle: decimal digits of a protocol-0 integer (default 4300).
    #[arg(long, global = true, value_name = "N")]
    max_int_digits: Option<usize>,
    /// Trusted input: every pickle limit off but the nesting depth (the `--max-*` flags still apply).
    #[arg(long, global = true)]
    trusted: bool,
    /// safetensors: bytes of a file's JSON header, checked before it is parsed (default 100000000).
    #[arg(long, global = true, value_name = "BYTES")]
    max_header_bytes: Option<u64>,
    /// RecIS: bytes of a data file's JSON header (default 100000000).
    #[arg(long, global = true, value_name = "BYTES")]
    max_data_header_bytes: Option<u64>,
    /// distcp: bytes of a `.metadata` file, checked before it is read (default 1 GiB).
    #[arg(long, global = true, value_name = "BYTES")]
    max_metadata_bytes: Option<u64>,
    /// distcp: bytes a zstd-compressed non-tensor item may inflate to (default 1 GiB).
    #[arg(long, global = true, value_name = "BYTES")]
    max_inflated_bytes: Option<u64>,
}

impl LimitArgs {
    /// The limits of every read of this run, the flags given passed by name to the facade's parser
    /// ([`ckpt::named_options::read_limits`]), as the Python package passes its keyword arguments.
    fn read_limits(&self) -> ckpt::Result<ckpt::ReadLimits> {
        let numbers = [
            ("max_depth", self.max_depth.map(|n| n as u64)),
            ("max_memo", self.max_memo.map(|n| n as u64)),
            ("max_container_len", self.max_container_len.map(|n| n as u64)),
            ("max_nodes", self.max_nodes.map(|n| n as u64)),
            ("max_alloc_bytes", self.max_alloc_bytes.map(|n| n as u64)),
            ("max_int_digits", self.max_int_digits.map(|n| n as u64)),
            ("max_header_bytes", self.max_header_bytes),
            ("max_data_header_bytes", self.max_data_header_bytes),
            ("max_metadata_bytes", self.max_metadata_bytes),
            ("max_inflated_bytes", self.max_inflated_bytes),
        ];
        let mut named: Vec<(&str, String)> =
            numbers.iter().filter_map(|(name, n)| n.map(|n| (*name, n.to_string()))).collect();
        if self.trusted {
            named.push(("trusted", "true".into()));
        }
        let named = named.iter().map(|(name, value)| (*name, value.as_str()));
        ckpt::named_options::read_limits(ckpt::named_options::Command::Read, named)
    }
}

/// The processes this run spans: one, or those of an MPI job when started by `mpirun` (feature `mpi`).
enum Launch {
    Single(ckpt::collective::SingleProcess),
    #[cfg(feature = "mpi")]
    Mpi(ckpt::collective::MpiCollective),
}

/// The number of processes an MPI launcher says this job has (OpenMPI, PMI, PMIx variables), if any.
#[cfg(not(feature = "mpi"))]
fn mpi_launch_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"].iter().find_map(|v| std::env::var(v).ok()?.parse().ok())
}

impl Launch {
    #[cfg(feature = "mpi")]
    fn start() -> Result<Launch, String> {
        if !ckpt::collective::launched_by_mpi() {
            return Ok(Launch::Single(ckpt::collective::SingleProcess));
        }
        ckpt::collective::MpiCollective::init().map(Launch::Mpi).map_err(|e| format!("cannot start MPI: {e}"))
    }

    #[cfg(not(feature = "mpi"))]
    fn start() -> Result<Launch, String> {
        match mpi_launch_size() {
            Some(k) if k > 1 => Err(format!(
                "started by mpirun with {k} processes, but this ckpt was built without the `mpi` feature: every \
                 process would do the whole job; rebuild with `--features cli,mpi` (and the format features), or run \
                 it without mpirun"
            )),
            _ => Ok(Launch::Single(ckpt::collective::SingleProcess)),
        }
    }

    fn collective(&self) -> &dyn Collective {
        match self {
            Launch::Single(s) => s,
            #[cfg(feature = "mpi")]
            Launch::Mpi(m) => m,
        }
    }
}
