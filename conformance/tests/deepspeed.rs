//! DeepSpeed checkpoints written by deepspeed 0.19.8 (`conformance/fixtures/deepspeed`, made by
//! `conformance/python/deepspeed/make_fixtures.py`): ckpt-deepspeed's consolidation equals DeepSpeed's own
//! (`get_fp32_state_dict_from_zero_checkpoint`, saved as `reference.pt`) bit for bit, in its order, for ZeRO
//! 1, 2 and 3 at 1 and 2 ranks, fp32 and bf16 mixed precision, and for universal checkpoints; the optimizer
//! state per parameter equals what `ds_to_universal` makes of it; the client state, the tags and the errors.
//! `BF16_Optimizer` checkpoints (`conformance/fixtures/deepspeed_bf16`, by `make_bf16_fixtures.py`): the
//! fp32 weights and optimizer state per parameter equal what DeepSpeed gathers of them
//! (`safe_get_full_fp32_param`, `safe_get_full_optimizer_state`) bit for bit.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use ckpt_conformance::fixtures;
use ckpt_deepspeed::{DeepSpeedReader, Error, Kind, ReadOptions};
use ckpt_tensor::{CheckpointRead, DType, Tensor, Value};

fn cases() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures("deepspeed"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").is_file())
        .collect();
    v.sort();
    assert_eq!(v.len(), 9, "{v:?}");
    v
}

fn expected(case: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(case.join("expected.json")).unwrap()).unwrap()
}

/// `reference.pt`: DeepSpeed's consolidation, in its order.
fn reference(case: &Path) -> Vec<(String, Tensor)> {
    let v = ckpt_torch::load(&case.join("reference.pt")).unwrap();
    let Value::Dict(d) = v else { panic!("reference.pt is a dict") };
    d.items.into_iter().map(|(k, v)| (k.as_str().unwrap().to_owned(), v.as_tensor().unwrap().clone())).collect()
}

#[test]
fn consolidation_equals_deepspeeds_bit_for_bit() {
    for case in cases() {
        let e = expected(&case);
        let ck = DeepSpeedReader::open(&case).unwrap();
        assert_eq!(ck.kind() == Kind::Universal, e["universal"].as_bool().unwrap(), "{}", case.display());
        assert_eq!(ck.tag(), e["tag"].as_str().unwrap());
        if !e["universal"].as_bool().unwrap() {
            assert_eq!(ck.stage() as u64, e["stage"].as_u64().unwrap());
            assert_eq!(ck.world_size() as u64, e["world_size"].as_u64().unwrap());
        }
        let reference = reference(&case);
        let mut got: Vec<(String, Tensor)> = ck.model().to_vec();
        let mut want = reference.clone();
        if ck.kind() == Kind::Universal {
            // The reference lists the parameter directories by name; ckpt in the module's order.
            got.sort_by(|a, b| a.0.cmp(&b.0));
            want.sort_by(|a, b| a.0.cmp(&b.0));
            got.retain(|(n, _)| want.iter().any(|(w, _)| w == n));
        }
        let names = |v: &[(String, Tensor)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&got), names(&want), "{}: names and order", case.display());
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            // ZeRO 3's universal files hold flat parameters; ckpt gives them their shapes.
            let g = if g.shape() != w.shape() && ck.kind() == Kind::Universal {
                g.reshape(w.shape()).unwrap()
            } else {
                g.clone()
            };
            let g = g.to_contiguous().unwrap();
            assert!(g.bitwise_eq(w), "{}: {name}: {g:?} vs {w:?}", case.display());
            // The same through the generic interface.
            assert!(ck.tensor(name).unwrap().reshape(w.shape()).unwrap().bitwise_eq(w));
        }
    }
}

#[test]
fn parameters_split_over_ranks_are_made_when_read() {
    let ck = DeepSpeedReader::open(fixtures("deepspeed").join("zero3_w2")).unwrap();
    let (_, l1) = ck.model().iter().find(|(n, _)| n == "l1.weight").unwrap();
    assert!(l1.storage().is_deferred(), "a ZeRO 3 parameter of 2 ranks is assembled on demand");
    let mut streamed = Vec::new();
    l1.data_pieces(16, |p| {
        assert!(p.len() <= 16);
        streamed.extend_from_slice(p);
        Ok::<(), ckpt_tensor::Error>(())
    })
    .unwrap();
    assert_eq!(streamed, l1.data().unwrap().into_owned());
    let one = DeepSpeedReader::open(fixtures("deepspeed").join("zero2_w1")).unwrap();
    let (_, w) = one.model().iter().find(|(n, _)| n == "l1.weight").unwrap();
    assert!(w.storage().is_mapped(), "one rank's parameter is a window of its file");
}

#[test]
fn optimizer_state_per_parameter_equals_ds_to_universal() {
    for (zero, universal) in [("zero2_w2", "universal_zero2_w2"), ("zero3_w2", "universal_zero3_w2")] {
        let z = DeepSpeedReader::open(fixtures("deepspeed").join(zero)).unwrap();
        let u = DeepSpeedReader::open(fixtures("deepspeed").join(universal)).unwrap();
        let mut compared = 0;
        for e in u.entries() {
            if !e.name.starts_with("optimizer.state.") {
                continue;
            }
            let (a, b) = (z.value(&e.name).unwrap(), u.value(&e.name).unwrap());
            let (a, b) = (a.as_tensor().unwrap().to_contiguous().unwrap(), b.as_tensor().unwrap());
            assert!(a.bitwise_eq(b), "{zero}: {}", e.name);
            compared += 1;
        }
        assert!(compared >= 8, "{zero}: {compared}");
        // ZeRO 3's universal files are flat: the parameters take the model states' shapes.
        assert_eq!(u.tensor("emb.weight").unwrap().shape(), [11, 6]);
        // Both universal and ZeRO state name the trained parameters; frozen ones have none.
        assert!(z.value("optimizer.state.frozen.weight.exp_avg").is_err());
        assert_eq!(z.value("optimizer.param_groups.1.weight_decay").unwrap(), Value::Float(0.1));
    }
}

/// `elastic_checkpoint`: each group's optimizer state saved as a list, without its padding. Each parameter's
/// `exp_avg` is the run of the ranks' states that sits where its master weights sit in the ranks' flat groups
/// (found here by the weights' bytes, which the consolidation test checks against DeepSpeed's).
#[test]
fn elastic_checkpoints_cut_the_state_where_the_weights_are() {
    let case = fixtures("deepspeed").join("zero2_elastic_w2");
    let ck = DeepSpeedReader::open(&case).unwrap();
    let files: Vec<Value> = (0..2)
        .map(|r| {
            ckpt_torch::load(&case.join(format!("global_step2/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")))
                .unwrap()
        })
        .collect();
    let group = |g: usize, key: &str| -> Vec<u8> {
        let mut out = Vec::new();
        for f in &files {
            let osd = f.as_dict().unwrap().get("optimizer_state_dict").unwrap().as_dict().unwrap();
            let t = if key == "fp32" {
                osd.get("single_partition_of_fp32_groups").unwrap().as_sequence().unwrap()[g]
                    .as_tensor()
                    .unwrap()
                    .clone()
            } else {
                let base = osd.get("base_optimizer_state").unwrap().as_sequence().expect("elastic: a list");
                base[g].as_dict().unwrap().get(key).unwrap().as_tensor().unwrap().clone()
            };
            out.extend_from_slice(&t.data().unwrap());
        }
        out
    };
    let mut compared = 0;
    for (g, names) in [(0, &["emb.weight"][..]), (1, &["l1.weight", "l1.bias", "l2.weight", "l2.bias"][..])] {
        let (fp32, exp_avg) = (group(g, "fp32"), group(g, "exp_avg"));
        for name in names {
            let w = ck.tensor(name).unwrap().to_contiguous().unwrap();
            let w = w.data().unwrap();
            let at = fp32.windows(w.len()).position(|x| x == &w[..]).unwrap_or_else(|| panic!("{name} in group {g}"));
            let got = ck.tensor(&format!("optimizer.state.{name}.exp_avg")).unwrap().to_contiguous().unwrap();
            assert_eq!(&got.data().unwrap()[..], &exp_avg[at..at + w.len()], "{name}");
            compared += 1;
        }
    }
    assert_eq!(compared, 5);
}

#[test]
fn module_weights_client_and_engine_state() {
    let ck = DeepSpeedReader::open(fixtures("deepspeed").join("zero2_w2")).unwrap();
    let m = ck.tensor("module.l1.weight").unwrap();
    assert_eq!(m.dtype(), DType::BF16, "bf16 mixed precision keeps bf16 module weights");
    let fp32 = ck.tensor("l1.weight").unwrap();
    assert!(ckpt_tensor::cast_float(&fp32, DType::BF16).unwrap().bitwise_eq(&m.to_contiguous().unwrap()));
    assert!(ck.details().iter().any(|(k, v)| k == "precision" && v.contains("bfloat16")));
    let e = expected(&fixtures("deepspeed").join("zero2_w2"));
    let client: Vec<&str> = ck.client_state().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(client, ["epoch", "note", "sampler"]);
    assert_eq!(ck.value("epoch").unwrap(), Value::Int(e["client_state"]["epoch"].as_i64().unwrap()));
    assert_eq!(ck.value("sampler.order.1").unwrap(), Value::Int(0));
    assert_eq!(ck.value("global_steps").unwrap(), Value::Int(2));
    assert_eq!(ck.value("ds_version").unwrap(), Value::Str("0.19.8".into()));
    // DeepSpeed's pickled classes are inert objects.
    let Value::Object(o) = ck.value("optimizer.zero_stage").unwrap() else { panic!("ZeroStageEnum") };
    assert_eq!(o.callable_name(), Some(("deepspeed.runtime.zero.config", "ZeroStageEnum")));
    assert!(matches!(ck.value("optimizer.loss_scaler").unwrap(), Value::Object(_)));
    // Tied parameters under both names; integer buffers as they are, float buffers as float32.
    assert!(ck.tensor("out.weight").unwrap().bitwise_eq(&ck.tensor("emb.weight").unwrap().to_contiguous().unwrap()));
    assert_eq!(ck.tensor("seen").unwrap().dtype(), DType::I64);
}

#[test]
fn tags_and_tag_directories() {
    let root = fixtures("deepspeed").join("zero1_w2");
    let by_latest = DeepSpeedReader::open(&root).unwrap();
    let by_tag = DeepSpeedReader::open_with(&root, &ReadOptions::default().with_tag("global_step2")).unwrap();
    let by_dir = DeepSpeedReader::open(root.join("global_step2")).unwrap();
    for r in [&by_tag, &by_dir] {
        assert_eq!(r.tag(), "global_step2");
        assert_eq!(r.entries(), by_latest.entries());
    }
    let err = DeepSpeedReader::open_with(&root, &ReadOptions::default().with_tag("global_step9")).unwrap_err();
    assert!(matches!(err, Error::MissingTag { ref tag, .. } if tag == "global_step9"), "{err}");
    let err = DeepSpeedReader::open(fixtures("hfai")).unwrap_err();
    assert!(matches!(err, Error::NotACheckpoint { .. }), "{err}");
}

/// A copy of a fixture's tag directory, changed by `edit`.
fn broken(case: &str, edit: impl FnOnce(&Path)) -> (tempfile::TempDir, PathBuf) {
    broken_at(&fixtures("deepspeed").join(case), edit)
}

/// A copy of the tag directory of the fixture at `case`, changed by `edit`.
fn broken_at(case: &Path, edit: impl FnOnce(&Path)) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = case.join("global_step2");
    let dst = tmp.path().join("global_step2");
    std::fs::create_dir(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    edit(&dst);
    (tmp, dst)
}

#[test]
fn rejections_name_the_rule() {
    let (_t, dir) =
        broken("zero2_w2", |d| std::fs::remove_file(d.join("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")).unwrap());
    let err = DeepSpeedReader::open(&dir).unwrap_err();
    assert!(matches!(err, Error::RankCount { expected: 2, found: 1, .. }), "{err}");
    let (_t, dir) = broken("zero2_w2", |d| std::fs::remove_file(d.join("mp_rank_00_model_states.pt")).unwrap());
    assert!(matches!(DeepSpeedReader::open(&dir).unwrap_err(), Error::MissingFile { .. }));
    let (_t, dir) = broken("zero3_w2", |d| {
        std::fs::rename(
            d.join("zero_pp_rank_1_mp_rank_00_model_states.pt"),
            d.join("zero_pp_rank_1_mp_rank_01_model_states.pt"),
        )
        .unwrap();
    });
    assert!(matches!(DeepSpeedReader::open(&dir).unwrap_err(), Error::Unsupported { .. }));
    // One rank's optimizer file in place of the other's: the flat groups do not add up.
    let (_t, dir) = broken("zero3_w2", |d| {
        std::fs::copy(
            fixtures("deepspeed").join("zero3_w1/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt"),
            d.join("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"),
        )
        .unwrap();
    });
    let err = DeepSpeedReader::open(&dir).unwrap_err();
    assert!(matches!(err, Error::Layout { .. }), "{err}");
    // A truncated file is the torch codec's error, never a panic.
    let (_t, dir) = broken("zero1_w1", |d| {
        let f = d.join("mp_rank_00_model_states.pt");
        let bytes = std::fs::read(&f).unwrap();
        std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    });
    assert!(matches!(DeepSpeedReader::open(&dir).unwrap_err(), Error::Torch(_)));
}

fn bf16_case() -> PathBuf {
    fixtures("deepspeed_bf16").join("bf16_optimizer_w2")
}

/// A `torch.save` file's `{name: tensor}` dict, in order.
fn tensors(path: &Path) -> Vec<(String, Tensor)> {
    let Value::Dict(d) = ckpt_torch::load(path).unwrap() else { panic!("{} is a dict", path.display()) };
    d.items.into_iter().map(|(k, v)| (k.as_str().unwrap().to_owned(), v.as_tensor().unwrap().clone())).collect()
}

#[test]
fn bf16_optimizer_equals_what_deepspeed_gathers_bit_for_bit() {
    let case = bf16_case();
    let e = expected(&case);
    let ck = DeepSpeedReader::open(&case).unwrap();
    assert_eq!(ck.kind(), Kind::Bf16Optimizer);
    assert_eq!(ck.world_size() as u64, e["world_size"].as_u64().unwrap());
    assert_eq!(ck.stage(), 1, "the stage of the engine's configuration");
    let weights = tensors(&case.join("reference.pt"));
    assert_eq!(weights.len(), 5);
    // The consolidated state dict: buffers, trained parameters in param_shapes order, the tied alias.
    let names: Vec<&str> = ck.model().iter().map(|(n, _)| n.as_str()).collect();
    let mut want: Vec<&str> = vec!["scale", "seen"];
    want.extend(weights.iter().map(|(n, _)| n.as_str()));
    want.push("out.weight");
    assert_eq!(names, want);
    for (name, w) in &weights {
        let (_, g) = ck.model().iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(g.dtype(), DType::F32);
        assert!(g.to_contiguous().unwrap().bitwise_eq(w), "{name}: {g:?} vs {w:?}");
        assert!(ck.tensor(name).unwrap().to_contiguous().unwrap().bitwise_eq(w), "{name}");
        // The module keeps the bf16 weights BF16_Optimizer copies out of the fp32 ones.
        let m = ck.tensor(&format!("module.{name}")).unwrap();
        assert_eq!(m.dtype(), DType::BF16);
        assert!(ckpt_tensor::cast_float(w, DType::BF16).unwrap().bitwise_eq(&m.to_contiguous().unwrap()), "{name}");
    }
    // l1.bias spans the partition boundary (4 elements on rank 0, 3 on rank 1): made of both ranks' fragments.
    assert!(ck.tensor("l1.bias").unwrap().storage().is_deferred());
    assert!(ck.tensor("l2.weight").unwrap().storage().is_mapped(), "one rank's fragment is a window of its file");
    assert!(ck.tensor("out.weight").unwrap().to_contiguous().unwrap().bitwise_eq(&weights[0].1));
    let optim = tensors(&case.join("reference_optim.pt"));
    assert_eq!(optim.len(), 10);
    for (key, w) in &optim {
        let g = ck.tensor(&format!("optimizer.state.{key}")).unwrap().to_contiguous().unwrap();
        assert!(g.bitwise_eq(w), "{key}: {g:?} vs {w:?}");
    }
    assert_eq!(ck.value("optimizer.state.l1.bias.step").unwrap().as_tensor().unwrap().to_vec::<f32>().unwrap(), [2.0]);
    assert_eq!(ck.value("optimizer.param_groups.1.weight_decay").unwrap(), Value::Float(0.1));
    assert_eq!(ck.value("optimizer.clip_grad").unwrap(), Value::Float(1.0));
    assert!(ck.details().iter().any(|(k, v)| k == "kind" && v.contains("BF16_Optimizer")));
    assert!(ck.details().iter().any(|(k, v)| k == "precision" && v.contains("bfloat16")));
    let client: Vec<&str> = ck.client_state().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(client, ["epoch", "note", "sampler"]);
}

/// DeepSpeed's other consolidation of the same fragments, `ds_to_universal`: every trained parameter's fp32
/// weights and optimizer state read from the universal checkpoint equal the `BF16_Optimizer` checkpoint's.
/// (`--inject_missing_state` fills the tied `out.weight` and the frozen layer from the module's bf16 weights,
/// which `zero_to_fp32`'s layout, followed for ZeRO 1, takes from the fp32 parameter it is tied to, or
/// leaves out.)
#[test]
fn bf16_optimizer_equals_its_ds_to_universal_conversion() {
    let b = DeepSpeedReader::open(bf16_case()).unwrap();
    let u = DeepSpeedReader::open(fixtures("deepspeed_bf16").join("universal_bf16_optimizer_w2")).unwrap();
    assert_eq!(u.kind(), Kind::Universal);
    let trained: Vec<(String, Tensor)> = tensors(&bf16_case().join("reference.pt"));
    let mut compared = 0;
    for e in u.entries() {
        let is_trained = trained.iter().any(|(n, _)| *n == e.name);
        if !(is_trained || e.name.starts_with("optimizer.state.") && !e.name.ends_with(".step")) {
            continue;
        }
        let (x, y) = (b.tensor(&e.name).unwrap(), u.tensor(&e.name).unwrap());
        assert!(x.to_contiguous().unwrap().bitwise_eq(&y.to_contiguous().unwrap()), "{}", e.name);
        compared += 1;
    }
    assert_eq!(compared, 5 + 10, "5 trained parameters, 2 states of each");
    let alias = u.tensor("out.weight").unwrap();
    let module = b.tensor("module.out.weight").unwrap();
    assert!(ckpt_tensor::cast_float(&module, DType::F32).unwrap().bitwise_eq(&alias.to_contiguous().unwrap()));
}

/// The consolidated fp32 weights of each group, one after the other, are the ranks' partitions joined, the
/// group's padding (the end of the last rank's, `group_paddings`) left out: nothing lost, nothing moved.
#[test]
fn bf16_optimizer_weights_are_the_partitions_without_their_padding() {
    let case = bf16_case();
    let e = expected(&case);
    let ck = DeepSpeedReader::open(&case).unwrap();
    let files: Vec<Value> = (0..2)
        .map(|r| {
            ckpt_torch::load(&case.join(format!("global_step2/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")))
                .unwrap()
        })
        .collect();
    let paddings = &e["group_paddings"];
    for (g, names) in [(0, &["emb.weight"][..]), (1, &["l1.weight", "l1.bias", "l2.weight", "l2.bias"][..])] {
        let mut joined = Vec::new();
        for (r, f) in files.iter().enumerate() {
            let osd = f.as_dict().unwrap().get("optimizer_state_dict").unwrap().as_dict().unwrap();
            let t = osd.get("single_partition_of_fp32_groups").unwrap().as_sequence().unwrap()[g].as_tensor().unwrap();
            let keep = t.numel() - paddings[r][g].as_u64().unwrap() as usize;
            joined.extend_from_slice(&t.narrow(0, 0, keep).unwrap().to_contiguous().unwrap().data().unwrap());
        }
        let mut got = Vec::new();
        for name in names {
            got.extend_from_slice(&ck.tensor(name).unwrap().to_contiguous().unwrap().data().unwrap());
        }
        assert_eq!(got, joined, "group {g}");
    }
    assert_eq!(paddings[1], serde_json::json!([2, 3]), "the last rank pads both groups");
}

/// The item `key` of the dict `v`.
fn item<'a>(v: &'a mut Value, key: &str) -> &'a mut Value {
    let Value::Dict(d) = v else { panic!("not a dict") };
    &mut d.items.iter_mut().find(|(k, _)| k.as_str() == Some(key)).unwrap().1
}

/// Rank 1's optimizer states file of the BF16_Optimizer fixture, changed by `edit`.
fn bf16_rank1_changed(edit: impl FnOnce(&mut Value)) -> (tempfile::TempDir, PathBuf) {
    broken_at(&bf16_case(), |d| {
        let f = d.join("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt");
        let mut v = ckpt_torch::load(&f).unwrap();
        edit(item(&mut v, "optimizer_state_dict"));
        ckpt_torch::save(&v, &f, &ckpt_torch::WriteOptions::default()).unwrap();
    })
}

/// `fragment_address`'s field `field` of `name` in group `g` of an optimizer state dict's
/// `param_slice_mappings`.
fn fragment_field<'a>(osd: &'a mut Value, g: usize, name: &str, field: &str) -> &'a mut Value {
    let Value::List(groups) = item(osd, "param_slice_mappings") else { panic!("a list") };
    let Value::Object(o) = item(&mut groups[g], name) else { panic!("fragment_address") };
    item(o.state.as_mut().unwrap(), field)
}

#[test]
fn bf16_optimizer_rejections_name_the_rule() {
    // Unchanged but rewritten by ckpt: still read, equal.
    let (_t, dir) = bf16_rank1_changed(|_| {});
    let same = DeepSpeedReader::open(&dir).unwrap();
    let ck = DeepSpeedReader::open(bf16_case()).unwrap();
    assert!(same.tensor("l2.weight").unwrap().bitwise_eq(&ck.tensor("l2.weight").unwrap().to_contiguous().unwrap()));
    // A fragment moved: it no longer sits where the layout puts the parameter.
    let (_t, dir) = bf16_rank1_changed(|osd| *fragment_field(osd, 1, "l2.weight", "start") = Value::Int(4));
    let err = DeepSpeedReader::open(&dir).unwrap_err();
    assert!(matches!(err, Error::FlatGroups { group: 1, ref problem, .. } if problem.contains("l2.weight")), "{err}");
    // A fragment past the partition.
    let (_t, dir) = bf16_rank1_changed(|osd| *fragment_field(osd, 1, "l2.bias", "numel") = Value::Int(1 << 40));
    let err = DeepSpeedReader::open(&dir).unwrap_err();
    assert!(matches!(err, Error::FlatGroups { ref problem, .. } if problem.contains("not within")), "{err}");
    // A fragment too short: the parameter is not whole.
    let (_t, dir) = bf16_rank1_changed(|osd| *fragment_field(osd, 1, "l2.bias", "numel") = Value::Int(4));
    let err = DeepSpeedReader::open(&dir).unwrap_err();
    assert!(matches!(err, Error::FlatGroups { ref problem, .. } if problem.contains("4 of its 5")), "{err}");
    // A padding that does not match the parameters.
    let (_t, dir) = bf16_rank1_changed(|osd| {
        let Value::List(p) = item(osd, "group_paddings") else { panic!("a list") };
        p[1] = Value::Int(5);
    });
    let err = DeepSpeedReader::open(&dir).unwrap_err();
    assert!(matches!(err, Error::FlatGroups { group: 1, .. }), "{err}");
    // A fragment that is not a fragment_address.
    let (_t, dir) = bf16_rank1_changed(|osd| {
        let Value::List(groups) = item(osd, "param_slice_mappings") else { panic!("a list") };
        *item(&mut groups[0], "emb.weight") = Value::Int(3);
    });
    let err = DeepSpeedReader::open(&dir).unwrap_err();
    assert!(matches!(err, Error::Layout { expected, .. } if expected.contains("fragment_address")), "{err}");
    // A rank's file missing.
    let (_t, dir) = broken_at(&bf16_case(), |d| {
        std::fs::remove_file(d.join("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")).unwrap()
    });
    let err = DeepSpeedReader::open(&dir).unwrap_err();
    assert!(matches!(err, Error::RankCount { expected: 2, found: 1, .. }), "{err}");
}
