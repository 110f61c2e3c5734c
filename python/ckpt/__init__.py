"""ckpt: read, write, inspect and convert PyTorch training checkpoints — without torch.

Every format ckpt reads — ``torch.save`` files, ``torch.distributed.checkpoint`` (DCP) directories, hfai
``PART_*.pt`` shards, PyTorch-BigGraph HDF5 checkpoints, RecIS checkpoints, safetensors files and Hugging Face
shard directories — through one API, with a Rust core: no pickle code is ever run, tensors are numpy arrays
over the file's memory map (no copy), and torch is needed only for torch tensors.

>>> import ckpt
>>> ck = ckpt.open("model.pt")                       # any format, detected
>>> [e.name for e in ck.entries][:2]                 # names, dtypes, shapes before any data is read
['layer.weight', 'layer.bias']
>>> w = ck["layer.weight"]                           # a read-only numpy array over the map
>>> sd = ckpt.load("dcp_checkpoint/")                # the nested state dict, like torch.load
>>> with ckpt.safe_open("model.safetensors", framework="pt") as f:   # safetensors' API, any format
...     t = f.get_tensor("layer.weight")
>>> ckpt.convert("dcp_checkpoint/", "hf_model/", to="hf", max_shard_size="2GB")
>>> ckpt.verify("dcp_checkpoint/", deep=True).ok
True

Every path may also be an object-storage URL (``s3://``, ``gs://``, ``az://``, ``http(s)://`` for reads), as
the ``ckpt`` command takes them, configured by each cloud's environment variables and ``storage_options``:

>>> sd = ckpt.load("s3://bucket/runs/step-100", storage_options={"aws_region": "us-east-1"})

The ``ckpt`` command-line tool is installed with the package (``ckpt --help``).
"""

from __future__ import annotations

import builtins
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import (Any, Dict, Iterator, List, Literal, NamedTuple, Optional, Sequence, Tuple, Union)

from . import _ckpt, _dtypes, _errors, _torch, _values
from ._dtypes import dtype_arg, dtype_name
from ._errors import (BadInputError, EntryNotFoundError, Error, IoError, LimitError, MalformedError, NotFoundError,
                      UnsupportedError, UsageError)
from ._values import CompositeTensor, Device, Global, Object, OpaqueTensor, Storage, TorchDType, Unknown

# The extension calls these helpers; it imports no module of this package (each would import it back).
_ckpt._hand_over(_values, _errors.make, _dtypes.numpy_dtypes)

__version__: str = _ckpt.__version__

__all__ = [
    "open", "load", "safe_open", "save", "convert", "verify", "reshard", "diff", "detect", "formats", "dtype_name",
    "Checkpoint", "Entry", "SafeOpen", "Slice", "ConvertSummary", "VerifyReport", "ReshardSummary", "DiffReport",
    "TensorDiff", "Error", "BadInputError", "MalformedError", "UnsupportedError", "LimitError", "IoError",
    "NotFoundError", "UsageError", "EntryNotFoundError", "TorchDType", "Device", "Global", "Object",
    "ValueDiff", "Difference", "OpaqueTensor", "CompositeTensor", "Storage", "Unknown", "dcp",
]

PathLike = Union[str, "os.PathLike[str]"]
#: Object storage options, as the ``ckpt`` command's ``--storage-option KEY=VALUE``: the store's configuration
#: keys (``aws_endpoint``, ``aws_region``, ``aws_allow_http``, ...) and ckpt's own (``max_retries``,
#: ``retry_timeout``, ``concurrency``, ``part_size``). Values are never shown in errors.
StorageOptions = Optional[Dict[str, Union[str, int, float, bool]]]
Framework = Literal["np", "numpy", "pt", "torch"]

#: The read limits every reading call takes as keyword arguments, as the ``ckpt`` command's flags
#: (``--max-depth`` is ``max_depth``); the README's "Resource limits" gives their defaults.
LIMITS = ("max_depth", "max_memo", "max_container_len", "max_nodes", "max_alloc_bytes", "max_int_digits",
          "trusted", "max_header_bytes", "max_data_header_bytes", "max_metadata_bytes", "max_inflated_bytes")


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _is_url(p: str) -> bool:
    """Whether ``p`` is an object-storage URL (a scheme other than ``file://``), as ckpt tells them apart."""
    return _SCHEME.match(p) is not None and not p.lower().startswith("file://")


def _path(p: PathLike) -> str:
    """A path argument as the extension takes it: a URL as given (str only: ``os.PathLike`` objects are local
    paths), a local ``file:///path`` as its path."""
    if isinstance(p, str):
        for prefix in ("file://localhost/", "file:///"):
            if p.lower().startswith(prefix):
                return "/" + p[len(prefix):]
        return p
    return os.fspath(p)


def _storage(options: StorageOptions) -> Optional[Dict[str, str]]:
    """``storage_options`` as the extension takes them: str keys and str values (booleans ``"true"`` or
    ``"false"``, numbers as written)."""
    if options is None:
        return None
    if not isinstance(options, dict):
        try:
            options = dict(options)
        except (TypeError, ValueError):
            raise TypeError("storage_options must be a dict of str to str") from None
    out: Dict[str, str] = {}
    for k, v in options.items():
        if not isinstance(k, str):
            raise TypeError(f"storage_options: key {k!r} is not a str")
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, (str, int, float)):
            out[k] = str(v)
        else:  # never the value itself: it may be a secret
            raise TypeError(f"storage_options[{k!r}]: a {type(v).__name__}, expected a str")
    return out


def _unknown(command: str, given: Dict[str, Any], also: Sequence[str] = ()) -> None:
    """Raises ``TypeError`` for a keyword argument ``command`` does not take (the facade's table of options,
    :data:`OPTIONS`), with the names near it, or what ckpt does instead of ``torch.load``'s
    ``map_location``/``weights_only``."""
    taken = set(_ckpt.option_names(command)) | set(also)
    for name in given:
        if name not in taken:
            raise TypeError(_ckpt.unknown_option(command, name))


def _limits(limits: Dict[str, Any], command: str = "read") -> Optional[Dict[str, Any]]:
    """The read limits among the keyword arguments, checked by name (:func:`_unknown`); the extension reads
    their values with the facade's parser, as the ``ckpt`` command reads its flags."""
    _unknown(command, limits)
    return limits or None


#: Keyword arguments renamed to the ``ckpt`` command's names (issue 40), still taken with a
#: ``DeprecationWarning``: old name -> new name.
_RENAMED = {"recis_parallel": "parallel", "recis_slice_size": "slice_size"}


def _renamed(options: Dict[str, Any]) -> Dict[str, Any]:
    """``options`` with the old names of :data:`_RENAMED` under their new ones, each with a warning; both
    names at once is a ``TypeError``."""
    out = dict(options)
    for old, new in _RENAMED.items():
        if old in out:
            if new in out:
                raise TypeError(f"{old} and {new} are one option: pass {new} alone")
            warnings.warn(f"{old}= is now {new}=, as the ckpt command's --{new.replace('_', '-')}",
                          DeprecationWarning, stacklevel=4)
            out[new] = out.pop(old)
    return out


def _named(command: str, options: Dict[str, Any]) -> List[Tuple[str, str]]:
    """The keyword arguments of ``command`` as ``(name, text)`` pairs, as the ``ckpt`` command passes its flags'
    values to the facade's one parser of options: ``None`` left out (the default), a list of ``include``,
    ``exclude`` or ``rename`` values one pair each (``rename``: ``"FROM=TO"`` strings, ``(from, to)`` pairs or a
    dict), ``dtype`` by name (numpy and torch dtypes too), booleans as ``true``/``false``."""
    options = _renamed(options)
    _unknown(command, options)
    out: List[Tuple[str, str]] = []
    for name, value in options.items():
        if value is None:
            continue
        if name == "dtype":
            value = dtype_arg(value)
        if name == "rename" and isinstance(value, dict):
            value = list(value.items())
        many = name in ("include", "exclude", "rename") and not isinstance(value, str)
        for v in (list(value) if many else [value]):
            if name == "rename" and isinstance(v, tuple) and len(v) == 2:
                v = f"{v[0]}={v[1]}"
            if isinstance(v, bool):
                out.append((name, "true" if v else "false"))
            elif isinstance(v, (str, int)) or isinstance(v, os.PathLike):
                out.append((name, os.fspath(v) if isinstance(v, os.PathLike) else str(v)))
            else:
                raise TypeError(f"{name}={v!r}: expected a str, an int or a bool")
    return out


def _framework(framework: str) -> str:
    if framework in ("np", "numpy"):
        return "np"
    if framework in ("pt", "torch"):
        return "pt"
    raise UsageError(f'framework {framework!r}: use "np" (numpy arrays) or "pt" (torch tensors)')


class Entry(NamedTuple):
    """One entry of a checkpoint, known before any data is read."""

    #: flattened name, as DCP names it (``model.layers.0.weight``)
    name: str
    #: ``"tensor"``, ``"composite"`` (a quantized, sparse or nested tensor: ``value(name)`` gives its
    #: components, or the torch tensor with ``framework="pt"``), ``"opaque"`` (a tensor whose data cannot be
    #: read: meta, ...) or ``"value"``
    kind: str
    #: the torch dtype name of a tensor (``"float32"``, ``"bfloat16"``), else ``None``
    dtype: Optional[str]
    #: the shape of a tensor, else ``None``
    shape: Optional[Tuple[int, ...]]
    #: the bytes of a tensor's elements, else ``None``
    nbytes: Optional[int]


class Checkpoint:
    """An open checkpoint of any format (:func:`open`): entries before any data, then tensors and values read
    lazily, by name.

    >>> ck = ckpt.open("conformance/fixtures/distcp/golden/d215")
    >>> ck.format
    'distcp'
    >>> ck["row"].shape, ck["row"].flags.writeable     # a read-only array over the file's map
    ((5, 4), False)
    >>> ck.value("row")                                  # the same, through the general reader

    A checkpoint is also a context manager; closing it drops ckpt's reader (arrays already returned keep the
    memory they need).
    """

    def __init__(self, native: Any, framework: str = "np", opened_as: Any = None) -> None:
        self._native = native
        self._framework = _framework(framework)
        self._opened_as = opened_as
        self._entries: Optional[List[Entry]] = None
        self._by_name: Optional[Dict[str, Entry]] = None
        self._converter: Any = None

    # --- what it is --------------------------------------------------------------------------------------
    @property
    def format(self) -> str:
        """The format's name: ``torch``, ``safetensors``, ``hf``, ``distcp``, ``hfai``, ``pbg``, ``recis``,
        ``deepspeed``, ``megatron`` or ``pickle``."""
        return self._n().format

    @property
    def fetched(self) -> Optional[Tuple[int, int, int]]:
        """For a checkpoint opened from a URL: ``(objects, bytes, requests)`` fetched so far (with
        ``lazy=True``, every read's fills included: ask after reading); ``None`` for a local path."""
        return self._n().fetched

    @property
    def path(self) -> str:
        """The path it was opened from; for a URL, the URL without user information and query (where
        credentials travel)."""
        return os.fspath(self._n().path)

    @property
    def details(self) -> Dict[str, str]:
        """What the format says of itself (container, version, writer, ranks, ...), as ``ckpt inspect`` shows."""
        return dict(self._n().details())

    @property
    def entries(self) -> List[Entry]:
        """Every entry (:class:`Entry`: name, kind, dtype, shape, nbytes), in the format's order, without
        reading data."""
        native = self._n()
        if self._entries is None:
            self._entries = [Entry(*e) for e in native.entries()]
            self._by_name = {e.name: e for e in self._entries}
        return self._entries

    def keys(self) -> List[str]:
        """Every entry's name."""
        return [e.name for e in self.entries]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        self.entries
        return name in (self._by_name or {})

    def entry(self, name: str) -> Entry:
        """The entry ``name`` (:class:`EntryNotFoundError` if there is none)."""
        self.entries
        e = (self._by_name or {}).get(name)
        if e is None:
            under = self._under(name)
            if under:
                n = f"{len(under)} entr{'y is' if len(under) == 1 else 'ies are'}"
                hint = f" ({n} under it: ck[{name!r}] gives them)"
            else:
                # The entries' names and the prefixes they are under, as `ckpt cat` suggests them.
                names = dict.fromkeys(p for n in self.keys() for p in _prefixes(n))
                near = _ckpt.did_you_mean(name, list(names), 3)
                hint = f"; did you mean: {', '.join(near)}?" if near else ""
            raise EntryNotFoundError(f"{self.path}: no entry {name!r}{hint}", fault="usage", path=self.path)
        return e

    def _under(self, prefix: str) -> List[str]:
        """The names of the entries under ``prefix`` (``state_dict.*``), in the checkpoint's order."""
        return [n for n in self.keys() if n.startswith(prefix + ".")] if prefix not in self else []

    # --- reading -----------------------------------------------------------------------------------------
    def _torch(self, framework: str) -> Any:
        if framework != "pt":
            return None
        if self._converter is None:
            self._converter = _torch.Converter(os.fspath(self._n().local_path), self.format, self._opened_as)
        return self._converter

    def __getitem__(self, name: str) -> Any:
        """The entry ``name``: a tensor (a numpy array, or a torch tensor with ``framework="pt"``) or any other
        value, read now. A prefix of entries (``ck["state_dict"]`` of ``state_dict.model.w``, ...) gives a dict of
        every entry under it, by the rest of its name (``{"model.w": ...}``), as ``ckpt cat`` prints them all; a
        name that is neither raises :class:`EntryNotFoundError` with the names near it."""
        under = self._under(name)
        if under:
            return {n[len(name) + 1:]: self[n] for n in under}
        if self.entry(name).kind == "tensor":
            return self.tensor(name)
        return self.value(name)

    def tensor(self, name: str, framework: Optional[Framework] = None) -> Any:
        """The tensor entry ``name``, read lazily: a read-only numpy array, over the file's map where the layout
        allows, else over fresh memory (``np.array(a)`` gives a writable copy); with ``framework="pt"`` a torch tensor
        (copy-on-write over the file for ``.pt`` and ``.safetensors``, a copy otherwise)."""
        fw = _framework(framework) if framework else self._framework
        self.entry(name)
        return self._n().tensor(name, fw, self._torch(fw))

    def value(self, name: str, framework: Optional[Framework] = None) -> Any:
        """The entry ``name``, tensor or not, as a Python object (see :mod:`ckpt._values` for what torch-only
        values become without torch)."""
        fw = _framework(framework) if framework else self._framework
        self.entry(name)
        return self._n().value(name, fw, self._torch(fw))

    def region(self, name: str, offsets: Sequence[int], sizes: Sequence[int],
               framework: Optional[Framework] = None) -> Any:
        """The box ``offsets .. offsets + sizes`` of tensor ``name``: for a DCP checkpoint read only from the items
        that overlap it (a view of one item when one holds it all), as a job with another world size loads its
        shard."""
        fw = _framework(framework) if framework else self._framework
        self.entry(name)
        return self._n().region(name, list(offsets), list(sizes), fw, self._torch(fw))

    def load(self, include: Union[str, Sequence[str]] = (), exclude: Union[str, Sequence[str]] = (),
             framework: Optional[Framework] = None) -> Any:
        """The nested state dict (see :func:`load`; ``include``/``exclude`` a glob or a list of globs)."""
        fw = _framework(framework) if framework else self._framework
        return _state_dict(os.fspath(self._n().local_path), fw, include, exclude, self._torch(fw))

    # --- lifetime ----------------------------------------------------------------------------------------
    def _n(self) -> Any:
        if self._native is None:
            raise UsageError("the checkpoint is closed", fault="usage")
        return self._native

    def close(self) -> None:
        """Drops ckpt's reader (and the maps no array returned holds)."""
        self._native = None

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._native is None:
            return "<ckpt.Checkpoint (closed)>"
        return f"<ckpt.Checkpoint {self.format} {self.path!r}, {len(self.entries)} entries>"


def _prefixes(name: str) -> List[str]:
    """``name`` and the dotted prefixes it is under: ``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def open(path: PathLike, *, format: Optional[str] = None, framework: Framework = "np",
         storage_options: StorageOptions = None, lazy: bool = False, **limits: Any) -> Checkpoint:
    """Opens the checkpoint at ``path`` (a file or directory; ``file://`` URLs too) of any format ckpt reads,
    detecting the format unless ``format`` names it. Reads metadata only; tensors are read when asked for.

    ``path`` may be an object-storage URL (``s3://bucket/runs/step-100``, ``gs://``, ``az://``,
    ``https://``): its objects are fetched into a temporary directory first (as ``ckpt cat`` does), which the
    checkpoint keeps until it is closed and collected. ``storage_options``: the store's configuration
    (:data:`StorageOptions`, the ``ckpt`` command's ``--storage-option``), over each cloud's environment
    variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...). ``lazy=True`` fetches only what listing
    needs first and each tensor's bytes as it is read (a DCP checkpoint's byte ranges, a safetensors tensor's
    bytes, a ``torch.save`` record; ``Checkpoint.fetched`` tells how much moved), instead of every object.

    ``framework``: what tensors come back as, numpy arrays (``"np"``) or torch tensors (``"pt"``).
    ``limits``: the read limits (:data:`LIMITS`), e.g. ``max_nodes=10**8`` or ``trusted=True`` for large input
    you trust; and how the source is read, as the ``ckpt`` command's flags of the same names: ``tag`` (a
    DeepSpeed root's save), ``unstack_layers`` and ``name_map`` (Megatron). One that does not apply to the
    checkpoint raises :class:`UsageError` saying why; an unknown name ``TypeError`` with the names near it
    (``map_location`` and ``weights_only`` say what ckpt does instead).

    >>> ck = ckpt.open("checkpoint.pt")
    >>> ck.entries[0]
    Entry(name='model.fc.weight', kind='tensor', dtype='float32', shape=(10, 4), nbytes=160)
    """
    p = _path(path)
    fw = _framework(framework)
    if _is_url(p):
        native = _ckpt.open(p, format, _limits(limits), _storage(storage_options), lazy)
        if lazy:
            # A partial copy, filled as it is read: torch tensors are made from what was read, never by
            # mapping the copy.
            return Checkpoint(native, fw, None)
        # The fetched copy is private to this checkpoint: torch tensors may map it.
        return Checkpoint(native, fw, _torch.identity(os.fspath(native.local_path)))
    before = _torch.identity(p)
    native = _ckpt.open(p, format, _limits(limits), _storage(storage_options))
    opened_as = before if before is not None and _torch.identity(p) == before else None
    return Checkpoint(native, fw, opened_as)


def load(path: PathLike, *, framework: Framework = "np", include: Union[str, Sequence[str]] = (),
         exclude: Union[str, Sequence[str]] = (), storage_options: StorageOptions = None, **limits: Any) -> Any:
    """The checkpoint at ``path``, any format, as the nested state dict ``torch.load(path, weights_only=True)``
    gives for a ``.pt`` file: dicts (``OrderedDict`` kept), lists, tuples and Python values as they were, tensors
    as numpy arrays over the file's map (``framework="np"``, no torch needed) or torch tensors
    (``framework="pt"``). A DCP, hfai, PyTorch-BigGraph, RecIS or safetensors checkpoint comes back as the state
    dict a conversion to ``.pt`` would write.

    ``include``/``exclude``: globs on the flattened entry names (``"model.*"``, ``"*.num_batches_tracked"``);
    only what they keep is read.

    ``path`` may be an object-storage URL, fetched whole first (as ``ckpt convert`` reads it), with
    ``storage_options`` (see :func:`open`); torch tensors of it are then copies.

    >>> sd = ckpt.load("last.ckpt", include="state_dict.*", exclude="*.num_batches_tracked")
    >>> sd["state_dict"]["model.fc.weight"].dtype
    dtype('float32')
    """
    p = _path(path)
    fw = _framework(framework)
    converter = None
    if fw == "pt":
        if _is_url(p):  # fetched into a temporary directory that is gone when load returns: copies
            converter = _torch.Converter(p, "", None)
        else:
            converter = _torch.Converter(p, _ckpt.detect(p), _torch.identity(p))
    return _state_dict(p, fw, include, exclude, converter, _limits(limits), _storage(storage_options))


def _state_dict(path: str, fw: str, include: Union[str, Sequence[str]], exclude: Union[str, Sequence[str]],
                converter: Any, limits: Optional[Dict[str, Any]] = None,
                storage: Optional[Dict[str, str]] = None) -> Any:
    """The one implementation of :func:`load` and :meth:`Checkpoint.load`: a glob or a list of globs each."""
    inc = [include] if isinstance(include, str) else list(include)
    exc = [exclude] if isinstance(exclude, str) else list(exclude)
    return _ckpt.load(path, fw, inc, exc, converter, limits, storage)


# --- safetensors' API over every format -------------------------------------------------------------------

_ST_DTYPES = {"bool": "BOOL", "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "int8": "I8",
              "int16": "I16", "int32": "I32", "int64": "I64", "float16": "F16", "bfloat16": "BF16",
              "float32": "F32", "float64": "F64", "complex64": "C64", "float8_e4m3fn": "F8_E4M3",
              "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0", "float8_e4m3fnuz": "F8_E4M3FNUZ",
              "float8_e5m2fnuz": "F8_E5M2FNUZ", "float4_e2m1fn_x2": "F4", "float6_e2m3fn_x4": "F6_E2M3",
              "float6_e3m2fn_x4": "F6_E3M2"}

#: values per element of the packed dtypes, whose last dimension safetensors counts in values
_PACKED = {"float4_e2m1fn_x2": 2, "float6_e2m3fn_x4": 4, "float6_e3m2fn_x4": 4}


class Slice:
    """A tensor read only in part (:meth:`SafeOpen.get_slice`): ``get_shape()``, ``get_dtype()`` and indexing
    with ints and slices, as safetensors' ``PySafeSlice``."""

    def __init__(self, owner: "SafeOpen", name: str) -> None:
        self._owner, self._name = owner, name
        self._entry = owner._ck.entry(name)

    def get_shape(self) -> List[int]:
        """The tensor's shape as safetensors gives it: a packed dtype's last dimension counts values (a
        ``float4_e2m1fn_x2`` tensor ``[8, 32]`` is ``F4 [8, 64]``). Indexing counts packed elements."""
        shape = list(self._entry.shape or ())
        n = _PACKED.get(self._entry.dtype or "", 1)
        if n > 1 and shape:
            shape[-1] *= n
        return shape

    def get_dtype(self) -> str:
        """The dtype as safetensors names it (``"F32"``, ``"BF16"``; torch's name where safetensors has none)."""
        d = self._entry.dtype or ""
        return _ST_DTYPES.get(d, d)

    def __getitem__(self, index: Any) -> Any:
        shape = list(self._entry.shape or ())
        idx = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis for i in idx):
            k = idx.index(Ellipsis)
            idx = idx[:k] + (slice(None),) * (len(shape) - len(idx) + 1) + idx[k + 1:]
        if len(idx) > len(shape):
            raise UsageError(f"{len(idx)} indices for a tensor of {len(shape)} dimensions", fault="usage")
        # The box the index covers (read alone: for DCP, only the items it overlaps), then the index within it.
        offsets, sizes, inner = [], [], []
        for d, n in enumerate(shape):
            i = idx[d] if d < len(idx) else slice(None)
            if isinstance(i, slice):
                start, stop, step = i.indices(n)
                if step == 1:
                    offsets.append(start)
                    sizes.append(max(0, stop - start))
                    inner.append(slice(None))
                else:
                    offsets.append(0)
                    sizes.append(n)
                    inner.append(i)
            else:
                j = int(i)
                if j < -n or j >= n:
                    raise IndexError(f"index {j} is out of bounds for dimension {d} with size {n}")
                j %= n
                offsets.append(j)
                sizes.append(1)
                inner.append(0)
        box = self._owner._ck.region(self._name, offsets, sizes, "np")
        out = box[tuple(inner)]
        return self._owner._out(out, self._entry.dtype)


class SafeOpen:
    """:func:`safe_open`'s object: safetensors' ``safe_open`` API over a checkpoint of any format."""

    def __init__(self, path: PathLike, framework: Framework, device: str, storage_options: StorageOptions = None,
                 **limits: Any) -> None:
        if device not in ("cpu", None):
            raise UsageError(f"device {device!r}: ckpt reads to the CPU; move tensors with .to()", fault="usage")
        self._framework = _framework(framework)
        self._ck = open(path, framework=self._framework, storage_options=storage_options, **limits)
        self._keys: Optional[List[str]] = None

    def _out(self, array: Any, dtype: Optional[str]) -> Any:
        if self._framework == "np":
            return array
        import torch  # noqa: PLC0415

        return torch.from_numpy(_bytes_of(array)).view(getattr(torch, dtype or "uint8")).reshape(array.shape)

    def keys(self) -> List[str]:
        """The names of the tensors, sorted (as safetensors lists them)."""
        if self._keys is None:
            self._keys = sorted(e.name for e in self._ck.entries if e.kind == "tensor")
        return self._keys

    def offset_keys(self) -> List[str]:
        """The names of the tensors in the file's order."""
        return [e.name for e in self._ck.entries if e.kind == "tensor"]

    def get_tensor(self, name: str) -> Any:
        """The tensor ``name``: a numpy array over the file's map (read-only), or a torch tensor
        (copy-on-write over ``.pt`` and ``.safetensors`` files)."""
        return self._ck.tensor(name)

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, by name."""
        return {k: self.get_tensor(k) for k in self.keys()}

    def get_slice(self, name: str) -> Slice:
        """A :class:`Slice` of tensor ``name``, whose ``[...]`` reads only the part asked for."""
        return Slice(self, name)

    def metadata(self) -> Optional[Dict[str, str]]:
        """A safetensors file's ``__metadata__`` (the first shard's for a Hugging Face directory); ``None`` when
        it has none, and for other formats."""
        return _safetensors_metadata(self._ck)

    def __enter__(self) -> "SafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ck.close()


def _bytes_of(array: Any) -> Any:
    import numpy as np  # noqa: PLC0415

    a = array if array.flags.writeable and array.flags.c_contiguous else np.array(array, copy=True, order="C")
    return a.reshape(-1).view(np.uint8)


def _safetensors_metadata(ck: Checkpoint) -> Optional[Dict[str, str]]:
    import json  # noqa: PLC0415
    import struct  # noqa: PLC0415

    path = os.fspath(ck._n().local_path)
    if ck.format == "hf":
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            return None
        path = os.path.join(path, files[0])
    elif ck.format != "safetensors":
        return None
    with builtins.open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    meta = header.get("__metadata__")
    return dict(meta) if meta is not None else None


def safe_open(filename: PathLike, framework: Framework = "np", device: str = "cpu", *,
              storage_options: StorageOptions = None, **limits: Any) -> SafeOpen:
    """safetensors' ``safe_open``, drop-in, over every format ckpt reads: ``keys()``, ``get_tensor(name)``,
    ``get_slice(name)[...]``, ``metadata()``.

    >>> with ckpt.safe_open("model.safetensors", framework="pt") as f:
    ...     emb = f.get_slice("embed.weight")[:1000]     # reads the first 1000 rows only
    >>> with ckpt.safe_open("dcp_checkpoint/", framework="np") as f:   # any format
    ...     w = f.get_tensor("model.layers.0.weight")

    Differences: numpy arrays are read-only views of the file (safetensors copies them); a missing name raises
    :class:`EntryNotFoundError` (a ``KeyError``; safetensors raises its ``SafetensorError``).

    ``filename`` may be an object-storage URL, fetched whole first, with ``storage_options`` (see :func:`open`).
    """
    return SafeOpen(filename, framework, device, storage_options, **limits)


# --- whole checkpoints ------------------------------------------------------------------------------------

@dataclass
class ConvertSummary:
    """What :func:`convert` or :func:`save` wrote."""

    tensors: int
    bytes: int
    values: int
    #: every entry of the source the target format cannot hold, by name (a DeepSpeed checkpoint's optimizer
    #: state to torch is kept; safetensors keeps values in its metadata; what is left here was lost)
    dropped: List[str] = field(default_factory=list)


@dataclass
class VerifyReport:
    """What :func:`verify` found; ``ok`` when there is no problem."""

    format: str
    checked: int
    bytes: int
    problems: List[str]
    warnings: List[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class ReshardSummary:
    """What :func:`reshard` wrote."""

    format: str
    world_size: int
    tensors: int
    bytes: int


@dataclass
class TensorDiff:
    """How one tensor on both sides compares (``max_abs``, ``max_rel``, ``mismatched`` of ``numel``);
    ``first_index`` is the first element outside the tolerance (an index into the shape, ``None`` when there is
    none or the shapes differ), ``first_values`` both sides' values there. ``str()`` says it as ``ckpt diff``
    does."""

    name: str
    dtype: Tuple[str, str]
    shape: Tuple[List[int], List[int]]
    max_abs: float
    max_rel: float
    mismatched: int
    numel: int
    bytewise: bool
    equal: bool
    first_index: Optional[List[int]] = None
    first_values: Optional[Tuple[float, float]] = None
    shown: str = field(default="", repr=False)

    def __str__(self) -> str:
        return f"{'equal' if self.equal else 'differs'}: {self.name}: {self.shown}"


@dataclass
class ValueDiff:
    """A non-tensor value on both sides that differs: ``a`` and ``b`` are the values (as :func:`load` gives
    them); ``str()`` shows both as ``ckpt diff`` does (``lr: 0.001 vs 0.01``)."""

    name: str
    a: Any
    b: Any
    shown: str = field(default="", repr=False)

    def __str__(self) -> str:
        return f"value differs: {self.name}: {self.shown}"


@dataclass
class Difference:
    """One difference of a :class:`DiffReport`, whatever its kind: ``"only_a"``/``"only_b"`` (an entry on one
    side only), ``"kind"`` (a tensor on one side, a value on the other: ``a`` and ``b`` name the kinds),
    ``"dtype"``, ``"shape"`` (``a`` and ``b`` the dtypes, the shapes), ``"tensor"`` (values outside the
    tolerance: ``a`` and ``b`` the values at ``first_index``), ``"value"`` (``a`` and ``b`` the values),
    ``"unreadable"`` (``a`` the error)."""

    name: str
    kind: str
    a: Any = None
    b: Any = None
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    first_index: Optional[List[int]] = None


@dataclass
class DiffReport:
    """What :func:`diff` found; ``equal`` when both hold the same entries with values equal within the
    tolerance. ``str(report)`` is what ``ckpt diff`` prints (each difference with both sides, then the
    verdict); ``differences`` lists them one by one, structured."""

    equal: bool
    only_a: List[str]
    only_b: List[str]
    kind_changes: List[Tuple[str, str, str]]
    tensors: List[TensorDiff]
    values_differ: List[ValueDiff]
    values_equal: int
    unreadable: List[Tuple[str, str]]
    aligned_by_id: List[str]
    #: Each side's layout: ``{"format", "keys", "nested_under"}``. ``keys`` are the format's bookkeeping (hfai's
    #: ``__nshards__``, ``__version__``), listed apart and never compared; ``nested_under`` the prefix (``model.``)
    #: under which the format nests the whole state. Empty with ``raw=True``.
    layout_a: Dict[str, Any]
    layout_b: Dict[str, Any]
    #: The report as ``ckpt diff`` prints it (``str(report)``).
    text: str = field(default="", repr=False)

    def __bool__(self) -> bool:
        return self.equal

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        n = len(self.differences)
        return f"<DiffReport {'equal' if self.equal else f'{n} difference' + ('' if n == 1 else 's')}>"

    @property
    def differences(self) -> List[Difference]:
        """Every difference, structured (:class:`Difference`), in the order ``str()`` lists them."""
        out = [Difference(n, "only_a") for n in self.only_a] + [Difference(n, "only_b") for n in self.only_b]
        out += [Difference(n, "kind", ka, kb) for n, ka, kb in self.kind_changes]
        for t in self.tensors:
            if t.equal:
                continue
            if t.shape[0] != t.shape[1]:
                out.append(Difference(t.name, "shape", list(t.shape[0]), list(t.shape[1])))
            elif t.dtype[0] != t.dtype[1]:
                out.append(Difference(t.name, "dtype", t.dtype[0], t.dtype[1], t.max_abs, t.max_rel, t.first_index))
            else:
                a, b = t.first_values if t.first_values is not None else (None, None)
                out.append(Difference(t.name, "tensor", a, b, t.max_abs, t.max_rel, t.first_index))
        out += [Difference(v.name, "value", v.a, v.b) for v in self.values_differ]
        out += [Difference(n, "unreadable", e) for n, e in self.unreadable]
        return out


def save(state_dict: Any, path: PathLike, format: str = "torch", *, progress: Optional[bool] = None,
         storage_options: StorageOptions = None, **options: Any) -> ConvertSummary:
    """Writes ``state_dict`` — nested dicts, lists and tuples of numpy arrays, torch tensors (any device: copied
    to the CPU) and Python values — as a checkpoint of ``format`` at ``path``, durably (temporary file, fsync,
    rename): ``torch`` (loadable by ``torch.load(weights_only=True)``), ``safetensors``, ``hf``, ``distcp`` (by
    ``dcp.load``, as ``world_size`` ranks would write it), ``hfai``, ``recis``, ``pbg``. The options are
    :func:`convert`'s target and write options (``world_size`` for distcp, hfai and recis alone,
    ``dcp_profile``, ``hfai_large_size``, ``parallel``, ``slice_size``, ``pbg_config``, ``max_shard_size``,
    ``quant``, ``sync``, ``checksums``, ``overwrite``), and ``path`` may be an object-storage URL (see
    :func:`convert`). ``path`` must be new, an empty directory, or a checkpoint of ``format`` (replaced whole);
    anything else there raises :class:`UsageError` unless ``overwrite=True``, which replaces it whole.

    >>> ckpt.save({"model": {"w": np.ones((2, 2), np.float32)}, "step": 3}, "out_dcp", format="distcp")
    ConvertSummary(tensors=1, bytes=16, values=1, dropped=[])
    """
    s = _ckpt.save(state_dict, _path(path), format, _named("save", options), progress, _storage(storage_options))
    return ConvertSummary(*s)


def convert(src: PathLike, dst: PathLike, to: str, *, from_: Optional[str] = None, progress: Optional[bool] = None,
            storage_options: StorageOptions = None, **options: Any) -> ConvertSummary:
    """Converts the checkpoint at ``src`` (format detected, or ``from_``) into format ``to`` at ``dst``, as
    ``ckpt convert`` does, with its options: ``world_size`` (ranks, parts or shards of distcp, hfai and recis
    targets), ``dcp_profile`` (``"max-compat"``, ``"torch213"``), ``hfai_large_size``, ``parallel`` and
    ``slice_size`` (recis), ``pbg_config``, ``max_shard_size`` (hf: bytes or ``"5GB"``), ``quant`` (gguf:
    ``"f32"``, ``"f16"``, ``"bf16"``, ``"q8_0"``, ``"q4_0"``, ``"q4_1"``, ``"q5_0"``, ``"q5_1"``, ``"mxfp4"``), and the selection:
    ``include``/``exclude`` globs, ``strip_prefix``/``add_prefix``, ``dtype`` (floats cast to ``"bf16"``,
    ``"f16"``, ``"f32"``, ``"f64"``; or a numpy or torch dtype: ``np.float16``, ``torch.bfloat16``), ``dense`` (quantized and sparse tensors made dense, as ``--dense``:
    dequantized to float32 as torch's ``dequantize()``, ``to_dense()``), ``model_only`` (DeepSpeed and Megatron:
    the model's weights only, what ``transformers`` loads, as ``--model-only``; by default every entry
    :func:`inspect` lists is converted), ``rename`` (``"FROM=TO"`` rules, ``(from, to)`` pairs or a dict, as
    ``--rename``), and how the source is read: ``tag`` (a DeepSpeed root's save, as ``--tag``),
    ``unstack_layers`` and ``name_map`` (Megatron: ``name_map="llama"`` names a GPT model's tensors as Llama
    does). Every option is the ``ckpt convert`` flag of the same name (``--world-size`` is ``world_size``),
    read by the same parser; one that does not apply to the source or the target (``world_size`` for a
    ``torch`` target, ``tag`` for a DCP source, ``hfai_large_size`` for a distcp target) raises
    :class:`UsageError` saying why, and a name it does not take raises ``TypeError`` with the names near it.
    The read limits (:data:`LIMITS`) are options too. A selection that selects nothing (an ``include`` pattern that matches
    no entry, excludes that remove every entry) raises :class:`UsageError` naming the nearest names; what the
    target cannot hold is named in the summary's ``dropped``. A spinner shows on stderr when it is a terminal (``progress``).
    ``sync=False`` skips the fsyncs (the new checkpoint still replaces the old one atomically, but a power
    failure may lose it); ``checksums=False`` writes no checksums (``ckpt.checksums.json``, record CRC-32s,
    safetensors CRC32Cs), as ``ckpt convert --no-sync --no-checksums``.

    ``dst`` must be new, an empty directory, or a checkpoint of ``to``, which is replaced whole (crash-safe,
    never merged); anything else there (a file that is not a checkpoint, a directory of other files, a
    checkpoint of another format) raises :class:`UsageError` naming it, unless ``overwrite=True``, which
    replaces it whole, as ``ckpt convert --overwrite``.

    ``src`` and ``dst`` may be object-storage URLs, as ``ckpt convert`` takes them: a source is fetched whole
    into a temporary directory; a target is streamed to (each file straight to its object, the format's
    commit point last, the destination's lock refusing a concurrent save, a previous checkpoint's objects
    removed once the new one is committed). ``storage_options``: see :func:`open`.

        >>> ckpt.convert("s3://bucket/runs/step-100", "s3://bucket/hf/step-100", to="hf")

    A DCP checkpoint to Hugging Face shards, the model only, in bfloat16::

        >>> ckpt.convert("step-1000/", "hf_model/", to="hf", include="model.*", strip_prefix="model.",
        ...              dtype="bf16", max_shard_size="5GB")
        ConvertSummary(tensors=291, bytes=16060522496, values=0, dropped=[])
    """
    s = _ckpt.convert(_path(src), _path(dst), to, from_, _named("convert", options), progress,
                      _storage(storage_options))
    return ConvertSummary(*s)


def verify(path: PathLike, deep: bool = False, *, progress: Optional[bool] = None,
           storage_options: StorageOptions = None, **limits: Any) -> VerifyReport:
    """Checks the checkpoint at ``path`` as ``ckpt verify`` does: structure without reading tensor data, and with
    ``deep=True`` every byte and every checksum. Problems are listed in the report (``report.ok``); a checkpoint
    that cannot be read at all raises. At an object-storage URL (fetched whole first; ``storage_options``: see
    :func:`open`), what an unfinished save left there (its lock, objects without a commit point) is listed in
    ``warnings``, as ``ckpt verify`` lists it.

    >>> ckpt.verify("dcp_checkpoint/", deep=True).problems
    []
    """
    return VerifyReport(*_ckpt.verify(_path(path), deep, _limits(limits), progress, _storage(storage_options)))


def reshard(src: PathLike, dst: PathLike, world_size: int, *, progress: Optional[bool] = None,
            storage_options: StorageOptions = None, overwrite: bool = False, **limits: Any) -> ReshardSummary:
    """Rewrites a sharded checkpoint (distcp, hfai, recis) for ``world_size`` ranks, parts or shards, in a new
    directory ``dst``, as ``ckpt reshard`` does; ``src`` and ``dst`` may be object-storage URLs (see
    :func:`convert`). ``dst`` must be new, empty, or a checkpoint of the same format (replaced whole), unless
    ``overwrite=True``.

    >>> ckpt.reshard("dcp_8ranks/", "dcp_4ranks/", 4).world_size
    4
    """
    return ReshardSummary(*_ckpt.reshard(_path(src), _path(dst), world_size, _limits(limits, "reshard"), progress,
                                         _storage(storage_options), overwrite))


def diff(a: PathLike, b: PathLike, *, rtol: float = 1e-5, atol: float = 1e-8, progress: Optional[bool] = None,
         raw: bool = False, storage_options: StorageOptions = None, **limits: Any) -> DiffReport:
    """Compares two checkpoints of any formats entry by entry, as ``ckpt diff`` does: tensors within numpy's
    ``allclose`` tolerances (``|a - b| <= atol + rtol * |b|``), other values exactly. The state each format's
    layout carries is compared (a conversion diffs equal to its source); the formats' own bookkeeping is listed
    in ``layout_a`` and ``layout_b``. ``raw=True`` compares every entry as listed, layout keys included. Either
    side may be an object-storage URL, fetched whole first (``storage_options``: see :func:`open`).

    >>> ckpt.diff("model.pt", "model.safetensors").equal
    True
    """
    r = _ckpt.diff(_path(a), _path(b), rtol, atol, _limits(limits), progress, raw, _storage(storage_options))
    r["tensors"] = [TensorDiff(**t) for t in r["tensors"]]
    r["values_differ"] = [ValueDiff(**v) for v in r["values_differ"]]
    return DiffReport(**r)


def detect(path: PathLike, *, storage_options: StorageOptions = None) -> str:
    """The format of the checkpoint at ``path`` (``"torch"``, ``"distcp"``, ``"safetensors"``, ...), from its
    marker files and leading bytes, as :func:`open` detects it. At an object-storage URL only what listing
    needs is fetched (a DCP checkpoint's ``.metadata``, a ``.pt``'s records but its tensors', safetensors
    headers); ``storage_options``: see :func:`open`.

    >>> ckpt.detect("step-1000/")
    'distcp'
    """
    return _ckpt.detect(_path(path), _storage(storage_options))


def formats() -> List[Tuple[str, str, bool]]:
    """Every format: ``(name, what it is, whether it has shards to reshard)``."""
    return list(_ckpt.formats())


from . import dcp  # noqa: E402  (imports torch only when its classes are used)
