#!/usr/bin/env python3
"""Load checkpoints that ``ckpt::convert`` wrote with the Python originals and describe their tensors.

Usage::

    .venv/bin/python conformance/python/matrix/check_outputs.py SPEC.json OUT.json

SPEC.json is ``{"checks": [{"format": F, "path": P}, ...]}``; every check runs in this one process (torch
starts once). Each output is loaded the way its users load it:

* ``torch``: ``torch.load(P, weights_only=True)``;
* ``safetensors``: ``safetensors.torch.load_file(P)``;
* ``distcp``: ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save(P, tmp)`` (``dcp.load`` with
  the empty-state-dict planner, no process group), then ``torch.load(tmp, weights_only=True)``;
* ``hfai``: ``hfai_ref.load(P, weights_only=True)`` (the hfai reference loader, conformance/python/hfai).

OUT.json gets, per check in order, ``{"tensors": {name: [dtype, shape, sha256]}}`` where names are the
leaves' dotted paths (``ckpt_core::leaves`` naming: every dict, list and tuple descended into; ``str()`` of
keys), dtype is torch's name (``float32``), and sha256 is over the row-major bytes of the tensor — or
``{"error": text}`` when loading failed. The Rust side compares these with what it wrote.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hfai"))
import hfai_ref  # noqa: E402


def digest(t: torch.Tensor) -> str:
    t = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    if t.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()


def leaves(value, prefix: str, out: dict) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            leaves(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, (list, tuple)) and value:
        for i, v in enumerate(value):
            leaves(v, f"{prefix}.{i}" if prefix else str(i), out)
    elif (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and not value.is_quantized
        and value.device.type != "meta"
    ):  # dense tensors only, as ckpt lists them
        out[prefix] = [str(value.dtype).removeprefix("torch."), list(value.shape), digest(value)]


def load(fmt: str, path: str):
    if fmt == "torch":
        return torch.load(path, weights_only=True)
    if fmt == "safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    if fmt == "distcp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "sd.pt"
            dcp_to_torch_save(path, out)
            return torch.load(out, weights_only=True)
    if fmt == "hfai":
        return hfai_ref.load(path, nthreads=0, weights_only=True)
    raise ValueError(f"unknown format {fmt}")


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    results = []
    for check in spec["checks"]:
        try:
            out: dict = {}
            leaves(load(check["format"], check["path"]), "", out)
            results.append({"tensors": out})
        except Exception:  # reported to the Rust side, which fails the test naming the output
            results.append({"error": traceback.format_exc()})
    Path(sys.argv[2]).write_text(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
