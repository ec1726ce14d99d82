"""``python -m experiments.bench table2``: wall time of the smoke grid of :mod:`experiments.table2` for one game.

Runs the six Table 2 cells (paper §6.2) on the tiny random model with the smoke preset cut to ``--rounds`` rounds
of ``--steps``-step episodes, ``--eval-episodes`` evaluation episodes and no solo test (the grid of
``tests/test_table2.py`` by default), into ``--dir`` (default: a fresh temporary directory, deleted afterwards),
and prints the seconds of each cell and of the whole grid (imports, model loads, compiles -- or hits of JAX's
persistent compilation cache, ``runs/.jax_cache`` or ``JAXOPT_MARL_JAX_CACHE`` -- and the summary included): what a run of the test file costs, and where. ``--out`` writes the figures as JSON. The baseline is
the grid itself (no other implementation exists to time it against).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    from experiments.cli import ArgParser, positive

    ap = ArgParser(prog="python -m experiments.bench table2", description=__doc__.split("\n")[0])
    ap.add_argument("--game", default="overcooked_aa", help="cleanup | harvest | overcooked_aa | overcooked_fc")
    ap.add_argument("--steps", type=int, default=4, help="episode length (env steps; default 4)")
    ap.add_argument("--rounds", type=int, default=1, help="PA-MAGRPO rounds of the trained cells (default 1)")
    ap.add_argument("--eval-episodes", type=int, default=2, help="evaluation episodes (default 2)")
    ap.add_argument("--dir", default=None, help="grid directory (default: a temporary one, deleted afterwards)")
    ap.add_argument("--out", default=None, help="write the results JSON here")
    args = ap.parse_args(argv)
    for flag, v in (("--steps", args.steps), ("--rounds", args.rounds), ("--eval-episodes", args.eval_episodes)):
        positive(flag, v)
    from experiments import table2

    grid = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-table2-")) / "grid"
    argv_grid = ["--game", args.game, "--preset", "smoke", "--model", "tiny-random", "--solo-episodes", "0"]
    argv_grid += ["--episode-steps", str(args.steps), "--rounds", str(args.rounds)]
    argv_grid += ["--eval-episodes", str(args.eval_episodes), "--out", str(grid), "--force"]
    t0 = time.perf_counter()
    try:
        _, seconds = table2.run_grid(argv_grid)
    finally:
        if args.dir is None:
            shutil.rmtree(grid.parent, ignore_errors=True)
    total = time.perf_counter() - t0
    print(
        f"\nexperiments.table2 smoke grid, {args.game}: {args.rounds} round(s) of {args.steps}-step episodes, "
        f"{args.eval_episodes} evaluation episodes, tiny-random model"
    )
    print(f"{'cell':<24} {'seconds':>8}")
    for c, sec in seconds.items():
        print(f"{c:<24} {sec:>8.1f}")
    print(f"{'grid (all, with summary)':<24} {total:>8.1f}")
    if args.out:
        res = {"game": args.game, "steps": args.steps, "rounds": args.rounds, "eval_episodes": args.eval_episodes}
        Path(args.out).write_text(json.dumps({**res, "cells_s": seconds, "total_s": total}, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    from experiments.cli import run_cli

    run_cli(main)
