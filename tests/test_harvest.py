"""Commons Harvest (Open) rules (spec §2) pinned on the real map and on small hand-built maps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax.harvest import (
    REGROWTH_PROBABILITIES,
    ZAP_REMOVAL_FRAMES,
    CommonsHarvest,
    neighbour_apple_count,
    regrowth_probability,
)
from tests.helpers import assert_fp32_close

NOOP, FORWARD, BACKWARD, STEP_LEFT, STEP_RIGHT, TURN_LEFT, TURN_RIGHT, ZAP = range(8)
N, E, S, W = range(4)

# A lone apple (k = 0 forever once eaten) and a 3x3 block of apples around (2, 7).
SMALL_MAP = """
WWWWWWWWWW
W A   AAAW
W     AAAW
W     AAAW
W        W
WPPPPPPPPW
WWWWWWWWWW
"""

_JITTED = {}


def jitted(env, name):
    if (id(env), name) not in _JITTED:
        _JITTED[id(env), name] = (env, jax.jit(getattr(env, name)))
    return _JITTED[id(env), name][1]


def place(env, pos, facing, **fields):
    _, st = env.reset(jax.random.PRNGKey(0))
    return st.replace(pos=jnp.asarray(pos, jnp.int32), facing=jnp.asarray(facing, jnp.int32), **fields)


@pytest.fixture(scope="module")
def small():
    return CommonsHarvest(ascii_map=SMALL_MAP, num_agents=2)


def test_real_map_matches_spec():
    env = CommonsHarvest()
    assert env.ascii_map.shape == (18, 24)
    assert env.apple_capable.sum() == 64
    assert len(env.spawn_points) == 60 and env.inside_spawn_points.tolist() == [[7, 7], [7, 16]]
    sizes = sorted(np.bincount(env.patch_id[env.patch_id >= 0]).tolist())
    assert env.num_patches == 6 and sizes == [6, 6, 13, 13, 13, 13]
    assert env.action_space("agent_0").n == 8


def test_reset_first_two_agents_inside():
    env = envs_jax.make("harvest")
    obs, st = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), 32))
    pos = np.asarray(st.pos)
    inside = {(7, 7), (7, 16)}
    spawn = {tuple(p) for p in env.spawn_points.tolist()}
    for e in range(32):
        assert {tuple(pos[e, 0]), tuple(pos[e, 1])} == inside
        rest = {tuple(p) for p in pos[e, 2:].tolist()}
        assert len(rest) == 5 and rest <= spawn
    assert np.all(np.asarray(st.apples).sum((1, 2)) == 64)
    stats = jax.vmap(env.world_stats)(st)
    assert np.all(np.asarray(stats["patches_alive"]) == 6)
    assert obs["agent_3"].shape == (32, 11, 11, 9) and obs["agent_3"].dtype == jnp.uint8


def test_bad_config_raises():
    with pytest.raises(ValueError, match="max_steps"):
        CommonsHarvest(max_steps=0)
    with pytest.raises(ValueError, match="num_agents.*8"):
        CommonsHarvest(num_agents=8)


def test_regrowth_table_and_neighbourhood():
    assert REGROWTH_PROBABILITIES == (0.0, 0.0025, 0.005, 0.025)
    # float32 table entries vs the exact values: one rounding each, of its own size.
    want = np.array([0, 0.0025, 0.005] + [0.025] * 11)
    assert_fp32_close(regrowth_probability(jnp.arange(14)), want, 1, scale=want)
    one = jnp.zeros((7, 7), bool).at[3, 3].set(True)
    k = np.asarray(neighbour_apple_count(one))
    assert k.sum() == 12 and k[3, 3] == 0  # 12 neighbours at distance <= 2, not the cell itself
    assert k[1, 3] == k[3, 5] == k[2, 2] == 1 and k[1, 2] == 0 and k[1, 1] == 0


def test_no_regrowth_without_apples_in_radius(small):
    """The lone apple at (1, 2): once eaten (k = 0 around it) it never comes back."""
    st = place(small, [(1, 1), (5, 8)], [E, N])
    n, steps = 64, 200
    step = jax.vmap(small.step_state, in_axes=(0, 0, None))

    def body(st, k):
        st = step(jax.random.split(k, n), st, jnp.asarray([NOOP, NOOP]))
        return st, st.apples[:, 1, 2]

    st = jitted(small, "step_state")(jax.random.PRNGKey(0), st, jnp.asarray([FORWARD, NOOP]))
    assert not bool(st.apples[1, 2]) and int(st.ate[0]) == 1
    st_b = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), st)
    _, lone = jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.PRNGKey(1), steps)))(st_b)
    assert not np.asarray(lone).any()


def test_eaten_apple_waits_a_step_and_standing_agent_eats_regrowth(small):
    """Agent on (2, 7) amid 8 apples (k >= 3): meals at rate ~1/(1/0.025 + 1) with a minimum gap of 2."""
    st = place(small, [(2, 7), (5, 1)], [N, N], apples=jnp.asarray(small.apple_capable).at[2, 7].set(False))
    n, steps = 128, 150
    step = jax.vmap(small.step_state, in_axes=(0, 0, None))

    def body(st, k):
        st = step(jax.random.split(k, n), st, jnp.asarray([NOOP, NOOP]))
        return st, st.ate[:, 0]

    st_b = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), st)
    _, ate = jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.PRNGKey(3), steps)))(st_b)
    ate = np.asarray(ate)  # [step, env]
    assert not np.any(ate[1:] & ate[:-1])  # never two meals in consecutive steps
    # 19,200 agent-steps; expected 1/41 = 0.0244, sd of the mean ~ 0.0011.
    assert abs(ate.mean() - 1 / 41) < 0.005


def test_zap_removal_four_frames_and_cooldown_two(small):
    """Hit in step 1: removed after steps 1..5 (5 all-zero observations), back after step 6 on a P cell.
    Constant FIRE_ZAP fires at steps 1, 4, 7 (cooldown 2)."""
    st = place(small, [(3, 3), (2, 3)], [N, S])
    step = jitted(small, "step_env")
    obs, st, rew, _, _ = step(jax.random.PRNGKey(0), st, {"agent_0": ZAP, "agent_1": NOOP})
    assert bool(st.zapped[1]) and bool(st.zap_fired[0])
    fired, absent = [1], 1
    for t in range(2, 12):
        obs, st, rew, _, _ = step(jax.random.PRNGKey(t), st, {"agent_0": ZAP, "agent_1": FORWARD})
        if bool(st.zap_fired[0]):
            fired.append(t)
        if not bool(st.alive[1]):
            absent += 1
            assert not np.asarray(obs["agent_1"]).any() and float(rew["agent_1"]) == 0.0
            assert float(small.ready_to_shoot(st)[1]) == 0.0
        elif absent == ZAP_REMOVAL_FRAMES + 1:
            assert t == 6 and tuple(np.asarray(st.pos[1]))[0] == 5  # respawned on a P cell (row 5)
            absent += 100  # count only the first removal
    assert absent == 105
    assert fired[:3] == [1, 4, 7]


def test_zap_segment_blocked_by_first_agent():
    env = CommonsHarvest(ascii_map=SMALL_MAP, num_agents=4)
    st = place(env, [(4, 4), (3, 4), (2, 4), (4, 5)], [N, N, N, N])
    (out,) = [jitted(env, "step_state")(jax.random.PRNGKey(0), st, jnp.asarray([ZAP, NOOP, NOOP, NOOP]))]
    # Centre segment hits agent 1 and stops; the right segment starts beside the shooter and hits agent 3.
    assert np.asarray(out.zapped).tolist() == [False, True, False, True]
    assert int(out.zap_hits[0]) == 2


def test_respawns_only_on_p_cells():
    env = envs_jax.make("harvest")
    n, steps = 16, 120
    _, st = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), n))

    def body(c, k):
        st = c
        ka, ks = jax.random.split(k)
        a = jax.random.randint(ka, (n, 7), 0, 8)
        st = jax.vmap(env.step_state)(jax.random.split(ks, n), st, a)
        return st, (st.respawned, st.pos)

    _, (resp, pos) = jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.PRNGKey(1), steps)))(st)
    resp, pos = np.asarray(resp), np.asarray(pos)
    assert resp.sum() > 10
    spawn = {tuple(p) for p in env.spawn_points.tolist()}
    assert all(tuple(p) in spawn for p in pos[resp])


def test_render_and_episode_length():
    env = envs_jax.make("harvest", max_steps=2)
    obs, st = env.reset(jax.random.PRNGKey(0))
    assert np.asarray(env.render(st)).shape == (144, 192, 3)
    acts = {a: jnp.int32(NOOP) for a in env.agents}
    _, st, _, d1, _ = env.step(jax.random.PRNGKey(1), st, acts)
    _, st, _, d2, _ = env.step(jax.random.PRNGKey(2), st, acts)
    assert not bool(d1["__all__"]) and bool(d2["__all__"]) and int(st.step) == 0
