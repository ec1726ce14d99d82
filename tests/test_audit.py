"""Behavioural audits (jaxopt_marl.audit) on hand-built arrays and records with hand-computed values."""

import math

import numpy as np
import pytest

from jaxopt_marl import audit


def _rec(aid, opt, outcome="success", parse_fail=None, seed=0, rollout=0):
    return {"aid": aid, "opt": opt, "outcome": outcome, "parse_fail": parse_fail, "seed": seed, "rollout": rollout}


def _cleanup_decisions():
    # agent 0: 3 x clean_dirt, 1 x eat_apple; agent 1: 4 x eat_apple; agent 2: 2 x wait
    return (
        [_rec(0, "clean_dirt")] * 3
        + [_rec(0, "eat_apple", "effect_fail")]
        + [_rec(1, "eat_apple")] * 4
        + [_rec(2, "wait", parse_fail="no_letter"), _rec(2, "wait")]
    )


def test_option_histogram_counts_per_agent():
    names, counts = audit.option_histogram(_cleanup_decisions())
    assert names == ("clean_dirt", "eat_apple", "wait")
    np.testing.assert_array_equal(counts, [[3, 1, 0], [0, 4, 0], [0, 0, 2]])
    # fixed column order, an agent with no decisions, a missing opt
    names, counts = audit.option_histogram(
        [_rec(1, "wait"), _rec(1, None)], num_agents=3, option_names=["wait", "eat_apple"]
    )
    assert names == ("wait", "eat_apple", audit.NO_OPTION)
    np.testing.assert_array_equal(counts, [[0, 0, 0], [1, 0, 1], [0, 0, 0]])


def test_option_step_histogram_ignores_none_and_dead_steps():
    opt_ids = np.array([[[0, 1], [0, -1], [2, 1]]])  # [E=1, T=3, N=2]
    alive = np.array([[[True, True], [True, True], [False, True]]])
    np.testing.assert_array_equal(audit.option_step_histogram(opt_ids, 3), [[2, 0, 1], [0, 2, 0]])
    np.testing.assert_array_equal(audit.option_step_histogram(opt_ids, 3, alive), [[2, 0, 0], [0, 2, 0]])


def test_option_category_keywords():
    assert audit.option_category("clean_dirt") == "clean"
    assert audit.option_category("go_to_river") == "clean"
    assert audit.option_category("eat_apple") == "eat"
    assert audit.option_category("go_to_orchard") == "eat"
    assert audit.option_category("go_to_patch") == "eat"
    assert audit.option_category("wait") == "idle"
    assert audit.option_category("pick_onion") == audit.OTHER


def test_role_split_hand_computed():
    names, counts = audit.option_histogram(_cleanup_decisions())
    split = audit.role_split(names, counts)
    assert split.categories == ("idle", "clean", "eat", "other")
    np.testing.assert_allclose(split.column("clean"), [0.75, 0.0, 0.0])
    np.testing.assert_allclose(split.column("eat"), [0.25, 1.0, 0.0])
    np.testing.assert_allclose(split.column("idle"), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(split.total, [4, 4, 2])
    assert split.roles == ("clean", "eat", "idle")
    # commitment over agents 0 and 1 (agent 2 neither cleans nor eats): (|0.75-0.25|/1 + 1) / 2 = 0.75
    assert split.commitment == pytest.approx(0.75)
    # gap over all three agents: (0.5 + 1 + 0) / 3 = 0.5
    assert split.clean_eat_gap == pytest.approx(0.5)


def test_specialisation_index_limits_and_hand_value():
    # perfect partition: each agent its own option -> I(A;O) = H(O) -> 1
    assert audit.specialisation_index(np.diag([5, 5, 5])) == pytest.approx(1.0)
    # identical distributions (the shared-LoRA signature) -> 0
    assert audit.specialisation_index([[2, 2], [1, 1]]) == pytest.approx(0.0)
    # H(O) = 0 -> NaN by convention
    assert math.isnan(audit.specialisation_index([[3, 0], [1, 0]]))
    # counts [[2, 0], [1, 1]]: p(o) = (3/4, 1/4), H(O) = 0.5623 nats; H(O|A) = 1/2 * ln 2 = 0.3466
    h_o = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    expected = 1 - 0.5 * math.log(2) / h_o
    assert audit.specialisation_index([[2, 0], [1, 1]]) == pytest.approx(expected)


def test_option_entropy_bits():
    np.testing.assert_allclose(audit.option_entropy([[1, 1, 0], [4, 0, 0], [0, 0, 0], [1, 1, 2]]), [1.0, 0.0, 0.0, 1.5])


def test_stationary_fraction_counts_non_moves():
    # T = 4, N = 2; agent 0 moves at the first transition only, agent 1 never moves
    pos = np.array([[[[1, 1], [5, 5]], [[1, 2], [5, 5]], [[1, 2], [5, 5]], [[1, 2], [5, 5]]]])
    np.testing.assert_allclose(audit.stationary_fraction(pos), [2 / 3, 1.0])
    # agent 1 removed at step 2: transitions 1->2 and 2->3 are not counted -> 1 of 1
    alive = np.ones((1, 4, 2), bool)
    alive[0, 2, 1] = False
    np.testing.assert_allclose(audit.stationary_fraction(pos, alive), [2 / 3, 1.0])
    alive[0, :, 1] = False
    assert math.isnan(audit.stationary_fraction(pos, alive)[1])


def test_waiting_fraction():
    opt_ids = np.array([[[3, 0], [3, 0], [1, 3], [-1, 3]]])  # option 3 = wait
    np.testing.assert_allclose(audit.waiting_fraction(opt_ids, [3]), [0.5, 0.5])
    alive = np.ones((1, 4, 2), bool)
    alive[0, 3, 0] = False  # agent 0 not in play at the last step: 2 of 3
    np.testing.assert_allclose(audit.waiting_fraction(opt_ids, [3], alive), [2 / 3, 0.5])


def test_per_agent_returns_and_apples():
    r = np.zeros((2, 3, 2))
    r[0, 0, 0] = 1
    r[0, 2, 0] = 1
    r[1, 1, 1] = 1
    r[1, 2, 1] = -1  # a penalty is not an apple
    np.testing.assert_allclose(audit.per_agent_returns(r), [[2, 0], [0, 0]])
    np.testing.assert_array_equal(audit.per_agent_apples(r), [[2, 0], [0, 1]])
    # A Melting Pot step can bring 2 apples (one regrown under the standing agent, one entered): apples, not
    # rewarded steps (issue 14: an agent that ate 6 was reported as 5).
    r[0, 1, 0] = 2
    np.testing.assert_array_equal(audit.per_agent_apples(r), [[4, 0], [0, 1]])
    assert audit.per_agent_apples(r).dtype == np.int64


def test_successes_per_agent_counts_deliveries():
    recs = [
        _rec(0, "deliver"),
        _rec(0, "deliver", "effect_fail"),
        _rec(1, "deliver"),
        _rec(1, "deliver"),
        _rec(1, "pick_onion"),
    ]
    np.testing.assert_array_equal(audit.successes_per_agent(recs, num_agents=3), [1, 2, 0])


def test_visit_heatmap_counts():
    # E = 2, T = 2, N = 2 on a 3 x 4 map
    pos = np.array(
        [[[[0, 0], [2, 3]], [[0, 1], [2, 3]]], [[[0, 0], [1, 1]], [[0, 0], [9, 9]]]]
    )  # (9, 9) is off the map and dropped
    heat = audit.visit_heatmap(pos, (3, 4))
    assert heat.shape == (2, 3, 4)
    assert heat[0, 0, 0] == 3 and heat[0, 0, 1] == 1 and heat[0].sum() == 4
    assert heat[1, 2, 3] == 2 and heat[1, 1, 1] == 1 and heat[1].sum() == 3
    alive = np.ones((2, 2, 2), bool)
    alive[1, 1, 0] = False
    assert audit.visit_heatmap(pos, (3, 4), alive)[0, 0, 0] == 2
    assert audit.visit_heatmap(pos).shape == (2, 10, 10)  # default shape from the largest position


def test_patches_alive_and_extinction():
    pid = np.array([[0, 0, -1, 1], [-1, -1, -1, 1]])
    apples = np.zeros((1, 3, 2, 4), bool)  # [E, T, H, W]
    apples[0, 0, 0, 1] = True  # patch 0 alive at t = 0 only
    apples[0, :, 1, 3] = True  # patch 1 alive throughout
    alive_t = audit.patches_alive(apples, pid)
    np.testing.assert_array_equal(alive_t, [[[True, True], [False, True], [False, True]]])
    np.testing.assert_array_equal(audit.extinction_step(alive_t), [[1, -1]])
    np.testing.assert_array_equal(audit.extinction_step(np.zeros((1, 4, 1), bool)), [[0]])


def test_solo_test_calls_rollout_per_agent_and_seed():
    calls = []

    def rollout(active, seed):
        calls.append((tuple(active), seed))
        # only agent 0 can score alone; every active agent gets seed % 10
        return np.where(active, seed % 10, 0.0) * (active[0] or active.all())

    res = audit.solo_test(rollout, 2, [11, 13])
    assert calls[:4] == [((True, False), 11), ((True, False), 13), ((False, True), 11), ((False, True), 13)]
    np.testing.assert_allclose(res.team_return, [[1, 3], [0, 0]])
    np.testing.assert_allclose(res.agent_return, [[1, 3], [0, 0]])
    np.testing.assert_allclose(res.full_team, [2, 6])
    assert res.summary()["solo_mean"] == [2.0, 0.0]
    # scalar team returns and per-step rewards are accepted too
    scalar = audit.solo_test(lambda a, s: 5.0, 2, [0], include_full_team=False)
    assert scalar.team_return.tolist() == [[5.0], [5.0]] and np.isnan(scalar.agent_return).all()
    steps = audit.solo_test(lambda a, s: np.ones((3, 2)) * a, 2, [0])
    np.testing.assert_allclose(steps.team_return, [[3], [3]])


def test_solo_test_batched_one_call_per_agent_and_reused_full_team():
    calls = []

    def rollout(active, seeds):
        calls.append((tuple(active), seeds))
        # agent 0 alone scores seed % 10 on every seed; agent 1 alone scores nothing: per-agent returns [S, N]
        return np.array([[s % 10 if active[0] else 0.0, 0.0] for s in seeds])

    res = audit.solo_test(rollout, 2, [11, 13, 14], batched=True, full_team=[5.0, 6.0, 7.0])
    assert calls == [((True, False), (11, 13, 14)), ((False, True), (11, 13, 14))]  # no full-team call
    np.testing.assert_allclose(res.team_return, [[1, 3, 4], [0, 0, 0]])
    np.testing.assert_allclose(res.agent_return, [[1, 3, 4], [0, 0, 0]])
    np.testing.assert_allclose(res.full_team, [5, 6, 7])
    assert res.verdict() == "solo_solvable"
    d = res.as_dict("deliveries")
    assert d["seeds"] == [11, 13, 14] and d["units"] == "deliveries" and d["verdict"] == "solo_solvable"
    assert d["agents"][0]["solo_team"] == {"mean": pytest.approx(8 / 3), "std": pytest.approx(math.sqrt(7 / 3)), "n": 3}
    assert d["agents"][1]["own_return"] == [0.0, 0.0, 0.0] and d["full_team"]["mean"] == 6.0
    # Without full_team the full team runs once, batched too; the same answer as the per-episode form.
    calls.clear()
    full = audit.solo_test(rollout, 2, [11, 13, 14], batched=True)
    assert len(calls) == 3 and calls[-1][0] == (True, True)
    per_ep = audit.solo_test(lambda a, s: rollout(a, (s,))[0], 2, [11, 13, 14])
    for f in ("team_return", "agent_return", "full_team"):
        np.testing.assert_allclose(getattr(full, f), getattr(per_ep, f))
    # A team return that is not the sum over agents (Overcooked: a delivery rewards both agents), per-step rewards.
    shared = audit.solo_test(
        lambda a, ss: {"team": np.ones(len(ss)), "agent": np.ones((len(ss), 4, 2)) * a},
        2,
        [0, 1],
        batched=True,
        include_full_team=False,
    )
    np.testing.assert_allclose(shared.team_return, [[1, 1], [1, 1]])
    np.testing.assert_allclose(shared.agent_return, [[4, 4], [4, 4]])
    assert np.isnan(shared.full_team).all() and shared.as_dict()["full_team"]["mean"] is None
    with pytest.raises(ValueError, match="shape"):
        audit.solo_test(lambda a, ss: np.zeros((len(ss), 3)), 2, [0, 1], batched=True)
    with pytest.raises(ValueError, match="3 values for 2 seeds"):
        audit.solo_test(rollout, 2, [0, 1], batched=True, full_team=[1, 2, 3])


def test_solo_verdict_reads_the_paper_way():
    assert audit.MIN_SOLO_SEEDS == 3
    assert audit.solo_verdict([[0, 2, 0], [0, 0, 0]], [3, 3, 1]) == "solo_solvable"  # AA: an agent alone delivers
    assert audit.solo_verdict([[0, 0, 0], [0, 0, 0]], [3, 1, 2]) == "needs_partner"  # FC: 0 alone, the team scores
    assert audit.solo_verdict([[0, 0], [0, 0]], [0, 0]) == "not_informative"  # the team scores nothing either
    assert audit.solo_verdict([[0, 0], [0, 0]], [np.nan, np.nan]) == "undetermined"
    # The rule: at least MIN_SOLO_SEEDS seeds on which the full team scored. One seed (issue 14: one 30-step
    # seed where nobody could score alone) or two scoring seeds of three are not informative, whatever the solo
    # scores; min_seeds lowers the bar explicitly.
    assert audit.solo_verdict([[0], [0]], [4]) == "not_informative"
    assert audit.solo_verdict([[0, 1, 0], [0, 0, 0]], [2, 0, 1]) == "not_informative"
    assert audit.solo_scoring_seeds([2, 0, 1, np.nan]) == 2
    assert audit.solo_verdict([[0, 2], [0, 0]], [3, 3], min_seeds=2) == "solo_solvable"
    assert audit.solo_verdict([[0, 0], [0, 0]], [3, 1], min_seeds=2) == "needs_partner"


def test_handoffs_follow_items_across_counters():
    def rec(aid, opt, step, target, outcome="success", seed=1):
        return {
            "aid": aid,
            "option": opt,
            "step": step,
            "target": target,
            "outcome": outcome,
            "seed": seed,
            "rollout": 0,
            "round": -1,
        }

    recs = [
        rec(0, "drop_held", 3, [2, 1]),
        rec(1, "pick_from_counter", 9, [2, 1]),  # a0 -> a1
        rec(0, "drop_held", 12, [2, 1]),
        rec(0, "pick_from_counter", 20, [2, 1]),  # a0 takes its own back
        rec(1, "pick_from_counter", 25, [4, 1]),  # an item nobody dropped: not counted
        rec(1, "drop_held", 30, [4, 1], outcome="effect_fail"),
        rec(0, "pick_from_counter", 31, [4, 1]),
        rec(1, "drop_held", 40, [5, 1]),
        rec(0, "pick_from_counter", 44, [5, 1]),  # a1 -> a0
        rec(1, "drop_held", 3, [2, 1], seed=2),
        rec(0, "pick_from_counter", 3, [2, 1], seed=2),
    ]  # same step
    np.testing.assert_array_equal(audit.handoffs(recs, 2), [[1, 1], [1, 0]])
    assert audit.handoffs([], 2).tolist() == [[0, 0], [0, 0]]


def test_rollout_trace_spelling():
    # jaxopt_marl.rollout writes ``option`` and a bool ``parse_fail``
    recs = [
        {"aid": 0, "option": "deliver", "outcome": "success", "parse_fail": False},
        {"aid": 1, "option": "wait", "outcome": "running", "parse_fail": True},
    ]
    names, counts = audit.option_histogram(recs, 2)
    assert names == ("deliver", "wait") and counts.tolist() == [[1, 0], [0, 1]]
    np.testing.assert_allclose(audit.parse_fail_rate(recs, 2), [0.0, 1.0])
    assert audit.successes_per_agent(recs, num_agents=2).tolist() == [1, 0]
    assert list(audit.outcome_table(recs)) == ["deliver", "wait"]


def test_decision_trace_audits():
    recs = _cleanup_decisions() + [_rec(0, "clean_dirt", "explicit:NoPath")]
    tab = audit.outcome_table(recs)
    assert tab["clean_dirt"] == {"success": 3, "effect_fail": 0, "explicit": 1, "other": 0}
    assert tab["eat_apple"]["effect_fail"] == 1
    np.testing.assert_allclose(audit.parse_fail_rate(recs, 4)[:3], [0, 0, 0.5])
    assert math.isnan(audit.parse_fail_rate(recs, 4)[3])


def test_social_metrics_match_metrics_module():
    r = np.zeros((1, 4, 3))
    r[0, 0, 0] = r[0, 2, 0] = r[0, 3, 1] = 1
    sm = audit.social_metrics(r)
    assert sm["team_return"][0] == 3
    assert sm["efficiency"][0] == 0.75
    assert sm["equality"][0] == pytest.approx(1 - 4 / 9)
    assert sm["sustainability"][0] == 3.0
    assert sm["peace"][0] == 3.0


def test_mean_std_convention():
    assert audit.mean_std([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)), 2)
    assert audit.mean_std([4.0]) == (4.0, 0.0, 1)
    m, s, n = audit.mean_std([np.nan])
    assert math.isnan(m) and n == 0
