"""Multi-process (multi-host) training with :mod:`jax.distributed` (issue #17).

One Python process per host (or per GPU, or several CPU processes on one machine joined by gloo collectives).
:func:`initialize` joins the processes and returns a :class:`Context`: the global 1-D ``"data"`` mesh over every
process's devices, this process's share of the K rollouts, and the collectives the trainer needs
(:class:`jaxopt_marl.trainer.Trainer` with ``dist=``):

- **Rollouts.** Process p plays rollouts ``share(K)`` = ``[p K/P, (p+1) K/P)`` (contiguous) on its own first
  device; the returns are gathered (the cohort-normalised advantage needs all K) in rollout order, so every process
  computes the same K advantages as one process playing all K.
- **The update.** Each process's decision rows are gathered (host arrays, a few hundred KB a round), merged into
  the order one process playing all K would have recorded them (decision wave, then rollout, then agent: the
  compiled rollout's own order, :mod:`jaxopt_marl.compiled_rollout`), and laid out on the global mesh split by
  row (every process places only its own devices' rows). The batch is therefore the single-process batch, row for
  row, and the update is the same sharded program over the same mesh shape.
- **Run files.** Only :meth:`Context.is_writer` (process 0) writes ``metrics.jsonl``, ``decisions/`` and reports;
  orbax checkpoints are written and restored by every process (orbax's multi-host path: process 0 writes the
  metadata, each process its shards, with barriers in between).

Configuration (explicit arguments win over the environment):

- ``JAXOPT_MARL_COORDINATOR`` (or ``JAX_COORDINATOR_ADDRESS``): ``host:port`` of process 0's coordinator service;
- ``JAXOPT_MARL_NUM_PROCESSES`` (or ``JAX_NUM_PROCESSES``): P;
- ``JAXOPT_MARL_PROCESS_ID`` (or ``JAX_PROCESS_ID``): this process's id in ``0..P-1``.

With none of them, :func:`initialize` leaves the discovery to :func:`jax.distributed.initialize` (SLURM, Open MPI,
Cloud TPU slices set their own variables). On CPU the cross-process collectives are gloo's
(``jax_cpu_collectives_implementation``); it has to be set before the first computation, so :func:`initialize`
is called before any JAX compute.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

#: The update's mesh axis over decisions (:data:`jaxopt_marl.train_step.DATA_AXIS`; not imported from there, so
#: that importing this module initialises nothing before :func:`initialize`).
DATA_AXIS = "data"

#: Environment variables read by :func:`initialize` (ours first, then JAX's names).
ENV_COORDINATOR = ("JAXOPT_MARL_COORDINATOR", "JAX_COORDINATOR_ADDRESS")
ENV_NUM_PROCESSES = ("JAXOPT_MARL_NUM_PROCESSES", "JAX_NUM_PROCESSES")
ENV_PROCESS_ID = ("JAXOPT_MARL_PROCESS_ID", "JAX_PROCESS_ID")
#: Seconds a process waits for the others at :func:`initialize` (and at a barrier) before it fails.
DEFAULT_TIMEOUT = 300
#: Seconds a process waits at :meth:`Context.wait` while process 0 works alone (burn-in, evaluation, report).
LONG_WAIT = 6 * 3600


#: Times each :meth:`Context.wait` barrier name was used (a coordination-service barrier id is used once).
_WAITS: dict[str, int] = {}


def _env(names: Sequence[str]) -> str | None:
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return None


@dataclasses.dataclass(frozen=True)
class Context:
    """This process's place in a (possibly one-process) run.

    Attributes:
        process_id: this process, ``0..num_processes-1``.
        num_processes: P.
        mesh: the global 1-D ``"data"`` mesh over every process's devices (process-major order).
    """

    process_id: int
    num_processes: int
    mesh: Mesh

    @property
    def multi(self) -> bool:
        """More than one process (collectives go through :mod:`jax.distributed`)."""
        return self.num_processes > 1

    def is_writer(self) -> bool:
        """Only process 0 writes run files (metrics, decisions, reports)."""
        return self.process_id == 0

    @property
    def local_device(self) -> jax.Device:
        """The device this process plays its rollouts on (its first)."""
        return jax.local_devices()[0]

    # -- shares --------------------------------------------------------------------------------------------

    def share(self, k: int) -> range:
        """This process's rollouts of a round's K: a contiguous block, process-major, so the concatenation
        over processes is rollouts ``0..K-1`` in order.

        Raises:
            ValueError: K is not a multiple of the process count (numbers named).
        """
        check_divides(k, self.num_processes)
        per = k // self.num_processes
        return range(self.process_id * per, (self.process_id + 1) * per)

    # -- collectives ---------------------------------------------------------------------------------------

    def barrier(self, name: str) -> None:
        """Waits until every process reaches the barrier ``name`` (nothing with one process)."""
        if self.multi:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(name)

    def wait(self, name: str, timeout: float = None) -> None:
        """Waits until every process reaches the barrier ``name``, at most ``timeout`` seconds (default
        :data:`LONG_WAIT`): through the coordination service of :mod:`jax.distributed` (no device collective,
        so nothing times out in gloo while process 0 evaluates alone). Nothing with one process.

        Raises:
            RuntimeError: the others did not arrive in time (the barrier and the timeout named), or one died.
        """
        if not self.multi:
            return
        from jax._src import distributed as jax_dist

        timeout = LONG_WAIT if timeout is None else timeout
        client = jax_dist.global_state.client
        if client is None:  # a cluster whose processes were not joined through jax.distributed.initialize
            self.barrier(name)
            return
        n = _WAITS[name] = _WAITS.get(name, 0) + 1  # every process calls the same barriers in the same order
        try:
            client.wait_at_barrier(f"jaxopt_marl:{name}:{n}", int(timeout * 1000))
        except Exception as e:  # XLA status errors
            raise RuntimeError(
                f"distributed: process {self.process_id} waited {timeout:g} s for the others at {name!r} "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            ) from e

    def agree(self, error: str | None) -> None:
        """Every process's verdict on its checks before any compute: raises in every process if one of them
        found bad input (``error``: its message, None: fine), naming the process, so none is left waiting for
        a peer that stopped. Nothing with one process but raising ``error``."""
        errors = self.allgather_json(error) if self.multi else [error]
        bad = [(p, e) for p, e in enumerate(errors) if e is not None]
        if bad:
            if error is not None:
                raise ValueError(error)
            p, e = bad[0]
            raise ValueError(f"process {p} refused the run: {e}")

    def allgather(self, x: np.ndarray) -> np.ndarray:
        """``[P, ...]``: every process's ``x`` (same shape and dtype everywhere), in process order."""
        x = np.asarray(x)
        if not self.multi:
            return x[None]
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=False))

    def gather_returns(self, local: np.ndarray) -> np.ndarray:
        """float32[K]: the team returns of every process's share, in rollout order."""
        return self.allgather(np.asarray(local, np.float32)).reshape(-1)

    def allgather_json(self, obj) -> list:
        """Every process's JSON-serialisable ``obj``, in process order."""
        raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
        sizes = self.allgather(np.asarray([raw.size], np.int64)).reshape(-1)
        buf = np.zeros((int(sizes.max()),), np.uint8)
        buf[: raw.size] = raw
        got = self.allgather(buf)
        return [json.loads(bytes(got[i, : int(sizes[i])]).decode()) for i in range(self.num_processes)]

    # -- placement -----------------------------------------------------------------------------------------

    def replicate(self, tree):
        """``tree`` (the same values on every process) replicated over the global mesh."""
        sharding = NamedSharding(self.mesh, P())

        def put(x):
            host = to_host(x)
            return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

        return jax.tree.map(put, tree)

    def shard_rows(self, tree):
        """A host pytree with the same values on every process (e.g. the round's global
        :class:`jaxopt_marl.train_step.DecisionBatch`) split along its first axis over the global mesh; each
        process places only its own devices' rows."""
        sharding = NamedSharding(self.mesh, P(DATA_AXIS))

        def put(x):
            host = to_host(x)
            return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

        return jax.tree.map(put, tree)

    def local(self, tree):
        """Single-device copies on :attr:`local_device` of a replicated global pytree (what the rollout plays)."""
        return jax.device_put(jax.tree.map(to_host, tree), self.local_device)

    def from_local_rows(self, tree):
        """The global array of each process's local rows (all processes the same row count), process-major:
        :func:`jax.make_array_from_process_local_data` over the mesh's data axis."""
        sharding = NamedSharding(self.mesh, P(DATA_AXIS))
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, to_host(x)), tree)


def to_host(x) -> np.ndarray:
    """NumPy value of ``x``; a replicated global array is read from this process's first shard."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if not x.is_fully_replicated:
            raise ValueError(f"an array sharded over other processes cannot be read here ({x.sharding})")
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)


def check_divides(k: int, num_processes: int, num_agents: int | None = None) -> None:
    """Refuses (before any compute) a rollout count K that does not split evenly over the processes.

    A process plays whole joint rollouts (all agents of an episode act in one program), so the unit split over
    the processes is the rollout: K must be a multiple of P; then the round's K x agents decisions split evenly
    too. ``num_agents`` only adds the K x agents figure to the message.
    """
    if num_processes < 1:
        raise ValueError(f"the process count must be >= 1, got {num_processes}")
    if k % num_processes:
        rows = f" (K x agents = {k} x {num_agents} = {k * num_agents} decisions a wave)" if num_agents else ""
        raise ValueError(
            f"K={k} rollouts{rows} do not split over {num_processes} processes: each process plays whole joint "
            f"rollouts, so K must be a multiple of the process count (e.g. K={num_processes * max(1, -(-k // num_processes))})"
        )


def single(num_devices: int | None = None) -> Context:
    """A one-process context over this process's first ``num_devices`` devices (default: all)."""
    devices = jax.local_devices()[: num_devices or None]
    return Context(process_id=0, num_processes=1, mesh=Mesh(np.asarray(devices), (DATA_AXIS,)))


_CURRENT: Context | None = None


def current() -> Context | None:
    """The context of the last :func:`initialize` (None: not distributed)."""
    return _CURRENT


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout: int = DEFAULT_TIMEOUT,
    local_device_ids: Sequence[int] | None = None,
) -> Context:
    """Joins this process to the run and returns its :class:`Context` (module docstring: the variables read).

    Must run before any JAX computation (it selects gloo collectives on CPU). Calling it again returns the
    same context.

    Args:
        coordinator: ``host:port`` of process 0's coordinator (process 0 listens there).
        num_processes: P >= 1.
        process_id: this process, ``0..P-1``.
        timeout: seconds to wait for every process at start-up; a process that cannot reach the coordinator
            fails after it, naming the address.
        local_device_ids: devices of this host this process uses (default: all).

    Raises:
        ValueError: a process count < 1, a process id outside ``0..P-1``, a coordinator without a port, only
            some of the three settings given, or a failed connection (the address and timeout named).
    """
    global _CURRENT
    if _CURRENT is not None:
        return _CURRENT
    coordinator = coordinator or _env(ENV_COORDINATOR)
    num = num_processes if num_processes is not None else _env(ENV_NUM_PROCESSES)
    pid = process_id if process_id is not None else _env(ENV_PROCESS_ID)
    given = {"coordinator": coordinator, "num_processes": num, "process_id": pid}
    if any(v is not None for v in given.values()) and any(v is None for v in given.values()):
        missing = [k for k, v in given.items() if v is None]
        raise ValueError(
            f"distributed: {', '.join(missing)} not set (give all three, or the variables "
            f"{ENV_COORDINATOR[0]}, {ENV_NUM_PROCESSES[0]}, {ENV_PROCESS_ID[0]}; or none, for the cluster's own)"
        )
    if coordinator is not None:
        num, pid = int(num), int(pid)
        if num < 1:
            raise ValueError(f"distributed: the process count must be >= 1, got {num}")
        if not 0 <= pid < num:
            raise ValueError(f"distributed: process id {pid} is outside 0..{num - 1}")
        if ":" not in coordinator:
            raise ValueError(f"distributed: the coordinator address needs a port (host:port), got {coordinator!r}")
    # Cross-process collectives between CPU devices (without them a multi-process CPU program cannot run); the
    # setting only concerns the CPU client, so it is harmless next to GPUs or TPUs.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = dict(initialization_timeout=int(timeout))
    if local_device_ids is not None:
        kwargs["local_device_ids"] = list(local_device_ids)
    if coordinator is not None:
        print(
            f"distributed: process {pid} of {num}, coordinator {coordinator} (timeout {timeout} s)",
            file=sys.stderr,
            flush=True,
        )
        kwargs.update(coordinator_address=coordinator, num_processes=num, process_id=pid)
    try:
        jax.distributed.initialize(**kwargs)
    except Exception as e:  # XLA raises its own status errors
        where = coordinator or "the cluster's coordinator"
        raise ValueError(
            f"distributed: could not join the run at {where} within {timeout} s "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    _CURRENT = Context(
        process_id=jax.process_index(),
        num_processes=jax.process_count(),
        mesh=Mesh(np.asarray(jax.devices()), (DATA_AXIS,)),
    )
    return _CURRENT


def add_arguments(parser) -> None:
    """The entry points' flags: ``--distributed`` and its three settings (each defaults to the environment)."""
    g = parser.add_argument_group("multi-process training (jax.distributed)")
    g.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process run (jax.distributed): the settings below, else the variables "
        f"{ENV_COORDINATOR[0]} / {ENV_NUM_PROCESSES[0]} / {ENV_PROCESS_ID[0]}, else the cluster's own",
    )
    g.add_argument("--coordinator", default=None, help="host:port of process 0's coordinator (implies --distributed)")
    g.add_argument("--num-processes", type=int, default=None, help="processes in the run (implies --distributed)")
    g.add_argument("--process-id", type=int, default=None, help="this process, 0..P-1 (implies --distributed)")
    g.add_argument(
        "--distributed-timeout",
        type=int,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for every process at start-up (default {DEFAULT_TIMEOUT})",
    )


#: Variables that say a cluster manager started this process (:func:`jax.distributed.initialize` then finds the
#: coordinator, the process count and the id by itself): SLURM, Open MPI, Cloud TPU.
CLUSTER_MARKERS = (
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_SIZE",
    "TPU_WORKER_HOSTNAMES",
    "TPU_WORKER_ID",
    "CLOUD_TPU_TASK_ID",
    "TPU_ACCELERATOR_TYPE",
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """A requested multi-process run, checked without JAX (:func:`requested`): all three settings given, none
    (``auto``: the cluster's own discovery, :data:`CLUSTER_MARKERS`), or one process (``num_processes`` 1: a
    mesh over this process's devices, no coordinator)."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    timeout: int = DEFAULT_TIMEOUT

    @property
    def auto(self) -> bool:
        return self.coordinator is None and self.num_processes is None


def check_timeout(value) -> int:
    """``--distributed-timeout`` as whole seconds (None: :data:`DEFAULT_TIMEOUT`).

    Raises:
        ValueError: not a finite number > 0 (the value named).
    """
    if value is None:
        return DEFAULT_TIMEOUT
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or int(value) < 1:
        raise ValueError(f"--distributed-timeout must be a finite number of seconds >= 1, got {value!r}")
    return int(value)


def requested(args, coordinator: bool = True) -> Settings | None:
    """The multi-process settings of the flags of :func:`add_arguments` and the environment, checked before JAX
    starts (None: not distributed: no ``--distributed``, no setting flag and none of the variables).
    ``coordinator=False``: the processes join no ``jax.distributed`` runtime (independent runs meeting through
    files, :mod:`experiments.split`), so only the process count and id are needed; an address given is checked.

    Each setting is its flag, else the first of its variables (:data:`ENV_COORDINATOR`, :data:`ENV_NUM_PROCESSES`,
    :data:`ENV_PROCESS_ID`). With none of the three, the run is left to the cluster's own discovery if a
    cluster manager's variable is set (:data:`CLUSTER_MARKERS`) or the coordinator is ``auto``.

    Raises:
        ValueError: only some of the settings given, or none outside a cluster (each missing one named with its
            flag and variable); a process count < 1, an id outside ``0..P-1``, a coordinator without a port; a
            ``--distributed-timeout`` that is not a finite number > 0 (checked even without ``--distributed``).
    """
    timeout = check_timeout(getattr(args, "distributed_timeout", None))
    flags = {
        "coordinator": getattr(args, "coordinator", None),
        "num_processes": getattr(args, "num_processes", None),
        "process_id": getattr(args, "process_id", None),
    }
    names = {"coordinator": ENV_COORDINATOR, "num_processes": ENV_NUM_PROCESSES, "process_id": ENV_PROCESS_ID}
    env = {k: _env(names[k]) for k in flags}
    if not getattr(args, "distributed", False) and all(v is None for v in (*flags.values(), *env.values())):
        return None
    got = {k: flags[k] if flags[k] is not None else env[k] for k in flags}
    if got["coordinator"] == "auto" or (
        all(v is None for v in got.values()) and any(os.environ.get(m) for m in CLUSTER_MARKERS)
    ):
        return Settings(None, None, None, timeout)
    if got["num_processes"] is not None and str(got["num_processes"]).strip() == "1":
        if got["process_id"] not in (None, 0, "0"):
            raise ValueError(f"--distributed: process id {got['process_id']} is outside 0..0")
        return Settings(None, 1, 0, timeout)  # one process over all its devices: no coordinator needed
    missing = [k for k, v in got.items() if v is None and (coordinator or k != "coordinator")]
    if missing:
        what = "; ".join(f"--{k.replace('_', '-')} or {' / '.join(names[k])}" for k in missing)
        if not coordinator:
            raise ValueError(f"--distributed: {', '.join(missing)} not set ({what}); give the process count and id")
        raise ValueError(
            f"--distributed: {', '.join(missing)} not set ({what}); give all three, or run under a cluster "
            f"manager that sets its own (one of {', '.join(CLUSTER_MARKERS)}), or --coordinator auto"
        )
    try:
        num, pid = int(got["num_processes"]), int(got["process_id"])
    except ValueError:
        raise ValueError(
            f"--distributed: the process count and id must be integers, got {got['num_processes']!r} and "
            f"{got['process_id']!r}"
        ) from None
    if num < 1:
        raise ValueError(f"--distributed: the process count must be >= 1, got {num}")
    if not 0 <= pid < num:
        raise ValueError(f"--distributed: process id {pid} is outside 0..{num - 1}")
    if got["coordinator"] is not None and ":" not in str(got["coordinator"]):
        raise ValueError(f"--distributed: the coordinator address needs a port (host:port), got {got['coordinator']!r}")
    return Settings(None if got["coordinator"] is None else str(got["coordinator"]), num, pid, timeout)


def from_settings(settings: Settings | None) -> Context | None:
    """:func:`initialize` with :func:`requested`'s settings (None: not distributed)."""
    global _CURRENT
    if settings is None:
        return None
    if settings.num_processes == 1:  # one process: its devices' mesh, no jax.distributed service
        _CURRENT = _CURRENT or single()
        return _CURRENT
    return initialize(settings.coordinator, settings.num_processes, settings.process_id, timeout=settings.timeout)


def from_args(args) -> Context | None:
    """:func:`initialize` from the flags of :func:`add_arguments` and the environment (None: not distributed;
    :func:`requested`). Call it before any JAX computation."""
    return from_settings(requested(args))


def shutdown() -> None:
    """Leaves the run (every process should call it at the end; nothing if not initialized)."""
    global _CURRENT
    if _CURRENT is not None and _CURRENT.multi:
        jax.distributed.shutdown()
    _CURRENT = None


# ---------------------------------------------------------------------------------------------------------
# The round's decisions, merged across processes
# ---------------------------------------------------------------------------------------------------------

#: Decision-buffer fields the PA-MAGRPO batch reads (:func:`jaxopt_marl.compiled_rollout.decision_batch`).
BATCH_FIELDS = ("rollout", "aid", "wave", "prompt", "prompt_len", "response", "response_mask", "n_letters")


def merge_decisions(ctx: Context, dec, rollout_offset: int):
    """The round's global decision buffers from each process's (one call of its share of the K rollouts).

    Every process contributes its first ``count`` decisions (buffers of one shape everywhere: same roller),
    with its rollout indices shifted by ``rollout_offset``; the union is sorted by (wave, rollout, agent), the
    order in which one call of all K rollouts records them, and padded with zero rows to the sum of the buffer
    sizes (the single call's buffer size). Returns a host :class:`jaxopt_marl.compiled_rollout.DecisionBuffers`
    with the :data:`BATCH_FIELDS` filled (others: the local buffer's, unused by the batch) and the global count.
    """
    host = {f: np.asarray(jax.device_get(getattr(dec, f))) for f in BATCH_FIELDS}
    host["rollout"] = host["rollout"] + np.int32(rollout_offset)
    count = int(dec.count)
    counts = ctx.allgather(np.asarray([count], np.int32)).reshape(-1)
    got = {f: ctx.allgather(v) for f, v in host.items()}  # [P, D_local, ...]
    rows = {f: np.concatenate([got[f][p, : counts[p]] for p in range(ctx.num_processes)]) for f in BATCH_FIELDS}
    order = np.lexsort((rows["aid"], rows["rollout"], rows["wave"]))  # last key first: wave, rollout, aid
    size = ctx.num_processes * got["prompt"].shape[1]
    merged = {}
    for f in BATCH_FIELDS:
        v = rows[f][order]
        pad = np.zeros((size - v.shape[0],) + v.shape[1:], v.dtype)
        merged[f] = np.concatenate([v, pad])
    total = int(counts.sum())
    return dec._replace(count=np.int32(total), **merged)


def gather_traces(ctx: Context, traces: list[dict], rollout_offset: int) -> list[dict]:
    """Every process's decision traces with global rollout indices, in the single-call order (wave, rollout,
    agent) of :func:`merge_decisions`."""
    mine = [dict(t, rollout=int(t["rollout"]) + rollout_offset) for t in traces]
    out = [t for part in ctx.allgather_json(mine) for t in part]
    return sorted(out, key=lambda t: (t["wave"], t["rollout"], t["aid"]))


__all__ = [
    "BATCH_FIELDS",
    "CLUSTER_MARKERS",
    "DEFAULT_TIMEOUT",
    "check_timeout",
    "ENV_COORDINATOR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "LONG_WAIT",
    "Context",
    "Settings",
    "add_arguments",
    "check_divides",
    "from_args",
    "from_settings",
    "current",
    "gather_traces",
    "initialize",
    "merge_decisions",
    "requested",
    "shutdown",
    "single",
    "to_host",
]
