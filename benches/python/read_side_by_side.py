#!/usr/bin/env python3
"""Interleaved read-path comparisons of ckpt against the Python originals, on files that already exist.

Usage::

    .venv/bin/python benches/python/read_side_by_side.py [--reps 5] WORKLOAD=PATH ...

Workloads (each names the file or directory it runs on):

* ``pt-list=FILE.pt``: open a ``torch.save`` file and list every entry's name, dtype and shape.
  Reference: ``torch.load(mmap=True, weights_only=True)`` and the same listing. ckpt: ``TorchFile::open`` +
  ``entries()`` (library call, timed inside the ``ckpt-read-timer`` process).
* ``pt-read=FILE.pt``: open and read every tensor byte. Reference: ``torch.load(weights_only=True)`` (which
  copies every byte into fresh tensors). ckpt: open + a checksum over every byte of every tensor.
* ``dcp-open=DIR``: open a DCP checkpoint. Reference: ``FileSystemReader(DIR).read_metadata()`` inside this
  process. ckpt: ``ckpt inspect --json DIR`` as a whole process (start, decode, validate, print), with its peak
  RSS from ``wait4``.
* ``dcp-read=DIR``: read every tensor byte. Reference: ``dcp.load`` into preallocated tensors
  (``no_dist=True``). ckpt: ``DcpReader`` + ``read_tensor`` of every key + checksum.
* ``hfai-read=DIR``: the hfai reference ``load`` (``conformance/python/hfai/hfai_ref.py``) vs ``HfaiReader``
  + checksum of every tensor (a tensor chunked over parts read from its parts a piece at a time).
* ``pbg-read=FILE.h5``: h5py reading the ``embeddings`` dataset whole vs ckpt-pbg's partition read + checksum.

Each workload runs its two sides alternately (A B A B ...) ``--reps`` times after one warm-up each, and prints
the median seconds, the min-max spread, and the ratio of the medians (reference / ckpt, so > 1 means ckpt is
faster). Build first: ``cargo build --release -p ckpt --features full,cli`` and
``cargo build --release -p ckpt-benches --bin ckpt-read-timer``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMER = ROOT / "target" / "release" / "ckpt-read-timer"
TOOL = ROOT / "target" / "release" / "ckpt"


class Timer:
    """The ckpt-read-timer process, kept alive so that ckpt's side runs warm like Python's."""

    def __init__(self) -> None:
        self.p = subprocess.Popen([TIMER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def run(self, op: str, path: Path) -> float:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(f"{op} {path}\n")
        line = self.p.stdout.readline().split()
        if not line or line[0] == "error":
            raise SystemExit(f"ckpt-read-timer failed: {' '.join(line)}")
        return float(line[1])

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        self.p.wait()


def whole_process(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of a command. The RSS comes from ``/usr/bin/time`` (the ``wait4``
    figure of a child forked from this large Python process would count the parent's pages)."""
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    secs = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{cmd} failed: {p.stderr}")
    return secs, int(p.stderr.strip().splitlines()[-1])


def reference(kind: str, path: Path):
    """The Python original's side of a workload, as a callable returning seconds."""
    import torch

    if kind == "pt-list":

        def run() -> float:
            t = time.perf_counter()
            sd = torch.load(path, mmap=True, weights_only=True)
            listing = [(k, v.dtype, tuple(v.shape)) for k, v in sd.items()]
            assert listing
            return time.perf_counter() - t

        return run
    if kind == "pt-read":

        def run() -> float:
            t = time.perf_counter()
            sd = torch.load(path, weights_only=True)
            assert sd
            return time.perf_counter() - t

        return run
    if kind == "dcp-open":
        from torch.distributed.checkpoint import FileSystemReader

        def run() -> float:
            t = time.perf_counter()
            FileSystemReader(path).read_metadata()
            return time.perf_counter() - t

        return run
    if kind == "dcp-read":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        md = FileSystemReader(path).read_metadata()
        sd = {}
        for k, v in md.state_dict_metadata.items():
            if isinstance(v, TensorStorageMetadata):
                sd[k] = torch.empty(v.size, dtype=v.properties.dtype)
                sd[k].fill_(0)  # pre-fault

        def run() -> float:
            t = time.perf_counter()
            dcp.load(sd, storage_reader=FileSystemReader(path), no_dist=True)
            return time.perf_counter() - t

        return run
    if kind == "hfai-read":
        sys.path.insert(0, str(ROOT / "conformance" / "python" / "hfai"))
        import hfai_ref

        def run() -> float:
            t = time.perf_counter()
            state = hfai_ref.load(str(path))
            assert state is not None
            return time.perf_counter() - t

        return run
    if kind == "pbg-read":
        import h5py

        def run() -> float:
            t = time.perf_counter()
            with h5py.File(path, "r") as f:
                data = f["embeddings"][...]
            assert data.size
            return time.perf_counter() - t

        return run
    raise SystemExit(f"unknown workload {kind}")


def summary(xs: list[float]) -> str:
    return f"{statistics.median(xs):9.4f} s  ({min(xs):.4f}-{max(xs):.4f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("workloads", nargs="+", metavar="WORKLOAD=PATH")
    args = ap.parse_args()
    timer = Timer()
    print(f"{'workload':10s} {'reference (median, min-max)':>34s} {'ckpt (median, min-max)':>34s} {'ratio':>7s}  extra")
    for w in args.workloads:
        kind, _, p = w.partition("=")
        path = Path(p)
        ref = reference(kind, path)
        if kind == "dcp-open":
            cmd = [str(TOOL), "inspect", "--json", str(path)]
            mine = lambda: whole_process(cmd)  # noqa: E731
        else:
            mine = lambda: (timer.run(kind, path), 0)  # noqa: E731
        ref()
        mine()
        a, b, rss = [], [], []
        for _ in range(args.reps):
            a.append(ref())
            secs, kib = mine()
            b.append(secs)
            rss.append(kib)
        extra = f"ckpt peak RSS {max(rss) / 1024:.0f} MiB" if max(rss) else ""
        ratio = statistics.median(a) / statistics.median(b)
        print(f"{kind:10s} {summary(a):>34s} {summary(b):>34s} {ratio:6.1f}x  {extra}", flush=True)
    timer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
