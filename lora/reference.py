"""A plain, independent forward pass on HF-named weights, for parity tests and the benchmark baseline.

Written directly from the HF ``LlamaForCausalLM`` / ``Qwen2`` / ``Qwen3`` equations with no caching,
no padding and no adapters, shared with nothing in :mod:`lora.model`. ``xp`` selects the array
module: ``numpy`` (float64-capable test oracle) or ``jax.numpy`` (benchmark baseline under jit).
"""

from __future__ import annotations

import numpy as np

from lora.config import ModelConfig


def reference_logits(weights: dict, cfg: ModelConfig, input_ids, xp=np):
    """Logits [B, T, V] for unpadded ``input_ids`` int[B, T] (all positions 0..T-1).

    Args:
      weights: HF name -> array in HF layout ([out, in] linear weights).
      cfg: the model configuration.
      input_ids: int[B, T].
      xp: ``numpy`` or ``jax.numpy``.
    """
    w = weights
    b, t = input_ids.shape
    nh, nk, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def rms(x, g):
        return g * (x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + cfg.rms_norm_eps))

    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(t)[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))  # [T, H]
    sin = np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # [B, heads, T, H]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + xp.concatenate([-x2, x1], axis=-1) * sin

    causal = np.tril(np.ones((t, t), bool))
    x = w["model.embed_tokens.weight"][input_ids]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        proj = {}
        for name in "qkv":
            y = h @ w[p + f"self_attn.{name}_proj.weight"].T
            if cfg.qkv_bias:
                y = y + w[p + f"self_attn.{name}_proj.bias"]
            heads = nh if name == "q" else nk
            proj[name] = y.reshape(b, t, heads, hd).transpose(0, 2, 1, 3)
        q, k, v = proj["q"], proj["k"], proj["v"]
        if cfg.qk_norm:
            q = rms(q, w[p + "self_attn.q_norm.weight"])
            k = rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        rep = nh // nk  # HF repeat_kv: kv head j serves query heads j*rep .. j*rep+rep-1
        k = xp.repeat(k, rep, axis=1)
        v = xp.repeat(v, rep, axis=1)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        s = xp.where(causal, s, -np.inf)
        s = s - s.max(axis=-1, keepdims=True)
        pr = xp.exp(s)
        pr = pr / pr.sum(axis=-1, keepdims=True)
        o = (pr @ v).transpose(0, 2, 1, 3).reshape(b, t, nh * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + xp.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg.tie_embeddings else w["lm_head.weight"]
    return x @ head.T
