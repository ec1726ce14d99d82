#!/usr/bin/env bash
# The prepared device run (one NVIDIA H200, JAX 0.11 with CUDA): `python3 -m experiments.<game> --preset paper`
# with SmolLM2-135M-Instruct on the GPU, packed into $OUT.
#
#   bash scripts/device_paper_run.sh [--stage1] GAME [ROUNDS]
#     GAME    cleanup | harvest | overcooked_aa | overcooked_fc
#     ROUNDS  --rounds ROUNDS (default: the paper preset's 100, more than one 10-minute call can hold)
#   env TABLE2=1                  run the paper's Table 2 grid instead (issue #15: `python -m experiments.table2
#                                 --game GAME`, the six ablation cells, each its own run directory, cell by cell
#                                 over as many calls as it takes: a cut grid resumes with --resume, finished cells
#                                 are skipped); dir runs/device-<GAME>-table2-<MODE>-s<SEED>; back come
#                                 table2.json, table2.md and run.tar.gz with every cell's small files
#   env MODE=sample|choice_only   scoring (default sample, the paper's; choice_only is a decoding constraint the
#                                 paper does not use); the run directory is named by it:
#                                 runs/device-<GAME>-<MODE>-s<SEED>
#       BENCH_ROLLOUT=SECONDS: first time one compiled paper-preset rollout (issue #11's H200 target) into
#       $OUT/rollout_bench.json, e.g. BENCH_ROLLOUT=150;
#       WARMUP=STEPS: --format-warmup STEPS (sample mode, menu; ours, not the paper: STEPS supervised LoRA steps
#       on the two-line answer merged into the base before round 0, jaxopt_marl.format_warmup); the run directory
#       is then runs/device-<GAME>-<MODE>-w<STEPS>-s<SEED>, and format_warmup.json comes back in run.tar.gz;
#       SEED=0, CALL_S=600 (the run call's timeout_s), PACK_S=60 (seconds kept for packing), EXTRA_ARGS="..."
#       (more flags, e.g. --eval-episodes 20), MODEL=PATH (default: the joined GGUF; tiny-random for dry runs),
#       REQUIRE_GPU=1, PYTHON=python3, SITE=/tmp/site (wheel install target), OUT (the tool's; else /tmp/device_out)
#
# HERE, once (in the checkout the device tool sends: the session's own, i.e. the main checkout, with this
# branch merged; a helper's worktree is not what travels):
#   bash scripts/device_wheels.sh          # .whl/: jaxmarl, gymnax, gymnasium, farama-notifications, gguf (~1.5 MB)
#   bash scripts/device_stage_model.sh     # .model/: the GGUF's two halves (49,181,216 bytes each) + manifest;
#                                          # prints each call's size against the 64 MiB limit
#
# THE CALLS (run tool; each carry path is git-ignored here, so nothing else of .model/ travels):
#   call 1, starts the machine (a minute or more), ~20 s of work: half 1, the wheels; installs them, checks half
#     1's sha256, imports the pipeline, checks that JAX sees the GPU; no compute. ~50.5 MB travel.
#       carry:     [".model/SmolLM2-135M-Instruct.Q4_1.gguf.part1", ".model/manifest", ".whl"]
#       command:   bash scripts/device_paper_run.sh --stage1 cleanup
#       timeout_s: 120
#   call 2, WITHIN 30 s of call 1's reply (the machine stays warm 30 s; a fresh one lacks half 1 and the script
#     stops before any compute, naming the file): half 2; joins the halves into
#     .model/SmolLM2-135M-Instruct.Q4_1.gguf, checks size and sha256 (stops before any compute, naming the file
#     and both checksums, if it did not arrive whole), runs the experiment with --model <joined GGUF> under
#     `timeout` (CALL_S - PACK_S - setup seconds), then packs. ~50.2 MB travel.
#       carry:     [".model/SmolLM2-135M-Instruct.Q4_1.gguf.part2", ".model/manifest"]
#       command:   MODE=choice_only bash scripts/device_paper_run.sh cleanup 10
#       (choice_only first: the frozen SmolLM2 fails to parse 86-97% of its `sample` answers in every game,
#       measured on the CPU, docs/runs/frozen-smollm2-cpu/; then MODE=sample, the paper's, in a later call, and
#       WARMUP=30 MODE=sample: on the CPU a 30-step format warm-up made 131 / 131 of Overcooked AA's evaluation
#       answers parse (frozen base 7 / 317; 15 steps 123 / 152), 15 steps 96 / 96 of Cleanup's (frozen base
#       11 / 133), docs/runs/smollm2-format-warmup-pipeline-cpu/)
#       timeout_s: 600
#   call 3, only if call 2 ended with "STATUS: cut off" (exit 3), again within 30 s: the same command, carry []
#     (the joined GGUF, .whl/ and runs/ stay on the warm machine; the run resumes from its last checkpoint
#     with --resume, which requires the same flags, rounds excepted). ~1 MB travel (the working tree).
#   Then give_back. Device time counts from the start (a minute or more) to the give-back, idle time included:
#   start + call 1 + call 2's 10 minutes leave ~2-3 of a session's 15 minutes, so choose ROUNDS for call 2 to
#   finish (the paper preset's per-round time on the H200 is not measured yet: a first call with a small ROUNDS
#   measures it, see metrics.jsonl's perf/round_s) and keep call 3 for a short tail.
#   To point the experiment at the joined GGUF by hand: --model .model/SmolLM2-135M-Instruct.Q4_1.gguf
#   Dry run of all of this on the CPU (tiny model): scripts/device_dry_run.sh.
#
# WHAT COMES BACK ($OUT, at most 8 files of 16 MiB): run.log (this script's and the run's output),
#   config.json, metrics.jsonl, eval.json, solo.json, report.md (those that exist), and run.tar.gz with the
#   same plus figures/, episode.gif, guards.jsonl, burnin/burnin.json, decisions/eval*.jsonl (if the archive
#   would pass 15 MiB: without decisions/eval_base.jsonl, then decisions/eval.jsonl, then episode.gif).
#   Unpack: tar xzf run.tar.gz (paths relative to the run directory; report.md's figure links then resolve).
#
# EXIT STATUS: 0 finished (or already finished: packed again), 3 cut off by the time limit (run call 3),
#   2 staging or preflight failure (nothing computed), else the experiment's own status.
set -uo pipefail
cd "$(dirname "$0")/.."

STAGE1=0
if [ "${1:-}" = "--stage1" ]; then STAGE1=1; shift; fi
GAME=${1:-}
ROUNDS=${2:-}
MODE=${MODE:-sample}
SEED=${SEED:-0}
CALL_S=${CALL_S:-600}
PACK_S=${PACK_S:-60}
MIN_RUN_S=${MIN_RUN_S:-60}           # refuse to start a run with less time than this left in the call
REQUIRE_GPU=${REQUIRE_GPU:-1}
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/device_out}
MODEL_DIR=.model
TAR_MAX=15728640                     # 15 MiB: under the 16 MiB a returned file may have
STATUS_CUT_OFF=3
STATUS_STAGING=2
mkdir -p "$OUT"
LOG="$OUT/run.log"
say() { echo "$*" | tee -a "$LOG"; }
fail() { say "STATUS: stopped before any compute: $2"; exit "$1"; }

case "$GAME" in
    cleanup|harvest) MODULE=experiments.$GAME; LAYOUT=() ;;
    overcooked_aa) MODULE=experiments.overcooked; LAYOUT=(--layout aa) ;;
    overcooked_fc) MODULE=experiments.overcooked; LAYOUT=(--layout fc) ;;
    *) fail "$STATUS_STAGING" "unknown GAME '$GAME'; valid: cleanup, harvest, overcooked_aa, overcooked_fc" ;;
esac
case "$MODE" in
    sample|choice_only) ;;
    *) fail "$STATUS_STAGING" "unknown MODE '$MODE'; valid: sample, choice_only" ;;
esac
if [ -n "$ROUNDS" ] && ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
    fail "$STATUS_STAGING" "ROUNDS must be a positive integer, got '$ROUNDS'"
fi
WARMUP=${WARMUP:-0}
if ! [[ "$WARMUP" =~ ^[0-9]{1,6}$ ]]; then  # six digits at most: no 64-bit wrap in $(( ))
    fail "$STATUS_STAGING" "WARMUP must be a number of steps, 0 to 999999 (the run refuses over 10000), got '$WARMUP'"
fi
WARMUP=$(( 10#$WARMUP ))  # 00 / 015: the number (0 = no warm-up; the run directory says w15, not w015)
if [ "$WARMUP" != 0 ] && [ "$MODE" != sample ]; then
    fail "$STATUS_STAGING" "WARMUP=$WARMUP needs MODE=sample (the warm-up teaches the sampled answer), got '$MODE'"
fi
RUN_DIR=runs/device-$GAME-$MODE-s$SEED
[ "$WARMUP" != 0 ] && RUN_DIR=runs/device-$GAME-$MODE-w$WARMUP-s$SEED
TABLE2=${TABLE2:-0}
if [ "$TABLE2" = 1 ] && [ "$WARMUP" != 0 ]; then
    fail "$STATUS_STAGING" "WARMUP is a single-run option; the Table 2 grid (TABLE2=1) runs the paper's cells"
fi
if [ "$TABLE2" = 1 ]; then
    RUN_DIR=runs/device-$GAME-table2-$MODE-s$SEED
    MODULE=experiments.table2
    LAYOUT=(--game "$GAME")
fi
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"
say "== device_paper_run: game=$GAME mode=$MODE seed=$SEED rounds=${ROUNDS:-preset} stage1=$STAGE1 dir=$RUN_DIR"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"

# 1. Wheels (carried in call 1; they stay on the warm machine for the calls after it).
if ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        >> "$LOG" 2>&1 || fail "$STATUS_STAGING" "pip could not install .whl/*.whl into $SITE (see run.log)"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    say "wheels: $(ls .whl/*.whl | wc -l) installed into $SITE"
fi

# 2. The model: half 1 arrives in call 1, half 2 in call 2; joined and checked before any compute.
manifest_field() {  # manifest_field NAME COLUMN: the manifest's column (1 sha256, 2 bytes) for file NAME
    awk -v n="$1" -v c="$2" '$3 == n {print $c}' "$MODEL_DIR/manifest"
}
check_file() {  # check_file NAME: size and sha256 of .model/NAME against the manifest; fails naming both
    local f="$MODEL_DIR/$1" want_sha want_size got_sha got_size
    want_sha=$(manifest_field "$1" 1); want_size=$(manifest_field "$1" 2)
    [ -n "$want_sha" ] || fail "$STATUS_STAGING" "$MODEL_DIR/manifest has no line for $1"
    [ -f "$f" ] || fail "$STATUS_STAGING" "$f is missing (expected $want_size bytes, sha256 $want_sha): it did not \
arrive, or the machine went cold between the calls (>30 s) and this is a fresh one: rerun call 1, then call 2"
    got_size=$(stat -c %s "$f")
    got_sha=$(sha256sum < "$f" | cut -d' ' -f1)
    if [ "$got_size" != "$want_size" ] || [ "$got_sha" != "$want_sha" ]; then
        fail "$STATUS_STAGING" "$f did not arrive whole: $got_size bytes, sha256 $got_sha; expected $want_size bytes, \
sha256 $want_sha"
    fi
    say "ok: $f ($got_size bytes, sha256 $got_sha)"
}
GGUF=
if [ -f "$MODEL_DIR/manifest" ]; then
    NAME=$(awk 'NR == 1 {print $3}' "$MODEL_DIR/manifest")
    GGUF=$MODEL_DIR/$NAME
    if [ "$STAGE1" = 1 ]; then
        check_file "$NAME.part1"
    elif [ -f "$GGUF" ] && [ "$(stat -c %s "$GGUF")" = "$(manifest_field "$NAME" 2)" ] \
            && [ "$(sha256sum < "$GGUF" | cut -d' ' -f1)" = "$(manifest_field "$NAME" 1)" ]; then
        say "ok: $GGUF already joined and checked"
    else
        check_file "$NAME.part1"
        check_file "$NAME.part2"
        cat "$MODEL_DIR/$NAME.part1" "$MODEL_DIR/$NAME.part2" > "$GGUF.tmp"
        mv "$GGUF.tmp" "$GGUF"
        check_file "$NAME"
    fi
elif [ -z "${MODEL:-}" ]; then
    fail "$STATUS_STAGING" "$MODEL_DIR/manifest is missing: carry it (and a half of the GGUF) as the header says"
fi
MODEL=${MODEL:-$GGUF}

# 3. Preflight: the pipeline imports, scipy is new enough, JAX sees the GPU (no compute).
"$PY" - "$REQUIRE_GPU" 2>&1 <<'EOF' | grep -v "ubmoduled environments" | tee -a "$LOG"
import sys
import jax, scipy, gguf, jaxmarl
import experiments.common, jaxopt_marl.pipeline, envs_jax, lora.gguf_loader
from jaxopt_marl import stats
stats.check_scipy()
print(f"preflight: python {sys.version.split()[0]}, jax {jax.__version__} ({jax.default_backend()}: "
      f"{jax.devices()}), scipy {scipy.__version__}, jaxmarl {jaxmarl.__version__}")
if sys.argv[1] == "1" and jax.default_backend() != "gpu":
    sys.exit(f"preflight: JAX backend is {jax.default_backend()}, not gpu (REQUIRE_GPU=1)")
EOF
[ "${PIPESTATUS[0]}" = 0 ] || fail "$STATUS_STAGING" "preflight failed (its output is above)"
if [ "$STAGE1" = 1 ]; then
    say "STATUS: stage 1 done; make call 2 within 30 s"
    exit 0
fi

# 3b. Optional (BENCH_ROLLOUT=SECONDS): issue #11's H200 figure first -- one paper-preset rollout (K rollouts x the
# game's episode, this MODE, SmolLM2) timed by `python -m experiments.bench rollout` (compile excluded, median of 3,
# no host loop), into $OUT/rollout_bench.json (the 8th file back). Its seconds come out of the run's budget.
if [ -n "${BENCH_ROLLOUT:-}" ]; then
    case "$GAME" in cleanup) BK=4; BT=150 ;; harvest) BK=4; BT=400 ;; *) BK=6; BT=400 ;; esac
    say "bench: timeout $BENCH_ROLLOUT s: experiments.bench rollout --game $GAME --mode $MODE --rollouts $BK --steps $BT"
    PYTHONUNBUFFERED=1 timeout -k 10 "$BENCH_ROLLOUT" "$PY" -m experiments.bench rollout --game "$GAME" \
        --model "$MODEL" --mode "$MODE" --rollouts "$BK" --steps "$BT" --no-host --repeats 3 \
        --out "$OUT/rollout_bench.json" 2>&1 | grep -v "ubmoduled environments" | tee -a "$LOG"
fi

# 4. The run: resumed when the run directory exists; stopped by `timeout` so that packing still happens.
ARGS=("${LAYOUT[@]}" --preset paper --model "$MODEL" --mode "$MODE" --seed "$SEED" --out "$RUN_DIR")
[ -n "$ROUNDS" ] && ARGS+=(--rounds "$ROUNDS")
[ "$WARMUP" != 0 ] && ARGS+=(--format-warmup "$WARMUP")
ARGS+=("${EXTRA[@]}")
FLAGS="${ARGS[*]}"
DONE_MARK=$RUN_DIR/.device_done     # the flags of the last invocation that finished (not packed)
rc=0
if [ -f "$DONE_MARK" ] && [ "$(cat "$DONE_MARK")" = "$FLAGS" ]; then
    say "the run in $RUN_DIR already finished with these flags: packing it again"
else
    [ -d "$RUN_DIR" ] && [ -n "$(ls -A "$RUN_DIR")" ] && ARGS+=(--resume)
    budget=$(( CALL_S - PACK_S - SECONDS ))
    [ "$budget" -ge "$MIN_RUN_S" ] || fail "$STATUS_STAGING" "only $budget s left for the run (CALL_S=$CALL_S, \
PACK_S=$PACK_S, $SECONDS s of setup; MIN_RUN_S=$MIN_RUN_S)"
    say "run: timeout $budget s: $PY -m $MODULE ${ARGS[*]}"
    PYTHONUNBUFFERED=1 timeout -k 15 "$budget" "$PY" -m "$MODULE" "${ARGS[@]}" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] && echo "$FLAGS" > "$DONE_MARK"
fi

# 5. Pack: the small files loose, everything the report needs in one archive; if the archive would pass
# TAR_MAX, the files of DROP leave it one by one from its end (the base's decisions first, the GIF last).
SMALL=(config.json metrics.jsonl eval.json solo.json report.md)
KEEP=("${SMALL[@]}" guards.jsonl burnin/burnin.json format_warmup.json figures)
DROP=(episode.gif decisions/eval.jsonl decisions/eval_base.jsonl)
if [ "$TABLE2" = 1 ]; then  # the grid's summary loose; each cell's small files in the archive
    SMALL=(table2.json table2.md)
    KEEP=("${SMALL[@]}")
    for cell in $(cd "$RUN_DIR" 2> /dev/null && ls -d */ 2> /dev/null | tr -d /); do
        for f in config.json metrics.jsonl eval.json report.md guards.jsonl burnin/burnin.json figures; do
            KEEP+=("$cell/$f")
        done
    done
    DROP=()
fi
for f in "${SMALL[@]}"; do [ -f "$RUN_DIR/$f" ] && cp "$RUN_DIR/$f" "$OUT/"; done
for n in $(seq "${#DROP[@]}" -1 0); do
    have=()
    for f in "${KEEP[@]}" "${DROP[@]:0:$n}"; do [ -e "$RUN_DIR/$f" ] && have+=("$f"); done
    [ "${#have[@]}" -gt 0 ] || break
    tar czf "$OUT/run.tar.gz" -C "$RUN_DIR" "${have[@]}"
    [ "$(stat -c %s "$OUT/run.tar.gz")" -le "$TAR_MAX" ] && break
    say "run.tar.gz is over $TAR_MAX bytes with ${have[*]}: packing again without ${DROP[$(( n - 1 ))]:-}"
done
if [ -f "$OUT/run.tar.gz" ] && [ "$(stat -c %s "$OUT/run.tar.gz")" -gt "$TAR_MAX" ]; then
    say "run.tar.gz is over $TAR_MAX bytes even without ${DROP[*]}: not returned"; rm -f "$OUT/run.tar.gz"
fi
[ -f "$OUT/run.tar.gz" ] && say "packed: $(ls "$OUT" | tr '\n' ' ')($(stat -c %s "$OUT/run.tar.gz") bytes archive)"
if [ "$(stat -c %s "$LOG")" -gt "$TAR_MAX" ]; then
    tail -c "$TAR_MAX" "$LOG" > "$LOG.tail" && mv "$LOG.tail" "$LOG"
fi
case "$rc" in
    0) say "STATUS: finished; $RUN_DIR packed into $OUT"; exit 0 ;;
    124|137) say "STATUS: cut off after $budget s (checkpoints kept in $RUN_DIR); within 30 s make the same call" \
                 "again with carry [] to resume"; exit "$STATUS_CUT_OFF" ;;
    *) say "STATUS: the experiment failed with exit status $rc (see run.log)"; exit "$rc" ;;
esac
