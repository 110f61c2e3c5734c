"""Classes the real-file fixtures pickle (``make_real_fixtures.py``), importable by ``torch.load`` in the
checkers: stand-ins for what published model files carry inside their checkpoints (Lightning's
``AttributeDict``, a metric object with tensor state, a transform module with buffers, a Python 2
old-style class), written without the packages themselves."""

from __future__ import annotations

import torch
from torch import nn


class AttributeDict(dict):
    """Lightning's ``AttributeDict``: a dict whose keys read as attributes (pickled as a dict subclass:
    its items by SETITEMS on the object)."""

    def __getattr__(self, key: str):  # noqa: ANN204
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(key) from e


class Scaler(nn.Module):
    """A transform module with buffers (chemprop's scalers keep ``mean`` and ``scale``)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.arange(n, dtype=torch.float32) / 4)
        self.register_buffer("scale", torch.full((n,), 0.5))


class Metric:
    """A metric object with tensor state (as torchmetrics keeps ``_defaults`` and running sums), a plain
    class whose ``__dict__`` is pickled."""

    def __init__(self) -> None:
        self.name = "mae"
        self.total = torch.tensor([7.5, 1.25], dtype=torch.float64)
        self.count = torch.tensor(3)
        self.history = [torch.tensor([0.5]), torch.tensor([0.25])]


class OldStyle:
    """Stands for a Python 2 old-style class instance (pickled with OBJ, its ``__dict__`` by BUILD)."""

    def __init__(self) -> None:
        self.epoch = 3
        self.note = "old-style"
