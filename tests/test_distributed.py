"""Multi-process training (issue #17): 2 processes joined by ``jax.distributed`` on 127.0.0.1 (gloo CPU
collectives), each with 2 virtual CPU devices, train 2 rounds of the tiny model and end with the adapters, the
optimizer state and the ``metrics.jsonl`` of one process training on a mesh of 4 virtual CPU devices. And the
entry point itself (``python -m experiments.overcooked ... --distributed``, 2 processes of 1 device) writes, from
process 0 alone, the run directory of the 1-process smoke run.

Every run is a subprocess (``tests/distributed_worker.py``): ``XLA_FLAGS`` must be set before JAX starts. The
processes meet at ``jax.distributed.initialize`` (bounded by ``--timeout``) and at a final barrier; the job kills
what is left after ``tests.distributed_worker.TIMEOUT`` seconds.

Every run is a subprocess and the three run side by side as ONE background job (``distributed``, tests/background.py,
started at collection so it overlaps with the in-process tests; ``python -m tests.distributed_worker --pair``).

Agreement: bit for bit (measured 2026-12-03, JAX 0.10.2 CPU, 2-core machine): both processes hold identical
states, and against the 1-process run every adapter leaf, Adam's step count and both moments, every metric of
``metrics.jsonl`` (wall times aside) and both rounds' decision files (log-probs included) are the same bits. The
round's batch is the single-process batch row for row (:mod:`jaxopt_marl.distributed`: the decision rows are
gathered and put back in the single call's order) and the update is the same program over a mesh of the same
shape. Two things used to make the runs differ (before, ~1e-6 of a leaf's scale on the adapters, 4e-6 / 6.4e-6
on Adam's moments, up to 9e-4 relative on near-zero elements):

- the cross-device sum of the gradient and loss partials: the all-reduce XLA's partitioner inserted for the
  ``"data"`` axis added the 4 devices' partials in one order in process (XLA's CPU all-reduce) and in another
  across processes (gloo's). :mod:`jaxopt_marl.train_step` now sums each device's rows itself (``shard_map``)
  and adds the devices' partials in device order (``train_step.ordered_sum``: an all-to-all, explicit adds,
  an all-gather; the collectives only move data), so the order no longer depends on the collective
  (tests/test_train_step.py checks it bit for bit against per-device sums added on the host);
- the per-device arithmetic itself, on CPU: XLA's intra-op thread pool has max(cores, local devices) threads and
  its CPU kernels split their work by it (Eigen's matrix product can split a long contraction, such as an adapter
  gradient's sum over the round's tokens, into per-thread partial sums), so on this 2-core machine the 4-device
  process rounded each device's gradient differently from the 2-device ones (measured: the same one-device
  program on the same rows gives the same bits in processes of 1 or 2 devices, other bits in one of 4, and the
  bits of 4 in any process with ``PJRT_NPROC=4``). Every worker runs with the same pool (``PJRT_NPROC``, ``tests.distributed_worker
  .INTRA_OP_THREADS``); with as many cores as the largest local device count the pools agree anyway.

Either alone leaves the runs apart (same run, 2026-12-03): the ordered reduction with the default pools, by up to
5.3e-7 on the adapters (values up to 0.29; 3.3e-6 of a leaf's largest magnitude) and 3.7e-6 of a leaf's scale on
Adam's moments; equal pools with XLA's all-reduce, by up to 7.8e-7 (5.2e-6) and 4.8e-6. Hence exact checks
throughout. The distributed side
also stops after round 0 and resumes from the checkpoint in a fresh trainer, so every process restoring the same
orbax checkpoint is covered too.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.background import BACKGROUND
from tests.conftest import SMOKE_COMMANDS
from tests.distributed_worker import free_port, start

#: Metrics that measure wall time (they differ between any two runs).
TIMED = ("perf/decisions_per_s", "perf/rollout_s", "perf/update_s", "perf/round_s", "perf/llm_s")
#: The background job's directory (tests/background.py: played from collection on, beside the in-process tests).
PAIR = BACKGROUND.base / "distributed"
BACKGROUND.register("distributed", ["-m", "tests.distributed_worker", "--pair", str(PAIR)])
#: The entry point's 2-process run (tests.distributed_worker --entry): Overcooked AA's smoke run (tests/conftest.py).
ENTRY = BACKGROUND.base / "distributed-entry"
BACKGROUND.register(
    "distributed-entry",
    ["-m", "tests.distributed_worker", "--entry", str(ENTRY), "--", "-m", *SMOKE_COMMANDS["overcooked_aa"]]
    + ["--preset", "smoke", "--model", "tiny-random"],
)


def _tree(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _metrics(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMED} for r in rows]


@pytest.mark.background("distributed")
def test_two_processes_equal_one_process_of_the_same_mesh():
    proc = BACKGROUND.get("distributed")  # tests.distributed_worker --pair: the three runs, bounded, killed past it
    assert proc.returncode == 0, (proc.stdout or "")[-2000:] + (proc.stderr or "")[-6000:]
    tmp_path = PAIR
    dist = tmp_path / "dist"
    ref = tmp_path / "ref"

    want = _tree(tmp_path / "ref.npz")
    for i in range(2):
        got = _tree(tmp_path / f"dist{i}.npz")
        assert got.keys() == want.keys()
        rel = max(float(np.max(np.abs(got[k] - v) / (np.abs(v) + 1e-30), initial=0.0)) for k, v in want.items())
        print(f"process {i}: largest relative difference to the 1-process run {rel:.3g}")
        for k, v in want.items():  # adapters (a*) and optimizer state (o*: step count, Adam's moments), bit for bit
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            bits = lambda x: np.atleast_1d(x).view(np.uint8)  # noqa: E731
            np.testing.assert_array_equal(bits(got[k]), bits(v), err_msg=k)
    m_ref, m_dist = _metrics(ref), _metrics(dist)
    assert [m["round"] for m in m_dist] == [0, 1]
    assert m_dist == m_ref  # every metric (wall times aside), floats included
    assert m_dist[1]["train/kl"] > 0 and m_dist[0]["train/updated"]  # the update really ran
    # Process 0 wrote the decisions, in the single-process order (log-probs of round 1, played by the updated
    # adapters, included), and the checkpoints hold the same steps.
    for name in ("round_0000.jsonl", "round_0001.jsonl"):
        assert (dist / "decisions" / name).read_text() == (ref / "decisions" / name).read_text(), name
    steps = lambda d: sorted(x.name for x in (d / "checkpoints").iterdir() if x.name.isdigit())
    assert steps(dist) == steps(ref) == ["1", "2"]
    assert (dist / "checkpoints" / "2" / "checksums.json").is_file()


def test_bad_input_is_refused_before_compute():
    from jaxopt_marl import distributed, train_step

    assert distributed.DATA_AXIS == train_step.DATA_AXIS
    with pytest.raises(ValueError, match=r"K=6 rollouts do not split over 4 processes"):
        distributed.check_divides(6, 4)
    with pytest.raises(ValueError, match=r"process id 2 is outside 0..1"):
        distributed.initialize("127.0.0.1:1", 2, 2)
    with pytest.raises(ValueError, match=r"process_id not set"):
        distributed.initialize("127.0.0.1:1", 2)
    with pytest.raises(ValueError, match=r"needs a port"):
        distributed.initialize("127.0.0.1", 2, 0)
    assert distributed.current() is None


def test_the_checks_before_joining_start_no_jax_backend():
    """What the entry point checks before ``jax.distributed.initialize`` (the flags, the preset's config with
    ``--library auto``, the K split) starts no JAX backend: ``initialize`` must come before any backend, or every
    process fails to join (a regression: ``jaxopt_marl.options`` imported JAX arrays with its registry)."""
    code = (
        "import jax._src.xla_bridge as xb\n"
        "from experiments import common\n"
        "argv = ['--layout', 'aa', '--preset', 'smoke', '--model', 'tiny-random', '--distributed',\n"
        "        '--coordinator', '127.0.0.1:1', '--num-processes', '2', '--process-id', '0']\n"
        "args = common.build_parser('x', layout=True).parse_args(argv)\n"
        "common.check_split(common.config_from_args('overcooked_aa', args, draw=False), 2)\n"
        "print('backend started:', xb.backends_are_initialized())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    p = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "backend started: False" in p.stdout, p.stdout[-2000:]


def test_unreachable_coordinator_fails_within_the_timeout(tmp_path):
    """Process 1 of 2 whose coordinator never comes up exits (non-zero) within its timeout, naming the address."""
    port = free_port()
    t0 = time.monotonic()
    p = start(
        tmp_path / "x",
        tmp_path / "x.npz",
        "--devices",
        1,
        "--processes",
        2,
        "--process-id",
        1,
        "--port",
        port,
        "--timeout",
        5,
    )
    try:
        out, _ = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("a process without its coordinator hung")
    assert p.returncode != 0
    assert f"127.0.0.1:{port}" in out, out[-2000:]
    assert time.monotonic() - t0 < 90


@pytest.fixture
def no_cluster(monkeypatch):
    """No setting or cluster variable in the environment (the entry points' checks read them)."""
    from jaxopt_marl import distributed

    for name in (*distributed.ENV_COORDINATOR, *distributed.ENV_NUM_PROCESSES, *distributed.ENV_PROCESS_ID):
        monkeypatch.delenv(name, raising=False)
    for name in distributed.CLUSTER_MARKERS:
        monkeypatch.delenv(name, raising=False)


def test_entry_point_refuses_bad_distributed_input_before_joining(no_cluster, monkeypatch, tmp_path):
    """``python -m experiments.*`` with ``--distributed``: missing settings are named (flag and variable), a process
    count that does not divide K is named with K, the agents and the count, before jax.distributed starts."""
    from experiments import common
    from jaxopt_marl import distributed
    from jaxopt_marl.errors import InputError

    out = ["--out", str(tmp_path / "run"), "--preset", "smoke"]
    with pytest.raises(InputError, match=r"coordinator, num_processes, process_id not set.*JAXOPT_MARL_COORDINATOR"):
        common.main("cleanup", [*out, "--distributed"])
    monkeypatch.setenv("JAXOPT_MARL_COORDINATOR", "127.0.0.1:1")
    monkeypatch.setenv("JAXOPT_MARL_NUM_PROCESSES", "2")
    with pytest.raises(InputError, match=r"process_id not set \(--process-id or JAXOPT_MARL_PROCESS_ID"):
        common.main("cleanup", out)  # the variables alone ask for a distributed run
    monkeypatch.setenv("JAXOPT_MARL_PROCESS_ID", "0")
    with pytest.raises(InputError, match=r"K=3 rollouts \(K x agents = 3 x 7 = 21 .*over 2 processes"):
        common.main("cleanup", [*out, "--num-rollouts", "3"])
    with pytest.raises(InputError, match=r"process id 4 is outside 0..1"):
        common.main("cleanup", [*out, "--process-id", "4"])
    assert distributed.current() is None and not (tmp_path / "run").exists()


def test_settings_of_one_process_need_no_coordinator(no_cluster):
    """``--distributed --num-processes 1``: one process on a mesh of all its devices (the reference of a
    multi-process run), no coordinator; a cluster manager's variable alone leaves the discovery to JAX."""
    import argparse

    from jaxopt_marl import distributed

    ns = lambda **kw: argparse.Namespace(**{"distributed": True, **kw})  # noqa: E731
    assert distributed.requested(ns(num_processes=1)) == distributed.Settings(None, 1, 0)
    assert distributed.requested(argparse.Namespace(distributed=False)) is None
    with pytest.raises(ValueError, match=r"process id 1 is outside 0..0"):
        distributed.requested(ns(num_processes=1, process_id=1))
    os.environ["SLURM_JOB_ID"] = "1"
    try:
        assert distributed.requested(ns()).auto
    finally:
        del os.environ["SLURM_JOB_ID"]


def _files(run_dir):
    """The run's files (relative paths) outside the orbax checkpoint directories, whose layout is orbax's."""
    skip = ("checkpoints", "best")
    return sorted(
        str(f.relative_to(run_dir))
        for f in run_dir.rglob("*")
        if f.is_file() and f.relative_to(run_dir).parts[0] not in skip
    )


def _untimed(tree):
    """A JSON tree without its wall-time entries (keys ending in ``_s`` / ``per_s``, or named ``seconds``)."""
    if isinstance(tree, dict):
        return {k: _untimed(v) for k, v in tree.items() if not (k.endswith("_s") or "seconds" in k or k in TIMED)}
    if isinstance(tree, list):
        return [_untimed(v) for v in tree]
    return tree


@pytest.mark.background("distributed-entry")
def test_entry_point_distributed_run_writes_the_single_process_run(smoke_run):
    """``python -m experiments.overcooked --preset smoke --model tiny-random --distributed`` as 2 processes of 1
    device: process 0 alone writes the run directory, and it holds what the 1-process smoke run of the same
    command writes: the same files; the same guards, decisions of every round, metrics, solo test and evaluation
    (wall times aside); the evaluation's decisions as the same lines (written in the processes' batches of K/P);
    the same checkpoint steps, restorable by both processes."""
    proc = BACKGROUND.get("distributed-entry")
    assert proc.returncode == 0, (proc.stdout or "")[-2000:] + (proc.stderr or "")[-6000:]
    ref, dist = smoke_run[0], ENTRY / "run"
    assert _files(dist) == _files(ref)
    for name in ("guards.jsonl", "decisions/round_0000.jsonl", "decisions/round_0001.jsonl"):
        assert (dist / name).read_text() == (ref / name).read_text(), name
    lines = lambda d: sorted((d / "decisions/eval.jsonl").read_text().splitlines())
    assert lines(dist) == lines(ref) and lines(ref)
    for name in ("solo.json", "eval.json"):
        assert _untimed(json.loads((dist / name).read_text())) == _untimed(json.loads((ref / name).read_text())), name
    assert _metrics(dist) == _metrics(ref)
    steps = lambda d: sorted(x.name for x in (d / "checkpoints").iterdir() if x.name.isdigit())
    assert steps(dist) == steps(ref) and steps(ref)
    config = {k: v for k, v in json.loads((dist / "config.json").read_text()).items()}
    assert config == json.loads((ref / "config.json").read_text())
