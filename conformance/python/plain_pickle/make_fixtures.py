#!/usr/bin/env python3
"""Generate the plain-pickle fixtures (issue 39): objects holding tensors, modules and numpy arrays written by
``pickle.dump`` (not ``torch.save``), with JSON manifests of what ``pickle.load`` gives.

Usage::

    .venv/bin/python conformance/python/plain_pickle/make_fixtures.py OUTDIR

Writes into OUTDIR (the committed copy lives in ``conformance/fixtures/pickle/``):

- ``wrapper_p0.pkl`` ... ``wrapper_p5.pkl``: ``pickle.dump(wrapper, f, protocol=N)`` of an estimator wrapper
  (``pickle_classes.Wrapper``) holding a fitted ``nn.Module`` (a linear layer and a batch norm), a numpy ``float32`` array of class weights and a loss-history list of tensors.
  Every tensor's storage reduces to ``torch.storage._load_from_bytes(b"...")``, a whole legacy
  ``torch.save`` stream of the storage alone; under protocol 5 the numpy array is numpy's
  ``_frombuffer(bytearray, dtype, shape, order)``, under the others ``_reconstruct`` with its state;
- ``module_p4.pkl``: ``pickle.dump(net)`` of the module itself (ckpt lists its ``state_dict()``);
- ``tensors_p2.pkl``: a dict of a tensor, a parameter with ``requires_grad``, a transposed view and an
  ``int64`` tensor (protocol 2: the stream bytes are ``_codecs.encode(str, 'latin1')``).

Each ``<name>.json`` lists every tensor by the name ckpt lists it by (dict keys, object attributes, list
positions, a module's ``state_dict()`` names joined by ``.``; numpy arrays as tensors of their dtype), with
dtype, shape and sha256 of its contiguous bytes, and the protocol. Every value is an exact small dyadic
rational. The pickles are not byte-reproducible: each embedded ``torch.save`` stream names its storage by its
memory address (``str(storage._cdata)``); ``check_reproducible.py`` compares everything else exactly.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import pinenv  # noqa: E402

pinenv.pin_environment()

import json  # noqa: E402
import pickle  # noqa: E402
import pickletools  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import pickle_classes  # noqa: E402
from manifest import tensors_by_name  # noqa: E402

GENERATOR = "plain_pickle/make_fixtures.py"

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


def net() -> nn.Module:
    m = pickle_classes.Net().eval()
    with torch.no_grad():
        m.lin.weight.copy_(exact((2, 3), 1))
        m.lin.bias.copy_(exact((2,), 2))
        m.bn.weight.copy_(exact((2,), 3))
        m.bn.bias.copy_(exact((2,), 4))
        m.bn.running_mean.copy_(exact((2,), 5))
        m.bn.running_var.copy_(exact((2,), 6).abs() + 0.5)
        m.bn.num_batches_tracked.fill_(12)
    return m


def wrapper() -> pickle_classes.Wrapper:
    classes = (np.arange(4, dtype=np.float32) - 1.5) / 4
    return pickle_classes.Wrapper(net(), classes, [exact((2,), 7), exact((1,), 8)])


def tensors() -> dict[str, Any]:
    base = exact((3, 4), 9)
    return {
        "weight": exact((2, 2), 10),
        "param": nn.Parameter(exact((3,), 11)),
        "view": base.t(),
        "ids": exact((5,), 12, torch.int64),
        "step": 4,
    }


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n",
                    encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    cases: list[tuple[str, Any, int, str]] = [
        (f"wrapper_p{p}.pkl", wrapper(), p, f"pickle.dump(protocol={p}) of an estimator wrapper holding an "
         "nn.Module, a numpy array and a list of tensors") for p in range(6)
    ]
    cases.append(("module_p4.pkl", net(), 4, "pickle.dump(protocol=4) of the nn.Module itself"))
    cases.append(("tensors_p2.pkl", tensors(), 2, "pickle.dump(protocol=2) of a dict of tensors, a parameter and "
                  "a transposed view"))
    for name, obj, protocol, what in cases:
        data = pickle.dumps(obj, protocol=protocol)
        (outdir / name).write_bytes(data)
        ops = {op.name for op, _, _ in pickletools.genops(data)}
        assert ("PROTO" in ops) == (protocol >= 2), (name, ops)
        assert b"_load_from_bytes" in data, name
        loaded = pickle.loads(data)
        m = {"file": name, "generator": GENERATOR, "description": what, "protocol": protocol,
             "torch": torch.__version__.split("+")[0], "numpy": np.__version__,
             "tensors": tensors_by_name(loaded)}
        if isinstance(loaded, nn.Module):
            m["state_dict"] = list(loaded.state_dict())
        write_json(outdir / (Path(name).stem + ".json"), m)
    print(f"wrote {len(cases)} fixtures to {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
