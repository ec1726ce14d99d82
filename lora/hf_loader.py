"""Hugging Face checkpoint directory loader (Llama, Qwen2, Qwen3), offline.

Reads ``config.json``, ``model.safetensors`` or a sharded ``model.safetensors.index.json``, and
``tokenizer.json`` (+ ``tokenizer_config.json`` for special tokens and the chat template). Config
field names follow transformers ``models/{llama,qwen2,qwen3}/configuration_*.py``.
"""

from __future__ import annotations

import json
import os

import numpy as np

from lora.config import ModelConfig

# HF ``model_type`` -> our architecture name.
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def config_from_hf(hf: dict, source: str) -> ModelConfig:
    """Maps an HF ``config.json`` dict to :class:`ModelConfig`.

    Raises:
      ValueError: on an unsupported ``model_type`` (naming ``source``).
    """
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"{source}: unsupported architecture model_type={model_type!r} "
            f"(architectures={hf.get('architectures')}); supported: {sorted(MODEL_TYPES)}"
        )
    arch = MODEL_TYPES[model_type]
    n_head = hf["num_attention_heads"]
    # transformers >= 5 saves RoPE settings under "rope_parameters" (theta included) instead of the
    # top-level "rope_theta" / "rope_scaling" of 4.x configs; accept both.
    rope_params = dict(hf.get("rope_parameters") or {})
    rope_theta = float(hf.get("rope_theta", rope_params.get("rope_theta", 10000.0)))
    rope_scaling = hf.get("rope_scaling")
    if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
        rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
    if rope_scaling is not None:
        rope_scaling = tuple(sorted((k, v) for k, v in rope_scaling.items() if not isinstance(v, (list, dict))))
    return ModelConfig(
        architecture=arch,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=n_head,
        num_kv_heads=hf.get("num_key_value_heads") or n_head,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_head,
        intermediate_size=hf["intermediate_size"],
        rope_theta=rope_theta,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=bool(hf.get("attention_bias", arch == "qwen2")),
        qk_norm=arch == "qwen3",
        rope_scaling=rope_scaling,
        max_position_embeddings=hf.get("max_position_embeddings", 8192),
    )


def check_safetensors(path: str) -> int:
    """Checks one safetensors file's header against its size without reading tensor data (milliseconds).

    Returns:
      The number of tensors.

    Raises:
      ValueError: naming ``path``: a header that is cut off or not JSON, or tensor data past the end of the file
        (a truncated file: both sizes).
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise ValueError(
                f"{path}: truncated or corrupt safetensors file: {size} bytes, header length "
                f"{n if n >= 0 else 'missing'}"
            )
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: corrupt safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt safetensors header (not a JSON object)")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    try:
        end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise ValueError(f"{path}: corrupt safetensors header (a tensor without data_offsets)") from None
    if 8 + n + end > size:
        raise ValueError(
            f"{path}: truncated safetensors file: it has {size} bytes but its {len(tensors)} tensors "
            f"need {8 + n + end}; copy or download the file again"
        )
    return len(tensors)


def read_safetensors(directory: str) -> dict[str, np.ndarray]:
    """All tensors of a (possibly sharded) safetensors checkpoint as numpy arrays (bf16 kept via
    ml_dtypes).

    Raises:
      FileNotFoundError: if neither ``model.safetensors`` nor its index exists.
      ValueError: if a shard is corrupt (naming the shard).
    """
    from safetensors import safe_open

    index = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(single):
        shards = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    out = {}
    for shard in shards:
        path = os.path.join(directory, shard)
        try:
            with safe_open(path, framework="flax") as f:
                for key in f.keys():
                    out[key] = np.asarray(f.get_tensor(key))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: unreadable safetensors shard ({type(exc).__name__}: {exc})") from exc
    return out


def read_hf_dir(directory: str):
    """Reads an HF checkpoint directory into (config, HF-named weights, tokenizer).

    Raises:
      FileNotFoundError: if config.json, the weights or tokenizer.json are missing.
      ValueError: on an unsupported architecture or corrupt file.
    """
    from lora.tokenizer import load_tokenizer_json

    config_path = os.path.join(directory, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path}: config.json not found")
    try:
        with open(config_path) as f:
            hf = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_path}: invalid JSON ({exc})") from exc
    cfg = config_from_hf(hf, config_path)
    weights = read_safetensors(directory)
    tokenizer = load_tokenizer_json(directory)
    return cfg, weights, tokenizer
