//! Crash safety of the `ckpt` command (issue 12 point 2): `ckpt convert` into every target format (pbg from
//! a PyTorch-BigGraph source, the others from a `torch.save` file), into a new destination and over an
//! existing checkpoint, and `ckpt reshard` of every sharded format, each killed (`SIGKILL`,
//! `CKPT_FAILPOINT`) at every failpoint its run passes. Afterwards the destination is the old checkpoint or
//! the new one, whole (it opens, `ckpt verify` passes, and its tensors are one generation's), and the next
//! run succeeds and leaves nothing beside the destination. Plus a second `ckpt convert` to a
//! destination being written: the lock error; and readers of it see the old checkpoint.
//!
//! The kills of a run are independent (each with a destination directory of its own) and run
//! concurrently (`crash::concurrently`, `CKPT_CRASH_JOBS` at once, default the number of CPUs): most of a
//! kill's time is the children's start-up and fsyncs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ckpt_conformance::crash;

/// MiB of the big tensor.
const MIB: usize = 4;

fn ckpt() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ckpt"));
    c.arg("--quiet");
    c.env_remove("CKPT_FAILPOINT").env_remove("CKPT_FAILPOINT_LOG").env_remove("CKPT_FAILPOINT_ACTION");
    c
}

/// The `torch.save` source of generation `g` in `scratch`.
/// Made once, by whichever concurrent kill needs it first (the others wait for it).
fn source(scratch: &Path, g: u32) -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let p = scratch.join(format!("src{g}.pt"));
    let _making = MAKING.lock().unwrap_or_else(PoisonError::into_inner);
    if !p.exists() {
        crash::save("torch", &p, g, MIB).unwrap();
    }
    p
}

/// `ckpt convert` of generation `g` into `dst` as `to`.
fn convert(scratch: &Path, dst: &Path, to: &str, g: u32) -> Command {
    let mut c = ckpt();
    c.arg("convert").arg(source(scratch, g)).arg(dst).args(["--to", to]);
    // Two ranks where the target has ranks (a world size does not apply to the others).
    if matches!(to, "distcp" | "hfai" | "recis") {
        c.args(["--world-size", "2"]);
    }
    if to == "hfai" {
        c.args(["--hfai-large-size", "65536"]);
    }
    c
}

/// Which generation `dst` holds (`None`: nothing there), or why it is neither whole generation.
fn generation(dst: &Path, candidates: &[u32]) -> Result<Option<u32>, String> {
    if std::fs::symlink_metadata(dst).is_err() {
        return Ok(None);
    }
    let ck = ckpt::open(dst).map_err(|e| format!("does not open: {e}"))?;
    let report = ckpt::verify(dst).map_err(|e| format!("verify: {e}"))?;
    if !report.is_ok() {
        return Err(format!("verify: {:?}", report.problems));
    }
    let entry = |name: &str| {
        ck.entries()
            .into_iter()
            .map(|e| e.name)
            .find(|n| n == name || n.ends_with(&format!(".{name}")) || n.ends_with(&format!("/{name}")))
            .ok_or_else(|| format!("no entry {name}"))
    };
    let (big, small) = (
        ck.tensor(&entry("big")?).map_err(|e| e.to_string())?,
        ck.tensor(&entry("small")?).map_err(|e| e.to_string())?,
    );
    candidates
        .iter()
        .copied()
        .find(|&g| {
            let t = crash::tensors(g, MIB);
            t[0].1 == big && t[1].1 == small
        })
        .map(Some)
        .ok_or_else(|| "tensors of no generation (a mix)".into())
}

/// The failpoints an uninterrupted run of `cmd` passes, in order.
fn points(mut cmd: Command, log: &Path) -> Vec<String> {
    let _ = std::fs::remove_file(log);
    let status = cmd.env("CKPT_FAILPOINT_LOG", log).status().unwrap();
    assert!(status.success(), "uninterrupted run: {status}");
    std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// Which generation a destination holds (`None`: nothing there), or why it holds neither whole generation.
type ReadGeneration = dyn Fn(&Path, &[u32]) -> Result<Option<u32>, String> + Sync;

struct Case<'a> {
    what: String,
    /// Makes the scratch state (`overwrite`: the old checkpoint, generation 1) and the run to interrupt.
    setup: &'a (dyn Fn(&Path, &Path) -> Command + Sync),
    /// The next run after a crash (generation 3).
    next: &'a (dyn Fn(&Path, &Path) -> Command + Sync),
    old: Option<u32>,
    /// Which generation a destination holds ([`generation`], the `big`/`small` tensors of a torch source).
    read: &'a ReadGeneration,
}

/// Kills the run at every failpoint it passes and checks the destination after each kill. The kills run
/// concurrently, each with a destination of its own (`out<N>/dst`); the sources in `s/` are shared (the
/// uninterrupted run makes them first; the setup and next runs only read them, or make one under a lock).
fn kill_everywhere(case: &Case<'_>) -> Vec<String> {
    let root = tempfile::tempdir().unwrap();
    let scratch = root.path().join("s");
    let fresh = |out: &Path| {
        let _ = std::fs::remove_dir_all(out);
        std::fs::create_dir_all(out).unwrap();
        out.join("dst")
    };
    std::fs::create_dir_all(&scratch).unwrap();
    let dst = fresh(&root.path().join("out"));
    let pts = points((case.setup)(&scratch, &dst), &scratch.join("points.log"));
    assert!(pts.len() >= 5, "{}: only {} failpoints: {pts:?}", case.what, pts.len());
    let rows = crash::concurrently(pts.len(), |i| {
        let p = &pts[i];
        let out = root.path().join(format!("out{}", i + 1));
        let dst = fresh(&out);
        let status = (case.setup)(&scratch, &dst).env("CKPT_FAILPOINT", (i + 1).to_string()).status().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{} #{} {p}: {status}", case.what, i + 1);
        let found = (case.read)(&dst, &[1, 2]);
        let whole = matches!(found, Ok(g) if g == case.old || g == Some(2));
        let next = (case.next)(&scratch, &dst).output().unwrap();
        let left = crash::leftovers(&dst);
        let cleaned = next.status.success() && left.is_empty() && (case.read)(&dst, &[3]) == Ok(Some(3));
        let row = format!("{:34} #{:<3} {p:18} found {found:?}, next run cleans up: {cleaned}", case.what, i + 1);
        assert!(whole, "{row}");
        assert!(cleaned, "{row}: {} leftovers {left:?}", String::from_utf8_lossy(&next.stderr));
        let _ = std::fs::remove_dir_all(&out);
        row
    });
    for row in &rows {
        println!("{row}");
    }
    rows
}

const TARGETS: &[&str] = &["torch", "safetensors", "hf", "distcp", "hfai", "recis"];

#[test]
fn convert_survives_every_kill_into_every_target() {
    let mut total = 0;
    for &to in TARGETS {
        for overwrite in [false, true] {
            let setup = move |scratch: &Path, dst: &Path| {
                if overwrite {
                    assert!(convert(scratch, dst, to, 1).status().unwrap().success());
                }
                convert(scratch, dst, to, 2)
            };
            let next = move |scratch: &Path, dst: &Path| convert(scratch, dst, to, 3);
            let mode = if overwrite { "overwrite" } else { "new" };
            let case = Case {
                what: format!("convert --to {to} {mode}"),
                setup: &setup,
                next: &next,
                old: overwrite.then_some(1),
                read: &generation,
            };
            total += kill_everywhere(&case).len();
        }
    }
    assert!(total > 50, "{total} kills");
}

/// The PyTorch-BigGraph checkpoint of generation `g` in `scratch` (a torch state dict cannot become one: pbg
/// targets take a pbg source). Made once, by whichever concurrent kill needs it first.
fn pbg_source(scratch: &Path, g: u32) -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let p = scratch.join(format!("pbg{g}"));
    let _making = MAKING.lock().unwrap_or_else(PoisonError::into_inner);
    if !p.exists() {
        crash::save("pbg", &p, g, MIB).unwrap();
    }
    p
}

/// `ckpt convert` of the PyTorch-BigGraph checkpoint of generation `g` into `dst` as pbg.
fn convert_pbg(scratch: &Path, dst: &Path, g: u32) -> Command {
    let mut c = ckpt();
    c.arg("convert").arg(pbg_source(scratch, g)).arg(dst).args(["--to", "pbg"]);
    c
}

/// Which generation the PyTorch-BigGraph checkpoint `dst` holds: its partitions and manifest read by
/// [`crash::read_generation`], after `ckpt verify` passes.
fn pbg_generation(dst: &Path, candidates: &[u32]) -> Result<Option<u32>, String> {
    if std::fs::symlink_metadata(dst).is_ok() {
        let report = ckpt::verify(dst).map_err(|e| format!("verify: {e}"))?;
        if !report.is_ok() {
            return Err(format!("verify: {:?}", report.problems));
        }
    }
    crash::read_generation("pbg", dst, MIB, candidates)
}

/// `ckpt convert --to pbg` (a PyTorch-BigGraph source) into a new destination, killed at every failpoint. It
/// refuses a destination that holds a checkpoint (a PBG checkpoint grows by versions, through the library's
/// commit), so there is no overwrite case, and the next run goes where the user would put it: the crashed
/// destination removed, its staging directory and lock file left beside it for that run to clean.
#[test]
fn convert_to_pbg_survives_every_kill() {
    let setup = |scratch: &Path, dst: &Path| convert_pbg(scratch, dst, 2);
    let next = |scratch: &Path, dst: &Path| {
        let _ = std::fs::remove_dir_all(dst);
        convert_pbg(scratch, dst, 3)
    };
    let case =
        Case { what: "convert --to pbg new".into(), setup: &setup, next: &next, old: None, read: &pbg_generation };
    assert!(kill_everywhere(&case).len() >= 5);
}

/// `ckpt reshard` into a new directory (it refuses a non-empty one), for every sharded format: the
/// source is generation 2 in that format, the resharded copy must be whole generation 2 or absent.
#[test]
fn reshard_survives_every_kill() {
    for format in ["distcp", "hfai", "recis"] {
        let setup = move |scratch: &Path, dst: &Path| {
            let src = scratch.join(format!("{format}2"));
            if !src.exists() {
                assert!(convert(scratch, &src, format, 2).status().unwrap().success());
            }
            let mut c = ckpt();
            c.arg("reshard").arg(&src).arg(dst).args(["--world-size", "3"]);
            c
        };
        let next = move |scratch: &Path, dst: &Path| {
            // The next run writes generation 3 over what the crash left (a convert: reshard refuses a
            // non-empty destination).
            convert(scratch, dst, format, 3)
        };
        let case = Case { what: format!("reshard {format}"), setup: &setup, next: &next, old: None, read: &generation };
        kill_everywhere(&case);
    }
}

fn wait_stopped(child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let dir = format!("/proc/{}/task", child.id());
        let tasks: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok()).collect())
            .unwrap_or_default();
        let stopped = |s: &String| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'));
        if !tasks.is_empty() && tasks.iter().all(stopped) {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the first run ended ({status}) instead of pausing at its failpoint");
        }
        assert!(Instant::now() < deadline, "the first run never paused");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Two `ckpt convert` runs into one destination: the second fails with the lock error naming the first;
/// a reader meanwhile sees the old checkpoint; once the first is done, the new one.
#[test]
fn a_second_convert_gets_the_lock_error_and_readers_see_the_old_checkpoint() {
    crash::concurrently(TARGETS.len(), |i| {
        let to = TARGETS[i];
        let root = tempfile::tempdir().unwrap();
        let (scratch, dst) = (root.path().join("s"), root.path().join("out").join("dst"));
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::create_dir_all(root.path().join("out")).unwrap();
        assert!(convert(&scratch, &dst, to, 1).status().unwrap().success());
        let pause = if matches!(to, "torch" | "safetensors") { "file.synced" } else { "dir.staged" };
        let mut a = convert(&scratch, &dst, to, 2)
            .env("CKPT_FAILPOINT", pause)
            .env("CKPT_FAILPOINT_ACTION", "stop")
            .spawn()
            .unwrap();
        wait_stopped(&mut a);
        let b = convert(&scratch, &dst, to, 3).output().unwrap();
        let msg = String::from_utf8_lossy(&b.stderr);
        assert!(!b.status.success(), "{to}");
        assert!(msg.contains("another save to this destination is in progress"), "{to}: {msg}");
        assert!(msg.contains(&format!("pid {}", a.id())), "{to}: names the holder: {msg}");
        assert_eq!(generation(&dst, &[1, 2, 3]), Ok(Some(1)), "{to}: a reader sees the old checkpoint");
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGCONT) }, 0);
        assert!(a.wait().unwrap().success(), "{to}");
        assert_eq!(generation(&dst, &[1, 2, 3]), Ok(Some(2)), "{to}");
        assert!(crash::leftovers(&dst).is_empty(), "{to}: {:?}", crash::leftovers(&dst));
    });
}
