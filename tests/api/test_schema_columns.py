"""The columnar schemas describe their own columns, and the docs that list the columns agree
with them (perfdiag/api/schema.py is the one place a column is declared)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from perfdiag.api.schema import (
    DESCRIPTION,
    EVENTS_COLUMNS,
    EVENTS_SCHEMA,
    EVENTS_SCHEMA_ID,
    HARDWARE_COLUMNS,
    HARDWARE_SCHEMA,
    HARDWARE_SCHEMA_ID,
    SUMMARY_COLUMNS,
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_ID,
    column_descriptions,
)
from perfdiag.engine.parquet_io import table_from_bytes, table_to_bytes

DOCS = Path(__file__).resolve().parents[2] / "docs"

DECLARED = [
    (EVENTS_SCHEMA_ID, EVENTS_COLUMNS, EVENTS_SCHEMA),
    (SUMMARY_SCHEMA_ID, SUMMARY_COLUMNS, SUMMARY_SCHEMA),
    (HARDWARE_SCHEMA_ID, HARDWARE_COLUMNS, HARDWARE_SCHEMA),
]
IDS = [schema_id for schema_id, _, _ in DECLARED]


@pytest.mark.parametrize(("schema_id", "columns", "stored"), DECLARED, ids=IDS)
def test_every_column_is_described(schema_id: str, columns: pa.Schema, stored: pa.Schema) -> None:
    undescribed = [name for name, text in column_descriptions(columns).items() if not text.strip()]
    assert not undescribed, f"{schema_id}: columns without a description: {undescribed}"


@pytest.mark.parametrize(("schema_id", "columns", "stored"), DECLARED, ids=IDS)
def test_files_hold_the_declared_columns_without_their_descriptions(
    schema_id: str, columns: pa.Schema, stored: pa.Schema
) -> None:
    assert stored.names == columns.names
    assert stored.types == columns.types
    table = stored.empty_table().replace_schema_metadata({b"perfdiag.schema": schema_id.encode()})
    data = table_to_bytes(table)
    assert DESCRIPTION not in data  # a few-KB summary per worker stays a few KB
    back = table_from_bytes(data)
    assert back.schema.equals(stored, check_metadata=False)
    assert back.schema.metadata[b"perfdiag.schema"] == schema_id.encode()
    assert pq.ParquetFile(pa.BufferReader(data)).schema_arrow.names == columns.names


def _listed_in_design(schema_id: str) -> list[str]:
    """The backquoted names after "Columns:" in docs/design.md's bullet for `schema_id`."""
    text = (DOCS / "design.md").read_text()
    bullet = re.search(rf"^- `{re.escape(schema_id)}`.*?(?=^- |^\s*$)", text, re.M | re.S)
    assert bullet, f"docs/design.md has no bullet for {schema_id}"
    listed = re.search(r"Columns:\s*((?:`\w+`,?\s*)+)\.", bullet.group(0))
    assert listed, f"docs/design.md's bullet for {schema_id} has no 'Columns: …' list"
    return re.findall(r"`(\w+)`", listed.group(1))


@pytest.mark.parametrize(("schema_id", "columns", "stored"), DECLARED, ids=IDS)
def test_design_doc_lists_the_declared_columns_in_order(
    schema_id: str, columns: pa.Schema, stored: pa.Schema
) -> None:
    assert _listed_in_design(schema_id) == columns.names


def test_hardware_doc_lists_the_declared_columns_in_order() -> None:
    text = (DOCS / "hardware.md").read_text()
    listed = re.search(rf"`{re.escape(HARDWARE_SCHEMA_ID)}`, long format: `([^`]+)`", text)
    assert listed, "docs/hardware.md no longer lists the hardware.parquet columns"
    assert [name.strip() for name in listed.group(1).split(",")] == HARDWARE_COLUMNS.names
