"""Zero copy, the GIL and progress: arrays from uncompressed ``.pt`` and safetensors files are read-only and
their memory is the file's map (checked against ``/proc/self/maps``); calls that read run without the GIL;
long operations show progress on a terminal only."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import ckpt


def mapping_of(address: int) -> str:
    """The path of the file mapped at ``address`` in this process (``/proc/self/maps``), or ``""``."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5] if len(parts) > 5 else ""
    return ""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("zc")
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g), "h": torch.randn(8).half()}
    torch.save(sd, d / "m.pt")
    save_file(sd, str(d / "m.safetensors"))
    return {"pt": d / "m.pt", "st": d / "m.safetensors", "sd": sd}


@pytest.mark.parametrize("kind", ["pt", "st"])
def test_arrays_are_read_only_views_of_the_map(files: dict, kind: str) -> None:
    path = files[kind].resolve()
    data = path.read_bytes()
    for how in ("open", "load", "safe_open"):
        if how == "open":
            arrays = {k: ckpt.open(path)[k] for k in files["sd"]}
        elif how == "load":
            arrays = ckpt.load(path)
        else:
            with ckpt.safe_open(path) as f:
                arrays = {k: f.get_tensor(k) for k in f.keys()}
        for name, a in arrays.items():
            assert isinstance(a, np.ndarray) and not a.flags.writeable, (how, name)
            with pytest.raises(ValueError):
                a[...] = 0
            address = a.__array_interface__["data"][0]
            assert mapping_of(address) == str(path), (how, name, mapping_of(address))
            base = a.base
            assert base.mapped and base.address <= address < base.address + len(base)
            # the array's bytes are the file's bytes at the offset ckpt says
            offset = base.offset + (address - base.address)
            assert data[offset:offset + a.nbytes] == a.tobytes(), (how, name)
            assert np.array_equal(a, files["sd"][name].numpy())


def test_torch_tensors_share_the_file_pages(files: dict) -> None:
    path = files["pt"].resolve()
    t = ckpt.load(path, framework="pt")["w"]
    assert mapping_of(t.data_ptr()) == str(path)  # torch's own copy-on-write map of the file


def test_gil_released_while_reading(tmp: Path) -> None:
    path = tmp / "big.pt"
    torch.save({f"t{i}": torch.randn(1 << 20) for i in range(48)}, path)  # 192 MiB
    done = threading.Event()
    spins = 0

    def work() -> None:
        for _ in range(3):
            ckpt.verify(path, deep=True)
        done.set()

    th = threading.Thread(target=work)
    start = time.perf_counter()
    th.start()
    while not done.is_set():
        spins += 1
    th.join()
    elapsed = time.perf_counter() - start
    # With the GIL held for the whole verification this thread would barely run; released, it spins freely.
    assert spins > 50_000 * elapsed, (spins, elapsed)


def _stderr_of(code: str, tty: bool) -> str:
    if not tty:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stderr
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert p.wait(timeout=120) == 0
    return out.decode(errors="replace")


def test_progress_on_a_terminal_only(tmp: Path) -> None:
    src = tmp / "p.pt"
    torch.save({f"t{i}": torch.randn(1 << 20) for i in range(64)}, src)
    code = (f"import ckpt, time; ckpt.convert({str(src)!r}, {str(tmp / 'o')!r} + str(time.time()), to='distcp', "
            "world_size=2); ckpt.verify(" + repr(str(src)) + ", deep=True)")
    shown = _stderr_of(code, tty=True)
    assert "converting" in shown or "verifying" in shown, shown
    assert _stderr_of(code, tty=False) == ""


def test_conversions_and_saves_show_a_bar_of_the_bytes_written(tmp: Path) -> None:
    # 256 MiB: the bar samples the bytes written every 100 ms, so it is drawn filling, out of the estimate.
    src = tmp / "big.pt"
    torch.save({f"t{i}": torch.randn(1 << 20) for i in range(64)}, src)
    convert = (f"import ckpt; ckpt.convert({str(src)!r}, {str(tmp / 'o.safetensors')!r}, to='safetensors', "
               "progress=True)")
    shown = _stderr_of(convert, tty=True)
    assert "converting" in shown and "256.00 MiB" in shown and "[" in shown, shown
    save = ("import ckpt, numpy as np; ckpt.save({f't{i}': np.ones(1 << 20, np.float32) for i in range(64)}, "
            f"{str(tmp / 's.pt')!r}, progress=True)")
    shown = _stderr_of(save, tty=True)
    assert "saving" in shown and "256.00 MiB" in shown, shown
    assert _stderr_of(save.replace("progress=True", "progress=False"), tty=True) == ""


# One checkpoint of every format ckpt reads (the bundled fixtures, written by the original software): every
# array ckpt returns is read-only, a view of the map where the layout allows and a read-only copy otherwise
# (DCP chunks assembled, DeepSpeed partitions joined, Megatron shards concatenated, PBG's HDF5 datasets).
FIXTURES = Path(__file__).resolve().parents[2] / "conformance" / "fixtures"
EVERY_FORMAT = {
    "torch zip": "torch/checkpoint.pt",
    "torch conjugate": "torch/conj.pt",
    "torch deflated": "real/deflate.pt",
    "torch legacy": "real/py2_torch03.pt",
    "safetensors": "dtypes/f6.safetensors",
    "distcp": "distcp/golden/d215",
    "hfai": "hfai/single_n3/ckpt",
    "pbg": "pbg/ckpt",
    "recis": "recis/golden/two_shard_adamw",
    "deepspeed": "deepspeed/zero3_w2",
    "deepspeed bf16": "deepspeed_bf16/bf16_optimizer_w2",
    "megatron": "megatron/gpt_tp2/ckpt",
    "pickle": "pickle/wrapper_p5.pkl",
    "torch.package": "package/model.pt",
    "torchscript": "real/scripted.jit",
    "composite": "composite/quantized.pt",
}


@pytest.mark.parametrize("kind", sorted(EVERY_FORMAT))
def test_every_array_of_every_format_is_read_only(kind: str) -> None:
    path = FIXTURES / EVERY_FORMAT[kind]
    ck = ckpt.open(path)
    seen = 0
    for name in ck.keys():
        a = ck[name]
        if not isinstance(a, np.ndarray):
            continue
        seen += 1
        assert not a.flags.writeable, (kind, name)
        if a.size:
            with pytest.raises(ValueError):
                a.reshape(-1)[0] = a.reshape(-1)[0]
        copy = np.array(a)
        assert copy.flags.writeable and copy.tobytes() == a.tobytes(), (kind, name)
    assert seen, f"{kind}: no array among {ck.keys()[:10]}"
