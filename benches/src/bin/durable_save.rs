//! Interleaved side-by-side timing of durable `.pt` saves (issue 15): in one run, on one file system,
//! repetition after repetition (A B C … A B C …), it times
//!
//! - `raw_fsync`: `write(2)` of the same bytes in 8 MiB chunks into a fresh file + `fsync`;
//! - `raw_trunc_fsync`: the same over the previous output (`O_TRUNC`, which frees the old blocks inline);
//! - `ckpt_durable`: `ckpt_torch::save` (lock, temporary file, `O_DIRECT` pipeline, `fdatasync`, rename,
//!   directory fsync);
//! - `raw`, `ckpt_nosync`: the raw write and `ckpt_torch::save_to_writer` into a fresh plain file (through
//!   a 1 MiB `BufWriter`), no fsync;
//! - `torch_fsync`, `torch`: `torch.save` (+ `flush` + `os.fsync`) through `.venv/bin/python`;
//! - the same for 20,000 small tensors (`small_*`);
//! - `dcp_durable` / `dcp_nosums`: a one-rank DCP save of the same state dict with and without the
//!   `ckpt.checksums.json` manifest (its cost, issue 12: under 5% of the save).
//!
//! and prints medians, min–max and the ratios issue 15 sets targets for. Every measurement starts after a
//! `sync(2)` and after the previous save's background release finished, so none pays for another.
//!
//! ```sh
//! cargo build --release -p ckpt-benches --bin durable_save
//! nice -n 19 target/release/durable_save --dir /tmp/commit/bench --reps 5 --mib 1024
//! ```
//!
//! Options: `--dir D` (scratch, removed at the end), `--reps N` (≥ 5 recommended), `--mib M` (payload of
//! 64 tensors), `--small N` (count of 10 KiB tensors), `--python P` (default `.venv/bin/python`;
//! `--python none` skips torch), `--only a,b` (workload names).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use ckpt_tensor::{Buffer, DType, Dict, DictKind, Tensor, Value};

const BIG_TENSORS: usize = 64;
const SMALL_BYTES: usize = 10 << 10;

struct Args {
    dir: PathBuf,
    reps: usize,
    mib: usize,
    small: usize,
    python: Option<PathBuf>,
    only: Option<Vec<String>>,
}

fn args() -> Args {
    let mut a = Args {
        dir: PathBuf::from("/tmp/commit/bench"),
        reps: 5,
        mib: 1024,
        small: 20_000,
        python: Some(PathBuf::from(".venv/bin/python")),
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_default();
        match k.as_str() {
            "--dir" => a.dir = v.into(),
            "--reps" => a.reps = v.parse().expect("--reps N"),
            "--mib" => a.mib = v.parse().expect("--mib M"),
            "--small" => a.small = v.parse().expect("--small N"),
            "--python" => a.python = (v != "none").then(|| v.into()),
            "--only" => a.only = Some(v.split(',').map(str::to_owned).collect()),
            other => panic!("unknown option {other}"),
        }
    }
    a
}

/// Pseudo-random bytes (xorshift64), so no layer can special-case zeros.
fn payload(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
    v
}

fn state_dict(bytes: &[u8], count: usize, each: usize) -> Value {
    let mut sd = Dict::new(DictKind::Dict);
    for i in 0..count {
        let chunk = &bytes[i * each..(i + 1) * each];
        let t = Tensor::from_buffer(DType::F32, &[each / 4], Buffer::copy_from(chunk).unwrap()).unwrap();
        let name = if count == BIG_TENSORS { format!("layer.{i}.weight") } else { format!("param.{i}") };
        sd.insert(name, Value::Tensor(t));
    }
    Value::Dict(sd)
}

struct Python {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Python {
    fn start(python: &Path, payload: &Path, small: usize) -> Option<Python> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/durable_worker.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(payload)
            .arg(BIG_TENSORS.to_string())
            .arg(small.to_string())
            .arg(SMALL_BYTES.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let stdin = child.stdin.take()?;
        let mut stdout = BufReader::new(child.stdout.take()?);
        let mut line = String::new();
        stdout.read_line(&mut line).ok()?;
        (line.trim() == "ready").then_some(Python { child, stdin, stdout })
    }

    fn time(&mut self, cmd: &str, path: &Path) -> f64 {
        writeln!(self.stdin, "{cmd} {}", path.display()).unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().parse().unwrap_or_else(|_| panic!("python answered {line:?}"))
    }
}

impl Drop for Python {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.wait();
    }
}

fn raw_write(path: &Path, bytes: &[u8], fsync: bool, fresh: bool) -> f64 {
    if fresh {
        let _ = fs::remove_file(path);
        // SAFETY: sync(2) has no arguments; it makes the removal's cost land outside the timing.
        unsafe { libc::sync() };
    }
    let t = Instant::now();
    let mut f = File::create(path).unwrap();
    for c in bytes.chunks(8 << 20) {
        f.write_all(c).unwrap();
    }
    if fsync {
        f.sync_all().unwrap();
    }
    t.elapsed().as_secs_f64()
}

fn ckpt_nosync(sd: &Value, path: &Path) -> f64 {
    // Like `raw`: a fresh file, the old one's removal outside the timing.
    let _ = fs::remove_file(path);
    // SAFETY: sync(2) has no arguments.
    unsafe { libc::sync() };
    let t = Instant::now();
    let f = BufWriter::with_capacity(1 << 20, File::create(path).unwrap());
    let f = ckpt_torch::save_to_writer(sd, f, "archive", &ckpt_torch::WriteOptions::default()).unwrap();
    f.into_inner().map_err(|e| e.into_error()).unwrap();
    t.elapsed().as_secs_f64()
}

fn ckpt_durable(sd: &Value, path: &Path) -> f64 {
    let t = Instant::now();
    ckpt_torch::save(sd, path, &ckpt_torch::WriteOptions::default()).unwrap();
    let s = t.elapsed().as_secs_f64();
    ckpt_io::wait_for_releases();
    s
}

fn dcp(sd: &Value, dir: &Path, checksums: bool) -> f64 {
    let options = ckpt_distcp::WriteOptions::default()
        .with_durability(ckpt_distcp::Durability::default().with_checksums(checksums));
    let t = Instant::now();
    ckpt_distcp::save(sd, dir, &options).unwrap();
    let s = t.elapsed().as_secs_f64();
    ckpt_io::wait_for_releases();
    s
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 }
}

fn main() {
    let a = args();
    fs::create_dir_all(&a.dir).unwrap();
    let big_bytes = a.mib << 20;
    let small_total = a.small * SMALL_BYTES;
    let bytes = payload(big_bytes.max(small_total));
    let big = state_dict(&bytes, BIG_TENSORS, big_bytes / BIG_TENSORS);
    let small = state_dict(&bytes, a.small, SMALL_BYTES);
    let payload_path = a.dir.join("payload.bin");
    let python = a.python.as_ref().and_then(|py| {
        fs::write(&payload_path, &bytes).unwrap();
        let p = Python::start(py, &payload_path, a.small);
        if p.is_none() {
            eprintln!("python worker did not start ({}); torch rows are skipped", py.display());
        }
        p
    });
    let _ = fs::remove_file(&payload_path);
    let py = std::cell::RefCell::new(python);
    let big_bytes_slice = &bytes[..big_bytes];
    let d = &a.dir;
    type Run<'a> = Box<dyn FnMut() -> f64 + 'a>;
    let mut runs: Vec<(&str, u64, Run<'_>)> = vec![
        ("raw_fsync", big_bytes as u64, Box::new(|| raw_write(&d.join("raw_fresh.bin"), big_bytes_slice, true, true))),
        ("raw_trunc_fsync", big_bytes as u64, Box::new(|| raw_write(&d.join("raw.bin"), big_bytes_slice, true, false))),
        ("ckpt_durable", big_bytes as u64, Box::new(|| ckpt_durable(&big, &d.join("ckpt.pt")))),
        ("raw", big_bytes as u64, Box::new(|| raw_write(&d.join("raw_ns.bin"), big_bytes_slice, false, true))),
        ("ckpt_nosync", big_bytes as u64, Box::new(|| ckpt_nosync(&big, &d.join("ckpt_ns.pt")))),
        ("dcp_durable", big_bytes as u64, Box::new(|| dcp(&big, &d.join("dcp"), true))),
        ("dcp_nosums", big_bytes as u64, Box::new(|| dcp(&big, &d.join("dcp_nosums"), false))),
        ("small_ckpt_durable", small_total as u64, Box::new(|| ckpt_durable(&small, &d.join("small.pt")))),
        ("small_ckpt_nosync", small_total as u64, Box::new(|| ckpt_nosync(&small, &d.join("small_ns.pt")))),
    ];
    if py.borrow().is_some() {
        for (name, cmd, file, n) in [
            ("torch_fsync", "big_fsync", "torch.pt", big_bytes),
            ("torch", "big", "torch_ns.pt", big_bytes),
            ("small_torch_fsync", "small_fsync", "small_torch.pt", small_total),
            ("small_torch", "small", "small_torch_ns.pt", small_total),
        ] {
            let py = &py;
            let path = d.join(file);
            runs.push((
                name,
                n as u64,
                Box::new(move || py.borrow_mut().as_mut().map_or(f64::NAN, |p| p.time(cmd, &path))),
            ));
        }
    }
    if let Some(only) = &a.only {
        runs.retain(|(n, _, _)| only.iter().any(|o| o == n));
    }
    let mut results: BTreeMap<&str, (u64, Vec<f64>)> = BTreeMap::new();
    for rep in 0..a.reps {
        for (name, n, run) in &mut runs {
            // SAFETY: sync(2) has no arguments: earlier writes' writeback does not land in this timing.
            unsafe { libc::sync() };
            let s = run();
            eprintln!("rep {rep} {name:20} {s:8.3} s");
            results.entry(name).or_insert((*n, Vec::new())).1.push(s);
        }
    }
    drop(runs);
    drop(py);
    println!("\n| workload | median s | min–max s | GB/s (median) |");
    println!("|---|---|---|---|");
    for (name, (n, v)) in &results {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        let m = median(v);
        println!("| {name} | {m:.3} | {min:.3}–{max:.3} | {:.2} |", *n as f64 / m / 1e9);
    }
    let m = |k: &str| results.get(k).map_or(f64::NAN, |(_, v)| median(v));
    println!("\n| ratio (speed, higher is better) | value | target |");
    println!("|---|---|---|");
    for (what, num, den, target) in [
        ("durable .pt / raw write + fsync (fresh file)", "raw_fsync", "ckpt_durable", "≥ 0.8"),
        ("durable .pt / raw write + fsync (over the old file)", "raw_trunc_fsync", "ckpt_durable", "≥ 0.8"),
        ("durable .pt / torch.save + fsync", "torch_fsync", "ckpt_durable", "≥ 1.5"),
        (".pt without fsync / raw write", "raw", "ckpt_nosync", "≥ 0.9"),
        (".pt without fsync / torch.save", "torch", "ckpt_nosync", ""),
        ("20k small: .pt write / torch.save", "small_torch", "small_ckpt_nosync", "≥ 4"),
        ("20k small: durable / torch.save + fsync", "small_torch_fsync", "small_ckpt_durable", ""),
        ("DCP save with checksums / without", "dcp_nosums", "dcp_durable", "≥ 0.95"),
        ("DCP save / raw write + fsync (fresh file)", "raw_fsync", "dcp_durable", "≥ 0.8"),
    ] {
        println!("| {what} | {:.2} | {target} |", m(num) / m(den));
    }
    let _ = fs::remove_dir_all(&a.dir);
}
