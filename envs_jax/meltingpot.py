"""Shared Melting Pot mechanics for the Clean Up and Commons Harvest ports.

Reproduces the avatar, beam and respawn rules that Melting Pot 2.4.1 shares between
``meltingpot/configs/substrates/clean_up.py`` and ``commons_harvest__open.py``: the avatar component of
``meltingpot/lua/modules/avatar_library.lua`` (relative movement, turning, the zap beam, removal and respawn,
``READY_TO_SHOOT``), the DMLab2D beam geometry (``dmlab2d/lib/system/grid_world/grid.cc``: length 3, radius 1)
and the engine's sequential, randomly ordered move queue. The rules are those of
``docs/environments.md`` §1.2–§1.3 (Clean Up) and §2.2–§2.3 (Harvest, same avatar code).

Everything here is a pure array function on one environment (no batch axis); the games ``vmap`` it.
``MeltingPotEnv`` is the thin JaxMARL shell both games share (spaces, auto-reset, observations, render).

Randomness: each step turns its PRNG key into one 2-word seed (one threefry draw) and derives every
per-cell and per-agent draw (move order, respawn cells and facings, the games' growth and spawn draws)
from it with a cheap integer hash (see :func:`hash_bits`); so ``step`` is a pure function of its key, and
vmapped environments with different keys are independent.

Observation (declared simplification of Melting Pot's 88x88 RGB view, spec §5 "acceptable simplifications"):
the same 11x11-cell egocentric window (9 cells ahead, 1 behind, 5 to each side, the agent at window cell
(9, 5), rotated so that the agent's facing is "up"), but as symbolic one-hot layers, ``uint8[11, 11, C]``.
Off-map cells are marked in the ``wall`` layer. A removed (zapped) agent gets an all-zero observation,
as Melting Pot gives it an all-black image.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxmarl.environments.multi_agent_env import MultiAgentEnv
from jaxmarl.environments.spaces import Box, Discrete

from envs_jax.render import paint

# ------------------------------------------------------------------------------------------------
# Constants
# ------------------------------------------------------------------------------------------------

# Compass codes (spec "Conventions"; reference/README.md orientation codes N=0, E=1, S=2, W=3).
NORTH, EAST, SOUTH, WEST = 0, 1, 2, 3
# (d_row, d_col) of one step in each compass direction; index = compass code.
DIRECTIONS = np.array([[-1, 0], [0, 1], [1, 0], [0, -1]], np.int32)

# Action indices: Melting Pot ``ACTION_SET`` of clean_up.py (Harvest uses 0..7), spec §1.2.
NOOP, FORWARD, BACKWARD, STEP_LEFT, STEP_RIGHT, TURN_LEFT, TURN_RIGHT, FIRE_ZAP, FIRE_CLEAN = range(9)
ACTION_NAMES = (
    "NOOP",
    "FORWARD",
    "BACKWARD",
    "STEP_LEFT",
    "STEP_RIGHT",
    "TURN_LEFT",
    "TURN_RIGHT",
    "FIRE_ZAP",
    "FIRE_CLEAN",
)
# Per action: clockwise quarter turns from facing to the move direction (-1 = not a move), spec §1.2.
MOVE_ROTATION = np.array([-1, 0, 2, 3, 1, -1, -1, -1, -1], np.int32)
# Per action: change of facing in clockwise quarter turns (TURN_LEFT = counter-clockwise), spec §1.2.
TURN_DELTA = np.array([0, 0, 0, 0, 0, 3, 1, 0, 0], np.int32)

# Egocentric window (spec §1.2, "confirmed by measurement"): 9 ahead, 1 behind, 5 to each side.
OBS_AHEAD, OBS_BEHIND, OBS_SIDE = 9, 1, 5
OBS_ROWS, OBS_COLS = OBS_AHEAD + 1 + OBS_BEHIND, 2 * OBS_SIDE + 1  # 11 x 11
OBS_SELF_CELL = (OBS_AHEAD, OBS_SIDE)  # (9, 5)
# Stream ids of hash_uniform draws within one step (any distinct integers).
_STREAM_MOVE_ORDER, _STREAM_RESPAWN_CELL, _STREAM_RESPAWN_FACING = 1, 2, 3
STREAM_GAME = 10  # first stream id free for game-specific draws
# Padding of grids before window gathers; >= the window's reach (9) and the beam's (3).
PAD = 10

# Beam footprint (spec §1.3; DMLab2D beam length 3, radius 1): [segment, step, (forward, sideways)].
# Segments: centre, left, right; each traced outward and stopped at its first blocking cell.
BEAM_OFFSETS = np.array([[(1, 0), (2, 0), (3, 0)], [(0, -1), (1, -1), (2, -1)], [(0, 1), (1, 1), (2, 1)]], np.int32)

# Bits of the per-cell observation code (uint8). Bits 5..7 hold 0 (no agent) or 1 + the agent's facing.
BIT_WALL, BIT_APPLE, BIT_DIRT, BIT_RIVER, BIT_GRASS = 0, 1, 2, 3, 4
AGENT_SHIFT = 5

# Render palette (uint8 RGB), roughly Melting Pot's colours; one code per cell kind, then one per agent.
PALETTE_BASE = np.array(
    [
        [200, 190, 150],  # 0 sand / floor
        [70, 70, 70],  # 1 wall
        [30, 110, 200],  # 2 clean river water
        [100, 110, 40],  # 3 dirt on the river
        [110, 170, 80],  # 4 grass without apple
        [200, 30, 40],  # 5 apple
    ],
    np.uint8,
)
CODE_FLOOR, CODE_WALL, CODE_RIVER, CODE_DIRT, CODE_GRASS, CODE_APPLE = range(6)
#: What each :data:`PALETTE_BASE` colour means (the legend of ``episode.gif``), index = code.
PALETTE_BASE_NAMES = ("floor", "wall", "river", "dirt", "grass (no apple)", "apple")
# Melting Pot's default player colours (colour palette of avatar_library), first 7.
PALETTE_AGENTS = np.array(
    [[45, 110, 220], [125, 50, 200], [205, 5, 165], [245, 65, 65], [245, 130, 0], [195, 180, 0], [125, 185, 65]],
    np.uint8,
)
# Pixels per cell in render(); Melting Pot's sprites are 8x8 (WORLD.RGB 168x240 for Clean Up).
CELL_PX = 8


# ------------------------------------------------------------------------------------------------
# Map parsing
# ------------------------------------------------------------------------------------------------


def parse_ascii_map(ascii_map: str) -> np.ndarray:
    """Turns an ASCII map into a character grid.

    Leading/trailing blank lines are dropped; every remaining line must have the same length.

    Args:
        ascii_map: rows separated by newlines.

    Returns:
        ``<U1[H, W]`` numpy array of characters.

    Raises:
        ValueError: empty or ragged map.
    """
    lines = [ln for ln in ascii_map.split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError("ascii_map is empty")
    widths = {len(ln) for ln in lines}
    if len(widths) != 1:
        raise ValueError(f"ascii_map rows have different lengths {sorted(widths)}; the map must be rectangular")
    return np.array([list(ln) for ln in lines])


def cells_of(chars: np.ndarray, which: str) -> np.ndarray:
    """``int32[K, 2]`` (row, col) of every cell whose character is in ``which``, in row-major order."""
    return np.argwhere(np.isin(chars, list(which))).astype(np.int32)


# ------------------------------------------------------------------------------------------------
# Grid helpers
# ------------------------------------------------------------------------------------------------


def in_bounds(cells: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """bool[...]: whether each (row, col) of int32[..., 2] ``cells`` lies on an ``shape`` grid."""
    return (cells[..., 0] >= 0) & (cells[..., 0] < shape[0]) & (cells[..., 1] >= 0) & (cells[..., 1] < shape[1])


def gather_cells(grid: jax.Array, cells: jax.Array, fill) -> jax.Array:
    """Reads ``grid[row, col]`` at int32[..., 2] ``cells``; off-grid cells read ``fill``."""
    h, w = grid.shape
    ok = in_bounds(cells, (h, w))
    flat = jnp.clip(cells[..., 0], 0, h - 1) * w + jnp.clip(cells[..., 1], 0, w - 1)
    return jnp.where(ok, grid.reshape(-1)[flat], fill)


def set_cells(grid: jax.Array, cells: jax.Array, mask: jax.Array, value) -> jax.Array:
    """Writes ``value`` into ``grid`` at the (on-grid) cells of int32[K, 2] ``cells`` where bool[K] ``mask``."""
    h, w = grid.shape
    ok = mask & in_bounds(cells, (h, w))
    flat = jnp.where(ok, cells[..., 0] * w + cells[..., 1], h * w)
    return grid.reshape(-1).at[flat].set(value, mode="drop").reshape(h, w)


def rotate(facing: jax.Array, quarter_turns) -> jax.Array:
    """Compass code after ``quarter_turns`` clockwise quarter turns."""
    return (facing + quarter_turns) % 4


def agent_id_grid(shape: tuple[int, int], pos: jax.Array, alive: jax.Array) -> jax.Array:
    """int32[H, W]: 1 + the id of the alive agent on each cell, 0 where none."""
    h, w = shape
    flat = jnp.where(alive, pos[:, 0] * w + pos[:, 1], h * w)
    ids = jnp.arange(1, pos.shape[0] + 1, dtype=jnp.int32)
    return jnp.zeros(h * w, jnp.int32).at[flat].set(ids, mode="drop").reshape(h, w)


def occupied_by(cells: jax.Array, pos: jax.Array, alive: jax.Array) -> jax.Array:
    """bool[..., N]: whether (alive) agent n stands on each cell of int32[..., 2] ``cells``."""
    # Compare one packed integer per cell (|col| < 4096) rather than two coordinates and a reduction.
    packed = cells[..., 0] * 8192 + cells[..., 1]
    return (packed[..., None] == pos[:, 0] * 8192 + pos[:, 1]) & alive


# ------------------------------------------------------------------------------------------------
# Cheap bulk randomness
# ------------------------------------------------------------------------------------------------
# Threefry costs ~10 ns per 32-bit word on this CPU, too much for the per-cell draws of 1024 envs x
# 630 cells per step. Each step therefore draws one threefry seed (2 words) per env and expands it
# with a 32-bit integer hash (Wellons' "lowbias32" mixer) of (seed, stream, index).

_GOLDEN = np.uint32(0x9E3779B9)


def _mix32(x: jax.Array) -> jax.Array:
    """lowbias32 integer hash of uint32 ``x`` (bijective, full avalanche)."""
    x = x ^ (x >> 16)
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> 16)


def seed_from_key(key: jax.Array) -> jax.Array:
    """uint32[2] seed for :func:`hash_uniform`, from a PRNG key (one threefry draw)."""
    return jax.random.bits(key, (2,), jnp.uint32)


def hash_bits(seed: jax.Array, shape: tuple[int, ...], stream: int) -> jax.Array:
    """uint32[shape] random words from uint32[2] ``seed`` and a static ``stream`` id.

    Different streams of one seed, and different seeds, give independent-looking values.
    """
    n = int(np.prod(shape))
    base = _mix32(seed[0] ^ _mix32(seed[1] + np.uint32((stream * 0x632BE5AB) & 0xFFFFFFFF)))
    # A Weyl sequence from a per-(seed, stream) start, through one lowbias32 round (as in splitmix).
    idx = jnp.arange(n, dtype=jnp.uint32)
    return _mix32(base + idx * _GOLDEN).reshape(shape)


def hash_uniform(seed: jax.Array, shape: tuple[int, ...], stream: int) -> jax.Array:
    """float32[shape] uniforms in [0, 1) (24-bit resolution), see :func:`hash_bits`."""
    return (hash_bits(seed, shape, stream) >> 8).astype(jnp.float32) * np.float32(2.0**-24)


def unique_priority(seed: jax.Array, n: int, stream: int) -> jax.Array:
    """int32[n] distinct non-negative random priorities (19 random high bits, index in the low 12 bits):
    the maximum over any subset is unique and uniformly distributed over that subset."""
    assert n <= 4096, n
    bits = (hash_bits(seed, (n,), stream) >> 1).astype(jnp.int32) & np.int32(0x7FFFF000)
    return bits | jnp.arange(n, dtype=jnp.int32)


def hash_uniform_box(
    seed: jax.Array, shape: tuple[int, int], box: tuple[int, int, int, int], stream: int, fill: float = 1.0
) -> jax.Array:
    """float32[H, W] uniforms drawn only inside the static ``box`` = (r0, r1, c0, c1) (half-open), ``fill``
    elsewhere. Saves hashing cells that can never use the draw."""
    r0, r1, c0, c1 = box
    u = hash_uniform(seed, (r1 - r0, c1 - c0), stream)
    return jnp.pad(u, ((r0, shape[0] - r1), (c0, shape[1] - c1)), constant_values=fill)


def bounding_box(mask: np.ndarray) -> tuple[int, int, int, int]:
    """(r0, r1, c0, c1) half-open bounding box of a non-empty numpy bool mask ((0, 1, 0, 1) if empty)."""
    rows, cols = np.nonzero(mask)
    if rows.size == 0:
        return 0, 1, 0, 1
    return int(rows.min()), int(rows.max()) + 1, int(cols.min()), int(cols.max()) + 1


def random_ranks(u: jax.Array) -> jax.Array:
    """int32[N] rank of each of ``u`` (float32[N], distinct or tie-broken by index): a uniformly random
    permutation when ``u`` is i.i.d. uniform. Pairwise comparisons, no sort (cheap for small N)."""
    n = u.shape[0]
    i = jnp.arange(n)
    before = (u[None, :] < u[:, None]) | ((u[None, :] == u[:, None]) & (i[None, :] < i[:, None]))
    return jnp.sum(before, axis=1, dtype=jnp.int32)


def pick_distinct(priority: jax.Array, want: jax.Array, taken: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Agents in ``want`` take, one after another, the free candidate of highest ``priority``.

    Args:
        priority: int32[S] distinct priorities (:func:`unique_priority`: each pick is uniform among the
            free candidates).
        want: bool[N] agents that need a cell. taken: bool[S] candidates already occupied.

    Returns:
        ``(idx int32[N], ok bool[N])``: chosen candidate and whether one was free (``idx`` is 0 where not).
    """
    s = priority.shape[0]
    if want.shape[0] == 0:
        return jnp.zeros(0, jnp.int32), jnp.zeros(0, bool)
    # Closed form of the sequential picks (no 7-long dependency chain): the k-th wanting agent (in index
    # order) gets the free candidate of k-th highest priority, if there are more than k free candidates.
    free = ~taken
    order = jnp.sum((priority[None, :] > priority[:, None]) & free[None, :], axis=1, dtype=jnp.int32)  # [S]
    n = want.shape[0]
    earlier = np.tril(np.ones((n, n), bool), -1)  # [j, i]: i < j
    k = jnp.sum(want[None, :] & earlier, axis=1, dtype=jnp.int32)  # [N] wanting agents before j
    ok = want & (k < jnp.sum(free, dtype=jnp.int32))
    match = free[None, :] & (order[None, :] == k[:, None]) & ok[:, None]  # [N, S], one-hot where ok
    idx = jnp.sum(jnp.where(match, jnp.arange(s, dtype=jnp.int32), 0), axis=1, dtype=jnp.int32)
    return idx, ok


# ------------------------------------------------------------------------------------------------
# Movement (spec §1.2)
# ------------------------------------------------------------------------------------------------


def apply_turns(facing: jax.Array, actions: jax.Array, active: jax.Array) -> jax.Array:
    """New facing int32[N] after TURN_LEFT / TURN_RIGHT of the ``active`` agents (bool[N])."""
    delta = jnp.asarray(TURN_DELTA)[actions]
    return jnp.where(active, rotate(facing, delta), facing)


def move_targets(pos: jax.Array, facing: jax.Array, actions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Cell each agent's move action aims at (relative to its facing).

    Args:
        pos: int32[N, 2] (row, col).
        facing: int32[N] compass codes.
        actions: int32[N] Melting Pot action indices.

    Returns:
        ``(targets int32[N, 2], is_move bool[N])``; non-moving agents target their own cell.
    """
    rot = jnp.asarray(MOVE_ROTATION)[actions]
    is_move = rot >= 0
    step = jnp.asarray(DIRECTIONS)[rotate(facing, jnp.maximum(rot, 0))]
    return jnp.where(is_move[:, None], pos + step, pos), is_move


def resolve_moves(
    pos: jax.Array,
    targets: jax.Array,
    wants_move: jax.Array,
    alive: jax.Array,
    wall: jax.Array,
    rank: jax.Array,
) -> jax.Array:
    """Executes moves one agent at a time in order of ``rank`` (DMLab2D's sequential action queue).

    A move succeeds iff, when its turn comes, the target is on the map, not a wall and holds no alive
    agent. So two agents aiming at one free cell: the earlier one wins; following an agent into
    its old cell works only if that agent went first; head-on swaps always fail.

    Args:
        pos: int32[N, 2] positions before the moves.
        targets: int32[N, 2] target cells.
        wants_move: bool[N] agents issuing a move (already masked to alive agents).
        alive: bool[N] agents on the map (only these block).
        wall: bool[H, W] static obstacles.
        rank: int32[N] a permutation: agent a moves in turn ``rank[a]`` (0 first).

    Returns:
        int32[N, 2] positions after the moves.
    """
    n = pos.shape[0]
    wants = wants_move & ~gather_cells(wall, targets, True)

    def body(i, cur):
        me = rank == i  # one-hot over agents: whose turn it is
        tgt = jnp.sum(jnp.where(me[:, None], targets, 0), axis=0)
        free = ~jnp.any(occupied_by(tgt, cur, alive))
        go = me & wants & free
        return jnp.where(go[:, None], tgt, cur)

    # A rolled loop: its result is materialised once. Unrolled, XLA:CPU re-fuses the 7-turn select chain
    # into every consumer of the positions (beam cells, respawn occupancy, observations, ...).
    return jax.lax.fori_loop(0, n, body, pos)


def eat_apples(apples: jax.Array, pos: jax.Array, eaters: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Agents in ``eaters`` (bool[N]) standing on a live apple eat it.

    Returns:
        ``(apples bool[H, W], ate bool[N])``.
    """
    ate = eaters & gather_cells(apples, pos, False)
    return set_cells(apples, pos, ate, False), ate


# ------------------------------------------------------------------------------------------------
# Beams (spec §1.3 "Beam geometry")
# ------------------------------------------------------------------------------------------------


def beam_cells(pos: jax.Array, facing: jax.Array) -> jax.Array:
    """int32[N, 3, 3, 2]: the 9 beam cells [agent, segment (centre, left, right), step, (row, col)]."""
    dirs = jnp.asarray(DIRECTIONS)
    fwd = dirs[facing][:, None, None, :]
    right = dirs[rotate(facing, 1)][:, None, None, :]
    off = jnp.asarray(BEAM_OFFSETS)
    return pos[:, None, None, :] + off[None, ..., 0:1] * fwd + off[None, ..., 1:2] * right


def segment_reach(blocking: jax.Array) -> jax.Array:
    """bool[..., L]: cells a segment reaches; it stops at (and includes) its first blocking cell."""
    # Unrolled prefix-and (cumprod lowers to a slow reduce-window on XLA:CPU); L = 3 for the beams.
    clear = ~blocking
    reach = [jnp.ones_like(clear[..., 0])]
    for i in range(blocking.shape[-1] - 1):
        reach.append(reach[-1] & clear[..., i])
    return jnp.stack(reach, axis=-1)


def zap_beams(
    pos: jax.Array, facing: jax.Array, alive: jax.Array, firing: jax.Array, wall: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """All zap beams of one step, traced simultaneously from the given (post-move) positions.

    Each segment stops at walls / off-map cells and at the first alive agent, which is hit.

    Args:
        pos: int32[N, 2]; facing: int32[N]; alive: bool[N] agents on the map;
        firing: bool[N] agents whose zap fires this step; wall: bool[H, W].

    Returns:
        ``(hit bool[N], hits_by_shooter int32[N])``: agents hit by any beam, and how many agents each
        shooter's beam hit.
    """
    n = pos.shape[0]
    cells = beam_cells(pos, facing)  # [N, 3, 3, 2]
    # Per beam cell: wall (or off-map) from one gather, and 1 + the id of the alive agent on it from an
    # [N, 3, 3] x N comparison (no full-grid agent map).
    blocked = gather_cells(wall, cells, True)
    occ = occupied_by(cells, pos, alive)  # [N, 3, 3, N]
    who = jnp.sum(jnp.where(occ, jnp.arange(1, n + 1, dtype=jnp.int32), 0), axis=-1)
    reach = segment_reach(blocked | (who > 0)) & firing[:, None, None]
    victim = jnp.sum(jnp.where(reach, who, 0), axis=-1)  # [N, 3]: 1 + id of each segment's victim
    hits = victim[..., None] == jnp.arange(1, n + 1)  # [shooter, segment, victim]
    return jnp.any(hits, axis=(0, 1)), jnp.sum(victim > 0, axis=-1).astype(jnp.int32)


def clean_beams(
    pos: jax.Array,
    facing: jax.Array,
    firing: jax.Array,
    wall: jax.Array,
    dirt: jax.Array,
    order: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """All cleaning beams of one step, traced simultaneously.

    Each segment stops at walls / off-map cells and at its first dirty cell, which it cleans; agents,
    water and apples do not block.

    Credit: a dirty cell reached by several segments (of different shooters: one shooter's three segments
    never share a cell) is cleaned once and credited to exactly one shooter, the first in ``order``. Melting
    Pot processes the shooters one after another, so there the first beam to reach the cell cleans it and the
    later ones find it clean (the later beams then pass on through clean water; here, with simultaneous
    tracing, they stop at the cell: the simplification declared in ``envs_jax.cleanup``). The sum of
    ``cleaned_by_shooter`` is therefore the number of dirt cells cleaned this step.

    Args:
        pos: int32[N, 2] (row, col); facing: int32[N]; firing: bool[N] beams fired this step.
        wall: bool[H, W] blocking cells; dirt: bool[H, W] dirty cells before the beams.
        order: int32[N] distinct ranks, 0 = processed first (the shooter credited on a shared cell);
            None = agent index order (agent 0 first).

    Returns:
        ``(dirt bool[H, W] after cleaning, cleaned_by_shooter int32[N])``: dirt cells credited to each shooter
        (0..3, one per segment at most).
    """
    h, w = dirt.shape
    n = pos.shape[0]
    cells = beam_cells(pos, facing)  # [N, 3, 3, 2]
    seen = gather_cells(wall.astype(jnp.int8) | (dirt.astype(jnp.int8) << 1), cells, 1)  # bit 0 wall, 1 dirt
    dirty = seen >= 2
    cleaned = segment_reach(seen > 0) & dirty & firing[:, None, None]  # at most one cell per segment
    # Flat index of the cell each segment cleans (h * w = none), then one 3N-element scatter.
    flat = jnp.sum(jnp.where(cleaned, cells[..., 0] * w + cells[..., 1], 0), axis=-1)
    flat = jnp.where(jnp.any(cleaned, axis=-1), flat, h * w).reshape(-1)  # [3N], segment k = shooter k // 3
    new_dirt = dirt.reshape(-1).at[flat].set(False, mode="drop").reshape(h, w)
    # One credit per cell: segment k keeps its cell unless a segment of an earlier shooter cleans the same one.
    rank = jnp.arange(n, dtype=jnp.int32) if order is None else jnp.asarray(order, jnp.int32)
    seg_rank = jnp.repeat(rank, 3)  # [3N]
    earlier = (flat[None, :] == flat[:, None]) & (seg_rank[None, :] < seg_rank[:, None])  # [k, j]: j beats k
    credited = (flat < h * w) & ~jnp.any(earlier, axis=1)
    return new_dirt, jnp.sum(credited.reshape(n, 3), axis=1).astype(jnp.int32)


def cooldown_gate(
    timer: jax.Array, requested: jax.Array, active: jax.Array, cooldown: int
) -> tuple[jax.Array, jax.Array]:
    """Beam cooldown (spec §1.3): firing sets the timer to ``cooldown``; each active step a positive
    timer is decremented and the fire request ignored. Inactive (removed) agents' timers are frozen.

    Args:
        timer: int32[N] steps of cooldown left; requested: bool[N] fire action issued;
        active: bool[N] agents acting this step; cooldown: frames (static).

    Returns:
        ``(fires bool[N], timer int32[N])``.
    """
    fires = active & requested & (timer == 0)
    new = jnp.where(fires, cooldown, jnp.where(active, jnp.maximum(timer - 1, 0), timer))
    return fires, new.astype(jnp.int32)


def ready_to_shoot(zap_timer: jax.Array, alive: jax.Array, cooldown: int) -> jax.Array:
    """float32[N] Melting Pot ``READY_TO_SHOOT`` = max(0, 1 - timer/cooldown) while alive, 0 removed."""
    return jnp.where(alive, jnp.maximum(0.0, 1.0 - zap_timer / cooldown), 0.0).astype(jnp.float32)


# ------------------------------------------------------------------------------------------------
# Removal and respawn (spec §1.3 "Zap beam")
# ------------------------------------------------------------------------------------------------


def remove_hit(alive: jax.Array, timer: jax.Array, hit: jax.Array, removal_frames: int):
    """Removes the ``hit`` agents: alive False, timer = ``removal_frames + 1`` steps to respawn.

    With the decrement in :func:`respawn`, an agent hit in step t is absent from the observations of
    steps t … t + removal_frames and back at the end of step t + removal_frames + 1 (spec §1.3).
    """
    return alive & ~hit, jnp.where(hit, removal_frames + 1, timer).astype(jnp.int32)


def respawn(
    seed: jax.Array,
    pos: jax.Array,
    facing: jax.Array,
    alive: jax.Array,
    timer: jax.Array,
    was_removed: jax.Array,
    spawn_points: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Counts down removal timers and respawns agents whose time is up.

    Agents removed before this step (``was_removed``) decrement their timer; at 0 each is put on a
    uniformly random spawn point not occupied by an agent, with a uniformly random facing; if none is
    free it stays removed and retries next step. Several agents respawning together get distinct cells.

    Args:
        seed: uint32[2] step seed (see :func:`hash_uniform`).
        pos: int32[N, 2]; facing: int32[N]; alive: bool[N]; timer: int32[N].
        was_removed: bool[N] agents that were removed at the start of this step.
        spawn_points: int32[S, 2] candidate cells.

    Returns:
        ``(pos, facing, alive, timer)`` updated.
    """
    n = pos.shape[0]
    timer = jnp.where(was_removed, jnp.maximum(timer - 1, 0), timer).astype(jnp.int32)
    want = was_removed & (timer == 0)
    priority = unique_priority(seed, spawn_points.shape[0], stream=_STREAM_RESPAWN_CELL)
    new_facing = (hash_uniform(seed, (n,), stream=_STREAM_RESPAWN_FACING) * 4).astype(jnp.int32)
    taken = jnp.any(occupied_by(spawn_points, pos, alive), axis=-1)  # [S]
    idx, ok = pick_distinct(priority, want, taken)
    pos = jnp.where(ok[:, None], spawn_points[idx], pos)
    facing = jnp.where(ok, new_facing, facing)
    return pos, facing, alive | ok, timer


# ------------------------------------------------------------------------------------------------
# Observations
# ------------------------------------------------------------------------------------------------


def window_offsets() -> np.ndarray:
    """int32[4, 11, 11, 2]: map offset (d_row, d_col) of each window cell, per facing.

    Window cell (r, c) lies ``9 - r`` cells ahead and ``c - 5`` cells to the right of the agent.
    """
    r, c = np.meshgrid(np.arange(OBS_ROWS), np.arange(OBS_COLS), indexing="ij")
    fwd, side = OBS_AHEAD - r, c - OBS_SIDE
    out = np.zeros((4, OBS_ROWS, OBS_COLS, 2), np.int32)
    for f in range(4):
        out[f] = fwd[..., None] * DIRECTIONS[f] + side[..., None] * DIRECTIONS[(f + 1) % 4]
    return out


_WINDOW_OFFSETS = window_offsets()


def _window_slicing() -> tuple[np.ndarray, np.ndarray]:
    """Per facing, the window as a rotated 11x11 map block: (block origin offset int32[4, 2], quarter
    rotations int32[4]) with ``window = rot90(map[origin : origin + 11, ...], k)``."""
    origin = _WINDOW_OFFSETS.min(axis=(1, 2))
    probe = np.arange(OBS_ROWS * OBS_COLS).reshape(OBS_ROWS, OBS_COLS)
    ks = np.zeros(4, np.int32)
    for f in range(4):
        idx = _WINDOW_OFFSETS[f] - origin[f]
        want = probe[idx[..., 0], idx[..., 1]]
        ks[f] = next(k for k in range(4) if np.array_equal(np.rot90(probe, k), want))
    return origin.astype(np.int32), ks


_BLOCK_ORIGIN, _BLOCK_ROT = _window_slicing()


def cell_codes(
    static_bits: jax.Array,
    apples: jax.Array,
    dirt: jax.Array | None,
    pos: jax.Array,
    facing: jax.Array,
    alive: jax.Array,
) -> jax.Array:
    """uint8[H, W] per-cell observation code: static bits | apple | dirt | (1 + facing of agent) << 5."""
    code = static_bits | (apples.astype(jnp.uint8) << BIT_APPLE)
    if dirt is not None:
        code = code | (dirt.astype(jnp.uint8) << BIT_DIRT)
    agent_bits = ((facing + 1) << AGENT_SHIFT).astype(jnp.uint8)
    h, w = code.shape
    flat = jnp.where(alive, pos[:, 0] * w + pos[:, 1], h * w)
    return code.reshape(-1).at[flat].add(agent_bits, mode="drop").reshape(h, w)


_CENTRE_BIT = np.zeros((OBS_ROWS, OBS_COLS), np.int32)
_CENTRE_BIT[OBS_SELF_CELL] = 1 << 10
_OBS_TABLES: dict[tuple[int, ...], np.ndarray] = {}


def _obs_table(bit_layers: tuple[int, ...]) -> np.ndarray:
    """uint8[2049, len(bit_layers) + 6]: the observation layers of one window cell, indexed by
    ``code | observer_facing << 8 | is_centre << 10`` (see :func:`egocentric_obs`); row 2048 is all zero
    (removed observer)."""
    if bit_layers not in _OBS_TABLES:
        nb = len(bit_layers)
        i = np.arange(2048)
        code, own, centre = i & 0xFF, (i >> 8) & 3, (i >> 10) & 1
        agent = code >> AGENT_SHIFT  # 0 none, else 1 + facing
        other = (agent > 0) & (centre == 0)
        rel = (agent + 3 - own) & 3  # the other's facing seen in the observer's rotated frame
        table = np.zeros((2049, nb + 6), np.uint8)
        for li, b in enumerate(bit_layers):
            table[:2048, li] = (code >> b) & 1
        table[:2048, nb] = centre
        table[:2048, nb + 1] = other
        for k in range(4):
            table[:2048, nb + 2 + k] = other & (rel == k)
        _OBS_TABLES[bit_layers] = table
    return _OBS_TABLES[bit_layers]


def egocentric_obs(
    code: jax.Array, pos: jax.Array, facing: jax.Array, alive: jax.Array, bit_layers: Sequence[int]
) -> jax.Array:
    """Symbolic egocentric observations (see :func:`egocentric_obs_list`, stacked).

    Args:
        code: uint8[H, W] from :func:`cell_codes`.
        pos: int32[N, 2]; facing: int32[N]; alive: bool[N].
        bit_layers: code bits to expose as the first layers (e.g. wall, apple, dirt, ...).

    Returns:
        uint8[N, 11, 11, len(bit_layers) + 6], 0/1. Layers: the ``bit_layers``, then ``self``, ``other``
        (another agent), ``other_facing_up/right/down/left`` (its facing in the rotated frame).
        Off-map cells have the wall bit. All zeros for removed agents.
    """
    return jnp.stack(egocentric_obs_list(code, pos, facing, alive, bit_layers))


def egocentric_obs_list(
    code: jax.Array, pos: jax.Array, facing: jax.Array, alive: jax.Array, bit_layers: Sequence[int]
) -> list[jax.Array]:
    """:func:`egocentric_obs` as a list of N arrays uint8[11, 11, C], one per agent (each written by its
    own table lookup, with no stacked copy to slice)."""
    table = jnp.asarray(_obs_table(tuple(int(b) for b in bit_layers)))
    padded = jnp.pad(code, PAD, constant_values=np.uint8(1 << BIT_WALL))
    origin = pos + PAD + jnp.asarray(_BLOCK_ORIGIN)[facing]
    rots = jnp.asarray(_BLOCK_ROT)[facing]
    centre = jnp.asarray(_CENTRE_BIT)

    # 1. Per agent, one table-row index per window cell: the window is an 11x11 block of the padded map
    # (a slice), rotated to the agent's facing; index = code | facing << 8 | is-centre << 10 (2048 if
    # removed). Built in a rolled loop so that the index array is materialised once: otherwise XLA:CPU
    # fuses its whole computation into the table lookup and redoes it for every one of the C layers.
    def one(a, idx):
        block = jax.lax.dynamic_slice(padded, (origin[a, 0], origin[a, 1]), (OBS_ROWS, OBS_COLS))
        win = block
        for k in range(1, 4):
            win = jnp.where(rots[a] == k, jnp.rot90(block, k), win)
        row = jnp.where(alive[a], win.astype(jnp.int32) | (facing[a] << 8) | centre, 2048)
        return jax.lax.dynamic_update_index_in_dim(idx, row.astype(jnp.uint16), a, 0)

    n = pos.shape[0]
    idx = jax.lax.fori_loop(0, n, one, jnp.zeros((n, OBS_ROWS, OBS_COLS), jnp.uint16))
    # 2. Every layer of a cell from one table row.
    return [table.at[idx[a]].get(mode="promise_in_bounds") for a in range(n)]


# ------------------------------------------------------------------------------------------------
# State and environment shell
# ------------------------------------------------------------------------------------------------


@struct.dataclass
class MeltingPotState:
    """Fields shared by both games. N agents, map H x W. "This step" = the step that produced the state.

    Attributes:
        pos: int32[N, 2] (row, col) of each agent; while removed, the cell it was removed from.
        facing: int32[N] compass code N=0, E=1, S=2, W=3.
        alive: bool[N] on the map (False while removed by a zap).
        removal_timer: int32[N] steps until a removed agent tries to respawn (0 while alive).
        zap_cooldown: int32[N] steps before the zap can fire again (frozen while removed).
        apples: bool[H, W] live apples.
        step: int32 completed steps this episode.
        done: bool episode over (``step >= max_steps``).
        ate: int32[N] apples eaten this step (= this step's reward).
        zap_fired: bool[N] the agent's zap beam fired this step.
        zap_hits: int32[N] agents this agent's beam removed this step.
        zapped: bool[N] the agent was removed this step.
        respawned: bool[N] the agent came back this step.
        apples_total: int32[N] apples eaten this episode.
        zap_hits_total: int32[N] agents removed by this agent this episode.
        removed_steps_total: int32[N] steps this episode at whose end the agent was removed.
    """

    pos: jax.Array
    facing: jax.Array
    alive: jax.Array
    removal_timer: jax.Array
    zap_cooldown: jax.Array
    apples: jax.Array
    step: jax.Array
    done: jax.Array
    ate: jax.Array
    zap_fired: jax.Array
    zap_hits: jax.Array
    zapped: jax.Array
    respawned: jax.Array
    apples_total: jax.Array
    zap_hits_total: jax.Array
    removed_steps_total: jax.Array


def initial_agent_fields(pos: jax.Array, facing: jax.Array) -> dict[str, jax.Array]:
    """The :class:`MeltingPotState` agent fields at reset, for agents at ``pos`` facing ``facing``."""
    n = pos.shape[0]
    zi, zb = jnp.zeros(n, jnp.int32), jnp.zeros(n, bool)
    return dict(
        pos=pos.astype(jnp.int32),
        facing=facing.astype(jnp.int32),
        alive=jnp.ones(n, bool),
        removal_timer=zi,
        zap_cooldown=zi,
        step=jnp.int32(0),
        done=jnp.bool_(False),
        ate=zi,
        zap_fired=zb,
        zap_hits=zi,
        zapped=zb,
        respawned=zb,
        apples_total=zi,
        zap_hits_total=zi,
        removed_steps_total=zi,
    )


def agent_phase(
    seed: jax.Array,
    state: MeltingPotState,
    actions: jax.Array,
    apples: jax.Array,
    wall: jax.Array,
    zap_cooldown: int,
    removal_frames: int,
) -> tuple[dict[str, jax.Array], jax.Array, jax.Array, jax.Array]:
    """Phases 2–3a of a step (spec §1.3): turns and moves in random order with eating, then zaps.

    Args:
        seed: uint32[2] step seed (move order).
        state: state at the start of the step.
        actions: int32[N] action indices.
        apples: bool[H, W] apples after this step's phase-1 growth.
        wall: bool[H, W].
        zap_cooldown, removal_frames: game constants (static).

    Returns:
        ``(fields, apples, ate bool[N], active bool[N])``: updated agent fields for ``state.replace``
        (pos, facing, alive, removal_timer, zap_cooldown, zap_fired, zap_hits, zapped), apples after
        eating, who ate on entry, and who was acting (alive at the start of the step).
    """
    n = state.pos.shape[0]
    active = state.alive
    rank = random_ranks(hash_uniform(seed, (n,), stream=_STREAM_MOVE_ORDER))
    targets, is_move = move_targets(state.pos, state.facing, actions)
    pos = resolve_moves(state.pos, targets, is_move & active, active, wall, rank)
    facing = apply_turns(state.facing, actions, active)
    # Materialise positions: otherwise XLA fuses the 7-turn move chain into every beam-cell consumer.
    pos, facing = jax.lax.optimization_barrier((pos, facing))
    moved = jnp.any(pos != state.pos, axis=-1)
    apples, ate = eat_apples(apples, pos, moved)
    fires, zap_timer = cooldown_gate(state.zap_cooldown, actions == FIRE_ZAP, active, zap_cooldown)
    hit, hits_by = zap_beams(pos, facing, active, fires, wall)
    alive, timer = remove_hit(active, state.removal_timer, hit, removal_frames)
    fields = dict(
        pos=pos,
        facing=facing,
        alive=alive,
        removal_timer=timer,
        zap_cooldown=zap_timer,
        zap_fired=fires,
        zap_hits=hits_by,
        zapped=hit,
    )
    return fields, apples, ate, active


def respawn_phase(
    seed: jax.Array,
    state: MeltingPotState,
    fields: dict[str, jax.Array],
    ate: jax.Array,
    spawn_points: jax.Array,
) -> dict[str, jax.Array]:
    """Phase 4 (respawns) plus the per-step and per-episode agent bookkeeping.

    Args:
        seed: uint32[2] step seed. state: state at the start of the step. fields: from :func:`agent_phase`.
        ate: int32[N] apples eaten this step. spawn_points: int32[S, 2] respawn cells.

    Returns:
        All :class:`MeltingPotState` agent fields plus ``step`` and ``ate``, for ``state.replace``.
    """
    pos, facing, alive, timer = respawn(
        seed, fields["pos"], fields["facing"], fields["alive"], fields["removal_timer"], ~state.alive, spawn_points
    )
    out = dict(fields)
    out.update(
        pos=pos,
        facing=facing,
        alive=alive,
        removal_timer=timer,
        step=state.step + 1,
        ate=ate,
        respawned=alive & ~fields["alive"],
        apples_total=state.apples_total + ate,
        zap_hits_total=state.zap_hits_total + fields["zap_hits"],
        removed_steps_total=state.removed_steps_total + (~alive).astype(jnp.int32),
    )
    return out


def check_num_agents(num_agents, *, default: int, substrate: str, custom_map: bool) -> int:
    """``num_agents`` as an int, checked against the substrate's player count.

    Args:
        num_agents: the requested number of players.
        default: the substrate's number of players (Melting Pot's substrate config, e.g. 7).
        substrate: Melting Pot's substrate name, for the message.
        custom_map: a test map is used (then any count is allowed here; the map's spawn points decide).

    Raises:
        ValueError: ``num_agents`` is not an integer, or differs from ``default`` on the real map.
    """
    if isinstance(num_agents, bool) or not isinstance(num_agents, (int, np.integer)):
        raise ValueError(f"num_agents must be an integer, got {num_agents!r}")
    if not custom_map and num_agents != default:
        raise ValueError(f"num_agents must be {default} for {substrate}, got {num_agents}")
    return int(num_agents)


class MeltingPotEnv(MultiAgentEnv):
    """JaxMARL shell shared by :class:`envs_jax.cleanup.Cleanup` and :class:`envs_jax.harvest.CommonsHarvest`.

    Subclasses set ``num_actions``, ``bit_layers``, ``layer_names`` and implement ``reset_state(key)`` and
    ``step_state(key, state, actions int32[N]) -> state`` (which fills ``state.ate``).
    """

    num_actions: int = 8
    bit_layers: tuple[int, ...] = ()
    layer_names: tuple[str, ...] = ()
    zap_cooldown_frames: int = 1

    def __init__(self, num_agents: int, max_steps: int):
        if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps <= 0:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        super().__init__(num_agents=num_agents)
        self.max_steps = int(max_steps)
        self.obs_shape = (OBS_ROWS, OBS_COLS, len(self.layer_names))
        for a in self.agents:
            self.action_spaces[a] = Discrete(self.num_actions)
            self.observation_spaces[a] = Box(0, 1, self.obs_shape, jnp.uint8)

    # -- subclass hooks ------------------------------------------------------------------------
    def reset_state(self, key: jax.Array) -> MeltingPotState:
        raise NotImplementedError

    def step_state(self, key: jax.Array, state: MeltingPotState, actions: jax.Array) -> MeltingPotState:
        raise NotImplementedError

    def cell_code_grid(self, state: MeltingPotState) -> jax.Array:
        raise NotImplementedError

    def render_codes(self, state: MeltingPotState) -> jax.Array:
        raise NotImplementedError

    # -- JaxMARL API ---------------------------------------------------------------------------
    def _actions_array(self, actions) -> jax.Array:
        if isinstance(actions, dict):
            actions = jnp.stack([jnp.asarray(actions[a]) for a in self.agents])
        return jnp.asarray(actions).astype(jnp.int32).reshape(self.num_agents)

    @partial(jax.jit, static_argnums=(0,))
    def reset(self, key: jax.Array):
        """Returns ``(obs dict agent -> uint8[11, 11, C], state)``."""
        state = self.reset_state(key)
        return self.get_obs(state), state

    def _transition(self, key, state, actions):
        nxt = self.step_state(key, state, self._actions_array(actions))
        done = nxt.step >= self.max_steps
        nxt = nxt.replace(done=done)
        rewards = {a: nxt.ate[i].astype(jnp.float32) for i, a in enumerate(self.agents)}
        dones = {a: done for a in self.agents}
        dones["__all__"] = done
        infos = {"ready_to_shoot": ready_to_shoot(nxt.zap_cooldown, nxt.alive, self.zap_cooldown_frames)}
        return nxt, rewards, dones, infos

    @partial(jax.jit, static_argnums=(0,))
    def step(self, key: jax.Array, state: MeltingPotState, actions, reset_state=None):
        """One joint step with automatic reset at the horizon.

        Unlike the JaxMARL base class, observations are computed once, from the selected state.

        Args:
            key: PRNG key.
            state: current state.
            actions: dict agent -> int action (or int32[N]).
            reset_state: optional state to reset to when the episode ends.

        Returns:
            ``(obs, state, rewards, dones, infos)``: obs dict of uint8[11, 11, C]; rewards dict of
            float32; dones dict of bool incl. ``"__all__"``; infos ``{"ready_to_shoot": float32[N]}``.
            On the last step, rewards/dones/infos are the final step's, obs/state the reset ones.
        """
        key, key_reset = jax.random.split(key)
        nxt, rewards, dones, infos = self._transition(key, state, actions)
        if reset_state is None:
            reset_state = self.reset_state(key_reset)
        out = jax.tree.map(lambda r, s: jax.lax.select(dones["__all__"], r, s), reset_state, nxt)
        return self.get_obs(out), out, rewards, dones, infos

    def step_env(self, key, state, actions):
        """Step without auto-reset (JaxMARL hook); same outputs as :meth:`step`."""
        nxt, rewards, dones, infos = self._transition(key, state, actions)
        return self.get_obs(nxt), nxt, rewards, dones, infos

    def obs_array(self, state: MeltingPotState) -> jax.Array:
        """uint8[N, 11, 11, C] observations (layers ``self.layer_names``)."""
        code = self.cell_code_grid(state)
        return egocentric_obs(code, state.pos, state.facing, state.alive, self.bit_layers)

    def get_obs(self, state: MeltingPotState) -> dict[str, jax.Array]:
        """dict agent -> uint8[11, 11, C]; see :meth:`obs_array`."""
        code = self.cell_code_grid(state)
        obs = egocentric_obs_list(code, state.pos, state.facing, state.alive, self.bit_layers)
        return dict(zip(self.agents, obs))

    def ready_to_shoot(self, state: MeltingPotState) -> jax.Array:
        """float32[N] Melting Pot's ``READY_TO_SHOOT`` observation."""
        return ready_to_shoot(state.zap_cooldown, state.alive, self.zap_cooldown_frames)

    def get_avail_actions(self, state: MeltingPotState) -> dict[str, jax.Array]:
        """Every action is always available (invalid ones are no-ops), bool[num_actions] per agent."""
        return {a: jnp.ones(self.num_actions, bool) for a in self.agents}

    @property
    def agent_classes(self) -> dict:
        return {"avatar": list(self.agents)}

    def map_layers(self) -> dict[str, np.ndarray]:
        """The map's static layers by name (what the run files keep so no reader builds an env):
        ``wall`` and ``apple_capable`` (``bool[H, W]``); Clean Up adds ``water`` (its river), Harvest
        ``patch_id`` (``int32[H, W]``, patch 0..P-1, -1 elsewhere)."""
        return {"wall": self.wall, "apple_capable": self.apple_capable}

    def legend(self) -> list[tuple[str, tuple[int, int, int]]]:
        """``[(label, rgb)]`` of every colour :meth:`render` paints, in palette order: the
        :data:`PALETTE_BASE_NAMES` (without river and dirt on a map with no water, e.g. Harvest), then agent i's
        colour as ``a<i>``."""
        n = int(self.num_agents)
        agents = np.resize(PALETTE_AGENTS, (n, 3))
        out = [(nm, tuple(int(c) for c in PALETTE_BASE[k])) for k, nm in enumerate(PALETTE_BASE_NAMES)]
        if not bool(np.asarray(self.map_layers().get("water", np.zeros(1, bool))).any()):
            out = [o for o in out if o[0] not in ("river", "dirt")]
        return out + [(f"a{i}", tuple(int(c) for c in agents[i])) for i in range(n)]

    def render(self, state: MeltingPotState) -> jax.Array:
        """uint8[H*8, W*8, 3] picture of the whole map (agents in Melting Pot's player colours)."""
        palette = jnp.asarray(
            np.concatenate(
                [
                    PALETTE_BASE,
                    PALETTE_AGENTS[: self.num_agents]
                    if self.num_agents <= len(PALETTE_AGENTS)
                    else np.resize(PALETTE_AGENTS, (self.num_agents, 3)),
                ]
            )
        )
        codes = self.render_codes(state)
        h, w = codes.shape
        flat = jnp.where(state.alive, state.pos[:, 0] * w + state.pos[:, 1], h * w)
        agent_codes = len(PALETTE_BASE) + jnp.arange(self.num_agents, dtype=jnp.int32)
        codes = codes.reshape(-1).at[flat].set(agent_codes, mode="drop").reshape(h, w)
        return paint(codes, palette, CELL_PX)
