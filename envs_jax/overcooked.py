"""Overcooked-AI Asymmetric Advantages (AA) and Forced Coordination (FC) on JaxMARL's OvercookedV2.

Reproduces the two Overcooked-AI layouts with the current Overcooked-AI cooking rule (spec §3.4):
a pot starts cooking only when an agent with **empty hands** interacts with an **idle pot holding
1–3 onions**; adding onions never starts it. Only the 3-onion soup is an order: delivering it gives
+20 to both agents; a 1- or 2-onion soup scores 0 (never negative). Episodes last 400 steps.

All dynamics (movement, collisions, interactions, cooking, rewards, observations) are JaxMARL's
``OvercookedV2`` with ``start_cooking_interaction=True`` and ``negative_rewards=False``; this module
only adds what the option layer needs: the spec's action order, random initial facing, a
per-episode delivery counter, read accessors, and a renderer.

Sources
    - JaxMARL 0.2.0, ``jaxmarl/environments/overcooked_v2/`` (``overcooked.py``: ``step_agents``,
      ``process_interact``; ``layouts.py``: ``asymm_advantages``, ``forced_coord``; ``settings.py``:
      ``POT_COOK_TIME``, ``DELIVERY_REWARD``, ``SHAPED_REWARDS``; ``common.py``: object bit codes).
    - Overcooked-AI (HumanCompatibleAI/overcooked_ai): ``src/overcooked_ai_py/data/layouts/
      asymmetric_advantages.layout``, ``forced_coordination.layout``; ``mdp/overcooked_mdp.py``
      (``Action.ALL_ACTIONS`` order N, S, E, W, stay, interact; ``begin_cooking``/``cook`` timing).
    - ``specs/environments.md`` §3 (maps, actions, collisions, interact table, 400 steps), §3.4 (rules
      used here), §5 (known differences).

Verified V2 facts (checked by ``tests/test_overcooked.py``)
    - Cook timing: the start interact in step t sets the pot timer to ``POT_COOK_TIME`` = 20 and the
      end-of-step tick of the same step lowers it to 19. After step t + k the timer is 19 − k; at the
      end of step t + 19 it reaches 0 and the pot is ready. A plate-holding interact in step t + 19
      still fails; one in step t + 20 takes the soup. So the pot cooks during the 20 steps t … t + 19,
      as in Overcooked-AI (``begin_cooking`` then one ``cook`` tick in the same step, ready at 20 ticks).
    - A 4th onion is refused (the hand keeps it); onions into a cooking or ready pot are refused; a
      start interact on an empty pot, or by an agent holding anything, does nothing.
    - Delivery: any plated soup is accepted at a serving cell and the hand empties; the 3-onion soup
      gives ``DELIVERY_REWARD`` = 20, other soups 0 (``negative_rewards=False``). The reward is the
      sum over both agents' interacts and is given identically to both agents.
    - Agent_0 interacts first, agent_1 then sees the updated grid. Collisions: both agents stay if
      their end cells coincide or they would swap; following into a vacated cell is allowed. (In AA
      and FC the agents' regions are disjoint, so collisions cannot arise from the start cells.)

Layouts versus spec §3.1 (same cells: counters, dispensers, pots, serving cells, floor)
    - FC agent order: V2's ``forced_coord`` puts agent_0 at (1, 3) (right/pot side, Overcooked-AI's
      player 1); the spec (JaxMARL's original ``Overcooked``) puts agent_0 at (2, 1), the left/onion
      side. We follow the spec and reverse V2's start list.
    - AA start cells equal the spec's JaxMARL cells (agent_0 (3, 2), agent_1 (3, 5)).
    - V2 starts every agent facing north; the spec draws each facing uniformly (``random_facing``).
    - V2's actions are right, down, left, up, stay, interact; we expose the spec's (= Overcooked-AI's)
      order up, down, right, left, stay, interact and translate. Facing codes are V2's ``Direction``
      (0 N, 1 S, 2 E, 3 W), so move action d always leaves the agent facing d.

Rewards and infos
    ``rewards`` is the unshaped team reward (20 per 3-onion delivery, both agents). ``infos`` holds
    ``shaped_reward`` (V2's per-agent shaping: onion into pot +3 when useful, start cooking the
    recipe +5, soup pickup +5, plate pickup +3 when useful; for optional reward shaping, never for
    reporting) and ``deliveries`` (int32 scalar: 3-onion deliveries this episode including this step;
    on the final step it is the episode total, while the returned state is already reset).

Observation (V2 ``ObservationType.DEFAULT``, fully observed): int32[H, W, 30] per agent, AA 5×9,
FC 5×5. Channels: 0 own position; 1–4 own facing (N, S, E, W); 5–7 own held item (plate bit,
cooked bit, onion count); 8–15 the same for the other agent; 16 counters; 17 serving cells; 18 pots;
19 recipe indicators; 20 button indicators (both zero here); 21 plate dispensers; 22 onion
dispensers; 23–25 items on cells (plate bit, cooked bit, onion count, pots included); 26–28 recipe at
indicator cells (zero here); 29 pot timer.

Cells are ``(row, col)`` from the top-left map character, as in the spec (V2 stores x = col, y = row).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxmarl.environments import spaces
from jaxmarl.environments.multi_agent_env import MultiAgentEnv
from jaxmarl.environments.multi_agent_env import State as BaseState
from jaxmarl.environments.overcooked_v2 import OvercookedV2, overcooked_v2_layouts
from jaxmarl.environments.overcooked_v2.common import DynamicObject, OvercookedActionsEnum, StaticObject
from jaxmarl.environments.overcooked_v2.overcooked import State as CoreState
from jaxmarl.environments.overcooked_v2.settings import DELIVERY_REWARD, POT_COOK_TIME

# ---------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------

# Our layout names -> (V2 layout key, reverse V2's start order?). Spec §3.1; see module docstring.
LAYOUTS: dict[str, tuple[str, bool]] = {
    "aa": ("asymm_advantages", False),
    "fc": ("forced_coord", True),
}
NUM_AGENTS = 2  # spec §3.2
DEFAULT_MAX_STEPS = 400  # spec §3.2 / §3.4: fixed 400-step episodes

# Actions (spec §3.2 = Overcooked-AI Action.ALL_ACTIONS order).
ACTIONS: tuple[str, ...] = ("up", "down", "right", "left", "stay", "interact")
UP, DOWN, RIGHT, LEFT, STAY, INTERACT = range(6)
# Our action index -> V2 OvercookedActionsEnum index.
ACTION_TO_CORE = jnp.array([OvercookedActionsEnum[name] for name in ACTIONS], dtype=jnp.int32)

# Facing codes (V2 common.Direction): 0 N, 1 S, 2 E, 3 W; equal to the move action that sets them.
FACINGS: tuple[str, ...] = ("N", "S", "E", "W")
FACING_DELTA = np.array([(-1, 0), (1, 0), (0, 1), (0, -1)], dtype=np.int32)  # (d_row, d_col)

# Item codes returned by the accessors (hand or counter contents).
ITEM_NONE, ITEM_ONION, ITEM_PLATE, ITEM_SOUP = 0, 1, 2, 3  # ITEM_SOUP: a plated soup of any size
ITEMS: tuple[str, ...] = ("none", "onion", "plate", "soup")

# Pot phases returned by ``pots``.
POT_EMPTY, POT_FILLED, POT_COOKING, POT_READY = 0, 1, 2, 3  # FILLED: 1-3 onions, not started
POT_PHASES: tuple[str, ...] = ("empty", "filled", "cooking", "ready")

# V2 default observation: own layers 0-7 (position, facing N/S/E/W, held item), other agent's 8-15.
_OBS_OWN_FACING = slice(1, 5)
_OBS_OTHER_FACING = slice(9, 13)

SOUP_ONIONS = 3  # the only order on AA / FC (V2 possible_recipes=[[0, 0, 0]]), spec §3.4
COOK_STEPS = POT_COOK_TIME  # 20: steps t … t+19 cook after a start interact in step t (see docstring)

# Rendering: palette indices and colours (uint8 RGB).
(
    C_FLOOR,
    C_COUNTER,
    C_ONION_DISPENSER,
    C_PLATE_DISPENSER,
    C_SERVING,
    C_POT_EMPTY,
    C_POT_1,
    C_POT_2,
    C_POT_3,
    C_POT_COOKING,
    C_POT_READY,
    C_ONION,
    C_PLATE,
    C_SOUP,
    C_AGENT_0,
    C_AGENT_1,
    C_FACING,
) = range(17)
PALETTE = jnp.array(
    [
        (235, 225, 200),  # floor
        (150, 110, 70),  # counter
        (200, 170, 40),  # onion dispenser
        (170, 170, 190),  # plate dispenser
        (60, 160, 60),  # serving cell
        (70, 70, 70),  # pot, empty
        (95, 85, 60),  # pot, 1 onion
        (120, 100, 50),  # pot, 2 onions
        (145, 115, 40),  # pot, 3 onions, not started
        (210, 80, 30),  # pot, cooking
        (240, 30, 30),  # pot, ready
        (250, 210, 60),  # onion item
        (250, 250, 250),  # plate item
        (255, 140, 0),  # plated soup item
        (40, 90, 220),  # agent_0
        (150, 50, 200),  # agent_1
        (0, 0, 0),  # facing mark
    ],
    dtype=jnp.uint8,
)
#: What each :data:`PALETTE` colour means (the legend of ``episode.gif``), index = palette code.
PALETTE_NAMES = (
    "floor",
    "counter",
    "onion pile",
    "dish pile",
    "serving",
    "pot: empty",
    "pot: 1 onion",
    "pot: 2 onions",
    "pot: 3 onions",
    "pot: cooking",
    "pot: ready",
    "onion",
    "dish",
    "soup",
    "a0",
    "a1",
    "facing mark",
)
SUBCELLS = 3  # each map cell is drawn as 3x3 sub-cells: centre = item, edge middle = facing mark
FACING_SUBCELL = ((0, 1), (2, 1), (1, 2), (1, 0))  # sub-cell of the facing mark per facing code
DEFAULT_CELL_PX = 8  # pixels per sub-cell side -> 24 px per map cell

_STATIC_TO_CODE = {  # V2 StaticObject -> palette index (pots are coloured by their state)
    StaticObject.EMPTY: C_FLOOR,
    StaticObject.WALL: C_COUNTER,
    StaticObject.GOAL: C_SERVING,
    StaticObject.POT: C_POT_EMPTY,
    StaticObject.PLATE_PILE: C_PLATE_DISPENSER,
}  # onion dispensers (ingredient piles) are matched with StaticObject.is_ingredient_pile


# ---------------------------------------------------------------------------------------------------
# Static layout facts
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class LayoutInfo:
    """What depends only on the map, computed once per layout. All cells are int32 ``(row, col)``.

    Attributes:
        name: ``"aa"`` or ``"fc"``.
        height, width: map size in cells.
        walkable: bool[H, W], floor cells (the only cells agents can occupy).
        onion_dispensers: int32[n, 2].
        plate_dispensers: int32[n, 2].
        pots: int32[P, 2], the order used by :meth:`Overcooked.pots`.
        serving: int32[n, 2].
        counters: int32[K, 2], counter cells next to a floor cell (the only ones an agent can
            face, hence the only ones that can hold items); order used by ``counter_items``.
        start_cells: int32[2, 2], agent_0 then agent_1.
        static_codes: int32[H, W], palette index of each cell's static object (render base).
    """

    name: str
    height: int
    width: int
    walkable: np.ndarray
    onion_dispensers: np.ndarray
    plate_dispensers: np.ndarray
    pots: np.ndarray
    serving: np.ndarray
    counters: np.ndarray
    start_cells: np.ndarray
    static_codes: np.ndarray


def _cells(mask: np.ndarray) -> np.ndarray:
    return np.argwhere(mask).astype(np.int32).reshape(-1, 2)


def _layout_info(name: str, static: np.ndarray, start_xy: list[tuple[int, int]]) -> LayoutInfo:
    walkable = static == StaticObject.EMPTY
    near_floor = np.zeros_like(walkable)
    near_floor[1:] |= walkable[:-1]
    near_floor[:-1] |= walkable[1:]
    near_floor[:, 1:] |= walkable[:, :-1]
    near_floor[:, :-1] |= walkable[:, 1:]
    onion = StaticObject.is_ingredient_pile(static)
    codes = np.full(static.shape, C_COUNTER, dtype=np.int32)
    for obj, code in _STATIC_TO_CODE.items():
        codes[static == obj] = code
    codes[onion] = C_ONION_DISPENSER
    return LayoutInfo(
        name=name,
        height=static.shape[0],
        width=static.shape[1],
        walkable=walkable,
        onion_dispensers=_cells(onion),
        plate_dispensers=_cells(static == StaticObject.PLATE_PILE),
        pots=_cells(static == StaticObject.POT),
        serving=_cells(static == StaticObject.GOAL),
        counters=_cells((static == StaticObject.WALL) & near_floor),
        start_cells=np.array([(y, x) for x, y in start_xy], dtype=np.int32),
        static_codes=codes,
    )


# ---------------------------------------------------------------------------------------------------
# State and pure accessors
# ---------------------------------------------------------------------------------------------------


@struct.dataclass
class OvercookedState(BaseState):
    """Our state: V2's state plus the episode's delivery count.

    From BaseState (kept equal to ``core.done`` / ``core.step``):
        done: bool[], episode over.
        step: int32[], steps taken this episode.

    Attributes:
        core: JaxMARL OvercookedV2 ``State`` (agents: x = col, y = row, dir, inventory bits; grid
            int32[H, W, 3] = static object, item bits, pot timer).
        deliveries: int32[], 3-onion soups delivered this episode so far.
    """

    core: CoreState
    deliveries: jax.Array


class PotView(NamedTuple):
    """Per-pot view, pots in ``LayoutInfo.pots`` order (each int32[P] / bool[P])."""

    onions: jax.Array  # int32[P], onions in the pot (0-3), cooking or ready soups included
    timer: jax.Array  # int32[P], cook steps remaining (19 … 1 while cooking, else 0)
    cooking: jax.Array  # bool[P]
    ready: jax.Array  # bool[P], a soup can be taken with a plate
    phase: jax.Array  # int32[P], POT_EMPTY / POT_FILLED / POT_COOKING / POT_READY


def item_code(raw: jax.Array) -> jax.Array:
    """Maps V2 item bits (hand or cell, any shape) to ``ITEM_*`` codes (int32, same shape)."""
    raw = jnp.asarray(raw)
    return jnp.where(
        raw == DynamicObject.EMPTY,
        ITEM_NONE,
        jnp.where(
            (raw & DynamicObject.COOKED) != 0,
            ITEM_SOUP,
            jnp.where(raw == DynamicObject.PLATE, ITEM_PLATE, ITEM_ONION),
        ),
    ).astype(jnp.int32)


def onion_count(raw: jax.Array) -> jax.Array:
    """Onions encoded in V2 item bits (int32, same shape): pot contents or a soup's size."""
    return ((jnp.asarray(raw) >> 2) & 0x3).astype(jnp.int32)  # ingredient 0 occupies bits 2-3


def agent_positions(state: OvercookedState) -> jax.Array:
    """int32[2, 2]: agents' cells as ``(row, col)``, agent_0 first."""
    pos = state.core.agents.pos
    return jnp.stack([pos.y, pos.x], axis=-1).astype(jnp.int32)


def agent_facing(state: OvercookedState) -> jax.Array:
    """int32[2]: facing codes (0 N, 1 S, 2 E, 3 W)."""
    return state.core.agents.dir.astype(jnp.int32)


def held_items(state: OvercookedState) -> jax.Array:
    """int32[2]: ``ITEM_*`` code of what each agent holds."""
    return item_code(state.core.agents.inventory)


def held_soup_onions(state: OvercookedState) -> jax.Array:
    """int32[2]: onions in the soup each agent holds (3 = a scoring soup; 0 when not holding soup)."""
    inv = state.core.agents.inventory
    return jnp.where((inv & DynamicObject.COOKED) != 0, onion_count(inv), 0)


def cells_items(state: OvercookedState, cells: np.ndarray) -> jax.Array:
    """int32[n]: ``ITEM_*`` code of what lies on each of ``cells`` (int32[n, 2], ``(row, col)``)."""
    return item_code(state.core.grid[cells[:, 0], cells[:, 1], 1])


def pot_view(state: OvercookedState, pots: np.ndarray) -> PotView:
    """Reads the pots at ``pots`` (int32[P, 2]); see :class:`PotView`."""
    raw = state.core.grid[pots[:, 0], pots[:, 1], 1]
    timer = state.core.grid[pots[:, 0], pots[:, 1], 2].astype(jnp.int32)
    onions = onion_count(raw)
    ready = (raw & DynamicObject.COOKED) != 0
    cooking = timer > 0
    idle = jnp.where(onions > 0, POT_FILLED, POT_EMPTY)
    phase = jnp.where(ready, POT_READY, jnp.where(cooking, POT_COOKING, idle))
    return PotView(onions=onions, timer=timer, cooking=cooking, ready=ready, phase=phase.astype(jnp.int32))


def _with_facing(obs: dict[str, jax.Array], core: CoreState, facing: jax.Array) -> dict[str, jax.Array]:
    """V2's all-north start observation with the facing channels rewritten to ``facing`` (int32[2]).

    Equal to ``OvercookedV2.get_obs`` of the re-faced state (tested). Writes 8 values per observation,
    which stays cheap under ``vmap`` (a precomputed additive table costs a full-observation pass).
    """
    onehot = jax.nn.one_hot(facing, len(FACINGS), dtype=jnp.int32)  # int32[2, 4]
    rows, cols = core.agents.pos.y, core.agents.pos.x
    out = {}
    for i in range(NUM_AGENTS):
        o = obs[f"agent_{i}"]
        for j in range(NUM_AGENTS):
            channels = _OBS_OWN_FACING if j == i else _OBS_OTHER_FACING
            o = o.at[rows[j], cols[j], channels].set(onehot[j].astype(o.dtype))
        out[f"agent_{i}"] = o
    return out


# ---------------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------------


class Overcooked(MultiAgentEnv):
    """Overcooked AA / FC (spec §3, §3.4) as a thin shell over JaxMARL ``OvercookedV2``.

    ``reset(key) -> (obs, state)``; ``step(key, state, actions) -> (obs, state, rewards, dones, infos)``
    with dicts keyed ``agent_0``, ``agent_1``; auto-reset when ``dones["__all__"]``. Actions: 0 up,
    1 down, 2 right, 3 left, 4 stay, 5 interact. See the module docstring for rules, rewards, infos and
    the observation layout.

    Args:
        layout: ``"aa"`` or ``"fc"`` (fixed by the registry name).
        max_steps: episode length in steps (default 400, spec §3.2).
        random_facing: draw each agent's initial facing uniformly (spec §3.2); ``False`` keeps V2's
            all-north start.

    Raises:
        ValueError: unknown layout (lists the valid ones) or ``max_steps`` not a positive int.
    """

    def __init__(self, layout: str = "aa", max_steps: int = DEFAULT_MAX_STEPS, random_facing: bool = True):
        if layout not in LAYOUTS:
            raise ValueError(f"unknown Overcooked layout {layout!r}; valid layouts: {', '.join(LAYOUTS)}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
        super().__init__(num_agents=NUM_AGENTS)
        core_name, reverse_agents = LAYOUTS[layout]
        core_layout = overcooked_v2_layouts[core_name]
        if reverse_agents:
            core_layout = dataclasses.replace(core_layout, agent_positions=core_layout.agent_positions[::-1])
        self.layout_name = layout
        self.max_steps = int(max_steps)
        self.random_facing = bool(random_facing)
        self.core = OvercookedV2(
            layout=core_layout,
            max_steps=self.max_steps,
            start_cooking_interaction=True,
            negative_rewards=False,
        )
        self.layout_info = _layout_info(layout, np.asarray(core_layout.static_objects), core_layout.agent_positions)
        self.height, self.width = self.layout_info.height, self.layout_info.width

    # -- MultiAgentEnv API ---------------------------------------------------------------------------

    @partial(jax.jit, static_argnums=(0,))
    def reset(self, key: jax.Array) -> tuple[dict[str, jax.Array], OvercookedState]:
        """Fresh episode: spec start cells, empty hands and pots, facing uniform (``random_facing``).

        Args:
            key: PRNG key.

        Returns:
            ``(obs, state)``; obs per agent int32[H, W, 30].
        """
        # V2's reset draws only the recipe, which has one possible value on AA / FC, so its key can be
        # shared with the facing draw (saves a split: threefry is most of this reset's cost at 1 env).
        obs, core = self.core.reset(key)
        facing = core.agents.dir.astype(jnp.int32)
        if self.random_facing:
            # One threefry call (randint would draw twice); 4 divides 2**32, so the draw is uniform.
            bits = jax.random.bits(key, (NUM_AGENTS,), dtype=jnp.uint32)
            facing = (bits % len(FACINGS)).astype(jnp.int32)
            # V2's start state is a compile-time constant, so XLA folds its observation; re-encoding the
            # re-faced state would instead run on every step (``MultiAgentEnv.step`` evaluates the
            # auto-reset branch each step). Rewriting the facing channels is equal (tested).
            obs = _with_facing(obs, core, facing)
        core = core.replace(agents=core.agents.replace(dir=facing))
        state = OvercookedState(done=core.done, step=core.step, core=core, deliveries=jnp.int32(0))
        return obs, state

    @partial(jax.jit, static_argnums=(0,))
    def step(
        self,
        key: jax.Array,
        state: OvercookedState,
        actions: dict[str, jax.Array],
        reset_state: OvercookedState | None = None,
    ):
        """``step_env`` plus auto-reset when ``dones["__all__"]`` (JaxMARL ``MultiAgentEnv.step`` semantics).

        Unlike the base class, the reset branch runs under ``lax.cond``, so an unbatched step does not
        pay for a reset it throws away (the launch-bound single-environment case on a GPU); under
        ``vmap`` the cond becomes a select, as in the base class. Keys are split as the base class
        splits them, so trajectories are identical.
        """
        key, key_reset = jax.random.split(key)
        obs_st, state_st, rewards, dones, infos = self.step_env(key, state, actions)

        def fresh():
            if reset_state is None:
                return self.reset(key_reset)
            return self.get_obs(reset_state), reset_state

        obs, state = jax.lax.cond(dones["__all__"], fresh, lambda: (obs_st, state_st))
        return obs, state, rewards, dones, infos

    def step_env(self, key: jax.Array, state: OvercookedState, actions: dict[str, jax.Array]):
        """One joint step without auto-reset (V2 dynamics, see module docstring).

        Args:
            key: PRNG key.
            state: current state.
            actions: ``{agent: int[]}`` in our action order (0 up … 5 interact).

        Returns:
            ``(obs, state, rewards, dones, infos)``; rewards float32[] per agent (unshaped, shared);
            infos ``{"shaped_reward": {agent: float32[]}, "deliveries": int32[]}``.
        """
        core_actions = {a: ACTION_TO_CORE[actions[a]] for a in self.agents}
        obs, core, rewards, dones, infos = self.core.step_env(key, state.core, core_actions)
        # The team reward is DELIVERY_REWARD per 3-onion delivery this step (no negative rewards).
        delivered = jnp.round(rewards[self.agents[0]] / DELIVERY_REWARD).astype(jnp.int32)
        deliveries = state.deliveries + delivered
        state = OvercookedState(done=core.done, step=core.step, core=core, deliveries=deliveries)
        infos = {"shaped_reward": infos["shaped_reward"], "deliveries": deliveries}
        return obs, state, rewards, dones, infos

    def get_obs(self, state: OvercookedState) -> dict[str, jax.Array]:
        """V2's default observation, ``{agent: int32[H, W, 30]}`` (channels in the module docstring)."""
        return self.core.get_obs(state.core)

    @property
    def name(self) -> str:
        return f"overcooked_{self.layout_name}"

    @property
    def num_actions(self) -> int:
        return len(ACTIONS)

    def action_space(self, agent_id: str = "") -> spaces.Discrete:
        """``Discrete(6)``: 0 up, 1 down, 2 right, 3 left, 4 stay, 5 interact."""
        return spaces.Discrete(len(ACTIONS), dtype=jnp.uint32)

    def observation_space(self, agent_id: str = "") -> spaces.Box:
        return self.core.observation_space(agent_id)

    # -- Accessors for the option layer (all jittable, vmappable over a batch of states) --------------

    def agent_positions(self, state: OvercookedState) -> jax.Array:
        """int32[2, 2]: ``(row, col)`` of agent_0, agent_1."""
        return agent_positions(state)

    def agent_facing(self, state: OvercookedState) -> jax.Array:
        """int32[2]: facing codes 0 N, 1 S, 2 E, 3 W (= the move action that sets them)."""
        return agent_facing(state)

    def held_items(self, state: OvercookedState) -> jax.Array:
        """int32[2]: ``ITEM_NONE`` / ``ITEM_ONION`` / ``ITEM_PLATE`` / ``ITEM_SOUP`` per agent."""
        return held_items(state)

    def held_soup_onions(self, state: OvercookedState) -> jax.Array:
        """int32[2]: onions in a held soup (3 scores; 0 when not holding a soup)."""
        return held_soup_onions(state)

    def pots(self, state: OvercookedState) -> PotView:
        """Pots in ``layout_info.pots`` order: onions, timer, cooking, ready, phase (see ``PotView``)."""
        return pot_view(state, self.layout_info.pots)

    def counter_items(self, state: OvercookedState) -> jax.Array:
        """int32[K]: ``ITEM_*`` on each counter of ``layout_info.counters``."""
        return cells_items(state, self.layout_info.counters)

    def world_stats(self, state: OvercookedState) -> dict[str, jax.Array]:
        """Named int32 scalars.

        Returns:
            ``deliveries`` (3-onion soups delivered this episode), ``onions_in_pots`` (onions in pots
            of any phase), ``soups_cooking`` and ``soups_ready`` (pots), ``items_on_counters``.
        """
        pots = self.pots(state)
        return {
            "deliveries": state.deliveries,
            "onions_in_pots": pots.onions.sum(dtype=jnp.int32),
            "soups_cooking": pots.cooking.sum(dtype=jnp.int32),
            "soups_ready": pots.ready.sum(dtype=jnp.int32),
            "items_on_counters": (self.counter_items(state) != ITEM_NONE).sum(dtype=jnp.int32),
        }

    # -- Rendering ----------------------------------------------------------------------------------

    def map_layers(self) -> dict[str, np.ndarray]:
        """The kitchen's static layers by name, each ``bool[H, W]`` (what the run files keep so no reader builds
        an env): ``wall`` (every non-walkable cell: counters and stations), ``pot``, ``onion_pile``,
        ``dish_pile`` and ``serving`` (from :attr:`layout_info`)."""
        info = self.layout_info
        layers = {"wall": ~np.asarray(info.walkable, bool)}
        for name, cells in (
            ("pot", info.pots),
            ("onion_pile", info.onion_dispensers),
            ("dish_pile", info.plate_dispensers),
            ("serving", info.serving),
        ):
            cells = np.asarray(cells, np.int64).reshape(-1, 2)
            mask = np.zeros((info.height, info.width), bool)
            mask[cells[:, 0], cells[:, 1]] = True
            layers[name] = mask
        return layers

    def legend(self) -> list[tuple[str, tuple[int, int, int]]]:
        """``[(label, rgb)]`` of every colour :meth:`render` paints, in palette order (:data:`PALETTE_NAMES`)."""
        pal = np.asarray(PALETTE)
        return [(n, tuple(int(c) for c in pal[k])) for k, n in enumerate(PALETTE_NAMES)]

    def render(self, state: OvercookedState, cell_px: int = DEFAULT_CELL_PX) -> jax.Array:
        """Draws the map: each cell as 3×3 sub-cells of ``cell_px`` pixels.

        Static cells and pots (coloured by onion count / cooking / ready) fill their cell; an item on a
        counter sits in the centre sub-cell; an agent fills its cell in its colour with a black facing
        mark on the edge it faces and its held item in the centre.

        Args:
            state: one (unbatched) state.
            cell_px: pixels per sub-cell side (static).

        Returns:
            uint8[H * 3 * cell_px, W * 3 * cell_px, 3].
        """
        from envs_jax.render import paint

        info = self.layout_info
        grid = state.core.grid
        codes = jnp.asarray(info.static_codes)
        pots = self.pots(state)
        pot_code = jnp.where(
            pots.ready,
            C_POT_READY,
            jnp.where(pots.cooking, C_POT_COOKING, C_POT_EMPTY + pots.onions),
        )
        codes = codes.at[info.pots[:, 0], info.pots[:, 1]].set(pot_code)
        item_palette = jnp.array([-1, C_ONION, C_PLATE, C_SOUP], dtype=jnp.int32)
        on_cell = item_code(grid[:, :, 1])
        show_item = (on_cell != ITEM_NONE) & (grid[:, :, 0] != StaticObject.POT)
        centre = jnp.where(show_item, item_palette[on_cell], codes)
        fine = jnp.broadcast_to(codes[:, :, None, None], (info.height, info.width, SUBCELLS, SUBCELLS))
        fine = fine.at[:, :, 1, 1].set(centre)
        pos, facing, held = agent_positions(state), agent_facing(state), held_items(state)
        facing_rows = jnp.array([r for r, _ in FACING_SUBCELL])
        facing_cols = jnp.array([c for _, c in FACING_SUBCELL])
        for i, agent_code in enumerate((C_AGENT_0, C_AGENT_1)):
            patch = jnp.full((SUBCELLS, SUBCELLS), agent_code, dtype=jnp.int32)
            patch = patch.at[facing_rows[facing[i]], facing_cols[facing[i]]].set(C_FACING)
            patch = patch.at[1, 1].set(jnp.where(held[i] != ITEM_NONE, item_palette[held[i]], agent_code))
            fine = fine.at[pos[i, 0], pos[i, 1]].set(patch)
        fine = fine.transpose(0, 2, 1, 3).reshape(info.height * SUBCELLS, info.width * SUBCELLS)
        return paint(fine, PALETTE, cell_px)


__all__ = [
    "ACTIONS",
    "COOK_STEPS",
    "FACINGS",
    "ITEMS",
    "LAYOUTS",
    "POT_PHASES",
    "SOUP_ONIONS",
    "LayoutInfo",
    "Overcooked",
    "OvercookedState",
    "PotView",
    "agent_facing",
    "agent_positions",
    "cells_items",
    "held_items",
    "held_soup_onions",
    "item_code",
    "onion_count",
    "pot_view",
]
