//! Nothing dropped in silence (issue 41, point 2): a selection that selects nothing is refused with the
//! nearest names, in every place a selection applies; a conversion names in its summary's `dropped` every
//! entry the target cannot hold; what the target can hold is converted, a DeepSpeed or Megatron checkpoint to
//! torch keeping what `ckpt inspect` lists, so that `ckpt diff` finds it equal.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ckpt::tensor::{Tensor, Value};
use ckpt::{ConvertOptions, Error, Fault, Format, Selection};

fn fixtures(format: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/fixtures").join(format)
}

/// Runs `ckpt args...`: (exit code, stdout, stderr).
fn ckpt(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ckpt")).args(args).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn names(path: &Path) -> Vec<String> {
    ckpt::open(path).unwrap().entries().into_iter().map(|e| e.name).collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn select(include: &[&str], exclude: &[&str]) -> ConvertOptions {
    let mut s = Selection::default();
    for i in include {
        s = s.with_include(i);
    }
    for e in exclude {
        s = s.with_exclude(e);
    }
    ConvertOptions::default().with_selection(s)
}

/// The error of an empty selection: (unmatched patterns, entries removed by the excludes, nearest names).
fn empty_selection(e: Error) -> (Vec<String>, usize, Vec<String>) {
    assert_eq!(e.fault(), Fault::InvalidArgument, "{e}");
    match e {
        Error::EmptySelection { unmatched, removed, nearest, .. } => (unmatched, removed, nearest),
        other => panic!("not an empty selection: {other}"),
    }
}

#[test]
fn a_selection_that_matches_nothing_is_refused_with_the_nearest_names() {
    let tmp = tempfile::tempdir().unwrap();
    let d215 = fixtures("distcp/golden/d215");
    let dst = tmp.path().join("nm.pt");
    let e = ckpt::convert(&d215, None, &dst, Format::Torch, &select(&["nomatch*"], &[])).unwrap_err();
    let text = e.to_string();
    let (unmatched, removed, nearest) = empty_selection(e);
    assert_eq!((unmatched, removed), (vec!["nomatch*".to_owned()], 0));
    assert!(!nearest.is_empty() && nearest.iter().all(|n| names(&d215).contains(n)), "{nearest:?}");
    assert!(text.contains("\"nomatch*\" matches no entry") && text.contains(&nearest[0]), "{text}");
    assert!(!dst.exists(), "nothing written");

    // One include that matches and one that does not (a typo): refused, naming the typo alone.
    let e = ckpt::convert(&d215, None, &dst, Format::Torch, &select(&["row", "stat_dict.*"], &[])).unwrap_err();
    let (unmatched, _, nearest) = empty_selection(e);
    assert_eq!(unmatched, ["stat_dict.*"]);
    assert!(!nearest.is_empty(), "{nearest:?}");

    // Includes that match, excludes that remove all of it: the same error, saying so.
    let e = ckpt::convert(&d215, None, &dst, Format::Safetensors, &select(&["row"], &["r*"])).unwrap_err();
    assert!(
        e.to_string().contains("exclude patterns remove every entry the selection would otherwise keep (1)"),
        "{e}"
    );
    assert_eq!(empty_selection(e), (Vec::new(), 1, Vec::new()));
    let all = names(&d215).len();
    let e = ckpt::convert(&d215, None, &dst, Format::Distcp, &select(&[], &["*"])).unwrap_err();
    assert_eq!(empty_selection(e).1, all);

    // The library's state dict (Python's `ckpt.load`) and `save` (a state dict in memory).
    let e = ckpt::state_dict(&d215, &Selection::default().with_include("nomatch*"), &Default::default()).unwrap_err();
    assert_eq!(empty_selection(e).0, ["nomatch*"]);
    let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32], &[1]).unwrap())), ("step", Value::Int(3))]);
    let e = ckpt::save(&sd, tmp.path().join("s.pt"), Format::Torch, &select(&["wieght"], &[])).unwrap_err();
    let (_, _, nearest) = empty_selection(e);
    assert_eq!(nearest[0], "w");
    // A selection that selects something still converts.
    ckpt::convert(&d215, None, &dst, Format::Torch, &select(&["row"], &["nothing-like-this"])).unwrap();
    assert_eq!(names(&dst), ["row"]);
}

#[test]
fn cli_an_empty_selection_exits_2_with_the_nearest_names() {
    let tmp = tempfile::tempdir().unwrap();
    let d215 = fixtures("distcp/golden/d215");
    let dst = tmp.path().join("nm.pt");
    let (code, out, err) = ckpt(&[&"convert", &d215, &dst, &"--to", &"torch", &"--include", &"nomatch*"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("\"nomatch*\" matches no entry") && err.contains("nearest names"), "{err}");
    assert!(!dst.exists());
    // inspect --include filters: the same rule.
    let (code, _, err) = ckpt(&[&"inspect", &d215, &"--include", &"rwo"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"rwo\" matches no entry") && err.contains("row"), "{err}");
    let (code, _, err) = ckpt(&[&"inspect", &d215, &"--exclude", &"*"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("exclude patterns remove every entry"), "{err}");
    let (code, out, _) = ckpt(&[&"inspect", &d215, &"--include", &"row"]);
    assert_eq!(code, 0);
    assert!(out.contains("row"), "{out}");
}

/// The names of a DeepSpeed or Megatron checkpoint converted to torch are the names `inspect` lists, and
/// `diff` finds the conversion equal to its source.
fn keeps_everything(src: &Path, dst: &Path) {
    let summary = ckpt::convert(src, None, dst, Format::Torch, &ConvertOptions::default()).unwrap();
    assert!(summary.dropped.is_empty(), "{:?}", summary.dropped);
    let listed = names(src);
    assert_eq!(summary.tensors + summary.values, listed.len(), "{}", src.display());
    // Each listed entry is there under its name (a value Megatron lists whole, `[None]`, a torch file lists
    // by its items: `<name>.0`).
    let converted = names(dst);
    for n in &listed {
        let there = converted.iter().any(|c| c == n || c.strip_prefix(n.as_str()).is_some_and(|r| r.starts_with('.')));
        assert!(there, "{}: {n} not in {converted:?}", src.display());
    }
    let report = ckpt::diff::diff(src, dst, &Default::default()).unwrap();
    assert!(report.is_equal(), "{}: {report:?}", src.display());
    assert!(report.layout_a.keys.is_empty(), "{:?}", report.layout_a.keys);
}

#[test]
fn deepspeed_and_megatron_to_torch_keep_what_inspect_lists() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, src) in [
        fixtures("deepspeed/zero3_w2"),
        fixtures("deepspeed/zero2_w2"),
        fixtures("deepspeed/universal_zero2_w2"),
        fixtures("deepspeed_bf16/bf16_optimizer_w2"),
        fixtures("megatron/gpt_tp2/ckpt"),
    ]
    .iter()
    .enumerate()
    {
        keeps_everything(src, &tmp.path().join(format!("{i}.pt")));
    }
    // The names inspect lists select: the optimizer state alone.
    let zero3 = fixtures("deepspeed/zero3_w2");
    let opt = tmp.path().join("opt.pt");
    let s = ckpt::convert(&zero3, None, &opt, Format::Torch, &select(&["optimizer.*"], &[])).unwrap();
    let want: Vec<String> = names(&zero3).into_iter().filter(|n| n.starts_with("optimizer.")).collect();
    assert!(s.tensors > 0 && want.iter().any(|n| n.starts_with("optimizer.state.")), "{want:?}");
    assert_eq!(sorted(names(&opt)), sorted(want));
    // --model-only: the consolidated weights, what zero_to_fp32 writes.
    let model = tmp.path().join("model.pt");
    let only = ConvertOptions::default().with_source(ckpt::SourceOptions::default().with_model_only(true));
    ckpt::convert(&zero3, None, &model, Format::Torch, &only).unwrap();
    let zero = ckpt::deepspeed::DeepSpeedReader::open(&zero3).unwrap();
    let weights: Vec<String> = zero.model().iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(sorted(names(&model)), sorted(weights));
}

#[test]
fn cli_deepspeed_to_torch_keeps_everything_and_diffs_equal() {
    let tmp = tempfile::tempdir().unwrap();
    let zero3 = fixtures("deepspeed/zero3_w2");
    let out = tmp.path().join("out.pt");
    let (code, stdout, err) = ckpt(&[&"convert", &zero3, &out, &"--to", &"torch"]);
    assert_eq!(code, 0, "{err}");
    let (tensors, values) = ckpt::open(&zero3)
        .unwrap()
        .entries()
        .iter()
        .fold((0, 0), |(t, v), e| if e.tensor_info().is_some() { (t + 1, v) } else { (t, v + 1) });
    assert!(stdout.contains(&format!("{tensors} tensors")) && stdout.contains(&format!("{values} values")), "{stdout}");
    assert!(!stdout.contains("cannot hold"), "{stdout}");
    let (code, stdout, err) = ckpt(&[&"diff", &zero3, &out]);
    assert_eq!(code, 0, "{stdout}{err}");
}

/// A state dict with tensors, values of every kind and an optimizer, saved as a `.pt` file.
fn training_pt(dir: &Path) -> PathBuf {
    let t = |v: &[f32]| Value::Tensor(Tensor::from_slice(v, &[v.len()]).unwrap());
    let sd = Value::dict([
        ("model", Value::dict([("w", t(&[1.0, 2.0, 3.0, 4.0])), ("b", t(&[0.5]))])),
        ("epoch", Value::Int(3)),
        ("note", Value::Str("warm".into())),
    ]);
    let path = dir.join("train.pt");
    ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
    path
}

/// Every target a `.pt` source converts to, with exactly what each drops.
#[test]
fn dropped_names_exactly_what_each_target_cannot_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let pt = training_pt(tmp.path());
    let none: &[&str] = &[];
    for (to, file, want) in [
        (Format::Torch, "a.pt", none),
        (Format::Safetensors, "a.safetensors", none),
        (Format::Hf, "hf", none),
        (Format::Distcp, "dcp", none),
        (Format::Hfai, "hfai", none),
        (Format::Recis, "recis", none),
        // GGUF holds tensors (and a GGUF source's metadata) only.
        (Format::Gguf, "a.gguf", &["epoch", "note"][..]),
    ] {
        let s = ckpt::convert(&pt, None, tmp.path().join(file), to, &ConvertOptions::default())
            .unwrap_or_else(|e| panic!("{to}: {e}"));
        assert_eq!(s.dropped, want, "{to}");
    }
    // A quantized tensor: DCP saves dense tensors only.
    let q = fixtures("composite/quantized.pt");
    let s = ckpt::convert(&q, None, tmp.path().join("qdcp"), Format::Distcp, &ConvertOptions::default()).unwrap();
    let composite: Vec<String> = ckpt::open(&q)
        .unwrap()
        .entries()
        .into_iter()
        .filter(|e| matches!(e.kind, ckpt::tensor::EntryKind::Composite(_)))
        .map(|e| e.name)
        .collect();
    assert!(!composite.is_empty());
    assert_eq!(s.dropped, composite);
}

#[test]
fn cli_names_the_dropped_entries_and_verbose_lists_all() {
    let tmp = tempfile::tempdir().unwrap();
    let pt = training_pt(tmp.path());
    let gguf = tmp.path().join("a.gguf");
    let (code, out, err) = ckpt(&[&"convert", &pt, &gguf, &"--to", &"gguf"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("dropped 2 entries a gguf checkpoint cannot hold: epoch, note\n"), "{out}");
    let (code, out, err) = ckpt(&[&"convert", &pt, &gguf, &"--to", &"gguf", &"--verbose"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("dropped 2 entries a gguf checkpoint cannot hold:\n  epoch\n  note\n"), "{out}");
    // More than the line shows: the first names, and --verbose for the rest.
    let mut items: Vec<(String, Value)> = (0..20).map(|i| (format!("v{i:02}"), Value::Int(i))).collect();
    items.push(("w".into(), Value::Tensor(Tensor::from_slice(&[1.0f32], &[1]).unwrap())));
    let sd = Value::dict(items);
    let many = tmp.path().join("many.pt");
    ckpt::torch::save(&sd, &many, &ckpt::torch::WriteOptions::default()).unwrap();
    let (code, out, err) = ckpt(&[&"convert", &many, &gguf, &"--to", &"gguf"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("dropped 20 entries a gguf checkpoint cannot hold: v00, v01,")
            && out.contains("v11, ... (--verbose lists all)"),
        "{out}"
    );
    assert!(!out.contains("v12"), "{out}");
}
