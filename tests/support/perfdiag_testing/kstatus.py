"""kstatus's status computation for a custom resource, as Flux (kustomize-controller health
checks, `flux get`) and kpt apply it: sigs.k8s.io/cli-utils pkg/kstatus/status (Compute,
checkGenericProperties, checkGeneration, checkReadyCondition), for kinds without built-in rules.

Order of the rules, first match wins:
1. metadata.deletionTimestamp set                      -> Terminating
2. status.observedGeneration present and != generation -> InProgress (LatestGenerationNotObserved)
3. a condition Reconciling=True                        -> InProgress
   a condition Stalled=True                            -> Failed
   (checked condition by condition, in list order)
4. the Ready condition: True -> Current; False or Unknown -> InProgress
5. otherwise                                           -> Current
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

KStatus = Literal["InProgress", "Failed", "Current", "Terminating"]


@dataclass(frozen=True)
class Result:
    status: KStatus
    message: str


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return [c for c in conditions if isinstance(c, Mapping)]


def compute(obj: Mapping[str, Any]) -> Result:
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return Result("Terminating", "Resource scheduled for deletion")
    generation = meta.get("generation")
    observed = (obj.get("status") or {}).get("observedGeneration")
    if generation is not None and observed is not None and observed != generation:
        kind = obj.get("kind", "")
        return Result(
            "InProgress",
            f"{kind} generation is {generation}, but latest observed generation is {observed}",
        )
    for cond in _conditions(obj):
        if cond.get("type") == "Reconciling" and cond.get("status") == "True":
            return Result("InProgress", str(cond.get("message", "")))
        if cond.get("type") == "Stalled" and cond.get("status") == "True":
            return Result("Failed", str(cond.get("message", "")))
    for cond in _conditions(obj):
        if cond.get("type") != "Ready":
            continue
        if cond.get("status") == "True":
            return Result("Current", "Resource is Ready")
        if cond.get("status") in ("False", "Unknown"):
            return Result("InProgress", str(cond.get("message", "")))
    return Result("Current", "Resource is current")
