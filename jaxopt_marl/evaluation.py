"""The run's evaluation on held-out seeds (paper §6.1): ``eval.json``, ``eval_traj.npz``, ``decisions/eval*.jsonl``.

The adapters evaluated follow the paper's checkpoint rule (the highest training-time team return, ``best/``;
``eval_checkpoint="final"``: the last round's, :func:`choose_adapters`); they play ``eval_episodes`` episodes on
seeds 10000, 10001, ... (disjoint from training), then, with ``eval_base``, the frozen base (adapters off) plays
the same seeds on the same menus (:func:`evaluate`). ``eval.json`` is a typed record
(:class:`jaxopt_marl.artifacts.EvalRecord`): a block per policy (per-episode team return and behavioural metrics,
their mean and std, parse counts) and ``stats``, the §6.1 bootstrap CIs and Mann–Whitney U test
(:mod:`jaxopt_marl.stats`). ``eval_traj.npz`` (:class:`jaxopt_marl.artifacts.EvalTrajectories`) holds the
per-step buffers the audits read, with the map layers and, for Harvest, the live-apple grid after every step.

A run of ``rounds = 0`` (:attr:`jaxopt_marl.config.RunConfig.frozen`, paper Table 2's frozen cells) trained
nothing: its evaluated policy is the frozen base itself, played with the adapters off (``reference``) on the same
seeds and key, labelled ``frozen_base`` in ``eval.json``'s ``trained`` block (the block of the evaluated policy;
:func:`frozen_choice` names it in the checkpoint fields), and no second base evaluation is played (it would
repeat those episodes): ``base`` is None whatever ``eval_base`` says.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import numpy as np

from jaxopt_marl import artifacts, audit, games, metrics, stats
from jaxopt_marl.config import CHECKPOINT_RULE, EVAL_SEED0, RunConfig

#: ``fold_in`` constant of the evaluation's key (the solo test and the GIF share it).
EVAL_KEY_FOLD = 10**6
#: ``eval.json`` labels of the evaluated policy: trained adapters, or the frozen base (adapters off).
TRAINED_LABEL, FROZEN_LABEL = "trained", "frozen_base"
#: ``eval.json``'s ``eval_checkpoint`` / ``checkpoint_rule`` of a run without training (``rounds = 0``).
FROZEN_CHECKPOINT = "none"
FROZEN_RULE = "no training (rounds = 0): the frozen base, adapters off"


def eval_seeds(cfg: RunConfig) -> list[int]:
    """The evaluation env seeds: 10000, 10001, ... (``cfg.eval_episodes`` of them)."""
    return list(range(EVAL_SEED0, EVAL_SEED0 + cfg.eval_episodes))


def eval_key(cfg: RunConfig) -> jax.Array:
    """The evaluation's PRNG key (every evaluated policy, the solo test and the GIF's replay use it)."""
    return jax.random.fold_in(jax.random.PRNGKey(cfg.seed), EVAL_KEY_FOLD)


def _summary(values) -> dict:
    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    return {"mean": float(v.mean()) if v.size else float("nan"), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0}


def episode_metrics(game: str, res) -> list[dict]:
    """Per-episode team return and behavioural metrics of a :class:`jaxopt_marl.rollout.RolloutResult`."""
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
        if not games.info(game).shared_reward:  # apples eaten per agent (a step's reward is 0, 1 or 2 apples)
            row["agent_apples"] = [int(x) for x in audit.per_agent_apples(rew[e])[0]]
        out.append(row)
    return out


def eval_block(game: str, res, seeds: list[int], label: str) -> artifacts.EvalBlock:
    """The :class:`jaxopt_marl.artifacts.EvalBlock` of one evaluated policy."""
    eps = episode_metrics(game, res)
    for e, s in zip(eps, seeds):
        e["seed"] = s
    keys = [k for k in eps[0] if k != "seed" and not isinstance(eps[0][k], list)]
    return artifacts.EvalBlock(
        policy=label,
        seeds=list(seeds),
        episodes=eps,
        summary={k: _summary([e[k] if e[k] is not None else float("nan") for e in eps]) for k in keys},
        parse=res.parse.as_dict(),
        seconds=res.seconds,
    )


def eval_stats(cfg: RunConfig, trained: artifacts.EvalBlock, base: artifacts.EvalBlock | None) -> dict:
    """``eval.json``'s ``stats`` (paper §6.1): bootstrap CIs of the mean team return of the trained adapters and
    the frozen base (None if not run) on the same seeds, and their two-sided Mann–Whitney U test."""
    return stats.eval_stats(
        trained.team_returns,
        None if base is None else base.team_returns,
        seeds=trained.seeds,
        metric="team_return",
        units=cfg.units,
        labels=(trained.policy, base.policy if base is not None else "frozen_base"),
    )


def eval_trajectories(env, roller, seeds: list[int], key, option_names, trained_res, base_res):
    """The :class:`jaxopt_marl.artifacts.EvalTrajectories` of the evaluation (``eval_traj.npz``): per-step
    buffers of both policies, the map layers (walls, terrain, Harvest patch ids) and, for Harvest, the live-apple
    grid after every step, re-played from the recorded actions (patch survival, paper Fig. 2). A replay whose
    apples eaten differ from the recorded rewards is dropped with a warning (never silently wrong data)."""
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


@dataclasses.dataclass(frozen=True)
class CheckpointChoice:
    """Which adapters the evaluation plays (``eval.json``'s checkpoint fields).

    Attributes:
        eval_checkpoint: ``best`` or ``final``.
        checkpoint_rule: how they were chosen (paper §6.1's rule, or why the final adapters were used instead).
        checkpoint_round: the round whose rollouts they played (final: the completed rounds, i.e. the round they
            would play next); None without training (:func:`frozen_choice`).
        checkpoint_train_return: that round's mean training team return, or None.
    """

    eval_checkpoint: str
    checkpoint_rule: str
    checkpoint_round: int | None
    checkpoint_train_return: float | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def frozen_choice() -> CheckpointChoice:
    """The checkpoint fields of a run without training (``rounds = 0``): no adapters, no round."""
    return CheckpointChoice(FROZEN_CHECKPOINT, FROZEN_RULE, None)


def choose_adapters(cfg: RunConfig, tr, policy) -> CheckpointChoice:
    """Sets ``policy``'s adapters to those :attr:`RunConfig.eval_checkpoint` names and says which they are.

    ``best``: paper §6.1's checkpoint rule (those that played the round with the highest mean training team
    return, ``best/``, :meth:`jaxopt_marl.trainer.Trainer.best_adapters`); a missing or unreadable ``best/`` is
    reported on stderr and the final adapters are evaluated (a finished run is never lost to it). ``final``: the
    trainer's current adapters.
    """
    ck = CheckpointChoice(cfg.eval_checkpoint, "final adapters (last round)", tr.state.round)
    if cfg.eval_checkpoint != "best":
        return ck
    try:
        best = tr.best_adapters()
    except ValueError as e:  # a corrupt best/ must not lose a finished run: evaluate the final adapters
        print(f"warning: {e}; evaluating the final adapters", file=sys.stderr)
        return dataclasses.replace(ck, checkpoint_rule="final adapters (last round): best/ unreadable")
    if best is None:
        print(f"warning: no best/ checkpoint in {tr.run_dir}; evaluating the final adapters", file=sys.stderr)
        return dataclasses.replace(ck, checkpoint_rule="final adapters (last round): no best/ checkpoint")
    best_adapters, best_round, best_return = best
    if getattr(tr, "dist", None) is not None:  # a multi-process run's global arrays: this process's copy
        best_adapters = tr.dist.local(best_adapters)
    policy.set_adapters(best_adapters)
    return dataclasses.replace(
        ck, checkpoint_rule=CHECKPOINT_RULE, checkpoint_round=best_round, checkpoint_train_return=best_return
    )


def play(
    cfg: RunConfig,
    roller,
    label: str,
    *,
    adapters=None,
    reference: bool = False,
    progress: bool = False,
    desc: str = "eval",
) -> tuple[artifacts.EvalBlock, object]:
    """The evaluation's episode loop: ``cfg.eval_episodes`` episodes on :func:`eval_seeds` with :func:`eval_key`,
    played by ``adapters`` (a stacked adapter state, one adapter per seat: seat j plays adapter j; default the
    roller's current adapters) or, with ``reference``, the frozen base; returns its :class:`EvalBlock` (labelled
    ``label``) and the :class:`jaxopt_marl.rollout.RolloutResult`. :func:`evaluate` plays the run's trained adapters
    and base through it, :mod:`experiments.crossplay` its mixed teams."""
    seeds, key = eval_seeds(cfg), eval_key(cfg)
    res = roller.collect(seeds, key, adapters=adapters, round_idx=-1, reference=reference, progress=progress, desc=desc)
    return eval_block(cfg.game, res, seeds, label), res


@dataclasses.dataclass
class Evaluation:
    """What :func:`evaluate` played and wrote: the record (``eval.json``) and both policies' rollout results."""

    record: artifacts.EvalRecord
    trained: object
    base: object | None
    seeds: list[int]
    key: jax.Array


def evaluate(cfg: RunConfig, roller, out: Path, ck: CheckpointChoice, progress: bool = True) -> Evaluation:
    """Plays the evaluation with the policy's current adapters (then the frozen base with ``cfg.eval_base``) and
    writes ``out/eval.json`` and ``out/decisions/eval.jsonl`` (``eval_base.jsonl``). ``cfg.frozen``
    (``rounds = 0``): the frozen base alone, as the evaluated policy (module docstring)."""
    seeds, key = eval_seeds(cfg), eval_key(cfg)
    label = FROZEN_LABEL if cfg.frozen else TRAINED_LABEL
    trained_block, ev_res = play(
        cfg, roller, label, reference=cfg.frozen, progress=progress, desc=f"eval {label.replace('_', ' ')}"
    )
    artifacts.save_traces(out / "decisions" / "eval.jsonl", ev_res.traces)
    base_block, base_res = None, None
    if cfg.eval_base and not cfg.frozen:
        base_block, base_res = play(
            cfg, roller, FROZEN_LABEL, reference=True, progress=progress, desc="eval frozen base"
        )
        artifacts.save_traces(out / "decisions" / "eval_base.jsonl", base_res.traces)
    record = artifacts.EvalRecord(
        game=cfg.game,
        preset=cfg.preset,
        reduced_budget=cfg.reduced_budget,
        seeds=seeds,
        trained=trained_block,
        base=base_block,
        **ck.as_dict(),
        stats=eval_stats(cfg, trained_block, base_block),
    )
    record.save(out / "eval.json")
    return Evaluation(record=record, trained=ev_res, base=base_res, seeds=seeds, key=key)


def write_trajectories(env, roller, lib, ev: Evaluation, path: Path) -> Path:
    """``eval_traj.npz`` of ``ev`` (:func:`eval_trajectories`)."""
    return eval_trajectories(env, roller, ev.seeds, ev.key, lib.option_names, ev.trained, ev.base).save(path)


__all__ = [
    "FROZEN_CHECKPOINT",
    "FROZEN_LABEL",
    "FROZEN_RULE",
    "TRAINED_LABEL",
    "CheckpointChoice",
    "Evaluation",
    "choose_adapters",
    "episode_metrics",
    "eval_block",
    "eval_key",
    "eval_seeds",
    "eval_stats",
    "eval_trajectories",
    "evaluate",
    "frozen_choice",
    "play",
    "write_trajectories",
]
