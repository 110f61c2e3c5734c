#!/usr/bin/env python3
"""Write the full-read workloads of ``read_side_by_side.py``: about 1 GiB each, pseudo-random float32.

Usage::

    .venv/bin/python benches/python/read_workloads.py OUT_DIR [--mib 1024] [--parts model,dcp,hfai,pbg]

Writes, under OUT_DIR (``--parts``: only some; ``hfai-src`` is ``hfai.pt`` alone; what exists is kept):

* ``model.pt``: ``torch.save`` of 64 float32 tensors (``--mib`` / 64 each);
* ``dcp/``: the same state dict saved by ``torch.distributed.checkpoint.save`` (``no_dist=True``) with a
  ``FileSystemWriter`` using 4 threads, so the data spans 4 files;
* ``hfai.pt`` and ``hfai/``: an hfai-shaped state (one tensor of half the size, chunked over the parts, and
  32 small ones) as ``torch.save``, converted to a 4-part hfai checkpoint by ``ckpt convert --to hfai``
  (build the tool first: ``cargo build --release -p ckpt --features full,cli``);
* ``embeddings_node_0.v1.h5``: a PyTorch-BigGraph embedding partition written as
  ``torchbiggraph.checkpoint_storage.save_embeddings`` writes it (h5py, ``format_version`` 1, a contiguous
  float32 ``embeddings`` dataset of 64 columns).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.distributed.checkpoint as dcp

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--parts", default="model,dcp,hfai,pbg",
                    help="which of model, dcp, hfai, pbg to write (comma-separated; existing ones are kept)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    total = args.mib << 20

    want_model = "model" in parts and not (out / "model.pt").exists()
    want_dcp = "dcp" in parts and not (out / "dcp").exists()
    if want_model or want_dcp:
        each = total // 64 // 4
        g = torch.Generator().manual_seed(0)
        sd = {f"layers.{i}.weight": torch.randn(each // 1024, 1024, generator=g) for i in range(64)}
        if want_model:
            torch.save(sd, out / "model.pt")
        if want_dcp:
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(out / "dcp", thread_count=4), no_dist=True)
        del sd

    if parts & {"hfai", "hfai-src"} and not (out / "hfai.pt").exists():
        g = torch.Generator().manual_seed(1)
        big = total // 2 // 4
        state = {"big": torch.randn(big // 4096, 4096, generator=g)}
        small = total // 2 // 32 // 4
        for i in range(32):
            state[f"layers.{i}"] = torch.randn(small // 1024, 1024, generator=g)
        torch.save(state, out / "hfai.pt")
        del state
    if "hfai" in parts and not (out / "hfai").exists():
        tool = ROOT / "target" / "release" / "ckpt"
        subprocess.run(
            [tool, "convert", "-q", "--to", "hfai", "--world-size", "4", "--hfai-large-size", str(64 << 20),
             out / "hfai.pt", out / "hfai"],
            check=True,
        )

    h5 = out / "embeddings_node_0.v1.h5"
    if "pbg" in parts and not h5.exists():
        rows = total // 4 // 64
        with h5py.File(h5, "w") as f:
            f.attrs["format_version"] = 1
            f.create_dataset("embeddings", data=np.random.default_rng(0).standard_normal((rows, 64), dtype=np.float32))
    for p in sorted(out.iterdir()):
        size = sum(x.stat().st_size for x in p.rglob("*")) if p.is_dir() else p.stat().st_size
        print(f"{p} {size / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
