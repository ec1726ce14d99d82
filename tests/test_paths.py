"""Tests for jaxopt_marl.paths: hand-computed distance fields, interact poses, next_move, vmap, all-pairs."""

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxopt_marl import paths
from jaxopt_marl.paths import EAST, NO_MOVE, NORTH, SOUTH, UNREACHABLE, WEST

U = UNREACHABLE


def grid(rows: str) -> np.ndarray:
    """'.' walkable, '#' wall; rows separated by whitespace."""
    return np.array([[c == "." for c in r] for r in rows.split()], dtype=bool)


def mask(shape, *cells) -> np.ndarray:
    m = np.zeros(shape, bool)
    for r, c in cells:
        m[r, c] = True
    return m


def bfs_reference(walkable: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """Plain-Python multi-source BFS (the oracle)."""
    h, w = walkable.shape
    dist = np.full((h, w), U, np.int64)
    q = deque()
    for r, c in zip(*np.nonzero(sources & walkable)):
        dist[r, c] = 0
        q.append((r, c))
    while q:
        r, c = q.popleft()
        for dr, dc in ((-1, 0), (0, 1), (1, 0), (0, -1)):
            nr, nc = r + dr, c + dc
            if 0 <= nr < h and 0 <= nc < w and walkable[nr, nc] and dist[nr, nc] == U:
                dist[nr, nc] = dist[r, c] + 1
                q.append((nr, nc))
    return dist


# A U-shaped wall opening upwards; the source sits inside the U, so cells below it must walk round.
U_MAP = grid("""
.....
.#.#.
.#.#.
.###.
.....
""")
# Hand-derived: up out of the U (1, 2), along row 0, down either side, and meet at the bottom middle (10).
U_EXPECTED = np.array(
    [
        [4, 3, 2, 3, 4],
        [5, U, 1, U, 5],
        [6, U, 0, U, 6],
        [7, U, U, U, 7],
        [8, 9, 10, 9, 8],
    ]
)


def test_u_shaped_wall():
    d = paths.distance_field(jnp.array(U_MAP), jnp.array(mask(U_MAP.shape, (2, 2))))
    assert d.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(d), U_EXPECTED)


def test_blocked_corridor_is_unreachable():
    corridor = grid(".....")
    src = mask(corridor.shape, (0, 0))
    np.testing.assert_array_equal(np.asarray(paths.distance_field(corridor, src)), [[0, 1, 2, 3, 4]])
    # Another agent standing at column 2 cuts the corridor: its own cell and everything beyond are unreachable.
    blocked = mask(corridor.shape, (0, 2))
    np.testing.assert_array_equal(np.asarray(paths.distance_field(corridor, src, blocked)), [[0, 1, U, U, U]])


def test_multiple_sources_take_the_nearest():
    row = grid(".......")
    d = paths.distance_field(row, mask(row.shape, (0, 0), (0, 6)))
    np.testing.assert_array_equal(np.asarray(d), [[0, 1, 2, 3, 2, 1, 0]])


def test_sources_on_walls_or_blocked_cells_are_ignored():
    row = grid("..#..")
    d = paths.distance_field(row, mask(row.shape, (0, 2), (0, 4)), mask(row.shape, (0, 4)))
    np.testing.assert_array_equal(np.asarray(d), [[U, U, U, U, U]])


def test_matches_bfs_reference_on_random_grids():
    rng = np.random.default_rng(0)
    for _ in range(10):
        walk = rng.random((7, 9)) < 0.7
        src = rng.random((7, 9)) < 0.05
        d = paths.distance_field(walk, src)
        np.testing.assert_array_equal(np.asarray(d), bfs_reference(walk, src))


def test_interact_poses():
    # Target counter at (1, 1): N (0, 1) walkable, E (1, 2) wall, S (2, 1) walkable, W (1, 0) walkable but
    # occupied by another agent.
    walk = grid("""
    ...
    .##
    ...
    """)
    blocked = mask(walk.shape, (1, 0))
    poses = paths.interact_poses(walk, jnp.array([1, 1]), blocked)
    np.testing.assert_array_equal(np.asarray(poses.pos), [[0, 1], [1, 2], [2, 1], [1, 0]])
    np.testing.assert_array_equal(np.asarray(poses.facing), [SOUTH, WEST, NORTH, EAST])
    np.testing.assert_array_equal(np.asarray(poses.valid), [True, False, True, False])
    np.testing.assert_array_equal(
        np.asarray(paths.interact_sources(walk, jnp.array([1, 1]), blocked)), mask(walk.shape, (0, 1), (2, 1))
    )
    # Without the blocker the west pose is valid too.
    assert np.asarray(paths.interact_poses(walk, jnp.array([1, 1])).valid).tolist() == [True, False, True, True]


def test_interact_poses_at_the_grid_edge():
    walk = grid("""
    #.
    ..
    """)
    poses = paths.interact_poses(walk, jnp.array([0, 0]))
    # N and W lie off-grid; E (0, 1) and S (1, 0) are walkable.
    np.testing.assert_array_equal(np.asarray(poses.valid), [False, True, True, False])
    assert int(paths.facing_toward(jnp.array([0, 1]), jnp.array([0, 0]))) == WEST
    assert int(paths.facing_toward(jnp.array([1, 0]), jnp.array([0, 0]))) == NORTH
    assert int(paths.facing_toward(jnp.array([1, 1]), jnp.array([0, 0]))) == NO_MOVE


def test_interact_field():
    # Pot at (0, 2) on a 2x5 kitchen; poses (1, 2) only (row 0 is counters).
    walk = grid("""
    #####
    .....
    """)
    d = paths.interact_field(walk, jnp.array([0, 2]))
    np.testing.assert_array_equal(np.asarray(d), [[U] * 5, [2, 1, 0, 1, 2]])


def test_next_move_descends_with_tie_break():
    d = jnp.array(U_EXPECTED, jnp.int32)
    # (4, 2) at 10: neighbours W (4, 1) = 9 and E (4, 3) = 9 tie -> lowest code E.
    assert int(paths.next_move(d, jnp.array([4, 2]))) == EAST
    assert int(paths.next_move(d, jnp.array([0, 0]))) == EAST  # (0, 1) = 3 < S (1, 0) = 5
    assert int(paths.next_move(d, jnp.array([1, 2]))) == SOUTH
    assert int(paths.next_move(d, jnp.array([2, 2]))) == NO_MOVE  # at the source
    assert int(paths.next_move(d, jnp.array([1, 1]))) == NO_MOVE  # a wall: unreachable


def test_following_next_move_reaches_the_source():
    d = jnp.array(U_EXPECTED, jnp.int32)
    pos = np.array([4, 2])
    for _ in range(10):
        k = int(paths.next_move(d, jnp.array(pos)))
        assert k != NO_MOVE
        pos = pos + np.asarray(paths.DELTAS[k])
    assert tuple(pos) == (2, 2)
    assert int(paths.next_move(d, jnp.array(pos))) == NO_MOVE


def test_vmap_over_envs_and_agents_matches_single_calls():
    rng = np.random.default_rng(1)
    n_env, n_agent, h, w = 3, 2, 6, 7
    walk = rng.random((n_env, h, w)) < 0.75
    targets = rng.integers(0, [h, w], size=(n_env, n_agent, 2)).astype(np.int32)
    pos = rng.integers(0, [h, w], size=(n_env, n_agent, 2)).astype(np.int32)
    blocked = np.zeros((n_env, n_agent, h, w), bool)
    for e in range(n_env):  # each agent is blocked by its partner
        for a in range(n_agent):
            r, c = pos[e, 1 - a]
            blocked[e, a, r, c] = True

    def plan(walk_e, target, p, blk):
        field = paths.interact_field(walk_e, target, blk)
        return field, paths.next_move(field, p), paths.interact_poses(walk_e, target, blk).valid

    batched = jax.jit(jax.vmap(jax.vmap(plan, in_axes=(None, 0, 0, 0))))
    fields, moves, valid = batched(walk, targets, pos, blocked)
    assert fields.shape == (n_env, n_agent, h, w) and moves.shape == (n_env, n_agent)
    for e in range(n_env):
        for a in range(n_agent):
            f1, m1, v1 = plan(jnp.array(walk[e]), targets[e, a], pos[e, a], jnp.array(blocked[e, a]))
            np.testing.assert_array_equal(np.asarray(fields[e, a]), np.asarray(f1))
            assert int(moves[e, a]) == int(m1)
            np.testing.assert_array_equal(np.asarray(valid[e, a]), np.asarray(v1))


def test_all_pairs_table():
    walk = U_MAP
    table = paths.all_pairs_distances(jnp.array(walk))
    h, w = walk.shape
    assert table.shape == (h * w, h, w) and table.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(table[paths.flat_index(jnp.array([2, 2]), w)]), U_EXPECTED)
    # Symmetric: table[i][j] == table[j][i].
    flat = np.asarray(table).reshape(h * w, h * w)
    np.testing.assert_array_equal(flat, flat.T)
    assert int(paths.table_distance(table, jnp.array([4, 2]), jnp.array([2, 2]))) == 10
    assert int(paths.table_distance(table, jnp.array([1, 1]), jnp.array([2, 2]))) == U
    # Interact field from the table equals the while-loop one (no blocking), inside jit.
    target = jnp.array([3, 2])  # the bottom of the U
    lookup = jax.jit(paths.table_interact_field)(table, jnp.array(walk), target)
    np.testing.assert_array_equal(np.asarray(lookup), np.asarray(paths.interact_field(walk, target)))


@pytest.mark.parametrize("seed", [0, 1])
def test_all_pairs_matches_distance_field(seed):
    rng = np.random.default_rng(seed)
    walk = rng.random((5, 6)) < 0.7
    table = np.asarray(paths.all_pairs_distances(jnp.array(walk)))
    for i in rng.choice(30, size=5, replace=False):
        src = np.zeros(30, bool)
        src[i] = True
        np.testing.assert_array_equal(table[i], bfs_reference(walk, src.reshape(5, 6)))
