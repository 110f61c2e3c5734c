#!/usr/bin/env python3
"""Time torchbiggraph 1.0.0's own checkpoint I/O on the shapes of ``crates/pbg/benches/throughput.rs``.

Usage (from the repository root)::

    .venv/bin/python conformance/python/pbg/bench.py [DIR]     # DIR defaults to a temp dir; /dev/shm for tmpfs

Measures, best of 3:

* ``save``: 8 partitions of 262144 x 64 float32 (with their RowAdagrad state) through
  ``FileCheckpointStorage.save_entity_partition`` (h5py, sequential as in PBG's trainer), the model,
  then ``save_version``;
* ``load``: ``CheckpointManager.read`` of the 8 partitions (h5py ``read_direct`` + ``torch.load`` of
  the optimizer state);
* ``export_tsv``: ``make_tsv`` entities for 2 partitions of 65536 x 64.

Prints MiB/s for each, like criterion's throughput.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torchbiggraph.checkpoint_manager import CheckpointManager, ModelParameter
from torchbiggraph.checkpoint_storage import FileCheckpointStorage

DIM = 64


def blob(rows: int) -> bytes:
    sd = {"state": {0: {"step": 0, "sum": torch.ones(rows)}},
          "param_groups": [{"lr": 0.1, "lr_decay": 0, "weight_decay": 0, "params": [0]}]}
    with io.BytesIO() as bf:
        torch.save(sd, bf)
        return bf.getvalue()


def best(f, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    root = Path(tempfile.mkdtemp(dir=root))
    torch.set_num_threads(1)
    rows = 1 << 18
    parts = [(torch.arange(rows * DIM, dtype=torch.int64) % 251).float().div(64).view(rows, DIM) for _ in range(8)]
    opt = blob(rows)
    storage = FileCheckpointStorage(str(root / "ckpt"))
    storage.prepare()
    version = [0]

    def save():
        version[0] += 1
        for i, p in enumerate(parts):
            storage.save_entity_partition(version[0], "node", i, p, opt, {"config/json": "{}"})
        t = torch.full((DIM,), 0.5)
        storage.save_model(version[0], {"relations/0/operator/rhs/translation": ModelParameter("rhs_operators.0.translation", t)}, blob(1), {})
        storage.save_version(version[0])

    nbytes = 8 * rows * DIM * 4
    t = best(save)
    print(f"pbg-python/save/512MiB-8parts: {t:.3f} s, {nbytes / t / 2**20:.0f} MiB/s")
    manager = CheckpointManager(str(root / "ckpt"))

    def load():
        for i in range(8):
            manager.read("node", i)

    t = best(load)
    print(f"pbg-python/load/512MiB-8parts: {t:.3f} s, {nbytes / t / 2**20:.0f} MiB/s")

    from torchbiggraph.config import ConfigSchema
    from torchbiggraph.converters.export_to_tsv import make_tsv

    small = root / "small"
    s = FileCheckpointStorage(str(small / "ckpt"))
    s.prepare()
    srows = 1 << 16
    for i in range(2):
        s.save_entity_partition(1, "node", i, parts[i][:srows].clone(), None, {})
    s.save_model(1, {}, None, {})
    s.save_version(1)
    (small / "data").mkdir()
    for i in range(2):
        (small / "data" / f"entity_names_node_{i}.json").write_text(json.dumps([f"n{i}_{j}" for j in range(srows)]))
        (small / "data" / f"entity_count_node_{i}.txt").write_text(f"{srows}\n")
    (small / "data" / "dynamic_rel_names.json").write_text('["r"]')
    config = ConfigSchema.from_dict(dict(
        entities={"node": {"num_partitions": 2}},
        relations=[{"name": "r", "lhs": "node", "rhs": "node", "operator": "translation"}],
        dimension=DIM, global_emb=False, entity_path=str(small / "data"), edge_paths=["e"],
        checkpoint_path=str(small / "ckpt"),
    ))

    def export():
        for n in ("e.tsv", "r.tsv"):
            (small / n).unlink(missing_ok=True)
        with open(small / "e.tsv", "xt") as ef, open(small / "r.tsv", "xt") as rf, open(os.devnull, "w") as null:
            stdout, sys.stdout = sys.stdout, null
            try:
                make_tsv(config, ef, rf)
            finally:
                sys.stdout = stdout

    t = best(export, 1)
    snbytes = 2 * srows * DIM * 4
    print(f"pbg-python/export_tsv/32MiB-2parts: {t:.3f} s, {snbytes / t / 2**20:.1f} MiB/s")


if __name__ == "__main__":
    main()
