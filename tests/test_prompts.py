"""Prompt text (paper §5.1 worked example style) from hand-built snapshots; snapshots of real states."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from jaxopt_marl import options, prompts


@pytest.fixture(scope="module")
def aa():
    env = envs_jax.make("overcooked_aa")
    return env, options.get_library("overcooked_aa", env)


def _aa_snapshot():
    """The worked example's state: player 1 at (1, 1) facing West holding an onion, partner player 0 at (5, 2)
    facing North holding an onion, both pots empty, counters empty, step 4. Cells are (row, col)."""
    return dict(
        pos=np.array([[2, 5], [1, 1]]),
        facing=np.array([0, 3]),
        held=np.array([1, 1]),
        pot_onions=np.array([0, 0]),
        pot_cooking=np.array([False, False]),
        pot_ready=np.array([False, False]),
        counter_items=np.zeros(12, np.int32),
        step=np.int32(4),
        team=np.int32(0),
    )


def test_system_message_contract():
    text = prompts.system_message("overcooked_aa")
    assert text.startswith("You are an agent in a 2-player cooperative Overcooked-AI kitchen.")
    assert "Each delivery scores +20 (shared with partner)." in text
    assert text.endswith(
        "state: <empty | filling | cooking | ready_to_plate | delivering>\nchoice: <single capital letter>"
    )
    for game in ("cleanup", "harvest"):
        assert "choice: <single capital letter>" in prompts.system_message(game)
    with pytest.raises(ValueError, match="unknown game"):
        prompts.system_message("chess")


def test_overcooked_user_message_worked_example(aa):
    _, lib = aa
    menu = (
        "Action menu:\nA) place held item in pot @ (4, 2)\nB) drop held item on counter @ (1, 0)\n"
        "C) place held item in pot @ (4, 3)\nD) drop held item on counter @ (2, 1)"
    )
    mem = prompts.Memory()
    mem.remember("pick_onion", 0)
    text = prompts.user_message("overcooked_aa", _aa_snapshot(), 1, menu, 150, mem, lib)
    lines = text.split("\n")
    assert lines[:6] == [
        "You are player 1. World position: (1, 1).",
        "Facing: West. Holding: onion.",
        "Partner (player 0): pos=(5, 2) facing=North holding=onion.",
        "",
        "Pots:",
        # Distances to the pot's nearest interact pose on AA's floor (player 1 left, partner right half).
        f"  - pot@(4, 2): 0/3 onions; you: {_d(lib, (2, 4), (1, 1))} | partner: {_d(lib, (2, 4), (2, 5))}",
    ]
    assert "Counters: (empty)" in lines
    assert "Step 4/150." in lines
    assert "- Last 5 macros decided: pick_onion" in lines
    assert text.endswith(menu + "\n\nChoose one. Reply with exactly two lines.")
    assert prompts.state_label("overcooked_aa", _aa_snapshot(), 1) == "empty"


def _d(lib, target, pos):
    w = lib.info.width
    d = int(lib.pose_dist[target[0] * w + target[1], pos[0] * w + pos[1]])
    return "unreachable" if d >= 1 << 30 else str(d)


@pytest.fixture(scope="module")
def cleanup():
    env = envs_jax.make("cleanup")
    return env, options.get_library("cleanup", env)


def _cleanup_snapshot(pos, facing, alive, apples=(), dirt=(), step=7, team=2):
    """A Clean Up snapshot on the real 21 x 30 map with objects at the given (row, col) cells."""
    grids = []
    for cells in (apples, dirt):
        g = np.zeros((21, 30), bool)
        for r, c in cells:
            g[r, c] = True
        grids.append(g)
    return dict(
        pos=np.array(pos),
        facing=np.array(facing),
        alive=np.array(alive, bool),
        apples=grids[0],
        dirt=grids[1],
        step=np.int32(step),
        team=np.int32(team),
    )


def test_cleanup_in_view_is_the_menus_window(cleanup):
    """ "In view" = the 11 x 11 observation window the menu instantiates from (9 ahead, 1 behind, 5 to each side),
    not a square around the agent. Player 0 at (row 15, col 12) facing North sees rows 6..16, cols 7..17."""
    env, lib = cleanup
    snap = _cleanup_snapshot(
        pos=[[15, 12], [17, 12], [7, 13], [15, 18]],
        facing=[0, 0, 0, 0],
        alive=[1, 1, 1, 1],
        # (6, 12): 9 ahead (in the window, outside the old radius-5 square); (18, 12): 3 behind (in the old square,
        # outside the window); (15, 17): 5 to the right, in both; (14, 12): 1 ahead.
        apples=[(6, 12), (18, 12), (15, 17), (14, 12)],
        dirt=[(5, 12)],
    )  # 10 ahead: out of view
    text = prompts.user_message("cleanup", snap, 0, "Action menu:\nA) wait", 150, lib=lib)
    # Path lengths on this map (walls only): straight walks, nothing blocks them.
    assert "Apples in view: 3 (nearest: (12, 14) d=1, (17, 15) d=5, (12, 6) d=9)" in text
    assert "Dirt in view: 0" in text
    # Partner 1 is 2 behind (out of the window, in the old square); partner 2 is 8 ahead (in the window, outside
    # the old square); partner 3 is 6 to the right (outside both).
    assert "Partners in view: player 2 @ (13, 7)\n" in text
    assert prompts.state_label("cleanup", snap, 0) == "harvesting"
    # The same ranking as the menu: the instance table's apple targets, nearest first.
    s = envs_jax.make("cleanup").reset(jax.random.PRNGKey(0))[1]
    s = s.replace(
        pos=jnp.asarray(snap["pos"].tolist() + [[1, 1]] * 3),
        facing=jnp.zeros(7, jnp.int32),
        apples=jnp.asarray(snap["apples"]),
    )
    inst = lib.instances(s, 0)
    eat = np.asarray(inst.opt) == lib.option_id("eat_apple")
    targets = np.asarray(inst.target)[eat & np.asarray(inst.valid)]
    assert targets.tolist() == [[14, 12], [15, 17], [6, 12]]


def test_cleanup_facing_turns_the_window_and_unreachable_cells(cleanup):
    _, lib = cleanup
    # Facing South from (15, 12): the window is rows 14..24 (9 ahead = south, 1 behind), cols 7..17.
    snap = _cleanup_snapshot(
        pos=[[15, 12], [1, 1]], facing=[2, 0], alive=[1, 1], apples=[(6, 12), (18, 12)], dirt=[(14, 12)]
    )
    text = prompts.user_message("cleanup", snap, 0, "Action menu:\nA) wait", 150, lib=lib)
    assert "Facing: South." in text
    assert "Apples in view: 1 (nearest: (12, 18) d=3)" in text
    assert "Dirt in view: 1 (nearest: (12, 14) d=1)" in text
    assert prompts.state_label("cleanup", snap, 0) == "harvesting"
    # An agent standing on the outer wall (row 0) reaches nothing: d=unreachable.
    wall = _cleanup_snapshot(pos=[[0, 12], [1, 1]], facing=[2, 0], alive=[1, 1], dirt=[(1, 12), (2, 13)])
    text = prompts.user_message("cleanup", wall, 0, "Action menu:\nA) wait", 150, lib=lib)
    assert "Dirt in view: 2 (nearest: (12, 1) d=unreachable, (13, 2) d=unreachable)" in text
    assert prompts.state_label("cleanup", wall, 0) == "cleaning"
    # Nothing in view: exploring; a user message of a Melting Pot game needs the library.
    empty = _cleanup_snapshot(pos=[[15, 12], [1, 1]], facing=[0, 0], alive=[1, 0])
    assert prompts.state_label("cleanup", empty, 0) == "exploring"
    with pytest.raises(ValueError, match="needs the option library"):
        prompts.user_message("cleanup", empty, 0, "Action menu:\nA) wait", 150)


def test_team_values_are_written_exactly(aa):
    _, lib = aa
    mem = prompts.Memory()
    mem.remember("wait", 1234000)
    snap = dict(_aa_snapshot(), team=np.int32(1234567))
    text = prompts.user_message("overcooked_aa", snap, 1, "Action menu:\nA) wait", 150, mem, lib)
    assert "- Team reward since your last decision: 567 (episode total 1234567)" in text


def test_snapshots_of_real_states(aa):
    env, lib = aa
    _, state = env.reset(jax.random.PRNGKey(0))
    batch = jax.tree.map(lambda x: x[None], state)
    snap = prompts.take(prompts.make_snapshot_fn("overcooked_aa", env)(batch), 0)
    assert snap["pos"].shape == (2, 2) and snap["pot_onions"].shape == (2,)
    text = prompts.user_message("overcooked_aa", snap, 0, "Action menu:\nA) wait", env.max_steps, lib=lib)
    assert "Step 0/400." in text
    cl = envs_jax.make("cleanup")
    _, s = cl.reset(jax.random.PRNGKey(0))
    snap = prompts.take(prompts.make_snapshot_fn("cleanup", cl)(jax.tree.map(lambda x: x[None], s)), 0)
    assert snap["apples"].ndim == 2 and "dirt" in snap
    clib = options.get_library("cleanup", cl)
    assert "Dirt in view" in prompts.user_message("cleanup", snap, 3, "Action menu:\nA) wait", 150, lib=clib)
