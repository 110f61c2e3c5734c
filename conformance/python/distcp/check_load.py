#!/usr/bin/env python3
"""Load DCP checkpoints written by ckpt with torch and compare them with what they should hold.

Usage::

    .venv/bin/python conformance/python/distcp/check_load.py JOBS.json

(The suite runs it with the project's torch 2.13. It also runs under older releases, down to torch
2.0, for manual compatibility checks of ``write_samples`` output; see the ``dcp`` jobs below.)

JOBS.json is a list of jobs, all run in this one process (torch starts once):

* ``{"kind": "dcp", "dir": D, "expected": P}``: ``P`` is a ``torch.save`` file of the state dict
  ``D`` should hold (written by ckpt's torch.save writer). Checks that ``dcp.load`` into a template
  of ``P`` (tensors zeroed, every other DCP leaf replaced by a placeholder) gives ``P``'s values,
  and that ``format_utils.dcp_to_torch_save(D)`` gives them too;
* ``{"kind": "pt_equals_dcp", "pt": P, "dir": D}``: ``P`` (ckpt's conversion of ``D``) equals what
  torch's own ``dcp_to_torch_save(D)`` writes;
* ``{"kind": "safetensors_equals_dcp", "files": [F, ...], "dir": D}``: the tensors of the
  safetensors files ``F`` equal the tensors of ``D`` under their flattened keys (torch's
  ``dcp_to_torch_save`` then ``flatten_state_dict``);
* ``{"kind": "hf_load", "dir": H, "expected": P}``: ``dcp.load`` through torch's
  ``HuggingFaceStorageReader`` on ``H`` gives the flat tensors of ``P``.

Equality is strict: same container types (dict/list/tuple), same keys, tensors with the same dtype,
shape and bytes, scalars equal (NaN equals NaN). Prints one line per job; exits 1 on any mismatch.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint._nested_dict import flatten_state_dict, unflatten_state_dict  # noqa: E402

try:  # torch 2.3+
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
except ImportError:  # pragma: no cover - older releases, checked by hand only
    dcp_to_torch_save = None

import torchtree  # noqa: E402

warnings.filterwarnings("ignore")
UNSET = "<unset by ckpt check_load>"


class Mismatch(Exception):
    pass


def same(a: Any, b: Any, path: str = "") -> None:
    """Raise Mismatch unless ``a`` (loaded) equals ``b`` (expected) strictly."""
    where = path or "<root>"
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor):
            raise Mismatch(f"{where}: expected a tensor, got {type(a).__name__}")
        if a.dtype != b.dtype or a.shape != b.shape:
            raise Mismatch(f"{where}: {a.dtype} {list(a.shape)} != {b.dtype} {list(b.shape)}")
        if torchtree.tensor_bytes(a) != torchtree.tensor_bytes(b):
            raise Mismatch(f"{where}: tensor values differ")
        return
    if isinstance(b, dict):
        if not isinstance(a, dict):
            raise Mismatch(f"{where}: expected a dict, got {type(a).__name__}")
        ka, kb = [str(k) for k in a], [str(k) for k in b]
        if sorted(ka) != sorted(kb):
            raise Mismatch(f"{where}: keys {sorted(ka)} != {sorted(kb)}")
        av = {str(k): v for k, v in a.items()}
        for k, v in b.items():
            same(av[str(k)], v, f"{path}.{k}" if path else str(k))
        return
    if isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            raise Mismatch(f"{where}: {type(a).__name__}[{len(a)}] != {type(b).__name__}[{len(b)}]")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}.{i}" if path else str(i))
        return
    if isinstance(b, float) and isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return
    if type(a) is not type(b) or a != b:
        raise Mismatch(f"{where}: {a!r} != {b!r}")


def template_of(expected: dict[str, Any]) -> dict[str, Any]:
    """``expected`` with tensors zeroed and every other DCP leaf replaced by a placeholder."""
    flat, mapping = flatten_state_dict(expected)
    blank = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else UNSET for k, v in flat.items()}
    return unflatten_state_dict(blank, mapping)


def torch_conversion(d: str, tmp: Path) -> Any:
    out = tmp / "torch_dcp_to_torch_save.pt"
    dcp_to_torch_save(d, str(out))
    return torch.load(out, weights_only=False)


def load(state_dict: dict[str, Any], **kwargs: Any) -> None:
    """``dcp.load`` in one process: ``no_dist=True`` where the release has it (2.2, 2.7+); 2.3-2.6 fall
    back to non-distributed loading when no process group exists; 2.0-2.1 only have
    ``load_state_dict(state_dict, storage_reader, no_dist=True)``."""
    if not hasattr(dcp, "load"):
        reader = kwargs.get("storage_reader") or dcp.FileSystemReader(kwargs["checkpoint_id"])
        dcp.load_state_dict(state_dict, storage_reader=reader, no_dist=True)
        return
    try:
        dcp.load(state_dict, no_dist=True, **kwargs)
    except TypeError as e:
        if "no_dist" not in str(e):
            raise
        dcp.load(state_dict, **kwargs)


def run(job: dict[str, Any], tmp: Path) -> str:
    kind = job["kind"]
    if kind == "dcp":
        expected = torch.load(job["expected"], weights_only=False)
        template = template_of(expected)
        load(template, checkpoint_id=job["dir"])
        same(template, expected)
        if dcp_to_torch_save is None:
            return "dcp.load equals the expected state dict (this torch has no dcp_to_torch_save)"
        same(torch_conversion(job["dir"], tmp), expected)
        return "dcp.load and dcp_to_torch_save equal the expected state dict"
    if kind == "pt_equals_dcp":
        same(torch.load(job["pt"], weights_only=False), torch_conversion(job["dir"], tmp))
        return "equals torch's dcp_to_torch_save"
    if kind == "safetensors_equals_dcp":
        from safetensors.torch import load_file

        got: dict[str, torch.Tensor] = {}
        for f in job["files"]:
            got.update(load_file(f))
        flat, _ = flatten_state_dict(torch_conversion(job["dir"], tmp))
        want = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
        same(got, want)
        return f"{len(got)} tensors equal torch's"
    if kind == "hf_load":
        from torch.distributed.checkpoint import HuggingFaceStorageReader

        expected = torch.load(job["expected"], weights_only=False)
        template = {k: torch.zeros_like(v) for k, v in expected.items()}
        load(template, storage_reader=HuggingFaceStorageReader(job["dir"]))
        same(template, expected)
        return "HuggingFaceStorageReader loads the expected tensors"
    raise ValueError(f"unknown job kind {kind!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    jobs = json.loads(Path(argv[1]).read_text())
    failed = 0
    with tempfile.TemporaryDirectory() as t:
        for job in jobs:
            name = job.get("name", job.get("dir"))
            try:
                print(f"ok   {name}: {run(job, Path(t))}")
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: BLE001 - report every job (torch 2.0's CheckpointException is a BaseException)
                failed += 1
                detail = str(e) if isinstance(e, Mismatch) else traceback.format_exc()
                print(f"FAIL {name}: {detail}")
    print(f"{len(jobs) - failed}/{len(jobs)} jobs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
