#!/usr/bin/env python3
"""ckpt inside the training job (issue 38 point 6): ``dcp.save``, ``dcp.async_save`` and ``dcp.load`` of an FSDP2
model and its AdamW state from a 2-rank ``torchrun`` job (gloo, CPU), ckpt's storage against torch's, side by side
in one run, interleaved (A B A B …, one warm-up each, then ``--reps``; medians).

Rows (every one a DCP call of both ranks; a run's wall time is the slowest rank's, from a barrier to its end):

* ``dcp.save`` with ``ckpt.dcp.Writer`` against ``FileSystemWriter(sync_files=True)`` (both fsync), each run a
  fresh directory;
* the blocking time of ``dcp.async_save`` (what the training thread waits for) with each, thread-based and
  process-based checkpointers (the save's end is waited for outside the timing, before the next run);
* ``dcp.load`` into the job's own state dict with ``ckpt.dcp.Reader`` against ``FileSystemReader``, each on its
  own writer's checkpoint (and ckpt's reader on ``FileSystemWriter``'s), warm page cache, then cold
  (``posix_fadvise(DONTNEED)`` on every file of the checkpoint before every run of every side);
* the model's Hugging Face shards: ``ckpt.dcp.Writer(path, to="hf")`` against ``HuggingFaceStorageWriter(path,
  save_distributed=True, enable_consolidation=True)``;
* saves and loads to a local S3 server (moto, started by the driver): ``ckpt.dcp.Writer("s3://…")`` /
  ``ckpt.dcp.Reader`` against ``FsspecWriter``/``FsspecReader`` (s3fs) and s3torchconnector's
  ``S3StorageWriter``/``S3StorageReader`` (endpoint from ``AWS_ENDPOINT_URL``, path-style addressing), at a
  smaller state (``--s3-mib``: moto parses every body in Python, ~0.08 GB/s);
* for every save, each rank's peak extra memory (``VmHWM`` after the save minus ``VmRSS`` before it, the high-water
  mark reset through ``/proc/self/clear_refs`` first) against its largest item + 64 MiB, and the CPU seconds
  (user, system: ``getrusage`` of both rank processes, every thread) against the wall time, with the S3 server's.

``benches/compare --only train [--quick]`` runs it (``--quick``: a 64 MiB state) and writes the section
"## Training (issue 38)" of ``benches/RESULTS.md``. By hand::

    python benches/python/train_compare.py --mib 64 --s3-mib 32 --reps 3 --dir /tmp/train-bench

The worker (``worker`` subcommand) runs under ``torchrun --standalone --nproc-per-node 2`` and writes its
measurements as JSON; the driver starts the S3 server and the job, and turns the JSON into tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

HERE = Path(__file__).resolve().parent
PY = sys.executable
HEADING = "## Training (issue 38)"
BUCKET = "bench"
REGION = "us-east-1"
MIB = 2**20


# --------------------------------------------------------------------------------------------------------
# the worker: one rank of the torchrun job


def proc_status(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> None:
    """Resets ``VmHWM`` to the current RSS (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``)."""
    Path("/proc/self/clear_refs").write_text("5")


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drop_cache(path: Path) -> None:
    """``posix_fadvise(DONTNEED)`` on every file under ``path`` (the pages of a file just written are flushed
    by the writers' fsync; the loads then read from the disk)."""
    for p in path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Job:
    """The rank's model, optimizer state and measurement helpers."""

    def __init__(self, mib: int) -> None:
        import datetime

        import torch
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=20))
        self.dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # AdamW keeps two moments per parameter: parameters are a third of the state. Square float32 layers.
        dim = 4096 if mib >= 1024 else 1024 if mib >= 32 else 256
        layers = max(2, round(mib * MIB / 3 / (dim * dim * 4)))
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(layers)])
        mesh = init_device_mesh("cpu", (self.world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model(torch.randn(2, dim)).square().mean().backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        model_sd, optim_sd = get_state_dict(model, optim)
        self.state = {"model": model_sd, "optim": optim_sd}
        self.model_sd = model_sd
        self.shape = f"{layers} × Linear({dim}, {dim})"
        self.save_group = dist.new_group(backend="gloo")  # async saves' collectives, beside training's
        gc.collect()

        def local_sizes(sd: Any) -> List[int]:
            out = []
            for v in sd.values():
                if isinstance(v, dict):
                    out += local_sizes(v)
                elif isinstance(v, torch.Tensor):
                    t = v.to_local() if hasattr(v, "to_local") else v
                    out.append(t.numel() * t.element_size())
            return out

        sizes = local_sizes(self.state)
        info = {"bytes": sum(sizes), "largest": max(sizes), "model_bytes": sum(local_sizes(model_sd)),
                "items": len(sizes)}
        self.infos: List[Dict[str, int]] = [{} for _ in range(self.world)]
        dist.all_gather_object(self.infos, info)

    def measure(self, f: Callable[[], Optional[Callable[[], None]]], server: int = 0) -> Dict[str, Any]:
        """Runs ``f`` on every rank from a barrier; returns, gathered from every rank: wall seconds (the
        slowest rank's), each rank's peak extra memory, user and system CPU seconds, and the server's CPU
        seconds (``server``: its pid). ``f`` may return a callable waited for after the timing (an async
        save's end); ``done`` is the wall time until then."""
        gc.collect()
        self.dist.barrier()
        reset_peak()
        rss = proc_status("VmRSS")
        ru = resource.getrusage(resource.RUSAGE_SELF)
        srv = server_cpu(server) if server and self.rank == 0 else 0.0
        t = time.perf_counter()
        finish = f()
        wall = time.perf_counter() - t
        ru2 = resource.getrusage(resource.RUSAGE_SELF)
        extra = proc_status("VmHWM") - rss
        if finish is not None:
            finish()
        done = time.perf_counter() - t
        srv = server_cpu(server) - srv if server and self.rank == 0 else 0.0
        mine = {"wall": wall, "done": done, "extra": extra, "user": ru2.ru_utime - ru.ru_utime,
                "sys": ru2.ru_stime - ru.ru_stime, "server": srv}
        every: List[Dict[str, Any]] = [{} for _ in range(self.world)]
        self.dist.all_gather_object(every, mine)
        return {"wall": max(m["wall"] for m in every), "done": max(m["done"] for m in every),
                "extra": [m["extra"] for m in every], "user": sum(m["user"] for m in every),
                "sys": sum(m["sys"] for m in every), "server": every[0]["server"]}

    def interleave(self, title: str, nbytes: int, sides: List[tuple], reps: int,
                   before: Optional[Callable[[str], None]] = None, server: int = 0) -> Dict[str, Any]:
        """``sides``: (name, f) pairs, run A B A B … after one warm-up each; ``before(name)`` untimed before
        each run (rank 0 only, then a barrier)."""
        runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name, _ in sides}
        for i in range(reps + 1):
            for name, f in sides:
                if before is not None:
                    if self.rank == 0:
                        before(name)
                    self.dist.barrier()
                m = self.measure(f, server)
                if i:
                    runs[name].append(m)
                if self.rank == 0:
                    print(f"  {title} / {name}{' (warm-up)' if not i else ''}: {m['wall']:.3f} s", flush=True)
        return {"title": title, "nbytes": nbytes, "runs": runs}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    import ckpt.dcp

    if args.part == "url":
        job = Job(args.s3_mib)
        out = {"infos": job.infos, "shape": job.shape, "torch": torch.__version__, "rows": [], "world": job.world,
               "notes": []}
        url_rows(job, args, out)
        if job.rank == 0:
            Path(args.json).write_text(json.dumps(out))
        job.dist.destroy_process_group()
        return
    job = Job(args.mib)
    rank, reps, work = job.rank, args.reps, Path(args.dir)
    total = sum(i["bytes"] for i in job.infos)
    rows: List[Dict[str, Any]] = []
    out: Dict[str, Any] = {"infos": job.infos, "shape": job.shape, "torch": torch.__version__, "rows": rows,
                           "world": job.world, "notes": []}

    def fresh(path: Path) -> Callable[[str], None]:
        def before(name: str) -> None:
            shutil.rmtree(path / slug(name), ignore_errors=True)
        return before

    def save(make: Callable[[Path], Any], path: Path, sd: Any = None) -> Callable[[], None]:
        def run() -> None:
            dcp.save(job.state if sd is None else sd, storage_writer=make(path))
        return run

    def async_save(make: Callable[[Path], Any], path: Path, kind: Any) -> Callable[[], Callable[[], None]]:
        def run() -> Callable[[], None]:
            fut = dcp.async_save(job.state, storage_writer=make(path), process_group=job.save_group,
                                 async_checkpointer_type=kind)
            return fut.result
        return run

    saves = work / "save"
    ckpt_w, torch_w = "ckpt.dcp.Writer", "FileSystemWriter(sync_files=True)"
    local = {ckpt_w: lambda p: ckpt.dcp.Writer(p), torch_w: lambda p: dcp.FileSystemWriter(p, sync_files=True)}
    rows.append(job.interleave(f"dcp.save, {total / MIB:.0f} MiB, {job.world} ranks", total, [
        (name, save(make, saves / slug(name))) for name, make in local.items()], reps, fresh(saves)))

    for kind in (AsyncCheckpointerType.THREAD, AsyncCheckpointerType.PROCESS):
        d = work / f"async-{kind.value}"
        try:
            rows.append(job.interleave(f"dcp.async_save ({kind.value}), blocking time", total, [
                (name, async_save(make, d / slug(name), kind)) for name, make in local.items()], reps, fresh(d)))
        except Exception as e:  # noqa: BLE001 - reported in the table, the other rows go on
            out["notes"].append(f"dcp.async_save ({kind.value}) failed: {type(e).__name__}: {e}")
            if rank == 0:
                print(out["notes"][-1], flush=True)
        finally:
            if rank == 0:
                shutil.rmtree(d, ignore_errors=True)

    def load(make: Callable[[Path], Any], path: Path) -> Callable[[], None]:
        def run() -> None:
            dcp.load(job.state, storage_reader=make(path))
        return run

    loads = [(f"dcp.load, FileSystemReader", load(dcp.FileSystemReader, saves / slug(torch_w))),
             (f"dcp.load, ckpt.dcp.Reader", load(ckpt.dcp.Reader, saves / slug(ckpt_w))),
             (f"dcp.load, ckpt.dcp.Reader of FileSystemWriter's checkpoint",
              load(ckpt.dcp.Reader, saves / slug(torch_w)))]
    rows.append(job.interleave(f"dcp.load, {total / MIB:.0f} MiB, warm page cache", total, loads, reps))
    if not args.no_cold:
        where = {loads[0][0]: saves / slug(torch_w), loads[1][0]: saves / slug(ckpt_w),
                 loads[2][0]: saves / slug(torch_w)}
        rows.append(job.interleave(f"dcp.load, {total / MIB:.0f} MiB, cold (posix_fadvise DONTNEED before each run)",
                                   total, loads, reps, lambda name: drop_cache(where[name])))
    if rank == 0:
        shutil.rmtree(saves, ignore_errors=True)

    # Hugging Face shards of the model (parameters only: what HuggingFaceStorageWriter takes).
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    model_total = sum(i["model_bytes"] for i in job.infos)
    hf = work / "hf"
    ckpt_hf, torch_hf = 'ckpt.dcp.Writer(to="hf")', "HuggingFaceStorageWriter(enable_consolidation=True)"
    sides = [(torch_hf, save(lambda p: HuggingFaceStorageWriter(str(p), save_distributed=True,
                                                                 enable_consolidation=True), hf / slug(torch_hf),
                             job.model_sd))]
    try:
        ckpt.dcp.Writer(str(hf / "probe"), to="hf")
        sides.insert(0, (ckpt_hf, save(lambda p: ckpt.dcp.Writer(p, to="hf"), hf / slug(ckpt_hf), job.model_sd)))
    except TypeError:
        out["notes"].append("ckpt HF writer not available yet")
        if rank == 0:
            print("ckpt HF writer not available yet", flush=True)
    rows.append(job.interleave(f"Hugging Face shards of the model, {model_total / MIB:.0f} MiB", model_total, sides,
                               reps, fresh(hf)))
    if rank == 0:
        shutil.rmtree(hf, ignore_errors=True)

    if rank == 0:
        Path(args.json).write_text(json.dumps(out))
    job.dist.destroy_process_group()


def url_rows(job: Job, args: argparse.Namespace, out: Dict[str, Any]) -> None:
    """Saves and loads to the S3 server at ``args.endpoint`` (a job of its own, of ``--s3-mib``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    from s3torchconnector import S3ClientConfig
    from s3torchconnector.dcp import S3StorageReader, S3StorageWriter

    import ckpt.dcp

    total = sum(i["bytes"] for i in job.infos)
    kw = {"key": os.environ["AWS_ACCESS_KEY_ID"], "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
          "skip_instance_cache": True, "client_kwargs": {"endpoint_url": args.endpoint, "region_name": REGION}}
    config = S3ClientConfig(force_path_style=True)
    url = f"s3://{BUCKET}/train"
    sides = {
        "ckpt.dcp.Writer": (lambda: ckpt.dcp.Writer(f"{url}/ckpt"), lambda: ckpt.dcp.Reader(f"{url}/ckpt")),
        "FsspecWriter (s3fs)": (lambda: FsspecWriter(f"{url}/fsspec", **kw), lambda: FsspecReader(f"{url}/fsspec", **kw)),
        "S3StorageWriter (s3torchconnector)": (lambda: S3StorageWriter(REGION, f"{url}/s3tc", s3client_config=config),
                                               lambda: S3StorageReader(REGION, f"{url}/s3tc", s3client_config=config)),
    }

    def save(make: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            dcp.save(job.state, storage_writer=make())
        return run

    def load(make: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            dcp.load(job.state, storage_reader=make())
        return run

    server = args.server_pid
    out["rows"].append(job.interleave(f"URL: dcp.save to s3:// on moto, {total / MIB:.0f} MiB", total,
                                      [(n, save(w)) for n, (w, _) in sides.items()], args.s3_reps, server=server))
    readers = {"ckpt.dcp.Writer": "ckpt.dcp.Reader", "FsspecWriter (s3fs)": "FsspecReader (s3fs)",
               "S3StorageWriter (s3torchconnector)": "S3StorageReader (s3torchconnector)"}
    out["rows"].append(job.interleave(f"URL: dcp.load from s3:// on moto, {total / MIB:.0f} MiB", total,
                                      [(readers[n], load(r)) for n, (_, r) in sides.items()], args.s3_reps,
                                      server=server))


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


# --------------------------------------------------------------------------------------------------------
# the driver


def run(res: Any, work: Path, mib: int, s3_mib: int, reps: int, s3_reps: int, cold: bool = True,
        env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Starts moto and the 2-rank job, adds its tables and targets to ``res`` (compare.py's ``Results``)."""
    import s3_compare

    work.mkdir(parents=True, exist_ok=True)
    common = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(Path(__file__)),
              "worker", "--mib", str(mib), "--s3-mib", str(s3_mib), "--reps", str(reps), "--s3-reps", str(s3_reps),
              "--dir", str(work / "job")]
    local = work / "train.json"
    cmd = common + ["--part", "local", "--json", str(local)] + ([] if cold else ["--no-cold"])
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)
    data = json.loads(local.read_text())
    if s3_mib:
        url = work / "train-url.json"
        moto = s3_compare.Moto(work / "moto.log")
        try:
            moto.bucket(BUCKET)
            run_env = dict(env or os.environ, **s3_compare.ENV, AWS_ENDPOINT_URL=moto.endpoint)
            cmd = common + ["--part", "url", "--json", str(url), "--endpoint", moto.endpoint, "--server-pid",
                            str(moto.proc.pid)]
            print("$ " + " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, env=run_env)
        finally:
            moto.close()
        extra = json.loads(url.read_text())
        data["rows"] += extra["rows"]
        data["notes"] += extra["notes"]
        data["s3_infos"], data["s3_shape"] = extra["infos"], extra["shape"]
    tables(res, data)
    return data


def med(runs: List[Dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def tables(res: Any, data: Dict[str, Any]) -> None:
    cores = os.cpu_count() or 1
    for row in data["rows"]:
        title, nbytes, runs = row["title"], row["nbytes"], row["runs"]
        lines = [f"\n#### {title} — {len(next(iter(runs.values())))} repetitions\n",
                 "| side | median s | min–max s | GB/s | CPU user + sys s (both ranks, median) | cores busy | "
                 "peak extra memory per rank, MiB (max) | server CPU s |",
                 "|---|---|---|---|---|---|---|---|"]
        for name, rs in runs.items():
            walls = [r["wall"] for r in rs]
            m = statistics.median(walls)
            user, sys_ = med(rs, "user"), med(rs, "sys")
            extra = max(max(r["extra"]) for r in rs)
            srv = med(rs, "server")
            done = f" (done {med(rs, 'done'):.3f})" if "async" in title else ""
            lines.append(f"| {name} | {m:.3f}{done} | {min(walls):.3f}–{max(walls):.3f} | {nbytes / m / 1e9:.2f} | "
                         f"{user:.2f} + {sys_:.2f} | {(user + sys_) / m:.2f} of {cores} | {extra / MIB:.0f} | "
                         f"{srv:.1f} |" if srv else
                         f"| {name} | {m:.3f}{done} | {min(walls):.3f}–{max(walls):.3f} | {nbytes / m / 1e9:.2f} | "
                         f"{user:.2f} + {sys_:.2f} | {(user + sys_) / m:.2f} of {cores} | {extra / MIB:.0f} | – |")
        res.add("\n".join(lines))
    for note in data["notes"]:
        res.target(note, "not measured", "", None)

    def ratio(what: str, row: Optional[Dict[str, Any]], base: str, ours: str, target: str) -> None:
        if row is None or base not in row["runs"] or ours not in row["runs"]:
            res.target(what, "not measured", target, None)
            return
        r = med(row["runs"][base], "wall") / med(row["runs"][ours], "wall")
        res.target(what, f"{r:.2f}× ({med(row['runs'][ours], 'wall'):.3f} s / {med(row['runs'][base], 'wall'):.3f} s)",
                   target, r >= float(target[1:].rstrip("×").strip()) if target else None)

    def find(prefix: str) -> Optional[Dict[str, Any]]:
        return next((r for r in data["rows"] if r["title"].startswith(prefix)), None)

    ckpt_w, torch_w = "ckpt.dcp.Writer", "FileSystemWriter(sync_files=True)"
    ratio("save: ckpt.dcp.Writer / FileSystemWriter (both fsync)", find("dcp.save"), torch_w, ckpt_w, "≥ 1.5")
    ratio("async_save (thread) blocking time: ckpt / FileSystemWriter", find("dcp.async_save (thread)"), torch_w,
          ckpt_w, "≥ 1")
    ratio("async_save (process) blocking time: ckpt / FileSystemWriter", find("dcp.async_save (process)"), torch_w,
          ckpt_w, "≥ 1")
    warm = next((r for r in data["rows"] if "warm page cache" in r["title"]), None)
    ratio("load, warm: ckpt.dcp.Reader / FileSystemReader", warm, "dcp.load, FileSystemReader",
          "dcp.load, ckpt.dcp.Reader", "≥ 5")
    cold = next((r for r in data["rows"] if "cold" in r["title"]), None)
    if cold is not None:
        ratio("load, cold: ckpt.dcp.Reader / FileSystemReader", cold, "dcp.load, FileSystemReader",
              "dcp.load, ckpt.dcp.Reader", "≥ 5")
    ratio("HF shards: ckpt.dcp.Writer(to=\"hf\") / HuggingFaceStorageWriter(enable_consolidation=True)",
          find("Hugging Face"), "HuggingFaceStorageWriter(enable_consolidation=True)", 'ckpt.dcp.Writer(to="hf")',
          "≥ 2")
    url_save = find("URL: dcp.save")
    ratio("URL save: ckpt / S3StorageWriter (s3torchconnector)", url_save, "S3StorageWriter (s3torchconnector)",
          ckpt_w, "≥ 1")
    ratio("URL save: ckpt / FsspecWriter (s3fs)", url_save, "FsspecWriter (s3fs)", ckpt_w, "")
    url_load = find("URL: dcp.load")
    ratio("URL load: ckpt / S3StorageReader (s3torchconnector)", url_load, "S3StorageReader (s3torchconnector)",
          "ckpt.dcp.Reader", "")
    ratio("URL load: ckpt / FsspecReader (s3fs)", url_load, "FsspecReader (s3fs)", "ckpt.dcp.Reader", "")
    # Peak extra memory per rank of every save against its largest item + 64 MiB.
    largest = max(i["largest"] for i in data["infos"])
    s3_largest = max(i["largest"] for i in data.get("s3_infos", data["infos"]))
    for row in data["rows"]:
        if "load" in row["title"] or "async" in row["title"]:
            continue
        limit = (s3_largest if row["title"].startswith("URL") else largest) + 64 * MIB
        for name, rs in row["runs"].items():
            extra = max(max(r["extra"]) for r in rs)
            ours = name.startswith("ckpt")
            res.target(f"peak extra memory per rank, {row['title'].split(',')[0]}, {name}",
                       f"{extra / MIB:.0f} MiB (largest item {(limit - 64 * MIB) / MIB:.0f} MiB)",
                       f"≤ {limit / MIB:.0f} MiB" if ours else "", (extra <= limit) if ours else None)


def section(res: Any, header: str) -> str:
    rows = ["| what | measured | required | met |", "|---|---|---|---|"]
    rows += [f"| {w} | {v} | {t} | {m} |" for w, v, t, m in res.ratios]
    met = sum(r[3] == "met" for r in res.ratios)
    n = sum(1 for r in res.ratios if r[3])
    return (f"{HEADING}: {met} of {n} targets met\n\n{header}\n\n" + "\n".join(rows) + "\n\n" + NOTE + "\n"
            + "\n".join(res.sections) + "\n")


NOTE = ("Each row is one `torchrun --nproc-per-node 2` job (gloo, CPU) of an FSDP2 (`fully_shard`) model and its "
        "AdamW state (`get_state_dict`: DTensor shards, `param_groups`), both ranks on this machine's cores and "
        "disk, measured while other engineers' builds shared the machine (the load average above): take the "
        "ratios, from interleaved runs, not the seconds. A run's seconds are the slowest rank's, from a barrier to "
        "the end of its DCP call; the async rows time what `dcp.async_save` blocks for (\"done\": until its "
        "future's result; both include torch's staging copy of the state). The CPU columns add both ranks' user "
        "and system seconds (every thread; the process-based async checkpointer's own process is not in them), "
        "and \"cores busy\" is that over the wall time. Peak extra memory: each rank's `VmHWM` after the call "
        "minus its `VmRSS` before it (the high-water mark reset first), the largest over ranks and runs; it counts "
        "file pages mapped by the call too (`ckpt.dcp.Reader` maps the data files: its loads show the rank's "
        "whole state) and the async stagers' copy of the state; the target applies to the saves. "
        "`HuggingFaceStorageWriter` fsyncs its sharded files but not the consolidated ones; ckpt's are durable. "
        "The URL rows use a smaller state: moto (Python, in memory, the same server for every side) holds every "
        "client to ~0.08 GB/s (see the object-storage section); \"server CPU s\" is moto's per run.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", nargs="?", default="driver", choices=["driver", "worker"])
    ap.add_argument("--mib", type=int, default=int(os.environ.get("CKPT_BENCH_TRAIN_MIB", 2048)),
                    help="model + AdamW state, all ranks (default 2048, or $CKPT_BENCH_TRAIN_MIB)")
    ap.add_argument("--s3-mib", type=int, default=256, help="the state of the URL rows (0: no URL rows)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--s3-reps", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/ckpt-train-bench")
    ap.add_argument("--json", default="")
    ap.add_argument("--endpoint", default="")
    ap.add_argument("--server-pid", type=int, default=0)
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--part", default="local", choices=["local", "url"], help="worker: which rows")
    args = ap.parse_args()
    if args.command == "worker":
        worker(args)
        return 0
    sys.path.insert(0, str(HERE))
    from compare import Results

    res = Results(args.reps)
    run(res, Path(args.dir), args.mib, args.s3_mib, args.reps, args.s3_reps, not args.no_cold)
    print(section(res, ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
