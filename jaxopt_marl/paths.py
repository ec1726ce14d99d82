"""Shortest paths on a 2-D grid as jitted array ops (the executors' path planner).

The paper's raw executor (§5.1, Stage 1: ``shortest_interact_plan(inst.target, pos, orient, feat.walkable,
blocked)``) is a BFS to an *interact pose* of the target followed by a turn and INTERACT; ``NoPath`` is one of
the three explicit failure reasons. Stage 4 re-checks NoPath guards live "by running the path planner". This
module provides that planner as pure, vmappable ``jnp`` functions:

- :func:`distance_field` — BFS distances from a set of source cells by wavefront relaxation in a
  ``lax.while_loop`` (each sweep relaxes every cell from its four neighbours; the loop stops when nothing
  changes, i.e. after ``longest shortest path + 1`` sweeps).
- :func:`interact_poses` / :func:`interact_sources` — the walkable 4-neighbours of a target from which an agent
  facing the target can interact, with the facing direction each pose needs.
- :func:`next_move` — the direction that descends a distance field (deterministic tie-break).
- :func:`all_pairs_distances` — the per-layout table (STYLE §6: "what depends only on the map is computed once
  per layout and looked up inside jit") for the case where no agent blocks a path, plus lookups into it.

Conventions (shared with the executors and envs):

- Coordinates are ``(row, col)``; ``row`` grows downwards.
- Directions are ``N=0, E=1, S=2, W=3`` with ``N = row - 1``, ``E = col + 1``, ``S = row + 1``,
  ``W = col - 1`` (:data:`DELTAS`).
- Distances are ``int32``; a cell that cannot reach any source (or is itself a wall or blocked) holds
  :data:`UNREACHABLE` (``2**30``: larger than any real distance and safe to add 1 to without overflow).
- Every function is pure and traceable, with static shapes only, so it can be ``jit``-ed and ``vmap``-ed over
  environments (different ``walkable`` / ``blocked``) and over agents (different positions / targets).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# ---------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------

#: Distance held by cells that reach no source (walls, blocked cells, disconnected regions). ``2**30`` so that
#: ``UNREACHABLE + 1`` still fits in int32 and compares as "not shorter".
UNREACHABLE: int = 1 << 30

#: Direction codes (row, col) convention: N = row - 1.
NORTH, EAST, SOUTH, WEST = 0, 1, 2, 3

#: ``int32[4, 2]`` (d_row, d_col) per direction code N, E, S, W.
DELTAS = jnp.array([[-1, 0], [0, 1], [1, 0], [0, -1]], dtype=jnp.int32)

#: Returned by :func:`next_move` / :func:`facing_toward` when there is no such direction.
NO_MOVE: int = -1


class InteractPoses(NamedTuple):
    """The four candidate interact poses around a target, one per side.

    Side ``k`` (a direction code) holds the cell ``target + DELTAS[k]``; an agent standing there must face
    ``(k + 2) % 4`` (back towards the target) to interact.

    Attributes:
        pos: ``int32[..., 4, 2]`` (row, col) of the pose cell on side N, E, S, W of the target (may lie outside
            the grid when ``valid`` is False).
        facing: ``int32[..., 4]`` direction the agent must face at that pose: S, W, N, E.
        valid: ``bool[..., 4]`` the pose is inside the grid, walkable and not blocked.
    """

    pos: jax.Array
    facing: jax.Array
    valid: jax.Array


# ---------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------


def _neighbour_values(field: jax.Array, fill: int) -> jax.Array:
    """Values of each cell's four neighbours.

    Args:
        field: ``[H, W]`` array.
        fill: value used for neighbours outside the grid.

    Returns:
        ``[4, H, W]``: entry ``[k, r, c]`` is ``field[(r, c) + DELTAS[k]]`` (or ``fill`` off-grid).
    """
    h, w = field.shape
    padded = jnp.pad(field, 1, constant_values=fill)
    deltas = ((-1, 0), (0, 1), (1, 0), (0, -1))  # static copy of DELTAS for slicing
    return jnp.stack([padded[1 + dr : 1 + dr + h, 1 + dc : 1 + dc + w] for dr, dc in deltas])


def _in_bounds(pos: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """``bool[...]``: (row, col) ``pos`` (``int[..., 2]``) lies inside a grid of ``shape``."""
    return (pos[..., 0] >= 0) & (pos[..., 0] < shape[0]) & (pos[..., 1] >= 0) & (pos[..., 1] < shape[1])


def flat_index(pos: jax.Array, width: int) -> jax.Array:
    """Row-major flat cell index ``row * width + col`` (the first axis of :func:`all_pairs_distances`).

    Args:
        pos: ``int32[..., 2]`` (row, col).
        width: grid width ``W`` (static).

    Returns:
        ``int32[...]``.
    """
    return pos[..., 0] * width + pos[..., 1]


# ---------------------------------------------------------------------------------------------------------
# Distance fields
# ---------------------------------------------------------------------------------------------------------


def distance_field(walkable: jax.Array, sources_mask: jax.Array, blocked: jax.Array | None = None) -> jax.Array:
    """BFS distance from every cell to the nearest source, by wavefront relaxation.

    4-neighbour moves of cost 1 through cells that are walkable and not blocked. Starting from 0 on the
    passable sources and :data:`UNREACHABLE` elsewhere, every ``lax.while_loop`` sweep sets each passable cell
    to ``min(own, min(neighbours) + 1)``; the loop ends at the first sweep that changes nothing (at most
    ``H * W`` sweeps). Used by the raw executor of §5.1 Stage 1 (``shortest_interact_plan``) and by the live
    NoPath re-check of Stage 4.

    Args:
        walkable: ``bool[H, W]`` cells an agent may stand on.
        sources_mask: ``bool[H, W]`` cells at distance 0 (several allowed). Sources that are not walkable, or
            are blocked, are ignored.
        blocked: optional ``bool[H, W]`` extra impassable cells, e.g. other agents' positions (do not include
            the acting agent's own cell, or its distance is :data:`UNREACHABLE`).

    Returns:
        ``int32[H, W]`` distances; :data:`UNREACHABLE` where no source can be reached (including every
        non-passable cell).
    """
    passable = walkable.astype(bool)
    if blocked is not None:
        passable = passable & ~blocked.astype(bool)
    init = jnp.where(passable & sources_mask.astype(bool), 0, UNREACHABLE).astype(jnp.int32)
    max_sweeps = walkable.shape[0] * walkable.shape[1]

    def relax(dist: jax.Array) -> jax.Array:
        best_nb = _neighbour_values(dist, UNREACHABLE).min(axis=0)
        cand = jnp.minimum(best_nb + 1, UNREACHABLE)
        return jnp.where(passable, jnp.minimum(dist, cand), UNREACHABLE)

    def cond(carry):
        _, changed, sweeps = carry
        return changed & (sweeps < max_sweeps)

    def body(carry):
        dist, _, sweeps = carry
        new = relax(dist)
        return new, jnp.any(new != dist), sweeps + 1

    dist, _, _ = jax.lax.while_loop(cond, body, (init, jnp.array(True), jnp.array(0, jnp.int32)))
    return dist


def next_move(dist_field: jax.Array, pos: jax.Array) -> jax.Array:
    """Direction of one step that descends a distance field.

    Among the four neighbours of ``pos``, picks the one with the smallest distance; ties go to the lowest
    direction code (N < E < S < W), so the choice is deterministic. Returns :data:`NO_MOVE` when no neighbour is
    strictly closer than ``pos`` itself — ``pos`` is a source (arrived) — or when ``pos`` itself holds
    :data:`UNREACHABLE` (no path; also when ``pos`` is a wall or was passed as blocked).

    Args:
        dist_field: ``int32[H, W]`` from :func:`distance_field` (or a row of :func:`all_pairs_distances`).
        pos: ``int32[2]`` (row, col) of the agent.

    Returns:
        ``int32[]`` direction code in ``{N=0, E=1, S=2, W=3}`` or :data:`NO_MOVE` (-1).
    """
    shape = dist_field.shape
    pos = jnp.asarray(pos, jnp.int32)
    nbrs = pos[None, :] + DELTAS  # [4, 2]
    inside = _in_bounds(nbrs, shape)
    clipped = jnp.clip(nbrs, 0, jnp.array(shape, jnp.int32) - 1)
    vals = jnp.where(inside, dist_field[clipped[:, 0], clipped[:, 1]], UNREACHABLE)
    best = jnp.argmin(vals).astype(jnp.int32)  # first minimum -> lowest direction code
    here = dist_field[pos[0], pos[1]]
    descends = (vals[best] < here) & (here < UNREACHABLE)
    return jnp.where(descends, best, NO_MOVE).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------------------
# Interact poses
# ---------------------------------------------------------------------------------------------------------


def interact_poses(walkable: jax.Array, target: jax.Array, blocked: jax.Array | None = None) -> InteractPoses:
    """The cells from which an agent facing ``target`` can interact with it.

    A pose is a 4-neighbour of the target that lies in the grid, is walkable and is not blocked; the agent must
    face back towards the target (§5.1 Stage 1: "BFS to an interact pose + INTERACT").

    Args:
        walkable: ``bool[H, W]``.
        target: ``int32[2]`` (row, col) of the target cell (typically a counter, pot or station — not walkable).
        blocked: optional ``bool[H, W]`` extra impassable cells (e.g. other agents).

    Returns:
        :class:`InteractPoses` with ``pos`` ``int32[4, 2]``, ``facing`` ``int32[4]``, ``valid`` ``bool[4]``,
        indexed by the side of the target (N, E, S, W).
    """
    shape = walkable.shape
    target = jnp.asarray(target, jnp.int32)
    pos = target[None, :] + DELTAS
    inside = _in_bounds(pos, shape)
    clipped = jnp.clip(pos, 0, jnp.array(shape, jnp.int32) - 1)
    ok = walkable.astype(bool)[clipped[:, 0], clipped[:, 1]]
    if blocked is not None:
        ok = ok & ~blocked.astype(bool)[clipped[:, 0], clipped[:, 1]]
    facing = (jnp.arange(4, dtype=jnp.int32) + 2) % 4
    return InteractPoses(pos=pos, facing=facing, valid=inside & ok)


def interact_sources(walkable: jax.Array, target: jax.Array, blocked: jax.Array | None = None) -> jax.Array:
    """``bool[H, W]`` mask of the valid interact poses of ``target`` (the sources for :func:`distance_field`).

    Args:
        walkable: ``bool[H, W]``.
        target: ``int32[2]`` (row, col).
        blocked: optional ``bool[H, W]``.

    Returns:
        ``bool[H, W]``, True at every valid pose of :func:`interact_poses`.
    """
    poses = interact_poses(walkable, target, blocked)
    clipped = jnp.clip(poses.pos, 0, jnp.array(walkable.shape, jnp.int32) - 1)
    return jnp.zeros(walkable.shape, bool).at[clipped[:, 0], clipped[:, 1]].max(poses.valid)


def interact_field(walkable: jax.Array, target: jax.Array, blocked: jax.Array | None = None) -> jax.Array:
    """``int32[H, W]`` distance from every cell to the nearest valid interact pose of ``target``.

    Args:
        walkable: ``bool[H, W]``.
        target: ``int32[2]`` (row, col).
        blocked: optional ``bool[H, W]`` (blocks both poses and paths).

    Returns:
        ``int32[H, W]``; :data:`UNREACHABLE` everywhere if the target has no valid pose.
    """
    return distance_field(walkable, interact_sources(walkable, target, blocked), blocked)


def facing_toward(pos: jax.Array, target: jax.Array) -> jax.Array:
    """Direction an agent at ``pos`` must face to interact with an adjacent ``target``.

    Args:
        pos: ``int32[2]`` (row, col) of the agent.
        target: ``int32[2]`` (row, col) of the target.

    Returns:
        ``int32[]`` direction code, or :data:`NO_MOVE` if ``target`` is not a 4-neighbour of ``pos``.
    """
    diff = jnp.asarray(target, jnp.int32) - jnp.asarray(pos, jnp.int32)
    hit = jnp.all(DELTAS == diff[None, :], axis=-1)  # [4]
    return jnp.where(hit.any(), jnp.argmax(hit), NO_MOVE).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------------------
# Per-layout all-pairs table (no agent blocks a path)
# ---------------------------------------------------------------------------------------------------------


@jax.jit
def all_pairs_distances(walkable: jax.Array) -> jax.Array:
    """Distance between every pair of cells of a static map, computed once per layout.

    Row ``i = row * W + col`` (:func:`flat_index`) is the distance field *from* cell ``i``; since moves are
    symmetric it is also the distance *to* cell ``i`` from every cell. A non-walkable source cell gives a row of
    :data:`UNREACHABLE`. Memory is ``4 * (H * W)**2`` bytes (e.g. 0.8 MB for a 25x18 map). Mirrors the
    all-positions BFS table of JaxMARL's Overcooked-v2 path planner (STYLE §1, §6); valid only when no agent
    blocks a path — use :func:`distance_field` with ``blocked`` otherwise.

    Args:
        walkable: ``bool[H, W]``.

    Returns:
        ``int32[H * W, H, W]``.
    """
    h, w = walkable.shape
    sources = jnp.eye(h * w, dtype=bool).reshape(h * w, h, w)
    return jax.vmap(distance_field, in_axes=(None, 0))(walkable, sources)


def table_distance(table: jax.Array, src: jax.Array, dst: jax.Array) -> jax.Array:
    """Look up the distance between two cells in an :func:`all_pairs_distances` table.

    Args:
        table: ``int32[H * W, H, W]``.
        src: ``int32[2]`` (row, col).
        dst: ``int32[2]`` (row, col).

    Returns:
        ``int32[]`` (:data:`UNREACHABLE` if disconnected or either cell is not walkable).
    """
    w = table.shape[2]
    return table[flat_index(jnp.asarray(dst, jnp.int32), w), src[0], src[1]]


def table_interact_field(table: jax.Array, walkable: jax.Array, target: jax.Array) -> jax.Array:
    """:func:`interact_field` without blocking, as a min over table rows (no while loop inside jit).

    Args:
        table: ``int32[H * W, H, W]`` from :func:`all_pairs_distances` of ``walkable``.
        walkable: ``bool[H, W]``.
        target: ``int32[2]`` (row, col).

    Returns:
        ``int32[H, W]`` distance to the nearest valid interact pose of ``target``.
    """
    poses = interact_poses(walkable, target)
    w = walkable.shape[1]
    clipped = jnp.clip(poses.pos, 0, jnp.array(walkable.shape, jnp.int32) - 1)
    rows = table[flat_index(clipped, w)]  # [4, H, W]
    return jnp.where(poses.valid[:, None, None], rows, UNREACHABLE).min(axis=0)
