#!/usr/bin/env python3
"""Generate the torch.save golden fixtures and their JSON manifests.

Usage::

    .venv/bin/python conformance/python/make_torch_fixtures.py OUTDIR

Writes ``<case>.pt`` + ``<case>.json`` for every case in ``CASES``, plus ``STAMP.json`` and
``README.md``, into OUTDIR. The committed copy lives in ``conformance/fixtures/torch/``; CI
regenerates into a temporary directory and runs ``check_reproducible.py`` to prove the committed
files are what this script makes.

Every file is written by the real ``torch.save`` (torch 2.13.0). Determinism: the script
re-executes itself under ``pinenv.PINNED_ENV`` (hash seed, scalar CPU kernels, MKL
conditional numerical reproducibility, one thread), seeds torch, enables deterministic
algorithms, disables oneDNN and builds every value from exact small dyadic rationals (no RNG
draws end up in the bytes). The values of training math (``Case.trained``, listed in STAMP.json)
still depend on the CPU's math-library code path; ``check_reproducible.py`` compares them within a
tolerance. The only fixture that is not byte-reproducible otherwise is ``legacy.pt`` (its storage
keys are memory addresses); its manifest is reproducible up to key renaming.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pinenv  # noqa: E402

pinenv.pin_environment()

import torchtree  # noqa: E402

import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import warnings  # noqa: E402
from collections import OrderedDict  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import numpy  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

GENERATOR = "make_torch_fixtures.py"
#: modules whose code decides the fixtures' content; their hashes go into STAMP.json
HELPERS = ("torchtree.py", "pinenv.py")
COMMAND = ".venv/bin/python conformance/python/make_torch_fixtures.py conformance/fixtures/torch"

warnings.filterwarnings("ignore")
dtype_name = torchtree.dtype_name


def setup_torch() -> None:
    """Global torch settings for reproducible values."""
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False


# --------------------------------------------------------------------------------------------
# deterministic values


def exact(shape: tuple[int, ...] | list[int], k: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Deterministic non-trivial values, exactly representable in every float dtype >= 16 bits.

    Element i is ``((i * (2k + 5) + k) % 17 - 8) / 16`` (ints: without the division), so values
    cover negatives, zero and positives and depend on ``k``.
    """
    n = math.prod(shape)
    v = (torch.arange(n, dtype=torch.int64) * (2 * k + 5) + k) % 17 - 8
    if dtype.is_floating_point or dtype.is_complex:
        return (v.to(torch.float64) / 16).to(dtype).reshape(shape)
    return v.to(dtype).reshape(shape)


def init_exact(module: nn.Module) -> None:
    """Overwrite every parameter with ``exact`` values (scaled down so activations stay small)."""
    with torch.no_grad():
        for i, (_, p) in enumerate(module.named_parameters()):
            p.copy_(exact(tuple(p.shape), i + 1) / 2)


class Small(nn.Module):
    """Linear + BatchNorm1d + Conv2d + Embedding, the module used by module.pt/checkpoint.pt."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.lin = nn.Linear(2 * 4 * 4 + 4, 6)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, img: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        h = self.conv(img).flatten(1)
        e = self.emb(idx)
        return self.bn(self.lin(torch.cat([h, e], 1)))


def small_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    img = exact((4, 1, 4, 4), 7)
    idx = torch.tensor([1, 3, 5, 7])
    target = exact((4, 6), 8)
    return img, idx, target


def make_small(train_steps: int) -> tuple[Small, torch.optim.Optimizer]:
    """A ``Small`` module after one forward (train mode) and ``train_steps`` Adam steps (eval mode).

    The steps run with the BatchNorm in eval mode. In train mode it normalises away any per-feature
    shift of its input, so the gradients of ``lin.bias`` and ``conv.bias`` would be zero up to
    rounding, and Adam turns that rounding noise into full-size steps whose sign depends on the CPU
    (see ``conformance/fixtures/REPRODUCIBILITY.md``).
    """
    setup_torch()
    model = Small()
    init_exact(model)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    img, idx, target = small_batch()
    with torch.no_grad():
        model(img, idx)
    model.eval()
    for _ in range(train_steps):
        opt.zero_grad()
        loss = ((model(img, idx) - target) ** 2).mean()
        loss.backward()
        opt.step()
    return model, opt


def optim_state(kind: str) -> dict[str, Any]:
    """``optimizer.state_dict()`` after 3 steps on a tiny MLP with fixed data."""
    setup_torch()
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    init_exact(model)
    params = list(model.parameters())
    opt: torch.optim.Optimizer
    if kind == "sgd":
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)
    elif kind == "adam":
        opt = torch.optim.Adam(params, lr=1e-2, foreach=False)
    elif kind == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01, foreach=False)
    elif kind == "adagrad":
        opt = torch.optim.Adagrad(params, lr=0.1, foreach=False)
    else:
        raise ValueError(kind)
    x, y = exact((5, 4), 3), exact((5, 2), 4)
    for _ in range(3):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    return opt.state_dict()


# --------------------------------------------------------------------------------------------
# cases

#: dtypes the brief requires in dtypes.pt, in this order
MAIN_DTYPES: list[str] = [
    "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
]
#: further dtypes torch 2.13 saves (all through _rebuild_tensor_v3 + UntypedStorage)
EXTRA_DTYPES: list[str] = ["float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2"]


def dtype_tensor(name: str) -> torch.Tensor:
    """One small deterministic tensor of dtype ``name`` (extremes, NaN/inf where they exist)."""
    inf, nan = math.inf, math.nan
    d = getattr(torch, name)
    if name == "bool":
        return torch.tensor([True, False, True, True, False, False])
    if name in ("uint8", "int8", "int16", "int32", "int64"):
        info = torch.iinfo(d)
        return torch.tensor([info.min, -1 if info.min < 0 else 1, 0, 1, 7, info.max], dtype=d)
    if name in ("uint16", "uint32", "uint64"):
        bits = torch.iinfo(d).bits
        vals = [0, 1, 2 ** (bits - 1) - 1, 2 ** (bits - 1), 2**bits - 2, 2**bits - 1]
        signed = {16: torch.int16, 32: torch.int32, 64: torch.int64}[bits]
        as_signed = [v - 2**bits if v >= 2 ** (bits - 1) else v for v in vals]
        return torch.tensor(as_signed, dtype=signed).view(d)
    if name in ("float16", "bfloat16", "float32", "float64"):
        fi = torch.finfo(d)
        vals = [-inf, -fi.max, -1.5, -0.0, 0.0, fi.smallest_normal / 4, fi.tiny, 0.1, 1.0, fi.max, inf, nan]
        return torch.tensor(vals, dtype=torch.float64).to(d).reshape(3, 4)
    if name == "complex32":
        halves = torch.tensor([1.0, -2.0, -0.5, 0.25, inf, nan, 0.0, -0.0], dtype=torch.float16)
        return halves.view(torch.complex32)
    if name in ("complex64", "complex128"):
        vals = [complex(1, -2), complex(-0.5, 0.25), complex(inf, nan), complex(0.0, -0.0), complex(1e-3, 1e3)]
        return torch.tensor(vals, dtype=d)
    if name.startswith("float8_"):
        # raw bit patterns 0x00, 0x0d, ..., 0xff: zeros, subnormals, normals, NaN/inf encodings
        return torch.arange(0, 256, 13, dtype=torch.int64).to(torch.uint8).view(d)
    if name == "float4_e2m1fn_x2" or name in ("bits8", "bits1x8", "bits2x4", "bits4x2"):
        return torch.arange(0, 256, 17, dtype=torch.int64).to(torch.uint8).view(d)
    if name == "bits16":
        return torch.tensor([0, 1, -1, 0x1234, -0x8000], dtype=torch.int16).view(d)
    raise ValueError(name)


def refused_dtypes() -> list[str]:
    """Every ``torch.<dtype>`` that ``torch.save`` refuses in a plain dense tensor, with why."""
    out = []
    names = sorted({dtype_name(v) for v in vars(torch).values() if isinstance(v, torch.dtype)})
    for name in names:
        d = getattr(torch, name)
        try:
            t = torch.empty(4, dtype=d)
        except Exception as e:  # noqa: BLE001 - the message is the point
            out.append(f"{name}: cannot create a dense tensor ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            continue
        try:
            torch.save({"x": t}, io.BytesIO())
        except Exception as e:  # noqa: BLE001
            if name.startswith("q"):  # quantized dtypes: only quantized tensors (special.pt) save
                out.append(f"{name}: torch.save of a plain dense tensor raises {type(e).__name__} "
                           "(internal assert: no quantizer); save a quantized tensor instead")
            else:
                out.append(f"{name}: torch.save raises {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    return out


def case_dtypes() -> Any:
    return {name: dtype_tensor(name) for name in MAIN_DTYPES}


def case_dtypes_extra() -> Any:
    return {name: dtype_tensor(name) for name in EXTRA_DTYPES}


def case_views() -> Any:
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    big = torch.arange(4096, dtype=torch.float32)
    u16 = torch.arange(8, dtype=torch.int32).mul(1000).to(torch.uint16)
    cl = torch.arange(120, dtype=torch.float32).reshape(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    return {
        "a": a,
        "a_t": a.t(),
        "a_cols": a[:, 1:],
        "a_block": a[1:3, ::2],
        "a_row": a[2],
        "a_col": a[:, 3],
        "a_diag": a.diagonal(),
        "a_unsqueeze": a.unsqueeze(0),
        "a_flat": a.view(-1),
        "expanded": torch.arange(3.0).expand(4, 3),
        "scalar_expanded": torch.tensor(5.0).expand(2, 3),
        "channels_last": cl,
        "channels_last_slice": cl[:, 1:],
        "big_slice": big[100:110],
        "u16_view": u16[3:6],
    }


def case_shared() -> Any:
    w = exact((3, 4), 1)
    inner = {"a": exact((2,), 2), "b": exact((2, 2), 3)}
    return {
        "enc.weight": w,
        "dec.weight": w,
        "dec_detached.weight": w.detach(),
        "x": inner,
        "y": inner,
        "lst": [w, inner["a"]],
    }


def case_nested() -> Any:
    return {
        "nested": {"a": [1, 2, (3, 4.5, "x")], "b": OrderedDict([("k", []), ("z", {"deep": [None]})])},
        "int_keys": {0: "zero", 1: exact((2,), 1), -5: "neg", 2**70: "big"},
        "set": {1, 2, 3, "a", "b"},
        "bytes": b"\x00\xffabc\x80",
        "bytearray": bytearray(b"xyz\x00\xfe"),
        "str": "h\u00e9llo \u2713 \u65e5\u672c \U0001f389 \x00end",
        "big_ints": [2**63, 2**64 + 1, -(2**63) - 1, -(2**100), 2**63 - 1, -(2**31), 255, 256, 65535, 65536, -1, 0],
        "floats": [1.5, math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e308, 0.1],
        "none": None,
        "true": True,
        "false": False,
        "size": torch.Size([2, 3]),
        "empty_size": torch.Size([]),
        "dtypes": [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int64, torch.bool],
        "devices": [torch.device("cpu"), torch.device("cuda", 1), torch.device("cuda")],
        "complex": complex(1.5, -2.0),
        "empty": {"dict": {}, "list": [], "tuple": ()},
        "tensors": {
            "scalar": torch.tensor(3.5),
            "scalar_int": torch.tensor(-7),
            "empty1": torch.zeros(0),
            "empty3": torch.zeros(2, 0, 3, dtype=torch.float16),
            "in_tuple": (exact((2,), 4), 1),
            "in_list": [exact((3,), 5), "after"],
        },
    }


def case_parameter() -> Any:
    p = nn.Parameter(exact((2, 3), 1))
    pf = nn.Parameter(exact((3,), 2), requires_grad=False)
    ps = nn.Parameter(exact((2, 2), 3))
    ps.tag = "tied"  # type: ignore[attr-defined]
    ps.index = 3  # type: ignore[attr-defined]
    ts = exact((4,), 4)
    ts.note = "hello"  # type: ignore[attr-defined]
    ts.scale = 0.5  # type: ignore[attr-defined]
    tg = exact((2,), 5).requires_grad_(True)
    return {
        "param": p,
        "param_frozen": pf,
        "param_with_state": ps,
        "tensor_with_state": ts,
        "tensor_requires_grad": tg,
        "param_again": [p],
    }


def case_module() -> Any:
    model, _ = make_small(0)
    return model.state_dict()


def case_checkpoint() -> Any:
    model, opt = make_small(3)
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "step": 1200,
        "lr": 1e-3,
        "config": {
            "name": "small",
            "layers": [2, 4],
            "dropout": 0.1,
            "use_bn": True,
            "betas": (0.9, 0.999),
            "notes": None,
        },
    }


def contiguous_entries() -> list[tuple[str, torch.Tensor]]:
    return [
        ("embed.weight", exact((16, 8), 1)),
        ("layers.0.attn.q.weight", exact((8, 8), 2)),
        ("layers.0.attn.q.bias", exact((8,), 3)),
        ("layers.0.mlp.up.weight", exact((16, 8), 4, torch.float16)),
        ("layers.0.mlp.up.bias", exact((16,), 5, torch.float16)),
        ("layers.0.mlp.down.weight", exact((8, 16), 6, torch.float16)),
        ("layers.0.norm.weight", exact((8,), 7)),
        ("norm.weight", exact((8,), 8)),
        ("lm_head.weight", exact((16, 8), 9)),
        ("position_ids", torch.arange(32, dtype=torch.int64).reshape(1, 32)),
        ("conv.weight", exact((2, 3, 2, 2), 10)),
    ]


def case_contiguous_sd() -> Any:
    return dict(contiguous_entries())


def case_contiguous_odict() -> Any:
    d = OrderedDict(contiguous_entries()[:4])
    d["num_batches_tracked"] = torch.tensor(5, dtype=torch.int64)
    d["empty"] = torch.zeros(0, dtype=torch.float32)
    d["bf16"] = exact((3, 2), 11, torch.bfloat16)
    return d


def case_legacy() -> Any:
    a = exact((2, 3), 1)
    ids = torch.arange(5, dtype=torch.int64)
    return {"a": a, "a_t": a.t(), "row": a[1], "ids": ids, "ids_tail": ids[2:], "meta": {"name": "legacy", "n": 3}}


def case_proto4() -> Any:
    return {
        "w": exact((2, 3), 1),
        "b": exact((3,), 2, torch.float16),
        "name": "proto4",
        "blob": b"\x00\x01",
        "nested": {"k": [1, 2.5]},
    }


def case_bytesio() -> Any:
    return {"w": exact((2, 3), 1), "b": exact((3,), 2), "n": 7}


def case_nocrc() -> Any:
    return {"w": exact((4, 2), 3), "ids": torch.arange(6, dtype=torch.int64), "tag": "nocrc"}


def case_special() -> Any:
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 1, 2, 0], [2, 0, 1, 1]]), exact((4,), 1), (3, 3))
    csr = (exact((3, 4), 2) * (torch.arange(12).reshape(3, 4) % 3 == 0)).to_sparse_csr()
    qt = torch.quantize_per_tensor(exact((4,), 3), 0.25, 3, torch.quint8)
    qc = torch.quantize_per_channel(
        exact((2, 3), 4), torch.tensor([0.1, 0.2], dtype=torch.float64), torch.tensor([0, 1]), 0, torch.qint8
    )
    return {
        "dense": exact((3,), 5),
        "coo": coo,
        "csr": csr,
        "quantized": qt,
        "quantized_per_channel": qc,
        "meta": torch.empty((2, 3), device="meta"),
    }


def case_conj() -> Any:
    z = torch.tensor([complex(1, 2), complex(-3, 0.5), complex(0, -1)], dtype=torch.complex64)
    r = exact((4,), 6)
    return {"z": z, "conj": z.conj(), "real": r, "neg": torch._neg_view(r)}


@dataclass
class Case:
    """One fixture: ``<name>.pt`` + ``<name>.json``."""

    name: str
    build: Callable[[], Any]
    description: str
    pickle_protocol: int = 2
    zipfile: bool = True
    crc32: bool = True
    target: str = "path"
    notes: list[str] = field(default_factory=list)
    #: the tensors whose values come out of training math (torchtree path globs, ``!`` excludes): compared
    #: within a tolerance by check_reproducible.py, every other byte exactly
    trained: tuple[str, ...] = ()


#: optimizer state after steps; the step counts are exact
OPTIMIZER_STATE = ("state.*", "!*.step")


CASES: list[Case] = [
    Case("dtypes", case_dtypes, "dict with one small tensor of every dtype the brief lists (bool, uint8-64, "
         "int8-64, float16/bfloat16/32/64, complex32/64/128, all five float8); float tensors hold -inf, "
         "-max, subnormals, -0.0, max, inf and NaN; float8 tensors hold raw bit patterns 0x00,0x0d,..,0xff"),
    Case("dtypes_extra", case_dtypes_extra, "the other dtypes torch 2.13 saves: float4_e2m1fn_x2, bits8, bits16, "
         "bits1x8, bits2x4, bits4x2 (all via _rebuild_tensor_v3 + torch.storage.UntypedStorage)"),
    Case("views", case_views, "views sharing storages: a=arange(24).reshape(4,6) with a.t(), a[:,1:], "
         "a[1:3,::2], a[2], a[:,3], diagonal, unsqueeze, view(-1); zero-stride expands; channels_last 4-D and a "
         "slice of it; a 10-element slice of a 4096-element storage (whole storage saved); a uint16 view with "
         "storage offset 3 (v3 path)"),
    Case("shared", case_shared, "tied weights (the same tensor object twice + a detached alias) and the "
         "memo trap {'x': inner, 'y': inner} (spec 5.10)"),
    Case("nested", case_nested, "nested dict/list/tuple/OrderedDict, int dict keys (incl. 2**70), set, bytes, "
         "bytearray, unicode str (BMP, astral, NUL), big ints (LONG1), floats (nan/inf/-0.0/subnormal), None, "
         "bools, torch.Size, torch.dtype, torch.device (cpu, cuda:1, cuda), complex, empty containers, 0-dim "
         "and empty tensors, tensors in a tuple and a list"),
    Case("parameter", case_parameter, "nn.Parameter (requires_grad True and False, the same Parameter twice), a "
         "Parameter with Python attributes (_rebuild_parameter_with_state), a plain tensor with Python "
         "attributes (_rebuild_from_type_v2), a plain leaf tensor with requires_grad=True"),
    Case("optim_sgd", lambda: optim_state("sgd"), "SGD(lr=0.1, momentum=0.9).state_dict() after 3 steps",
         trained=OPTIMIZER_STATE),
    Case("optim_adam", lambda: optim_state("adam"), "Adam(lr=1e-2).state_dict() after 3 steps",
         trained=OPTIMIZER_STATE),
    Case("optim_adamw", lambda: optim_state("adamw"), "AdamW(lr=1e-2, weight_decay=0.01).state_dict() after 3 steps",
         trained=OPTIMIZER_STATE),
    Case("optim_adagrad", lambda: optim_state("adagrad"), "Adagrad(lr=0.1).state_dict() after 3 steps",
         trained=OPTIMIZER_STATE),
    Case("module", case_module, "state_dict() of a module with Embedding, Conv2d, Linear, BatchNorm1d after one "
         "train-mode forward (running stats and num_batches_tracked changed); an OrderedDict with _metadata",
         trained=("bn.running_mean", "bn.running_var")),
    Case("checkpoint", case_checkpoint, "training checkpoint {'model': state_dict, 'optimizer': Adam state_dict, "
         "'epoch', 'step', 'lr', 'config'} after 3 steps",
         trained=("model.*", "optimizer.state.*", "!*.step")),
    Case("contiguous_sd", case_contiguous_sd, "plain dict of 11 contiguous, unshared float32/float16/int64 tensors "
         "saved to a path: the file the Rust writer must reproduce byte for byte (except .data/serialization_id)"),
    Case("contiguous_odict", case_contiguous_odict, "OrderedDict (no _metadata) of contiguous tensors incl. a 0-dim "
         "int64, an empty float32 (0-byte record, no data descriptor) and bfloat16: second byte-exact writer target"),
    Case("legacy", case_legacy, "_use_new_zipfile_serialization=False (legacy pickle stream) with views and two "
         "dtypes; storage keys are memory addresses, so the file is not byte-reproducible", zipfile=False),
    Case("proto4", case_proto4, "pickle_protocol=4 (FRAME, SHORT_BINUNICODE, MEMOIZE, BINBYTES...); torch.load "
         "with weights_only=True refuses it", pickle_protocol=4),
    Case("bytesio", case_bytesio, "saved to io.BytesIO() and written out: ZIP prefix 'archive/'", target="bytesio"),
    Case("nocrc", case_nocrc, "saved under torch.serialization.set_crc32_options(False): every CRC-32 is 0",
         crc32=False),
    Case("special", case_special, "opaque tensor kinds next to one dense tensor: sparse COO (uncoalesced), sparse "
         "CSR, per-tensor and per-channel quantized, meta (no storage)"),
    Case("conj", case_conj, "complex64 tensor and its conj() view (metadata {'conj': True}) sharing one storage; a "
         "float32 tensor and its torch._neg_view (metadata {'neg': True}); sha256 is of the resolved values"),
]


# --------------------------------------------------------------------------------------------
# writing


def save_kwargs(case: Case) -> dict[str, Any]:
    return {
        "pickle_protocol": case.pickle_protocol,
        "_use_new_zipfile_serialization": case.zipfile,
        "crc32": case.crc32,
        "target": case.target,
    }


def save(case: Case, obj: Any, path: Path) -> None:
    kw = {"pickle_protocol": case.pickle_protocol, "_use_new_zipfile_serialization": case.zipfile}
    if not case.crc32:
        torch.serialization.set_crc32_options(False)
    try:
        if case.target == "path":
            torch.save(obj, str(path), **kw)
        elif case.target == "bytesio":
            buf = io.BytesIO()
            torch.save(obj, buf, **kw)
            path.write_bytes(buf.getvalue())
        else:
            raise ValueError(case.target)
    finally:
        torch.serialization.set_crc32_options(True)


def try_load(path: Path, **kw: Any) -> tuple[bool, Any]:
    try:
        return True, torch.load(str(path), **kw)
    except Exception as e:  # noqa: BLE001 - recorded, not hidden
        return False, e


def short_error(e: BaseException, path: Path) -> str:
    """One reproducible line for a load error (the specific reason, no directory names)."""
    text = str(e).replace(str(path), path.name)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.endswith("WeightsUnpickler error:") and i + 1 < len(lines):
            return f"{type(e).__name__}: WeightsUnpickler error: {lines[i + 1]}"
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def dcp_flatten(obj: Any) -> tuple[Any, str | None]:
    """torch's own DCP flattening of ``obj`` (keys in order + key -> path items)."""
    if not isinstance(obj, dict):
        return None, None
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    try:
        flat, mapping = flatten_state_dict(obj)
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"
    return {"keys": list(flat.keys()), "mapping": {k: list(v) for k, v in mapping.items()}}, None


def write_json(path: Path, data: Any) -> None:
    text = json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def make_case(case: Case, outdir: Path) -> dict[str, Any]:
    setup_torch()
    obj = case.build()
    path = outdir / f"{case.name}.pt"
    save(case, obj, path)
    # Loading under use_deterministic_algorithms(True) fills new storages first, which is not
    # implemented for float4_e2m1fn_x2 / bits* in torch 2.13; values are not computed from here on.
    torch.use_deterministic_algorithms(False)

    tree, tensors, ids = torchtree.render(obj)
    loaded, keys = torchtree.load_with_keys(path, weights_only=False)
    ltree, ltensors, lids = torchtree.render(loaded)
    if torchtree.normalize_sets(ltree) != torchtree.normalize_sets(tree):
        raise AssertionError(f"{case.name}: typed tree of the loaded object differs from the saved one")
    if ltensors != tensors:
        raise AssertionError(f"{case.name}: tensor records of the loaded object differ from the saved ones")
    if torchtree.partition_from_ids(ids) != torchtree.partition_from_ids(lids):
        raise AssertionError(f"{case.name}: storage sharing differs after loading")
    tensors = torchtree.attach_keys(tensors, lids, keys)
    if any(t["storage_key"] is None for t in tensors):
        raise AssertionError(f"{case.name}: a tensor's storage key was not recorded")

    # What torch 2.13 itself accepts, and a self-test of the round-trip comparer.
    wo_ok, wo = try_load(path, weights_only=True)
    mm_ok, mm = try_load(path, weights_only=True, mmap=True)
    for ok, got in ((wo_ok, wo), (mm_ok, mm)):
        if ok:
            cmp = torchtree.Comparer()
            cmp.compare(loaded, got)

    notes = list(case.notes)
    if case.name == "dtypes":
        notes += [f"refused by torch 2.13: {r}" for r in refused_dtypes()]
    if not wo_ok:
        notes.append(f"torch.load(weights_only=True) fails: {short_error(wo, path)}")
    if not mm_ok:
        notes.append(f"torch.load(weights_only=True, mmap=True) fails: {short_error(mm, path)}")

    flat, flat_err = dcp_flatten(obj)
    manifest = {
        "file": path.name,
        "generator": GENERATOR,
        "description": case.description,
        "torch": torchtree.public_torch_version(),
        "python": platform.python_version(),
        "save_kwargs": save_kwargs(case),
        "torch_load": {"weights_only": wo_ok, "mmap": mm_ok},
        "notes": notes,
        "tree": tree,
        "tensors": tensors,
        "dcp_flatten": flat,
        "dcp_flatten_error": flat_err,
    }
    write_json(outdir / f"{case.name}.json", manifest)
    return manifest


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


README_HEAD = """\
# torch.save golden fixtures

Made by the real `torch.save` of **torch {torch}** (PyPI wheel, CPU only) with
`conformance/python/make_torch_fixtures.py`; do not edit by hand. Regenerate (from the repository
root, with the virtual environment from `conformance/requirements.txt`) with

    {command}

and prove the committed files are reproducible with

    .venv/bin/python conformance/python/make_torch_fixtures.py /tmp/fresh
    .venv/bin/python conformance/python/check_reproducible.py conformance/fixtures/torch /tmp/fresh

`STAMP.json` records the sha256 of the generator and its helpers (`torchtree.py`, `pinenv.py`),
the torch / Python / numpy versions, the pinned environment and the sha256 of every `.pt` file.

Reproducibility: the generator re-executes itself under a pinned environment (`pinenv.py`:
`PYTHONHASHSEED=0`, `ATEN_CPU_CAPABILITY=default`, `MKL_CBWR=COMPATIBLE`, one thread), seeds torch,
turns on deterministic algorithms, turns off oneDNN, and builds every input from exact dyadic
values (no RNG draws reach the files). Everything but the values of training math is then
byte-reproducible with the pinned wheel on any x86-64 Linux and compared exactly. The values of
training math (`STAMP.json`'s `training_derived`: the optimizer states of `optim_*.pt`, the
BatchNorm statistics of `module.pt`, the trained model and optimizer state of `checkpoint.pt`) go
through the math library's CPU-specific code (they differ in the last bits between Intel and AMD
hosts): `check_reproducible.py` compares them within a tolerance of 2**-14 of each tensor's largest
magnitude, and the CRC-32s, serialization checksums and manifest digests computed from them by
recomputing them (`conformance/fixtures/REPRODUCIBILITY.md`). `legacy.pt` is not byte-reproducible
(its storage keys are memory addresses, which also decide its storage order; its manifest is
compared up to key renaming and the file structurally). Save targets are file paths unless noted,
so the ZIP prefix is the file stem (`views.pt` -> `views/`); the output directory path must be
ASCII (torch falls back to `archive/` for non-ASCII paths).

Related tools (all in `conformance/python/`): `check_roundtrip.py` (does a Rust-written file load
in torch exactly like its original?), `check_loads.py` (load + typed-tree dump of any file),
`selftest_checkers.py` (proves the checkers catch known-bad candidates).

## Files

| file | torch.load weights_only / mmap | what it is |
|---|---|---|
"""

README_FORMAT = """
## Manifest format (`<case>.json`, UTF-8, sorted keys, indent 1)

- `file`, `generator`, `description`, `torch` (public version), `python`.
- `save_kwargs`: `pickle_protocol`, `_use_new_zipfile_serialization`, `crc32` (false = saved
  under `set_crc32_options(False)`), `target` (`"path"` or `"bytesio"`).
- `torch_load`: `{"weights_only": bool, "mmap": bool}` — whether torch 2.13 loads the file with
  `weights_only=True`, and with `weights_only=True, mmap=True`.
- `notes`: list of strings (refused dtypes, load failures).
- `tree`: typed rendering of the saved object: `{"t":"none"}`, `{"t":"bool","v":true}`,
  `{"t":"int","v":"<decimal>"}`, `{"t":"float","v":"<float.hex()>"}`,
  `{"t":"complex","re":"<hex>","im":"<hex>"}`, `{"t":"str","v":...}`, `{"t":"bytes","v":"<hex>"}`,
  `{"t":"bytearray","v":"<hex>"}`, `{"t":"list"|"tuple"|"set","items":[...]}` (set items in the
  order the saved set iterated, which is the order in the pickle),
  `{"t":"dict","items":[[k,v],...]}`, `{"t":"odict","items":[[k,v],...],"attrs":<tree of __dict__ or null>}`,
  `{"t":"size","v":[...]}`, `{"t":"dtype","v":"float32"}`, `{"t":"device","type":"cuda","index":1|null}`,
  `{"t":"tensor","path":P}`, `{"t":"parameter","path":P,"state":<tree>|null}`,
  `{"t":"tensor_with_state","path":P,"state":<tree>}`,
  `{"t":"opaque","kind":"sparse_coo"|"sparse_csr"|"sparse_csc"|"sparse_bsr"|"sparse_bsc"|"quantized"|"meta"}`
  (opaque tensors are not listed in `tensors`).
- `tensors`: dense tensors and parameters in traversal order (dict insertion order, depth first;
  paths: dict keys as `str(k)`, list/tuple items by index, joined with `.`), each
  `{path, dtype, shape, stride, storage_offset, requires_grad, kind: "tensor"|"parameter",
  storage_key, storage_nbytes, sha256, numel}`; `storage_key` is the ZIP key (`data/<key>`) or, for
  legacy files, the opaque key string; `sha256` is of the tensor's logical values as contiguous
  little-endian bytes (numel × itemsize), i.e. of the *logical* values. Optional keys, present
  only on tensors whose conj/neg bit is set (only in `conj.pt`): `"conj": true` / `"neg": true`
  and `raw_sha256`, the digest of the stored bytes the view covers (bit not applied). A tensor
  object reached twice is listed under both paths.
- `dcp_flatten`: `{"keys": [...], "mapping": {key: [path items]}}` from
  `torch.distributed.checkpoint._nested_dict.flatten_state_dict` (ints stay ints), or null;
  `dcp_flatten_error`: the exception text when it raised, else null.
"""


def write_readme(outdir: Path, manifests: list[dict[str, Any]]) -> None:
    rows = []
    for m in manifests:
        tl = m["torch_load"]
        flags = f"{'yes' if tl['weights_only'] else 'no'} / {'yes' if tl['mmap'] else 'no'}"
        rows.append(f"| `{m['file']}` | {flags} | {m['description']} |")
    head = README_HEAD.format(torch=torchtree.public_torch_version(), command=COMMAND)
    (outdir / "README.md").write_text(head + "\n".join(rows) + "\n" + README_FORMAT, encoding="utf-8")


def write_stamp(outdir: Path, manifests: list[dict[str, Any]]) -> None:
    here = Path(__file__).resolve().parent
    files: dict[str, str | None] = {}
    for m in manifests:
        reproducible = m["save_kwargs"]["_use_new_zipfile_serialization"]
        files[m["file"]] = sha256_file(outdir / m["file"]) if reproducible else None
    stamp = {
        "generator": GENERATOR,
        "generator_sha256": sha256_file(here / GENERATOR),
        "helpers_sha256": {name: sha256_file(here / name) for name in HELPERS},
        "command": COMMAND,
        "torch": torchtree.public_torch_version(),
        "torch_build": torch.__version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "pinned_env": pinenv.PINNED_ENV,
        "files": files,
        "not_byte_reproducible": sorted(k for k, v in files.items() if v is None),
        "training_derived": {f"{c.name}.pt": {"tensors": list(c.trained)} for c in CASES if c.trained},
    }
    write_json(outdir / "STAMP.json", stamp)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    manifests = []
    for case in CASES:
        m = make_case(case, outdir)
        manifests.append(m)
        print(f"wrote {m['file']} ({(outdir / m['file']).stat().st_size} bytes, {len(m['tensors'])} tensors)")
    write_readme(outdir, manifests)
    write_stamp(outdir, manifests)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
