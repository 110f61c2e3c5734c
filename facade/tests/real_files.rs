//! The checkpoints users have that nobody on this project wrote (issue 26, `conformance/fixtures/real/`):
//! Python 2 legacy streams, omegaconf configs with parent links (a cyclic object graph), a TorchScript
//! archive, DEFLATE records and tensors inside objects. Each one opens with exactly the tensors its manifest
//! lists (name, dtype, shape, sha256), verifies deep, converts to safetensors and back to the same entries,
//! and rewritten by ckpt as a `torch.save` file loads in torch with the same object graph, identities
//! included (`conformance/python/check_real.py`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::{ConvertOptions, DiffOptions, EntryKind, Format, Value, convert};
use ckpt_conformance::{fixtures, run_python};
use sha2::{Digest, Sha256};

/// The fixtures, by file name.
const FILES: [&str; 6] =
    ["py2_torch03.pt", "py2_torch04.pt", "omegaconf.ckpt", "scripted.jit", "deflate.pt", "objects.ckpt"];

fn real(name: &str) -> PathBuf {
    fixtures("real").join(name)
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// (dtype, shape, sha256) of every tensor, by name.
type Tensors = BTreeMap<String, (String, Vec<usize>, String)>;

/// A manifest's tensor record: (dtype, shape, sha256).
fn record(t: &serde_json::Value) -> (String, Vec<usize>, String) {
    let shape = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
    (t["dtype"].as_str().unwrap().to_owned(), shape, t["sha256"].as_str().unwrap().to_owned())
}

fn manifest_json(file: &str) -> serde_json::Value {
    let stem = Path::new(file).file_stem().unwrap().to_string_lossy().into_owned();
    let text = std::fs::read_to_string(real(&format!("{stem}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The tensors the manifest `<stem>.json` lists by name.
fn manifest(file: &str) -> Tensors {
    let json = manifest_json(file);
    let tensors = json["tensors"].as_object().unwrap_or_else(|| panic!("{file}: no tensors"));
    tensors.iter().map(|(name, t)| (name.clone(), record(t))).collect()
}

/// A TorchScript archive's tensor constants, as the manifest lists them (a multiset: torch's API does not
/// show their order in `constants.pkl`), sorted.
fn manifest_constants(file: &str) -> Vec<(String, Vec<usize>, String)> {
    let mut v: Vec<_> = manifest_json(file)["constants"].as_array().into_iter().flatten().map(record).collect();
    v.sort();
    v
}

/// A TorchScript archive's other tensor attributes, as the manifest lists them, by `attributes.<path>`.
fn manifest_attributes(file: &str) -> Tensors {
    let json = manifest_json(file);
    json["attributes"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, t)| (format!("attributes.{name}"), record(t)))
        .collect()
}

/// `listed`, the constants (`constants.<i>`) apart, sorted.
fn split_constants(mut all: Tensors) -> (Tensors, Vec<(String, Vec<usize>, String)>) {
    let names: Vec<String> = all.keys().filter(|n| n.starts_with("constants.")).cloned().collect();
    let mut constants: Vec<_> = names.iter().filter_map(|n| all.remove(n)).collect();
    constants.sort();
    (all, constants)
}

/// `listed`, the other tensor attributes (`attributes.<path>`) apart.
fn split_attributes(mut all: Tensors) -> (Tensors, Tensors) {
    let names: Vec<String> = all.keys().filter(|n| n.starts_with("attributes.")).cloned().collect();
    let attributes = names.into_iter().filter_map(|n| all.remove(&n).map(|t| (n, t))).collect();
    (all, attributes)
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

#[test]
fn every_tensor_is_listed_under_its_natural_name() {
    for file in FILES {
        let path = real(file);
        assert_eq!(ckpt::detect(&path).unwrap(), Format::Torch, "{file}");
        let want = manifest(file);
        assert!(!want.is_empty(), "{file}: the manifest lists no tensor");
        let (tensors, constants) = split_constants(listed(&path));
        let (tensors, attributes) = split_attributes(tensors);
        assert_eq!(tensors, want, "{file}");
        assert_eq!(constants, manifest_constants(file), "{file}");
        assert_eq!(attributes, manifest_attributes(file), "{file}");
    }
    assert_eq!(manifest_constants("scripted.jit").len(), 2, "the TorchScript fixture has two constants");
    assert_eq!(manifest_attributes("scripted.jit").len(), 1, "the TorchScript fixture has a tensor attribute");
}

#[test]
fn every_fixture_verifies_deep() {
    for file in FILES {
        let report = ckpt::verify(real(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(report.is_ok(), "{file}: {:?}", report.problems);
    }
}

#[test]
fn safetensors_conversion_keeps_every_entry() {
    let tmp = tempfile::tempdir().unwrap();
    for file in FILES {
        let src = real(file);
        let dst = tmp.path().join(format!("{file}.safetensors"));
        let summary = convert(&src, None, &dst, Format::Safetensors, &ConvertOptions::default())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        // A TorchScript archive's tensors outside its state dict are left out unless asked for.
        assert_eq!(summary.tensors, manifest(file).len(), "{file}");
        assert_eq!(listed(&dst), manifest(file), "{file}");
        let report = ckpt::verify(&dst).unwrap();
        assert!(report.is_ok(), "{file}: {:?}", report.problems);
        let d = ckpt::diff(&src, &dst, &DiffOptions::default().with_atol(0.0).with_rtol(0.0)).unwrap();
        assert!(d.is_equal(), "{file}: {d:?}");
        // Every fixture but the two of tensors only holds values besides its tensors.
        assert!(d.values_equal > 0 || ["deflate.pt", "scripted.jit"].contains(&file), "{file}: no value compared");
    }
}

/// Whether `v` holds an object shared by several places (`Value::Shared`) and a reference back to an
/// enclosing one (a cycle).
fn sharing(v: &Value) -> (usize, usize) {
    let mut shared = 0;
    let mut refs = 0;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Shared { .. } => shared += 1,
            Value::Ref(_) => refs += 1,
            _ => {}
        }
        v.children_into(&mut stack);
    }
    (shared, refs)
}

#[test]
fn omegaconf_parent_links_are_a_cycle_in_the_value() {
    let v = ckpt::torch::load(&real("omegaconf.ckpt")).unwrap();
    let (shared, refs) = sharing(&v);
    assert!(shared > 0 && refs > 0, "shared {shared}, refs {refs}");
    assert!(v.has_refs());
    // Expanding the references that are copies keeps the cycle (it cannot be a tree).
    assert!(v.unshared().has_refs());
}

#[test]
fn torch_rewrite_loads_with_the_same_object_graph() {
    let tmp = tempfile::tempdir().unwrap();
    let mut pairs = Vec::new();
    for file in FILES.iter().filter(|f| !f.ends_with(".jit")) {
        let src = real(file);
        let value = ckpt::torch::load(&src).unwrap_or_else(|e| panic!("{file}: {e}"));
        let dst = tmp.path().join(format!("rewritten_{}.pt", file.replace('.', "_")));
        ckpt::torch::save(&value, &dst, &ckpt::torch::WriteOptions::default()).unwrap();
        // What ckpt wrote reads back to the value it wrote.
        assert_eq!(ckpt::torch::load(&dst).unwrap(), value, "{file}");
        assert_eq!(listed(&dst), manifest(file), "{file}");
        pairs.push((src, dst));
    }
    for (src, dst) in &pairs {
        let out = run_python("check_real.py", &[src, dst]);
        assert!(out.contains("object identities kept"), "{}: {out}", src.display());
    }
    // The CLI's convert to torch keeps the object graph as well.
    let src = real("omegaconf.ckpt");
    let dst = tmp.path().join("converted_omegaconf.ckpt");
    convert(&src, None, &dst, Format::Torch, &ConvertOptions::default()).unwrap();
    run_python("check_real.py", &[&src, &dst]);
}

#[test]
fn torchscript_converts_to_a_weights_only_state_dict() {
    let tmp = tempfile::tempdir().unwrap();
    let src = real("scripted.jit");
    let reader = ckpt::torch::TorchReader::open(&src).unwrap();
    assert!(reader.script().is_some(), "a TorchScript archive is read as one");
    let dst = tmp.path().join("state_dict.pt");
    let summary = convert(&src, None, &dst, Format::Torch, &ConvertOptions::default()).unwrap();
    assert_eq!(summary.tensors, manifest("scripted.jit").len());
    let script = reader.script().unwrap();
    assert_eq!(script.parameters.len() + script.buffers.len(), manifest("scripted.jit").len());
    assert_eq!(script.constants, 2);
    assert_eq!(script.attributes, ["inner._state"]);
    assert!(script.code.iter().any(|c| c.starts_with("code/__torch__")), "{:?}", script.code);
    // Read back: the state dict and nothing else (load_state_dict(strict=True) takes it), nothing of the
    // module's code or classes.
    assert_eq!(listed(&dst), manifest("scripted.jit"));
    let out = run_python("check_real.py", &["--jit".as_ref(), &src, &dst]);
    assert!(out.contains("state_dict: 8 tensors equal, load_state_dict(strict=True) accepts it"), "{out}");
    // The tensors outside the state dict read by name, and converted when --include asks for them.
    let ck = ckpt::open(&src).unwrap();
    assert!(ck.tensor("attributes.inner._state").is_ok() && ck.tensor("constants.0").is_ok());
    let all = tmp.path().join("with_extras.pt");
    let options = ConvertOptions::default().with_selection(ckpt::select::Selection::default().with_include("*"));
    let summary = convert(&src, None, &all, Format::Torch, &options).unwrap();
    assert_eq!(summary.tensors, manifest("scripted.jit").len() + 3);
    assert_eq!(listed(&all), listed(&src));
    let out = run_python("check_real.py", &["--jit-all".as_ref(), &src, &all]);
    assert!(out.contains("constants: 2 equal") && out.contains("attributes: 1 equal"), "{out}");
    // Only what the globs name: the constants, not the attribute.
    let some = tmp.path().join("with_constants.safetensors");
    let selection = ckpt::select::Selection::default().with_include("inner.*").with_include("constants.*");
    let options = ConvertOptions::default().with_selection(selection);
    let summary = convert(&src, None, &some, Format::Safetensors, &options).unwrap();
    assert_eq!(summary.tensors, manifest("scripted.jit").len() + 2);
    assert!(listed(&some).keys().all(|n| !n.starts_with("attributes.")));
}

/// Runs the `ckpt` tool; returns (exit code, stdout).
fn ckpt_tool(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ckpt"));
    for a in args {
        cmd.arg(a);
    }
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_tool_lists_prints_and_compares_what_the_library_reads() {
    // inspect counts what entries() lists: every tensor inside the objects too.
    for file in FILES {
        let path = real(file);
        let n = ckpt::open(&path).unwrap().entries().iter().filter(|e| e.tensor_info().is_some()).count();
        let (code, out) = ckpt_tool(&[&"inspect", &path]);
        assert_eq!(code, 0, "{file}: {out}");
        assert!(out.contains(&format!("\n{n} tensors, ")), "{file}: {n} tensors?\n{out}");
    }
    // cat of an object graph with parent links: each shared node labelled, each link saying where it points.
    let (code, out) = ckpt_tool(&[&"cat", &real("omegaconf.ckpt"), &"hyper_parameters"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("&0 omegaconf.dictconfig.DictConfig"), "{out}");
    assert!(out.contains("'_parent': *0 (-> hyper_parameters)"), "{out}");
    assert!(out.contains("'_parent': *1 (-> hyper_parameters._content.model)"), "{out}");
    // diff terminates on the cycle and finds the rewrite equal.
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("rewritten.ckpt");
    let value = ckpt::torch::load(&real("omegaconf.ckpt")).unwrap();
    ckpt::torch::save(&value, &dst, &ckpt::torch::WriteOptions::default()).unwrap();
    let (code, out) = ckpt_tool(&[&"diff", &real("omegaconf.ckpt"), &dst]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("equal"), "{out}");
    // verify --deep reads every tensor of every fixture.
    for file in FILES {
        let (code, out) = ckpt_tool(&[&"verify", &"--deep", &real(file)]);
        assert_eq!(code, 0, "{file}: {out}");
    }
}
