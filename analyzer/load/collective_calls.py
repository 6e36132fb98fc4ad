"""A worker's collective calls, kept while its trace is read: one row per call of the window
(a few hundred rows), matched across ranks later (analyzer/compare/collectives.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

# Group membership lists (`pg_ranks`) are not kept: their size grows with the group, so
# keeping them would make the calls of N ranks O(N²); group name and size identify the group.
COLLECTIVES_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("pg_name", pa.string()),
        ("collective", pa.string()),
        ("seq", pa.int64()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("msg_bytes", pa.int64()),
        ("group_size", pa.int32()),
        ("step", pa.int32()),
        ("device", pa.bool_()),
    ]
)


def empty_collectives() -> pa.Table:
    return COLLECTIVES_SCHEMA.empty_table()


def collective_calls(events: pa.Table) -> pa.Table:
    """One row per collective call of one worker's window (COLLECTIVES_SCHEMA)."""
    comm = pc.and_(
        pc.equal(events["category"], "communication"),
        pc.and_(pc.is_valid(events["seq"]), pc.is_valid(events["collective"])),
    )
    comm = pc.and_(pc.fill_null(comm, False), pc.greater_equal(events["step"], 0))
    # Compact: a filtered multi-chunk table would keep one small allocation per chunk.
    calls = events.filter(comm).combine_chunks()
    on_device = pc.is_valid(calls["device"])
    if pc.any(on_device).as_py():
        # NCCL kernels: their span is the collective itself (the host call only enqueues it).
        calls = calls.filter(on_device)
    else:
        calls = calls.filter(pc.starts_with(calls["name"], "gloo:"))
    return pa.table(
        {
            "rank": calls["rank"],
            "pg_name": pc.fill_null(calls["pg_name"], ""),
            "collective": calls["collective"],
            "seq": calls["seq"],
            "ts_ns": calls["ts_ns"],
            "dur_ns": calls["dur_ns"],
            "msg_bytes": calls["msg_bytes"],
            "group_size": calls["group_size"],
            "step": calls["step"],
            "device": pc.is_valid(calls["device"]),
        },
        schema=COLLECTIVES_SCHEMA,
    )
