#!/usr/bin/env python3
"""Check that freshly generated PBG fixtures equal the committed ones.

Usage (from the repository root)::

    .venv/bin/python conformance/python/pbg/make_fixtures.py /tmp/pbg-fresh
    .venv/bin/python conformance/python/pbg/check_reproducible.py conformance/fixtures/pbg /tmp/pbg-fresh

Rules: both trees hold the same paths; regular files are byte-identical (HDF5 files, the optimizer
blobs inside them, the TSV exports, the manifest); symbolic links have the same target text;
``STAMP.json`` is equal except ``python``, ``numpy``, ``h5py`` and ``hdf5`` (warned about);
``README.md`` is not compared. Training is bit-reproducible under the generator's pinned
environment, seeds and shims, so nothing is compared structurally only.

Prints one line per difference and exits with status 1 if there is any.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

WARN_ONLY_STAMP = ("python", "numpy", "h5py", "hdf5")


def tree(root: Path) -> dict[str, tuple[str, bytes | str]]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel == "README.md" or "__pycache__" in rel:
            continue
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", p.read_bytes())
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    committed, fresh = tree(Path(sys.argv[1])), tree(Path(sys.argv[2]))
    problems = []
    for rel in sorted(set(committed) | set(fresh)):
        if rel not in committed or rel not in fresh:
            problems.append(f"{rel}: only in {'committed' if rel in committed else 'fresh'}")
            continue
        (ka, a), (kb, b) = committed[rel], fresh[rel]
        if rel == "STAMP.json":
            sa, sb = json.loads(a), json.loads(b)
            for k in sorted(set(sa) | set(sb)):
                if sa.get(k) != sb.get(k):
                    msg = f"STAMP.json: {k}: {sa.get(k)!r} != {sb.get(k)!r}"
                    if k in WARN_ONLY_STAMP:
                        print(f"warning: {msg}")
                    else:
                        problems.append(msg)
        elif ka != kb:
            problems.append(f"{rel}: {ka} != {kb}")
        elif a != b:
            where = ""
            if ka == "file":
                first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                where = f" (sizes {len(a)} / {len(b)}, first difference at byte {first})"
            problems.append(f"{rel}: differs{where}")
    for p in problems:
        print(p)
    if not problems:
        print(f"reproducible: {len(committed)} paths equal")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
