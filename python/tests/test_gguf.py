"""GGUF files written by gguf-py's GGUFWriter (conformance/fixtures/gguf) read through ``ckpt.open`` equal to what
gguf-py's own ``GGUFReader`` and ``gguf.quants.dequantize`` read: metadata values, tensors in torch order (GGUF's
dimensions reversed), quantized tensors dequantized bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import ckpt
from conftest import FIXTURES

gguf = pytest.importorskip("gguf")

FILES = ["metadata.gguf", "quants.gguf", "aligned64.gguf", "v2.gguf"]


def field_value(field) -> object:
    """A field as Python values: gguf-py's ``contents()`` for scalars, strings and arrays."""
    return field.contents()


def flat(value: object) -> object:
    """A nested list flattened, as gguf-py's ``contents()`` gives a nested array (the Rust suite checks the
    nesting against the fields' parts)."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        return [x for item in value for x in flat(item)]
    return value


@pytest.mark.parametrize("name", FILES)
def test_gguf_equals_gguf_py(name: str) -> None:
    path = FIXTURES / "gguf" / name
    theirs = gguf.GGUFReader(str(path))
    ck = ckpt.open(path)
    assert ck.format == "gguf"
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    tensor_names = [t.name for t in theirs.tensors]
    assert ck.keys() == keys + tensor_names
    for key in keys:
        want = field_value(theirs.fields[key])
        got = ck.value(key)
        if theirs.fields[key].types[1:2] == [gguf.GGUFValueType.ARRAY]:
            got = flat(got)
        if isinstance(want, float):
            assert np.float64(got).tobytes() == np.float64(want).tobytes(), key
        else:
            assert got == want, key
    for t in theirs.tensors:
        got = ck.tensor(t.name)
        if t.tensor_type in (gguf.GGMLQuantizationType.F64, gguf.GGMLQuantizationType.I8,
                             gguf.GGMLQuantizationType.I16, gguf.GGMLQuantizationType.I32,
                             gguf.GGMLQuantizationType.I64):
            want = np.asarray(t.data)
        else:
            want = gguf.quants.dequantize(t.data, t.tensor_type)
        assert got.shape == want.shape, t.name
        if t.tensor_type in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16):
            # ckpt keeps a plain 16-bit tensor as it is; gguf-py widens it to float32 (exactly).
            assert got.dtype.name == {"F16": "float16", "BF16": "bfloat16"}[t.tensor_type.name], t.name
            got = got.astype(np.float32)
        assert got.dtype == want.dtype, t.name
        assert got.tobytes() == want.tobytes(), t.name


def test_gguf_details_name_types_and_metadata() -> None:
    ck = ckpt.open(FIXTURES / "gguf" / "quants.gguf")
    details = ck.details
    assert details["architecture"] == "llama"
    assert details["tensor q4_k"] == "Q4_K ne [512, 2]"
    meta = ckpt.open(FIXTURES / "gguf" / "metadata.gguf").details
    assert meta["context length"] == "4096"
    assert meta["vocabulary"] == "100 tokens"
    assert meta["tokenizer.ggml.tokens"].startswith("[STRING; 100] [")


@pytest.mark.parametrize("name", ["metadata.gguf", "quants.gguf"])
def test_written_gguf_is_read_by_gguf_py(name: str, tmp_path) -> None:
    """``ckpt.convert(..., to="gguf")`` (every tensor in its own type, quantized ones as float32): gguf-py's GGUFReader reads the file with the
    source's metadata and the source's values (quantized ones as gguf-py dequantizes them)."""
    src = FIXTURES / "gguf" / name
    dst = tmp_path / "out.gguf"
    ckpt.convert(src, dst, to="gguf")
    source = gguf.GGUFReader(str(src))
    written = gguf.GGUFReader(str(dst))
    assert [k for k in written.fields if not k.startswith("GGUF.")] == [k for k in source.fields if not k.startswith("GGUF.")]
    for key, field in source.fields.items():
        if not key.startswith("GGUF."):
            assert written.fields[key].contents() == field.contents(), key
    assert [t.name for t in written.tensors] == [t.name for t in source.tensors]
    plain = {gguf.GGMLQuantizationType[n] for n in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")}
    for want, got in zip(source.tensors, written.tensors):
        if want.tensor_type in plain:
            # Without --quant every tensor keeps its type, byte for byte.
            assert got.tensor_type == want.tensor_type, want.name
            assert np.asarray(got.data).tobytes() == np.asarray(want.data).tobytes(), want.name
            continue
        # A quantized source tensor is written as the float32 values gguf-py dequantizes it to.
        assert got.tensor_type == gguf.GGMLQuantizationType.F32, want.name
        values = gguf.quants.dequantize(want.data, want.tensor_type)
        assert np.asarray(got.data).reshape(values.shape).tobytes() == values.tobytes(), want.name


def test_convert_quant_is_gguf_py_quantize(tmp_path) -> None:
    """``quant="q8_0"``: 2-D float tensors of whole blocks quantized as ``gguf.quants.quantize`` quantizes the
    source's float32 values, the rest float32; ``quant`` for another target is a usage error."""
    src = FIXTURES / "gguf" / "quants.gguf"
    dst = tmp_path / "q8.gguf"
    ckpt.convert(src, dst, to="gguf", quant="q8_0")
    source = gguf.GGUFReader(str(src))
    written = gguf.GGUFReader(str(dst))
    for want, got in zip(source.tensors, written.tensors):
        values = gguf.quants.dequantize(want.data, want.tensor_type)
        assert got.tensor_type == gguf.GGMLQuantizationType.Q8_0, want.name
        blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
        assert np.asarray(got.data).tobytes() == np.ascontiguousarray(blocks).tobytes(), want.name
    with pytest.raises(ckpt.UsageError):
        ckpt.convert(src, tmp_path / "x.safetensors", to="safetensors", quant="q8_0")
