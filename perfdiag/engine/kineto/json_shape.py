"""What both JSON readers extract from a Kineto trace: one row per `traceEvents` entry."""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
from isal import isal_zlib

GZIP_MAGIC = b"\x1f\x8b"
TRACE_EVENTS_KEY = b'"traceEvents"'
# Both readers refuse numbers (µs) this large: beyond any clock Kineto writes, inside int64 as ns.
MAX_NUMBER = 9 * 10**15


# ISA-L's inflate: the zlib interface, about 2.5× faster than zlib on these files.
# (isal's stub declares its error class as an instance.)
INFLATE_ERRORS: tuple[type[Exception], ...] = (cast("type[Exception]", isal_zlib.error),)


def inflater() -> Any:
    """A streaming gunzip (a gzip or zlib header, auto-detected), zlib's decompressobj API."""
    return isal_zlib.decompressobj(wbits=47)


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
