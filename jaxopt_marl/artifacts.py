"""Typed records of the files a run writes and the report reads, each with ``save`` and ``load``.

One definition per file, shared by the writers (:mod:`jaxopt_marl.pipeline`'s steps :mod:`jaxopt_marl.evaluation`,
:mod:`jaxopt_marl.solo_test`) and the readers (:mod:`jaxopt_marl.report`, :mod:`jaxopt_marl.audit`), so the two
sides cannot disagree on a key name:

- :class:`EvalTrajectories` — ``eval_traj.npz``: per-step trajectories of the evaluation episodes (trained
  adapters, and the frozen base when it was evaluated) plus the map layers the audits need (walls, terrain,
  Harvest patch ids), so no reader builds an environment or re-parses a map;
- :class:`DecisionTrace` — one line of ``decisions/*.jsonl`` (one LLM decision);
- :class:`EvalBlock` / :class:`EvalRecord` — ``eval.json``: one evaluated policy's episodes / the whole
  evaluation (paper §6.1: held-out seeds 10000.., checkpoint rule, statistics);
- :class:`SoloRecord` — ``solo.json``: the solo test (paper §6.4);
- :class:`BurninSummary` — ``burnin/burnin.json``: what a burn-in and its guard synthesis did
  (:func:`jaxopt_marl.burnin.write_outputs`).

Every ``load`` raises :class:`ArtifactError` (a ``ValueError``) naming the file and the missing or malformed
field; a missing file raises ``FileNotFoundError``. Loading checks shapes and dtypes against each other, not
against an environment. Units: team returns and rewards are apples (Cleanup, Harvest: one per apple eaten) or
deliveries (Overcooked: one per soup delivered); steps are environment steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: File names inside a run directory.
EVAL_TRAJ = "eval_traj.npz"
EVAL_JSON = "eval.json"
SOLO_JSON = "solo.json"
#: The optional format warm-up's summary and its saved adapter (:mod:`jaxopt_marl.format_warmup`).
FORMAT_WARMUP_JSON = "format_warmup.json"
FORMAT_WARMUP_DIR = "format_warmup"
#: The burn-in summary's file name (in the burn-in directory).
BURNIN_JSON = "burnin.json"
DECISIONS = "decisions"

#: Terrain codes of :attr:`EvalTrajectories.terrain` (index = code). ``apple cells`` are Cleanup's orchard and
#: Harvest's patches (apple-capable cells); ``river`` is Cleanup's water; the last four are Overcooked stations.
TERRAIN_NAMES = ("floor", "wall", "river", "apple cells", "pot", "onion pile", "dish pile", "serving")
FLOOR, WALL, RIVER, APPLE_CELLS, POT, ONIONS, DISHES, SERVING = range(len(TERRAIN_NAMES))

#: Values of :attr:`DecisionTrace.response_source`: ``model`` = text the LLM generated (``sample`` mode);
#: ``template`` = a string the rollout formatted from the scored letter and state label (``choice_only`` mode:
#: the model scored the menu letters in one forward pass and generated no text).
RESPONSE_SOURCES = ("model", "template")


class ArtifactError(ValueError):
    """A run file exists but is malformed; the message names the file and the field."""


# ---------------------------------------------------------------------------------------------------------
# Map layers (from the env, once, at write time)
# ---------------------------------------------------------------------------------------------------------


#: The terrain code of each named static layer an env's ``map_layers()`` may return, in paint order (a later
#: layer wins a shared cell).
TERRAIN_OF_LAYER = (
    ("water", RIVER),
    ("apple_capable", APPLE_CELLS),
    ("pot", POT),
    ("onion_pile", ONIONS),
    ("dish_pile", DISHES),
    ("serving", SERVING),
)


def map_layers(env: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(walls bool[H, W], terrain int8[H, W], patch_id int32[H, W] | None)`` of an ``envs_jax`` game.

    Read from the env's named static layers (``env.map_layers()``: ``wall``, then any of
    :data:`TERRAIN_OF_LAYER`'s masks, and Harvest's ``patch_id``: patch 0..P-1, -1 elsewhere; see
    :meth:`envs_jax.meltingpot.MeltingPotEnv.map_layers`, :meth:`envs_jax.overcooked.Overcooked.map_layers`).
    Terrain codes: :data:`TERRAIN_NAMES` (walls first, then each layer's code over them).

    Raises:
        ValueError: the env has no ``map_layers``.
    """
    if not callable(getattr(env, "map_layers", None)):
        raise ValueError(f"map_layers: {type(env).__name__} has no map layers (envs_jax games define map_layers())")
    layers = env.map_layers()
    walls = np.asarray(layers["wall"], bool)
    terrain = np.where(walls, WALL, FLOOR).astype(np.int8)
    for name, code in TERRAIN_OF_LAYER:
        if name in layers:
            terrain[np.asarray(layers[name], bool)] = code
    pid = layers.get("patch_id")
    return walls, terrain, None if pid is None else np.asarray(pid, np.int32)


# ---------------------------------------------------------------------------------------------------------
# eval_traj.npz
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PolicyTrajectories:
    """Per-step trajectories of one policy's evaluation episodes (E episodes, T steps, N agents).

    Attributes:
        positions: int32[E, T, N, 2] cell (row, col) of each agent after step t (-1 after the episode ended).
        rewards: float32[E, T, N] unshaped reward of step t: apples eaten by the agent at that step (0, 1 or 2:
            Melting Pot eats an apple on entry and one regrown under a standing agent in the same step), or
            deliveries x ``DELIVERY_REWARD`` shared by every agent (Overcooked).
        alive: bool[E, T, N] agent in play (not removed by a zap) after step t.
        options: int32[E, T, N] id of the option the agent was running at step t (index into
            :attr:`EvalTrajectories.option_names`), -1 when none.
        actions: int32[E, T, N] primitive action taken at step t (-1 after the end), replayable with the
            episode's env keys (:meth:`jaxopt_marl.compiled_rollout.CompiledRoller.replay_frames`).
        apples: bool[E, T, H, W] live apples after step t (Harvest, for patch survival, paper Fig. 2), or None.
    """

    positions: np.ndarray
    rewards: np.ndarray
    alive: np.ndarray
    options: np.ndarray
    actions: np.ndarray
    apples: np.ndarray | None = None

    #: Array fields in file order; ``apples`` is optional.
    FIELDS = ("positions", "rewards", "alive", "options", "actions", "apples")

    def __post_init__(self):
        cast = {
            "positions": np.int32,
            "rewards": np.float32,
            "alive": bool,
            "options": np.int32,
            "actions": np.int32,
            "apples": bool,
        }
        for name, dt in cast.items():
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, np.asarray(v).astype(dt, copy=False))
        p = self.positions
        if p.ndim != 4 or p.shape[-1] != 2:
            raise ArtifactError(f"positions must be int32[E, T, N, 2], got shape {p.shape}")
        etn = p.shape[:3]
        for name in ("rewards", "alive", "options", "actions"):
            if getattr(self, name).shape != etn:
                raise ArtifactError(f"{name} must have shape [E, T, N] = {etn}, got {getattr(self, name).shape}")
        if self.apples is not None and (self.apples.ndim != 4 or self.apples.shape[:2] != etn[:2]):
            raise ArtifactError(f"apples must be bool[E, T, H, W] with [E, T] = {etn[:2]}, got {self.apples.shape}")

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(E, T, N)``."""
        return tuple(int(x) for x in self.positions.shape[:3])

    def per_agent_apples(self) -> np.ndarray:
        """int64[E, N] apples eaten per agent and episode: Σ_t max(r_t, 0) (Melting Pot rewards count apples;
        a step can bring 2). Not meaningful for Overcooked, whose reward is shared."""
        return np.rint(np.clip(self.rewards.astype(np.float64), 0, None).sum(axis=1)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class EvalTrajectories:
    """``eval_traj.npz``: the evaluation's trajectories and the map the audits draw and count on.

    Attributes:
        seeds: int32[E] environment seeds of the episodes (paper §6.1: 10000, 10001, ...), same for both policies.
        option_names: the option library's names, index = option id in ``options``.
        walls: bool[H, W] cells no agent can enter (Melting Pot walls; Overcooked counters and stations).
        terrain: int8[H, W] codes of :data:`TERRAIN_NAMES` (floor, wall, river, apple cells, stations).
        patch_id: int32[H, W] Harvest patch index 0..P-1 of each apple cell, -1 elsewhere; None for other games.
        trained: the trained adapters' episodes.
        base: the frozen base's episodes on the same seeds, or None when it was not evaluated.

    File layout (``numpy.savez_compressed``): ``seeds``, ``option_names`` (str), ``walls``, ``terrain``,
    ``patch_id`` (Harvest), the trained policy's :attr:`PolicyTrajectories.FIELDS` unprefixed and the base's
    with the prefix ``base_``.
    """

    seeds: np.ndarray
    option_names: tuple[str, ...]
    walls: np.ndarray
    terrain: np.ndarray
    trained: PolicyTrajectories
    patch_id: np.ndarray | None = None
    base: PolicyTrajectories | None = None

    def __post_init__(self):
        object.__setattr__(self, "seeds", np.asarray(self.seeds).astype(np.int32, copy=False).reshape(-1))
        object.__setattr__(self, "option_names", tuple(str(x) for x in self.option_names))
        object.__setattr__(self, "walls", np.asarray(self.walls).astype(bool, copy=False))
        object.__setattr__(self, "terrain", np.asarray(self.terrain).astype(np.int8, copy=False))
        hw = self.walls.shape
        if self.walls.ndim != 2 or self.terrain.shape != hw:
            raise ArtifactError(
                f"walls and terrain must be [H, W] of one shape, got {self.walls.shape} and {self.terrain.shape}"
            )
        if self.patch_id is not None:
            object.__setattr__(self, "patch_id", np.asarray(self.patch_id).astype(np.int32, copy=False))
            if self.patch_id.shape != hw:
                raise ArtifactError(f"patch_id must be int32[H, W] = {hw}, got {self.patch_id.shape}")
        for label, p in (("trained", self.trained), ("base", self.base)):
            if p is None:
                continue
            if p.shape[0] != self.seeds.size:
                raise ArtifactError(f"{label}: {p.shape[0]} episode(s) for {self.seeds.size} seed(s)")
            if p.apples is not None and p.apples.shape[2:] != hw:
                raise ArtifactError(f"{label}: apples grid {p.apples.shape[2:]} differs from the map {hw}")
            ids = p.options[p.options >= 0]
            if ids.size and int(ids.max()) >= len(self.option_names):
                raise ArtifactError(
                    f"{label}: option id {int(ids.max())} out of range of {len(self.option_names)} option names"
                )
        if self.base is not None and self.base.shape[2] != self.trained.shape[2]:
            raise ArtifactError(f"base has {self.base.shape[2]} agents, trained {self.trained.shape[2]}")

    @property
    def idle_option_ids(self) -> list[int]:
        """Ids of the idle options (``wait``; :func:`jaxopt_marl.audit.option_category` ``idle``)."""
        from jaxopt_marl import audit

        return [k for k, nm in enumerate(self.option_names) if audit.option_category(nm) == "idle"]

    def save(self, path: str | Path) -> Path:
        """Writes the npz (layout in the class docstring); returns ``path``."""
        arrays: dict[str, np.ndarray] = {
            "seeds": self.seeds,
            "option_names": np.asarray(self.option_names),
            "walls": self.walls,
            "terrain": self.terrain,
        }
        if self.patch_id is not None:
            arrays["patch_id"] = self.patch_id
        for prefix, p in (("", self.trained), ("base_", self.base)):
            if p is not None:
                arrays.update(
                    {prefix + f: getattr(p, f) for f in PolicyTrajectories.FIELDS if getattr(p, f) is not None}
                )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> EvalTrajectories:
        """Reads a file written by :meth:`save`.

        Raises:
            FileNotFoundError: no such file.
            ArtifactError: not an npz, a required array is missing, or the shapes disagree (names the array).
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:  # a truncated or foreign file
            raise ArtifactError(f"{path} is not a readable npz ({e.__class__.__name__}: {e})") from None
        need = ("seeds", "option_names", "walls", "terrain", *PolicyTrajectories.FIELDS[:-1])
        miss = [k for k in need if k not in arrays]
        if miss:
            raise ArtifactError(f"{path} lacks {', '.join(miss)}")

        def policy(prefix: str) -> PolicyTrajectories | None:
            if prefix + "positions" not in arrays:
                return None
            return PolicyTrajectories(**{f: arrays.get(prefix + f) for f in PolicyTrajectories.FIELDS})

        try:
            return cls(
                seeds=arrays["seeds"],
                option_names=tuple(arrays["option_names"].tolist()),
                walls=arrays["walls"],
                terrain=arrays["terrain"],
                patch_id=arrays.get("patch_id"),
                trained=policy(""),
                base=policy("base_"),
            )
        except (ArtifactError, TypeError) as e:
            raise ArtifactError(f"{path}: {e}") from None


# ---------------------------------------------------------------------------------------------------------
# decisions/*.jsonl
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DecisionTrace:
    """One LLM decision (a line of ``decisions/*.jsonl``, as :mod:`jaxopt_marl.compiled_rollout` writes it).

    Attributes:
        aid: the deciding agent's index.
        option: chosen option name (``idle`` when the reply did not parse and no option started).
        outcome: ``success``, ``effect_fail``, ``explicit:<Reason>``, ``running``, ``episode_end`` or ``idle``.
        round: training round (-1 for the evaluation); rollout: episode index in its batch; seed: env seed;
        step: env step of the decision.
        parse_fail: the reply did not parse; parse: the parse reason (``ok``, ...).
        response: the reply; in ``choice_only`` mode a template (``response_source == "template"``), not text the
            model wrote.
        response_source: one of :data:`RESPONSE_SOURCES`; None in traces written before it was recorded.
        choice: the letter chosen, None on a parse failure; target: [x, y] of the option's target or None.
        logp: tempered log-probability of the choice under the policy (nats).
        extra: every other key of the line (prompt, menu, prompt ids, ...), kept as written.
    """

    aid: int
    option: str
    outcome: str | None = None
    round: int | None = None
    rollout: int | None = None
    seed: int | None = None
    step: int | None = None
    parse_fail: bool = False
    parse: str | None = None
    response: str | None = None
    response_source: str | None = None
    choice: str | None = None
    target: list | None = None
    logp: float | None = None
    extra: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.response_source is not None and self.response_source not in RESPONSE_SOURCES:
            raise ArtifactError(f"response_source must be one of {RESPONSE_SOURCES}, got {self.response_source!r}")

    def get(self, key: str, default: Any = None) -> Any:
        """A field or an :attr:`extra` key by name (``default`` when absent), so the audits of
        :mod:`jaxopt_marl.audit` read traces and plain dicts alike."""
        if key != "extra" and key in self.__dataclass_fields__:
            return getattr(self, key)
        return self.extra.get(key, default)

    def __getitem__(self, key: str) -> Any:
        if key != "extra" and key in self.__dataclass_fields__:
            return getattr(self, key)
        return self.extra[key]

    def __contains__(self, key: str) -> bool:
        return (key != "extra" and key in self.__dataclass_fields__) or key in self.extra

    @classmethod
    def from_dict(cls, d: dict) -> DecisionTrace:
        """Raises ArtifactError when ``aid`` or ``option`` is missing."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        for k in ("aid", "option"):
            if k not in d:
                raise ArtifactError(f"decision trace lacks `{k}`")
        return cls(**{k: v for k, v in d.items() if k in names}, extra={k: v for k, v in d.items() if k not in names})

    def to_dict(self) -> dict:
        """The JSON line's object (``extra`` inlined)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**d, **self.extra}


def save_traces(path: str | Path, traces: Sequence[DecisionTrace | dict]) -> Path:
    """Writes one JSON object per line (``DecisionTrace`` or the dicts a rollout returns, checked through
    :meth:`DecisionTrace.from_dict`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [(t if isinstance(t, DecisionTrace) else DecisionTrace.from_dict(t)).to_dict() for t in traces]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def load_traces(path: str | Path) -> tuple[list[DecisionTrace], int]:
    """``(traces, malformed)``: the decisions of a JSON Lines file and the number of lines skipped (not JSON,
    or no ``aid`` / ``option``). Blank lines are ignored.

    Raises:
        FileNotFoundError: no such file.
    """
    out, bad = [], 0
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(DecisionTrace.from_dict(d) if isinstance(d, dict) else None)
        except (ValueError, TypeError):
            out.append(None)
        if out[-1] is None:
            out.pop()
            bad += 1
    return out, bad


# ---------------------------------------------------------------------------------------------------------
# eval.json
# ---------------------------------------------------------------------------------------------------------


class _JsonRecord:
    """A record written as one indented JSON object (``to_dict``), read back by the class's ``load``."""

    def to_dict(self) -> dict:
        raise NotImplementedError

    def save(self, path: str | Path) -> Path:
        """Writes ``to_dict()`` as indented JSON with a final newline; returns ``path``."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path


def _finite_or_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclasses.dataclass(frozen=True)
class EvalBlock:
    """One evaluated policy (``eval.json``'s ``trained`` or ``base``).

    Attributes:
        policy: ``trained`` or ``frozen_base``.
        seeds: env seeds of the episodes.
        episodes: one dict per episode: ``seed``, ``team_return`` (apples or deliveries) and per-episode metrics
            (``efficiency``, ``equality``, ``sustainability``, ``peace``, ``decisions``, ``parse_fail_rate``,
            ``final_<world stat>``; Melting Pot games also ``agent_apples``, list[int] of length N).
        summary: ``{metric: {"mean", "std"}}`` over episodes (sample std).
        parse: parse outcome counts; seconds: wall time of the evaluation (s).
    """

    policy: str
    seeds: list[int]
    episodes: list[dict]
    summary: dict = dataclasses.field(default_factory=dict)
    parse: dict | None = None
    seconds: float | None = None

    def __post_init__(self):
        for k, ep in enumerate(self.episodes):
            if not isinstance(ep, dict) or "team_return" not in ep:
                raise ArtifactError(f"{self.policy}: episode {k} has no team_return")
        if len(self.episodes) != len(self.seeds):
            raise ArtifactError(f"{self.policy}: {len(self.episodes)} episode(s) for {len(self.seeds)} seed(s)")

    @property
    def team_returns(self) -> list[float]:
        """Per-episode team return (apples or deliveries), in seed order."""
        return [float(ep["team_return"]) for ep in self.episodes]

    def metric(self, key: str) -> np.ndarray:
        """float64[E] per-episode ``key`` (NaN where absent or None)."""
        return np.array([np.nan if ep.get(key) is None else float(ep[key]) for ep in self.episodes], np.float64)

    def numeric_keys(self) -> list[str]:
        """Per-episode scalar metrics, ``team_return`` first (lists, bools and ``seed`` excluded)."""
        keys: list[str] = ["team_return"]
        for ep in self.episodes:
            keys += [
                k
                for k, v in ep.items()
                if k not in keys and k != "seed" and isinstance(v, (int, float)) and not isinstance(v, bool)
            ]
        return keys

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "seeds": list(self.seeds),
            "episodes": [{k: _finite_or_none(v) for k, v in ep.items()} for ep in self.episodes],
            "summary": self.summary,
            "parse": self.parse,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "block") -> EvalBlock:
        if not isinstance(d, dict):
            raise ArtifactError(f"{where} is not an object")
        try:
            return cls(
                policy=str(d["policy"]),
                seeds=list(d["seeds"]),
                episodes=list(d["episodes"]),
                summary=d.get("summary") or {},
                parse=d.get("parse"),
                seconds=d.get("seconds"),
            )
        except KeyError as e:
            raise ArtifactError(f"{where} lacks {e}") from None


@dataclasses.dataclass(frozen=True)
class EvalRecord(_JsonRecord):
    """``eval.json``: the evaluation on held-out seeds (paper §6.1).

    Attributes:
        game, preset, reduced_budget: the run's.
        seeds: evaluation env seeds (10000, 10001, ...).
        trained: the evaluated adapters' block; base: the frozen base's on the same seeds, or None.
        eval_checkpoint: ``best`` or ``final``; checkpoint_rule: how the adapters were chosen (paper §6.1:
            highest training-time team return); checkpoint_round: the round whose rollouts they played;
            checkpoint_train_return: that round's mean training team return, or None.
        stats: :func:`jaxopt_marl.stats.eval_stats` of the team returns (CIs, Mann–Whitney U), or None.
    """

    game: str
    seeds: list[int]
    trained: EvalBlock
    base: EvalBlock | None = None
    preset: str | None = None
    reduced_budget: bool | None = None
    eval_checkpoint: str | None = None
    checkpoint_rule: str | None = None
    checkpoint_round: int | None = None
    checkpoint_train_return: float | None = None
    stats: dict | None = None

    def to_dict(self) -> dict:
        t = self.trained.to_dict()
        return {
            "game": self.game,
            "preset": self.preset,
            "reduced_budget": self.reduced_budget,
            "seeds": list(self.seeds),
            "eval_checkpoint": self.eval_checkpoint,
            "checkpoint_rule": self.checkpoint_rule,
            "checkpoint_round": self.checkpoint_round,
            "checkpoint_train_return": self.checkpoint_train_return,
            "trained": t,
            "base": None if self.base is None else self.base.to_dict(),
            "stats": self.stats,
        }

    @classmethod
    def load(cls, path: str | Path) -> EvalRecord:
        """Raises FileNotFoundError, or ArtifactError naming the file and the missing field."""
        d = _load_json_object(path)
        try:
            return cls(
                game=str(d["game"]),
                seeds=list(d["seeds"]),
                trained=EvalBlock.from_dict(d["trained"], "trained"),
                base=None if d.get("base") is None else EvalBlock.from_dict(d["base"], "base"),
                preset=d.get("preset"),
                reduced_budget=d.get("reduced_budget"),
                eval_checkpoint=d.get("eval_checkpoint"),
                checkpoint_rule=d.get("checkpoint_rule"),
                checkpoint_round=d.get("checkpoint_round"),
                checkpoint_train_return=d.get("checkpoint_train_return"),
                stats=d.get("stats") if isinstance(d.get("stats"), dict) else None,
            )
        except KeyError as e:
            raise ArtifactError(f"{path} lacks {e}") from None
        except ArtifactError as e:
            raise ArtifactError(f"{path}: {e}") from None


def _load_json_object(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path} is not valid JSON ({e.__class__.__name__}: {e})") from None
    if not isinstance(d, dict):
        raise ArtifactError(f"{path} is not a JSON object")
    return d


# ---------------------------------------------------------------------------------------------------------
# solo.json
# ---------------------------------------------------------------------------------------------------------


def _clean_list(v: Any) -> list[float | None]:
    return [None if not math.isfinite(float(x)) else float(x) for x in np.asarray(v, np.float64).ravel()]


def _mean_std(v: Any) -> dict:
    a = np.asarray(v, np.float64).ravel()
    a = a[np.isfinite(a)]
    return {
        "mean": float(a.mean()) if a.size else None,
        "std": (float(a.std(ddof=1)) if a.size > 1 else 0.0) if a.size else None,
        "n": int(a.size),
    }


@dataclasses.dataclass(frozen=True)
class SoloRecord(_JsonRecord):
    """``solo.json``: the solo test (paper §6.4), each agent alone with the others idled.

    Attributes:
        seeds: the evaluation seeds played (S).
        units: ``apples`` or ``deliveries``.
        team_return: float64[N, S] team return with only agent i active (NaN = not recorded).
        own_return: float64[N, S] agent i's own return in those episodes (NaN = not recorded).
        full_team: float64[S] the full team's return on the same seeds (from the evaluation; NaN = not run).
        verdict: :func:`jaxopt_marl.audit.solo_verdict` as written by the run.
        extra: the other keys (game, idled, full_team_source, checkpoint keys), kept as written.

    File layout: ``seeds``, ``units``, ``num_agents``, ``agents`` (per agent ``agent``, ``solo_team_return`` and
    ``own_return`` per seed, ``solo_team`` / ``own`` mean ± std), ``full_team`` (``returns`` per seed, mean ±
    std), ``verdict``, then ``extra``. NaN is written as null.
    """

    seeds: tuple[int, ...]
    units: str | None
    team_return: np.ndarray
    own_return: np.ndarray
    full_team: np.ndarray
    verdict: str | None = None
    extra: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("team_return", "own_return", "full_team"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), np.float64))
        s = len(self.seeds)
        if self.team_return.ndim != 2 or self.team_return.shape[1] != s:
            raise ArtifactError(f"team_return must be [N, S] with S = {s} seeds, got {self.team_return.shape}")
        if self.own_return.shape != self.team_return.shape:
            raise ArtifactError(f"own_return has shape {self.own_return.shape}, team_return {self.team_return.shape}")
        if self.full_team.shape != (s,):
            raise ArtifactError(f"full_team must have one value per seed ({s}), got {self.full_team.shape}")

    def to_dict(self) -> dict:
        return {
            "seeds": [int(x) for x in self.seeds],
            "units": self.units,
            "num_agents": int(self.team_return.shape[0]),
            "agents": [
                {
                    "agent": i,
                    "solo_team_return": _clean_list(self.team_return[i]),
                    "solo_team": _mean_std(self.team_return[i]),
                    "own_return": _clean_list(self.own_return[i]),
                    "own": _mean_std(self.own_return[i]),
                }
                for i in range(self.team_return.shape[0])
            ],
            "full_team": {"returns": _clean_list(self.full_team), **_mean_std(self.full_team)},
            "verdict": self.verdict,
            **self.extra,
        }

    @classmethod
    def load(cls, path: str | Path) -> SoloRecord:
        """Raises FileNotFoundError, or ArtifactError naming the file and the malformed field."""
        d = _load_json_object(path)
        agents = d.get("agents")
        if not isinstance(agents, list) or not agents or not all(isinstance(a, dict) for a in agents):
            raise ArtifactError(f"{path}: `agents` is missing or not a list of objects")
        full = d.get("full_team")
        if not isinstance(full, dict) or not isinstance(full.get("returns"), list):
            raise ArtifactError(f"{path}: `full_team.returns` is missing")
        seeds = d.get("seeds")
        if not isinstance(seeds, list):
            raise ArtifactError(f"{path}: `seeds` is missing")

        def nums(a: dict, key: str) -> list[float]:
            v = a.get(key)
            if not isinstance(v, list):
                raise ArtifactError(f"{path}: agent {a.get('agent')} lacks the per-seed list `{key}`")
            return [math.nan if x is None else float(x) for x in v]

        known = {"seeds", "units", "num_agents", "agents", "full_team", "verdict"}
        try:
            return cls(
                seeds=tuple(int(s) for s in seeds),
                units=d.get("units"),
                team_return=[nums(a, "solo_team_return") for a in agents],
                own_return=[nums(a, "own_return") for a in agents],
                full_team=[math.nan if x is None else float(x) for x in full["returns"]],
                verdict=d.get("verdict"),
                extra={k: v for k, v in d.items() if k not in known},
            )
        except (ArtifactError, ValueError, TypeError) as e:
            raise ArtifactError(f"{path}: {e}") from None


# ---------------------------------------------------------------------------------------------------------
# burnin.json
# ---------------------------------------------------------------------------------------------------------

#: The guard synthesis' default failure threshold, for a ``burnin.json`` written before ``min_support`` was
#: recorded: :data:`jaxopt_marl.guards.MIN_SUPPORT` (paper §5.1: 5; kept here as a number so the report's
#: imports stay free of JAX; tests/test_burnin.py checks the two are equal).
BURNIN_MIN_SUPPORT = 5


@dataclasses.dataclass(frozen=True)
class BurninSummary(_JsonRecord):
    """``burnin.json``: what a burn-in and its guard synthesis did (one layout for every writer).

    Attributes:
        game: the game.
        episodes, solo_episodes, joint_episodes: episodes run (solo + joint), of which solo, joint.
        decisions: completed option executions (= records).
        seconds: wall time of the episode loop (compile included); decisions_per_s: decisions per such second.
        seconds_guards: wall time of the guard synthesis.
        guards: guards synthesized; guards_per_option: their count per option name (every option, in menu order).
        seed: the burn-in's PRNG seed; steps: steps per episode; min_support: the synthesis' failure threshold.
        policy: ``uniform`` (§5.1 Stage 2) or ``llm`` (§5.1's frozen-LLM control); model: the LLM's ``--model``
            (``default``, ``tiny-random`` or a path; None for uniform); temperature: its sampling temperature
            (None for uniform). A file written before these keys existed loads as uniform.
        seconds_compile: of ``seconds``, the episode program's compile (None: not measured), so that
            ``seconds - seconds_compile`` is the warm cost.
        attempts_per_option, successes_per_option: completed executions and successes per option name (every
            option, in menu order; None in files written before they were recorded).
        never_succeeded: option name -> attempts, for every option tried at least once that never succeeded:
            the symptom of the paper's defect 3 (§5.1: "an option whose explicit failure rate is 100% while the
            task it names is plainly achievable"), flagged for the Stage-1 repair loop; ``{}`` when none.
        library: the option-library variant (``jaxopt_marl.options.LIBRARIES``; None in older files).
    """

    game: str
    episodes: int
    solo_episodes: int
    joint_episodes: int
    decisions: int
    seconds: float
    seconds_guards: float
    decisions_per_s: float
    guards: int
    guards_per_option: dict
    seed: int
    steps: int | None = None
    min_support: int = BURNIN_MIN_SUPPORT
    policy: str = "uniform"
    model: str | None = None
    temperature: float | None = None
    seconds_compile: float | None = None
    attempts_per_option: dict | None = None
    successes_per_option: dict | None = None
    never_succeeded: dict | None = None
    library: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def load(cls, path: str | Path) -> BurninSummary:
        """Raises FileNotFoundError, or :class:`ArtifactError` naming the file and what is missing or wrong
        (unknown keys are ignored)."""
        d = _load_json_object(path)
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            out = cls(**{k: v for k, v in d.items() if k in names})
        except TypeError as e:
            raise ArtifactError(f"{path}: {e}") from None
        for f in dataclasses.fields(cls):
            _check_field_type(path, f.name, str(f.type), getattr(out, f.name))
        return out


# A dataclass field annotation's base type (``from __future__ import annotations``: the annotation is a string).
_FIELD_TYPES = {
    "int": (int, "an integer"),
    "float": (float, "a finite number"),
    "str": (str, "a string"),
    "dict": (dict, "a JSON object"),
}


def _check_field_type(path, name: str, annotation: str, value) -> None:
    """ArtifactError naming ``path``, the field and the value unless ``value`` fits ``annotation`` (``int``,
    ``float``: a finite int or float, ``str``, ``dict``, each optionally ``| None``); bools are not numbers."""
    base, _, none = annotation.partition(" | ")
    if value is None and none == "None":
        return
    kind, what = _FIELD_TYPES[base]
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    else:
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        what += " or null" if none == "None" else ""
        raise ArtifactError(f"{path}: field {name} must be {what}, got {value!r}")


__all__ = [
    "BURNIN_JSON",
    "BURNIN_MIN_SUPPORT",
    "ArtifactError",
    "BurninSummary",
    "DecisionTrace",
    "EvalBlock",
    "EvalRecord",
    "EvalTrajectories",
    "PolicyTrajectories",
    "SoloRecord",
    "TERRAIN_NAMES",
    "TERRAIN_OF_LAYER",
    "RESPONSE_SOURCES",
    "load_traces",
    "save_traces",
    "map_layers",
]
