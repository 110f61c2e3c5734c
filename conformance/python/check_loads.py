#!/usr/bin/env python3
"""Check that files load in torch (weights_only=True, and mmap=True) and print what they hold.

Usage::

    check_loads.py [--no-mmap] FILE...

Each FILE is loaded with ``torch.load(weights_only=True)`` and with
``torch.load(weights_only=True, mmap=True)`` (skipped with ``--no-mmap``); the two results must
be structurally identical. Prints on stdout one JSON document (UTF-8, sorted keys)::

    {"files": [{"file": "x.pt", "ok": true,
                "weights_only": {"ok": true, "error": null},
                "mmap": {"ok": true, "error": null},
                "tree": <typed tree>, "tensors": [<tensor records>]}, ...]}

``tree`` and ``tensors`` use the fixture manifest format (``conformance/fixtures/torch/README.md``);
``storage_key`` is read from the file's persistent ids while torch loads it. Set items are listed
in the loaded set's iteration order, which can differ from the order in the pickle (the order the
fixture manifests use): compare sets as unordered. Both are null when
the weights_only load failed. Exit status 0 when every file loads both ways, 1 otherwise.
Only safe (weights_only) loads are performed, so it may be run on untrusted candidates.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import torchtree  # noqa: E402

warnings.filterwarnings("ignore")


def error_text(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.endswith("WeightsUnpickler error:") and i + 1 < len(lines):
            return f"{type(e).__name__}: WeightsUnpickler error: {lines[i + 1]}"
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def check_file(path: Path, mmap: bool) -> dict[str, Any]:
    res: dict[str, Any] = {
        "file": str(path),
        "ok": False,
        "weights_only": {"ok": False, "error": None},
        "mmap": {"ok": False, "error": None} if mmap else None,
        "tree": None,
        "tensors": None,
    }
    obj = None
    try:
        obj, keys = torchtree.load_with_keys(path, weights_only=True)
        tree, tensors, ids = torchtree.render(obj)
        res["tree"] = tree
        res["tensors"] = torchtree.attach_keys(tensors, ids, keys)
        res["weights_only"]["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported
        res["weights_only"]["error"] = error_text(e)
    if mmap:
        try:
            mobj = torch.load(str(path), weights_only=True, mmap=True)
            if obj is not None:
                torchtree.Comparer().compare(obj, mobj)
            res["mmap"]["ok"] = True
        except torchtree.Mismatch as e:
            res["mmap"]["error"] = f"mmap load differs from the plain load: {e}"
        except Exception as e:  # noqa: BLE001
            res["mmap"]["error"] = error_text(e)
    res["ok"] = res["weights_only"]["ok"] and (not mmap or res["mmap"]["ok"])
    return res


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--no-mmap", action="store_true", help="skip the mmap=True load")
    args = ap.parse_args(argv[1:])
    sys.stdout.reconfigure(encoding="utf-8")  # type: ignore[union-attr]
    results = [check_file(Path(f), not args.no_mmap) for f in args.files]
    json.dump({"files": results}, sys.stdout, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False)
    sys.stdout.write("\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
