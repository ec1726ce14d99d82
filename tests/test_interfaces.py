"""The action interfaces (jaxopt_marl.interfaces; paper §4, Table 2): native primitive actions and compound JSON.

Parsers on hand-written and hostile responses; native actions reach the environment unchanged, one LLM call per
agent per step; a compound-JSON object whose target does not exist, or whose executor refuses to start, is a
counted no-op; the prompts carry §4's fields."""

import collections
import json
import random
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from jaxopt_marl import interfaces, macro, options, parsing
from jaxopt_marl.config import RunConfig
from jaxopt_marl.interfaces import COMPOUND_REASONS, NativeLibrary, parse_compound, resolve_compound
from jaxopt_marl.rollout import Decision, PolicyConfig

# ---------------------------------------------------------------------------------------------------------
# Compound JSON parser
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cleanup_lib():
    env = envs_jax.make("cleanup", max_steps=8)
    return options.get_library("cleanup", env)


@pytest.mark.parametrize(
    "text, want",
    [
        ('{"action": "clean_dirt", "target": [4, 5]}', ("ok", "clean_dirt", (4, 5))),
        ('{"action": "wait"}', ("ok", "wait", None)),
        ('Sure! ```json\n{"action": "eat_apple", "target": [2, 11]}\n``` done', ("ok", "eat_apple", (2, 11))),
        ('{"action": " GO_TO_RIVER "}', ("ok", "go_to_river", None)),
        ('{"action": "wait", "target": [1, 2]}', ("ok", "wait", None)),  # a target on a target-free action
        ('{"action": "clean_dirt", "target": {"x": 4, "y": 5}}', ("ok", "clean_dirt", (4, 5))),
        ('{"action": "clean_dirt", "target": [4.0, 5]}', ("ok", "clean_dirt", (4, 5))),
        ('{"action": "wait"} {"action": "go_to_river"}', ("ok", "wait", None)),  # the first object counts
        ("", ("empty", None, None)),
        ("   \n ", ("empty", None, None)),
        ("state: cleaning\nchoice: B", ("no_json", None, None)),
        ('{"action": "wait"', ("malformed_json", None, None)),
        ("{action: wait}", ("malformed_json", None, None)),
        ('{"act": "wait"}', ("unknown_action", None, None)),
        ('{"action": "fly"}', ("unknown_action", None, None)),
        ('{"action": 3}', ("unknown_action", None, None)),
        ('{"action": "clean_dirt"}', ("bad_target", "clean_dirt", None)),
        ('{"action": "clean_dirt", "target": [4]}', ("bad_target", "clean_dirt", None)),
        ('{"action": "clean_dirt", "target": [true, 5]}', ("bad_target", "clean_dirt", None)),
        ('{"action": "clean_dirt", "target": [4.5, 5]}', ("bad_target", "clean_dirt", None)),
        ('{"action": "clean_dirt", "target": ["4", "5"]}', ("bad_target", "clean_dirt", None)),
        ('{"action": "clean_dirt", "target": [1e400, 5]}', ("bad_target", "clean_dirt", None)),
        ('{"action": "clean_dirt", "target": [99999999999999999999, 5]}', ("bad_target", "clean_dirt", None)),
    ],
)
def test_parse_compound_hand_written(cleanup_lib, text, want):
    res = parse_compound(text, cleanup_lib)
    assert (res.reason, res.action, res.target) == want
    assert res.ok == (want[0] == "ok") and res.letter is None


def test_parse_compound_never_raises_on_hostile_text(cleanup_lib):
    """10,000 random strings (printable noise, JSON fragments, deep nesting, non-strings) give a known reason."""
    rng = random.Random(0)
    frags = ['{"action": ', '"clean_dirt"', '"wait"', ', "target": ', "[4, 5]", "[", "]", "{", "}", ":", ",", "null",
             "1e309", "-0", '"\\ud800"', "true", '"x": ', "NaN", "Infinity", "\x00", "é", "\n"]  # fmt: skip
    texts = [None, 3, b"{}", ["{}"], "{" * 100_000, "[" * 100_000 + "{", '{"action": "wait"' + "}" * 5]
    while len(texts) < 10_000:
        if rng.random() < 0.5:
            texts.append("".join(rng.choice(frags) for _ in range(rng.randint(1, 12))))
        else:
            texts.append("".join(rng.choice(string.printable) for _ in range(rng.randint(0, 60))))
    seen = collections.Counter()
    for t in texts:
        res = parse_compound(t, cleanup_lib)
        assert res.reason in ("ok",) + COMPOUND_REASONS, (t, res)
        seen[res.reason] += 1
        if res.ok:
            assert res.action in cleanup_lib.option_names
    assert seen["malformed_json"] > 0 and seen["no_json"] > 0 and seen["empty"] > 0


def test_resolve_compound_target_must_exist(cleanup_lib):
    """The object names a slot of the agent's instance table (before guards), or it is ``target_absent``."""
    lib = cleanup_lib
    eat, wait = lib.option_id("eat_apple"), lib.option_id("wait")
    opt = np.array([eat, eat, wait])
    target = np.array([[11, 2], [3, 7], [-1, -1]])  # (row, col)
    valid = np.array([True, False, True])
    ok, slot = resolve_compound(
        parse_compound('{"action": "eat_apple", "target": [2, 11]}', lib), lib, opt, target, valid
    )
    assert (ok.reason, slot) == ("ok", 0)
    gone, slot = resolve_compound(
        parse_compound('{"action": "eat_apple", "target": [7, 3]}', lib), lib, opt, target, valid
    )
    assert (gone.reason, slot) == ("target_absent", -1)  # that slot is not valid (no apple there now)
    swapped, slot = resolve_compound(
        parse_compound('{"action": "eat_apple", "target": [11, 2]}', lib), lib, opt, target, valid
    )
    assert (swapped.reason, slot) == ("target_absent", -1)  # (x, y) = (column, row), not (row, column)
    w, slot = resolve_compound(parse_compound('{"action": "wait"}', lib), lib, opt, target, valid)
    assert (w.reason, slot) == ("ok", 2)
    bad, slot = resolve_compound(parse_compound("nope", lib), lib, opt, target, valid)
    assert (bad.reason, slot) == ("no_json", -1)


# ---------------------------------------------------------------------------------------------------------
# Native actions
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "game, names",
    [
        ("cleanup", "noop forward backward step_left step_right turn_left turn_right fire_zap fire_clean"),
        ("harvest", "noop forward backward step_left step_right turn_left turn_right fire_zap"),
        ("overcooked_aa", "north south east west stay interact"),
    ],
)
def test_native_menu_is_the_simulators_action_set(game, names):
    env = envs_jax.make(game, max_steps=8)
    lib = NativeLibrary(options.get_library(game, env))
    assert lib.option_names == tuple(names.split())
    assert len(lib.option_names) == env.action_space(env.agents[0]).n
    letters = interfaces.fixed_letters(np.ones((len(lib.option_names),), bool))
    assert letters.tolist() == list(range(len(lib.option_names)))  # A, B, ... in action order, never shuffled
    if game == "cleanup":
        assert "ABCDEFGHI"[lib.option_id("fire_clean")] == "I"  # §4's trace: "choice: I <- FIRE_CLEAN"


@pytest.mark.parametrize("game", ["cleanup", "overcooked_fc"])
def test_native_actions_reach_the_environment_unchanged(game):
    """Option i started on every agent emits primitive action i in the next env step, and the env steps as if
    it had been given those actions directly; every option ends after that one step."""
    env = envs_jax.make(game, max_steps=8)
    lib = NativeLibrary(options.get_library(game, env))
    n, a_count = lib.num_agents, len(lib.option_names)
    ms = macro.init(lib, env, jax.random.PRNGKey(3), jnp.ones((n,), bool), jnp.bool_(False))
    key = jax.random.PRNGKey(5)

    @jax.jit  # one program per step kind, not an eager dispatch per operation
    def play(ms, choice, k):
        inst, feats = macro.tables(lib, ms.env)
        ms2, fail = macro.begin(lib, ms, choice, inst, feats)
        ms3, rec, action = macro.advance(lib, env, ms2, k, return_action=True)
        _, direct, _, _, _ = env.step_env(k, ms.env, {ag: choice[i] for i, ag in enumerate(env.agents)})
        return fail, ms3, rec, action, direct

    for step in range(a_count):
        choice = (jnp.arange(n, dtype=jnp.int32) + step) % a_count
        k = jax.random.fold_in(key, step)
        fail, ms3, rec, action, direct = play(ms, choice, k)
        assert not bool(fail.valid.any())
        np.testing.assert_array_equal(np.asarray(action), np.asarray(choice))
        assert bool(rec.valid.all()) and not bool(ms3.slots.active.any())  # one step each, all ended
        assert (np.asarray(rec.outcome) == 0).all()  # success: no effect predicate to fail
        for x, y in zip(jax.tree.leaves(direct), jax.tree.leaves(ms3.env)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        ms = ms3


def test_layout_hint_cleanup_hand_computed():
    """River = the dirt-capable rows 1-6 (rows 1-5 plus row 6's cols 17-23), orchard = rows 15-19 (the
    apple-capable cells), region from the agent's cell (envs_jax.cleanup map legend)."""
    env = envs_jax.make("cleanup", max_steps=8)
    lib = options.get_library("cleanup", env)
    bank = np.argwhere(lib.region_map == 1)[0]  # R_BANK
    hint = interfaces.layout_hint("cleanup", {"pos": np.array([bank])}, 0, lib)
    side = "to your north" if bank[0] > 6 else "to your south" if bank[0] < 1 else "around you"
    oside = "to your north" if bank[0] > 19 else "to your south" if bank[0] < 15 else "around you"
    assert hint == f"Layout: BANK. River is {side} (rows 1-6). Orchard is {oside} (rows 15-19)."
    orchard = np.argwhere(lib.region_map == 2)[0]
    hint = interfaces.layout_hint("cleanup", {"pos": np.array([orchard])}, 0, NativeLibrary(lib))
    assert hint == "Layout: ORCHARD. River is to your north (rows 1-6). Orchard is around you (rows 15-19)."


def test_interface_config_errors_name_the_valid_values():
    with pytest.raises(ValueError, match="unknown interface 'menus'; valid interfaces: menu, native, compound_json"):
        RunConfig.smoke("cleanup", interface="menus")
    with pytest.raises(ValueError, match="compound_json needs mode 'sample'"):
        RunConfig.cpu("cleanup", interface="compound_json")
    with pytest.raises(ValueError, match="no menu letter to score"):
        PolicyConfig(mode="choice_only", interface="compound_json")
    cfg = RunConfig.cpu("cleanup", **interfaces.run_overrides({"interface": "compound_json"}))
    assert (cfg.mode, cfg.max_new_tokens) == ("sample", interfaces.COMPOUND_MAX_NEW_TOKENS)
    assert cfg.policy_config().interface == "compound_json"


# ---------------------------------------------------------------------------------------------------------
# Rollouts (tiny random model; scripted responses where the test needs a given answer)
# ---------------------------------------------------------------------------------------------------------


def _roller(game, steps, **cfg):
    from helpers import tiny_roller

    return tiny_roller(game, steps, PolicyConfig(**cfg))


def _script(roller, respond):
    """Replaces the LLM by ``respond(user message, aid) -> text`` (prompt and response ids stay well formed)."""

    def decide(users, labels, aids, n_letters, keys, reference=False):
        return [
            Decision(prompt_ids=[1, 2], response_ids=[3], text=respond(u, int(a)), logp=0.0)
            for u, a in zip(users, aids)
        ]

    roller.policy.decide = decide


def test_native_rollout_one_call_per_agent_step_and_prompt_fields():
    """Native Cleanup: every present agent decides at every step (call ratio 1), the executed action of each
    decision is its letter's action, and the prompt has §4's fields."""
    r = _roller("cleanup", 5, mode="choice_only", interface="native")
    res = r.collect([7, 8], jax.random.PRNGKey(0))
    alive = res.traj["alive"]  # [K, T, N] after each step
    present = np.concatenate([np.ones_like(alive[:, :1]), alive[:, :-1]], axis=1)
    assert res.num_decisions == int(present.sum()) > 0
    names = r.lib.option_names
    for t in res.traces:
        assert t["interface"] == "native" and t["parse"] == "ok"
        assert res.traj["actions"][t["rollout"], t["step"], t["aid"]] == names.index(t["option"])
        assert t["menu"][8] == "I) FIRE_CLEAN (fire the cleaning beam ahead)"
    p = res.traces[0]["prompt"]
    for field in ("World position: (", "Facing: ", "Apples in view: ", "Dirt in view: ", "Partners in view: ",
                  "Layout: ", "Step 0/5.", "Last 5 actions: none", "A) NOOP (do nothing)"):  # fmt: skip
        assert field in p, field
    assert "Each turn you take one primitive action" in r.policy.system


def test_compound_rollout_counts_absent_targets_and_executor_failures():
    """Overcooked FC (the kitchen split by a counter): every agent asks for each onion dispenser in turn. A
    dispenser across the counter cannot be reached (the executor refuses: ``executor:NoPath``), a made-up
    target is ``target_absent``; both are counted no-ops (the agent waits), and the counts equal the traces'."""
    r = _roller("overcooked_fc", 6, mode="sample", interface="compound_json", max_new_tokens=16)
    disp = np.asarray(r.lib.info.onion_dispensers)
    turn = collections.Counter()

    def respond(user, aid):
        turn[aid] += 1
        k = turn[aid] % (len(disp) + 1)
        if k == len(disp):
            return '{"action": "pick_onion", "target": [0, 0]}'  # no dispenser there
        return json.dumps({"action": "pick_onion", "target": [int(disp[k][1]), int(disp[k][0])]})

    _script(r, respond)
    res = r.collect([1], jax.random.PRNGKey(0))
    counts = res.parse.as_dict()
    by_trace = collections.Counter(t["parse"] for t in res.traces)
    assert by_trace == collections.Counter({k: v for k, v in counts.items() if v})
    assert counts["target_absent"] > 0 and counts.get("executor:NoPath", 0) > 0
    for t in res.traces:
        assert t["interface"] == "compound_json" and t["action"] == "pick_onion"
        if t["parse"] == "target_absent":
            assert t["option"] == "wait" and t["parse_fail"]
        if t["parse"].startswith("executor:"):
            assert t["outcome"] == "explicit:" + t["parse"].split(":", 1)[1] and t["parse_fail"]
        if t["parse"] == "ok":
            assert t["option"] == "pick_onion" and t["outcome"] != "explicit:NoPath"
    assert res.parse.failures == sum(1 for t in res.traces if t["parse_fail"])
    prompt = res.traces[0]["prompt"]
    assert '- {"action": "pick_onion", "target": [x, y]}' in prompt and "Layout: onions @ " in prompt
    assert "Action menu" not in prompt


def test_parse_stats_lists_interface_reasons():
    s = parsing.ParseStats()
    s.counts.update({"ok": 2, "target_absent": 1, "executor:NoPath": 1})
    d = s.as_dict()
    assert d["target_absent"] == 1 and d["executor:NoPath"] == 1 and d["ok"] == 2 and s.failure_rate == 0.5


@pytest.mark.parametrize(
    "game, cfg",
    [
        ("overcooked_fc", dict(mode="sample", interface="compound_json", temperature=1.0, max_new_tokens=6)),
    ],
)
def test_update_trains_each_interfaces_tokens(tmp_path, game, cfg):
    """A PA-MAGRPO round on a compound-JSON rollout (sampled text; a native decision's letter is trained as the
    menu's choice_only letter is, tests/test_compiled_rollout.py): the batch holds every decision's own prompt and
    response tokens (the response the interface generated), the first epoch's ratios are 1 at the rollout
    temperature, and the adapters move (a 2-agent game: the tiny roller has 2 adapters)."""
    from jaxopt_marl import magrpo, trainer
    from lora import split_model

    r = _roller(game, 3, **cfg)
    # Non-zero B: the KL term then moves the adapters whatever the returns (fresh adapters are the reference).
    adapters = split_model(r.policy.model)[1]
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
    r.policy.set_adapters(
        jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    )
    mcfg = magrpo.MAGRPOConfig.smoke(num_rollouts=2, temperature=1.0, kl_beta=0.5, epochs=1)
    tr = trainer.Trainer(tmp_path, r, mcfg, trainer.TrainConfig(rounds=1, seed=0, skip_zero_advantage=False))
    before = [np.asarray(x) for x in jax.tree.leaves(split_model(r.policy.model)[1])]
    res = r.collect([1, 2], jax.random.PRNGKey(0))
    batch = tr.pack(res, np.array([0.5, -0.5], np.float32))
    d = res.num_decisions
    valid = np.asarray(batch.response_mask)[:d].sum(axis=1)
    assert valid.tolist() == [len(t["response_ids"]) for t in res.traces]
    assert all(t["response_source"] == "model" and t["n_letters"] == 0 for t in res.traces)
    (m,) = tr.train()
    assert m["train/updated"] and m["train/decisions"] > 0
    assert abs(m["train/ratio_mean"] - 1.0) < 1e-5, m["train/ratio_mean"]  # one epoch, one minibatch
    after = [np.asarray(x) for x in jax.tree.leaves(split_model(r.policy.model)[1])]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after)), "adapters never moved"
