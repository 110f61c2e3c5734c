#!/usr/bin/env python3
"""Generate the torch.distributed.checkpoint (DCP) conformance fixtures with the real torch 2.13.

Usage::

    .venv/bin/python conformance/python/distcp/make_fixtures.py OUTDIR

Writes one checkpoint directory per case in ``CASES`` plus ``<case>.json`` (what a reader must
return), ``STAMP.json`` and ``README.md`` into OUTDIR. The committed copy is
``conformance/fixtures/distcp/torch213/``; ``check_reproducible.py`` compares a fresh run with it.

Cases: single-process saves (a mixed state dict, every dtype, a model + Adam optimizer state, three
files per rank, one file per item), multi-rank saves with gloo on 127.0.0.1 (2 and 3 ranks, DTensor
``Shard(0)`` / ``Shard(1)`` / ``Replicate``, uneven and empty shards), a ``use_collectives=False``
save (per-rank ``__<rank>.metadata``) and ``HuggingFaceStorageWriter`` saves (one process with an
index; two ranks with ``save_distributed=True``).

Determinism: the script runs under ``pinenv.PINNED_ENV``; every value is built from small exact
integers (no RNG draws reach the files); saves happen with OUTDIR as the working directory under a
relative ``checkpoint_id`` (so ``storage_meta.checkpoint_id`` is ``PosixPath('<case>')``); the random
``save_id`` (``filesystem._generate_uuid``) is replaced by a fixed uuid per case and rank. Every file
is then byte-reproducible but those listed in ``NOT_BYTE_REPRODUCIBLE`` and, on another CPU, the items
``TRAINING_DERIVED`` lists (two Adam steps in ``s_optim``), which ``check_reproducible.py`` compares
within a tolerance.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import pinenv  # noqa: E402

pinenv.pin_environment()

import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import socket  # noqa: E402
import warnings  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.checkpoint import filesystem as dcp_fs  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402
from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # noqa: E402

import torchtree  # noqa: E402

warnings.filterwarnings("ignore")

GENERATOR = "distcp/make_fixtures.py"
#: files whose bytes legitimately vary between runs, and why (compared structurally by
#: check_reproducible.py; their digests are recorded as null)
NOT_BYTE_REPRODUCIBLE = {
    "s_multi/.metadata": "thread_count=3: storage_data is in the order the writer threads finish",
    "hf/model-00001-of-00002.safetensors": "safetensors-rs writes __metadata__ from a HashMap (random key order)",
    "hf/model-00002-of-00002.safetensors": "safetensors-rs writes __metadata__ from a HashMap (random key order)",
    "hf2/shard-00001-model-00001-of-00001.safetensors": "safetensors-rs writes __metadata__ from a HashMap",
    "hf2/shard-00002-model-00001-of-00001.safetensors": "safetensors-rs writes __metadata__ from a HashMap",
}
COMMAND = ".venv/bin/python conformance/python/distcp/make_fixtures.py conformance/fixtures/distcp/torch213"
#: items whose values come out of training math (reproducible.py's rules): compared within a tolerance
#: by check_reproducible.py, every other byte exactly. Adam's step counts are exact.
TRAINING_DERIVED = {"s_optim/*.distcp": {"items": ["model.*", "optim.state.*", "!*.step"]}}


# --------------------------------------------------------------------------------------------
# deterministic values and save ids


def exact(shape: tuple[int, ...], k: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Element i is ``((i * (2k + 5) + k) % 17 - 8) / 4`` (ints without the division): exact in every
    float dtype of 16 bits or more."""
    n = 1
    for s in shape:
        n *= s
    v = (torch.arange(n, dtype=torch.int64) * (2 * k + 5) + k) % 17 - 8
    if dtype.is_floating_point or dtype.is_complex:
        return (v.to(torch.float64) / 4).to(dtype).reshape(shape)
    if dtype == torch.bool:
        return (v > 0).reshape(shape)
    if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return (v + 8).to(dtype).reshape(shape)
    return v.to(dtype).reshape(shape)


def arange(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float64).to(dtype).reshape(shape)


def fix_save_id(case: str, rank: int = 0) -> None:
    """Replace the random uuid4 save id by one derived from the case name and rank."""
    digest = hashlib.sha256(f"{case}/{rank}".encode()).hexdigest()
    fixed = f"{digest[0:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"
    dcp_fs._generate_uuid = lambda: fixed  # type: ignore[attr-defined]


def setup_torch() -> None:
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


# --------------------------------------------------------------------------------------------
# single-process cases


def mixed() -> dict[str, Any]:
    """The golden ``c*`` state dict (shared/golden/distcp README section 1) plus a few more leaves."""
    base = torch.arange(10, dtype=torch.int32)
    return {
        "model": {"w": arange((3, 4)), "b": torch.ones(4, dtype=torch.bfloat16)},
        "step": 7,
        "opt": {
            "lr": 0.1,
            "betas": [0.9, 0.999],
            "state": {0: {"exp_avg": torch.zeros(2, 2)}},
            "hp": {"name": "adam", "eps": 1e-8, "amsgrad": False, "sched": None},
        },
        "lst": [torch.tensor([1, 2, 3]), torch.tensor(5.0)],
        "tup": (1, "two", 3.0),
        "tt": arange((2, 3), torch.float16).t(),
        "view": base[2:5],
        "col": arange((4, 6))[:, 2],
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "flag": torch.tensor([True, False]),
        "big": exact((64, 33), 3),
    }


ALL_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex32, torch.complex64, torch.complex128,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]  # fmt: skip


def dtypes() -> dict[str, Any]:
    """One small tensor of every dtype DCP can save (float8 types hold exact small values)."""
    out: dict[str, Any] = {}
    for i, dt in enumerate(ALL_DTYPES):
        name = torchtree.dtype_name(dt)
        if dt == torch.complex32:
            t = exact((2, 3), i, torch.complex64).to(torch.complex32)
        elif dt.is_floating_point and dt.itemsize == 1:
            t = exact((2, 3), i, torch.float32).abs().to(dt)
        else:
            t = exact((2, 3), i, dt)
        out[name] = t
    return {"dtypes": out}


def optim() -> dict[str, Any]:
    """A tiny model and its Adam state after two steps: nested optimizer state, param_groups lists."""
    setup_torch()
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(exact(tuple(p.shape), i + 1) / 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x = exact((5, 4), 9)
    y = exact((5, 2), 10)
    for _ in range(2):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 2}


SINGLE: dict[str, tuple[Callable[[], dict[str, Any]], dict[str, Any]]] = {
    "s_mixed": (mixed, {}),
    "s_dtypes": (dtypes, {}),
    "s_optim": (optim, {}),
    "s_multi": (mixed, {"thread_count": 3}),
    "s_perfile": (mixed, {"single_file_per_rank": False}),
}


def save_single(case: str) -> dict[str, Any]:
    make, opts = SINGLE[case]
    fix_save_id(case)
    sd = make()
    dcp.save(sd, storage_writer=dcp_fs.FileSystemWriter(case, **opts), no_dist=True)
    return {"state_dict": make, "options": opts, "world_size": 1}


def save_hf(case: str) -> dict[str, Any]:
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    def make() -> dict[str, Any]:
        return {"model.w": arange((2, 3)), "model.b": torch.ones(3, dtype=torch.bfloat16), "emb": exact((4, 2), 1, torch.float16)}

    writer = HuggingFaceStorageWriter(case, fqn_to_index_mapping={"model.w": 1, "model.b": 2, "emb": 1})
    dcp.save(make(), storage_writer=writer, no_dist=True)
    return {"state_dict": make, "options": {"writer": "HuggingFaceStorageWriter"}, "world_size": 1, "flat": True}


# --------------------------------------------------------------------------------------------
# multi-rank cases (gloo on 127.0.0.1, one process per rank)


def m2_global(rank: int | None) -> dict[str, Any]:
    """The 2-rank state dict as global tensors; ``rank`` selects the per-rank plain values."""
    r = 0 if rank is None else rank
    return {
        "row": arange((5, 4)),
        "col": arange((3, 6)),
        "rep": torch.ones(2, 2),
        "one": arange((1, 4)),
        "bf": exact((3, 5), 2, torch.bfloat16),
        "plain": torch.full((3,), float(r)),
        "obj": {"rank": r},
    }


M2_PLACEMENT = {"row": "S0", "col": "S1", "rep": "R", "one": "S0", "bf": "S1"}


def m3_global(rank: int | None) -> dict[str, Any]:
    r = 0 if rank is None else rank
    return {
        "row": arange((7, 4)),
        "col": arange((4, 5)),
        "emp": arange((2, 3)),
        "rep": exact((3,), 4),
        "layer": {"w": exact((6, 2), 5, torch.float16), "b": exact((6,), 6)},
        "plain": torch.full((2,), float(r) + 0.5),
        "obj": {"rank": r, "name": "m3", "ids": [r, r + 1]},
    }


M3_PLACEMENT = {"row": "S0", "col": "S1", "emp": "S0", "rep": "R", "layer.w": "S0", "layer.b": "R"}

NC2_PLACEMENT = {"row": "S0", "rep": "R"}


def nc2_global(rank: int | None) -> dict[str, Any]:
    r = 0 if rank is None else rank
    return {"row": arange((4, 2)), "rep": exact((2, 2), 7), "obj": {"rank": r}}


def hf2_global(rank: int | None) -> dict[str, Any]:
    return {"embed.weight": arange((5, 4)), "lm_head.weight": exact((3, 6), 8, torch.bfloat16), "norm": exact((4,), 9)}


HF2_PLACEMENT = {"embed.weight": "S0", "lm_head.weight": "S1", "norm": "R"}

MULTI: dict[str, tuple[int, Callable[[int | None], dict[str, Any]], dict[str, str], dict[str, Any]]] = {
    "m2": (2, m2_global, M2_PLACEMENT, {}),
    "m3": (3, m3_global, M3_PLACEMENT, {}),
    "nc2": (2, nc2_global, NC2_PLACEMENT, {"use_collectives": False}),
    "hf2": (2, hf2_global, HF2_PLACEMENT, {"writer": "HuggingFaceStorageWriter", "save_distributed": True}),
}


def distribute(sd: dict[str, Any], placement: dict[str, str], mesh: Any, prefix: str = "") -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    out: dict[str, Any] = {}
    for k, v in sd.items():
        key = prefix + k
        if isinstance(v, dict):
            out[k] = distribute(v, placement, mesh, key + ".")
        elif key in placement:
            p = placement[key]
            pl = Replicate() if p == "R" else Shard(int(p[1:]))
            out[k] = distribute_tensor(v, mesh, [pl])
        else:
            out[k] = v
    return out


def rank_main(rank: int, world: int, port: int, case: str, outdir: str) -> None:
    os.chdir(outdir)
    setup_torch()
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        _, make, placement, opts = MULTI[case]
        fix_save_id(case, rank)
        mesh = init_device_mesh("cpu", (world,))
        sd = distribute(make(rank), placement, mesh)
        if opts.get("writer") == "HuggingFaceStorageWriter":
            from torch.distributed.checkpoint import HuggingFaceStorageWriter

            dcp.save(sd, storage_writer=HuggingFaceStorageWriter(case, save_distributed=True))
        else:
            dcp.save(sd, checkpoint_id=case, **opts)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save_multi(case: str, outdir: Path) -> dict[str, Any]:
    world, make, placement, opts = MULTI[case]
    mp.spawn(rank_main, args=(world, free_port(), case, str(outdir)), nprocs=world, join=True)
    return {
        "state_dict": lambda: make(None),
        "per_rank": make,
        "options": {**opts, "placements": placement},
        "world_size": world,
    }


# --------------------------------------------------------------------------------------------
# manifests


def flat_items(sd: dict[str, Any], flat: bool) -> list[tuple[str, Any]]:
    if flat:
        return list(sd.items())
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flattened, _ = flatten_state_dict(sd)
    return list(flattened.items())


def read_metadata(case_dir: Path, info: dict[str, Any]) -> Any:
    if info["options"].get("writer") == "HuggingFaceStorageWriter":
        from torch.distributed.checkpoint import HuggingFaceStorageReader

        return HuggingFaceStorageReader(str(case_dir)).read_metadata()
    if info["options"].get("use_collectives") is False:
        return None
    return dcp_fs.FileSystemReader(str(case_dir)).read_metadata()


def writer_rank(md: Any, key: str) -> int:
    """The rank whose copy of an unsharded key was kept (its data file is ``__<rank>_<n>.distcp``)."""
    if md is None:
        return 0  # per-rank metadata: readers merge lowest rank first
    for index, info in md.storage_data.items():
        if index.fqn == key:
            return int(info.relative_path.split("_")[2])
    raise KeyError(key)


def expected_items(info: dict[str, Any], md: Any) -> list[tuple[str, Any]]:
    """Flattened expected values. Multi-rank values that differ between ranks (a plain tensor, an
    object) come from the rank whose copy DCP kept."""
    sd = info["state_dict"]
    if info["world_size"] == 1:
        return flat_items(sd(), info.get("flat", False))
    make = info["per_rank"]
    out = []
    for key, v in flat_items(sd(), False):
        if key.split(".")[0] in ("plain", "obj"):
            v = dict(flat_items(make(writer_rank(md, key)), False))[key]
        out.append((key, v))
    return out


def manifest(case: str, case_dir: Path, info: dict[str, Any]) -> dict[str, Any]:
    """What a reader must return: every flattened key with dtype, shape, value digest and chunks (from
    torch's own metadata), objects as typed trees; the planner paths; every file's digest."""
    md = read_metadata(case_dir, info)
    entries = []
    for key, v in expected_items(info, md):
        if isinstance(v, torch.Tensor):
            e: dict[str, Any] = {
                "key": key,
                "kind": "tensor",
                "dtype": torchtree.dtype_name(v.dtype),
                "shape": list(v.shape),
                "sha256": torchtree.tensor_sha256(v),
            }
            if md is not None:
                tmd = md.state_dict_metadata[key]
                assert isinstance(tmd, TensorStorageMetadata)
                e["chunks"] = [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in tmd.chunks]
                if info["options"].get("writer"):
                    # HuggingFaceStorageReader orders chunks by directory listing order: sort them.
                    e["chunks"].sort(key=lambda c: c["offsets"])
        else:
            e = {"key": key, "kind": "object", "tree": torchtree.render(v)[0]}
        entries.append(e)
    files = {
        str(p.relative_to(case_dir)): (
            None
            if f"{case}/{p.relative_to(case_dir)}" in NOT_BYTE_REPRODUCIBLE
            else hashlib.sha256(p.read_bytes()).hexdigest()
        )
        for p in sorted(case_dir.rglob("*"))
        if p.is_file()
    }
    out: dict[str, Any] = {
        "case": case,
        "world_size": info["world_size"],
        "options": info["options"],
        "entries": entries,
        "files": files,
    }
    if md is not None and md.planner_data is not None:
        out["planner_data"] = {k: list(v) for k, v in md.planner_data.items()}
    return out


def check_with_torch(case_dir: Path, info: dict[str, Any], tmp: Path) -> None:
    """Cross-check: torch's own dcp_to_torch_save gives the manifest's values (global-metadata cases)."""
    if info["options"].get("writer") or info["options"].get("use_collectives") is False:
        return
    out = tmp / f"{case_dir.name}.pt"
    dcp_to_torch_save(str(case_dir), str(out))
    loaded = torch.load(out, weights_only=False)
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    got, _ = flatten_state_dict(loaded)
    md = dcp_fs.FileSystemReader(str(case_dir)).read_metadata()
    for key, v in expected_items(info, md):
        if isinstance(v, torch.Tensor):
            assert torchtree.tensor_sha256(got[key]) == torchtree.tensor_sha256(v), (case_dir.name, key)
    out.unlink()


README = """# torch.distributed.checkpoint fixtures written by torch 2.13

Made by the real `torch.distributed.checkpoint` of **torch 2.13.0** (PyPI wheel, CPU only, gloo on
127.0.0.1 for the multi-rank cases) with `conformance/python/distcp/make_fixtures.py`; do not edit by
hand. Regenerate (from the repository root, with the virtual environment from
`conformance/requirements.txt`) with

    .venv/bin/python conformance/python/distcp/make_fixtures.py conformance/fixtures/distcp/torch213

and prove the committed files are reproducible with

    .venv/bin/python conformance/python/distcp/make_fixtures.py /tmp/fresh-distcp
    .venv/bin/python conformance/python/distcp/check_reproducible.py conformance/fixtures/distcp/torch213 /tmp/fresh-distcp

Every file is byte-reproducible except those `STAMP.json` lists under `not_byte_reproducible`
(`s_multi/.metadata`: torch orders `storage_data` by writer-thread completion; the `hf*/*.safetensors`
files: safetensors-rs writes `__metadata__` in HashMap order); `check_reproducible.py` compares those
structurally. The items of `s_optim` that come out of two Adam steps (`training_derived`) may differ in
the last bits from one CPU to another; they are compared within a tolerance, their digests by
recomputation (`conformance/fixtures/REPRODUCIBILITY.md`). Saves run with this directory as the working directory under a relative
`checkpoint_id`, so `storage_meta.checkpoint_id` is `PosixPath('<case>')`; the random `save_id` is
replaced by a fixed uuid per case and rank.

| case | how torch wrote it | what it holds |
|---|---|---|
| `s_mixed` | 1 process, default `FileSystemWriter` | nested dicts, an int dict key, a list of tensors, a tuple, a transposed fp16 tensor, sliced views (one cloned contiguous, one non-dense column), 0-d, empty `[0,3]`, bool, bf16, floats, str, None, a 64x33 float32 |
| `s_dtypes` | same | one `[2,3]` tensor of every dtype: bool, uint8-64, int8-64, float16, bfloat16, float32/64, complex32/64/128, the five float8 types |
| `s_optim` | same | a 4-3-2 MLP `state_dict()` and its Adam `state_dict()` after two steps (`optim.state.<i>.{step,exp_avg,exp_avg_sq}`, `optim.param_groups.0.*`) |
| `s_multi` | same state dict as `s_mixed`, `thread_count=3` | `__0_0` ... `__0_2.distcp` |
| `s_perfile` | same, `single_file_per_rank=False` | one file per item |
| `hf` | `HuggingFaceStorageWriter`, `fqn_to_index_mapping` over 2 files | `model.w` f32, `emb` f16 (file 1), `model.b` bf16 (file 2); no `.metadata` |
| `m2` | 2 ranks, DTensor on a 1-D CPU mesh | `row` [5,4] Shard(0) (3+2 rows), `col` [3,6] Shard(1), `rep` Replicate, `one` [1,4] Shard(0) (rank 1 empty), `bf` bf16 [3,5] Shard(1) (3+2 columns), a per-rank `plain` tensor and `obj.rank` (one copy kept) |
| `m3` | 3 ranks | `row` [7,4] Shard(0) (3+3+1), `col` [4,5] Shard(1) (2+2+1), `emp` [2,3] Shard(0) (rank 2 empty), `rep` Replicate, `layer.w` f16 Shard(0), `layer.b` Replicate, per-rank `plain`, `obj.{rank,name,ids}` |
| `nc2` | 2 ranks, `use_collectives=False` | `__0.metadata`, `__1.metadata` (no `.metadata`): `row` Shard(0), `rep`, `obj.rank` |
| `hf2` | 2 ranks, `HuggingFaceStorageWriter(save_distributed=True)` | per-rank `shard-0000<r+1>-model-00001-of-00001.safetensors` with `DCP_SHARDING_INFO` offsets: `embed.weight` Shard(0), `lm_head.weight` bf16 Shard(1), `norm` Replicate; no index, no `.metadata` |

`<case>.json` lists every flattened key a reader must return: tensors with dtype, shape, the sha256
of their row-major bytes and (where torch's metadata is global) their chunks in metadata order;
objects as typed trees (`conformance/python/torchtree.py`); `planner_data`; the sha256 of every file.
For multi-rank values that differ between ranks, the expected value is the copy DCP kept (the rank
whose data file holds it; for `nc2`, rank 0, as per-rank metadata files are merged lowest rank first).
"""


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1]).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    tmp = outdir / ".tmp"
    tmp.mkdir(exist_ok=True)
    os.chdir(outdir)
    setup_torch()
    stamp_files: dict[str, Any] = {}
    cases = [*SINGLE, "hf", *MULTI]
    for case in cases:
        case_dir = outdir / case
        if case_dir.exists():
            for p in sorted(case_dir.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            case_dir.rmdir()
        if case in SINGLE:
            info = save_single(case)
        elif case == "hf":
            info = save_hf(case)
        else:
            info = save_multi(case, outdir)
        check_with_torch(case_dir, info, tmp)
        m = manifest(case, case_dir, info)
        (outdir / f"{case}.json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
        stamp_files[case] = m["files"]
        print(f"{case}: {len(m['entries'])} keys, {len(m['files'])} files", file=sys.stderr)
    tmp.rmdir()
    stamp = {
        "command": COMMAND,
        "generator": GENERATOR,
        "generator_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "helpers_sha256": {
            n: hashlib.sha256((HERE.parent / n).read_bytes()).hexdigest() for n in ("torchtree.py", "pinenv.py")
        },
        "torch": torchtree.public_torch_version(),
        "torch_build": torch.__version__,
        "python": platform.python_version(),
        "pinned_env": pinenv.PINNED_ENV,
        "cases": cases,
        "not_byte_reproducible": NOT_BYTE_REPRODUCIBLE,
        "training_derived": TRAINING_DERIVED,
        "files": stamp_files,
    }
    (outdir / "STAMP.json").write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    (outdir / "README.md").write_text(README)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
