#!/usr/bin/env python3
"""Checks a file ckpt converted from a GGUF file against gguf-py: every tensor of the GGUF file, read by
``GGUFReader`` and dequantized by ``gguf.quants.dequantize`` (the plain integer and F64 types as stored), equals
the tensor of the same name in the converted file, read by the real loader (``safetensors.numpy`` for
``.safetensors``, ``torch.load(weights_only=True)`` for ``.pt``), bit for bit after widening 16-bit floats.

Usage::

    .venv/bin/python conformance/python/gguf/check_converted.py MODEL.gguf CONVERTED.{safetensors,pt}

Prints ``N tensors equal``.
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

PLAIN = {T.F64, T.I8, T.I16, T.I32, T.I64}


def converted(path: str) -> dict[str, np.ndarray]:
    if path.endswith(".safetensors"):
        import torch
        from safetensors.torch import load_file

        tensors = load_file(path)
    else:
        import torch

        tensors = {k: v for k, v in torch.load(path, weights_only=True).items() if isinstance(v, torch.Tensor)}
    return {k: (v.float() if v.dtype in (torch.float16, torch.bfloat16) else v).numpy() for k, v in tensors.items()}


def main() -> None:
    reader = gguf.GGUFReader(sys.argv[1])
    theirs = converted(sys.argv[2])
    for t in reader.tensors:
        want = np.asarray(t.data) if t.tensor_type in PLAIN else gguf.quants.dequantize(t.data, t.tensor_type)
        got = theirs[t.name]
        assert got.shape == want.shape, (t.name, got.shape, want.shape)
        if got.dtype == np.float32 and want.dtype == np.float32:
            assert got.tobytes() == want.tobytes(), t.name
        else:
            assert np.array_equal(got, want.astype(got.dtype)), t.name
    print(f"{len(reader.tensors)} tensors equal")


if __name__ == "__main__":
    main()
