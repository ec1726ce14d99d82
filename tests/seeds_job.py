"""The background job of tests/test_seeds.py and tests/test_crossplay.py (tests/background.py), one process so the
compiles are shared: ``experiments.seeds`` on the smallest budget (2 seeds of the smoke preset on the tiny model,
1 round, 2 evaluation episodes: one call of K = 2), then ``experiments.crossplay`` of seed 0 with itself
(``xp_self/``; one run crossed with another is the same code on other adapters: tests/test_crossplay.py checks
its tables on synthetic returns). ``python -m tests.seeds_job OUT``."""

import sys
from pathlib import Path

from tests.background import BACKGROUND

#: The job's output directory: ``seed_0/``, ``seed_1/``, ``seeds.json``, ``seeds.md``, ``xp_self/``.
SEEDS_DIR = BACKGROUND.base / "seeds" / "out"
#: ``experiments.seeds``'s flags (without ``--out``).
SEEDS_ARGS = ["--game", "overcooked_aa", "--seeds", "2", "--preset", "smoke", "--model", "tiny-random"]
SEEDS_ARGS += ["--rounds", "1", "--eval-episodes", "2", "--solo-episodes", "1"]
# One library for both seeds (not each seed's draw): their programs then have one shape and compile once, which
# halves the job; the draw per seed is tests/test_seeds.py::test_library_registry_and_draw's.
SEEDS_ARGS += ["--library", "canonical"]
SEEDS_DIR.parent.mkdir(parents=True, exist_ok=True)
BACKGROUND.register("seeds", ["-m", "tests.seeds_job", str(SEEDS_DIR)])


def result() -> tuple[Path, str]:
    """Waits for the job (started at collection for tests marked ``background("seeds")``); ``(SEEDS_DIR, stdout)``."""
    p = BACKGROUND.get("seeds")
    assert p.returncode == 0, f"{p.args}: exit status {p.returncode}\n" + p.stdout[-3000:] + p.stderr[-3000:]
    return SEEDS_DIR, p.stdout


def main(out: Path) -> None:
    from experiments import crossplay, seeds

    seeds.cli([*SEEDS_ARGS, "--out", str(out)])
    crossplay.cli([str(out / "seed_0"), str(out / "seed_0"), "--out", str(out / "xp_self")])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
