#!/usr/bin/env python3
"""Time the Python reference ``hfai_ref.save`` / ``hfai_ref.load`` on a 1 GiB, 4-part checkpoint.

Usage::

    .venv/bin/python conformance/python/hfai/bench.py [--repeat R] [--fsync] [--mib M] [--save-only] [DIR]

The state is the one ``crates/hfai/benches/throughput.rs`` uses: a float32 parameter of 512 MiB
(``big``, 32768 x 4096: chunked, 128 MiB per part) and 32 float32 parameters of 16 MiB
(``layers.i``), 2^30 bytes in all. ``save`` runs as hfai runs it: 4 processes in a gloo group on
loopback (a file store for the rendezvous), each holding the whole model and writing its own part; its time is the slowest rank's,
from a barrier before the call to the end of ``save`` (which ends with hfai's barrier; with
``--fsync``, each rank then fsyncs its part and the directory, as ckpt-hfai's atomic commit does,
and the ranks meet at a barrier again). ``load`` is
``hfai_ref.load(DIR)`` (8 threads, as hfai's default) in one process, every tensor in memory.
DIR defaults to a new directory under the system temp dir (pass one under /dev/shm to time in
memory). Prints the median and best of R runs (default 5) and GB/s (10^9 bytes per second).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import hfai_ref  # noqa: E402

# --mib scales the state (rows of every tensor); workers get it through the environment
MIB = int(os.environ.get("CKPT_HFAI_BENCH_MIB", "1024"))
TOTAL = MIB << 20
SCALE_ROWS = MIB / 1024
WORLD = 4


def pattern(k: int, shape: tuple[int, int]) -> torch.Tensor:
    n = shape[0] * shape[1]
    return ((torch.arange(n, dtype=torch.int64) + k) % 251).to(torch.float32).view(*shape)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Parameter(pattern(0, (int(32768 * SCALE_ROWS), 4096)), requires_grad=False)
        self.layers = nn.ParameterList(
            [nn.Parameter(pattern(i + 1, (int(1024 * SCALE_ROWS), 4096)), requires_grad=False) for i in range(32)]
        )


def fsync_part(out: Path, rank: int) -> None:
    """What a durable commit adds to hfai's save (which does not fsync): fsync the part and the directory."""
    for path, flags in ((out / f"PART_{rank:03d}.pt", os.O_RDONLY), (out, os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(path, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def worker(rank: int, store: Path, out: Path, repeat: int, fsync: bool) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=600)
    )
    model = Model()
    times = []
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        hfai_ref.save(out, model, None, {"step": 1})
        if fsync:
            fsync_part(out, rank)
            dist.barrier()
        times.append(time.perf_counter() - t0)
    gathered: list[list[float]] = [[] for _ in range(WORLD)]
    dist.all_gather_object(gathered, times)
    if rank == 0:
        slowest = [max(ts[i] for ts in gathered) for i in range(repeat)]
        print("SAVE " + " ".join(f"{t:.6f}" for t in slowest), flush=True)
    dist.destroy_process_group()


def report(what: str, times: list[float]) -> None:
    med, best = statistics.median(times), min(times)
    print(
        f"python hfai_ref.{what} {MIB} MiB / 4 parts: median {med:.3f} s ({TOTAL / med / 1e9:.2f} GB/s), "
        f"best {best:.3f} s ({TOTAL / best / 1e9:.2f} GB/s), {len(times)} runs"
    )


def main() -> int:
    if len(sys.argv) == 7 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "fsync")
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", nargs="?", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--fsync", action="store_true", help="fsync each part and the directory inside the timed save")
    ap.add_argument("--mib", type=int, default=MIB, help="state size in MiB (default 1024; rows scale)")
    ap.add_argument("--save-only", action="store_true", help="time the save only")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir))
    out = root / "ckpt"
    try:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", CKPT_HFAI_BENCH_MIB=str(args.mib))
        procs = [
            subprocess.Popen(
                [
                    sys.executable, __file__, "--worker", str(r), str(root / "store"), str(out), str(args.repeat),
                    "fsync" if args.fsync else "no-fsync",
                ],
                env=env, stdout=subprocess.PIPE, text=True,
            )
            for r in range(WORLD)
        ]
        outputs = [p.communicate(timeout=3600)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"workers failed: {[p.returncode for p in procs]}")
        line = next(line for line in outputs[0].splitlines() if line.startswith("SAVE "))
        report("save" + (" + fsync" if args.fsync else ""), [float(x) for x in line.split()[1:]])
        times = []
        for _ in range(0 if args.save_only else args.repeat):
            t0 = time.perf_counter()
            state = hfai_ref.load(out)
            times.append(time.perf_counter() - t0)
            assert state["model"]["big"].shape == (int(32768 * SCALE_ROWS), 4096)
            del state
        if times:
            report("load", times)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
