"""Cross-play (zero-shot coordination, beyond the paper): seat assembly on synthetic stacked adapters, the teams
enumerated, the paired-bootstrap gap, the tables of two runs on hand-chosen returns, a run crossed with itself (the
background job tests/seeds_job.py: cross-play of a run with itself equals its self-play exactly, a ZSC gap of
exactly 0, self-play replaying the run's eval.json), and bad input."""

import json
import shutil

import numpy as np
import pytest

from experiments import crossplay as X
from tests import seeds_job


def _sources(num_runs, n):
    """Synthetic stacked adapters: run r's adapter k is filled with 100 r + k (two leaves of other shapes)."""
    return [
        {
            "lora_a": np.stack([np.full((3, 2), 100 * r + k, np.float32) for k in range(n)]),
            "lora_b": {"w": np.stack([np.full((2, 4), -(100 * r + k), np.float32) for k in range(n)])},
        }
        for r in range(num_runs)
    ]


def test_assemble_puts_each_agents_adapter_in_its_seat():
    src = _sources(2, 3)
    team = X.assemble(src, [(0, 2), (1, 1), (0, 0)])
    assert np.asarray(team["lora_a"]).shape == (3, 3, 2)
    np.testing.assert_array_equal(np.asarray(team["lora_a"])[:, 0, 0], [2, 101, 0])
    np.testing.assert_array_equal(np.asarray(team["lora_b"]["w"])[:, 1, 3], [-2, -101, 0])
    np.testing.assert_array_equal(np.asarray(team["lora_a"])[1], src[1]["lora_a"][1])
    # Self-play is the run's own stack, exactly.
    own = X.assemble(src, [(1, 0), (1, 1), (1, 2)])
    np.testing.assert_array_equal(np.asarray(own["lora_b"]["w"]), src[1]["lora_b"]["w"])
    with pytest.raises(ValueError, match="seat 1: agent 3 is outside 0..2"):
        X.assemble(src, [(0, 0), (0, 3), (0, 1)])
    with pytest.raises(ValueError, match="seat 0: run 2 is outside 0..1"):
        X.assemble(src, [(2, 0), (0, 1), (0, 2)])


def test_assemble_takes_the_agent_axis_under_the_decoders_layer_axis():
    """lora.Decoder stacks its blocks: a leaf is [L, N, in, rank], the agent axis under the layers. A seat takes
    its agent's adapter in every layer (with L = N = 2, as in the tiny model, a wrong axis would mix layers and keep
    the shapes)."""
    import jax
    from flax import nnx

    from lora import Decoder, LoRAConfig, ModelConfig, split_model

    cfg = ModelConfig.tiny()
    srcs = []
    for r in range(2):
        _, a, _ = split_model(Decoder(cfg, LoRAConfig(num_adapters=2, rank=2), rngs=nnx.Rngs(r)))
        a = jax.tree.map(lambda x, r=r: np.random.RandomState(r).normal(size=x.shape).astype(np.float32), a)
        srcs.append(a)
    team = X.assemble(srcs, [(1, 0), (0, 1)])
    for t, a, b in zip(jax.tree.leaves(team), jax.tree.leaves(srcs[0]), jax.tree.leaves(srcs[1])):
        assert t.shape == a.shape and t.shape[0] == cfg.num_layers == 2
        np.testing.assert_array_equal(np.asarray(t)[:, 0], b[:, 0])  # seat 0: run 1's agent 0, every layer
        np.testing.assert_array_equal(np.asarray(t)[:, 1], a[:, 1])  # seat 1: run 0's agent 1


def test_teams():
    ts = X.teams(3, 7)
    kinds = [t.kind for t in ts]
    assert (kinds.count("self"), kinds.count("cross"), kinds.count("perm")) == (3, 3 * 2 * 7, 3 * 6)
    cross = [t for t in ts if t.kind == "cross" and t.cell == (2, 0)]
    assert cross[4].seats == ((0, 0), (0, 1), (0, 2), (0, 3), (2, 4), (0, 5), (0, 6)) and cross[4].host == 0
    perm = [t for t in ts if t.kind == "perm" and t.cell == (1, 1)]
    assert perm[0].seats == tuple((1, (j + 1) % 7) for j in range(7))
    # Two agents: the cross-play teams are exactly the fully mixed assignments (each under both hosts).
    two = X.teams(3, 2)
    mixed = {tuple(r for r, _ in t.seats) for t in two if t.kind == "cross"}
    assert mixed == {(a, b) for a in range(3) for b in range(3) if a != b}
    assert all(t.seats == ((t.seats[0][0], 0), (t.seats[1][0], 1)) for t in two if t.kind == "cross")


def test_gap_is_the_paired_difference():
    g = X.gap([[1.0, 2.0, 6.0], [3.0, 4.0, 2.0]], [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [2.0, 2.0, 1.0]])
    assert g["per_seed"] == [1.0, 2.0, 3.0] and g["gap"] == 2.0
    assert g["ci"][0] >= 1.0 and g["ci"][1] <= 3.0 and g["ci"][0] < 2.0 < g["ci"][1]
    same = X.gap([[1.0, 5.0]], [[1.0, 5.0], [1.0, 5.0]])
    assert same["gap"] == 0.0 and same["ci"] == [0.0, 0.0]


@pytest.fixture(scope="module")
def seeds_out():
    return seeds_job.result()[0]


def _eval(run):
    return json.loads((run / "eval.json").read_text())


@pytest.mark.background("seeds")
def test_a_run_crossed_with_itself(seeds_out):
    run = seeds_out / "seed_0"
    r = json.loads((seeds_out / "xp_self" / "crossplay.json").read_text())
    ev = _eval(run)
    own = [e["team_return"] for e in ev["trained"]["episodes"]]
    teams = r["teams"]
    assert [t["kind"] for t in teams] == ["self"] * 2 + ["cross"] * 4 + ["perm"] * 2
    assert [t["seats"] for t in teams[2:6]] == [[[0, 0], [1, 1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]], [[0, 0], [1, 1]]]
    # Self-play replays the run's own evaluation (same seeds, key, menus, adapters), and every cross-play team of
    # a run with itself is that same team: the same returns, decisions, parse failures and final stats.
    for t in teams[:6]:
        assert t["returns"] == own, t["label"]
        assert t["episodes"] == ev["trained"]["episodes"], t["label"]
    assert r["eval_seeds"] == ev["seeds"] and r["episodes"] == len(own) == 2
    cells = r["matrix"]["cells"]
    assert cells[0][0]["values"] == cells[1][1]["values"] == own
    assert cells[0][1]["values"] == cells[1][0]["values"] == own + own  # two seats, pooled
    assert r["cross_play"]["mean"] == r["self_play"]["mean"]
    assert r["zsc_gap"]["gap"] == 0.0 and r["zsc_gap"]["ci"] == [0.0, 0.0]
    assert r["zsc_gap"]["per_seed"] == [0.0, 0.0]
    assert teams[6]["seats"] == [[0, 1], [0, 0]] and teams[6]["host"] == "run0"
    md = (seeds_out / "xp_self" / "crossplay.md").read_text()
    assert "ZSC gap (self-play − cross-play):** 0.00" in md
    # One run given twice: the output says the cross-play is the run with itself (gap 0 by construction).
    assert r["note"].startswith(f"every RUN_DIR is the same run ({run}): cross-play is that run with itself")
    assert f"**Note:** {r['note']}." in md


def test_tabulate_two_runs_by_hand():
    """R = 2 runs of 2 agents on 2 seeds, returns chosen by hand (teams() order)."""
    rets = [[4, 6], [2, 2], [1, 3], [0, 2], [2, 0], [1, 1], [0, 0], [2, 2]]
    played = [(t, [float(x) for x in r], []) for t, r in zip(X.teams(2, 2), rets)]
    r = X.tabulate(played, 2)
    cells = r["matrix"]["cells"]
    assert cells[0][0]["values"] == [4, 6] and cells[1][1]["values"] == [2, 2]
    assert cells[0][1]["values"] == [1, 3, 0, 2] and cells[0][1]["mean"] == 1.5
    assert cells[1][0]["values"] == [2, 0, 1, 1] and cells[1][0]["mean"] == 1.0
    assert [t["host"] for t in r["teams"] if t["kind"] == "cross"] == ["run1", "run1", "run0", "run0"]
    assert r["self_play"]["mean"] == 3.5 and r["cross_play"]["mean"] == 1.25 and r["permuted"]["mean"] == 1.0
    # Per seed: self-play means [3, 4], cross-play means [1, 1.5]: d = [2, 2.5], gap 2.25 = 3.5 - 1.25.
    assert r["zsc_gap"]["per_seed"] == [2.0, 2.5] and r["zsc_gap"]["gap"] == 2.25
    assert 2.0 <= r["zsc_gap"]["ci"][0] <= r["zsc_gap"]["ci"][1] <= 2.5
    assert r["permutation_gap"]["per_seed"] == [2.0, 3.0] and r["permutation_gap"]["gap"] == 2.5


def _cli_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        X.cli(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.background("seeds")
def test_bad_input(seeds_out, tmp_path, capsys):
    run = seeds_out / "seed_0"
    msg = _cli_error([str(tmp_path / "nope"), str(run)], capsys)
    assert f"run directory {tmp_path / 'nope'} does not exist" in msg
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(run / "eval.json", other / "eval.json")
    cfg = json.loads((run / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "game": "overcooked_fc", "model": "x.gguf"}))
    msg = _cli_error([str(run), str(other), "--out", str(tmp_path / "o")], capsys)
    assert f'game: {run} "overcooked_aa", {other} "overcooked_fc"' in msg
    assert f'model: {run} "tiny-random", {other} "x.gguf"' in msg
    assert not (tmp_path / "o").exists()
    msg = _cli_error([str(run), "--episodes", "0"], capsys)
    assert "--episodes must be >= 1, got 0" in msg


def _hand_run(d, **kw):
    """A hand-built finished run directory (config.json and eval.json, no adapters, nothing trained)."""
    from jaxopt_marl.config import CHECKPOINT_RULE, RunConfig
    from jaxopt_marl.pipeline import write_config

    d.mkdir(parents=True)
    write_config(RunConfig.smoke("overcooked_aa", model="tiny-random", eval_episodes=2, **kw), d)
    eps = [{"seed": 10000 + e, "team_return": float(e)} for e in range(2)]
    block = {"policy": "trained", "seeds": [10000, 10001], "episodes": eps}
    ev = {"game": "overcooked_aa", "seeds": [10000, 10001], "trained": block, "eval_checkpoint": "best"}
    (d / "eval.json").write_text(json.dumps({**ev, "checkpoint_rule": CHECKPOINT_RULE, "checkpoint_round": 1}))
    return d


def test_one_run_is_refused(tmp_path, capsys):
    a = _hand_run(tmp_path / "a")
    msg = _cli_error([str(a), "--out", str(tmp_path / "o")], capsys)
    assert f"cross-play needs at least two runs, got 1 ({a})" in msg
    assert not (tmp_path / "o").exists()


def test_missing_adapters_are_found_before_any_model(tmp_path, capsys, monkeypatch):
    a, b = _hand_run(tmp_path / "a"), _hand_run(tmp_path / "b", seed=1)
    monkeypatch.setattr(X, "Host", lambda run: pytest.fail("a model was built before the adapters were checked"))
    msg = _cli_error([str(a), str(b), "--out", str(tmp_path / "o")], capsys)
    assert f"{a / 'best'} is missing ({a / 'eval.json'} evaluated best adapters of round 1)" in msg
    (a / "best").mkdir()
    msg = _cli_error([str(a), str(b), "--out", str(tmp_path / "o")], capsys)
    assert f"{a / 'best'} holds no checkpoint" in msg
    assert not (tmp_path / "o").exists()


def test_out_that_is_a_file_is_refused_first(tmp_path, capsys, monkeypatch):
    a, b = _hand_run(tmp_path / "a"), _hand_run(tmp_path / "b", seed=1)
    monkeypatch.setattr(X, "Host", lambda run: pytest.fail("a model was built before --out was checked"))
    (tmp_path / "f").write_text("x")
    msg = _cli_error([str(a), str(b), "--out", str(tmp_path / "f")], capsys)
    assert msg == f"error: --out {tmp_path / 'f'} exists and is not a directory"
    msg = _cli_error([str(a), str(b), "--out", str(tmp_path / "f" / "sub")], capsys)
    assert msg == f"error: --out {tmp_path / 'f' / 'sub'} cannot be created: {tmp_path / 'f'} is not a directory"
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize(
    "field, a_val, b_val",
    [("episode_steps", 12, 8), ("mode", "sample", "choice_only"), ("temperature", 0.7, 0.9), ("max_new_tokens", 12, 6)],
)
def test_runs_with_other_evaluation_settings_are_refused(field, a_val, b_val, tmp_path, capsys):
    a, b = _hand_run(tmp_path / "a", **{field: a_val}), _hand_run(tmp_path / "b", seed=1, **{field: b_val})
    msg = _cli_error([str(a), str(b), "--out", str(tmp_path / "o")], capsys)
    assert "evaluation episodes are played alike" in msg
    assert f"{field}: {a} {json.dumps(a_val)}, {b} {json.dumps(b_val)}" in msg
    assert not (tmp_path / "o").exists()


def test_differing_eval_episodes_need_episodes(tmp_path, capsys):
    a, b = _hand_run(tmp_path / "a"), _hand_run(tmp_path / "b", seed=1)
    cfg = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps({**cfg, "eval_episodes": 3}))
    msg = _cli_error([str(a), str(b), "--out", str(tmp_path / "o")], capsys)
    assert f"evaluation episode counts differ (eval_episodes: {a} 2, {b} 3): pass --episodes N" in msg
    # With --episodes the counts are set for every run: the next check (the adapters) is reached.
    msg = _cli_error([str(a), str(b), "--episodes", "2", "--out", str(tmp_path / "o")], capsys)
    assert f"{a / 'best'} is missing" in msg
