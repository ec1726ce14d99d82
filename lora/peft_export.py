"""Export one agent's adapter in Hugging Face PEFT layout (``adapter_model.safetensors`` + config).

PEFT names (peft ``tuners/lora/layer.py``, ``utils/save_and_load.py``): for a ``LlamaForCausalLM``
wrapped by ``PeftModel``, ``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`` is
[r, in] and ``...lora_B.weight`` is [out, r]; the update is ``(lora_alpha / r) * B @ A``. Our
``lora_a`` [L, N, in, r] / ``lora_b`` [L, N, r, out] (per layer [N, in, r] / [N, r, out] in
:class:`lora.backbones.LayerwiseDecoder`: Gemma 4, Qwen3.5, whose ``Gemma4ForCausalLM`` / ``Qwen3_5ForCausalLM``
use the same module names) are transposed slices of the same matrices, and the base is in HF row order (GGUF Q/K
are un-permuted at load), so the adapter applies unchanged.
"""

from __future__ import annotations

import json
import os

import numpy as np
from flax import nnx

from lora.config import LoRAConfig, ModelConfig
from lora.model import Decoder, LoRAParam

_MODULE_PREFIX = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


def _adapter_slots(pure: dict) -> list[tuple[str, dict, tuple[int, ...]]]:
    """Every adapted projection of an adapter pure dict: ``(PEFT module stem, its {lora_a, lora_b} leaves, index of
    its matrices before the agent axis)``.

    :class:`lora.model.Decoder` stacks layers (``blocks.<module>``, leaves [L, N, ...]: index ``(layer,)``);
    :class:`lora.backbones.LayerwiseDecoder` lists them (``layers.<i>.<module>`` for attention,
    ``layers.<i>.mlp.<module>``, leaves [N, ...]: index ``()``). The stems are the ``*ForCausalLM`` module names
    (transformers ``LlamaForCausalLM``, ``Gemma4ForCausalLM``, ``Qwen3_5ForCausalLM``: ``model.layers.{i}.self_attn``
    / ``.mlp``), wrapped by PEFT's ``base_model.model.``.
    """
    slots = []
    if "blocks" in pure:
        for module, leaves in pure["blocks"].items():
            for layer in range(np.shape(leaves["lora_a"])[0]):
                stem = f"base_model.model.model.layers.{layer}.{_MODULE_PREFIX[module]}.{module}"
                slots.append((stem, leaves, (layer,)))
        return slots
    for layer, modules in sorted(pure.get("layers", {}).items(), key=lambda kv: int(kv[0])):
        flat = {**{m: v for m, v in modules.items() if m != "mlp"}, **modules.get("mlp", {})}
        for module, leaves in sorted(flat.items()):
            stem = f"base_model.model.model.layers.{int(layer)}.{_MODULE_PREFIX[module]}.{module}"
            slots.append((stem, leaves, ()))
    return slots


def adapter_tensors(model: Decoder, agent: int, state=None) -> dict[str, np.ndarray]:
    """PEFT-named float32 tensors of adapter ``agent`` (``lora_A.weight`` [r, in], ``lora_B.weight`` [out, r]) of
    either model class (:func:`_adapter_slots`).

    Args:
      model: the model whose adapters (or whose adapter layout, with ``state``) are read.
      agent: the adapter's index on the agent axis.
      state: an adapter state of ``model``'s layout to read instead of the model's own (e.g. a checkpoint
        restored with :mod:`lora.checkpoint`); its agent axis may be shorter than the model's.

    Raises:
      ValueError: if the model has no adapters or ``agent`` is out of range.
    """
    cfg: LoRAConfig | None = model.lora_cfg
    if cfg is None:
        raise ValueError("model has no LoRA adapters to export")
    pure = nnx.to_pure_dict(nnx.state(model, LoRAParam) if state is None else state)
    slots = _adapter_slots(pure)
    count = np.shape(slots[0][1]["lora_a"])[len(slots[0][2])]
    if not 0 <= agent < count:
        raise ValueError(f"agent {agent} out of range [0, {count})")
    out = {}
    for stem, leaves, idx in slots:
        a = np.asarray(leaves["lora_a"], np.float32)[idx + (agent,)]  # [in, r]
        b = np.asarray(leaves["lora_b"], np.float32)[idx + (agent,)]  # [r, out]
        out[f"{stem}.lora_A.weight"] = np.ascontiguousarray(a.T)
        out[f"{stem}.lora_B.weight"] = np.ascontiguousarray(b.T)
    return out


def stack_adapters(first: dict[str, np.ndarray], second: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One PEFT adapter of rank r1 + r2 whose update is the sum of two adapters' updates at one scaling s:
    ``s B A`` with ``A = [A1; A2]`` (rows stacked, [r1 + r2, in]) and ``B = [B1, B2]`` (columns, [out, r1 + r2]),
    so ``B A = B1 A1 + B2 A2`` exactly (block product). Written with ``lora_alpha = s (r1 + r2)`` it applies the
    same s to both (PEFT's scaling is lora_alpha / r).

    Raises:
      ValueError: the two adapters adapt different modules (the differing names), or a pair's shapes disagree.
    """
    if sorted(first) != sorted(second):
        raise ValueError(f"the adapters adapt different modules: {sorted(set(first) ^ set(second))[:4]}")
    out = {}
    for name, x in first.items():
        y = second[name]
        axis = 0 if name.endswith("lora_A.weight") else 1
        if x.shape[1 - axis] != y.shape[1 - axis]:
            raise ValueError(f"{name}: shapes {x.shape} and {y.shape} cannot be stacked")
        out[name] = np.ascontiguousarray(np.concatenate([x, y], axis=axis))
    return out


def export_peft(
    model: Decoder,
    agent: int,
    directory: str,
    base_model_name_or_path: str = "HuggingFaceTB/SmolLM2-135M-Instruct",
    tensors: dict[str, np.ndarray] | None = None,
) -> str:
    """Writes ``adapter_model.safetensors`` and ``adapter_config.json`` for one agent.

    Args:
      tensors: the PEFT tensors to write instead of ``model``'s adapter ``agent`` (e.g. :func:`stack_adapters`'s);
        their rank is read from them, and ``lora_alpha`` keeps the model's scaling alpha / r at that rank.

    Returns:
      The directory written.
    """
    from safetensors.numpy import save_file

    cfg = model.lora_cfg
    tensors = adapter_tensors(model, agent) if tensors is None else tensors
    ranks = {t.shape[0] for n, t in tensors.items() if n.endswith("lora_A.weight")}
    if len(ranks) != 1:
        raise ValueError(f"the adapter's modules have different ranks {sorted(ranks)}")
    rank = ranks.pop()
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": cfg.scaling * rank,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted(cfg.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
    }
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return directory


def hf_config(cfg: ModelConfig) -> dict:
    """The HF ``config.json`` dict of ``cfg`` (inverse of :func:`lora.hf_loader.config_from_hf`).

    Field names follow transformers ``models/{llama,qwen2,qwen3}/configuration_*.py`` (the legacy
    top-level ``rope_theta`` / ``rope_scaling`` spelling, which transformers 4.x and 5.x both read).
    """
    arch = cfg.architecture
    config = {
        "model_type": arch,
        "architectures": [
            {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
        ],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "silu",
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "torch_dtype": "float32",
    }
    if arch == "qwen2":
        if not cfg.qkv_bias:  # transformers' Qwen2Attention always has q/k/v biases
            raise ValueError("qwen2 without q/k/v biases has no transformers equivalent")
        config["use_sliding_window"] = False
    else:
        config["attention_bias"] = cfg.qkv_bias
    if arch != "qwen3" and cfg.qk_norm:
        raise ValueError(f"{arch} with q/k norms has no transformers equivalent")
    if cfg.rope_scaling is not None:
        config["rope_scaling"] = dict(cfg.rope_scaling)
    return config


def export_hf_base(model: Decoder, directory: str) -> str:
    """Writes the frozen base as an HF checkpoint directory (``model.safetensors`` + ``config.json``,
    float32, no tokenizer) that ``transformers.AutoModelForCausalLM.from_pretrained`` and
    :func:`lora.load_model` read; the base a PEFT adapter from :func:`export_peft` applies to.

    Returns:
      The directory written.

    Raises:
      ValueError: a Gemma 4 / Qwen3.5 model (no writer of their config.json).
    """
    from safetensors.numpy import save_file

    from lora.params import export_hf_weights

    if model.cfg.layerwise:
        raise ValueError(
            f"export_hf_base: no config.json writer for architecture {model.cfg.architecture!r}; the base of a "
            "Gemma 4 / Qwen3.5 adapter is the HF directory the model was loaded from (pass it to export_peft as "
            "base_model_name_or_path)"
        )
    os.makedirs(directory, exist_ok=True)
    save_file(export_hf_weights(model), os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config(model.cfg), f, indent=2)
    return directory


def load_peft(model: Decoder, agent: int, directory: str) -> None:
    """Reads a PEFT adapter (as written by :func:`export_peft`) into slot ``agent`` of ``model``.

    Raises:
      ValueError: on a rank/target mismatch or missing tensor (naming the file).
    """
    from safetensors.numpy import load_file

    path = os.path.join(directory, "adapter_model.safetensors")
    tensors = load_file(path)
    state = nnx.state(model, LoRAParam)
    pure = nnx.to_pure_dict(state)
    for stem, leaves, idx in _adapter_slots(pure):
        a, b = np.array(leaves["lora_a"]), np.array(leaves["lora_b"])
        try:
            a[idx + (agent,)] = tensors[f"{stem}.lora_A.weight"].T
            b[idx + (agent,)] = tensors[f"{stem}.lora_B.weight"].T
        except KeyError as exc:
            raise ValueError(f"{path}: missing {exc.args[0]}") from exc
        except ValueError as exc:
            raise ValueError(f"{path}: {stem}: {exc}") from exc
        leaves["lora_a"], leaves["lora_b"] = a, b
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
