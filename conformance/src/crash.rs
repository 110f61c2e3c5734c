//! A crash-test harness for writers: run a save in a child process, kill it at every failpoint of the
//! commit protocol (`CKPT_FAILPOINT`, see `ckpt_core::commit::failpoint`) or at a random instant, and check
//! that the destination holds the old checkpoint or the new one, whole.
//!
//! The child is `crash_child` (this crate's binary): `crash_child FORMAT DST GENERATION [MIB]` saves
//! generation `GENERATION` of a deterministic checkpoint in `FORMAT` to `DST`. Generations differ in every
//! tensor byte, so a destination that mixes files or records of two saves is caught by [`read_generation`],
//! which says which generation a destination holds, `None` when there is none, or why it is neither.
//!
//! Adding a format: an arm in [`save`] and one in [`read_generation`]; [`Matrix::run`] does the rest.

use std::collections::HashMap;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use ckpt_core::{Buffer, DType, Tensor, Value};

/// The formats the harness knows.
pub const FORMATS: &[&str] = &["torch", "safetensors", "distcp"];

/// Deterministic pseudo-random bytes for `(generation, index)` (xorshift64, 8 bytes a step).
fn pattern(generation: u32, index: usize, n: usize) -> Vec<u8> {
    let mut x = u64::from(generation).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (index as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut v = vec![0u8; n];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
    v
}

fn tensor(generation: u32, index: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product::<usize>() * 4;
    Tensor::from_buffer(DType::F32, shape, Buffer::copy_from(&pattern(generation, index, n)).unwrap()).unwrap()
}

/// The tensors of generation `generation`: a big one of about `mib` MiB (`rows` × 1024 floats), a
/// small one, in name order.
pub fn tensors(generation: u32, mib: usize) -> Vec<(String, Tensor)> {
    let rows = (mib << 20) / 4096;
    vec![("big".into(), tensor(generation, 0, &[rows.max(2), 1024])), ("small".into(), tensor(generation, 1, &[7, 3]))]
}

/// Generation `generation` as a state dict (with the step as a non-tensor value).
pub fn state_dict(generation: u32, mib: usize) -> Value {
    let mut items: Vec<(&str, Value)> = Vec::new();
    let t = tensors(generation, mib);
    items.push(("big", Value::Tensor(t[0].1.clone())));
    items.push(("small", Value::Tensor(t[1].1.clone())));
    items.push(("step", Value::Int(i64::from(generation))));
    Value::dict(items)
}

/// Saves generation `generation` of the checkpoint in `format` to `dst` (what `crash_child` runs).
///
/// # Errors
/// The save's error, as text.
pub fn save(format: &str, dst: &Path, generation: u32, mib: usize) -> Result<(), String> {
    match format {
        "torch" => ckpt_torch::save(&state_dict(generation, mib), dst, &ckpt_torch::WriteOptions::default())
            .map_err(|e| e.to_string()),
        "safetensors" => {
            ckpt_core::safetensors::write_file(&tensors(generation, mib), None, dst).map_err(|e| e.to_string())
        }
        "distcp" => {
            // Two ranks (threads), the big tensor row-sharded, two data files per rank.
            let sd = state_dict(generation, mib);
            let big = sd.as_dict().and_then(|d| d.get("big")).and_then(Value::as_tensor).cloned().ok_or("no big")?;
            let rows = big.shape()[0];
            let ranks: Vec<(Value, HashMap<String, ckpt_distcp::ShardSpec>)> = (0..2)
                .map(|r| {
                    let (off, len) = ckpt_distcp::shard_box(big.shape(), 0, r, 2);
                    let local = big.narrow(0, off[0], len[0]).unwrap();
                    let small = sd.as_dict().and_then(|d| d.get("small")).cloned().unwrap_or(Value::None);
                    let rank_sd = Value::dict([
                        ("big", Value::Tensor(local)),
                        ("small", small),
                        ("step", Value::Int(i64::from(generation))),
                    ]);
                    let spec = ckpt_distcp::ShardSpec::new(&[rows, 1024], &off);
                    (rank_sd, HashMap::from([("big".to_string(), spec)]))
                })
                .collect();
            let options = ckpt_distcp::WriteOptions::default().with_thread_count(2);
            ckpt_distcp::save_ranks(&ranks, dst, &options).map(|_| ()).map_err(|e| e.to_string())
        }
        other => Err(format!("unknown format {other}")),
    }
}

/// Which generation `dst` holds (`None`: no destination), or why it holds neither a whole generation
/// nor nothing.
///
/// # Errors
/// A description of what is wrong: unreadable, a mix of generations, a checksum mismatch.
pub fn read_generation(format: &str, dst: &Path, mib: usize, candidates: &[u32]) -> Result<Option<u32>, String> {
    if fs::symlink_metadata(dst).is_err() {
        return Ok(None);
    }
    let found = match format {
        "torch" => {
            let v = ckpt_torch::load(dst).map_err(|e| format!("unreadable: {e}"))?;
            candidates.iter().copied().find(|&g| v == state_dict(g, mib))
        }
        "safetensors" => {
            let f = ckpt_core::safetensors::read_file(dst).map_err(|e| format!("unreadable: {e}"))?;
            candidates
                .iter()
                .copied()
                .find(|&g| tensors(g, mib).iter().all(|(n, t)| f.get(n) == Some(t)) && f.tensors.len() == 2)
        }
        "distcp" => {
            let r = ckpt_distcp::DcpReader::open(dst).map_err(|e| format!("unreadable: {e}"))?;
            let v = r.state_dict().map_err(|e| format!("unreadable: {e}"))?;
            let sums =
                ckpt_core::commit::Manifest::read(dst).map_err(|e| e.to_string())?.ok_or("no checksum manifest")?;
            let bad = sums.verify_dir(dst).map_err(|e| e.to_string())?;
            if let Some(b) = bad.first() {
                return Err(format!("checksum manifest: {b}"));
            }
            let mut names: Vec<String> = fs::read_dir(dst)
                .map_err(|e| e.to_string())?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            names.sort();
            let expected =
                [".metadata", "__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp", "ckpt.checksums.json"];
            if names != expected {
                return Err(format!("files {names:?}"));
            }
            candidates.iter().copied().find(|&g| v == state_dict(g, mib))
        }
        other => return Err(format!("unknown format {other}")),
    };
    found.map(Some).ok_or_else(|| "a readable checkpoint of no generation (a mix)".into())
}

/// Entries beside `dst` in its directory (leftovers of a crashed save, once `dst` itself is excluded).
pub fn leftovers(dst: &Path) -> Vec<String> {
    let parent = dst.parent().unwrap_or(Path::new("."));
    let name = dst.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut v: Vec<String> = fs::read_dir(parent)
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| *n != name).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// How a child save ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Killed by a signal (the failpoint's `SIGKILL`, or the harness's).
    Killed,
    /// Exited with this code (0: the save finished before the kill).
    Exited(i32),
}

fn ended(status: ExitStatus) -> Ended {
    match status.signal() {
        Some(_) => Ended::Killed,
        None => Ended::Exited(status.code().unwrap_or(-1)),
    }
}

/// One row of the crash matrix.
#[derive(Debug, Clone)]
pub struct Row {
    /// The format.
    pub format: String,
    /// `new` (no previous checkpoint) or `overwrite`.
    pub mode: &'static str,
    /// The kill: `#N name` for the N-th failpoint hit, `t=…ms` for a timed kill.
    pub kill: String,
    /// How the child ended.
    pub ended: Ended,
    /// The generation found after the crash (`None`: no destination).
    pub found: Option<u32>,
    /// Whether the next save succeeded and left no leftovers.
    pub cleaned: bool,
}

/// The crash matrix of one format: every failpoint and some timed kills, into a new destination and over
/// an existing checkpoint (generation 1), the interrupted save writing generation 2.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// The `crash_child` binary.
    pub child: PathBuf,
    /// The format.
    pub format: String,
    /// Payload size of the big tensor in MiB.
    pub mib: usize,
    /// Timed kills per mode, spread over the save's duration.
    pub timed_kills: usize,
    /// Extra environment for the child (e.g. `CKPT_COMMIT_NO_EXCHANGE=1`).
    pub env: Vec<(String, String)>,
}

impl Matrix {
    fn command(&self, dst: &Path, generation: u32) -> Command {
        let mut c = Command::new(&self.child);
        c.arg(&self.format).arg(dst).arg(generation.to_string()).arg(self.mib.to_string());
        c.env_remove("CKPT_FAILPOINT").env_remove("CKPT_FAILPOINT_LOG").env_remove("CKPT_FAILPOINT_ACTION");
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Runs an uninterrupted save and returns the failpoints it passes, in order, and its duration.
    ///
    /// # Panics
    /// If the child cannot run or fails.
    pub fn points(&self, scratch: &Path, overwrite: bool) -> (Vec<String>, Duration) {
        let dst = scratch.join("dst");
        let _ = fs::remove_dir_all(scratch);
        fs::create_dir_all(scratch).unwrap();
        if overwrite {
            save(&self.format, &dst, 1, self.mib).unwrap();
        }
        let log = scratch.join("points.log");
        let t = Instant::now();
        let status = self.command(&dst, 2).env("CKPT_FAILPOINT_LOG", &log).status().unwrap();
        let took = t.elapsed();
        assert!(status.success(), "{}: uninterrupted save failed: {status}", self.format);
        let points = fs::read_to_string(&log).unwrap().lines().map(str::to_owned).collect();
        (points, took)
    }

    /// Runs the whole matrix in `scratch` and returns its rows. Each row's check is done here; the
    /// caller asserts on the rows (and prints them).
    ///
    /// # Panics
    /// If a child cannot be started.
    pub fn run(&self, scratch: &Path, seed: u64) -> Vec<Row> {
        let mut rows = Vec::new();
        let mut rng = seed | 1;
        for overwrite in [false, true] {
            let mode = if overwrite { "overwrite" } else { "new" };
            let (points, took) = self.points(scratch, overwrite);
            let mut kills: Vec<(String, Option<u64>, Option<Duration>)> =
                points.iter().enumerate().map(|(i, p)| (format!("#{} {p}", i + 1), Some(i as u64 + 1), None)).collect();
            for _ in 0..self.timed_kills {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let at = Duration::from_micros(rng % (took.as_micros() as u64).max(1));
                kills.push((format!("t={}ms", at.as_millis()), None, Some(at)));
            }
            for (kill, n, at) in kills {
                let dst = scratch.join("dst");
                let _ = fs::remove_dir_all(scratch);
                fs::create_dir_all(scratch).unwrap();
                if overwrite {
                    save(&self.format, &dst, 1, self.mib).unwrap();
                }
                let mut cmd = self.command(&dst, 2);
                if let Some(n) = n {
                    cmd.env("CKPT_FAILPOINT", n.to_string());
                }
                let mut child = cmd.spawn().unwrap();
                if let Some(at) = at {
                    std::thread::sleep(at);
                    let _ = child.kill();
                }
                let status = ended(child.wait().unwrap());
                let found = read_generation(&self.format, &dst, self.mib, &[1, 2]);
                let (found, ok) = match found {
                    Ok(g) => (g, true),
                    Err(why) => {
                        eprintln!("{} {mode} {kill}: {why}", self.format);
                        (None, false)
                    }
                };
                // The next save cleans what the crashed one left, and readers never needed it to.
                let next = save(&self.format, &dst, 3, self.mib);
                let cleaned = ok
                    && next.is_ok()
                    && leftovers(&dst).is_empty()
                    && read_generation(&self.format, &dst, self.mib, &[3]) == Ok(Some(3));
                if !cleaned {
                    eprintln!("{} {mode} {kill}: next save {next:?}, leftovers {:?}", self.format, leftovers(&dst));
                }
                rows.push(Row { format: self.format.clone(), mode, kill, ended: status, found, cleaned });
            }
        }
        let _ = fs::remove_dir_all(scratch);
        rows
    }
}

/// Whether a row is acceptable: the destination holds the old generation (1, or nothing for a new
/// destination) or the new one (2), and the next save cleaned up.
pub fn row_ok(row: &Row) -> bool {
    let old = if row.mode == "overwrite" { Some(1) } else { None };
    let whole = row.found == old || row.found == Some(2);
    // A save that ran to the end must have committed.
    let finished_right = row.ended != Ended::Exited(0) || row.found == Some(2);
    whole && finished_right && row.cleaned
}
