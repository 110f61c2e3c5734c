#!/usr/bin/env python3
"""Write a DeepSpeed ZeRO-3 checkpoint of at least 1 GiB of parameters with the real deepspeed, world size 2
(CPU accelerator, gloo on 127.0.0.1), for the ``zero-to-hf`` section of ``benches/compare``.

Usage::

    .venv/bin/python benches/python/zero_workload.py OUT [--layers 33] [--rows 2048] [--cols 4096]

The model is ``--layers`` bias-free ``nn.Linear(cols, rows)`` in a row (``layers × rows × cols`` float32
parameters: 33 × 2048 × 4096 × 4 bytes = 1.03 GiB by default, the largest parameter 32 MiB), trained for one
AdamW step under ZeRO stage 3 in fp32 and saved with ``engine.save_checkpoint(OUT, tag="global_step1")``:
each rank's ``zero_pp_rank_R_mp_rank_00_optim_states.pt`` holds half of every parameter and of its two Adam
moments (about 1.5 GiB). Prints the parameter bytes and the largest parameter's.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path


def worker(rank: int, port: int, out: Path, layers: int, rows: int, cols: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    import logging

    import deepspeed
    import torch
    from torch import nn

    deepspeed.ops.__compatible_ops__ = {}
    deepspeed.utils.logger.setLevel(logging.ERROR)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(cols, rows, bias=False) for _ in range(layers)])
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}, "steps_per_print": 10**6}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(1, cols)
    loss = sum(layer(x).sum() for layer in engine.module)
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(str(out), tag="global_step1")
    torch.distributed.barrier()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=33)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--worker", type=int, default=None)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    if a.worker is not None:
        worker(a.worker, a.port, a.out, a.layers, a.rows, a.cols)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    args = [str(a.out), "--layers", str(a.layers), "--rows", str(a.rows), "--cols", str(a.cols), "--port", str(port)]
    procs = [subprocess.Popen([sys.executable, __file__, *args, "--worker", str(r)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for r in range(2)]
    outs = [p.communicate() for p in procs]
    if any(p.returncode for p in procs):
        for _, err in outs:
            sys.stderr.write(err.decode(errors="replace")[-4000:])
        return 1
    print(a.layers * a.rows * a.cols * 4, a.rows * a.cols * 4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
