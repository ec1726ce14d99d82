"""Shared driver for the Melting Pot option-library tests: run one option of one agent to termination."""

import jax
import jax.numpy as jnp

from envs_jax import meltingpot as mp
from jaxopt_marl.options.base import NO_REASON

_JIT = {}


def _jitted(env, lib):
    key = (id(env), id(lib))
    if key not in _JIT:
        act = jax.jit(lambda s, a, e: lib.act(s, a, e))
        step = jax.jit(lambda s, acts: env.step_env(jax.random.PRNGKey(1), s,
                                                     {a: acts[i] for i, a in enumerate(env.agents)})[1])
        _JIT[key] = (act, step)
    return _JIT[key]


def run_option(env, lib, state, aid, name, target, partner=(), max_steps=40):
    """Run one option of ``aid`` to termination; the other agent plays ``partner`` actions then NOOPs.

    Returns ``(final state, actions, effect bool)``.
    """
    target = jnp.asarray(target, jnp.int32)
    o = lib.option_id(name)
    ex, reason = lib.start(state, aid, o, target)
    assert int(reason) == NO_REASON
    pre = lib.snapshot(state, aid, target)
    act, step = _jitted(env, lib)
    actions = []
    for t in range(max_steps):
        a, drained, ex = act(state, aid, ex)
        acts = [mp.NOOP] * env.num_agents
        acts[1 - aid] = partner[t] if t < len(partner) else mp.NOOP
        acts[aid] = int(a)
        actions.append(int(a))
        state = step(state, jnp.asarray(acts, jnp.int32))
        if bool(drained) or int(ex.t) >= lib.timeout:
            break
    return state, actions, bool(lib.effect(o, pre, lib.snapshot(state, aid, target)))
