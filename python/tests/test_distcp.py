"""DCP through ckpt: ``dcp.load`` with ``ckpt.dcp.Reader`` equals ``dcp.load`` with torch's own reader, for
every DCP fixture with a ``.metadata`` (torch 2.0 to 2.15, 1 to 3 ranks), into the checkpoint's own layout
and resharded across gloo processes; ``ckpt.load`` of a DCP checkpoint equals torch's ``dcp_to_torch_save``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

import ckpt
import ckpt.dcp
from conftest import FIXTURES, same

ALL = sorted(p.parent for p in (FIXTURES / "distcp").rglob(".metadata"))


def _torch_reads(case: Path) -> bool:
    """Whether torch 2.13's own reader reads the case (the golden cases of later torch releases carry metadata
    fields 2.13 cannot unpickle; ckpt reads them: test_newer_torch_cases_through_ckpt)."""
    try:
        dcp.FileSystemReader(case).read_metadata()
        return True
    except Exception:  # noqa: BLE001
        return False


CASES = [c for c in ALL if _torch_reads(c)]
NEWER = [c for c in ALL if c not in CASES]


def full_state_dict(reader) -> dict:
    """What torch's own ``dcp_to_torch_save`` loads: every entry, nested by ``planner_data``."""
    sd: dict = {}
    _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return sd


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_dcp_load_through_ckpt_equals_torch_reader(case: Path) -> None:
    same(full_state_dict(ckpt.dcp.Reader(case)), full_state_dict(dcp.FileSystemReader(case)), case.name)


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_dcp_load_into_given_tensors(case: Path) -> None:
    """``dcp.load`` into preallocated tensors (what a training job does), both readers."""
    md = dcp.FileSystemReader(case).read_metadata()
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    def empty():
        return {k: torch.zeros(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
                if isinstance(v, TensorStorageMetadata)}

    ours, theirs = empty(), empty()
    dcp.load(ours, storage_reader=ckpt.dcp.Reader(case), no_dist=True)
    dcp.load(theirs, storage_reader=dcp.FileSystemReader(case), no_dist=True)
    same(ours, theirs, case.name)


@pytest.mark.parametrize("case", [c for c in CASES if c.parent.name == "torch213"], ids=lambda p: p.name)
def test_ckpt_load_equals_dcp_to_torch_save(case: Path, tmp: Path) -> None:
    dcp_to_torch_save(case, tmp / "t.pt")
    theirs = torch.load(tmp / "t.pt", weights_only=False)
    same(ckpt.load(case, framework="pt"), theirs, case.name)


@pytest.mark.parametrize("case,world", [("m3", 2), ("m2", 3), ("m3", 1)])
def test_resharded_load_across_ranks(case: str, world: int) -> None:
    path = FIXTURES / "distcp" / "torch213" / case
    out = subprocess.run([sys.executable, str(Path(__file__).parent / "dcp_ranks.py"), str(path), case, str(world)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_reader_reads_other_formats_into_a_dcp_load(tmp: Path) -> None:
    """An hfai checkpoint loaded with ``dcp.load`` through ckpt (each tensor one chunk)."""
    src = FIXTURES / "hfai" / "single_n3" / "ckpt"
    ck = ckpt.open(src)
    names = [e.name for e in ck.entries if e.kind == "tensor"][:5]
    sd = {n: torch.zeros(ck.entry(n).shape, dtype=getattr(torch, ck.entry(n).dtype)) for n in names}
    dcp.load(sd, storage_reader=ckpt.dcp.Reader(src), no_dist=True)
    for n in names:
        assert torch.equal(sd[n], ck.tensor(n, framework="pt")), n


@pytest.mark.parametrize("case", NEWER, ids=lambda p: p.name)
def test_newer_torch_cases_through_ckpt(case: Path) -> None:
    """Checkpoints of torch releases after 2.13 load through ckpt.dcp.Reader in torch 2.13, equal to ckpt.load."""
    same(full_state_dict(ckpt.dcp.Reader(case)), ckpt.load(case, framework="pt"), case.name)


def test_cases_found() -> None:
    assert len(CASES) >= 8 and any(c.name == "m3" for c in CASES) and NEWER


def test_validate_checkpoint_id() -> None:
    assert ckpt.dcp.Reader.validate_checkpoint_id(CASES[0])
    assert not ckpt.dcp.Reader.validate_checkpoint_id("/nonexistent")


def test_load_into_another_dtype_casts_as_torch_does() -> None:
    case = FIXTURES / "distcp" / "torch213" / "m3"
    ours = {"row": torch.zeros(7, 4, dtype=torch.float64), "layer": {"w": torch.zeros(6, 2, dtype=torch.bfloat16)}}
    theirs = {"row": torch.zeros(7, 4, dtype=torch.float64), "layer": {"w": torch.zeros(6, 2, dtype=torch.bfloat16)}}
    dcp.load(ours, storage_reader=ckpt.dcp.Reader(case), no_dist=True)
    dcp.load(theirs, storage_reader=dcp.FileSystemReader(case), no_dist=True)
    same(ours, theirs, "m3")
    assert ours["row"].abs().sum() > 0


def test_dcp_save_through_ckpt_writer(tmp: Path) -> None:
    """``dcp.save`` with ``ckpt.dcp.Writer``: torch's own reader loads what it wrote, equal to the state dict."""
    g = torch.Generator().manual_seed(0)
    sd = {"model": {"w": torch.randn(5, 3, generator=g), "b": torch.zeros(3, dtype=torch.bfloat16)},
          "layers": [torch.ones(2), torch.arange(4)], "step": 9, "cfg": {"lr": 0.1, "name": "x"}}
    dcp.save(sd, storage_writer=ckpt.dcp.Writer(tmp / "out"), no_dist=True)
    theirs = full_state_dict(dcp.FileSystemReader(tmp / "out"))
    same(theirs, sd, "written")
    back = {"model": {"w": torch.zeros(5, 3), "b": torch.ones(3, dtype=torch.bfloat16)},
            "layers": [torch.zeros(2), torch.zeros(4, dtype=torch.int64)], "step": 0, "cfg": {"lr": 0.0, "name": ""}}
    dcp.load(back, storage_reader=dcp.FileSystemReader(tmp / "out"), no_dist=True)
    same(back, sd, "loaded")
    assert ckpt.verify(tmp / "out", deep=True).ok
