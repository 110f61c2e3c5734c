"""What the plain-pickle fixtures' manifests list (``make_fixtures.py``, ``check_torch.py``): every tensor and
numpy array reachable from a loaded object, by the name ckpt lists it by, with dtype, shape and sha256."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
from torch import nn


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tensor_record(t: torch.Tensor) -> dict[str, Any]:
    t = t.detach().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "sha256": sha256(raw)}


def tensors_by_name(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every tensor (and numpy array) reachable from ``obj`` by the name ckpt lists it by."""
    out: dict[str, Any] = {}

    def join(k: Any) -> str:
        return f"{prefix}.{k}" if prefix else str(k)

    if isinstance(obj, torch.Tensor):
        out[prefix] = tensor_record(obj)
    elif isinstance(obj, np.ndarray):
        out[prefix] = tensor_record(torch.from_numpy(np.ascontiguousarray(obj)))
    elif isinstance(obj, nn.Module):
        for k, v in obj.state_dict().items():
            out.update(tensors_by_name(v, join(k)))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(tensors_by_name(v, join(k)))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out.update(tensors_by_name(v, join(i)))
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for k, v in vars(obj).items():
            out.update(tensors_by_name(v, join(k)))
    return out
