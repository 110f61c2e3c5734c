#!/usr/bin/env python3
"""Does a file ckpt rewrote load in torch exactly like the original (numpy values, whole modules)?

Usage::

    .venv/bin/python conformance/python/check_values.py ORIGINAL REWRITTEN

Loads both with ``torch.load(weights_only=False)`` and compares them deeply: numpy scalars by type, dtype
and bits; numpy arrays by type, dtype, shape, values (bits) and Fortran ordering; ``nn.Module`` objects by
class (every submodule) and ``state_dict()`` (names, order, dtypes, bits); tensors by dtype, shape and bits;
containers by type and items. Then checks that ``torch.serialization.get_unsafe_globals_in_checkpoint``
lists the same globals for both, and that ``torch.load(weights_only=True)`` with exactly those globals
allowed (and the classes torch then asks for to BUILD them, numpy 2's dtype classes) loads the rewritten
file to the same object (where torch's weights-only unpickler can build it at
all: whole modules are refused for both files alike, and the check is that both are refused). Prints one
line per check; exits non-zero on the first difference.
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

warnings.filterwarnings("ignore")


def fail(path: str, why: str) -> None:
    raise AssertionError(f"{path or '<root>'}: {why}")


def same(a: Any, b: Any, path: str = "") -> None:
    if type(a) is not type(b):
        fail(path, f"type {type(a).__name__} != {type(b).__name__}")
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            fail(path, f"array {a.dtype}{a.shape} != {b.dtype}{b.shape}")
        if bool(a.flags.f_contiguous) != bool(b.flags.f_contiguous) or bool(a.flags.c_contiguous) != bool(b.flags.c_contiguous):
            fail(path, "array memory order differs")
        if np.ascontiguousarray(a).tobytes() != np.ascontiguousarray(b).tobytes():
            fail(path, "array values differ")
    elif isinstance(a, np.generic):
        if a.dtype != b.dtype or a.tobytes() != b.tobytes():
            fail(path, f"numpy scalar {a!r} ({a.dtype}) != {b!r} ({b.dtype})")
    elif isinstance(a, nn.Module):
        ca = [type(m) for m in a.modules()]
        cb = [type(m) for m in b.modules()]
        if ca != cb:
            fail(path, f"module classes {ca} != {cb}")
        if a.training != b.training:
            fail(path, "training flag differs")
        same(dict(a.state_dict()), dict(b.state_dict()), path + ".state_dict()")
        if list(a.state_dict()) != list(b.state_dict()):
            fail(path, "state_dict order differs")
    elif isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.requires_grad != b.requires_grad:
            fail(path, f"tensor {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}")
        if not torch.equal(a.detach().contiguous().view(-1).view(torch.uint8), b.detach().contiguous().view(-1).view(torch.uint8)):
            fail(path, "tensor bytes differ")
    elif isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            fail(path, f"keys {list(a)} != {list(b)}")
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            fail(path, f"length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}.{i}")
    elif isinstance(a, float):
        if a.hex() != b.hex() and not (a != a and b != b):
            fail(path, f"{a!r} != {b!r}")
    elif a != b:
        fail(path, f"{a!r} != {b!r}")


def resolve(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    orig, new = argv[1], argv[2]
    a = torch.load(orig, weights_only=False)
    b = torch.load(new, weights_only=False)
    same(a, b)
    print("weights_only=False: equal")
    def unsafe(path: str) -> list[str] | None:
        try:
            return torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except ValueError:  # torch reads them from ZIP files only, not from the legacy stream
            return None

    ga, gb = unsafe(orig), unsafe(new)
    if ga is not None and gb is not None and sorted(ga) != sorted(gb):
        fail("", f"unsafe globals {sorted(ga)} != {sorted(gb)}")
    ga = ga if ga is not None else (gb or [])
    print(f"unsafe globals: {sorted(ga)}")
    allowed = [resolve(g) for g in ga]

    def weights_only(path: str) -> tuple[bool, Any]:
        try:
            with torch.serialization.safe_globals(allowed):
                return True, torch.load(path, weights_only=True)
        except Exception as e:  # noqa: BLE001 - compared, not hidden
            return False, e

    # BUILD of some objects needs their classes too (numpy 2's dtype classes, `numpy.dtypes.Float64DType`):
    # add what torch names for the original until it loads or names nothing more.
    ok_a, wa = weights_only(orig)
    for _ in range(64):
        if ok_a:
            break
        m = re.search(r"but got <class '([\w.]+)'>", str(wa))
        if not m:
            break
        allowed.append(resolve(m.group(1)))
        ok_a, wa = weights_only(orig)
    ok_b, wb = weights_only(new)
    if ok_a != ok_b:
        fail("", f"weights_only=True with the globals allowed: original {'loads' if ok_a else 'fails'}, rewritten {wb!r}")
    if ok_a:
        same(wa, wb)
        same(a, wb)
        print("weights_only=True with those globals: equal")
    else:
        print(f"weights_only=True refused for both: {str(wa).splitlines()[0][:120]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
