"""Parsing the LLM's response into a menu letter (paper §5.1 response contract).

The contract asks for two lines::

    state: <label>
    choice: <LETTER>

Small models bend it, so the parser is tolerant but never guesses between two letters. What is
accepted, in order:

1. *Preprocessing.* ``<think> ... </think>`` blocks are dropped (an unclosed ``<think>`` drops
   nothing); Markdown emphasis and code marks (``*``, ``__``, backticks) are removed (a single
   ``_`` stays, so ``state: clean_dirt`` keeps its label, and ``_B_`` reads as ``B``); each line is
   stripped of leading quote / heading / bullet marks (``>``, ``#``, ``-``, ``+``) and of whitespace.
2. *Keyword lines.* A line containing the word ``choice`` -- or ``answer``, ``option``, ``action``,
   ``selection`` -- optionally preceded by ``final``/``my`` and followed by ``is``, ``:``, ``=`` or a
   dash, then a letter, optionally wrapped in ``( )``, ``[ ]``, quotes. Case-insensitive:
   ``choice: B``, ``Choice: b``, ``CHOICE:B``, ``choice: (C)``, ``**Choice:** [d]``,
   ``choice = 'A'``, ``Final answer: B) clean dirt``, ``My choice is C.``.
   After the letter comes the end of the line, closing punctuation, or an explanation; a *lower-case*
   letter followed by a word (``choice: a clean ...``) is read as an article, not a letter, while an
   upper-case one (``choice: B clean dirt``) is taken. ``choice: B or C`` / ``B, C`` / ``B/C`` is
   ``multiple_choices``. ``I`` followed by ``'ll``/``'m`` or a verb (``choice: I think B``) is the
   pronoun: that line yields no letter.
3. *Lone letter lines*, only if no keyword line yields a letter: a line that is a single letter with
   optional wrappers and a trailing ``)``/``.``/``:`` (``B``, ``(B)``, ``B)``, ``**B**``, ``b.``).
   A menu echoed back (``A) eat apple``) is not a lone letter.

Outcome (:class:`ParseResult`): the upper-cased letter and its index in the menu, or one failure
reason of :data:`FAILURE_REASONS`:

- ``empty``: the response is not a string, or is empty / whitespace only.
- ``no_choice``: no keyword line or lone letter line gives a letter.
- ``multiple_choices``: the accepted lines name two or more *different* letters (repeating the same
  letter is fine).
- ``invalid_letter``: exactly one letter was chosen, but it is not on the menu.

The ``state: <label>`` line is returned as ``state`` when present (never required). The parser never
raises on any input (a property test feeds it arbitrary text).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Sequence

OK = "ok"
EMPTY = "empty"
NO_CHOICE = "no_choice"
MULTIPLE_CHOICES = "multiple_choices"
INVALID_LETTER = "invalid_letter"
# Every failure reason, in the order reports list them.
FAILURE_REASONS = (EMPTY, NO_CHOICE, MULTIPLE_CHOICES, INVALID_LETTER)

# Keyword that introduces the chosen letter, with optional lead-in and connector.
_KEYWORD = re.compile(
    r"(?i)\b(?:(?:final|my)\s+)?(?:choice|answer|option|action|selection)\b"
    r"\s*(?:\bis\b)?\s*[:=\-\u2013\u2014]?\s*(?P<rest>.*)$"
)
# A letter with optional opening wrappers, then the boundary that follows it.
_LETTER = re.compile(r"""^[\s(\[{"'<_]*(?P<letter>[A-Za-z])(?![A-Za-z0-9])(?P<after>.*)$""")
# A second letter offered as an alternative: "B or C", "B, C", "B/C", "B and C", "B|C".
_ALTERNATIVE = re.compile(
    r"""^[\s)\]}"'>.]*(?:,|/|\||&|\bor\b|\band\b)\s*[(\["']*(?P<letter>[A-Za-z])(?![A-Za-z0-9])""", re.IGNORECASE
)
# A whole line that is one letter with wrappers.
_LONE = re.compile(r"""^[\s(\[{"'<_]*(?P<letter>[A-Za-z])[\s)\]}"'>.:_]*$""")
_STATE = re.compile(r"(?i)^state\s*[:=\-]\s*(?P<label>.*?)\s*$")
_THINK = re.compile(r"(?is)<think>.*?</think>")
_MARKUP = re.compile(r"\*+|`+|__+")
_LEAD = re.compile(r"^[\s>#\-+]*")
# "choice: I think ..." -- the pronoun, not menu letter I.
_PRONOUN = re.compile(
    r"(?i)^(?:'(?:ll|m|d|ve)\b|\s+(?:think|will|would|choose|chose|pick|select|go|am|believe|guess|"
    r"need|should|want|prefer|can|must)\b)"
)


@dataclasses.dataclass(frozen=True)
class ParseResult:
    """Outcome of :func:`parse_response`.

    Attributes:
        letter: the chosen menu letter (upper case), or None on failure.
        index: the letter's position in the menu, or None.
        reason: ``"ok"`` or one of :data:`FAILURE_REASONS`.
        state: the label after ``state:``, or None.
        candidates: the distinct letters the accepted lines named, in order of appearance.
    """

    letter: str | None
    index: int | None
    reason: str
    state: str | None = None
    candidates: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.reason == OK


def _letter_after_keyword(rest: str) -> tuple[str, ...]:
    """Letters named after a keyword: () none, (x,) one, (x, y, ...) alternatives."""
    m = _LETTER.match(rest)
    if m is None:
        return ()
    letter, after = m.group("letter"), m.group("after")
    if letter == "I" and _PRONOUN.match(after):
        return ()
    # "choice: a clean ..." -- a lower-case letter followed by a word is an article.
    if letter.islower() and re.match(r"^\s+[A-Za-z0-9]", after) and not re.match(r"(?i)^\s+(?:or|and)\b", after):
        return ()
    letters = [letter.upper()]
    while True:
        alt = _ALTERNATIVE.match(after)
        if alt is None:
            break
        letters.append(alt.group("letter").upper())
        after = after[alt.end() :]
    return tuple(letters)


def _lines(text: str) -> list[str]:
    text = _THINK.sub("\n", text)
    out = []
    for raw in text.splitlines():
        line = _LEAD.sub("", _MARKUP.sub("", raw)).strip()
        if line:
            out.append(line)
    return out


def parse_response(text: object, letters: Sequence[str] | str) -> ParseResult:
    """Parses one response against the menu's letters (see the module docstring for the rules).

    Args:
        text: the decoded response (anything: non-strings are ``empty``).
        letters: the menu letters, e.g. ``"ABCD"`` or ``["A", "B"]`` (case-insensitive).

    Returns:
        :class:`ParseResult`; never raises.
    """
    menu = [str(x).upper() for x in letters]
    if not isinstance(text, str) or not text.strip():
        return ParseResult(None, None, EMPTY)
    lines = _lines(text)
    state = None
    keyword_hits: list[str] = []
    alternatives = False
    lone_hits: list[str] = []
    for line in lines:
        s = _STATE.match(line)
        if s is not None:
            if state is None:
                state = s.group("label")
            continue
        k = _KEYWORD.search(line)
        if k is not None:
            found = _letter_after_keyword(k.group("rest"))
            if found:
                keyword_hits.extend(found)
                alternatives |= len(set(found)) > 1
                continue
        lone = _LONE.match(line)
        if lone is not None:
            lone_hits.append(lone.group("letter").upper())
    hits = keyword_hits or lone_hits
    candidates = tuple(dict.fromkeys(hits))
    if not candidates:
        return ParseResult(None, None, NO_CHOICE, state)
    if len(candidates) > 1 or alternatives:
        return ParseResult(None, None, MULTIPLE_CHOICES, state, candidates)
    letter = candidates[0]
    if letter not in menu:
        return ParseResult(None, None, INVALID_LETTER, state, candidates)
    return ParseResult(letter, menu.index(letter), OK, state, candidates)


@dataclasses.dataclass
class ParseStats:
    """Counts of parse outcomes by reason (``ok`` and each of :data:`FAILURE_REASONS`).

    Example:
        >>> stats = ParseStats()
        >>> stats.add(parse_response("choice: B", "AB")); stats.add(parse_response("hmm", "AB"))
        >>> stats.as_dict()["no_choice"], stats.failure_rate
        (1, 0.5)
    """

    counts: Counter = dataclasses.field(default_factory=Counter)

    def add(self, result: ParseResult) -> None:
        """Counts one result."""
        self.counts[result.reason] += 1

    def update(self, results: Iterable[ParseResult]) -> None:
        """Counts many results."""
        for r in results:
            self.add(r)

    def merge(self, other: ParseStats) -> ParseStats:
        """A new counter with both sets of counts."""
        return ParseStats(self.counts + other.counts)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def failures(self) -> int:
        return self.total - self.counts[OK]

    @property
    def failure_rate(self) -> float:
        """Failures / total (0.0 when nothing was counted)."""
        return self.failures / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, int]:
        """``{"ok": n, "empty": n, "no_choice": n, ...}`` with every reason of :data:`FAILURE_REASONS` present,
        then any other reason counted (the compound-JSON interface's, :data:`jaxopt_marl.interfaces.
        COMPOUND_REASONS` and ``executor:<Reason>``), sorted."""
        fixed = (OK,) + FAILURE_REASONS
        extra = sorted(r for r, n in self.counts.items() if r not in fixed and n)
        return {reason: int(self.counts[reason]) for reason in fixed + tuple(extra)}
