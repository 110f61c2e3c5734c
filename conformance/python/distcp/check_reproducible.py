#!/usr/bin/env python3
"""Check that freshly generated DCP fixtures equal the committed ones.

Usage::

    .venv/bin/python conformance/python/distcp/check_reproducible.py COMMITTED FRESH

COMMITTED is ``conformance/fixtures/distcp/torch213``, FRESH the output of
``make_fixtures.py FRESH``. Rules:

* both trees hold the same files (dotfiles such as ``.metadata`` included);
* every file is byte-identical, except those STAMP.json lists under ``not_byte_reproducible``:
  a ``.metadata`` pickle is then unpickled with torch and compared as objects (dict equality, so
  the order of ``storage_data`` does not matter), a ``.safetensors`` file by its parsed header and
  its data bytes;
* ``<case>.json`` manifests and ``STAMP.json`` are compared as JSON, except STAMP's ``python``
  and ``torch_build`` fields (warned about).

Prints one line per difference and exits 1 if there is any, else 0.
"""

from __future__ import annotations

import json
import pickle
import struct
import sys
from pathlib import Path
from typing import Any

WARN_ONLY_STAMP = ("python", "torch_build")


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def same_metadata(a: Path, b: Path) -> bool:
    import torch  # noqa: F401  (the pickle names torch classes)

    ma = pickle.loads(a.read_bytes())
    mb = pickle.loads(b.read_bytes())
    return vars(ma) == vars(mb)


def safetensors_parts(p: Path) -> tuple[Any, bytes]:
    data = p.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    committed, fresh = Path(argv[1]), Path(argv[2])
    problems: list[str] = []
    a, b = files(committed), files(fresh)
    for name in sorted(a - b):
        problems.append(f"{name}: missing from the fresh run")
    for name in sorted(b - a):
        problems.append(f"{name}: not committed")
    stamp = json.loads((committed / "STAMP.json").read_text()) if (committed / "STAMP.json").exists() else {}
    loose = set(stamp.get("not_byte_reproducible", {}))
    for name in sorted(a & b):
        pa, pb = committed / name, fresh / name
        if name.endswith(".json"):
            ja, jb = json.loads(pa.read_text()), json.loads(pb.read_text())
            if name == "STAMP.json":
                for k in WARN_ONLY_STAMP:
                    if ja.get(k) != jb.get(k):
                        print(f"warning: STAMP.json {k}: {ja.get(k)!r} != {jb.get(k)!r}", file=sys.stderr)
                    ja.pop(k, None)
                    jb.pop(k, None)
            if ja != jb:
                problems.append(f"{name}: JSON differs")
            continue
        if pa.read_bytes() == pb.read_bytes():
            continue
        if name in loose and name.endswith(".metadata") and same_metadata(pa, pb):
            continue
        if name in loose and name.endswith(".safetensors") and safetensors_parts(pa) == safetensors_parts(pb):
            continue
        problems.append(f"{name}: bytes differ")
    for p in problems:
        print(p)
    print(f"{len(a & b)} files compared, {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
