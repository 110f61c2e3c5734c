"""The training state of facade/examples/mpi_roundtrip.rs in torch, under a 4-process gloo job.

    python dcp_gloo.py load DIR   # dcp.load of a checkpoint the MPI example wrote; every value checked
    python dcp_gloo.py save DIR   # dcp.save of the same state by 4 ranks (DTensor Shard(0)), for the example

The state: model.emb [1000, 16] = 16 i + j (Shard(0) over the ranks), model.dense.weight [32, 16] = k + 0.25,
model.dense.bias [32] = -k (replicated), optim.emb.exp_avg = -(16 i + j), optim.emb.exp_avg_sq = 16 i + j + 0.5
(sharded), optim.dense.exp_avg = k + 0.25, optim.step = 1 (int64 scalar).
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

WORLD = 4
V, D, DENSE = 1000, 16, 32


def full_state():
    idx = torch.arange(V * D, dtype=torch.float32).reshape(V, D)
    k = torch.arange(DENSE * D, dtype=torch.float32).reshape(DENSE, D)
    return {
        "model": {"emb": idx, "dense.weight": k + 0.25, "dense.bias": -torch.arange(DENSE, dtype=torch.float32)},
        "optim": {
            "emb": {"exp_avg": -idx, "exp_avg_sq": idx + 0.5},
            "dense": {"exp_avg": k + 0.25},
            "step": torch.tensor(1, dtype=torch.int64),
        },
    }


SHARDED = [("model", "emb"), ("optim", "emb", "exp_avg"), ("optim", "emb", "exp_avg_sq")]


def get(d, path):
    for p in path:
        d = d[p]
    return d


def put(d, path, v):
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = v


def rank_state(mesh, zeros):
    sd = full_state()
    if zeros:
        sd = {k: {kk: (torch.zeros_like(vv) if isinstance(vv, torch.Tensor) else {a: torch.zeros_like(b) for a, b in vv.items()}) for kk, vv in v.items()} for k, v in sd.items()}
    for path in SHARDED:
        put(sd, path, distribute_tensor(get(sd, path), mesh, [Shard(0)]))
    return sd


def worker(rank, mode, path, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    if mode == "save":
        dcp.save(rank_state(mesh, zeros=False), checkpoint_id=path)
    else:
        sd = rank_state(mesh, zeros=True)
        dcp.load(sd, checkpoint_id=path)
        want = full_state()
        checked = 0
        for path_ in [("model", "emb"), ("model", "dense.weight"), ("model", "dense.bias"), ("optim", "emb", "exp_avg"),
                      ("optim", "emb", "exp_avg_sq"), ("optim", "dense", "exp_avg"), ("optim", "step")]:
            got = get(sd, path_)
            if hasattr(got, "full_tensor"):
                local = got.to_local()
                off, n = 0, 0
                chunks = torch.chunk(torch.arange(V), WORLD)
                if rank < len(chunks):
                    off, n = int(chunks[rank][0]), len(chunks[rank])
                expect = get(want, path_)[off:off + n]
                assert torch.equal(local, expect), (rank, path_)
                checked += local.numel()
            else:
                assert torch.equal(got, get(want, path_)), (rank, path_, got)
                checked += got.numel()
        print(f"torch rank {rank} of {WORLD}: dcp.load checked {checked} values", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    mode, path = sys.argv[1], sys.argv[2]
    assert mode in ("save", "load")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(mode, path, port), nprocs=WORLD, join=True)
    print(f"torch {mode} of {path} by {WORLD} gloo ranks: ok")


if __name__ == "__main__":
    main()
