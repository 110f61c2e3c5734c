#!/usr/bin/env python3
"""Generate the fixtures of the checkpoints users have that nobody on this project wrote (issue 26), each
made by the real software, with JSON manifests.

Usage::

    .venv/bin/python conformance/python/make_real_fixtures.py OUTDIR

Writes into OUTDIR (the committed copy lives in ``conformance/fixtures/real/``):

- ``py2_torch03.pt``: a legacy ``torch.save`` stream as torch 0.3 wrote it under Python 2: every ``str``
  a ``SHORT_BINSTRING``/``BINSTRING`` (Python 2's ``str``), ints Python 2 held as ``long`` as ``LONG1``,
  tensors by ``torch._utils._rebuild_tensor`` (v1) over storages of every class of the era
  (``torch.FloatStorage`` ... ``torch.ByteStorage``, one ``torch.cuda.HalfStorage`` saved from
  ``cuda:0``), persistent ids with the sixth item (a storage view shared by two tensors), Python 2's
  ``OrderedDict`` reduce form (a list of ``[key, value]`` lists), ``__builtin__.set``, and an old-style
  class instance (``OBJ``);
- ``py2_torch04.pt``: the same era's torch 0.4 layout: ``_rebuild_tensor_v2`` with ``requires_grad`` and
  backward hooks, an ``OrderedDict`` state dict with its ``_metadata`` attribute;
- ``omegaconf.ckpt``: a Lightning-style checkpoint whose ``hyper_parameters`` are an omegaconf
  ``DictConfig`` (nested configs and a ``ListConfig``, each child linked back to its parent through
  ``_parent``: a cyclic object graph);
- ``scripted.jit``: ``torch.jit.save`` of a scripted and frozen module (``real_scripted.py``: parameters
  and buffers of nested modules, a tensor attribute that is neither, two tensor constants in
  ``constants.pkl``, the code in ``code/``); its manifest's ``tensors`` are the module's ``state_dict()``, its
  ``attributes`` the other tensor attributes (ckpt lists them as ``attributes.<path>``), its ``constants`` the
  tensor constants of every module's code (ckpt lists them as ``constants.<i>``, by their order in
  ``constants.pkl``);
- ``deflate.pt``: a ``torch.save`` file whose records are DEFLATE-compressed (as a re-zipped file is),
  which ``torch.load`` reads;
- ``objects.ckpt``: a model checkpoint whose modules sit inside an object (chemprop's layout: Lightning's
  ``AttributeDict`` of hyper-parameters holding a metric object with tensor state and a transform module
  with buffers).

The Python 2 files are written by a ``pickle._Pickler`` that writes what Python 2's pickler wrote for the
same objects (the byte layout is checked against ``pickletools`` in the generator). Every value is an exact
small dyadic rational; every file is byte-reproducible with the pinned wheels. Each fixture has
``<name>.json``: how it loads (``torch.load``, ``torch.jit.load``): every tensor under the name ckpt lists it
by (dict keys, attributes and ``state_dict()`` names joined by ``.``), with dtype, shape and sha256;
``STAMP.json`` records the generator's sha256, the versions and the sha256 of every file.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pinenv  # noqa: E402

pinenv.pin_environment()

import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import linecache  # noqa: E402
import pickle  # noqa: E402
import pickletools  # noqa: E402
import platform  # noqa: E402
import struct  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402
import zipfile  # noqa: E402
from collections import OrderedDict  # noqa: E402
from typing import Any  # noqa: E402

import omegaconf  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torch import nn  # noqa: E402

import real_classes  # noqa: E402

GENERATOR = "make_real_fixtures.py"
COMMAND = ".venv/bin/python conformance/python/make_real_fixtures.py conformance/fixtures/real"

warnings.filterwarnings("ignore")


def exact(shape: tuple[int, ...], k: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Element i is ``((i * (2k + 5) + k) % 17 - 8) / 16``: exact in every float dtype (and an int for
    integer dtypes after scaling by 16)."""
    n = 1
    for d in shape:
        n *= d
    v = (torch.arange(n, dtype=torch.int64) * (2 * k + 5) + k) % 17 - 8
    if dtype.is_floating_point:
        return (v.to(torch.float64) / 16).to(dtype).reshape(shape)
    if dtype == torch.uint8:
        v = v + 8
    return v.to(dtype).reshape(shape)


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tensor_record(t: torch.Tensor) -> dict[str, Any]:
    t = t.detach().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "sha256": sha256(raw)}


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n",
                    encoding="utf-8")


# --- what ckpt lists: every tensor by the names Python reaches it by ------------------------------------


def tensors_by_name(obj: Any, prefix: str = "", seen: set[int] | None = None) -> dict[str, Any]:
    """Every tensor reachable from ``obj``, named by dict keys, list positions, object attributes and, for
    modules, ``state_dict()`` names (what ckpt's entries name them by); each object walked once on a path
    (a cycle stops)."""
    seen = set() if seen is None else seen
    out: dict[str, Any] = {}

    def join(k: Any) -> str:
        return f"{prefix}.{k}" if prefix else str(k)

    if isinstance(obj, torch.Tensor):
        out[prefix] = tensor_record(obj)
        return out
    if id(obj) in seen:
        return out
    seen = seen | {id(obj)}
    if isinstance(obj, omegaconf.DictConfig | omegaconf.ListConfig):
        return out  # holds no tensors here
    if isinstance(obj, nn.Module):
        for k, v in obj.state_dict(keep_vars=True).items():
            out.update(tensors_by_name(v, join(k), seen))
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(tensors_by_name(v, join(k), seen))
        return out
    if isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out.update(tensors_by_name(v, join(i), seen))
        return out
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        for k, v in vars(obj).items():
            out.update(tensors_by_name(v, join(k), seen))
    return out


# --- Python 2's pickler, for the legacy files -----------------------------------------------------------


class Py2Long(int):
    """An int Python 2 held as a ``long``: pickled as LONG1 even when small (Python 2's ``save_long``)."""


class StorageRef:
    """A storage as torch 0.3/0.4's ``persistent_id`` named it."""

    def __init__(self, cls: str, key: str, location: str, numel: int,
                 view: tuple[str, int, int] | None = None) -> None:
        self.cls, self.key, self.location, self.numel, self.view = cls, key, location, numel, view


class Tensor03:
    """A tensor as torch 0.3 pickled it: ``_rebuild_tensor(storage, offset, size, stride)``."""

    def __init__(self, storage: StorageRef, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.args = (storage, offset, size, stride)

    def __reduce__(self):  # noqa: ANN204
        return (torch._utils._rebuild_tensor, self.args)


class Tensor04:
    """A tensor as torch 0.4 pickled it: ``_rebuild_tensor_v2(storage, offset, size, stride,
    requires_grad, backward_hooks)``."""

    def __init__(self, storage: StorageRef, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                 requires_grad: bool) -> None:
        self.args = (storage, offset, size, stride, requires_grad, OrderedDict())

    def __reduce__(self):  # noqa: ANN204
        return (torch._utils._rebuild_tensor_v2, self.args)


class Py2Pickler(pickle._Pickler):  # noqa: SLF001 - the pure-Python pickler is the one to subclass
    """Protocol 2 as Python 2 wrote it: ``str`` as SHORT_BINSTRING/BINSTRING of its UTF-8 bytes, longs as
    LONG1, ``OrderedDict`` by its Python 2 reduce form, old-style instances by OBJ, Python 2 global names
    (``fix_imports``), storages by persistent id."""

    dispatch = pickle._Pickler.dispatch.copy()  # noqa: SLF001

    def __init__(self, f: io.BytesIO) -> None:
        super().__init__(f, protocol=2, fix_imports=True)

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, StorageRef):
            module, name = obj.cls.rsplit(".", 1)
            cls = getattr(sys.modules[module] if module in sys.modules else __import__(module), name)
            return ("storage", cls, obj.key, obj.location, Py2Long(obj.numel), obj.view)
        return None

    def save_py2_str(self, obj: str) -> None:
        b = obj.encode("utf-8")
        if len(b) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(b)]) + b)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(b)) + b)
        self.memoize(obj)

    dispatch[str] = save_py2_str

    def save_py2_long(self, obj: Py2Long) -> None:
        encoded = pickle.encode_long(int(obj))
        self.write(pickle.LONG1 + bytes([len(encoded)]) + encoded)

    dispatch[Py2Long] = save_py2_long

    def save_ordered_dict(self, obj: OrderedDict) -> None:
        items = [[k, obj[k]] for k in obj]
        state = {k: v for k, v in vars(obj).items()} if hasattr(obj, "__dict__") else {}
        if state:
            self.save_reduce(OrderedDict, (items,), state, obj=obj)
        else:
            self.save_reduce(OrderedDict, (items,), obj=obj)

    dispatch[OrderedDict] = save_ordered_dict

    def save_old_style(self, obj: real_classes.OldStyle) -> None:
        self.write(pickle.MARK)
        self.save_global(type(obj))
        self.write(pickle.OBJ)
        self.memoize(obj)
        self.save(vars(obj))
        self.write(pickle.BUILD)

    dispatch[real_classes.OldStyle] = save_old_style


def py2_pickle(obj: Any) -> bytes:
    f = io.BytesIO()
    Py2Pickler(f).dump(obj)
    return f.getvalue()


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def legacy_stream(obj: Any, storages: dict[str, bytes]) -> tuple[bytes, bytes]:
    """A legacy ``torch.save`` stream: magic number, protocol version, system info, the object, the sorted
    storage keys, then each storage as its element count and bytes (what torch 0.3/0.4 wrote)."""
    numel = {}

    def collect(o: Any) -> None:
        if isinstance(o, StorageRef):
            numel[o.key] = o.numel
        elif isinstance(o, Tensor03 | Tensor04):
            collect(o.args[0])
        elif isinstance(o, dict):
            for v in o.values():
                collect(v)
        elif isinstance(o, list | tuple):
            for v in o:
                collect(v)

    collect(obj)
    keys = sorted(storages)
    out = io.BytesIO()
    out.write(py2_pickle(Py2Long(LEGACY_MAGIC)))
    out.write(py2_pickle(1001))
    out.write(py2_pickle({"protocol_version": 1001, "little_endian": True,
                          "type_sizes": {"short": 2, "int": 4, "long": 8}}))
    object_pickle = py2_pickle(obj)
    out.write(object_pickle)
    out.write(py2_pickle(keys))
    for k in keys:
        out.write(struct.pack("<q", numel[k]))
        out.write(storages[k])
    return out.getvalue(), object_pickle


STORAGE_CLASSES = [
    ("torch.FloatStorage", torch.float32),
    ("torch.DoubleStorage", torch.float64),
    ("torch.HalfStorage", torch.float16),
    ("torch.LongStorage", torch.int64),
    ("torch.IntStorage", torch.int32),
    ("torch.ShortStorage", torch.int16),
    ("torch.CharStorage", torch.int8),
    ("torch.ByteStorage", torch.uint8),
]


def legacy_tensors(v1: bool) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A state dict of one tensor per storage class (and two views of one storage), its storage bytes."""
    storages: dict[str, bytes] = {}
    sd: list[tuple[str, Any]] = []
    for i, (cls, dtype) in enumerate(STORAGE_CLASSES):
        t = exact((2, 3), i, dtype)
        key = str(94000000 + 16 * i)
        storages[key] = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        ref = StorageRef(cls, key, "cpu", 6)
        tensor = Tensor03(ref, 0, (2, 3), (3, 1)) if v1 else Tensor04(ref, 0, (2, 3), (3, 1), i == 0)
        sd.append((f"layer{i}.weight", tensor))
    # Two tensors viewing one storage through the sixth persistent-id item (a storage view).
    root = exact((8,), 9)
    storages["95000000"] = root.numpy().tobytes()
    view = ("95000016", 2, 4)
    for j, (off, size) in enumerate([(0, (2, 2)), (1, (3,))]):
        ref = StorageRef("torch.FloatStorage", "95000000", "cpu", 8, view)
        stride = (2, 1) if len(size) == 2 else (1,)
        t = Tensor03(ref, off, size, stride) if v1 else Tensor04(ref, off, size, stride, False)
        sd.append((f"view{j}", t))
    # A storage saved from a GPU (torch.load maps it to the CPU).
    half = exact((4,), 11, torch.float16)
    storages["96000000"] = half.numpy().tobytes()
    ref = StorageRef("torch.cuda.HalfStorage", "96000000", "cuda:0", 4)
    sd.append(("gpu.bias", Tensor03(ref, 0, (4,), (1,)) if v1 else Tensor04(ref, 0, (4,), (1,), False)))
    return dict(sd), storages


def py2_torch03() -> tuple[bytes, bytes]:
    sd, storages = legacy_tensors(v1=True)
    state = OrderedDict(sd)
    obj = {
        "state_dict": state,
        "epoch": Py2Long(7),
        "best_prec1": 0.75,
        "big": Py2Long(2**70 + 5),
        "arch": "resnet18",
        "classes": {"cat", "dog"},
        "note": "caf\u00e9",
        "meta": real_classes.OldStyle(),
    }
    return legacy_stream(obj, storages)


def py2_torch04() -> tuple[bytes, bytes]:
    sd, storages = legacy_tensors(v1=False)
    state = OrderedDict(sd)
    state._metadata = OrderedDict([("", {"version": 1}), ("layer0", {"version": 1})])  # noqa: SLF001
    obj = {"model": state, "iteration": Py2Long(100), "optimizer": {"lr": 0.5, "momentum": 0.875}}
    return legacy_stream(obj, storages)


# --- the other files --------------------------------------------------------------------------------------


def omegaconf_checkpoint() -> dict[str, Any]:
    cfg = OmegaConf.create({
        "model": {"hidden": 8, "layers": [4, 2], "act": "relu", "dropout": 0.125},
        "optim": {"name": "adam", "lr": 0.001, "betas": [0.875, 0.999]},
        "seed": 7,
    })
    return {
        "epoch": 2,
        "global_step": 40,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": OrderedDict([("model.lin.weight", exact((2, 3), 1)), ("model.lin.bias", exact((2,), 2))]),
        "hparams_name": "cfg",
        "hyper_parameters": cfg,
    }


def scripted_module() -> torch.jit.ScriptModule:
    """``real_scripted.Outer``, its values set, scripted and frozen (``real_scripted.py`` says why). The
    source is compiled under its bare file name: the archive's debug records then hold no machine's path."""
    name = "real_scripted.py"
    source = (HERE / name).read_text(encoding="utf-8")
    module = types.ModuleType("real_scripted")
    module.__file__ = name
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    sys.modules["real_scripted"] = module
    exec(compile(source, name, "exec"), module.__dict__)  # noqa: S102 - the project's own source
    outer = module.Outer().eval()
    with torch.no_grad():
        outer.inner.lin.weight.copy_(exact((2, 3), 1))
        outer.inner.lin.bias.copy_(exact((2,), 2))
        outer.inner.bn.running_mean.copy_(exact((2,), 3))
        outer.inner.bn.running_var.copy_(exact((2,), 4).abs() + 0.5)
        outer.inner.scale.fill_(2.0)
        outer.inner._state = exact((2,), 5)  # noqa: SLF001
    return torch.jit.freeze(torch.jit.script(outer), preserved_attrs=["inner"])


def objects_checkpoint() -> dict[str, Any]:
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    with torch.no_grad():
        model[0].weight.copy_(exact((2, 3), 1))
        model[0].bias.copy_(exact((2,), 2))
    hp = real_classes.AttributeDict()
    hp["metric"] = real_classes.Metric()
    hp["scaler"] = real_classes.Scaler(3)
    hp["task_weights"] = exact((1, 2), 6)
    hp["lr"] = 0.001
    return {"epoch": 5, "state_dict": model.state_dict(), "hyper_parameters": hp}


def deflated(raw: bytes) -> bytes:
    """The same archive with every record DEFLATE-compressed, names and order kept."""
    src = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as dst:
        for info in src.infolist():
            zi = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(zi, src.read(info.filename))
    return out.getvalue()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    manifests = []

    def record(name: str, description: str, loaded: Any, **extra: Any) -> None:
        m = {"file": name, "generator": GENERATOR, "description": description,
             "torch": torch.__version__.split("+")[0], "tensors": tensors_by_name(loaded), **extra}
        write_json(outdir / (Path(name).stem + ".json"), m)
        manifests.append(m)

    for name, (data, object_pickle), what in [
        ("py2_torch03.pt", py2_torch03(), "torch 0.3 legacy stream pickled by Python 2 (_rebuild_tensor v1)"),
        ("py2_torch04.pt", py2_torch04(), "torch 0.4 legacy stream pickled by Python 2 (_rebuild_tensor_v2)"),
    ]:
        (outdir / name).write_bytes(data)
        # What Python 2 wrote: its strs are BINSTRINGs, never BINUNICODE; longs LONG1; Python 2 names.
        ops = {op.name for op, _, _ in pickletools.genops(object_pickle)}
        assert {"SHORT_BINSTRING", "LONG1", "BINPERSID"} <= ops and "BINUNICODE" not in ops, ops
        assert b"__builtin__" in object_pickle or name != "py2_torch03.pt", "Python 2 module names"
        loaded = torch.load(str(outdir / name), weights_only=False, map_location="cpu")
        record(name, what, loaded)

    torch.save(omegaconf_checkpoint(), str(outdir / "omegaconf.ckpt"))
    loaded = torch.load(str(outdir / "omegaconf.ckpt"), weights_only=False)
    assert loaded["hyper_parameters"].model._get_parent() is loaded["hyper_parameters"]
    record("omegaconf.ckpt", "Lightning-style checkpoint with omegaconf DictConfig hyper-parameters (parent links)",
           loaded, config=OmegaConf.to_container(loaded["hyper_parameters"]),
           omegaconf=omegaconf.__version__)

    scripted_module().save(str(outdir / "scripted.jit"))
    jit = torch.jit.load(str(outdir / "scripted.jit"))
    archive = zipfile.ZipFile(outdir / "scripted.jit")
    constants = archive.read("scripted/constants.pkl")
    debug = b"".join(archive.read(n) for n in archive.namelist() if n.endswith(".debug_pkl"))
    assert str(HERE).encode() not in debug and b"site-packages" not in debug, "a machine's path in the archive"
    # The tensor constants of every module's code (``CONSTANTS.c<i>`` is numbered per module, so the order
    # of constants.pkl is not visible through torch's API): listed as a multiset, sorted by digest.
    code_constants = [tensor_record(t) for _, sub in jit.named_modules()
                      for t in sub.code_with_constants[1].const_mapping.values()]
    assert len(code_constants) == 2, code_constants
    record("scripted.jit", "torch.jit.script of a module (parameters, buffers), frozen with its submodule kept "
           "(two buffers folded into tensor constants), saved with torch.jit.save", {**jit.state_dict()},
           state_dict=list(jit.state_dict()), constants_pkl_bytes=len(constants),
           # Tensor attributes that are neither parameters nor buffers: ckpt lists them as ``attributes.<path>``.
           attributes={"inner._state": tensor_record(jit.inner._state)},  # noqa: SLF001
           constants=sorted(code_constants, key=lambda r: (r["sha256"], r["dtype"], r["shape"])))

    buf = io.BytesIO()
    plain = OrderedDict([("w", exact((3, 4), 1)), ("b", exact((4,), 2, torch.float64)), ("step", 12)])
    torch.save(plain, buf)
    (outdir / "deflate.pt").write_bytes(deflated(buf.getvalue()))
    methods = {i.compress_type for i in zipfile.ZipFile(outdir / "deflate.pt").infolist()}
    assert methods == {zipfile.ZIP_DEFLATED}, methods
    record("deflate.pt", "torch.save output re-zipped with every record DEFLATE-compressed",
           torch.load(str(outdir / "deflate.pt"), weights_only=True))

    torch.save(objects_checkpoint(), str(outdir / "objects.ckpt"))
    record("objects.ckpt", "checkpoint whose hyper-parameters (an AttributeDict) hold a metric object with tensor "
           "state and a transform module with buffers",
           torch.load(str(outdir / "objects.ckpt"), weights_only=False))

    files = sorted(p for p in outdir.iterdir() if p.is_file() and p.name not in ("STAMP.json", "README.md"))
    stamp = {
        "generator": GENERATOR,
        "generator_sha256": sha256((HERE / GENERATOR).read_bytes()),
        "classes_sha256": sha256((HERE / "real_classes.py").read_bytes()),
        "scripted_sha256": sha256((HERE / "real_scripted.py").read_bytes()),
        "command": COMMAND,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "omegaconf": omegaconf.__version__,
        "files": {p.name: sha256(p.read_bytes()) for p in files},
    }
    write_json(outdir / "STAMP.json", stamp)
    print(f"wrote {len(manifests)} fixtures to {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
