"""Stage 2-3: uniform-over-menu burn-in and guard synthesis for one game (paper §5.1).

``python -m experiments.burnin --game overcooked_aa --episodes 2000 --out runs/burnin_aa`` runs ``episodes`` solo
plus ``episodes`` all-agent episodes (the paper's AA burn-in is 2,000 + 2,000) and writes
``DIR/records.parquet``, ``DIR/guards.jsonl`` and ``DIR/burnin.json`` (episodes, decisions, seconds,
decisions per second, guards per option: :class:`jaxopt_marl.burnin.BurninSummary`, the layout a run's
``burnin/`` shares). ``--min-support`` sets the guard synthesis' failure threshold (paper §5.1: 5).

Bad input (an unknown game, a count below 1, an ``--out`` that is a file or not writable, a bad flag value)
fails before any compute with one line ``error: ...`` and exit status 2 (``--debug``: the traceback too;
:mod:`experiments.cli`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from experiments.cli import ArgParser, InputError, positive, run_cli

# jaxopt_marl.config.GAMES and jaxopt_marl.guards.MIN_SUPPORT (paper §5.1: 5), spelled here so that the bad-input
# checks run before JAX is imported (tests/test_burnin.py::test_cli_constants_equal_the_library_ones checks both).
GAMES = ("cleanup", "harvest", "overcooked_aa", "overcooked_fc")
MIN_SUPPORT = 5
PROG = "python -m experiments.burnin"


@dataclasses.dataclass
class Args:
    """Burn-in arguments."""

    game: str
    """One of cleanup, harvest, overcooked_aa, overcooked_fc."""
    episodes: int = 2000
    """Episodes of each kind: this many solo episodes plus this many all-agent episodes."""
    out: Path = Path("runs/burnin")
    """Output directory (records.parquet, guards.jsonl, burnin.json)."""
    seed: int = 0
    """PRNG seed."""
    chunk: int = 1000
    """Episodes per jitted call (bounds memory)."""
    steps: int | None = None
    """Steps per episode (default: the game's episode length)."""
    min_support: int = MIN_SUPPORT
    """Guard synthesis: the fewest failures a guard must explain (paper §5.1 Stage 3: 5)."""

    def __post_init__(self):
        """Raises InputError on an unknown game or a count below 1 (naming the flag and the value)."""
        if self.game not in GAMES:
            raise InputError(f"unknown game {self.game!r}; valid games: {', '.join(GAMES)}")
        positive("--episodes", self.episodes)
        positive("--chunk", self.chunk)
        positive("--steps", self.steps)
        positive("--min-support", self.min_support)


def parse_args(argv: list[str]) -> Args:
    """:class:`Args` from the command line; a bad or missing flag is an :class:`InputError`."""
    ap = ArgParser(
        prog=PROG,
        description="Uniform-over-menu burn-in and guard synthesis for one game "
        "(paper §5.1): records.parquet, guards.jsonl, burnin.json in --out.",
    )
    ap.add_argument("--game", required=True, help=f"one of {', '.join(GAMES)}")
    ap.add_argument(
        "--episodes",
        type=int,
        default=2000,
        help="episodes of each kind: this many solo plus this many all-agent episodes (default 2000)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("runs/burnin"),
        help="output directory: records.parquet, guards.jsonl, burnin.json (default runs/burnin)",
    )
    ap.add_argument("--seed", type=int, default=0, help="PRNG seed (default 0)")
    ap.add_argument("--chunk", type=int, default=1000, help="episodes per jitted call, bounds memory (default 1000)")
    ap.add_argument("--steps", type=int, default=None, help="steps per episode (default: the game's episode length)")
    ap.add_argument(
        "--min-support",
        type=int,
        default=MIN_SUPPORT,
        help=f"fewest failures a guard must explain (paper §5.1 Stage 3; default {MIN_SUPPORT})",
    )
    a = ap.parse_args(argv)
    return Args(
        game=a.game,
        episodes=a.episodes,
        out=a.out,
        seed=a.seed,
        chunk=a.chunk,
        steps=a.steps,
        min_support=a.min_support,
    )


def main(args: Args) -> dict:
    """Runs the burn-in and guard synthesis of ``args``; returns ``burnin.json``'s summary.

    Raises:
        InputError: (before any compute) the game's option library is not available, or ``args.out`` is not a
            directory that exists or can be created.
    """
    from jaxopt_marl import options
    from jaxopt_marl.preflight import check_out_dir

    check_out_dir(args.out)
    try:
        lib = options.get_library(args.game)
    except options.LibraryNotAvailable as e:
        raise InputError(str(e)) from None

    import jax

    from jaxopt_marl import burnin

    env = lib.env if hasattr(lib, "env") else None
    if env is None:
        import envs_jax

        env = envs_jax.make(args.game)
    print(
        f"burn-in: game={args.game} episodes={args.episodes} solo + {args.episodes} joint, seed={args.seed}, "
        f"device={jax.devices()[0]}, out={args.out}"
    )
    t0 = time.perf_counter()
    result = burnin.run_burnin(
        lib, env, args.episodes, args.episodes, seed=args.seed, chunk=args.chunk, num_steps=args.steps, progress=True
    )
    t1 = time.perf_counter()
    guards = burnin.synthesize(lib, result.codes, min_support=args.min_support)
    t_guards = time.perf_counter() - t1
    summary = burnin.write_outputs(
        lib,
        result,
        guards,
        args.out,
        seed=args.seed,
        seconds_guards=t_guards,
        steps=args.steps or int(env.max_steps),
        min_support=args.min_support,
    ).to_dict()
    print(
        f"{result.decisions} decisions in {result.seconds:.2f} s ({summary['decisions_per_s']:.0f}/s, compile "
        f"included; {time.perf_counter() - t0:.2f} s in all); {len(guards)} guards in {t_guards:.2f} s"
    )
    print(f"wrote {args.out / 'records.parquet'}, {args.out / 'guards.jsonl'}, {args.out / burnin.BURNIN_JSON}")
    return summary


if __name__ == "__main__":
    run_cli(lambda argv: main(parse_args(argv)))
