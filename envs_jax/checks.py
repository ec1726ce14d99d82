"""Checked mode: out-of-range actions are reported, never silently wrapped or clipped.

``envs_jax.make(name, checked=True)`` returns a :class:`CheckedEnv`. Its ``step`` runs the game's step
under :mod:`jax.experimental.checkify` and raises on the host when any action lies outside
``[0, num_actions)``. This costs a host sync per step, so it is a debugging mode, not the hot path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import checkify


class CheckedEnv:
    """Wraps a ``MultiAgentEnv``; ``step`` raises ``checkify.JaxRuntimeError`` on a bad action.

    All other attributes (``reset``, ``world_stats``, ``render``, ``agents`` …) are the wrapped game's.
    """

    def __init__(self, env):
        self._env = env
        self._checked_step = jax.jit(checkify.checkify(self._step_with_checks))

    def __getattr__(self, name):
        return getattr(self._env, name)

    def _step_with_checks(self, key, state, actions):
        for agent in self._env.agents:
            a = jnp.asarray(actions[agent])
            n = self._env.action_space(agent).n
            checkify.check(
                jnp.all((a >= 0) & (a < n)),
                f"{agent}: action {{a}} out of range [0, {n})",
                a=a,
            )
        return self._env.step(key, state, actions)

    def step(self, key, state, actions):
        """Same as the game's ``step``; raises ``checkify.JaxRuntimeError`` naming the agent and action."""
        err, out = self._checked_step(key, state, actions)
        err.throw()
        return out
