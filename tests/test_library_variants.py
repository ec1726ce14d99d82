"""Option-library variants (jaxopt_marl.options.variants; paper §6.1): three drafts per game that differ in
granularity, menu phrasing and read sets; every variant's effect predicates are in delta form and bound to the
acting agent's private transition (the repaired defects 1-2), and each passes its own burn-in with the certificate
(every adopted guard covers >= 5 failures and no success, over its own read set)."""

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import envs_jax
from jaxopt_marl import burnin, guards, macro, options
from jaxopt_marl.options.base import apply_variant
from jaxopt_marl.records import OUTCOME_SUCCESS

GAMES = ("cleanup", "harvest", "overcooked_aa", "overcooked_fc")
VARIANTS = [(g, v) for g in GAMES for v in options.library_names(g)]
#: Random-option episodes whose states the effect tests read, and their length (env steps).
EPISODES, STEPS = 3, 80
#: The shipped guards and burn-in summary of every variant.
LIBRARY_DOCS = Path(__file__).resolve().parents[1] / "docs" / "libraries"


@functools.cache
def _lib(game, library, **config):
    env = envs_jax.make(game, max_steps=STEPS)
    return env, options.get_library(game, env, library=library, **config)


def test_every_game_has_three_variants_differing_from_canonical():
    for game in GAMES:
        names = options.library_names(game)
        assert len(names) >= 3 and options.CANONICAL in names
        _, canon = _lib(game, options.CANONICAL)
        for v in names:
            if v == options.CANONICAL:
                continue
            _, lib = _lib(game, v)
            assert lib.library == v and lib.option_names == canon.option_names
            # granularity: instances per capped class (and the wait's length, where the variant sets it)
            assert lib.num_instances != canon.num_instances
            assert lib.wait_steps == options.LIBRARIES[game][v].get("wait_steps", canon.wait_steps)
            # phrasing: every label differs; read sets: at least one option's differs
            assert all(a.label != b.label for a, b in zip(lib.options, canon.options)), v
            assert any(a.read_set != b.read_set for a, b in zip(lib.options, canon.options)), v
            for o in lib.options:
                assert set(o.read_set) <= set(lib.feature_names)
            assert f"{lib.wait_steps} " in lib.options[lib.option_id("wait")].contract


def test_apply_variant_errors_name_the_bad_value():
    _, lib = _lib("cleanup", options.CANONICAL)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['fly'\]"):
        apply_variant(lib, labels={"fly": "fly"})
    with pytest.raises(ValueError, match=r"label 'eat apple' of eat_apple must have the fields \['x', 'y'\]"):
        apply_variant(lib, labels={"eat_apple": "eat apple"})
    with pytest.raises(ValueError, match=r"label 'wait @ \(\{x\}, \{y\}\)' of wait must have the fields \[\]"):
        apply_variant(lib, labels={"wait": "wait @ ({x}, {y})"})
    with pytest.raises(ValueError, match=r"names feature\(s\) \['colour'\]"):
        apply_variant(lib, read_sets={"eat_apple": ("colour",)})
    with pytest.raises(ValueError, match="wait_steps must be an integer >= 1, got 0"):
        options.get_library("harvest", wait_steps=0)
    with pytest.raises(ValueError, match="counter_cap must be an integer >= 1, got 0"):
        options.get_library("overcooked_aa", counter_cap=0)


@functools.cache
def _states(game):
    """Env states of random-option episodes of the canonical library (``macro.uniform_policy``): [EPISODES *
    STEPS]. Every variant's effects are checked on these same states (a state is a state of the game whichever
    draft played it), so each game compiles one episode scan, not one per variant."""
    env, lib = _lib(game, options.CANONICAL)
    step = macro.make_macro_step(lib, env)

    def episode(key):
        ms = macro.init(lib, env, key, jnp.ones((lib.num_agents,), bool), jnp.bool_(False))
        return jax.lax.scan(lambda m, k: (step(m, k)[0],) * 2, ms, jax.random.split(key, STEPS))[1].env

    states = jax.jit(jax.vmap(episode))(jax.random.split(jax.random.PRNGKey(11), EPISODES))
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), states)


def _violations(game, library, **config):
    """``(static, partner)``: counts of (state, agent, instance) where a non-``wait`` option's effect holds

    - on an unchanged state (pre = post): an effect in delta form needs a change, an absolute one ("holds an
      onion", "stands in the river") is true whenever it already holds (defect 1);
    - on a step in which the acting agent idles and only its partners act (random actions): a private effect
      needs the agent's own transition (defect 2: a partner's placement credited to the agent). Options declared
      ``solo_only`` (no private component, e.g. Overcooked's ``start_cooking``: a partner can start the pot) are
      the other repair of defect 2 -- their guards are mined from solo episodes only -- and are not counted.
    """
    env, lib = _lib(game, library, **config)
    states = _states(game)
    n, idle = lib.num_agents, lib.idle_action()
    n_act = env.action_space(env.agents[0]).n
    wait = lib.option_id("wait")
    solo_only = jnp.asarray([o.solo_only for o in lib.options])

    def one(state, key):
        k_act, k_env = jax.random.split(key)

        def agent(aid):
            inst = lib.instances(state, aid)
            acts = jax.random.randint(k_act, (n,), 0, n_act).at[aid].set(idle)
            _, nxt, _, _, _ = env.step_env(k_env, state, {ag: acts[i] for i, ag in enumerate(env.agents)})

            def inst_effects(o, tg):
                pre = lib.snapshot(state, aid, tg)
                return lib.effect(o, pre, pre), lib.effect(o, pre, lib.snapshot(nxt, aid, tg))

            same, partner = jax.vmap(inst_effects)(inst.opt, inst.target)
            live = inst.valid & (inst.opt != wait) & lib.present(state)[aid]
            return (same & live).sum(), (partner & live & ~solo_only[inst.opt]).sum()

        return jax.vmap(agent)(jnp.arange(n))

    b = jax.tree.leaves(states)[0].shape[0]
    same, partner = jax.jit(jax.vmap(one))(states, jax.random.split(jax.random.PRNGKey(3), b))
    return int(same.sum()), int(partner.sum())


@pytest.mark.parametrize("game, library", VARIANTS)
def test_effects_are_delta_form_and_private(game, library):
    assert _violations(game, library) == (0, 0)


def test_the_effect_check_catches_the_defective_drafts():
    """The naive Overcooked drafts (absolute acquire effects, pot-count-only place_in_pot) fail the check: it can
    fail."""
    static, _ = _violations("overcooked_aa", options.CANONICAL, effects="naive")
    assert static > 0


@pytest.mark.parametrize("game, library", VARIANTS)
def test_shipped_guards_fit_their_variant(game, library):
    """Every variant ships the guards of its own paper-size burn-in (docs/libraries/<game>/<variant>/, written by
    ``python -m experiments.burnin --game G --library V``): they load against the variant's options, features and
    read sets (an inferred literal outside the option's read set is refused by the loader), each inferred guard
    covers >= MIN_SUPPORT failures, and the burn-in summary beside them names the variant and counts them."""
    _, lib = _lib(game, library)
    d = LIBRARY_DOCS / game / library
    read_sets = {o.name: o.read_set for o in lib.options}
    gs = guards.load_guards(d / "guards.jsonl", lib.option_names, lib.vocab, reasons=lib.reasons, read_sets=read_sets)
    summary = json.loads((d / "burnin.json").read_text())
    assert summary["library"] == library and summary["game"] == game and summary["guards"] == len(gs)
    assert summary["never_succeeded"] == {}
    inferred = [g for g in gs if g.channel == "inferred"]
    assert inferred and all(g.support >= guards.MIN_SUPPORT for g in inferred)
    for g in inferred:
        assert {k for k, _ in g.when} <= set(read_sets[g.opt]), g


@pytest.mark.parametrize("game, library", [("cleanup", "compact"), ("overcooked_aa", "detailed")])
def test_variant_burnin_certificate_over_its_own_read_sets(game, library):
    """A short uniform burn-in of a variant (one Melting Pot and one Overcooked draft; the other variants'
    shipped guards are checked above): every inferred guard uses only its option's read-set features (the
    variant's, not the canonical ones) and, recounted here over the records (solo-only options: solo episodes
    only), covers >= MIN_SUPPORT failures and zero successes."""
    env, lib = _lib(game, library)
    res = burnin.run_burnin(lib, env, 6, 6, seed=0, chunk=12, num_steps=STEPS)
    gs = burnin.synthesize(lib, res.codes)
    c = res.codes
    feats = list(lib.feature_names)
    inferred = [g for g in gs if g.channel == "inferred"]
    for g in inferred:
        spec = lib.options[lib.option_id(g.opt)]
        assert {k for k, _ in g.when} <= set(spec.read_set), (g, spec.read_set)
        hit = c.opt == lib.option_id(g.opt)
        if spec.solo_only:
            hit &= c.solo
        for k, v in g.when:
            f = next(fs for fs in lib.feature_specs if fs.name == k)
            hit &= c.features[:, feats.index(k)] == f.values.index(v)
        assert int((hit & (c.outcome == OUTCOME_SUCCESS)).sum()) == 0, g
        assert int((hit & (c.outcome != OUTCOME_SUCCESS)).sum()) >= guards.MIN_SUPPORT, g
    s = burnin.summarize(lib, res, gs, seed=0, seconds_guards=0.0)
    assert s.library == library and sum(s.attempts_per_option.values()) == res.decisions
