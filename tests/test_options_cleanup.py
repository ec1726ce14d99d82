"""Clean Up option library: executor on scripted tiny maps (relative moves, beam poses, cooldown), explicit
failures, instantiation (cap, visibility), delta-form effects bound to the acting agent, and a small burn-in."""

import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import meltingpot as mp
from envs_jax.cleanup import Cleanup
from jaxopt_marl import burnin
from jaxopt_marl.options import cleanup as cuopt
from jaxopt_marl.options import get_library
from jaxopt_marl.options.base import NO_PATH, NO_REASON, TARGET_ABSENT
from jaxopt_marl.options.meltingpot_common import TARGET_CAP, WAIT_STEPS
from tests.helpers import cell_grid, option_fixtures, run_option, scripted_state

N, E, S, W = mp.NORTH, mp.EAST, mp.SOUTH, mp.WEST

# River row 1 dirty (F), row 2 clean river (H), bank rows 3-5, orchard rows 6-7 (no apples at reset).
MAP = """
WWWWWWWWWWW
WFFFFFFFFFW
WHHHHHHHHHW
W P       W
W         W
W       P W
WBBBBBBBBBW
WBBBBBBBBBW
WWWWWWWWWWW
"""
# A wall splits the map: nothing on the right is reachable from the left.
WALLED = """
WWWWWWWWW
WFFFWHHHW
W   W   W
W P W P W
WBBBWBBBW
WWWWWWWWW
"""


env, lib = option_fixtures(lambda: Cleanup(num_agents=2, ascii_map=MAP), cuopt.make_library)


def scripted(env, agents, apples=(), dirt=None, cooldown=(0, 0)):
    """State with agents ``{aid: ((row, col), facing)}``, apples at the given cells, optional dirt cells (default:
    the map's) and clean cooldowns."""
    s = scripted_state(env, agents, apples, clean_cooldown=jnp.asarray(cooldown, jnp.int32))
    return s if dirt is None else s.replace(dirt=cell_grid(env, dirt))


def test_vocabulary_and_labels(lib):
    assert lib.option_names == ("eat_apple", "clean_dirt", "go_to_river", "go_to_orchard", "wait")
    assert lib.feature_names == ("tgt_apple", "tgt_dirty", "clean_ready", "region", "dirt_level")
    assert lib.read_sets["clean_dirt"] == ("tgt_dirty", "clean_ready", "region")
    assert not any(lib.solo_only.values())
    assert lib.num_instances == 2 * TARGET_CAP + 3
    # the paper's menu example: x = column, y = row
    assert lib.label(cuopt.EAT_APPLE, (11, 2)) == "eat apple @ (2, 11)"
    assert lib.label(cuopt.CLEAN_DIRT, (5, 4)) == "clean dirt @ (4, 5)"
    assert lib.label(cuopt.GO_TO_RIVER, (-1, -1)) == "go to the river"
    assert lib.label(cuopt.GO_TO_ORCHARD, (-1, -1)) == "go to the grass/orchard"
    assert get_library("cleanup").game == "cleanup"


# Relative move that steps north for each facing: N -> FORWARD, E -> STEP_LEFT, S -> BACKWARD, W -> STEP_RIGHT.
NORTH_MOVE = {N: mp.FORWARD, E: mp.STEP_LEFT, S: mp.BACKWARD, W: mp.STEP_RIGHT}


@pytest.mark.parametrize("facing", [N, E, S, W])
def test_walk_onto_apple_with_relative_moves(env, lib, facing):
    # (5, 4) -> apple (3, 7): 2 north + 3 east = 5 moves; ties N < E: north first.
    s = scripted(env, {0: ((5, 4), facing), 1: ((7, 1), N)}, apples=[(3, 7)])
    s, actions, ok = run_option(env, lib, s, 0, "eat_apple", (3, 7))
    assert len(actions) == 5 and all(a in (mp.FORWARD, mp.BACKWARD, mp.STEP_LEFT, mp.STEP_RIGHT) for a in actions)
    assert actions[0] == NORTH_MOVE[facing]
    assert np.asarray(s.pos[0]).tolist() == [3, 7]
    assert int(s.facing[0]) == facing  # moves never turn
    assert int(s.apples_total[0]) == 1 and not bool(s.apples[3, 7])
    assert ok


def test_clean_dirt_turns_and_fires(env, lib):
    # Agent at (3, 4) facing S, target (1, 4). Nearest firing pose (2, 4) (1 step north: BACKWARD). There it
    # faces away from the target (S), so one TURN_RIGHT (-> W, target on its right: segment step 0), FIRE.
    s = scripted(env, {0: ((3, 4), S), 1: ((7, 9), N)})
    assert bool(s.dirt[1, 4])
    s, actions, ok = run_option(env, lib, s, 0, "clean_dirt", (1, 4))
    assert actions == [mp.BACKWARD, mp.TURN_RIGHT, mp.FIRE_CLEAN]
    assert not bool(s.dirt[1, 4]) and bool(s.dirt[1, 3]) and bool(s.dirt[1, 5])
    assert int(s.cleaned[0]) == 1  # the right segment stops at the (dirty) target
    assert ok


def test_clean_dirt_waits_for_cooldown(env, lib):
    # At the pose (2, 4) facing the target: cooldown 2 -> NOOP, NOOP, FIRE (spec §1.3: fires again at t+3).
    s = scripted(env, {0: ((2, 4), N), 1: ((7, 9), N)}, cooldown=(2, 0))
    s, actions, ok = run_option(env, lib, s, 0, "clean_dirt", (1, 4))
    assert actions == [mp.NOOP, mp.NOOP, mp.FIRE_CLEAN]
    assert not bool(s.dirt[1, 4]) and ok


def test_explicit_failures():
    env = Cleanup(num_agents=2, ascii_map=WALLED)
    lib = cuopt.make_library(env)
    s = scripted(env, {0: ((3, 2), N), 1: ((3, 6), N)}, apples=[(4, 6), (4, 1)], dirt=[(1, 1), (1, 6)])
    start = lambda aid, name, tg: int(lib.start(s, aid, lib.option_id(name), jnp.asarray(tg, jnp.int32))[1])
    assert start(0, "eat_apple", (4, 6)) == NO_PATH  # behind the wall
    assert start(0, "clean_dirt", (1, 6)) == NO_PATH
    assert start(0, "eat_apple", (4, 1)) == NO_REASON
    assert start(0, "clean_dirt", (1, 1)) == NO_REASON
    assert start(0, "eat_apple", (4, 2)) == TARGET_ABSENT  # no apple there
    assert start(0, "clean_dirt", (1, 2)) == TARGET_ABSENT  # clean cell
    assert start(0, "eat_apple", (-1, -1)) == TARGET_ABSENT
    assert start(0, "go_to_river", (-1, -1)) == NO_REASON
    assert start(0, "wait", (-1, -1)) == NO_REASON
    # live re-check over the instance table agrees with start
    inst = lib.instances(s, 0)
    live = np.asarray(lib.live_reason(s, 0, inst))
    for i in np.flatnonzero(np.asarray(inst.valid)):
        assert live[i] == start(0, lib.option_names[int(inst.opt[i])], np.asarray(inst.target[i]))


def test_instances_cap_and_visibility(env, lib):
    orchard = [(r, c) for r in (6, 7) for c in range(1, 10)]
    e0 = lib.slot_start[cuopt.EAT_APPLE]
    c0 = lib.slot_start[cuopt.CLEAN_DIRT]
    # Facing N at (4, 5): the orchard (2-3 rows behind) is out of view; the dirty row 1 is in view.
    s = scripted(env, {0: ((4, 5), N), 1: ((3, 1), N)}, apples=orchard)
    inst = lib.instances(s, 0)
    assert not np.asarray(inst.valid[e0 : e0 + TARGET_CAP]).any()
    # dirt by path distance 3, 4, 4, 5, 5, 6; ties row-major
    assert np.asarray(inst.target[c0 : c0 + TARGET_CAP]).tolist() == [[1, 5], [1, 4], [1, 6], [1, 3], [1, 7], [1, 2]]
    # Facing S: 18 visible apples, capped at the 6 nearest: distance 2, 3, 3, 3, 4, 4 (ties row-major).
    s = scripted(env, {0: ((4, 5), S), 1: ((3, 1), N)}, apples=orchard)
    inst = lib.instances(s, 0)
    assert np.asarray(inst.valid[e0 : e0 + TARGET_CAP]).all()
    assert np.asarray(inst.target[e0 : e0 + TARGET_CAP]).tolist() == [[6, 5], [6, 4], [6, 6], [7, 5], [6, 3], [6, 7]]
    assert not np.asarray(inst.valid[c0 : c0 + TARGET_CAP]).any()  # the river is behind (row 3 only)
    f = np.asarray(lib.features(s, 0, inst))
    assert (f[e0 : e0 + TARGET_CAP, cuopt.F_TGT_APPLE] == cuopt.V_YES).all()
    assert (f[:, cuopt.F_REGION] == cuopt.R_BANK).all()
    # 9 dirty (row 1) of 18 dirt-capable cells: d = 0.5 >= 0.4 -> dirt_level high
    assert (f[:, cuopt.F_DIRT_LEVEL] == 2).all()


def test_apple_eaten_by_partner_is_not_credited(env, lib):
    # Partner at (7, 5) steps north onto the apple (6, 5) in the first step; agent 0 walks from (4, 5).
    s = scripted(env, {0: ((4, 5), S), 1: ((7, 5), N)}, apples=[(6, 5)])
    s, actions, ok = run_option(env, lib, s, 0, "eat_apple", (6, 5), partner=[mp.FORWARD])
    assert int(s.apples_total[1]) == 1 and int(s.apples_total[0]) == 0
    assert len(actions) == 2 and actions[-1] == mp.NOOP  # the target vanished: abandon
    assert not ok


def test_target_cleaned_by_partner_is_effect_fail(env, lib):
    # Partner at (2, 5) facing N cleans (1, 5) at once; agent 0 (from (4, 5)) then abandons: effect_fail.
    s = scripted(env, {0: ((4, 5), N), 1: ((2, 5), N)})
    s, actions, ok = run_option(env, lib, s, 0, "clean_dirt", (1, 5), partner=[mp.FIRE_CLEAN])
    assert int(s.cleaned_total[1]) >= 1 and int(s.cleaned_total[0]) == 0
    assert not bool(s.dirt[1, 5]) and not ok


def test_region_moves(env, lib):
    # go to the orchard from (4, 5) facing N: 2 moves south (BACKWARD), then face south (2 turns right).
    s = scripted(env, {0: ((4, 5), N), 1: ((3, 1), N)})
    s2, actions, ok = run_option(env, lib, s, 0, "go_to_orchard", (-1, -1))
    assert actions == [mp.BACKWARD, mp.BACKWARD, mp.TURN_RIGHT, mp.TURN_RIGHT] and ok
    assert np.asarray(s2.pos[0]).tolist() == [6, 5] and int(s2.facing[0]) == S
    # already in the orchard -> the option ends at once and the effect fails
    _, actions, ok = run_option(env, lib, s2, 0, "go_to_orchard", (-1, -1))
    assert len(actions) == 1 and not ok
    # go to the river facing N: 2 forward moves into row 2 (the first dirt-capable row from the bank)
    _, actions, ok = run_option(env, lib, s, 0, "go_to_river", (-1, -1))
    assert actions == [mp.FORWARD, mp.FORWARD] and ok


def test_wait_and_removed_agent(env, lib):
    s = scripted(env, {0: ((4, 5), N), 1: ((3, 1), N)}, apples=[(6, 5)])
    _, actions, ok = run_option(env, lib, s, 0, "wait", (-1, -1))
    assert actions == [mp.NOOP] * WAIT_STEPS and ok
    # an agent removed by a zap: its running option ends at its next step with a NOOP, effect_fail
    ex, _ = lib.start(s, 0, cuopt.EAT_APPLE, jnp.array([6, 5]))
    gone = s.replace(alive=s.alive.at[0].set(False))
    a, drained, _ = lib.act(gone, 0, ex)
    assert int(a) == mp.NOOP and bool(drained)
    assert not bool(
        lib.effect(cuopt.EAT_APPLE, lib.snapshot(s, 0, jnp.array([6, 5])), lib.snapshot(gone, 0, jnp.array([6, 5])))
    )
    assert not bool(lib.present(gone)[0])


def test_burnin_records_and_guards():
    env = envs_jax.make("cleanup")
    lib = get_library("cleanup", env)
    res = burnin.run_burnin(lib, env, 7, 7, seed=0, chunk=14)
    c = res.codes
    assert res.decisions == c.num_records > 500
    assert (c.aid[c.solo] == c.ep[c.solo] % 7).all()
    names = lib.option_names
    for o in range(len(names)):
        assert (c.opt == o).sum() > 0, names[o]
        assert (c.outcome[c.opt == o] == 0).any(), names[o]  # every option succeeds sometimes
    assert burnin.to_table(lib, c).num_rows == c.num_records
    gs = {(g.opt, g.channel, tuple(g.when)) for g in burnin.synthesize(lib, c)}
    assert ("go_to_river", "inferred", (("region", "river"),)) in gs
    assert ("go_to_orchard", "inferred", (("region", "orchard"),)) in gs
    # the certificate keeps executable options on the menu
    assert ("eat_apple", "inferred", (("tgt_apple", "yes"),)) not in gs
    assert ("clean_dirt", "inferred", (("tgt_dirty", "yes"),)) not in gs
