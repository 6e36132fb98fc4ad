"""Reading every worker's files of a capture in bulk (docs/design.md §3 layout).

A capture can hold 100,000 workers. Per worker, the only work left in Python is fetching its
files and handing the Parquet bytes to Arrow, done in batches on a pool as wide as the storage
says reads are worth having in flight: threads for S3 (many: its GETs wait on the network),
processes for a large local folder (one per core: its reads are CPU work, and decoding a
Parquet file holds the GIL, so a second thread adds nothing). Each batch comes back as one
table. Everything else is done once for all
workers: the WorkerMeta and status.json documents are validated by one pydantic call each, the
summaries concatenated into one table whose rank column comes from the keys. A worker whose file
fails a check goes through the one-file path (`read_summary_file`), which names the problem.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import TypeAdapter, ValidationError

from perfdiag.analyzer.errors import CaptureError
from perfdiag.api.limits import world_size_problem
from perfdiag.api.schema import (
    META_SCHEMA,
    META_WORKER,
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_ID,
    WorkerMeta,
    read_meta,
)
from perfdiag.api.validation import validation_problems
from perfdiag.api.worker import WorkerStatus
from perfdiag.engine.process_pool import ProcessPoolError, map_in_processes
from perfdiag.storage import Storage, StorageError, StorageNotFound, layout

BATCH_WORKERS = 256
"""Workers per thread-pool task: one future per worker cost more than its Parquet decode."""
PROCESS_MIN_WORKERS = 8192
"""Fewer workers are read on threads: a spawned process takes ~1 s to import its modules."""
PROCESS_BATCH_WORKERS = 2048
"""Workers per process-pool task (one packed table each way)."""
PROGRESS_EVERY_S = 1.0

_METAS = TypeAdapter(list[WorkerMeta])
_STATUSES = TypeAdapter(list[WorkerStatus])
_SUMMARY_ID = SUMMARY_SCHEMA_ID.encode()

T = TypeVar("T")


@dataclass
class WorkerFiles:
    """What the capture's workers left, read and checked."""

    summary: pa.Table
    metas: dict[int, WorkerMeta] = field(default_factory=dict)
    statuses: dict[int, WorkerStatus] = field(default_factory=dict)
    stacks: dict[int, Any] = field(default_factory=dict)
    flight_recorders: dict[int, bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)


@dataclass
class _Fetched:
    """One batch of workers as fetched by a pool thread or process, not yet validated."""

    ranks: list[int] = field(default_factory=list)  # the workers with a summary, in order
    tables: list[pa.Table] = field(default_factory=list)  # theirs, until packed
    meta_json: list[bytes] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)
    status_json: dict[int, bytes] = field(default_factory=dict)
    stacks: dict[int, Any] = field(default_factory=dict)
    flight_recorders: dict[int, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # files not used, and why
    # Packed: the summaries of SUMMARY_SCHEMA as one table (rows per rank, 0 for the others),
    # the others (older engines' extra columns) apart. One table per batch, not one per
    # worker: 100,000 small tables cost more than their rows, and cross a process cheaply.
    summary: pa.Table | None = None
    rows: list[int] = field(default_factory=list)
    odd: dict[int, pa.Table] = field(default_factory=dict)

    def pack(self) -> _Fetched:
        standard = [t.schema.equals(SUMMARY_SCHEMA) for t in self.tables]
        self.rows = [
            t.num_rows if same else 0 for t, same in zip(self.tables, standard, strict=True)
        ]
        self.summary = (
            pa.concat_tables(
                [t for t, same in zip(self.tables, standard, strict=True) if same],
            ).combine_chunks()
            if any(standard)
            else empty_summary()
        )
        self.odd = {
            r: t for r, t, same in zip(self.ranks, self.tables, standard, strict=True) if not same
        }
        self.tables = []
        return self


def read_worker_files(
    storage: Storage, by_rank: dict[int, set[str]], say: Callable[[str], None]
) -> WorkerFiles:
    """Read summary.parquet, status.json, stacks.json and flight_recorder.pkl of every rank in
    `by_rank` (rank → the file names listed under workers/<rank>/)."""
    summary_ranks = [r for r in sorted(by_rank) if layout.SUMMARY in by_rank[r]]
    say(f"loading {len(summary_ranks)} worker summaries from {storage.uri}")
    ranks = sorted(by_rank)
    fetched: list[_Fetched] = []
    loaded = 0
    last_report = time.monotonic()
    for batch in _fetch_all(storage, ranks, by_rank):
        fetched.append(batch)
        loaded += len(batch.ranks)
        now = time.monotonic()
        if now - last_report >= PROGRESS_EVERY_S:
            say(f"loaded {loaded}/{len(summary_ranks)} workers")
            last_report = now
    files = _validate(storage, fetched)
    if summary_ranks:
        say(f"loaded {len(files.metas)}/{len(summary_ranks)} workers")
    return files


def _fetch_all(
    storage: Storage, ranks: list[int], by_rank: dict[int, set[str]]
) -> Iterator[_Fetched]:
    """The workers' files in batches, in rank order: on a pool of processes where reading is
    CPU work (Parquet decoding holds the GIL: threads beyond one add nothing) and the capture
    is large enough to pay for starting them, else on threads."""
    width = storage.read_concurrency
    done = 0
    if storage.reads_are_cpu_work and width > 1 and len(ranks) >= PROCESS_MIN_WORKERS:
        size = PROCESS_BATCH_WORKERS
        tasks = [
            (storage, part, {r: by_rank[r] for r in part})
            for part in (ranks[i : i + size] for i in range(0, len(ranks), size))
        ]
        try:
            for index, batch in enumerate(map_in_processes(_fetch_task, tasks, width)):
                done += len(tasks[index][1])
                yield batch
            return
        except ProcessPoolError:
            pass  # go on in threads: slower, and it says why if a file is at fault
    rest = ranks[done:]
    batches = [rest[i : i + BATCH_WORKERS] for i in range(0, len(rest), BATCH_WORKERS)]
    with ThreadPoolExecutor(max_workers=max(1, min(width, len(batches)))) as pool:
        yield from pool.map(lambda b: _fetch_batch(storage, b, by_rank).pack(), batches)


def _fetch_task(task: tuple[Storage, list[int], dict[int, set[str]]]) -> _Fetched:
    storage, ranks, by_rank = task
    return _fetch_batch(storage, ranks, by_rank).pack()


def read_summary_file(storage: Storage, rank: int, data: bytes) -> tuple[pa.Table, WorkerMeta]:
    """One worker's summary.parquet, every check made, each failure named (CaptureError)."""
    origin = storage.uri_of(layout.worker_key(rank, layout.SUMMARY))
    table = _decode(origin, data)
    try:
        meta = read_meta(table.schema, SUMMARY_SCHEMA_ID)
    except (ValueError, ValidationError, KeyError) as exc:
        raise CaptureError(f"{origin}: {exc}") from exc
    _check_meta(origin, rank, meta)
    table = normalize_summary(table, origin)
    # The key is authoritative for the rank column too (one file = one worker).
    return table.set_column(0, "rank", pa.array([rank] * table.num_rows, pa.int32())), meta


def normalize_summary(table: pa.Table, origin: str) -> pa.Table:
    """The columns of SUMMARY_SCHEMA, in order and type, without file metadata.

    Columns added later by the engine (nullable by the version rule) are dropped here.
    """
    missing = [name for name in SUMMARY_SCHEMA.names if name not in table.column_names]
    if missing:
        raise CaptureError(f"{origin}: summary lacks column(s) {', '.join(missing)}")
    try:
        return table.select(SUMMARY_SCHEMA.names).cast(SUMMARY_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise CaptureError(f"{origin}: summary columns have unexpected types: {exc}") from exc


def empty_summary() -> pa.Table:
    return SUMMARY_SCHEMA.empty_table()


def _decode(origin: str, data: bytes) -> pa.Table:
    import pyarrow.parquet as pq  # here: a folder of Kineto traces reads no Parquet

    try:
        # A worker's summary is a few KB: decoded on this thread, Arrow's pool would cost more.
        return pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CaptureError(f"{origin}: not a readable Parquet file: {exc}") from exc


def _check_meta(origin: str, rank: int, meta: WorkerMeta) -> None:
    if meta.rank != rank:
        raise CaptureError(f"{origin}: file says rank {meta.rank}, its key says rank {rank}")
    if meta.world_size is not None:
        problem = world_size_problem(meta.world_size)
        if problem is not None:
            raise CaptureError(f"{origin}: {problem}")
    if not meta.window.step_bounds_ns:
        raise CaptureError(f"{origin}: the window has no steps")


def _fetch_batch(storage: Storage, ranks: Sequence[int], by_rank: dict[int, set[str]]) -> _Fetched:
    out = _Fetched()
    for rank in ranks:
        names = by_rank[rank]
        if layout.SUMMARY in names:
            _fetch_summary(storage, rank, out)
        status = _get(storage, rank, layout.STATUS, names, out)
        if status is not None:
            out.status_json[rank] = status
        stack = _get(storage, rank, layout.STACKS, names, out)
        if stack is not None:
            try:
                out.stacks[rank] = json.loads(stack)
            except (ValueError, RecursionError) as exc:
                origin = storage.uri_of(layout.worker_key(rank, layout.STACKS))
                out.problems.append(f"ignored {origin}: not readable JSON ({_json_problem(exc)})")
        recorded = _get(storage, rank, layout.FLIGHT_RECORDER, names, out)
        if recorded is not None:
            out.flight_recorders[rank] = recorded
    return out


def _fetch_summary(storage: Storage, rank: int, out: _Fetched) -> None:
    origin = storage.uri_of(layout.worker_key(rank, layout.SUMMARY))
    try:
        data = storage.get_bytes(layout.worker_key(rank, layout.SUMMARY))
    except StorageNotFound:
        return  # listed, then gone: like a worker that never wrote one
    except StorageError as exc:  # a FIFO, a device, a folder, no permission
        out.unreadable[rank] = f"{origin}: {exc}"
        return
    try:
        table = _decode(origin, data)
    except CaptureError as exc:
        # One bad file must not sink the diagnosis of all the others.
        out.unreadable[rank] = str(exc)
        return
    meta = table.schema.metadata or {}
    if meta.get(META_SCHEMA) != _SUMMARY_ID or META_WORKER not in meta:
        _fetch_one_by_one(storage, rank, data, out)
        return
    out.ranks.append(rank)
    out.tables.append(table.replace_schema_metadata(None))
    out.meta_json.append(meta[META_WORKER])


def _fetch_one_by_one(storage: Storage, rank: int, data: bytes, out: _Fetched) -> None:
    """The path that names what is wrong with an odd file (or reads one that is only odd)."""
    try:
        table, meta = read_summary_file(storage, rank, data)
    except CaptureError as exc:
        out.unreadable[rank] = str(exc)
        return
    out.ranks.append(rank)
    out.tables.append(table)
    out.meta_json.append(meta.model_dump_json().encode())


def _get(storage: Storage, rank: int, name: str, names: set[str], out: _Fetched) -> bytes | None:
    if name not in names:
        return None
    try:
        return storage.get_bytes(layout.worker_key(rank, name))
    except StorageNotFound:
        return None
    except StorageError as exc:  # a FIFO, a device, a folder, no permission: say so, go on
        out.problems.append(f"ignored {storage.uri_of(layout.worker_key(rank, name))}: {exc}")
        return None


def _json_problem(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at byte {exc.pos}"
    return str(exc)


def _validate(storage: Storage, fetched: list[_Fetched]) -> WorkerFiles:
    ranks = [r for batch in fetched for r in batch.ranks]
    unreadable = {r: why for batch in fetched for r, why in batch.unreadable.items()}
    metas = _validate_metas(
        storage, ranks, [m for batch in fetched for m in batch.meta_json], unreadable
    )
    parts: list[pa.Table] = []
    for batch in fetched:
        kept = np.fromiter((r in metas for r in batch.ranks), bool, len(batch.ranks))
        rows = np.asarray(batch.rows, np.int64)
        assert batch.summary is not None, "batches are packed where they are fetched"
        # The key is authoritative for the rank column (one file = one worker).
        rank_column = np.repeat(np.asarray(batch.ranks, np.int32)[kept], rows[kept])
        table = batch.summary.filter(pa.array(np.repeat(kept, rows)))
        parts.append(table.set_column(0, "rank", pa.array(rank_column, pa.int32())))
        for rank, odd in batch.odd.items():
            if rank not in metas:
                continue
            origin = storage.uri_of(layout.worker_key(rank, layout.SUMMARY))
            try:
                table = normalize_summary(odd, origin)
            except CaptureError as exc:
                unreadable[rank] = str(exc)
                del metas[rank]
                continue
            column = pa.array(np.full(table.num_rows, rank, np.int32))
            parts.append(table.set_column(0, "rank", column))
    statuses, notes = _validate_statuses(
        storage, {r: s for batch in fetched for r, s in batch.status_json.items()}
    )
    notes = [p for batch in fetched for p in batch.problems] + notes
    return WorkerFiles(
        summary=_concat(parts, in_order=not any(batch.odd for batch in fetched)),
        metas=dict(sorted(metas.items())),
        statuses=statuses,
        stacks={r: s for batch in fetched for r, s in batch.stacks.items()},
        flight_recorders={r: b for batch in fetched for r, b in batch.flight_recorders.items()},
        notes=notes,
        unreadable=dict(sorted(unreadable.items())),
    )


def _validate_metas(
    storage: Storage, ranks: list[int], documents: list[bytes], unreadable: dict[int, str]
) -> dict[int, WorkerMeta]:
    """All WorkerMeta documents by one pydantic call; a document that fails goes through
    read_meta's path again, so its message is the one a single file gets."""
    parsed = _validate_all(_METAS, documents)
    metas: dict[int, WorkerMeta] = {}
    for rank, document, meta in zip(ranks, documents, parsed, strict=True):
        origin = storage.uri_of(layout.worker_key(rank, layout.SUMMARY))
        try:
            checked = meta or WorkerMeta.model_validate(json.loads(document))
            _check_meta(origin, rank, checked)
        except CaptureError as exc:
            unreadable[rank] = str(exc)
            continue
        except (ValueError, ValidationError, RecursionError) as exc:
            unreadable[rank] = (
                f"{origin}: {_json_problem(exc) if isinstance(exc, RecursionError) else exc}"
            )
            continue
        metas[rank] = checked
    return metas


def _validate_statuses(
    storage: Storage, documents: dict[int, bytes]
) -> tuple[dict[int, WorkerStatus], list[str]]:
    """All status.json documents by one pydantic call. One that fails is read again on its
    own and ignored (as a missing status), with a note that says why."""
    ranks = sorted(documents)
    texts = [documents[r] for r in ranks]
    statuses: dict[int, WorkerStatus] = {}
    notes: list[str] = []
    validated: list[WorkerStatus | None] = _validate_all(_STATUSES, texts)
    for rank, text, status in zip(ranks, texts, validated, strict=True):
        if status is not None:
            statuses[rank] = status
            continue
        try:
            document = json.loads(text)
        except (ValueError, RecursionError) as exc:
            origin = storage.uri_of(layout.worker_key(rank, layout.STATUS))
            notes.append(
                f"ignored unreadable status of rank {rank}: {origin} is not readable JSON "
                f"({_json_problem(exc)})"
            )
            continue
        try:
            statuses[rank] = WorkerStatus.model_validate(document)
        except ValidationError as exc:
            notes.append(
                f"ignored unreadable status of rank {rank}: {validation_problems(exc, limit=1)}"
            )
    return statuses, notes


def _validate_all(adapter: TypeAdapter[list[T]], documents: Sequence[bytes]) -> list[T | None]:
    """Validate JSON documents as one array; None for each document that fails (the caller
    reads those one by one). When the array does not even parse (a document is not JSON),
    the documents are tried in halves, so one bad file costs log(n) calls, not n."""
    if not documents:
        return []
    try:
        parsed_all: list[T | None] = list(adapter.validate_json(b"[" + b",".join(documents) + b"]"))
    except ValidationError as exc:
        errors = exc.errors()
    else:
        if len(parsed_all) == len(documents):
            return parsed_all
        # An empty document, or one like `{},{}`, shifted the items: tell them apart below.
        errors = []
    if errors and all(e["loc"] and isinstance(e["loc"][0], int) for e in errors):
        # Every error is inside an item: validate the others again without them.
        failed = {int(e["loc"][0]) for e in errors}
        good = [i for i in range(len(documents)) if i not in failed]
        parsed: list[T | None] = [None] * len(documents)
        again = _validate_all(adapter, [documents[i] for i in good])
        for i, value in zip(good, again, strict=True):
            parsed[i] = value
        return parsed
    if len(documents) == 1:
        return [None]
    half = len(documents) // 2
    return _validate_all(adapter, documents[:half]) + _validate_all(adapter, documents[half:])


def _concat(parts: list[pa.Table], *, in_order: bool) -> pa.Table:
    """The workers' summaries as one table in rank order (batches come in rank order; a
    worker read apart, with an odd file, is sorted in)."""
    if not parts:
        return empty_summary()
    summary = pa.concat_tables(parts).combine_chunks()
    if in_order:
        return summary
    return summary.take(pc.sort_indices(summary["rank"]))
