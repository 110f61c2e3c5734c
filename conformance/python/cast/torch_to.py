#!/usr/bin/env python3
"""Cast raw tensors with torch's ``Tensor.to(dtype)``: the reference for ``ckpt_tensor::cast_float``.

Usage::

    .venv/bin/python conformance/python/cast/torch_to.py DIR

DIR holds ``spec.json`` (``{"inputs": [{"file": F, "dtype": torch name}], "targets": [torch names]}``) and the
input files: the little-endian bytes of a 1-D tensor of that dtype. For every input and target this writes
``F.<target>``: the bytes of ``torch.frombuffer(F).view(dtype).to(target)``.

Runs under the conformance suite's pinned environment (``pinenv.py``: ``ATEN_CPU_CAPABILITY=default``), where
torch uses its portable CPU kernels; its AVX2/AVX-512 kernels write some NaN payloads differently, so NaN bits
would otherwise depend on the CPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pinenv  # noqa: E402

pinenv.pin_environment()

import torch  # noqa: E402


def main() -> int:
    root = Path(sys.argv[1])
    spec = json.loads((root / "spec.json").read_text())
    torch.set_num_threads(1)
    for item in spec["inputs"]:
        raw = bytearray((root / item["file"]).read_bytes())
        src = torch.frombuffer(raw, dtype=torch.uint8).view(getattr(torch, item["dtype"]))
        for target in spec["targets"]:
            out = src.to(getattr(torch, target)).contiguous()
            (root / f"{item['file']}.{target}").write_bytes(out.view(torch.uint8).numpy().tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
