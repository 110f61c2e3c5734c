"""DeepSpeed's ``BF16_Optimizer`` checkpoint (``conformance/fixtures/deepspeed_bf16``, saved by deepspeed 0.19.8
on CPU) read by the package equal, bit for bit, to what DeepSpeed gathered of it (``safe_get_full_fp32_param``,
``safe_get_full_optimizer_state``), and converted to safetensors, Hugging Face shards and ``.pt`` as torch and
safetensors load them."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

import ckpt
from conftest import FIXTURES, tensor_bits

CASE = FIXTURES / "deepspeed_bf16" / "bf16_optimizer_w2"


def test_bf16_optimizer_equals_what_deepspeed_gathers() -> None:
    ck = ckpt.open(CASE)
    assert ck.format == "deepspeed"
    assert "BF16_Optimizer" in ck.details["kind"]
    weights = torch.load(CASE / "reference.pt")
    for name, want in weights.items():
        assert tensor_bits(ck.tensor(name, framework="pt")) == tensor_bits(want), name
        assert tensor_bits(ck.tensor(name)) == tensor_bits(want), name  # numpy
        assert tensor_bits(ck.tensor(f"module.{name}", framework="pt")) == tensor_bits(want.to(torch.bfloat16)), name
    for key, want in torch.load(CASE / "reference_optim.pt").items():
        assert tensor_bits(ck.tensor(f"optimizer.state.{key}", framework="pt")) == tensor_bits(want), key
    assert tensor_bits(ck.tensor("out.weight", framework="pt")) == tensor_bits(weights["emb.weight"])


def test_bf16_optimizer_converts(tmp_path: Path) -> None:
    weights = torch.load(CASE / "reference.pt")
    st = tmp_path / "model.safetensors"
    # The weights alone (model_only): what transformers loads.
    assert ckpt.convert(CASE, st, to="safetensors", model_only=True).dropped == []
    got = load_file(str(st))
    assert set(got) == {"scale", "seen", *weights, "out.weight"}
    for name, want in weights.items():
        assert tensor_bits(got[name]) == tensor_bits(want), name
    ckpt.convert(CASE, tmp_path / "hf", to="hf", dtype="bf16", model_only=True)
    hf = ckpt.load(tmp_path / "hf", framework="pt")
    for name, want in weights.items():
        assert tensor_bits(hf[name]) == tensor_bits(want.to(torch.bfloat16)), name
    pt = tmp_path / "model.pt"
    ckpt.convert(CASE, pt, to="torch")
    loaded = torch.load(pt, weights_only=True)
    for name, want in weights.items():
        assert tensor_bits(loaded[name]) == tensor_bits(want), name
    assert ckpt.diff(CASE, pt).equal


def test_deepspeed_to_torch_keeps_what_inspect_lists(tmp_path: Path) -> None:
    """By default a conversion keeps every entry: the weights, the 16-bit ``module.*`` copies, the optimizer
    state per parameter, the engine and client state; ``ckpt.diff`` finds it equal to its source."""
    pt = tmp_path / "all.pt"
    summary = ckpt.convert(CASE, pt, to="torch")
    listed = [e.name for e in ckpt.open(CASE).entries]
    assert summary.dropped == []
    assert summary.tensors + summary.values == len(listed)
    assert sorted(e.name for e in ckpt.open(pt).entries) == sorted(listed)
    assert any(n.startswith("optimizer.state.") for n in listed) and any(n.startswith("module.") for n in listed)
    loaded = torch.load(pt, weights_only=True)
    for key, want in torch.load(CASE / "reference_optim.pt").items():
        assert tensor_bits(loaded[f"optimizer.state.{key}"]) == tensor_bits(want), key
    report = ckpt.diff(CASE, pt)
    assert report.equal, report
    # The names inspect lists select: the optimizer state alone.
    opt = tmp_path / "opt.pt"
    ckpt.convert(CASE, opt, to="torch", include="optimizer.*")
    assert sorted(e.name for e in ckpt.open(opt).entries) == sorted(n for n in listed if n.startswith("optimizer."))
