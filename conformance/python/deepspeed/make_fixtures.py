#!/usr/bin/env python3
"""Generate the DeepSpeed golden fixtures: real ZeRO saves by deepspeed (CPU accelerator, gloo).

Usage::

    .venv/bin/python conformance/python/deepspeed/make_fixtures.py OUTDIR

Starts one process (world size 1) and two processes (world size 2) that meet over gloo on 127.0.0.1; each
trains the same small model (an embedding tied to the output layer, two linear layers in two param groups
with their own weight decay, a frozen linear layer, a float and an integer buffer; odd sizes, so that
DeepSpeed pads) for two AdamW steps under ZeRO stages 1, 2 and 3 in turn and calls
``engine.save_checkpoint(<case>, client_state=...)``. World size 1 trains in fp32, world size 2 in bf16
mixed precision (fp32 master weights), which DeepSpeed's CPU accelerator supports. Then
``ds_to_universal`` turns the stage 2 and 3 world-size-2 checkpoints into universal checkpoints. It
writes, under ``OUTDIR/<case>/``:

* the checkpoint (``latest``, ``global_step2/``, the ``zero_to_fp32.py`` DeepSpeed copies beside them), or
  for universal cases ``latest_universal`` and ``global_step2_universal/``;
* ``reference.pt``: what DeepSpeed's own consolidation returns for it
  (``zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``; for a universal checkpoint the ``param`` of
  each ``zero/<name>/fp32.pt``), saved with ``torch.save``;
* ``expected.json``: the case, its ZeRO stage and world size, the reference's names in order, and the
  client state.

plus ``OUTDIR/STAMP.json`` and ``OUTDIR/README.md``. Deterministic: pinned environment (``pinenv.py``),
seeds, one thread; ``check_reproducible.py`` compares a fresh run with the committed files, byte for byte
except the values of training math (``conformance/fixtures/REPRODUCIBILITY.md``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # conformance/python: pinenv, torchtree

import pinenv  # noqa: E402

pinenv.pin_environment()
os.environ["DS_ACCELERATOR"] = "cpu"

import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

warnings.filterwarnings("ignore")

COMMAND = ".venv/bin/python conformance/python/deepspeed/make_fixtures.py conformance/fixtures/deepspeed"
INPUTS = ("deepspeed/make_fixtures.py", "pinenv.py")
#: case -> (ZeRO stage, world size, description)
CASES: dict[str, tuple[int, int, str]] = {
    "zero1_w1": (1, 1, "ZeRO 1, 1 rank, fp32"),
    "zero2_w1": (2, 1, "ZeRO 2, 1 rank, fp32"),
    "zero3_w1": (3, 1, "ZeRO 3, 1 rank, fp32"),
    "zero1_w2": (1, 2, "ZeRO 1, 2 ranks, bf16 with fp32 master weights"),
    "zero2_w2": (2, 2, "ZeRO 2, 2 ranks, bf16 with fp32 master weights"),
    "zero3_w2": (3, 2, "ZeRO 3, 2 ranks, bf16 with fp32 master weights"),
    "zero2_elastic_w2": (2, 2, "ZeRO 2, 2 ranks, bf16, elastic_checkpoint (the optimizer state per group, unpadded)"),
}
#: universal case -> the case it is converted from
UNIVERSAL: dict[str, str] = {"universal_zero2_w2": "zero2_w2", "universal_zero3_w2": "zero3_w2"}
TAG = "global_step2"
CLIENT_STATE: dict[str, Any] = {"epoch": 3, "note": "fixture", "sampler": {"seed": 7, "order": [2, 0, 1]}}
#: what comes out of training math (reproducible.py's rules); everything else is compared exactly
TRAINING_DERIVED = {"*.pt": {"tensors": ["*"]}}


def model():
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(11, 6)
            self.l1 = nn.Linear(6, 7)
            self.l2 = nn.Linear(7, 5)
            self.frozen = nn.Linear(5, 3)
            self.out = nn.Linear(6, 11, bias=False)
            self.out.weight = self.emb.weight  # tied
            self.register_buffer("scale", torch.tensor([0.5, 0.25, 2.0]))
            self.register_buffer("seen", torch.tensor([4, 1], dtype=torch.int64))
            for p in self.frozen.parameters():
                p.requires_grad_(False)

        def forward(self, x):
            h = self.emb(x)
            a = self.l2(torch.tanh(self.l1(h)))
            return (self.out(h).pow(2).mean() + self.frozen(a).pow(2).mean() * self.scale.sum()).float()

    torch.manual_seed(0)
    return Net()


def worker(rank: int, world: int, port: int, outdir: Path) -> None:
    """One rank: every case of this world size in turn."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import logging

    import torch
    import deepspeed

    deepspeed.ops.__compatible_ops__ = {}  # no JIT op (deepspeed_shm_comm) is built
    deepspeed.utils.logger.setLevel(logging.ERROR)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for case, (stage, w, _) in CASES.items():
        if w != world:
            continue
        m = model()
        groups = [
            {"params": [m.emb.weight], "weight_decay": 0.0},
            {"params": [m.l1.weight, m.l1.bias, m.l2.weight, m.l2.bias], "weight_decay": 0.1},
        ]
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
            "zero_optimization": {"stage": stage, **({"elastic_checkpoint": True} if "elastic" in case else {})},
            "bf16": {"enabled": world > 1},
            "steps_per_print": 1000,
        }
        engine, *_ = deepspeed.initialize(model=m, model_parameters=groups, config=config)
        data = torch.Generator().manual_seed(100 + rank)
        for _ in range(2):
            x = torch.randint(0, 11, (2, 3), generator=data)
            loss = engine(x)
            engine.backward(loss)
            engine.step()
        engine.save_checkpoint(str(outdir / case), tag=TAG, client_state=CLIENT_STATE)
        torch.distributed.barrier()
        engine.destroy()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, outdir: Path) -> None:
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    procs = [
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(r), str(world), str(port), str(outdir)],
                         env=env, stdout=subprocess.DEVNULL)
        for r in range(world)
    ]
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise RuntimeError(f"world size {world}: worker exit codes {codes}")


def universal(src: Path, dst: Path) -> None:
    """``ds_to_universal`` of ``src``'s tag into ``dst`` (its own process: it starts worker pools)."""
    dst.mkdir(parents=True)
    args = ["--input_folder", str(src / TAG), "--output_folder", str(dst / f"{TAG}_universal"),
            "--num_extract_workers", "1", "--num_merge_workers", "1", "--inject_missing_state"]
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def reference(case_dir: Path, is_universal: bool):
    """DeepSpeed's own consolidation of the checkpoint in ``case_dir``."""
    from collections import OrderedDict

    import torch

    if is_universal:
        tag_dir = case_dir / (case_dir / "latest_universal").read_text().strip()
        out = OrderedDict()
        for d in sorted((tag_dir / "zero").iterdir()):
            if (d / "fp32.pt").is_file():
                v = torch.load(d / "fp32.pt", weights_only=False)
                out[d.name] = v["param"] if isinstance(v, dict) else v
        return out
    import contextlib
    import io

    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return get_fp32_state_dict_from_zero_checkpoint(str(case_dir))


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


README = """# DeepSpeed golden fixtures

Made by `conformance/python/deepspeed/make_fixtures.py` with **deepspeed {ds}** and **torch {torch}** on the
CPU accelerator, gloo on 127.0.0.1. Each case is a real `engine.save_checkpoint` of a small model (an
embedding tied to the output layer, two linear layers in two param groups, a frozen linear layer, a float and
an int64 buffer; odd sizes, so that ZeRO pads) after two AdamW steps, with a client state; universal cases are
`ds_to_universal`'s output. Do not edit by hand. Regenerate with

    {command}

and prove the committed files are reproducible with

    .venv/bin/python conformance/python/deepspeed/make_fixtures.py /tmp/fresh-deepspeed
    .venv/bin/python conformance/python/deepspeed/check_reproducible.py conformance/fixtures/deepspeed /tmp/fresh-deepspeed

Everything but the values of training math is compared byte for byte; the tensors of the `.pt` files are
compared within the tolerance of `conformance/fixtures/REPRODUCIBILITY.md`.

## Cases

| case | content |
|---|---|
{rows}

Each `<case>/` holds the checkpoint, `reference.pt` (DeepSpeed's own consolidation,
`get_fp32_state_dict_from_zero_checkpoint`, or the universal checkpoint's `fp32.pt` parameters) and
`expected.json` (stage, world size, the reference's names in order, the client state).
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
    for case in [*CASES, *UNIVERSAL]:
        shutil.rmtree(outdir / case, ignore_errors=True)
    run_world(1, outdir)
    run_world(2, outdir)
    for case, src in UNIVERSAL.items():
        universal(outdir / src, outdir / case)

    import deepspeed
    import torch

    import torchtree

    files: dict[str, str] = {}
    rows = []
    for case in [*CASES, *UNIVERSAL]:
        is_universal = case in UNIVERSAL
        stage, world, description = CASES[UNIVERSAL.get(case, case)]
        if is_universal:
            description = f"ds_to_universal of {UNIVERSAL[case]} ({description})"
        ref = reference(outdir / case, is_universal)
        torch.save(dict(ref), outdir / case / "reference.pt")
        write_json(outdir / case / "expected.json", {
            "case": case,
            "description": description,
            "stage": stage,
            "world_size": world,
            "universal": is_universal,
            "tag": f"{TAG}_universal" if is_universal else TAG,
            "reference": [{"name": k, "dtype": torchtree.dtype_name(v.dtype), "shape": list(v.shape)} for k, v in ref.items()],
            "client_state": CLIENT_STATE,
        })
        rows.append(f"| `{case}` | {description} |")
        for p in sorted((outdir / case).rglob("*")):
            if p.is_file():
                files[p.relative_to(outdir).as_posix()] = sha256_file(p)
        print(f"{case}: {len(ref)} reference tensors")
    here = HERE.parent
    write_json(outdir / "STAMP.json", {
        "command": COMMAND,
        "generator": "deepspeed/make_fixtures.py",
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
                                                     command=COMMAND, rows="\n".join(rows)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
