//! Megatron-Core `torch_dist` checkpoints written by megatron-core 0.16.1 (`conformance/fixtures/megatron`,
//! made by `conformance/python/megatron/make_fixtures.py`): ckpt-distcp's Megatron profile reads every
//! tensor as `dist_checkpointing.load` returns it (`reference.pt`), tensor-parallel shards joined, layers
//! unstacked; `common.pt`'s values are entries; `.metadata`'s `all_local_plans` is tolerated; the Llama
//! names split `linear_qkv` and `linear_fc1` by the head layout in `args`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ckpt_tensor::FormatError;
use std::path::Path;

use ckpt_conformance::fixtures;
use ckpt_distcp::ReadOptions;
use ckpt_distcp::megatron::{ArgValue, MegatronOptions, MegatronReader};
use ckpt_tensor::{CheckpointRead, EntryKind, Tensor, Value};

fn open(case: &str, options: MegatronOptions) -> MegatronReader {
    MegatronReader::open(fixtures("megatron").join(case).join("ckpt"), &ReadOptions::default(), options).unwrap()
}

fn reference(case: &str) -> Vec<(String, Tensor)> {
    let Value::Dict(d) = ckpt_torch::load(&fixtures("megatron").join(case).join("reference.pt")).unwrap() else {
        panic!("reference.pt is a dict")
    };
    d.items.into_iter().map(|(k, v)| (k.as_str().unwrap().to_owned(), v.as_tensor().unwrap().clone())).collect()
}

#[test]
fn tensors_equal_dist_checkpointing_load() {
    for case in ["gpt_tp1", "gpt_tp2", "sharded_w2"] {
        let r = open(case, MegatronOptions::default().with_unstack_layers(true));
        let reference = reference(case);
        assert!(!reference.is_empty());
        for (name, want) in &reference {
            let got = r.read_tensor(name).unwrap_or_else(|e| panic!("{case}: {name}: {e}"));
            assert!(got.to_contiguous().unwrap().bitwise_eq(want), "{case}: {name}");
        }
        let tensors = r.entries().iter().filter(|e| matches!(e.kind, EntryKind::Tensor(_))).count();
        assert_eq!(tensors, reference.len(), "{case}: every tensor entry is a reference tensor");
    }
}

#[test]
fn layer_stacked_tensors_unless_unstacked() {
    let r = open("gpt_tp2", MegatronOptions::default());
    let t = r.read_tensor("decoder.layers.self_attention.linear_qkv.weight").unwrap();
    assert_eq!(t.shape(), [2, 32, 16], "layers stacked, tensor-parallel shards joined");
    let u = open("gpt_tp2", MegatronOptions::default().with_unstack_layers(true));
    let l1 = u.read_tensor("decoder.layers.1.self_attention.linear_qkv.weight").unwrap();
    assert!(l1.to_contiguous().unwrap().bitwise_eq(&t.narrow(0, 1, 1).unwrap().reshape(&[32, 16]).unwrap()));
    // The per-layer objects are named like the layers' tensors.
    assert!(u.entries().iter().any(|e| e.name == "decoder.layers.1.mlp.linear_fc2._extra_state"));
}

#[test]
fn common_values_and_metadata() {
    let r = open("gpt_tp1", MegatronOptions::default());
    assert_eq!(r.value("iteration").unwrap(), Value::Int(5));
    assert_eq!(r.value("checkpoint_version").unwrap(), Value::Float(3.0));
    let Value::Object(args) = r.value("args").unwrap() else { panic!("args is an argparse.Namespace") };
    assert_eq!(args.callable_name().map(|(_, n)| n), Some("Namespace"));
    assert_eq!(r.arg("num_query_groups"), Some(ArgValue::Int(2)));
    assert_eq!(r.arg("swiglu"), Some(ArgValue::Bool(true)));
    assert_eq!(r.metadata_json()["sharded_backend"], "torch_dist");
    assert!(r.details().iter().any(|(k, v)| k == "iteration" && v == "5"));
    // megatron-core writes `all_local_plans` into `.metadata`; the DCP reader takes the rest.
    let raw = std::fs::read(fixtures("megatron").join("gpt_tp2/ckpt/.metadata")).unwrap();
    assert!(raw.windows(15).any(|w| w == b"all_local_plans"));
    let s = open("sharded_w2", MegatronOptions::default());
    assert_eq!(s.value("note.text").unwrap(), Value::Str("sharded fixture".into()));
    // A ShardedObject per rank: megatron-core saves it as a one-item list.
    let Value::List(rng) = s.value("rng_state/shard_1_2").unwrap() else { panic!("a list") };
    assert_eq!(rng[0].as_dict().unwrap().get("seed"), Some(&Value::Int(1001)));
    assert!(!s.is_model_tensor("iteration") && s.is_model_tensor("layer.cols"));
}

#[test]
fn llama_names_split_qkv_and_fc1_by_the_head_layout() {
    let r = open("gpt_tp2", MegatronOptions::default().with_llama(true));
    let names: Vec<String> =
        r.entries().into_iter().filter(|e| matches!(e.kind, EntryKind::Tensor(_))).map(|e| e.name).collect();
    for want in [
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    assert!(names.iter().all(|n| !n.contains("_extra_state")));
    // Megatron's layout: per query group (2), its 2 query heads, then a key and a value head, of 4 rows each.
    let qkv = reference("gpt_tp2")
        .into_iter()
        .find(|(n, _)| n == "decoder.layers.1.self_attention.linear_qkv.weight")
        .unwrap()
        .1;
    let rows = |ranges: &[(usize, usize)]| -> Vec<f32> {
        ranges.iter().flat_map(|&(s, l)| qkv.narrow(0, s, l).unwrap().to_vec::<f32>().unwrap()).collect()
    };
    let q = r.read_tensor("model.layers.1.self_attn.q_proj.weight").unwrap();
    let k = r.read_tensor("model.layers.1.self_attn.k_proj.weight").unwrap();
    let v = r.read_tensor("model.layers.1.self_attn.v_proj.weight").unwrap();
    assert_eq!((q.shape(), k.shape(), v.shape()), ([16, 16].as_slice(), [8, 16].as_slice(), [8, 16].as_slice()));
    assert_eq!(q.to_vec::<f32>().unwrap(), rows(&[(0, 8), (16, 8)]));
    assert_eq!(k.to_vec::<f32>().unwrap(), rows(&[(8, 4), (24, 4)]));
    assert_eq!(v.to_vec::<f32>().unwrap(), rows(&[(12, 4), (28, 4)]));
    let fc1 = reference("gpt_tp2").into_iter().find(|(n, _)| n == "decoder.layers.0.mlp.linear_fc1.weight").unwrap().1;
    let gate = r.read_tensor("model.layers.0.mlp.gate_proj.weight").unwrap();
    let up = r.read_tensor("model.layers.0.mlp.up_proj.weight").unwrap();
    assert!(gate.to_contiguous().unwrap().bitwise_eq(&fc1.narrow(0, 0, 24).unwrap().to_contiguous().unwrap()));
    assert!(up.to_contiguous().unwrap().bitwise_eq(&fc1.narrow(0, 24, 24).unwrap().to_contiguous().unwrap()));
}

#[test]
fn other_backends_and_missing_args_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = |to: &Path| {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(fixtures("megatron").join("gpt_tp1/ckpt")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    let zarr = tmp.path().join("zarr");
    copy(&zarr);
    std::fs::write(zarr.join("metadata.json"), r#"{"sharded_backend": "zarr", "sharded_backend_version": 1}"#).unwrap();
    let err = MegatronReader::open(&zarr, &ReadOptions::default(), MegatronOptions::default()).unwrap_err();
    assert!(matches!(err, ckpt_distcp::Error::MegatronMetadata { .. }) && err.to_string().contains("zarr"), "{err}");
    assert_eq!(err.fault(), ckpt_tensor::Fault::Unsupported);
    let no_args = tmp.path().join("no_args");
    copy(&no_args);
    std::fs::remove_file(no_args.join("common.pt")).unwrap();
    let err = MegatronReader::open(&no_args, &ReadOptions::default(), MegatronOptions::default().with_llama(true))
        .unwrap_err();
    assert!(
        matches!(err, ckpt_distcp::Error::MegatronLayout { .. }) && err.to_string().contains("num_attention_heads"),
        "{err}"
    );
    // Without the name map, a checkpoint without common.pt reads.
    assert!(MegatronReader::open(&no_args, &ReadOptions::default(), MegatronOptions::default()).is_ok());
}

/// megatron-core's distributed optimizer, both layouts that save (`dp_reshardable`: flat per-bucket buffers as
/// tensors; `dp_zero_gather_scatter`: per-rank state as objects): every tensor each rank saved (its key, its
/// offset in the global tensor, its data: `local_rank<R>.pt`) is the region ckpt reads back, and the objects
/// read.
#[test]
fn distributed_optimizer_layouts_read_as_each_rank_saved_them() {
    for case in ["distopt_dp_reshardable", "distopt_dp_zero_gather_scatter"] {
        let r = open(case, MegatronOptions::default());
        let mut checked = 0;
        for rank in 0..2 {
            let path = fixtures("megatron").join(case).join(format!("local_rank{rank}.pt"));
            let Value::List(locals) = ckpt_torch::load(&path).unwrap() else { panic!("a list") };
            for l in locals {
                let d = l.as_dict().unwrap();
                let key = d.get("key").and_then(Value::as_str).unwrap();
                let offset: Vec<usize> = d
                    .get("offset")
                    .unwrap()
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_int().unwrap() as usize)
                    .collect();
                let data = d.get("data").unwrap().as_tensor().unwrap();
                // A layer's tensor is a region of the layer-stacked one: its layer axis (size 1) prepended.
                let mut shape = vec![1; offset.len().saturating_sub(data.dim())];
                shape.extend_from_slice(data.shape());
                let got = r.dcp().read_region(key, &offset, &shape).unwrap_or_else(|e| panic!("{case}: {key}: {e}"));
                let want = data.reshape(&shape).unwrap();
                assert!(got.to_contiguous().unwrap().bitwise_eq(&want), "{case} rank {rank}: {key}");
                checked += 1;
            }
        }
        assert!(checked > 20, "{case}: {checked}");
        let optimizer: Vec<_> = r.entries().into_iter().filter(|e| e.name.starts_with("optimizer.")).collect();
        assert!(!optimizer.is_empty(), "{case}");
        for e in optimizer {
            assert!(r.value(&e.name).is_ok(), "{case}: {}", e.name);
            assert!(!r.is_model_tensor(&e.name));
        }
        assert_eq!(
            r.value("optimizer.param_state_sharding_type").unwrap(),
            Value::Str(case.trim_start_matches("distopt_").into())
        );
        // The model under Megatron's DDP (`module.`) maps onto Llama's names too, equal to the plain save's.
        let llama = open(case, MegatronOptions::default().with_llama(true));
        let plain = open("gpt_tp1", MegatronOptions::default().with_llama(true));
        assert!(
            !llama
                .read_tensor("model.layers.1.self_attn.v_proj.weight")
                .unwrap()
                .bitwise_eq(&Tensor::zeros(ckpt_tensor::DType::F32, &[8, 16]).unwrap())
        );
        assert_eq!(
            llama.read_tensor("model.norm.weight").unwrap().shape(),
            plain.read_tensor("model.norm.weight").unwrap().shape()
        );
    }
}
