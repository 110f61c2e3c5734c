#!/usr/bin/env python3
"""Load a checkpoint ckpt wrote with the real software and print every tensor it holds.

Usage::

    .venv/bin/python conformance/python/dtypes/check_load.py KIND PATH

KIND is ``pt`` (``torch.load(weights_only=True)`` of a dict of tensors), ``safetensors``
(``safetensors.torch.load_file``, with each header entry's code and shape), ``hf`` (every
``*.safetensors`` shard of the directory PATH, as ``safetensors``, with the index's ``weight_map``, when
there is one, checked against the shards) or ``dcp`` (``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``
of the directory PATH, then ``torch.load``). Prints one JSON document: ``{name: {"dtype": torch name,
"shape": [...], "sha256": of the bytes, "safetensors": {"dtype", "shape"}}}`` (the last for safetensors
files only), the manifest records of ``make_fixtures.py``. Exits non-zero when the load fails.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_fixtures import safetensors_records, torch_record  # noqa: E402

import torch  # noqa: E402


def main(argv: list[str]) -> int:
    kind, path = argv[1], Path(argv[2])
    out: dict[str, Any] = {}
    if kind == "pt":
        out = {k: torch_record(v) for k, v in torch.load(str(path), weights_only=True).items()}
    elif kind == "safetensors":
        out = safetensors_records(path)
    elif kind == "hf":
        indexes = list(path.glob("*.index.json"))
        weight_map = json.loads(indexes[0].read_text())["weight_map"] if indexes else None
        for shard in sorted(path.glob("*.safetensors")):
            for name, rec in safetensors_records(shard).items():
                assert weight_map is None or weight_map[name] == shard.name, (name, shard.name)
                out[name] = rec
        assert weight_map is None or set(weight_map) == set(out), "the index names other tensors than the shards hold"
    elif kind == "dcp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: PLC0415

        with tempfile.TemporaryDirectory() as tmp:
            pt = Path(tmp) / "sd.pt"
            dcp_to_torch_save(str(path), str(pt))
            out = {k: torch_record(v) for k, v in torch.load(str(pt), weights_only=True).items()}
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
