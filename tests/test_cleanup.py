"""Clean Up rules (spec §1) pinned on the real map and on small hand-built maps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import meltingpot as mp
from envs_jax.cleanup import (
    CLEAN_COOLDOWN,
    DIRT_SPAWN_START_STEP,
    ZAP_REMOVAL_FRAMES,
    Cleanup,
    apple_growth_probability,
)
from tests.helpers import assert_fp32_close

NOOP, FORWARD, BACKWARD, STEP_LEFT, STEP_RIGHT, TURN_LEFT, TURN_RIGHT, ZAP, CLEAN = range(9)
N, E, S, W = range(4)

# A 5x5 all-dirty river (rows 1-5) above a sand row with one spawn point.
RIVER_MAP = """
WWWWWWW
WFFFFFW
WFFFFFW
WFFFFFW
WFFFFFW
WFFFFFW
WPP   W
WWWWWWW
"""
# An empty room; row 4 holds the spawn points.
ROOM_MAP = """
WWWWWWW
W     W
W     W
W     W
WPPPPPW
WWWWWWW
"""


def place(env, pos, facing, **fields):
    """A reset state of ``env`` with agents moved to ``pos`` facing ``facing``."""
    _, st = env.reset(jax.random.PRNGKey(0))
    return st.replace(pos=jnp.asarray(pos, jnp.int32), facing=jnp.asarray(facing, jnp.int32), **fields)


_JITTED = {}


def jitted(env, name):
    """``jax.jit(getattr(env, name))``, compiled once per env (bound methods are new objects each time)."""
    if (id(env), name) not in _JITTED:
        _JITTED[id(env), name] = (env, jax.jit(getattr(env, name)))
    return _JITTED[id(env), name][1]


def run(env, st, actions_per_step, seed=0):
    """Steps (no auto-reset) with one action list per step; returns the list of states after each step."""
    step = jitted(env, "step_state")
    out = []
    for t, acts in enumerate(actions_per_step):
        st = step(jax.random.PRNGKey(seed * 1000 + t), st, jnp.asarray(acts, jnp.int32))
        out.append(st)
    return out


@pytest.fixture(scope="module")
def river():
    return Cleanup(ascii_map=RIVER_MAP, num_agents=1)


@pytest.fixture(scope="module")
def room():
    return Cleanup(ascii_map=ROOM_MAP, num_agents=3)


# ------------------------------------------------------------------------------------------------
# Map and reset (spec §1.1, §1.2)
# ------------------------------------------------------------------------------------------------


def test_real_map_counts_match_spec():
    env = Cleanup()
    assert env.ascii_map.shape == (21, 30)
    assert env.wall.sum() == 98
    assert env.dirt_capable.sum() == 147 and env.dirt_at_reset.sum() == 79
    assert env.apple_capable.sum() == 122
    assert not env.apple_capable[16, 20] and not env.apple_capable[16, 21]
    spawn = {tuple(p) for p in env.spawn_points.tolist()}
    assert spawn == {
        (7, 4),
        (7, 9),
        (8, 6),
        (8, 12),
        (8, 16),
        (8, 25),
        (9, 14),
        (9, 18),
        (10, 4),
        (10, 9),
        (10, 26),
        (11, 16),
        (11, 23),
        (12, 6),
        (12, 18),
        (13, 12),
        (13, 24),
        (14, 3),
        (14, 17),
    }


def test_reset_distinct_spawns_dirt_and_no_apples():
    env = envs_jax.make("cleanup")
    obs, st = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(3), 32))
    spawn = {tuple(p) for p in env.spawn_points.tolist()}
    pos = np.asarray(st.pos)
    for e in range(32):
        cells = {tuple(p) for p in pos[e].tolist()}
        assert len(cells) == 7 and cells <= spawn
    assert np.all(np.asarray(st.dirt).sum((1, 2)) == 79)
    assert np.asarray(st.apples).sum() == 0
    assert set(np.asarray(st.facing).ravel().tolist()) == {0, 1, 2, 3}
    assert obs["agent_0"].shape == (32, 11, 11, 11) and obs["agent_0"].dtype == jnp.uint8
    assert env.action_space("agent_0").n == 9


@pytest.mark.parametrize("bad", [0, -3, 1.5])
def test_bad_max_steps_raises(bad):
    with pytest.raises(ValueError, match="max_steps"):
        Cleanup(max_steps=bad)


def test_bad_num_agents_raises():
    with pytest.raises(ValueError, match="num_agents.*6"):
        envs_jax.make("cleanup", num_agents=6)


# ------------------------------------------------------------------------------------------------
# Movement and conflicts (spec §1.2)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "facing, action, expect",
    [
        (E, STEP_RIGHT, (3, 3)),  # facing East, the agent's right is South: moves down
        (E, FORWARD, (2, 4)),
        (E, BACKWARD, (2, 2)),
        (E, STEP_LEFT, (1, 3)),
        (N, FORWARD, (1, 3)),
        (N, STEP_RIGHT, (2, 4)),
        (S, STEP_RIGHT, (2, 2)),
        (W, FORWARD, (2, 2)),
    ],
)
def test_relative_movement(room, facing, action, expect):
    st = place(room, [(2, 3), (4, 1), (4, 5)], [facing, N, N])
    (st,) = run(room, st, [[action, NOOP, NOOP]])
    assert tuple(np.asarray(st.pos[0])) == expect
    assert int(st.facing[0]) == facing  # moves never turn


def test_turns_and_wall(room):
    st = place(room, [(1, 1), (4, 1), (4, 5)], [N, N, N])
    s1, s2, s3 = run(room, st, [[TURN_RIGHT, TURN_LEFT, NOOP], [FORWARD, NOOP, NOOP], [TURN_LEFT, NOOP, NOOP]])
    assert int(s1.facing[0]) == E and int(s1.facing[1]) == W
    assert tuple(np.asarray(s2.pos[0])) == (1, 2)
    st = place(room, [(1, 1), (4, 1), (4, 5)], [N, N, N])
    (s,) = run(room, st, [[FORWARD, NOOP, NOOP]])  # wall ahead: stays
    assert tuple(np.asarray(s.pos[0])) == (1, 1)


def _resolve(pos, targets, rank, wall_map=ROOM_MAP):
    wall = jnp.asarray(mp.parse_ascii_map(wall_map) == "W")
    n = len(pos)
    return np.asarray(
        mp.resolve_moves(
            jnp.asarray(pos), jnp.asarray(targets), jnp.ones(n, bool), jnp.ones(n, bool), wall, jnp.asarray(rank)
        )
    )


def test_two_agents_into_one_cell_earlier_wins():
    pos, tgt = [(2, 2), (2, 4)], [(2, 3), (2, 3)]
    assert _resolve(pos, tgt, [0, 1]).tolist() == [[2, 3], [2, 4]]
    assert _resolve(pos, tgt, [1, 0]).tolist() == [[2, 2], [2, 3]]


def test_head_on_swap_fails_in_any_order():
    pos, tgt = [(2, 2), (2, 3)], [(2, 3), (2, 2)]
    for rank in ([0, 1], [1, 0]):
        assert _resolve(pos, tgt, rank).tolist() == [[2, 2], [2, 3]]


def test_following_succeeds_only_if_leader_moves_first():
    pos, tgt = [(2, 2), (2, 3)], [(2, 3), (2, 4)]  # agent 0 follows agent 1
    assert _resolve(pos, tgt, [1, 0]).tolist() == [[2, 3], [2, 4]]
    assert _resolve(pos, tgt, [0, 1]).tolist() == [[2, 2], [2, 4]]


def test_random_order_splits_contested_cell(room):
    """Both agents aim at (2, 3); over many steps each wins about half the time (fresh order per step)."""
    st = place(room, [(2, 2), (2, 4), (4, 1)], [E, W, N])
    step = jax.jit(jax.vmap(room.step_state, in_axes=(0, None, None)))
    out = step(jax.random.split(jax.random.PRNGKey(5), 400), st, jnp.asarray([FORWARD, FORWARD, NOOP]))
    won0 = np.all(np.asarray(out.pos[:, 0]) == [2, 3], axis=-1)
    won1 = np.all(np.asarray(out.pos[:, 1]) == [2, 3], axis=-1)
    assert np.all(won0 ^ won1)
    assert 150 < won0.sum() < 250


# ------------------------------------------------------------------------------------------------
# Cleaning beam (spec §1.3)
# ------------------------------------------------------------------------------------------------


def test_clean_footprint_order_and_cooldown(river):
    """Constant FIRE_CLEAN from (5, 3) facing N in an all-dirty river: fires at steps 1, 4, 7 (cooldown 2);
    removes {(0,±1),(1,0)}, then {(1,±1),(2,0)}, then {(2,±1),(3,0)}, then nothing (relative (f, s))."""
    st = place(river, [(5, 3)], [N])
    states = run(river, st, [[CLEAN]] * 10)
    fired = [bool(s.clean_fired[0]) for s in states]
    assert fired == [True, False, False, True, False, False, True, False, False, True]
    assert CLEAN_COOLDOWN == 2
    prev = np.asarray(st.dirt)
    removed = []
    for s in states:
        now = np.asarray(s.dirt)
        removed.append({(5 - r, c - 3) for r, c in zip(*np.nonzero(prev & ~now))})  # (forward, side)
        prev = now
    assert removed[0] == {(0, -1), (0, 1), (1, 0)}
    assert removed[3] == {(1, -1), (1, 1), (2, 0)}
    assert removed[6] == {(2, -1), (2, 1), (3, 0)}
    assert removed[9] == set()
    assert all(removed[i] == set() for i in (1, 2, 4, 5, 7, 8))
    assert [int(s.cleaned[0]) for s in states[:7:3]] == [3, 3, 3]


def test_clean_stops_at_wall(river):
    """From (1, 3) facing N the centre segment hits the wall at once; sides clean (1, 2), (1, 4) and then
    stop at the wall above them; nothing beyond a wall is ever touched."""
    st = place(river, [(1, 3)], [N])
    states = run(river, st, [[CLEAN]] * 4)
    first = np.asarray(st.dirt) & ~np.asarray(states[0].dirt)
    assert sorted(zip(*np.nonzero(first))) == [(1, 2), (1, 4)]
    assert np.array_equal(np.asarray(states[0].dirt), np.asarray(states[3].dirt))


def test_clean_not_blocked_by_agent_or_clean_water():
    env = Cleanup(ascii_map=RIVER_MAP, num_agents=2)
    dirt = np.asarray(env.dirt_at_reset).copy()
    dirt[3:5, 3] = False  # two clean cells straight ahead, then dirt at (2, 3)
    st = place(env, [(5, 3), (4, 3)], [N, N], dirt=jnp.asarray(dirt))
    (s,) = run(env, st, [[CLEAN, NOOP]])
    assert not bool(s.dirt[2, 3]) and bool(s.dirt[1, 3])


def _one_dirt_between_two_shooters():
    """Agents at (3, 1) facing E and (3, 5) facing W on RIVER_MAP with (3, 3) the only dirty cell: both centre
    segments ((3,2),(3,3),(3,4) and (3,4),(3,3),(3,2)) pass clean water and reach (3, 3) first."""
    env = Cleanup(ascii_map=RIVER_MAP, num_agents=2)
    dirt = np.zeros_like(np.asarray(env.dirt_at_reset))
    dirt[3, 3] = True
    return env, place(env, [(3, 1), (3, 5)], [E, W], dirt=jnp.asarray(dirt))


def test_two_beams_on_one_dirt_cell_credit_one_shooter():
    """The cell is cleaned once and credited once, to the first shooter in ``order`` (agent index order when
    none is given): ``cleaned`` is [1, 0] or [0, 1], never [1, 1]."""
    env, st = _one_dirt_between_two_shooters()
    wall = jnp.asarray(env.wall)
    both = jnp.asarray([True, True])
    for order, want in ((None, [1, 0]), ([0, 1], [1, 0]), ([1, 0], [0, 1])):
        dirt, cleaned = mp.clean_beams(
            st.pos, st.facing, both, wall, st.dirt, None if order is None else jnp.asarray(order)
        )
        assert not np.asarray(dirt).any()
        assert np.asarray(cleaned).tolist() == want
    # Only one shooter fires: it gets the cell whatever the order.
    _, cleaned = mp.clean_beams(st.pos, st.facing, jnp.asarray([False, True]), wall, st.dirt, jnp.asarray([0, 1]))
    assert np.asarray(cleaned).tolist() == [0, 1]


def test_step_credits_a_shared_dirt_cell_once_in_random_order():
    """Through ``step_state``: over 200 step keys the shared cell is always cleaned and credited exactly once,
    to the shooter first in that step's order (its own stream), and each agent wins some of the draws."""
    from envs_jax import cleanup as cu

    env, st = _one_dirt_between_two_shooters()
    keys = jax.random.split(jax.random.PRNGKey(3), 200)
    out = jax.jit(jax.vmap(env.step_state, in_axes=(0, None, None)))(keys, st, jnp.asarray([CLEAN, CLEAN]))
    cleaned = np.asarray(out.cleaned)
    assert not np.asarray(out.dirt).any() and np.asarray(out.clean_fired).all()
    assert (cleaned.sum(axis=1) == 1).all()
    first = np.asarray(
        jax.vmap(lambda k: mp.random_ranks(mp.hash_uniform(mp.seed_from_key(k), (2,), cu._STREAM_CLEAN_ORDER)))(keys)
    )
    np.testing.assert_array_equal(cleaned, (first == 0).astype(np.int32))
    assert 50 < cleaned[:, 0].sum() < 150
    assert np.asarray(env.num_others_who_cleaned(jax.tree.map(lambda x: x[0], out))).tolist() == (
        [0, 1] if cleaned[0, 0] else [1, 0]
    )


# ------------------------------------------------------------------------------------------------
# Zap, removal, respawn (spec §1.3)
# ------------------------------------------------------------------------------------------------


def test_zap_hits_first_agent_only_and_removal_timing(room):
    """Agent 0 zaps north at agents 1 (first) and 2 (behind it): only 1 is removed. Hit in step 1, it is
    absent after steps 1..51 (51 all-zero observations), back after step 52 on a spawn point."""
    st = place(room, [(3, 3), (2, 3), (1, 3)], [N, S, S], zap_cooldown=jnp.asarray([0, 4, 0]))
    step = jitted(room, "step_env")
    obs, st, rew, _, _ = step(jax.random.PRNGKey(0), st, {"agent_0": ZAP, "agent_1": ZAP, "agent_2": NOOP})
    assert np.asarray(st.zapped).tolist() == [False, True, False]
    assert np.asarray(st.zap_hits).tolist() == [1, 0, 0]
    assert int(st.zap_cooldown[1]) == 3  # agent 1 acted this step: its timer ran once, fire ignored
    absent = 1
    for t in range(2, 60):
        acts = {"agent_0": NOOP, "agent_1": FORWARD, "agent_2": NOOP}
        obs, st, rew, _, _ = step(jax.random.PRNGKey(t), st, acts)
        if bool(st.alive[1]):
            break
        absent += 1
        assert not np.asarray(obs["agent_1"]).any()
        assert float(rew["agent_1"]) == 0.0
        assert int(st.zap_cooldown[1]) == 3  # frozen while removed
    assert absent == ZAP_REMOVAL_FRAMES + 1 == 51
    assert bool(st.respawned[1]) and tuple(np.asarray(st.pos[1])) in {(4, c) for c in range(1, 6)}
    assert np.asarray(obs["agent_1"]).any()


def test_removed_agent_invisible_and_inactive(room):
    st = place(room, [(3, 3), (2, 3), (4, 5)], [N, S, N])
    step = jitted(room, "step_state")
    st = step(jax.random.PRNGKey(0), st, jnp.asarray([ZAP, NOOP, NOOP]))
    pos1 = np.asarray(st.pos[1])
    for t in range(5):
        st = step(jax.random.PRNGKey(t + 1), st, jnp.asarray([NOOP, FORWARD, ZAP]))
        assert np.array_equal(np.asarray(st.pos[1]), pos1)
        assert not bool(st.zap_fired[1])
    obs = room.obs_array(st)
    other = np.asarray(obs[0])[..., room.layer_names.index("other")]
    assert other.sum() == 1  # agent 0 sees agent 2 only; agent 1 is off the map


def test_zap_cooldown_ten(room):
    st = place(room, [(1, 1), (4, 1), (4, 5)], [N, N, N])
    states = run(room, st, [[ZAP, NOOP, NOOP]] * 23)
    fired = [t + 1 for t, s in enumerate(states) if bool(s.zap_fired[0])]
    assert fired == [1, 12, 23]
    ready = [float(room.ready_to_shoot(s)[0]) for s in states[:11]]
    # float32 (a count over the cooldown: a division and a clip) vs exact: 2 roundings of values <= 1.
    assert_fp32_close(ready, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0], 2, scale=1.0)


def test_respawn_waits_when_no_spawn_point_free():
    """Agent 1's removal time is up but agent 0 stands on the only spawn point: it retries next step."""
    spawn = jnp.asarray([(1, 1)], jnp.int32)
    seed = mp.seed_from_key(jax.random.PRNGKey(0))
    pos = jnp.asarray([(1, 1), (1, 2)], jnp.int32)
    args = dict(
        facing=jnp.asarray([E, W]),
        alive=jnp.asarray([True, False]),
        timer=jnp.asarray([0, 1]),
        was_removed=jnp.asarray([False, True]),
        spawn_points=spawn,
    )
    p, f, alive, timer = mp.respawn(seed, pos, **args)
    assert not bool(alive[1]) and int(timer[1]) == 0
    moved = pos.at[0].set(jnp.asarray([1, 3]))
    p, f, alive, timer = mp.respawn(seed, moved, **dict(args, timer=timer))
    assert bool(alive[1]) and tuple(np.asarray(p[1])) == (1, 1)


# ------------------------------------------------------------------------------------------------
# Dirt and apples (spec §1.3)
# ------------------------------------------------------------------------------------------------


def test_growth_probability_values():
    p = lambda k: float(apple_growth_probability(jnp.int32(k), 147))  # noqa: E731
    # float32 vs exact: 0.05 * (1 - d / 0.4), d = k / 147: 4 roundings of terms <= 0.05 * 1 (the cancellation
    # in 1 - d / 0.4 leaves the product small but its absolute error at the size of 0.05 * eps).
    assert_fp32_close(p(0), 0.05, 4, scale=0.05)
    assert_fp32_close(p(29), 0.05 * (1 - 29 / 147 / 0.4), 4, scale=0.05)  # d = 0.197: about half rate
    assert_fp32_close(p(58), 0.05 * (1 - 58 / 147 / 0.4), 4, scale=0.05)  # ~0.00068: the last growing count
    assert p(59) == 0.0 and p(79) == 0.0 and p(147) == 0.0


def test_dirt_never_spawns_before_step_51():
    """NOOP play on the real map: dirt stays 79 for 50 steps; step 51 adds one cell in about half the envs."""
    env = Cleanup()
    n = 256
    _, st = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), n))
    noop = jnp.zeros((n, 7), jnp.int32)

    def body(st, k):
        st = jax.vmap(env.step_state)(jax.random.split(k, n), st, noop)
        return st, jnp.sum(st.dirt, axis=(1, 2))

    _, dirt = jax.jit(lambda st: jax.lax.scan(body, st, jax.random.split(jax.random.PRNGKey(1), 52)))(st)
    dirt = np.asarray(dirt)  # [step-1, env]
    assert np.all(dirt[: DIRT_SPAWN_START_STEP - 1] == 79)
    added = dirt[DIRT_SPAWN_START_STEP - 1] - 79
    assert set(np.unique(added)) <= {0, 1}
    assert 0.4 < added.mean() < 0.6  # probability 0.5 per step


def test_apples_grow_under_standing_agents_and_are_eaten():
    """Zero pollution: 7 motionless agents on apple cells each eat ~0.05 apples per step (spec §1.3)."""
    env = Cleanup()
    cells = np.argwhere(env.apple_capable)[:7]
    _, st = env.reset(jax.random.PRNGKey(0))
    st = st.replace(pos=jnp.asarray(cells, jnp.int32), dirt=jnp.zeros_like(st.dirt))
    n, steps = 64, 40
    noop = jnp.zeros(7, jnp.int32)

    def body(st, k):
        st = jax.vmap(env.step_state, in_axes=(0, 0, None))(jax.random.split(k, n), st, noop)
        return st, st.ate

    st_b = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), st)
    _, ate = jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(jax.random.PRNGKey(2), steps)))(st_b)
    rate = float(np.asarray(ate).mean())
    # 17,920 agent-steps at p = 0.05: sd of the mean ~ 0.0016.
    assert abs(rate - 0.05) < 0.006
    assert np.asarray(ate).max() == 1


def test_eating_on_entry_rewards_the_mover():
    env = Cleanup()
    _, st = env.reset(jax.random.PRNGKey(0))
    apples = st.apples.at[17, 5].set(True)
    pos = np.asarray(st.pos).copy()
    pos[0] = (17, 4)
    st = st.replace(apples=apples, pos=jnp.asarray(pos), facing=st.facing.at[0].set(E))
    acts = {a: jnp.int32(FORWARD if a == "agent_0" else NOOP) for a in env.agents}
    _, st2, rew, _, _ = jitted(env, "step_env")(jax.random.PRNGKey(1), st, acts)
    assert float(rew["agent_0"]) == 1.0 and not bool(st2.apples[17, 5])
    assert int(st2.apples_total[0]) == 1


# ------------------------------------------------------------------------------------------------
# Observation, episode, render
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("facing", [N, E, S, W])
def test_observation_window_geometry(room, facing):
    """Self at window (9, 5); the cell one step ahead is window (8, 5); map cells outside are walls."""
    st = place(room, [(2, 3), (4, 1), (4, 5)], [facing, N, N])
    obs = np.asarray(room.obs_array(st))[0]
    names = room.layer_names
    assert obs[9, 5, names.index("self")] == 1 and obs[..., names.index("self")].sum() == 1
    ahead = np.array([(1, 3), (2, 4), (3, 3), (2, 2)][facing])
    offsets = mp.window_offsets()[facing]
    cell = np.array([2, 3]) + offsets[8, 5]
    assert np.array_equal(cell, ahead)
    # Wall layer equals the map (off-map counts as wall) over the whole window.
    walls = room.wall
    for r in range(11):
        for c in range(11):
            rr, cc = np.array([2, 3]) + offsets[r, c]
            inside = 0 <= rr < walls.shape[0] and 0 <= cc < walls.shape[1]
            assert obs[r, c, names.index("wall")] == (walls[rr, cc] if inside else 1)


def test_observation_other_agent_and_relative_facing(room):
    st = place(room, [(3, 3), (1, 3), (4, 5)], [E, S, N])
    obs = np.asarray(room.obs_array(st))[0]
    names = room.layer_names
    # Facing East, agent 1 two cells north is two cells to the left: window (9, 3).
    assert obs[9, 3, names.index("other")] == 1
    # Agent 1 faces South = right of the observer's East: "other_facing_right".
    assert obs[9, 3, names.index("other_facing_right")] == 1
    assert obs[9, 3, names.index("other_facing_up")] == 0


def test_episode_ends_at_max_steps_and_resets():
    env = envs_jax.make("cleanup", max_steps=3)
    obs, st = env.reset(jax.random.PRNGKey(0))
    acts = {a: jnp.int32(CLEAN) for a in env.agents}
    for t in range(3):
        obs, st, rew, dones, _ = env.step(jax.random.PRNGKey(t + 1), st, acts)
        assert bool(dones["__all__"]) == (t == 2)
    assert int(st.step) == 0 and int(st.dirt.sum()) == 79


def test_world_stats_and_render():
    env = envs_jax.make("cleanup")
    _, st = env.reset(jax.random.PRNGKey(0))
    stats = env.world_stats(st)
    assert {k: int(v) for k, v in stats.items()} == {"apples": 0, "dirt": 79, "avatars_alive": 7}
    img = np.asarray(env.render(st))
    assert img.shape == (168, 240, 3) and img.dtype == np.uint8
