"""Shared test helpers: float32 tolerances, a tiny-model rollout stack (rollout / trainer tests) and the
option-library drivers (scripted Melting Pot states, one option run to termination)."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs_jax import meltingpot as mp
from jaxopt_marl.options.base import NO_REASON

# ---------------------------------------------------------------------------------------------------------
# Float32 tolerances
# ---------------------------------------------------------------------------------------------------------

#: float32 machine epsilon (2**-23 = 1.19e-7): the relative spacing of float32 numbers near 1.
EPS32 = float(np.finfo(np.float32).eps)


def fp32_atol(scale, n, k=8.0):
    """Absolute tolerance for two float32 evaluations of one quantity that differ only in their order of
    operations (micro-batched vs one pass, sharded vs unsharded, cached vs recomputed, JAX vs a NumPy
    reference): ``k * EPS32 * sqrt(n) * scale``.

    Each of ``n`` roundings on a result's path adds an error of at most ``EPS32 / 2`` times the magnitude it
    rounds; under another order they fall differently, and their sum grows like ``sqrt(n)`` (a random walk,
    the usual model of accumulated rounding). ``scale`` is the largest magnitude on that path (the summed
    terms, or the quantity's largest element): a result that is small because large terms cancel carries the
    terms' absolute error, which is why an elementwise ``rtol`` is the wrong model for sums (issue 13: 1 element
    of 768 off by 1.29e-4 relative, 6.7e-6 absolute). Where each element is its own chain of products (no
    sums), ``scale`` may be the array of the elements' own magnitudes. ``k`` is the margin: 8 (the random walk's
    several sigmas) per chained program or step; callers that chain several state it.
    """
    return k * EPS32 * math.sqrt(n) * np.asarray(scale, np.float64)


def assert_fp32_close(actual, desired, n, *, scale=None, k=8.0, err_msg=""):
    """``|actual - desired| <= fp32_atol(scale, n, k)``, ``scale`` by default ``max |desired|`` (the array's
    largest element, not each element's own). With ``FP32_MARGINS=1`` in the environment, prints the largest
    error as a fraction of its tolerance (``pytest -s``), to check the margins."""
    a, d = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    assert a.shape == d.shape, (a.shape, d.shape, err_msg)
    if scale is None:
        scale = np.abs(d).max() if d.size else 0.0
    tol = np.broadcast_to(fp32_atol(scale, n, k), d.shape)
    err = np.abs(a - d)
    frac = float((err / np.where(tol > 0, tol, np.inf)).max()) if d.size else 0.0
    if os.environ.get("FP32_MARGINS"):
        e, t = (float(err.max()), float(tol.max())) if d.size else (0.0, 0.0)
        print(f"\nFP32_MARGIN {err_msg or '-'}: largest error / tolerance {frac:.3g} (n={n}, k={k}; {e:.3g}, {t:.3g})")
    bad = err > tol
    assert not bad.any(), (
        f"{err_msg}: {int(bad.sum())} of {d.size} element(s) off by more than k * eps32 * sqrt(n) * scale "
        f"(k={k}, n={n}): largest |difference| {err.max():.3g}, largest scale {float(np.max(scale)):.3g}"
    )


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
