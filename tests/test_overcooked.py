"""Overcooked AA / FC on JaxMARL OvercookedV2 (envs_jax/overcooked.py; spec §3, §3.4).

Scripted action sequences with hand-derived expectations. Cells are (row, col); our actions are
0 up, 1 down, 2 right, 3 left, 4 stay, 5 interact; facings 0 N, 1 S, 2 E, 3 W.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax.overcooked import (
    DOWN,
    INTERACT,
    ITEM_NONE,
    ITEM_ONION,
    ITEM_PLATE,
    ITEM_SOUP,
    LEFT,
    POT_COOKING,
    POT_EMPTY,
    POT_FILLED,
    POT_READY,
    RIGHT,
    STAY,
    UP,
    Overcooked,
)

# V2 item bits (jaxmarl overcooked_v2/common.py DynamicObject): plate 1, cooked 2, one onion 4.
ONION, PLATE = 4, 1
N, S, E, W = 0, 1, 2, 3

AA = Overcooked("aa")
FC = Overcooked("fc")
KEY = jax.random.PRNGKey(0)


def _put(state, i, cell, facing, held=None):
    """Teleports agent i to cell with facing (and optionally sets its V2 inventory bits)."""
    ag = state.core.agents
    pos = ag.pos.replace(y=ag.pos.y.at[i].set(cell[0]), x=ag.pos.x.at[i].set(cell[1]))
    ag = ag.replace(pos=pos, dir=ag.dir.at[i].set(facing))
    if held is not None:
        ag = ag.replace(inventory=ag.inventory.at[i].set(held))
    return state.replace(core=state.core.replace(agents=ag))


def _step(env, state, a0, a1=STAY):
    return env.step(KEY, state, {"agent_0": jnp.int32(a0), "agent_1": jnp.int32(a1)})


def _run(env, state, actions0):
    """Steps agent_0 through actions0 (agent_1 stays); returns final state and per-step rewards."""
    rewards = []
    for a in actions0:
        _, state, r, _, _ = _step(env, state, a)
        rewards.append((float(r["agent_0"]), float(r["agent_1"])))
    return state, rewards


# ---- layouts (spec §3.1) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, pots, onions, plates, serving, starts, floor",
    [
        (
            AA,
            [(2, 4), (3, 4)],
            [(1, 0), (1, 5)],
            [(4, 3), (4, 5)],
            [(1, 3), (1, 8)],
            [(3, 2), (3, 5)],
            # left kitchen (1,1),(2,1..3),(3,1..3); right kitchen (1,7),(2,5..7),(3,5..7)
            {
                (1, 1),
                (2, 1),
                (2, 2),
                (2, 3),
                (3, 1),
                (3, 2),
                (3, 3),
                (1, 7),
                (2, 5),
                (2, 6),
                (2, 7),
                (3, 5),
                (3, 6),
                (3, 7),
            },
        ),
        (
            FC,
            # agent_0 on the left (onion/plate) side as in spec §3.1; V2's own order is reversed.
            [(0, 3), (1, 4)],
            [(1, 0), (2, 0)],
            [(3, 0)],
            [(4, 3)],
            [(2, 1), (1, 3)],
            {(1, 1), (2, 1), (3, 1), (1, 3), (2, 3), (3, 3)},
        ),
    ],
)
def test_layout_facts(env, pots, onions, plates, serving, starts, floor):
    info = env.layout_info
    assert [tuple(c) for c in info.pots] == pots
    assert [tuple(c) for c in info.onion_dispensers] == onions
    assert [tuple(c) for c in info.plate_dispensers] == plates
    assert [tuple(c) for c in info.serving] == serving
    assert [tuple(c) for c in info.start_cells] == starts
    assert {tuple(c) for c in np.argwhere(info.walkable)} == floor
    _, state = env.reset(KEY)
    assert env.agent_positions(state).tolist() == [list(s) for s in starts]
    assert env.held_items(state).tolist() == [ITEM_NONE, ITEM_NONE]
    assert env.pots(state).phase.tolist() == [POT_EMPTY] * len(pots)
    assert {k: int(v) for k, v in env.world_stats(state).items()} == {
        "deliveries": 0,
        "onions_in_pots": 0,
        "soups_cooking": 0,
        "soups_ready": 0,
        "items_on_counters": 0,
    }
    assert env.action_space("agent_0").n == 6
    assert env.observation_space().shape == (info.height, info.width, 30)


def test_reset_facing_is_random_and_observation_matches_v2_encoder():
    facings = set()
    for seed in range(12):
        obs, state = AA.reset(jax.random.PRNGKey(seed))
        facings.update(AA.agent_facing(state).tolist())
        full = AA.get_obs(state)  # V2's encoder on the re-faced state
        for a in AA.agents:
            np.testing.assert_array_equal(obs[a], full[a])
    assert facings == {N, S, E, W}
    _, state = Overcooked("fc", random_facing=False).reset(KEY)
    assert state.core.agents.dir.tolist() == [N, N]  # V2's all-north start


def test_bad_config_raises():
    with pytest.raises(ValueError, match="valid layouts: aa, fc"):
        Overcooked("cramped_room")
    for bad in (0, -5, 2.5, True, "400"):
        with pytest.raises(ValueError, match=repr(bad).replace(".", r"\.")):
            Overcooked("aa", max_steps=bad)
    assert set(envs_jax.config_keys("overcooked_aa")) == {"max_steps", "random_facing"}
    assert envs_jax.make("overcooked_fc", max_steps=7).max_steps == 7


def test_move_actions_set_facing_and_collisions_both_stay():
    _, s0 = AA.reset(KEY)
    # Every move action d leaves the agent facing d (blocked moves just turn): agent_0 at (2,2).
    s = _put(s0, 0, (2, 2), N)
    for a, cell in [(UP, (2, 2)), (DOWN, (3, 2)), (RIGHT, (3, 3)), (LEFT, (3, 2))]:
        _, s, *_ = _step(AA, s, a)
        assert AA.agent_facing(s)[0] == a and tuple(AA.agent_positions(s)[0].tolist()) == cell
    # Both target (2,2): both stay, both turned.
    s = _put(_put(s0, 0, (2, 1), N), 1, (2, 3), N)
    _, s, *_ = _step(AA, s, RIGHT, LEFT)
    assert AA.agent_positions(s).tolist() == [[2, 1], [2, 3]] and AA.agent_facing(s).tolist() == [E, W]
    # Swap (2,1) <-> (2,2): both stay.
    s = _put(_put(s0, 0, (2, 1), N), 1, (2, 2), N)
    _, s, *_ = _step(AA, s, RIGHT, LEFT)
    assert AA.agent_positions(s).tolist() == [[2, 1], [2, 2]]
    # Into the cell of an agent that stays: both stay.
    s = _put(_put(s0, 0, (2, 1), N), 1, (2, 2), N)
    _, s, *_ = _step(AA, s, RIGHT, STAY)
    assert AA.agent_positions(s).tolist() == [[2, 1], [2, 2]]
    # Following into a cell vacated this step is allowed.
    s = _put(_put(s0, 0, (2, 1), N), 1, (2, 2), N)
    _, s, *_ = _step(AA, s, RIGHT, RIGHT)
    assert AA.agent_positions(s).tolist() == [[2, 2], [2, 3]]


# ---- cooking (spec §3.4) ---------------------------------------------------------------------------


def _pot0(state):
    p = AA.pots(state)  # pot 0 = (2,4), faced from (2,3) looking E
    return int(p.onions[0]), int(p.timer[0]), int(p.phase[0])


def test_placing_onions_never_starts_cooking_and_fourth_is_refused():
    _, s = AA.reset(KEY)
    for n in (1, 2, 3):
        s = _put(s, 0, (2, 3), E, held=ONION)
        _, s, *_ = _step(AA, s, INTERACT)
        assert _pot0(s) == (n, 0, POT_FILLED) and AA.held_items(s)[0] == ITEM_NONE
    for _ in range(5):  # no auto-start, however long we wait
        _, s, *_ = _step(AA, s, STAY)
    assert _pot0(s) == (3, 0, POT_FILLED)
    # 4th onion refused: pot unchanged, the hand keeps the onion (and holding it does not start the pot).
    s = _put(s, 0, (2, 3), E, held=ONION)
    _, s, *_ = _step(AA, s, INTERACT)
    assert _pot0(s) == (3, 0, POT_FILLED) and AA.held_items(s)[0] == ITEM_ONION
    assert int(AA.world_stats(s)["onions_in_pots"]) == 3


def test_start_needs_empty_hands_and_a_non_empty_pot():
    _, s = AA.reset(KEY)
    # Empty hands at the empty pot (3,4), faced from (3,3): nothing.
    s = _put(s, 0, (3, 3), E, held=0)
    _, s, *_ = _step(AA, s, INTERACT)
    assert AA.pots(s).phase.tolist() == [POT_EMPTY, POT_EMPTY]
    # One onion into pot (2,4), then a start attempt holding a plate: nothing.
    s = _put(s, 0, (2, 3), E, held=ONION)
    _, s, *_ = _step(AA, s, INTERACT)
    s = _put(s, 0, (2, 3), E, held=PLATE)
    _, s, *_ = _step(AA, s, INTERACT)
    assert _pot0(s) == (1, 0, POT_FILLED) and AA.held_items(s)[0] == ITEM_PLATE
    # Empty hands: a 1-onion pot starts cooking (spec §3.4: 1-3 onions).
    s = _put(s, 0, (2, 3), E, held=0)
    _, s, *_ = _step(AA, s, INTERACT)
    assert _pot0(s) == (1, 19, POT_COOKING)
    # A cooking pot takes no onion.
    s = _put(s, 0, (2, 3), E, held=ONION)
    _, s, *_ = _step(AA, s, INTERACT)
    assert _pot0(s)[0] == 1 and AA.held_items(s)[0] == ITEM_ONION


def test_cook_timer_ready_after_start_step_plus_19_pickup_from_plus_20():
    _, s = AA.reset(KEY)
    for _ in range(3):
        s = _put(s, 0, (2, 3), E, held=ONION)
        _, s, *_ = _step(AA, s, INTERACT)
    s = _put(s, 0, (2, 3), E, held=0)
    _, s, *_ = _step(AA, s, INTERACT)  # step t: timer 20, minus the end-of-step tick -> 19
    assert _pot0(s) == (3, 19, POT_COOKING)
    for k in range(1, 19):  # after step t+k the timer is 19-k
        _, s, *_ = _step(AA, s, STAY)
        assert _pot0(s) == (3, 19 - k, POT_COOKING)
    s = _put(s, 0, (2, 3), E, held=PLATE)
    _, s, *_ = _step(AA, s, INTERACT)  # step t+19: the interact sees timer 1 -> fails; tick -> ready
    assert _pot0(s) == (3, 0, POT_READY) and AA.held_items(s)[0] == ITEM_PLATE
    assert int(AA.world_stats(s)["soups_ready"]) == 1
    _, s, *_ = _step(AA, s, INTERACT)  # step t+20: soup taken, pot empty
    assert _pot0(s) == (0, 0, POT_EMPTY)
    assert AA.held_items(s)[0] == ITEM_SOUP and AA.held_soup_onions(s)[0] == 3


# ---- scoring ---------------------------------------------------------------------------------------

# agent_0 in AA's left kitchen, from its start (3,2). Onion dispenser (1,0) faced from (1,1) looking W;
# pot (2,4) from (2,3) looking E; plate dispenser (4,3) from (3,3) looking S; serving (1,3) from (2,3) N.
FIRST_TRIP = [UP, LEFT, UP, LEFT, INTERACT, DOWN, RIGHT, RIGHT, RIGHT, INTERACT]  # (3,2) -> onion -> pot
TRIP = [LEFT, LEFT, UP, LEFT, INTERACT, DOWN, RIGHT, RIGHT, RIGHT, INTERACT]  # (2,3) -> onion -> pot
# steps 1-30 fill the pot; step 31 = t starts it; 32 D (3,3); 33 D turn S; 34 take plate; 35 U (2,3);
# 36 R turn E; 37-50 wait (14 steps); 51 = t+20 take soup; 52 U turn N; 53 deliver.
SERVE = [INTERACT, DOWN, DOWN, INTERACT, UP, RIGHT] + [STAY] * 14 + [INTERACT, UP, INTERACT]
DELIVERY_SCRIPT = FIRST_TRIP + TRIP + TRIP + SERVE
DELIVERY_STEP = 53


def test_scripted_delivery_scores_20_for_both_agents():
    _, s = AA.reset(KEY)
    s, r = _run(AA, s, DELIVERY_SCRIPT[:30])
    assert _pot0(s) == (3, 0, POT_FILLED)
    s, r2 = _run(AA, s, DELIVERY_SCRIPT[30:-1])
    assert AA.held_soup_onions(s).tolist() == [3, 0] and int(AA.world_stats(s)["deliveries"]) == 0
    _, s, rew, dones, infos = _step(AA, s, DELIVERY_SCRIPT[-1])
    assert len(DELIVERY_SCRIPT) == DELIVERY_STEP
    assert all(x == (0.0, 0.0) for x in r + r2)
    assert (float(rew["agent_0"]), float(rew["agent_1"])) == (20.0, 20.0)  # shared, unshaped
    assert int(AA.world_stats(s)["deliveries"]) == 1 and int(infos["deliveries"]) == 1
    assert AA.held_items(s).tolist() == [ITEM_NONE, ITEM_NONE] and int(s.step) == DELIVERY_STEP


def test_one_onion_soup_delivered_scores_zero():
    _, s = AA.reset(KEY)
    s = _put(s, 0, (2, 3), E, held=ONION)
    s, _ = _run(AA, s, [INTERACT, INTERACT])  # place 1 onion; start at step t = 2
    s = _put(s, 0, (2, 3), E, held=PLATE)
    s, _ = _run(AA, s, [STAY] * 19 + [INTERACT])  # steps 3..21 wait, step 22 = t+20 takes the soup
    assert AA.held_items(s)[0] == ITEM_SOUP and AA.held_soup_onions(s)[0] == 1
    s, r = _run(AA, s, [UP, INTERACT])  # turn N to serving (1,3), deliver
    assert r[-1] == (0.0, 0.0)  # 0, not negative (negative_rewards=False)
    assert AA.held_items(s)[0] == ITEM_NONE and int(AA.world_stats(s)["deliveries"]) == 0


def test_fc_hand_over_through_middle_counter():
    # agent_0 (left) takes an onion at (1,0) from (1,1) facing W, puts it on counter (1,2) facing E;
    # agent_1 (right, at (1,3)) faces W and picks it up.
    _, s = FC.reset(KEY)
    s = _put(_put(s, 0, (1, 1), W, held=0), 1, (1, 3), W, held=0)
    counters = [tuple(c) for c in FC.layout_info.counters]
    k = counters.index((1, 2))
    for a0, a1, on_counter, held in [
        (INTERACT, STAY, ITEM_NONE, [ITEM_ONION, ITEM_NONE]),
        (RIGHT, STAY, ITEM_NONE, [ITEM_ONION, ITEM_NONE]),  # (1,2) is a counter: just turn E
        (INTERACT, STAY, ITEM_ONION, [ITEM_NONE, ITEM_NONE]),
        (STAY, INTERACT, ITEM_NONE, [ITEM_NONE, ITEM_ONION]),
    ]:
        _, s, *_ = _step(FC, s, a0, a1)
        assert int(FC.counter_items(s)[k]) == on_counter and FC.held_items(s).tolist() == held
    assert FC.agent_positions(s).tolist() == [[1, 1], [1, 3]]


# ---- episode end -----------------------------------------------------------------------------------


def test_episode_ends_at_step_400_and_counter_resets():
    _, s = AA.reset(KEY)
    s, _ = _run(AA, s, DELIVERY_SCRIPT)
    stays = jnp.full((400 - DELIVERY_STEP - 1,), STAY, dtype=jnp.int32)

    def body(s, a):
        _, s, _, d, _ = AA.step(KEY, s, {"agent_0": a, "agent_1": a})
        return s, d["__all__"]

    s, dones = jax.lax.scan(body, s, stays)  # steps 54..399
    assert not bool(dones.any()) and int(s.step) == 399 and int(AA.world_stats(s)["deliveries"]) == 1
    _, s, _, dones, infos = _step(AA, s, STAY)  # step 400
    assert bool(dones["__all__"]) and bool(dones["agent_0"]) and bool(dones["agent_1"])
    assert int(infos["deliveries"]) == 1  # the episode total, reported on the final step
    assert int(s.step) == 0 and int(AA.world_stats(s)["deliveries"]) == 0  # auto-reset
    assert AA.agent_positions(s).tolist() == [[3, 2], [3, 5]]


# ---- batching and rendering ------------------------------------------------------------------------


def test_vmapped_random_rollout_and_render():
    n, steps = 4, 30
    obs, s = jax.vmap(FC.reset)(jax.random.split(KEY, n))

    def body(s, key):
        ka, ks = jax.random.split(key)
        acts = jax.random.randint(ka, (2, n), 0, 6)
        actions = {"agent_0": acts[0], "agent_1": acts[1]}
        _, s, r, _, _ = jax.vmap(FC.step)(jax.random.split(ks, n), s, actions)
        return s, r["agent_0"]

    s, r = jax.jit(lambda s: jax.lax.scan(body, s, jax.random.split(KEY, steps)))(s)
    assert r.shape == (steps, n)
    stats = jax.vmap(FC.world_stats)(s)
    assert all(v.shape == (n,) and v.dtype == jnp.int32 for v in stats.values())
    assert jax.vmap(FC.pots)(s).onions.shape == (n, 2)
    img = jax.jit(FC.render)(jax.tree.map(lambda x: x[0], s))
    assert img.shape == (5 * 24, 5 * 24, 3) and img.dtype == jnp.uint8
    # agent_0 starts at (2,1): the centre of its cell has its colour (empty hands).
    _, s0 = FC.reset(KEY)
    img0 = np.asarray(FC.render(s0))
    from envs_jax.overcooked import C_AGENT_0, C_COUNTER, PALETTE

    assert tuple(img0[2 * 24 + 12, 1 * 24 + 12]) == tuple(np.asarray(PALETTE[C_AGENT_0]))
    assert tuple(img0[0, 0]) == tuple(np.asarray(PALETTE[C_COUNTER]))
