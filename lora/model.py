"""Frozen decoder-only transformer (Llama / Qwen2 / Qwen3) in Flax NNX with stacked per-agent LoRA.

Facts follow the Hugging Face modeling files ``transformers/models/llama/modeling_llama.py``,
``models/qwen2/modeling_qwen2.py`` and ``models/qwen3/modeling_qwen3.py``: pre-norm RMSNorm blocks
(Zhang & Sennrich 2019), rotary embeddings in the "rotate_half" layout (Su et al. 2021), grouped-query
attention (Ainslie et al. 2023), SwiGLU MLP (Shazeer 2020); Qwen2 adds q/k/v biases, Qwen3 adds a
per-head RMSNorm on queries and keys (Qwen3 technical report, 2025).

LoRA (Hu et al. 2022): every targeted projection holds ``lora_a: [N, in, r]`` and ``lora_b: [N, r, out]``
as ``nnx.LoRAParam`` -- one slice per agent on the agent axis -- so "trainable" is the filter
``nnx.LoRAParam`` and the base weights (``nnx.Param``) exist once. Each batch row picks its adapter
through ``agent_ids: int32[B]``; ``agent_ids=None`` (or a row id < 0) is the frozen reference policy.

Layers are stacked on a leading layer axis and applied with ``jax.lax.scan`` so a 30-layer model
compiles once per shape, not 30 times.

The model protocol the rest of the system calls (sampling, the rollouts, the train step), shared by
:class:`Decoder` and :class:`lora.backbones.LayerwiseDecoder` (Gemma 4, Qwen3.5): ``hidden``, ``logits``,
``__call__``, ``step``, the attributes ``cfg``, ``lora_cfg``, ``dtype``, and ``cache_type``, the cache class with
``prefill(model, prefix_ids, agent_ids)``, ``full(*floats)``, ``floats()``, ``take``, ``broadcast``, ``grow``,
``size`` and ``rows`` (:class:`KVCache` here).

Einsum letters: B batch, T query time, S key slots, D model width, K kv heads, G query heads per kv
head, H head width, F MLP width, V vocabulary, N agents, R LoRA rank, L layers.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from lora.config import LoRAConfig, ModelConfig

LoRAParam = nnx.LoRAParam
# Finite "minus infinity" for masked attention scores: a fully masked (padding) query row then gets a
# uniform distribution instead of NaN; its output is never read.
_MASK_VALUE = -1e9
# Query block size and most blocks of the cache-free causal attention (:func:`_causal_attention`).
_CAUSAL_BLOCK = 64
_CAUSAL_MAX_BLOCKS = 4


@flax.struct.dataclass
class KVCache:
    """Keys and values of every layer, written slot by slot.

    Slots are shared across rows; a row's padding slots are marked invalid. A query at slot q attends
    to valid slots s <= q, so left padding, a prefix computed once and broadcast, and token-by-token
    decoding all use the same rule.

    Keys and values are stored heads-major, [.., K, S, H], the layout of the attention GEMMs
    (:func:`_attention`), so a layer's cache feeds them without a transpose: decoding SmolLM2 at B=8
    cost ~0.13 ms per cached slot per step in the former [.., S, K, H] layout, ~0.08 ms in this one
    (issue #4; the rest is the layer scan's per-layer slice copy).

    Attributes:
      k: keys, [L, B, K, S, H] in the model dtype.
      v: values, [L, B, K, S, H].
      valid: bool[B, S], slot holds a real token of that row.
      next_pos: int32[B], RoPE position of the row's next real token.
      index: int32[], next slot to write.
    """

    k: jax.Array
    v: jax.Array
    valid: jax.Array
    next_pos: jax.Array
    index: jax.Array

    @classmethod
    def init(cls, cfg: ModelConfig, batch: int, size: int, dtype=jnp.float32) -> KVCache:
        """An empty cache with ``size`` slots per row."""
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, size, cfg.head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            valid=jnp.zeros((batch, size), bool),
            next_pos=jnp.zeros((batch,), jnp.int32),
            index=jnp.zeros((), jnp.int32),
        )

    @classmethod
    def prefill(
        cls,
        model: Decoder,
        prefix_ids,
        agent_ids: jax.Array | None = None,
        *,
        capacity: int | None = None,
        dropout_key: jax.Array | None = None,
    ) -> KVCache:
        """The K/V of a shared prompt prefix (the rendered system turn), one row per adapter id.

        The adapters change the prefix's K/V, so it is computed once per adapter, not once for all rows;
        that is still far cheaper than once per decision. Rows pick theirs with :meth:`take`.

        Args:
          model: the merged decoder.
          prefix_ids: the P prefix token ids (a sequence, int32[P] or int32[1, P]).
          agent_ids: int32[R] adapter of each row (-1 = adapters off); None = one row on the frozen base.
          capacity: total slots (static); default P: a full cache that rows continuing the prefix only read
            (decoding grows it by what it needs).
          dropout_key: LoRA dropout key (None = deterministic).

        Returns:
          KVCache with R rows (1 without ``agent_ids``), ``index = P``.
        """
        ids = jnp.asarray(prefix_ids, jnp.int32).reshape(1, -1)
        rows = 1 if agent_ids is None else agent_ids.shape[0]
        ids = jnp.broadcast_to(ids, (rows, ids.shape[1]))
        _, cache = model.hidden(ids, agent_ids=agent_ids, cache_size=capacity or ids.shape[1], dropout_key=dropout_key)
        return cache

    @classmethod
    def full(cls, k: jax.Array, v: jax.Array) -> KVCache:
        """The cache of a whole prefix from its keys and values ([L, B, K, P, H]): every slot real, none free.

        :meth:`prefill` at the default capacity equals ``full(cache.k, cache.v)``; the update differentiates
        through ``(k, v)`` only (the other fields are not floats).
        """
        b, p = k.shape[1], k.shape[3]
        return cls(
            k=k,
            v=v,
            valid=jnp.ones((b, p), bool),
            next_pos=jnp.full((b,), p, jnp.int32),
            index=jnp.asarray(p, jnp.int32),
        )

    def floats(self) -> tuple[jax.Array, jax.Array]:
        """``(k, v)``: the float leaves a prefix cache is differentiated through (:meth:`full` rebuilds it)."""
        return self.k, self.v

    @property
    def rows(self) -> int:
        """B, the batch rows."""
        return self.k.shape[1]

    def take(self, rows: jax.Array) -> KVCache:
        """The cache of batch rows int32[B] (e.g. each decision's row of a per-adapter prefix)."""
        return KVCache(
            k=self.k[:, rows],
            v=self.v[:, rows],
            valid=self.valid[rows],
            next_pos=self.next_pos[rows],
            index=self.index,
        )

    @property
    def size(self) -> int:
        return self.k.shape[3]

    def broadcast(self, batch: int) -> KVCache:
        """Repeats a batch-1 cache (a shared prompt prefix) to ``batch`` rows without recomputing it."""
        rep = lambda a, axis: jnp.repeat(a, batch, axis=axis)
        return KVCache(
            k=rep(self.k, 1),
            v=rep(self.v, 1),
            valid=rep(self.valid, 0),
            next_pos=rep(self.next_pos, 0),
            index=self.index,
        )

    def grow(self, size: int) -> KVCache:
        """Pads the slot axis to ``size`` slots (no-op if already that large)."""
        extra = size - self.size
        if extra <= 0:
            return self
        pad5 = ((0, 0), (0, 0), (0, 0), (0, extra), (0, 0))
        return self.replace(
            k=jnp.pad(self.k, pad5), v=jnp.pad(self.v, pad5), valid=jnp.pad(self.valid, ((0, 0), (0, extra)))
        )


class RMSNorm(nnx.Module):
    """RMSNorm computed in float32, as HF ``LlamaRMSNorm``: ``w * (x / rms(x)).astype(x.dtype)``."""

    def __init__(self, dim: int, *, eps: float, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...] * x32.astype(x.dtype)


class LoRALinear(nnx.Module):
    """A frozen linear map ``x @ W + b`` plus N stacked LoRA adapters selected per batch row.

    ``kernel`` is [in, out] (the transpose of HF's ``weight``). With adapters, the row b of agent
    i = agent_ids[b] gets ``scaling * dropout(x_b) @ A_i @ B_i`` added, A_i: [in, r], B_i: [r, out].
    A starts He-uniform (PEFT's kaiming_uniform(a=sqrt(5)) bound 1/sqrt(in)), B at zero.
    """

    def __init__(
        self, in_features: int, out_features: int, *, use_bias: bool, lora: LoRAConfig | None, dtype, rngs: nnx.Rngs
    ):
        init = nnx.initializers.lecun_normal()
        self.kernel = nnx.Param(init(rngs.params(), (in_features, out_features), dtype))
        self.bias = nnx.Param(jnp.zeros((out_features,), dtype)) if use_bias else None
        if lora is not None:
            bound = 1.0 / math.sqrt(in_features)
            self.lora_a = LoRAParam(
                jax.random.uniform(
                    rngs.params(), (lora.num_adapters, in_features, lora.rank), jnp.float32, -bound, bound
                )
            )
            self.lora_b = LoRAParam(jnp.zeros((lora.num_adapters, lora.rank, out_features), jnp.float32))
            self.scaling = lora.scaling
            self.dropout = lora.dropout
        else:
            self.lora_a = self.lora_b = None

    def __call__(
        self, x: jax.Array, agent_ids: jax.Array | None = None, dropout_key: jax.Array | None = None
    ) -> jax.Array:
        """Applies the projection.

        Args:
          x: [B, T, in] activations.
          agent_ids: int32[B] adapter per row, or None for the frozen base; ids < 0 also mean "base".
          dropout_key: PRNG key enabling adapter-input dropout (training); None = deterministic.

        Returns:
          [B, T, out] in x's dtype.
        """
        y = jnp.einsum("btd,do->bto", x, self.kernel[...])
        if self.bias is not None:
            y = y + self.bias[...]
        if self.lora_a is None or agent_ids is None:
            return y
        ids = jnp.maximum(agent_ids, 0)
        a = self.lora_a[...][ids].astype(x.dtype)  # [B, in, R]
        b = self.lora_b[...][ids].astype(x.dtype)  # [B, R, out]
        xa = x
        if dropout_key is not None and self.dropout > 0.0:
            keep = jax.random.bernoulli(dropout_key, 1.0 - self.dropout, x.shape)
            xa = jnp.where(keep, x / (1.0 - self.dropout), 0).astype(x.dtype)
        delta = jnp.einsum("btr,bro->bto", jnp.einsum("btd,bdr->btr", xa, a), b)
        on = (agent_ids >= 0).astype(x.dtype)[:, None, None] * self.scaling
        return y + on * delta


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
    """RoPE inverse frequencies [H/2] (HF ``_compute_default_rope_parameters`` / ``llama3``).

    Raises:
      ValueError: on a rope_scaling type other than "llama3".
    """
    h = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
    if cfg.rope_scaling is None:
        return inv
    rs = dict(cfg.rope_scaling)
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return inv
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: llama3)")
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    smooth = (old / wavelen - lo) / (hi - lo)
    mid = (1 - smooth) * inv / factor + smooth * inv
    out = jnp.where(wavelen > old / lo, inv / factor, inv)
    is_mid = (wavelen <= old / lo) & (wavelen >= old / hi)
    return jnp.where(is_mid, mid, out)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """``x * cos + rotate_half(x) * sin`` with x: [B, T, heads, H], cos/sin: [B, T, H] (float32)."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rot = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, :, None] + rot * sin[:, :, None]).astype(x.dtype)


class Block(nnx.Module):
    """One pre-norm decoder block: attention (GQA + RoPE) then SwiGLU MLP, both residual."""

    def __init__(self, cfg: ModelConfig, lora: LoRAConfig | None, *, dtype, rngs: nnx.Rngs):
        d, h = cfg.hidden_size, cfg.head_dim
        lo = lambda name: lora if (lora is not None and name in lora.targets) else None
        self.input_norm = RMSNorm(d, eps=cfg.rms_norm_eps, dtype=dtype)
        self.q_proj = LoRALinear(d, cfg.num_heads * h, use_bias=cfg.qkv_bias, lora=lo("q_proj"), dtype=dtype, rngs=rngs)
        self.k_proj = LoRALinear(
            d, cfg.num_kv_heads * h, use_bias=cfg.qkv_bias, lora=lo("k_proj"), dtype=dtype, rngs=rngs
        )
        self.v_proj = LoRALinear(
            d, cfg.num_kv_heads * h, use_bias=cfg.qkv_bias, lora=lo("v_proj"), dtype=dtype, rngs=rngs
        )
        self.o_proj = LoRALinear(cfg.num_heads * h, d, use_bias=False, lora=lo("o_proj"), dtype=dtype, rngs=rngs)
        self.q_norm = RMSNorm(h, eps=cfg.rms_norm_eps, dtype=dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(h, eps=cfg.rms_norm_eps, dtype=dtype) if cfg.qk_norm else None
        self.post_norm = RMSNorm(d, eps=cfg.rms_norm_eps, dtype=dtype)
        f = cfg.intermediate_size
        self.gate_proj = LoRALinear(d, f, use_bias=False, lora=lo("gate_proj"), dtype=dtype, rngs=rngs)
        self.up_proj = LoRALinear(d, f, use_bias=False, lora=lo("up_proj"), dtype=dtype, rngs=rngs)
        self.down_proj = LoRALinear(f, d, use_bias=False, lora=lo("down_proj"), dtype=dtype, rngs=rngs)
        self.num_kv_heads, self.num_groups, self.head_dim = cfg.num_kv_heads, cfg.num_groups, h

    def __call__(self, x, *, cos, sin, bias, agent_ids, dropout_key, kv, bias_old, want_kv):
        """Applies the block.

        Args:
          x: [B, T, D] residual stream.
          cos, sin: float32[B, T, H] rotary tables for the chunk's positions.
          bias: float32[B, T, T] additive attention bias among the chunk's own tokens: 0 for allowed
            (query, key) pairs (key real and not after the query), ``_MASK_VALUE`` for the others
            (built once per call by :meth:`Decoder.hidden`, not per layer).
          agent_ids: int32[B] or None (frozen base).
          dropout_key: PRNG key or None.
          kv: (k, v) cache of this layer before the chunk, each [B, K, S, H], or None (no cache).
          bias_old: float32[B, 1, S] additive bias of the cached slots (0 for real tokens written before
            the chunk), with ``kv``.
          want_kv: return the chunk's keys and values (to be written into a cache).

        Returns:
          (x [B, T, D], (k, v) of the chunk, each [B, K, T, H] in the model dtype, or None). The caller
          writes them into the cache once for all layers (:meth:`Decoder.hidden`), so the layer scan
          only reads the cache and never carries it.
        """
        b, t, _ = x.shape
        kk, g, h = self.num_kv_heads, self.num_groups, self.head_dim
        keys = list(jax.random.split(dropout_key, 7)) if dropout_key is not None else [None] * 7

        # 1. Attention.
        y = self.input_norm(x)
        q = self.q_proj(y, agent_ids, keys[0]).reshape(b, t, kk * g, h)
        k = self.k_proj(y, agent_ids, keys[1]).reshape(b, t, kk, h)
        v = self.v_proj(y, agent_ids, keys[2]).reshape(b, t, kk, h)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = _heads_major(k), _heads_major(v)
        old = None if kv is None else (kv[0], kv[1], bias_old)
        att = _causal_attention(q, k, v, bias, kk, g, old=old).astype(x.dtype)
        x = x + self.o_proj(att, agent_ids, keys[3])

        # 2. SwiGLU MLP.
        y = self.post_norm(x)
        gate = self.gate_proj(y, agent_ids, keys[4])
        up = self.up_proj(y, agent_ids, keys[5])
        x = x + self.down_proj(jax.nn.silu(gate) * up, agent_ids, keys[6])
        return x, ((k, v) if want_kv else None)


def _heads_major(x: jax.Array) -> jax.Array:
    """[B, S, K, H] -> [B, K, S, H] (keys / values laid out for a batched GEMM per kv head)."""
    return x.transpose(0, 2, 1, 3)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array, kv_heads: int, groups: int) -> jax.Array:
    """Grouped-query softmax attention: q [B, T, K*G, H], k/v [B, K, S, H] -> [B, T, K*G*H].

    Both products run as one batched GEMM per (row, kv head), with the G query heads of a kv head
    stacked on the row axis ([B, K, G*T, H] x [B, K, S, H]): XLA's CPU backend lowers 5-D einsums
    with two batch axes to a slow loop (issue #4: 183 ms -> 37 ms per SmolLM2 layer at B=8, T=331).
    The 1/sqrt(H) scale is applied to q (fewer multiplies than on the [.., T, S] scores).

    Args:
      q: queries.
      k, v: keys and values, heads-major (the layout of :class:`KVCache`).
      bias: float32[B, T, S] additive bias (0 allowed, ``_MASK_VALUE`` masked).
      kv_heads, groups: K and G.
    """
    b, t, _, h = q.shape
    s = k.shape[2]
    q = (q * (1.0 / math.sqrt(h))).astype(q.dtype)
    q = q.reshape(b, t, kv_heads, groups, h).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, groups * t, h)
    scores = jnp.einsum("bkqh,bksh->bkqs", q, k, preferred_element_type=jnp.float32)
    scores = scores.reshape(b, kv_heads, groups, t, s) + bias[:, None, None]
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kv_heads, groups * t, s)
    out = jnp.einsum("bkqs,bksh->bkqh", probs, v)
    return out.reshape(b, kv_heads, groups, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, kv_heads * groups * h)


def _causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array,
    kv_heads: int,
    groups: int,
    old: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    block: int = _CAUSAL_BLOCK,
) -> jax.Array:
    """A chunk's causal attention over its own keys (and optionally a cache), skipping future keys.

    q [B, T, K*G, H]; the chunk's k/v [B, K, T, H] with bias float32[B, T, T] (key slot s = query
    slot s); ``old``: the cache before the chunk, ``(k_old [B, K, S, H], v_old [B, K, S, H],
    bias_old float32[B, 1, S])`` or None. Returns [B, T, K*G*H]. Decode steps (T = 1) take the same
    path: one block, the cache plus the token itself.

    Queries go in blocks of about ``block`` rows; block [a, e) only needs the chunk's keys [0, e),
    since the bias masks every key after the query's own. For T=331 in 4 blocks that computes 62% of
    the [T, T] scores; the skipped ones would get probability exactly 0, so a real token's result is
    unchanged (a fully masked padding query, whose output is never read, averages fewer slots).
    With a cache, each block's keys are the S cached slots followed by its chunk keys, one GEMM pair
    and one softmax. (A flash-style combined softmax over the two key sets without concatenating
    them was measured on XLA CPU: slower for a suffix, 18.5 against 9.4 ms per SmolLM2 layer at B=8,
    T=93, S=238; for a decode step, T=1, S=339, faster in isolation, 0.69 against 0.84 ms per layer,
    but no faster over a whole 30-layer step, where the layer scan copies the cache slice either way.
    So there is one path.)
    """
    t = q.shape[1]
    n = max(1, min(_CAUSAL_MAX_BLOCKS, round(t / block)))
    ends = [round(t * (i + 1) / n) for i in range(n)]
    starts = [0] + ends[:-1]
    outs = []
    for a, e in zip(starts, ends):
        kb, vb, bb = k[:, :, :e], v[:, :, :e], bias[:, a:e, :e]
        if old is not None:
            k_old, v_old, bias_old = old
            kb = jnp.concatenate([k_old, kb.astype(k_old.dtype)], axis=2)
            vb = jnp.concatenate([v_old, vb.astype(v_old.dtype)], axis=2)
            bb = jnp.concatenate([jnp.broadcast_to(bias_old, (bb.shape[0], e - a, k_old.shape[2])), bb], axis=-1)
        outs.append(_attention(q[:, a:e], kb, vb, bb, kv_heads, groups))
    return outs[0] if n == 1 else jnp.concatenate(outs, axis=1)


class Decoder(nnx.Module):
    """Decoder-only language model with optional stacked per-agent LoRA.

    Example:
      >>> cfg = ModelConfig.tiny()
      >>> model = Decoder(cfg, LoRAConfig(num_adapters=3, rank=4), rngs=nnx.Rngs(0))
      >>> model(jnp.zeros((2, 5), jnp.int32)).shape
      (2, 5, 128)
    """

    def __init__(self, cfg: ModelConfig, lora: LoRAConfig | None = None, *, dtype=jnp.float32, rngs: nnx.Rngs):
        if cfg.layerwise:
            raise ValueError(
                f"Decoder: architecture {cfg.architecture!r} has heterogeneous layers "
                "(use lora.backbones.LayerwiseDecoder)"
            )
        self.cfg, self.lora_cfg, self.dtype = cfg, lora, dtype
        self.embed = nnx.Param(
            jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.hidden_size), jnp.float32).astype(dtype) * 0.02
        )

        @nnx.split_rngs(splits=cfg.num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make_blocks(rngs: nnx.Rngs) -> Block:
            return Block(cfg, lora, dtype=dtype, rngs=rngs)

        self.blocks = make_blocks(rngs)
        self.final_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)
        self.lm_head = (
            None
            if cfg.tie_embeddings
            else nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (cfg.hidden_size, cfg.vocab_size), dtype))
        )

    def hidden(
        self,
        input_ids: jax.Array,
        *,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        agent_ids: jax.Array | None = None,
        cache: KVCache | None = None,
        cache_size: int | None = None,
        dropout_key: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final-norm hidden states of a chunk of tokens, optionally continuing or starting a KV cache.

        The chunk attends causally to itself (blocked, skipping future keys) and, with ``cache``, to
        every slot of the cache written before it. The chunk's keys and values are written into the
        returned cache once, after the layer scan, so a cache is never copied per layer.

        Args:
          input_ids: int32[B, T].
          attention_mask: bool/int[B, T], 1 for real tokens (padding may sit anywhere); default all 1.
          positions: int32[B, T] RoPE positions; default: the row's next position plus the running
            count of its real tokens (HF's ``cumsum(mask) - 1`` for left padding).
          agent_ids: int32[B] adapter per row, None for the frozen base.
          cache: KV cache the chunk continues (it attends to all S slots of it, masked to the real ones
            before ``cache.index``), or None. Pass a cache no larger than needed: empty slots are masked,
            not skipped.
          cache_size: slots of the returned cache (static), or None: no cache is returned (the chunk
            only reads ``cache``). With ``cache`` it must be >= ``cache.size`` (the cache is grown
            after the layers); the chunk goes to slots ``cache.index .. + T`` (0 .. T for a new
            cache), which must fit.
          dropout_key: enables LoRA dropout when given.

        Returns:
          (h [B, T, D] in the model dtype, the cache holding the chunk, or None).

        Raises:
          ValueError: ``cache_size`` smaller than the cache or than the chunk.
        """
        cfg = self.cfg
        with jax.named_scope("decoder_hidden"):
            b, t = input_ids.shape
            if cache_size is not None and (cache_size < t or (cache is not None and cache_size < cache.size)):
                raise ValueError(
                    f"cache_size={cache_size} cannot hold the cache "
                    f"({0 if cache is None else cache.size} slots) or the chunk ({t} tokens)"
                )
            mask_bt = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
            # Biases built once, not per layer: among the chunk's tokens [B, T, T] (key real and not in
            # the future) and, with a cache, over its slots [B, 1, S] (real and written before the chunk).
            causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
            bias = jnp.where(mask_bt[:, None, :] & causal[None], 0.0, _MASK_VALUE).astype(jnp.float32)
            if cache is None:
                start, index, bias_old = jnp.zeros((b,), jnp.int32), jnp.zeros((), jnp.int32), None
            else:
                start, index = cache.next_pos, cache.index
                old_ok = cache.valid & (jnp.arange(cache.size)[None, :] < index)
                bias_old = jnp.where(old_ok, 0.0, _MASK_VALUE).astype(jnp.float32)[:, None, :]
            if positions is None:
                positions = start[:, None] + jnp.maximum(jnp.cumsum(mask_bt, axis=1) - 1, 0)

            angles = positions.astype(jnp.float32)[..., None] * rope_inv_freq(cfg)
            angles = jnp.concatenate([angles, angles], axis=-1)
            cos, sin = jnp.cos(angles), jnp.sin(angles)

            x = self.embed[...][input_ids]
            layer_keys = jax.random.split(dropout_key, cfg.num_layers) if dropout_key is not None else None
            gd, st = nnx.split(self.blocks)
            want_kv = cache_size is not None

            def body(x, xs):
                st_l, kv_l, key_l = xs
                block = nnx.merge(gd, st_l)
                return block(
                    x,
                    cos=cos,
                    sin=sin,
                    bias=bias,
                    agent_ids=agent_ids,
                    dropout_key=key_l,
                    kv=kv_l,
                    bias_old=bias_old,
                    want_kv=want_kv,
                )

            # The cache is a scan input (read per layer); the scan outputs only the chunk's keys and
            # values [L, B, K, T, H], written below by one update per tensor (in place when the cache
            # buffer is carried by a loop, as in ``generate``).
            kv_in = None if cache is None else (cache.k, cache.v)
            x, kv_new = jax.lax.scan(body, x, (st, kv_in, layer_keys))
            h = self.final_norm(x)
            if not want_kv:
                return h, None
            cache = KVCache.init(cfg, b, cache_size, kv_new[0].dtype) if cache is None else cache.grow(cache_size)
            at = (0, 0, 0, index, 0)
            cache = KVCache(
                k=jax.lax.dynamic_update_slice(cache.k, kv_new[0], at),
                v=jax.lax.dynamic_update_slice(cache.v, kv_new[1], at),
                valid=jax.lax.dynamic_update_slice(cache.valid, mask_bt, (0, index)),
                next_pos=start + mask_bt.sum(axis=1, dtype=jnp.int32),
                index=index + t,
            )
            return h, cache

    def logits(self, h: jax.Array, vocab: jax.Array | None = None) -> jax.Array:
        """Output head: float32[..., V] logits from hidden states [..., D].

        With ``vocab`` only those tokens' head rows are gathered and applied: int32[C] gives float32[..., C] (the
        same C tokens for every row: a menu's letters), int32[..., C] with the leading dims of ``h`` gives each
        row its own C tokens. A restricted choice (``choice_only``) needs the logits of its candidates only; the
        full head (V x D: 6.3 MB for the 2-layer test model, 113 MB for SmolLM2 in float32) was 30% of the test
        model's forward of a 224-token row on a 2-core CPU (BENCHMARKS.md, "Only the letters' head rows").
        """
        head = self.embed[...] if self.lm_head is None else self.lm_head[...]  # [V, D] or [D, V]
        v_axis = 0 if self.lm_head is None else 1
        if vocab is None:
            spec = "...d,vd->...v" if v_axis == 0 else "...d,dv->...v"
            return jnp.einsum(spec, h, head, preferred_element_type=jnp.float32)
        rows = jnp.take(head, vocab, axis=v_axis)  # [*vocab, D] or [D, *vocab]
        if v_axis == 1:
            rows = jnp.moveaxis(rows, 0, -1)
        spec = "...d,cd->...c" if vocab.ndim == 1 else "...d,...cd->...c"
        return jnp.einsum(spec, h, rows, preferred_element_type=jnp.float32)

    def __call__(
        self,
        input_ids: jax.Array,
        *,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        agent_ids: jax.Array | None = None,
        dropout_key: jax.Array | None = None,
    ) -> jax.Array:
        """Full-sequence logits, float32[B, T, V] (no cache). Arguments as in :meth:`hidden`."""
        h, _ = self.hidden(
            input_ids, attention_mask=attention_mask, positions=positions, agent_ids=agent_ids, dropout_key=dropout_key
        )
        return self.logits(h)

    def step(
        self,
        input_ids: jax.Array,
        cache: KVCache | None,
        *,
        attention_mask: jax.Array | None = None,
        agent_ids: jax.Array | None = None,
        cache_size: int | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Appends a chunk to ``cache`` and returns (logits of its last column float32[B, V], cache).

        With left-padded prompts the last column is every row's last real token. ``cache=None`` starts
        a new cache of ``cache_size`` slots; by default the returned cache has ``cache``'s size. See
        :meth:`hidden` for both arguments.

        Raises:
          ValueError: no cache and no ``cache_size``; ``cache_size`` too small (:meth:`hidden`).
        """
        if cache_size is None:
            if cache is None:
                raise ValueError("step without a cache needs cache_size (the slots of the new cache)")
            cache_size = cache.size
        h, cache = self.hidden(
            input_ids, attention_mask=attention_mask, agent_ids=agent_ids, cache=cache, cache_size=cache_size
        )
        return self.logits(h[:, -1]), cache

    #: The cache this model reads and writes (:class:`lora.backbones.LayerwiseDecoder` has its ``LayerCache``).
    cache_type = KVCache


def trainable_filter():
    """The nnx filter selecting adapter weights: only these get gradients and optimizer state."""
    return LoRAParam


def split_model(model: Decoder):
    """Splits a model into (graphdef, adapters, frozen base) for jitted functional code."""
    return nnx.split(model, LoRAParam, ...)
