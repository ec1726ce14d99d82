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
