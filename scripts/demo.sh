#!/usr/bin/env bash
# The main job on bundled fixtures: builds the `ckpt` tool and inspects checkpoints written by real torch.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release -p ckpt --features full
ckpt=target/release/ckpt
for f in conformance/fixtures/torch/module.pt conformance/fixtures/torch/checkpoint.pt; do
  echo "\$ ckpt inspect $f"
  "$ckpt" inspect "$f"
  echo
done
echo "\$ ckpt cat conformance/fixtures/torch/module.pt lin.weight --limit 2"
"$ckpt" cat conformance/fixtures/torch/module.pt lin.weight --limit 2
echo
echo "\$ ckpt inspect conformance/fixtures/torch/dtypes.pt --json | head -20"
"$ckpt" inspect conformance/fixtures/torch/dtypes.pt --json | head -20
