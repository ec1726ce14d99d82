"""The four random channels of one training run, each derived from the run seed here and nowhere else (paper §6.1).

Table 1 reports mean ± std over five independent training seeds; "a seed controls four channels: the interface
(library, phrasing, letter shuffles), the LoRA initialisation, rollout stochasticity, and minibatch order". Each
channel's draws come from the run seed ``s`` (:attr:`jaxopt_marl.config.RunConfig.seed`, an int >= 0) through one
function of this module, so two seeds differ in every channel and one seed reproduces every draw
(``tests/test_seeds.py``):

=============  ==========================================================  ========================================
channel        derivation                                                  read by
=============  ==========================================================  ========================================
interface      library draw: ``fold_in(PRNGKey(s), LIBRARY_FOLD)``         :func:`library_key` ->
               (uniform over the game's registered libraries, sorted by    :func:`jaxopt_marl.options.draw_library`
               name); letter shuffle: ``menus.decision_key(s, ep, aid,     (``--library auto``); the rollouts'
               d)`` = ``fold_in^3(PRNGKey(s), ep, aid, d)``; phrasing:     ``menu_seed`` (:func:`interface_seed`)
               one template per game today (no draw)
lora_init      ``nnx.Rngs(s)`` (the LoRA A matrices' uniform init; B = 0;  :func:`lora_init_seed` ->
               ``tiny-random``'s base weights too)                         :func:`jaxopt_marl.rollout.load_policy_model`
rollout        round r: ``split(fold_in(PRNGKey(s), r))[0]`` (sampling,    :func:`rollout_key`,
               env keys) and env seeds ``train_seeds(s, r, K)``; burn-in   :func:`jaxopt_marl.trainer.train_seeds`,
               ``fold_in(PRNGKey(s), ep)``; evaluation                     :func:`jaxopt_marl.evaluation.eval_key`
               ``fold_in(PRNGKey(s), 10**6)`` (held-out env seeds fixed)
minibatch      round r: ``split(fold_in(PRNGKey(s), r))[1]`` (the update   :func:`minibatch_key`
               key: minibatch order and dropout)
=============  ==========================================================  ========================================

These are the derivations the runs used before the channels were named (only the library draw is new, and with
one library per game it always draws ``canonical``), so every existing run directory, and every test's expected
output, is unchanged.
"""

from __future__ import annotations

import jax
import numpy as np

#: The channels a training seed controls (paper §6.1).
CHANNELS = ("interface", "lora_init", "rollout", "minibatch")
#: ``fold_in`` constant of the interface channel's library draw (ours; distinct from the round indices < 10**6
#: and the evaluation's 10**6).
LIBRARY_FOLD = 2 * 10**6
#: ``fold_in`` constant of the optional format warm-up's draws (``--format-warmup``, :mod:`jaxopt_marl.format_warmup`;
#: ours, not the paper's: distinct from the rounds < 10**6, the evaluation's 10**6 and :data:`LIBRARY_FOLD`).
FORMAT_WARMUP_FOLD = 3 * 10**6


def _check(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def interface_seed(seed: int) -> int:
    """The letter-shuffle seed of the rollouts' menus (``menu_seed``, :func:`jaxopt_marl.menus.decision_key`)."""
    return _check(seed)


def library_key(seed: int) -> jax.Array:
    """The key of the interface channel's option-library draw (``--library auto``): uint32[2]."""
    return jax.random.fold_in(jax.random.PRNGKey(_check(seed)), LIBRARY_FOLD)


def lora_init_seed(seed: int) -> int:
    """The ``nnx.Rngs`` seed of the model build, i.e. of the LoRA initialisation."""
    return _check(seed)


def round_key(seed: int, round_idx: int) -> jax.Array:
    """All randomness of training round ``round_idx``: ``fold_in(PRNGKey(seed), round_idx)``, uint32[2]."""
    return jax.random.fold_in(jax.random.PRNGKey(_check(seed)), round_idx)


def round_keys(seed: int, round_idx: int) -> tuple[jax.Array, jax.Array]:
    """``(rollout key, minibatch key)`` of round ``round_idx``: the two halves of ``split(round_key)``."""
    k_roll, k_upd = jax.random.split(round_key(seed, round_idx))
    return k_roll, k_upd


def rollout_key(seed: int, round_idx: int) -> jax.Array:
    """The rollout channel's key of round ``round_idx`` (sampling and env reset keys of its K rollouts)."""
    return round_keys(seed, round_idx)[0]


def minibatch_key(seed: int, round_idx: int) -> jax.Array:
    """The minibatch channel's key of round ``round_idx`` (the update's minibatch order)."""
    return round_keys(seed, round_idx)[1]


def format_warmup_key(seed: int) -> jax.Array:
    """The key of the optional format warm-up (:mod:`jaxopt_marl.format_warmup`): ``fold_in(PRNGKey(seed),
    FORMAT_WARMUP_FOLD)``, uint32[2]. Its frozen-base episodes sample and reset with it; its row and letter draws
    use a NumPy generator seeded with its two words. Not one of the paper's four channels: the warm-up is ours."""
    return jax.random.fold_in(jax.random.PRNGKey(_check(seed)), FORMAT_WARMUP_FOLD)


def channel_values(seed: int, round_idx: int = 0) -> dict[str, object]:
    """One concrete value per channel (what two seeds are compared on): the interface channel's library-draw key
    and letter-shuffle key of (episode 0, agent 0, decision 0), the LoRA init seed, and round ``round_idx``'s
    rollout and minibatch keys; every value a numpy array or int."""
    from jaxopt_marl import menus

    return {
        "interface": np.concatenate(
            [np.asarray(library_key(seed)), np.asarray(menus.decision_key(interface_seed(seed), 0, 0, 0))]
        ),
        "lora_init": lora_init_seed(seed),
        "rollout": np.asarray(rollout_key(seed, round_idx)),
        "minibatch": np.asarray(minibatch_key(seed, round_idx)),
    }


__all__ = [
    "CHANNELS",
    "FORMAT_WARMUP_FOLD",
    "LIBRARY_FOLD",
    "channel_values",
    "format_warmup_key",
    "interface_seed",
    "library_key",
    "lora_init_seed",
    "minibatch_key",
    "round_key",
    "round_keys",
    "rollout_key",
]
