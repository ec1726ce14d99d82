"""Hugging Face checkpoint directory loader (Llama, Qwen2, Qwen3; Gemma 4 and Qwen3.5 text decoders), offline.

Reads ``config.json``, ``model.safetensors`` or a sharded ``model.safetensors.index.json``, and
``tokenizer.json`` (+ ``tokenizer_config.json`` for special tokens and the chat template). Config
field names follow transformers ``models/{llama,qwen2,qwen3,gemma4,qwen3_5}/configuration_*.py``. The multimodal
wrappers (``model_type`` "gemma4", "qwen3_5") are read through their ``text_config``; their vision / audio towers
are skipped by :func:`lora.backbones.build_layerwise`.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from lora.config import ModelConfig

# Layer kinds (HF ``layer_types``) the layer-wise decoder implements (:mod:`lora.backbones`).
GEMMA_KINDS = ("sliding_attention", "full_attention")
QWEN35_KINDS = ("linear_attention", "full_attention")

# HF ``model_type`` -> our architecture name.
MODEL_TYPES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
}
# Multimodal wrappers whose text decoder sits under "text_config".
_WRAPPERS = ("gemma4", "qwen3_5")


def _rope_items(params: dict) -> tuple[tuple[str, object], ...]:
    return tuple(sorted((k, v) for k, v in (params or {}).items() if not isinstance(v, (list, dict))))


def _layerwise_fields(hf: dict, arch: str, source: str) -> dict:
    """The :class:`ModelConfig` fields of a Gemma 4 / Qwen3.5 text config (``Gemma4TextConfig``,
    ``Qwen3_5TextConfig``).

    Raises:
      ValueError: on a feature the decoder does not implement (MoE, bidirectional attention, per-layer overrides
        other than Gemma 4's full-layer head_dim / num_key_value_heads), naming the field and value.
    """
    n = hf["num_hidden_layers"]
    layer_types = hf.get("layer_types")
    out: dict = {"max_position_embeddings": hf.get("max_position_embeddings", 8192)}
    if arch == "gemma4":
        for key in ("enable_moe_block", "use_bidirectional_attention"):
            if hf.get(key):
                raise ValueError(f"{source}: unsupported Gemma 4 feature {key}={hf[key]!r} (text decoder only, dense)")
        if layer_types is None:  # Gemma4TextConfig.__post_init__: 5 sliding : 1 full, the last layer full
            layer_types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
            layer_types[-1] = "full_attention"
        rope = hf.get("rope_parameters") or {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        }
        # Full layers' overrides: per_layer_config (as saved by transformers 5) or global_head_dim /
        # num_global_key_value_heads (the kwargs Gemma4TextConfig.__post_init__ turns into it).
        overrides = {int(k): v for k, v in (hf.get("per_layer_config") or {}).items()}
        if not overrides:
            glob = {"head_dim": hf.get("global_head_dim", 512)}
            if hf.get("attention_k_eq_v", True) and hf.get("num_global_key_value_heads") is not None:
                glob["num_key_value_heads"] = hf["num_global_key_value_heads"]
            overrides = {i: glob for i, kind in enumerate(layer_types) if kind == "full_attention"}
        seen = {}
        for i, o in overrides.items():
            bad = set(o) - {"head_dim", "num_key_value_heads"}
            if bad or layer_types[i] != "full_attention" or seen.setdefault("o", o) != o:
                raise ValueError(f"{source}: unsupported Gemma 4 per_layer_config entry {i}: {o!r}")
        full = seen.get("o", {})
        out.update(
            layer_types=tuple(layer_types),
            layer_rope=tuple(sorted((kind, _rope_items(p)) for kind, p in rope.items())),
            sliding_window=hf.get("sliding_window"),
            global_head_dim=full.get("head_dim"),
            num_global_kv_heads=full.get("num_key_value_heads"),
            attention_k_eq_v=bool(hf.get("attention_k_eq_v", False)),
            num_kv_shared_layers=int(hf.get("num_kv_shared_layers") or 0),
            use_double_wide_mlp=bool(hf.get("use_double_wide_mlp", False)),
            hidden_size_per_layer_input=int(hf.get("hidden_size_per_layer_input") or 0),
            vocab_size_per_layer_input=int(hf.get("vocab_size_per_layer_input") or 0),
            final_logit_softcapping=hf.get("final_logit_softcapping"),
            hidden_activation=hf.get("hidden_activation", "gelu_pytorch_tanh"),
        )
        if out["num_kv_shared_layers"]:
            # Gemma4TextConfig.kv_sharing_modes: every shared kind needs an earlier unshared layer of that kind.
            first = n - out["num_kv_shared_layers"]
            if not set(layer_types[first:]) <= set(layer_types[:first]):
                raise ValueError(f"{source}: num_kv_shared_layers={first} leaves a layer kind without a producer")
    else:
        if layer_types is None:  # Qwen3_5TextConfig.__post_init__: every full_attention_interval-th layer full
            interval = hf.get("full_attention_interval", 4)
            layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
        rope = dict(hf.get("rope_parameters") or {"rope_type": "default", "rope_theta": 10000.0})
        if "partial_rotary_factor" in hf and "partial_rotary_factor" not in rope:
            rope["partial_rotary_factor"] = hf["partial_rotary_factor"]
        out.update(
            layer_types=tuple(layer_types),
            layer_rope=(("full_attention", _rope_items(rope)),),
            hidden_activation=hf.get("hidden_act", "silu"),
            linear_conv_kernel_dim=hf.get("linear_conv_kernel_dim", 4),
            linear_key_head_dim=hf.get("linear_key_head_dim", 128),
            linear_value_head_dim=hf.get("linear_value_head_dim", 128),
            linear_num_key_heads=hf.get("linear_num_key_heads", 16),
            linear_num_value_heads=hf.get("linear_num_value_heads", 32),
        )
    unknown = set(layer_types) - set(GEMMA_KINDS if arch == "gemma4" else QWEN35_KINDS)
    if unknown:
        raise ValueError(f"{source}: unsupported layer_types {sorted(unknown)} for {arch}")
    return out


# config.json fields the mapping reads, by the type each must have (after ``text_config`` is unwrapped).
_REQUIRED_POSITIVE_INTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
_OPTIONAL_POSITIVE_INTS = (
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "sliding_window",
    "global_head_dim",
    "num_global_key_value_heads",
    "full_attention_interval",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
)
_OPTIONAL_NONNEGATIVE_INTS = ("num_kv_shared_layers", "hidden_size_per_layer_input", "vocab_size_per_layer_input")
_OPTIONAL_POSITIVE_FLOATS = ("rope_theta", "rms_norm_eps", "final_logit_softcapping", "partial_rotary_factor")
_OPTIONAL_BOOLS = ("tie_word_embeddings", "attention_bias", "attention_k_eq_v", "use_double_wide_mlp")
_OPTIONAL_STRS = ("hidden_act", "hidden_activation")
_OPTIONAL_DICTS = ("rope_parameters", "rope_scaling", "per_layer_config")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_hf_fields(hf, source: str, where: str = "") -> None:
    """Checks the shape and types of the (text) config dict ``hf`` that :func:`config_from_hf` reads.

    Raises:
      ValueError: naming ``source``, the field (``where`` prefixes it, e.g. ``text_config.``) and its value: not a
        JSON object, a required field missing, an int that is not a positive int, a float that is not a finite
        positive number, a bool / str / object field of another type, or ``layer_types`` not a list of strings.
    """
    if not isinstance(hf, dict):
        raise ValueError(f"{source}: {where.rstrip('.') or 'config'} must be a JSON object, got {hf!r}")
    for key in _REQUIRED_POSITIVE_INTS:
        if key not in hf:
            raise ValueError(f"{source}: required field {where}{key} is missing")
    for key in _REQUIRED_POSITIVE_INTS + _OPTIONAL_POSITIVE_INTS:
        v = hf.get(key)
        if (key in _REQUIRED_POSITIVE_INTS or v is not None) and not (_is_int(v) and v > 0):
            raise ValueError(f"{source}: {where}{key} must be a positive integer, got {v!r}")
    for key in _OPTIONAL_NONNEGATIVE_INTS:
        v = hf.get(key)
        if v is not None and not (_is_int(v) and v >= 0):
            raise ValueError(f"{source}: {where}{key} must be a non-negative integer, got {v!r}")
    for key in _OPTIONAL_POSITIVE_FLOATS:
        v = hf.get(key)
        if v is not None and not (
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        ):
            raise ValueError(f"{source}: {where}{key} must be a finite number > 0, got {v!r}")
    for key, kind, name in (
        *((k, bool, "true or false") for k in _OPTIONAL_BOOLS),
        *((k, str, "a string") for k in _OPTIONAL_STRS),
        *((k, dict, "a JSON object") for k in _OPTIONAL_DICTS),
    ):
        v = hf.get(key)
        if v is not None and not isinstance(v, kind):
            raise ValueError(f"{source}: {where}{key} must be {name}, got {v!r}")
    lt = hf.get("layer_types")
    if lt is not None and not (isinstance(lt, list) and all(isinstance(x, str) for x in lt)):
        raise ValueError(f"{source}: {where}layer_types must be a list of strings, got {lt!r}")


def config_from_hf(hf: dict, source: str) -> ModelConfig:
    """Maps an HF ``config.json`` dict to :class:`ModelConfig`.

    Raises:
      ValueError: naming ``source``: not a JSON object, an unsupported ``model_type``, a ``text_config`` that is not
        an object, or a field missing or of the wrong type (naming the field and its value).
    """
    if not isinstance(hf, dict):
        raise ValueError(f"{source}: config must be a JSON object, got {hf!r}")
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"{source}: unsupported architecture model_type={model_type!r} "
            f"(architectures={hf.get('architectures')}); supported: {sorted(MODEL_TYPES)}"
        )
    if "text_config" in hf and not isinstance(hf["text_config"], dict):
        raise ValueError(f"{source}: text_config must be a JSON object, got {hf['text_config']!r}")
    where = ""
    if model_type in _WRAPPERS and "text_config" in hf:
        hf = dict(hf["text_config"], tie_word_embeddings=hf.get("tie_word_embeddings", True))
        where = "text_config."
    _check_hf_fields(hf, source, where)
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
    layerwise = _layerwise_fields(hf, arch, source) if arch in ("gemma4", "qwen3_5") else {}
    if layerwise:
        rope_scaling = None
        rope_theta = float(dict(dict(layerwise["layer_rope"]).get("full_attention", ())).get("rope_theta", 10000.0))
    return ModelConfig(
        **layerwise,
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
        tie_embeddings=bool(hf.get("tie_word_embeddings", arch == "gemma4")),
        qkv_bias=bool(hf.get("attention_bias", arch == "qwen2")),
        qk_norm=arch in ("qwen3", "gemma4", "qwen3_5"),
        rope_scaling=rope_scaling,
        **({} if layerwise else {"max_position_embeddings": hf.get("max_position_embeddings", 8192)}),
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


def read_hf_config(directory: str) -> ModelConfig:
    """The :class:`ModelConfig` of an HF checkpoint directory's ``config.json``.

    Raises:
      FileNotFoundError: if config.json is missing.
      ValueError: on invalid JSON or an unsupported architecture.
    """
    config_path = os.path.join(directory, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path}: config.json not found")
    try:
        with open(config_path) as f:
            hf = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_path}: invalid JSON ({exc})") from exc
    return config_from_hf(hf, config_path)


def read_hf_dir(directory: str):
    """Reads an HF checkpoint directory into (config, HF-named weights, tokenizer).

    Raises:
      FileNotFoundError: if config.json, the weights or tokenizer.json are missing.
      ValueError: on an unsupported architecture or corrupt file.
    """
    from lora.tokenizer import load_tokenizer_json

    cfg = read_hf_config(directory)
    weights = read_safetensors(directory)
    tokenizer = load_tokenizer_json(directory)
    return cfg, weights, tokenizer
