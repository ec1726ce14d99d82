"""Guard synthesis (paper §5.1, Stage 3), the guard file, and guard evaluation (Stage 4).

Stage 3 runs two channels over the burn-in log (:mod:`jaxopt_marl.records`):

- **Explicit** (§5.1 Stage 3): an explicit failure reason observed at least ``MIN_SUPPORT = 5`` times for an
  option becomes a guard directly, ``{"opt": o, "channel": "explicit", "when": {"__reason__": "NoPath"},
  "support": n}``. It is not subject to the certificate; at menu build (Stage 4) it is *re-checked live* (e.g.
  NoPath by running the path planner), so it hides an instance only when the live check fails.
- **Inferred** (§5.1 Stage 3): every 1- and 2-literal conjunction ``feature == value`` over the option's
  declared read set is scored and adopted iff it covers at least ``MIN_SUPPORT`` failures *and zero logged
  successes* — the acceptance certificate. 2-literal conjunctions subsumed by an adopted single literal are
  dropped. ``support`` is the number of failures covered.

Choices, with the paper's wording:

- *Which records are failures.* Everything that is not ``success``: ``effect_fail`` **and** ``explicit:*``.
  The paper's inferred channel scores "failures" against "successes" of a log whose outcomes are {success,
  effect_fail, explicit:<reason>}, and says "an executor failure becomes a menu gate only through Stage 3, by
  being counted in burn-in data like any other failure". The certificate is unaffected either way (successes
  alone can veto). ``explicit_counts_as_failure=False`` restricts failures to ``effect_fail`` (explicit
  records are then ignored by the inferred channel).
- *Solo-only options* (§5.1 Defect 2): options with no private component (``start_cooking``) are synthesized
  from solo-episode records only — both channels — so a partner's action is never attributed to the agent.
- *Pairs* are conjunctions of two *different* features (``a == x and a == y`` is empty).
- *Nulls*: a record whose feature is null (not logged) is covered by no literal on that feature.
- *No records / no failures*: synthesis returns an empty :class:`GuardList` whose ``message`` says why, and
  logs a warning.

Counting is vectorised (STYLE §5, DESIGN "Performance habits"): records are grouped by option once (a stable
argsort), then per option, per feature and per feature pair one ``np.bincount`` over the option's rows counts
failures and successes for every value (pair) at once; the only Python loops run over options, features and
literals, never records.

Stage 4 (§5.1): :func:`compile_guards` turns a guard list into arrays and :func:`guard_mask` evaluates every
guard against a per-instance feature table inside ``jit`` and returns the menu mask (True = shown).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa

from jaxopt_marl.records import (
    OUTCOME_EFFECT_FAIL,
    OUTCOME_EXPLICIT_BASE,
    OUTCOME_SUCCESS,
    RecordCodes,
    RecordVocab,
    table_to_codes,
)

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------

#: Minimum number of failures a guard must explain (§5.1 Stage 3: "at least five").
MIN_SUPPORT = 5
#: Longest inferred conjunction (§5.1 Stage 3: "every 1- and 2-literal conjunction").
MAX_LITERALS = 2
#: The two synthesis channels (§5.1 Stage 3).
INFERRED = "inferred"
EXPLICIT = "explicit"
#: Key of an explicit guard's single ``when`` entry (DESIGN.md guard file format).
REASON_KEY = "__reason__"
_GUARD_KEYS = ("opt", "channel", "when", "support")


# ---------------------------------------------------------------------------------------------------------
# Guard data
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Guard:
    """One adopted guard: hide option ``opt`` when every literal of ``when`` holds.

    Attributes:
        opt: option name.
        channel: ``"inferred"`` or ``"explicit"``.
        when: ordered ``(key, value)`` literals: ``(feature, value)`` pairs for inferred guards (1 or 2, in
            read-set order), ``(("__reason__", reason),)`` for explicit ones.
        support: failures covered (inferred) or occurrences of the reason (explicit).
    """

    opt: str
    channel: str
    when: tuple[tuple[str, str], ...]
    support: int

    def as_dict(self) -> dict[str, Any]:
        """The guard-file object, keys in the paper's order (opt, channel, when, support)."""
        return {"opt": self.opt, "channel": self.channel, "when": dict(self.when), "support": self.support}

    def to_json(self) -> str:
        """One guard-file line, e.g. ``{"opt": "start_cooking", "channel": "inferred", "when":
        {"tgt_pot_state": "empty"}, "support": 31887}``."""
        return json.dumps(self.as_dict())


class GuardList(list):
    """A ``list[Guard]`` with a human-readable ``message`` about how synthesis went.

    Equal to a plain list (``GuardList([]) == []``); ``message`` says, e.g., that the record set was empty.
    """

    def __init__(self, guards: Iterable[Guard] = (), message: str = ""):
        super().__init__(guards)
        self.message = message


# ---------------------------------------------------------------------------------------------------------
# Stage 3: synthesis
# ---------------------------------------------------------------------------------------------------------


def _solo_only_set(solo_only: Collection[str] | Mapping[str, bool]) -> set[str]:
    if isinstance(solo_only, Mapping):
        return {o for o, flag in solo_only.items() if flag}
    return set(solo_only)


def synthesize_guards(
    records: pa.Table | RecordCodes,
    vocab: RecordVocab,
    read_sets: Mapping[str, Sequence[str]],
    *,
    solo_only: Collection[str] | Mapping[str, bool] = (),
    min_support: int = MIN_SUPPORT,
    explicit_counts_as_failure: bool = True,
) -> GuardList:
    """Mine explicit and inferred guards from burn-in records (§5.1 Stage 3).

    Args:
        records: the burn-in log, ``N`` rows — a table (validated and encoded with ``vocab``) or
            :class:`~jaxopt_marl.records.RecordCodes` (``opt``/``outcome``/``solo`` ``[N]``, ``features``
            ``int32[N, F]``).
        vocab: names behind the codes.
        read_sets: option name -> declared read-set features (deterministic features only; §5.1 Stage 2).
            Options absent here get only the explicit channel.
        solo_only: options with no private component (§5.1 Defect 2), mined from ``solo`` records only; a
            collection of names or a ``{name: bool}`` flag mapping.
        min_support: the failure threshold (paper: 5).
        explicit_counts_as_failure: whether ``explicit:*`` records count as failures in the inferred channel
            (paper: yes; see the module docstring).

    Returns:
        A :class:`GuardList` ordered by option (vocab order); per option inferred single literals, inferred
        pairs, then explicit guards. ``message`` summarises the result; with no records, no failures or
        nothing adoptable the list is empty, ``message`` says why, and a warning is logged.

    Raises:
        ValueError: on an unknown option or feature in ``read_sets`` / ``solo_only``, or a bad record table.
    """
    codes = table_to_codes(records, vocab) if isinstance(records, pa.Table) else records
    opt_index = {o: i for i, o in enumerate(vocab.option_names)}
    feat_index = {f: j for j, f in enumerate(vocab.feature_names)}
    for o, feats in read_sets.items():
        if o not in opt_index:
            raise ValueError(f"read_sets: unknown option {o!r}")
        for f in feats:
            if f not in feat_index:
                raise ValueError(f"read_sets[{o!r}]: unknown feature {f!r}")
    solo_set = _solo_only_set(solo_only)
    for o in solo_set:
        if o not in opt_index:
            raise ValueError(f"solo_only: unknown option {o!r}")

    # 1. Empty / failure-free logs adopt nothing, and say so.
    n = codes.num_records
    outcome = np.asarray(codes.outcome, np.int32)
    if n == 0:
        return _empty("no guards: the record set is empty")
    if not (outcome != OUTCOME_SUCCESS).any():
        return _empty(f"no guards: all {n} records are successes (nothing to explain)")

    # 2. Group rows by option once (stable, so row order inside an option is preserved).
    opt = np.asarray(codes.opt, np.int64)
    order = np.argsort(opt, kind="stable")
    bounds = np.searchsorted(opt[order], np.arange(len(vocab.option_names) + 1))
    solo = np.asarray(codes.solo, bool)
    features = np.asarray(codes.features, np.int32)
    n_outcomes = len(vocab.outcome_names)
    values = [len(v) for _, v in vocab.features]
    _check_code_ranges(opt, outcome, features, vocab, values)

    guards: list[Guard] = []
    for o_id, o_name in enumerate(vocab.option_names):
        rows = order[bounds[o_id] : bounds[o_id + 1]]
        if o_name in solo_set:
            rows = rows[solo[rows]]
        if rows.size == 0:
            continue
        out = outcome[rows]
        succ = out == OUTCOME_SUCCESS
        fail = ~succ if explicit_counts_as_failure else out == OUTCOME_EFFECT_FAIL
        read = [feat_index[f] for f in read_sets.get(o_name, ())]
        guards += _inferred_guards(
            o_name, features[rows][:, read] if read else None, read, fail, succ, vocab, values, min_support
        )
        # Explicit channel: one bincount over this option's outcome codes.
        counts = np.bincount(out, minlength=n_outcomes)
        for k, reason in enumerate(vocab.reason_names):
            c = int(counts[OUTCOME_EXPLICIT_BASE + k])
            if c >= min_support:
                guards.append(Guard(o_name, EXPLICIT, ((REASON_KEY, reason),), c))

    n_exp = sum(g.channel == EXPLICIT for g in guards)
    msg = f"adopted {len(guards)} guards ({len(guards) - n_exp} inferred, {n_exp} explicit) from {n} records"
    if not guards:
        msg = f"no guards: nothing met support >= {min_support} (and the certificate) in {n} records"
        logger.warning(msg)
    else:
        logger.info(msg)
    return GuardList(guards, msg)


def _check_code_ranges(
    opt: np.ndarray, outcome: np.ndarray, features: np.ndarray, vocab: RecordVocab, values: list[int]
) -> None:
    """Reject codes outside the vocabulary (RecordCodes built by hand skip table validation)."""
    if opt.min() < 0 or opt.max() >= len(vocab.option_names):
        raise ValueError(f"records: option code out of range [0, {len(vocab.option_names)})")
    if outcome.min() < 0 or outcome.max() >= len(vocab.outcome_names):
        raise ValueError(f"records: outcome code out of range [0, {len(vocab.outcome_names)})")
    if features.shape[1] != len(values):
        raise ValueError(f"records: features have {features.shape[1]} columns, vocab has {len(values)}")
    if features.size:
        lo, hi = features.min(axis=0), features.max(axis=0)
        for j, name in enumerate(vocab.feature_names):
            if lo[j] < -1 or hi[j] >= values[j]:
                raise ValueError(f"records: column {name!r} has a code out of range [-1, {values[j]})")


def _empty(msg: str) -> GuardList:
    logger.warning(msg)
    return GuardList([], msg)


def _inferred_guards(
    o_name: str,
    x: np.ndarray | None,
    read: list[int],
    fail: np.ndarray,
    succ: np.ndarray,
    vocab: RecordVocab,
    values: list[int],
    min_support: int,
) -> list[Guard]:
    """Inferred channel for one option (§5.1 Stage 3), vectorised over its records.

    Args:
        o_name: option name.
        x: ``int32[n_o, R]`` the option's records restricted to its read set (-1 = null), or None if ``R = 0``.
        read: the ``R`` global feature indices of the read set.
        fail: ``bool[n_o]`` failure rows.
        succ: ``bool[n_o]`` success rows.
        vocab: names.
        values: number of values per global feature.
        min_support: failure threshold.

    Returns:
        Adopted single-literal guards, then adopted unsubsumed pairs.
    """
    if x is None:
        return []
    names = vocab.feature_names
    vals = vocab.features
    shifted = x + 1  # null (-1) -> bin 0, value v -> bin v + 1
    xf, xs = shifted[fail], shifted[succ]
    guards: list[Guard] = []

    # 1. Single literals: one bincount per feature; adopted[a][v] marks adopted (feature a == v).
    adopted: list[np.ndarray] = []
    for a, f in enumerate(read):
        nv = values[f] + 1
        nf = np.bincount(xf[:, a], minlength=nv)[1:]
        ns = np.bincount(xs[:, a], minlength=nv)[1:]
        ok = (nf >= min_support) & (ns == 0)
        adopted.append(ok)
        for v in np.flatnonzero(ok):
            guards.append(Guard(o_name, INFERRED, ((names[f], vals[f][1][v]),), int(nf[v])))

    # 2. Two-literal conjunctions over distinct features: one bincount of the joint code per pair.
    for a, b in itertools.combinations(range(len(read)), 2):
        fa, fb = read[a], read[b]
        na, nb = values[fa] + 1, values[fb] + 1
        nf = np.bincount(xf[:, a] * nb + xf[:, b], minlength=na * nb).reshape(na, nb)[1:, 1:]
        ns = np.bincount(xs[:, a] * nb + xs[:, b], minlength=na * nb).reshape(na, nb)[1:, 1:]
        # Subsumption (§5.1 Stage 3): drop pairs containing an adopted single literal.
        ok = (nf >= min_support) & (ns == 0) & ~adopted[a][:, None] & ~adopted[b][None, :]
        for va, vb in zip(*np.nonzero(ok)):
            when = ((names[fa], vals[fa][1][va]), (names[fb], vals[fb][1][vb]))
            guards.append(Guard(o_name, INFERRED, when, int(nf[va, vb])))
    return guards


# ---------------------------------------------------------------------------------------------------------
# Guard file (JSON Lines)
# ---------------------------------------------------------------------------------------------------------


def dumps_guards(guards: Iterable[Guard]) -> str:
    """The guard file text: one JSON object per line, each ending in a newline."""
    return "".join(g.to_json() + "\n" for g in guards)


def write_guards(guards: Iterable[Guard], path: str | Path) -> Path:
    """Write a guard file (``DIR/guards.jsonl``, DESIGN.md).

    Args:
        guards: the guards, e.g. from :func:`synthesize_guards`.
        path: output file.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_guards(guards))
    return path


def parse_guards(
    lines: Iterable[str],
    option_names: Sequence[str],
    features: Mapping[str, Sequence[str]] | RecordVocab,
    *,
    reasons: Sequence[str] | None = None,
    read_sets: Mapping[str, Sequence[str]] | None = None,
    source: str = "<guards>",
) -> list[Guard]:
    """Parse and validate guard-file lines (see :func:`load_guards`); blank lines are skipped.

    Args:
        lines: the file's lines.
        option_names: known option names.
        features: known features and their value vocabularies (or a :class:`RecordVocab`).
        reasons: known explicit reasons; None accepts any non-empty reason string.
        read_sets: if given, an inferred guard's features must lie in its option's read set.
        source: the file name used in error messages.

    Returns:
        ``list[Guard]`` in file order.

    Raises:
        ValueError: ``"<source>:<line>: <problem> <bad value>"`` for the first malformed line.
    """
    if isinstance(features, RecordVocab):
        features = features.feature_values
    options = set(option_names)
    out: list[Guard] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue

        def fail(problem: str, lineno: int = lineno) -> ValueError:
            return ValueError(f"{source}:{lineno}: {problem}")

        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise fail(f"malformed JSON ({e.msg}): {line.strip()[:80]!r}") from None
        if not isinstance(obj, dict):
            raise fail(f"expected a JSON object, got {type(obj).__name__}")
        missing = [k for k in _GUARD_KEYS if k not in obj]
        if missing:
            raise fail(f"missing key {missing[0]!r}")
        extra = [k for k in obj if k not in _GUARD_KEYS]
        if extra:
            raise fail(f"unknown key {extra[0]!r}")
        opt, channel, when, support = (obj[k] for k in _GUARD_KEYS)
        if not isinstance(opt, str) or opt not in options:
            raise fail(f"unknown option {opt!r}")
        if channel not in (INFERRED, EXPLICIT):
            raise fail(f"unknown channel {channel!r}; expected 'inferred' or 'explicit'")
        if isinstance(support, bool) or not isinstance(support, int) or support < 0:
            raise fail(f"support must be a non-negative integer, got {support!r}")
        if not isinstance(when, dict) or not when:
            raise fail(f"'when' must be a non-empty object, got {when!r}")
        if channel == EXPLICIT:
            if list(when) != [REASON_KEY]:
                raise fail(f"explicit guard 'when' must be {{{REASON_KEY!r}: reason}}, got keys {list(when)}")
            reason = when[REASON_KEY]
            if not isinstance(reason, str) or not reason or (reasons is not None and reason not in reasons):
                raise fail(f"unknown reason {reason!r}")
        else:
            if len(when) > MAX_LITERALS:
                raise fail(f"inferred guard has {len(when)} literals; at most {MAX_LITERALS}")
            for feat, value in when.items():
                if feat not in features:
                    raise fail(f"unknown feature {feat!r}")
                if not isinstance(value, str) or value not in features[feat]:
                    raise fail(f"unknown value {value!r} for feature {feat!r}")
                if read_sets is not None and feat not in read_sets.get(opt, ()):
                    raise fail(f"feature {feat!r} is not in the read set of option {opt!r}")
        out.append(Guard(opt, channel, tuple(when.items()), support))
    return out


def load_guards(
    path: str | Path,
    option_names: Sequence[str],
    features: Mapping[str, Sequence[str]] | RecordVocab,
    *,
    reasons: Sequence[str] | None = None,
    read_sets: Mapping[str, Sequence[str]] | None = None,
) -> list[Guard]:
    """Load and validate a guard file (JSON Lines, one guard per line; §5.1 Stage 3, DESIGN.md).

    Args:
        path: the ``guards.jsonl`` file.
        option_names: known option names.
        features: known features -> their value vocabularies (or a :class:`RecordVocab`).
        reasons: known explicit reasons (None: any non-empty string).
        read_sets: optional per-option read sets to check inferred literals against.

    Returns:
        ``list[Guard]`` in file order.

    Raises:
        ValueError: malformed JSON, unknown option, unknown feature or value (and similar), as
            ``"<path>:<line number>: ... <bad value>"``.
    """
    path = Path(path)
    with path.open() as fh:
        return parse_guards(fh, option_names, features, reasons=reasons, read_sets=read_sets, source=str(path))


# ---------------------------------------------------------------------------------------------------------
# Stage 4: evaluation as array ops
# ---------------------------------------------------------------------------------------------------------


class CompiledGuards(NamedTuple):
    """Guards as arrays for :func:`guard_mask` (``G`` guards, unused literal slots = -1).

    Attributes:
        opt: ``int32[G]`` option id.
        feat: ``int32[G, 2]`` feature index per literal (-1 = unused; explicit guards use none).
        val: ``int32[G, 2]`` required value code per literal.
        reason: ``int32[G]`` explicit reason index (into ``vocab.reason_names``), -1 for inferred guards.
    """

    opt: jax.Array
    feat: jax.Array
    val: jax.Array
    reason: jax.Array


def compile_guards(guards: Sequence[Guard], vocab: RecordVocab) -> CompiledGuards:
    """Encode guards with a vocabulary's codes (host side, once per guard file).

    Args:
        guards: the guard list.
        vocab: option, reason and feature vocabularies.

    Returns:
        :class:`CompiledGuards` with ``G = len(guards)``.

    Raises:
        ValueError: on a name missing from ``vocab``.
    """
    g = len(guards)
    opt = np.zeros(g, np.int32)
    feat = np.full((g, MAX_LITERALS), -1, np.int32)
    val = np.full((g, MAX_LITERALS), -1, np.int32)
    reason = np.full(g, -1, np.int32)
    opts = {o: i for i, o in enumerate(vocab.option_names)}
    feats = {f: j for j, f in enumerate(vocab.feature_names)}
    fvals = vocab.feature_values
    reasons = {r: k for k, r in enumerate(vocab.reason_names)}
    for i, guard in enumerate(guards):
        if guard.opt not in opts:
            raise ValueError(f"guard {i}: unknown option {guard.opt!r}")
        opt[i] = opts[guard.opt]
        if guard.channel == EXPLICIT:
            ((_, r),) = guard.when
            if r not in reasons:
                raise ValueError(f"guard {i}: unknown reason {r!r}")
            reason[i] = reasons[r]
            continue
        if len(guard.when) > MAX_LITERALS:
            raise ValueError(f"guard {i}: {len(guard.when)} literals; at most {MAX_LITERALS}")
        for j, (f, v) in enumerate(guard.when):
            if f not in feats or v not in fvals[f]:
                raise ValueError(f"guard {i}: unknown literal {f!r} == {v!r}")
            feat[i, j] = feats[f]
            val[i, j] = fvals[f].index(v)
    return CompiledGuards(*(jnp.asarray(a) for a in (opt, feat, val, reason)))


@jax.jit
def guard_mask(
    guards: CompiledGuards,
    opt_ids: jax.Array,
    features: jax.Array,
    live_reason: jax.Array | None = None,
) -> jax.Array:
    """Menu feasibility mask (§5.1 Stage 4): hide every instance some adopted guard matches.

    An inferred guard matches an instance of its option when all its literals hold on the instance's
    read-set features. An explicit guard is re-checked live: it matches when the caller's live check (e.g. the
    path planner for NoPath) reports the guard's reason for that instance; without ``live_reason`` explicit
    guards never hide anything. Padding instances (``opt_ids < 0``) are never shown.

    Args:
        guards: from :func:`compile_guards`, ``G`` guards.
        opt_ids: ``int32[..., I]`` option id per instance (-1 = padding).
        features: ``int32[..., I, F]`` feature codes per instance (vocab order; -1 = null, matches nothing).
        live_reason: optional ``int32[..., I]`` reason index from the live explicit check, -1 = none.

    Returns:
        ``bool[..., I]``: True = shown on the menu.
    """
    if guards.opt.shape[0] == 0:  # no guards (also a library without read-set features: F = 0)
        return opt_ids >= 0
    same_opt = opt_ids[..., :, None] == guards.opt  # [..., I, G]
    fidx = jnp.clip(guards.feat, 0, None)  # [G, L]
    got = jnp.take(features, fidx, axis=-1)  # [..., I, G, L]
    lit_ok = (guards.feat < 0) | (got == guards.val)
    inferred_hit = same_opt & jnp.all(lit_ok, axis=-1) & (guards.reason < 0)
    hidden = inferred_hit
    if live_reason is not None:
        explicit_hit = same_opt & (guards.reason >= 0) & (live_reason[..., :, None] == guards.reason)
        hidden = hidden | explicit_hit
    return ~jnp.any(hidden, axis=-1) & (opt_ids >= 0)
