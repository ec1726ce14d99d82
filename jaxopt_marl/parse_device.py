"""The response parser on the device: :func:`jaxopt_marl.parsing.parse_response` as vectorised JAX.

The rollout samples each agent's response inside one jitted program, so the response is parsed there too:

1. :class:`ByteTable` (:meth:`ByteTable.from_tokenizer`): the raw bytes each token id contributes to
   ``tokenizer.decode(ids, skip_special_tokens=True)``;
2. :func:`response_bytes`: the bytes of a row of sampled tokens (``uint8[C]`` and the length ``n``);
3. :func:`parse`: the bytes -> ``(reason, letter)`` with the rules of :mod:`jaxopt_marl.parsing`;
4. :func:`parse_tokens`: 2 then 3.

Everything is static-shaped, jittable and vmappable, with no host callback and no loop over characters.

**Exactness.** For every byte string ``b`` with ``len(b) <= C`` and ``0 <= n_letters <= 26``,
``parse(b, len(b), n_letters)`` equals, in reason and letter index,
``parse_response(b.decode("utf-8", "replace"), string.ascii_uppercase[:n_letters])``. This covers every
ASCII text (the contract) and every non-ASCII one too: the Unicode facts the host regexes depend on are
tabulated, at first use, from the running Python's own ``re`` and ``str`` (so they follow its Unicode
database):

- ``\\s`` / ``str.strip`` (``re`` runs of ``\\s``: ASCII ``\\t\\n\\v\\f\\r\\x1c-\\x1f`` and space, U+0085,
  U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000);
- ``\\w`` for the ``\\b`` word boundaries (``re`` runs of ``\\w``: every Unicode letter, digit, ``_``);
- ``str.splitlines`` breaks (``\\n\\r\\v\\f\\x1c\\x1d\\x1e``, U+0085, U+2028, U+2029);
- what ``(?i)`` letters match: besides ASCII, U+0130 and U+0131 match ``i``, U+017F ``s``, U+212A ``k``
  (so ``<thinK>`` with a Kelvin sign opens a think block, ``ſtate:`` is a state line), and ``str.upper`` of
  an ``_ALTERNATIVE`` letter (U+017F -> ``S``, U+0131 -> ``I``);
- the keyword connectors U+2013 and U+2014.

Bytes that are not valid UTF-8 read as one U+FFFD-like character each (neither word nor space nor letter);
Python (and the tokenizer's lossy decode) may fold several of them into one U+FFFD, which no rule can tell
apart (no rule counts repeated non-letters). The only differences left: a host whose decode differs from
``bytes.decode("utf-8", "replace")`` beyond U+FFFD counts, a Python whose ``re`` Unicode tables differ from the
one that built the tables here (they are rebuilt per process, so never in practice), texts longer than the
buffer (the caller's C), and a negative ``n_letters`` (clamped to 0; above 26 the clamp and the host's slice
agree).

**How it works** (``C`` = buffer length; every step is elementwise, a shifted comparison, a cumulative
max/min/sum or a gather/scatter over ``[C]``):

1. *UTF-8 decode*: lead bytes are validated from shifted copies of the buffer, code points assembled, and
   each character's class (:func:`_char_tables`: the ASCII code, or a non-ASCII class, from a two-level
   table of 256-code-point blocks) is compacted to ``cls[C]`` (cumsum + one scatter).
2. *Think blocks and markup* (``_THINK``, ``_MARKUP``): ``<think>`` / ``</think>`` occurrences by shifted
   comparison. Since neither tag can overlap the other, the non-greedy ``re.sub`` scan is a two-state
   machine whose state after each tag is that tag's kind: a character is inside a block iff the last tag at or
   before it is an opening one and some closing tag follows; a closing tag is removed iff the tag before it
   opens. A block's first character becomes the ``\\n`` the host inserts. ``*``, backticks and runs of two
   or more ``_`` are dropped. One compaction.
3. *Lines* (``splitlines``, ``_LEAD``, ``strip``): line ends by suffix-min of break positions, each line's
   content start (first non-lead character) by cummax; empty lines vanish naturally.
4. *Per line*, evaluated at every position and gathered at the line's content start: the ``_STATE`` rule,
   the leftmost ``\\b``-delimited keyword (the optional ``final``/``my`` lead-in never changes ``rest``), the
   ``is``/connector skip, the ``_LETTER`` letter, the ``_PRONOUN`` and lower-case-article rules, and the
   ``_LONE`` rule (first non-wrapper is a letter and nothing but closers follows it).
5. *Alternatives* (``_ALTERNATIVE`` chained): each position's link to the next alternative letter is computed
   in parallel; "the chain names two different letters" is "some link's letter differs from the previous
   one". Links after the first start at the positions right after a single letter, consecutively (no such
   position lies inside a link), so the chain ends at the first such position whose link fails, and the
   differing links before it are counted with a cumsum.
6. *Outcome*: keyword hits if any, else lone hits; min == max letter over hits, no alternatives -> one
   candidate; reason by :data:`REASON_CODES`.
"""

from __future__ import annotations

import functools
import re
import string
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxopt_marl.parsing import EMPTY, FAILURE_REASONS, INVALID_LETTER, MULTIPLE_CHOICES, NO_CHOICE, OK

# Reason codes of :func:`parse`: index into this tuple (0 = ok, then parsing.FAILURE_REASONS in order).
REASON_CODES = (OK,) + FAILURE_REASONS
REASON_OK, REASON_EMPTY, REASON_NO_CHOICE, REASON_MULTIPLE_CHOICES, REASON_INVALID_LETTER = (
    REASON_CODES.index(r) for r in (OK, EMPTY, NO_CHOICE, MULTIPLE_CHOICES, INVALID_LETTER)
)
# Menu letters: string.ascii_uppercase[:n_letters]; letter codes are indices into it.
MENU_LETTERS = string.ascii_uppercase
NO_LETTER = -1

# ---------------------------------------------------------------------------------------------------------
# The host rules' words and character sets (jaxopt_marl/parsing.py; each line names its regex). Sets that
# include \s get Unicode whitespace added in _char_tables. Keyword / pronoun words match case-insensitively.
# ---------------------------------------------------------------------------------------------------------

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"  # _THINK: (?is)<think>.*?</think>
_MARKUP_CHARS = "*`"  # _MARKUP: \*+|`+ (each such char goes)
_MARKUP_RUN = "_"  # _MARKUP: __+ (runs of two or more go)
_LEAD_CHARS = ">#-+"  # _LEAD: ^[\s>#\-+]*
_STATE_WORD = "state"  # _STATE: (?i)^state\s*[:=\-]
_STATE_CONNECTORS = ":=-"
# _KEYWORD: \b(?:(?:final|my)\s+)?(?:choice|...)\b\s*(?:\bis\b)?\s*[:=\-\u2013\u2014]?\s*(?P<rest>.*)$
_KEYWORDS = ("choice", "answer", "option", "action", "selection")
_KEYWORD_IS = "is"
_KEYWORD_CONNECTORS = ":=-\u2013\u2014"
_LETTER_OPENERS = "([{\"'<_"  # _LETTER and _LONE: ^[\s(\[{"'<_]*
_LONE_CLOSERS = ")]}\"'>.:_"  # _LONE: [\s)\]}"'>.:_]*$
# _ALTERNATIVE: ^[\s)\]}"'>.]*(?:,|/|\||&|\bor\b|\band\b)\s*[(\["']*(?P<letter>[A-Za-z])(?![A-Za-z0-9])
_ALT_CLOSERS = ")]}\"'>."
_ALT_SEPARATORS = ",/|&"
_ALT_WORDS = ("or", "and")  # also the article rule's (?i)^\s+(?:or|and)\b
_ALT_OPENERS = "([\"'"
# _PRONOUN: (?i)^(?:'(?:ll|m|d|ve)\b|\s+(?:think|will|...|must)\b), tried after the letter I.
_PRONOUN_LETTER = "I"
_PRONOUN_APOSTROPHE = "'"
_PRONOUN_CONTRACTIONS = ("ll", "m", "d", "ve")
_PRONOUN_VERBS = (
    "think",
    "will",
    "would",
    "choose",
    "chose",
    "pick",
    "select",
    "go",
    "am",
    "believe",
    "guess",
    "need",
    "should",
    "want",
    "prefer",
    "can",
    "must",
)

# ---------------------------------------------------------------------------------------------------------
# Character classes: class id c < 128 is the ASCII character c; ids 128.. are the non-ASCII classes (code
# points grouped by their flags); the last id is END (past the text). Each class has one packed int32:
# flag bits below, the (?i) letter (0 = none, 1..26 = a..z) at _FOLD_SHIFT, the _ALTERNATIVE letter's
# str.upper() (0 = none, 1..26 = A..Z, 27 = a non-ASCII upper case) at _UPPER_SHIFT.
# ---------------------------------------------------------------------------------------------------------

_MAX_CODE_POINT = 0x10FFFF
_REPLACEMENT_CHAR = 0xFFFD  # class of every byte that is not valid UTF-8
(
    _SPACE,
    _BREAK,
    _WORD,
    _LEAD,
    _LETTER_OPEN,
    _LONE_CLOSE,
    _ALT_CLOSE,
    _ALT_OPEN,
    _ALPHA,
    _ALNUM,
    _LOWER,
    _IALPHA,
    _IALNUM,
    _KEYWORD_CONN,
    _STATE_CONN,
    _ALT_SEP,
    _MARKUP,
) = (1 << b for b in range(17))
_FOLD_SHIFT, _UPPER_SHIFT, _FIELD_MASK = 20, 25, 31
_FOLD_BITS, _WINDOW = 5, 6  # letters packed per int32 word window (6 * 5 bits)
# Code point -> class is a two-level table: blocks of 2**_BLOCK_BITS code points, identical blocks shared.
_BLOCK_BITS = 8
_UPPER_NON_ASCII = len(MENU_LETTERS) + 1
# END positions appended to every working array, so that even a text filling the buffer ends in END (a line
# end for every rule) and a clamped read past the text reads END.
_PAD = 16


class _CharTables(NamedTuple):
    """Host-side (numpy) class tables, built once per process by :func:`_char_tables`."""

    flags: np.ndarray  # int32[K]: packed flags of each class id
    block_of: np.ndarray  # uint8[0x110000 >> _BLOCK_BITS]: the block of each code point's high bits
    blocks: np.ndarray  # uint8[U, 1 << _BLOCK_BITS]: class id of each code point of each distinct block
    invalid: int  # class id of a byte that is not valid UTF-8 (that of U+FFFD)
    end: int  # class id of END


def _mark(table: np.ndarray, chars: str, bits: int) -> None:
    for ch in chars:
        table[ord(ch)] |= bits


@functools.cache
def _char_tables() -> _CharTables:
    """Classes of all code points, from this Python's ``re`` / ``str`` (what the host parser runs on)."""
    everything = "".join(map(chr, range(_MAX_CODE_POINT + 1)))
    flags = np.zeros(_MAX_CODE_POINT + 1, np.int64)
    for pattern, bits in ((r"\s+", _SPACE | _LEAD | _LETTER_OPEN | _LONE_CLOSE | _ALT_CLOSE), (r"\w+", _WORD)):
        for m in re.finditer(pattern, everything):
            flags[m.start() : m.end()] |= bits
    # str.splitlines: every piece but the last ends with its break (no \r\n pair occurs in `everything`).
    for piece in everything.splitlines(keepends=True)[:-1]:
        flags[ord(piece[-1])] |= _BREAK
    _mark(flags, string.ascii_letters, _ALPHA | _ALNUM)
    _mark(flags, string.digits, _ALNUM)
    _mark(flags, string.ascii_lowercase, _LOWER)
    _mark(flags, _LEAD_CHARS, _LEAD)
    _mark(flags, _LETTER_OPENERS, _LETTER_OPEN)
    _mark(flags, _LONE_CLOSERS, _LONE_CLOSE)
    _mark(flags, _ALT_CLOSERS, _ALT_CLOSE)
    _mark(flags, _ALT_OPENERS, _ALT_OPEN)
    _mark(flags, _KEYWORD_CONNECTORS, _KEYWORD_CONN)
    _mark(flags, _STATE_CONNECTORS, _STATE_CONN)
    _mark(flags, _ALT_SEPARATORS, _ALT_SEP)
    _mark(flags, _MARKUP_CHARS, _MARKUP)
    for m in re.finditer(r"(?i)[A-Za-z0-9]", everything):
        flags[m.start()] |= _IALNUM
    for m in re.finditer(r"(?i)[A-Za-z]", everything):
        ch = m.group()
        folds = [k for k, low in enumerate(string.ascii_lowercase) if re.fullmatch("(?i)" + low, ch)]
        if len(folds) != 1:
            raise RuntimeError(f"(?i)[A-Za-z] matches {ch!r}, which folds to {len(folds)} ASCII letters")
        up = ch.upper()
        upper = MENU_LETTERS.index(up) + 1 if len(up) == 1 and up in MENU_LETTERS else _UPPER_NON_ASCII
        flags[m.start()] |= _IALPHA | (folds[0] + 1) << _FOLD_SHIFT | upper << _UPPER_SHIFT
    # Class ids of the non-ASCII code points: one per distinct flags value (found over runs, for speed).
    rest = flags[128:]
    run_starts = np.concatenate([[0], np.flatnonzero(np.diff(rest)) + 1])
    non_ascii, run_class = np.unique(rest[run_starts], return_inverse=True)
    run_class = np.repeat(run_class.reshape(-1), np.diff(np.append(run_starts, len(rest))))
    class_flags = np.concatenate([flags[:128], non_ascii, [_BREAK]]).astype(np.int32)
    if len(class_flags) > 256:
        raise RuntimeError(f"{len(class_flags)} character classes do not fit the uint8 tables")
    class_of = np.concatenate([np.arange(128), run_class + 128]).astype(np.uint8)
    distinct: dict[bytes, int] = {}
    block_of = np.array(
        [distinct.setdefault(row.tobytes(), len(distinct)) for row in class_of.reshape(-1, 1 << _BLOCK_BITS)]
    )
    if len(distinct) > 256:
        raise RuntimeError(f"{len(distinct)} distinct blocks do not fit the uint8 block index")
    blocks = np.frombuffer(b"".join(distinct), np.uint8).reshape(len(distinct), -1)
    return _CharTables(
        class_flags, block_of.astype(np.uint8), blocks, int(class_of[_REPLACEMENT_CHAR]), len(class_flags) - 1
    )


# UTF-8 lead bytes (RFC 3629 / Unicode Table 3-7): sequence length, and the allowed range of the 2nd byte.
def _utf8_lead_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    length = np.zeros(256, np.int32)
    lo = np.full(256, 0x80, np.int32)
    hi = np.full(256, 0xBF, np.int32)
    length[:0x80] = 1
    length[0xC2:0xE0] = 2
    length[0xE0:0xF0] = 3
    length[0xF0:0xF5] = 4
    lo[0xE0], hi[0xED], lo[0xF0], hi[0xF4] = 0xA0, 0x9F, 0x90, 0x8F
    return length, lo, hi


_UTF8_LENGTH, _UTF8_LO, _UTF8_HI = _utf8_lead_tables()

# ---------------------------------------------------------------------------------------------------------
# Vector helpers over one row (vmap adds the batch).
# ---------------------------------------------------------------------------------------------------------


def _shift(x: jax.Array, k: int, fill) -> jax.Array:
    """``y[p] = x[p + k]`` (``fill`` outside ``x``)."""
    if k == 0:
        return x
    pad = jnp.full((abs(k),), fill, x.dtype)
    return jnp.concatenate([x[k:], pad]) if k > 0 else jnp.concatenate([pad, x[:k]])


def _gather(i: jax.Array, *arrays: jax.Array) -> list[jax.Array]:
    """Each array's values at positions ``i``, in one gather of them stacked. ``i`` is clamped to the arrays,
    whose last position is END in every working array (so reading past the text reads END)."""
    stacked = jnp.stack([a.astype(jnp.int32) for a in arrays], axis=-1)
    rows = stacked[jnp.clip(i, 0, stacked.shape[0] - 1)]
    return [rows[..., k].astype(a.dtype) for k, a in enumerate(arrays)]


def _next_true(mask: jax.Array) -> jax.Array:
    """int32: the first ``q >= p`` with ``mask[q]``, else ``len(mask)``."""
    idx = jnp.arange(mask.shape[0], dtype=jnp.int32)
    return lax.cummin(jnp.where(mask, idx, mask.shape[0]), reverse=True)


def _prev_true(mask: jax.Array) -> jax.Array:
    """int32: the last ``q <= p`` with ``mask[q]``, else -1."""
    idx = jnp.arange(mask.shape[0], dtype=jnp.int32)
    return lax.cummax(jnp.where(mask, idx, -1))


def _compact(keep: jax.Array, values: jax.Array, fill: int) -> tuple[jax.Array, jax.Array]:
    """``values[keep]`` moved to the front (order kept), ``fill`` after; and the count kept."""
    size = keep.shape[0]
    # Dropped entries go to distinct out-of-range slots, so the indices stay unique.
    dest = jnp.where(keep, jnp.cumsum(keep, dtype=jnp.int32) - 1, size + jnp.arange(size, dtype=jnp.int32))
    out = jnp.full((size,), fill, values.dtype).at[dest].set(values, mode="drop", unique_indices=True)
    return out, jnp.sum(keep, dtype=jnp.int32)


def _fold_code(letter: str) -> int:
    """The fold field of an ASCII letter (1..26 for a..z, either case)."""
    return string.ascii_lowercase.index(letter.lower()) + 1


class _Chars:
    """A class-id row padded with END, with its packed flags unpacked on demand."""

    def __init__(self, cls: jax.Array, flags_table: jax.Array):
        self.cls = cls
        self.packed = flags_table[cls]
        self.fold = (self.packed >> _FOLD_SHIFT) & _FIELD_MASK
        self.upper = ((self.packed >> _UPPER_SHIFT) & _FIELD_MASK) - 1
        # The (?i) letters at p .. p + _WINDOW - 1, _FOLD_BITS bits each: one compare matches a word.
        self.window = functools.reduce(
            jnp.bitwise_or, (_shift(self.fold, k, 0) << (_FOLD_BITS * k) for k in range(_WINDOW))
        )

    def has(self, bits: int) -> jax.Array:
        return (self.packed & bits) != 0

    def match(self, word: str) -> jax.Array:
        """bool: ``word`` starts at p, case-insensitively (letters by their ``(?i)`` fold)."""
        hit = jnp.ones(self.cls.shape, bool)
        if word.isalpha():
            for start in range(0, len(word), _WINDOW):
                part = word[start : start + _WINDOW]
                code = sum(_fold_code(c) << (_FOLD_BITS * k) for k, c in enumerate(part))
                hit &= (_shift(self.window, start, 0) & ((1 << (_FOLD_BITS * len(part))) - 1)) == code
            return hit
        for k, ch in enumerate(word):
            if ch.isalpha():
                hit &= _shift(self.fold, k, 0) == _fold_code(ch)
            else:
                hit &= _shift(self.cls, k, -1) == ord(ch)
        return hit

    def word(self, word: str) -> jax.Array:
        """bool: ``word`` starts at p and a non-word character (or END) follows it (``word\\b``)."""
        return self.match(word) & ~_shift(self.has(_WORD), len(word), False)


# ---------------------------------------------------------------------------------------------------------
# The parser.
# ---------------------------------------------------------------------------------------------------------


def _decode(buf: jax.Array, n: jax.Array, tables: _CharTables) -> tuple[jax.Array, jax.Array]:
    """uint8 bytes (valid before ``n``) -> (int32 class ids of the characters, END-filled; their count)."""
    size = buf.shape[0]
    idx = jnp.arange(size, dtype=jnp.int32)
    b0 = jnp.where(idx < n, buf.astype(jnp.int32), 0)  # 0 after n: ASCII, never a continuation byte
    b1, b2, b3 = (_shift(b0, k, 0) for k in (1, 2, 3))
    length = jnp.asarray(_UTF8_LENGTH)[b0]

    def cont(b):
        return (b >= 0x80) & (b <= 0xBF)

    valid = (length == 1) | (
        (length >= 2)
        & (b1 >= jnp.asarray(_UTF8_LO)[b0])
        & (b1 <= jnp.asarray(_UTF8_HI)[b0])
        & ((length < 3) | cont(b2))
        & ((length < 4) | cont(b3))
    )
    valid &= idx + length <= n
    c1, c2, c3 = (b & 0x3F for b in (b1, b2, b3))  # continuation payloads
    cp = jnp.select(
        [length == 2, length == 3, length == 4],
        [(b0 & 0x1F) << 6 | c1, (b0 & 0x0F) << 12 | c1 << 6 | c2, (b0 & 0x07) << 18 | c1 << 12 | c2 << 6 | c3],
        b0,
    )
    cp = jnp.where(valid, cp, _REPLACEMENT_CHAR)  # in range for the table
    block = jnp.asarray(tables.block_of)[cp >> _BLOCK_BITS].astype(jnp.int32)
    cls = jnp.asarray(tables.blocks)[block, cp & ((1 << _BLOCK_BITS) - 1)].astype(jnp.int32)
    covered = jnp.zeros(size, bool)
    for k in (1, 2, 3):
        covered |= _shift(valid & (length > k), -k, False)
    return _compact((idx < n) & ~covered, cls, tables.end)


def _strip_think_and_markup(ch: _Chars, count: jax.Array, end: int) -> tuple[jax.Array, jax.Array]:
    """``_THINK.sub("\\n", .)`` then ``_MARKUP.sub("", .)`` -> (class ids, END-filled; count)."""
    size = ch.cls.shape[0]
    idx = jnp.arange(size, dtype=jnp.int32)
    opens, closes = ch.match(_THINK_OPEN), ch.match(_THINK_CLOSE)
    last_tag = _prev_true(opens | closes)
    (last_opens,) = _gather(last_tag, opens)
    inside = (last_tag >= 0) & last_opens  # the last tag at or before p opens
    opened_before = _shift(inside, -1, False)  # the last tag strictly before p opens
    closed_later = _next_true(closes) < size
    block_start = opens & ~opened_before & closed_later
    last_close = _prev_true(closes & opened_before)  # closing tags that end a block
    in_close = (last_close >= 0) & (idx < last_close + len(_THINK_CLOSE))
    removed = ((inside & closed_later) | in_close) & ~block_start
    run = ch.cls == ord(_MARKUP_RUN)
    markup = ch.has(_MARKUP) | (run & (_shift(run, -1, False) | _shift(run, 1, False)))
    cls = jnp.where(block_start, ord("\n"), ch.cls)
    return _compact((idx < count) & ~removed & ~markup, cls, end)


def _alternatives(ch: _Chars, nonspace: jax.Array, brk: jax.Array) -> jax.Array:
    """bool[p]: the ``_ALTERNATIVE`` chain starting right after a letter at p - 1 names a letter whose
    ``upper()`` differs from its predecessor's (i.e. the letters after the keyword are not all one)."""
    size = ch.cls.shape[0]
    # A link from p: closers, a separator at s (a symbol, or "or" / "and" with \b on both sides), \s*,
    # openers, a (?i) letter at v that no (?i) letter or digit follows.
    boundary = ~_shift(ch.has(_WORD), -1, False)
    sep_len = jnp.where(ch.has(_ALT_SEP), 1, 0)
    for w in _ALT_WORDS:
        sep_len = jnp.where(ch.word(w) & boundary, len(w), sep_len)
    after_sep = jnp.zeros(size, jnp.int32)
    for k in sorted({1, *map(len, _ALT_WORDS)}):
        after_sep = jnp.where(sep_len == k, _shift(nonspace, k, size), after_sep)
    s = _next_true(~ch.has(_ALT_CLOSE) | brk)
    s_len, u = _gather(s, sep_len, after_sep)
    (v,) = _gather(u, _next_true(~ch.has(_ALT_OPEN)))
    v_ok, v_upper = _gather(v, ch.has(_IALPHA) & ~_shift(ch.has(_IALNUM), 1, False), ch.upper)
    link = (s_len > 0) & v_ok
    differs = link & (v_upper != _shift(ch.upper, -1, -1))
    # Every link after the first starts right after a single (?i) letter: one not preceded by a letter and
    # followed by no (?i) letter or digit. Inside a link there is no such position (its only letters are
    # those of "or" / "and", preceded or followed by letters), so from such a node the chain visits the
    # consecutive nodes up to the first whose link fails.
    letter = ch.has(_IALPHA)
    node = _shift(letter, -1, False) & ~_shift(letter, -2, False) & ~ch.has(_IALNUM)
    counted = node & differs
    before = jnp.cumsum(counted, dtype=jnp.int32) - counted  # differing nodes before p
    (at_stop,) = _gather(_next_true(node & ~link), before)
    (from_next,) = _gather(v + 1, at_stop - before)  # differing nodes from the next node on
    return differs | (link & (from_next > 0))


def _parse_chars(ch: _Chars) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Lines of the stripped text -> (any candidate, one letter or the least, several letters)."""
    size = ch.cls.shape[0]
    space, brk = ch.has(_SPACE), ch.has(_BREAK)
    nonspace = _next_true(~space | brk)  # next non-space, or the line's end
    line_end = _next_true(brk)
    content = ~ch.has(_LEAD) & ~brk  # may start a line's content (after _LEAD's marks)
    before = _shift(_prev_true(content | brk), -1, -1)
    (brk_before,) = _gather(before, brk)
    start = content & ((before < 0) | brk_before)  # each non-empty line's content start

    # _STATE: (?i)^state\s*[:=\-]
    (state_conn,) = _gather(_shift(nonspace, len(_STATE_WORD), size), ch.has(_STATE_CONN))
    is_state = ch.match(_STATE_WORD) & state_conn

    # _KEYWORD.search: the leftmost keyword with \b on both sides (at q); rest starts after \s*, then
    # (\bis\b)? \s*, then a connector? \s*. Evaluated for a keyword at every p, then taken at q.
    word_start = ~_shift(ch.has(_WORD), -1, False)
    kw_len = jnp.zeros(size, jnp.int32)
    for kw in _KEYWORDS:
        kw_len = jnp.where(ch.word(kw) & word_start, len(kw), kw_len)
    r = jnp.zeros(size, jnp.int32)
    for k in sorted(set(map(len, _KEYWORDS))):
        r = jnp.where(kw_len == k, _shift(nonspace, k, size), r)
    conn = ch.has(_KEYWORD_CONN)
    nonspace1 = _shift(nonspace, 1, size)
    first_letter = _next_true(~ch.has(_LETTER_OPEN) | brk)  # _LETTER's openers skipped
    is_word, r_conn, r_ns1, r_ns_is, r_letter = _gather(
        r, ch.word(_KEYWORD_IS), conn, nonspace1, _shift(nonspace, len(_KEYWORD_IS), size), first_letter
    )
    s_conn, s_ns1, s_letter = _gather(r_ns_is, conn, nonspace1, first_letter)
    r_conn, r_ns1, r_letter = (
        jnp.where(is_word, b, a) for a, b in ((r_conn, s_conn), (r_ns1, s_ns1), (r_letter, s_letter))
    )
    (t_letter,) = _gather(r_ns1, first_letter)
    l = jnp.where(r_conn, t_letter, r_letter)  # noqa: E741  (the letter's position)

    # Facts about what follows a letter at p - 1 (so they are read at l + 1).
    spaced = space & ~brk  # \s+ inside the line
    contraction = jnp.zeros(size, bool)
    for c in _PRONOUN_CONTRACTIONS:
        contraction |= _shift(ch.word(c), 1, False)
    verb = jnp.zeros(size, bool)
    for v in _PRONOUN_VERBS:
        verb |= ch.word(v)
    or_and = ch.word(_ALT_WORDS[0]) | ch.word(_ALT_WORDS[1])
    next_verb, next_article = _gather(nonspace, verb, ch.has(_ALNUM) & ~or_and)
    pronoun_after = ((ch.cls == ord(_PRONOUN_APOSTROPHE)) & contraction) | (spaced & next_verb)
    article_after = spaced & next_article  # \s+ then a letter or digit, not "or" / "and"
    alternatives = _alternatives(ch, nonspace, brk)
    l_cls, l_packed, l_alnum_after, l_pronoun, l_article, l_alt = _gather(
        l,
        ch.cls,
        ch.packed,
        *(_shift(x, 1, False) for x in (ch.has(_ALNUM), pronoun_after, article_after, alternatives)),
    )
    has = lambda packed, bits: (packed & bits) != 0  # noqa: E731
    found = has(l_packed, _ALPHA) & ~l_alnum_after
    found &= ~((l_cls == ord(_PRONOUN_LETTER)) & l_pronoun) & ~(has(l_packed, _LOWER) & l_article)
    letter = ((l_packed >> _FOLD_SHIFT) & _FIELD_MASK) - 1
    q = _next_true(kw_len > 0)
    q_found, q_alt, q_letter = _gather(q, found, l_alt, letter)
    keyword_hit = start & ~is_state & (q < line_end) & q_found

    # _LONE: openers, an ASCII letter, then only closers to the end of the line.
    lone_packed, lone_rest = _gather(first_letter, ch.packed, _shift(_next_true(~ch.has(_LONE_CLOSE) | brk), 1, size))
    lone_hit = start & ~is_state & ~keyword_hit & has(lone_packed, _ALPHA) & (lone_rest == line_end)
    lone_letter = ((lone_packed >> _FOLD_SHIFT) & _FIELD_MASK) - 1

    use_keywords = jnp.any(keyword_hit)
    hit = jnp.where(use_keywords, keyword_hit, lone_hit)
    letter = jnp.where(use_keywords, q_letter, lone_letter)
    lo = jnp.min(jnp.where(hit, letter, len(MENU_LETTERS)))
    hi = jnp.max(jnp.where(hit, letter, -1))
    several = (lo != hi) | jnp.any(keyword_hit & q_alt)
    return jnp.any(hit), lo, several


def parse(buf: jax.Array, n: jax.Array, n_letters: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Parses one response's UTF-8 bytes as :func:`jaxopt_marl.parsing.parse_response` does.

    Exact for every byte string (see the module docstring): ``parse(b, len(b), k)`` gives the reason and
    letter index of ``parse_response(b.decode("utf-8", "replace"), string.ascii_uppercase[:k])``.

    Args:
        buf: uint8[C], the response's bytes; what lies at or after ``n`` is ignored.
        n: int32[], the response's length in bytes (clamped to 0..C).
        n_letters: int32[], the menu size: its letters are ``string.ascii_uppercase[:n_letters]`` (clamped
            to 0..26).

    Returns:
        ``(reason, letter)``: int32[] index into :data:`REASON_CODES`, and int32[] letter index 0..25 when
        reason is ok (:data:`REASON_OK`), else :data:`NO_LETTER` (-1). Never raises on content; vmap it over
        a batch of rows.

    Raises:
        ValueError: if ``buf`` is not a 1-D uint8 array or ``n`` / ``n_letters`` are not integer scalars.
    """
    buf = jnp.asarray(buf)
    if buf.ndim != 1 or buf.dtype != jnp.uint8:
        raise ValueError(f"buf must be uint8[C], got {buf.dtype}{list(buf.shape)}")
    n, n_letters = jnp.asarray(n), jnp.asarray(n_letters)
    for name, x in (("n", n), ("n_letters", n_letters)):
        if x.ndim != 0 or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} must be an integer scalar, got {x.dtype}{list(x.shape)}")
    tables = _char_tables()
    flags_table = jnp.asarray(tables.flags)
    padded = jnp.concatenate([buf, jnp.zeros(_PAD, jnp.uint8)])
    n = jnp.clip(n.astype(jnp.int32), 0, buf.shape[0])
    cls, count = _decode(padded, n, tables)
    chars = _Chars(cls, flags_table)
    empty = ~jnp.any((jnp.arange(cls.shape[0]) < count) & ~chars.has(_SPACE))  # not text.strip()
    cls, _ = _strip_think_and_markup(chars, count, tables.end)
    any_hit, letter, several = _parse_chars(_Chars(cls, flags_table))
    n_letters = jnp.clip(n_letters.astype(jnp.int32), 0, len(MENU_LETTERS))
    reason = jnp.select(
        [empty, ~any_hit, several, letter >= n_letters],
        [REASON_EMPTY, REASON_NO_CHOICE, REASON_MULTIPLE_CHOICES, REASON_INVALID_LETTER],
        REASON_OK,
    ).astype(jnp.int32)
    return reason, jnp.where(reason == REASON_OK, letter, NO_LETTER).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------------------
# Token ids -> bytes.
# ---------------------------------------------------------------------------------------------------------


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` inverted: the character a byte-level token uses for each byte.

    Printable Latin-1 bytes (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for themselves; the other 68
    bytes, in increasing order, take the characters U+0100, U+0101, ...
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + k): b for k, b in enumerate(others)})
    return table


class ByteTable(NamedTuple):
    """The raw bytes each token id contributes to ``tokenizer.decode(ids, skip_special_tokens=True)``.

    Attributes:
        bytes: uint8[V, W], token ``t``'s bytes in ``bytes[t, :lens[t]]`` (zeros after); W = the longest.
        lens: int32[V], their count (0 for special tokens).
    """

    bytes: jax.Array
    lens: jax.Array

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ByteTable:
        """Builds the table of a byte-level BPE tokenizer (``transformers`` fast or ``tokenizers``).

        The rule is that of the ``tokenizers`` ByteLevel decoder (measured on tokenizers 0.23): every token
        that decode keeps -- the model's tokens and non-special added tokens alike -- goes through it; a
        token whose characters all lie in GPT-2's byte alphabet (:func:`_byte_level_alphabet`) gives those
        bytes, any other token its UTF-8 text. Special added tokens give nothing under
        ``skip_special_tokens=True``. The bytes of a sequence, decoded with ``errors="replace"``, equal the
        tokenizer's decode (tests/test_parse_device.py checks the SmolLM2 vocabulary).

        Raises:
            ValueError: if the tokenizer is not a fast (``tokenizers``-backed) one or its decoder is not
                ByteLevel.
        """
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        decoder = getattr(backend, "decoder", None)
        if not hasattr(backend, "get_added_tokens_decoder"):
            raise ValueError(f"{type(tokenizer).__name__} is not a tokenizers-backed (fast) tokenizer")
        if type(decoder).__name__ != "ByteLevel":
            raise ValueError(
                f"the tokenizer's decoder is {type(decoder).__name__}, not ByteLevel: its tokens' bytes are not known"
            )
        alphabet = _byte_level_alphabet()
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        size = backend.get_vocab_size(with_added_tokens=True)
        raw = []
        for i in range(size):
            token = backend.id_to_token(i)
            if token is None or i in special:
                raw.append(b"")
            elif all(c in alphabet for c in token):
                raw.append(bytes(alphabet[c] for c in token))
            else:
                raw.append(token.encode("utf-8"))
        width = max(1, max(map(len, raw)))
        table = np.zeros((size, width), np.uint8)
        for i, b in enumerate(raw):
            table[i, : len(b)] = np.frombuffer(b, np.uint8)
        return cls(jnp.asarray(table), jnp.asarray([len(b) for b in raw], jnp.int32))


def response_bytes(table: ByteTable, tokens: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Concatenates the bytes of the tokens where ``mask`` is true, in order.

    Args:
        table: the tokenizer's :class:`ByteTable` (V ids, W bytes at most per token).
        tokens: int32[M] token ids; ids outside ``0..V-1`` contribute nothing.
        mask: bool[M], which tokens are part of the response (eos may be included: it has no bytes).

    Returns:
        ``(buf, n)``: uint8[C] with C = M * W, the bytes then zeros; int32[] the byte count. Vmappable.

    Raises:
        ValueError: if ``tokens`` / ``mask`` are not 1-D of one length.
    """
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    if tokens.ndim != 1 or mask.shape != tokens.shape:
        raise ValueError(f"tokens and mask must both be [M], got {list(tokens.shape)} and {list(mask.shape)}")
    vocab, width = table.bytes.shape
    m = tokens.shape[0]
    tokens = tokens.astype(jnp.int32)
    known = (tokens >= 0) & (tokens < vocab)
    ids = jnp.where(known, tokens, 0)
    lens = jnp.where(mask.astype(bool) & known, table.lens[ids], 0)
    ends = jnp.cumsum(lens, dtype=jnp.int32)
    n = jnp.sum(lens, dtype=jnp.int32)
    if m == 0:
        return jnp.zeros((0,), jnp.uint8), n
    j = jnp.arange(m * width, dtype=jnp.int32)
    slot = jnp.minimum(jnp.sum(j[:, None] >= ends[None, :], axis=1, dtype=jnp.int32), m - 1)
    k = jnp.clip(j - (ends - lens)[slot], 0, width - 1)
    buf = table.bytes[ids[slot], k]
    return jnp.where(j < n, buf, 0).astype(jnp.uint8), n


def parse_tokens(
    table: ByteTable, tokens: jax.Array, mask: jax.Array, n_letters: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """:func:`response_bytes` then :func:`parse`: int32[M] tokens (bool[M] mask) -> ``(reason, letter)``."""
    buf, n = response_bytes(table, tokens, mask)
    return parse(buf, n, n_letters)


__all__ = [
    "MENU_LETTERS",
    "NO_LETTER",
    "REASON_CODES",
    "REASON_EMPTY",
    "REASON_INVALID_LETTER",
    "REASON_MULTIPLE_CHOICES",
    "REASON_NO_CHOICE",
    "REASON_OK",
    "ByteTable",
    "parse",
    "parse_tokens",
    "response_bytes",
]
