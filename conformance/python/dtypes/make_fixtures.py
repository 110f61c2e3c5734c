#!/usr/bin/env python3
"""Generate the fixtures of every dtype torch and safetensors have beyond the classic ones (issue 39, point 4),
each written by the real software, with a manifest of what it reads back.

Usage::

    .venv/bin/python conformance/python/dtypes/make_fixtures.py OUTDIR

Writes into OUTDIR (the committed copy lives in ``conformance/fixtures/dtypes/``):

- ``dtypes.pt``: ``torch.save`` of one tensor of each dtype: ``float4_e2m1fn_x2`` ``[8, 32]`` (every byte,
  so every pair of FP4 values), ``float8_e8m0fnu``, ``float8_e4m3fnuz`` and ``float8_e5m2fnuz`` (every bit
  pattern), ``uint16``/``uint32``/``uint64`` (0, 1, the top bit, the maximum), ``complex32`` (finite values,
  a signed zero, an infinity);
- ``dtypes.safetensors``: ``safetensors.torch.save_file`` of the same tensors but ``complex32`` (safetensors
  has no code for it): ``F4`` with the last dimension doubled (``[8, 64]``: safetensors counts values),
  ``F8_E8M0``, ``F8_E4M3FNUZ``, ``F8_E5M2FNUZ``, ``U16``, ``U32``, ``U64``;
- ``f6.safetensors``: ``F6_E2M3`` ``[2, 8]`` and ``F6_E3M2`` ``[1, 4]`` (four 6-bit values in three bytes)
  with their ``F8_E8M0`` block scales. safetensors 0.8's Python API cannot write F6 (``TensorSpec`` refuses
  its codes; torch has no float6 dtype), so the file is laid out here as the ``safetensors`` crate lays
  it out (entries sorted by alignment then name, the header padded with spaces to 8 bytes), and
  safetensors' own parser (``safe_open``) must read its header back as written;
- ``dcp/``: ``torch.distributed.checkpoint.save`` of the tensors of ``dtypes.pt`` (one process), saved from
  OUTDIR with the relative ``checkpoint_id`` ``dcp`` and the random ``save_id`` replaced by a fixed uuid
  (as ``distcp/make_fixtures.py`` does), so ``.metadata`` is byte-reproducible;
- ``f4_truncated.safetensors``: a hostile file, ``dtypes.safetensors`` less the last 16 bytes of its FP4
  data (``safe_open`` refuses it).

``manifest.json`` lists, for each file, every tensor as the real software reads it: torch's dtype name
(ckpt's ``float6_e2m3fn_x4``/``float6_e3m2fn_x4`` for F6, which torch lacks), the shape torch gives (a
packed dtype's last dimension counting packed elements: ``float4_e2m1fn_x2 [8, 32]`` for ``F4 [8, 64]``),
the safetensors code and header shape where there is one, and the sha256 of the bytes; the versions that
wrote it; the sha256 of every file. Every file is byte-reproducible with the pinned wheels.
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
import struct  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import safetensors  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.distributed.checkpoint.filesystem as dcp_fs  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

warnings.filterwarnings("ignore")

GENERATOR = "dtypes/make_fixtures.py"


def every_byte(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).reshape(shape)


def tensors() -> dict[str, torch.Tensor]:
    big = [0, 1, -(2**63), -1]  # as int64 bits: 0, 1, 2**63, 2**64 - 1 in uint64
    return {
        "float4_e2m1fn_x2": every_byte(torch.float4_e2m1fn_x2, (8, 32)),
        "float8_e8m0fnu": every_byte(torch.float8_e8m0fnu, (16, 16)),
        "float8_e4m3fnuz": every_byte(torch.float8_e4m3fnuz, (256,)),
        "float8_e5m2fnuz": every_byte(torch.float8_e5m2fnuz, (2, 128)),
        "uint16": torch.tensor([0, 1, 2**15, 2**16 - 1, 12345], dtype=torch.int32).to(torch.uint16),
        "uint32": torch.tensor([0, 1, 2**31, 2**32 - 1], dtype=torch.int64).to(torch.uint32).reshape(2, 2),
        "uint64": torch.tensor(big, dtype=torch.int64).view(torch.uint64),
        "complex32": torch.tensor([1 + 2j, -0.5 + 0.25j, -0.0 + 0j, float("inf") - 3j],
                                  dtype=torch.complex64).to(torch.complex32),
    }


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def torch_record(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "sha256": sha(raw(t))}


def header(path: Path) -> tuple[dict[str, Any], int]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), 8 + n


def safetensors_records(path: Path) -> dict[str, Any]:
    """What safetensors.torch loads, with the header's code and shape."""
    head, _ = header(path)
    loaded = load_file(str(path))
    out = {}
    for name, t in loaded.items():
        rec = torch_record(t)
        rec["safetensors"] = {"dtype": head[name]["dtype"], "shape": head[name]["shape"]}
        out[name] = rec
    return out


# safetensors' alignment order (its Dtype enum, largest first is how it sorts): F8_E8M0 (1 byte) sorts after
# the F6 codes, which precede U8 in the enum; the crate sorts by descending dtype then name.
F6_TENSORS = [
    # name, code, header shape, bytes
    ("w_e2m3", "F6_E2M3", [2, 8], bytes(range(0, 12 * 21, 21))),
    ("w_e3m2", "F6_E3M2", [1, 4], bytes([0x3F, 0xC1, 0x5A])),
    ("scales", "F8_E8M0", [3], bytes([127, 120, 130])),
]
F6_CKPT = {"F6_E2M3": "float6_e2m3fn_x4", "F6_E3M2": "float6_e3m2fn_x4", "F8_E8M0": "float8_e8m0fnu"}


def write_f6(path: Path) -> dict[str, Any]:
    # The safetensors crate's layout: sorted by dtype (its enum order, descending), then name.
    order = ["F8_E8M0", "F6_E3M2", "F6_E2M3"]  # descending in safetensors' Dtype enum: F8_E8M0 > F6_E3M2 > F6_E2M3
    items = sorted(F6_TENSORS, key=lambda x: (order.index(x[1]), x[0]))
    head: dict[str, Any] = {}
    offset = 0
    for name, code, shape, data in items:
        head[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(d for _, _, _, d in items))
    out = {}
    with safe_open(str(path), "np") as f:  # safetensors' parser reads the header back as written
        for name, code, shape, data in F6_TENSORS:
            sl = f.get_slice(name)
            assert sl.get_dtype() == code and list(sl.get_shape()) == shape, (name, sl.get_dtype(), sl.get_shape())
            packed = {"F6_E2M3": 4, "F6_E3M2": 4}.get(code, 1)
            ckpt_shape = shape[:-1] + [shape[-1] // packed]
            out[name] = {"dtype": F6_CKPT[code], "shape": ckpt_shape, "sha256": sha(data),
                         "safetensors": {"dtype": code, "shape": shape}}
    return out


def dcp_records(path: Path, like: dict[str, torch.Tensor]) -> dict[str, Any]:
    target = {k: torch.empty_like(v) for k, v in like.items()}
    dcp.load(target, checkpoint_id=str(path))
    return {k: torch_record(v) for k, v in target.items()}


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    sd = tensors()
    files: dict[str, Any] = {}

    torch.save(sd, str(out / "dtypes.pt"))
    loaded = torch.load(str(out / "dtypes.pt"), weights_only=True)
    files["dtypes.pt"] = {"reader": "torch.load", "tensors": {k: torch_record(v) for k, v in loaded.items()}}

    st = {k: v for k, v in sd.items() if k != "complex32"}
    save_file(st, str(out / "dtypes.safetensors"))
    files["dtypes.safetensors"] = {"reader": "safetensors.torch.load_file",
                                   "tensors": safetensors_records(out / "dtypes.safetensors")}

    files["f6.safetensors"] = {"reader": "safetensors.safe_open (header), the file's bytes",
                               "tensors": write_f6(out / "f6.safetensors")}

    digest = hashlib.sha256(b"dtypes/0").hexdigest()
    fixed = f"{digest[0:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"
    dcp_fs._generate_uuid = lambda: fixed  # type: ignore[attr-defined]
    here = Path.cwd()
    os.chdir(out)
    try:
        dcp.save(sd, checkpoint_id="dcp")
    finally:
        os.chdir(here)
    files["dcp"] = {"reader": "torch.distributed.checkpoint.load", "tensors": dcp_records(out / "dcp", sd)}

    whole = (out / "dtypes.safetensors").read_bytes()
    head, start = header(out / "dtypes.safetensors")
    f4_end = start + head["float4_e2m1fn_x2"]["data_offsets"][1]
    cut = whole[: f4_end - 16] if f4_end == len(whole) else whole[:-16]
    (out / "f4_truncated.safetensors").write_bytes(cut)
    try:
        with safe_open(str(out / "f4_truncated.safetensors"), "pt") as f:
            f.get_tensor("float4_e2m1fn_x2")
        refused = None
    except Exception as e:  # noqa: BLE001
        refused = f"{type(e).__name__}: {e}"
    assert refused is not None, "safetensors opened the truncated file"
    files["f4_truncated.safetensors"] = {"reader": "safetensors.safe_open", "refused": refused,
                                         "truncated_bytes": 16}

    digests = {str(p.relative_to(out)): sha(p.read_bytes())
               for p in sorted(out.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    manifest = {
        "generator": GENERATOR,
        "versions": {"python": platform.python_version(), "torch": torch.__version__.split("+")[0],
                     "safetensors": safetensors.__version__},
        "files": files,
        "sha256": digests,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
