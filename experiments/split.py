"""Independent runs split over processes (issue #17): the seeds of :mod:`experiments.seeds` and the cells of
:mod:`experiments.table2`.

Each of P processes (``--num-processes P --process-id p``, or their variables: :mod:`jaxopt_marl.distributed`)
runs its share of the launch's items (seeds, cells) as whole, independent runs on its own devices: no
cross-process collective, no ``jax.distributed`` runtime joined. The processes meet through the shared output
directory ``OUT`` (one file system for all of them): process p deletes its completion file
``OUT/processes/p<p>.json`` before it starts and writes it (atomically) when its share is done or failed; process
0 waits for every process's file of this launch (:func:`barrier`) before it writes the summary, then deletes
them (:func:`clear`).

A completion file counts only if it belongs to this launch: it records the launch's :func:`fingerprint` (the
item list, the process count and the settings every process computes alike) and its process's start time is no
earlier than process 0's own start minus the start-up window (``--distributed-timeout``: the processes of one
launch start within it of each other, as ``jax.distributed`` assumes). A file of an earlier launch (other
settings, or started before that window) is ignored, and a stale ``"ok": false`` cannot stop this launch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path

#: Sub-directory of ``OUT`` holding the per-process completion files.
PROCESS_DIR = "processes"
#: Seconds between process 0's looks at the completion files.
POLL_S = 2.0


def share(items: list, num_processes: int, process_id: int, *, what: str, interleave: bool = False) -> list:
    """Process ``process_id``'s share of ``items`` (``len(items) / num_processes`` of them): the contiguous
    block ``[p n/P, (p+1) n/P)``, or with ``interleave`` every P-th item from the p-th (``items[p::P]``: the
    Table 2 cells, whose costs differ by kind and are listed kind by kind).

    Raises:
        ValueError: ``len(items)`` does not divide over ``num_processes`` (both named, with ``what``: the flag
            the items come from, e.g. ``--seeds``).
    """
    n = len(items)
    if num_processes < 1 or n % num_processes:
        ok = num_processes * max(1, -(-n // max(num_processes, 1)))
        raise ValueError(
            f"{what} {n} does not split over {num_processes} processes: each process runs whole runs, so the "
            f"count must be a multiple of the process count (e.g. {ok})"
        )
    if interleave:
        return list(items[process_id::num_processes])
    per = n // num_processes
    return list(items[process_id * per : (process_id + 1) * per])


def fingerprint(items: list, num_processes: int, settings: dict) -> str:
    """The hash every process of one launch computes alike from the launch's item list, process count and
    ``settings`` (JSON-able: the run configuration without its per-item fields); 16 hex digits."""
    blob = json.dumps({"items": list(items), "num_processes": num_processes, "settings": settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def process_file(out: Path, p: int) -> Path:
    """``OUT/processes/p<p>.json``: process ``p``'s completion file."""
    return Path(out) / PROCESS_DIR / f"p{p}.json"


def clear(out: Path, p: int) -> None:
    """Deletes process ``p``'s completion file (each process does so before it runs its share)."""
    process_file(out, p).unlink(missing_ok=True)


def mark(out: Path, p: int, items: list, error: str | None, fp: str = "", started: float | None = None) -> None:
    """Writes process ``p``'s completion file atomically: its items, ``ok`` (``error`` None) or the error text,
    the launch fingerprint ``fp`` and its start time (``time.time()``; now when None)."""
    f = process_file(out, p)
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp")
    rec = {"process": p, "items": list(items), "ok": error is None, "error": error, "fingerprint": fp}
    rec["started"] = time.time() if started is None else started
    tmp.write_text(json.dumps(rec) + "\n")
    tmp.replace(f)


def current(out: Path, p: int, fp: str, since: float) -> dict | None:
    """Process ``p``'s completion record if it belongs to this launch (fingerprint ``fp``, started at ``since``
    or later), else None (missing, unreadable or stale)."""
    try:
        d = json.loads(process_file(out, p).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("fingerprint") != fp:
        return None
    if not isinstance(d.get("started"), (int, float)) or d["started"] < since:
        return None
    return d


def barrier(
    out: Path, num_processes: int, timeout: float, fp: str = "", since: float = 0.0, *, tool: str, what: str
) -> None:
    """Process 0 waits until every process's completion file of this launch exists (:func:`current`).

    Raises:
        RuntimeError: some process's file did not appear within ``timeout`` seconds (the processes named), or a
            process failed (named with its ``what``, e.g. ``seeds``, and its error); ``tool`` names the caller.
    """
    t0 = time.monotonic()
    while True:
        recs = {p: current(out, p, fp, since) for p in range(num_processes)}
        missing = [p for p, d in recs.items() if d is None]
        if not missing:
            break
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(
                f"{tool}: processes {missing} did not finish within {timeout:.0f} s (no completion file of this "
                f"launch in {Path(out) / PROCESS_DIR})"
            )
        time.sleep(POLL_S)
    for p, d in recs.items():
        if not d["ok"]:
            raise RuntimeError(f"{tool}: process {p} ({what} {d['items']}) failed: {d['error']}")


@contextlib.contextmanager
def marked(out: Path, num_processes: int, p: int, items: list, fp: str):
    """Runs a process's share between its completion-file updates: clears process ``p``'s stale file (a file of
    an earlier launch must not satisfy process 0's barrier), yields the share's start time (``time.time()``), then
    marks the share done, or failed with the exception's text (which propagates). Nothing is written for one
    process."""
    started = time.time()
    if num_processes > 1:
        clear(out, p)
    error = None
    try:
        yield started
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        if num_processes > 1:
            mark(out, p, items, error, fp, started)


def run_each(runs: dict, todo: dict[str, str], keep_checkpoints: bool) -> dict:
    """Plays a process's share of independent pipeline runs in order.

    Args:
        runs: key -> ``(heading, run_dir, RunConfig)``, printed as ``== heading: plan -> run_dir``.
        todo: key -> the plan, ``skip`` / ``resume`` / ``force`` / ``start`` (``experiments.seeds.plan_runs``).
        keep_checkpoints: passed to :func:`jaxopt_marl.pipeline.run`.

    Returns:
        key -> wall seconds of each run played (skipped runs are absent).
    """
    from jaxopt_marl.pipeline import run

    seconds = {}
    for k, (heading, d, cfg) in runs.items():
        print(f"== {heading}: {todo[k]} -> {d}", flush=True)
        if todo[k] == "skip":
            continue
        t0 = time.perf_counter()
        run(cfg, d, resume=todo[k] == "resume", force=todo[k] == "force", keep_checkpoints=keep_checkpoints)
        seconds[k] = time.perf_counter() - t0
        print(f"{heading}: {seconds[k]:.0f} s", flush=True)
    return seconds


def gather(out: Path, num_processes: int, fp: str, started: float, settings, *, tool: str, what: str) -> None:
    """Process 0, its share done: waits for every process's share of this launch (:func:`barrier`, at most
    :data:`jaxopt_marl.distributed.LONG_WAIT`), then deletes the completion files. Nothing for one process.

    Args:
        started: when process 0's share began (:func:`marked`); a completion file written more than the launch's
            ``settings.timeout`` seconds (the coordinator's window, :func:`settings_of`) before it is an earlier
            launch's.

    Raises:
        RuntimeError: from :func:`barrier`.
    """
    if num_processes == 1:
        return
    from jaxopt_marl.distributed import LONG_WAIT

    barrier(out, num_processes, LONG_WAIT, fp, started - settings.timeout, tool=tool, what=what)
    for p in range(num_processes):
        clear(out, p)


def settings_of(args, tool: str, what: str):
    """``(num_processes, process_id, settings)`` of the multi-process flags / variables of ``args``
    (:func:`jaxopt_marl.distributed.requested` without a coordinator: none is used; ``(1, 0, None)`` when not
    distributed), checked before JAX starts.

    Raises:
        experiments.cli.InputError: a bad setting, or the cluster's own discovery (``--coordinator auto`` or a
            cluster manager's variable without the count and id): independent runs join no ``jax.distributed``
            runtime, so the count and id must be given.
    """
    from experiments.cli import InputError
    from jaxopt_marl import distributed

    try:
        s = distributed.requested(args, coordinator=False)
    except ValueError as e:
        raise InputError(str(e)) from None
    if s is None:
        return 1, 0, None
    if s.auto:
        raise InputError(
            f"{tool} --distributed needs the process count and id (--num-processes / "
            f"{distributed.ENV_NUM_PROCESSES[0]}, --process-id / {distributed.ENV_PROCESS_ID[0]}): its "
            f"independent runs ({what}) do not join jax.distributed, so the cluster's own discovery is not used"
        )
    return s.num_processes, s.process_id, s


__all__ = ["PROCESS_DIR", "barrier", "clear", "current", "fingerprint", "mark", "process_file", "settings_of", "share"]
