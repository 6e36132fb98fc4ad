"""Decoding many small Parquet files of one layout at once, with numpy.

pyarrow spends 0.2–0.7 ms setting up the read of each file (its footer, the Arrow schema, a
reader per column), whatever the file holds: for a worker's 15-row summary that setup is the
whole cost, and 1,000,000 workers would spend minutes on it (docs/benchmarks.md). Files written
by one writer from one schema share their structure: the same thrift tokens in their footers
and page headers, in the same order; only offsets, sizes, counts and some strings differ.

So the files of a batch are compared with a *template* taken from one file that pyarrow has
read (the reference): every file is walked in lockstep, one thrift token of all files per numpy
operation, each structural byte checked against the reference's, the offsets and counts kept;
then each column's levels (the RLE / bit-packed hybrid) and plain values are decoded for all
files together into one Arrow table. Only what a plain writer makes is read this way: one row
group, one uncompressed PLAIN data page (v1) per column, no dictionary; flat columns of fixed
width or strings, and lists of them. A file that departs from the reference anywhere (another
schema or writer, compression, a damaged byte, an odd level run) comes back not decoded, and the
caller reads it with pyarrow: this path makes the common case fast, it never decides what a file
means.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

if TYPE_CHECKING:
    import pyarrow.parquet as pq

Ints = NDArray[np.int64]
Mask = NDArray[np.bool_]
Bytes = NDArray[np.uint8]

MAGIC = b"PAR1"
MAX_LEVEL_RUNS = 64
"""Level runs decoded per column and file; a file needing more is left to pyarrow."""
MAX_STRINGS = 4096
"""Strings per column and file decoded in lockstep; a file with more is left to pyarrow."""
VALUES_PER_BYTE = 16
"""A page may claim at most this many values per byte of its file (plus 1,024): levels are
run-length encoded, so a damaged count could otherwise claim billions."""

# Thrift compact protocol type codes.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET = range(1, 11)
_STRUCT = 12
_DATA_PAGE, _PLAIN, _RLE = 0, 0, 3

# Footer fields whose values differ between files of one layout (paths of thrift field ids;
# a list's elements share its path). Every other byte of a footer must equal the reference's:
# the schema, types, paths, codecs, encodings, metadata keys.
_FOOTER_VARIABLE = {
    (1,),  # version
    (3,),  # num_rows
    (4, 1, 3, 5),  # column chunk: num_values
    (4, 1, 3, 6),  # total_uncompressed_size
    (4, 1, 3, 7),  # total_compressed_size
    (4, 1, 3, 9),  # data_page_offset
    (4, 1, 4),  # offset and column index offsets and lengths
    (4, 1, 5),
    (4, 1, 6),
    (4, 1, 7),
    (4, 2),  # row group: total_byte_size
    (4, 3),  # num_rows
    (4, 6),  # total_compressed_size
    (4, 7),  # ordinal
    (5, 2),  # key-value metadata: the values
    (6,),  # created_by
}
_FOOTER_VARIABLE_TREES = {
    (4, 1, 3, 12),  # statistics
    (4, 1, 3, 16),  # size statistics: level histograms, byte counts
}
_FOOTER_SLOTS = {
    (3,): "num_rows",
    (4, 1, 3, 5): "num_values",
    (4, 1, 3, 6): "chunk_uncompressed",
    (4, 1, 3, 7): "chunk_compressed",
    (4, 1, 3, 9): "page_offset",
    (4, 2): "group_bytes",
    (4, 3): "group_rows",
    (4, 6): "group_compressed",
}
_KV_KEY, _KV_VALUE = (5, 1), (5, 2)
_PAGE_VARIABLE = {(2,), (3,), (4,), (5, 1)}  # sizes, crc, num_values
_PAGE_VARIABLE_TREES = {(5, 5)}  # statistics
_PAGE_SLOTS = {(2,): "uncompressed", (3,): "compressed", (5, 1): "values"}

Step = tuple[str, object]
"""("expect", bytes), ("varint", slot), ("binary", slot) or ("skip", n); slot: a name, or None
for a value read and dropped."""


class NoTemplate(Exception):
    """The reference file has a layout this decoder does not read."""


class _Tokenizer:
    """Walks one thrift compact struct of the reference, turning its tokens into steps."""

    def __init__(
        self,
        data: bytes,
        pos: int,
        variable: Collection[tuple[int, ...]],
        trees: Collection[tuple[int, ...]],
        slots: Mapping[tuple[int, ...], str],
        kept_keys: Sequence[bytes] = (),
    ) -> None:
        self.data, self.pos = data, pos
        self.variable, self.trees, self.slots = variable, trees, slots
        self.kept_keys = kept_keys
        self.steps: list[Step] = []
        self.seen: dict[tuple[int, ...], list[int]] = {}
        """The reference's integer values by path, to check what it is."""
        self.keys: list[bytes] = []

    def _expect(self, raw: bytes) -> None:
        if self.steps and self.steps[-1][0] == "expect":
            previous = self.steps[-1][1]
            assert isinstance(previous, bytes)
            self.steps[-1] = ("expect", previous + raw)
        else:
            self.steps.append(("expect", raw))

    def compiled(self) -> tuple[Step, ...]:
        """The steps, fixed bytes as the words the walk compares."""
        return tuple(
            _expect_step(arg) if kind == "expect" and isinstance(arg, bytes) else (kind, arg)
            for kind, arg in self.steps
        )

    def _byte(self) -> int:
        if self.pos >= len(self.data):
            raise NoTemplate("a thrift struct runs past its end")
        self.pos += 1
        return self.data[self.pos - 1]

    def _varint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self._byte()
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value
            if shift > 63:
                raise NoTemplate("a varint longer than 64 bits")

    def _is_variable(self, path: tuple[int, ...]) -> bool:
        return path in self.variable or any(path[: len(t)] == t for t in self.trees)

    def struct(self, path: tuple[int, ...]) -> None:
        last = 0
        while True:
            start = self.pos
            header = self._byte()
            if header == 0:
                self._expect(b"\x00")
                return
            delta, kind = header >> 4, header & 0x0F
            if delta:
                last += delta
            else:
                zigzag = self._varint()
                last = (zigzag >> 1) ^ -(zigzag & 1)
            self._expect(self.data[start : self.pos])
            if kind not in (_TRUE, _FALSE):  # a bool's value is its header
                self._value(kind, (*path, last))

    def _value(self, kind: int, path: tuple[int, ...]) -> None:
        start = self.pos
        variable = self._is_variable(path)
        if kind in (_I16, _I32, _I64):
            zigzag = self._varint()
            self.seen.setdefault(path, []).append((zigzag >> 1) ^ -(zigzag & 1))
            if variable:
                self.steps.append(("varint", self.slots.get(path)))
            else:
                self._expect(self.data[start : self.pos])
        elif kind in (_BYTE, _DOUBLE):
            self.pos += 1 if kind == _BYTE else 8
            if variable:
                self.steps.append(("skip", self.pos - start))
            else:
                self._expect(self.data[start : self.pos])
        elif kind == _BINARY:
            size = self._varint()
            self.pos += size
            self._binary(path, start, variable)
        elif kind in (_LIST, _SET):
            header = self._byte()
            size, element = header >> 4, header & 0x0F
            if size == 15:
                size = self._varint()
            self._expect(self.data[start : self.pos])
            for _ in range(size):
                self._value(element, path)
        elif kind == _STRUCT:
            self.struct(path)
        else:
            raise NoTemplate(f"thrift type {kind} is not read")

    def _binary(self, path: tuple[int, ...], start: int, variable: bool) -> None:
        text = self.data[start : self.pos]
        if path == _KV_KEY:
            self.keys.append(self.data[self.pos - (len(text) - _varint_size(text)) : self.pos])
        if path == _KV_VALUE and self.keys and self.keys[-1] in self.kept_keys:
            self.steps.append(("binary", _kv_slot(self.keys[-1])))
        elif variable:
            self.steps.append(("binary", None))
        else:
            self._expect(text)


def _varint_size(data: bytes) -> int:
    """Bytes of the varint at the start of `data`."""
    return next(i + 1 for i, byte in enumerate(data) if not byte & 0x80)


def _kv_slot(key: bytes) -> str:
    return f"kv:{key.hex()}"


@dataclass(frozen=True)
class _Column:
    arrow: pa.DataType
    physical: str
    max_rep: int
    max_def: int


@dataclass(frozen=True)
class Template:
    """The layout of the files like the reference, as steps to check and decode them by."""

    schema: pa.Schema
    columns: tuple[_Column, ...]
    pages: tuple[tuple[Step, ...], ...]
    """Per column, the steps of its page header."""
    footer: tuple[Step, ...]
    kept_keys: tuple[bytes, ...]
    """Key-value metadata whose values are returned per file (each file must have them)."""


_WIDTH = {"INT32": 4, "INT64": 8, "FLOAT": 4, "DOUBLE": 8}
_NUMPY = {"INT32": "<i4", "INT64": "<i8", "FLOAT": "<f4", "DOUBLE": "<f8"}


def make_template(data: bytes, schema: pa.Schema, kept_keys: Sequence[bytes]) -> Template:
    """The template of `data`, a file pyarrow reads as `schema` (its metadata aside). Raises
    NoTemplate when its layout is not one this decoder reads."""
    import pyarrow.parquet as pq  # here: a folder of Kineto traces reads no Parquet

    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        metadata = parquet.metadata
    except (pa.ArrowException, OSError) as exc:
        raise NoTemplate(f"not readable: {exc}") from exc
    if metadata.num_row_groups != 1 or metadata.num_columns != len(schema):
        raise NoTemplate("not one row group of the schema's columns")
    columns = tuple(_column(parquet, schema, i) for i in range(len(schema)))
    footer_start = len(data) - 8 - struct.unpack_from("<I", data, len(data) - 8)[0]
    footer = _Tokenizer(
        data, footer_start, _FOOTER_VARIABLE, _FOOTER_VARIABLE_TREES, _FOOTER_SLOTS, kept_keys
    )
    footer.struct(())
    if footer.pos != len(data) - 8 or not set(kept_keys) <= set(footer.keys):
        raise NoTemplate("the footer is not one struct with the metadata kept")
    if any(codec != 0 for codec in footer.seen.get((4, 1, 3, 4), [1])):
        raise NoTemplate("compressed")
    pages = []
    pos = 4
    for _ in columns:
        page = _Tokenizer(data, pos, _PAGE_VARIABLE, _PAGE_VARIABLE_TREES, _PAGE_SLOTS)
        page.struct(())
        seen = {path: values[0] for path, values in page.seen.items()}
        plain = (seen.get((1,)), seen.get((5, 2)), seen.get((5, 3)), seen.get((5, 4))) == (
            _DATA_PAGE,
            _PLAIN,
            _RLE,
            _RLE,
        )
        if not plain or seen.get((2,)) != seen.get((3,)):
            raise NoTemplate("not an uncompressed PLAIN data page (v1)")
        pos = page.pos + seen[(3,)]
        pages.append(page.compiled())
    if pos != footer_start:
        raise NoTemplate("not one data page per column")
    template = Template(schema, columns, tuple(pages), footer.compiled(), tuple(kept_keys))
    # The decoder must read its own reference as pyarrow does, or it reads none of its kind.
    expected = parquet.read(use_threads=False).replace_schema_metadata(None)
    decoded = decode(template, [data])
    if not (decoded.ok.all() and decoded.table.equals(expected)):
        raise NoTemplate("decoded otherwise than by pyarrow")
    return template


def _column(parquet: pq.ParquetFile, schema: pa.Schema, index: int) -> _Column:
    column = parquet.schema.column(index)
    arrow = schema.field(index).type
    physical = column.physical_type
    listed = pa.types.is_list(arrow)
    levels = (column.max_repetition_level, column.max_definition_level)
    if levels not in (((1, 3),) if listed else ((0, 0), (0, 1))):
        raise NoTemplate(f"column {column.path}: levels {levels}")
    item = arrow.value_type if listed else arrow
    numeric = (
        physical in _NUMPY
        and pa.types.is_primitive(item)
        and np.dtype(_NUMPY[physical]) == np.dtype(item.to_pandas_dtype())
    )
    if not numeric and not (physical == "BYTE_ARRAY" and pa.types.is_string(item)):
        raise NoTemplate(f"column {column.path}: {physical} as {arrow}")
    return _Column(arrow, physical, *levels)


# -- lockstep walk ---------------------------------------------------------------------------


class _Buffer:
    """The files of a batch as one byte array, with unaligned 4- and 8-byte views of it (x86 and
    ARM read unaligned words): a token of every file is then one gather of words, not of bytes.
    Positions are clipped into the zero padding, so a damaged offset reads zeros, never
    outside the array (the file is then found not to match)."""

    PAD = 16

    def __init__(self, files: Sequence[bytes]) -> None:
        self.size = sum(len(f) for f in files)
        self.u8: Bytes = np.frombuffer(b"".join([*files, bytes(self.PAD)]), np.uint8)
        self.u32 = np.ndarray((self.size + self.PAD - 3,), "<u4", self.u8, 0, (1,))
        self.u64 = np.ndarray((self.size + self.PAD - 7,), "<u8", self.u8, 0, (1,))

    def at(self, pos: Ints) -> Ints:
        clipped: Ints = np.clip(pos, 0, self.size)
        return clipped

    def word32(self, pos: Ints) -> Ints:
        value: Ints = self.u32[self.at(pos)].astype(np.int64)
        return value

    def spans(self, starts: Ints, sizes: Ints) -> Bytes:
        """The bytes of each span, concatenated."""
        spans: Bytes = self.u8[self.at(np.repeat(starts, sizes) + _ramp(sizes))]
        return spans


_STOP_BITS = np.uint64(0x8080808080808080)
_LOW7 = [np.uint64(0x7F << (7 * j)) for j in range(8)]


def _expect_step(raw: bytes) -> Step:
    """Bytes every file must have, as 8-byte words and the mask of the last one."""
    words = np.frombuffer(raw + bytes(-len(raw) % 8), "<u8")
    masks = np.full(len(words), np.uint64(0xFFFFFFFFFFFFFFFF))
    if len(raw) % 8:
        masks[-1] = np.uint64((1 << (8 * (len(raw) % 8))) - 1)
    return ("expect", (words, masks, len(raw)))


@dataclass
class _Walk:
    """The files of a batch, walked together: each at `pos`, none beyond `limit`."""

    buf: _Buffer
    pos: Ints
    limit: Ints
    ok: Mask
    slots: dict[str, list[Ints]] = field(default_factory=dict)

    def run(self, steps: Sequence[Step]) -> None:
        for kind, arg in steps:
            if kind == "expect":
                assert isinstance(arg, tuple)
                words, masks, size = arg
                index = self.buf.at(self.pos[:, None] + 8 * np.arange(len(words)))
                self.ok &= ((self.buf.u64[index] & masks) == words).all(axis=1)
                self.pos += size
            elif kind == "varint":
                self._keep(arg, _zigzag(self.varint()))
            elif kind == "binary":
                size = self.varint()
                self._keep(arg, self.pos.copy())
                self._keep(f"{arg}:size", size)
                self.pos += size
            else:
                assert isinstance(arg, int)
                self.pos += arg
            self.ok &= (self.pos <= self.limit) & (self.pos >= 0)

    def varint(self) -> Ints:
        """The unsigned varint at each file's position (at most 8 bytes: 56 bits)."""
        word = self.buf.u64[self.buf.at(self.pos)]
        stops = ~word & _STOP_BITS
        self.ok &= stops != 0
        lowest = stops & (~stops + np.uint64(1))  # the stop bit of the varint's last byte
        length = (np.log2(np.maximum(lowest, 1).astype(np.float64)).astype(np.int64) + 1) // 8
        word &= (lowest << np.uint64(1)) - np.uint64(1)
        value = word & _LOW7[0]
        for j in range(1, 8):
            value |= (word >> np.uint64(j)) & _LOW7[j]
        self.pos += np.maximum(length, 1)
        decoded: Ints = value.astype(np.int64)
        return decoded

    def _keep(self, slot: object, value: Ints) -> None:
        if isinstance(slot, str):
            self.slots.setdefault(slot, []).append(value)


def _zigzag(value: Ints) -> Ints:
    decoded: Ints = (value >> 1) ^ -(value & 1)
    return decoded


def _ramp(counts: Ints) -> Ints:
    """0 … c−1 for each count c, concatenated."""
    starts = np.cumsum(counts) - counts
    ramp: Ints = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)
    return ramp


def _magic(buf: _Buffer, pos: Ints) -> Mask:
    found: Mask = buf.u32[buf.at(pos)] == np.frombuffer(MAGIC, "<u4")[0]
    return found


# -- decoding --------------------------------------------------------------------------------


@dataclass
class Decoded:
    """A batch as decoded: which files, their rows, their metadata values."""

    ok: Mask
    """Per file: decoded here (else the caller reads it with pyarrow)."""
    table: pa.Table
    """The rows of the decoded files, in file order."""
    rows: Ints
    """Rows per file (0 for the others)."""
    values: dict[bytes, list[bytes | None]]
    """Per kept metadata key, its value in each file (None for the others)."""


@dataclass
class _Pages:
    """Where each column's page data is in every file, as the walk found it."""

    ok: Mask
    starts: list[Ints]
    ends: list[Ints]
    counts: list[Ints]
    rows: Ints
    values: dict[bytes, tuple[Ints, Ints]]


def decode(template: Template, files: Sequence[bytes]) -> Decoded:
    """Decode `files` (each a whole Parquet file) laid out as the template's reference."""
    n = len(files)
    sizes = np.fromiter((len(f) for f in files), np.int64, n)
    if not n or not sizes.sum():
        return _nothing(template, n)
    buf = _Buffer(files)
    starts = np.cumsum(sizes) - sizes
    pages = _walk(template, buf, starts, starts + sizes)
    ok = pages.ok
    for _ in range(len(template.columns) + 2):  # each pass can only drop files
        arrays, good = _columns(template, buf, pages, ok)
        if good.all():
            break
        ok = _scatter(good, ok)
    else:
        ok = np.zeros(n, bool)
    if not ok.any():
        return _nothing(template, n)
    view = memoryview(buf.u8.data)
    values = {}
    for key, (value_starts, value_sizes) in pages.values.items():
        values[key] = [
            bytes(view[s : s + z]) if good else None
            for s, z, good in zip(value_starts.tolist(), value_sizes.tolist(), ok, strict=True)
        ]
    return Decoded(
        ok=ok,
        table=pa.Table.from_arrays(arrays, schema=template.schema),
        rows=np.where(ok, pages.rows, 0),
        values=values,
    )


def _scatter(good: Mask, ok: Mask) -> Mask:
    """`good` (one value per ok file) as one value per file."""
    full = np.zeros(len(ok), bool)
    full[ok] = good
    return full


def _nothing(template: Template, n: int) -> Decoded:
    return Decoded(
        ok=np.zeros(n, bool),
        table=template.schema.empty_table(),
        rows=np.zeros(n, np.int64),
        values={key: [None] * n for key in template.kept_keys},
    )


def _walk(template: Template, buf: _Buffer, starts: Ints, ends: Ints) -> _Pages:
    """Every file's page headers and footer against the template's."""
    ok = ends - starts >= 12
    footer_start = ends - 8 - buf.word32(ends - 8)
    ok &= (footer_start >= starts + 4) & _magic(buf, starts) & _magic(buf, ends - 4)
    walk = _Walk(buf, starts + 4, footer_start.copy(), ok)
    page_offsets, data_starts, data_ends, counts = [], [], [], []
    most = (ends - starts) * VALUES_PER_BYTE + 1024
    for steps in template.pages:
        page_offsets.append(walk.pos - starts)
        walk.slots = {}
        walk.run(steps)
        size = walk.slots["compressed"][0]
        count = walk.slots["values"][0]
        walk.ok &= (size == walk.slots["uncompressed"][0]) & (count >= 0) & (count <= most)
        data_starts.append(walk.pos.copy())
        walk.pos = walk.pos + size
        data_ends.append(walk.pos.copy())
        counts.append(count)
        walk.ok &= walk.pos <= walk.limit
    walk.ok &= walk.pos == footer_start
    walk.pos, walk.limit, walk.slots = footer_start.copy(), ends - 8, {}
    walk.run(template.footer)
    ok = walk.ok & (walk.pos == ends - 8)
    # What pyarrow reads a column chunk by must agree with the pages found: a reader that
    # trusts the footer would read other bytes than the decoder did.
    slots = walk.slots
    rows = slots["num_rows"][0]
    total = np.zeros(len(starts), np.int64)
    for i, count in enumerate(counts):
        chunk = data_ends[i] - starts - page_offsets[i]
        total += chunk
        ok &= (slots["num_values"][i] == count) & (slots["page_offset"][i] == page_offsets[i])
        ok &= (slots["chunk_compressed"][i] == chunk) & (slots["chunk_uncompressed"][i] == chunk)
    ok &= (slots["group_rows"][0] == rows) & (slots["group_bytes"][0] == total)
    ok &= slots["group_compressed"][0] == total
    values = {
        key: (walk.slots[_kv_slot(key)][0], walk.slots[f"{_kv_slot(key)}:size"][0])
        for key in template.kept_keys
    }
    return _Pages(ok, data_starts, data_ends, counts, rows, values)


def _columns(
    template: Template, buf: _Buffer, pages: _Pages, ok: Mask
) -> tuple[list[pa.Array], Mask]:
    """Every column of the ok files; which of them decoded (one value per ok file)."""
    keep = np.flatnonzero(ok)
    arrays: list[pa.Array] = []
    good = np.ones(len(keep), bool)
    for i, column in enumerate(template.columns):
        array, fine = _column_of(
            buf,
            column,
            pages.starts[i][keep],
            pages.ends[i][keep],
            pages.counts[i][keep],
            pages.rows[keep],
        )
        good &= fine
        arrays.append(array)
    return arrays, good


def _column_of(
    buf: _Buffer, column: _Column, start: Ints, end: Ints, count: Ints, rows: Ints
) -> tuple[pa.Array, Mask]:
    """One column of the files: its array (when every file decoded), which files decoded."""
    good = np.ones(len(start), bool)
    pos = start
    rep: Bytes | None = None
    if column.max_rep:
        rep, pos = _levels(buf, pos, end, count, column.max_rep, good)
    if column.max_def:
        levels, pos = _levels(buf, pos, end, count, column.max_def, good)
    else:
        levels = np.zeros(int(count.sum()), np.uint8)
    files = np.repeat(np.arange(len(start)), count)
    present = levels == column.max_def
    n_present = np.bincount(files[present], minlength=len(start)).astype(np.int64)
    if rep is not None:
        good &= np.bincount(files[rep == 0], minlength=len(start)) == rows
        # Each file's first entry begins a list; an entry continuing a list is an item.
        firsts = (np.cumsum(count) - count)[count > 0]
        good[np.flatnonzero(count > 0)[rep[firsts] != 0]] = False
        good &= np.bincount(files[(rep == 1) & (levels < 2)], minlength=len(start)) == 0
    else:
        good &= count == rows
    values = _plain(buf, column, pos, end, n_present, good)
    if not good.all():
        return pa.nulls(0, column.arrow), good
    try:
        if rep is not None:
            return _list_array(column, rep, levels, values), good
        return _flat_array(column, values, present), good
    except pa.ArrowInvalid:  # a string that is not UTF-8: find whose
        return pa.nulls(0, column.arrow), good & _utf8_files(values, present, files, len(start))


def _levels(
    buf: _Buffer, pos: Ints, end: Ints, count: Ints, max_level: int, good: Mask
) -> tuple[Bytes, Ints]:
    """The levels of a data page v1 (a 4-byte length, then the RLE / bit-packed hybrid) of
    every file, concatenated; and where they end. Clears `good` for files that do not decode."""
    start = pos + 4
    stop = start + buf.word32(pos)
    good &= stop <= end
    width = max_level.bit_length()
    out = np.zeros(int(count.sum()), np.uint8)
    base = np.cumsum(count) - count
    done = np.zeros(len(pos), np.int64)
    at = start.copy()
    for _ in range(MAX_LEVEL_RUNS):  # one run of every file at a time: most have one run
        active = np.flatnonzero(good & (done < count))
        if not len(active):
            break
        walk = _Walk(buf, at[active], stop[active], np.ones(len(active), bool))
        header = walk.varint()
        packed = (header & 1).astype(bool)
        groups = header >> 1
        run = np.where(packed, groups * 8, groups)
        after = walk.pos + np.where(packed, groups * width, 1)
        value = buf.u8[buf.at(walk.pos)]
        bad = ~walk.ok | (groups <= 0) | (groups > 1 << 31) | (after > stop[active])
        bad |= ~packed & (value > max_level)
        good[active[bad]] = False
        take = np.where(bad, 0, np.minimum(run, count[active] - done[active]))
        first = base[active] + done[active]
        _fill_rle(out, first[~packed], take[~packed], value[~packed])
        _fill_packed(out, buf, first[packed], take[packed], walk.pos[packed], width)
        done[active] += take
        at[active] = after
    good &= (done == count) & (at == stop)
    files = np.repeat(np.arange(len(pos)), count)
    good &= np.bincount(files[out > max_level], minlength=len(pos)) == 0
    return out, stop


def _fill_rle(out: Bytes, first: Ints, take: Ints, value: Bytes) -> None:
    if len(take) and (take == take[0]).all() and (np.diff(first) == take[0]).all():
        out[first[0] : first[0] + take[0] * len(take)] = np.repeat(value, take[0])
        return  # every file's levels in one run: the common case
    out[np.repeat(first, take) + _ramp(take)] = np.repeat(value, take)


def _fill_packed(out: Bytes, buf: _Buffer, first: Ints, take: Ints, data: Ints, width: int) -> None:
    """Bit-packed levels: `width` bits each, least significant bit first."""
    if not len(take):
        return
    k = _ramp(take)
    bit = k * width
    pair = buf.u32[buf.at(np.repeat(data, take) + bit // 8)].astype(np.int64)
    out[np.repeat(first, take) + k] = (pair >> (bit % 8)) & ((1 << width) - 1)


Plain = tuple[Ints, Bytes] | np.ndarray
"""A column's present values: a numpy array, or strings as (offsets, bytes)."""


def _plain(
    buf: _Buffer, column: _Column, pos: Ints, end: Ints, n_present: Ints, good: Mask
) -> Plain:
    """The PLAIN values of every file, concatenated. Clears `good` for files that do not fit."""
    if column.physical in _WIDTH:
        width = _WIDTH[column.physical]
        good &= end - pos == n_present * width
        n_present = np.where(good, n_present, 0)
        index = buf.at(np.repeat(pos, n_present) + width * _ramp(n_present))
        words = buf.u64[index] if width == 8 else buf.u32[index]
        values: np.ndarray = words.view(_NUMPY[column.physical])
        return values
    good &= n_present <= MAX_STRINGS
    n_present = np.where(good, n_present, 0)
    at = pos.copy()
    total = int(n_present.sum())
    starts = np.zeros(total, np.int64)
    sizes = np.zeros(total, np.int64)
    base = np.cumsum(n_present) - n_present
    for j in range(int(n_present.max(initial=0))):  # a 4-byte length before each string
        active = np.flatnonzero(good & (n_present > j))
        size = buf.word32(at[active])
        starts[base[active] + j] = at[active] + 4
        sizes[base[active] + j] = size
        at[active] += 4 + size
        good[active[at[active] > end[active]]] = False
    good &= at == end
    files = np.repeat(np.arange(len(pos)), n_present)
    sizes = np.where(good[files], sizes, 0)
    offsets = np.zeros(total + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets, buf.spans(starts, sizes)


def _validity(present: Mask) -> pa.Buffer | None:
    if present.all():
        return None
    return pa.py_buffer(np.packbits(present, bitorder="little"))


def _flat_array(column: _Column, values: Plain, present: Mask) -> pa.Array:
    """The present values spread over the rows, nulls elsewhere (ArrowInvalid: not UTF-8)."""
    n = len(present)
    nulls = n - int(present.sum())
    if isinstance(values, tuple):
        offsets, data = values
        full = np.zeros(n + 1, np.int64)
        full[1:][present] = np.diff(offsets)
        np.cumsum(full, out=full)
        strings = pa.Array.from_buffers(
            pa.large_string(),
            n,
            [_validity(present), pa.py_buffer(full), pa.py_buffer(data)],
            null_count=nulls,
        )
        strings.validate(full=True)  # UTF-8
        return strings.cast(column.arrow)
    spread = np.zeros(n, values.dtype)
    spread[present] = values
    return pa.Array.from_buffers(
        column.arrow, n, [_validity(present), pa.py_buffer(spread)], null_count=nulls
    )


def _list_array(column: _Column, rep: Bytes, levels: Bytes, values: Plain) -> pa.Array:
    """A list column from its levels: a list begins at each repetition level 0; definition
    level 0 is a null list, 1 an empty one, 2 a null item, 3 a value."""
    begins = rep == 0
    item = levels >= 2
    n_lists = int(begins.sum())
    which = np.cumsum(begins) - 1
    offsets = np.zeros(n_lists + 1, np.int32)
    np.cumsum(np.bincount(which[item], minlength=n_lists), out=offsets[1:])
    valid = levels[begins] != 0
    inner_column = _Column(column.arrow.value_type, column.physical, 0, 1)
    inner = _flat_array(inner_column, values, levels[item] == 3)
    return pa.Array.from_buffers(
        column.arrow,
        n_lists,
        [_validity(valid), pa.py_buffer(offsets)],
        null_count=n_lists - int(valid.sum()),
        children=[inner],
    )


def _utf8_files(values: Plain, present: Mask, files: Ints, n: int) -> Mask:
    """Per file: whether its strings are all UTF-8 (after the check of all of them failed)."""
    assert isinstance(values, tuple)
    offsets, data = values
    fine = np.ones(n, bool)
    for owner, first, last in zip(files[present].tolist(), offsets[:-1], offsets[1:], strict=True):
        try:
            data[first:last].tobytes().decode("utf-8")
        except UnicodeDecodeError:
            fine[owner] = False
    return fine
