"""Macro-action stepping: call-and-return slots, records, advance-to-decision (frozen envs)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from jaxopt_marl import macro
from jaxopt_marl.options import get_library

B = 4


@pytest.fixture(scope="module")
def setup():
    env = envs_jax.make("overcooked_aa", max_steps=60)
    lib = get_library("overcooked_aa", env)
    return env, lib


def test_burnin_step_records_are_consistent(setup):
    env, lib = setup
    step = jax.jit(macro.make_macro_step(lib, env))
    ms = macro.init(lib, env, jax.random.PRNGKey(0), jnp.array([True, True]), jnp.array(False))
    n_rec = 0
    for t in range(40):
        ms, rec = step(ms, jax.random.PRNGKey(t))
        valid = np.asarray(rec.valid)
        n_rec += valid.sum()
        assert (np.asarray(rec.step)[valid] <= t).all()
        assert (np.asarray(rec.outcome)[valid] >= 0).all()
        # a terminated option leaves its slot idle -> the agent decides at the next step
        assert not np.asarray(ms.slots.active)[valid].any()
    assert int(ms.env.step) == 40
    assert n_rec >= 10  # options last a few steps each


def test_solo_partner_never_decides(setup):
    env, lib = setup
    step = jax.jit(macro.make_macro_step(lib, env))
    ms = macro.init(lib, env, jax.random.PRNGKey(1), jnp.array([True, False]), jnp.array(True))
    start = np.asarray(envs_jax.overcooked.agent_positions(ms.env))[1]
    for t in range(30):
        ms, rec = step(ms, jax.random.PRNGKey(t))
        assert not bool(rec.valid[1])
    assert np.asarray(envs_jax.overcooked.agent_positions(ms.env))[1].tolist() == start.tolist()


def test_advance_to_decision_freezes_envs_at_decision_points(setup):
    env, lib = setup
    keys = jax.random.split(jax.random.PRNGKey(0), B)
    ms = jax.vmap(lambda k: macro.init(lib, env, k, jnp.array([True, True]), jnp.array(False)))(keys)
    batch = macro.make_advance_batch(lib, env)

    def adv(ms, key):  # one key per env, as the rollouts' episode keys
        ms, _, need, rec = batch(ms, jax.random.split(key, B))
        return ms, need, rec

    begin = macro.make_begin_batch(lib)
    # At reset every agent is at a decision point: nothing advances.
    ms2, need, _ = adv(ms, jax.random.PRNGKey(1))
    assert np.asarray(need).all()
    assert (np.asarray(ms2.env.step) == 0).all()
    # Host picks "wait" for agent 0 and place_in_pot @ first pot for agent 1, in every env.
    wait = lib.num_instances - 1
    pot = int(lib.slot_start[lib.option_id("place_in_pot")])
    choice = jnp.tile(jnp.array([[wait, pot]]), (B, 1))
    ms3, rec = begin(ms2, choice)
    # place_in_pot with empty hands still starts (environment-naive executor); no explicit failure
    assert not np.asarray(rec.valid).any()
    ms4, need, rec = adv(ms3, jax.random.PRNGKey(2))
    need = np.asarray(need)
    assert need.any(axis=1).all()  # every env stopped at a decision point
    assert need[:, 0].all()  # wait lasts one step
    assert (np.asarray(ms4.env.step) == 1).all()
    assert np.asarray(rec.valid)[:, 0].all()
    # Calling again without decisions leaves every env frozen.
    ms5, need5, _ = adv(ms4, jax.random.PRNGKey(3))
    assert (np.asarray(ms5.env.step) == np.asarray(ms4.env.step)).all()
