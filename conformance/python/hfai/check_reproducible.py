#!/usr/bin/env python3
"""Check that a fresh ``make_fixtures.py`` run equals the committed hfai fixtures.

Usage::

    .venv/bin/python conformance/python/hfai/check_reproducible.py FIXTURES FRESH

FIXTURES is ``conformance/fixtures/hfai``, FRESH the output of
``conformance/python/hfai/make_fixtures.py FRESH``. Both trees must hold the same files (at
any depth; dotfiles are ignored). ``STAMP.json`` must be equal except ``python``, ``numpy`` and
``torch_build`` (reported as warnings); every other file, every ``PART_XXX.pt`` and ``source.pt``
included, must be byte-identical. Prints one line per difference (for ZIP files, the record
that holds the first differing byte) and exits 1 if there is any, 0 otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

WARN_ONLY_STAMP = ("python", "numpy", "torch_build")


def shared_checker():
    """``conformance/python/check_reproducible.py`` (its byte comparison names the differing ZIP record)."""
    spec = importlib.util.spec_from_file_location(
        "shared_check_reproducible", Path(__file__).resolve().parent.parent / "check_reproducible.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    committed, fresh = Path(argv[1]), Path(argv[2])
    shared = shared_checker()
    problems: list[str] = []
    warnings: list[str] = []
    a_files, b_files = files(committed), files(fresh)
    problems += [f"{n}: committed but not generated" for n in sorted(a_files - b_files)]
    problems += [f"{n}: generated but not committed" for n in sorted(b_files - a_files)]
    for n in sorted(a_files & b_files):
        a, b = committed / n, fresh / n
        if n == "STAMP.json":
            ja, jb = json.loads(a.read_text("utf-8")), json.loads(b.read_text("utf-8"))
            for k in WARN_ONLY_STAMP:
                if ja.get(k) != jb.get(k):
                    warnings.append(f"{n}: {k} {ja.get(k)!r} (committed) vs {jb.get(k)!r} (fresh)")
                ja.pop(k, None)
                jb.pop(k, None)
            for k in sorted(set(ja) | set(jb)):
                if ja.get(k) != jb.get(k):
                    problems.append(f"{n}: {k} differs: {json.dumps(ja.get(k))[:200]} != {json.dumps(jb.get(k))[:200]}")
            continue
        shared.compare_bytes(n, a, b, problems)
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
