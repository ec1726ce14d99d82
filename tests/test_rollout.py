"""Rollouts with a tiny random decoder: every decision traced, parse failures counted (never a crash),
choice_only scoring, the frozen-base mode, the idle fallback, per-step trajectories, idled agents (solo test)."""

import jax
import numpy as np
import pytest

from jaxopt_marl import rollout
from tests.helpers import tiny_roller

GAME = "overcooked_aa"
STEPS = 8


@pytest.fixture(scope="module")
def roller():
    return tiny_roller(GAME, STEPS, rollout.PolicyConfig(mode="sample", temperature=1.0, max_new_tokens=6))


def _check(res, k, n=2):
    assert res.returns.shape == (k,)
    assert res.num_decisions == len(res.decisions) == res.parse.total > 0
    for key in (
        "round",
        "rollout",
        "seed",
        "step",
        "aid",
        "prompt",
        "menu",
        "response",
        "choice",
        "parse",
        "parse_fail",
        "option",
        "target",
        "outcome",
    ):
        assert key in res.traces[0]
    assert all(t["outcome"] != "running" for t in res.traces)
    assert res.traj["positions"].shape == (k, STEPS, n, 2) and res.traj["positions"].dtype == np.int32
    assert res.traj["rewards"].shape == (k, STEPS, n) and res.traj["alive"].all()
    assert (res.traj["positions"] >= 0).all()  # every step recorded


def test_sample_mode_counts_parse_failures(roller):
    res = roller.collect([1, 2], jax.random.PRNGKey(0), round_idx=3)
    _check(res, 2)
    # A random decoder writes garbage: failures are counted and the agent waits.
    assert res.parse.failures > 0 and 0 < res.parse.failure_rate <= 1
    failed = [t for t in res.traces if t["parse_fail"]]
    assert all(t["option"] == "wait" and t["choice"] is None for t in failed)
    assert {t["round"] for t in res.traces} == {3} and {t["seed"] for t in res.traces} == {1, 2}
    # Tokens for training: system + user prompt, then the sampled response.
    b, a, d = res.decisions[0]
    assert d.prompt_ids[: len(roller.policy.prefix_ids)] == roller.policy.prefix_ids
    assert 1 <= len(d.response_ids) <= 6


def test_idle_fallback_without_wait_option(roller):
    wait_id = roller.wait_id
    roller.wait_id = -1  # a library without ``wait``: failed agents idle one step instead
    try:
        res = roller.collect([5, 6], jax.random.PRNGKey(1))
    finally:
        roller.wait_id = wait_id
    _check(res, 2)
    assert any(t["option"] == "idle" for t in res.traces)


def test_choice_only_and_reference(roller):
    pol = roller.policy
    old = pol.cfg
    pol.cfg = rollout.PolicyConfig(mode="choice_only", temperature=1.0)
    try:
        res = roller.collect([1, 2], jax.random.PRNGKey(0))
        ref = roller.collect([1, 2], jax.random.PRNGKey(0), reference=True)
    finally:
        pol.cfg = old
    _check(res, 2)
    assert res.parse.failures == 0
    assert all(t["response"].startswith("state: ") and "\nchoice: " in t["response"] for t in res.traces)
    assert all(len(d.response_ids) == 1 for _, _, d in res.decisions)
    # Fresh adapters (B = 0) are the reference policy: the same key plays the same episodes.
    assert [t["choice"] for t in res.traces] == [t["choice"] for t in ref.traces]
    assert all(t["reference"] for t in ref.traces)


def test_idled_agent_only_waits_and_is_not_traced(roller):
    """Solo test (paper §6.4): with ``active=[True, False]`` agent 1 never asks the LLM and runs only ``wait``."""
    res = roller.collect([3, 4], jax.random.PRNGKey(2), active=np.array([True, False]))
    _check(res, 2)
    assert {t["aid"] for t in res.traces} == {0}
    assert all(a == 0 for _, a, _ in res.decisions)
    idle_opts = set(np.unique(res.traj["options"][:, :, 1]).tolist())
    assert roller.wait_id >= 0 and idle_opts <= {roller.wait_id, -1} and roller.wait_id in idle_opts
    # the active agent asked the LLM at each of its decision points (_check: traced decisions > 0)
    assert all(t["response"] is not None for t in res.traces)
    with pytest.raises(ValueError, match="active must be bool"):
        roller.collect([3], jax.random.PRNGKey(2), active=np.array([True]))


def test_policy_config_validation():
    with pytest.raises(ValueError, match="unknown scoring mode"):
        rollout.PolicyConfig(mode="beam")


def test_sample_mode_trace_logp_is_tempered(roller):
    """Issue #13 item 5: a sampled response's trace ``logp`` is its log-prob at the rollout temperature, as the
    update scores it (``choice_only`` records the tempered one too), not the untempered sum."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxopt_marl import train_step as ts

    pol = roller.policy
    old = pol.cfg
    pol.cfg = rollout.PolicyConfig(mode="sample", temperature=0.5, max_new_tokens=6)
    try:
        res = roller.collect([1], jax.random.PRNGKey(0))
    finally:
        pol.cfg = old
    ds = [d for _, _, d in res.decisions]
    batch = ts.pack_decisions(
        [d.prompt_ids for d in ds],
        [d.response_ids for d in ds],
        [a for _, a, _ in res.decisions],
        [0.0] * len(ds),
        pad_id=pol.pad_id,
        response_len=6,
    )
    score = jax.jit(
        lambda st, t: ts.sequence_logprobs(
            nnx.merge(pol.graphdef, st), batch, jnp.asarray(batch.agent_ids), temperature=t
        )
    )
    tempered, plain = np.asarray(score(pol.state, 0.5)), np.asarray(score(pol.state, 1.0))
    logp = np.array([d.logp for d in ds])
    np.testing.assert_allclose(logp, tempered, rtol=1e-4, atol=1e-4)
    assert np.abs(logp - plain).max() > 1.0  # the untempered sum is far off
    assert all(t["logp"] == d.logp for t, d in zip(res.traces, ds))
