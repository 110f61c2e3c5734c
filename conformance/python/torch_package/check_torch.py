#!/usr/bin/env python3
"""Check that ckpt's ``torch.save`` rewrite of a torch.package archive loads in torch to the tensors its
manifest lists (what ``PackageImporter`` loads): each resource a key of the saved dict, its module (of the
package's class, importable here as the package interned it), TorchScript weights and tensors under it.

Usage::

    .venv/bin/python conformance/python/torch_package/check_torch.py MANIFEST.json REWRITE.pt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "plain_pickle"))

import torch  # noqa: E402

from package_manifest import tensors_of  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    want = json.loads(Path(argv[1]).read_text())["tensors"]
    loaded = torch.load(argv[2], weights_only=False)
    got: dict = {}
    for resource, obj in loaded.items():
        got.update(tensors_of(resource, obj))
    if want != got:
        for name in sorted(set(want) | set(got)):
            if want.get(name) != got.get(name):
                print(f"{name}: PackageImporter {want.get(name)}, torch.load {got.get(name)}", file=sys.stderr)
        return 1
    print(f"{len(want)} tensors equal")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
