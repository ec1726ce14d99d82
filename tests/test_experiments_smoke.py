"""``python -m experiments.overcooked --layout aa --preset smoke --model tiny-random`` end to end as a subprocess
(every file of the run directory), and bad input failing before any compute with a message naming it."""

import json
import shutil

import numpy as np
import pytest

from experiments import common
from jaxopt_marl import burnin, config, preflight
from tests.conftest import run_cli

# config.json keys written before RunConfig held its update hyper-parameters in a MAGRPOConfig.
OLD_CONFIG_KEYS = (
    "game",
    "preset",
    "seed",
    "model",
    "episode_steps",
    "rounds",
    "num_rollouts",
    "temperature",
    "lora_rank",
    "learning_rate",
    "kl_beta",
    "clip_eps",
    "epochs",
    "max_grad_norm",
    "micro_batch",
    "mode",
    "max_new_tokens",
    "shared_adapter",
    "burnin_episodes",
    "burnin_steps",
    "eval_episodes",
    "eval_base",
    "skip_zero_advantage",
    "eval_checkpoint",
    "solo_episodes",
    "reduced_budget",
    "num_agents",
    "eval_seed0",
)
RUN_FILES = (
    "config.json",
    "burnin/records.parquet",
    "burnin/burnin.json",
    "guards.jsonl",
    "metrics.jsonl",
    "decisions/round_0000.jsonl",
    "decisions/round_0001.jsonl",
    "decisions/eval.jsonl",
    "decisions/eval_base.jsonl",
    "eval.json",
    "solo.json",
    "eval_traj.npz",
    "episode.gif",
    "report.md",
)


def _cli(*args, timeout=900):
    return run_cli(*args, timeout=timeout)


def test_smoke_run_writes_every_file(smoke_run):
    out, stdout = smoke_run
    for f in RUN_FILES:
        assert (out / f).exists(), f
    assert (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir())
    assert (out / "best").is_dir() and any(d.name.isdigit() for d in (out / "best").iterdir())
    for f in ("best/", "solo.json"):
        assert f"wrote {out / f}" in stdout
    assert "REDUCED BUDGET" in stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["game"] == "overcooked_aa" and cfg["preset"] == "smoke" and cfg["reduced_budget"]
    # One flat object: the run's fields and the update's (RunConfig.magrpo) side by side, as before the nesting.
    assert set(OLD_CONFIG_KEYS) <= set(cfg) and "magrpo" not in cfg
    assert (cfg["num_rollouts"], cfg["learning_rate"], cfg["micro_batch"], cfg["lora_rank"]) == (2, 1e-2, 8, 2)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in metrics] == [0, 1]
    ev = json.loads((out / "eval.json").read_text())
    assert ev["seeds"] == [10000, 10001]
    assert len(ev["trained"]["episodes"]) == 2 and ev["base"]["policy"] == "frozen_base"
    assert {"team_return", "efficiency", "equality", "peace"} <= set(ev["trained"]["episodes"][0])
    # Paper §6.1 checkpoint rule: the adapters of the round with the highest mean training team return.
    assert ev["checkpoint_rule"] == "highest training-time team return (paper §6.1)"
    assert ev["eval_checkpoint"] == "best"
    best = max(metrics, key=lambda m: (m["train/return_mean"], -m["round"]))  # ties: the earliest round
    assert ev["checkpoint_round"] == best["round"] and ev["checkpoint_train_return"] == best["train/return_mean"]
    # Paper §6.4 solo test on 1 seed (smoke preset), the full team's return reused from the evaluation.
    solo = json.loads((out / "solo.json").read_text())
    assert solo["seeds"] == [10000] and solo["units"] == "deliveries" and len(solo["agents"]) == 2
    assert solo["full_team"]["returns"] == [ev["trained"]["episodes"][0]["team_return"]]
    assert {"solo_team_return", "own_return"} <= set(solo["agents"][0])
    traj = np.load(out / "eval_traj.npz")
    assert traj["positions"].shape == (2, 12, 2, 2) and traj["positions"].dtype == np.int32
    assert traj["rewards"].shape == (2, 12, 2) and traj["alive"].dtype == bool
    assert traj["options"].shape == (2, 12, 2) and "base_positions" in traj
    # Paper §6.1 statistics from the per-episode team returns of both policies on the same seeds.
    st = ev["stats"]
    assert st["seeds"] == ev["seeds"] and st["units"] == "deliveries" and st["n_resamples"] == 10_000
    for block, key in ((ev["trained"], "trained"), (ev["base"], "base")):
        assert st[key]["values"] == [e["team_return"] for e in block["episodes"]]
        assert st[key]["policy"] == block["policy"] and st[key]["n"] == 2
    assert st["mann_whitney"]["alternative"] == "two-sided" and 0.0 <= st["mann_whitney"]["p_value"] <= 1.0
    report = (out / "report.md").read_text()
    assert "Reduced budget" in report and "### Solo test" in report
    assert "**Run folder size**: " in report and "(`checkpoints/` " in report
    assert (out / "checkpoints" / "2" / "checksums.json").exists()
    assert all((d / "checksums.json").exists() for d in (out / "best").iterdir() if d.name.isdigit())
    # best/ is only evaluated: adapters without the optimizer state. Every checkpoint's meta holds the LoRA config.
    best_steps = [d for d in (out / "best").iterdir() if d.name.isdigit()]
    assert best_steps and not any((d / "opt_state").exists() for d in best_steps)
    for step in [out / "checkpoints" / "2", *best_steps]:
        texts = [f.read_text() for f in (step / "meta").rglob("*") if f.is_file()]
        metas = [json.loads(t) for t in texts if t.startswith("{")]  # orbax also leaves a plain-text commit marker
        assert any(m.get("lora", {}).get("rank") == 2 and m["lora"]["alpha"] == 4.0 for m in metas), step
    assert (cfg["lora_alpha"], cfg["min_support"]) == (4.0, 5)
    # burnin.json: the layout experiments.burnin writes too (jaxopt_marl.burnin.BurninSummary).
    bs = burnin.BurninSummary.load(out / "burnin" / "burnin.json")
    assert (bs.game, bs.episodes, bs.solo_episodes, bs.joint_episodes, bs.steps, bs.min_support) == (
        "overcooked_aa",
        16,
        8,
        8,
        12,
        5,
    )
    guard_lines = [x for x in (out / "guards.jsonl").read_text().splitlines() if x.strip()]
    assert sum(bs.guards_per_option.values()) == bs.guards == len(guard_lines)
    assert "### Statistics (paper §6.1)" in report and "Mann–Whitney U (two-sided, trained vs frozen_base" in report


def test_existing_run_dir_is_never_overwritten(smoke_run):
    out, _ = smoke_run
    with pytest.raises(SystemExit, match="exists; pass --resume"):
        common.main(None, ["--layout", "aa", "--preset", "smoke", "--model", "tiny-random", "--out", str(out)])
    assert (out / "eval.json").exists()


def test_corrupt_checkpoint_on_resume(smoke_run, tmp_path):
    out, _ = smoke_run
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    steps = sorted((d for d in (bad / "checkpoints").iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
    assert [d.name for d in steps] == ["1", "2"]  # --keep-checkpoints 2 (the default) of 2 rounds
    last = steps[-1]
    meta = [f for f in (last / "meta").rglob("*") if f.is_file()]
    for f in meta:
        f.write_text("{not json")
    # The newest checkpoint is corrupt: named (round and file), and the check falls back to the previous one.
    said = []
    assert preflight.check_checkpoint(bad, warn=said.append) == 1
    assert len(said) == 1 and said[0].startswith("checkpoint 2 (after round 1) is corrupt: ")
    assert any(f"is corrupt: {f} is " in said[0] for f in meta)  # truncated: "{not json" is shorter
    assert said[0].endswith("; trying checkpoint 1")
    # Every checkpoint corrupt: one error line naming each, before any compute.
    big = max((f for f in (steps[0] / "adapters").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    with big.open("r+b") as fh:
        fh.truncate(1)
    with pytest.raises(
        SystemExit,
        match=f"checkpoint .*{last.name} is corrupt.*checkpoint .*1 is corrupt: {big} "
        f"is truncated.*no intact checkpoint",
    ):
        common.main(
            None, ["--layout", "aa", "--preset", "smoke", "--model", "tiny-random", "--out", str(bad), "--resume"]
        )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--layout", "aa", "--preset", "huge"], "unknown preset 'huge'"),
        (["--layout", "xx", "--preset", "smoke"], "unknown layout 'xx'"),
        (["--layout", "aa", "--preset", "smoke", "--model", "/nonexistent/model"], "/nonexistent/model does not exist"),
        (["--layout", "aa", "--preset", "smoke", "--mode", "beam"], "unknown scoring mode 'beam'"),
        (["--layout", "aa", "--preset", "smoke", "--eval-checkpoint", "last"], "unknown eval checkpoint 'last'"),
        (["--layout", "aa", "--preset", "smoke", "--solo-episodes", "3"], "solo_episodes must be in 0..eval_episodes"),
        (["--layout", "aa", "--preset", "smoke", "--keep-checkpoints", "0"], "--keep-checkpoints must be >= 1, got 0"),
    ],
)
def test_bad_input_fails_before_compute(argv, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        common.main(None, argv + ["--out", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()


def test_model_dir_without_weights(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="has no weights"):
        common.main("cleanup", ["--preset", "smoke", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "r")])
    with pytest.raises(ValueError, match="unknown game 'chess'"):
        config.RunConfig.from_preset("smoke", "chess")
    with pytest.raises(SystemExit, match="--resume: run directory"):
        common.main(
            "cleanup", ["--preset", "smoke", "--model", "tiny-random", "--out", str(tmp_path / "no"), "--resume"]
        )


def test_presets_follow_the_paper():
    p = config.RunConfig.paper("cleanup")
    pm = p.magrpo
    assert (p.lora_rank, pm.learning_rate, pm.num_rollouts, pm.temperature, p.episode_steps) == (32, 5e-5, 4, 0.7, 150)
    o = config.RunConfig.paper("overcooked_fc")
    om = o.magrpo
    assert (o.lora_rank, om.learning_rate, om.num_rollouts, om.temperature, om.kl_beta, o.episode_steps) == (
        16,
        2e-5,
        6,
        0.9,
        0.05,
        400,
    )
    assert (pm.clip_eps, pm.epochs, pm.max_grad_norm, p.eval_episodes) == (0.2, 2, 1.0, 20)
    assert (pm.kl_beta, pm.micro_batch, pm.shared_adapter) == (0.05, 8, False)
    assert config.RunConfig.paper("harvest").episode_steps == 400
    c = config.RunConfig.cpu("cleanup")
    assert c.reduced_budget and c.mode == "choice_only" and not p.reduced_budget
    # checkpoint rule (§6.1) and solo test (§6.4)
    assert p.eval_checkpoint == o.eval_checkpoint == c.eval_checkpoint == "best"
    assert (p.solo_episodes, o.solo_episodes, config.RunConfig.paper("harvest").solo_episodes) == (3, 5, 3)
    assert c.solo_episodes == config.RunConfig.smoke("overcooked_aa").solo_episodes == 1
    assert config.RunConfig.paper("overcooked_aa", eval_episodes=3).solo_episodes == 3  # capped by the evaluation
    args = common.build_parser("x", layout=True).parse_args(
        ["--preset", "paper", "--eval-checkpoint", "final", "--solo-episodes", "0"]
    )
    cfg = common.config_from_args("overcooked_fc", args)
    assert (cfg.eval_checkpoint, cfg.solo_episodes) == ("final", 0)
    # The update's hyper-parameters by their flat (config.json) names: presets, --rollouts, replace().
    cm, sm = c.magrpo, config.RunConfig.smoke("cleanup").magrpo
    assert (cm.num_rollouts, cm.epochs, cm.learning_rate, sm.learning_rate, sm.num_rollouts) == (2, 1, 5e-5, 1e-2, 2)
    args = common.build_parser("x").parse_args(["--preset", "cpu", "--rollouts", "3"])
    assert common.config_from_args("harvest", args).magrpo.num_rollouts == 3
    r = p.replace(kl_beta=0.1, shared_adapter=True, rounds=7)
    assert (r.magrpo.kl_beta, r.magrpo.shared_adapter, r.rounds, r.magrpo.num_rollouts) == (0.1, True, 7, 4)
    args = common.build_parser("x").parse_args(["--preset", "cpu", "--rollouts", "0"])
    with pytest.raises(SystemExit, match="num_rollouts must be >= 1, got 0"):
        common.config_from_args("harvest", args)
    with pytest.raises(ValueError, match="clip_eps must be in"):
        p.replace(clip_eps=1.5)
    # Zero advantage is exactly zero update in every preset (no update in rounds without return spread).
    assert all(config.RunConfig.from_preset(pr, g).skip_zero_advantage for pr in config.PRESETS for g in config.GAMES)


def test_resume_reads_old_flat_config(tmp_path):
    # A run directory written before RunConfig nested its MAGRPOConfig (flat keys, no optimizer extras).
    run = tmp_path / "old"
    run.mkdir()
    # The values such a run of the same flags wrote (the resume check compares every key the old file has).
    flat = config.RunConfig.cpu("cleanup").flat_dict()
    old = {k: flat.get(k) for k in OLD_CONFIG_KEYS}
    (run / "config.json").write_text(json.dumps(old))
    assert preflight.prepare_run_dir(config.RunConfig.cpu("cleanup"), run, resume=True, force=False) is None
    with pytest.raises(SystemExit, match="is a cleanup run, not harvest"):
        preflight.prepare_run_dir(config.RunConfig.cpu("harvest"), run, resume=True, force=False)
    # The layout written now keeps every old key, flat.
    flat = config.RunConfig.cpu("cleanup").flat_dict()
    assert set(OLD_CONFIG_KEYS) - {"reduced_budget", "num_agents", "eval_seed0"} <= set(flat)
    assert (flat["num_rollouts"], flat["epochs"], flat["micro_batch"], flat["lora_rank"]) == (2, 1, 8, 32)


def _run_dir_with_config(tmp_path, cfg):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({**cfg.flat_dict(), "reduced_budget": cfg.reduced_budget}))
    return run


def test_resume_with_differing_flags_fails_naming_them(tmp_path):
    cfg = config.RunConfig.smoke("overcooked_aa", model="tiny-random")
    run = _run_dir_with_config(tmp_path, cfg)
    # The same flags, and the keys that may change on --resume (rounds to extend a run; evaluation-only keys).
    assert preflight.prepare_run_dir(cfg, run, resume=True, force=False) is None
    more = cfg.replace(rounds=5, eval_episodes=3, eval_base=False, eval_checkpoint="final", solo_episodes=0)
    assert preflight.prepare_run_dir(more, run, resume=True, force=False) is None
    assert set(config.RESUME_MAY_DIFFER) == {"rounds", "eval_episodes", "eval_base", "eval_checkpoint", "solo_episodes"}
    # Anything else fails before any compute, naming each key with both values.
    bad = cfg.replace(episode_steps=30, mode="choice_only", learning_rate=0.5, rounds=9)
    with pytest.raises(
        SystemExit,
        match=r"in 3 key\(s\): episode_steps: 12 in config.json, 30 given; mode: "
        r'"sample" in config.json, "choice_only" given; learning_rate: 0.01 in '
        r"config.json, 0.5 given\.",
    ):
        preflight.prepare_run_dir(bad, run, resume=True, force=False)
    with pytest.raises(SystemExit, match=r'model: "tiny-random" in config.json, null given'):
        preflight.prepare_run_dir(cfg.replace(model=None), run, resume=True, force=False)
    (run / "config.json").write_text("{not json")
    with pytest.raises(SystemExit, match="config.json is unreadable"):
        preflight.prepare_run_dir(cfg, run, resume=True, force=False)


def test_resume_mismatch_exits_with_status_2(tmp_path):
    run = _run_dir_with_config(tmp_path, config.RunConfig.smoke("overcooked_aa", model="tiny-random", seed=1))
    p = _cli(
        "experiments.overcooked",
        "--layout",
        "aa",
        "--preset",
        "smoke",
        "--model",
        "tiny-random",
        "--out",
        str(run),
        "--resume",
        timeout=300,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    assert "error: --resume: the flags differ" in p.stderr and "seed: 1 in config.json, 0 given" in p.stderr
    assert not (run / "burnin").exists()
