"""Tests for jaxopt_marl.guards: Stage-3 synthesis (certificate, thresholds, subsumption, solo-only, the paper's
delta-form example), the guard file and its loader, and Stage-4 mask evaluation."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxopt_marl import guards as gd
from jaxopt_marl import records as rec

VOCAB = rec.RecordVocab(
    option_names=("pick_onion", "start_cooking", "deliver"),
    reason_names=("TargetAbsent", "NoPath", "NothingHeld"),
    features={
        "held": ("none", "onion", "dish", "soup"),
        "tgt_pot_state": ("empty", "partial", "full", "cooking", "ready"),
        "tgt_item": ("none", "onion", "dish"),
    },
)
READ_SETS = {
    "pick_onion": ("held",),
    "start_cooking": ("held", "tgt_pot_state"),
    "deliver": ("held", "tgt_pot_state", "tgt_item"),
}


def rows_table(rows):
    """rows: (opt, outcome, features dict[, solo]) tuples -> record table."""
    out = []
    for i, r in enumerate(rows):
        opt, outcome, feats = r[:3]
        solo = r[3] if len(r) > 3 else True
        out.append(
            {
                "ep": i // 10,
                "step": i,
                "aid": 0,
                "solo": solo,
                "opt": opt,
                "target_x": 1,
                "target_y": 1,
                "outcome": outcome,
                **feats,
            }
        )
    return rec.records_from_rows(out, VOCAB)


def as_set(guards):
    return {(g.opt, g.channel, g.when, g.support) for g in guards}


# ---------------------------------------------------------------------------------------------------------
# Brute-force reference: the paper's loop (§5.1 Stage 3), one record at a time.
# ---------------------------------------------------------------------------------------------------------


def reference_guards(codes, vocab, read_sets, solo_only=(), min_support=5):
    names = vocab.feature_names
    vals = vocab.feature_values
    fidx = {f: j for j, f in enumerate(names)}
    out = set()
    for o_id, o in enumerate(vocab.option_names):
        recs = [i for i in range(codes.num_records) if codes.opt[i] == o_id and (o not in solo_only or codes.solo[i])]
        fails = [i for i in recs if codes.outcome[i] != 0]
        succs = [i for i in recs if codes.outcome[i] == 0]

        def covers(conj, i):
            return all(codes.features[i, fidx[f]] == vals[f].index(v) for f, v in conj)

        singles = [((f, v),) for f in read_sets.get(o, ()) for v in vals[f]]
        pairs = [
            ((f, v), (g, w))
            for f, g in itertools.combinations(read_sets.get(o, ()), 2)
            for v in vals[f]
            for w in vals[g]
        ]
        adopted_singles = set()
        for conj in singles + pairs:
            n_fail = sum(covers(conj, i) for i in fails)
            n_succ = sum(covers(conj, i) for i in succs)
            if n_fail >= min_support and n_succ == 0:
                if len(conj) == 2 and (conj[:1] in adopted_singles or conj[1:] in adopted_singles):
                    continue  # subsumed by an adopted single literal
                if len(conj) == 1:
                    adopted_singles.add(conj)
                out.add((o, "inferred", conj, n_fail))
        for k, reason in enumerate(vocab.reason_names):
            n = sum(codes.outcome[i] == 2 + k for i in recs)
            if n >= min_support:
                out.add((o, "explicit", (("__reason__", reason),), n))
    return out


SMALL = rec.RecordVocab(
    option_names=("a", "b"),
    reason_names=("NoPath",),
    features={"f": ("x", "y", "z"), "g": ("p", "q"), "h": ("u", "v")},
)
SMALL_READ = {"a": ("f", "g", "h"), "b": ("g",)}


@st.composite
def record_sets(draw):
    n = draw(st.integers(0, 120))
    ints = st.integers
    opt = draw(st.lists(ints(0, 1), min_size=n, max_size=n))
    outcome = draw(st.lists(ints(0, 2), min_size=n, max_size=n))
    feats = draw(st.lists(st.tuples(ints(-1, 2), ints(-1, 1), ints(0, 1)), min_size=n, max_size=n))
    solo = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return rec.RecordCodes(
        ep=np.zeros(n, np.int32),
        step=np.arange(n, dtype=np.int32),
        aid=np.zeros(n, np.int32),
        solo=np.array(solo, bool),
        opt=np.array(opt, np.int32),
        target_x=np.zeros(n, np.int32),
        target_y=np.zeros(n, np.int32),
        outcome=np.array(outcome, np.int32),
        features=np.array(feats, np.int32).reshape(n, 3),
    )


@settings(max_examples=150, deadline=None)
@given(codes=record_sets(), solo_b=st.booleans())
def test_property_certificate_and_completeness(codes, solo_b):
    solo_only = ("b",) if solo_b else ()
    guards = gd.synthesize_guards(codes, SMALL, SMALL_READ, solo_only=solo_only)
    fidx = {f: j for j, f in enumerate(SMALL.feature_names)}
    # Every adopted inferred guard covers >= 5 failures and zero successes (the certificate).
    for g in guards:
        o = SMALL.option_names.index(g.opt)
        rows = (codes.opt == o) & (codes.solo if g.opt in solo_only else True)
        if g.channel == "inferred":
            cov = rows.copy()
            for f, v in g.when:
                cov &= codes.features[:, fidx[f]] == SMALL.feature_values[f].index(v)
            assert (cov & (codes.outcome != 0)).sum() == g.support >= 5
            assert (cov & (codes.outcome == 0)).sum() == 0
        else:
            assert (rows & (codes.outcome == 2)).sum() == g.support >= 5
    # Nothing adoptable is missed, and nothing else is adopted: exact agreement with brute force.
    assert as_set(guards) == reference_guards(codes, SMALL, SMALL_READ, solo_only)


# ---------------------------------------------------------------------------------------------------------
# The paper's delta-form example (§5.1 Defect 1)
# ---------------------------------------------------------------------------------------------------------


def pick_onion_executions():
    """(pre_held, post_held) of pick_onion executions. Holding anything, the pick is a silent no-op."""
    execs = [("none", "onion")] * 20  # real picks
    execs += [("onion", "onion")] * 8  # no-op: already holding an onion
    execs += [("dish", "dish")] * 6  # no-op: hands full
    return execs


def delta_effect(pre, post):
    return pre != "onion" and post == "onion"


def absolute_effect(pre, post):
    return post == "onion"


@pytest.mark.parametrize("effect, expect_onion_guard", [(delta_effect, True), (absolute_effect, False)])
def test_delta_form_example(effect, expect_onion_guard):
    rows = [
        ("pick_onion", "success" if effect(pre, post) else "effect_fail", {"held": pre})
        for pre, post in pick_onion_executions()
    ]
    guards = gd.synthesize_guards(rows_table(rows), VOCAB, READ_SETS)
    whens = {g.when: g.support for g in guards if g.opt == "pick_onion"}
    # "hide pick_onion when held = dish" is adopted either way.
    assert whens[(("held", "dish"),)] == 6
    if expect_onion_guard:
        assert whens[(("held", "onion"),)] == 8
    else:  # the absolute form logs the 8 no-ops as successes, which veto the correct guard
        assert (("held", "onion"),) not in whens


# ---------------------------------------------------------------------------------------------------------
# Thresholds, subsumption, channels, solo-only
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_fail, adopted", [(4, False), (5, True)])
def test_inferred_threshold(n_fail, adopted):
    rows = [("start_cooking", "success", {"held": "none", "tgt_pot_state": "full"})] * 3
    rows += [("start_cooking", "effect_fail", {"held": "none", "tgt_pot_state": "empty"})] * n_fail
    guards = gd.synthesize_guards(rows_table(rows), VOCAB, READ_SETS)
    expected = {("start_cooking", "inferred", (("tgt_pot_state", "empty"),), 5)} if adopted else set()
    assert as_set(guards) == expected


@pytest.mark.parametrize("n_fail, adopted", [(4, False), (5, True)])
def test_explicit_threshold(n_fail, adopted):
    rows = [("deliver", "success", {"held": "soup"})] * 3
    rows += [("deliver", "explicit:NoPath", {"held": "soup"})] * n_fail
    guards = gd.synthesize_guards(rows_table(rows), VOCAB, {})
    expected = {("deliver", "explicit", (("__reason__", "NoPath"),), 5)} if adopted else set()
    assert as_set(guards) == expected


def test_single_success_vetoes():
    rows = [("start_cooking", "effect_fail", {"tgt_pot_state": "empty"})] * 40
    rows += [("start_cooking", "success", {"tgt_pot_state": "empty"})]
    assert gd.synthesize_guards(rows_table(rows), VOCAB, READ_SETS) == []


def test_subsumption_and_pairs():
    # held=dish always fails -> single adopted; (dish, empty) pairs are subsumed and dropped.
    rows = [("start_cooking", "effect_fail", {"held": "dish", "tgt_pot_state": "empty"})] * 6
    rows += [("start_cooking", "effect_fail", {"held": "dish", "tgt_pot_state": "full"})] * 5
    # held=onion succeeds on a full pot but fails on an empty one: only the pair is pure.
    rows += [("start_cooking", "success", {"held": "onion", "tgt_pot_state": "full"})] * 2
    rows += [("start_cooking", "effect_fail", {"held": "onion", "tgt_pot_state": "partial"})] * 7
    rows += [("start_cooking", "success", {"held": "none", "tgt_pot_state": "partial"})] * 1
    rows += [("start_cooking", "success", {"held": "none", "tgt_pot_state": "empty"})] * 1  # vetoes 'empty'
    guards = gd.synthesize_guards(rows_table(rows), VOCAB, READ_SETS)
    assert as_set(guards) == {
        ("start_cooking", "inferred", (("held", "dish"),), 11),
        ("start_cooking", "inferred", (("held", "onion"), ("tgt_pot_state", "partial")), 7),
    }


def test_explicit_failures_count_in_inferred_channel_by_default():
    rows = [("deliver", "explicit:NoPath", {"held": "dish"})] * 3
    rows += [("deliver", "effect_fail", {"held": "dish"})] * 2
    rows += [("deliver", "success", {"held": "soup"})] * 2
    inferred = {("deliver", "inferred", (("held", "dish"),), 5)}
    assert as_set(gd.synthesize_guards(rows_table(rows), VOCAB, READ_SETS)) == inferred
    only_effect = gd.synthesize_guards(rows_table(rows), VOCAB, READ_SETS, explicit_counts_as_failure=False)
    assert only_effect == []


def test_features_outside_the_read_set_are_not_mined():
    rows = [("pick_onion", "effect_fail", {"held": "none", "tgt_item": "dish"})] * 9
    rows += [("pick_onion", "success", {"held": "none", "tgt_item": "onion"})] * 9
    assert gd.synthesize_guards(rows_table(rows), VOCAB, READ_SETS) == []  # tgt_item not in pick_onion's set
    guards = gd.synthesize_guards(rows_table(rows), VOCAB, {"pick_onion": ("held", "tgt_item")})
    assert as_set(guards) == {("pick_onion", "inferred", (("tgt_item", "dish"),), 9)}


def test_solo_only_options_ignore_two_agent_episodes():
    # Two-agent episodes forge successes for start_cooking on an empty pot (a partner acted; §5.1 Defect 2).
    rows = [("start_cooking", "effect_fail", {"tgt_pot_state": "empty"}, True)] * 6
    rows += [("start_cooking", "success", {"tgt_pot_state": "empty"}, False)] * 3
    rows += [("start_cooking", "explicit:NoPath", {"tgt_pot_state": "full"}, False)] * 5
    rows += [("start_cooking", "success", {"tgt_pot_state": "full"}, False)]  # vetoes inferred 'full'
    t = rows_table(rows)
    assert gd.synthesize_guards(t, VOCAB, READ_SETS) == [
        gd.Guard("start_cooking", "explicit", (("__reason__", "NoPath"),), 5)
    ]
    solo = gd.synthesize_guards(t, VOCAB, READ_SETS, solo_only={"start_cooking": True, "deliver": False})
    assert as_set(solo) == {("start_cooking", "inferred", (("tgt_pot_state", "empty"),), 6)}


def test_empty_and_all_success_say_so(caplog):
    with caplog.at_level("WARNING"):
        empty = gd.synthesize_guards(rows_table([]), VOCAB, READ_SETS)
    assert empty == [] and "empty" in empty.message and "empty" in caplog.text
    ok = gd.synthesize_guards(rows_table([("deliver", "success", {"held": "soup"})] * 9), VOCAB, READ_SETS)
    assert ok == [] and "all 9 records are successes" in ok.message


def test_unknown_names_in_arguments():
    t = rows_table([])
    with pytest.raises(ValueError, match="unknown option 'cook'"):
        gd.synthesize_guards(t, VOCAB, {"cook": ("held",)})
    with pytest.raises(ValueError, match="unknown feature 'hands'"):
        gd.synthesize_guards(t, VOCAB, {"deliver": ("hands",)})
    with pytest.raises(ValueError, match="unknown option 'cook'"):
        gd.synthesize_guards(t, VOCAB, READ_SETS, solo_only=("cook",))


# ---------------------------------------------------------------------------------------------------------
# Guard file
# ---------------------------------------------------------------------------------------------------------


def test_guard_line_format_matches_the_paper():
    g = gd.Guard("start_cooking", "inferred", (("tgt_pot_state", "empty"),), 31887)
    assert g.to_json() == (
        '{"opt": "start_cooking", "channel": "inferred", "when": {"tgt_pot_state": "empty"}, "support": 31887}'
    )
    e = gd.Guard("deliver", "explicit", (("__reason__", "NoPath"),), 20884)
    assert e.to_json() == (
        '{"opt": "deliver", "channel": "explicit", "when": {"__reason__": "NoPath"}, "support": 20884}'
    )


def test_write_and_load_round_trip(tmp_path):
    guards = [
        gd.Guard("start_cooking", "inferred", (("tgt_pot_state", "empty"),), 31887),
        gd.Guard("start_cooking", "inferred", (("held", "dish"), ("tgt_pot_state", "full")), 24240),
        gd.Guard("deliver", "explicit", (("__reason__", "NoPath"),), 20884),
    ]
    path = gd.write_guards(guards, tmp_path / "guards.jsonl")
    assert gd.load_guards(path, VOCAB.option_names, VOCAB.feature_values, reasons=VOCAB.reason_names) == guards
    assert gd.load_guards(path, VOCAB.option_names, VOCAB) == guards


GOOD = '{"opt": "deliver", "channel": "inferred", "when": {"held": "none"}, "support": 7}'


@pytest.mark.parametrize(
    "bad, match",
    [
        ('{"opt": "deliver", "channel": "inferred", "when": {"held": "none"}', r":3: malformed JSON"),
        (
            '{"opt": "serve", "channel": "inferred", "when": {"held": "none"}, "support": 7}',
            r":3: unknown option 'serve'",
        ),
        (
            '{"opt": "deliver", "channel": "inferred", "when": {"hands": "none"}, "support": 7}',
            r":3: unknown feature 'hands'",
        ),
        (
            '{"opt": "deliver", "channel": "inferred", "when": {"held": "tomato"}, "support": 7}',
            r":3: unknown value 'tomato' for feature 'held'",
        ),
        (
            '{"opt": "deliver", "channel": "explicit", "when": {"__reason__": "Blocked"}, "support": 7}',
            r":3: unknown reason 'Blocked'",
        ),
        (
            '{"opt": "deliver", "channel": "guessed", "when": {"held": "none"}, "support": 7}',
            r":3: unknown channel 'guessed'",
        ),
        ('{"opt": "deliver", "channel": "inferred", "when": {"held": "none"}}', r":3: missing key 'support'"),
        ('{"opt": "deliver", "channel": "inferred", "when": {"held": "none"}, "support": -1}', r":3: support"),
        ("[1, 2]", r":3: expected a JSON object"),
    ],
)
def test_loader_errors_name_line_and_value(tmp_path, bad, match):
    path = tmp_path / "guards.jsonl"
    path.write_text(GOOD + "\n\n" + bad + "\n" + GOOD + "\n")  # line 2 is blank (skipped), line 3 is bad
    with pytest.raises(ValueError, match=match) as err:
        gd.load_guards(path, VOCAB.option_names, VOCAB.feature_values, reasons=VOCAB.reason_names)
    assert str(path) in str(err.value)


def test_loader_read_set_check(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"opt": "pick_onion", "channel": "inferred", "when": {"tgt_item": "dish"}, "support": 5}\n')
    gd.load_guards(path, VOCAB.option_names, VOCAB)
    with pytest.raises(ValueError, match=r":1: feature 'tgt_item' is not in the read set"):
        gd.load_guards(path, VOCAB.option_names, VOCAB, read_sets=READ_SETS)


def test_synthesized_guards_load_back(tmp_path):
    rows = [
        ("pick_onion", "success" if delta_effect(p, q) else "effect_fail", {"held": p})
        for p, q in pick_onion_executions()
    ]
    rows += [("deliver", "explicit:NoPath", {"held": "soup"})] * 5
    rows += [("deliver", "success", {"held": "soup"})]  # vetoes the inferred 'held = soup'
    guards = gd.synthesize_guards(rows_table(rows), VOCAB, READ_SETS)
    path = gd.write_guards(guards, tmp_path / "guards.jsonl")
    lines = path.read_text().splitlines()
    assert [json.loads(line)["opt"] for line in lines] == ["pick_onion", "pick_onion", "deliver"]
    assert gd.load_guards(path, VOCAB.option_names, VOCAB, reasons=VOCAB.reason_names) == list(guards)


# ---------------------------------------------------------------------------------------------------------
# Stage 4: mask evaluation
# ---------------------------------------------------------------------------------------------------------


def reference_mask(guards, opt_ids, features, live_reason):
    fidx = {f: j for j, f in enumerate(VOCAB.feature_names)}
    shown = np.zeros(opt_ids.shape, bool)
    for idx in np.ndindex(opt_ids.shape):
        o = int(opt_ids[idx])
        if o < 0:
            continue
        hide = False
        for g in guards:
            if VOCAB.option_names.index(g.opt) != o:
                continue
            if g.channel == "explicit":
                hide |= live_reason is not None and live_reason[idx] == VOCAB.reason_names.index(g.when[0][1])
            else:
                hide |= all(features[idx][fidx[f]] == VOCAB.feature_values[f].index(v) for f, v in g.when)
        shown[idx] = not hide
    return shown


MASK_GUARDS = [
    gd.Guard("start_cooking", "inferred", (("tgt_pot_state", "empty"),), 31887),
    gd.Guard("start_cooking", "inferred", (("held", "dish"),), 24240),
    gd.Guard("deliver", "inferred", (("held", "onion"), ("tgt_item", "none")), 12),
    gd.Guard("deliver", "explicit", (("__reason__", "NoPath"),), 20884),
    gd.Guard("pick_onion", "explicit", (("__reason__", "TargetAbsent"),), 9),
]


@pytest.mark.parametrize("with_live", [True, False])
def test_mask_matches_python_reference(with_live):
    rng = np.random.default_rng(0)
    batch = (3, 2, 7)  # envs, agents, instances
    opt_ids = rng.integers(-1, 3, size=batch).astype(np.int32)
    features = np.stack([rng.integers(-1, len(v), size=batch) for _, v in VOCAB.features], -1).astype(np.int32)
    live = rng.integers(-1, 3, size=batch).astype(np.int32) if with_live else None
    compiled = gd.compile_guards(MASK_GUARDS, VOCAB)
    live_arg = None if live is None else jnp.array(live)
    mask = gd.guard_mask(compiled, jnp.array(opt_ids), jnp.array(features), live_arg)
    assert mask.shape == batch and mask.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(mask), reference_mask(MASK_GUARDS, opt_ids, features, live))
    # vmapped over the env axis agrees too.
    vm = jax.vmap(gd.guard_mask, in_axes=(None, 0, 0, None if live is None else 0))
    np.testing.assert_array_equal(np.asarray(vm(compiled, opt_ids, features, live)), np.asarray(mask))


def test_mask_hand_cases_and_no_guards():
    compiled = gd.compile_guards(MASK_GUARDS, VOCAB)
    # features order: held, tgt_pot_state, tgt_item
    opt_ids = jnp.array([1, 1, 1, 2, 2, 2, -1], jnp.int32)
    feats = jnp.array([[0, 0, 0], [2, 2, 0], [1, 2, 0], [1, 4, 0], [1, 4, 1], [3, 4, 0], [0, 0, 0]], jnp.int32)
    live = jnp.array([-1, -1, -1, -1, -1, 1, -1], jnp.int32)  # instance 5's live path check says NoPath
    got = gd.guard_mask(compiled, opt_ids, feats, live)
    # empty pot, held dish, shown; (onion, none) hidden, (onion, onion) shown, NoPath hidden; padding hidden.
    assert np.asarray(got).tolist() == [False, False, True, False, True, False, False]
    none = gd.compile_guards([], VOCAB)
    assert np.asarray(gd.guard_mask(none, opt_ids, feats)).tolist() == [True] * 6 + [False]


def test_out_of_range_codes_are_rejected():
    codes = rec.table_to_codes(rows_table([("deliver", "effect_fail", {"held": "soup"})] * 5), VOCAB)
    bad = codes._replace(features=codes.features.copy())
    bad.features[0, 0] = 4  # held has 4 values
    with pytest.raises(ValueError, match=r"column 'held' has a code out of range"):
        gd.synthesize_guards(bad, VOCAB, READ_SETS)
    with pytest.raises(ValueError, match=r"outcome code out of range"):
        gd.synthesize_guards(codes._replace(outcome=codes.outcome + 9), VOCAB, READ_SETS)
