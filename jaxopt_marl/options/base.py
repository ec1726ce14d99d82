"""The option-library protocol every game implements (paper §3, §5.1 Stages 1-4).

An *option library* is the paper's Stage-1 schema turned into code: a fixed set of typed options, each with the
four-part contract of §5.1 ("instantiation, executor, termination, effect predicate"). The machinery that drives
a library — macro-action stepping (:mod:`jaxopt_marl.macro`), the uniform burn-in (:mod:`jaxopt_marl.burnin`),
guard synthesis (:mod:`jaxopt_marl.guards`) and menus (:mod:`jaxopt_marl.menus`) — is game-generic and talks to a
library only through this module.

Static metadata (host side, plain Python)
    - :class:`OptionSpec` per option: ``name`` (record/guard spelling), menu ``label`` template (``"place held
      item in pot @ ({x}, {y})"``; ``x = col``, ``y = row`` as in the paper's worked example), ``target_class``
      (``"none"`` for target-free options such as ``wait``), declared ``read_set``, ``solo_only`` (no private
      component, §5.1 Defect 2), ``max_targets`` (slots in the instance table) and the ``contract`` text.
    - :class:`FeatureSpec` per read-set feature (``feature_specs``): a name and its categorical value vocabulary.
    - :data:`REASONS`: the only explicit executor failures, exactly ``TargetAbsent``, ``NoPath``, ``NothingHeld``.
    - ``num_instances`` ``I`` (static instance-table size = sum of ``max_targets``) and ``timeout`` (steps).

Pure, jittable functions (one environment, one agent ``aid``; the machinery ``vmap``s over agents and envs)
    - ``instances(state, aid) -> Instances`` (``opt int32[I]``, ``target int32[I, 2]`` (row, col; -1 = none),
      ``valid bool[I]``). Instantiation = one instance per target of each bounded target class, never nearest
      only; classes with many targets (counters, apples, dirt) are capped at ``max_targets`` slots and the cap
      rule is documented by the library. Slot ``i`` always belongs to option ``slot_opt[i]`` (static layout).
    - ``features(state, aid, inst) -> int32[I, F]``: read-set feature codes at initiation (-1 = null).
    - ``live_reason(state, aid, inst) -> int32[I]``: the explicit reason the executor *would* fail with if the
      instance were started now (-1 = none) — the live re-check of explicit guards at menu build (Stage 4).
    - Executor: ``start(state, aid, opt, target) -> (Exec, reason int32[])`` plans (environment-naive: its only
      checks are the three explicit reasons); ``act(state, aid, ex) -> (action int32[], drained bool[], Exec)``
      emits one primitive action, ``drained`` = this action empties the queue (call-and-return: the option
      terminates after the env step in which it drained, failed at start, or reached ``timeout`` steps).
    - Effect predicate: ``snapshot(state, aid, target) -> Snap`` (a small pytree) and ``effect(opt, pre, post) ->
      bool[]``, in *delta form* and bound to a *private* transition of the acting agent; evaluated on the pre
      snapshot at initiation and the post snapshot at termination.
    - ``present(state) -> bool[A]``: agents that can act now (Melting Pot removes zapped avatars).

Generic helpers for executors (:func:`nav_action`, :func:`relative_action`, :func:`facing_toward`) cover both
action conventions: Overcooked's absolute moves (0 up, 1 down, 2 right, 3 left, 4 stay, 5 interact; a move
into a non-walkable cell only turns) and Melting Pot's relative ones (0 NOOP, 1 FORWARD, 2 BACKWARD,
3 STEP_LEFT, 4 STEP_RIGHT, 5 TURN_LEFT, 6 TURN_RIGHT, 7 FIRE_ZAP, 8 FIRE_CLEAN). Internally executors work in
the compass codes of :mod:`jaxopt_marl.paths` (N=0, E=1, S=2, W=3; (row, col)).

Option kinds a library typically needs (all expressible with this protocol):
    - *interact* (Overcooked: walk to an interact pose of a non-walkable target, face it, INTERACT),
    - *beam* (Cleanup "clean dirt @ target": walk to a pose from which the beam reaches the target, face, fire),
    - *walk-onto* (Melting Pot "eat apple @ target": walk onto the target cell),
    - *region* (Melting Pot "go to the river" / "go to the orchard": walk to the nearest cell of a region; the
      target is the chosen cell, or -1 with ``target_class="none"``),
    - *wait* (one no-op step; effect always true).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxopt_marl import paths
from jaxopt_marl.records import RecordVocab

# ---------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------

#: The explicit executor failures the Stage-1 prompt whitelists (§5.1: "no target, no path, nothing to drop").
REASONS: tuple[str, ...] = ("TargetAbsent", "NoPath", "NothingHeld")
TARGET_ABSENT, NO_PATH, NOTHING_HELD = 0, 1, 2
#: ``reason`` value meaning "no explicit failure".
NO_REASON = -1

#: Target class of options without a target (``wait``, region moves without a chosen cell).
NO_TARGET = "none"

#: Feature value used when a read-set feature does not apply to an instance's target.
NA = "NA"


# ---------------------------------------------------------------------------------------------------------
# Static metadata
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One option's static description (its Stage-1 contract).

    Attributes:
        name: record / guard-file spelling, e.g. ``"place_in_pot"``.
        label: menu label template; ``{x}`` = target column, ``{y}`` = target row (paper worked example:
            ``"place held item in pot @ (4, 2)"`` is the pot at row 2, column 4 of AA).
        target_class: the bounded target class instantiated one instance per target (``"none"`` = no target).
        read_set: declared deterministic read-set features (guard eligibility, §5.1 Stage 2).
        solo_only: no private component; guards are mined from solo-episode records only (§5.1 Defect 2).
        max_targets: instance-table slots of this option (targets in the class, or the documented cap).
        contract: the four-part contract in words (instantiation; executor; termination; effect).
    """

    name: str
    label: str
    target_class: str
    read_set: tuple[str, ...]
    solo_only: bool
    max_targets: int
    contract: str

    def render(self, target_rc: tuple[int, int] | None) -> str:
        """The menu line text of an instance at ``target_rc`` = (row, col) (None for target-free options)."""
        if target_rc is None or target_rc[0] < 0:
            return self.label
        return self.label.format(x=int(target_rc[1]), y=int(target_rc[0]))


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """A read-set feature: name and categorical value vocabulary (code ``v`` = ``values[v]``)."""

    name: str
    values: tuple[str, ...]


class Instances(NamedTuple):
    """The fixed-size instance table of one agent (``I`` slots).

    Attributes:
        opt: ``int32[I]`` option id per slot (static layout; padding slots still carry their option id).
        target: ``int32[I, 2]`` target (row, col); -1 = no target.
        valid: ``bool[I]`` the slot holds an instance (its target exists); invalid slots are never on a menu.
    """

    opt: jax.Array
    target: jax.Array
    valid: jax.Array


class Exec(NamedTuple):
    """Per-agent executor slot (call-and-return; fixed shapes so slots batch over agents and envs).

    Attributes:
        active: ``bool[]`` an option is running.
        opt: ``int32[]`` running option id (-1 = none).
        target: ``int32[2]`` its target (row, col), -1 = none.
        t: ``int32[]`` steps executed so far.
        aux: library-specific executor memory (e.g. a plan); a fixed-shape pytree from ``empty_aux``.
    """

    active: jax.Array
    opt: jax.Array
    target: jax.Array
    t: jax.Array
    aux: Any


# ---------------------------------------------------------------------------------------------------------
# The protocol
# ---------------------------------------------------------------------------------------------------------


class OptionLibrary(abc.ABC):
    """Base class of a game's option library (see the module docstring for the contract).

    Subclasses set ``game``, ``options``, ``feature_specs``, ``timeout``, ``num_agents`` and ``slot_opt`` (static
    ``int32[I]``: option id of each instance slot) in ``__init__`` and implement the abstract methods as pure,
    jittable functions of one environment state and one agent id (``aid`` may be traced).
    """

    game: str
    options: tuple[OptionSpec, ...]
    feature_specs: tuple[FeatureSpec, ...]
    timeout: int
    num_agents: int
    slot_opt: np.ndarray
    reasons: tuple[str, ...] = REASONS

    # -- derived metadata ----------------------------------------------------------------------------------

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.feature_specs)

    @property
    def num_instances(self) -> int:
        """``I``, the static instance-table size."""
        return int(len(self.slot_opt))

    @property
    def num_features(self) -> int:
        return len(self.feature_specs)

    @property
    def vocab(self) -> RecordVocab:
        """Record vocabulary: option names, explicit reasons, read-set features (:mod:`jaxopt_marl.records`)."""
        return RecordVocab(self.option_names, self.reasons, tuple((f.name, f.values) for f in self.feature_specs))

    @property
    def read_sets(self) -> dict[str, tuple[str, ...]]:
        return {o.name: o.read_set for o in self.options}

    @property
    def solo_only(self) -> dict[str, bool]:
        return {o.name: o.solo_only for o in self.options}

    def option_id(self, name: str) -> int:
        return self.option_names.index(name)

    def describe(self) -> str:
        """All contracts as text (documentation, prompts for repair loops)."""
        return "\n\n".join(
            f"{o.name} [{o.target_class}] read={list(o.read_set)} solo_only={o.solo_only}\n{o.contract}"
            for o in self.options
        )

    # -- per-agent functions (jittable) ---------------------------------------------------------------------

    @abc.abstractmethod
    def present(self, state) -> jax.Array:
        """``bool[A]`` agents able to act (and decide) in ``state``."""

    @abc.abstractmethod
    def instances(self, state, aid) -> Instances:
        """The agent's instance table (target existence only; no state-conditional gating)."""

    @abc.abstractmethod
    def features(self, state, aid, inst: Instances) -> jax.Array:
        """``int32[I, F]`` read-set feature codes of each instance at initiation (-1 = null)."""

    @abc.abstractmethod
    def live_reason(self, state, aid, inst: Instances) -> jax.Array:
        """``int32[I]`` explicit reason ``start`` would report now (-1 none): the Stage-4 live re-check."""

    @abc.abstractmethod
    def empty_aux(self) -> Any:
        """The fixed-shape executor memory of an idle slot."""

    @abc.abstractmethod
    def start(self, state, aid, opt, target) -> tuple[Exec, jax.Array]:
        """Expand an option (plan). Returns the running slot and ``int32[]`` reason (-1 = started)."""

    @abc.abstractmethod
    def act(self, state, aid, ex: Exec) -> tuple[jax.Array, jax.Array, Exec]:
        """One primitive action of a running slot: ``(action int32[], drained bool[], new slot)``."""

    @abc.abstractmethod
    def idle_action(self) -> int:
        """The primitive action of an agent with no running option (``stay`` / ``NOOP``)."""

    @abc.abstractmethod
    def snapshot(self, state, aid, target) -> Any:
        """Small pytree of what the effect predicates read (own held item, target-cell facts, ...)."""

    @abc.abstractmethod
    def effect(self, opt, pre, post) -> jax.Array:
        """``bool[]``: delta-form effect predicate of option ``opt`` on (pre at initiation, post at termination)."""

    # -- the game's scores and views (what the rollouts record; jittable, one environment state) -------------

    @abc.abstractmethod
    def team_count(self, state) -> jax.Array:
        """``int32[]`` the paper's unshaped team return so far, as the integer count it is (apples eaten / soups
        delivered): exact at any size (the prompts write it digit by digit)."""

    def team_return(self, state) -> jax.Array:
        """``float32[]`` :meth:`team_count` as the rollouts record it."""
        return self.team_count(state).astype(jnp.float32)

    @abc.abstractmethod
    def agent_view(self, state) -> tuple[jax.Array, jax.Array]:
        """``(pos int32[A, 2] (row, col), alive bool[A])`` of every agent."""

    @abc.abstractmethod
    def step_rewards(self, pre, post) -> jax.Array:
        """``float32[A]`` unshaped rewards of the env step from ``pre`` to ``post``."""

    # -- generic -----------------------------------------------------------------------------------------

    def empty_exec(self) -> Exec:
        """An idle executor slot."""
        return Exec(
            active=jnp.array(False),
            opt=jnp.int32(-1),
            target=jnp.full((2,), -1, jnp.int32),
            t=jnp.int32(0),
            aux=self.empty_aux(),
        )

    def label(self, opt: int, target_rc) -> str:
        """Menu text of one instance (host side)."""
        return self.options[int(opt)].render(None if target_rc is None else tuple(int(v) for v in target_rc))


# ---------------------------------------------------------------------------------------------------------
# Executor helpers shared by the games
# ---------------------------------------------------------------------------------------------------------


def field_at(field: jax.Array, pos: jax.Array) -> jax.Array:
    """``int32[]`` value of a distance field at (row, col) ``pos``."""
    return field[pos[0], pos[1]]


def nav_direction(field: jax.Array, pos: jax.Array) -> jax.Array:
    """Compass direction (N=0, E=1, S=2, W=3) that descends ``field`` from ``pos`` (-1: arrived or no path)."""
    return paths.next_move(field, pos)


def facing_toward(pos: jax.Array, target: jax.Array) -> jax.Array:
    """Compass direction from ``pos`` to an adjacent ``target`` (-1 if not adjacent)."""
    return paths.facing_toward(pos, target)


#: Melting Pot relative actions (spec §1.2).
MP_NOOP, MP_FORWARD, MP_BACKWARD, MP_STEP_LEFT, MP_STEP_RIGHT, MP_TURN_LEFT, MP_TURN_RIGHT = range(7)


def relative_action(facing: jax.Array, direction: jax.Array) -> jax.Array:
    """Melting Pot relative move action that steps in compass ``direction`` given compass ``facing``.

    Relative rotation ``(direction - facing) % 4``: 0 FORWARD, 1 STEP_RIGHT, 2 BACKWARD, 3 STEP_LEFT;
    ``direction = -1`` gives NOOP.
    """
    rel = (direction - facing) % 4
    table = jnp.array([MP_FORWARD, MP_STEP_RIGHT, MP_BACKWARD, MP_STEP_LEFT], jnp.int32)
    return jnp.where(direction < 0, MP_NOOP, table[rel]).astype(jnp.int32)


def turn_action(facing: jax.Array, want: jax.Array) -> jax.Array:
    """Melting Pot turn toward compass ``want`` from ``facing`` (TURN_RIGHT if clockwise 1 or 2, else LEFT;
    NOOP when already facing)."""
    rel = (want - facing) % 4
    return jnp.where(rel == 0, MP_NOOP, jnp.where(rel == 3, MP_TURN_LEFT, MP_TURN_RIGHT)).astype(jnp.int32)


def apply_variant(
    lib: OptionLibrary, labels: dict[str, str] | None = None, read_sets: dict[str, tuple[str, ...]] | None = None
) -> OptionLibrary:
    """``lib`` with the menu phrasing and read sets of a library variant (paper §6.1; :data:`jaxopt_marl.options.
    LIBRARIES`): option name -> label template, option name -> declared read set. Executors, instantiation,
    termination and effect predicates are the library's own (a variant's granularity is its factory's keyword
    arguments). Changes ``lib.options`` in place and returns ``lib``.

    Raises:
        ValueError: an unknown option name, a label whose fields are not exactly the target's ``{x}`` and ``{y}``
            (none for a target-free option), or a read-set feature the library does not compute, each named.
    """
    import string

    labels, read_sets = dict(labels or {}), dict(read_sets or {})
    names = set(lib.option_names)
    for what, table in (("label", labels), ("read set", read_sets)):
        unknown = sorted(set(table) - names)
        if unknown:
            raise ValueError(f"{lib.game} variant: {what} of unknown option(s) {unknown}; options: {sorted(names)}")
    out = []
    for o in lib.options:
        label = labels.get(o.name, o.label)
        fields = {f for _, f, _, _ in string.Formatter().parse(label) if f is not None}
        want = set() if o.target_class == NO_TARGET else {"x", "y"}
        if fields != want:
            raise ValueError(
                f"{lib.game} variant: label {label!r} of {o.name} must have the fields {sorted(want)}, has {sorted(fields)}"
            )
        rs = tuple(read_sets.get(o.name, o.read_set))
        bad = sorted(set(rs) - set(lib.feature_names))
        if bad:
            raise ValueError(
                f"{lib.game} variant: read set of {o.name} names feature(s) {bad} the library does not compute "
                f"({', '.join(lib.feature_names) or 'none'})"
            )
        out.append(dataclasses.replace(o, label=label, read_set=rs))
    lib.options = tuple(out)
    return lib


def categorical_index(values: tuple[str, ...], value: str) -> int:
    """Code of ``value`` in a feature vocabulary (host side)."""
    return values.index(value)


__all__ = [
    "apply_variant",
    "NA",
    "NOTHING_HELD",
    "NO_PATH",
    "NO_REASON",
    "NO_TARGET",
    "REASONS",
    "TARGET_ABSENT",
    "Exec",
    "FeatureSpec",
    "Instances",
    "OptionLibrary",
    "OptionSpec",
    "facing_toward",
    "field_at",
    "nav_direction",
    "relative_action",
    "turn_action",
]
