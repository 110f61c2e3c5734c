#!/usr/bin/env python3
"""Generate the hostile / malformed inputs every torch-format reader must reject.

Usage::

    .venv/bin/python conformance/python/make_bad.py OUTDIR

Writes each bad file, ``EXPECTED.json`` (file -> machine tag of the expected failure) and
``README.md`` (file, tag, defect, and what torch 2.13 itself does with it) into OUTDIR. The
committed copy lives in ``conformance/bad/``; the output is deterministic, so
``check_reproducible.py conformance/bad FRESH`` verifies it.

Files derived from real checkpoints start from ``torch.save`` output (miniz layout) and change
exactly one thing; files whose ``data.pkl`` is edited are written with Python's ``zipfile``
(stored, fixed timestamps) so they are structurally valid except for the targeted defect.

``make_bad.py --probe FILE...`` (internal) prints, as JSON, what ``torch.load(weights_only=True)``
and ``torch.load(weights_only=True, mmap=True)`` do with each file; it runs in a subprocess so a
crash cannot take the generator down.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pinenv  # noqa: E402

if "--probe" not in sys.argv:
    pinenv.pin_environment()

import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
import warnings  # noqa: E402
import zipfile  # noqa: E402
import zlib  # noqa: E402
from collections import OrderedDict  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

warnings.filterwarnings("ignore")

COMMAND = ".venv/bin/python conformance/python/make_bad.py conformance/bad"
DATE_1980 = (1980, 1, 1, 0, 0, 0)


# --------------------------------------------------------------------------------------------
# hand-made pickles: protocol 2, torch's own GLOBALs, arbitrary (also inconsistent) metadata


@dataclass
class StorageRef:
    """Becomes the persistent id ``('storage', torch.<storage_type>, key, 'cpu', numel)``."""

    storage_type: str
    key: str
    numel: int


@dataclass
class TensorRef:
    """Becomes ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())``."""

    storage: StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (
            torch._utils._rebuild_tensor_v2,
            (self.storage, self.offset, tuple(self.size), tuple(self.stride), False, OrderedDict()),
        )


def contiguous_ref(storage_type: str, key: str, numel: int) -> TensorRef:
    return TensorRef(StorageRef(storage_type, key, numel), 0, (numel,), (1,))


class _RefPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, StorageRef):
            return ("storage", getattr(torch, obj.storage_type), obj.key, "cpu", obj.numel)
        return None


def make_pickle(obj: Any) -> bytes:
    """Protocol-2 pickle of ``obj`` with ``StorageRef``/``TensorRef`` turned into torch's form."""
    buf = io.BytesIO()
    _RefPickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def write_python_zip(path: Path, prefix: str, records: list[tuple[str, bytes]]) -> None:
    """A stored ZIP written by Python's ``zipfile`` with fixed timestamps/attributes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in records:
            zi = zipfile.ZipInfo(f"{prefix}/{name}", date_time=DATE_1980)
            zi.create_system = 3
            zi.external_attr = 0o644 << 16
            z.writestr(zi, data)


def f32(values: list[float], byteorder: str = "<") -> bytes:
    return struct.pack(f"{byteorder}{len(values)}f", *values)


# --------------------------------------------------------------------------------------------
# ZIP surgery helpers on torch.save output


def torch_saved(path: Path) -> bytes:
    """``torch.save`` a small checkpoint (3 storages) to ``path``; prefix = the file stem."""
    obj = {
        "w": torch.arange(16, dtype=torch.float32).reshape(4, 4) / 4,
        "b": torch.tensor([0.5, -1.0, 2.0, -4.0]),
        "ids": torch.tensor([3, 1, 4], dtype=torch.int64),
    }
    torch.save(obj, str(path))
    return path.read_bytes()


def data_start(raw: bytes, header_offset: int) -> int:
    """Offset of a record's data: local header (30 bytes) + name + extra."""
    name_len, extra_len = struct.unpack_from("<HH", raw, header_offset + 26)
    return header_offset + 30 + name_len + extra_len


def record_info(raw: bytes, suffix: str) -> zipfile.ZipInfo:
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        for info in z.infolist():
            if info.filename.endswith(suffix):
                return info
    raise KeyError(suffix)


def central_directory(raw: bytes) -> tuple[int, int]:
    """(offset, length) of the central directory (up to the zip64 EOCD record)."""
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        start = z.start_dir
    end = raw.find(b"PK\x06\x06", start)
    if end < 0:
        end = raw.find(b"PK\x05\x06", start)
    return start, end - start


def cd_entry_offset(raw: bytes, suffix: str) -> int:
    """Offset of the central-directory entry whose name ends with ``suffix``."""
    pos, length = central_directory(raw)
    end = pos + length
    while pos < end:
        if raw[pos : pos + 4] != b"PK\x01\x02":
            raise ValueError("bad central directory signature")
        n, e, c = struct.unpack_from("<HHH", raw, pos + 28)
        name = raw[pos + 46 : pos + 46 + n].decode()
        if name.endswith(suffix):
            return pos
        pos += 46 + n + e + c
    raise KeyError(suffix)


# --------------------------------------------------------------------------------------------
# the bad files


def bad_truncated_cd(path: Path) -> str:
    raw = torch_saved(path)
    start, length = central_directory(raw)
    cut = start + length // 2
    path.write_bytes(raw[:cut])
    return f"torch.save output cut at byte {cut}, in the middle of the central directory (no end records)"


def bad_truncated_data(path: Path) -> str:
    raw = torch_saved(path)
    info = record_info(raw, "/data/0")
    cut = data_start(raw, info.header_offset) + info.file_size // 2
    path.write_bytes(raw[:cut])
    return f"torch.save output cut at byte {cut}, in the middle of record data/0"


def bad_crc(path: Path) -> str:
    raw = bytearray(torch_saved(path))
    info = record_info(bytes(raw), "/data/0")
    pos = data_start(bytes(raw), info.header_offset) + 5
    raw[pos] ^= 0x01
    path.write_bytes(bytes(raw))
    return f"one bit of data/0 flipped (byte {pos}); the stored CRC-32 is unchanged (torch itself never checks)"


def bad_past_end(path: Path) -> str:
    raw = bytearray(torch_saved(path))
    pos = cd_entry_offset(bytes(raw), "/data/0")
    size = len(raw) + 4096
    struct.pack_into("<II", raw, pos + 20, size, size)
    path.write_bytes(bytes(raw))
    return f"central-directory sizes of data/0 set to {size}, past the end of the {len(raw)}-byte file"


def bad_overlap(path: Path) -> str:
    """Hand-laid ZIP: record data/1 (local header + data) lies inside record data/0's data."""
    prefix = path.stem
    pkl = make_pickle({"a": contiguous_ref("ByteStorage", "0", 128), "b": contiguous_ref("FloatStorage", "1", 4)})
    b_name = f"{prefix}/data/1".encode()
    b_data = f32([1.0, 2.0, 3.0, 4.0])
    b_crc = zlib.crc32(b_data)

    def local_header(name: bytes, data: bytes) -> bytes:
        return struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, zlib.crc32(data), len(data),
                           len(data), len(name), 0) + name

    b_header = local_header(b_name, b_data)
    a_data = (b_header + b_data).ljust(128, b"\x00")
    records = [(f"{prefix}/data.pkl".encode(), pkl), (f"{prefix}/data/0".encode(), a_data),
               (f"{prefix}/version".encode(), b"3\n")]
    out = bytearray()
    entries: list[tuple[bytes, bytes, int]] = []
    for name, data in records:
        entries.append((name, data, len(out)))
        out += local_header(name, data) + data
    a_off = entries[1][2]
    entries.insert(2, (b_name, b_data, a_off + 30 + len(records[1][0])))  # inside data/0's data
    cd_start = len(out)
    for name, data, off in entries:
        out += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21, zlib.crc32(data), len(data),
                           len(data), len(name), 0, 0, 0, 0, 0, off) + name
    cd_len = len(out) - cd_start
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), cd_len, cd_start, 0)
    assert zlib.crc32(b_data) == b_crc
    path.write_bytes(bytes(out))
    return ("hand-laid ZIP whose record data/1 (a valid local header + data, CRCs correct) lies inside "
            "record data/0's data, so the two records overlap")


def bad_memo_bomb(path: Path) -> str:
    x: Any = torch.tensor([1.0, 2.0])
    for _ in range(60):
        x = [x, x]
    torch.save({"bomb": x}, str(path))
    return ("real torch.save of {'bomb': x} with x = [x, x] nested 60 levels over one tensor: 60 memoized "
            "lists (BINGET doubling) that expand to 2**60 tensor references if copied or flattened")


def bad_deep_list(path: Path) -> str:
    n = 1_000_000
    pkl = b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."
    write_python_zip(path, path.stem, [("data.pkl", pkl), ("version", b"3\n")])
    return f"data.pkl = PROTO 2, {n} x EMPTY_LIST, {n - 1} x APPEND, STOP: lists nested {n} deep"


def bad_deep_mark(path: Path) -> str:
    n = 100_000
    pkl = b"\x80\x02" + b"(" * n + b"t" * n + b"."
    write_python_zip(path, path.stem, [("data.pkl", pkl), ("version", b"3\n")])
    return f"data.pkl = PROTO 2, {n} x MARK, {n} x TUPLE, STOP: {n} nested MARKs (tuples nested {n} deep)"


def prng_bytes(seed: bytes, n: int) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(seed + i.to_bytes(8, "little")).digest()
        i += 1
    return bytes(out[:n])


def bad_random(path: Path) -> str:
    data = prng_bytes(b"ckpt-bad-random-v1", 4096)
    assert data[:2] not in (b"PK", b"\x80\x02") and data[0] not in (0x80, ord("<"), ord("v"))
    path.write_bytes(data)
    return "4096 bytes of sha256-counter-mode noise (seed 'ckpt-bad-random-v1')"


def bad_lfs(path: Path) -> str:
    oid = hashlib.sha256(b"ckpt").hexdigest()
    path.write_bytes(f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize 123\n".encode())
    return "a git-LFS pointer file (what a clone without git-lfs leaves in place of the checkpoint)"


def bad_html(path: Path) -> str:
    path.write_bytes(
        b"<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Sign in</title></head>\n"
        b"<body><h1>Sign in to download model.pt</h1><form method=\"post\"></form></body>\n</html>\n"
    )
    return "an HTML page (what a download link behind a login or a 404 page saves)"


def bad_tar(path: Path) -> str:
    """TAR-era layout (spec section 4): sys_info, storages, tensors, pickle."""

    def pk(o: Any) -> bytes:
        return pickle.dumps(o, protocol=2)

    sys_info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    w = [0.5, -1.0, 2.0, 4.0, 8.0, -0.25]
    storages = pk(1) + pk((0, "cpu", torch.FloatStorage)) + struct.pack("<q", len(w)) + f32(w) + pk([])
    sizes, strides = (2, 3), (3, 1)
    tensors = (pk(1) + pk((10, 0, torch.FloatTensor)) + struct.pack("<i", 2) + b"\x00" * 4
               + struct.pack("<2q", *sizes) + struct.pack("<2q", *strides) + struct.pack("<q", 0))

    class _Pid(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return "10" if obj is marker else None

    marker = object()
    buf = io.BytesIO()
    _Pid(buf, protocol=2).dump({"w": marker, "epoch": 1})
    members = [("sys_info", pk(sys_info)), ("storages", storages), ("tensors", tensors), ("pickle", buf.getvalue())]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = len(data), 0, 0o644, 0, 0, "", ""
            tar.addfile(ti, io.BytesIO(data))
    got = torch.load(str(path), weights_only=False)  # our own file: proves the layout is right
    assert torch.equal(got["w"], torch.tensor(w).reshape(2, 3)) and got["epoch"] == 1
    return ("TAR-era checkpoint (torch < 0.1.10): tarfile members sys_info, storages, tensors, pickle; "
            "torch 2.13 loads it only with weights_only=False ({'w': 2x3 float32, 'epoch': 1})")


def bad_empty(path: Path) -> str:
    path.write_bytes(b"")
    return "an empty (0-byte) file"


def bad_record_too_short(path: Path) -> str:
    pkl = make_pickle({"w": contiguous_ref("FloatStorage", "0", 8)})
    write_python_zip(path, path.stem, [("data.pkl", pkl), ("byteorder", b"little"),
                                       ("data/0", f32([1.0, 2.0, 3.0])), ("version", b"3\n")])
    return "storage numel 8 (float32, 32 bytes expected) but record data/0 holds 12 bytes"


def bad_view_oob(path: Path) -> str:
    ref = TensorRef(StorageRef("FloatStorage", "0", 4), 2, (4,), (1,))
    pkl = make_pickle({"w": ref})
    write_python_zip(path, path.stem, [("data.pkl", pkl), ("byteorder", b"little"),
                                       ("data/0", f32([1.0, 2.0, 3.0, 4.0])), ("version", b"3\n")])
    return "tensor storage_offset 2, size (4,), stride (1,) needs 6 elements; its storage (data/0) has 4"


def bad_missing_record(path: Path) -> str:
    pkl = make_pickle({"a": contiguous_ref("FloatStorage", "0", 2), "b": contiguous_ref("FloatStorage", "7", 2)})
    write_python_zip(path, path.stem, [("data.pkl", pkl), ("byteorder", b"little"),
                                       ("data/0", f32([1.0, 2.0])), ("version", b"3\n")])
    return "data.pkl references storage key '7' but the archive has no record data/7 (data/0 exists)"


def bad_big_endian(path: Path) -> str:
    vals = [1.0, -2.5, 3.25, 0.5]
    pkl = make_pickle({"w": contiguous_ref("FloatStorage", "0", 4)})
    write_python_zip(path, path.stem, [("data.pkl", pkl), ("byteorder", b"big"),
                                       ("data/0", f32(vals, ">")), ("version", b"3\n")])
    got = torch.load(str(path), weights_only=True)  # torch byte-swaps: proves it is a real BE file
    assert torch.equal(got["w"], torch.tensor(vals))
    return ("a consistent big-endian checkpoint: byteorder record 'big', data/0 holds big-endian float32 "
            "[1.0, -2.5, 3.25, 0.5] (torch byte-swaps it; ckpt must reject it or swap explicitly)")


@dataclass
class Bad:
    file: str
    tag: str
    make: Callable[[Path], str]


BAD: list[Bad] = [
    Bad("truncated_central_directory.pt", "truncated", bad_truncated_cd),
    Bad("truncated_data.pt", "truncated", bad_truncated_data),
    Bad("crc_mismatch.pt", "crc_mismatch", bad_crc),
    Bad("record_past_end.pt", "out_of_bounds", bad_past_end),
    Bad("overlapping_records.pt", "overlap", bad_overlap),
    Bad("memo_bomb.pt", "memo_bomb", bad_memo_bomb),
    Bad("deep_nesting.pt", "depth", bad_deep_list),
    Bad("deep_marks.pt", "depth", bad_deep_mark),
    Bad("random_bytes.pt", "not_a_checkpoint", bad_random),
    Bad("git_lfs_pointer.pt", "git_lfs_pointer", bad_lfs),
    Bad("html_page.pt", "html", bad_html),
    Bad("tar_legacy.pt", "tar_legacy", bad_tar),
    Bad("empty.pt", "empty", bad_empty),
    Bad("record_too_short.pt", "record_too_short", bad_record_too_short),
    Bad("view_out_of_bounds.pt", "view_out_of_bounds", bad_view_oob),
    Bad("missing_record.pt", "missing_record", bad_missing_record),
    Bad("big_endian.pt", "big_endian", bad_big_endian),
]


# --------------------------------------------------------------------------------------------
# probing torch


def describe(obj: Any) -> str:
    if isinstance(obj, dict):
        return f"loads: {type(obj).__name__} with keys {list(obj)[:4]}"
    return f"loads: {type(obj).__name__}"


BOILERPLATE = (" This is an internal miniz error", " In PyTorch 2.6, we changed", ", please torch.save your")


def short_error(e: BaseException, path: Path) -> str:
    """The specific part of a torch error message, without paths or the generic advice."""
    text = str(e).replace(str(path.resolve()), path.name).replace(str(path), path.name)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.endswith("WeightsUnpickler error:") and i + 1 < len(lines):
            return f"{type(e).__name__}: {lines[i + 1][:200]}"
    first = lines[0] if lines else ""
    for marker in BOILERPLATE:
        first = first.split(marker, 1)[0]
    return f"{type(e).__name__}: {first[:200]}"


def probe(files: list[str]) -> int:
    out: dict[str, dict[str, str]] = {}
    for f in files:
        p = Path(f)
        res = {}
        for mode, kw in (("weights_only", {}), ("mmap", {"mmap": True})):
            try:
                res[mode] = describe(torch.load(str(p), weights_only=True, **kw))
            except Exception as e:  # noqa: BLE001 - the behaviour is what we record
                res[mode] = short_error(e, p)
        out[p.name] = res
    print(json.dumps(out))
    return 0


def torch_behaviour(outdir: Path, files: list[str]) -> dict[str, dict[str, str]]:
    def run(names: list[str]) -> dict[str, dict[str, str]] | None:
        p = subprocess.run([sys.executable, __file__, "--probe", *(str(outdir / f) for f in names)],
                           capture_output=True, text=True, timeout=600, check=False)
        return json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None

    res = run(files)
    if res is not None:
        return res
    res = {}
    for f in files:  # something crashed torch: one process per file, so only that row is lost
        one = run([f])
        res.update(one if one is not None else {f: {"weights_only": "process died", "mmap": "process died"}})
    return res


def cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "--probe":
        return probe(argv[2:])
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rows = []
    for bad in BAD:
        path = outdir / bad.file
        desc = bad.make(path)
        size = path.stat().st_size
        rows.append((bad, desc, size))
        print(f"wrote {bad.file} ({size} bytes): {bad.tag}")
    (outdir / "EXPECTED.json").write_text(
        json.dumps({b.file: b.tag for b in BAD}, sort_keys=True, indent=1) + "\n", encoding="utf-8"
    )
    behaviour = torch_behaviour(outdir, [b.file for b in BAD])
    lines = [
        "# Bad inputs for the torch-format readers",
        "",
        "Every file here must be rejected by `ckpt` with the error named by its tag in `EXPECTED.json`",
        "(file -> tag; the Rust tests map tags to error variants). Generated, deterministically, by",
        "",
        f"    {COMMAND}",
        "",
        "and checked with `check_reproducible.py conformance/bad FRESH_DIR`. The last two columns record",
        "what torch 2.13 itself does with `torch.load(weights_only=True)` and with `mmap=True` added;",
        "several defects are accepted silently by torch, which is why ckpt checks them.",
        "",
        "| file | tag | bytes | defect | torch weights_only | torch mmap |",
        "|---|---|---|---|---|---|",
    ]
    for bad, desc, size in rows:
        tb = behaviour.get(bad.file, {})
        lines.append(f"| `{bad.file}` | `{bad.tag}` | {size} | {cell(desc)} | {cell(tb.get('weights_only', ''))} "
                     f"| {cell(tb.get('mmap', ''))} |")
    (outdir / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
