"""Every registered game meets the shared interface (DESIGN.md, "Games")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import envs_jax

EXPECTED = {
    "cleanup": (7, {"apples", "dirt"}),
    "harvest": (7, {"apples", "patches_alive"}),
    "overcooked_aa": (2, {"deliveries"}),
    "overcooked_fc": (2, {"deliveries"}),
}


def test_registry_lists_every_game():
    assert set(envs_jax.GAMES) == set(EXPECTED)


@pytest.mark.parametrize("game", sorted(EXPECTED))
def test_reset_step_jit_vmap_world_stats_render(game):
    n_agents, stat_keys = EXPECTED[game]
    env = envs_jax.make(game)
    assert env.agents == [f"agent_{i}" for i in range(n_agents)]
    n_envs = 3
    obs, state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), n_envs))
    assert set(obs) >= set(env.agents)
    actions = {a: jnp.zeros((n_envs,), jnp.int32) for a in env.agents}
    obs, state, rew, dones, _ = jax.jit(jax.vmap(env.step))(
        jax.random.split(jax.random.PRNGKey(1), n_envs), state, actions
    )
    for a in env.agents:
        assert rew[a].shape == (n_envs,)
        assert obs[a].shape[0] == n_envs
    assert "__all__" in dones
    stats = jax.vmap(env.world_stats)(state)
    assert stat_keys <= set(stats)
    for k, v in stats.items():
        assert v.shape == (n_envs,), k
    one = jax.tree.map(lambda x: x[0], state)
    img = np.asarray(jax.jit(env.render)(one))
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[-1] == 3
    assert img.std() > 0  # a real picture, not a blank frame


def test_unknown_game_lists_valid_ones():
    with pytest.raises(ValueError, match="cleanup.*harvest.*overcooked_aa.*overcooked_fc") as e:
        envs_jax.make("clean_up")
    assert "'clean_up'" in str(e.value)


@pytest.mark.parametrize("game", sorted(EXPECTED))
def test_unknown_config_key_lists_valid_ones(game):
    with pytest.raises(ValueError, match="max_steps") as e:
        envs_jax.make(game, max_stepz=10)
    assert "max_stepz" in str(e.value)


@pytest.mark.parametrize("game", ["cleanup", "overcooked_aa"])
def test_checked_mode_reports_out_of_range_action(game):
    env = envs_jax.make(game, checked=True)
    _, state = env.reset(jax.random.PRNGKey(0))
    n = env.action_space(env.agents[0]).n
    ok = {a: jnp.int32(0) for a in env.agents}
    env.step(jax.random.PRNGKey(1), state, ok)  # in range: no error
    bad = dict(ok, agent_1=jnp.int32(n))
    with pytest.raises(checkify.JaxRuntimeError, match=f"agent_1: action {n} out of range"):
        env.step(jax.random.PRNGKey(1), state, bad)
