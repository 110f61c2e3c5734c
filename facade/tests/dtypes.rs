//! Every dtype torch and safetensors have (issue 39, point 4; `conformance/fixtures/dtypes/`, written by torch
//! 2.13, `safetensors` and `dcp.save` through `conformance/python/dtypes/make_fixtures.py`): `float4_e2m1fn_x2`
//! ↔ `F4` (the last dimension doubled as safetensors counts it), `F6_E2M3`/`F6_E3M2` (ckpt's
//! `float6_e*_x4`, bytes kept), `float8_e8m0fnu` ↔ `F8_E8M0`, the FNUZ float8s, `uint16/32/64` and
//! `complex32`. Each fixture reads as the real software reads it (dtype, shape, bytes); each converts to
//! `.pt`, safetensors, HF shards, DCP and hfai and back without a changed dtype or byte, and what ckpt wrote
//! loads in torch, `safetensors` and `dcp` as they wrote it; `diff` compares the packed ones bitwise; the
//! tool inspects, verifies, converts and diffs every fixture; a truncated FP4 file is refused naming the
//! tensor and its bytes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::{ConvertOptions, DiffOptions, EntryKind, Format, TargetOptions, convert};
use ckpt_conformance::{fixtures, run_python};
use ckpt_safetensors::header::HeaderError;
use sha2::{Digest, Sha256};

/// The fixtures that hold tensors, as the manifest names them.
const FILES: [&str; 4] = ["dtypes.pt", "dtypes.safetensors", "f6.safetensors", "dcp"];

fn fixture(name: &str) -> PathBuf {
    fixtures("dtypes").join(name)
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// (dtype, shape, sha256) of every tensor, by name.
type Tensors = BTreeMap<String, (String, Vec<usize>, String)>;

fn records(tensors: &serde_json::Value) -> Tensors {
    let record = |t: &serde_json::Value| {
        let shape = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        (t["dtype"].as_str().unwrap().to_owned(), shape, t["sha256"].as_str().unwrap().to_owned())
    };
    tensors.as_object().unwrap().iter().map(|(name, t)| (name.clone(), record(t))).collect()
}

fn manifest() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("manifest.json")).unwrap()).unwrap()
}

/// The tensors the manifest lists for `file`, as the software that wrote it reads them.
fn expected(file: &str) -> Tensors {
    records(&manifest()["files"][file]["tensors"])
}

/// The tensors ckpt lists in the checkpoint at `path`, read back.
fn listed(path: &Path) -> Tensors {
    let ck = ckpt::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Tensors::new();
    for e in ck.entries() {
        if let EntryKind::Tensor(info) = &e.kind {
            let t = ck.tensor(&e.name).unwrap_or_else(|err| panic!("{}: {}: {err}", path.display(), e.name));
            let t = t.to_contiguous().unwrap();
            let digest = sha(&t.data().unwrap());
            out.insert(e.name.clone(), (info.dtype.torch_name().to_owned(), info.shape.clone(), digest));
        }
    }
    out
}

/// The options of a conversion to `to`: Hugging Face shards of at most 1 KB (several shards and an index).
fn options(to: Format) -> ConvertOptions {
    match to {
        Format::Hf => ConvertOptions::default().with_target(TargetOptions::Hf { max_shard_size: Some(1024) }),
        _ => ConvertOptions::default(),
    }
}

/// What the real software reads in a file ckpt wrote (`check_load.py`: torch, safetensors, dcp).
fn loaded_by_python(kind: &str, path: &Path) -> serde_json::Value {
    let out = run_python("dtypes/check_load.py", &[kind.as_ref(), path]);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{kind} {}: {e}: {out}", path.display()))
}

/// The first error of `e`'s chain that is a safetensors header error.
fn header_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a HeaderError> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<HeaderError>() {
            return Some(h);
        }
        if let Some(core) = err.downcast_ref::<ckpt::tensor::Error>()
            && let Some(h) = core.format_error::<HeaderError>()
        {
            return Some(h);
        }
        cur = err.source();
    }
    None
}

#[test]
fn each_fixture_reads_as_the_real_software_reads_it() {
    for file in FILES {
        let want = expected(file);
        assert!(want.len() >= 3, "{file}: the manifest lists {} tensors", want.len());
        assert_eq!(listed(&fixture(file)), want, "{file}");
    }
    // The packed shapes: torch's and safetensors' counts of the same bytes.
    let m = manifest();
    let f4 = &m["files"]["dtypes.safetensors"]["tensors"]["float4_e2m1fn_x2"];
    assert_eq!(
        (f4["safetensors"]["dtype"].as_str(), f4["safetensors"]["shape"].clone()),
        (Some("F4"), serde_json::json!([8, 64]))
    );
    assert_eq!(expected("dtypes.safetensors")["float4_e2m1fn_x2"].1, [8, 32]);
    assert_eq!(expected("f6.safetensors")["w_e2m3"].1, [2, 2]);
    // The torch file, the safetensors file and the DCP checkpoint hold the same bytes for each dtype.
    let pt = expected("dtypes.pt");
    for (name, rec) in expected("dtypes.safetensors") {
        assert_eq!(pt[&name], rec, "{name}");
    }
    assert_eq!(expected("dcp"), pt);
}

#[test]
fn truncated_fp4_data_is_refused_naming_the_tensor_and_its_bytes() {
    let path = fixture("f4_truncated.safetensors");
    let e = ckpt::open(&path).map(|_| ()).unwrap_err();
    let h = header_error(&e).unwrap_or_else(|| panic!("not a header error: {e}"));
    assert!(matches!(h, HeaderError::BadOffsets { name, .. } if name == "float4_e2m1fn_x2"), "{h}");
    let text = ckpt::error_chain(&e, ": ");
    assert!(text.contains("run past the") && text.contains("f4_truncated.safetensors"), "{text}");
    assert_eq!(e.fault(), ckpt::Fault::Malformed, "{text}");
    let (code, _, err) = ckpt_tool(&[&"inspect", &path]);
    assert_ne!(code, 0);
    assert!(err.contains("float4_e2m1fn_x2") && err.contains("data_offsets"), "{err}");
}

#[test]
fn every_format_keeps_each_dtype_and_its_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("dtypes.pt");
    let want = listed(&src);
    for (to, name, python) in [
        (Format::Torch, "out.pt", Some("pt")),
        (Format::Safetensors, "out.safetensors", Some("safetensors")),
        (Format::Hf, "hf", Some("hf")),
        (Format::Distcp, "dcp", Some("dcp")),
        (Format::Hfai, "hfai", None),
    ] {
        let dst = tmp.path().join(name);
        convert(&src, None, &dst, to, &options(to)).unwrap_or_else(|e| panic!("{to:?}: {e}"));
        // hfai holds a flat state dict as its `model`: the tensors are `model.<name>`.
        let prefix = if to == Format::Hfai { "model." } else { "" };
        let renamed: Tensors = want.iter().map(|(n, r)| (format!("{prefix}{n}"), r.clone())).collect();
        assert_eq!(listed(&dst), renamed, "{to:?}");
        if to == Format::Hf {
            let shards = std::fs::read_dir(&dst)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().extension() == Some("safetensors".as_ref()));
            assert!(shards.count() > 1, "several shards");
        }
        // And back to a torch file: every dtype and byte as torch wrote them.
        let back = tmp.path().join(format!("{name}.back.pt"));
        let strip = ckpt::Selection::default().with_strip_prefix(prefix);
        convert(&dst, None, &back, Format::Torch, &ConvertOptions::default().with_selection(strip)).unwrap();
        assert_eq!(listed(&back), want, "{to:?} back to torch");
        let d = ckpt::diff(&src, &back, &DiffOptions::default().with_atol(0.0).with_rtol(0.0)).unwrap();
        // (hfai adds its `__nshards__` and `__version__` values beside the tensors)
        assert!(d.only_a.is_empty() && d.tensors.len() == want.len(), "{to:?}: {d:?}");
        assert!(d.tensors.iter().all(|t| t.is_equal()), "{to:?}: {d:?}");
        let Some(kind) = python else { continue };
        let got = loaded_by_python(kind, &dst);
        match kind {
            // safetensors has no complex32: ckpt stores it as its float16 pairs (the dtype in its metadata).
            "safetensors" | "hf" => {
                let pt = expected("dtypes.pt");
                let st = expected("dtypes.safetensors");
                assert_eq!(records(&got).into_iter().filter(|(n, _)| n != "complex32").collect::<Tensors>(), st);
                assert_eq!(got["complex32"]["dtype"], "float16");
                assert_eq!(got["complex32"]["sha256"].as_str(), Some(pt["complex32"].2.as_str()));
                assert_eq!(
                    got["float4_e2m1fn_x2"]["safetensors"],
                    serde_json::json!({"dtype": "F4", "shape": [8, 64]})
                );
            }
            _ => assert_eq!(records(&got), expected("dtypes.pt"), "{kind}"),
        }
    }
}

#[test]
fn float6_stays_in_safetensors_and_is_refused_where_torch_has_no_dtype() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("f6.safetensors");
    let want = listed(&src);
    for (to, name) in [(Format::Safetensors, "out.safetensors"), (Format::Hf, "hf")] {
        let dst = tmp.path().join(name);
        convert(&src, None, &dst, to, &options(to)).unwrap_or_else(|e| panic!("{to:?}: {e}"));
        assert_eq!(listed(&dst), want, "{to:?}");
    }
    // ckpt's safetensors writer lays F6 out as the `safetensors` crate does: the header the fixture has.
    let written = ckpt_safetensors::header::read_file(&tmp.path().join("out.safetensors"), u64::MAX).unwrap();
    let original = ckpt_safetensors::header::read_file(&src, u64::MAX).unwrap();
    let codes = |h: &ckpt_safetensors::header::Header| {
        h.entries
            .iter()
            .map(|e| (e.name.clone(), e.dtype_code.clone(), e.shape.clone(), e.data_offsets))
            .collect::<Vec<_>>()
    };
    assert_eq!(codes(&written), codes(&original));
    for (to, name) in [(Format::Torch, "out.pt"), (Format::Distcp, "dcp"), (Format::Hfai, "hfai")] {
        let e = convert(&src, None, tmp.path().join(name), to, &ConvertOptions::default()).unwrap_err();
        let text = ckpt::error_chain(&e, ": ");
        assert!(text.contains("torch has no dtype") && text.contains("F6_E"), "{to:?}: {text}");
    }
}

#[test]
fn diff_compares_packed_dtypes_bitwise() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("dtypes.safetensors");
    // The FP4 tensor's data ends the file (safetensors sorts F4 last): flip one bit of one value.
    let mut bytes = std::fs::read(&src).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    let changed = tmp.path().join("changed.safetensors");
    std::fs::write(&changed, &bytes).unwrap();
    let d = ckpt::diff(&src, &changed, &DiffOptions::default()).unwrap();
    let f4: Vec<_> = d.tensors.iter().filter(|t| !t.is_equal()).collect();
    assert_eq!(f4.len(), 1, "{d:?}");
    assert_eq!((f4[0].name.as_str(), f4[0].mismatched, f4[0].bytewise), ("float4_e2m1fn_x2", 1, true));
    assert!(ckpt::diff(fixture("dtypes.pt"), &src, &DiffOptions::default()).unwrap().only_a == ["complex32"]);
}

#[test]
fn casts_refuse_fp4_and_fp6_as_torch_does() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, _, err) = ckpt_tool(&[
        &"convert",
        &fixture("dtypes.pt"),
        &tmp.path().join("bf16.pt"),
        &"--to",
        &"torch",
        &"--dtype",
        &"bf16",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("cast of a float4_e2m1fn_x2 tensor") && err.contains("--exclude"), "{err}");
    // Without the packed tensor, the float8 ones cast (bit for bit as torch: conformance/tests/cast.rs).
    let (code, _, err) = ckpt_tool(&[
        &"convert",
        &fixture("dtypes.pt"),
        &tmp.path().join("bf16.pt"),
        &"--to",
        &"torch",
        &"--dtype",
        &"bf16",
        &"--exclude",
        &"float4_e2m1fn_x2",
    ]);
    assert_eq!(code, 0, "{err}");
    let cast = listed(&tmp.path().join("bf16.pt"));
    assert_eq!(cast["float8_e8m0fnu"].0, "bfloat16");
    assert_eq!(cast["uint16"], listed(&fixture("dtypes.pt"))["uint16"]);
}

/// Runs the `ckpt` tool; returns (exit code, stdout, stderr).
fn ckpt_tool(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ckpt"));
    for a in args {
        cmd.arg(a);
    }
    let out = cmd.output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn the_tool_inspects_verifies_converts_and_diffs_every_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    // cat decodes FP4 pairs, the low nibble first (bytes 0x00, 0x01, 0x02, ...: (0, 0), (0.5, 0), (1, 0), ...).
    let (code, out, err) = ckpt_tool(&[&"cat", &fixture("dtypes.safetensors"), &"float4_e2m1fn_x2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("[[(0., 0.), (0.5000, 0.), (1., 0.)"), "{out}");
    for file in FILES {
        let path = fixture(file);
        let (code, out, err) = ckpt_tool(&[&"inspect", &path]);
        assert_eq!(code, 0, "{file}: {err}");
        for (name, (dtype, shape, _)) in expected(file) {
            let line = out.lines().find(|l| l.contains(&name)).unwrap_or_else(|| panic!("{file}: {name}?\n{out}"));
            assert!(line.contains(&dtype), "{file}: {line}");
            assert!(line.contains(&format!("{shape:?}")), "{file}: {shape:?}? {line}");
        }
        let (code, _, err) = ckpt_tool(&[&"verify", &"--deep", &path]);
        assert_eq!(code, 0, "{file}: {err}");
        let st = tmp.path().join(format!("{file}.safetensors"));
        let (code, _, err) = ckpt_tool(&[&"convert", &path, &st, &"--to", &"safetensors"]);
        assert_eq!(code, 0, "{file}: {err}");
        let (code, out, err) = ckpt_tool(&[&"diff", &path, &st]);
        assert_eq!(code, 0, "{file}: {out}{err}");
        assert!(out.starts_with("equal"), "{file}: {out}");
        let pt = tmp.path().join(format!("{file}.pt"));
        let (code, _, err) = ckpt_tool(&[&"convert", &path, &pt, &"--to", &"torch"]);
        if file == "f6.safetensors" {
            assert_ne!(code, 0, "torch has no float6 dtype");
            assert!(err.contains("torch has no dtype") && err.contains("F6_E"), "{err}");
            continue;
        }
        assert_eq!(code, 0, "{file}: {err}");
        let (code, out, err) = ckpt_tool(&[&"diff", &path, &pt]);
        assert_eq!(code, 0, "{file}: {out}{err}");
        assert!(out.starts_with("equal"), "{file}: {out}");
        let (code, out, err) = ckpt_tool(&[&"verify", &"--deep", &pt]);
        assert_eq!(code, 0, "{file}: {out}{err}");
    }
}
