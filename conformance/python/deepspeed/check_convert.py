#!/usr/bin/env python3
"""Check a Hugging Face directory that ckpt converted from a DeepSpeed checkpoint against DeepSpeed's own
consolidation, computed now.

Usage::

    .venv/bin/python conformance/python/deepspeed/check_convert.py HF_DIR CHECKPOINT [--dtype bf16] [--tag TAG]

HF_DIR holds ``model.safetensors`` or ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json`` (whose ``weight_map`` must list every tensor of the shards, and whose
``total_size`` must be their bytes). Its tensors must be exactly
``zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(CHECKPOINT, tag)``: the same names, dtypes, shapes
and bits (with ``--dtype``, each floating-point tensor ``.to(dtype)``, as ``zero_to_fp32 --dtype`` writes
it). Exits 1 naming the first differences.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def load_hf(d: Path) -> dict:
    from safetensors.torch import load_file

    index = d / "model.safetensors.index.json"
    if not index.is_file():
        return load_file(d / "model.safetensors")
    meta = json.loads(index.read_text())
    out = {}
    for f in sorted(set(meta["weight_map"].values())):
        out.update(load_file(d / f))
    assert set(out) == set(meta["weight_map"]), "weight_map does not list the shards' tensors"
    total = sum(t.numel() * t.element_size() for t in out.values())
    assert meta["metadata"]["total_size"] == total, (meta["metadata"]["total_size"], total)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("hf_dir", type=Path)
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--dtype")
    p.add_argument("--tag")
    a = p.parse_args()
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        ref = get_fp32_state_dict_from_zero_checkpoint(str(a.checkpoint), a.tag)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, None: None}[a.dtype]
    got = load_hf(a.hf_dir)
    problems = []
    if set(got) != set(ref):
        problems.append(f"names: only ckpt {sorted(set(got) - set(ref))}, only DeepSpeed {sorted(set(ref) - set(got))}")
    for name, want in ref.items():
        if name not in got:
            continue
        if dtype is not None and want.is_floating_point():
            want = want.to(dtype)
        g = got[name]
        if g.dtype != want.dtype or g.shape != want.shape or not torch.equal(g.view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8)):
            problems.append(f"{name}: {g.dtype} {tuple(g.shape)} vs DeepSpeed's {want.dtype} {tuple(want.shape)}, or other bits")
    for pr in problems[:10]:
        print(f"DIFFERS: {pr}")
    if problems:
        return 1
    print(f"equal: {len(ref)} tensors of {a.hf_dir} are DeepSpeed's consolidation of {a.checkpoint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
