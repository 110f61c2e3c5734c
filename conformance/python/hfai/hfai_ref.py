#!/usr/bin/env python3
"""A reference implementation of hfai's ``hfai.checkpoint.dist_ckpt`` ``save`` / ``load``.

hfai cannot be installed (it is only distributed from High-Flyer's own package index, spec §0),
so this module re-implements its checkpoint format from ``shared/specs/hfai.md`` ("the spec"),
section by section, for the conformance suite: the fixture generator runs ``save`` with real
torch and gloo across several processes, and the checkers run ``load`` on what ckpt writes.

Where the spec marks a behaviour undetermined ([U]), this module follows the public derivative
(``hfai_checkpoint_support.py``) the spec was written from, and says so.

One deliberate difference, for reproducibility only: the key-to-rank partition sorts sizes with
a *stable* sort (spec §4.2, tie caveat). hfai calls ``np.argsort`` with its default
(``quicksort``), whose order among equal sizes depends on the numpy version and the CPU's SIMD
kernels; for up to 16 keys on numpy's generic path it is the stable order used here.

``LARGE_SIZE`` is a module global so that the generator can lower it and make chunking happen
on small tensors (spec §3.2).
"""

from __future__ import annotations

import copy
import heapq
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

#: spec §3.2: a tensor is "large" iff its bytes are strictly greater than this.
LARGE_SIZE = 256 * (1 << 20)
#: spec §3: the ``__version__`` every part carries.
VERSION = "2.0.0"


# ------------------------------------------------------------------------------------------------
# hfai.checkpoint.utils


def check_type(name: str, x: Any, cls: type) -> list[Any]:
    """Spec §1 (``check_type`` [I]): ``None`` -> ``[]``, an instance -> ``[x]``, a list/tuple of
    instances -> a list, anything else -> ``TypeError``."""
    if x is None:
        return []
    if isinstance(x, cls):
        return [x]
    if isinstance(x, (list, tuple)) and all(isinstance(i, cls) for i in x):
        return list(x)
    raise TypeError(f"{name} must be a {cls.__name__} or a list of them, not {type(x).__name__}")


def count_size(x: Any) -> int:
    """Spec §4.1: bytes of a tensor, sums over dicts / lists / tuples, 8 for int/float/bool."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, dict):
        return sum(count_size(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(count_size(v) for v in x)
    if isinstance(x, (int, float)):
        return 8
    return 0


def divide_almost_equally(sizes: list[int], nshards: int) -> dict[int, list[int]]:
    """Spec §4.2: greedy LPT. Largest first, each to the least-loaded rank (ties: lower rank).

    ``argsort`` is stable here (see the module docstring); reversed, equal sizes come in
    descending index order, as numpy's default sort gives them for small arrays.
    """
    order = np.argsort(np.asarray(sizes, dtype=np.int64), kind="stable")[::-1]
    heap = [(0, r) for r in range(nshards)]
    heapq.heapify(heap)
    sets: dict[int, list[int]] = {r: [] for r in range(nshards)}
    for idx in order:
        load, r = heapq.heappop(heap)
        sets[r].append(int(idx))
        heapq.heappush(heap, (load + sizes[idx], r))
    return sets


def split_dict(state: dict[Any, Any], rank: int, nshards: int, clone: bool = False) -> OrderedDict:
    """Spec §4.2: this rank's share of ``state`` as a fresh ``OrderedDict``, in assignment order.

    ``clone=True`` is the derivative's ``split_dict_model`` twin (spec §3.1: every model tensor
    is ``.clone()``d before saving).
    """
    keys = list(state.keys())
    sizes = [count_size(state[k]) for k in keys]
    out: OrderedDict = OrderedDict()
    for i in divide_almost_equally(sizes, nshards)[rank]:
        v = state[keys[i]]
        out[keys[i]] = v.clone() if clone and isinstance(v, torch.Tensor) else v
    return out


def is_large(x: Any) -> bool:
    """Spec §3.2 / §3.4: a strided tensor of strictly more than ``LARGE_SIZE`` bytes."""
    return (
        isinstance(x, torch.Tensor)
        and x.layout == torch.strided
        and x.numel() * x.element_size() > LARGE_SIZE
    )


def chunk_of(t: torch.Tensor, rank: int, nshards: int) -> tuple[torch.Size, torch.Tensor]:
    """Spec §3.2: ``(t.shape, t.view(-1).chunk(n)[rank].clone())``. ``view(-1)`` raises on a
    non-contiguous tensor and ``[rank]`` raises ``IndexError`` when ``chunk`` yields fewer than
    ``n`` pieces, exactly as hfai does."""
    return t.shape, t.view(-1).chunk(nshards)[rank].clone()


# ------------------------------------------------------------------------------------------------
# the sharders (spec §3.1 - §3.4)


def model_part(model: nn.Module, rank: int, nshards: int) -> tuple[OrderedDict, dict]:
    """Spec §3.1 / §3.2: ``(params_i, large_params_i)`` of one model for ``rank``."""
    state = model.state_dict()
    # §3.1: every buffer is popped first (the derivative's pop raises KeyError for a
    # non-persistent buffer; hfai's handling is [U]); rank 0 appends them, whole, at the end.
    buffers = OrderedDict((name, state.pop(name)) for name, _ in model.named_buffers())
    # §3.2: large tensors are chunked across ranks and removed before the partition.
    large = {k: chunk_of(v, rank, nshards) for k, v in state.items() if is_large(v)}
    for k in large:
        del state[k]
    params = split_dict(state, rank, nshards, clone=True)
    if rank == 0:
        params.update(buffers)
    return params, large


def optimizer_part(optimizer: Optimizer, rank: int, nshards: int) -> tuple[dict, dict]:
    """Spec §3.3 / §3.4: ``(opt_state_j, large_tensors_j)`` of one optimizer for ``rank``."""
    sd = copy.deepcopy(optimizer.state_dict())  # §3.3: the derivative deep-copies ([U] for hfai)
    large: dict[tuple[Any, str], tuple[torch.Size, torch.Tensor]] = {}
    for k1, v1 in sd["state"].items():
        if not isinstance(v1, dict):
            continue
        for k2 in list(v1.keys()):
            if is_large(v1[k2]):
                large[(k1, k2)] = chunk_of(v1[k2], rank, nshards)
                del v1[k2]
    sd["state"] = split_dict(sd["state"], rank, nshards)
    return sd, large


# ------------------------------------------------------------------------------------------------
# save / load


def save(
    fname: str | Path,
    model: nn.Module | list[nn.Module],
    optimizer: Optimizer | list[Optimizer] | None = None,
    others: dict[Any, Any] | None = None,
    group: Any = None,
) -> None:
    """Spec §1 / §2 / §3: collective; every rank of ``group`` writes ``PART_{rank:03d}.pt``."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized yet.")
    group = group if group is not None else dist.group.WORLD
    rank, nshards = dist.get_rank(group), dist.get_world_size(group)
    models = check_type("model", model, nn.Module)
    optimizers = check_type("optimizer", optimizer, Optimizer)
    others = {} if others is None else others
    assert "model" not in others and "optimizer" not in others  # §3: the only forbidden keys
    state: dict[str, Any] = {
        "__nshards__": nshards,
        "__version__": VERSION,
        "model": [model_part(m, rank, nshards) for m in models],
        "optimizer": [optimizer_part(o, rank, nshards) for o in optimizers],
    }
    if rank == 0:
        state.update(others)  # §3: rank 0 only, last, may even override the header
    # §2: mkdir, write straight to the final name (no temp file, no fsync), then a barrier.
    path = Path(fname)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / f"PART_{rank:03d}.pt")
    dist.barrier(group)


def load(fname: str | Path, nthreads: int = 8, **kwargs: Any) -> dict[str, Any]:
    """Spec §5: read every part (a thread pool when ``nthreads > 0``) and merge them."""
    path = Path(fname)
    assert path.is_dir(), f"{fname} is not a directory"  # §5.1
    nshards = len(list(path.glob("PART_*.pt")))
    files = [path / f"PART_{i:03d}.pt" for i in range(nshards)]

    # §5.2 (without the nthreads == 1 quirk of loading parts twice, which changes nothing).
    if nthreads > 0:
        with ThreadPoolExecutor(nthreads) as pool:
            parts = list(pool.map(lambda f: torch.load(f, **kwargs), files))
    else:
        parts = [torch.load(f, **kwargs) for f in files]

    # §5.3
    state0 = parts[0]
    version = state0.get("__version__", "1.0.0")
    assert version == VERSION, f"unsupported hfai checkpoint version {version}"
    assert nshards == state0["__nshards__"], f"{nshards} parts found, __nshards__ = {state0['__nshards__']}"

    # §5.4
    n_models, n_optims = len(state0["model"]), len(state0["optimizer"])
    params: list[dict[str, Any]] = [{} for _ in range(n_models)]
    large_params: list[dict[str, list[Any]]] = [{} for _ in range(n_models)]
    optims: list[Any] = [None] * n_optims
    large_optim: list[dict[Any, list[Any]]] = [{} for _ in range(n_optims)]
    for state in parts:
        assert state["__nshards__"] == nshards
        for m, (p, large) in enumerate(state["model"]):
            params[m].update(p)
            for name, (shape, chunk) in large.items():
                entry = large_params[m].setdefault(name, [None, []])
                entry[0] = shape  # the last one seen wins
                entry[1].append(chunk)
        for o, (sd, large) in enumerate(state["optimizer"]):
            if optims[o] is None:
                optims[o] = sd  # rank 0's dict is the base: its param_groups and other keys win
            else:
                optims[o]["state"].update(sd["state"])
            for key, (shape, chunk) in large.items():
                entry = large_optim[o].setdefault(key, [None, []])
                entry[0] = shape
                entry[1].append(chunk)

    # §5.5: large model tensors, concatenated in rank order, appended after the small keys.
    for m in range(n_models):
        for name, (shape, chunks) in large_params[m].items():
            assert name not in params[m]
            params[m][name] = torch.cat(chunks, 0).view(*shape)
    # §5.6: large optimizer tensors go back into state[k1][k2].
    for o in range(n_optims):
        st = optims[o]["state"]
        for (k1, k2), (shape, chunks) in large_optim[o].items():
            assert k2 not in st[k1]
            st[k1][k2] = torch.cat(chunks, 0).view(*shape)

    # §5.7: one model / optimizer is unwrapped; no optimizer leaves the raw [].
    state0["model"] = params[0] if n_models == 1 else params
    if n_optims > 0:
        state0["optimizer"] = optims[0] if n_optims == 1 else optims
    return state0
