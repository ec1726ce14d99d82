"""Layer-wise decoders for the heterogeneous-layer backbones: the Gemma 4 and Qwen3.5 text decoders.

:class:`lora.model.Decoder` stacks identical layers and scans them; these two families mix layer kinds
whose weights differ in shape (Gemma 4: sliding layers of ``head_dim`` and full layers of
``global_head_dim``, KV-shared layers without key/value projections, wider MLPs; Qwen3.5: Gated DeltaNet
"linear_attention" layers between gated full-attention layers), so :class:`LayerwiseDecoder` holds a list
of layers and applies them in a Python loop (one compiled copy per layer; these are the small models of
Table 1). The Llama / Qwen2 / Qwen3 path is untouched.

Every rule below names its source, transformers 5.24 (the installed version):

Gemma 4 (``models/gemma4/modeling_gemma4.py``, text decoder ``Gemma4TextModel`` / ``Gemma4ForCausalLM``):
  * ``Gemma4TextScaledWordEmbedding``: token embedding times sqrt(hidden_size).
  * ``Gemma4RMSNorm``: ``(x * (mean(x^2) + eps)^-0.5) * w`` in float32 (plain weight, no 1 + w);
    ``v_norm`` has no weight.
  * ``Gemma4TextAttention``: q_norm / k_norm per head, RoPE, v_norm, softmax scale 1.0; sliding layers see
    keys ``q - sliding_window < s <= q`` (``masking_utils.sliding_window_overlay``); full layers may use
    ``global_head_dim``, and with ``attention_k_eq_v`` values are the key projection (before k_norm) and
    ``num_global_key_value_heads`` kv heads; the last ``num_kv_shared_layers`` layers have no k/v weights and
    reuse the keys / values of the last earlier layer of their kind (``Gemma4TextConfig.kv_sharing_modes``).
  * ``Gemma4TextRotaryEmbedding`` + ``modeling_rope_utils._compute_proportional_rope_parameters``: per-kind
    inverse frequencies; "proportional" rotates ``int(partial_rotary_factor * head_dim // 2)`` frequency pairs
    and leaves the rest at frequency 0 (cos 1, sin 0), divided by ``factor``.
  * ``Gemma4TextDecoderLayer``: ``x + post_attention_layernorm(attn(input_layernorm(x)))``, then
    ``x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))`` with a GeGLU MLP
    (``gelu_pytorch_tanh``; 2x wide on KV-shared layers with ``use_double_wide_mlp``), then the per-layer
    embedding (PLE) residual ``x + post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(x))
    * ple_i))``, then ``x * layer_scalar``.
  * ``Gemma4TextModel.get_per_layer_inputs`` / ``project_per_layer_inputs``: ``ple = (norm(reshape(
    per_layer_model_projection(e) / sqrt(D))) + embed_tokens_per_layer(ids) * sqrt(P)) / sqrt(2)`` where e is
    the scaled token embedding, P = ``hidden_size_per_layer_input``.
  * ``Gemma4ForCausalLM.forward``: ``tanh(logits / c) * c`` with ``final_logit_softcapping`` c.

Qwen3.5 (``models/qwen3_5/modeling_qwen3_5.py``, ``Qwen3_5TextModel`` / ``Qwen3_5ForCausalLM``):
  * ``Qwen3_5RMSNorm``: ``x / rms(x) * (1 + w)`` in float32 (weights stored zero-centred).
  * ``Qwen3_5Attention``: q_proj emits [query | gate] per head; q/k norms, partial RoPE on the first
    ``head_dim * partial_rotary_factor`` dims (``apply_rotary_pos_emb``), scale head_dim^-0.5, output times
    sigmoid(gate), then o_proj. Text-only positions make the 3-axis mRoPE the plain 1-axis RoPE
    (``Qwen3_5TextRotaryEmbedding.recomposition_frequencies`` with equal position ids).
  * ``Qwen3_5GatedDeltaNet``: padding rows zeroed, in_proj_qkv -> depthwise causal conv1d (kernel
    ``linear_conv_kernel_dim``, ``causal_conv1d_fn``) -> silu -> split q, k, v; beta = sigmoid(in_proj_b x),
    g = -exp(A_log) * softplus(in_proj_a x + dt_bias); q, k l2-normalised (``l2norm``, eps 1e-6), q / sqrt(dk),
    repeated to the value heads; the gated delta rule ``S <- S e^g; S <- S + k (beta (v - k^T S))^T; o = q^T S``
    (``torch_recurrent_gated_delta_rule``; the chunked form used for prompts is the same recurrence);
    ``Qwen3_5RMSNormGated``: ``w * rms_norm(o) * silu(z)``; out_proj.

LoRA adapters attach, as in :class:`lora.model.Decoder`, to the q/k/v/o projections of every softmax-attention
layer and to the gate/up/down projections of every MLP (PEFT ``target_modules`` names); the Gated DeltaNet
projections, the PLE projections and KV-shared layers' missing k/v stay frozen. Decoding continues a
:class:`LayerCache` (keys / values of the softmax layers, conv inputs and delta-rule state of the Gated DeltaNet
layers); the full-sequence forward is the same code on an empty cache. A padding token (mask 0) is neutral
wherever it sits, so a row continuing a shared prefix cache after left padding gets the logits of its unpadded
sequence: attention masks its slot, Gemma's sliding window counts positions (not slots), and a Gated DeltaNet
layer skips it in the conv window and the delta rule (HF pads only before a sequence, where both rules agree
with HF's). :class:`LayerwiseDecoder` is called through the one model protocol of :class:`lora.model.Decoder`
(``hidden``, ``logits``, ``__call__``, ``step``, ``cache_type``).

Shapes: B batch, T time, D model width, Hq query heads, K kv heads, H head width, V vocabulary.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from lora.config import LoRAConfig, ModelConfig
from lora.model import _MASK_VALUE, Decoder, KVCache, LoRALinear


@flax.struct.dataclass
class LayerCache:
    """Per-layer decoding state of a :class:`LayerwiseDecoder`, written slot by slot like
    :class:`lora.model.KVCache` (slots shared across rows, a row's padding slots invalid), with the same methods
    (:meth:`prefill`, :meth:`full`, :meth:`floats`, :meth:`take`, :meth:`broadcast`, :meth:`grow`, ``size``,
    ``rows``), so sampling, the compiled rollout and the train step call one cache protocol
    (``model.cache_type``).

    Attributes:
      k, v: per layer, keys / values [B, S, K_l, H_l] of a softmax-attention layer that computes its own
        (None for Gemma 4's KV-shared layers, which read their producer's, and for Gated DeltaNet layers).
      conv: per layer, the last ``linear_conv_kernel_dim - 1`` conv inputs [B, kernel - 1, C] of a Gated
        DeltaNet layer (HF ``cache.update_conv_state``), else None.
      state: per layer, the delta-rule state float32[B, nv, dk, dv] of a Gated DeltaNet layer (HF
        ``cache.update_recurrent_state``), else None.
      valid: bool[B, S], slot holds a real token of that row.
      pos: int32[B, S], RoPE position of the token in each slot (Gemma's sliding window is a window of positions,
        so padding slots between a shared prefix and a row's tokens do not shorten it).
      next_pos: int32[B], RoPE position of the row's next real token.
      index: int32[], next slot to write.
    """

    k: tuple
    v: tuple
    conv: tuple
    state: tuple
    valid: jax.Array
    pos: jax.Array
    next_pos: jax.Array
    index: jax.Array

    @classmethod
    def init(cls, model: LayerwiseDecoder, batch: int, size: int) -> LayerCache:
        """An empty cache with ``size`` slots per row (dtypes: the model's; the delta-rule state float32)."""
        k, v, conv, state = [], [], [], []
        for layer in model.layers:
            kv_shape = layer.kv_shape(batch, size)
            k.append(None if kv_shape is None else jnp.zeros(kv_shape, model.dtype))
            v.append(None if kv_shape is None else jnp.zeros(kv_shape, model.dtype))
            lin = getattr(layer, "linear_attn", None)
            conv.append(None if lin is None else jnp.zeros((batch, lin.kernel - 1, lin.channels), model.dtype))
            state.append(None if lin is None else jnp.zeros((batch, lin.nv, lin.dk, lin.dv), jnp.float32))
        return cls(
            k=tuple(k),
            v=tuple(v),
            conv=tuple(conv),
            state=tuple(state),
            valid=jnp.zeros((batch, size), bool),
            pos=jnp.zeros((batch, size), jnp.int32),
            next_pos=jnp.zeros((batch,), jnp.int32),
            index=jnp.zeros((), jnp.int32),
        )

    # The shared prompt prefix, once per adapter: :meth:`lora.model.KVCache.prefill` (it only calls
    # ``model.hidden``, so one definition serves both caches).
    prefill = KVCache.prefill

    def floats(self) -> tuple:
        """The float leaves a prefix cache is differentiated through: ``(k, v, conv, state)`` (tuples per layer,
        None where a layer has none); :meth:`full` rebuilds the cache from them."""
        return self.k, self.v, self.conv, self.state

    @classmethod
    def full(cls, k: tuple, v: tuple, conv: tuple, state: tuple) -> LayerCache:
        """The cache of a whole prefix from :meth:`floats`: every slot real (positions 0 .. P - 1), none free.

        :meth:`prefill` at the default capacity equals ``full(*cache.floats())``.

        Raises:
          ValueError: no layer with keys (a model without softmax attention: P is not known from the floats).
        """
        ref = next((a for a in k if a is not None), None)
        if ref is None:
            raise ValueError("LayerCache.full: no softmax-attention layer holds keys, so the prefix length is unknown")
        b, p = ref.shape[0], ref.shape[1]
        return cls(
            k=tuple(k),
            v=tuple(v),
            conv=tuple(conv),
            state=tuple(state),
            valid=jnp.ones((b, p), bool),
            pos=jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p)),
            next_pos=jnp.full((b,), p, jnp.int32),
            index=jnp.asarray(p, jnp.int32),
        )

    @property
    def size(self) -> int:
        return self.valid.shape[1]

    @property
    def rows(self) -> int:
        """B, the batch rows."""
        return self.valid.shape[0]

    def grow(self, size: int) -> LayerCache:
        """Pads the slot axis to ``size`` slots (no-op if already that large)."""
        extra = size - self.size
        if extra <= 0:
            return self
        pad = lambda a: None if a is None else jnp.pad(a, ((0, 0), (0, extra), (0, 0), (0, 0)))
        return self.replace(
            k=tuple(map(pad, self.k)),
            v=tuple(map(pad, self.v)),
            valid=jnp.pad(self.valid, ((0, 0), (0, extra))),
            pos=jnp.pad(self.pos, ((0, 0), (0, extra))),
        )

    def take(self, rows: jax.Array) -> LayerCache:
        """The cache of batch rows int32[B]."""
        sel = lambda a: None if a is None else a[rows]
        return LayerCache(
            k=tuple(map(sel, self.k)),
            v=tuple(map(sel, self.v)),
            conv=tuple(map(sel, self.conv)),
            state=tuple(map(sel, self.state)),
            valid=self.valid[rows],
            pos=self.pos[rows],
            next_pos=self.next_pos[rows],
            index=self.index,
        )

    def broadcast(self, batch: int) -> LayerCache:
        """Repeats a batch-1 cache (a shared prompt prefix) to ``batch`` rows."""
        return self.take(jnp.zeros((batch,), jnp.int32))


class Norm(nnx.Module):
    """RMSNorm in float32 with the weight applied in float32 before the cast back.

    ``plus_one``: Qwen3.5 ``Qwen3_5RMSNorm`` (``1 + w``, w initialised 0); otherwise Gemma 4 ``Gemma4RMSNorm``
    (``w``, initialised 1). ``with_scale=False``: Gemma 4's weightless ``v_norm``. Works on [..., dim].
    """

    def __init__(self, dim: int, *, eps: float, plus_one: bool = False, with_scale: bool = True, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.full((dim,), 0.0 if plus_one else 1.0, dtype)) if with_scale else None
        self.eps, self.plus_one = eps, plus_one

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.weight is not None:
            w = self.weight[...].astype(jnp.float32)
            x32 = x32 * (1.0 + w if self.plus_one else w)
        return x32.astype(x.dtype)


def _act(name: str, x: jax.Array) -> jax.Array:
    """HF ``ACT2FN``: "silu" or "gelu_pytorch_tanh" (tanh-approximate GELU)."""
    return jax.nn.silu(x) if name == "silu" else jax.nn.gelu(x, approximate=True)


def kind_head(cfg: ModelConfig, kind: str) -> tuple[int, int]:
    """(head width, kv heads) of a layer kind (Gemma 4 ``Gemma4TextConfig.__post_init__`` per_layer_config:
    full layers take ``global_head_dim`` and ``num_global_key_value_heads``, resolved by
    :func:`lora.hf_loader.config_from_hf`)."""
    if kind == "full_attention" and cfg.architecture == "gemma4":
        return cfg.global_head_dim or cfg.head_dim, cfg.num_global_kv_heads or cfg.num_kv_heads
    return cfg.head_dim, cfg.num_kv_heads


def kind_inv_freq(cfg: ModelConfig, kind: str) -> jax.Array:
    """float32[R/2] inverse frequencies of a layer kind's RoPE; R (= 2 x length) dims rotate, the rest pass.

    Gemma 4: ``Gemma4TextRotaryEmbedding.compute_default_rope_parameters`` ("default", R = head width) or
    ``_compute_proportional_rope_parameters`` ("proportional", R = head width with zero frequencies).
    Qwen3.5: ``Qwen3_5TextRotaryEmbedding.compute_default_rope_parameters`` (R = head_dim x
    partial_rotary_factor).

    Raises:
      ValueError: on another rope_type.
    """
    h, _ = kind_head(cfg, kind)
    params = dict(dict(cfg.layer_rope or ()).get(kind, ()) or ())
    theta = float(params.get("rope_theta", cfg.rope_theta))
    rope_type = params.get("rope_type", "default")
    partial = float(params.get("partial_rotary_factor", 1.0))
    if rope_type == "proportional":
        n_rot = int(partial * h // 2)
        inv = 1.0 / (theta ** (jnp.arange(0, 2 * n_rot, 2, dtype=jnp.float32) / h))
        inv = jnp.concatenate([inv, jnp.zeros((h // 2 - n_rot,), jnp.float32)])
        return inv / float(params.get("factor", 1.0))
    if rope_type != "default":
        raise ValueError(f"{cfg.architecture}: unsupported rope_type {rope_type!r} for {kind} layers")
    dim = h if cfg.architecture == "gemma4" else int(h * partial)
    return 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))


def rope_partial(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """RoPE on the first R dims of x [B, T, heads, H] (rotate_half within them), the rest unchanged.

    cos / sin: float32[B, T, R]. Source: Qwen3.5 ``apply_rotary_pos_emb`` (R = H for Gemma 4).
    """
    r = cos.shape[-1]
    x32 = x.astype(jnp.float32)
    xr, xp = x32[..., :r], x32[..., r:]
    rot = jnp.concatenate([-xr[..., r // 2 :], xr[..., : r // 2]], axis=-1)
    out = xr * cos[:, :, None] + rot * sin[:, :, None]
    return jnp.concatenate([out, xp], axis=-1).astype(x.dtype)


def softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array, scale: float) -> jax.Array:
    """Grouped-query attention: q [B, T, Hq, H], k/v [B, S, K, H], bias float32[B, T, S] -> [B, T, Hq*H].

    Query head j uses kv head j // (Hq / K) (HF ``repeat_kv``); softmax in float32 (``eager_attention_forward``).
    """
    b, t, hq, h = q.shape
    kk = k.shape[2]
    g = hq // kk
    qg = q.reshape(b, t, kk, g, h)
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    probs = jax.nn.softmax(scores + bias[:, None, None], axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v)
    return out.reshape(b, t, hq * h)


class MLP(nnx.Module):
    """Gated MLP ``down(act(gate(x)) * up(x))`` (HF ``Gemma4TextMLP`` / ``Qwen3_5MLP``) with LoRA targets."""

    def __init__(self, cfg: ModelConfig, width: int, lora: LoRAConfig | None, *, dtype, rngs: nnx.Rngs):
        lo = lambda name: lora if (lora is not None and name in lora.targets) else None
        d = cfg.hidden_size
        self.gate_proj = LoRALinear(d, width, use_bias=False, lora=lo("gate_proj"), dtype=dtype, rngs=rngs)
        self.up_proj = LoRALinear(d, width, use_bias=False, lora=lo("up_proj"), dtype=dtype, rngs=rngs)
        self.down_proj = LoRALinear(width, d, use_bias=False, lora=lo("down_proj"), dtype=dtype, rngs=rngs)
        self.act = cfg.hidden_activation

    def __call__(self, x, agent_ids, keys):
        g = self.gate_proj(x, agent_ids, keys[0])
        u = self.up_proj(x, agent_ids, keys[1])
        return self.down_proj(_act(self.act, g) * u, agent_ids, keys[2])


class GemmaLayer(nnx.Module):
    """One Gemma 4 text decoder layer (``Gemma4TextDecoderLayer``); see the module docstring for the rules."""

    def __init__(self, cfg: ModelConfig, index: int, lora: LoRAConfig | None, *, dtype, rngs: nnx.Rngs):
        lo = lambda name: lora if (lora is not None and name in lora.targets) else None
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.kind = cfg.layer_types[index]
        self.shared = index >= cfg.num_layers - cfg.num_kv_shared_layers
        h, kk = kind_head(cfg, self.kind)
        self.head_dim, self.num_heads, self.num_kv_heads = h, cfg.num_heads, kk
        self.k_eq_v = cfg.attention_k_eq_v and self.kind == "full_attention"
        norm = lambda n, **kw: Norm(n, eps=eps, dtype=dtype, **kw)
        bias = cfg.qkv_bias
        self.input_layernorm = norm(d)
        self.q_proj = LoRALinear(d, cfg.num_heads * h, use_bias=bias, lora=lo("q_proj"), dtype=dtype, rngs=rngs)
        self.q_norm = norm(h)
        if not self.shared:
            self.k_proj = LoRALinear(d, kk * h, use_bias=bias, lora=lo("k_proj"), dtype=dtype, rngs=rngs)
            self.v_proj = (
                None if self.k_eq_v else LoRALinear(d, kk * h, use_bias=bias, lora=lo("v_proj"), dtype=dtype, rngs=rngs)
            )
            self.k_norm = norm(h)
            self.v_norm = norm(h, with_scale=False)
        else:
            self.k_proj = self.v_proj = self.k_norm = self.v_norm = None
        self.o_proj = LoRALinear(cfg.num_heads * h, d, use_bias=bias, lora=lo("o_proj"), dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = norm(d)
        self.pre_feedforward_layernorm = norm(d)
        wide = 2 if (cfg.use_double_wide_mlp and self.shared) else 1
        self.mlp = MLP(cfg, cfg.intermediate_size * wide, lora, dtype=dtype, rngs=rngs)
        self.post_feedforward_layernorm = norm(d)
        p = cfg.hidden_size_per_layer_input
        if p:
            self.per_layer_input_gate = LoRALinear(d, p, use_bias=False, lora=None, dtype=dtype, rngs=rngs)
            self.per_layer_projection = LoRALinear(p, d, use_bias=False, lora=None, dtype=dtype, rngs=rngs)
            self.post_per_layer_input_norm = norm(d)
        else:
            self.per_layer_input_gate = self.per_layer_projection = self.post_per_layer_input_norm = None
        self.layer_scalar = nnx.Param(jnp.ones((1,), dtype))
        self.act = cfg.hidden_activation

    def kv_shape(self, batch: int, size: int) -> tuple[int, ...] | None:
        """Shape [B, S, K, H] of this layer's cached keys (and values); None for a KV-shared layer."""
        return None if self.shared else (batch, size, self.num_kv_heads, self.head_dim)

    def __call__(self, x, *, rope, bias, ple, shared_kv, kv, index, agent_ids, keys):
        """Applies the layer to a chunk.

        Args:
          x: [B, T, D] residual stream.
          rope: (cos, sin) float32[B, T, H] of this layer kind.
          bias: float32[B, T, S] additive bias of this kind over the S cache slots (the chunk written at
            ``index``): 0 for a real key slot not after the query (within the window for sliding layers).
          ple: [B, T, P] this layer's per-layer input, or None.
          shared_kv: dict kind -> (k, v) [B, S, K, H] cache buffers, read by KV-shared layers and written by
            the others (HF ``shared_kv_states``: the last unshared layer of a kind is the one stored).
          kv: (k, v) cache buffers [B, S, K, H] of this layer before the chunk, None for a KV-shared layer.
          index: int32[] slot of the chunk's first token.

        Returns:
          (x [B, T, D], the (k, v) buffers with the chunk written, or None for a KV-shared layer).
        """
        b, t, _ = x.shape
        h = self.head_dim
        cos, sin = rope
        y = self.input_layernorm(x)
        q = self.q_proj(y, agent_ids, keys[0]).reshape(b, t, self.num_heads, h)
        q = rope_partial(self.q_norm(q), cos, sin)
        if self.shared:
            k, v = shared_kv[self.kind]
            new = None
        else:
            k = self.k_proj(y, agent_ids, keys[1]).reshape(b, t, -1, h)
            v = k if self.v_proj is None else self.v_proj(y, agent_ids, keys[2]).reshape(b, t, -1, h)
            k = rope_partial(self.k_norm(k), cos, sin)
            v = self.v_norm(v)
            at = (0, index, 0, 0)
            k = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), at)
            v = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), at)
            shared_kv[self.kind] = new = (k, v)
        att = softmax_attention(q, k, v, bias, 1.0).astype(x.dtype)
        x = x + self.post_attention_layernorm(self.o_proj(att, agent_ids, keys[3]))
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x), agent_ids, keys[4:7]))
        if self.per_layer_input_gate is not None:
            z = _act(self.act, self.per_layer_input_gate(x)) * ple
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(z))
        return x * self.layer_scalar[...], new


class GatedDeltaNet(nnx.Module):
    """Qwen3.5 linear-attention token mixer (``Qwen3_5GatedDeltaNet``) on a chunk, continuing its conv inputs and
    delta-rule state (padding tokens leave both unchanged).

    Weights: in_proj_qkv [D -> 2 Kd + Vd], in_proj_z [D -> Vd], in_proj_b / in_proj_a [D -> nv], conv1d
    weight [2 Kd + Vd, 1, kernel] (HF Conv1d layout, depthwise), dt_bias / A_log [nv], norm weight [dv],
    out_proj [Vd -> D], with Kd = nk dk and Vd = nv dv.
    """

    def __init__(self, cfg: ModelConfig, *, dtype, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.nk, self.nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        kd, vd = self.nk * self.dk, self.nv * self.dv
        lin = lambda i, o: LoRALinear(i, o, use_bias=False, lora=None, dtype=dtype, rngs=rngs)
        self.in_proj_qkv = lin(d, 2 * kd + vd)
        self.in_proj_z = lin(d, vd)
        self.in_proj_b = lin(d, self.nv)
        self.in_proj_a = lin(d, self.nv)
        self.conv1d = nnx.Param(jnp.zeros((2 * kd + vd, 1, cfg.linear_conv_kernel_dim), dtype))
        self.dt_bias = nnx.Param(jnp.ones((self.nv,), dtype))
        self.A_log = nnx.Param(jnp.zeros((self.nv,), dtype))
        self.norm = Norm(self.dv, eps=cfg.rms_norm_eps, dtype=dtype)
        self.out_proj = lin(vd, d)
        self.act = cfg.hidden_activation
        self.kernel, self.channels = cfg.linear_conv_kernel_dim, 2 * kd + vd

    def __call__(self, x: jax.Array, mask: jax.Array, conv_prev: jax.Array, s0: jax.Array):
        """Applies the mixer to a chunk.

        Args:
          x: [B, T, D]; mask: bool[B, T] (padding rows are zeroed first, HF ``apply_mask_to_padding_states``).
          conv_prev: [B, kernel - 1, C] conv inputs before the chunk (zeros at the start: the causal zero pad).
          s0: float32[B, nv, dk, dv] delta-rule state before the chunk (zeros at the start).

        Returns:
          (out [B, T, D], conv inputs [B, kernel - 1, C] and state after the chunk).
        """
        b, t, _ = x.shape
        x = x * mask[:, :, None].astype(x.dtype)
        qkv = self.in_proj_qkv(x)  # [B, T, C]
        w = self.conv1d[...][:, 0, :]  # [C, kernel]
        n = w.shape[1]
        # The causal conv runs over the row's real inputs only: its stream is the kernel - 1 inputs before the
        # chunk, then the chunk's real tokens in order (padding dropped), and a real token's window is its last n
        # entries. Without padding this is HF's ``causal_conv1d_fn`` over [conv_prev | qkv]; with HF's left padding
        # at the sequence start too (the zeroed padding inputs equal the causal zero pad); padding between a shared
        # prefix and a row's tokens (the prefix-cached rollout and update) then leaves the row's result unchanged.
        count = jnp.cumsum(mask, axis=1, dtype=jnp.int32)  # [B, T] real tokens up to t
        dest = jnp.where(mask, n - 2 + count, n - 1 + t)  # stream slot of each real token; padding: dropped
        stream = jnp.concatenate([conv_prev.astype(qkv.dtype), jnp.zeros_like(qkv)], axis=1)  # [B, n - 1 + T, C]
        stream = jax.vmap(lambda s_, d_, v_: s_.at[d_].set(v_, mode="drop"))(stream, dest, qkv)
        last = n - 2 + jnp.maximum(count, 1)  # a token's newest stream entry (padding rows: any in range)
        window = lambda j: jnp.take_along_axis(stream, (last - (n - 1) + j)[..., None], axis=1)
        conv = sum(window(j) * w[:, j] for j in range(n))
        n_real = count[:, -1:] if t else jnp.zeros((b, 1), jnp.int32)
        conv_next = jnp.take_along_axis(stream, (n_real + jnp.arange(n - 1))[..., None], axis=1)
        qkv = _act(self.act, conv)
        kd = self.nk * self.dk
        q = qkv[..., :kd].reshape(b, t, self.nk, self.dk).astype(jnp.float32)
        k = qkv[..., kd : 2 * kd].reshape(b, t, self.nk, self.dk).astype(jnp.float32)
        v = qkv[..., 2 * kd :].reshape(b, t, self.nv, self.dv).astype(jnp.float32)
        beta = jax.nn.sigmoid(self.in_proj_b(x).astype(jnp.float32))  # [B, T, nv]
        a = self.in_proj_a(x).astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a + self.dt_bias[...])
        # A padding token leaves the state as it is (no decay, no write): HF's left padding precedes the state, which
        # is still zero there, so this only matters for padding after a prefix (see the conv above).
        g, beta = jnp.where(mask[..., None], g, 0.0), jnp.where(mask[..., None], beta, 0.0)
        rep = self.nv // self.nk
        q, k = jnp.repeat(q, rep, axis=2), jnp.repeat(k, rep, axis=2)
        l2 = lambda u: u * jax.lax.rsqrt(jnp.sum(u * u, axis=-1, keepdims=True) + 1e-6)
        q, k = l2(q) / math.sqrt(self.dk), l2(k)

        def step(s, xs):  # s [B, nv, dk, dv]
            q_t, k_t, v_t, g_t, b_t = xs
            s = s * jnp.exp(g_t)[..., None, None]
            mem = jnp.einsum("bhkv,bhk->bhv", s, k_t)
            delta = (v_t - mem) * b_t[..., None]
            s = s + k_t[..., :, None] * delta[..., None, :]
            return s, jnp.einsum("bhkv,bhk->bhv", s, q_t)

        tm = lambda u: jnp.moveaxis(u, 1, 0)
        s_end, o = jax.lax.scan(step, s0, (tm(q), tm(k), tm(v), tm(g), tm(beta)))
        o = jnp.moveaxis(o, 0, 1)  # [B, T, nv, dv]
        z = self.in_proj_z(x).reshape(b, t, self.nv, self.dv)
        o = self.norm(o) * jax.nn.silu(z.astype(jnp.float32))
        return self.out_proj(o.reshape(b, t, -1).astype(x.dtype)), conv_next, s_end


class Qwen35Layer(nnx.Module):
    """One Qwen3.5 decoder layer (``Qwen3_5DecoderLayer``): token mixer (Gated DeltaNet or gated attention)
    and SwiGLU MLP, pre-norm with (1 + w) RMSNorms, both residual."""

    def __init__(self, cfg: ModelConfig, index: int, lora: LoRAConfig | None, *, dtype, rngs: nnx.Rngs):
        lo = lambda name: lora if (lora is not None and name in lora.targets) else None
        d, eps, h = cfg.hidden_size, cfg.rms_norm_eps, cfg.head_dim
        self.kind = cfg.layer_types[index]
        norm = lambda n: Norm(n, eps=eps, plus_one=True, dtype=dtype)
        self.input_layernorm = norm(d)
        self.head_dim, self.num_heads, self.num_kv_heads = h, cfg.num_heads, cfg.num_kv_heads
        if self.kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, dtype=dtype, rngs=rngs)
            self.q_proj = self.k_proj = self.v_proj = self.o_proj = self.q_norm = self.k_norm = None
        else:
            self.linear_attn = None
            bias, kk = cfg.qkv_bias, cfg.num_kv_heads
            self.q_proj = LoRALinear(d, 2 * cfg.num_heads * h, use_bias=bias, lora=lo("q_proj"), dtype=dtype, rngs=rngs)
            self.k_proj = LoRALinear(d, kk * h, use_bias=bias, lora=lo("k_proj"), dtype=dtype, rngs=rngs)
            self.v_proj = LoRALinear(d, kk * h, use_bias=bias, lora=lo("v_proj"), dtype=dtype, rngs=rngs)
            self.o_proj = LoRALinear(cfg.num_heads * h, d, use_bias=bias, lora=lo("o_proj"), dtype=dtype, rngs=rngs)
            self.q_norm, self.k_norm = norm(h), norm(h)
        self.post_attention_layernorm = norm(d)
        self.mlp = MLP(cfg, cfg.intermediate_size, lora, dtype=dtype, rngs=rngs)

    def kv_shape(self, batch: int, size: int) -> tuple[int, ...] | None:
        """Shape [B, S, K, H] of this layer's cached keys; None for a Gated DeltaNet layer."""
        return None if self.linear_attn is not None else (batch, size, self.num_kv_heads, self.head_dim)

    def __call__(self, x, *, rope, bias, mask, kv, conv, state, index, agent_ids, keys):
        """Applies the layer to a chunk: x [B, T, D]; rope (cos, sin) float32[B, T, R]; bias float32[B, T, S]
        (causal, real key slots); mask bool[B, T]; kv (k, v) buffers [B, S, K, H] of a full-attention layer,
        conv / state the Gated DeltaNet state (:class:`LayerCache`), the others None; index int32[] slot of the
        chunk's first token. Returns (x, kv, conv, state) with the chunk written in."""
        b, t, _ = x.shape
        y = self.input_layernorm(x)
        if self.linear_attn is not None:
            out, conv, state = self.linear_attn(y, mask, conv, state)
            x = x + out
        else:
            h = self.head_dim
            qg = self.q_proj(y, agent_ids, keys[0]).reshape(b, t, self.num_heads, 2 * h)
            q, gate = qg[..., :h], qg[..., h:].reshape(b, t, -1)
            k = self.k_proj(y, agent_ids, keys[1]).reshape(b, t, -1, h)
            v = self.v_proj(y, agent_ids, keys[2]).reshape(b, t, -1, h)
            cos, sin = rope
            q, k = rope_partial(self.q_norm(q), cos, sin), rope_partial(self.k_norm(k), cos, sin)
            at = (0, index, 0, 0)
            kv = (
                jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), at),
                jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), at),
            )
            att = softmax_attention(q, kv[0], kv[1], bias, h**-0.5).astype(x.dtype)
            att = att * jax.nn.sigmoid(gate)
            x = x + self.o_proj(att, agent_ids, keys[3])
        return x + self.mlp(self.post_attention_layernorm(x), agent_ids, keys[4:7]), kv, conv, state


class LayerwiseDecoder(nnx.Module):
    """Gemma 4 / Qwen3.5 text decoder with optional stacked per-agent LoRA; the :class:`lora.model.Decoder`
    methods (``hidden``, ``logits``, ``__call__``, ``step``) with a :class:`LayerCache`.

    Example:
      >>> model = LayerwiseDecoder(cfg, LoRAConfig(num_adapters=2, rank=4), rngs=nnx.Rngs(0))  # doctest: +SKIP
      >>> model(jnp.zeros((2, 5), jnp.int32)).shape  # doctest: +SKIP
      (2, 5, cfg.vocab_size)
    """

    def __init__(self, cfg: ModelConfig, lora: LoRAConfig | None = None, *, dtype=jnp.float32, rngs: nnx.Rngs):
        if not cfg.layerwise:
            raise ValueError(f"LayerwiseDecoder: architecture {cfg.architecture!r} uses lora.model.Decoder")
        self.cfg, self.lora_cfg, self.dtype = cfg, lora, dtype
        d = cfg.hidden_size
        self.embed = nnx.Param(jax.random.normal(rngs.params(), (cfg.vocab_size, d), jnp.float32).astype(dtype) * 0.02)
        gemma = cfg.architecture == "gemma4"
        layer = GemmaLayer if gemma else Qwen35Layer
        self.layers = nnx.List([layer(cfg, i, lora, dtype=dtype, rngs=rngs) for i in range(cfg.num_layers)])
        self.final_norm = Norm(d, eps=cfg.rms_norm_eps, plus_one=not gemma, dtype=dtype)
        self.lm_head = (
            None
            if cfg.tie_embeddings
            else nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (d, cfg.vocab_size), dtype))
        )
        p = cfg.hidden_size_per_layer_input
        if gemma and p:
            rows = cfg.vocab_size_per_layer_input
            self.embed_per_layer = nnx.Param(jnp.zeros((rows, cfg.num_layers * p), dtype))
            self.per_layer_model_projection = LoRALinear(
                d, cfg.num_layers * p, use_bias=False, lora=None, dtype=dtype, rngs=rngs
            )
            self.per_layer_projection_norm = Norm(p, eps=cfg.rms_norm_eps, dtype=dtype)
        else:
            self.embed_per_layer = self.per_layer_model_projection = self.per_layer_projection_norm = None

    def hidden(
        self,
        input_ids: jax.Array,
        *,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        agent_ids: jax.Array | None = None,
        cache: LayerCache | None = None,
        cache_size: int | None = None,
        dropout_key: jax.Array | None = None,
    ) -> tuple[jax.Array, LayerCache | None]:
        """Final-norm hidden states of a chunk, optionally continuing or starting a cache (arguments and cache
        semantics as :meth:`lora.model.Decoder.hidden`).

        Without a cache the chunk runs on an empty one of T slots, so the full-sequence forward and cached
        decoding are one path: the chunk's keys are written at slots ``index .. index + T`` and every query
        attends over all S slots, masked to real key slots not after it (and, on Gemma's sliding layers, within
        ``sliding_window`` positions, HF ``sliding_window_overlay``); a Gated DeltaNet layer continues its conv
        inputs and delta-rule state. A chunk continuing ``cache`` without ``cache_size`` (it only reads the cache)
        runs on the cache grown by T slots, so a full prefix cache (:meth:`LayerCache.full`) serves it as in
        :class:`lora.model.Decoder`.

        Returns:
          (h [B, T, D] in the model dtype, the cache holding the chunk, or None without ``cache_size``).

        Raises:
          ValueError: ``cache_size`` smaller than the cache or than the chunk.
        """
        cfg = self.cfg
        b, t = input_ids.shape
        if cache_size is not None and (cache_size < t or (cache is not None and cache_size < cache.size)):
            raise ValueError(
                f"cache_size={cache_size} cannot hold the cache "
                f"({0 if cache is None else cache.size} slots) or the chunk ({t} tokens)"
            )
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        if cache is None:
            cache = LayerCache.init(self, b, cache_size or t)
        else:
            # The chunk is written into the cache before attending (one path for every layer kind), so a chunk that
            # only reads ``cache`` (no ``cache_size``: scoring, a letter choice) gets T more slots, a full prefix
            # cache included; with ``cache_size`` the slots index .. index + T must fit, as in Decoder.hidden.
            cache = cache.grow(cache.size + t if cache_size is None else cache_size)
        index, start = cache.index, cache.next_pos
        if positions is None:
            positions = start[:, None] + jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
        positions = positions.astype(jnp.int32)
        valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, index))
        key_pos = jax.lax.dynamic_update_slice(cache.pos, positions, (0, index))
        qi, si = index + jnp.arange(t)[:, None], jnp.arange(cache.size)[None, :]
        causal = (valid[:, None, :] & (si <= qi)[None]).astype(bool)  # [B, T, S]
        allowed = {"full_attention": causal}
        if cfg.sliding_window:
            # HF sliding_window_overlay: q - W < k <= q, in positions (a slot's position, not its index: the
            # padding slots between a shared prefix and a left-padded row then do not shorten the window; with
            # padding only before a row's tokens, as HF's left padding, the two agree).
            allowed["sliding_attention"] = causal & (key_pos[:, None, :] > positions[:, :, None] - cfg.sliding_window)
        biases = {kind: jnp.where(ok, 0.0, _MASK_VALUE).astype(jnp.float32) for kind, ok in allowed.items()}
        ropes = {}
        for kind in sorted(set(cfg.layer_types)):
            if kind == "linear_attention":
                continue
            ang = positions.astype(jnp.float32)[..., None] * kind_inv_freq(cfg, kind)
            ang = jnp.concatenate([ang, ang], axis=-1)
            ropes[kind] = (jnp.cos(ang), jnp.sin(ang))

        x = self.embed[...][input_ids]
        gemma = cfg.architecture == "gemma4"
        ple = None
        if gemma:
            # Gemma4TextScaledWordEmbedding: the scale is cast to the weight dtype first.
            x = x * jnp.asarray(cfg.hidden_size**0.5, x.dtype)
            if self.embed_per_layer is not None:
                p, n = cfg.hidden_size_per_layer_input, cfg.num_layers
                tok = self.embed_per_layer[...][input_ids] * jnp.asarray(p**0.5, x.dtype)
                proj = self.per_layer_model_projection(x) * jnp.asarray(cfg.hidden_size**-0.5, x.dtype)
                proj = self.per_layer_projection_norm(proj.reshape(b, t, n, p))
                ple = (proj + tok.reshape(b, t, n, p)) * jnp.asarray(2.0**-0.5, x.dtype)
        n_keys = 7 * cfg.num_layers
        keys = list(jax.random.split(dropout_key, n_keys)) if dropout_key is not None else [None] * n_keys
        shared_kv: dict = {}
        ks, vs, convs, states = list(cache.k), list(cache.v), list(cache.conv), list(cache.state)
        for i, layer in enumerate(self.layers):
            lk = keys[7 * i : 7 * i + 7]
            kv = None if ks[i] is None else (ks[i], vs[i])
            if gemma:
                x, kv = layer(
                    x,
                    rope=ropes[layer.kind],
                    bias=biases[layer.kind],
                    ple=None if ple is None else ple[:, :, i],
                    shared_kv=shared_kv,
                    kv=kv,
                    index=index,
                    agent_ids=agent_ids,
                    keys=lk,
                )
            else:
                x, kv, convs[i], states[i] = layer(
                    x,
                    rope=ropes.get("full_attention"),
                    bias=biases["full_attention"],
                    mask=mask,
                    kv=kv,
                    conv=convs[i],
                    state=states[i],
                    index=index,
                    agent_ids=agent_ids,
                    keys=lk,
                )
            if kv is not None:
                ks[i], vs[i] = kv
        h = self.final_norm(x)
        if cache_size is None:
            return h, None
        return h, LayerCache(
            k=tuple(ks),
            v=tuple(vs),
            conv=tuple(convs),
            state=tuple(states),
            valid=valid,
            pos=key_pos,
            next_pos=start + mask.sum(axis=1, dtype=jnp.int32),
            index=index + t,
        )

    def logits(self, h: jax.Array, vocab: jax.Array | None = None) -> jax.Array:
        """Output head: float32[..., V] logits from hidden states [..., D] (Gemma 4: tanh soft cap); with ``vocab``
        only those tokens' logits, as :meth:`lora.model.Decoder.logits` (the cap is elementwise)."""
        out = Decoder.logits(self, h, vocab)
        cap = self.cfg.final_logit_softcapping
        return out if cap is None else jnp.tanh(out / cap) * cap

    # The full-sequence forward and the cached step only call ``hidden`` and ``logits``: Decoder's own.
    __call__ = Decoder.__call__
    step = Decoder.step
    #: The cache protocol of this model (:class:`lora.model.Decoder` has :class:`lora.model.KVCache`).
    cache_type = LayerCache


# Tensors of multimodal checkpoints (``Gemma4ForConditionalGeneration``, ``Qwen3_5ForConditionalGeneration``)
# outside the text decoder, and Qwen3.5's multi-token-prediction head: skipped by :func:`build_layerwise`.
NON_TEXT_PREFIXES = (
    "model.vision_tower.",
    "model.audio_tower.",
    "model.embed_vision.",
    "model.embed_audio.",
    "model.visual.",
    "mtp.",
)


def nnx_path(name: str) -> tuple[str, bool] | None:
    """HF tensor name -> (NNX state path of :class:`LayerwiseDecoder`, whether an [out, in] kernel candidate), or
    None for a tensor outside the text decoder. ``model.language_model.`` (multimodal wrappers) reads as
    ``model.``; ``mlp.`` / ``linear_attn.`` stay (submodules here too), ``self_attn.`` is flattened."""
    if name.startswith("model.language_model."):
        name = "model." + name[len("model.language_model.") :]
    if name.startswith(NON_TEXT_PREFIXES):
        return None
    fixed = {
        "model.embed_tokens.weight": "embed",
        "model.norm.weight": "final_norm.weight",
        "lm_head.weight": "lm_head",
        "model.embed_tokens_per_layer.weight": "embed_per_layer",
    }
    if name in fixed:
        return fixed[name], name == "lm_head.weight"
    if name.startswith("model."):
        name = name[len("model.") :]
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) > 2:
        rest = ".".join(parts[2:])
        if rest.startswith("self_attn."):
            rest = rest.split(".", 1)[1]
        name = f"layers.{parts[1]}.{rest}"
        if name.endswith(".conv1d.weight"):  # our depthwise kernel is a bare Param, HF layout [C, 1, kernel]
            name = name[: -len(".weight")]
    return name, name.endswith(".weight")


def build_layerwise(
    cfg: ModelConfig,
    weights: dict,
    *,
    source: str,
    lora: LoRAConfig | None = None,
    dtype=jnp.float32,
    seed: int = 0,
) -> LayerwiseDecoder:
    """Builds a :class:`LayerwiseDecoder` from HF-named weights (HF layout: linear weights [out, in]).

    A linear layer's ``weight`` becomes its transposed ``kernel``; norms, ``layer_scalar``, ``A_log``, ``dt_bias``
    and ``conv1d`` keep their layout. Adapters: A uniform, B zero (:func:`lora.params.init_adapters`).

    Raises:
      ValueError: naming ``source``: a tensor the configuration has no place for, a missing tensor, or a shape
        mismatch.
    """
    import numpy as np

    from lora.params import fill_base

    abstract = nnx.eval_shape(lambda: LayerwiseDecoder(cfg, lora, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, lora_state, base_state = nnx.split(abstract, nnx.LoRAParam, ...)
    leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(base_state))
    wanted = {".".join(str(getattr(k, "key", k)) for k in kp) for kp, _ in leaves}
    found: dict[str, np.ndarray] = {}
    for name, array in weights.items():
        mapped = nnx_path(name)
        if mapped is None or name.endswith("rotary_emb.inv_freq"):
            continue
        path, linear = mapped
        array = np.asarray(array)
        if linear and path[: -len(".weight")] + ".kernel" in wanted:
            path, array = path[: -len(".weight")] + ".kernel", array.T
        elif path == "lm_head":
            array = array.T
        if path not in wanted:
            raise ValueError(
                f"{source}: unexpected tensor {name!r} for architecture {cfg.architecture!r} "
                f"(maps to {path!r}, which this configuration does not have)"
            )
        found[path] = array
    return fill_base(graphdef, lora_state, base_state, found, source=source, seed=seed)


# Modules of a layer that HF nests under ``self_attn.`` (``Gemma4TextAttention`` / ``Qwen3_5Attention``);
# :func:`nnx_path` flattens them.
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
# Top-level NNX paths -> HF names (the inverse of :func:`nnx_path`'s fixed table; ``lm_head`` is transposed).
_TOP_LEVEL = {
    "embed": "model.embed_tokens.weight",
    "final_norm.weight": "model.norm.weight",
    "lm_head": "lm_head.weight",
    "embed_per_layer": "model.embed_tokens_per_layer.weight",
}


def hf_name(path: str) -> tuple[str, bool]:
    """NNX state path of :class:`LayerwiseDecoder` -> (HF ``*ForCausalLM`` tensor name, whether the array is
    transposed: a ``kernel`` [in, out] is HF's [out, in] ``weight``). The inverse of :func:`nnx_path`."""
    if path in _TOP_LEVEL:
        return _TOP_LEVEL[path], path == "lm_head"
    transposed = path.endswith(".kernel")
    if transposed:
        path = path[: -len(".kernel")] + ".weight"
    parts = path.split(".")
    if parts[0] == "layers":
        rest = parts[2:]
        if rest[0] in ATTENTION_MODULES:
            rest = ["self_attn", *rest]
        if rest[-1] == "conv1d":  # a bare Param here, ``conv1d.weight`` in HF
            rest = [*rest, "weight"]
        return ".".join(["model", "layers", parts[1], *rest]), transposed
    return "model." + path, transposed


def export_layerwise_weights(model: LayerwiseDecoder) -> dict:
    """The base weights of a :class:`LayerwiseDecoder` as HF-named float32 arrays in HF layout (the names and
    layouts :func:`build_layerwise` reads: a round trip rebuilds the same model)."""
    import numpy as np

    _, _, base = nnx.split(model, nnx.LoRAParam, ...)
    leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(base))
    out = {}
    for keypath, value in leaves:
        name, transposed = hf_name(".".join(str(getattr(k, "key", k)) for k in keypath))
        array = np.asarray(value, np.float32)
        out[name] = np.ascontiguousarray(array.T if transposed else array)
    return out
