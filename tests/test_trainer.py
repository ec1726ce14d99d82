"""PA-MAGRPO trainer on a tiny random decoder: rounds write checkpoints / metrics / traces, a run stopped
after round 1 and resumed ends with bit-identical adapters to an uninterrupted run, and the checkpoint rule
(paper §6.1, highest training-time team return) keeps the adapters that played the best round, across resumes."""

import json
import shutil

import chex
import jax
import numpy as np
import pytest

from jaxopt_marl import magrpo, rollout, trainer
from lora import split_model
from tests.helpers import tiny_compiled_roller

GAME = "overcooked_aa"
STEPS = 8


@pytest.fixture(scope="module")
def setup():
    """One roller / train step shared by every trainer (compiled once); ``fresh(dir)`` = a new run."""
    # The policy of tests/test_compiled_rollout.py's oc_choice (max_new_tokens 6): one program for both modules.
    cfg = rollout.PolicyConfig(mode="choice_only", temperature=1.0, max_new_tokens=6)
    roller = tiny_compiled_roller(GAME, STEPS, cfg)
    pol = roller.policy
    # Non-zero B so the KL term moves the adapters (fresh adapters are the reference: no gradient at all).
    _, adapters, _ = split_model(pol.model)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
    init = jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    mcfg = magrpo.MAGRPOConfig.smoke(num_rollouts=2, temperature=1.0, kl_beta=0.5)
    shared = {}

    def fresh(run_dir, **tcfg):
        pol.set_adapters(init)
        # The tiny 8-step episodes score nothing (no return spread): these trainers update anyway (the ablation
        # setting skip_zero_advantage=False) so the KL term moves the adapters and resume is checked on real
        # updates. The default (no update) is test_zero_advantage_leaves_adapters_and_optimizer_unchanged's.
        tcfg = {"rounds": 2, "seed": 0, "skip_zero_advantage": False, **tcfg}
        tr = trainer.Trainer(run_dir, roller, mcfg, trainer.TrainConfig(**tcfg), step=shared.get("step"))
        shared["step"] = tr.step
        return tr

    fresh.roller = roller
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
    chex.assert_trees_all_equal(ref, _leaves(resumed.state.adapters))
    metrics = [json.loads(x) for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in metrics] == [0, 1]
    for key in (
        "train/return_mean",
        "train/return_std",
        "train/parse_fail_rate",
        "train/kl",
        "train/clip_frac",
        "perf/decisions_per_s",
        "perf/round_s",
    ):
        assert key in metrics[0]
    assert metrics[1]["train/kl"] > 0
    trace = (tmp_path / "part" / "decisions" / "round_0001.jsonl").read_text().splitlines()
    assert len(trace) == metrics[1]["train/decisions"]

    # A truncated newest checkpoint (2, after round 1): the restore names it and its file, falls back to
    # checkpoint 1, moves 2 aside, and the replayed round 1 ends bit-identical to the uninterrupted run.
    ck = tmp_path / "part" / "checkpoints"
    assert sorted(d.name for d in ck.iterdir() if d.name.isdigit()) == ["1", "2"]
    big = max((f for f in (ck / "2" / "adapters").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    size = big.stat().st_size
    with big.open("r+b") as fh:
        fh.truncate(size // 2)
    said = []
    again = fresh(tmp_path / "part")
    assert again.restore(warn=said.append) == 1
    assert len(said) == 2, said
    assert said[0] == (
        f"checkpoint 2 (after round 1) is corrupt: {big} is truncated ({size // 2} bytes, "
        f"{size} written); trying checkpoint 1"
    )
    assert said[1].startswith("resuming from checkpoint 1 (after round 0): rounds 1..1 are played again")
    assert (tmp_path / "part" / "checkpoints.corrupt" / "2" / "adapters").is_dir()
    assert sorted(d.name for d in ck.iterdir() if d.name.isdigit()) == ["1"]
    again.train()
    chex.assert_trees_all_equal(ref, _leaves(again.state.adapters))
    assert [m["round"] for m in trainer.read_metrics(tmp_path / "part" / "metrics.jsonl")] == [0, 1]
    assert sorted(d.name for d in ck.iterdir() if d.name.isdigit()) == ["1", "2"]

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


#: Scripted team returns per round (K = 2): means 1, 3, 3 -> round 1 is the best (round 2 ties, the earliest wins).
SCRIPT = {0: [0.0, 2.0], 1: [2.0, 4.0], 2: [4.0, 2.0]}


@pytest.fixture
def scripted(setup, monkeypatch):
    """Rollouts whose team returns follow :data:`SCRIPT`; records the adapters the policy played each round with."""
    fresh, init = setup
    roller = fresh.roller
    real = roller.collect
    played = {}

    def collect(seeds, key, *, round_idx=0, **kw):
        played[round_idx] = _leaves(split_model(roller.policy.model)[1])
        res = real(seeds, key, round_idx=round_idx, **kw)
        res.returns = np.asarray(SCRIPT[round_idx], np.float32)
        return res

    monkeypatch.setattr(roller, "collect", collect)
    return fresh, played


def test_best_checkpoint_is_the_highest_training_return(tmp_path, scripted):
    fresh, played = scripted
    tr = fresh(tmp_path / "run")
    assert tr.best_adapters() is None  # nothing played yet
    lines = tr.train(rounds=3)
    assert [m["train/return_mean"] for m in lines] == [1.0, 3.0, 3.0]
    assert [m["train/best_round"] for m in lines] == [0, 1, 1]  # round 0 always sets it; ties keep the earliest
    adapters, rnd, ret = tr.best_adapters()
    assert (rnd, ret) == (1, 3.0) and tr.best == (1, 3.0)
    # The best adapters are the ones that played round 1 (held at its start, before its update) ...
    chex.assert_trees_all_equal(_leaves(adapters), played[1])
    # ... not the round-0 or the final ones.
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(adapters), played[0]))
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(adapters), _leaves(tr.state.adapters)))
    # best/ is an orbax directory with one step; the main checkpoint's meta names the best round.
    assert sorted(d.name for d in (tmp_path / "run" / "best").iterdir() if d.name.isdigit()) == ["1"]
    # keep_checkpoints (default 2) bounds the disk: checkpoints 2 and 3 of 3 rounds, plus best/.
    assert tr.tcfg.keep_checkpoints == 2
    assert sorted(d.name for d in (tmp_path / "run" / "checkpoints").iterdir() if d.name.isdigit()) == ["2", "3"]
    meta = trainer.ckpt.restore(tr.manager, tr.state.adapters, tr.state.opt_state)[2]
    assert (meta["best_round"], meta["best_return"]) == (1, 3.0)


def test_resume_keeps_the_best(tmp_path, scripted):
    fresh, played = scripted
    part = fresh(tmp_path / "part")
    part.train(rounds=2)  # rounds 0, 1; best = round 1
    ref = _leaves(part.best_adapters()[0])
    # A copy "killed" after round 1's best/ was written but before its main checkpoint (step 2).
    shutil.copytree(tmp_path / "part", tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "2")

    resumed = fresh(tmp_path / "part")
    assert resumed.best is None and resumed.restore() == 2
    assert resumed.best == (1, 3.0)  # known after the restore
    resumed.train(rounds=3)  # round 2 ties: the best stays round 1
    adapters, rnd, ret = resumed.best_adapters()
    assert (rnd, ret) == (1, 3.0)
    chex.assert_trees_all_equal(ref, _leaves(adapters))

    # The killed run: best/ is ahead of the checkpoint (round 1 == the round to replay, played by the restored
    # adapters); the replay keeps it.
    again = fresh(tmp_path / "killed")
    assert again.restore() == 1 and again.best == (1, 3.0)
    chex.assert_trees_all_equal(_leaves(again.state.adapters), ref)  # the restored adapters are the ones in best/
    again.train(rounds=2)
    adapters, rnd, ret = again.best_adapters()
    assert (rnd, ret) == (1, 3.0)
    chex.assert_trees_all_equal(ref, _leaves(adapters))


def test_zero_advantage_leaves_adapters_and_optimizer_unchanged(tmp_path, setup, monkeypatch):
    """A cohort without return spread (every advantage exactly 0) runs no update in every preset: adapters and
    optimizer state stay bit-identical (an update would still move them: the fixture's non-zero B gives the
    KL term a gradient, and at fresh adapters Adam rescales float-rounding noise into a full step)."""
    fresh, init = setup
    roller = fresh.roller
    real = roller.collect

    def collect(seeds, key, **kw):
        res = real(seeds, key, **kw)
        res.returns = np.full(len(seeds), 0.35, np.float32)
        return res

    monkeypatch.setattr(roller, "collect", collect)
    made = fresh(tmp_path / "compiled")  # the shared compiled update; resets the adapters to the fixture's
    tr = trainer.Trainer(tmp_path / "zero", roller, made.mcfg, trainer.TrainConfig(), step=made.step)
    ad0, opt0 = _leaves(tr.state.adapters), _leaves(tr.state.opt_state)
    line = tr.run_round()
    assert line["train/adv_zero"] is True and line["train/updated"] is False and line["train/decisions"] > 0
    chex.assert_trees_all_equal(ad0, _leaves(tr.state.adapters))
    chex.assert_trees_all_equal(ad0, _leaves(split_model(roller.policy.model)[1]))  # the policy plays them too
    chex.assert_trees_all_equal(opt0, _leaves(tr.state.opt_state))
    # The same round with an update (skip_zero_advantage=False, the old default of the paper and smoke presets)
    # moves them: what the default guards against.
    moved = fresh(tmp_path / "moved")
    assert moved.run_round()["train/updated"] is True
    assert any(not np.array_equal(a, b) for a, b in zip(ad0, _leaves(moved.state.adapters)))
