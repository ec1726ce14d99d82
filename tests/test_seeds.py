"""Training seeds (paper §6.1, Table 1): the four seed channels (:mod:`jaxopt_marl.seeding`), the option-library
registry and ``--library``, and ``python -m experiments.seeds`` end to end (2 seeds of the smoke preset on the
tiny model, the background job of tests/seeds_job.py), its ``--resume`` and its bad input."""

import json
import shutil

import jax
import numpy as np
import pytest

from experiments import common, seeds, split
from experiments.cli import InputError
from jaxopt_marl import menus, options, seeding, trainer
from jaxopt_marl.config import RunConfig
from tests import seeds_job
from tests.seeds_job import SEEDS_ARGS


def test_channels_differ_between_seeds_and_reproduce():
    a, b, a2 = seeding.channel_values(0), seeding.channel_values(1), seeding.channel_values(0)
    assert set(a) == set(seeding.CHANNELS)
    for ch in seeding.CHANNELS:
        assert not np.array_equal(a[ch], b[ch]), ch
        assert np.array_equal(a[ch], a2[ch]), ch
    # Round 3 of seed 0 differs from round 0 in both per-round channels.
    r3 = seeding.channel_values(0, round_idx=3)
    assert not np.array_equal(r3["rollout"], a["rollout"]) and not np.array_equal(r3["minibatch"], a["minibatch"])


def test_channels_keep_the_existing_derivations():
    """The runs' draws are those of before the channels were named: existing run directories are unchanged."""
    for s, r in ((0, 0), (7, 5)):
        k_roll, k_upd = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(s), r))
        assert np.array_equal(seeding.rollout_key(s, r), k_roll)
        assert np.array_equal(seeding.minibatch_key(s, r), k_upd)
        assert np.array_equal(trainer.round_key(s, r), jax.random.fold_in(jax.random.PRNGKey(s), r))
        assert seeding.lora_init_seed(s) == s and seeding.interface_seed(s) == s
        assert np.array_equal(menus.decision_key(seeding.interface_seed(s), 2, 1, 4), menus.decision_key(s, 2, 1, 4))
    assert np.array_equal(seeding.library_key(3), jax.random.fold_in(jax.random.PRNGKey(3), seeding.LIBRARY_FOLD))
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got -1"):
        seeding.library_key(-1)


def test_library_registry_and_draw(monkeypatch):
    for g in options.GAMES:
        names = options.library_names(g)
        assert names == ("canonical", "compact", "detailed")  # jaxopt_marl.options.variants
        drawn = [options.draw_library(g, s) for s in range(20)]
        assert set(drawn) == set(names)
        assert drawn == [names[int(jax.random.randint(seeding.library_key(s), (), 0, 3))] for s in range(20)]
    # A second variant is one entry; auto then draws both over seeds, reproducibly, from the interface channel.
    monkeypatch.setitem(options.LIBRARIES, "cleanup", {"canonical": {}, "variant_x": {}})
    drawn = [options.draw_library("cleanup", s) for s in range(20)]
    assert set(drawn) == {"canonical", "variant_x"}
    assert drawn == [options.draw_library("cleanup", s) for s in range(20)]
    want = [("canonical", "variant_x")[int(jax.random.randint(seeding.library_key(s), (), 0, 2))] for s in range(20)]
    assert drawn == want
    assert options.resolve_library("cleanup", "variant_x", 0) == "variant_x"
    with pytest.raises(
        ValueError, match="unknown option library 'nope' for cleanup; valid: auto, canonical, variant_x"
    ):
        options.resolve_library("cleanup", "nope", 0)


def test_library_flag_is_recorded_and_checked():
    ap = common.build_parser("x")
    cfg = common.config_from_args("harvest", ap.parse_args(["--preset", "smoke", "--seed", "4"]))
    drawn = options.draw_library("harvest", 4)
    assert cfg.library == drawn and cfg.flat_dict()["library"] == drawn
    cfg = common.config_from_args("harvest", ap.parse_args(["--preset", "smoke", "--library", "detailed"]))
    assert cfg.library == "detailed"
    with pytest.raises(InputError, match="--library: unknown option library 'terse' for harvest"):
        common.config_from_args("harvest", ap.parse_args(["--preset", "smoke", "--library", "terse"]))
    with pytest.raises(ValueError, match="unknown option library 'auto'"):
        RunConfig.smoke("harvest", library="auto")  # the config holds a drawn name, never auto


def test_share_and_refusal():
    assert seeds.share([0, 1, 2, 3], 2, 0) == [0, 1] and seeds.share([0, 1, 2, 3], 2, 1) == [2, 3]
    assert seeds.share([5, 6, 7], 1, 0) == [5, 6, 7]
    with pytest.raises(ValueError, match="--seeds 3 does not split over 2 processes"):
        seeds.share([0, 1, 2], 2, 0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--game", "pong"], "unknown game 'pong'"),
        (["--game", "harvest", "--seeds", "0"], "--seeds must be >= 1, got 0"),
        (
            ["--game", "harvest", "--seeds", "3", "--preset", "smoke", "--num-processes", "2", "--process-id", "0"]
            + ["--coordinator", "127.0.0.1:1"],
            "--seeds 3 does not split over 2 processes",
        ),
        (["--game", "harvest", "--library", "terse", "--preset", "smoke"], "unknown option library 'terse'"),
        (
            ["--game", "harvest", "--preset", "smoke", "--distributed-timeout", "-5"],
            "--distributed-timeout must be a finite number of seconds >= 1, got -5",
        ),
        (
            ["--game", "harvest", "--preset", "smoke", "--distributed-timeout", "inf"],
            "argument --distributed-timeout: invalid int value: 'inf'",
        ),
    ],
)
def test_bad_input_exits_2(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        seeds.cli([*argv, "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "o").exists()


def _barrier(*args, **kw):
    split.barrier(*args, tool="experiments.seeds", what="seeds", **kw)


def test_barrier_files(tmp_path):
    split.mark(tmp_path, 0, [0], None)
    split.mark(tmp_path, 1, [1], None)
    _barrier(tmp_path, 2, timeout=1)
    split.mark(tmp_path, 1, [1], "RuntimeError: boom")
    with pytest.raises(RuntimeError, match=r"process 1 \(seeds \[1\]\) failed: RuntimeError: boom"):
        _barrier(tmp_path, 2, timeout=1)
    with pytest.raises(RuntimeError, match=r"processes \[2\] did not finish"):
        _barrier(tmp_path, 3, timeout=0)


@pytest.fixture(scope="module")
def seeds_run():
    return seeds_job.result()


@pytest.mark.background("seeds")
def test_seeds_summary_matches_the_runs(seeds_run):
    out, stdout = seeds_run
    s = json.loads((out / "seeds.json").read_text())
    assert s["seeds"] == [0, 1] and [r["seed"] for r in s["runs"]] == [0, 1]
    means = []
    for r in s["runs"]:
        d = out / f"seed_{r['seed']}"
        cfg = json.loads((d / "config.json").read_text())
        ev = json.loads((d / "eval.json").read_text())
        assert cfg["seed"] == r["seed"] and cfg["library"] == r["library"] == "canonical"  # --library canonical
        assert cfg["rounds"] == 1 and cfg["eval_episodes"] == 2
        rets = [e["team_return"] for e in ev["trained"]["episodes"]]
        assert r["trained"]["values"] == rets and r["trained"]["mean"] == pytest.approx(np.mean(rets), abs=1e-12)
        assert r["trained"]["ci"] == ev["stats"]["trained"]["ci"]
        assert r["base"]["values"] == [e["team_return"] for e in ev["base"]["episodes"]]
        means.append(np.mean(rets))
    t = s["across_seeds"]["trained"]
    assert t["values"] == pytest.approx(means) and t["mean"] == pytest.approx(np.mean(means), abs=1e-12)
    assert t["std"] == pytest.approx(np.std(means, ddof=1), abs=1e-12)
    # Seeds 0 and 1 draw different variants (the interface channel): each seed's own library.
    assert s["across_seeds"]["libraries"] == {"canonical": [0, 1]}
    md = (out / "seeds.md").read_text()
    assert "Across seeds (Table 1)" in md and "| 1 | canonical |" in md
    assert f"wrote {out / 'seeds.json'}" in stdout


@pytest.mark.background("seeds")
def test_seeds_resume_skips_finished_and_resumes_cut(seeds_run, tmp_path, capsys):
    out, _ = seeds_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    before = json.loads((copy / "seeds.json").read_text())
    # Both seeds finished: --resume runs nothing and writes the same summary.
    seeds.main([*SEEDS_ARGS, "--out", str(copy), "--resume"])
    stdout = capsys.readouterr().out
    assert "== seed 0 (canonical library): skip" in stdout and "== seed 1 (canonical library): skip" in stdout
    assert json.loads((copy / "seeds.json").read_text()) == before
    # A cut seed (no report yet) is resumed, a never-started one started; without --resume both are refused.
    (copy / "seed_1" / "report.md").unlink()
    shutil.rmtree(copy / "seed_0")
    ap = seeds.build_seeds_parser()
    cfgs = {s: common.config_from_args("overcooked_aa", ap.parse_args([*SEEDS_ARGS, "--seed", str(s)])) for s in (0, 1)}
    assert seeds.plan(copy, cfgs, resume=True, force=False) == {0: "start", 1: "resume"}
    with pytest.raises(InputError, match="seed 1: run directory .*seed_1 exists; pass --resume"):
        seeds.plan(copy, cfgs, resume=False, force=False)
    # A finished seed whose evaluation flags changed is resumed (re-evaluated), not skipped.
    shutil.copytree(out / "seed_1", copy / "seed_1", dirs_exist_ok=True)
    cfgs[1] = cfgs[1].replace(eval_episodes=3)
    assert seeds.plan(copy, cfgs, resume=True, force=False)[1] == "resume"


def test_barrier_ignores_stale_files(tmp_path):
    """A completion file of an earlier launch (other settings, or started before this launch's window) does not
    satisfy the barrier, nor does a stale failure stop it; this launch's files do."""
    cfg = RunConfig.smoke("harvest")
    fp = seeds.launch_fingerprint([0, 1], 2, cfg)
    assert fp == seeds.launch_fingerprint([0, 1], 2, cfg.replace(seed=7))  # per-seed fields are not the launch's
    assert fp != seeds.launch_fingerprint([0, 1], 2, cfg.replace(eval_episodes=3))
    assert fp != seeds.launch_fingerprint([0, 1, 2, 3], 2, cfg)
    now = 1_000_000.0
    split.mark(tmp_path, 0, [0], None, fp, now)
    # Stale: an earlier launch's file, started before the window, even with the same settings.
    split.mark(tmp_path, 1, [1], None, fp, now - 3600)
    with pytest.raises(RuntimeError, match=r"processes \[1\] did not finish within 0 s"):
        _barrier(tmp_path, 2, 0, fp, now - 300)
    # Stale: another launch's settings (the hand-written file of an old version too: no fingerprint at all).
    (tmp_path / "processes" / "p1.json").write_text(json.dumps({"process": 1, "seeds": [1], "ok": True}))
    with pytest.raises(RuntimeError, match=r"processes \[1\] did not finish"):
        _barrier(tmp_path, 2, 0, fp, now - 300)
    # A stale failure does not stop this launch: it is not waited for either.
    split.mark(tmp_path, 1, [1], "RuntimeError: old", "other", now)
    with pytest.raises(RuntimeError, match=r"processes \[1\] did not finish"):
        _barrier(tmp_path, 2, 0, fp, now - 300)
    # This launch's file passes; each process deletes its own before it runs.
    split.mark(tmp_path, 1, [1], None, fp, now + 5)
    _barrier(tmp_path, 2, 0, fp, now - 300)
    split.clear(tmp_path, 1)
    assert not (tmp_path / "processes" / "p1.json").exists()


def test_seed_path_that_is_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "seed_1").write_text("not a run")
    for extra in ([], ["--resume"], ["--force"]):
        with pytest.raises(SystemExit) as e:
            seeds.cli(["--game", "harvest", "--seeds", "2", "--preset", "smoke", "--out", str(out), *extra])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: seed 1: {out / 'seed_1'} exists and is not a directory (the seed's run directory)"]
    assert sorted(p.name for p in out.iterdir()) == ["seed_1"]


def _finished_seed(out, cfg, returns):
    """A hand-built finished seed directory (config.json, eval.json, report.md; nothing trained)."""
    from jaxopt_marl.pipeline import write_config

    d = seeds.seed_dir(out, cfg.seed)
    d.mkdir(parents=True)
    write_config(cfg, d)
    eps = [{"seed": 10000 + e, "team_return": float(r)} for e, r in enumerate(returns)]
    block = {"policy": "trained", "seeds": [10000 + e for e in range(len(returns))], "episodes": eps}
    ev = {"game": cfg.game, "seeds": block["seeds"], "trained": block, "eval_checkpoint": "best"}
    (d / "eval.json").write_text(json.dumps({**ev, "checkpoint_round": 1}))
    (d / "report.md").write_text("# report\n")


def test_summary_covers_earlier_calls_seeds(tmp_path, capsys):
    """Seeds 0 and 1 of an earlier call, 2 of this one (all finished: --resume runs nothing): the summary covers
    0, 1, 2 and says which were this call's; a seed of other settings and an unfinished one are named, left out."""
    argv = ["--game", "harvest", "--preset", "smoke", "--no-eval-base", "--eval-episodes", "2", "--solo-episodes", "0"]
    ap = seeds.build_seeds_parser()
    cfg = lambda s: common.config_from_args("harvest", ap.parse_args([*argv, "--seed", str(s)]))
    out = tmp_path / "o"
    for s, rets in ((0, [1, 3]), (1, [2, 2]), (2, [4, 6])):
        _finished_seed(out, cfg(s), rets)
    _finished_seed(out, cfg(7).replace(rounds=5), [9, 9])  # other settings
    (out / "seed_8").mkdir()  # unfinished
    seeds.main([*argv, "--seed", "2", "--seeds", "1", "--out", str(out), "--resume"])
    stdout = capsys.readouterr().out
    assert "== seed 2 (detailed library): skip" in stdout and "across 3 seeds (0, 1, 2)" in stdout
    s = json.loads((out / "seeds.json").read_text())
    assert s["seeds"] == [0, 1, 2] and [r["seed"] for r in s["runs"]] == [0, 1, 2]
    assert s["seeds_this_call"] == [2] and s["seeds_earlier"] == [0, 1] and s["left_out"] == ["seed_7", "seed_8"]
    assert s["across_seeds"]["trained"]["values"] == [2.0, 2.0, 5.0]
    assert s["across_seeds"]["trained"]["mean"] == pytest.approx(3.0)
    md = (out / "seeds.md").read_text()
    assert "Seeds covered: 0, 1, 2 (this call: 2; earlier calls: 0, 1)." in md
    assert "Not summarized (unfinished or other settings): seed_7, seed_8." in md
    assert "| 0 | canonical |" in md and "| 2 | detailed |" in md


def test_help_says_what_seeds_does():
    text = " ".join(seeds.build_seeds_parser().format_help().split())
    assert "default runs/<game>-<preset>-seeds" in text and "-s<seed>" not in text
    assert "split the seeds over P processes" in text and "no jax.distributed runtime is joined" in text
    assert "join a multi-process run" not in text
    assert "skip a seed_<s>/ whose run finished" in text and "delete and restart every existing seed_<s>/" in text
    # The training entry points keep their own help.
    assert "default runs/<game>-<preset>-s<seed>" in " ".join(common.build_parser("x").format_help().split())


def test_resume_of_an_auto_run_keeps_its_drawn_library(tmp_path, monkeypatch):
    """A variant added after a run started changes what its seed draws now; --resume with --library auto keeps
    the run's recorded library (no redraw, no "flags differ: library"), a fresh start draws anew."""
    from jaxopt_marl.pipeline import write_config

    argv = ["--preset", "smoke", "--library", "auto"]
    ap = seeds.build_seeds_parser()
    out = tmp_path / "o"
    old = common.config_from_args("cleanup", ap.parse_args(["--game", "cleanup", *argv, "--seed", "0"]))
    assert old.library == "canonical"
    monkeypatch.setitem(options.LIBRARIES, "cleanup", {"canonical": {}, "variant_x": {}})
    s = next(s for s in range(50) if options.draw_library("cleanup", s) == "variant_x")
    old = old.replace(seed=s)
    seeds.seed_dir(out, s).mkdir(parents=True)
    write_config(old, seeds.seed_dir(out, s))  # a cut run of seed s, started before variant_x existed
    args = ap.parse_args(["--game", "cleanup", *argv, "--seed", str(s), "--resume"])
    cfg = common.config_from_args("cleanup", args, run_dir=seeds.seed_dir(out, s))
    assert cfg.library == "canonical" and cfg == old
    assert seeds.plan(out, {s: cfg}, resume=True, force=False) == {s: "resume"}
    fresh = ap.parse_args(["--game", "cleanup", *argv, "--seed", str(s)])
    assert common.config_from_args("cleanup", fresh, run_dir=seeds.seed_dir(out, s)).library == "variant_x"
    # A recorded variant that is no longer registered is named.
    with pytest.raises(ValueError, match="the run being resumed drew library 'gone': unknown option library"):
        options.resolve_library("cleanup", "auto", s, recorded="gone")


@pytest.mark.parametrize("value", ["0", "-5"])
def test_training_entry_point_refuses_a_non_positive_timeout(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        common.cli(
            "harvest",
            "python -m experiments.harvest",
            [
                "--preset",
                "smoke",
                "--out",
                str(tmp_path / "o"),
                "--num-processes",
                "2",
                "--process-id",
                "0",
                "--coordinator",
                "127.0.0.1:1",
                "--distributed-timeout",
                value,
            ],
        )
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --distributed-timeout must be a finite number of seconds >= 1, got {value}"]
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match=r"got nan"):
        __import__("jaxopt_marl.distributed").distributed.check_timeout(float("nan"))
