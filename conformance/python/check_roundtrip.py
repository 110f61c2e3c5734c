#!/usr/bin/env python3
"""Check that files written by the Rust writer load in torch exactly like their originals.

Usage::

    check_roundtrip.py ORIGINAL.pt CANDIDATE.pt [--manifest M.json]
    check_roundtrip.py --pairs ORIG1 CAND1 ORIG2 CAND2 ...
    check_roundtrip.py --batch PAIRS.json

``PAIRS.json`` is a JSON list whose items are ``[original, candidate]`` or
``{"original": ..., "candidate": ..., "manifest": ... (optional)}``; relative paths are resolved
against the JSON file's directory. Checking many pairs in one process avoids paying torch's
start-up (~2 s) per file.

For each pair, ORIGINAL (a trusted fixture) is loaded with ``torch.load(weights_only=False)``.
CANDIDATE is loaded three ways:

1. ``torch.load(weights_only=True)``;
2. ``torch.load(weights_only=True, mmap=True)``;
3. as 2, with ``torch.utils.serialization.config.load.calculate_storage_offsets = True`` and
   ``TORCH_SERIALIZATION_DEBUG=1`` (torch then computes storage offsets from the layout rules and
   cross-checks them).

Each result is compared with the original: same container types (dict vs OrderedDict incl. its
``__dict__`` such as ``_metadata``, list vs tuple, torch.Size), same keys in the same order,
tensors bitwise equal (so NaNs compare equal) with the same dtype, shape, stride,
storage_offset, storage size, requires_grad, Parameter-ness and Python state, storage sharing
preserved in both directions, other values equal (NaN-aware, sign of zero kept). If ORIGINAL
itself cannot be loaded with ``weights_only=True``, CANDIDATE is loaded with
``weights_only=False`` instead and a note says so. If CANDIDATE is not a ZIP file the mmap modes
are skipped with a note. With ``--manifest``, CANDIDATE's typed tree and tensor records (see
``conformance/fixtures/torch/README.md``) must also equal the manifest's (storage keys compared
as a sharing partition).

A tensor object that appears twice in the original and as two distinct objects (sharing a
storage) in the candidate is reported as a warning; ``--strict-identity`` makes it an error.

Exit status: 0 when every pair matches, 1 on any mismatch or load failure (one ``FAIL`` line per
problem, naming the pair, the load mode and the path inside the object), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import torchtree  # noqa: E402

warnings.filterwarnings("ignore")


@dataclass
class Pair:
    original: Path
    candidate: Path
    manifest: Path | None = None


@contextlib.contextmanager
def offsets_debug() -> Iterator[None]:
    """calculate_storage_offsets=True + TORCH_SERIALIZATION_DEBUG=1 for the duration."""
    cfg = torch.utils.serialization.config.load
    old_flag = cfg.calculate_storage_offsets
    old_env = os.environ.get("TORCH_SERIALIZATION_DEBUG")
    cfg.calculate_storage_offsets = True
    os.environ["TORCH_SERIALIZATION_DEBUG"] = "1"
    try:
        yield
    finally:
        cfg.calculate_storage_offsets = old_flag
        if old_env is None:
            os.environ.pop("TORCH_SERIALIZATION_DEBUG", None)
        else:
            os.environ["TORCH_SERIALIZATION_DEBUG"] = old_env


def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.endswith("WeightsUnpickler error:") and i + 1 < len(lines):
            return f"{type(e).__name__}: WeightsUnpickler error: {lines[i + 1]}"
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def check_manifest(cand: Any, manifest: dict[str, Any]) -> list[str]:
    """Differences between the candidate's rendering and a fixture manifest."""
    problems = []
    tree, tensors, ids = torchtree.render(cand)
    if torchtree.normalize_sets(tree) != torchtree.normalize_sets(manifest["tree"]):
        problems.append("typed tree differs from the manifest's")
    want = {t["path"]: t for t in manifest["tensors"]}
    got = {t["path"]: t for t in tensors}
    if list(want) != list(got):
        problems.append(f"tensor paths differ from the manifest: {list(want)} vs {list(got)}")
    for p, w in want.items():
        g = got.get(p)
        if g is None:
            continue
        for k in sorted((set(w) | set(g)) - {"storage_key"}):
            if w.get(k) != g.get(k):
                problems.append(f"manifest tensor {p}: {k} {w.get(k)!r} (manifest) vs {g.get(k)!r} (candidate)")
    if torchtree.sharing_partition(manifest["tensors"]) != torchtree.partition_from_ids(ids):
        problems.append("storage sharing differs from the manifest's storage keys")
    return problems


def check_pair(pair: Pair, strict_identity: bool) -> tuple[list[str], list[str]]:
    """(failures, notes) for one original/candidate pair."""
    fails: list[str] = []
    notes: list[str] = []
    label = f"{pair.candidate} vs {pair.original}"
    try:
        orig = torch.load(str(pair.original), weights_only=False)
    except Exception as e:  # noqa: BLE001
        return [f"FAIL {label}: original does not load: {first_line(e)}"], notes
    weights_only = True
    try:
        torch.load(str(pair.original), weights_only=True)
    except Exception as e:  # noqa: BLE001
        weights_only = False
        notes.append(
            f"note {label}: original does not load with weights_only=True ({first_line(e)}); "
            "candidate loaded with weights_only=False"
        )
    modes: list[tuple[str, dict[str, Any], bool]] = [("weights_only", {}, False)]
    if is_zip(pair.candidate):
        modes += [("mmap", {"mmap": True}, False), ("mmap+calculate_storage_offsets+debug", {"mmap": True}, True)]
    else:
        notes.append(f"note {label}: candidate is not a ZIP file; mmap modes skipped")
    first_loaded = None
    for name, kw, debug in modes:
        mode = f"{name}{'' if weights_only else ' (weights_only=False)'}"
        try:
            with offsets_debug() if debug else contextlib.nullcontext():
                cand = torch.load(str(pair.candidate), weights_only=weights_only, **kw)
        except Exception as e:  # noqa: BLE001
            fails.append(f"FAIL {label} [{mode}]: candidate does not load: {first_line(e)}")
            continue
        cmp = torchtree.Comparer()
        try:
            cmp.compare(orig, cand)
        except torchtree.Mismatch as e:
            fails.append(f"FAIL {label} [{mode}]: {e}")
            continue
        except Exception as e:  # noqa: BLE001
            fails.append(f"FAIL {label} [{mode}]: comparison raised {first_line(e)}")
            continue
        for w in cmp.identity_warnings:
            (fails if strict_identity else notes).append(
                f"{'FAIL' if strict_identity else 'warning'} {label} [{mode}]: {w}"
            )
        if first_loaded is None:
            first_loaded = cand
    if pair.manifest is not None and first_loaded is not None:
        manifest = json.loads(pair.manifest.read_text(encoding="utf-8"))
        for p in check_manifest(first_loaded, manifest):
            fails.append(f"FAIL {label} [manifest {pair.manifest.name}]: {p}")
    if not fails:
        notes.append(f"OK {label}: {', '.join(m[0] for m in modes)}")
    return fails, notes


def parse_pairs(args: argparse.Namespace) -> list[Pair]:
    if args.batch:
        base = Path(args.batch).resolve().parent
        items = json.loads(Path(args.batch).read_text(encoding="utf-8"))
        out = []
        for it in items:
            if isinstance(it, dict):
                m = it.get("manifest")
                out.append(Pair(base / it["original"], base / it["candidate"], None if m is None else base / m))
            else:
                out.append(Pair(base / it[0], base / it[1]))
        return out
    if args.pairs:
        if len(args.pairs) % 2:
            raise SystemExit("--pairs needs an even number of paths (original candidate ...)")
        return [Pair(Path(a), Path(b)) for a, b in zip(args.pairs[::2], args.pairs[1::2])]
    if len(args.files) != 2:
        raise SystemExit("give ORIGINAL CANDIDATE, --pairs, or --batch")
    return [Pair(Path(args.files[0]), Path(args.files[1]), None if args.manifest is None else Path(args.manifest))]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="ORIGINAL CANDIDATE")
    ap.add_argument("--manifest", help="fixture manifest to check the candidate against as well")
    ap.add_argument("--pairs", nargs="+", metavar="PATH", help="ORIG1 CAND1 ORIG2 CAND2 ...")
    ap.add_argument("--batch", help="JSON file listing pairs")
    ap.add_argument("--strict-identity", action="store_true", help="object identity lost = error")
    try:
        args = ap.parse_args(argv[1:])
        pairs = parse_pairs(args)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        return 2
    failed = 0
    for pair in pairs:
        fails, notes = check_pair(pair, args.strict_identity)
        for n in notes:
            print(n)
        for f in fails:
            print(f)
        failed += bool(fails)
    print(f"{len(pairs) - failed}/{len(pairs)} pair(s) match")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
