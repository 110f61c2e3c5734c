//! Conversions into PyTorch-BigGraph and RecIS with the target-layout options: a PBG checkpoint
//! re-partitioned by a new config, a tensors-only safetensors file made a PBG checkpoint (optimizer state
//! rebuilt), hash tables from a plain state dict split over shards with RecIS's rules, and the refusals.
//! Every output is also loaded by the Python side (torchbiggraph; RecIS's loader rules).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use ckpt::tensor::{DType, Tensor, Value};
use ckpt::{ConvertOptions, Error, Format, convert};
use ckpt_conformance::{fixtures, run_python};

fn pbg_fixture() -> PathBuf {
    fixtures("pbg").join("ckpt")
}

/// The fixture's config with other partition counts.
fn config_with(dir: &Path, user_parts: u64, item_parts: u64) -> PathBuf {
    let text = std::fs::read_to_string(pbg_fixture().join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["entities"]["user_id"]["num_partitions"] = user_parts.into();
    json["entities"]["item"]["num_partitions"] = item_parts.into();
    let path = dir.join(format!("config_{user_parts}_{item_parts}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    path
}

fn concat_rows(ck: &ckpt::pbg::PbgReader, entity: &str) -> (Vec<f32>, Vec<f32>) {
    let mut embs = Vec::new();
    let mut sums = Vec::new();
    for p in ck.partitions().iter().filter(|p| p.entity == entity) {
        embs.extend(p.data.embeddings.to_vec::<f32>().unwrap());
        sums.extend(p.optimizer.as_ref().unwrap().sum(0).unwrap().to_vec::<f32>().unwrap());
    }
    (embs, sums)
}

/// Loads every `(format, path)` with the Python originals and returns their tensor descriptions.
fn python_loads(dir: &Path, checks: &[(Format, &Path)]) -> Vec<serde_json::Value> {
    let spec = serde_json::json!({
        "checks": checks.iter().map(|(f, p)| serde_json::json!({"format": f.name(), "path": p})).collect::<Vec<_>>()
    });
    let (spec_path, result_path) = (dir.join("spec.json"), dir.join("result.json"));
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    run_python("matrix/check_outputs.py", &[&spec_path, &result_path]);
    let results: serde_json::Value = serde_json::from_slice(&std::fs::read(&result_path).unwrap()).unwrap();
    let results = results["results"].as_array().unwrap().clone();
    for (r, (f, p)) in results.iter().zip(checks) {
        assert!(r.get("error").is_none(), "{f} {}: {}", p.display(), r["error"]);
    }
    results
}

#[test]
fn pbg_repartitioned_by_a_new_config() {
    let tmp = tempfile::tempdir().unwrap();
    let src = ckpt::pbg::PbgReader::open(pbg_fixture()).unwrap();
    let mut outputs = Vec::new();
    for (users, items) in [(3, 2), (1, 1), (2, 1)] {
        let config = config_with(tmp.path(), users, items);
        let dst = tmp.path().join(format!("pbg_{users}_{items}"));
        let options = ConvertOptions::default().with_target(ckpt::TargetOptions::Pbg { config: Some(config.clone()) });
        let s = convert(pbg_fixture(), None, &dst, Format::Pbg, &options).unwrap();
        assert!(s.dropped.is_empty(), "{:?}", s.dropped);
        let out = ckpt::pbg::PbgReader::open(&dst).unwrap();
        assert_eq!(out.version(), src.version(), "the version is kept, so PBG resumes at the same iteration");
        let count = |e: &str| out.partitions().iter().filter(|p| p.entity == e).count() as u64;
        assert_eq!((count("user_id"), count("item")), (users, items));
        for entity in ["user_id", "item"] {
            assert_eq!(concat_rows(&out, entity), concat_rows(&src, entity), "{entity}: rows and sums, in order");
        }
        // user_id: 29 rows in `users` consecutive ranges, the first ones one longer.
        let sizes: Vec<usize> =
            out.partitions().iter().filter(|p| p.entity == "user_id").map(|p| p.data.len()).collect();
        let want: Vec<usize> =
            (0..users as usize).map(|p| 29 / users as usize + usize::from(p < 29 % users as usize)).collect();
        assert_eq!(sizes, want);
        let (m_out, m_src) = (out.model().unwrap(), src.model().unwrap());
        for p in m_src.parameters.as_ref().unwrap() {
            assert_eq!(m_out.get(&p.public_name).unwrap().tensor, p.tensor);
        }
        assert_eq!(out.model_optimizer().unwrap().value(), src.model_optimizer().unwrap().value());
        assert_eq!(u64::from(out.config().unwrap().entities()[0].num_partitions), users);
        outputs.push(dst);
    }
    let checks: Vec<(Format, &Path)> = outputs.iter().map(|p| (Format::Pbg, p.as_path())).collect();
    let results = python_loads(tmp.path(), &checks);
    // torchbiggraph sees the re-partitioned rows: 3 + 2 partitions, then 1 + 1.
    let parts = |r: &serde_json::Value| {
        r["tensors"].as_object().unwrap().keys().filter(|k| k.starts_with("embeddings/")).count()
    };
    assert_eq!(results.iter().map(parts).collect::<Vec<_>>(), [5, 2, 3]);
}

#[test]
fn pbg_from_tensors_only_rebuilds_the_optimizer_state() {
    let tmp = tempfile::tempdir().unwrap();
    // A safetensors file with PBG's tensors and nothing else (what another tool would write).
    let src = ckpt::pbg::PbgReader::open(pbg_fixture()).unwrap();
    let st = tmp.path().join("tensors.safetensors");
    ckpt::safetensors::write_file(&src.tensors(), None, &st).unwrap();
    let dst = tmp.path().join("pbg");
    // Without a config there is no layout.
    match convert(&st, None, &dst, Format::Pbg, &ConvertOptions::default()) {
        Err(Error::UnsupportedConversion { reason, .. }) => assert!(reason.contains("--pbg-config"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(!dst.exists());
    let options = ConvertOptions::default()
        .with_target(ckpt::TargetOptions::Pbg { config: Some(pbg_fixture().join("config.json")) });
    convert(&st, None, &dst, Format::Pbg, &options).unwrap();
    let out = ckpt::pbg::PbgReader::open(&dst).unwrap();
    assert_eq!(out.version(), 1, "no version in the source");
    let lr = out.config().unwrap().lr();
    for (p, q) in out.partitions().iter().zip(src.partitions()) {
        assert_eq!((&p.entity, p.partition, &p.data.embeddings), (&q.entity, q.partition, &q.data.embeddings));
        let sd = p.optimizer.as_ref().unwrap();
        assert_eq!(sd.sum(0), q.optimizer.as_ref().unwrap().sum(0));
        assert_eq!(sd.lr(0), Some(lr));
    }
    let (m, want) = (out.model_optimizer().unwrap(), src.model_optimizer().unwrap());
    // The model's Adagrad state: the same tensors, and torch 2.13's param group for the config's lr.
    for i in 0..6 {
        assert_eq!(m.sum(i), want.sum(i));
    }
    assert_eq!(m.lr(0), Some(lr));
    // Converting into a directory that holds a PBG checkpoint replaces it whole (issue 41: a checkpoint of the
    // target format is replaced, crash-safe), and anything else there is refused.
    convert(&st, None, &dst, Format::Pbg, &options).unwrap();
    assert_eq!(ckpt::pbg::PbgReader::open(&dst).unwrap().version(), 1);
    let taken = tmp.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("notes.txt"), "mine").unwrap();
    let e = convert(&st, None, &taken, Format::Pbg, &options).unwrap_err();
    assert!(matches!(e, ckpt::Error::DestinationTaken { .. }), "{e}");
    python_loads(tmp.path(), &[(Format::Pbg, &dst)]);
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

#[test]
fn pbg_converted_through_safetensors_resumes_training() {
    // The fixture's version 4 through a safetensors file and back: torchbiggraph resumes training from it at
    // iteration 4 (the version is kept) and commits versions 5 and 6.
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    copy_dir(&fixtures("pbg").join("data"), &work.join("data"));
    let st = tmp.path().join("v4.safetensors");
    convert(pbg_fixture(), None, &st, Format::Safetensors, &ConvertOptions::default()).unwrap();
    convert(&st, None, work.join("ckpt"), Format::Pbg, &ConvertOptions::default()).unwrap();
    let out = run_python("pbg/check_resume.py", &[&work, Path::new("4")]);
    assert!(out.contains("resumed from converted version 4"), "{out}");
}

#[test]
fn pbg_layout_mismatches_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(pbg_fixture().join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["dimension"] = 8.into();
    let config = tmp.path().join("dim8.json");
    std::fs::write(&config, json.to_string()).unwrap();
    let e = convert(
        pbg_fixture(),
        None,
        tmp.path().join("a"),
        Format::Pbg,
        &ConvertOptions::default().with_target(ckpt::TargetOptions::Pbg { config: Some(config.clone()) }),
    )
    .unwrap_err();
    assert!(e.to_string().contains("the config wants float32 [N, 8]"), "{e}");
    json["dimension"] = 6.into();
    json["entities"].as_object_mut().unwrap().remove("item");
    json["relations"] =
        serde_json::json!([{"name": "follows", "lhs": "user_id", "rhs": "user_id", "operator": "linear"}]);
    std::fs::write(&config, json.to_string()).unwrap();
    let e = convert(
        pbg_fixture(),
        None,
        tmp.path().join("b"),
        Format::Pbg,
        &ConvertOptions::default().with_target(ckpt::TargetOptions::Pbg { config: Some(config.clone()) }),
    )
    .unwrap_err();
    assert!(e.to_string().contains("entity type \"item\", which the config lacks"), "{e}");
}

fn tensor_i64(v: &[i64]) -> Tensor {
    Tensor::from_slice(v, &[v.len()]).unwrap()
}

#[test]
fn recis_tables_from_a_state_dict_with_layout_options() {
    let tmp = tempfile::tempdir().unwrap();
    // Ids spread over the key space, negative ones included; two slots, one dense optimizer scalar.
    let ids: Vec<i64> = vec![3, 70_000, -5, 999, 1000, 123_456_789, 42, -1];
    let n = ids.len();
    let emb: Vec<f32> = (0..n * 2).map(|i| i as f32).collect();
    let emb = Tensor::from_slice(&emb, &[n, 2]).unwrap();
    let adam = Tensor::from_slice(&vec![0.5f32; n * 2], &[n, 2]).unwrap();
    let step = tensor_i64(&[7]);
    let w = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let st = tmp.path().join("tables.safetensors");
    let tensors = [
        ("tbl@id".to_string(), tensor_i64(&ids)),
        ("tbl@sparse_adamw_exp_avg".to_string(), adam.clone()),
        ("tbl@embedding".to_string(), emb.clone()),
        ("sparse_adamw_step".to_string(), step.clone()),
        ("dense.w".to_string(), w.clone()),
    ];
    ckpt::safetensors::write_file(&tensors, None, &st).unwrap();
    let dst = tmp.path().join("recis");
    let options = ConvertOptions::default()
        .with_world_size(3)
        .with_target(ckpt::TargetOptions::Recis { parallel: Some(2), slice_size: Some(1000) });
    let s = convert(&st, None, &dst, Format::Recis, &options).unwrap();
    assert_eq!((s.tensors, s.dropped.len()), (5, 0));
    let ck = ckpt::recis::RecisReader::open(&dst).unwrap();
    let sparse = ck.sparse();
    assert_eq!((sparse.shard_num(), sparse.parallel(), sparse.slice_size("tbl").unwrap()), (Some(3), Some(2), 1000));
    // Every id is in the shard RecIS's loader reads it from: (id as u64) % 1000 in gen_slice(r, 3, 1000).
    for r in 0..3 {
        let shard = ckpt::recis::Shard::new(r, 3).unwrap();
        let slice = ckpt::recis::name::gen_slice(r, 3, 1000).unwrap();
        let tables = ckpt::recis::load_shard(sparse, shard, ckpt::recis::name::IdPartition::Unsigned).unwrap();
        for &id in tables[0].children()[0].ids() {
            assert!(slice.holds(id, ckpt::recis::name::IdPartition::Unsigned), "id {id} in shard {r}");
        }
    }
    // Rows follow their ids; slots keep RecIS's order (embedding first); dense tensors are dense blocks.
    let table = sparse.child("tbl").unwrap();
    assert_eq!(table.slots().iter().map(|s| s.name()).collect::<Vec<_>>(), ["embedding", "sparse_adamw_exp_avg"]);
    for (k, id) in ids.iter().enumerate() {
        let pos = table.position(*id).unwrap().unwrap();
        let row = table.slot("embedding").unwrap().row(pos).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(row, [2.0 * k as f32, 2.0 * k as f32 + 1.0]);
    }
    // The sparse optimizer's scalar state is a dense block of the serializer; other tensors are the model's.
    assert_eq!(sparse.dense("sparse_adamw_step").unwrap(), step);
    assert_eq!(sparse.dense_names(), ["sparse_adamw_step"]);
    assert_eq!(ck.model().unwrap().as_dict().unwrap().get("dense.w").unwrap().as_tensor(), Some(&w));
    python_loads(tmp.path(), &[(Format::Recis, &dst)]);
}

#[test]
fn recis_model_and_extra_from_a_training_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let sd = Value::dict([
        ("model", Value::dict([("layer.weight", Value::Tensor(w.clone()))])),
        ("optimizer", Value::dict([("lr", Value::Float(0.1))])),
        ("epoch", Value::Int(3)),
    ]);
    let pt = tmp.path().join("train.pt");
    ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let dst = tmp.path().join("recis");
    convert(&pt, None, &dst, Format::Recis, &ConvertOptions::default()).unwrap();
    let ck = ckpt::recis::RecisReader::open(&dst).unwrap();
    assert_eq!(ck.model().unwrap().as_dict().unwrap().get("layer.weight").unwrap().as_tensor(), Some(&w));
    let extra = ck.extra().unwrap().as_dict().unwrap();
    assert_eq!((extra.get("epoch"), extra.items.len()), (Some(&Value::Int(3)), 2));
    // And back: the RecIS layout nests as {"model", "extra"}, which converts to RecIS again unchanged.
    let back = tmp.path().join("back.pt");
    convert(&dst, None, &back, Format::Torch, &ConvertOptions::default()).unwrap();
    let v = ckpt::torch::load(&back).unwrap();
    let keys: Vec<&str> = v.as_dict().unwrap().items.iter().filter_map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["model", "extra"]);
    let again = tmp.path().join("again");
    convert(&back, None, &again, Format::Recis, &ConvertOptions::default()).unwrap();
    let ck2 = ckpt::recis::RecisReader::open(&again).unwrap();
    assert_eq!((ck2.model(), ck2.extra()), (ck.model(), ck.extra()));
    python_loads(tmp.path(), &[(Format::Recis, &dst), (Format::Recis, &again)]);
}

#[test]
fn recis_table_errors_name_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let emb = Tensor::zeros(DType::F32, &[3, 2]).unwrap();
    type Case<'a> = (&'a str, Vec<(String, Tensor)>, &'a str);
    let cases: [Case; 3] = [
        ("orphan", vec![("tbl@embedding".into(), emb.clone())], "no ids `tbl@id`"),
        (
            "rows",
            vec![("tbl@id".into(), tensor_i64(&[1, 2])), ("tbl@embedding".into(), emb.clone())],
            "hash table \"tbl\"",
        ),
        ("ids", vec![("tbl@id".into(), emb.clone())], "1-D int64"),
    ];
    for (label, tensors, want) in cases {
        let st = tmp.path().join(format!("{label}.safetensors"));
        ckpt::safetensors::write_file(&tensors, None, &st).unwrap();
        let dst = tmp.path().join(label);
        match convert(&st, None, &dst, Format::Recis, &ConvertOptions::default()) {
            Err(Error::UnsupportedConversion { reason, .. }) => assert!(reason.contains(want), "{label}: {reason}"),
            other => panic!("{label}: {other:?}"),
        }
        assert!(!dst.exists(), "{label}: nothing written");
    }
}

#[test]
fn target_options_belong_to_the_target_format() {
    let dir = tempfile::tempdir().unwrap();
    let sd = ckpt::tensor::Value::dict([(
        "w",
        ckpt::tensor::Value::Tensor(ckpt::tensor::Tensor::from_slice(&[1.0f32; 8], &[8]).unwrap()),
    )]);
    // hfai's options for a distcp target are refused before anything is written.
    let hfai = ConvertOptions::default().with_target(ckpt::TargetOptions::Hfai { large_size: Some(16) });
    let err = ckpt::save(&sd, dir.path().join("dcp"), Format::Distcp, &hfai).unwrap_err();
    assert!(matches!(err, ckpt::Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("hfai target"), "{err}");
    assert!(!dir.path().join("dcp").exists());
    // The target's own variant, and the defaults, are taken.
    let st = ConvertOptions::default().with_target(ckpt::TargetOptions::Distcp { profile: ckpt::DcpProfile::Torch213 });
    ckpt::save(&sd, dir.path().join("dcp"), Format::Distcp, &st).unwrap();
    ckpt::save(&sd, dir.path().join("m.pt"), Format::Torch, &ConvertOptions::default()).unwrap();
    assert_eq!(ckpt::TargetOptions::Recis { parallel: None, slice_size: None }.format(), Some(Format::Recis));
    assert_eq!(ckpt::TargetOptions::Pbg { config: None }.format(), Some(Format::Pbg));
}
