"""Prompts per game (paper §5.1 worked example): a fixed system message and a per-decision user message.

The system message states the goal and the two-line response contract::

    state: <label>
    choice: <LETTER>

The user message is built on the host from a NumPy snapshot of the state at a decision point
(:func:`snapshot`): the agent's id, position and facing, what it holds (Overcooked), what it sees
(targets with distances, partners), a short memory (last macros decided, recent team reward), the step
(``Step 4/150``) and the shuffled lettered menu (:func:`jaxopt_marl.menus.render_menu`). Coordinates are
``(x, y) = (column, row)`` as in the menus.

What an agent "sees" in Melting Pot is approximated by a square window of :data:`VIEW_RADIUS` cells
around it (Melting Pot's egocentric window is 11 x 11); Overcooked agents see the whole (small) kitchen,
as in the paper's example. Prompts are kept compact for CPU speed (~200-300 SmolLM2 tokens).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxopt_marl.paths import UNREACHABLE

#: Melting Pot: cells within this Chebyshev radius count as "in view".
VIEW_RADIUS = 5
#: Targets listed per class in a Melting Pot prompt (nearest first).
MAX_LISTED = 3
#: Macros remembered per agent.
MEMORY_MACROS = 5

# Compass names: Melting Pot facing codes (N=0, E=1, S=2, W=3); Overcooked codes (0 N, 1 S, 2 E, 3 W).
MP_FACING = ("North", "East", "South", "West")
OC_FACING = ("North", "South", "East", "West")
OC_ITEMS = ("nothing", "onion", "dish", "soup")

_CONTRACT = ("Output format (exactly two lines, nothing else):\n"
             "state: <{labels}>\n"
             "choice: <single capital letter>")

SYSTEM = {
    "overcooked": (
        "You are an agent in a 2-player cooperative Overcooked-AI kitchen.\n\n"
        "Goal: place 3 onions in a pot, start the cook, plate the soup with a dish, deliver to the "
        "serving station. Each delivery scores +20 (shared with partner).\n\n"
        "The action menu only lists currently-feasible actions. Pick one letter.\n\n"),
    "cleanup": (
        "You are an agent in Cleanup, a 7-player grid game. Apples grow in the orchard only while the "
        "river is clean; dirt builds up in the river. Eating an apple scores +1 for the team; cleaning "
        "dirt scores nothing but lets apples regrow.\n\n"
        "The action menu only lists currently-feasible actions. Pick one letter.\n\n"),
    "harvest": (
        "You are an agent in Commons Harvest, a 7-player grid game. Eating an apple scores +1 for the "
        "team. Apples regrow only near other apples: a patch eaten bare never regrows.\n\n"
        "The action menu only lists currently-feasible actions. Pick one letter.\n\n"),
}

#: The ``state:`` labels of each game's response contract.
STATE_LABELS = {
    "overcooked": ("empty", "filling", "cooking", "ready_to_plate", "delivering"),
    "cleanup": ("harvesting", "cleaning", "exploring"),
    "harvest": ("harvesting", "conserving", "exploring"),
}


def family(game: str) -> str:
    """``overcooked`` for ``overcooked_aa`` / ``overcooked_fc``, else the game name."""
    return "overcooked" if game.startswith("overcooked") else game


def system_message(game: str) -> str:
    """The fixed system message of ``game`` (goal + two-line response contract)."""
    fam = family(game)
    if fam not in SYSTEM:
        raise ValueError(f"unknown game {game!r}; known: cleanup, harvest, overcooked_aa, overcooked_fc")
    return SYSTEM[fam] + _CONTRACT.format(labels=" | ".join(STATE_LABELS[fam]))


# ---------------------------------------------------------------------------------------------------------
# Snapshots (device -> host) at decision points
# ---------------------------------------------------------------------------------------------------------


def make_snapshot_fn(game: str, env):
    """Jitted ``fn(states [B]) -> dict of arrays [B, ...]`` with what the prompts read.

    Overcooked: ``pos int32[B, 2, 2]`` (row, col), ``facing int32[B, 2]``, ``held int32[B, 2]``, ``pot_onions``,
    ``pot_cooking``, ``pot_ready`` ``[B, P]``, ``counter_items int32[B, K]``, ``step``, ``team``.
    Melting Pot: ``pos``, ``facing``, ``alive``, ``apples bool[B, H, W]``, ``dirt`` (Cleanup), ``step``, ``team``.
    """
    if family(game) == "overcooked":
        from envs_jax import overcooked as oc

        pots = env.layout_info.pots
        counters = env.layout_info.counters

        def one(s):
            view = oc.pot_view(s, pots)
            return dict(pos=oc.agent_positions(s), facing=oc.agent_facing(s), held=oc.held_items(s),
                        pot_onions=view.onions, pot_cooking=view.cooking, pot_ready=view.ready,
                        counter_items=oc.cells_items(s, counters), step=s.step, team=s.deliveries)
    else:
        def one(s):
            out = dict(pos=s.pos, facing=s.facing, alive=s.alive, apples=s.apples, step=s.step,
                       team=jnp.sum(s.apples_total))
            if hasattr(s, "dirt"):
                out["dirt"] = s.dirt
            return out

    fn = jax.jit(jax.vmap(one))
    return lambda states: {k: np.asarray(v) for k, v in fn(states).items()}


def take(snap: dict, b: int) -> dict:
    """Env ``b``'s slice of a batched snapshot."""
    return {k: v[b] for k, v in snap.items()}


# ---------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Memory:
    """One agent's short memory within an episode (host side)."""

    macros: list = dataclasses.field(default_factory=list)
    team_at_last: float = 0.0

    def remember(self, macro: str, team: float) -> None:
        self.macros = (self.macros + [macro])[-MEMORY_MACROS:]
        self.team_at_last = float(team)


def _xy(rc) -> str:
    return f"({int(rc[1])}, {int(rc[0])})"


def _memory_lines(mem: Memory, team: float) -> list[str]:
    last = ", ".join(mem.macros) if mem.macros else "none"
    return ["Memory:", f"- Last {MEMORY_MACROS} macros decided: {last}",
            f"- Team reward since your last decision: {team - mem.team_at_last:g} (episode total {team:g})"]


# ---------------------------------------------------------------------------------------------------------
# State labels (also the fixed response prefix of the ``choice_only`` scoring mode)
# ---------------------------------------------------------------------------------------------------------


def state_label(game: str, snap: dict, aid: int) -> str:
    """A deterministic label of the situation from the agent's point of view (one of :data:`STATE_LABELS`)."""
    if family(game) == "overcooked":
        if snap["held"][aid] == 3:
            return "delivering"
        if snap["pot_ready"].any():
            return "ready_to_plate"
        if snap["pot_cooking"].any():
            return "cooking"
        if (snap["pot_onions"] > 0).any():
            return "filling"
        return "empty"
    apples, _ = _visible(snap["apples"], snap["pos"][aid])
    if apples.size:
        return "harvesting"
    if "dirt" in snap and _visible(snap["dirt"], snap["pos"][aid])[0].size:
        return "cleaning"
    return "exploring"


# ---------------------------------------------------------------------------------------------------------
# User messages
# ---------------------------------------------------------------------------------------------------------


def _visible(grid: np.ndarray, pos) -> tuple[np.ndarray, np.ndarray]:
    """Cells (row, col) of ``grid`` within :data:`VIEW_RADIUS` of ``pos``, nearest first, and their distances."""
    r, c = int(pos[0]), int(pos[1])
    h, w = grid.shape
    r0, r1, c0, c1 = max(r - VIEW_RADIUS, 0), min(r + VIEW_RADIUS + 1, h), max(c - VIEW_RADIUS, 0), \
        min(c + VIEW_RADIUS + 1, w)
    cells = np.argwhere(grid[r0:r1, c0:c1]) + np.array([r0, c0])
    d = np.abs(cells - np.array([r, c])).sum(-1)
    order = np.lexsort((cells[:, 1], cells[:, 0], d))
    return cells[order], d[order]


def _listed(name: str, grid: np.ndarray, pos) -> str:
    cells, d = _visible(grid, pos)
    if not cells.size:
        return f"{name} in view: 0"
    near = ", ".join(f"{_xy(c)} d={int(k)}" for c, k in zip(cells[:MAX_LISTED], d[:MAX_LISTED]))
    return f"{name} in view: {len(cells)} (nearest: {near})"


def user_message(game: str, snap: dict, aid: int, menu_text: str, max_steps: int, mem: Memory | None = None,
                 lib=None) -> str:
    """The user message of one decision.

    Args:
        game: game name.
        snap: one env's snapshot (:func:`take` of :func:`make_snapshot_fn`'s output).
        aid: the deciding agent.
        menu_text: from :func:`jaxopt_marl.menus.render_menu`.
        max_steps: episode length (``Step t/T``).
        mem: the agent's memory (None = empty).
        lib: the option library (Overcooked: pot/counter cells and path distances).
    """
    mem = mem or Memory()
    team = float(snap["team"])
    step = f"Step {int(snap['step'])}/{max_steps}."
    if family(game) == "overcooked":
        lines = _overcooked_lines(snap, aid, lib)
    else:
        lines = _meltingpot_lines(game, snap, aid)
    return "\n".join(lines + [step, ""] + _memory_lines(mem, team) + ["", menu_text, "",
                                                                      "Choose one. Reply with exactly two lines."])


def _overcooked_lines(snap: dict, aid: int, lib) -> list[str]:
    pos, facing, held = snap["pos"], snap["facing"], snap["held"]
    p = 1 - aid
    lines = [f"You are player {aid}. World position: {_xy(pos[aid])}.",
             f"Facing: {OC_FACING[int(facing[aid])]}. Holding: {OC_ITEMS[int(held[aid])]}.",
             f"Partner (player {p}): pos={_xy(pos[p])} facing={OC_FACING[int(facing[p])]} "
             f"holding={OC_ITEMS[int(held[p])]}.", "", "Pots:"]
    info = lib.info
    w = info.width

    def dist(target, who):
        d = int(lib.pose_dist[int(target[0]) * w + int(target[1]), int(pos[who][0]) * w + int(pos[who][1])])
        return "unreachable" if d >= UNREACHABLE else str(d)

    for i, pot in enumerate(info.pots):
        n = int(snap["pot_onions"][i])
        status = "ready" if snap["pot_ready"][i] else "cooking" if snap["pot_cooking"][i] else f"{n}/3 onions"
        lines.append(f"  - pot@{_xy(pot)}: {status}; you: {dist(pot, aid)} | partner: {dist(pot, p)}")
    items = snap["counter_items"]
    on = [f"{OC_ITEMS[int(items[k])]}@{_xy(info.counters[k])}" for k in np.flatnonzero(items)]
    lines.append("Counters: " + (", ".join(on) if on else "(empty)"))
    return lines


def _meltingpot_lines(game: str, snap: dict, aid: int) -> list[str]:
    pos, facing, alive = snap["pos"], snap["facing"], snap["alive"]
    lines = [f"You are player {aid}. World position: {_xy(pos[aid])}. Facing: {MP_FACING[int(facing[aid])]}.",
             _listed("Apples", snap["apples"], pos[aid])]
    if "dirt" in snap:
        lines.append(_listed("Dirt", snap["dirt"], pos[aid]))
    near = [j for j in range(len(pos)) if j != aid and alive[j]
            and np.abs(pos[j] - pos[aid]).max() <= VIEW_RADIUS]
    lines.append("Partners in view: " + (", ".join(f"player {j} @ {_xy(pos[j])}" for j in near) if near
                                         else "none"))
    return lines


__all__ = ["MP_FACING", "Memory", "OC_FACING", "STATE_LABELS", "SYSTEM", "VIEW_RADIUS", "family",
           "make_snapshot_fn", "state_label", "system_message", "take", "user_message"]
