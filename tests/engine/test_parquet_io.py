"""perfdiag.engine.parquet_io: every table comes back as written (types, nulls, schema metadata);
small tables (a worker's summary) are plain pages, large ones (raw events, samples) zstd."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from perfdiag.engine.parquet_io import SMALL_TABLE_BYTES, table_from_bytes, table_to_bytes


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(1)
    steps = [None if i % 7 == 0 else [float(v) for v in rng.random(3)] for i in range(rows)]
    table = pa.table(
        {
            "rank": pa.array(np.arange(rows) % 4, pa.int32()),
            "function": pa.array([f"fn{i % 13}" if i % 5 else None for i in range(rows)]),
            "ms": pa.array(rng.random(rows)),
            "count": pa.array(np.arange(rows), pa.int64()),
            "beta_per_step": pa.array(steps, pa.list_(pa.float32())),
        }
    )
    return table.replace_schema_metadata({b"perfdiag.schema": b"perfdiag.summary/v1"})


@pytest.mark.parametrize(("rows", "codec"), [(15, "UNCOMPRESSED"), (200_000, "ZSTD")])
def test_tables_round_trip_with_the_codec_their_size_calls_for(rows: int, codec: str) -> None:
    table = _table(rows)
    assert (table.nbytes < SMALL_TABLE_BYTES) == (codec == "UNCOMPRESSED")
    data = table_to_bytes(table)
    back = table_from_bytes(data)
    assert back.equals(table)
    assert back.schema.metadata == table.schema.metadata
    assert back.schema.names == table.schema.names
    column = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    assert column.compression == codec
