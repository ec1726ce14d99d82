"""Overcooked option library: executor on scripted states, the contract defects of §5.1 (Defects 1-3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import overcooked as oc
from jaxopt_marl import macro
from jaxopt_marl.options import get_library
from jaxopt_marl.options import overcooked as ocopt
from jaxopt_marl.options.base import NO_PATH, NO_REASON, NOTHING_HELD, TARGET_ABSENT
from jaxopt_marl.records import OUTCOME_EFFECT_FAIL, OUTCOME_SUCCESS
from tests.helpers import drive_option, option_fixtures

ONION, PLATE = 4, 1  # V2 item bits: one onion (ingredient 0 count 1), an empty plate
FACE = {"N": 0, "S": 1, "E": 2, "W": 3}  # V2 facing codes


env, lib = option_fixtures(lambda: envs_jax.make("overcooked_aa"), lambda e: get_library("overcooked_aa", e))


def scripted(env, agents, pots=None):
    """AA state with agents ``{aid: ((row, col), facing, held_bits)}`` and pot onion counts ``{(r, c): n}``."""
    _, s = env.reset(jax.random.PRNGKey(0))
    a = s.core.agents
    x, y, d, inv = a.pos.x, a.pos.y, a.dir, a.inventory
    for aid, ((r, c), f, held) in agents.items():
        x, y = x.at[aid].set(c), y.at[aid].set(r)
        d, inv = d.at[aid].set(FACE[f]), inv.at[aid].set(held)
    grid = s.core.grid
    for (r, c), n in (pots or {}).items():
        grid = grid.at[r, c, 1].set(n << 2)
    core = s.core.replace(agents=a.replace(pos=a.pos.replace(x=x, y=y), dir=d, inventory=inv), grid=grid)
    return s.replace(core=core)


def slot(lib, name, target):
    """Instance-table index of option ``name`` at static target (row, col) (fixed classes only)."""
    o = lib.option_id(name)
    cls = lib.options[o].target_class
    k = [tuple(t) for t in lib.class_targets[cls].tolist()].index(tuple(target))
    return int(lib.slot_start[o] + k)


def run_option(env, lib, state, aid, name, target, max_steps=40):
    """Start and execute one option (until drained or timeout) with the other agent staying; returns (final state,
    actions, drained?)."""
    return drive_option(env, lib, state, aid, name, target, oc.STAY, max_steps=max_steps, seed=0)


def test_vocabulary_and_slots(lib):
    assert lib.option_names == (
        "pick_onion",
        "pick_dish",
        "place_in_pot",
        "start_cooking",
        "plate_soup",
        "deliver",
        "drop_held",
        "pick_from_counter",
        "wait",
    )
    assert lib.reasons == ("TargetAbsent", "NoPath", "NothingHeld")
    assert lib.feature_names == ("held", "tgt_pot_state", "tgt_item")
    assert lib.solo_only["start_cooking"] and not lib.solo_only["place_in_pot"]
    # AA: 2 onion, 2 plate, 3 x 2 pot, 2 serving, 3 + 3 counters, wait.
    assert lib.num_instances == 19
    assert lib.options[lib.option_id("place_in_pot")].render((2, 4)) == "place held item in pot @ (4, 2)"


def test_executor_walks_faces_and_interacts(env, lib):
    # agent_0 at (3, 2) facing S, empty hands; onion dispenser (1, 0) has one pose, (1, 1), facing W.
    s = scripted(env, {0: ((3, 2), "S", 0)})
    pre = lib.snapshot(s, 0, jnp.array([1, 0]))
    s, actions, drained = run_option(env, lib, s, 0, "pick_onion", (1, 0))
    assert drained
    assert oc.agent_positions(s)[0].tolist() == [1, 1]
    assert int(oc.agent_facing(s)[0]) == FACE["W"]
    assert actions[-1] == oc.INTERACT
    # shortest path (3,2)->(1,1) is 3 moves, then a turn to W (already W after a left move?) and INTERACT
    assert len(actions) <= 3 + 1 + 1
    assert int(oc.held_items(s)[0]) == oc.ITEM_ONION
    post = lib.snapshot(s, 0, jnp.array([1, 0]))
    assert bool(lib.effect(ocopt.PICK_ONION, pre, post))


def test_turn_in_place_when_at_pose(env, lib):
    # At the pose (2, 3) of pot (2, 4) but facing N: a move E into the pot only turns, then INTERACT.
    s = scripted(env, {0: ((2, 3), "N", ONION)})
    s, actions, drained = run_option(env, lib, s, 0, "place_in_pot", (2, 4))
    assert drained and actions == [oc.RIGHT, oc.INTERACT]
    assert int(oc.pot_view(s, env.layout_info.pots).onions[0]) == 1


def test_explicit_failures(env, lib):
    s = scripted(env, {})
    # agent_1 (right half) cannot reach the left onion dispenser or the left serving cell.
    _, r = lib.start(s, 1, lib.option_id("pick_onion"), jnp.array([1, 0]))
    assert int(r) == NO_PATH
    _, r = lib.start(s, 1, lib.option_id("deliver"), jnp.array([1, 3]))
    assert int(r) == NO_PATH
    _, r = lib.start(s, 1, lib.option_id("deliver"), jnp.array([1, 8]))
    assert int(r) == NO_REASON
    _, r = lib.start(s, 0, lib.option_id("drop_held"), jnp.array([0, 1]))
    assert int(r) == NOTHING_HELD
    _, r = lib.start(s, 0, lib.option_id("pick_from_counter"), jnp.array([-1, -1]))
    assert int(r) == TARGET_ABSENT
    ex, r = lib.start(s, 0, lib.option_id("wait"), jnp.array([-1, -1]))
    assert int(r) == NO_REASON and bool(ex.active)


def test_counter_instances_are_nearest_free_and_occupied(env, lib):
    s = scripted(env, {0: ((1, 1), "W", ONION)})
    inst = lib.instances(s, 0)
    d0 = lib.slot_start[lib.option_id("drop_held")]
    drops = {tuple(t) for t in np.asarray(inst.target[d0 : d0 + 3]).tolist()}
    assert {(0, 1), (1, 2)} <= drops  # the two counters next to (1, 1) (paper example: (1, 0), (2, 1) in x, y)
    p0 = lib.slot_start[lib.option_id("pick_from_counter")]
    assert not np.asarray(inst.valid[p0 : p0 + 3]).any()  # no item on any counter


def test_defect1_delta_form_pick_onion_while_holding_onion(env):
    # pick_onion while already holding an onion is a silent no-op: delta form says effect_fail, the
    # absolute-form draft says success (Defect 1).
    s = scripted(env, {0: ((1, 1), "W", ONION)})
    for effects, expected in (("delta", False), ("naive", True)):
        lib = get_library("overcooked_aa", env, effects=effects)
        pre = lib.snapshot(s, 0, jnp.array([1, 0]))
        s2, _, drained = run_option(env, lib, s, 0, "pick_onion", (1, 0))
        assert drained
        post = lib.snapshot(s2, 0, jnp.array([1, 0]))
        assert bool(lib.effect(ocopt.PICK_ONION, pre, post)) is expected


@pytest.mark.parametrize("effects,expected", [("delta", OUTCOME_EFFECT_FAIL), ("naive", OUTCOME_SUCCESS)])
def test_defect2_partner_placement_is_not_credited(env, effects, expected):
    # Pot (2, 4) holds 2 onions. agent_1 stands at its pose (2, 5) facing W with an onion and fills it at
    # once; agent_0 walks from (1, 1) with an onion, arrives at a full pot and its onion is refused. The pot
    # count still rose during agent_0's walk: only the private held transition keeps it from a forged success.
    lib = get_library("overcooked_aa", env, effects=effects)
    s = scripted(env, {0: ((1, 1), "N", ONION), 1: ((2, 5), "W", ONION)}, pots={(2, 4): 2})
    ms = macro.init(lib, env, jax.random.PRNGKey(0), jnp.array([True, True]), jnp.array(False))
    ms = ms.replace(env=s)
    choice = jnp.array([slot(lib, "place_in_pot", (2, 4))] * 2)
    inst, feats = macro.tables(lib, s)
    ms, rec = macro.begin(lib, ms, choice, inst, feats)
    assert not bool(rec.valid.any())
    adv = jax.jit(lambda m, k: macro.advance(lib, env, m, k))
    outcomes = {}
    for t in range(20):
        ms, rec = adv(ms, jax.random.PRNGKey(t))
        for a in np.flatnonzero(np.asarray(rec.valid)):
            outcomes[int(a)] = int(rec.outcome[a])
        if len(outcomes) == 2:
            break
    assert outcomes[1] == OUTCOME_SUCCESS  # the partner really placed
    assert int(oc.held_items(ms.env)[0]) == oc.ITEM_ONION  # agent_0 did nothing
    assert outcomes[0] == expected


def test_defect3_per_target_keeps_a_reachable_serving_station(env):
    s = scripted(env, {})
    deliver = None
    for nearest_only, ok_both in ((False, True), (True, False)):
        lib = get_library("overcooked_aa", env, nearest_only=nearest_only)
        deliver = lib.option_id("deliver")
        reachable = []
        for aid in (0, 1):
            inst = lib.instances(s, aid)
            live = lib.live_reason(s, aid, inst)
            m = (np.asarray(inst.opt) == deliver) & np.asarray(inst.valid)
            reachable.append(bool((np.asarray(live)[m] != NO_PATH).any()))
        assert all(reachable) is ok_both
    assert deliver is not None
