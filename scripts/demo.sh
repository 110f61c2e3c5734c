#!/usr/bin/env bash
# The main job on bundled fixtures: builds the `ckpt` tool and runs it on checkpoints written by the original
# software (torch 2.13 and 2.15, DCP across ranks, hfai parts, PyTorch-BigGraph, RecIS's C++ saver).
# Needs Rust; installs the system packages the build links against when they are missing (as root or through
# sudo: scripts/system-packages.sh, the same as the test command's set-up). No Python.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/system-packages.sh
command -v cargo >/dev/null || { echo "demo.sh: cargo not found: install Rust (rustup) first" >&2; exit 1; }
cargo build --quiet --release -p ckpt --features full
ckpt=target/release/ckpt
fx=conformance/fixtures
run() { echo "\$ ckpt $*"; "$ckpt" "$@"; echo; }
run inspect $fx/torch/module.pt
run cat $fx/torch/module.pt lin.weight --limit 2
run inspect $fx/distcp/golden/d215
run inspect $fx/hfai/single_n2/ckpt
run inspect $fx/pbg/ckpt
run inspect $fx/recis/golden/two_shard_adamw
run verify $fx/distcp/golden/d215
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run convert $fx/distcp/golden/d215 "$out/d215.pt" --to torch
run diff $fx/distcp/golden/d215 "$out/d215.pt"
run convert $fx/recis/golden/two_shard_adamw "$out/recis3" --to recis --world-size 3 --slice-size 4096
run diff $fx/recis/golden/two_shard_adamw "$out/recis3"
run convert $fx/pbg/ckpt "$out/pbg.safetensors" --to safetensors
run convert "$out/pbg.safetensors" "$out/pbg" --to pbg
echo "\$ ckpt inspect $fx/torch/dtypes.pt --json | head -20"
"$ckpt" inspect $fx/torch/dtypes.pt --json | head -20
