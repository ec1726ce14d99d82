"""Gemma 4 and Qwen3.5 (:class:`lora.backbones.LayerwiseDecoder`) through the paths the runs use: the shared
system-turn prefix cache per adapter and cached decoding (:mod:`lora.sampling`, as the compiled rollout calls
them), the PA-MAGRPO scoring and update over a prefix (:mod:`jaxopt_marl.train_step`), and the PEFT / HF weight
export, on the tiny checkpoints of ``tests/data/backbones/<arch>/``.

Tolerances: cached and full forwards are the same float32 quantities in another order (the prefix once, then the
rest; padding slots masked): 1e-5 of the largest logit (measured: ~1e-7 .. 1e-6).
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxopt_marl import magrpo
from jaxopt_marl import train_step as ts
from lora import LoRAConfig, LoRAParam, peft_export, sampling, split_model
from lora.backbones import LayerCache, LayerwiseDecoder
from lora.config import ALL_TARGETS
from lora.hf_loader import read_hf_config, read_safetensors
from lora.params import build_model, export_hf_weights

DATA = os.path.join(os.path.dirname(__file__), "data", "backbones")
RTOL = 1e-5
#: Prefix longer than the fixtures' sliding window (5), so the window reaches into the prefix from the suffix.
PREFIX_LEN = 9
LORA = LoRAConfig(num_adapters=2, rank=2, alpha=4.0, targets=ALL_TARGETS)


def _rel(out, ref):
    out, ref = np.asarray(out), np.asarray(ref)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    return float(np.abs(out - ref).max() / np.abs(ref).max())


@functools.cache
def _model(arch):
    """The fixture with two adapters on every target, B drawn N(0, 0.05^2) (a later round: each adapter changes
    the logits)."""
    directory = os.path.join(DATA, arch)
    model = build_model(read_hf_config(directory), read_safetensors(directory), source=directory, lora=LORA)
    state = nnx.state(model, LoRAParam)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    new = [
        x + 0.05 * jax.random.normal(k, x.shape) if str(getattr(p[-2], "key", p[-2])) == "lora_b" else x
        for (p, x), k in zip(leaves, keys)
    ]
    nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
    return model


def _tokens(seed, n, vocab):
    return np.random.RandomState(seed).randint(3, vocab, n).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_size"))
def _step(graphdef, state, ids, cache, mask, agent_ids, cache_size=None):
    return nnx.merge(graphdef, state).step(ids, cache, attention_mask=mask, agent_ids=agent_ids, cache_size=cache_size)


@pytest.mark.parametrize("arch", ["gemma4", "gemma4_e2b", "qwen3_5"])
def test_prefix_cached_decoding_matches_full_forward(arch):
    """The compiled rollout's LLM path: the prefix K/V once per adapter plus an adapters-off row
    (``prefill_prefix``), each row taking its adapter's (``take``), a left-padded suffix, then N greedy tokens one
    at a time. Rows on adapters 0, 1 and off, with 2, 0 and 1 padding slots between prefix and suffix: every step's
    logits equal the full forward of the row's unpadded tokens on its adapter (Gemma: sliding window across the
    prefix, KV-shared layers; Qwen3.5: conv inputs and delta-rule state through the padding). ``generate`` (the
    ``lax.while_loop`` decoder of both rollouts) then samples the same tokens at temperature 0."""
    model = _model(arch)
    graphdef, state = nnx.split(model)
    vocab, n_new = model.cfg.vocab_size, 4
    prefix = _tokens(0, PREFIX_LEN, vocab)
    suffixes = [_tokens(1, 2, vocab), _tokens(2, 4, vocab), _tokens(3, 3, vocab)]
    adapter = jnp.array([0, 1, -1], jnp.int32)
    tp = max(map(len, suffixes))
    ids = np.zeros((3, tp), np.int32)
    mask = np.zeros((3, tp), bool)
    for i, s in enumerate(suffixes):
        ids[i, tp - len(s) :], mask[i, tp - len(s) :] = s, True
    kv = sampling.prefill_prefix(graphdef, state, jnp.asarray(prefix)[None], jnp.array([0, 1, -1], jnp.int32))
    assert isinstance(kv, LayerCache) and kv.rows == 3 and kv.size == PREFIX_LEN
    cache = kv.take(jnp.where(adapter >= 0, adapter, kv.rows - 1))
    logits, cache = _step(
        graphdef, state, jnp.asarray(ids), cache, jnp.asarray(mask), adapter, cache_size=PREFIX_LEN + tp + n_new
    )
    got, toks = [np.asarray(logits)], []
    for _ in range(n_new):
        tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        toks.append(np.asarray(tok))
        logits, cache = _step(graphdef, state, tok[:, None], cache, jnp.ones((3, 1), bool), adapter)
        got.append(np.asarray(logits))
    got, toks = np.stack(got, axis=1), np.stack(toks, axis=1)  # [3, N + 1, V], [3, N]
    # The reference: each row's unpadded tokens, right-padded to one width (causal: padding after a token does not
    # change its logits), in one full forward on the row's adapter; row 3 is row 0 on the base.
    rows = [np.concatenate([prefix, s, toks[i]]) for i, s in enumerate(suffixes)] + [
        np.concatenate([prefix, suffixes[0]])
    ]
    width = max(map(len, rows))
    full_ids = np.stack([np.pad(r, (0, width - len(r))) for r in rows])
    full_mask = np.stack([np.arange(width) < len(r) for r in rows])
    full = np.asarray(
        sampling.forward(
            graphdef,
            state,
            jnp.asarray(full_ids),
            jnp.asarray(full_mask),
            jnp.array([0, 1, -1, -1], jnp.int32),
        )
    )
    for i, row in enumerate(rows[:3]):
        err = _rel(got[i], full[i, len(row) - n_new - 1 : len(row)])
        assert err <= RTOL, f"{arch} row {i}: cached vs full relative error {err:.2e}"
    # The adapters matter: row 0 on the base gives other logits.
    assert _rel(got[0, 0], full[3, len(rows[3]) - 1]) > 1e-3
    # The decode loop of the rollouts: greedy tokens and their log-probs.
    cache0 = kv.take(jnp.where(adapter >= 0, adapter, kv.rows - 1))
    gen = sampling.generate(
        graphdef,
        state,
        jnp.asarray(ids),
        jnp.asarray(mask),
        jax.random.key(0),
        adapter,
        0.0,
        cache0,
        max_new_tokens=n_new,
    )
    np.testing.assert_array_equal(np.asarray(gen.tokens), toks)
    want_lp = jax.nn.log_softmax(jnp.asarray(got[:, :-1]), axis=-1)
    want_lp = np.take_along_axis(np.asarray(want_lp), toks[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(gen.logprobs), want_lp, rtol=0, atol=1e-5 * np.abs(want_lp).max())


def _decisions(vocab, agents, seed):
    """The same decisions packed as whole rows and with the shared prefix cut (``DecisionBatch.prefix``)."""
    rng = np.random.RandomState(seed)
    prefix = list(_tokens(10, PREFIX_LEN, vocab))
    prompts = [prefix + list(rng.randint(3, vocab, rng.randint(1, 5))) for _ in agents]
    responses = [list(rng.randint(3, vocab, rng.randint(1, 4))) for _ in agents]
    adv = np.linspace(-1.0, 1.5, len(agents))
    kw = dict(response_len=3, pad_to_multiple=8)
    whole = ts.pack_decisions(prompts, responses, agents, adv, prompt_len=PREFIX_LEN + 4, **kw)
    cut = ts.pack_decisions(prompts, responses, agents, adv, prompt_len=4, prefix=prefix, **kw)
    return prompts, responses, whole, cut


@pytest.mark.parametrize("arch", ["gemma4_e2b", "qwen3_5"])
def test_train_step_scores_over_prefix_with_per_row_adapters(arch):
    """The update's scoring (``TrainStep.score``, ``sequence_logprobs``) on a layer-wise model: the log-probs of rows
    on agents 0 / 1 over the per-adapter prefix cache (``LayerCache.full`` of its floats, read by a chunk with no
    cache_size) equal those of the whole rows and of an eager full forward; the reference (the KL's) is the
    adapters-off model and differs from the adapters'."""
    model = _model(arch)
    graphdef, adapters, base = split_model(model)
    agents = [0, 1, 1, 0, 1]
    prompts, responses, whole, cut = _decisions(model.cfg.vocab_size, agents, seed=1)
    step = ts.make_train_step(graphdef, magrpo.MAGRPOConfig.smoke(kl_beta=0.1), ts.make_mesh(1), num_adapters=2)
    ids = jnp.asarray(whole.agent_ids)
    on_cut, on_whole = step.score(base, adapters, cut, ids), step.score(base, adapters, whole, ids)
    assert _rel(on_cut, on_whole) <= RTOL
    # Eager check of row 1 (agent 1): the summed log-softmax of its response tokens under a plain forward.
    row = np.asarray(prompts[1] + responses[1])[None]
    logits = sampling.forward(graphdef, nnx.state(model), jnp.asarray(row), agent_ids=jnp.array([1]))[0]
    lp = jax.nn.log_softmax(logits[len(prompts[1]) - 1 : -1], axis=-1)
    want = float(jnp.take_along_axis(lp, jnp.asarray(responses[1])[:, None], axis=-1).sum())
    assert abs(float(on_cut[1]) - want) <= RTOL * abs(want)
    ref_cut = step.score(base, adapters, cut, jnp.full_like(ids, -1))
    ref_whole = step.score(base, adapters, whole, jnp.full_like(ids, -1))
    assert _rel(ref_cut, ref_whole) <= RTOL
    assert _rel(ref_cut[: len(agents)], on_cut[: len(agents)]) > 1e-3


def test_train_step_update_through_prefix_cache():
    """One PA-MAGRPO round on Qwen3.5 (prefix floats: keys and values of the attention layers, conv inputs and
    delta-rule states of the Gated DeltaNet layers, None elsewhere): the vjp through the per-adapter prefix cache
    gives the whole rows' gradient (per-agent norms), both agents' adapters move as the whole-row update moves
    them, ratio 1 at theta_old, KL > 0 against the adapters-off reference."""
    model = _model("qwen3_5")
    graphdef, adapters, base = split_model(model)
    agents = [0, 1, 1, 0, 1]
    _, _, whole, cut = _decisions(model.cfg.vocab_size, agents, seed=1)
    cfg = magrpo.MAGRPOConfig.smoke(kl_beta=0.1)
    step = ts.make_train_step(graphdef, cfg, ts.make_mesh(1), num_adapters=2)
    out = []
    for host in (whole, cut):
        batch = step.prepare(base, adapters, host)
        out.append(step.update(base, adapters, step.optimizer.init(adapters), batch, jax.random.key(0)))
    (a_whole, _, m_whole), (a_cut, _, m_cut) = out
    np.testing.assert_array_equal(np.asarray(m_cut["ratio_min"][0]), [1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(m_cut["updated"][0]), [1.0, 1.0])
    assert np.isfinite(np.asarray(m_cut["loss"])).all() and (np.asarray(m_cut["kl"][-1]) > 0).all()
    assert _rel(m_cut["grad_norm"], m_whole["grad_norm"]) <= 1e-4
    # Adam divides each component by its own RMS, so a float32 rounding in a small gradient component moves that
    # component's step by up to ~1e-2 of the learning rate; every component with a gradient moves by ~lr.
    moved = 0.0
    for x, y, x0 in zip(jax.tree.leaves(a_cut), jax.tree.leaves(a_whole), jax.tree.leaves(adapters)):
        d_cut, d_whole = np.asarray(x) - np.asarray(x0), np.asarray(y) - np.asarray(x0)
        np.testing.assert_allclose(d_cut, d_whole, rtol=0, atol=1e-2 * cfg.learning_rate)
        moved = max(moved, float(np.abs(d_cut).max()))
    assert moved > 0.5 * cfg.learning_rate


@pytest.mark.parametrize("arch", ["gemma4_e2b", "qwen3_5"])
def test_peft_and_base_export(arch, tmp_path):
    """``export_peft`` names every adapted projection as the ``*ForCausalLM`` module it adapts (each stem is a
    weight of the checkpoint), ``load_peft`` reads it back into another slot, and ``export_hf_weights`` returns the
    checkpoint's own tensors (names and values) for a layer-wise model."""
    from safetensors.numpy import load_file

    model = _model(arch)
    out = peft_export.export_peft(model, 1, str(tmp_path / "peft"), base_model_name_or_path=os.path.join(DATA, arch))
    tensors = load_file(os.path.join(out, "adapter_model.safetensors"))
    weights = read_safetensors(os.path.join(DATA, arch))
    stems = {k.removesuffix(".lora_A.weight") for k in tensors if k.endswith(".lora_A.weight")}
    assert len(tensors) == 2 * len(stems) and len(stems) >= 3 * model.cfg.num_layers + 2
    for stem in stems:
        hf = stem.removeprefix("base_model.model.") + ".weight"
        assert hf in weights, f"{stem}: no tensor {hf} in the checkpoint"
        assert tensors[f"{stem}.lora_A.weight"].shape[1] == weights[hf].shape[1]  # [r, in]
        assert tensors[f"{stem}.lora_B.weight"].shape[0] == weights[hf].shape[0]  # [out, r]
    fresh = build_model(model.cfg, weights, source=arch, lora=LORA)
    peft_export.load_peft(fresh, 0, out)
    for x, y in zip(jax.tree.leaves(nnx.state(fresh, LoRAParam)), jax.tree.leaves(nnx.state(model, LoRAParam))):
        np.testing.assert_array_equal(np.asarray(x)[0], np.asarray(y)[1])
    exported = export_hf_weights(model)
    assert set(exported) == {k for k in weights if not k.endswith("rotary_emb.inv_freq")}
    for k, v in exported.items():
        np.testing.assert_array_equal(v, weights[k], err_msg=k)
    assert isinstance(fresh, LayerwiseDecoder)
    with pytest.raises(ValueError, match="no config.json writer"):
        peft_export.export_hf_base(model, str(tmp_path / "base"))


@pytest.mark.parametrize("arch", ["gemma4", "qwen35"])
def test_gguf_of_a_layerwise_backbone_is_refused(arch, tmp_path):
    """A Gemma 4 / Qwen3.5 GGUF (gguf-py's architecture names) is refused by the header check and the loader,
    naming the architecture and the HF directory route."""
    import gguf

    from lora import gguf_loader

    path = str(tmp_path / f"{arch}.gguf")
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for check in (gguf_loader.check_gguf, gguf_loader.read_gguf):
        with pytest.raises(ValueError, match=f"GGUF architecture '{arch}'.*Hugging Face checkpoint directory"):
            check(path)
