#!/usr/bin/env python3
"""Check what ckpt converted from a DeepSpeed ``BF16_Optimizer`` checkpoint against what DeepSpeed gathered of
it, loaded now by torch and safetensors.

Usage::

    .venv/bin/python conformance/python/deepspeed/check_bf16_convert.py OUT CASE [--dtype bf16]

CASE is a ``conformance/fixtures/deepspeed_bf16`` case (``make_bf16_fixtures.py``), OUT ckpt's output: a Hugging
Face directory (``model.safetensors`` or shards with ``model.safetensors.index.json``), a ``.safetensors`` file
or a ``torch.save`` file (``.pt``). DeepSpeed's own ``zero_to_fp32`` refuses these checkpoints, so the state
dict OUT must hold is built the way it builds one for ZeRO 1: the buffers of the model states file (floating
point ones as float32), then each trained parameter's fp32 master weights as DeepSpeed gathered them
(``reference.pt``: ``safe_get_full_fp32_param``), then each tied name (``shared_params``) as its parameter.
The same names, dtypes, shapes and bits (with ``--dtype``, each floating-point tensor ``.to(dtype)``). Exits 1
naming the first differences.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from pathlib import Path


def load_out(out: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    if out.is_dir():
        index = out / "model.safetensors.index.json"
        if not index.is_file():
            return load_file(out / "model.safetensors")
        meta = json.loads(index.read_text())
        got = {}
        for f in sorted(set(meta["weight_map"].values())):
            got.update(load_file(out / f))
        assert set(got) == set(meta["weight_map"]), "weight_map does not list the shards' tensors"
        return got
    if out.suffix == ".safetensors":
        return load_file(out)
    return torch.load(out, weights_only=True)


def expected(case: Path) -> "OrderedDict":
    import torch

    tag = (case / "latest").read_text().strip()
    states = torch.load(case / tag / "mp_rank_00_model_states.pt", weights_only=False)
    want = OrderedDict()
    for name in states["buffer_names"]:
        b = states["module"][name]
        want[name] = b.float() if b.is_floating_point() else b
    want.update(torch.load(case / "reference.pt"))
    for alias, target in (states.get("shared_params") or {}).items():
        want[alias] = want[target]
    return want


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("case", type=Path)
    p.add_argument("--dtype")
    a = p.parse_args()
    import torch

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, None: None}[a.dtype]
    want = expected(a.case)
    got = load_out(a.out)
    problems = []
    if set(got) != set(want):
        problems.append(f"names: only ckpt {sorted(set(got) - set(want))}, only expected {sorted(set(want) - set(got))}")
    for name, w in want.items():
        if name not in got:
            continue
        if dtype is not None and w.is_floating_point():
            w = w.to(dtype)
        g = got[name]
        bits = lambda t: t.contiguous().view(-1).view(torch.uint8)  # noqa: E731
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(bits(g), bits(w)):
            problems.append(f"{name}: {g.dtype} {tuple(g.shape)} vs {w.dtype} {tuple(w.shape)}, or other bits")
    for pr in problems[:10]:
        print(f"DIFFERS: {pr}")
    if problems:
        return 1
    print(f"equal: {len(want)} tensors of {a.out} are DeepSpeed's fp32 weights of {a.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
