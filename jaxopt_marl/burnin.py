"""Stage 2: uniform-over-menu burn-in (paper §5.1), as one jitted scan per episode vmapped over episodes.

The harness runs episodes under the one-line policy of §5.1 — uniform over the *valid* instances of the
instantiated, guardless menu (:func:`jaxopt_marl.macro.uniform_policy`) — and emits one record per completed
option execution: ``ep, step, aid, solo, opt, target``, the read-set features at initiation, and the outcome
(success / effect_fail / explicit:<reason>) decided by the effect predicate or the executor's typed failure,
never by reward.

Episodes come in two kinds (§5.1 Defect 2: options with no private component are mined from solo records):

- *solo*: one acting agent; every other agent stays in the world but never decides and emits the library's idle
  action (Overcooked: ``stay``; on AA and FC the regions are disjoint, so an idle partner blocks nothing). The
  acting agent alternates with the episode index (``ep % A``) so every region of the map is covered.
- *joint*: all agents decide.

A whole episode is one ``lax.scan`` over ``T`` env steps; a chunk of episodes is one ``vmap`` of it (chunked to
bound memory). Each episode fills a fixed ``[T, A]`` record buffer (:class:`jaxopt_marl.macro.Rec`); the host
keeps the valid rows and builds the Parquet table with :func:`jaxopt_marl.records.records_from_arrays`.

**The frozen-LLM control** (§5.1: "a control experiment replacing the uniform policy with a frozen pretrained
LLM ... yielding 2 guards versus uniform's 36 at roughly 400x the cost"): :func:`run_llm_burnin` plays the same
episode plan (the same kinds, acting agents and reset states) with the LLM choosing from the same guardless menu
(:class:`jaxopt_marl.compiled_rollout.CompiledRoller` with an empty guard set, the frozen base, ``choice_only``
letter sampling at the paper's temperature, ``burnin=True``) and returns the same records, so guard synthesis and
:func:`write_outputs` run unchanged on them. :func:`compare` sets the two side by side (``compare.json``).

Outputs (:func:`write_outputs`, one layout for ``python -m experiments.burnin`` and a run's ``burnin/``):
``records.parquet`` (the records), ``guards.jsonl`` (the synthesized guards; a run keeps it at the run's top
level) and ``burnin.json`` (:class:`jaxopt_marl.artifacts.BurninSummary`, re-exported here).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa

from jaxopt_marl import macro
from jaxopt_marl.artifacts import BURNIN_JSON, BurninSummary
from jaxopt_marl.guards import MIN_SUPPORT, GuardList, synthesize_guards, write_guards
from jaxopt_marl.options.base import OptionLibrary
from jaxopt_marl.records import OUTCOME_SUCCESS, RecordCodes, records_from_arrays, write_records

#: Default episodes per jitted chunk (memory: chunk * T * A record rows).
DEFAULT_CHUNK = 500


@dataclasses.dataclass
class BurninResult:
    """What a burn-in produced.

    Attributes:
        codes: the records as integer columns (what guard synthesis counts over).
        episodes: episodes run (solo + joint).
        solo_episodes: of which solo.
        decisions: completed option executions (= records).
        seconds: wall time of the episode loop (compile included unless warmed up).
        policy: ``uniform`` (:func:`run_burnin`) or ``llm`` (:func:`run_llm_burnin`).
        model: the LLM's ``--model`` spec (``default``, ``tiny-random`` or a path); None for uniform.
        temperature: the LLM's sampling temperature; None for uniform.
        seconds_compile: of ``seconds``, the compile of the episode program (ahead of the first call), so that
            ``seconds - seconds_compile`` is the warm cost; None when the caller's ``fn`` was already compiled.
    """

    codes: RecordCodes
    episodes: int
    solo_episodes: int
    decisions: int
    seconds: float
    policy: str = "uniform"
    model: str | None = None
    temperature: float | None = None
    seconds_compile: float | None = None

    @property
    def decisions_per_s(self) -> float:
        return self.decisions / max(self.seconds, 1e-9)


def make_episodes_fn(
    lib: OptionLibrary, env, num_steps: int | None = None, policy: macro.Policy = macro.uniform_policy
) -> Callable:
    """Jitted ``fn(keys [B], acting bool[B, A], solo bool[B]) -> Rec [B, T, A]`` running whole episodes."""
    steps = int(num_steps or env.max_steps)
    step = macro.make_macro_step(lib, env, policy)

    def episode(key, acting, solo):
        k_reset, k_run = jax.random.split(key)
        ms = macro.init(lib, env, k_reset, acting, solo)
        _, recs = jax.lax.scan(step, ms, jax.random.split(k_run, steps))
        return recs

    return jax.jit(jax.vmap(episode))


def episode_plan(num_solo: int, num_joint: int, num_agents: int) -> tuple[np.ndarray, np.ndarray]:
    """``(acting bool[E, A], solo bool[E])``: solo episodes first (actor ``ep % A``), then joint ones."""
    e = num_solo + num_joint
    ep = np.arange(e)
    solo = ep < num_solo
    acting = np.where(solo[:, None], np.arange(num_agents)[None, :] == (ep % num_agents)[:, None], True)
    return acting, solo


def run_burnin(
    lib: OptionLibrary,
    env,
    num_solo: int,
    num_joint: int,
    *,
    seed: int = 0,
    chunk: int = DEFAULT_CHUNK,
    num_steps: int | None = None,
    progress: bool = False,
    fn: Callable | None = None,
) -> BurninResult:
    """Run the uniform burn-in and collect records.

    Args:
        lib: the game's option library.
        env: the environment.
        num_solo: solo episodes.
        num_joint: all-agent episodes.
        seed: PRNG seed (episode ``ep`` uses ``fold_in(PRNGKey(seed), ep)``).
        chunk: episodes per jitted call (the last chunk is padded to keep one compiled shape).
        num_steps: steps per episode (default ``env.max_steps``).
        progress: show a tqdm bar over chunks.
        fn: a prebuilt :func:`make_episodes_fn` (reuse its compilation).

    Returns:
        :class:`BurninResult`.
    """
    fn = fn or make_episodes_fn(lib, env, num_steps)
    e = num_solo + num_joint
    acting, solo = episode_plan(num_solo, num_joint, lib.num_agents)
    base = jax.random.PRNGKey(seed)
    keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(e))
    chunk = max(1, min(chunk, e))
    starts = range(0, e, chunk)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc=f"burn-in {lib.game}", unit="chunk", total=-(-e // chunk))
    parts = []
    t0 = time.perf_counter()
    exe, seconds_compile = fn, None
    if hasattr(fn, "lower"):  # compile ahead of the first call (the same executable), to time the compile alone
        idx = np.arange(chunk) % e
        exe = fn.lower(keys[idx], jnp.asarray(acting[idx]), jnp.asarray(solo[idx])).compile()
        seconds_compile = time.perf_counter() - t0
    for s in starts:
        n = min(chunk, e - s)
        idx = np.arange(s, s + chunk) % e  # pad by wrapping; padded rows are dropped below
        recs = exe(keys[idx], jnp.asarray(acting[idx]), jnp.asarray(solo[idx]))
        recs = jax.tree.map(lambda x, n=n: np.asarray(x)[:n], recs)
        parts.append(_flatten(recs, np.arange(s, s + n), solo[s : s + n]))
    seconds = time.perf_counter() - t0
    codes = _concat(parts)
    return BurninResult(
        codes=codes,
        episodes=e,
        solo_episodes=num_solo,
        decisions=codes.num_records,
        seconds=seconds,
        seconds_compile=seconds_compile,
    )


def make_llm_roller(
    lib: OptionLibrary,
    env,
    model,
    tokenizer,
    *,
    temperature: float,
    seed: int = 0,
    batch: int = 4,
    chunks=None,
):
    """The compiled rollout as the burn-in control's policy (paper §5.1): no guards (so every agent's menu is
    the uniform burn-in's guardless one: the valid instances of its instance table), ``choice_only`` letter
    sampling at ``temperature``, one shared adapter (played off: :func:`run_llm_burnin` passes
    ``reference=True``, the frozen base), ``burnin=True`` (:class:`jaxopt_marl.compiled_rollout.CompiledRoller`).

    Args:
        lib, env: the game's option library and environment (its ``max_steps`` is the episode length).
        model, tokenizer: from :func:`jaxopt_marl.rollout.load_policy_model` with one adapter.
        temperature: the sampling temperature (paper: ``jaxopt_marl.config.PAPER[game]["temperature"]``).
        seed: the menus' letter-shuffle seed.
        batch: K, episodes per compiled call.
        chunks: a :class:`jaxopt_marl.compiled_rollout.ChunkConfig` (default: per backend).
    """
    from jaxopt_marl import guards as G
    from jaxopt_marl import rollout
    from jaxopt_marl.compiled_rollout import CompiledRoller

    cfg = rollout.PolicyConfig(mode="choice_only", temperature=float(temperature), shared_adapter=True)
    return CompiledRoller(
        lib.game,
        env,
        lib,
        G.compile_guards([], lib.vocab),
        model,
        tokenizer,
        cfg,
        menu_seed=seed,
        batch=batch,
        chunks=chunks,
        burnin=True,
    )


def run_llm_burnin(
    roller,
    num_solo: int,
    num_joint: int,
    *,
    seed: int = 0,
    model_name: str | None = None,
    progress: bool = False,
) -> BurninResult:
    """The frozen-LLM burn-in control (paper §5.1): :func:`run_burnin`'s episode plan and records, with the LLM
    choosing from the guardless menu instead of the uniform draw.

    Episode ``ep`` (solo episodes first, actor ``ep % A``, as :func:`episode_plan`) is the compiled rollout's
    episode ``ep`` under ``key = PRNGKey(seed)``: it starts from the uniform burn-in's episode-``ep`` state;
    its env steps and letter draws come from its own keys (:func:`jaxopt_marl.rollout.episode_keys`), so the
    records do not depend on which episodes share a call (up to float rounding where the model's chunk shapes
    differ). A record is a decision whose option completed (success,
    effect_fail, explicit:<reason>), with the read-set features at initiation; options still running at the
    episode's end and idle decisions (an empty menu) are not records, as in :func:`run_burnin`.

    Args:
        roller: from :func:`make_llm_roller` (its env's ``max_steps`` is the episode length ``T``).
        num_solo, num_joint: episodes of each kind.
        seed: the run seed.
        model_name: the ``--model`` spec recorded in the result.
        progress: a tqdm bar over the compiled calls.

    Returns:
        :class:`BurninResult` with ``policy="llm"``; ``seconds`` is the episode loop's wall time, compile included
        (``seconds_compile`` of it).
    """
    from lora import split_model

    lib = roller.lib
    e = num_solo + num_joint
    acting, solo = episode_plan(num_solo, num_joint, lib.num_agents)
    key = jax.random.PRNGKey(seed)
    _, adapters, base = split_model(roller.model)
    k = roller.batch
    starts = range(0, e, k)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc=f"llm burn-in {lib.game}", unit="call", total=-(-e // k))
    parts = []
    t0 = time.perf_counter()
    base, adapters = jax.device_put((base, adapters), roller._device)
    # Compiled ahead of the first call (the executable roller.run would build), to time the compile alone.
    exe = roller._fn.lower(
        base, adapters, *roller.device_args(np.arange(k) % e, key, True, acting[np.arange(k) % e])
    ).compile()
    seconds_compile = time.perf_counter() - t0
    for s in starts:
        nb = min(k, e - s)
        idx = np.arange(s, s + k) % e  # pad by wrapping (one compiled shape); padded rollouts are dropped
        out = exe(base, adapters, *roller.device_args(idx, key, True, acting[idx]))
        dec, feats = jax.device_get((out.decisions, out.feats))
        parts.append(_flatten_decisions(dec, feats, s, nb, solo))
    seconds = time.perf_counter() - t0
    codes = _concat(parts)
    order = np.lexsort((codes.aid, codes.step, codes.ep))  # (ep, step, aid)
    codes = RecordCodes(*(np.asarray(c)[order] for c in codes))
    return BurninResult(
        codes=codes,
        episodes=e,
        solo_episodes=num_solo,
        decisions=codes.num_records,
        seconds=seconds,
        policy="llm",
        model=model_name,
        temperature=float(roller.cfg.temperature),
        seconds_compile=seconds_compile,
    )


def _flatten_decisions(dec, feats: np.ndarray, offset: int, keep: int, solo: np.ndarray) -> RecordCodes:
    """The records among one compiled call's decisions (host copies): real decisions of the kept rollouts whose
    option completed (outcome code >= 0), as :class:`RecordCodes` (episode = ``offset`` + rollout index)."""
    n = int(dec.count)
    rollout = np.asarray(dec.rollout[:n])
    outcome = np.asarray(dec.outcome[:n])
    mask = (rollout < keep) & (outcome >= 0)
    ep = (offset + rollout[mask]).astype(np.int32)
    target = np.asarray(dec.target[:n])[mask]
    return RecordCodes(
        ep=ep,
        step=np.asarray(dec.step[:n])[mask].astype(np.int32),
        aid=np.asarray(dec.aid[:n])[mask].astype(np.int32),
        solo=solo[ep].astype(bool),
        opt=np.asarray(dec.option[:n])[mask].astype(np.int32),
        target_x=target[:, 1].astype(np.int32),
        target_y=target[:, 0].astype(np.int32),
        outcome=outcome[mask].astype(np.int32),
        features=np.asarray(feats[:n])[mask].astype(np.int32),
    )


def _concat(parts: list[tuple]) -> RecordCodes:
    """The chunks' record columns (each a tuple in :class:`RecordCodes` order) joined into one table."""
    return RecordCodes(*(np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))))


def _flatten(recs: macro.Rec, ep: np.ndarray, solo: np.ndarray) -> RecordCodes:
    """Valid rows of a ``[B, T, A]`` record buffer as :class:`RecordCodes`, ordered by (ep, step, aid)."""
    b, t, a = recs.valid.shape
    mask = recs.valid.reshape(-1)
    ep_col = np.broadcast_to(ep[:, None, None], (b, t, a)).reshape(-1)[mask]
    solo_col = np.broadcast_to(solo[:, None, None], (b, t, a)).reshape(-1)[mask]
    aid = np.broadcast_to(np.arange(a)[None, None, :], (b, t, a)).reshape(-1)[mask]
    target = recs.target.reshape(-1, 2)[mask]
    return RecordCodes(
        ep=ep_col.astype(np.int32),
        step=recs.step.reshape(-1)[mask].astype(np.int32),
        aid=aid.astype(np.int32),
        solo=solo_col.astype(bool),
        opt=recs.opt.reshape(-1)[mask].astype(np.int32),
        target_x=target[:, 1].astype(np.int32),
        target_y=target[:, 0].astype(np.int32),
        outcome=recs.outcome.reshape(-1)[mask].astype(np.int32),
        features=recs.feats.reshape(-1, recs.feats.shape[-1])[mask].astype(np.int32),
    )


def to_table(lib: OptionLibrary, codes: RecordCodes) -> pa.Table:
    """The Parquet-ready record table (:func:`jaxopt_marl.records.records_from_arrays`)."""
    return records_from_arrays(
        lib.vocab,
        ep=codes.ep,
        step=codes.step,
        aid=codes.aid,
        solo=codes.solo,
        opt=codes.opt,
        target=np.stack([codes.target_y, codes.target_x], 1),
        outcome=codes.outcome,
        features=codes.features,
    )


def synthesize(lib: OptionLibrary, codes: RecordCodes, **kwargs) -> GuardList:
    """Stage 3 over burn-in records with the library's read sets and solo-only flags."""
    return synthesize_guards(codes, lib.vocab, lib.read_sets, solo_only=lib.solo_only, **kwargs)


def summarize(
    lib: OptionLibrary,
    result: BurninResult,
    guards: GuardList,
    *,
    seed: int,
    seconds_guards: float,
    steps: int | None = None,
    min_support: int = MIN_SUPPORT,
) -> BurninSummary:
    """The :class:`BurninSummary` of ``result`` and the ``guards`` synthesized from it (with the options that
    never succeeded: :func:`never_succeeded`)."""
    per_opt = Counter(g.opt for g in guards)
    tried, won = option_outcomes(lib, result.codes)
    return BurninSummary(
        game=lib.game,
        episodes=result.episodes,
        solo_episodes=result.solo_episodes,
        joint_episodes=result.episodes - result.solo_episodes,
        decisions=result.decisions,
        seconds=round(result.seconds, 3),
        seconds_guards=round(seconds_guards, 3),
        decisions_per_s=round(result.decisions_per_s, 1),
        guards=len(guards),
        guards_per_option={o: per_opt.get(o, 0) for o in lib.option_names},
        seed=int(seed),
        steps=None if steps is None else int(steps),
        min_support=int(min_support),
        policy=result.policy,
        model=result.model,
        temperature=result.temperature,
        seconds_compile=None if result.seconds_compile is None else round(result.seconds_compile, 3),
        attempts_per_option=tried,
        successes_per_option=won,
        never_succeeded={o: n for o, n in tried.items() if n and not won[o]},
        library=getattr(lib, "library", None),
    )


def option_outcomes(lib: OptionLibrary, codes) -> tuple[dict[str, int], dict[str, int]]:
    """``(attempts, successes)`` per option name of ``lib`` (menu order) over the records ``codes``
    (:class:`jaxopt_marl.records.RecordCodes`: ``opt int32[N]``, ``outcome`` 0 = success)."""
    n = len(lib.option_names)
    opt = np.asarray(codes.opt, np.int64)
    tried = np.bincount(opt, minlength=n)
    won = np.bincount(opt[np.asarray(codes.outcome) == OUTCOME_SUCCESS], minlength=n)
    names = lib.option_names
    return {o: int(tried[i]) for i, o in enumerate(names)}, {o: int(won[i]) for i, o in enumerate(names)}


def never_succeeded_warning(summary: BurninSummary) -> str | None:
    """The console warning for a burn-in with options that never succeeded (None when every tried option
    succeeded at least once)."""
    bad = summary.never_succeeded or {}
    if not bad:
        return None
    names = ", ".join(f"{o} (0 of {n})" for o, n in bad.items())
    return (
        f"warning: burn-in: option(s) that never succeeded: {names}; a 100% failure rate is the symptom of the "
        f"paper's defect 3 (§5.1): check the option's instantiation and contract"
    )


def write_outputs(
    lib: OptionLibrary,
    result: BurninResult,
    guards: GuardList,
    out_dir: str | Path,
    *,
    guard_path: str | Path | None = None,
    **summary,
) -> BurninSummary:
    """Writes ``out_dir/records.parquet``, the guards (``guard_path``, default ``out_dir/guards.jsonl``) and
    ``out_dir/burnin.json`` (:func:`summarize` with ``summary``: seed, seconds_guards, steps, min_support);
    returns the summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_records(to_table(lib, result.codes), out_dir / "records.parquet")
    write_guards(guards, Path(guard_path) if guard_path is not None else out_dir / "guards.jsonl")
    s = summarize(lib, result, guards, **summary)
    s.save(out_dir / BURNIN_JSON)
    return s


__all__ = [
    "BURNIN_JSON",
    "DEFAULT_CHUNK",
    "BurninResult",
    "BurninSummary",
    "episode_plan",
    "never_succeeded_warning",
    "option_outcomes",
    "make_episodes_fn",
    "make_llm_roller",
    "run_burnin",
    "run_llm_burnin",
    "summarize",
    "synthesize",
    "to_table",
    "write_outputs",
]
