//! Cross-format conformance: every golden fixture converted to every format that can hold it and back, with
//! entries compared (names where the formats share a naming, dtype, shape, bytes), and every converted
//! output loaded by the Python originals in one Python run (`conformance/python/matrix/check_outputs.py`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ckpt::{ConvertOptions, ConvertSummary, EntryKind, Error, Format, convert};
use ckpt_conformance::{fixtures, run_python};
use sha2::{Digest, Sha256};

/// A tensor entry: torch dtype name, shape, sha256 of its row-major bytes.
type TensorSnap = (String, Vec<usize>, String);

/// A checkpoint's entries: dense tensors as (dtype, shape, sha256 of row-major bytes), and the names of
/// every other entry.
#[derive(Debug, Default, Clone, PartialEq)]
struct Snap {
    tensors: BTreeMap<String, TensorSnap>,
    others: BTreeSet<String>,
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn snap(path: &Path) -> Snap {
    let ck = ckpt::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut s = Snap::default();
    for e in ck.entries() {
        match &e.kind {
            EntryKind::Tensor(info) => {
                let t = ck.tensor(&e.name).unwrap_or_else(|err| panic!("{}: {}: {err}", path.display(), e.name));
                let t = t.to_contiguous().unwrap();
                let h = sha(&t.data().unwrap());
                s.tensors.insert(e.name, (info.dtype.torch_name().to_owned(), info.shape.clone(), h));
            }
            // Quantized and sparse tensors (special.pt): counted as tensors, written as their components;
            // checked against torch and safetensors in `composite.rs`.
            EntryKind::Composite(_) => {}
            _ => {
                s.others.insert(e.name);
            }
        }
    }
    s
}

/// Every golden fixture, as (label, path, format).
fn sources() -> Vec<(String, PathBuf, Format)> {
    let mut out = Vec::new();
    let dirs = |p: PathBuf| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> =
            std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
        v.sort();
        v
    };
    let mut pts: Vec<PathBuf> = std::fs::read_dir(fixtures("torch"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pt"))
        .collect();
    pts.sort();
    for p in pts {
        out.push((format!("torch/{}", p.file_name().unwrap().to_string_lossy()), p, Format::Torch));
    }
    for sub in ["golden", "torch213"] {
        for d in dirs(fixtures("distcp").join(sub)) {
            out.push((format!("distcp/{sub}/{}", d.file_name().unwrap().to_string_lossy()), d, Format::Distcp));
        }
    }
    for d in dirs(fixtures("hfai")) {
        out.push((format!("hfai/{}", d.file_name().unwrap().to_string_lossy()), d.join("ckpt"), Format::Hfai));
    }
    out.push(("pbg/ckpt".into(), fixtures("pbg").join("ckpt"), Format::Pbg));
    for d in dirs(fixtures("recis").join("golden")) {
        out.push((format!("recis/{}", d.file_name().unwrap().to_string_lossy()), d, Format::Recis));
    }
    // What users load (issue 11): numpy values, a whole pickled module, a Lightning checkpoint, HF shards.
    let values = fixtures("values");
    for f in ["numpy.pt", "numpy_legacy.pt", "numpy_unsupported.pt", "module_whole.pt", "lightning.ckpt"] {
        out.push((format!("values/{f}"), values.join(f), Format::Torch));
    }
    out.push(("values/hf_sharded".into(), values.join("hf_sharded"), Format::Hf));
    out
}

fn out_path(dir: &Path, label: &str, to: Format) -> PathBuf {
    let stem = label.replace('/', "_");
    match to {
        Format::Torch => dir.join(format!("{stem}.pt")),
        Format::Safetensors => dir.join(format!("{stem}.safetensors")),
        Format::Hf => dir.join(format!("{stem}.hf")),
        _ => dir.join(format!("{stem}.{to}")),
    }
}

/// The name `name` of a converted checkpoint has in `reference`: the same, or after the renamings the
/// targets' layouts imply (hfai's `model.` prefix for a plain state dict; RecIS's `model.pt` (bare names),
/// `extra.pt` (`extra/`) and serializer part (`sparse`) when nested into a state dict, and back), applied
/// at most twice.
fn map_name(name: &str, reference: &Snap) -> String {
    let known = |n: &str| reference.tensors.contains_key(n) || reference.others.contains(n);
    let rewrites = |n: &str| -> Vec<String> {
        let mut out = vec![format!("model.{n}")];
        for prefix in ["model.", "sparse.", "extra/", "extra."] {
            if let Some(rest) = n.strip_prefix(prefix) {
                out.push(rest.to_owned());
            }
        }
        // `extra.k` and `io_state_0.k` (nested) are `extra/k` and `io_state_0/k` (RecIS entry names).
        if let Some((head, rest)) = n.split_once('.') {
            if head == "extra" || head.strip_prefix("io_state_").is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()))
            {
                out.push(format!("{head}/{rest}"));
            }
        }
        out
    };
    if known(name) {
        return name.to_owned();
    }
    for first in rewrites(name) {
        if known(&first) {
            return first;
        }
        if let Some(second) = rewrites(&first).into_iter().find(|n| known(n)) {
            return second;
        }
    }
    name.to_owned()
}

/// Whether `name` lies inside a non-tensor entry of `s` (DCP keeps a tuple of tensors as one value entry
/// `tup` where torch names `tup.0`, `tup.1`).
fn inside_value(name: &str, s: &Snap) -> bool {
    s.others.iter().any(|o| name.strip_prefix(o.as_str()).is_some_and(|rest| rest.starts_with('.')))
}

/// Checks that `got` (a conversion of `want`) holds the same tensors: every tensor of `got` is a tensor of
/// `want` with the same dtype, shape and bytes; every tensor of `want` is in `got` unless `may_drop` says
/// the target cannot hold it or `got` keeps it inside a value entry.
fn check_same(ctx: &str, want: &Snap, got: &Snap, may_drop: &dyn Fn(&str, &TensorSnap) -> bool) {
    let mut seen = BTreeSet::new();
    for (name, t) in &got.tensors {
        let mapped = map_name(name, want);
        match want.tensors.get(&mapped) {
            Some(w) => assert_eq!(w, t, "{ctx}: tensor {name}"),
            // A numpy array is a tensor to Python's checker, and a value entry where a format keeps it pickled
            // (DCP's BYTE_IO items list as values without being read).
            None => {
                assert!(inside_value(&mapped, want) || want.others.contains(&mapped), "{ctx}: unexpected tensor {name}")
            }
        }
        seen.insert(mapped);
    }
    for (name, t) in &want.tensors {
        if seen.contains(name) {
            continue;
        }
        let covered = got.others.iter().any(|o| {
            let o = map_name(o, want);
            o == *name || name.strip_prefix(o.as_str()).is_some_and(|rest| rest.starts_with('.'))
        });
        assert!(covered || may_drop(name, t), "{ctx}: tensor {name} lost");
    }
}

fn st_holds(dtype: &str) -> bool {
    ckpt::DType::from_torch_name(dtype).is_some_and(|d| ckpt::safetensors::safetensors_dtype(d).is_ok())
}

/// Targets of a source format: every format `convert` accepts, but GGUF, an inference format that holds
/// float tensors as F32 or `--quant`'s type and no other values (facade/tests/gguf.rs checks it against
/// gguf-py).
fn targets(from: Format) -> Vec<Format> {
    Format::ALL.into_iter().filter(|&to| to != Format::Gguf && ckpt::unsupported_reason(from, to).is_none()).collect()
}

/// Whether a snapshot holds a PyTorch-BigGraph layout (what a pbg target needs).
fn has_pbg_layout(s: &Snap) -> bool {
    s.tensors.keys().any(|n| n.trim_start_matches("model.").starts_with("embeddings/"))
}

/// The largest shard of hf targets: small, so that most outputs have several shards.
const HF_SHARD: u64 = 1024;

/// The differences `ckpt diff` found, in a line.
fn describe(d: &ckpt::DiffReport) -> String {
    let tensors: Vec<&str> = d.tensors.iter().filter(|t| !t.is_equal()).map(|t| t.name.as_str()).collect();
    format!(
        "only a {:?}, only b {:?}, kinds {:?}, tensors {tensors:?}, values {:?}, unreadable {:?}",
        d.only_a, d.only_b, d.kind_changes, d.values_differ, d.unreadable
    )
}

#[test]
fn matrix() {
    let tmp = tempfile::tempdir().unwrap();
    let start = std::time::Instant::now();
    let mut python_checks: Vec<(String, Format, PathBuf, Snap)> = Vec::new();
    let mut conversions = 0;
    let mut refused = 0;
    for (label, src, from) in sources() {
        let want = snap(&src);
        let dir = tmp.path().join(label.replace('/', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        for to in targets(from) {
            let world = if matches!(to, Format::Distcp | Format::Hfai | Format::Recis) { 2 } else { 1 };
            let target = match to {
                Format::Hf => ckpt::TargetOptions::Hf { max_shard_size: Some(HF_SHARD) },
                _ => ckpt::TargetOptions::Defaults,
            };
            let options = ConvertOptions::default().with_world_size(world).with_target(target);
            let out = out_path(&dir, &label, to);
            let ctx = format!("{label} -> {to}");
            let summary: ConvertSummary = match convert(&src, Some(from), &out, to, &options) {
                Ok(s) => s,
                // A checkpoint without entity partitions has nothing a PBG checkpoint could hold: refused, with
                // the reason, and nothing written.
                Err(Error::UnsupportedConversion { reason, .. }) if to == Format::Pbg && !has_pbg_layout(&want) => {
                    assert!(reason.contains("no `embeddings/<entity>/<partition>`"), "{ctx}: {reason}");
                    assert!(!out.exists(), "{ctx}: refused but wrote {}", out.display());
                    refused += 1;
                    continue;
                }
                Err(e) => panic!("{ctx}: {e}"),
            };
            conversions += 1;
            let got = snap(&out);
            assert!(summary.tensors >= got.tensors.len(), "{ctx}: summary {summary:?}");
            if matches!(to, Format::Safetensors | Format::Hf) {
                // Lossless: the safetensors file holds every entry, values included (`ckpt diff` exits 0).
                let d = ckpt::diff(&src, &out, &ckpt::DiffOptions::default().with_rtol(0.0).with_atol(0.0)).unwrap();
                assert!(d.is_equal(), "{ctx}: ckpt diff: {}", describe(&d));
                assert!(summary.dropped.is_empty(), "{ctx}: dropped {:?}", summary.dropped);
                // Everything not written is reported.
                let dropped: BTreeSet<&str> = summary.dropped.iter().map(String::as_str).collect();
                for name in want.tensors.keys().chain(&want.others) {
                    assert!(
                        got.tensors.contains_key(name) || got.others.contains(name) || dropped.contains(name.as_str()),
                        "{ctx}: {name} neither written nor dropped"
                    );
                }
                assert!(got.others.is_subset(&want.others), "{ctx}: {:?}", got.others.difference(&want.others));
                assert_eq!(summary.values, got.others.len(), "{ctx}");
            }
            let drop_ok = |_: &str, t: &TensorSnap| matches!(to, Format::Safetensors | Format::Hf) && !st_holds(&t.0);
            check_same(&ctx, &want, &got, &drop_ok);
            python_checks.push((ctx.clone(), to, out.clone(), got.clone()));
            // And back, into the source's format where it can be written, else into torch.
            let back_to = if ckpt::unsupported_reason(to, from).is_none() { from } else { Format::Torch };
            let back = out_path(&dir, &format!("{label}_via_{to}"), back_to);
            let back_options = ConvertOptions::default();
            convert(&out, Some(to), &back, back_to, &back_options)
                .unwrap_or_else(|e| panic!("{ctx} -> {back_to}: {e}"));
            conversions += 1;
            let round = snap(&back);
            let back_ctx = format!("{ctx} -> {back_to}");
            if matches!(to, Format::Safetensors | Format::Hf) && back_to == from {
                // And back: an equal checkpoint (DCP -> safetensors -> DCP, torch -> safetensors -> torch, ...),
                // or, where the format's own writer names entries otherwise than the source (DCP 2.0's
                // tensor-free dicts as one entry), what a direct conversion into the same format gives.
                let exact = ckpt::DiffOptions::default().with_rtol(0.0).with_atol(0.0);
                let d = ckpt::diff(&src, &back, &exact).unwrap();
                if !d.is_equal() {
                    let direct = out_path(&dir, &format!("{label}_direct"), from);
                    convert(&src, Some(from), &direct, from, &ConvertOptions::default()).unwrap();
                    let d = ckpt::diff(&direct, &back, &exact).unwrap();
                    assert!(d.is_equal(), "{back_ctx}: ckpt diff against a direct {from} conversion: {}", describe(&d));
                }
            }
            check_same(&back_ctx, &want, &round, &drop_ok);
            if matches!(back_to, Format::Pbg | Format::Recis) {
                python_checks.push((back_ctx, back_to, back, round));
            }
        }
    }
    assert!(refused > 0 && conversions > 500, "{conversions} conversions, {refused} refused");
    eprintln!("{conversions} conversions checked ({refused} refused) in {:.1?}", start.elapsed());

    // The Python originals load every output.
    let spec = serde_json::json!({
        "checks": python_checks.iter().map(|(_, f, p, _)| serde_json::json!({"format": f.name(), "path": p, "max_shard_size": HF_SHARD})).collect::<Vec<_>>()
    });
    let spec_path = tmp.path().join("spec.json");
    let result_path = tmp.path().join("result.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    run_python("matrix/check_outputs.py", &[&spec_path, &result_path]);
    let results: serde_json::Value = serde_json::from_slice(&std::fs::read(&result_path).unwrap()).unwrap();
    let results = results["results"].as_array().unwrap();
    assert_eq!(results.len(), python_checks.len());
    for ((ctx, _, _, rust), py) in python_checks.iter().zip(results) {
        assert!(py.get("error").is_none(), "{ctx}: the Python original failed to load it:\n{}", py["error"]);
        let mut py_snap = Snap::default();
        for (name, t) in py["tensors"].as_object().unwrap() {
            let shape = t[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            py_snap
                .tensors
                .insert(name.clone(), (t[0].as_str().unwrap().to_owned(), shape, t[2].as_str().unwrap().to_owned()));
        }
        // Python sees the same tensors as ckpt (tensors inside DCP value entries included).
        check_same(&format!("{ctx} (Python)"), rust, &py_snap, &|_, _| false);
    }
}

#[test]
fn unsupported_conversions_say_why() {
    let src = fixtures("torch").join("checkpoint.pt");
    let tmp = tempfile::tempdir().unwrap();
    // A torch checkpoint without entity partitions: refused for what it holds.
    match convert(&src, None, tmp.path().join("x"), Format::Pbg, &ConvertOptions::default()) {
        Err(Error::UnsupportedConversion { from, to, reason }) => {
            assert_eq!((from, to), (Format::Torch, Format::Pbg));
            assert!(reason.contains("this torch checkpoint has no `embeddings/"), "{reason}");
        }
        other => panic!("torch -> pbg: {other:?}"),
    }
    // RecIS to PBG: refused whatever the checkpoint holds.
    assert!(ckpt::unsupported_reason(Format::Recis, Format::Pbg).is_some());
    let recis = fixtures("recis").join("golden").join("two_shard_adamw");
    let e = convert(&recis, None, tmp.path().join("p"), Format::Pbg, &ConvertOptions::default()).unwrap_err();
    assert!(matches!(e, Error::UnsupportedConversion { from: Format::Recis, .. }), "{e}");
    let e = convert(&src, None, tmp.path().join("d"), Format::Distcp, &ConvertOptions::default().with_world_size(0))
        .unwrap_err();
    assert!(e.to_string().contains("world size 0"), "{e}");
    // A top level that is not a mapping cannot be a DCP or hfai state dict.
    let list = tmp.path().join("list.pt");
    let t = ckpt::Tensor::from_slice(&[1.0f32], &[1]).unwrap();
    ckpt::torch::save(&ckpt::Value::List(vec![ckpt::Value::Tensor(t)]), &list, &ckpt::torch::WriteOptions::default())
        .unwrap();
    for to in [Format::Distcp, Format::Hfai, Format::Recis] {
        let e = convert(&list, None, tmp.path().join(format!("l.{to}")), to, &ConvertOptions::default()).unwrap_err();
        assert!(e.to_string().contains("top level is a list"), "{to}: {e}");
    }
    assert!(nothing_written(tmp.path(), &["list.pt"]));
}

fn nothing_written(dir: &Path, allowed: &[&str]) -> bool {
    std::fs::read_dir(dir).unwrap().all(|e| allowed.contains(&e.unwrap().file_name().to_string_lossy().as_ref()))
}

#[test]
fn dropped_entries_are_reported() {
    use ckpt::tensor::{DType, Tensor, Value};
    let tmp = tempfile::tempdir().unwrap();
    let pt = tmp.path().join("m.pt");
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let c = Tensor::zeros(DType::C128, &[2]).unwrap();
    let sd = Value::dict([
        ("model", Value::dict([("w", Value::Tensor(w.clone()))])),
        ("epoch", Value::Int(3)),
        ("c", Value::Tensor(c)),
    ]);
    ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let st = tmp.path().join("m.safetensors");
    let s = convert(&pt, None, &st, Format::Safetensors, &ConvertOptions::default()).unwrap();
    assert_eq!((s.tensors, s.bytes, s.values), (2, 48, 1)); // `epoch` is kept in `ckpt.values`
    assert!(s.dropped.is_empty()); // complex128: stored as float64 [2, 2], its dtype recorded
    assert_eq!(ckpt::open(&st).unwrap().tensor("c").unwrap().dtype(), DType::C128);
    // torch and distcp hold everything.
    let s = convert(&pt, None, tmp.path().join("m.distcp"), Format::Distcp, &ConvertOptions::default()).unwrap();
    assert_eq!((s.tensors, s.values, s.dropped.len()), (2, 1, 0));
    // Back from safetensors: the nesting is restored from `ckpt.paths`.
    let back = tmp.path().join("back.pt");
    convert(&st, None, &back, Format::Torch, &ConvertOptions::default()).unwrap();
    let v = ckpt::torch::load(&back).unwrap();
    assert_eq!(v.as_dict().unwrap().get("model").unwrap().as_dict().unwrap().get("w").unwrap().as_tensor(), Some(&w));
    assert_eq!(v.as_dict().unwrap().get("epoch"), Some(&Value::Int(3)));
    // The safetensors file lists the value too, and other readers see only the tensors.
    let entries = ckpt::open(&st).unwrap().entries();
    assert_eq!(entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["model.w", "epoch", "c"]);
    // A plain safetensors file (no `ckpt.paths`) becomes a flat dict.
    let plain = tmp.path().join("plain.safetensors");
    ckpt::safetensors::write_file(&[("a.b".to_string(), w.clone())], None, &plain).unwrap();
    convert(&plain, None, &back, Format::Torch, &ConvertOptions::default()).unwrap();
    let v = ckpt::torch::load(&back).unwrap();
    assert_eq!(v.as_dict().unwrap().get("a.b").unwrap().as_tensor(), Some(&w));
}

#[test]
fn distcp_world_size_shards_rows() {
    use ckpt::tensor::{Tensor, Value};
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("m.safetensors");
    let w: Vec<f32> = (0..15).map(|i| i as f32).collect();
    let w = Tensor::from_slice(&w, &[5, 3]).unwrap();
    let b = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    ckpt::safetensors::write_file(&[("w".into(), w.clone()), ("b".into(), b.clone())], None, &st).unwrap();
    let dir = tmp.path().join("dcp");
    convert(&st, None, &dir, Format::Distcp, &ConvertOptions::default().with_world_size(3)).unwrap();
    let r = ckpt::distcp::DcpReader::open(&dir).unwrap();
    // w: 5 rows over 3 ranks = 2 + 2 + 1; b: 2 rows < 3 ranks, replicated and written once.
    let chunks = |k: &str| r.tensor_metadata(k).unwrap().chunks.len();
    assert_eq!((chunks("w"), chunks("b")), (3, 1));
    assert_eq!(r.read_tensor("w").unwrap(), w);
    assert_eq!(ckpt::open(&dir).unwrap().tensor("b").unwrap(), b);
    let _ = Value::None;
    // hfai: the world size is the number of parts.
    let hf = tmp.path().join("hfai");
    convert(
        &st,
        None,
        &hf,
        Format::Hfai,
        &ConvertOptions::default().with_world_size(3).with_target(ckpt::TargetOptions::Hfai { large_size: Some(16) }),
    )
    .unwrap();
    let h = ckpt::hfai::HfaiReader::open(&hf).unwrap();
    assert_eq!(h.world_size(), 3);
    assert_eq!(h.chunked(), ["model.w"]);
    assert_eq!(h.model().unwrap().get("w").unwrap().as_tensor(), Some(&w));
}

#[test]
fn selection_applies_to_every_target() {
    use ckpt::{DType, Selection};
    let src = fixtures("torch").join("checkpoint.pt");
    let all = ckpt::open(&src).unwrap().entries();
    let want: BTreeMap<String, DType> = all
        .iter()
        .filter(|e| e.name.starts_with("model.") && !e.name.ends_with("num_batches_tracked"))
        .filter_map(|e| e.tensor_info().map(|t| (e.name["model.".len()..].to_owned(), t.dtype)))
        .map(|(n, d)| (n, if d.is_floating_point() { DType::BF16 } else { d }))
        .collect();
    assert!(want.len() > 5);
    let selection = Selection::default()
        .with_include("model.*")
        .with_exclude("*.num_batches_tracked")
        .with_strip_prefix("model.")
        .with_dtype(DType::BF16);
    let tmp = tempfile::tempdir().unwrap();
    for to in [Format::Torch, Format::Safetensors, Format::Distcp, Format::Hfai, Format::Recis] {
        let out = out_path(tmp.path(), "sel", to);
        let s = convert(&src, None, &out, to, &ConvertOptions::default().with_selection(selection.clone())).unwrap();
        assert_eq!(s.tensors, want.len(), "{to}");
        let got: BTreeMap<String, DType> = ckpt::open(&out)
            .unwrap()
            .entries()
            .into_iter()
            .filter_map(|e| e.tensor_info().map(|t| (e.name.clone(), t.dtype)))
            // hfai keeps a plain state dict under `model`
            .map(|(n, d)| (if to == Format::Hfai { n["model.".len()..].to_owned() } else { n }, d))
            .collect();
        assert_eq!(got, want, "{to}");
    }
    // Values are kept or dropped whole; renaming collisions and bad dtypes are refused.
    let st = tmp.path().join("cfg.safetensors");
    let s = convert(
        &src,
        None,
        &st,
        Format::Safetensors,
        &ConvertOptions::default().with_selection(Selection::default().with_include("config.*")),
    )
    .unwrap();
    assert_eq!((s.tensors, s.values), (0, all.iter().filter(|e| e.name.starts_with("config.")).count()));
    let bad = Selection::default().with_dtype(DType::I32);
    assert!(matches!(
        convert(&src, None, tmp.path().join("z.pt"), Format::Torch, &ConvertOptions::default().with_selection(bad)),
        Err(Error::Format { source, .. })
            if matches!(source.format_error(), Some(ckpt::select::SelectionError::BadDtype { dtype: DType::I32 }))
    ));
    // A name collision after stripping: `a.w` and `b.a.w` stripped of `b.`.
    let pt = tmp.path().join("c.pt");
    let t = ckpt::Tensor::from_slice(&[1.0f32], &[1]).unwrap();
    let sd = ckpt::Value::dict([
        ("w", ckpt::Value::Tensor(t.clone())),
        ("b", ckpt::Value::dict([("w", ckpt::Value::Tensor(t))])),
    ]);
    ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let strip = Selection::default().with_strip_prefix("b.");
    let e =
        convert(&pt, None, tmp.path().join("c2.pt"), Format::Torch, &ConvertOptions::default().with_selection(strip))
            .unwrap_err();
    assert!(e.to_string().contains("two entries would be named \"w\""), "{e}");
}

/// Every golden fixture converted into every format `convert` supports (one rank and several where the
/// target shards) diffs equal to its source (`ckpt diff` compares the state each format's layout carries;
/// layout keys are reported apart), less only what the conversion reported dropped.
#[test]
fn conversions_diff_equal_to_their_source() {
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let mut pairs = BTreeSet::new();
    let mut checked = 0;
    for (label, src, from) in sources() {
        let dir = tmp.path().join(label.replace('/', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        for to in targets(from) {
            let worlds: &[usize] = if to.is_sharded() && to != Format::Pbg { &[1, 3] } else { &[1] };
            for &world in worlds {
                let target = match to {
                    Format::Hf => ckpt::TargetOptions::Hf { max_shard_size: Some(HF_SHARD) },
                    _ => ckpt::TargetOptions::Defaults,
                };
                let options = ConvertOptions::default().with_world_size(world).with_target(target);
                let out = out_path(&dir, &format!("{label}_w{world}"), to);
                let ctx = format!("{label} -> {to} (world size {world})");
                let summary = match convert(&src, Some(from), &out, to, &options) {
                    Ok(s) => s,
                    Err(Error::UnsupportedConversion { .. }) => continue,
                    Err(e) => panic!("{ctx}: {e}"),
                };
                let d = ckpt::diff(&src, &out, &ckpt::DiffOptions::default().with_rtol(0.0).with_atol(0.0))
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                checked += 1;
                pairs.insert(format!("{from}->{to}"));
                // What the conversion reported dropped is on the source's side only; nothing else differs.
                let dropped: BTreeSet<&str> = summary.dropped.iter().map(String::as_str).collect();
                let only_a: Vec<&String> = d.only_a.iter().filter(|n| !dropped.contains(n.as_str())).collect();
                let unequal = d.tensors.iter().any(|t| !t.is_equal());
                if !only_a.is_empty()
                    || !d.only_b.is_empty()
                    || !d.kind_changes.is_empty()
                    || !d.values_differ.is_empty()
                    || !d.unreadable.is_empty()
                    || unequal
                {
                    failures.push(format!("{ctx}: {} (dropped {dropped:?})", describe(&d)));
                }
            }
        }
    }
    eprintln!("{checked} conversions diffed over {} format pairs: {pairs:?}", pairs.len());
    assert!(failures.is_empty(), "{} of {checked} conversions differ:\n{}", failures.len(), failures.join("\n"));
}

/// A changed value is still a difference after every conversion: a checkpoint written in every format,
/// converted into every target (several ranks where it shards), diffs equal to its source and unequal to a
/// copy of its source with one tensor changed, the change named.
#[test]
fn conversions_diff_unequal_to_a_changed_source() {
    use ckpt::tensor::{Tensor, Value};
    let tmp = tempfile::tempdir().unwrap();
    let state = |w0: f32| {
        let w = Tensor::from_slice(&[w0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], &[4, 2]).unwrap();
        let b = Tensor::from_slice(&[0.5f32, 0.25, 0.125], &[3]).unwrap();
        Value::dict([("w", Value::Tensor(w)), ("b", Value::Tensor(b)), ("step", Value::Int(7))])
    };
    let (pt, changed_pt) = (tmp.path().join("s.pt"), tmp.path().join("changed.pt"));
    ckpt::torch::save(&state(0.0), &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    ckpt::torch::save(&state(9.0), &changed_pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let mut checked = 0;
    for from in targets(Format::Torch).into_iter().filter(|f| *f != Format::Pbg) {
        let src = out_path(tmp.path(), "src", from);
        let changed = out_path(tmp.path(), "changed", from);
        convert(&pt, None, &src, from, &ConvertOptions::default()).unwrap();
        convert(&changed_pt, None, &changed, from, &ConvertOptions::default()).unwrap();
        for to in targets(from).into_iter().filter(|f| *f != Format::Pbg) {
            let world = if to.is_sharded() { 2 } else { 1 };
            let out = out_path(tmp.path(), &format!("{from}_{to}"), to);
            convert(&src, Some(from), &out, to, &ConvertOptions::default().with_world_size(world)).unwrap();
            let ctx = format!("{from} -> {to}");
            let d = ckpt::diff(&src, &out, &ckpt::DiffOptions::default()).unwrap();
            assert!(d.is_equal(), "{ctx}: {}", describe(&d));
            let d = ckpt::diff(&changed, &out, &ckpt::DiffOptions::default()).unwrap();
            assert!(!d.is_equal(), "{ctx}: a changed source diffs equal");
            let unequal: Vec<&str> = d.tensors.iter().filter(|t| !t.is_equal()).map(|t| t.name.as_str()).collect();
            assert_eq!(unequal.len(), 1, "{ctx}: {}", describe(&d));
            assert!(unequal[0].ends_with('w'), "{ctx}: {}", describe(&d));
            assert_eq!(d.tensors.iter().find(|t| !t.is_equal()).unwrap().max_abs, 9.0, "{ctx}");
            // Raw, the layout's keys and nesting are differences again where a format has them.
            let raw =
                ckpt::diff(&src, &out, &ckpt::DiffOptions::default().with_layout(ckpt::diff::DiffLayout::Raw)).unwrap();
            if to == Format::Hfai && from != Format::Hfai {
                assert!(!raw.is_equal(), "{ctx}: raw");
                assert!(d.layout_b.keys.iter().any(|k| k == "__nshards__"), "{ctx}: {:?}", d.layout_b);
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "{checked}");
}
