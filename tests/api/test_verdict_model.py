"""verdict.json's workers: a row per rank with a file, and ranges for ranks with none."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from perfdiag.api.verdict import Verdict

WINDOW = {"start_step": 0, "steps": 1, "step_time_ms": {"median": 1, "max": 1, "per_rank": {}}}


def _verdict(workers: list[tuple[int, str]], missing: list[tuple[int, int]]) -> Verdict:
    document: dict[str, Any] = {
        "schema": "perfdiag.verdict/v1",
        "status": "incomplete",
        "summary": "s",
        "window": WINDOW,
        "workers": [{"rank": rank, "state": state} for rank, state in workers],
        "missing": [{"first": a, "last": b, "reason": "no file"} for a, b in missing],
    }
    return Verdict.model_validate(document)


def test_missing_ranks_are_the_rows_and_the_ranges_together() -> None:
    verdict = _verdict(
        [(0, "ok"), (1, "stuck"), (3, "missing"), (4, "ok"), (9, "missing")], [(2, 2), (5, 8)]
    )
    assert verdict.rank_runs("missing") == [(2, 3), (5, 9)]
    assert verdict.rank_runs("stuck") == [(1, 1)]
    assert verdict.rank_runs("ok") == [(0, 0), (4, 4)]
    assert verdict.expected_ranks() == 10


def test_a_range_overlapping_a_row_or_another_range_is_refused() -> None:
    with pytest.raises(ValidationError, match="rank 3 is both in workers and in missing"):
        _verdict([(0, "ok"), (3, "ok")], [(1, 5)])
    with pytest.raises(ValidationError, match="overlap"):
        _verdict([(0, "ok")], [(4, 6), (2, 4)])
    with pytest.raises(ValidationError, match="below first rank"):
        _verdict([(0, "ok")], [(4, 3)])


def test_missing_is_absent_from_the_json_when_empty() -> None:
    """A verdict with every expected rank in `workers` reads as before the field existed."""
    assert "missing" not in json.loads(_verdict([(0, "ok")], []).to_json())
    document = json.loads(_verdict([(0, "ok")], [(1, 99_999)]).to_json())
    assert document["missing"] == [{"first": 1, "last": 99_999, "reason": "no file"}]
    assert Verdict.model_validate(document).expected_ranks() == 100_000
