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

class Squeezer:
    """JSON text without its padding (_scan.c): blank runs kept as their first byte."""

    stopped: int  # 0 going on, 1 a byte JSON cannot hold there (kept), 2 a string above limit
    read: int  # bytes consumed
    kept: int  # bytes written
    string_at: int  # offset read of the last string's opening quote (-1: none yet)
    string_kept: int  # offset written of the last string's opening quote (-1: none yet)
    def __init__(self, limit: int) -> None: ...
    def squeeze(self, data: Buffer, into: bytearray | None, upto: int = -1) -> int: ...

def prune(text: bytearray, event: bool = False) -> tuple[int, int, int]:
    """(status, position, bytes blanked) of a whole JSON text (_scan.c): 0 valid, 1 not JSON
    at position, 2 nested deeper than 512 at position; the arrays and objects no reader keeps
    blanked in place."""
