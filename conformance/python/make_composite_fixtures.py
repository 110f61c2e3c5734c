#!/usr/bin/env python3
"""Generate the fixtures of quantized, sparse and nested tensors as checkpoint entries (issue 39, point 5),
each saved by the real torch with ``torch.save``, with JSON manifests of what ``torch.load`` gives.

Usage::

    .venv/bin/python conformance/python/make_composite_fixtures.py OUTDIR

Writes into OUTDIR (the committed copy lives in ``conformance/fixtures/composite/``):

- ``quantized.pt``: ``torch.quantize_per_tensor`` tensors of ``quint8``, ``qint8`` and ``qint32``, and
  ``torch.quantize_per_channel`` tensors of ``qint8`` (axis 1) and ``quint8`` (axis 0), next to one dense
  tensor; scales such as 0.1 that float32 cannot hold, so that the dequantization's rounding shows;
- ``sparse.pt``: ``to_sparse()`` (COO, coalesced), an uncoalesced ``sparse_coo_tensor`` with a repeated index,
  a hybrid COO tensor (one dense dimension), ``to_sparse_csr``, ``to_sparse_csc``, ``to_sparse_bsr`` and
  ``to_sparse_bsc`` (2x2 blocks), of float32 and int64 values;
- ``nested.pt``: ``torch.nested.nested_tensor`` of three float32 tensors of different first dimensions, and
  one of int64 values.

Each ``<name>.json`` lists every entry by name: ``dense`` tensors (dtype, shape, hex of the bytes); composite
ones with their ``layout`` (``per_tensor_affine``, ``per_channel_affine``, ``sparse_coo``, ``sparse_csr``,
``sparse_csc``, ``sparse_bsr``, ``sparse_bsc``, ``nested``), ``dtype``, ``shape`` (the dense shape; a
nested tensor's number of tensors), ``axis`` (per-channel), their ``components`` as torch gives them
(``int_repr``/``scale``/``zero_point``, ``indices``/``values``, ``crow_indices``/``col_indices``/``values``,
``ccol_indices``/``row_indices``/``values``, ``buffer``/``sizes``/``strides``/``storage_offsets``) and
``to_dense`` (``dequantize()`` or ``to_dense()``; none for a nested tensor), each as dtype, shape and the hex
of its contiguous bytes. ``STAMP.json`` records the generator's sha256, the versions and the sha256 of every
file. Every file is byte-reproducible with the pinned wheels.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pinenv  # noqa: E402

pinenv.pin_environment()

import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

GENERATOR = "make_composite_fixtures.py"

warnings.filterwarnings("ignore")


def exact(shape: tuple[int, ...], k: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Element i is ``((i * (2k + 5) + k) % 17 - 8) / 16`` (an int for integer dtypes)."""
    n = 1
    for d in shape:
        n *= d
    v = (torch.arange(n, dtype=torch.int64) * (2 * k + 5) + k) % 17 - 8
    if dtype.is_floating_point:
        return (v.to(torch.float64) / 16).to(dtype).reshape(shape)
    return v.to(dtype).reshape(shape)


def record(t: torch.Tensor) -> dict[str, Any]:
    """dtype, shape and the hex of the contiguous bytes (a quantized tensor's int representation)."""
    t = t.detach()
    if t.is_quantized:
        t = t.int_repr()
    t = t.contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "hex": raw.hex()}


def scalar(v: Any, dtype: torch.dtype) -> dict[str, Any]:
    return record(torch.tensor(v, dtype=dtype))


def describe(t: torch.Tensor) -> dict[str, Any]:
    if t.is_quantized:
        q = t.qscheme()
        if q == torch.per_tensor_affine:
            comps = {"int_repr": record(t), "scale": scalar(t.q_scale(), torch.float64),
                     "zero_point": scalar(t.q_zero_point(), torch.int64)}
            extra: dict[str, Any] = {"layout": "per_tensor_affine"}
        else:
            comps = {"int_repr": record(t), "scale": record(t.q_per_channel_scales()),
                     "zero_point": record(t.q_per_channel_zero_points())}
            extra = {"layout": "per_channel_affine", "axis": t.q_per_channel_axis()}
        return {**extra, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                "components": comps, "to_dense": record(t.dequantize())}
    if t.is_nested:
        return {"layout": "nested", "dtype": str(t.dtype).removeprefix("torch."), "shape": [t.size(0)],
                "components": {"buffer": record(t.values()), "sizes": record(t._nested_tensor_size()),
                               "strides": record(t._nested_tensor_strides()),
                               "storage_offsets": record(t._nested_tensor_storage_offsets())},
                "to_dense": None}
    layout = str(t.layout).removeprefix("torch.")
    if t.layout == torch.sparse_coo:
        comps = {"indices": record(t._indices()), "values": record(t._values())}
        extra = {"coalesced": t.is_coalesced()}
    elif t.layout in (torch.sparse_csr, torch.sparse_bsr):
        comps = {"crow_indices": record(t.crow_indices()), "col_indices": record(t.col_indices()),
                 "values": record(t.values())}
        extra = {}
    elif t.layout in (torch.sparse_csc, torch.sparse_bsc):
        comps = {"ccol_indices": record(t.ccol_indices()), "row_indices": record(t.row_indices()),
                 "values": record(t.values())}
        extra = {}
    else:
        return {"dense": record(t)}
    return {"layout": layout, **extra, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "components": comps, "to_dense": record(t.to_dense())}


def quantized() -> dict[str, Any]:
    x = exact((2, 3), 1) * 3
    return {
        "weight": exact((2, 2), 4),
        "q_u8": torch.quantize_per_tensor(x, 0.1, 7, torch.quint8),
        "q_i8": torch.quantize_per_tensor(x, 0.05, -3, torch.qint8),
        "q_i32": torch.quantize_per_tensor(x, 0.001, 12, torch.qint32),
        "q_channel": torch.quantize_per_channel(
            exact((2, 3), 2) * 2, torch.tensor([0.1, 0.3, 0.7], dtype=torch.float64),
            torch.tensor([0, 2, -1]), 1, torch.qint8),
        "q_channel_u8": torch.quantize_per_channel(
            exact((2, 4), 3), torch.tensor([0.02, 0.375], dtype=torch.float64), torch.tensor([128, 100]), 0,
            torch.quint8),
    }


def sparse() -> dict[str, Any]:
    mask = (torch.arange(24).reshape(4, 6) % 3 == 0)
    m = exact((4, 6), 5) * mask
    mi = (exact((4, 6), 6, torch.int64) * mask).to(torch.int64)
    return {
        "weight": exact((3,), 1),
        "coo": m.to_sparse(),
        "coo_uncoalesced": torch.sparse_coo_tensor(torch.tensor([[0, 1, 2, 0], [2, 0, 1, 2]]),
                                                   exact((4,), 7), (3, 3)),
        "coo_hybrid": torch.sparse_coo_tensor(torch.tensor([[0, 2]]), exact((2, 3), 8), (4, 3)),
        "csr": m.to_sparse_csr(),
        "csr_int": mi.to_sparse_csr(),
        "csc": m.to_sparse_csc(),
        "bsr": m.to_sparse_bsr((2, 2)),
        "bsc": m.to_sparse_bsc((2, 3)),
    }


def nested() -> dict[str, Any]:
    return {
        "weight": exact((2,), 2),
        "nested": torch.nested.nested_tensor([exact((2, 3), 1), exact((1, 3), 2), exact((3, 3), 3)]),
        "nested_int": torch.nested.nested_tensor([exact((2,), 4, torch.int64), exact((4,), 5, torch.int64)]),
    }


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, sort_keys=True, indent=1, allow_nan=False) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    for name, make in [("quantized", quantized), ("sparse", sparse), ("nested", nested)]:
        state = make()
        path = outdir / f"{name}.pt"
        torch.save(state, path)
        loaded = torch.load(path, weights_only=True)
        write_json(outdir / f"{name}.json", {k: describe(v) for k, v in loaded.items()})
        print(path)
    files = sorted(p for p in outdir.iterdir() if p.is_file() and p.name != "STAMP.json")
    stamp = {
        "generator": GENERATOR,
        "generator_sha256": hashlib.sha256((HERE / GENERATOR).read_bytes()).hexdigest(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "files": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files},
    }
    write_json(outdir / "STAMP.json", stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
