#!/usr/bin/env python3
"""Generate the GGUF fixtures (issue 42): files written by gguf-py's ``GGUFWriter``, with a manifest of what
gguf-py's ``GGUFReader`` and ``gguf.quants.dequantize`` read back.

Usage::

    .venv/bin/python conformance/python/gguf/make_fixtures.py OUTDIR

Writes into OUTDIR (the committed copy lives in ``conformance/fixtures/gguf/``):

- ``metadata.gguf``: metadata of every GGUF value type (the twelve scalars, strings, arrays of each, an array of
  strings, nested arrays, a long token list), and one tensor of each plain ggml type GGUFWriter takes from numpy
  (F32, F16, F64, I8, I16, I32, I64) plus BF16 through ``gguf.quants.quantize``, in one, two and three dimensions;
- ``quants.gguf``: one tensor of each type ``gguf.quants.quantize`` makes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, TQ1_0,
  TQ2_0, MXFP4), quantized from seeded random floats, and one of each type gguf-py only dequantizes (Q2_K, Q3_K,
  Q4_K, Q5_K, Q6_K, NVFP4), written as raw blocks made from seeded random bytes whose f16 scales are overwritten
  with finite values (no NaN or infinity, so that every reader agrees on them);
- ``aligned64.gguf``: ``general.alignment`` 64 (``add_custom_alignment``), tensors of odd byte sizes between;
- ``v2.gguf``: ``metadata.gguf`` with its version field set to 2 (GGUF v2 and v3 lay little-endian files out
  alike; ``GGUFReader`` reads both, and the generator checks it reads this one).

``manifest.json`` lists, for each file, its version, alignment, data offset and sha256; every metadata key with
its value type (and element type for arrays) and value as ``GGUFReader`` gives it (floats as the exact decimal
of their f32 or f64 value); every tensor with its ggml type, its shape as gguf-py's dequantized numpy array has
it (torch order: GGUF stores dimensions innermost first, the reverse), its absolute data offset and byte size,
the sha256 of its raw bytes and, for the types ``gguf.quants.dequantize`` knows, the sha256 of its f32 values
(little-endian). Every file is byte-reproducible with the pinned gguf wheel.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import pinenv  # noqa: E402

pinenv.pin_environment()

import hashlib  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
from typing import Any  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402

QUANTIZED = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.TQ1_0, T.TQ2_0, T.MXFP4]
# Types gguf-py dequantizes but does not quantize, and where their f16 scale fields lie in a block
# (byte offsets): every other byte of a block is random.
RAW: dict[T, list[int]] = {
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.NVFP4: [],
}


def write_metadata_file(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -2_000_000_000)
    w.add_float32("test.f32", 0.1)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "héllo, gguf ✓")
    w.add_uint64("test.u64", 18_000_000_000_000_000_000)
    w.add_int64("test.i64", -9_000_000_000_000_000_000)
    w.add_float64("test.f64", -2.5e-300)
    for vtype, values in [
        (V.UINT8, [0, 1, 255]),
        (V.INT8, [-128, 0, 127]),
        (V.UINT16, [0, 65535]),
        (V.INT16, [-32768, 32767]),
        (V.UINT32, [0, 4294967295]),
        (V.INT32, [-2147483648, 2147483647]),
        (V.FLOAT32, [1.5, -0.0, 3.4e38]),
        (V.BOOL, [True, False, True]),
        (V.UINT64, [0, 18446744073709551615]),
        (V.INT64, [-9223372036854775808, 9223372036854775807]),
        (V.FLOAT64, [1e-310, -1.0]),
    ]:
        w.add_key_value(f"test.array.{vtype.name.lower()}", values, V.ARRAY, sub_type=vtype)
    w.add_array("test.array.string", ["a", "", "ü"])
    w.add_array("test.array.nested", [[1, 2], [3], [4, 5, 6]])
    w.add_array("test.array.nested_strings", [["x", "y"], ["z"]])
    w.add_context_length(4096)
    w.add_block_count(2)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"tok{i}" for i in range(100)])
    w.add_token_scores([float(i) / 4 for i in range(100)])

    rng = np.random.RandomState(42)
    w.add_tensor("f32.1d", rng.standard_normal(7).astype(np.float32))
    w.add_tensor("f32.2d", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16.3d", rng.standard_normal((2, 3, 4)).astype(np.float16))
    w.add_tensor("f64", rng.standard_normal((2, 3)))
    w.add_tensor("i8", rng.randint(-128, 128, size=(4, 3)).astype(np.int8))
    w.add_tensor("i16", rng.randint(-32768, 32768, size=5).astype(np.int16))
    w.add_tensor("i32", rng.randint(-(2**31), 2**31, size=(2, 2), dtype=np.int64).astype(np.int32))
    w.add_tensor("i64", rng.randint(-(2**62), 2**62, size=3, dtype=np.int64))
    bf16 = gguf.quants.quantize(rng.standard_normal((3, 4)).astype(np.float32), T.BF16)
    w.add_tensor("bf16", bf16, raw_dtype=T.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_quants_file(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.RandomState(7)
    for qtype in QUANTIZED:
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        values = rng.standard_normal((3, 2 * block)).astype(np.float32)
        values[0, :block] = 0.0  # an all-zero block (the scale is zero)
        values[1, 3] = 40.0  # an outlier
        w.add_tensor(qtype.name.lower(), gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    for qtype, scale_offsets in RAW.items():
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = 4
        blocks = rng.randint(0, 256, size=(n_blocks, size)).astype(np.uint8)
        for at in scale_offsets:
            scales = (rng.standard_normal(n_blocks) / 8).astype(np.float16)
            blocks[:, at : at + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
        w.add_tensor(qtype.name.lower(), blocks.reshape(2, 2 * size), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_aligned_file(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_custom_alignment(64)
    rng = np.random.RandomState(3)
    w.add_tensor("a", rng.standard_normal(3).astype(np.float32))
    w.add_tensor("b", rng.randint(-128, 128, size=5).astype(np.int8))
    w.add_tensor("c", gguf.quants.quantize(rng.standard_normal((1, 32)).astype(np.float32), T.Q8_0), raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def float_text(x: float) -> str:
    """The exact value of a float as Rust's `{:?}` of an f64 prints it (shortest round trip)."""
    return repr(float(x))


def field_value(field: Any, types: list[V], parts: list[Any], at: int) -> tuple[Any, int]:
    """One value of a field, decoded from GGUFReader's parts starting at `at` (the value's first part)."""
    vtype = types[0]
    if vtype == V.ARRAY:
        # parts: element type, count, then the elements (each a value of the remaining types)
        count = int(parts[at + 1][0])
        at += 2
        items = []
        for _ in range(count):
            item, at = field_value(field, types[1:], parts, at)
            items.append(item)
        return items, at
    if vtype == V.STRING:
        # parts: length, bytes
        return bytes(parts[at + 1]).decode("utf-8"), at + 2
    value = parts[at][0]
    if vtype in (V.FLOAT32, V.FLOAT64):
        return float_text(value), at + 1
    if vtype == V.BOOL:
        return bool(value), at + 1
    return int(value), at + 1


def describe(path: Path) -> dict[str, Any]:
    reader = gguf.GGUFReader(str(path))
    metadata = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        # parts: key length, key, value type, then the value
        value, end = field_value(field, field.types, field.parts, 3)
        assert end == len(field.parts), name
        metadata.append({"key": name, "types": [t.name for t in field.types], "value": value})
    tensors = []
    for t in reader.tensors:
        raw = np.ascontiguousarray(t.data).tobytes()
        entry: dict[str, Any] = {
            "name": t.name,
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],
            "offset": int(t.data_offset),
            "n_bytes": int(t.n_bytes),
            "raw_sha256": hashlib.sha256(raw).hexdigest(),
        }
        try:
            values = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            values = None
        if values is not None:
            assert values.dtype == np.float32, t.name
            entry["shape"] = list(values.shape)
            entry["f32_sha256"] = hashlib.sha256(values.astype("<f4").tobytes()).hexdigest()
        else:
            entry["shape"] = list(t.data.shape)
        tensors.append(entry)
    alignment = reader.alignment
    return {
        "version": int(reader.fields["GGUF.version"].parts[-1][0]),
        "alignment": int(alignment),
        "data_offset": int(reader.data_offset),
        "metadata": metadata,
        "tensors": tensors,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def main() -> None:
    out = Path(sys.argv[1])
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    write_metadata_file(out / "metadata.gguf")
    write_quants_file(out / "quants.gguf")
    write_aligned_file(out / "aligned64.gguf")
    v2 = bytearray((out / "metadata.gguf").read_bytes())
    v2[4:8] = (2).to_bytes(4, "little")
    (out / "v2.gguf").write_bytes(bytes(v2))
    files = {}
    for name in ["metadata.gguf", "quants.gguf", "aligned64.gguf", "v2.gguf"]:
        files[name] = describe(out / name)
    assert files["v2.gguf"]["version"] == 2
    manifest = {
        "gguf": importlib.metadata.version("gguf"),
        "numpy": np.__version__,
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(files)} GGUF files to {out}")


if __name__ == "__main__":
    main()
