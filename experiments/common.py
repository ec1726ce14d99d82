"""Shared pipeline of ``python -m experiments.{cleanup,harvest,overcooked}``: config, presets, run directory.

burn-in (``burnin/records.parquet``, ``burnin/burnin.json``) -> guards (``guards.jsonl``) -> PA-MAGRPO rounds
(``checkpoints/``, ``best/``, ``metrics.jsonl``, ``decisions/round_XXXX.jsonl``) -> evaluation on seeds 10000..
(paper §6.1: 20 episodes, seeds disjoint from training) with the trained adapters chosen by the paper's checkpoint
rule (highest training-time team return, ``best/``; ``--eval-checkpoint final`` = the last round's) and, if the
budget allows, the frozen base on the same menu (``eval.json``, ``eval_traj.npz``, ``decisions/eval*.jsonl``;
``eval.json``'s ``stats``: the §6.1 bootstrap CIs and Mann–Whitney U test, :mod:`jaxopt_marl.stats`)
-> solo test (paper §6.4: each agent alone on the first ``solo_episodes`` evaluation seeds, the others idled;
``solo.json``) -> ``report.md``.

Presets (:class:`RunConfig` constructors):

- ``paper`` — §6.1: Cleanup / Harvest LoRA rank 32, lr 5e-5, K 4, temperature 0.7; Overcooked rank 16,
  lr 2e-5, K 6, temperature 0.9, KL 0.05; clip 0.2, 2 epochs, grad clip 1.0; episodes of 150 (Cleanup) /
  400 (Harvest, Overcooked) steps; full two-line responses sampled; 20 evaluation episodes. The paper does
  not state the number of rounds: 100 is our choice. KL 0.05 is used for Cleanup / Harvest too (not stated).
  The update's hyper-parameters (K, temperature, lr, KL, clip, epochs, grad clip) and their sources are
  declared once, in :class:`jaxopt_marl.magrpo.MAGRPOConfig` (per game: its ``paper`` constructor).
  Solo test on 5 seeds for Overcooked, 2 for Cleanup / Harvest (our choice; the paper reports one number per
  agent).
- ``cpu`` — the default without an accelerator: the same pipeline on a reduced budget meant to finish in
  about 30 minutes on 2 CPU cores (measured phases in the README; episodes of 30 steps for Cleanup, 20 for Harvest,
  80 for Overcooked; K 2,
  2 rounds, 1 PPO epoch, ``choice_only`` scoring, 2 evaluation episodes, 100 + 100 burn-in episodes, no update
  in rounds without return spread, a 1-seed solo test). Says so in the console and in the report.
- ``smoke`` — a few minutes, to test the pipeline end to end (every stage and file, resume, report), not the
  method: 12-step episodes, 2 rounds, LoRA rank 2, lr 1e-2. Runs the 2-layer random model (``tiny-random``)
  unless ``--model`` is given (``--model default`` = SmolLM2); with a real model it warns that the budget
  gives meaningless training numbers.

An existing run directory is never overwritten: pass ``--resume`` to continue it from its last complete
checkpoint, or ``--force`` to delete it first. ``--resume`` takes the run's original flags: a value that differs
from its ``config.json`` fails, naming each key with both values, except the keys of :data:`RESUME_MAY_DIFFER`
(``rounds``, to extend or cut a run, and the evaluation-only settings, since a resumed run evaluates afresh).
Bad input (a bad flag value, unknown preset, game or layout, a model path without weights, a truncated or
mismatched GGUF file, an unusable ``--out``, only corrupt checkpoints, a corrupt ``guards.jsonl`` or differing flags on
``--resume``) fails before any compute, and before the run directory is written, with one line ``error: ...``
naming the file or value and the cause, and exit status 2 from the command line (``--debug``: the traceback too;
:mod:`experiments.cli`).
A corrupt newest checkpoint is named (round and file) and the run resumes from the newest intact one
(:func:`check_checkpoint`; ``--keep-checkpoints`` main checkpoints are kept, plus ``best/``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

from experiments.cli import INPUT_ERROR_STATUS, ArgParser, InputError, run_cli  # noqa: F401 (re-exported)
from jaxopt_marl.magrpo import MAGRPOConfig

GAMES = ("cleanup", "harvest", "overcooked_aa", "overcooked_fc")
PRESETS = ("paper", "cpu", "smoke")
MODES = ("sample", "choice_only")
EVAL_SEED0 = 10000  # paper §6.1: 20 evaluation episodes, seeds disjoint from training
PAPER_EVAL_EPISODES = 20
EPISODE_STEPS = {"cleanup": 150, "harvest": 400, "overcooked_aa": 400, "overcooked_fc": 400}  # §6.1
TINY_RANDOM = "tiny-random"
DEFAULT_MODEL = "default"  # --model default: the embedded SmolLM2-135M-Instruct GGUF (RunConfig.model None)
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (GGUF)"
EVAL_CHECKPOINTS = ("best", "final")  # best: paper §6.1 checkpoint rule; final: the last round's adapters
CHUNKINGS = ("auto", "single")  # the compiled rollout's model calls per wave (RunConfig.chunking)
CHECKPOINT_RULE = "highest training-time team return (paper §6.1)"
# Solo-test seeds, paper preset (§6.4 gives none for Cleanup and Harvest: 3 = audit.MIN_SOLO_SEEDS, the fewest
# that can give a verdict).
SOLO_PAPER = {"overcooked_aa": 5, "overcooked_fc": 5, "cleanup": 3, "harvest": 3}
# Decisions per forward/backward chunk in the update (memory only): the runs' MAGRPOConfig.micro_batch, where
# MAGRPOConfig's own default is 0 (the whole minibatch at once).
MICRO_BATCH = 8
MAGRPO_FIELDS = frozenset(f.name for f in dataclasses.fields(MAGRPOConfig))
# config.json keys a --resume may change: rounds (extend a run, or stop it early: the trainer runs rounds
# state.round .. rounds - 1, none when it has done more) and the evaluation-only settings (evaluation and solo
# test run afresh after the last round of every invocation, and config.json is rewritten with the new values).
# Everything else shapes the training trajectory (or the burn-in and guards that a resume reuses) and must match.
RESUME_MAY_DIFFER = frozenset({"rounds", "eval_episodes", "eval_base", "eval_checkpoint", "solo_episodes"})
# InputError and INPUT_ERROR_STATUS (2): experiments.cli, shared by every entry point.


def check_game(game: str) -> None:
    """InputError unless ``game`` is one of :data:`GAMES`."""
    if game not in GAMES:
        raise InputError(f"unknown game {game!r}; valid games: {', '.join(GAMES)}")


def replace_magrpo(m: MAGRPOConfig, **kw) -> MAGRPOConfig:
    """``m`` with the fields in ``kw`` replaced; an out-of-range value is an :class:`InputError`."""
    for name in ("num_rollouts", "epochs"):
        if kw.get(name, 1) < 1:
            raise InputError(f"{name} must be >= 1, got {kw[name]}")
    try:
        return dataclasses.replace(m, **kw)
    except ValueError as e:
        raise InputError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One training run (saved to ``config.json`` as one flat object: :meth:`flat_dict`).

    The update's hyper-parameters live in :attr:`magrpo`; the constructors and :meth:`replace` also take them
    by their flat names (``num_rollouts=2``), as ``config.json`` spells them.
    """

    # Game: cleanup, harvest, overcooked_aa, overcooked_fc.
    game: str
    # Preset the values came from: paper, cpu or smoke.
    preset: str
    # Run seed: training env seeds, LoRA init, sampling, update keys.
    seed: int = 0
    # --model: None = SmolLM2-135M-Instruct GGUF; a GGUF file or HF checkpoint dir; "tiny-random" (tests).
    model: str | None = None
    # Steps per episode (paper: 150 Cleanup, 400 Harvest and Overcooked).
    episode_steps: int = 150
    # PA-MAGRPO rounds.
    rounds: int = 100
    # LoRA rank (alpha = 2 * rank) on the attention projections (paper: 32 Cleanup / Harvest, 16 Overcooked).
    lora_rank: int = 32
    # LLM scoring: "sample" (two-line response, paper) or "choice_only" (one forward, letter distribution).
    # Sampling has no top-k / top-p; the temperature is magrpo.temperature.
    mode: str = "sample"
    # Longest sampled response ("sample" mode).
    max_new_tokens: int = 12
    # Burn-in: this many solo plus this many joint episodes (uniform over the guardless menu).
    burnin_episodes: int = 2000
    # Burn-in episode length (None = episode_steps).
    burnin_steps: int | None = None
    # Evaluation episodes on seeds 10000, 10001, ...
    eval_episodes: int = PAPER_EVAL_EPISODES
    # Also evaluate the frozen base (adapters off) on the same menu.
    eval_base: bool = True
    # Skip the update of rounds whose returns have no spread (all advantages 0): zero advantage is then exactly
    # zero update (every preset; jaxopt_marl.trainer.TrainConfig says why). False = update anyway (ablations).
    skip_zero_advantage: bool = True
    # Adapters evaluated: "best" = highest training-time team return (paper §6.1 checkpoint rule, ``best/``),
    # "final" = the adapters after the last round.
    eval_checkpoint: str = "best"
    # Solo test (paper §6.4): the first this-many evaluation seeds are played by each agent alone (the others
    # idled); 0 = skip. At most eval_episodes (the full-team returns of the evaluation are reused).
    solo_episodes: int = 0
    # How the compiled rollout cuts a wave's deciding rows into model calls: "auto" = per backend and mode
    # (:meth:`jaxopt_marl.compiled_rollout.ChunkConfig.for_backend`), "single" = one padded call per wave
    # (:meth:`~jaxopt_marl.compiled_rollout.ChunkConfig.single`: one compile; for tiny models and short runs).
    chunking: str = "auto"
    # PA-MAGRPO hyper-parameters: K (num_rollouts), the rollouts' sampling temperature, learning rate, KL weight,
    # PPO clip, epochs, gradient clip, micro-batch, one adapter for all agents (shared_adapter, Ablation B), ...;
    # each declared once, with its paper source, in MAGRPOConfig.
    magrpo: MAGRPOConfig = dataclasses.field(default_factory=lambda: MAGRPOConfig(micro_batch=MICRO_BATCH))

    def __post_init__(self):
        check_game(self.game)
        if self.preset not in PRESETS:
            raise InputError(f"unknown preset {self.preset!r}; valid presets: {', '.join(PRESETS)}")
        if self.mode not in MODES:
            raise InputError(f"unknown scoring mode {self.mode!r}; valid modes: {', '.join(MODES)}")
        if self.chunking not in CHUNKINGS:
            raise InputError(f"unknown chunking {self.chunking!r}; valid: {', '.join(CHUNKINGS)}")
        if self.eval_checkpoint not in EVAL_CHECKPOINTS:
            raise InputError(f"unknown eval checkpoint {self.eval_checkpoint!r}; valid: {', '.join(EVAL_CHECKPOINTS)}")
        for name in ("episode_steps", "rounds", "lora_rank", "eval_episodes", "burnin_episodes", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.solo_episodes <= self.eval_episodes:
            raise InputError(
                f"solo_episodes must be in 0..eval_episodes ({self.eval_episodes}), got "
                f"{self.solo_episodes} (the solo test reuses the evaluation's seeds)"
            )

    @property
    def reduced_budget(self) -> bool:
        """Anything but the paper preset is a reduced budget (said in the console and the report)."""
        return self.preset != "paper"

    @property
    def overcooked(self) -> bool:
        return self.game.startswith("overcooked")

    @property
    def units(self) -> str:
        """Units of the team return: soups delivered (Overcooked) or apples eaten (Cleanup, Harvest)."""
        return "deliveries" if self.overcooked else "apples"

    def replace(self, **kw) -> RunConfig:
        """A copy with ``kw`` replaced; ``kw`` may name :attr:`magrpo`'s fields flat (``num_rollouts=2``)."""
        m = {k: kw.pop(k) for k in list(kw) if k in MAGRPO_FIELDS}
        out = dataclasses.replace(self, **kw)
        return dataclasses.replace(out, magrpo=replace_magrpo(out.magrpo, **m)) if m else out

    def flat_dict(self) -> dict:
        """The fields with :attr:`magrpo`'s inlined: the flat ``config.json`` layout."""
        d = dataclasses.asdict(self)
        m = d.pop("magrpo")
        return {**d, **m}

    @classmethod
    def paper(cls, game: str, **kw) -> RunConfig:
        """§6.1 hyper-parameters (the update's: :meth:`jaxopt_marl.magrpo.MAGRPOConfig.paper`)."""
        check_game(game)
        # The solo test shrinks with a smaller --eval-episodes (it reuses the evaluation's seeds).
        solo = min(SOLO_PAPER.get(game, 2), max(int(kw.get("eval_episodes", PAPER_EVAL_EPISODES)), 0))
        p = cls(
            game=game,
            preset="paper",
            episode_steps=EPISODE_STEPS.get(game, 150),
            rounds=100,
            lora_rank=16 if game.startswith("overcooked") else 32,
            mode="sample",
            burnin_episodes=2000,
            eval_episodes=PAPER_EVAL_EPISODES,
            solo_episodes=solo,
            magrpo=MAGRPOConfig.paper(game, micro_batch=MICRO_BATCH),
        )
        return p.replace(**kw)

    @classmethod
    def cpu(cls, game: str, **kw) -> RunConfig:
        """The paper's optimiser settings on a budget for 2 CPU cores (about 30 minutes for Cleanup, README)."""
        # Measured on 2 idle cores with SmolLM2-135M (2026-11-30): a decision's prompt is ~245 tokens after the
        # 110-token system turn; rollouts ~1.2-2 decisions/s (letter-only scoring), the update ~2.8 s per decision
        # (theta_old and reference scoring + one PPO epoch, system turn run once per adapter). That buys ~100
        # decisions per round. Episode lengths are the shortest that give non-zero team returns with spread (else
        # no update runs): Cleanup needs >= 21 of 79 dirt cells cleaned before any apple grows (spec §1), which 15
        # steps never reached and 30 steps did (returns 0-2); Harvest has apples from step 0; an Overcooked soup
        # needs 3 onions, 20 cooking steps, a dish and a delivery.
        p = cls.paper(game)
        steps = {"cleanup": 30, "harvest": 20}.get(game, 80)
        return p.replace(
            **{
                **dict(
                    preset="cpu",
                    episode_steps=steps,
                    rounds=2,
                    num_rollouts=2,
                    epochs=1,
                    mode="choice_only",
                    burnin_episodes=100,
                    eval_episodes=2,
                    eval_base=True,
                    skip_zero_advantage=True,
                    solo_episodes=1,
                ),
                **kw,
            }
        )

    @classmethod
    def smoke(cls, game: str, **kw) -> RunConfig:
        """A few minutes: a tiny budget that tests the pipeline, on the tiny random model unless ``model`` is
        given (None = SmolLM2-135M-Instruct: the run warns that the budget is meaningless for a real model)."""
        p = cls.paper(game)
        return p.replace(
            **{
                **dict(
                    preset="smoke",
                    model=TINY_RANDOM,
                    episode_steps=12,
                    rounds=2,
                    num_rollouts=2,
                    lora_rank=2,
                    learning_rate=1e-2,
                    mode="sample",
                    max_new_tokens=8,
                    burnin_episodes=8,
                    eval_episodes=2,
                    eval_base=True,
                    solo_episodes=1,
                    chunking="single",
                ),
                **kw,
            }
        )

    @classmethod
    def from_preset(cls, preset: str, game: str, **kw) -> RunConfig:
        if preset not in PRESETS:
            raise InputError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
        check_game(game)
        return getattr(cls, preset)(game, **kw)


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


def default_preset() -> str:
    """``cpu`` without an accelerator, else ``paper``."""
    import jax

    return "cpu" if jax.default_backend() == "cpu" else "paper"


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
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint (same "
        "flags as the run; only --rounds and the evaluation flags may change)",
    )
    ap.add_argument("--force", action="store_true", help="delete an existing --out first")
    ap.add_argument("--rounds", type=int, default=None, help="override the preset's rounds")
    ap.add_argument("--episode-steps", type=int, default=None, help="override the preset's episode length")
    ap.add_argument("--rollouts", type=int, default=None, help="override K")
    ap.add_argument("--eval-episodes", type=int, default=None, help="override the evaluation episodes")
    ap.add_argument("--mode", default=None, help="override the scoring mode: sample | choice_only")
    ap.add_argument("--no-eval-base", action="store_true", help="skip the frozen-base evaluation")
    ap.add_argument(
        "--eval-checkpoint",
        default=None,
        help="adapters to evaluate: best (highest training-time team return, paper §6.1; default) | "
        "final (after the last round)",
    )
    ap.add_argument(
        "--keep-checkpoints",
        type=int,
        default=2,
        help="main checkpoints kept on disk (>= 1, default 2; best/ holds one more); a corrupt newest "
        "checkpoint falls back to the previous one on --resume",
    )
    ap.add_argument(
        "--solo-episodes",
        type=int,
        default=None,
        help="solo test (paper §6.4) on this many evaluation seeds; 0 = skip (default: the preset's)",
    )
    ap.add_argument(
        "--chunking",
        default=None,
        help="the compiled rollout's model calls per wave: auto (per backend and mode) | single (one "
        "padded call, one compile; the smoke preset's)",
    )
    return ap


def config_from_args(game: str, args: argparse.Namespace) -> RunConfig:
    preset = args.preset or default_preset()
    kw = {"seed": args.seed}
    if args.model is not None:  # None: the preset's (smoke: tiny-random; else SmolLM2); "default": SmolLM2
        kw["model"] = None if args.model == DEFAULT_MODEL else args.model
    for flag, field in (
        ("rounds", "rounds"),
        ("episode_steps", "episode_steps"),
        ("rollouts", "num_rollouts"),
        ("eval_episodes", "eval_episodes"),
        ("mode", "mode"),
        ("eval_checkpoint", "eval_checkpoint"),
        ("solo_episodes", "solo_episodes"),
        ("chunking", "chunking"),
    ):
        if getattr(args, flag) is not None:
            kw[field] = getattr(args, flag)
    if args.no_eval_base:
        kw["eval_base"] = False
    return RunConfig.from_preset(preset, game, **kw)


# ---------------------------------------------------------------------------------------------------------
# Checks before any compute
# ---------------------------------------------------------------------------------------------------------


def check_model(model: str | None) -> None:
    """A model path must hold weights: a GGUF file whose header, tensor table and tensor sizes fit its metadata
    and the file's size (:func:`lora.gguf_loader.check_gguf`, milliseconds: a truncated file is caught here,
    not when the weights are read), or an HF dir with config.json and *.safetensors whose headers fit their
    sizes (:func:`lora.hf_loader.check_safetensors`).

    Raises:
        InputError: naming the path and the cause (missing, not .gguf, no weights, truncated, misshapen).
    """
    if model == TINY_RANDOM:
        return
    from lora import gguf_loader

    if model is None:
        try:
            model = gguf_loader.default_gguf_path()
        except FileNotFoundError as e:
            raise InputError(str(e)) from None
    p = Path(model)
    if p.is_dir():
        if not (p / "config.json").exists() or not any(p.glob("*.safetensors")):
            raise InputError(f"model directory {model} has no weights (needs config.json and *.safetensors)")
        from lora.hf_loader import check_safetensors

        for shard in sorted(p.glob("*.safetensors")):
            try:
                check_safetensors(str(shard))
            except (ValueError, OSError) as e:
                raise InputError(f"model {e}") from None
    elif p.is_file():
        if p.suffix != ".gguf":
            raise InputError(f"model file {model} is not a .gguf file")
        try:
            gguf_loader.check_gguf(str(p))
        except (ValueError, OSError) as e:
            raise InputError(f"model {e}") from None
    else:
        raise InputError(f"model path {model} does not exist")


def check_out_dir(out: Path) -> None:
    """InputError unless ``out`` is a directory or can be created (its nearest existing parent is a writable
    directory): found before any compute, not when the first file is written."""
    if out.exists():
        if not out.is_dir():
            raise InputError(f"--out {out} exists and is not a directory")
        if not os.access(out, os.W_OK | os.X_OK):
            raise InputError(f"--out {out} is not writable")
        return
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"--out {out} cannot be created: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {out} cannot be created: {parent} is not writable")


def check_checkpoint(run_dir: Path, warn=None) -> int | None:
    """The newest intact checkpoint of ``run_dir`` (its step = completed rounds; None if there is none), found
    before any compute; InputError if every checkpoint is corrupt.

    A step is intact here if its files match its ``checksums.json`` (:func:`lora.checkpoint.verify`), its meta
    holds the round number and its adapters and opt_state exist. Each corrupt step, newest first, is reported
    through ``warn`` (default: a ``warning: ...`` line on stderr) naming the step, the round and the file; the
    trainer's restore then falls back to the same step (:meth:`jaxopt_marl.trainer.Trainer.restore`).
    """
    from lora import checkpoint as ckpt

    warn = warn or (lambda m: print(f"warning: {m}", file=sys.stderr))
    ck = run_dir / "checkpoints"
    if not ck.exists():
        return None
    steps = sorted((int(d.name) for d in ck.iterdir() if d.is_dir() and d.name.isdigit()), reverse=True)
    if not steps:
        return None
    bad = []
    for step in steps:
        last = ck / str(step)
        meta = last / "meta"
        try:
            problem = ckpt.verify(last)
            if problem is not None:
                raise ValueError(problem)
            files = list(meta.rglob("*")) if meta.exists() else []
            data = [
                json.loads(f.read_text())
                for f in files
                if f.is_file() and f.suffix in ("", ".json") and f.stat().st_size < 1 << 20
            ]
            if not any(isinstance(d, dict) and "round" in d for d in data):
                raise ValueError(f"{meta}: no readable meta with the round number")
            if not (last / "adapters").exists() or not (last / "opt_state").exists():
                raise ValueError(f"{last}: adapters or opt_state missing")
        except (ValueError, OSError, UnicodeDecodeError) as e:
            bad.append(f"checkpoint {last} is corrupt: {e}")
            older = [s for s in steps if s < step]
            warn(
                f"checkpoint {step} (after round {step - 1}) is corrupt: {e}; "
                + (f"trying checkpoint {older[0]}" if older else "no older checkpoint is left")
            )
            continue
        return step
    raise InputError("; ".join(bad) + f"; no intact checkpoint in {ck} to resume from (use --force to start over)")


def prepare_run_dir(cfg: RunConfig, out: Path, resume: bool, force: bool, warn=None) -> int | None:
    """Validates ``out`` against ``--resume`` / ``--force`` (before any compute); returns the checkpoint round
    (the newest intact one; ``warn`` receives a line per corrupt newer one, :func:`check_checkpoint`)."""
    exists = out.exists() and any(out.iterdir())
    if resume and force:
        raise InputError("--resume and --force exclude each other")
    if resume:
        if not exists:
            raise InputError(f"--resume: run directory {out} does not exist")
        conf = out / "config.json"
        if not conf.exists():
            raise InputError(f"--resume: {conf} is missing")
        try:
            old = json.loads(conf.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"--resume: {conf} is unreadable ({type(e).__name__}: {e})") from None
        if not isinstance(old, dict):
            raise InputError(f"--resume: {conf} is not a JSON object")
        if old.get("game") != cfg.game:
            raise InputError(f"--resume: {out} is a {old.get('game')} run, not {cfg.game}")
        check_resume_config(old, cfg, conf)
        return check_checkpoint(out, warn)
    if exists:
        if not force:
            raise InputError(f"run directory {out} exists; pass --resume to continue it or --force to overwrite it")
        shutil.rmtree(out)
    return None


def resume_differences(old: dict, cfg: RunConfig) -> dict[str, tuple]:
    """``{key: (value in config.json, value given)}`` for every key of ``cfg.flat_dict()`` whose value differs
    from ``old`` (a run's ``config.json``), except :data:`RESUME_MAY_DIFFER`. Keys that ``old`` lacks (written
    before that field existed) are not compared; values are compared as JSON spells them (tuples as lists)."""
    new = json.loads(json.dumps(cfg.flat_dict()))
    return {k: (old[k], v) for k, v in new.items() if k not in RESUME_MAY_DIFFER and k in old and old[k] != v}


def check_resume_config(old: dict, cfg: RunConfig, conf: Path) -> None:
    """InputError naming every key (both values) where ``cfg`` differs from the run's ``config.json``."""
    diff = resume_differences(old, cfg)
    if diff:
        keys = "; ".join(f"{k}: {json.dumps(a)} in config.json, {json.dumps(b)} given" for k, (a, b) in diff.items())
        raise InputError(
            f"--resume: the flags differ from {conf} in {len(diff)} key(s): {keys}. Give the run's "
            f"original flags (on --resume only {', '.join(sorted(RESUME_MAY_DIFFER))} may change) or "
            f"a new --out"
        )


def _guards_hint(guard_path: Path) -> str:
    return f"delete {guard_path} to redo the burn-in and guard synthesis, or start again with --force"


def check_resume_guards(out: Path) -> None:
    """On ``--resume``, the JSON syntax of ``out/guards.jsonl`` (reused when ``burnin/burnin.json`` exists), read
    before JAX and the games are imported: a truncated or garbled file fails in about a second. The guards'
    contents (options, features, values) are checked when they are loaded against the option library (step 0a
    of :func:`run`), still before the model and any compute.

    Raises:
        InputError: ``--resume: <file>:<line>: malformed JSON (...)`` (or unreadable), with what to do.
    """
    guard_path = out / "guards.jsonl"
    if not ((out / "burnin" / "burnin.json").exists() and guard_path.exists()):
        return
    try:
        lines = guard_path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(
            f"--resume: {guard_path} is unreadable ({type(e).__name__}: {e}) ({_guards_hint(guard_path)})"
        ) from None
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            try:
                json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(
                    f"--resume: {guard_path}:{lineno}: malformed JSON ({e.msg}): "
                    f"{line.strip()[:80]!r} ({_guards_hint(guard_path)})"
                ) from None


def smoke_warning(cfg: RunConfig) -> str | None:
    """The warning a smoke run with a real model prints (None for other presets and for ``tiny-random``)."""
    if cfg.preset != "smoke" or cfg.model == TINY_RANDOM:
        return None
    return (
        f"warning: --preset smoke with a real model ({cfg.model or DEFAULT_MODEL_NAME}): the smoke budget "
        f"({cfg.episode_steps}-step episodes, {cfg.rounds} rounds, lr {cfg.magrpo.learning_rate}, "
        f"{cfg.max_new_tokens} new tokens) tests the pipeline, not the method; its parse rates, KL and returns "
        f"are meaningless (use --preset cpu or paper for results)"
    )


def check_stats() -> None:
    """InputError unless scipy (the evaluation's statistics, :mod:`jaxopt_marl.stats`) is importable and new
    enough: found before any compute, not after the training rounds."""
    try:
        from jaxopt_marl import stats

        stats.check_scipy()
    except ImportError as e:
        raise InputError(f"the evaluation statistics need scipy: {e}") from None


def check_library(game: str) -> None:
    from jaxopt_marl import options

    if not options.available(game):
        try:
            options.get_library(game)
        except Exception as e:  # LibraryNotAvailable names the missing module
            raise InputError(str(e)) from None


# ---------------------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------------------


def _summary(values) -> dict:
    import numpy as np

    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    return {"mean": float(v.mean()) if v.size else float("nan"), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0}


def episode_metrics(game: str, res) -> list[dict]:
    """Per-episode team return and behavioural metrics of a :class:`jaxopt_marl.rollout.RolloutResult`."""
    import numpy as np

    from jaxopt_marl import audit, metrics

    rew, alive = res.traj["rewards"], res.traj["alive"]
    eff, eq, sus, pc = (
        metrics.efficiency(rew),
        metrics.equality(rew),
        metrics.sustainability(rew),
        metrics.peace(alive),
    )
    by_ep: dict[int, list] = {}
    for t in res.traces:
        by_ep.setdefault(t["rollout"], []).append(t)
    out = []
    for e in range(len(res.returns)):
        tr = by_ep.get(e, [])
        row = {
            "seed": tr[0]["seed"] if tr else None,
            "team_return": float(res.returns[e]),
            "efficiency": float(eff[e]),
            "equality": float(eq[e]),
            "sustainability": None if np.isnan(sus[e]) else float(sus[e]),
            "peace": float(pc[e]),
            "decisions": len(tr),
            "parse_fail_rate": (sum(t["parse_fail"] for t in tr) / len(tr)) if tr else 0.0,
        }
        row.update({f"final_{k}": float(v[e]) for k, v in res.stats.items() if k != "team_return"})
        if not game.startswith("overcooked"):  # apples eaten per agent (a step's reward is 0, 1 or 2 apples)
            row["agent_apples"] = [int(x) for x in audit.per_agent_apples(rew[e])[0]]
        out.append(row)
    return out


def _eval_block(game: str, res, seeds: list[int], label: str):
    """The :class:`jaxopt_marl.artifacts.EvalBlock` of one evaluated policy."""
    from jaxopt_marl.artifacts import EvalBlock

    eps = episode_metrics(game, res)
    for e, s in zip(eps, seeds):
        e["seed"] = s
    keys = [k for k in eps[0] if k != "seed" and not isinstance(eps[0][k], list)]
    return EvalBlock(
        policy=label,
        seeds=list(seeds),
        episodes=eps,
        summary={k: _summary([e[k] if e[k] is not None else float("nan") for e in eps]) for k in keys},
        parse=res.parse.as_dict(),
        seconds=res.seconds,
    )


def _eval_stats(cfg: RunConfig, trained, base) -> dict:
    """``eval.json``'s ``stats`` (paper §6.1): bootstrap CIs of the mean team return of the trained adapters and
    the frozen base (None if not run) on the same seeds, and their two-sided Mann–Whitney U test."""
    from jaxopt_marl import stats

    return stats.eval_stats(
        trained.team_returns,
        None if base is None else base.team_returns,
        seeds=trained.seeds,
        metric="team_return",
        units=cfg.units,
        labels=(trained.policy, base.policy if base is not None else "frozen_base"),
    )


def _eval_trajectories(env, roller, seeds: list[int], key, option_names, trained_res, base_res):
    """The :class:`jaxopt_marl.artifacts.EvalTrajectories` of the evaluation (``eval_traj.npz``): per-step
    buffers of both policies, the map layers (walls, terrain, Harvest patch ids) and, for Harvest, the live-apple
    grid after every step, re-played from the recorded actions (patch survival, paper Fig. 2). A replay whose
    apples eaten differ from the recorded rewards is dropped with a warning (never silently wrong data)."""
    import numpy as np

    from jaxopt_marl import artifacts

    walls, terrain, pid = artifacts.map_layers(env)

    def policy(res, label):
        t = res.traj
        apples = None
        if pid is not None:
            views = [
                roller.replay_view(s, key, t["actions"][k], lambda st: (st.apples, st.ate), "apples_ate")
                for k, s in enumerate(seeds)
            ]
            apples = np.stack([v[0] for v in views])
            ate = np.stack([v[1] for v in views]).astype(np.float32)
            played = (np.asarray(t["actions"]) >= 0).any(axis=-1)  # [E, T] steps before the episode's end
            if not np.array_equal(ate[played], np.asarray(t["rewards"], np.float32)[played]):
                print(
                    f"warning: the replayed {label} episodes eat other apples than recorded; no apple grids in "
                    f"eval_traj.npz",
                    file=sys.stderr,
                )
                apples = None
        return artifacts.PolicyTrajectories(
            positions=t["positions"],
            rewards=t["rewards"],
            alive=t["alive"],
            options=t["options"],
            actions=t["actions"],
            apples=apples,
        )

    return artifacts.EvalTrajectories(
        seeds=seeds,
        option_names=tuple(option_names),
        walls=walls,
        terrain=terrain,
        patch_id=pid,
        trained=policy(trained_res, "trained"),
        base=None if base_res is None else policy(base_res, "frozen base"),
    )


def _minimal_report(run_dir: Path, cfg: RunConfig, metrics_lines: list[dict], ev: dict) -> str:
    lines = [f"# {cfg.game} run `{run_dir.name}`", ""]
    if cfg.reduced_budget:
        lines += [
            f"**Reduced budget (preset `{cfg.preset}`)**: {cfg.rounds} rounds of "
            f"K={cfg.magrpo.num_rollouts} rollouts of {cfg.episode_steps} steps, scoring `{cfg.mode}`, "
            f"{cfg.eval_episodes} evaluation episodes. Not the paper's budget (§6.1); numbers are not "
            f"comparable to the paper's.",
            "",
        ]
    lines += [
        "## Training",
        "",
        "| round | return mean | return std | decisions | parse fail | kl | clip frac | decisions/s | round s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in metrics_lines:
        lines.append(
            f"| {m['round']} | {m['train/return_mean']:.2f} | {m['train/return_std']:.2f} | "
            f"{m['train/decisions']} | {m['train/parse_fail_rate']:.3f} | {m['train/kl']:.4f} | "
            f"{m['train/clip_frac']:.3f} | {m['perf/decisions_per_s']:.2f} | {m['perf/round_s']:.1f} |"
        )
    lines += [
        "",
        "## Evaluation",
        "",
        f"Seeds {ev['seeds'][0]}-{ev['seeds'][-1]}.",
        "",
        "| policy | team return | efficiency | equality | peace | parse fail |",
        "|---|---|---|---|---|---|",
    ]
    for block in [ev["trained"]] + ([ev["base"]] if ev.get("base") else []):
        s = block["summary"]
        lines.append(
            f"| {block['policy']} | {s['team_return']['mean']:.2f} ± {s['team_return']['std']:.2f} | "
            f"{s['efficiency']['mean']:.3f} | {s['equality']['mean']:.3f} | {s['peace']['mean']:.2f} | "
            f"{s['parse_fail_rate']['mean']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path, cfg: RunConfig, metrics_lines: list[dict], ev: dict) -> str:
    """``jaxopt_marl.report.write_report(run_dir)`` if that module exists, else a minimal ``report.md``."""
    if importlib.util.find_spec("jaxopt_marl.report") is not None:
        try:
            from jaxopt_marl import report

            report.write_report(run_dir)
            if (run_dir / "report.md").exists():
                if cfg.reduced_budget:
                    text = (run_dir / "report.md").read_text()
                    if "Reduced budget" not in text:
                        (run_dir / "report.md").write_text(
                            f"> **Reduced budget (preset `{cfg.preset}`)** — not the paper's §6.1 budget.\n\n" + text
                        )
                return "jaxopt_marl.report"
        except Exception as e:  # the report module is written in parallel; never lose a finished run to it
            print(
                f"warning: jaxopt_marl.report.write_report failed ({type(e).__name__}: {e}); writing a minimal report",
                file=sys.stderr,
            )
    (run_dir / "report.md").write_text(_minimal_report(run_dir, cfg, metrics_lines, ev))
    return "minimal"


def run(
    cfg: RunConfig,
    out: Path | None = None,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    keep_checkpoints: int = 2,
) -> Path:
    """Runs the whole pipeline into ``out``; returns the run directory.

    ``keep_checkpoints``: main checkpoints kept on disk (>= 1; ``best/`` holds one more); a disk setting, not a
    hyper-parameter, so it is not part of :class:`RunConfig` / ``config.json`` and may change on ``--resume``.
    """
    t_start = time.perf_counter()
    out = Path(out or f"runs/{cfg.game}-{cfg.preset}-s{cfg.seed}")
    # 0. Every check that needs no compute.
    check_out_dir(out)
    if keep_checkpoints < 1:
        raise InputError(f"--keep-checkpoints must be >= 1, got {keep_checkpoints}")
    check_model(cfg.model)
    if resume:
        check_resume_guards(out)  # before check_library, which imports the games (seconds)
    check_library(cfg.game)
    check_stats()
    warned: set[str] = set()  # each corrupt-checkpoint line once (the check here, then the trainer's restore)

    def warn(msg: str) -> None:
        if msg not in warned:
            warned.add(msg)
            print(f"warning: {msg}", file=sys.stderr)

    ckpt_round = prepare_run_dir(cfg, out, resume, force, warn)

    import jax
    import numpy as np

    import envs_jax
    from jaxopt_marl import guards as G
    from jaxopt_marl import options

    # 0a. On --resume, the burn-in's guards are reused: a corrupt guards.jsonl stops here, naming its file and line
    # (before the heavier imports, the model and the header).
    env = envs_jax.make(cfg.game, max_steps=cfg.episode_steps)
    lib = options.get_library(cfg.game, env)
    bdir = out / "burnin"
    guard_path = out / "guards.jsonl"
    guards = None
    if resume and (bdir / "burnin.json").exists() and guard_path.exists():
        try:
            guards = G.load_guards(guard_path, lib.option_names, lib.vocab, reasons=lib.reasons)
        except (ValueError, OSError, UnicodeDecodeError) as e:
            raise InputError(f"--resume: {e} ({_guards_hint(guard_path)})") from None

    # Compiled programs persist across runs (the 30-layer model compiles once per batch shape).
    jax.config.update(
        "jax_compilation_cache_dir", os.environ.get("JAXOPT_MARL_JAX_CACHE", str(Path("runs/.jax_cache").resolve()))
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)

    from jaxopt_marl import artifacts, audit, burnin, episode_gif, rollout, trainer
    from jaxopt_marl.records import write_records
    from lora import LoRAConfig

    n_agents = 2 if cfg.overcooked else 7
    print(
        f"jaxopt-marl {cfg.game} | preset={cfg.preset} seed={cfg.seed} device={jax.devices()[0]} "
        f"model={cfg.model or DEFAULT_MODEL_NAME} | out={out}"
    )
    mcfg = cfg.magrpo
    print(
        f"  {cfg.rounds} rounds x K={mcfg.num_rollouts} rollouts x {cfg.episode_steps} steps, {n_agents} agents, "
        f"scoring={cfg.mode}, T={mcfg.temperature}, LoRA r={cfg.lora_rank}, lr={mcfg.learning_rate}, "
        f"KL={mcfg.kl_beta}, clip={mcfg.clip_eps}, epochs={mcfg.epochs}"
    )
    print(
        f"  eval: {cfg.eval_episodes} episodes on seeds {EVAL_SEED0}-{EVAL_SEED0 + cfg.eval_episodes - 1}"
        f"{' + frozen base' if cfg.eval_base else ''}, adapters: "
        f"{CHECKPOINT_RULE if cfg.eval_checkpoint == 'best' else 'final (last round)'}"
        + (f"; solo test on {cfg.solo_episodes} seed(s)" if cfg.solo_episodes else "; no solo test")
    )
    if cfg.reduced_budget:
        print(
            f"  NOTE: preset '{cfg.preset}' is a REDUCED BUDGET, not the paper's (§6.1); results are not "
            f"comparable to the paper's numbers."
        )
    if smoke_warning(cfg):
        print(smoke_warning(cfg), file=sys.stderr)
    if resume:
        print(f"  resuming from checkpoint round {ckpt_round}" if ckpt_round else "  resuming: no checkpoint yet")
    # 0b. The model and the prompt limits, before any compute and before the run directory is written: an
    # unreadable model file, a menu longer than the letters, a prompt over its limit or letters that are not
    # single tokens stop here with a message naming the file or the game and the limit.
    n_adapters = 1 if mcfg.shared_adapter else n_agents
    lcfg = LoRAConfig(num_adapters=n_adapters, rank=cfg.lora_rank, alpha=2.0 * cfg.lora_rank)
    t0 = time.perf_counter()
    try:
        model, tok = rollout.load_policy_model(cfg.model, lcfg, seed=cfg.seed)
    except (ValueError, OSError) as e:
        raise InputError(f"model {cfg.model or DEFAULT_MODEL_NAME} could not be loaded: {e}") from None
    print(f"model loaded in {time.perf_counter() - t0:.1f} s")
    try:
        from jaxopt_marl.prompt_ids import PromptIds

        PromptIds(cfg.game, env, lib, tok, mode=cfg.mode, max_steps=cfg.episode_steps)
    except ValueError as e:
        raise InputError(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps(
            {**cfg.flat_dict(), "reduced_budget": cfg.reduced_budget, "num_agents": n_agents, "eval_seed0": EVAL_SEED0},
            indent=2,
        )
        + "\n"
    )

    # 1. Burn-in and guards (on --resume: those loaded in step 0b).
    if guards is not None:
        print(f"burn-in: reusing {bdir} ({len(guards)} guards)")
    else:
        res = burnin.run_burnin(
            lib,
            env,
            cfg.burnin_episodes,
            cfg.burnin_episodes,
            seed=cfg.seed,
            chunk=100,
            num_steps=cfg.burnin_steps or cfg.episode_steps,
            progress=progress,
        )
        guards = burnin.synthesize(lib, res.codes)
        bdir.mkdir(parents=True, exist_ok=True)
        write_records(burnin.to_table(lib, res.codes), bdir / "records.parquet")
        G.write_guards(guards, guard_path)
        (bdir / "burnin.json").write_text(
            json.dumps(
                {
                    "game": cfg.game,
                    "episodes": res.episodes,
                    "solo_episodes": res.solo_episodes,
                    "decisions": res.decisions,
                    "seconds": round(res.seconds, 3),
                    "decisions_per_s": round(res.decisions_per_s, 1),
                    "guards": len(guards),
                    "seed": cfg.seed,
                },
                indent=2,
            )
        )
        print(f"burn-in: {res.decisions} decisions in {res.seconds:.1f} s; {len(guards)} guards -> {guard_path}")
    compiled = G.compile_guards(guards, lib.vocab)

    # 2. Policy and trainer (the model was loaded and its prompt limits checked in step 0).
    pcfg = rollout.PolicyConfig(
        mode=cfg.mode,
        temperature=mcfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        shared_adapter=mcfg.shared_adapter,
    )
    # The compiled rollout (one jitted program per call of K episodes, LLM included); it also plays the
    # evaluation, the frozen base and the solo test, in calls of K.
    from jaxopt_marl.compiled_rollout import ChunkConfig, CompiledRoller

    try:
        chunks = ChunkConfig.single(mcfg.num_rollouts * n_agents) if cfg.chunking == "single" else None
        roller = CompiledRoller(
            cfg.game, env, lib, compiled, model, tok, pcfg, menu_seed=cfg.seed, batch=mcfg.num_rollouts, chunks=chunks
        )
    except ValueError as e:  # prompt or menu limits, letters that are not single tokens: before any compute
        raise InputError(str(e)) from None
    policy = roller.policy
    tr = trainer.Trainer(
        out,
        roller,
        mcfg,
        trainer.TrainConfig(
            rounds=cfg.rounds,
            seed=cfg.seed,
            skip_zero_advantage=cfg.skip_zero_advantage,
            keep_checkpoints=keep_checkpoints,
            update_progress=progress,
        ),
    )
    if resume:
        try:
            done = tr.restore(warn)
        except ValueError as e:
            raise InputError(str(e)) from None
        print(f"restored {done} completed rounds")

    # 3. Training.
    def show(m):
        print(
            f"round {m['round']}: return {m['train/return_mean']:.2f} ± {m['train/return_std']:.2f} "
            f"({m['train/decisions']} decisions, parse fail {m['train/parse_fail_rate']:.2f}, "
            f"kl {m['train/kl']:.4f}, clip {m['train/clip_frac']:.2f}, {m['perf/decisions_per_s']:.2f} dec/s, "
            f"{m['perf/round_s']:.0f} s{'' if m['train/updated'] else ', no update: no return spread'})"
        )

    tr.train(progress=progress, on_round=show)
    metrics_lines = trainer.read_metrics(out / "metrics.jsonl")

    # 4. Evaluation on held-out seeds: trained adapters, then the frozen base on the same menus.
    # The adapters: paper §6.1's checkpoint rule (those that played the round with the highest mean training
    # team return, ``best/``), or the final ones. ``checkpoint_round`` is the round whose rollouts they played
    # (final: the number of completed rounds, i.e. the round they would play next).
    ck = {
        "eval_checkpoint": cfg.eval_checkpoint,
        "checkpoint_rule": "final adapters (last round)",
        "checkpoint_round": tr.state.round,
        "checkpoint_train_return": None,
    }
    if cfg.eval_checkpoint == "best":
        try:
            best = tr.best_adapters()
        except ValueError as e:  # a corrupt best/ must not lose a finished run: evaluate the final adapters
            print(f"warning: {e}; evaluating the final adapters", file=sys.stderr)
            best, ck["checkpoint_rule"] = None, "final adapters (last round): best/ unreadable"
        if best is None:
            if ck["checkpoint_rule"] == "final adapters (last round)":
                ck["checkpoint_rule"] = "final adapters (last round): no best/ checkpoint"
            print(f"warning: no best/ checkpoint in {out}; evaluating the final adapters", file=sys.stderr)
        else:
            best_adapters, best_round, best_return = best
            policy.set_adapters(best_adapters)
            ck.update(checkpoint_rule=CHECKPOINT_RULE, checkpoint_round=best_round, checkpoint_train_return=best_return)
    print(
        f"eval adapters: {ck['checkpoint_rule']}, round {ck['checkpoint_round']}"
        + (
            f" (training return {ck['checkpoint_train_return']:.2f})"
            if ck["checkpoint_train_return"] is not None
            else ""
        )
    )
    seeds = list(range(EVAL_SEED0, EVAL_SEED0 + cfg.eval_episodes))
    eval_key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), 10**6)
    ev_res = roller.collect(seeds, eval_key, round_idx=-1, progress=progress, desc="eval trained")
    artifacts.save_traces(out / "decisions" / "eval.jsonl", ev_res.traces)
    trained_block, base_block, base_res = _eval_block(cfg.game, ev_res, seeds, "trained"), None, None
    if cfg.eval_base:
        base_res = roller.collect(
            seeds, eval_key, round_idx=-1, reference=True, progress=progress, desc="eval frozen base"
        )
        artifacts.save_traces(out / "decisions" / "eval_base.jsonl", base_res.traces)
        base_block = _eval_block(cfg.game, base_res, seeds, "frozen_base")
    record = artifacts.EvalRecord(
        game=cfg.game,
        preset=cfg.preset,
        reduced_budget=cfg.reduced_budget,
        seeds=seeds,
        trained=trained_block,
        base=base_block,
        **ck,
        stats=_eval_stats(cfg, trained_block, base_block),
    )
    record.save(out / "eval.json")
    ev = record.to_dict()
    # Solo test (paper §6.4): each agent alone on the first solo_episodes evaluation seeds (one batched collect
    # per agent, the others idled on ``wait``, same key as the evaluation); the full team's returns on those
    # seeds are the evaluation's.
    if cfg.solo_episodes > 0:
        solo_seeds = seeds[: cfg.solo_episodes]
        units = cfg.units

        def play_solo(active, ss):
            res = roller.collect(
                list(ss),
                eval_key,
                round_idx=-1,
                progress=progress,
                desc=f"solo agent {int(np.argmax(active))}",
                active=active,
            )
            if cfg.overcooked:  # a delivery rewards every agent: own deliveries from the agent's decisions
                own = np.stack(
                    [
                        audit.successes_per_agent([t for t in res.traces if t["rollout"] == b], num_agents=n_agents)
                        for b in range(len(ss))
                    ]
                )
            else:  # apples eaten (a step's reward counts the apples eaten in it)
                own = audit.per_agent_apples(res.traj["rewards"])
            return {"team": res.returns, "agent": own}

        solo = audit.solo_test(
            play_solo, n_agents, solo_seeds, batched=True, full_team=ev_res.returns[: len(solo_seeds)]
        )
        solo.record(
            units,
            game=cfg.game,
            **ck,
            idled="every other agent takes the wait option at each of its decision points (no LLM call)",
            full_team_source="eval.json trained episodes on the same seeds",
        ).save(out / "solo.json")
        print(
            f"solo test ({units}, seeds {solo_seeds[0]}-{solo_seeds[-1]}): "
            + ", ".join(f"agent {i} alone {m:.2f}" for i, m in enumerate(solo.summary()["solo_mean"]))
            + f"; full team {solo.summary()['full_mean'][0]:.2f} -> {solo.verdict()}"
        )
    # A GIF of the first evaluation episode (eval.json's episode 0, seed 10000): its recorded primitive actions
    # replayed with the same env keys and rendered, with a step counter, a caption and a colour legend.
    episode_gif.write_episode_gif(
        roller.replay_frames(seeds[0], eval_key, ev_res.traj["actions"][0]),
        out / "episode.gif",
        env,
        f"{cfg.game}: " + episode_gif.gif_caption(seeds[0], f"trained adapters of round {ck['checkpoint_round']}"),
        fps=8,
    )
    _eval_trajectories(env, roller, seeds, eval_key, lib.option_names, ev_res, base_res).save(out / "eval_traj.npz")

    # 5. Report.
    how = write_report(out, cfg, metrics_lines, ev)
    s = ev["trained"]["summary"]["team_return"]
    print(
        f"eval trained: team return {s['mean']:.2f} ± {s['std']:.2f}"
        + (
            f"; frozen base {ev['base']['summary']['team_return']['mean']:.2f} ± "
            f"{ev['base']['summary']['team_return']['std']:.2f}"
            if ev["base"]
            else ""
        )
    )
    print(f"total wall time {time.perf_counter() - t_start:.0f} s")
    for f in (
        "config.json",
        "burnin/records.parquet",
        "burnin/burnin.json",
        "guards.jsonl",
        "metrics.jsonl",
        "checkpoints/",
        "best/",
        "decisions/",
        "eval.json",
        "solo.json",
        "eval_traj.npz",
        "episode.gif",
        "report.md",
    ):
        if (out / f).exists():
            print(f"wrote {out / f}" + (" (report: " + how + ")" if f == "report.md" else ""))
    return out


def cli(game: str | None, prog: str, argv: list[str] | None = None) -> Path:
    """The command line's entry point: :func:`main` on ``argv`` (default ``sys.argv[1:]``) under
    :func:`experiments.cli.run_cli`.

    Raises:
        SystemExit: status :data:`INPUT_ERROR_STATUS` (2) on bad input, after one line ``error: ...`` on stderr
            (``--debug``: the traceback too).
    """
    return run_cli(lambda a: main(game, a, prog=prog), argv)


def main(game: str | None, argv: list[str] | None = None, prog: str = "experiments") -> Path:
    """Parse, print, run. ``game=None`` means Overcooked with ``--layout``."""
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
    cfg = config_from_args(game, args)
    return run(
        cfg,
        Path(args.out) if args.out else None,
        resume=args.resume,
        force=args.force,
        keep_checkpoints=args.keep_checkpoints,
    )
