"""The frozen-LLM burn-in control (paper §5.1) with a tiny random decoder on AA: its records are valid burn-in
records (options on the guardless menu, the uniform burn-in's schema, episodes and initiation features), the same
seed gives the same records, ``--compare`` counts what the two records.parquet hold, and bad input exits 2."""

import json
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest

import envs_jax
from experiments import burnin as cli
from experiments.cli import run_cli
from jaxopt_marl import burnin, burnin_compare, config, menus, options, rollout
from jaxopt_marl import guards as G
from jaxopt_marl.compiled_rollout import ChunkConfig
from jaxopt_marl.options.base import Instances
from jaxopt_marl.records import read_records
from lora import LoRAConfig

GAME, STEPS, EPISODES, K = "overcooked_aa", 24, 2, 4
# One model branch (the K x N rows padded to the prompt limit): one fast compile, which the CLI test's roller (the
# same program) reads back from the in-process compilation cache (tests/conftest.py).
CHUNKS = ChunkConfig.single(K * 2)


def _roller():
    env = envs_jax.make(GAME, max_steps=STEPS)
    lib = options.get_library(GAME, env)
    model, tok = rollout.load_policy_model(rollout.TINY_RANDOM, LoRAConfig(num_adapters=1, rank=1, alpha=2.0))
    temp = config.PAPER[GAME]["temperature"]
    return burnin.make_llm_roller(lib, env, model, tok, temperature=temp, seed=0, batch=K, chunks=CHUNKS)


@pytest.fixture(scope="module")
def runs():
    roller = _roller()
    lib, env = roller.lib, roller.env
    llm = burnin.run_llm_burnin(roller, EPISODES, EPISODES, seed=0, model_name="tiny-random")
    uni = burnin.run_burnin(lib, env, EPISODES, EPISODES, seed=0, num_steps=STEPS)
    return roller, llm, uni


def test_records_are_burnin_records(runs):
    roller, llm, uni = runs
    lib, c = roller.lib, llm.codes
    assert (llm.policy, llm.model, llm.temperature) == ("llm", "tiny-random", config.PAPER[GAME]["temperature"])
    assert llm.episodes == 4 and llm.solo_episodes == 2 and llm.decisions == c.num_records > 20
    assert set(np.unique(c.ep)) == {0, 1, 2, 3} and (c.solo == (c.ep < 2)).all()
    assert (c.aid[c.solo] == c.ep[c.solo] % 2).all()  # solo: only the acting agent decides
    assert set(np.unique(c.aid[~c.solo])) == {0, 1}
    assert (c.step >= 0).all() and (c.step < STEPS).all() and (c.outcome >= 0).all()
    # The uniform burn-in's Parquet schema (columns, types, vocabulary metadata).
    assert burnin.to_table(lib, c).schema.equals(burnin.to_table(lib, uni.codes).schema, check_metadata=True)
    # Records of step 0 start from the uniform burn-in's reset state of their episode: their initiation features
    # are the library's features of that instance there.
    first = np.flatnonzero(c.step == 0)
    assert first.size >= 4
    for i in first:
        key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(0), int(c.ep[i])))[0]
        _, state = roller.env.reset(key)
        inst = Instances(
            jnp.asarray([c.opt[i]], jnp.int32),
            jnp.asarray([[c.target_y[i], c.target_x[i]]], jnp.int32),
            jnp.ones((1,), bool),
        )
        want = np.asarray(lib.features(state, int(c.aid[i]), inst))[0]
        np.testing.assert_array_equal(c.features[i], want)


def test_choices_are_on_the_guardless_menu(runs):
    roller, _, _ = runs
    lib = roller.lib
    acting, _ = burnin.episode_plan(EPISODES, EPISODES, lib.num_agents)
    from lora import split_model

    _, ad, base = split_model(roller.model)
    out = jax.device_get(roller.run(ad, base, np.arange(K), jax.random.PRNGKey(0), True, acting))
    dec, n = out.decisions, int(out.decisions.count)
    started = np.flatnonzero(dec.inst[:n] >= 0)
    assert started.size > 20
    for d in started:
        i = int(dec.inst[d])
        assert dec.menu_letters[d, i] >= 0  # shown
        assert dec.option[d] == dec.menu_opt[d, i] and (dec.target[d] == dec.menu_target[d, i]).all()
    # The menu with no guards is the uniform burn-in's: exactly the valid instances of the instance table (over
    # states of a random walk of the env).
    env, empty = roller.env, G.compile_guards([], lib.vocab)
    _, state = env.reset(jax.random.PRNGKey(3))
    feas = jax.jit(jax.vmap(lambda s, a: menus.feasibility(lib, empty, s, a), (None, 0)))
    step = jax.jit(env.step_env)
    for t in range(12):
        inst, _, _, shown = feas(state, jnp.arange(lib.num_agents))
        np.testing.assert_array_equal(np.asarray(shown), np.asarray(inst.valid))
        acts = {a: jax.random.randint(jax.random.PRNGKey(t), (), 0, env.num_actions) for a in env.agents}
        _, state, _, _, _ = step(jax.random.PRNGKey(100 + t), state, acts)


def test_same_seed_same_records(runs):
    roller, llm, _ = runs
    again = burnin.run_llm_burnin(roller, EPISODES, EPISODES, seed=0, model_name="tiny-random")
    for a, b in zip(llm.codes, again.codes):
        np.testing.assert_array_equal(a, b)


def _recount(codes, lib):
    """(option, outcome) -> records, from the integer codes (not the Parquet file the comparison reads)."""
    names = ["success", "effect_fail"] + [f"explicit:{r}" for r in lib.vocab.reason_names]
    return {
        (lib.option_names[o], names[x]): n
        for (o, x), n in zip(*np.unique(np.stack([codes.opt, codes.outcome], 1), axis=0, return_counts=True))
    }


def test_cli_llm_and_compare(runs, tmp_path, monkeypatch, capsys):
    roller, llm, uni = runs
    lib = roller.lib
    make = burnin.make_llm_roller
    monkeypatch.setattr(burnin, "make_llm_roller", lambda *a, **kw: make(*a, **{**kw, "chunks": CHUNKS}))
    du, dl = tmp_path / "uniform", tmp_path / "llm"
    common = ["--game", GAME, "--episodes", str(EPISODES), "--steps", str(STEPS), "--chunk", str(K)]
    su = cli.dispatch(cli.parse_args(common + ["--out", str(du)]))
    sl = cli.dispatch(cli.parse_args(common + ["--out", str(dl), "--policy", "llm", "--model", "tiny-random"]))
    assert (su["policy"], su["model"], su["temperature"]) == ("uniform", None, None)
    assert (sl["policy"], sl["model"], sl["temperature"]) == ("llm", "tiny-random", 0.9)
    assert sl["decisions"] == llm.decisions and sl["seconds"] > 0 and sl["decisions_per_s"] > 0
    # The CLI's records are the API's (same seed, same episodes).
    t = read_records(dl / "records.parquet")
    np.testing.assert_array_equal(t.column("step").to_numpy(), llm.codes.step)

    c = cli.dispatch(cli.parse_args(["--compare", str(du), str(dl)]))
    assert json.loads((dl / "compare.json").read_text()) == c and (dl / "compare.md").exists()
    for name, codes, s, d in (("uniform", uni.codes, su, du), ("llm", llm.codes, sl, dl)):
        want = _recount(codes, lib)
        got = {(o, x): n for o, d in c["per_option"].items() for x, n in d[name].items()}
        assert got == want
        t = pq.read_table(d / "records.parquet", columns=["opt", "outcome"]).to_pydict()
        assert got == dict(Counter(zip(t["opt"], t["outcome"])))  # the file the comparison read
        assert c["cells_covered"][name] == len(want)
        assert c["guards"][name] == s["guards"] == len(c["guards"][f"{name}_list"])
        assert c["runs"][name]["decisions"] == codes.num_records
    assert c["cells_covered"]["total"] == len(lib.option_names) * (2 + len(lib.vocab.reason_names))
    both = set(_recount(uni.codes, lib)) & set(_recount(llm.codes, lib))
    assert c["cells_covered"]["both"] == len(both)
    assert c["cost"]["seconds_ratio"] == round(sl["seconds"] / su["seconds"], 2)

    # Runs that differ: exit 2, naming the differing values.
    bad = json.loads((dl / "burnin.json").read_text())
    (tmp_path / "other").mkdir()
    for f in ("records.parquet", "guards.jsonl"):
        (tmp_path / "other" / f).write_bytes((dl / f).read_bytes())
    (tmp_path / "other" / "burnin.json").write_text(json.dumps({**bad, "seed": 7, "episodes": 9}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_cli(lambda argv: cli.dispatch(cli.parse_args(argv)), ["--compare", str(du), str(tmp_path / "other")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "seed 0 vs 7" in err and "episodes 4 vs 9" in err
    with pytest.raises(SystemExit) as e:  # the policies swapped
        run_cli(lambda argv: cli.dispatch(cli.parse_args(argv)), ["--compare", str(dl), str(du)])
    assert e.value.code == 2 and "policy 'llm', expected 'uniform'" in capsys.readouterr().err
    with pytest.raises(burnin_compare.CompareError, match="does not exist"):
        burnin_compare.compare(du, tmp_path / "nothing")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--game", GAME, "--model", "tiny-random"], "--model tiny-random is only for --policy llm"),
        (["--game", GAME, "--temperature", "0.5"], "--temperature 0.5 is only for --policy llm"),
        (["--game", GAME, "--policy", "greedy"], "unknown --policy 'greedy'"),
        (["--game", GAME, "--policy", "llm", "--temperature", "0"], "--temperature must be > 0, got 0.0"),
        (["--game", GAME, "--policy", "llm", "--model", "/no/such.gguf"], "/no/such.gguf"),
        (["--compare", "a", "b", "--game", GAME], "--compare reads two finished burn-ins; it takes no --game"),
        (["--episodes", "3"], "required: --game"),
    ],
)
def test_bad_input_exits_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(
            lambda a: cli.dispatch(cli.parse_args(a)), argv + ([] if "--compare" in argv else ["--out", str(tmp_path)])
        )
    assert e.value.code == 2 and message in capsys.readouterr().err
