//! Times ckpt's read paths as library calls, for side-by-side runs against the Python originals.
//!
//! Reads commands from stdin, one per line: `<op> <path>`, runs the op once and prints
//! `<op> <seconds> <check>` (the check is a number derived from what was read, so nothing is optimised
//! away and runs can be compared). A driver keeps one process alive and interleaves its commands with the
//! reference's (A B A B …), so both sides run warm in the same run. Ops:
//!
//! - `pt-list`: open a `torch.save` file and list every entry's name, dtype and shape;
//! - `pt-read`: open a `torch.save` file and read every tensor byte;
//! - `dcp-open`: open a DCP checkpoint directory (metadata decoded and validated);
//! - `dcp-read`: open a DCP checkpoint and read every tensor byte (whole tensors, assembled);
//! - `hfai-read`: open an hfai checkpoint directory and read every tensor byte;
//! - `pbg-read`: read a PyTorch-BigGraph embedding partition (`embeddings_*.h5`) whole.
//!
//! With arguments instead of stdin (`ckpt-read-timer <op> <path> [reps]`) it runs one op `reps` times.

#![allow(clippy::print_stdout)]

use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use ckpt_benches::reads;

fn run(op: &str, path: &Path) -> Result<(f64, u64), String> {
    let t = Instant::now();
    let check = match op {
        "pt-list" => reads::pt_list(path),
        "pt-read" => reads::pt_read(path),
        "dcp-open" => reads::dcp_open(path),
        "dcp-read" => reads::dcp_read(path),
        "hfai-read" => reads::hfai_read(path),
        "pbg-read" => reads::pbg_read(path),
        other => return Err(format!("unknown op {other:?}")),
    }
    .map_err(|e| format!("{op} {}: {e}", path.display()))?;
    Ok((t.elapsed().as_secs_f64(), check))
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut fail = false;
    let mut one = |op: &str, path: &str| match run(op, Path::new(path)) {
        Ok((secs, check)) => println!("{op} {secs:.6} {check}"),
        Err(e) => {
            println!("error {e}");
            fail = true;
        }
    };
    if let [op, path, rest @ ..] = args.as_slice() {
        let reps = rest.first().and_then(|r| r.parse().ok()).unwrap_or(1usize);
        for _ in 0..reps {
            one(op, path);
        }
    } else {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if let Some((op, path)) = line.trim().split_once(' ') {
                one(op, path);
            }
        }
    }
    if fail { std::process::ExitCode::FAILURE } else { std::process::ExitCode::SUCCESS }
}
