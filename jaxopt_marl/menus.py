"""Stage 4: menu assembly (paper §5.1) — guard mask over the instance table, shuffled letters, menu text.

Fixed code interprets the guard file: every instance of the agent's fixed-size instance table (one per target
of each bounded class) gets its read-set features; every adopted inferred conjunction is evaluated against them
and matches are hidden; explicit guards are re-checked live — the library's ``live_reason`` runs the
executor's own expansion checks (NoPath by the path planner, NothingHeld, TargetAbsent) — and hide an instance
only when that check fails now (:func:`jaxopt_marl.guards.guard_mask`). All of this is jitted array code.

Letters are shuffled per decision with an episode-seeded key (:func:`decision_key`): a fixed construction order
would leak option identity through position. Menu text follows the paper's worked example::

    Action menu:
    A) place held item in pot @ (4, 2)
    B) drop held item on counter @ (1, 0)

Coordinates in menu text are ``(x, y) = (column, row)``: in the example the AA pots are listed as ``(4, 2)`` and
``(4, 3)``, and AA's pots are at (row 2, col 4) and (row 3, col 4); the player at ``(1, 1)`` is at row 1, col 1.
"""

from __future__ import annotations

import string
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxopt_marl.guards import CompiledGuards, guard_mask
from jaxopt_marl.options.base import Instances, OptionLibrary

#: Menu letters, in order of assignment.
LETTERS = string.ascii_uppercase
MENU_HEADER = "Action menu:"


class Menu(NamedTuple):
    """One agent's menu as arrays (``I`` instance slots).

    Attributes:
        inst: the instance table.
        feats: ``int32[I, F]`` read-set features.
        live_reason: ``int32[I]`` live explicit check (-1 = none).
        shown: ``bool[I]`` feasible after guards (and a valid instance).
        letters: ``int32[I]`` letter index of each shown instance (0 = A), -1 if hidden.
    """

    inst: Instances
    feats: jax.Array
    live_reason: jax.Array
    shown: jax.Array
    letters: jax.Array


def decision_key(
    seed: int | jax.Array, ep: int | jax.Array, aid: int | jax.Array, decision: int | jax.Array
) -> jax.Array:
    """The letter-shuffle key of one decision: ``fold_in(fold_in(fold_in(PRNGKey(seed), ep), aid), decision)``.

    Deterministic per (seed, episode, agent, decision index), so a replayed episode shows the same menus.
    """
    key = jax.random.PRNGKey(seed)
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, ep), aid), decision)


def feasibility(
    lib: OptionLibrary, guards: CompiledGuards, state, aid
) -> tuple[Instances, jax.Array, jax.Array, jax.Array]:
    """Instance table, features, live reasons and the guard mask of one agent (jittable)."""
    inst = lib.instances(state, aid)
    feats = lib.features(state, aid, inst)
    live = lib.live_reason(state, aid, inst)
    shown = guard_mask(guards, jnp.where(inst.valid, inst.opt, -1), feats, live)
    return inst, feats, live, shown


def assign_letters(key: jax.Array, shown: jax.Array) -> jax.Array:
    """A uniformly random letter order over the shown instances.

    Args:
        key: the decision key.
        shown: ``bool[I]``.

    Returns:
        ``int32[I]``: letter index per instance (0 .. n_shown - 1), -1 where hidden.
    """
    u = jnp.where(shown, jax.random.uniform(key, shown.shape), jnp.inf)
    order = jnp.argsort(u)  # shown instances first, in random order
    rank = jnp.zeros(shown.shape, jnp.int32).at[order].set(jnp.arange(shown.shape[0], dtype=jnp.int32))
    return jnp.where(shown, rank, -1)


def build_menu(lib: OptionLibrary, guards: CompiledGuards, state, aid, key: jax.Array) -> Menu:
    """One agent's menu (jittable; ``vmap`` over agents and envs)."""
    inst, feats, live, shown = feasibility(lib, guards, state, aid)
    return Menu(inst=inst, feats=feats, live_reason=live, shown=shown, letters=assign_letters(key, shown))


def make_menu_fn(lib: OptionLibrary, guards: CompiledGuards):
    """Jitted batch menus: ``fn(states [B], keys [B, A]) -> Menu [B, A]`` for every agent of every env."""

    def one_env(state, keys):
        agents = jnp.arange(lib.num_agents, dtype=jnp.int32)
        return jax.vmap(lambda a, k: build_menu(lib, guards, state, a, k))(agents, keys)

    return jax.jit(jax.vmap(one_env))


def menu_lines(lib: OptionLibrary, opt, target, letters) -> list[tuple[str, int]]:
    """``[(line text, instance index)]`` in letter order (host side; one agent's menu arrays)."""
    opt, target, letters = np.asarray(opt), np.asarray(target), np.asarray(letters)
    rows = sorted((int(letters[i]), i) for i in np.flatnonzero(letters >= 0))
    return [(f"{LETTERS[let]}) {lib.label(opt[i], target[i])}", i) for let, i in rows]


def render_menu(lib: OptionLibrary, opt, target, letters) -> str:
    """The menu text, e.g. ``"Action menu:\\nA) place held item in pot @ (4, 2)\\n..."``.

    Args:
        lib: the option library (labels).
        opt: ``int[I]`` option ids.
        target: ``int[I, 2]`` targets (row, col); rendered as ``(x, y) = (col, row)``.
        letters: ``int[I]`` from :func:`assign_letters`.
    """
    return "\n".join([MENU_HEADER] + [line for line, _ in menu_lines(lib, opt, target, letters)])


def parse_choice(letters, letter: str) -> int:
    """Instance index chosen by ``letter`` (``"B"``), or -1 if the letter is not on the menu."""
    letter = letter.strip().upper()
    if len(letter) != 1 or letter not in LETTERS:
        return -1
    hit = np.flatnonzero(np.asarray(letters) == LETTERS.index(letter))
    return int(hit[0]) if hit.size else -1


__all__ = [
    "LETTERS",
    "MENU_HEADER",
    "Menu",
    "assign_letters",
    "build_menu",
    "decision_key",
    "feasibility",
    "make_menu_fn",
    "menu_lines",
    "parse_choice",
    "render_menu",
]
