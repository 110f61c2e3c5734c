"""Classes the plain-pickle fixtures pickle (``make_fixtures.py``), importable by ``pickle.load`` in the
checkers: a scikit-style estimator wrapper holding a fitted ``nn.Module`` and numpy arrays, as older training
code and sklearn-style wrappers (skorch's ``NeuralNet``) ``pickle.dump`` themselves."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class Net(nn.Module):
    """A small network: a linear layer and a batch norm (buffers, one of them an integer)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)


class Wrapper:
    """An estimator wrapper: the fitted module, its classes as a numpy array, a loss history with a tensor,
    hyper-parameters (a plain class whose ``__dict__`` is pickled)."""

    def __init__(self, module: nn.Module, classes: np.ndarray, history: list[torch.Tensor]) -> None:
        self.module_ = module
        self.classes_ = classes
        self.history_ = history
        self.lr = 0.125
        self.max_epochs = 3
