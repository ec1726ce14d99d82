"""The device parser (jaxopt_marl.parse_device) against the host parser (jaxopt_marl.parsing), byte for byte.

Device calls are batched: one jitted, vmapped parse of [BATCH, WIDTH] byte rows (texts padded into it), and
one of parse_tokens on [TOKEN_BATCH, TOKENS] token rows, each compiled once for the whole file.
"""

import random
import re
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.test_parsing as host_tests
from jaxopt_marl import parse_device as pd
from jaxopt_marl import parsing

BATCH, WIDTH = 128, 512  # text rows: bytes per row
TOKEN_BATCH, TOKENS = 64, 12  # token rows: tokens per row (the rollout's M)
EOS = "<|im_end|>"

_parse_rows = jax.jit(jax.vmap(pd.parse))


def host(text, n_letters):
    """(reason code, letter index or -1) of the host parser on ``text`` (str, or bytes decoded lossily)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    r = parsing.parse_response(text, string.ascii_uppercase[:n_letters])
    return pd.REASON_CODES.index(r.reason), r.index if r.ok else -1


def device(texts, n_letters, lengths=None):
    """(reason codes, letters) int arrays of the device parser on each text (str as UTF-8, or bytes), with
    n = the text's length in bytes unless ``lengths`` says otherwise."""
    out_r, out_l = [], []
    for lo in range(0, len(texts), BATCH):
        chunk = texts[lo : lo + BATCH]
        bufs = np.zeros((BATCH, WIDTH), np.uint8)
        lens = np.zeros(BATCH, np.int32)
        for i, t in enumerate(chunk):
            b = t.encode("utf-8") if isinstance(t, str) else t
            assert len(b) <= WIDTH, len(b)
            bufs[i, : len(b)] = np.frombuffer(b, np.uint8)
            lens[i] = len(b) if lengths is None else lengths[lo + i]
        ks = np.zeros(BATCH, np.int32)
        ks[: len(chunk)] = n_letters[lo : lo + BATCH]
        r, let = _parse_rows(jnp.asarray(bufs), jnp.asarray(lens), jnp.asarray(ks))
        out_r.append(np.asarray(r)[: len(chunk)])
        out_l.append(np.asarray(let)[: len(chunk)])
    return np.concatenate(out_r), np.concatenate(out_l)


def assert_agree(texts, n_letters):
    """Asserts device == host on every (text, n_letters); returns the host outcomes."""
    r, let = device(texts, n_letters)
    expected = [host(t, k) for t, k in zip(texts, n_letters)]
    bad = [(t, k, (int(a), int(b)), e) for t, k, a, b, e in zip(texts, n_letters, r, let, expected) if (a, b) != e]
    assert not bad, f"{len(bad)}/{len(texts)} differ, e.g. (text, n_letters, device, host): {bad[:5]}"
    return expected


# ---------------------------------------------------------------------------------------------------------
# Generators: contract-like ASCII text rich in near-misses.
# ---------------------------------------------------------------------------------------------------------

FRAGMENTS = [
    "choice",
    "Choice",
    "CHOICE",
    "answer",
    "final answer",
    "my choice is",
    "option",
    "action",
    "selection",
    "state:",
    "State",
    "state =",
    ":",
    "=",
    "-",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    '"',
    "'",
    "*",
    "**",
    "`",
    "__",
    "_",
    "#",
    ">",
    "<",
    "+",
    ".",
    "<think>",
    "</think>",
    "<THINK>",
    "</Think>",
    " or ",
    " and ",
    " OR ",
    ",",
    "/",
    "|",
    "&",
    "I'll",
    "I'm",
    "I think",
    "I will",
    "I",
    "i",
    " is ",
    "is",
    "a clean",
    "a",
    "A",
    "B",
    "b",
    "C",
    "c",
    "D",
    "Z",
    "z",
    "E",
    "0",
    "7",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1d",
    "\x1e",
    "\x1f",
    "\x00",
    "clean dirt",
    "because",
    "so",
]
LEADS = ["", "", "- ", "> ", "### ", "+ ", "  ", "**", "`", "-", "#", "\t"]
KEYWORDS = [
    "choice",
    "Choice",
    "CHOICE",
    "answer",
    "Answer",
    "final answer",
    "Final Answer",
    "my choice",
    "My choice is",
    "option",
    "action",
    "selection",
    "choices",
    "achoice",
    "choice_",
    "state",
    "finalchoice",
]
CONNECTORS = [
    "",
    ":",
    ": ",
    " : ",
    "=",
    " = ",
    " - ",
    "-",
    " is ",
    " is: ",
    "is",
    " island ",
    ":**",
    "** :",
    "::",
    " -- ",
]
OPENERS = ["", "", "(", "[", "{", '"', "'", "<", "_", "( ", "**", "`", "__", '["', "(("]
LETTERS = list("ABCDEIZabcdiz") + ["", "AB", "1", "I", "I", "Q"]
CLOSERS = ["", "", ")", "]", "}", '"', "'", ">", ".", ":", "_", ")", "**", "`", ").", "1", "x", " "]
TAILS = [
    "",
    "",
    " or C",
    " or b",
    ", C",
    ", B",
    "/C",
    "/b",
    " | D",
    " & A",
    " and B",
    " and the",
    " or",
    " orC",
    " clean dirt",
    " think so",
    "'ll go",
    "'m",
    "'d",
    "'ve",
    "'s",
    " go",
    " goes",
    " am",
    " can",
    " must",
    " (C)",
    ") B",
    ". Because.",
    " - go",
    " 2",
    ") or (C)",
    ' or "D"',
    " or, C",
    "/ [c]",
    " ,C",
    " oR c",
    " or B or C",
    " or b or B",
    "/B/B",
    "/B/C",
    ", B, B",
    ", b, c",
    " or or C",
    " and, C",
    " and/or C",
    " or (B) or [C]",
    " | B | b",
    " or C or",
    "/b/",
    " or B, C",
    "/ or C",
    " or 'C' or",
    " or B or B or C",
    " and b and B or C",
    ", B or B, C",
    " or B/B or c",
    " or b or b or b",
]
BREAKS = ["\n", "\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\n\n", "\n  \n"]


def _contract_line(choose):
    return (
        choose(LEADS)
        + choose(KEYWORDS)
        + choose(CONNECTORS)
        + choose(OPENERS)
        + choose(LETTERS)
        + choose(CLOSERS)
        + choose(TAILS)
    )


def _text(choose, count):
    """A text of ``count`` lines: contract-like lines, fragment soups, lone letters and state lines."""
    lines = []
    for _ in range(count):
        kind = choose(range(6))
        if kind <= 1:
            line = _contract_line(choose)
        elif kind == 2:
            line = "".join(choose(FRAGMENTS) for _ in range(choose(range(1, 9))))
        elif kind == 3:
            line = choose(LEADS) + choose(OPENERS) + choose(LETTERS) + choose(CLOSERS)
        elif kind == 4:
            line = (
                choose(["state", "State", "STATE", "state ", "statement", "states"])
                + choose([":", " =", "-", " : ", "", " "])
                + choose(["dirt", "A", "B", "choice: C", ""])
            )
        else:
            line = "<think>" + _contract_line(choose) + choose(["</think>", "", "</THINK>", "</think"])
        lines.append(line)
    breaks = [choose(BREAKS) for _ in lines]
    return "".join(line + br for line, br in zip(lines, breaks))[:WIDTH]


@st.composite
def contract_texts(draw):
    def choose(options):
        return draw(st.sampled_from(list(options)))

    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.text(alphabet=string.printable, max_size=80))
    if kind == 1:
        return "".join(draw(st.lists(st.sampled_from(FRAGMENTS), max_size=24)))
    return _text(choose, draw(st.integers(1, 4)))


def seeded_texts(seed, count, extra=()):
    """``count`` texts from a fixed-seed generator (fragments + ``extra``), and menu sizes 0..26."""
    rng = random.Random(seed)
    fragments = FRAGMENTS + list(extra)
    texts = []
    for _ in range(count):
        kind = rng.randrange(6)
        if kind == 5:  # whitespace only, or one letter among whitespace
            alphabet = " \t\n\r\x0b\x0c\x1c\x1f" + rng.choice(["", "B", "_"])
            texts.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(9))))
        elif kind == 0:
            texts.append("".join(rng.choice(string.printable) for _ in range(rng.randrange(60))))
        elif kind == 1:
            texts.append("".join(rng.choice(fragments) for _ in range(rng.randrange(30)))[:WIDTH])
        else:
            texts.append(_text(lambda o: rng.choice(list(o)), rng.randrange(1, 5)))
    return texts, [rng.randrange(27) for _ in texts]


# ---------------------------------------------------------------------------------------------------------
# The host parser's own examples.
# ---------------------------------------------------------------------------------------------------------


def _parametrized(test):
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
    return [row[0] for row in mark.args[1]]


def test_host_examples_agree():
    texts = [
        t
        for t in _parametrized(host_tests.test_accepted) + _parametrized(host_tests.test_failures)
        if isinstance(t, str)
    ]
    # Texts of the other host tests (state labels, candidates, menu letter I, the stats list).
    texts += [
        "State: clean_dirt\nchoice: B",
        "state: A\nchoice: C",
        "choice: B or C",
        "choice: Q",
        "choice: I",
        "choice: I.",
        "choice: B",
        "nope",
        "choice: Z",
        "",
        "choice: A or B",
        "C",
    ]
    assert len(texts) >= 60
    sizes = (host_tests.MENU, "ABCDEFGHI", string.ascii_uppercase, "", "A")
    expected = assert_agree([t for t in texts for _ in sizes], [len(s) for _ in texts for s in sizes])
    # The host's verdicts on its examples, reproduced (so the comparison is not vacuous).
    by_text = dict(zip(texts, expected[:: len(sizes)]))
    for text, letter in host_tests.test_accepted.pytestmark[0].args[1]:
        assert by_text[text] == (pd.REASON_OK, host_tests.MENU.index(letter)), text
    for text, reason in host_tests.test_failures.pytestmark[0].args[1]:
        if isinstance(text, str):
            assert by_text[text] == (pd.REASON_CODES.index(reason), pd.NO_LETTER), text


def test_reason_codes():
    assert pd.REASON_CODES == ("ok", "empty", "no_choice", "multiple_choices", "invalid_letter")
    assert pd.REASON_CODES[1:] == parsing.FAILURE_REASONS
    assert [
        pd.REASON_OK,
        pd.REASON_EMPTY,
        pd.REASON_NO_CHOICE,
        pd.REASON_MULTIPLE_CHOICES,
        pd.REASON_INVALID_LETTER,
    ] == [0, 1, 2, 3, 4]


def test_rule_constants_mirror_host_regexes():
    """The words and character sets declared in parse_device are the ones the host regexes accept."""
    ascii_chars = [chr(c) for c in range(128)]
    space = {c for c in ascii_chars if c.isspace()}
    assert {c for c in ascii_chars if parsing._LEAD.match(c).end() == 1} == set(pd._LEAD_CHARS) | space
    assert {c for c in ascii_chars if (m := parsing._LETTER.match(c + "B")) and m["letter"] == "B"} == (
        set(pd._LETTER_OPENERS) | space
    )
    assert {c for c in ascii_chars if (m := parsing._LONE.match("B" + c)) and m["letter"] == "B"} == (
        set(pd._LONE_CLOSERS) | space
    )
    assert {c for c in ascii_chars if parsing._ALTERNATIVE.match(c + ", B")} == set(pd._ALT_CLOSERS) | space
    assert {c for c in ascii_chars if parsing._ALTERNATIVE.match("," + c + "B")} == set(pd._ALT_OPENERS) | space
    assert {c for c in ascii_chars if parsing._ALTERNATIVE.match(c + "B")} == set(pd._ALT_SEPARATORS)
    assert {c for c in ascii_chars if parsing._STATE.match("state" + c)} == set(pd._STATE_CONNECTORS)
    dashes = ["\u2012", "\u2013", "\u2014", "\u2015", "\u2212"]
    connectors = {
        c for c in ascii_chars + dashes if (m := parsing._KEYWORD.match("choice" + c + "B")) and m["rest"] == "B"
    }
    assert connectors == set(pd._KEYWORD_CONNECTORS) | space
    assert {c for c in ascii_chars if parsing._MARKUP.fullmatch(c)} == set(pd._MARKUP_CHARS)
    assert parsing._MARKUP.fullmatch(pd._MARKUP_RUN * 2) and not parsing._MARKUP.fullmatch(pd._MARKUP_RUN)
    for kw in pd._KEYWORDS:
        assert parsing._KEYWORD.match(kw + ": B")["rest"] == "B"
        assert parsing._KEYWORD.match("final " + kw + " is B")["rest"] == "B"
    assert parsing._KEYWORD.match("choice " + pd._KEYWORD_IS + " B")["rest"] == "B"
    for verb in pd._PRONOUN_VERBS:
        assert parsing._PRONOUN.match(" " + verb) and not parsing._PRONOUN.match(" " + verb + "s")
    for c in pd._PRONOUN_CONTRACTIONS:
        assert parsing._PRONOUN.match(pd._PRONOUN_APOSTROPHE + c)
    for word in pd._ALT_WORDS:
        assert parsing._ALTERNATIVE.match(" " + word + " B")
    assert parsing._THINK.fullmatch(pd._THINK_OPEN + "x" + pd._THINK_CLOSE)
    assert parsing._STATE.match(pd._STATE_WORD + ": x")
    # The regexes name nothing the module does not declare (a new verb or keyword fails here).
    assert all(v in parsing._PRONOUN.pattern for v in pd._PRONOUN_VERBS)
    # Alternations: the verbs, the contractions, and the one between the two forms.
    alternations = (len(pd._PRONOUN_VERBS) - 1) + (len(pd._PRONOUN_CONTRACTIONS) - 1) + 1
    assert parsing._PRONOUN.pattern.count("|") == alternations
    # The keywords, and final|my.
    assert all(kw in parsing._KEYWORD.pattern for kw in pd._KEYWORDS)
    assert parsing._KEYWORD.pattern.count("|") == (len(pd._KEYWORDS) - 1) + 1


# ---------------------------------------------------------------------------------------------------------
# Property tests: ASCII (the exactness contract), then non-ASCII and arbitrary bytes.
# ---------------------------------------------------------------------------------------------------------


@settings(
    derandomize=True,
    database=None,
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(st.tuples(contract_texts(), st.integers(0, 26)), min_size=1, max_size=48))
def test_ascii_property_matches_host(rows):
    texts, sizes = zip(*rows)
    assert_agree(list(texts), list(sizes))


def test_ascii_seeded_corpus_matches_host():
    texts, sizes = seeded_texts(0, 8 * BATCH)
    expected = assert_agree(texts, sizes)
    # The corpus reaches every outcome, ok with many letters.
    reasons = [r for r, _ in expected]
    assert all(reasons.count(code) >= 20 for code in range(len(pd.REASON_CODES))), np.bincount(reasons)
    assert len({let for r, let in expected if r == pd.REASON_OK}) >= 8


NON_ASCII = [
    "é",
    "—",
    "–",
    "“",
    "”",
    "’",
    "\u00a0",
    "\u2028",
    "\u2029",
    "\x85",
    "\u3000",
    "\u2003",
    "\u202f",
    "\u200b",
    "\u0131",
    "\u0130",
    "\u017f",
    "\u212a",
    "😀",
    "日本",
    "ß",
    "Ａ",
    "\ufffd",
    "ǅ",
    "²",
    "µ",
    "\u0301",
    "·",
    "th\u0131nk",
    "<thin\u212a>",
    "</th\u0130nk>",
    "\u017ftate:",
    "cho\u0131ce",
    "\u017felection",
    "I th\u0131nk",
    "I w\u0131ll",
    "B/\u017f",
    "S/\u017f",
    "s or \u017f",
    "I or \u0131",
    "B or \u212a",
    "B or \u0130",
    "choice—B",
    "choice – C",
    "choice\u00a0B",
    "choiceé: B",
    "éB",
    "Bé",
    "choice: é",
    "choice: B\u2028C",
    "option“B”",
]


def non_ascii_texts(seed, count):
    """Seeded contract texts with 1-4 of NON_ASCII inserted at random places, and menu sizes."""
    texts, sizes = seeded_texts(seed, count, extra=NON_ASCII)
    rng = random.Random(seed)
    out = []
    for t in texts:
        for _ in range(rng.randrange(1, 5)):
            at = rng.randrange(min(len(t), WIDTH // 2) + 1)  # inside the kept prefix
            t = t[:at] + rng.choice(NON_ASCII) + t[at:]
        out.append(t.encode("utf-8")[:WIDTH])  # a cut may split a character: lossy on both sides
    return out, sizes


def test_non_ascii_corpus_matches_host():
    texts, sizes = non_ascii_texts(1, 8 * BATCH)
    assert all(max(t) >= 0x80 for t in texts)
    expected = assert_agree(texts, sizes)
    assert sum(r == pd.REASON_OK for r, _ in expected) >= 50


def test_arbitrary_bytes_match_host():
    rng = np.random.default_rng(2)
    texts = []
    for i in range(4 * BATCH):
        if i % 2:
            texts.append(rng.integers(0, 256, rng.integers(0, 80), dtype=np.uint8).tobytes())
        else:  # contract text with a few bytes overwritten by non-ASCII ones
            t = bytearray(_text(lambda o: list(o)[rng.integers(len(o))], 2).encode())
            for _ in range(rng.integers(0, 4)):
                if t:
                    t[rng.integers(len(t))] = rng.integers(0x80, 0x100)
            texts.append(bytes(t))
    assert_agree(texts, [int(k) for k in rng.integers(0, 27, len(texts))])


def test_edge_cases():
    # n = 0, whitespace only (incl. Unicode spaces and breaks), think blocks only.
    texts = [
        "",
        " ",
        "\n\r\t\x0b\x0c\x1c\x1d\x1e\x1f",
        "\u00a0\u2028\x85 \u3000",
        "<think>choice: A</think>",
        "<think>x</think> \n",
        "*",
        "__",
        "choice: <think>\n</think>B",
        "choice: B<think>",
        "\x00",
        "B" * WIDTH,
        ("choice: A or " * 40)[:WIDTH],
        "a" * (WIDTH - 1) + "\n",
        "choice: B or B or B or C",
        "choice: B and b or B and b",
        "choice: " + "B or " * 30 + "C",
        "choice: " + "B or " * 30 + "B",
    ]
    expected = assert_agree(texts, [4] * len(texts))
    assert expected[:4] == [(pd.REASON_EMPTY, -1)] * 4
    assert expected[4] == (pd.REASON_NO_CHOICE, -1)
    assert expected[-4:] == [(pd.REASON_MULTIPLE_CHOICES, -1), (0, 1), (pd.REASON_MULTIPLE_CHOICES, -1), (0, 1)]
    # Bytes at or after n are ignored; n is clamped to 0..WIDTH.
    text = b"choice: B\nchoice: C".ljust(WIDTH, b"Z")
    ns = [9, 10, 19, 0, -5, WIDTH, WIDTH + 500]
    r, let = device([text] * len(ns), [4] * len(ns), lengths=ns)
    assert r.tolist() == [0, 0, pd.REASON_MULTIPLE_CHOICES, pd.REASON_EMPTY, pd.REASON_EMPTY, 0, 0]
    assert let.tolist() == [1, 1, -1, -1, -1, 1, 1]  # "choice: CZZ..." names no letter
    # n_letters bounds the menu: 0 letters -> invalid, more than 26 is clamped.
    r, let = device(["choice: Z"] * 5, [0, 1, 25, 26, 99])
    assert r.tolist() == [pd.REASON_INVALID_LETTER] * 3 + [0, 0] and let.tolist() == [-1, -1, -1, 25, 25]


def test_unicode_rules():
    """The host's Unicode behaviours the device reproduces (the host's verdicts asserted first)."""
    cases = [
        ("<thin\u212a>choice: A</think>\nchoice: B", (0, 1)),  # (?i) k matches KELVIN SIGN: a think block
        ("\u017ftate: A\nB", (0, 1)),  # (?i) s matches LONG S: a state line
        ("choice: S/\u017f", (0, 18)),  # the alternative's upper() is S: one letter
        ("choice: I or \u0131", (0, 8)),  # DOTLESS I upper() is I
        ("choice: B or \u212a", (pd.REASON_MULTIPLE_CHOICES, -1)),
        ("choice: I th\u0131nk", (pd.REASON_NO_CHOICE, -1)),  # the pronoun, with a dotless i
        ("cho\u0131ce: C", (0, 2)),  # a keyword, with a dotless i
        ("choice\u2014B", (0, 1)),  # EM DASH connector
        ("choice \u2013 C", (0, 2)),  # EN DASH connector
        ("choice:\u00a0\u3000D", (0, 3)),  # Unicode spaces are \s
        ("choice: B\u2028C", (0, 1)),  # LINE SEPARATOR splits (lone C is unused)
        ("B\x85C", (pd.REASON_MULTIPLE_CHOICES, -1)),  # NEXT LINE splits
        ("choice\u00e9: B", (pd.REASON_NO_CHOICE, -1)),  # é is a word character: no \b
        ("\u00e9choice: B", (pd.REASON_NO_CHOICE, -1)),
        ("\u201cchoice: B", (0, 1)),  # a quote is not: \b holds
        ("choice: B\u00e9", (0, 1)),  # (?![A-Za-z0-9]) is ASCII only
        ("choice: \u00e9 B", (pd.REASON_NO_CHOICE, -1)),
        (b"choice: B\xff\xfe", (0, 1)),  # invalid UTF-8 reads as U+FFFD
        (b"\xc3\nF\n\xe2\x80", (0, 5)),  # truncated sequences too
        (b"F\xe2\x80", (pd.REASON_NO_CHOICE, -1)),  # (U+FFFD is no closer)
        (b"\xed\xa0\x80\nC", (0, 2)),  # a surrogate's bytes are invalid
    ]
    texts = [t.encode("utf-8") if isinstance(t, str) else t for t, _ in cases]
    assert [host(t, 26) for t in texts] == [want for _, want in cases]
    assert_agree(texts, [26] * len(texts))


def test_character_classes_follow_python():
    """The code point -> class table against str / re predicates, on Latin-1, General Punctuation, the
    confusable letters and a random sample of all code points."""
    tables = pd._char_tables()
    rng = np.random.default_rng(7)
    cps = sorted(
        {
            *range(0x100),
            *range(0x2000, 0x2070),
            0x1680,
            0x3000,
            0x130,
            0x131,
            0x17F,
            0x212A,
            0xFFFD,
            *rng.integers(0, 0x110000, 20000).tolist(),
        }
    )
    for cp in cps:
        ch = chr(cp)
        flags = int(tables.flags[tables.blocks[tables.block_of[cp >> pd._BLOCK_BITS], cp & 0xFF]])
        folds = [k + 1 for k, low in enumerate(string.ascii_lowercase) if re.fullmatch("(?i)" + low, ch)]
        assert bool(flags & pd._SPACE) == ch.isspace(), hex(cp)
        assert bool(flags & pd._WORD) == (ch.isalnum() or ch == "_"), hex(cp)
        assert bool(flags & pd._BREAK) == (len(("a" + ch + "b").splitlines()) == 2), hex(cp)
        assert (flags >> pd._FOLD_SHIFT) & pd._FIELD_MASK == (folds[0] if folds else 0), hex(cp)
        assert bool(flags & pd._KEYWORD_CONN) == (ch in pd._KEYWORD_CONNECTORS), hex(cp)
    assert tables.flags[tables.end] == pd._BREAK


def test_parse_rejects_bad_arguments():
    with pytest.raises(ValueError, match="uint8"):
        pd.parse(jnp.zeros((4,), jnp.int32), 4, 4)
    with pytest.raises(ValueError, match="uint8"):
        pd.parse(jnp.zeros((2, 4), jnp.uint8), 4, 4)
    with pytest.raises(ValueError, match="n_letters"):
        pd.parse(jnp.zeros((4,), jnp.uint8), 4, jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match="n must"):
        pd.parse(jnp.zeros((4,), jnp.uint8), 1.5, 4)


# ---------------------------------------------------------------------------------------------------------
# Tokens: the byte table and parse_tokens on SmolLM2's tokenizer.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    from jaxopt_marl.rollout import smollm2_tokenizer

    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def table(tok):
    return pd.ByteTable.from_tokenizer(tok)


def _decode_bytes(table, ids):
    data, lens = np.asarray(table.bytes), np.asarray(table.lens)
    return b"".join(data[i, : lens[i]].tobytes() for i in ids)


def test_byte_table_decodes_like_the_tokenizer(tok, table):
    assert table.bytes.shape == (49152, 81) and table.bytes.dtype == jnp.uint8
    assert table.lens.shape == (49152,) and table.lens.dtype == jnp.int32
    assert int(table.lens.max()) == 81 and int(table.lens.min()) == 0
    special = [i for i, t in tok.backend_tokenizer.get_added_tokens_decoder().items() if t.special]
    assert len(special) == 17 and all(int(table.lens[i]) == 0 for i in special)
    assert _decode_bytes(table, tok.encode(" choice: B\n", add_special_tokens=False)) == b" choice: B\n"
    # Every token alone, then random sequences (special tokens, split multi-byte characters included).
    singles = tok.batch_decode([[i] for i in range(len(tok))], skip_special_tokens=True)
    wrong = [i for i, s in enumerate(singles) if _decode_bytes(table, [i]).decode("utf-8", "replace") != s]
    assert not wrong, wrong[:10]
    rng = np.random.default_rng(3)
    for _ in range(300):
        ids = rng.integers(0, len(tok), rng.integers(1, 24)).tolist()
        if rng.random() < 0.3:
            ids.insert(int(rng.integers(len(ids))), int(rng.choice(special)))
        assert _decode_bytes(table, ids).decode("utf-8", "replace") == tok.decode(ids, skip_special_tokens=True)


def test_byte_table_added_tokens_and_other_decoders():
    """Non-special added tokens pass the ByteLevel decoder too (tokenizers' rule); others are refused."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    assert set(alphabet) == set(pd._byte_level_alphabet())
    bpe = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("héllo", "Ġfoo", "日本")])
    bpe.add_special_tokens([AddedToken("<s>", special=True)])
    table = pd.ByteTable.from_tokenizer(bpe)
    # Each byte's own token, in GPT-2's alphabet, gives that byte.
    assert all(_decode_bytes(table, [bpe.token_to_id(c)]) == bytes([b]) for c, b in pd._byte_level_alphabet().items())
    ids = bpe.encode("xhéllo Ġfoo 日本<s>y").ids
    assert _decode_bytes(table, ids).decode("utf-8", "replace") == bpe.decode(ids) == "xh\ufffdllo  foo 日本y"
    bpe.decoder = decoders.Metaspace()
    with pytest.raises(ValueError, match="Metaspace"):
        pd.ByteTable.from_tokenizer(bpe)
    with pytest.raises(ValueError, match="fast"):
        pd.ByteTable.from_tokenizer(object())


def test_response_bytes_concatenates_masked_tokens(tok, table):
    rng = np.random.default_rng(4)
    ids = rng.integers(0, len(tok), (TOKEN_BATCH, TOKENS)).astype(np.int32)
    ids[:, 0] = -3  # out of the vocabulary: no bytes
    ids[:, -1] = len(tok)
    mask = rng.random((TOKEN_BATCH, TOKENS)) < 0.7
    buf, n = jax.jit(jax.vmap(pd.response_bytes, in_axes=(None, 0, 0)))(table, jnp.asarray(ids), jnp.asarray(mask))
    assert buf.shape == (TOKEN_BATCH, TOKENS * 81) and buf.dtype == jnp.uint8 and n.dtype == jnp.int32
    for row, m, b, k in zip(ids, mask, np.asarray(buf), np.asarray(n)):
        want = _decode_bytes(table, [i for i, keep in zip(row[1:-1], m[1:-1]) if keep])
        assert b[:k].tobytes() == want and not b[k:].any()
    with pytest.raises(ValueError, match="tokens and mask"):
        pd.response_bytes(table, jnp.zeros(3, jnp.int32), jnp.ones(2, bool))


def test_parse_tokens_matches_host_on_decoded_text(tok, table):
    eos = tok.convert_tokens_to_ids(EOS)
    assert eos == 2 and int(table.lens[eos]) == 0
    texts, sizes = seeded_texts(5, 6 * TOKEN_BATCH, extra=NON_ASCII)
    texts += [t for t in _parametrized(host_tests.test_accepted) if isinstance(t, str)]
    sizes += [4] * (len(texts) - len(sizes))
    rng = np.random.default_rng(6)
    rows, masks = [], []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False)[: TOKENS - 1] + [eos]
        if rng.random() < 0.2:  # raw sampled ids: arbitrary bytes, split characters, special tokens
            ids = rng.integers(0, len(tok), TOKENS - 1).tolist() + [eos]
        mask = [True] * len(ids) + [False] * (TOKENS - len(ids))
        rows.append(ids + rng.integers(0, len(tok), TOKENS - len(ids)).tolist())  # junk after, masked out
        masks.append(mask)
    fn = jax.jit(jax.vmap(pd.parse_tokens, in_axes=(None, 0, 0, 0)))
    got = []
    for lo in range(0, len(rows), TOKEN_BATCH):
        c = len(rows[lo : lo + TOKEN_BATCH])
        pad = TOKEN_BATCH - c  # the last batch is padded with empty rows
        r = np.asarray(rows[lo : lo + c] + [[0] * TOKENS] * pad, np.int32)
        m = np.asarray(masks[lo : lo + c] + [[False] * TOKENS] * pad)
        k = np.asarray(sizes[lo : lo + c] + [0] * pad, np.int32)
        reason, letter = fn(table, jnp.asarray(r), jnp.asarray(m), jnp.asarray(k))
        got += list(zip(np.asarray(reason)[:c].tolist(), np.asarray(letter)[:c].tolist()))
    want = [
        host(tok.decode([i for i, keep in zip(row, mask) if keep], skip_special_tokens=True), k)
        for row, mask, k in zip(rows, masks, sizes)
    ]
    bad = [(tok.decode(r_), g, w) for r_, g, w in zip(rows, got, want) if g != w]
    assert not bad, bad[:5]
    assert sum(w[0] == pd.REASON_OK for w in want) >= 50
