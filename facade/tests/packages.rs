//! torch.package archives (issue 39, `conformance/fixtures/package/`): written by torch 2.13's
//! `PackageExporter` with an interned model class, a mocked and an extern module, a scripted module, a text
//! resource. Each opens as format `package` with exactly the tensors its manifest lists (what
//! `PackageImporter` loads: `<resource path>.<state_dict name or key>`, dtype, shape, sha256), names its
//! modules without running them, verifies deep, converts to safetensors and to torch (which `torch.load` reads
//! to the same tensors) and diffs equal; the
//! tool does the same; a package whose pickle names a module it does not hold is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::{ConvertOptions, DiffOptions, EntryKind, Format, convert};
use ckpt_conformance::{fixtures, run_python};
use sha2::{Digest, Sha256};

const FILES: [&str; 2] = ["model.pt", "tensors.pt"];

fn package_fixture(name: &str) -> PathBuf {
    fixtures("package").join(name)
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// (dtype, shape, sha256) of every tensor, by name.
type Tensors = BTreeMap<String, (String, Vec<usize>, String)>;

fn manifest_json(file: &str) -> serde_json::Value {
    let stem = Path::new(file).file_stem().unwrap().to_string_lossy().into_owned();
    serde_json::from_str(&std::fs::read_to_string(package_fixture(&format!("{stem}.json"))).unwrap()).unwrap()
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array().into_iter().flatten().map(|s| s.as_str().unwrap().to_owned()).collect()
}

fn manifest(file: &str) -> Tensors {
    let json = manifest_json(file);
    json["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, t)| {
            let shape = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            (name.clone(), (t["dtype"].as_str().unwrap().to_owned(), shape, t["sha256"].as_str().unwrap().to_owned()))
        })
        .collect()
}

fn listed(path: &Path) -> Tensors {
    let ck = ckpt::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Tensors::new();
    for e in ck.entries() {
        if let EntryKind::Tensor(info) = &e.kind {
            let t = ck.tensor(&e.name).unwrap_or_else(|err| panic!("{}: {}: {err}", path.display(), e.name));
            let digest = sha(&t.to_contiguous().unwrap().data().unwrap());
            out.insert(e.name.clone(), (info.dtype.torch_name().to_owned(), info.shape.clone(), digest));
        }
    }
    out
}

#[test]
fn every_tensor_is_listed_as_package_importer_loads_it() {
    for file in FILES {
        let path = package_fixture(file);
        assert_eq!(ckpt::detect(&path).unwrap(), Format::Package, "{file}");
        let want = manifest(file);
        assert!(want.len() >= 3, "{file}");
        assert_eq!(listed(&path), want, "{file}");
        let reader = ckpt::torch::TorchReader::open(&path).unwrap();
        let package = reader.package().unwrap();
        let json = manifest_json(file);
        assert_eq!(package.pickles, strings(&json["pickles"]), "{file}");
        assert_eq!(package.extern_modules, strings(&json["extern_modules"]), "{file}");
        assert_eq!(package.modules, strings(&json["modules"]), "{file}");
        assert_eq!(package.mocked_modules, strings(&json["mocked_modules"]), "{file}");
    }
    // The model package: its scripted module as its weights, its text resource listed.
    let reader = ckpt::torch::TorchReader::open(package_fixture("model.pt")).unwrap();
    let package = reader.package().unwrap();
    assert_eq!(package.scripts, 1);
    assert_eq!(package.resources, ["notes/README.txt"]);
    let details = ckpt::open(package_fixture("model.pt")).unwrap().reader().details();
    let text: String = details.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
    assert!(text.contains("package_classes") && text.contains("tqdm") && text.contains("never run"), "{text}");
}

#[test]
fn every_fixture_verifies_deep_and_converts() {
    let tmp = tempfile::tempdir().unwrap();
    for file in FILES {
        let src = package_fixture(file);
        let report = ckpt::verify(&src).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(report.is_ok(), "{file}: {:?}", report.problems);
        let st = tmp.path().join(format!("{file}.safetensors"));
        let summary = convert(&src, None, &st, Format::Safetensors, &ConvertOptions::default()).unwrap();
        assert_eq!(summary.tensors, manifest(file).len(), "{file}");
        assert_eq!(listed(&st), manifest(file), "{file}");
        let pt = tmp.path().join(format!("{file}.converted.pt"));
        convert(&src, None, &pt, Format::Torch, &ConvertOptions::default()).unwrap();
        assert_eq!(listed(&pt), manifest(file), "{file}");
        for dst in [&st, &pt] {
            let d = ckpt::diff(&src, dst, &DiffOptions::default().with_atol(0.0).with_rtol(0.0)).unwrap();
            assert!(d.is_equal(), "{file} vs {}: {d:?}", dst.display());
        }
        // torch.load of the rewrite gives what PackageImporter loads from the package.
        let json = package_fixture(&file.replace(".pt", ".json"));
        let out = run_python("torch_package/check_torch.py", &[&json, &pt]);
        assert!(out.contains(&format!("{} tensors equal", manifest(file).len())), "{file}: {out}");
    }
}

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
        let path = package_fixture(file);
        let n = manifest(file).len();
        let (code, out) = ckpt_tool(&[&"inspect", &path]);
        assert_eq!(code, 0, "{file}: {out}");
        assert!(out.contains("package") && out.contains(&format!("\n{n} tensors, ")), "{file}: {n}?\n{out}");
        let (code, out) = ckpt_tool(&[&"verify", &"--deep", &path]);
        assert_eq!(code, 0, "{file}: {out}");
        for (to, ext) in [("safetensors", "safetensors"), ("torch", "pt")] {
            let dst = tmp.path().join(format!("{file}.{ext}"));
            let (code, out) = ckpt_tool(&[&"convert", &path, &dst, &"--to", &to]);
            assert_eq!(code, 0, "{file} --to {to}: {out}");
            let (code, out) = ckpt_tool(&[&"diff", &path, &dst]);
            assert_eq!(code, 0, "{file} --to {to}: {out}");
            assert!(out.lines().any(|l| l.starts_with("equal: ")), "{file} --to {to}: {out}");
        }
    }
    let (code, out) = ckpt_tool(&[&"inspect", &package_fixture("model.pt")]);
    assert_eq!(code, 0);
    assert!(out.contains("mocked modules") && out.contains("tqdm"), "{out}");
}

#[test]
fn a_package_whose_pickle_names_a_module_it_does_not_hold_is_refused() {
    use ckpt::torch::{Error, TorchReader};
    // The model's class module renamed inside the pickle (same length: the archive's layout is kept).
    let mut bytes = std::fs::read(package_fixture("model.pt")).unwrap();
    let from = b"package_classes\nNet";
    let at = bytes.windows(from.len()).position(|w| w == from).expect("the pickle names package_classes.Net");
    bytes[at..at + from.len()].copy_from_slice(b"package_missing\nNet");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("missing_module.pt");
    std::fs::write(&path, &bytes).unwrap();
    let e = TorchReader::open(&path).unwrap_err();
    assert!(
        matches!(e.kind(), Error::PackageMissingModule { resource, module, .. }
            if resource == "models/model.pkl" && module == "package_missing"),
        "{e:?}"
    );
    assert!(e.to_string().contains("neither holds nor"), "{e}");
    let Err(e) = ckpt::open(&path) else { panic!("the damaged package opened") };
    assert!(e.to_string().contains("missing_module.pt"), "{e}");
}
