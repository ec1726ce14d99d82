"""``python -m experiments.table2`` (paper §6.2 Table 2, §6.3): its bad input (no compute), the §6.3 analyses on
hand-made traces and trajectories, and one smoke grid of all six cells on the tiny random model (Overcooked AA,
4-step episodes, 1 round, 2 evaluation episodes) whose ``table2.json`` is checked against each cell's own
``eval.json``, ``decisions/eval.jsonl`` and ``eval_traj.npz``, then resumed."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from experiments import split, table2
from experiments.cli import InputError
from jaxopt_marl import artifacts, pipeline

ROOT = Path(__file__).resolve().parents[1]
GAME = "overcooked_aa"
#: The grid's flags (without ``--out``): the smoke preset cut to one round of 4-step episodes.
GRID_ARGS = ["--game", GAME, "--preset", "smoke", "--model", "tiny-random", "--episode-steps", "4"]
GRID_ARGS += ["--eval-episodes", "2", "--solo-episodes", "0", "--rounds", "1"]


def _cli_error(argv, capfd) -> str:
    with pytest.raises(SystemExit) as e:
        table2.cli(argv)
    assert e.value.code == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ---------------------------------------------------------------------------------------------------------
# Bad input: before any compute
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--cells", "full,bogus"], "unknown cell(s) 'bogus'; valid cells: " + ", ".join(table2.CELL_NAMES)),
        (["--cells", "frozen", "full"], "unknown cell(s) 'frozen'; valid cells: frozen_native, frozen_menu,"),
        (["--interface", "native"], "--interface: the grid sets each cell's interface"),
        (["--resume", "--force"], "--resume and --force exclude each other"),
        (["--mode", "choice_only"], "cell compound_json_magrpo: interface compound_json needs mode 'sample'"),
        (["--preset", "huge"], "unknown preset 'huge'"),
        (
            ["--num-processes", "4", "--process-id", "0"],
            "--distributed: --cells 6 does not split over 4 processes: each process runs whole runs",
        ),
        (["--cells", "full", "frozen_menu", "--num-processes", "2", "--process-id", "2"], "outside 0..1"),
    ],
)
def test_bad_input_is_one_line_before_any_compute(extra, message, tmp_path, capfd):
    argv = [*GRID_ARGS, *extra, "--out", str(tmp_path / "o")]  # a later --preset overrides the grid's
    assert message in _cli_error(argv, capfd)
    assert not (tmp_path / "o").exists()


def test_cells_split_interleaved_over_processes():
    """Process p runs cells p, p + P, ...: each of 2 or 3 processes gets one frozen cell (the cheap ones)."""
    names = list(table2.CELL_NAMES)
    halves = [split.share(names, 2, p, what="--cells", interleave=True) for p in range(2)]
    assert halves == [
        ["frozen_native", "native_magrpo", "shared_lora_menu"],
        ["frozen_menu", "compound_json_magrpo", "full"],
    ]
    thirds = [split.share(names, 3, p, what="--cells", interleave=True) for p in range(3)]
    assert [len(t) for t in thirds] == [2, 2, 2] and sorted(sum(thirds, [])) == sorted(names)
    assert [sum(c in table2.FROZEN_CELLS for c in t) for t in thirds] == [1, 1, 0]


def test_launch_fingerprint_covers_every_cell_setting():
    args = table2.build_table2_parser().parse_args(GRID_ARGS)
    cfgs = {c.name: table2.cell_config(c, GAME, args) for c in table2.CELLS}
    fp = table2.launch_fingerprint(list(cfgs), 2, cfgs)
    assert fp == table2.launch_fingerprint(list(cfgs), 2, dict(cfgs))
    assert fp != table2.launch_fingerprint(list(cfgs), 3, cfgs)
    assert fp != table2.launch_fingerprint(list(cfgs)[:2], 2, cfgs)
    other = {**cfgs, "full": cfgs["full"].replace(eval_episodes=3)}
    assert fp != table2.launch_fingerprint(list(cfgs), 2, other)


def test_unknown_game(capfd, tmp_path):
    assert "unknown game 'pong'; valid games:" in _cli_error(["--game", "pong", "--out", str(tmp_path)], capfd)


def test_existing_cell_dir_is_refused_before_any_compute(tmp_path, capfd):
    out = tmp_path / "grid"
    (out / "full").mkdir(parents=True)
    (out / "full" / "note.txt").write_text("an earlier run")
    err = _cli_error([*GRID_ARGS, "--out", str(out)], capfd)
    assert err == (
        f"error: cell full: run directory {out / 'full'} exists; pass --resume to skip finished cells and continue "
        "cut ones, or --force to start every cell afresh"
    )
    assert sorted(p.name for p in out.iterdir()) == ["full"]  # no other cell was started
    (out / "frozen_menu").write_text("a file")
    err = _cli_error([*GRID_ARGS, "--out", str(out), "--cells", "frozen_menu"], capfd)
    assert "cell frozen_menu: " in err and "exists and is not a directory (the cell's run directory)" in err


def test_resume_of_another_budget_names_the_keys(tmp_path, capfd):
    """A cell started with 4-step episodes and 2 rollouts, resumed with 5 and 3: both keys named with both values,
    before any compute (the cell's ``config.json`` is all it needs)."""
    out = tmp_path / "grid"
    ap = table2.build_table2_parser()
    cfg = table2.cell_config(table2.BY_NAME["native_magrpo"], GAME, ap.parse_args(GRID_ARGS))
    (out / "native_magrpo").mkdir(parents=True)
    pipeline.write_config(cfg, out / "native_magrpo")
    err = _cli_error([*GRID_ARGS, "--out", str(out), "--resume", "--episode-steps", "5", "--rollouts", "3"], capfd)
    assert "--resume: the flags differ from" in err and str(out / "native_magrpo" / "config.json") in err
    assert "episode_steps: 4 in config.json, 5 given" in err and "num_rollouts: 2 in config.json, 3 given" in err
    assert sorted(p.name for p in out.iterdir()) == ["native_magrpo"]


def test_cells_share_every_setting_but_their_own():
    """Each cell differs from the full method only in what its row names (paper §6.1 "Ablations")."""
    args = table2.build_table2_parser().parse_args(GRID_ARGS)
    cfgs = {c.name: table2.cell_config(c, GAME, args) for c in table2.CELLS}
    diff = {k: table2.config_differences(v, cfgs["full"]) for k, v in cfgs.items()}
    assert diff == {
        "frozen_native": {"interface": ["native", "menu"], "rounds": [0, 1]},
        "frozen_menu": {"rounds": [0, 1]},
        "native_magrpo": {"interface": ["native", "menu"]},
        "compound_json_magrpo": {"interface": ["compound_json", "menu"], "max_new_tokens": [32, 8]},
        "shared_lora_menu": {"shared_adapter": [True, False], "lora_num_adapters": [1, 2]},
        "full": {},
    }
    assert all(c.frozen == (k in table2.FROZEN_CELLS) and not c.eval_base for k, c in cfgs.items())
    assert table2.parse_cells(["full", "frozen_native,full"]) == ["frozen_native", "full"]


# ---------------------------------------------------------------------------------------------------------
# §6.3 analyses on hand-made inputs
# ---------------------------------------------------------------------------------------------------------


def _trace(aid, step, option, seed=10000, parse_fail=False):
    return {"aid": aid, "step": step, "option": option, "seed": seed, "rollout": seed - 10000, "parse_fail": parse_fail}


def test_fire_clean_after_turn_counts_the_agents_own_previous_decision():
    traces = [
        _trace(0, 0, "fire_clean"),  # first decision of the episode: after nothing
        _trace(0, 1, "turn_left"),
        _trace(1, 1, "turn_right"),  # agent 1's turn does not count for agent 0
        _trace(0, 2, "fire_clean"),  # after agent 0's turn_left: counts
        _trace(0, 3, "fire_clean"),  # after a fire_clean: does not
        _trace(1, 2, "fire_clean"),  # after agent 1's turn_right: counts
        _trace(1, 0, "forward", seed=10001),
        _trace(1, 1, "fire_clean", seed=10001),  # other episode: after forward
    ]
    r = table2.fire_clean_after_turn(traces[::-1], num_agents=3)  # order of the lines does not matter
    assert r["fire_clean"] == [3, 2, 0] and r["after_turn"] == [1, 1, 0]
    assert r["rate"] == [pytest.approx(1 / 3), 0.5, None]
    assert r["total"] == {"fire_clean": 5, "after_turn": 2, "rate": 0.4}


def _traj(actions, alive=None, rewards=None, positions=None):
    a = np.asarray(actions, np.int32)
    e, t, n = a.shape
    return artifacts.PolicyTrajectories(
        positions=np.zeros((e, t, n, 2), np.int32) if positions is None else positions,
        rewards=np.zeros((e, t, n), np.float32) if rewards is None else rewards,
        alive=np.ones((e, t, n), bool) if alive is None else alive,
        options=np.zeros((e, t, n), np.int32),
        actions=a,
    )


def test_agent_steps_in_play_counts_present_agents_of_played_steps():
    actions = np.zeros((1, 4, 2), np.int32)
    actions[0, 3] = -1  # the episode ended after 3 steps
    alive = np.ones((1, 4, 2), bool)
    alive[0, 0, 1] = False  # agent 1 zapped in step 0: absent in step 1, back after step 1
    steps = table2.agent_steps_in_play(_traj(actions, alive=alive))
    assert steps.tolist() == [3, 2]


def test_native_deliveries_credit_the_interacting_agent_next_to_serving():
    from envs_jax.overcooked import DELIVERY_REWARD

    terrain = np.zeros((3, 4), np.int8)
    terrain[0, 3] = artifacts.SERVING
    pos = np.zeros((1, 3, 2, 2), np.int32)
    pos[0, :, 0] = [1, 3]  # agent 0 below the serving cell
    pos[0, :, 1] = [2, 0]  # agent 1 far from it
    interact = 5
    actions = np.array([[[interact, interact], [4, interact], [interact, 4]]], np.int32)
    rewards = np.zeros((1, 3, 2), np.float32)
    rewards[0, 0] = rewards[0, 2] = DELIVERY_REWARD  # deliveries in steps 0 and 2; step 1 none
    tr = artifacts.EvalTrajectories(
        seeds=[10000],
        option_names=("north",),
        walls=np.zeros((3, 4), bool),
        terrain=terrain,
        trained=_traj(actions, rewards=rewards, positions=pos),
    )
    assert table2.native_deliveries(tr, GAME).tolist() == [[2.0, 0.0]]


def test_patterns_follow_their_rules():
    def cell(mean, top="east", share=0.6):
        return {
            "team_return": {"mean": mean},
            "analysis": {"top_action": top, "top_action_share": share, "histogram": {"options": ["east", "west"]}},
        }

    cells = {
        "frozen_native": cell(0.0),
        "frozen_menu": cell(0.2),
        "native_magrpo": cell(0.5, share=0.9),  # 0.5 < 0.1 x 6.8: near 0
        "compound_json_magrpo": cell(0.0),
        "shared_lora_menu": cell(2.25),
        "full": cell(6.8),
    }
    p = table2.patterns(GAME, cells)
    assert p["native_near_zero_one_letter"]["holds"] is True
    assert p["shared_below_per_agent"]["holds"] is True and p["shared_below_per_agent"]["claimed"] is True
    assert p["full_best"]["holds"] is True
    cells["native_magrpo"] = cell(0.0, top="idle", share=1.0)  # parse failures are not a letter
    cells["shared_lora_menu"] = cell(6.8)  # a tie is not "best"
    p = table2.patterns("harvest", cells)
    assert p["native_near_zero_one_letter"]["cells"]["native_magrpo"]["dominant_letter"] is False
    assert p["native_near_zero_one_letter"]["holds"] is False
    assert p["shared_below_per_agent"]["holds"] is False and p["shared_below_per_agent"]["claimed"] is False
    assert p["full_best"]["holds"] is False
    del cells["full"]
    assert all(v["holds"] is None for v in table2.patterns(GAME, cells).values())


# ---------------------------------------------------------------------------------------------------------
# One smoke grid of all six cells
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """The six cells played by two processes of one ``--distributed`` launch (issue #17: 3 cells each, process 0
    writing the table after its barrier); ``(OUT, process 0's stdout)``."""
    out = tmp_path_factory.mktemp("table2") / "grid"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "experiments.table2", *GRID_ARGS, "--out", str(out)]
            + ["--num-processes", "2", "--process-id", str(p)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(2)
    ]
    try:
        res = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (o, e) in zip(procs, res):
        assert p.returncode == 0, o[-3000:] + e[-3000:]
    (out0, _), (out1, _) = res
    assert "(process 1 of 2: cells frozen_menu, compound_json_magrpo, full)" in out1
    assert table2.SUMMARY_JSON not in out1 and "== cell frozen_native" not in out1  # its share, no table
    assert "(process 0 of 2: cells frozen_native, native_magrpo, shared_lora_menu)" in out0
    assert not any((out / split.PROCESS_DIR).iterdir())  # process 0 deleted the completion files
    return out, out0


def _own_deliveries(traces, seeds, n):
    per_ep = np.zeros((len(seeds), n))
    for t in traces:
        if t["option"] == "deliver" and t["outcome"] == "success":
            per_ep[seeds.index(t["seed"]), t["aid"]] += 1
    return per_ep


def test_grid_summary_matches_each_cells_files(grid):
    out, stdout = grid
    s = json.loads((out / table2.SUMMARY_JSON).read_text())
    assert s["covered"] == list(table2.CELL_NAMES) and s["missing"] == [] and s["units"] == "deliveries"
    seeds = None
    for name in table2.CELL_NAMES:
        d, r = out / name, s["cells"][name]
        cfg = json.loads((d / "config.json").read_text())
        ev = json.loads((d / "eval.json").read_text())
        traces = [json.loads(x) for x in (d / "decisions" / "eval.jsonl").read_text().splitlines()]
        traj = np.load(d / "eval_traj.npz")
        frozen = name in table2.FROZEN_CELLS
        assert (d / "report.md").exists() and r["dir"] == name
        assert cfg["interface"] == r["interface"] == table2.BY_NAME[name].interface
        assert cfg["rounds"] == (0 if frozen else 1) and r["trained"] is (not frozen)
        # A frozen cell trained nothing and played the frozen base with the adapters off.
        assert (d / "metrics.jsonl").exists() is (not frozen) and (d / "checkpoints").exists() is (not frozen)
        assert ev["trained"]["policy"] == ("frozen_base" if frozen else "trained") and ev["base"] is None
        assert traces and all(t["reference"] is frozen for t in traces)
        # Same evaluation seeds for every cell.
        seeds = seeds or ev["seeds"]
        assert ev["seeds"] == seeds == r["seeds"] == traj["seeds"].tolist() == [10000, 10001]
        # Team return: the per-episode values of eval.json, their mean, sample std and the pipeline's own CI.
        rets = [e["team_return"] for e in ev["trained"]["episodes"]]
        t = r["team_return"]
        assert t["values"] == rets and t["n"] == 2
        assert t["mean"] == pytest.approx(np.mean(rets), abs=1e-12)
        assert t["std"] == pytest.approx(np.std(rets, ddof=1), abs=1e-12)
        assert t["ci"] == ev["stats"]["trained"]["ci"]
        # Per agent: own successful deliver options (menu, compound JSON) or INTERACT at a serving cell (native).
        if r["interface"] == "native":
            assert "INTERACT next to a serving cell" in r["per_agent"]["rule"]  # the rule: tested on its own above
            assert np.sum(r["per_agent"]["per_episode"], axis=1).tolist() == rets  # every delivery credited
        else:
            own = _own_deliveries(traces, seeds, 2)
            assert r["per_agent"]["per_episode"] == own.tolist()
            assert r["per_agent"]["mean"] == own.mean(axis=0).tolist()
        # Mann–Whitney against each frozen cell, from the frozen cell's own eval.json.
        for f in table2.FROZEN_CELLS:
            test = r["mann_whitney"][f]
            if f == name:
                assert test is None
                continue
            other = [e["team_return"] for e in json.loads((out / f / "eval.json").read_text())["trained"]["episodes"]]
            want = sps.mannwhitneyu(rets, other, alternative="two-sided").pvalue
            assert test["p_value"] == pytest.approx(want) and test["x"] == name and test["y"] == f
        # †: the training return of every round of metrics.jsonl is 0.
        if frozen:
            assert r["dagger"] is None
        else:
            rounds = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            assert r["train_returns"] == [m["train/return_mean"] for m in rounds] and len(rounds) == 1
            assert r["dagger"] is all(m["train/return_mean"] == 0 for m in rounds)
        # §6.3: decisions are the trace lines, agent-steps the played steps of present agents.
        a = r["analysis"]
        played = (traj["actions"] >= 0).sum()  # overcooked: every agent is present at every step
        assert a["decisions"] == len(traces) and a["agent_steps"] == played == 2 * 4 * 2
        assert a["llm_call_ratio"] == pytest.approx(len(traces) / played)
        if r["interface"] == "native":  # one LLM call per agent per step (paper §6.3: call ratio 1.00)
            assert a["llm_call_ratio"] == 1.0
        counts = {}
        for tr in traces:
            counts[tr["option"]] = counts.get(tr["option"], 0) + 1
        top = max(counts, key=counts.get)
        assert a["top_action_share"] == pytest.approx(counts[top] / len(traces))
        assert counts[a["top_action"]] == counts[top]
        h = a["histogram"]
        assert h["options"][: len(traj["option_names"])] == traj["option_names"].tolist()
        for i in range(2):
            for j, o in enumerate(h["options"]):
                assert h["counts"][i][j] == sum(1 for tr in traces if tr["aid"] == i and tr["option"] == o)
        assert a["fire_clean_after_turn"] is None  # Cleanup native cells only
    assert s["cells"]["compound_json_magrpo"]["config_differences"]["max_new_tokens"] == [32, 8]
    md = (out / table2.SUMMARY_MD).read_text()
    assert "The compound-JSON cell's response budget differs: 32 new tokens against 8" in md
    for name in table2.CELL_NAMES:
        assert f"| `{name}` |" in md
    # The patterns, recomputed from the cells' numbers.
    means = {k: v["team_return"]["mean"] for k, v in s["cells"].items()}
    p = s["patterns"]
    assert p["full_best"]["holds"] is all(means["full"] > m for k, m in means.items() if k != "full")
    assert p["shared_below_per_agent"]["holds"] is (means["shared_lora_menu"] < means["full"])
    assert f"wrote {out / table2.SUMMARY_JSON}" in stdout


def test_grid_resume_skips_finished_cells(grid, tmp_path, capfd):
    out, _ = grid
    copy = tmp_path / "grid"
    shutil.copytree(out, copy)
    before = (copy / table2.SUMMARY_JSON).read_text()
    table2.main([*GRID_ARGS, "--out", str(copy), "--resume"])
    stdout = capfd.readouterr().out
    for c in table2.CELLS:
        assert f"== cell {c.name} ({c.row}): skip" in stdout
    assert (copy / table2.SUMMARY_JSON).read_text() == before
    # A cut cell (no report yet) is resumed, a removed one started, the others skipped; without --resume refused.
    (copy / "full" / "report.md").unlink()
    shutil.rmtree(copy / "frozen_native")
    args = table2.build_table2_parser().parse_args(GRID_ARGS)
    runs = {c.name: (c.name, copy / c.name, table2.cell_config(c, GAME, args)) for c in table2.CELLS}
    todo = table2.plan_runs(runs, resume=True, force=False, kind="cell")
    assert todo == {**{c: "skip" for c in table2.CELL_NAMES}, "full": "resume", "frozen_native": "start"}
    with pytest.raises(InputError, match="frozen_menu: run directory .* exists; pass --resume"):
        table2.plan_runs(runs, resume=False, force=False, kind="cell")
    # The summary covers the finished cells only and names the others.
    s = table2.summarize(copy, GAME, {k: v[2] for k, v in runs.items()})
    assert s["missing"] == ["frozen_native", "full"] and "full" not in s["cells"]
    assert s["patterns"]["full_best"]["holds"] is None
