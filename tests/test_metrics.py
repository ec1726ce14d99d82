"""Hand-computed social-dilemma metrics (spec §4)."""

import numpy as np

from jaxopt_marl import metrics


def _episode():
    # T = 4 steps, N = 3 agents. Agent 0 eats at steps 1 and 3, agent 1 at step 4, agent 2 never.
    r = np.zeros((4, 3))
    r[0, 0] = 1
    r[2, 0] = 1
    r[3, 1] = 1
    return r


def test_efficiency_is_collective_return_per_step():
    assert metrics.efficiency(_episode()) == 3 / 4


def test_equality_hand_computed_gini():
    # returns (2, 1, 0): sum_ij |Ri - Rj| = 2 * (1 + 2 + 1) = 8; G = 8 / (2 * 3 * 3) = 4/9.
    np.testing.assert_allclose(metrics.equality(_episode()), 1 - 4 / 9)
    assert metrics.equality(np.zeros((5, 3))) == 1.0  # stated convention: nothing collected -> E = 1


def test_sustainability_excludes_unrewarded_agents():
    # agent 0: mean step (1 + 3) / 2 = 2; agent 1: 4; agent 2 excluded -> S = 3.
    assert metrics.sustainability(_episode()) == 3.0
    assert np.isnan(metrics.sustainability(np.zeros((5, 3))))


def test_peace_counts_agents_in_play():
    alive = np.ones((10, 7), dtype=bool)
    alive[2:7, 3] = False  # one agent removed for 5 of 10 steps -> 7 - 0.5
    assert metrics.peace(alive) == 6.5


def test_batched_episodes():
    r = np.stack([_episode(), np.zeros((4, 3))])
    np.testing.assert_allclose(metrics.efficiency(r), [0.75, 0.0])
    np.testing.assert_allclose(metrics.equality(r), [1 - 4 / 9, 1.0])
