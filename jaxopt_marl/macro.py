"""Macro-action stepping: call-and-return options, asynchronous per agent, inside jitted steps (paper §3, §5.1).

Every agent owns one executor slot (:class:`~jaxopt_marl.options.base.Exec`). An agent whose option terminated
(or that has none) is at a *decision point*; a policy picks one instance of its instance table; the executors of
all agents emit primitive actions (``vmap`` over agents); the environment steps; options whose queue drained
(or that hit the library's ``timeout``) terminate and their delta-form effect predicate, evaluated on (pre
snapshot at initiation, post snapshot at termination), gives the outcome. An explicit executor failure at
expansion ends the option immediately with ``explicit:<reason>``; the agent then stays for that step and
decides again at the next one (at most one record per agent per step). Options still running when the
episode ends are truncated and not recorded (the burn-in logs *completed* executions only).

Functions here work on one environment and are ``vmap``-ed by the callers:

- :func:`init` — reset an env and make empty slots; ``acting`` marks the agents that take decisions (solo
  episodes: one acting agent, the partner stays put and never decides).
- :func:`tables` — every agent's instance table and read-set features (``[A, I]``, ``[A, I, F]``).
- :func:`needs_decision` — ``bool[A]`` agents at a decision point.
- :func:`begin` — start the chosen instances (``choice int32[A]``, -1 = none).
- :func:`advance` — one env step for all agents, returning a :class:`Rec` of the options that terminated.
- :func:`make_macro_step` — decide (policy callback) + begin + advance as one function (the burn-in step).
- :func:`make_advance_to_decision` — for the LLM stage: advances an env until one of its agents is at a decision
  point (or the episode ended), with an optional per-step :data:`Recorder`; :func:`make_advance_batch` jits its
  ``vmap`` over a batch of envs, where envs already at a decision point freeze, so the host only sees decision
  points.

Record buffers: each step yields a :class:`Rec` with one row per agent (``valid`` marks real records), so an
episode's records live in a fixed-size ``[T, A]`` buffer whose slot is (step, agent) — one record per agent
per step at most, no scatter needed; :mod:`jaxopt_marl.burnin` drops the invalid rows on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from jaxopt_marl.options.base import NO_REASON, Exec, Instances, OptionLibrary
from jaxopt_marl.records import OUTCOME_EFFECT_FAIL, OUTCOME_EXPLICIT_BASE, OUTCOME_SUCCESS

#: A policy callback: ``(key, inst [A, I], feats int32[A, I, F], need bool[A], ms) -> choice int32[A]``
#: (an instance index per agent, -1 = no decision). Called only inside jit.
Policy = Callable[[jax.Array, Instances, jax.Array, jax.Array, Any], jax.Array]
#: A per-step recorder of :func:`make_advance_to_decision`: ``(buf, pre, ms, running int32[A], action int32[A]) ->
#: buf``, called after every env step of one env: ``pre`` is the env state before the step, ``ms`` the macro state
#: after it, ``running`` the option each agent ran during it (-1 idle), ``action`` the primitive actions taken.
Recorder = Callable[[Any, Any, Any, jax.Array, jax.Array], Any]


@struct.dataclass
class MacroState:
    """One environment plus its agents' option slots.

    Attributes:
        env: the game state.
        slots: :class:`Exec` with leading agent axis ``[A]``.
        pre: effect-predicate snapshots at initiation, leading axis ``[A]``.
        feats: ``int32[A, F]`` read-set features of the running option at initiation.
        t0: ``int32[A]`` env step at which each running option was initiated.
        acting: ``bool[A]`` agents that take decisions in this episode.
        solo: ``bool[]`` single-agent episode.
    """

    env: Any
    slots: Exec
    pre: Any
    feats: jax.Array
    t0: jax.Array
    acting: jax.Array
    solo: jax.Array


class Rec(NamedTuple):
    """Outcome records of one step, one row per agent (``[A]`` leading axis).

    Attributes:
        valid: ``bool[A]`` the agent's option terminated this step (a record).
        step: ``int32[A]`` initiation step.
        opt: ``int32[A]`` option id.
        target: ``int32[A, 2]`` (row, col), -1 none.
        feats: ``int32[A, F]`` read-set features at initiation.
        outcome: ``int32[A]`` 0 success, 1 effect_fail, 2 + k explicit reason k.
    """

    valid: jax.Array
    step: jax.Array
    opt: jax.Array
    target: jax.Array
    feats: jax.Array
    outcome: jax.Array


def _agents(lib: OptionLibrary) -> jax.Array:
    return jnp.arange(lib.num_agents, dtype=jnp.int32)


def _empty_rec(lib: OptionLibrary) -> Rec:
    a, f = lib.num_agents, lib.num_features
    return Rec(
        valid=jnp.zeros((a,), bool),
        step=jnp.zeros((a,), jnp.int32),
        opt=jnp.full((a,), -1, jnp.int32),
        target=jnp.full((a, 2), -1, jnp.int32),
        feats=jnp.full((a, f), -1, jnp.int32),
        outcome=jnp.zeros((a,), jnp.int32),
    )


def _where(mask: jax.Array, new, old):
    """Per-agent select over pytrees with leading axis ``[A]``."""
    return jax.tree.map(lambda n, o: jnp.where(mask.reshape(mask.shape + (1,) * (n.ndim - 1)), n, o), new, old)


# ---------------------------------------------------------------------------------------------------------
# Building blocks (one environment)
# ---------------------------------------------------------------------------------------------------------


def init(lib: OptionLibrary, env, key: jax.Array, acting: jax.Array, solo: jax.Array) -> MacroState:
    """Reset ``env`` and give every agent an empty slot.

    Args:
        lib: the option library.
        env: the environment.
        key: reset key.
        acting: ``bool[A]`` agents that decide (solo episodes: exactly one).
        solo: ``bool[]`` flag stored in the records.
    """
    _, state = env.reset(key)
    empty = lib.empty_exec()
    slots = jax.tree.map(lambda x: jnp.broadcast_to(x, (lib.num_agents,) + jnp.shape(x)), empty)
    pre = jax.vmap(lambda a: lib.snapshot(state, a, jnp.full((2,), -1, jnp.int32)))(_agents(lib))
    return MacroState(
        env=state,
        slots=slots,
        pre=pre,
        feats=jnp.full((lib.num_agents, lib.num_features), -1, jnp.int32),
        t0=jnp.zeros((lib.num_agents,), jnp.int32),
        acting=jnp.asarray(acting, bool),
        solo=jnp.asarray(solo, bool),
    )


def tables(lib: OptionLibrary, state) -> tuple[Instances, jax.Array]:
    """Every agent's instance table ``[A, I]`` and read-set features ``int32[A, I, F]``."""

    def one(aid):
        inst = lib.instances(state, aid)
        return inst, lib.features(state, aid, inst)

    return jax.vmap(one)(_agents(lib))


def needs_decision(lib: OptionLibrary, ms: MacroState) -> jax.Array:
    """``bool[A]``: acting, present agents without a running option in a live episode."""
    return ms.acting & lib.present(ms.env) & ~ms.slots.active & ~ms.env.done


def begin(
    lib: OptionLibrary, ms: MacroState, choice: jax.Array, inst: Instances, feats: jax.Array | None = None
) -> tuple[MacroState, Rec]:
    """Start the chosen instances; explicit failures at expansion become records right away.

    Args:
        lib: the option library.
        ms: the macro state.
        choice: ``int32[A]`` instance index per agent, -1 = no new option.
        inst: ``[A, I]`` instance tables (from :func:`tables` on ``ms.env``).
        feats: ``int32[A, I, F]``, or None to compute the chosen instances' features only (cheaper).

    Returns:
        ``(ms, rec)``; ``rec.valid`` marks agents whose chosen option failed explicitly at start.
    """
    state = ms.env
    chosen = choice >= 0
    idx = jnp.maximum(choice, 0)
    take = jax.vmap(lambda x, i: x[i])
    opt, target = take(inst.opt, idx), take(inst.target, idx)
    if feats is None:
        one_inst = lambda a, o, tg: lib.features(state, a, Instances(o[None], tg[None], jnp.ones((1,), bool)))[0]
        f0 = jax.vmap(one_inst)(_agents(lib), opt, target)
    else:
        f0 = take(feats, idx)

    def one(aid, o, tg):
        ex, reason = lib.start(state, aid, o, tg)
        return ex, reason, lib.snapshot(state, aid, tg)

    ex, reason, pre = jax.vmap(one)(_agents(lib), opt, target)
    started = chosen & (reason == NO_REASON)
    failed = chosen & (reason != NO_REASON)
    slots = _where(started, ex, ms.slots)
    ms = ms.replace(
        slots=slots,
        pre=_where(started, pre, ms.pre),
        feats=_where(started, f0, ms.feats),
        t0=jnp.where(started, state.step, ms.t0),
    )
    rec = Rec(
        valid=failed,
        step=jnp.broadcast_to(state.step, choice.shape).astype(jnp.int32),
        opt=opt,
        target=target,
        feats=f0,
        outcome=OUTCOME_EXPLICIT_BASE + jnp.maximum(reason, 0),
    )
    return ms, rec


def advance(lib: OptionLibrary, env, ms: MacroState, key: jax.Array, return_action: bool = False):
    """One env step: executors emit actions, the env steps, terminated options are judged by their effect.

    Args:
        lib: the option library.
        env: the environment (``step_env`` is used: no auto-reset; callers stop at the episode's end).
        ms: the macro state.
        key: step key.
        return_action: also return the primitive actions taken (``int32[A]``; replaying them with the same
            step keys reproduces the episode, e.g. to render it).

    Returns:
        ``(ms, rec)`` with ``rec.valid`` marking options that terminated in this step; ``(ms, rec, action)``
        with ``return_action``.
    """
    state = ms.env
    agents = _agents(lib)
    action, drained, slots = jax.vmap(lambda a, ex: lib.act(state, a, ex))(agents, ms.slots)
    running = ms.slots.active
    action = jnp.where(running, action, lib.idle_action()).astype(jnp.int32)
    slots = _where(running, slots, ms.slots)
    _, new_state, _, _, _ = env.step_env(key, state, {a: action[i] for i, a in enumerate(env.agents)})
    term = running & (drained | (slots.t >= lib.timeout))  # the final step still completes options
    post = jax.vmap(lambda a, tg: lib.snapshot(new_state, a, tg))(agents, slots.target)
    ok = jax.vmap(lib.effect)(slots.opt, ms.pre, post)
    outcome = jnp.where(ok, OUTCOME_SUCCESS, OUTCOME_EFFECT_FAIL).astype(jnp.int32)
    rec = Rec(valid=term, step=ms.t0, opt=slots.opt, target=slots.target, feats=ms.feats, outcome=outcome)
    slots = slots._replace(active=slots.active & ~term)
    ms = ms.replace(env=new_state, slots=slots)
    return (ms, rec, action) if return_action else (ms, rec)


def merge(a: Rec, b: Rec) -> Rec:
    """Per-agent union of two record rows that never both hold a record for the same agent."""
    return _where(a.valid, a, b)


def uniform_policy(key: jax.Array, inst: Instances, feats: jax.Array, need: jax.Array, ms) -> jax.Array:
    """Uniform over the *valid* instances of the unguarded menu (§5.1 Stage 2); -1 where no decision."""
    logits = jnp.where(inst.valid, 0.0, -jnp.inf)
    keys = jax.random.split(key, need.shape[0])
    idx = jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)
    return jnp.where(need & inst.valid.any(-1), idx, -1)


def make_macro_step(lib: OptionLibrary, env, policy: Policy = uniform_policy, policy_features: bool = False):
    """One macro step for one env: decide (``policy``) + :func:`begin` + :func:`advance`.

    Args:
        lib: the option library.
        env: the environment.
        policy: the decision callback.
        policy_features: the policy reads the feature table (e.g. a guarded menu); otherwise it gets None and
            only the chosen instances' features are computed (the burn-in's uniform policy).

    Returns:
        ``step(ms, key) -> (ms, rec)``; ``rec`` is the merged per-agent record row.
    """

    def step(ms: MacroState, key: jax.Array):
        k_pol, k_env = jax.random.split(key)
        if policy_features:
            inst, feats = tables(lib, ms.env)
        else:
            inst = jax.vmap(lambda a: lib.instances(ms.env, a))(_agents(lib))
            feats = None
        need = needs_decision(lib, ms)
        choice = policy(k_pol, inst, feats, need, ms)
        ms, rec_a = begin(lib, ms, choice, inst, feats)
        ms, rec_b = advance(lib, env, ms, k_env)
        return ms, merge(rec_a, rec_b)

    return step


def make_advance_to_decision(lib: OptionLibrary, env, recorder: Recorder | None = None):
    """Advance ONE env until one of its agents is at a decision point or its episode ended (not jitted; vmap it,
    or use :func:`make_advance_batch`). The one advance of every stage that plays the options: the host loop
    (:class:`jaxopt_marl.rollout.Roller`) and the compiled rollout (:mod:`jaxopt_marl.compiled_rollout`).

    An env already at a decision point (or done) does not step ("freezes"), unless ``force``: then it takes at
    least one step although an agent waits for a decision (an agent that could not start an option waits one idle
    step instead of being asked again at the same state). Step t's env key is ``fold_in(env_key, t)``
    (:func:`jaxopt_marl.rollout.episode_keys`). The returned record rows hold the options that terminated in the
    last step (every termination creates a decision point, so no record is skipped).

    Args:
        lib: the option library.
        env: the environment.
        recorder: optional per-step recorder (:data:`Recorder`) writing into the buffers ``buf`` after every step
            (e.g. :func:`jaxopt_marl.rollout.make_traj_recorder`); None: ``buf`` is passed through.

    Returns:
        ``one(ms, env_key, force=False, buf=None) -> (ms, buf, need bool[A], rec Rec[A])``.
    """

    def one(ms: MacroState, env_key: jax.Array, force=False, buf=None):
        def cond(c):
            m, _, i, _ = c
            return (((i == 0) & force) | ~needs_decision(lib, m).any()) & ~m.env.done

        def body(c):
            m, b, i, _ = c
            pre = m.env
            running = jnp.where(m.slots.active, m.slots.opt, -1)
            m, rec, action = advance(lib, env, m, jax.random.fold_in(env_key, pre.step), return_action=True)
            if recorder is not None:
                b = recorder(b, pre, m, running, action)
            return m, b, i + 1, rec

        ms, buf, _, rec = jax.lax.while_loop(cond, body, (ms, buf, jnp.int32(0), _empty_rec(lib)))
        return ms, buf, needs_decision(lib, ms), rec

    return one


def make_advance_batch(lib: OptionLibrary, env, recorder: Recorder | None = None):
    """Jitted :func:`make_advance_to_decision` vmapped over a batch of envs.

    Returns:
        ``fn(ms [B], env_keys [B], force bool[B] | None = None, buf [B] | None = None) -> (ms, buf, need bool[B, A],
        rec Rec[B, A])``.
    """
    one = make_advance_to_decision(lib, env, recorder)

    @jax.jit
    def fn(ms: MacroState, env_keys: jax.Array, force=None, buf=None):
        if force is None:
            force = jnp.zeros(ms.acting.shape[:1], bool)
        return jax.vmap(one)(ms, env_keys, force, buf)

    return fn


def make_begin_batch(lib: OptionLibrary):
    """Jitted batch version of :func:`begin` for host-chosen instances (the LLM stage).

    Returns:
        ``fn(ms [B], choice int32[B, A]) -> (ms [B], rec Rec[B, A])`` (instance tables recomputed inside).
    """

    def one(ms, choice):
        inst, feats = tables(lib, ms.env)
        return begin(lib, ms, choice, inst, feats)

    return jax.jit(jax.vmap(one))


__all__ = [
    "MacroState",
    "Policy",
    "Rec",
    "Recorder",
    "advance",
    "begin",
    "init",
    "make_advance_batch",
    "make_advance_to_decision",
    "make_begin_batch",
    "make_macro_step",
    "merge",
    "needs_decision",
    "tables",
    "uniform_policy",
]
