"""``.pt`` files (every torch fixture, and the values fixtures users load) read by ckpt equal to what
``torch.load(weights_only=True)`` gives: the same tree, the same tensors, numpy or torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt
from ckpt._dtypes import packed
from conftest import FIXTURES, same, tensor_bits

TORCH = sorted((FIXTURES / "torch").glob("*.pt"))
# What torch.load(weights_only=True) itself refuses: a whole pickled nn.Module (ckpt reads it as its state dict).
NOT_WEIGHTS_ONLY = {"module_whole.pt"}
VALUES = [p for p in sorted((FIXTURES / "values").glob("*.pt")) + [FIXTURES / "values" / "lightning.ckpt"]
          if p.name not in NOT_WEIGHTS_ONLY and "unsupported" not in p.name]


def torch_load(path: Path):
    """torch.load of a fixture (weights_only where torch's own allow-list reads it: not protocol 4)."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001
        return torch.load(path, weights_only=False, map_location="cpu")


@pytest.mark.parametrize("path", TORCH + VALUES, ids=lambda p: p.name)
def test_load_pt_equals_torch_load(path: Path) -> None:
    same(ckpt.load(path, framework="pt"), torch_load(path), path.name)


@pytest.mark.parametrize("path", TORCH + VALUES, ids=lambda p: p.name)
def test_every_tensor_as_numpy_equals_torch(path: Path) -> None:
    ck = ckpt.open(path)
    theirs = dict(_flat(torch_load(path)))
    assert ck.format == "torch"
    for e in ck.entries:
        if e.kind != "tensor":
            continue
        a = ck[e.name]
        assert isinstance(a, np.ndarray)
        a = packed(a)  # FP4 comes back as ml_dtypes' float4_e2m1fn, one value a byte: torch's pairs
        assert (e.dtype, e.shape) == (ckpt.dtype_name(a), a.shape)
        assert e.nbytes == a.nbytes
        if e.name in theirs:
            assert tensor_bits(a) == tensor_bits(theirs[e.name]), e.name


def _flat(v, prefix=""):
    """DCP's flattening of torch.load's tree (the names ckpt lists)."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _flat(x, f"{prefix}{k}.")
    elif isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        for i, x in enumerate(v):
            yield from _flat(x, f"{prefix}{i}.")
    elif isinstance(v, torch.Tensor):
        yield prefix[:-1], v


def test_numpy_dtypes_with_and_without_ml_dtypes() -> None:
    ck = ckpt.open(FIXTURES / "torch" / "dtypes.pt")
    theirs = torch_load(FIXTURES / "torch" / "dtypes.pt")
    import ml_dtypes

    for name, t in _flat(theirs):
        a = ck[name]
        if t.dtype == torch.bfloat16:
            assert a.dtype == np.dtype(ml_dtypes.bfloat16)
            assert np.array_equal(a.astype(np.float32), t.float().numpy(), equal_nan=True)
        if t.dtype == torch.float8_e4m3fn:
            assert a.dtype == np.dtype(ml_dtypes.float8_e4m3fn)


def test_checkpoint_api() -> None:
    path = FIXTURES / "torch" / "checkpoint.pt"
    with ckpt.open(path) as ck:
        assert ck.format == "torch" and ck.path == str(path)
        assert ck.details["container"] == "zip"
        assert ck.keys() == [e.name for e in ck.entries] == list(ck)
        assert len(ck) == len(ck.entries) and "epoch" in ck and "nope" not in ck
        assert ck["epoch"] == torch_load(path)["epoch"]
        assert ck.value("epoch") == ck["epoch"]
        name = next(e.name for e in ck.entries if e.kind == "tensor")
        assert tensor_bits(ck.tensor(name, framework="pt")) == tensor_bits(ck[name])
        with pytest.raises(ckpt.EntryNotFoundError) as err:
            ck["nope"]
        assert isinstance(err.value, KeyError) and err.value.fault == "usage"
    with pytest.raises(ckpt.UsageError):
        ck.keys()


def test_include_exclude() -> None:
    path = FIXTURES / "values" / "lightning.ckpt"
    sd = ckpt.load(path, include="state_dict.*", exclude="*.num_batches_tracked")
    assert list(sd) == ["state_dict"]
    assert not any(k.endswith("num_batches_tracked") for k in sd["state_dict"])


def test_pt_tensors_are_writable_copy_on_write(tmp: Path) -> None:
    path = tmp / "m.pt"
    torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, path)
    before = path.read_bytes()
    sd = ckpt.load(path, framework="pt")
    sd["w"].mul_(2)  # a write changes this process's copy, never the file
    assert sd["w"][1, 2] == 10
    assert path.read_bytes() == before
    assert ckpt.load(path, framework="pt")["w"][1, 2] == 5


def test_file_url_and_other_urls() -> None:
    path = FIXTURES / "torch" / "checkpoint.pt"
    assert ckpt.open(f"file://{path}").format == "torch"
    with pytest.raises(ckpt.UsageError):  # object storage URLs are read (test_s3.py); unknown schemes are not
        ckpt.open("nosuch://bucket/model.pt")
