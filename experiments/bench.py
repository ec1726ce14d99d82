"""Benchmarks: ``python -m experiments.bench {envs,llm,train,rollout,table2} [options]``.

Bad input (an unknown benchmark, flag or value) fails before any compute with one line ``error: ...`` and exit
status 2 (``--debug``: the traceback too; :mod:`experiments.cli`).

Each benchmark times its subject next to a baseline measured in the same process and prints a
table (and JSON with ``--out``). Figures that go into BENCHMARKS.md come from these commands.

* ``envs``: environment steps per second per game at 1, 64, 1024, 4096 parallel environments under a
  uniform-random policy, with JaxMARL's own OvercookedV2 (Asymmetric Advantages) as the baseline.
* ``llm``: prefill and decision throughput of the frozen LLM (see ``experiments/bench_llm.py``).
* ``train``: PA-MAGRPO update throughput and MFU on a model-shaped random decoder (``experiments/bench_train.py``).
* ``rollout``: the compiled rollout against the host loop and a bare LLM forward (``experiments/bench_rollout.py``).
* ``table2``: wall time of the six-cell Table 2 smoke grid of one game, per cell (``experiments/bench_table2.py``).
"""

from __future__ import annotations

import importlib
import sys

_BENCHES = {
    "envs": "experiments.bench_envs",
    "llm": "experiments.bench_llm",
    "train": "experiments.bench_train",
    "rollout": "experiments.bench_rollout",
    "table2": "experiments.bench_table2",
}


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark named by ``argv[0]`` with the rest of ``argv``.

    Raises:
        InputError: an unknown benchmark name (or, from the benchmark, a bad flag or value).
    """
    from experiments.cli import InputError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print(f"usage: python -m experiments.bench {{{','.join(_BENCHES)}}} [options]")
        return
    name, rest = argv[0], argv[1:]
    if name not in _BENCHES:
        raise InputError(f"unknown benchmark {name!r}; valid: {', '.join(_BENCHES)}")
    importlib.import_module(_BENCHES[name]).main(rest)


if __name__ == "__main__":
    from experiments.cli import run_cli

    run_cli(main)
