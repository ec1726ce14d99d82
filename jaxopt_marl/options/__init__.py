"""Option libraries per game (paper §5.1), looked up by game name and imported lazily.

Each game module exposes ``make_library(env) -> OptionLibrary`` (protocol: :mod:`jaxopt_marl.options.base`).
``cleanup`` and ``harvest`` are pre-registered: their modules (``jaxopt_marl/options/cleanup.py``,
``harvest.py``) only need to define ``make_library``; until they exist :func:`get_library` raises
:class:`LibraryNotAvailable`.
"""

from __future__ import annotations

import importlib
from typing import Any

from jaxopt_marl.options.base import OptionLibrary

# game -> (module, factory, fixed keyword arguments)
_REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "cleanup": ("jaxopt_marl.options.cleanup", "make_library", {}),
    "harvest": ("jaxopt_marl.options.harvest", "make_library", {}),
    "overcooked_aa": ("jaxopt_marl.options.overcooked", "make_library", {}),
    "overcooked_fc": ("jaxopt_marl.options.overcooked", "make_library", {}),
}

GAMES: tuple[str, ...] = tuple(_REGISTRY)


class LibraryNotAvailable(RuntimeError):
    """The game is known but its option library has not been written yet."""


def register(game: str, module: str, factory: str = "make_library", **fixed: Any) -> None:
    """Register (or replace) the option library of ``game``."""
    _REGISTRY[game] = (module, factory, dict(fixed))


def available(game: str) -> bool:
    """Whether ``game``'s option library can be imported."""
    try:
        _factory(game)
    except LibraryNotAvailable:
        return False
    return True


def _factory(game: str):
    if game not in _REGISTRY:
        raise ValueError(f"unknown game {game!r}; games with option libraries: {', '.join(_REGISTRY)}")
    module, factory, _ = _REGISTRY[game]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise LibraryNotAvailable(
            f"option library for {game!r} not available yet ({module.replace('.', '/')}.py does not exist)"
        ) from None
    if not hasattr(mod, factory):
        raise LibraryNotAvailable(f"option library for {game!r} not available yet ({module} has no {factory}())")
    return getattr(mod, factory)


def get_library(game: str, env=None, **config: Any) -> OptionLibrary:
    """The option library of ``game``.

    Args:
        game: a game name of :mod:`envs_jax` (``cleanup``, ``harvest``, ``overcooked_aa``, ``overcooked_fc``).
        env: the environment (default: ``envs_jax.make(game)``).
        **config: library options (e.g. ``effects="naive"`` for the defect tests on Overcooked).

    Raises:
        ValueError: unknown game.
        LibraryNotAvailable: the game's library module is not written yet.
    """
    factory = _factory(game)
    if env is None:
        import envs_jax

        env = envs_jax.make(game)
    return factory(env, **_REGISTRY[game][2], **config)


__all__ = ["GAMES", "LibraryNotAvailable", "OptionLibrary", "available", "get_library", "register"]
