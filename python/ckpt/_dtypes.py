"""numpy dtypes of torch's dtypes.

numpy has bool, the integers, float16/32/64 and complex64/128. For bfloat16, the float8 family and float4,
the ``ml_dtypes`` package (``pip install ml_dtypes``; JAX's) has numpy dtypes: when it is installed, arrays
come back in them. A ``float4_e2m1fn_x2`` tensor (two FP4 values a byte) comes back as ml_dtypes'
``float4_e2m1fn``, one value a byte, its last dimension doubled (as safetensors counts it); ``ckpt.save``
packs such an array back. When ml_dtypes is not installed, or for a dtype it lacks (complex32, quantized,
bits, the float6 groups safetensors packs four to three bytes, ``float6_e2m3fn_x4``/``float6_e3m2fn_x4``),
the array comes back raw — unsigned integers of the same width holding the bits (void items of 3 bytes for
float6) — and its dtype names the real one in its metadata::

    >>> a.dtype, a.dtype.metadata
    (dtype('uint16'), mappingproxy({'ckpt.dtype': 'bfloat16'}))

:func:`ckpt.dtype_name` reads that name back from any array ckpt returned.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List

#: torch dtype names numpy has a dtype of the same name for ("bool" is numpy's "bool_")
NUMPY = ("bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32",
         "float64", "complex64", "complex128")

#: torch dtype name -> the ml_dtypes type of the same name
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")

#: torch dtype name -> the ml_dtypes type of its unpacked values (the tensor packs several a byte)
ML_DTYPES_UNPACKED = {"float4_e2m1fn_x2": "float4_e2m1fn"}

#: element sizes of the dtypes neither has (raw arrays), as the unsigned integers of that width
RAW = {1: "uint8", 2: "uint16", 3: "V3", 4: "uint32", 8: "uint64", 16: "V16"}

SIZES = {
    "bfloat16": 2, "complex32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1, "qint8": 1, "quint8": 1, "qint32": 4,
    "quint4x2": 1, "quint2x4": 1, "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    "float6_e2m3fn_x4": 3, "float6_e3m2fn_x4": 3,
}


def ml_dtypes() -> Any:
    """The ``ml_dtypes`` module, or ``None`` when it is not installed."""
    try:
        import ml_dtypes as m  # noqa: PLC0415
    except ImportError:
        return None
    return m


def numpy_dtype(name: str) -> Any:
    """The numpy dtype arrays of the torch dtype ``name`` come back in."""
    import numpy as np  # noqa: PLC0415  (``import ckpt`` stays light: the ckpt command does not need numpy)

    if name in NUMPY:
        return np.dtype("bool" if name == "bool" else name)
    m = ml_dtypes()
    if m is not None and name in ML_DTYPES and hasattr(m, name):
        return np.dtype(getattr(m, name))
    unpacked = ML_DTYPES_UNPACKED.get(name)
    if m is not None and unpacked is not None and hasattr(m, unpacked):
        return np.dtype(getattr(m, unpacked))
    return np.dtype(RAW[SIZES.get(name, 1)], metadata={"ckpt.dtype": name})


def packed(array: Any) -> Any:
    """``array`` as the torch tensor stores it: an ml_dtypes ``float4_e2m1fn`` array packed two values a byte
    (the first in the low nibble) into ``uint8`` with its last dimension halved and the dtype named
    ``float4_e2m1fn_x2`` in its metadata; any other array as it is."""
    import numpy as np  # noqa: PLC0415

    if array.dtype.name != "float4_e2m1fn" or array.dtype.metadata:
        return array
    if array.ndim == 0 or array.shape[-1] % 2:
        raise ValueError(f"a float4_e2m1fn array of shape {array.shape} cannot be packed as float4_e2m1fn_x2: "
                         "its last dimension must be even (two values a byte)")
    codes = np.ascontiguousarray(array).view(np.uint8) & 0x0F
    out = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.ascontiguousarray(out).view(np.dtype("uint8", metadata={"ckpt.dtype": "float4_e2m1fn_x2"}))


def numpy_dtypes(names: List[str]) -> List[Any]:
    """:func:`numpy_dtype` of each name (the extension asks once, in its dtype order)."""
    return [numpy_dtype(n) for n in names]


@functools.lru_cache(maxsize=None)
def _torch_names() -> Dict[Any, str]:
    import numpy as np  # noqa: PLC0415

    return {np.dtype("bool" if k == "bool" else k): k for k in NUMPY}


def torch_name(dtype: Any) -> str:
    """The torch dtype name of a numpy dtype (ml_dtypes' by their name, raw ones by their metadata)."""
    import numpy as np  # noqa: PLC0415

    dtype = np.dtype(dtype)
    meta = dtype.metadata
    if meta and "ckpt.dtype" in meta:
        return str(meta["ckpt.dtype"])
    names = _torch_names()
    if dtype in names and dtype.byteorder in ("=", "|", "<"):
        return names[dtype]
    if dtype.name in ML_DTYPES:
        return dtype.name
    for packed_name, unpacked in ML_DTYPES_UNPACKED.items():
        if dtype.name == unpacked:
            return packed_name  # the values of a packed tensor, one a byte (:func:`packed` packs them back)
    raise TypeError(f"numpy dtype {dtype} has no torch dtype: use bool, integers, float16/32/64, complex64/128 "
                    "or an ml_dtypes type")


def dtype_name(array: Any) -> str:
    """The torch name of an array's dtype as ckpt read it: ``"bfloat16"`` for an ml_dtypes bfloat16 array or a
    raw uint16 array ckpt returned for it, ``"float32"``, ...

    >>> import numpy as np, ckpt
    >>> ckpt.dtype_name(np.zeros(2, np.float32))
    'float32'
    """
    return torch_name(array.dtype)


def dtype_arg(dtype: Any, where: str = "dtype") -> Any:
    """A ``dtype=`` argument as the name ckpt takes: a string as it is (``"bf16"``, ``"float16"``), a numpy
    dtype or scalar type (``np.float16``, ``np.dtype("float16")``, ml_dtypes' ``bfloat16``) and a torch dtype
    (``torch.bfloat16``) by their name; ``None`` as it is.

    Raises:
        TypeError: for anything else, naming the forms accepted.
    """
    if dtype is None or isinstance(dtype, str):
        return dtype
    module = type(dtype).__module__
    if module.startswith("torch") and type(dtype).__name__ == "dtype":
        return str(dtype).removeprefix("torch.")
    if module.startswith("numpy") or isinstance(dtype, type):
        import numpy as np  # noqa: PLC0415

        try:
            return np.dtype(dtype).name
        except TypeError:
            pass
    raise TypeError(f"{where}={dtype!r}: expected a dtype name (\"bf16\", \"float16\"), a numpy dtype "
                    f"(np.float16, np.dtype(\"float16\")) or a torch dtype (torch.bfloat16)")
