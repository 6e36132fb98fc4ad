# The C scanner of the fast Kineto reader (_scan.c).
from typing_extensions import Buffer

StringColumn = tuple[bytes, bytes, bytes, bytes]  # int32 offsets, UTF-8 data, valid, escaped
NumberColumn = tuple[bytes, bytes]  # 8-byte values, valid
Columns = tuple[
    bytes,  # rows: int64 ordinal of each complete event among the events read
    bytes,  # starts: int64 offset of its text
    bytes,  # stops: int64 end of its text
    tuple[StringColumn, StringColumn, StringColumn, StringColumn],  # cat, name, pis, tis
    tuple[
        NumberColumn, ...
    ],  # pid, tid, ts (thousandths), dur (float64), correlation, device, stream
]

def scan(buffer: Buffer, first: bool, /) -> tuple[bool, int, int, bool, Columns | None]: ...
