"""Arrow tables ⇄ Parquet bytes, the one way perfdiag stores columnar data."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq


def table_to_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def table_from_bytes(data: bytes) -> pa.Table:
    return pq.read_table(io.BytesIO(data))
