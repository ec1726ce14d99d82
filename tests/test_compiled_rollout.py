"""The compiled rollout (issue #11) with a tiny random decoder: determinism, batch and chunk independence, no host
transfer inside a call, the letter shown is the option executed, parity with the host loop, the training batch
built on the device, and epoch-0 PPO ratios of 1 at the rollout temperature."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxopt_marl import compiled_rollout as cr
from jaxopt_marl import guards, magrpo, options, progress, rollout
from jaxopt_marl import train_step as ts
from lora import LoRAConfig, split_model
from tests.helpers import CountingBar, assert_fp32_close

STEPS = 16
CHOICE_STEPS = 8
# One branch (rows padded to 4, one column width): compiles fast; chunking itself is tested separately.
ONE_BRANCH = cr.ChunkConfig(row_sizes=(4,), pad_rows=True, length_step=4096)


def _roller(
    game,
    mode,
    chunks=ONE_BRANCH,
    batch=2,
    temperature=1.0,
    steps=STEPS,
    max_new_tokens=6,
    interface="menu",
    burnin_episodes=0,
    shuffle_letters=True,
):
    """A compiled roller on the tiny random decoder; guards from a uniform burn-in of ``burnin_episodes`` solo +
    as many joint 200-step episodes (none: no guards)."""
    import envs_jax
    from jaxopt_marl import burnin

    env = envs_jax.make(game, max_steps=steps)
    lib = options.get_library(game, env)
    mined = []
    if burnin_episodes:
        env_b = envs_jax.make(game, max_steps=200)
        lib_b = options.get_library(game, env_b)
        res = burnin.run_burnin(lib_b, env_b, burnin_episodes, burnin_episodes, seed=0, chunk=2 * burnin_episodes)
        mined = burnin.synthesize(lib_b, res.codes)
    n = lib.num_agents
    model, tok = rollout.load_policy_model(rollout.TINY_RANDOM, LoRAConfig(num_adapters=n, rank=2, alpha=4.0))
    cfg = rollout.PolicyConfig(
        mode=mode,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        interface=interface,
        shuffle_letters=shuffle_letters,
    )
    return cr.CompiledRoller(
        game, env, lib, guards.compile_guards(mined, lib.vocab), model, tok, cfg, batch=batch, chunks=chunks
    )


@pytest.fixture(scope="module")
def oc_sample():
    return _roller("overcooked_aa", "sample")


@pytest.fixture(scope="module")
def oc_choice():
    # tests/test_trainer.py's roller (tests.helpers.tiny_compiled_roller: 8 steps, one branch of 4 rows): the same
    # program, which the in-process compilation cache (tests/conftest.py) compiles once for both modules.
    return _roller("overcooked_aa", "choice_only", chunks=cr.ChunkConfig.single(4), steps=CHOICE_STEPS)


def _n_logp(r, traces):
    """Float32 roundings on the path of a decision's log-prob through the tiny decoder (tests.helpers.fp32_atol):
    per layer the q/k/v, attention-output, MLP-in and MLP-out reductions (hidden and intermediate sizes), the
    attention scores and mix (head dim, the longest row's positions) and two RMS norms; then the final norm,
    the logit, the log-softmax (a few roundings of the log-prob's size) and the sum over the response tokens."""
    c = r.model.cfg
    t = max(len(x["prompt_ids"]) for x in traces) + r.response_len
    per_layer = 4 * c.hidden_size + 2 * c.intermediate_size + c.head_dim + t
    return c.num_layers * per_layer + 2 * c.hidden_size + 4 + r.response_len


def _logps_close(r, a, b, k=2 * 8.0):
    """Two programs' log-probs of the same decisions agree to float32 error (scale: the largest |log-prob|,
    at least 1, the size of the tiny model's logits)."""
    want = np.array([t["logp"] for t in b])
    scale = max(1.0, np.abs(want).max())
    assert_fp32_close([t["logp"] for t in a], want, _n_logp(r, a), scale=scale, k=k, err_msg="logp")


def _same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_same_seed_same_trajectory_and_no_transfer(oc_sample):
    r = oc_sample
    _, ad, base = split_model(r.model)
    args = r.device_args([3, 4], jax.random.PRNGKey(7))
    ad, base = jax.device_put((ad, base), r._device)
    jax.block_until_ready(r._fn(base, ad, *args))  # compile outside the guard
    with jax.transfer_guard("disallow"):
        a = r._fn(base, ad, *args)
        b = r._fn(base, ad, *args)
        jax.block_until_ready((a, b))
    _same(a, b)
    assert int(a.decisions.count) > 0 and int(a.waves) > 0
    # Every step of both episodes was recorded, and the primitive actions are valid.
    assert (np.asarray(a.traj["positions"]) >= 0).all()
    acts = np.asarray(a.traj["actions"])
    assert acts.min() >= 0 and acts.max() < 6


def test_progress_after_every_wave_changes_nothing(oc_choice):
    """``progress=True`` reports the slowest episode's env step after every wave (from inside the program) and
    changes no output: the same call without it gives the same arrays bit for bit."""
    r = oc_choice
    _, ad, base = split_model(r.model)
    plain = jax.block_until_ready(r.run(ad, base, [3, 4], jax.random.PRNGKey(7)))
    bar = CountingBar()
    with progress.route(bar, offset=r.steps):
        shown = jax.block_until_ready(r.run(ad, base, [3, 4], jax.random.PRNGKey(7), progress=True))
        jax.effects_barrier()
    _same(plain, shown)
    assert bar.n == 2 * r.steps  # the offset + the last step of the slowest episode
    # Moved during the call, at most once per turn of the loop: the first turn only advances, then one per wave
    # (each of which now steps the env: an agent decides at most once per env step).
    assert 1 < bar.calls <= int(shown.waves) + 1
    # collect(progress=True) plays several calls on one tqdm bar and returns what collect() does.
    key = jax.random.PRNGKey(3)
    a, b = r.collect([5, 6, 7], key, progress=True), r.collect([5, 6, 7], key)
    np.testing.assert_array_equal(a.returns, b.returns)
    assert [(t["step"], t["response_ids"]) for t in a.traces] == [(t["step"], t["response_ids"]) for t in b.traces]


def test_episode_independent_of_its_batch(oc_sample):
    """Every draw comes from the episode's own keys: seed 4 plays the same in batch [3, 4] and in [4, 9]."""
    r = oc_sample
    key = jax.random.PRNGKey(1)
    x = r.collect([3, 4], key)
    y = r.collect([4, 9], key)
    tx = [t for t in x.traces if t["seed"] == 4]
    ty = [t for t in y.traces if t["seed"] == 4]
    strip = lambda t: {k: v for k, v in t.items() if k != "rollout"}
    assert [strip(t) for t in tx] == [strip(t) for t in ty] and tx
    np.testing.assert_array_equal(x.traj["positions"][1], y.traj["positions"][0])
    np.testing.assert_array_equal(x.traj["actions"][1], y.traj["actions"][0])
    # An odd number of seeds is played in calls of K (the last padded) with the same episodes.
    z = r.collect([3, 4, 9], key)
    assert [strip(t) for t in z.traces if t["seed"] == 4] == [strip(t) for t in tx]
    np.testing.assert_array_equal(z.returns[[0, 2]], [x.returns[0], y.returns[1]])


def _menu_line(prompt_text: str, letter: str) -> str:
    m = re.search(rf"^{letter}\) (.*)$", prompt_text.split("Action menu:\n", 1)[1], re.M)
    return m.group(1)


def _check_letters(r, res):
    lib = r.lib
    ok = [t for t in res.traces if not t["parse_fail"]]
    assert ok, "no parsed decision to check"
    for t in res.traces:
        assert t["prompt_text"] == r.tok.decode(t["prompt_ids"], skip_special_tokens=False)
        assert t["prompt_ids"][: len(r.prefix_ids)] == list(r.prefix_ids)
        assert t["prompt"] in t["prompt_text"]
        if t["parse_fail"]:
            assert t["option"] in ("wait", "idle")
            continue
        line = _menu_line(t["prompt_text"], t["choice"])
        tgt = None if t["target"] is None else (t["target"][1], t["target"][0])  # (row, col)
        assert line == lib.label(lib.option_id(t["option"]), tgt)
        assert f"{t['choice']}) {line}" in t["menu"]
    return ok


def test_letter_shown_is_option_executed(oc_choice):
    _check_letters(oc_choice, oc_choice.collect([5, 6], jax.random.PRNGKey(2)))


class _Scripted(cr.CompiledRoller):
    """Sample mode whose "LLM" always answers ``choice: B`` (then the end token; 4 of the 6 response tokens)."""

    def _model_rows(self, model, kv, ids, mask, adapter, keys, live):
        toks = self.tok("choice: B", add_special_tokens=False)["input_ids"] + [self.eos_ids[0]]
        m = self.response_len
        row = jnp.asarray((toks + [self.pad_id] * m)[:m], jnp.int32)
        n = ids.shape[0]
        return (
            jnp.broadcast_to(row, (n, m)),
            jnp.broadcast_to(jnp.arange(m) < len(toks), (n, m)) & live[:, None],
            jnp.zeros((n,), jnp.float32),
        )


def test_sample_mode_parses_on_device_and_starts_the_letter(oc_sample):
    """A random decoder writes garbage: every failure is counted and makes the agent wait, and the device parse
    agrees with the host parser on every response. A scripted answer "choice: B" starts the menu's line B."""
    res = oc_sample.collect([5, 6], jax.random.PRNGKey(2))
    assert res.parse.failures > 0 and res.parse_mismatch == 0
    assert all(t["option"] in ("wait", "idle") for t in res.traces if t["parse_fail"])
    r = oc_sample
    scripted = _Scripted(r.game, r.env, r.lib, r.guards, r.model, r.tok, r.cfg, batch=2, chunks=ONE_BRANCH)
    res = scripted.collect([5, 6], jax.random.PRNGKey(2))
    assert res.parse_mismatch == 0
    ok = _check_letters(scripted, res)
    assert {t["choice"] for t in ok} == {"B"}
    assert all(t["response"] == "choice: B" for t in res.traces)
    assert all(t["parse"] == "invalid_letter" for t in res.traces if t["parse_fail"])  # menus of one line


@pytest.fixture(scope="module")
def cu_padded():
    """Cleanup (7 agents), rows padded to 16 (every wave in one call), one column width."""
    return _roller(
        "cleanup", "choice_only", steps=10, chunks=cr.ChunkConfig(row_sizes=(16,), pad_rows=True, length_step=4096)
    )


def test_chunking_does_not_change_decisions(cu_padded):
    """Exact chunks (2, 1) with 256-token column buckets and one padded chunk per wave give the same
    decisions: every row samples with its own key, whatever shares its call."""
    key = jax.random.PRNGKey(3)
    exact = _roller("cleanup", "choice_only", steps=10, chunks=cr.ChunkConfig(row_sizes=(2, 1), length_step=256))
    outs = [r.collect([11, 12], key) for r in (exact, cu_padded)]
    first = [(t["seed"], t["step"], t["aid"], t["choice"], t["prompt_ids"]) for t in outs[0].traces]
    assert len(first) > 14  # several agents decide per wave
    assert max(len(t["prompt_ids"]) for t in outs[0].traces) - min(len(t["prompt_ids"]) for t in outs[0].traces) > 20
    assert [(t["seed"], t["step"], t["aid"], t["choice"], t["prompt_ids"]) for t in outs[1].traces] == first
    _logps_close(cu_padded, outs[0].traces, outs[1].traces)  # other chunks: other matmul blockings


@pytest.mark.parametrize("fixture", ["oc_sample", "oc_choice"])
def test_training_batch_and_epoch0_ratio(fixture, request):
    """The device-built batch equals the host packing of the traces, and the update's own scoring of every
    decision at the rollout temperature reproduces the rollout's log-prob: epoch-0 ratios are 1 within float32
    error."""
    r = request.getfixturevalue(fixture)
    res = r.collect([7, 8], jax.random.PRNGKey(4))
    adv = np.array([0.5, -0.5], np.float32)
    batch = cr.decision_batch(r, res, adv, row_multiple=8, prefix=r.prefix_ids)
    d = res.num_decisions
    host = ts.pack_decisions(
        [t["prompt_ids"] for t in res.traces],
        [t["response_ids"] for t in res.traces],
        [t["aid"] for t in res.traces],
        [float(adv[t["rollout"]]) for t in res.traces],
        pad_id=r.pad_id,
        prompt_len=batch.tokens.shape[1] - r.response_len,
        response_len=r.response_len,
        prefix=r.prefix_ids,
        choices=[[int(x) for x in r.letter_ids[: t["n_letters"]]] for t in res.traces]
        if r.cfg.mode == "choice_only"
        else None,
    )
    for name in ("tokens", "attention_mask", "response_mask", "agent_ids", "advantages"):
        np.testing.assert_array_equal(
            np.asarray(getattr(batch, name))[:d], np.asarray(getattr(host, name)), err_msg=name
        )
    assert not np.asarray(batch.valid)[d:].any() and np.asarray(batch.valid)[:d].all()
    assert batch.tokens.shape[0] % 64 == 0
    mcfg = magrpo.MAGRPOConfig.smoke(temperature=r.cfg.temperature, micro_batch=8)
    graphdef, adapters, base = split_model(r.model)
    step = ts.make_train_step(graphdef, mcfg, ts.make_mesh(1), num_adapters=r.n)
    score = np.asarray(step.score(base, adapters, batch, jnp.asarray(step.adapter_ids(batch.agent_ids))))[:d]
    logp = np.array([t["logp"] for t in res.traces])
    # Two programs (the rollout's cached decode or letter draw, the update's full-row forward) round each
    # decision's log-prob sum apart by float32 error, per decision: its summed terms are its response tokens'
    # log-probs (near -log(49152) = -10.8 each for a random decoder, all negative: |sum| is their magnitude)
    # and logits (about 1 each). A ratio exp(d) near 1 is off from 1 by |d| (1 + O(d)).
    scale = np.abs(logp) + r.response_len
    assert_fp32_close(np.exp(score - logp), np.ones_like(logp), _n_logp(r, res.traces), scale=scale, k=2 * 8.0)


def test_reference_and_idled_agents(oc_choice):
    r = oc_choice
    ref = r.collect([1, 2], jax.random.PRNGKey(0), reference=True)
    pol = r.collect([1, 2], jax.random.PRNGKey(0))
    # Fresh adapters (B = 0) are the reference policy: the same key plays the same episodes.
    assert [t["choice"] for t in ref.traces] == [t["choice"] for t in pol.traces]
    assert all(t["reference"] for t in ref.traces)
    solo = r.collect([1, 2], jax.random.PRNGKey(0), active=np.array([True, False]))
    assert {t["aid"] for t in solo.traces} == {0}
    # Per-episode masks: agent 0 alone in episode 0, agent 1 alone in episode 1, in one call.
    mixed = r.collect([1, 2], jax.random.PRNGKey(0), active=np.array([[True, False], [False, True]]))
    assert {(t["rollout"], t["aid"]) for t in mixed.traces} == {(0, 0), (1, 1)}


def test_replay_reproduces_the_episode(oc_choice):
    r = oc_choice
    res = r.collect([21, 22], jax.random.PRNGKey(5))
    frames = r.replay_frames(22, jax.random.PRNGKey(5), res.traj["actions"][1])
    assert frames.shape[0] == CHOICE_STEPS and frames.dtype == np.uint8
    # The replayed final state renders like the rollout's final state.
    import envs_jax  # noqa: F401

    env = r.env
    _, state = env.reset(jax.random.PRNGKey(22))
    env_key = rollout.episode_keys(jax.random.PRNGKey(5), jnp.asarray([22]))[0][0]
    step = jax.jit(lambda k, s, a: env.step_env(k, s, {ag: a[i] for i, ag in enumerate(env.agents)})[1])
    for t in range(CHOICE_STEPS):
        state = step(jax.random.fold_in(env_key, t), state, jnp.asarray(res.traj["actions"][1, t], jnp.int32))
        np.testing.assert_array_equal(np.asarray(env.agent_positions(state)), res.traj["positions"][1, t])
    np.testing.assert_array_equal(frames[-1], np.asarray(env.render(state)))


def test_bad_input(oc_choice):
    with pytest.raises(ValueError, match="K=2"):
        oc_choice.device_args([1, 2, 3], jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="active"):
        oc_choice.collect([1, 2], jax.random.PRNGKey(0), active=np.ones((3,), bool))
    with pytest.raises(ValueError, match="row_sizes"):
        cr.ChunkConfig(row_sizes=(4, 8))
    with pytest.raises(ValueError, match="end with 1"):
        cr.ChunkConfig(row_sizes=(8, 4))


def _assert_host_parity(r, seeds, key):
    """Plays ``seeds`` with the compiled roller ``r`` and with the host loop on the same model, library, guards
    and keys; asserts equal traces (every field the host writes but ``logp``, which agrees to float32 error),
    returns and trajectories. Returns ``(compiled, host)`` results."""
    pol = rollout.LLMPolicy(r.model, r.tok, r.game, r.cfg)
    host = rollout.Roller(r.game, r.env, r.lib, r.guards, pol, menu_seed=0)
    a = r.collect(seeds, key)
    b = host.collect(seeds, key)
    assert len(a.traces) == len(b.traces) > 0
    for x, y in zip(a.traces, b.traces):
        for f in (
            "rollout",
            "seed",
            "step",
            "aid",
            "prompt",
            "menu",
            "response",
            "response_source",
            "choice",
            "option",
            "target",
            "outcome",
            "interface",
            "n_letters",
            "prompt_text",
            "prompt_ids",
            "response_ids",
        ):
            assert x[f] == y[f], (f, x[f], y[f])
        assert x["prompt_ids"] == b.decisions[b.traces.index(y)][2].prompt_ids
    _logps_close(r, a.traces, b.traces)  # the compiled wave vs the host loop's per-wave forward
    np.testing.assert_array_equal(a.returns, b.returns)
    for k in ("positions", "rewards", "alive", "options", "actions"):
        np.testing.assert_array_equal(a.traj[k], b.traj[k], err_msg=k)
    return a, b


def test_host_loop_parity(cu_padded):
    """The host loop (Python menus, prompts and tokenizer per wave) is the compiled rollout's reference: with
    the same keys both play the same episodes -- prompts, letters, options and outcomes."""
    _assert_host_parity(cu_padded, [31, 32], jax.random.PRNGKey(9))


@pytest.mark.parametrize("game, steps", [("cleanup", 3), ("overcooked_aa", 4)])
def test_host_loop_parity_native(game, steps):
    """The native interface (paper §4: primitive actions as a fixed-letter menu, no guards) in the compiled
    rollout plays the host loop's episodes: the same native prompts (layout hint, "actions" memory), the letters
    in the simulator's order, one decision per present agent per env step (one wave per step)."""
    from jaxopt_marl import interfaces

    r = _roller(game, "choice_only", chunks=cr.ChunkConfig.single(4), steps=steps, interface="native")
    assert isinstance(r.lib, interfaces.NativeLibrary) and r.guards.opt.shape[0] == 0
    a, _ = _assert_host_parity(r, [5, 6], jax.random.PRNGKey(4))
    actions = interfaces.native_actions(game)
    present = np.concatenate([np.ones_like(a.traj["alive"][:, :1]), a.traj["alive"][:, :-1]], axis=1)
    assert a.num_decisions == int(present.sum()) and a.waves == steps  # call ratio 1: a wave per env step
    for t in a.traces:
        assert t["interface"] == "native" and t["n_letters"] == len(actions) and t["parse"] == "ok"
        assert t["menu"] == [f"{c}) {name} ({what})" for c, (name, what) in zip("ABCDEFGHI", actions)]
        assert a.traj["actions"][t["rollout"], t["step"], t["aid"]] == r.lib.option_names.index(t["option"])
        assert "\nLayout: " in t["prompt"] and "- Last 5 actions: " in t["prompt"]
    assert "primitive action" in a.traces[0]["prompt_text"]  # the native system turn


def test_one_letter_menus_cost_no_model_compute():
    """``choice_only`` over Forced Coordination's guarded menus (about half have a single letter, ``wait``, here
    and 76% in 400-step episodes): a one-letter draw has one outcome and log-prob exactly 0, so the compiled rollout
    runs the LLM only on the menus of two or more letters, and still plays the host loop's episodes (which runs it
    on every decision)."""
    r = _roller("overcooked_fc", "choice_only", chunks=cr.ChunkConfig.single(4), steps=24, burnin_episodes=10)
    a, _ = _assert_host_parity(r, [3, 4], jax.random.PRNGKey(5))
    n_let = np.array([t["n_letters"] for t in a.traces])
    assert (n_let == 1).sum() > 5 and (n_let >= 2).sum() > 5, np.bincount(n_let)
    assert a.model_rows == (n_let >= 2).sum()
    assert all(t["logp"] == 0.0 and t["choice"] == "A" for t in a.traces if t["n_letters"] == 1)


def test_an_option_failing_at_its_start_costs_the_step():
    """An option that fails at its start (here: no guards, so many shown options cannot start) terminates at
    once and its agent idles that env step, deciding again at the next: at most one decision per agent per env
    step, so the K x N x T decision buffers cannot overflow (this 8-step Forced Coordination case once made 35
    decisions for 32 slots, up to 7 by one agent in one step), and the host loop plays the same rule."""
    r = _roller("overcooked_fc", "choice_only", chunks=cr.ChunkConfig.single(4), steps=8)
    a, _ = _assert_host_parity(r, [7, 8], jax.random.PRNGKey(4))
    keys = [(t["rollout"], t["aid"], t["step"]) for t in a.traces]
    assert len(keys) == len(set(keys)) <= 2 * 2 * 8
    nxt = {}
    for t in a.traces:
        nxt.setdefault((t["rollout"], t["aid"]), []).append(t)
    retried = [
        (x, y)
        for seq in nxt.values()
        for x, y in zip(seq, seq[1:])
        if x["outcome"].startswith("explicit:") and y["step"] == x["step"] + 1
    ]
    assert len(retried) >= 3  # start failures, each followed by a decision at the next step


def test_fixed_letters_follow_the_menu_construction_order(oc_choice):
    """``letters="fixed"`` (a diagnostic, not the paper's shuffle): the shown instances get A, B, C, ... in their
    slot order, in the compiled rollout and the host loop alike; the shuffle (``oc_choice``) does not."""
    from jaxopt_marl import interfaces

    def in_order(res):
        dec = res.device[0].decisions
        let = np.asarray(dec.menu_letters)[: int(dec.count)]
        return (let == interfaces.fixed_letters(let >= 0)).all(axis=1)

    r = _roller("overcooked_aa", "choice_only", chunks=cr.ChunkConfig.single(4), steps=8, shuffle_letters=False)
    a, _ = _assert_host_parity(r, [5, 6], jax.random.PRNGKey(2))
    assert in_order(a).all() and a.num_decisions > 10
    assert not in_order(oc_choice.collect([5, 6], jax.random.PRNGKey(2))).all()
