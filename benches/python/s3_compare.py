#!/usr/bin/env python3
"""Object storage side by side (issue 28): ckpt against torch's fsspec storage (s3fs) on the same S3-compatible
server, in one run, interleaved. The server is moto's server mode on 127.0.0.1 (from ``.venv``), started here
and stopped at the end; both sides reach it through the same endpoint. The DCP save and load are measured
again on s3s-fs (a Rust S3 server over a directory, installed into ``target/s3s-fs`` by ``benches/compare``),
whose requests cost little: moto parses every body in Python and serves a ranged GET in the time of the whole
object, which bounds both clients there.

* DCP save of the ``model.pt`` state dict (``read_workloads.py``: 1 GiB, 8 tensors): ``dcp.save`` with
  ``FsspecWriter`` (the state dict already in memory) against ``ckpt convert model.pt s3://… --to distcp``
  (a whole process: reads the file, writes, uploads, commits);
* DCP load of that checkpoint: ``dcp.load`` with ``FsspecReader`` into preallocated tensors against
  ``ckpt verify --deep s3://…`` (fetches every object and reads and checks every byte);
* listing a 20,000-tensor ``.pt`` on S3: ``ckpt inspect --verbose`` (requests, bytes, seconds) against
  ``torch.load(weights_only=True, mmap=False)`` of the object opened through s3fs;
* a region read: ``ckpt cat --verbose s3://… KEY`` of one tensor of the DCP checkpoint saved above (its data
  files are fetched as they are read), bytes fetched (its ``.metadata`` included) / the tensor's bytes.

Run through ``benches/compare --only s3`` (``--quick``: 128 MiB); it writes the section "## Object storage
(issue 28)" of ``benches/RESULTS.md`` and leaves every other section as it is.
"""

from __future__ import annotations

import gc
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List

HERE = Path(__file__).resolve().parent
PY = sys.executable
HEADING = "## Object storage (issue 28)"
ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1",
       "AWS_ALLOW_HTTP": "true"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(proc: subprocess.Popen, up: Callable[[], Any], what: str, log: Path) -> None:
    """Waits until ``up()`` stops raising ``OSError`` (60 s at most, or until ``proc`` exits)."""
    deadline = time.time() + 60
    while True:
        try:
            up()
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"{what} did not start: {log.read_text()}")
            time.sleep(0.2)


class Moto:
    """moto's S3 server on a free port of 127.0.0.1 (bounded start-up wait), stopped by ``close``."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([PY, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=log.open("w"), stderr=subprocess.STDOUT)
        wait_up(self.proc, lambda: urllib.request.urlopen(self.endpoint, timeout=2).read(), "moto's server", log)

    def bucket(self, name: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=10).read()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class S3sFs:
    """s3s-fs (the `s3s` project's S3 server over a directory, Rust; `benches/compare --only s3` installs it into
    ``target/s3s-fs``) on a free port of 127.0.0.1, stopped by ``close``: a second server whose requests cost
    little, so that the clients' own speed shows (moto parses every body in Python)."""

    def __init__(self, binary: Path, root: Path, log: Path) -> None:
        self.port = free_port()
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(self.port), "--access-key",
                                      ENV["AWS_ACCESS_KEY_ID"], "--secret-key", ENV["AWS_SECRET_ACCESS_KEY"], str(root)],
                                     stdout=log.open("w"), stderr=subprocess.STDOUT)
        wait_up(self.proc, lambda: socket.create_connection(("127.0.0.1", self.port), timeout=2).close(), "s3s-fs", log)

    def bucket(self, name: str) -> None:
        (self.root / name).mkdir(exist_ok=True)

    def close(self) -> None:
        Moto.close(self)  # type: ignore[arg-type]


def timed(f: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        gc.collect()
        t = time.perf_counter()
        f()
        return time.perf_counter() - t

    return run


def run(res: Any, work: Path, mib: int, tool: Path) -> Dict[str, str]:
    """Adds the tables to ``res`` (compare.py's ``Results``); returns the listing's transfer line."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    import fsspec

    work.mkdir(parents=True, exist_ok=True)
    full = work / "full"
    subprocess.run([PY, HERE / "read_workloads.py", full, "--mib", str(mib), "--parts", "model"], check=True,
                   stdout=subprocess.DEVNULL)
    pt20k = work / "pt20k.pt"
    if not pt20k.exists():
        subprocess.run([PY, HERE / "pt_many_tensors.py", pt20k, "--tensors", "20000", "--bytes", "10240"],
                       check=True, stdout=subprocess.DEVNULL)
    model = full / "model.pt"
    moto = Moto(work / "moto.log")
    try:
        moto.bucket("bench")
        env = dict(os.environ, **ENV, AWS_ENDPOINT_URL=moto.endpoint)
        os.environ.update(ENV)
        kw = {"key": ENV["AWS_ACCESS_KEY_ID"], "secret": ENV["AWS_SECRET_ACCESS_KEY"], "skip_instance_cache": True,
              "client_kwargs": {"endpoint_url": moto.endpoint, "region_name": "us-east-1"}}
        sd = torch.load(model, mmap=True, weights_only=True)
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())

        ckpt = runner(tool, env)
        save_load(res, "moto", moto.proc.pid, kw, sd, nbytes, model, ckpt)
        ckpt("convert", "-q", str(pt20k), "s3://bench/pt20k.pt", "--to", "torch")
        fs = fsspec.filesystem("s3", **kw)

        def torch_load() -> None:
            with fs.open("bench/pt20k.pt", "rb") as f:
                torch.load(f, weights_only=True)

        line: Dict[str, str] = {}

        def listing() -> None:
            out = ckpt("inspect", "--verbose", "s3://bench/pt20k.pt")
            line["transfer"] = next(l for l in out.splitlines() if l.startswith("fetched "))

        t = res.interleave(f"s3: list a 20,000-tensor .pt ({pt20k.stat().st_size / 2**20:.0f} MiB)", 0, [
            ("torch.load of the object through s3fs", timed(torch_load)),
            ("ckpt inspect s3://…", timed(listing)),
        ], reps=3)
        res.ratio("s3: list a 20,000-tensor .pt, ckpt / torch.load through s3fs", t,
                  "torch.load of the object through s3fs", "ckpt inspect s3://…")
        requests = int(line["transfer"].split(", ")[2].split()[0])
        fetched = int(line["transfer"].split(", ")[1].split()[0])
        res.target("s3: requests to list a 20,000-tensor .pt", f"{requests} ({fetched / 2**20:.1f} MiB of "
                   f"{pt20k.stat().st_size / 2**20:.1f} MiB fetched)", "≤ 16", requests <= 16)
        key = next(iter(sd))
        need = sd[key].numel() * sd[key].element_size()
        out = ckpt("cat", "--verbose", "s3://bench/ckpt", key)
        lazy = next(l for l in out.splitlines() if l.startswith("fetched ") and "(as read)" in l)
        got = int(lazy.split(", ")[1].split()[0])
        reqs = int(lazy.split(", ")[2].split()[0])
        # What opening fetches whatever is read (`.metadata` and the other small files): inspect's transfer.
        listed = ckpt("inspect", "--verbose", "s3://bench/ckpt")
        meta = int(next(l for l in listed.splitlines() if l.startswith("fetched ")).split(", ")[1].split()[0])
        res.target("s3: bytes a region read fetches / the region's size",
                   f"{(got - meta) / need:.4f}, {got / need:.4f} with the {meta}-byte `.metadata` (`ckpt cat "
                   f"s3://… {key}`: {got} bytes in {reqs} requests for its {need} bytes, of the "
                   f"{nbytes / 2**20:.0f} MiB checkpoint)", "≤ 1.1", got - meta <= 1.1 * need)
    finally:
        moto.close()
    # The same save and load on a server whose requests cost little (s3s-fs, Rust).
    binary = HERE.parent.parent / "target" / "s3s-fs" / "bin" / "s3s-fs"
    if not binary.exists():
        raise SystemExit(f"{binary} is missing: benches/compare --only s3 installs it (cargo install s3s-fs)")
    server = S3sFs(binary, work / "s3s-root", work / "s3s-fs.log")
    try:
        server.bucket("bench")
        env = dict(os.environ, **ENV, AWS_ENDPOINT_URL=server.endpoint)
        kw = dict(kw, client_kwargs={"endpoint_url": server.endpoint, "region_name": "us-east-1"})

        save_load(res, "s3s-fs", server.proc.pid, kw, sd, nbytes, model, runner(tool, env))
    finally:
        server.close()
    return line


def runner(tool: Path, env: Dict[str, str]) -> Callable[..., str]:
    """``ckpt args…`` with ``env``, returning what it printed; a failure ends the bench."""
    def ckpt(*args: str) -> str:
        p = subprocess.run([str(tool), *args], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"ckpt {args} failed: {p.stdout}{p.stderr}")
        return p.stdout + p.stderr

    return ckpt


def cpu_seconds(pid: int) -> float:
    """The user + system CPU time process ``pid`` has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def charged(f: Callable[[], float], pid: int, spent: List[float], client: List[float]) -> Callable[[], float]:
    """``f``, appending to ``spent`` the CPU seconds process ``pid`` (the server) used during each call, and
    to ``client`` those of this process and the child processes it waited for (``ckpt``)."""
    def own() -> float:
        me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime

    def run() -> float:
        before, mine = cpu_seconds(pid), own()
        t = f()
        spent.append(cpu_seconds(pid) - before)
        client.append(own() - mine)
        return t

    return run


def save_load(res: Any, server: str, pid: int, kw: Dict[str, Any], sd: Any, nbytes: int, model: Path,
              ckpt: Callable[..., str]) -> None:
    """DCP save and load of ``sd`` (``model``'s tensors) on ``server`` (process ``pid``): ckpt against torch's
    fsspec storage. Each run's CPU seconds, the server's and the client's, are measured too: together over
    the machine's cores they bound the ratio any client can reach here (``server_bound``)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    on = "" if server == "moto" else f" ({server})"
    torch_save, ckpt_save = "dcp.save, FsspecWriter (s3fs)", "ckpt convert model.pt s3://… --to distcp"
    spent: Dict[str, List[float]] = {torch_save: [], ckpt_save: []}
    client: Dict[str, List[float]] = {torch_save: [], ckpt_save: []}
    t = res.interleave(f"s3: DCP save of {nbytes / 2**20:.0f} MiB ({len(sd)} tensors) to {server} on 127.0.0.1", nbytes, [
        (torch_save, charged(timed(lambda: dcp.save(sd, storage_writer=FsspecWriter("s3://bench/torch", **kw),
                                                     no_dist=True)), pid, spent[torch_save], client[torch_save])),
        (ckpt_save, charged(timed(lambda: ckpt("convert", "-q", str(model), "s3://bench/ckpt", "--to", "distcp")),
                            pid, spent[ckpt_save], client[ckpt_save])),
    ], reps=3)
    res.ratio(f"s3: DCP save{on}, ckpt / dcp.save with FsspecWriter", t, torch_save, ckpt_save, "≥ 3")
    server_bound(res, f"s3: DCP save{on}", t, spent, client, torch_save, ckpt_save)

    dst = {k: torch.zeros_like(v) for k, v in sd.items()}
    torch_load, ckpt_load = ("dcp.load, FsspecReader (s3fs), preallocated",
                             "ckpt verify --deep s3://… (every byte fetched, read, checked)")
    spent, client = {torch_load: [], ckpt_load: []}, {torch_load: [], ckpt_load: []}
    t = res.interleave(f"s3: DCP load of {nbytes / 2**20:.0f} MiB from {server} on 127.0.0.1", nbytes, [
        (torch_load, charged(timed(lambda: dcp.load(dst, storage_reader=FsspecReader("s3://bench/torch", **kw),
                                                     no_dist=True)), pid, spent[torch_load], client[torch_load])),
        (ckpt_load, charged(timed(lambda: ckpt("verify", "-q", "--deep", "s3://bench/ckpt")), pid,
                            spent[ckpt_load], client[ckpt_load])),
    ], reps=3)
    res.ratio(f"s3: DCP load{on}, ckpt / dcp.load with FsspecReader", t, torch_load, ckpt_load, "≥ 3")
    server_bound(res, f"s3: DCP load{on}", t, spent, client, torch_load, ckpt_load)


def server_bound(res: Any, what: str, t: Dict[str, List[float]], spent: Dict[str, List[float]],
                 client: Dict[str, List[float]], base: str, ours: str) -> None:
    """A row (no target) with the CPU seconds each side's runs cost the server and the client (medians), how
    many cores the server kept busy on average (CPU seconds over the run's seconds: moto's Python stays near
    one), and the ratio the machine allows: ckpt's run cannot take less than the server's and ckpt's CPU
    seconds together over the machine's cores."""
    cores = os.cpu_count() or 1
    server = {k: statistics.median(v) for k, v in spent.items()}
    own = {k: statistics.median(v) for k, v in client.items()}
    wall = {k: statistics.median(v) for k, v in t.items()}
    floor = (server[ours] + own[ours]) / cores

    def side(k: str, name: str) -> str:
        return f"server {server[k]:.1f} s ({server[k] / wall[k]:.2f} cores busy), client {own[k]:.1f} s ({name})"

    res.target(f"{what}, CPU seconds per run and the ratio they allow on {cores} cores",
               f"{side(base, base.split(',')[0])}; {side(ours, 'ckpt')}: ckpt's run cannot take under "
               f"{floor:.2f} s, so the ratio is at most {wall[base] / floor:.2f}", "", None)


def section(res: Any, header: str) -> str:
    targets = [r for r in res.ratios if r[0].startswith("s3:")]
    rows = ["| what | measured | required | met |", "|---|---|---|---|"]
    rows += [f"| {w.removeprefix('s3: ')} | {v} | {t} | {m} |" for w, v, t, m in targets]
    met = sum(r[3] == "met" for r in targets)
    n = sum(1 for r in targets if r[3])
    return (f"{HEADING}: {met} of {n} targets met\n\n{header}\n\n" + "\n".join(rows) + "\n\n" + NOTE + "\n"
            + "\n".join(s for s in res.sections if "s3:" in s) + "\n")


NOTE = ("Both sides talk to the same server: moto (Python, in memory), which bounds both (it parses every "
        "body in Python and serves a ranged GET in the time of the whole object), then s3s-fs (Rust, over a "
        "directory), whose requests cost little. ckpt streams each file to its object as it writes it "
        "(multipart, up to 8 parts of 16 MiB in flight per file, no local copy) with `.metadata` last; "
        "`FsspecWriter` uploads each file through s3fs. ckpt's load fetches every object with 8 ranged GETs in "
        "flight into a temporary directory, then reads it; `dcp.load` reads each item through s3fs. Listing a "
        "`.pt` fetches its end records, central directory and small records (`data.pkl`, `version`, ...) into a "
        "sparse local copy and trusts torch's layout for the tensor records; `torch.load` through s3fs reads "
        "the whole object. A region read (`ckpt cat` of one tensor) fetches the checkpoint's `.metadata`, then, "
        "into sparse local files, its item's ZIP metadata and the bytes of the tensor, each byte once. The "
        "rows \"CPU seconds per run\" say what bounds the saves: the server and the client share this "
        "machine's cores, and the server spends most of a save's CPU (s3s-fs: 45% of it in MD5, by `perf`; "
        "its root on tmpfs changes nothing; moto keeps about one core busy), so no client's save can reach "
        "3× `FsspecWriter`'s here.")


def medians(times: Dict[str, List[float]]) -> Dict[str, float]:
    return {k: statistics.median(v) for k, v in times.items()}
