"""PA-MAGRPO trainer on a tiny random decoder: rounds write checkpoints / metrics / traces, and a run stopped
after round 1 and resumed ends with bit-identical adapters to an uninterrupted run."""

import json

import jax
import numpy as np
import pytest

import envs_jax
from jaxopt_marl import guards as G
from jaxopt_marl import magrpo, options, rollout, trainer
from lora import LoRAConfig, split_model

GAME = "overcooked_aa"
STEPS = 8


@pytest.fixture(scope="module")
def setup():
    """One roller / train step shared by every trainer (compiled once); ``fresh(dir)`` = a new run."""
    env = envs_jax.make(GAME, max_steps=STEPS)
    lib = options.get_library(GAME, env)
    model, tok = rollout.load_policy_model(rollout.TINY_RANDOM, LoRAConfig(num_adapters=2, rank=2, alpha=4.0))
    # Non-zero B so the KL term moves the adapters (fresh adapters are the reference: no gradient at all).
    _, adapters, _ = split_model(model)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
    init = jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    pol = rollout.LLMPolicy(model, tok, GAME, rollout.PolicyConfig(mode="choice_only", temperature=1.0))
    roller = rollout.Roller(GAME, env, lib, G.compile_guards([], lib.vocab), pol)
    mcfg = magrpo.MAGRPOConfig.smoke(num_rollouts=2, temperature=1.0, kl_beta=0.5)
    shared = {}

    def fresh(run_dir):
        pol.set_adapters(init)
        tr = trainer.Trainer(run_dir, roller, mcfg, trainer.TrainConfig(rounds=2, seed=0), step=shared.get("step"))
        shared["step"] = tr.step
        return tr

    return fresh, init


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_resume_equals_uninterrupted(tmp_path, setup):
    fresh, init = setup
    full = fresh(tmp_path / "full")
    lines = full.train()
    assert [m["round"] for m in lines] == [0, 1]
    ref = _leaves(full.state.adapters)
    assert any(not np.array_equal(a, b) for a, b in zip(ref, _leaves(init))), "adapters never moved"

    part = fresh(tmp_path / "part")
    part.train(rounds=1)  # "killed" after round 1
    resumed = fresh(tmp_path / "part")
    assert resumed.restore() == 1
    resumed.train()
    for a, b in zip(ref, _leaves(resumed.state.adapters)):
        np.testing.assert_array_equal(a, b)
    metrics = [json.loads(x) for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in metrics] == [0, 1]
    for key in ("train/return_mean", "train/return_std", "train/parse_fail_rate", "train/kl", "train/clip_frac",
                "perf/decisions_per_s", "perf/round_s"):
        assert key in metrics[0]
    assert metrics[1]["train/kl"] > 0
    trace = (tmp_path / "part" / "decisions" / "round_0001.jsonl").read_text().splitlines()
    assert len(trace) == metrics[1]["train/decisions"]

    # A corrupt checkpoint is reported with its directory, never silently restarted.
    for f in (tmp_path / "part" / "checkpoints").rglob("*"):
        if f.is_file() and "adapters" in str(f):
            f.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="corrupt"):
        fresh(tmp_path / "part").restore()


def test_train_seeds_disjoint_from_eval():
    seeds = {s for r in range(1000) for s in trainer.train_seeds(3, r, 6)}
    assert not seeds & set(range(10000, 10020))
    assert trainer.train_seeds(0, 1, 2) == [trainer.TRAIN_SEED0 + 2, trainer.TRAIN_SEED0 + 3]
