# The C scanner of the fast Kineto reader (_scan.c).
from typing_extensions import Buffer

# Column buffers (the scanner's memory, handed over without a copy; the buffer protocol).
StringColumn = tuple[Buffer, Buffer, Buffer, Buffer]  # int32 offsets, UTF-8 data, valid, escaped
NumberColumn = tuple[Buffer, Buffer]  # 8-byte values, valid
Columns = tuple[
    Buffer,  # int64 index in traceEvents of each complete event
    tuple[StringColumn, StringColumn, StringColumn, StringColumn],  # cat, name, pis, tis
    # pid, tid, ts (int64 thousandths of a µs), dur (float64), correlation, device, stream
    tuple[NumberColumn, ...],
]

class Scanner:
    def __init__(self, prefixes: tuple[bytes, ...]) -> None: ...
    def scan(
        self, buffer: Buffer, first: bool, /
    ) -> tuple[bool, int, int, bool, list[tuple[int, int, int]] | None]: ...
    def columns(self) -> Columns: ...
    def held(self) -> int: ...
