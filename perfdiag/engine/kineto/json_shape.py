"""What both JSON readers extract from a Kineto trace: one row per `traceEvents` entry."""

from __future__ import annotations

from typing import cast

import pyarrow as pa
from isal import igzip_lib

GZIP_MAGIC = b"\x1f\x8b"
TRACE_EVENTS_KEY = b'"traceEvents"'
# Both readers refuse numbers (µs) this large: beyond any clock Kineto writes, inside int64 as ns.
MAX_NUMBER = 9 * 10**15


# ISA-L's inflate, about 2.5× zlib on these files. Its bz2-style decompressor keeps the input
# it has not used yet: the caller reads compressed blocks and never gets an unused tail
# back to copy and hand in again (zlib's decompressobj API). (isal's stub declares its error
# class as an instance.)
INFLATE_ERRORS: tuple[type[Exception], ...] = (cast("type[Exception]", igzip_lib.IsalError),)


def inflater() -> igzip_lib.IgzipDecompressor:
    """A streaming gunzip of one gzip member (its CRC and length checked at its end)."""
    return igzip_lib.IgzipDecompressor(flag=igzip_lib.DECOMP_GZIP)


class TraceError(ValueError):
    """A trace cannot be read; the message names the file and the problem."""


# Kineto writes ts as µs with 3 decimals (ns); decimal keeps them exact where float64 cannot
# (epoch µs ≈ 1.7e15 has a float64 step of 0.25 µs).
TS_TYPE = pa.decimal128(24, 3)

# `args` read for every event; the arguments of collectives are read for those events alone
# (perfdiag.engine.kineto.parse), which keeps the bulk parse small.
ARGS = pa.struct([("correlation", pa.int64()), ("device", pa.int64()), ("stream", pa.int64())])

# "pis"/"tis": the pid/tid of the few bookkeeping events where Kineto writes a label ("Spans")
# instead of a number, kept apart so the number columns keep one type.
JSON_SCHEMA = pa.schema(
    [
        ("ph", pa.string()),
        ("cat", pa.string()),
        ("name", pa.string()),
        ("pid", pa.int64()),
        ("pis", pa.string()),
        ("tid", pa.int64()),
        ("tis", pa.string()),
        ("ts", TS_TYPE),
        ("dur", pa.float64()),
        ("args", ARGS),
    ]
)
