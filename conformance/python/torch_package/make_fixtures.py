#!/usr/bin/env python3
"""Generate the torch.package fixtures (issue 39): archives written by ``torch.package.PackageExporter``, with
JSON manifests of what ``PackageImporter`` loads.

Usage::

    .venv/bin/python conformance/python/torch_package/make_fixtures.py OUTDIR

Writes into OUTDIR (the committed copy lives in ``conformance/fixtures/package/``):

- ``model.pt``: a package that interns ``package_classes`` (a model class whose module imports ``tqdm``,
  which the package mocks), externs ``numpy``, and holds the pickled resources ``models/model.pkl`` (an
  ``nn.Module`` of the interned class), ``models/scripted.pkl`` (a scripted module: TorchScript under
  ``.data/ts_code/``), ``state/extra.pkl`` (a dict of a tensor, a step count and a numpy array) and the text
  resource ``notes/README.txt``;
- ``tensors.pt``: a package of one pickled dict of tensors (two sharing a storage), nothing interned.

Each ``<name>.json`` lists every tensor by the name ckpt lists it by (``<resource path>.<attribute path>``: a
module's ``state_dict()`` names, a scripted module's ``state_dict()`` names, dict keys; numpy arrays as
tensors of their dtype) with dtype, shape and sha256, and the package's extern and mocked modules, interned
modules and resources. Every value is an exact small dyadic rational. The archives are not byte-reproducible
(the scripted module's persistent id holds ``id()`` of an object, and storage order follows it):
``check_reproducible.py`` compares the manifests exactly and each archive's records and resources as
``PackageImporter`` loads them.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "plain_pickle"))

import pinenv  # noqa: E402

pinenv.pin_environment()

import json  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.package import PackageExporter, PackageImporter  # noqa: E402

import package_classes  # noqa: E402
from package_manifest import tensors_of  # noqa: E402

GENERATOR = "torch_package/make_fixtures.py"

warnings.filterwarnings("ignore")
# Pickling a ScriptModule into a package is gated as a beta feature.
torch.package.package_exporter._gate_torchscript_serialization = False  # noqa: SLF001


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
    m = package_classes.Net().eval()
    with torch.no_grad():
        m.lin.weight.copy_(exact((2, 3), 1))
        m.lin.bias.copy_(exact((2,), 2))
        m.bn.weight.copy_(exact((2,), 3))
        m.bn.bias.copy_(exact((2,), 4))
        m.bn.running_mean.copy_(exact((2,), 5))
        m.bn.running_var.copy_(exact((2,), 6).abs() + 0.5)
        m.bn.num_batches_tracked.fill_(9)
    return m


def scripted() -> torch.jit.ScriptModule:
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(exact((2, 2), 7))
        lin.bias.copy_(exact((2,), 8))
    return torch.jit.script(lin)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n",
                    encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    outdir.mkdir(parents=True, exist_ok=True)

    model = outdir / "model.pt"
    base = exact((4,), 10)
    with PackageExporter(str(model)) as e:
        e.extern(["numpy", "numpy.**"])
        e.mock("tqdm")
        e.intern("package_classes")
        e.save_pickle("models", "model.pkl", net())
        e.save_pickle("models", "scripted.pkl", scripted())
        e.save_pickle("state", "extra.pkl", {"table": exact((3, 2), 11), "step": 12,
                                              "weights": np.arange(3, dtype=np.float64) / 8})
        e.save_text("notes", "README.txt", "a model packaged with torch.package\n")
    small = outdir / "tensors.pt"
    with PackageExporter(str(small)) as e:
        e.save_pickle("data", "tensors.pkl", {"a": base, "head": base[:2], "ids": exact((3,), 12, torch.int64)})

    resources = {"model.pt": ["models/model.pkl", "models/scripted.pkl", "state/extra.pkl"],
                 "tensors.pt": ["data/tensors.pkl"]}
    for path in (model, small):
        imp = PackageImporter(str(path))
        tensors: dict[str, Any] = {}
        for r in resources[path.name]:
            package, _, res = r.rpartition("/")
            tensors.update(tensors_of(r, imp.load_pickle(package, res)))
        externs = imp.zip_reader.get_record(".data/extern_modules").decode().split()
        m = {"file": path.name, "generator": GENERATOR, "torch": torch.__version__.split("+")[0],
             "pickles": resources[path.name], "extern_modules": externs, "tensors": tensors}
        if path == model:
            m["modules"] = ["package_classes"]
            m["mocked_modules"] = ["tqdm"]
            m["text"] = imp.load_text("notes", "README.txt")
        write_json(outdir / f"{path.stem}.json", m)
    print(f"wrote 2 fixtures to {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
