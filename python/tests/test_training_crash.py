"""Ranks killed mid-save (``SIGKILL``) at every failpoint of ckpt's commit, over an existing checkpoint, in a
2-rank gloo job on 127.0.0.1 (``crash_job.py``, run in its own process: its workers are forked from it, and
ckpt's failpoint hook reads ``CKPT_FAILPOINT`` once per process, so the parent must never have written through
ckpt).

What it does (see ``crash_job.py``): a good save of ``A``; a clean save of ``B`` over it with
``CKPT_FAILPOINT_LOG`` per rank lists the failpoints the coordinator (rank 0: lock, staging, its data file,
``.metadata``, the checksum manifest, the swap, the removal of the old copy) and rank 1 (its data file) pass;
then for each rank and each hit of its log the save of ``B`` over ``A`` with that rank (only) killed there. After
every kill torch's own ``FileSystemReader`` loads the destination, equal to ``A`` or ``B`` exactly (never a
mix, never missing), and a good save then succeeds and leaves nothing beside the destination (no staging
directory, no lock file).

Coverage: every hit of every failpoint each rank passes (30 kills: 25 on the coordinator, 5 on rank 1; about
a second each). Not covered here: the three-rename swap for file systems without ``RENAME_EXCHANGE``
(``CKPT_COMMIT_NO_EXCHANGE=1``, ``dir.half_swapped``), where a kill between its renames leaves no destination
until the next save's recovery (``conformance/tests/crash.rs`` covers it).

No hang: the parent waits a bounded time for the surviving rank once one was killed and kills it if it has
not ended (the summary says whether any had to be: the test requires none); gloo's process group has a short
timeout too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the suite installs torch (scripts/setup.sh): present whenever it runs

JOB = Path(__file__).parent / "crash_job.py"

COORDINATOR_ONLY = {"lock.acquired", "dir.staging", "dir.staged", "dir.manifest", "dir.sync", "dir.exchange",
                    "dir.exchanged", "dir.parent_sync", "dir.remove_old", "dir.done"}


def test_a_rank_killed_at_any_failpoint_leaves_the_old_or_the_new_checkpoint(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(JOB), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-6000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    hits = {int(k): v for k, v in summary["hits"].items()}
    cases = summary["cases"]

    # The logs: the coordinator begins, writes, commits; rank 1 writes its own file only.
    assert set(hits[0]) >= COORDINATOR_ONLY, hits[0]
    assert not set(hits[1]) & COORDINATOR_ONLY, hits[1]
    assert {"file.create", "file.write", "file.sync", "file.synced"} <= set(hits[1]), hits[1]
    commit_point = hits[0].index("dir.exchanged") + 1  # the swap happened once this hit is reached

    for rank in (0, 1):
        done = [c for c in cases if c["rank"] == rank]
        assert {c["point"] for c in done} == set(hits[rank]), f"rank {rank}: a failpoint name never killed at"
        assert [c["hit"] for c in done] == list(range(1, len(hits[rank]) + 1)), f"rank {rank}: a hit missed"
        for c in done:
            # Before the swap the old checkpoint stays; from the swap on it is the new one.
            want = "B" if rank == 0 and c["hit"] >= commit_point else "A"
            assert c["holds"] == want, c
            # The survivor's dcp.save fails (its peer died before the verdict reached it): no rank reports a
            # save that was not confirmed.
            assert c["exit"][1 - rank] != 0, c
    # Nothing hung: every survivor ended on its own (its dcp.save raised once the peer's connection closed).
    assert not [c for c in cases if c["killed_by_parent"]], [c for c in cases if c["killed_by_parent"]]
    assert summary["seconds"] < 120, summary["seconds"]
