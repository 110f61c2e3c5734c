#!/usr/bin/env python3
"""The fixed process environment the fixture generators run under (imports nothing heavy).

``pin_environment()`` must run before torch is imported: it re-executes the current script with
``PINNED_ENV`` applied unless the environment already matches.

* ``PYTHONHASHSEED=0`` fixes str-hash and thus set iteration order (sets are pickled in
  iteration order).
* ``ATEN_CPU_CAPABILITY=default`` selects torch's scalar CPU kernels and ``MKL_CBWR=COMPATIBLE``
  MKL's conditional-numerical-reproducibility mode; without them the optimizer and checkpoint
  fixtures differ in the last bits between AVX2 and AVX-512 hosts (verified on torch 2.13).
* One OpenMP/MKL thread keeps reductions in a fixed order; no CUDA device is used.
"""

from __future__ import annotations

import os
import sys

PINNED_ENV: dict[str, str] = {
    "PYTHONHASHSEED": "0",
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "CUDA_VISIBLE_DEVICES": "",
    "TZ": "UTC",
    "LC_ALL": "C.UTF-8",
}


def pin_environment() -> None:
    """Re-execute the running script under ``PINNED_ENV`` unless it already runs under it."""
    if all(os.environ.get(k) == v for k, v in PINNED_ENV.items()):
        return
    if "torch" in sys.modules:
        raise RuntimeError("pin_environment() must run before torch is imported")
    env = dict(os.environ)
    env.update(PINNED_ENV)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)
