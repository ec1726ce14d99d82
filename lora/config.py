"""Model and adapter configuration for the frozen decoder and its per-agent LoRA adapters.

The fields follow the Hugging Face ``config.json`` of the Llama, Qwen2 and Qwen3 families
(transformers ``models/llama/configuration_llama.py``, ``models/qwen2/configuration_qwen2.py``,
``models/qwen3/configuration_qwen3.py``) and, for the layer-wise backbones of :mod:`lora.backbones`, the text
decoders of Gemma 4 (``models/gemma4/configuration_gemma4.py``, ``Gemma4TextConfig``) and Qwen3.5
(``models/qwen3_5/configuration_qwen3_5.py``, ``Qwen3_5TextConfig``); the LoRA fields follow PEFT's ``LoraConfig``
(Hu et al. 2022, "LoRA: Low-Rank Adaptation of Large Language Models").
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

# Architectures the decoder implements; everything else is refused at load time.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma4", "qwen3_5")
# Architectures with heterogeneous layers, run layer by layer by :class:`lora.backbones.LayerwiseDecoder`
# (the others by the layer-scanned :class:`lora.model.Decoder`).
LAYERWISE_ARCHITECTURES = ("gemma4", "qwen3_5")

# Projection names as PEFT spells them (``target_modules``), in the order the block applies them.
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
ALL_TARGETS = ATTENTION_TARGETS + MLP_TARGETS
# ModelConfig fields that must be positive ints (checked before the head-count arithmetic of ``__post_init__``).
_POSITIVE_INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only transformer (Llama / Qwen2 / Qwen3).

    Raises:
      ValueError: from ``__post_init__`` when the architecture is unsupported or head counts
        do not divide.
    """

    # Family name: "llama", "qwen2" or "qwen3"; selects biases and q/k norms by default.
    architecture: str
    # Rows of the token embedding (and of the output head).
    vocab_size: int
    # Model width d_model.
    hidden_size: int
    # Number of decoder blocks.
    num_layers: int
    # Query heads.
    num_heads: int
    # Key/value heads (grouped-query attention; equal to num_heads for plain multi-head attention).
    num_kv_heads: int
    # Per-head width; HF default hidden_size // num_heads (Qwen3 sets it explicitly).
    head_dim: int
    # SwiGLU inner width.
    intermediate_size: int
    # RoPE base theta (Su et al. 2021; HF ``rope_theta``).
    rope_theta: float = 10000.0
    # Epsilon inside RMSNorm (Zhang & Sennrich 2019; HF ``rms_norm_eps``).
    rms_norm_eps: float = 1e-6
    # Output head shares the embedding matrix (HF ``tie_word_embeddings``).
    tie_embeddings: bool = False
    # Bias on q/k/v projections (Qwen2; HF ``attention_bias`` for Llama).
    qkv_bias: bool = False
    # Per-head RMSNorm on queries and keys before RoPE (Qwen3).
    qk_norm: bool = False
    # Llama-3 style RoPE frequency scaling (HF ``rope_scaling`` with rope_type "llama3"), or None.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    # Longest sequence the model was trained for (informational; caches are sized by callers).
    max_position_embeddings: int = 8192

    # --- Layer-wise backbones only (Gemma 4, Qwen3.5); the defaults leave Llama / Qwen2 / Qwen3 unchanged. ---
    # Per-layer kind (HF ``layer_types``): "sliding_attention" / "full_attention" (Gemma 4),
    # "linear_attention" / "full_attention" (Qwen3.5); None = every layer full attention.
    layer_types: tuple[str, ...] | None = None
    # RoPE of each attention layer kind: (kind, ((key, value), ...)) with HF ``rope_parameters`` keys
    # (rope_type "default" or "proportional", rope_theta, partial_rotary_factor, factor); None = ``rope_theta``.
    layer_rope: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] | None = None
    # Keys a "sliding_attention" query sees: slots q - window < s <= q (HF ``sliding_window``).
    sliding_window: int | None = None
    # Head width and kv heads of "full_attention" layers where they differ (Gemma 4 ``global_head_dim``,
    # ``num_global_key_value_heads``); None = ``head_dim`` / ``num_kv_heads``.
    global_head_dim: int | None = None
    num_global_kv_heads: int | None = None
    # Gemma 4: full-attention layers reuse the key projection as values (HF ``attention_k_eq_v``).
    attention_k_eq_v: bool = False
    # Gemma 4: the last n layers reuse the K/V of the last earlier layer of their kind (``num_kv_shared_layers``).
    num_kv_shared_layers: int = 0
    # Gemma 4: KV-shared layers have a 2x wide MLP (``use_double_wide_mlp``).
    use_double_wide_mlp: bool = False
    # Gemma 4 per-layer embeddings (PLE, the E2B/E4B models): width per layer (0 = none) and table rows.
    hidden_size_per_layer_input: int = 0
    vocab_size_per_layer_input: int = 0
    # tanh soft cap of the output logits (Gemma ``final_logit_softcapping``), or None.
    final_logit_softcapping: float | None = None
    # MLP activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma).
    hidden_activation: str = "silu"
    # Qwen3.5 Gated DeltaNet ("linear_attention") layers: HF ``linear_*`` fields.
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {self.architecture!r}; supported: {SUPPORTED_ARCHITECTURES}")
        for name in _POSITIVE_INT_FIELDS:
            v = getattr(self, name)
            if not (isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("rope_theta", "rms_norm_eps"):
            v = getattr(self, name)
            if not (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.hidden_activation not in ("silu", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported hidden_activation {self.hidden_activation!r} (silu, gelu_pytorch_tanh)")
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for num_layers={self.num_layers}")

    @property
    def layerwise(self) -> bool:
        """True for the heterogeneous-layer backbones (:data:`LAYERWISE_ARCHITECTURES`)."""
        return self.architecture in LAYERWISE_ARCHITECTURES

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    def flops_per_token(self, context: int = 0, head: bool = True) -> float:
        """Forward FLOPs for one token: 2 per multiply-add in every matmul, plus attention.

        Args:
          context: keys attended to (adds 4 * num_heads * head_dim * context for QK^T and PV).
          head: include the output projection to the vocabulary.

        Returns:
          FLOPs as a float.
        """
        d, h = self.hidden_size, self.head_dim
        attn_proj = d * h * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * d * self.intermediate_size
        per_layer = 2 * (attn_proj + mlp) + 4 * self.num_heads * h * context
        return self.num_layers * per_layer + (2 * d * self.vocab_size if head else 0)

    @classmethod
    def tiny(cls, architecture: str = "llama", vocab_size: int = 128) -> ModelConfig:
        """Two-layer random-weight preset for tests (GQA with 2 groups, Qwen extras by family)."""
        return cls(
            architecture=architecture,
            vocab_size=vocab_size,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=8,
            intermediate_size=64,
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            tie_embeddings=architecture != "llama",
            qkv_bias=architecture == "qwen2",
            qk_norm=architecture == "qwen3",
            max_position_embeddings=512,
        )

    @classmethod
    def smollm2_135m(cls) -> ModelConfig:
        """SmolLM2-135M(-Instruct): HuggingFaceTB/SmolLM2-135M-Instruct config.json."""
        return cls(
            architecture="llama",
            vocab_size=49152,
            hidden_size=576,
            num_layers=30,
            num_heads=9,
            num_kv_heads=3,
            head_dim=64,
            intermediate_size=1536,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            tie_embeddings=True,
            max_position_embeddings=8192,
        )


#: PEFT ``lora_alpha`` per unit of rank in this project's runs (alpha = 2 x rank): not stated in the paper, our
#: choice (:meth:`LoRAConfig.for_rank`).
ALPHA_PER_RANK = 2.0


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Stacked per-agent LoRA adapters (PEFT ``LoraConfig`` semantics).

    The update to a frozen projection W is ``x @ W + (alpha / rank) * dropout(x) @ A_i @ B_i`` for
    the row's agent i; B starts at zero so a fresh adapter is the reference policy.

    Raises:
      ValueError: from ``__post_init__`` on a non-positive rank or count, a dropout outside [0, 1),
        or an unknown target name.
    """

    # Number of private adapters stacked on the agent axis; 1 = the shared-adapter ablation (B).
    num_adapters: int = 1
    # Rank r of each adapter (paper: 32 for Cleanup and Harvest, 16 for Overcooked).
    rank: int = 32
    # PEFT ``lora_alpha``; the update is scaled by alpha / rank.
    alpha: float = 64.0
    # Dropout on the adapter's input (PEFT ``lora_dropout``), active only when a dropout key is given.
    dropout: float = 0.0
    # Projections that get adapters, by PEFT module name.
    targets: tuple[str, ...] = ATTENTION_TARGETS

    def __post_init__(self):
        if self.num_adapters < 1 or self.rank < 1:
            raise ValueError(f"num_adapters and rank must be >= 1, got {self.num_adapters}, {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        unknown = set(self.targets) - set(ALL_TARGETS)
        if unknown:
            raise ValueError(f"unknown LoRA targets {sorted(unknown)}; known: {ALL_TARGETS}")

    @property
    def scaling(self) -> float:
        """PEFT's alpha / rank factor."""
        return self.alpha / self.rank

    @classmethod
    def for_rank(cls, num_adapters: int, rank: int) -> LoRAConfig:
        """``rank`` with alpha = :data:`ALPHA_PER_RANK` x rank (the one place that rule is written)."""
        return cls(num_adapters=num_adapters, rank=rank, alpha=ALPHA_PER_RANK * rank)

    @classmethod
    def paper(cls, num_adapters: int, overcooked: bool = False) -> LoRAConfig:
        """Paper experimental settings: rank 32 (16 for Overcooked-AI). The paper does not state alpha
        or targets; alpha = 2 * rank and attention projections are our defaults."""
        return cls.for_rank(num_adapters, 16 if overcooked else 32)
