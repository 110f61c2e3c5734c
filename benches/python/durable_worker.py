#!/usr/bin/env python3
"""Worker for ``durable_save`` (benches/src/bin/durable_save.rs): times torch.save on the same tensors.

Started once by the Rust driver, it builds its state dicts from a raw payload file the driver wrote, then
answers one command per line on stdin with the seconds the command took, so Python's timings interleave
with the Rust ones in one run::

    .venv/bin/python benches/python/durable_worker.py PAYLOAD BIG_TENSORS SMALL_COUNT SMALL_BYTES

Commands: ``big_fsync PATH``, ``big PATH``, ``small_fsync PATH``, ``small PATH``, ``quit``. ``*_fsync`` is
``torch.save`` into an open file, then ``flush`` and ``os.fsync`` (torch.save itself never fsyncs).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch


def main() -> int:
    payload, big_tensors, small_count, small_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    raw = np.fromfile(payload, dtype=np.uint8)
    per = raw.size // big_tensors
    big = {f"layer.{i}.weight": torch.from_numpy(raw[i * per : (i + 1) * per].view(np.float32)) for i in range(big_tensors)}
    small = {
        f"param.{i}": torch.from_numpy(raw[i * small_bytes : (i + 1) * small_bytes].view(np.float32).copy())
        for i in range(small_count)
    }
    sets = {"big": big, "small": small}
    print("ready", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "quit":
            break
        what, path = parts[0], parts[1]
        name, _, sync = what.partition("_")
        sd = sets[name]
        t = time.perf_counter()
        if sync:
            with open(path, "wb") as f:
                torch.save(sd, f)
                f.flush()
                os.fsync(f.fileno())
        else:
            torch.save(sd, path)
        print(f"{time.perf_counter() - t:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
