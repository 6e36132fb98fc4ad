"""The batch decoder of small Parquet files (analyzer/load/parquet_batch.py) reads what pyarrow
reads, or leaves the file to pyarrow: never another table."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfdiag.analyzer.load import parquet_batch
from perfdiag.api.schema import META_SCHEMA, META_WORKER, SUMMARY_SCHEMA, SUMMARY_SCHEMA_ID
from perfdiag.engine.parquet_io import table_to_bytes

KEYS = (META_SCHEMA, META_WORKER)
NAMES = ["aten::mm", "<idle>", "train.py(41): forward", "ünïcode ✓", "", "x" * 300]


def summary(rows: int, seed: int, *, nulls: bool = True, steps: int = 10) -> pa.Table:
    """A SUMMARY_SCHEMA table as the engine writes one, with nulls where `nulls`."""
    rng = np.random.default_rng(seed)

    def maybe(values: list[object]) -> list[object]:
        if not nulls:
            return values
        return [None if rng.random() < 0.2 else v for v in values]

    lengths = rng.integers(0, steps + 1, rows) if nulls else np.full(rows, steps)
    per_step = [
        None if nulls and rng.random() < 0.1 else maybe(list(rng.random(int(n)).astype(float)))
        for n in lengths
    ]
    table = pa.table(
        {
            "rank": pa.array(maybe([seed] * rows), pa.int32()),
            "function": pa.array(maybe([NAMES[i % len(NAMES)] for i in range(rows)]), pa.string()),
            "category": pa.array(maybe(["cpu_op", "python", "idle"][i % 3] for i in range(rows))),
            "beta": pa.array(maybe(list(rng.random(rows))), pa.float64()),
            "time_ms": pa.array(maybe(list(rng.random(rows) * 100)), pa.float64()),
            "count": pa.array(maybe(list(rng.integers(0, 10**12, rows))), pa.int64()),
            "wall_ms": pa.array(maybe(list(rng.random(rows))), pa.float64()),
            "dur_median_us": pa.array(maybe(list(rng.random(rows))), pa.float64()),
            "dur_p95_us": pa.array(maybe(list(rng.random(rows))), pa.float64()),
            "resource": pa.array(maybe(["sm_clock_MHz"] * rows), pa.string()),
            "resource_mu": pa.array(maybe(list(rng.random(rows) * 2000)), pa.float64()),
            "resource_sigma": pa.array(maybe(list(rng.random(rows))), pa.float64()),
            "beta_per_step": pa.array(per_step, pa.list_(pa.float32())),
        },
        schema=SUMMARY_SCHEMA,
    )
    meta = {META_SCHEMA: SUMMARY_SCHEMA_ID.encode(), META_WORKER: f'{{"rank":{seed}}}'.encode()}
    return table.replace_schema_metadata(meta)


def pyarrow_read(data: bytes) -> pa.Table:
    return pq.ParquetFile(pa.BufferReader(data)).read().replace_schema_metadata(None)


@pytest.fixture(scope="module")
def template() -> parquet_batch.Template:
    return parquet_batch.make_template(table_to_bytes(summary(15, 0)), SUMMARY_SCHEMA, KEYS)


def test_a_batch_reads_as_pyarrow_reads_each_file(template: parquet_batch.Template) -> None:
    files = [table_to_bytes(summary(rows, seed)) for seed, rows in enumerate([1, 15, 7, 500, 30])]
    files.append(table_to_bytes(summary(20, 99, nulls=False)))
    decoded = parquet_batch.decode(template, files)
    assert decoded.ok.all()
    assert decoded.table.equals(pa.concat_tables([pyarrow_read(f) for f in files]))
    assert decoded.rows.tolist() == [1, 15, 7, 500, 30, 20]
    assert decoded.values[META_WORKER][3] == b'{"rank":3}'
    assert decoded.values[META_SCHEMA] == [SUMMARY_SCHEMA_ID.encode()] * 6


def test_other_layouts_are_left_to_pyarrow(template: parquet_batch.Template) -> None:
    table = summary(15, 1)
    zstd, dictionary, statistics, v2 = io.BytesIO(), io.BytesIO(), io.BytesIO(), io.BytesIO()
    pq.write_table(table, zstd, compression="zstd", use_dictionary=False, write_statistics=False)
    pq.write_table(table, dictionary, compression="none", write_statistics=False)
    pq.write_table(table, statistics, compression="none", use_dictionary=False)
    pq.write_table(
        table,
        v2,
        compression="none",
        use_dictionary=False,
        write_statistics=False,
        data_page_version="2.0",
    )
    plain = table_to_bytes(table)
    files = [zstd.getvalue(), dictionary.getvalue(), plain, statistics.getvalue(), v2.getvalue()]
    files += [b"", b"PAR1", b"not parquet at all", plain[:-1], plain[:100]]
    decoded = parquet_batch.decode(template, files)
    assert decoded.ok.tolist() == [False, False, True, False, False] + [False] * 5
    assert decoded.table.equals(pyarrow_read(plain))
    assert decoded.rows.tolist() == [0, 0, 15] + [0] * 7


def test_text_that_is_not_utf8_is_left_to_pyarrow(template: parquet_batch.Template) -> None:
    good = table_to_bytes(summary(15, 2))
    bad = bytearray(good)
    at = bad.index(b"aten::mm")
    bad[at : at + 2] = b"\xff\xfe"
    decoded = parquet_batch.decode(template, [good, bytes(bad), good])
    assert decoded.ok.tolist() == [True, False, True]
    assert decoded.table.equals(pa.concat_tables([pyarrow_read(good)] * 2))


def test_a_layout_the_decoder_cannot_read_makes_no_template() -> None:
    nested = pa.table({"a": pa.array([[[1.0]]], pa.list_(pa.list_(pa.float64())))})
    with pytest.raises(parquet_batch.NoTemplate):
        parquet_batch.make_template(table_to_bytes(nested), nested.schema, ())
    zstd = io.BytesIO()
    pq.write_table(summary(3, 0), zstd, compression="zstd")
    with pytest.raises(parquet_batch.NoTemplate):
        parquet_batch.make_template(zstd.getvalue(), SUMMARY_SCHEMA, KEYS)


def arrow_schema_span(data: bytes) -> range:
    """Where the value of the ARROW:schema hint is in a file (its base64 text)."""
    # Compact protocol, after the key: the value's field header byte, a varint length, bytes.
    pos = data.rindex(b"ARROW:schema") + len(b"ARROW:schema") + 1
    size, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        size |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return range(pos, pos + size)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(1, 40),
    seed=st.integers(0, 1000),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3),
)
def test_a_damaged_file_is_read_as_pyarrow_reads_it_or_left_to_it(
    template: parquet_batch.Template, rows: int, seed: int, flips: list[tuple[int, int]]
) -> None:
    clean = table_to_bytes(summary(rows, seed))
    damaged = bytearray(clean)
    for position, value in flips:
        damaged[position % len(damaged)] = value
    decoded = parquet_batch.decode(template, [clean, bytes(damaged), clean])
    assert decoded.ok[0] and decoded.ok[2]
    if not decoded.ok[1]:
        assert decoded.table.equals(pa.concat_tables([pyarrow_read(clean)] * 2))
        return
    try:
        expected = pyarrow_read(bytes(damaged))
    except (pa.ArrowException, OSError):
        # pyarrow refuses the file for its Arrow schema hint, which the decoder does not read
        # (the reference's Parquet schema fixes the types): with that hint whole, pyarrow
        # reads what the decoder read.
        hint = arrow_schema_span(clean)
        restored = bytearray(damaged)
        restored[hint.start : hint.stop] = clean[hint.start : hint.stop]
        expected = pyarrow_read(bytes(restored))
    clean_table = pyarrow_read(clean)
    assert decoded.table.equals(pa.concat_tables([clean_table, expected, clean_table]))
