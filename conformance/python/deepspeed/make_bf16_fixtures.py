#!/usr/bin/env python3
"""Generate the DeepSpeed BF16_Optimizer golden fixture: a real save by deepspeed's ``BF16_Optimizer``.

Usage::

    .venv/bin/python conformance/python/deepspeed/make_bf16_fixtures.py OUTDIR

bf16 training with ZeRO stage 1 and fp32 gradient accumulation (``"data_types": {"grad_accum_dtype":
"fp32"}``) makes deepspeed wrap the optimizer in ``BF16_Optimizer`` (``runtime/bf16_optimizer.py``), not in
the ZeRO optimizer: its ``state_dict()`` holds ``single_partition_of_fp32_groups``, ``group_paddings`` and
``param_slice_mappings`` and no ``zero_stage``, and DeepSpeed's own ``zero_to_fp32`` cannot read it. The CPU
accelerator runs it: two processes (world size 2) meet over gloo on 127.0.0.1 and train ``make_fixtures.py``'s
small model (a tied embedding, two param groups, a frozen layer, buffers; odd sizes, so that the last rank's
partition is padded) for two AdamW steps, then call ``engine.save_checkpoint(<case>, client_state=...)``.

Right after the save, every rank asks DeepSpeed for each trained parameter's full fp32 master weights and
optimizer state (``deepspeed.utils.safe_get_full_fp32_param`` / ``safe_get_full_optimizer_state``: DeepSpeed
gathers them from the ranks' partitions through ``param_slice_mappings``' fragments); rank 0 writes, under
``OUTDIR/<case>/``:

* the checkpoint (``latest``, ``global_step2/`` with ``bf16_zero_pp_rank_R_mp_rank_00_optim_states.pt``);
* ``reference.pt``: ``{name: fp32 master weights}`` of the trained parameters, in ``named_parameters`` order;
* ``reference_optim.pt``: ``{"<name>.exp_avg": ..., "<name>.exp_avg_sq": ...}``;
* ``expected.json``: the case, world size, group paddings, the references' names, dtypes and shapes, and the
  client state;

then converts it with ``ds_to_universal`` into ``OUTDIR/universal_bf16_optimizer_w2/`` (``latest_universal``,
``global_step2_universal/``), DeepSpeed's other way of joining the ranks' fragments;

plus ``OUTDIR/STAMP.json`` and ``OUTDIR/README.md``. Deterministic (pinned environment, seeds, one thread);
``check_reproducible.py`` compares a fresh run with the committed files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # conformance/python: pinenv, torchtree
sys.path.insert(0, str(HERE))  # make_fixtures: the model and the process launcher

import pinenv  # noqa: E402

pinenv.pin_environment()
os.environ["DS_ACCELERATOR"] = "cpu"

import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import make_fixtures  # noqa: E402

warnings.filterwarnings("ignore")

COMMAND = ".venv/bin/python conformance/python/deepspeed/make_bf16_fixtures.py conformance/fixtures/deepspeed_bf16"
INPUTS = ("deepspeed/make_bf16_fixtures.py", "deepspeed/make_fixtures.py", "pinenv.py")
CASE = "bf16_optimizer_w2"
#: ``ds_to_universal``'s conversion of CASE: DeepSpeed's other consolidation of the same fragments
UNIVERSAL = "universal_bf16_optimizer_w2"
WORLD = 2
DESCRIPTION = "BF16_Optimizer (ZeRO 1, bf16, fp32 gradient accumulation), 2 ranks"
TAG = make_fixtures.TAG
CLIENT_STATE = make_fixtures.CLIENT_STATE
OPTIM_KEYS = ("exp_avg", "exp_avg_sq")
TRAINING_DERIVED = {"*.pt": {"tensors": ["*"]}}


def worker(rank: int, world: int, port: int, outdir: Path) -> None:
    """One rank: train, save, and (rank 0) write what DeepSpeed gathers of each parameter."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import logging
    from collections import OrderedDict

    import torch
    import deepspeed
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    deepspeed.ops.__compatible_ops__ = {}  # no JIT op (deepspeed_shm_comm) is built
    deepspeed.utils.logger.setLevel(logging.ERROR)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    m = make_fixtures.model()
    groups = [
        {"params": [m.emb.weight], "weight_decay": 0.0},
        {"params": [m.l1.weight, m.l1.bias, m.l2.weight, m.l2.bias], "weight_decay": 0.1},
    ]
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": "fp32"},
        "steps_per_print": 1000,
    }
    engine, *_ = deepspeed.initialize(model=m, model_parameters=groups, config=config)
    if not isinstance(engine.optimizer, BF16_Optimizer):
        raise RuntimeError(f"deepspeed chose {type(engine.optimizer).__name__}, not BF16_Optimizer")
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(2):
        x = torch.randint(0, 11, (2, 3), generator=data)
        loss = engine(x)
        engine.backward(loss)
        engine.step()
    case_dir = outdir / CASE
    engine.save_checkpoint(str(case_dir), tag=TAG, client_state=CLIENT_STATE)
    weights, optim = OrderedDict(), OrderedDict()
    for name, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        weights[name] = safe_get_full_fp32_param(p).clone()
        for key in OPTIM_KEYS:
            optim[f"{name}.{key}"] = safe_get_full_optimizer_state(p, key).clone()
    paddings = list(engine.optimizer.group_paddings)
    all_paddings = [None] * world
    torch.distributed.all_gather_object(all_paddings, paddings)
    if rank == 0:
        torch.save(dict(weights), case_dir / "reference.pt")
        torch.save(dict(optim), case_dir / "reference_optim.pt")
        (case_dir / ".paddings.json").write_text(json.dumps(all_paddings))
    torch.distributed.barrier()
    engine.destroy()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


README = """# DeepSpeed BF16_Optimizer golden fixture

Made by `conformance/python/deepspeed/make_bf16_fixtures.py` with **deepspeed {ds}** and **torch {torch}** on
the CPU accelerator, gloo on 127.0.0.1: a real `engine.save_checkpoint` by DeepSpeed's `BF16_Optimizer` (bf16,
ZeRO stage 1, `"data_types": {{"grad_accum_dtype": "fp32"}}`; the CPU accelerator runs it), of
`make_fixtures.py`'s small model after two AdamW steps at 2 ranks. Its
`bf16_zero_pp_rank_R_mp_rank_00_optim_states.pt` files hold `single_partition_of_fp32_groups`,
`group_paddings` and `param_slice_mappings`, and no `zero_stage`. Do not edit by hand. Regenerate with

    {command}

and prove the committed files are reproducible with

    .venv/bin/python conformance/python/deepspeed/make_bf16_fixtures.py /tmp/fresh-deepspeed-bf16
    .venv/bin/python conformance/python/deepspeed/check_reproducible.py conformance/fixtures/deepspeed_bf16 /tmp/fresh-deepspeed-bf16

## Cases

| case | content |
|---|---|
| `{case}` | {description} |
| `{universal}` | `ds_to_universal` of `{case}` (every parameter's `fp32.pt`, `exp_avg.pt`, ... joined by DeepSpeed) |

`{case}/reference.pt` holds the fp32 master weights of each trained parameter as DeepSpeed gathers them from
the ranks (`deepspeed.utils.safe_get_full_fp32_param`), `reference_optim.pt` its `exp_avg` and `exp_avg_sq`
(`safe_get_full_optimizer_state`), and `expected.json` the world size, each rank's `group_paddings`, the
references' names in order and the client state.
"""


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "--worker":
        worker(int(argv[2]), int(argv[3]), int(argv[4]), Path(argv[5]))
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1]).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(outdir / CASE, ignore_errors=True)
    shutil.rmtree(outdir / UNIVERSAL, ignore_errors=True)
    port = make_fixtures.free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    procs = [
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(r), str(WORLD), str(port), str(outdir)],
                         env=env, stdout=subprocess.DEVNULL)
        for r in range(WORLD)
    ]
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise RuntimeError(f"worker exit codes {codes}")

    import deepspeed
    import torch

    import torchtree

    case_dir = outdir / CASE
    make_fixtures.universal(case_dir, outdir / UNIVERSAL)
    paddings_file = case_dir / ".paddings.json"
    paddings = json.loads(paddings_file.read_text())
    paddings_file.unlink()
    describe = lambda d: [  # noqa: E731
        {"name": k, "dtype": torchtree.dtype_name(v.dtype), "shape": list(v.shape)} for k, v in d.items()
    ]
    write_json(case_dir / "expected.json", {
        "case": CASE,
        "description": DESCRIPTION,
        "optimizer": "BF16_Optimizer",
        "world_size": WORLD,
        "tag": TAG,
        "group_paddings": paddings,
        "reference": describe(torch.load(case_dir / "reference.pt")),
        "reference_optim": describe(torch.load(case_dir / "reference_optim.pt")),
        "client_state": CLIENT_STATE,
    })
    files = {
        p.relative_to(outdir).as_posix(): sha256_file(p)
        for d in (case_dir, outdir / UNIVERSAL)
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }
    here = HERE.parent
    write_json(outdir / "STAMP.json", {
        "command": COMMAND,
        "generator": "deepspeed/make_bf16_fixtures.py",
        "inputs_sha256": {name: sha256_file(here / name) for name in INPUTS},
        "files": files,
        "deepspeed": deepspeed.__version__,
        "torch": torchtree.public_torch_version(),
        "torch_build": torch.__version__,
        "python": platform.python_version(),
        "pinned_env": pinenv.PINNED_ENV,
        "training_derived": TRAINING_DERIVED,
    })
    (outdir / "README.md").write_text(README.format(ds=deepspeed.__version__, torch=torchtree.public_torch_version(),
                                                     command=COMMAND, case=CASE, universal=UNIVERSAL,
                                                     description=DESCRIPTION),
                                      encoding="utf-8")
    print(f"{CASE}: {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
