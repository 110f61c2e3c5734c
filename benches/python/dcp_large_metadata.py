#!/usr/bin/env python3
"""Write the DCP checkpoint of a large FSDP job: a ``.metadata`` made by torch's own planner code, sparse data.

Usage::

    .venv/bin/python benches/python/dcp_large_metadata.py OUT_DIR [--ranks 256] [--layers 50] [--no-planner-data]
        [--time-read N]

The job: ``--ranks`` ranks (default 256) each hold a row shard (FSDP ``Shard(0)``) of every one of
``8 × --layers`` tensors (default 400: a Llama-like block of wq/wk/wv/wo/w1/w2/w3/attention_norm per layer),
so the checkpoint has ``ranks × tensors`` chunks (256 × 400 = 102,400; 64 ranks give 25,600, 1024 give
409,600). The metadata is built the way ``dcp.save`` builds it, with torch's classes and functions:

* each rank's ``SavePlan`` (``WriteItem``/``MetadataIndex``/``TensorWriteData``/``ChunkStorageMetadata``/
  ``TensorProperties``, ``planner_data`` from ``flatten_state_dict``) is pickled and unpickled, as
  ``gather_object`` does, so object sharing in the final pickle is what a real job produces;
* ``create_default_global_save_plan`` merges the plans into ``Metadata`` (``TensorStorageMetadata`` per key)
  and rewrites the index hints; planner data is merged as ``DefaultSavePlanner`` does;
* each rank's ``WriteResult``s (``_StorageInfo`` with the rank's file, offset and length) are pickled and
  unpickled, merged into ``storage_data`` as ``FileSystemWriter.finish`` does, with ``StorageMeta`` and the
  version, and the whole is written with ``pickle.dump`` (the default protocol, as ``finish`` does).

The data files ``__{rank}_0.distcp`` are sparse (``truncate`` to their size): nothing reads their bytes when
the checkpoint is only opened. Prints the ``.metadata`` size and the chunk count. With ``--time-read N`` it
then times torch's ``FileSystemReader(OUT_DIR).read_metadata()`` N times (inside this process, after the
import) and prints ``read_metadata <seconds>`` per run.
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import sys
import time
import uuid
from collections import ChainMap
from pathlib import Path

import torch
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

HIDDEN = 4096
KV = 1024
FFN = 14336
DTYPE = torch.bfloat16
# What torch.save adds around one tensor's bytes in a DCP data file (zip headers, pickle, version records).
ITEM_OVERHEAD = 1216


def tensors(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """The model: flattened key (under ``model.``) and global shape, 8 per layer."""
    out = []
    for i in range(layers):
        p = f"layers.{i}."
        out += [
            (p + "attention.wq.weight", (HIDDEN, HIDDEN)),
            (p + "attention.wk.weight", (KV, HIDDEN)),
            (p + "attention.wv.weight", (KV, HIDDEN)),
            (p + "attention.wo.weight", (HIDDEN, HIDDEN)),
            (p + "feed_forward.w1.weight", (FFN, HIDDEN)),
            (p + "feed_forward.w2.weight", (HIDDEN, FFN)),
            (p + "feed_forward.w3.weight", (FFN, HIDDEN)),
            (p + "attention_norm.weight", (HIDDEN,)),
        ]
    return out


def roundtrip(obj):
    """What ``gather_object`` does to an object on its way to the coordinator."""
    return pickle.loads(pickle.dumps(obj))


def rank_plan(rank: int, ranks: int, model: list[tuple[str, tuple[int, ...]]]) -> SavePlan:
    items = []
    mappings = {}
    for name, shape in model:
        if shape[0] % ranks:
            raise SystemExit(f"{name}: {shape[0]} rows do not split over {ranks} ranks")
        rows = shape[0] // ranks
        offsets = torch.Size((rank * rows,) + (0,) * (len(shape) - 1))
        sizes = torch.Size((rows,) + shape[1:])
        fqn = f"model.{name}"
        items.append(
            WriteItem(
                index=MetadataIndex(fqn, offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                    properties=TensorProperties(dtype=DTYPE),
                    size=torch.Size(shape),
                ),
            )
        )
        mappings[fqn] = ("model", name)
    return SavePlan(items, planner_data=mappings)


def write_results(rank: int, plan: SavePlan) -> list[WriteResult]:
    file = f"__{rank}_0.distcp"
    offset = 0
    out = []
    for item in plan.items:
        numel = 1
        for d in item.tensor_data.chunk.sizes:
            numel *= d
        length = numel * DTYPE.itemsize + ITEM_OVERHEAD
        out.append(WriteResult(index=item.index, size_in_bytes=length, storage_data=_StorageInfo(file, offset, length)))
        offset += length
    return out


def generate(out: Path, ranks: int, layers: int, planner_data: bool) -> tuple[int, int]:
    out.mkdir(parents=True, exist_ok=True)
    model = tensors(layers)
    all_plans = [roundtrip(rank_plan(r, ranks, model)) for r in range(ranks)]
    global_plan, metadata = create_default_global_save_plan(all_plans)
    if planner_data:
        merged = dict(ChainMap(*[p.planner_data for p in global_plan]))
        metadata = dataclasses.replace(metadata, planner_data=merged)
    results = [roundtrip(write_results(r, p)) for r, p in enumerate(global_plan)]
    metadata.version = "1.0.0"
    storage_md = {}
    for wr_list in results:
        storage_md.update({wr.index: wr.storage_data for wr in wr_list})
    metadata.storage_data = storage_md
    metadata.storage_meta = StorageMeta(checkpoint_id=str(out), save_id=str(uuid.UUID(int=ranks * 1000 + layers)))
    with open(out / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    for r, wr_list in enumerate(results):
        size = sum(wr.storage_data.length for wr in wr_list)
        with open(out / f"__{r}_0.distcp", "wb") as f:
            f.truncate(size)
    return (out / ".metadata").stat().st_size, len(storage_md)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--no-planner-data", action="store_true")
    ap.add_argument("--time-read", type=int, default=0, metavar="N")
    args = ap.parse_args()
    if not (args.out / ".metadata").exists():
        size, chunks = generate(args.out, args.ranks, args.layers, not args.no_planner_data)
        print(f"metadata_bytes {size}\nchunks {chunks}", flush=True)
    for _ in range(args.time_read):
        t = time.perf_counter()
        FileSystemReader(args.out).read_metadata()
        print(f"read_metadata {time.perf_counter() - t:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
