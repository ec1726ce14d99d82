"""write_report on synthetic, well-formed run directories (and on incomplete ones)."""

import json

import numpy as np
import pytest

from jaxopt_marl import artifacts
from jaxopt_marl.report import write_report

H, W = 5, 6


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _decision(aid, opt, seed, step, outcome="success", parse_fail=False, rnd=-1, target=None, rollout=0):
    return {
        "round": rnd,
        "rollout": rollout,
        "seed": seed,
        "step": step,
        "aid": aid,
        "prompt": "...",
        "menu": ["A) clean_dirt", "B) eat_apple", "C) wait"],
        "response": "A",
        "response_source": "model",
        "choice": "A",
        "parse_fail": parse_fail,
        "option": opt,
        "target": target or ([1, 2] if opt != "wait" else None),
        "outcome": outcome,
    }


def _block(policy, returns, apples=None):
    eps = [
        {"seed": 10000 + k, "team_return": float(r), **({"agent_apples": apples[k]} if apples else {})}
        for k, r in enumerate(returns)
    ]
    return artifacts.EvalBlock(policy=policy, seeds=[10000 + k for k in range(len(returns))], episodes=eps)


def _make_run(tmp_path, game="cleanup", preset="cpu", apples=None, patch_id=None):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps(
            {
                "game": game,
                "preset": preset,
                "seed": 3,
                "model": "smollm2-135m",
                "K": 4,
                "rounds": 3,
                "episode_length": 4,
                "some_future_key": {"a": 1},
            }
        )
    )
    # rounds 0..2: team return 1.0 ± 0.5, 2.5 ± 0.25, 4.0 ± 1.0
    _write_jsonl(
        run / "metrics.jsonl",
        [
            {
                "round": r,
                "train/return_mean": m,
                "train/return_std": s,
                "train/parse_fail_rate": 0.1 * r,
                "train/kl": 0.01,
                "perf/decisions_per_s": 100.0,
                "perf/rollout_s": 10.0 + r,
                "perf/update_s": 20.5 + r,
            }
            for r, m, s in ((0, 1.0, 0.5), (1, 2.5, 0.25), (2, 4.0, 1.0))
        ],
    )
    # two evaluation episodes, team returns 3 and 5 -> 4.00 ± 1.41 (sample std); baseline 0 and 0
    artifacts.EvalRecord(
        game=game,
        seeds=[10000, 10001],
        trained=_block("trained", [3, 5], [[3, 0], [4, 1]]),
        base=_block("frozen_base", [0, 0]),
    ).save(run / "eval.json")
    # agent 0: 3 x clean_dirt, agent 1: 2 x eat_apple + 1 x wait (one parse failure)
    _write_jsonl(
        run / "decisions" / "eval.jsonl",
        [_decision(0, "clean_dirt", 10000, t) for t in range(3)]
        + [
            _decision(1, "eat_apple", 10000, 0),
            _decision(1, "eat_apple", 10000, 1),
            _decision(1, "wait", 10000, 2, parse_fail=True),
        ],
    )
    _write_jsonl(run / "decisions" / "round_0000.jsonl", [_decision(0, "wait", 0, 0, rnd=0)])
    # E = 2, T = 4, N = 2; agent 0 never moves, agent 1 moves every step
    pos = np.zeros((2, 4, 2, 2), np.int32)
    pos[:, :, 0] = [1, 1]
    pos[:, :, 1, 0] = 3
    pos[:, :, 1, 1] = np.arange(4)
    rew = np.zeros((2, 4, 2), np.float32)
    rew[0, :3, 0] = 1
    rew[1, :2, 0] = 1
    rew[1, 2, 0] = 2  # two apples in one step (one regrown under the agent, one entered)
    rew[1, 0, 1] = 1  # agent 0 apples 3, 4 (mean 3.50); agent 1: 0, 1 (mean 0.50)
    walls = np.pad(np.zeros((H - 2, W - 2), bool), 1, constant_values=True)
    opts = np.tile(np.array([[0, 2]], np.int32), (2, 4, 1))
    artifacts.EvalTrajectories(
        seeds=[10000, 10001],
        option_names=("clean_dirt", "eat_apple", "wait"),
        walls=walls,
        terrain=walls.astype(np.int8),
        patch_id=patch_id,
        trained=artifacts.PolicyTrajectories(
            positions=pos,
            rewards=rew,
            alive=np.ones((2, 4, 2), bool),
            options=opts,
            actions=np.zeros((2, 4, 2), np.int32),
            apples=apples,
        ),
    ).save(run / "eval_traj.npz")
    return run


def test_report_contains_expected_numbers_and_figures(tmp_path):
    run = _make_run(tmp_path)
    path = write_report(run)
    md = path.read_text()
    assert path == run / "report.md"
    # header and reduced-budget statement
    assert "**game**: cleanup" in md and "**model**: smollm2-135m" in md and "**seed**: 3" in md
    assert "Reduced budget" in md and "`cpu` preset" in md
    assert "some_future_key" in md  # unknown config keys are listed, not dropped
    # training table
    assert "| 0 | 1.00 ± 0.50 |" in md and "| 2 | 4.00 ± 1.00 |" in md
    assert "Best round: 2 with 4.00 ± 1.00" in md
    # evaluation: baseline vs trained, sample std of (3, 5) = 1.41
    assert "| team_return | 0.00 ± 0.00 | 4.00 ± 1.41 | 2 / 2 |" in md
    assert "seeds: 10000, 10001" in md
    assert "| a0 | 3.50 ± 0.71 |" in md  # per-agent returns from eval.json
    # option histogram from decisions/eval.jsonl (not the round file)
    assert "decisions/eval.jsonl`, 6 decisions" in md
    assert "| a0 | 3 | 100.0% | 0.0% | 0.0% |" in md
    assert "| a1 | 3 | 0.0% | 66.7% | 33.3% |" in md
    assert "1 × clean" in md and "1 × eat" in md
    # trajectories: agent 0 stationary 1.000, agent 1 0.000; waiting fraction from the running options (agent 1 always wait)
    assert "| a0 | 1.000 | 3.50 ± 0.71 | 0.000 | clean |" in md
    assert "| a1 | 0.000 | 0.50 ± 0.71 | 1.000 | idle |" in md
    # spec §4: team returns 3 and 5 over 4 steps -> efficiency 0.75 and 1.25
    assert "| efficiency | 1.000 ± 0.354 |" in md
    for name in ("training_curve", "option_histogram", "visit_heatmaps", "per_agent"):
        f = run / "figures" / f"{name}.png"
        assert f.exists() and f.stat().st_size > 1000, name
        assert f"figures/{name}.png" in md
    assert "No `episode.gif`" in md and "`episode.gif` missing" in md
    (run / "episode.gif").write_bytes(b"GIF89a")
    assert "![episode](episode.gif)" in write_report(run).read_text()


def test_report_harvest_patch_survival(tmp_path):
    pid = np.full((H, W), -1, np.int32)
    pid[1, 1:3] = 0
    pid[3, 3:5] = 1
    apples = np.zeros((2, 4, H, W), bool)
    apples[:, :2, 1, 1] = True  # patch 0 dies at step 2 in both episodes
    apples[0, :, 3, 4] = True  # patch 1 survives in episode 0 only (dies at step 0 in episode 1)
    run = _make_run(tmp_path, game="harvest", preset="paper", apples=apples, patch_id=pid)
    md = write_report(run).read_text()
    assert "Reduced budget" not in md
    # final alive patches (1, 0) -> 0.50 ± 0.71; extinct 3 of 4 at steps 2, 2, 0 -> mean 1.3
    assert "0.50 ± 0.71 over 2 episode(s)" in md
    assert "Extinct patches: 3 of 4" in md and "mean extinction step 1.3" in md
    assert (run / "figures" / "patch_survival.png").exists()


def test_report_overcooked_deliveries(tmp_path):
    run = _make_run(tmp_path, game="overcooked_aa")
    recs = [
        _decision(0, "deliver", 10000, 5),
        _decision(0, "deliver", 10001, 5),
        _decision(1, "deliver", 10001, 9),
        _decision(1, "deliver", 10001, 12, outcome="effect_fail"),
    ]
    _write_jsonl(run / "decisions" / "eval.jsonl", recs)
    md = write_report(run).read_text()
    # The team return already counts deliveries (rollout.team_return): labelled so, never divided by 20.
    assert "(deliveries)" in md and "deliveries × 20" not in md and "| deliveries |" not in md
    assert "deliveries / episode (decisions)" in md
    assert "| a0 | 1.000 | 1.00 |" in md and "| a1 | 0.000 | 0.50 |" in md  # 2 and 1 over 2 episodes


def test_report_empty_run_dir_does_not_crash(tmp_path):
    md = write_report(tmp_path).read_text()
    for name in ("config.json", "metrics.jsonl", "eval.json", "eval_traj.npz", "decisions/eval.jsonl", "episode.gif"):
        assert f"`{name}`" in md
    assert "not recorded" in md
    assert "`eval.json` is missing" in md


def test_report_partial_and_malformed_files(tmp_path):
    run = _make_run(tmp_path)
    (run / "eval_traj.npz").write_bytes(b"not a zip")
    (run / "decisions" / "eval.jsonl").unlink()
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write("{truncated\n")
    # A summary without episodes (the earlier layout) is no longer read: named, never guessed at.
    (run / "eval.json").write_text(json.dumps({"summary": {"team_return": {"mean": 7.0, "std": 2.0}}}))
    md = write_report(run).read_text()
    assert "`eval_traj.npz` unreadable" in md
    assert "decisions/round_0000.jsonl (no evaluation decisions)" in md  # falls back to the latest round
    assert "| 2 | 4.00 ± 1.00 |" in md
    assert "`eval.json` unreadable" in md and "lacks 'game'" in md and "7.00" not in md


def test_missing_run_dir_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path / "nope")


def test_report_harvest_final_patches_from_eval_json(tmp_path):
    # No live-apple grids in eval_traj.npz: the final count comes from eval.json's final_patches_alive.
    pid = np.full((H, W), -1, np.int32)
    pid[1, 1:3] = 0
    run = _make_run(tmp_path, game="harvest", patch_id=pid)
    ev = artifacts.EvalRecord.load(run / "eval.json")
    for ep, k in zip(ev.trained.episodes, (2, 3)):
        ep["final_patches_alive"] = k
    ev.save(run / "eval.json")
    md = write_report(run).read_text()
    assert "`final_patches_alive` per episode in `eval.json`; no grids over time were recorded): 2.50 ± 0.71" in md
    assert not (run / "figures" / "patch_survival.png").exists()


def _solo(team, own, full, seeds=(10000, 10001, 10002), units="deliveries"):
    return {
        "seeds": list(seeds),
        "units": units,
        "agents": [{"agent": i, "solo_team_return": t, "own_return": o} for i, (t, o) in enumerate(zip(team, own))],
        "full_team": {"returns": full},
    }


def test_report_solo_test_section(tmp_path):
    run = _make_run(tmp_path, game="overcooked_fc")
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, "solo_episodes": 2}))
    # solo.json expected but missing: named under "Missing inputs" and in the section
    md = write_report(run).read_text()
    assert "### Solo test" in md and "`solo.json` missing (config `solo_episodes` = 2)" in md
    # FC-like: every agent alone delivers 0 while the team delivers 3, 5 and 4 -> needs a partner
    (run / "solo.json").write_text(json.dumps(_solo([[0, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]], [3.0, 5.0, 4.0])))
    md = write_report(run).read_text()
    sec = md[md.index("### Solo test") : md.index("## Episode")]
    assert "| a0 | 0.00 ± 0.00 | 0.00 ± 0.00 | 0% of the team's |" in sec
    assert "Full team on the same seeds: 4.00 ± 1.00 deliveries." in sec
    assert "Needs a partner" in sec and "(10000, 10001, 10002)" in sec
    assert "a verdict needs at least 3 seeds on which the full team scored" in sec and "Here: 3 of 3 seed(s)." in sec
    assert "solo.json" not in md[md.index("## Missing inputs") :]
    # AA-like: agents deliver 4 and 2 alone -> solo-solvable
    (run / "solo.json").write_text(json.dumps(_solo([[4, 4, 4], [1, 3, 2]], [[4, 4, 4], [1, 3, 2]], [6.0, 6.0, 6.0])))
    sec = write_report(run).read_text().split("### Solo test")[1]
    assert "| a0 | 4.00 ± 0.00 | 4.00 ± 0.00 | 67% of the team's |" in sec
    assert "| a1 | 2.00 ± 1.00 | 2.00 ± 1.00 | 33% of the team's |" in sec
    assert "Solo-solvable: a0, a1 score alone" in sec
    # the team itself scores 0: not informative
    (run / "solo.json").write_text(json.dumps(_solo([[0, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]], [0.0, 0.0, 0.0])))
    sec = write_report(run).read_text().split("### Solo test")[1]
    assert "n/a (team scores 0)" in sec and "Not informative: the full team scored on 0 of the 3 seed(s)" in sec
    # One seed where the team scored and nobody alone did (issue 14: one 30-step seed): not informative either,
    # and no "needs a partner"; the same with two scoring seeds of three.
    (run / "solo.json").write_text(json.dumps(_solo([[0], [0]], [[0], [0]], [2.0], seeds=(10000,))))
    sec = write_report(run).read_text().split("### Solo test")[1]
    assert "Not informative: the full team scored on 1 of the 1 seed(s), fewer than the 3" in sec
    assert "Needs a partner" not in sec and "Solo-solvable" not in sec
    (run / "solo.json").write_text(json.dumps(_solo([[0, 1, 0], [0, 0, 0]], [[0, 1, 0], [0, 0, 0]], [2.0, 0.0, 1.0])))
    sec = write_report(run).read_text().split("### Solo test")[1]
    assert "Not informative: the full team scored on 2 of the 3 seed(s)" in sec
    # malformed: reported, never a crash
    (run / "solo.json").write_text(json.dumps({"agents": "nope"}))
    assert "`solo.json` is malformed" in write_report(run).read_text()


def test_report_solo_not_expected_and_checkpoint_rule(tmp_path):
    run = _make_run(tmp_path)  # config without solo_episodes: no solo test expected
    ev = json.loads((run / "eval.json").read_text())
    ev.update(
        checkpoint_rule="highest training-time team return (paper §6.1)",
        checkpoint_round=2,
        checkpoint_train_return=4.0,
    )
    (run / "eval.json").write_text(json.dumps(ev))
    md = write_report(run).read_text()
    assert "Not run (config `solo_episodes` = 0)." in md
    assert "solo.json" not in md[md.index("## Missing inputs") :]
    assert (
        "Adapters: highest training-time team return (paper §6.1); round 2 (its mean training team return 4.00)." in md
    )
    assert "| team_return | 0.00 ± 0.00 | 4.00 ± 1.41 | 2 / 2 |" in md  # the base block is read as the baseline


def test_report_statistics_section(tmp_path):
    from jaxopt_marl import stats

    run = _make_run(tmp_path)
    ev = json.loads((run / "eval.json").read_text())
    # trained 3, 5 (mean 4.00, sample std 1.41, percentile bootstrap CI [3, 5]); base 0, 0 (CI [0, 0]);
    # U = 4 of 4 (every trained episode beats every base episode).
    ev["stats"] = stats.eval_stats([3.0, 5.0], [0.0, 0.0], seeds=[10000, 10001], units="apples")
    (run / "eval.json").write_text(json.dumps(ev))
    md = write_report(run).read_text()
    assert "### Statistics (paper §6.1)" in md
    assert "| trained | 2 | 4.00 ± 1.41 | [3.00, 5.00] |" in md
    assert "| frozen_base | 2 | 0.00 ± 0.00 | [0.00, 0.00] |" in md
    assert "95% percentile bootstrap CI of the mean (10,000 resamples, seed 0)" in md
    mw = ev["stats"]["mann_whitney"]
    assert (
        f"Mann–Whitney U (two-sided, trained vs frozen_base, scipy method `asymptotic with continuity "
        f"correction`): U = 4.0 of 4 (trained ahead in 100.0% of episode pairs, ties counting half), "
        f"p = {mw['p_value']:.3g}."
    ) in md
    assert "- Only 2 episode(s) per policy" in md
    # No base: the table has one row and the report says why there is no test.
    ev["stats"] = stats.eval_stats([3.0, 5.0], None)
    (run / "eval.json").write_text(json.dumps(ev))
    md = write_report(run).read_text()
    assert "| trained | 2 | 4.00 ± 1.41 | [3.00, 5.00] |" in md and "No Mann–Whitney test" in md


def test_report_without_statistics_says_so(tmp_path):
    md = write_report(_make_run(tmp_path)).read_text()
    assert "`eval.json` has no `stats` block" in md


def test_trained_vs_base_rows_give_ci_p_and_noise_verdict(tmp_path):
    from jaxopt_marl import report, stats

    run = _make_run(tmp_path)
    # Issue 14: 3.50 ± 4.95 against 1.00 ± 1.41 over 2 episodes is noise, and the report says so.
    artifacts.EvalRecord(
        game="cleanup", seeds=[10000, 10001], trained=_block("trained", [0, 7]), base=_block("frozen_base", [0, 2])
    ).save(run / "eval.json")
    md = write_report(run).read_text()
    p = stats.mann_whitney([0, 7], [0, 2])["p_value"]
    assert (
        f"| team_return | 1.00 ± 1.41 | 3.50 ± 4.95 | 2 / 2 | [0.00, 2.00] | [0.00, 7.00] | {p:.3g} | "
        "not distinguishable from noise |"
    ) in md
    # Six episodes each, CIs apart: the verdict names the direction; overlapping CIs stay noise.
    c = report.compare([5, 6, 5, 6, 5, 6], [0, 1, 0, 1, 0, 1])
    assert c["verdict"] == "trained higher" and c["trained"]["ci"][0] > c["base"]["ci"][1]
    assert report.compare([0, 1, 0, 1, 0, 1], [5, 6, 5, 6, 5, 6])["verdict"] == "trained lower"
    assert report.compare([0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6])["verdict"] == report.NOISE
    # Four episodes each (< stats.MIN_EPISODES): noise even with disjoint CIs.
    assert report.compare([5, 6, 5, 6], [0, 1, 0, 1])["verdict"] == report.NOISE
    # One episode each: no CI, noise; undefined (NaN) episodes are dropped first.
    assert report.compare([3.0], [1.0])["verdict"] == report.NOISE
    assert report.compare([np.nan, 5, 6, 5, 6, 5, 6], [0, 1, 0, 1, 0, 1])["trained"]["n"] == 6


def test_report_gives_the_run_folder_size(tmp_path):
    """One line: every byte under the run folder when the report is written (10^6-byte MB), with the checkpoint
    folders' share."""
    (tmp_path / "checkpoints" / "1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "1" / "a").write_bytes(b"x" * 1_500_000)
    (tmp_path / "best" / "0").mkdir(parents=True)
    (tmp_path / "best" / "0" / "a").write_bytes(b"x" * 300_000)
    (tmp_path / "burnin.bin").write_bytes(b"x" * 100_000)
    md = write_report(tmp_path).read_text()
    line = [x for x in md.splitlines() if x.startswith("**Run folder size**")]
    assert line == [
        "**Run folder size**: 1.9 MB on disk (`checkpoints/` 1.5 MB, `best/` 0.3 MB) when this report was written."
    ]
