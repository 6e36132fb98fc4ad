"""`perfdiag analyze --thresholds JSON` (what the operator's analyzer Job passes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_invalid_thresholds_exit_2_naming_the_field(cli: Any, tmp_path: Path) -> None:
    code, _, err = cli("analyze", str(tmp_path), "--thresholds", '{"minRatio": 0.5}')
    assert code == 2
    assert "--thresholds: minRatio" in err
    code, _, err = cli("analyze", str(tmp_path), "--thresholds", '{"noSuchField": 1}')
    assert code == 2 and "noSuchField" in err
    code, _, err = cli("analyze", str(tmp_path), "--thresholds", "not json")
    assert code == 2


def test_valid_thresholds_are_accepted(cli: Any, tmp_path: Path) -> None:
    """Camel case (spec.analysis on the wire) and snake case; an empty folder then has no
    capture (exit 5), past the thresholds."""
    for text in ('{"minRatio": 1.5, "stuckAfterSeconds": 30}', '{"report_severity": 0.1}'):
        code, _, err = cli("analyze", str(tmp_path), "--thresholds", text)
        assert code == 5, err
