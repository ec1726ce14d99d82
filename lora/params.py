"""Checkpoint key map: Hugging Face tensor names -> NNX state paths of :class:`lora.model.Decoder`.

Both loaders (GGUF and HF directory) first produce a dict of HF-named arrays in HF layout
(``nn.Linear.weight`` is [out, in]); :func:`build_model` then applies the table below, stacks the
per-layer tensors on the layer axis, checks every shape, and initialises the adapters (A uniform,
B zero). Source of the names: transformers ``models/{llama,qwen2,qwen3}/modeling_*.py``.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lora.config import LoRAConfig, ModelConfig
from lora.model import Decoder, LoRAParam

# (HF name regex, NNX path template, transform). "{L}" marks a per-layer tensor stacked on axis 0;
# "{p}" is filled from the regex group named p. Transform "T": HF [out, in] -> our kernel [in, out].
KEY_MAP: tuple[tuple[str, str, str | None], ...] = (
    (r"model\.embed_tokens\.weight", "embed", None),
    (r"model\.norm\.weight", "final_norm.weight", None),
    (r"lm_head\.weight", "lm_head", "T"),
    (r"model\.layers\.(?P<L>\d+)\.input_layernorm\.weight", "blocks.input_norm.weight", None),
    (r"model\.layers\.(?P<L>\d+)\.post_attention_layernorm\.weight", "blocks.post_norm.weight", None),
    (r"model\.layers\.(?P<L>\d+)\.self_attn\.(?P<p>[qkvo])_proj\.weight", "blocks.{p}_proj.kernel", "T"),
    (r"model\.layers\.(?P<L>\d+)\.self_attn\.(?P<p>[qkv])_proj\.bias", "blocks.{p}_proj.bias", None),
    (r"model\.layers\.(?P<L>\d+)\.self_attn\.(?P<p>[qk])_norm\.weight", "blocks.{p}_norm.weight", None),
    (r"model\.layers\.(?P<L>\d+)\.mlp\.(?P<p>gate|up|down)_proj\.weight", "blocks.{p}_proj.kernel", "T"),
)
# Tensors some checkpoints carry that the model recomputes.
IGNORED_KEYS = (r".*rotary_emb\.inv_freq",)


def map_key(name: str) -> tuple[str, int | None, str | None] | None:
    """Maps one HF tensor name to (NNX path, layer index or None, transform), or None if unknown."""
    for pattern, template, transform in KEY_MAP:
        m = re.fullmatch(pattern, name)
        if m:
            groups = m.groupdict()
            layer = int(groups.pop("L")) if "L" in groups else None
            return template.format(**groups), layer, transform
    return None


def init_adapters(lora_state: nnx.State, key: jax.Array) -> nnx.State:
    """Fresh adapter values for a (possibly abstract) adapter state: A ~ U(+-1/sqrt(in)), B = 0.

    Leaves named ``lora_a`` have shape [..., N, in, R]; ``lora_b`` [..., N, R, out].
    """
    pure = nnx.to_pure_dict(lora_state)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(pure)
    keys = jax.random.split(key, max(len(leaves), 1))
    out = []
    for (path, leaf), k in zip(leaves, keys):
        name = str(path[-1].key) if hasattr(path[-1], "key") else str(path[-1])
        if name == "lora_a":
            bound = 1.0 / np.sqrt(leaf.shape[-2])
            out.append(jax.random.uniform(k, leaf.shape, jnp.float32, -bound, bound))
        else:
            out.append(jnp.zeros(leaf.shape, jnp.float32))
    nnx.replace_by_pure_dict(lora_state, jax.tree_util.tree_unflatten(treedef, out))
    return lora_state


def _set(tree: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        tree = tree[p]
    tree[leaf] = value


def _get(tree: dict, path: str):
    for p in path.split("."):
        if not isinstance(tree, dict) or p not in tree:
            return None
        tree = tree[p]
    return tree


def build_model(
    cfg: ModelConfig,
    weights: dict[str, np.ndarray],
    *,
    source: str,
    lora: LoRAConfig | None = None,
    dtype=jnp.float32,
    seed: int = 0,
) -> Decoder:
    """Builds a Decoder from HF-named weights without random-initialising the base.

    Args:
      cfg: model configuration matching ``weights``.
      weights: HF name -> array in HF layout (any float dtype).
      source: file or directory the weights came from (used in error messages).
      lora: adapter configuration, or None for no adapters.
      dtype: parameter/compute dtype of the base (float32 or bfloat16); adapters stay float32.
      seed: seed of the adapters' A matrices.

    Returns:
      The merged Decoder.

    Raises:
      ValueError: on an unknown tensor name, a missing tensor, or a shape mismatch, naming ``source``.
    """
    if cfg.layerwise:  # Gemma 4 / Qwen3.5: heterogeneous layers, their own name map
        from lora.backbones import build_layerwise

        return build_layerwise(cfg, weights, source=source, lora=lora, dtype=dtype, seed=seed)
    abstract = nnx.eval_shape(lambda: Decoder(cfg, lora, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, lora_state, base_state = nnx.split(abstract, LoRAParam, ...)
    pure = nnx.to_pure_dict(base_state)

    # 1. Group per-layer tensors by NNX path.
    singles: dict[str, np.ndarray] = {}
    stacked: dict[str, dict[int, np.ndarray]] = {}
    for name, array in weights.items():
        mapped = map_key(name)
        if mapped is None:
            if any(re.fullmatch(p, name) for p in IGNORED_KEYS):
                continue
            raise ValueError(
                f"{source}: unexpected tensor {name!r} for architecture "
                f"{cfg.architecture!r} (no entry in lora.params.KEY_MAP)"
            )
        path, layer, transform = mapped
        if _get(pure, path) is None:
            raise ValueError(
                f"{source}: tensor {name!r} maps to {path!r}, which this configuration "
                f"({cfg.architecture}, tie_embeddings={cfg.tie_embeddings}) does not have"
            )
        array = np.asarray(array)
        if transform == "T":
            array = array.T
        if layer is None:
            singles[path] = array
        else:
            stacked.setdefault(path, {})[layer] = array
    for path, per_layer in stacked.items():
        missing = sorted(set(range(cfg.num_layers)) - set(per_layer))
        if missing:
            raise ValueError(f"{source}: {path} missing for layers {missing}")
        singles[path] = np.stack([per_layer[i] for i in range(cfg.num_layers)])

    # 2. Fill and check every base leaf.
    return fill_base(graphdef, lora_state, base_state, singles, source=source, seed=seed)


def fill_base(graphdef, lora_state, base_state, arrays: dict[str, np.ndarray], *, source: str, seed: int):
    """Fills every base leaf from ``arrays`` (NNX path -> array in our layout), checks shapes, draws the adapters
    (:func:`init_adapters`) and merges the model.

    Raises:
      ValueError: naming ``source``: a leaf without an array, or a shape mismatch.
    """
    pure = nnx.to_pure_dict(base_state)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(pure)
    filled = []
    for keypath, leaf in leaves:
        path = ".".join(str(getattr(k, "key", k)) for k in keypath)
        if path not in arrays:
            raise ValueError(f"{source}: no tensor for model parameter {path!r} (expected shape {tuple(leaf.shape)})")
        array = arrays[path]
        if tuple(array.shape) != tuple(leaf.shape):
            raise ValueError(
                f"{source}: shape mismatch for {path!r}: file has {tuple(array.shape)}, "
                f"config expects {tuple(leaf.shape)}"
            )
        filled.append(jnp.asarray(array, dtype=leaf.dtype))
    nnx.replace_by_pure_dict(base_state, jax.tree_util.tree_unflatten(treedef, filled))
    lora_state = init_adapters(lora_state, jax.random.key(seed))
    return nnx.merge(graphdef, lora_state, base_state)


def export_hf_weights(model: Decoder) -> dict[str, np.ndarray]:
    """Inverse of the key map: the base weights as HF-named float32 arrays in HF layout (a Gemma 4 / Qwen3.5
    :class:`lora.backbones.LayerwiseDecoder`: :func:`lora.backbones.export_layerwise_weights`)."""
    if model.cfg.layerwise:
        from lora.backbones import export_layerwise_weights

        return export_layerwise_weights(model)
    _, _, base = nnx.split(model, LoRAParam, ...)
    pure = nnx.to_pure_dict(base)
    out = {}
    leaves, _ = jax.tree_util.tree_flatten_with_path(pure)
    by_path = {".".join(str(getattr(k, "key", k)) for k in kp): np.asarray(v, np.float32) for kp, v in leaves}
    templates = {
        "embed": "model.embed_tokens.weight",
        "final_norm.weight": "model.norm.weight",
        "lm_head": "lm_head.weight",
    }
    for path, array in by_path.items():
        if path in templates:
            out[templates[path]] = array.T if path == "lm_head" else array
            continue
        _, module, leaf = path.split(".")
        hf_module = {"input_norm": "input_layernorm", "post_norm": "post_attention_layernorm"}.get(module, module)
        prefix = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        for i in range(array.shape[0]):
            if module in ("input_norm", "post_norm"):
                out[f"model.layers.{i}.{hf_module}.weight"] = array[i]
            else:
                name = {"kernel": "weight", "bias": "bias", "weight": "weight"}[leaf]
                out[f"model.layers.{i}.{prefix}.{module}.{name}"] = array[i].T if leaf == "kernel" else array[i]
    # Contiguous copies: writers such as safetensors serialise the raw buffer, not the strides.
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
