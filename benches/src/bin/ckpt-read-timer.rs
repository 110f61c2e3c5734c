//! Times ckpt's read and write paths as library calls, for side-by-side runs against the Python originals.
//!
//! Reads commands from stdin, one per line: `<op> <path> [<dst>]`, runs the op once and prints
//! `<op> <seconds> <check> <anon>` (the check is a number derived from what was read, so nothing is optimised
//! away and runs can be compared; `anon` is the peak anonymous memory the op added, in bytes, with `--anon`,
//! else 0). A driver keeps one process alive and interleaves its commands with the reference's (A B A B …),
//! so both sides run warm in the same run. Read ops (`<op> <path>`):
//!
//! - `pt-list`: open a `torch.save` file and list every entry's name, dtype and shape;
//! - `pt-read`: open a `torch.save` file and read every tensor byte;
//! - `dcp-open`: open a DCP checkpoint directory (metadata decoded and validated);
//! - `dcp-read`: open a DCP checkpoint and read every tensor byte (whole tensors, assembled);
//! - `hfai-read`: open an hfai checkpoint directory and read every tensor byte (chunked ones from their parts);
//! - `pbg-read`: read a PyTorch-BigGraph embedding partition (`embeddings_*.h5`) whole;
//! - `recis-read`: open a RecIS checkpoint and read every byte of its `item` table's slots.
//!
//! Write ops (`<op> <src> <dst>`) load `src` once (kept for the next op on the same source, outside the
//! timing, every byte touched) and time one durable save into `dst`:
//!
//! - `pt-save SRC.pt DST.pt`: `ckpt_torch::save`;
//! - `dcp-save SRC.pt DIR`: a one-rank `ckpt_distcp::save`;
//! - `hfai-save SRC.pt DIR`: a 4-part `ckpt_hfai::save` of the state dict as the model;
//! - `pbg-write SRC.h5 DST.h5`: `ckpt_pbg::write_partition_file` of the partition read from `SRC.h5`;
//! - `recis-save IDS DIR`: `ckpt_recis::writer::save_tables` of the `IDS`-id table of [`ckpt_benches::writes::recis_table`].
//!
//! With arguments instead of stdin (`ckpt-read-timer [--anon] <op> <path> [<dst>] [reps]`) it runs one op
//! `reps` times.

#![allow(clippy::print_stdout)]

use std::io::BufRead;
use std::path::Path;
use std::time::{Duration, Instant};

use ckpt_benches::anon::PeakAnon;
use ckpt_benches::{reads, writes};

/// What a write op saves, loaded once.
enum Source {
    State(ckpt_tensor::Value),
    Hfai(Box<ckpt_hfai::SaveState>),
    Partition(Box<ckpt_pbg::EntityPartition>),
    Recis(Box<ckpt_recis::HashTable>),
}

#[derive(Default)]
struct Timer {
    anon: bool,
    /// The last write op's kind and source, and what it loaded.
    source: Option<(String, Source)>,
}

impl Timer {
    fn source(&mut self, op: &str, src: &str) -> Result<&Source, String> {
        let key = format!("{op} {src}");
        if self.source.as_ref().is_none_or(|(k, _)| *k != key) {
            self.source = None; // free the previous source first
            let path = Path::new(src);
            let s = match op {
                "pt-save" | "dcp-save" => Source::State(writes::load_state(path)?),
                "hfai-save" => Source::Hfai(Box::new(writes::hfai_state(&writes::load_state(path)?)?)),
                "pbg-write" => Source::Partition(Box::new(writes::load_partition(path)?)),
                "recis-save" => {
                    let ids = src.parse().map_err(|_| format!("recis-save wants an id count, not {src:?}"))?;
                    Source::Recis(Box::new(writes::recis_table(ids)?))
                }
                other => return Err(format!("unknown op {other:?}")),
            };
            self.source = Some((key, s));
        }
        self.source.as_ref().map(|(_, s)| s).ok_or_else(|| "no source".to_owned())
    }

    /// Runs one op: seconds, check, peak anonymous bytes added.
    fn run(&mut self, op: &str, path: &str, dst: Option<&str>) -> Result<(f64, u64, u64), String> {
        let err = |e: String| format!("{op} {path}: {e}");
        if let Some(dst) = dst {
            let anon = self.anon;
            let source = self.source(op, path).map_err(err)?;
            let dst = Path::new(dst);
            let sampler = anon.then(|| PeakAnon::start(Duration::from_millis(1)));
            let t = Instant::now();
            match source {
                Source::State(v) if op == "pt-save" => writes::pt_save(v, dst),
                Source::State(v) => writes::dcp_save(v, dst),
                Source::Hfai(s) => writes::hfai_save(s, dst),
                Source::Partition(p) => writes::pbg_write(p, dst),
                Source::Recis(t) => writes::recis_save(t, dst),
            }
            .map_err(err)?;
            let secs = t.elapsed().as_secs_f64();
            let peak = sampler.map_or(0, PeakAnon::finish);
            // the replaced files' release runs in the background; let it finish outside the timing
            ckpt_io::wait_for_releases();
            return Ok((secs, 0, peak));
        }
        let p = Path::new(path);
        let sampler = self.anon.then(|| PeakAnon::start(Duration::from_millis(1)));
        let t = Instant::now();
        let check = match op {
            "pt-list" => reads::pt_list(p),
            "pt-read" => reads::pt_read(p),
            "dcp-open" => reads::dcp_open(p),
            "dcp-read" => reads::dcp_read(p),
            "hfai-read" => reads::hfai_read(p),
            "pbg-read" => reads::pbg_read(p),
            "recis-read" => writes::recis_read(p),
            other => return Err(format!("unknown op {other:?}")),
        }
        .map_err(err)?;
        let secs = t.elapsed().as_secs_f64();
        Ok((secs, check, sampler.map_or(0, PeakAnon::finish)))
    }
}

fn main() -> std::process::ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut timer = Timer::default();
    if args.first().is_some_and(|a| a == "--anon") {
        timer.anon = true;
        args.remove(0);
    }
    let mut fail = false;
    let mut one = |op: &str, path: &str, dst: Option<&str>| match timer.run(op, path, dst) {
        Ok((secs, check, anon)) => println!("{op} {secs:.6} {check} {anon}"),
        Err(e) => {
            println!("error {e}");
            fail = true;
        }
    };
    if let [op, path, rest @ ..] = args.as_slice() {
        let is_write = op.contains("-save") || op == "pbg-write";
        let (dst, rest) = match rest {
            [dst, rest @ ..] if is_write => (Some(dst.as_str()), rest),
            _ => (None, rest),
        };
        let reps = rest.first().and_then(|r| r.parse().ok()).unwrap_or(1usize);
        for _ in 0..reps {
            one(op, path, dst);
        }
    } else {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let mut words = line.split_whitespace();
            if let (Some(op), Some(path)) = (words.next(), words.next()) {
                one(op, path, words.next());
            }
        }
    }
    if fail { std::process::ExitCode::FAILURE } else { std::process::ExitCode::SUCCESS }
}
