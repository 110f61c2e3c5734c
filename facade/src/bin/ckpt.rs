//! The `ckpt` command: inspect, print and check PyTorch training checkpoints.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use ckpt::{Checkpoint, EntryKind};
use clap::{Parser, Subcommand};

/// Read, inspect and convert PyTorch training checkpoints without Python.
#[derive(Parser)]
#[command(name = "ckpt", version, about, long_about = None, after_help = "Examples:\n  ckpt inspect model.pt\n  ckpt inspect model.pt --json\n  ckpt cat model.pt layer.weight --limit 8")]
struct Cli {
    /// Print nothing but results and errors.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every entry of a checkpoint: name, dtype, shape and size, with totals.
    #[command(
        after_help = "Examples:\n  ckpt inspect model.pt\n  ckpt inspect checkpoint_dir --json | jq '.entries[].name'"
    )]
    Inspect {
        /// A checkpoint file or directory.
        path: PathBuf,
        /// Print JSON: {"format", "details", "entries": [{"name", "dtype", "shape", "nbytes"}], "totals"}.
        #[arg(long)]
        json: bool,
    },
    /// Print a tensor's values, numpy-style.
    #[command(after_help = "Examples:\n  ckpt cat model.pt fc.weight\n  ckpt cat model.pt fc.weight --limit 4")]
    Cat {
        /// A checkpoint file or directory.
        path: PathBuf,
        /// The entry name, as `ckpt inspect` lists it.
        name: String,
        /// Show at most this many values per dimension edge (numpy's edgeitems); 0 shows everything.
        #[arg(long, default_value_t = 3)]
        limit: usize,
    },
}

/// Exit codes: 0 success, 1 a check failed, 2 usage error (clap), 3 bad input, 4 I/O error.
const EXIT_BAD_INPUT: u8 = 3;
const EXIT_IO: u8 = 4;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Inspect { path, json } => ckpt::open(path).and_then(|c| inspect(&c, *json)),
        Command::Cat { path, name, limit } => ckpt::open(path).and_then(|c| cat(&c, name, *limit)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `ckpt inspect x --json | head`: the reader went away; that is not an error.
        Err(ckpt::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = format!("error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                let text = s.to_string();
                if !msg.contains(&text) {
                    msg.push_str(&format!("\n  caused by: {text}"));
                }
                source = s.source();
            }
            eprintln!("{msg}");
            ExitCode::from(exit_code(&e))
        }
    }
}

fn exit_code(e: &ckpt::Error) -> u8 {
    match e {
        ckpt::Error::Io { .. } => EXIT_IO,
        ckpt::Error::Torch(t) if matches!(t.kind(), ckpt::torch::Error::Io { .. }) => EXIT_IO,
        ckpt::Error::Torch(ckpt::torch::Error::Io { .. }) => EXIT_IO,
        _ => EXIT_BAD_INPUT,
    }
}

fn human_bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

fn inspect(c: &Checkpoint, json: bool) -> ckpt::Result<()> {
    let entries = c.entries();
    let details = c.reader().details();
    let (mut tensors, mut bytes, mut values, mut opaque) = (0usize, 0usize, 0usize, 0usize);
    for e in &entries {
        match &e.kind {
            EntryKind::Tensor(t) => {
                tensors += 1;
                bytes += t.nbytes();
            }
            EntryKind::OpaqueTensor(_) => opaque += 1,
            _ => values += 1,
        }
    }
    let mut out = std::io::stdout().lock();
    let io = |e| ckpt::Error::Io { path: "<stdout>".into(), source: e };
    if json {
        let entries_json: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| match &e.kind {
                EntryKind::Tensor(t) => serde_json::json!({
                    "name": e.name, "kind": "tensor", "dtype": t.dtype.torch_name(), "shape": t.shape, "nbytes": t.nbytes(),
                }),
                EntryKind::OpaqueTensor(k) => serde_json::json!({
                    "name": e.name, "kind": "opaque_tensor", "opaque": format!("{k:?}").to_lowercase(),
                    "dtype": null, "shape": null, "nbytes": null,
                }),
                _ => {
                    let ty = c.value(&e.name).map(|v| v.type_name()).unwrap_or("value");
                    serde_json::json!({"name": e.name, "kind": "value", "type": ty, "dtype": null, "shape": null, "nbytes": null})
                }
            })
            .collect();
        let details: serde_json::Map<String, serde_json::Value> =
            details.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
        let doc = serde_json::json!({
            "format": c.format().name(),
            "path": c.path().display().to_string(),
            "details": details,
            "entries": entries_json,
            "totals": {"tensors": tensors, "nbytes": bytes, "values": values, "opaque_tensors": opaque},
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc).unwrap_or_default()).map_err(io)?;
        return Ok(());
    }
    let detail_text: Vec<String> = details.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    writeln!(out, "{} checkpoint {} ({})", c.format(), c.path().display(), detail_text.join(", ")).map_err(io)?;
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|e| match &e.kind {
            EntryKind::Tensor(t) => {
                [e.name.clone(), t.dtype.torch_name().to_owned(), format!("{:?}", t.shape), human_bytes(t.nbytes())]
            }
            EntryKind::OpaqueTensor(k) => {
                [e.name.clone(), format!("{k:?} tensor").to_lowercase(), "-".into(), "-".into()]
            }
            _ => {
                let ty = c.value(&e.name).map(|v| v.type_name()).unwrap_or("value");
                [e.name.clone(), ty.to_owned(), "-".into(), "-".into()]
            }
        })
        .collect();
    let header = ["NAME".to_owned(), "DTYPE".into(), "SHAPE".into(), "SIZE".into()];
    let mut widths = [0usize; 4];
    for r in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for r in std::iter::once(&header).chain(&rows) {
        writeln!(
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
    }
    let plural = |n: usize, word: &str| if n == 1 { format!("{n} {word}") } else { format!("{n} {word}s") };
    let opaque_text = if opaque > 0 { format!("; {}", plural(opaque, "opaque tensor")) } else { String::new() };
    writeln!(
        out,
        "{}, {}; {}{opaque_text}",
        plural(tensors, "tensor"),
        human_bytes(bytes),
        plural(values, "other value")
    )
    .map_err(io)?;
    Ok(())
}

fn cat(c: &Checkpoint, name: &str, limit: usize) -> ckpt::Result<()> {
    let t = c.tensor(name)?;
    let text = ckpt::core::format_tensor(&t, limit);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").map_err(|e| ckpt::Error::Io { path: "<stdout>".into(), source: e })
}
