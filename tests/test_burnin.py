"""Stage-2 burn-in on AA: records, plausible guards (incl. §5.1's start_cooking guards), the CLI."""

import dataclasses
import json

import numpy as np
import pytest

import envs_jax
from experiments import burnin as cli
from jaxopt_marl import burnin
from jaxopt_marl.options import get_library
from jaxopt_marl.records import read_records


@pytest.fixture(scope="module")
def result():
    env = envs_jax.make("overcooked_aa")
    lib = get_library("overcooked_aa", env)
    return lib, burnin.run_burnin(lib, env, 20, 20, seed=0, chunk=40)


def guard_set(guards):
    return {(g.opt, g.channel, tuple(g.when)) for g in guards}


def test_records_shape_and_solo(result):
    lib, res = result
    c = res.codes
    assert res.episodes == 40 and res.decisions == c.num_records > 2000
    assert set(np.unique(c.ep[c.solo])) <= set(range(20))
    # solo episodes: only the acting agent (ep % 2) has records
    assert (c.aid[c.solo] == c.ep[c.solo] % 2).all()
    assert (c.step >= 0).all() and (c.step < 400).all()
    table = burnin.to_table(lib, c)
    assert table.num_rows == c.num_records


def test_plausible_guards(result):
    lib, res = result
    gs = guard_set(burnin.synthesize(lib, res.codes))
    assert ("start_cooking", "inferred", (("tgt_pot_state", "empty"),)) in gs
    assert ("start_cooking", "inferred", (("held", "dish"),)) in gs
    assert ("pick_onion", "inferred", (("held", "onion"),)) in gs  # Defect 1 repaired
    assert ("deliver", "explicit", (("__reason__", "NoPath"),)) in gs
    assert ("drop_held", "explicit", (("__reason__", "NothingHeld"),)) in gs
    # certificate: no guard hides pick_onion with empty hands, nor drop_held while holding an onion
    assert ("pick_onion", "inferred", (("held", "nothing"),)) not in gs
    assert ("drop_held", "inferred", (("held", "onion"),)) not in gs


def test_defect1_absolute_form_vetoes_the_guard():
    env = envs_jax.make("overcooked_aa", max_steps=200)
    lib = get_library("overcooked_aa", env, effects="naive")
    res = burnin.run_burnin(lib, env, 10, 10, seed=0, chunk=20)
    gs = guard_set(burnin.synthesize(lib, res.codes))
    assert ("pick_onion", "inferred", (("held", "onion"),)) not in gs


def test_options_that_never_succeed_are_flagged(result):
    """burnin.json counts attempts and successes per option and flags an option tried but never successful
    (paper §5.1 defect 3's symptom: a 100% failure rate), naming it in the console warning."""
    lib, res = result
    c = res.codes
    s = burnin.summarize(lib, res, [], seed=0, seconds_guards=0.0)
    for i, name in enumerate(lib.option_names):
        assert s.attempts_per_option[name] == int((c.opt == i).sum())
        assert s.successes_per_option[name] == int(((c.opt == i) & (c.outcome == 0)).sum())
    assert sum(s.attempts_per_option.values()) == res.decisions
    assert s.never_succeeded == {} and burnin.never_succeeded_warning(s) is None  # every AA option succeeds
    deliver = lib.option_names.index("deliver")
    broken = dataclasses.replace(res, codes=c._replace(outcome=np.where(c.opt == deliver, 2 + 1, c.outcome)))
    s = burnin.summarize(lib, broken, [], seed=0, seconds_guards=0.0)
    tried = int((c.opt == deliver).sum())
    assert tried > 0 and s.never_succeeded == {"deliver": tried}
    assert f"deliver (0 of {tried})" in burnin.never_succeeded_warning(s)


def test_cli_writes_outputs(tmp_path):
    out = tmp_path / "bi"
    summary = cli.main(cli.Args(game="overcooked_fc", episodes=2, out=out, steps=60, chunk=4))
    assert (out / "records.parquet").exists() and (out / "guards.jsonl").exists()
    meta = json.loads((out / "burnin.json").read_text())
    assert meta["episodes"] == 4 and meta["decisions"] == summary["decisions"] > 0
    assert set(meta["guards_per_option"]) == set(get_library("overcooked_fc").option_names)
    assert read_records(out / "records.parquet").num_rows == meta["decisions"]
    # One burnin.json layout (a run's burnin/ writes the same record).
    s = burnin.BurninSummary.load(out / "burnin.json")
    assert (s.episodes, s.joint_episodes, s.steps, s.min_support) == (4, 2, 60, 5) and s.to_dict() == meta


def test_burnin_summary_is_an_artifacts_record(tmp_path):
    # burnin.json loads through the artifacts' JSON helper: the same errors as eval.json / solo.json.
    from jaxopt_marl import artifacts, guards

    assert burnin.BurninSummary is artifacts.BurninSummary and burnin.BURNIN_JSON == artifacts.BURNIN_JSON
    assert artifacts.BURNIN_MIN_SUPPORT == guards.MIN_SUPPORT  # the default of a file without min_support
    with pytest.raises(FileNotFoundError, match="does not exist"):
        burnin.BurninSummary.load(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(artifacts.ArtifactError, match="bad.json is not valid JSON"):
        burnin.BurninSummary.load(bad)
    bad.write_text("[1]")
    with pytest.raises(artifacts.ArtifactError, match="bad.json is not a JSON object"):
        burnin.BurninSummary.load(bad)
    bad.write_text(json.dumps({"game": "harvest"}))
    with pytest.raises(artifacts.ArtifactError, match="bad.json: .*missing"):
        burnin.BurninSummary.load(bad)


def test_cli_rejects_unknown_and_unavailable_games(tmp_path):
    with pytest.raises(SystemExit, match="unknown game"):
        cli.Args(game="chess", episodes=1, out=tmp_path)
    from jaxopt_marl import options

    if not options.available("cleanup"):
        with pytest.raises(SystemExit, match="not available yet"):
            cli.main(cli.Args(game="cleanup", episodes=1, out=tmp_path))


def test_cli_constants_equal_the_library_ones():
    # experiments.burnin spells the games and MIN_SUPPORT itself, so that its bad-input checks run before JAX is
    # imported; they must stay equal to the library's (paper §5.1: at least five failures).
    from jaxopt_marl import config, guards

    assert cli.GAMES == config.GAMES
    assert cli.MIN_SUPPORT == guards.MIN_SUPPORT == 5
