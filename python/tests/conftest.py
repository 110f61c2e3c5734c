"""Shared helpers of the package's tests: fixture paths and a deep comparison of what ckpt and the
original software read.

Run through ``scripts/test.sh`` (which builds and installs the wheel into ``.venv``), or by hand after
``pip install ./python``: ``.venv/bin/python -m pytest python/tests``.
"""

from __future__ import annotations

import math
import os
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "conformance" / "fixtures"
BAD = ROOT / "conformance" / "bad"
sys.path.insert(0, str(ROOT / "conformance" / "python"))


def tensor_bits(t: Any) -> tuple:
    """(dtype name, shape, the row-major bytes) of a torch tensor or numpy array (numpy arrays of ml_dtypes
    types and ckpt's raw arrays by their torch name)."""
    import ckpt
    from ckpt._dtypes import packed

    if isinstance(t, np.generic):
        t = np.asarray(t)
    if isinstance(t, np.ndarray):
        t = packed(t)  # ml_dtypes float4_e2m1fn values: torch's float4_e2m1fn_x2 pairs
        return ckpt.dtype_name(t), tuple(t.shape), t.tobytes(order="C")
    import torch

    t = t.detach().resolve_conj().resolve_neg()
    c = torch.empty(t.shape, dtype=t.dtype).copy_(t)  # standard strides, even for dimensions of size 1
    raw = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
    return str(c.dtype).replace("torch.", ""), tuple(c.shape), raw


def same(a: Any, b: Any, where: str = "") -> None:
    """Asserts that ckpt's value ``a`` equals the original's ``b``: same container types (dict vs OrderedDict,
    list vs tuple), keys in the same order, tensors with the same dtype, shape and bytes, floats bit for bit
    (NaN equal to NaN)."""
    import torch

    if isinstance(b, torch.Tensor) and b.is_meta:
        # meta tensors: ckpt keeps them as the objects that rebuild them (they have no data)
        import ckpt

        assert isinstance(a, ckpt.OpaqueTensor), f"{where}: {type(a)}"
        return
    if isinstance(b, torch.Tensor) and (b.layout != torch.strided or b.is_quantized or b.is_nested):
        # sparse, quantized and nested tensors: the torch tensor made of ckpt's components (framework="pt"),
        # or the components themselves
        import ckpt

        if isinstance(a, ckpt.CompositeTensor):
            return
        assert isinstance(a, torch.Tensor), f"{where}: {type(a)}"
        assert (a.layout, a.dtype, a.shape, a.is_quantized) == (b.layout, b.dtype, b.shape, b.is_quantized), where
        if b.is_quantized:
            assert tensor_bits(a.int_repr()) == tensor_bits(b.int_repr()), f"{where}: int_repr"
            assert tensor_bits(a.dequantize()) == tensor_bits(b.dequantize()), f"{where}: dequantize"
        elif not b.is_nested:
            assert tensor_bits(a.to_dense()) == tensor_bits(b.to_dense()), f"{where}: to_dense"
        return
    if isinstance(b, torch.Tensor) or (isinstance(b, np.ndarray) and not isinstance(a, (int, float))):
        assert isinstance(a, (torch.Tensor, np.ndarray)), f"{where}: {type(a)} is not a tensor"
        assert tensor_bits(a) == tensor_bits(b), f"{where}: tensors differ"
        if isinstance(b, torch.nn.Parameter):
            assert isinstance(a, torch.nn.Parameter), f"{where}: not a Parameter"
        if isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor):
            assert a.requires_grad == b.requires_grad, f"{where}: requires_grad"
        return
    if isinstance(b, dict):
        assert type(a) is type(b) or (isinstance(a, dict) and type(b) is dict), f"{where}: {type(a)} vs {type(b)}"
        if isinstance(b, OrderedDict):
            assert isinstance(a, OrderedDict), f"{where}: not an OrderedDict"
        assert list(a.keys()) == list(b.keys()), f"{where}: keys {list(a)} vs {list(b)}"
        for k in b:
            same(a[k], b[k], f"{where}.{k}")
        return
    if isinstance(b, (list, tuple)):
        assert type(a) is type(b) or (isinstance(a, tuple) and isinstance(b, tuple)), f"{where}: {type(a)} vs {type(b)}"
        assert len(a) == len(b), f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
        return
    if isinstance(b, float) and math.isnan(b):
        assert isinstance(a, float) and math.isnan(a), f"{where}: {a!r} vs NaN"
        return
    if isinstance(b, np.generic):
        assert type(a) is type(b) and a.tobytes() == b.tobytes(), f"{where}: {a!r} vs {b!r}"
        return
    assert type(a) is type(b) and a == b, f"{where}: {a!r} ({type(a).__name__}) vs {b!r} ({type(b).__name__})"


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path


def in_process(*args: str) -> list:
    return [sys.executable, *args]


os.environ.setdefault("PYTHONHASHSEED", "0")
