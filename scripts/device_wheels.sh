#!/usr/bin/env bash
# Runs HERE (not on the device): downloads into .whl/ the Python 3.12 wheels that the experiments import and the
# device image lacks, for scripts/device_paper_run.sh to install there (--target .site, no index).
#
# Which: the image ('cuda', /work/.library/device/KINDS.md, package list of 2026-11-17) has JAX 0.11 with CUDA,
# flax, optax, orbax-checkpoint, chex, jaxtyping, transformers, tokenizers, safetensors, jinja2, pyarrow, imageio,
# pillow, matplotlib, seaborn, tqdm, pyyaml, requests, cloudpickle, typing-extensions and scipy. Missing:
#   jaxmarl (envs_jax's base classes and OvercookedV2), its dependency gymnax, gymnax's gymnasium and
#   gymnasium's farama-notifications; gguf (lora.gguf_loader reads SmolLM2's GGUF).
# No CLI library is needed: every entry point uses argparse (experiments/cli.py).
# Versions: those of this project's environment (pyproject.toml pins jaxmarl==0.2.0); --no-deps, so each
# dependency is named here, one version each (two versions of one package stop the install there).
#
# Usage (repo root):  bash scripts/device_wheels.sh        # PYTHON=... to use another pip
# The wheels count against the 64 MiB a device call may carry: the total is checked against WHEELS_MAX_MIB.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PYTHON:-python3}
WHEELS_MAX_MIB=${WHEELS_MAX_MIB:-12}
WHEELS=(jaxmarl==0.2.0 gymnax==1.0.1 gymnasium==1.3.0 farama-notifications==0.0.4 gguf==0.19.0)

# .whl/ must never travel as an untracked file (it is carried explicitly): ignored by .gitignore, else by
# .git/info/exclude.
if ! git check-ignore -q .whl/x.whl; then
    echo "/.whl/" >> "$(git rev-parse --git-path info/exclude)"
fi
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
# One wheel per package: remove any other version a former download left behind.
for spec in "${WHEELS[@]}"; do
    name=${spec%%==*}; ver=${spec##*==}; norm=${name//-/_}
    for f in .whl/*.whl; do
        base=$(basename "$f"); pkg=${base%%-*}
        if [ "${pkg,,}" = "${norm,,}" ] && [[ "$base" != "$pkg-$ver-"* ]]; then
            echo "removing other version $f"; rm -f "$f"
        fi
    done
done
ls -l .whl/*.whl
total=$(cat .whl/*.whl | wc -c)
echo "wheels: $(ls .whl/*.whl | wc -l) files, $total bytes ($(( total / 1048576 )) MiB; limit $WHEELS_MAX_MIB MiB)"
if [ "$total" -gt $(( WHEELS_MAX_MIB * 1048576 )) ]; then
    echo "error: .whl/ holds $total bytes, over WHEELS_MAX_MIB=$WHEELS_MAX_MIB MiB (with half of the model they" \
         "must fit in one device call's 64 MiB)" >&2
    exit 1
fi
