"""One process of ``tests/test_distributed.py`` (run as ``python -m tests.distributed_worker``; XLA_FLAGS must be
set before JAX starts, hence a fresh interpreter per process).

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
import sys

#: Rollouts per round, rounds, episode length (env steps).
K, ROUNDS, STEPS = 4, 2, 8
GAME = "overcooked_aa"


def main(argv=None):
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
    mcfg = magrpo.MAGRPOConfig.smoke(num_rollouts=K, temperature=1.0, kl_beta=0.5)
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
