"""PerfDiagnosis objects in each state the operator writes, built with the operator's own
condition code (perfdiag.operator.status.merge_conditions) and validated by the status model,
with what Flux's kstatus and the Argo CD health check must make of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from perfdiag.api.diagnosis import PerfDiagnosisStatus
from perfdiag.operator.status import READY, RECONCILING, STALLED, Desired, merge_conditions

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
DEGRADE_ANNOTATION = "perfdiag.io/degrade-app"


def _running(reason: str) -> list[Desired]:
    return [
        Desired(READY, "False", reason, f"{reason} message"),
        Desired(RECONCILING, "True", reason, f"{reason} message"),
        Desired(STALLED, "False", reason),
    ]


def _stalled(reason: str) -> list[Desired]:
    return [
        Desired(READY, "False", reason, f"{reason} message"),
        Desired(RECONCILING, "False", reason),
        Desired(STALLED, "True", reason, f"{reason} message"),
    ]


def _done() -> list[Desired]:
    return [
        Desired(READY, "True", "VerdictReady", "degraded: rank 3 is slow"),
        Desired(RECONCILING, "False", "VerdictReady"),
        Desired(STALLED, "False", "VerdictReady"),
    ]


@dataclass(frozen=True)
class Case:
    name: str
    phase: str | None  # None: no status yet
    desired: list[Desired] = field(default_factory=list)
    generation: int = 1
    observed: int = 1
    verdict: str | None = None  # verdict status of a Succeeded diagnosis
    deleting: bool = False
    kstatus: str = ""
    # Argo CD health by value of the degrade annotation ("" = absent).
    argo: dict[str, str] = field(default_factory=dict)

    def obj(self, degrade: str = "") -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "d", "namespace": "ns", "generation": self.generation}
        if degrade:
            meta["annotations"] = {DEGRADE_ANNOTATION: degrade}
        if self.deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        body: dict[str, Any] = {
            "apiVersion": "perfdiag.io/v1alpha1",
            "kind": "PerfDiagnosis",
            "metadata": meta,
            "spec": {"target": {"kind": "PyTorchJob", "name": "job"}},
        }
        if self.phase is not None:
            status: dict[str, Any] = {
                "phase": self.phase,
                "observedGeneration": self.observed,
                "conditions": [
                    c.model_dump(mode="json", by_alias=True, exclude_none=True)
                    for c in merge_conditions([], self.desired, self.observed, NOW)
                ],
            }
            if self.verdict is not None:
                status["verdict"] = {"status": self.verdict, "summary": "rank 3 is slow"}
            body["status"] = PerfDiagnosisStatus.model_validate(status).to_wire()
        return body


def _argo(
    default: str, on_failure: str | None = None, on_finding: str | None = None
) -> dict[str, str]:
    on_failure = on_failure or default
    return {"": default, "on-failure": on_failure, "on-finding": on_finding or on_failure}


CASES = [
    Case("no status yet", None, kstatus="Current", argo=_argo("Progressing")),
    Case(
        "pending, waiting for capture",
        "Pending",
        _running("WaitingForCapture"),
        kstatus="InProgress",
        argo=_argo("Progressing"),
    ),
    Case(
        "pending, target not found",
        "Pending",
        _stalled("TargetNotFound"),
        kstatus="Failed",
        argo=_argo("Healthy", "Degraded"),
    ),
    Case(
        "capturing",
        "Capturing",
        _running("Capturing"),
        kstatus="InProgress",
        argo=_argo("Progressing"),
    ),
    Case(
        "analyzing",
        "Analyzing",
        _running("Analyzing"),
        kstatus="InProgress",
        argo=_argo("Progressing"),
    ),
    Case(
        "succeeded, healthy verdict",
        "Succeeded",
        _done(),
        verdict="healthy",
        kstatus="Current",
        argo=_argo("Healthy"),
    ),
    Case(
        "succeeded, degraded verdict",
        "Succeeded",
        _done(),
        verdict="degraded",
        kstatus="Current",
        argo=_argo("Healthy", "Healthy", "Degraded"),
    ),
    Case(
        "failed, analyzer failed",
        "Failed",
        _stalled("AnalyzerFailed"),
        kstatus="Failed",
        argo=_argo("Healthy", "Degraded"),
    ),
    Case(
        "spec changed, not observed yet",
        "Succeeded",
        _done(),
        generation=2,
        observed=1,
        verdict="healthy",
        kstatus="InProgress",
        argo=_argo("Progressing"),
    ),
    Case(
        "being deleted",
        "Capturing",
        _running("Capturing"),
        deleting=True,
        kstatus="Terminating",
        argo=_argo("Progressing"),
    ),
]
