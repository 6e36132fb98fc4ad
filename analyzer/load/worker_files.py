"""Reading every worker's files of a capture in bulk (docs/design.md §3 layout, §5 scale).

A capture can hold 1,000,000 workers. Per worker, the only work left in Python is fetching its
files; everything else is done for a batch of workers at once, on a pool as wide as the storage
says reads are worth having in flight: threads for S3 (many: its GETs wait on the network),
processes for a large local folder (one per core: reading page-cached files is CPU work, which
holds the GIL). In each batch the summaries are decoded together (analyzer/load/parquet_batch.py;
a file that does not have the common layout is read by pyarrow), the WorkerMeta and status.json
documents validated by one pydantic call each, and what the analysis reads of them kept as
columns (analyzer/load/worker_table.py). Each batch comes back as one table and a few arrays.
A worker whose file fails a check goes through the one-file path (`read_summary_file`), which
names the problem.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from pydantic import TypeAdapter, ValidationError

from perfdiag.analyzer.errors import CaptureError
from perfdiag.analyzer.load import parquet_batch
from perfdiag.analyzer.load.listing import UNLISTED, WorkerListing, bit, mask_of, merge_listings
from perfdiag.analyzer.load.worker_table import (
    MetaColumns,
    StatusColumns,
    WorkerMetas,
    WorkerStatuses,
)
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

BATCH_WORKERS = 1024
"""Workers per thread-pool task: the batch decoder's cost is mostly per batch."""
PROCESS_MIN_WORKERS = 8192
"""Fewer workers are read on threads: a spawned process takes ~1 s to import its modules."""
PROCESS_BATCH_WORKERS = 8192
"""Workers per process-pool task (one packed table each way)."""
PROGRESS_EVERY_S = 5.0
"""A count of the workers read at most this often: 1,000,000 workers take minutes, and the
terminal (or the analyzer Job's log) should stay a screenful."""
MAX_TEMPLATES = 4
"""Layouts of summary files a process keeps (writers of several versions in one capture)."""
TEMPLATE_TRIES = 2
"""Files of a batch tried as the reference of a new layout before pyarrow reads the rest."""

_METAS = TypeAdapter(list[WorkerMeta])
_STATUSES = TypeAdapter(list[WorkerStatus])
_SUMMARY_ID = SUMMARY_SCHEMA_ID.encode()
_KEPT_KEYS = (META_SCHEMA, META_WORKER)
_TEMPLATES: list[parquet_batch.Template] = []

T = TypeVar("T")


@dataclass
class LoadTimes:
    """Seconds spent per stage of the reading (wall, and CPU of the thread doing it), summed
    over the pool's threads or processes."""

    fetching: float = 0.0
    decoding: float = 0.0
    checking: float = 0.0
    fetching_cpu: float = 0.0
    decoding_cpu: float = 0.0
    checking_cpu: float = 0.0

    def add(self, other: LoadTimes) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)

    def describe(self) -> str:
        return ", ".join(
            f"{stage} {getattr(self, stage):.1f} s (CPU {getattr(self, stage + '_cpu'):.1f} s)"
            for stage in ("fetching", "decoding", "checking")
        )


class _Clock:
    """Wall and thread CPU time since the last lap."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def lap(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        lap = (wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return lap


@dataclass
class WorkerFiles:
    """What the capture's workers left, read and checked."""

    listing: WorkerListing
    """The listing, with the files of the folders listed where they were read."""
    summary: pa.Table
    metas: WorkerMetas
    statuses: WorkerStatuses
    stacks: dict[int, Any] = field(default_factory=dict)
    flight_recorders: dict[int, bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)
    times: LoadTimes = field(default_factory=LoadTimes)


@dataclass
class _Batch:
    """One batch of workers, read and checked by a pool thread or process."""

    ranks: np.ndarray
    """The batch's workers."""
    files: np.ndarray
    """Their file bits (analyzer/load/listing.py), as found."""
    summary: pa.Table
    """The summaries of the workers in `metas`, in rank order, rank column from the keys."""
    metas: MetaColumns
    statuses: StatusColumns
    unreadable: dict[int, str] = field(default_factory=dict)
    stacks: dict[int, Any] = field(default_factory=dict)
    flight_recorders: dict[int, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # files not used, and why
    times: LoadTimes = field(default_factory=LoadTimes)


@dataclass
class _Raw:
    """The bytes of a batch's files, as fetched."""

    files: list[int] = field(default_factory=list)
    summaries: list[tuple[int, bytes]] = field(default_factory=list)
    statuses: list[tuple[int, bytes]] = field(default_factory=list)
    unreadable: dict[int, str] = field(default_factory=dict)
    stacks: dict[int, Any] = field(default_factory=dict)
    flight_recorders: dict[int, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def read_worker_files(
    storage: Storage,
    listing: WorkerListing | Iterable[WorkerListing],
    say: Callable[[str], None],
) -> WorkerFiles:
    """Read summary.parquet, status.json, stacks.json and flight_recorder.pkl of every worker
    of `listing`, or of its parts as they come (the workers of a part are read while the next
    part is listed)."""
    started = time.monotonic()
    parts: list[WorkerListing] = []
    of = ""  # "/N" where the number of workers is known before they are read
    if isinstance(listing, WorkerListing):
        parts.append(listing)
        listed = not (listing.files & UNLISTED).any()
        expected = int(listing.has(layout.SUMMARY).sum()) if listed else len(listing)
        of = f"/{expected}"
        say(f"loading {expected} worker summaries from {storage.uri}")
        fetched = _fetch_all(storage, listing)
        pool = _pool_words(storage, listing)
    else:
        say(f"loading the workers' files from {storage.uri} as they are listed")
        fetched = _fetch_parts(storage, listing, parts)
        pool = f"{_thread_width(storage)} threads"
    batches: list[_Batch] = []
    loaded = 0
    last_report = started
    for batch in fetched:
        batches.append(batch)
        loaded += len(batch.metas.ranks) + len(batch.unreadable)
        now = time.monotonic()
        if now - last_report >= PROGRESS_EVERY_S:
            say(f"loaded {loaded}{of} workers")
            last_report = now
    files = _join(merge_listings(parts, parts[0].folder_uri if parts else ""), batches)
    expected = int(files.listing.has(layout.SUMMARY).sum())
    if expected:
        say(f"loaded {len(files.metas)}/{expected} workers")
        say(
            f"read the workers' files in {time.monotonic() - started:.1f} s: "
            f"{files.times.describe()}, summed over {pool}"
        )
    return files


def _fetch_parts(
    storage: Storage, parts: Iterable[WorkerListing], seen: list[WorkerListing]
) -> Iterator[_Batch]:
    """The workers' files in batches of the parts of a listing, read on threads as the parts
    come (each part kept in `seen`)."""

    def groups() -> Iterator[tuple[list[int], list[int]]]:
        ranks: list[int] = []
        files: list[int] = []
        for part in parts:
            seen.append(part)
            ranks += part.ranks.tolist()
            files += part.files.tolist()
            while len(ranks) >= BATCH_WORKERS:
                yield ranks[:BATCH_WORKERS], files[:BATCH_WORKERS]
                ranks, files = ranks[BATCH_WORKERS:], files[BATCH_WORKERS:]
        if ranks:
            yield ranks, files

    with ThreadPoolExecutor(max_workers=_thread_width(storage)) as pool:
        # map submits every group as the listing makes it: the first are read meanwhile.
        yield from pool.map(lambda group: _fetch_batch(storage, *group), groups())


def _pool_words(storage: Storage, listing: WorkerListing) -> str:
    if _in_processes(storage, listing):
        return f"{storage.read_concurrency} processes"
    return f"{_thread_width(storage)} threads"


def _thread_width(storage: Storage) -> int:
    """Threads reading batches: where reading is CPU work, threads beyond one per core contend
    for the GIL; a storage that fetches side by side needs two batches at once, one fetched
    while the other is decoded."""
    if storage.reads_side_by_side:
        return 2
    if storage.reads_are_cpu_work:
        return min(storage.read_concurrency, os.cpu_count() or 1)
    return storage.read_concurrency


def _in_processes(storage: Storage, listing: WorkerListing) -> bool:
    return (
        storage.reads_are_cpu_work
        and storage.read_concurrency > 1
        and len(listing) >= PROCESS_MIN_WORKERS
    )


def _fetch_all(storage: Storage, listing: WorkerListing) -> Iterator[_Batch]:
    """The workers' files in batches, in rank order: on a pool of processes where reading is
    CPU work and the capture is large enough to pay for starting them, else on threads."""
    width = storage.read_concurrency
    ranks, files = listing.ranks.tolist(), listing.files.tolist()
    done = 0
    if _in_processes(storage, listing):
        size = PROCESS_BATCH_WORKERS
        tasks = [
            (storage, ranks[i : i + size], files[i : i + size]) for i in range(0, len(ranks), size)
        ]
        try:
            for index, batch in enumerate(map_in_processes(_fetch_task, tasks, width)):
                done += len(tasks[index][1])
                yield batch
            return
        except ProcessPoolError:
            pass  # go on in threads: slower, and it says why if a file is at fault
    size = BATCH_WORKERS
    starts = range(done, len(ranks), size)
    with ThreadPoolExecutor(max_workers=max(1, min(_thread_width(storage), len(starts)))) as pool:
        yield from pool.map(
            lambda i: _fetch_batch(storage, ranks[i : i + size], files[i : i + size]), starts
        )


def _fetch_task(task: tuple[Storage, list[int], list[int]]) -> _Batch:
    return _fetch_batch(*task)


def _fetch_batch(storage: Storage, ranks: Sequence[int], files: Sequence[int]) -> _Batch:
    times = LoadTimes()
    clock = _Clock()
    raw = _fetch(storage, ranks, files)
    times.fetching, times.fetching_cpu = clock.lap()
    decoded_ranks, table, rows, documents = _decode_summaries(storage, raw)
    times.decoding, times.decoding_cpu = clock.lap()
    metas, keep = _check_metas(storage, decoded_ranks, documents, raw.unreadable)
    table = table.filter(pa.array(np.repeat(keep, rows))) if not keep.all() else table
    statuses, notes = _check_statuses(storage, raw.statuses)
    times.checking, times.checking_cpu = clock.lap()
    return _Batch(
        ranks=np.asarray(ranks, np.int64),
        files=np.asarray(raw.files, np.uint8),
        summary=table,
        metas=metas,
        statuses=statuses,
        unreadable=raw.unreadable,
        stacks=raw.stacks,
        flight_recorders=raw.flight_recorders,
        problems=raw.problems + notes,
        times=times,
    )


# -- fetching --------------------------------------------------------------------------------


def _fetch(storage: Storage, ranks: Sequence[int], files: Sequence[int]) -> _Raw:
    """The files of the batch's workers: the listed ones asked of the storage all at once (S3
    fetches them side by side), the folders not listed yet listed and read one by one."""
    out = _Raw()
    wanted: list[tuple[int, str]] = []
    found: list[tuple[int, str, bytes | StorageError]] = []
    for rank, mask in zip(ranks, files, strict=True):
        if mask & UNLISTED:
            names, read = storage.read_folder(layout.worker_key(rank, ""), _READ)
            mask = mask_of(names)
            found += [(rank, name, read[name]) for name in _READ if name in read]
        else:
            wanted += [(rank, name) for name in _READ if mask & bit(name)]
        out.files.append(mask)
    got: list[bytes | StorageError] = storage.get_many(
        [layout.worker_key(rank, name) for rank, name in wanted]
    )
    found += [(rank, name, data) for (rank, name), data in zip(wanted, got, strict=True)]
    for rank, name, data in sorted(found, key=lambda item: (item[0], _READ.index(item[1]))):
        _take(storage, rank, name, data, out)
    return out


def _take(storage: Storage, rank: int, name: str, data: bytes | StorageError, out: _Raw) -> None:
    if isinstance(data, StorageNotFound):
        return  # listed, then gone: like a worker that never wrote it
    if isinstance(data, StorageError):
        origin = storage.uri_of(layout.worker_key(rank, name))
        if name == layout.SUMMARY:  # a FIFO, a device, a folder, no permission
            out.unreadable[rank] = f"{origin}: {data}"
        else:  # say so, go on
            out.problems.append(f"ignored {origin}: {data}")
    elif name == layout.SUMMARY:
        out.summaries.append((rank, data))
    elif name == layout.STATUS:
        out.statuses.append((rank, data))
    elif name == layout.STACKS:
        _stack(storage, rank, data, out)
    else:
        out.flight_recorders[rank] = data


_READ = (layout.SUMMARY, layout.STATUS, layout.STACKS, layout.FLIGHT_RECORDER)


def _stack(storage: Storage, rank: int, data: bytes, out: _Raw) -> None:
    try:
        out.stacks[rank] = json.loads(data)
    except (ValueError, RecursionError) as exc:
        origin = storage.uri_of(layout.worker_key(rank, layout.STACKS))
        out.problems.append(f"ignored {origin}: not readable JSON ({_json_problem(exc)})")


# -- decoding --------------------------------------------------------------------------------


def _decode_summaries(
    storage: Storage, raw: _Raw
) -> tuple[list[int], pa.Table, np.ndarray, list[bytes]]:
    """The summaries of `raw`: (ranks read, their rows as one table in rank order, rows per
    rank, each rank's WorkerMeta document). Unreadable ones go to `raw.unreadable`."""
    datas = [data for _, data in raw.summaries]
    documents: dict[int, bytes] = {}  # file index → its WorkerMeta document
    groups: list[_Group] = []
    pending = np.arange(len(datas))
    for template in _templates_for(datas):
        if not len(pending):
            break
        decoded = parquet_batch.decode(template, [datas[i] for i in pending])
        ids = decoded.values[META_SCHEMA]
        ok = decoded.ok & np.fromiter((v == _SUMMARY_ID for v in ids), bool, len(ids))
        if ok.any():
            table = decoded.table
            if (ok != decoded.ok).any():  # another schema id: pyarrow's path names it
                table = table.filter(pa.array(np.repeat(ok[decoded.ok], decoded.rows[decoded.ok])))
            groups.append(_Group(pending[ok], table, decoded.rows[ok]))
            worker = decoded.values[META_WORKER]
            for index, i in zip(np.flatnonzero(ok).tolist(), pending[ok].tolist(), strict=True):
                document = worker[index]
                assert document is not None
                documents[i] = document
        pending = pending[~ok]
    for i in pending.tolist():
        rank, data = raw.summaries[i]
        read = _read_one(storage, rank, data, raw.unreadable)
        if read is not None:
            groups.append(_Group(np.array([i]), read[0], np.array([read[0].num_rows])))
            documents[i] = read[1]
    return _in_order(raw, groups, documents)


@dataclass(frozen=True)
class _Group:
    """Summaries decoded together: the files (indexes in the batch), their rows, row counts."""

    files: np.ndarray
    table: pa.Table
    rows: np.ndarray


def _in_order(
    raw: _Raw, groups: list[_Group], documents: dict[int, bytes]
) -> tuple[list[int], pa.Table, np.ndarray, list[bytes]]:
    """The groups' rows in the order of the files (a batch is in rank order)."""
    order = sorted(documents)
    ranks = [raw.summaries[i][0] for i in order]
    if not groups:
        return ranks, empty_summary(), np.zeros(0, np.int64), []
    rows_of = np.zeros(len(raw.summaries), np.int64)
    for group in groups:
        rows_of[group.files] = group.rows
    table = pa.concat_tables([g.table for g in groups]).combine_chunks()
    if len(groups) > 1:
        owners = np.concatenate([np.repeat(g.files, g.rows) for g in groups])
        table = table.take(pa.array(np.argsort(owners, kind="stable")))
    rows = rows_of[order]
    # The key is authoritative for the rank column (one file = one worker).
    rank_column = pa.array(np.repeat(np.asarray(ranks, np.int32), rows), pa.int32())
    return ranks, table.set_column(0, "rank", rank_column), rows, [documents[i] for i in order]


def _templates_for(datas: Sequence[bytes]) -> Iterator[parquet_batch.Template]:
    """The layouts known to this process, then new ones taken from files of this batch that
    pyarrow reads as a plain summary."""
    yield from list(_TEMPLATES)
    for data in datas[:TEMPLATE_TRIES]:
        try:
            template = parquet_batch.make_template(data, SUMMARY_SCHEMA, _KEPT_KEYS)
        except parquet_batch.NoTemplate:
            continue
        _TEMPLATES.insert(0, template)
        del _TEMPLATES[MAX_TEMPLATES:]
        yield template


def _read_one(
    storage: Storage, rank: int, data: bytes, unreadable: dict[int, str]
) -> tuple[pa.Table, bytes] | None:
    """A summary read by pyarrow: its table (SUMMARY_SCHEMA) and its WorkerMeta document."""
    origin = storage.uri_of(layout.worker_key(rank, layout.SUMMARY))
    try:
        table = _decode(origin, data)
        meta = table.schema.metadata or {}
        if meta.get(META_SCHEMA) == _SUMMARY_ID and META_WORKER in meta:
            return normalize_summary(table, origin), meta[META_WORKER]
        # The path that names what is wrong with an odd file (or reads one that is only odd).
        table, checked = read_summary_file(storage, rank, data)
    except CaptureError as exc:
        # One bad file must not sink the diagnosis of all the others.
        unreadable[rank] = str(exc)
        return None
    return table, checked.model_dump_json().encode()


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


# -- checking --------------------------------------------------------------------------------


def _check_meta(origin: str, rank: int, meta: WorkerMeta) -> None:
    if meta.rank != rank:
        raise CaptureError(f"{origin}: file says rank {meta.rank}, its key says rank {rank}")
    if meta.world_size is not None:
        problem = world_size_problem(meta.world_size)
        if problem is not None:
            raise CaptureError(f"{origin}: {problem}")
    if not meta.window.step_bounds_ns:
        raise CaptureError(f"{origin}: the window has no steps")


def _check_metas(
    storage: Storage, ranks: list[int], documents: list[bytes], unreadable: dict[int, str]
) -> tuple[MetaColumns, np.ndarray]:
    """All WorkerMeta documents by one pydantic call; a document that fails goes through
    read_meta's path again, so its message is the one a single file gets. Returns the columns
    of those that pass and, per document, whether it passed."""
    parsed = _validate_all(_METAS, documents)
    metas: list[WorkerMeta] = []
    kept: list[bytes] = []
    keep = np.zeros(len(ranks), bool)
    for i, (rank, document, meta) in enumerate(zip(ranks, documents, parsed, strict=True)):
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
        metas.append(checked)
        kept.append(document if meta is not None else checked.model_dump_json().encode())
        keep[i] = True
    return MetaColumns.of(metas, kept), keep


def _check_statuses(
    storage: Storage, documents: list[tuple[int, bytes]]
) -> tuple[StatusColumns, list[str]]:
    """All status.json documents by one pydantic call. One that fails is read again on its
    own and ignored (as a missing status), with a note that says why."""
    texts = [text for _, text in documents]
    ranks: list[int] = []
    statuses: list[WorkerStatus] = []
    kept: list[bytes] = []
    notes: list[str] = []
    validated: list[WorkerStatus | None] = _validate_all(_STATUSES, texts)
    for (rank, text), status in zip(documents, validated, strict=True):
        if status is None:
            status = _status_alone(storage, rank, text, notes)
            if status is None:
                continue
            text = status.model_dump_json().encode()
        ranks.append(rank)
        statuses.append(status)
        kept.append(text)
    return StatusColumns.of(ranks, statuses, kept), notes


def _status_alone(
    storage: Storage, rank: int, text: bytes, notes: list[str]
) -> WorkerStatus | None:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        origin = storage.uri_of(layout.worker_key(rank, layout.STATUS))
        notes.append(
            f"ignored unreadable status of rank {rank}: {origin} is not readable JSON "
            f"({_json_problem(exc)})"
        )
        return None
    try:
        return WorkerStatus.model_validate(document)
    except ValidationError as exc:
        notes.append(
            f"ignored unreadable status of rank {rank}: {validation_problems(exc, limit=1)}"
        )
        return None


def _json_problem(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at byte {exc.pos}"
    return str(exc)


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


# -- joining ---------------------------------------------------------------------------------


def _join(listing: WorkerListing, batches: list[_Batch]) -> WorkerFiles:
    """The batches as one capture's worth of files, in rank order (batches of a listing made
    in pages come in the order of their keys: 1, 10, 100, …)."""
    times = LoadTimes()
    for batch in batches:
        times.add(batch.times)
    if batches:
        ranks = np.concatenate([b.ranks for b in batches])
        files = np.concatenate([b.files for b in batches]).astype(np.uint8)
        order = np.argsort(ranks, kind="stable")
        listing = replace(listing, ranks=ranks[order], files=files[order])
    summaries = [b.summary for b in batches if b.summary.num_rows]
    summary = pa.concat_tables(summaries).combine_chunks() if summaries else empty_summary()
    rank = summary.column("rank").to_numpy()
    if (np.diff(rank) < 0).any():
        summary = summary.take(pa.array(np.argsort(rank, kind="stable")))
    metas = MetaColumns.concat([b.metas for b in batches])
    statuses = StatusColumns.concat([b.statuses for b in batches])
    return WorkerFiles(
        listing=listing,
        summary=summary,
        metas=WorkerMetas(metas.take(np.argsort(metas.ranks, kind="stable"))),
        statuses=WorkerStatuses(statuses.take(np.argsort(statuses.ranks, kind="stable"))),
        stacks={r: s for b in batches for r, s in b.stacks.items()},
        flight_recorders={r: f for b in batches for r, f in b.flight_recorders.items()},
        notes=[p for b in batches for p in b.problems],
        unreadable=dict(sorted((r, w) for b in batches for r, w in b.unreadable.items())),
        times=times,
    )
