"""jaxopt_marl.artifacts: each run file's record survives save -> load unchanged, and a malformed file fails
naming the file and the field."""

import json

import numpy as np
import pytest

from jaxopt_marl import artifacts as A


def _traj(e=2, t=3, n=2, apples=None):
    pos = np.arange(e * t * n * 2, dtype=np.int32).reshape(e, t, n, 2) % 4
    return A.PolicyTrajectories(
        positions=pos,
        rewards=np.ones((e, t, n)),
        alive=np.ones((e, t, n), bool),
        options=np.zeros((e, t, n), np.int64),
        actions=np.full((e, t, n), 4),
        apples=apples,
    )


def test_eval_trajectories_round_trip(tmp_path):
    walls = np.zeros((4, 5), bool)
    walls[0] = True
    terrain = walls.astype(np.int8)
    terrain[2, 2] = A.APPLE_CELLS
    pid = np.full((4, 5), -1, np.int32)
    pid[2, 2] = 0
    apples = np.zeros((2, 3, 4, 5), bool)
    apples[1, 2, 2, 2] = True
    rec = A.EvalTrajectories(
        seeds=[10000, 10001],
        option_names=("eat_apple", "wait"),
        walls=walls,
        terrain=terrain,
        patch_id=pid,
        trained=_traj(apples=apples),
        base=_traj(),
    )
    path = rec.save(tmp_path / "eval_traj.npz")
    with np.load(path) as z:  # the file layout: trained unprefixed, base_ prefixed, the map beside them
        assert {
            "seeds",
            "option_names",
            "walls",
            "terrain",
            "patch_id",
            "positions",
            "options",
            "apples",
            "base_positions",
            "base_options",
        } <= set(z.files) and "base_apples" not in z.files
    back = A.EvalTrajectories.load(path)
    assert back.option_names == ("eat_apple", "wait") and back.idle_option_ids == [1]
    assert back.trained.options.dtype == np.int32 and back.trained.rewards.dtype == np.float32
    np.testing.assert_array_equal(back.trained.apples, apples)
    np.testing.assert_array_equal(back.patch_id, pid)
    assert back.base.apples is None and back.trained.shape == (2, 3, 2)
    # rewards of 1 per step -> 3 apples per agent and episode
    np.testing.assert_array_equal(back.trained.per_agent_apples(), [[3, 3], [3, 3]])


def test_eval_trajectories_errors(tmp_path):
    walls = np.zeros((4, 5), bool)
    with pytest.raises(A.ArtifactError, match=r"rewards must have shape \[E, T, N\]"):
        A.PolicyTrajectories(
            positions=np.zeros((2, 3, 2, 2)),
            rewards=np.zeros((2, 3)),
            alive=np.ones((2, 3, 2)),
            options=np.zeros((2, 3, 2)),
            actions=np.zeros((2, 3, 2)),
        )
    with pytest.raises(A.ArtifactError, match=r"trained: 2 episode\(s\) for 1 seed\(s\)"):
        A.EvalTrajectories(seeds=[1], option_names=("a",), walls=walls, terrain=walls, trained=_traj())
    with pytest.raises(A.ArtifactError, match="option id 0 out of range of 0"):
        A.EvalTrajectories(seeds=[1, 2], option_names=(), walls=walls, terrain=walls, trained=_traj())
    np.savez(tmp_path / "old.npz", positions=np.zeros((1, 2, 2, 2)), opt_ids=np.zeros((1, 2, 2)))
    with pytest.raises(A.ArtifactError, match="old.npz lacks seeds, option_names, walls, terrain, rewards"):
        A.EvalTrajectories.load(tmp_path / "old.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(A.ArtifactError, match="bad.npz is not a readable npz"):
        A.EvalTrajectories.load(tmp_path / "bad.npz")
    with pytest.raises(FileNotFoundError):
        A.EvalTrajectories.load(tmp_path / "none.npz")


def test_eval_record_round_trip(tmp_path):
    t = A.EvalBlock(
        "trained",
        [10000, 10001],
        [
            {"seed": 10000, "team_return": 3.0, "agent_apples": [3, 0], "sustainability": float("nan")},
            {"seed": 10001, "team_return": 5.0, "agent_apples": [4, 1], "sustainability": 2.0},
        ],
    )
    rec = A.EvalRecord(
        game="cleanup", seeds=[10000, 10001], trained=t, base=None, checkpoint_round=1, stats={"trained": {"n": 2}}
    )
    d = json.loads(rec.save(tmp_path / "eval.json").read_text())
    assert d["base"] is None and "episodes" not in d and "summary" not in d  # no copies of trained's block
    assert d["trained"]["episodes"][0]["sustainability"] is None  # NaN is written as null
    back = A.EvalRecord.load(tmp_path / "eval.json")
    assert back.trained.team_returns == [3.0, 5.0] and back.checkpoint_round == 1 and back.base is None
    assert back.trained.numeric_keys() == ["team_return", "sustainability"]
    np.testing.assert_array_equal(back.trained.metric("sustainability"), [np.nan, 2.0])
    (tmp_path / "old.json").write_text(json.dumps({"summary": {}, "baseline": {}}))
    with pytest.raises(A.ArtifactError, match="old.json lacks 'game'"):
        A.EvalRecord.load(tmp_path / "old.json")
    with pytest.raises(A.ArtifactError, match="trained: 1 episode"):
        A.EvalBlock("trained", [1, 2], [{"team_return": 1}])


def test_solo_record_round_trip(tmp_path):
    rec = A.SoloRecord(
        seeds=(10000, 10001),
        units="apples",
        team_return=[[1, 2], [0, 0]],
        own_return=[[1, 2], [0, np.nan]],
        full_team=[3, 4],
        verdict="not_informative",
        extra={"game": "cleanup"},
    )
    d = json.loads(rec.save(tmp_path / "solo.json").read_text())
    assert d["agents"][1]["own_return"] == [0.0, None] and d["agents"][0]["solo_team"] == {
        "mean": 1.5,
        "std": pytest.approx(0.5**0.5),
        "n": 2,
    }
    assert d["full_team"]["returns"] == [3.0, 4.0] and d["game"] == "cleanup"
    back = A.SoloRecord.load(tmp_path / "solo.json")
    np.testing.assert_array_equal(back.own_return, [[1, 2], [0, np.nan]])
    assert back.extra == {"game": "cleanup"} and back.verdict == "not_informative"
    d["agents"][0].pop("own_return")
    (tmp_path / "solo.json").write_text(json.dumps(d))
    with pytest.raises(A.ArtifactError, match="agent 0 lacks the per-seed list `own_return`"):
        A.SoloRecord.load(tmp_path / "solo.json")


def test_decision_traces(tmp_path):
    rows = [
        {
            "aid": 0,
            "option": "wait",
            "response": "state: x\nchoice: C",
            "response_source": "template",
            "prompt_ids": [1, 2],
        },
        {"aid": 1, "option": "eat_apple", "outcome": "success"},
    ]
    path = A.save_traces(tmp_path / "d.jsonl", rows)
    with open(path, "a") as fh:
        fh.write("{truncated\n\n" + json.dumps({"option": "wait"}) + "\n")  # two malformed lines, one blank
    recs, bad = A.load_traces(path)
    assert bad == 2 and [r.aid for r in recs] == [0, 1]
    assert recs[0].response_source == "template" and recs[0]["prompt_ids"] == [1, 2] and "prompt_ids" in recs[0]
    assert recs[1].get("outcome") == "success" and recs[1].get("missing", 7) == 7
    assert recs[0].to_dict()["prompt_ids"] == [1, 2]
    with pytest.raises(A.ArtifactError, match="response_source"):
        A.DecisionTrace(aid=0, option="wait", response_source="guess")


def test_map_layers_of_the_games():
    import envs_jax

    walls, terrain, pid = A.map_layers(envs_jax.make("harvest"))
    assert pid is not None and pid.max() == 5  # 6 patches
    assert ((terrain == A.APPLE_CELLS) == (pid >= 0)).all() and (terrain[walls] == A.WALL).all()
    walls, terrain, pid = A.map_layers(envs_jax.make("cleanup"))
    assert pid is None and (terrain == A.RIVER).any() and (terrain == A.APPLE_CELLS).any()
    walls, terrain, pid = A.map_layers(envs_jax.make("overcooked_fc"))
    env = envs_jax.make("overcooked_fc")
    assert pid is None and (walls == ~env.layout_info.walkable).all()
    for cells, code in ((env.layout_info.pots, A.POT), (env.layout_info.serving, A.SERVING)):
        assert (terrain[cells[:, 0], cells[:, 1]] == code).all()
