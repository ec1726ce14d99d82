"""Burn-in records as columnar data (paper §5.1, Stage 2; DESIGN.md "Options, burn-in, guards, menus").

Each completed option execution of the uniform-over-menu burn-in emits one record: the option, its target, the
declared read-set features *at initiation*, and an outcome in ``{success, effect_fail, explicit:<Reason>}``
decided by the effect predicate or the executor's typed failure, never by reward (§5.1 Stage 2). The paper's
record ::

    {"ep": 512, "step": 41, "aid": 0, "opt": "start_cooking", "target": [4, 2],
     "features": {"held": "onion", "tgt_pot_state": "full"}, "outcome": "effect_fail"}

is one row of the table here, with ``target`` split into ``target_x, target_y`` and one column per feature.

Columns (:func:`record_schema`):

=================  =============================  =========================================================
column             arrow type                     meaning
=================  =============================  =========================================================
``ep``             int32                          burn-in episode index
``step``           int32                          env step at which the option was initiated
``aid``            int32                          acting agent index
``solo``           bool                           the episode had a single agent (§5.1 Defect 2)
``opt``            dictionary<int32, string>      option name (``RecordVocab.option_names``)
``target_x``       int32                          target column (x), -1 if the option has no target
``target_y``       int32                          target row (y), -1 if the option has no target
``outcome``        dictionary<int32, string>      ``success`` | ``effect_fail`` | ``explicit:<Reason>``
``<feature>``      dictionary<int32, string>      one per read-set feature, value at initiation; null =
                                                  not logged / not applicable for this option
=================  =============================  =========================================================

Coordinates: the grid convention of :mod:`jaxopt_marl.paths` is (row, col); ``target_x = col``,
``target_y = row``.

On the device, records live in fixed-size integer buffers; :func:`records_from_arrays` turns them into a table
using the integer codes of :class:`RecordVocab` (outcome code 0 = success, 1 = effect_fail, ``2 + k`` =
``explicit:<reason_names[k]>``; feature code ``v`` = ``features[name][v]``, -1 = null). The vocabulary is
also stored in the Parquet schema metadata so :func:`read_records` can recover it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# ---------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------

#: Outcome labels of §5.1 Stage 2.
SUCCESS = "success"
EFFECT_FAIL = "effect_fail"
EXPLICIT_PREFIX = "explicit:"

#: Integer outcome codes used on the device; explicit reason ``k`` has code ``OUTCOME_EXPLICIT_BASE + k``.
OUTCOME_SUCCESS = 0
OUTCOME_EFFECT_FAIL = 1
OUTCOME_EXPLICIT_BASE = 2

#: Integer columns of every record table, in order.
INT_COLUMNS = ("ep", "step", "aid", "target_x", "target_y")
#: The fixed (game-independent) columns, in order; feature columns follow.
BASE_COLUMNS = ("ep", "step", "aid", "solo", "opt", "target_x", "target_y", "outcome")

#: Key of the Parquet schema metadata that holds the vocabulary as JSON.
VOCAB_METADATA_KEY = b"jaxopt_marl.record_vocab"

_DICT_TYPE = pa.dictionary(pa.int32(), pa.string())


# ---------------------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RecordVocab:
    """Names behind the integer codes of a game's records.

    Attributes:
        option_names: option names; option id ``i`` is ``option_names[i]``.
        reason_names: explicit failure reasons (e.g. ``TargetAbsent``, ``NoPath``, ``NothingHeld``); reason
            ``k`` has outcome code ``2 + k``.
        features: ordered ``(feature_name, values)`` pairs; feature ``j`` has code ``v`` meaning
            ``features[j][1][v]``. A mapping is accepted and converted.
    """

    option_names: tuple[str, ...]
    reason_names: tuple[str, ...]
    features: tuple[tuple[str, tuple[str, ...]], ...]

    def __post_init__(self):
        feats = self.features.items() if isinstance(self.features, Mapping) else self.features
        object.__setattr__(self, "option_names", tuple(self.option_names))
        object.__setattr__(self, "reason_names", tuple(self.reason_names))
        object.__setattr__(self, "features", tuple((str(n), tuple(v)) for n, v in feats))
        _check_unique("option_names", self.option_names)
        _check_unique("reason_names", self.reason_names)
        _check_unique("features", self.feature_names)
        for name in self.feature_names:
            if name in BASE_COLUMNS or name.startswith("__"):
                raise ValueError(f"feature name {name!r} collides with a base column or reserved key")
        for name, values in self.features:
            _check_unique(f"values of feature {name!r}", values)
        for reason in self.reason_names:
            if not reason or ":" in reason:
                raise ValueError(f"reason name {reason!r} must be non-empty and contain no ':'")

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Feature names in code order."""
        return tuple(n for n, _ in self.features)

    @property
    def feature_values(self) -> dict[str, tuple[str, ...]]:
        """``{feature: values}``."""
        return dict(self.features)

    @property
    def outcome_names(self) -> tuple[str, ...]:
        """Outcome label per outcome code: ``success, effect_fail, explicit:<reason>...``."""
        return (SUCCESS, EFFECT_FAIL) + tuple(EXPLICIT_PREFIX + r for r in self.reason_names)

    def to_json(self) -> str:
        """JSON form stored in the Parquet metadata."""
        return json.dumps(
            {
                "option_names": list(self.option_names),
                "reason_names": list(self.reason_names),
                "features": [[n, list(v)] for n, v in self.features],
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> RecordVocab:
        """Inverse of :meth:`to_json`."""
        d = json.loads(text)
        return cls(d["option_names"], d["reason_names"], tuple((n, tuple(v)) for n, v in d["features"]))


def _check_unique(what: str, names: Sequence[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError(f"duplicate name {n!r} in {what}")
        seen.add(n)


# ---------------------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------------------


def record_schema(vocab: RecordVocab) -> pa.Schema:
    """The Arrow schema of a record table (see the module docstring), with the vocabulary as metadata.

    Args:
        vocab: the game's :class:`RecordVocab`.

    Returns:
        ``pa.Schema`` with the base columns then one column per feature.
    """
    fields = [
        pa.field("ep", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("aid", pa.int32(), nullable=False),
        pa.field("solo", pa.bool_(), nullable=False),
        pa.field("opt", _DICT_TYPE, nullable=False),
        pa.field("target_x", pa.int32(), nullable=False),
        pa.field("target_y", pa.int32(), nullable=False),
        pa.field("outcome", _DICT_TYPE, nullable=False),
    ]
    fields += [pa.field(n, _DICT_TYPE, nullable=True) for n in vocab.feature_names]
    return pa.schema(fields, metadata={VOCAB_METADATA_KEY: vocab.to_json().encode()})


class RecordCodes(NamedTuple):
    """Records as integer numpy columns (what guard synthesis counts over).

    Attributes:
        ep: ``int32[N]``.
        step: ``int32[N]``.
        aid: ``int32[N]``.
        solo: ``bool[N]``.
        opt: ``int32[N]`` option id (index into ``vocab.option_names``).
        target_x: ``int32[N]`` target column, -1 if none.
        target_y: ``int32[N]`` target row, -1 if none.
        outcome: ``int32[N]`` outcome code (0 success, 1 effect_fail, ``2 + k`` explicit reason ``k``).
        features: ``int32[N, F]`` feature value codes in ``vocab.feature_names`` order, -1 = null.
    """

    ep: np.ndarray
    step: np.ndarray
    aid: np.ndarray
    solo: np.ndarray
    opt: np.ndarray
    target_x: np.ndarray
    target_y: np.ndarray
    outcome: np.ndarray
    features: np.ndarray

    @property
    def num_records(self) -> int:
        """``N``, the number of records (``len()`` is the NamedTuple's field count)."""
        return int(self.opt.shape[0])


# ---------------------------------------------------------------------------------------------------------
# Table <-> codes
# ---------------------------------------------------------------------------------------------------------


def _categorical_codes(column: pa.ChunkedArray, name: str, vocab: Sequence[str], *, nullable: bool) -> np.ndarray:
    """Encode a string or dictionary<string> column as ``int32`` indices into ``vocab`` (vectorised).

    Raises:
        ValueError: naming ``name`` and the first value that is not in ``vocab`` (or a null where none allowed).
    """
    value_set = pa.array(list(vocab), pa.string())
    out = []
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):
            dict_codes = pc.index_in(chunk.dictionary.cast(pa.string()), value_set=value_set)
            bad = pc.and_(pc.is_null(dict_codes), pc.is_valid(chunk.dictionary))
            if pc.any(bad).as_py():
                bad_value = pc.filter(chunk.dictionary, bad)[0].as_py()
                raise ValueError(f"column {name!r}: unknown value {bad_value!r}; expected one of {list(vocab)}")
            codes = dict_codes.take(chunk.indices)
        else:
            codes = pc.index_in(chunk.cast(pa.string()), value_set=value_set)
            bad = pc.and_(pc.is_null(codes), pc.is_valid(chunk))
            if pc.any(bad).as_py():
                bad_value = pc.filter(chunk, bad)[0].as_py()
                raise ValueError(f"column {name!r}: unknown value {bad_value!r}; expected one of {list(vocab)}")
        if not nullable and chunk.null_count:
            raise ValueError(f"column {name!r}: null value at row {_first_null(chunk)} (not allowed)")
        out.append(codes.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32))
    return np.concatenate(out) if out else np.zeros(0, np.int32)


def _first_null(chunk: pa.Array) -> int:
    return int(np.flatnonzero(chunk.is_null().to_numpy(zero_copy_only=False))[0])


def validate_records(table: pa.Table, vocab: RecordVocab) -> None:
    """Check a record table against the schema of :func:`record_schema`.

    Accepts plain string columns as well as dictionary-encoded ones, and any integer width for the integer
    columns. Extra columns (e.g. logged transient features, §5.1 Stage 2) are allowed.

    Args:
        table: the record table.
        vocab: the game's vocabulary.

    Raises:
        ValueError: naming the first bad column (missing, wrong type, null, or an unknown value, which is
            quoted).
    """
    table_to_codes(table, vocab)


def table_to_codes(table: pa.Table, vocab: RecordVocab) -> RecordCodes:
    """Validate a record table and encode it as integer columns (no Python loop over records).

    Args:
        table: ``N`` records with the columns of :func:`record_schema`.
        vocab: the game's vocabulary.

    Returns:
        :class:`RecordCodes` with ``N`` rows.

    Raises:
        ValueError: naming the bad column and value (see :func:`validate_records`).
    """
    names = set(table.column_names)
    for col in BASE_COLUMNS + vocab.feature_names:
        if col not in names:
            raise ValueError(f"record table is missing column {col!r}")

    ints = {}
    for col in INT_COLUMNS:
        arr = table.column(col)
        if not pa.types.is_integer(arr.type):
            raise ValueError(f"column {col!r}: expected an integer type, got {arr.type}")
        if arr.null_count:
            raise ValueError(f"column {col!r}: null value (not allowed)")
        ints[col] = arr.to_numpy().astype(np.int32)

    solo = table.column("solo")
    if not pa.types.is_boolean(solo.type):
        raise ValueError(f"column 'solo': expected bool, got {solo.type}")
    if solo.null_count:
        raise ValueError("column 'solo': null value (not allowed)")

    def categorical(col: str, vals: Sequence[str], nullable: bool) -> np.ndarray:
        arr = table.column(col)
        if nullable and pa.types.is_null(arr.type):  # an all-null column (e.g. from pylist)
            return np.full(table.num_rows, -1, np.int32)
        value_type = arr.type.value_type if pa.types.is_dictionary(arr.type) else arr.type
        if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)):
            raise ValueError(f"column {col!r}: expected strings, got {arr.type}")
        return _categorical_codes(arr, col, vals, nullable=nullable)

    opt = categorical("opt", vocab.option_names, nullable=False)
    outcome = categorical("outcome", vocab.outcome_names, nullable=False)
    feats = [categorical(n, v, nullable=True) for n, v in vocab.features]
    features = np.stack(feats, axis=1) if feats else np.zeros((table.num_rows, 0), np.int32)
    return RecordCodes(
        ep=ints["ep"],
        step=ints["step"],
        aid=ints["aid"],
        solo=solo.to_numpy(zero_copy_only=False).astype(bool),
        opt=opt,
        target_x=ints["target_x"],
        target_y=ints["target_y"],
        outcome=outcome,
        features=features,
    )


def _dict_column(codes: np.ndarray, values: Sequence[str], name: str, *, nullable: bool) -> pa.Array:
    """``int`` codes -> dictionary<int32, string> array over ``values`` (code -1 -> null if nullable)."""
    codes = np.asarray(codes).astype(np.int32, copy=False)
    lo = -1 if nullable else 0
    bad = (codes < lo) | (codes >= len(values))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"column {name!r}: code {int(codes[i])} at row {i} is out of range [{lo}, {len(values)})")
    mask = codes < 0
    indices = pa.array(np.where(mask, 0, codes), pa.int32(), mask=mask if mask.any() else None)
    return pa.DictionaryArray.from_arrays(indices, pa.array(list(values), pa.string()))


def records_from_arrays(
    vocab: RecordVocab,
    *,
    ep: Any,
    step: Any,
    aid: Any,
    solo: Any,
    opt: Any,
    target: Any,
    outcome: Any,
    features: Any,
    valid: Any | None = None,
) -> pa.Table:
    """Build a record table from fixed-size device buffers plus vocabularies.

    All inputs are array-likes (``jax.Array`` or numpy) of a common leading length ``N`` (flatten any batch
    axes first); ``valid`` drops padding rows of a fixed-size buffer.

    Args:
        vocab: names behind the codes.
        ep: ``int[N]`` episode index.
        step: ``int[N]`` initiation step.
        aid: ``int[N]`` acting agent.
        solo: ``bool[N]`` single-agent episode.
        opt: ``int[N]`` option id into ``vocab.option_names``.
        target: ``int[N, 2]`` target (row, col); -1 for none. Stored as ``target_x = col, target_y = row``.
        outcome: ``int[N]`` outcome code (0 success, 1 effect_fail, ``2 + k`` explicit reason ``k``).
        features: ``int[N, F]`` feature codes in ``vocab.feature_names`` order; -1 = null.
        valid: optional ``bool[N]``; rows where False are dropped.

    Returns:
        ``pa.Table`` with the schema of :func:`record_schema`.

    Raises:
        ValueError: on a shape mismatch or an out-of-range code (naming the column and row).
    """
    cols = {
        "ep": np.asarray(ep),
        "step": np.asarray(step),
        "aid": np.asarray(aid),
        "solo": np.asarray(solo).astype(bool),
        "opt": np.asarray(opt),
        "target": np.asarray(target),
        "outcome": np.asarray(outcome),
        "features": np.asarray(features),
    }
    n = cols["opt"].shape[0]
    if cols["features"].ndim != 2 or cols["features"].shape[1] != len(vocab.features):
        raise ValueError(f"column 'features': expected shape [N, {len(vocab.features)}], got {cols['features'].shape}")
    if cols["target"].shape != (n, 2):
        raise ValueError(f"column 'target': expected shape [{n}, 2], got {cols['target'].shape}")
    for name, arr in cols.items():
        if arr.shape[:1] != (n,):
            raise ValueError(f"column {name!r}: expected leading length {n}, got shape {arr.shape}")
    if valid is not None:
        keep = np.asarray(valid).astype(bool)
        cols = {k: v[keep] for k, v in cols.items()}

    arrays = [
        pa.array(cols["ep"].astype(np.int32)),
        pa.array(cols["step"].astype(np.int32)),
        pa.array(cols["aid"].astype(np.int32)),
        pa.array(cols["solo"]),
        _dict_column(cols["opt"], vocab.option_names, "opt", nullable=False),
        pa.array(cols["target"][:, 1].astype(np.int32)),
        pa.array(cols["target"][:, 0].astype(np.int32)),
        _dict_column(cols["outcome"], vocab.outcome_names, "outcome", nullable=False),
    ]
    arrays += [
        _dict_column(cols["features"][:, j], values, name, nullable=True)
        for j, (name, values) in enumerate(vocab.features)
    ]
    return pa.Table.from_arrays(arrays, schema=record_schema(vocab))


def records_from_rows(rows: Iterable[Mapping[str, Any]], vocab: RecordVocab) -> pa.Table:
    """Build a record table from row dicts (small data: tests, examples).

    Each row has the base columns and any feature columns (missing features are null); ``target`` may be
    given as ``[x, y]`` instead of ``target_x, target_y``, as in the paper's record (x = col, y = row).

    Args:
        rows: mappings from column name to value.
        vocab: the game's vocabulary.

    Returns:
        ``pa.Table`` with the schema of :func:`record_schema`.

    Raises:
        ValueError: naming the bad column and value.
    """
    rows = [dict(r) for r in rows]
    for r in rows:
        if "target" in r:
            r["target_x"], r["target_y"] = r.pop("target")
    data: dict[str, list] = {c: [r.get(c) for r in rows] for c in BASE_COLUMNS + vocab.feature_names}
    arrays = [
        pa.array(data["ep"], pa.int32()),
        pa.array(data["step"], pa.int32()),
        pa.array(data["aid"], pa.int32()),
        pa.array(data["solo"], pa.bool_()),
        pa.array(data["opt"], pa.string()),
        pa.array(data["target_x"], pa.int32()),
        pa.array(data["target_y"], pa.int32()),
        pa.array(data["outcome"], pa.string()),
    ] + [pa.array(data[n], pa.string()) for n in vocab.feature_names]
    table = pa.Table.from_arrays(arrays, names=list(BASE_COLUMNS + vocab.feature_names))
    return normalize_records(table, vocab)


def normalize_records(table: pa.Table, vocab: RecordVocab) -> pa.Table:
    """Validate a table and re-encode it exactly in the schema of :func:`record_schema` (extra columns dropped).

    Args:
        table: a record table (string or dictionary columns, any integer widths).
        vocab: the game's vocabulary.

    Returns:
        ``pa.Table`` with the canonical schema.

    Raises:
        ValueError: naming the bad column and value.
    """
    c = table_to_codes(table, vocab)
    return records_from_arrays(
        vocab,
        ep=c.ep,
        step=c.step,
        aid=c.aid,
        solo=c.solo,
        opt=c.opt,
        target=np.stack([c.target_y, c.target_x], axis=1),
        outcome=c.outcome,
        features=c.features,
    )


# ---------------------------------------------------------------------------------------------------------
# Parquet I/O
# ---------------------------------------------------------------------------------------------------------


def write_records(table: pa.Table, path: str | Path, vocab: RecordVocab | None = None) -> Path:
    """Write a record table to Parquet (``DIR/records.parquet`` in the burn-in layout of DESIGN.md).

    Args:
        table: the record table.
        path: output file.
        vocab: if given, the table is validated and normalised first and the vocabulary stored as metadata.

    Returns:
        The path written.
    """
    path = Path(path)
    if vocab is not None:
        table = normalize_records(table, vocab)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def read_records(path: str | Path, vocab: RecordVocab | None = None) -> pa.Table:
    """Read a record table from Parquet and validate it.

    Args:
        path: a file written by :func:`write_records`.
        vocab: the vocabulary to validate against; defaults to the one stored in the file's metadata.

    Returns:
        ``pa.Table``.

    Raises:
        ValueError: if no vocabulary is given or stored, or the table does not validate.
    """
    table = pq.read_table(path)
    if vocab is None:
        vocab = vocab_from_table(table)
    validate_records(table, vocab)
    return table


def vocab_from_table(table: pa.Table) -> RecordVocab:
    """The :class:`RecordVocab` stored in a table's schema metadata.

    Raises:
        ValueError: if the table carries none.
    """
    meta = table.schema.metadata or {}
    if VOCAB_METADATA_KEY not in meta:
        raise ValueError("record table carries no vocabulary metadata; pass vocab explicitly")
    return RecordVocab.from_json(meta[VOCAB_METADATA_KEY])
