"""Arrow tables ⇄ Parquet bytes, the one way perfdiag stores columnar data."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

SMALL_TABLE_BYTES = 1 << 18
"""Tables below this (a worker's summary: tens of rows) are written as plain pages: no
compression, no dictionary, no statistics. Reading a file of a few KB is all per-column setup
(a zstd context, a dictionary page, statistics), and the analyzer reads one per worker: plain
pages read several times faster (docs/benchmarks.md, 100,000 workers from storage), and
compression saved nothing at this size."""


def table_to_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    if table.nbytes < SMALL_TABLE_BYTES:
        pq.write_table(
            table, sink, compression="none", use_dictionary=False, write_statistics=False
        )
    else:
        pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


THREADED_READ_BYTES = 1 << 20
"""Files below this are decoded on the calling thread: for a worker's few-KB summary the
dataset layer of pq.read_table and its thread pool cost more than the decoding (~2× slower),
and the analyzer already reads many workers' files in parallel."""


def table_from_bytes(data: bytes) -> pa.Table:
    return pq.ParquetFile(io.BytesIO(data)).read(use_threads=len(data) >= THREADED_READ_BYTES)
