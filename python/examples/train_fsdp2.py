"""A training loop that checkpoints through ckpt: an FSDP2 model and its Adam state saved every few steps
with ``dcp.save`` (or ``dcp.async_save``) through ``ckpt.dcp.Writer``, and resumed from the latest checkpoint
with ``dcp.load``. Runs on CPU with gloo (or on GPUs with NCCL: torch copies device tensors to the host).

    torchrun --standalone --nproc-per-node 2 python/examples/train_fsdp2.py --out runs/demo --steps 6
    torchrun --standalone --nproc-per-node 3 python/examples/train_fsdp2.py --out runs/demo --steps 9 --async-save

The second command resumes the first run's latest checkpoint in a job of another size (DCP reshards as it
loads) and goes on. Each checkpoint is ``OUT/step-N/``, an ordinary DCP checkpoint; ``OUT/latest`` names the
newest one once it is committed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ckpt.dcp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the run's directory (checkpoints step-N/ and latest)")
    ap.add_argument("--steps", type=int, default=6, help="train until this step")
    ap.add_argument("--save-every", type=int, default=3, help="save every N steps")
    ap.add_argument("--async-save", action="store_true", help="dcp.async_save: training goes on while it saves")
    args = ap.parse_args()

    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    out = Path(args.out)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)

    step = 0
    latest = out / "latest"
    if latest.exists():
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd, "step": 0}
        dcp.load(state, storage_reader=ckpt.dcp.Reader(out / latest.read_text().strip()))
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = state["step"]
        if rank == 0:
            print(f"resumed from {latest.read_text().strip()} (step {step}) on {world} ranks")

    # An async save runs its collectives on a process group of its own, beside training's.
    save_group = dist.new_group(backend="gloo") if args.async_save else None
    pending = None
    g = torch.Generator().manual_seed(1000 + rank)
    while step < args.steps:
        x = torch.randn(8, 16, generator=g).to(device)
        loss = model(x).square().mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        step += 1
        if step % args.save_every == 0 or step == args.steps:
            if pending is not None:
                pending.result()  # one save at a time
                pending = None
            model_sd, optim_sd = get_state_dict(model, optim)
            state = {"model": model_sd, "optim": optim_sd, "step": step}
            writer = ckpt.dcp.Writer(out / f"step-{step}")
            if args.async_save:
                pending = dcp.async_save(state, storage_writer=writer, process_group=save_group)
                pending.add_done_callback(lambda f, s=step: _committed(f, out, s, rank))
            else:
                dcp.save(state, storage_writer=writer)
                _committed(None, out, step, rank)
            if rank == 0:
                print(f"step {step}: loss {loss.item():.4f}, saved step-{step}")
    if pending is not None:
        pending.result()
    dist.barrier()
    dist.destroy_process_group()


def _committed(fut, out: Path, step: int, rank: int) -> None:
    """Once a save is committed, rank 0 points ``latest`` at it (written atomically)."""
    if fut is not None:
        fut.result()
    if rank == 0:
        tmp = out / ".latest.tmp"
        tmp.write_text(f"step-{step}\n")
        os.replace(tmp, out / "latest")


if __name__ == "__main__":
    main()
