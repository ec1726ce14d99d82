"""Stage 2-3: uniform-over-menu burn-in and guard synthesis for one game (paper §5.1), its frozen-LLM control, and
the comparison of the two.

``python -m experiments.burnin --game overcooked_aa --episodes 2000 --out runs/burnin_aa`` runs ``episodes`` solo
plus ``episodes`` all-agent episodes (the paper's AA burn-in is 2,000 + 2,000) and writes
``DIR/records.parquet``, ``DIR/guards.jsonl`` and ``DIR/burnin.json`` (episodes, decisions, seconds,
decisions per second, guards per option, policy, model: :class:`jaxopt_marl.burnin.BurninSummary`, the layout a
run's ``burnin/`` shares). ``--min-support`` sets the guard synthesis' failure threshold (paper §5.1: 5).

``--policy llm [--model default|tiny-random|PATH] [--temperature T]`` is §5.1's control: the same episodes
(kinds, acting agents, reset states) with the frozen LLM choosing from the same guardless menu
(:func:`jaxopt_marl.burnin.run_llm_burnin`: the compiled rollout, ``choice_only`` letter sampling at the paper's
temperature of the game, ``jaxopt_marl.config.PAPER``), the same records, guard synthesis and outputs.
``--chunk`` is then K, the episodes of one compiled call (default 8).

``python -m experiments.burnin --compare DIR_UNIFORM DIR_LLM [--out DIR]`` writes ``DIR/compare.json`` and
``DIR/compare.md`` (default ``DIR`` = ``DIR_LLM``): per option the outcome counts of each policy, the option x
outcome cells covered, the guards each synthesized and the cost ratio (:mod:`jaxopt_marl.burnin_compare`).

Bad input (an unknown game or policy, a count below 1, ``--model`` or ``--temperature`` without ``--policy llm``,
a temperature that is not a finite number > 0 (the training entry points' rule), a model path without weights
or with a misshapen config.json, an ``--out`` that is a file or not writable, a bad flag value,
``--compare`` with any flag but ``--out`` / ``--debug`` (named, in any spelling), ``--compare`` of runs that differ
in game, seed, episodes, steps or min support (each named with both values) or of a directory without a burn-in
or with a wrongly typed burnin.json field) fails before any compute with one line ``error: ...`` and exit status 2
(``--debug``: the traceback too; :mod:`experiments.cli`).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from experiments.cli import ArgParser, InputError, positive, run_cli

# jaxopt_marl.config.GAMES and jaxopt_marl.guards.MIN_SUPPORT (paper §5.1: 5), spelled here so that the bad-input
# checks run before JAX is imported (tests/test_burnin.py::test_cli_constants_equal_the_library_ones checks both).
GAMES = ("cleanup", "harvest", "overcooked_aa", "overcooked_fc")
MIN_SUPPORT = 5
PROG = "python -m experiments.burnin"
POLICIES = ("uniform", "llm")
#: Episodes per jitted call: the uniform's (bounds memory) and the LLM's K (bounds the decision buffers).
CHUNK = {"uniform": 1000, "llm": 8}


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
    chunk: int | None = None
    """Episodes per jitted call (bounds memory; default :data:`CHUNK` of the policy)."""
    steps: int | None = None
    """Steps per episode (default: the game's episode length)."""
    min_support: int = MIN_SUPPORT
    """Guard synthesis: the fewest failures a guard must explain (paper §5.1 Stage 3: 5)."""
    policy: str = "uniform"
    """uniform (§5.1 Stage 2) or llm (§5.1's frozen-LLM control)."""
    model: str | None = None
    """llm only: default (SmolLM2-135M-Instruct GGUF), tiny-random (tests) or a GGUF file / HF directory."""
    temperature: float | None = None
    """llm only: the sampling temperature (default: the paper's for the game, ``jaxopt_marl.config.PAPER``)."""
    library: str = "canonical"
    """The option-library variant (``jaxopt_marl.options.LIBRARIES``; paper §6.1)."""

    def __post_init__(self):
        """Raises InputError on an unknown game or policy, a count below 1, ``--model`` / ``--temperature`` with
        the uniform policy or a temperature <= 0 (naming the flag and the value)."""
        if self.game not in GAMES:
            raise InputError(f"unknown game {self.game!r}; valid games: {', '.join(GAMES)}")
        from jaxopt_marl import options

        try:
            options.check_library_name(self.game, self.library)
        except ValueError as e:
            raise InputError(f"--library: {e}") from None
        if self.policy not in POLICIES:
            raise InputError(f"unknown --policy {self.policy!r}; valid policies: {', '.join(POLICIES)}")
        if self.policy != "llm":
            for flag, v in (("--model", self.model), ("--temperature", self.temperature)):
                if v is not None:
                    raise InputError(f"{flag} {v} is only for --policy llm (the uniform burn-in has no model)")
        if self.temperature is not None:
            from jaxopt_marl.config import check_temperature  # the training entry points' rule (finite, > 0)

            try:
                check_temperature(self.temperature)
            except ValueError as e:
                raise InputError(f"--{e}") from None
        if self.chunk is None:
            self.chunk = CHUNK[self.policy]
        positive("--episodes", self.episodes)
        positive("--chunk", self.chunk)
        positive("--steps", self.steps)
        positive("--min-support", self.min_support)


@dataclasses.dataclass
class CompareArgs:
    """``--compare DIR_UNIFORM DIR_LLM [--out DIR]``."""

    uniform: Path
    llm: Path
    out: Path | None = None
    """Where compare.json and compare.md go (default: the LLM run's directory)."""


def parse_args(argv: list[str]) -> Args | CompareArgs:
    """:class:`Args` (or :class:`CompareArgs` with ``--compare``) from the command line; a bad or missing flag is an
    :class:`InputError`."""
    ap = ArgParser(
        prog=PROG,
        description="Uniform-over-menu burn-in and guard synthesis for one game "
        "(paper §5.1): records.parquet, guards.jsonl, burnin.json in --out; --policy llm: the frozen-LLM control; "
        "--compare DIR_UNIFORM DIR_LLM: compare.json, compare.md.",
    )
    ap.add_argument("--game", default=None, help=f"one of {', '.join(GAMES)} (required unless --compare)")
    ap.add_argument(
        "--policy", default="uniform", help="uniform (default; §5.1 Stage 2) or llm (the frozen-LLM control)"
    )
    ap.add_argument(
        "--model",
        default=None,
        help="--policy llm: default (SmolLM2-135M-Instruct GGUF; the default), tiny-random, or a GGUF file / HF dir",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="--policy llm: sampling temperature (default: the paper's for the game: 0.7 Cleanup / Harvest, 0.9 OC)",
    )
    ap.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        default=None,
        metavar=("DIR_UNIFORM", "DIR_LLM"),
        help="compare a uniform and an llm burn-in of the same game, seed and episodes: compare.json, compare.md "
        "in --out (default DIR_LLM)",
    )
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
    ap.add_argument(
        "--library",
        default="canonical",
        help="option-library variant (jaxopt_marl.options.LIBRARIES: canonical, compact, detailed; paper §6.1)",
    )
    ap.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="episodes per jitted call, bounds memory (default 1000; --policy llm: K = 8)",
    )
    ap.add_argument("--steps", type=int, default=None, help="steps per episode (default: the game's episode length)")
    ap.add_argument(
        "--min-support",
        type=int,
        default=MIN_SUPPORT,
        help=f"fewest failures a guard must explain (paper §5.1 Stage 3; default {MIN_SUPPORT})",
    )
    if any(t == "--compare" or t.startswith("--compare=") for t in argv):
        return parse_compare_args(argv)
    a = ap.parse_args(argv)
    if a.compare is not None:  # an abbreviated --compare
        return parse_compare_args(argv)
    if a.game is None:
        raise InputError(f"the following arguments are required: --game (see {PROG} --help)")
    return Args(
        game=a.game,
        episodes=a.episodes,
        out=a.out,
        seed=a.seed,
        chunk=a.chunk,
        steps=a.steps,
        min_support=a.min_support,
        policy=a.policy,
        model=a.model,
        temperature=a.temperature,
        library=a.library,
    )


def parse_compare_args(argv: list[str]) -> CompareArgs:
    """:class:`CompareArgs` of ``--compare DIR_UNIFORM DIR_LLM [--out DIR] [--debug]``: a parser of its own, so that
    any other flag or argument, in any spelling (``--seed 5``, ``--policy=llm``, an abbreviation), is an
    :class:`InputError` naming it rather than silently ignored."""
    ap = ArgParser(
        prog=f"{PROG} --compare",
        description="compare a uniform and an llm burn-in of the same game, seed and episodes: compare.json, "
        "compare.md in --out (default DIR_LLM)",
    )
    ap.add_argument("--compare", nargs=2, type=Path, required=True, metavar=("DIR_UNIFORM", "DIR_LLM"))
    ap.add_argument("--out", type=Path, default=None, help="where compare.json, compare.md go (default DIR_LLM)")
    a, extra = ap.parse_known_args(argv)
    if extra:
        named = [t.split("=", 1)[0] for t in extra if t.startswith("-")] or extra
        raise InputError(
            f"--compare reads two finished burn-ins; it takes no {', '.join(named)} (only --out and --debug)"
        )
    return CompareArgs(uniform=a.compare[0], llm=a.compare[1], out=a.out)


def main_compare(args: CompareArgs) -> dict:
    """Writes ``compare.json`` and ``compare.md`` (:func:`jaxopt_marl.burnin_compare.write_compare`); returns the
    comparison. Raises InputError (before writing anything) on runs that cannot be compared."""
    from jaxopt_marl import burnin_compare as bc
    from jaxopt_marl.preflight import check_out_dir

    out = args.out if args.out is not None else args.llm
    try:
        bc.compare(args.uniform, args.llm)  # every check, before --out is touched
    except bc.CompareError as e:
        raise InputError(str(e)) from None
    check_out_dir(out)
    c = bc.write_compare(args.uniform, args.llm, out)
    g, cells, cost = c["guards"], c["cells_covered"], c["cost"]
    print(
        f"{c['game']}: guards uniform {g['uniform']} vs llm {g['llm']}; option x outcome cells uniform "
        f"{cells['uniform']} vs llm {cells['llm']} (of {cells['total']}); llm / uniform cost: "
        f"{cost['seconds_per_decision_ratio']}x per decision, {cost['seconds_ratio']}x in seconds"
    )
    print(f"wrote {Path(out) / bc.COMPARE_JSON}, {Path(out) / bc.COMPARE_MD}")
    return c


def dispatch(args: Args | CompareArgs) -> dict:
    """:func:`main` or :func:`main_compare`."""
    return main_compare(args) if isinstance(args, CompareArgs) else main(args)


def main(args: Args) -> dict:
    """Runs the burn-in and guard synthesis of ``args``; returns ``burnin.json``'s summary.

    Raises:
        InputError: (before any compute) the game's option library is not available, or ``args.out`` is not a
            directory that exists or can be created.
    """
    from jaxopt_marl import options
    from jaxopt_marl.preflight import check_out_dir

    if args.policy == "llm":
        from jaxopt_marl.config import DEFAULT_MODEL
        from jaxopt_marl.preflight import check_model

        check_model(None if args.model in (None, DEFAULT_MODEL) else args.model)
    check_out_dir(args.out)
    try:
        lib = options.get_library(args.game, library=args.library)
    except options.LibraryNotAvailable as e:
        raise InputError(str(e)) from None

    import jax

    from jaxopt_marl import burnin

    env = lib.env if hasattr(lib, "env") else None
    if env is None:
        import envs_jax

        env = envs_jax.make(args.game)
    print(
        f"burn-in: game={args.game} policy={args.policy} episodes={args.episodes} solo + {args.episodes} joint, "
        f"seed={args.seed}, device={jax.devices()[0]}, out={args.out}"
    )
    t0 = time.perf_counter()
    if args.policy == "llm":
        result = run_llm(args)
    else:
        result = burnin.run_burnin(
            lib,
            env,
            args.episodes,
            args.episodes,
            seed=args.seed,
            chunk=args.chunk,
            num_steps=args.steps,
            progress=True,
        )
    t1 = time.perf_counter()
    guards = burnin.synthesize(lib, result.codes, min_support=args.min_support)
    t_guards = time.perf_counter() - t1
    written = burnin.write_outputs(
        lib,
        result,
        guards,
        args.out,
        seed=args.seed,
        seconds_guards=t_guards,
        steps=args.steps or int(env.max_steps),
        min_support=args.min_support,
    )
    summary = written.to_dict()
    warning = burnin.never_succeeded_warning(written)
    if warning:
        print(warning, file=sys.stderr)
    print(
        f"{result.decisions} decisions in {result.seconds:.2f} s ({summary['decisions_per_s']:.1f}/s, compile "
        f"included: {summary['seconds_compile']} s; {time.perf_counter() - t0:.2f} s in all); {len(guards)} guards "
        f"in {t_guards:.2f} s"
    )
    print(f"wrote {args.out / 'records.parquet'}, {args.out / 'guards.jsonl'}, {args.out / burnin.BURNIN_JSON}")
    return summary


def run_llm(args: Args):
    """The frozen-LLM burn-in of ``args`` (:func:`jaxopt_marl.burnin.run_llm_burnin`): the game's env with
    ``max_steps = --steps`` (so its episodes end where the uniform burn-in's scan does), the model with one LoRA
    adapter (played off: the frozen base), K = ``--chunk`` episodes per compiled call."""
    import envs_jax
    from jaxopt_marl import burnin, options, rollout
    from jaxopt_marl.config import DEFAULT_MODEL, DEFAULT_MODEL_NAME, PAPER
    from lora import LoRAConfig

    env = envs_jax.make(args.game, **({} if args.steps is None else {"max_steps": args.steps}))
    lib = options.get_library(args.game, env, library=args.library)
    spec = None if args.model in (None, DEFAULT_MODEL) else args.model
    t0 = time.perf_counter()
    try:
        model, tok = rollout.load_policy_model(spec, LoRAConfig(num_adapters=1, rank=1, alpha=2.0), seed=args.seed)
    except (ValueError, OSError) as e:
        raise InputError(f"model {spec or DEFAULT_MODEL_NAME} could not be loaded: {e}") from None
    temperature = args.temperature if args.temperature is not None else PAPER[args.game]["temperature"]
    print(f"model {spec or DEFAULT_MODEL_NAME} loaded in {time.perf_counter() - t0:.1f} s; temperature {temperature}")
    try:
        roller = burnin.make_llm_roller(lib, env, model, tok, temperature=temperature, seed=args.seed, batch=args.chunk)
    except ValueError as e:
        raise InputError(str(e)) from None
    return burnin.run_llm_burnin(
        roller, args.episodes, args.episodes, seed=args.seed, model_name=args.model or DEFAULT_MODEL, progress=True
    )


if __name__ == "__main__":
    run_cli(lambda argv: dispatch(parse_args(argv)))
