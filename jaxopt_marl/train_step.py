"""The PA-MAGRPO update (paper §5.2, Algorithm 1 step 7) as one jitted, explicitly sharded function.

One call of :attr:`TrainStep.update` is the whole update of one round: E epochs (x minibatches) of
PPO-clip + KL over the round's decisions, where every agent's loss is the mean over *its own*
decisions and every optimizer step changes only the adapters of agents that had decisions in it.
The math comes from :mod:`jaxopt_marl.magrpo`; this module is the loop around it.

Design choices:

- *All agents in one pass.* Agent i's adapter only enters agent i's rows (``agent_ids`` selects the
  adapter per row, :mod:`lora.model`), so the gradient of sum_i L^i with respect to adapter i is
  grad L^i. One forward/backward over all D decisions therefore performs the N per-agent updates of
  Algorithm 1 at once, and the N updates are independent: each is clipped by its own norm
  (:func:`clip_by_agent_global_norm`) and Adam is elementwise. An agent without decisions in a step keeps
  its adapter and optimizer moments bit-identical (selected back, not merely given a zero gradient,
  since Adam momentum or weight decay would otherwise still move it). Adam's step counter is shared.
- *Shared adapter* (Ablation B): ``MAGRPOConfig.shared_adapter`` with a one-adapter model; every
  decision is routed to adapter 0 and the loss is the mean over all agents' decisions.
- *theta_old from the first step.* At the first optimizer step of a round the parameters *are*
  theta_old. With one minibatch (the paper's setting) that step's forward covers every decision, so its
  own log-probs, stop-gradient, are ``logp_old`` for every epoch: rho = 1 exactly on the first epoch,
  and no separate theta_old scoring pass is run (:attr:`TrainStep.prepare` scores only the reference,
  adapters off). This is exact, not an approximation, because the update applies no dropout; it saves
  one forward pass over the round's decisions (1 of 5 pass-equivalents with one epoch, 1 of 8 with two).
  With several minibatches, later minibatches of the first epoch are seen after the adapters moved, so
  ``prepare`` also scores ``logp_old`` (:attr:`TrainStep.score`, the same program as the reference with
  adapter ids instead of -1), and the first step uses its value with the live pass's gradient
  (``logp_old + live - stop_gradient(live)``): rho = 1 exactly there too.
- *Sharding.* A :class:`jax.sharding.Mesh` with one axis ``"data"`` over decisions: the batch is split
  along D, adapters / base / optimizer state are replicated. The same function runs on one CPU device and on
  many; D must be a multiple of the device count times the minibatch count (:func:`pack_decisions` pads with
  invalid decisions). On several devices each step's forward/backward runs per device
  (:func:`jax.shard_map`): every device sums the gradient (adapters and prefix K/V) and the metrics over its
  own rows of every micro-batch, with the whole minibatch's per-agent counts as the loss's denominators, so
  each device's sums are linear pieces of the minibatch's. The devices' partial sums are then added in device
  order (:func:`ordered_sum`: an all-to-all, ordered adds, an all-gather), not by an all-reduce, whose order
  is the collective's own (XLA's in-process CPU all-reduce and gloo's cross-process one differ, issue #17):
  the update's bits depend on the mesh alone, not on how its devices are split over processes. The prefix
  pull-back, the per-agent norms and the optimizer then run replicated.
- *Memory.* ``MAGRPOConfig.micro_batch`` splits each optimizer step's forward/backward into chunks
  whose gradients are summed (weights use the whole minibatch's per-agent counts, so the step is the
  same up to rounding); each chunk must also split evenly over the devices. A chunk of padding rows
  only is skipped (``lax.cond``; per device: a device whose rows of the chunk are padding skips it), so a
  decision count rounded up to a coarse bucket -- fewer distinct shapes, fewer compiles -- costs no extra
  forward or backward. So is a chunk whose valid rows are all *forced* choices (:func:`trainable`): in
  ``choice_only`` a menu of one letter gives a log-prob of exactly 0 under every adapter and the reference
  (a log-softmax over one candidate), hence ratio 1, KL 0 and no gradient, and its metric terms (the policy
  term -A, ratio 1) are computed from those zeros without the model, the same values the forward would give.
  :func:`trainable_first` orders a batch so that such rows share chunks (the trainer applies it; Overcooked's
  menus are single-letter for 48-76% of decisions).
- *Progress.* ``make_train_step(..., progress=True)`` compiles one host tick per micro-batch into ``prepare``'s
  scoring and ``update``'s accumulation (:func:`jax.debug.callback`, after the micro-batch's outputs exist);
  the host counts the ticks into the tqdm bar routed by :func:`jaxopt_marl.progress.route` (nothing when none is;
  on a mesh, once per micro-batch from its first device, process 0's, where the unsharded program's callbacks
  run). The update is one program (epochs and minibatches are scanned), so a host loop could only tick per
  call, and the CPU preset's update is one epoch of one minibatch: per-micro-batch ticks are the only
  granularity that shows progress there. A tick reads nothing the update computes with and returns nothing,
  so the numerics are unchanged (tested bit for bit against ``progress=False``); it costs one host call per
  micro-batch. Programs with host callbacks are never written to JAX's persistent compilation cache, so such
  an update recompiles in every new process; ``progress=False`` (the default: benchmarks, tests) compiles none.
- *Token layout.* Each decision is one row ``[prompt, left-padded | response, right-padded]`` of
  ``tokens: int32[D, T]``; the response occupies the last ``response_len`` columns, so only those
  columns go through the vocabulary head (:func:`lora.sampling.continuation_logprobs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxopt_marl import magrpo
from jaxopt_marl import progress as progress_lib
from lora import sampling
from lora.model import Decoder

# Mesh axis over decisions.
DATA_AXIS = "data"


def micro_batch_size(config: magrpo.MAGRPOConfig, size: int) -> int:
    """Rows per forward/backward chunk of a ``size``-row (mini)batch: ``config.micro_batch`` when it is in
    1..size-1, else the whole batch."""
    return config.micro_batch if 0 < config.micro_batch < size else size


def progress_ticks(config: magrpo.MAGRPOConfig, num_decisions: int) -> tuple[int, int]:
    """``(prepare, update)``: the ticks a ``progress=True`` train step emits for a batch of ``num_decisions``
    rows (D, padding included): one per scored micro-batch in ``prepare``, and epochs x minibatches x
    micro-batches per minibatch in ``update``."""
    mb = num_decisions // config.num_minibatches
    return (
        num_decisions // micro_batch_size(config, num_decisions),
        config.epochs * config.num_minibatches * (mb // micro_batch_size(config, mb)),
    )


# Adapter leaves are [..., N, in, R] (lora_a) and [..., N, R, out] (lora_b) (lora.params.init_adapters):
# the agent axis is the third from the end.
AGENT_AXIS_FROM_END = 3


@flax.struct.dataclass
class DecisionBatch:
    """One round's decisions, every array with the decision axis D first.

    Attributes:
        tokens: int32[D, T] prompt (left-padded) then response (right-padded, last ``response_len``
            columns).
        attention_mask: bool[D, T] real tokens.
        response_mask: bool[D, T] the sampled response tokens (zero outside the last ``response_len``
            columns).
        agent_ids: int32[D] acting agent of each decision.
        advantages: float32[D] group-relative advantage of the decision's rollout.
        logp_old: float32[D] summed response log-prob under the rollout parameters (from
            :attr:`TrainStep.score`; filled by :attr:`TrainStep.prepare` only with several
            minibatches -- with one, the update takes it from its first step).
        logp_ref: float32[D] the same under the reference policy (adapters off).
        valid: bool[D] real decisions (False = padding).
        choice_ids: optional int32[D, C] candidate tokens of a restricted choice (``choice_only``
            scoring: the menu's letter tokens, -1 = no candidate). With it the one-token response's
            log-prob is taken over the candidates only -- the distribution the rollout sampled from --
            instead of the whole vocabulary. Requires ``response_len == 1``.
        response_len: static number of response columns (part of the compiled shape).
        prefix: static shared prompt prefix (token ids) that every row continues: the rendered system
            turn. ``tokens`` then hold only what follows it, and its K/V is computed once per adapter
            instead of once per decision (:func:`prefix_kv`). Empty = rows hold whole prompts.
    """

    tokens: jax.Array
    attention_mask: jax.Array
    response_mask: jax.Array
    agent_ids: jax.Array
    advantages: jax.Array
    logp_old: jax.Array
    logp_ref: jax.Array
    valid: jax.Array
    choice_ids: jax.Array | None = None
    # Static: changing them recompiles, so callers keep them fixed per run.
    response_len: int = flax.struct.field(pytree_node=False, default=1)
    prefix: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())

    @property
    def num_decisions(self) -> int:
        return self.tokens.shape[0]


def pack_decisions(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    agent_ids: Sequence[int],
    advantages: Sequence[float],
    *,
    pad_id: int = 0,
    prompt_len: int | None = None,
    response_len: int | None = None,
    pad_to_multiple: int = 1,
    prefix: Sequence[int] = (),
    choices: Sequence[Sequence[int]] | None = None,
) -> DecisionBatch:
    """Packs token lists into a host :class:`DecisionBatch` (logp_old / logp_ref zero until scored).

    Args:
        prompts: D prompt token lists (non-empty).
        responses: D sampled response token lists (non-empty).
        agent_ids: D acting agents.
        advantages: D advantages (e.g. :func:`jaxopt_marl.magrpo.decision_advantages`).
        pad_id: token written in padding slots.
        prompt_len, response_len: column counts (default: the longest; fix them to avoid recompiles).
        pad_to_multiple: D is padded with invalid decisions up to a multiple of this (device count x
            minibatches).
        prefix: shared prompt prefix; every prompt must start with it, and it is stripped from the
            rows (``prompt_len`` then counts the tokens after it). See :attr:`DecisionBatch.prefix`.
        choices: per decision, the candidate tokens of a restricted one-token choice (see
            :attr:`DecisionBatch.choice_ids`); None = the whole vocabulary.

    Returns:
        DecisionBatch of NumPy arrays.

    Raises:
        ValueError: mismatched lengths, an empty prompt or response, a sequence longer than its
            column budget, a prompt that does not start with ``prefix`` (or has nothing after it), or
            ``choices`` with a response longer than one token or outside its candidates.
    """
    d = len(prompts)
    if not (len(responses) == len(agent_ids) == len(advantages) == d) or d == 0:
        raise ValueError(
            f"need D > 0 equal-length inputs, got {len(prompts)} prompts, "
            f"{len(responses)} responses, {len(agent_ids)} agent ids, "
            f"{len(advantages)} advantages"
        )
    prefix = tuple(int(x) for x in prefix)
    if prefix:
        npre = len(prefix)
        for i, p in enumerate(prompts):
            if len(p) <= npre or tuple(int(x) for x in p[:npre]) != prefix:
                raise ValueError(
                    f"prompt {i} does not start with the shared prefix of {npre} tokens (or has nothing after it)"
                )
        prompts = [p[npre:] for p in prompts]
    if any(len(p) == 0 for p in prompts) or any(len(r) == 0 for r in responses):
        raise ValueError("every prompt and response needs at least one token")
    tp = prompt_len or max(len(p) for p in prompts)
    tr = response_len or max(len(r) for r in responses)
    if max(len(p) for p in prompts) > tp or max(len(r) for r in responses) > tr:
        raise ValueError(f"a prompt or response exceeds prompt_len={tp} / response_len={tr}")
    rows = -(-d // pad_to_multiple) * pad_to_multiple
    tokens = np.full((rows, tp + tr), pad_id, np.int32)
    attn = np.zeros((rows, tp + tr), bool)
    resp = np.zeros((rows, tp + tr), bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        tokens[i, tp - len(p) : tp] = p
        tokens[i, tp : tp + len(r)] = r
        attn[i, tp - len(p) : tp + len(r)] = True
        resp[i, tp : tp + len(r)] = True
    ids = np.zeros((rows,), np.int32)
    ids[:d] = agent_ids
    adv = np.zeros((rows,), np.float32)
    adv[:d] = advantages
    valid = np.zeros((rows,), bool)
    valid[:d] = True
    zeros = np.zeros((rows,), np.float32)
    choice_ids = None
    if choices is not None:
        if len(choices) != d:
            raise ValueError(f"need one candidate list per decision, got {len(choices)} for {d}")
        if tr != 1:
            raise ValueError(f"restricted choices need one-token responses, got response_len={tr}")
        width = max(1, max(len(c) for c in choices))
        choice_ids = np.full((rows, width), -1, np.int32)
        for i, (c, r) in enumerate(zip(choices, responses)):
            if int(r[0]) not in [int(x) for x in c]:
                raise ValueError(f"decision {i}: response token {r[0]} is not among its candidates {list(c)}")
            choice_ids[i, : len(c)] = c
        choice_ids[d:, 0] = pad_id  # padding rows: their (pad) response token is the one candidate
    return DecisionBatch(
        tokens=tokens,
        attention_mask=attn,
        response_mask=resp,
        agent_ids=ids,
        advantages=adv,
        logp_old=zeros,
        logp_ref=zeros.copy(),
        valid=valid,
        choice_ids=choice_ids,
        response_len=tr,
        prefix=prefix,
    )


def trainable(batch: DecisionBatch):
    """``bool[D]``: the valid rows whose log-prob depends on the adapters. Without ``choice_ids`` every valid
    row; with them (``choice_only``) those with two or more candidates: over one candidate the tempered
    log-softmax is exactly 0 (``logsumexp`` of one finite value is that value), whatever the logits."""
    if batch.choice_ids is None:
        return batch.valid
    return batch.valid & ((batch.choice_ids >= 0).sum(-1) > 1)


def trainable_first(batch: DecisionBatch) -> DecisionBatch:
    """The same decisions with the rows in a stable order: :func:`trainable` ones, then the other valid ones
    (forced choices), then padding, so that chunks of forced rows are skipped (module docstring, *Memory*). The
    loss and metrics are sums over rows, so the update is the same up to float32 summation order. NumPy
    batches stay NumPy (a host packing), device batches stay on the device."""
    xp = np if isinstance(batch.valid, np.ndarray) else jnp
    rank = xp.where(trainable(batch), 0, xp.where(batch.valid, 1, 2))
    order = xp.argsort(rank, stable=True)
    return jax.tree.map(lambda x: x[order], batch)  # the static fields (response_len, prefix) are not leaves


def prefix_kv(model: Decoder, prefix: Sequence[int], adapter_rows: jax.Array) -> tuple:
    """The float leaves of the prefix cache (``model.cache_type.prefill``: one row per adapter id, -1 = adapters
    off), which the update differentiates through, and ``model.cache_type.full`` rebuilds the cache from:
    :class:`lora.model.KVCache`'s ``(k, v)``, each [L, R, K, P, H]; :class:`lora.backbones.LayerCache`'s
    ``(k, v, conv, state)`` per layer (Gemma 4 / Qwen3.5)."""
    return model.cache_type.prefill(model, prefix, adapter_rows).floats()


def sequence_logprobs(
    model: Decoder,
    batch: DecisionBatch,
    adapter_ids: jax.Array,
    dropout_key: jax.Array | None = None,
    temperature: float | jax.Array = 1.0,
    prefix_kv: tuple | None = None,
    prefix_rows: jax.Array | None = None,
) -> jax.Array:
    """Summed log-prob of each decision's response tokens, float32[D].

    Args:
        model: the merged decoder.
        batch: decisions (tokens, masks, ``choice_ids``, ``response_len`` and ``prefix`` are read).
        adapter_ids: int32[D] adapter per row; -1 = reference policy (adapters off).
        dropout_key: LoRA dropout key (None = deterministic).
        temperature: sampling temperature of the rollouts; log-probs are those of the tempered
            distribution the responses were sampled from (``MAGRPOConfig.temperature``).
        prefix_kv: with ``batch.prefix``, its K/V per adapter from :func:`prefix_kv`.
        prefix_rows: int32[D] row of ``prefix_kv`` holding each decision's adapter.

    Returns:
        float32[D]: sum over response tokens of log p_T(token | prompt, earlier tokens); for a batch
        with ``choice_ids``, ``logit/T - logsumexp(candidate logits / T)`` of the one response token.

    Raises:
        ValueError: ``batch.prefix`` without ``prefix_kv`` / ``prefix_rows``.
    """
    t = batch.tokens.shape[1]
    tr = min(batch.response_len, t - 1)  # the first column has no predecessor
    cache = None
    if batch.prefix:
        if prefix_kv is None or prefix_rows is None:
            raise ValueError("a batch with a shared prefix needs prefix_kv and prefix_rows")
        cache = model.cache_type.full(*prefix_kv).take(prefix_rows)
    tp = t - tr
    # The response columns' attention is their response mask in every packed batch (pack_decisions, _batch).
    mask = batch.response_mask[:, tp:] & batch.attention_mask[:, tp:]
    logp = sampling.continuation_logprobs(
        model,
        batch.tokens[:, :tp],
        batch.attention_mask[:, :tp],
        batch.tokens[:, tp:],
        mask,
        agent_ids=adapter_ids,
        cache=cache,
        dropout_key=dropout_key,
        temperature=temperature,
        candidates=None if batch.choice_ids is None else batch.choice_ids[:, None, :],
    )
    return logp.sum(axis=1)


# --------------------------------------------------------------------------------------------------
# Per-agent gradient clipping.
# --------------------------------------------------------------------------------------------------


def _agent_axis(leaf: jax.Array) -> int:
    return leaf.ndim - AGENT_AXIS_FROM_END


def agent_global_norms(tree: Any) -> jax.Array:
    """Global L2 norm of each agent's slice of a stacked adapter tree, float32[N].

    Every leaf has its agent axis third from the end; squares are summed over all other axes and
    over leaves.
    """
    total = None
    for leaf in jax.tree.leaves(tree):
        ax = _agent_axis(leaf)
        other = tuple(i for i in range(leaf.ndim) if i != ax)
        sq = jnp.sum(jnp.square(leaf.astype(jnp.float32)), axis=other)
        total = sq if total is None else total + sq
    return jnp.sqrt(total)


def _per_agent(values: jax.Array, leaf: jax.Array) -> jax.Array:
    """Reshapes values[N] to broadcast along ``leaf``'s agent axis."""
    shape = [1] * leaf.ndim
    shape[_agent_axis(leaf)] = values.shape[0]
    return values.reshape(shape)


def clip_by_agent_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Like ``optax.clip_by_global_norm`` but with one norm per agent slice of the adapters.

    Agent i's gradient is scaled by ``max_norm / norm_i`` when ``norm_i >= max_norm`` and left
    bit-identical otherwise, so one agent's large gradient never shrinks another agent's step.
    """

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        del params
        norms = agent_global_norms(updates)
        clip = norms >= max_norm
        scale = jnp.where(clip, max_norm / jnp.where(clip, norms, 1.0), 1.0)
        updates = jax.tree.map(
            lambda g: jnp.where(_per_agent(clip, g), g * _per_agent(scale, g).astype(g.dtype), g), updates
        )
        return updates, state

    return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(config: magrpo.MAGRPOConfig) -> optax.GradientTransformation:
    """Per-agent clip then AdamW (or SGD) at ``config.learning_rate``, over adapter leaves only."""
    if config.optimizer == "adamw":
        opt = optax.adamw(
            config.learning_rate,
            b1=config.adam_b1,
            b2=config.adam_b2,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
    else:
        opt = optax.sgd(config.learning_rate)
    if config.max_grad_norm > 0:
        return optax.chain(clip_by_agent_global_norm(config.max_grad_norm), opt)
    return opt


def _select_agents(keep_new: jax.Array, new: Any, old: Any, shapes: set[tuple[int, ...]]) -> Any:
    """Per agent, ``new`` where keep_new[i] else ``old``, on adapter-shaped leaves (others: new)."""

    def pick(n, o):
        if getattr(n, "ndim", 0) >= AGENT_AXIS_FROM_END and tuple(n.shape) in shapes:
            return jnp.where(_per_agent(keep_new, n), n, o)
        return n

    return jax.tree.map(pick, new, old)


# --------------------------------------------------------------------------------------------------
# Cross-device sums in a fixed order.
# --------------------------------------------------------------------------------------------------

#: The step metrics that are sums over decisions (each a per-agent sum divided by the minibatch's count):
#: their micro-batch and device pieces add up; ``ratio_min`` / ``ratio_max`` are minima / maxima instead.
SUMMED_METRICS = ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean", "count")


def ordered_sum(tree: Any, axis_name: str, axis_size: int) -> Any:
    """Inside :func:`jax.shard_map`: the sum of every device's ``tree`` over mesh axis ``axis_name`` (of
    ``axis_size`` devices), added in device order, ``((x_0 + x_1) + x_2) + ...`` elementwise, on every device.

    A ``psum`` leaves the order to the collective's implementation, and XLA's in-process CPU all-reduce and
    gloo's cross-process one add the devices' partials in different orders (issue #17: ~1e-6 apart). Here the
    collectives only move data: the leaves of each dtype are flattened into one vector, padded to a multiple of
    ``axis_size`` and split into ``axis_size`` slices; an ``all_to_all`` gives device j slice j of every device's
    vector (a reduce-scatter's traffic), device j adds them in device order with explicit adds, and a tiled
    ``all_gather`` returns the summed slices to every device (an all-gather's). Same traffic as a ring
    all-reduce, a few transient copies of the tree (the flat vector, the exchanged slices, the gathered sum: the
    adapters' size, not the activations'), and the result is the same bits whichever way the devices are split
    over processes. The output is replicated (invariant over ``axis_name``)."""
    leaves, treedef = jax.tree.flatten(tree)
    out: list = [None] * len(leaves)
    for dtype in sorted({x.dtype for x in leaves}, key=str):
        idx = [i for i, x in enumerate(leaves) if x.dtype == dtype]
        flat = jnp.concatenate([leaves[i].reshape(-1) for i in idx])
        size = flat.shape[0]
        flat = jnp.pad(flat, (0, -size % axis_size)).reshape(axis_size, -1)
        parts = jax.lax.all_to_all(flat, axis_name, 0, 0)  # row j: device j's slice (this device's)
        total = parts[0]
        for j in range(1, axis_size):
            total = total + parts[j]
        flat = jax.lax.all_gather(total, axis_name, tiled=True, to="invarying")[:size]
        offset = 0
        for i in idx:
            k = leaves[i].size
            out[i] = flat[offset : offset + k].reshape(leaves[i].shape)
            offset += k
    return jax.tree.unflatten(treedef, out)


# --------------------------------------------------------------------------------------------------
# Meshes and the jitted functions.
# --------------------------------------------------------------------------------------------------


def make_mesh(num_devices: int | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh with axis ``"data"`` over the first ``num_devices`` devices (default: all)."""
    devices = list(devices if devices is not None else jax.devices())
    if num_devices is not None:
        devices = devices[:num_devices]
    return Mesh(np.asarray(devices), (DATA_AXIS,))


class TrainStep(NamedTuple):
    """The jitted functions of one PA-MAGRPO configuration (from :func:`make_train_step`).

    Attributes:
        optimizer: the optax transformation (its ``init(adapters)`` gives the optimizer state).
        score: ``(base, adapters, batch, adapter_ids int32[D]) -> float32[D]`` summed response
            log-probs; adapter id -1 = reference policy.
        prepare: ``(base, adapters, batch) -> batch`` with ``logp_ref`` filled by ``score`` with
            adapters off, and ``logp_old`` with the adapters when ``num_minibatches > 1`` (with one
            minibatch the update takes theta_old's log-probs from its first step's forward, and
            ``batch.logp_old`` is not read). Call once per round, before ``update``.
        update: ``(base, adapters, opt_state, batch, key) -> (adapters, opt_state, metrics)``: the
            round's E x minibatch steps; metrics are float32[S, N] per step and adapter (``loss``,
            ``pg_loss``, ``kl``, ``clip_frac``, ``ratio_mean``, ``ratio_min``, ``ratio_max``,
            ``count``, ``grad_norm`` before clipping, ``updated``).
        adapter_ids: host function int32[D] agent ids -> adapter ids (all 0 for a shared adapter).
        mesh: the mesh the functions are sharded over.
        grads: ``(base, adapters, batch, first, counts) -> (grads, prefix_grads, metrics, live)``: what one
            optimizer step of ``update`` sums over its minibatch ``batch`` before the optimizer (for tests and
            diagnostics): the loss's gradient with respect to the adapters through the rows (the prefix K/V held
            fixed), its gradient with respect to the prefix K/V (:func:`prefix_kv` of the adapters; None without
            ``batch.prefix``), which ``update`` then pulls back to the adapters, the step's summed metrics
            (float32[N] each: ``loss`` ... ``count`` as in ``update``, without ``grad_norm`` / ``updated``) and
            the rows' live log-probs float32[D]. ``first``: a bool scalar, the round's first step (theta =
            theta_old); ``counts``: float32[N], the per-agent denominators of the loss
            (:func:`jaxopt_marl.magrpo.group_counts` of the minibatch ``update`` would see).
    """

    optimizer: optax.GradientTransformation
    score: Callable
    prepare: Callable
    update: Callable
    adapter_ids: Callable
    mesh: Mesh
    grads: Callable


def make_train_step(
    graphdef: nnx.GraphDef,
    config: magrpo.MAGRPOConfig,
    mesh: Mesh,
    *,
    num_adapters: int,
    donate: bool = False,
    progress: bool = False,
) -> TrainStep:
    """Builds the jitted, sharded scoring and update functions for one model and configuration.

    Args:
        graphdef: from ``lora.split_model(model)`` (static).
        config: update hyper-parameters.
        mesh: mesh with a ``"data"`` axis over decisions (:func:`make_mesh`).
        num_adapters: N adapters stacked in the model (1 for ``config.shared_adapter``).
        donate: donate the adapter and optimizer buffers to ``update`` (callers must then not reuse
            the arguments).
        progress: compile one host tick per micro-batch into ``prepare`` and ``update`` (module docstring;
            routed by :func:`jaxopt_marl.progress.route`, :func:`progress_ticks` per call).

    Returns:
        :class:`TrainStep`.

    Raises:
        ValueError: shared-adapter mode with a model that has more than one adapter.
    """
    if config.shared_adapter and num_adapters != 1:
        raise ValueError(f"shared_adapter needs a model with one adapter, got {num_adapters}")
    optimizer = make_optimizer(config)
    n = num_adapters
    m = config.num_minibatches
    repl = NamedSharding(mesh, P())
    data = NamedSharding(mesh, P(DATA_AXIS))

    def groups_of(agent_ids):
        return jnp.zeros_like(agent_ids) if config.shared_adapter else agent_ids

    def host_adapter_ids(agent_ids):
        agent_ids = np.asarray(agent_ids, np.int32)
        return np.zeros_like(agent_ids) if config.shared_adapter else agent_ids

    def tick(*deps):
        """One progress tick once ``deps`` (a micro-batch's outputs) are computed; nothing if not ``progress``."""
        if progress:
            progress_lib.tick(*deps)

    def micro_of(size):
        micro = micro_batch_size(config, size)
        if size % micro:
            raise ValueError(f"{size} decisions do not split into micro-batches of {micro}")
        return micro

    def chunked(batch, micro):
        """[D, ...] -> [D / micro, micro, ...], each chunk split over the mesh's data axis."""
        size = batch.num_decisions
        chunks = jax.tree.map(lambda x: x.reshape((size // micro, micro) + x.shape[1:]), batch)
        return jax.lax.with_sharding_constraint(chunks, NamedSharding(mesh, P(None, DATA_AXIS)))

    def prefix_rows_of(ids):
        """Row of the (adapters 0..n-1, reference) prefix K/V for adapter ids (-1 -> row n)."""
        return jnp.where(ids >= 0, ids, n)

    all_rows = jnp.concatenate([jnp.arange(n, dtype=jnp.int32), jnp.full((1,), -1, jnp.int32)])

    # 1. Scoring: one program for theta_old and the reference (adapter id -1), so at B = 0 they agree
    #    bit for bit. With a shared prefix its K/V is computed once (per adapter and for the reference)
    #    and every chunk of decisions continues it.
    def score_chunks(model, batch, id_sets):
        kv = prefix_kv(model, batch.prefix, all_rows) if batch.prefix else None
        micro = micro_of(batch.num_decisions)

        def one(chunk_and_ids):
            chunk, ids = chunk_and_ids

            def run(_):
                return [
                    sequence_logprobs(
                        model,
                        chunk,
                        a,
                        temperature=config.temperature,
                        prefix_kv=kv,
                        prefix_rows=prefix_rows_of(a) if kv is not None else None,
                    )
                    for a in ids
                ]

            # A micro-batch of padding rows or forced choices only (a bucketed decision count; one-letter menus)
            # costs no forward: their log-probs are 0 (trainable).
            out = jax.lax.cond(
                trainable(chunk).any(), run, lambda _: [jnp.zeros(a.shape, jnp.float32) for a in ids], None
            )
            tick(out[0][0])
            return out

        ids = [x.reshape(-1, micro) for x in id_sets]
        out = jax.lax.map(one, (chunked(batch, micro), ids))
        return [o.reshape(-1) for o in out]

    def score(base, adapters, batch, adapter_ids):
        model = nnx.merge(graphdef, adapters, base)
        return score_chunks(model, batch, [adapter_ids])[0]

    score_jit = jax.jit(score, in_shardings=(repl, repl, data, data), out_shardings=data)

    # With one minibatch the first optimizer step sees every decision at theta_old, so its forward
    # gives logp_old (see the module docstring) and only the reference is scored here.
    old_from_first_step = m == 1

    def prepare_fn(base, adapters, batch, groups):
        model = nnx.merge(graphdef, adapters, base)
        ref_ids = jnp.full_like(groups, -1)
        if old_from_first_step:
            return batch.replace(logp_ref=score_chunks(model, batch, [ref_ids])[0])
        old, ref = score_chunks(model, batch, [groups, ref_ids])
        return batch.replace(logp_old=old, logp_ref=ref)

    prepare_jit = jax.jit(prepare_fn, in_shardings=(repl, repl, data, data), out_shardings=data)

    def prepare(base, adapters, batch):
        ids = batch.agent_ids
        if isinstance(ids, jax.Array) and not ids.is_fully_addressable:  # rows on other processes' devices too
            groups = jnp.zeros_like(ids) if config.shared_adapter else ids
        else:
            groups = jax.device_put(jnp.asarray(host_adapter_ids(ids)), data)
        return prepare_jit(base, adapters, batch, groups)

    # 2. One optimizer step on a minibatch, accumulated over micro-batches. A shared prefix's K/V is
    #    computed once per step (one row per adapter) and differentiated through jax.vjp: each
    #    micro-batch returns the gradient with respect to the adapters and to the prefix K/V, and the
    #    summed K/V cotangent is pulled back through the prefix forward once at the end -- the exact
    #    gradient of the loss over the full rows, at the cost of one prefix pass per adapter.
    #    On a mesh of several devices the accumulation runs per device (jax.shard_map over DATA_AXIS, each
    #    device on its own rows of every micro-batch), and the devices' partial sums are added in device
    #    order (ordered_sum): the module docstring's "Sharding".
    sharded = mesh.devices.size > 1

    def varying(tree):
        """Inside the update's shard_map: replicated values as per-device ones, so that a gradient with respect
        to them (or a carry starting from them) stays this device's own, with no implicit cross-device sum."""
        if not sharded:
            return tree
        return jax.tree.map(lambda x: jax.lax.pcast(x, DATA_AXIS, to="varying"), tree)

    def local_tick(dep):
        """One progress tick per micro-batch: on the mesh's first device only when sharded (where the unsharded
        program's callbacks run: logical device 0, process 0's); :func:`tick` otherwise."""
        if sharded and progress:
            jax.lax.cond(jax.lax.axis_index(DATA_AXIS) == 0, tick, lambda _: None, dep)
        else:
            tick(dep)

    def loss_of(lp, old, ref, mb, groups, counts):
        """The PA-MAGRPO loss and metrics (:func:`jaxopt_marl.magrpo.magrpo_loss`) of micro-batch ``mb``'s rows
        with these log-probs, under this configuration."""
        return magrpo.magrpo_loss(
            lp,
            old,
            ref,
            mb.advantages,
            mb.valid,
            groups,
            n,
            clip_eps=config.clip_eps,
            kl_beta=config.kl_beta,
            policy_loss=config.policy_loss,
            kl_estimator=config.kl_estimator,
            counts=counts,
        )

    def grads_and_metrics(base, adapters, kv, mb, first, counts):
        groups = groups_of(mb.agent_ids)

        def loss_fn(adapters, kv):
            model = nnx.merge(graphdef, adapters, base)
            live = sequence_logprobs(
                model,
                mb,
                groups,
                temperature=config.temperature,
                prefix_kv=kv,
                prefix_rows=groups if kv is not None else None,
            )
            # First step of the round: theta == theta_old.
            if old_from_first_step:  # this forward is theta_old's: rho = exp(live - sg(live)) = 1
                old, lp = jnp.where(first, jax.lax.stop_gradient(live), mb.logp_old), live
            else:  # logp_old's value (scored by prepare), the live gradient
                old = mb.logp_old
                lp = jnp.where(first, mb.logp_old + (live - jax.lax.stop_gradient(live)), live)
            loss, metrics = loss_of(lp, old, mb.logp_ref, mb, groups, counts)
            return loss, (metrics, jax.lax.stop_gradient(live))

        (_, (metrics, live)), (grads, kv_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
            adapters, kv
        )
        return grads, kv_grads, metrics, live

    def accumulate(base, adapters, kv, chunks, first, counts):
        """The micro-batch sums of one step over this device's rows of ``chunks`` ([C, micro / devices, ...]
        inside the shard_map; the whole chunks on one device), then added over the devices in device order:
        ``(adapter grads, prefix K/V grads, metrics, live log-probs [C, micro / devices])``. ``counts`` are the
        whole minibatch's, so every device's loss and metric sums are linear pieces of the minibatch's."""
        zeros = lambda t: jax.tree.map(jnp.zeros_like, t)
        big = jnp.finfo(jnp.float32).max
        m0 = {k: jnp.zeros((n,), jnp.float32) for k in SUMMED_METRICS}
        m0["ratio_min"] = jnp.full((n,), big)
        m0["ratio_max"] = jnp.full((n,), -big)
        init = varying((zeros(adapters), zeros(kv), m0))
        adapters, kv = varying(adapters), varying(kv)  # differentiated per device: no implicit psum

        def compute(chunk):
            return grads_and_metrics(base, adapters, kv, chunk, first, counts)

        def skipped(chunk):
            """What a micro-batch of padding rows and forced choices contributes without a forward or backward:
            no gradient, log-probs 0 (:func:`trainable`), and the loss's metric terms of those zeros."""
            g, g_kv, _, live = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(compute, chunk))
            zero = jnp.zeros(chunk.valid.shape, jnp.float32)
            _, m = loss_of(zero, zero, zero, chunk, groups_of(chunk.agent_ids), counts)
            g, g_kv, live = varying((g, g_kv, live))  # m is computed from this device's rows already
            return g, g_kv, m, live

        def acc(carry, chunk):
            g_sum, kv_sum, m_acc = carry
            # A micro-batch whose rows on this device are padding or forced choices only costs this device no
            # forward or backward.
            g, g_kv, m, live = jax.lax.cond(trainable(chunk).any(), compute, skipped, chunk)
            local_tick(m["count"][0])
            g_sum = jax.tree.map(jnp.add, g_sum, g)
            kv_sum = jax.tree.map(jnp.add, kv_sum, g_kv)
            m_acc = {
                k: (jnp.minimum if k == "ratio_min" else jnp.maximum if k == "ratio_max" else jnp.add)(m_acc[k], v)
                for k, v in m.items()
            }
            return (g_sum, kv_sum, m_acc), live

        (grads, kv_grads, metrics), live = jax.lax.scan(acc, init, chunks)
        if not sharded:
            return grads, kv_grads, metrics, live
        # The devices' partial sums, added in device order (bit-identical under any process layout); min and max
        # do not depend on the order.
        sums = ordered_sum((grads, kv_grads, {k: metrics[k] for k in SUMMED_METRICS}), DATA_AXIS, mesh.devices.size)
        grads, kv_grads, metrics_sum = sums
        metrics = {
            **metrics_sum,
            "ratio_min": jax.lax.pmin(metrics["ratio_min"], DATA_AXIS),
            "ratio_max": jax.lax.pmax(metrics["ratio_max"], DATA_AXIS),
        }
        return grads, kv_grads, metrics, live

    if sharded:
        accumulate = jax.shard_map(
            accumulate,
            mesh=mesh,
            in_specs=(P(), P(), P(), P(None, DATA_AXIS), P(), P()),
            out_specs=(P(), P(), P(), P(None, DATA_AXIS)),
        )

    def step(base, adapters, opt_state, mb, first):
        # The whole minibatch's per-agent counts (integers: exact under any reduction order).
        counts = magrpo.group_counts(groups_of(mb.agent_ids), mb.valid, n)
        micro = micro_of(mb.num_decisions)
        kv, prefix_vjp = None, None
        if mb.prefix:
            kv, prefix_vjp = jax.vjp(
                lambda ad: prefix_kv(nnx.merge(graphdef, ad, base), mb.prefix, all_rows[:n]), adapters
            )
        grads, kv_grads, metrics, live = accumulate(base, adapters, kv, chunked(mb, micro), first, counts)
        if prefix_vjp is not None:
            grads = jax.tree.map(jnp.add, grads, prefix_vjp(kv_grads)[0])
        metrics["grad_norm"] = agent_global_norms(grads)
        updates, new_opt = optimizer.update(grads, opt_state, adapters)
        new_adapters = optax.apply_updates(adapters, updates)
        has_data = counts > 0
        shapes = {tuple(x.shape) for x in jax.tree.leaves(adapters)}
        new_adapters = _select_agents(has_data, new_adapters, adapters, shapes)
        new_opt = _select_agents(has_data, new_opt, opt_state, shapes)
        metrics["updated"] = has_data.astype(jnp.float32)
        return new_adapters, new_opt, metrics, live.reshape(-1)

    def grads(base, adapters, mb, first, counts):
        kv = prefix_kv(nnx.merge(graphdef, adapters, base), mb.prefix, all_rows[:n]) if mb.prefix else None
        g, g_kv, metrics, live = accumulate(base, adapters, kv, chunked(mb, micro_of(mb.num_decisions)), first, counts)
        return g, g_kv, metrics, live.reshape(-1)

    grads_jit = jax.jit(grads, in_shardings=(repl, repl, data, repl, repl), out_shardings=(repl, repl, repl, data))

    # 3. The round: E epochs x m minibatches, scanned so it compiles once.
    def update(base, adapters, opt_state, batch, key):
        d = batch.num_decisions
        if d % m:
            raise ValueError(f"{d} decisions do not split into {m} minibatches")
        steps = config.epochs * m
        if m > 1:
            keys = jax.random.split(key, config.epochs)
            perms = jax.vmap(lambda k: jax.random.permutation(k, d))(keys)
            order = perms.reshape(steps, d // m)
        else:
            order = jnp.zeros((steps, 0), jnp.int32)  # unused: every step sees the whole batch

        def body(carry, xs):
            adapters, opt_state, logp_old = carry
            i, idx = xs
            if m > 1:
                mb = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), batch)
                mb = jax.lax.with_sharding_constraint(mb, data)
            else:  # every step sees the whole batch; logp_old comes from the first step
                mb = batch.replace(logp_old=logp_old)
            adapters, opt_state, metrics, live = step(base, adapters, opt_state, mb, i == 0)
            if old_from_first_step:
                logp_old = jnp.where(i == 0, live, logp_old)
            return (adapters, opt_state, logp_old), metrics

        (adapters, opt_state, _), metrics = jax.lax.scan(
            body, (adapters, opt_state, batch.logp_old), (jnp.arange(steps), order)
        )
        return adapters, opt_state, metrics

    update_jit = jax.jit(
        update,
        in_shardings=(repl, repl, repl, data, repl),
        out_shardings=(repl, repl, repl),
        donate_argnums=(1, 2) if donate else (),
    )
    return TrainStep(
        optimizer=optimizer,
        score=score_jit,
        prepare=prepare,
        update=update_jit,
        adapter_ids=host_adapter_ids,
        mesh=mesh,
        grads=grads_jit,
    )


def init_opt_state(train_step: TrainStep, adapters: nnx.State) -> Any:
    """Optimizer state for ``adapters``, replicated over the train step's mesh."""
    state = train_step.optimizer.init(adapters)
    return jax.device_put(state, NamedSharding(train_step.mesh, P()))


def shard_batch(batch: DecisionBatch, mesh: Mesh) -> DecisionBatch:
    """Places a (host) batch on ``mesh`` split along the decision axis."""
    return jax.device_put(batch, NamedSharding(mesh, P(DATA_AXIS)))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Places a pytree (base or adapter state) replicated on every device of ``mesh``."""
    return jax.device_put(tree, NamedSharding(mesh, P()))
