"""The command line of ``python -m experiments.{cleanup,harvest,overcooked}``: flags -> :class:`RunConfig` -> run.

The configuration and its presets are :mod:`jaxopt_marl.config` (each hyper-parameter declared once, with its
paper source, validated there); the checks before any compute are :mod:`jaxopt_marl.preflight`; the pipeline
(burn-in -> guards -> PA-MAGRPO -> evaluation -> solo test -> GIF -> report) is :func:`jaxopt_marl.pipeline.run`.

Flags (each overrides the preset's value and is recorded in ``config.json``): ``--preset paper|cpu|smoke``
(default: ``cpu`` without an accelerator), ``--model``, ``--out``, ``--seed``, ``--resume``, ``--force``,
``--rounds``, ``--episode-steps``, ``--num-rollouts`` (``--rollouts``), ``--lora-rank``, ``--temperature``,
``--learning-rate``, ``--kl-beta``, ``--min-support``, ``--mode``, ``--eval-episodes``, ``--no-eval-base``,
``--eval-checkpoint``, ``--solo-episodes``, ``--chunking``, ``--library auto|NAME`` (the option-library variant,
:data:`jaxopt_marl.options.LIBRARIES`; ``auto``, the default, draws one with the seed's interface channel,
:mod:`jaxopt_marl.seeding`; ``config.json`` records the name drawn, and ``--resume`` keeps it: the draw is
made at the run's start and is then part of the run); ``--keep-checkpoints`` (a disk setting, not recorded);
``--debug``; ``--distributed`` with ``--coordinator`` / ``--num-processes`` / ``--process-id`` /
``--distributed-timeout`` (one process of a multi-process run, :mod:`jaxopt_marl.distributed`; each setting
defaults to its variable, ``JAXOPT_MARL_COORDINATOR`` / ``JAXOPT_MARL_NUM_PROCESSES`` / ``JAXOPT_MARL_PROCESS_ID``
or JAX's ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``; not recorded: a run's
numbers do not depend on its process count beyond float summation order).

Bad input (a bad flag value, unknown preset, game or layout, a model path without weights, a truncated or
mismatched GGUF file, an unusable ``--out``, only corrupt checkpoints, a checkpoint of another LoRA rank, a
corrupt ``guards.jsonl`` or differing flags on ``--resume``) fails before any compute, and before the run
directory is written or deleted, with one line ``error: ...`` naming the file or value and the cause, and exit
status 2 (``--debug``: the traceback too; :mod:`experiments.cli`). So do ``--distributed`` with some of its
settings missing (each named, with its flag and variable) and a process count that does not divide K (K, the
agents and the count named), before any process joins the run when the count is given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.cli import ArgParser, InputError, run_cli
from jaxopt_marl.config import DEFAULT_MODEL, PRESETS, RunConfig


def default_preset() -> str:
    """``cpu`` without an accelerator, else ``paper``."""
    import jax

    return "cpu" if jax.default_backend() == "cpu" else "paper"


#: ``(flag dest, RunConfig field (flat name), type, help)`` of the flags that override one preset value.
OVERRIDES = (
    ("rounds", "rounds", int, "PA-MAGRPO rounds"),
    ("episode_steps", "episode_steps", int, "steps per episode"),
    ("num_rollouts", "num_rollouts", int, "K, joint rollouts per round (paper: 4 Cleanup / Harvest, 6 Overcooked)"),
    ("lora_rank", "lora_rank", int, "LoRA rank, alpha = 2 x rank (paper: 32 Cleanup / Harvest, 16 Overcooked)"),
    (
        "temperature",
        "temperature",
        float,
        "sampling temperature > 0, of the rollouts and the update (paper: 0.7 / 0.9)",
    ),
    ("learning_rate", "learning_rate", float, "AdamW learning rate (paper: 5e-5 Cleanup / Harvest, 2e-5 Overcooked)"),
    ("kl_beta", "kl_beta", float, "KL weight toward the frozen reference (paper: 0.05)"),
    ("min_support", "min_support", int, "guard synthesis: fewest failures a guard must explain (paper §5.1: 5)"),
    ("eval_episodes", "eval_episodes", int, "evaluation episodes (paper: 20)"),
    ("mode", "mode", str, "scoring mode: sample | choice_only"),
    ("max_new_tokens", "max_new_tokens", int, "longest sampled response in tokens (sample mode)"),
    (
        "interface",
        "interface",
        str,
        "action interface (paper Table 2): menu (the method) | native (primitive actions as letters, one call "
        "per step: Ablations A, C) | compound_json (a JSON compound action, no menu or guards: Ablation D; "
        "samples, with a 32-token response budget unless --mode / --max-new-tokens say otherwise)",
    ),
    (
        "letters",
        "letters",
        str,
        "menu letters: shuffled per decision (paper §5.1; default) | fixed (the menu's construction order: a "
        "learning-signal diagnostic, not the method; menu interface only)",
    ),
    (
        "eval_checkpoint",
        "eval_checkpoint",
        str,
        "adapters to evaluate: best (highest training-time team return, paper §6.1; default) | final (after the "
        "last round)",
    ),
    ("solo_episodes", "solo_episodes", int, "solo test (paper §6.4) on this many evaluation seeds; 0 = skip"),
    (
        "format_warmup",
        "format_warmup",
        int,
        "format warm-up: this many supervised LoRA steps on the two-line answer, merged into the base before "
        "round 0 (ours, not the paper; menu interface, sample mode; 0 = none, the default)",
    ),
    (
        "chunking",
        "chunking",
        str,
        "the compiled rollout's model calls per wave: auto (per backend and mode) | single (one padded call, one "
        "compile; the smoke preset's)",
    ),
)


def build_parser(prog: str, layout: bool = False) -> argparse.ArgumentParser:
    """The runs' flags; a bad value or unknown flag is an :class:`InputError` (:class:`experiments.cli.ArgParser`)."""
    ap = ArgParser(prog=prog, description="burn-in -> guards -> PA-MAGRPO -> evaluation -> report")
    if layout:
        ap.add_argument(
            "--layout", default="aa", help="Overcooked layout: aa (Asymmetric Advantages) or fc (Forced Coordination)"
        )
    ap.add_argument("--preset", default=None, help="paper | cpu | smoke (default: cpu without an accelerator)")
    ap.add_argument(
        "--model",
        default=None,
        help="HF checkpoint dir or GGUF file; 'default' = SmolLM2-135M-Instruct "
        "GGUF (the default, except for --preset smoke: 'tiny-random', a "
        "2-layer random model for tests)",
    )
    ap.add_argument("--out", default=None, help="run directory (default runs/<game>-<preset>-s<seed>)")
    ap.add_argument("--seed", type=int, default=0, help="run seed")
    ap.add_argument(
        "--library",
        default="auto",
        help="option-library variant: auto (default: drawn with the seed's interface channel, paper §6.1) or a "
        "registered name (jaxopt_marl.options.LIBRARIES: canonical, compact, detailed)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint (same "
        "flags as the run; only --rounds and the evaluation flags may change)",
    )
    ap.add_argument("--force", action="store_true", help="delete an existing --out first (after every check)")
    for dest, _, typ, help_ in OVERRIDES:
        flags = ["--" + dest.replace("_", "-")] + (["--rollouts"] if dest == "num_rollouts" else [])
        ap.add_argument(*flags, dest=dest, type=typ, default=None, help=f"override the preset's {help_}")
    ap.add_argument("--no-eval-base", action="store_true", help="skip the frozen-base evaluation")
    ap.add_argument(
        "--keep-checkpoints",
        type=int,
        default=2,
        help="main checkpoints kept on disk (>= 1, default 2; best/ holds one more); a corrupt newest "
        "checkpoint falls back to the previous one on --resume",
    )
    from jaxopt_marl import distributed

    distributed.add_arguments(ap)
    return ap


def recorded_library(run_dir: Path | None) -> str | None:
    """The ``library`` recorded in ``run_dir/config.json`` (None: no such file, unreadable, or no string)."""
    import json

    if run_dir is None:
        return None
    try:
        lib = json.loads((Path(run_dir) / "config.json").read_text()).get("library")
    except (OSError, ValueError, AttributeError):
        return None
    return lib if isinstance(lib, str) else None


def config_from_args(game: str, args: argparse.Namespace, draw: bool = True, run_dir: Path | None = None) -> RunConfig:
    """The :class:`RunConfig` of the preset with the given flags.

    ``draw=False``: ``--library auto`` stands for the canonical library instead of drawing one (the draw runs a
    JAX computation; the checks made before ``jax.distributed`` starts must not start a backend).

    ``run_dir``: with ``--resume`` and ``--library auto``, the run's recorded library (its ``config.json``) is
    kept instead of drawn again (:func:`jaxopt_marl.options.resolve_library`): ``auto`` draws at the run's start.

    Raises:
        InputError: a bad value (``jaxopt_marl.config``'s ValueError: naming the field and the value).
    """
    from jaxopt_marl import options

    preset = args.preset or default_preset()
    kw = {"seed": args.seed}
    try:
        if args.library == options.AUTO and not draw:
            options.library_names(game)
            kw["library"] = options.CANONICAL
        elif isinstance(args.seed, int) and args.seed >= 0:  # a bad seed is RunConfig's to name
            recorded = recorded_library(run_dir) if getattr(args, "resume", False) else None
            kw["library"] = options.resolve_library(game, args.library, args.seed, recorded)
    except ValueError as e:
        raise InputError(f"--library: {e}") from None
    if args.model is not None:  # None: the preset's (smoke: tiny-random; else SmolLM2); "default": SmolLM2
        kw["model"] = None if args.model == DEFAULT_MODEL else args.model
    for dest, field, _, _ in OVERRIDES:
        if getattr(args, dest) is not None:
            kw[field] = getattr(args, dest)
    if args.no_eval_base:
        kw["eval_base"] = False
    from jaxopt_marl.config import interface_overrides

    kw = interface_overrides(kw)
    try:
        return RunConfig.from_preset(preset, game, **kw)
    except ValueError as e:
        raise InputError(str(e)) from None


def cli(game: str | None, prog: str, argv: list[str] | None = None) -> Path:
    """The command line's entry point: :func:`main` on ``argv`` (default ``sys.argv[1:]``) under
    :func:`experiments.cli.run_cli`.

    Raises:
        SystemExit: status 2 (:data:`experiments.cli.INPUT_ERROR_STATUS`) on bad input, after one line
            ``error: ...`` on stderr (``--debug``: the traceback too).
    """
    return run_cli(lambda a: main(game, a, prog=prog), argv)


def main(game: str | None, argv: list[str] | None = None, prog: str = "experiments") -> Path:
    """Parse, check, run (:func:`jaxopt_marl.pipeline.run`). ``game=None`` means Overcooked with ``--layout``."""
    ap = build_parser(prog, layout=game is None)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if game is None:
        if args.layout not in ("aa", "fc"):
            raise InputError(f"unknown layout {args.layout!r}; valid layouts: aa, fc")
        game = f"overcooked_{args.layout}"
    if args.preset is not None and args.preset not in PRESETS:
        raise InputError(f"unknown preset {args.preset!r}; valid presets: {', '.join(PRESETS)}")
    if args.resume and args.force:
        raise InputError("--resume and --force exclude each other")
    from jaxopt_marl import distributed

    try:
        settings = distributed.requested(args)  # --distributed / the variables; checked before JAX starts
    except ValueError as e:
        raise InputError(str(e)) from None
    if settings is not None and args.preset is not None:
        # The process count is known before any process joins: a K it does not split is refused here.
        check_split(config_from_args(game, args, draw=False), settings.num_processes)
    try:
        # Before the default preset asks JAX for its backend (jax.distributed must come first).
        ctx = distributed.from_settings(settings)
    except ValueError as e:
        raise InputError(str(e)) from None
    try:
        preset = args.preset or default_preset()
        run_dir = Path(args.out) if args.out else Path(f"runs/{game}-{preset}-s{args.seed}")  # pipeline.run's
        cfg = config_from_args(game, args, run_dir=run_dir)
        if ctx is not None:
            check_split(cfg, ctx.num_processes)
        from jaxopt_marl.pipeline import run

        return run(
            cfg,
            Path(args.out) if args.out else None,
            resume=args.resume,
            force=args.force,
            keep_checkpoints=args.keep_checkpoints,
            dist=ctx,
        )
    finally:
        distributed.shutdown()


def check_split(cfg: RunConfig, num_processes: int | None) -> None:
    """InputError unless ``num_processes`` processes split the K rollouts of ``cfg`` (the numbers named;
    :func:`jaxopt_marl.distributed.check_divides`)."""
    if num_processes is None:  # the cluster's own discovery: known after jax.distributed.initialize
        return
    from jaxopt_marl import distributed

    try:
        distributed.check_divides(cfg.magrpo.num_rollouts, num_processes, cfg.num_agents)
    except ValueError as e:
        raise InputError(f"--distributed: {e}") from None
