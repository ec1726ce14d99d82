"""Commons Harvest option library: walk-onto apples with relative moves, patch region moves with the arrival
turn, explicit failures, instantiation (cap, visibility, one instance per patch), features, delta-form effects,
and a small burn-in with its plausible guard."""

import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import meltingpot as mp
from envs_jax.harvest import CommonsHarvest
from jaxopt_marl import burnin
from jaxopt_marl.options import get_library
from jaxopt_marl.options import harvest as hvopt
from jaxopt_marl.options.base import NO_PATH, NO_REASON, TARGET_ABSENT
from jaxopt_marl.options.meltingpot_common import TARGET_CAP
from tests.helpers import option_fixtures, run_option
from tests.helpers import scripted_state as scripted  # apples=None: the map's

N, E, S, W = mp.NORTH, mp.EAST, mp.SOUTH, mp.WEST

# Patch 0: the top-left corner (6 cells); patch 1: a diamond around (3, 6) (5 cells).
MAP = """
WWWWWWWWWW
WAAA     W
WAA   A  W
WA   AAA W
W     A  W
W        W
W Q   Q  W
WPPPPPPPPW
WWWWWWWWWW
"""
# The right half is walled off (patch 1 lies behind the wall).
WALLED = """
WWWWWWWWW
WAA W A W
WA  WAAAW
W   W A W
WQ  W  QW
WPPPWPPPW
WWWWWWWWW
"""


env, lib = option_fixtures(lambda: CommonsHarvest(num_agents=2, ascii_map=MAP), hvopt.make_library)


def test_vocabulary_and_patch_targets(lib):
    assert lib.option_names == ("eat_apple", "go_to_patch", "wait")
    assert lib.feature_names == ("tgt_apple", "in_tgt_patch", "tgt_patch_apples")
    assert lib.num_instances == TARGET_CAP + 2 + 1
    # patch 0 centroid (5/3, 5/3) -> nearest cell (2, 2); patch 1 centroid (3, 6) itself
    assert lib.patch_target.tolist() == [[2, 2], [3, 6]]
    assert lib.label(hvopt.GO_TO_PATCH, (3, 6)) == "go to patch @ (6, 3)"
    real = get_library("harvest")
    assert real.game == "harvest" and real.num_patches == 6 and real.num_instances == TARGET_CAP + 6 + 1
    assert [3, 8] in real.patch_target.tolist() and [8, 20] in real.patch_target.tolist()  # diamond centres


NORTH_MOVE = {N: mp.FORWARD, E: mp.STEP_LEFT, S: mp.BACKWARD, W: mp.STEP_RIGHT}


@pytest.mark.parametrize("facing", [N, E, S, W])
def test_walk_onto_apple_with_relative_moves(env, lib, facing):
    # (6, 2) -> apple (3, 5): 3 north + 3 east = 6 moves, north first (ties N < E); facing never changes.
    s = scripted(env, {0: ((6, 2), facing), 1: ((7, 8), N)}, apples=[(3, 5)])
    s, actions, ok = run_option(env, lib, s, 0, "eat_apple", (3, 5))
    assert len(actions) == 6 and actions[0] == NORTH_MOVE[facing]
    assert all(a in (mp.FORWARD, mp.BACKWARD, mp.STEP_LEFT, mp.STEP_RIGHT) for a in actions)
    assert np.asarray(s.pos[0]).tolist() == [3, 5] and int(s.facing[0]) == facing
    assert int(s.apples_total[0]) == 1 and ok


def test_go_to_patch_turns_toward_the_centroid(env, lib):
    # (6, 6) facing S -> nearest patch-1 cell (4, 6): 2 moves north (BACKWARD), then face the centroid (N): two
    # right turns; the second drains.
    s = scripted(env, {0: ((6, 6), S), 1: ((7, 1), N)})
    s2, actions, ok = run_option(env, lib, s, 0, "go_to_patch", (3, 6))
    assert actions == [mp.BACKWARD, mp.BACKWARD, mp.TURN_RIGHT, mp.TURN_RIGHT] and ok
    assert np.asarray(s2.pos[0]).tolist() == [4, 6] and int(s2.facing[0]) == N
    # already facing N: the option drains with the move that enters the patch
    s = scripted(env, {0: ((6, 6), N), 1: ((7, 1), N)})
    _, actions, ok = run_option(env, lib, s, 0, "go_to_patch", (3, 6))
    assert actions == [mp.FORWARD, mp.FORWARD] and ok
    # already in the target patch: ends at once, effect_fail
    _, actions, ok = run_option(env, lib, s2, 0, "go_to_patch", (3, 6))
    assert len(actions) == 1 and not ok


def test_explicit_failures():
    env = CommonsHarvest(num_agents=2, ascii_map=WALLED)
    lib = hvopt.make_library(env)
    s = scripted(env, {0: ((4, 2), N), 1: ((4, 7), N)})
    start = lambda name, tg: int(lib.start(s, 0, lib.option_id(name), jnp.asarray(tg, jnp.int32))[1])
    assert start("eat_apple", (2, 6)) == NO_PATH
    assert start("go_to_patch", tuple(lib.patch_target[1])) == NO_PATH
    assert start("go_to_patch", tuple(lib.patch_target[0])) == NO_REASON
    assert start("eat_apple", (1, 1)) == NO_REASON
    assert start("eat_apple", (3, 2)) == TARGET_ABSENT  # floor, no apple
    assert start("go_to_patch", (3, 2)) == TARGET_ABSENT  # not a patch cell
    assert start("go_to_patch", (-1, -1)) == TARGET_ABSENT
    inst = lib.instances(s, 0)
    p0 = lib.slot_start[hvopt.GO_TO_PATCH]
    assert np.asarray(lib.live_reason(s, 0, inst))[p0 : p0 + 2].tolist() == [NO_REASON, NO_PATH]


def test_instances_and_features(env, lib):
    e0, p0 = lib.slot_start[hvopt.EAT_APPLE], lib.slot_start[hvopt.GO_TO_PATCH]
    # Facing S at (6, 4): every apple (rows 1-4) is 2+ rows behind -> no eat instance; patches always listed.
    s = scripted(env, {0: ((6, 4), S), 1: ((7, 8), N)})
    inst = lib.instances(s, 0)
    assert not np.asarray(inst.valid[e0 : e0 + TARGET_CAP]).any()
    assert np.asarray(inst.valid[p0 : p0 + 2]).all()
    assert np.asarray(inst.target[p0 : p0 + 2]).tolist() == [[2, 2], [3, 6]]
    # Facing N at (5, 4): all 11 apples visible, capped at the 6 nearest by path distance (open floor: the
    # Manhattan distance), ties row-major: (3,5) 3, (4,6) 3, (3,6) 4, then of the five at 5 -- (1,3), (2,2),
    # (2,6), (3,1), (3,7) -- the first three.
    s = scripted(env, {0: ((5, 4), N), 1: ((7, 8), N)})
    inst = lib.instances(s, 0)
    assert np.asarray(inst.target[e0 : e0 + TARGET_CAP]).tolist() == [[3, 5], [4, 6], [3, 6], [1, 3], [2, 2], [2, 6]]
    f = np.asarray(lib.features(s, 0, inst))
    assert (f[e0 : e0 + TARGET_CAP, 0] == hvopt.V_YES).all()
    assert (f[e0 : e0 + TARGET_CAP, 1] == hvopt.V_NO).all()  # the agent stands on no patch
    many = hvopt.PATCH_APPLES_VALUES.index("many")
    assert f[p0 : p0 + 2, 2].tolist() == [many, many] and (f[p0 : p0 + 2, 0] == hvopt.V_NA).all()
    # the last apple of patch 1 -> "one"; patch 0 empty -> "none"; standing in patch 1 -> in_tgt_patch yes
    s = scripted(env, {0: ((3, 5), N), 1: ((7, 8), N)}, apples=[(2, 6)])
    inst = lib.instances(s, 0)
    f = np.asarray(lib.features(s, 0, inst))
    assert f[e0].tolist() == [hvopt.V_YES, hvopt.V_YES, hvopt.PATCH_APPLES_VALUES.index("one")]
    assert f[p0 : p0 + 2, 1].tolist() == [hvopt.V_NO, hvopt.V_YES]
    assert f[p0 : p0 + 2, 2].tolist() == [
        hvopt.PATCH_APPLES_VALUES.index("none"),
        hvopt.PATCH_APPLES_VALUES.index("one"),
    ]
    assert f[-1].tolist() == [hvopt.V_NA, hvopt.V_NA, hvopt.PA_NA]  # wait


def test_apple_eaten_by_partner_is_not_credited(env, lib):
    # The partner at (5, 6) steps onto the apple (4, 6) first; agent 0 walking from (6, 3) gets nothing.
    s = scripted(env, {0: ((6, 3), N), 1: ((5, 6), N)}, apples=[(4, 6), (1, 1)])
    s, actions, ok = run_option(env, lib, s, 0, "eat_apple", (4, 6), partner=[mp.FORWARD])
    assert int(s.apples_total[1]) == 1 and int(s.apples_total[0]) == 0
    assert actions[-1] == mp.NOOP and not ok
    # delta form: a second apple eaten on the way to a target is not the promised one
    pre = lib.snapshot(s, 0, jnp.array([1, 1]))
    post = lib.snapshot(
        s.replace(ate=s.ate.at[0].set(1), apples_total=s.apples_total.at[0].add(1)), 0, jnp.array([1, 1])
    )
    assert not bool(lib.effect(hvopt.EAT_APPLE, pre, post))  # not on the target


def test_blocked_path_sidesteps_around_a_standing_agent(env, lib):
    # A motionless partner stands on the straight path (5, 4) between (6, 4) and the apple (3, 4)... the
    # executor never walks into it and still arrives (a detour of at most 2 extra steps).
    s = scripted(env, {0: ((6, 4), N), 1: ((5, 4), N)}, apples=[(3, 4)])
    s, actions, ok = run_option(env, lib, s, 0, "eat_apple", (3, 4))
    assert ok and np.asarray(s.pos[0]).tolist() == [3, 4]
    assert len(actions) <= 3 + 2 + 4  # 3 moves, a 2-move detour, at most a few coin-flip waits


def test_burnin_records_and_guards():
    env = envs_jax.make("harvest")
    lib = get_library("harvest", env)
    res = burnin.run_burnin(lib, env, 7, 7, seed=0, chunk=14, num_steps=150)
    c = res.codes
    assert res.decisions == c.num_records > 500
    assert (c.aid[c.solo] == c.ep[c.solo] % 7).all()
    for o, name in enumerate(lib.option_names):
        assert (c.outcome[c.opt == o] == 0).any(), name
    gs = {(g.opt, g.channel, tuple(g.when)) for g in burnin.synthesize(lib, c)}
    assert ("go_to_patch", "inferred", (("in_tgt_patch", "yes"),)) in gs
    assert ("eat_apple", "inferred", (("tgt_apple", "yes"),)) not in gs
    assert ("go_to_patch", "inferred", (("in_tgt_patch", "no"),)) not in gs
