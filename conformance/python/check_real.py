#!/usr/bin/env python3
"""Does a file ckpt rewrote load in torch as the original does, object graph included (issue 26)?

Usage::

    .venv/bin/python conformance/python/check_real.py ORIGINAL REWRITTEN
    .venv/bin/python conformance/python/check_real.py --jit ORIGINAL.jit STATE_DICT.pt
    .venv/bin/python conformance/python/check_real.py --jit-all ORIGINAL.jit STATE_DICT_AND_EXTRAS.pt

The first form loads both with ``torch.load(weights_only=False, map_location='cpu')`` and compares them
deeply: tensors by dtype, shape, ``requires_grad`` and bits; containers and objects by exact type and
contents (an object's ``__dict__``, a module's ``state_dict()`` and ``training``); and identity: every
object of the original that is one object in several places (an omegaconf node and its children's
``_parent`` links, a shared dict) must be one object at the same places of the rewritten file, and no two
distinct objects may become one. The second form checks that a state dict ckpt converted from a TorchScript
archive by default (weights only) is the module's ``state_dict()`` and nothing else, bit for bit,
``requires_grad`` as the archive's parameters have it, which ``load_state_dict(strict=True)`` accepts; the
third, for a conversion that asked for the tensors outside it (``--include``), that it also holds the tensor
constants (``code_with_constants``) and the other tensor attributes, bit for bit. Prints one line per check;
exits non-zero on the first difference.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import real_classes  # noqa: E402,F401 - the classes the fixtures pickle

warnings.filterwarnings("ignore")


def fail(path: str, why: str) -> None:
    raise AssertionError(f"{path or '<root>'}: {why}")


def same_tensor(a: torch.Tensor, b: torch.Tensor, path: str) -> None:
    if a.dtype != b.dtype or a.shape != b.shape or a.requires_grad != b.requires_grad:
        fail(path, f"tensor {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}")
    x = a.detach().contiguous().reshape(-1).view(torch.uint8)
    y = b.detach().contiguous().reshape(-1).view(torch.uint8)
    if not torch.equal(x, y):
        fail(path, "tensor bytes differ")


class Graph:
    """Compares two object graphs, keeping the correspondence of their objects."""

    def __init__(self) -> None:
        self.a_to_b: dict[int, int] = {}
        self.b_to_a: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps the ids valid

    def same(self, a: Any, b: Any, path: str = "") -> None:
        if type(a) is not type(b):
            fail(path, f"type {type(a).__name__} != {type(b).__name__}")
        if isinstance(a, torch.Tensor):
            same_tensor(a, b, path)
            return
        if isinstance(a, int | float | str | bytes | bool | type(None)):
            if isinstance(a, float) and a != a and b != b:
                return
            if a != b:
                fail(path, f"{a!r} != {b!r}")
            return
        # Identity: one object here must be one object there, and the other way round.
        ia, ib = id(a), id(b)
        if ia in self.a_to_b or ib in self.b_to_a:
            if self.a_to_b.get(ia) != ib or self.b_to_a.get(ib) != ia:
                fail(path, "object identity differs (sharing or a cycle is not kept)")
            return
        self.a_to_b[ia], self.b_to_a[ib] = ib, ia
        self.keep += [a, b]
        if isinstance(a, nn.Module):
            if a.training != b.training:
                fail(path, "training flag differs")
            sa, sb = a.state_dict(), b.state_dict()
            if list(sa) != list(sb):
                fail(path, f"state_dict keys {list(sa)} != {list(sb)}")
            for k in sa:
                same_tensor(sa[k], sb[k], f"{path}.{k}")
        if isinstance(a, dict):
            if list(a.keys()) != list(b.keys()):
                fail(path, f"keys {list(a)} != {list(b)}")
            for k in a:
                self.same(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, list | tuple):
            if len(a) != len(b):
                fail(path, f"length {len(a)} != {len(b)}")
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                self.same(x, y, f"{path}.{i}")
        elif isinstance(a, set | frozenset):
            if a != b:
                fail(path, f"{a!r} != {b!r}")
        if hasattr(a, "__dict__") and not isinstance(a, type | nn.Module):
            self.same_dict(vars(a), vars(b), path)

    def same_dict(self, a: dict, b: dict, path: str) -> None:
        if list(a) != list(b):
            fail(path, f"attributes {list(a)} != {list(b)}")
        for k in a:
            self.same(a[k], b[k], f"{path}.{k}")


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] in ("--jit", "--jit-all"):
        module = torch.jit.load(argv[2], map_location="cpu")
        converted = torch.load(argv[3], weights_only=True)
        # keep_vars: the parameters as the archive holds them (``requires_grad`` included), not detached.
        want = module.state_dict(keep_vars=True)
        for k, t in want.items():
            if k not in converted:
                fail(k, "missing from the converted state dict")
            same_tensor(t, converted[k], k)
        if argv[1] == "--jit":
            # A default conversion is the state dict and nothing else: load_state_dict(strict=True) takes it.
            if sorted(converted) != sorted(want):
                fail("state_dict", f"keys {sorted(converted)} != {sorted(want)}")
            module.load_state_dict(converted, strict=True)
            print(f"state_dict: {len(want)} tensors equal, load_state_dict(strict=True) accepts it")
            return 0
        print(f"state_dict: {len(want)} tensors equal")
        # ``CONSTANTS.c<i>`` is numbered per module's code: every module's, compared as a multiset.
        constants = [t for _, sub in module.named_modules()
                     for t in sub.code_with_constants[1].const_mapping.values()]
        got = [converted[k] for k in converted if k.startswith("constants.")]
        if len(got) != len(constants):
            fail("constants", f"{len(got)} != {len(constants)}")
        for i, (c, g) in enumerate(zip(sorted(constants, key=lambda t: t.tolist()),
                                       sorted(got, key=lambda t: t.tolist()), strict=True)):
            same_tensor(c, g, f"constants.{i}")
        print(f"constants: {len(constants)} equal")
        # The other tensor attributes, by their path in the module.
        attributes = [k for k in converted if k.startswith("attributes.")]
        for k in attributes:
            owner = module
            *path, last = k.removeprefix("attributes.").split(".")
            for step in path:
                owner = getattr(owner, step)
            same_tensor(getattr(owner, last), converted[k], k)
        print(f"attributes: {len(attributes)} equal")
        return 0
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a = torch.load(argv[1], weights_only=False, map_location="cpu")
    b = torch.load(argv[2], weights_only=False, map_location="cpu")
    Graph().same(a, b)
    print("weights_only=False: equal, object identities kept")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
