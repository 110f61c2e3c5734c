#!/usr/bin/env python3
"""Check a Hugging Face directory that ckpt converted from a Megatron-Core GPT checkpoint with
``--name-map llama`` against Megatron's own loading, computed now.

Usage::

    .venv/bin/python conformance/python/megatron/check_convert.py HF_DIR CASE_DIR [--dtype bf16]

CASE_DIR is a fixture case made by ``make_fixtures.py`` (``ckpt/`` and the model's configuration there).
A 1-process job builds the case's ``GPTModel`` at tensor-parallel size 1, loads ``CASE_DIR/ckpt`` with
``dist_checkpointing.load`` and renames its state dict the way Hugging Face's Llama names it, splitting
``linear_qkv`` per query group (query heads, then a key and a value head of ``kv_channels`` rows) and the
gated ``linear_fc1`` into its gate and up halves, written here independently of ckpt. The HF directory
must hold exactly those tensors, bit for bit (with ``--dtype``, cast as torch casts). Exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import make_fixtures as mf  # noqa: E402  (pins the environment before torch is imported)


def llama_state(case_dir: Path) -> dict:
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import dist_checkpointing, parallel_state

    parallel_state.initialize_model_parallel()
    model = mf.gpt(1)
    loaded = dist_checkpointing.load(model.sharded_state_dict(), str(case_dir / "ckpt"))
    model.load_state_dict(loaded, strict=False)
    sd = {k: v for k, v in model.state_dict().items() if "_extra_state" not in k}
    a = mf.ARGS
    heads, groups, d = a["num_attention_heads"], a["num_query_groups"], a["kv_channels"]
    per = heads // groups
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"],
           "model.norm.weight": sd["decoder.final_layernorm.weight"], "lm_head.weight": sd["output_layer.weight"]}
    for i in range(a["num_layers"]):
        p = f"decoder.layers.{i}."
        q = f"model.layers.{i}."
        qkv = sd[p + "self_attention.linear_qkv.weight"].view(groups, (per + 2) * d, -1)
        out[q + "self_attn.q_proj.weight"] = qkv[:, : per * d].reshape(-1, qkv.shape[-1])
        out[q + "self_attn.k_proj.weight"] = qkv[:, per * d : (per + 1) * d].reshape(-1, qkv.shape[-1])
        out[q + "self_attn.v_proj.weight"] = qkv[:, (per + 1) * d :].reshape(-1, qkv.shape[-1])
        out[q + "self_attn.o_proj.weight"] = sd[p + "self_attention.linear_proj.weight"]
        gate, up = sd[p + "mlp.linear_fc1.weight"].chunk(2, 0)
        out[q + "mlp.gate_proj.weight"], out[q + "mlp.up_proj.weight"] = gate, up
        out[q + "mlp.down_proj.weight"] = sd[p + "mlp.linear_fc2.weight"]
        out[q + "input_layernorm.weight"] = sd[p + "input_layernorm.weight"]
        out[q + "post_attention_layernorm.weight"] = sd[p + "pre_mlp_layernorm.weight"]
    dist.destroy_process_group()
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("hf_dir", type=Path)
    p.add_argument("case_dir", type=Path)
    p.add_argument("--dtype")
    a = p.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    import importlib.util

    spec = importlib.util.spec_from_file_location("ds_check_convert", HERE.parent / "deepspeed" / "check_convert.py")
    ds_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ds_check)  # the DeepSpeed checker's reader of HF directories
    load_hf = ds_check.load_hf

    ref = llama_state(a.case_dir)
    got = load_hf(a.hf_dir)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, None: None}[a.dtype]
    problems = []
    if set(got) != set(ref):
        problems.append(f"names: only ckpt {sorted(set(got) - set(ref))}, only Megatron {sorted(set(ref) - set(got))}")
    for name, want in ref.items():
        if name in got:
            want = want.to(dtype) if dtype is not None else want
            if got[name].dtype != want.dtype or not torch.equal(got[name], want.contiguous()):
                problems.append(f"{name}: differs")
    for pr in problems[:10]:
        print(f"DIFFERS: {pr}")
    if problems:
        return 1
    print(f"equal: {len(ref)} tensors of {a.hf_dir} are Megatron's model in Llama's names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
