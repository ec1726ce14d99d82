"""Clean Up: a JAX port of Melting Pot 2.4.1 ``clean_up``.

Reproduces ``meltingpot/configs/substrates/clean_up.py`` (map, prefabs, action set) with the rules of
``meltingpot/lua/levels/clean_up/components.lua`` (river monitor, dirt spawner, apple growth) and the avatar
rules of ``meltingpot/lua/modules/avatar_library.lua`` / ``component_library.lua``, as written down in
``docs/environments.md`` §1 (map §1.1, agents §1.2, dynamics §1.3, episode §1.4).

Order of events in step t (spec §1.3):
  1. dirt spawn (t >= 51, w.p. 0.5) and apple growth, both from the dirt count at the end of step t-1;
     an apple that grows under a standing agent is eaten by it at once;
  2. turns and moves, one agent at a time in a fresh uniformly random order; entering an apple eats it;
  3. all zap beams, then all cleaning beams, from post-move positions (every fired beam takes effect,
     even if its shooter is zapped in the same step);
  4. respawn of agents whose removal time is up.

Declared simplifications (spec §5 "acceptable simplifications" and others):
  * symbolic one-hot egocentric observations instead of RGB (same 11x11 window, see ``envs_jax.meltingpot``);
  * fixed horizon ``max_steps`` (default 150, the target paper's), no stochastic ending;
  * beams of one kind are traced simultaneously (Melting Pot processes shooters one after another): two
    cleaning beams reaching the same dirty cell both stop there; an agent hit by two zaps is removed once.
    Such a cell is cleaned once and credited (``cleaned``) to one shooter only, the first in a uniformly random
    order drawn each step, as the engine's one-after-another processing credits the first beam to reach it
    (``envs_jax.meltingpot.clean_beams``).

State: :class:`CleanupState` (agent positions, facings, alive flags, removal timers, cooldowns, dirt and
apple grids, per-step records such as ``cleaned``/``zap_hits``/``zapped`` and per-episode totals).

Observation layers (uint8[11, 11, 11]): ``wall`` (incl. off-map), ``apple``, ``dirt``, ``river`` (any
water cell), ``grass`` (apple-capable), ``self``, ``other``, ``other_facing_up/right/down/left``.
``infos["ready_to_shoot"]`` gives Melting Pot's ``READY_TO_SHOOT``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.meltingpot import (
    BIT_APPLE,
    BIT_DIRT,
    BIT_GRASS,
    BIT_RIVER,
    BIT_WALL,
    CODE_APPLE,
    CODE_DIRT,
    CODE_FLOOR,
    CODE_GRASS,
    CODE_RIVER,
    CODE_WALL,
    FIRE_CLEAN,
    STREAM_GAME,
    MeltingPotEnv,
    MeltingPotState,
    agent_phase,
    bounding_box,
    cell_codes,
    cells_of,
    check_num_agents,
    clean_beams,
    cooldown_gate,
    eat_apples,
    hash_uniform,
    initial_agent_fields,
    parse_ascii_map,
    pick_distinct,
    random_ranks,
    respawn_phase,
    seed_from_key,
    unique_priority,
)

# ------------------------------------------------------------------------------------------------
# Constants (spec §1; clean_up.py unless noted)
# ------------------------------------------------------------------------------------------------

# clean_up.py ASCII_MAP, 21 x 30 (spec §1.1).
ASCII_MAP = """
WWWWWWWWWWWWWWWWWWWWWWWWWWWWWW
WHFFFHFFHFHFHFHFHFHFHHFHFFFHFW
WHFHFHFFHFHFHFHFHFHFHHFHFFFHFW
WHFFHFFHHFHFHFHFHFHFHHFHFFFHFW
WHFHFHFFHFHFHFHFHFHFHHFHFFFHFW
WHFFFFFFHFHFHFHFHFHFHHFHFFFHFW
W==============+~FHHHHHHf====W
W   P    P      ===+~SSf     W
W     P     P   P  <~Sf  P   W
W             P   P<~S>      W
W   P    P         <~S>   P  W
W               P  <~S>P     W
W     P           P<~S>      W
W           P      <~S> P    W
W  P             P <~S>      W
W^T^T^T^T^T^T^T^T^T;~S,^T^T^TW
WBBBBBBBBBBBBBBBBBBBssBBBBBBBW
WBBBBBBBBBBBBBBBBBBBBBBBBBBBBW
WBBBBBBBBBBBBBBBBBBBBBBBBBBBBW
WBBBBBBBBBBBBBBBBBBBBBBBBBBBBW
WWWWWWWWWWWWWWWWWWWWWWWWWWWWWW
"""
# Character classes of clean_up.py CHAR_PREFAB_MAP (spec §1.1 legend).
WALL_CHARS = "W"
DIRTY_AT_RESET_CHARS = "F"  # river, dirty at reset
DIRT_CAPABLE_CHARS = "FH"  # "potential dirt" river cells (147 on the real map)
WATER_CHARS = "FHS~"  # every water cell (S, ~ never hold dirt)
APPLE_CAPABLE_CHARS = "BT"  # "potential apple" grass (122 on the real map)
SPAWN_CHARS = "P"  # spawn points (19)

NUM_AGENTS = 7  # clean_up.py default number of players
NUM_ACTIONS = 9  # clean_up.py ACTION_SET (incl. FIRE_CLEAN)
DEFAULT_MAX_STEPS = 150  # target paper's horizon (spec §1.4)

ZAP_COOLDOWN = 10  # avatar "Zapper" cooldownTime (spec §1.3)
ZAP_REMOVAL_FRAMES = 50  # "Zapper" framesTillRespawn (spec §1.3)
CLEAN_COOLDOWN = 2  # "Cleaner" cooldownTime (spec §1.3)

DIRT_SPAWN_START_STEP = 51  # first 1-based step at which dirt may spawn (spec §1.3, measured)
DIRT_SPAWN_PROB = 0.5  # "DirtSpawner" dirtSpawnProbability (spec §1.3)

MAX_APPLE_GROWTH_RATE = 0.05  # "AppleGrowth" maxAppleGrowthRate (spec §1.3)
THRESHOLD_DEPLETION = 0.4  # thresholdDepletion: no growth at dirt fraction >= 0.4
THRESHOLD_RESTORATION = 0.0  # thresholdRestoration: full growth rate at dirt fraction 0

# hash_uniform stream ids of this game's draws (see envs_jax.meltingpot).
_STREAM_GROW, _STREAM_DIRT_COIN, _STREAM_DIRT_CELL, _STREAM_RESET_CELL, _STREAM_RESET_FACING = (
    STREAM_GAME + i for i in range(5)
)
# The shooters' processing order for the credit of a dirt cell two beams reach (clean_beams); its own stream,
# so no other draw changes.
_STREAM_CLEAN_ORDER = STREAM_GAME + 5

LAYER_NAMES = (
    "wall",
    "apple",
    "dirt",
    "river",
    "grass",
    "self",
    "other",
    "other_facing_up",
    "other_facing_right",
    "other_facing_down",
    "other_facing_left",
)


# ------------------------------------------------------------------------------------------------
# Pure dynamics
# ------------------------------------------------------------------------------------------------


def apple_growth_probability(num_dirty: jax.Array, num_dirt_cells: int) -> jax.Array:
    """Per-cell, per-step apple growth probability p(d) (spec §1.3 "Apple growth").

    p(d) = 0.05 * min(1, (d - 0.4) / (0 - 0.4)), 0 if that is <= 0, with d = num_dirty / num_dirt_cells.

    Args:
        num_dirty: int scalar, dirty cells at the end of the previous step.
        num_dirt_cells: dirt-capable cells (147 on the real map).

    Returns:
        float32 scalar probability.
    """
    d = num_dirty / num_dirt_cells
    frac = (d - THRESHOLD_DEPLETION) / (THRESHOLD_RESTORATION - THRESHOLD_DEPLETION)
    return (MAX_APPLE_GROWTH_RATE * jnp.clip(frac, 0.0, 1.0)).astype(jnp.float32)


def spawn_dirt(
    seed: jax.Array,
    dirt: jax.Array,
    dirt_capable: jax.Array,
    allowed: jax.Array,
    box: tuple[int, int, int, int] | None = None,
) -> jax.Array:
    """With probability 0.5 (if ``allowed``), one uniformly chosen clean dirt-capable cell turns dirty.

    Args:
        seed: uint32[2] step seed. dirt: bool[H, W]. dirt_capable: bool[H, W]. allowed: bool scalar (t >= 51).
        box: static (r0, r1, c0, c1) holding every dirt-capable cell (default: the whole map).

    Returns:
        bool[H, W] dirt.
    """
    r0, r1, c0, c1 = box if box is not None else (0, dirt.shape[0], 0, dirt.shape[1])
    clean = dirt_capable[r0:r1, c0:c1] & ~dirt[r0:r1, c0:c1]
    priority = jnp.where(clean, unique_priority(seed, clean.size, _STREAM_DIRT_CELL).reshape(clean.shape), -1)
    pick = clean & (priority == jnp.max(priority))  # max + compare: argmax is slow on XLA:CPU
    on = allowed & (hash_uniform(seed, (), _STREAM_DIRT_COIN) < DIRT_SPAWN_PROB)
    return dirt.at[r0:r1, c0:c1].set(dirt[r0:r1, c0:c1] | (pick & on))


@struct.dataclass
class CleanupState(MeltingPotState):
    """Clean Up state: the :class:`envs_jax.meltingpot.MeltingPotState` fields plus

    Attributes:
        dirt: bool[H, W] dirty river cells.
        clean_cooldown: int32[N] steps before the cleaning beam can fire again (frozen while removed).
        clean_fired: bool[N] the agent's cleaning beam fired this step.
        cleaned: int32[N] dirt cells credited to this agent's beam this step (a cell two beams reach counts
            once, for one shooter: ``clean_beams``), so ``cleaned.sum()`` = dirt cells cleaned this step.
        cleaned_total: int32[N] dirt cells cleaned by this agent this episode.
    """

    dirt: jax.Array
    clean_cooldown: jax.Array
    clean_fired: jax.Array
    cleaned: jax.Array
    cleaned_total: jax.Array


class Cleanup(MeltingPotEnv):
    """Melting Pot ``clean_up`` as a JaxMARL ``MultiAgentEnv`` (7 agents, 9 actions, fixed horizon).

    Args:
        max_steps: episode length in steps (default 150).
        num_agents: number of players; must be 7 on the real map (other values only with ``ascii_map``).
        ascii_map: a custom map in the same legend, for tests only; ``None`` = Melting Pot's map.

    Raises:
        ValueError: ``max_steps <= 0``, a bad ``num_agents``, or a malformed map.
    """

    num_actions = NUM_ACTIONS
    bit_layers = (BIT_WALL, BIT_APPLE, BIT_DIRT, BIT_RIVER, BIT_GRASS)
    layer_names = LAYER_NAMES
    zap_cooldown_frames = ZAP_COOLDOWN

    def __init__(self, max_steps: int = DEFAULT_MAX_STEPS, num_agents: int = NUM_AGENTS, ascii_map: str | None = None):
        chars = parse_ascii_map(ASCII_MAP if ascii_map is None else ascii_map)
        spawns = cells_of(chars, SPAWN_CHARS)
        num_agents = check_num_agents(
            num_agents, default=NUM_AGENTS, substrate="clean_up", custom_map=ascii_map is not None
        )
        if not 1 <= num_agents <= len(spawns):
            raise ValueError(f"num_agents={num_agents} needs 1..{len(spawns)} (the map's spawn points)")
        super().__init__(num_agents=num_agents, max_steps=max_steps)
        self.ascii_map = chars
        self.height, self.width = chars.shape
        self.wall = np.isin(chars, list(WALL_CHARS))
        self.dirt_capable = np.isin(chars, list(DIRT_CAPABLE_CHARS))
        self.dirt_at_reset = np.isin(chars, list(DIRTY_AT_RESET_CHARS))
        self.apple_capable = np.isin(chars, list(APPLE_CAPABLE_CHARS))
        self.water = np.isin(chars, list(WATER_CHARS))
        self.spawn_points = spawns
        self._apple_box = bounding_box(self.apple_capable)
        self._dirt_box = bounding_box(self.dirt_capable)
        self.num_dirt_cells = max(int(self.dirt_capable.sum()), 1)
        self.static_bits = (
            (self.wall.astype(np.uint8) << BIT_WALL)
            | (self.water.astype(np.uint8) << BIT_RIVER)
            | (self.apple_capable.astype(np.uint8) << BIT_GRASS)
        )

    def map_layers(self) -> dict[str, np.ndarray]:
        """:meth:`MeltingPotEnv.map_layers` plus ``water`` (the river, ``bool[H, W]``)."""
        return {**super().map_layers(), "water": self.water}

    # -- reset / step ----------------------------------------------------------------------------
    def reset_state(self, key: jax.Array) -> CleanupState:
        """Agents on distinct uniformly random spawn points, uniformly random facing; 79 dirt, 0 apples."""
        seed = seed_from_key(key)
        n, s = self.num_agents, len(self.spawn_points)
        idx, _ = pick_distinct(unique_priority(seed, s, _STREAM_RESET_CELL), jnp.ones(n, bool), jnp.zeros(s, bool))
        pos = jnp.asarray(self.spawn_points)[idx]
        facing = (hash_uniform(seed, (n,), _STREAM_RESET_FACING) * 4).astype(jnp.int32)
        zi, zb = jnp.zeros(n, jnp.int32), jnp.zeros(n, bool)
        return CleanupState(
            **initial_agent_fields(pos, facing),
            apples=jnp.zeros((self.height, self.width), bool),
            dirt=jnp.asarray(self.dirt_at_reset),
            clean_cooldown=zi,
            clean_fired=zb,
            cleaned=zi,
            cleaned_total=zi,
        )

    def step_state(self, key: jax.Array, state: CleanupState, actions: jax.Array) -> CleanupState:
        """One step of Clean Up (spec §1.3) without auto-reset. ``actions``: int32[N]."""
        seed = seed_from_key(key)
        wall = jnp.asarray(self.wall)
        t = state.step + 1  # 1-based index of this step

        # 1. Dirt spawn and apple growth from the dirt count at the end of step t-1.
        p = apple_growth_probability(jnp.sum(state.dirt), self.num_dirt_cells)
        r0, r1, c0, c1 = self._apple_box  # draws only inside the apple-capable bounding box
        u = hash_uniform(seed, (r1 - r0, c1 - c0), _STREAM_GROW)
        grow = jnp.asarray(self.apple_capable[r0:r1, c0:c1]) & (u < p)
        apples = state.apples.at[r0:r1, c0:c1].set(state.apples[r0:r1, c0:c1] | grow)
        dirt = spawn_dirt(seed, state.dirt, jnp.asarray(self.dirt_capable), t >= DIRT_SPAWN_START_STEP, self._dirt_box)
        apples, ate_standing = eat_apples(apples, state.pos, state.alive)

        # 2.-3a. Turns and moves in random order (eating on entry), then all zap beams.
        fields, apples, ate_moving, active = agent_phase(
            seed, state, actions, apples, wall, ZAP_COOLDOWN, ZAP_REMOVAL_FRAMES
        )

        # 3b. All cleaning beams, from post-move positions; shooters zapped this step still clean.
        fires, clean_timer = cooldown_gate(state.clean_cooldown, actions == FIRE_CLEAN, active, CLEAN_COOLDOWN)
        order = random_ranks(hash_uniform(seed, (state.pos.shape[0],), _STREAM_CLEAN_ORDER))
        dirt, cleaned = clean_beams(fields["pos"], fields["facing"], fires, wall, dirt, order)

        # 4. Respawns.
        ate = ate_standing.astype(jnp.int32) + ate_moving.astype(jnp.int32)
        fields = respawn_phase(seed, state, fields, ate, jnp.asarray(self.spawn_points))
        return state.replace(
            **fields,
            apples=apples,
            dirt=dirt,
            clean_cooldown=clean_timer,
            clean_fired=fires,
            cleaned=cleaned,
            cleaned_total=state.cleaned_total + cleaned,
        )

    # -- observation / render / stats ------------------------------------------------------------
    def cell_code_grid(self, state: CleanupState) -> jax.Array:
        """uint8[H, W] observation codes (see ``envs_jax.meltingpot.cell_codes``)."""
        return cell_codes(jnp.asarray(self.static_bits), state.apples, state.dirt, state.pos, state.facing, state.alive)

    def render_codes(self, state: CleanupState) -> jax.Array:
        """int32[H, W] palette codes without agents."""
        code = np.full(self.ascii_map.shape, CODE_FLOOR, np.int32)
        code[self.water] = CODE_RIVER
        code[self.apple_capable] = CODE_GRASS
        code[self.wall] = CODE_WALL
        code = jnp.where(state.dirt, CODE_DIRT, jnp.asarray(code))
        return jnp.where(state.apples, CODE_APPLE, code)

    def world_stats(self, state: CleanupState) -> dict[str, jax.Array]:
        """Named scalars: ``apples``, ``dirt`` (dirty cells), ``avatars_alive`` (all int32)."""
        return {
            "apples": jnp.sum(state.apples, dtype=jnp.int32),
            "dirt": jnp.sum(state.dirt, dtype=jnp.int32),
            "avatars_alive": jnp.sum(state.alive, dtype=jnp.int32),
        }

    def num_others_who_cleaned(self, state: CleanupState) -> jax.Array:
        """int32[N] Melting Pot's ``NUM_OTHERS_WHO_CLEANED_THIS_STEP``."""
        did = (state.cleaned > 0).astype(jnp.int32)
        return jnp.sum(did) - did
