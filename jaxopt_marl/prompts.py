"""Prompts per game (paper §5.1 worked example): a fixed system message and a per-decision user message.

The system message states the goal and the two-line response contract::

    state: <label>
    choice: <LETTER>

The user message is built on the host from a NumPy snapshot of the state at a decision point
(:func:`snapshot`): the agent's id, position and facing, what it holds (Overcooked), what it sees
(targets with distances, partners), a short memory (last macros decided, recent team reward), the step
(``Step 4/150``) and the shuffled lettered menu (:func:`jaxopt_marl.menus.render_menu`). Coordinates are
``(x, y) = (column, row)`` as in the menus.

What a Melting Pot agent "sees" has one definition shared with the menu (:func:`mp_view`): its observation
window (11 x 11: 9 cells ahead, 1 behind, 5 to each side, so it turns with the facing;
:func:`jaxopt_marl.options.meltingpot_common.window_cells`). ``Apples in view: n`` counts the objects in that
window; the listed ``nearest`` are the first :data:`MAX_LISTED` of the ranking the menu instantiates its
targets from (:meth:`~jaxopt_marl.options.meltingpot_common.MeltingPotOptions.view_ranking`: static path
length from the agent's cell, unreachable last, ties row-major), and ``d=`` is that path length: steps of the
shortest walk from the agent's cell onto the object's cell through the map's walls, other agents ignored
(``d=unreachable`` when no walk exists). ``Partners in view`` are the alive partners whose cell is in the same
window, and the ``state:`` label (:func:`state_label`) reads the same window. Overcooked agents see the whole
(small) kitchen, as in the paper's example. Prompts are kept compact for CPU speed (~200-300 SmolLM2 tokens).

Team values (``Memory`` line) are integer counts (apples eaten, soups delivered) and are written as integers.
The same text is assembled from pre-tokenized fragments on the device by :mod:`jaxopt_marl.prompt_ids`.

What differs between games is data: each game's prompt family (:attr:`jaxopt_marl.games.GameInfo.family`) is a
:class:`PromptFamily` record in :data:`FAMILIES` (system message, state labels, and the *view*: ``kitchen`` for
Overcooked, ``window`` for Melting Pot), and each view is one :class:`KitchenView` / :class:`WindowView` in
:data:`VIEWS` (what the snapshot reads, the label rule, the user message's world lines). A new game of an existing
kind is a :class:`jaxopt_marl.games.GameInfo` record; a new family, a :data:`FAMILIES` record.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxopt_marl import games
from jaxopt_marl.options import meltingpot_common as mpc
from jaxopt_marl.paths import UNREACHABLE

#: Targets listed per class in a Melting Pot prompt (nearest first).
MAX_LISTED = 3
#: Macros remembered per agent.
MEMORY_MACROS = 5
#: What the memory line calls the remembered decisions (``- Last 5 macros decided: ...``); the other interfaces'
#: nouns are :data:`jaxopt_marl.interfaces.MEMORY_NOUNS`.
MEMORY_NOUN = "macros decided"

# Compass names: Melting Pot facing codes (N=0, E=1, S=2, W=3); Overcooked codes (0 N, 1 S, 2 E, 3 W).
MP_FACING = ("North", "East", "South", "West")
OC_FACING = ("North", "South", "East", "West")
OC_ITEMS = ("nothing", "onion", "dish", "soup")

_CONTRACT = "Output format (exactly two lines, nothing else):\nstate: <{labels}>\nchoice: <single capital letter>"

SYSTEM = {
    "overcooked": (
        "You are an agent in a 2-player cooperative Overcooked-AI kitchen.\n\n"
        "Goal: place 3 onions in a pot, start the cook, plate the soup with a dish, deliver to the "
        "serving station. Each delivery scores +20 (shared with partner).\n\n"
        "The action menu only lists currently-feasible actions. Pick one letter.\n\n"
    ),
    "cleanup": (
        "You are an agent in Cleanup, a 7-player grid game. Apples grow in the orchard only while the "
        "river is clean; dirt builds up in the river. Eating an apple scores +1 for the team; cleaning "
        "dirt scores nothing but lets apples regrow.\n\n"
        "The action menu only lists currently-feasible actions. Pick one letter.\n\n"
    ),
    "harvest": (
        "You are an agent in Commons Harvest, a 7-player grid game. Eating an apple scores +1 for the "
        "team. Apples regrow only near other apples: a patch eaten bare never regrows.\n\n"
        "The action menu only lists currently-feasible actions. Pick one letter.\n\n"
    ),
}

#: The ``state:`` labels of each game's response contract.
STATE_LABELS = {
    "overcooked": ("empty", "filling", "cooking", "ready_to_plate", "delivering"),
    "cleanup": ("harvesting", "cleaning", "exploring"),
    "harvest": ("harvesting", "conserving", "exploring"),
}


@dataclasses.dataclass(frozen=True)
class PromptFamily:
    """What one prompt family's prompts say and read.

    Attributes:
        name: the family (:attr:`jaxopt_marl.games.GameInfo.family`).
        system: the system message's goal text (:data:`SYSTEM`), before the response contract.
        labels: the ``state:`` labels of the response contract (:data:`STATE_LABELS`), index = label code.
        view: what an agent sees, the key of :data:`VIEWS` (and of :mod:`jaxopt_marl.prompt_ids`' device
            templates): ``kitchen`` (Overcooked: the whole small kitchen, as in the paper's example) or
            ``window`` (Melting Pot: the agent's observation window).
    """

    name: str
    system: str
    labels: tuple[str, ...]
    view: str


#: The prompt families by name.
FAMILIES = {
    "overcooked": PromptFamily("overcooked", SYSTEM["overcooked"], STATE_LABELS["overcooked"], "kitchen"),
    "cleanup": PromptFamily("cleanup", SYSTEM["cleanup"], STATE_LABELS["cleanup"], "window"),
    "harvest": PromptFamily("harvest", SYSTEM["harvest"], STATE_LABELS["harvest"], "window"),
}


def family(game: str) -> str:
    """The prompt family of ``game`` (:attr:`jaxopt_marl.games.GameInfo.family`: ``overcooked`` for
    ``overcooked_aa`` / ``overcooked_fc``); an unknown name is its own family."""
    return games.GAMES[game].family if game in games.GAMES else game


def prompt_family(game: str) -> PromptFamily:
    """The :class:`PromptFamily` of ``game``.

    Raises:
        ValueError: unknown game (naming the known ones).
    """
    fam = family(game)
    if fam not in FAMILIES:
        raise ValueError(f"unknown game {game!r}; known: {', '.join(games.GAMES)}")
    return FAMILIES[fam]


def system_message(game: str) -> str:
    """The fixed system message of ``game`` (goal + two-line response contract)."""
    fam = prompt_family(game)
    return fam.system + _CONTRACT.format(labels=" | ".join(fam.labels))


# ---------------------------------------------------------------------------------------------------------
# Snapshots (device -> host) at decision points
# ---------------------------------------------------------------------------------------------------------


def make_snapshot_fn(game: str, env):
    """Jitted ``fn(states [B]) -> dict of arrays [B, ...]`` with what the prompts read.

    Overcooked: ``pos int32[B, 2, 2]`` (row, col), ``facing int32[B, 2]``, ``held int32[B, 2]``, ``pot_onions``,
    ``pot_cooking``, ``pot_ready`` ``[B, P]``, ``counter_items int32[B, K]``, ``step``, ``team``.
    Melting Pot: ``pos``, ``facing``, ``alive``, ``apples bool[B, H, W]``, ``dirt`` (Cleanup), ``step``, ``team``.
    """
    one = view(game).snapshot_one(game, env)
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


def _num(v: float) -> str:
    """A team value as text: integers exactly (``1234567``, never ``1.23457e+06``), other values ``:g``."""
    v = float(v)
    return str(int(v)) if v.is_integer() else f"{v:g}"


def _dist(d) -> str:
    """A path length as text: the number of steps, or ``unreachable`` (``>= paths.UNREACHABLE``)."""
    return "unreachable" if int(d) >= UNREACHABLE else str(int(d))


def _memory_lines(mem: Memory, team: float, noun: str = MEMORY_NOUN) -> list[str]:
    """The memory lines; ``noun`` names the remembered decisions (:data:`MEMORY_NOUN`, or an interface's)."""
    last = ", ".join(mem.macros) if mem.macros else "none"
    return [
        "Memory:",
        f"- Last {MEMORY_MACROS} {noun}: {last}",
        f"- Team reward since your last decision: {_num(team - mem.team_at_last)} (episode total {_num(team)})",
    ]


# ---------------------------------------------------------------------------------------------------------
# State labels (also the fixed response prefix of the ``choice_only`` scoring mode)
# ---------------------------------------------------------------------------------------------------------


def overcooked_label_code(
    held: jax.Array, pot_onions: jax.Array, pot_cooking: jax.Array, pot_ready: jax.Array, aid
) -> jax.Array:
    """``int32[]`` index into ``STATE_LABELS["overcooked"]`` (jittable): ``delivering`` if the agent holds a soup
    (``held int32[2]`` item code 3), else ``ready_to_plate`` / ``cooking`` / ``filling`` if any pot (``[P]``)
    is ready / cooking / holds an onion, else ``empty``."""
    code = jnp.where(jnp.any(pot_onions > 0), 1, 0)
    code = jnp.where(jnp.any(pot_cooking), 2, code)
    code = jnp.where(jnp.any(pot_ready), 3, code)
    return jnp.where(jnp.asarray(held)[aid] == OC_ITEMS.index("soup"), 4, code).astype(jnp.int32)


def meltingpot_label_code(
    pos: jax.Array, facing: jax.Array, aid, apples: jax.Array, dirt: jax.Array | None
) -> jax.Array:
    """``int32[]`` index into ``STATE_LABELS[game]`` (jittable): ``harvesting`` if an apple is in view (the
    agent's window, :func:`jaxopt_marl.options.meltingpot_common.window_objects`), else ``cleaning`` if dirt is
    in view (Clean Up; ``dirt`` None for Harvest), else ``exploring``. ``pos int32[N, 2]``, ``facing int32[N]``,
    grids ``bool[H, W]``."""
    p, f = jnp.asarray(pos)[aid], jnp.asarray(facing)[aid]
    code = jnp.int32(2)
    if dirt is not None:
        code = jnp.where(mpc.window_objects(p, f, dirt)[1].any(), 1, code)
    return jnp.where(mpc.window_objects(p, f, apples)[1].any(), 0, code).astype(jnp.int32)


_oc_label_jit = jax.jit(overcooked_label_code)
_mp_label_jit = jax.jit(meltingpot_label_code)


def state_label(game: str, snap: dict, aid: int) -> str:
    """A deterministic label of the situation from the agent's point of view (one of :data:`STATE_LABELS`).

    Overcooked: :func:`overcooked_label_code`; Melting Pot: :func:`meltingpot_label_code` (what is in view).
    """
    return prompt_family(game).labels[int(view(game).label_code(snap, aid))]


# ---------------------------------------------------------------------------------------------------------
# User messages
# ---------------------------------------------------------------------------------------------------------


def mp_view(
    lib, pos: jax.Array, facing: jax.Array, alive: jax.Array, aid, apples: jax.Array, dirt: jax.Array | None
) -> dict:
    """What a Melting Pot agent sees (jittable; the one definition the host text and the device prompt share).

    Args:
        lib: the game's :class:`~jaxopt_marl.options.meltingpot_common.MeltingPotOptions`.
        pos: ``int32[N, 2]`` (row, col); facing: ``int32[N]`` compass codes; alive: ``bool[N]``.
        aid: the agent (may be traced).
        apples, dirt: ``bool[H, W]`` object grids (``dirt`` None for Harvest).

    Returns:
        ``{"apples": ViewRanking, "dirt": ViewRanking (Clean Up only), "partners": bool[N]}``: the first
        :data:`MAX_LISTED` objects of the menu's ranking (:meth:`view_ranking`, with counts), and the alive
        partners whose cell is in the window.
    """
    pos, facing = jnp.asarray(pos, jnp.int32), jnp.asarray(facing, jnp.int32)
    p, f = pos[aid], facing[aid]
    out = {"apples": lib.view_ranking(p, f, apples, MAX_LISTED)}
    if dirt is not None:
        out["dirt"] = lib.view_ranking(p, f, dirt, MAX_LISTED)
    others = jnp.asarray(alive, bool) & (jnp.arange(pos.shape[0]) != aid)
    out["partners"] = others & mpc.in_window(p, f, pos)
    return out


@functools.lru_cache(maxsize=16)
def _mp_view_jit(lib):
    """:func:`mp_view` of ``lib``, jitted once per library (host prompts)."""
    return jax.jit(functools.partial(mp_view, lib))


def _listed(name: str, view) -> str:
    n = int(view.count)
    if not n:
        return f"{name} in view: 0"
    near = ", ".join(f"{_xy(c)} d={_dist(k)}" for c, k, ok in zip(view.target, view.dist, view.valid) if ok)
    return f"{name} in view: {n} (nearest: {near})"


def user_message(
    game: str, snap: dict, aid: int, menu_text: str, max_steps: int, mem: Memory | None = None, lib=None
) -> str:
    """The user message of one decision.

    Args:
        game: game name.
        snap: one env's snapshot (:func:`take` of :func:`make_snapshot_fn`'s output).
        aid: the deciding agent.
        menu_text: from :func:`jaxopt_marl.menus.render_menu`.
        max_steps: episode length (``Step t/T``).
        mem: the agent's memory (None = empty).
        lib: the option library (Overcooked: pot/counter cells and path distances; Melting Pot: the view
            ranking and path lengths of :func:`mp_view`).

    Raises:
        ValueError: ``lib`` is None.
    """
    if lib is None:
        raise ValueError(f"user_message of {game!r} needs the option library (lib=None)")
    mem = mem or Memory()
    team = float(snap["team"])
    step = f"Step {int(snap['step'])}/{max_steps}."
    lines = view(game).lines(snap, aid, lib)
    return "\n".join(
        lines + [step, ""] + _memory_lines(mem, team) + ["", menu_text, "", "Choose one. Reply with exactly two lines."]
    )


def _overcooked_lines(snap: dict, aid: int, lib) -> list[str]:
    pos, facing, held = snap["pos"], snap["facing"], snap["held"]
    p = 1 - aid
    lines = [
        f"You are player {aid}. World position: {_xy(pos[aid])}.",
        f"Facing: {OC_FACING[int(facing[aid])]}. Holding: {OC_ITEMS[int(held[aid])]}.",
        f"Partner (player {p}): pos={_xy(pos[p])} facing={OC_FACING[int(facing[p])]} holding={OC_ITEMS[int(held[p])]}.",
        "",
        "Pots:",
    ]
    info = lib.info
    w = info.width

    def dist(target, who):
        return _dist(lib.pose_dist[int(target[0]) * w + int(target[1]), int(pos[who][0]) * w + int(pos[who][1])])

    for i, pot in enumerate(info.pots):
        n = int(snap["pot_onions"][i])
        status = "ready" if snap["pot_ready"][i] else "cooking" if snap["pot_cooking"][i] else f"{n}/3 onions"
        lines.append(f"  - pot@{_xy(pot)}: {status}; you: {dist(pot, aid)} | partner: {dist(pot, p)}")
    items = snap["counter_items"]
    on = [f"{OC_ITEMS[int(items[k])]}@{_xy(info.counters[k])}" for k in np.flatnonzero(items)]
    lines.append("Counters: " + (", ".join(on) if on else "(empty)"))
    return lines


def _meltingpot_lines(snap: dict, aid: int, lib) -> list[str]:
    pos, facing, alive = snap["pos"], snap["facing"], snap["alive"]
    view = jax.tree.map(np.asarray, _mp_view_jit(lib)(pos, facing, alive, aid, snap["apples"], snap.get("dirt")))
    lines = [
        f"You are player {aid}. World position: {_xy(pos[aid])}. Facing: {MP_FACING[int(facing[aid])]}.",
        _listed("Apples", view["apples"]),
    ]
    if "dirt" in snap:
        lines.append(_listed("Dirt", view["dirt"]))
    near = [int(j) for j in np.flatnonzero(view["partners"])]
    lines.append("Partners in view: " + (", ".join(f"player {j} @ {_xy(pos[j])}" for j in near) if near else "none"))
    return lines


# ---------------------------------------------------------------------------------------------------------
# Views: what differs between the kitchen and the Melting Pot window
# ---------------------------------------------------------------------------------------------------------


class KitchenView:
    """Overcooked: the agent sees the whole kitchen (players, pots, counters)."""

    @staticmethod
    def snapshot_one(game: str, env):
        """The snapshot of one state (:func:`make_snapshot_fn`'s Overcooked fields)."""
        from envs_jax import overcooked as oc

        pots = env.layout_info.pots
        counters = env.layout_info.counters

        def one(s):
            view = oc.pot_view(s, pots)
            return dict(
                pos=oc.agent_positions(s),
                facing=oc.agent_facing(s),
                held=oc.held_items(s),
                pot_onions=view.onions,
                pot_cooking=view.cooking,
                pot_ready=view.ready,
                counter_items=oc.cells_items(s, counters),
                step=s.step,
                team=s.deliveries,
            )

        return one

    @staticmethod
    def label_code(snap: dict, aid: int):
        """:func:`overcooked_label_code` of one env's snapshot."""
        return _oc_label_jit(snap["held"], snap["pot_onions"], snap["pot_cooking"], snap["pot_ready"], aid)

    @staticmethod
    def lines(snap: dict, aid: int, lib) -> list[str]:
        """The user message's world lines (:func:`_overcooked_lines`)."""
        return _overcooked_lines(snap, aid, lib)


class WindowView:
    """Melting Pot: the agent sees its observation window (:func:`mp_view`)."""

    @staticmethod
    def snapshot_one(game: str, env):
        """The snapshot of one state (:func:`make_snapshot_fn`'s Melting Pot fields; ``dirt`` where the game
        has dirt, :attr:`jaxopt_marl.games.GameInfo.dirt`)."""
        dirt = games.info(game).dirt

        def one(s):
            out = dict(
                pos=s.pos, facing=s.facing, alive=s.alive, apples=s.apples, step=s.step, team=jnp.sum(s.apples_total)
            )
            if dirt:
                out["dirt"] = s.dirt
            return out

        return one

    @staticmethod
    def label_code(snap: dict, aid: int):
        """:func:`meltingpot_label_code` of one env's snapshot."""
        return _mp_label_jit(snap["pos"], snap["facing"], aid, snap["apples"], snap.get("dirt"))

    @staticmethod
    def lines(snap: dict, aid: int, lib) -> list[str]:
        """The user message's world lines (:func:`_meltingpot_lines`)."""
        return _meltingpot_lines(snap, aid, lib)


#: The views by :attr:`PromptFamily.view`.
VIEWS = {"kitchen": KitchenView(), "window": WindowView()}


def view(game: str):
    """The view (:data:`VIEWS`) of ``game``'s prompt family."""
    return VIEWS[prompt_family(game).view]


__all__ = [
    "MAX_LISTED",
    "MEMORY_MACROS",
    "MEMORY_NOUN",
    "FAMILIES",
    "KitchenView",
    "MP_FACING",
    "Memory",
    "OC_FACING",
    "OC_ITEMS",
    "PromptFamily",
    "VIEWS",
    "STATE_LABELS",
    "SYSTEM",
    "family",
    "make_snapshot_fn",
    "meltingpot_label_code",
    "mp_view",
    "overcooked_label_code",
    "prompt_family",
    "state_label",
    "system_message",
    "take",
    "user_message",
    "view",
    "WindowView",
]
