"""The identifiers written into captures and outputs are a contract with files already on disk:
they name formats, not the modules that define them, and never follow a module's move."""

from __future__ import annotations

from perfdiag.api.breakdown import BREAKDOWN_SCHEMA
from perfdiag.api.schema import (
    EVENTS_SCHEMA_ID,
    HARDWARE_SCHEMA_ID,
    META_SCHEMA,
    META_WORKER,
    SUMMARY_SCHEMA_ID,
)
from perfdiag.api.verdict import VERDICT_SCHEMA


def test_capture_and_output_identifiers_are_unchanged() -> None:
    assert (META_SCHEMA, META_WORKER) == (b"perfdiag.schema", b"perfdiag.worker")
    assert (EVENTS_SCHEMA_ID, SUMMARY_SCHEMA_ID, HARDWARE_SCHEMA_ID) == (
        "perfdiag.events/v1",
        "perfdiag.summary/v1",
        "perfdiag.hardware/v1",
    )
    assert BREAKDOWN_SCHEMA == "perfdiag.breakdown/v1"
    assert VERDICT_SCHEMA == "perfdiag.verdict/v1"
