//! The `ckpt` tool on training checkpoints made by the real software (`conformance/fixtures/deepspeed` and
//! `deepspeed_bf16`, by deepspeed 0.19.8; `conformance/fixtures/megatron`, by megatron-core 0.16.1): `inspect`,
//! `cat`, `verify`, `diff` and `convert --to hf`, whose output Python checks against DeepSpeed's own
//! consolidation (`get_fp32_state_dict_from_zero_checkpoint`, or for `BF16_Optimizer` checkpoints the fp32
//! weights DeepSpeed gathered) and Megatron's own loading (`dist_checkpointing.load`, with the Llama names split
//! independently), run now.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ckpt_conformance::run_python;

fn fixtures(format: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/fixtures").join(format)
}

/// Runs `ckpt args...`: (exit code, stdout, stderr).
fn ckpt(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ckpt")).args(args).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn deepspeed_cases() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures("deepspeed"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").is_file())
        .collect();
    v.sort();
    v
}

#[test]
fn inspect_cat_verify_deepspeed() {
    for case in deepspeed_cases() {
        let (code, out, err) = ckpt(&[&"inspect", &case]);
        assert_eq!(code, 0, "{}: {err}", case.display());
        assert!(out.starts_with("deepspeed checkpoint"), "{out}");
        assert!(out.contains("l1.weight") && out.contains("float32"), "{out}");
        let (code, out, err) = ckpt(&[&"inspect", &case, &"--json"]);
        assert_eq!(code, 0, "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(json["format"], "deepspeed");
        let (code, out, err) = ckpt(&[&"cat", &case, &"l1.bias", &"--limit", &"0"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains('[') && out.contains("dtype") || out.contains('.'), "{out}");
        for deep in [false, true] {
            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"verify", &case];
            if deep {
                args.push(&"--deep");
            }
            let (code, out, err) = ckpt(&args);
            assert_eq!(code, 0, "{}: {out}{err}", case.display());
        }
    }
    let zero = fixtures("deepspeed").join("zero2_w2");
    let (code, out, _) = ckpt(&[&"cat", &zero, &"epoch"]);
    assert_eq!((code, out.trim()), (0, "3"));
    let (code, out, _) = ckpt(&[&"inspect", &zero, &"--tag", &"global_step2", &"--include", &"optimizer.state.l1.*"]);
    assert_eq!(code, 0);
    assert!(out.contains("optimizer.state.l1.weight.exp_avg_sq"), "{out}");
    let (code, _, err) = ckpt(&[&"inspect", &zero, &"--tag", &"global_step7"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("global_step7"), "{err}");
}

#[test]
fn diff_deepspeed_and_megatron() {
    let zero = fixtures("deepspeed").join("zero3_w2");
    let (code, out, err) = ckpt(&[&"diff", &zero, &zero.join("global_step2")]);
    assert_eq!(code, 0, "{out}{err}");
    // Another save of the same model by another number of ranks: every tensor listed, differences found.
    let (code, out, _) = ckpt(&[&"diff", &zero, &fixtures("deepspeed").join("zero3_w1")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("l1.weight"), "{out}");
    // Tensor parallel 1 and 2 of one model are equal once the shards are joined.
    let m = fixtures("megatron");
    let (code, out, err) = ckpt(&[&"diff", &m.join("gpt_tp1/ckpt"), &m.join("gpt_tp2/ckpt"), &"--unstack-layers"]);
    assert!(code == 0 || out.contains("_extra_state"), "{out}{err}");
    let (code, out, err) = ckpt(&[&"diff", &m.join("gpt_tp1/ckpt"), &m.join("gpt_tp2/ckpt"), &"--name-map", &"llama"]);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn inspect_cat_verify_megatron() {
    for case in ["gpt_tp1", "gpt_tp2", "sharded_w2", "distopt_dp_reshardable", "distopt_dp_zero_gather_scatter"] {
        let dir = fixtures("megatron").join(case).join("ckpt");
        let (code, out, err) = ckpt(&[&"inspect", &dir]);
        assert_eq!(code, 0, "{case}: {err}");
        assert!(out.starts_with("megatron checkpoint"), "{out}");
        assert!(out.contains("iteration"), "{out}");
        assert!(!case.starts_with("distopt") || out.contains("optimizer."), "{out}");
        for args in [&[&"verify" as &dyn AsRef<std::ffi::OsStr>, &dir][..], &[&"verify", &dir, &"--deep"]] {
            let (code, out, err) = ckpt(args);
            assert_eq!(code, 0, "{case}: {out}{err}");
        }
    }
    let gpt = fixtures("megatron").join("gpt_tp2/ckpt");
    let (code, out, _) = ckpt(&[&"cat", &gpt, &"iteration"]);
    assert_eq!((code, out.trim()), (0, "5"));
    let (code, out, _) = ckpt(&[&"inspect", &gpt, &"--unstack-layers"]);
    assert_eq!(code, 0);
    assert!(out.contains("decoder.layers.1.mlp.linear_fc1.weight") && out.contains("[48, 16]"), "{out}");
    let (code, out, _) = ckpt(&[&"inspect", &gpt, &"--name-map", &"llama"]);
    assert_eq!(code, 0);
    assert!(out.contains("model.layers.0.self_attn.k_proj.weight") && out.contains("[8, 16]"), "{out}");
}

#[test]
fn convert_deepspeed_to_hf_equals_zero_to_fp32() {
    let tmp = tempfile::tempdir().unwrap();
    for case in
        deepspeed_cases().into_iter().filter(|c| !c.file_name().unwrap().to_str().unwrap().starts_with("universal"))
    {
        let out = tmp.path().join(case.file_name().unwrap());
        // The weights alone, as transformers loads them (by default the optimizer state and the rest go too).
        let (code, stdout, err) =
            ckpt(&[&"convert", &case, &out, &"--to", &"hf", &"--max-shard-size", &"600", &"--model-only"]);
        assert_eq!(code, 0, "{}: {stdout}{err}", case.display());
        assert!(out.join("model.safetensors.index.json").is_file(), "sharded, with the index");
        run_python("deepspeed/check_convert.py", &[&out, &case]);
    }
    // bf16, chosen tag, renamed.
    let case = fixtures("deepspeed").join("zero3_w2");
    let out = tmp.path().join("bf16");
    let (code, _, err) = ckpt(&[
        &"convert",
        &case,
        &out,
        &"--to",
        &"hf",
        &"--dtype",
        &"bf16",
        &"--tag",
        &"global_step2",
        &"--model-only",
    ]);
    assert_eq!(code, 0, "{err}");
    run_python("deepspeed/check_convert.py", &[&out, &case, Path::new("--dtype"), Path::new("bf16")]);
    let out = tmp.path().join("renamed");
    let args: [&dyn AsRef<std::ffi::OsStr>; 9] =
        [&"convert", &case, &out, &"--to", &"hf", &"--rename", &"l*.weight=layers.*.w", &"--rename", &"emb.=embed."];
    let (code, _, err) = ckpt(&args);
    assert_eq!(code, 0, "{err}");
    let names: Vec<String> = ckpt::open(&out).unwrap().entries().into_iter().map(|e| e.name).collect();
    for want in ["layers.1.w", "layers.2.w", "embed.weight", "l1.bias", "out.weight"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    // A universal checkpoint converts too; a DeepSpeed target is refused.
    let out = tmp.path().join("universal");
    let (code, _, err) = ckpt(&[&"convert", &fixtures("deepspeed").join("universal_zero2_w2"), &out, &"--to", &"hf"]);
    assert_eq!(code, 0, "{err}");
    // (--to offers only the formats ckpt writes: a usage error before anything is read; the library says why.)
    let (code, _, err) = ckpt(&[&"convert", &case, &tmp.path().join("x"), &"--to", &"deepspeed"]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid value 'deepspeed' for '--to <TO>'"), "{err}");
    let e = ckpt::convert(&case, None, tmp.path().join("x"), ckpt::Format::DeepSpeed, &Default::default());
    assert!(e.unwrap_err().to_string().contains("does not write"));
}

#[test]
fn convert_megatron_to_hf_equals_dist_checkpointing_load() {
    let tmp = tempfile::tempdir().unwrap();
    for (case, dtype) in [("gpt_tp1", None), ("gpt_tp2", None), ("gpt_tp2", Some("bf16"))] {
        let out = tmp.path().join(format!("{case}{}", dtype.unwrap_or("")));
        let dir = fixtures("megatron").join(case);
        let ckpt_dir = dir.join("ckpt");
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
            vec![&"convert", &ckpt_dir, &out, &"--to", &"hf", &"--name-map", &"llama", &"--model-only"];
        args.extend([&"--max-shard-size" as &dyn AsRef<std::ffi::OsStr>, &"2KB"]);
        if let Some(d) = &dtype {
            args.extend([&"--dtype" as &dyn AsRef<std::ffi::OsStr>, d]);
        }
        let (code, stdout, err) = ckpt(&args);
        assert_eq!(code, 0, "{case}: {stdout}{err}");
        let mut py: Vec<&Path> = vec![&out, &dir];
        if let Some(d) = &dtype {
            py.extend([Path::new("--dtype"), Path::new(d)]);
        }
        run_python("megatron/check_convert.py", &py);
    }
    // Without a name map: Megatron's own names, layers unstacked on request, model tensors only.
    let out = tmp.path().join("plain");
    let dir = fixtures("megatron").join("gpt_tp2/ckpt");
    let (code, _, err) = ckpt(&[&"convert", &dir, &out, &"--to", &"hf", &"--unstack-layers", &"--model-only"]);
    assert_eq!(code, 0, "{err}");
    let ck = ckpt::open(&out).unwrap();
    let names: Vec<String> = ck.entries().into_iter().map(|e| e.name).collect();
    assert!(names.iter().any(|n| n == "decoder.layers.1.self_attention.linear_qkv.weight"), "{names:?}");
    assert!(names.iter().all(|n| !n.contains("_extra_state") && n != "iteration"), "{names:?}");
}

#[test]
fn detection() {
    use ckpt::Format;
    let ds = fixtures("deepspeed");
    for (path, want) in [
        (ds.join("zero2_w2"), Format::DeepSpeed), // root: latest + global_step2/
        (ds.join("zero2_w2/global_step2"), Format::DeepSpeed), // a tag directory
        (ds.join("zero3_w1/global_step2"), Format::DeepSpeed), // ZeRO 3: per-rank model states
        (ds.join("universal_zero3_w2"), Format::DeepSpeed), // latest_universal + global_step2_universal/
        (ds.join("universal_zero3_w2/global_step2_universal"), Format::DeepSpeed),
        (fixtures("megatron").join("gpt_tp2/ckpt"), Format::Megatron), // .metadata + metadata.json
        (fixtures("distcp").join("golden/d215"), Format::Distcp),      // .metadata alone
    ] {
        assert_eq!(ckpt::detect(&path).unwrap(), want, "{}", path.display());
    }
    // A megatron checkpoint still opens as plain DCP when asked.
    let dcp = ckpt::open_as(fixtures("megatron").join("gpt_tp2/ckpt"), Format::Distcp).unwrap();
    assert!(dcp.entries().iter().any(|e| e.name == "decoder.layers.self_attention.linear_qkv.weight"));
    assert_eq!("megatron".parse::<Format>().unwrap(), Format::Megatron);
    assert_eq!("deepspeed".parse::<Format>().unwrap(), Format::DeepSpeed);
    assert!(ckpt::unsupported_reason(Format::Torch, Format::DeepSpeed).is_some());
    assert!(ckpt::unsupported_reason(Format::DeepSpeed, Format::Hf).is_none());
}

#[test]
fn verify_deep_finds_a_changed_byte_of_a_rank_file() {
    let tmp = tempfile::tempdir().unwrap();
    let tag = tmp.path().join("global_step2");
    std::fs::create_dir(&tag).unwrap();
    let src = fixtures("deepspeed").join("zero2_w1/global_step2");
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tag.join(e.file_name())).unwrap();
    }
    assert_eq!(ckpt(&[&"verify", &"--deep", &tag]).0, 0);
    // Flip one bit inside the record holding param group 1's fp32 flat group (found by its first bytes, the
    // master weights of l1.weight).
    let optim = tag.join("zero_pp_rank_0_mp_rank_00_optim_states.pt");
    let mut bytes = std::fs::read(&optim).unwrap();
    let first = ckpt_deepspeed_first_bytes(&tag);
    let at = bytes.windows(first.len()).position(|w| w == first.as_slice()).expect("the flat group's bytes");
    bytes[at] ^= 1;
    std::fs::write(&optim, &bytes).unwrap();
    let (code, out, err) = ckpt(&[&"verify", &"--deep", &tag]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("zero_pp_rank_0_mp_rank_00_optim_states.pt"), "{out}");
}

/// The first 8 bytes of the fp32 master weights of `l1.weight` (param group 1's flat group starts with it).
fn ckpt_deepspeed_first_bytes(tag: &Path) -> Vec<u8> {
    let ck = ckpt::open(tag).unwrap();
    ck.tensor("l1.weight").unwrap().to_contiguous().unwrap().data().unwrap()[..8].to_vec()
}

/// DeepSpeed's `BF16_Optimizer` checkpoint (`conformance/fixtures/deepspeed_bf16`, by deepspeed 0.19.8 on CPU):
/// `inspect`, `verify --deep`, and every conversion, checked by Python against the fp32 weights DeepSpeed
/// gathered of it (`check_bf16_convert.py`); the `.pt` conversion `diff`s equal to the checkpoint.
#[test]
fn bf16_optimizer_inspect_verify_convert_diff() {
    let case = fixtures("deepspeed_bf16").join("bf16_optimizer_w2");
    let (code, out, err) = ckpt(&[&"inspect", &case]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("deepspeed checkpoint") && out.contains("BF16_Optimizer"), "{out}");
    for want in ["l2.weight", "module.l2.weight", "optimizer.state.l2.weight.exp_avg_sq", "optimizer.group_paddings"] {
        assert!(out.contains(want), "{want} in {out}");
    }
    for args in [&[&"verify" as &dyn AsRef<std::ffi::OsStr>, &case][..], &[&"verify", &case, &"--deep"]] {
        let (code, out, err) = ckpt(args);
        assert_eq!(code, 0, "{out}{err}");
    }
    let (code, out, _) = ckpt(&[&"cat", &case, &"optimizer.state.l1.bias.step"]);
    assert_eq!(code, 0);
    assert!(out.contains('2'), "{out}");
    let tmp = tempfile::tempdir().unwrap();
    let outputs = [
        (tmp.path().join("hf"), "hf", None),
        (tmp.path().join("hf_bf16"), "hf", Some("bf16")),
        (tmp.path().join("model.safetensors"), "safetensors", None),
        (tmp.path().join("model.pt"), "torch", None),
    ];
    // The weights alone (--model-only), as DeepSpeed gathers them.
    for (out, to, dtype) in &outputs {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"convert", &case, out, &"--to", to, &"--model-only"];
        if let Some(d) = dtype {
            args.extend([&"--dtype" as &dyn AsRef<std::ffi::OsStr>, d]);
        }
        let (code, stdout, err) = ckpt(&args);
        assert_eq!(code, 0, "{to}: {stdout}{err}");
        let mut py: Vec<&Path> = vec![out, &case];
        if let Some(d) = dtype {
            py.extend([Path::new("--dtype"), Path::new(d)]);
        }
        run_python("deepspeed/check_bf16_convert.py", &py);
    }
    // Without it, everything inspect lists: diff finds the conversion equal to its source.
    for (file, to) in [("all.pt", "torch"), ("all.safetensors", "safetensors")] {
        let out = tmp.path().join(file);
        let (code, stdout, err) = ckpt(&[&"convert", &case, &out, &"--to", &to]);
        assert_eq!(code, 0, "{to}: {stdout}{err}");
        let (code, stdout, err) = ckpt(&[&"diff", &case, &out]);
        assert_eq!(code, 0, "{to}: {stdout}{err}");
    }
}
