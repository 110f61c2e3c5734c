"""``ckpt.dcp.Writer`` inside training jobs: ``dcp.save`` and ``dcp.async_save`` from several gloo ranks on
127.0.0.1 (``training_job.py``), with FSDP2 shards, a ``ShardedTensor``, replicated and 2-D-mesh DTensors,
plain tensors and object items. What it writes is compared with what torch's own ``FileSystemWriter`` wrote
from the same job, loaded by torch's ``FileSystemReader`` into a job of another world size, and checked with
``ckpt verify --deep``; a rank that fails or dies leaves the previous checkpoint whole.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # the suite installs torch (scripts/setup.sh): present whenever it runs
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner  # noqa: E402
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # noqa: E402

import ckpt  # noqa: E402
import ckpt.dcp  # noqa: E402

JOB = Path(__file__).parent / "training_job.py"
_spec = importlib.util.spec_from_file_location("training_job", JOB)
assert _spec is not None and _spec.loader is not None
job_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(job_module)


def job(scenario: str, out: Path, world: int, expect_ok: bool = True) -> str:
    r = subprocess.run([sys.executable, str(JOB), scenario, str(out), str(world)], capture_output=True, text=True,
                       timeout=300)
    if expect_ok:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    else:
        assert r.returncode != 0, r.stdout[-3000:]
    return r.stdout + r.stderr


def whole(path: Path) -> dict:
    """Every entry of a DCP checkpoint, loaded by torch's own reader in one process."""
    sd: dict = {}
    _load_state_dict(sd, storage_reader=dcp.FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return sd


def test_a_sharded_job_saves_what_torch_saves_and_torch_loads_it_into_another_world_size(tmp_path: Path) -> None:
    job("save", tmp_path, 4)
    ours, theirs = whole(tmp_path / "ckpt"), whole(tmp_path / "torch")
    job_module.compare(ours, theirs, "state")
    assert "mesh2d" in ours["extra"] and "sharded_tensor" in ours["extra"]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    report = ckpt.verify(tmp_path / "ckpt", deep=True)
    assert report.ok, report
    # ckpt reads it back equal too, and torch loads it into 3 ranks (resharded), equal to torch's own.
    loaded = ckpt.load(tmp_path / "ckpt", framework="pt")
    assert torch.equal(loaded["extra"]["plain"], theirs["extra"]["plain"])
    job("load", tmp_path, 3)


@pytest.mark.parametrize("kind", ["async_thread", "async_process"])
def test_async_save_with_both_of_torchs_checkpointers(tmp_path: Path, kind: str) -> None:
    # The thread-based save from 3 ranks is then loaded by 2 (the 4-rank save above is loaded by 3).
    world = 3 if kind == "async_thread" else 2
    job(kind, tmp_path, world)
    job_module.compare(whole(tmp_path / "ckpt"), whole(tmp_path / "torch"), kind)
    assert ckpt.verify(tmp_path / "ckpt", deep=True).ok
    if world == 3:
        job("load", tmp_path, 2)


def test_a_failing_rank_fails_the_save_everywhere_and_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    # The job checks on every rank: use_collectives=False is refused; dcp.save raised (rank 1's error), the previous checkpoint loads as it was,
    # and the next save succeeds with no staging directory left.
    job("fail", tmp_path, 2)
    assert not list(tmp_path.glob(".ckpt.ckpt-staging*"))


def test_a_killed_rank_leaves_the_previous_checkpoint_and_the_next_save_cleans_up(tmp_path: Path) -> None:
    job("kill", tmp_path, 2, expect_ok=False)
    assert (tmp_path / ".ckpt.ckpt-staging").is_dir(), "the killed save's staging directory"
    job_module.compare(whole(tmp_path / "ckpt"), whole(tmp_path / "previous"), "previous")
    job("save", tmp_path, 2)
    assert not (tmp_path / ".ckpt.ckpt-staging").exists()
    job_module.compare(whole(tmp_path / "ckpt"), whole(tmp_path / "torch"), "after")


def test_a_destination_that_is_not_a_checkpoint_directory_is_refused_and_left_alone(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as e:  # how dcp.save reports every rank's error
        dcp.save({"w": torch.ones(3)}, storage_writer=ckpt.dcp.Writer(notes), no_dist=True)
    cause = e.value.failures[0][0]  # torch's (exception, traceback) of rank 0
    assert isinstance(cause, ckpt.UsageError) and str(notes) in str(cause), repr(cause)
    assert notes.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"], "nothing staged or committed"


def test_overwrite_replaces_what_is_not_a_checkpoint_whole(tmp_path: Path) -> None:
    # One process: a text file, then a directory of other files (an hfai checkpoint's names), replaced whole.
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    dcp.save({"w": torch.ones(3)}, storage_writer=ckpt.dcp.Writer(notes, overwrite=True), no_dist=True)
    assert notes.is_dir() and torch.equal(whole(notes)["w"], torch.ones(3))
    other = tmp_path / "other"
    other.mkdir()
    for name in ("PART_000.pt", "README.md"):
        (other / name).write_text("not ours")
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as e:
        dcp.save({"w": torch.ones(3)}, storage_writer=ckpt.dcp.Writer(other), no_dist=True)
    cause = e.value.failures[0][0]
    assert isinstance(cause, ckpt.UsageError) and "overwrite=True" in str(cause), repr(cause)
    assert sorted(p.name for p in other.iterdir()) == ["PART_000.pt", "README.md"]
    dcp.save({"w": torch.full((2,), 5.0)}, storage_writer=ckpt.dcp.Writer(other, overwrite=True), no_dist=True)
    assert sorted(p.name for p in other.iterdir()) == [".metadata", "__0_0.distcp", "ckpt.checksums.json"]
    assert torch.equal(whole(other)["w"], torch.full((2,), 5.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "other"], "no staging path left"


def test_overwrite_from_a_sharded_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every rank writes where the coordinator staged the replacement; the old directory's files are gone.
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "notes.txt").write_text("not a checkpoint")
    monkeypatch.setenv("CKPT_TRAINING_OVERWRITE", "1")
    job("save", tmp_path, 2)
    ours, theirs = whole(tmp_path / "ckpt"), whole(tmp_path / "torch")
    job_module.compare(ours, theirs, "state")
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "ckpt.checksums.json"], names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "torch"], "no staging path left"


def test_a_torch_without_distributed_checkpoint_gets_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import ckpt.dcp as module

    monkeypatch.setattr(module, "_classes", {})
    monkeypatch.setitem(sys.modules, "torch.distributed.checkpoint", None)
    for name in ("Writer", "Reader"):
        with pytest.raises(ckpt.UsageError, match="needs torch with torch.distributed.checkpoint"):
            getattr(module, name)
