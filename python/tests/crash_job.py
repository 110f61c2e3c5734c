"""Ranks killed mid-save at every failpoint: the crash matrix of ``ckpt.dcp.Writer`` in a 2-rank gloo job.

    python crash_job.py OUT

Each save is a job of 2 ranks (``torch.multiprocessing``, ``fork``, gloo on 127.0.0.1), saving the same small
state dict with ``dcp.save(..., storage_writer=ckpt.dcp.Writer(OUT/run/ckpt))``: a ``Shard(0)`` DTensor, a
plain tensor every rank holds, an int and a ``BytesIO``, their values given by the version (``A`` = 1,
``B`` = 2).

1. A good save of ``A``; then a clean save of ``B`` over it with ``CKPT_FAILPOINT_LOG`` on each rank: the
   failpoints each rank passes, in order (rank 0, the coordinator, also locks, stages and commits); then
   ``A`` again.
2. For each rank and each hit ``N`` of its log (every one): the save of ``B`` over ``A`` with
   ``CKPT_FAILPOINT=N`` and ``CKPT_FAILPOINT_ACTION=kill`` in that rank's environment only (set in the
   forked worker before ckpt's first failpoint hit: the hook reads it once per process), so that rank
   ``SIGKILL``s itself there. Then torch's own ``FileSystemReader`` loads the destination, which must equal
   ``A`` or ``B`` exactly; then a good save of ``A`` must succeed and leave nothing beside the destination
   (no staging directory, no lock file).

No hang: the process group's timeout is short (``PG_TIMEOUT``), and the parent waits ``SURVIVOR_WAIT``
seconds for the surviving rank once one died; the summary records whether it ended on its own (gloo sees
the dead peer's connection close and the survivor's ``dcp.save`` raises) or had to be killed by the parent.
A survivor still alive then is ``SIGKILL``ed: the job always ends.

This process never writes through ckpt itself (it only reads, with torch): the workers are forked from it,
and ckpt's failpoint hook must not have read its environment before the fork.

Writes ``OUT/summary.json``: the logs and, per case, the rank, hit, failpoint name, what the destination held
after the kill (``A`` or ``B``) and how the job ended. torch's modules are imported here once (``torch._dynamo``
included, which a DTensor's first op imports: 3 s a rank otherwise), so a save job takes well under a second.
"""

from __future__ import annotations

import io
import json
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # no thread pool in the parent the workers are forked from

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401 - a DTensor's first op imports it (3 s): once here, not in every rank
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner  # noqa: E402
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # noqa: E402

from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Shard, distribute_tensor  # noqa: E402

import ckpt.dcp  # noqa: E402

ckpt.dcp.Writer  # noqa: B018 - made (torch's checkpoint modules imported) once here, not in every forked rank

WORLD = 2
PG_TIMEOUT = 20  # seconds: torch's own limit on a collective (the parent's wait below is shorter)
SURVIVOR_WAIT = 15.0  # seconds the parent waits for the other rank once one was killed
JOB_TIMEOUT = 60.0  # seconds for a whole save job
VERSIONS = {"A": 1, "B": 2}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def full_state(version: int) -> dict:
    """The whole (unsharded) state of a version, as torch loads it back in one process."""
    return {
        "w": torch.arange(32, dtype=torch.float32).view(8, 4) * version,
        "plain": torch.arange(5, dtype=torch.int64) + 100 * version,
        "step": version,
        "blob": io.BytesIO(b"version %d" % version),
    }


def rank_main(rank: int, world: int, port: int, dest: str, version: int, env: dict) -> None:
    """One rank of a save job: its environment (failpoint settings), the process group, ``dcp.save``."""
    os.environ.update(env.get(rank, {}))  # before ckpt's first failpoint hit in this process
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=PG_TIMEOUT))
    try:
        full = full_state(version)
        mesh = init_device_mesh("cpu", (world,))
        sd = dict(full, w=distribute_tensor(full["w"], mesh, [Shard(0)]))
        dcp.save(sd, storage_writer=ckpt.dcp.Writer(dest))
    finally:
        dist.destroy_process_group()


def save_job(dest: Path, version: str, env: dict | None = None) -> dict:
    """Runs one save job; returns each rank's exit code, whether a survivor had to be killed, the time."""
    t0 = time.monotonic()
    ctx = mp.start_processes(rank_main, args=(WORLD, free_port(), str(dest), VERSIONS[version], env or {}),
                             nprocs=WORLD, join=False, start_method="fork")
    procs = ctx.processes
    killed_by_parent = []
    first_death = None
    while any(p.exitcode is None for p in procs):
        alive = [p.sentinel for p in procs if p.exitcode is None]
        multiprocessing.connection.wait(alive, timeout=0.2)
        now = time.monotonic()
        if first_death is None and any(p.exitcode not in (None, 0) for p in procs):
            first_death = now
        limit = (first_death + SURVIVOR_WAIT) if first_death is not None else (t0 + JOB_TIMEOUT)
        if now > limit:
            for i, p in enumerate(procs):
                if p.exitcode is None:
                    os.kill(p.pid, signal.SIGKILL)
                    killed_by_parent.append(i)
            for p in procs:
                p.join()
    for p in procs:
        p.join()
    return {"exit": [p.exitcode for p in procs], "killed_by_parent": killed_by_parent,
            "seconds": round(time.monotonic() - t0, 2)}


def held(dest: Path) -> str:
    """Which version the destination holds, loaded whole by torch's own ``FileSystemReader``."""
    sd: dict = {}
    _load_state_dict(sd, storage_reader=dcp.FileSystemReader(dest), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    for name, version in VERSIONS.items():
        want = full_state(version)
        if sorted(sd) == sorted(want) and torch.equal(sd["w"], want["w"]) \
                and torch.equal(sd["plain"], want["plain"]) and sd["step"] == want["step"] \
                and sd["blob"].getvalue() == want["blob"].getvalue():
            return name
    raise AssertionError(f"{dest} holds neither A nor B: {sd}")


def clean_save(run: Path, dest: Path, version: str) -> dict:
    """A good save that must succeed, be loadable, and leave nothing but the destination in ``run``."""
    job = save_job(dest, version)
    assert job["exit"] == [0] * WORLD and not job["killed_by_parent"], f"a good save of {version} failed: {job}"
    assert held(dest) == version
    left = sorted(p.name for p in run.iterdir())
    assert left == [dest.name], f"left beside the destination after a good save: {left}"
    return job


def main() -> int:
    out = Path(sys.argv[1])
    t0 = time.monotonic()
    run = out / "run"
    run.mkdir(parents=True, exist_ok=True)
    dest = run / "ckpt"
    logs_dir = out / "logs"
    logs_dir.mkdir(exist_ok=True)

    clean_save(run, dest, "A")
    logs = {r: logs_dir / f"rank{r}.log" for r in range(WORLD)}
    clean = save_job(dest, "B", {r: {"CKPT_FAILPOINT_LOG": str(logs[r])} for r in range(WORLD)})
    assert clean["exit"] == [0] * WORLD, f"the logged save failed: {clean}"
    assert held(dest) == "B"
    hits = {r: logs[r].read_text().split() for r in range(WORLD)}
    clean_save(run, dest, "A")

    cases = []
    for rank in range(WORLD):
        for n in range(1, len(hits[rank]) + 1):
            env = {rank: {"CKPT_FAILPOINT": str(n), "CKPT_FAILPOINT_ACTION": "kill"}}
            job = save_job(dest, "B", env)
            assert job["exit"][rank] == -signal.SIGKILL, f"rank {rank} was not killed at hit {n}: {job}"
            outcome = held(dest)
            clean_save(run, dest, "A")  # cleans up what the killed save left; back to A for the next case
            cases.append({"rank": rank, "hit": n, "point": hits[rank][n - 1], "holds": outcome, **job})
            print(f"rank {rank} killed at hit {n} ({hits[rank][n - 1]}): {outcome}, job {job}", flush=True)
    summary = {"hits": {str(r): hits[r] for r in range(WORLD)}, "cases": cases,
               "seconds": round(time.monotonic() - t0, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    shutil.rmtree(run, ignore_errors=True)
    print(f"{len(cases)} kills in {summary['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
