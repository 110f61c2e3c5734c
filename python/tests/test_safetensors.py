"""``ckpt.safe_open`` behaves like ``safetensors.safe_open`` on safetensors files: keys, metadata, tensors,
slices, numpy and torch; and reads other formats through the same API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open as st_open
from safetensors.numpy import save_file as np_save
from safetensors.torch import save_file as pt_save

import ckpt
from conftest import FIXTURES, tensor_bits

def _readable(path: Path) -> bool:
    """Whether safetensors itself opens the file and loads its tensors in torch (RecIS's golden `bool_dtype_bug`
    writes a dtype it rejects; torch has no dtype for F6)."""
    try:
        with st_open(str(path), framework="pt") as f:
            for k in f.keys():
                f.get_tensor(k)
            return True
    except Exception:  # noqa: BLE001
        return False


FILES = [p for p in sorted(FIXTURES.rglob("*.safetensors")) if _readable(p)]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A safetensors file with every dtype safetensors has, odd shapes, and metadata."""
    d = tmp_path_factory.mktemp("st")
    g = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(5, 7, generator=g),
        "bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "f16": torch.randn(9, generator=g).to(torch.float16),
        "i64": torch.arange(12).reshape(3, 2, 2),
        "u8": torch.arange(5, dtype=torch.uint8),
        "b": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "f8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
    }
    path = d / "made.safetensors"
    pt_save(tensors, str(path), metadata={"format": "pt", "note": "x"})
    return path


def cases(made_path: Path):
    return FILES + [made_path]


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_same_as_safetensors(made: Path, framework: str) -> None:
    for path in cases(made):
        if framework == "np" and _has_bf16(path):
            continue  # safetensors' numpy framework cannot read bfloat16, float8, float4; ckpt's gives ml_dtypes arrays
        with st_open(str(path), framework=framework) as theirs, ckpt.safe_open(path, framework=framework) as mine:
            assert mine.keys() == theirs.keys(), path
            assert mine.metadata() == theirs.metadata(), path
            assert mine.offset_keys() == theirs.offset_keys(), path
            for k in theirs.keys():
                assert tensor_bits(mine.get_tensor(k)) == tensor_bits(theirs.get_tensor(k)), (path, k)
                ms, ts = mine.get_slice(k), theirs.get_slice(k)
                assert ms.get_shape() == ts.get_shape() and ms.get_dtype() == ts.get_dtype(), (path, k)
                if ts.get_dtype() == "F4":
                    continue  # safetensors' own slices of F4 fail ("shape [8, 64] is invalid for input of size 256")
                shape = ts.get_shape()
                for index in _indexes(shape):
                    assert tensor_bits(ms[index]) == tensor_bits(ts[index]), (path, k, index)


def _has_bf16(path: Path) -> bool:
    with st_open(str(path), framework="pt") as f:
        numpy_lacks = ("BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4")
        return any(f.get_slice(k).get_dtype() in numpy_lacks for k in f.keys())


def _indexes(shape):
    if not shape:
        return [()]
    n = shape[0]
    # safetensors' slices take no negative index (ckpt's do, as numpy: test_negative_indexes)
    out = [slice(None), slice(0, 1), slice(0, n, 2), Ellipsis] + ([slice(1, None)] if n > 1 else [])
    if n > 0:
        out += [0, n - 1]
    if len(shape) > 1:
        out += [(slice(None), slice(0, 1)), (Ellipsis, 0) if shape[-1] > 0 else (Ellipsis, slice(0, 0))]
        if n > 0 and shape[1] > 1:
            out.append((0, slice(1, None)))
    return out


def test_numpy_arrays_are_views_of_the_map(made: Path) -> None:
    with ckpt.safe_open(made) as f:
        a = f.get_tensor("f32")
        assert not a.flags.writeable and a.base.mapped


def test_missing_key_and_other_formats(made: Path) -> None:
    with ckpt.safe_open(made) as f:
        with pytest.raises(KeyError):
            f.get_tensor("nope")
    dcp = FIXTURES / "distcp" / "torch213" / "m3"
    with ckpt.safe_open(dcp, framework="pt") as f:
        assert f.metadata() is None
        row = f.get_tensor("row")
        assert tensor_bits(f.get_slice("row")[2:5]) == tensor_bits(row[2:5])
        assert tensor_bits(f.get_slice("col")[:, 1:3]) == tensor_bits(f.get_tensor("col")[:, 1:3])


def test_numpy_save_file_read(tmp: Path) -> None:
    path = tmp / "n.safetensors"
    np_save({"a": np.arange(10, dtype=np.int32), "b": np.ones((2, 2))}, str(path))
    with ckpt.safe_open(path) as f, st_open(str(path), framework="np") as g:
        for k in g.keys():
            assert np.array_equal(f.get_tensor(k), g.get_tensor(k))


def test_negative_indexes(made: Path) -> None:
    with ckpt.safe_open(made) as f:
        s, a = f.get_slice("f32"), f.get_tensor("f32")
        for index in [-1, slice(-2, None), (slice(None), -1), (-1, slice(-3, -1))]:
            assert np.array_equal(s[index], a[index]), index
        with pytest.raises(IndexError):
            s[5]
