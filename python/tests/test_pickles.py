"""Plain pickles of models (``conformance/fixtures/pickle``: ``pickle.dump`` of an estimator wrapper holding an
``nn.Module``, a numpy array and tensors under protocols 0 to 5, and of a module itself) through the package:
``ckpt.open`` detects format ``pickle`` and reads every tensor the manifest lists (what ``pickle.load`` gives)
with its bytes; ``torch`` is not needed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import ckpt
from conftest import FIXTURES

PICKLES = FIXTURES / "pickle"
CASES = sorted(PICKLES.glob("*.json"))


def test_every_protocol_is_covered() -> None:
    assert sorted(json.loads(p.read_text())["protocol"] for p in CASES if p.stem.startswith("wrapper")) == [
        0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("manifest", CASES, ids=lambda p: p.stem)
def test_every_manifest_tensor(manifest: Path) -> None:
    m = json.loads(manifest.read_text())
    ck = ckpt.open(PICKLES / m["file"])
    assert ck.format == "pickle"
    tensors = [e for e in ck.entries if e.kind == "tensor"]
    assert sorted(e.name for e in tensors) == sorted(m["tensors"])
    for name, t in m["tensors"].items():
        a = ck.tensor(name)
        assert (ckpt.dtype_name(a), list(a.shape)) == (t["dtype"], t["shape"]), name
        assert hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() == t["sha256"], name


def test_a_pickled_module_lists_its_state_dict() -> None:
    m = json.loads((PICKLES / "module_p4.json").read_text())
    assert ckpt.open(PICKLES / "module_p4.pkl").keys() == m["state_dict"]


def test_bytes_that_are_not_a_pickle_are_not_a_checkpoint(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pkl"
    junk.write_bytes(b"\x80\x07 not a pickle")
    with pytest.raises(ckpt.Error) as e:
        ckpt.open(junk)
    assert "junk.pkl" in str(e.value)
