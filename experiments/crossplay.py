"""``python -m experiments.crossplay RUN_DIR...``: cross-play of trained teams (zero-shot coordination).

Beyond the paper (which evaluates each run's own team, §6.1): how well do agents trained in different runs of the
same game play together? Each RUN_DIR is a finished run (:func:`jaxopt_marl.pipeline.run`, e.g. the
``seed_<s>/`` of :mod:`experiments.seeds`); its adapters are those its evaluation played (``eval.json``:
``best/``, paper §6.1's checkpoint rule, or the final ones of ``checkpoints/``; :func:`load_adapters`). With R runs
(labelled ``run0 .. run{R-1}`` in the order given) and N agents, the teams played are:

- **self-play** (the matrix's diagonal): run a's own team, seat j playing a's adapter j;
- **cross-play** (off the diagonal, cell (a, b) for a != b): for each seat i, seat i plays a's adapter i and every
  other seat j plays b's adapter j (N teams per cell, their episodes pooled). For a 2-agent game (Overcooked)
  the teams of cells (a, b) and (b, a) are exactly the fully mixed assignments (a's agent 0 with b's agent 1,
  and b's agent 0 with a's agent 1), each played under both runs' interfaces;
- **permutations** (per run): every non-trivial cyclic shift c = 1 .. N-1 of run a's adapters, seat j playing
  a's adapter (j + c) mod N (for N = 2: the swap).

A team plays under the interface of its host run (b for cell (a, b), a for self-play and permutations): that
run's option library, guards (``guards.jsonl``), letter-shuffle seed, evaluation key and model base (equal across
runs for a real model; ``tiny-random``'s base weights depend on the seed). The episodes are the evaluation's
(:func:`jaxopt_marl.evaluation.play`: held-out env seeds 10000, 10001, ..., ``--episodes`` of them, default the
runs' ``eval_episodes``), so a self-play team with the run's default episodes replays its ``eval.json`` exactly.

``OUT/crossplay.json`` and ``OUT/crossplay.md`` (default ``OUT``: ``crossplay/`` next to the first run): the
R x R matrix, each cell :func:`jaxopt_marl.stats.summarize` of its per-episode team returns (mean, sample std,
95% percentile bootstrap CI of the mean, 10,000 resamples), every team's seats, per-episode returns and episode metrics (:func:`jaxopt_marl.evaluation.eval_block`'s), the
permutation teams, and the **ZSC gap** = mean self-play return - mean cross-play return. Its CI is a paired
bootstrap over the evaluation seeds: on seed e, d_e = (mean over the R self-play teams of their return on e) -
(mean over the R (R-1) N cross-play teams of their return on e); the gap is mean_e d_e (every team plays every
seed, so this is exactly the difference of the pooled means) and its CI :func:`jaxopt_marl.stats.summarize`'s
percentile bootstrap of the mean of d (resampling seeds, each resample keeping a seed's self- and cross-play
returns together). The permutation gap (self-play - permuted) is computed the same way. Units: the game's team
return (apples eaten, soups delivered).

At least two RUN_DIRs: one alone is refused (it has no cross-play). The same directory may be given twice (or
more): that crosses the run with itself, a check whose ZSC gap is 0 by construction; the output then says so
(``note`` in crossplay.json, a line in crossplay.md and on stdout).

Bad input is one line ``error: ...`` and exit status 2, before any model is built and before anything is
written: fewer than two RUN_DIRs; a RUN_DIR that does not exist or lacks ``config.json`` / ``eval.json`` / the
adapter checkpoint its evaluation played (``best/`` or ``checkpoints/``, checked for every run first); runs of
different games, models, agent counts or LoRA shapes (:data:`MUST_MATCH`) or of different evaluation settings
(:data:`EVAL_MUST_MATCH`: ``episode_steps``, ``mode``, ``temperature``, ``max_new_tokens``, ``eval_seed0``), or
of different ``eval_episodes`` without ``--episodes`` -- each differing value named with its runs --; a shared
adapter run; ``--episodes`` < 1; an ``--out`` that is a file or not writable.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from experiments.cli import ArgParser, InputError, positive, run_cli
from jaxopt_marl.config import CHECKPOINT_RULE, RunConfig
from jaxopt_marl.preflight import check_out_dir

#: ``config.json`` keys every run of one cross-play must share (the adapters must fit one model and one game).
MUST_MATCH = ("game", "model", "num_agents", "lora_rank", "lora_alpha", "lora_targets", "shared_adapter")
#: ``config.json`` keys every run must share because the evaluation episodes depend on them (a team plays its
#: host's settings, so runs differing in these would put teams in different games): episode length, scoring
#: mode, sampling temperature, response budget and the first evaluation seed. (``eval_episodes`` must match too
#: unless ``--episodes`` sets it for every run; the library, guards, seed and K are each host's interface.)
EVAL_MUST_MATCH = ("episode_steps", "mode", "temperature", "max_new_tokens", "eval_seed0")
#: ``config.json`` keys that are not :class:`RunConfig` fields.
DERIVED_KEYS = ("reduced_budget", "num_agents", "eval_seed0")
CROSSPLAY_JSON, CROSSPLAY_MD = "crossplay.json", "crossplay.md"


def config_from_json(d: dict) -> RunConfig:
    """The :class:`RunConfig` of a run's ``config.json`` (its preset with every recorded value).

    Raises:
        ValueError: a bad or unknown value (named).
    """
    kw = {k: v for k, v in d.items() if k not in DERIVED_KEYS and k not in ("game", "preset")}
    return RunConfig.from_preset(d["preset"], d["game"], **kw)


# -- teams ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Team:
    """One evaluated team.

    Attributes:
        kind: ``self``, ``cross`` or ``perm``.
        seats: ``((run, agent), ...)`` per seat j: seat j plays adapter ``agent`` of run ``run`` (indices into
            the RUN_DIR list and into that run's stacked adapters).
        host: the run whose interface (library, guards, letter shuffles, evaluation key, base) the team plays.
        cell: the matrix cell ``(a, b)`` (``self``: ``(a, a)``; ``perm``: ``(a, a)`` too, outside the matrix).
        label: e.g. ``run0 x run1 (seat 1 from run0)``.
    """

    kind: str
    seats: tuple[tuple[int, int], ...]
    host: int
    cell: tuple[int, int]
    label: str


def teams(num_runs: int, num_agents: int) -> list[Team]:
    """Every team of a cross-play of ``num_runs`` runs of ``num_agents`` agents (module docstring): self-play per
    run, then for each ordered pair (a, b), a != b, and seat i the team of seat i from a and the rest from b, then
    each run's cyclic shifts 1 .. N-1."""
    n = num_agents
    out = [Team("self", tuple((a, j) for j in range(n)), a, (a, a), f"run{a} self-play") for a in range(num_runs)]
    for a, b in itertools.permutations(range(num_runs), 2):
        for i in range(n):
            seats = tuple((a, i) if j == i else (b, j) for j in range(n))
            out.append(Team("cross", seats, b, (a, b), f"seat {i} from run{a}, the rest from run{b}"))
    for a in range(num_runs):
        for c in range(1, n):
            seats = tuple((a, (j + c) % n) for j in range(n))
            out.append(Team("perm", seats, a, (a, a), f"run{a} adapters shifted by {c}"))
    return out


#: The agent axis of a stacked LoRA leaf, counted from the end: ``[..., N, in, rank]`` / ``[..., N, rank, out]``.
AGENT_AXIS = -3


def assemble(sources: Sequence, seats: Sequence[tuple[int, int]]):
    """The stacked adapters of a team: leaf ``x`` of the result is ``stack([sources[r].x[k] for r, k in seats])``.

    Args:
        sources: one adapter pytree per run, every leaf stacked over that run's agents on its third axis from
            the end (:data:`AGENT_AXIS`: ``lora_a`` float32[..., N, in, rank], ``lora_b`` float32[..., N, rank,
            out]; the leading axes are the layers of :class:`lora.Decoder`'s scanned blocks, none for
            :class:`lora.backbones.LayerwiseDecoder`); all with the same structure and shapes.
        seats: per seat j, ``(run, agent)``: seat j plays adapter ``agent`` of ``sources[run]``.

    Returns:
        A pytree of ``sources[0]``'s structure whose leaves have ``len(seats)`` on the agent axis: entry j is seat
        j's adapter (every layer of it).

    Raises:
        ValueError: a seat names a run or agent that does not exist (named).
    """
    import jax
    import jax.numpy as jnp

    for j, (r, k) in enumerate(seats):
        if not 0 <= r < len(sources):
            raise ValueError(f"seat {j}: run {r} is outside 0..{len(sources) - 1}")
        n = jax.tree.leaves(sources[r])[0].shape[AGENT_AXIS]
        if not 0 <= k < n:
            raise ValueError(f"seat {j}: agent {k} is outside 0..{n - 1} (run {r} has {n} adapters)")

    def seat_stack(*leaves):
        return jnp.stack([jnp.take(leaves[r], k, axis=AGENT_AXIS) for r, k in seats], axis=leaves[0].ndim + AGENT_AXIS)

    return jax.tree.map(seat_stack, *sources)


# -- runs -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """A loaded RUN_DIR: its directory, ``config.json`` (dict and :class:`RunConfig`) and ``eval.json``."""

    dir: Path
    config: dict
    cfg: RunConfig
    eval: object


def load_run(d: str | Path) -> Run:
    """Reads ``d/config.json`` and ``d/eval.json`` (no compute).

    Raises:
        InputError: ``d`` does not exist, or a file is missing or unreadable (named).
    """
    from jaxopt_marl import artifacts

    d = Path(d)
    if not d.is_dir():
        raise InputError(f"run directory {d} does not exist")
    for f in ("config.json", "eval.json"):
        if not (d / f).exists():
            raise InputError(f"{d / f} is missing (not a finished run directory)")
    try:
        config = json.loads((d / "config.json").read_text())
        cfg = config_from_json(config)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"{d / 'config.json'} is unreadable ({type(e).__name__}: {e})") from None
    try:
        ev = artifacts.EvalRecord.load(d / "eval.json")
    except (OSError, ValueError, artifacts.ArtifactError) as e:
        raise InputError(f"{d / 'eval.json'} is unreadable ({e})") from None
    return Run(d, config, cfg, ev)


def _differing(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
    diffs = []
    for k in keys:
        vals = [json.dumps(r.config.get(k)) for r in runs]
        if len(set(vals)) > 1:
            diffs.append(f"{k}: " + ", ".join(f"{r.dir} {v}" for r, v in zip(runs, vals)))
    return diffs


def check_compatible(runs: Sequence[Run], episodes: int | None = None) -> None:
    """InputError naming each :data:`MUST_MATCH` or :data:`EVAL_MUST_MATCH` key whose value differs, with the
    value of every run; and ``eval_episodes`` when it differs and ``episodes`` (``--episodes``) is not given."""
    warmed = [f"{r.dir} ({r.config['format_warmup']} steps)" for r in runs if r.config.get("format_warmup")]
    if warmed:
        raise InputError(
            "cross-play seats every run's adapters on one frozen base; a format warm-up (jaxopt_marl.format_warmup) "
            "merged its own steps into each run's base, so these runs cannot be crossed: " + ", ".join(warmed)
        )
    diffs = _differing(runs, MUST_MATCH)
    if diffs:
        raise InputError("cross-play needs runs of one game, model and agent count; they differ in " + "; ".join(diffs))
    diffs = _differing(runs, EVAL_MUST_MATCH)
    if diffs:
        raise InputError(
            "cross-play needs runs whose evaluation episodes are played alike; they differ in " + "; ".join(diffs)
        )
    if episodes is None:
        diffs = _differing(runs, ("eval_episodes",))
        if diffs:
            raise InputError(
                "the runs' evaluation episode counts differ (" + diffs[0] + "): pass --episodes N to play every "
                "team on the same N seeds"
            )
    if runs[0].cfg.magrpo.shared_adapter:
        raise InputError(f"{runs[0].dir}: a shared-adapter run has one adapter for every seat: nothing to cross")


def adapter_source(run: Run) -> tuple[str, int]:
    """``("best" | "checkpoints", round)``: where the adapters the run's evaluation played are (eval.json's
    ``eval_checkpoint`` and ``checkpoint_rule``: ``best/`` under paper §6.1's rule, else the last checkpoint)."""
    ev = run.eval
    if ev.eval_checkpoint == "best" and ev.checkpoint_rule == CHECKPOINT_RULE:
        return "best", int(ev.checkpoint_round)
    return "checkpoints", int(ev.checkpoint_round)


def check_adapters(run: Run) -> None:
    """InputError unless the adapter checkpoint ``run``'s evaluation played (:func:`adapter_source`) is on disk
    with a complete newest step (no model is built; the round is checked at :func:`load_adapters`)."""
    from lora import checkpoint as ckpt

    where, round_ = adapter_source(run)
    path = run.dir / where
    if not path.is_dir():
        raise InputError(f"{path} is missing ({run.dir / 'eval.json'} evaluated {where} adapters of round {round_})")
    step = ckpt.make_manager(str(path), max_to_keep=None).latest_step()
    if step is None:
        raise InputError(f"{path} holds no checkpoint ({run.dir / 'eval.json'} evaluated round {round_})")
    problem = ckpt.verify(ckpt.step_dir(ckpt.make_manager(str(path), max_to_keep=None), step))
    if problem is not None:
        raise InputError(f"{path}: checkpoint {step} is corrupt: {problem}")


def load_adapters(run: Run, template):
    """The adapters ``run``'s evaluation played, restored into a copy of ``template`` (an adapter state of the
    run's shapes). ``best/``: its one step, whose meta round must be eval.json's ``checkpoint_round``;
    ``checkpoints/``: the newest step (= completed rounds = ``checkpoint_round``).

    Raises:
        InputError: the directory has no checkpoint, or not the one eval.json names (both rounds named).
    """
    import jax
    import jax.numpy as jnp

    from lora import checkpoint as ckpt

    where, round_ = adapter_source(run)
    path = run.dir / where
    if not path.is_dir():
        raise InputError(f"{path} is missing ({run.dir / 'eval.json'} evaluated {where} adapters of round {round_})")
    manager = ckpt.make_manager(str(path), max_to_keep=None)
    step = manager.latest_step()
    if step is None:
        raise InputError(f"{path} holds no checkpoint")
    problem = ckpt.verify(ckpt.step_dir(manager, step))
    if problem is not None:
        raise InputError(f"{path}: checkpoint {step} is corrupt: {problem}")
    adapters, _, meta = ckpt.restore(manager, jax.tree.map(jnp.copy, template), None, step)
    got = int(meta.get("round", step)) if where == "best" else int(step)
    if got != round_:
        raise InputError(f"{path}: checkpoint of round {got}, but {run.dir / 'eval.json'} evaluated round {round_}")
    return adapters


class Host:
    """One run's interface: the roller (its library, guards, letter shuffles, model) the teams it hosts play."""

    def __init__(self, run: Run):
        import envs_jax
        from jaxopt_marl import guards as G
        from jaxopt_marl import options, rollout, seeding
        from jaxopt_marl.compiled_rollout import CompiledRoller
        from jaxopt_marl.prompt_ids import PromptIds
        from lora import split_model

        cfg = self.cfg = run.cfg
        env = envs_jax.make(cfg.game, max_steps=cfg.episode_steps)
        lib = options.get_library(cfg.game, env, library=cfg.library)
        guards = G.load_guards(run.dir / "guards.jsonl", lib.option_names, lib.vocab, reasons=lib.reasons)
        model, tok = rollout.load_policy_model(cfg.model, cfg.lora, seed=seeding.lora_init_seed(cfg.seed))
        prompt = PromptIds(cfg.game, env, lib, tok, mode=cfg.mode, max_steps=cfg.episode_steps, interface=cfg.interface)
        compiled = G.compile_guards(guards, lib.vocab)
        self.roller = CompiledRoller.for_run(
            cfg, env, lib, compiled, model, tok, batch=cfg.magrpo.num_rollouts, prompt=prompt
        )
        self.template = split_model(model)[1]


def gap(a_teams: list[list[float]], b_teams: list[list[float]]) -> dict:
    """Paired-bootstrap difference of two groups of teams on the same seeds (module docstring).

    Args:
        a_teams, b_teams: float[T_a][E] and float[T_b][E], per team its per-seed team returns.

    Returns:
        ``{"gap", "ci", "per_seed"}``: ``mean(a) - mean(b)``, the 95% percentile bootstrap CI of the mean of
        ``per_seed`` (None for one seed), ``per_seed`` = float[E] d_e.
    """
    from jaxopt_marl import stats

    a, b = np.asarray(a_teams, np.float64), np.asarray(b_teams, np.float64)
    d = a.mean(axis=0) - b.mean(axis=0)
    s = stats.summarize(d, "per-seed gap")
    return {"gap": s["mean"], "ci": s["ci"], "per_seed": d.tolist()}


def tabulate(played: Sequence[tuple[Team, list[float], list[dict]]], num_runs: int) -> dict:
    """The results of the played teams (:func:`teams` order): ``matrix`` (``cells[a][b]``:
    :func:`jaxopt_marl.stats.summarize` of the pooled per-episode returns of cell (a, b)'s teams), ``self_play``,
    ``cross_play``, ``permuted`` (pooled summaries), ``zsc_gap`` = :func:`gap` (self-play, cross-play),
    ``permutation_gap`` = :func:`gap` (self-play, permuted), and ``teams`` (kind, label, seats, host, returns,
    episodes).

    Args:
        played: per team, ``(team, float[E] per-episode team returns, E episode dicts)``; every team on the same
            E evaluation seeds.
        num_runs: R.
    """
    from jaxopt_marl import stats

    labels = [f"run{i}" for i in range(num_runs)]
    matrix = [[None] * num_runs for _ in range(num_runs)]
    for a, b in itertools.product(range(num_runs), repeat=2):
        vals = [v for t, rets, _ in played if t.kind in ("self", "cross") and t.cell == (a, b) for v in rets]
        matrix[a][b] = stats.summarize(vals, f"{labels[a]} x {labels[b]}")
    sp = [rets for t, rets, _ in played if t.kind == "self"]
    xp = [rets for t, rets, _ in played if t.kind == "cross"]
    pp = [rets for t, rets, _ in played if t.kind == "perm"]
    pooled = lambda groups, name: stats.summarize([v for rets in groups for v in rets], name) if groups else None
    return {
        "matrix": {"rows": "seat(s) from run a", "cols": "the rest from run b", "labels": labels, "cells": matrix},
        "self_play": pooled(sp, "self-play"),
        "cross_play": pooled(xp, "cross-play"),
        "permuted": pooled(pp, "permuted"),
        "zsc_gap": {
            **gap(sp, xp),
            "definition": "self-play mean - cross-play mean; CI: paired percentile bootstrap over evaluation seeds "
            "(10,000 resamples) of the per-seed difference",
        }
        if xp
        else None,
        "permutation_gap": gap(sp, pp) if pp else None,
        "permutations": "cyclic shifts 1..N-1 of each run's adapters (seat j plays adapter (j + c) mod N)",
        "teams": [
            {
                "kind": t.kind,
                "label": t.label,
                "seats": [list(s) for s in t.seats],
                "host": labels[t.host],
                "returns": list(rets),
                "episodes": eps,
            }
            for t, rets, eps in played
        ],
    }


def crossplay(run_dirs: Sequence[str | Path], out: Path, episodes: int | None = None, progress: bool = True) -> dict:
    """Plays every team of :func:`teams` and writes ``out/crossplay.json`` and ``out/crossplay.md``.

    Raises:
        InputError: bad input (module docstring), before any compute.
    """
    from jaxopt_marl import evaluation

    if len(run_dirs) < 2:
        raise InputError(
            f"cross-play needs at least two runs, got {len(run_dirs)} ({', '.join(map(str, run_dirs))}); give the "
            "same directory twice to cross a run with itself"
        )
    runs = [load_run(d) for d in run_dirs]
    positive("--episodes", episodes)
    check_compatible(runs, episodes)
    check_out_dir(Path(out))
    for r in runs:
        check_adapters(r)
    one_run = len({r.dir.resolve() for r in runs}) == 1
    episodes = episodes or runs[0].cfg.eval_episodes  # every team plays the same seeds (the gaps pair them)
    for r in runs:
        if r.cfg.eval_episodes != episodes:
            r.cfg = r.cfg.replace(eval_episodes=episodes, solo_episodes=min(r.cfg.solo_episodes, episodes))
    n, e_count = runs[0].cfg.num_agents, runs[0].cfg.eval_episodes
    hosts: dict[Path, Host] = {}
    for r in runs:  # one host per distinct run directory
        key = r.dir.resolve()
        if key not in hosts:
            hosts[key] = Host(r)
    sources = [load_adapters(r, hosts[r.dir.resolve()].template) for r in runs]
    played = []
    for t in teams(len(runs), n):
        run = runs[t.host]
        host = hosts[run.dir.resolve()]
        block, _ = evaluation.play(
            run.cfg, host.roller, t.label, adapters=assemble(sources, t.seats), progress=progress, desc=t.label
        )
        played.append((t, block.team_returns, block.episodes))
        print(f"{t.label}: team return {np.mean(block.team_returns):.2f}", flush=True)
    result = {
        "game": runs[0].cfg.game,
        "model": runs[0].config.get("model"),
        "num_agents": n,
        "units": runs[0].cfg.units,
        "runs": [
            {
                "label": f"run{i}",
                "dir": str(r.dir),
                "seed": r.cfg.seed,
                "library": r.cfg.library,
                "adapters": dict(zip(("source", "round"), adapter_source(r))),
            }
            for i, r in enumerate(runs)
        ],
        "eval_seeds": evaluation.eval_seeds(runs[0].cfg),
        "episodes": e_count,
        **tabulate(played, len(runs)),
        "note": f"every RUN_DIR is the same run ({runs[0].dir}): cross-play is that run with itself, so the ZSC "
        "gap is 0 by construction (a check, not a zero-shot coordination result)"
        if one_run
        else None,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / CROSSPLAY_JSON).write_text(json.dumps(result, indent=2) + "\n")
    (out / CROSSPLAY_MD).write_text(markdown(result))
    return result


def _cell(s: dict | None) -> str:
    if s is None or s.get("mean") is None:
        return "—"
    ci = s.get("ci")
    return f"{s['mean']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def markdown(r: dict) -> str:
    """``crossplay.md``: the runs, the matrix with self-play on the diagonal, the gaps."""
    labels = r["matrix"]["labels"]
    lines = [
        f"# Cross-play: {r['game']}, {len(labels)} runs ({r['num_agents']} agents)",
        "",
        f"Mean team return ({r['units']}) with 95% bootstrap CI over {r['episodes']} held-out episodes per team "
        f"(seeds {r['eval_seeds'][0]}..{r['eval_seeds'][-1]}). Row a, column b: one seat from a, the rest from b "
        "(every seat in turn, pooled); the diagonal is self-play.",
        "",
        "| run | dir | seed | library | adapters |",
        "|---|---|---|---|---|",
        *(
            f"| {x['label']} | {x['dir']} | {x['seed']} | {x['library']} | {x['adapters']['source']} "
            f"(round {x['adapters']['round']}) |"
            for x in r["runs"]
        ),
        "",
        "| a \\ b | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
        *(f"| {labels[a]} | " + " | ".join(_cell(c) for c in row) + " |" for a, row in enumerate(r["matrix"]["cells"])),
        "",
        *([f"**Note:** {r['note']}.", ""] if r.get("note") else []),
        f"Self-play {_cell(r['self_play'])}; cross-play {_cell(r['cross_play'])}; permuted adapters "
        f"{_cell(r['permuted'])} ({r['permutations']}).",
        "",
    ]
    for name, key in (("ZSC gap (self-play − cross-play)", "zsc_gap"), ("Permutation gap", "permutation_gap")):
        g = r[key]
        if g is not None:
            ci = g["ci"]
            lines.append(
                f"**{name}:** {g['gap']:.2f}"
                + (f" (95% CI [{ci[0]:.2f}, {ci[1]:.2f}], paired bootstrap over seeds)" if ci else " (one seed: no CI)")
            )
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Path:
    ap = ArgParser(prog="python -m experiments.crossplay", description="cross-play of trained runs (ZSC gap)")
    ap.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finished run directories of one game")
    ap.add_argument("--episodes", type=int, default=None, help="evaluation episodes per team (default: the runs')")
    ap.add_argument("--out", default=None, help="output directory (default: crossplay/ next to the first run)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    positive("--episodes", args.episodes)
    out = Path(args.out) if args.out else Path(args.run_dirs[0]).resolve().parent / "crossplay"
    r = crossplay(args.run_dirs, out, args.episodes)
    if r.get("note"):
        print(f"note: {r['note']}")
    if r["zsc_gap"] is not None:
        print(f"ZSC gap {r['zsc_gap']['gap']:.2f} (CI {r['zsc_gap']['ci']})")
    print(f"wrote {out / CROSSPLAY_JSON}\nwrote {out / CROSSPLAY_MD}")
    return out


def cli(argv: list[str] | None = None) -> Path:
    """:func:`main` under :func:`experiments.cli.run_cli` (bad input: one line ``error: ...``, exit 2)."""
    return run_cli(main, argv)


__all__ = [
    "Team",
    "assemble",
    "check_adapters",
    "check_compatible",
    "crossplay",
    "gap",
    "load_adapters",
    "load_run",
    "main",
    "tabulate",
    "teams",
]

if __name__ == "__main__":
    cli()
