"""Behavioural audits of a trained team (paper §6.3-6.4): what the agents *do*, beside what they score.

The paper's point is that team reward alone cannot certify cooperation: Cleanup's reward comes with a
cleaner/eater role split, Overcooked AA's with a one-worker/one-idler team, Harvest's nearly flat reward hides
patch restraint, and only a solo test tells a solo-solvable layout from real coordination. The audits here turn
the run's records into those numbers:

- option histograms per agent and the role split (Fig. 1, §6.4 "Cleanup: emergent role specialization"),
- idling (stationary steps; time spent in ``wait``-like options),
- per-agent apples (sum of the positive unshaped reward: apples eaten) and deliveries (successful ``deliver``
  decisions), Overcooked counter hand-offs,
- visit heatmaps per agent (Fig. 3),
- Harvest patch survival (Fig. 2; spec ``environments.md`` §4),
- solo tests (§6.4 "Overcooked: high reward without coordination"), through a rollout callback,
- decision-trace audits (outcome of each chosen option, parse failures), in the spirit of observing
  cooperation as an aligned trace of choices and state changes,
- the spec §4 social-dilemma metrics, through :mod:`jaxopt_marl.metrics`.

Everything is a pure NumPy function over the arrays of ``eval_traj.npz`` or the decision records of
``decisions/*.jsonl`` (:class:`jaxopt_marl.artifacts.DecisionTrace`, which reads like a mapping, or one ``dict``
per decision with keys ``round, rollout, seed, step, aid, prompt, menu, response, choice, parse_fail, opt,
target, outcome``; :mod:`jaxopt_marl.rollout` writes the option under
``option`` and ``parse_fail`` as a bool, both read as well: :func:`record_option`, :func:`record_parse_failed`).
Conventions shared by all functions:

- agent axis last in trajectories (``[E, T, N]``, as the environments emit them), first in per-agent results;
- positions are ``(row, col)`` cells; a heatmap is indexed ``[agent, row, col]``;
- steps where an agent is not in play (``alive`` false: removed by a zap) are excluded from per-step fractions;
- empty denominators give 0.0 for fractions (an agent with no decisions spent no time on anything), NaN where a
  quantity is undefined (stated per function);
- ``mean ± std`` summaries over episodes or seeds (:func:`mean_std`) use the sample std (``ddof=1``; 0 for a
  single value), as ``experiments/cleanup.py`` writes ``eval.json``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxopt_marl import metrics

# ---------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------

#: Role category -> substrings of option names that belong to it (matched case-insensitively, first category
#: wins in this order). Covers the libraries' names: Cleanup ``clean_dirt``, ``go_to_river`` (clean),
#: ``eat_apple``, ``go_to_orchard`` (eat), Harvest ``eat_apple``, ``go_to_patch`` (eat), every game's ``wait``
#: (idle); Overcooked's other options fall in :data:`OTHER` (its histogram is read option by option).
ROLE_KEYWORDS: dict[str, tuple[str, ...]] = {
    "idle": ("wait", "noop", "no_op", "idle", "stay"),
    "clean": ("clean", "river", "dirt"),
    "eat": ("eat", "apple", "orchard", "harvest", "patch"),
}
#: Category of options matching none of :data:`ROLE_KEYWORDS`.
OTHER = "other"
#: Option name used in histograms for decisions whose ``opt`` is missing (e.g. an unparsed reply with no
#: fallback option recorded).
NO_OPTION = "(none)"
#: Outcome classes of a decision record (DESIGN.md burn-in record spelling; ``explicit:<Reason>`` collapsed).
OUTCOMES: tuple[str, ...] = ("success", "effect_fail", "explicit", "other")
#: Option whose successful completion is one Overcooked delivery.
DELIVER = "deliver"


# ---------------------------------------------------------------------------------------------------------
# 1. Option histograms and role split (decisions or per-step option ids)
# ---------------------------------------------------------------------------------------------------------


def record_option(rec: Mapping[str, Any]) -> str:
    """The chosen option of a decision record: ``opt`` (records, burn-in spelling) or ``option`` (rollout
    traces, ``decisions/*.jsonl`` of a run); :data:`NO_OPTION` when neither is set."""
    return rec.get("opt") or rec.get("option") or NO_OPTION


def record_parse_failed(rec: Mapping[str, Any]) -> bool:
    """Whether a decision's reply failed to parse: ``parse_fail`` is a reason string or True (rollout traces
    write a bool); None, False or absent mean it parsed."""
    return bool(rec.get("parse_fail"))


def option_histogram(
    decisions: Iterable[Mapping[str, Any]], num_agents: int | None = None, option_names: Sequence[str] | None = None
) -> tuple[tuple[str, ...], np.ndarray]:
    """Counts of each chosen option per agent, from decision records.

    Definition: ``counts[i, o]`` = number of records with ``aid == i`` and ``opt == names[o]`` (all rounds,
    rollouts and seeds present in ``decisions``). Units: decisions.

    Args:
        decisions: records with at least ``aid`` (int) and ``opt`` or ``option`` (str or None; None/"" counts
            as :data:`NO_OPTION`; :func:`record_option`).
        num_agents: N (default: 1 + the largest ``aid`` seen, 0 if none).
        option_names: column order; names not listed but seen are appended in first-seen order.

    Returns:
        ``(names, counts)`` with ``counts`` int64[N, len(names)].
    """
    names: list[str] = list(option_names or ())
    index = {n: k for k, n in enumerate(names)}
    pairs: list[tuple[int, int]] = []
    for rec in decisions:
        opt = record_option(rec)
        if opt not in index:
            index[opt] = len(names)
            names.append(opt)
        pairs.append((int(rec["aid"]), index[opt]))
    n = num_agents if num_agents is not None else (max((a for a, _ in pairs), default=-1) + 1)
    counts = np.zeros((n, len(names)), np.int64)
    for a, o in pairs:
        if 0 <= a < n:
            counts[a, o] += 1
    return tuple(names), counts


def option_step_histogram(opt_ids: np.ndarray, num_options: int, alive: np.ndarray | None = None) -> np.ndarray:
    """Counts of environment steps each option was running, per agent.

    Definition: ``counts[i, o]`` = number of (episode, step) pairs with ``opt_ids[e, t, i] == o`` (and agent i in
    play when ``alive`` is given). Steps with no option running (``-1``) are not counted. Units: steps.

    Args:
        opt_ids: int[E, T, N] (or int[T, N]) option running at each step, -1 = none.
        num_options: O, the number of option names.
        alive: optional bool[E, T, N] mask of agents in play.

    Returns:
        int64[N, O].
    """
    ids = np.asarray(opt_ids).reshape(-1, np.shape(opt_ids)[-1])  # [E*T, N]
    mask = (ids >= 0) & (ids < num_options)
    if alive is not None:
        mask &= np.asarray(alive, bool).reshape(ids.shape)
    n = ids.shape[-1]
    counts = np.zeros((n, num_options), np.int64)
    for i in range(n):
        counts[i] = np.bincount(ids[mask[:, i], i], minlength=num_options)[:num_options]
    return counts


def fractions(counts: np.ndarray) -> np.ndarray:
    """Row-normalised counts: ``counts[i] / sum(counts[i])``; rows summing to 0 give all zeros.

    Args:
        counts: int/float[N, O].

    Returns:
        float64[N, O], each non-empty row summing to 1.
    """
    c = np.asarray(counts, np.float64)
    tot = c.sum(axis=-1, keepdims=True)
    return np.divide(c, tot, out=np.zeros_like(c), where=tot > 0)


def option_category(name: str, keywords: Mapping[str, Sequence[str]] = ROLE_KEYWORDS) -> str:
    """Role category of an option name: the first category of ``keywords`` with a matching substring
    (case-insensitive), else :data:`OTHER`. E.g. ``"clean_dirt" -> "clean"``, ``"wait" -> "idle"``."""
    low = name.lower()
    for cat, subs in keywords.items():
        if any(s in low for s in subs):
            return cat
    return OTHER


@dataclasses.dataclass(frozen=True)
class RoleSplit:
    """Per-agent role fractions and team specialisation indices (see :func:`role_split`).

    Attributes:
        categories: category names, column order of ``frac`` (the keys of the keyword table, then ``other``).
        frac: float64[N, C] fraction of each agent's decisions (or steps) in each category.
        total: int64[N] decisions (or steps) per agent, the denominators.
        roles: per-agent label: the category with the largest fraction (ties: first in ``categories``), or
            ``"none"`` for an agent with no decisions.
        commitment: mean over agents with clean+eat > 0 of |clean − eat| / (clean + eat), in [0, 1]; NaN if no
            agent cleans or eats (or the categories are absent).
        clean_eat_gap: mean over all agents with any decision of |clean_frac − eat_frac|, in [0, 1].
        specialisation: normalised mutual information I(agent; option) / H(option) over the raw options, in
            [0, 1] (see :func:`specialisation_index`).
    """

    categories: tuple[str, ...]
    frac: np.ndarray
    total: np.ndarray
    roles: tuple[str, ...]
    commitment: float
    clean_eat_gap: float
    specialisation: float

    def column(self, category: str) -> np.ndarray:
        """float64[N] fraction of each agent's decisions in ``category`` (zeros if absent)."""
        if category not in self.categories:
            return np.zeros(self.frac.shape[0])
        return self.frac[:, self.categories.index(category)]


def specialisation_index(counts: np.ndarray) -> float:
    """Role-specialisation index: normalised mutual information between agent identity and option.

    Definition: with the empirical joint p(i, o) = counts[i, o] / Σ counts, the index is
    I(A; O) / H(O) = 1 − H(O | A) / H(O). It is 0 when every agent has the same option distribution (a
    symmetric team, as the paper's shared-LoRA ablation) and 1 when knowing the agent determines its option
    (perfect role partition). Agents weigh by their number of decisions. Units: none, in [0, 1].
    Convention: NaN when H(O) = 0 (every decision is the same option, or no decisions).

    Args:
        counts: int/float[N, O] option counts per agent.
    """
    c = np.asarray(counts, np.float64)
    tot = c.sum()
    if tot <= 0:
        return math.nan
    p = c / tot
    p_o = p.sum(axis=0)
    p_a = p.sum(axis=1, keepdims=True)
    h_o = -np.sum(p_o[p_o > 0] * np.log(p_o[p_o > 0]))
    if h_o <= 0:
        return math.nan
    cond = np.divide(p, p_a, out=np.zeros_like(p), where=p_a > 0)
    h_o_a = -np.sum(p[p > 0] * np.log(cond[p > 0]))
    return float(np.clip(1.0 - h_o_a / h_o, 0.0, 1.0))


def option_entropy(counts: np.ndarray) -> np.ndarray:
    """Per-agent entropy of the option distribution, in bits; 0 for an agent that always picks one option or
    has no decisions.

    Args:
        counts: int/float[N, O].

    Returns:
        float64[N].
    """
    p = fractions(counts)
    logp = np.log2(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logp).sum(axis=-1) + 0.0


def role_split(
    names: Sequence[str], counts: np.ndarray, keywords: Mapping[str, Sequence[str]] = ROLE_KEYWORDS
) -> RoleSplit:
    """Role split of a team from per-agent option counts (decisions or steps).

    Each option is mapped to a role category by :func:`option_category`; ``frac[i, c]`` is the fraction of
    agent i's decisions in category c. The paper's Cleanup split (§6.4) reads as agents with ``clean`` ≈ 1
    (cleaners), ``eat`` ≈ 1 (eaters), ``idle`` large (near-stationary helpers); Overcooked's as one agent with a
    large ``idle`` (wait) fraction. Indices: ``commitment`` and ``clean_eat_gap`` measure per-agent commitment to
    cleaning vs eating; ``specialisation`` (:func:`specialisation_index`) measures the team-level division
    of labour (a team of seven committed eaters has commitment 1 but specialisation 0).

    Args:
        names: option names, column order of ``counts``.
        counts: int[N, O] from :func:`option_histogram` or :func:`option_step_histogram`.
        keywords: category -> name substrings (default :data:`ROLE_KEYWORDS`).

    Returns:
        :class:`RoleSplit`.
    """
    c = np.asarray(counts, np.int64)
    cats = tuple(keywords) + (OTHER,)
    cat_of = np.array([cats.index(option_category(n, keywords)) for n in names], np.int64)
    per_cat = np.zeros((c.shape[0], len(cats)), np.int64)
    for k in range(len(cats)):
        per_cat[:, k] = c[:, cat_of == k].sum(axis=1) if len(names) else 0
    frac = fractions(per_cat)
    total = per_cat.sum(axis=1)
    roles = tuple(cats[int(np.argmax(frac[i]))] if total[i] > 0 else "none" for i in range(c.shape[0]))
    clean = frac[:, cats.index("clean")] if "clean" in cats else np.zeros(c.shape[0])
    eat = frac[:, cats.index("eat")] if "eat" in cats else np.zeros(c.shape[0])
    ce = clean + eat
    has = ce > 0
    commitment = float(np.mean(np.abs(clean - eat)[has] / ce[has])) if has.any() else math.nan
    active = total > 0
    gap = float(np.mean(np.abs(clean - eat)[active])) if active.any() else math.nan
    return RoleSplit(cats, frac, total, roles, commitment, gap, specialisation_index(c))


# ---------------------------------------------------------------------------------------------------------
# 2. Idling, per-agent apples and deliveries, visits
# ---------------------------------------------------------------------------------------------------------


def stationary_fraction(positions: np.ndarray, alive: np.ndarray | None = None) -> np.ndarray:
    """Fraction of steps each agent did not change cell (turning in place and no-ops count as not moving).

    Definition: over transitions t-1 -> t (t = 1..T-1) of every episode where the agent is in play at both
    steps, the fraction with ``positions[e, t, i] == positions[e, t-1, i]``. Units: fraction in [0, 1].
    Convention: NaN for an agent with no counted transition.

    Args:
        positions: int[E, T, N, 2] (or int[T, N, 2]) cells (row, col).
        alive: optional bool[E, T, N] agents in play.

    Returns:
        float64[N].
    """
    pos = np.asarray(positions)
    if pos.ndim == 3:
        pos = pos[None]
    same = np.all(pos[:, 1:] == pos[:, :-1], axis=-1)  # [E, T-1, N]
    valid = np.ones_like(same, bool)
    if alive is not None:
        a = np.asarray(alive, bool).reshape(pos.shape[:3])
        valid = a[:, 1:] & a[:, :-1]
    num = (same & valid).sum(axis=(0, 1)).astype(np.float64)
    den = valid.sum(axis=(0, 1)).astype(np.float64)
    return np.divide(num, den, out=np.full_like(num, np.nan), where=den > 0)


def waiting_fraction(opt_ids: np.ndarray, idle_ids: Sequence[int], alive: np.ndarray | None = None) -> np.ndarray:
    """Fraction of each agent's in-play steps spent running an idle option (e.g. ``wait``).

    Definition: #{(e, t): opt_ids[e, t, i] in idle_ids} / #{(e, t): agent i in play}. Units: fraction in
    [0, 1]. Convention: NaN for an agent never in play.

    Args:
        opt_ids: int[E, T, N] option running at each step (-1 none).
        idle_ids: option ids that count as idling.
        alive: optional bool[E, T, N].

    Returns:
        float64[N].
    """
    ids = np.asarray(opt_ids)
    if ids.ndim == 2:
        ids = ids[None]
    a = np.ones(ids.shape, bool) if alive is None else np.asarray(alive, bool).reshape(ids.shape)
    idle = np.isin(ids, np.asarray(list(idle_ids), ids.dtype)) & a
    num = idle.sum(axis=(0, 1)).astype(np.float64)
    den = a.sum(axis=(0, 1)).astype(np.float64)
    return np.divide(num, den, out=np.full_like(num, np.nan), where=den > 0)


def per_agent_returns(rewards: np.ndarray) -> np.ndarray:
    """Episode return of each agent, R_i = Σ_t r_t^i (units: the reward's; apples in Melting Pot games).

    Args:
        rewards: float[E, T, N] (or float[T, N]) unshaped per-step rewards.

    Returns:
        float64[E, N].
    """
    r = np.asarray(rewards, np.float64)
    if r.ndim == 2:
        r = r[None]
    return r.sum(axis=1)


def per_agent_apples(rewards: np.ndarray) -> np.ndarray:
    """Apples eaten by each agent per episode: Σ_t max(r_t^i, 0).

    Melting Pot's unshaped reward of a step is the number of apples the agent ate in it: 0, 1, or 2 (an apple
    regrown under a standing agent is eaten at once, and one more on entering an apple cell in the same step;
    ``envs_jax.cleanup`` / ``envs_jax.harvest`` step rules), so counting rewarded steps would undercount.
    Negative rewards (penalties) are not apples and count 0. Units: apples.

    Args:
        rewards: float[E, T, N] (or float[T, N]) unshaped per-step rewards.

    Returns:
        int64[E, N] (rounded to the nearest integer).
    """
    r = np.asarray(rewards, np.float64)
    if r.ndim == 2:
        r = r[None]
    return np.rint(np.clip(r, 0.0, None).sum(axis=1)).astype(np.int64)


def successes_per_agent(
    decisions: Iterable[Mapping[str, Any]], option: str = DELIVER, num_agents: int | None = None
) -> np.ndarray:
    """Per-agent count of decisions that chose ``option`` and ended with outcome ``success``
    (e.g. Overcooked deliveries, whose team reward is shared and cannot be split from rewards).

    Units: completed options (deliveries) over all records given; divide by the number of episodes for a
    per-episode rate.

    Returns:
        int64[N] (N = ``num_agents`` or 1 + the largest ``aid``).
    """
    aids = [int(r["aid"]) for r in decisions if record_option(r) == option and r.get("outcome") == "success"]
    n = num_agents if num_agents is not None else max(aids, default=-1) + 1
    return np.bincount(np.asarray(aids, np.int64), minlength=n)[:n] if n else np.zeros(0, np.int64)


def visit_heatmap(
    positions: np.ndarray, shape: tuple[int, int] | None = None, alive: np.ndarray | None = None
) -> np.ndarray:
    """Visit counts per agent over the map: ``heat[i, r, c]`` = number of (episode, step) pairs with agent i at
    cell (r, c) and in play. Units: steps. Positions outside ``shape`` are dropped.

    Args:
        positions: int[E, T, N, 2] (or int[T, N, 2]) cells (row, col).
        shape: (H, W) map size (default: 1 + the largest row and column seen).
        alive: optional bool[E, T, N].

    Returns:
        int64[N, H, W].
    """
    pos = np.asarray(positions).astype(np.int64)
    if pos.ndim == 3:
        pos = pos[None]
    n = pos.shape[2]
    if shape is None:
        shape = (int(pos[..., 0].max(initial=-1)) + 1, int(pos[..., 1].max(initial=-1)) + 1)
    h, w = shape
    a = np.ones(pos.shape[:3], bool) if alive is None else np.asarray(alive, bool).reshape(pos.shape[:3])
    heat = np.zeros((n, h, w), np.int64)
    for i in range(n):
        rc = pos[:, :, i][a[:, :, i]]
        ok = (rc[:, 0] >= 0) & (rc[:, 0] < h) & (rc[:, 1] >= 0) & (rc[:, 1] < w)
        np.add.at(heat[i], (rc[ok, 0], rc[ok, 1]), 1)
    return heat


#: Overcooked options whose success puts an item on a counter / takes one from a counter (hand-offs).
DROP, PICK = "drop_held", "pick_from_counter"


def handoffs(decisions: Iterable[Mapping[str, Any]], num_agents: int) -> np.ndarray:
    """Counter hand-offs between Overcooked agents, from decision traces (Forced Coordination's only way to pass
    onions and dishes across the counter wall; paper §6.4).

    Definition: within one episode (same ``round``, ``rollout``, ``seed``) and one counter (the ``target`` cell),
    the decisions are read in ``step`` order (a pick before a drop at the same step: the pick cannot take an item
    not yet put down); a successful ``drop_held`` by agent i marks the counter as holding i's item, and the next
    successful ``pick_from_counter`` there by agent j counts ``counts[i, j] += 1`` and clears the mark. Picks of
    items nobody dropped in the episode (the layout's initial counter items) are not counted. Off-diagonal
    entries are hand-offs; the diagonal counts agents picking up their own drops. Units: items.

    Args:
        decisions: traces with ``aid``, ``option``, ``outcome``, ``target``, ``step`` (and the episode keys).
        num_agents: N.

    Returns:
        int64[N, N] (row: the agent who dropped, column: the agent who picked up).
    """
    events: dict[tuple, list[tuple[int, int, int]]] = {}
    for rec in decisions:
        opt = record_option(rec)
        if opt not in (DROP, PICK) or rec.get("outcome") != "success" or rec.get("target") is None:
            continue
        key = (rec.get("round"), rec.get("rollout"), rec.get("seed"), tuple(rec.get("target")))
        events.setdefault(key, []).append((int(rec.get("step") or 0), 0 if opt == PICK else 1, int(rec["aid"])))
    counts = np.zeros((num_agents, num_agents), np.int64)
    for evs in events.values():
        holder = None
        for _, kind, aid in sorted(evs):
            if kind == 1:
                holder = aid
            elif holder is not None:
                if 0 <= holder < num_agents and 0 <= aid < num_agents:
                    counts[holder, aid] += 1
                holder = None
    return counts


# ---------------------------------------------------------------------------------------------------------
# 3. Harvest patch survival
# ---------------------------------------------------------------------------------------------------------


def patches_alive(apples: np.ndarray, patch_id: np.ndarray) -> np.ndarray:
    """Whether each patch holds at least one live apple (spec §4 "Patch survival").

    Args:
        apples: bool[..., H, W] live apples (any leading axes: episodes, steps).
        patch_id: int[H, W] patch index 0..P-1 of each apple-capable cell, -1 elsewhere
            (``envs_jax.harvest.label_patches``; P = 6 on Commons Harvest).

    Returns:
        bool[..., P].
    """
    a = np.asarray(apples, bool)
    pid = np.asarray(patch_id)
    p = int(pid.max(initial=-1)) + 1
    onehot = pid[None] == np.arange(p)[:, None, None]  # [P, H, W]
    return np.einsum("...hw,phw->...p", a.astype(np.int64), onehot.astype(np.int64)) > 0


def extinction_step(alive_t: np.ndarray) -> np.ndarray:
    """First step from which a patch stays empty to the end of the episode, -1 if alive at the end.

    Args:
        alive_t: bool[E, T, P] from :func:`patches_alive` on an apple grid over time.

    Returns:
        int64[E, P] step index (0-based) or -1.
    """
    a = np.asarray(alive_t, bool)
    t = a.shape[1]
    # last step the patch was alive; extinct from the step after it (0 if never alive)
    last = np.where(a.any(axis=1), t - 1 - np.argmax(a[:, ::-1], axis=1), -1)
    return np.where(a[:, -1], -1, last + 1).astype(np.int64)


# ---------------------------------------------------------------------------------------------------------
# 4. Solo tests
# ---------------------------------------------------------------------------------------------------------


#: Verdicts of :func:`solo_verdict`.
SOLO_VERDICTS = ("solo_solvable", "needs_partner", "not_informative", "undetermined")
#: Fewest seeds on which the full team scored for a solo test to be read (:func:`solo_verdict`; our choice: the
#: paper reports one number per agent; with fewer, a solo score of 0 or > 0 is one or two coin flips).
MIN_SOLO_SEEDS = 3


@dataclasses.dataclass(frozen=True)
class SoloResult:
    """Solo-test returns (see :func:`solo_test`).

    Attributes:
        seeds: the evaluation seeds, in call order.
        team_return: float64[N, S] team return with only agent i active, per seed.
        agent_return: float64[N, S] agent i's own return in its solo episodes (NaN if the rollout gave none).
        full_team: float64[S] team return with every agent active (NaN if not run).
    """

    seeds: tuple[int, ...]
    team_return: np.ndarray
    agent_return: np.ndarray
    full_team: np.ndarray

    def summary(self) -> dict[str, list[float]]:
        """Mean and std (:func:`mean_std`) over seeds of each agent's solo team return and of the full team's."""
        solo = [mean_std(row) for row in self.team_return]
        full = mean_std(self.full_team)
        return {
            "solo_mean": [m for m, _, _ in solo],
            "solo_std": [s for _, s, _ in solo],
            "full_mean": [full[0]],
            "full_std": [full[1]],
        }

    def verdict(self) -> str:
        """:func:`solo_verdict` of this result."""
        return solo_verdict(self.team_return, self.full_team)

    def as_dict(self, units: str | None = None) -> dict[str, Any]:
        """JSON-ready form (``solo.json``, :class:`jaxopt_marl.artifacts.SoloRecord`): seeds; per agent its solo
        team return and own return per seed with mean ± std (:func:`mean_std`); the full team's per seed with
        mean ± std; the verdict; ``units``. NaN becomes None."""
        return self.record(units).to_dict()

    def record(self, units: str | None = None, **extra: Any):
        """This result as the ``solo.json`` record (:class:`jaxopt_marl.artifacts.SoloRecord`); ``extra`` keys
        (game, checkpoint, ...) are written after the fixed ones."""
        from jaxopt_marl.artifacts import SoloRecord

        return SoloRecord(
            seeds=self.seeds,
            units=units,
            team_return=self.team_return,
            own_return=self.agent_return,
            full_team=self.full_team,
            verdict=self.verdict(),
            extra={"min_seeds": MIN_SOLO_SEEDS, **extra},
        )


def solo_verdict(team_return: np.ndarray, full_team: np.ndarray, min_seeds: int | None = None) -> str:
    """The paper's reading of a solo test (§6.4), one of :data:`SOLO_VERDICTS`.

    Rule (ours, stated in the report): a solo test is informative only on seeds where the full team scored
    (return > 0), since a solo 0 where the team also scores 0 says nothing, and only when there are at least
    ``min_seeds`` (:data:`MIN_SOLO_SEEDS`) such seeds, since one short episode where nobody could score proves
    nothing either. In order:

    - ``undetermined``: no solo score, or the full team's return is not recorded on any seed (NaN);
    - ``not_informative``: the full team scored on fewer than ``min_seeds`` of the seeds;
    - ``solo_solvable``: some agent alone scores (a solo team return > 0 on some seed): the task does not
      need a partner, so team reward can overstate cooperation (Overcooked AA: the agents deliver 4 and 2 alone);
    - ``needs_partner``: every solo score is 0 although the full team scored: its reward is behaviour that only
      works with a partner, evidence of coordination (Overcooked FC).

    Args:
        team_return: float[N, S] solo team returns (apples or deliveries); full_team: float[S] full-team returns
            on the same seeds (NaN = not run).
        min_seeds: fewest seeds with a scoring full team (default :data:`MIN_SOLO_SEEDS`).
    """
    min_seeds = MIN_SOLO_SEEDS if min_seeds is None else int(min_seeds)
    solo = np.asarray(team_return, np.float64)
    full = np.asarray(full_team, np.float64).reshape(-1)
    finite = solo[np.isfinite(solo)]
    if not finite.size or not np.isfinite(full).any():
        return "undetermined"
    if solo_scoring_seeds(full) < min_seeds:
        return "not_informative"
    return "solo_solvable" if (finite > 0).any() else "needs_partner"


def solo_scoring_seeds(full_team: np.ndarray) -> int:
    """Number of seeds on which the full team scored (return > 0; NaN = not run counts 0)."""
    f = np.asarray(full_team, np.float64).reshape(-1)
    return int((np.isfinite(f) & (f > 0)).sum())


def _solo_returns(out: Any, num_agents: int, num_seeds: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(team float64[S], agent float64[S, N])`` from one rollout callback's output (see :func:`solo_test`);
    ``num_seeds`` None = one episode (no seed axis in ``out``)."""
    batch = num_seeds is not None
    lead = 1 if batch else 0
    if isinstance(out, Mapping):
        team = np.asarray(out["team"], np.float64)
        agent = out.get("agent")
        agent = None if agent is None else np.asarray(agent, np.float64)
        if agent is not None and agent.ndim == lead + 2:  # per-step rewards
            agent = agent.sum(axis=-2)
    else:
        arr = np.asarray(out, np.float64)
        if arr.ndim == lead:  # team returns only
            team, agent = arr, None
        elif arr.ndim in (lead + 1, lead + 2):  # per-agent returns, or per-step rewards
            agent = arr.sum(axis=-2) if arr.ndim == lead + 2 else arr
            team = agent.sum(axis=-1)
        else:
            raise ValueError(
                f"solo_test: rollout output of shape {arr.shape} is none of "
                f"{'[S], [S, N], [S, T, N]' if batch else '[], [N], [T, N]'}"
            )
    if agent is None:
        agent = np.full(team.shape + (num_agents,), np.nan)
    if not batch:
        team, agent = team.reshape(1), agent.reshape(1, -1)
    s = num_seeds if batch else 1
    if team.shape != (s,) or agent.shape != (s, num_agents):
        raise ValueError(
            f"solo_test: rollout gave team returns of shape {team.shape} and per-agent returns of "
            f"shape {agent.shape}; expected ({s},) and ({s}, {num_agents})"
        )
    return team, agent


def solo_test(
    rollout: Callable[[np.ndarray, Any], Any],
    num_agents: int,
    seeds: Sequence[int],
    *,
    include_full_team: bool = True,
    batched: bool = False,
    full_team: Sequence[float] | np.ndarray | None = None,
) -> SoloResult:
    """Solo test (paper §6.4): evaluate the team with all but one agent idled, once per agent on every seed.

    A layout where an agent alone still scores is solo-solvable (Overcooked AA: the paper's agents deliver 4 and
    2 alone); one where every solo score is 0 while the team scores needs a partner (Overcooked FC). See
    :func:`solo_verdict`.

    Args:
        rollout: ``active`` is bool[N] (True = the trained policy acts; False = the agent is idled: the caller
            keeps it in place, e.g. ``Roller.collect(..., active=active)`` makes it take ``wait``).
            Per episode (default): ``rollout(active, seed) -> out`` with ``out`` per-agent episode returns
            float[N], per-step rewards float[T, N], a scalar team return (then ``agent_return`` is NaN), or a
            mapping ``{"team": scalar, "agent": float[N] or float[T, N] or None}`` when the team return is not the
            sum over agents (Overcooked: a delivery rewards every agent, the team return counts it once).
            With ``batched=True``: ``rollout(active, seeds) -> out`` plays every seed at once (one call per
            agent, e.g. one ``Roller.collect(seeds, key, active=active)``) and ``out`` has a leading seed axis:
            float[S, N], float[S, T, N], float[S], or ``{"team": float[S], "agent": float[S, N] | None}``.
        num_agents: N.
        seeds: evaluation seeds (the same for every agent, so solo scores compare seed-for-seed).
        include_full_team: also run every seed with all agents active (ignored when ``full_team`` is given).
        batched: the callback takes all seeds at once (above).
        full_team: float[S] team returns of the full team on the same seeds, already measured (e.g. by the
            evaluation); used instead of running them again.

    Returns:
        :class:`SoloResult` (returns in the callback's units: apples, deliveries, ...).

    Raises:
        ValueError: a callback output or ``full_team`` of the wrong shape (message names the shapes).
    """
    seeds = tuple(int(s) for s in seeds)
    n_s = len(seeds)

    def run(active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if batched:
            return _solo_returns(rollout(active.copy(), seeds), num_agents, n_s)
        outs = [_solo_returns(rollout(active.copy(), s), num_agents, None) for s in seeds]
        if not outs:
            return np.zeros(0), np.zeros((0, num_agents))
        return np.concatenate([t for t, _ in outs]), np.concatenate([a for _, a in outs])

    team = np.zeros((num_agents, n_s))
    own = np.zeros((num_agents, n_s))
    for i in range(num_agents):
        active = np.zeros(num_agents, bool)
        active[i] = True
        t, a = run(active)
        team[i], own[i] = t, a[:, i]
    if full_team is not None:
        full = np.asarray(full_team, np.float64).reshape(-1)
        if full.shape != (n_s,):
            raise ValueError(f"solo_test: full_team has {full.size} values for {n_s} seeds")
    elif include_full_team:
        full = run(np.ones(num_agents, bool))[0]
    else:
        full = np.full(n_s, np.nan)
    return SoloResult(seeds, team, own, full)


# ---------------------------------------------------------------------------------------------------------
# 5. Decision traces and episode metrics
# ---------------------------------------------------------------------------------------------------------


def outcome_class(outcome: Any) -> str:
    """Outcome class of a decision: ``success``, ``effect_fail``, ``explicit`` (any ``explicit:<Reason>``), or
    ``other`` (missing or unknown)."""
    if outcome in ("success", "effect_fail"):
        return outcome
    if isinstance(outcome, str) and outcome.startswith("explicit"):
        return "explicit"
    return "other"


def outcome_table(decisions: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per chosen option, the number of decisions in each outcome class of :data:`OUTCOMES`.

    Returns:
        ``{opt: {"success": n, "effect_fail": n, "explicit": n, "other": n}}`` in first-seen option order.
    """
    table: dict[str, dict[str, int]] = {}
    for rec in decisions:
        row = table.setdefault(record_option(rec), dict.fromkeys(OUTCOMES, 0))
        row[outcome_class(rec.get("outcome"))] += 1
    return table


def parse_fail_rate(decisions: Iterable[Mapping[str, Any]], num_agents: int | None = None) -> np.ndarray:
    """Per-agent fraction of decisions whose reply did not parse (:func:`record_parse_failed`).

    Convention: NaN for an agent with no decisions.

    Returns:
        float64[N].
    """
    recs = [(int(r["aid"]), record_parse_failed(r)) for r in decisions]
    n = num_agents if num_agents is not None else max((a for a, _ in recs), default=-1) + 1
    tot = np.zeros(n)
    bad = np.zeros(n)
    for a, f in recs:
        if 0 <= a < n:
            tot[a] += 1
            bad[a] += f
    return np.divide(bad, tot, out=np.full(n, np.nan), where=tot > 0)


def social_metrics(rewards: np.ndarray, alive: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Spec §4 metrics per episode via :mod:`jaxopt_marl.metrics` (same conventions).

    Args:
        rewards: float[E, T, N] unshaped rewards.
        alive: optional bool[E, T, N]; without it peace is N (nobody removed).

    Returns:
        ``{"team_return", "efficiency", "equality", "sustainability", "peace"}``, each float64[E].
    """
    r = np.asarray(rewards, np.float64)
    if r.ndim == 2:
        r = r[None]
    a = np.ones(r.shape, bool) if alive is None else np.asarray(alive, bool).reshape(r.shape)
    return {
        "team_return": r.sum(axis=(1, 2)),
        "efficiency": metrics.efficiency(r),
        "equality": metrics.equality(r),
        "sustainability": metrics.sustainability(r),
        "peace": metrics.peace(a),
    }


def mean_std(x: Sequence[float] | np.ndarray, ddof: int = 1) -> tuple[float, float, int]:
    """``(mean, std, n)`` over the finite values of ``x``; the std is the sample std (``ddof=1``) by default
    and 0.0 when n <= ddof; ``(nan, nan, 0)`` when there are no finite values."""
    v = np.asarray(x, np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, 0
    return float(v.mean()), float(v.std(ddof=ddof)) if v.size > ddof else 0.0, int(v.size)


__all__ = [
    "DELIVER",
    "DROP",
    "MIN_SOLO_SEEDS",
    "NO_OPTION",
    "OTHER",
    "OUTCOMES",
    "PICK",
    "ROLE_KEYWORDS",
    "RoleSplit",
    "SOLO_VERDICTS",
    "SoloResult",
    "extinction_step",
    "fractions",
    "handoffs",
    "mean_std",
    "option_category",
    "option_entropy",
    "option_histogram",
    "option_step_histogram",
    "outcome_class",
    "outcome_table",
    "parse_fail_rate",
    "patches_alive",
    "per_agent_apples",
    "per_agent_returns",
    "record_option",
    "record_parse_failed",
    "role_split",
    "social_metrics",
    "solo_scoring_seeds",
    "solo_test",
    "solo_verdict",
    "specialisation_index",
    "stationary_fraction",
    "successes_per_agent",
    "visit_heatmap",
    "waiting_fraction",
]
