#!/usr/bin/env python3
"""The side-by-side harness of issue 15: every workload in Python and in Rust in one run, with raw baselines.

Run it through ``benches/compare`` (which builds the tools first)::

    benches/compare [--quick] [--reps 5] [--dir /tmp/ckpt-compare] [--out benches/RESULTS.md] [--only SECTIONS]

It writes the workloads under ``--dir`` with the existing generators (``read_workloads.py``,
``pt_many_tensors.py``, ``dcp_large_metadata.py``), then for each workload runs, interleaved (A B C A B C ...,
``--reps`` times after one warm-up each): the Python original, ckpt (library calls timed inside one long-lived
``ckpt-read-timer`` process, or the ``ckpt`` tool as a whole process), and a raw baseline (a sequential
``write`` of the same bytes with and without ``fsync``, or a ``read`` of the same files into a pre-faulted
buffer). Read workloads run warm (page cache filled) and cold (``posix_fadvise(DONTNEED)`` on every file
before every run, of every side). The durable ``.pt`` save targets come from ``durable_save`` (its own
interleaved run, in the same harness run). Then the scaling table (``ckpt-read-timer --anon``: time and peak
anonymous memory for open, full read and save at three sizes and three tensor counts) and the anonymous
memory of every ``ckpt convert`` and ``ckpt reshard`` pair. Everything is written to ``--out`` as Markdown
tables (median seconds, min-max, GB/s of the median, ratios of medians), with the machine's description.

Sections (``--only``, comma-separated): ``reads``, ``writes``, ``durable``, ``scaling``, ``convert``.
``--quick`` uses the issue's shapes at 1/8 of their bytes (256 MiB instead of 2 GiB, 10^6 RecIS ids instead of
10^7, DCP metadata of 64 and 256 ranks instead of 256 and 1024, no 200k-tensor ``torch.load``; the scaling
table keeps its 4 GiB point); it takes about 15 minutes on the 2-core development VM, the full run about an hour and 20 GB of
scratch space.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import read_side_by_side as rsb  # noqa: E402  (the Python references of the read workloads)

PY = sys.executable
TIMER = ROOT / "target" / "release" / "ckpt-read-timer"
TOOL = ROOT / "target" / "release" / "ckpt"
DURABLE = ROOT / "target" / "release" / "durable_save"
CHUNK = 8 << 20

# --------------------------------------------------------------------------------------------------------
# measurement helpers


def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in files_of(path))


def drop_cache(path: Path) -> None:
    """Evicts every file of ``path`` from the page cache (``sync`` first: dirty pages cannot be dropped)."""
    os.sync()
    for p in files_of(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class Raw:
    """The raw baselines: sequential write of the same bytes (8 MiB chunks), with or without fsync, and a read
    of the same files into one pre-faulted buffer."""

    def __init__(self) -> None:
        self.payload = b""
        self.buf = bytearray()

    def _payload(self, n: int) -> memoryview:
        if len(self.payload) < n:
            import numpy as np

            self.payload = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8).tobytes()
        return memoryview(self.payload)[:n]

    def write(self, path: Path, n: int, fsync: bool) -> Callable[[], float]:
        data = self._payload(n)

        def run() -> float:
            if path.exists():
                path.unlink()
            os.sync()
            t = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for off in range(0, n, CHUNK):
                    os.write(fd, data[off : off + CHUNK])
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            return time.perf_counter() - t

        return run

    def read(self, path: Path) -> Callable[[], float]:
        files = files_of(path)
        biggest = max(p.stat().st_size for p in files)
        if len(self.buf) < biggest:
            self.buf = bytearray(biggest)  # zero-filled: pre-faulted
        view = memoryview(self.buf)

        def run() -> float:
            t = time.perf_counter()
            for p in files:
                with open(p, "rb", buffering=0) as f:
                    got, size = 0, p.stat().st_size
                    while got < size:
                        k = f.readinto(view[got : min(size, got + (64 << 20))])
                        if not k:
                            break
                        got += k
            return time.perf_counter() - t

        return run


class Timer(rsb.Timer):
    """The long-lived ``ckpt-read-timer`` process; write ops take a destination."""

    def op(self, op: str, src: Path | str, dst: Path | None = None) -> float:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(f"{op} {src}" + (f" {dst}" if dst else "") + "\n")
        line = self.p.stdout.readline().split()
        if not line or line[0] == "error":
            raise SystemExit(f"ckpt-read-timer failed: {' '.join(line)}")
        return float(line[1])


def peak_anon(cmd: list[str]) -> tuple[float, int]:
    """Runs a command; returns its wall seconds and its peak ``RssAnon`` in bytes, sampled every millisecond
    from ``/proc/PID/status``."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    status = f"/proc/{p.pid}/status"
    while p.poll() is None:
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
                        break
        except OSError:
            pass
        time.sleep(0.001)
    secs = time.perf_counter() - t
    err = p.stderr.read().decode() if p.stderr else ""
    if p.returncode != 0:
        raise SystemExit(f"{cmd} failed ({p.returncode}): {err}")
    return secs, peak


class Results:
    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.sections: list[str] = []
        self.ratios: list[tuple[str, float, str]] = []

    def interleave(self, title: str, nbytes: int, sides: list[tuple[str, Callable[[], float]]],
                   cold: Callable[[], None] | None = None) -> dict[str, list[float]]:
        """Runs the sides A B C A B C ... (one warm-up each, not with ``cold``), returns their timings."""
        for _, f in sides:
            if cold:
                cold()
            f()
        times: dict[str, list[float]] = {name: [] for name, _ in sides}
        for _ in range(self.reps):
            for name, f in sides:
                if cold:
                    cold()
                times[name].append(f())
        rows = [f"\n#### {title}\n", "| side | median s | min–max s | GB/s |", "|---|---|---|---|"]
        for name, xs in times.items():
            m = statistics.median(xs)
            gbs = f"{nbytes / m / 1e9:.2f}" if nbytes else "–"
            rows.append(f"| {name} | {m:.4f} | {min(xs):.4f}–{max(xs):.4f} | {gbs} |")
        text = "\n".join(rows)
        print(text, flush=True)
        self.sections.append(text)
        return times

    def ratio(self, what: str, times: dict[str, list[float]], num: str, den: str, target: str = "") -> float:
        """Speed ratio ``median(num) / median(den)`` (> 1: ``den`` is faster)."""
        r = statistics.median(times[num]) / statistics.median(times[den])
        self.ratios.append((what, r, target))
        print(f"  ratio {what}: {r:.2f} {target}", flush=True)
        return r

    def add(self, text: str) -> None:
        print(text, flush=True)
        self.sections.append(text)


def run(cmd: list, **kw) -> None:
    subprocess.run([str(c) for c in cmd], check=True, **kw)


# --------------------------------------------------------------------------------------------------------
# sections


def reads(res: Results, timer: Timer, raw: Raw, work: Path, cfg: dict, cold_too: bool) -> None:
    full = work / "full"
    run([PY, HERE / "read_workloads.py", full, "--mib", cfg["mib"]], stdout=subprocess.DEVNULL)
    pt20k = work / "pt20k.pt"
    if not pt20k.exists():
        run([PY, HERE / "pt_many_tensors.py", pt20k, "--tensors", 20000, "--bytes", 10240], stdout=subprocess.DEVNULL)
    recis = work / "recis_src"
    if not recis.exists():
        timer.op("recis-save", cfg["recis_ids"], recis)
    workloads = [
        ("pt-list", pt20k, "open + list a 20k-tensor .pt / torch.load(mmap=True)", "≥ 50", False),
        ("pt-read", full / "model.pt", "full read of a .pt / torch.load", "≥ 3", True),
        ("dcp-read", full / "dcp", "DCP load / dcp.load", "≥ 10", True),
        ("hfai-read", full / "hfai", "hfai load / hfai_ref.load", "≥ 3", True),
        ("pbg-read", full / "embeddings_node_0.v1.h5", "PBG partition read / h5py", "≥ 1.5", True),
        ("recis-read", recis, "RecIS table load (no Python reader; raw read only)", "", True),
    ]
    if cfg["pt200k"]:
        pt200k = work / "pt200k.pt"
        if not pt200k.exists():
            run([PY, HERE / "pt_many_tensors.py", pt200k, "--tensors", 200000, "--bytes", 1024],
                stdout=subprocess.DEVNULL)
        workloads.insert(1, ("pt-list", pt200k, "open + list a 200k-tensor .pt / torch.load(mmap=True)", "", False))
    for kind, path, what, target, has_raw in workloads:
        nbytes = size_of(path)
        for mode in ("warm", "cold") if cold_too and has_raw else ("warm",):
            sides = []
            if kind != "recis-read":
                sides.append(("python", rsb.reference(kind, path)))
            sides.append(("ckpt", lambda k=kind, p=path: timer.op(k, p)))
            if has_raw:
                sides.append(("raw read", raw.read(path)))
            t = res.interleave(f"{kind} {path.name} ({nbytes / 2**20:.0f} MiB, {mode})", nbytes, sides,
                               cold=(lambda p=path: drop_cache(p)) if mode == "cold" else None)
            if "python" in t:
                res.ratio(f"{what} ({mode})", t, "python", "ckpt", target)
            if has_raw:
                res.ratio(f"{kind}: ckpt / raw read of the same bytes ({mode})", t, "raw read", "ckpt")
    # the large DCP job: ckpt inspect as a whole process, with its peak RSS, vs torch's read_metadata()
    for ranks in cfg["dcp_ranks"]:
        d = work / f"dcp{ranks}"
        if not d.exists():
            run([PY, HERE / "dcp_large_metadata.py", d, "--ranks", ranks], stdout=subprocess.DEVNULL)
        md = (d / ".metadata").stat().st_size
        rss: list[int] = []

        def mine(d: Path = d) -> float:
            secs, kib = rsb.whole_process([str(TOOL), "inspect", "--json", str(d)])
            rss.append(kib)
            return secs

        t = res.interleave(f"dcp-open {ranks} ranks × 400 tensors ({ranks * 400} chunks, .metadata {md / 1e6:.1f} MB)",
                           0, [("python read_metadata()", rsb.reference("dcp-open", d)), ("ckpt inspect --json", mine)])
        res.ratio(f"open the large DCP checkpoint, {ranks * 400} chunks / read_metadata()", t,
                  "python read_metadata()", "ckpt inspect --json", "≥ 10")
        limit = 64 * 2**20 + 4 * md
        res.add(f"\nckpt inspect peak RSS {max(rss) / 1024:.0f} MiB; limit 64 MiB + 4 × .metadata = "
                f"{limit / 2**20:.0f} MiB: {'met' if max(rss) * 1024 <= limit else 'MISSED'}")


WRITE_WORKLOADS = ("dcp-save", "hfai-save", "pbg-write", "recis-save")


def writes(res: Results, timer: Timer, raw: Raw, work: Path, cfg: dict, only: set[str]) -> None:
    """The write workloads; ``only`` holds ``writes`` (all of them) or some of ``WRITE_WORKLOADS``."""

    def want(name: str) -> bool:
        return "writes" in only or name in only

    full = work / "full"
    run([PY, HERE / "read_workloads.py", full, "--mib", cfg["mib"]], stdout=subprocess.DEVNULL)
    out = work / "out"
    out.mkdir(exist_ok=True)
    import h5py
    import numpy as np
    import torch
    import torch.distributed.checkpoint as dcp

    if want("dcp-save"):
        # DCP save: dcp.save (FileSystemWriter syncs its files) vs ckpt's durable one-rank save vs raw + fsync
        src = full / "model.pt"
        sd = torch.load(src, weights_only=True)
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())

        def dcp_py() -> float:
            t = time.perf_counter()
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(out / "dcp_py"), no_dist=True)
            return time.perf_counter() - t

        t = res.interleave(f"DCP save, one rank, {nbytes / 2**20:.0f} MiB (both fsync)", nbytes, [
            ("python dcp.save", dcp_py),
            ("ckpt", lambda: timer.op("dcp-save", src, out / "dcp_ckpt")),
            ("raw write + fsync", raw.write(out / "raw.bin", nbytes, True)),
        ])
        res.ratio("DCP save / dcp.save (both fsync)", t, "python dcp.save", "ckpt", "≥ 2")
        res.ratio("DCP save / raw write + fsync", t, "raw write + fsync", "ckpt", "≥ 0.8")
        del sd
        shutil.rmtree(out / "dcp_py", ignore_errors=True)
        shutil.rmtree(out / "dcp_ckpt", ignore_errors=True)

    if want("hfai-save"):
        # hfai save: the reference's 4 gloo ranks (conformance/python/hfai/bench.py, + fsync of each part) vs ckpt
        hsrc = full / "hfai.pt"
        hbytes = size_of(hsrc)

        def hfai_py() -> float:
            p = subprocess.run([PY, ROOT / "conformance/python/hfai/bench.py", "--repeat", "1", "--fsync",
                                "--mib", str(cfg["mib"]), "--save-only", str(out)],
                               check=True, capture_output=True, text=True)
            line = next(x for x in p.stdout.splitlines() if "save" in x)
            return float(line.split("median ")[1].split(" s")[0])

        t = res.interleave(f"hfai save, 4 parts, {hbytes / 2**20:.0f} MiB (both fsync)", hbytes, [
            ("python hfai_ref.save (4 ranks)", hfai_py),
            ("ckpt", lambda: timer.op("hfai-save", hsrc, out / "hfai_ckpt")),
            ("raw write + fsync", raw.write(out / "raw.bin", hbytes, True)),
        ])
        res.ratio("hfai save / hfai_ref.save", t, "python hfai_ref.save (4 ranks)", "ckpt", "≥ 3")
        shutil.rmtree(out / "hfai_ckpt", ignore_errors=True)

    if want("pbg-write"):
        # PBG partition write: h5py create_dataset vs ckpt-pbg (neither fsyncs)
        h5src = full / "embeddings_node_0.v1.h5"
        with h5py.File(h5src, "r") as f:
            emb = f["embeddings"][...]

        def h5_py() -> float:
            t = time.perf_counter()
            with h5py.File(out / "py.h5", "w") as f:
                f.attrs["format_version"] = 1
                f.create_dataset("embeddings", data=emb)
            fd = os.open(out / "py.h5", os.O_RDONLY)  # ckpt's write_partition_file fsyncs; torchbiggraph does not
            os.fsync(fd)
            os.close(fd)
            return time.perf_counter() - t

        t = res.interleave(f"PBG partition write, {emb.nbytes / 2**20:.0f} MiB (both fsync)", emb.nbytes, [
            ("python h5py + fsync", h5_py),
            ("ckpt", lambda: timer.op("pbg-write", h5src, out / "ckpt.h5")),
            ("raw write + fsync", raw.write(out / "raw.bin", emb.nbytes, True)),
        ])
        res.ratio("PBG partition write / h5py (both fsync)", t, "python h5py + fsync", "ckpt", "≥ 1.5")
        del emb

    if want("recis-save"):
        # RecIS table save: a RecIS-style safetensors save in Python (save_file + fsync) vs ckpt vs raw + fsync
        from safetensors.numpy import save_file

        ids = cfg["recis_ids"]
        dim = 16
        idx = np.arange(ids * dim, dtype=np.int64)
        table = {"item@id": np.arange(ids, dtype=np.int64) * 7919 + 3}
        for k, name in enumerate(("embedding", "sparse_adamw_exp_avg", "sparse_adamw_exp_avg_sq")):
            table[f"item@{name}"] = (((idx + k) % 251).astype(np.float32) / 7.0).reshape(ids, dim)
        del idx
        rbytes = sum(a.nbytes for a in table.values())

        def recis_py() -> float:
            t = time.perf_counter()
            save_file(table, str(out / "recis_py.safetensors"))
            fd = os.open(out / "recis_py.safetensors", os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            return time.perf_counter() - t

        t = res.interleave(f"RecIS table save, {ids} ids × 16 + 2 AdamW slots, {rbytes / 2**20:.0f} MiB (fsync)", rbytes, [
            ("python safetensors save_file + fsync", recis_py),
            ("ckpt", lambda: timer.op("recis-save", ids, out / "recis_ckpt")),
            ("raw write + fsync", raw.write(out / "raw.bin", rbytes, True)),
        ])
        res.ratio("RecIS table save / raw write + fsync", t, "raw write + fsync", "ckpt", "≥ 0.8")
        res.ratio("RecIS table save / Python safetensors save_file + fsync", t,
                  "python safetensors save_file + fsync", "ckpt")
        del table
    shutil.rmtree(out, ignore_errors=True)


def durable(res: Results, work: Path, cfg: dict) -> None:
    """The durable .pt targets: ``durable_save``'s own interleaved run (raw, ckpt, torch.save; big and 20k)."""
    p = subprocess.run([str(DURABLE), "--dir", str(work / "durable"), "--reps", str(res.reps), "--mib", str(cfg["mib"]),
                        "--python", PY], check=True, capture_output=True, text=True, cwd=ROOT)
    text = p.stdout.strip()
    res.add(f"\n#### durable_save --reps {res.reps} --mib {cfg['mib']} (64 tensors; 20,000 × 10 KiB)\n\n{text}")
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0] and cells[0][0] in "dD.2":
            try:
                res.ratios.append((cells[0], float(cells[1]), cells[2]))
            except ValueError:
                pass


def scaling(res: Results, work: Path, cfg: dict) -> None:
    """ckpt alone: time and peak anonymous memory for open, full read and save, by size and by tensor count."""
    d = work / "scaling"
    d.mkdir(exist_ok=True)
    rows = ["\n#### Scaling (ckpt library calls, warm cache; median of 3 — open and read in one process, each save in its own; peak anonymous memory "
            "added by the op)\n",
            "| file | tensors | open s | open anon MiB | full read s | read GB/s | read anon MiB | save s | "
            "save GB/s | save anon MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    points = [(f"{m} MiB", 64, (m << 20) // 64) for m in cfg["scale_mib"]]
    points += [(f"{n // 1000}k × 1 KiB", n, 1024) for n in (1000, 20000, 200000)]
    for label, count, each in points:
        src = d / "src.pt"
        run([PY, HERE / "pt_many_tensors.py", src, "--tensors", count, "--bytes", each], stdout=subprocess.DEVNULL)
        nbytes = count * each
        cells = [label, str(count)]
        for op in ("pt-list", "pt-read", "pt-save"):
            if op == "pt-save" and shutil.disk_usage(d).free < nbytes + (4 << 30):
                cells += ["–", "–", "– (disk)"]  # a save needs the file's size again, plus a margin for others
                continue
            if op == "pt-save":  # 3 processes, each saving into a fresh file: never two copies on disk
                lines = []
                for _ in range(3):
                    p = subprocess.run([str(TIMER), "--anon", op, str(src), str(d / "dst.pt")], check=True,
                                       capture_output=True, text=True)
                    (d / "dst.pt").unlink(missing_ok=True)
                    lines += [x.split() for x in p.stdout.splitlines()]
            else:
                p = subprocess.run([str(TIMER), "--anon", op, str(src), "3"], check=True, capture_output=True,
                                   text=True)
                lines = [x.split() for x in p.stdout.splitlines()]
            secs = statistics.median(float(x[1]) for x in lines)
            anon = max(int(x[3]) for x in lines)
            cells.append(f"{secs:.4f}")
            if op != "pt-list":
                cells.append(f"{nbytes / secs / 1e9:.2f}")
            cells.append(f"{anon / 2**20:.1f}")
        rows.append("| " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
        for p in (src, d / "dst.pt"):
            p.unlink(missing_ok=True)
    res.add("\n".join(rows))
    shutil.rmtree(d, ignore_errors=True)


def convert(res: Results, timer: Timer, work: Path, cfg: dict) -> None:
    """Peak anonymous memory of every ``ckpt convert`` between the dense formats, and of every reshard."""
    import torch

    d = work / "convert"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    full = work / "full"
    run([PY, HERE / "read_workloads.py", full, "--mib", cfg["mib"]], stdout=subprocess.DEVNULL)
    src = full / "model.pt"
    sd = torch.load(src, mmap=True, weights_only=True)
    largest = max(t.numel() * t.element_size() for t in sd.values())
    del sd
    limit = largest + (64 << 20)
    rows = [f"\n#### Anonymous memory of ckpt convert / reshard ({size_of(src) / 2**20:.0f} MiB, 64 tensors, "
            f"largest {largest / 2**20:.0f} MiB; limit largest + 64 MiB = {limit / 2**20:.0f} MiB)\n",
            "| from | to | seconds | peak anon MiB | within limit |", "|---|---|---|---|---|"]
    ok = True

    def measure(label_from: str, label_to: str, cmd: list, lim: int) -> None:
        nonlocal ok
        secs, anon = peak_anon([str(c) for c in cmd])
        good = anon <= lim
        ok &= good
        rows.append(f"| {label_from} | {label_to} | {secs:.2f} | {anon / 2**20:.1f} | {'yes' if good else 'NO'} |")
        print(rows[-1], flush=True)

    srcs = {"torch": src, "safetensors": d / "src.safetensors", "distcp": d / "src_dcp", "hfai": d / "src_hfai"}
    for fmt in ("safetensors", "distcp", "hfai"):
        extra = ["--world-size", "2"] if fmt != "safetensors" else []
        measure("torch", fmt, [TOOL, "convert", "-q", "--to", fmt, *extra, src, srcs[fmt]], limit)
    for a, pa in srcs.items():
        for b in srcs:
            if a == b or a == "torch":
                continue
            dst = d / f"{a}_to_{b}"
            extra = ["--world-size", "2"] if b in ("distcp", "hfai") else []
            measure(a, b, [TOOL, "convert", "-q", "--to", b, *extra, pa, dst], limit)
            if dst.is_dir():
                shutil.rmtree(dst)
            else:
                dst.unlink(missing_ok=True)
    for fmt in ("distcp", "hfai"):
        measure(fmt, f"{fmt} (reshard 2 → 3)", [TOOL, "reshard", "-q", "--world-size", "3", srcs[fmt], d / f"re_{fmt}"],
                limit)
    # RecIS: the table checkpoint of the read workloads; its largest tensor is one slot
    recis = work / "recis_src"
    if not recis.exists():
        timer.op("recis-save", cfg["recis_ids"], recis)
    rlimit = cfg["recis_ids"] * 16 * 4 + (64 << 20)
    measure("recis", "safetensors", [TOOL, "convert", "-q", "--to", "safetensors", recis, d / "recis.safetensors"],
            rlimit)
    measure("safetensors (RecIS tables)", "recis",
            [TOOL, "convert", "-q", "--to", "recis", d / "recis.safetensors", d / "recis_back"], rlimit)
    measure("recis", "recis (reshard 1 → 2)", [TOOL, "reshard", "-q", "--world-size", "2", recis, d / "re_recis"],
            rlimit)
    rows.append(f"\nEvery pair within largest tensor + 64 MiB: {'yes' if ok else 'NO'}.")
    res.add("\n".join(rows))
    shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------


def machine() -> str:
    def sh(cmd: str) -> str:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()

    import torch

    cpu = sh("lscpu | sed -n 's/^Model name: *//p'") or platform.processor()
    mem = sh("free -g | awk '/Mem:/ {print $2}'")
    fs = sh("df -T /tmp | awk 'NR==2 {print $2}'")
    return (f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; commit "
            f"{sh('git -C ' + str(ROOT) + ' rev-parse --short HEAD')}\n"
            f"- CPU: {cpu}, {os.cpu_count()} cores; memory {mem} GiB; kernel {platform.release()}; scratch file "
            f"system {fs}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n"
            f"- Python {platform.python_version()}, torch {torch.__version__}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1/8 of the issue's sizes (about 15 minutes)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckpt-compare"))
    ap.add_argument("--out", type=Path, default=ROOT / "benches" / "RESULTS.md")
    ap.add_argument("--only", default="reads,writes,durable,scaling,convert",
                    help="sections, or single write workloads: " + ",".join(WRITE_WORKLOADS))
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache read runs")
    ap.add_argument("--keep", action="store_true", help="keep the generated workloads under --dir")
    args = ap.parse_args()
    cfg = (
        {"mib": 256, "recis_ids": 1_000_000, "dcp_ranks": [64, 256], "pt200k": False, "scale_mib": [64, 512, 4096]}
        if args.quick
        else {"mib": 2048, "recis_ids": 10_000_000, "dcp_ranks": [64, 256, 1024], "pt200k": True,
              "scale_mib": [64, 512, 4096]}
    )
    only = set(args.only.split(","))
    work: Path = args.dir
    work.mkdir(parents=True, exist_ok=True)
    res = Results(args.reps)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up the scratch directory when stopped
    raw = Raw()
    timer = Timer()
    started = time.time()
    try:
        sections = {
            "reads": lambda: reads(res, timer, raw, work, cfg, not args.no_cold),
            "writes": lambda: writes(res, timer, raw, work, cfg, only),
            "durable": lambda: durable(res, work, cfg),
            "scaling": lambda: scaling(res, work, cfg),
            "convert": lambda: convert(res, timer, work, cfg),
        }
        if only & set(WRITE_WORKLOADS):
            only.add("writes-some")
        for name, section in sections.items():
            if name in only or (name == "writes" and "writes-some" in only):
                try:
                    section()
                except (Exception, SystemExit) as e:  # one failing section must not lose the others' results
                    res.add(f"\n**section {name} failed**: {e}")
                    timer.close()
                    timer = Timer()
    finally:
        timer.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    table = ["| ratio (speed, > 1: ckpt faster) | value | target |", "|---|---|---|"]
    table += [f"| {w} | {r:.2f} | {t} |" for w, r, t in res.ratios]
    mode = "quick (1/8 sizes)" if args.quick else "full"
    text = (f"# Side-by-side results\n\nWritten by `benches/compare{' --quick' if args.quick else ''}` "
            f"({mode}, {args.reps} interleaved repetitions, {(time.time() - started) / 60:.0f} min). Ratios are "
            f"of medians from the same run; on a shared machine compare ratios, not seconds.\n\n{machine()}\n\n"
            f"## Ratios\n\n" + "\n".join(table) + "\n\n## Measurements\n" + "\n".join(res.sections) + "\n")
    args.out.write_text(text)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
