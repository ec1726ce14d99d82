#!/usr/bin/env bash
# Runs HERE, on the CPU: the device procedure of scripts/device_paper_run.sh, simulated, with the tiny model.
#
# A fake device directory gets what a device call would send (the working tree: tracked and
# untracked-not-ignored files) plus each call's carried paths, and keeps what is already there between the
# "calls", as the warm machine does. It then runs, in order:
#   a. a fresh machine that got only half 2: stops before any compute, naming the missing half 1;
#   b. half 2 corrupted (one byte changed): stops before any compute, naming the file and both checksums;
#   c. call 1 (half 1, manifest, .whl; --stage1), call 2 (half 2, manifest) with a time budget that the run
#      cannot meet: cut off by `timeout`, packed, exit 3; call 3 (carry nothing): resumes and finishes, exit 0;
#   d. call 3 again: already finished, packed again without compute.
# The halves are joined and checked for real (the SmolLM2 GGUF); the experiment runs with MODEL=tiny-random
# and EXTRA_ARGS overrides (paper preset otherwise), so it takes minutes on 2 cores.
#
# Usage: bash scripts/device_wheels.sh && bash scripts/device_stage_model.sh && \
#        flock /tmp/cpu.lock bash scripts/device_dry_run.sh [GAME] [ROUNDS]
#   env PYTHON (default .venv/bin/python), FAKE (default /tmp/device_dry_run), CUT_S (call 2's CALL_S,
#   default 120: on 2 cores the cut falls after round 0's checkpoint), EXTRA_ARGS (default "--episode-steps 12 --eval-episodes 2 --rollouts 2").
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
GAME=${1:-overcooked_aa}
ROUNDS=${2:-3}
PY=${PYTHON:-$PWD/.venv/bin/python}
FAKE=${FAKE:-/tmp/device_dry_run}
CUT_S=${CUT_S:-120}
export EXTRA_ARGS=${EXTRA_ARGS:-"--episode-steps 12 --eval-episodes 2 --rollouts 2"}
NAME=$(awk 'NR == 1 {print $3}' .model/manifest)
HALF1=.model/$NAME.part1
HALF2=.model/$NAME.part2

fresh() {  # fresh DIR: a new machine with the working tree
    rm -rf "$1"; mkdir -p "$1"
    git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$1"
}
call() {  # call DIR "CARRY..." ENV... -- ARGS: copy the carried paths in, run the script with a fresh $OUT
    local dir=$1 carry=$2; shift 2
    for p in $carry; do rm -rf "${dir:?}/$p"; mkdir -p "$dir/$(dirname "$p")"; cp -r "$p" "$dir/$p"; done
    rm -rf "$FAKE/out"; mkdir -p "$FAKE/out"
    (cd "$dir" && env OUT="$FAKE/out" PYTHON="$PY" SITE="$FAKE/site" REQUIRE_GPU=0 "$@")
    local rc=$?
    echo ">>> exit status $rc; \$OUT: $(ls "$FAKE/out" | tr '\n' ' ')"
    return $rc
}

echo "=== a. fresh machine, only half 2 arrives"
fresh "$FAKE/a"
call "$FAKE/a" "$HALF2 .model/manifest" MODEL=tiny-random bash scripts/device_paper_run.sh "$GAME" 1
[ $? = 2 ] || { echo "FAIL: expected exit status 2"; exit 1; }

echo "=== b. half 2 corrupted"
fresh "$FAKE/b"
call "$FAKE/b" "$HALF1 .model/manifest .whl" bash scripts/device_paper_run.sh --stage1 "$GAME"
cp "$HALF2" "$FAKE/b/$HALF2"
printf 'X' | dd of="$FAKE/b/$HALF2" bs=1 seek=1000 conv=notrunc status=none
call "$FAKE/b" "" MODEL=tiny-random bash scripts/device_paper_run.sh "$GAME" 1
[ $? = 2 ] || { echo "FAIL: expected exit status 2"; exit 1; }

echo "=== c. call 1, call 2 (cut off), call 3 (resume)"
fresh "$FAKE/c"
call "$FAKE/c" "$HALF1 .model/manifest .whl" bash scripts/device_paper_run.sh --stage1 "$GAME" || exit 1
call "$FAKE/c" "$HALF2 .model/manifest" MODEL=tiny-random CALL_S="$CUT_S" PACK_S=15 MIN_RUN_S=20 \
    bash scripts/device_paper_run.sh "$GAME" "$ROUNDS"
[ $? = 3 ] || { echo "FAIL: expected exit status 3 (cut off)"; exit 1; }
grep -h "^round\|resuming\|restored\|burn-in" "$FAKE/out/run.log"
call "$FAKE/c" "" MODEL=tiny-random bash scripts/device_paper_run.sh "$GAME" "$ROUNDS" || exit 1
grep -h "^round\|resuming\|restored\|burn-in\|^eval\|STATUS" "$FAKE/out/run.log"
ls -l "$FAKE/out"; tar tzf "$FAKE/out/run.tar.gz"
cp -r "$FAKE/out" "$FAKE/out_finished"

echo "=== d. call 3 again: already finished"
call "$FAKE/c" "" MODEL=tiny-random bash scripts/device_paper_run.sh "$GAME" "$ROUNDS" || exit 1
echo "=== dry run passed"
