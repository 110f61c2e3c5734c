//! The `ckpt` tool and the `mpi_roundtrip` example under `mpirun` (OpenMPI): conversions and reshards split
//! over processes, byte-equal to one process; a sharded training state saved by 4 ranks and loaded by 2 and
//! 3; torch interoperability under gloo; failures (a failing rank, a killed rank, a wrong rank count).
//!
//! Needs `mpirun` on the `PATH` (scripts/system-packages.sh installs OpenMPI) and the example built:
//! `cargo build -p ckpt --features full,mpi --example mpi_roundtrip` (scripts/test.sh does both). Every run
//! has a time limit: a hang fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ckpt_conformance::{fixtures, python, repo_root};

const LIMIT: Duration = Duration::from_secs(240);

struct Run {
    code: Option<i32>,
    out: String,
}

impl Run {
    fn ok(&self) -> &Self {
        assert_eq!(self.code, Some(0), "{}", self.out);
        self
    }
}

/// Runs `cmd`, killing it after `limit` (a hang fails the test).
fn run(mut cmd: Command, limit: Duration) -> Run {
    let shown = format!("{cmd:?}");
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {shown} (is OpenMPI installed?): {e}"));
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            // SIGTERM first: mpirun takes its ranks down with it.
            unsafe { libc_kill(child.id() as i32, 15) };
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} hung: killed after {limit:?}\n{}{}", t_out.join().unwrap(), t_err.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Run { code: status.code(), out: t_out.join().unwrap() + &t_err.join().unwrap() }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

fn mpirun(np: usize, program: &Path, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()]).arg(program);
    for a in args {
        cmd.arg(a);
    }
    cmd
}

fn ckpt_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ckpt"))
}

fn example() -> PathBuf {
    // target/<profile>/deps/mpi-<hash> -> target/<profile>/examples/mpi_roundtrip
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().and_then(Path::parent).unwrap().join("examples").join("mpi_roundtrip");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p ckpt --features full,mpi --example mpi_roundtrip` (scripts/test.sh does)",
        p.display()
    );
    p
}

/// Every file of two directories, byte for byte (names and contents).
fn assert_same_files(a: &Path, b: &Path) {
    let list = |d: &Path| {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    let (la, lb) = (list(a), list(b));
    assert_eq!(la, lb, "{} vs {}", a.display(), b.display());
    assert!(!la.is_empty());
    for name in la {
        assert!(
            std::fs::read(a.join(&name)).unwrap() == std::fs::read(b.join(&name)).unwrap(),
            "{name} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

/// Every file of two directories equal, `.safetensors` files up to the order of their `__metadata__` keys
/// (the safetensors header serializer writes its metadata map in hash order, in one process too): the same
/// header as JSON, the same tensor bytes.
fn assert_same_files_but_metadata_order(a: &Path, b: &Path) {
    let mut names: Vec<String> =
        std::fs::read_dir(a).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    let mut other: Vec<String> =
        std::fs::read_dir(b).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    other.sort();
    assert_eq!(names, other, "{} vs {}", a.display(), b.display());
    for name in names {
        let (x, y) = (std::fs::read(a.join(&name)).unwrap(), std::fs::read(b.join(&name)).unwrap());
        if !name.ends_with(".safetensors") {
            assert!(x == y, "{name} differs");
            continue;
        }
        let split = |f: &[u8]| {
            let n = u64::from_le_bytes(f[..8].try_into().unwrap()) as usize;
            let header: serde_json::Value = serde_json::from_slice(f[8..8 + n].trim_ascii_end()).unwrap();
            (n, header, f[8 + n..].to_vec())
        };
        let ((nx, hx, dx), (ny, hy, dy)) = (split(&x), split(&y));
        assert_eq!((nx, &hx), (ny, &hy), "{name}: headers differ");
        assert!(dx == dy, "{name}: tensor bytes differ");
    }
}

/// The 3-rank DCP checkpoint torch 2.13 wrote.
fn dcp3() -> PathBuf {
    let p = fixtures("distcp").join("torch213").join("m3");
    assert!(p.join(".metadata").exists() && p.join("__2_0.distcp").exists(), "{}", p.display());
    p
}

#[test]
fn reshard_3_ranks_to_4_with_2_processes_equals_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    let mut c = Command::new(ckpt_bin());
    c.args(["reshard"]).arg(dcp3()).arg(&one).args(["--world-size", "4"]);
    run(c, LIMIT).ok();
    let r = run(mpirun(2, &ckpt_bin(), &[&"reshard", &dcp3(), &two, &"--world-size", &"4"]), LIMIT);
    r.ok();
    assert_eq!(r.out.matches("resharded distcp checkpoint").count(), 1, "only rank 0 reports: {}", r.out);
    assert_same_files(&one, &two);
    for rank in 0..4 {
        assert!(two.join(format!("__{rank}_0.distcp")).exists());
    }
    let (a, b) = (ckpt::open(dcp3()).unwrap(), ckpt::open(&two).unwrap());
    for e in a.entries() {
        if matches!(e.kind, ckpt::EntryKind::Tensor(_)) {
            assert_eq!(a.tensor(&e.name).unwrap(), b.tensor(&e.name).unwrap(), "{}", e.name);
        }
    }
}

#[test]
fn convert_to_hfai_with_2_processes_equals_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    let mut c = Command::new(ckpt_bin());
    c.args(["convert"]).arg(dcp3()).arg(&one).args(["--to", "hfai", "--world-size", "4"]);
    run(c, LIMIT).ok();
    run(mpirun(2, &ckpt_bin(), &[&"convert", &dcp3(), &two, &"--to", &"hfai", &"--world-size", &"4"]), LIMIT).ok();
    assert_same_files(&one, &two);
    assert_eq!(ckpt::hfai::HfaiReader::open(&two).unwrap().world_size(), 4);
}

/// hf targets split by shard: each process writes its shards, reading only their tensors; process 0 the
/// index. More shards than processes, and one shard (written by process 0 alone).
#[test]
fn convert_to_hf_with_2_processes_equals_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    for max in ["100", "1GB"] {
        let (one, two) = (tmp.path().join(format!("one{max}")), tmp.path().join(format!("two{max}")));
        let mut c = Command::new(ckpt_bin());
        c.args(["convert"]).arg(dcp3()).arg(&one).args(["--to", "hf", "--max-shard-size", max]);
        run(c, LIMIT).ok();
        let args: [&dyn AsRef<std::ffi::OsStr>; 7] =
            [&"convert", &dcp3(), &two, &"--to", &"hf", &"--max-shard-size", &max];
        run(mpirun(2, &ckpt_bin(), &args), LIMIT).ok();
        assert_same_files_but_metadata_order(&one, &two);
        let shards = std::fs::read_dir(&two)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "safetensors"))
            .count();
        assert!(if max == "100" { shards > 2 } else { shards == 1 }, "{max}: {shards} shards");
    }
}

/// Training checkpoints to hf shards by 2 processes (DeepSpeed ZeRO 3 of 2 ranks, its parameters made from
/// both ranks' files; Megatron at tensor-parallel 2 as Llama, q/k/v split): each process writes its shards,
/// the files equal one process's.
#[test]
fn convert_deepspeed_and_megatron_to_hf_with_2_processes_equals_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(PathBuf, &[&str]); 2] = [
        (fixtures("deepspeed").join("zero3_w2"), &[]),
        (fixtures("megatron").join("gpt_tp2/ckpt"), &["--name-map", "llama"]),
    ];
    for (i, (src, extra)) in cases.iter().enumerate() {
        let (one, two) = (tmp.path().join(format!("one{i}")), tmp.path().join(format!("two{i}")));
        let mut c = Command::new(ckpt_bin());
        c.arg("convert").arg(src).arg(&one).args(["--to", "hf", "--max-shard-size", "300"]).args(*extra);
        run(c, LIMIT).ok();
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
            vec![&"convert", src, &two, &"--to", &"hf", &"--max-shard-size", &"300"];
        for e in extra.iter() {
            args.push(e);
        }
        run(mpirun(2, &ckpt_bin(), &args), LIMIT).ok();
        assert_same_files_but_metadata_order(&one, &two);
    }
}

/// More processes than ranks: the processes without a rank take part in the exchanges until the end.
#[test]
fn convert_to_distcp_with_more_processes_than_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, three) = (tmp.path().join("one"), tmp.path().join("three"));
    let mut c = Command::new(ckpt_bin());
    c.args(["convert"]).arg(dcp3()).arg(&one).args(["--to", "distcp", "--world-size", "2"]);
    run(c, LIMIT).ok();
    run(mpirun(3, &ckpt_bin(), &[&"convert", &dcp3(), &three, &"--to", &"distcp", &"--world-size", &"2"]), LIMIT).ok();
    assert_same_files(&one, &three);
}

/// RecIS and hfai reshards split over the processes give the files of one process.
#[test]
fn reshard_recis_and_hfai_under_mpirun() {
    let tmp = tempfile::tempdir().unwrap();
    let recis = fixtures("recis").join("golden").join("two_shard_adamw");
    let hfai = fixtures("hfai").join("single_n3").join("ckpt");
    for (name, src, world) in [("recis", recis, "3"), ("hfai", hfai, "2")] {
        let (one, two) = (tmp.path().join(format!("{name}1")), tmp.path().join(format!("{name}2")));
        let mut c = Command::new(ckpt_bin());
        c.args(["reshard"]).arg(&src).arg(&one).args(["--world-size", world]);
        run(c, LIMIT).ok();
        run(mpirun(2, &ckpt_bin(), &[&"reshard", &src, &two, &"--world-size", &world]), LIMIT).ok();
        assert_same_files(&one, &two);
    }
}

/// `mpirun -np 1 ckpt FIRST : -np 1 env ENV... ckpt SECOND`: two processes of one job, the second with its own
/// arguments and environment (a failpoint armed, a missing file).
fn mpirun_two(first: &[&dyn AsRef<std::ffi::OsStr>], second: &[&dyn AsRef<std::ffi::OsStr>], env: &[&str]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "1"]).arg(ckpt_bin());
    for a in first {
        cmd.arg(a);
    }
    cmd.args([":", "-np", "1", "env"]).args(env).arg(ckpt_bin());
    for a in second {
        cmd.arg(a);
    }
    cmd
}

/// RecIS targets split by shard: shard `r` is written by the process hosting rank `r`, which reads only
/// the ids of its slice and their rows; process 0 writes `model.pt` and the merged `index` last. From a
/// RecIS source (its files resharded) and from a safetensors one (its state dict laid out), with more
/// shards than processes: the files of one process, byte for byte.
#[test]
fn convert_to_recis_with_2_processes_equals_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let recis = fixtures("recis").join("golden").join("two_shard_adamw");
    let st = tmp.path().join("flat.safetensors");
    let mut c = Command::new(ckpt_bin());
    c.args(["convert"]).arg(&recis).arg(&st).args(["--to", "safetensors"]);
    run(c, LIMIT).ok();
    for (name, src) in [("recis", &recis), ("st", &st)] {
        let (one, two) = (tmp.path().join(format!("{name}1")), tmp.path().join(format!("{name}2")));
        let mut c = Command::new(ckpt_bin());
        c.args(["convert"]).arg(src).arg(&one).args(["--to", "recis", "--world-size", "3"]);
        run(c, LIMIT).ok();
        let args: [&dyn AsRef<std::ffi::OsStr>; 7] = [&"convert", src, &two, &"--to", &"recis", &"--world-size", &"3"];
        let r = run(mpirun(2, &ckpt_bin(), &args), LIMIT);
        r.ok();
        assert_eq!(r.out.matches("converted").count(), 1, "only rank 0 reports: {}", r.out);
        assert_same_files(&one, &two);
        let data = std::fs::read_dir(&two)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("model-"))
            .count();
        assert!(data >= 3, "{name}: {data} data files");
        let (a, b) = (ckpt::open(&recis).unwrap(), ckpt::open(&two).unwrap());
        for e in a.entries() {
            if matches!(e.kind, ckpt::EntryKind::Tensor(_)) && e.name.ends_with("@id") {
                let (mut x, mut y) = (
                    a.tensor(&e.name).unwrap().to_vec::<i64>().unwrap(),
                    b.tensor(&e.name).unwrap().to_vec::<i64>().unwrap(),
                );
                x.sort_unstable();
                y.sort_unstable();
                assert_eq!(x, y, "{name}: {}", e.name);
            }
        }
    }
}

/// A process that fails writing its RecIS shard makes every process fail, naming it; nothing is committed
/// and no staging directory is left.
#[test]
fn a_failing_process_fails_a_split_recis_conversion() {
    let tmp = tempfile::tempdir().unwrap();
    let recis = fixtures("recis").join("golden").join("two_shard_adamw");
    let dst = tmp.path().join("out");
    let args: [&dyn AsRef<std::ffi::OsStr>; 7] = [&"convert", &recis, &dst, &"--to", &"recis", &"--world-size", &"2"];
    let r = run(mpirun_two(&args, &args, &["CKPT_FAILPOINT=file.create", "CKPT_FAILPOINT_ACTION=error"]), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.out);
    assert!(r.out.contains("injected failure at file.create"), "{}", r.out);
    assert!(r.out.contains("model-000002-of-000004.safetensors"), "process 1 fails at its own file: {}", r.out);
    assert!(r.out.contains("shard 1 failed"), "process 0 names process 1: {}", r.out);
    assert!(!dst.exists(), "nothing committed");
    assert!(!tmp.path().join(".out.ckpt-staging").exists(), "the staging directory is removed");
}

/// PBG targets split by partition file: the `i`-th entity partition on process `i mod K`, which alone reads
/// its rows (re-partitioned here: user_id 2 -> 3 partitions, item 1 -> 2); process 0 writes the config, the
/// model and the version file last. The files of one process, byte for byte; and a failing process fails
/// every process.
#[test]
fn convert_to_pbg_with_2_processes_equals_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let pbg = fixtures("pbg").join("ckpt");
    let text = std::fs::read_to_string(pbg.join("config.json")).unwrap();
    let text = text.replacen("\"num_partitions\": 2", "\"num_partitions\": 3", 1).replacen(
        "\"num_partitions\": 1",
        "\"num_partitions\": 2",
        1,
    );
    let config = tmp.path().join("config.json");
    std::fs::write(&config, text).unwrap();
    for (name, layout) in [("same", None), ("repartitioned", Some(&config))] {
        let (one, two) = (tmp.path().join(format!("{name}1")), tmp.path().join(format!("{name}2")));
        let mut c = Command::new(ckpt_bin());
        c.args(["convert"]).arg(&pbg).arg(&one).args(["--to", "pbg"]);
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"convert", &pbg, &two, &"--to", &"pbg"];
        if let Some(config) = layout {
            c.arg("--pbg-config").arg(config);
            args.extend([&"--pbg-config" as &dyn AsRef<std::ffi::OsStr>, config]);
        }
        run(c, LIMIT).ok();
        run(mpirun(2, &ckpt_bin(), &args), LIMIT).ok();
        assert_same_files(&one, &two);
        let parts = ckpt::pbg::PbgReader::open(&two).unwrap().partitions().len();
        assert_eq!(parts, if layout.is_some() { 5 } else { 3 }, "{name}");
    }
    // Process 1 cannot read its config: both processes fail, process 0 naming process 1.
    let dst = tmp.path().join("failed");
    let missing = tmp.path().join("missing.json");
    let first: [&dyn AsRef<std::ffi::OsStr>; 7] = [&"convert", &pbg, &dst, &"--to", &"pbg", &"--pbg-config", &config];
    let second: [&dyn AsRef<std::ffi::OsStr>; 7] = [&"convert", &pbg, &dst, &"--to", &"pbg", &"--pbg-config", &missing];
    let r = run(mpirun_two(&first, &second, &[]), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.out);
    assert!(r.out.contains("missing.json"), "{}", r.out);
    assert!(r.out.contains("process 1 failed"), "process 0 names process 1: {}", r.out);
    assert!(!dst.exists(), "nothing committed: {}", r.out);
}

/// An error on rank 0's checks reaches every process; the job ends with ckpt's exit code, no hang.
#[test]
fn an_error_ends_every_process() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("full");
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("keep"), b"x").unwrap();
    let r = run(mpirun(2, &ckpt_bin(), &[&"reshard", &dcp3(), &dst, &"--world-size", &"4"]), LIMIT);
    // A destination that is not a checkpoint is the caller's mistake: exit 2 (Fault::InvalidArgument).
    assert_eq!(r.code, Some(2), "{}", r.out);
    assert!(r.out.contains("a directory of 1 file that is not a checkpoint (keep)"), "{}", r.out);
    assert!(r.out.contains("process 0 failed"), "rank 1 reports rank 0's failure: {}", r.out);
}

/// The example under `-np 4`, loaded under `-np 2` and `-np 3`, every value checked; its distcp output
/// loads in torch with `dcp.load` under 4 gloo processes.
#[test]
fn example_saves_with_4_ranks_and_loads_with_2_and_3_and_in_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("state");
    let r = run(mpirun(4, &example(), &[&"save", &root]), LIMIT);
    r.ok();
    assert_eq!(r.out.matches("saved distcp, hfai and recis at step 1").count(), 4, "{}", r.out);
    for rank in 0..4 {
        assert!(root.join("distcp").join(format!("__{rank}_0.distcp")).exists());
        assert!(root.join("hfai").join(format!("PART_{rank:03}.pt")).exists());
    }
    for np in [2, 3] {
        let r = run(mpirun(np, &example(), &[&"load", &root]), LIMIT);
        r.ok();
        for rank in 0..np {
            assert!(r.out.contains(&format!("rank {rank} of {np}: checked")), "{}", r.out);
        }
    }
    let script = repo_root().join("conformance/python/mpi/dcp_gloo.py");
    let mut c = Command::new(python());
    c.arg(&script).arg("load").arg(root.join("distcp"));
    let r = run(c, LIMIT);
    r.ok();
    for rank in 0..4 {
        assert!(r.out.contains(&format!("torch rank {rank} of 4: dcp.load checked 13057 values")), "{}", r.out);
    }
}

/// `examples/train_ranks.rs` under `mpirun`: 3 processes save through `RankSave` (ticket and reports over
/// the `MpiCollective`), 2 processes and then 4 threads load their own boxes, every value checked.
#[test]
fn train_ranks_saves_and_loads_under_mpirun() {
    let exe = std::env::current_exe().unwrap();
    let program = exe.parent().and_then(Path::parent).unwrap().join("examples").join("train_ranks");
    assert!(program.exists(), "{} is missing: `cargo test --features mpi,...` builds it", program.display());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("step-3");
    let r = run(mpirun(3, &program, &[&"save", &dir, &"--step", &"3"]), LIMIT);
    r.ok();
    for rank in 0..3 {
        assert!(r.out.contains(&format!("rank {rank} of 3: saved step 3")), "{}", r.out);
        assert!(dir.join(format!("__{rank}_0.distcp")).exists());
    }
    let r = run(mpirun(2, &program, &[&"load", &dir, &"--step", &"3"]), LIMIT);
    r.ok();
    for rank in 0..2 {
        assert!(r.out.contains(&format!("rank {rank} of 2: checked")), "{}", r.out);
    }
    let mut threads = Command::new(&program);
    threads.args([&"load" as &dyn AsRef<std::ffi::OsStr>, &dir, &"--ranks", &"4", &"--step", &"3"]);
    let r = run(threads, LIMIT);
    r.ok();
    assert_eq!(r.out.matches(" of 4: checked").count(), 4, "{}", r.out);
}

/// Each process of an MPI job reads only its own hfai parts: with part 3 damaged, the processes hosting
/// parts 0-2 still read and check theirs, the one hosting part 3 fails.
#[test]
fn hfai_parts_are_read_only_by_their_process() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("state");
    run(mpirun(4, &example(), &[&"save", &root]), LIMIT).ok();
    let r = run(mpirun(2, &example(), &[&"load-hfai-parts", &root]), LIMIT);
    r.ok();
    assert!(r.out.contains("rank 0 of 2: checked") && r.out.contains("of parts [0, 2]"), "{}", r.out);
    assert!(r.out.contains("rank 1 of 2: checked") && r.out.contains("of parts [1, 3]"), "{}", r.out);
    std::fs::write(root.join("hfai").join("PART_003.pt"), b"damaged").unwrap();
    let r = run(mpirun(4, &example(), &[&"load-hfai-parts", &root]), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.out);
    for rank in 0..3 {
        assert!(r.out.contains(&format!("rank {rank} of 4: checked")), "{}", r.out);
        assert!(r.out.contains(&format!("of parts [{rank}]")), "{}", r.out);
    }
    assert!(r.out.contains("rank 3: error:") && r.out.contains("PART_003.pt"), "{}", r.out);
}

/// A checkpoint torch saves with 4 gloo ranks (DTensor `Shard(0)`) is loaded by the example with 2 ranks,
/// each checking its region.
#[test]
fn torch_4_rank_save_loads_in_the_example_with_2_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("torch");
    let script = repo_root().join("conformance/python/mpi/dcp_gloo.py");
    let mut c = Command::new(python());
    c.arg(&script).arg("save").arg(&dir);
    run(c, LIMIT).ok();
    for rank in 0..4 {
        assert!(dir.join(format!("__{rank}_0.distcp")).exists(), "torch wrote 4 ranks' files");
    }
    let r = run(mpirun(2, &example(), &[&"load-distcp", &dir]), LIMIT);
    r.ok();
    for rank in 0..2 {
        assert!(r.out.contains(&format!("rank {rank} of 2: checked 25057 distcp values")), "{}", r.out);
    }
}

/// A rank whose write fails makes every rank return an error naming it; the job ends, nobody hangs, and the
/// previous checkpoint stays.
#[test]
fn a_failing_rank_makes_every_rank_fail() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("state");
    run(mpirun(4, &example(), &[&"save", &root]), LIMIT).ok();
    let r = run(mpirun(4, &example(), &[&"save", &root, &"--step", &"2", &"--fail-rank", &"2"]), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.out);
    assert!(r.out.contains("injected failure at file.sync"), "{}", r.out);
    for rank in [0, 1, 3] {
        assert!(r.out.contains(&format!("rank {rank}: error: rank 2 failed: ")), "{}", r.out);
    }
    assert!(!root.join(".distcp.ckpt-staging").exists(), "the failed save's staging directory is removed");
    run(mpirun(2, &example(), &[&"load", &root, &"--step", &"1"]), LIMIT).ok();
}

/// A rank killed mid-save: the previous checkpoint stays loadable, and `ckpt verify` names the rank whose
/// files are missing from the unfinished save.
#[test]
fn a_killed_rank_leaves_the_previous_checkpoint_and_verify_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("state");
    run(mpirun(4, &example(), &[&"save", &root]), LIMIT).ok();
    let r = run(mpirun(4, &example(), &[&"save", &root, &"--step", &"2", &"--kill-rank", &"1"]), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.out);
    assert!(r.out.contains("signal 9"), "rank 1 was killed: {}", r.out);
    assert!(root.join(".distcp.ckpt-staging").exists(), "the unfinished save is left beside the checkpoint");
    // The previous checkpoint (step 1) loads, every value checked.
    run(mpirun(2, &example(), &[&"load", &root, &"--step", &"1"]), LIMIT).ok();
    let mut c = Command::new(ckpt_bin());
    c.arg("verify").arg(root.join("distcp"));
    let v = run(c, LIMIT);
    v.ok();
    assert!(v.out.contains("warning: an unfinished save is in"), "{}", v.out);
    assert!(v.out.contains("4 rank(s); the files of rank(s) 1 are missing or incomplete"), "{}", v.out);
    assert!(v.out.contains("(rank(s) 0, 2, 3 finished)"), "{}", v.out);
    // The next save removes what the killed one left.
    run(mpirun(4, &example(), &[&"save", &root, &"--step", &"3"]), LIMIT).ok();
    assert!(!root.join(".distcp.ckpt-staging").exists());
    run(mpirun(3, &example(), &[&"load", &root, &"--step", &"3"]), LIMIT).ok();
}

/// A first save killed before any checkpoint exists: `ckpt verify` fails, naming the missing rank.
#[test]
fn verify_of_a_killed_first_save_names_the_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("state");
    let r = run(mpirun(4, &example(), &[&"save", &root, &"--kill-rank", &"3"]), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.out);
    let mut c = Command::new(ckpt_bin());
    c.arg("verify").arg(root.join("distcp"));
    let v = run(c, LIMIT);
    assert_ne!(v.code, Some(0), "{}", v.out);
    assert!(v.out.contains("the files of rank(s) 3 are missing or incomplete"), "{}", v.out);
}

/// Per-rank state goes back to a job of the same number of ranks; another rank count gets a specific error
/// on every rank.
#[test]
fn per_rank_state_needs_the_same_rank_count() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("state");
    run(mpirun(4, &example(), &[&"save", &root, &"--step", &"5"]), LIMIT).ok();
    let r = run(mpirun(4, &example(), &[&"resume", &root, &"--step", &"5"]), LIMIT);
    r.ok();
    assert!(r.out.contains("rank 3 of 4: resumed its own state [1237, 5003, 5, 3]"), "{}", r.out);
    let r = run(mpirun(2, &example(), &[&"resume", &root, &"--step", &"5"]), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.out);
    let e = "rank_state: per-rank state saved by 4 ranks cannot be loaded by 2 ranks";
    assert!(
        r.out.contains(&format!("rank 0: error: {e}")) && r.out.contains(&format!("rank 1: error: {e}")),
        "{}",
        r.out
    );
}

/// Under mpirun, a URL destination: every process streams the files it writes to the bucket (moto on
/// 127.0.0.1), rank 0 writes the commit points last; the result reads back equal to its source and
/// verifies deep, for each directory format that splits its writes over processes.
#[test]
fn processes_upload_their_own_files_to_object_storage() {
    use ckpt_conformance::s3::MotoServer;
    let server = MotoServer::start();
    server.create_bucket("mpi");
    let env = MotoServer::env(&server.endpoint());
    let with_env = |mut c: Command| {
        for (k, v) in &env {
            c.env(k, v);
        }
        c
    };
    let recis = fixtures("recis").join("golden").join("two_shard_adamw");
    let hfai = fixtures("hfai").join("single_n3").join("ckpt");
    let runs: [(&str, PathBuf, Vec<&str>); 5] = [
        ("distcp", dcp3(), vec!["convert", "--to", "distcp"]),
        ("hf", dcp3(), vec!["convert", "--to", "hf"]),
        ("resharded", dcp3(), vec!["reshard", "--world-size", "4"]),
        ("recis", recis, vec!["reshard", "--world-size", "3"]),
        ("hfai", hfai, vec!["reshard", "--world-size", "2"]),
    ];
    for (name, src, args) in runs {
        let url = format!("s3://mpi/{name}");
        let (command, flags) = args.split_first().unwrap();
        let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![command, &src, &url];
        all.extend(flags.iter().map(|f| f as &dyn AsRef<std::ffi::OsStr>));
        run(with_env(mpirun(2, &ckpt_bin(), &all)), LIMIT).ok();
        let mut diff = Command::new(ckpt_bin());
        diff.arg("diff").arg(&src).arg(&url);
        assert!(run(with_env(diff), LIMIT).ok().out.contains("equal"), "{name}");
        let mut verify = Command::new(ckpt_bin());
        verify.args(["verify", "--deep", &url]);
        run(with_env(verify), LIMIT).ok();
    }
}
