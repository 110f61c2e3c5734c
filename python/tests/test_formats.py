"""hfai, PyTorch-BigGraph and RecIS fixtures read by ckpt equal to what their Python originals read (the hfai
reference ``load``, h5py, torch.load and safetensors on RecIS's files); save, convert, verify, reshard and diff
as the ``ckpt`` command does them, their outputs loaded by torch and safetensors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import ckpt
from conftest import FIXTURES, ROOT, same, tensor_bits

sys.path.insert(0, str(ROOT / "conformance" / "python" / "hfai"))


@pytest.mark.parametrize("case", sorted(p.name for p in (FIXTURES / "hfai").iterdir() if p.is_dir()))
def test_hfai_equals_reference_load(case: str) -> None:
    import hfai_ref

    d = FIXTURES / "hfai" / case / "ckpt"
    theirs = hfai_ref.load(str(d))
    mine = ckpt.load(d, framework="pt")
    for k in ("model", "optimizer"):
        if k in theirs:
            same(mine[k], theirs[k], k)


def test_pbg_equals_h5py() -> None:
    d = FIXTURES / "pbg" / "ckpt"
    ck = ckpt.open(d)
    assert ck.format == "pbg"
    version = (d / "checkpoint_version.txt").read_text().strip()
    checked = 0
    for e in ck.entries:
        if e.kind != "tensor" or not e.name.startswith("embeddings/"):
            continue
        _, entity, part = e.name.split("/")
        with h5py.File(d / f"embeddings_{entity}_{part}.v{version}.h5", "r") as f:
            assert np.array_equal(ck[e.name], f["embeddings"][...]), e.name
        checked += 1
    assert checked >= 3


def test_recis_equals_its_files() -> None:
    d = FIXTURES / "recis" / "golden" / "two_shard_adamw"
    ck = ckpt.open(d)
    assert ck.format == "recis"
    blocks = {}
    for f in sorted(d.glob("*.safetensors")):
        blocks.update(load_file(str(f)))
    tensors = [e for e in ck.entries if e.kind == "tensor"]
    assert tensors
    # every row ckpt gives for a table is a row RecIS stored in one of its blocks
    stored = {tuple(v.reshape(-1).tolist()) for v in blocks.values() if v.dim() == 1}
    for e in tensors:
        a = ck[e.name]
        assert a.shape == e.shape
        if a.ndim == 1 and a.dtype == np.int64:
            assert set(a.tolist()) <= {x for t in stored for x in t} | set(), e.name


def test_save_every_format_loads_back(tmp: Path) -> None:
    g = torch.Generator().manual_seed(0)
    sd = {"model": {"w": torch.randn(6, 4, generator=g), "b": torch.zeros(4, dtype=torch.bfloat16)},
          "step": 7, "lr": 0.5, "betas": (0.9, 0.99), "name": "run"}
    for fmt, dst in [("torch", tmp / "m.pt"), ("safetensors", tmp / "m.safetensors"), ("distcp", tmp / "dcp"),
                     ("hfai", tmp / "hfai"), ("hf", tmp / "hf")]:
        s = ckpt.save(sd, dst, format=fmt, world_size=2 if fmt in ("distcp", "hfai") else 1)
        assert s.tensors == 2 and s.values in (4, 5) or fmt == "hfai", (fmt, s)  # betas: a DCP value, two elsewhere
        back = ckpt.load(dst, framework="pt")
        flat = {e.name: e for e in ckpt.open(dst).entries}
        assert any(n.endswith("w") for n in flat), fmt
        if fmt == "torch":
            same(back, torch.load(dst, weights_only=True), "torch")
            same(back, {**sd, "betas": (0.9, 0.99)}, "torch")
    assert torch.equal(load_file(str(tmp / "m.safetensors"))["model.w"], sd["model"]["w"])
    import torch.distributed.checkpoint as dcp

    got = {"model": {"w": torch.zeros(6, 4), "b": torch.ones(4, dtype=torch.bfloat16)}, "step": 0}
    dcp.load(got, storage_reader=dcp.FileSystemReader(tmp / "dcp"), no_dist=True)
    assert torch.equal(got["model"]["w"], sd["model"]["w"]) and got["step"] == 7


def test_save_numpy_values(tmp: Path) -> None:
    import ml_dtypes

    sd = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "t": np.arange(4, dtype=np.float32)[::2],
          "bf": np.ones(3, dtype=ml_dtypes.bfloat16), "x": np.float64(2.5), "big": 2**70, "none": None,
          "s": {1, 2}, "blob": b"\x00\x01"}
    ckpt.save(sd, tmp / "n.pt")
    theirs = torch.load(tmp / "n.pt", weights_only=False)
    assert torch.equal(theirs["a"], torch.arange(6, dtype=torch.int16).reshape(2, 3))
    assert torch.equal(theirs["t"], torch.tensor([0.0, 2.0]))
    assert theirs["bf"].dtype == torch.bfloat16
    assert theirs["x"] == np.float64(2.5) and type(theirs["x"]) is np.float64
    assert theirs["big"] == 2**70 and theirs["none"] is None and theirs["s"] == {1, 2} and theirs["blob"] == b"\x00\x01"
    same(ckpt.load(tmp / "n.pt", framework="pt"), theirs, "n.pt")


def test_target_options_belong_to_the_target_format(tmp: Path) -> None:
    src = FIXTURES / "distcp" / "torch213" / "m3"
    with pytest.raises(ckpt.UsageError, match="hfai_large_size does not apply: it is an option of hfai targets"):
        ckpt.convert(src, tmp / "d", to="distcp", hfai_large_size=16)
    assert not (tmp / "d").exists()
    ckpt.convert(src, tmp / "d", to="distcp", dcp_profile="torch213")
    assert ckpt.open(tmp / "d").format == "distcp"


def test_durability_keywords_reach_the_writers(tmp: Path) -> None:
    """``sync=False, checksums=False`` as ``ckpt convert --no-sync --no-checksums``: no checksum manifest, CRC-32
    0 in ``torch.save`` records; by default both are written. Either way torch loads the result."""
    sd = {"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "step": 3}
    for checksums in (True, False):
        d = tmp / f"dcp{checksums}"
        ckpt.save(sd, d, format="distcp", sync=checksums, checksums=checksums)
        assert (d / "ckpt.checksums.json").exists() == checksums
        pt = tmp / f"m{checksums}.pt"
        ckpt.convert(d, pt, to="torch", sync=checksums, checksums=checksums)
        import zipfile

        crcs = [i.CRC for i in zipfile.ZipFile(pt).infolist()]
        assert any(crcs) == checksums, crcs
        assert torch.load(pt, weights_only=True)["model"]["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert ckpt.verify(pt, deep=True).ok


def test_convert_verify_reshard_diff(tmp: Path) -> None:
    src = FIXTURES / "distcp" / "torch213" / "m3"
    s = ckpt.convert(src, tmp / "hf", to="hf", max_shard_size=64, dtype="bf16", exclude="obj.*")
    assert s.tensors > 0 and (tmp / "hf" / "model.safetensors.index.json").exists()
    index = json.loads((tmp / "hf" / "model.safetensors.index.json").read_text())
    for name, shard in index["weight_map"].items():
        t = load_file(str(tmp / "hf" / shard))[name]
        assert t.dtype in (torch.bfloat16, torch.int64, torch.bool) or not t.is_floating_point()
    report = ckpt.verify(tmp / "hf", deep=True)
    assert report.ok and report.format == "hf" and report.checked > 0
    r = ckpt.reshard(src, tmp / "m3_2", 2)
    assert (r.format, r.world_size) == ("distcp", 2)
    d = ckpt.diff(src, tmp / "m3_2")
    assert d.equal and d and not d.only_a and all(t.equal for t in d.tensors)
    d = ckpt.diff(src, tmp / "hf")
    assert not d.equal and d.only_a  # obj.* left out, floats cast
    # hfai nests the state under `model.` beside its header: layout keys, not differences.
    ckpt.convert(src, tmp / "hfai", to="hfai", world_size=2)
    d = ckpt.diff(src, tmp / "hfai")
    assert d.equal and "__nshards__" in d.layout_b["keys"] and d.layout_b["format"] == "hfai"
    assert not ckpt.diff(src, tmp / "hfai", raw=True).equal
    pt = tmp / "m3.pt"
    ckpt.convert(src, pt, to="torch")
    same(ckpt.load(pt, framework="pt"), torch.load(pt, weights_only=False), "m3.pt")
    with pytest.raises(ckpt.UsageError):
        ckpt.reshard(src, tmp / "zero", 0)
    with pytest.raises(TypeError):
        ckpt.convert(src, tmp / "x", to="torch", max_bogus=1)


def test_limits_are_the_cli_flags() -> None:
    path = FIXTURES / "values" / "hf_sharded"
    with pytest.raises(ckpt.LimitError) as e:
        ckpt.open(path, max_header_bytes=8)
    assert e.value.fault == "limit" and e.value.path
    assert ckpt.open(FIXTURES / "torch" / "checkpoint.pt", trusted=True).format == "torch"
    with pytest.raises(ckpt.LimitError):
        ckpt.load(FIXTURES / "torch" / "nested.pt", max_depth=2)


def test_formats_listed() -> None:
    names = [f[0] for f in ckpt.formats()]
    assert names == ["torch", "safetensors", "megatron", "distcp", "hfai", "pbg", "recis", "deepspeed", "hf", "pickle",
                     "package", "gguf"]


def test_save_refuses_cycles_and_deep_nesting(tmp: Path) -> None:
    a: list = [1]
    a.append(a)
    with pytest.raises(ckpt.UsageError):
        ckpt.save({"a": a}, tmp / "c.pt")
    deep: list = []
    cur = deep
    for _ in range(5000):
        cur.append([])
        cur = cur[0]
    with pytest.raises(ckpt.UsageError):
        ckpt.save({"d": deep}, tmp / "d.pt")
    shared = [torch.ones(2)]
    ckpt.save({"x": shared, "y": shared}, tmp / "s.pt")  # shared, not cyclic: written twice
    assert torch.equal(torch.load(tmp / "s.pt", weights_only=True)["y"][0], torch.ones(2))
    with pytest.raises(ckpt.UsageError):
        ckpt.save({"f": lambda: 0}, tmp / "f.pt")
