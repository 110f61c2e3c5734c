#!/usr/bin/env python3
"""The real-threshold case: a checkpoint with a tensor just over hfai's 256 MiB ``LARGE_SIZE``.

Usage::

    .venv/bin/python conformance/python/hfai/big.py write DIR   # 2 gloo ranks run hfai_ref.save
    .venv/bin/python conformance/python/hfai/big.py check DIR   # a 2-part checkpoint of that state

The state: a module with parameters ``big`` (float32, shape (8193, 8193): 268,500,996 bytes, just
over 256 MiB, so chunked: torch.chunk gives 33,562,625 + 33,562,624 elements) and ``edge``
(bfloat16, shape (16384, 8192): exactly 256 MiB, so *not* chunked: the threshold is strict), and
``others = {"step": 1}``; no optimizer. Element ``i`` (row-major) of ``big`` is ``i % 1021 - 510``,
of ``edge`` ``i % 255 - 127``. ``check`` verifies the layout (``check_load.check_layout``: every part
loads with ``torch.load(weights_only=True)``, chunk sizes are torch.chunk's, ``edge`` is whole in one
part) and the values ``hfai_ref.load`` returns. Used by ``conformance/tests/hfai.rs``, generated at
test time (not committed). Peak memory about 1.5 GB, disk 540 MB.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import check_load  # noqa: E402
import hfai_ref  # noqa: E402

BIG = (8193, 8193)
EDGE = (16384, 8192)


def pattern(shape: tuple[int, ...], period: int, dtype: torch.dtype) -> torch.Tensor:
    """Row-major element i is ``i % period - period // 2`` (a view of a slightly bigger storage)."""
    n = shape[0] * shape[1]
    base = (torch.arange(period, dtype=torch.int32) - period // 2).to(dtype)
    return base.repeat(-(-n // period))[:n].view(*shape)


class Big(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Parameter(pattern(BIG, 1021, torch.float32), requires_grad=False)
        self.edge = nn.Parameter(pattern(EDGE, 255, torch.bfloat16), requires_grad=False)


def worker(rank: int, store: Path, out: Path) -> None:
    assert hfai_ref.LARGE_SIZE == 256 * (1 << 20)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=600)
    )
    hfai_ref.save(out, Big(), None, {"step": 1})
    dist.destroy_process_group()


def write(out: Path) -> None:
    """Two ranks meeting through a file store, gloo over the loopback interface."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as rendezvous:
        store = Path(rendezvous) / "store"
        procs = [
            subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(store), str(out)], env=env)
            for r in range(2)
        ]
        codes = [p.wait(timeout=1200) for p in procs]
    if any(codes):
        raise SystemExit(f"workers failed: {codes}")


def check(d: Path) -> None:
    check_load.check_layout(d, hfai_ref.LARGE_SIZE, None)
    parts = [torch.load(d / f"PART_{r:03d}.pt", weights_only=True, mmap=True) for r in range(2)]
    lengths = [len(p["model"][0][1]["big"][1]) for p in parts]
    check_load.need(lengths == [33_562_625, 33_562_624], f"big chunks {lengths}")
    owners = [r for r, p in enumerate(parts) if "edge" in p["model"][0][0]]
    check_load.need(len(owners) == 1, f"edge (exactly 256 MiB) must be whole in one part, found in {owners}")
    check_load.need(all("edge" not in p["model"][0][1] for p in parts), "edge must not be chunked")
    del parts
    state = hfai_ref.load(d)
    check_load.need(state["step"] == 1 and state["optimizer"] == [], "others / optimizer")
    model = state["model"]
    check_load.need(list(model) == ["edge", "big"], f"model keys {list(model)}")
    check_load.need(torch.equal(model["big"], pattern(BIG, 1021, torch.float32)), "big values")
    check_load.need(torch.equal(model["edge"], pattern(EDGE, 255, torch.bfloat16)), "edge values")
    print(f"ok: {d}: big {tuple(model['big'].shape)} in chunks {lengths}, edge whole in part {owners[0]}")


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[1] == "--worker":
        worker(int(argv[2]), Path(argv[3]), Path(argv[4]))
        return 0
    if len(argv) != 3 or argv[1] not in ("write", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    write(Path(argv[2])) if argv[1] == "write" else check(Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
