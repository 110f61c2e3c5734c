#!/usr/bin/env python3
"""Check that freshly generated DCP fixtures equal the committed ones.

Usage::

    .venv/bin/python conformance/python/distcp/check_reproducible.py COMMITTED FRESH

COMMITTED is ``conformance/fixtures/distcp/torch213``, FRESH the output of
``make_fixtures.py FRESH``. Rules (``reproducible.py``, ``conformance/fixtures/REPRODUCIBILITY.md``):

* both trees hold the same files (dotfiles such as ``.metadata`` included);
* every file is byte-identical, except those STAMP.json lists under ``not_byte_reproducible``:
  a ``.metadata`` pickle is then unpickled with torch and compared as objects (dict equality, so
  the order of ``storage_data`` does not matter), a ``.safetensors`` file by its parsed header and
  its data bytes; and except, in data files STAMP.json's ``training_derived`` names, the items of
  training-derived tensors (Adam's model and state in ``s_optim``), compared within the tolerance;
* ``<case>.json`` manifests and ``STAMP.json`` are compared as JSON, except STAMP's ``python``
  and ``torch_build`` fields (warned about) and the sha256 of training-derived tensors and of the files
  holding them, which must each be the digest of their own tree's data.

Prints one line per difference and exits 1 if there is any, else 0.
"""

from __future__ import annotations

import json
import pickle
import struct
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import reproducible  # noqa: E402

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
    fresh_stamp = json.loads((fresh / "STAMP.json").read_text()) if (fresh / "STAMP.json").exists() else {}
    rules = reproducible.stamp_rules(stamp, fresh_stamp, problems)
    loose = set(stamp.get("not_byte_reproducible", {}))

    def digest_of(tree: Path, case: str, key: str) -> str | None:
        import torchtree

        for data in sorted((tree / case).glob("*.distcp")):
            if reproducible.matches(rules.for_file(f"{case}/{data.name}").items, key):
                t = reproducible.dcp_item_tensor(data, key)
                if t is not None:
                    return torchtree.tensor_sha256(t)
        return None

    def json_ok(name: str, ja: dict[str, Any]):
        case = name[: -len(".json")]

        def ok(path: str, x: Any, y: Any) -> str | None:
            parts = path.split(".")
            if name == "STAMP.json" and parts[0] == "files" and len(parts) >= 3:
                return reproducible.digest_ok(rules, f"{parts[1]}/{'.'.join(parts[2:])}", committed, fresh)(x, y)
            if name != "STAMP.json" and parts[0] == "files" and len(parts) >= 2:
                return reproducible.digest_ok(rules, f"{case}/{'.'.join(parts[1:])}", committed, fresh)(x, y)
            if name != "STAMP.json" and len(parts) == 3 and parts[0] == "entries" and parts[2] == "sha256":
                key = ja["entries"][int(parts[1])]["key"]
                trained = any(
                    reproducible.matches(rules.for_file(f"{case}/{p.name}").items, key)
                    for p in (committed / case).glob("*.distcp")
                )
                same = all(p.read_bytes() == (fresh / case / p.name).read_bytes() for p in (committed / case).glob("*.distcp"))
                if x == y and (same or not trained):
                    return None
                if not trained:
                    return f"{json.dumps(x)[:120]} != {json.dumps(y)[:120]}"
                for side, tree, d in (("committed", committed, x), ("fresh", fresh, y)):
                    if digest_of(tree, case, key) != d:
                        return f"sha256 of {key} is not the digest of a training-derived item in the {side} {case}/"
                return None
            return None if x == y else f"{json.dumps(x)[:120]} != {json.dumps(y)[:120]}"

        return ok

    for name in sorted(a & b):
        pa, pb = committed / name, fresh / name
        if name.endswith(".json"):
            ja, jb = json.loads(pa.read_text()), json.loads(pb.read_text())
            if name == "STAMP.json":
                for k in (*WARN_ONLY_STAMP, "training_derived"):
                    if k in WARN_ONLY_STAMP and ja.get(k) != jb.get(k):
                        print(f"warning: STAMP.json {k}: {ja.get(k)!r} != {jb.get(k)!r}", file=sys.stderr)
                    ja.pop(k, None)
                    jb.pop(k, None)
            out: list[str] = []
            reproducible.diff_json(
                ja, jb, "", out, leaf_ok=json_ok(name, ja),
                always=lambda p: p.startswith("files.") or (p.startswith("entries.") and p.endswith(".sha256")),
            )
            if out:
                problems.append(f"{name}: JSON differs: " + "; ".join(out))
            continue
        if pa.read_bytes() == pb.read_bytes():
            continue
        if name in loose and name.endswith(".metadata") and same_metadata(pa, pb):
            continue
        if name in loose and name.endswith(".safetensors") and safetensors_parts(pa) == safetensors_parts(pb):
            continue
        rule = rules.for_file(name)
        if rule.items:
            reproducible.compare_dcp_file(name, pa, pb, rule, problems)
            continue
        problems.append(f"{name}: bytes differ")
    for p in problems:
        print(p)
    print(f"{len(a & b)} files compared, {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
