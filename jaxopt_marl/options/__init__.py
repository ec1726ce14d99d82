"""Option libraries per game (paper §5.1), looked up by game name and imported lazily.

Each game module exposes ``make_library(env) -> OptionLibrary`` (protocol: :mod:`jaxopt_marl.options.base`).
``cleanup`` and ``harvest`` are pre-registered: their modules (``jaxopt_marl/options/cleanup.py``,
``harvest.py``) only need to define ``make_library``; until they exist :func:`get_library` raises
:class:`LibraryNotAvailable`.

Library variants (paper §6.1: "each seed also draws one of several option libraries"): :data:`LIBRARIES` maps
each game to its named variants, each the keyword arguments its library is built with: :data:`CANONICAL` (``{}``:
the library as written) and the drafts of :mod:`jaxopt_marl.options.variants` (``compact``, ``detailed``: other
granularity, menu phrasing and read sets). ``labels`` and ``read_sets`` are applied to the built library
(:func:`jaxopt_marl.options.base.apply_variant`), every other key goes to the factory. Adding a variant is one
entry, e.g. ``LIBRARIES["cleanup"]["wide"] = {"target_cap": 12}``. A run names its
variant (``--library NAME``, :attr:`jaxopt_marl.config.RunConfig.library`, ``config.json``'s ``library``) or
draws one (``--library auto``: :func:`draw_library`, uniform over the sorted names with the run seed's interface
channel, :func:`jaxopt_marl.seeding.library_key`). The draw happens at the run's start and is then part of the
run: ``--resume`` with ``--library auto`` keeps the run's recorded variant (:func:`resolve_library`'s
``recorded``), so adding a variant (which changes what a seed would draw now) does not break resuming older
runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jaxopt_marl.options import variants as _variants

if TYPE_CHECKING:
    from jaxopt_marl.options.base import OptionLibrary


def __getattr__(name: str) -> Any:
    """``OptionLibrary`` is imported on first use: this package's registry (:func:`library_names`,
    :func:`resolve_library`) is read by the command line's checks before ``jax.distributed.initialize``, and
    ``jaxopt_marl.options.base`` builds JAX arrays at import, which would start a backend first (the multi-process
    entry point then fails: tests/test_distributed.py::test_entry_point_distributed_run_writes_the_single_process_run).
    """
    if name == "OptionLibrary":
        from jaxopt_marl.options.base import OptionLibrary

        return OptionLibrary
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# game -> (module, factory, fixed keyword arguments)
_REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "cleanup": ("jaxopt_marl.options.cleanup", "make_library", {}),
    "harvest": ("jaxopt_marl.options.harvest", "make_library", {}),
    "overcooked_aa": ("jaxopt_marl.options.overcooked", "make_library", {}),
    "overcooked_fc": ("jaxopt_marl.options.overcooked", "make_library", {}),
}

GAMES: tuple[str, ...] = tuple(_REGISTRY)

#: The canonical variant of every game's library (the factory's defaults).
CANONICAL = "canonical"
#: ``--library auto``: draw a variant with the seed's interface channel.
AUTO = "auto"
#: game -> variant name -> the variant's keyword arguments (one entry per variant; module docstring).
LIBRARIES: dict[str, dict[str, dict[str, Any]]] = {
    game: {CANONICAL: {}, **_variants.VARIANTS[_variants.FAMILY[game]]} for game in _REGISTRY
}


def library_names(game: str) -> tuple[str, ...]:
    """The registered variants of ``game``'s library, sorted by name (the order :func:`draw_library` draws from).

    Raises:
        ValueError: unknown game.
    """
    if game not in LIBRARIES:
        raise ValueError(f"unknown game {game!r}; games with option libraries: {', '.join(LIBRARIES)}")
    return tuple(sorted(LIBRARIES[game]))


def check_library_name(game: str, name: str) -> None:
    """ValueError naming ``name`` and the valid variants unless ``name`` is a registered variant of ``game``."""
    names = library_names(game)
    if name not in names:
        raise ValueError(f"unknown option library {name!r} for {game}; valid: {', '.join((AUTO, *names))}")


def draw_library(game: str, seed: int) -> str:
    """The variant ``--library auto`` gives run seed ``seed``: ``library_names(game)[i]`` with ``i`` uniform in
    ``0..n-1`` drawn by ``jax.random.randint(seeding.library_key(seed), (), 0, n)`` (the interface channel)."""
    import jax

    from jaxopt_marl import seeding

    names = library_names(game)
    return names[int(jax.random.randint(seeding.library_key(seed), (), 0, len(names)))]


def resolve_library(game: str, name: str, seed: int, recorded: str | None = None) -> str:
    """``name`` itself (checked), or for ``auto`` the variant :func:`draw_library` draws for ``seed``.

    ``auto`` draws once, at the run's start; the variant drawn is then part of the run (``config.json``'s
    ``library``). ``recorded``: that recorded variant of the run being resumed, kept as it is for ``auto`` (no
    redraw: a variant added since would change the draw), so ``--resume`` of an ``auto`` run is never refused
    for its library. Raises ValueError if the recorded variant is no longer registered (named)."""
    if name == AUTO:
        if recorded is not None:
            try:
                check_library_name(game, recorded)
            except ValueError as e:
                raise ValueError(f"the run being resumed drew library {recorded!r}: {e}") from None
            return recorded
        return draw_library(game, seed)
    check_library_name(game, name)
    return name


class LibraryNotAvailable(RuntimeError):
    """The game is known but its option library has not been written yet."""


def register(game: str, module: str, factory: str = "make_library", **fixed: Any) -> None:
    """Register (or replace) the option library of ``game`` (with its :data:`CANONICAL` variant)."""
    _REGISTRY[game] = (module, factory, dict(fixed))
    LIBRARIES.setdefault(game, {CANONICAL: {}})


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


def get_library(game: str, env=None, library: str = CANONICAL, **config: Any) -> OptionLibrary:
    """The option library of ``game``.

    Args:
        game: a game name of :mod:`envs_jax` (``cleanup``, ``harvest``, ``overcooked_aa``, ``overcooked_fc``).
        env: the environment (default: ``envs_jax.make(game)``).
        library: the variant (a name of :data:`LIBRARIES`; default :data:`CANONICAL`); the library records it
            as ``lib.library``.
        **config: library options (e.g. ``effects="naive"`` for the defect tests on Overcooked).

    Raises:
        ValueError: unknown game or variant.
        LibraryNotAvailable: the game's library module is not written yet.
    """
    factory = _factory(game)
    check_library_name(game, library)
    if env is None:
        import envs_jax

        env = envs_jax.make(game)
    kw = {**LIBRARIES[game][library], **config}
    applied = {k: kw.pop(k) for k in _variants.APPLIED if k in kw}
    lib = factory(env, **_REGISTRY[game][2], **kw)
    if applied:
        from jaxopt_marl.options.base import apply_variant

        apply_variant(lib, **applied)
    lib.library = library
    return lib


__all__ = [
    "AUTO",
    "CANONICAL",
    "GAMES",
    "LIBRARIES",
    "LibraryNotAvailable",
    "OptionLibrary",
    "available",
    "check_library_name",
    "draw_library",
    "get_library",
    "library_names",
    "register",
    "resolve_library",
]
