#!/usr/bin/env python3
"""Time torch.load / torch.save on the same files ckpt's criterion benches use, and check ckpt reads them equal.

Usage::

    .venv/bin/python benches/python/side_by_side.py [SIZE_MIB ...]

For each size it writes a GPT-2-shaped float32 state dict with torch.save, then times (median of 5, after one
warm-up) ``torch.load`` (touching every tensor), ``torch.load(mmap=True)`` and ``torch.save``, and the ``ckpt``
binary's ``inspect`` of the same file for a whole-process comparison. Prints one line per measurement in
``<op> <size> <seconds> <GB/s>`` form. Build the tool first: ``cargo build --release -p ckpt --features cli``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def state_dict(total_bytes: int) -> dict[str, torch.Tensor]:
    hidden = 768
    per_layer = 4 * hidden * hidden * 4 + 4 * hidden * 4
    sd: dict[str, torch.Tensor] = {}
    g = torch.Generator().manual_seed(0)
    for layer in range(max(1, total_bytes // per_layer)):
        sd[f"h.{layer}.attn.c_attn.weight"] = torch.randn(hidden, 3 * hidden, generator=g)
        sd[f"h.{layer}.attn.c_proj.weight"] = torch.randn(hidden, hidden, generator=g)
        sd[f"h.{layer}.ln_1.weight"] = torch.randn(hidden, generator=g)
        sd[f"h.{layer}.ln_1.bias"] = torch.randn(hidden, generator=g)
        sd[f"h.{layer}.mlp.c_fc.bias"] = torch.randn(3 * hidden, generator=g)
    return sd


def median_time(fn, runs: int = 5) -> float:
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def touch(sd: dict[str, torch.Tensor]) -> float:
    return float(sum(t.view(-1)[t.numel() // 2] for t in sd.values()))


def main() -> int:
    sizes = [int(s) for s in sys.argv[1:]] or [16, 256]
    tool = ROOT / "target" / "release" / "ckpt"
    with tempfile.TemporaryDirectory() as d:
        for mib in sizes:
            sd = state_dict(mib << 20)
            path = Path(d) / f"model_{mib}.pt"
            torch.save(sd, path)
            n = path.stat().st_size
            rows = {
                "torch.load": median_time(lambda: touch(torch.load(path, weights_only=True))),
                "torch.load(mmap)": median_time(lambda: touch(torch.load(path, weights_only=True, mmap=True))),
                "torch.save": median_time(lambda: torch.save(sd, Path(d) / "out.pt")),
            }
            if tool.exists():
                rows["ckpt inspect (process)"] = median_time(
                    lambda: subprocess.run([tool, "inspect", "--json", path], check=True, capture_output=True)
                )
            for op, secs in rows.items():
                print(f"{op:24s} {mib:5d}MiB {secs:8.4f}s {n / secs / 1e9:7.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
