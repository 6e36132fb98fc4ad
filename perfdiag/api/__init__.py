"""Pydantic models of the contracts that cross component boundaries (docs/design.md §3).

The models are imported from their modules on first use: building the PerfDiagnosis models
alone takes a tenth of a second, which `perfdiag analyze`, needing only the verdict's, does
not spend."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfdiag.api.diagnosis import (
        Analysis,
        Capture,
        Condition,
        LabelSelector,
        PerfDiagnosis,
        PerfDiagnosisSpec,
        PerfDiagnosisStatus,
        StorageOverride,
        Target,
    )
    from perfdiag.api.plan import Plan, PlanAction
    from perfdiag.api.verdict import (
        Finding,
        FindingCategory,
        FindingKind,
        RankRange,
        StepTimes,
        Verdict,
        VerdictStatus,
        WindowInfo,
        WorkerInfo,
        WorkerState,
    )

_MODULE_OF = {
    "Analysis": "diagnosis",
    "Capture": "diagnosis",
    "Condition": "diagnosis",
    "LabelSelector": "diagnosis",
    "PerfDiagnosis": "diagnosis",
    "PerfDiagnosisSpec": "diagnosis",
    "PerfDiagnosisStatus": "diagnosis",
    "StorageOverride": "diagnosis",
    "Target": "diagnosis",
    "Plan": "plan",
    "PlanAction": "plan",
    "Finding": "verdict",
    "FindingCategory": "verdict",
    "FindingKind": "verdict",
    "RankRange": "verdict",
    "StepTimes": "verdict",
    "Verdict": "verdict",
    "VerdictStatus": "verdict",
    "WindowInfo": "verdict",
    "WorkerInfo": "verdict",
    "WorkerState": "verdict",
}

__all__ = [
    "Analysis",
    "Capture",
    "Condition",
    "Finding",
    "FindingCategory",
    "FindingKind",
    "LabelSelector",
    "PerfDiagnosis",
    "PerfDiagnosisSpec",
    "PerfDiagnosisStatus",
    "Plan",
    "PlanAction",
    "RankRange",
    "StepTimes",
    "StorageOverride",
    "Target",
    "Verdict",
    "VerdictStatus",
    "WindowInfo",
    "WorkerInfo",
    "WorkerState",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
