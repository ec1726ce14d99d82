"""Stage 2-3: uniform-over-menu burn-in and guard synthesis for one game (paper §5.1).

``python -m experiments.burnin --game overcooked_aa --episodes 2000 --out runs/burnin_aa`` runs ``episodes`` solo
plus ``episodes`` all-agent episodes (the paper's AA burn-in is 2,000 + 2,000) and writes
``DIR/records.parquet``, ``DIR/guards.jsonl`` and ``DIR/burnin.json`` (episodes, decisions, seconds,
decisions per second, guards per option).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

import tyro

GAMES = ("cleanup", "harvest", "overcooked_aa", "overcooked_fc")


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

    def __post_init__(self):
        if self.game not in GAMES:
            raise SystemExit(f"error: unknown game {self.game!r}; valid games: {', '.join(GAMES)}")
        if self.episodes < 1:
            raise SystemExit(f"error: --episodes must be >= 1, got {self.episodes}")


def main(args: Args) -> dict:
    from jaxopt_marl import options

    try:
        lib = options.get_library(args.game)
    except options.LibraryNotAvailable as e:
        raise SystemExit(f"error: {e}") from None

    import jax

    from jaxopt_marl import burnin
    from jaxopt_marl.guards import write_guards
    from jaxopt_marl.records import write_records

    env = lib.env if hasattr(lib, "env") else None
    if env is None:
        import envs_jax

        env = envs_jax.make(args.game)
    print(f"burn-in: game={args.game} episodes={args.episodes} solo + {args.episodes} joint, seed={args.seed}, "
          f"device={jax.devices()[0]}, out={args.out}")
    t0 = time.perf_counter()
    result = burnin.run_burnin(lib, env, args.episodes, args.episodes, seed=args.seed, chunk=args.chunk,
                               num_steps=args.steps, progress=True)
    t_run = time.perf_counter() - t0
    t1 = time.perf_counter()
    guards = burnin.synthesize(lib, result.codes)
    t_guards = time.perf_counter() - t1
    args.out.mkdir(parents=True, exist_ok=True)
    rec_path = write_records(burnin.to_table(lib, result.codes), args.out / "records.parquet")
    guard_path = write_guards(guards, args.out / "guards.jsonl")
    per_opt = Counter(g.opt for g in guards)
    summary = {
        "game": args.game,
        "episodes": result.episodes,
        "solo_episodes": result.solo_episodes,
        "joint_episodes": result.episodes - result.solo_episodes,
        "decisions": result.decisions,
        "seconds": round(t_run, 3),
        "seconds_guards": round(t_guards, 3),
        "decisions_per_s": round(result.decisions / max(t_run, 1e-9), 1),
        "guards": len(guards),
        "guards_per_option": {o: per_opt.get(o, 0) for o in lib.option_names},
        "seed": args.seed,
    }
    (args.out / "burnin.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{result.decisions} decisions in {t_run:.2f} s ({summary['decisions_per_s']:.0f}/s, compile included); "
          f"{len(guards)} guards in {t_guards:.2f} s")
    print(f"wrote {rec_path}, {guard_path}, {args.out / 'burnin.json'}")
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
    sys.exit(0)
