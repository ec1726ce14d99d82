"""The jitted PA-MAGRPO update on tiny random decoders: exact first-step ratio / KL, per-agent isolation
and clipping, shared adapter, 8-device mesh parity, and a tiny task that the update learns."""

import json
import os
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxopt_marl import magrpo
from jaxopt_marl import progress as progress_lib
from jaxopt_marl import train_step as ts
from lora import Decoder, LoRAConfig, ModelConfig, sampling, split_model
from tests.background import BACKGROUND
from tests.helpers import CountingBar, assert_fp32_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 64
_TINY = ModelConfig.tiny(vocab_size=VOCAB)
#: Float32 roundings on the path of one response's log-prob through the tiny decoder (tests.helpers.fp32_atol):
#: per layer the q/k/v, attention-output, MLP-in and MLP-out reductions (hidden and intermediate sizes), the
#: attention scores and mix (head dim, up to 16 positions) and two RMS norms (hidden size); then the final norm,
#: the logit (hidden size), the log-softmax (a max, a log of a sum of terms <= 1: a few roundings of |log-prob|
#: size) and the sum over the response tokens (3).
N_LOGP = _TINY.num_layers * (4 * _TINY.hidden_size + 2 * _TINY.intermediate_size + _TINY.head_dim + 16) + (
    2 * _TINY.hidden_size + 4 + 3
)
#: ... of one gradient component: the forward path, the backward path through it again, and the sum over the
#: rows of a batch (up to 16 here).
N_GRAD = 2 * N_LOGP + 16


def _model(n_adapters, seed=0):
    return Decoder(
        ModelConfig.tiny(vocab_size=VOCAB), LoRAConfig(num_adapters=n_adapters, rank=4, alpha=8.0), rngs=nnx.Rngs(seed)
    )


def _random_batch(agent_ids, advantages, seed=0, pad_to_multiple=8):
    rng = np.random.RandomState(seed)
    d = len(agent_ids)
    prompts = [list(rng.randint(1, VOCAB, rng.randint(3, 7))) for _ in range(d)]
    responses = [list(rng.randint(1, VOCAB, rng.randint(1, 4))) for _ in range(d)]
    return ts.pack_decisions(
        prompts, responses, agent_ids, advantages, prompt_len=6, response_len=3, pad_to_multiple=pad_to_multiple
    )


def _slice(adapters, agent):
    """Every adapter leaf's slice of one agent, as NumPy (agent axis third from the end)."""
    return [np.take(np.asarray(x), agent, axis=x.ndim - 3) for x in jax.tree.leaves(adapters)]


def _randomise_b(adapters, seed=3):
    """Non-zero B so adapters change outputs (a 'later round')."""
    leaves, treedef = jax.tree.flatten(adapters)
    key = jax.random.key(seed)
    out = []
    for leaf in leaves:
        key, sub = jax.random.split(key)
        out.append(leaf + 0.05 * jax.random.normal(sub, leaf.shape))
    return jax.tree.unflatten(treedef, out)


def _theta_old(step, base, adapters, batch):
    """theta_old's log-probs float32[D] through the scoring program (what ``prepare`` fills with several
    minibatches; with one, the update takes them from its first step)."""
    return step.score(base, adapters, batch, jnp.asarray(step.adapter_ids(batch.agent_ids)))


@pytest.fixture(scope="module")
def three_agents():
    """A 3-adapter model and its AdamW train step on one CPU device."""
    graphdef, adapters, base = split_model(_model(3))
    cfg = magrpo.MAGRPOConfig.smoke(kl_beta=0.1)
    step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=3)
    return step, graphdef, adapters, base


def test_pack_decisions_layout():
    b = ts.pack_decisions(
        [[5, 6], [7]], [[9], [10, 11]], [1, 0], [0.5, -0.5], prompt_len=3, response_len=2, pad_to_multiple=4
    )
    np.testing.assert_array_equal(b.tokens, [[0, 5, 6, 9, 0], [0, 0, 7, 10, 11], [0] * 5, [0] * 5])
    np.testing.assert_array_equal(b.attention_mask[:2], [[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(b.response_mask[:2], [[0, 0, 0, 1, 0], [0, 0, 0, 1, 1]])
    np.testing.assert_array_equal(b.valid, [1, 1, 0, 0])
    np.testing.assert_array_equal(b.agent_ids, [1, 0, 0, 0])
    assert b.response_len == 2 and b.num_decisions == 4
    with pytest.raises(ValueError, match="exceeds"):
        ts.pack_decisions([[1, 2, 3]], [[4]], [0], [0.0], prompt_len=2)


def test_score_matches_eager_continuation_logprobs(three_agents):
    step, graphdef, adapters, base = three_agents
    adapters = _randomise_b(adapters)
    batch = _random_batch([0, 1, 2, 1, 0, 2], [1.0] * 6)
    got = step.score(base, adapters, batch, jnp.asarray(batch.agent_ids))
    model = nnx.merge(graphdef, adapters, base)
    tr = batch.response_len
    ref = sampling.continuation_logprobs(
        model,
        batch.tokens[:, :-tr],
        batch.attention_mask[:, :-tr],
        batch.tokens[:, -tr:],
        batch.response_mask[:, -tr:],
        agent_ids=jnp.asarray(batch.agent_ids),
    ).sum(1)
    assert_fp32_close(got, ref, N_LOGP)  # two programs: the jitted scoring and the eager forward


def test_ratio_exactly_one_and_kl_zero_at_init(three_agents):
    step, graphdef, adapters, base = three_agents
    batch = _random_batch([0, 1, 2, 0, 1, 2, 0], [1.0, -1.0, 0.5, -0.5, 2.0, 0.0, 1.0])
    batch = step.prepare(base, adapters, batch)
    # Fresh adapters (B = 0) are the reference policy bit for bit, through the real scoring path.
    np.testing.assert_array_equal(_theta_old(step, base, adapters, batch), batch.logp_ref)
    opt = ts.init_opt_state(step, adapters)
    new, _, m = step.update(base, adapters, opt, batch, jax.random.key(0))
    # Step 0 (= the whole first epoch with one minibatch): rho == 1 exactly (theta_old's log-probs are
    # that step's own forward) and KL == 0 up to float32 rounding between the update's forward and the
    # reference scoring program (k3 ~ delta^2 / 2 with |delta| ~ 1e-6: below 1e-10).
    np.testing.assert_array_equal(m["ratio_min"][0], [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(m["ratio_max"][0], [1.0, 1.0, 1.0])
    np.testing.assert_array_less(m["kl"][0], 1e-10)
    np.testing.assert_array_equal(m["clip_frac"][0], [0.0, 0.0, 0.0])
    # The second epoch is off-policy: ratios move and the KL is positive.
    assert np.all(np.asarray(m["ratio_max"][1]) - np.asarray(m["ratio_min"][1]) > 0)
    assert np.all(np.asarray(m["kl"][1]) > 0)
    # A later round: new theta_old, rescored -> rho == 1 again at its first step, KL now > 0.
    batch2 = step.prepare(base, new, batch)
    _, _, m2 = step.update(base, new, ts.init_opt_state(step, new), batch2, jax.random.key(1))
    np.testing.assert_array_equal(m2["ratio_min"][0], [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(m2["ratio_max"][0], [1.0, 1.0, 1.0])
    assert np.all(np.asarray(m2["kl"][0]) > 0)


def test_one_minibatch_takes_theta_old_from_its_first_step(three_agents):
    """With one minibatch, prepare scores only the reference and the update's first forward is theta_old."""
    step, graphdef, adapters, base = three_agents  # 2 epochs, one minibatch
    adapters = _randomise_b(adapters)
    host = _random_batch([0, 1, 2, 0, 1, 2, 0], [1.0, -1.0, 0.5, -0.5, 2.0, 0.0, 1.0], seed=7)
    batch = step.prepare(base, adapters, host)
    np.testing.assert_array_equal(batch.logp_old, np.zeros(8, np.float32))  # not scored
    np.testing.assert_array_equal(batch.logp_ref, step.score(base, adapters, batch, jnp.full((8,), -1)))
    opt, key = ts.init_opt_state(step, adapters), jax.random.key(0)
    new, _, m = step.update(base, adapters, opt, batch, key)
    # batch.logp_old is not read: any value there gives the same update, bit for bit.
    new2, _, m2 = step.update(base, adapters, opt, batch.replace(logp_old=batch.logp_old + 123.0), key)
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(new2)):
        np.testing.assert_array_equal(a, b)
    for k in m:
        np.testing.assert_array_equal(m[k], m2[k], err_msg=k)
    # The second epoch's ratios are exp(logp under theta_1 - logp under theta_0), per decision, with
    # both scored independently here (theta_1: the adapters after a one-epoch update).
    one = ts.make_train_step(
        graphdef, magrpo.MAGRPOConfig.smoke(kl_beta=0.1, epochs=1), ts.make_mesh(1), num_adapters=3
    )
    theta1, _, _ = one.update(base, adapters, opt, batch, key)
    lp1, lp0 = np.asarray(_theta_old(step, base, theta1, batch)), np.asarray(_theta_old(step, base, adapters, batch))
    ratio = np.exp(lp1 - lp0)
    agents, valid = np.asarray(batch.agent_ids), np.asarray(batch.valid)
    # Both log-probs come from another program than the update's forward: each is off by a log-prob's float32
    # error (scale: the largest |log-prob|), and exp turns a log-prob error d into a ratio error ratio * d.
    scale = 2 * np.abs(np.concatenate([lp1[valid], lp0[valid]])).max() * ratio[valid].max()
    for i in range(3):
        rows = valid & (agents == i)
        for stat, want in (("ratio_min", ratio[rows].min()), ("ratio_max", ratio[rows].max())):
            assert_fp32_close(m[stat][1][i], want, N_LOGP, scale=scale, err_msg=f"{stat}[{i}]")
        assert_fp32_close(m["ratio_mean"][1][i], ratio[rows].mean(), N_LOGP + 16, scale=scale, err_msg=f"mean[{i}]")
    assert np.all(np.abs(ratio[valid] - 1.0) > 1e-4)  # the adapters moved: a real check


def test_update_on_one_agent_leaves_other_adapters_bit_identical(three_agents):
    step, graphdef, adapters, base = three_agents
    opt = ts.init_opt_state(step, adapters)
    # Round 1 trains every agent, so each has non-zero Adam moments afterwards.
    b1 = step.prepare(base, adapters, _random_batch([0, 1, 2, 0, 1, 2], [1, -1, 1, -1, 1, -1]))
    adapters, opt, _ = step.update(base, adapters, opt, b1, jax.random.key(0))
    # Round 2 holds only agent 1's decisions: agents 0 and 2 must not move (not even by momentum).
    b2 = step.prepare(base, adapters, _random_batch([1, 1, 1, 1], [1.0, -1.0, 0.5, -0.5], seed=1))
    new, new_opt, m = step.update(base, adapters, opt, b2, jax.random.key(1))
    for agent in (0, 2):
        for a, b in zip(_slice(adapters, agent), _slice(new, agent)):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(_slice(opt[1][0].mu, agent), _slice(new_opt[1][0].mu, agent)):
            np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(_slice(adapters, 1), _slice(new, 1)))
    np.testing.assert_array_equal(m["updated"], [[0, 1, 0]] * 2)


def test_clip_by_agent_global_norm_transform():
    g = {
        "a": jnp.stack([jnp.full((2, 3, 4), 10.0), jnp.full((2, 3, 4), 0.01)], axis=1)[None],
        "b": jnp.stack([jnp.full((2, 4, 5), 10.0), jnp.full((2, 4, 5), 0.01)], axis=1)[None],
    }
    # Leaves are [1, 2(layers), N=2, in, out]: the agent axis is third from the end.
    g = jax.tree.map(lambda x: x[0], g)
    norms = np.asarray(ts.agent_global_norms(g))
    # Each agent's norm is its own float32 sum of 64 squares (then a square root, and for the clipped one a
    # scaling): compared per agent against the exact value, scale = that norm.
    for got, want in zip(norms, [10 * np.sqrt(64), 0.01 * np.sqrt(64)]):
        assert_fp32_close(got, want, 64)
    clipped, _ = ts.clip_by_agent_global_norm(1.0).update(g, optax.EmptyState())
    for got, want in zip(np.asarray(ts.agent_global_norms(clipped)), [1.0, norms[1]]):
        assert_fp32_close(got, want, 2 * 64)
    for leaf, orig in zip(jax.tree.leaves(clipped), jax.tree.leaves(g)):
        np.testing.assert_array_equal(leaf[:, 1], orig[:, 1])  # agent 1 untouched, bit for bit
    # Global clipping would have shrunk agent 1 by the same factor as agent 0.
    glob, _ = optax.clip_by_global_norm(1.0).update(g, optax.clip_by_global_norm(1.0).init(g))
    assert np.asarray(ts.agent_global_norms(glob))[1] < 0.1 * norms[1]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_per_agent_clipping_end_to_end(optimizer):
    graphdef, adapters, base = split_model(_model(2, seed=1))
    adapters = _randomise_b(adapters)
    cfg = magrpo.MAGRPOConfig(learning_rate=1e-2, optimizer=optimizer, max_grad_norm=1.0, kl_beta=0.0)
    step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=2)
    agents = [0, 1, 0, 1, 0, 1]
    # Agent 0: huge advantages (its gradient norm is far above 1.0); agent 1: small ones.
    batch = step.prepare(base, adapters, _random_batch(agents, [500, 0.01, -500, -0.02, 500, 0.01]))
    alone = batch.replace(valid=batch.valid & (batch.agent_ids == 1))
    opt = step.optimizer.init(adapters)
    joint, _, mj = step.update(base, adapters, opt, batch, jax.random.key(0))
    solo, _, ms = step.update(base, adapters, opt, alone, jax.random.key(0))
    assert mj["grad_norm"][0, 0] > 10 and mj["grad_norm"][0, 1] < 1.0
    # Agent 1's rows alone vs among agent 0's: the same sums in another order, over 2 steps (epochs), each
    # adding lr * (a gradient's rounding) to adapters of magnitude max |x|.
    for a, b in zip(_slice(joint, 1), _slice(solo, 1)):
        assert_fp32_close(a, b, N_GRAD, scale=np.abs(b).max(), k=2 * 8.0)
    assert any(not np.allclose(a, b) for a, b in zip(_slice(adapters, 1), _slice(joint, 1)))
    np.testing.assert_array_equal(ms["updated"][:, 0], [0, 0])


def test_micro_batch_accumulation_matches_one_pass():
    graphdef, adapters, base = split_model(_model(3, seed=4))
    agents = [0, 1, 2, 1, 1, 0, 2, 2, 1, 0, 1, 2, 0]
    host = _random_batch(agents, np.linspace(-1.5, 1.5, len(agents)), seed=5, pad_to_multiple=16)
    out = []
    for micro in (0, 4):
        # SGD: the step is linear in the gradient, so this compares the accumulated gradients themselves.
        # (Adam's first step divides each component by its own magnitude, so a near-zero component's float
        # rounding under another summation order can flip its sign: not what this test is about.)
        cfg = magrpo.MAGRPOConfig.smoke(micro_batch=micro, kl_beta=0.1, optimizer="sgd")
        step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=3)
        batch = step.prepare(base, adapters, host)
        out.append(step.update(base, adapters, step.optimizer.init(adapters), batch, jax.random.key(0)))
    (a0, _, m0), (a1, _, m1) = out
    lp = np.abs(np.asarray(batch.logp_ref)).max()  # the largest |log-prob sum| behind the ratios and the KL
    # The same sums in another order (4 micro-batches vs one pass): an element is off by the float32 error of
    # its sums, whose scale is the magnitude of the summed terms, not of the result. The advantages here are
    # symmetric (-1.5 .. 1.5), so the decisions' gradient terms largely cancel and a small element carries the
    # absolute error of large terms (issue 13: an element 1.29e-4 off relative, 6.7e-6 absolute). The terms'
    # magnitude: the same update with every advantage made positive (|A|: no cancellation between decisions;
    # the same shapes, so no new compile), as a step from the fresh adapters; plus the adapters' own |x| (the
    # step's addition). The update chains 2 steps (epochs), the second from the first's adapters: k = 2 * 8.
    a_abs, _, _ = step.update(
        base,
        adapters,
        step.optimizer.init(adapters),
        batch.replace(advantages=jnp.abs(batch.advantages)),
        jax.random.key(0),
    )
    for x, y, x0, xa in zip(*(jax.tree.leaves(t) for t in (a0, a1, adapters, a_abs))):
        x, y, x0, xa = (np.asarray(v, np.float64) for v in (x, y, x0, xa))
        scale = np.abs(y).max() + np.abs(xa - x0).max()
        assert_fp32_close(x, y, N_GRAD, scale=scale, k=2 * 8.0)
    for k in m0:
        # Per-step metrics (losses, ratios, KL, norms, counts): each is a function of log-prob differences, so
        # it carries their error (scale: the largest |log-prob sum|) times its own magnitude (at least 1).
        scale = lp * max(1.0, np.abs(np.asarray(m1[k])).max())
        assert_fp32_close(m0[k], m1[k], N_GRAD, scale=scale, k=2 * 8.0, err_msg=k)
    np.testing.assert_array_equal(m1["ratio_min"][0], [1.0, 1.0, 1.0])
    np.testing.assert_array_less(m1["kl"][0], 1e-10)  # 0 up to rounding (see above)


def test_shared_adapter_mode():
    graphdef, adapters, base = split_model(_model(1))
    cfg = magrpo.MAGRPOConfig.smoke(shared_adapter=True)
    with pytest.raises(ValueError, match="one adapter"):
        ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=3)
    step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=1)
    np.testing.assert_array_equal(step.adapter_ids(np.array([0, 2, 1])), [0, 0, 0])
    batch = step.prepare(base, adapters, _random_batch([0, 1, 2, 0, 1, 2], [1, -1, 1, -1, 0.5, 0]))
    np.testing.assert_array_equal(_theta_old(step, base, adapters, batch), batch.logp_ref)
    new, _, m = step.update(base, adapters, step.optimizer.init(adapters), batch, jax.random.key(0))
    assert m["loss"].shape == (2, 1)
    np.testing.assert_array_equal(m["count"][:, 0], [6, 6])  # every agent's decisions, one adapter
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(adapters), jax.tree.leaves(new)))


_MESH_SCRIPT = textwrap.dedent("""
    import json, os, jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from jaxopt_marl import magrpo, train_step as ts
    from lora import Decoder, LoRAConfig, ModelConfig, split_model
    assert len(jax.devices()) == 8, jax.devices()
    graphdef, adapters0, base0 = split_model(Decoder(
        ModelConfig.tiny(vocab_size=64), LoRAConfig(num_adapters=2, rank=4, alpha=8.0),
        rngs=nnx.Rngs(0)))
    rng = np.random.RandomState(0)
    d = 13
    prompts = [list(rng.randint(1, 64, rng.randint(3, 7))) for _ in range(d)]
    responses = [list(rng.randint(1, 64, rng.randint(1, 4))) for _ in range(d)]
    adv = magrpo.decision_advantages(magrpo.group_relative_advantage(jnp.array([1., 0., 3., 2.])),
                                     jnp.asarray(rng.randint(0, 4, d)))
    host = ts.pack_decisions(prompts, responses, rng.randint(0, 2, d), np.asarray(adv),
                             prompt_len=6, response_len=3, pad_to_multiple=32)
    # MINIBATCHES = 2: minibatches of 16, each accumulated over 2 micro-batches of 8 (one decision per
    # device); 1: one of 32 (theta_old's log-probs then come from the update's first step).
    minibatches = int(os.environ["MINIBATCHES"])
    cfg = magrpo.MAGRPOConfig.smoke(num_minibatches=minibatches, micro_batch=8, kl_beta=0.1)
    out = {}
    for n in (1, 8):
        mesh = ts.make_mesh(n)
        step = ts.make_train_step(graphdef, cfg, mesh, num_adapters=2)
        base, adapters = ts.replicate(base0, mesh), ts.replicate(adapters0, mesh)
        batch = step.prepare(base, adapters, ts.shard_batch(host, mesh))
        opt = ts.init_opt_state(step, adapters)
        for r in range(2):
            adapters, opt, m = step.update(base, adapters, opt, batch, jax.random.key(r))
            batch = step.prepare(base, adapters, batch)
        out[n] = dict(devices=len(batch.tokens.sharding.device_set),
                      adapters=[np.asarray(x).ravel().tolist() for x in jax.tree.leaves(adapters)],
                      loss=np.asarray(m["loss"]).tolist(), logp=np.asarray(batch.logp_ref).tolist(),
                      old=np.asarray(step.score(base, adapters, batch, batch.agent_ids)).tolist())
    print("RESULT" + json.dumps(out))
""")


for _mb in (2, 1):
    # Played in a subprocess with 8 virtual CPU devices, in the background from collection on (tests/conftest.py).
    BACKGROUND.register(
        f"mesh-{_mb}",
        ["-c", _MESH_SCRIPT],
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "MINIBATCHES": str(_mb), "JAX_PLATFORMS": "cpu"},
    )


@pytest.mark.parametrize("minibatches", [2, 1])
@pytest.mark.background("mesh-{minibatches}")
def test_eight_device_mesh_matches_one_device(minibatches):
    proc = BACKGROUND.get(f"mesh-{minibatches}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    out = json.loads(line[len("RESULT") :])
    one, eight = out["1"], out["8"]
    assert one["devices"] == 1 and eight["devices"] == 8
    # Reductions split over 8 devices round differently. The reference log-probs (base model, no update) differ
    # by a forward's float32 error alone.
    assert_fp32_close(one["logp"], eight["logp"], N_LOGP, err_msg="logp_ref")
    # What the updated adapters feed is not bounded by float32 error alone: Adam divides each component by its
    # own running RMS, so a rounding difference e in a gradient component g moves its step by about lr * e / |g|,
    # ~1e-6 of lr = 1e-2 after 8 steps for the components here. Hence atol 1e-5 (1e-3 lr) on the adapters;
    # what they score (loss, log-probs) is held to a forward's float32 error chained over the 8 steps
    # (2 rounds x 2 epochs x 2 minibatches: k = 8 * 8).
    for a, b in zip(one["adapters"], eight["adapters"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert_fp32_close(one["loss"], eight["loss"], N_GRAD, scale=max(1.0, np.abs(eight["loss"]).max()), k=8 * 8.0)
    assert_fp32_close(one["old"], eight["old"], N_LOGP, k=8 * 8.0, err_msg="logp after the update")
    # The update did something (otherwise parity would be trivial).
    graphdef, adapters0, _ = split_model(_model(2))
    assert not np.allclose(
        np.concatenate(one["adapters"]), np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(adapters0)])
    )


_ORDERED_SCRIPT = textwrap.dedent("""
    import json, jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from jaxopt_marl import magrpo, progress as progress_lib, train_step as ts
    from lora import Decoder, LoRAConfig, ModelConfig, split_model
    DEV, MICRO, ROWS = 4, 8, 32
    assert len(jax.devices()) == DEV, jax.devices()
    graphdef, adapters, base = split_model(Decoder(
        ModelConfig.tiny(vocab_size=64), LoRAConfig(num_adapters=2, rank=4, alpha=8.0), rngs=nnx.Rngs(1)))
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    adapters = jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    rng = np.random.RandomState(0)
    prefix = [7, 3, 11, 5, 2, 9, 4]
    # 21 decisions padded to 32 rows, micro-batches of 8 (2 rows per device): in the third micro-batch device 2
    # holds one real row and device 3 padding only (skipped there alone); the fourth is padding everywhere.
    d = 21
    prompts = [prefix + list(rng.randint(1, 64, rng.randint(3, 7))) for _ in range(d)]
    responses = [list(rng.randint(1, 64, rng.randint(1, 4))) for _ in range(d)]
    host = ts.pack_decisions(prompts, responses, rng.randint(0, 2, d), rng.randn(d).astype(np.float32),
                             prompt_len=6, response_len=3, pad_to_multiple=ROWS, prefix=prefix)
    cfg = magrpo.MAGRPOConfig.smoke(micro_batch=MICRO, kl_beta=0.1)
    mesh = ts.make_mesh(DEV)
    step = ts.make_train_step(graphdef, cfg, mesh, num_adapters=2)
    base_m, adapters_m = ts.replicate(base, mesh), ts.replicate(adapters, mesh)
    batch = step.prepare(base_m, adapters_m, ts.shard_batch(host, mesh))
    host = jax.tree.map(np.asarray, batch)
    counts = magrpo.group_counts(jnp.asarray(host.agent_ids), jnp.asarray(host.valid), 2)
    # The reference: device j's rows (its slice of every micro-batch) as micro-batches of MICRO / DEV on one device.
    one = ts.make_train_step(graphdef, magrpo.MAGRPOConfig.smoke(micro_batch=MICRO // DEV, kl_beta=0.1),
                             ts.make_mesh(1), num_adapters=2)
    rows = np.arange(ROWS).reshape(-1, DEV, MICRO // DEV)  # [micro-batch, device, row]


    def in_order(*parts):
        total = np.asarray(parts[0])
        for x in parts[1:]:
            total = total + np.asarray(x)  # float32, device 0 first
        return total


    def differing(a, b):
        return int(sum(np.sum(np.asarray(x).view(np.uint32) != np.asarray(y).view(np.uint32))
                       for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)))


    out = {}
    for first in (True, False):
        got = step.grads(base_m, adapters_m, batch, first, counts)
        parts = [one.grads(base, adapters, jax.tree.map(lambda x: x[rows[:, j].ravel()], host), first, counts)
                 for j in range(DEV)]
        want_m = {}
        for k in got[2]:
            xs = [np.asarray(p[2][k]) for p in parts]
            want_m[k] = np.min(xs, 0) if k == "ratio_min" else np.max(xs, 0) if k == "ratio_max" else in_order(*xs)
        live = np.empty(ROWS, np.float32)
        for j, p in enumerate(parts):
            live[rows[:, j].ravel()] = np.asarray(p[3])
        out[str(first)] = dict(
            grads=differing(got[0], jax.tree.map(in_order, *[p[0] for p in parts])),
            prefix=differing(got[1], jax.tree.map(in_order, *[p[1] for p in parts])),
            metrics={k: differing(got[2][k], want_m[k]) for k in want_m},
            live=differing(got[3], live),
            largest=float(max(np.abs(np.asarray(x)).max() for x in jax.tree.leaves(got[0]))),
            count=np.asarray(got[2]["count"]).tolist(),
            has_rows=[bool(host.valid[rows[:, j].ravel()].any()) for j in range(DEV)],
        )
    # The update with progress ticks on the 4-device mesh: one tick per micro-batch (not per device), the same
    # bits as without.
    class Bar:
        n = 0

        def update(self, k):
            self.n += k


    res = {}
    for progress in (False, True):
        s = ts.make_train_step(graphdef, cfg, mesh, num_adapters=2, progress=progress)
        b = Bar()
        with progress_lib.route(b):
            r = jax.block_until_ready(s.update(base_m, adapters_m, ts.init_opt_state(s, adapters_m), batch,
                                               jax.random.key(0)))
            jax.effects_barrier()
        res[progress] = (r, b.n)
    out["ticks"] = res[True][1]
    out["ticks_want"] = ts.progress_ticks(cfg, ROWS)[1]
    out["progress_differs"] = differing(res[False][0], res[True][0])
    print("RESULT" + json.dumps(out))
""")
BACKGROUND.register(
    "ordered-sum",
    ["-c", _ORDERED_SCRIPT],
    {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"},
)


@pytest.mark.background("ordered-sum")
def test_four_device_update_adds_the_device_partials_in_device_order():
    """On a mesh of 4 devices one optimizer step's sums (adapter and prefix K/V gradients, summed metrics) are the
    4 devices' partial sums added in device order, bit for bit: each partial computed here on one device over that
    device's rows (its slice of every micro-batch, the minibatch's per-agent counts), then added with float32
    NumPy in device order. So the result depends on the mesh only, not on how its devices are split over processes
    or on a collective's summation order (tests/test_distributed.py). ``ratio_min`` / ``ratio_max`` are the
    devices' min / max, the live log-probs each device's rows. And ``progress=True`` ticks once per micro-batch
    there too (not once per device), changing no bit."""
    proc = BACKGROUND.get("ordered-sum")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1][len("RESULT") :])
    for first in ("True", "False"):
        r = out[first]
        assert r["grads"] == 0 and r["prefix"] == 0 and r["live"] == 0, (first, r)
        assert r["metrics"] == {k: 0 for k in r["metrics"]}, (first, r)
        assert r["largest"] > 0 and r["count"] == [float(c) for c in r["count"]] and sum(r["count"]) == 21
        assert r["has_rows"] == [True] * 4  # every device contributes (some of its micro-batches are skipped)
    assert out["ticks"] == out["ticks_want"] == 4 * 2  # 4 micro-batches x 2 epochs
    assert out["progress_differs"] == 0


def test_tiny_task_learns_to_choose_b():
    """Fixed prompt, two one-token responses A / B, team return = fraction of agents choosing B."""
    n_agents, k, rounds = 2, 8, 8
    tok_a, tok_b = 11, 10  # with this seed the fresh model prefers A: P(B) = 0.25 at the start
    graphdef, adapters, base = split_model(_model(n_agents, seed=2))
    cfg = magrpo.MAGRPOConfig.smoke(num_rollouts=k, learning_rate=1e-2)
    step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=n_agents)
    opt = step.optimizer.init(adapters)
    prompt = [3, 17, 29, 41, 5]
    ids = jnp.asarray([prompt] * n_agents, jnp.int32)
    agents = jnp.arange(n_agents, dtype=jnp.int32)

    def p_b(adapters):
        """P(B) under each agent's policy restricted to the menu {A, B}."""
        state = nnx.state(nnx.merge(graphdef, adapters, base))
        logits = sampling.forward(graphdef, state, ids, agent_ids=agents)[:, -1, [tok_a, tok_b]]
        return np.asarray(jax.nn.softmax(logits, axis=-1)[:, 1])

    key = jax.random.key(0)
    probs, mean_returns = [p_b(adapters)], []
    for _ in range(rounds):
        key, k_sample, k_update = jax.random.split(key, 3)
        p = jnp.asarray(probs[-1])
        chose_b = np.asarray(jax.random.bernoulli(k_sample, p, (k, n_agents)))  # [K, N]
        returns = chose_b.mean(axis=1).astype(np.float32)  # team return of each rollout
        mean_returns.append(float(returns.mean()))
        adv_k = magrpo.group_relative_advantage(jnp.asarray(returns))
        rollout = np.repeat(np.arange(k), n_agents)
        batch = ts.pack_decisions(
            [prompt] * (k * n_agents),
            [[tok_b if c else tok_a] for c in chose_b.ravel()],
            np.tile(np.arange(n_agents), k),
            np.asarray(adv_k)[rollout],
            pad_to_multiple=8,
        )
        batch = step.prepare(base, adapters, batch)
        adapters, opt, _ = step.update(base, adapters, opt, batch, k_update)
        probs.append(p_b(adapters))
    probs = np.stack(probs)
    assert np.all(probs[0] < 0.3), probs
    assert np.all(probs[-1] > probs[0] + 0.5), probs
    assert np.all(probs[-1] > 0.8), probs
    assert np.mean(mean_returns[-3:]) > np.mean(mean_returns[:3]) + 0.25, mean_returns


# --------------------------------------------------------------------------------------------------
# Shared prompt prefix (system turn run once per adapter) and restricted letter choices.
# --------------------------------------------------------------------------------------------------

PREFIX = [7, 3, 11, 5, 2, 9, 4]


def _prefixed_pair(agent_ids, advantages, seed=0, choices=None, response_len=3):
    """The same decisions packed twice: whole prompts, and with PREFIX stripped (batch.prefix)."""
    rng = np.random.RandomState(seed)
    d = len(agent_ids)
    prompts = [PREFIX + list(rng.randint(1, VOCAB, rng.randint(2, 6))) for _ in range(d)]
    if choices is None:
        responses = [list(rng.randint(1, VOCAB, rng.randint(1, response_len + 1))) for _ in range(d)]
    else:
        responses = [[int(rng.choice(c))] for c in choices]
    kw = dict(response_len=response_len, pad_to_multiple=8, choices=choices)
    whole = ts.pack_decisions(prompts, responses, agent_ids, advantages, prompt_len=16, **kw)
    cut = ts.pack_decisions(prompts, responses, agent_ids, advantages, prompt_len=8, prefix=PREFIX, **kw)
    return whole, cut


def test_pack_decisions_strips_prefix_and_checks_it():
    whole, cut = _prefixed_pair([0, 1], [1.0, -1.0])
    assert cut.prefix == tuple(PREFIX) and whole.prefix == ()
    assert cut.tokens.shape[1] == 8 + 3
    # Every row's real tokens = prefix + the cut row's real tokens.
    for i in range(2):
        np.testing.assert_array_equal(
            whole.tokens[i][whole.attention_mask[i]], PREFIX + list(cut.tokens[i][cut.attention_mask[i]])
        )
    with pytest.raises(ValueError, match="shared prefix"):
        ts.pack_decisions([[1, 2, 3]], [[4]], [0], [0.0], prefix=[1, 3])
    with pytest.raises(ValueError, match="nothing after it"):
        ts.pack_decisions([[1, 2]], [[4]], [0], [0.0], prefix=[1, 2])


def test_prefix_scoring_equals_whole_rows(three_agents):
    step, graphdef, adapters, base = three_agents
    adapters = _randomise_b(adapters)
    whole, cut = _prefixed_pair([0, 1, 2, 1, 0, 2], [1.0] * 6)
    ids = jnp.asarray(whole.agent_ids)
    # Two programs (the prefix K/V once per adapter, then the rest; the whole rows): a forward's float32 error.
    assert_fp32_close(step.score(base, adapters, cut, ids), step.score(base, adapters, whole, ids), N_LOGP)
    ref = jnp.full_like(ids, -1)
    assert_fp32_close(step.score(base, adapters, cut, ref), step.score(base, adapters, whole, ref), N_LOGP)
    # Adapters matter, so the prefix K/V really is per adapter.
    assert not np.allclose(step.score(base, adapters, cut, ids), step.score(base, adapters, cut, ref))


def test_prefix_update_equals_whole_row_update():
    """The vjp through the once-per-adapter prefix gives the gradient of the whole rows."""
    graphdef, adapters, base = split_model(_model(3, seed=2))
    adapters = _randomise_b(adapters)
    agents = [0, 1, 2, 1, 1, 0, 2, 2, 1, 0, 1, 2, 0]
    whole, cut = _prefixed_pair(agents, np.linspace(-1.5, 1.5, len(agents)), seed=3)
    cfg = magrpo.MAGRPOConfig.smoke(micro_batch=4, kl_beta=0.1, epochs=2)
    step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=3)
    out = []
    for host in (whole, cut):
        batch = step.prepare(base, adapters, host)
        out.append((batch, step.update(base, adapters, step.optimizer.init(adapters), batch, jax.random.key(0))))
    (bw, (aw, _, mw)), (bc, (ac, _, mc)) = out
    assert_fp32_close(_theta_old(step, base, adapters, bc), _theta_old(step, base, adapters, bw), N_LOGP)
    assert_fp32_close(bc.logp_ref, bw.logp_ref, N_LOGP)
    # Per-agent gradient norms: sqrt of a sum of squared components, each off by a gradient's float32 error
    # (scale: the largest norm), over 2 chained steps (epochs).
    assert_fp32_close(mc["grad_norm"], mw["grad_norm"], N_GRAD, k=2 * 8.0)
    # Adam divides each component by its own running RMS, so a float32 rounding difference in a
    # small gradient component moves that component's step by up to ~1e-3 of the learning rate.
    for x, y, x0 in zip(jax.tree.leaves(ac), jax.tree.leaves(aw), jax.tree.leaves(adapters)):
        np.testing.assert_allclose(
            np.asarray(x) - np.asarray(x0), np.asarray(y) - np.asarray(x0), rtol=1e-3, atol=1e-3 * cfg.learning_rate
        )
    np.testing.assert_array_equal(mc["ratio_min"][0], [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(mc["ratio_max"][0], [1.0, 1.0, 1.0])


def test_prefix_fresh_adapters_ratio_one_kl_zero(three_agents):
    step, graphdef, adapters, base = three_agents
    _, cut = _prefixed_pair([0, 1, 2, 0, 1, 2, 0], [1.0, -1.0, 0.5, -0.5, 2.0, 0.0, 1.0], seed=4)
    batch = step.prepare(base, adapters, cut)
    np.testing.assert_array_equal(_theta_old(step, base, adapters, batch), batch.logp_ref)
    _, _, m = step.update(base, adapters, ts.init_opt_state(step, adapters), batch, jax.random.key(0))
    np.testing.assert_array_equal(m["ratio_min"][0], [1.0, 1.0, 1.0])
    np.testing.assert_array_less(m["kl"][0], 1e-10)  # 0 up to rounding (see above)


def test_restricted_choice_logprob_is_softmax_over_candidates(three_agents):
    step, graphdef, adapters, base = three_agents
    adapters = _randomise_b(adapters)
    choices = [[10, 11, 12], [10, 11], [10, 11, 12, 13, 14], [20, 21, 22, 23]]
    whole, cut = _prefixed_pair([0, 1, 2, 0], [1.0] * 4, choices=choices, response_len=1, seed=6)
    assert cut.choice_ids.shape == (8, 5)
    ids = jnp.asarray(cut.agent_ids)
    got = np.asarray(step.score(base, adapters, cut, ids))[:4]
    # By hand: tempered next-token logits after each whole prompt, renormalised over the candidates.
    model = nnx.merge(graphdef, adapters, base)
    logits = np.asarray(
        model(jnp.asarray(whole.tokens), attention_mask=jnp.asarray(whole.attention_mask), agent_ids=ids)
    )
    t = magrpo.MAGRPOConfig.smoke(kl_beta=0.1).temperature
    for i, c in enumerate(choices):
        z = logits[i, -2, c].astype(np.float64) / t
        want = z[c.index(int(whole.tokens[i, -1]))] - np.log(np.exp(z - z.max()).sum()) - z.max()
        # The cached scoring vs the whole-row forward (float32), then float64 here: a forward's error, scale
        # the largest of the log-prob and the logits it normalises.
        assert_fp32_close(got[i], want, N_LOGP, scale=max(abs(want), np.abs(z).max()), err_msg=str(c))
    with pytest.raises(ValueError, match="not among its candidates"):
        ts.pack_decisions([[1, 2]], [[5]], [0], [0.0], choices=[[3, 4]])
    with pytest.raises(ValueError, match="one-token"):
        ts.pack_decisions([[1, 2]], [[3, 4]], [0], [0.0], choices=[[3, 4]])


def test_progress_ticks_per_micro_batch_leave_the_update_bit_identical():
    """``progress=True`` ticks once per micro-batch (padding-only chunks included) in ``prepare`` and in every
    step of ``update``, and changes nothing it computes: adapters, optimizer state, metrics and log-probs
    equal ``progress=False``'s bit for bit."""
    graphdef, adapters, base = split_model(_model(3))
    adapters = _randomise_b(adapters)
    cfg = magrpo.MAGRPOConfig.smoke(kl_beta=0.1, epochs=2, micro_batch=4)
    # 7 decisions padded to 16 rows: micro-batches of 4, the last two of padding only.
    host = _random_batch([0, 1, 2, 0, 1, 2, 0], [1.0, -1.0, 0.5, -0.5, 2.0, 0.0, 1.0], seed=5, pad_to_multiple=16)
    assert ts.progress_ticks(cfg, host.num_decisions) == (4, 8)
    out = {}
    for progress in (False, True):
        step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=3, progress=progress)
        bar = CountingBar()
        with progress_lib.route(bar):
            batch = jax.block_until_ready(step.prepare(base, adapters, host))
            jax.effects_barrier()
            assert bar.n == (4 if progress else 0)
            res = jax.block_until_ready(
                step.update(base, adapters, ts.init_opt_state(step, adapters), batch, jax.random.key(0))
            )
            jax.effects_barrier()
        assert bar.n == (12 if progress else 0)
        out[progress] = (batch.logp_ref, res)
    with progress_lib.route(CountingBar()) as outside:
        pass
    assert outside.n == 0
    for a, b in zip(jax.tree.leaves(out[False]), jax.tree.leaves(out[True])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_forced_choices_cost_no_forward_and_change_nothing():
    """A ``choice_only`` decision with one candidate (a one-letter menu) has log-prob exactly 0 under every adapter
    and the reference, so its ratio is 1, its KL 0 and its gradient 0: a micro-batch holding only such rows (and
    padding) is skipped, and ``trainable_first`` gathers them into such micro-batches. The update is the same as
    with every forced row sharing a micro-batch with a real choice (computed), up to summation order; the
    skipped rows' stored log-probs are never read (poisoned with NaN, nothing changes)."""
    graphdef, adapters, base = split_model(_model(3, seed=8))
    adapters = _randomise_b(adapters, seed=5)
    real = [[10, 11, 12], [10, 11], [20, 21, 22], [10, 11, 12, 13], [11, 12], [12, 13]]
    choices = [c for pair in zip(real, [[13], [14], [15], [16], [17], [18]]) for c in pair]  # real, forced, ...
    agents = [0, 0, 2, 2, 1, 1, 0, 0, 2, 1, 1, 2]
    _, spread = _prefixed_pair(agents, np.linspace(-1.0, 1.0, 12), choices=choices, response_len=1, seed=9)
    assert spread.choice_ids.shape[0] == 16  # 12 decisions + 4 padding rows
    want = [True, False] * 6 + [False] * 4
    np.testing.assert_array_equal(ts.trainable(spread), want)
    first = ts.trainable_first(spread)
    assert isinstance(first.tokens, np.ndarray)  # a host packing stays on the host
    order = [0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11, 12, 13, 14, 15]
    for name in ("tokens", "attention_mask", "response_mask", "agent_ids", "advantages", "valid", "choice_ids"):
        np.testing.assert_array_equal(getattr(first, name), np.asarray(getattr(spread, name))[order], err_msg=name)
    assert (first.response_len, first.prefix) == (spread.response_len, spread.prefix)

    cfg = magrpo.MAGRPOConfig.smoke(micro_batch=2, kl_beta=0.1, optimizer="sgd")
    step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=3)
    forced = np.flatnonzero(~np.asarray(want) & np.asarray(spread.valid))
    for ids in (jnp.asarray(spread.agent_ids), jnp.full((16,), -1, jnp.int32)):  # adapters, reference
        lp = np.asarray(step.score(base, adapters, spread, ids))
        assert (lp[forced] == 0.0).all() and (lp[:12:2] != 0.0).all()  # exactly 0: a softmax over one candidate

    def update(batch):
        batch = step.prepare(base, adapters, batch)
        return batch, step.update(base, adapters, step.optimizer.init(adapters), batch, jax.random.key(0))

    _, (a_spread, _, m_spread) = update(spread)  # each micro-batch has a real choice: every row is computed
    prepared, (a_first, _, m_first) = update(first)  # rows 6-11 (forced) and 12-15 (padding): skipped
    lp = np.abs(np.asarray(prepared.logp_ref)).max()
    for x, y in zip(jax.tree.leaves(a_first), jax.tree.leaves(a_spread)):
        # The same nonzero gradient terms summed in other groupings (SGD: the step is linear in the gradient).
        assert_fp32_close(x, y, N_GRAD, scale=np.abs(np.asarray(y)).max(), k=2 * 8.0)
    for k in m_first:
        scale = lp * max(1.0, np.abs(np.asarray(m_spread[k])).max())
        assert_fp32_close(m_first[k], m_spread[k], N_GRAD, scale=scale, k=2 * 8.0, err_msg=k)
    np.testing.assert_array_equal(m_first["count"], m_spread["count"])  # forced rows count in each agent's mean
    np.testing.assert_array_equal(m_first["ratio_max"][0], [1.0, 1.0, 1.0])

    nan = np.asarray(prepared.logp_ref).copy()
    nan[6:12] = np.nan
    poisoned = prepared.replace(logp_ref=jnp.asarray(nan), logp_old=jnp.asarray(np.where(np.isnan(nan), np.nan, 0.0)))
    a_nan, _, m_nan = step.update(base, adapters, step.optimizer.init(adapters), poisoned, jax.random.key(0))
    for x, y in zip(jax.tree.leaves(a_nan), jax.tree.leaves(a_first)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    for k in m_first:
        np.testing.assert_array_equal(m_nan[k], m_first[k], err_msg=k)
