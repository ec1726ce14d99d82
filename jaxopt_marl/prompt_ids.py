"""Prompt token ids assembled on the device from pre-tokenized fragments (the jitted decision loop's prompts).

:class:`PromptIds` produces, inside a jitted program, exactly the token ids that
:class:`jaxopt_marl.rollout.LLMPolicy` encodes on the host for one decision: the chat rendering
``render_chat(tok, [system, user])`` with the shared system-turn prefix (``prefix_text``) stripped, plus, in
``choice_only`` mode, the response prefix ``"state: <label>\\nchoice:"`` -- one string, one encode. The user
message is the text of :func:`jaxopt_marl.prompts.user_message` (the readable reference) with the menu of
:func:`jaxopt_marl.menus.render_menu`.

Fragment scheme
    The suffix is a fixed sequence of *slots* per game (the template). Each slot picks one *fragment* (a
    string) from a small variant table with an index computed from the state: static text, a name (facing,
    item, option label piece, macro name, state label, letter ``"A)"``), a list separator, or one *chunk* of a
    number. A number is written as its decimal digits cut into chunks of :data:`CHUNK_DIGITS` from the left
    (``1234567`` -> ``123 456 7``), each chunk looked up in a table of every 1-3 digit string, so numbers of
    any int32 size come out exact (no table limit, no truncation). Absent slots pick the empty fragment.
    Every fragment was tokenized alone at construction and laid out in one row table (a fragment spans
    ``ceil(tokens / ROW_WIDTH)`` rows); a pick is index arithmetic into it, and the numbers of one suffix are
    computed in one vectorised pass. The suffix is the concatenation of the picked fragments' token ids:
    each row's token count, offsets by cumsum, one gather of the rows' tokens and one scatter into a
    left-padded ``int32[max_len]`` buffer. Static shapes, no host callbacks.

Why concatenation equals tokenizing the whole string
    BPE merges never cross pre-tokens, so it suffices that every fragment boundary is a pre-token boundary
    of the whole string and that each fragment pre-tokenizes alone as it does in context. Boundaries are
    placed only where the split regexes always split (SmolLM2: ``Digits(individual_digits=True)`` then the
    GPT-2 ByteLevel regex; also the Qwen2 and Llama-3 regexes of :mod:`lora.tokenizer`):

    - next to a digit (digits never join a non-digit piece; digit runs are cut in threes from the left,
      which is Llama-3's ``\\p{N}{1,3}`` and compatible with one-digit pieces); a single space before a digit
      is a piece of its own in all three (``"Step " | "4"``);
    - between a letter and a punctuation mark (``North|.``) or a punctuation mark and a space (``:| none``);
      otherwise a space starts the next fragment (``" ?\\p{L}+"`` attaches it to the next word);
    - after a single newline before a letter or a digit (``\\n|B)``).

    Never between two punctuation marks (``")" + ","`` is one GPT-2 piece ``"),"``), never between a
    punctuation mark and a newline (Llama-3 / Qwen2 take ``"):\\n\\n"`` as one piece), never between a
    punctuation mark and a letter (Llama-3 / Qwen2 take ``"=North"``, ``"(episode"`` as one piece), and never
    after a run of two or more whitespace characters (GPT-2's ``\\s+(?!\\S)`` splits ``"\\n\\nC"`` as
    ``"\\n" "\\n" "C"`` but ``"\\n\\n"`` alone as one piece). So the text around a variable part travels
    with it: ``" North.\\n"``, ``"=onion"``, ``")\\n\\nChoose"`` (the last menu line's end), ``"), player "``.
    Adjacent static pieces are merged into one fragment.

    The template mirrors the f-strings of :func:`jaxopt_marl.prompts.user_message` (the tests compare the two
    on real decisions). The construction checks the scheme against the given tokenizer (on the host: the same
    template code runs on numpy): each fragment decodes back to itself, every
    number chunking of ``0..999`` and ``100000..100999`` equals the whole number's tokens, and
    :data:`CHECK_SAMPLES` synthetic decisions (random fields covering every letter, option, name, list
    length, absent/present pattern and number size) assemble to ids equal to tokenizing their decoded text;
    a tokenizer that breaks the scheme raises ``ValueError`` naming the game, the tokenizer's pre-tokenizer
    and the first offending text.

Interfaces
    ``menu`` (the default) writes :func:`jaxopt_marl.prompts.user_message`. ``native`` (paper §4, the game's
    primitive actions, :class:`jaxopt_marl.interfaces.NativeLibrary`) writes
    :func:`jaxopt_marl.interfaces.user_message`'s native text with the same template and three differences, each
    taken from :mod:`jaxopt_marl.interfaces` rather than restated: the system turn is
    :func:`jaxopt_marl.interfaces.system_message`'s (so another shared K/V prefix); after the world lines comes
    the layout hint line, a pick among the host's own :func:`jaxopt_marl.interfaces.layout_hint` texts of every
    map cell by the agent's cell (:func:`jaxopt_marl.interfaces.layout_hint_table`: Cleanup's region and river /
    orchard side words, Harvest's nearest patch and its direction, the static kitchen line; the hint reads
    nothing else), one fragment ``"Layout: ... .\n"`` between the view's last newline and ``"Step "``; the memory
    line's noun is :data:`jaxopt_marl.interfaces.MEMORY_NOUNS`' (``- Last 5 actions:``), and the memory codes
    and menu lines are the NativeLibrary's actions (the fixed letters of
    :func:`jaxopt_marl.interfaces.fixed_letters` are just one letter assignment the menu slots take). The
    construction check draws at least one synthetic decision per hint text.

The slots that differ between games belong to the family's view (:attr:`jaxopt_marl.prompts.PromptFamily.view`):
one device template per view in :data:`_TEMPLATES` (``kitchen``: :class:`_KitchenTemplate`, Overcooked; ``window``:
:class:`_WindowTemplate`, Melting Pot), the twins of :data:`jaxopt_marl.prompts.VIEWS`. Melting Pot "in view" is
:func:`jaxopt_marl.prompts.mp_view` (the library's view ranking); the ``state:``
label is :func:`state_label_code` (= :func:`jaxopt_marl.prompts.state_label`). Team values are integer counts:
the memory's ``team_at_last`` is float32, exact below 2**24; the difference is written with its sign.
"""

from __future__ import annotations

import string
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxopt_marl import games, interfaces, menus, prompts
from jaxopt_marl.options import meltingpot_common as mpc
from jaxopt_marl.paths import UNREACHABLE
from lora.tokenizer import render_chat

#: Digits per number chunk: Llama-3's split regex groups a digit run in threes from the left (``\p{N}{1,3}``);
#: SmolLM2 (``Digits(individual_digits=True)``) and Qwen2 (``\p{N}``) isolate every digit, so the same
#: chunking is exact for all three.
CHUNK_DIGITS = 3
#: Decimal digits of the largest int32 (2**31 - 1): the capacity of numbers with no structural bound (step,
#: team values).
INT32_DIGITS = 10
#: Tokens per row of the fragment table (a fragment of n tokens takes ceil(n / ROW_WIDTH) rows).
ROW_WIDTH = 4
#: Synthetic decisions tokenized by the construction check.
CHECK_SAMPLES = 48
#: The memory line's name of a decision that started no option (the host trace's ``opt_name``).
IDLE_NAME = "idle"
#: The ``choice_only`` response prefix (:meth:`jaxopt_marl.rollout.LLMPolicy.prompt_texts`).
RESPONSE_PREFIX = "state: {label}\nchoice:"
#: Menu lines one menu can letter.
MAX_MENU_LINES = len(menus.LETTERS)
MODES = ("sample", "choice_only")
#: The interfaces with a device template (:mod:`jaxopt_marl.interfaces`; ``compound_json`` plays the host loop).
DEVICE_INTERFACES = (interfaces.MENU, interfaces.NATIVE)

_BIG = np.int32(2**31 - 1)
# Every chunk string: "" (absent), "0".."9", "00".."99", "000".."999"; _CHUNK_BASE[n] = index of the first
# n-digit chunk.
_CHUNKS = ("",) + tuple(f"{v:0{n}d}" for n in range(1, CHUNK_DIGITS + 1) for v in range(10**n))
_CHUNK_BASE = np.array([0] + [1 + sum(10**m for m in range(1, n)) for n in range(1, CHUNK_DIGITS + 1)], np.int32)
_POW10 = np.array([10**k for k in range(INT32_DIGITS)], np.int32)


def _digits(v: int) -> int:
    """Decimal digits of a non-negative int."""
    return len(str(int(v)))


# ---------------------------------------------------------------------------------------------------------
# Memory (device twin of prompts.Memory)
# ---------------------------------------------------------------------------------------------------------


class AgentMemory(NamedTuple):
    """One agent's memory on the device (leading batch axes allowed).

    Attributes:
        macros: ``int32[..., MEMORY_MACROS]`` codes of the last decided macros, oldest first, packed at the end
            (right-aligned); -1 = empty. Code = option id, or :func:`IDLE_CODE` for ``"idle"``.
        team_at_last: ``float32[...]`` the team return when the agent last decided (an integer count).
    """

    macros: jax.Array
    team_at_last: jax.Array


def IDLE_CODE(lib) -> int:  # noqa: N802 (the interface name)
    """The memory code of ``"idle"`` (a decision that started no option): ``len(lib.option_names)``."""
    return len(lib.option_names)


def empty_memory(shape=()) -> AgentMemory:
    """An empty memory with leading axes ``shape``."""
    shape = tuple(shape)
    return AgentMemory(jnp.full(shape + (prompts.MEMORY_MACROS,), -1, jnp.int32), jnp.zeros(shape, jnp.float32))


def remember(mem: AgentMemory, code: jax.Array, team: jax.Array) -> AgentMemory:
    """:meth:`jaxopt_marl.prompts.Memory.remember` (jittable): append ``code`` (``int32[...]``), keep the last
    ``MEMORY_MACROS``, and store ``team`` (the team return now) as ``team_at_last``."""
    code = jnp.broadcast_to(jnp.asarray(code, jnp.int32), mem.macros.shape[:-1])
    macros = jnp.concatenate([mem.macros[..., 1:], code[..., None]], axis=-1)
    team = jnp.broadcast_to(jnp.asarray(team, jnp.float32), mem.team_at_last.shape)
    return AgentMemory(macros, team)


def host_memory(lib, mem: AgentMemory) -> prompts.Memory:
    """The :class:`jaxopt_marl.prompts.Memory` of one agent's device memory (host side)."""
    names = tuple(lib.option_names) + (IDLE_NAME,)
    codes = np.asarray(mem.macros).reshape(-1)
    return prompts.Memory(macros=[names[int(c)] for c in codes if c >= 0], team_at_last=float(mem.team_at_last))


# ---------------------------------------------------------------------------------------------------------
# State labels
# ---------------------------------------------------------------------------------------------------------


def state_label_code(game: str, lib, env_state, aid) -> jax.Array:
    """``int32[]`` index of the agent's ``state:`` label in ``prompts.prompt_family(game).labels`` (jittable;
    the same rule as :func:`jaxopt_marl.prompts.state_label`)."""
    return _TEMPLATES[prompts.prompt_family(game).view].label_code(game, lib, env_state, aid)


# ---------------------------------------------------------------------------------------------------------
# Fragment tables
# ---------------------------------------------------------------------------------------------------------


class _Fragments:
    """Variant tables of fragments and their token rows.

    Two passes over the template: a *collect* pass (``built`` false) only records every variant table the
    template picks from; :meth:`finalize` tokenizes every distinct fragment alone and lays the tables out in
    one row table (``row_tok int32[NR, width]``, ``row_len int32[NR]``): variant ``v`` of table ``t`` owns the
    ``R_t`` consecutive rows from ``base_t + v * R_t`` (``R_t`` = rows of the table's longest variant; shorter
    variants are padded with empty rows). A pick is then index arithmetic only; the one gather of tokens
    happens at assembly. Later passes also add up the worst-case token count in ``worst``.
    """

    def __init__(self, width: int):
        self.width = width
        self.tables: dict[tuple[str, ...], int] = {}
        self.built = False
        self.worst = 0

    def finalize(self, tok, where: str) -> None:
        strings = sorted({s for t in self.tables for s in t} - {""})
        enc = tok(strings, add_special_tokens=False)["input_ids"] if strings else []
        self.tokens = {"": []}
        for s, ids in zip(strings, enc):
            if tok.decode(ids) != s:
                raise ValueError(f"{where}: fragment {s!r} does not decode back to itself ({tok.decode(ids)!r})")
            self.tokens[s] = list(ids)
        w = self.width
        rows = [[]]  # row 0: empty
        self.layout: dict[tuple[str, ...], tuple[int, int]] = {}
        self.table_max: dict[tuple[str, ...], int] = {}
        for t in self.tables:
            chunks = [[self.tokens[s][i : i + w] for i in range(0, len(self.tokens[s]), w)] for s in t]
            r = max(1, max(len(c) for c in chunks))
            self.layout[t] = (len(rows), r)
            self.table_max[t] = max(len(self.tokens[s]) for s in t)
            for c in chunks:
                rows += c + [[]] * (r - len(c))
        self.row_tok = np.zeros((len(rows), w), np.int32)
        self.row_len = np.array([len(r) for r in rows], np.int32)
        for i, r in enumerate(rows):
            self.row_tok[i, : len(r)] = r
        self.built = True

    def pick(self, variants: tuple[str, ...], idx, worst: int | None = None, xp=jnp) -> jax.Array:
        """Row ids ``int32[*idx.shape, R]`` of ``variants[idx]``; adds ``worst`` (default: the longest variant's
        tokens times ``idx.size``) to the worst-case length."""
        idx = xp.asarray(idx, np.int32)
        if not self.built:
            self.tables.setdefault(variants, len(self.tables))
            return xp.zeros(idx.shape + (1,), np.int32)
        self.worst += self.table_max[variants] * int(np.prod(idx.shape, dtype=np.int64)) if worst is None else worst
        base, r = self.layout[variants]
        if len(variants) == 1:
            return xp.broadcast_to(xp.arange(base, base + r, dtype=np.int32), idx.shape + (r,))
        return base + idx[..., None] * r + xp.arange(r, dtype=np.int32)

    def number_worst(self, cap: int) -> int:
        """Most tokens of one number of at most ``cap`` digits."""
        longest = {k: max(len(self.tokens[s]) for s in _CHUNKS if len(s) == k) for k in range(1, CHUNK_DIGITS + 1)}
        return sum(longest[min(CHUNK_DIGITS, cap - c)] for c in range(0, cap, CHUNK_DIGITS))

    def numbers(self, requests: list[tuple[jax.Array, jax.Array, int, bool]], xp=jnp) -> jax.Array:
        """Row ids of every number of one suffix in one vectorised pass: ``requests`` = ``(value int32[...] >= 0,
        present bool[...], cap digits, counted in the worst case)``; each value's decimal digits in chunks of
        :data:`CHUNK_DIGITS` from the left (``ceil(cap / CHUNK_DIGITS)`` chunk slots, empty where absent or past
        the last digit).

        Returns:
            ``int32[M]``: the requests' chunk rows, request by request, each row-major over ``value.shape + (
            chunks,)`` (a chunk is at most 3 tokens, so one row).
        """
        vals = xp.concatenate([r[0].reshape(-1) for r in requests])
        pres = xp.concatenate([r[1].reshape(-1) for r in requests])
        nd = 1 + xp.sum(vals[:, None] >= xp.asarray(_POW10[1:]), axis=-1, dtype=np.int32)
        start = np.arange(0, INT32_DIGITS, CHUNK_DIGITS, dtype=np.int32)  # [C_max]
        n = xp.clip(nd[:, None] - start, 0, CHUNK_DIGITS)  # [M, C_max] digits of each chunk
        pow10 = xp.asarray(_POW10)
        val = (vals[:, None] // pow10[xp.maximum(nd[:, None] - start - n, 0)]) % pow10[n]
        idx = xp.where(pres[:, None] & (n > 0), xp.asarray(_CHUNK_BASE)[n] + val, 0)
        worst = 0
        if self.built:
            worst = sum(
                self.number_worst(cap) * int(np.prod(v.shape, dtype=np.int64))
                for v, _, cap, counted in requests
                if counted
            )
        rows = self.pick(_CHUNKS, idx, worst, xp)[..., 0]  # [M, C_max]
        out, at = [], 0
        for v, _, cap, _ in requests:
            size = int(np.prod(v.shape, dtype=np.int64))
            out.append(rows[at : at + size, : -(-cap // CHUNK_DIGITS)].reshape(-1))
            at += size
        return xp.concatenate(out)


class _Emit:
    """The template writer of one suffix: static text (merged until the next variable slot), picks, numbers,
    and lists (per-entry columns interleaved entry by entry).

    A *piece* is ``(rows int32[...], tags)``: fragment row ids and a numpy array of the same shape that is 0,
    or ``k + 1`` where the element is chunk ``k`` of the suffix's numbers. Numbers are placeholders until
    :meth:`rows`, which computes them all at once (:meth:`_Fragments.numbers`) and puts them in place with one
    gather of static indices. ``xp`` is ``jax.numpy`` (device) or ``numpy`` (the construction check runs the
    same template on the host).
    """

    def __init__(self, frags: _Fragments, xp=jnp):
        self.f, self.xp = frags, xp
        self.out: list[tuple[jax.Array, np.ndarray]] = []
        self.text = ""
        self.nums: list[tuple[jax.Array, jax.Array, int, bool]] = []
        self.n_tags = 0

    # -- pieces (not written) --

    def p(self, variants, idx, counted: bool = True) -> tuple[jax.Array, np.ndarray]:
        """The piece of ``variants[idx]`` (``counted``: its longest variant adds to the worst case; else the
        caller accounts for it)."""
        rows = self.f.pick(tuple(variants), idx, None if counted else 0, self.xp)
        return rows, np.zeros(rows.shape, np.int64)

    def n(self, value, cap: int, present=True, counted: bool = True) -> tuple[jax.Array, np.ndarray]:
        """The piece of number ``value`` (``int32[...]`` >= 0, at most ``cap`` digits), absent where not
        ``present``."""
        v = self.xp.asarray(value, np.int32)
        shape = v.shape + (-(-cap // CHUNK_DIGITS),)
        size = int(np.prod(shape, dtype=np.int64))
        tags = np.arange(self.n_tags + 1, self.n_tags + 1 + size, dtype=np.int64).reshape(shape)
        self.n_tags += size
        self.nums.append((v, self.xp.broadcast_to(self.xp.asarray(present, bool), v.shape), cap, counted))
        return self.xp.zeros(shape, np.int32), tags

    def opt(self, s: str, present) -> tuple[jax.Array, np.ndarray]:
        """The piece of static ``s`` where ``present`` (else nothing)."""
        return self.p(("", s), self.xp.asarray(present, np.int32))

    # -- writing --

    def lit(self, s: str) -> None:
        self.text += s

    def _flush(self) -> None:
        if self.text:
            self.out.append(self.p((self.text,), 0))
            self.text = ""

    def pick(self, variants, idx) -> None:
        self._flush()
        self.out.append(self.p(variants, idx))

    def num(self, value, cap: int, present=True) -> None:
        self._flush()
        self.out.append(self.n(value, cap, present))

    def entries(self, *cols: tuple[jax.Array, np.ndarray]) -> None:
        """A list of E entries: ``cols`` are pieces of shape ``[E, R_c]``, written entry by entry."""
        self._flush()
        self.out.append(
            (
                self.xp.concatenate([r for r, _ in cols], axis=-1).reshape(-1),
                np.concatenate([t for _, t in cols], axis=-1).reshape(-1),
            )
        )

    def rows(self) -> jax.Array:
        """``int32[S]`` row ids of the whole suffix."""
        self._flush()
        rows = self.xp.concatenate([r.reshape(-1) for r, _ in self.out])
        tags = np.concatenate([t.reshape(-1) for _, t in self.out])
        if not self.nums:
            return rows
        chunks = self.f.numbers(self.nums, self.xp)  # [n_tags], tag order
        return self.xp.where(self.xp.asarray(tags > 0), chunks[np.maximum(tags - 1, 0)], rows)


def _label_parts(label: str, where: str) -> tuple[list[str], list[str]]:
    """``(literals [k + 1], fields [k])`` of a menu label template (fields ``x`` / ``y`` only)."""
    lits, fields = [""], []
    for lit, field, spec, conv in string.Formatter().parse(label):
        lits[-1] += lit
        if field is None:
            continue
        if field not in ("x", "y") or spec or conv:
            raise ValueError(f"{where}: label {label!r} has field {{{field}}}; only {{x}} and {{y}} are supported")
        fields.append(field)
        lits.append("")
    return lits, fields


# ---------------------------------------------------------------------------------------------------------
# Views: the template slots that differ between the kitchen and the Melting Pot window
# ---------------------------------------------------------------------------------------------------------


class _KitchenTemplate:
    """Overcooked's part of the template (view ``kitchen``, :class:`jaxopt_marl.prompts.KitchenView`): the
    players, the pots (status and path distances) and the counters' items; the twin of
    :func:`jaxopt_marl.prompts._overcooked_lines`.

    Attributes:
        shape: the map's ``(H, W)``; cap_dist: digits of the largest finite path distance on the map.
        pots ``int32[P, 2]``, pot_dist ``int32[P, H * W]`` (path length from each cell onto each pot),
        counters ``int32[K, 2]``, ctr_table: the counter items' fragments (first entry / later entries).
    """

    def __init__(self, game: str, lib):
        info = lib.info
        h, w = info.height, info.width
        self.shape, self.width = (h, w), w
        finite = lib.pose_dist[lib.pose_dist < UNREACHABLE]
        self.cap_dist = _digits(int(finite.max()) if finite.size else 0)
        self.pots = np.asarray(info.pots, np.int32).reshape(-1, 2)
        self.pot_dist = jnp.asarray(lib.pose_dist[self.pots[:, 0] * w + self.pots[:, 1]].astype(np.int32))
        self.counters = np.asarray(info.counters, np.int32).reshape(-1, 2)
        items = prompts.OC_ITEMS
        ctr = [""]
        for rc in self.counters:
            xy = f"({int(rc[1])}, {int(rc[0])}"
            ctr += [f" {it}@{xy}" for it in items] + [f"), {it}@{xy}" for it in items]
        self.ctr_table = tuple(ctr)

    @staticmethod
    def label_code(game: str, lib, env_state, aid) -> jax.Array:
        """:func:`jaxopt_marl.prompts.overcooked_label_code` of the state."""
        from envs_jax import overcooked as oc

        view = oc.pot_view(env_state, lib.info.pots)
        return prompts.overcooked_label_code(oc.held_items(env_state), view.onions, view.cooking, view.ready, aid)

    def fields(self, ids: PromptIds, env_state, aid) -> dict:
        """The kitchen's fields of one decision (jittable)."""
        from envs_jax import overcooked as oc

        pos = oc.agent_positions(env_state)
        view = oc.pot_view(env_state, self.pots)
        pflat = pos[:, 0] * self.width + pos[:, 1]
        return dict(
            pos=pos,
            facing=oc.agent_facing(env_state),
            held=oc.held_items(env_state),
            pot_onions=view.onions,
            pot_cooking=view.cooking,
            pot_ready=view.ready,
            pot_d=jnp.stack([self.pot_dist[:, pflat[aid]], self.pot_dist[:, pflat[1 - aid]]], -1),
            counter=oc.cells_items(env_state, self.counters),
        )

    def random_fields(self, ids: PromptIds, rng, ar, cells, dists) -> dict:
        """Synthetic kitchen fields of ``len(ar)`` decisions (:meth:`PromptIds._random_fields`)."""
        b = ar.shape[0]
        n_pot, n_ctr = len(self.pots), len(self.counters)
        ready = rng.random((b, n_pot)) < 0.3
        return dict(
            pos=cells(b, 2),
            facing=rng.integers(0, 4, (b, 2)).astype(np.int32),
            held=rng.integers(0, 4, (b, 2)).astype(np.int32),
            pot_onions=rng.integers(0, 4, (b, n_pot)).astype(np.int32),
            pot_ready=ready,
            pot_cooking=~ready & (rng.random((b, n_pot)) < 0.4),
            pot_d=dists(b, n_pot, 2),
            counter=np.where(rng.random((b, n_ctr)) < 0.5, 0, rng.integers(1, 4, (b, n_ctr))).astype(np.int32),
        )

    @staticmethod
    def _xy(e: _Emit, rc, cap: int) -> None:
        """``x, y`` of a (row, col) position: column first, as the host prompt writes it."""
        e.num(rc[1], cap)
        e.lit(", ")
        e.num(rc[0], cap)

    def rows(self, ids: PromptIds, e: _Emit, f: dict) -> None:
        """The kitchen's slots of the user message."""
        xp = e.xp
        cxy, aid = ids._cap_xy, f["aid"]
        p = 1 - aid
        pos, facing, held = f["pos"], f["facing"], f["held"]
        e.lit("You are player ")
        e.num(aid, ids._cap_agent)
        e.lit(". World position: (")
        self._xy(e, pos[aid], cxy)
        e.lit(").\nFacing:")
        e.pick([f" {n}." for n in prompts.OC_FACING], facing[aid])
        e.lit(" Holding:")
        e.pick([f" {n}.\n" for n in prompts.OC_ITEMS], held[aid])
        e.lit("Partner (player ")
        e.num(p, ids._cap_agent)
        e.lit("): pos=(")
        self._xy(e, pos[p], cxy)
        e.lit(") facing")
        e.pick([f"={n}" for n in prompts.OC_FACING], facing[p])
        e.lit(" holding")
        e.pick([f"={n}" for n in prompts.OC_ITEMS], held[p])
        e.lit(".\n\nPots:")
        for i, pot in enumerate(self.pots):
            e.lit(f"\n  - pot@({int(pot[1])}, {int(pot[0])}):")
            ready, cooking = f["pot_ready"][i], f["pot_cooking"][i]
            idle = ~ready & ~cooking
            e.pick((" ready", " cooking", " "), xp.where(ready, 0, xp.where(cooking, 1, 2)))
            e.num(f["pot_onions"][i], 1, idle)  # 0..3: two bits of the pot's item code
            e.pick(("", "/3 onions"), idle)
            for who, sep in ((0, "; you:"), (1, " | partner:")):
                d = f["pot_d"][i, who]
                e.lit(sep)
                e.pick((" ", " unreachable"), d >= UNREACHABLE)
                e.num(xp.maximum(d, 0), ids._cap_dist, d < UNREACHABLE)
        e.lit("\nCounters:")
        items = xp.clip(f["counter"], 0, len(prompts.OC_ITEMS) - 1)
        on = items != 0
        first = on & (xp.cumsum(on) == 1)
        k = xp.arange(on.shape[0])
        n_it = len(prompts.OC_ITEMS)
        idx = xp.where(on, 1 + k * 2 * n_it + xp.where(first, 0, n_it) + items, 0)
        e.entries(e.p(self.ctr_table, idx))
        e.pick((" (empty)\n", ")\n"), on.any())


class _WindowTemplate:
    """Melting Pot's part of the template (view ``window``, :class:`jaxopt_marl.prompts.WindowView`): the
    agent, the listed objects in its window (:func:`jaxopt_marl.prompts.mp_view`) and the partners in view; the
    twin of :func:`jaxopt_marl.prompts._meltingpot_lines`.

    Attributes:
        shape: the map's ``(H, W)``; cap_dist: digits of the largest finite path length on the map.
        dirt: the game has dirt (:attr:`jaxopt_marl.games.GameInfo.dirt`); classes: ``(key, name)`` of each
            listed object class (apples, and dirt where the game has it).
    """

    def __init__(self, game: str, lib):
        self.shape = tuple(lib.shape)
        finite = lib.dest[: lib.num_cells][lib.dest[: lib.num_cells] < mpc.FAR]
        self.cap_dist = _digits(int(finite.max()) if finite.size else 0)
        self.dirt = games.info(game).dirt
        self.classes = (("apples", "Apples"), ("dirt", "Dirt")) if self.dirt else (("apples", "Apples"),)

    @staticmethod
    def label_code(game: str, lib, env_state, aid) -> jax.Array:
        """:func:`jaxopt_marl.prompts.meltingpot_label_code` of the state."""
        dirt = env_state.dirt if games.info(game).dirt else None
        return prompts.meltingpot_label_code(env_state.pos, env_state.facing, aid, env_state.apples, dirt)

    def fields(self, ids: PromptIds, env_state, aid) -> dict:
        """The window's fields of one decision (jittable)."""
        dirt = env_state.dirt if self.dirt else None
        view = prompts.mp_view(
            ids.view_lib, env_state.pos, env_state.facing, env_state.alive, aid, env_state.apples, dirt
        )
        f = dict(
            pos=env_state.pos[aid],
            facing=env_state.facing[aid],
            partner_on=view["partners"],
            partner_pos=env_state.pos,
        )
        for cls, _ in self.classes:
            v = view[cls]
            f.update({f"n_{cls}": v.count, f"near_{cls}": v.target, f"near_ok_{cls}": v.valid, f"near_d_{cls}": v.dist})
        return f

    def random_fields(self, ids: PromptIds, rng, ar, cells, dists) -> dict:
        """Synthetic window fields of ``len(ar)`` decisions (:meth:`PromptIds._random_fields`)."""
        b, n = ar.shape[0], ids._n_agents
        f = dict(
            pos=cells(b),
            facing=(ar % 4).astype(np.int32),
            partner_on=rng.random((b, n)) < 0.5,
            partner_pos=cells(b, n),
        )
        for cls, _ in self.classes:
            cnt = np.where(ar % 5 == 0, 0, rng.integers(1, mpc.WINDOW_CELLS + 1, b))
            ok = np.arange(prompts.MAX_LISTED)[None] < np.minimum(cnt, prompts.MAX_LISTED)[:, None]
            f.update(
                {
                    f"n_{cls}": cnt.astype(np.int32),
                    f"near_{cls}": np.where(ok[..., None], cells(b, prompts.MAX_LISTED), -1).astype(np.int32),
                    f"near_ok_{cls}": ok,
                    f"near_d_{cls}": np.where(ok, dists(b, prompts.MAX_LISTED), -1).astype(np.int32),
                }
            )
        return f

    def rows(self, ids: PromptIds, e: _Emit, f: dict) -> None:
        """The window's slots of the user message."""
        xp = e.xp
        cxy = ids._cap_xy
        e.lit("You are player ")
        e.num(f["aid"], ids._cap_agent)
        e.lit(". World position: (")
        e.num(f["pos"][1], cxy)
        e.lit(", ")
        e.num(f["pos"][0], cxy)
        e.lit("). Facing:")
        e.pick([f" {n}.\n" for n in prompts.MP_FACING], f["facing"])
        for cls, name in self.classes:
            e.lit(f"{name} in view: ")
            e.num(f[f"n_{cls}"], _digits(mpc.WINDOW_CELLS))
            ok, tgt, d = f[f"near_ok_{cls}"], f[f"near_{cls}"], f[f"near_d_{cls}"]
            first = xp.arange(ok.shape[0]) == 0
            reach = d < UNREACHABLE
            e.entries(
                e.p(("", " (nearest: (", ", ("), xp.where(ok, xp.where(first, 1, 2), 0)),
                e.n(tgt[:, 1], cxy, ok),
                e.opt(", ", ok),
                e.n(tgt[:, 0], cxy, ok),
                e.opt(") d", ok),
                e.p(("", "=", "=unreachable"), xp.where(ok, xp.where(reach, 1, 2), 0)),
                e.n(xp.maximum(d, 0), ids._cap_dist, ok & reach),
            )
            e.pick(("\n", ")\n"), ok[0])
        on = f["partner_on"]
        first = on & (xp.cumsum(on) == 1)
        e.lit("Partners in view:")
        e.entries(
            e.p(("", " player ", "), player "), xp.where(on, xp.where(first, 1, 2), 0)),
            e.n(xp.arange(on.shape[0]), ids._cap_agent, on),
            e.opt(" @ (", on),
            e.n(f["partner_pos"][:, 1], cxy, on),
            e.opt(", ", on),
            e.n(f["partner_pos"][:, 0], cxy, on),
        )
        e.pick((" none\n", ")\n"), on.any())


#: The device template of each view (:attr:`jaxopt_marl.prompts.PromptFamily.view`).
_TEMPLATES = {"kitchen": _KitchenTemplate, "window": _WindowTemplate}


# ---------------------------------------------------------------------------------------------------------
# PromptIds
# ---------------------------------------------------------------------------------------------------------


class PromptIds:
    """Device assembly of one game's prompt suffix tokens (see the module docstring).

    Args:
        game: ``cleanup``, ``harvest``, ``overcooked_aa`` or ``overcooked_fc``.
        env: its environment; lib: its option library; tokenizer: the policy's tokenizer (chat template).
        mode: ``"sample"`` or ``"choice_only"`` (appends the response prefix ``state: <label>\\nchoice:``).
        max_steps: the episode length written in ``Step t/T``.
        max_len: suffix buffer length (default: the worst case, :attr:`max_len`).
        interface: ``menu`` (the option menu) or ``native`` (:data:`DEVICE_INTERFACES`): the native template
            plays ``lib`` wrapped in :class:`jaxopt_marl.interfaces.NativeLibrary` (a NativeLibrary is taken as
            is) and writes :func:`jaxopt_marl.interfaces.user_message`'s native text (module docstring).

    Attributes:
        lib: the library whose menus and memory the text names (the NativeLibrary for ``native``); view_lib: the
            game's own library the world lines and the state label read (``lib`` itself for ``menu``).
        system: the interface's system message (:func:`jaxopt_marl.interfaces.system_message`).
        prefix_text, prefix_ids: the rendered system turn LLMPolicy strips and caches.
        max_len: static suffix length bound: the worst case ``worst_len``, or the caller's larger value.
        worst_len: the sum over the template's slots of each slot at its maximum: its longest fragment, numbers
            at their digit capacity (step and team values: int32, 10 digits; coordinates, distances, counts
            and agent ids: the digits of their largest value on this map / library), a menu line at its
            longest option (:meth:`_line_worst`), every list entry present.
        letter_ids: ``int32[26]`` token of ``" A"`` .. ``" Z"``.
        pad_id: the left-padding token (the tokenizer's pad token, else 0).

    Raises:
        ValueError: unknown mode, game or interface, or one with no device template (``compound_json``); a
            NativeLibrary for ``menu``; more menu lines than letters; a letter that is not one token; a
            ``max_len`` below the worst case; a tokenizer that breaks the fragment scheme.
    """

    def __init__(
        self,
        game: str,
        env,
        lib,
        tokenizer,
        *,
        mode: str,
        max_steps: int,
        max_len: int | None = None,
        interface: str = interfaces.MENU,
    ):
        if mode not in MODES:
            raise ValueError(f"{game}: unknown mode {mode!r}; known: {', '.join(MODES)}")
        interfaces.check_interface(interface)
        if interface not in DEVICE_INTERFACES:
            raise ValueError(
                f"{game}: interface {interface!r} has no device prompt template (the host loop plays it); "
                f"device interfaces: {', '.join(DEVICE_INTERFACES)}"
            )
        native = interface == interfaces.NATIVE
        if native and not isinstance(lib, interfaces.NativeLibrary):
            lib = interfaces.NativeLibrary(lib)
        if not native and isinstance(lib, interfaces.NativeLibrary):
            raise ValueError(f"{game}: interface {interface!r} plays the game's option library, not a NativeLibrary")
        self.system = interfaces.system_message(game, interface)  # raises for an unknown game
        self.interface = interface
        self.game, self.env, self.lib, self.tok, self.mode = game, env, lib, tokenizer, mode
        self.view_lib = lib.base if native else lib
        self.family = prompts.family(game)
        self.labels = prompts.prompt_family(game).labels
        self.max_steps = int(max_steps)
        if lib.num_instances > MAX_MENU_LINES:
            raise ValueError(
                f"{game}: the menu has {lib.num_instances} lines (lib.num_instances) but only "
                f"{MAX_MENU_LINES} letters (limit {MAX_MENU_LINES})"
            )
        letter_ids = []
        for c in menus.LETTERS:
            ids = tokenizer(f" {c}", add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise ValueError(
                    f"{game}: the letter {' ' + c!r} is {len(ids)} tokens {list(ids)} for this "
                    "tokenizer; choice letters must be single tokens"
                )
            letter_ids.append(ids[0])
        self.letter_ids = np.asarray(letter_ids, np.int32)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._chat_parts()
        self._static_tables()

        self.frags = _Fragments(ROW_WIDTH)
        one = jax.tree.map(lambda x: x[0], self._random_fields(1))
        self._rows(one, np)  # collect pass: every variant table (host, numpy)
        self.frags.finalize(tokenizer, f"{game} ({self._pre_name()})")
        self.frags.worst = 0
        self._rows(one, np)
        self.worst_len = int(self.frags.worst)
        if max_len is not None and int(max_len) < self.worst_len:
            raise ValueError(
                f"{game} ({mode}): max_len={int(max_len)} is below the worst-case suffix length {self.worst_len}"
            )
        self.max_len = self.worst_len if max_len is None else int(max_len)
        self._row_tok = jnp.asarray(self.frags.row_tok)
        self._row_len = jnp.asarray(self.frags.row_len)
        self._check()

    # -- construction --------------------------------------------------------------------------------------

    def _pre_name(self) -> str:
        """The tokenizer for error messages: its name and pre-tokenizer kind."""
        backend = getattr(self.tok, "backend_tokenizer", None)
        pre = getattr(backend, "pre_tokenizer", None)
        name = getattr(self.tok, "name_or_path", "") or type(self.tok).__name__
        return f"tokenizer {name!r}, pre-tokenizer {type(pre).__name__ if pre is not None else 'none'}"

    def _chat_parts(self) -> None:
        """``prefix_text`` / ``prefix_ids`` (as LLMPolicy) and the chat text around the user content."""
        tok, sys_msg = self.tok, {"role": "system", "content": self.system}
        sys_text = render_chat(tok, [sys_msg], add_generation_prompt=False)
        probe = render_chat(tok, [sys_msg, {"role": "user", "content": "x"}])
        self.prefix_text = sys_text if probe.startswith(sys_text) else ""
        self.prefix_ids = (
            tuple(tok(self.prefix_text, add_special_tokens=False)["input_ids"]) if self.prefix_text else ()
        )
        mark = "\u2063USER\u2063"
        full = render_chat(tok, [sys_msg, {"role": "user", "content": mark}])
        if full.count(mark) != 1 or not full.startswith(self.prefix_text):
            raise ValueError(f"{self.game}: the chat template does not insert the user content verbatim once")
        i = full.index(mark)
        self._user_pre = full[len(self.prefix_text) : i]
        self._user_post = full[i + len(mark) :]
        if self.prefix_text + self._user_pre + "x" + self._user_post != probe:
            raise ValueError(f"{self.game}: the chat template changes the user content")

    def _static_tables(self) -> None:
        """Per-game constants of the template (caps in digits, label pieces, tables)."""
        lib = self.lib
        names = tuple(lib.option_names) + (IDLE_NAME,)
        self._mem_table = ("",) + tuple(f" {n}" for n in names) + tuple(f", {n}" for n in names)
        self._n_names = len(names)
        parts = [_label_parts(o.label, self.game) for o in lib.options]
        self._n_fields = max(len(f) for _, f in parts)
        nf = self._n_fields
        self._opt_nf = np.array([len(f) for _, f in parts], np.int32)
        self._opt_is_x = np.array([[i < len(f) and f[i] == "x" for i in range(nf)] for _, f in parts], bool).reshape(
            len(parts), nf
        )
        self._lit_tables = tuple(
            ("",) + tuple((" " if i == 0 else "") + lits[i] if i < len(f) else "" for lits, f in parts)
            for i in range(nf)
        )
        tails = [""]
        for (lits, f), o in zip(parts, lib.options):
            for raw in (False, True):
                body = " " + o.label if (raw or not f) else lits[len(f)]
                tails += [body + "\n", body + "\n\nChoose"]
        self._tail_table = tuple(tails)
        self._letter_table = ("",) + tuple(f"{c})" for c in menus.LETTERS)
        self._view = _TEMPLATES[prompts.prompt_family(self.game).view](self.game, self.view_lib)
        h, w = self._view.shape
        self._mem_noun = interfaces.MEMORY_NOUNS[self.interface]
        # native: the layout hint line of every cell (interfaces.layout_hint_table: the host's own text).
        self._hint_table, self._hint_cell = None, None
        if self.interface == interfaces.NATIVE:
            texts, cell = interfaces.layout_hint_table(self.game, self.view_lib)
            if cell.shape != (h, w):
                raise ValueError(f"{self.game}: the layout hint table is {cell.shape}, the map {(h, w)}")
            self._hint_table = tuple(t + "\n" for t in texts)
            self._hint_cell = cell.reshape(-1)
        self._cap_xy = _digits(max(h, w) - 1)
        self._cap_dist = self._view.cap_dist
        self._n_agents = lib.num_agents
        self._cap_agent = _digits(self._n_agents - 1)

    # -- stage 1: fields of one decision ---------------------------------------------------------------------

    def fields(self, env_state, aid, inst, letters, mem: AgentMemory) -> dict:
        """What the text of one decision reads, as arrays (jittable): the device twin of the snapshot + menu."""
        aid = jnp.asarray(aid, jnp.int32)
        letters = jnp.asarray(letters, jnp.int32)
        order = jnp.argsort(jnp.where(letters >= 0, letters, _BIG), stable=True)
        team = self.lib.team_count(env_state)
        last = jnp.round(jnp.asarray(mem.team_at_last, jnp.float32)).astype(jnp.int32)
        f = dict(
            aid=aid,
            step=jnp.asarray(env_state.step, jnp.int32),
            team=team,
            diff=team - last,
            macros=jnp.asarray(mem.macros, jnp.int32),
            line_opt=jnp.asarray(inst.opt, jnp.int32)[order],
            line_tgt=jnp.asarray(inst.target, jnp.int32)[order],
            line_letter=letters[order],
            label=state_label_code(self.game, self.view_lib, env_state, aid),
        )
        f.update(self._view.fields(self, env_state, aid))
        if self._hint_table is not None:  # native: the layout hint of the agent's cell
            h, w = self._view.shape
            pos = jnp.asarray(self.view_lib.agent_view(env_state)[0], jnp.int32)[aid]
            f["hint"] = jnp.asarray(self._hint_cell)[jnp.clip(pos[0], 0, h - 1) * w + jnp.clip(pos[1], 0, w - 1)]
        return f

    # -- stage 2: fragment rows of one decision ----------------------------------------------------------------

    def _rows(self, f: dict, xp=jnp) -> jax.Array:
        """``int32[S]`` fragment rows of one decision's fields (``xp``: ``jax.numpy``, or ``numpy`` on the host)."""
        e = _Emit(self.frags, xp)
        e.lit(self._user_pre)
        self._view.rows(self, e, f)
        if self._hint_table is not None:  # native: "Layout: ...\n" (interfaces.layout_hint)
            e.pick(self._hint_table, f["hint"])
        self._common_rows(e, f)
        return e.rows()

    def _common_rows(self, e: _Emit, f: dict) -> None:
        xp = e.xp
        e.lit("Step ")
        e.num(f["step"], INT32_DIGITS)
        e.lit(f"/{self.max_steps}.\n\nMemory:\n- Last {prompts.MEMORY_MACROS} {self._mem_noun}:")
        codes = f["macros"]
        on = codes >= 0
        first = on & (xp.cumsum(on) == 1)
        code = xp.clip(codes, 0, self._n_names - 1)
        e.entries(e.p(self._mem_table, xp.where(on, 1 + code + xp.where(first, 0, self._n_names), 0)))
        e.pick((" none", ""), on.any())
        e.lit("\n- Team reward since your last decision:")
        e.pick((" ", " -"), f["diff"] < 0)
        e.num(xp.abs(f["diff"]), INT32_DIGITS)
        e.lit(" (episode total")
        e.pick((" ", " -"), f["team"] < 0)
        e.num(xp.abs(f["team"]), INT32_DIGITS)
        letter, opt, tgt = f["line_letter"], f["line_opt"], f["line_tgt"]
        on = letter >= 0
        n_lines = xp.sum(on)
        e.pick((f")\n\n{menus.MENU_HEADER}\n", f")\n\n{menus.MENU_HEADER}\n\nChoose"), n_lines == 0)
        opt = xp.clip(opt, 0, len(self.lib.options) - 1)
        nf = xp.asarray(self._opt_nf)[opt]
        raw = (nf == 0) | (tgt[:, 0] < 0)
        cols = [e.p(self._letter_table, xp.where(on, 1 + xp.clip(letter, 0, MAX_MENU_LINES - 1), 0), False)]
        for i in range(self._n_fields):
            has = on & ~raw & (nf > i)
            value = xp.where(xp.asarray(self._opt_is_x)[opt, i], tgt[:, 1], tgt[:, 0])
            cols.append(e.p(self._lit_tables[i], xp.where(has, 1 + opt, 0), False))
            cols.append(e.n(xp.maximum(value, 0), self._cap_xy, has, False))
        is_last = xp.arange(on.shape[0]) == n_lines - 1
        cols.append(e.p(self._tail_table, xp.where(on, 1 + opt * 4 + raw * 2 + is_last, 0), False))
        if self.frags.built:
            self.frags.worst += on.shape[0] * self._line_worst()
        e.entries(*cols)
        e.lit(" one. Reply with exactly two lines." + self._user_post)
        if self.mode == "choice_only":
            head, tail = RESPONSE_PREFIX.split("{label}")
            e.lit(head.rstrip(" "))
            e.pick([" " + lab for lab in self.labels], f["label"])
            e.lit(tail)

    def _line_worst(self) -> int:
        """Most tokens of one menu line: the longest option, written with its fields or raw (target -1)."""
        toks = self.frags.tokens
        letter = max(len(toks[s]) for s in self._letter_table)
        best = 0
        for o, k in enumerate(self._opt_nf):
            tail = lambda raw, o=o: max(len(toks[self._tail_table[1 + o * 4 + raw * 2 + last]]) for last in (0, 1))
            fielded = (
                sum(len(toks[self._lit_tables[i][1 + o]]) for i in range(int(k)))
                + int(k) * self.frags.number_worst(self._cap_xy)
                + tail(0)
            )
            best = max(best, letter + max(fielded, tail(1)))
        return best

    # -- stage 3: assembly ------------------------------------------------------------------------------------

    def _assemble(self, rows: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(ids int32[max_len] left-padded, length int32[])`` of fragment rows ``int32[S]``."""
        toks = self._row_tok[rows]  # [S, W]: the one gather
        lens = self._row_len[rows]  # [S]
        total = jnp.sum(lens)
        start = self.max_len - total + jnp.cumsum(lens) - lens
        col = jnp.arange(toks.shape[1], dtype=jnp.int32)
        at = jnp.where(col[None] < lens[:, None], start[:, None] + col[None], self.max_len)
        buf = jnp.full((self.max_len,), self.pad_id, jnp.int32)
        return buf.at[at.reshape(-1)].set(toks.reshape(-1), mode="drop"), total.astype(jnp.int32)

    def suffix(self, env_state, aid, inst, letters, mem: AgentMemory) -> tuple[jax.Array, jax.Array]:
        """(ids ``int32[max_len]`` LEFT-padded with ``pad_id``, length ``int32[]``) for one agent of one env.

        Jittable and vmappable over agents and envs (``aid`` may be traced). ``inst``: the agent's library
        ``Instances`` (``opt int32[I]``, ``target int32[I, 2]``, ``valid bool[I]``); ``letters``: ``int32[I]``
        from :func:`jaxopt_marl.menus.assign_letters` (-1 = hidden); ``mem``: the agent's
        :class:`AgentMemory`. The ids are exactly the tokens of ``render_chat(tok, [system, user])[len(
        prefix_text):]`` (+ ``"state: <label>\\nchoice:"`` in ``choice_only`` mode), encoded as one string.
        """
        return self._assemble(self._rows(self.fields(env_state, aid, inst, letters, mem)))

    # -- host reference ---------------------------------------------------------------------------------------

    def reference_texts(self, env_states, aids, inst, letters, mems: AgentMemory) -> list[str]:
        """Host reference suffix strings of a batch of decisions (leading axis B on every argument): the text
        ``render_chat(tok, [system, user])[len(prefix_text):] + response prefix`` that LLMPolicy encodes, with
        ``user`` from :func:`jaxopt_marl.interfaces.user_message` of the interface (see :func:`host_user_message`)."""
        return self.reference_by_mode(env_states, aids, inst, letters, mems, (self.mode,))[self.mode]

    def reference_by_mode(
        self, env_states, aids, inst, letters, mems: AgentMemory, modes: tuple[str, ...] = MODES
    ) -> dict[str, list[str]]:
        """:meth:`reference_texts` for each of ``modes`` (the user message is rendered once per decision)."""
        snap = _snapshot_fn(self.game, self.env)(env_states)
        aids = np.asarray(aids)
        opt, tgt, let = (np.asarray(x) for x in (inst.opt, inst.target, letters))
        out = {m: [] for m in modes}
        for b in range(aids.shape[0]):
            sb = prompts.take(snap, b)
            a = int(aids[b])
            mem = host_memory(self.lib, jax.tree.map(lambda x, b=b: np.asarray(x)[b], mems))
            menu = menus.render_menu(self.lib, opt[b], tgt[b], let[b])
            user = interfaces.user_message(self.interface, self.game, sb, a, menu, self.max_steps, mem, self.lib)
            full = render_chat(
                self.tok, [{"role": "system", "content": self.system}, {"role": "user", "content": user}]
            )[len(self.prefix_text) :]
            for m in modes:
                resp = RESPONSE_PREFIX.format(label=prompts.state_label(self.game, sb, a)) if m == "choice_only" else ""
                out[m].append(full + resp)
        return out

    # -- construction check -------------------------------------------------------------------------------------

    def _random_fields(self, batch: int, seed: int = 0) -> dict:
        """``batch`` synthetic decisions (numpy, leading axis ``batch``) covering every variant (see module)."""
        rng = np.random.default_rng(seed)
        lib, n_i = self.lib, self.lib.num_instances
        b = batch
        ar = np.arange(b)

        def big(size, signed=False):
            nd = rng.integers(1, INT32_DIGITS + 1, size)
            lo = np.where(nd == 1, 0, 10 ** (nd - 1).astype(np.int64))
            v = np.minimum(rng.integers(lo, 10 ** nd.astype(np.int64)), 2**31 - 1)
            if signed:
                v = np.where(rng.random(size) < 0.3, -v, v)
            return v.astype(np.int32)

        n_names = self._n_names
        k_mem = np.where(ar < 2, ar * 5, rng.integers(0, prompts.MEMORY_MACROS + 1, b))
        codes = np.where(
            np.arange(prompts.MEMORY_MACROS)[None] >= prompts.MEMORY_MACROS - k_mem[:, None],
            (ar[:, None] * prompts.MEMORY_MACROS + np.arange(prompts.MEMORY_MACROS)) % n_names,
            -1,
        )
        n_lines = np.where(ar < MAX_MENU_LINES, 1 + ar % n_i, rng.integers(0, n_i + 1, b))
        n_lines[-1] = 0
        letter = np.full((b, n_i), -1, np.int32)
        for s in range(b):
            pool = np.delete(np.arange(MAX_MENU_LINES), s % MAX_MENU_LINES)
            pick = (
                np.sort(np.concatenate([[s % MAX_MENU_LINES], rng.choice(pool, n_lines[s] - 1, replace=False)]))
                if n_lines[s]
                else np.zeros(0, int)
            )
            letter[s, : n_lines[s]] = pick
        n_opt = len(lib.options)
        line_opt = (ar[:, None] * n_i + np.arange(n_i)) % n_opt
        h, w = self._view.shape
        cells = lambda *shape: np.stack([rng.integers(0, h, shape), rng.integers(0, w, shape)], -1).astype(np.int32)
        tgt = np.where(rng.random((b, n_i, 1)) < 0.1, -1, cells(b, n_i))
        step = big(b)
        team = big(b)
        edge = np.array([0, 9, 10, 99, 100, 999, 1000, 2**31 - 1])
        f = dict(
            aid=rng.integers(0, self._n_agents, b).astype(np.int32),
            step=np.where(ar < len(edge), edge[ar % len(edge)], step).astype(np.int32),
            team=team,
            diff=big(b, signed=True),
            macros=codes.astype(np.int32),
            line_opt=line_opt.astype(np.int32),
            line_tgt=tgt.astype(np.int32),
            line_letter=letter,
            label=(ar % len(self.labels)).astype(np.int32),
        )
        dmax = 10**self._cap_dist - 1

        def dists(*shape):
            d = rng.integers(0, dmax + 1, shape)
            return np.where(rng.random(shape) < 0.2, UNREACHABLE, d).astype(np.int32)

        f.update(self._view.random_fields(self, rng, ar, cells, dists))
        if self._hint_table is not None:  # every hint text (the check draws at least one decision per text)
            f["hint"] = rng.permutation(ar % len(self._hint_table)).astype(np.int32)
        return f

    def _check(self) -> None:
        """Raises ValueError unless fragment concatenation equals whole-string tokenization (module docstring)."""
        tok, where = self.tok, f"{self.game} ({self._pre_name()})"
        chunk_ids = {s: self.frags.tokens.get(s) for s in _CHUNKS}
        nums = list(range(1000)) + list(range(100000, 101000))
        enc = tok([str(n) for n in nums], add_special_tokens=False)["input_ids"]
        for n, ids in zip(nums, enc):
            s = str(n)
            want = [t for i in range(0, len(s), CHUNK_DIGITS) for t in chunk_ids[s[i : i + CHUNK_DIGITS]]]
            if list(ids) != want:
                raise ValueError(
                    f"{where}: the tokenizer splits the number {n} as {list(ids)}, not as chunks of "
                    f"{CHUNK_DIGITS} digits from the left {want}"
                )
        samples = max(CHECK_SAMPLES, len(self._hint_table or ()))
        fields = self._random_fields(samples, seed=1)
        row_tok, row_len, col = self.frags.row_tok, self.frags.row_len, np.arange(ROW_WIDTH)
        seqs = []
        for b in range(samples):
            rows = self._rows({k: v[b] for k, v in fields.items()}, np)
            seqs.append(row_tok[rows][col[None] < row_len[rows][:, None]].tolist())
        texts = [tok.decode(s) for s in seqs]
        whole = tok(texts, add_special_tokens=False)["input_ids"]
        for seq, text, got in zip(seqs, texts, whole):
            got = list(got)
            if len(seq) > self.worst_len:
                raise ValueError(
                    f"{where}: a synthetic suffix of {len(seq)} tokens exceeds the worst case "
                    f"{self.worst_len} (internal error)"
                )
            if got != seq:
                i = next((j for j, (x, y) in enumerate(zip(got, seq)) if x != y), min(len(got), len(seq)))
                at = len(tok.decode(seq[:i]))
                raise ValueError(
                    f"{where}: the tokenizer breaks the fragment scheme near "
                    f"{text[max(0, at - 30) : at + 30]!r}: fragments give {seq[i : i + 4]} but the whole "
                    f"string tokenizes as {got[i : i + 4]}"
                )


_SNAPSHOTS: dict[int, tuple] = {}


def _snapshot_fn(game: str, env):
    """:func:`jaxopt_marl.prompts.make_snapshot_fn` of ``env``, built once per env."""
    if id(env) not in _SNAPSHOTS:
        _SNAPSHOTS[id(env)] = (env, prompts.make_snapshot_fn(game, env))
    return _SNAPSHOTS[id(env)][1]


def host_user_message(
    game: str,
    env,
    lib,
    env_state,
    aid: int,
    inst,
    letters,
    mem: AgentMemory,
    max_steps: int,
    interface: str = interfaces.MENU,
) -> str:
    """The host reference user message of one decision (one env, unbatched ``env_state``): the text of
    :func:`jaxopt_marl.interfaces.user_message` under ``interface`` (``menu``: :func:`jaxopt_marl.prompts.user_message`;
    ``native``: ``lib`` is the :class:`jaxopt_marl.interfaces.NativeLibrary`) with the menu of ``inst`` /
    ``letters`` (:func:`jaxopt_marl.menus.render_menu`) and the :class:`jaxopt_marl.prompts.Memory` matching ``mem``
    (:func:`host_memory`), team values from the state."""
    snap = prompts.take(_snapshot_fn(game, env)(jax.tree.map(lambda x: jnp.asarray(x)[None], env_state)), 0)
    menu = menus.render_menu(lib, np.asarray(inst.opt), np.asarray(inst.target), np.asarray(letters))
    mem = host_memory(lib, mem)
    return interfaces.user_message(interface, game, snap, int(aid), menu, int(max_steps), mem, lib)


__all__ = [
    "CHUNK_DIGITS",
    "DEVICE_INTERFACES",
    "IDLE_CODE",
    "IDLE_NAME",
    "INT32_DIGITS",
    "MAX_MENU_LINES",
    "MODES",
    "RESPONSE_PREFIX",
    "ROW_WIDTH",
    "AgentMemory",
    "PromptIds",
    "empty_memory",
    "host_memory",
    "host_user_message",
    "remember",
    "state_label_code",
]
