//! The `ckpt` command, run as a user would: on every golden fixture and on corrupted copies, checking
//! output and exit codes (0 ok, 1 check failed, 2 usage, 3 bad input, 4 I/O).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ckpt::tensor::{Tensor, Value};
use ckpt::{EntryKind, Format};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/fixtures")
}

fn ckpt_cmd(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ckpt"));
    for a in args {
        c.arg(a);
    }
    c.output().unwrap()
}

/// Runs `ckpt args...` and returns (exit code, stdout, stderr).
fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String, String) {
    let out = ckpt_cmd(args);
    let code = out.status.code().unwrap_or_else(|| panic!("killed by a signal: {args:?}", args = out.status));
    (code, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn sorted(dir: &Path, keep: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| keep(p)).collect();
    v.sort();
    v
}

/// Every golden checkpoint of every format.
fn golden() -> Vec<PathBuf> {
    let f = fixtures();
    let mut v = sorted(&f.join("torch"), |p| p.extension().is_some_and(|e| e == "pt"));
    v.extend(sorted(&f.join("distcp/golden"), |p| p.is_dir()));
    v.extend(sorted(&f.join("hfai"), |p| p.is_dir()).into_iter().map(|p| p.join("ckpt")));
    v.push(f.join("pbg/ckpt"));
    v.extend(sorted(&f.join("recis/golden"), |p| p.is_dir()));
    v
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn inspect_json_lists_what_open_lists() {
    for path in golden() {
        let (code, out, err) = run(&[&"inspect", &"--json", &path]);
        assert_eq!(code, 0, "{}: {err}", path.display());
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        let ck = ckpt::open(&path).unwrap();
        assert_eq!(doc["format"], ck.format().name(), "{}", path.display());
        let listed = doc["entries"].as_array().unwrap();
        let entries = ck.entries();
        assert_eq!(listed.len(), entries.len(), "{}", path.display());
        for (j, e) in listed.iter().zip(&entries) {
            assert_eq!(j["name"], e.name.as_str());
            if let EntryKind::Tensor(t) = &e.kind {
                assert_eq!(j["dtype"], t.dtype.torch_name(), "{} {}", path.display(), e.name);
                assert_eq!(j["shape"], serde_json::json!(t.shape));
                assert_eq!(j["nbytes"], t.nbytes());
            }
        }
    }
}

#[test]
fn verify_passes_on_every_golden_fixture() {
    let all = golden();
    assert!(all.len() > 40, "fixtures missing: {}", all.len());
    for path in all {
        let (code, out, err) = run(&[&"verify", &path]);
        assert_eq!(code, 0, "{}: {out}{err}", path.display());
        assert!(out.contains("ok: "), "{out}");
        let (code, out, err) = run(&[&"verify", &"--deep", &path]);
        assert_eq!(code, 0, "{}: --deep: {out}{err}", path.display());
    }
}

#[test]
fn verify_reports_a_flipped_byte_in_a_torch_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.pt");
    let data: Vec<f32> = (0..64u8).map(f32::from).collect();
    ckpt::torch::save(
        &Value::dict([("w", Value::Tensor(Tensor::from_slice(&data, &[64]).unwrap()))]),
        &path,
        &ckpt::torch::WriteOptions::default(),
    )
    .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    // 63.0f32 is the last element: flip a bit of its bytes, wherever the record put them.
    let needle = 63.0f32.to_le_bytes();
    let at = bytes.windows(4).position(|w| w == needle).unwrap();
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    // The structural check reads no tensor data: the archive is whole, so it passes.
    let (code, out, _) = run(&[&"verify", &path]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = run(&[&"verify", &"--deep", &path]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("CRC-32 mismatch") && out.contains("m/data/0"), "{out}");
    assert!(out.contains("FAILED"), "{out}");
}

#[test]
fn verify_reports_a_truncated_distcp_data_file() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("d215");
    copy_dir(&fixtures().join("distcp/golden/d215"), &copy);
    let data = copy.join("__1_0.distcp");
    let len = std::fs::metadata(&data).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&data).unwrap().set_len(len / 2).unwrap();
    let (code, out, err) = run(&[&"verify", &copy]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("problem: ") && out.contains("__1_0.distcp"), "{out}");
}

#[test]
fn verify_rejects_every_bad_file() {
    let bad = sorted(&fixtures().join("../bad"), |p| p.extension().is_some_and(|e| e == "pt"));
    assert!(bad.len() > 10);
    for path in bad {
        let (code, out, err) = run(&[&"verify", &"--deep", &path]);
        assert!(code == 1 || code == 3, "{}: exit {code}: {out}{err}", path.display());
        if code == 3 {
            assert!(err.starts_with("error: ") && err.contains(&*path.to_string_lossy()), "{err}");
        }
    }
}

#[test]
fn diff_reports_max_abs_difference_and_respects_tolerances() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.pt"), dir.path().join("b.pt"));
    let sd = |x: f32| {
        Value::dict([
            ("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0, x, f32::NAN], &[2, 2]).unwrap())),
            ("step", Value::Int(3)),
        ])
    };
    ckpt::torch::save(&sd(3.0), &a, &ckpt::torch::WriteOptions::default()).unwrap();
    ckpt::torch::save(&sd(3.25), &b, &ckpt::torch::WriteOptions::default()).unwrap();
    // Itself: equal (NaN at the same position is equal).
    let (code, out, _) = run(&[&"diff", &a, &a]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("equal: 1 tensors, 1 values"), "{out}");
    let (code, out, _) = run(&[&"diff", &a, &b]);
    assert_eq!(code, 1, "{out}");
    // How it differs: the largest differences and the first element outside the tolerance, both values.
    assert!(
        out.contains(
            "differs: w: max abs diff 0.25, max rel diff 0.07692307692307693, 1 of 4 elements outside tolerance; \
             first at [1, 0]: 3.0 vs 3.25"
        ),
        "{out}"
    );
    assert_eq!(run(&[&"diff", &a, &b, &"--atol", &"0.25"]).0, 0);
    assert_eq!(run(&[&"diff", &a, &b, &"--rtol", &"0.08", &"--atol", &"0"]).0, 0);
    assert_eq!(run(&[&"diff", &a, &b, &"--rtol", &"0.08", &"--atol", &"0", &"-q"]).1, "");

    // Across formats: the same tensors as safetensors, with a value the other side lacks.
    let st = dir.path().join("a.safetensors");
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, f32::NAN], &[2, 2]).unwrap();
    ckpt::safetensors::write_file(&[("w".to_owned(), w)], None, &st).unwrap();
    let (code, out, _) = run(&[&"diff", &a, &st]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("only in {}: step", a.display())), "{out}");
    assert!(!out.contains("differs: w"), "{out}");

    // A dtype and a shape change.
    let c = dir.path().join("c.pt");
    ckpt::torch::save(
        &Value::dict([
            ("w", Value::Tensor(Tensor::from_slice(&[1.0f64, 2.0, 3.0, f64::NAN], &[2, 2]).unwrap())),
            ("step", Value::Tensor(Tensor::from_slice(&[3i64], &[1]).unwrap())),
        ]),
        &c,
        &ckpt::torch::WriteOptions::default(),
    )
    .unwrap();
    let (code, out, _) = run(&[&"diff", &a, &c]);
    assert_eq!(code, 1, "{out}");
    // Zero differences as 0, the dtype change said as such.
    assert!(out.contains("differs: w: dtype float32 vs float64; max abs diff 0, max rel diff 0,"), "{out}");
    assert!(out.contains("kind changed: step: value vs tensor int64 [1]"), "{out}");
    // A shape change, said as such; a value with both sides, their types where they differ.
    let e = dir.path().join("e.pt");
    ckpt::torch::save(
        &Value::dict([
            ("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0, 3.0, f32::NAN], &[4]).unwrap())),
            ("step", Value::Float(3.0)),
        ]),
        &e,
        &ckpt::torch::WriteOptions::default(),
    )
    .unwrap();
    let (code, out, _) = run(&[&"diff", &a, &e]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("differs: w: shape [2, 2] vs [4] (values not compared)"), "{out}");
    assert!(out.contains("value differs: step: 3 (int) vs 3.0 (float)"), "{out}");
    assert!(out.contains("DIFFERENT: 2 differences; 1 tensors, 1 values compared (rtol 1e-5, atol 1e-8)"), "{out}");
}

/// A conversion diffs equal to its source: `ckpt convert dcp/ out --to hfai --world-size 4` nests the state
/// under `model.` and adds hfai's header and an empty `optimizer`, which `ckpt diff` lists as layout keys.
#[test]
fn diff_of_a_conversion_names_layout_keys_and_exits_0() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("distcp/golden/d215");
    let out = tmp.path().join("out");
    let (code, o, e) = run(&[&"convert", &src, &out, &"--to", &"hfai", &"--world-size", &"4"]);
    assert_eq!(code, 0, "{o}{e}");
    let (code, o, e) = run(&[&"diff", &src, &out]);
    assert_eq!(code, 0, "{o}{e}");
    assert!(o.contains("layout keys: b: __nshards__, __version__, optimizer (hfai)"), "{o}");
    assert!(o.contains("state nested under: b: model. (hfai)"), "{o}");
    assert!(o.lines().last().unwrap().starts_with("equal: 4 tensors, 1 values compared"), "{o}");
    assert!(!o.contains("only in"), "{o}");
    // Either way round.
    let (code, o, _) = run(&[&"diff", &out, &src]);
    assert_eq!(code, 0, "{o}");
    assert!(o.contains("layout keys: a: __nshards__, __version__, optimizer (hfai)"), "{o}");
    // Raw: today's entry-by-entry comparison, every layout key and nested name a difference.
    let (code, o, _) = run(&[&"diff", &src, &out, &"--raw"]);
    assert_eq!(code, 1, "{o}");
    assert!(o.contains(&format!("only in {}: __nshards__", out.display())), "{o}");
    assert!(o.contains(&format!("only in {}: model.row", out.display())), "{o}");
    // A changed value is still a difference.
    let changed = tmp.path().join("changed.pt");
    let (code, o, e) = run(&[&"convert", &src, &changed, &"--to", &"torch"]);
    assert_eq!(code, 0, "{o}{e}");
    let mut sd = ckpt::torch::load(&changed).unwrap();
    fn item<'v>(v: &'v mut Value, key: &str) -> &'v mut Value {
        let Value::Dict(d) = v else { panic!("not a dict: {v:?}") };
        &mut d.items.iter_mut().find(|(k, _)| k.as_str() == Some(key)).unwrap().1
    }
    let Value::Int(rank) = item(item(&mut sd, "obj"), "rank") else { panic!("obj.rank") };
    *rank += 1;
    ckpt::torch::save(&sd, &changed, &ckpt::torch::WriteOptions::default()).unwrap();
    let (code, o, _) = run(&[&"diff", &changed, &out]);
    assert_eq!(code, 1, "{o}");
    assert!(o.contains("value differs: obj.rank: 2 vs 1") && o.contains("DIFFERENT: 1 difference"), "{o}");
}

#[test]
fn reshard_then_the_entries_are_the_source_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let f = fixtures();
    let cases: [(PathBuf, usize, Format, &[&str]); 3] = [
        (f.join("distcp/golden/d215"), 3, Format::Distcp, &[]),
        // hfai's header is its layout, not state: listed, not a difference.
        (
            f.join("hfai/single_n3/ckpt"),
            2,
            Format::Hfai,
            &["layout keys: a: __nshards__, __version__ (hfai)", "layout keys: b: __nshards__, __version__ (hfai)"],
        ),
        (f.join("recis/golden/two_shard_adamw"), 3, Format::Recis, &[]),
    ];
    for (src, n, format, expected_diff) in cases {
        let dst = tmp.path().join(format.name());
        let (code, out, err) = run(&[&"reshard", &src, &dst, &"--world-size", &n.to_string()]);
        assert_eq!(code, 0, "{}: {out}{err}", src.display());
        assert!(out.contains(&format!("world size {n}")), "{out}");
        assert_eq!(ckpt::detect(&dst).unwrap(), format);
        let (code, out, err) = run(&[&"verify", &dst]);
        assert_eq!(code, 0, "{}: {out}{err}", dst.display());
        let (_, inspect_src, _) = run(&[&"inspect", &"--json", &src]);
        let (_, inspect_dst, _) = run(&[&"inspect", &"--json", &dst]);
        // The same entries (hfai lists them in part order, which a new part count changes).
        let entries = |s: &str| {
            let doc = serde_json::from_str::<serde_json::Value>(s).unwrap();
            let mut v: Vec<String> = doc["entries"].as_array().unwrap().iter().map(ToString::to_string).collect();
            v.sort();
            v
        };
        let (a, b) = (entries(&inspect_src), entries(&inspect_dst));
        assert!(a == b, "{}: entries differ after resharding", src.display());
        let (code, out, _) = run(&[&"diff", &src, &dst]);
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with("equal") && !l.starts_with("DIFFERENT")).collect();
        assert_eq!(lines, expected_diff, "{}: {out}", src.display());
        assert_eq!(code, i32::from(expected_diff.iter().any(|l| !l.starts_with("layout keys"))));
        if format == Format::Hfai {
            // Compared raw, the part count differs.
            let (code, out, _) = run(&[&"diff", &src, &dst, &"--raw"]);
            assert_eq!(code, 1, "{out}");
            assert!(out.contains("value differs: __nshards__") && !out.contains("layout keys"), "{out}");
        }
        // The shard count shows in the format's own terms.
        let ck = ckpt::open(&dst).unwrap();
        match format {
            Format::Distcp => {
                let files = sorted(&dst, |p| p.extension().is_some_and(|e| e == "distcp"));
                assert_eq!(files.len(), n);
            }
            Format::Hfai => assert_eq!(ck.value("__nshards__").unwrap(), Value::Int(2)),
            _ => {
                let details = ck.reader().details();
                assert!(details.contains(&("shards".to_owned(), n.to_string())), "{details:?}");
            }
        }
        // A checkpoint of the format is replaced whole; a directory of other files is refused.
        // The caller's mistake: exit 2, as every error of Fault::InvalidArgument.
        let (code, _, err) = run(&[&"reshard", &src, &dst, &"--world-size", &"2"]);
        assert_eq!(code, 0, "{err}");
        let notes = tmp.path().join(format!("notes-{}", format.name()));
        std::fs::create_dir(&notes).unwrap();
        std::fs::write(notes.join("notes.txt"), "x").unwrap();
        let (code, _, err) = run(&[&"reshard", &src, &notes, &"--world-size", &"2"]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("a directory of 1 file that is not a checkpoint (notes.txt)"), "{err}");
        assert!(err.contains("--overwrite"), "{err}");
    }
}

#[test]
fn export_tsv_equals_torchbiggraph_export_to_tsv() {
    let tmp = tempfile::tempdir().unwrap();
    let pbg = fixtures().join("pbg");
    let (e, r) = (tmp.path().join("entities.tsv"), tmp.path().join("relation_types.tsv"));
    // As torchbiggraph_export_to_tsv is called: the config file, paths in it relative to the working directory.
    let out = Command::new(env!("CARGO_BIN_EXE_ckpt"))
        .current_dir(&pbg)
        .args(["export-tsv", "config.json", "--entities-output"])
        .arg(&e)
        .arg("--relation-types-output")
        .arg(&r)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&e).unwrap(), std::fs::read(pbg.join("export/entities.tsv")).unwrap());
    assert_eq!(std::fs::read(&r).unwrap(), std::fs::read(pbg.join("export/relation_types.tsv")).unwrap());
    // Existing outputs are not overwritten ("xt").
    let (code, _, err) =
        run(&[&"export-tsv", &pbg.join("ckpt"), &"--entities-output", &e, &"--relation-types-output", &r]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the output exists") && err.contains("--overwrite"), "{err}");
    // --overwrite replaces them whole.
    std::fs::write(&e, "old").unwrap();
    let (code, _, err) = run(&[
        &"export-tsv",
        &pbg.join("ckpt"),
        &"--entities-output",
        &e,
        &"--relation-types-output",
        &r,
        &"--overwrite",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&e).unwrap(), std::fs::read(pbg.join("export/entities.tsv")).unwrap());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2, "nothing left beside the outputs");
    // A checkpoint directory works too (its config.json).
    let (e2, r2) = (tmp.path().join("e2.tsv"), tmp.path().join("r2.tsv"));
    let (code, _, err) =
        run(&[&"export-tsv", &pbg.join("ckpt"), &"--entities-output", &e2, &"--relation-types-output", &r2]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&e2).unwrap(), std::fs::read(pbg.join("export/entities.tsv")).unwrap());
}

#[test]
fn exit_codes_and_help() {
    let torch = fixtures().join("torch/dtypes.pt");
    // Usage errors: 2.
    assert_eq!(run(&[]).0, 2);
    assert_eq!(run(&[&"frobnicate"]).0, 2);
    assert_eq!(run(&[&"diff", &torch]).0, 2);
    assert_eq!(run(&[&"convert", &torch, &"x", &"--to", &"onnx"]).0, 2);
    assert_eq!(run(&[&"reshard", &torch, &"x", &"--world-size", &"0"]).0, 2);
    let (code, _, err) = run(&[&"reshard", &torch, &"x", &"--world-size", &"2"]);
    assert_eq!(code, 2);
    assert!(err.contains("distcp, hfai, recis"), "{err}");
    // Bad input: 3, with the path.
    let bad = fixtures().join("../bad/random_bytes.pt");
    let (code, _, err) = run(&[&"inspect", &bad]);
    assert_eq!(code, 3);
    assert!(err.contains("random_bytes.pt"), "{err}");
    // Missing files: 4.
    let (code, _, err) = run(&[&"verify", &"/nonexistent/ckpt.pt"]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("/nonexistent/ckpt.pt"), "{err}");
    assert_eq!(run(&[&"diff", &torch, &"/nonexistent/b.pt"]).0, 4);
    // Help with examples, for the tool and every subcommand.
    let (code, out, _) = run(&[&"--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Examples:") && out.contains("Exit codes"), "{out}");
    for sub in ["inspect", "cat", "verify", "diff", "convert", "reshard", "export-tsv"] {
        let (code, out, _) = run(&[&sub, &"--help"]);
        assert_eq!(code, 0, "{sub}");
        assert!(out.contains("Examples:\n  ckpt "), "{sub}: {out}");
    }
}

/// Issue 41.1: `convert` writes over nothing or a checkpoint of the target format; anything else is refused
/// (exit 2, the message naming what is there and `--overwrite`), and `--overwrite` replaces it whole.
#[test]
fn convert_refuses_what_is_not_a_checkpoint_of_the_target_format() {
    let tmp = tempfile::tempdir().unwrap();
    let d215 = fixtures().join("distcp/golden/d215");
    let dir = tmp.path().join("dir");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "hi\n").unwrap();
    let (code, out, err) = run(&[&"convert", &d215, &dir, &"--to", &"distcp"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("a directory of 1 file that is not a checkpoint (notes.txt)"), "{err}");
    assert!(err.contains("--overwrite") && err.matches(&dir.display().to_string()).count() == 1, "{err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let (code, out, err) = run(&[&"convert", &d215, &dir, &"--to", &"distcp", &"--overwrite"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!dir.join("notes.txt").exists() && dir.join(".metadata").exists());
    // An hfai checkpoint converted over: refused; with --overwrite no PART file is left.
    let hfai = tmp.path().join("hfai");
    let (code, _, err) = run(&[&"convert", &d215, &hfai, &"--to", &"hfai"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&[&"convert", &d215, &hfai, &"--to", &"distcp"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("an hfai checkpoint is there"), "{err}");
    let (code, _, err) = run(&[&"convert", &d215, &hfai, &"--to", &"distcp", &"--overwrite"]);
    assert_eq!(code, 0, "{err}");
    assert!(sorted(&hfai, |p| p.to_string_lossy().contains("PART_")).is_empty());
    // A text file is refused for a file target too, and kept; --overwrite replaces it.
    let precious = tmp.path().join("precious.txt");
    std::fs::write(&precious, "keep\n").unwrap();
    let (code, _, err) = run(&[&"convert", &d215, &precious, &"--to", &"torch"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a text file (starts with \"keep\") is there"), "{err}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep\n");
    let (code, _, err) = run(&[&"convert", &d215, &precious, &"--to", &"torch", &"--overwrite"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ckpt::detect(&precious).unwrap(), Format::Torch);
    // Re-converting over a checkpoint of the target format replaces it, as before.
    let (code, _, err) = run(&[&"convert", &d215, &dir, &"--to", &"distcp"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn convert_prints_its_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("m.safetensors");
    let (code, out, err) = run(&[&"convert", &fixtures().join("torch/dtypes.pt"), &dst, &"--to", &"safetensors"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("converted ") && out.contains("tensors"), "{out}");
    // Nothing is dropped: complex32 and complex128 are stored as their bytes, their dtype recorded.
    assert!(out.contains("21 tensors") && !out.contains("cannot hold"), "{out}");
    let (code, out, _) = run(&[&"verify", &dst]);
    assert_eq!(code, 0, "{out}");
    // Across formats, the converted file equals its source.
    let src = fixtures().join("torch/dtypes.pt");
    let (code, out, _) = run(&[&"diff", &src, &dst]);
    assert_eq!(code, 0, "{out}");
    // Only part of it, in bfloat16: floating-point tensors cast, others as they are.
    let part = tmp.path().join("part.safetensors");
    let (code, out, err) = run(&[
        &"convert",
        &src,
        &part,
        &"--to",
        &"safetensors",
        &"--include",
        &"float*",
        &"--include",
        &"int8",
        &"--exclude",
        &"float8_*",
        &"--dtype",
        &"bf16",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = run(&[&"inspect", &part]);
    assert_eq!(code, 0, "{out}");
    let rows: Vec<(&str, &str)> = out
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().collect::<Vec<_>>().get(..2).map(|v| (v[0], v[1])))
        .filter(|(_, d)| !d.ends_with(','))
        .collect();
    assert_eq!(
        rows,
        [("int8", "int8"), ("float16", "bfloat16"), ("float32", "bfloat16"), ("float64", "bfloat16")],
        "{out}"
    );
    let (code, out, _) = run(&[&"inspect", &src, &"--include", &"complex*", &"--exclude", &"complex64"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("complex32")
            && out.contains("complex128")
            && !out.contains("complex64")
            && !out.contains("float32"),
        "{out}"
    );
    let (code, _, err) = run(&[&"convert", &src, &part, &"--to", &"safetensors", &"--dtype", &"int8"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn convert_takes_the_target_layout_options() {
    let tmp = tempfile::tempdir().unwrap();
    // PBG: re-partitioned by another config.
    let pbg = fixtures().join("pbg/ckpt");
    let text = std::fs::read_to_string(pbg.join("config.json")).unwrap();
    let config = tmp.path().join("config.json");
    std::fs::write(&config, text.replace("\"num_partitions\": 2", "\"num_partitions\": 4")).unwrap();
    let dst = tmp.path().join("pbg4");
    let (code, out, err) = run(&[&"convert", &pbg, &dst, &"--to", &"pbg", &"--pbg-config", &config]);
    assert_eq!(code, 0, "{out}{err}");
    let ck = ckpt::pbg::PbgReader::open(&dst).unwrap();
    assert_eq!(ck.partitions().iter().filter(|p| p.entity == "user_id").count(), 4);
    // RecIS: shards, data files per shard, slice size.
    let dst = tmp.path().join("recis");
    let src = fixtures().join("recis/golden/two_shard_adamw");
    let args: [&dyn AsRef<std::ffi::OsStr>; 11] = [
        &"convert",
        &src,
        &dst,
        &"--to",
        &"recis",
        &"--world-size",
        &"3",
        &"--parallel",
        &"1",
        &"--slice-size",
        &"4096",
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{out}{err}");
    let sparse = ckpt::recis::SparseCheckpoint::open(&dst).unwrap();
    assert_eq!((sparse.shard_num(), sparse.parallel(), sparse.slice_size("tbl").unwrap()), (Some(3), Some(1), 4096));
    // Rows are in the new shards' order: diff compares them id by id.
    let (code, out, _) = run(&[&"diff", &src, &dst]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("rows compared by id (another shard layout): tbl\n"), "{out}");
    let (a, b) =
        (ckpt::recis::SparseCheckpoint::open(&src).unwrap().child("tbl").unwrap(), sparse.child("tbl").unwrap());
    assert_eq!(a.len(), b.len());
    for &id in a.ids() {
        for slot in a.slots() {
            assert_eq!(a.row_bytes(id, slot.name()).unwrap(), b.row_bytes(id, slot.name()).unwrap(), "id {id}");
        }
    }
    // A checkpoint with nothing PBG could hold: bad input (3), the reason on stderr, nothing written.
    let dst = tmp.path().join("none");
    let (code, _, err) = run(&[&"convert", &fixtures().join("torch/dtypes.pt"), &dst, &"--to", &"pbg"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("has no `embeddings/<entity>/<partition>`"), "{err}");
    assert!(!dst.exists());
}

/// `--no-checksums` and `--no-sync` reach every target's writer: no checksum manifest beside a directory
/// format, CRC-32 0 in `torch.save` records, no CRC32C in safetensors headers; by default every one has them,
/// and the checkpoint verifies either way.
#[test]
fn convert_takes_the_durability_flags_for_every_target() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("distcp/golden/d215");
    let manifest = |dir: &Path| dir.join("ckpt.checksums.json").is_file();
    let torch_crcs = |file: &Path| {
        let bytes = std::fs::read(file).unwrap();
        let archive = ckpt::torch::zip::Archive::parse(&bytes).unwrap();
        archive.records().iter().filter(|r| r.crc32() != 0).count()
    };
    let safetensors_crcs = |file: &Path| {
        let r = ckpt::safetensors::SafetensorsReader::open(file).unwrap();
        ckpt::safetensors::checksums(&r).unwrap().is_some()
    };
    for (to, extra) in [
        ("distcp", None),
        ("hfai", Some("--world-size=2")),
        ("recis", None),
        ("torch", None),
        ("safetensors", None),
        ("hf", None),
    ] {
        let src = if to == "recis" { fixtures().join("recis/golden/two_shard_adamw") } else { src.clone() };
        for flags in [&[][..], &["--no-checksums", "--no-sync"][..]] {
            let checksums = flags.is_empty();
            let name = if matches!(to, "torch") {
                format!("{to}{}.pt", flags.len())
            } else if to == "safetensors" {
                format!("{to}{}.safetensors", flags.len())
            } else {
                format!("{to}{}", flags.len())
            };
            let dst = tmp.path().join(name);
            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"convert", &src, &dst, &"--to", &to];
            if let Some(extra) = &extra {
                args.push(extra);
            }
            for f in flags {
                args.push(f);
            }
            let (code, out, err) = run(&args);
            assert_eq!(code, 0, "{to} {flags:?}: {out}{err}");
            match to {
                "torch" => assert_eq!(torch_crcs(&dst) > 0, checksums, "{to} {flags:?}"),
                "safetensors" => assert_eq!(safetensors_crcs(&dst), checksums, "{to} {flags:?}"),
                "hf" => {
                    let shard = sorted(&dst, |p| p.extension().is_some_and(|e| e == "safetensors"));
                    assert!(shard.iter().all(|f| safetensors_crcs(f) == checksums), "{to} {flags:?}");
                }
                _ => assert_eq!(manifest(&dst), checksums, "{to} {flags:?}"),
            }
            let (code, out, err) = run(&[&"verify", &"--deep", &dst]);
            assert_eq!(code, 0, "{to} {flags:?}: {out}{err}");
        }
    }
}

#[test]
fn cat_prints_values_too() {
    let (code, out, err) = run(&[&"cat", &fixtures().join("torch/bytesio.pt"), &"n"]);
    assert_eq!(code, 0, "{err}");
    let want = match ckpt::open(fixtures().join("torch/bytesio.pt")).unwrap().value("n").unwrap() {
        ckpt::Value::Int(i) => format!("{i}\n"),
        other => panic!("{other:?}"),
    };
    assert_eq!(out, want);
    let pbg = fixtures().join("pbg/ckpt");
    let (code, out, err) = run(&[&"cat", &pbg, &"config"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim_end(), std::fs::read_to_string(pbg.join("config.json")).unwrap().trim_end());
    let (code, out, _) = run(&[&"cat", &pbg, &"version"]);
    assert_eq!((code, out.as_str()), (0, "4\n"));
}

#[test]
fn help_lists_formats_and_profiles_from_the_library() {
    let (code, out, _) = run(&[&"convert", &"--help"]);
    assert_eq!(code, 0);
    for f in Format::ALL {
        assert!(out.contains(&format!("- {}:", f.name())) && out.contains(f.about()), "{f}: {out}");
    }
    let names = |writable: bool| {
        Format::ALL.iter().filter(|f| f.writable() == writable).map(|f| f.name()).collect::<Vec<_>>().join(", ")
    };
    assert!(out.contains(&format!("Targets: {}. Read only: {}.", names(true), names(false))), "{out}");
    assert!(out.contains("max-compat") && out.contains("torch213"), "{out}");
    let (_, out, _) = run(&[&"reshard", &"--help"]);
    for f in ckpt::reshard_formats() {
        assert!(out.lines().next().unwrap().contains(f.name()), "{out}");
    }
    // The profile is parsed by clap: an unknown one is a usage error, a known one is taken.
    let src = fixtures().join("torch/checkpoint.pt");
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("dcp");
    assert_eq!(run(&[&"convert", &src, &dst, &"--to", &"distcp", &"--dcp-profile", &"torch999"]).0, 2);
    let (code, out, err) = run(&[&"convert", &src, &dst, &"--to", &"distcp", &"--dcp-profile", &"torch213"]);
    assert_eq!(code, 0, "{out}{err}");
    // torch 2.13's layout records a save id (storage_meta); the maximum-compatibility one does not.
    let details = ckpt::open(&dst).unwrap().reader().details();
    assert!(details.iter().any(|(k, _)| k == "save_id"), "{details:?}");
    let compat = tmp.path().join("compat");
    assert_eq!(run(&[&"convert", &src, &compat, &"--to", &"distcp"]).0, 0);
    let details = ckpt::open(&compat).unwrap().reader().details();
    assert!(!details.iter().any(|(k, _)| k == "save_id"), "{details:?}");
    // A flag of another format than the target is a usage error, naming both, before anything is written.
    let other = tmp.path().join("other");
    let (code, _, err) = run(&[&"convert", &src, &other, &"--to", &"distcp", &"--hfai-large-size", &"16"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "option --hfai-large-size does not apply: it is an option of hfai targets; this conversion writes distcp"
        ),
        "{err}"
    );
    assert!(!other.exists());
}

/// Issue 41: each command's help lists its own flags first, then each group under its heading (the target's,
/// the selection, how the source is read, read limits, storage), and ends with 2 to 4 examples; `--to` offers
/// only the formats ckpt writes.
#[test]
fn help_groups_flags_under_headings_and_ends_with_examples() {
    let own = |cmd: &str| -> &[&str] {
        match cmd {
            "inspect" => &["--json", "--include", "--exclude"],
            "cat" => &["--limit"],
            "verify" => &["--deep"],
            "diff" => &["--rtol", "--atol", "--all", "--raw"],
            "convert" => &["--to", "--from"],
            "reshard" => &["--world-size"],
            _ => &["--entities-output", "--relation-types-output"],
        }
    };
    for cmd in ["inspect", "cat", "verify", "diff", "convert", "reshard", "export-tsv"] {
        let (code, out, err) = run(&[&cmd, &"--help"]);
        assert_eq!(code, 0, "{cmd}: {err}");
        let headings: Vec<&str> =
            out.lines().filter(|l| !l.starts_with(' ') && l.ends_with(':')).map(|l| l.trim_end_matches(':')).collect();
        let mut want = vec!["Arguments", "Options"];
        if cmd == "convert" {
            want.extend(["Target", "Selection"]);
        }
        want.extend(["Source", "Read limits", "Storage", "Examples"]);
        assert_eq!(headings, want, "{cmd}: {out}");
        // Every flag sits under its group's heading: the command's own under Options, the limits under Read
        // limits, the storage flags under Storage.
        let section = |name: &str| {
            let start = out.find(&format!("\n{name}:\n")).unwrap_or_else(|| panic!("{cmd}: no {name}: {out}"));
            let rest = &out[start + name.len() + 3..];
            let end =
                headings.iter().skip_while(|h| **h != name).nth(1).and_then(|next| rest.find(&format!("\n{next}:\n")));
            rest[..end.unwrap_or(rest.len())].to_owned()
        };
        for flag in own(cmd) {
            assert!(section("Options").contains(flag), "{cmd}: {flag} not under Options: {out}");
        }
        assert!(!section("Options").contains("--max-depth") && !section("Options").contains("--storage-option"));
        assert!(section("Read limits").contains("--max-depth") && section("Read limits").contains("--trusted"));
        assert!(section("Storage").contains("--storage-option"), "{cmd}: {out}");
        assert!(section("Source").contains("--tag") && section("Source").contains("--name-map"), "{cmd}");
        if cmd == "convert" {
            assert!(section("Target").contains("--world-size") && section("Target").contains("--max-shard-size"));
            assert!(section("Selection").contains("--include") && section("Selection").contains("--rename"));
        }
        // The help ends with 2 to 4 examples, each a `ckpt <cmd>` line.
        let examples: Vec<&str> = out.rsplit("Examples:\n").next().unwrap().lines().filter(|l| !l.is_empty()).collect();
        assert!((2..=4).contains(&examples.len()), "{cmd}: {examples:?}");
        for line in examples {
            assert!(line.starts_with(&format!("  ckpt {cmd} ")), "{cmd}: {line:?}");
        }
    }
    // `--to` offers the formats ckpt writes and refuses the others as a usage error, before reading anything.
    let (_, out, _) = run(&[&"convert", &"--help"]);
    let to = &out[out.find("--to <TO>").unwrap()..out.find("--from <FROM>").unwrap()];
    for f in Format::ALL {
        assert_eq!(to.contains(&format!("- {}:", f.name())), f.writable(), "{f}: {to}");
    }
    let src = fixtures().join("torch/checkpoint.pt");
    let tmp = tempfile::tempdir().unwrap();
    for f in Format::ALL.into_iter().filter(|f| !f.writable()) {
        let (code, _, err) = run(&[&"convert", &src, &tmp.path().join("out"), &"--to", &f.name()]);
        assert_eq!(code, 2, "{f}: {err}");
        assert!(err.contains(&format!("invalid value '{f}' for '--to <TO>'")) && err.contains("safetensors"), "{err}");
    }
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
}

/// Issue 11 as a user meets it: numpy values in a training checkpoint, a whole pickled module, a Lightning
/// checkpoint converted in part (prefix stripped, cast), Hugging Face shards read and written.
#[test]
fn what_users_load_and_convert() {
    let values = fixtures().join("values");
    let np = values.join("numpy.pt");
    // numpy scalars print as Python prints them; arrays are tensors of their numpy dtype.
    for (name, want) in [
        ("best_acc", "0.8125"),
        ("step", "1200"),
        ("converged", "True"),
        ("seed", "9223372036854775813"),
        ("phase", "(1.5-0.25j)"),
        ("fortran", "[[-5, -4, -3, -2],\n [-1, 0, 1, 2],\n [3, 4, 5, 6]]"),
    ] {
        let (code, out, err) = run(&[&"cat", &np, &name]);
        assert_eq!((code, out.trim_end()), (0, want), "{name}: {err}");
    }
    let (code, out, err) = run(&[&"inspect", &np]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["hist", "float32", "[2,", "3]", "24", "B"]),
        "{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("best_acc") && l.contains("numpy.float64")), "{out}");
    // Unsupported numpy dtypes: an error naming them (exit 3, bad input).
    let (code, _, err) = run(&[&"cat", &values.join("numpy_unsupported.pt"), &"objects"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("object dtype '|O8'"), "{err}");

    // A whole module: its state dict's names, its classes named.
    let module = values.join("module_whole.pt");
    let (code, out, err) = run(&[&"inspect", &module]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().next().unwrap().contains("module classes: torch.nn.modules.container.Sequential"), "{out}");
    assert!(out.contains("torch.nn.modules.batchnorm.BatchNorm1d"), "{out}");
    assert!(out.contains("1.running_mean") && out.contains("8 tensors"), "{out}");
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("module.safetensors");
    let (code, _, err) = run(&[&"convert", &module, &st, &"--to", &"safetensors"]);
    assert_eq!(code, 0, "{err}");
    let names: Vec<String> = ckpt::open(&st).unwrap().entries().into_iter().map(|e| e.name).collect();
    assert_eq!(names.len(), 8);
    assert_eq!(names[0], "0.weight");
    // Back to torch: the whole object, not only its state dict.
    let back = tmp.path().join("module.pt");
    let (code, _, err) = run(&[&"convert", &module, &back, &"--to", &"torch"]);
    assert_eq!(code, 0, "{err}");
    match ckpt::open(&back).unwrap().value("0.weight") {
        Ok(Value::Tensor(_)) => {}
        other => panic!("{other:?}"),
    }
    let (_, out, _) = run(&[&"inspect", &back]);
    assert!(out.contains("top level: object, module: torch.nn.modules.container.Sequential"), "{out}");

    // The model of a Lightning checkpoint, without optimizer, `model.` stripped, in bfloat16.
    let lightning = values.join("lightning.ckpt");
    let model = tmp.path().join("model.safetensors");
    let (code, _, err) = run(&[
        &"convert",
        &lightning,
        &model,
        &"--to",
        &"safetensors",
        &"--include",
        &"state_dict.*",
        &"--exclude",
        &"*.num_batches_tracked",
        &"--strip-prefix",
        &"state_dict.model.",
        &"--dtype",
        &"bf16",
    ]);
    assert_eq!(code, 0, "{err}");
    let src = ckpt::open(&lightning).unwrap();
    let got = ckpt::open(&model).unwrap();
    let names: Vec<String> = got.entries().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "3.0.weight"]);
    for n in &names {
        let t = got.tensor(n).unwrap();
        assert_eq!(t.dtype(), ckpt::DType::BF16, "{n}");
        let want = ckpt::tensor::cast_float(&src.tensor(&format!("state_dict.model.{n}")).unwrap(), ckpt::DType::BF16)
            .unwrap();
        assert!(t.bitwise_eq(&want), "{n}");
    }
    let (code, out, err) =
        run(&[&"inspect", &lightning, &"--include", &"optimizer_states.*", &"--exclude", &"*.exp_avg_sq"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("optimizer_states.0.state.0.exp_avg")
            && !out.contains("exp_avg_sq")
            && !out.contains("state_dict."),
        "{out}"
    );

    // Hugging Face shards: read as format hf (not as DCP's HF layout), written with --to hf.
    let hf = values.join("hf_sharded");
    assert_eq!(ckpt::detect(&hf).unwrap(), Format::Hf);
    let (code, out, err) = run(&[&"inspect", &hf]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("hf checkpoint") && out.contains("shards: 4"), "{out}");
    let out_hf = tmp.path().join("numpy_hf");
    let (code, _, err) = run(&[&"convert", &np, &out_hf, &"--to", &"hf", &"--max-shard-size", &"64"]);
    assert_eq!(code, 0, "{err}");
    assert!(out_hf.join("model.safetensors.index.json").is_file());
    let (code, out, err) = run(&[&"diff", &np, &out_hf]);
    assert_eq!(code, 0, "{out}{err}");
}

/// `ckpt verify --deep` (and `ckpt::verify`, deep by default) catches one flipped bit in tensor data
/// written by ckpt, in every format: torch's record CRC-32s, the per-tensor CRC32Cs ckpt records in
/// safetensors headers (single files and hf shards), and ckpt's checksum manifest beside distcp, hfai, recis
/// and pbg checkpoints (none of which has checksums of its own). Each problem names the file. The
/// structural check (plain `ckpt verify`, [`ckpt::Depth::Structure`]) passes on the intact checkpoint, and
/// still passes after the flip (it reads no tensor data). Legacy (pre-1.6) `.pt` files carry no checksum of
/// any kind, so a flip in their data is not detectable and they are not part of this test.
#[test]
fn verify_deep_reports_a_flipped_bit_of_tensor_data_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.pt");
    ckpt_conformance::crash::save("torch", &src, 1, 1).unwrap();
    let mut outputs: Vec<(&str, PathBuf)> = Vec::new();
    for to in ["torch", "safetensors", "hf", "distcp", "hfai", "recis"] {
        let dst = dir.path().join(format!("out_{to}"));
        // Two ranks where the target has ranks (a world size does not apply to the others).
        let ranks = if ["distcp", "hfai", "recis"].contains(&to) { "2" } else { "1" };
        let (code, _, err) = run(&[&"convert", &src, &dst, &"--to", &to, &"--world-size", &ranks]);
        assert_eq!(code, 0, "{to}: {err}");
        outputs.push((to, dst));
    }
    // hf in several shards (`model-0000i-of-0000n.safetensors` + index).
    let shards = dir.path().join("out_hf_shards");
    let (code, _, err) = run(&[&"convert", &src, &shards, &"--to", &"hf", &"--max-shard-size", &"4096"]);
    assert_eq!(code, 0, "hf shards: {err}");
    assert!(shards.join("model.safetensors.index.json").is_file());
    outputs.push(("hf", shards));
    let pbg = dir.path().join("out_pbg");
    ckpt_conformance::crash::save("pbg", &pbg, 1, 1).unwrap();
    outputs.push(("pbg", pbg));
    let structure = ckpt::VerifyOptions::structure();
    for (format, dst) in outputs {
        let (code, out, err) = run(&[&"verify", &dst]);
        assert_eq!(code, 0, "{format}: {out}{err}");
        let (code, out, err) = run(&[&"verify", &"--deep", &dst]);
        assert_eq!(code, 0, "{format}: {out}{err}");
        assert!(ckpt::verify_with(&dst, &structure).unwrap().is_ok(), "{format}");
        // The largest file holds the big tensor; flip one bit in the middle of it.
        let file = if dst.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dst).unwrap().map(|e| e.unwrap().path()).collect();
            files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
            files.pop().unwrap()
        } else {
            dst.clone()
        };
        let mut bytes = std::fs::read(&file).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x04;
        std::fs::write(&file, &bytes).unwrap();
        // Plain verify stays structural: it reads no tensor data, so the flip inside it passes.
        let (code, out, err) = run(&[&"verify", &dst]);
        assert_eq!(code, 0, "{format}: plain verify read tensor data: {out}{err}");
        assert!(ckpt::verify_with(&dst, &structure).unwrap().is_ok(), "{format}");
        let (code, out, err) = run(&[&"verify", &"--deep", &dst]);
        assert_eq!(code, 1, "{format}: {out}{err}");
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(out.contains("problem: ") && out.contains(&name), "{format}: names {name}: {out}");
        assert!(out.contains("FAILED"), "{format}: {out}");
        let report = ckpt::verify(&dst).unwrap();
        assert!(
            !report.is_ok()
                && report
                    .problems
                    .iter()
                    .any(|p| p.to_string().contains(&name) && p.kind == ckpt::ProblemKind::ChecksumMismatch),
            "{format}: {report:?}"
        );
        let deep = ckpt::verify_with(&dst, &ckpt::VerifyOptions::deep()).unwrap();
        assert_eq!(deep.problems, report.problems, "{format}");
        if matches!(format, "safetensors" | "hf") {
            // The problem names the tensor whose checksum failed.
            assert!(out.contains("tensor \"") && out.contains("CRC32C"), "{format}: {out}");
        }
    }
}

/// Plain `ckpt verify` checks structure without reading tensor data: a missing data file, a truncated one
/// and a damaged header are problems; the same checks run in the library with [`ckpt::Depth::Structure`].
#[test]
fn plain_verify_checks_files_and_sizes_without_reading_data() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.pt");
    ckpt_conformance::crash::save("torch", &src, 1, 1).unwrap();
    for to in ["distcp", "hfai", "recis", "hf"] {
        let dst = dir.path().join(format!("out_{to}"));
        // Two ranks where the target has ranks (a world size does not apply to the others).
        let ranks = if ["distcp", "hfai", "recis"].contains(&to) { "2" } else { "1" };
        let (code, _, err) = run(&[&"convert", &src, &dst, &"--to", &to, &"--world-size", &ranks]);
        assert_eq!(code, 0, "{to}: {err}");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dst).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
        let file = files.pop().unwrap();
        let len = std::fs::metadata(&file).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len - 1).unwrap();
        let (code, out, err) = run(&[&"verify", &dst]);
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(code == 1 || code == 3, "{to}: a truncated {name}: exit {code}: {out}{err}");
        assert!(format!("{out}{err}").contains(&name), "{to}: names {name}: {out}{err}");
    }
}

/// Every `--max-*` flag lowers (or raises) its pickle limit for the run, and each limit, once exceeded, is
/// its own error (exit 3, bad input) naming what exceeded it; the same file passes with the defaults.
#[test]
fn each_limit_flag_is_enforced_with_a_specific_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.pt");
    let mut nested = Value::Int(1);
    for _ in 0..12 {
        nested = Value::dict([("n", nested)]);
    }
    let tensors: Vec<(String, Value)> =
        (0..40).map(|i| (format!("t{i}"), Value::Tensor(Tensor::from_slice(&[i as f32], &[1]).unwrap()))).collect();
    let sd = Value::dict([
        ("nested", nested),
        ("list", Value::List((0..100).map(Value::Int).collect())),
        ("text", Value::Str("x".repeat(1000))),
        ("tensors", Value::dict(tensors.iter().map(|(k, v)| (k.as_str(), v.clone())))),
    ]);
    ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
    let (code, _, err) = run(&[&"inspect", &path]);
    assert_eq!(code, 0, "the defaults accept it: {err}");
    for (flag, value, says) in [
        ("--max-depth", "8", "nesting deeper than 8"),
        ("--max-container-len", "50", "exceeds 50"),
        ("--max-alloc-bytes", "500", "exceeds 500"),
        ("--max-memo", "10", "exceeds 10"),
        ("--max-nodes", "60", "exceeds 60"),
    ] {
        let (code, _, err) = run(&[&"inspect", &path, &flag, &value]);
        assert_eq!(code, 3, "{flag} {value}: {err}");
        assert!(err.contains(says), "{flag} {value}: {err}");
        // Raised above what the file needs, the same limit lets it through.
        let (code, _, err) = run(&[&"inspect", &path, &flag, &"100000"]);
        assert_eq!(code, 0, "{flag} 100000: {err}");
    }
    let (code, _, err) = run(&[&"inspect", &path, &"--trusted", &"--max-depth", &"8"]);
    assert_eq!(code, 3, "--trusted keeps an explicit depth: {err}");
}

/// The format caps' flags (`--max-header-bytes`, `--max-data-header-bytes`, `--max-metadata-bytes`,
/// `--max-inflated-bytes`): lowered below what a checkpoint needs, the command fails with exit 3 (bad input)
/// and the limit's own message; raised, the same command succeeds.
#[test]
fn each_format_cap_flag_is_enforced_with_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.pt");
    ckpt_conformance::crash::save("torch", &src, 1, 1).unwrap();
    let st = dir.path().join("m.safetensors");
    let dcp = dir.path().join("dcp");
    for (dst, to) in [(&st, "safetensors"), (&dcp, "distcp")] {
        let (code, _, err) = run(&[&"convert", &src, dst, &"--to", &to]);
        assert_eq!(code, 0, "{to}: {err}");
    }
    let recis = dir.path().join("recis");
    let ids = Tensor::from_slice(&[3i64, 70_000, -5, 12], &[4]).unwrap();
    let emb = Tensor::from_slice(&[0.5f32; 8], &[4, 2]).unwrap();
    let sd = Value::dict([("tbl@id", Value::Tensor(ids)), ("tbl@embedding", Value::Tensor(emb))]);
    ckpt::recis::save(&sd, &recis, &ckpt::recis::WriteOptions::default()).unwrap();
    let zstd = dir.path().join("zstd");
    let sd = Value::dict([("blob", Value::Bytes(vec![7; 1 << 20]))]);
    ckpt::distcp::save(&sd, &zstd, &ckpt::distcp::WriteOptions::default().with_zstd(3)).unwrap();
    let back = dir.path().join("back.pt");
    let dcp3 = dir.path().join("dcp3");
    type Arg<'a> = &'a dyn AsRef<std::ffi::OsStr>;
    let cases: [(Vec<Arg<'_>>, &str, &str, &str); 6] = [
        (vec![&"inspect", &st], "--max-header-bytes", "64", "exceeds the limit of 64 bytes (max_header_bytes"),
        (vec![&"convert", &st, &back, &"--to", &"torch"], "--max-header-bytes", "64", "(max_header_bytes"),
        (vec![&"verify", &dcp], "--max-metadata-bytes", "100", "over the limit of 100 bytes (max_metadata_bytes)"),
        (vec![&"reshard", &dcp, &dcp3, &"--world-size", &"3"], "--max-metadata-bytes", "100", "max_metadata_bytes"),
        (vec![&"inspect", &recis], "--max-data-header-bytes", "32", "exceeds the limit of 32 bytes"),
        (vec![&"cat", &zstd, &"blob"], "--max-inflated-bytes", "65536", "decompresses to more than 65536 bytes"),
    ];
    for (args, flag, value, says) in cases {
        let mut tight = args.clone();
        tight.extend([&flag as Arg<'_>, &value]);
        let (code, out, err) = run(&tight);
        assert_eq!(code, 3, "{flag} {value}: {out}{err}");
        assert!(err.contains(says), "{flag} {value}: {err}");
        let mut raised = args.clone();
        raised.extend([&flag as Arg<'_>, &"16777216"]);
        let (code, out, err) = run(&raised);
        assert_eq!(code, 0, "{flag} 16777216: {out}{err}");
    }
}

/// An option that does not apply to the source or the target is refused (exit 2) with the reason, and
/// nothing is written: a world size to a torch target, a DeepSpeed tag and a Megatron name map to a DCP
/// source (issue 40).
#[test]
fn options_that_do_not_apply_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dcp = fixtures().join("distcp/golden/d215");
    let dst = tmp.path().join("out.pt");
    let cases: [(&[&str], &str); 4] = [
        (&["--to", "torch", "--world-size", "4"], "option --world-size does not apply: a torch target has no ranks"),
        (
            &["--to", "torch", "--tag", "global_step2"],
            "option --tag does not apply: it is read by deepspeed sources alone",
        ),
        (
            &["--to", "torch", "--name-map", "llama"],
            "option --name-map does not apply: it is read by megatron sources alone",
        ),
        (
            &["--to", "torch", "--hfai-large-size", "16"],
            "option --hfai-large-size does not apply: it is an option of hfai targets",
        ),
    ];
    for (flags, said) in cases {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"convert", &dcp, &dst];
        args.extend(flags.iter().map(|f| f as &dyn AsRef<std::ffi::OsStr>));
        let (code, out, err) = run(&args);
        assert_eq!(code, 2, "{flags:?}: {out}{err}");
        assert!(err.contains(said), "{flags:?}: {err}");
        assert!(!dst.exists(), "{flags:?}");
    }
    // Reading commands too: inspect with a tag on a DCP checkpoint.
    let (code, _, err) = run(&[&"inspect", &dcp, &"--tag", &"global_step2"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("this source is distcp"), "{err}");
    // reshard's sources (distcp, hfai, recis) take no source flag.
    let (code, _, err) = run(&[&"reshard", &dcp, &tmp.path().join("r"), &"--world-size", &"2", &"--unstack-layers"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("option --unstack-layers does not apply"), "{err}");
    assert!(!tmp.path().join("r").exists());
    // Where they apply they are taken: a tag on a DeepSpeed root, a world size on a sharded target.
    let ds = fixtures().join("deepspeed/zero2_w2");
    let (code, out, err) = run(&[&"inspect", &ds, &"--tag", &"global_step2"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(&[&"convert", &dcp, &tmp.path().join("d4"), &"--to", &"distcp", &"--world-size", &"4"]);
    assert_eq!(code, 0, "{out}{err}");
}
