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
  on its second, a replicated one, per-rank ``ShardedObject``s and common values.

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
}
ITERATION = 5
TRAINING_DERIVED = {"*.distcp": {"items": ["*"]}, "*/reference.pt": {"tensors": ["*"]}}
ARGS = {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 4, "num_query_groups": 2, "kv_channels": 4,
        "ffn_hidden_size": 24, "swiglu": True, "group_query_attention": True, "normalization": "RMSNorm",
        "padded_vocab_size": 32, "seq_length": 8}


def patch_cuda() -> None:
    import torch

    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


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


def worker(case: str, rank: int, world: int, port: int, outdir: Path) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import argparse

    import torch
    import torch.distributed as dist

    patch_cuda()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing, parallel_state

    os.chdir(outdir)
    if case == "--reference":
        reference_all(outdir)
        dist.destroy_process_group()
        return
    fix_save_id(case, rank)
    _, tp, _ = CASES[case]
    if case.startswith("gpt"):
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        state: dict[str, Any] = {"model": gpt(tp).sharded_state_dict(), "iteration": ITERATION,
                                 "args": argparse.Namespace(**ARGS), "checkpoint_version": 3.0}
    else:
        parallel_state.initialize_model_parallel()
        state = sharded_state(rank, world)
        if rank == 1:  # the split on dimension 1: rank 1 holds columns 3..5
            from megatron.core.dist_checkpointing import ShardedTensor

            cols = state["cols"].data
            state["cols"] = ShardedTensor("layer.cols", cols, cols.dtype, cols.shape, (4, 5), (0, 3), axis_fragmentations=None)
        elif rank == 0:
            from megatron.core.dist_checkpointing import ShardedTensor

            cols = state["cols"].data
            state["cols"] = ShardedTensor("layer.cols", cols, cols.dtype, cols.shape, (4, 5), (0, 0), axis_fragmentations=None)
    ckpt = Path(case) / "ckpt"
    if rank == 0:
        ckpt.mkdir(parents=True)
    dist.barrier()
    # One writer thread per rank: with two, the order of the items in `.metadata` follows which thread
    # finished first.
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    dist_checkpointing.save(state, str(ckpt), sharded_strategy=TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1))
    dist.barrier()
    dist.destroy_process_group()


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


def run(case: str, world: int, outdir: Path) -> None:
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    procs = [
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", case, str(r), str(world), str(port), str(outdir)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for r in range(world)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    if any(p.returncode for p in procs):
        for _, err in results:
            sys.stderr.write(err.decode(errors="replace")[-3000:])
        raise RuntimeError(f"{case}: worker exit codes {[p.returncode for p in procs]}")


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
    for case, (world, _, _) in CASES.items():
        shutil.rmtree(outdir / case, ignore_errors=True)
        run(case, world, outdir)
    run("--reference", 1, outdir)

    import megatron.core
    import torch

    import torchtree

    files: dict[str, str] = {}
    rows = []
    for case, (world, tp, description) in CASES.items():
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
