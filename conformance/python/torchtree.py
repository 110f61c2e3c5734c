#!/usr/bin/env python3
"""Shared helpers for the torch.save conformance harness.

Used by ``make_torch_fixtures.py``, ``check_loads.py``, ``check_roundtrip.py`` and
``check_reproducible.py``. It defines, in one place:

* the *typed tree* JSON rendering of a saved object and the per-tensor records of the fixture
  manifests (format documented in ``conformance/fixtures/torch/README.md``);
* ``storage_keys_of``: which ZIP storage key (or legacy opaque key) each tensor of a file uses,
  read from the file's own persistent ids while torch loads it;
* ``compare``: a strict, NaN-aware structural comparison of two loaded objects, including storage
  sharing, used by the round-trip checker.

It imports torch, so generators import it only after ``pinenv.pin_environment()``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import pickle
import sys
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch

Json = Any
OPAQUE_LAYOUTS: dict[Any, str] = {
    torch.sparse_coo: "sparse_coo",
    torch.sparse_csr: "sparse_csr",
    torch.sparse_csc: "sparse_csc",
    torch.sparse_bsr: "sparse_bsr",
    torch.sparse_bsc: "sparse_bsc",
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def public_torch_version() -> str:
    """torch version without the local build tag (``2.13.0+cu130`` -> ``2.13.0``)."""
    return torch.__version__.split("+", 1)[0]


# --------------------------------------------------------------------------------------------
# tensor bytes


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's logical values as contiguous little-endian bytes (numel * itemsize).

    conj/neg bits are resolved. Works for every dense dtype (including complex32, float8,
    float4 and bits*): the bytes are read from the contiguous tensor's untyped storage.
    """
    c = t.detach()
    if c.is_conj():
        c = c.resolve_conj()
    if c.is_neg():
        c = c.resolve_neg()
    c = c.contiguous()
    n = c.numel() * c.element_size()
    if n == 0:
        return b""
    start = c.storage_offset() * c.element_size()
    flat = torch.empty((0,), dtype=torch.uint8).set_(c.untyped_storage(), start, (n,), (1,))
    data = flat.numpy().tobytes()
    if sys.byteorder != "little" and c.element_size() > 1:  # pragma: no cover - LE hosts only
        raise RuntimeError("tensor_bytes assumes a little-endian host")
    return data


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 hex digest of ``tensor_bytes(t)``."""
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def storage_id(t: torch.Tensor) -> int:
    """Identity of the StorageImpl behind a dense tensor (equal for tensors sharing storage)."""
    return int(t.untyped_storage()._cdata)


def opaque_kind(t: torch.Tensor) -> str | None:
    """Kind tag for tensors the manifest treats as opaque values, or None for dense strided."""
    if t.layout in OPAQUE_LAYOUTS:
        return OPAQUE_LAYOUTS[t.layout]
    if t.layout != torch.strided:
        return f"layout:{t.layout}"
    if getattr(t, "is_nested", False):
        return "nested"
    if t.is_quantized:
        return "quantized"
    if t.is_meta:
        return "meta"
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        return f"subclass:{type(t).__module__}.{type(t).__qualname__}"
    return None


def obj_state(t: torch.Tensor) -> Any:
    """The Python-attribute state torch pickles for a tensor/parameter (None or a dict)."""
    state = torch._utils._get_obj_state(t)
    return state if state else None


# --------------------------------------------------------------------------------------------
# typed tree


class Renderer:
    """Renders an object into the typed-tree JSON and collects tensor records in traversal order.

    Paths: dict keys as ``str(k)``, list and tuple items by index, joined with ``"."``.
    """

    def __init__(self) -> None:
        self.tensors: list[dict[str, Any]] = []
        #: path -> storage identity (``storage_id``) for dense tensors, for sharing checks
        self.storage_ids: dict[str, int] = {}
        self._paths: set[str] = set()

    def _add_tensor(self, path: list[str], t: torch.Tensor, kind: str) -> str:
        p = ".".join(path)
        if p in self._paths:
            raise ValueError(f"duplicate tensor path {p!r}; rename the fixture's keys")
        self._paths.add(p)
        self.tensors.append(
            {
                "path": p,
                "dtype": dtype_name(t.dtype),
                "shape": list(t.shape),
                "stride": list(t.stride()),
                "storage_offset": int(t.storage_offset()),
                "requires_grad": bool(t.requires_grad),
                "kind": kind,
                "storage_key": None,
                "storage_nbytes": int(t.untyped_storage().nbytes()),
                "sha256": tensor_sha256(t),
                "numel": int(t.numel()),
            }
        )
        # optional keys, present only when set (torch pickles them as {'conj': True} / {'neg': True});
        # raw_sha256 is then the digest of the stored bytes (the view without the conj/neg bit)
        if t.is_conj():
            self.tensors[-1]["conj"] = True
        if t.is_neg():
            self.tensors[-1]["neg"] = True
        if t.is_conj() or t.is_neg():
            raw = torch.empty((0,), dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())
            self.tensors[-1]["raw_sha256"] = tensor_sha256(raw)
        self.storage_ids[p] = storage_id(t)
        return p

    def render(self, obj: Any, path: list[str] | None = None, *, in_set: bool = False) -> Json:
        """Typed tree of ``obj``; ``path`` is its traversal path (None: tensors are refused)."""
        r = self.render
        if obj is None:
            return {"t": "none"}
        if isinstance(obj, bool):
            return {"t": "bool", "v": obj}
        if isinstance(obj, int) and type(obj) is int:
            return {"t": "int", "v": str(obj)}
        if type(obj) is float:
            return {"t": "float", "v": obj.hex()}
        if type(obj) is complex:
            return {"t": "complex", "re": obj.real.hex(), "im": obj.imag.hex()}
        if type(obj) is str:
            return {"t": "str", "v": obj}
        if type(obj) is bytes:
            return {"t": "bytes", "v": obj.hex()}
        if type(obj) is bytearray:
            return {"t": "bytearray", "v": bytes(obj).hex()}
        if isinstance(obj, torch.dtype):
            return {"t": "dtype", "v": dtype_name(obj)}
        if isinstance(obj, torch.device):
            return {"t": "device", "type": obj.type, "index": obj.index}
        if isinstance(obj, torch.Size):
            return {"t": "size", "v": [int(d) for d in obj]}
        if isinstance(obj, torch.Tensor):
            if path is None:
                raise ValueError("tensor inside a set, a dict key or a tensor's state")
            kind = opaque_kind(obj)
            if kind is not None:
                return {"t": "opaque", "kind": kind}
            state = obj_state(obj)
            if isinstance(obj, torch.nn.Parameter):
                p = self._add_tensor(path, obj, "parameter")
                return {
                    "t": "parameter",
                    "path": p,
                    "state": None if state is None else r(state, None),
                }
            p = self._add_tensor(path, obj, "tensor")
            if state is None:
                return {"t": "tensor", "path": p}
            return {"t": "tensor_with_state", "path": p, "state": r(state, None)}
        if isinstance(obj, OrderedDict) and type(obj) is OrderedDict:
            attrs = dict(obj.__dict__)
            return {
                "t": "odict",
                "items": self._items(obj, path),
                "attrs": r(attrs, None) if attrs else None,
            }
        if type(obj) is dict:
            return {"t": "dict", "items": self._items(obj, path)}
        if type(obj) is list:
            return {"t": "list", "items": self._seq(obj, path)}
        if type(obj) is tuple:
            return {"t": "tuple", "items": self._seq(obj, path)}
        if type(obj) is set:
            return {"t": "set", "items": [r(x, None, in_set=True) for x in obj]}
        if type(obj) is frozenset:
            return {"t": "frozenset", "items": [r(x, None, in_set=True) for x in obj]}
        raise TypeError(f"cannot render {type(obj).__module__}.{type(obj).__qualname__}")

    def _items(self, d: dict[Any, Any], path: list[str] | None) -> list[Json]:
        return [
            [self.render(k, None), self.render(v, None if path is None else [*path, str(k)])]
            for k, v in d.items()
        ]

    def _seq(self, s: list[Any] | tuple[Any, ...], path: list[str] | None) -> list[Json]:
        return [
            self.render(v, None if path is None else [*path, str(i)]) for i, v in enumerate(s)
        ]


def render(obj: Any) -> tuple[Json, list[dict[str, Any]], dict[str, int]]:
    """(typed tree, tensor records, path -> storage identity) of a whole saved object."""
    rd = Renderer()
    tree = rd.render(obj, [])
    return tree, rd.tensors, rd.storage_ids


def normalize_sets(tree: Json) -> Json:
    """Copy of a typed tree with set items sorted (set iteration order is not semantic)."""
    import json

    if isinstance(tree, list):
        return [normalize_sets(x) for x in tree]
    if isinstance(tree, dict):
        out = {k: normalize_sets(v) for k, v in tree.items()}
        if tree.get("t") in ("set", "frozenset"):
            out["items"] = sorted(out["items"], key=lambda x: json.dumps(x, sort_keys=True))
        return out
    return tree


def sharing_partition(tensors: list[dict[str, Any]], field: str = "storage_key") -> list[list[str]]:
    """Groups of tensor paths sharing a storage, by first appearance (independent of key names)."""
    groups: dict[Any, list[str]] = {}
    for t in tensors:
        groups.setdefault(t[field], []).append(t["path"])
    return list(groups.values())


def partition_from_ids(ids: dict[str, int]) -> list[list[str]]:
    """Like ``sharing_partition`` but from a path -> storage identity map."""
    groups: dict[int, list[str]] = {}
    for p, i in ids.items():
        groups.setdefault(i, []).append(p)
    return list(groups.values())


# --------------------------------------------------------------------------------------------
# storage keys, read from the file while torch loads it


def _recording_unpickler_class(base: type, record: Callable[[Any, Any], None]) -> type:
    """Subclass of ``base`` whose assigned ``persistent_load`` is wrapped to call ``record``."""

    class Recording(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "persistent_load" and callable(value):
                inner = value

                def wrapped(pid: Any) -> Any:
                    res = inner(pid)
                    record(pid, res)
                    return res

                value = wrapped
            super().__setattr__(name, value)

    return Recording


def _storage_cdata(storage: Any) -> int | None:
    us = getattr(storage, "_untyped_storage", storage)
    cdata = getattr(us, "_cdata", None)
    return None if cdata is None else int(cdata)


@contextlib.contextmanager
def _record_weights_only(record: Callable[[Any, Any], None]) -> Iterator[None]:
    import torch._weights_only_unpickler as wou

    cls = wou.Unpickler

    def setattr_(self: Any, name: str, value: Any) -> None:
        if name == "persistent_load" and callable(value):
            inner = value

            def wrapped(pid: Any) -> Any:
                res = inner(pid)
                record(pid, res)
                return res

            value = wrapped
        object.__setattr__(self, name, value)

    had = "__setattr__" in cls.__dict__
    old = cls.__dict__.get("__setattr__")
    cls.__setattr__ = setattr_  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        if had:
            cls.__setattr__ = old  # type: ignore[method-assign, assignment]
        else:
            del cls.__setattr__


def load_with_keys(
    path: str | os.PathLike[str], *, weights_only: bool, mmap: bool = False
) -> tuple[Any, dict[int, str]]:
    """``torch.load`` the file and return (object, storage identity -> storage key).

    The key is the ZIP storage key of the persistent id (``data/<key>``), or the legacy format's
    opaque key string. With ``weights_only=False`` torch's loader runs with a pure-Python
    unpickler (use only on files this harness wrote).
    """
    keys: dict[int, str] = {}

    def record(pid: Any, res: Any) -> None:
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] in ("storage", b"storage"):
            key = pid[2]
            key = key.decode("ascii") if isinstance(key, bytes) else str(key)
            cd = _storage_cdata(res)
            if cd is not None:
                keys.setdefault(cd, key)

    if weights_only:
        with _record_weights_only(record):
            obj = torch.load(path, weights_only=True, mmap=mmap)
    else:
        mod = types.ModuleType("recording_pickle")
        mod.Unpickler = _recording_unpickler_class(pickle._Unpickler, record)  # type: ignore[attr-defined]
        mod.load = pickle.load  # type: ignore[attr-defined]
        obj = torch.load(path, weights_only=False, mmap=mmap, pickle_module=mod)
    return obj, keys


def attach_keys(
    tensors: list[dict[str, Any]], ids: dict[str, int], keys: dict[int, str]
) -> list[dict[str, Any]]:
    """Fill ``storage_key`` of each tensor record from (path -> identity, identity -> key)."""
    out = []
    for t in tensors:
        t = dict(t)
        t["storage_key"] = keys.get(ids[t["path"]])
        out.append(t)
    return out


# --------------------------------------------------------------------------------------------
# structural comparison


def _float_eq(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


class Mismatch(Exception):
    """Raised by ``compare`` with the path and the reason of the first difference."""


class Comparer:
    """Strict structural comparison of an original object and a candidate object.

    Checks container types (dict vs OrderedDict incl. ``__dict__`` such as ``_metadata``, list vs
    tuple, torch.Size), keys and their order, tensors (dtype, shape, stride, storage_offset,
    requires_grad, Parameter-ness, Python state, bitwise values so NaNs compare equal), opaque
    tensors by their components, scalars NaN-aware and sign-of-zero aware. Storage sharing is
    checked with ``check_sharing`` after all ``compare`` calls.
    """

    def __init__(self) -> None:
        self.orig_storage_to_cand: dict[int, tuple[int, str]] = {}
        self.cand_storage_to_orig: dict[int, tuple[int, str]] = {}
        self.identity: dict[int, tuple[int, str]] = {}
        self.identity_warnings: list[str] = []

    def compare(self, o: Any, c: Any, path: str = "<root>") -> None:
        if type(o) is not type(c):
            raise Mismatch(
                f"{path}: type {type(o).__module__}.{type(o).__qualname__} in original, "
                f"{type(c).__module__}.{type(c).__qualname__} in candidate"
            )
        if isinstance(o, torch.Tensor):
            self._tensor(o, c, path)
            return
        if isinstance(o, (dict, OrderedDict)):
            ok, ck = list(o.keys()), list(c.keys())
            if len(ok) != len(ck) or not all(
                type(a) is type(b) and self._scalar_eq(a, b) for a, b in zip(ok, ck)
            ):
                raise Mismatch(f"{path}: keys differ: original {ok!r}, candidate {ck!r}")
            if isinstance(o, OrderedDict):
                self.compare(dict(o.__dict__), dict(c.__dict__), f"{path}.__dict__")
            for k in ok:
                self.compare(o[k], c[k], f"{path}.{k}" if path != "<root>" else str(k))
            return
        if isinstance(o, (list, tuple)):  # includes torch.Size
            if len(o) != len(c):
                raise Mismatch(f"{path}: length {len(o)} in original, {len(c)} in candidate")
            for i, (a, b) in enumerate(zip(o, c)):
                self.compare(a, b, f"{path}.{i}" if path != "<root>" else str(i))
            return
        if isinstance(o, (set, frozenset)):
            if o != c:
                raise Mismatch(f"{path}: set {o!r} in original, {c!r} in candidate")
            return
        if not self._scalar_eq(o, c):
            raise Mismatch(f"{path}: value {o!r} in original, {c!r} in candidate")

    @staticmethod
    def _scalar_eq(a: Any, b: Any) -> bool:
        if type(a) is not type(b):
            return False
        if type(a) is float:
            return _float_eq(a, b)
        if type(a) is complex:
            return _float_eq(a.real, b.real) and _float_eq(a.imag, b.imag)
        return bool(a == b)

    def _tensor(self, o: torch.Tensor, c: torch.Tensor, path: str) -> None:
        prev = self.identity.get(id(o))
        if prev is not None and prev[0] != id(c):
            self.identity_warnings.append(
                f"{path}: same tensor object as {prev[1]} in original, a different object in "
                "candidate (storage sharing still checked)"
            )
        self.identity.setdefault(id(o), (id(c), path))
        for attr in ("dtype", "layout", "requires_grad", "is_quantized", "is_meta"):
            if getattr(o, attr) != getattr(c, attr):
                raise Mismatch(f"{path}: {attr} {getattr(o, attr)} vs {getattr(c, attr)}")
        if tuple(o.shape) != tuple(c.shape):
            raise Mismatch(f"{path}: shape {tuple(o.shape)} vs {tuple(c.shape)}")
        self.compare(obj_state(o), obj_state(c), f"{path}.<state>")
        if o.layout == torch.sparse_coo:
            if o.is_coalesced() != c.is_coalesced():
                raise Mismatch(f"{path}: is_coalesced {o.is_coalesced()} vs {c.is_coalesced()}")
            self._dense(o._indices(), c._indices(), f"{path}.<indices>", sharing=False)
            self._dense(o._values(), c._values(), f"{path}.<values>", sharing=False)
            return
        if o.layout in (torch.sparse_csr, torch.sparse_bsr):
            self._dense(o.crow_indices(), c.crow_indices(), f"{path}.<crow>", sharing=False)
            self._dense(o.col_indices(), c.col_indices(), f"{path}.<col>", sharing=False)
            self._dense(o.values(), c.values(), f"{path}.<values>", sharing=False)
            return
        if o.layout in (torch.sparse_csc, torch.sparse_bsc):
            self._dense(o.ccol_indices(), c.ccol_indices(), f"{path}.<ccol>", sharing=False)
            self._dense(o.row_indices(), c.row_indices(), f"{path}.<row>", sharing=False)
            self._dense(o.values(), c.values(), f"{path}.<values>", sharing=False)
            return
        if o.layout != torch.strided:
            raise Mismatch(f"{path}: unsupported layout {o.layout}")
        if o.is_meta:
            if o.stride() != c.stride() or o.storage_offset() != c.storage_offset():
                raise Mismatch(f"{path}: meta tensor stride/offset differ")
            return
        if o.is_quantized:
            if o.qscheme() != c.qscheme():
                raise Mismatch(f"{path}: qscheme {o.qscheme()} vs {c.qscheme()}")
            if o.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                if not (_float_eq(o.q_scale(), c.q_scale()) and o.q_zero_point() == c.q_zero_point()):
                    raise Mismatch(f"{path}: quantizer params differ")
            else:
                self._dense(o.q_per_channel_scales(), c.q_per_channel_scales(), f"{path}.<scales>", sharing=False)
                self._dense(
                    o.q_per_channel_zero_points(), c.q_per_channel_zero_points(), f"{path}.<zp>", sharing=False
                )
                if o.q_per_channel_axis() != c.q_per_channel_axis():
                    raise Mismatch(f"{path}: quantization axis differs")
            self._dense(o.int_repr(), c.int_repr(), f"{path}.<int_repr>", sharing=False)
            return
        self._dense(o, c, path, sharing=True)

    def _dense(self, o: torch.Tensor, c: torch.Tensor, path: str, *, sharing: bool) -> None:
        if o.dtype != c.dtype:
            raise Mismatch(f"{path}: dtype {o.dtype} vs {c.dtype}")
        if tuple(o.shape) != tuple(c.shape):
            raise Mismatch(f"{path}: shape {tuple(o.shape)} vs {tuple(c.shape)}")
        if sharing:
            if tuple(o.stride()) != tuple(c.stride()):
                raise Mismatch(f"{path}: stride {tuple(o.stride())} vs {tuple(c.stride())}")
            if o.storage_offset() != c.storage_offset():
                raise Mismatch(f"{path}: storage_offset {o.storage_offset()} vs {c.storage_offset()}")
            if o.is_conj() != c.is_conj() or o.is_neg() != c.is_neg():
                raise Mismatch(f"{path}: conj/neg bits differ")
            on, cn = o.untyped_storage().nbytes(), c.untyped_storage().nbytes()
            if on != cn:
                raise Mismatch(f"{path}: storage nbytes {on} vs {cn}")
            so, sc = storage_id(o), storage_id(c)
            m1 = self.orig_storage_to_cand.setdefault(so, (sc, path))
            m2 = self.cand_storage_to_orig.setdefault(sc, (so, path))
            if m1[0] != sc:
                raise Mismatch(
                    f"{path}: shares its storage with {m1[1]} in the original but not in the candidate"
                )
            if m2[0] != so:
                raise Mismatch(
                    f"{path}: shares its storage with {m2[1]} in the candidate but not in the original"
                )
        ob, cb = tensor_bytes(o), tensor_bytes(c)
        if ob != cb:
            isz = max(1, o.element_size())
            first = next(i for i in range(min(len(ob), len(cb))) if ob[i] != cb[i]) if len(ob) == len(cb) else 0
            raise Mismatch(
                f"{path}: values differ (first differing element {first // isz}, "
                f"bytes {ob[first:first + isz].hex()} vs {cb[first:first + isz].hex()})"
            )
