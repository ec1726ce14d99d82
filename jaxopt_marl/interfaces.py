"""Action interfaces of the LLM policy (paper §4, §6.2 Table 2): ``menu``, ``native`` and ``compound_json``.

The interface is what the LLM is shown and what its answer means. All three run through the same host rollout
(:class:`jaxopt_marl.rollout.Roller`; ``menu`` and ``native`` also through the compiled one,
:class:`jaxopt_marl.compiled_rollout.CompiledRoller`, which a run plays), traces and PA-MAGRPO update; the update trains the tokens each one
generates (the whole sampled response in ``sample`` mode, the letter in ``choice_only``).

``menu`` (the method)
    The lettered, guard-filtered, shuffled menu of option instances (:mod:`jaxopt_marl.menus`); the two-line
    ``state: ... / choice: X`` answer (:mod:`jaxopt_marl.parsing`). Played by the compiled rollout in a run.

``native`` (Ablations A and C, §4)
    One LLM call per agent per environment step: the menu is the game's primitive actions as letters in the
    simulator's action order, never shuffled and never filtered -- Cleanup ``A`` NOOP .. ``I`` FIRE_CLEAN
    (Melting Pot's ``ACTION_SET`` of ``clean_up.py``; §4's trace answers ``choice: I`` for FIRE_CLEAN), Harvest
    the same without FIRE_CLEAN (8), Overcooked the six of Overcooked-AI (``Action.ALL_ACTIONS``: NORTH,
    SOUTH, EAST, WEST, STAY, INTERACT in this port's index order 0..5). The options are those primitive
    actions (:class:`NativeLibrary`: one step each, no target, effect always true), so the macro-action
    machinery runs them unchanged and every option ends after one step (call ratio 1.00). The prompt is §4's:
    world position, facing, what is in view with path distances (the menu interface's world lines), a layout
    hint (:func:`layout_hint`: where the river and the orchard lie, the apple patches, the kitchen's
    dispensers), partners, step and the last actions taken. Same two-line answer and parser as ``menu``. Played
    by the compiled rollout in a run too (its device prompt template: :mod:`jaxopt_marl.prompt_ids`).

``compound_json`` (Ablation D, §6.2)
    No menu and no guards: the prompt lists the option family's action types with their arguments
    (:func:`action_catalogue`), and the LLM writes one JSON object, ``{"action": "clean_dirt", "target": [4, 5]}``
    or ``{"action": "wait"}`` (coordinates ``(x, y) = (column, row)`` as in the menus). A valid object runs
    through the same executors as the menu's instance of that option and target. An invalid one is a counted
    no-op (the agent waits, as after a menu parse failure), tallied by reason in the parse counts
    (:data:`COMPOUND_REASONS`): ``empty``, ``no_json`` (no ``{``), ``malformed_json``, ``unknown_action``
    (missing, not a string, or not an option name), ``bad_target`` (a targeted action without two integer
    coordinates), ``target_absent`` (no instance of that option at that target in the agent's instance table:
    the target "does not exist"; the table is the menu's before guards, so e.g. dirt must be in view) and
    ``executor:<Reason>`` (the executor refused to start: ``executor:NoPath``, counted by the rollout).
    ``choice_only`` scoring does not apply (there is no letter to score): a ``compound_json`` run samples.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxopt_marl import prompts
from jaxopt_marl.config import COMPOUND_MAX_NEW_TOKENS, INTERFACES, check_interface
from jaxopt_marl.config import interface_overrides as run_overrides
from jaxopt_marl.options.base import NO_REASON, NO_TARGET, Exec, Instances, OptionLibrary, OptionSpec

#: The action interfaces (:data:`jaxopt_marl.config.INTERFACES`, ``RunConfig.interface``); ``run_overrides`` is
#: :func:`jaxopt_marl.config.interface_overrides`, ``COMPOUND_MAX_NEW_TOKENS`` its response budget.
MENU, NATIVE, COMPOUND_JSON = INTERFACES


# ---------------------------------------------------------------------------------------------------------
# Native actions
# ---------------------------------------------------------------------------------------------------------

#: Primitive actions per prompt family, in the simulator's action order: (name, what it does).
#: Melting Pot: ``envs_jax.meltingpot.ACTION_NAMES`` (clean_up.py ACTION_SET; Harvest has no FIRE_CLEAN).
#: Overcooked: Overcooked-AI's Direction names for this port's moves 0 up, 1 down, 2 right, 3 left, 4, 5.
NATIVE_ACTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "cleanup": (
        ("NOOP", "do nothing"),
        ("FORWARD", "step forward"),
        ("BACKWARD", "step backward"),
        ("STEP_LEFT", "step left"),
        ("STEP_RIGHT", "step right"),
        ("TURN_LEFT", "turn left 90 degrees"),
        ("TURN_RIGHT", "turn right 90 degrees"),
        ("FIRE_ZAP", "fire the zapping beam ahead"),
        ("FIRE_CLEAN", "fire the cleaning beam ahead"),
    ),
    "overcooked": (
        ("NORTH", "move or turn north"),
        ("SOUTH", "move or turn south"),
        ("EAST", "move or turn east"),
        ("WEST", "move or turn west"),
        ("STAY", "do nothing"),
        ("INTERACT", "interact with the cell you face"),
    ),
}
NATIVE_ACTIONS["harvest"] = NATIVE_ACTIONS["cleanup"][:8]


def native_actions(game: str) -> tuple[tuple[str, str], ...]:
    """The primitive actions of ``game`` as ``(NAME, description)``, index = the env's action id."""
    return NATIVE_ACTIONS[prompts.family(game)]


class NativeLibrary(OptionLibrary):
    """The primitive actions of a game as one-step options (the ``native`` interface).

    Option ``i`` is the env's action ``i`` (:func:`native_actions`): no target, one instance, always valid,
    never failing at start; its executor emits the action once and drains (the option ends after that step);
    its effect predicate is always true (a primitive action has no promised effect). There are no read-set
    features, so no guard can be mined or applied. Scores and views (``present``, ``team_count``,
    ``agent_view``, ``step_rewards``, ``idle_action``) are the game's own option library's (``base``), which
    the native prompt also reads (what is in view, path distances).

    Args:
        base: the game's option library (any variant).
    """

    def __init__(self, base: OptionLibrary):
        self.base = base
        self.game = base.game
        self.num_agents = base.num_agents
        acts = native_actions(base.game)
        self.options = tuple(
            OptionSpec(
                name=name.lower(),
                label=f"{name} ({what})",
                target_class=NO_TARGET,
                read_set=(),
                solo_only=False,
                max_targets=1,
                contract=f"instantiation: always one instance; executor: action {i} ({name}) for one step; "
                "termination: after that step; effect: none (always true)",
            )
            for i, (name, what) in enumerate(acts)
        )
        self.feature_specs = ()
        self.timeout = 1
        self.slot_opt = np.arange(len(acts), dtype=np.int32)
        self.reasons = base.reasons
        self.env = getattr(base, "env", None)

    def present(self, state):
        return self.base.present(state)

    def instances(self, state, aid) -> Instances:
        n = len(self.slot_opt)
        return Instances(jnp.asarray(self.slot_opt), jnp.full((n, 2), -1, jnp.int32), jnp.ones((n,), bool))

    def features(self, state, aid, inst: Instances):
        return jnp.zeros((inst.opt.shape[0], 0), jnp.int32)

    def live_reason(self, state, aid, inst: Instances):
        return jnp.full(inst.opt.shape, NO_REASON, jnp.int32)

    def empty_aux(self):
        return jnp.int32(0)

    def start(self, state, aid, opt, target):
        ex = Exec(
            active=jnp.array(True),
            opt=jnp.asarray(opt, jnp.int32),
            target=jnp.asarray(target, jnp.int32),
            t=jnp.int32(0),
            aux=self.empty_aux(),
        )
        return ex, jnp.int32(NO_REASON)

    def act(self, state, aid, ex: Exec):
        return jnp.maximum(ex.opt, 0).astype(jnp.int32), jnp.array(True), ex._replace(t=ex.t + 1)

    def idle_action(self) -> int:
        return self.base.idle_action()

    def snapshot(self, state, aid, target):
        return jnp.int32(0)

    def effect(self, opt, pre, post):
        return jnp.array(True)

    def team_count(self, state):
        return self.base.team_count(state)

    def agent_view(self, state):
        return self.base.agent_view(state)

    def step_rewards(self, pre, post):
        return self.base.step_rewards(pre, post)


# ---------------------------------------------------------------------------------------------------------
# Layout hints (native and compound_json prompts)
# ---------------------------------------------------------------------------------------------------------

_COMPASS = ("north", "east", "south", "west")


def _rows(mask: np.ndarray) -> tuple[int, int]:
    r = np.flatnonzero(np.asarray(mask, bool).any(axis=1))
    return int(r.min()), int(r.max())


def _side(row: int, lo: int, hi: int) -> str:
    """Where rows ``lo..hi`` lie from ``row``: ``to your north`` / ``to your south`` / ``around you``."""
    if row > hi:
        return "to your north"
    if row < lo:
        return "to your south"
    return "around you"


def _direction(frm, to) -> str:
    """Compass words from (row, col) ``frm`` to ``to``: ``north-east``, ``west``, ``here``."""
    dr, dc = int(to[0]) - int(frm[0]), int(to[1]) - int(frm[1])
    ns = "north" if dr < 0 else "south" if dr > 0 else ""
    ew = "west" if dc < 0 else "east" if dc > 0 else ""
    return "-".join(w for w in (ns, ew) if w) or "here"


def layout_hint(game: str, snap: dict, aid: int, lib: OptionLibrary) -> str:
    """The prompt's layout line (§4: "Layout: SAND. River is to your north (rows 1--5)").

    Cleanup: the agent's region (RIVER / BANK / ORCHARD, :attr:`~jaxopt_marl.options.cleanup.CleanupOptions.
    region_map`) and where the river (dirt-capable rows) and the orchard (apple-capable rows) lie. Harvest: the
    apple patches (the ``go_to_patch`` targets) and the nearest one's direction. Overcooked: the dispensers and
    the serving station. Coordinates ``(x, y) = (column, row)``.
    """
    lib = getattr(lib, "base", lib)
    pos = np.asarray(snap["pos"])[aid]
    if game == "cleanup":
        env = lib.env
        region = ("RIVER", "BANK", "ORCHARD")[int(lib.region_map[int(pos[0]), int(pos[1])])]
        r0, r1 = _rows(env.dirt_capable)
        o0, o1 = _rows(env.apple_capable)
        return (
            f"Layout: {region}. River is {_side(int(pos[0]), r0, r1)} (rows {r0}-{r1}). "
            f"Orchard is {_side(int(pos[0]), o0, o1)} (rows {o0}-{o1})."
        )
    if game == "harvest":
        tg = np.asarray(lib.patch_target)
        near = tg[int(np.argmin(np.abs(tg - pos).sum(axis=1)))]
        cells = ", ".join(prompts._xy(t) for t in tg)
        return f"Layout: apple patches @ {cells}; nearest {prompts._xy(near)} is {_direction(pos, near)}."
    info = lib.info

    def cells(a):
        return ", ".join(prompts._xy(c) for c in np.asarray(a).reshape(-1, 2))

    return (
        f"Layout: onions @ {cells(info.onion_dispensers)}; dishes @ {cells(info.plate_dispensers)}; "
        f"serving @ {cells(info.serving)}."
    )


def layout_hint_table(game: str, lib: OptionLibrary) -> tuple[tuple[str, ...], np.ndarray]:
    """:func:`layout_hint` of every cell of the map, as distinct texts and a cell index (the device prompt's table).

    The hint reads only the agent's cell (``snap["pos"][aid]``) and static map data (Cleanup's region map and
    dirt / apple-capable rows, Harvest's patch targets, the kitchen's dispensers), so these are all the texts it
    can write; the snapshot passed here holds nothing else, so a hint that read more would raise ``KeyError``.

    Returns:
        ``(texts, cell)``: the distinct hints in first-seen row-major order, and ``int32[H, W]`` the index into
        ``texts`` of the hint of an agent at (row, col).
    """
    base = getattr(lib, "base", lib)
    h, w = (int(x) for x in base.shape)
    texts: dict[str, int] = {}
    cell = np.zeros((h, w), np.int32)
    for r in range(h):
        for c in range(w):
            text = layout_hint(game, {"pos": np.array([[r, c]], np.int32)}, 0, base)
            cell[r, c] = texts.setdefault(text, len(texts))
    return tuple(texts), cell


def _world_lines(game: str, snap: dict, aid: int, lib: OptionLibrary) -> list[str]:
    base = getattr(lib, "base", lib)
    return prompts.view(game).lines(snap, aid, base) + [layout_hint(game, snap, aid, base)]


def _goal(game: str) -> str:
    """The system message's goal paragraph without the menu sentence."""
    text = prompts.prompt_family(game).system
    return text[: text.index("The action menu")].rstrip() + "\n\n"


# ---------------------------------------------------------------------------------------------------------
# Compound JSON
# ---------------------------------------------------------------------------------------------------------

#: compound_json parse outcomes besides ``ok`` (``executor:<Reason>`` is added by the rollout at start).
COMPOUND_REASONS = ("empty", "no_json", "malformed_json", "unknown_action", "bad_target", "target_absent")
EXECUTOR_PREFIX = "executor:"
_MAX_COORD = 10_000


class CompoundParse(NamedTuple):
    """Outcome of :func:`parse_compound` (and of :func:`resolve_compound`).

    Attributes:
        reason: ``"ok"`` or one of :data:`COMPOUND_REASONS`.
        action: the option name (None unless the object named a known one).
        target: ``(x, y)`` = (column, row) as written (None for target-free actions or on failure).
        letter: always None (no menu); present so traces read results of every interface alike.
    """

    reason: str
    action: str | None = None
    target: tuple[int, int] | None = None
    letter: None = None

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


def _coord(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and abs(v) <= _MAX_COORD else None


def parse_compound(text: object, lib: OptionLibrary) -> CompoundParse:
    """The first JSON object in ``text`` as a compound action of ``lib`` (never raises).

    The object starts at the first ``{`` (code fences or a preamble before it are ignored) and is decoded
    with :func:`json.JSONDecoder.raw_decode` (text after it is ignored). ``"action"`` must name an option of
    ``lib``; an option with a target class needs ``"target": [x, y]`` (two integers; ``"x"``/``"y"`` keys
    also accepted); a target on a target-free action is ignored.
    """
    if not isinstance(text, str) or not text.strip():
        return CompoundParse("empty")
    start = text.find("{")
    if start < 0:
        return CompoundParse("no_json")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):
        return CompoundParse("malformed_json")
    if not isinstance(obj, dict):
        return CompoundParse("malformed_json")
    name = obj.get("action")
    if not isinstance(name, str) or name.strip().lower() not in lib.option_names:
        return CompoundParse("unknown_action")
    name = name.strip().lower()
    spec = lib.options[lib.option_id(name)]
    if spec.target_class == NO_TARGET:
        return CompoundParse("ok", name)
    tg = obj.get("target")
    if isinstance(tg, dict):
        tg = [tg.get("x"), tg.get("y")]
    if not isinstance(tg, list | tuple) or len(tg) != 2:
        return CompoundParse("bad_target", name)
    x, y = _coord(tg[0]), _coord(tg[1])
    if x is None or y is None:
        return CompoundParse("bad_target", name)
    return CompoundParse("ok", name, (x, y))


def resolve_compound(res: CompoundParse, lib: OptionLibrary, opt, target, valid) -> tuple[CompoundParse, int]:
    """The instance slot a parsed compound action names in one agent's instance table, or -1.

    Args:
        res: from :func:`parse_compound`.
        lib: the option library.
        opt, target, valid: the agent's instance table (``int[I]``, ``int[I, 2]`` (row, col), ``bool[I]``).

    Returns:
        ``(res, slot)``; ``res`` becomes ``target_absent`` when no valid slot of that option has that target.
    """
    if not res.ok:
        return res, -1
    opt, target, valid = np.asarray(opt), np.asarray(target), np.asarray(valid, bool)
    hit = valid & (opt == lib.option_id(res.action))
    if res.target is not None:
        x, y = res.target
        hit &= (target[:, 0] == y) & (target[:, 1] == x)
    idx = np.flatnonzero(hit)
    if not idx.size:
        return res._replace(reason="target_absent"), -1
    return res, int(idx[0])


def action_catalogue(lib: OptionLibrary) -> list[str]:
    """The ``compound_json`` prompt's action list: one line per option, its JSON form and its menu label."""
    lines = ["Actions (reply with one JSON object):"]
    for o in lib.options:
        if o.target_class == NO_TARGET:
            lines.append(f'- {{"action": "{o.name}"}}: {o.label}')
        else:
            label = o.label.format(x="x", y="y")
            lines.append(f'- {{"action": "{o.name}", "target": [x, y]}}: {label} (target: {o.target_class})')
    return lines


# ---------------------------------------------------------------------------------------------------------
# Prompts per interface
# ---------------------------------------------------------------------------------------------------------


#: What each interface's memory line calls the remembered decisions (``- Last 5 actions: noop, forward``).
MEMORY_NOUNS = {MENU: prompts.MEMORY_NOUN, NATIVE: "actions", COMPOUND_JSON: "actions decided"}


def system_message(game: str, interface: str = MENU) -> str:
    """The fixed system message of ``game`` under ``interface`` (the menu's is :func:`prompts.system_message`)."""
    check_interface(interface)
    if interface == MENU:
        return prompts.system_message(game)
    if interface == NATIVE:
        fam = prompts.prompt_family(game)
        return (
            _goal(game)
            + "Each turn you take one primitive action for one step. Pick one letter from the action menu.\n\n"
            + prompts._CONTRACT.format(labels=" | ".join(fam.labels))
        )
    return (
        _goal(game)
        + "Each turn you choose one compound action. Coordinates are (x, y) = (column, row).\n\n"
        + 'Output format: exactly one JSON object, nothing else, e.g. {"action": "wait"}'
    )


def user_message(
    interface: str,
    game: str,
    snap: dict,
    aid: int,
    menu_text: str,
    max_steps: int,
    mem: prompts.Memory | None,
    lib: OptionLibrary,
) -> str:
    """The user message of one decision under ``interface`` (``menu``: :func:`prompts.user_message`).

    ``native``: the world lines, the layout hint, step, the last actions, the fixed action menu; ``compound_json``:
    the world lines, the layout hint, step, the last actions, :func:`action_catalogue` (``menu_text`` unused).
    """
    check_interface(interface)
    if interface == MENU:
        return prompts.user_message(game, snap, aid, menu_text, max_steps, mem, lib)
    mem = mem or prompts.Memory()
    team = float(snap["team"])
    memory = prompts._memory_lines(mem, team, MEMORY_NOUNS[interface])
    head = _world_lines(game, snap, aid, lib) + [f"Step {int(snap['step'])}/{max_steps}.", ""] + memory + [""]
    if interface == NATIVE:
        return "\n".join(head + [menu_text, "", "Choose one. Reply with exactly two lines."])
    return "\n".join(head + action_catalogue(lib) + ["", "Reply with one JSON object."])


@dataclasses.dataclass(frozen=True)
class InterfaceSpec:
    """How a rollout treats one interface.

    Attributes:
        name: the interface.
        shuffle: menu letters shuffled per decision (menu) or fixed in the library's order (native).
        letters: the answer is a menu letter (menu, native) or a JSON object (compound_json).
    """

    name: str
    shuffle: bool
    letters: bool


SPECS = {
    MENU: InterfaceSpec(MENU, shuffle=True, letters=True),
    NATIVE: InterfaceSpec(NATIVE, shuffle=False, letters=True),
    COMPOUND_JSON: InterfaceSpec(COMPOUND_JSON, shuffle=False, letters=False),
}


def rollout_spec(cfg) -> InterfaceSpec:
    """The :class:`InterfaceSpec` a rollout under ``cfg`` (a :class:`jaxopt_marl.rollout.PolicyConfig`) plays: its
    interface's, with the menu's letters in construction order (over the shown instances) when
    ``cfg.shuffle_letters`` is False."""
    spec = SPECS[cfg.interface]
    if cfg.interface == MENU and not cfg.shuffle_letters:
        spec = dataclasses.replace(spec, shuffle=False)
    return spec


def unshuffled_letters(spec: InterfaceSpec, letters, valid, xp=np):
    """``int32[..., I]``: the letters a rollout shows when ``spec.shuffle`` is False: :func:`fixed_letters` over the
    shown slots (``letters >= 0``, the guarded menu) for ``menu``, over every valid slot otherwise (native: the
    actions in the simulator's order; compound_json: every instance). The host loop and the compiled rollout
    both call it (``xp`` as in :func:`fixed_letters`)."""
    return fixed_letters(letters >= 0 if spec.name == MENU else valid, xp)


def rollout_library(interface: str, lib: OptionLibrary) -> OptionLibrary:
    """The library a rollout under ``interface`` runs: :class:`NativeLibrary` of ``lib`` for ``native``."""
    check_interface(interface)
    return NativeLibrary(lib) if interface == NATIVE else lib


def fixed_letters(valid, xp=np):
    """``int32[..., I]``: letters in slot order over the valid slots (-1 elsewhere): the native menu.

    ``xp``: ``numpy`` (the host loop) or ``jax.numpy`` (jittable: the compiled rollout), the same rule.
    """
    valid = xp.asarray(valid, bool)
    return xp.where(valid, xp.cumsum(valid, axis=-1, dtype=np.int32) - 1, -1).astype(np.int32)


__all__ = [
    "COMPOUND_JSON",
    "COMPOUND_MAX_NEW_TOKENS",
    "COMPOUND_REASONS",
    "CompoundParse",
    "EXECUTOR_PREFIX",
    "INTERFACES",
    "InterfaceSpec",
    "MEMORY_NOUNS",
    "MENU",
    "NATIVE",
    "NATIVE_ACTIONS",
    "NativeLibrary",
    "SPECS",
    "action_catalogue",
    "check_interface",
    "fixed_letters",
    "layout_hint",
    "layout_hint_table",
    "native_actions",
    "parse_compound",
    "resolve_compound",
    "rollout_library",
    "rollout_spec",
    "run_overrides",
    "system_message",
    "unshuffled_letters",
    "user_message",
]
