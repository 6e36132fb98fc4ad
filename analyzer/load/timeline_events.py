"""What a rank's timeline lanes show, kept while its trace is read (the timeline,
analyzer/report/timeline.py, is then built without reading any trace a second time)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc

MAX_EVENTS_PER_RANK = 50_000

TIMELINE_COLUMNS = ["name", "category", "ts_ns", "dur_ns", "tid", "stream"]


def timeline_events(events: pa.Table) -> pa.Table:
    """What the timeline shows of one rank's raw events: their TIMELINE_COLUMNS, at most
    MAX_EVENTS_PER_RANK of them — the longest: what shapes the picture at any zoom level."""
    events = events.select(TIMELINE_COLUMNS)
    if events.num_rows > MAX_EVENTS_PER_RANK:
        # A partition, not a sort (Arrow's select_k sorts the k it keeps: 6× slower on 190k
        # events); the rows kept stay in the trace's order.
        dur = np.asarray(events["dur_ns"].to_numpy())
        longest = np.argpartition(-dur, MAX_EVENTS_PER_RANK - 1)[:MAX_EVENTS_PER_RANK]
        events = events.take(pa.array(np.sort(longest)))
    return events


def keep_timeline_events(events: pa.Table, path: Path) -> None:
    """Write a trace's `timeline_events` to `path` (Arrow IPC) while the trace is imported:
    the timeline is then built from them, never from a second read of the trace."""
    kept = timeline_events(events).replace_schema_metadata(None)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, kept.schema) as writer:
        writer.write_table(kept)
