"""Every dtype torch and safetensors have (conformance/fixtures/dtypes, written by torch 2.13, safetensors and
dcp.save): numpy arrays of ml_dtypes' types where it has one (FP4 one value a byte, the last dimension
doubled), raw 3-byte items with the dtype named for float6, torch tensors with ``framework="pt"``; what
``ckpt.save`` writes loads in torch and safetensors with the dtype and bytes it had."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import torch
from safetensors.torch import load_file

import ckpt
from conftest import FIXTURES, tensor_bits

DTYPES = FIXTURES / "dtypes"
MANIFEST = json.loads((DTYPES / "manifest.json").read_text())


def test_arrays_are_ml_dtypes_types_with_fp4_one_value_a_byte() -> None:
    arrays = ckpt.load(str(DTYPES / "dtypes.safetensors"))
    torch_sd = load_file(str(DTYPES / "dtypes.safetensors"))
    f4 = arrays["float4_e2m1fn_x2"]
    assert f4.dtype == np.dtype(ml_dtypes.float4_e2m1fn) and f4.shape == (8, 64)
    packed = torch_sd["float4_e2m1fn_x2"].view(torch.uint8).numpy()
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(8, 64)
    assert (f4.view(np.uint8) == codes).all()
    # The values are FP4's: every code of the 16 in its place (the fixture holds every byte).
    assert f4.reshape(-1)[:4].astype(np.float32).tolist() == [0.0, 0.0, 0.5, 0.0]
    for name, dtype in [("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu), ("float8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
                        ("float8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz), ("uint16", np.uint16),
                        ("uint32", np.uint32), ("uint64", np.uint64)]:
        a = arrays[name]
        assert a.dtype == np.dtype(dtype), name
        assert tensor_bits(a) == tensor_bits(torch_sd[name]), name
    assert int(arrays["uint64"][3]) == 2**64 - 1


def test_float6_is_raw_bytes_with_its_dtype_named() -> None:
    tensors = MANIFEST["files"]["f6.safetensors"]["tensors"]
    with ckpt.safe_open(str(DTYPES / "f6.safetensors"), framework="np") as f:
        for name, rec in tensors.items():
            a = f.get_tensor(name)
            assert (ckpt.dtype_name(a), list(a.shape)) == (rec["dtype"], rec["shape"]), name
    w = ckpt.load(str(DTYPES / "f6.safetensors"))["w_e2m3"]
    assert w.dtype.itemsize == 3 and w.tobytes() == bytes(range(0, 12 * 21, 21))
    pt = ckpt.load(str(DTYPES / "f6.safetensors"), framework="pt")
    assert pt["w_e2m3"].dtype == torch.uint8 and tuple(pt["w_e2m3"].shape) == (2, 6)
    assert pt["scales"].dtype == torch.float8_e8m0fnu


def test_framework_pt_gives_torch_tensors_of_each_dtype() -> None:
    for file in ["dtypes.pt", "dtypes.safetensors", "dcp"]:
        mine = ckpt.load(str(DTYPES / file), framework="pt")
        theirs = torch.load(str(DTYPES / "dtypes.pt"), weights_only=True)
        assert set(mine) == set(theirs) - ({"complex32"} if file.endswith(".safetensors") else set()), file
        for name, t in mine.items():
            assert tensor_bits(t) == tensor_bits(theirs[name]), (file, name)


def test_saved_arrays_load_in_torch_and_safetensors_as_they_were(tmp_path) -> None:
    arrays = ckpt.load(str(DTYPES / "dtypes.pt"))
    assert arrays["float4_e2m1fn_x2"].dtype == np.dtype(ml_dtypes.float4_e2m1fn)
    theirs = torch.load(str(DTYPES / "dtypes.pt"), weights_only=True)
    ckpt.save(arrays, str(tmp_path / "out.pt"))
    back = torch.load(str(tmp_path / "out.pt"), weights_only=True)
    for name, t in theirs.items():
        assert tensor_bits(back[name]) == tensor_bits(t), name
    del arrays["complex32"]
    ckpt.save(arrays, str(tmp_path / "out.safetensors"), format="safetensors")
    st = load_file(str(tmp_path / "out.safetensors"))
    assert st["float4_e2m1fn_x2"].dtype == torch.float4_e2m1fn_x2 and tuple(st["float4_e2m1fn_x2"].shape) == (8, 32)
    for name, t in st.items():
        assert tensor_bits(t) == tensor_bits(theirs[name]), name
