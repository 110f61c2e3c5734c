"""Quantized, sparse and nested tensors (``conformance/fixtures/composite``, written by torch 2.13) through the
package: listed as ``composite`` entries with torch's dtype and dense shape; read without torch as
:class:`ckpt.CompositeTensor` (numpy components equal to the manifest's), with ``framework="pt"`` as the torch
tensor ``torch.load`` gives; ``ckpt.convert(dense=True)`` writes ``dequantize()`` / ``to_dense()``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ckpt
from conftest import FIXTURES

COMPOSITE = FIXTURES / "composite"
FILES = ["quantized.pt", "sparse.pt", "nested.pt"]


def manifest(file: str) -> dict:
    return json.loads((COMPOSITE / file.replace(".pt", ".json")).read_text())


@pytest.mark.parametrize("file", FILES)
def test_components_without_torch(file: str) -> None:
    ck = ckpt.open(COMPOSITE / file)
    for name, m in manifest(file).items():
        e = ck.entry(name)
        if "dense" in m:
            assert e.kind == "tensor", name
            continue
        assert (e.kind, e.dtype, list(e.shape)) == ("composite", m["dtype"], m["shape"]), name
        c = ck.value(name)
        assert isinstance(c, ckpt.CompositeTensor), name
        assert (c.layout, c.dtype, list(c.shape), c.axis) == (m["layout"], m["dtype"], m["shape"], m.get("axis"))
        assert sorted(c.components) == sorted(m["components"]), name
        for part, want in m["components"].items():
            a = np.asarray(c.components[part])  # tobytes() is row-major whatever the strides
            assert (ckpt.dtype_name(a), list(a.shape)) == (want["dtype"], want["shape"]), (name, part)
            assert a.tobytes().hex() == want["hex"], (name, part)


@pytest.mark.parametrize("file", FILES)
def test_torch_tensors_equal_torch_load(file: str) -> None:
    torch = pytest.importorskip("torch")
    want = torch.load(COMPOSITE / file, weights_only=True)
    got = ckpt.load(COMPOSITE / file, framework="pt")
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        assert (g.layout, g.dtype, g.is_quantized, g.is_nested) == (w.layout, w.dtype, w.is_quantized, w.is_nested)
        if w.is_quantized:
            assert torch.equal(g.int_repr(), w.int_repr()) and g.qscheme() == w.qscheme(), name
            assert torch.equal(g.dequantize(), w.dequantize()), name
        elif w.is_nested:
            assert all(torch.equal(a, b) for a, b in zip(g.unbind(), w.unbind())), name
        elif w.layout != torch.strided:
            assert torch.equal(g.to_dense(), w.to_dense()), name
        else:
            assert torch.equal(g, w), name


def test_convert_dense_equals_dequantize_and_to_dense(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    for file in ["quantized.pt", "sparse.pt"]:
        out = tmp_path / f"{file}.safetensors"
        summary = ckpt.convert(COMPOSITE / file, out, to="safetensors", dense=True)
        assert summary.tensors == len(manifest(file))
        got = ckpt.load(out, framework="pt")
        for name, w in torch.load(COMPOSITE / file, weights_only=True).items():
            dense = w.dequantize() if w.is_quantized else w.to_dense() if w.layout != torch.strided else w
            assert got[name].dtype == dense.dtype and torch.equal(got[name], dense), name
    with pytest.raises(ckpt.BadInputError, match="nested tensor has no dense form"):
        ckpt.convert(COMPOSITE / "nested.pt", tmp_path / "n.safetensors", to="safetensors", dense=True)
