#!/usr/bin/env bash
# Runs every test: installs what is missing (scripts/setup.sh), runs the main job (scripts/demo.sh), checks
# formatting and lints, proves the committed fixtures are reproducible by regenerating them with the pinned
# torch (conformance/fixtures/REPRODUCIBILITY.md), then runs the whole Rust suite (which loads Rust-written
# files in real torch), and the tch feature's tests against libtorch, the Python package's tests (python/tests,
# against torch, safetensors and dcp.load, after `pip install ./python`), then a bounded fuzzing run of every
# parser (scripts/fuzz.sh; CKPT_FUZZ_SECONDS per target, default 30, as many targets at once as there are cores).
# Prints how long each step took, and at the end (pass or fail) every step's time and the total.
set -euo pipefail
cd "$(dirname "$0")/.."

# Step timing: `step NAME` closes the previous step (printing its time) and opens the next; the EXIT trap
# closes the last one and prints the table, also when a step fails (the failing step is marked).
SECONDS=0
step_name="" step_start=0 timings=() fresh="" fuzz_build="" fuzz_build_log="" wheels="" pytest_tmp=""
mmss() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
step_done() {
  [ -n "$step_name" ] || return 0
  local took=$((SECONDS - step_start))
  timings+=("$(printf '%7s  %s%s' "$(mmss "$took")" "$step_name" "${1:-}")")
  printf '\033[2m-- %s: %s\033[0m\n' "$step_name" "$(mmss "$took")" >&2
  step_name=""
}
step() {
  step_done
  step_name=$*
  step_start=$SECONDS
  printf '\n\033[1m== %s\033[0m\n' "$*" >&2
}
finish() {
  local rc=$?
  [ -z "$fresh" ] || rm -rf "$fresh"
  [ -z "$wheels" ] || rm -rf "$wheels"
  [ -z "$pytest_tmp" ] || rm -rf "$pytest_tmp"
  # A failed step before the fuzzing step leaves the fuzz build running: stop it (its own process group).
  [ -z "$fuzz_build" ] || kill -- -"$fuzz_build" 2>/dev/null || true
  [ -z "$fuzz_build_log" ] || rm -f "$fuzz_build_log"
  if [ $rc -eq 0 ]; then step_done; else step_done "   <- FAILED (exit $rc)"; fi
  printf '\n\033[1m== time per step\033[0m\n' >&2
  [ ${#timings[@]} -eq 0 ] || printf '  %s\n' "${timings[@]}" >&2
  printf '  %7s  total (%s)\n' "$(mmss "$SECONDS")" "$([ $rc -eq 0 ] && echo passed || echo FAILED)" >&2
}
trap finish EXIT

# Without incremental compilation: a clean clone builds everything once, and the incremental caches of the
# debug, tch and release builds would take gigabytes of the CI machine's disk and time to write.
export CARGO_INCREMENTAL=0

step "setup"
bash scripts/setup.sh

# Before tch-env.sh puts the Python environment on PATH: the main job must not need it.
step "the main job (scripts/demo.sh)"
bash scripts/demo.sh

# tch builds against the torch in .venv; sets LIBTORCH_USE_PYTORCH, PATH and LD_LIBRARY_PATH.
# shellcheck source=scripts/tch-env.sh
source scripts/tch-env.sh

step "format"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

step "lint"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "docs build without warnings (broken or private links, missing docs): default features, ckpt/full, all"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --features ckpt/full --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet

# What crates.io would get: each library crate packaged (licences, README, sources) and its package built on
# its own. Not packaged: the conformance suite and the benches (unpublished), and the Python package's
# extension (published to PyPI by maturin, from python/). The verify build goes to target/package.
step "the library crates package and build as published (cargo package)"
# cargo verifies each package against the others through a local registry in target/.../package, and
# unpacks them under $CARGO_HOME/registry/src/<hash of that path>/ only if not unpacked already: a later run
# from the same path at the same version would build against the sources an earlier run unpacked. Remove
# those of this workspace's crates (no dependency of ckpt is published under a ckpt- name).
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/ckpt-*-"$version"
cargo package --quiet --workspace --exclude ckpt-conformance --exclude ckpt-benches --exclude ckpt-python \
  --allow-dirty

step "fixtures are reproducible (regenerated with torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
fresh=$(mktemp -d)
.venv/bin/python conformance/python/make_torch_fixtures.py "$fresh/torch" >/dev/null
.venv/bin/python conformance/python/check_reproducible.py conformance/fixtures/torch "$fresh/torch"
.venv/bin/python conformance/python/make_bad.py "$fresh/bad" >/dev/null
.venv/bin/python conformance/python/check_reproducible.py conformance/bad "$fresh/bad"
.venv/bin/python conformance/python/distcp/make_fixtures.py "$fresh/distcp" >/dev/null
.venv/bin/python conformance/python/distcp/check_reproducible.py conformance/fixtures/distcp/torch213 "$fresh/distcp"
.venv/bin/python conformance/python/pbg/make_fixtures.py "$fresh/pbg" >/dev/null
.venv/bin/python conformance/python/pbg/check_reproducible.py conformance/fixtures/pbg "$fresh/pbg"
.venv/bin/python conformance/python/hfai/make_fixtures.py "$fresh/hfai" >/dev/null
.venv/bin/python conformance/python/hfai/check_reproducible.py conformance/fixtures/hfai "$fresh/hfai"
.venv/bin/python conformance/python/make_values_fixtures.py "$fresh/values" >/dev/null
diff -r conformance/fixtures/values "$fresh/values"
.venv/bin/python conformance/python/plain_pickle/make_fixtures.py "$fresh/pickle" >/dev/null
.venv/bin/python conformance/python/plain_pickle/check_reproducible.py conformance/fixtures/pickle "$fresh/pickle"
.venv/bin/python conformance/python/torch_package/make_fixtures.py "$fresh/package" >/dev/null
.venv/bin/python conformance/python/torch_package/check_reproducible.py conformance/fixtures/package "$fresh/package"
.venv/bin/python conformance/python/make_real_fixtures.py "$fresh/real" >/dev/null
diff -r -x README.md conformance/fixtures/real "$fresh/real"
.venv/bin/python conformance/python/make_composite_fixtures.py "$fresh/composite" >/dev/null
diff -r conformance/fixtures/composite "$fresh/composite"
.venv/bin/python conformance/python/deepspeed/make_fixtures.py "$fresh/deepspeed" >/dev/null
.venv/bin/python conformance/python/deepspeed/check_reproducible.py conformance/fixtures/deepspeed "$fresh/deepspeed"
.venv/bin/python conformance/python/deepspeed/make_bf16_fixtures.py "$fresh/deepspeed_bf16" >/dev/null
.venv/bin/python conformance/python/deepspeed/check_reproducible.py conformance/fixtures/deepspeed_bf16 "$fresh/deepspeed_bf16"
.venv/bin/python conformance/python/megatron/make_fixtures.py "$fresh/megatron" >/dev/null
.venv/bin/python conformance/python/deepspeed/check_reproducible.py conformance/fixtures/megatron "$fresh/megatron"
.venv/bin/python conformance/python/dtypes/make_fixtures.py "$fresh/dtypes" >/dev/null
diff -r conformance/fixtures/dtypes "$fresh/dtypes"
.venv/bin/python conformance/python/gguf/make_fixtures.py "$fresh/gguf" >/dev/null
diff -r conformance/fixtures/gguf "$fresh/gguf"

step "the reproducibility checks accept other CPUs' rounding and reject real changes (self-test)"
.venv/bin/python conformance/python/selftest_reproducible.py

step "the facade builds with each format feature alone"
for feature in torch safetensors distcp hfai pbg recis hf deepspeed megatron pickle package gguf cli; do
  cargo check --quiet -p ckpt --no-default-features --features "$feature"
done

# `mpi` is not in `full`: the MPI tests run programs under mpirun (OpenMPI, from setup.sh); the facade's
# MPI test runs the mpi_roundtrip example, which `cargo test` builds with the tests.
# The fuzz targets (nightly, AddressSanitizer: about 5 minutes of both cores, and nothing else needs them)
# build at low priority beside the suite, whose crash matrices, MPI jobs and CLI runs leave the CPU partly
# idle; the fuzzing step waits for that build, and fails with its log if it failed.
fuzz_build_log=$(mktemp)
setsid -w nice -n 10 bash scripts/fuzz.sh --build-only >"$fuzz_build_log" 2>&1 &
fuzz_build=$!
# The suite runs without the `tch` feature, and ckpt-tensor's tch tests after it on their own: with `tch`
# every test binary and the `ckpt` tool link libtorch_cpu, and each process start then loads it (about
# 0.5 s: the CLI crash matrix alone took 143 s instead of 18 s, and every doctest and CLI run paid too).
step "tests"
cargo test --workspace --features ckpt/full,ckpt/mpi
step "tests of the tch feature (libtorch conversions)"
cargo test -p ckpt-tensor --features tch

# The Python package (python/): `pip install ./python` into .venv (what a user runs), the wheel
# `maturin build --release` makes (libhdf5 and what it links bundled), then python/tests, which compare it with
# torch, safetensors and dcp.load, run the `ckpt` command against target/debug/ckpt, and install the wheel
# into a fresh venv with numpy alone.
step "the Python package: pip install ./python, the release wheel, python/tests"
wheels=$(mktemp -d)
# maturin's repair (bundling libhdf5) rewrites the linked extension in place, and cargo's copy of it is the
# same file (a hard link): remove it, so that a run after a repairing build links it afresh (seconds).
rm -f target/release/deps/lib_ckpt.so target/maturin/lib_ckpt.so
PATH="$PWD/.venv/bin:$PATH" .venv/bin/pip install -q --no-build-isolation --force-reinstall --no-deps ./python
PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin build --release --quiet -m python/Cargo.toml -o "$wheels"
# Its temporary files (the progress tests write checkpoints of some hundred MB) go to a folder removed at
# the end, and only a failed test's are kept: pytest would otherwise keep its last three runs' in /tmp.
# Two test files at a time (pytest-xdist, each file whole on one worker, so its module fixtures are made
# once): the multi-rank torch jobs and the subprocesses spend much of their time waiting.
pytest_tmp=$(mktemp -d)
CKPT_WHEEL=$(ls "$wheels"/ckpt-*.whl) .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
  --basetemp "$pytest_tmp/base" -o tmp_path_retention_policy=failed python/tests

step "fuzzing: every target for ${CKPT_FUZZ_SECONDS:-30} s from its corpus, $(nproc) at a time (scripts/fuzz.sh)"
if ! wait "$fuzz_build"; then
  cat "$fuzz_build_log" >&2
  echo "building the fuzz targets failed (log above)" >&2
  exit 1
fi
fuzz_build=""
bash scripts/fuzz.sh "${CKPT_FUZZ_SECONDS:-30}"
