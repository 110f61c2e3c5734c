"""Nothing dropped in silence (issue 41, point 2): a selection that selects nothing raises ``ckpt.UsageError``
naming the patterns and the nearest names (``ckpt.convert``, ``ckpt.load``, ``Checkpoint.load``); what a
target cannot hold is named in the summary's ``dropped``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ckpt
from conftest import FIXTURES

D215 = FIXTURES / "distcp" / "golden" / "d215"


def test_convert_of_a_selection_that_matches_nothing_raises_with_the_nearest_names(tmp_path: Path) -> None:
    dst = tmp_path / "nm.pt"
    with pytest.raises(ckpt.UsageError) as e:
        ckpt.convert(D215, dst, to="torch", include="nomatch*")
    assert '"nomatch*" matches no entry' in str(e.value) and "nearest names" in str(e.value)
    assert isinstance(e.value, ValueError)
    assert not dst.exists()
    # A typo beside a pattern that matches: refused, naming the typo.
    with pytest.raises(ckpt.UsageError, match='"rwo" matches no entry.*row'):
        ckpt.convert(D215, dst, to="torch", include=["row", "rwo"])
    # Excludes that remove everything the includes matched.
    with pytest.raises(ckpt.UsageError, match=r"exclude patterns remove every entry .* \(1\)"):
        ckpt.convert(D215, dst, to="safetensors", include="row", exclude="r*")


def test_load_of_a_selection_that_matches_nothing_raises() -> None:
    with pytest.raises(ckpt.UsageError, match='"nomatch\\*" matches no entry'):
        ckpt.load(D215, include="nomatch*")
    with ckpt.open(D215) as ck, pytest.raises(ckpt.UsageError, match="exclude patterns remove every entry"):
        ck.load(exclude=["*"])
    assert list(ckpt.load(D215, include="row")) == ["row"]


def test_the_summary_names_what_the_target_cannot_hold(tmp_path: Path) -> None:
    sd = {"model": {"w": np.arange(4, dtype=np.float32)}, "epoch": 3, "note": "warm"}
    pt = tmp_path / "train.pt"
    assert ckpt.save(sd, pt).dropped == []
    assert ckpt.convert(pt, tmp_path / "a.safetensors", to="safetensors").dropped == []
    s = ckpt.convert(pt, tmp_path / "a.gguf", to="gguf")
    assert s.dropped == ["epoch", "note"]
    assert (s.tensors, s.values) == (1, 0)
