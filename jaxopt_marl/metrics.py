"""Episode metrics of the social-dilemma literature (spec ``environments.md`` §4), from unshaped rewards.

All functions take host (NumPy) arrays of one or more episodes and return float64 values.
Conventions for the undefined cases are stated on each function.
"""

from __future__ import annotations

import numpy as np


def efficiency(rewards: np.ndarray) -> np.ndarray:
    """Utilitarian efficiency U = (sum_i R_i) / T, the collective return per step.

    Args:
        rewards: float[..., T, N] per-step individual rewards (apples).

    Returns:
        float64[...] collective return per step.
    """
    r = np.asarray(rewards, dtype=np.float64)
    return r.sum(axis=(-2, -1)) / r.shape[-2]


def equality(rewards: np.ndarray) -> np.ndarray:
    """Equality E = 1 - Gini over the agents' episode returns.

    Gini G = sum_i sum_j |R_i - R_j| / (2 N sum_i R_i). Convention: E = 1 when sum_i R_i = 0
    (nobody got anything, so nobody got more than anybody else).

    Args:
        rewards: float[..., T, N] per-step individual rewards.

    Returns:
        float64[...] in [0, 1].
    """
    returns = np.asarray(rewards, dtype=np.float64).sum(axis=-2)  # [..., N]
    n = returns.shape[-1]
    total = returns.sum(axis=-1)
    diffs = np.abs(returns[..., :, None] - returns[..., None, :]).sum(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        gini = np.where(total > 0, diffs / (2 * n * np.where(total > 0, total, 1.0)), 0.0)
    return 1.0 - gini


def sustainability(rewards: np.ndarray) -> np.ndarray:
    """Sustainability S = mean over rewarded agents of the mean 1-based step of their positive rewards.

    Convention: agents with no positive reward are excluded; S = NaN when no agent was rewarded.

    Args:
        rewards: float[..., T, N] per-step individual rewards.

    Returns:
        float64[...] in steps.
    """
    r = np.asarray(rewards, dtype=np.float64)
    t = np.arange(1, r.shape[-2] + 1, dtype=np.float64)[:, None]
    pos = r > 0
    count = pos.sum(axis=-2)  # [..., N]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_t = (pos * t).sum(axis=-2) / count
        rewarded = count > 0
        return np.where(
            rewarded.any(axis=-1), np.nansum(np.where(rewarded, mean_t, 0.0), axis=-1) / rewarded.sum(axis=-1), np.nan
        )


def peace(alive: np.ndarray) -> np.ndarray:
    """Peace P = (N T - sum_i sum_t removed_i,t) / T: the mean number of agents in play per step.

    Args:
        alive: bool/int[..., T, N], 1 where the agent is in play (not removed by a zap) at step t.

    Returns:
        float64[...] in [0, N] agents.
    """
    a = np.asarray(alive, dtype=np.float64)
    return a.sum(axis=(-2, -1)) / a.shape[-2]
