"""Pydantic models of the contracts that cross component boundaries (DESIGN.md §3)."""

from perfdiag.api.plan import Plan, PlanAction
from perfdiag.api.verdict import (
    Finding,
    FindingCategory,
    FindingKind,
    StepTimes,
    Verdict,
    VerdictStatus,
    WindowInfo,
    WorkerInfo,
    WorkerState,
)

__all__ = [
    "Finding",
    "FindingCategory",
    "FindingKind",
    "Plan",
    "PlanAction",
    "StepTimes",
    "Verdict",
    "VerdictStatus",
    "WindowInfo",
    "WorkerInfo",
    "WorkerState",
]
