"""`analyze` of a folder of Kineto traces writes breakdown.json (perfdiag.breakdown/v1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfdiag.analyzer import analyze
from perfdiag.api.breakdown import BREAKDOWN_SCHEMA, Breakdown
from perfdiag.engine.breakdown import gpu_breakdown
from perfdiag.engine.kineto import read_kineto
from perfdiag.storage import layout
from perfdiag.storage.local import LocalStorage

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "hta"


def test_two_gpu_ranks_get_their_breakdown(tmp_path: Path) -> None:
    folder = SHARED / "trace_filter"
    files = sorted(folder.glob("*.json.gz"))
    assert len(files) == 2, f"the shared HTA traces are required ({folder})"
    analyze(str(folder), LocalStorage(tmp_path / "out"))
    raw = json.loads((tmp_path / "out" / layout.BREAKDOWN).read_text())
    assert raw["schema"] == BREAKDOWN_SCHEMA
    written = Breakdown.model_validate(raw)
    assert sorted(written.ranks) == ["0", "1"]
    for path in files:
        events, meta = read_kineto(path)
        expected = gpu_breakdown(events, meta.window.step_bounds_ns)
        assert written.ranks[str(meta.rank)] == expected
        assert expected.gpu_compute is not None and expected.idle is not None
        assert expected.span_s > 0.5 and 0.1 < expected.gpu_compute < 0.3


def test_a_cpu_only_rank_is_written_with_null_shares(tmp_path: Path) -> None:
    analyze(str(SHARED / "cpu_only"), LocalStorage(tmp_path / "out"))
    written = Breakdown.model_validate_json((tmp_path / "out" / layout.BREAKDOWN).read_text())
    (only,) = written.ranks.values()
    assert list(written.ranks) == ["34"]
    assert only.span_s == 0.0 and only.gpu_compute is None and only.idle is None


def test_shares_outside_zero_one_are_rejected() -> None:
    with pytest.raises(ValueError):
        Breakdown.model_validate(
            {
                "schema": BREAKDOWN_SCHEMA,
                "ranks": {
                    "0": {
                        "span_s": 1.0,
                        "gpu_compute": 1.5,
                        "communication": 0.0,
                        "gpu_memory": 0.0,
                        "gpu_other": 0.0,
                        "idle": 0.0,
                    }
                },
            }
        )
