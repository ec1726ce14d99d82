"""``python -m experiments.table2 --game G``: the six ablation cells of paper Table 2 for one game (§6.2) and the
§6.3 trajectory analyses of each.

Cells (:data:`CELLS`, in the paper's row order; ``--cells`` picks some of them), each a normal end-to-end run
(:func:`jaxopt_marl.pipeline.run`) in its own directory ``OUT/<cell>/``, so a killed grid resumes cell by cell:

==========================  ==============================================================  ===================
cell                        what                                                            paper
==========================  ==============================================================  ===================
``frozen_native``           frozen base, native interface (primitive actions), no training  Ablation C
``frozen_menu``             frozen base, option menu, no training                           "Frozen + menu"
``native_magrpo``           native interface + per-agent LoRA + PA-MAGRPO                   Ablation A
``compound_json_magrpo``    compound-JSON interface + per-agent LoRA + PA-MAGRPO            Ablation D
``shared_lora_menu``        option menu + one shared LoRA adapter + PA-MAGRPO               Ablation B
``full``                    option menu + per-agent LoRA + PA-MAGRPO                        the method
==========================  ==============================================================  ===================

Every cell is built from the same flags (:func:`experiments.common.config_from_args`: preset, ``--model``,
``--seed``, ``--rounds``, ``--episode-steps``, ``--rollouts``, ``--temperature``, ``--learning-rate``, the
evaluation flags, ...), so the cells share the base model, the rollout budget, the optimizer settings, the
sampling temperature, the checkpoint rule (paper §6.1: highest training-time team return), the seed (hence the
option library, the burn-in, the guards and the letter shuffles of the menu cells) and the evaluation seeds
10000.. . A cell changes only what its row names (:func:`cell_config`): ``interface`` (``--interface`` is the
grid's, refused as a flag), ``rounds = 0`` for a frozen cell, ``shared_adapter`` for Ablation B, and for the
compound-JSON cell what that interface needs (:func:`jaxopt_marl.interfaces.run_overrides`: ``mode = sample`` and a
:data:`jaxopt_marl.interfaces.COMPOUND_MAX_NEW_TOKENS`-token response budget, since a JSON object is longer than
a letter, unless ``--mode`` says otherwise). ``table2.json`` lists every such difference per cell
(``config_differences``, against ``full``) and ``table2.md`` states them.

Frozen cells (design). A frozen cell is its own run directory with ``rounds = 0``
(:attr:`jaxopt_marl.config.RunConfig.frozen`): the pipeline runs the burn-in and guard synthesis (so the frozen
menu cell is shown exactly the guarded, shuffled menu the trained menu cells start from), trains nothing (no
trainer, no checkpoints, no ``metrics.jsonl``), and its evaluation plays the frozen base with the adapters off
(``reference``) on the 20 evaluation seeds with the evaluation's key: the very episodes a trained cell's
``eval_base`` would play under that interface. So the frozen numbers come from adapters-off episodes on the trained
cells' seeds, written by the same code into the same files (``eval.json``, ``decisions/eval.jsonl``,
``eval_traj.npz``) that the analyses read for every cell alike, and a frozen cell resumes and is skipped like any
other. The alternative, reading each trained cell's ``eval_base`` block, would tie a frozen row to a trained
cell's run (a killed trained cell would lose its frozen row too) and needs the analyses to read two kinds of
blocks; it would also play the frozen base once per trained cell. Hence every cell runs with ``eval_base`` off:
the two frozen cells are the frozen base's evaluations, once per interface (the compound-JSON cell has none of
its own: the paper's Table 2 has no frozen compound-JSON row).

``OUT/table2.json`` and ``OUT/table2.md`` (:func:`summarize`) cover every cell of :data:`CELLS` whose directory
holds a finished run (``report.md`` and ``eval.json``) of exactly the configuration this call gives it
(:func:`experiments.seeds.finished`): this call's cells and those of earlier calls into the same OUT with the
same flags; the others are named as missing. Per cell (units: the game's team return, apples or deliveries):

- ``team_return``: mean ± sample std over the evaluation episodes and the 95% percentile bootstrap CI
  (:func:`jaxopt_marl.stats.summarize`, paper §6.1) of the evaluated policy's per-episode team return
  (``eval.json``);
- ``per_agent``: float[N] mean over episodes of each agent's return (:func:`per_agent_returns`);
- ``mann_whitney``: the two-sided Mann–Whitney U test (:func:`jaxopt_marl.stats.mann_whitney`) of the cell's
  episodes against each frozen cell's (None against itself);
- ``dagger``: the paper's † ("training collapsed at zero return for the entire training horizon"): a trained
  cell whose ``train/return_mean`` (``metrics.jsonl``) is 0 in every round (None for a frozen cell);
- ``analysis`` (§6.3, :func:`analyse`): the LLM call ratio, the top-action share, the option / action histogram
  per agent and, for a Cleanup native cell, the fire_clean-after-turn rate;
- ``interface``, ``trained``, ``dir``, the checkpoint the evaluation played, ``config_differences``.

``patterns`` (:func:`patterns`): the qualitative claims of §6.2-§6.3 as computed booleans with their numbers
(native cells near 0 with one dominant letter; shared LoRA below per-agent LoRA on Cleanup and Overcooked AA;
the full method the best cell), each None when a cell it needs is missing.

``--resume``: a cell whose run finished with these settings is skipped; a cut one is resumed from its last
checkpoint (a frozen cell, having none, replays its evaluation); one never started is started; a started cell
of other settings is refused before any compute, naming every differing ``config.json`` key with both values
(:func:`experiments.seeds.plan_runs`, :func:`jaxopt_marl.preflight.prepare_run_dir`; only the keys of
:data:`jaxopt_marl.config.RESUME_MAY_DIFFER` may change, ``rounds`` to extend the trained cells). Without
``--resume`` (or ``--force``) an existing ``OUT/<cell>/`` is refused before any compute. ``--out`` defaults to
``runs/<game>-<preset>-table2``.

``--distributed`` (issue #17; the flags and variables of :mod:`jaxopt_marl.distributed`): the cells split over
the P processes, process p running cells ``p, p + P, ...`` of the list (interleaved, so that the cheap frozen
cells, listed first, spread over the processes), each as an independent run on its own devices; they meet through
``OUT/processes/`` (:mod:`experiments.split`) and process 0 writes the table once every process's share is done.
A cell count that P does not divide is refused before any compute, naming both.

Bad input (unknown game, preset or cell, which lists the valid cells; ``--interface``; a cell configuration that
does not validate, named with its cell; an existing cell directory without ``--resume``; a ``--resume`` of other
settings; any check of :mod:`experiments.common` / :func:`jaxopt_marl.pipeline.run`) is one line ``error: ...``
and exit status 2 (:mod:`experiments.cli`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from experiments import split
from experiments.cli import InputError, run_cli
from experiments.common import build_parser, config_from_args, default_preset
from experiments.seeds import finished, plan_runs
from jaxopt_marl.config import GAMES, PRESETS, RunConfig

#: Files of the summary.
SUMMARY_JSON, SUMMARY_MD = "table2.json", "table2.md"
#: The tool's name in messages.
TOOL = "experiments.table2"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One row of paper Table 2.

    Attributes:
        name: the ``--cells`` value and the run directory's name.
        row: the paper's row label.
        interface: :data:`jaxopt_marl.interfaces.INTERFACES` member the cell plays.
        trained: PA-MAGRPO rounds run (False: ``rounds = 0``, the frozen base evaluated).
        shared_adapter: one LoRA adapter for all agents (Ablation B), else one per agent.
    """

    name: str
    row: str
    interface: str
    trained: bool
    shared_adapter: bool = False


#: The six cells in the paper's row order (§6.2 Table 2; the ablations' definitions: §6.1 "Ablations").
CELLS = (
    Cell("frozen_native", "Frozen + native (Abl. C)", "native", trained=False),
    Cell("frozen_menu", "Frozen + option menu (base)", "menu", trained=False),
    Cell("native_magrpo", "Native + MAGRPO (Abl. A)", "native", trained=True),
    Cell("compound_json_magrpo", "Compound-JSON + MAGRPO (Abl. D)", "compound_json", trained=True),
    Cell("shared_lora_menu", "Shared-LoRA + option menu (Abl. B)", "menu", trained=True, shared_adapter=True),
    Cell("full", "Full method (ours)", "menu", trained=True),
)
CELL_NAMES = tuple(c.name for c in CELLS)
BY_NAME = {c.name: c for c in CELLS}
#: The frozen cells every cell is tested against (Mann–Whitney).
FROZEN_CELLS = tuple(c.name for c in CELLS if not c.trained)
#: The cell of the full method (the reference of ``config_differences`` and of the patterns).
FULL = "full"
#: The shared-adapter cell (Ablation B).
SHARED = "shared_lora_menu"

#: Cleanup's native cleaning beam and turning actions (paper §4: "the LLM never once precedes a fire_clean with the
#: turn_left/turn_right actions"); native option names are the lower-case action names
#: (:class:`jaxopt_marl.interfaces.NativeLibrary`).
FIRE_CLEAN = "fire_clean"
TURNS = ("turn_left", "turn_right")
#: Overcooked's native interact action (``jaxopt_marl.interfaces.NATIVE_ACTIONS``), the one that delivers a soup.
INTERACT = "interact"
#: Games of the shared-vs-per-agent claim (paper §6.2 Ablation B: "Cleanup ... Overcooked reaches ... a third of the
#: full method"; "the symmetric Commons Harvest is forgiving").
SHARED_CLAIM_GAMES = ("cleanup", "overcooked_aa")
#: "Near 0" (ours; paper Table 2 shows 0.00): a mean team return of exactly 0, or below this fraction of the
#: full method's mean when that is positive.
NEAR_ZERO_FRACTION = 0.1
#: "One dominant letter" (ours; paper §6.3: fire_clean 95.8% / 98.4% on Cleanup, EAST 58.8% / 60.2% on Overcooked):
#: the most frequent action holds at least this share of the decisions and is an action, not a parse failure.
DOMINANT_SHARE = 0.5
#: The trace option of a decision that started no option (a parse failure without a fallback option).
NO_OPTION_TRACE = "idle"


def cell_dir(out: Path, cell: str) -> Path:
    """``OUT/<cell>``: the run directory of one cell."""
    return Path(out) / cell


def build_table2_parser(prog: str = "python -m experiments.table2") -> argparse.ArgumentParser:
    """:func:`experiments.common.build_parser`'s flags plus ``--game`` and ``--cells``."""
    ap = build_parser(prog)
    helps = {
        "--out": "grid directory: one <cell>/ run per cell and the summary table2.json / table2.md "
        "(default runs/<game>-<preset>-table2)",
        "--resume": "per cell folder: skip a <cell>/ whose run finished with these settings, continue a cut one "
        "(only --rounds and the evaluation flags may differ), start a missing one",
        "--force": "delete and restart every existing <cell>/ of this call's cells (after every check)",
        "--interface": "not for the grid: each cell sets its own interface",
        "--no-eval-base": "accepted, no effect: every cell runs without a separate base evaluation (the frozen "
        "cells are the frozen base's evaluations)",
        "--distributed": "split the cells over P processes (each runs whole cells on its own devices, every P-th "
        "cell from its id; no jax.distributed runtime is joined): process 0 waits for every process's completion "
        "file in OUT/processes/ and writes the table; needs --num-processes and --process-id (or their variables)",
        "--coordinator": "accepted for the shared flags, optional, not used (no coordinator: the processes meet "
        "through OUT/processes/)",
        "--num-processes": "processes the cells split over (implies --distributed); must divide the cell count",
        "--process-id": "this process, 0..P-1: it runs cells p, p + P, ... of the list (implies --distributed)",
    }
    for flag, text in helps.items():
        ap._option_string_actions[flag].help = text
    ap.description = "the six Table 2 ablation cells of one game and their §6.3 analyses (paper §6.2-§6.3)"
    ap.add_argument("--game", required=True, help=f"game: {', '.join(GAMES)}")
    ap.add_argument(
        "--cells",
        nargs="+",
        default=None,
        help=f"cells to run (space- or comma-separated; default all, in this order): {', '.join(CELL_NAMES)}",
    )
    return ap


def parse_cells(values: list[str] | None) -> list[str]:
    """The ``--cells`` values (space- or comma-separated) in :data:`CELLS` order, each once; all when None.

    Raises:
        InputError: an unknown cell name (the valid ones listed), or none given.
    """
    if values is None:
        return list(CELL_NAMES)
    names = [v.strip() for arg in values for v in arg.split(",") if v.strip()]
    bad = [n for n in names if n not in BY_NAME]
    if bad:
        raise InputError(f"unknown cell(s) {', '.join(map(repr, bad))}; valid cells: {', '.join(CELL_NAMES)}")
    if not names:
        raise InputError(f"--cells: no cell given; valid cells: {', '.join(CELL_NAMES)}")
    return [c for c in CELL_NAMES if c in names]


def cell_config(cell: Cell, game: str, args: argparse.Namespace, run_dir: Path | None = None) -> RunConfig:
    """The :class:`RunConfig` of ``cell``: the grid's flags (:func:`experiments.common.config_from_args`, which
    applies :func:`jaxopt_marl.interfaces.run_overrides` for the compound-JSON cell) with the cell's interface,
    ``rounds = 0`` when frozen, ``shared_adapter`` for Ablation B, and ``eval_base`` off (module docstring).

    Raises:
        InputError: the cell's configuration does not validate (named with the cell).
    """
    a = copy.copy(args)
    a.interface = cell.interface
    kw: dict = {"eval_base": False}
    if not cell.trained:
        kw["rounds"] = 0
    if cell.shared_adapter:
        kw["shared_adapter"] = True
    try:
        return config_from_args(game, a, run_dir=run_dir).replace(**kw)
    except InputError as e:
        raise InputError(f"cell {cell.name}: {str(e.code).removeprefix('error: ')}") from None
    except ValueError as e:
        raise InputError(f"cell {cell.name}: {e}") from None


def config_differences(cfg: RunConfig, ref: RunConfig) -> dict[str, list]:
    """``{config.json key: [cell's value, reference's value]}`` where ``cfg`` differs from ``ref`` (the full
    method's), values as JSON spells them; ``lora_num_adapters`` is added when the adapter counts differ."""
    a, b = (json.loads(json.dumps(c.flat_dict())) for c in (cfg, ref))
    diff = {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    if cfg.lora.num_adapters != ref.lora.num_adapters:
        diff["lora_num_adapters"] = [cfg.lora.num_adapters, ref.lora.num_adapters]
    return diff


# ---------------------------------------------------------------------------------------------------------
# §6.3 analyses (from one cell's evaluation files)
# ---------------------------------------------------------------------------------------------------------


def agent_steps_in_play(traj) -> np.ndarray:
    """int64[N]: agent-steps in play of the evaluation episodes, per agent: the (episode, step) pairs that were
    played (a recorded action, ``actions >= 0``) with the agent present before the step (``alive`` after the
    previous step; every agent is present at step 0). A present agent without a running option decides at each
    such step (:func:`jaxopt_marl.macro.needs_decision`), so native cells reach a call ratio of 1.00 (paper §6.3).

    Args:
        traj: :class:`jaxopt_marl.artifacts.PolicyTrajectories` (E episodes, T steps, N agents).
    """
    played = np.asarray(traj.actions) >= 0  # [E, T, N]
    alive = np.asarray(traj.alive, bool)
    before = np.concatenate([np.ones_like(alive[:, :1]), alive[:, :-1]], axis=1)
    return (played & before).sum(axis=(0, 1)).astype(np.int64)


def fire_clean_after_turn(traces, num_agents: int) -> dict:
    """Cleanup native cells (paper §4, §6.3): of each agent's ``fire_clean`` decisions, how many follow a
    ``turn_left`` / ``turn_right`` decision of the same agent (its previous decision in the same episode, ordered
    by step; an episode's first decision follows none).

    Returns:
        ``{"fire_clean": int[N], "after_turn": int[N], "rate": [after_turn / fire_clean or None] * N,
        "total": {"fire_clean", "after_turn", "rate"}}`` (units: decisions).
    """
    by_agent: dict[tuple, list] = {}
    for t in traces:
        by_agent.setdefault((t.get("seed"), t.get("rollout"), int(t["aid"])), []).append(t)
    fire, after = np.zeros(num_agents, np.int64), np.zeros(num_agents, np.int64)
    for (_, _, aid), rows in by_agent.items():
        rows = sorted(rows, key=lambda r: r.get("step") or 0)
        prev = None
        for r in rows:
            opt = str(r.get("option"))
            if opt == FIRE_CLEAN and 0 <= aid < num_agents:
                fire[aid] += 1
                after[aid] += prev in TURNS
            prev = opt
    rate = [float(a / f) if f else None for a, f in zip(after, fire)]
    tot_f, tot_a = int(fire.sum()), int(after.sum())
    return {
        "fire_clean": fire.tolist(),
        "after_turn": after.tolist(),
        "rate": rate,
        "total": {"fire_clean": tot_f, "after_turn": tot_a, "rate": float(tot_a / tot_f) if tot_f else None},
    }


def native_deliveries(ev_traj, game: str) -> np.ndarray:
    """float64[E, N] Overcooked deliveries per agent and episode of a native cell, from ``eval_traj.npz``: a step
    whose shared reward counts ``d`` deliveries (reward / ``DELIVERY_REWARD``) credits them to the agents that took
    INTERACT in that step next to (4-neighbour of) a serving cell, ``d / k`` each of the ``k`` such agents (a soup is
    delivered by interacting with a serving cell; a native cell has no ``deliver`` option to count)."""
    from envs_jax.overcooked import DELIVERY_REWARD
    from jaxopt_marl import artifacts, interfaces

    names = [n.lower() for n, _ in interfaces.native_actions(game)]
    interact = names.index(INTERACT)
    t = ev_traj.trained
    serving = np.asarray(ev_traj.terrain) == artifacts.SERVING
    near = serving.copy()
    near[1:] |= serving[:-1]
    near[:-1] |= serving[1:]
    near[:, 1:] |= serving[:, :-1]
    near[:, :-1] |= serving[:, 1:]
    pos = np.asarray(t.positions)
    r, c = np.clip(pos[..., 0], 0, near.shape[0] - 1), np.clip(pos[..., 1], 0, near.shape[1] - 1)
    cand = (np.asarray(t.actions) == interact) & near[r, c] & (pos[..., 0] >= 0)  # [E, T, N]
    d = np.rint(np.asarray(t.rewards, np.float64)[..., 0] / DELIVERY_REWARD)  # [E, T] shared: agent 0's
    k = cand.sum(axis=-1)
    share = np.divide(d, k, out=np.zeros_like(d), where=k > 0)
    return (cand * share[..., None]).sum(axis=1)


def per_agent_returns(game: str, cfg: RunConfig, ev_traj, traces) -> dict:
    """Each agent's return, per episode and its mean over episodes (float[N]), and the rule used.

    Melting Pot: apples eaten (:meth:`jaxopt_marl.artifacts.PolicyTrajectories.per_agent_apples` of
    ``eval_traj.npz``). Overcooked (shared reward): own deliveries, the agent's ``deliver`` options that ended in
    ``success`` (:func:`jaxopt_marl.audit.successes_per_agent`, the solo test's count) for the menu and
    compound-JSON cells; :func:`native_deliveries` for the native ones.
    """
    from jaxopt_marl import audit, games

    n = cfg.num_agents
    if not games.info(game).shared_reward:
        per_ep = ev_traj.trained.per_agent_apples().astype(np.float64)
        rule = "apples eaten per agent (eval_traj.npz rewards)"
    elif cfg.interface == "native":
        per_ep = native_deliveries(ev_traj, game)
        rule = "deliveries credited to the agents that took INTERACT next to a serving cell in the delivery's step"
    else:
        per_ep = np.stack(
            [
                audit.successes_per_agent([t for t in traces if t.get("seed") == s], num_agents=n).astype(float)
                for s in np.asarray(ev_traj.seeds).tolist()
            ]
        )
        rule = "own successful deliver options per agent (decisions/eval.jsonl; the solo test's count)"
    return {"mean": per_ep.mean(axis=0).tolist(), "per_episode": per_ep.tolist(), "rule": rule}


def analyse(game: str, cfg: RunConfig, ev_traj, traces) -> dict:
    """§6.3 analyses of one cell's evaluated policy (``decisions/eval.jsonl`` traces, ``eval_traj.npz``).

    Returns:
        ``decisions`` (LLM decisions: one trace each), ``agent_steps`` (:func:`agent_steps_in_play`),
        ``llm_call_ratio`` = decisions / agent-steps (paper §6.3: 1.00 native, ~0.40 / 0.71 menu),
        ``top_action`` and ``top_action_share`` (the most frequent option / action over all decisions, a parse
        failure without fallback counting as ``idle``), ``parse_fail_rate``, ``histogram`` (``options``: column
        names, the library's then any other seen; ``counts`` int[N][O]: decisions per agent,
        :func:`jaxopt_marl.audit.option_histogram`) and ``fire_clean_after_turn`` (:func:`fire_clean_after_turn`,
        Cleanup native cells; else None).
    """
    from jaxopt_marl import audit

    n = cfg.num_agents
    names, counts = audit.option_histogram(traces, num_agents=n, option_names=ev_traj.option_names)
    steps = agent_steps_in_play(ev_traj.trained)
    total = Counter(audit.record_option(t) for t in traces)
    top, top_n = max(total.items(), key=lambda kv: kv[1]) if total else (None, 0)
    dec = len(traces)
    return {
        "decisions": dec,
        "agent_steps": int(steps.sum()),
        "llm_call_ratio": float(dec / steps.sum()) if steps.sum() else None,
        "llm_call_ratio_per_agent": [float(c / s) if s else None for c, s in zip(counts.sum(axis=1), steps)],
        "top_action": top,
        "top_action_share": float(top_n / dec) if dec else None,
        "parse_fail_rate": float(sum(audit.record_parse_failed(t) for t in traces) / dec) if dec else None,
        "histogram": {"options": list(names), "counts": counts.tolist()},
        "fire_clean_after_turn": (
            fire_clean_after_turn(traces, n) if game == "cleanup" and cfg.interface == "native" else None
        ),
    }


# ---------------------------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------------------------


def dagger(run_dir: Path) -> tuple[bool | None, list[float]]:
    """``(†, per-round training returns)``: the paper's † (training collapsed at zero return for the entire
    training horizon) for a trained run: ``train/return_mean`` of ``metrics.jsonl`` is 0 in every round (None
    when no round is recorded)."""
    from jaxopt_marl.report import load_jsonl

    rows, _ = load_jsonl(run_dir / "metrics.jsonl")
    rets = [float(r["train/return_mean"]) for r in rows if isinstance(r.get("train/return_mean"), (int, float))]
    return (all(r == 0 for r in rets) if rets else None), rets


def cell_record(out: Path, cell: Cell, cfg: RunConfig, ref: RunConfig | None) -> dict:
    """One cell's entry of ``table2.json`` from its run directory (module docstring); ``ref``: the full method's
    configuration (``config_differences``), None to skip.

    Raises:
        InputError: its ``eval.json``, ``eval_traj.npz`` or ``decisions/eval.jsonl`` is missing or unreadable.
    """
    from jaxopt_marl import artifacts, stats

    d = cell_dir(out, cell.name)
    try:
        ev = artifacts.EvalRecord.load(d / artifacts.EVAL_JSON)
        traj = artifacts.EvalTrajectories.load(d / artifacts.EVAL_TRAJ)
        traces, _ = artifacts.load_traces(d / artifacts.DECISIONS / "eval.jsonl")
    except (OSError, ValueError) as e:
        raise InputError(f"cell {cell.name}: {d} has no readable evaluation files ({e})") from None
    dg, train_returns = dagger(d) if cell.trained else (None, [])
    return {
        "cell": cell.name,
        "row": cell.row,
        "dir": cell.name,
        "interface": cfg.interface,
        "trained": cell.trained,
        "shared_adapter": cfg.magrpo.shared_adapter,
        "rounds": cfg.rounds,
        "policy": ev.trained.policy,
        "eval_checkpoint": ev.eval_checkpoint,
        "checkpoint_round": ev.checkpoint_round,
        "seeds": list(ev.seeds),
        "team_return": stats.summarize(ev.trained.team_returns, f"{cell.name} team return"),
        "per_agent": per_agent_returns(cfg.game, cfg, traj, traces),
        "dagger": dg,
        "train_returns": train_returns,
        "analysis": analyse(cfg.game, cfg, traj, traces),
        "config_differences": None if ref is None else config_differences(cfg, ref),
    }


def _mean(rec: dict | None) -> float | None:
    return None if rec is None else rec["team_return"]["mean"]


def near_zero(mean: float, full_mean: float | None) -> bool:
    """:data:`NEAR_ZERO_FRACTION`'s rule: ``mean == 0``, or ``mean < fraction x full_mean`` when the full method's
    mean is positive."""
    return mean == 0 or (full_mean is not None and full_mean > 0 and mean < NEAR_ZERO_FRACTION * full_mean)


def patterns(game: str, cells: dict[str, dict]) -> dict:
    """The qualitative claims of paper §6.2-§6.3 on these cells, computed (each ``holds`` None when a cell it
    needs is missing):

    - ``native_near_zero_one_letter``: every native cell (A, C) has a near-zero mean (:func:`near_zero`) and one
      dominant letter (top action share >= :data:`DOMINANT_SHARE`, the top being an action of the library);
    - ``shared_below_per_agent``: Ablation B's mean below the full method's (``claimed``: the paper claims it for
      :data:`SHARED_CLAIM_GAMES`);
    - ``full_best``: the full method's mean strictly above every other cell's.
    """
    full = cells.get(FULL)
    fm = _mean(full)
    natives = [c.name for c in CELLS if c.interface == "native"]
    rows = {}
    for name in natives:
        r = cells.get(name)
        if r is None:
            continue
        a = r["analysis"]
        lib_actions = set(r["analysis"]["histogram"]["options"]) - {NO_OPTION_TRACE}
        dominant = (
            a["top_action_share"] is not None
            and a["top_action_share"] >= DOMINANT_SHARE
            and a["top_action"] in lib_actions
            and a["top_action"] != NO_OPTION_TRACE
        )
        rows[name] = {
            "mean": r["team_return"]["mean"],
            "near_zero": near_zero(r["team_return"]["mean"], fm),
            "top_action": a["top_action"],
            "top_action_share": a["top_action_share"],
            "dominant_letter": bool(dominant),
        }
    native = {
        "rule": f"each native cell's mean is 0 or below {NEAR_ZERO_FRACTION:g} x the full method's, and its most "
        f"frequent action (not a parse failure) holds >= {DOMINANT_SHARE:.0%} of its decisions",
        "cells": rows,
        "full_mean": fm,
        "holds": (
            None
            if len(rows) < len(natives) or full is None
            else all(v["near_zero"] and v["dominant_letter"] for v in rows.values())
        ),
    }
    sm = _mean(cells.get(SHARED))
    shared = {
        "rule": "shared-LoRA cell's mean team return < the full method's",
        "shared_mean": sm,
        "full_mean": fm,
        "claimed": game in SHARED_CLAIM_GAMES,
        "holds": None if sm is None or fm is None else bool(sm < fm),
    }
    others = {k: _mean(v) for k, v in cells.items() if k != FULL}
    best = {
        "rule": "the full method's mean team return > every other cell's",
        "full_mean": fm,
        "others": others,
        "holds": None if fm is None or len(others) < len(CELLS) - 1 else all(fm > m for m in others.values()),
    }
    return {"native_near_zero_one_letter": native, "shared_below_per_agent": shared, "full_best": best}


def summarize(out: Path, game: str, cfgs: dict[str, RunConfig]) -> dict:
    """``OUT/table2.json`` and ``OUT/table2.md`` over the cells of ``cfgs`` (every cell's configuration for this
    call) whose runs finished with exactly that configuration; returns the JSON object.

    Raises:
        InputError: a finished cell's evaluation files are unreadable, or the cells' evaluation seeds differ.
    """
    from jaxopt_marl import stats
    from jaxopt_marl.games import info

    out = Path(out)
    ref = cfgs.get(FULL)
    done = [c for c in CELLS if c.name in cfgs and finished(cell_dir(out, c.name), cfgs[c.name])]
    cells = {c.name: cell_record(out, c, cfgs[c.name], ref) for c in done}
    seeds = {tuple(r["seeds"]) for r in cells.values()}
    if len(seeds) > 1:
        raise InputError(f"the cells' evaluation seeds differ: {sorted(seeds)}")
    for name, r in cells.items():
        r["mann_whitney"] = {
            f: (
                None
                if f == name or f not in cells
                else stats.mann_whitney(r["team_return"]["values"], cells[f]["team_return"]["values"], name, f)
            )
            for f in FROZEN_CELLS
        }
    any_cfg = next(iter(cfgs.values()))
    summary = {
        "game": game,
        "preset": any_cfg.preset,
        "model": any_cfg.model,
        "units": info(game).return_unit,
        "reduced_budget": any_cfg.reduced_budget,
        "seeds": list(next(iter(seeds))) if seeds else [],
        "source": "paper §6.2 Table 2 (mean ± sample std over the evaluation episodes; † = training return 0 in "
        "every round) and §6.3 (call ratio, top-action share, per-agent histograms); statistics §6.1: 95% "
        "percentile bootstrap CI, two-sided Mann–Whitney U",
        "cells_order": list(CELL_NAMES),
        "covered": list(cells),
        "missing": [c for c in CELL_NAMES if c not in cells],
        "cells": cells,
        "patterns": patterns(game, cells),
    }
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n")
    (out / SUMMARY_MD).write_text(markdown(summary))
    return summary


def _p(test: dict | None) -> str:
    return "—" if test is None else f"{test['p_value']:.3g}"


def markdown(s: dict) -> str:
    """``table2.md`` of the summary ``s`` (:func:`summarize`)."""
    from jaxopt_marl.report import fmt, fmt_pm, table

    cells, units = s["cells"], s["units"]
    lines = [
        f"# {s['game']}: Table 2 ablations (paper §6.2) and trajectory analyses (§6.3)",
        "",
        f"Preset `{s['preset']}`, model `{s['model'] or 'SmolLM2-135M-Instruct'}`; team return in {units}, mean ± "
        f"sample std over the {len(s['seeds'])} evaluation episodes (seeds {', '.join(map(str, s['seeds']))}), "
        "with the 95% percentile bootstrap CI; the frozen cells play the frozen base with the adapters off on the "
        "same seeds.",
    ]
    if s["reduced_budget"]:
        lines += ["", f"> **Reduced budget (preset `{s['preset']}`)**: not the paper's §6.1 budget."]
    if s["missing"]:
        lines += ["", f"Missing (not run, unfinished, or other settings): {', '.join(s['missing'])}."]
    header = ["cell", "paper row", "interface", "trained", f"team return ({units})", "95% CI"]
    header += [f"p vs {f}" for f in FROZEN_CELLS] + ["per-agent mean", "LLM call ratio", "top action (share)"]
    rows = []
    for name, r in cells.items():
        t, a = r["team_return"], r["analysis"]
        ci = "—" if t["ci"] is None else f"[{t['ci'][0]:.2f}, {t['ci'][1]:.2f}]"
        share = "—" if a["top_action_share"] is None else f"{a['top_action']} ({a['top_action_share']:.1%})"
        rows.append(
            [
                f"`{name}`",
                r["row"],
                r["interface"],
                "yes" if r["trained"] else "no",
                fmt_pm(t["mean"], t["std"]) + ("†" if r["dagger"] else ""),
                ci,
                *[_p(r["mann_whitney"][f]) for f in FROZEN_CELLS],
                ", ".join(f"{v:.2f}" for v in r["per_agent"]["mean"]),
                fmt(a["llm_call_ratio"]),
                share,
            ]
        )
    lines += ["", *table(header, rows), ""]
    lines.append(
        "† Training return (`train/return_mean`, metrics.jsonl) 0 in every round: the paper's \"training collapsed "
        "at zero return for the entire training horizon\"; the row still shows the evaluated checkpoint's episodes."
    )
    lines += ["", "Per-agent returns: " + "; ".join(f"`{k}` {r['per_agent']['rule']}" for k, r in cells.items())]
    diffs = {k: r["config_differences"] for k, r in cells.items() if r["config_differences"]}
    if diffs:
        lines += ["", "## What differs between the cells (config.json, against `full`)", ""]
        for k, dd in diffs.items():
            lines.append(
                f"- `{k}`: " + "; ".join(f"{key} {json.dumps(a)} (full {json.dumps(b)})" for key, (a, b) in dd.items())
            )
        cj = diffs.get("compound_json_magrpo", {})
        if "max_new_tokens" in cj:
            lines += [
                "",
                f"The compound-JSON cell's response budget differs: {cj['max_new_tokens'][0]} new tokens against "
                f"{cj['max_new_tokens'][1]} (a JSON object is longer than a letter; jaxopt_marl.interfaces"
                ".COMPOUND_MAX_NEW_TOKENS)"
                + (f", and it samples (mode {cj['mode'][0]} against {cj['mode'][1]})" if "mode" in cj else "")
                + ".",
            ]
    lines += ["", "## Option / action histograms per agent (evaluation decisions, §6.3)", ""]
    for name, r in cells.items():
        h = r["analysis"]["histogram"]
        used = [j for j in range(len(h["options"])) if any(row[j] for row in h["counts"])]
        lines += [
            f"**`{name}`** ({r['analysis']['decisions']} decisions, {r['analysis']['agent_steps']} agent-steps, "
            f"parse-fail rate {fmt(r['analysis']['parse_fail_rate'])})",
            "",
        ]
        if not used:
            lines += ["No decisions.", ""]
            continue
        lines += table(
            ["agent", *[h["options"][j] for j in used]],
            [[str(i), *[str(row[j]) for j in used]] for i, row in enumerate(h["counts"])],
        )
        lines.append("")
    fc = {k: r["analysis"]["fire_clean_after_turn"] for k, r in cells.items() if r["analysis"]["fire_clean_after_turn"]}
    if fc:
        lines += ["## fire_clean after a turn (Cleanup native cells; paper §4)", ""]
        for k, v in fc.items():
            t = v["total"]
            lines.append(
                f"- `{k}`: {t['after_turn']} of {t['fire_clean']} fire_clean decisions follow the agent's turn_left / "
                f"turn_right (rate {fmt(t['rate'])}); per agent " + ", ".join(fmt(x) for x in v["rate"])
            )
        lines.append("")
    p = s["patterns"]
    lines += ["## The pattern the paper reports, computed", ""]
    nat = p["native_near_zero_one_letter"]
    lines.append(
        f"- Native cells near 0 with one dominant letter: **{nat['holds']}** ({nat['rule']}): "
        + "; ".join(
            f"`{k}` mean {fmt(v['mean'])}, near 0 {v['near_zero']}, top {v['top_action']} {fmt(v['top_action_share'])}"
            for k, v in nat["cells"].items()
        )
        + f"; full mean {fmt(nat['full_mean'])}."
    )
    sh = p["shared_below_per_agent"]
    lines.append(
        f"- Shared LoRA below per-agent LoRA: **{sh['holds']}** (shared {fmt(sh['shared_mean'])}, full "
        f"{fmt(sh['full_mean'])}; the paper claims it on Cleanup and Overcooked AA"
        + ("" if sh["claimed"] else f", not on {s['game']}")
        + ")."
    )
    fb = p["full_best"]
    lines.append(
        f"- Full method the best cell: **{fb['holds']}** (full {fmt(fb['full_mean'])}; "
        + ", ".join(f"{k} {fmt(v)}" for k, v in fb["others"].items())
        + ")."
    )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Path:
    """Parse, check every cell's configuration and directory, run this call's cells, summarize; returns OUT."""
    return run_grid(argv)[0]


def run_grid(argv: list[str] | None = None) -> tuple[Path, dict[str, float]]:
    """:func:`main`'s work; returns OUT and the wall seconds of each cell this call ran (skipped cells: none)."""
    ap = build_table2_parser()
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.game not in GAMES:
        raise InputError(f"unknown game {args.game!r}; valid games: {', '.join(GAMES)}")
    if args.preset is not None and args.preset not in PRESETS:
        raise InputError(f"unknown preset {args.preset!r}; valid presets: {', '.join(PRESETS)}")
    if args.interface is not None:
        raise InputError("--interface: the grid sets each cell's interface (see --cells); drop the flag")
    if args.resume and args.force:
        raise InputError("--resume and --force exclude each other")
    if args.format_warmup:
        raise InputError(
            "--format-warmup: the grid runs the paper's six cells, which start from the frozen base; the format "
            "warm-up (ours) is a single-run option (python -m experiments.<game> --format-warmup STEPS)"
        )
    cells = parse_cells(args.cells)
    num, pid, settings = split.settings_of(args, TOOL, "cells")  # checked before JAX starts
    try:
        mine = split.share(cells, num, pid, what="--cells", interleave=True)
    except ValueError as e:
        raise InputError(f"--distributed: {e}") from None
    preset = args.preset or default_preset()
    out = Path(args.out or f"runs/{args.game}-{preset}-table2")
    from jaxopt_marl import preflight

    preflight.check_out_dir(out)
    cfgs = {c.name: cell_config(c, args.game, args, cell_dir(out, c.name)) for c in CELLS}
    runs = {c: (f"cell {c}", cell_dir(out, c), cfgs[c]) for c in mine}
    fingerprint = launch_fingerprint(cells, num, cfgs)
    seconds = {}
    with split.marked(out, num, pid, mine, fingerprint) as started:
        todo = plan_runs(runs, args.resume, args.force, "cell")  # a refusal is this process's failure, marked
        print(
            f"experiments.table2 {args.game}: cells {', '.join(cells)} -> {out}"
            + (f" (process {pid} of {num}: cells {', '.join(mine)})" if num > 1 else "")
        )
        headed = {c: (f"cell {c} ({BY_NAME[c].row})", d, cfg) for c, (_, d, cfg) in runs.items()}
        seconds = split.run_each(headed, todo, args.keep_checkpoints)
    if pid != 0:
        return out, seconds
    split.gather(out, num, fingerprint, started, settings, tool=TOOL, what="cells")
    s = summarize(out, args.game, cfgs)
    for name, r in s["cells"].items():
        t = r["team_return"]
        print(f"{name}: {t['mean']:.2f} ± {(t['std'] or 0):.2f} {s['units']}{' †' if r['dagger'] else ''}")
    if s["missing"]:
        print(f"missing: {', '.join(s['missing'])}")
    print(f"wrote {out / SUMMARY_JSON}\nwrote {out / SUMMARY_MD}")
    return out, seconds


def launch_fingerprint(cells: list[str], num_processes: int, cfgs: dict[str, RunConfig]) -> str:
    """The hash every process of one grid launch computes alike (:func:`experiments.split.fingerprint`): the cells,
    the process count and every cell's ``config.json`` content."""
    return split.fingerprint(cells, num_processes, json.loads(json.dumps({c: g.flat_dict() for c, g in cfgs.items()})))


def cli(argv: list[str] | None = None) -> Path:
    """:func:`main` under :func:`experiments.cli.run_cli` (bad input: one line ``error: ...``, exit 2)."""
    return run_cli(main, argv)


__all__ = [
    "CELLS",
    "CELL_NAMES",
    "FROZEN_CELLS",
    "Cell",
    "analyse",
    "build_table2_parser",
    "cell_config",
    "cell_dir",
    "cli",
    "config_differences",
    "launch_fingerprint",
    "main",
    "parse_cells",
    "patterns",
    "run_grid",
    "summarize",
]

if __name__ == "__main__":
    cli()
