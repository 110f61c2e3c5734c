#!/usr/bin/env python3
"""Generate the hfai golden fixtures: real multi-process saves with ``hfai_ref.save`` over gloo.

Usage::

    .venv/bin/python conformance/python/hfai/make_fixtures.py OUTDIR

For every case in ``CASES`` this starts ``world`` processes that form a gloo process group (a file
store for the rendezvous, gloo over the loopback interface), build the same small model (a 2-layer ``nn.TransformerEncoder`` with a BatchNorm1d head,
wrapped in ``DistributedDataParallel``), train it for a few real AdamW steps on per-rank data, and
call ``hfai_ref.save`` (``hfai_ref.LARGE_SIZE`` lowered to ``LARGE_SIZE`` so that chunking
happens on small tensors). It writes, under ``OUTDIR/<case>/``:

* ``ckpt/PART_{rank:03d}.pt``: the checkpoint;
* ``source.pt``: what rank 0 handed to ``save`` (state dicts, buffer names, optimizer state
  dicts, ``others``), so that the Rust writer can be fed the same input and compared byte for
  byte;
* ``expected.json``: what ``hfai_ref.load`` returns for ``ckpt/``, as the typed tree and tensor
  records of ``conformance/python/torchtree.py`` (format of ``conformance/fixtures/torch``).

plus ``OUTDIR/STAMP.json`` and ``OUTDIR/README.md``. Deterministic: pinned environment
(``pinenv.py``), seeds, one thread, deterministic algorithms; ``check_reproducible.py`` compares
a fresh run with the committed files byte for byte, except the values of training math
(``TRAINING_DERIVED``), which differ in the last bits from one CPU to another and are compared within a
tolerance (``conformance/fixtures/REPRODUCIBILITY.md``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # conformance/python: pinenv, torchtree
sys.path.insert(0, str(HERE))

import pinenv  # noqa: E402

pinenv.pin_environment()

import datetime  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import numpy  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import hfai_ref  # noqa: E402
import torchtree  # noqa: E402

warnings.filterwarnings("ignore")

#: the lowered threshold (bytes): 3072-byte in_proj weights and 2048-byte feed-forward weights
#: (and their AdamW moments, and the bf16 2048-byte weight of the aux model) are chunked.
LARGE_SIZE = 2000
COMMAND = ".venv/bin/python conformance/python/hfai/make_fixtures.py conformance/fixtures/hfai"
#: files whose code decides the fixtures' bytes; their sha256 go into STAMP.json
INPUTS = ("hfai/make_fixtures.py", "hfai/hfai_ref.py", "pinenv.py", "torchtree.py")

#: case -> (world size, what is saved, description)
CASES: dict[str, tuple[int, str, str]] = {
    "single_n1": (1, "single", "one model (DDP transformer + BatchNorm), one AdamW, others; 1 process"),
    "single_n2": (2, "single", "one model, one AdamW, others; 2 processes"),
    "single_n3": (3, "single", "one model, one AdamW, others; 3 processes (chunks of 171/171/170)"),
    "multi_n2": (
        2,
        "multi",
        "two models (DDP transformer; bf16 MLP) and two optimizers (AdamW; SGD momentum); 2 processes",
    ),
    "noopt_n3": (3, "noopt", "one model, optimizer=None, others=None; 3 processes"),
}
STEPS = 3
#: what comes out of training math (reproducible.py's rules): compared within a tolerance by
#: check_reproducible.py, every other byte exactly. Optimizer step counts are exact.
TRAINING_DERIVED = {
    "*/ckpt/PART_*.pt": {"tensors": ["model.*", "optimizer.*", "!*.step"], "values": ["loss"]},
    "*/source.pt": {"tensors": ["models.*", "optimizers.*", "!*.step"], "values": ["others.loss"]},
    "*/expected.json": {"tensors": ["model.*", "optimizer.*", "!*.step"], "values": ["loss"]},
}


def setup_torch() -> None:
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False


class Net(nn.Module):
    """A 2-layer transformer encoder over 8-feature tokens, mean-pooled, BatchNorm, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        layer = nn.TransformerEncoderLayer(
            d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.norm = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(self.embed(x)).mean(1)))


def freeze_null_directions(model: Net) -> None:
    """Zero the gradient of the attention key biases.

    A key bias adds the same amount to every score of a query, which the softmax cancels: its
    gradient is zero up to rounding, and AdamW turns that rounding noise into full-size steps whose
    sign depends on the CPU (see ``conformance/fixtures/REPRODUCIBILITY.md``). With a zero gradient
    the key biases only decay. For the same reason the BatchNorm runs in eval mode during the steps:
    in train mode it cancels per-feature shifts and scales of the pooled features.
    """
    for layer in model.encoder.layers:
        bias = layer.self_attn.in_proj_bias
        d = bias.numel() // 3

        def hook(grad: torch.Tensor, d: int = d) -> torch.Tensor:
            grad = grad.clone()
            grad[d : 2 * d] = 0
            return grad

        bias.register_hook(hook)


def aux_model() -> nn.Module:
    """A bfloat16 MLP: its 64x16 weight (2048 bytes) is large under ``LARGE_SIZE``."""
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 8)).to(torch.bfloat16)


def worker(case: str, rank: int, world: int, store: Path, outdir: Path) -> None:
    """One rank: join the gloo group, train, ``hfai_ref.save``; rank 0 also writes source.pt."""
    setup_torch()
    hfai_ref.LARGE_SIZE = LARGE_SIZE
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )
    kind = CASES[case][1]
    torch.manual_seed(0)
    model = Net()
    freeze_null_directions(model)
    net = DistributedDataParallel(model)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    aux = aux_model()
    aux_opt = torch.optim.SGD(aux.parameters(), lr=0.1, momentum=0.9)

    data = torch.Generator().manual_seed(1000 + rank)  # each rank trains on its own shard
    with torch.no_grad():  # running statistics from one train-mode pass; the steps run in eval mode
        net(torch.randn(4, 6, 8, generator=data))
    net.eval()
    loss_value = 0.0
    for _ in range(STEPS):
        x = torch.randn(4, 6, 8, generator=data)
        y = torch.randint(0, 5, (4,), generator=data)
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        loss_value = float(loss.item())
        if kind == "multi":
            xa = torch.randn(3, 16, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
            la = aux(xa).float().pow(2).mean()
            aux_opt.zero_grad()
            la.backward()
            aux_opt.step()

    others: dict[str, Any] | None = {
        "epoch": 1,
        "step": STEPS,
        "loss": loss_value,
        "scheduler": sched.state_dict(),
        "config": {"name": "tiny-transformer", "layers": 2, "lr": 1e-2},
    }
    if kind == "single":
        models: list[nn.Module] = [net]
        optimizers: list[torch.optim.Optimizer] = [opt]
    elif kind == "multi":
        models, optimizers = [net, aux], [opt, aux_opt]
    else:
        models, optimizers, others = [net], [], None

    ckpt = outdir / case / "ckpt"
    hfai_ref.save(
        ckpt,
        models[0] if len(models) == 1 else models,
        None if not optimizers else optimizers[0] if len(optimizers) == 1 else optimizers,
        others,
    )
    if rank == 0:
        source = {
            "models": [
                {"state_dict": m.state_dict(), "buffers": [n for n, _ in m.named_buffers()]}
                for m in models
            ],
            "optimizers": [o.state_dict() for o in optimizers],
            "others": {} if others is None else others,
        }
        torch.save(source, outdir / case / "source.pt")
    dist.barrier()
    dist.destroy_process_group()


def run_case(case: str, outdir: Path) -> None:
    """Starts the case's ranks; they meet through a file store (no TCP port to race for) and gloo
    connects them over the loopback interface only."""
    world = CASES[case][0]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    with tempfile.TemporaryDirectory() as rendezvous:
        store = Path(rendezvous) / "store"
        procs = [
            subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", case, str(r), str(world), str(store), str(outdir)],
                env=env,
            )
            for r in range(world)
        ]
        codes = [p.wait(timeout=1200) for p in procs]
    if any(codes):
        raise RuntimeError(f"{case}: worker exit codes {codes}")


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def expected(case: str, outdir: Path) -> dict[str, Any]:
    """What ``hfai_ref.load`` returns for the case's checkpoint, as typed tree + tensor records."""
    world, kind, description = CASES[case]
    ckpt = outdir / case / "ckpt"
    loaded = hfai_ref.load(ckpt)
    tree, tensors, _ = torchtree.render(loaded)
    part0 = torch.load(ckpt / "PART_000.pt", weights_only=True)
    models, optims = part0["model"], part0["optimizer"]
    # leaf names of the chunked tensors in the loaded value (index only when there are several)
    large = sorted(
        [f"model.{'' if len(models) == 1 else f'{m}.'}{name}" for m, (_, lg) in enumerate(models) for name in lg]
        + [
            f"optimizer.{'' if len(optims) == 1 else f'{o}.'}state.{k1}.{k2}"
            for o, (_, lg) in enumerate(optims)
            for (k1, k2) in lg
        ]
    )
    source = torch.load(outdir / case / "source.pt", weights_only=True)
    return {
        "case": case,
        "description": description,
        "kind": kind,
        "nshards": world,
        "large_size": LARGE_SIZE,
        "large": large,
        "buffers": [m["buffers"] for m in source["models"]],
        "tree": tree,
        "tensors": tensors,
    }


README = """# hfai golden fixtures

Made by `conformance/python/hfai/make_fixtures.py` with **torch {torch}** and gloo on 127.0.0.1:
each case is a real multi-process `hfai_ref.save` (the reference implementation of
`hfai.checkpoint.dist_ckpt` in `conformance/python/hfai/hfai_ref.py`, written from
`shared/specs/hfai.md`; hfai itself cannot be installed) of a 2-layer `nn.TransformerEncoder`
model with a BatchNorm1d head, wrapped in DistributedDataParallel (keys start with `module.`),
after {steps} real AdamW steps on per-rank data. `LARGE_SIZE` is lowered to {large} bytes so
that in_proj / feed-forward weights and their AdamW moments are chunked across ranks. Do not edit
by hand. Regenerate with

    {command}

and prove the committed files are reproducible with

    .venv/bin/python conformance/python/hfai/make_fixtures.py /tmp/fresh-hfai
    .venv/bin/python conformance/python/hfai/check_reproducible.py conformance/fixtures/hfai /tmp/fresh-hfai

Everything but the values of training math is byte-reproducible and compared exactly. The trained
parameters, BatchNorm statistics, optimizer states and the loss in `others` (`STAMP.json`'s
`training_derived`) go through the math library's CPU-specific code: they are compared within a
tolerance of 2**-14 of each tensor's largest magnitude (4 units in the last place for bfloat16), and the
CRC-32s, serialization checksums and digests computed from them by recomputation
(`conformance/fixtures/REPRODUCIBILITY.md`). To keep the training well conditioned, the steps run with
the BatchNorm in eval mode (its statistics come from one train-mode pass before them) and the attention
key biases get a zero gradient: in both places the gradient is zero up to rounding, and AdamW would turn
that rounding noise into full-size steps whose sign depends on the CPU.

## Cases

| case | parts | content |
|---|---|---|
{rows}

Each `<case>/` holds `ckpt/PART_XXX.pt` (the checkpoint), `source.pt` (what rank 0 passed to
`save`: `{{'models': [{{'state_dict', 'buffers'}}], 'optimizers': [state_dict], 'others'}}`)
and `expected.json` (what `hfai_ref.load` returns: `tree` and `tensors` in the typed-tree format of
`conformance/fixtures/torch/README.md`, plus `nshards`, `large_size`, `large` (the chunked
entries) and `buffers`).

Related tools in `conformance/python/hfai/`: `check_load.py` (do checkpoints written by ckpt-hfai
load with `torch.load(weights_only=True)` and `hfai_ref.load`, with hfai's layout and the values of
a reference?), `big.py` (the real 256 MiB threshold case, generated at test time, not committed),
`bench.py` (save/load throughput of `hfai_ref` on a 1 GiB, 4-part checkpoint).
"""


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "--worker":
        case, rank, world, store, outdir = argv[2], int(argv[3]), int(argv[4]), Path(argv[5]), Path(argv[6])
        worker(case, rank, world, store, outdir)
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    setup_torch()
    outdir = Path(argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for case in CASES:
        shutil.rmtree(outdir / case, ignore_errors=True)
        run_case(case, outdir)
        write_json(outdir / case / "expected.json", expected(case, outdir))
        for p in sorted((outdir / case).rglob("*")):
            if p.is_file():
                files[p.relative_to(outdir).as_posix()] = sha256_file(p)
        print(f"{case}: {CASES[case][0]} part(s)")
    here = HERE.parent
    write_json(
        outdir / "STAMP.json",
        {
            "command": COMMAND,
            "generator": "hfai/make_fixtures.py",
            "inputs_sha256": {name: sha256_file(here / name) for name in INPUTS},
            "large_size": LARGE_SIZE,
            "files": files,
            "torch": torchtree.public_torch_version(),
            "torch_build": torch.__version__,
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "pinned_env": pinenv.PINNED_ENV,
            "training_derived": TRAINING_DERIVED,
        },
    )
    rows = "\n".join(f"| `{c}` | {w} | {d} |" for c, (w, _, d) in CASES.items())
    (outdir / "README.md").write_text(
        README.format(
            torch=torchtree.public_torch_version(), steps=STEPS, large=LARGE_SIZE, command=COMMAND, rows=rows
        ),
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
