"""A training loop that checkpoints through ckpt: an FSDP2 model and its Adam state saved every few steps
with ``dcp.save`` (or ``dcp.async_save``) through ``ckpt.dcp.Writer``, and resumed from the latest checkpoint
with ``dcp.load``. Runs on CPU with gloo (or on GPUs with NCCL: torch copies device tensors to the host).

    torchrun --standalone --nproc-per-node 2 python/examples/train_fsdp2.py --out runs/demo --steps 6
    torchrun --standalone --nproc-per-node 3 python/examples/train_fsdp2.py --out runs/demo --steps 9 --async-save

The second command resumes the first run's latest checkpoint in a job of another size (DCP reshards as it
loads) and goes on. Each checkpoint is ``OUT/step-N/``, an ordinary DCP checkpoint; ``OUT/latest`` names the
newest one once it is committed.

``--async-save`` (or ``--async-save thread``) saves with torch's thread-based async checkpointer,
``--async-save process`` with its process-based one. ``--out`` may be an object-storage URL
(``s3://bucket/runs/demo``): each checkpoint is committed there with ckpt's object-store protocol, the store
configured by the ``AWS_*`` variables and ``--storage-option KEY=VALUE`` (``storage_options``); ``latest`` is
then not written, and ``--resume URL`` names the checkpoint to resume from.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ckpt.dcp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the run's directory (checkpoints step-N/ and latest)")
    ap.add_argument("--steps", type=int, default=6, help="train until this step")
    ap.add_argument("--save-every", type=int, default=3, help="save every N steps")
    ap.add_argument("--async-save", nargs="?", const="thread", choices=["thread", "process"],
                    help="dcp.async_save with torch's thread- (the default) or process-based checkpointer: "
                         "training goes on while it saves")
    ap.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                    help="for a URL --out or --resume: a storage option (aws_endpoint, aws_allow_http, ...)")
    ap.add_argument("--resume", help="the checkpoint to resume from (default: OUT/latest, if any)")
    ap.add_argument("--export-hf", metavar="DIR",
                    help="at the end, the model as Hugging Face shards in DIR (bfloat16), straight from the ranks")
    args = ap.parse_args()
    opts = dict(o.split("=", 1) for o in args.storage_option) or None

    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    url = "://" in args.out
    out = args.out.rstrip("/") if url else Path(args.out)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)

    step = 0
    resume = args.resume
    if resume is None and not url and (out / "latest").exists():
        resume = str(out / (out / "latest").read_text().strip())
    if resume is not None:
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd, "step": 0}
        dcp.load(state, storage_reader=ckpt.dcp.Reader(resume, storage_options=opts))
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = state["step"]
        if rank == 0:
            print(f"resumed from {resume.rstrip('/').rsplit('/', 1)[-1]} (step {step}) on {world} ranks")

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
            writer = ckpt.dcp.Writer(f"{out}/step-{step}", storage_options=opts)
            if args.async_save:
                kind = AsyncCheckpointerType.PROCESS if args.async_save == "process" else AsyncCheckpointerType.THREAD
                pending = dcp.async_save(state, storage_writer=writer, process_group=save_group,
                                         async_checkpointer_type=kind)
                pending.add_done_callback(lambda f, s=step: _committed(f, out, s, rank))
            else:
                dcp.save(state, storage_writer=writer)
                _committed(None, out, step, rank)
            if rank == 0:
                print(f"step {step}: loss {loss.item():.4f}, saved step-{step}")
    if pending is not None:
        pending.result()
    if args.export_hf:
        # The model alone, whole tensors under their FQNs, in bfloat16: each rank writes the shards it owns
        # (the chunks of each shard travel to its rank), the coordinator writes the index and commits.
        hf = ckpt.dcp.Writer(args.export_hf, to="hf", include="model.*", strip_prefix="model.", dtype="bf16",
                             max_shard_size="1KB", storage_options=opts)
        model_sd, _ = get_state_dict(model, optim)
        dcp.save({"model": model_sd}, storage_writer=hf)
        if rank == 0:
            print(f"exported step {step} to {args.export_hf}")
    dist.barrier()
    dist.destroy_process_group()


def _committed(fut, out, step: int, rank: int) -> None:
    """Once a save is committed, rank 0 points ``latest`` at it (written atomically; a local ``--out``)."""
    if fut is not None:
        fut.result()
    if rank == 0 and isinstance(out, Path):
        tmp = out / ".latest.tmp"
        tmp.write_text(f"step-{step}\n")
        os.replace(tmp, out / "latest")


if __name__ == "__main__":
    main()
