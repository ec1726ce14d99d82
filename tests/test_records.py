"""Tests for jaxopt_marl.records: schema, device-array conversion, Parquet round trip, validation errors."""

import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pytest

from jaxopt_marl import records as rec

VOCAB = rec.RecordVocab(
    option_names=("pick_onion", "start_cooking", "deliver"),
    reason_names=("TargetAbsent", "NoPath", "NothingHeld"),
    features={"held": ("none", "onion", "dish"), "tgt_pot_state": ("empty", "partial", "full")},
)


def device_buffers(n=6):
    """Fixed-size buffers as the burn-in loop would emit them (last row is padding)."""
    return dict(
        ep=jnp.arange(n, dtype=jnp.int32) // 2,
        step=jnp.arange(n, dtype=jnp.int32) * 3,
        aid=jnp.arange(n, dtype=jnp.int32) % 2,
        solo=jnp.array([True, True, False, False, True, False]),
        opt=jnp.array([0, 1, 1, 2, 2, 0], jnp.int32),
        target=jnp.array([[4, 2], [1, 3], [1, 3], [-1, -1], [0, 4], [0, 0]], jnp.int32),
        outcome=jnp.array([0, 1, 2, 3, 4, 0], jnp.int32),
        features=jnp.array([[0, -1], [1, 0], [2, 2], [0, -1], [1, 1], [0, 0]], jnp.int32),
        valid=jnp.array([True, True, True, True, True, False]),
    )


def test_from_arrays_decodes_codes_and_drops_padding():
    t = rec.records_from_arrays(VOCAB, **device_buffers())
    assert t.schema.names == list(rec.BASE_COLUMNS) + ["held", "tgt_pot_state"]
    assert t.num_rows == 5
    rows = t.to_pylist()
    assert rows[0] == {
        "ep": 0,
        "step": 0,
        "aid": 0,
        "solo": True,
        "opt": "pick_onion",
        "target_x": 2,
        "target_y": 4,
        "outcome": "success",
        "held": "none",
        "tgt_pot_state": None,
    }
    assert [r["outcome"] for r in rows] == [
        "success",
        "effect_fail",
        "explicit:TargetAbsent",
        "explicit:NoPath",
        "explicit:NothingHeld",
    ]
    assert rows[2]["held"] == "dish" and rows[2]["tgt_pot_state"] == "full"
    assert rows[3]["target_x"] == -1


def test_parquet_round_trip(tmp_path):
    t = rec.records_from_arrays(VOCAB, **device_buffers())
    path = rec.write_records(t, tmp_path / "burnin" / "records.parquet", VOCAB)
    back = rec.read_records(path)  # vocabulary recovered from the file's metadata
    assert rec.vocab_from_table(back) == VOCAB
    assert back.to_pylist() == t.to_pylist()
    c0, c1 = rec.table_to_codes(t, VOCAB), rec.table_to_codes(back, VOCAB)
    for a, b in zip(c0, c1):
        np.testing.assert_array_equal(a, b)
    buf = device_buffers()
    keep = np.asarray(buf["valid"])
    np.testing.assert_array_equal(c1.opt, np.asarray(buf["opt"])[keep])
    np.testing.assert_array_equal(c1.outcome, np.asarray(buf["outcome"])[keep])
    np.testing.assert_array_equal(c1.features, np.asarray(buf["features"])[keep])
    np.testing.assert_array_equal(c1.target_y, np.asarray(buf["target"])[keep, 0])


def test_plain_string_columns_and_rows_are_accepted():
    rows = [
        {
            "ep": 512,
            "step": 41,
            "aid": 0,
            "solo": False,
            "opt": "start_cooking",
            "target": [4, 2],
            "held": "onion",
            "tgt_pot_state": "full",
            "outcome": "effect_fail",
        },
    ]
    t = rec.records_from_rows(rows, VOCAB)
    r = t.to_pylist()[0]
    assert (r["target_x"], r["target_y"], r["opt"], r["held"]) == (4, 2, "start_cooking", "onion")
    plain = t.cast(
        pa.schema([pa.field(f.name, pa.string() if pa.types.is_dictionary(f.type) else f.type) for f in t.schema])
    )
    c = rec.table_to_codes(plain, VOCAB)
    assert c.opt.tolist() == [1] and c.outcome.tolist() == [1] and c.features.tolist() == [[1, 2]]


def _base_row(**over):
    row = {
        "ep": 0,
        "step": 0,
        "aid": 0,
        "solo": True,
        "opt": "deliver",
        "target_x": 1,
        "target_y": 1,
        "outcome": "success",
        "held": "dish",
        "tgt_pot_state": None,
    }
    row.update(over)
    return row


def _string_table(rows):
    return pa.Table.from_pylist(rows)


@pytest.mark.parametrize(
    "over, match",
    [
        ({"opt": "pick_tomato"}, r"column 'opt': unknown value 'pick_tomato'"),
        ({"outcome": "explicit:Blocked"}, r"column 'outcome': unknown value 'explicit:Blocked'"),
        ({"outcome": "fail"}, r"column 'outcome': unknown value 'fail'"),
        ({"held": "tomato"}, r"column 'held': unknown value 'tomato'"),
        ({"tgt_pot_state": "burnt"}, r"column 'tgt_pot_state': unknown value 'burnt'"),
        ({"opt": None}, r"column 'opt': null value"),
    ],
)
def test_validation_names_bad_column_and_value(over, match):
    t = _string_table([_base_row(), _base_row(**over)])
    with pytest.raises(ValueError, match=match):
        rec.validate_records(t, VOCAB)


def test_validation_bad_value_in_dictionary_column():
    t = _string_table([_base_row(), _base_row(held="tomato")])
    t = t.set_column(t.schema.get_field_index("held"), "held", t.column("held").dictionary_encode())
    with pytest.raises(ValueError, match=r"column 'held': unknown value 'tomato'"):
        rec.validate_records(t, VOCAB)


def test_validation_missing_column_and_wrong_type():
    t = _string_table([_base_row()])
    with pytest.raises(ValueError, match=r"missing column 'tgt_pot_state'"):
        rec.validate_records(t.drop_columns(["tgt_pot_state"]), VOCAB)
    bad = t.set_column(t.schema.get_field_index("step"), "step", pa.array(["41"]))
    with pytest.raises(ValueError, match=r"column 'step': expected an integer type"):
        rec.validate_records(bad, VOCAB)
    bad = t.set_column(t.schema.get_field_index("solo"), "solo", pa.array([1]))
    with pytest.raises(ValueError, match=r"column 'solo': expected bool"):
        rec.validate_records(bad, VOCAB)


def test_from_arrays_rejects_out_of_range_codes():
    buf = device_buffers()
    buf["opt"] = buf["opt"].at[2].set(7)
    with pytest.raises(ValueError, match=r"column 'opt': code 7 at row 2"):
        rec.records_from_arrays(VOCAB, **buf)
    buf = device_buffers()
    buf["features"] = buf["features"].at[1, 0].set(3)
    with pytest.raises(ValueError, match=r"column 'held': code 3 at row 1"):
        rec.records_from_arrays(VOCAB, **buf)
    buf = device_buffers()
    buf["outcome"] = buf["outcome"].at[0].set(-1)
    with pytest.raises(ValueError, match=r"column 'outcome': code -1 at row 0"):
        rec.records_from_arrays(VOCAB, **buf)


def test_vocab_rejects_colliding_or_duplicate_names():
    with pytest.raises(ValueError, match="collides"):
        rec.RecordVocab(("a",), (), {"opt": ("x",)})
    with pytest.raises(ValueError, match="duplicate"):
        rec.RecordVocab(("a", "a"), (), {})
    with pytest.raises(ValueError, match="':'"):
        rec.RecordVocab(("a",), ("No:Path",), {})
    assert VOCAB.outcome_names[:3] == ("success", "effect_fail", "explicit:TargetAbsent")


def test_read_without_vocab_metadata_fails(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(_string_table([_base_row()]), tmp_path / "r.parquet")
    with pytest.raises(ValueError, match="no vocabulary metadata"):
        rec.read_records(tmp_path / "r.parquet")
    assert rec.read_records(tmp_path / "r.parquet", VOCAB).num_rows == 1
