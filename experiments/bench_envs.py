"""``python -m experiments.bench envs``: environment steps per second, with a same-run baseline.

For each game and each batch size, one jitted program runs ``steps`` environment steps of ``n_envs``
vmapped environments under a uniform-random policy (``lax.scan``; the final observations and the
summed rewards are returned so nothing is dead-code-eliminated). Compile time is excluded (one warm-up
call); each figure is the mean ± std over ``reps`` timed calls, each ended by ``block_until_ready``;
the subjects' calls are interleaved so that load changes hit every subject alike.
An environment step is one joint action of all agents of one environment.

Baseline, timed in the same process: JaxMARL 0.2.0's own ``OvercookedV2`` on ``asymm_advantages``
with the same settings the ``overcooked_aa`` port uses (``start_cooking_interaction=True``, 400 steps)
and the same random policy. Issue #2's targets: Cleanup >= 100,000 steps/s at 1024 envs on the
2-core CPU; the Overcooked ports >= 0.8x the baseline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from experiments.cli import ArgParser, InputError, positive

BASELINE = "jaxmarl_overcooked_v2_aa"


@dataclasses.dataclass
class Args:
    """Options of the environment benchmark."""

    games: tuple[str, ...] = envs_jax.GAMES
    """Games to time (names as in ``envs_jax.make``)."""
    n_envs: tuple[int, ...] = (1, 64, 1024, 4096)
    """Numbers of parallel environments."""
    steps: int = 100
    """Environment steps per timed call (the scan length)."""
    reps: int = 5
    """Timed calls per configuration."""
    baseline: bool = True
    """Also time bare JaxMARL OvercookedV2 (Asymmetric Advantages)."""
    out: Path | None = None
    """Optional JSON file for the results."""
    seed: int = 0
    """PRNG seed."""


def make_random_rollout(env, n_envs: int, steps: int):
    """Returns a jitted ``run(key) -> (obs, reward_sum)`` of ``steps`` random joint steps on ``n_envs`` envs.

    Args:
        env: a JaxMARL ``MultiAgentEnv``.
        n_envs: batch size (static).
        steps: scan length (static).
    """
    agents = list(env.agents)
    n_actions = jnp.array([env.action_space(a).n for a in agents], dtype=jnp.int32)

    def run(key):
        key, k0 = jax.random.split(key)
        obs, state = jax.vmap(env.reset)(jax.random.split(k0, n_envs))

        def body(carry, key_t):
            obs, state, total = carry
            k_act, k_env = jax.random.split(key_t)
            u = jax.random.uniform(k_act, (n_envs, len(agents)))
            acts = (u * n_actions).astype(jnp.int32)
            actions = {a: acts[:, i] for i, a in enumerate(agents)}
            obs, state, rew, _, _ = jax.vmap(env.step)(jax.random.split(k_env, n_envs), state, actions)
            total = total + sum(rew[a].astype(jnp.float32).sum() for a in agents)
            return (obs, state, total), None

        (obs, _, total), _ = jax.lax.scan(body, (obs, state, jnp.float32(0)), jax.random.split(key, steps))
        return obs, total

    return jax.jit(run)


def time_envs(envs: dict, n_envs: int, steps: int, reps: int, seed: int) -> dict[str, dict]:
    """Times ``make_random_rollout`` for every env at one batch size, interleaving the subjects.

    Each repetition times every subject once, back to back, so a change in machine load hits all
    subjects alike and the ratios stay fair. Env steps per call = ``n_envs * steps``.

    Returns:
        ``{name: {"n_envs", "steps_per_s_mean", "steps_per_s_std", "first_call_s"}}``.
    """
    key = jax.random.PRNGKey(seed)
    runs, first = {}, {}
    for name, env in envs.items():
        runs[name] = make_random_rollout(env, n_envs, steps)
        t0 = time.perf_counter()
        jax.block_until_ready(runs[name](key))
        first[name] = time.perf_counter() - t0
    rates: dict[str, list[float]] = {name: [] for name in envs}
    for r in range(reps):
        k = jax.random.fold_in(key, r + 1)
        for name, run in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(run(k))
            rates[name].append(n_envs * steps / (time.perf_counter() - t0))
    return {
        name: {
            "n_envs": n_envs,
            "steps_per_s_mean": float(np.mean(v)),
            "steps_per_s_std": float(np.std(v, ddof=1)) if reps > 1 else 0.0,
            "first_call_s": first[name],
        }
        for name, v in rates.items()
    }


def _baseline_env():
    from jaxmarl.environments.overcooked_v2 import OvercookedV2

    return OvercookedV2(layout="asymm_advantages", max_steps=400, start_cooking_interaction=True)


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args(argv: list[str] | None) -> Args:
    """:class:`Args` from the command line.

    Raises:
        InputError: a bad flag or value, an unknown game, a count below 1.
    """
    d = Args()
    ap = ArgParser(prog="python -m experiments.bench envs", description=__doc__.split("\n")[0])
    ap.add_argument("--games", nargs="+", default=list(d.games), help="games to time (names as in envs_jax.make)")
    ap.add_argument("--n-envs", nargs="+", type=int, default=list(d.n_envs), help="numbers of parallel environments")
    ap.add_argument("--steps", type=int, default=d.steps, help="environment steps per timed call (the scan length)")
    ap.add_argument("--reps", type=int, default=d.reps, help="timed calls per configuration")
    ap.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=d.baseline,
        help="also time bare JaxMARL OvercookedV2 (Asymmetric Advantages)",
    )
    ap.add_argument("--out", type=Path, default=None, help="optional JSON file for the results")
    ap.add_argument("--seed", type=int, default=d.seed, help="PRNG seed")
    a = ap.parse_args(argv)
    for g in a.games:
        if g not in envs_jax.GAMES:
            raise InputError(f"--games: unknown game {g!r}; valid: {', '.join(envs_jax.GAMES)}")
    for n in a.n_envs:
        positive("--n-envs", n)
    positive("--steps", a.steps)
    positive("--reps", a.reps)
    return Args(
        games=tuple(a.games),
        n_envs=tuple(a.n_envs),
        steps=a.steps,
        reps=a.reps,
        baseline=a.baseline,
        out=a.out,
        seed=a.seed,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    meta = {
        "commit": _commit(),
        "device": str(jax.devices()[0]),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "cpu": platform.processor() or platform.machine(),
        "steps_per_call": args.steps,
        "reps": args.reps,
        "seed": args.seed,
    }
    print(f"# envs benchmark  {meta}")
    envs = {g: envs_jax.make(g) for g in args.games}
    if args.baseline:
        envs[BASELINE] = _baseline_env()
    results: dict[str, list[dict]] = {name: [] for name in envs}
    t_start = time.perf_counter()
    for n in args.n_envs:
        rows = time_envs(envs, n, args.steps, args.reps, args.seed)
        for name, row in rows.items():
            results[name].append(row)
            print(
                f"{name:28s} n_envs={n:5d}  {row['steps_per_s_mean']:>12,.0f} ± {row['steps_per_s_std']:>9,.0f} "
                f"steps/s   (first call {row['first_call_s']:.1f} s)",
                flush=True,
            )
    if args.baseline:
        base = {r["n_envs"]: r["steps_per_s_mean"] for r in results[BASELINE]}
        print("\n# ratio to bare JaxMARL OvercookedV2 (AA), same policy, same run")
        for name in args.games:
            ratios = "  ".join(
                f"{r['n_envs']}: {r['steps_per_s_mean'] / base[r['n_envs']]:.2f}x" for r in results[name]
            )
            print(f"{name:28s} {ratios}")
    meta["wall_s"] = time.perf_counter() - t_start
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
