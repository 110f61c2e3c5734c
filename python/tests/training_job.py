"""A training job that checkpoints through ``ckpt.dcp.Writer``: ``WORLD`` gloo processes on 127.0.0.1
(``torch.multiprocessing``, a 60 s process-group timeout), a small model sharded with FSDP2
(``fully_shard``) and its AdamW state, plus every other kind of item DCP saves.

    python training_job.py SCENARIO OUT WORLD

Scenarios (each rank runs the same):

- ``save``: two training steps, then ``dcp.save`` of the same state dict twice, through ``ckpt.dcp.Writer``
  to ``OUT/ckpt`` (or to the URL in ``CKPT_TRAINING_URL``) and through torch's ``FileSystemWriter`` to ``OUT/torch``. The state dict holds the model
  and optimizer (DTensor ``Shard(0)`` shards, optimizer ``param_groups``), a ``ShardedTensor``, a
  ``Replicate`` DTensor, on 4 ranks a DTensor on a 2-D mesh (``Shard(0), Shard(1)``), a plain tensor every
  rank holds, a ``BytesIO``, the RNG state, ints and strings.
- ``async_thread`` / ``async_process``: the same through ``dcp.async_save`` with torch's thread- and
  process-based async checkpointers (the training step goes on while the save runs).
- ``load``: builds the same state dict for ``WORLD`` ranks (another world size than the save's), loads
  ``OUT/ckpt`` and ``OUT/torch`` with torch's ``FileSystemReader`` into two copies and compares every rank's
  shards bit for bit.
- ``fail``: a save to ``OUT/ckpt`` where rank 1 fails after writing its file; every rank must see
  ``dcp.save`` fail, the previous checkpoint must load as it was, and the next save (same writer) must
  succeed and leave no staging directory.
- ``kill``: a save to ``OUT/ckpt`` where rank 1 dies (``os._exit``) after writing its file: the job dies.

Exits 0 when every rank's checks passed.
"""

from __future__ import annotations

import io
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(rank: int, world: int, trained: bool, sharded_tensor_item: bool = True):
    """The job's state: model and optimizer under FSDP2, and the other items (see the module docs)."""
    import torch
    import torch.distributed as dist
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5, bias=False))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    if trained:
        g = torch.Generator().manual_seed(rank)
        for _ in range(2):
            loss = model(torch.randn(4, 8, generator=g)).square().mean()
            loss.backward()
            optim.step()
            optim.zero_grad()
    model_sd, optim_sd = get_state_dict(model, optim)
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    st = sharded_tensor.zeros(spec, 9, 3)
    for shard in st.local_shards():
        shard.tensor.copy_(torch.arange(shard.tensor.numel(), dtype=torch.float32).view_as(shard.tensor) + rank)
    base = torch.arange(30, dtype=torch.float32).view(6, 5) * (2.0 if trained else 1.0)
    extra = {
        "replicated": distribute_tensor(base, mesh, [Replicate()]),
        "sharded_rows": distribute_tensor(base, mesh, [Shard(0)]),
        "plain": torch.arange(7, dtype=torch.int64) * (3 if trained else 1),
        "rng": torch.get_rng_state(),
        "blob": io.BytesIO(b"extra state \x00\x01" * (2 if trained else 1)),
        "step": 2 if trained else 0,
        "name": "run-1",
    }
    if sharded_tensor_item:  # torch's async stager cannot copy a ShardedTensor ("data_ptr not supported")
        extra["sharded_tensor"] = st
    if world == 4:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        extra["mesh2d"] = distribute_tensor(base.to(torch.bfloat16), mesh2, [Shard(0), Shard(1)])
    dist.barrier()
    return model, optim, {"model": model_sd, "optim": optim_sd, "extra": extra}


def local(t):
    import torch

    if hasattr(t, "to_local"):
        return t.to_local()
    if hasattr(t, "local_shards"):
        return torch.cat([s.tensor.reshape(-1) for s in t.local_shards()]) if t.local_shards() else torch.empty(0)
    return t


def compare(a, b, where: str) -> None:
    import torch

    if isinstance(b, dict):
        assert sorted(a, key=str) == sorted(b, key=str), f"{where}: keys {sorted(a, key=str)} vs {sorted(b, key=str)}"
        for k in b:
            compare(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{where}.{i}")
    elif isinstance(b, io.BytesIO):
        assert a.getvalue() == b.getvalue(), where
    elif isinstance(b, torch.Tensor) or hasattr(b, "local_shards"):
        la, lb = local(a), local(b)
        assert la.dtype == lb.dtype and la.shape == lb.shape, f"{where}: {la.dtype} {la.shape} vs {lb.dtype} {lb.shape}"
        assert torch.equal(la.reshape(-1).view(torch.uint8), lb.reshape(-1).view(torch.uint8)), f"{where} differs"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def blank(sd):
    """A copy of the state dict's structure to load into: tensors zeroed, values changed."""
    import torch

    if isinstance(sd, dict):
        return {k: blank(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [blank(v) for v in sd]
    if isinstance(sd, io.BytesIO):
        return io.BytesIO(b"")
    if isinstance(sd, torch.Tensor) or hasattr(sd, "local_shards"):
        out = sd.detach().clone() if not hasattr(sd, "local_shards") else sd
        local(out).zero_() if hasattr(out, "local_shards") else out.zero_()
        return out
    if isinstance(sd, int) and not isinstance(sd, bool):
        return -1
    if isinstance(sd, str):
        return ""
    return sd


def rank_main(rank: int, world: int, port: int, scenario: str, out: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import ckpt.dcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        out_dir = Path(out)
        if scenario == "save":
            _, _, sd = build(rank, world, trained=True)
            # CKPT_TRAINING_URL: save to that object-store URL instead of OUT/ckpt.
            dest = os.environ.get("CKPT_TRAINING_URL") or out_dir / "ckpt"
            # CKPT_TRAINING_OVERWRITE=1: replace whatever stands there (Writer(overwrite=True)).
            overwrite = os.environ.get("CKPT_TRAINING_OVERWRITE") == "1"
            meta = dcp.save(sd, storage_writer=ckpt.dcp.Writer(dest, overwrite=overwrite))
            assert not any(str(k.fqn).startswith("ckpt.") for k in meta.storage_data), "a rank report leaked"
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(out_dir / "torch"))
        elif scenario in ("async_thread", "async_process"):
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            kind = AsyncCheckpointerType.THREAD if scenario == "async_thread" else AsyncCheckpointerType.PROCESS
            model, optim, sd = build(rank, world, trained=True, sharded_tensor_item=False)
            pg = dist.new_group(backend="gloo")
            fut = dcp.async_save(sd, storage_writer=ckpt.dcp.Writer(out_dir / "ckpt"), process_group=pg,
                                 async_checkpointer_type=kind)
            fut.result(timeout=120)
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(out_dir / "torch"))
        elif scenario == "load":
            saved = dcp.FileSystemReader(out_dir / "ckpt").read_metadata().state_dict_metadata
            _, _, template = build(rank, world, trained=False,
                                   sharded_tensor_item="extra.sharded_tensor" in saved)
            ours, theirs = blank(template), blank(template)
            dcp.load(ours, storage_reader=dcp.FileSystemReader(out_dir / "ckpt"))
            dcp.load(theirs, storage_reader=dcp.FileSystemReader(out_dir / "torch"))
            compare(ours, theirs, "state")
            assert ours["extra"]["step"] == 2 and ours["extra"]["blob"].getvalue().startswith(b"extra state")
        elif scenario in ("fail", "kill"):
            # dcp.save(..., use_collectives=False) has each rank save alone: refused, saying what to do.
            try:
                ckpt.dcp.Writer(out_dir / "ckpt").set_up_storage_writer(rank == 0, rank=rank, use_collectives=False)
            except ckpt.UsageError as e:
                assert "use_collectives=True" in str(e), str(e)
            else:
                raise AssertionError("use_collectives=False with several ranks was accepted")
            _, _, previous = build(rank, world, trained=False)
            dcp.save(previous, storage_writer=ckpt.dcp.Writer(out_dir / "ckpt"))
            dcp.save(previous, storage_writer=dcp.FileSystemWriter(out_dir / "previous"))
            _, _, sd = build(rank, world, trained=True)

            class Failing(ckpt.dcp.Writer):
                def write_data(self, plan, planner):
                    fut = super().write_data(plan, planner)
                    if self.rank == 1:
                        if scenario == "kill":
                            os._exit(3)
                        raise RuntimeError("disk on fire on rank 1")
                    return fut

            writer = Failing(out_dir / "ckpt")
            try:
                dcp.save(sd, storage_writer=writer)
            except BaseException as e:  # torch's CheckpointException (a BaseException) on every rank
                failures = getattr(e, "failures", {})
                assert list(failures) == [1] and "disk on fire" in str(failures[1]), repr(e)
            else:
                raise AssertionError("the save with a failing rank succeeded")
            back = blank(previous)
            dcp.load(back, storage_reader=dcp.FileSystemReader(out_dir / "ckpt"))
            compare(back, previous, "previous")
            dist.barrier()
            # The next save through the same writer: clean-up, then a whole checkpoint.
            dcp.save(sd, storage_writer=ckpt.dcp.Writer(out_dir / "ckpt"))
            back = blank(sd)
            dcp.load(back, storage_reader=dcp.FileSystemReader(out_dir / "ckpt"))
            compare(back, sd, "after")
            dist.barrier()
            assert not (out_dir / ".ckpt.ckpt-staging").exists()
        else:
            raise SystemExit(f"unknown scenario {scenario}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> int:
    import torch.multiprocessing as mp

    scenario, out, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mp.spawn(rank_main, args=(world, free_port(), scenario, out), nprocs=world, join=True)
    print(f"{scenario}: {world} ranks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
