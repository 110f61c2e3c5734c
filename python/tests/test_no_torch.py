"""A fresh virtual environment with only the wheel and numpy (no torch, no ml_dtypes) imports ckpt, reads
numpy arrays from every format, names raw dtypes, and runs the ``ckpt`` command; the wheel carries the
libraries its extension links (libhdf5), so it needs nothing from the system but the C library.

The wheel is ``$CKPT_WHEEL`` (scripts/test.sh sets it to the wheel it built); the venv is made with the
Python running the tests, its packages from pip's configured index."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import FIXTURES

SCRIPT = r"""
import sys, os, json
import numpy as np
import ckpt
assert "torch" not in sys.modules and "ml_dtypes" not in sys.modules
F = sys.argv[1]
seen = {}
for case in ["torch/checkpoint.pt", "torch/dtypes.pt", "distcp/torch213/m3", "hfai/single_n3/ckpt", "pbg/ckpt",
             "recis/golden/two_shard_adamw", "values/hf_sharded", "dtypes/dtypes.pt", "dtypes/f6.safetensors"]:
    ck = ckpt.open(os.path.join(F, case))
    n = 0
    for e in ck.entries:
        v = ck[e.name]
        if e.kind == "tensor":
            assert isinstance(v, np.ndarray) and v.shape == e.shape, (case, e.name)
            assert ckpt.dtype_name(v) == e.dtype, (case, e.name, v.dtype)
            n += 1
    seen[ck.format] = n
    sd = ckpt.load(os.path.join(F, case))
bf = ckpt.open(os.path.join(F, "torch/dtypes.pt"))
raw = [bf[e.name] for e in bf.entries if e.dtype == "bfloat16"][0]
assert raw.dtype == np.uint16 and raw.dtype.metadata["ckpt.dtype"] == "bfloat16"
assert "torch" not in sys.modules
libs = [l.split()[-1] for l in open("/proc/self/maps") if "hdf5" in l]
print(json.dumps({"formats": seen, "hdf5": sorted(set(libs))}))
"""


def test_fresh_venv_without_torch(tmp: Path) -> None:
    wheel = os.environ.get("CKPT_WHEEL")
    assert wheel and Path(wheel).exists(), "set CKPT_WHEEL to the wheel to test (scripts/test.sh does)"
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    numpy = __import__("numpy").__version__
    pip = subprocess.run([py, "-m", "pip", "install", "-q", "--no-cache-dir", f"numpy=={numpy}", wheel],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    out = subprocess.run([py, "-c", SCRIPT, str(FIXTURES)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(got["formats"]) == {"torch", "distcp", "hfai", "pbg", "recis", "hf", "safetensors"}
    assert got["hdf5"] and all("ckpt.libs" in p for p in got["hdf5"]), got["hdf5"]
    cli = subprocess.run([str(env_dir / "bin" / "ckpt"), "inspect", str(FIXTURES / "distcp" / "torch213" / "m3")],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and "row" in cli.stdout, cli.stderr
    listed = subprocess.run([py, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
    assert "torch" not in listed and "ml_dtypes" not in listed.lower().replace("-", "_"), listed
