"""Loaders: HF checkpoint directory and GGUF round trips on tiny random models, and bad input."""

import dataclasses
import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lora
from lora import Decoder, ModelConfig, sampling
from lora.gguf_loader import permute_qk, unpermute_qk
from lora.model import rope_inv_freq
from lora.params import export_hf_weights
from tests.helpers import assert_fp32_close

VOCAB = 128


def _byte_chars():
    """GPT-2 bytes_to_unicode printable characters, the alphabet of a byte-level BPE vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _tokens(n=VOCAB):
    chars = _byte_chars()
    base = [chars[b] for b in range(32, 127)] + [chars[10]]  # printable ASCII, space, newline
    return ["<|endoftext|>"] + base + [f"<extra_{i}>" for i in range(n - 1 - len(base))]


def _write_hf_dir(path, arch, n_tokens=VOCAB, sharded=True):
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    cfg = ModelConfig.tiny(arch, vocab_size=VOCAB)
    model = Decoder(cfg, rngs=nnx.Rngs(3))
    weights = export_hf_weights(model)
    os.makedirs(path, exist_ok=True)
    names = sorted(weights)
    if sharded:
        shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        for shard, keys in shards.items():
            save_file({k: weights[k] for k in keys}, os.path.join(path, shard))
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {k: s for s, ks in shards.items() for k in ks}}, f)
    else:
        save_file(weights, os.path.join(path, "model.safetensors"))
    config = {
        "model_type": arch,
        "vocab_size": VOCAB,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    tokens = _tokens(n_tokens)
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "chat_template": "{{ messages[0]['content'] }}"}, f)
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_hf_directory_round_trip(tmp_path, arch):
    original = _write_hf_dir(str(tmp_path), arch)
    model, tok = lora.load_model(str(tmp_path))
    ids = jnp.asarray(tok.encode("go to the river", add_special_tokens=False))[None]
    assert tok.decode(ids[0]) == "go to the river"
    gd, st = nnx.split(model)
    gd0, st0 = nnx.split(original)
    np.testing.assert_array_equal(sampling.forward(gd, st, ids), sampling.forward(gd0, st0, ids))


def test_permutation_is_invertible_and_not_identity():
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(8 * 3, 5)  # 3 heads of width 8
    p = permute_qk(w, 3)
    assert not np.array_equal(p, w)
    np.testing.assert_array_equal(unpermute_qk(p, 3), w)
    # convert_hf_to_gguf interleaves the two rotate_half halves: rows (0, 4, 1, 5, ...) of a head.
    np.testing.assert_array_equal(p[:4, 0], w[[0, 4, 1, 5], 0])


def _write_gguf(path, model: Decoder, rope_factors=None):
    import gguf

    cfg = model.cfg
    w = export_hf_weights(model)
    writer = gguf.GGUFWriter(path, "llama")
    if cfg.head_dim != cfg.hidden_size // cfg.num_heads:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    if rope_factors is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(rope_factors, np.float32))
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    tokens = _tokens()
    writer.add_token_list(tokens)
    writer.add_token_merges([])
    writer.add_token_types([3] + [1] * (len(tokens) - 1))
    writer.add_eos_token_id(0)
    writer.add_chat_template("<|im_start|>{{ m }}")
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for hf, array in w.items():
        if hf in names:
            writer.add_tensor(names[hf], array)
            continue
        layer, rest = hf.split(".", 3)[2], hf.split(".", 3)[3]
        if rest == "self_attn.q_proj.weight":
            array = permute_qk(array, cfg.num_heads)  # as convert_hf_to_gguf.py does
        elif rest == "self_attn.k_proj.weight":
            array = permute_qk(array, cfg.num_kv_heads)
        writer.add_tensor(f"blk.{layer}.{per_layer[rest]}", np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_writer_round_trip_undoes_qk_permutation(tmp_path):
    original = Decoder(ModelConfig.tiny("llama"), rngs=nnx.Rngs(5))
    path = str(tmp_path / "tiny.gguf")
    _write_gguf(path, original)
    model, tok = lora.load_model(path)
    assert model.cfg.num_kv_heads == 2 and not model.cfg.tie_embeddings
    ids = jnp.asarray(tok.encode("clean dirt", add_special_tokens=False))[None]
    assert tok.decode(ids[0]) == "clean dirt"
    gd, st = nnx.split(model)
    gd0, st0 = nnx.split(original)
    np.testing.assert_array_equal(sampling.forward(gd, st, ids), sampling.forward(gd0, st0, ids))


def _convert_hf_to_gguf_rope_factors(cfg):
    """llama.cpp convert_hf_to_gguf.py ``LlamaModel.generate_extra_tensors`` for rope_type llama3."""
    rs = dict(cfg.rope_scaling)
    dim = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low_freq_factor = rs["factor"], rs["low_freq_factor"]
    high_freq_factor, old_context_len = rs["high_freq_factor"], rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(rope_factors, np.float32)


# (factor, low, high, original) on head_dim 16 / theta 1e4 (wavelengths 6.3 .. 19869 tokens):
# Llama 3.1's published values (one interpolated frequency), two interpolated frequencies (low 1
# and low 2: recovered by a fit), none interpolated, and one interpolated with non-default edges.
LLAMA3_CASES = [
    (8.0, 1.0, 4.0, 8192),
    (4.0, 1.0, 8.0, 2048),
    (4.0, 2.0, 8.0, 4096),
    (16.0, 1.0, 2.0, 1500),
    (8.0, 1.0, 4.0, 4096),
]


@pytest.mark.parametrize("factor,low,high,original", LLAMA3_CASES)
def test_gguf_llama3_rope_freqs(tmp_path, factor, low, high, original):
    scaling = (
        ("factor", factor),
        ("high_freq_factor", high),
        ("low_freq_factor", low),
        ("original_max_position_embeddings", original),
        ("rope_type", "llama3"),
    )
    cfg = dataclasses.replace(ModelConfig.tiny("llama"), head_dim=16, rope_scaling=scaling)
    original_model = Decoder(cfg, rngs=nnx.Rngs(5))
    factors = _convert_hf_to_gguf_rope_factors(cfg)
    assert (factors > 1).any() and (factors == 1).any()
    path = str(tmp_path / "llama31.gguf")
    _write_gguf(path, original_model, rope_factors=factors)
    model, _ = lora.load_model(path)
    assert model.cfg.head_dim == 16 and dict(model.cfg.rope_scaling)["rope_type"] == "llama3"
    unscaled = rope_inv_freq(dataclasses.replace(cfg, rope_scaling=None))
    # Each frequency is its own short chain (a power, the factor's division, its float32 storage): relative
    # to its own magnitude, a few roundings.
    want = np.asarray(unscaled / factors)
    assert_fp32_close(np.asarray(rope_inv_freq(model.cfg)), want, 4, scale=np.abs(want))
    want = np.asarray(rope_inv_freq(cfg))
    assert_fp32_close(np.asarray(rope_inv_freq(model.cfg)), want, 4, scale=np.abs(want))
    ids = jnp.asarray(np.random.RandomState(0).randint(0, VOCAB, (1, 64)), jnp.int32)
    gd, st = nnx.split(model)
    gd0, st0 = nnx.split(original_model)
    ref = np.asarray(sampling.forward(gd0, st0, ids))
    # The same weights, frequencies equal to a few roundings: a forward's float32 error (roundings on a logit's
    # path: per layer the projections, MLP, attention over 64 positions and norms, then the final norm and logit).
    n = cfg.num_layers * (4 * cfg.hidden_size + 2 * cfg.intermediate_size + cfg.head_dim + 64) + 2 * cfg.hidden_size
    assert_fp32_close(np.asarray(sampling.forward(gd, st, ids)), ref, n)


def test_gguf_rope_freqs_identity_and_garbage(tmp_path):
    cfg = ModelConfig.tiny("llama")
    model = Decoder(cfg, rngs=nnx.Rngs(5))
    ones = str(tmp_path / "ones.gguf")
    _write_gguf(ones, model, rope_factors=np.ones(cfg.head_dim // 2))
    assert lora.load_model(ones)[0].cfg.rope_scaling is None
    bad = str(tmp_path / "bad.gguf")
    _write_gguf(bad, model, rope_factors=[1.0, 3.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"bad.gguf.*rope_freqs.*llama3"):
        lora.load_model(bad)


def test_missing_and_corrupt_files_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        lora.load_model(str(tmp_path / "nope.gguf"))
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    with pytest.raises(ValueError, match="corrupt.gguf"):
        lora.load_model(str(bad))
    with pytest.raises(FileNotFoundError, match="config.json"):
        lora.load_model(str(tmp_path))


def test_unsupported_architecture_and_vocab_mismatch(tmp_path):
    d = tmp_path / "m"
    _write_hf_dir(str(d), "llama", sharded=False)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, model_type="gpt_neox")))
    with pytest.raises(ValueError, match=r"config.json.*gpt_neox"):
        lora.load_model(str(d))
    d2 = tmp_path / "v"
    _write_hf_dir(str(d2), "llama", n_tokens=VOCAB + 20, sharded=False)
    with pytest.raises(ValueError, match=r"tokenizer.json.*148 tokens.*128"):
        lora.load_model(str(d2))


def test_config_from_hf_reads_transformers5_rope_parameters():
    """transformers 5 moves rope_theta / rope_scaling into "rope_parameters" (found by the HF parity
    tests: such a config silently loaded with theta 10000 and no scaling)."""
    from lora.hf_loader import config_from_hf

    base = dict(
        model_type="llama",
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
    )
    scaling = dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    )
    v5 = config_from_hf({**base, "rope_parameters": {"rope_theta": 1e5, **scaling}}, "v5.json")
    v4 = config_from_hf({**base, "rope_theta": 1e5, "rope_scaling": scaling}, "v4.json")
    assert v5.rope_theta == v4.rope_theta == 1e5
    assert v5.rope_scaling == v4.rope_scaling and dict(v5.rope_scaling)["factor"] == 8.0
    plain = config_from_hf({**base, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}, "d")
    assert plain.rope_theta == 5e5 and plain.rope_scaling is None
