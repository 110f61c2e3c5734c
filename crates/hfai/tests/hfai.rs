//! ckpt-hfai without Python: save → open round trips for 1..5 parts, the on-disk layout of every part,
//! single-process and per-rank writers agreeing byte for byte, resharding, the completion check, and one
//! test per rejection rule.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use ckpt_collective::{Collective, SingleProcess, ThreadGroup};
use ckpt_hfai::{
    Error, HfaiReader, ModelState, RankShare, ReshardOptions, SaveState, WriteOptions, chunk_ranges, part_file_name,
    reshard, save, save_rank,
};
use ckpt_tensor::{CheckpointRead, DType, Dict, DictKind, Tensor, Value};

/// Deterministic values: element i of tensor `k` is ((i * (2k + 5) + k) % 17 - 8) / 4.
fn f32s(k: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i * (2 * k + 5) + k) % 17) as f32 / 4.0 - 2.0).collect();
    Tensor::from_slice(&v, shape).unwrap()
}

fn f16s(k: usize, n: usize) -> Tensor {
    let v: Vec<half::f16> = (0..n).map(|i| half::f16::from_f32(((i + k) % 9) as f32 - 4.0)).collect();
    Tensor::from_slice(&v, &[n]).unwrap()
}

const LARGE: u64 = 1000;

fn state_dict() -> Dict {
    let mut sd = Dict::new(DictKind::OrderedDict);
    sd.insert("embed.weight", f32s(0, &[40, 8])); // 1280 bytes: large under LARGE
    sd.insert("layers.0.w", f32s(1, &[16, 8])); // 512: equal sizes, a tie
    sd.insert("layers.0.b", f32s(2, &[16]));
    sd.insert("layers.1.w", f32s(3, &[16, 8]));
    sd.insert("layers.1.b", f32s(4, &[16]));
    sd.insert("half", f16s(5, 10));
    sd.insert("bn.running_mean", f32s(6, &[8]));
    sd.insert("bn.running_var", f32s(7, &[8]));
    sd.insert("bn.num_batches_tracked", Tensor::from_slice(&[3i64], &[]).unwrap());
    sd.insert("head.weight", f32s(8, &[4, 8]).transpose(0, 1).unwrap()); // a non-contiguous view
    sd
}

fn adam_state() -> Value {
    let entry = |k: usize, shape: &[usize]| {
        Value::dict([
            ("step", Value::Tensor(Tensor::from_slice(&[3.0f32], &[]).unwrap())),
            ("exp_avg", Value::Tensor(f32s(10 + k, shape))),
            ("exp_avg_sq", Value::Tensor(f32s(20 + k, shape))),
        ])
    };
    let mut state = Dict::new(DictKind::Dict);
    state.insert(Value::Int(0), entry(0, &[40, 8]));
    state.insert(Value::Int(1), entry(1, &[16, 8]));
    state.insert(Value::Int(2), entry(2, &[16]));
    state.insert(Value::Int(3), Value::dict::<&str>([]));
    let group = Value::dict([
        ("lr", Value::Float(0.01)),
        ("betas", Value::Tuple(vec![Value::Float(0.9), Value::Float(0.999)])),
        ("params", Value::List((0..4).map(Value::Int).collect())),
    ]);
    Value::dict([("state", Value::Dict(state)), ("param_groups", Value::List(vec![group]))])
}

fn sample() -> SaveState {
    SaveState::default()
        .with_model(ModelState::new(state_dict()).with_buffers([
            "bn.running_mean",
            "bn.running_var",
            "bn.num_batches_tracked",
        ]))
        .with_optimizer(adam_state())
        .with_other("epoch", Value::Int(3))
        .with_other("config", Value::dict([("name", Value::from("tiny")), ("lr", Value::Float(0.01))]))
}

fn opts() -> WriteOptions {
    WriteOptions::default().with_large_size(LARGE)
}

fn by_key(d: &Dict) -> HashMap<String, &Value> {
    d.items.iter().map(|(k, v)| (ckpt_tensor::flatten::python_str(k).unwrap(), v)).collect()
}

fn assert_tensor_eq(a: &Value, b: &Value, what: &str) {
    let (a, b) = (a.as_tensor().unwrap(), b.as_tensor().unwrap());
    assert!(a.bitwise_eq(b), "{what}: {a:?} != {b:?}");
}

/// The loaded model equals the state dict (as a set of keys), the optimizer its state dict.
fn assert_loads_to(ckpt: &HfaiReader, state: &SaveState) {
    assert_eq!(ckpt.models().len(), state.models.len());
    for (loaded, original) in ckpt.models().iter().zip(&state.models) {
        assert_eq!(loaded.kind, DictKind::Dict, "hfai's loader merges into a plain dict");
        let (l, o) = (by_key(loaded), by_key(&original.state_dict));
        assert_eq!(l.len(), o.len());
        for (k, v) in o {
            assert_tensor_eq(l[&k], v, &k);
        }
    }
    for (loaded, original) in ckpt.optimizers().iter().zip(&state.optimizers) {
        let od = original.as_dict().unwrap();
        assert_eq!(loaded.get("param_groups"), od.get("param_groups"));
        let ls = loaded.get("state").unwrap().as_dict().unwrap();
        assert_eq!(ls.kind, DictKind::OrderedDict);
        let (l, o) = (by_key(ls), by_key(od.get("state").unwrap().as_dict().unwrap()));
        assert_eq!(l.len(), o.len());
        for (k, v) in o {
            let (le, oe) = (by_key(l[&k].as_dict().unwrap()), by_key(v.as_dict().unwrap()));
            assert_eq!(le.len(), oe.len(), "state {k}");
            for (k2, v2) in oe {
                assert_tensor_eq(le[&k2], v2, &format!("state {k}.{k2}"));
            }
        }
    }
    let others: Vec<(Value, Value)> = ckpt.others().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(others, state.others);
}

fn part(dir: &Path, rank: usize) -> Dict {
    match ckpt_torch::load(&dir.join(part_file_name(rank))).unwrap() {
        Value::Dict(d) => d,
        other => panic!("part {rank} is a {}", other.type_name()),
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn save_then_open_round_trips_for_1_to_5_parts() {
    let state = sample();
    for n in 1..=5 {
        let dir = tempfile::tempdir().unwrap();
        save(&state, dir.path(), &opts().with_world_size(n)).unwrap();
        let mut expected: Vec<String> = (0..n).map(part_file_name).collect();
        expected.push("ckpt.checksums.json".into());
        assert_eq!(files(dir.path()), expected, "no temporary files left");
        let ckpt = HfaiReader::open(dir.path()).unwrap();
        assert_eq!(ckpt.world_size(), n);
        assert_loads_to(&ckpt, &state);
        assert_eq!(ckpt.chunked(), ["model.embed.weight", "optimizer.state.0.exp_avg", "optimizer.state.0.exp_avg_sq"]);
        // hfai's merge order: the large tensor comes after every small key
        let model = ckpt.model().unwrap();
        assert_eq!(model.items.last().unwrap().0, Value::from("embed.weight"));
        // the chunked optimizer tensors go back after "step", as in the original
        let state0 = ckpt.optimizers()[0].get("state").unwrap().as_dict().unwrap();
        let entry0 = state0.items.iter().find(|(k, _)| k == &Value::Int(0)).unwrap().1.as_dict().unwrap();
        let keys: Vec<&str> = entry0.items.iter().map(|(k, _)| k.as_str().unwrap()).collect();
        assert_eq!(keys, ["step", "exp_avg", "exp_avg_sq"]);
        // small tensors are windows of the part files; chunked ones too when there is one part
        for (k, v) in &model.items {
            let t = v.as_tensor().unwrap();
            let chunked = k.as_str() == Some("embed.weight");
            assert_eq!(t.storage().is_mapped(), !chunked || n == 1, "{k:?} with {n} parts");
        }
        let expected_copy = if n == 1 { 0 } else { 3 * 1280 };
        assert_eq!(ckpt.concatenated_bytes(), expected_copy);
    }
}

#[test]
fn every_part_has_hfais_layout() {
    let state = sample();
    let dir = tempfile::tempdir().unwrap();
    let n = 3;
    save(&state, dir.path(), &opts().with_world_size(n)).unwrap();
    let mut owner: HashMap<String, usize> = HashMap::new();
    for r in 0..n {
        let p = part(dir.path(), r);
        let keys: Vec<&str> = p.items.iter().map(|(k, _)| k.as_str().unwrap()).collect();
        if r == 0 {
            assert_eq!(keys, ["__nshards__", "__version__", "model", "optimizer", "epoch", "config"]);
        } else {
            assert_eq!(keys, ["__nshards__", "__version__", "model", "optimizer"]);
        }
        assert_eq!(p.get("__nshards__"), Some(&Value::Int(3)));
        assert_eq!(p.get("__version__"), Some(&Value::from("2.0.0")));
        let [Value::Tuple(model)] = p.get("model").unwrap().as_sequence().unwrap() else { panic!() };
        let (params, large) = (model[0].as_dict().unwrap(), model[1].as_dict().unwrap());
        assert_eq!(params.kind, DictKind::OrderedDict);
        assert_eq!(large.kind, DictKind::Dict);
        for (k, v) in &params.items {
            let k = k.as_str().unwrap().to_owned();
            let t = v.as_tensor().unwrap();
            // hfai clones every model tensor: a storage of exactly its own elements
            assert!(t.storage_offset() == 0 && t.storage().len() == t.nbytes(), "{k} compact");
            assert!(owner.insert(k.clone(), r).is_none(), "{k} in two parts");
        }
        if r == 0 {
            // buffers whole, at the end of rank 0's params
            let tail: Vec<&str> = params.items.iter().rev().take(3).map(|(k, _)| k.as_str().unwrap()).collect();
            assert_eq!(tail, ["bn.num_batches_tracked", "bn.running_var", "bn.running_mean"]);
        }
        // the large tensor: (torch.Size, this rank's torch.chunk piece)
        let [(k, v)] = large.items.as_slice() else { panic!("one large tensor") };
        assert_eq!(k, &Value::from("embed.weight"));
        let [Value::Size(shape), chunk] = v.as_sequence().unwrap() else { panic!("{v:?}") };
        assert_eq!(shape, &[40, 8]);
        let range = chunk_ranges(320, n)[r].clone();
        let chunk = chunk.as_tensor().unwrap();
        assert_eq!(chunk.shape(), &[range.len()]);
        let whole = f32s(0, &[320]).to_vec::<f32>().unwrap();
        assert_eq!(chunk.to_vec::<f32>().unwrap(), &whole[range]);

        let [Value::Tuple(opt)] = p.get("optimizer").unwrap().as_sequence().unwrap() else { panic!() };
        let od = opt[0].as_dict().unwrap();
        assert_eq!(
            od.get("param_groups"),
            adam_state().as_dict().unwrap().get("param_groups"),
            "param_groups in every part"
        );
        assert_eq!(od.get("state").unwrap().as_dict().unwrap().kind, DictKind::OrderedDict);
        let ol = opt[1].as_dict().unwrap();
        let keys: Vec<&Value> = ol.items.iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                &Value::Tuple(vec![Value::Int(0), Value::from("exp_avg")]),
                &Value::Tuple(vec![Value::Int(0), Value::from("exp_avg_sq")])
            ]
        );
    }
    // every small entry (9 of the 10 state-dict keys: embed.weight is chunked) is in exactly one part
    assert_eq!(owner.len(), 9);
    // the largest small entries went to ranks 0, 1, 2 in order: the tie between layers.1.w and layers.0.w
    // is broken later-key first (numpy's reversed argsort)
    assert_eq!(owner["layers.1.w"], 0);
    assert_eq!(owner["layers.0.w"], 1);
}

#[test]
fn one_process_and_n_ranks_write_the_same_bytes() {
    let state = sample();
    for n in [1, 2, 3] {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        save(&state, a.path(), &opts().with_world_size(n)).unwrap();
        std::thread::scope(|s| {
            for g in ThreadGroup::new(n) {
                let (state, dir) = (&state, b.path());
                s.spawn(move || save_rank(state, dir, &opts(), &g).unwrap());
            }
        });
        for r in 0..n {
            let f = part_file_name(r);
            assert!(fs::read(a.path().join(&f)).unwrap() == fs::read(b.path().join(&f)).unwrap(), "{n} parts: {f}");
        }
        assert_eq!(files(b.path()).len(), n + 1, "the parts and the checksum manifest");
        let sums = ckpt_io::Manifest::read(b.path()).unwrap().unwrap();
        assert!(sums.verify_dir(b.path()).unwrap().is_empty());
        assert_eq!(sums.files.len(), n);
    }
}

#[test]
fn a_failing_rank_fails_every_rank() {
    let good = sample();
    let bad = sample().with_other("model", Value::Int(1));
    let dir = tempfile::tempdir().unwrap();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ThreadGroup::new(3)
            .into_iter()
            .map(|g| {
                let state = if g.rank() == 1 { &bad } else { &good };
                let dir = dir.path();
                s.spawn(move || save_rank(state, dir, &opts(), &g))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(matches!(&results[1], Err(Error::ReservedKey { key }) if key == "model"), "{:?}", results[1]);
    assert!(matches!(&results[0], Err(Error::RankFailed { rank: 1, .. })), "{:?}", results[0]);
    assert!(
        matches!(&results[2], Err(Error::RankFailed { rank: 1, message }) if message.contains("reserved")),
        "{:?}",
        results[2]
    );
    assert!(!dir.path().join("PART_000.pt").exists(), "nothing committed");
}

#[test]
fn saving_fewer_parts_removes_stale_ones() {
    let state = sample();
    let dir = tempfile::tempdir().unwrap();
    save(&state, dir.path(), &opts().with_world_size(4)).unwrap();
    save(&state, dir.path(), &opts().with_world_size(2)).unwrap();
    assert_eq!(files(dir.path()), ["PART_000.pt", "PART_001.pt", "ckpt.checksums.json"]);
    assert_loads_to(&HfaiReader::open(dir.path()).unwrap(), &state);

    // a name hfai's loader would count but that is no part name is reported, not deleted
    fs::write(dir.path().join("PART_x.pt"), b"").unwrap();
    let e = save(&state, dir.path(), &opts().with_world_size(2)).unwrap_err();
    assert!(matches!(&e, Error::ForeignFiles { names, .. } if names == &["PART_x.pt"]), "{e}");
    assert!(dir.path().join("PART_x.pt").exists());
}

#[test]
fn threshold_is_strict_and_too_few_chunks_are_refused() {
    let mut sd = Dict::new(DictKind::OrderedDict);
    sd.insert("at", f32s(0, &[250])); // exactly 1000 bytes: not large
    sd.insert("over", f32s(1, &[251]));
    let state = SaveState::default().with_model(ModelState::new(sd));
    let dir = tempfile::tempdir().unwrap();
    save(&state, dir.path(), &opts().with_world_size(2)).unwrap();
    assert_eq!(HfaiReader::open(dir.path()).unwrap().chunked(), ["model.over"]);

    // 5 elements over 4 parts: torch.chunk gives 3 chunks of 2, hfai's chunk(4)[3] raises IndexError
    let mut sd = Dict::new(DictKind::OrderedDict);
    sd.insert("w", f32s(0, &[5]));
    let state = SaveState::default().with_model(ModelState::new(sd));
    let dir = tempfile::tempdir().unwrap();
    let e = save(&state, dir.path().join("ckpt"), &WriteOptions::default().with_large_size(8).with_world_size(4))
        .unwrap_err();
    assert!(
        matches!(&e, Error::TooFewChunks { key, numel: 5, world_size: 4, chunks: 3, chunk_len: 2 } if key == "model.w"),
        "{e}"
    );
    assert!(!dir.path().join("ckpt").exists(), "nothing is written");
}

#[test]
fn several_models_and_optimizers_stay_lists_none_stays_raw() {
    let mut second = Dict::new(DictKind::OrderedDict);
    second.insert("w", f32s(9, &[3]));
    let state = sample().with_model(ModelState::new(second)).with_optimizer(adam_state());
    let dir = tempfile::tempdir().unwrap();
    save(&state, dir.path(), &opts().with_world_size(2)).unwrap();
    let ckpt = HfaiReader::open(dir.path()).unwrap();
    let top = ckpt.value().as_dict().unwrap();
    assert!(matches!(top.get("model"), Some(Value::List(m)) if m.len() == 2));
    assert!(matches!(top.get("optimizer"), Some(Value::List(o)) if o.len() == 2));
    assert!(ckpt.model().is_none());
    assert_loads_to(&ckpt, &state);
    assert!(ckpt.chunked().contains(&"model.0.embed.weight".to_owned()));
    assert!(ckpt.chunked().contains(&"optimizer.1.state.0.exp_avg".to_owned()));

    let none = SaveState { optimizers: vec![], others: vec![], ..sample() };
    let dir = tempfile::tempdir().unwrap();
    save(&none, dir.path(), &opts().with_world_size(3)).unwrap();
    let ckpt = HfaiReader::open(dir.path()).unwrap();
    let top = ckpt.value().as_dict().unwrap();
    assert_eq!(top.get("optimizer"), Some(&Value::List(vec![])), "no optimizer: the raw [] of the file");
    assert!(matches!(top.get("model"), Some(Value::Dict(_))), "one model: unwrapped");
    assert_eq!(ckpt.others().count(), 0);
}

#[test]
fn generic_reader_lists_entries() {
    let dir = tempfile::tempdir().unwrap();
    save(&sample(), dir.path(), &opts().with_world_size(2)).unwrap();
    let ckpt = HfaiReader::open(dir.path()).unwrap();
    assert_eq!(ckpt.format_name(), "hfai");
    let entries = ckpt.entries();
    let w = entries.iter().find(|e| e.name == "model.embed.weight").unwrap();
    assert_eq!(w.tensor_info().unwrap().shape, [40, 8]);
    assert!(ckpt.tensor("model.embed.weight").unwrap().bitwise_eq(&f32s(0, &[40, 8])));
    assert!(ckpt.tensor("optimizer.state.1.exp_avg").unwrap().bitwise_eq(&f32s(11, &[16, 8])));
    assert_eq!(CheckpointRead::value(&ckpt, "epoch").unwrap(), Value::Int(3));
    assert_eq!(CheckpointRead::value(&ckpt, "__nshards__").unwrap(), Value::Int(2));
    assert!(ckpt.tensor("model.nope").is_err());
    let details = ckpt.details();
    assert!(details.contains(&("parts".into(), "2".into())));
    assert!(details.contains(&("chunked tensors".into(), "3".into())));
}

#[test]
fn open_collective_agrees_or_fails_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    save(&sample(), dir.path(), &opts().with_world_size(2)).unwrap();
    let other = tempfile::tempdir().unwrap();
    save(&sample().with_other("extra", Value::Int(1)), other.path(), &opts().with_world_size(2)).unwrap();
    let open_all = |dirs: [&Path; 3]| -> Vec<ckpt_hfai::Result<HfaiReader>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = ThreadGroup::new(3)
                .into_iter()
                .zip(dirs)
                .map(|(g, d)| s.spawn(move || HfaiReader::open_collective(d, &Default::default(), &g)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    for r in open_all([dir.path(); 3]) {
        assert_loads_to(&r.unwrap(), &sample());
    }
    let r = open_all([dir.path(), dir.path(), other.path()]);
    assert!(r.iter().all(|r| matches!(r, Err(Error::Inconsistent { rank: 2, .. }))), "{r:?}");
    let missing = dir.path().join("missing");
    let r = open_all([dir.path(), &missing, dir.path()]);
    assert!(matches!(&r[1], Err(Error::Io { .. })), "{:?}", r[1]);
    assert!(matches!(&r[0], Err(Error::RankFailed { rank: 1, .. })), "{:?}", r[0]);
}

// ------------------------------------------------------------------------------------------------
// resharding

#[test]
fn reshard_round_trips_and_copies_only_spanning_chunks() {
    let state = sample();
    let src = tempfile::tempdir().unwrap();
    save(&state, src.path(), &opts().with_world_size(3)).unwrap();
    let reshard_opts = ReshardOptions::default()
        .with_write(opts())
        .with_buffers(0, ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]);
    for (m, copied) in [(2, true), (5, true), (3, false), (1, true)] {
        let dst = tempfile::tempdir().unwrap();
        let s = reshard(src.path(), dst.path(), m, &reshard_opts).unwrap();
        assert_eq!((s.from, s.to), (3, m));
        assert_eq!(s.saved.files.len(), m + 1, "the parts and the manifest: {s:?}");
        assert!(s.saved.files.iter().all(|f| f.exists()), "{s:?}");
        assert!(s.saved.tensors > 0 && s.saved.bytes >= 3 * 1280, "{s:?}");
        let copied_bytes = s.copied_bytes.unwrap();
        assert_eq!(copied_bytes > 0, copied, "3 -> {m}: {s:?}");
        assert!(copied_bytes <= 3 * 1280);
        let back = HfaiReader::open(dst.path()).unwrap();
        assert_eq!(back.world_size(), m);
        assert_loads_to(&back, &state);
        // buffers are whole at the end of part 0
        let p0 = part(dst.path(), 0);
        let params = p0.get("model").unwrap().as_sequence().unwrap()[0].as_sequence().unwrap()[0].as_dict().unwrap();
        assert_eq!(params.items.last().unwrap().0, Value::from("bn.num_batches_tracked"));
    }
    // 3 parts (chunks of 107) to 6 (chunks of 54): only the new chunks that straddle 107 and 214 are copied
    let dst = tempfile::tempdir().unwrap();
    let s = reshard(src.path(), dst.path(), 6, &ReshardOptions::default().with_write(opts())).unwrap();
    assert!(s.copied_bytes.unwrap() < 3 * 1280, "{s:?}");
    assert_loads_to(&HfaiReader::open(dst.path()).unwrap(), &state);

    // a larger threshold joins the chunks again (the only copy)
    let dst = tempfile::tempdir().unwrap();
    let s = reshard(src.path(), dst.path(), 2, &ReshardOptions::default()).unwrap();
    assert_eq!(s.copied_bytes, Some(3 * 1280));
    assert_loads_to(&HfaiReader::open(dst.path()).unwrap(), &state);

    let bad = ReshardOptions::default().with_buffers(0, ["nope"]);
    assert!(matches!(reshard(src.path(), dst.path(), 2, &bad), Err(Error::UnknownBuffer { .. })));

    // in place: the new parts are staged beside the directory and swapped in whole
    let s = reshard(src.path(), src.path(), 2, &reshard_opts).unwrap();
    assert_eq!(s.to, 2);
    let back = HfaiReader::open(src.path()).unwrap();
    assert_eq!(back.world_size(), 2);
    assert_loads_to(&back, &state);
}

// ------------------------------------------------------------------------------------------------
// rejections: one test per rule

/// A valid 3-part checkpoint in a fresh directory.
fn saved(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    save(&sample(), dir.path(), &opts().with_world_size(n)).unwrap();
    dir
}

/// Rewrites part `rank` of `dir` after `edit` changed its top-level dict.
fn edit_part(dir: &Path, rank: usize, edit: impl FnOnce(&mut Dict)) {
    let mut p = part(dir, rank);
    edit(&mut p);
    ckpt_torch::save(&Value::Dict(p), dir.join(part_file_name(rank)), &ckpt_torch::WriteOptions::default()).unwrap();
}

/// A part's `(params, large_params)` pair of model 0.
fn model_share(part: &mut Dict) -> &mut Vec<Value> {
    let (_, model) = part.items.iter_mut().find(|(k, _)| k.as_str() == Some("model")).unwrap();
    let Value::List(models) = model else { panic!("model is a {}", model.type_name()) };
    let Value::Tuple(pair) = &mut models[0] else { panic!("not a pair") };
    pair
}

fn set(d: &mut Dict, key: &str, v: Value) {
    d.items.iter_mut().find(|(k, _)| k.as_str() == Some(key)).unwrap().1 = v;
}

fn open_err(dir: &Path) -> Error {
    HfaiReader::open(dir).unwrap_err()
}

#[test]
fn rejects_a_missing_part() {
    let dir = saved(3);
    fs::remove_file(dir.path().join("PART_001.pt")).unwrap();
    let e = open_err(dir.path());
    assert!(
        matches!(&e, Error::MissingPart { rank: 1, world_size: Some(3), path } if path.ends_with("PART_001.pt")),
        "{e}"
    );
    fs::remove_file(dir.path().join("PART_000.pt")).unwrap();
    assert!(matches!(open_err(dir.path()), Error::MissingPart { rank: 0, world_size: None, .. }));
}

#[test]
fn rejects_disagreeing_nshards() {
    let dir = saved(3);
    edit_part(dir.path(), 2, |p| set(p, "__nshards__", Value::Int(4)));
    let e = open_err(dir.path());
    assert!(
        matches!(&e, Error::NshardsMismatch { expected: 3, found: 4, path } if path.ends_with("PART_002.pt")),
        "{e}"
    );
}

#[test]
fn rejects_stale_and_foreign_parts() {
    let dir = saved(2);
    fs::copy(dir.path().join("PART_001.pt"), dir.path().join("PART_002.pt")).unwrap();
    let e = open_err(dir.path());
    assert!(matches!(&e, Error::ExtraParts { names, world_size: 2, .. } if names == &["PART_002.pt"]), "{e}");
    fs::remove_file(dir.path().join("PART_002.pt")).unwrap();
    fs::write(dir.path().join("PART_1.pt"), b"").unwrap();
    assert!(matches!(open_err(dir.path()), Error::ExtraParts { names, .. } if names == ["PART_1.pt"]));
}

#[test]
fn rejects_chunks_that_do_not_add_up() {
    let dir = saved(2);
    edit_part(dir.path(), 1, |p| {
        let Value::Dict(large) = &mut model_share(p)[1] else { panic!() };
        let Value::Tuple(entry) = &mut large.items[0].1 else { panic!() };
        let chunk = entry[1].as_tensor().unwrap().narrow(0, 0, 100).unwrap().to_contiguous().unwrap();
        entry[1] = Value::Tensor(chunk);
    });
    let e = open_err(dir.path());
    assert!(
        matches!(&e, Error::ChunkSizeMismatch { key, expected: 320, found: 260, shape, .. } if key == "model.embed.weight" && shape == &[40, 8]),
        "{e}"
    );
}

#[test]
fn rejects_wrong_versions() {
    let dir = saved(2);
    edit_part(dir.path(), 1, |p| set(p, "__version__", Value::from("3.0.0")));
    let e = open_err(dir.path());
    assert!(
        matches!(&e, Error::UnsupportedVersion { found, path } if found == "\"3.0.0\"" && path.ends_with("PART_001.pt")),
        "{e}"
    );

    let dir = saved(2);
    edit_part(dir.path(), 0, |p| p.items.retain(|(k, _)| k.as_str() != Some("__version__")));
    let e = open_err(dir.path());
    assert!(matches!(&e, Error::Version1 { .. }), "{e}");
    assert!(e.to_string().contains("1.0.0"), "{e}");
}

#[test]
fn rejects_layout_errors() {
    let dir = saved(2);
    edit_part(dir.path(), 1, |p| set(p, "model", Value::List(vec![Value::Int(1)])));
    let e = open_err(dir.path());
    assert!(matches!(&e, Error::Layout { at, .. } if at == "[\"model\"][0]"), "{e}");

    let dir = saved(2);
    edit_part(dir.path(), 1, |p| set(p, "optimizer", Value::List(vec![])));
    let e = open_err(dir.path());
    assert!(matches!(&e, Error::CountMismatch { what: "optimizer", expected: 1, found: 0, .. }), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ckpt.pt");
    fs::write(&file, b"x").unwrap();
    assert!(matches!(open_err(&file), Error::NotADirectory { .. }));
    fs::create_dir(dir.path().join("d")).unwrap();
    fs::write(dir.path().join("d").join("PART_000.pt"), b"not a torch file").unwrap();
    let e = open_err(&dir.path().join("d"));
    assert!(e.torch_kind().is_some(), "{e}");
}

#[test]
fn rejects_a_key_both_whole_and_chunked() {
    let dir = saved(2);
    edit_part(dir.path(), 1, |p| {
        let Value::Dict(params) = &mut model_share(p)[0] else { panic!() };
        params.insert("embed.weight", f32s(0, &[1]));
    });
    assert!(matches!(open_err(dir.path()), Error::DuplicateKey { key } if key == "model.embed.weight"));
}

#[test]
fn rejects_bad_save_input() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(matches!(save(&sample(), d, &opts().with_world_size(0)), Err(Error::ZeroShards)));
    let e = save(&sample().with_other("__nshards__", Value::Int(2)), d, &opts().with_world_size(2)).unwrap_err();
    assert!(matches!(e, Error::ReservedKey { .. }));
    let e = save(
        &SaveState::default().with_model(ModelState::new(state_dict()).with_buffers(["x"])),
        d,
        &opts().with_world_size(2),
    );
    assert!(matches!(e, Err(Error::UnknownBuffer { model: 0, name }) if name == "x"));
    let e = save(&SaveState::default().with_optimizer(Value::Int(1)), d, &opts().with_world_size(2));
    assert!(matches!(e, Err(Error::BadOptimizer { index: 0, .. })));
    let e = save(
        &SaveState::default().with_optimizer(Value::dict([("param_groups", Value::List(vec![]))])),
        d,
        &opts().with_world_size(2),
    );
    assert!(matches!(e, Err(Error::BadOptimizer { index: 0, problem }) if problem.contains("state")));
    assert_eq!(fs::read_dir(d).unwrap().count(), 0, "nothing written");
}

#[test]
fn dtypes_survive() {
    let mut sd = Dict::new(DictKind::OrderedDict);
    for (i, dt) in [DType::BF16, DType::F16, DType::F64, DType::I8, DType::Bool, DType::U8].into_iter().enumerate() {
        sd.insert(format!("t{i}"), Tensor::zeros(dt, &[300 + i]).unwrap());
    }
    let state = SaveState::default().with_model(ModelState::new(sd.clone()));
    let dir = tempfile::tempdir().unwrap();
    save(&state, dir.path(), &WriteOptions::default().with_large_size(400).with_world_size(3)).unwrap();
    let ckpt = HfaiReader::open(dir.path()).unwrap();
    assert_eq!(ckpt.chunked().len(), 3, "{:?}", ckpt.chunked()); // bf16, f16, f64 are over 400 bytes
    assert_loads_to(&ckpt, &state);
}

#[test]
fn a_training_checkpoint_lays_out_as_hfai_save_takes_it() {
    let opt = adam_state();
    let sd = Value::Dict(state_dict());
    // {"model", "optimizer", "epoch"}: hfai's own layout; its header keys are written again, not kept.
    let top = Value::dict([
        ("__nshards__", Value::Int(7)),
        ("model", sd.clone()),
        ("optimizer", opt.clone()),
        ("epoch", Value::Int(3)),
    ]);
    let (state, dropped) = SaveState::from_state_dict(top.as_dict().unwrap());
    assert!(dropped.is_empty());
    assert_eq!((state.models.len(), &state.optimizers, state.others.len()), (1, &vec![opt.clone()], 1));
    let dir = tempfile::tempdir().unwrap();
    save(&state, dir.path(), &opts().with_world_size(2)).unwrap();
    let back = HfaiReader::open(dir.path()).unwrap();
    assert_eq!(back.other("epoch"), Some(&Value::Int(3)));
    // An `optimizer` that is not an optimizer state dict is left out, named.
    let top = Value::dict([("model", sd.clone()), ("optimizer", Value::dict([("lr", Value::Float(0.1))]))]);
    let (state, dropped) = SaveState::from_state_dict(top.as_dict().unwrap());
    assert_eq!((dropped, state.optimizers.len()), (vec!["optimizer".to_owned()], 0));
    // Any other mapping is the model state dict.
    let (state, _) = SaveState::from_state_dict(sd.as_dict().unwrap());
    assert_eq!(state.models[0].state_dict.kind, ckpt_tensor::DictKind::OrderedDict);
    assert_eq!(state.models[0].state_dict.items.len(), sd.as_dict().unwrap().items.len());
}

#[test]
fn verify_names_every_part_with_a_flipped_record() {
    let dir = tempfile::tempdir().unwrap();
    save(&sample(), dir.path(), &opts().with_world_size(3)).unwrap();
    let report = ckpt_hfai::verify(dir.path()).unwrap();
    assert!(report.is_ok());
    assert_eq!(report.files, 3);
    let part = dir.path().join(part_file_name(1));
    let mut bytes = std::fs::read(&part).unwrap();
    // The last byte of the first storage record: inside tensor data, wherever the record put it.
    let first = ckpt_torch::zip::Archive::parse(&bytes)
        .unwrap()
        .records()
        .iter()
        .find(|r| r.short_name().starts_with("data/"))
        .unwrap()
        .data_range();
    bytes[first.end as usize - 1] ^= 1;
    std::fs::write(&part, &bytes).unwrap();
    let report = ckpt_hfai::verify(dir.path()).unwrap();
    let failed: Vec<&std::path::Path> = report.errors().filter_map(|p| p.file.as_deref()).collect();
    assert_eq!(failed, [part.as_path()]);
    assert!(report.problems.iter().all(|p| p.kind == ckpt_hfai::ProblemKind::ChecksumMismatch));
}

// ------------------------------------------------------------------------------------------------
// per-process loads

/// Every process's share of a 4-part checkpoint equals its entries in the whole load, the shares together
/// hold everything once; a process reads only its own parts: with another process's part corrupted, it
/// still reads its share, the owner fails, and a collective read fails on every process.
#[test]
fn rank_shares_read_only_their_parts() {
    let dir = tempfile::tempdir().unwrap();
    save(&sample(), dir.path(), &opts().with_world_size(4)).unwrap();
    let whole = HfaiReader::open(dir.path()).unwrap();
    let read = |p: usize, k: usize| RankShare::read(dir.path(), &Default::default(), p, k);
    for k in [1, 2, 3] {
        let shares: Vec<RankShare> = if k == 1 {
            vec![RankShare::read_collective(dir.path(), &Default::default(), &SingleProcess).unwrap()]
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = ThreadGroup::new(k)
                    .into_iter()
                    .map(|g| {
                        let d = dir.path();
                        s.spawn(move || RankShare::read_collective(d, &Default::default(), &g).unwrap())
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        let mut model_keys = Vec::new();
        let mut covered: HashMap<String, usize> = HashMap::new();
        for (p, share) in shares.iter().enumerate() {
            assert_eq!(share.parts(), ckpt_collective::hosted_ranks(p, k, 4), "process {p} of {k}");
            assert_eq!(share.world_size(), 4);
            for (key, v) in &share.model().unwrap().items {
                let key = ckpt_tensor::flatten::python_str(key).unwrap();
                assert_tensor_eq(v, whole.model().unwrap().get(key.as_str()).unwrap(), &key);
                model_keys.push(key);
            }
            assert_eq!(share.other("epoch").is_some(), share.parts().contains(&0));
            for c in share.chunks() {
                let t = whole.tensor(&c.name).unwrap();
                let flat = t.reshape(&[t.numel()]).unwrap().narrow(0, c.range.start, c.range.len()).unwrap();
                assert!(flat.bitwise_eq(&c.tensor), "{} part {}", c.name, c.part);
                *covered.entry(c.name.clone()).or_default() += c.range.len();
            }
        }
        model_keys.sort();
        let mut expected: Vec<String> =
            whole.model().unwrap().items.iter().map(|(k, _)| ckpt_tensor::flatten::python_str(k).unwrap()).collect();
        expected.retain(|k| !whole.chunked().contains(&format!("model.{k}")));
        expected.sort();
        assert_eq!(model_keys, expected, "{k} processes hold every whole model entry once");
        assert_eq!(covered.len(), whole.chunked().len());
        for name in whole.chunked() {
            assert_eq!(covered[name], whole.tensor(name).unwrap().numel(), "{name}");
        }
    }
    // Part 1 (process 1's of 2, process 1's of 3) made unreadable: process 0 does not open it.
    let before = read(0, 2).unwrap();
    fs::write(dir.path().join(part_file_name(1)), b"not a torch.save file").unwrap();
    assert!(HfaiReader::open(dir.path()).is_err(), "the part is unreadable");
    let after = read(0, 2).unwrap();
    assert_eq!(after.value(), before.value());
    assert_eq!(after.chunks().len(), before.chunks().len());
    assert!(read(2, 3).is_ok());
    assert!(read(1, 2).is_err());
    let r: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ThreadGroup::new(2)
            .into_iter()
            .map(|g| {
                let d = dir.path();
                s.spawn(move || RankShare::read_collective(d, &Default::default(), &g))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(matches!(&r[0], Err(Error::RankFailed { rank: 1, .. })), "{:?}", r[0]);
    assert!(r[1].is_err());
    // A missing last part is not a smaller checkpoint.
    fs::remove_file(dir.path().join(part_file_name(3))).unwrap();
    assert!(matches!(read(0, 2), Err(Error::NshardsMismatch { expected: 3, found: 4, .. })), "{:?}", read(0, 2));
}
