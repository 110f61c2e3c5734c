"""What the torch.package fixtures' manifests list (``make_fixtures.py``, ``check_torch.py``): the tensors of
a loaded resource by the name ckpt lists them by."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from manifest import tensor_record


def tensors_of(name: str, obj: Any) -> dict[str, Any]:
    """Every tensor of a loaded resource by the name ckpt lists it by."""
    out: dict[str, Any] = {}
    if isinstance(obj, torch.jit.ScriptModule | nn.Module):
        for k, v in obj.state_dict().items():
            out[f"{name}.{k}"] = tensor_record(v)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, torch.Tensor):
                out[f"{name}.{k}"] = tensor_record(v)
            elif isinstance(v, np.ndarray):
                out[f"{name}.{k}"] = tensor_record(torch.from_numpy(v))
    return out
