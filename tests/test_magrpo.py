"""PA-MAGRPO math: advantages, PPO-clip + KL on a hand-computed cohort, registry, config."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxopt_marl import magrpo
from tests.helpers import assert_fp32_close

#: Float32 roundings behind one advantage (tests.helpers.fp32_atol): the mean (3-4 returns), the centring, the
#: variance (as many squares and a sum), its square root and the division.
N_ADV = 12
#: ... behind one per-agent loss term: the log-prob differences, exp, the clip, the product with A, the k3 KL
#: (exp, two subtractions), the beta product and the mean over 2 decisions.
N_LOSS = 12

# --------------------------------------------------------------------------------------------------
# Advantages.
# --------------------------------------------------------------------------------------------------


def test_grpo_advantage_hand_values():
    # R = [1, 0, 2]: mean 1, centred [0, -1, 1], population var 2/3, std sqrt(2/3),
    # A = centred / std = [0, -sqrt(3/2), +sqrt(3/2)] = [0, -1.2247449, 1.2247449].
    adv = np.asarray(magrpo.group_relative_advantage(jnp.array([1.0, 0.0, 2.0])))
    assert adv.dtype == np.float32
    # float32 vs exact: a mean, a variance and a square root of 3 returns, a division (N_ADV roundings).
    assert_fp32_close(adv, [0.0, -math.sqrt(1.5), math.sqrt(1.5)], N_ADV)
    assert adv[0] == 0.0
    # Sample std (ddof = 1): var = 2/2 = 1, so A = centred = [0, -1, 1].
    assert_fp32_close(magrpo.group_relative_advantage(jnp.array([1.0, 0.0, 2.0]), ddof=1), [0.0, -1.0, 1.0], N_ADV)
    # Population convention: zero mean and unit RMS (each advantage off by float32 error, scale max |A|).
    adv = np.asarray(magrpo.group_relative_advantage(jnp.array([3.0, 7.0, 7.0, 19.0])), np.float64)
    assert_fp32_close(adv.mean(), 0.0, N_ADV, scale=np.abs(adv).max())
    assert_fp32_close(np.sqrt((adv**2).mean()), 1.0, 2 * N_ADV, scale=np.abs(adv).max())


@pytest.mark.parametrize(
    "returns", [[0.1, 0.1, 0.1], [0.0, 0.0, 0.0, 0.0], [7.3] * 6, [1e30] * 4, [0.3, 0.3, 0.3, 0.3, 0.3]]
)
@pytest.mark.parametrize("name", ["grpo", "group_mean"])
def test_zero_spread_cohort_gives_exact_zeros(returns, name):
    r = jnp.asarray(returns, jnp.float32)
    # The naive formula leaves a residue (or NaN) for some of these; ours must be exactly 0.
    adv = np.asarray(magrpo.get("advantage", name)(r))
    assert np.isfinite(adv).all()
    assert np.all(adv == 0.0), adv


def test_naive_formula_leaves_residue_for_point_one():
    # Documents why the zero-spread case is selected, not divided: in float32 the mean of
    # [0.1] * 3 is not 0.1, so the centred values are ~1e-9 and not zero.
    r = jnp.full((3,), 0.1, jnp.float32)
    centred = np.asarray(r - r.mean())
    assert np.any(centred != 0.0)
    assert np.all(np.asarray(magrpo.group_relative_advantage(r)) == 0.0)


def test_tiny_spread_below_eps_and_batched_cohorts():
    r = jnp.array([[1.0, 1.0 + 1e-7, 1.0], [0.0, 1.0, 0.0]], jnp.float32)
    adv = np.asarray(magrpo.group_relative_advantage(r))
    assert np.all(adv[0] == 0.0)
    # [0, 1, 0]: mean 1/3, std sqrt(2)/3 -> A = [-1/sqrt(2), sqrt(2), -1/sqrt(2)].
    assert_fp32_close(adv[1], [-1 / math.sqrt(2), math.sqrt(2), -1 / math.sqrt(2)], N_ADV)


def test_decision_advantages_broadcast():
    out = magrpo.decision_advantages(jnp.array([0.5, -0.5]), jnp.array([1, 0, 0, 1]))
    np.testing.assert_array_equal(out, [-0.5, 0.5, 0.5, -0.5])


# --------------------------------------------------------------------------------------------------
# The loss on a hand-computed cohort.
# --------------------------------------------------------------------------------------------------


def test_loss_on_hand_computed_cohort():
    # Cohort R = [1, 0, 2] -> A = [0, -s, +s], s = sqrt(1.5) = 1.2247449 (see above).
    s = math.sqrt(1.5)
    adv_k = magrpo.group_relative_advantage(jnp.array([1.0, 0.0, 2.0]))
    rollout = jnp.array([2, 1, 2, 0, 0])
    agent = jnp.array([0, 0, 1, 1, 0])
    valid = jnp.array([True, True, True, True, False])  # decision 4 is padding
    adv = magrpo.decision_advantages(adv_k, rollout)
    # Ratios rho = exp(new - old) = [1.5, 0.5, 1.1, 0.7]; eps = 0.2 so clip range [0.8, 1.2].
    #   d0: A=+s, rho 1.5 -> min(1.5 s, 1.2 s) = 1.2 s           -> pg = -1.2 s = -1.4696938
    #   d1: A=-s, rho 0.5 -> min(-0.5 s, -0.8 s) = -0.8 s        -> pg = +0.8 s = +0.9797959
    #   d2: A=+s, rho 1.1 -> inside the range: 1.1 s            -> pg = -1.1 s = -1.3472194
    #   d3: A= 0, rho 0.7                                        -> pg = 0
    old = jnp.array([-1.0, -2.0, -0.5, -3.0, 0.0])
    new = old + jnp.log(jnp.array([1.5, 0.5, 1.1, 0.7, 1.0]))
    new = new.at[4].set(100.0)  # garbage on the padding row must not leak (exp(100) overflows)
    # k3 with delta = ref - new = [ln 2, 0, -ln 2, ln 1.5]:
    #   d0: 2 - ln 2 - 1 = 0.3068528   d1: 0   d2: 1/2 + ln 2 - 1 = 0.1931472
    #   d3: 1.5 - ln 1.5 - 1 = 0.0945349
    ref = new + jnp.log(jnp.array([2.0, 1.0, 0.5, 1.5, 1.0]))
    beta, eps = 0.1, 0.2
    loss, m = magrpo.magrpo_loss(new, old, ref, adv, valid, agent, 2, clip_eps=eps, kl_beta=beta)
    # Per agent, means over its own decisions:
    #   agent 0 (d0, d1): pg (-1.2 s + 0.8 s) / 2 = -0.2 s = -0.24494897; KL (0.3068528 + 0) / 2
    #     = 0.1534264; L0 = -0.24494897 + 0.1 * 0.1534264 = -0.22960633
    #   agent 1 (d2, d3): pg -1.1 s / 2 = -0.6736097; KL (0.1931472 + 0.0945349) / 2 = 0.1438410;
    #     L1 = -0.6736097 + 0.0143841 = -0.6592256
    # Total sum_i L^i = -0.8888319. (A single mean over all four decisions would give
    # (-1.2 s + 0.8 s - 1.1 s) / 4 + 0.1 * 0.5945349 / 4 = -0.4443 -- half of this.)
    k3 = [1 - math.log(2), 0.0, 0.5 + math.log(2) - 1, 0.5 - math.log(1.5)]
    l0 = -0.2 * s + beta * (k3[0] + k3[1]) / 2
    l1 = -0.55 * s + beta * (k3[2] + k3[3]) / 2
    # float32 vs exact: the log-probs (|x| <= 3) are float32 sums, their differences go through exp (ratios
    # <= 2) and are multiplied by |A| <= s, then averaged over 2 decisions: a few roundings (N_LOSS), scale the
    # largest such term, 3 * 2 * s.
    terms = 3 * 2 * s
    assert_fp32_close(m["pg_loss"], [-0.2 * s, -0.55 * s], N_LOSS, scale=terms)
    assert_fp32_close(m["kl"], [(k3[0] + k3[1]) / 2, (k3[2] + k3[3]) / 2], N_LOSS, scale=terms)
    assert_fp32_close(m["loss"], [l0, l1], N_LOSS, scale=terms)
    assert_fp32_close(m["loss"], [-0.22960633, -0.6592256], N_LOSS, scale=terms)
    assert_fp32_close(loss, -0.8888319, N_LOSS + 1, scale=terms)
    np.testing.assert_allclose(m["clip_frac"], [1.0, 0.5])  # |rho - 1| > eps: d0, d1 | d3
    # Each ratio alone: exp of a difference of log-probs (|x| <= 3): its error is the ratio times theirs.
    assert_fp32_close(m["ratio_min"], [0.5, 0.7], N_LOSS, scale=3 * np.array([0.5, 0.7]))
    assert_fp32_close(m["ratio_max"], [1.5, 1.1], N_LOSS, scale=3 * np.array([1.5, 1.1]))
    np.testing.assert_array_equal(m["count"], [2.0, 2.0])


def test_ppo_clip_and_kl_pieces():
    # Ratio 1 exactly when new == old; k3 exactly 0 when new == ref, and never negative.
    lp = jnp.array([-3.0, -0.1, -7.5])
    pg, ratio = magrpo.ppo_clip_loss(lp, lp, jnp.array([1.0, -2.0, 0.5]), clip_eps=0.2)
    np.testing.assert_array_equal(ratio, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(pg, [-1.0, 2.0, -0.5])
    np.testing.assert_array_equal(magrpo.kl_k3(lp, lp), [0.0, 0.0, 0.0])
    d = jnp.linspace(-5.0, 5.0, 101)
    assert np.all(np.asarray(magrpo.kl_k3(jnp.zeros_like(d), d)) >= 0.0)
    np.testing.assert_allclose(magrpo.kl_k2(jnp.array([1.0]), jnp.array([0.0])), [0.5])
    np.testing.assert_allclose(magrpo.kl_k1(jnp.array([1.0]), jnp.array([0.25])), [0.75])


def test_empty_agent_and_padding_give_zero_loss_and_gradient():
    import jax

    new = jnp.array([-1.0, jnp.nan, -2.0])
    old = jnp.array([-1.2, jnp.nan, -2.0])
    valid = jnp.array([True, False, True])
    groups = jnp.array([0, 2, 0])

    def f(new):
        loss, m = magrpo.magrpo_loss(
            new, old, old, jnp.array([1.0, 5.0, -1.0]), valid, groups, 3, clip_eps=0.2, kl_beta=0.05
        )
        return loss, m

    (loss, m), g = jax.value_and_grad(f, has_aux=True)(new)
    assert np.isfinite(loss) and np.all(np.isfinite(np.asarray(g)))
    assert g[1] == 0.0
    np.testing.assert_array_equal(m["loss"][1:], [0.0, 0.0])
    np.testing.assert_array_equal(m["count"], [2.0, 0.0, 0.0])


# --------------------------------------------------------------------------------------------------
# Registry and config.
# --------------------------------------------------------------------------------------------------


def test_registry():
    assert magrpo.names("advantage") == ("group_mean", "grpo")
    assert magrpo.names("kl") == ("k1", "k2", "k3")
    assert magrpo.get("policy_loss", "ppo_clip") is magrpo.ppo_clip_loss
    with pytest.raises(ValueError, match="registered"):
        magrpo.get("kl", "k4")
    with pytest.raises(ValueError, match="unknown registry kind"):
        magrpo.get("critic", "gae")
    with pytest.raises(ValueError, match="already registered"):
        magrpo.register("kl", "k3")(lambda a, b: a)


def test_config_presets_and_validation():
    c = magrpo.MAGRPOConfig.paper("cleanup")
    assert (c.learning_rate, c.num_rollouts, c.temperature, c.clip_eps, c.epochs, c.max_grad_norm) == (
        5e-5,
        4,
        0.7,
        0.2,
        2,
        1.0,
    )
    o = magrpo.MAGRPOConfig.paper("overcooked_aa")
    assert (o.learning_rate, o.num_rollouts, o.temperature, o.kl_beta) == (2e-5, 6, 0.9, 0.05)
    assert magrpo.MAGRPOConfig(epochs=3, num_minibatches=2).steps_per_round == 6
    with pytest.raises(ValueError, match="clip_eps"):
        magrpo.MAGRPOConfig(clip_eps=0.0)
    with pytest.raises(ValueError, match="unknown kl"):
        magrpo.MAGRPOConfig(kl_estimator="k9")
    with pytest.raises(ValueError, match="unknown game"):
        magrpo.MAGRPOConfig.paper("chess")
