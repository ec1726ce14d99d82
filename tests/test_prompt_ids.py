"""Device prompt assembly (jaxopt_marl.prompt_ids): exact ids against the host rendering + tokenizer, memory
semantics, hand-checked text, other split regexes, and the construction errors."""

import copy
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from jaxopt_marl import interfaces, macro, menus, options, prompt_ids, prompts
from jaxopt_marl.options.harvest import HarvestOptions
from jaxopt_marl.rollout import smollm2_tokenizer
from lora.tokenizer import _pre_tokenizer, render_chat

GAMES = ("cleanup", "harvest", "overcooked_aa", "overcooked_fc")
#: Random decisions checked per game (each in both modes).
DECISIONS = 1000
#: Random-macro episodes per game and their length (env steps).
SEEDS, EPISODE_STEPS = 6, 60
#: The ``Step t/T`` total of the prompts.
MAX_STEPS = 1000
# Guard-mask kinds of the random menus.
ALL_SHOWN, ONE_LINE, RANDOM_SUBSET, NONE_SHOWN = range(4)
#: XLA options of the test programs: compiling dominates this file on a 2-core CPU and the programs run once, so
#: no backend optimisation (about half the compile time).
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _run(fn, *args):
    """``jax.jit(fn)(*args)`` compiled with :data:`FAST_COMPILE`."""
    return jax.jit(fn).lower(*args).compile(FAST_COMPILE)(*args)


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@functools.cache
def _setup(game, library=options.CANONICAL):
    env = envs_jax.make(game)
    return env, options.get_library(game, env, library=library)


@functools.cache
def _ids(game, mode, tok_key="smollm2", library=options.CANONICAL):
    env, lib = _setup(game, library)
    tok = smollm2_tokenizer() if tok_key == "smollm2" else _regex_tokenizer(tok_key)
    return prompt_ids.PromptIds(game, env, lib, tok, mode=mode, max_steps=MAX_STEPS)


@functools.cache
def _regex_tokenizer(pre):
    """SmolLM2's vocab with another split regex (``lora.tokenizer._pre_tokenizer``: ``qwen2``, ``llama3``)."""
    tok = copy.deepcopy(smollm2_tokenizer())
    tok.backend_tokenizer.pre_tokenizer = _pre_tokenizer(pre)
    return tok


# ---------------------------------------------------------------------------------------------------------
# Random decision states
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def _episodes(game, library=options.CANONICAL):
    """Env states of SEEDS random-macro episodes (``macro.uniform_policy``), flattened: [SEEDS * STEPS]."""
    env, lib = _setup(game, library)
    step = macro.make_macro_step(lib, env)

    def episode(key):
        ms = macro.init(lib, env, key, jnp.ones((lib.num_agents,), bool), jnp.bool_(False))

        def body(ms, k):
            ms, _ = step(ms, k)
            return ms, ms.env

        return jax.lax.scan(body, ms, jax.random.split(jax.random.fold_in(key, 1), EPISODE_STEPS))[1]

    states = _run(jax.vmap(episode), jax.random.split(jax.random.PRNGKey(7), SEEDS))
    return jax.tree.map(lambda x: np.asarray(x).reshape((-1,) + x.shape[2:]), states)


def _extremes(game, states, rng):
    """Edits a share of the sampled states (numpy, leading axis B): steps 0 / 999 / 1000 / huge, team values with
    many digits, agents on edge / wall cells (unreachable targets), zapped partners, soups held and on counters."""
    b = states.step.shape[0]
    pick = lambda p: rng.random(b) < p
    step = np.where(pick(0.3), rng.choice([0, 999, 1000, 123456789, 2**31 - 1], b), states.step).astype(np.int32)
    states = states.replace(step=step)
    many = 10 ** rng.integers(1, 10, b) + rng.integers(0, 10, b)  # 2..10 digits, exact in float32 up to 2**24
    many = np.minimum(many, 2**24)
    if prompts.family(game) == "overcooked":
        from jaxmarl.environments.overcooked_v2.common import DynamicObject as D

        env, lib = _setup(game)
        core = states.core
        soup = int(D.PLATE | D.COOKED | (3 << 2))
        inv = np.where(rng.random(core.agents.inventory.shape) < 0.15, soup, core.agents.inventory)
        h, w = lib.shape
        edge = pick(0.1)[:, None]
        x = np.where(edge, rng.choice([0, w - 1], (b, 2)), core.agents.pos.x)
        y = np.where(edge, rng.integers(0, h, (b, 2)), core.agents.pos.y)
        grid = np.array(core.grid)
        ctr = lib.counters
        items = rng.choice([0, int(D.ingredient(0)), int(D.PLATE), soup], (b, len(ctr)))
        on = pick(0.3)[:, None]
        grid[:, ctr[:, 0], ctr[:, 1], 1] = np.where(on, items, grid[:, ctr[:, 0], ctr[:, 1], 1])
        agents = core.agents.replace(
            inventory=inv.astype(core.agents.inventory.dtype),
            pos=core.agents.pos.replace(x=x.astype(np.int32), y=y.astype(np.int32)),
        )
        deliveries = np.where(pick(0.3), many, states.deliveries).astype(np.int32)
        return states.replace(core=core.replace(agents=agents, grid=grid), deliveries=deliveries)
    h, w = states.apples.shape[1:]
    pos = np.array(states.pos)
    edge = pick(0.15)
    for i in np.flatnonzero(edge):  # one agent to an edge-adjacent cell or onto the outer wall (unreachable)
        a = rng.integers(0, pos.shape[1])
        pos[i, a] = (
            [rng.choice([0, 1, h - 2, h - 1]), rng.integers(0, w)]
            if rng.random() < 0.5
            else [rng.integers(0, h), rng.choice([0, 1, w - 2, w - 1])]
        )
    alive = np.array(states.alive) & ~(rng.random(states.alive.shape) < 0.1)
    apples_total = np.array(states.apples_total)
    apples_total[:, 0] = np.where(pick(0.3), many, apples_total[:, 0])
    return states.replace(pos=pos, alive=alive, apples_total=apples_total.astype(np.int32))


def _decisions(game, rng, n, library=options.CANONICAL):
    """``n`` random decisions: (states [n], aids int32[n], guard kind int32[n], u float32[n, I], letter keys,
    memories AgentMemory[n])."""
    env, lib = _setup(game, library)
    flat = _episodes(game, library)
    idx = rng.integers(0, flat.step.shape[0], n)
    states = _extremes(game, jax.tree.map(lambda x: x[idx], flat), rng)
    aids = rng.integers(0, lib.num_agents, n).astype(np.int32)
    kind = rng.choice([ALL_SHOWN, ONE_LINE, RANDOM_SUBSET, NONE_SHOWN], n, p=[0.15, 0.15, 0.65, 0.05])
    u = rng.random((n, lib.num_instances)).astype(np.float32)
    team = np.asarray(states.deliveries if prompts.family(game) == "overcooked" else states.apples_total.sum(-1))
    k = rng.integers(0, prompts.MEMORY_MACROS + 1, n)
    codes = rng.integers(0, prompt_ids.IDLE_CODE(lib) + 1, (n, prompts.MEMORY_MACROS))
    codes[rng.random(n) < 0.2, -1] = prompt_ids.IDLE_CODE(lib)
    macros = np.where(np.arange(prompts.MEMORY_MACROS) >= prompts.MEMORY_MACROS - k[:, None], codes, -1)
    last = np.floor(team * rng.random(n)).astype(np.float32)
    mems = prompt_ids.AgentMemory(jnp.asarray(macros, jnp.int32), jnp.asarray(last))
    keys = jax.random.split(jax.random.PRNGKey(int(rng.integers(1 << 30))), n)
    return jax.tree.map(jnp.asarray, states), jnp.asarray(aids), jnp.asarray(kind), jnp.asarray(u), keys, mems


def _shown(inst, kind, u):
    """The guard mask of one random menu: all valid instances, one, a random subset, or none."""
    one = jnp.arange(u.shape[0]) == jnp.argmin(jnp.where(inst.valid, u, 2.0))
    return inst.valid & jnp.select(
        [kind == ALL_SHOWN, kind == ONE_LINE, kind == RANDOM_SUBSET],
        [jnp.ones_like(inst.valid), one, u < 0.6],
        jnp.zeros_like(inst.valid),
    )


#: Real decisions of these games are also assembled with SmolLM2's vocab under another split regex.
OTHER_REGEX = {"cleanup": "qwen2", "overcooked_fc": "llama3"}
_COMPILED = {}


def _builders(game, library=options.CANONICAL):
    """The PromptIds a game's decisions are assembled with: both modes (+ another split regex, canonical only)."""
    out = [_ids(game, "sample", library=library), _ids(game, "choice_only", library=library)]
    other = game in OTHER_REGEX and library == options.CANONICAL
    return out + ([_ids(game, "choice_only", OTHER_REGEX[game])] if other else [])


def _device(game, states, aids, kind, u, keys, mems, letters=None, library=options.CANONICAL):
    """Instances, letters, every builder's (ids, lengths) and the state label code of a batch of decisions: one
    program, vmapped, compiled once per game, library and batch shape. ``letters`` (``int32[B, I]``) replaces the
    random menus."""
    _, lib = _setup(game, library)
    builders = _builders(game, library)
    if letters is None:
        letters = np.full((aids.shape[0], lib.num_instances), -2, np.int32)

    def one(s, a, k, uu, key, mem, forced):
        inst = lib.instances(s, a)
        drawn = menus.assign_letters(key, _shown(inst, k, uu))
        let = jnp.where(forced[0] == -2, drawn, forced)
        return (
            inst,
            let,
            [p.suffix(s, a, inst, let, mem) for p in builders],
            prompt_ids.state_label_code(game, lib, s, a),
        )

    args = (states, aids, kind, u, keys, mems, jnp.asarray(letters, jnp.int32))
    sig = (game, library, str(jax.tree.map(lambda x: (x.shape, x.dtype), args)))
    if sig not in _COMPILED:
        _COMPILED[sig] = jax.jit(jax.vmap(one)).lower(*args).compile(FAST_COMPILE)
    return jax.tree.map(np.asarray, _COMPILED[sig](*args))


def _scripted(game, state, aid, mem, letters=None):
    """One scripted decision run through the game's batch program (DECISIONS copies): (inst, ids of every
    builder). Without ``letters``: every valid instance on the menu."""
    _, lib = _setup(game)
    tile = lambda x: jnp.asarray(np.broadcast_to(np.asarray(x), (DECISIONS,) + np.shape(x)))
    keys = jax.random.split(jax.random.PRNGKey(0), DECISIONS)
    args = (
        jax.tree.map(tile, state),
        tile(np.int32(aid)),
        tile(np.int64(ALL_SHOWN)),
        tile(np.zeros(lib.num_instances, np.float32)),
        keys,
        jax.tree.map(tile, mem),
    )
    forced = None if letters is None else np.broadcast_to(np.asarray(letters, np.int32), (DECISIONS, len(letters)))
    inst, _, outs, _ = _device(game, *args, letters=forced)
    builders = _builders(game)
    return jax.tree.map(lambda x: x[0], inst), [
        ids[0, p.max_len - n[0] :].tolist() for p, (ids, n) in zip(builders, outs)
    ]


def _compare(p, tok, texts, ids, lens):
    """Number of decisions whose ids differ from tokenizing the host reference ``texts`` (asserting the decode
    and the padding on the way)."""
    enc = tok(texts, add_special_tokens=False)["input_ids"]
    bad = 0
    for b, (text, want) in enumerate(zip(texts, enc)):
        n = int(lens[b])
        got = ids[b, p.max_len - n :].tolist()
        assert (ids[b, : p.max_len - n] == p.pad_id).all()
        bad += got != list(want)
        assert tok.decode(list(p.prefix_ids) + got) == p.prefix_text + text
    return bad


@pytest.mark.parametrize("game", GAMES)
def test_device_ids_equal_host_tokenization(game, tok):
    """1,000 random decisions per game, both modes: device ids == tok(render_chat(...)) with the system prefix
    stripped as LLMPolicy does (+ the choice_only response prefix), and decode(prefix + ids) == the rendering."""
    rng = np.random.default_rng(GAMES.index(game))
    states, aids, kind, u, keys, mems = _decisions(game, rng, DECISIONS)
    builders = _builders(game)
    inst, letters, outs, label = _device(game, states, aids, kind, u, keys, mems)
    refs = builders[0].reference_by_mode(jax.tree.map(np.asarray, states), np.asarray(aids), inst, letters, mems)
    bad, lens = [], []
    for p, (ids, n) in zip(builders, outs):
        bad.append(_compare(p, p.tok, refs[p.mode], ids, n))
        lens.append(n)
        assert n.max() <= p.max_len
    print(
        f"{game}: mismatches {bad} of {DECISIONS} (sample, choice_only{', ' + OTHER_REGEX.get(game, '')}); "
        f"median length {[float(np.median(n)) for n in lens]}, longest {[int(n.max()) for n in lens]}; "
        f"max_len {[p.max_len for p in builders]}"
    )
    assert bad == [0] * len(builders)
    # The random decisions reach the extremes the scheme must survive.
    texts = refs["choice_only"]
    n_lines = (letters >= 0).sum(-1)
    assert {0, 1}.issubset(set(n_lines.tolist())) and (n_lines == inst.valid.sum(-1)).any()
    assert any("/1000." in t and "Step 1000/" in t for t in texts) and any("Step 999/" in t for t in texts)
    assert any("Step 2147483647/" in t for t in texts)
    assert any(re.search(r"episode total \d{7,}\)", t) for t in texts)  # team values with many digits
    assert any("decided: none\n" in t for t in texts)
    assert any("idle\n- Team" in t and t.count(", ", t.index("decided:"), t.index("\n- Team")) == 4 for t in texts)
    assert "unreachable" in "".join(texts)
    fam = prompts.family(game)
    for t, code in zip(texts[:200], label[:200]):  # state_label_code == prompts.state_label (in the text)
        assert t.endswith(f"state: {prompts.STATE_LABELS[fam][int(code)]}\nchoice:")
    assert len(set(label.tolist())) >= 2


@pytest.mark.parametrize("pre", ["qwen2", "llama3"])
def test_other_split_regexes(pre, tok):
    """SmolLM2's vocab with the Qwen2 / Llama-3 split regexes tokenizes differently (runs of newlines), yet the
    fragment scheme holds for every game (the construction check raises otherwise; real decisions:
    :func:`test_device_ids_equal_host_tokenization`)."""
    rtok = _regex_tokenizer(pre)
    s = "Step 4/150.\n\nMemory:"
    assert rtok(s, add_special_tokens=False)["input_ids"] != tok(s, add_special_tokens=False)["input_ids"]
    for game in GAMES:
        assert _ids(game, "choice_only", pre).max_len > 0
    assert _ids("harvest", "sample", pre).max_len > 0


# ---------------------------------------------------------------------------------------------------------
# Hand-checked cases
# ---------------------------------------------------------------------------------------------------------


def test_hand_checked_overcooked_suffix(tok):
    """AA at reset, player 0, a 3-line menu, one remembered macro, step and team edited: the whole suffix text."""
    game = "overcooked_aa"
    env, lib = _setup(game)
    p = _ids(game, "choice_only")
    _, s = env.reset(jax.random.PRNGKey(0))
    s = s.replace(step=jnp.int32(1000), deliveries=jnp.int32(1234567))
    mem = prompt_ids.remember(prompt_ids.empty_memory(), jnp.int32(prompt_ids.IDLE_CODE(lib)), jnp.float32(1234500))
    mem = prompt_ids.remember(mem, jnp.int32(lib.option_id("pick_onion")), jnp.float32(1234560))
    inst, _ = _scripted(game, s, 0, mem)
    opt = np.asarray(inst.opt)
    wait = int(np.flatnonzero(opt == lib.option_id("wait"))[0])
    pots = np.flatnonzero(opt == lib.option_id("place_in_pot"))
    letters = np.full(lib.num_instances, -1)
    letters[[wait, pots[0], pots[1]]] = [1, 0, 2]  # A) pot 0, B) wait, C) pot 1
    got = _scripted(game, s, 0, mem, letters)[1][1]
    # AA at reset: player 0 at (row 3, col 2) facing West, player 1 at (row 3, col 5) facing East; pots at
    # (row 2, col 4) and (row 3, col 4).
    assert np.asarray(env.agent_positions(s)).tolist() == [[3, 2], [3, 5]]
    assert np.asarray(env.agent_facing(s)).tolist() == [3, 2] and lib.info.pots.tolist() == [[2, 4], [3, 4]]
    w = lib.info.width
    d = lambda t, who: int(lib.pose_dist[t[0] * w + t[1], (3 * w + 2, 3 * w + 5)[who]])
    user = (
        "You are player 0. World position: (2, 3).\n"
        "Facing: West. Holding: nothing.\n"
        "Partner (player 1): pos=(5, 3) facing=East holding=nothing.\n\n"
        f"Pots:\n  - pot@(4, 2): 0/3 onions; you: {d((2, 4), 0)} | partner: {d((2, 4), 1)}\n"
        f"  - pot@(4, 3): 0/3 onions; you: {d((3, 4), 0)} | partner: {d((3, 4), 1)}\n"
        "Counters: (empty)\nStep 1000/1000.\n\nMemory:\n- Last 5 macros decided: idle, pick_onion\n"
        "- Team reward since your last decision: 7 (episode total 1234567)\n\n"
        "Action menu:\nA) place held item in pot @ (4, 2)\nB) wait\n"
        "C) place held item in pot @ (4, 3)\n\nChoose one. Reply with exactly two lines."
    )
    full = render_chat(tok, [{"role": "system", "content": p.system}, {"role": "user", "content": user}])
    assert full.startswith(p.prefix_text)
    want_text = full[len(p.prefix_text) :] + "state: empty\nchoice:"
    assert tok.decode(got) == want_text
    assert got == tok(want_text, add_special_tokens=False)["input_ids"]
    # Numbers are digit tokens (SmolLM2 isolates digits): "1234567" is 7 tokens.
    digits = [tok.convert_tokens_to_ids(c) for c in "1234567"]
    assert any(got[i : i + 7] == digits for i in range(len(got)))
    assert p.letter_ids.tolist() == [tok(f" {c}", add_special_tokens=False)["input_ids"][0] for c in menus.LETTERS]


def test_hand_checked_cleanup_window_text(tok):
    """Clean Up: player 0 facing North with an apple 9 rows ahead (in its window), another 3 rows behind (out of
    it), a partner 2 behind (out of view): the text lists exactly what the 11x11 window holds."""
    game = "cleanup"
    env, lib = _setup(game)
    p = _ids(game, "sample")
    _, s = env.reset(jax.random.PRNGKey(0))
    apples = np.zeros(lib.shape, bool)
    apples[6, 12] = True  # 9 ahead of (15, 12): in view
    apples[18, 12] = True  # 3 behind: out of view
    pos = np.asarray(s.pos).copy()
    pos[0], pos[1] = (15, 12), (17, 12)  # partner 2 rows behind: out of the window (1 behind)
    s = s.replace(
        pos=jnp.asarray(pos),
        facing=s.facing.at[0].set(0),
        apples=jnp.asarray(apples),
        dirt=jnp.zeros(lib.shape, bool),
        step=jnp.int32(3),
    )
    others = [j for j in range(2, lib.num_agents)]
    s = s.replace(alive=s.alive.at[jnp.asarray(others)].set(False))
    letters = np.full(lib.num_instances, -1)
    letters[int(np.flatnonzero(lib.slot_opt == lib.option_id("wait"))[0])] = 0
    got = _scripted(game, s, 0, prompt_ids.empty_memory(), letters)[1][0]
    assert p.mode == "sample" and tok.decode(got).endswith("<|im_start|>assistant\n")
    d = int(lib.dest[lib._flat(np.array([15, 12])), lib._flat(np.array([6, 12]))])
    text = tok.decode(got)
    assert f"Apples in view: 1 (nearest: (12, 6) d={d})\nDirt in view: 0\nPartners in view: none\n" in text
    assert "Action menu:\nA) wait\n\nChoose one." in text


# ---------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------


def test_remember_matches_host_memory():
    _, lib = _setup("harvest")
    rng = np.random.default_rng(3)
    names = lib.option_names + (prompt_ids.IDLE_NAME,)
    host = prompts.Memory()
    dev = prompt_ids.empty_memory()
    assert prompt_ids.host_memory(lib, dev) == host
    remember = jax.jit(prompt_ids.remember)
    for t in range(9):
        code = int(rng.integers(0, prompt_ids.IDLE_CODE(lib) + 1))
        host.remember(names[code], float(t * 3))
        dev = remember(dev, jnp.int32(code), jnp.float32(t * 3))
        assert prompt_ids.host_memory(lib, dev) == host
        assert np.asarray(dev.macros)[-1] == code and float(dev.team_at_last) == t * 3
    assert len(host.macros) == prompts.MEMORY_MACROS and (np.asarray(dev.macros) >= 0).all()
    batch = prompt_ids.remember(prompt_ids.empty_memory((2, 3)), jnp.arange(6).reshape(2, 3), jnp.ones((2, 3)))
    assert batch.macros.shape == (2, 3, prompts.MEMORY_MACROS)
    assert np.asarray(batch.macros)[1, 2].tolist() == [-1, -1, -1, -1, 5]


# ---------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------


class _SplitLetter:
    """A tokenizer whose " Q" is two tokens."""

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, text, **kw):
        out = self._tok(text, **kw)
        if text == " Q":
            return {"input_ids": list(out["input_ids"]) * 2}
        return out


def test_errors(tok):
    env, lib = _setup("harvest")
    p = _ids("harvest", "sample")
    with pytest.raises(
        ValueError,
        match=rf"harvest \(sample\): max_len=10 is below the worst-case suffix length "
        rf"{p.worst_len}",
    ):
        prompt_ids.PromptIds("harvest", env, lib, tok, mode="sample", max_steps=MAX_STEPS, max_len=10)
    wide = prompt_ids.PromptIds("harvest", env, lib, tok, mode="sample", max_steps=MAX_STEPS, max_len=p.worst_len + 5)
    assert wide.max_len == p.worst_len + 5
    big = HarvestOptions(env, target_cap=21)
    with pytest.raises(ValueError, match=r"harvest: the menu has 28 lines .*\(limit 26\)"):
        prompt_ids.PromptIds("harvest", env, big, tok, mode="sample", max_steps=MAX_STEPS)
    with pytest.raises(ValueError, match=r"harvest: the letter ' Q' is 2 tokens"):
        prompt_ids.PromptIds("harvest", env, lib, _SplitLetter(tok), mode="sample", max_steps=MAX_STEPS)
    with pytest.raises(ValueError, match="unknown mode"):
        prompt_ids.PromptIds("harvest", env, lib, tok, mode="greedy", max_steps=MAX_STEPS)
    broken = copy.deepcopy(tok)
    broken.add_tokens(["Facing: North"])  # an added token across a fragment boundary
    with pytest.raises(ValueError, match=r"harvest \(.*\): the tokenizer breaks the fragment scheme near "):
        prompt_ids.PromptIds("harvest", env, lib, broken, mode="sample", max_steps=MAX_STEPS)


#: Random decisions per non-canonical library variant (each in both modes).
VARIANT_DECISIONS = 300


@pytest.mark.parametrize("library", ["compact", "detailed"])
@pytest.mark.parametrize("game", ["cleanup", "overcooked_aa"])
def test_variant_device_ids_equal_host_tokenization(game, library, tok):
    """The library variants' phrasing and granularity (jaxopt_marl.options.variants) assemble exactly too: device
    ids == the host rendering's tokenization on random decisions of each variant, and the labels are the
    variant's."""
    rng = np.random.default_rng(100 + GAMES.index(game))
    states, aids, kind, u, keys, mems = _decisions(game, rng, VARIANT_DECISIONS, library)
    builders = _builders(game, library)
    inst, letters, outs, _ = _device(game, states, aids, kind, u, keys, mems, library=library)
    refs = builders[0].reference_by_mode(jax.tree.map(np.asarray, states), np.asarray(aids), inst, letters, mems)
    bad = [_compare(p, p.tok, refs[p.mode], ids, n) for p, (ids, n) in zip(builders, outs)]
    assert bad == [0] * len(builders)
    _, lib = _setup(game, library)
    label = options.LIBRARIES[game][library]["labels"][lib.option_names[0]]
    assert label.split(" ")[0] in "".join(refs["sample"])  # the variant's own phrasing is on the menus


# ---------------------------------------------------------------------------------------------------------
# The native interface (paper §4)
# ---------------------------------------------------------------------------------------------------------

#: Random decisions per game under the native interface (each in both modes). The template is the menu's but for
#: the system turn, the layout hint, the memory noun and the fixed action menu, so fewer suffice.
NATIVE_DECISIONS = 150


@functools.cache
def _native_ids(game, mode):
    env, lib = _setup(game)
    tok = smollm2_tokenizer()
    return prompt_ids.PromptIds(game, env, lib, tok, mode=mode, max_steps=MAX_STEPS, interface=interfaces.NATIVE)


@pytest.mark.parametrize("game", GAMES)
def test_native_device_ids_equal_host_tokenization(game, tok):
    """Native decisions (the NativeLibrary's fixed-letter menu, memories of actions) on the random states of
    :func:`test_device_ids_equal_host_tokenization`: device ids == tok(render_chat(native system, the host's
    :func:`jaxopt_marl.interfaces.user_message`)) with the native system turn stripped (+ the choice_only
    response prefix), in both modes; the layout hint line is the host's for the agent's cell."""
    rng = np.random.default_rng(200 + GAMES.index(game))
    states, aids, _, _, _, mems = _decisions(game, rng, NATIVE_DECISIONS)
    builders = [_native_ids(game, m) for m in prompt_ids.MODES]
    nlib = builders[0].lib
    assert isinstance(nlib, interfaces.NativeLibrary)
    # The random memories as native codes: each action, or idle.
    codes = np.asarray(mems.macros)
    mems = mems._replace(macros=jnp.asarray(np.where(codes >= 0, codes % (prompt_ids.IDLE_CODE(nlib) + 1), -1)))

    def one(s, a, mem):
        inst = nlib.instances(s, a)
        let = interfaces.fixed_letters(inst.valid, jnp)
        return inst, let, [p.suffix(s, a, inst, let, mem) for p in builders]

    inst, letters, outs = jax.tree.map(np.asarray, _run(jax.vmap(one), states, aids, mems))
    host_states = jax.tree.map(np.asarray, states)
    refs = builders[0].reference_by_mode(host_states, np.asarray(aids), inst, letters, mems)
    bad = [_compare(p, tok, refs[p.mode], ids, n) for p, (ids, n) in zip(builders, outs)]
    assert bad == [0, 0]
    sys_text = interfaces.system_message(game, interfaces.NATIVE)
    assert all(p.system == sys_text and sys_text in p.prefix_text for p in builders)
    # The text has the native pieces, and the hints vary with the cell where the game's hint does.
    texts = refs["choice_only"]
    actions = interfaces.native_actions(game)
    menu = "\n".join([menus.MENU_HEADER] + [f"{c}) {n} ({w})" for c, (n, w) in zip(menus.LETTERS, actions)])
    snap = prompt_ids._snapshot_fn(game, builders[0].env)(host_states)
    hints = set()
    for b, t in enumerate(texts):
        hint = interfaces.layout_hint(game, prompts.take(snap, b), int(aids[b]), nlib)
        hints.add(hint)
        assert f"\n{hint}\nStep " in t and f"\n\n{menu}\n\nChoose one." in t
    assert any("- Last 5 actions: none\n" in t for t in texts)
    assert any(re.search(r"- Last 5 actions: (\w+, ){4}\w+\n", t) for t in texts)
    assert len(hints) >= (1 if prompts.family(game) == "overcooked" else 3)
