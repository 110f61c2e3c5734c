"""The real-file fixtures (``conformance/fixtures/real``: Python 2 legacy streams, omegaconf hyper-parameters
with parent links, TorchScript, DEFLATE records, tensors inside objects) through the package: every tensor
the manifest lists, with its bytes; ``ckpt.load`` of cyclic object graphs makes shared Python objects."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import ckpt
from conftest import FIXTURES

REAL = FIXTURES / "real"
CASES = sorted(p for p in REAL.glob("*.json") if p.name != "STAMP.json")


@pytest.mark.parametrize("manifest", CASES, ids=lambda p: p.stem)
def test_every_manifest_tensor(manifest: Path) -> None:
    m = json.loads(manifest.read_text())
    ck = ckpt.open(REAL / m["file"])
    for name, t in m["tensors"].items():
        a = ck.tensor(name)
        assert (ckpt.dtype_name(a), list(a.shape)) == (t["dtype"], t["shape"]), name
        assert hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() == t["sha256"], name
    ckpt.load(REAL / m["file"])  # the whole tree converts, cycles included


def test_cycles_become_shared_objects() -> None:
    sd = ckpt.load(REAL / "omegaconf.ckpt")
    seen: dict = {}

    def walk(v, depth=0):
        if depth > 200 or id(v) in seen:
            return
        seen[id(v)] = v
        if isinstance(v, dict):
            for x in v.values():
                walk(x, depth + 1)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x, depth + 1)
        elif isinstance(v, ckpt.Object):
            walk(v.args, depth + 1)
            walk(v.state, depth + 1)
            for k, x in v.dict_items:
                walk(x, depth + 1)

    walk(sd)
    objects = [v for v in seen.values() if isinstance(v, ckpt.Object)]
    assert objects, "the omegaconf nodes come back as ckpt.Object"
