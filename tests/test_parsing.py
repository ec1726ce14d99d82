"""Response parser: accepted forms, typed failures, counters, and no exception on any text."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxopt_marl import parsing
from jaxopt_marl.parsing import ParseStats, parse_response

MENU = "ABCD"


@pytest.mark.parametrize(
    "text, letter",
    [
        ("state: dirt nearby\nchoice: B", "B"),  # the contract
        ("choice: B", "B"),
        ("Choice: b", "B"),  # case
        ("CHOICE:C", "C"),
        ("  choice :   D  ", "D"),  # whitespace
        ("choice: (C)", "C"),  # wrappers
        ("choice: [a]", "A"),
        ("choice = 'A'", "A"),
        ('choice: "D".', "D"),
        ("**Choice:** B", "B"),  # markdown
        ("**choice: B**", "B"),
        ("`choice: C`", "C"),
        ("- choice: A", "A"),
        ("> choice: D", "D"),
        ("### Choice: B", "B"),
        ("choice: _B_", "B"),
        ("choice - C", "C"),
        ("choice: B) clean dirt @ (4, 5)", "B"),  # explanation after the letter
        ("choice: B - go clean", "B"),
        ("choice: B clean dirt", "B"),
        ("choice: B. Because the river is dirty.", "B"),
        ("Final answer: D", "D"),  # other keywords
        ("My choice is C.", "C"),
        ("Answer: a", "A"),
        ("option B", "B"),
        ("Sure! Here is my decision.\nstate: idle\nchoice: A\nThis cleans.", "A"),  # extra text
        ("B", "B"),  # lone letter lines
        ("(c)", "C"),
        ("D)", "D"),
        ("**A**", "A"),
        ("b.", "B"),
        ("state: hungry\n\nB\n", "B"),
        ("choice: B\nchoice: b", "B"),  # the same letter twice is fine
        ("<think>maybe choice: A</think>\nchoice: C", "C"),  # reasoning block ignored
        ("The best option is to clean.\nchoice: B", "B"),  # keyword without a letter is skipped
    ],
)
def test_accepted(text, letter):
    r = parse_response(text, MENU)
    assert r.ok and r.reason == "ok", r
    assert r.letter == letter and r.index == MENU.index(letter)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("   \n\t ", "empty"),
        (None, "empty"),
        (42, "empty"),
        ("I would like to clean the river.", "no_choice"),
        ("state: dirty", "no_choice"),
        ("choice:", "no_choice"),
        ("choice: clean dirt @ (4, 5)", "no_choice"),
        ("choice: a clean tile", "no_choice"),  # lower-case article, not a letter
        ("choice: I think so", "no_choice"),  # pronoun
        ("A) eat apple\nB) clean dirt", "no_choice"),  # echoed menu
        ("choice: B or C", "multiple_choices"),
        ("choice: B, C", "multiple_choices"),
        ("choice: b/c", "multiple_choices"),
        ("choice: B\nchoice: C", "multiple_choices"),
        ("B\nC", "multiple_choices"),
        ("choice: E", "invalid_letter"),
        ("choice: z", "invalid_letter"),
        ("Z", "invalid_letter"),
    ],
)
def test_failures(text, reason):
    r = parse_response(text, MENU)
    assert not r.ok and r.reason == reason and r.letter is None and r.index is None, r
    assert reason in parsing.FAILURE_REASONS


def test_state_label_and_candidates():
    r = parse_response("State: clean_dirt\nchoice: B", MENU)
    assert r.state == "clean_dirt" and r.candidates == ("B",)
    # A state line never counts as a choice, even when the label is a letter.
    r = parse_response("state: A\nchoice: C", MENU)
    assert r.letter == "C" and r.state == "A"
    assert parse_response("choice: B or C", MENU).candidates == ("B", "C")
    assert parse_response("choice: Q", MENU).candidates == ("Q",)


def test_menu_letter_i_and_list_menus():
    letters = list("ABCDEFGHI")
    assert parse_response("choice: I", letters).letter == "I"
    assert parse_response("choice: I.", letters).index == 8
    assert parse_response("choice: B", ["a", "b"]).letter == "B"


def test_parse_stats():
    stats = ParseStats()
    for t in ["choice: A", "choice: B", "nope", "choice: Z", "", "choice: A or B", "C"]:
        stats.add(parse_response(t, MENU))
    assert stats.as_dict() == {"ok": 3, "empty": 1, "no_choice": 1, "multiple_choices": 1, "invalid_letter": 1}
    assert stats.total == 7 and stats.failures == 4
    assert stats.failure_rate == pytest.approx(4 / 7)
    merged = stats.merge(stats)
    assert merged.as_dict()["ok"] == 6 and stats.total == 7
    assert ParseStats().failure_rate == 0.0


@settings(max_examples=400, deadline=None)
@given(st.text(), st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ", max_size=9))
def test_never_raises_on_any_text(text, menu):
    r = parse_response(text, menu)
    assert r.reason in ("ok",) + parsing.FAILURE_REASONS
    if r.ok:
        assert r.letter in menu.upper() and menu[r.index] == r.letter


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "choice",
                ":",
                " ",
                "\n",
                "(",
                ")",
                "*",
                "`",
                "B",
                "c",
                "or",
                "I",
                "state",
                "<think>",
                "</think>",
                "_",
                ">",
                "#",
                "-",
                "answer",
            ]
        ),
        max_size=30,
    )
)
def test_never_raises_on_contract_like_text(parts):
    r = parse_response("".join(parts), MENU)
    assert r.reason in ("ok",) + parsing.FAILURE_REASONS
