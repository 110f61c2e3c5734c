#!/usr/bin/env python3
"""Load checkpoints that ``ckpt::convert`` wrote with the Python originals and describe their tensors.

Usage::

    .venv/bin/python conformance/python/matrix/check_outputs.py SPEC.json OUT.json

SPEC.json is ``{"checks": [{"format": F, "path": P}, ...]}``; every check runs in this one process (torch
starts once). Each output is loaded the way its users load it:

* ``torch``: ``torch.load(P, weights_only=True)``;
* ``safetensors``: ``safetensors.torch.load_file(P)`` for the tensors, and ckpt's metadata convention read by
  ``ckpt_metadata.py`` (written from its documentation) for everything else: the entries by name, values
  decoded to the Python objects they were (tensors of dtypes safetensors lacks restored, tensors held by
  values not listed on their own);
* ``hf``: ``huggingface_hub.load_torch_model`` (its own sharded loading: index, shard names, every shard) into a
  module holding every stored tensor, with every key loaded; the index checked against
  ``huggingface_hub.split_torch_state_dict_into_shards`` run on the loaded tensors in ckpt's entry order with
  the same ``max_shard_size`` (same files, same tensors in each, same ``total_size``); entries as for
  safetensors, ckpt's records read from the first shard;
* ``distcp``: ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save(P, tmp)`` (``dcp.load`` with
  the empty-state-dict planner, no process group), then ``torch.load(tmp, weights_only=True)``;
* ``hfai``: ``hfai_ref.load(P, weights_only=True)`` (the hfai reference loader, conformance/python/hfai);
* ``pbg``: torchbiggraph 1.0.0's own ``CheckpointManager`` and ``FileCheckpointStorage`` on the committed
  version, with the layout of the directory's ``config.json`` parsed by ``ConfigSchema``: every entity
  partition (embeddings and ``RowAdagrad`` state) and the model (state dict and ``Adagrad`` state), named as
  ckpt names them (``embeddings/<entity>/<part>``, ``model/<public name>``, ``optimizer/...``);
* ``recis``: RecIS is not installable without CUDA (specs/recis.md section 12), so its loader's rules are
  applied here: ``index`` and ``tensorkey.json`` resolve every block, the data files are read with the
  ``safetensors`` library, each tensor's slices are concatenated in slice-string order (RecIS's
  ``CheckpointReader.read_tensor``), and ``model.pt``/``extra.pt``/``io_state_<s>.pt`` load with
  ``torch.load(weights_only=True)`` (leaves named as ckpt names them: bare, ``extra/``, ``io_state_<s>/``).

OUT.json gets, per check in order, ``{"tensors": {name: [dtype, shape, sha256]}}`` where names are the
leaves' dotted paths (``ckpt_tensor::leaves`` naming: every dict, list and tuple descended into; ``str()`` of
keys), dtype is torch's name (``float32``), and sha256 is over the row-major bytes of the tensor — or
``{"error": text}`` when loading failed. The Rust side compares these with what it wrote.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hfai"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ckpt_metadata  # noqa: E402
import hfai_ref  # noqa: E402


def digest(t: torch.Tensor) -> str:
    t = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    if t.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()


def leaves(value, prefix: str, out: dict) -> None:
    import numpy as np

    if isinstance(value, torch.nn.Module):  # a whole pickled module: its state dict, as ckpt lists it
        value = value.state_dict()
    if isinstance(value, np.ndarray) and not value.dtype.hasobject and value.dtype.fields is None:
        value = torch.from_numpy(value.copy(order="C"))  # numpy arrays are tensors of their dtype
    if isinstance(value, dict) and value:
        for k, v in value.items():
            leaves(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, (list, tuple)) and value:
        for i, v in enumerate(value):
            leaves(v, f"{prefix}.{i}" if prefix else str(i), out)
    elif (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and not value.is_quantized
        and value.device.type != "meta"
    ):  # dense tensors only, as ckpt lists them
        out[prefix] = [str(value.dtype).removeprefix("torch."), list(value.shape), digest(value)]


def module_holding(tensors: dict) -> torch.nn.Module | None:
    """A module whose state dict is ``tensors`` (buffers in nested modules), or None when names clash."""
    root = torch.nn.Module()
    try:
        for name, t in tensors.items():
            *parents, leaf = name.split(".")
            m = root
            for p in parents:
                if not hasattr(m, p):
                    m.add_module(p, torch.nn.Module())
                m = getattr(m, p)
                if not isinstance(m, torch.nn.Module):
                    return None
            m.register_buffer(leaf, torch.zeros_like(t))
    except (KeyError, AttributeError, TypeError):
        return None
    return root if set(root.state_dict()) == set(tensors) else None


def load_hf(path: str, max_shard_size: int) -> dict:
    from huggingface_hub import load_torch_model, split_torch_state_dict_into_shards
    from safetensors.torch import load_file

    root = Path(path)
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    if index is not None:
        # transformers' own text: json.dumps(index, indent=2, sort_keys=True) + "\n"
        assert index_path.read_text() == json.dumps(index, indent=2, sort_keys=True) + "\n", "index text"
        files = list(dict.fromkeys(index["weight_map"].values()))
    else:
        assert (root / "model.safetensors").is_file(), "no model.safetensors"
        files = ["model.safetensors"]
    ours = {f: set(load_file(str(root / f))) for f in files}
    tensors = {}
    for f in files:
        tensors.update(load_file(str(root / f)))
    if index is not None:
        assert set(index["weight_map"]) == set(tensors), "weight_map lists every tensor"
        assert all(name in ours[f] for name, f in index["weight_map"].items()), "weight_map matches the files"
    # huggingface_hub's sharded loading.
    model = module_holding(tensors)
    if model is not None and tensors:
        result = load_torch_model(model, path, strict=False)
        assert not result.missing_keys and not result.unexpected_keys, result
        for name, t in model.state_dict().items():
            assert torch.equal(t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8), (tensors[name] if tensors[name].dim() else tensors[name].reshape(1)).view(torch.uint8)), name
    entries, paths, hidden = ckpt_metadata.load_files([root / f for f in files])
    # The split huggingface_hub computes for the same tensors in ckpt's order.
    if not hidden and tensors:  # (without tensors huggingface_hub makes no file; ckpt writes one for the records)
        order = [n for n in entries if n in tensors] + [n for n in tensors if n not in entries]
        split = split_torch_state_dict_into_shards({n: tensors[n] for n in order}, max_shard_size=max_shard_size)
        want = {f: {n for n in names if tensors[n].numel()} for f, names in split.filename_to_tensors.items()}
        got = {f: {n for n in names if tensors[n].numel()} for f, names in ours.items()}
        assert want == got, f"shards {got} != huggingface_hub's {want}"
        if index is not None:
            assert index["metadata"]["total_size"] == split.metadata["total_size"], "total_size"
    return {"tensors": entries, "described": {}}


def load_torch(path: str):
    """``torch.load(weights_only=True)``, allowing the numpy and ``torch.nn`` globals the file names (numpy
    values, whole modules) and the classes torch then asks for to build them (numpy 2's dtype classes)."""
    import importlib
    import re

    def resolve(name: str):
        module, _, attr = name.rpartition(".")
        return getattr(importlib.import_module(module), attr)

    allowed = [
        resolve(g) for g in torch.serialization.get_unsafe_globals_in_checkpoint(path)
        if g.startswith(("numpy.", "torch.nn.modules."))
    ]
    for _ in range(64):
        try:
            with torch.serialization.safe_globals(allowed):
                return torch.load(path, weights_only=True)
        except Exception as e:  # noqa: BLE001 - retried with the class torch names, else raised
            m = re.search(r"but got <class '(numpy[\w.]+)'>", str(e))
            if not m:
                raise
            allowed.append(resolve(m.group(1)))
    raise AssertionError("too many classes to allow")


def numpy_globals() -> list:
    """What torch's weights-only unpickler needs allowed to build numpy scalars and arrays (numpy 2)."""
    import numpy as np
    from numpy._core import multiarray

    classes = [c for c in vars(np.dtypes).values() if isinstance(c, type) and issubclass(c, np.dtype)]
    return [multiarray.scalar, multiarray._reconstruct, np.dtype, np.ndarray, *classes]


def load(fmt: str, path: str, check: dict):
    # numpy values are allowed wherever a format embeds torch.save files (DCP's BYTE_IO items, hfai's parts).
    with torch.serialization.safe_globals(numpy_globals()):
        return load_format(fmt, path, check)


def load_format(fmt: str, path: str, check: dict):
    if fmt == "torch":
        return load_torch(path)
    if fmt == "safetensors":
        from safetensors.torch import load_file

        plain = load_file(path)
        entries, _ = ckpt_metadata.load(path)
        for name, value in entries.items():  # a plain tensor entry is what safetensors itself loads
            if type(value) is torch.Tensor and name in plain and plain[name].dtype == value.dtype:
                a, b = plain[name].reshape(-1).view(torch.uint8), value.detach().contiguous().reshape(-1).view(torch.uint8)
                assert torch.equal(a, b), name
        return {"tensors": entries, "described": {}}
    if fmt == "distcp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "sd.pt"
            dcp_to_torch_save(path, out)
            return torch.load(out, weights_only=True)
    if fmt == "hfai":
        return hfai_ref.load(path, nthreads=0, weights_only=True)
    if fmt == "hf":
        return load_hf(path, check.get("max_shard_size", 5_000_000_000))
    if fmt == "pbg":
        return load_pbg(path)
    if fmt == "recis":
        return load_recis(path)
    raise ValueError(f"unknown format {fmt}")


def prefixed(prefix: str, value, out: dict) -> None:
    """Leaves of ``value`` under ``prefix + <dotted leaf name>``."""
    inner: dict = {}
    leaves(value, "", inner)
    for k, v in inner.items():
        out[prefix + k] = v


def load_pbg(path: str) -> dict:
    from torchbiggraph.checkpoint_manager import CheckpointManager, deserialize_optim_state
    from torchbiggraph.config import ConfigSchema

    config = ConfigSchema.from_dict(json.loads((Path(path) / "config.json").read_text()))
    manager = CheckpointManager(path)
    version = manager.checkpoint_version
    out: dict = {}
    described: dict = {}
    for entity, schema in config.entities.items():
        for part in range(schema.num_partitions):
            embs, optim = manager.storage.load_entity_partition(version, entity, part)
            out[f"embeddings/{entity}/{part}"] = embs
            if optim is not None:
                prefixed(f"optimizer/embeddings/{entity}/{part}/", deserialize_optim_state(optim), described)
    state_dict, optim = manager.read_model()
    for private, t in (state_dict or {}).items():
        head, *rest = private.split(".")
        if head == "global_embs":
            public = f"entities/{rest[0].removeprefix('emb_')}/global_embedding"
        else:
            public = f"relations/{rest[0]}/operator/{head.removesuffix('_operators')}/{rest[1]}"
        out[f"model/{public}"] = t
    if optim is not None:
        prefixed("optimizer/model/", optim, described)
    return {"tensors": out, "described": described}


def load_recis(path: str) -> dict:
    import safetensors.torch

    root = Path(path)
    out: dict = {}
    described: dict = {}
    if (root / "index").is_file():
        index = json.loads((root / "index").read_text())
        tensorkey = json.loads((root / "tensorkey.json").read_text())
        files = {fid: name for name, fid in index["file_index"].items()}
        data = {fid: safetensors.torch.load_file(str(root / name)) for fid, name in files.items()}
        slices: dict = {}
        for key, fid in index["block_index"].items():
            tensor, sl = [x for x in tensorkey.get(key, key).split("^") if x]
            slices.setdefault(tensor, []).append((sl, data[fid][key]))
        for tensor, parts in slices.items():
            parts.sort(key=lambda p: p[0])
            out[tensor] = parts[0][1] if parts[0][0] == " " else torch.cat([t for _, t in parts])
    for name, prefix in [("model.pt", ""), ("extra.pt", "extra/")]:
        if (root / name).is_file():
            prefixed(prefix, torch.load(root / name, weights_only=True), described)
    for f in sorted(root.glob("io_state_*.pt")):
        prefixed(f"{f.stem}/", torch.load(f, weights_only=True), described)
    return {"tensors": out, "described": described}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    results = []
    for check in spec["checks"]:
        try:
            out: dict = {}
            loaded = load(check["format"], check["path"], check)
            if check["format"] in ("pbg", "recis", "safetensors", "hf"):  # already named as ckpt names them
                for name, t in loaded["tensors"].items():
                    leaves(t, name, out)
                out.update(loaded["described"])
            else:
                leaves(loaded, "", out)
            results.append({"tensors": out})
        except Exception:  # reported to the Rust side, which fails the test naming the output
            results.append({"error": traceback.format_exc()})
    Path(sys.argv[2]).write_text(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
