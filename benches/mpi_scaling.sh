#!/usr/bin/env bash
# Times `ckpt reshard` and `ckpt convert --to hfai` of a ~2 GiB 3-rank DCP checkpoint under `mpirun -np 1`
# and `-np 2` (the `mpi` feature), interleaved (np1 np2 np1 np2 ...), and prints each run and the medians.
#
#   bash benches/mpi_scaling.sh [GiB (default 2; fractions work: 0.0625 is 64 MiB)] [repetitions (default 3)]
#   PROFILE=debug bash benches/mpi_scaling.sh    # the debug build
#
# Scratch lives in $SCRATCH (default /tmp/mpi/scaling) and is deleted at the end; it needs about 3x the size
# free (source, one output, the staging of the next). Needs OpenMPI (scripts/system-packages.sh) and .venv
# (numpy + safetensors generate the source). Results and the N-machine analysis: benches/RESULTS.md, "MPI
# scaling".
set -euo pipefail
cd "$(dirname "$0")/.."
GIB=${1:-2}
REPS=${2:-3}
SCRATCH=${SCRATCH:-/tmp/mpi/scaling}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)

# PROFILE=debug times the debug build (what the test suite builds) when a release build is not at hand.
PROFILE=${PROFILE:-release}
if [ "$PROFILE" = release ]; then
  cargo build --release -q -p ckpt --features full,mpi --bin ckpt
else
  cargo build -q -p ckpt --features full,mpi --bin ckpt
fi
CKPT=$PWD/target/$PROFILE/ckpt
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
trap 'rm -rf "$SCRATCH"' EXIT

# The source: GIB GiB of f32 in 128 MiB tensors [32768, 1024] (plus a small one; below 128 MiB one tensor of
# fewer rows), as 3 ranks save it.
.venv/bin/python - "$SCRATCH/src.safetensors" "$GIB" <<'PY'
import sys
import numpy as np
from safetensors.numpy import save_file
path, gib = sys.argv[1], float(sys.argv[2])
if gib <= 0:
    sys.exit(f"the size must be positive, got {gib} GiB")
n = max(1, int(gib * 8))
rows = min(32768, max(3, int(gib * 2**30 / 4 / 1024)))
rng = np.random.default_rng(0)
tensors = {f"layer{i}.weight": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(n)}
tensors["head.bias"] = np.arange(1000, dtype=np.float32)
save_file(tensors, path)
PY
"$CKPT" convert -q "$SCRATCH/src.safetensors" "$SCRATCH/src" --to distcp --world-size 3
rm "$SCRATCH/src.safetensors"
echo "source: $(du -sh "$SCRATCH/src" | cut -f1) in $(ls "$SCRATCH/src" | wc -l) files; $(nproc) cores"

declare -A times
timed() { # label command...
  local start end
  sync
  start=$(date +%s.%N)
  "${@:2}" >/dev/null
  end=$(date +%s.%N)
  local t
  t=$(echo "$end - $start" | bc)
  times[$1]+="$t "
  printf '%-28s %6.2f s\n' "$1" "$t"
  rm -rf "$SCRATCH/dst"
}
for rep in $(seq "$REPS"); do
  for np in 1 2; do
    timed "reshard 3->4 -np $np" "${MPIRUN[@]}" -np "$np" "$CKPT" reshard "$SCRATCH/src" "$SCRATCH/dst" --world-size 4
    timed "convert to hfai 4 -np $np" "${MPIRUN[@]}" -np "$np" "$CKPT" convert "$SCRATCH/src" "$SCRATCH/dst" --to hfai --world-size 4
  done
done
echo "medians of $REPS:"
for k in "reshard 3->4 -np 1" "reshard 3->4 -np 2" "convert to hfai 4 -np 1" "convert to hfai 4 -np 2"; do
  # shellcheck disable=SC2086
  m=$(printf '%s\n' ${times[$k]} | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf '%-28s %6.2f s\n' "$k" "$m"
done
