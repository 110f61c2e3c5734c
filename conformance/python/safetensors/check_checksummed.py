"""Loads a safetensors file ckpt wrote with per-tensor checksums in its header (`ckpt.crc32c`) with the
Hugging Face `safetensors` library, both ways it reads (`load_file`, `safe_open`), and prints what it found
as JSON for the Rust test to compare: every tensor's dtype, shape and values, and the metadata map.

Usage: check_checksummed.py FILE
"""

import json
import sys

import safetensors.torch
from safetensors import safe_open


def main() -> None:
    path = sys.argv[1]
    loaded = safetensors.torch.load_file(path)
    out = {"tensors": {}, "metadata": {}}
    with safe_open(path, framework="pt") as f:
        out["metadata"] = f.metadata() or {}
        for key in f.keys():
            t = f.get_tensor(key)
            if not bool((t == loaded[key]).all()):
                raise SystemExit(f"{key}: safe_open and load_file differ")
            out["tensors"][key] = {
                "dtype": str(t.dtype),
                "shape": list(t.shape),
                "values": t.flatten().double().tolist(),
            }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
