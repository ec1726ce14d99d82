"""Evaluation statistics of paper §6.1 ("Evaluation protocol and statistics"), computed with ``scipy.stats``.

The paper evaluates each policy on 20 episodes with the fixed held-out seeds 10000-10019 and reports the mean
team return with a 95% percentile bootstrap confidence interval of the mean (10,000 resamples), and compares
the full method with the frozen base by a two-sided Mann–Whitney U test. :func:`eval_stats` does the same for
one run's trained adapters and frozen base (the same seeds, so the samples are comparable seed for seed):

- per policy: ``n``, mean, sample std (``ddof=1``), the percentile bootstrap CI of the mean
  (``scipy.stats.bootstrap(..., method="percentile")`` with a fixed seed, so it is deterministic);
- trained vs base: ``scipy.stats.mannwhitneyu(..., alternative="two-sided")`` with the method chosen by scipy's
  documented ``"auto"`` rule (exact when one sample has at most 8 values and no value is tied, else the normal
  approximation with tie and continuity corrections) but passed explicitly, so the method recorded is the one
  used; U is the statistic of the trained sample (``U_trained + U_base = n_trained * n_base``);
- plain-words notes when the numbers cannot say much: fewer than :data:`MIN_EPISODES` episodes, a constant
  sample, identical samples.

Degenerate inputs give defined numbers, without warnings: a constant sample's CI is ``[v, v]`` (every
resample has mean v); a single value has no std and no CI (``None``); an empty sample has only ``n = 0``.
The returned dicts hold plain Python numbers and ``None`` only (no NaN), ready for ``json.dumps``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy
from scipy import stats as sps

#: Confidence level of the bootstrap interval (paper §6.1: 95%).
CONFIDENCE_LEVEL = 0.95
#: Bootstrap resamples (paper §6.1: 10,000).
N_RESAMPLES = 10_000
#: Bootstrap interval method (paper §6.1: percentile).
BOOTSTRAP_METHOD = "percentile"
#: Seed of the bootstrap's ``numpy.random.Generator`` (our choice; fixed so reports are reproducible).
BOOTSTRAP_SEED = 0
#: Alternative hypothesis of the Mann–Whitney U test (paper §6.1: two-sided).
ALTERNATIVE = "two-sided"
#: Continuity correction of the asymptotic Mann–Whitney p-value (scipy's default).
USE_CONTINUITY = True
#: Largest sample size at which scipy's ``"auto"`` rule picks the exact Mann–Whitney distribution (no ties).
EXACT_MAX_N = 8
#: Fewer episodes per policy than this and the report says the statistics are too thin to conclude anything
#: (our choice: with 4 vs 4 the exact two-sided test cannot go below p = 2/70 ≈ 0.029).
MIN_EPISODES = 5
#: Oldest scipy with ``bootstrap(..., rng=)`` (1.15); :func:`check_scipy` enforces it before any compute.
SCIPY_MIN = (1, 15)


def check_scipy() -> None:
    """Raises ImportError naming the installed version if scipy is older than :data:`SCIPY_MIN`."""
    have = tuple(int(p) for p in scipy.__version__.split(".")[:2])
    if have < SCIPY_MIN:
        raise ImportError(
            f"jaxopt_marl.stats needs scipy >= {'.'.join(map(str, SCIPY_MIN))}, found scipy {scipy.__version__}"
        )


def _values(values: Sequence[float], name: str) -> np.ndarray:
    """``values`` as float64[n]; ValueError naming ``name`` and the first non-finite value."""
    v = np.asarray(values, np.float64).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise ValueError(f"{name}: value {float(v[bad[0]])!r} at index {int(bad[0])} is not a finite number")
    return v


def summarize(values: Sequence[float], name: str = "sample") -> dict:
    """Mean, sample std and the percentile bootstrap CI of the mean of one policy's per-episode values.

    Args:
        values: float[n], one value per evaluation episode (e.g. team return in apples or deliveries).
        name: the sample's label, used in error messages.

    Returns:
        ``{"n", "values", "mean", "std", "ci"}``: ``mean`` (None if n = 0), ``std`` the sample std with ddof = 1
        (None if n < 2), ``ci`` ``[low, high]`` of the mean at :data:`CONFIDENCE_LEVEL` from
        :data:`N_RESAMPLES` resamples (None if n < 2; ``[v, v]`` for a constant sample, without calling the
        bootstrap, so float rounding cannot move it off v), all in the values' units.

    Raises:
        ValueError: a value is NaN or infinite (the message names it and its index).
    """
    v = _values(values, name)
    out = {"n": int(v.size), "values": v.tolist(), "mean": None, "std": None, "ci": None}
    if v.size == 0:
        return out
    constant = bool(np.all(v == v[0]))
    out["mean"] = float(v[0]) if constant else float(v.mean())
    if v.size < 2:
        return out
    out["std"] = 0.0 if constant else float(v.std(ddof=1))
    if constant:
        out["ci"] = [float(v[0]), float(v[0])]
    else:
        res = sps.bootstrap(
            (v,),
            np.mean,
            n_resamples=N_RESAMPLES,
            confidence_level=CONFIDENCE_LEVEL,
            method=BOOTSTRAP_METHOD,
            rng=np.random.default_rng(BOOTSTRAP_SEED),
        )
        out["ci"] = [float(res.confidence_interval.low), float(res.confidence_interval.high)]
    return out


def mwu_method(x: np.ndarray, y: np.ndarray) -> str:
    """The p-value method scipy's ``mannwhitneyu(method="auto")`` documents for these samples: ``"exact"``
    when one sample has at most :data:`EXACT_MAX_N` values and no value of the pooled sample is tied, else
    ``"asymptotic"``."""
    pooled = np.concatenate([x, y])
    ties = np.unique(pooled).size < pooled.size
    return "exact" if min(x.size, y.size) <= EXACT_MAX_N and not ties else "asymptotic"


def mann_whitney(x: Sequence[float], y: Sequence[float], x_name: str = "x", y_name: str = "y") -> dict | None:
    """Two-sided Mann–Whitney U test of ``x`` against ``y`` (``scipy.stats.mannwhitneyu``).

    Args:
        x, y: float[n_x], float[n_y]: per-episode values of the two policies (trained first).
        x_name, y_name: their labels (recorded, and used in error messages).

    Returns:
        ``{"x", "y", "n_x", "n_y", "alternative", "method", "use_continuity", "u", "u_max", "p_value",
        "min_p_exact"}``, None if a sample is empty. ``u`` is U of ``x`` (the number of (x, y) pairs with x > y,
        ties counting 1/2), ``u_max`` = n_x * n_y, so ``u / u_max`` is the probability that an x episode beats
        a y episode. ``min_p_exact`` = 2 / C(n_x + n_y, n_x) (at most 1) is the smallest two-sided p the exact
        test can reach at these sizes, whatever the data. ``use_continuity`` applies to ``"asymptotic"`` only.

    Raises:
        ValueError: a value is NaN or infinite.
    """
    xv, yv = _values(x, x_name), _values(y, y_name)
    if xv.size == 0 or yv.size == 0:
        return None
    method = mwu_method(xv, yv)
    res = sps.mannwhitneyu(xv, yv, use_continuity=USE_CONTINUITY, alternative=ALTERNATIVE, method=method)
    return {
        "x": x_name,
        "y": y_name,
        "n_x": int(xv.size),
        "n_y": int(yv.size),
        "alternative": ALTERNATIVE,
        "method": method,
        "use_continuity": USE_CONTINUITY,
        "u": float(res.statistic),
        "u_max": float(xv.size * yv.size),
        "p_value": float(res.pvalue),
        "min_p_exact": min(1.0, 2.0 / math.comb(int(xv.size + yv.size), int(xv.size))),
    }


def _notes(blocks: dict[str, dict], test: dict | None) -> list[str]:
    """Plain-words caveats for the report: thin samples, constant samples, identical samples, a test that
    cannot reach the 5% level at these sizes."""
    notes = []
    thin = {label: s["n"] for label, s in blocks.items() if s["n"] < MIN_EPISODES}
    if thin:
        sizes = (
            f"{next(iter(thin.values()))} episode(s) per policy"
            if len(set(thin.values())) == 1 and len(thin) == len(blocks)
            else ", ".join(f"{k} {v} episode(s)" for k, v in thin.items())
        )
        notes.append(
            f"Only {sizes} (fewer than {MIN_EPISODES}; the paper uses 20): the means, intervals and "
            "test say next to nothing."
        )
    const = {label: s["mean"] for label, s in blocks.items() if s["n"] >= 2 and s["std"] == 0.0}
    if len(const) == len(blocks) and len(set(const.values())) == 1 and len(blocks) > 1:
        notes.append(
            f"Every episode of both policies returned {next(iter(const.values())):g}: the intervals are "
            "single points and the Mann–Whitney test has nothing to compare (p = 1)."
        )
    else:
        notes += [
            f"{label}: every episode returned {v:g}, so its bootstrap interval is [{v:g}, {v:g}]: no spread "
            "was observed, which is not certainty."
            for label, v in const.items()
        ]
    if test is not None and test["min_p_exact"] > 0.05 and test["p_value"] < 1.0:
        notes.append(
            f"With {test['n_x']} vs {test['n_y']} episodes the exact test cannot give a two-sided p below "
            f"{test['min_p_exact']:.3g} even for completely separated samples, so this test cannot show a "
            "difference at the 5% level"
            + (
                f"; the p = {test['p_value']:.3g} here is the normal approximation's (used because of ties), "
                "which is unreliable at this size"
                if test["method"] == "asymptotic" and test["p_value"] < test["min_p_exact"]
                else ""
            )
            + "."
        )
    return notes


def eval_stats(
    trained: Sequence[float],
    base: Sequence[float] | None,
    *,
    seeds: Sequence[int] | None = None,
    metric: str = "team_return",
    units: str | None = None,
    labels: tuple[str, str] = ("trained", "frozen_base"),
) -> dict:
    """The ``stats`` block of ``eval.json`` (paper §6.1) for the trained adapters and the frozen base.

    Args:
        trained: float[E] per-episode values of the trained adapters (``metric``, e.g. team return).
        base: float[E] per-episode values of the frozen base on the same seeds, or None when it was not run.
        seeds: int[E] the episodes' environment seeds (both policies), recorded as given.
        metric: name of the per-episode quantity.
        units: its units (apples, deliveries).
        labels: names of the two policies, as ``eval.json``'s blocks call them.

    Returns:
        ``{"metric", "units", "seeds", "confidence_level", "n_resamples", "bootstrap_method", "bootstrap_seed",
        "trained": summarize(trained), "base": summarize(base) | None, "mann_whitney": mann_whitney(trained,
        base) | None, "notes": [str]}``; each summary also carries ``"policy"`` (its label).

    Raises:
        ValueError: a value is NaN or infinite, or the two samples have different lengths although ``seeds``
            says they share the seeds.
    """
    out = {
        "metric": metric,
        "units": units,
        "seeds": None if seeds is None else [int(s) for s in seeds],
        "confidence_level": CONFIDENCE_LEVEL,
        "n_resamples": N_RESAMPLES,
        "bootstrap_method": BOOTSTRAP_METHOD,
        "bootstrap_seed": BOOTSTRAP_SEED,
        "source": "paper §6.1: 95% percentile bootstrap CI of the mean (10,000 resamples), two-sided Mann–Whitney U",
    }
    t = {"policy": labels[0], **summarize(trained, labels[0])}
    b = None if base is None else {"policy": labels[1], **summarize(base, labels[1])}
    if seeds is not None:
        for s in (t, b):
            if s is not None and s["n"] != len(out["seeds"]):
                raise ValueError(f"{s['policy']}: {s['n']} value(s) for {len(out['seeds'])} seed(s)")
    test = None if b is None else mann_whitney(trained, base, labels[0], labels[1])
    out.update(
        trained=t, base=b, mann_whitney=test, notes=_notes({labels[0]: t, **({labels[1]: b} if b else {})}, test)
    )
    return out


def rate_ci(k: int, n: int, confidence: float = CONFIDENCE_LEVEL) -> dict:
    """A rate ``k / n`` (a parse-failure rate, a share of decisions) with its exact two-sided Clopper-Pearson
    interval, ``scipy.stats.binomtest(k, n).proportion_ci(confidence, method="exact")``.

    Returns:
        ``{"k", "n", "rate", "ci": [lo, hi]}`` (plain floats); ``rate`` and ``ci`` are None when ``n == 0``.

    Raises:
        ValueError: ``k`` or ``n`` not a whole number, negative, or ``k > n`` (both named).
    """
    if int(k) != k or int(n) != n or not 0 <= k <= n:
        raise ValueError(f"need whole numbers 0 <= k <= n, got k={k!r}, n={n!r}")
    k, n = int(k), int(n)
    if n == 0:
        return {"k": 0, "n": 0, "rate": None, "ci": None}
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return {"k": k, "n": n, "rate": k / n, "ci": [float(ci.low), float(ci.high)]}


__all__ = ["eval_stats", "summarize", "mann_whitney", "mwu_method", "check_scipy", "rate_ci"]
