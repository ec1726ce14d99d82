"""Shared option machinery of the Melting Pot games (Clean Up, Commons Harvest), paper §5.1.

Both games share the avatar of ``envs_jax.meltingpot``: *relative* movement (moves never change facing), turns,
9-cell beams fired along the facing, removal by zaps, and the 11x11 egocentric window (9 ahead, 1 behind, 5 to
each side). This module holds what their option libraries have in common; :mod:`jaxopt_marl.options.cleanup`
and :mod:`jaxopt_marl.options.harvest` add the vocabulary, read-set features and effect predicates.

Option kinds (each option of a library has one, see :data:`KIND_NAMES`):

- ``walk_onto`` (``eat apple @ target``): shortest path onto the target cell; the queue drains with the move
  that enters the target.
- ``beam`` (``clean dirt @ target``): shortest path to a *firing pose* -- a walkable 4-neighbour of the target.
  From such a pose the target is the *first* cell of a beam segment for every facing except the one pointing
  away from it (facing it: centre segment step 1; facing across it: the left or right segment's step 0), so the
  beam reaches the target whatever else lies on the map (a segment stops only at its first blocking cell). At
  the pose the executor turns once if it faces away (TURN_RIGHT), waits (NOOP) while the beam cools down, and
  drains with the FIRE action that fires.
- ``region`` (``go to the river`` / ``go to patch @ target``): shortest path to the nearest cell of a static
  region, then turn to the region's static facing (:attr:`MeltingPotOptions.region_face`, e.g. into the river)
  so that its content lies in the view window; the queue drains with the last move or turn (with a NOOP if the
  agent starts inside the region already facing that way).
- ``wait``: :data:`WAIT_STEPS` NOOPs.

Planning: paths come from the per-map all-pairs table (:func:`jaxopt_marl.paths.all_pairs_distances`, walls
only), stored once with the per-region distance rows as one ``int16`` device constant
(:func:`destination_table`); the distance to a target's firing poses is the min over its four neighbours' rows.
Other agents are not in the plan (a BFS per agent per step would cost more than the game): at execution a move
into a cell held by another alive agent is never issued; the executor takes the best *free* descending
neighbour (preferring one whose own onward cells are not all held; ties N < E < S < W) and, when every
descending neighbour is occupied, either waits or sidesteps to a free neighbour at most one step further (a
pseudo-random coin of (step, agent) decides, which breaks the livelock of two agents sidestepping in step).
``timeout`` bounds any stall.
Moves emitted are relative: compass direction ``d`` becomes :func:`~jaxopt_marl.options.base.relative_action`
of ``(facing, d)``.

Explicit failures (checked at expansion only, also the Stage-4 live re-check): ``TargetAbsent`` (no target
given, or its object -- apple, dirt -- is not on the target cell), ``NoPath`` (no destination cell reachable
from the agent's cell through walls). ``NothingHeld`` never applies (nothing is held in Melting Pot).

Termination: the queue drained, or ``timeout`` steps. The executor also ends an option early -- a NOOP with
``drained`` -- when (a) its target object vanished before it got there (a partner ate the apple / cleaned the
dirt; the option is then judged by its effect predicate, i.e. ``effect_fail``, never an explicit failure), or
(b) the agent was removed by a zap (its actions are ignored until it respawns elsewhere; ``effect_fail``).
Rule (a) is what makes the beam effect exact: the executor fires only while the target is dirty at the start
of the step, and from a firing pose the beam then always cleans it.

Instantiation (§5.1 Defect 3: never nearest-only): apples and dirt have many targets, so their classes are
capped at :data:`TARGET_CAP` instances over the cells *visible* to the agent (its 11x11 window): the
:data:`TARGET_CAP` nearest visible objects by static path distance (unreachable ones last, ties row-major).
Region options have one instance each; ``wait`` one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax import meltingpot as mp
from jaxopt_marl import paths
from jaxopt_marl.options.base import (
    NO_PATH,
    NO_REASON,
    TARGET_ABSENT,
    Exec,
    Instances,
    OptionLibrary,
    OptionSpec,
    relative_action,
    turn_action,
)

# ---------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------

#: Instances per capped target class (apples, dirt): the nearest visible ones by path distance.
TARGET_CAP = 6
#: NOOP steps of ``wait``.
WAIT_STEPS = 3
#: Option timeout in env steps: longer than any shortest path of either map to a region or a visible target
#: (Clean Up <= 16, Harvest <= 36 to the farthest patch) plus a turn and the cleaning cooldown.
TIMEOUT = 48

KIND_WALK_ONTO, KIND_BEAM, KIND_REGION, KIND_WAIT = range(4)
KIND_NAMES = ("walk_onto", "beam", "region", "wait")

#: Facing value meaning "any facing" in a region's arrival-facing map.
ANY_FACING = -1

_BIG = np.int32(2**31 - 1)
#: Unreachable in the int16 destination table (mapped back to :data:`jaxopt_marl.paths.UNREACHABLE` on lookup).
FAR = 32000

WINDOW_OFFSETS = mp.window_offsets().reshape(4, -1, 2)  # int32[4, 121, 2] per facing (d_row, d_col)
#: Cells of the observation window (11 x 11 = 121).
WINDOW_CELLS = WINDOW_OFFSETS.shape[1]


# ---------------------------------------------------------------------------------------------------------
# The view window: the one definition of "in view" (menus and prompts)
# ---------------------------------------------------------------------------------------------------------


def window_cells(pos: jax.Array, facing: jax.Array) -> jax.Array:
    """``int32[121, 2]`` map cells (row, col) of the observation window of an agent at ``pos`` (``int32[2]``)
    facing ``facing`` (compass code ``int32[]``), window row-major; cells may lie off the map.

    The window is Melting Pot's egocentric observation (``envs_jax.meltingpot.window_offsets``): 9 cells
    ahead, 1 behind and 5 to each side, so it depends on the facing.
    """
    return jnp.asarray(pos, jnp.int32)[None] + jnp.asarray(WINDOW_OFFSETS)[facing]


def in_window(pos: jax.Array, facing: jax.Array, cells: jax.Array) -> jax.Array:
    """``bool[...]``: each of ``cells`` (``int32[..., 2]`` (row, col)) is one of :func:`window_cells`."""
    win = window_cells(pos, facing)  # [121, 2]
    return jnp.all(jnp.asarray(cells, jnp.int32)[..., None, :] == win, axis=-1).any(-1)


def window_objects(pos: jax.Array, facing: jax.Array, grid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Objects of ``grid`` (``bool[H, W]``) in the window: ``(cells int32[121, 2], seen bool[121])``, ``seen`` =
    the window cell is on the map and holds an object. ``seen.sum()`` is the count "in view"."""
    cells = window_cells(pos, facing)
    ok = mp.in_bounds(cells, grid.shape)
    hi = jnp.array(grid.shape, jnp.int32) - 1
    flat = jnp.clip(cells, 0, hi)
    return cells, ok & jnp.asarray(grid)[flat[:, 0], flat[:, 1]]


class ViewRanking(NamedTuple):
    """The objects of one class in an agent's window, ranked (:meth:`MeltingPotOptions.view_ranking`).

    Attributes:
        target: ``int32[k, 2]`` the ``k`` first ranked cells (row, col); -1 where ``valid`` is false.
        valid: ``bool[k]`` the slot holds an object (fewer than ``k`` in view: trailing slots are empty).
        dist: ``int32[k]`` static path length in steps from the agent's cell to the object's cell (walls only,
            other agents ignored); ``paths.UNREACHABLE`` when no path exists; -1 where ``valid`` is false.
        count: ``int32[]`` objects in the window.
    """

    target: jax.Array
    valid: jax.Array
    dist: jax.Array
    count: jax.Array


def check_wait_steps(wait_steps: int) -> None:
    """Raises ValueError unless ``wait_steps >= 1`` (NOOPs of the ``wait`` option)."""
    if not (isinstance(wait_steps, int) and wait_steps >= 1):
        raise ValueError(f"wait_steps must be an integer >= 1, got {wait_steps!r}")


def contract_text(kind: int, inst: str, effect: str, region: str = "", wait_steps: int = WAIT_STEPS) -> str:
    """The four-part contract of an option of ``kind`` in words (``wait_steps``: the ``wait`` option's NOOPs)."""
    ex = {
        KIND_WALK_ONTO: "Executor: shortest path (relative moves) onto the target cell; abandons when the target "
        "object is gone or the agent is removed (explicit failures: TargetAbsent, NoPath). "
        "Termination: the move onto the target, abandon, or timeout.",
        KIND_BEAM: "Executor: shortest path to a 4-neighbour of the target, turn once if facing away, wait for the "
        "cooldown, FIRE (the target is the first cell of a beam segment); abandons when the target "
        "is gone or the agent is removed (explicit failures: TargetAbsent, NoPath). Termination: the "
        "FIRE that fires, abandon, or timeout.",
        KIND_REGION: f"Executor: shortest path to the nearest cell of {region}, then turn to face into it "
        "(explicit failure: NoPath). Termination: the last move or turn, or timeout.",
        KIND_WAIT: f"Executor: {wait_steps} NOOPs; never fails. Termination: after {wait_steps} steps.",
    }[kind]
    return f"Instantiation: {inst}. {ex} Effect: {effect}."


# ---------------------------------------------------------------------------------------------------------
# Static per-map tables
# ---------------------------------------------------------------------------------------------------------


def option_specs(rows, max_targets: dict[str, int], regions, wait_steps: int = WAIT_STEPS) -> tuple[OptionSpec, ...]:
    """The :class:`~jaxopt_marl.options.base.OptionSpec` of each option row of a Melting Pot library.

    Args:
        rows: ``(name, label, target_class, kind, read_set, instantiation, effect)`` per option, menu order; an
            instantiation text may name ``{cap}``, the instances of its target class.
        max_targets: instances per target class (a class not listed has one).
        regions: per row, the region text of its contract (:func:`contract_text`).
        wait_steps: the ``wait`` option's NOOPs (its contract text).
    """
    return tuple(
        OptionSpec(
            name=n,
            label=lab,
            target_class=cls,
            read_set=rs,
            solo_only=False,
            max_targets=max_targets.get(cls, 1),
            contract=contract_text(kind, inst.format(cap=max_targets.get(cls, 1)), eff, region, wait_steps),
        )
        for (n, lab, cls, kind, rs, inst, eff), region in zip(rows, regions, strict=True)
    )


def check_target_cap(target_cap: int) -> None:
    """Raises ValueError unless ``target_cap >= 1`` (instances per capped target class)."""
    if target_cap < 1:
        raise ValueError(f"target_cap must be >= 1, got {target_cap}")


def destination_table(walkable: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """``int16[C + R, C]`` static path lengths (C = H * W cells, row-major; :data:`FAR` = unreachable).

    Row ``t`` (``t < C``): steps between cell ``t`` and every cell (moves are symmetric). Row ``C + r``: steps
    from every cell to the nearest cell of region ``r`` (``regions`` ``bool[R, H, W]``). Distances to the firing
    poses of a target are a min over the rows of its four neighbours (:meth:`MeltingPotOptions.path_length`).
    Stored as ``int16`` and used as one device constant: a smaller constant keeps XLA compile time down.
    """
    h, w = walkable.shape
    c = h * w
    table = np.asarray(paths.all_pairs_distances(jnp.asarray(walkable, bool))).reshape(c, c)
    table = np.minimum(table, FAR)
    reg = [np.where(m.reshape(-1)[:, None], table, FAR).min(0) if m.any() else np.full(c, FAR) for m in regions]
    return np.concatenate([table, np.asarray(reg).reshape(len(regions), c)]).astype(np.int16)


# ---------------------------------------------------------------------------------------------------------
# Library base
# ---------------------------------------------------------------------------------------------------------


class MeltingPotOptions(OptionLibrary):
    """Common part of the Clean Up and Harvest libraries (see the module docstring).

    Subclasses call :meth:`_setup` from ``__init__`` and implement ``features``, ``snapshot``, ``effect`` and
    :meth:`object_grid` (plus :meth:`_cooldown` if they have a beam option).
    """

    timeout = TIMEOUT
    #: The beam option's fire action (Clean Up: FIRE_CLEAN).
    beam_action = mp.FIRE_CLEAN
    #: NOOPs of the ``wait`` option (a library variant's granularity may change it; :func:`check_wait_steps`).
    wait_steps = WAIT_STEPS

    def _setup(
        self,
        env,
        options: tuple[OptionSpec, ...],
        kinds: tuple[int, ...],
        regions: np.ndarray,
        region_face: np.ndarray,
        opt_region: tuple[int, ...],
        cell_region: np.ndarray | None,
        static_targets: dict[int, np.ndarray],
    ):
        """Build the static tables.

        Args:
            env: the Melting Pot environment (``wall``, ``height``, ``width``, ``num_agents``).
            options: the option specs in id order.
            kinds: ``KIND_*`` per option.
            regions: ``bool[R, H, W]`` destination regions of region options.
            region_face: ``int32[R, H, W]`` facing to take on arrival in region ``r`` at each cell
                (:data:`ANY_FACING` = none).
            opt_region: per option, its fixed region index, or -1 when the region is that of the target cell
                (``cell_region``); unused for non-region options.
            cell_region: ``int32[H, W]`` region index of each cell (-1 none), for target-bound regions.
            static_targets: option id -> ``int32[k, 2]`` fixed targets (one instance each, always valid).
        """
        self.env = env
        self.num_agents = int(env.num_agents)
        self.options = tuple(options)
        self.kinds = np.asarray(kinds, np.int32)
        h, w = int(env.height), int(env.width)
        self.shape = (h, w)
        self.num_cells = h * w
        self.walkable = ~np.asarray(env.wall, bool)
        self.regions = np.asarray(regions, bool)
        self.region_face = np.asarray(region_face, np.int32).reshape(len(regions), -1)
        self.opt_region = np.asarray(opt_region, np.int32)
        self.cell_region = (
            np.full(h * w, -1, np.int32) if cell_region is None else np.asarray(cell_region, np.int32).reshape(-1)
        )
        self.static_targets = {k: np.asarray(v, np.int32).reshape(-1, 2) for k, v in static_targets.items()}
        self.dest = destination_table(self.walkable, self.regions)
        # One device constant per table (each jnp.asarray of a numpy array inside a trace is a new HLO constant).
        self._dest_j = jnp.asarray(self.dest)
        self._walk_j = jnp.asarray(self.walkable.reshape(-1))
        self._face_j = jnp.asarray(self.region_face.astype(np.int8))
        self.slot_opt = np.repeat(np.arange(len(options), dtype=np.int32), [o.max_targets for o in options])
        self.slot_start = np.concatenate([[0], np.cumsum([o.max_targets for o in options])]).astype(int)

    # -- subclass hooks -----------------------------------------------------------------------------------

    def object_grid(self, state, target_class: str) -> jax.Array:
        """``bool[H, W]`` cells holding an object of ``target_class`` (``"apple"``, ``"dirt"``)."""
        raise NotImplementedError

    def _cooldown(self, state, aid):
        """Cooldown timer of the beam option's beam; 0 where there is none."""
        return jnp.int32(0)

    # -- small helpers --------------------------------------------------------------------------------------

    def _flat(self, rc):
        return rc[..., 0] * self.shape[1] + rc[..., 1]

    def _safe_flat(self, rc):
        """Flat index of (row, col) clipped onto the map (callers mask off-map / -1 targets)."""
        hi = jnp.array(self.shape, jnp.int32) - 1
        return self._flat(jnp.clip(rc, 0, hi))

    def _at(self, grid, rc):
        """``grid[rc]`` for ``rc`` ``int32[..., 2]``; False / 0 for -1 or off-map cells."""
        ok = mp.in_bounds(rc, self.shape)
        return jnp.where(ok, grid.reshape(-1)[self._safe_flat(rc)], jnp.zeros((), grid.dtype))

    def _lookup(self, row, flat):
        """int32 distances ``dest[row, flat]`` with :data:`FAR` mapped to ``paths.UNREACHABLE``."""
        v = self._dest_j[row, flat].astype(jnp.int32)
        return jnp.where(v >= FAR, paths.UNREACHABLE, v)

    def _region_of(self, opt, target):
        """``int32[]`` destination region of a region option (its fixed region, else the target cell's)."""
        fixed = jnp.asarray(self.opt_region)[opt]
        of_cell = jnp.asarray(self.cell_region)[self._safe_flat(target)]
        return jnp.maximum(jnp.where(fixed >= 0, fixed, of_cell), 0)

    def path_length(self, opt, target, cells):
        """Static path length from ``cells`` (``int32[..., 2]``, on the map) to the destination of one
        instance (opt, target): the target cell (walk_onto), its nearest firing pose (beam), or its region.

        Returns:
            ``int32[...]`` (``paths.UNREACHABLE`` if none is reachable; 0 for ``wait``).
        """
        kind = jnp.asarray(self.kinds)[opt]
        fc = self._safe_flat(cells)
        tflat = self._safe_flat(target)
        walk = self._lookup(tflat, fc)
        nb = target[None] + paths.DELTAS  # [4, 2] firing poses
        nb_ok = mp.in_bounds(nb, self.shape) & self._walk_j[self._safe_flat(nb)]
        pose_rows = self._lookup(self._safe_flat(nb).reshape((4,) + (1,) * fc.ndim), fc[None])
        pose = jnp.where(nb_ok.reshape((4,) + (1,) * fc.ndim), pose_rows, paths.UNREACHABLE).min(0)
        region = self._lookup(self.num_cells + self._region_of(opt, target), fc)
        return jnp.select(
            [kind == KIND_WALK_ONTO, kind == KIND_BEAM, kind == KIND_REGION], [walk, pose, region], jnp.zeros_like(walk)
        )

    def target_exists(self, state, opt, target):
        """``bool[]``: the instance has its target (its object is on the target cell / its region exists)."""
        kind = jnp.asarray(self.kinds)[opt]
        has = target[0] >= 0
        obj = jnp.array(False)
        for cls in sorted({o.target_class for o in self.options if o.target_class in ("apple", "dirt")}):
            is_cls = jnp.asarray([o.target_class == cls for o in self.options])[opt]
            obj = obj | (is_cls & self._at(self.object_grid(state, cls), target))
        fixed = jnp.asarray(self.opt_region)[opt] >= 0
        region_ok = fixed | (has & (jnp.asarray(self.cell_region)[self._safe_flat(target)] >= 0))
        return jnp.where(kind == KIND_REGION, region_ok, jnp.where(kind == KIND_WAIT, True, has & obj))

    def view_ranking(self, pos, facing, grid, k: int) -> ViewRanking:
        """The ``k`` first objects of ``grid`` (``bool[H, W]``) in the window of an agent at ``pos``
        (``int32[2]``) facing ``facing``: the ranking the menu instantiates from and the prompt lists.

        In view = :func:`window_objects`. Ranked by static path length from the agent's cell (unreachable last),
        ties by row-major cell index. ``k`` is static.
        """
        pos = jnp.asarray(pos, jnp.int32)
        cells, cand = window_objects(pos, facing, grid)
        flat = self._safe_flat(cells)
        raw = self._dest_j[self._flat(pos), flat].astype(jnp.int32)  # FAR (unreachable) ranks last
        key = jnp.where(cand, raw * self.num_cells + flat, _BIG)
        neg, idx = jax.lax.top_k(-key, k)
        valid = -neg < _BIG
        dist = jnp.where(raw >= FAR, paths.UNREACHABLE, raw)[idx]
        return ViewRanking(
            target=jnp.where(valid[:, None], cells[idx], -1).astype(jnp.int32),
            valid=valid,
            dist=jnp.where(valid, dist, -1).astype(jnp.int32),
            count=jnp.sum(cand, dtype=jnp.int32),
        )

    def visible_nearest(self, state, aid, grid, k: int):
        """The ``k`` nearest cells of ``grid`` (``bool[H, W]``) inside the agent's view window
        (:meth:`view_ranking`: by static path distance from the agent's cell, unreachable last, ties row-major).

        Returns:
            ``(target int32[k, 2], valid bool[k])``.
        """
        view = self.view_ranking(state.pos[aid], state.facing[aid], grid, k)
        return view.target, view.valid

    def region_cell(self, state, aid, region: int):
        """``bool[]`` the agent stands in region ``region``."""
        return jnp.asarray(self.regions[region].reshape(-1))[self._flat(state.pos[aid])]

    # -- protocol -----------------------------------------------------------------------------------------

    def present(self, state):
        return state.alive

    def team_count(self, state):
        return jnp.sum(state.apples_total, dtype=jnp.int32)

    def agent_view(self, state):
        return state.pos, state.alive

    def step_rewards(self, pre, post):
        """One per apple eaten in the step (``post.ate``)."""
        return post.ate.astype(jnp.float32)

    def idle_action(self) -> int:
        return mp.NOOP

    def empty_aux(self):
        return jnp.int32(0)

    def instances(self, state, aid) -> Instances:
        targets, valid = [], []
        for o, spec in enumerate(self.options):
            if spec.target_class in ("apple", "dirt"):
                tg, ok = self.visible_nearest(state, aid, self.object_grid(state, spec.target_class), spec.max_targets)
            elif o in self.static_targets:
                tg = jnp.asarray(self.static_targets[o])
                ok = jnp.ones((spec.max_targets,), bool)
            else:
                tg = jnp.full((spec.max_targets, 2), -1, jnp.int32)
                ok = jnp.ones((spec.max_targets,), bool)
            targets.append(tg)
            valid.append(ok)
        return Instances(
            opt=jnp.asarray(self.slot_opt),
            target=jnp.concatenate(targets).astype(jnp.int32),
            valid=jnp.concatenate(valid),
        )

    def _reason(self, state, aid, opt, target):
        """Explicit reason of ``start`` for one instance: TargetAbsent, then NoPath."""
        kind = jnp.asarray(self.kinds)[opt]
        absent = ~self.target_exists(state, opt, target)
        nopath = (kind != KIND_WAIT) & (self.path_length(opt, target, state.pos[aid]) >= paths.UNREACHABLE)
        return jnp.where(absent, TARGET_ABSENT, jnp.where(nopath, NO_PATH, NO_REASON)).astype(jnp.int32)

    def live_reason(self, state, aid, inst: Instances):
        return jax.vmap(lambda o, t: self._reason(state, aid, o, t))(inst.opt, inst.target)

    def start(self, state, aid, opt, target):
        target = jnp.asarray(target, jnp.int32)
        opt = jnp.asarray(opt, jnp.int32)
        reason = self._reason(state, aid, opt, target)
        ex = Exec(active=reason == NO_REASON, opt=opt, target=target, t=jnp.int32(0), aux=self.empty_aux())
        return ex, reason

    def act(self, state, aid, ex: Exec):
        """One primitive action of a running slot (see the module docstring for the rules)."""
        pos, facing, alive = state.pos[aid], state.facing[aid], state.alive[aid]
        opt, target = jnp.maximum(ex.opt, 0), ex.target
        kind = jnp.asarray(self.kinds)[opt]
        nbrs = pos[None] + paths.DELTAS  # [4, 2]
        nbrs2 = nbrs[:, None] + paths.DELTAS[None]  # [4, 4, 2]: the neighbours' neighbours (look-ahead)
        inside = mp.in_bounds(nbrs, self.shape)
        inside2 = mp.in_bounds(nbrs2, self.shape)
        dist = self.path_length(opt, target, jnp.concatenate([pos[None], nbrs, nbrs2.reshape(16, 2)]))  # [21]
        here = dist[0]
        nd = jnp.where(inside, dist[1:5], paths.UNREACHABLE)
        nd2 = jnp.where(inside2, dist[5:].reshape(4, 4), paths.UNREACHABLE)

        # 1. Movement among free neighbours (other alive agents block; the plan itself ignores them). A
        #    neighbour is "stuck" when none of its own descending neighbours is free (other than this agent's
        #    cell): prefer descending neighbours that are not stuck (ties N < E < S < W); when every descending
        #    neighbour is held by an agent, wait or sidestep (a pseudo-random coin of (step, aid): it breaks the
        #    symmetric livelock of two agents sidestepping in step) to a free neighbour at most one step further,
        #    preferring one that is not stuck (ties rotate with step + aid).
        others = state.alive & (jnp.arange(self.num_agents) != aid)
        occupied = jnp.any(mp.occupied_by(nbrs, state.pos, others), axis=-1)  # [4]
        occupied2 = jnp.any(mp.occupied_by(nbrs2, state.pos, others), axis=-1)  # [4, 4]
        back = jnp.all(nbrs2 == pos, axis=-1)  # the step back onto this agent's cell
        onward = inside2 & ~occupied2 & ~back & (nd2 < nd[:, None])
        stuck = ~onward.any(-1) & (nd > 0)  # [4]
        free = inside & ~occupied & (nd < paths.UNREACHABLE)
        desc = free & (nd < here)
        k4 = jnp.arange(4, dtype=jnp.int32)
        best = jnp.argmin(jnp.where(desc, nd * 8 + stuck * 4 + k4, _BIG)).astype(jnp.int32)
        blocked = jnp.any(occupied & inside & (nd < here))  # a descending neighbour is held by an agent
        rot = (state.step + aid) % 4
        side_ok = free & (nd <= here + 1)
        side = jnp.argmin(jnp.where(side_ok, stuck * 4 + (k4 - rot) % 4, _BIG)).astype(jnp.int32)
        coin = _coin(state.step, aid)
        move = jnp.where(desc.any(), best, jnp.where(blocked & side_ok.any() & coin, side, paths.NO_MOVE))
        move_action = relative_action(facing, move)
        enters = (move >= 0) & (nd[jnp.maximum(move, 0)] == 0)  # this move reaches the destination
        arrived = here == 0

        # 2. Walk onto: drain with the move that enters the target.
        walk_action = jnp.where(arrived, mp.NOOP, move_action)
        walk_drained = arrived | enters

        # 3. Beam: at a pose, turn if the target is behind, wait for the cooldown, FIRE.
        face_ok = facing != paths.facing_toward(target, pos)  # not facing away from the target
        ready = self._cooldown(state, aid) == 0
        beam_action = jnp.where(
            arrived, jnp.where(face_ok, jnp.where(ready, self.beam_action, mp.NOOP), mp.TURN_RIGHT), move_action
        )
        beam_drained = arrived & face_ok & ready

        # 4. Region: walk in, then turn to the region's arrival facing.
        faces = self._face_j[self._region_of(opt, target)].astype(jnp.int32)  # [C]
        want_here = faces[self._flat(pos)]
        want_next = faces[self._safe_flat(pos + paths.DELTAS[jnp.maximum(move, 0)])]
        turn = turn_action(facing, want_here)
        turned = jnp.where(turn == mp.TURN_LEFT, (facing + 3) % 4, (facing + 1) % 4)
        here_ok = (want_here == ANY_FACING) | (facing == want_here)
        region_action = jnp.where(arrived, jnp.where(here_ok, mp.NOOP, turn), move_action)
        region_drained = jnp.where(
            arrived, here_ok | (turned == want_here), enters & ((want_next == ANY_FACING) | (facing == want_next))
        )

        # 5. Wait.
        wait_drained = ex.t + 1 >= self.wait_steps

        action = jnp.select(
            [kind == KIND_WALK_ONTO, kind == KIND_BEAM, kind == KIND_REGION],
            [walk_action, beam_action, region_action],
            mp.NOOP,
        )
        drained = jnp.select(
            [kind == KIND_WALK_ONTO, kind == KIND_BEAM, kind == KIND_REGION],
            [walk_drained, beam_drained, region_drained],
            wait_drained,
        )
        # 6. Abandon: the agent was removed, or the target object is gone (checked every step).
        gone = ~alive | ~self.target_exists(state, opt, target)
        action = jnp.where(gone, mp.NOOP, action).astype(jnp.int32)
        return action, drained | gone, ex._replace(t=ex.t + 1)


def _coin(step, aid) -> jax.Array:
    """``bool[]`` pseudo-random fair coin of (step, agent): one round of an integer hash (lowbias32 mixer)."""
    x = step.astype(jnp.uint32) * np.uint32(0x9E3779B1) + jnp.asarray(aid).astype(jnp.uint32) * np.uint32(0x85EBCA77)
    x = (x ^ (x >> 16)) * np.uint32(0x7FEB352D)
    x = (x ^ (x >> 15)) * np.uint32(0x846CA68B)
    return ((x ^ (x >> 16)) & np.uint32(1)) == 1


def compass_toward(frm: np.ndarray, to: np.ndarray) -> np.ndarray:
    """Compass code of the dominant axis from ``frm`` (float[..., 2]) to ``to``; :data:`ANY_FACING` if equal.

    Ties between axes go to the row axis (N / S).
    """
    d = np.asarray(to, float) - np.asarray(frm, float)
    vertical = np.abs(d[..., 0]) >= np.abs(d[..., 1])
    code = np.where(vertical, np.where(d[..., 0] < 0, mp.NORTH, mp.SOUTH), np.where(d[..., 1] > 0, mp.EAST, mp.WEST))
    same = np.all(np.abs(d) < 0.5, axis=-1)
    return np.where(same, ANY_FACING, code).astype(np.int32)


__all__ = [
    "ANY_FACING",
    "KIND_BEAM",
    "KIND_NAMES",
    "KIND_REGION",
    "KIND_WAIT",
    "KIND_WALK_ONTO",
    "TARGET_CAP",
    "check_wait_steps",
    "TIMEOUT",
    "WAIT_STEPS",
    "WINDOW_CELLS",
    "WINDOW_OFFSETS",
    "MeltingPotOptions",
    "ViewRanking",
    "compass_toward",
    "option_specs",
    "check_target_cap",
    "contract_text",
    "destination_table",
    "in_window",
    "window_cells",
    "window_objects",
]
