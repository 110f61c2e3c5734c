"""torch.package archives (``conformance/fixtures/package``, written by ``PackageExporter``) through the
package: ``ckpt.open`` detects format ``package`` and reads every tensor the manifest lists (what
``PackageImporter`` loads, by ``<resource path>.<name>``) with its bytes; the details name the interned,
extern and mocked modules; nothing of the package's code is imported."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import ckpt
from conftest import FIXTURES

PACKAGES = FIXTURES / "package"
CASES = sorted(PACKAGES.glob("*.json"))


@pytest.mark.parametrize("manifest", CASES, ids=lambda p: p.stem)
def test_every_manifest_tensor(manifest: Path) -> None:
    m = json.loads(manifest.read_text())
    ck = ckpt.open(PACKAGES / m["file"])
    assert ck.format == "package"
    assert sorted(e.name for e in ck.entries if e.kind == "tensor") == sorted(m["tensors"])
    for name, t in m["tensors"].items():
        a = ck.tensor(name)
        assert (ckpt.dtype_name(a), list(a.shape)) == (t["dtype"], t["shape"]), name
        assert hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() == t["sha256"], name


def test_the_code_is_listed_not_imported() -> None:
    details = ckpt.open(PACKAGES / "model.pt").details
    text = " ".join(details.values())
    assert "package_classes" in text and "tqdm" in text and "numpy" in text
    assert "package_classes" not in sys.modules
