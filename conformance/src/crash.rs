//! A crash-test harness for writers: run a save in a child process, kill it at every failpoint of the
//! commit protocol (`CKPT_FAILPOINT`, see `ckpt_io::failpoint`) or at a random instant, and check
//! that the destination holds the old checkpoint or the new one, whole.
//!
//! The child is `crash_child` (this crate's binary): `crash_child FORMAT DST GENERATION [MIB]` saves
//! generation `GENERATION` of a deterministic checkpoint in `FORMAT` to `DST`. Generations differ in every
//! tensor byte, so a destination that mixes files or records of two saves is caught by [`read_generation`],
//! which says which generation a destination holds, `None` when there is none, or why it is neither.
//!
//! Adding a format: an arm in [`save`] and one in [`read_generation`]; [`Matrix::run`] does the rest.
//!
//! The kills of a matrix are independent (each in a scratch directory of its own) and run
//! [`concurrently`]: most of a kill's time is the children's fsyncs and process start-up, not CPU.

use std::collections::HashMap;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use ckpt_tensor::{Buffer, CheckpointRead, DType, Tensor, Value};

/// The formats the harness knows.
pub const FORMATS: &[&str] = &["torch", "safetensors", "distcp", "hfai", "recis", "pbg"];

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

/// The tensor `index` of generation `generation`. Made once per process and shape, then shared (a test
/// compares a checkpoint against the same generations many times; the buffer is reference-counted).
fn tensor(generation: u32, index: usize, shape: &[usize]) -> Tensor {
    type Made = Mutex<HashMap<(u32, usize, Vec<usize>), Tensor>>;
    static MADE: OnceLock<Made> = OnceLock::new();
    let made = MADE.get_or_init(Made::default);
    let key = (generation, index, shape.to_vec());
    if let Some(t) = made.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
        return t.clone();
    }
    let n: usize = shape.iter().product::<usize>() * 4;
    let t = Tensor::from_buffer(DType::F32, shape, Buffer::copy_from(&pattern(generation, index, n)).unwrap()).unwrap();
    made.lock().unwrap_or_else(PoisonError::into_inner).insert(key, t.clone());
    t
}

/// How many cases [`concurrently`] runs at once: `CKPT_CRASH_JOBS`, else the number of CPUs.
pub fn jobs() -> usize {
    std::env::var("CKPT_CRASH_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// Runs `case(0)`, ..., `case(n - 1)` on at most [`jobs`] threads and returns their results in that order.
/// A case that panics fails the whole run with its own panic (message and all), once the others are done.
///
/// # Panics
/// When a case panics.
pub fn concurrently<T: Send>(n: usize, case: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let done: Vec<(usize, T)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs().min(n))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return mine;
                        }
                        mine.push((i, case(i)));
                    }
                })
            })
            .collect();
        let mut done = Vec::with_capacity(n);
        let mut panicked = None;
        for w in workers {
            match w.join() {
                Ok(mine) => done.extend(mine),
                Err(payload) => panicked = panicked.or(Some(payload)),
            }
        }
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
        done
    });
    let mut done = done;
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, t)| t).collect()
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
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "safetensors" => ckpt_safetensors::write_file(&tensors(generation, mib), None, dst).map_err(|e| e.to_string()),
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
        "hfai" => {
            // Two parts; the big tensor chunked over both (hfai's `torch.chunk` of large tensors).
            let top =
                Value::dict([("model", state_dict(generation, mib)), ("step", Value::Int(i64::from(generation)))]);
            let (state, _) = ckpt_hfai::SaveState::from_state_dict(top.as_dict().ok_or("no dict")?);
            let options = ckpt_hfai::WriteOptions::default().with_world_size(2).with_large_size(1 << 20);
            ckpt_hfai::save(&state, dst, &options).map(|_| ()).map_err(|e| e.to_string())
        }
        "recis" => {
            // A hash table (ids and the big embedding) over two shards, two data files each, and a dense
            // tensor in `model.pt`.
            let t = tensors(generation, mib);
            let rows = t[0].1.shape()[0];
            let ids: Vec<i64> = (0..rows as i64).collect();
            let sd = Value::dict([
                ("tbl@id", Value::Tensor(Tensor::from_slice(&ids, &[rows]).map_err(|e| e.to_string())?)),
                ("tbl@embedding", Value::Tensor(t[0].1.clone())),
                ("small", Value::Tensor(t[1].1.clone())),
            ]);
            let options = ckpt_recis::WriteOptions::default().with_world_size(2).with_parallel(2);
            ckpt_recis::save(&sd, dst, &options).map(|_| ()).map_err(|e| e.to_string())
        }
        "pbg" => {
            // A new directory: `ckpt_pbg::save` (staged and swapped in whole); an existing checkpoint: a PBG
            // commit of the next version (the version file is the commit point).
            let storage = ckpt_pbg::FileCheckpointStorage::new(dst);
            if storage.version_file().exists() {
                let mut commit = storage.begin_commit().map_err(|e| e.to_string())?;
                for (entity, t) in pbg_partitions(generation, mib) {
                    commit.partition(entity, 0, ckpt_pbg::EntityPartition::new(t)).map_err(|e| e.to_string())?;
                }
                commit.finish(&ckpt_pbg::WriteOptions::default()).map(|_| ()).map_err(|e| e.to_string())
            } else {
                let mut entries: Vec<(String, Value)> = pbg_partitions(generation, mib)
                    .into_iter()
                    .map(|(e, t)| (format!("embeddings/{e}/0"), Value::Tensor(t)))
                    .collect();
                entries.push(("config".into(), Value::Str(PBG_CONFIG.into())));
                // The relation's operator: a PBG checkpoint has a model file (a commit carries it over).
                entries.push((
                    "model/relations/0/operator/rhs/translation".into(),
                    Value::Tensor(tensor(generation, 2, &[1024])),
                ));
                ckpt_pbg::save(&entries, dst, &ckpt_pbg::WriteOptions::default()).map(|_| ()).map_err(|e| e.to_string())
            }
        }
        other => Err(format!("unknown format {other}")),
    }
}

/// The config of the PBG checkpoints the harness writes: two entity types of one partition, 1024 floats
/// per embedding.
pub const PBG_CONFIG: &str = r#"{
    "entities": {"user": {"num_partitions": 1}, "item": {"num_partitions": 1}},
    "relations": [{"name": "r", "lhs": "user", "rhs": "item", "operator": "translation"}],
    "dimension": 1024,
    "edge_paths": ["edges"],
    "num_epochs": 2,
    "num_edge_chunks": 1,
    "entity_path": "data",
    "checkpoint_path": "ckpt"
}"#;

/// The embeddings of generation `generation` as PBG partitions: `user` the big tensor, `item` 3 rows.
pub fn pbg_partitions(generation: u32, mib: usize) -> Vec<(&'static str, Tensor)> {
    let big = tensors(generation, mib).swap_remove(0).1;
    vec![("user", big), ("item", tensor(generation, 1, &[3, 1024]))]
}

/// The tensors a reader of `format` must find for generation `generation`, by entry name.
fn expected_tensors(format: &str, generation: u32, mib: usize) -> Vec<(String, Tensor)> {
    let t = tensors(generation, mib);
    match format {
        "hfai" => t.into_iter().map(|(n, t)| (format!("model.{n}"), t)).collect(),
        "recis" => vec![("tbl@embedding".into(), t[0].1.clone()), ("small".into(), t[1].1.clone())],
        "pbg" => pbg_partitions(generation, mib).into_iter().map(|(e, t)| (format!("embeddings/{e}/0"), t)).collect(),
        _ => t,
    }
}

/// Which generation the reader of `format` (`hfai`, `recis`, `distcp`) finds in `dst`, checking nothing
/// but the tensors it returns (for readers racing saves, where a separate look at the files could see
/// another generation than the reader did).
///
/// # Errors
/// Why it could not be read.
pub fn reader_generation(format: &str, dst: &Path, mib: usize, candidates: &[u32]) -> Result<Option<u32>, String> {
    let unreadable = |e: &dyn std::fmt::Display| format!("unreadable: {e}");
    match format {
        "hfai" => {
            generation_of(&ckpt_hfai::HfaiReader::open(dst).map_err(|e| unreadable(&e))?, format, mib, candidates)
        }
        "recis" => {
            generation_of(&ckpt_recis::RecisReader::open(dst).map_err(|e| unreadable(&e))?, format, mib, candidates)
        }
        "distcp" => {
            let v = ckpt_distcp::DcpReader::open(dst).and_then(|r| r.state_dict()).map_err(|e| unreadable(&e))?;
            Ok(candidates.iter().copied().find(|&g| v == state_dict(g, mib)))
        }
        other => Err(format!("unknown format {other}")),
    }
}

/// Which of `candidates` the reader's tensors are, by name (`None`: none of them).
fn generation_of(r: &dyn CheckpointRead, format: &str, mib: usize, candidates: &[u32]) -> Result<Option<u32>, String> {
    let first = expected_tensors(format, candidates.first().copied().unwrap_or(1), mib);
    let mut got = Vec::new();
    for (name, _) in &first {
        got.push(r.tensor(name).map_err(|e| format!("unreadable {name}: {e} (entries {:?})", names_of(r)))?);
    }
    Ok(candidates
        .iter()
        .copied()
        .find(|&g| expected_tensors(format, g, mib).iter().zip(&got).all(|((_, want), have)| want == have)))
}

fn names_of(r: &dyn CheckpointRead) -> Vec<String> {
    r.entries().into_iter().map(|e| e.name).collect()
}

/// The checksum manifest of `dst` verifies and (`complete`) lists every file but itself.
fn check_manifest(dst: &Path, complete: bool) -> Result<(), String> {
    let sums = ckpt_io::Manifest::read(dst).map_err(|e| e.to_string())?.ok_or("no checksum manifest")?;
    let bad = sums.verify_dir(dst).map_err(|e| e.to_string())?;
    if let Some(b) = bad.first() {
        return Err(format!("checksum manifest: {b}"));
    }
    if !complete {
        return Ok(());
    }
    let mut listed: Vec<&String> = sums.files.keys().collect();
    listed.sort();
    let files = file_names(dst)?;
    let files: Vec<&String> = files.iter().filter(|n| *n != ckpt_io::MANIFEST_NAME).collect();
    if listed != files {
        return Err(format!("the manifest lists {listed:?}, the directory holds {files:?}"));
    }
    Ok(())
}

fn file_names(dst: &Path) -> Result<Vec<String>, String> {
    let mut names: Vec<String> =
        fs::read_dir(dst).map_err(|e| e.to_string())?.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort();
    Ok(names)
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
            let f = ckpt_safetensors::read_file(dst).map_err(|e| format!("unreadable: {e}"))?;
            candidates
                .iter()
                .copied()
                .find(|&g| tensors(g, mib).iter().all(|(n, t)| f.get(n) == Some(t)) && f.tensors.len() == 2)
        }
        "distcp" => {
            let r = ckpt_distcp::DcpReader::open(dst).map_err(|e| format!("unreadable: {e}"))?;
            let v = r.state_dict().map_err(|e| format!("unreadable: {e}"))?;
            let sums = ckpt_io::Manifest::read(dst).map_err(|e| e.to_string())?.ok_or("no checksum manifest")?;
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
        "hfai" => {
            let r = ckpt_hfai::HfaiReader::open(dst).map_err(|e| format!("unreadable: {e}"))?;
            check_manifest(dst, true)?;
            let names = file_names(dst)?;
            if names != ["PART_000.pt", "PART_001.pt", "ckpt.checksums.json"] {
                return Err(format!("files {names:?}"));
            }
            generation_of(&r, format, mib, candidates)?
        }
        "recis" => {
            let r = ckpt_recis::RecisReader::open(dst).map_err(|e| format!("unreadable: {e}"))?;
            check_manifest(dst, true)?;
            generation_of(&r, format, mib, candidates)?
        }
        "pbg" => {
            let r = ckpt_pbg::PbgReader::open(dst).map_err(|e| format!("unreadable: {e}"))?;
            // A PBG commit adds the new version's files before it lists them (uncommitted files are not).
            check_manifest(dst, false)?;
            generation_of(&r, format, mib, candidates)?
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
    /// caller asserts on the rows (and prints them). The kills run [`concurrently`], each in a directory
    /// of its own under `scratch`.
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
            rows.extend(concurrently(kills.len(), |i| {
                let (kill, n, at) = &kills[i];
                self.kill(&scratch.join(format!("kill{i}")), mode, kill, *n, *at)
            }));
        }
        let _ = fs::remove_dir_all(scratch);
        rows
    }

    /// One kill in `case_dir` (its own directory: the destination and whatever a crashed save leaves
    /// beside it): the old checkpoint when `mode` is `overwrite`, the save of generation 2 killed at
    /// failpoint `n` or after `at`, the check, the next save (generation 3) and its check.
    fn kill(&self, case_dir: &Path, mode: &'static str, kill: &str, n: Option<u64>, at: Option<Duration>) -> Row {
        let dst = case_dir.join("dst");
        let _ = fs::remove_dir_all(case_dir);
        fs::create_dir_all(case_dir).unwrap();
        if mode == "overwrite" {
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
        let _ = fs::remove_dir_all(case_dir);
        Row { format: self.format.clone(), mode, kill: kill.to_owned(), ended: status, found, cleaned }
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
