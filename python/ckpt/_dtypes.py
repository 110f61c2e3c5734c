"""numpy dtypes of torch's dtypes.

numpy has bool, the integers, float16/32/64 and complex64/128. For bfloat16 and the float8 family, the
``ml_dtypes`` package (``pip install ml_dtypes``; JAX's) has numpy dtypes: when it is installed, arrays
come back in them. When it is not, or for a dtype it lacks (complex32, float4 pairs, quantized, bits), the
array comes back raw — unsigned integers of the same width holding the bits — and its dtype names the real
one in its metadata::

    >>> a.dtype, a.dtype.metadata
    (dtype('uint16'), mappingproxy({'ckpt.dtype': 'bfloat16'}))

:func:`ckpt.dtype_name` reads that name back from any array ckpt returned.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

#: torch dtype name -> numpy's own dtype
NUMPY = {
    "bool": np.bool_, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "float16": np.float16, "float32": np.float32, "float64": np.float64,
    "complex64": np.complex64, "complex128": np.complex128,
}

#: torch dtype name -> the ml_dtypes type of the same name
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")

#: element sizes of the dtypes neither has (raw arrays)
RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.dtype("V16")}

SIZES = {
    "bfloat16": 2, "complex32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1, "qint8": 1, "quint8": 1, "qint32": 4,
    "quint4x2": 1, "quint2x4": 1, "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
}


def ml_dtypes() -> Any:
    """The ``ml_dtypes`` module, or ``None`` when it is not installed."""
    try:
        import ml_dtypes as m  # noqa: PLC0415
    except ImportError:
        return None
    return m


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype arrays of the torch dtype ``name`` come back in."""
    if name in NUMPY:
        return np.dtype(NUMPY[name])
    m = ml_dtypes()
    if m is not None and name in ML_DTYPES and hasattr(m, name):
        return np.dtype(getattr(m, name))
    return np.dtype(RAW[SIZES.get(name, 1)], metadata={"ckpt.dtype": name})


def numpy_dtypes(names: List[str]) -> List[np.dtype]:
    """:func:`numpy_dtype` of each name (the extension asks once, in its dtype order)."""
    return [numpy_dtype(n) for n in names]


_TORCH_NAMES: Dict[Any, str] = {np.dtype(v): k for k, v in NUMPY.items()}


def torch_name(dtype: np.dtype) -> str:
    """The torch dtype name of a numpy dtype (ml_dtypes' by their name, raw ones by their metadata)."""
    dtype = np.dtype(dtype)
    meta = dtype.metadata
    if meta and "ckpt.dtype" in meta:
        return str(meta["ckpt.dtype"])
    if dtype in _TORCH_NAMES and dtype.byteorder in ("=", "|", "<"):
        return _TORCH_NAMES[dtype]
    if dtype.name in ML_DTYPES:
        return dtype.name
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
