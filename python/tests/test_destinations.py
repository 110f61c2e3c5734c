"""A destination is a checkpoint of the target format, or it is new (issue 41, point 1): ``ckpt.save``,
``ckpt.convert`` and ``ckpt.reshard`` refuse to write over anything else with ``ckpt.UsageError`` naming
what is there, and ``overwrite=True`` replaces it whole (nothing of the old content kept)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import ckpt

SD = {"model": {"w": np.arange(12, dtype=np.float32).reshape(6, 2)}, "step": 3}


def _files(path: Path) -> list[str]:
    return sorted(os.listdir(path))


@pytest.mark.parametrize("fmt", ["distcp", "hfai", "hf"])
def test_save_over_a_directory_of_other_files(tmp_path: Path, fmt: str) -> None:
    dst = tmp_path / "dir"
    dst.mkdir()
    (dst / "notes.txt").write_text("hi\n")
    with pytest.raises(ckpt.UsageError) as e:
        ckpt.save(SD, dst, format=fmt)
    msg = str(e.value)
    assert "a directory of 1 file that is not a checkpoint (notes.txt)" in msg, msg
    assert "overwrite=True" in msg and msg.count(str(dst)) == 1, msg
    assert _files(dst) == ["notes.txt"]
    ckpt.save(SD, dst, format=fmt, overwrite=True)
    fresh = tmp_path / "fresh"
    ckpt.save(SD, fresh, format=fmt)
    assert _files(dst) == _files(fresh)
    assert ckpt.open(dst).format == fmt


def test_save_over_a_text_file(tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    for fmt in ("torch", "distcp"):
        with pytest.raises(ckpt.UsageError, match="a text file \\(starts with"):
            ckpt.save(SD, precious, format=fmt)
        assert precious.read_text() == "keep me\n"
    ckpt.save(SD, precious, format="torch", overwrite=True)
    assert ckpt.open(precious).format == "torch"
    assert sorted(os.listdir(tmp_path)) == ["precious.txt"]


def test_resave_over_the_same_format_replaces_it(tmp_path: Path) -> None:
    dst = tmp_path / "dcp"
    ckpt.save(SD, dst, format="distcp", world_size=3)
    assert "__2_0.distcp" in _files(dst)
    ckpt.save(SD, dst, format="distcp")
    assert not any(n.startswith(("__1_", "__2_")) for n in _files(dst)), _files(dst)
    hfai = tmp_path / "hfai"
    ckpt.save(SD, hfai, format="hfai")
    with pytest.raises(ckpt.UsageError, match="an hfai checkpoint is there"):
        ckpt.convert(dst, hfai, to="distcp")
    ckpt.convert(dst, hfai, to="distcp", overwrite=True)
    assert not any(n.startswith("PART_") for n in _files(hfai)), _files(hfai)


def test_a_directory_path_for_a_file_format(tmp_path: Path) -> None:
    with pytest.raises(ckpt.UsageError) as e:
        ckpt.save(SD, f"{tmp_path}/newdir/")
    msg = str(e.value)
    assert "is one file" in msg and "model.pt" in msg and "Not a directory" not in msg, msg


def test_reshard_overwrite(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    ckpt.save(SD, src, format="distcp", world_size=2)
    dst.mkdir()
    (dst / "notes.txt").write_text("hi\n")
    with pytest.raises(ckpt.UsageError, match="notes.txt"):
        ckpt.reshard(src, dst, 3)
    assert ckpt.reshard(src, dst, 3, overwrite=True).world_size == 3
    assert "notes.txt" not in _files(dst)
