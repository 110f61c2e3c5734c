#!/usr/bin/env python3
"""Compare a fresh regeneration of the torch.package fixtures with the committed ones.

Usage::

    .venv/bin/python conformance/python/torch_package/check_reproducible.py COMMITTED FRESH

The manifests must be equal byte for byte, and each archive must hold the same records in the same order with
the same bytes, but for what depends on the process: the ``id()`` a ``('reduce_package', id, ...)`` persistent
id carries (compared as "some int"), ``.data/serialization_id``, which torch derives from it, and the
absolute paths of source files that TorchScript's debug records (``*.debug_pkl``) name, which depend on where
the repository and its ``.venv`` lie (compared from ``site-packages/`` or ``conformance/`` on).
"""

from __future__ import annotations

import pickletools
import sys
import zipfile
from pathlib import Path
from typing import Any


def _source_path(arg: Any) -> Any:
    """An absolute ``.py`` path as it reads from ``site-packages/`` or ``conformance/`` on."""
    if isinstance(arg, str) and arg.startswith("/") and arg.endswith(".py"):
        for root in ("site-packages/", "conformance/"):
            if root in arg:
                return "<...>/" + arg.split(root, 1)[1]
    return arg


def canonical_pickle(data: bytes) -> list[Any]:
    out: list[Any] = []
    after_reduce_package = False
    for op, arg, _pos in pickletools.genops(data):
        if op.name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
            out.append((op.name, arg))
            continue
        if after_reduce_package and isinstance(arg, int):
            arg = "<id>"
        after_reduce_package = arg == "reduce_package"
        out.append((op.name, _source_path(arg)))
    return out


def archive_problems(a: Path, b: Path) -> list[str]:
    za, zb = zipfile.ZipFile(a), zipfile.ZipFile(b)
    short = [n.split("/", 1)[1] for n in za.namelist()]
    if short != [n.split("/", 1)[1] for n in zb.namelist()]:
        return [f"{a.name}: the records differ: {za.namelist()} vs {zb.namelist()}"]
    problems = []
    for na, nb, s in zip(za.namelist(), zb.namelist(), short, strict=True):
        da, db = za.read(na), zb.read(nb)
        if s == ".data/serialization_id" or da == db:
            continue
        if s.endswith((".pkl", ".debug_pkl")) and canonical_pickle(da) == canonical_pickle(db):
            continue
        problems.append(f"{a.name}: record {s} differs")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = Path(argv[1]), Path(argv[2])
    names_a = sorted(p.name for p in a.iterdir() if p.is_file() and p.name != "README.md")
    names_b = sorted(p.name for p in b.iterdir() if p.is_file() and p.name != "README.md")
    problems = [] if names_a == names_b else [f"file names differ: {names_a} vs {names_b}"]
    for n in sorted(set(names_a) & set(names_b)):
        if n.endswith(".pt"):
            problems += archive_problems(a / n, b / n)
        elif (a / n).read_bytes() != (b / n).read_bytes():
            problems.append(f"{n}: differs")
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"{len(names_a)} files reproduce ({a} = {b})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
