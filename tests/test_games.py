"""Per-game facts as data (issue #13 item 3): the stages read :mod:`jaxopt_marl.games` and the option library's
methods instead of testing game names."""

import jax
import numpy as np
import pytest

from jaxopt_marl import games, prompts


def test_game_info():
    assert set(games.GAMES) == {"cleanup", "harvest", "overcooked_aa", "overcooked_fc"}
    assert [g for g, i in games.GAMES.items() if i.dirt] == ["cleanup"]
    for g in ("overcooked_aa", "overcooked_fc"):
        i = games.info(g)
        assert (i.family, i.return_unit, i.shared_reward, i.hand_offs) == ("overcooked", "deliveries", True, True)
        assert prompts.family(g) == "overcooked"
    for g in ("cleanup", "harvest"):
        assert games.info(g).return_unit == "apples" and prompts.family(g) == g
    with pytest.raises(ValueError, match="unknown game 'chess'"):
        games.info("chess")


def test_every_game_has_a_prompt_family_and_a_view():
    # A game's prompts are data: its family's record (system text, labels, view), one host view and one device
    # template per view (jaxopt_marl.prompts.VIEWS, jaxopt_marl.prompt_ids._TEMPLATES).
    from jaxopt_marl import prompt_ids

    for g, i in games.GAMES.items():
        fam = prompts.prompt_family(g)
        assert fam.name == i.family and fam.labels == prompts.STATE_LABELS[i.family]
        assert fam.view == ("kitchen" if i.family == "overcooked" else "window")
        assert prompts.view(g) is prompts.VIEWS[fam.view] and fam.view in prompt_ids._TEMPLATES
        assert prompts.system_message(g).startswith(prompts.SYSTEM[i.family])
    with pytest.raises(ValueError, match="unknown game 'chess'; known: cleanup, harvest, overcooked_aa, overcooked_fc"):
        prompts.system_message("chess")


def test_map_layers_and_legend_are_the_games_own():
    # artifacts.map_layers and episode_gif.legend_for read the env's own methods (no attribute sniffing).
    import envs_jax

    for g, extra in (("cleanup", {"water"}), ("harvest", {"patch_id"}), ("overcooked_fc", set())):
        env = envs_jax.make(g)
        layers = env.map_layers()
        assert "wall" in layers and extra <= set(layers), g
        assert all(np.asarray(v).shape == np.asarray(layers["wall"]).shape for v in layers.values()), g
        assert env.legend() and all(len(rgb) == 3 for _, rgb in env.legend()), g


def test_library_scores_and_views():
    import envs_jax
    from jaxopt_marl.options import get_library

    env = envs_jax.make("overcooked_aa", max_steps=8)
    lib = get_library("overcooked_aa", env)
    _, s = env.reset(jax.random.PRNGKey(0))
    pos, alive = lib.agent_view(s)
    np.testing.assert_array_equal(pos, env.agent_positions(s))
    assert alive.all() and float(lib.team_return(s)) == 0.0
    post = s.replace(deliveries=s.deliveries + 1)
    np.testing.assert_array_equal(lib.step_rewards(s, post), [20.0, 20.0])  # DELIVERY_REWARD, shared
    assert float(lib.team_return(post)) == 1.0
