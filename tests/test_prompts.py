"""Prompt text (paper §5.1 worked example style) from hand-built snapshots; snapshots of real states."""

import jax
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
    return dict(pos=np.array([[2, 5], [1, 1]]), facing=np.array([0, 3]), held=np.array([1, 1]),
                pot_onions=np.array([0, 0]), pot_cooking=np.array([False, False]),
                pot_ready=np.array([False, False]), counter_items=np.zeros(12, np.int32), step=np.int32(4),
                team=np.int32(0))


def test_system_message_contract():
    text = prompts.system_message("overcooked_aa")
    assert text.startswith("You are an agent in a 2-player cooperative Overcooked-AI kitchen.")
    assert "Each delivery scores +20 (shared with partner)." in text
    assert text.endswith("state: <empty | filling | cooking | ready_to_plate | delivering>\n"
                         "choice: <single capital letter>")
    for game in ("cleanup", "harvest"):
        assert "choice: <single capital letter>" in prompts.system_message(game)
    with pytest.raises(ValueError, match="unknown game"):
        prompts.system_message("chess")


def test_overcooked_user_message_worked_example(aa):
    _, lib = aa
    menu = ("Action menu:\nA) place held item in pot @ (4, 2)\nB) drop held item on counter @ (1, 0)\n"
            "C) place held item in pot @ (4, 3)\nD) drop held item on counter @ (2, 1)")
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


def test_cleanup_user_message_lists_nearest_targets():
    apples = np.zeros((10, 12), bool)
    apples[3, 4] = apples[8, 8] = apples[0, 11] = True
    dirt = np.zeros((10, 12), bool)
    snap = dict(pos=np.array([[3, 3], [4, 4], [9, 0]]), facing=np.array([1, 0, 0]), alive=np.array([1, 0, 1], bool),
                apples=apples, dirt=dirt, step=np.int32(7), team=np.int32(2))
    text = prompts.user_message("cleanup", snap, 0, "Action menu:\nA) go to the river", 150)
    assert "You are player 0. World position: (3, 3). Facing: East." in text
    # (8, 8) is within radius 5 (Chebyshev 5); (0, 11) is 8 columns away: out of view.
    assert "Apples in view: 2 (nearest: (4, 3) d=1, (8, 8) d=10)" in text
    assert "Dirt in view: 0" in text
    assert "Partners in view: none" in text  # player 1 is zapped, player 2 out of view
    assert "Step 7/150." in text and "episode total 2" in text
    assert prompts.state_label("cleanup", snap, 0) == "harvesting"


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
    assert "Dirt in view" in prompts.user_message("cleanup", snap, 3, "Action menu:\nA) wait", 150)
