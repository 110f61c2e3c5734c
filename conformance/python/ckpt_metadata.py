#!/usr/bin/env python3
"""A reader of ckpt's safetensors metadata convention, written from its documentation
(``ckpt_safetensors::metadata`` and its ``values`` module), to prove that a Python user gets back
what ckpt stored.

``load(path)`` returns the entries of a safetensors file ckpt wrote as ``{name: value}`` in the source's
order, with every value of ``ckpt.values`` decoded to the Python object it was (tuples, ``OrderedDict`` with
attributes, int keys, ``torch.Size``, dtypes, devices, parameters, tensors of dtypes safetensors lacks,
sparse and quantized tensors rebuilt by torch's own functions, ...). ``nest(entries, paths)`` rebuilds the
nested state dict from ``ckpt.paths``. Tensors that values hold are not entries of their own.
"""

from __future__ import annotations

import collections
import importlib
import json
from typing import Any

import torch
from safetensors import safe_open

TAGS = {
    "int", "float", "complex", "bytes", "bytearray", "tuple", "set", "frozenset", "dict", "odict", "counter",
    "torch.Size", "torch.dtype", "torch.device", "tensor", "parameter", "tensor_with_state", "opaque_tensor",
    "storage", "global", "object", "numpy", "composite",
}


def composite(layout: str, parts: dict[str, torch.Tensor], shape: list[int], axis: Any, coalesced: Any) -> torch.Tensor:
    """The quantized, sparse or nested tensor of a ``composite`` record, made by torch's own constructors."""
    if layout == "per_tensor_affine":
        return torch._make_per_tensor_quantized_tensor(parts["int_repr"], float(parts["scale"]),
                                                       int(parts["zero_point"]))
    if layout == "per_channel_affine":
        return torch._make_per_channel_quantized_tensor(parts["int_repr"], parts["scale"], parts["zero_point"], axis)
    if layout == "sparse_coo":
        return torch.sparse_coo_tensor(parts["indices"], parts["values"], shape, is_coalesced=bool(coalesced))
    if layout == "nested":
        return torch._nested_view_from_buffer(parts["buffer"].clone(), parts["sizes"], parts["strides"],
                                              parts["storage_offsets"])
    compressed, plain = (parts["crow_indices"], parts["col_indices"]) if "crow_indices" in parts else (
        parts["ccol_indices"], parts["row_indices"])
    return torch.sparse_compressed_tensor(compressed, plain, parts["values"], shape, layout=getattr(torch, layout))


class Decoder:
    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self.used: set[str] = set()

    def stored(self, name: str) -> torch.Tensor:
        self.used.add(name)
        return self.tensors[name]

    def tensor(self, o: dict) -> torch.Tensor:
        t = self.stored(o["tensor"])
        if "dtype" in o:
            dtype = getattr(torch, o["dtype"])
            t = t.contiguous().view(torch.uint8).reshape(-1).view(dtype).reshape(o["shape"])
        if o.get("requires_grad"):
            t = t.clone().requires_grad_(True)
        return t

    def raw(self, payload: Any) -> bytes:
        if isinstance(payload, str):
            return bytes.fromhex(payload)
        return self.stored(payload["tensor"]).numpy().tobytes()

    def pairs(self, payload: Any) -> list:
        if isinstance(payload, dict):
            return [(k, self.decode(v)) for k, v in payload.items()]
        return [(self.decode(k), self.decode(v)) for k, v in payload]

    def decode(self, j: Any) -> Any:
        if j is None or isinstance(j, (bool, int, float, str)):
            return j
        if isinstance(j, list):
            return [self.decode(x) for x in j]
        (tag,) = [k for k in j if k in TAGS]
        p = j[tag]
        if tag == "int":
            return int(p)
        if tag == "float":
            return float_of(j)
        if tag == "complex":
            return complex(float_of(p[0]), float_of(p[1]))
        if tag == "bytes":
            return self.raw(p)
        if tag == "bytearray":
            return bytearray(self.raw(p))
        if tag == "tuple":
            return tuple(self.decode(x) for x in p)
        if tag == "set":
            return {self.decode(x) for x in p}
        if tag == "frozenset":
            return frozenset(self.decode(x) for x in p)
        if tag in ("dict", "odict", "counter"):
            kind = {"dict": dict, "odict": collections.OrderedDict, "counter": collections.Counter}[tag]
            d = kind(self.pairs(p))
            if "attrs" in j:
                d.__dict__.update(self.decode(j["attrs"]))
            return d
        if tag == "torch.Size":
            return torch.Size(p)
        if tag == "torch.dtype":
            return getattr(torch, p)
        if tag == "torch.device":
            return torch.device(p)
        if tag == "tensor":
            return self.tensor(j)
        if tag == "parameter":
            t = self.tensor(p)
            param = torch.nn.Parameter(t.detach(), requires_grad=t.requires_grad)
            if "state" in j:
                param.__dict__.update(self.decode(j["state"]))
            return param
        if tag == "tensor_with_state":
            t = self.decode(p)
            t.__dict__.update(self.decode(j["state"]))
            return t
        if tag == "opaque_tensor":
            return self.decode(j["rebuild"])
        if tag == "composite":
            parts = {k: self.tensor(v) for k, v in j["components"].items()}
            return composite(p, parts, j["shape"], j.get("axis"), j.get("coalesced"))
        if tag == "storage":
            data = bytearray(self.raw(p))
            dtype = getattr(torch, j["dtype"])
            return torch.storage.TypedStorage(wrap_storage=torch.frombuffer(data, dtype=torch.uint8).untyped_storage(), dtype=dtype, _internal=True)
        if tag == "global":
            module, name = p
            obj = importlib.import_module(module)
            for part in name.split("."):
                obj = getattr(obj, part)
            return obj
        if tag == "object":
            func = self.decode(p)
            args = self.decode(j["args"])
            obj = func.__new__(func, *args) if j.get("newobj") else func(*args)
            for item in (self.decode(x) for x in j.get("list_items", [])):
                obj.append(item)
            for k, v in self.pairs(j.get("dict_items", [])):
                obj[k] = v
            if "state" in j:
                state = self.decode(j["state"])
                if hasattr(obj, "__setstate__"):
                    obj.__setstate__(state)
                else:
                    obj.__dict__.update(state)
            return obj
        if tag == "numpy":
            import numpy as np

            dtype = np.dtype(j["dtype"])
            v = self.decode(p)
            if isinstance(v, torch.Tensor):
                return v.detach().numpy().copy(order="C").astype(dtype, copy=False)
            return dtype.type(v)
        raise ValueError(f"unknown tag {tag}")


def float_of(j: Any) -> float:
    if not isinstance(j, dict):
        return float(j)
    text = j["float"]
    if text in ("nan", "inf", "-inf"):
        return float(text)
    import struct

    return struct.unpack("<d", int(text, 16).to_bytes(8, "little"))[0]


def load(path: str) -> tuple[dict[str, Any], dict[str, list]]:
    """(entries in order, paths) of a safetensors file ckpt wrote (any safetensors file: plain tensors)."""
    entries, paths, _ = load_files([path])
    return entries, paths


def load_files(files: list) -> tuple[dict[str, Any], dict[str, list], set[str]]:
    """(entries in order, paths, tensors values hold) of the safetensors files of one checkpoint (the shards of
    a Hugging Face directory: ckpt's records are in the first, tensors in any)."""
    meta: dict[str, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for k, v in (f.metadata() or {}).items():
                meta.setdefault(k, v)
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    paths = json.loads(meta.get("ckpt.paths", "{}"), object_pairs_hook=collections.OrderedDict)
    encoded = json.loads(meta.get("ckpt.values", "{}"), object_pairs_hook=collections.OrderedDict)
    decoder = Decoder(tensors)
    values = {name: decoder.decode(j) for name, j in encoded.items()}
    hidden = decoder.used - set(values)
    out: dict[str, Any] = {}
    for name in [*paths, *tensors, *values]:
        if name in out:
            continue
        if name in values:
            out[name] = values[name]
        elif name in tensors and name not in hidden:
            out[name] = tensors[name]
    return out, paths, hidden


def nest(entries: dict[str, Any], paths: dict[str, list]) -> dict:
    """The nested state dict the entries' paths make (DCP's ``set_element``: keys make dicts, indices lists)."""
    root: dict = {}
    for name, value in entries.items():
        path = paths.get(name, [name])
        cur: Any = root
        for step, nxt in zip(path, path[1:]):
            default = {} if isinstance(nxt, str) else []
            if isinstance(cur, dict):
                cur = cur.setdefault(step, default)
            else:
                while len(cur) <= step:
                    cur.append(None)
                if cur[step] is None:
                    cur[step] = default
                cur = cur[step]
        last = path[-1]
        if isinstance(cur, dict):
            cur[last] = value
        else:
            while len(cur) <= last:
                cur.append(None)
            cur[last] = value
    return root
