#!/usr/bin/env python3
"""Check that a fresh ``make_fixtures.py`` run equals the committed hfai fixtures.

Usage::

    .venv/bin/python conformance/python/hfai/check_reproducible.py FIXTURES FRESH

FIXTURES is ``conformance/fixtures/hfai``, FRESH the output of
``conformance/python/hfai/make_fixtures.py FRESH``. Both trees must hold the same files (at
any depth; dotfiles are ignored). ``STAMP.json`` must be equal except ``python``, ``numpy`` and
``torch_build`` (reported as warnings). Every other file must be byte-identical, except what
STAMP.json's ``training_derived`` lists as coming out of training (the DDP model's trained parameters
and BatchNorm statistics, the optimizer states, the loss in ``others``), compared within the tolerance of
``reproducible.py`` (``conformance/fixtures/REPRODUCIBILITY.md``): in ``PART_XXX.pt`` and ``source.pt``
their tensor data and the loss in the pickle, with the CRC-32s and serialization checksums computed from
them right for their own file; in ``expected.json`` the loss and the sha256 of those tensors, each the
digest of what ``hfai_ref.load`` returns for its own tree; in STAMP.json the sha256 of those files.
Prints one line per difference (for ZIP files, the record that holds the first differing byte) and exits
1 if there is any, 0 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import reproducible  # noqa: E402

WARN_ONLY_STAMP = ("python", "numpy", "torch_build")


def files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def loaded_digests(ckpt: Path) -> dict[str, str]:
    """sha256 of every tensor ``hfai_ref.load`` returns for a checkpoint directory, by path."""
    import hfai_ref
    import torchtree

    _, tensors, _ = torchtree.render(hfai_ref.load(ckpt))
    return {t["path"]: t["sha256"] for t in tensors}


def compare_expected(n: str, a: Path, b: Path, rule: reproducible.Rule, problems: list[str]) -> None:
    """expected.json: equal, except the loss (tolerance) and the digests of training-derived tensors, which
    must be the digests of what hfai_ref.load returns for the ckpt/ beside each file."""
    ja, jb = json.loads(a.read_text("utf-8")), json.loads(b.read_text("utf-8"))
    reproducible.compare_trees(n, ja.pop("tree", None), jb.pop("tree", None), rule.values, problems)
    digests: dict[Path, dict[str, str]] = {}

    def ok(path: str, x: Any, y: Any) -> str | None:
        parts = path.split(".")
        if len(parts) == 3 and parts[0] == "tensors" and parts[2] == "sha256":
            t = ja["tensors"][int(parts[1])]
            if t["dtype"] in reproducible.PRECISION and reproducible.matches(rule.tensors, t["path"]):
                if x == y and same_ckpt:
                    return None
                for side, f, d in (("committed", a, x), ("fresh", b, y)):
                    ckpt = f.parent / "ckpt"
                    if ckpt not in digests:
                        digests[ckpt] = loaded_digests(ckpt)
                    if digests[ckpt].get(t["path"]) != d:
                        return f"sha256 of training-derived {t['path']} is not its digest in the {side} checkpoint"
                return None
        return None if x == y else f"{json.dumps(x)[:120]} != {json.dumps(y)[:120]}"

    parts_a, parts_b = sorted((a.parent / "ckpt").glob("*")), sorted((b.parent / "ckpt").glob("*"))
    same_ckpt = [p.name for p in parts_a] == [p.name for p in parts_b] and all(
        p.read_bytes() == q.read_bytes() for p, q in zip(parts_a, parts_b)
    )
    out: list[str] = []
    reproducible.diff_json(ja, jb, "", out, leaf_ok=ok, always=lambda p: p.startswith("tensors.") and p.endswith(".sha256"))
    if out:
        problems.append(f"{n}: " + "; ".join(out))


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
        rule = rules.for_file(n)
        if n.endswith("expected.json") and rule is not reproducible.NOTHING:
            compare_expected(n, a, b, rule, problems)
            continue
        reproducible.compare_file(n, a, b, rule, problems)
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
