"""Tiny random decoders: reference parity, caching/padding, per-agent LoRA isolation, dropout."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from lora import Decoder, KVCache, LoRAConfig, LoRAParam, ModelConfig, sampling, split_model
from lora.params import build_model, export_hf_weights
from lora.reference import reference_logits
from tests.helpers import assert_fp32_close

N_AGENTS = 3


def _n_logits(t, cfg=None):
    """Float32 roundings on the path of one logit of a ``t``-token row (tests.helpers.fp32_atol): per layer the
    q/k/v, attention-output, MLP-in and MLP-out reductions (hidden and intermediate sizes), the attention
    scores and mix (head dim, ``t`` positions) and two RMS norms; then the final norm and the logit itself."""
    cfg = cfg or ModelConfig.tiny()
    return cfg.num_layers * (4 * cfg.hidden_size + 2 * cfg.intermediate_size + cfg.head_dim + t) + 2 * cfg.hidden_size


def _n_logp(t):
    """... of one token's log-prob: its logit's path and the log-softmax (a max, the log of a sum of terms
    <= 1: a few roundings of the log-prob's size)."""
    return _n_logits(t) + 4


def _model(arch="llama", lora=None, seed=0):
    lora = lora or LoRAConfig(num_adapters=N_AGENTS, rank=4, alpha=8.0)
    return Decoder(ModelConfig.tiny(arch), lora, rngs=nnx.Rngs(seed))


def _randomise_b(model, seed=1):
    """Gives every adapter a non-zero B so adapters actually change outputs."""
    state = nnx.state(model, LoRAParam)
    pure = nnx.to_pure_dict(state)
    key = jax.random.key(seed)
    for leaves in pure["blocks"].values():
        key, sub = jax.random.split(key)
        leaves["lora_b"] = 0.1 * jax.random.normal(sub, leaves["lora_b"].shape)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)


def _fwd(model, ids, **kw):
    """Jitted forward (compiled once per config/shape, unlike eager calls that retrace the scan)."""
    graphdef, state = nnx.split(model)
    return sampling.forward(graphdef, state, ids, **kw)


@pytest.fixture(scope="module")
def ids():
    return jnp.asarray(np.random.RandomState(0).randint(0, 128, (2, 9)), jnp.int32)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_logits_match_numpy_reference(arch, ids):
    model = _model(arch)
    weights = export_hf_weights(model)
    ref = reference_logits({k: v.astype(np.float64) for k, v in weights.items()}, model.cfg, np.asarray(ids))
    out = np.asarray(_fwd(model, ids))
    assert out.dtype == np.float32 and out.shape == (2, 9, 128)
    assert_fp32_close(out, ref, _n_logits(9))  # float32 vs the float64 reference: the float32 error alone
    # The key map round-trips: rebuilding from the exported HF names gives identical logits.
    rebuilt = build_model(model.cfg, weights, source="<memory>", lora=model.lora_cfg)
    np.testing.assert_array_equal(np.asarray(_fwd(rebuilt, ids)), out)


def test_logits_match_torch_llama_if_available(ids):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig.tiny("llama")
    model = _model("llama", lora=None)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=False,
    )
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    hf.load_state_dict({k: torch.tensor(v) for k, v in export_hf_weights(model).items()}, strict=False)
    with torch.no_grad():
        ref = hf(torch.tensor(np.asarray(ids))).logits.numpy()
    assert_fp32_close(np.asarray(_fwd(model, ids)), ref, _n_logits(9), k=2 * 8.0)  # two float32 programs


def test_kv_cache_and_left_padding_match_full_forward(ids):
    model = _model()
    graphdef, state = nnx.split(model)
    full = _fwd(model, ids)
    cache = KVCache.init(model.cfg, 2, 9)
    last, cache = sampling.step(graphdef, state, ids[:, :5], cache)
    steps = [last]
    for t in range(5, 9):
        last, cache = sampling.step(graphdef, state, ids[:, t : t + 1], cache)
        steps.append(last)
    assert_fp32_close(np.stack(steps, 1), full[:, 4:], _n_logits(9), k=2 * 8.0)  # two float32 programs
    # Row 0 left-padded by 3 behaves like its unpadded suffix.
    mask = jnp.array([[0, 0, 0] + [1] * 6, [1] * 9], bool)
    padded = _fwd(model, ids, attention_mask=mask, agent_ids=jnp.array([1, 2]))
    alone = _fwd(model, ids[:1, 3:], agent_ids=jnp.array([1]))
    assert_fp32_close(padded[0, 3:], alone[0], _n_logits(9), k=2 * 8.0)


def _chunked_logits(model, ids, mask, agents, bounds, size):
    """Logits of ``ids`` fed chunk by chunk [bounds[i], bounds[i+1]) through one growing KV cache."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def chunk(state, ids, mask, cache):
        m = nnx.merge(graphdef, state)
        h, cache = m.hidden(ids, attention_mask=mask, agent_ids=agents, cache=cache, cache_size=size)
        return m.logits(h), cache

    cache, outs = None, []
    for a, e in zip(bounds, bounds[1:]):
        logits, cache = chunk(state, ids[:, a:e], mask[:, a:e], cache)
        outs.append(np.asarray(logits))
    return np.concatenate(outs, 1), cache


def test_cached_chunks_match_full_forward():
    """Every way of filling a KV cache gives the full forward's logits (lora.model): a new cache from
    the blocked causal path, a long chunk continuing it in two query blocks (flash-style combined
    softmax over the cache and the chunk's own keys, no concatenation) and short decode chunks; with
    left padding, a padded slot inside a decode chunk, per-row adapters, and free slots left at the
    end of the cache."""
    from lora import model as model_lib

    model = _model()
    _randomise_b(model)
    t = 200
    ids = jnp.asarray(np.random.RandomState(2).randint(0, 128, (2, t)), jnp.int32)
    mask = np.ones((2, t), bool)
    mask[0, :2] = False  # left padding (in the first chunk)
    mask[1, 187] = False  # a padded slot inside a decode chunk
    mask = jnp.asarray(mask)
    agents = jnp.array([2, 0])
    full = np.asarray(_fwd(model, ids, attention_mask=mask, agent_ids=agents))
    # chunks: 70 (new cache, 1 block), 116 (2 query blocks over the cache), 1, 2, 3, 4, 4 (decode)
    bounds = [0, 70, 186, 187, 189, 192, 196, 200]
    sizes = np.diff(bounds)
    assert round(sizes[1] / model_lib._CAUSAL_BLOCK) > 1
    got, cache = _chunked_logits(model, ids, mask, agents, bounds, size=t + 8)
    real = np.asarray(mask)
    assert_fp32_close(got[real], full[real], _n_logits(t), k=2 * 8.0)
    assert int(cache.index) == t and cache.size == t + 8
    assert np.array_equal(np.asarray(cache.valid[:, :t]), real)
    assert not np.asarray(cache.valid[:, t:]).any()
    np.testing.assert_array_equal(np.asarray(cache.next_pos), real.sum(1))


def test_cached_chunk_gradients_match_full_forward():
    """The combined-softmax path is differentiable: d(sum of logits of a chunk continuing a cache)
    with respect to the adapters equals the gradient through one full forward."""
    model = _model()
    _randomise_b(model)
    graphdef, lora_state, rest = nnx.split(model, LoRAParam, ...)
    ids = jnp.asarray(np.random.RandomState(3).randint(0, 128, (2, 40)), jnp.int32)
    agents = jnp.array([1, 2])

    def full_loss(lora_state):
        m = nnx.merge(graphdef, lora_state, rest)
        return m(ids, agent_ids=agents)[:, 25:].sum()

    def cached_loss(lora_state):
        m = nnx.merge(graphdef, lora_state, rest)
        _, cache = m.hidden(ids[:, :25], agent_ids=agents, cache_size=25)
        h, _ = m.hidden(ids[:, 25:], agent_ids=agents, cache=cache)
        return m.logits(h).sum()

    # Jitted: the eager gradient dispatches op by op (about 3x the compile of one program each).
    g_full = jax.jit(jax.grad(full_loss))(lora_state)
    g_cached = jax.jit(jax.grad(cached_loss))(lora_state)
    # A gradient component: the forward, the backward through it, and the loss's sum of 2 x 15 x 128 logits;
    # compared against its leaf's largest |component| (a small component carries its terms' absolute error).
    n = 2 * _n_logits(40) + 2 * 15 * 128
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_cached)):
        assert_fp32_close(np.asarray(b), np.asarray(a), n, k=2 * 8.0)
    assert max(float(np.abs(np.asarray(a)).max()) for a in jax.tree.leaves(g_full)) > 0


def test_cache_size_errors_name_the_sizes():
    model = _model()
    ids = jnp.zeros((1, 6), jnp.int32)
    with pytest.raises(ValueError, match="cache_size=4"):
        model.hidden(ids, cache_size=4)
    _, cache = model.hidden(ids, cache_size=8)
    with pytest.raises(ValueError, match="8 slots"):
        model.hidden(ids[:, :1], cache=cache, cache_size=7)
    with pytest.raises(ValueError, match="needs cache_size"):
        model.step(ids, None)


def test_blocked_causal_attention_matches_cache_path_and_reference():
    """Cache-free prefill skips future key blocks (lora.model._causal_attention): same logits as the
    cached path (full key range) and the float64 NumPy reference, with left padding and adapters."""
    from lora import model as model_lib

    t = 150
    assert round(t / model_lib._CAUSAL_BLOCK) > 1  # the blocked path is what gets tested
    model = _model()
    _randomise_b(model)
    graphdef, state = nnx.split(model)
    ids = jnp.asarray(np.random.RandomState(1).randint(0, 128, (2, t)), jnp.int32)
    mask = jnp.asarray(np.arange(t)[None] >= np.array([[20], [0]]))  # row 0 left-padded by 20
    agents = jnp.array([1, -1])  # row 1: frozen base, comparable with the reference
    blocked = np.asarray(_fwd(model, ids, attention_mask=mask, agent_ids=agents))

    @jax.jit
    def cached(state):
        m = nnx.merge(graphdef, state)
        h, _ = m.hidden(ids, attention_mask=mask, agent_ids=agents, cache=KVCache.init(m.cfg, 2, t))
        return m.logits(h)

    via_cache = np.asarray(cached(state))
    assert_fp32_close(blocked[0, 20:], via_cache[0, 20:], _n_logits(t), k=2 * 8.0)
    assert_fp32_close(blocked[1], via_cache[1], _n_logits(t), k=2 * 8.0)
    weights = {k: v.astype(np.float64) for k, v in export_hf_weights(model).items()}
    ref = reference_logits(weights, model.cfg, np.asarray(ids[1:]))[0]
    assert_fp32_close(blocked[1], ref, _n_logits(t))


def test_fresh_adapters_equal_base_exactly(ids):
    model = _model()  # B = 0 at init
    base = _fwd(model, ids)
    for agents in ([0, 1], [2, 2]):
        np.testing.assert_array_equal(_fwd(model, ids, agent_ids=jnp.array(agents)), base)


def test_rows_use_their_own_adapter(ids):
    model = _model()
    _randomise_b(model)
    mixed = _fwd(model, ids, agent_ids=jnp.array([2, 0]))
    swapped = _fwd(model, ids[::-1], agent_ids=jnp.array([0, 2]))
    base = _fwd(model, ids)
    # Another batch (rows swapped, other neighbours): the same rows through other matmul blockings.
    assert_fp32_close(mixed, swapped[::-1], _n_logits(9), k=2 * 8.0)
    single = _fwd(model, ids, agent_ids=jnp.array([2, 2]))
    assert_fp32_close(mixed[0], single[0], _n_logits(9), k=2 * 8.0)
    assert not np.allclose(mixed[0], base[0], atol=1e-3)  # adapters do something
    # id -1 = reference policy row in the same batch.
    assert_fp32_close(_fwd(model, ids, agent_ids=jnp.array([-1, 0]))[0], base[0], _n_logits(9), k=2 * 8.0)


def test_training_mode_dropout_zero_is_bit_identical(ids):
    model = _model(lora=LoRAConfig(num_adapters=2, rank=4, dropout=0.0))
    _randomise_b(model)
    mask = jnp.ones_like(ids, bool)

    def run(key):
        graphdef, state = nnx.split(model)
        return sampling.score(
            graphdef, state, ids[:, :5], mask[:, :5], ids[:, 5:], mask[:, 5:], jnp.array([0, 1]), dropout_key=key
        )

    np.testing.assert_array_equal(run(jax.random.key(0)), run(jax.random.key(1)))
    np.testing.assert_array_equal(run(jax.random.key(0)), run(None))
    # With dropout > 0 the key matters (and the same key reproduces).
    model.blocks.q_proj.dropout = 0.5
    np.testing.assert_array_equal(run(jax.random.key(0)), run(jax.random.key(0)))
    assert not np.array_equal(run(jax.random.key(0)), run(jax.random.key(1)))


def test_gradient_reaches_only_the_rows_agent():
    model = _model()
    _randomise_b(model)
    graphdef, adapters, base = split_model(model)
    rng = np.random.RandomState(1)
    prompt = jnp.asarray(rng.randint(0, 128, (4, 6)), jnp.int32)
    cont = jnp.asarray(rng.randint(0, 128, (4, 3)), jnp.int32)
    agents = jnp.array([1, 0, 1, 2])
    ones = lambda x: jnp.ones_like(x, bool)

    @jax.jit
    def loss_fn(adapters):
        m = nnx.merge(graphdef, adapters, base)
        lp = sampling.continuation_logprobs(m, prompt, ones(prompt), cont, ones(cont), agent_ids=agents)
        return -(lp.sum(axis=1) * (agents == 1)).sum()  # only agent 1's rows

    grads = jax.grad(loss_fn)(adapters)
    for name, leaves in nnx.to_pure_dict(grads)["blocks"].items():
        for kind in ("lora_a", "lora_b"):
            g = np.asarray(leaves[kind])  # [L, N, ...]
            assert np.abs(g[:, 1]).max() > 0, (name, kind)
            assert np.all(g[:, 0] == 0) and np.all(g[:, 2] == 0), (name, kind)
    # Optimizer state exists only for adapter leaves; the base is not copied per agent.
    opt_state = optax.adam(1e-3).init(adapters)
    n_adapter = len(jax.tree.leaves(adapters))
    assert len(jax.tree.leaves(opt_state)) == 2 * n_adapter + 1  # mu, nu, count
    assert base["blocks"]["q_proj"]["kernel"].shape == (2, 32, 32)  # no agent axis


def test_generate_scores_agree_and_prefix_cache_matches(ids):
    model = _model()
    _randomise_b(model)
    graphdef, state = nnx.split(model)
    mask = jnp.array([[0, 0] + [1] * 7, [1] * 9], bool)
    agents = jnp.array([0, 2])
    gen = sampling.generate(graphdef, state, ids, mask, jax.random.key(0), agents, 1.0, max_new_tokens=4, eos_ids=(5,))
    scored = sampling.score(graphdef, state, ids, mask, gen.tokens, gen.mask, agents)
    assert_fp32_close(scored, gen.logprobs, _n_logp(13), k=2 * 8.0)  # cached decode vs full-row scoring
    # A batch-1 prefix computed once and broadcast == recomputing it per row (reference policy).
    prefix = ids[:1, :4]
    cache = sampling.prefill_prefix(graphdef, state, prefix).broadcast(2)
    suffix = ids[:, 4:]
    a = sampling.generate(
        graphdef, state, suffix, jnp.ones_like(suffix, bool), jax.random.key(3), None, 0.0, cache, max_new_tokens=4
    )
    full = jnp.concatenate([jnp.repeat(prefix, 2, 0), suffix], 1)
    b = sampling.generate(
        graphdef, state, full, jnp.ones_like(full, bool), jax.random.key(3), None, 0.0, max_new_tokens=4
    )
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert_fp32_close(a.logprobs, b.logprobs, _n_logp(13), k=2 * 8.0)


def test_tempered_logprobs_sampling_trace_and_scoring_agree(ids):
    """One tempered log-prob (issue #13): a sampled token's ``logprobs_t`` is its score at the sampling
    temperature, ``logprobs`` the score at T = 1, and a candidate set renormalises over its members only."""
    model = _model()
    _randomise_b(model)
    graphdef, state = nnx.split(model)
    mask = jnp.ones_like(ids, bool)
    agents = jnp.array([1, 2])
    gen = sampling.generate(graphdef, state, ids, mask, jax.random.key(2), agents, 0.7, max_new_tokens=3)
    score = jax.jit(
        lambda st, t: sampling.continuation_logprobs(
            nnx.merge(graphdef, st), ids, mask, gen.tokens, gen.mask, agent_ids=agents, temperature=t
        )
    )
    np.testing.assert_allclose(gen.logprobs_t, score(state, 0.7), atol=1e-5)
    np.testing.assert_allclose(gen.logprobs, score(state, 1.0), atol=1e-5)
    assert np.abs(np.asarray(gen.logprobs_t) - np.asarray(gen.logprobs)).max() > 1e-3
    logits = jnp.asarray(np.random.RandomState(3).randn(2, 10), jnp.float32)
    cand = jnp.array([[4, 1, -1], [0, 9, 2]])
    got = sampling.tempered_logprobs(logits, jnp.array([1, 2]), 0.5, candidates=cand)
    want = [jax.nn.log_softmax(logits[0, jnp.array([4, 1])] / 0.5)[1], jax.nn.log_softmax(logits[1, cand[1]] / 0.5)[2]]
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # untied lm_head [D, V]; tied embedding [V, D]
def test_restricted_head_is_the_full_heads_columns(arch, ids):
    """``Decoder.logits(h, vocab)`` computes only the candidates' logits (a menu's letters, ``choice_only``): the
    same values as the full head's columns, for one token set shared by every row and for a set per row; and a
    restricted ``continuation_logprobs`` equals the full-head log-softmax over the same candidates."""
    model = _model(arch)
    _randomise_b(model)
    graphdef, state = nnx.split(model)
    mask = jnp.ones_like(ids, bool)
    agents = jnp.array([0, 2])
    cfg = model.cfg

    @jax.jit
    def heads(st):
        m = nnx.merge(graphdef, st)
        h, _ = m.hidden(ids, attention_mask=mask, agent_ids=agents)
        per_row = jnp.array([[[5, 77, 3]] * 9, [[0, 127, 64]] * 9])  # [B, T, 3]
        return m.logits(h), m.logits(h, jnp.array([9, 2, 40])), m.logits(h, per_row), per_row

    full, shared, own, per_row = heads(state)
    n = cfg.hidden_size  # the logit's own reduction; the hidden state is the same array
    assert shared.shape == (2, 9, 3) and own.shape == (2, 9, 3)
    assert_fp32_close(shared, full[..., jnp.array([9, 2, 40])], n, scale=np.abs(full).max())
    assert_fp32_close(own, jnp.take_along_axis(full, per_row, axis=-1), n, scale=np.abs(full).max())

    prompt, cont = ids[:, :6], ids[:, 6:7]
    cand = jnp.array([[[int(ids[0, 6]), 17, -1]], [[3, 50, int(ids[1, 6])]]])  # the target among them
    got = jax.jit(
        lambda st: sampling.continuation_logprobs(
            nnx.merge(graphdef, st),
            prompt,
            mask[:, :6],
            cont,
            mask[:, 6:7],
            agent_ids=agents,
            temperature=0.7,
            candidates=cand,
        )
    )(state)
    want = sampling.tempered_logprobs(full[:, 5:6], cont, 0.7, candidates=cand)
    assert_fp32_close(got, want, n + 4, scale=np.abs(full).max() / 0.7)


def test_prefill_per_adapter_and_take_rows(ids):
    """``KVCache.prefill`` runs a prefix once per adapter; ``take`` gives each row its adapter's prefix, and the
    rows continuing it score as if each had recomputed the prefix on its own adapter."""
    model = _model()
    _randomise_b(model)
    graphdef, state = nnx.split(model)
    prefix, suffix = ids[:1, :4], ids[:, 4:]
    cache = sampling.prefill_prefix(graphdef, state, prefix, jnp.array([0, 1, 2, -1]))
    assert cache.k.shape[1] == 4 and int(cache.index) == 4
    full = KVCache.full(cache.k, cache.v)
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(cache)):
        np.testing.assert_array_equal(a, b)
    rows, agents = jnp.array([2, 3]), jnp.array([2, -1])  # cache rows of adapter 2 and of adapters off
    one = jnp.ones_like(suffix, bool)
    cont = jax.jit(
        lambda st, c: sampling.continuation_logprobs(
            nnx.merge(graphdef, st), suffix[:, :3], one[:, :3], suffix[:, 3:], one[:, 3:], agent_ids=agents, cache=c
        )
    )
    whole = jnp.concatenate([jnp.repeat(prefix, 2, 0), suffix], 1)
    ref = sampling.score(graphdef, state, whole[:, :7], jnp.ones((2, 7), bool), whole[:, 7:], one[:, 3:], agents)
    np.testing.assert_allclose(cont(state, cache.take(rows)), ref, atol=1e-5)


def test_generate_stops_rows_at_end_tokens_like_a_token_by_token_loop(ids):
    """Greedy ``generate`` equals a by-hand loop of ``sampling.step`` calls; a row that emits an end
    token gets pad / log-prob 0 / mask False after it, and the others run to the M-token budget."""
    model = _model()
    _randomise_b(model)
    graphdef, state = nnx.split(model)
    agents, m = jnp.array([1, 0]), 6
    logits, cache = jax.jit(lambda s, i: nnx.merge(graphdef, s).step(i, None, agent_ids=agents, cache_size=9 + m))(
        state, ids
    )
    greedy, logps = [], []
    for _ in range(m):
        tok = jnp.argmax(logits, -1).astype(jnp.int32)
        greedy.append(np.asarray(tok))
        logps.append(np.asarray(jnp.take_along_axis(jax.nn.log_softmax(logits), tok[:, None], 1)[:, 0]))
        logits, cache = sampling.step(graphdef, state, tok[:, None], cache, agent_ids=agents)
    greedy, logps = np.stack(greedy, 1), np.stack(logps, 1)
    end = int(greedy[0, 2])  # row 0 ends at its third token
    gen = sampling.generate(
        graphdef,
        state,
        ids,
        jnp.ones_like(ids, bool),
        jax.random.key(0),
        agents,
        0.0,
        max_new_tokens=m,
        eos_ids=(end,),
        pad_id=-7,
    )
    stop0 = int(np.argmax(greedy[0] == end)) + 1
    np.testing.assert_array_equal(gen.tokens[0], list(greedy[0, :stop0]) + [-7] * (m - stop0))
    np.testing.assert_array_equal(gen.mask[0], [True] * stop0 + [False] * (m - stop0))
    assert_fp32_close(gen.logprobs[0, :stop0], logps[0, :stop0], _n_logp(15), k=2 * 8.0)
    assert not np.asarray(gen.logprobs[0, stop0:]).any()
    stop1 = int(np.argmax(greedy[1] == end)) + 1 if end in greedy[1] else m
    np.testing.assert_array_equal(gen.tokens[1, :stop1], greedy[1, :stop1])
    assert int(gen.mask[1].sum()) == stop1
    one = sampling.generate(
        graphdef, state, ids, jnp.ones_like(ids, bool), jax.random.key(0), agents, 0.0, max_new_tokens=1, eos_ids=(end,)
    )  # no cache written
    np.testing.assert_array_equal(one.tokens[:, 0], greedy[:, 0])
    assert_fp32_close(one.logprobs[:, 0], logps[:, 0], _n_logp(10), k=2 * 8.0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        sampling.generate(graphdef, state, ids, jnp.ones_like(ids, bool), jax.random.key(0), max_new_tokens=0)


def test_bfloat16_runs_and_returns_float32(ids):
    model = Decoder(ModelConfig.tiny("qwen3"), LoRAConfig(num_adapters=2, rank=4), dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    out = _fwd(model, ids, agent_ids=jnp.array([0, 1]))
    assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()


def test_config_validation():
    with pytest.raises(ValueError, match="unsupported architecture"):
        ModelConfig.tiny("gpt_neox")
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        LoRAConfig(targets=("qkv",))
