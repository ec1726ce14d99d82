"""Batched scoring and KV-cached sampling on the decoder, as pure functions around jit.

Every jitted function takes ``(graphdef, state)`` from ``nnx.split(model)`` (graphdef static), so one
compiled program serves any adapter values, and a batch may mix agents through ``agent_ids``.

Padding convention: prompts are LEFT-padded (their last column is every row's last real token),
continuations RIGHT-padded. A shared system-prompt prefix can be run once at batch 1
(:func:`prefill_prefix`) and its KV cache broadcast to the batch.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from lora.model import Decoder, KVCache


def continuation_logprobs(model: Decoder, prompt_ids: jax.Array, prompt_mask: jax.Array,
                          cont_ids: jax.Array, cont_mask: jax.Array, *,
                          agent_ids: jax.Array | None = None, cache: KVCache | None = None,
                          dropout_key: jax.Array | None = None,
                          temperature: float | jax.Array = 1.0) -> jax.Array:
  """Log-probabilities of given continuation tokens after each prompt (one forward pass).

  Only the continuation columns go through the vocabulary head, so memory is B x Tc x V.

  Args:
    model: the decoder (merged; call inside jit or eagerly).
    prompt_ids: int32[B, Tp], left-padded.
    prompt_mask: bool[B, Tp].
    cont_ids: int32[B, Tc], right-padded.
    cont_mask: bool[B, Tc].
    agent_ids: int32[B] adapter per row; None = frozen reference policy.
    cache: optional KV cache already holding a shared prefix (broadcast to B rows, with room for
      Tp + Tc more slots).
    dropout_key: enables LoRA dropout (training mode).
    temperature: the logits are divided by it before the softmax, so the log-probabilities are
      those of the distribution ``generate`` samples from at that temperature (issue #5: the
      sampled tokens' log-probability at the rollout temperature, no top-k/top-p reshaping).

  Returns:
    float32[B, Tc]: log p_T(cont_t | prompt, cont_<t), 0 where ``cont_mask`` is False.
  """
  tc = cont_ids.shape[1]
  ids = jnp.concatenate([prompt_ids, cont_ids], axis=1)
  mask = jnp.concatenate([prompt_mask.astype(bool), cont_mask.astype(bool)], axis=1)
  h, _ = model.hidden(ids, attention_mask=mask, agent_ids=agent_ids, cache=cache,
                      dropout_key=dropout_key)
  logits = model.logits(h[:, -tc - 1:-1])  # position t predicts token t + 1
  logp = jax.nn.log_softmax(logits / temperature, axis=-1)
  picked = jnp.take_along_axis(logp, cont_ids[..., None], axis=-1)[..., 0]
  return jnp.where(cont_mask, picked, 0.0)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def score(graphdef, state, prompt_ids, prompt_mask, cont_ids, cont_mask, agent_ids=None,
          cache=None, dropout_key=None):
  """Jitted :func:`continuation_logprobs` on ``nnx.merge(graphdef, state)``."""
  model = nnx.merge(graphdef, state)
  return continuation_logprobs(model, prompt_ids, prompt_mask, cont_ids, cont_mask,
                               agent_ids=agent_ids, cache=cache, dropout_key=dropout_key)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def forward(graphdef, state, input_ids, attention_mask=None, agent_ids=None):
  """Jitted full-sequence logits float32[B, T, V] (see :meth:`Decoder.__call__`)."""
  model = nnx.merge(graphdef, state)
  return model(input_ids, attention_mask=attention_mask, agent_ids=agent_ids)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def step(graphdef, state, input_ids, cache, attention_mask=None, agent_ids=None):
  """Jitted :meth:`Decoder.step`: (last-column logits float32[B, V], updated cache)."""
  model = nnx.merge(graphdef, state)
  return model.step(input_ids, cache, attention_mask=attention_mask, agent_ids=agent_ids)


@functools.partial(jax.jit, static_argnames=("graphdef", "capacity"))
def prefill_prefix(graphdef, state, prefix_ids, *, capacity: int | None = None) -> KVCache:
  """Runs a shared prefix once (frozen base, batch 1) into a cache with ``capacity`` slots.

  The prefix goes through the base without adapters, so it is only shareable as-is when the
  adapters do not touch it -- use it for the reference policy or when all rows share the adapter
  of ``agent_ids`` given later. (With per-agent adapters, K/V of the prefix differ per agent; use
  :func:`prefill_prefix_per_agent`.)

  Args:
    prefix_ids: int32[1, P].
    capacity: total slots; default P (``generate`` grows the cache by what it needs).

  Returns:
    KVCache with batch 1, ``index = P``.
  """
  model = nnx.merge(graphdef, state)
  cache = KVCache.init(model.cfg, 1, capacity or prefix_ids.shape[1], model.dtype)
  _, cache = model.hidden(prefix_ids, cache=cache)
  return cache


@functools.partial(jax.jit, static_argnames=("graphdef", "capacity"))
def prefill_prefix_per_agent(graphdef, state, prefix_ids, agent_ids, *,
                             capacity: int | None = None) -> KVCache:
  """Runs a shared prefix once per adapter: int32[N] ``agent_ids`` -> cache with N rows.

  Gather rows with ``jax.tree.map(lambda a: a[..., rows, ...])`` via :func:`gather_cache_rows`.
  """
  model = nnx.merge(graphdef, state)
  n = agent_ids.shape[0]
  cache = KVCache.init(model.cfg, n, capacity or prefix_ids.shape[1], model.dtype)
  _, cache = model.hidden(jnp.repeat(prefix_ids, n, axis=0), agent_ids=agent_ids, cache=cache)
  return cache


def gather_cache_rows(cache: KVCache, rows: jax.Array) -> KVCache:
  """Selects batch rows int32[B] of a cache (e.g. each row's agent prefix)."""
  return KVCache(k=cache.k[:, rows], v=cache.v[:, rows], valid=cache.valid[rows],
                 next_pos=cache.next_pos[rows], index=cache.index)


class Generation(NamedTuple):
  """Sampled continuation.

  Attributes:
    tokens: int32[B, M] sampled ids (eos included; the pad id after it).
    logprobs: float32[B, M] log-probability of each token under the untempered policy, 0 after end.
    mask: bool[B, M] true up to and including the first end token.
  """

  tokens: jax.Array
  logprobs: jax.Array
  mask: jax.Array


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "eos_ids", "pad_id"))
def generate(graphdef, state, prompt_ids, prompt_mask, key, agent_ids=None, temperature=1.0,
             prefix_cache=None, *, max_new_tokens: int, eos_ids: tuple[int, ...] = (),
             pad_id: int = 0) -> Generation:
  """Samples up to ``max_new_tokens`` per row with a KV cache (temperature <= 0: greedy).

  Args:
    graphdef, state: from ``nnx.split(model)``.
    prompt_ids: int32[B, Tp] left-padded prompts (after the prefix, if any).
    prompt_mask: bool[B, Tp].
    key: PRNG key.
    agent_ids: int32[B] or None (reference policy).
    temperature: float scalar (traced, so changing it does not recompile).
    prefix_cache: optional cache with B rows (see :meth:`KVCache.broadcast`) holding a shared prefix.
    max_new_tokens: M.
    eos_ids: token ids that end a row.
    pad_id: written after a row has ended.

  Returns:
    :class:`Generation`.
  """
  model = nnx.merge(graphdef, state)
  b, tp = prompt_ids.shape
  if prefix_cache is None:
    cache = KVCache.init(model.cfg, b, tp + max_new_tokens, model.dtype)
  else:
    cache = prefix_cache.grow(int(prefix_cache.size) + tp + max_new_tokens)
  logits, cache = model.step(prompt_ids, cache, attention_mask=prompt_mask, agent_ids=agent_ids)
  eos = jnp.asarray(eos_ids if eos_ids else (-1,), jnp.int32)

  def body(carry, key_t):
    logits, cache, done = carry
    logp = jax.nn.log_softmax(logits, axis=-1)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    t = jnp.maximum(temperature, 1e-6)
    sampled = jax.random.categorical(key_t, logits / t, axis=-1).astype(jnp.int32)
    tok = jnp.where(temperature > 0, sampled, greedy)
    tok_lp = jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
    live = ~done
    tok = jnp.where(live, tok, pad_id)
    ended = done | jnp.isin(tok, eos)
    logits, cache = model.step(tok[:, None], cache, attention_mask=live[:, None],
                               agent_ids=agent_ids)
    return (logits, cache, ended), (tok, jnp.where(live, tok_lp, 0.0), live)

  keys = jax.random.split(key, max_new_tokens)
  _, (toks, lps, live) = jax.lax.scan(body, (logits, cache, jnp.zeros((b,), bool)), keys)
  return Generation(tokens=toks.T, logprobs=lps.T, mask=live.T)
