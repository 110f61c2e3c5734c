#!/usr/bin/env python3
"""Check that freshly generated PBG fixtures equal the committed ones.

Usage (from the repository root)::

    .venv/bin/python conformance/python/pbg/make_fixtures.py /tmp/pbg-fresh
    .venv/bin/python conformance/python/pbg/check_reproducible.py conformance/fixtures/pbg /tmp/pbg-fresh

Rules (``reproducible.py``, ``conformance/fixtures/REPRODUCIBILITY.md``): both trees hold the same paths;
symbolic links have the same target text; ``STAMP.json`` is equal except ``python``, ``numpy``, ``h5py``
and ``hdf5`` (warned about); ``README.md`` is not compared. Every other file is byte-identical, except
what STAMP.json's ``training_derived`` lists as coming out of training math: the float datasets and the
optimizer blobs' sums of the checkpoint's HDF5 files, the losses and ranking counts of
``training_stats.json`` and the numbers of the TSV exports, compared within the tolerance; in
``MANIFEST.json`` the sha256 of those files, datasets and blob tensors may differ when each is the digest
of its own tree's data.

Prints one line per difference and exits with status 1 if there is any.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import reproducible  # noqa: E402

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


def dataset_digests(path: Path) -> dict[str, str]:
    """sha256 of every dataset's bytes, and of every tensor in opaque (torch.save blob) datasets."""
    import h5py
    import torch

    import torchtree

    out: dict[str, str] = {}
    with h5py.File(path, "r") as hf:

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                data = obj[...].tobytes()
                out[name] = reproducible.sha256(data)
                if obj.dtype.kind == "V":
                    try:
                        _, tensors, _ = torchtree.render(torch.load(io.BytesIO(data)))
                    except Exception:  # noqa: BLE001 - bad fixtures hold undecodable blobs on purpose
                        return
                    for t in tensors:
                        out[f"{name}//{t['path']}"] = t["sha256"]

        hf.visititems(visit)
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    root_a, root_b = Path(sys.argv[1]), Path(sys.argv[2])
    committed, fresh = tree(root_a), tree(root_b)
    problems: list[str] = []
    rules = reproducible.Rules(None)
    if "STAMP.json" in committed and "STAMP.json" in fresh:
        rules = reproducible.stamp_rules(json.loads(committed["STAMP.json"][1]), json.loads(fresh["STAMP.json"][1]), problems)
    digests: dict[Path, dict[str, str]] = {}

    def digest(path: Path, key: str) -> str | None:
        if path not in digests:
            digests[path] = dataset_digests(path)
        return digests[path].get(key)

    def manifest_ok(path: str, x: Any, y: Any) -> str | None:
        """Digests of training-derived data may differ when each is right for its own tree."""
        differs = None if x == y else f"{json.dumps(x)[:120]} != {json.dumps(y)[:120]}"
        inner = path[len("files.") :] if path.startswith("files.") else ""
        rel = inner.split(".hdf5.", 1)[0] if ".hdf5." in inner else inner.rsplit(".", 1)[0]
        if x == y and rel and (root_a / rel).is_file() and (root_a / rel).read_bytes() == (root_b / rel).read_bytes():
            return None
        if path.startswith("files.") and path.endswith(".size"):
            # the length of a text file that writes training values as decimals depends on them
            rel = path[len("files.") : -len(".size")]
            rule = rules.for_file(rel)
            if not (rule.fields or rule.counts or rule.numbers):
                return differs
            for side, root, n in (("committed", root_a, x), ("fresh", root_b, y)):
                if (root / rel).stat().st_size != n:
                    return f"the {side} size of {rel} is not the size of the {side} file"
            return None
        if not path.startswith("files.") or not path.endswith(".sha256"):
            return differs
        inner = path[len("files.") : -len(".sha256")]
        if ".hdf5.datasets." not in inner:
            return reproducible.digest_ok(rules, inner, root_a, root_b)(x, y)
        rel, rest = inner.split(".hdf5.datasets.", 1)
        rule = rules.for_file(rel)
        entry = json.loads(committed["MANIFEST.json"][1])["files"][rel]["hdf5"]["datasets"][int(rest.split(".")[0])]
        if ".decoded.tensors." in rest:
            t = entry["decoded"]["tensors"][int(rest.split(".decoded.tensors.")[1])]
            trained = t["dtype"] in reproducible.PRECISION and reproducible.matches(rule.blob_tensors, t["path"])
            key = f"{entry['path']}//{t['path']}"
        else:
            # a float dataset of training values, or an optimizer blob (compared as an archive) holding some
            trained = (entry["dtype"] in ("<f4", "<f8", "<f2") and reproducible.matches(rule.datasets, entry["path"])) or (
                entry["dtype"].startswith("V") and bool(rule.blob_tensors)
            )
            key = entry["path"]
        if not trained:
            return None if differs is None else differs + " (not training-derived)"
        for side, root, d in (("committed", root_a, x), ("fresh", root_b, y)):
            if digest(root / rel, key) != d:
                return f"the {side} digest of {rel}:{key} is not the digest of the {side} data"
        return None

    for rel in sorted(set(committed) | set(fresh)):
        if rel not in committed or rel not in fresh:
            problems.append(f"{rel}: only in {'committed' if rel in committed else 'fresh'}")
            continue
        (ka, a), (kb, b) = committed[rel], fresh[rel]
        if rel == "STAMP.json":
            sa, sb = json.loads(a), json.loads(b)
            for k in sorted((set(sa) | set(sb)) - {"training_derived"}):
                if sa.get(k) != sb.get(k):
                    msg = f"STAMP.json: {k}: {sa.get(k)!r} != {sb.get(k)!r}"
                    if k in WARN_ONLY_STAMP:
                        print(f"warning: {msg}")
                    else:
                        problems.append(msg)
        elif ka != kb:
            problems.append(f"{rel}: {ka} != {kb}")
        elif ka == "link":
            if a != b:
                problems.append(f"{rel}: link to {a!r} != {b!r}")
        elif rel == "MANIFEST.json":
            if True:  # digests are checked against the data even where both manifests agree
                out: list[str] = []
                reproducible.diff_json(
                    json.loads(a), json.loads(b), "", out, leaf_ok=manifest_ok,
                    always=lambda p: p.startswith("files.") and p.endswith((".sha256", ".size")),
                )
                if out:
                    problems.append("MANIFEST.json: " + "; ".join(out))
        else:
            reproducible.compare_file(rel, root_a / rel, root_b / rel, rules.for_file(rel), problems)
    for p in problems:
        print(p)
    if not problems:
        print(f"reproducible: {len(committed)} paths equal")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
