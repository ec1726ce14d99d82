"""Gemma 4 and Qwen3.5 text decoders (:mod:`lora.backbones`): logits parity with transformers' PyTorch forward.

Without torch (CI) the checks read the tiny checkpoints of ``tests/data/backbones/<arch>/`` (built from each
architecture's transformers config class by ``scripts/make_backbone_fixtures.py``, transformers 5.24.0) through
our HF loader and compare with the stored PyTorch logits; with torch, :func:`test_live_parity` rebuilds a fresh
random model (another seed) and compares with transformers directly.

Tolerance: ``max |ours - ref| <= 1e-4 * max |ref|`` (float32 both sides). Both forwards compute the same
float32 quantities in different orders (JAX einsums vs torch matmuls; Qwen3.5's chunked delta rule vs our
per-token recurrence); the rounding of one logit's path, n ~ L (4 D + 2 F + H + T) + 2 D ~ 1200 roundings here,
accumulates like a random walk, ``8 * eps32 * sqrt(n) ~ 3.3e-5`` of the largest logit at 8 sigma
(``tests.helpers.fp32_atol``), so 1e-4 is 3x above that bound and does not depend on summation order; a wrong
rule (a missing norm weight, a 1 + w, a wrong window) moves logits by 1e-2 or more. Measured: 8e-7 .. 8e-6.
"""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lora import LoRAConfig, LoRAParam, sampling
from lora.backbones import LayerwiseDecoder
from lora.config import ALL_TARGETS
from lora.hf_loader import config_from_hf, read_hf_config, read_safetensors
from lora.params import build_model
from tests.helpers import assert_fp32_close

RTOL = 1e-4
DATA = os.path.join(os.path.dirname(__file__), "data", "backbones")
ARCHS = ("gemma4", "gemma4_e2b", "qwen3_5")


def _load(directory, lora=None):
    cfg = read_hf_config(directory)
    return build_model(cfg, read_safetensors(directory), source=directory, lora=lora)


def _fwd(model, ids, **kw):
    graphdef, state = nnx.split(model)
    return np.asarray(sampling.forward(graphdef, state, jnp.asarray(ids, jnp.int32), **kw))


def _rel(out, ref):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    return float(np.abs(out - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_parity(arch):
    """Our loader + decoder on the stored checkpoint reproduce transformers' stored logits within 1e-4."""
    directory = os.path.join(DATA, arch)
    model = _load(directory)
    assert isinstance(model, LayerwiseDecoder)
    ref = np.load(os.path.join(directory, "reference.npz"))
    err = _rel(_fwd(model, ref["input_ids"]), ref["logits"])
    assert err <= RTOL, f"{arch}: relative error {err:.2e} > {RTOL:g}"


def test_fixtures_cover_the_features():
    """The fixtures exercise what they claim: both layer kinds, Gemma's window shorter than the sequence,
    k_eq_v and global heads, PLE and KV sharing, Qwen3.5's linear layers."""
    g, e, q = (read_hf_config(os.path.join(DATA, a)) for a in ARCHS)
    seq = np.load(os.path.join(DATA, "gemma4", "reference.npz"))["input_ids"].shape[1]
    assert set(g.layer_types) == {"sliding_attention", "full_attention"} and g.sliding_window < seq
    assert g.attention_k_eq_v and g.global_head_dim != g.head_dim and g.num_global_kv_heads == 1
    assert g.final_logit_softcapping and dict(dict(g.layer_rope)["full_attention"])["rope_type"] == "proportional"
    assert e.hidden_size_per_layer_input and e.num_kv_shared_layers == 2 and e.use_double_wide_mlp
    assert set(q.layer_types) == {"linear_attention", "full_attention"} and not q.tie_embeddings


@pytest.mark.parametrize("arch", ARCHS)
def test_multimodal_wrapper_reads_text_decoder(arch, tmp_path):
    """A ``Gemma4ForConditionalGeneration`` / ``Qwen3_5ForConditionalGeneration`` checkpoint (config with
    ``text_config``, weights under ``model.language_model.``, vision tensors) loads to the same text decoder."""
    directory = os.path.join(DATA, arch)
    with open(os.path.join(directory, "config.json")) as f:
        text = json.load(f)
    wrapper = {"model_type": text["model_type"].removesuffix("_text"), "text_config": text}
    wrapper["tie_word_embeddings"] = text["tie_word_embeddings"]
    cfg = config_from_hf(wrapper, "wrapper")
    assert cfg == read_hf_config(directory)
    weights = {
        ("model.language_model." + k[len("model.") :] if k.startswith("model.") else k): v
        for k, v in read_safetensors(directory).items()
    }
    weights["model.visual.patch_embed.weight" if "qwen" in arch else "model.vision_tower.x.weight"] = np.zeros(3)
    model = build_model(cfg, weights, source="wrapper")
    ref = np.load(os.path.join(directory, "reference.npz"))
    assert _rel(_fwd(model, ref["input_ids"]), ref["logits"]) <= RTOL


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padding(arch):
    """A left-padded row's real tokens get the logits of the unpadded row (positions from the mask; Gemma's
    window counts slots, and the padding slots are masked; Qwen3.5 zeroes padding before the delta rule)."""
    model = _load(os.path.join(DATA, arch))
    ids = np.load(os.path.join(DATA, arch, "reference.npz"))["input_ids"][:1, :10]
    pad = 3
    padded = np.concatenate([np.zeros((1, pad), ids.dtype), ids], axis=1)
    mask = np.concatenate([np.zeros((1, pad), bool), np.ones_like(ids, bool)], axis=1)
    out = _fwd(model, padded, attention_mask=jnp.asarray(mask))[:, pad:]
    assert _rel(out, _fwd(model, ids)) <= RTOL


@pytest.mark.parametrize("arch", ARCHS)
def test_restricted_head_is_the_full_heads_columns(arch):
    """``logits(h, vocab)`` (a menu's letters in ``choice_only``) equals the full head's columns, Gemma 4's tanh
    soft cap included, for one token set and for a set per row."""
    model = _load(os.path.join(DATA, arch))
    ids = jnp.asarray(np.load(os.path.join(DATA, arch, "reference.npz"))["input_ids"][:, :8], jnp.int32)
    v = model.cfg.vocab_size
    per_row = jnp.broadcast_to(jnp.array([v - 1, 0, 5])[None, None], (*ids.shape, 3))
    h, _ = model.hidden(ids)
    full = np.asarray(model.logits(h))
    shared = np.asarray(model.logits(h, jnp.array([3, v - 2, 1])))
    own = np.asarray(model.logits(h, per_row))
    n, scale = model.cfg.hidden_size + 2, np.abs(full).max()  # the logit's own reduction (+ the cap's tanh)
    assert_fp32_close(shared, full[..., [3, v - 2, 1]], n, scale=scale)
    assert_fp32_close(own, full[..., [v - 1, 0, 5]], n, scale=scale)


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_attaches(arch):
    """Adapters on every target: B = 0 is the base; a non-zero B changes only the rows of its agent, and
    agent id -1 is the frozen base."""
    directory = os.path.join(DATA, arch)
    lora = LoRAConfig(num_adapters=2, rank=2, alpha=4.0, targets=ALL_TARGETS)
    model = _load(directory, lora)
    ids = np.load(os.path.join(directory, "reference.npz"))["input_ids"][:, :8]
    base = _fwd(model, ids, agent_ids=jnp.array([-1, -1]))  # one compiled program for every call below
    np.testing.assert_array_equal(_fwd(model, ids, agent_ids=jnp.array([0, 1])), base)
    state = nnx.state(model, LoRAParam)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))
    n_b = sum(str(getattr(p[-1], "key", p[-1])) == "lora_b" for p, _ in leaves)
    # q/k/v/o of the softmax-attention layers (KV-shared layers have q/o only) and gate/up/down of every MLP.
    assert n_b >= 3 * model.cfg.num_layers + 2
    new = [
        0.1 * jax.random.normal(jax.random.key(i), v.shape) * jnp.array([0.0, 1.0])[:, None, None]
        if str(getattr(p[-1], "key", p[-1])) == "lora_b"
        else v
        for i, (p, v) in enumerate(leaves)
    ]
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(treedef, new))
    nnx.update(model, state)
    out = _fwd(model, ids, agent_ids=jnp.array([0, 1]))
    np.testing.assert_allclose(out[0], base[0], rtol=0, atol=1e-6)
    assert np.abs(out[1] - base[1]).max() > 1e-3
    np.testing.assert_allclose(_fwd(model, ids, agent_ids=jnp.array([-1, -1])), base, rtol=0, atol=1e-6)


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_size"))
def _step(graphdef, state, ids, cache, mask, cache_size=None):
    return nnx.merge(graphdef, state).step(ids, cache, attention_mask=mask, cache_size=cache_size)


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_matches_full_forward(arch):
    """Prefill 6 tokens into a 16-slot cache, then decode one token at a time: every step's logits equal the
    full forward's at that position (Gemma: past the sliding window, through the KV-shared layers; Qwen3.5:
    conv inputs and delta-rule state carried). Row 1 is left-padded by 2 slots (inside the prefill)."""
    directory = os.path.join(DATA, arch)
    model = _load(directory)
    graphdef, state = nnx.split(model)
    ids = np.load(os.path.join(directory, "reference.npz"))["input_ids"][:, :14].astype(np.int32)
    pad = 2
    ids[1, pad:] = ids[1, :-pad]
    ids[1, :pad] = 0
    mask = np.ones(ids.shape, bool)
    mask[1, :pad] = False
    full = _fwd(model, ids, attention_mask=jnp.asarray(mask))
    p, size = 6, 16
    logits, cache = _step(graphdef, state, jnp.asarray(ids[:, :p]), None, jnp.asarray(mask[:, :p]), cache_size=size)
    assert cache.size == size and int(cache.index) == p
    got = [np.asarray(logits)]
    for i in range(p, ids.shape[1]):
        logits, cache = _step(graphdef, state, jnp.asarray(ids[:, i : i + 1]), cache, jnp.asarray(mask[:, i : i + 1]))
        got.append(np.asarray(logits))
    got = np.stack(got, axis=1)  # [B, T - p + 1, V]
    want = full[:, p - 1 :]
    assert _rel(got, want) <= RTOL
    with pytest.raises(ValueError, match="cache_size"):
        model.step(jnp.asarray(ids[:, :4]), None)


def test_unsupported_variants_are_refused(tmp_path):
    """MoE Gemma 4, bidirectional attention, Qwen3.5-MoE and an unknown layer kind raise ValueError naming it."""
    with open(os.path.join(DATA, "gemma4", "config.json")) as f:
        gemma = json.load(f)
    with pytest.raises(ValueError, match="enable_moe_block"):
        config_from_hf(dict(gemma, enable_moe_block=True), "x")
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        config_from_hf(dict(gemma, use_bidirectional_attention="all"), "x")
    with pytest.raises(ValueError, match="qwen3_5_moe"):
        config_from_hf({"model_type": "qwen3_5_moe"}, "x")
    with open(os.path.join(DATA, "qwen3_5", "config.json")) as f:
        qwen = json.load(f)
    with pytest.raises(ValueError, match="chunked_attention"):
        config_from_hf(dict(qwen, layer_types=["chunked_attention"] * 4), "x")
    # A tensor the configuration has no place for names the tensor.
    directory = tmp_path / "g"
    shutil.copytree(os.path.join(DATA, "gemma4"), directory)
    weights = read_safetensors(str(directory))
    weights["model.layers.2.self_attn.extra.weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match="extra"):
        build_model(read_hf_config(str(directory)), weights, source=str(directory))


@pytest.mark.parametrize("arch", ARCHS)
def test_live_parity(arch, tmp_path):
    """With torch: a fresh random model (seed 1) from the architecture's transformers config class."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "make_backbone_fixtures.py")
    spec = importlib.util.spec_from_file_location("make_backbone_fixtures", path)
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    ids, ref = fixtures.build(arch, str(tmp_path), seed=1)
    err = _rel(_fwd(_load(str(tmp_path)), ids), ref)
    assert err <= RTOL, f"{arch}: relative error {err:.2e} > {RTOL:g}"


# A Gemma-style turn template (written for this test, in the format of Gemma's: no system role, the system text
# opens the first user turn, the assistant speaks as "model").
GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}{% set sys = '' %}{% if messages[0]['role'] == 'system' %}"
    "{% set sys = messages[0]['content'] + '\\n\\n' %}{% set messages = messages[1:] %}{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ (sys if loop.first else '') + m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def test_chat_template_comes_from_the_checkpoint(tmp_path):
    """``lora.load_model`` on a Gemma 4 directory: the tokenizer's chat template is the one in the checkpoint's
    tokenizer_config.json, rendered as written (system text folded into the first user turn), and the prompt
    pipeline's shared-prefix rule (``jaxopt_marl.rollout``: the system render is a prefix of the full one) holds."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    import lora
    from lora.tokenizer import render_chat

    directory = tmp_path / "gemma"
    shutil.copytree(os.path.join(DATA, "gemma4"), directory)
    specials = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
    words = specials + ["user", "model", "hello", "be", "kind", "\n"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)  # as in Gemma's tokenizer.json: the turn markers are special added tokens
    tok.save(str(directory / "tokenizer.json"))
    with open(directory / "tokenizer_config.json", "w") as f:
        json.dump(
            {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "chat_template": GEMMA_STYLE_TEMPLATE}, f
        )
    model, tokenizer = lora.load_model(str(directory))
    assert isinstance(model, LayerwiseDecoder) and tokenizer.chat_template == GEMMA_STYLE_TEMPLATE
    system, user = {"role": "system", "content": "be kind"}, {"role": "user", "content": "hello"}
    full = render_chat(tokenizer, [system, user])
    assert full == "<bos><start_of_turn>user\nbe kind\n\nhello<end_of_turn>\n<start_of_turn>model\n"
    assert full.startswith(render_chat(tokenizer, [system], add_generation_prompt=False))
    # Replies stop at the template's <end_of_turn> (id 4) and <eos> (1); not at <pad> (0), the unknown token
    # that a lookup of ChatML's "<|im_end|>" by name returns in this vocabulary.
    from lora.tokenizer import stop_token_ids

    assert stop_token_ids(tokenizer) == (1, 4)
