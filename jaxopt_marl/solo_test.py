"""The run's solo test (paper §6.4): ``solo.json``.

Each agent plays alone on the first ``solo_episodes`` evaluation seeds (one batched collect per agent, the others
idled on ``wait``, the evaluation's key); the full team's returns on those seeds are the evaluation's
(:func:`jaxopt_marl.audit.solo_test` gives the per-agent means and the verdict: solo-solvable or not).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxopt_marl import audit, games
from jaxopt_marl.config import RunConfig
from jaxopt_marl.evaluation import CheckpointChoice, Evaluation

IDLED = "every other agent takes the wait option at each of its decision points (no LLM call)"
FULL_TEAM_SOURCE = "eval.json trained episodes on the same seeds"


def run_solo_test(
    cfg: RunConfig, roller, ev: Evaluation, ck: CheckpointChoice, out: Path, progress: bool = True
) -> audit.SoloResult | None:
    """Plays the solo test of ``cfg`` (none when ``cfg.solo_episodes`` is 0) with the policy's current adapters
    (``cfg.frozen``: the frozen base, adapters off, the policy its evaluation played), writes ``out/solo.json``
    and prints one line; returns the :class:`jaxopt_marl.audit.SoloResult`."""
    if cfg.solo_episodes <= 0:
        return None
    n_agents = cfg.num_agents
    solo_seeds = ev.seeds[: cfg.solo_episodes]
    units = cfg.units

    def play_solo(active, ss):
        res = roller.collect(
            list(ss),
            ev.key,
            round_idx=-1,
            progress=progress,
            desc=f"solo agent {int(np.argmax(active))}",
            active=active,
            reference=cfg.frozen,
        )
        if games.info(cfg.game).shared_reward:  # a delivery rewards every agent: own ones from the decisions
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
        play_solo, n_agents, solo_seeds, batched=True, full_team=ev.trained.returns[: len(solo_seeds)]
    )
    solo.record(units, game=cfg.game, **ck.as_dict(), idled=IDLED, full_team_source=FULL_TEAM_SOURCE).save(
        out / "solo.json"
    )
    print(
        f"solo test ({units}, seeds {solo_seeds[0]}-{solo_seeds[-1]}): "
        + ", ".join(f"agent {i} alone {m:.2f}" for i, m in enumerate(solo.summary()["solo_mean"]))
        + f"; full team {solo.summary()['full_mean'][0]:.2f} -> {solo.verdict()}"
    )
    return solo


__all__ = ["run_solo_test"]
