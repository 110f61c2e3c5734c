"""The ``ckpt`` command installed with the package is the Rust tool (``facade/src/bin/ckpt.rs``): the same
help, output and exit codes as the binary cargo builds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BAD, FIXTURES, ROOT


def installed() -> str:
    exe = Path(sys.executable).parent / "ckpt"
    assert exe.exists(), f"{exe}: the package's ckpt command is not installed"
    return str(exe)


def rust_binary() -> str:
    """The binary of the same source built by cargo (scripts/test.sh builds it before the Python tests)."""
    for profile in ("debug", "release"):
        exe = ROOT / "target" / profile / "ckpt"
        if exe.exists():
            return str(exe)
    pytest.fail("target/{debug,release}/ckpt missing: build it first (cargo build -p ckpt --features full)")


def run(exe: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("args", [
    ["--help"], ["convert", "--help"], ["--version"],
    ["inspect", str(FIXTURES / "torch" / "checkpoint.pt")],
    ["inspect", "--json", str(FIXTURES / "distcp" / "torch213" / "m3")],
    ["cat", str(FIXTURES / "torch" / "checkpoint.pt"), "epoch"],
    ["verify", "--deep", str(FIXTURES / "hfai" / "single_n3" / "ckpt")],
    ["verify", str(BAD / "git_lfs_pointer.pt")],
    ["diff", str(FIXTURES / "distcp" / "torch213" / "m2"), str(FIXTURES / "distcp" / "torch213" / "m3")],
    ["inspect", "/nonexistent/x.pt"],
    ["bogus-command"],
], ids=lambda a: " ".join(Path(x).name if "/" in x else x for x in a))
def test_same_as_the_rust_binary(args: list) -> None:
    ours, theirs = run(installed(), *args), run(rust_binary(), *args)
    assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.returncode, theirs.stdout, theirs.stderr)


def test_convert_with_the_command(tmp: Path) -> None:
    out = run(installed(), "convert", str(FIXTURES / "hfai" / "single_n3" / "ckpt"), str(tmp / "m.safetensors"),
              "--to", "safetensors")
    assert out.returncode == 0, out.stderr
    assert "converted" in out.stdout and (tmp / "m.safetensors").exists()
    assert shutil.which("ckpt", path=str(Path(sys.executable).parent))
