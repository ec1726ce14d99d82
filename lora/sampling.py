"""Batched scoring and KV-cached sampling on the decoder, as pure functions around jit.

Every jitted function takes ``(graphdef, state)`` from ``nnx.split(model)`` (graphdef static), so one
compiled program serves any adapter values, and a batch may mix agents through ``agent_ids``.

Padding convention: prompts are LEFT-padded (their last column is every row's last real token),
continuations RIGHT-padded. A shared system-prompt prefix can be run once per adapter
(:meth:`lora.model.KVCache.prefill`, jitted: :func:`prefill_prefix`) and its KV cache broadcast to the batch
(:meth:`~lora.model.KVCache.broadcast`) or gathered per row (:meth:`~lora.model.KVCache.take`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from lora.model import Decoder, KVCache


def tempered_logprobs(
    logits: jax.Array, targets: jax.Array, temperature: float | jax.Array = 1.0, candidates: jax.Array | None = None
) -> jax.Array:
    """The one tempered log-prob of the project: scoring, sampling traces and training all call it.

    ``log p_T(target) = logits[target] / T - logsumexp(logits / T)``, the log-probability under the distribution
    the samplers draw from at temperature T (no top-k / top-p reshaping), normalised over ``candidates`` when given
    (a restricted one-token choice: the menu's letter tokens in ``choice_only`` mode).

    Args:
      logits: float32[..., V].
      targets: int32[...] index into the last axis of ``logits``.
      temperature: scalar T > 0 (the callers handle T <= 0, greedy decoding).
      candidates: optional int32[..., C] indices into the last axis to normalise over, -1 = no candidate;
        None = the whole last axis.

    Returns:
      float32[...].
    """
    scaled = logits / temperature
    picked = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0]
    if candidates is None:
        return picked - jax.nn.logsumexp(scaled, axis=-1)
    cand = jnp.take_along_axis(scaled, jnp.maximum(candidates, 0), axis=-1)
    return picked - jax.nn.logsumexp(jnp.where(candidates >= 0, cand, -jnp.inf), axis=-1)


def next_token_logits(
    model: Decoder,
    ids: jax.Array,
    mask: jax.Array,
    *,
    agent_ids: jax.Array | None = None,
    cache: KVCache | None = None,
    vocab: jax.Array | None = None,
) -> jax.Array:
    """float32[B, V]: the logits of the token after each left-padded row (one forward, no cache written).

    With ``cache`` (a shared prefix) the rows attend to its slots; no ``cache_size``, so no extended cache is built.
    With ``vocab`` (int32[C], e.g. a menu's letter tokens) only those logits, float32[B, C] (:meth:`Decoder.logits`).
    """
    h, _ = model.hidden(ids, attention_mask=mask, agent_ids=agent_ids, cache=cache)
    return model.logits(h[:, -1], vocab)


def continuation_logprobs(
    model: Decoder,
    prompt_ids: jax.Array,
    prompt_mask: jax.Array,
    cont_ids: jax.Array,
    cont_mask: jax.Array,
    *,
    agent_ids: jax.Array | None = None,
    cache: KVCache | None = None,
    dropout_key: jax.Array | None = None,
    temperature: float | jax.Array = 1.0,
    candidates: jax.Array | None = None,
) -> jax.Array:
    """Log-probabilities of given continuation tokens after each prompt (one forward pass).

    Only the continuation columns go through the vocabulary head, so memory is B x Tc x V. The training
    update scores its decisions with it too (:func:`jaxopt_marl.train_step.sequence_logprobs`).

    Args:
      model: the decoder (merged; call inside jit or eagerly).
      prompt_ids: int32[B, Tp], left-padded.
      prompt_mask: bool[B, Tp].
      cont_ids: int32[B, Tc], right-padded.
      cont_mask: bool[B, Tc].
      agent_ids: int32[B] adapter per row; None = frozen reference policy.
      cache: optional KV cache already holding a shared prefix (broadcast to B rows, with room for
        Tp + Tc more slots, or a full prefix cache: the rows then only read it).
      dropout_key: enables LoRA dropout (training mode).
      temperature: the logits are divided by it before the softmax, so the log-probabilities are
        those of the distribution ``generate`` samples from at that temperature (issue #5: the
        sampled tokens' log-probability at the rollout temperature, no top-k/top-p reshaping).
      candidates: optional int32[B, Tc, C] (or broadcastable: [B, 1, C]) token ids each column's softmax is
        restricted to (-1 = none), see :func:`tempered_logprobs`. Only these tokens' head rows are applied
        (:meth:`Decoder.logits` with ``vocab``); each ``cont_ids`` token must be among its column's candidates
        (:func:`jaxopt_marl.train_step.pack_decisions` checks it), or its log-prob is that of the first one.

    Returns:
      float32[B, Tc]: log p_T(cont_t | prompt, cont_<t), 0 where ``cont_mask`` is False.
    """
    tc = cont_ids.shape[1]
    ids = jnp.concatenate([prompt_ids, cont_ids], axis=1)
    mask = jnp.concatenate([prompt_mask.astype(bool), cont_mask.astype(bool)], axis=1)
    h, _ = model.hidden(ids, attention_mask=mask, agent_ids=agent_ids, cache=cache, dropout_key=dropout_key)
    h = h[:, -tc - 1 : -1]  # position t predicts token t + 1
    if candidates is None:
        return jnp.where(cont_mask, tempered_logprobs(model.logits(h), cont_ids, temperature), 0.0)
    # A restricted choice: only the candidates' head rows (B x Tc x C logits), the target as its candidate slot.
    cand = jnp.broadcast_to(candidates, (*cont_ids.shape, candidates.shape[-1]))
    slot = jnp.argmax(cand == cont_ids[..., None], axis=-1)
    live = jnp.where(cand >= 0, jnp.arange(cand.shape[-1]), -1)
    logits = model.logits(h, jnp.maximum(cand, 0))
    return jnp.where(cont_mask, tempered_logprobs(logits, slot, temperature, live), 0.0)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def score(graphdef, state, prompt_ids, prompt_mask, cont_ids, cont_mask, agent_ids=None, cache=None, dropout_key=None):
    """Jitted :func:`continuation_logprobs` on ``nnx.merge(graphdef, state)``."""
    model = nnx.merge(graphdef, state)
    return continuation_logprobs(
        model, prompt_ids, prompt_mask, cont_ids, cont_mask, agent_ids=agent_ids, cache=cache, dropout_key=dropout_key
    )


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
def prefill_prefix(graphdef, state, prefix_ids, agent_ids=None, *, capacity: int | None = None) -> KVCache:
    """Jitted :meth:`KVCache.prefill` on ``nnx.merge(graphdef, state)``: a shared prefix run once per adapter.

    Without ``agent_ids`` the prefix goes through the base without adapters at batch 1, so it is only
    shareable as-is when the adapters do not touch it -- the reference policy, or all rows on the adapter
    that computed it. With per-agent adapters pass ``agent_ids`` int32[N] (one row each) and pick each
    row's with :meth:`KVCache.take`.

    Args:
      prefix_ids: int32[1, P].
      agent_ids: int32[N] or None.
      capacity: total slots; default P (``generate`` grows the cache by what it needs).

    Returns:
      KVCache with N rows (1 without ``agent_ids``), ``index = P``.
    """
    model = nnx.merge(graphdef, state)
    return model.cache_type.prefill(model, prefix_ids, agent_ids, capacity=capacity)


class Generation(NamedTuple):
    """Sampled continuation.

    Attributes:
      tokens: int32[B, M] sampled ids (eos included; the pad id after it).
      logprobs: float32[B, M] log-probability of each token under the untempered policy, 0 after end.
      mask: bool[B, M] true up to and including the first end token.
      logprobs_t: float32[B, M] the same at the sampling temperature (the distribution the tokens were
        drawn from; 0 after end; equal to ``logprobs`` at temperature 1 and 0 at temperature <= 0).
    """

    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    logprobs_t: jax.Array | None = None


def decode(
    model: Decoder,
    prompt_ids: jax.Array,
    prompt_mask: jax.Array,
    draw,
    *,
    agent_ids: jax.Array | None,
    temperature,
    prefix_cache: KVCache | None,
    max_new_tokens: int,
    eos_ids: tuple[int, ...],
    pad_id: int,
    live_rows: jax.Array | None = None,
) -> Generation:
    """The traceable decode loop behind :func:`generate` (call it inside jit).

    Args:
      model: the merged decoder.
      prompt_ids, prompt_mask: int32[B, Tp] / bool[B, Tp], left-padded (after the prefix, if any).
      draw: ``draw(i, scaled_logits float32[B, V]) -> int32[B]``: token ``i`` of every row from its
        logits divided by the temperature (only called when the temperature is > 0).
      agent_ids: int32[B] or None (reference policy).
      temperature: float scalar (traced); <= 0 is greedy.
      prefix_cache: optional cache with B rows holding a shared prefix.
      max_new_tokens: M >= 1 (static).
      eos_ids: token ids that end a row.
      pad_id: written after a row has ended.
      live_rows: optional bool[B]; rows that are False count as ended from the start (padding rows of
        a batch: they emit only ``pad_id`` with mask False and never keep the loop running).

    Returns:
      :class:`Generation` (with ``logprobs_t``). The loop is a ``lax.while_loop`` that stops once
      every row has produced an end token: no model call after the last token.
    """
    b, tp = prompt_ids.shape
    # The prompt attends to the prefix's own slots only; the returned cache has room for the rest.
    if max_new_tokens == 1:  # one token (a menu letter): nothing is decoded, so no cache is written
        logits = next_token_logits(model, prompt_ids, prompt_mask, agent_ids=agent_ids, cache=prefix_cache)
        cache = None
    else:
        size = (0 if prefix_cache is None else prefix_cache.size) + tp + max_new_tokens - 1
        logits, cache = model.step(
            prompt_ids, prefix_cache, attention_mask=prompt_mask, agent_ids=agent_ids, cache_size=size
        )
    eos = jnp.asarray(eos_ids if eos_ids else (-1,), jnp.int32)
    t = jnp.maximum(temperature, 1e-6)
    hot = temperature > 0

    def sample(logits, i, done):
        """Token i of every row from its logits [B, V]; pad (log-prob 0) for rows already ended."""
        greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        tok = jnp.where(hot, draw(i, logits / t).astype(jnp.int32), greedy)
        tok_lp = tempered_logprobs(logits, tok, 1.0)
        tok_lpt = jnp.where(hot, tempered_logprobs(logits, tok, t), 0.0)
        live = ~done
        return (jnp.where(live, tok, pad_id), jnp.where(live, tok_lp, 0.0), jnp.where(live, tok_lpt, 0.0), live)

    def record(out, i, tok, lp, lpt, live):
        toks, lps, lpts, lives = out
        return (toks.at[:, i].set(tok), lps.at[:, i].set(lp), lpts.at[:, i].set(lpt), lives.at[:, i].set(live))

    # Token 0 comes from the prompt's logits; each loop turn feeds the previous token through the
    # model and samples the next, and the loop stops as soon as every row has ended (a decision's
    # answer is a few tokens; the M-token budget is rarely used) -- no model call after the last token.
    done = jnp.zeros((b,), bool) if live_rows is None else ~live_rows.astype(bool)
    tok, lp, lpt, live = sample(logits, 0, done)
    zeros = jnp.zeros((b, max_new_tokens), jnp.float32)
    out = record(
        (jnp.full((b, max_new_tokens), pad_id, jnp.int32), zeros, zeros, jnp.zeros((b, max_new_tokens), bool)),
        0,
        tok,
        lp,
        lpt,
        live,
    )
    done = done | jnp.isin(tok, eos)

    def cond(carry):
        i, _, _, _, done, _ = carry
        return (i < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        i, prev, prev_live, cache, done, out = carry
        logits, cache = model.step(prev[:, None], cache, attention_mask=prev_live[:, None], agent_ids=agent_ids)
        tok, lp, lpt, live = sample(logits, i, done)
        return (i + 1, tok, live, cache, done | jnp.isin(tok, eos), record(out, i, tok, lp, lpt, live))

    if max_new_tokens > 1:
        _, _, _, _, _, out = jax.lax.while_loop(cond, body, (jnp.ones((), jnp.int32), tok, live, cache, done, out))
    toks, lps, lpts, live = out
    return Generation(tokens=toks, logprobs=lps, mask=live, logprobs_t=lpts)


def row_key_draw(row_keys: jax.Array):
    """A :func:`decode` ``draw`` with one key per row: token i of row b uses ``fold_in(row_keys[b], i)``.

    So a row's sample does not depend on which other rows share its batch (the compiled rollout
    batches whichever agents decide in a wave).
    """

    def draw(i, scaled):
        keys = jax.vmap(lambda k: jax.random.fold_in(k, i))(row_keys)
        return jax.vmap(jax.random.categorical)(keys, scaled)

    return draw


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "eos_ids", "pad_id"))
def generate(
    graphdef,
    state,
    prompt_ids,
    prompt_mask,
    key,
    agent_ids=None,
    temperature=1.0,
    prefix_cache=None,
    *,
    max_new_tokens: int,
    eos_ids: tuple[int, ...] = (),
    pad_id: int = 0,
) -> Generation:
    """Samples up to ``max_new_tokens`` per row with a KV cache (temperature <= 0: greedy).

    The decode loop (:func:`decode`) is a ``lax.while_loop`` that stops once every row has produced an
    end token, so a batch of short answers costs as many model calls as its longest answer, not M.

    Args:
      graphdef, state: from ``nnx.split(model)``.
      prompt_ids: int32[B, Tp] left-padded prompts (after the prefix, if any).
      prompt_mask: bool[B, Tp].
      key: PRNG key (token i of the batch is drawn with ``split(key, M)[i]``).
      agent_ids: int32[B] or None (reference policy).
      temperature: float scalar (traced, so changing it does not recompile).
      prefix_cache: optional cache with B rows (see :meth:`KVCache.broadcast`) holding a shared prefix.
      max_new_tokens: M.
      eos_ids: token ids that end a row.
      pad_id: written after a row has ended.

    Returns:
      :class:`Generation`.

    Raises:
      ValueError: ``max_new_tokens`` < 1.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    model = nnx.merge(graphdef, state)
    keys = jax.random.split(key, max_new_tokens)
    draw = lambda i, scaled: jax.random.categorical(keys[i], scaled, axis=-1)
    return decode(
        model,
        prompt_ids,
        prompt_mask,
        draw,
        agent_ids=agent_ids,
        temperature=temperature,
        prefix_cache=prefix_cache,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        pad_id=pad_id,
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "eos_ids", "pad_id"))
def generate_rows(
    graphdef,
    state,
    prompt_ids,
    prompt_mask,
    row_keys,
    agent_ids=None,
    temperature=1.0,
    prefix_cache=None,
    *,
    max_new_tokens: int,
    eos_ids: tuple[int, ...] = (),
    pad_id: int = 0,
) -> Generation:
    """:func:`generate` with one PRNG key per row (``row_keys`` [B] keys; see :func:`row_key_draw`).

    A row's sample then depends only on its own key and prompt, not on the other rows of the batch.

    Raises:
      ValueError: ``max_new_tokens`` < 1.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    model = nnx.merge(graphdef, state)
    return decode(
        model,
        prompt_ids,
        prompt_mask,
        row_key_draw(row_keys),
        agent_ids=agent_ids,
        temperature=temperature,
        prefix_cache=prefix_cache,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        pad_id=pad_id,
    )
