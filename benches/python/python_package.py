#!/usr/bin/env python3
"""The Python package side by side with the Python originals (issue 29), in one process, interleaved:

* ``ckpt.load`` against ``torch.load(mmap=True, weights_only=True)`` on the 20,000-tensor ``.pt`` (20,000 ×
  10 KiB) and on the 2 GiB ``.pt`` (64 × 32 MiB): both return tensors over the file's map without reading
  the data (ckpt numpy arrays, and torch tensors with ``framework="pt"``);
* ``ckpt.safe_open`` against ``safetensors.safe_open``: open and ``get_tensor`` of every key, on the same
  two state dicts saved as safetensors, ``framework="pt"`` and ``"np"``;
* ``dcp.load`` into a preallocated state dict (what a training job does) with ``ckpt.dcp.Reader`` against
  torch's ``FileSystemReader``, on the 2 GiB DCP checkpoint of 4 files.

Run through ``benches/compare --only python`` (after ``pip install ./python`` into ``.venv``); it writes the
section "## Python package" of ``benches/RESULTS.md`` and leaves every other section as it is. ``--quick``:
256 MiB instead of 2 GiB (the 20,000-tensor files stay).
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

HERE = Path(__file__).resolve().parent
PY = sys.executable


def timed(f: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        gc.collect()
        t = time.perf_counter()
        out = f()
        secs = time.perf_counter() - t
        del out
        return secs

    return run


def prepare(work: Path, mib: int) -> Dict[str, Path]:
    import torch
    from safetensors.torch import save_file

    full = work / "full"
    subprocess.run([PY, HERE / "read_workloads.py", full, "--mib", str(mib), "--parts", "model,dcp"], check=True,
                   stdout=subprocess.DEVNULL)
    pt20k = work / "pt20k.pt"
    if not pt20k.exists():
        subprocess.run([PY, HERE / "pt_many_tensors.py", pt20k, "--tensors", "20000", "--bytes", "10240"],
                       check=True, stdout=subprocess.DEVNULL)
    paths = {"pt20k": pt20k, "model": full / "model.pt", "dcp": full / "dcp"}
    for name in ("pt20k", "model"):
        st = work / f"{name}.safetensors"
        if not st.exists():
            save_file(torch.load(paths[name], mmap=True, weights_only=True), str(st))
        paths[f"{name}.st"] = st
    return paths


def run(res: Any, work: Path, mib: int) -> None:
    """Adds the section's tables to ``res`` (compare.py's ``Results``) and its targets."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open as st_open
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    import ckpt
    import ckpt.dcp

    paths = prepare(work, mib)

    def size(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size

    # ckpt.load vs torch.load(mmap=True)
    for name, target in (("pt20k", "≥ 10"), ("model", "≥ 3")):
        p = paths[name]
        t = res.interleave(f"python: load {p.name} ({size(p) / 2**20:.0f} MiB)", 0, [
            ("torch.load(mmap=True, weights_only=True)", timed(lambda: torch.load(p, mmap=True, weights_only=True))),
            ("ckpt.load (numpy)", timed(lambda: ckpt.load(p))),
            ("ckpt.load(framework='pt')", timed(lambda: ckpt.load(p, framework="pt"))),
        ])
        res.ratio(f"python: ckpt.load / torch.load(mmap=True), {p.name}", t,
                  "torch.load(mmap=True, weights_only=True)", "ckpt.load (numpy)", target)
        res.ratio(f"python: ckpt.load(framework='pt') / torch.load(mmap=True), {p.name}", t,
                  "torch.load(mmap=True, weights_only=True)", "ckpt.load(framework='pt')")

    # ckpt.safe_open vs safetensors.safe_open
    def every(opener: Callable[..., Any], path: Path, fw: str) -> Callable[[], Any]:
        def f() -> Any:
            with opener(str(path), framework=fw) as g:
                return [g.get_tensor(k) for k in g.keys()]

        return f

    for name in ("pt20k.st", "model.st"):
        p = paths[name]
        for fw in ("pt", "np"):
            t = res.interleave(f"python: safe_open + get_tensor of every key, {p.name} ({size(p) / 2**20:.0f} MiB), "
                               f"framework={fw!r}", size(p) if name == "model.st" else 0, [
                                   ("safetensors.safe_open", timed(every(st_open, p, fw))),
                                   ("ckpt.safe_open", timed(every(ckpt.safe_open, p, fw))),
                               ])
            res.ratio(f"python: ckpt.safe_open / safetensors.safe_open, {p.name}, {fw}", t,
                      "safetensors.safe_open", "ckpt.safe_open", "≥ 0.9")

    # dcp.load through ckpt.dcp.Reader vs the default reader
    p = paths["dcp"]
    md = dcp.FileSystemReader(p).read_metadata()
    sd = {k: torch.zeros(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
          if isinstance(v, TensorStorageMetadata)}  # preallocated and pre-faulted, as a training job's

    def load_with(reader: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: dcp.load(sd, storage_reader=reader(), no_dist=True)

    t = res.interleave(f"python: dcp.load of {p.name} ({size(p) / 2**20:.0f} MiB, 4 files) into preallocated tensors",
                       size(p), [
                           ("dcp.load, FileSystemReader", timed(load_with(lambda: dcp.FileSystemReader(p)))),
                           ("dcp.load, ckpt.dcp.Reader", timed(load_with(lambda: ckpt.dcp.Reader(p)))),
                       ])
    res.ratio("python: dcp.load through ckpt.dcp.Reader / FileSystemReader", t, "dcp.load, FileSystemReader",
              "dcp.load, ckpt.dcp.Reader", "≥ 3")


def section(res: Any, header: str) -> str:
    """The Markdown section of this harness run."""
    targets = [r for r in res.ratios if r[0].startswith("python:")]
    met = sum(r[3] == "met" for r in targets if r[2])
    rows = ["| what | measured (speed ratio, > 1: ckpt faster) | required | met |", "|---|---|---|---|"]
    rows += [f"| {w.removeprefix('python: ')} | {v} | {t} | {m} |" for w, v, t, m in targets]
    n = sum(1 for r in targets if r[2])
    return (f"## Python package (issue 29): {met} of {n} targets met\n\n{header}\n\n" + "\n".join(rows) + "\n\n"
            + NOTE + "\n" + "\n".join(res.sections) + "\n")


NOTE = 'Both loads return tensors over the file\'s map without reading their data: `torch.load(mmap=True)` unpickles `data.pkl` in Python; ckpt decodes it in Rust and makes the arrays there. safetensors\' `framework="np"` copies every tensor into a writable array, ckpt\'s are read-only views of the map (`np.array(a)` copies): the 2 GiB `np` row compares a copy with none; the `pt` rows compare the same copy-on-write maps. `dcp.load`: torch\'s reader reads each item into memory, `torch.load`s it and copies it into the destination; ckpt copies each box from the map into the destination once, in parallel, with the GIL released. Profile: the first quick run had `safe_open` of 20,000 tensors at 0.31× safetensors; it was a linear search by name per tensor in ckpt-tensor\'s safetensors reader (20,000² comparisons), now an index (`Records::entry`).'



def medians(times: Dict[str, List[float]]) -> Dict[str, float]:
    return {k: statistics.median(v) for k, v in times.items()}
