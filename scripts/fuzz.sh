#!/usr/bin/env bash
# Coverage-guided fuzzing of every ckpt parser (cargo-fuzz / libFuzzer, nightly Rust); fuzz/README.md explains
# the targets. Builds every target once (AddressSanitizer, debug assertions: integer overflow panics), then
# runs each for SECONDS from its committed corpus (fuzz/corpus/<target>), as many targets at once as there are
# cores (each in its own scratch directory, run corpus and working directory). Fails on any crash, panic,
# leak, timeout (-timeout, default 10 s per input) or out-of-memory (-rss_limit_mb, default 2048), and prints,
# for every target that found one, where the reproducer is and how to replay it.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     30 s per target by default (the test command's bounded run)
#   scripts/fuzz.sh 3600 distcp pbg           a longer campaign on two targets
#   scripts/fuzz.sh --merge 3600              ... and fold what it found into fuzz/corpus (minimized)
#   scripts/fuzz.sh --reseed                  rebuild fuzz/corpus from the fixtures (fuzz/seed.py) + itself
#   scripts/fuzz.sh --list                    the targets
#   scripts/fuzz.sh --build-only              build the targets, run nothing (scripts/test.sh, beside the suite)
#
# Environment: CKPT_FUZZ_PARALLEL (targets run at once, default nproc), CKPT_FUZZ_JOBS (fuzzing processes
# per target sharing its corpus, default 1), CKPT_FUZZ_RSS_MB, CKPT_FUZZ_TIMEOUT, CKPT_FUZZ_ARGS (extra
# libFuzzer flags).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[fuzz]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[fuzz] error:\033[0m %s\n' "$*" >&2; exit 1; }

TARGETS=(pickle torch_zip torch_legacy pickle_file torch_package distcp recis hfai pbg open_dir gguf)
dicts_of() {
  case "$1" in
    pickle | torch_legacy | pickle_file) echo pickle ;;
    torch_zip | torch_package) echo zip pickle ;;
    distcp) echo files distcp zip pickle ;;
    recis) echo files recis zip pickle ;;
    hfai) echo files zip pickle ;;
    pbg) echo files pbg zip pickle ;;
    open_dir) echo files distcp recis pbg zip pickle ;;
    gguf) echo gguf ;;
    *) die "unknown target $1 (scripts/fuzz.sh --list)" ;;
  esac
}

seconds=30 merge=0 reseed=0 build_only=0 chosen=()
for arg in "$@"; do
  case "$arg" in
    --merge) merge=1 ;;
    --reseed) reseed=1 ;;
    --build-only) build_only=1 ;;
    --list) printf '%s\n' "${TARGETS[@]}"; exit 0 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *[!0-9]*) dicts_of "$arg" >/dev/null; chosen+=("$arg") ;;
    *) seconds=$arg ;;
  esac
done
[ ${#chosen[@]} -gt 0 ] || chosen=("${TARGETS[@]}")

command -v cargo-fuzz >/dev/null || die "cargo-fuzz is not installed (bash scripts/setup.sh installs it)"
rustup run nightly rustc --version >/dev/null 2>&1 || die "no nightly toolchain (bash scripts/setup.sh installs it)"

# Scratch space on tmpfs for the directories the targets write (CKPT_FUZZ_SCRATCH) and the run's corpora.
shm=/dev/shm; [ -d "$shm" ] && [ -w "$shm" ] || shm=${TMPDIR:-/tmp}
scratch=$(mktemp -d "$shm/ckpt-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export CKPT_FUZZ_SCRATCH="$scratch" RAYON_NUM_THREADS=1
# The targets are built into fuzz/target (where bin_dir below looks), whatever build directory the caller
# set (scripts/tch-env.sh, sourced by scripts/test.sh, points CARGO_TARGET_DIR at the tch build).
unset CARGO_TARGET_DIR

say "building ${#TARGETS[@]} targets (nightly, AddressSanitizer, debug assertions)"
start=$(date +%s)
(cd fuzz && cargo +nightly fuzz build --debug-assertions) || die "the fuzz targets do not build"
say "built in $(($(date +%s) - start)) s"
[ "$build_only" = 0 ] || exit 0
bin_dir=fuzz/target/x86_64-unknown-linux-gnu/release

dict_for() {
  local out="$scratch/$1.dict"
  for d in $(dicts_of "$1"); do cat "fuzz/dict/$d.dict"; done > "$out"
  echo "$out"
}

if [ "$reseed" = 1 ]; then
  python3 fuzz/seed.py "$scratch/seeds" >&2
  for t in "${chosen[@]}"; do
    mkdir -p "fuzz/corpus/$t" "$scratch/seeds/$t" "$scratch/new/$t"
    say "$t: minimizing $(find "$scratch/seeds/$t" "fuzz/corpus/$t" -type f | wc -l) inputs"
    "$bin_dir/$t" -merge=1 -rss_limit_mb="${CKPT_FUZZ_RSS_MB:-2048}" -timeout="${CKPT_FUZZ_TIMEOUT:-10}" \
      "$scratch/new/$t" "fuzz/corpus/$t" "$scratch/seeds/$t" 2>"$scratch/$t.merge.log" \
      || { tail -30 "$scratch/$t.merge.log" >&2; die "$t: a seed fails (log above)"; }
    rm -rf "fuzz/corpus/$t" && mv "$scratch/new/$t" "fuzz/corpus/$t"
    say "$t: $(find "fuzz/corpus/$t" -type f | wc -l) inputs, $(du -sh "fuzz/corpus/$t" | cut -f1)"
  done
  exit 0
fi

root=$PWD
parallel=${CKPT_FUZZ_PARALLEL:-$(nproc 2>/dev/null || echo 1)}
[ "$parallel" -ge 1 ] 2>/dev/null || die "CKPT_FUZZ_PARALLEL must be a positive number, not '$parallel'"
[ "$parallel" -le ${#chosen[@]} ] || parallel=${#chosen[@]}
jobs=""
# -jobs=N (N > 1) forks N fuzzing processes sharing the corpus; -jobs=1 would still fork one, so it is left out.
[ "${CKPT_FUZZ_JOBS:-1}" -gt 1 ] && jobs="-jobs=$CKPT_FUZZ_JOBS -workers=$CKPT_FUZZ_JOBS"

# One target's run, in the background: everything it writes is its own (scratch directory for the files the
# target writes, run corpus, working directory where -jobs puts its fuzz-<n>.log files, log); the committed
# corpus fuzz/corpus/<t> is only read, and replaced by the minimized merge (--merge) of this target alone.
# Leaves its exit status in $scratch/<t>.rc.
fuzz_one() {
  local t=$1 log="$scratch/$t.log" rc=0 dict
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t" "$scratch/run/$t" "$scratch/tmp/$t" "$scratch/cwd/$t"
  dict=$(dict_for "$t")
  (
    cd "$scratch/cwd/$t"
    # shellcheck disable=SC2086 # $jobs and CKPT_FUZZ_ARGS are lists of flags
    CKPT_FUZZ_SCRATCH="$scratch/tmp/$t" exec "$root/$bin_dir/$t" -max_total_time="$seconds" \
      -rss_limit_mb="${CKPT_FUZZ_RSS_MB:-2048}" -timeout="${CKPT_FUZZ_TIMEOUT:-10}" $jobs \
      -dict="$dict" -artifact_prefix="$root/fuzz/artifacts/$t/" -print_final_stats=1 \
      ${CKPT_FUZZ_ARGS:-} "$scratch/run/$t" "$root/fuzz/corpus/$t"
  ) >"$log" 2>&1 || rc=$?
  # With -jobs > 1 libFuzzer writes one fuzz-<n>.log per job in the working directory.
  cat "$scratch/cwd/$t"/fuzz-*.log >>"$log" 2>/dev/null || true
  if [ $rc -eq 0 ] && [ "$merge" = 1 ]; then
    mkdir -p "$scratch/new/$t"
    if CKPT_FUZZ_SCRATCH="$scratch/tmp/$t" "$bin_dir/$t" -merge=1 -rss_limit_mb="${CKPT_FUZZ_RSS_MB:-2048}" \
      -timeout="${CKPT_FUZZ_TIMEOUT:-10}" "$scratch/new/$t" "fuzz/corpus/$t" "$scratch/run/$t" >>"$log" 2>&1; then
      rm -rf "fuzz/corpus/$t" && mv "$scratch/new/$t" "fuzz/corpus/$t"
    else
      echo "merging the corpus failed" >>"$log"
      rc=70
    fi
  fi
  echo "$rc" >"$scratch/$t.rc"
}

say "running ${#chosen[@]} target(s) for ${seconds} s each, ${parallel} at a time"
start=$(date +%s)
running=0
for t in "${chosen[@]}"; do
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  say "$t: ${seconds} s"
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true
say "fuzzed in $(($(date +%s) - start)) s"

summary=() failed=()
for t in "${chosen[@]}"; do
  log="$scratch/$t.log"
  rc=$(cat "$scratch/$t.rc" 2>/dev/null || echo "no status")
  stats=$(grep -E '^#[0-9]+' "$log" 2>/dev/null | tail -1 | sed -E 's/^#([0-9]+)\s+\w+\s+/execs \1 /; s/ (exec\/s|rss|L|MS):.*//' || true)
  if [ "$rc" != 0 ]; then
    printf '\n\033[1;31m[fuzz] %s: last lines of its log\033[0m\n' "$t" >&2
    tail -60 "$log" >&2 2>/dev/null || true
    artifact=$(grep -oE "$root/fuzz/artifacts/$t/[a-z-]+[0-9a-f]+" "$log" 2>/dev/null | tail -1 || true)
    artifact=${artifact#"$root/"}
    if grep -q '^merging the corpus failed$' "$log" 2>/dev/null; then
      failed+=("$t: merging the corpus failed (log above)")
    else
      failed+=("$t found a problem (exit $rc). Reproducer: ${artifact:-see the log above}
  replay:   (cd fuzz && cargo +nightly fuzz run --debug-assertions $t ../${artifact:-<reproducer>})
  minimize: (cd fuzz && cargo +nightly fuzz tmin --debug-assertions $t ../${artifact:-<reproducer>})")
    fi
  elif [ -z "$stats" ]; then
    tail -30 "$log" >&2
    failed+=("$t: the run ended without a status line (log above)")
  fi
  summary+=("$(printf '%-13s %s' "$t" "${stats:-no status line}")")
done
if [ ${#failed[@]} -gt 0 ]; then
  for f in "${failed[@]}"; do printf '\033[1;31m[fuzz] error:\033[0m %s\n' "$f" >&2; done
  exit 1
fi
say "no crash, leak, timeout or OOM; last status line per target:"
printf '  %s\n' "${summary[@]}" >&2
