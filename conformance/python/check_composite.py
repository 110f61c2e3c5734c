#!/usr/bin/env python3
"""Check what ckpt wrote of the quantized, sparse and nested tensors of ``conformance/fixtures/composite/``
against what the real torch and ``safetensors`` read.

Usage::

    check_composite.py torch SRC OUT        # OUT (a .pt ckpt wrote) loads in torch equal to SRC, entry by entry
    check_composite.py safetensors SRC OUT  # OUT (a .safetensors) holds SRC's components under their names
    check_composite.py dense SRC OUT        # OUT (a .safetensors of --dense) holds dequantize()/to_dense()

Prints one line per file with the number of entries checked; fails (exit 1) on the first difference.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

warnings.filterwarnings("ignore")


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Equal dtype, shape and bytes."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise SystemExit(f"{what}: {a.dtype} {tuple(a.shape)} != {b.dtype} {tuple(b.shape)}")
    a, b = a.contiguous(), b.contiguous()
    if a.numel() and not torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)):
        raise SystemExit(f"{what}: values differ:\n{a}\n{b}")


def components(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """The components ckpt writes, by the names it writes them under (`` `` the int representation)."""
    if t.is_quantized:
        if t.qscheme() == torch.per_tensor_affine:
            return {"": t.int_repr(), ".scale": torch.tensor(t.q_scale(), dtype=torch.float64),
                    ".zero_point": torch.tensor(t.q_zero_point(), dtype=torch.int64)}
        return {"": t.int_repr(), ".scale": t.q_per_channel_scales(), ".zero_point": t.q_per_channel_zero_points()}
    if t.is_nested:
        return {".buffer": t.values(), ".sizes": t._nested_tensor_size(), ".strides": t._nested_tensor_strides(),
                ".storage_offsets": t._nested_tensor_storage_offsets()}
    if t.layout == torch.sparse_coo:
        return {".indices": t._indices(), ".values": t._values()}
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return {".crow_indices": t.crow_indices(), ".col_indices": t.col_indices(), ".values": t.values()}
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return {".ccol_indices": t.ccol_indices(), ".row_indices": t.row_indices(), ".values": t.values()}
    return {"": t}


def describe(t: torch.Tensor) -> tuple[Any, ...]:
    """What must be equal besides the components: kind, dtype, shape, layout, qscheme, axis, coalescing."""
    if t.is_quantized:
        axis = t.q_per_channel_axis() if t.qscheme() != torch.per_tensor_affine else None
        return ("quantized", t.dtype, tuple(t.shape), t.qscheme(), axis)
    if t.is_nested:
        return ("nested", t.dtype, t.size(0))
    coalesced = t.is_coalesced() if t.layout == torch.sparse_coo else None
    return (str(t.layout), t.dtype, tuple(t.shape), coalesced)


def check_torch(src: str, out: str) -> int:
    a, b = torch.load(src, weights_only=True), torch.load(out, weights_only=True)
    if list(a) != list(b):
        raise SystemExit(f"{out}: keys {list(b)} != {list(a)}")
    for k in a:
        if describe(a[k]) != describe(b[k]):
            raise SystemExit(f"{out}: {k}: {describe(b[k])} != {describe(a[k])}")
        for name, t in components(a[k]).items():
            same(t, components(b[k])[name], f"{out}: {k}{name}")
    return len(a)


def check_safetensors(src: str, out: str) -> int:
    a, b = torch.load(src, weights_only=True), load_file(out)
    with safe_open(out, "pt") as f:
        values = json.loads((f.metadata() or {}).get("ckpt.values", "{}"))
    want = {f"{k}{name}": t for k, v in a.items() for name, t in components(v).items()}
    if sorted(want) != sorted(b):
        raise SystemExit(f"{out}: tensors {sorted(b)} != {sorted(want)}")
    for name, t in want.items():
        same(t, b[name], f"{out}: {name}")
    for k, v in a.items():
        if v.is_quantized and v.qscheme() != torch.per_tensor_affine:
            if values.get(k, {}).get("axis") != v.q_per_channel_axis():
                raise SystemExit(f"{out}: {k}: the metadata's axis is not {v.q_per_channel_axis()}: {values.get(k)}")
    return len(a)


def check_dense(src: str, out: str) -> int:
    a, b = torch.load(src, weights_only=True), load_file(out)
    for k, v in a.items():
        want = v.dequantize() if v.is_quantized else v.to_dense() if v.layout != torch.strided else v
        same(want, b[k], f"{out}: {k}")
    return len(a)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    mode, src, out = argv[1:]
    n = {"torch": check_torch, "safetensors": check_safetensors, "dense": check_dense}[mode](src, out)
    print(f"{out}: {n} entries equal ({mode})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
