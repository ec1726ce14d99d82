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
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa

from jaxopt_marl import macro
from jaxopt_marl.guards import GuardList, synthesize_guards
from jaxopt_marl.options.base import OptionLibrary
from jaxopt_marl.records import RecordCodes, records_from_arrays

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
    """

    codes: RecordCodes
    episodes: int
    solo_episodes: int
    decisions: int
    seconds: float

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
    for s in starts:
        n = min(chunk, e - s)
        idx = np.arange(s, s + chunk) % e  # pad by wrapping; padded rows are dropped below
        recs = fn(keys[idx], jnp.asarray(acting[idx]), jnp.asarray(solo[idx]))
        recs = jax.tree.map(lambda x, n=n: np.asarray(x)[:n], recs)
        parts.append(_flatten(recs, np.arange(s, s + n), solo[s : s + n]))
    seconds = time.perf_counter() - t0
    codes = RecordCodes(*(np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))))
    return BurninResult(codes=codes, episodes=e, solo_episodes=num_solo, decisions=codes.num_records, seconds=seconds)


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


__all__ = ["DEFAULT_CHUNK", "BurninResult", "episode_plan", "make_episodes_fn", "run_burnin", "synthesize", "to_table"]
