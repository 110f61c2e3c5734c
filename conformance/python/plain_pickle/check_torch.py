#!/usr/bin/env python3
"""Check that ckpt's ``torch.save`` rewrite of a plain pickle loads in torch to the tensors ``pickle.load``
gives for the pickle (by the names ckpt lists them by; numpy arrays as tensors of their dtype).

Usage::

    .venv/bin/python conformance/python/plain_pickle/check_torch.py SOURCE.pkl REWRITE.pt
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from manifest import tensors_by_name  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        want = tensors_by_name(pickle.load(f))
    got = tensors_by_name(torch.load(argv[2], weights_only=False))
    if want != got:
        for name in sorted(set(want) | set(got)):
            if want.get(name) != got.get(name):
                print(f"{name}: pickle.load {want.get(name)}, torch.load {got.get(name)}", file=sys.stderr)
        return 1
    print(f"{len(want)} tensors equal")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
