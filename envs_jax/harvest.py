"""Commons Harvest (Open): a JAX port of Melting Pot 2.4.1 ``commons_harvest__open``.

Reproduces ``meltingpot/configs/substrates/commons_harvest__open.py`` (map, prefabs, action set) with the
apple regrowth of ``meltingpot/lua/levels/commons_harvest/components.lua`` and the avatar rules of
``meltingpot/lua/modules/avatar_library.lua``, as written down in ``docs/environments.md`` §2
(map §2.1, agents §2.2, dynamics §2.3, episode §2.4). Movement, beams and removal are shared with Clean Up
(``envs_jax.meltingpot``).

Order of events in step t:
  1. turns and moves, one agent at a time in a fresh uniformly random order; entering an apple eats it;
  2. all zap beams from post-move positions (cooldown 2; a hit agent is removed for 4 frames);
  3. apple regrowth (spec §2.3): an empty apple cell regrows with probability
     [0, 0.0025, 0.005, 0.025][min(k, 3)], k = live apples among its 12 radius-2 neighbours counted at the
     end of step t-1, never at the step it was eaten or the step after; an apple regrown under an alive
     agent is eaten at once;
  4. respawns, on ``P`` cells only.

Declared simplifications: symbolic one-hot egocentric observations instead of RGB (same 11x11 window, see
``envs_jax.meltingpot``); fixed horizon ``max_steps`` (default 400, the target paper's); zap beams traced
simultaneously; the neighbour count k is one step stale (end of step t-1) where Melting Pot's is two steps
stale (end of t-2, spec §2.3 "Exact timing"). With the one-step count a patch seen empty at the end of a
step can never regrow (spec §5 item 5, permanent extinction); with a two-step count its last apple's
neighbours could regrow at the next step (about 12 x 0.0025 = 3% of extinctions; it happened once in a
test run of 64 random 400-step episodes).

Observation layers (uint8[11, 11, 9]): ``wall`` (incl. off-map), ``apple``, ``grass`` (apple-capable),
``self``, ``other``, ``other_facing_up/right/down/left``. ``infos["ready_to_shoot"]`` gives ``READY_TO_SHOOT``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.meltingpot import (
    BIT_APPLE,
    BIT_GRASS,
    BIT_WALL,
    CODE_APPLE,
    CODE_FLOOR,
    CODE_GRASS,
    CODE_WALL,
    STREAM_GAME,
    MeltingPotEnv,
    MeltingPotState,
    agent_phase,
    bounding_box,
    cell_codes,
    cells_of,
    check_num_agents,
    eat_apples,
    hash_uniform,
    hash_uniform_box,
    initial_agent_fields,
    parse_ascii_map,
    pick_distinct,
    respawn_phase,
    seed_from_key,
    unique_priority,
)

# ------------------------------------------------------------------------------------------------
# Constants (spec §2; commons_harvest__open.py unless noted)
# ------------------------------------------------------------------------------------------------

# commons_harvest__open.py ASCII_MAP, 18 x 24 (spec §2.1).
ASCII_MAP = """
WWWWWWWWWWWWWWWWWWWWWWWW
WAAA    A      A    AAAW
WAA    AAA    AAA    AAW
WA    AAAAA  AAAAA    AW
W      AAA    AAA      W
W       A      A       W
W  A                A  W
W AAA  Q        Q  AAA W
WAAAAA            AAAAAW
W AAA              AAA W
W  A                A  W
W                      W
W                      W
W                      W
W  PPPPPPPPPPPPPPPPPP  W
W PPPPPPPPPPPPPPPPPPPP W
WPPPPPPPPPPPPPPPPPPPPPPW
WWWWWWWWWWWWWWWWWWWWWWWW
"""
WALL_CHARS = "W"
APPLE_CHARS = "A"  # grass with an apple at reset (64)
SPAWN_CHARS = "P"  # spawn points, also used by every respawn (60)
INSIDE_SPAWN_CHARS = "Q"  # "inside" spawn points of the first two players at reset (2)

NUM_AGENTS = 7  # commons_harvest__open.py default number of players
NUM_ACTIONS = 8  # ACTION_SET without FIRE_CLEAN
DEFAULT_MAX_STEPS = 400  # target paper's horizon (spec §2.4)

ZAP_COOLDOWN = 2  # avatar "Zapper" cooldownTime (spec §2.3)
ZAP_REMOVAL_FRAMES = 4  # "Zapper" framesTillRespawn (spec §2.3)

REGROWTH_PROBABILITIES = (0.0, 0.0025, 0.005, 0.025)  # REGROWTH_PROBABILITIES, by min(k, 3) (spec §2.3)
# APPLE_RESPAWN_RADIUS = 2.0: the 12 cells at Euclidean distance <= 2 (spec §2.3).
NEIGHBOUR_OFFSETS = np.array(
    [(dr, dc) for dr in range(-2, 3) for dc in range(-2, 3) if 0 < dr * dr + dc * dc <= 4], np.int32
)

# hash_uniform stream ids of this game's draws (see envs_jax.meltingpot).
_STREAM_GROW, _STREAM_RESET_INSIDE, _STREAM_RESET_CELL, _STREAM_RESET_FACING = (STREAM_GAME + i for i in range(4))

LAYER_NAMES = (
    "wall",
    "apple",
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


def neighbour_apple_count(apples: jax.Array) -> jax.Array:
    """int32[H, W]: live apples among each cell's 12 radius-2 neighbours (off-map counts as none)."""
    h, w = apples.shape
    padded = jnp.pad(apples.astype(jnp.int32), 2)
    return sum(padded[2 + dr : 2 + dr + h, 2 + dc : 2 + dc + w] for dr, dc in NEIGHBOUR_OFFSETS)


def regrowth_probability(k: jax.Array) -> jax.Array:
    """float32[...] per-step regrowth probability for neighbour counts ``k`` (spec §2.3)."""
    return jnp.asarray(REGROWTH_PROBABILITIES, jnp.float32)[jnp.clip(k, 0, 3)]


def label_patches(apple_cells: np.ndarray) -> np.ndarray:
    """int32[H, W] patch id (0..P-1) of each 4-connected group of apple cells, -1 elsewhere."""
    h, w = apple_cells.shape
    label = np.full((h, w), -1, np.int32)
    nxt = 0
    for r0, c0 in zip(*np.nonzero(apple_cells)):
        if label[r0, c0] >= 0:
            continue
        stack = [(r0, c0)]
        label[r0, c0] = nxt
        while stack:
            r, c = stack.pop()
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                rr, cc = r + dr, c + dc
                if 0 <= rr < h and 0 <= cc < w and apple_cells[rr, cc] and label[rr, cc] < 0:
                    label[rr, cc] = nxt
                    stack.append((rr, cc))
        nxt += 1
    return label


@struct.dataclass
class HarvestState(MeltingPotState):
    """Commons Harvest state: the :class:`envs_jax.meltingpot.MeltingPotState` fields plus

    Attributes:
        eaten_last: bool[H, W] apple cells emptied (eaten) during the previous step (not eligible now).
    """

    eaten_last: jax.Array


class CommonsHarvest(MeltingPotEnv):
    """Melting Pot ``commons_harvest__open`` as a JaxMARL ``MultiAgentEnv`` (7 agents, 8 actions).

    Args:
        max_steps: episode length in steps (default 400).
        num_agents: number of players; must be 7 on the real map (other values only with ``ascii_map``).
        ascii_map: a custom map in the same legend, for tests only; ``None`` = Melting Pot's map.

    Raises:
        ValueError: ``max_steps <= 0``, a bad ``num_agents``, or a malformed map.
    """

    num_actions = NUM_ACTIONS
    bit_layers = (BIT_WALL, BIT_APPLE, BIT_GRASS)
    layer_names = LAYER_NAMES
    zap_cooldown_frames = ZAP_COOLDOWN

    def __init__(self, max_steps: int = DEFAULT_MAX_STEPS, num_agents: int = NUM_AGENTS, ascii_map: str | None = None):
        chars = parse_ascii_map(ASCII_MAP if ascii_map is None else ascii_map)
        spawns = cells_of(chars, SPAWN_CHARS)
        inside = cells_of(chars, INSIDE_SPAWN_CHARS)
        num_agents = check_num_agents(
            num_agents, default=NUM_AGENTS, substrate="commons_harvest__open", custom_map=ascii_map is not None
        )
        n_inside = min(num_agents, len(inside))
        if num_agents < 1 or num_agents - n_inside > len(spawns) or len(spawns) == 0:
            raise ValueError(
                f"num_agents={num_agents} does not fit the map's {len(inside)} Q and {len(spawns)} P spawn cells"
            )
        super().__init__(num_agents=num_agents, max_steps=max_steps)
        self.ascii_map = chars
        self.height, self.width = chars.shape
        self.wall = np.isin(chars, list(WALL_CHARS))
        self.apple_capable = np.isin(chars, list(APPLE_CHARS))
        self.spawn_points = spawns
        self.inside_spawn_points = inside
        self.num_inside = n_inside
        self._apple_box = bounding_box(self.apple_capable)
        self.patch_id = label_patches(self.apple_capable)
        self.num_patches = int(self.patch_id.max()) + 1
        self.static_bits = (self.wall.astype(np.uint8) << BIT_WALL) | (self.apple_capable.astype(np.uint8) << BIT_GRASS)

    def map_layers(self) -> dict[str, np.ndarray]:
        """:meth:`MeltingPotEnv.map_layers` plus ``patch_id`` (:func:`label_patches`, ``int32[H, W]``)."""
        return {**super().map_layers(), "patch_id": self.patch_id}

    # -- reset / step ----------------------------------------------------------------------------
    def reset_state(self, key: jax.Array) -> HarvestState:
        """All 64 apples; agents 0, 1 on the Q cells (random assignment), the rest on distinct random P
        cells; uniformly random facing."""
        seed = seed_from_key(key)
        n, m = self.num_agents, self.num_inside
        q, s = len(self.inside_spawn_points), len(self.spawn_points)
        idx_in, _ = pick_distinct(unique_priority(seed, q, _STREAM_RESET_INSIDE), jnp.ones(m, bool), jnp.zeros(q, bool))
        idx_out, _ = pick_distinct(
            unique_priority(seed, s, _STREAM_RESET_CELL), jnp.ones(n - m, bool), jnp.zeros(s, bool)
        )
        pos = jnp.concatenate(
            [jnp.asarray(self.inside_spawn_points).reshape(-1, 2)[idx_in], jnp.asarray(self.spawn_points)[idx_out]],
            axis=0,
        )
        facing = (hash_uniform(seed, (n,), _STREAM_RESET_FACING) * 4).astype(jnp.int32)
        apples = jnp.asarray(self.apple_capable)
        return HarvestState(
            **initial_agent_fields(pos, facing),
            apples=apples,
            eaten_last=jnp.zeros_like(apples),
        )

    def step_state(self, key: jax.Array, state: HarvestState, actions: jax.Array) -> HarvestState:
        """One step of Commons Harvest (spec §2.3) without auto-reset. ``actions``: int32[N]."""
        seed = seed_from_key(key)
        wall = jnp.asarray(self.wall)

        # 1.-2. Turns and moves in random order (eating on entry), then all zap beams.
        fields, apples, ate_moving, _ = agent_phase(
            seed, state, actions, state.apples, wall, ZAP_COOLDOWN, ZAP_REMOVAL_FRAMES
        )
        eaten = state.apples & ~apples

        # 3. Regrowth from the neighbour count at the end of step t-1; eaten cells wait one extra step.
        p = regrowth_probability(neighbour_apple_count(state.apples))
        eligible = jnp.asarray(self.apple_capable) & ~apples & ~eaten & ~state.eaten_last
        grow = eligible & (hash_uniform_box(seed, apples.shape, self._apple_box, _STREAM_GROW) < p)
        apples, ate_standing = eat_apples(apples | grow, fields["pos"], fields["alive"])
        eaten = eaten | (grow & ~apples)

        # 4. Respawns (P cells only).
        ate = ate_standing.astype(jnp.int32) + ate_moving.astype(jnp.int32)
        fields = respawn_phase(seed, state, fields, ate, jnp.asarray(self.spawn_points))
        return state.replace(**fields, apples=apples, eaten_last=eaten)

    # -- observation / render / stats ------------------------------------------------------------
    def cell_code_grid(self, state: HarvestState) -> jax.Array:
        """uint8[H, W] observation codes (see ``envs_jax.meltingpot.cell_codes``)."""
        return cell_codes(jnp.asarray(self.static_bits), state.apples, None, state.pos, state.facing, state.alive)

    def render_codes(self, state: HarvestState) -> jax.Array:
        """int32[H, W] palette codes without agents."""
        code = np.full(self.ascii_map.shape, CODE_FLOOR, np.int32)
        code[self.apple_capable] = CODE_GRASS
        code[self.wall] = CODE_WALL
        return jnp.where(state.apples, CODE_APPLE, jnp.asarray(code))

    def patches_alive_mask(self, state: HarvestState) -> jax.Array:
        """bool[P] whether each apple patch still holds a live apple."""
        onehot = jnp.asarray(self.patch_id[None] == np.arange(self.num_patches)[:, None, None])
        return jnp.any(onehot & state.apples[None], axis=(1, 2))

    def world_stats(self, state: HarvestState) -> dict[str, jax.Array]:
        """Named scalars: ``apples``, ``patches_alive`` (of 6), ``avatars_alive`` (all int32)."""
        return {
            "apples": jnp.sum(state.apples, dtype=jnp.int32),
            "patches_alive": jnp.sum(self.patches_alive_mask(state), dtype=jnp.int32),
            "avatars_alive": jnp.sum(state.alive, dtype=jnp.int32),
        }
