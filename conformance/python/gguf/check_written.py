#!/usr/bin/env python3
"""Checks a GGUF file ckpt wrote against gguf-py: ``GGUFReader`` reads it; its metadata is the JSON given; each
tensor has the shape of the source tensor of its name (GGUF's dimensions reversed) and, block for block, the
bytes ``gguf.quants.quantize`` makes of the source's float32 values for its ggml type (integers as stored).

Usage::

    .venv/bin/python conformance/python/gguf/check_written.py SOURCE.safetensors WRITTEN.gguf METADATA

METADATA: a JSON file of ``{key: value}`` as ``GGUFReader``'s ``contents()`` gives them, or a GGUF file whose
metadata the written one must carry (but ``general.alignment``). Prints ``N tensors equal``.
"""

from __future__ import annotations

import json
import sys

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

T = gguf.GGMLQuantizationType


def main() -> None:
    # 16-bit floats widened to float32 exactly (numpy has no bfloat16); other dtypes as stored.
    source = {k: (v.float() if v.dtype in (torch.float16, torch.bfloat16) else v).numpy()
              for k, v in load_file(sys.argv[1]).items()}
    reader = gguf.GGUFReader(sys.argv[2])
    if sys.argv[3].endswith(".gguf"):
        original = gguf.GGUFReader(sys.argv[3]).fields
        want_metadata = {k: f.contents() for k, f in original.items() if not k.startswith("GGUF.")}
    else:
        want_metadata = json.loads(open(sys.argv[3]).read())
    got_metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert got_metadata == want_metadata, (got_metadata, want_metadata)
    assert sorted(t.name for t in reader.tensors) == sorted(source), ([t.name for t in reader.tensors], list(source))
    for t in reader.tensors:
        values = source[t.name]
        assert list(reversed([int(d) for d in t.shape])) == list(values.shape), (t.name, t.shape, values.shape)
        raw = np.ascontiguousarray(t.data).view(np.uint8).tobytes()
        if t.tensor_type in (T.I8, T.I16, T.I32, T.I64):
            want = values.tobytes()
        else:
            want = np.ascontiguousarray(gguf.quants.quantize(values.astype(np.float32), t.tensor_type)).tobytes()
        assert raw == want, f"{t.name} ({t.tensor_type.name}): bytes differ from gguf.quants.quantize"
    print(f"{len(reader.tensors)} tensors equal")


if __name__ == "__main__":
    main()
