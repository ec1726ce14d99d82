"""What the stages need to know about each game, as data: one :class:`GameInfo` per game name.

The stages read these fields instead of testing game names (``game == "cleanup"``,
``game.startswith("overcooked")``). What depends on the environment state (the team return, agent positions,
step rewards) is a method of the game's option library (:class:`jaxopt_marl.options.base.OptionLibrary`); what
the report and the prompts need without building an environment lives here. No JAX: the report imports it.
Hyper-parameter presets per game are not here (the run configuration holds them).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GameInfo:
    """One game's static facts.

    Attributes:
        name: the game name of :mod:`envs_jax` (``cleanup``, ``harvest``, ``overcooked_aa``, ``overcooked_fc``).
        family: the prompt family (system message, state labels, prompt lines): ``overcooked`` for both kitchen
            layouts, else the game name.
        return_unit: the unit of the team return (apples eaten / soups delivered, paper §6).
        shared_reward: every agent receives the team's reward (Overcooked's delivery reward), so the rewards do
            not tell who scored: per-agent credit comes from the decision records.
        hand_offs: objects can be handed over between agents (counters), audited by the report.
        dirt: the map has river dirt (Clean Up): prompts show it and the state labels read it.
    """

    name: str
    family: str
    return_unit: str = "apples"
    shared_reward: bool = False
    hand_offs: bool = False
    dirt: bool = False


GAMES: dict[str, GameInfo] = {
    "cleanup": GameInfo("cleanup", "cleanup", dirt=True),
    "harvest": GameInfo("harvest", "harvest"),
    "overcooked_aa": GameInfo("overcooked_aa", "overcooked", "deliveries", shared_reward=True, hand_offs=True),
    "overcooked_fc": GameInfo("overcooked_fc", "overcooked", "deliveries", shared_reward=True, hand_offs=True),
}


def info(game: str) -> GameInfo:
    """The :class:`GameInfo` of ``game``.

    Raises:
        ValueError: unknown game (naming the known ones).
    """
    if game not in GAMES:
        raise ValueError(f"unknown game {game!r}; known: {', '.join(GAMES)}")
    return GAMES[game]


__all__ = ["GAMES", "GameInfo", "info"]
