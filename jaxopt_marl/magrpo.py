"""PA-MAGRPO math (paper §3, §5.2, Algorithm 1): group-relative advantages, the PPO-clip surrogate, KL.

Everything here is a plain array function; the loop that calls them (sampling, scoring, per-agent
optimizer steps) lives in :mod:`jaxopt_marl.train_step`. Variants are registered by name, as Tunix does
(``tunix/rl/function_registry.py``), and chosen by a config string (:class:`MAGRPOConfig`):

============  ============================================================================================
kind          names
============  ============================================================================================
advantage     ``grpo`` (Algorithm 1 step 6: (R_k - mean) / std), ``group_mean`` (R_k - mean, no std)
policy_loss   ``ppo_clip`` (Algorithm 1 step 7)
kl            ``k3`` (default), ``k2``, ``k1`` (Schulman 2020, "Approximating KL divergence")
============  ============================================================================================

Conventions, each chosen against the paper's wording:

- *Standard deviation* (``std_ddof = 0``, population std). Algorithm 1 writes mu = (1/K) sum_k R_k and
  sigma = std_k R_k over the same K rollouts; the population std matches that 1/K normalisation, makes the
  advantages of a cohort exactly zero-mean with unit RMS, and is ``jnp.std``'s default.
  With the paper's small cohorts (K = 4 or 6) the sample std (ddof = 1) would shrink every advantage by
  sqrt((K-1)/K) (0.87 for K = 4), which only rescales the step; ``std_ddof = 1`` is available.
- *Zero spread*. A cohort whose returns are all equal (or whose std is below ``std_eps``) carries no
  learning signal -- the paper's Ablation A discussion ("the GRPO group standard deviation collapses, and
  updates carry no useful signal"). Such a cohort gets advantages of exactly ``0.0``: naive
  ``(R - mean(R)) / (std + eps)`` on returns like ``[0.1, 0.1, 0.1]`` leaves a float residue in
  ``R - mean`` that the tiny ``std`` would blow up, so the centred values are *selected* to zero rather
  than divided.
- *Ratio over the response* (sequence level). The paper's rho = pi(z | o) / pi_old(z | o) is a
  "per-decision importance ratio" of the option z. The option is the whole response, whose probability is
  the product of its token probabilities, so ``logp`` is the *sum* of the response tokens' log-probs and
  ``rho = exp(logp_new - logp_old)`` is one ratio per decision, clipped once. (A token-level ratio, as in
  DeepSeek's GRPO, would clip each token of ``state: ... choice: B`` separately and weight decisions by
  their token count.)
- *KL toward the reference* is estimated per decision on the same sequence-level log-probs, with the
  k3 estimator ``exp(ref - new) - (ref - new) - 1`` (GRPO, Shao et al. 2024, eq. 4): unbiased for
  KL(pi_theta || pi_ref) under samples of pi_theta, never negative, and exactly 0 where the adapter is
  the reference (B = 0 at initialisation).
- *Aggregation*. Each agent's loss is the mean over its own valid decisions (the paper's E[.] in
  L^i); padding decisions are masked out, and an agent with no decisions contributes exactly zero.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

# Returns whose cohort std is below this count as "no spread" (advantage exactly 0).
STD_EPS = 1e-6

# --------------------------------------------------------------------------------------------------
# Registry.
# --------------------------------------------------------------------------------------------------

KINDS = ("advantage", "policy_loss", "kl")
_REGISTRY: dict[str, dict[str, Callable]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn`` as variant ``name`` of ``kind`` (one of :data:`KINDS`).

    Raises:
        ValueError: unknown kind or a name already registered for that kind.
    """
    if kind not in _REGISTRY:
        raise ValueError(f"unknown registry kind {kind!r}; known: {KINDS}")

    def deco(fn: Callable) -> Callable:
        if name in _REGISTRY[kind]:
            raise ValueError(f"{kind} {name!r} is already registered")
        _REGISTRY[kind][name] = fn
        return fn

    return deco


def get(kind: str, name: str) -> Callable:
    """The function registered as ``name`` under ``kind``.

    Raises:
        ValueError: unknown kind or name (the message lists the known names).
    """
    if kind not in _REGISTRY:
        raise ValueError(f"unknown registry kind {kind!r}; known: {KINDS}")
    if name not in _REGISTRY[kind]:
        raise ValueError(f"unknown {kind} {name!r}; registered: {sorted(_REGISTRY[kind])}")
    return _REGISTRY[kind][name]


def names(kind: str) -> tuple[str, ...]:
    """Registered names of ``kind``, sorted.

    Raises:
        ValueError: unknown kind.
    """
    if kind not in _REGISTRY:
        raise ValueError(f"unknown registry kind {kind!r}; known: {KINDS}")
    return tuple(sorted(_REGISTRY[kind]))


# --------------------------------------------------------------------------------------------------
# Config.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MAGRPOConfig:
    """PA-MAGRPO update hyper-parameters (Algorithm 1 symbols in brackets; values from §6.1).

    Raises:
        ValueError: from ``__post_init__`` on an out-of-range value or an unregistered variant name.
    """

    # [K] joint rollouts per round (paper: 4 for Cleanup / Harvest, 6 for Overcooked).
    num_rollouts: int = 4
    # Sampling temperature of the rollouts (paper: 0.7, Overcooked 0.9), > 0; the update's log-probs are those of
    # the tempered distribution, and a run's policy reads the same value (jaxopt_marl.config.RunConfig).
    temperature: float = 0.7
    # [epsilon] PPO clip range (paper: 0.2).
    clip_eps: float = 0.2
    # [beta] KL weight toward the reference policy (paper: 0.05 for Overcooked; not stated for the others,
    # where we use the same value).
    kl_beta: float = 0.05
    # [E] PPO epochs over each agent's decisions per round (paper: two inner epochs).
    epochs: int = 2
    # Minibatches per epoch (1 = full batch; the decision axis must divide evenly). Each is one
    # optimizer step.
    num_minibatches: int = 1
    # Decisions per forward/backward pass inside a step (gradient accumulation; 0 = the whole
    # minibatch at once). Changes memory, not the math: the step still uses the minibatch's mean.
    micro_batch: int = 0
    # AdamW learning rate (paper: 5e-5 Cleanup / Harvest, 2e-5 Overcooked).
    learning_rate: float = 5e-5
    # AdamW decoupled weight decay (not stated in the paper; 0 makes AdamW plain Adam on the adapters).
    weight_decay: float = 0.0
    # Adam moments and epsilon (optax defaults).
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    # Per-agent global-norm gradient clip (paper: "gradient clipping at 1.0"); <= 0 disables it.
    max_grad_norm: float = 1.0
    # Optimizer by name: "adamw" (paper) or "sgd" (plain steps; used by tests to expose scaling).
    optimizer: str = "adamw"
    # Advantage estimator, policy loss and KL estimator by registered name.
    advantage: str = "grpo"
    policy_loss: str = "ppo_clip"
    kl_estimator: str = "k3"
    # Std convention of the "grpo" advantage: 0 = population (Algorithm 1), 1 = sample.
    std_ddof: int = 0
    # One adapter trained on every agent's decisions (Ablation B) instead of one per agent.
    shared_adapter: bool = False

    def __post_init__(self):
        if self.num_rollouts < 1 or self.epochs < 1 or self.num_minibatches < 1:
            raise ValueError(
                "num_rollouts, epochs and num_minibatches must be >= 1, got "
                f"{self.num_rollouts}, {self.epochs}, {self.num_minibatches}"
            )
        if not self.temperature > 0:  # the update divides the logits by it: T = 0 gives -inf log-probs
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 < self.clip_eps < 1.0:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.kl_beta < 0 or self.learning_rate <= 0 or self.weight_decay < 0:
            raise ValueError(
                "kl_beta and weight_decay must be >= 0 and learning_rate > 0, got "
                f"{self.kl_beta}, {self.weight_decay}, {self.learning_rate}"
            )
        if self.micro_batch < 0:
            raise ValueError(f"micro_batch must be >= 0, got {self.micro_batch}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        get("advantage", self.advantage)
        get("policy_loss", self.policy_loss)
        get("kl", self.kl_estimator)

    @property
    def steps_per_round(self) -> int:
        """Optimizer steps per round: E epochs x minibatches."""
        return self.epochs * self.num_minibatches

    @classmethod
    def paper(cls, game: str = "cleanup", **overrides) -> MAGRPOConfig:
        """§6.1 settings: Cleanup / Harvest (lr 5e-5, K 4, T 0.7) or Overcooked (lr 2e-5, K 6, T 0.9)."""
        from jaxopt_marl.config import PAPER, PAPER_UPDATE_KEYS  # the per-game values, declared once there

        if game not in PAPER:
            raise ValueError(f"unknown game {game!r}; known: {', '.join(PAPER)}")
        base = {k: PAPER[game][k] for k in PAPER_UPDATE_KEYS}
        return cls(**{**base, **overrides})

    @classmethod
    def smoke(cls, **overrides) -> MAGRPOConfig:
        """Tiny-model preset for tests: large learning rate so a few rounds move a random model."""
        return cls(**{**dict(learning_rate=1e-2, num_rollouts=8, temperature=1.0), **overrides})


# --------------------------------------------------------------------------------------------------
# Advantages.
# --------------------------------------------------------------------------------------------------


def _centred(returns: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(R - mean over the last axis, all-equal flag [...]) in float32."""
    r = jnp.asarray(returns, jnp.float32)
    centred = r - jnp.mean(r, axis=-1, keepdims=True)
    flat = jnp.max(r, axis=-1) == jnp.min(r, axis=-1)
    return centred, flat


@register("advantage", "grpo")
def group_relative_advantage(returns: jax.Array, *, ddof: int = 0, eps: float = STD_EPS) -> jax.Array:
    """Group-relative advantage A_k = (R_k - mean) / std within each cohort (Algorithm 1, step 6).

    A cohort with all-equal returns, or std < ``eps``, gets exactly 0.0 (see the module docstring).

    Args:
        returns: float[..., K] team returns of the K rollouts of each cohort.
        ddof: 0 = population std (default, Algorithm 1), 1 = sample std.
        eps: std below which a cohort counts as having no spread.

    Returns:
        float32[..., K] advantages, one per rollout, shared by every decision of that rollout.
    """
    centred, flat = _centred(returns)
    k = centred.shape[-1]
    var = jnp.sum(centred * centred, axis=-1, keepdims=True) / max(k - ddof, 1)
    std = jnp.sqrt(var)
    dead = flat[..., None] | (std < eps)
    return jnp.where(dead, 0.0, centred / jnp.where(dead, 1.0, std))


@register("advantage", "group_mean")
def group_mean_advantage(returns: jax.Array, *, ddof: int = 0, eps: float = STD_EPS) -> jax.Array:
    """Mean-centred returns R_k - mean (no std normalisation; exact 0 for all-equal cohorts).

    ``ddof`` is accepted for a uniform signature and ignored; spread below ``eps`` also gives 0.
    """
    del ddof
    centred, flat = _centred(returns)
    std = jnp.sqrt(jnp.mean(centred * centred, axis=-1, keepdims=True))
    return jnp.where(flat[..., None] | (std < eps), 0.0, centred)


def decision_advantages(rollout_advantages: jax.Array, rollout_ids: jax.Array) -> jax.Array:
    """Broadcasts per-rollout advantages float32[K] to decisions via int32[D] rollout ids."""
    return jnp.asarray(rollout_advantages, jnp.float32)[rollout_ids]


# --------------------------------------------------------------------------------------------------
# Policy loss and KL (per decision).
# --------------------------------------------------------------------------------------------------


@register("policy_loss", "ppo_clip")
def ppo_clip_loss(
    logp_new: jax.Array, logp_old: jax.Array, advantages: jax.Array, *, clip_eps: float
) -> tuple[jax.Array, jax.Array]:
    """PPO-clip surrogate per decision: -min(rho A, clip(rho, 1 - eps, 1 + eps) A).

    Args:
        logp_new: float32[D] log pi_theta(z | o), summed over the response tokens.
        logp_old: float32[D] the same under the round's rollout parameters theta_old.
        advantages: float32[D].
        clip_eps: epsilon.

    Returns:
        (loss float32[D], ratio float32[D]).
    """
    ratio = jnp.exp(logp_new - logp_old)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return -jnp.minimum(unclipped, clipped), ratio


@register("kl", "k3")
def kl_k3(logp_new: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """k3 estimate of KL(pi_theta || pi_ref): exp(ref - new) - (ref - new) - 1 (>= 0, 0 iff equal)."""
    d = logp_ref - logp_new
    return jnp.expm1(d) - d


@register("kl", "k2")
def kl_k2(logp_new: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """k2 estimate: (new - ref)^2 / 2 (biased, low variance)."""
    d = logp_new - logp_ref
    return 0.5 * d * d


@register("kl", "k1")
def kl_k1(logp_new: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """k1 estimate: new - ref (unbiased, can be negative)."""
    return logp_new - logp_ref


def masked_group_mean(
    values: jax.Array, groups: jax.Array, mask: jax.Array, num_groups: int, counts: jax.Array | None = None
) -> jax.Array:
    """Mean of ``values`` over the valid decisions of each group (agent); 0 for an empty group.

    Args:
        values: float[D].
        groups: int32[D] group (adapter) of each decision, in [0, num_groups).
        mask: bool[D] valid decisions.
        num_groups: N.
        counts: float32[N] denominators to use instead of this batch's counts -- the counts of the
            whole minibatch when ``values`` is one micro-batch of it, so that micro-batch results add
            up to the minibatch mean.

    Returns:
        float32[N].
    """
    onehot = (groups[:, None] == jnp.arange(num_groups)[None, :]) & mask[:, None]  # [D, N]
    w = onehot.astype(jnp.float32)
    total = jnp.einsum("dn,d->n", w, jnp.where(mask, values, 0.0).astype(jnp.float32))
    count = w.sum(axis=0) if counts is None else counts
    return total / jnp.maximum(count, 1.0)


def group_counts(groups: jax.Array, mask: jax.Array, num_groups: int) -> jax.Array:
    """Valid decisions per group, float32[N]."""
    onehot = (groups[:, None] == jnp.arange(num_groups)[None, :]) & mask.astype(bool)[:, None]
    return onehot.sum(axis=0).astype(jnp.float32)


def magrpo_loss(
    logp_new: jax.Array,
    logp_old: jax.Array,
    logp_ref: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    groups: jax.Array,
    num_groups: int,
    *,
    clip_eps: float,
    kl_beta: float,
    policy_loss: str = "ppo_clip",
    kl_estimator: str = "k3",
    counts: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The summed per-agent PA-MAGRPO loss sum_i L^i (Algorithm 1, step 7).

    L^i = mean over agent i's valid decisions of [policy term] + beta * mean of [KL term]. Summing over
    agents keeps the gradient of agent i's adapter equal to grad L^i, because agent i's adapter only
    enters agent i's decisions.

    Args:
        logp_new, logp_old, logp_ref: float32[D] sequence log-probs (response tokens summed).
        advantages: float32[D].
        mask: bool[D] valid (non-padding) decisions.
        groups: int32[D] adapter of each decision (the agent id, or 0 for a shared adapter).
        num_groups: N adapters.
        clip_eps, kl_beta: epsilon and beta.
        policy_loss, kl_estimator: registered names.
        counts: float32[N] per-agent denominators of the whole minibatch when these decisions are
            one micro-batch of it (gradient accumulation); default: this batch's own counts. With it,
            ``loss``, ``pg_loss``, ``kl``, ``clip_frac`` and ``ratio_mean`` add up over micro-batches.

    Returns:
        (scalar loss, metrics of float32[N] per adapter: ``loss``, ``pg_loss``, ``kl``, ``clip_frac``,
        ``ratio_mean``, ``ratio_min``, ``ratio_max``, ``count`` (valid decisions in this batch)).
    """
    mask = mask.astype(bool)
    # Padding rows may hold anything: zero them before exp so neither values nor gradients see NaN.
    logp_new = jnp.where(mask, logp_new, 0.0)
    logp_old = jnp.where(mask, logp_old, 0.0)
    logp_ref = jnp.where(mask, logp_ref, 0.0)
    advantages = jnp.where(mask, advantages, 0.0)
    pg, ratio = get("policy_loss", policy_loss)(logp_new, logp_old, advantages, clip_eps=clip_eps)
    kl = get("kl", kl_estimator)(logp_new, logp_ref)
    per_dec = pg + kl_beta * kl
    mean = functools.partial(masked_group_mean, groups=groups, mask=mask, num_groups=num_groups, counts=counts)
    per_agent = mean(per_dec)
    clipped = (jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32)
    onehot = (groups[:, None] == jnp.arange(num_groups)[None, :]) & mask[:, None]
    big = jnp.finfo(jnp.float32).max
    metrics = {
        "loss": per_agent,
        "pg_loss": mean(pg),
        "kl": mean(kl),
        "clip_frac": mean(clipped),
        "ratio_mean": mean(ratio),
        "ratio_min": jnp.min(jnp.where(onehot, ratio[:, None], big), axis=0),
        "ratio_max": jnp.max(jnp.where(onehot, ratio[:, None], -big), axis=0),
        "count": onehot.sum(axis=0).astype(jnp.float32),
    }
    return per_agent.sum(), jax.tree.map(jax.lax.stop_gradient, metrics)
