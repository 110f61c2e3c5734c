//! hfai conformance, against `conformance/python/hfai/hfai_ref.py` (hfai's `save`/`load` written from the
//! spec, run with real torch and gloo): every golden fixture reads to exactly what the Python `load`
//! returns; fed the same input, the Rust writer produces the Python parts byte for byte; Rust-written and
//! resharded checkpoints load in Python (`torch.load(weights_only=True)` per part, the reference `load`);
//! bad input is rejected by both sides; and a tensor just over the real 256 MiB threshold round-trips in
//! both directions.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use ckpt_collective::ThreadGroup;
use ckpt_conformance::{fixtures, run_python, typed_tree};
use ckpt_hfai::{Error, HfaiReader, ModelState, ReshardOptions, SaveState, WriteOptions, part_file_name};
use ckpt_tensor::{DType, Dict, Tensor, Value, leaves};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

struct Case {
    name: String,
    dir: PathBuf,
    expected: Json,
}

impl Case {
    fn ckpt(&self) -> PathBuf {
        self.dir.join("ckpt")
    }

    fn world_size(&self) -> usize {
        self.expected["nshards"].as_u64().unwrap() as usize
    }

    fn large_size(&self) -> u64 {
        self.expected["large_size"].as_u64().unwrap()
    }

    fn buffers(&self) -> Vec<Vec<String>> {
        self.expected["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_owned()).collect())
            .collect()
    }

    fn write_options(&self) -> WriteOptions {
        WriteOptions::default().with_large_size(self.large_size())
    }
}

fn cases() -> Vec<Case> {
    let root = fixtures("hfai");
    let mut out: Vec<Case> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").exists())
        .map(|dir| Case {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            expected: serde_json::from_slice(&fs::read(dir.join("expected.json")).unwrap()).unwrap(),
            dir,
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(out.len(), 5, "expected the 5 hfai fixture cases in {}", root.display());
    out
}

fn sha256(t: &Tensor) -> String {
    hex::encode(Sha256::digest(t.data().unwrap()))
}

fn dims(j: &Json) -> Vec<usize> {
    j.as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect()
}

#[test]
fn every_fixture_reads_as_the_python_reference_loads_it() {
    let mut checked = 0;
    for case in cases() {
        let ckpt = HfaiReader::open(case.ckpt()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let name = &case.name;
        assert_eq!(ckpt.world_size(), case.world_size(), "{name}");
        assert_eq!(typed_tree(ckpt.value()), case.expected["tree"], "{name}: typed tree differs from hfai_ref.load");

        let all = leaves(ckpt.value()).unwrap();
        let by_path: HashMap<&str, &Value> = all.iter().map(|e| (e.key.as_str(), e.value)).collect();
        let mut chunked: Vec<String> = ckpt.chunked().to_vec();
        chunked.sort();
        let expected_chunked: Vec<String> =
            case.expected["large"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect();
        assert_eq!(chunked, expected_chunked, "{name}: chunked tensors");
        let records = case.expected["tensors"].as_array().unwrap();
        for t in records {
            let p = t["path"].as_str().unwrap();
            let ctx = format!("{name}: {p}");
            let tensor = by_path.get(p).and_then(|v| v.as_tensor()).unwrap_or_else(|| panic!("{ctx}: no tensor"));
            assert_eq!(tensor.dtype(), DType::from_torch_name(t["dtype"].as_str().unwrap()).unwrap(), "{ctx}");
            assert_eq!(tensor.shape(), dims(&t["shape"]).as_slice(), "{ctx} shape");
            assert_eq!(tensor.strides(), dims(&t["stride"]).as_slice(), "{ctx} stride");
            assert_eq!(tensor.storage_offset() as u64, t["storage_offset"].as_u64().unwrap(), "{ctx} offset");
            assert_eq!(tensor.storage().len() as u64, t["storage_nbytes"].as_u64().unwrap(), "{ctx} storage");
            assert_eq!(tensor.requires_grad(), t["requires_grad"].as_bool().unwrap(), "{ctx} requires_grad");
            assert_eq!(sha256(tensor), t["sha256"].as_str().unwrap(), "{ctx} values");
            // zero copy: whole tensors are windows of the part files; chunked ones when there is one part
            let is_chunked = ckpt.chunked().iter().any(|c| c == p);
            assert_eq!(tensor.storage().is_mapped(), !is_chunked || case.world_size() == 1, "{ctx}: mapped");
            checked += 1;
        }
        let tensor_leaves = all.iter().filter(|e| e.value.as_tensor().is_some()).count();
        assert_eq!(tensor_leaves, records.len(), "{name}: tensor count");
    }
    assert!(checked > 300, "only {checked} tensors checked");
}

/// What rank 0 handed to the Python `save`, from `source.pt`.
fn source_state(case: &Case) -> SaveState {
    let v = ckpt_torch::load(&case.dir.join("source.pt")).unwrap();
    let d = v.as_dict().unwrap();
    let mut state = SaveState::default();
    for m in d.get("models").unwrap().as_sequence().unwrap() {
        let m = m.as_dict().unwrap();
        let sd = m.get("state_dict").unwrap().as_dict().unwrap().clone();
        let buffers = m.get("buffers").unwrap().as_sequence().unwrap().iter().map(|b| b.as_str().unwrap().to_owned());
        state = state.with_model(ModelState::new(sd).with_buffers(buffers));
    }
    for o in d.get("optimizers").unwrap().as_sequence().unwrap() {
        state = state.with_optimizer(o.clone());
    }
    state.others = d.get("others").unwrap().as_dict().unwrap().items.clone();
    state
}

/// The parts ckpt wrote are hfai's byte for byte; beside them, the checksum manifest (hfai writes none and
/// its loader ignores it) lists every part and verifies.
fn assert_same_parts(expected: &Path, got: &Path, n: usize, what: &str) {
    let sums = ckpt_io::Manifest::read(got).unwrap().expect("ckpt writes a checksum manifest");
    assert!(sums.verify_dir(got).unwrap().is_empty(), "{what}: checksums");
    let mut names: Vec<String> = fs::read_dir(got)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != ckpt_io::MANIFEST_NAME)
        .collect();
    names.sort();
    assert_eq!(names, (0..n).map(part_file_name).collect::<Vec<_>>(), "{what}: files");
    assert_eq!(sums.files.keys().cloned().collect::<Vec<_>>(), names, "{what}: the manifest lists every part");
    for name in names {
        let (a, b) = (fs::read(expected.join(&name)).unwrap(), fs::read(got.join(&name)).unwrap());
        let first = a.iter().zip(&b).position(|(x, y)| x != y);
        assert!(a == b, "{what}: {name} differs (sizes {} vs {}, first difference at {first:?})", a.len(), b.len());
    }
}

#[test]
fn rust_writer_reproduces_the_python_parts_byte_for_byte() {
    for case in cases() {
        let state = source_state(&case);
        let n = case.world_size();
        let one = tempfile::tempdir().unwrap();
        ckpt_hfai::save(&state, one.path(), &case.write_options().with_world_size(n)).unwrap();
        assert_same_parts(&case.ckpt(), one.path(), n, &format!("{}: save", case.name));

        let ranks = tempfile::tempdir().unwrap();
        std::thread::scope(|s| {
            for g in ThreadGroup::new(n) {
                let (state, dir, opts) = (&state, ranks.path(), case.write_options());
                s.spawn(move || ckpt_hfai::save_rank(state, dir, &opts, &g).unwrap());
            }
        });
        assert_same_parts(&case.ckpt(), ranks.path(), n, &format!("{}: save_rank", case.name));
    }
}

/// The state of a read checkpoint, to write it again.
fn state_of(ckpt: &HfaiReader, buffers: &[Vec<String>]) -> SaveState {
    let mut state = SaveState::default();
    for (m, model) in ckpt.models().into_iter().enumerate() {
        state =
            state.with_model(ModelState::new(model.clone()).with_buffers(buffers.get(m).cloned().unwrap_or_default()));
    }
    for o in ckpt.optimizers() {
        state = state.with_optimizer(Value::Dict(o.clone()));
    }
    state.others = ckpt.others().map(|(k, v)| (k.clone(), v.clone())).collect();
    state
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Rewrites part `rank` of `dir` after `edit` changed its top-level dict.
fn edit_part(dir: &Path, rank: usize, edit: impl FnOnce(&mut Dict)) {
    let path = dir.join(part_file_name(rank));
    let Value::Dict(mut d) = ckpt_torch::load(&path).unwrap() else { panic!("not a dict") };
    edit(&mut d);
    ckpt_torch::save(&Value::Dict(d), &path, &ckpt_torch::WriteOptions::default()).unwrap();
}

/// A bad copy of a fixture: its directory, what is wrong, and whether an error is the one expected.
type BadCopy = (PathBuf, &'static str, fn(&Error) -> bool);

/// Bad copies of the fixtures, each with the error the Rust reader must give.
fn bad_copies(root: &Path) -> Vec<BadCopy> {
    let case = |n: &str| fixtures("hfai").join(n).join("ckpt");
    let mut out: Vec<BadCopy> = Vec::new();

    let d = root.join("missing_part");
    copy_dir(&case("single_n3"), &d);
    fs::remove_file(d.join("PART_001.pt")).unwrap();
    out.push((d, "a missing part", |e| matches!(e, Error::MissingPart { rank: 1, world_size: Some(3), .. })));

    let d = root.join("nshards_mismatch");
    copy_dir(&case("single_n2"), &d);
    fs::copy(case("single_n3").join("PART_001.pt"), d.join("PART_001.pt")).unwrap();
    out.push((d, "a part of a 3-part save among 2", |e| {
        matches!(e, Error::NshardsMismatch { expected: 2, found: 3, .. })
    }));

    let d = root.join("chunk_sizes");
    copy_dir(&case("single_n2"), &d);
    edit_part(&d, 1, |p| {
        let (_, model) = p.items.iter_mut().find(|(k, _)| k.as_str() == Some("model")).unwrap();
        let Value::List(models) = model else { panic!() };
        let Value::Tuple(pair) = &mut models[0] else { panic!() };
        let Value::Dict(large) = &mut pair[1] else { panic!() };
        let Value::Tuple(entry) = &mut large.items[0].1 else { panic!() };
        let chunk = entry[1].as_tensor().unwrap();
        entry[1] = Value::Tensor(chunk.narrow(0, 1, chunk.numel() - 1).unwrap().to_contiguous().unwrap());
    });
    out.push((d, "a chunk one element short", |e| matches!(e, Error::ChunkSizeMismatch { .. })));

    let d = root.join("version");
    copy_dir(&case("noopt_n3"), &d);
    edit_part(&d, 0, |p| {
        p.items.iter_mut().find(|(k, _)| k.as_str() == Some("__version__")).unwrap().1 = Value::from("2.1.0");
    });
    out.push((
        d,
        "__version__ 2.1.0",
        |e| matches!(e, Error::UnsupportedVersion { found, .. } if found == "\"2.1.0\""),
    ));

    let d = root.join("version1");
    copy_dir(&case("noopt_n3"), &d);
    for r in 0..3 {
        edit_part(&d, r, |p| p.items.retain(|(k, _)| k.as_str() != Some("__version__")));
    }
    out.push((d, "no __version__ (1.0.0)", |e| matches!(e, Error::Version1 { .. })));
    out
}

#[test]
fn bad_input_gives_specific_errors() {
    let root = tempfile::tempdir().unwrap();
    for (dir, what, expected) in bad_copies(root.path()) {
        let e = HfaiReader::open(&dir).unwrap_err();
        assert!(expected(&e), "{what}: unexpected error {e:?}");
    }
}

#[test]
fn rust_written_and_resharded_checkpoints_load_in_python() {
    let root = tempfile::tempdir().unwrap();
    let mut checks: Vec<Json> = Vec::new();
    let mut check = |candidate: &Path, case: &Case, large_size: u64, buffers: Option<Vec<Vec<String>>>| {
        checks.push(json!({
            "candidate": candidate, "reference": case.ckpt(), "large_size": large_size, "buffers": buffers,
        }));
    };
    let all = cases();
    let find = |name: &str| all.iter().find(|c| c.name == name).unwrap();
    for case in &all {
        // read with Rust, write again with Rust (same number of parts)
        let ckpt = HfaiReader::open(case.ckpt()).unwrap();
        let out = root.path().join(format!("resave_{}", case.name));
        ckpt_hfai::save(
            &state_of(&ckpt, &case.buffers()),
            &out,
            &case.write_options().with_world_size(case.world_size()),
        )
        .unwrap();
        check(&out, case, case.large_size(), Some(case.buffers()));
    }
    // reshard N -> M (buffers kept whole in part 0), and back
    let reshards = [
        ("single_n3", 2, true),
        ("single_n2", 5, true),
        ("single_n2", 4, false),
        ("multi_n2", 3, true),
        ("noopt_n3", 1, true),
        ("single_n1", 4, false),
    ];
    for (name, m, copies) in reshards {
        let case = find(name);
        let mut options = ReshardOptions::default().with_write(case.write_options());
        for (i, b) in case.buffers().into_iter().enumerate() {
            options = options.with_buffers(i, b);
        }
        let out = root.path().join(format!("reshard_{name}_to_{m}"));
        let s = ckpt_hfai::reshard(case.ckpt(), &out, m, &options).unwrap();
        assert_eq!((s.from, s.to), (case.world_size(), m));
        assert_eq!(s.copied_bytes.unwrap() > 0, copies, "{name} -> {m}: {s:?}");
        check(&out, case, case.large_size(), Some(case.buffers()));
        assert_eq!(HfaiReader::open(&out).unwrap().world_size(), m);
        let back = root.path().join(format!("reshard_{name}_to_{m}_back"));
        ckpt_hfai::reshard(&out, &back, case.world_size(), &options).unwrap();
        check(&back, case, case.large_size(), Some(case.buffers()));
    }
    // the Python reference refuses the bad copies too
    let bad = bad_copies(&root.path().join("bad"));
    for (dir, _, _) in &bad {
        checks.push(json!({ "reject": dir }));
    }
    let spec = root.path().join("spec.json");
    fs::write(&spec, serde_json::to_vec_pretty(&json!({ "checks": checks })).unwrap()).unwrap();
    let out = run_python("hfai/check_load.py", &[&spec]);
    let expected = checks.len();
    assert!(out.contains(&format!("{expected}/{expected} checks passed")), "{out}");
}

/// Row-major element i of the big tensor: i % 1021 - 510 (float32); of the edge tensor: i % 255 - 127
/// (bfloat16), as `conformance/python/hfai/big.py` builds them.
fn assert_pattern(t: &Tensor, period: usize, what: &str) {
    let data = t.data().unwrap();
    let es = t.dtype().size();
    let one: Vec<u8> = (0..period)
        .flat_map(|i| {
            let v = i as f32 - (period / 2) as f32;
            match t.dtype() {
                DType::F32 => v.to_le_bytes().to_vec(),
                DType::BF16 => ((v.to_bits() >> 16) as u16).to_le_bytes().to_vec(), // exact: small integers
                other => panic!("{what}: {other}"),
            }
        })
        .collect();
    for (k, chunk) in data.chunks(period * es).enumerate() {
        assert!(chunk == &one[..chunk.len()], "{what}: values differ in period {k}");
    }
}

#[test]
fn real_256mib_threshold_both_directions() {
    let root = tempfile::tempdir().unwrap();
    let py = root.path().join("python");
    run_python("hfai/big.py", &[Path::new("write"), &py]);

    // Python -> Rust
    let ckpt = HfaiReader::open(&py).unwrap();
    assert_eq!(ckpt.world_size(), 2);
    assert_eq!(ckpt.chunked(), ["model.big"], "just over 256 MiB is chunked, exactly 256 MiB is not");
    let model = ckpt.model().unwrap();
    let keys: Vec<&str> = model.items.iter().map(|(k, _)| k.as_str().unwrap()).collect();
    assert_eq!(keys, ["edge", "big"]);
    let big = model.get("big").unwrap().as_tensor().unwrap();
    assert_eq!((big.dtype(), big.shape()), (DType::F32, &[8193usize, 8193][..]));
    assert_eq!(big.nbytes(), 268_500_996);
    assert_pattern(big, 1021, "big");
    let edge = model.get("edge").unwrap().as_tensor().unwrap();
    assert_eq!((edge.dtype(), edge.nbytes()), (DType::BF16, 256 << 20));
    assert!(edge.storage().is_mapped(), "the whole edge tensor is a window of its part");
    assert_pattern(edge, 255, "edge");
    assert_eq!(ckpt.concatenated_bytes(), 268_500_996);
    assert_eq!(ckpt.other("step"), Some(&Value::Int(1)));

    // Rust -> Python, with the real threshold (the default)
    let rs = root.path().join("rust");
    ckpt_hfai::save(&state_of(&ckpt, &[]), &rs, &WriteOptions::default().with_world_size(2)).unwrap();
    drop(ckpt);
    fs::remove_dir_all(&py).unwrap();
    let out = run_python("hfai/big.py", &[Path::new("check"), &rs]);
    assert!(out.contains("ok:"), "{out}");
}
