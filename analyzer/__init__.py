"""Cross-worker analysis: summaries (or Kineto traces) in; verdict.json and report.html out.

`analyze()` is the entry point the CLI, the operator's analyzer Job and tests call. This module
stays light (pydantic only) so `Thresholds` can be imported cheaply; the numeric pipeline is
imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from perfdiag.analyzer.errors import AnalyzerError, CaptureError, NoCaptureError
from perfdiag.api.thresholds import ExpectedRanges, Thresholds

if TYPE_CHECKING:
    from perfdiag.api.verdict import Verdict
    from perfdiag.storage import Storage

__all__ = [
    "AnalyzerError",
    "CaptureError",
    "ExpectedRanges",
    "NoCaptureError",
    "Thresholds",
    "analyze",
]


def analyze(
    source: str | Storage,
    out: Storage | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    thresholds: Thresholds | None = None,
    expected_ranks: list[int] | None = None,
    jobs: int = 1,
) -> Verdict:
    """Analyze the capture (or Kineto trace folder) at `source`; write verdict.json and
    report.html to `out` (default: the source) and return the verdict. `jobs`: how many
    Kineto trace files are read at a time (each holds its file's events in memory).

    Raises NoCaptureError when the source holds no capture, CaptureError when a file is
    unreadable, perfdiag.storage.StorageError when storage fails.
    """
    # Imported here: the analysis (Arrow compute, the report) stays out of `perfdiag --help`.
    from perfdiag.analyzer.pipeline import run_analysis

    return run_analysis(
        source,
        out,
        progress=progress,
        thresholds=thresholds,
        expected_ranks=expected_ranks,
        jobs=jobs,
    )
