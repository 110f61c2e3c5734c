#!/usr/bin/env python3
"""Write a ``torch.save`` state dict of many small tensors, to show how open and read grow with the count.

Usage::

    .venv/bin/python benches/python/pt_many_tensors.py OUT.pt [--tensors 20000] [--bytes 10240]

``--tensors`` float32 tensors of ``--bytes`` bytes each (rounded to whole elements; 20,000 × 10 KiB is
about 200 MiB), named like a deep model's parameters (``layers.{i}.{block}.{name}``), each with its own
storage, pseudo-random contents, saved with ``torch.save`` (the zip format, default settings). Shapes alternate
between matrices and vectors so that both appear in listings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

NAMES = ("attn.q.weight", "attn.q.bias", "attn.k.weight", "mlp.up.weight", "mlp.up.bias", "norm.weight")


def state_dict(count: int, nbytes: int) -> dict[str, torch.Tensor]:
    numel = max(1, nbytes // 4)
    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(count):
        name = NAMES[i % len(NAMES)]
        shape = (numel,) if name.endswith(("bias", "norm.weight")) else (numel // 16, 16) if numel >= 16 else (numel,)
        sd[f"layers.{i // len(NAMES)}.{name}"] = torch.randn(shape, generator=g)
    return sd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tensors", type=int, default=20000)
    ap.add_argument("--bytes", type=int, default=10240)
    args = ap.parse_args()
    torch.save(state_dict(args.tensors, args.bytes), args.out)
    print(f"{args.out} {args.out.stat().st_size} bytes, {args.tensors} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
