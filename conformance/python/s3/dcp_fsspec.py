#!/usr/bin/env python3
"""Prove that ckpt and torch's DCP interoperate over S3 (torch's ``FsspecWriter``/``FsspecReader``
on s3fs).

Usage (the Rust suite runs it with ``.venv/bin/python`` against a local moto S3 server whose bucket
already exists; AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_REGION come from the environment)::

    dcp_fsspec.py write s3://BUCKET/PREFIX --endpoint http://127.0.0.1:PORT --reference REF.pt
    dcp_fsspec.py read  s3://BUCKET/PREFIX --endpoint http://127.0.0.1:PORT --reference REF.pt

* ``write``: saves a fixed, deterministic state dict (float32/bf16/int64 tensors, a nested dict,
  one plain int) as a DCP checkpoint at the URL with ``dcp.save`` + ``FsspecWriter``, and the same
  state dict with ``torch.save`` at REF.pt, so the suite can ``ckpt diff REF.pt s3://...``.
* ``read``: ``dcp.load`` + ``FsspecReader`` of the URL (e.g. written by ``ckpt convert --to
  distcp``) into a template of REF.pt (tensors zeroed, other leaves replaced by a placeholder), then
  checks every tensor equals REF.pt's bit for bit (``torch.equal``, same dtype and shape), every
  other leaf compares equal, and the checkpoint's metadata holds exactly REF.pt's (dotted) keys
  with REF.pt's dtypes and shapes. Exits 0 on success; prints each mismatch and exits 1 otherwise.

Single process, no process group (``no_dist=True``). No network except the given endpoint.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

PLACEHOLDER = "<placeholder>"
warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # no_dist is intended


def s3fs_kwargs(endpoint: str) -> dict[str, Any]:
    """Keyword arguments FsspecWriter/FsspecReader forward to ``fsspec.core.url_to_fs``."""
    return {
        "key": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {
            "endpoint_url": endpoint,
            "region_name": os.environ.get("AWS_REGION", "us-east-1"),
        },
        "skip_instance_cache": True,
    }


def make_state_dict() -> dict[str, Any]:
    return {
        "weight": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 8 - 0.5,
        "bias": torch.arange(5, dtype=torch.bfloat16) * 0.25,
        "steps": torch.arange(6, dtype=torch.int64) * 1_000_000_007,
        "nested": {
            "emb": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) * -1.5,
            "scale": torch.tensor(3.0, dtype=torch.bfloat16),
        },
        "epoch": 7,
    }


def template_of(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: template_of(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    return PLACEHOLDER


def compare(path: str, got: Any, want: Any, errors: list[str]) -> None:
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            errors.append(f"{path}: got {type(got).__name__} {list(getattr(got, 'keys', list)())}, "
                          f"want dict with keys {list(want.keys())}")
            return
        for k in want:
            compare(f"{path}.{k}" if path else k, got[k], want[k], errors)
    elif isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            errors.append(f"{path}: got {type(got).__name__}, want tensor")
        elif got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            errors.append(f"{path}: got {got.dtype} {tuple(got.shape)} {got.flatten()[:8].tolist()}, "
                          f"want {want.dtype} {tuple(want.shape)} {want.flatten()[:8].tolist()}")
    elif type(got) is not type(want) or got != want:
        errors.append(f"{path}: got {got!r}, want {want!r}")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys, as DCP's ``flatten_state_dict`` names nested dict leaves."""
    if isinstance(value, dict):
        return {k2: v2 for k, v in value.items() for k2, v2 in flatten(v, f"{prefix}{k}.").items()}
    return {prefix[:-1]: value}


def check_metadata(md: dict[str, Any], want: Any, errors: list[str]) -> None:
    """``dcp.load`` casts into the template and ignores extra keys: check the stored keys, dtypes
    and shapes against the reference too."""
    flat = flatten(want)
    if md.keys() != flat.keys():
        errors.append(f"checkpoint keys {sorted(md)}, want {sorted(flat)}")
    for k in md.keys() & flat.keys():
        v = flat[k]
        if isinstance(v, torch.Tensor) and not isinstance(md[k], TensorStorageMetadata):
            errors.append(f"{k}: stored as {type(md[k]).__name__}, want a tensor")
        elif isinstance(v, torch.Tensor) and (md[k].properties.dtype, md[k].size) != (v.dtype, v.shape):
            errors.append(f"{k}: stored {md[k].properties.dtype} {tuple(md[k].size)}, "
                          f"want {v.dtype} {tuple(v.shape)}")
        elif not isinstance(v, torch.Tensor) and not isinstance(md[k], BytesStorageMetadata):
            errors.append(f"{k}: stored as {type(md[k]).__name__}, want a pickled object")


def arguments(doc: str) -> argparse.Namespace:
    """The command line both scripts of this directory take: ``write|read URL --endpoint E --reference REF``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("command", choices=["write", "read"])
    parser.add_argument("url", help="s3://bucket/prefix of the DCP checkpoint")
    parser.add_argument("--endpoint", required=True, help="S3 endpoint, e.g. http://127.0.0.1:5077")
    parser.add_argument("--reference", required=True, help="local torch.save file")
    return parser.parse_args()


def main() -> int:
    args = arguments(__doc__)
    fs_kwargs = s3fs_kwargs(args.endpoint)

    return run(args.command, args.url, args.reference,
               lambda: FsspecWriter(args.url, **fs_kwargs), lambda: FsspecReader(args.url, **fs_kwargs))


def run(command: str, url: str, reference: str, writer: Any, reader: Any) -> int:
    """``write`` (``dcp.save`` through ``writer()``, and the reference) or ``read`` (``dcp.load`` through
    ``reader()``, checked against the reference): what both scripts of this directory do with their storage."""
    if command == "write":
        dcp.save(make_state_dict(), storage_writer=writer(), no_dist=True)
        torch.save(make_state_dict(), reference)
        print(f"wrote {url} and {reference}")
        return 0

    want = torch.load(reference, weights_only=True)
    got = template_of(want)
    storage = reader()
    dcp.load(got, storage_reader=storage, no_dist=True)
    errors: list[str] = []
    compare("", got, want, errors)
    check_metadata(storage.read_metadata().state_dict_metadata, want, errors)
    for e in errors:
        print(f"MISMATCH {e}")
    if errors:
        print(f"FAIL: {url} differs from {reference} ({len(errors)} mismatches)")
        return 1
    print(f"OK: {url} equals {reference}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
