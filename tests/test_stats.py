"""jaxopt_marl.stats (paper §6.1 statistics) against hand-computed and independently computed values."""

import json
import math
import warnings

import numpy as np
import pytest
from scipy import stats as sps

from jaxopt_marl import stats as S


def _avg_ranks(pooled):
    """Average ranks (1-based), written out independently of scipy."""
    order = sorted(range(len(pooled)), key=lambda i: pooled[i])
    ranks = [0.0] * len(pooled)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and pooled[order[j + 1]] == pooled[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _mwu_asymptotic(x, y):
    """Two-sided normal-approximation p with tie and continuity corrections (e.g. Hollander & Wolfe)."""
    n1, n2 = len(x), len(y)
    n = n1 + n2
    pooled = list(x) + list(y)
    r1 = sum(_avg_ranks(pooled)[:n1])
    u = r1 - n1 * (n1 + 1) / 2
    ties = [pooled.count(v) for v in set(pooled)]
    var = n1 * n2 / 12 * ((n + 1) - sum(t**3 - t for t in ties) / (n * (n - 1)))
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return u, math.erfc(z / math.sqrt(2))


def test_mann_whitney_exact_hand_case():
    # x = 1, 2, 3 below every y = 4, 5, 6: U_x = 0, no ties, n <= 8 -> exact; P(U <= 0) = 1 / C(6, 3) = 1/20,
    # two-sided p = 2/20 = 0.1.
    r = S.mann_whitney([1, 2, 3], [4, 5, 6], "trained", "base")
    assert (r["method"], r["u"], r["u_max"]) == ("exact", 0.0, 9.0)
    assert r["p_value"] == pytest.approx(0.1, abs=1e-12)
    assert r["min_p_exact"] == pytest.approx(0.1)
    r = S.mann_whitney([4, 5, 6], [1, 2, 3])
    assert (r["u"], r["p_value"]) == (9.0, pytest.approx(0.1, abs=1e-12))
    # x = 1, 4 vs y = 2, 3: ranks 1, 4 -> R_x = 5, U_x = 5 - 3 = 2 = n1 n2 / 2: no evidence, p = 1.
    r = S.mann_whitney([1, 4], [2, 3])
    assert (r["u"], r["p_value"]) == (2.0, 1.0)


def test_mann_whitney_ties_hand_case():
    # x = 0, 0, 1 vs y = 0, 1, 1: ties -> asymptotic. Pooled 0,0,0 share ranks 1-3 (avg 2), 1,1,1 ranks 4-6
    # (avg 5): R_x = 2 + 2 + 5 = 9, U_x = 9 - 6 = 3, mu = 4.5. Tie term sum(t^3 - t) = 24 + 24 = 48, so
    # sigma^2 = 9/12 * (7 - 48/30) = 4.05; z = (|3 - 4.5| - 0.5) / sqrt(4.05) = 0.49690; p = erfc(z / sqrt 2)
    # = 0.61926.
    r = S.mann_whitney([0, 0, 1], [0, 1, 1])
    assert (r["method"], r["u"]) == ("asymptotic", 3.0)
    assert r["p_value"] == pytest.approx(math.erfc(1 / math.sqrt(4.05) / math.sqrt(2)), rel=1e-12)
    assert r["p_value"] == pytest.approx(0.61926, abs=1e-5)


def test_mann_whitney_large_sample_matches_independent_formula():
    rng = np.random.default_rng(7)
    x, y = rng.integers(0, 6, 20).tolist(), rng.integers(0, 4, 20).tolist()  # n > 8 and ties: asymptotic
    r = S.mann_whitney(x, y)
    u, p = _mwu_asymptotic(x, y)
    assert r["method"] == "asymptotic" and r["u"] == u and r["p_value"] == pytest.approx(p, rel=1e-10)
    # scipy's own "auto" choice agrees with the method recorded
    assert sps.mannwhitneyu(x, y, alternative="two-sided").pvalue == pytest.approx(r["p_value"], rel=1e-12)
    assert S.mwu_method(np.arange(8.0), np.arange(8.0) + 20) == "exact"
    assert S.mwu_method(np.arange(9.0), np.arange(9.0) + 20) == "asymptotic"
    assert S.mwu_method(np.arange(3.0), np.arange(30.0) + 20) == "exact"  # one sample <= 8, no ties


def test_paper_like_separation_is_significant():
    # Paper §6.1 shape: 20 episodes each, frozen base all 0, trained all > 0 -> U = 400 of 400, p < 1e-7.
    r = S.mann_whitney([5.0 + i % 4 for i in range(20)], [0.0] * 20)
    assert (r["u"], r["u_max"]) == (400.0, 400.0) and r["p_value"] < 1e-7


def test_bootstrap_constant_and_small_samples():
    s = S.summarize([3.0, 3.0, 3.0])
    assert (s["n"], s["mean"], s["std"], s["ci"]) == (3, 3.0, 0.0, [3.0, 3.0])
    s = S.summarize([0.1] * 7)  # float rounding of the mean cannot move the interval off the value
    assert s["mean"] == 0.1 and s["ci"] == [0.1, 0.1]
    s = S.summarize([2.5])
    assert (s["n"], s["mean"], s["std"], s["ci"]) == (1, 2.5, None, None)
    assert S.summarize([]) == {"n": 0, "values": [], "mean": None, "std": None, "ci": None}


def test_bootstrap_is_deterministic_and_holds_the_mean():
    v = [3.0, 5.0, 0.0, 7.0, 2.0, 9.0, 4.0, 4.0, 1.0, 6.0]
    a, b = S.summarize(v), S.summarize(list(v))
    assert a == b
    lo, hi = a["ci"]
    assert min(v) <= lo < a["mean"] < hi <= max(v)
    assert a["mean"] == pytest.approx(4.1) and a["std"] == pytest.approx(np.std(v, ddof=1))
    # The same call of scipy with the same seed gives the same interval (the parameters are the paper's).
    ref = sps.bootstrap(
        (np.array(v),),
        np.mean,
        n_resamples=10_000,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(S.BOOTSTRAP_SEED),
    ).confidence_interval
    assert a["ci"] == [ref.low, ref.high]


def test_bootstrap_matches_an_independent_resampling():
    # A plain numpy percentile bootstrap with another seed: the intervals agree up to Monte Carlo error (the
    # 2.5% quantile's standard error with 10,000 resamples is about 0.03 s/sqrt(n); tolerance 0.15 s/sqrt(n)).
    rng = np.random.default_rng(123)
    v = rng.normal(10.0, 3.0, 20)
    means = v[rng.integers(0, v.size, (10_000, v.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    s = S.summarize(v)
    tol = 0.15 * v.std(ddof=1) / math.sqrt(v.size)
    assert s["ci"][0] == pytest.approx(lo, abs=tol) and s["ci"][1] == pytest.approx(hi, abs=tol)


def test_degenerate_inputs_give_no_warnings_and_json_without_nan():
    cases = [
        ([], [1.0]),
        ([1.0], [1.0]),
        ([1.0], [2.0]),
        ([0.0, 0.0], [0.0, 0.0]),
        ([0.0] * 20, [0.0] * 20),
        ([2.0] * 20, [0.0] * 20),
        ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]),
        ([1.0, 2.0], None),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for x, y in cases:
            json.dumps(S.eval_stats(x, y), allow_nan=False)


def test_eval_stats_layout_and_notes():
    st = S.eval_stats([3.0, 5.0], [0.0, 0.0], seeds=[10000, 10001], units="apples")
    assert st["seeds"] == [10000, 10001] and st["units"] == "apples" and st["metric"] == "team_return"
    assert (st["confidence_level"], st["n_resamples"], st["bootstrap_method"]) == (0.95, 10_000, "percentile")
    assert st["trained"]["policy"] == "trained" and st["base"]["policy"] == "frozen_base"
    assert st["trained"]["values"] == [3.0, 5.0] and st["trained"]["ci"] == [3.0, 5.0]
    assert st["base"]["ci"] == [0.0, 0.0] and st["mann_whitney"]["u"] == 4.0
    notes = " ".join(st["notes"])
    assert "Only 2 episode(s) per policy" in notes and "[0, 0]" in notes and "cannot give a two-sided p" in notes
    same = S.eval_stats([0.0] * 6, [0.0] * 6)
    assert same["mann_whitney"]["p_value"] == 1.0 and any("nothing to compare" in n for n in same["notes"])
    big = S.eval_stats([5.0 + i % 4 for i in range(20)], [0.0 + (i == 3) for i in range(20)])
    assert not any("Only" in n or "cannot give" in n for n in big["notes"])
    solo = S.eval_stats([1.0, 2.0], None)
    assert solo["base"] is None and solo["mann_whitney"] is None


def test_bad_values_are_named():
    with pytest.raises(ValueError, match=r"trained: value nan at index 1 is not a finite number"):
        S.eval_stats([1.0, float("nan")], [0.0, 0.0])
    with pytest.raises(ValueError, match=r"frozen_base: 1 value\(s\) for 2 seed\(s\)"):
        S.eval_stats([1.0, 2.0], [0.0], seeds=[10000, 10001])


def test_rate_ci_clopper_pearson_hand_cases():
    """Exact (Clopper-Pearson) 95% intervals: with k = 0 the upper end solves (1 - p)^n = 0.025, with k = n the
    lower end solves p^n = 0.025 (closed forms); k = 1 of n = 2 gives [0.025 quantile of Beta(1, 2), its mirror],
    i.e. [1 - sqrt(0.975), sqrt(0.975)]."""
    zero = S.rate_ci(0, 10)
    assert zero["rate"] == 0.0 and zero["ci"][0] == 0.0
    np.testing.assert_allclose(zero["ci"][1], 1 - 0.025 ** (1 / 10), rtol=1e-9)
    full = S.rate_ci(10, 10)
    assert full["rate"] == 1.0 and full["ci"][1] == 1.0
    np.testing.assert_allclose(full["ci"][0], 0.025 ** (1 / 10), rtol=1e-9)
    half = S.rate_ci(1, 2)
    np.testing.assert_allclose(half["ci"], [1 - 0.975**0.5, 0.975**0.5], rtol=1e-9)
    assert S.rate_ci(0, 0) == {"k": 0, "n": 0, "rate": None, "ci": None}
    for k, n in ((3, 2), (-1, 4), (1.5, 4)):
        with pytest.raises(ValueError, match=f"k={k!r}, n={n!r}"):
            S.rate_ci(k, n)
