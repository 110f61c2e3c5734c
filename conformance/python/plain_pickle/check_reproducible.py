#!/usr/bin/env python3
"""Compare a fresh regeneration of the plain-pickle fixtures with the committed ones.

Usage::

    .venv/bin/python conformance/python/plain_pickle/check_reproducible.py COMMITTED FRESH

The manifests must be equal byte for byte. The pickles differ only in the storage keys of the ``torch.save``
streams embedded by ``torch.storage._load_from_bytes`` (each ``str(storage._cdata)``, a memory address): every
opcode and argument of both pickles must be equal once each embedded stream's storage keys are replaced by
their order of appearance (the streams are compared opcode by opcode too, with their raw storage bytes).
"""

from __future__ import annotations

import io
import pickletools
import re
import sys
from pathlib import Path
from typing import Any

#: torch's legacy magic number, as the embedded streams start with it (protocol 2, LONG1)
LEGACY_HEAD = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"


def canonical_stream(b: bytes) -> list[Any]:
    """An embedded legacy ``torch.save`` stream: its five pickles' opcodes and arguments (storage keys by
    order of appearance), then the raw storage bytes that follow them."""
    keys: dict[str, str] = {}
    out: list[Any] = []
    f = io.BytesIO(b)
    for _ in range(5):
        for op, arg, _pos in pickletools.genops(f):
            if isinstance(arg, str) and re.fullmatch(r"\d{6,}", arg):
                arg = keys.setdefault(arg, f"key{len(keys)}")
            out.append((op.name, arg))
    out.append(("storages", f.read()))
    return out


def canonical(data: bytes) -> list[Any]:
    out: list[Any] = []
    for op, arg, _pos in pickletools.genops(data):
        if op.name in ("FRAME",):
            continue  # frame sizes follow the embedded streams' lengths
        raw = arg.encode("latin-1") if isinstance(arg, str) and arg.startswith("\x80\x02") else arg
        if isinstance(raw, bytes | bytearray) and bytes(raw).startswith(LEGACY_HEAD):
            out.append((op.name, canonical_stream(bytes(raw))))
        else:
            out.append((op.name, arg))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = Path(argv[1]), Path(argv[2])
    names_a = sorted(p.name for p in a.iterdir() if p.is_file() and p.name != "README.md")
    names_b = sorted(p.name for p in b.iterdir() if p.is_file() and p.name != "README.md")
    problems = []
    if names_a != names_b:
        problems.append(f"file names differ: {names_a} vs {names_b}")
    for n in sorted(set(names_a) & set(names_b)):
        da, db = (a / n).read_bytes(), (b / n).read_bytes()
        if n.endswith(".pkl"):
            if canonical(da) != canonical(db):
                problems.append(f"{n}: the pickles differ beyond their storage keys")
        elif da != db:
            problems.append(f"{n}: differs")
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"{len(names_a)} files reproduce ({a} = {b})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
