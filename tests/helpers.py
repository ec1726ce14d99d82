"""Shared test helpers: a tiny-model rollout stack (rollout / trainer tests) and the option-library drivers
(scripted Melting Pot states, one option run to termination)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs_jax import meltingpot as mp
from jaxopt_marl.options.base import NO_REASON

# ---------------------------------------------------------------------------------------------------------
# Rollouts with a tiny random decoder
# ---------------------------------------------------------------------------------------------------------


def tiny_roller(game, steps, policy_cfg):
    """A :class:`jaxopt_marl.rollout.Roller` on ``game`` (episodes of ``steps``), no guards, menu seed 0, whose
    policy (``policy_cfg``) is a tiny random decoder with 2 LoRA adapters of rank 2 (alpha 4)."""
    # Imported here: the option-library tests import this module too and need no model.
    import envs_jax
    from jaxopt_marl import guards, options, rollout
    from lora import LoRAConfig

    env = envs_jax.make(game, max_steps=steps)
    lib = options.get_library(game, env)
    model, tok = rollout.load_policy_model(rollout.TINY_RANDOM, LoRAConfig(num_adapters=2, rank=2, alpha=4.0))
    pol = rollout.LLMPolicy(model, tok, game, policy_cfg)
    return rollout.Roller(game, env, lib, guards.compile_guards([], lib.vocab), pol, menu_seed=0)


def tiny_compiled_roller(game, steps, policy_cfg, batch=2):
    """As :func:`tiny_roller`, but the compiled rollout (:class:`jaxopt_marl.compiled_rollout.CompiledRoller`,
    what the runs use) playing ``batch`` episodes per call, each wave in one padded model call (one compile)."""
    import envs_jax
    from jaxopt_marl import compiled_rollout, guards, options, rollout
    from lora import LoRAConfig

    env = envs_jax.make(game, max_steps=steps)
    lib = options.get_library(game, env)
    model, tok = rollout.load_policy_model(rollout.TINY_RANDOM, LoRAConfig(num_adapters=2, rank=2, alpha=4.0))
    return compiled_rollout.CompiledRoller(
        game,
        env,
        lib,
        guards.compile_guards([], lib.vocab),
        model,
        tok,
        policy_cfg,
        menu_seed=0,
        batch=batch,
        chunks=compiled_rollout.ChunkConfig.single(batch * lib.num_agents),
    )


class CountingBar:
    """A stand-in tqdm bar for :func:`jaxopt_marl.progress.route`: its position ``n`` and the number of
    ``update`` calls."""

    def __init__(self):
        self.n = 0
        self.calls = 0

    def update(self, k):
        self.n += k
        self.calls += 1


# ---------------------------------------------------------------------------------------------------------
# Option libraries
# ---------------------------------------------------------------------------------------------------------


def option_fixtures(make_env, make_library):
    """Module-scoped ``env`` (``make_env()``) and ``lib`` (``make_library(env)``) fixtures, to be bound at module
    level: ``env, lib = option_fixtures(...)``."""

    @pytest.fixture(scope="module")
    def env():
        return make_env()

    @pytest.fixture(scope="module")
    def lib(env):
        return make_library(env)

    return env, lib


def cell_grid(env, cells):
    """bool[H, W] grid of ``env``, true at the given ``(row, col)`` cells."""
    grid = np.zeros((env.height, env.width), bool)
    for r, c in cells:
        grid[r, c] = True
    return jnp.asarray(grid)


def scripted_state(env, agents, apples=None, **fields):
    """Melting Pot reset state (key 0) with agents ``{aid: ((row, col), facing)}``, apples at the given cells
    (None: the map's) and any other state ``fields`` replaced."""
    _, s = env.reset(jax.random.PRNGKey(0))
    pos, facing = s.pos, s.facing
    for aid, ((r, c), f) in agents.items():
        pos, facing = pos.at[aid].set(jnp.array([r, c])), facing.at[aid].set(f)
    s = s.replace(pos=pos, facing=facing, **fields)
    return s if apples is None else s.replace(apples=cell_grid(env, apples))


_JIT = {}


def _jitted(env, lib):
    """(act, step) jitted once per (env, lib): act(state, aid, ex), step(key, state, actions int32[A])."""
    key = (id(env), id(lib))
    if key not in _JIT:
        act = jax.jit(lambda s, a, e: lib.act(s, a, e))
        step = jax.jit(lambda k, s, acts: env.step_env(k, s, {a: acts[i] for i, a in enumerate(env.agents)})[1])
        _JIT[key] = (act, step)
    return _JIT[key]


def drive_option(env, lib, state, aid, name, target, idle, partner=(), max_steps=40, seed=1):
    """Start option ``name`` of two-agent ``aid`` at ``target`` (it must start: no explicit failure) and execute it
    until it drains, reaches ``lib.timeout`` steps, or ``max_steps``; the other agent plays ``partner`` actions,
    then ``idle``. Env steps use ``PRNGKey(seed)``.

    Returns ``(final state, actions, drained)``.
    """
    ex, reason = lib.start(state, aid, lib.option_id(name), jnp.asarray(target, jnp.int32))
    assert int(reason) == NO_REASON
    act, step = _jitted(env, lib)
    key = jax.random.PRNGKey(seed)
    actions, drained = [], False
    for t in range(max_steps):
        a, d, ex = act(state, aid, ex)
        acts = [idle] * env.num_agents
        acts[1 - aid] = partner[t] if t < len(partner) else idle
        acts[aid] = int(a)
        actions.append(int(a))
        state = step(key, state, jnp.asarray(acts, jnp.int32))
        drained = bool(d)
        if drained or int(ex.t) >= lib.timeout:
            break
    return state, actions, drained


def run_option(env, lib, state, aid, name, target, partner=(), max_steps=40):
    """Melting Pot: :func:`drive_option` with the other agent on NOOP after ``partner``.

    Returns ``(final state, actions, effect bool)``.
    """
    target = jnp.asarray(target, jnp.int32)
    pre = lib.snapshot(state, aid, target)
    state, actions, _ = drive_option(env, lib, state, aid, name, target, mp.NOOP, partner, max_steps)
    return state, actions, bool(lib.effect(lib.option_id(name), pre, lib.snapshot(state, aid, target)))
