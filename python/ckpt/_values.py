"""What ckpt returns for values that only torch or an unknown class can be, and what :func:`ckpt.save` makes
of Python objects that are not plain containers.

With ``framework="pt"`` torch's own objects come back (``torch.Size``, ``torch.float32``, ``torch.device``,
``torch.nn.Parameter``); with ``framework="np"`` (torch not needed) the small classes here. Objects of
classes ckpt does not model (pickled as ``callable(*args)`` then ``__setstate__(state)``) come back as
:class:`Object`, never executed: ckpt's pickle decoder runs no code.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ._dtypes import packed, torch_name


@dataclass(frozen=True)
class TorchDType:
    """A ``torch.dtype`` read without torch: ``TorchDType("float32")``."""

    name: str

    def __repr__(self) -> str:
        return f"torch.{self.name}"


@dataclass(frozen=True)
class Device:
    """A ``torch.device`` read without torch."""

    type: str
    index: Optional[int] = None

    def __repr__(self) -> str:
        return f"device(type={self.type!r}" + ("" if self.index is None else f", index={self.index}") + ")"


@dataclass(frozen=True)
class Global:
    """A reference to a Python global (a class or function) that ckpt does not model: ``module.name``."""

    module: str
    name: str

    def __repr__(self) -> str:
        return f"Global({self.module}.{self.name})"


@dataclass
class Object:
    """An object of a class ckpt does not model, kept as pickle made it: ``callable(*args)`` (``newobj``:
    ``cls.__new__(cls, *args)``), then items appended or set, then ``__setstate__(state)``. Never executed."""

    callable: Any
    args: Any
    newobj: bool = False
    state: Any = None
    list_items: List[Any] = field(default_factory=list)
    dict_items: List[Tuple[Any, Any]] = field(default_factory=list)


@dataclass
class OpaqueTensor:
    """A tensor whose data ckpt cannot read (``kind``: sparse, quantized, nested, meta, other), with the
    object that rebuilds it."""

    kind: str
    object: Object


@dataclass
class CompositeTensor:
    """A quantized, sparse or nested tensor as its components (``framework="np"``): ``layout``
    (``per_tensor_affine``, ``per_channel_affine``, ``sparse_coo``, ``sparse_csr``, ``sparse_csc``,
    ``sparse_bsr``, ``sparse_bsc``, ``nested``), torch's ``dtype`` name (``quint8``, the values' dtype), the dense
    ``shape`` (a nested tensor's: its number of tensors), and ``components`` by torch's accessor names
    (``int_repr``, ``scale``, ``zero_point``; ``indices``, ``values``; ``crow_indices``, ``col_indices``,
    ``values``; ``buffer``, ``sizes``, ``strides``, ``storage_offsets``); ``axis`` of per-channel scales,
    ``coalesced`` of a COO tensor. With ``framework="pt"`` the entry is the torch tensor itself."""

    layout: str
    dtype: str
    shape: Tuple[int, ...]
    components: Dict[str, Any]
    axis: Optional[int] = None
    coalesced: Optional[bool] = None
    requires_grad: bool = False


@dataclass
class Storage:
    """A bare ``torch`` storage saved on its own: its dtype and its elements (a 1-D array or tensor)."""

    dtype: str
    data: Any


@dataclass(frozen=True)
class Ref:
    """A reference to a shared object that is still being made where it is referred to (a cycle through a set,
    tuple or object; cycles through lists and dicts come back as the objects themselves)."""

    id: int


@dataclass
class Unknown:
    """A kind of value this version of the package does not know yet: its type and debug form."""

    type_name: str
    debug: str


def _torch() -> Any:
    import torch  # noqa: PLC0415

    return torch


def parameter(pt: bool, t: Any, requires_grad: bool, state: Any) -> Any:
    if not pt:
        return t
    p = _torch().nn.Parameter(t, requires_grad=requires_grad)
    if isinstance(state, dict):
        for k, v in state.items():
            setattr(p, k, v)
    return p


def tensor_with_state(pt: bool, t: Any, cls: Any, state: Any) -> Any:
    if pt and isinstance(state, dict):
        for k, v in state.items():
            try:
                setattr(t, k, v)
            except AttributeError:
                pass
    return t


def opaque_tensor(pt: bool, kind: str, obj: Object) -> OpaqueTensor:
    return OpaqueTensor(kind, obj)


def composite(pt: bool, layout: str, dtype: str, shape: List[int], components: List[Tuple[str, Any]],
              axis: Optional[int], coalesced: Optional[bool], requires_grad: bool) -> Any:
    parts = dict(components)
    if not pt:
        return CompositeTensor(layout, dtype, tuple(shape), parts, axis, coalesced, requires_grad)
    torch = _torch()
    if layout == "per_tensor_affine":
        t = torch._make_per_tensor_quantized_tensor(parts["int_repr"], float(parts["scale"]),
                                                    int(parts["zero_point"]))
    elif layout == "per_channel_affine":
        t = torch._make_per_channel_quantized_tensor(parts["int_repr"], parts["scale"], parts["zero_point"], axis)
    elif layout == "sparse_coo":
        t = torch.sparse_coo_tensor(parts["indices"], parts["values"], shape, is_coalesced=bool(coalesced))
    elif layout == "nested":
        # The offsets count from the start of the buffer's storage: a buffer of its own storage (not a
        # window of the file's map).
        t = torch._nested_view_from_buffer(parts["buffer"].clone(), parts["sizes"], parts["strides"],
                                           parts["storage_offsets"])
    else:
        names = list(parts)
        t = torch.sparse_compressed_tensor(parts[names[0]], parts[names[1]], parts["values"], shape,
                                           layout=getattr(torch, layout))
    if requires_grad:
        t.requires_grad_(True)
    return t


def storage(pt: bool, data: Any, dtype: str) -> Any:
    return Storage(dtype, data)


def size(pt: bool, dims: List[int]) -> Any:
    return _torch().Size(dims) if pt else tuple(dims)


def dtype(pt: bool, name: str) -> Any:
    return getattr(_torch(), name) if pt else TorchDType(name)


def device(pt: bool, kind: str, index: Optional[int]) -> Any:
    return _torch().device(kind, index) if pt and index is not None else _torch().device(kind) if pt else Device(
        kind, index)


def global_(pt: bool, module: str, name: str) -> Global:
    return Global(module, name)


def object_(pt: bool, callable: Any, args: Any, newobj: bool, state: Any, list_items: List[Any],
            dict_items: List[Tuple[Any, Any]]) -> Object:
    return Object(callable, args, newobj, state, list_items, dict_items)


def ref(pt: bool, id: int) -> Ref:
    return Ref(id)


def unknown(pt: bool, type_name: str, debug: str) -> Unknown:
    return Unknown(type_name, debug)


def _numpy_module() -> str:
    import numpy as np  # noqa: PLC0415

    return "numpy._core.multiarray" if int(np.__version__.split(".")[0]) >= 2 else "numpy.core.multiarray"


def _raw(a: Any) -> Tuple[Any, int, int]:
    """A C-contiguous uint8 view of ``a``'s bytes (``a`` made contiguous first), its address and length."""
    import numpy as np  # noqa: PLC0415

    a = np.require(a, requirements="C")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("="))
    raw = a.reshape(-1).view(np.uint8)
    return raw, raw.__array_interface__["data"][0], raw.nbytes


def parts(obj: Any) -> Tuple[str, Any]:
    """What :func:`ckpt.save` makes of ``obj``: ``(kind, arguments)`` (used by the extension)."""
    import numpy as np  # noqa: PLC0415

    if isinstance(obj, np.ndarray):
        obj = packed(obj)  # an ml_dtypes float4_e2m1fn array: torch's float4_e2m1fn_x2, two values a byte
        raw, ptr, n = _raw(obj)
        return "tensor", (raw, ptr, n, torch_name(obj.dtype), list(obj.shape), False)
    if isinstance(obj, np.generic):
        return "numpy_scalar", (obj.item(), torch_name(obj.dtype), _numpy_module())
    if isinstance(obj, TorchDType):
        return "dtype", obj.name
    if isinstance(obj, Device):
        return "device", (obj.type, obj.index)
    if isinstance(obj, Global):
        return "global", (obj.module, obj.name)
    if isinstance(obj, Object):
        return "object", (obj.callable, obj.args, obj.newobj, obj.state, list(obj.list_items),
                          list(obj.dict_items))
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.Tensor):
            if obj.layout != torch.strided or obj.is_quantized:
                raise TypeError(f"ckpt.save writes dense tensors; this one is {obj.layout}")
            t = obj.detach().cpu().resolve_conj().resolve_neg().contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy()
            kind = "parameter" if isinstance(obj, torch.nn.Parameter) else "tensor"
            name = str(t.dtype).replace("torch.", "")
            return kind, (raw, raw.__array_interface__["data"][0] if raw.size else 0, raw.nbytes, name,
                          list(t.shape), bool(obj.requires_grad))
        if isinstance(obj, torch.Size):
            return "size", list(obj)
        if isinstance(obj, torch.dtype):
            return "dtype", str(obj).replace("torch.", "")
        if isinstance(obj, torch.device):
            return "device", (obj.type, obj.index)
    if isinstance(obj, tuple):
        return "tuple", obj
    if isinstance(obj, list):
        return "list", obj
    if isinstance(obj, str):
        return "str", str(obj)
    if isinstance(obj, int) and not isinstance(obj, bool):
        return "int", int(obj)
    if isinstance(obj, float):
        return "float", float(obj)
    return "unsupported", None
