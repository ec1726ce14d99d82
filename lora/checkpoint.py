"""Adapter checkpoints with orbax-checkpoint: every agent's adapter, the optimizer state and the step.

Only the adapter state (``nnx.LoRAParam`` leaves) and the optax state over it are written -- the
frozen base is reloaded from its own file. ``CheckpointManager`` writes each step into a temporary
directory and renames it when complete, so a run killed mid-save leaves the previous step intact and
``latest_step()`` never points at a partial checkpoint.

A checkpoint damaged after it was written (a truncated or overwritten file, a disk error) is what the
rename cannot protect against. :func:`save` therefore also writes ``<step>/checksums.json``: the size and
SHA-256 of every file of the step, written after orbax has finished (atomically, by rename). :func:`verify`
compares a step directory against it and names the first file that differs, so a corrupt checkpoint is found
(and named) without asking TensorStore to read it. A step without ``checksums.json`` (written before this file
existed, or by a run killed between orbax's rename and the manifest's) cannot be verified this way; a failed
:func:`restore` of it is summarised in one line by :func:`describe_error`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx


def make_manager(directory: str, max_to_keep: int | None = 3) -> ocp.CheckpointManager:
    """A CheckpointManager over ``directory`` (created if needed) with items adapters/opt_state/meta."""
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False)
    return ocp.CheckpointManager(
        os.path.abspath(directory), options=options, item_names=("adapters", "opt_state", "meta")
    )


def save(manager: ocp.CheckpointManager, step: int, adapters: nnx.State, opt_state, meta: dict | None = None) -> None:
    """Writes one checkpoint atomically and waits for it to finish.

    Args:
      manager: from :func:`make_manager`.
      step: training step (round) number.
      adapters: ``nnx.State`` of LoRAParam leaves (``split_model(model)[1]``), [L, N, ...] arrays.
      opt_state: optax state over ``adapters`` (any pytree of arrays); None = adapters only (no ``opt_state``
        item, e.g. the best-adapters checkpoint, which is only ever evaluated).
      meta: small JSON-serialisable dict (e.g. LoRA config, seed).
    """
    items = dict(
        adapters=ocp.args.StandardSave(nnx.to_pure_dict(adapters)),
        meta=ocp.args.JsonSave(dict(meta or {}, step=int(step))),
    )
    if opt_state is not None:
        items["opt_state"] = ocp.args.StandardSave(opt_state)
    manager.save(step, args=ocp.args.Composite(**items))
    manager.wait_until_finished()
    # Multi-process (jax.distributed): every process saves its shards, process 0 writes the manifest, and no
    # process goes on (e.g. to verify the step) before it exists.
    if jax.process_index() == 0:
        write_checksums(step_dir(manager, step))
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"checkpoint-checksums-{step}")


#: Name of the per-step manifest written by :func:`save` (sizes and SHA-256 of the step's files).
CHECKSUMS = "checksums.json"


def step_dir(manager: ocp.CheckpointManager, step: int) -> Path:
    """The directory of ``step`` in ``manager`` (orbax's default step naming: the step number)."""
    return Path(str(manager.directory)) / str(int(step))


def _files(directory: Path) -> list[Path]:
    return sorted(f for f in directory.rglob("*") if f.is_file() and f.name != CHECKSUMS)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def write_checksums(directory: Path) -> None:
    """Writes ``directory/checksums.json``: ``{"files": {relative path: [size in bytes, sha256 hex]}}``."""
    directory = Path(directory)
    files = {str(f.relative_to(directory)): [f.stat().st_size, _sha256(f)] for f in _files(directory)}
    tmp = directory / (CHECKSUMS + ".tmp")
    tmp.write_text(json.dumps({"files": files}, indent=0) + "\n")
    tmp.replace(directory / CHECKSUMS)


def verify(directory: Path) -> str | None:
    """Checks a step directory against its ``checksums.json``.

    Args:
      directory: one step of a checkpoint directory (``.../checkpoints/<step>``).

    Returns:
      None if every listed file has its recorded size and SHA-256 (or if the step has no ``checksums.json``:
      nothing to check against), else one line naming the first bad file (its path) and what is wrong: missing,
      truncated or grown (sizes in bytes), or changed (checksum). An unreadable ``checksums.json`` is reported
      the same way.
    """
    directory = Path(directory)
    man = directory / CHECKSUMS
    if not man.exists():
        return None
    try:
        files = json.loads(man.read_text())["files"]
        items = [(str(k), int(v[0]), str(v[1])) for k, v in files.items()]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return f"{man} is unreadable ({type(e).__name__})"
    for rel, size, digest in items:
        f = directory / rel
        if not f.is_file():
            return f"{f} is missing"
        got = f.stat().st_size
        if got != size:
            return f"{f} is {'truncated' if got < size else 'longer than written'} ({got} bytes, {size} written)"
        if _sha256(f) != digest:
            return f"{f} has changed since it was written (SHA-256 differs)"
    return None


def describe_error(e: BaseException, limit: int = 300) -> str:
    """One line for an exception raised by orbax / TensorStore on a damaged checkpoint: its type and the first
    line of its message, cut before TensorStore's spec dump ("See full TensorStore details") and at ``limit``
    characters."""
    msg = str(e).split("See full TensorStore details")[0].strip().splitlines()
    msg = msg[0].strip() if msg else ""
    if len(msg) > limit:
        msg = msg[: limit - 3] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def restore(manager: ocp.CheckpointManager, adapters: nnx.State, opt_state, step: int | None = None):
    """Restores (adapters, opt_state, meta) at ``step`` (default: latest) into the given templates.

    Args:
      adapters: adapter state with the right structure/shapes (its values are replaced in place).
      opt_state: optax state template (e.g. ``optimizer.init(adapters)``); None = the adapters only (the
        returned opt_state is None).
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
    items = dict(
        adapters=ocp.args.StandardRestore(abstract(nnx.to_pure_dict(adapters))),
        meta=ocp.args.JsonRestore(),
    )
    if opt_state is not None:
        items["opt_state"] = ocp.args.StandardRestore(abstract(opt_state))
    out = manager.restore(step, args=ocp.args.Composite(**items))
    nnx.replace_by_pure_dict(adapters, out["adapters"])
    return adapters, out["opt_state"] if opt_state is not None else None, out["meta"]


def restore_meta(manager: ocp.CheckpointManager, step: int) -> dict:
    """The meta dict of ``step`` alone (no arrays read): e.g. to compare its LoRA config before a restore."""
    return dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
