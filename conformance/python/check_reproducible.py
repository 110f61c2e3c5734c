#!/usr/bin/env python3
"""Check that freshly generated fixtures equal the committed ones.

Usage::

    .venv/bin/python conformance/python/check_reproducible.py FIXTURE_DIR FRESH_DIR

FIXTURE_DIR is the committed directory (``conformance/fixtures/torch`` or ``conformance/bad``),
FRESH_DIR the output of running its generator again. Rules (``reproducible.py`` and
``conformance/fixtures/REPRODUCIBILITY.md``):

* both directories must hold the same file names;
* ``<case>.json`` manifests must be equal as JSON, except the ``python`` field (only warned
  about) and the sha256 of training-derived tensors, which must each be the digest of the tensor in
  their own directory's ``.pt``; for legacy-format cases
  (``save_kwargs._use_new_zipfile_serialization == false``) the storage keys are memory addresses, so
  they are compared after renaming each key to its order of first appearance;
* ``.pt`` files must be byte-identical, except the data of training-derived tensors (STAMP.json's
  ``training_derived``), compared within the tolerance, and the CRC-32s and serialization checksum
  computed from it, which must be right for their own file; legacy-format files are loaded with torch
  and compared structurally (values, dtypes, strides, sharing);
* ``STAMP.json`` must be equal except ``python``, ``numpy`` and ``torch_build`` (warned about) and the
  sha256 of files holding training-derived data, which must each be their own file's digest;
* every other file must be byte-identical;
* dotfiles (``.gitattributes``) are not compared.

Prints one line per difference naming the file (and, for ZIP files, the record that differs) and
exits with status 1 if there is any; 0 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reproducible  # noqa: E402

WARN_ONLY_MANIFEST = ("python",)
WARN_ONLY_STAMP = ("python", "numpy", "torch_build")


def canonical_keys(manifest: dict[str, Any]) -> dict[str, Any]:
    """Copy of a manifest with storage keys renamed ``#0``, ``#1``... by first appearance."""
    m = json.loads(json.dumps(manifest))
    names: dict[Any, str] = {}
    for t in m.get("tensors", []):
        k = t.get("storage_key")
        if k is not None:
            t["storage_key"] = names.setdefault(k, f"#{len(names)}")
    return m


def is_legacy(manifest: dict[str, Any]) -> bool:
    return manifest.get("save_kwargs", {}).get("_use_new_zipfile_serialization", True) is False


diff_json = reproducible.diff_json


def compare_legacy_pt(name: str, a: Path, b: Path, problems: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    import torchtree

    try:
        oa = torch.load(str(a), weights_only=True)
        ob = torch.load(str(b), weights_only=True)
        torchtree.Comparer().compare(oa, ob)
    except torchtree.Mismatch as e:
        problems.append(f"{name}: legacy file content differs: {e}")
    except Exception as e:  # noqa: BLE001 - reported as a difference
        problems.append(f"{name}: legacy file could not be compared: {type(e).__name__}: {e}")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    committed, fresh = Path(argv[1]), Path(argv[2])
    problems: list[str] = []
    warnings: list[str] = []

    def names(d: Path) -> set[str]:
        return {p.name for p in d.iterdir() if p.is_file() and not p.name.startswith(".")}

    ca, fa = names(committed), names(fresh)
    for n in sorted(ca - fa):
        problems.append(f"{n}: committed but not generated")
    for n in sorted(fa - ca):
        problems.append(f"{n}: generated but not committed")

    rules = reproducible.Rules(None)
    if "STAMP.json" in ca & fa:
        sa = json.loads((committed / "STAMP.json").read_text(encoding="utf-8"))
        sb = json.loads((fresh / "STAMP.json").read_text(encoding="utf-8"))
        rules = reproducible.stamp_rules(sa, sb, problems)

    manifests: dict[str, dict[str, Any]] = {}
    for n in sorted(ca & fa):
        if n.endswith(".json") and n not in ("STAMP.json", "EXPECTED.json"):
            try:
                manifests[n[: -len(".json")]] = json.loads((committed / n).read_text(encoding="utf-8"))
            except ValueError:
                pass

    digests: dict[Path, dict[str, str]] = {}

    def tensor_digest(pt: Path, tensor: str, key: str) -> str | None:
        """sha256 (or raw_sha256) of a tensor as torchtree renders it from ``pt`` loaded by torch."""
        if pt not in digests:
            try:
                loaded = reproducible.load_archive(pt.read_bytes())
                digests[pt] = {f"{t['path']}/{k}": t[k] for t in loaded.tensors for k in ("sha256", "raw_sha256") if k in t}
            except Exception:  # noqa: BLE001 - then no digest is accepted
                digests[pt] = {}
        return digests[pt].get(f"{tensor}/{key}")

    def manifest_leaf_ok(stem: str, ja: dict[str, Any]):
        rule = rules.for_file(f"{stem}.pt")

        def ok(path: str, x: Any, y: Any) -> str | None:
            parts = path.split(".")
            if len(parts) == 3 and parts[0] == "tensors" and parts[2] in ("sha256", "raw_sha256"):
                t = ja["tensors"][int(parts[1])]
                if t["dtype"] in reproducible.PRECISION and reproducible.matches(rule.tensors, t["path"]):
                    if x == y and (committed / f"{stem}.pt").read_bytes() == (fresh / f"{stem}.pt").read_bytes():
                        return None
                    for side, root, d in (("committed", committed, x), ("fresh", fresh, y)):
                        if tensor_digest(root / f"{stem}.pt", t["path"], parts[2]) != d:
                            return f"{parts[2]} of training-derived {t['path']} is not its digest in the {side} {stem}.pt"
                    return None
            return None if x == y else f"{json.dumps(x)[:120]} != {json.dumps(y)[:120]}"

        return ok

    for n in sorted(ca & fa):
        a, b = committed / n, fresh / n
        stem = n.rsplit(".", 1)[0]
        if n == "STAMP.json" or (n.endswith(".json") and stem in manifests):
            ja = json.loads(a.read_text(encoding="utf-8"))
            jb = json.loads(b.read_text(encoding="utf-8"))
            soft = WARN_ONLY_STAMP if n == "STAMP.json" else WARN_ONLY_MANIFEST
            for k in soft:
                if ja.get(k) != jb.get(k):
                    warnings.append(f"{n}: {k} {ja.get(k)!r} (committed) vs {jb.get(k)!r} (fresh)")
                ja.pop(k, None)
                jb.pop(k, None)
            if n == "STAMP.json":
                ja.pop("training_derived", None)  # compared by stamp_rules
                jb.pop("training_derived", None)

                def stamp_ok(path: str, x: Any, y: Any) -> str | None:
                    if path.startswith("files."):
                        return reproducible.digest_ok(rules, path[len("files."):], committed, fresh)(x, y)
                    return f"{json.dumps(x)[:120]} != {json.dumps(y)[:120]}"

                leaf_ok = stamp_ok

                def always(path: str) -> bool:
                    return path.startswith("files.")
            else:
                if is_legacy(ja):
                    ja, jb = canonical_keys(ja), canonical_keys(jb)
                leaf_ok = manifest_leaf_ok(stem, ja)

                def always(path: str) -> bool:
                    return path.startswith("tensors.") and path.endswith("sha256")
            out: list[str] = []
            diff_json(ja, jb, "", out, leaf_ok=leaf_ok, always=always)
            if out:
                problems.append(f"{n}: manifest differs: " + "; ".join(out))
        elif n.endswith(".pt") and stem in manifests and is_legacy(manifests[stem]):
            compare_legacy_pt(n, a, b, problems)
        else:
            reproducible.compare_file(n, a, b, rules.for_file(n), problems)

    for w in warnings:
        print(f"warning: {w}")
    for p in problems:
        print(f"DIFFERS: {p}")
    checked = len(ca & fa)
    if problems:
        print(f"{len(problems)} difference(s) between {committed} and {fresh} ({checked} files compared)")
        return 1
    print(f"reproducible: {checked} files in {committed} match {fresh}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
