//! Quantized, sparse and nested tensors as entries (issue 39, point 5; `conformance/fixtures/composite/`,
//! written by torch 2.13): each lists with its layout, dtype and dense shape, its components read equal to
//! what torch's accessors give (`int_repr()`, `q_per_channel_scales()`, `crow_indices()`, ...), its dense form
//! equal to `dequantize()` / `to_dense()` bit for bit; every fixture verifies deep, converts to safetensors
//! (`<name>`, `<name>.scale`, `<name>.zero_point`, `<name>.indices`, ... as `safetensors` loads them) and back
//! to a `torch.save` file that `torch.load` reads equal to the source (`conformance/python/check_composite.py`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use ckpt::tensor::{Composite, Layout};
use ckpt::{ConvertOptions, EntryKind, Format, Selection, Value, convert};
use ckpt_conformance::{fixtures, run_python};

const FILES: [&str; 3] = ["quantized.pt", "sparse.pt", "nested.pt"];

fn fixture(name: &str) -> PathBuf {
    fixtures("composite").join(name)
}

fn manifest(file: &str) -> serde_json::Map<String, serde_json::Value> {
    let stem = Path::new(file).file_stem().unwrap().to_string_lossy().into_owned();
    let text = std::fs::read_to_string(fixture(&format!("{stem}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A tensor against a manifest record (dtype, shape, hex of the contiguous bytes).
fn assert_record(t: &ckpt::Tensor, record: &serde_json::Value, what: &str) {
    let shape: Vec<usize> = record["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
    assert_eq!(t.dtype().torch_name(), record["dtype"].as_str().unwrap(), "{what}: dtype");
    assert_eq!(t.shape(), shape.as_slice(), "{what}: shape");
    assert_eq!(hex(&t.to_contiguous().unwrap().data().unwrap()), record["hex"].as_str().unwrap(), "{what}: values");
}

fn composite(ck: &ckpt::Checkpoint, name: &str) -> Composite {
    match ck.value(name).unwrap() {
        Value::Composite(c) => *c,
        other => panic!("{name}: {other:?}"),
    }
}

/// Every entry of `path` against the manifest of `file` (components and dense forms included).
fn assert_as_manifest(path: &Path, file: &str) -> usize {
    let ck = ckpt::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let entries = ck.entries();
    let want = manifest(file);
    let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, want.keys().map(String::as_str).collect::<Vec<_>>(), "{}", path.display());
    let mut composites = 0;
    for e in &entries {
        let m = &want[&e.name];
        let what = format!("{}: {}", path.display(), e.name);
        if let Some(dense) = m.get("dense") {
            assert_record(&ck.tensor(&e.name).unwrap(), dense, &what);
            continue;
        }
        composites += 1;
        let EntryKind::Composite(info) = &e.kind else { panic!("{what}: listed as {:?}", e.kind) };
        let shape: Vec<usize> = m["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        assert_eq!(info.layout.name(), m["layout"].as_str().unwrap(), "{what}");
        assert_eq!((info.dtype.torch_name(), &info.shape), (m["dtype"].as_str().unwrap(), &shape), "{what}");
        let c = composite(&ck, &e.name);
        assert_eq!(c.axis, m.get("axis").map(|a| a.as_u64().unwrap() as usize), "{what}: axis");
        assert_eq!(c.coalesced, m.get("coalesced").map(|a| a.as_bool().unwrap()), "{what}: coalesced");
        let parts = m["components"].as_object().unwrap();
        let mut names = c.layout.components().to_vec();
        names.sort_unstable();
        assert_eq!(names, parts.keys().map(String::as_str).collect::<Vec<_>>(), "{what}: components");
        for (name, t) in c.named_components() {
            assert_record(t, &parts[name], &format!("{what}.{name}"));
        }
        match &m["to_dense"] {
            serde_json::Value::Null => {
                let err = c.to_dense().unwrap_err();
                assert_eq!(err.fault(), ckpt::Fault::Unsupported, "{what}: {err}");
            }
            dense => assert_record(&c.to_dense().unwrap(), dense, &format!("{what} (dense)")),
        }
        // Asked for as a dense tensor, the error names the layout.
        let err = ck.tensor(&e.name).unwrap_err();
        assert!(err.to_string().contains(c.layout.name()), "{what}: {err}");
    }
    composites
}

#[test]
fn entries_and_components_read_as_torch_gives_them() {
    let mut composites = 0;
    for file in FILES {
        composites += assert_as_manifest(&fixture(file), file);
    }
    assert_eq!(composites, 5 + 8 + 2);
    // Every layout is among them.
    let mut seen: Vec<Layout> = Vec::new();
    for file in FILES {
        let ck = ckpt::open(fixture(file)).unwrap();
        seen.extend(ck.entries().iter().filter_map(|e| match &e.kind {
            EntryKind::Composite(c) => Some(c.layout),
            _ => None,
        }));
    }
    assert!(Layout::ALL.iter().all(|l| seen.contains(l)), "{seen:?}");
}

/// Runs the `ckpt` tool; returns (exit code, stdout and stderr).
fn ckpt_tool(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ckpt"));
    for a in args {
        cmd.arg(a);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn the_tool_inspects_verifies_converts_and_diffs_every_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    for file in FILES {
        let src = fixture(file);
        let (code, out) = ckpt_tool(&[&"inspect", &src]);
        assert_eq!(code, 0, "{file}: {out}");
        let (code, out) = ckpt_tool(&[&"verify", &"--deep", &src]);
        assert_eq!(code, 0, "{file}: {out}");
        // To safetensors: the components under their names, as `safetensors` loads them.
        let st = tmp.path().join(format!("{file}.safetensors"));
        let (code, out) = ckpt_tool(&[&"convert", &src, &st, &"--to", &"safetensors"]);
        assert_eq!(code, 0, "{file}: {out}");
        let (code, out) = ckpt_tool(&[&"verify", &"--deep", &st]);
        assert_eq!(code, 0, "{file}: {out}");
        assert_eq!(assert_as_manifest(&st, file), assert_as_manifest(&src, file), "{file}");
        run_python("check_composite.py", &["safetensors".as_ref(), &src, &st]);
        // Back to torch, and straight to torch: torch.load gives tensors equal to the source's.
        for (from, name) in [(&st, "back"), (&src, "copy")] {
            let pt = tmp.path().join(format!("{file}.{name}.pt"));
            let (code, out) = ckpt_tool(&[&"convert", from, &pt, &"--to", &"torch"]);
            assert_eq!(code, 0, "{file}: {out}");
            let (code, out) = ckpt_tool(&[&"diff", &src, &pt]);
            assert_eq!(code, 0, "{file}: {out}");
            assert!(out.starts_with("equal"), "{file}: {out}");
            assert_as_manifest(&pt, file);
            run_python("check_composite.py", &["torch".as_ref(), &src, &pt]);
        }
        let (code, out) = ckpt_tool(&[&"diff", &src, &st]);
        assert_eq!(code, 0, "{file}: {out}");
    }
}

#[test]
fn inspect_and_cat_show_layout_dtype_shape_and_components() {
    let (code, out) = ckpt_tool(&[&"inspect", &fixture("quantized.pt")]);
    assert_eq!(code, 0, "{out}");
    let line = out.lines().find(|l| l.starts_with("q_channel ")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("qint8 (per_channel_affine)") && line.contains("[2, 3]"), "{line}");
    let (code, out) = ckpt_tool(&[&"inspect", &fixture("nested.pt")]);
    assert_eq!(code, 0, "{out}");
    let line = out.lines().find(|l| l.starts_with("nested ")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("float32 (nested)") && line.contains("[3] (buffer [18], sizes [3, 2])"), "{line}");
    let (code, out) = ckpt_tool(&[&"inspect", &"--json", &fixture("sparse.pt")]);
    assert_eq!(code, 0, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let bsr = json["entries"].as_array().unwrap().iter().find(|e| e["name"] == "bsr").unwrap();
    assert_eq!((bsr["layout"].as_str(), bsr["dtype"].as_str()), (Some("sparse_bsr"), Some("float32")));
    let names: Vec<&str> = bsr["components"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["crow_indices", "col_indices", "values"]);

    let (code, out) = ckpt_tool(&[&"cat", &fixture("quantized.pt"), &"q_channel"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("qint8 per_channel_affine tensor of shape [2, 3] (axis 1)\nint_repr: [[-8, 3, -2],"),
        "{out}"
    );
    assert!(out.contains("\nscale: [0.1000, 0.3000, 0.7000]") && out.contains("\nzero_point: [0, 2, -1]"), "{out}");
    let (code, out) = ckpt_tool(&[&"cat", &fixture("sparse.pt"), &"coo_uncoalesced"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\nindices: [[0, 1, 2, 0],"), "{out}");
}

#[test]
fn dense_makes_quantized_and_sparse_tensors_dense_as_torch_does() {
    let tmp = tempfile::tempdir().unwrap();
    for file in ["quantized.pt", "sparse.pt"] {
        let src = fixture(file);
        let st = tmp.path().join(format!("{file}.dense.safetensors"));
        let (code, out) = ckpt_tool(&[&"convert", &src, &st, &"--to", &"safetensors", &"--dense"]);
        assert_eq!(code, 0, "{file}: {out}");
        run_python("check_composite.py", &["dense".as_ref(), &src, &st]);
        // The library's option does the same.
        let st2 = tmp.path().join(format!("{file}.dense2.safetensors"));
        let options = ConvertOptions::default().with_selection(Selection::default().with_dense());
        let summary = convert(&src, None, &st2, Format::Safetensors, &options).unwrap();
        assert_eq!(summary.tensors, manifest(file).len(), "{file}");
        let d = ckpt::diff(&st, &st2, &ckpt::DiffOptions::default().with_atol(0.0).with_rtol(0.0)).unwrap();
        assert!(d.is_equal() && d.tensors.len() == manifest(file).len(), "{file}: {d:?}");
    }
    // A nested tensor has no dense form: refused, naming it.
    let st = tmp.path().join("nested.dense.safetensors");
    let (code, out) = ckpt_tool(&[&"convert", &fixture("nested.pt"), &st, &"--to", &"safetensors", &"--dense"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("a nested tensor has no dense form"), "{out}");
    assert!(!st.exists());
}
