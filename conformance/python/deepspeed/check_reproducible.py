#!/usr/bin/env python3
"""Check that a fresh ``make_fixtures.py`` run equals the committed DeepSpeed fixtures.

Usage::

    .venv/bin/python conformance/python/deepspeed/check_reproducible.py FIXTURES FRESH

FIXTURES is ``conformance/fixtures/deepspeed``, FRESH the output of
``conformance/python/deepspeed/make_fixtures.py FRESH``. Both trees must hold the same files. ``STAMP.json``
must be equal except ``python`` and ``torch_build`` (warnings) and the digests of files holding training
values, which must be each side's own file's. Every other file must be byte-identical, except what
STAMP.json's ``training_derived`` lists (the tensors of the ``.pt`` files, the items of the ``.distcp``
files), compared within the tolerance of ``reproducible.py``, with the CRC-32s and serialization checksums
computed from them right for their own file (``conformance/fixtures/REPRODUCIBILITY.md``). The Megatron
fixtures' checker is this one. Prints one line per difference and exits 1 if there is any.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import reproducible  # noqa: E402

WARN_ONLY_STAMP = ("python", "torch_build")


def files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") and part != ".metadata" for part in p.relative_to(root).parts)
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    committed, fresh = Path(argv[1]), Path(argv[2])
    problems: list[str] = []
    warnings: list[str] = []
    a_files, b_files = files(committed), files(fresh)
    problems += [f"{n}: committed but not generated" for n in sorted(a_files - b_files)]
    problems += [f"{n}: generated but not committed" for n in sorted(b_files - a_files)]
    rules = reproducible.Rules(None)
    if "STAMP.json" in a_files & b_files:
        rules = reproducible.stamp_rules(
            json.loads((committed / "STAMP.json").read_text("utf-8")), json.loads((fresh / "STAMP.json").read_text("utf-8")), problems
        )
    for n in sorted(a_files & b_files):
        a, b = committed / n, fresh / n
        if n == "STAMP.json":
            ja, jb = json.loads(a.read_text("utf-8")), json.loads(b.read_text("utf-8"))
            for k in (*WARN_ONLY_STAMP, "training_derived"):
                if k in WARN_ONLY_STAMP and ja.get(k) != jb.get(k):
                    warnings.append(f"{n}: {k} {ja.get(k)!r} (committed) vs {jb.get(k)!r} (fresh)")
                ja.pop(k, None)
                jb.pop(k, None)

            def stamp_ok(path: str, x: Any, y: Any) -> str | None:
                if path.startswith("files."):
                    return reproducible.digest_ok(rules, path[len("files.") :], committed, fresh)(x, y)
                return f"{json.dumps(x)[:200]} != {json.dumps(y)[:200]}"

            out: list[str] = []
            reproducible.diff_json(ja, jb, "", out, leaf_ok=stamp_ok, always=lambda p: p.startswith("files."))
            problems += [f"{n}: {d}" for d in out]
            continue
        reproducible.compare_file(n, a, b, rules.for_file(n), problems)
    for w in warnings:
        print(f"warning: {w}")
    for p in problems:
        print(f"DIFFERS: {p}")
    if problems:
        print(f"{len(problems)} difference(s) between {committed} and {fresh}")
        return 1
    print(f"reproducible: {len(a_files)} files in {committed} match {fresh}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
