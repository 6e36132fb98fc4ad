"""Loading a capture folder (docs/design.md §3 layout), or a folder of Kineto traces where
there is none, into a Capture (analyzer/load/capture.py)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from perfdiag.analyzer.errors import NoCaptureError
from perfdiag.analyzer.load.capture import Capture
from perfdiag.analyzer.load.kineto_source import find_traces, load_kineto
from perfdiag.analyzer.load.listing import (
    WorkerListing,
    parse_worker_folders,
    parse_worker_keys,
    stream_worker_keys,
)
from perfdiag.analyzer.load.worker_files import read_worker_files
from perfdiag.api.plan import Plan
from perfdiag.api.trigger import Slowdown
from perfdiag.api.validation import validation_problems
from perfdiag.storage import Storage, StorageError, StorageNotFound, layout

Progress = Callable[[str], None]


def load_capture(storage: Storage, progress: Progress | None = None, jobs: int = 1) -> Capture:
    """Read the capture under `storage`, or a folder of Kineto traces when there is none (read
    `jobs` trace files at a time)."""
    say = progress or (lambda _msg: None)
    listing = _list_workers(storage, say)
    plan_notes: list[str] = []
    plan = _read_plan(storage, plan_notes)
    files = None
    if not isinstance(listing, WorkerListing) or listing.any_file():
        files = read_worker_files(storage, listing, say)
        listing = files.listing
    notes = [*listing.notes, *plan_notes]
    if files is None or not listing.any_file():
        traces = [] if plan is not None else find_traces(storage)
        if traces:
            return load_kineto(storage, traces, say, jobs)
        if plan is not None:
            # What a run interrupted before any worker wrote a file leaves: nothing to analyse.
            raise NoCaptureError(
                f"no capture in {storage.uri}: {layout.PLAN} is there but no worker wrote a "
                f"file under {layout.WORKERS}/ (the run was interrupted before the window?)"
            )
        looked = (
            f"looked for {layout.PLAN}, {layout.WORKERS}/<rank>/{layout.SUMMARY} and Kineto "
            "traces (*.json, *.json.gz)"
        )
        raise NoCaptureError(f"no capture in {storage.uri}: {'; '.join([looked, *notes])}")
    notes += files.notes
    return Capture(
        source=storage.uri,
        kind="capture",
        summary=files.summary,
        metas=files.metas,
        statuses=files.statuses,
        stacks=files.stacks,
        flight_recorders=files.flight_recorders,
        plan=plan,
        trigger=_read_trigger(storage, notes),
        notes=notes,
        input_notes=list(notes),
        unreadable=files.unreadable,
        hardware_ranks=listing.ranks_with(layout.HARDWARE),
        event_ranks=listing.ranks_with(layout.EVENTS),
    )


def _list_workers(storage: Storage, say: Progress) -> WorkerListing | Iterator[WorkerListing]:
    """The worker folders of the capture. A local folder: the folders only (their files are
    listed by the pool that reads them, side by side). Else every key under workers/, in parts
    as the storage lists them (S3: 1,000 keys a request), so that the workers of the first
    parts are read while the next are listed; an empty listing is one empty part."""
    started = time.monotonic()
    folder_uri = storage.uri_of(layout.WORKERS)
    names = storage.list_names(layout.WORKERS)
    if names is not None:
        listing = parse_worker_folders(names, folder_uri)
        if len(listing):
            say(f"listed {len(listing):,} worker folders in {time.monotonic() - started:.1f} s")
        return listing
    pages = _ListingClock(storage.list_pages(f"{layout.WORKERS}/"), say)
    parts = stream_worker_keys(pages, folder_uri)
    first = next(parts, None)
    if first is None:
        return parse_worker_keys([], folder_uri)
    return itertools.chain([first], parts)


class _ListingClock(Iterator[list[str]]):
    """The pages of a listing, with the time spent waiting for them said at the end (the
    listing goes on side by side with the reading: its own time is that wait)."""

    def __init__(self, pages: Iterator[list[str]], say: Progress) -> None:
        self.pages, self.say = pages, say
        self.waited = 0.0
        self.keys = 0
        self.count = 0

    def __next__(self) -> list[str]:
        started = time.monotonic()
        try:
            page = next(self.pages)
        except StopIteration:
            self.waited += time.monotonic() - started
            if self.keys:
                self.say(
                    f"listed {self.keys:,} files in {self.count:,} page(s): {self.waited:.1f} s "
                    "of listing, side by side with the reading"
                )
            raise
        self.waited += time.monotonic() - started
        self.keys += len(page)
        self.count += 1
        return page


def _read_trigger(storage: Storage, notes: list[str]) -> Slowdown | None:
    # Like the plan: it labels the verdict, the capture stands without it.
    return _read_optional(storage, layout.TRIGGER, Slowdown, notes)


def _read_plan(storage: Storage, notes: list[str]) -> Plan | None:
    # The plan only labels the report; a capture with an odd plan is still analysable.
    return _read_optional(storage, layout.PLAN, Plan, notes)


M = TypeVar("M", bound=BaseModel)


def _read_optional(storage: Storage, key: str, model: type[M], notes: list[str]) -> M | None:
    """The document `key`, or None when it is absent or unusable (then a note says why)."""
    origin = storage.uri_of(key)
    try:
        text = storage.get_bytes(key)
    except StorageNotFound:
        return None
    except StorageError as exc:
        notes.append(f"ignored {origin}: {exc}")
        return None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        notes.append(f"ignored {origin}: {validation_problems(exc, limit=1)}")
        return None
