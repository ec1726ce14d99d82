"""``python -m experiments.cleanup``: the main job on Melting Pot Cleanup.

The full pipeline (paper §5-§6) is burn-in -> guards -> PA-MAGRPO training of per-agent LoRA
adapters -> evaluation -> report. Only the parts that exist run; each stage that is not built yet
is named in the console output and in ``report.md`` (it is never faked):

* built: the vectorised Cleanup game (``envs_jax``), evaluation of a policy on the held-out seeds
  10000-10019, the social-dilemma metrics, curves, a GIF and the report;
* not built yet: option library, executors, burn-in and guards (issue #3), the LLM with per-agent
  LoRA (issue #4), PA-MAGRPO training (issue #5). Until then the evaluated policy is the
  uniform-random primitive-action baseline, the policy of the reference statistics in
  ``shared/reference``.

Outputs go to ``runs/<name>/``: ``config.json``, ``eval.json``, ``curves.png``, ``episode.gif`` and
``report.md``. An existing run directory is never overwritten unless ``--force`` is given.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import tyro

import envs_jax
from envs_jax.render import write_gif
from jaxopt_marl import metrics

GAME = "cleanup"
EVAL_SEED0 = 10000  # paper §6.1: evaluation on 20 episodes with seeds disjoint from training
NOT_BUILT = (
    "option library, executors, burn-in and mined guards (issue #3)",
    "frozen LLM with per-agent LoRA adapters (issue #4)",
    "PA-MAGRPO training and the LLM option policy (issue #5)",
)


@dataclasses.dataclass
class Config:
    """Configuration of ``python -m experiments.cleanup``."""

    preset: Literal["paper", "cpu", "smoke"] = "cpu"
    """Budget preset. Only the evaluation budget differs until training exists (issue #5)."""
    seed: int = 0
    """Seed of the run (training seed once training exists)."""
    eval_episodes: int | None = None
    """Evaluation episodes on seeds 10000, 10001, ... (default: 20, or 2 with ``--preset smoke``)."""
    max_steps: int = 150
    """Episode length in steps (paper §6.1: 150)."""
    out: Path = Path("runs")
    """Parent directory of the run directory."""
    name: str | None = None
    """Run directory name (default ``cleanup-<preset>-s<seed>-<UTC time>``)."""
    force: bool = False
    """Overwrite an existing run directory."""
    gif: bool = True
    """Write a GIF of the first evaluation episode."""

    def __post_init__(self):
        if self.eval_episodes is None:
            self.eval_episodes = 2 if self.preset == "smoke" else 20
        if self.eval_episodes <= 0:
            raise ValueError(f"eval_episodes must be positive, got {self.eval_episodes}")
        if self.max_steps <= 0:
            raise ValueError(f"max_steps must be positive, got {self.max_steps}")


def make_random_eval(env, n_episodes: int, steps: int):
    """Jitted uniform-random evaluation of ``n_episodes`` episodes of ``steps`` steps.

    Returns ``run(keys) -> (rewards f32[E, T, N], stats dict of f32[E, T+1], states of episode 0)``.
    Each episode's reset key is ``keys[e]`` (derived from its evaluation seed).
    """
    agents = list(env.agents)
    n_act = env.action_space(agents[0]).n

    def one_episode(key):
        k_reset, k_run = jax.random.split(key)
        _, state = env.reset(k_reset)

        def body(state, k):
            k_a, k_s = jax.random.split(k)
            acts = jax.random.randint(k_a, (len(agents),), 0, n_act)
            _, nstate, rew, _, _ = env.step_env(k_s, state, {a: acts[i] for i, a in enumerate(agents)})
            stats = env.world_stats(nstate)
            return nstate, (jnp.stack([rew[a] for a in agents]).astype(jnp.float32), stats, nstate)

        _, (rew, stats, states) = jax.lax.scan(body, state, jax.random.split(k_run, steps))
        stats0 = env.world_stats(state)
        stats = {k: jnp.concatenate([stats0[k][None], v]).astype(jnp.float32) for k, v in stats.items()}
        return rew, stats, states

    def run(keys):
        rew, stats, states = jax.vmap(one_episode)(keys)
        return rew, stats, jax.tree.map(lambda x: x[0], states)

    return jax.jit(run)


def _report(cfg: Config, ev: dict, run_dir: Path, files: dict[str, str]) -> str:
    s = ev["summary"]
    lines = [
        f"# Cleanup run `{run_dir.name}`",
        "",
        "**Reduced pipeline.** The stages below are not built yet, so this run evaluates the",
        "uniform-random primitive-action baseline on the real (JAX) Cleanup game; no LLM is involved:",
        "",
        *[f"- {x}" for x in NOT_BUILT],
        "",
        f"Preset `{cfg.preset}`, {cfg.eval_episodes} evaluation episodes of {cfg.max_steps} steps on seeds "
        f"{EVAL_SEED0}-{EVAL_SEED0 + cfg.eval_episodes - 1}.",
        "",
        "| metric | mean | std |",
        "|---|---|---|",
    ]
    for k, v in s.items():
        lines.append(f"| {k} | {v['mean']:.3f} | {v['std']:.3f} |")
    lines += ["", "Per-agent apples (mean over episodes): "
              + ", ".join(f"agent_{i}: {a:.2f}" for i, a in enumerate(ev["per_agent_apples_mean"])), ""]
    if "curves" in files:
        lines += [f"![dirt and apples over time]({files['curves']})", ""]
    if "gif" in files:
        lines += [f"![episode {EVAL_SEED0}]({files['gif']})", ""]
    lines += ["Reference (real Melting Pot, uniform-random, 8 episodes): team return over the first 150 steps",
              "is 0 in every episode; dirt 79 at reset, 74.9 ± 3.3 at step 50, 100.8 ± 14.2 at step 150.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Path:
    cfg = tyro.cli(Config, args=sys.argv[1:] if argv is None else argv)
    name = cfg.name or f"cleanup-{cfg.preset}-s{cfg.seed}-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}"
    run_dir = cfg.out / name
    if run_dir.exists():
        if not cfg.force:
            raise SystemExit(f"run directory {run_dir} exists; pass --force to overwrite it")
        shutil.rmtree(run_dir)
    env = envs_jax.make(GAME, max_steps=cfg.max_steps)
    print(f"jaxopt-marl cleanup | preset={cfg.preset} seed={cfg.seed} device={jax.devices()[0]} "
          f"| eval seeds {EVAL_SEED0}..{EVAL_SEED0 + cfg.eval_episodes - 1} | out={run_dir}")
    print("not built yet (skipped, see report.md):")
    for x in NOT_BUILT:
        print(f"  - {x}")
    print("evaluating the uniform-random primitive-action baseline on the JAX Cleanup game")
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))

    t0 = time.perf_counter()
    keys = jnp.stack([jax.random.PRNGKey(EVAL_SEED0 + e) for e in range(cfg.eval_episodes)])
    rew, stats, states0 = make_random_eval(env, cfg.eval_episodes, cfg.max_steps)(keys)
    rew, stats = np.asarray(rew), {k: np.asarray(v) for k, v in stats.items()}
    seconds = time.perf_counter() - t0

    team = rew.sum(axis=(1, 2))
    alive_frac = stats["avatars_alive"][:, 1:]
    per_episode = {
        "team_return": team,
        "efficiency": metrics.efficiency(rew),
        "equality": metrics.equality(rew),
        "peace": alive_frac.mean(axis=1),
        "dirt_final": stats["dirt"][:, -1],
        "apples_final": stats["apples"][:, -1],
    }
    ev = {
        "policy": "uniform_random_primitive",
        "seeds": list(range(EVAL_SEED0, EVAL_SEED0 + cfg.eval_episodes)),
        "episodes": [{k: float(v[e]) for k, v in per_episode.items()} | {"seed": EVAL_SEED0 + e}
                     for e in range(cfg.eval_episodes)],
        "summary": {k: {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0}
                    for k, v in per_episode.items()},
        "per_agent_apples_mean": rew.sum(axis=1).mean(axis=0).tolist(),
        "curves": {k: v.mean(axis=0).tolist() for k, v in stats.items()},
        "seconds": seconds,
    }
    (run_dir / "eval.json").write_text(json.dumps(ev, indent=2))
    files = {"eval": "eval.json"}

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    t = np.arange(cfg.max_steps + 1)
    for k in ("dirt", "apples"):
        m, sd = stats[k].mean(0), stats[k].std(0)
        ax.plot(t, m, label=k)
        ax.fill_between(t, m - sd, m + sd, alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("cells")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "curves.png", dpi=100)
    plt.close(fig)
    files["curves"] = "curves.png"

    if cfg.gif:
        frames = np.asarray(jax.jit(jax.vmap(env.render))(states0))
        write_gif(frames, run_dir / "episode.gif", fps=10)
        files["gif"] = "episode.gif"

    (run_dir / "report.md").write_text(_report(cfg, ev, run_dir, files))
    s = ev["summary"]
    print(f"team return {s['team_return']['mean']:.2f} ± {s['team_return']['std']:.2f} apples/episode; "
          f"final dirt {s['dirt_final']['mean']:.1f}; {seconds:.1f} s")
    for f in ["config.json", *files.values(), "report.md"]:
        print(f"wrote {run_dir / f}")
    return run_dir


if __name__ == "__main__":
    main()
