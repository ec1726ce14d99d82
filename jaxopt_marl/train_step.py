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
- *Exact ratio at the first step.* ``logp_old`` and ``logp_ref`` come from one jitted scoring program
  (:attr:`TrainStep.score`; the reference is the same program with adapter id -1, i.e. adapters off).
  At the first optimizer step of a round the parameters *are* theta_old, so the live log-probs equal
  ``logp_old`` up to rounding between two XLA programs; the step uses the value of ``logp_old`` and the
  gradient of the live pass (``logp_old + live - stop_gradient(live)``). Hence rho = 1 exactly on the
  first step (the whole first epoch when ``num_minibatches = 1``), and with fresh adapters (B = 0) the
  KL term is exactly 0.
- *Sharding.* A :class:`jax.sharding.Mesh` with one axis ``"data"`` over decisions: the batch is split
  along D, adapters / base / optimizer state are replicated, and XLA all-reduces the loss sums. The same
  function runs on one CPU device and on many; D must be a multiple of the device count times the
  minibatch count (:func:`pack_decisions` pads with invalid decisions).
- *Memory.* ``MAGRPOConfig.micro_batch`` splits each optimizer step's forward/backward into chunks
  whose gradients are summed (weights use the whole minibatch's per-agent counts, so the step is the
  same up to rounding); each chunk must also split evenly over the devices.
- *Token layout.* Each decision is one row ``[prompt, left-padded | response, right-padded]`` of
  ``tokens: int32[D, T]``; the response occupies the last ``response_len`` columns, so only those
  columns go through the vocabulary head (:func:`lora.sampling.continuation_logprobs`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxopt_marl import magrpo
from lora.model import Decoder
from lora.sampling import continuation_logprobs

# Mesh axis over decisions.
DATA_AXIS = "data"
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
            :attr:`TrainStep.score`).
        logp_ref: float32[D] the same under the reference policy (adapters off).
        valid: bool[D] real decisions (False = padding).
        response_len: static number of response columns (part of the compiled shape).
    """

    tokens: jax.Array
    attention_mask: jax.Array
    response_mask: jax.Array
    agent_ids: jax.Array
    advantages: jax.Array
    logp_old: jax.Array
    logp_ref: jax.Array
    valid: jax.Array
    # Static: changing it recompiles, so callers keep it fixed per run.
    response_len: int = flax.struct.field(pytree_node=False, default=1)

    @property
    def num_decisions(self) -> int:
        return self.tokens.shape[0]


def pack_decisions(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                   agent_ids: Sequence[int], advantages: Sequence[float], *, pad_id: int = 0,
                   prompt_len: int | None = None, response_len: int | None = None,
                   pad_to_multiple: int = 1) -> DecisionBatch:
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

    Returns:
        DecisionBatch of NumPy arrays.

    Raises:
        ValueError: mismatched lengths, an empty prompt or response, or a sequence longer than its
            column budget.
    """
    d = len(prompts)
    if not (len(responses) == len(agent_ids) == len(advantages) == d) or d == 0:
        raise ValueError(f"need D > 0 equal-length inputs, got {len(prompts)} prompts, "
                         f"{len(responses)} responses, {len(agent_ids)} agent ids, "
                         f"{len(advantages)} advantages")
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
        tokens[i, tp - len(p):tp] = p
        tokens[i, tp:tp + len(r)] = r
        attn[i, tp - len(p):tp + len(r)] = True
        resp[i, tp:tp + len(r)] = True
    ids = np.zeros((rows,), np.int32)
    ids[:d] = agent_ids
    adv = np.zeros((rows,), np.float32)
    adv[:d] = advantages
    valid = np.zeros((rows,), bool)
    valid[:d] = True
    zeros = np.zeros((rows,), np.float32)
    return DecisionBatch(tokens=tokens, attention_mask=attn, response_mask=resp, agent_ids=ids,
                         advantages=adv, logp_old=zeros, logp_ref=zeros.copy(), valid=valid,
                         response_len=tr)


def sequence_logprobs(model: Decoder, batch: DecisionBatch, adapter_ids: jax.Array,
                      dropout_key: jax.Array | None = None,
                      temperature: float | jax.Array = 1.0) -> jax.Array:
    """Summed log-prob of each decision's response tokens, float32[D].

    Args:
        model: the merged decoder.
        batch: decisions (only tokens, masks and ``response_len`` are read).
        adapter_ids: int32[D] adapter per row; -1 = reference policy (adapters off).
        dropout_key: LoRA dropout key (None = deterministic).
        temperature: sampling temperature of the rollouts; log-probs are those of the tempered
            distribution the responses were sampled from (``MAGRPOConfig.temperature``).
    """
    t = batch.tokens.shape[1]
    tr = min(batch.response_len, t - 1)  # the first column has no predecessor
    per_token = continuation_logprobs(
        model, batch.tokens[:, :-tr], batch.attention_mask[:, :-tr], batch.tokens[:, -tr:],
        batch.response_mask[:, -tr:] & batch.attention_mask[:, -tr:], agent_ids=adapter_ids,
        dropout_key=dropout_key, temperature=temperature)
    return per_token.sum(axis=1)


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
            lambda g: jnp.where(_per_agent(clip, g), g * _per_agent(scale, g).astype(g.dtype), g),
            updates)
        return updates, state

    return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(config: magrpo.MAGRPOConfig) -> optax.GradientTransformation:
    """Per-agent clip then AdamW (or SGD) at ``config.learning_rate``, over adapter leaves only."""
    if config.optimizer == "adamw":
        opt = optax.adamw(config.learning_rate, b1=config.adam_b1, b2=config.adam_b2,
                          eps=config.adam_eps, weight_decay=config.weight_decay)
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
        prepare: ``(base, adapters, batch) -> batch`` with ``logp_old`` and ``logp_ref`` filled by
            ``score`` (call once per round, before ``update``).
        update: ``(base, adapters, opt_state, batch, key) -> (adapters, opt_state, metrics)``: the
            round's E x minibatch steps; metrics are float32[S, N] per step and adapter (``loss``,
            ``pg_loss``, ``kl``, ``clip_frac``, ``ratio_mean``, ``ratio_min``, ``ratio_max``,
            ``count``, ``grad_norm`` before clipping, ``updated``).
        adapter_ids: host function int32[D] agent ids -> adapter ids (all 0 for a shared adapter).
        mesh: the mesh the functions are sharded over.
    """

    optimizer: optax.GradientTransformation
    score: Callable
    prepare: Callable
    update: Callable
    adapter_ids: Callable
    mesh: Mesh


def make_train_step(graphdef: nnx.GraphDef, config: magrpo.MAGRPOConfig, mesh: Mesh, *,
                    num_adapters: int, donate: bool = False) -> TrainStep:
    """Builds the jitted, sharded scoring and update functions for one model and configuration.

    Args:
        graphdef: from ``lora.split_model(model)`` (static).
        config: update hyper-parameters.
        mesh: mesh with a ``"data"`` axis over decisions (:func:`make_mesh`).
        num_adapters: N adapters stacked in the model (1 for ``config.shared_adapter``).
        donate: donate the adapter and optimizer buffers to ``update`` (callers must then not reuse
            the arguments).

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

    # 1. Scoring: one program for theta_old and the reference (adapter id -1), so at B = 0 they agree
    #    bit for bit.
    def score(base, adapters, batch, adapter_ids):
        model = nnx.merge(graphdef, adapters, base)
        return sequence_logprobs(model, batch, adapter_ids, temperature=config.temperature)

    score_jit = jax.jit(score, in_shardings=(repl, repl, data, data), out_shardings=data)

    def prepare(base, adapters, batch):
        groups = jnp.asarray(host_adapter_ids(batch.agent_ids))
        groups = jax.device_put(groups, data)
        old = score_jit(base, adapters, batch, groups)
        ref = score_jit(base, adapters, batch, jax.device_put(jnp.full_like(groups, -1), data))
        return batch.replace(logp_old=old, logp_ref=ref)

    # 2. One optimizer step on a minibatch, optionally accumulated over micro-batches.
    def grads_and_metrics(base, adapters, mb, first, counts):
        groups = groups_of(mb.agent_ids)

        def loss_fn(adapters):
            model = nnx.merge(graphdef, adapters, base)
            live = sequence_logprobs(model, mb, groups, temperature=config.temperature)
            # First step of the round: theta == theta_old, take logp_old's value, the live gradient.
            lp = jnp.where(first, mb.logp_old + (live - jax.lax.stop_gradient(live)), live)
            return magrpo.magrpo_loss(
                lp, mb.logp_old, mb.logp_ref, mb.advantages, mb.valid, groups, n,
                clip_eps=config.clip_eps, kl_beta=config.kl_beta,
                policy_loss=config.policy_loss, kl_estimator=config.kl_estimator, counts=counts)

        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(adapters)
        return grads, metrics

    def step(base, adapters, opt_state, mb, first):
        counts = magrpo.group_counts(groups_of(mb.agent_ids), mb.valid, n)
        size = mb.num_decisions
        micro = config.micro_batch if 0 < config.micro_batch < size else size
        if size % micro:
            raise ValueError(f"minibatch of {size} decisions does not split into micro-batches of "
                             f"{micro}")
        if micro == size:
            grads, metrics = grads_and_metrics(base, adapters, mb, first, counts)
        else:
            chunks = jax.tree.map(lambda x: x.reshape((size // micro, micro) + x.shape[1:]), mb)
            chunks = jax.lax.with_sharding_constraint(chunks, NamedSharding(mesh, P(None, DATA_AXIS)))

            def acc(carry, chunk):
                g_sum, m_acc = carry
                g, m = grads_and_metrics(base, adapters, chunk, first, counts)
                g_sum = jax.tree.map(jnp.add, g_sum, g)
                m_acc = {k: (jnp.minimum if k == "ratio_min" else
                             jnp.maximum if k == "ratio_max" else jnp.add)(m_acc[k], v)
                         for k, v in m.items()}
                return (g_sum, m_acc), None

            big = jnp.finfo(jnp.float32).max
            m0 = {k: jnp.zeros((n,), jnp.float32) for k in
                  ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean", "count")}
            m0["ratio_min"] = jnp.full((n,), big)
            m0["ratio_max"] = jnp.full((n,), -big)
            (grads, metrics), _ = jax.lax.scan(
                acc, (jax.tree.map(jnp.zeros_like, adapters), m0), chunks)
        metrics["grad_norm"] = agent_global_norms(grads)
        updates, new_opt = optimizer.update(grads, opt_state, adapters)
        new_adapters = optax.apply_updates(adapters, updates)
        has_data = counts > 0
        shapes = {tuple(x.shape) for x in jax.tree.leaves(adapters)}
        new_adapters = _select_agents(has_data, new_adapters, adapters, shapes)
        new_opt = _select_agents(has_data, new_opt, opt_state, shapes)
        metrics["updated"] = has_data.astype(jnp.float32)
        return new_adapters, new_opt, metrics

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
            adapters, opt_state = carry
            i, idx = xs
            if m > 1:
                mb = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), batch)
                mb = jax.lax.with_sharding_constraint(mb, data)
            else:
                mb = batch
            adapters, opt_state, metrics = step(base, adapters, opt_state, mb, i == 0)
            return (adapters, opt_state), metrics

        (adapters, opt_state), metrics = jax.lax.scan(
            body, (adapters, opt_state), (jnp.arange(steps), order))
        return adapters, opt_state, metrics

    update_jit = jax.jit(update, in_shardings=(repl, repl, repl, data, repl),
                         out_shardings=(repl, repl, repl),
                         donate_argnums=(1, 2) if donate else ())
    return TrainStep(optimizer=optimizer, score=score_jit, prepare=prepare, update=update_jit,
                     adapter_ids=host_adapter_ids, mesh=mesh)


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
