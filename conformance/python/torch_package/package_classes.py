"""The code the torch.package fixture interns (``make_fixtures.py``): a model class, and an import of a
module the package mocks (``tqdm``: a progress bar the model never needs to run)."""

from __future__ import annotations

import torch
from torch import nn

try:
    import tqdm  # noqa: F401 - mocked in the package
except ImportError:  # pragma: no cover - the generator's environment has it
    tqdm = None


class Net(nn.Module):
    """A linear layer and a batch norm, and a tensor attribute that is not in ``state_dict()``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))
