"""Builds the tiny Gemma 4 / Qwen3.5 checkpoints and PyTorch reference logits under tests/data/backbones/.

Needs torch and transformers (the versions of the parity claim: transformers 5.24.0, torch 2.13.0 CPU):

    .venv/bin/python scripts/make_backbone_fixtures.py            # rewrites tests/data/backbones/<arch>/

Each ``<arch>/`` directory holds ``config.json`` + ``model.safetensors`` (float32, saved by transformers'
``save_pretrained``) of a random model built from that architecture's own config class, and ``reference.npz``:
``input_ids`` int64[2, 16] and ``logits`` float32[2, 16, V] from transformers' PyTorch forward (eager attention).
Every weight is redrawn (norm weights and Gemma's ``layer_scalar`` too, which the HF init leaves at 1 / 0), so
no term of the forward is an identity. ``tests/test_lora_backbones.py`` loads them with our HF loader without
torch (CI), and with torch rebuilds fresh ones through :func:`build` (``seed`` other than the fixtures').

Configurations (``Gemma4TextConfig`` / ``Qwen3_5TextConfig``, transformers ``models/gemma4``, ``models/qwen3_5``):
  * ``gemma4``: dense Gemma 4 text decoder: sliding (window 5 < 16 tokens) and full layers, full layers with
    ``global_head_dim`` 32, ``attention_k_eq_v`` and 1 global kv head (the 31B layout), proportional RoPE with
    partial_rotary_factor 0.25, GeGLU, logit soft cap 5 (so tanh bites).
  * ``gemma4_e2b``: the E2B/E4B "effective parameter" features: per-layer embeddings (PLE, width 8),
    ``num_kv_shared_layers`` 2 (the last two layers reuse earlier K/V) with ``use_double_wide_mlp``.
  * ``qwen3_5``: Qwen3.5 text decoder: Gated DeltaNet linear-attention layers and gated full-attention layers,
    partial RoPE (0.25), untied output head.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "backbones")
SEQ = 16


def configs() -> dict:
    """Architecture name -> transformers config (small: every directory stays under ~300 KB)."""
    from transformers import Gemma4TextConfig, Qwen3_5TextConfig

    common = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4, head_dim=8)
    gemma = dict(
        common,
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=5,
        global_head_dim=16,
        final_logit_softcapping=5.0,
        max_position_embeddings=256,
    )
    return {
        "gemma4": Gemma4TextConfig(
            **gemma,
            num_key_value_heads=2,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=0,
        ),
        "gemma4_e2b": Gemma4TextConfig(
            **gemma,
            num_key_value_heads=1,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=256,
        ),
        "qwen3_5": Qwen3_5TextConfig(
            **common,
            num_hidden_layers=4,
            num_key_value_heads=2,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            linear_conv_kernel_dim=4,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [1, 1, 0],
            },
            max_position_embeddings=256,
        ),
    }


def _randomise(model, seed: int) -> None:
    """Redraws every parameter and persistent buffer: matrices N(0, 0.15^2); Gemma norm weights 1 + N(0, 0.1^2),
    Qwen3.5's zero-centred ones N(0, 0.1^2); ``layer_scalar`` U(0.5, 1.5); ``A_log`` log U(1, 4); ``dt_bias``
    1 + N(0, 0.1^2)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    qwen = model.config.model_type.startswith("qwen3_5")
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" in name or not p.is_floating_point() or "embed_scale" in name:
                continue
            n = torch.randn(p.shape, generator=g)
            if name.endswith("layer_scalar"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.log(1 + 3 * torch.rand(p.shape, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(1 + 0.1 * n)
            elif p.ndim == 1:
                p.copy_(0.1 * n if qwen else 1 + 0.1 * n)
            else:
                p.copy_(0.15 * n)


def build(arch: str, directory: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Saves a random ``arch`` model to ``directory``; returns (input_ids int64[2, SEQ], logits float32[2, SEQ, V])
    of transformers' PyTorch forward."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = configs()[arch]
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _randomise(model, seed)
    model.save_pretrained(directory)
    ids = np.random.RandomState(seed).randint(0, cfg.vocab_size, (2, SEQ)).astype(np.int64)
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits.float().numpy()
    return ids, logits


def main() -> int:
    import torch
    import transformers

    for arch in configs():
        directory = os.path.join(ROOT, arch)
        os.makedirs(directory, exist_ok=True)
        ids, logits = build(arch, directory)
        np.savez_compressed(os.path.join(directory, "reference.npz"), input_ids=ids, logits=logits)
        with open(os.path.join(directory, "versions.json"), "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__}, f, indent=1)
        size = sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))
        print(f"{arch}: {directory} {size / 1024:.0f} KB, max |logit| {np.abs(logits).max():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
