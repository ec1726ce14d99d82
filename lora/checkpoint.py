"""Adapter checkpoints with orbax-checkpoint: every agent's adapter, the optimizer state and the step.

Only the adapter state (``nnx.LoRAParam`` leaves) and the optax state over it are written -- the
frozen base is reloaded from its own file. ``CheckpointManager`` writes each step into a temporary
directory and renames it when complete, so a run killed mid-save leaves the previous step intact and
``latest_step()`` never points at a partial checkpoint.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp
from flax import nnx


def make_manager(directory: str, max_to_keep: int | None = 3) -> ocp.CheckpointManager:
  """A CheckpointManager over ``directory`` (created if needed) with items adapters/opt_state/meta."""
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options,
                               item_names=("adapters", "opt_state", "meta"))


def save(manager: ocp.CheckpointManager, step: int, adapters: nnx.State, opt_state,
         meta: dict | None = None) -> None:
  """Writes one checkpoint atomically and waits for it to finish.

  Args:
    manager: from :func:`make_manager`.
    step: training step (round) number.
    adapters: ``nnx.State`` of LoRAParam leaves (``split_model(model)[1]``), [L, N, ...] arrays.
    opt_state: optax state over ``adapters`` (any pytree of arrays).
    meta: small JSON-serialisable dict (e.g. LoRA config, seed).
  """
  manager.save(step, args=ocp.args.Composite(
      adapters=ocp.args.StandardSave(nnx.to_pure_dict(adapters)),
      opt_state=ocp.args.StandardSave(opt_state),
      meta=ocp.args.JsonSave(dict(meta or {}, step=int(step)))))
  manager.wait_until_finished()


def restore(manager: ocp.CheckpointManager, adapters: nnx.State, opt_state, step: int | None = None):
  """Restores (adapters, opt_state, meta) at ``step`` (default: latest) into the given templates.

  Args:
    adapters: adapter state with the right structure/shapes (its values are replaced in place).
    opt_state: optax state template (e.g. ``optimizer.init(adapters)``).
    step: step to restore; None = latest complete checkpoint.

  Returns:
    (adapters nnx.State, opt_state, meta dict with "step").

  Raises:
    FileNotFoundError: if the directory holds no checkpoint.
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"{manager.directory}: no checkpoint to restore")
  abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
  out = manager.restore(step, args=ocp.args.Composite(
      adapters=ocp.args.StandardRestore(abstract(nnx.to_pure_dict(adapters))),
      opt_state=ocp.args.StandardRestore(abstract(opt_state)),
      meta=ocp.args.JsonRestore()))
  nnx.replace_by_pure_dict(adapters, out["adapters"])
  return adapters, out["opt_state"], out["meta"]
