"""Progress bars fed from inside compiled programs (the PA-MAGRPO update's micro-batches, the rollout's waves).

A compiled program cannot print, and a long one (a round's update, a call of K episodes) would otherwise show
nothing for minutes. A program built with progress compiles :func:`jax.debug.callback` calls into its loop:

- :func:`tick` once a micro-batch's outputs exist (the update: one tick per micro-batch);
- :func:`reach` with a value (the rollout: the slowest episode's env step after each decision wave).

On the host they move the tqdm bar routed by :func:`route` (nothing when no bar is routed). The callbacks read
values the program has computed anyway and return nothing, so the numerics are unchanged (tested bit for bit
against programs without them); each costs one host call per micro-batch or wave. A program with a host
callback is not written to JAX's persistent compilation cache, so the CLI's runs (the only callers that ask for
progress) recompile it in every process; benchmarks and tests compile without it.

The caller must wait for the programs it starts inside :func:`route` (``jax.block_until_ready``, then
``jax.effects_barrier()``) before it leaves the block or moves the offset, or later callbacks are dropped.
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax

# The routed bar and the offset added to reach() values (None: callbacks are dropped).
_ROUTE: dict[str, Any] = {"bar": None, "offset": 0}


def _on_tick(*_) -> None:
    bar = _ROUTE["bar"]
    if bar is not None:
        bar.update(1)


def _on_reach(value) -> None:
    bar = _ROUTE["bar"]
    if bar is not None:
        # Unordered callbacks may arrive late: the bar only moves forward.
        n = _ROUTE["offset"] + int(value)
        if n > bar.n:
            bar.update(n - bar.n)


def tick(*deps) -> None:
    """In a traced program: one tick of the routed bar once ``deps`` (arrays) are computed."""
    jax.debug.callback(_on_tick, *deps)


def reach(value) -> None:
    """In a traced program: move the routed bar to ``offset + value`` (``value``: an int scalar array)."""
    jax.debug.callback(_on_reach, value)


@contextlib.contextmanager
def route(bar, offset: int = 0):
    """Routes :func:`tick` / :func:`reach` to ``bar`` (anything with ``update(n)`` and ``n``, e.g. a tqdm bar;
    None drops them) while the block runs, :func:`reach` values counted from ``offset`` (see
    :func:`set_offset`). Restores the previous routing on exit."""
    prev = dict(_ROUTE)
    _ROUTE.update(bar=bar, offset=int(offset))
    try:
        yield bar
    finally:
        _ROUTE.update(prev)


def set_offset(offset: int) -> None:
    """The value :func:`reach` counts from (e.g. ``j * steps`` before the j-th call of a multi-call bar)."""
    _ROUTE["offset"] = int(offset)
