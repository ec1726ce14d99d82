"""Vectorised JAX ports of the games used by jaxopt-marl.

Every game is a JaxMARL ``MultiAgentEnv`` (``reset``/``step`` jittable and vmappable, agents
``agent_0 … agent_{N-1}``) with two extras the option layer and the audits rely on:

* ``env.world_stats(state) -> dict[str, jax.Array]``: named scalars (``apples``; ``dirt`` in Cleanup;
  ``patches_alive`` in Harvest; ``deliveries`` in Overcooked, this episode so far).
* ``env.render(state) -> uint8[H, W, 3]``: an RGB picture of the whole map.

Games (see ``docs/environments.md``):

=================  ===========================================================  ======  =====
name               reproduces                                                   agents  steps
=================  ===========================================================  ======  =====
``cleanup``        Melting Pot 2.4.1 ``clean_up``                               7       150
``harvest``        Melting Pot 2.4.1 ``commons_harvest__open``                  7       400
``overcooked_aa``  Overcooked-AI Asymmetric Advantages (JaxMARL OvercookedV2)   2       400
``overcooked_fc``  Overcooked-AI Forced Coordination (JaxMARL OvercookedV2)     2       400
=================  ===========================================================  ======  =====
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

# name -> (module, class, fixed keyword arguments). Imported lazily so `import envs_jax` stays cheap.
_REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "cleanup": ("envs_jax.cleanup", "Cleanup", {}),
    "harvest": ("envs_jax.harvest", "CommonsHarvest", {}),
    "overcooked_aa": ("envs_jax.overcooked", "Overcooked", {"layout": "aa"}),
    "overcooked_fc": ("envs_jax.overcooked", "Overcooked", {"layout": "fc"}),
}

GAMES: tuple[str, ...] = tuple(_REGISTRY)


def _env_class(name: str):
    if name not in _REGISTRY:
        raise ValueError(f"unknown game {name!r}; valid games: {', '.join(GAMES)}")
    module, cls, _ = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)


def config_keys(name: str) -> tuple[str, ...]:
    """The configuration keys ``make(name, **config)`` accepts for game ``name``.

    Raises:
        ValueError: ``name`` is not a registered game.
    """
    cls = _env_class(name)
    fixed = _REGISTRY[name][2]
    params = inspect.signature(cls.__init__).parameters
    return tuple(
        p
        for p, v in params.items()
        if p != "self" and p not in fixed and v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD)
    )


def make(name: str, **config: Any):
    """Builds game ``name`` with configuration ``config``.

    Args:
        name: one of ``cleanup``, ``harvest``, ``overcooked_aa``, ``overcooked_fc``.
        **config: game configuration, e.g. ``max_steps=150`` (see each game's class for its keys).
            ``checked=True`` wraps the game in :class:`envs_jax.checks.CheckedEnv`, which reports
            out-of-range actions instead of letting them be silently clipped.

    Returns:
        A JaxMARL ``MultiAgentEnv`` with ``world_stats`` and ``render``.

    Raises:
        ValueError: unknown game, or unknown configuration key (the message lists the valid ones).
    """
    checked = bool(config.pop("checked", False))
    cls = _env_class(name)
    valid = config_keys(name)
    bad = sorted(set(config) - set(valid))
    if bad:
        raise ValueError(
            f"unknown config key(s) {bad} for game {name!r}; valid keys: {', '.join(valid) or '(none)'} (and 'checked')"
        )
    env = cls(**_REGISTRY[name][2], **config)
    if checked:
        from envs_jax.checks import CheckedEnv

        env = CheckedEnv(env)
    return env


__all__ = ["GAMES", "config_keys", "make"]
