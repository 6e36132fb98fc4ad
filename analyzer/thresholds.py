"""Tunable thresholds of the analysis, as the analyzer reads them.

They are a contract (a PerfDiagnosis sets them in `spec.analysis`), written once in
perfdiag.api.thresholds: names, defaults, bounds and descriptions. Light (pydantic only).
"""

from __future__ import annotations

from perfdiag.api.thresholds import ExpectedRanges, Thresholds

__all__ = ["ExpectedRanges", "Thresholds"]
