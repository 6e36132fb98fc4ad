"""Pydantic models of the contracts that cross component boundaries (DESIGN.md §3)."""

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
