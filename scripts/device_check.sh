#!/usr/bin/env bash
# One prepared device check (H100/H200): PA-MAGRPO update MFU on a Qwen3-4B-shaped model, and game
# throughput on the GPU next to bare JaxMARL OvercookedV2. Run through the device tool with `.whl`
# carried (jaxmarl, gymnax, gymnasium, gguf and their small deps as wheels; the image has JAX).
set -uo pipefail
OUT=${OUT:-/tmp/device_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
timeout 260 python3 -m experiments.bench train --shape qwen3_4b --decisions 32 --micro-batch 16 \
  --prompt-len 480 --response-len 32 --repeats 3 --out "$OUT/train_qwen3_4b.json" 2>&1 | tee "$OUT/train_qwen3_4b.log"
timeout 200 python3 -m experiments.bench envs --n-envs 1 1024 4096 16384 --steps 100 --reps 3 \
  --out "$OUT/envs_gpu.json" 2>&1 | grep -v "^Importing\|^Submoduled" | tee "$OUT/envs_gpu.log"
