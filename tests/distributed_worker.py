"""One process of ``tests/test_distributed.py`` (run as ``python -m tests.distributed_worker``; XLA_FLAGS must be
set before JAX starts, hence a fresh interpreter per process).

``python -m tests.distributed_worker --pair DIR`` (the background job ``distributed`` of ``tests/test_distributed.py``,
:func:`pair`) starts the three runs that test compares, side by side, each a fresh interpreter, and waits for them
(at most :data:`TIMEOUT` seconds; the first failure kills the others): 2 processes of 2 devices into ``DIR/dist``
(``DIR/dist0.npz``, ``DIR/dist1.npz``) and 1 process of 4 into ``DIR/ref`` (``DIR/ref.npz``).

``python -m tests.distributed_worker --entry DIR -- ARGV...`` (the background job ``distributed-entry``,
:func:`entry`) runs an entry point (``ARGV``: ``-m experiments.overcooked ...``) as 2 processes with
``--distributed``.

``python -m tests.distributed_worker RUN_DIR OUT.npz --devices D [--processes P --process-id I --port PORT]``
trains :data:`ROUNDS` rounds of the tiny model on Overcooked (K = :data:`K`) with D virtual CPU devices in this
process and writes the final adapters and optimizer state (NumPy leaves, ``a0..``, ``o0..``) to ``OUT.npz``:

- without ``--processes`` (or with 1): the single-process reference, :class:`jaxopt_marl.trainer.Trainer` with the
  one-process context :func:`jaxopt_marl.distributed.single` (its update on a D-device mesh; gathers are identities);
- with P > 1: process I of a ``jax.distributed`` run on 127.0.0.1:PORT (gloo collectives, P x D devices), which
  plays round 0, then resumes from the checkpoint in a fresh trainer and plays round 1 (every process restores the
  same orbax checkpoint).
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: Rollouts per round, rounds, episode length (env steps).
K, ROUNDS, STEPS = 4, 2, 8
#: The update's learning rate (``MAGRPOConfig.smoke``'s).
LEARNING_RATE = 1e-2
GAME = "overcooked_aa"
ROOT = Path(__file__).resolve().parents[1]
#: Seconds for the three runs of :func:`pair` together; past it they are killed and the job fails.
TIMEOUT = 600
#: XLA's CPU intra-op thread pool of every worker (``PJRT_NPROC``). XLA sizes it max(cores, local devices) and its
#: CPU kernels split their work by it (Eigen's matrix product can split a long contraction, such as an adapter
#: gradient's sum over tokens, into per-thread partial sums), so on a 2-core machine a process of 4 devices rounds
#: differently from processes of 2: the same pool everywhere makes the per-device arithmetic the same.
INTRA_OP_THREADS = 4


def free_port() -> int:
    """A free TCP port on the loopback address (the only address the runs use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*args):
    """One worker (``python -m tests.distributed_worker ARGS``), stdout and stderr together."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PJRT_NPROC=str(INTRA_OP_THREADS))
    env.pop("XLA_FLAGS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.distributed_worker", *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait(procs, deadline):
    """``(failure, outputs)``: None, "timeout" or the first failed process, and every worker's output. The first
    failure (or the deadline) kills the others at once, so a process left waiting at a barrier for a dead peer
    never outlives the job."""
    logs = [tempfile.TemporaryFile("w+") for _ in procs]
    threads = [threading.Thread(target=lambda p=p, f=f: shutil.copyfileobj(p.stdout, f)) for p, f in zip(procs, logs)]
    for t in threads:
        t.start()
    failed = None
    while failed is None and any(p.poll() is None for p in procs):
        failed = next((p for p in procs if p.poll() not in (None, 0)), None)
        if time.monotonic() > deadline:
            failed = "timeout"
        time.sleep(0.2)
    failed = failed or next((p for p in procs if p.returncode != 0), None)
    for p in procs:
        if p.poll() is None:
            p.kill()  # SIGKILL: jax.distributed's preemption notifier catches SIGTERM
        p.wait()
    for t in threads:
        t.join()
    outs = []
    for f in logs:
        f.seek(0)
        outs.append(f.read())
    return failed, outs


def pair(out: Path) -> int:
    """The comparison's three runs (module docstring); exit status 0 when all three finished."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + TIMEOUT
    port = free_port()
    # The 1-process reference runs beside the 2 processes: their compiles are single-threaded, so the three
    # overlap on 2 cores (about a third less wall time than one after the other).
    procs = [
        start(out / "dist", out / f"dist{i}.npz", "--devices", 2, "--processes", 2, "--process-id", i, "--port", port)
        for i in range(2)
    ] + [start(out / "ref", out / "ref.npz", "--devices", 4)]
    failed, outs = wait(procs, deadline)
    if failed == "timeout":
        print(f"the workers ran past {TIMEOUT} s and were killed:", file=sys.stderr)
    elif failed is not None:
        print("a worker failed:", file=sys.stderr)
    if failed is not None:
        print("\n---\n".join(o[-4000:] for o in outs), file=sys.stderr)
        return 1
    print(outs[0][-2000:])
    return 0


def entry(out: Path, argv: list[str]) -> int:
    """The entry point itself as 2 processes of 1 CPU device each (the background job ``distributed-entry``):
    ``python ARGV --out OUT/run --distributed --coordinator 127.0.0.1:PORT --num-processes 2 --process-id I``, side
    by side, at most :data:`TIMEOUT` seconds. Each process's output goes to ``OUT/process<I>.log``; exit status 0
    when both finished."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + TIMEOUT
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)  # one device per process
    procs = [
        subprocess.Popen(
            [sys.executable, *argv, "--out", str(out / "run"), "--distributed", "--coordinator", coordinator]
            + ["--num-processes", "2", "--process-id", str(i)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    failed, outs = wait(procs, deadline)
    for i, o in enumerate(outs):
        (out / f"process{i}.log").write_text(o)
    if failed is not None:
        print(f"a process failed ({failed}):\n" + "\n---\n".join(o[-4000:] for o in outs), file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--pair"]:
        raise SystemExit(pair(Path(argv[1])))
    if argv[:1] == ["--entry"]:  # --entry OUT -- ARGV...
        raise SystemExit(entry(Path(argv[1]), argv[3:]))
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("out")
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=60)
    a = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={a.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax

    from jaxopt_marl import distributed

    ctx = None
    if a.processes > 1:
        ctx = distributed.initialize(f"127.0.0.1:{a.port}", a.processes, a.process_id, timeout=a.timeout)
    import numpy as np

    import envs_jax
    from jaxopt_marl import compiled_rollout, guards, magrpo, options, rollout, trainer
    from lora import LoRAConfig, split_model

    cfg = rollout.PolicyConfig(mode="choice_only", temperature=1.0)
    env = envs_jax.make(GAME, max_steps=STEPS)
    lib = options.get_library(GAME, env)
    model, tok = rollout.load_policy_model(rollout.TINY_RANDOM, LoRAConfig(num_adapters=2, rank=2, alpha=4.0))
    # One row per model call at the prompt limit (one compiled branch): an episode's numbers do not depend on
    # which others share its call (the CPU chunking is one row per call too, at finer widths).
    roller = compiled_rollout.CompiledRoller(
        GAME,
        env,
        lib,
        guards.compile_guards([], lib.vocab),
        model,
        tok,
        cfg,
        menu_seed=0,
        batch=K // a.processes,
        chunks=compiled_rollout.ChunkConfig(row_sizes=(1,), length_step=1 << 16),
    )
    # Non-zero B so the KL term moves the adapters (as tests/test_trainer.py), and updates despite no spread.
    graphdef, adapters, _ = split_model(model)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
    roller.set_adapters(
        jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    )
    mcfg = magrpo.MAGRPOConfig.smoke(num_rollouts=K, temperature=1.0, kl_beta=0.5, learning_rate=LEARNING_RATE)
    tcfg = trainer.TrainConfig(rounds=ROUNDS, seed=0, skip_zero_advantage=False)
    if ctx is None:
        # One process over its D devices: the one-process context (the plain Trainer's update is on one device;
        # given a D-device step it would refuse the compiled rollout's batch, committed to device 0).
        tr = trainer.Trainer(a.run_dir, roller, mcfg, tcfg, dist=distributed.single(a.devices))
        tr.train()
    else:
        first = trainer.Trainer(a.run_dir, roller, mcfg, tcfg, dist=ctx)
        first.train(rounds=1)
        tr = trainer.Trainer(a.run_dir, roller, mcfg, tcfg, step=first.step, dist=ctx)
        assert tr.restore() == 1
        tr.train()
    host = distributed.to_host
    arrays = {f"a{i}": host(x) for i, x in enumerate(jax.tree.leaves(tr.state.adapters))}
    arrays.update({f"o{i}": host(x) for i, x in enumerate(jax.tree.leaves(tr.state.opt_state))})
    np.savez(a.out, **arrays)
    if ctx is not None:
        ctx.barrier("worker-done")
        distributed.shutdown()
    print("worker done", a.process_id, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
