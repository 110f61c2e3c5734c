#!/usr/bin/env python3
"""Generate the Megatron-Core golden fixtures: real ``dist_checkpointing.save`` runs (torch_dist backend,
gloo on 127.0.0.1, CPU).

Usage::

    .venv/bin/python conformance/python/megatron/make_fixtures.py OUTDIR

Cases (``CASES``):

* ``gpt_tp1``, ``gpt_tp2``: a ``GPTModel`` built with ``get_gpt_layer_local_spec()`` and
  ``use_cpu_initialization=True`` (2 layers, hidden 16, 4 attention heads in 2 query groups of 4 channels,
  SwiGLU MLP of 24, RMSNorm, RoPE, untied output layer) saved at tensor-parallel size 1 and 2 with the state
  Megatron-LM saves beside the model (``iteration``, ``args`` as an ``argparse.Namespace`` with the head
  layout, ``checkpoint_version``); the same seed makes the same weights, so both hold one model;
* ``sharded_w2``: a sharded state dict written by 2 ranks: a tensor split on its first dimension, one split
  on its second, a replicated one, per-rank ``ShardedObject``s and common values;
* ``distopt_dp_reshardable``, ``distopt_dp_zero_gather_scatter``: the GPTModel under megatron's
  ``DistributedDataParallel`` at 2 data-parallel ranks after one step of its ``DistributedOptimizer``
  (Adam), the optimizer state in each of megatron-core 0.16's two DP layouts that save (flat per-bucket
  buffers as tensors; the per-rank state as objects). Megatron's DDP and optimizer ask for CUDA tensors:
  ``cpu_only_optimizer`` makes them on the CPU. Each rank's own tensors (key, offset in the global tensor,
  data) are the reference, ``local_rank<R>.pt``.

Saves use one writer thread per rank (``__R_0.distcp``): with megatron's default of two, the order of
the items in ``.metadata`` follows which thread finishes first. ``torch.cuda.synchronize`` and
``torch.cuda.current_device`` are patched in the saving processes (the saver
calls them; loading needs no patch). ``save_id`` (a random uuid) is fixed and the checkpoint directory is
given relative to OUTDIR, so that ``.metadata`` is reproducible. It writes, under ``OUTDIR/<case>/``:

* ``ckpt/``: the checkpoint (``metadata.json``, ``common.pt``, ``.metadata``, ``__R_N.distcp``);
* ``reference.pt``: what ``dist_checkpointing.load`` returns in a 1-process job (tensor-parallel size 1:
  every tensor whole), keyed as ckpt names the entries with ``--unstack-layers`` (the sharded key, with the
  layer number after ``layers.`` for layer-stacked tensors);
* ``expected.json``: the case, its tensor-parallel size, the reference's names, the common values.

plus ``OUTDIR/STAMP.json`` and ``OUTDIR/README.md``. ``check_reproducible.py`` (the DeepSpeed fixtures'
checker) compares a fresh run with the committed files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import pinenv  # noqa: E402

pinenv.pin_environment()

import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

warnings.filterwarnings("ignore")

COMMAND = ".venv/bin/python conformance/python/megatron/make_fixtures.py conformance/fixtures/megatron"
INPUTS = ("megatron/make_fixtures.py", "pinenv.py")
#: case -> (processes, tensor-parallel size, description)
CASES: dict[str, tuple[int, int, str]] = {
    "gpt_tp1": (1, 1, "GPTModel (local spec), tensor-parallel 1"),
    "gpt_tp2": (2, 2, "the same GPTModel, tensor-parallel 2"),
    "sharded_w2": (2, 1, "a sharded state dict of 2 ranks: split, replicated and per-rank entries"),
    "distopt_dp_reshardable": (2, 1, "the GPTModel under DDP, 2 data-parallel ranks, one Adam step of megatron's "
                               "DistributedOptimizer, its state in the dp_reshardable layout"),
    "distopt_dp_zero_gather_scatter": (2, 1, "the same, the optimizer state in the dp_zero_gather_scatter layout"),
}
ITERATION = 5
TRAINING_DERIVED = {"*.distcp": {"items": ["*"]}, "*/reference.pt": {"tensors": ["*"]},
                    "*/local_rank*.pt": {"tensors": ["*"]}}
ARGS = {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 4, "num_query_groups": 2, "kv_channels": 4,
        "ffn_hidden_size": 24, "swiglu": True, "group_query_attention": True, "normalization": "RMSNorm",
        "padded_vocab_size": 32, "seq_length": 8}


def patch_cuda() -> None:
    import torch

    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def cpu_only_optimizer() -> None:
    """What megatron's ``DistributedDataParallel`` and ``DistributedOptimizer`` need to run on the CPU: tensors
    asked for on ``cuda`` made on the CPU (``torch.empty`` zeroed, so that the padding of megatron's buffers is
    reproducible), parameters that say they are CUDA tensors (the optimizer accepts only
    those), the CUDA RNG tracker over the CPU generator. Only the distributed-optimizer cases use it; once per
    process."""
    import torch

    if getattr(torch, "_ckpt_cpu_only", False):
        return
    torch._ckpt_cpu_only = True  # type: ignore[attr-defined]

    def on_cpu(f):
        def g(*a, **k):
            if k.get("device") is not None and str(k["device"]).startswith("cuda"):
                k["device"] = "cpu"
            return f(*a, **k)

        return g

    for name in ("tensor", "zeros", "ones", "full", "arange", "zeros_like"):
        setattr(torch, name, on_cpu(getattr(torch, name)))
    # Megatron's grad and param buffers come from `torch.empty`: their padding would be whatever the memory
    # held, and the fixtures not reproducible. Zeroed instead.
    torch.empty = on_cpu(torch.zeros)
    torch.empty_like = on_cpu(torch.zeros_like)
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.is_available = lambda: False
    plain_type = torch.Tensor.type

    def cuda_type(self, *a, **k):
        t = plain_type(self, *a, **k)
        return t.replace("torch.", "torch.cuda.", 1) if not a and not k and isinstance(t, str) else t

    torch.Tensor.type = cuda_type
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state
    torch.cuda.manual_seed = lambda *a, **k: None
    from megatron.core.tensor_parallel import random as tpr

    tpr._set_cuda_rng_state = lambda *a, **k: None
    tpr.get_cuda_rng_tracker().add("model-parallel-rng", 0)


def distopt_state(layout: str) -> dict[str, Any]:
    """The GPTModel under megatron's DDP with the distributed optimizer after one Adam step, as Megatron-LM
    saves it: ``{"model", "optimizer", "iteration", "args"}``."""
    import argparse

    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    cpu_only_optimizer()
    model = gpt(1)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=True), [ddp])
    ids = torch.arange(8).view(1, 8) % ARGS["padded_vocab_size"]
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril().logical_not()
    ddp(ids, torch.arange(8).view(1, 8), mask, labels=ids).sum().backward()
    ddp.finish_grad_sync()
    opt.step()
    sd = ddp.sharded_state_dict()
    return {"model": sd, "optimizer": opt.sharded_state_dict(sd, sharding_type=layout), "iteration": ITERATION,
            "args": argparse.Namespace(**ARGS)}


def local_shards(state: Any) -> list[dict[str, Any]]:
    """Every ShardedTensor of a state dict as this rank holds it: its key, its offset in the global tensor, its
    data (what the test reads back from the checkpoint's region)."""
    from megatron.core.dist_checkpointing import ShardedTensor

    out: list[dict[str, Any]] = []

    def walk(v: Any) -> None:
        if isinstance(v, ShardedTensor):
            if v.flattened_range is None:
                out.append({"key": v.key, "offset": list(v.global_offset), "data": v.data.detach().clone()})
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(state)
    return out


def fix_save_id(case: str, rank: int) -> None:
    import uuid

    import torch.distributed.checkpoint.filesystem as fs

    fixed = str(uuid.uuid5(uuid.NAMESPACE_URL, f"ckpt-megatron-fixture/{case}/{rank}"))
    fs._generate_uuid = lambda: fixed  # type: ignore[attr-defined]


def gpt(tp: int):
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=ARGS["num_layers"], hidden_size=ARGS["hidden_size"], num_attention_heads=ARGS["num_attention_heads"],
        num_query_groups=ARGS["num_query_groups"], kv_channels=ARGS["kv_channels"], ffn_hidden_size=ARGS["ffn_hidden_size"],
        use_cpu_initialization=True, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, normalization="RMSNorm", tensor_model_parallel_size=tp, pipeline_dtype=torch.float32)
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                    vocab_size=ARGS["padded_vocab_size"], max_sequence_length=ARGS["seq_length"],
                    position_embedding_type="rope", share_embeddings_and_output_weights=False)


def sharded_state(rank: int, world: int) -> dict[str, Any]:
    """The ``sharded_w2`` state dict of ``rank`` (a 1-rank job describes whole tensors)."""
    import torch
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor

    g = torch.Generator().manual_seed(11)
    rows = torch.randn(6, 3, generator=g)
    cols = torch.arange(20, dtype=torch.float32).reshape(4, 5) / 8
    rep = torch.tensor([1, 2, 3], dtype=torch.int64)
    if world == 1:
        return {
            "rows": ShardedTensor.from_rank_offsets("layer.rows", rows.clone()),
            "cols": ShardedTensor.from_rank_offsets("layer.cols", cols.clone()),
            "rep": ShardedTensor.from_rank_offsets("rep", rep.clone()),
        }
    return {
        "rows": ShardedTensor.from_rank_offsets("layer.rows", rows.chunk(world, 0)[rank].clone(), (0, rank, world)),
        "cols": ShardedTensor.from_rank_offsets("layer.cols", cols[:, :3].clone() if rank == 0 else cols[:, 3:].clone(), ),
        "rep": ShardedTensor.from_rank_offsets("rep", rep.clone(), replica_id=rank),
        "rng": ShardedObject("rng_state", {"seed": 1000 + rank, "rank": rank}, (world,), (rank,)),
        "iteration": 7,
        "note": {"text": "sharded fixture", "ranks": world},
    }


def worker(cases: str, rank: int, world: int, port: int, outdir: Path) -> None:
    """One rank of a job that saves each of ``cases`` (comma-separated) in turn, or (``--reference``) the
    1-process job that loads every case."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    patch_cuda()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state

    os.chdir(outdir)
    if cases == "--reference":
        reference_all(outdir)
    else:
        for case in cases.split(","):
            save_case(case, rank, world, outdir)
            parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def save_case(case: str, rank: int, world: int, outdir: Path) -> None:
    """This rank's part of the save of ``case``."""
    import argparse

    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state

    fix_save_id(case, rank)
    _, tp, _ = CASES[case]
    if case.startswith("distopt_"):
        parallel_state.initialize_model_parallel()
        state = distopt_state(case.removeprefix("distopt_"))
        (outdir / case).mkdir(exist_ok=True)
        torch.save(local_shards(state), outdir / case / f"local_rank{rank}.pt")
    elif case.startswith("gpt"):
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        state = {"model": gpt(tp).sharded_state_dict(), "iteration": ITERATION,
                 "args": argparse.Namespace(**ARGS), "checkpoint_version": 3.0}
    else:
        parallel_state.initialize_model_parallel()
        state = sharded_state(rank, world)
        from megatron.core.dist_checkpointing import ShardedTensor

        # the split on dimension 1: rank 0 holds columns 0..3, rank 1 columns 3..5
        cols = state["cols"].data
        state["cols"] = ShardedTensor("layer.cols", cols, cols.dtype, cols.shape, (4, 5), (0, 3 * rank),
                                      axis_fragmentations=None)
    ckpt = Path(case) / "ckpt"
    if rank == 0:
        ckpt.mkdir(parents=True)
    dist.barrier()
    # One writer thread per rank: with two, the order of the items in `.metadata` follows which thread
    # finished first.
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    dist_checkpointing.save(state, str(ckpt), sharded_strategy=TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1))
    dist.barrier()



def unstacked_name(key: str, offsets: tuple[int, ...], prepend: int) -> str:
    """The name ckpt gives a layer of a layer-stacked tensor (``decoder.layers.<i>.<rest>``)."""
    if prepend and ".layers." in f".{key}":
        head, rest = key.split("layers.", 1)
        return f"{head}layers.{offsets[0]}.{rest}"
    return key


def reference_all(outdir: Path) -> None:
    """``dist_checkpointing.load`` of every case in this 1-process job, saved as ``<case>/reference.pt``."""
    import torch
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory

    parallel_state.initialize_model_parallel()
    for case in CASES:
        ckpt = str(Path(case) / "ckpt")
        ref: dict[str, Any] = {}
        if case.startswith("distopt_"):
            continue  # each rank's own tensors are the reference (local_rank<R>.pt)
        if case.startswith("gpt"):
            sd = gpt(1).sharded_state_dict()
            loaded = dist_checkpointing.load(sd, ckpt)
            for k, sh in sd.items():
                if isinstance(sh, ShardedTensorFactory):
                    # SwiGLU's linear_fc1: saved as its two halves, loaded whole
                    built = sh.build()
                    first = next(v for v in (built.values() if isinstance(built, dict) else built) if isinstance(v, ShardedTensor))
                    ref[unstacked_name(sh.key, first.global_offset, first.prepend_axis_num)] = loaded[k]
                elif isinstance(sh, ShardedTensor):
                    ref[unstacked_name(sh.key, sh.global_offset, sh.prepend_axis_num)] = loaded[k]
        else:
            sd = sharded_state(0, 1)
            loaded = dist_checkpointing.load(sd, ckpt)
            ref = {sd[k].key: loaded[k] for k in sd}
        torch.save(ref, Path(case) / "reference.pt")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cases: str, world: int, outdir: Path) -> None:
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    procs = [
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", cases, str(r), str(world), str(port), str(outdir)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for r in range(world)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    if any(p.returncode for p in procs):
        for _, err in results:
            sys.stderr.write(err.decode(errors="replace")[-3000:])
        raise RuntimeError(f"{cases}: worker exit codes {[p.returncode for p in procs]}")


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


README = """# Megatron-Core golden fixtures

Made by `conformance/python/megatron/make_fixtures.py` with **megatron-core {mc}** and **torch {torch}**:
`dist_checkpointing.save` (torch_dist backend) over gloo on 127.0.0.1, on the CPU. Do not edit by hand.
Regenerate with

    {command}

and prove the committed files are reproducible with

    .venv/bin/python conformance/python/megatron/make_fixtures.py /tmp/fresh-megatron
    .venv/bin/python conformance/python/deepspeed/check_reproducible.py conformance/fixtures/megatron /tmp/fresh-megatron

## Cases

| case | content |
|---|---|
{rows}

Each `<case>/` holds `ckpt/` (the checkpoint), `reference.pt` (what `dist_checkpointing.load` returns in a
1-process job, every tensor whole, keyed as `ckpt inspect --unstack-layers` names the entries) and
`expected.json` (tensor-parallel size, the reference's names, the head layout in `args`).
"""


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "--worker":
        worker(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), Path(argv[6]))
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1]).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        shutil.rmtree(outdir / case, ignore_errors=True)
    # One job per world size, saving its cases in turn (the distributed-optimizer cases last: their CPU
    # patches stay in the process), then the 1-process job that loads them all.
    for world in sorted({w for w, _, _ in CASES.values()}):
        run(",".join(c for c, (w, _, _) in CASES.items() if w == world), world, outdir)
    run("--reference", 1, outdir)

    import megatron.core
    import torch

    import torchtree

    files: dict[str, str] = {}
    rows = []
    for case, (world, tp, description) in CASES.items():
        if case.startswith("distopt_"):
            locals_ = [torch.load(outdir / case / f"local_rank{r}.pt", weights_only=True) for r in range(world)]
            write_json(outdir / case / "expected.json", {
                "case": case, "description": description, "processes": world, "tensor_parallel": tp,
                "layout": case.removeprefix("distopt_"),
                "local": [[{"key": t["key"], "offset": t["offset"], "shape": list(t["data"].shape)} for t in ts]
                          for ts in locals_],
            })
            rows.append(f"| `{case}` | {description} |")
            for p in sorted((outdir / case).rglob("*")):
                if p.is_file():
                    files[p.relative_to(outdir).as_posix()] = sha256_file(p)
            print(f"{case}: {sum(len(ts) for ts in locals_)} local tensors")
            continue
        ref = torch.load(outdir / case / "reference.pt", weights_only=True)
        write_json(outdir / case / "expected.json", {
            "case": case,
            "description": description,
            "processes": world,
            "tensor_parallel": tp,
            "iteration": ITERATION if case.startswith("gpt") else 7,
            "args": ARGS if case.startswith("gpt") else None,
            "reference": [{"name": k, "dtype": torchtree.dtype_name(v.dtype), "shape": list(v.shape)} for k, v in ref.items()],
        })
        rows.append(f"| `{case}` | {description} |")
        for p in sorted((outdir / case).rglob("*")):
            if p.is_file():
                files[p.relative_to(outdir).as_posix()] = sha256_file(p)
        print(f"{case}: {len(ref)} reference tensors")
    here = HERE.parent
    write_json(outdir / "STAMP.json", {
        "command": COMMAND,
        "generator": "megatron/make_fixtures.py",
        "inputs_sha256": {name: sha256_file(here / name) for name in INPUTS},
        "files": files,
        "megatron_core": megatron.core.__version__,
        "torch": torchtree.public_torch_version(),
        "torch_build": torch.__version__,
        "python": platform.python_version(),
        "pinned_env": pinenv.PINNED_ENV,
        "training_derived": TRAINING_DERIVED,
    })
    (outdir / "README.md").write_text(README.format(mc=megatron.core.__version__, torch=torchtree.public_torch_version(),
                                                     command=COMMAND, rows="\n".join(rows)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
