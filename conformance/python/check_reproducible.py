#!/usr/bin/env python3
"""Check that freshly generated fixtures equal the committed ones.

Usage::

    .venv/bin/python conformance/python/check_reproducible.py FIXTURE_DIR FRESH_DIR

FIXTURE_DIR is the committed directory (``conformance/fixtures/torch`` or ``conformance/bad``),
FRESH_DIR the output of running its generator again. Rules:

* both directories must hold the same file names;
* ``<case>.json`` manifests must be equal as JSON, except the ``python`` field (only warned
  about); for legacy-format cases (``save_kwargs._use_new_zipfile_serialization == false``) the
  storage keys are memory addresses, so they are compared after renaming each key to its order
  of first appearance;
* ``.pt`` files must be byte-identical, except legacy-format ones, which are loaded with torch
  and compared structurally (values, dtypes, strides, sharing);
* ``STAMP.json`` must be equal except ``python``, ``numpy`` and ``torch_build`` (warned about);
* every other file must be byte-identical;
* dotfiles (``.gitattributes``) are not compared.

Prints one line per difference naming the file (and, for ZIP files, the record that differs) and
exits with status 1 if there is any; 0 otherwise.
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any

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


def diff_json(a: Any, b: Any, where: str, out: list[str], limit: int = 8) -> None:
    """Append up to ``limit`` human-readable differences between two JSON values."""
    if len(out) >= limit:
        return
    if type(a) is not type(b):
        out.append(f"{where}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}")
    elif isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'committed' if k in a else 'fresh'}")
            else:
                diff_json(a[k], b[k], f"{where}.{k}", out, limit)
    elif isinstance(a, list):
        if len(a) != len(b):
            out.append(f"{where}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            label = x.get("path") if isinstance(x, dict) and "path" in x else i
            diff_json(x, y, f"{where}[{label}]", out, limit)
    elif a != b:
        out.append(f"{where}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}")


def zip_record_at(path: Path, offset: int) -> str:
    """Name of the ZIP record (local header + data + descriptor) that covers ``offset``."""
    try:
        with zipfile.ZipFile(path) as z:
            marks = sorted((i.header_offset, f"record {i.filename!r}") for i in z.infolist())
            marks.append((z.start_dir, "central directory / end records"))
    except (zipfile.BadZipFile, OSError):
        return "a file that is not a readable ZIP"
    where = "bytes before the first record"
    for start, label in marks:
        if offset >= start:
            where = label
    return where


def compare_bytes(name: str, a: Path, b: Path, problems: list[str]) -> None:
    x, y = a.read_bytes(), b.read_bytes()
    if x == y:
        return
    n = min(len(x), len(y))
    first = next((i for i in range(n) if x[i] != y[i]), n)
    where = zip_record_at(a, first) if x[:4] == b"PK\x03\x04" else "raw bytes"
    problems.append(
        f"{name}: bytes differ (sizes {len(x)} vs {len(y)}, first difference at offset {first}, in {where})"
    )


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

    manifests: dict[str, dict[str, Any]] = {}
    for n in sorted(ca & fa):
        if n.endswith(".json") and n not in ("STAMP.json", "EXPECTED.json"):
            try:
                manifests[n[: -len(".json")]] = json.loads((committed / n).read_text(encoding="utf-8"))
            except ValueError:
                pass

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
            if n != "STAMP.json" and is_legacy(ja):
                ja, jb = canonical_keys(ja), canonical_keys(jb)
            if ja != jb:
                out: list[str] = []
                diff_json(ja, jb, "", out)
                problems.append(f"{n}: manifest differs: " + "; ".join(out))
        elif n.endswith(".pt") and stem in manifests and is_legacy(manifests[stem]):
            compare_legacy_pt(n, a, b, problems)
        else:
            compare_bytes(n, a, b, problems)

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
