#!/usr/bin/env python3
"""Check checkpoints written by ckpt-hfai with the Python side: ``torch.load`` and ``hfai_ref.load``.

Usage::

    .venv/bin/python conformance/python/hfai/check_load.py SPEC.json

SPEC.json is ``{"checks": [CHECK, ...]}``, run in one process (torch starts once). A CHECK is

* ``{"candidate": DIR, "reference": DIR, "large_size": N, "buffers": [[name, ...], ...] | null}``:
  every ``PART_XXX.pt`` of DIR loads with ``torch.load(weights_only=True)`` and has hfai's layout
  (``hfai_ref``'s spec sections 2-4: header, one share per model/optimizer, every large tensor
  chunked in every part with ``torch.chunk``'s sizes, compact chunks, small keys in exactly one part,
  buffers whole at the end of part 0, ``param_groups`` in every part, ``others`` only in part 0); and
  ``hfai_ref.load(DIR)`` equals ``hfai_ref.load(reference)``: the same top-level keys in the same
  order, equal ``others`` and ``__version__`` (``__nshards__`` may differ: reshards), and the same model entries and optimizer state entries (in any order:
  where a key lives depends on the partition) with equal tensors (dtype, shape, strides, values);
* ``{"reject": DIR}``: ``hfai_ref.load(DIR)`` must raise.

Prints one line per check and exits 1 if any fails.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections import OrderedDict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import hfai_ref  # noqa: E402
import torchtree  # noqa: E402

HEADER = ["__nshards__", "__version__", "model", "optimizer"]


class Failed(Exception):
    pass


def need(cond: bool, msg: str) -> None:
    if not cond:
        raise Failed(msg)


def compact(t: torch.Tensor) -> bool:
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def check_large(parts: list[Any], shares: list[dict[Any, Any]], what: str) -> None:
    """Every part holds every large tensor's ``torch.chunk`` piece (spec §3.2, §3.4)."""
    n = len(parts)
    keys = list(shares[0].keys())
    for r, share in enumerate(shares):
        need(list(share.keys()) == keys, f"{what}: part {r} has large keys {list(share)}, part 0 {keys}")
    for key in keys:
        shape = shares[0][key][0]
        need(type(shape) is torch.Size, f"{what} {key}: stored shape is a {type(shape).__name__}")
        numel = shape.numel()
        expected = [len(c) for c in torch.empty(numel, dtype=torch.uint8).chunk(n)]
        need(len(expected) == n, f"{what} {key}: torch.chunk gives {len(expected)} chunks for {n} parts")
        for r, share in enumerate(shares):
            s, chunk = share[key]
            need(s == shape, f"{what} {key}: part {r} stores shape {tuple(s)}, part 0 {tuple(shape)}")
            need(chunk.dim() == 1 and len(chunk) == expected[r], f"{what} {key}: part {r} chunk {tuple(chunk.shape)}, torch.chunk gives {expected[r]}")
            need(chunk.dtype == shares[0][key][1].dtype, f"{what} {key}: part {r} chunk is {chunk.dtype}")
            need(compact(chunk), f"{what} {key}: part {r} chunk is not a compact clone")


def check_layout(d: Path, large_size: int, buffers: list[list[str]] | None) -> None:
    names = sorted(p.name for p in d.glob("PART_*.pt"))
    n = len(names)
    need(n > 0 and names == [f"PART_{r:03d}.pt" for r in range(n)], f"part files {names}")
    parts = [torch.load(d / name, weights_only=True, mmap=True) for name in names]
    for r, p in enumerate(parts):
        keys = list(p.keys())
        need(keys[:4] == HEADER, f"part {r}: keys start {keys[:4]}")
        need(r == 0 or keys == HEADER, f"part {r}: others outside part 0: {keys[4:]}")
        need(p["__nshards__"] == n and p["__version__"] == hfai_ref.VERSION, f"part {r}: header")
        need(len(p["model"]) == len(parts[0]["model"]), f"part {r}: model count")
        need(len(p["optimizer"]) == len(parts[0]["optimizer"]), f"part {r}: optimizer count")
    for m in range(len(parts[0]["model"])):
        shares = [p["model"][m] for p in parts]
        for r, share in enumerate(shares):
            need(type(share) is tuple and len(share) == 2, f"model {m} part {r}: not a pair")
            need(type(share[0]) is OrderedDict, f"model {m} part {r}: params is a {type(share[0]).__name__}")
            need(type(share[1]) is dict, f"model {m} part {r}: large_params is a {type(share[1]).__name__}")
        check_large(parts, [s[1] for s in shares], f"model {m}")
        owner: dict[str, int] = {}
        bufs = (buffers or [])[m] if buffers and m < len(buffers) else []
        for r, (params, _) in enumerate(shares):
            for k, v in params.items():
                need(k not in owner, f"model {m}: {k} in parts {owner.get(k)} and {r}")
                owner[k] = r
                if isinstance(v, torch.Tensor):
                    need(compact(v), f"model {m}: {k} is not a compact clone")
                    if k not in bufs:
                        need(v.numel() * v.element_size() <= large_size, f"model {m}: {k} should be chunked")
            if bufs:
                tail = list(params.keys())[-len(bufs):]
                need(r != 0 or tail == bufs, f"model {m}: part 0 ends with {tail}, buffers are {bufs}")
                need(r == 0 or not set(bufs) & set(params), f"model {m}: buffers in part {r}")
    for o in range(len(parts[0]["optimizer"])):
        shares = [p["optimizer"][o] for p in parts]
        check_large(parts, [s[1] for s in shares], f"optimizer {o}")
        owner = {}
        for r, (sd, _) in enumerate(shares):
            need(type(sd["state"]) is OrderedDict, f"optimizer {o} part {r}: state is a {type(sd['state']).__name__}")
            need(sd["param_groups"] == shares[0][0]["param_groups"], f"optimizer {o} part {r}: param_groups differ")
            for k in sd["state"]:
                need(k not in owner, f"optimizer {o}: state {k} in parts {owner.get(k)} and {r}")
                owner[k] = r
        for k1, _ in shares[0][1]:
            need(k1 in owner, f"optimizer {o}: large tensor of state {k1}, which no part holds")


def same_unordered(c: torchtree.Comparer, a: dict[Any, Any], b: dict[Any, Any], path: str) -> None:
    need(set(a) == set(b), f"{path}: keys differ: only in reference {sorted(map(str, set(a) - set(b)))}, "
         f"only in candidate {sorted(map(str, set(b) - set(a)))}")
    for k in a:
        c.compare(a[k], b[k], f"{path}.{k}")


def same_optimizer(c: torchtree.Comparer, a: dict[str, Any], b: dict[str, Any], path: str) -> None:
    need(list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}")
    for k in a:
        if k != "state":
            c.compare(a[k], b[k], f"{path}.{k}")
    need(type(a["state"]) is type(b["state"]), f"{path}.state: {type(a['state'])} vs {type(b['state'])}")
    need(set(a["state"]) == set(b["state"]), f"{path}.state: keys differ")
    for k1, e in a["state"].items():
        if isinstance(e, dict):
            need(type(e) is type(b["state"][k1]), f"{path}.state.{k1}: type differs")
            same_unordered(c, e, b["state"][k1], f"{path}.state.{k1}")
        else:
            c.compare(e, b["state"][k1], f"{path}.state.{k1}")


def check_values(reference: Path, candidate: Path) -> None:
    a, b = hfai_ref.load(reference), hfai_ref.load(candidate)
    need(list(a) == list(b), f"top-level keys {list(a)} vs {list(b)}")
    c = torchtree.Comparer()
    for k in a:
        if k == "model":
            ms_a, ms_b = (a[k], b[k]) if isinstance(a[k], list) else ([a[k]], [b[k]])
            need(type(a[k]) is type(b[k]) and len(ms_a) == len(ms_b), "model: kind or count differs")
            for i, (x, y) in enumerate(zip(ms_a, ms_b)):
                need(type(x) is type(y), f"model {i}: {type(x).__name__} vs {type(y).__name__}")
                same_unordered(c, x, y, f"model.{i}")
        elif k == "optimizer" and a[k] != []:
            os_a, os_b = (a[k], b[k]) if isinstance(a[k], list) else ([a[k]], [b[k]])
            need(type(a[k]) is type(b[k]) and len(os_a) == len(os_b), "optimizer: kind or count differs")
            for i, (x, y) in enumerate(zip(os_a, os_b)):
                same_optimizer(c, x, y, f"optimizer.{i}")
        elif k != "__nshards__":  # a reshard changes the number of parts, nothing else
            c.compare(a[k], b[k], k)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text("utf-8"))
    failures = 0
    for check in spec["checks"]:
        try:
            if "reject" in check:
                d = Path(check["reject"])
                try:
                    hfai_ref.load(d)
                except Exception as e:  # noqa: BLE001 - any failure is the expected outcome
                    print(f"ok: {d} rejected ({type(e).__name__}: {str(e)[:100]})")
                    continue
                raise Failed("hfai_ref.load accepted it")
            d = Path(check["candidate"])
            check_layout(d, int(check["large_size"]), check.get("buffers"))
            check_values(Path(check["reference"]), d)
            print(f"ok: {d} (layout, weights_only, values of {check['reference']})")
        except (Failed, torchtree.Mismatch, AssertionError, RuntimeError) as e:
            failures += 1
            print(f"FAILED: {check}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=2)
    print(f"{len(spec['checks']) - failures}/{len(spec['checks'])} checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
