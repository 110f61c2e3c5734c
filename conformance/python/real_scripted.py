"""The module of ``conformance/fixtures/real/scripted.jit``: compiled by ``make_real_fixtures.py`` under the
fixed file name ``real_scripted.py`` (so that the archive's ``.debug_pkl`` records name no path of the
machine that made it), scripted, frozen with ``inner`` kept, and saved with ``torch.jit.save``. Freezing
turns ``offset`` and ``shift`` into the tensor constants of ``constants.pkl``; ``inner``'s parameters and
buffers stay attributes, which ``state_dict()`` lists, and so does its ``_state``, a tensor attribute that is
neither a parameter nor a buffer (``state_dict()`` leaves it out)."""

import torch
from torch import nn


class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, 3))
        self.bias = nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight.t()) + self.bias


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2))
        self.bias = nn.Parameter(torch.zeros(2))
        self.register_buffer("running_mean", torch.zeros(2))
        self.register_buffer("running_var", torch.ones(2))
        self.register_buffer("num_batches_tracked", torch.tensor(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.running_mean) / torch.sqrt(self.running_var + 1e-5) * self.weight + self.bias


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = Affine()
        self.bn = Norm()
        self.register_buffer("scale", torch.ones(1))
        self._state = torch.zeros(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x)) * self.scale + self._state


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.register_buffer("offset", torch.tensor([0.25, -0.5]))
        self.register_buffer("shift", torch.tensor([-0.1875, -0.3125]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + self.offset - self.shift
