//! Plain pickles of models (issue 39, `conformance/fixtures/pickle/`): objects holding an `nn.Module`, numpy
//! arrays and tensors written by `pickle.dump` under protocols 0 to 5, each tensor's storage a
//! `torch.storage._load_from_bytes` stream. Each one opens as format `pickle` with exactly the tensors its
//! manifest lists (what `pickle.load` gives: name, dtype, shape, sha256), verifies deep, converts to
//! safetensors and to torch (which `torch.load` reads to the same tensors) and diffs equal; the tool does
//! the same; hostile variants give their own errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ckpt::{ConvertOptions, DiffOptions, EntryKind, Format, convert};
use ckpt_conformance::{fixtures, run_python};
use sha2::{Digest, Sha256};

/// The fixtures, by file name.
const FILES: [&str; 8] = [
    "wrapper_p0.pkl",
    "wrapper_p1.pkl",
    "wrapper_p2.pkl",
    "wrapper_p3.pkl",
    "wrapper_p4.pkl",
    "wrapper_p5.pkl",
    "module_p4.pkl",
    "tensors_p2.pkl",
];

fn pickle_fixture(name: &str) -> PathBuf {
    fixtures("pickle").join(name)
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// (dtype, shape, sha256) of every tensor, by name.
type Tensors = BTreeMap<String, (String, Vec<usize>, String)>;

fn manifest_json(file: &str) -> serde_json::Value {
    let stem = Path::new(file).file_stem().unwrap().to_string_lossy().into_owned();
    serde_json::from_str(&std::fs::read_to_string(pickle_fixture(&format!("{stem}.json"))).unwrap()).unwrap()
}

/// The tensors the manifest lists by name (what `pickle.load` gives).
fn manifest(file: &str) -> Tensors {
    let json = manifest_json(file);
    let tensors = json["tensors"].as_object().unwrap_or_else(|| panic!("{file}: no tensors"));
    tensors
        .iter()
        .map(|(name, t)| {
            let shape = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            (name.clone(), (t["dtype"].as_str().unwrap().to_owned(), shape, t["sha256"].as_str().unwrap().to_owned()))
        })
        .collect()
}

/// The tensors ckpt lists in the checkpoint at `path`, read back.
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
fn every_tensor_is_listed_as_pickle_load_gives_it() {
    for file in FILES {
        let path = pickle_fixture(file);
        assert_eq!(ckpt::detect(&path).unwrap(), Format::Pickle, "{file}");
        let want = manifest(file);
        assert!(want.len() >= 4, "{file}: the manifest lists {} tensors", want.len());
        assert_eq!(listed(&path), want, "{file}");
    }
    // Every protocol, and the module itself listed as its state dict.
    let protocols: Vec<u64> = FILES.iter().map(|f| manifest_json(f)["protocol"].as_u64().unwrap()).collect();
    assert!((0..=5).all(|p| protocols.contains(&p)), "{protocols:?}");
    let ck = ckpt::open(pickle_fixture("module_p4.pkl")).unwrap();
    let names: Vec<String> = ck.entries().into_iter().map(|e| e.name).collect();
    let want: Vec<String> = manifest_json("module_p4.pkl")["state_dict"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, want);
}

#[test]
fn every_fixture_verifies_deep() {
    for file in FILES {
        let report = ckpt::verify(pickle_fixture(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(report.is_ok(), "{file}: {:?}", report.problems);
    }
}

#[test]
fn conversions_keep_every_tensor_and_torch_loads_them() {
    let tmp = tempfile::tempdir().unwrap();
    for file in FILES {
        let src = pickle_fixture(file);
        let st = tmp.path().join(format!("{file}.safetensors"));
        let summary = convert(&src, None, &st, Format::Safetensors, &ConvertOptions::default())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(summary.tensors, manifest(file).len(), "{file}");
        assert_eq!(listed(&st), manifest(file), "{file}");
        let pt = tmp.path().join(format!("{file}.pt"));
        convert(&src, None, &pt, Format::Torch, &ConvertOptions::default()).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(listed(&pt), manifest(file), "{file}");
        for dst in [&st, &pt] {
            let d = ckpt::diff(&src, dst, &DiffOptions::default().with_atol(0.0).with_rtol(0.0)).unwrap();
            assert!(d.is_equal(), "{file} vs {}: {d:?}", dst.display());
        }
        // torch.load of the rewrite gives what pickle.load of the source gives.
        let out = run_python("plain_pickle/check_torch.py", &[&src, &pt]);
        assert!(out.contains(&format!("{} tensors equal", manifest(file).len())), "{file}: {out}");
    }
    // A plain pickle is read, not written.
    let e = convert(
        pickle_fixture("tensors_p2.pkl"),
        None,
        tmp.path().join("x.pkl"),
        Format::Pickle,
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("does not write"), "{e}");
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
        let path = pickle_fixture(file);
        let n = manifest(file).len();
        let (code, out) = ckpt_tool(&[&"inspect", &path]);
        assert_eq!(code, 0, "{file}: {out}");
        assert!(out.contains("pickle") && out.contains(&format!("\n{n} tensors, ")), "{file}: {n} tensors?\n{out}");
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
    // A tensor inside the wrapper's module, printed.
    let (code, out) = ckpt_tool(&[&"cat", &pickle_fixture("wrapper_p5.pkl"), &"module_.lin.bias"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("[-0.3750, 0.1875]"), "{out}");
}

/// Replaces the first `_load_from_bytes` stream of `data` (a protocol 3+ pickle: BINBYTES) by bytes of the
/// same length that are not a torch stream.
fn spoil_first_stream(data: &[u8]) -> Vec<u8> {
    let magic = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19";
    let at = data.windows(magic.len()).position(|w| w == magic).unwrap();
    let mut out = data.to_vec();
    out[at..at + magic.len()].copy_from_slice(&[0x42; 14]);
    out
}

#[test]
fn hostile_pickles_give_their_own_errors() {
    use ckpt::tensor::Buffer;
    use ckpt::torch::{Error, ReadOptions, TorchReader};
    let read = |bytes: Vec<u8>| TorchReader::from_buffer(&Buffer::from_vec(bytes), &ReadOptions::default());
    let good = std::fs::read(pickle_fixture("wrapper_p4.pkl")).unwrap();
    assert!(read(good.clone()).is_ok());
    // A stream that is not a torch.save stream.
    let e = read(spoil_first_stream(&good)).unwrap_err();
    assert!(
        matches!(e.kind(), Error::LoadFromBytes { source, .. } if matches!(**source, Error::Unrecognized { .. })),
        "{e:?}"
    );
    assert!(e.to_string().contains("not a torch.save stream"), "{e}");
    // A truncated pickle: every prefix fails without a panic, a cut in the middle as a truncated pickle.
    let e = read(good[..good.len() / 2].to_vec()).unwrap_err();
    assert!(
        matches!(e.kind(), Error::Pickle { part: "pickle", source } if source.kind() == ckpt::pickle::ErrorKind::Malformed),
        "{e:?}"
    );
    for cut in (2..good.len()).step_by(97) {
        assert!(read(good[..cut].to_vec()).is_err(), "{cut}");
    }
    // Bytes that are not a pickle stay "not a checkpoint".
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.pkl");
    std::fs::write(&junk, b"\x80\x07not a pickle at all").unwrap();
    let Err(e) = ckpt::open(&junk) else { panic!("junk opened") };
    assert!(e.to_string().contains("not a checkpoint: this is binary data"), "{e}");
    // The tool says the same, naming the file.
    let (code, out) = ckpt_tool(&[&"inspect", &tmp.path().join("junk.pkl")]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("junk.pkl"), "{out}");
}
