#!/usr/bin/env python3
"""How a fresh regeneration of fixtures is compared with the committed ones (shared by the
``check_reproducible.py`` scripts). The rules are explained in ``conformance/fixtures/REPRODUCIBILITY.md``.

In short: everything that does not come out of floating-point training math is compared exactly (file
names, sizes, every byte of layout, records and their order, offsets, alignment, pickles, storage sharing,
non-tensor values, manifests' structure). The values that do come out of training math are listed by each
generator in its ``STAMP.json`` under ``training_derived`` and are compared within ``rtol_for`` of the
largest magnitude of their tensor. The fields computed from those values (ZIP CRC-32s, the checksum half
of ``.data/serialization_id``, sha256 digests in manifests) may differ only where each side's field is
correct for its own data.

``training_derived`` maps a glob over file paths (relative to the fixture directory) to a rule::

    {"tensors": [...],       # torch.save archives: torchtree tensor paths ("state.0.exp_avg")
     "values": [...],        # torch.save archives and typed trees: paths of non-tensor floats ("loss")
     "datasets": [...],      # HDF5 files: float dataset paths ("embeddings", "model/*")
     "blob_tensors": [...],  # HDF5 files: tensor paths inside torch.save blobs (opaque datasets)
     "items": [...],         # DCP .distcp files: keys of the tensor items ("optim.state.0.exp_avg")
     "fields": [...],        # JSON lines: paths of float fields
     "counts": [...],        # JSON lines: paths of means of per-edge counts decided by trained scores
     "numbers": true}        # TSV exports: every "%.9f" field

Each list holds ``fnmatch`` globs, later ones winning; a glob starting with ``!`` excludes. Only floating-
point values are ever compared with the tolerance: an integer tensor under a glob is still compared exactly.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import pickletools
import re
import struct
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

#: relative tolerance of values computed in float32, against the largest magnitude of their tensor
RTOL_FLOAT32_MATH = 2.0**-14
#: how far a mean of per-edge counts decided by comparing trained scores may move: one count per edge
MAX_COUNT_CHANGE = 1.0
#: precision (significand bits) of the float dtypes that can hold training values
PRECISION = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}
NUMPY_DTYPE = {"float64": "<f8", "float32": "<f4", "float16": "<f2"}


def rtol_for(dtype: str) -> float:
    """Tolerance of a training-derived value stored as ``dtype``, relative to the largest magnitude of its
    tensor: 2**-14 for float32 math, or 4 units in the last place of a 16-bit float (its own rounding)."""
    return max(RTOL_FLOAT32_MATH, 4 * 2.0 ** (1 - PRECISION[dtype]))


# --------------------------------------------------------------------------------------------
# rules


def matches(globs: Iterable[str], path: str) -> bool:
    """Whether ``path`` is selected by ``globs`` (fnmatch, later globs win, ``!glob`` excludes)."""
    hit = False
    for g in globs:
        if g.startswith("!"):
            if fnmatch.fnmatchcase(path, g[1:]):
                hit = False
        elif fnmatch.fnmatchcase(path, g):
            hit = True
    return hit


@dataclass(frozen=True)
class Rule:
    """What in one file comes out of training math (see the module documentation)."""

    tensors: tuple[str, ...] = ()
    values: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    blob_tensors: tuple[str, ...] = ()
    items: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    counts: tuple[str, ...] = ()
    numbers: bool = False

    @staticmethod
    def from_json(d: dict[str, Any]) -> Rule:
        known = {"tensors", "values", "datasets", "blob_tensors", "items", "fields", "counts", "numbers"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown training_derived keys {sorted(unknown)}")
        return Rule(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})

    def blob_rule(self) -> Rule:
        return Rule(tensors=self.blob_tensors)


NOTHING = Rule()


class Rules:
    """The ``training_derived`` section of a STAMP.json: file glob -> rule."""

    def __init__(self, section: dict[str, Any] | None) -> None:
        self.by_glob = [(g, Rule.from_json(r)) for g, r in (section or {}).items()]

    def for_file(self, rel: str) -> Rule:
        found = [r for g, r in self.by_glob if fnmatch.fnmatchcase(rel, g)]
        if len(found) > 1:
            raise ValueError(f"{rel}: more than one training_derived rule applies")
        return found[0] if found else NOTHING

    def __bool__(self) -> bool:
        return bool(self.by_glob)


# --------------------------------------------------------------------------------------------
# values


def close(a: np.ndarray, b: np.ndarray, dtype: str) -> str | None:
    """None if ``b`` equals ``a`` within the tolerance of ``dtype``, else what differs.

    Non-finite values must match exactly (NaN with NaN, inf with inf of the same sign)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        return f"{a.size} values vs {b.size}"
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb) or not np.array_equal(a[~fa], b[~fb], equal_nan=True):
        return "non-finite values differ"
    if not fa.any():
        return None
    scale = float(max(np.abs(a[fa]).max(), np.abs(b[fb]).max()))
    tol = rtol_for(dtype) * scale
    d = np.abs(a[fa] - b[fb])
    worst = int(np.argmax(d))
    if d[worst] <= tol:
        return None
    i = int(np.flatnonzero(fa)[worst])
    return (
        f"element {i}: {float(a[i])!r} vs {float(b[i])!r}, |difference| {d[worst]:.3g} > {tol:.3g} "
        f"({rtol_for(dtype):.3g} x largest magnitude {scale:.3g})"
    )


def array_of(data: bytes, dtype: str) -> np.ndarray:
    """The little-endian values of ``dtype`` in ``data``, as float64."""
    if dtype == "bfloat16":
        u = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64)
    return np.frombuffer(data, dtype=NUMPY_DTYPE[dtype]).astype(np.float64)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------
# byte comparison with masked spans


@dataclass
class Derived:
    """A field computed from training-derived data: its span, and whether it is right for a file."""

    start: int
    end: int
    what: str
    correct: Callable[[bytes], bool]


@dataclass
class Masks:
    """Spans excluded from the exact byte comparison, each handled by its own check."""

    trained: list[tuple[int, int]] = field(default_factory=list)
    derived: list[Derived] = field(default_factory=list)

    def spans(self) -> list[tuple[int, int]]:
        return sorted(self.trained + [(d.start, d.end) for d in self.derived])


def first_difference(a: bytes, b: bytes, spans: list[tuple[int, int]]) -> int | None:
    """Offset of the first byte outside ``spans`` where ``a`` and ``b`` differ (lengths must be equal)."""
    pos = 0
    for s, e in [*spans, (len(a), len(a))]:
        if a[pos:s] != b[pos:s]:
            return pos + next(i for i, (x, y) in enumerate(zip(a[pos:s], b[pos:s])) if x != y)
        pos = max(pos, e)
    return None


def check_derived(name: str, a: bytes, b: bytes, masks: Masks, problems: list[str]) -> None:
    """Every field computed from training-derived data must be right for its own side's data (also where
    both sides agree: a stale field keeps the committed value)."""
    for d in masks.derived:
        for side, data in (("committed", a), ("fresh", b)):
            if not d.correct(data):
                problems.append(f"{name}: {d.what} at offset {d.start} is not right for the {side} file's data")


# --------------------------------------------------------------------------------------------
# torch.save archives (ZIP)


@dataclass
class ZipRecord:
    name: str
    header: int  # local header offset
    data: int  # data offset
    size: int  # stored size (torch never compresses)
    crc_fields: list[int]  # offsets of the 4-byte CRC-32 fields (local header, descriptor, central)
    descriptor: bool


def zip_records(data: bytes) -> list[ZipRecord]:
    """The records of a ZIP archive in central-directory order, with where their CRC-32s are stored."""
    end = data.rfind(b"PK\x05\x06")
    if end < 0 or end + 22 > len(data):
        raise ValueError("no end of central directory record")
    (count, cd_size, cd_offset) = struct.unpack_from("<HII", data, end + 10)
    if cd_offset == 0xFFFFFFFF or count == 0xFFFF:
        loc = data.rfind(b"PK\x06\x07", 0, end)
        (z64,) = struct.unpack_from("<Q", data, loc + 8)
        (count, cd_size, cd_offset) = struct.unpack_from("<QQQ", data, z64 + 32)
    out = []
    pos = cd_offset
    for _ in range(count):
        if data[pos : pos + 4] != b"PK\x01\x02":
            raise ValueError(f"bad central directory entry at {pos}")
        (flags,) = struct.unpack_from("<H", data, pos + 8)
        csize, usize = struct.unpack_from("<II", data, pos + 20)
        n, e, c = struct.unpack_from("<HHH", data, pos + 28)
        (header,) = struct.unpack_from("<I", data, pos + 42)
        name = data[pos + 46 : pos + 46 + n].decode("utf-8")
        extra = data[pos + 46 + n : pos + 46 + n + e]
        if 0xFFFFFFFF in (csize, usize, header):
            # zip64 extended information (id 1): the 64-bit values of the saturated fields, in this order
            q = 0
            while q + 4 <= len(extra):
                hid, hlen = struct.unpack_from("<HH", extra, q)
                if hid == 1:
                    vals = list(struct.unpack_from(f"<{hlen // 8}Q", extra, q + 4))
                    if usize == 0xFFFFFFFF:
                        usize = vals.pop(0)
                    if csize == 0xFFFFFFFF:
                        csize = vals.pop(0)
                    if header == 0xFFFFFFFF:
                        header = vals.pop(0)
                    break
                q += 4 + hlen
        ln, le = struct.unpack_from("<HH", data, header + 26)
        start = header + 30 + ln + le
        crc_fields = [header + 14, pos + 16]
        descriptor = bool(flags & 8)
        if descriptor:
            d = start + csize
            crc_fields.append(d + 4 if data[d : d + 4] == b"PK\x07\x08" else d)
        out.append(ZipRecord(name, header, start, csize, crc_fields, descriptor))
        pos += 46 + n + e + c
    return out


def hash_combine(seed: int, value: int) -> int:
    """c10::hash_combine on 64 bits (how torch folds the records' CRC-32s into the serialization id)."""
    m = (1 << 64) - 1
    return (seed ^ ((value + 0x9E3779B9 + ((seed << 6) & m) + (seed >> 2)) & m)) & m


def serialization_checksum(data: bytes, records: list[ZipRecord], id_record: ZipRecord) -> str:
    """The last 20 digits of torch's ``.data/serialization_id``: the CRC-32 of every record written before it
    (with a data descriptor, in file order), folded with ``hash_combine``."""
    c = 0
    for r in sorted(records, key=lambda r: r.header):
        if r.header >= id_record.header:
            break
        if r.descriptor:
            c = hash_combine(c, struct.unpack_from("<I", data, r.crc_fields[-1])[0])
    return f"{c:020d}"


@dataclass
class LoadedArchive:
    """A torch.save archive loaded by torch: its typed tree and tensor records, storage keys attached."""

    obj: Any
    tree: Any
    tensors: list[dict[str, Any]]


def load_archive(data: bytes) -> LoadedArchive:
    import torch  # noqa: F401  (torchtree imports it)

    import torchtree

    obj, keys = torchtree.load_with_keys(io.BytesIO(data), weights_only=True)
    tree, tensors, ids = torchtree.render(obj)
    return LoadedArchive(obj, tree, torchtree.attach_keys(tensors, ids, keys))


def pickle_float_spans(a: bytes, b: bytes) -> list[tuple[int, int, float, float]] | str:
    """(start, end, committed, fresh) of the BINFLOAT arguments that differ between two pickles whose
    opcodes and other arguments are identical; a description of the first other difference otherwise."""
    ops_a, ops_b = list(pickletools.genops(a)), list(pickletools.genops(b))
    if len(ops_a) != len(ops_b):
        return f"{len(ops_a)} pickle opcodes vs {len(ops_b)}"
    spans = []
    for (oa, arg_a, pos_a), (ob, arg_b, pos_b) in zip(ops_a, ops_b):
        if oa.name != ob.name or pos_a != pos_b:
            return f"pickle opcode {oa.name} vs {ob.name} at {pos_a}"
        if arg_a == arg_b or (oa.name == "BINFLOAT" and arg_a != arg_a and arg_b != arg_b):
            continue
        if oa.name != "BINFLOAT":
            return f"pickle {oa.name} argument {arg_a!r} vs {arg_b!r} at {pos_a}"
        spans.append((pos_a + 1, pos_a + 9, arg_a, arg_b))
    return spans


def tree_floats(tree: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[str, str]]:
    """(path, float.hex()) of every float in a typed tree (paths as torchtree names tensors)."""
    if isinstance(tree, dict):
        t = tree.get("t")
        if t == "float":
            yield ".".join(path), tree["v"]
        elif t in ("dict", "odict"):
            for k, v in tree["items"]:
                key = k.get("v") if isinstance(k, dict) and k.get("t") in ("str", "int") else json.dumps(k)
                yield from tree_floats(v, (*path, str(key)))
        elif t in ("list", "tuple"):
            for i, v in enumerate(tree["items"]):
                yield from tree_floats(v, (*path, str(i)))


def compare_trees(name: str, ta: Any, tb: Any, value_globs: Iterable[str], problems: list[str]) -> set[tuple[float, float]]:
    """Typed trees equal, except floats at ``value_globs`` paths, which must be close (float32 math).
    Returns the (committed, fresh) pairs of those floats that differ."""
    fa, fb = dict(tree_floats(ta)), dict(tree_floats(tb))
    allowed = {p for p in fa if matches(value_globs, p) and p in fb and fa[p] != fb[p]}

    def strip(tree: Any, path: tuple[str, ...] = ()) -> Any:
        if isinstance(tree, dict):
            t = tree.get("t")
            if t == "float" and ".".join(path) in allowed:
                return {"t": "float", "v": "<trained>"}
            if t in ("dict", "odict"):
                out = dict(tree)
                out["items"] = [
                    [k, strip(v, (*path, str(k.get("v") if isinstance(k, dict) and k.get("t") in ("str", "int") else json.dumps(k))))]
                    for k, v in tree["items"]
                ]
                return out
            if t in ("list", "tuple"):
                return {**tree, "items": [strip(v, (*path, str(i))) for i, v in enumerate(tree["items"])]}
        return tree

    if strip(ta) != strip(tb):
        out: list[str] = []
        diff_json(strip(ta), strip(tb), "", out)
        problems.append(f"{name}: object tree differs: " + "; ".join(out))
    for p in sorted(allowed):
        why = close(np.array([float.fromhex(fa[p])]), np.array([float.fromhex(fb[p])]), "float32")
        if why:
            problems.append(f"{name}: value {p}: {why}")
    return {(float.fromhex(fa[p]), float.fromhex(fb[p])) for p in allowed}


def compare_archive(name: str, a: bytes, b: bytes, rule: Rule, problems: list[str]) -> tuple[LoadedArchive, LoadedArchive] | None:
    """Compares two torch.save archives: every byte exactly, except the data of records holding tensors
    ``rule.tensors`` selects (compared within the tolerance), floats of ``rule.values`` in the pickle, and the
    CRC-32s and serialization checksum computed from them (each must be right for its own file).

    Returns both archives as loaded by torch when they had to be loaded, for callers that check digests."""
    if a == b:
        return None
    if not (rule.tensors or rule.values):
        problems.append(f"{name}: bytes differ ({describe_zip_difference(a, b)})")
        return None
    try:
        ra, rb = zip_records(a), zip_records(b)
    except (ValueError, struct.error) as e:
        problems.append(f"{name}: not a readable ZIP archive ({e})")
        return None
    layout = lambda rs: [(r.name, r.header, r.data, r.size, r.descriptor) for r in rs]  # noqa: E731
    if len(a) != len(b) or layout(ra) != layout(rb):
        problems.append(f"{name}: archive layout differs ({describe_zip_difference(a, b)})")
        return None
    try:
        la, lb = load_archive(a), load_archive(b)
    except Exception as e:  # noqa: BLE001 - reported as a difference
        problems.append(f"{name}: cannot be loaded by torch: {type(e).__name__}: {e}")
        return None
    prefix = next((r.name[: -len("data.pkl")] for r in ra if r.name.endswith("data.pkl")), "")
    by_name = {r.name: r for r in ra}

    def trained_records(la: LoadedArchive) -> dict[str, str]:
        out = {}
        for t in la.tensors:
            if t["dtype"] in PRECISION and t["storage_key"] is not None and matches(rule.tensors, t["path"]):
                out[f"{prefix}data/{t['storage_key']}"] = t["dtype"]
        return out

    trained = trained_records(la)
    if trained != trained_records(lb):
        problems.append(f"{name}: the training-derived tensors are stored differently")
        return la, lb
    masks = Masks()
    for rec_name, dtype in trained.items():
        r = by_name.get(rec_name)
        if r is None:
            problems.append(f"{name}: no record {rec_name}")
            return la, lb
        masks.trained.append((r.data, r.data + r.size))
    pkl = by_name.get(f"{prefix}data.pkl")
    float_spans: list[tuple[int, int]] = []
    float_pairs: set[tuple[float, float]] = set()
    if rule.values and pkl is not None:
        spans = pickle_float_spans(a[pkl.data : pkl.data + pkl.size], b[pkl.data : pkl.data + pkl.size])
        if isinstance(spans, str):
            problems.append(f"{name}: {spans}")
            return la, lb
        float_spans = [(pkl.data + s, pkl.data + e) for s, e, _, _ in spans]
        float_pairs = {(x, y) for _, _, x, y in spans}
        masks.trained += float_spans
        if float_spans:
            trained[pkl.name] = "pickle"
    for rec_name in trained:
        r = by_name[rec_name]
        # with a data descriptor the local header's CRC-32 is 0 on both sides: compared exactly
        for off in r.crc_fields[1:] if r.descriptor else r.crc_fields:
            masks.derived.append(Derived(off, off + 4, f"CRC-32 of {rec_name}",
                                         lambda d, r=r, off=off: struct.unpack_from("<I", d, off)[0]
                                         == zlib.crc32(d[r.data : r.data + r.size])))
    ids = [r for r in ra if r.name.endswith(".data/serialization_id")]
    if trained and ids:
        sid = ids[0]
        masks.derived.append(Derived(sid.data + 20, sid.data + sid.size, "checksum half of .data/serialization_id",
                                     lambda d, sid=sid: d[sid.data + 20 : sid.data + sid.size].decode("ascii", "replace")
                                     == serialization_checksum(d, zip_records(d), sid)))
        for off in sid.crc_fields[1:] if sid.descriptor else sid.crc_fields:
            masks.derived.append(Derived(off, off + 4, "CRC-32 of .data/serialization_id",
                                         lambda d, sid=sid, off=off: struct.unpack_from("<I", d, off)[0]
                                         == zlib.crc32(d[sid.data : sid.data + sid.size])))
    at = first_difference(a, b, masks.spans())
    if at is not None:
        problems.append(f"{name}: bytes differ at offset {at} (in {zip_record_at(ra, at)}), outside training-derived data")
    check_derived(name, a, b, masks, problems)
    for rec_name, dtype in trained.items():
        if dtype == "pickle":
            continue
        r = by_name[rec_name]
        why = close(array_of(a[r.data : r.data + r.size], dtype), array_of(b[r.data : r.data + r.size], dtype), dtype)
        if why:
            paths = [t["path"] for t in la.tensors if f"{prefix}data/{t['storage_key']}" == rec_name]
            problems.append(f"{name}: {rec_name} ({', '.join(paths)}): {why}")
    if float_spans or rule.values:
        allowed = compare_trees(name, la.tree, lb.tree, rule.values, problems)
        # every pickled float that differs must be one of the training-derived values of the object tree
        for x, y in sorted(float_pairs - allowed):
            problems.append(f"{name}: pickled float {x!r} vs {y!r} is not a training-derived value")
    return la, lb


def zip_record_at(records: list[ZipRecord], offset: int) -> str:
    where = "bytes before the first record"
    for r in sorted(records, key=lambda r: r.header):
        if offset >= r.header:
            where = f"record {r.name!r}"
    if records and offset >= max(r.crc_fields[1] for r in records) - 16:
        where = "the central directory or end records"
    return where


def describe_zip_difference(a: bytes, b: bytes) -> str:
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), n)
    try:
        where = zip_record_at(zip_records(a), first) if a[:4] == b"PK\x03\x04" else "raw bytes"
    except (ValueError, struct.error):
        where = "a file that is not a readable ZIP"
    return f"sizes {len(a)} vs {len(b)}, first difference at offset {first}, in {where}"


# --------------------------------------------------------------------------------------------
# HDF5 files


def hdf5_datasets(path: Path) -> list[dict[str, Any]]:
    """Every dataset: path, numpy dtype, shape, layout, file offset and storage size of its data."""
    import h5py

    out: list[dict[str, Any]] = []
    with h5py.File(path, "r") as hf:

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                layout = obj.id.get_create_plist().get_layout()
                out.append({
                    "path": name,
                    "dtype": obj.dtype.str,
                    "shape": list(obj.shape),
                    "contiguous": layout == h5py.h5d.CONTIGUOUS and not obj.compression,
                    "offset": obj.id.get_offset(),
                    "size": obj.id.get_storage_size(),
                })

        hf.visititems(visit)
    return out


def compare_hdf5(name: str, pa: Path, pb: Path, rule: Rule, problems: list[str]) -> None:
    """Compares two HDF5 files: every byte exactly, except the data of the float datasets ``rule.datasets``
    selects (within the tolerance) and, in opaque datasets holding torch.save blobs, the training-derived
    parts ``rule.blob_tensors`` selects (as ``compare_archive`` does)."""
    a, b = pa.read_bytes(), pb.read_bytes()
    if a == b:
        return
    if not (rule.datasets or rule.blob_tensors) or len(a) != len(b):
        problems.append(f"{name}: bytes differ (sizes {len(a)} vs {len(b)}, first difference at offset "
                        f"{first_difference(a, b, []) if len(a) == len(b) else 'n/a'})")
        return
    da, db = hdf5_datasets(pa), hdf5_datasets(pb)
    if da != db:
        problems.append(f"{name}: datasets differ in layout: {da} vs {db}"[:600])
        return
    masks = Masks()
    for ds in da:
        if not ds["contiguous"] or ds["offset"] is None or ds["size"] == 0:
            continue
        s, e = ds["offset"], ds["offset"] + ds["size"]
        kind = {"<f4": "float32", "<f8": "float64", "<f2": "float16"}.get(ds["dtype"])
        if kind and matches(rule.datasets, ds["path"]):
            masks.trained.append((s, e))
            why = close(array_of(a[s:e], kind), array_of(b[s:e], kind), kind)
            if why:
                problems.append(f"{name}: dataset {ds['path']}: {why}")
        elif ds["dtype"] == "|V1" and rule.blob_tensors:
            # an optimizer blob: a torch.save archive, compared as one (training-derived parts within
            # the tolerance, everything else exactly)
            masks.trained.append((s, e))
            compare_archive(f"{name}:{ds['path']}", a[s:e], b[s:e], rule.blob_rule(), problems)
    at = first_difference(a, b, masks.spans())
    if at is not None:
        problems.append(f"{name}: bytes differ at offset {at}, outside training-derived data")


# --------------------------------------------------------------------------------------------
# torch.distributed.checkpoint data files


def dcp_items(metadata: Path, data_file: str) -> list[tuple[str, int, int]]:
    """(key, offset, length) of the items ``.metadata`` places in ``data_file``, by offset."""
    import pickle

    import torch  # noqa: F401  (the pickle names torch classes)

    md = pickle.loads(metadata.read_bytes())
    return sorted(
        ((index.fqn, info.offset, info.length) for index, info in md.storage_data.items() if info.relative_path == data_file),
        key=lambda t: t[1],
    )


def dcp_item_tensor(path: Path, key: str) -> Any:
    """The tensor item ``key`` of the DCP data file ``path`` (its ``.metadata`` beside it), loaded by torch."""
    import torch

    for fqn, off, n in dcp_items(path.parent / ".metadata", path.name):
        if fqn == key:
            return torch.load(io.BytesIO(path.read_bytes()[off : off + n]), weights_only=True)
    return None


def compare_dcp_file(name: str, pa: Path, pb: Path, rule: Rule, problems: list[str]) -> None:
    """A DCP ``.distcp`` file: each item is a torch.save archive of one tensor; items whose keys
    ``rule.items`` selects are compared as archives of training-derived tensors, every other byte exactly
    (the item table of both ``.metadata`` files must be the same)."""
    a, b = pa.read_bytes(), pb.read_bytes()
    ia, ib = dcp_items(pa.parent / ".metadata", pa.name), dcp_items(pb.parent / ".metadata", pb.name)
    if ia != ib or len(a) != len(b):
        problems.append(f"{name}: items differ in place or size (sizes {len(a)} vs {len(b)})")
        return
    masks = Masks()
    for key, off, n in ia:
        if matches(rule.items, key):
            masks.trained.append((off, off + n))
            compare_archive(f"{name}:{key}", a[off : off + n], b[off : off + n], Rule(tensors=("*",)), problems)
    at = first_difference(a, b, masks.spans())
    if at is not None:
        item = next((k for k, off, n in ia if off <= at < off + n), "no item")
        problems.append(f"{name}: bytes differ at offset {at} (in {item}), outside training-derived data")


# --------------------------------------------------------------------------------------------
# JSON, JSON lines, TSV


def diff_json(a: Any, b: Any, where: str, out: list[str], limit: int = 8,
              leaf_ok: Callable[[str, Any, Any], str | None] | None = None,
              always: Callable[[str], bool] | None = None) -> None:
    """Appends up to ``limit`` differences between two JSON values. ``leaf_ok(path, a, b)``, when given, is
    asked about differing leaves of the same type, and about every leaf ``always(path)`` selects (fields
    computed from data, which must be right for their own side even where both sides agree): None accepts
    the leaf, a string describes what is wrong. Paths join keys and list indices with dots."""
    if len(out) >= limit:
        return
    if type(a) is not type(b):
        out.append(f"{where}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}")
    elif isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'committed' if k in a else 'fresh'}")
            else:
                diff_json(a[k], b[k], f"{where}.{k}" if where else str(k), out, limit, leaf_ok, always)
    elif isinstance(a, list):
        if len(a) != len(b):
            out.append(f"{where}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            diff_json(x, y, f"{where}.{i}" if where else str(i), out, limit, leaf_ok, always)
    elif a != b or (leaf_ok is not None and always is not None and always(where)):
        why = f"{json.dumps(a)[:120]} != {json.dumps(b)[:120]}" if leaf_ok is None else leaf_ok(where, a, b)
        if why is not None:
            out.append(f"{where}: {why}")


def number_leaf_ok(rule: Rule) -> Callable[[str, Any, Any], str | None]:
    """``leaf_ok`` accepting floats at ``rule.fields`` within the float32-math tolerance and numbers at
    ``rule.counts`` within one count per edge; every other leaf must be equal."""

    def ok(path: str, a: Any, b: Any) -> str | None:
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        if numbers and isinstance(a, float) and isinstance(b, float) and matches(rule.fields, path):
            return close(np.array([a]), np.array([b]), "float32")
        if numbers and matches(rule.counts, path):
            return None if abs(a - b) <= MAX_COUNT_CHANGE else f"{a!r} vs {b!r}: more than {MAX_COUNT_CHANGE} apart"
        return f"{json.dumps(a)[:120]} != {json.dumps(b)[:120]}"

    return ok


def compare_json_lines(name: str, a: bytes, b: bytes, rule: Rule, problems: list[str]) -> None:
    """One JSON document per line, each as ``json.dumps`` writes it: equal, except floats at ``rule.fields``
    (float32-math tolerance) and means of counts at ``rule.counts`` (at most one count per edge)."""
    if a == b:
        return
    la, lb = a.decode("utf-8").split("\n"), b.decode("utf-8").split("\n")
    if len(la) != len(lb):
        problems.append(f"{name}: {len(la)} lines vs {len(lb)}")
        return
    out: list[str] = []
    for i, (x, y) in enumerate(zip(la, lb)):
        if x == y:
            continue
        try:
            jx, jy = json.loads(x), json.loads(y)
        except ValueError:
            out.append(f"line {i + 1}: {x[:80]!r} vs {y[:80]!r}")
            continue
        if json.dumps(jx) != x or json.dumps(jy) != y:
            out.append(f"line {i + 1}: not as json.dumps writes it, and different")
            continue
        sub: list[str] = []
        diff_json(jx, jy, "", sub, leaf_ok=number_leaf_ok(rule))
        out += [f"line {i + 1}: {d}" for d in sub]
    if out:
        problems.append(f"{name}: " + "; ".join(out[:8]))


NUMBER_9F = re.compile(r"-?\d+\.\d{9}")


def compare_tsv(name: str, a: bytes, b: bytes, rule: Rule, problems: list[str]) -> None:
    """TSV exports: the same lines and fields; ``"%.9f"`` fields (when ``rule.numbers``) within the tolerance
    of float32 math relative to the largest magnitude on their line, every other field exactly."""
    if a == b:
        return
    la, lb = a.decode("utf-8").split("\n"), b.decode("utf-8").split("\n")
    if len(la) != len(lb):
        problems.append(f"{name}: {len(la)} lines vs {len(lb)}")
        return
    for i, (x, y) in enumerate(zip(la, lb)):
        if x == y:
            continue
        fx, fy = x.split("\t"), y.split("\t")
        numeric = [rule.numbers and bool(NUMBER_9F.fullmatch(p)) and bool(NUMBER_9F.fullmatch(q)) for p, q in zip(fx, fy)]
        if len(fx) != len(fy) or any(p != q for p, q, n in zip(fx, fy, numeric) if not n):
            problems.append(f"{name}: line {i + 1} differs outside its numbers: {x[:80]!r} vs {y[:80]!r}")
            return
        va = np.array([float(p) for p, n in zip(fx, numeric) if n])
        vb = np.array([float(q) for q, n in zip(fy, numeric) if n])
        why = close(va, vb, "float32")
        if why:
            problems.append(f"{name}: line {i + 1}: {why}")
            return


# --------------------------------------------------------------------------------------------
# files and trees


def compare_file(name: str, pa: Path, pb: Path, rule: Rule, problems: list[str]) -> None:
    """Dispatches on the file's kind; files without a rule are compared byte for byte."""
    if rule.datasets or rule.blob_tensors:
        compare_hdf5(name, pa, pb, rule, problems)
        return
    a, b = pa.read_bytes(), pb.read_bytes()
    if a == b:
        return
    if rule.items:
        compare_dcp_file(name, pa, pb, rule, problems)
    elif rule.tensors or rule.values:
        compare_archive(name, a, b, rule, problems)
    elif rule.fields or rule.counts:
        compare_json_lines(name, a, b, rule, problems)
    elif rule.numbers:
        compare_tsv(name, a, b, rule, problems)
    else:
        where = describe_zip_difference(a, b) if a[:4] == b"PK\x03\x04" else (
            f"sizes {len(a)} vs {len(b)}, first difference at offset {first_difference(a, b, []) if len(a) == len(b) else min(len(a), len(b))}")
        problems.append(f"{name}: bytes differ ({where})")


def digest_ok(rules: Rules, rel: str, root_a: Path, root_b: Path) -> Callable[[Any, Any], str | None]:
    """Checks the sha256 of file ``rel`` recorded on each side: where the files differ, a file holding
    training-derived data must have, on each side, the digest of that side's file (a file without such
    data is reported by the file comparison itself)."""

    def ok(a: Any, b: Any) -> str | None:
        pa, pb = root_a / rel, root_b / rel
        same_file = pa.is_file() and pb.is_file() and pa.read_bytes() == pb.read_bytes()
        if same_file and a == b:
            return None
        if rules.for_file(rel) is NOTHING:
            return None if a == b else f"digest of {rel} differs, and it holds no training-derived data"
        for side, p, d in (("committed", pa, a), ("fresh", pb, b)):
            if d is not None and (not p.is_file() or sha256(p.read_bytes()) != d):
                return f"the {side} digest of {rel} is not the digest of the {side} file"
        return None if (a is None) == (b is None) else f"digest {a!r} vs {b!r}"

    return ok


def stamp_rules(committed: dict[str, Any], fresh: dict[str, Any], problems: list[str]) -> Rules:
    """The ``training_derived`` rules both STAMP.json files must declare alike."""
    ta, tb = committed.get("training_derived"), fresh.get("training_derived")
    if ta != tb:
        problems.append("STAMP.json: training_derived differs between committed and fresh (regenerate the fixtures)")
    return Rules(ta)
