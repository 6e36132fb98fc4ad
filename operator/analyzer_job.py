"""The analyzer Job (batch/v1) of one diagnosis, and what its status says (pure).

It runs `perfdiag analyze <prefix> --expected-ranks N` in the perfdiag image with the storage
credentials of the namespace's storage Secret; it is owned by the PerfDiagnosis (garbage
collected with it; the operator also deletes it when the diagnosis is deleted mid-run), has
resource requests and limits (memory raised to what the job's worker count needs), a deadline
(activeDeadlineSeconds) and a TTL.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Literal

from kubernetes.utils.quantity import parse_quantity

from perfdiag.api.diagnosis import API_VERSION, KIND
from perfdiag.operator.injection import storage_env
from perfdiag.operator.settings import DEFAULT_ANALYZER_RESOURCES

ANALYZER_CONTAINER = "analyzer"
DIAGNOSIS_LABEL = "perfdiag.io/diagnosis"
MAX_NAME = 63
ANALYZER_RESOURCES = DEFAULT_ANALYZER_RESOURCES.to_wire()
# The analysis' peak memory grows by ~11.5 KB a worker (1,000,000 workers: 11.5 GB, the cross-worker
# benchmark in docs/benchmarks.md) over ~0.2 GB of interpreter and libraries; both with margin.
MEMORY_PER_WORKER = 16 * 1024
MEMORY_BASE = 1024**3


def _quantity(value: str | int | float) -> Decimal:
    """A Kubernetes quantity ("4Gi", "512Mi", 1e9) as a number (the kubernetes client's parser)."""
    parsed: Decimal = parse_quantity(value)  # type: ignore[no-untyped-call]  # untyped library
    return parsed


def memory_needed(expected_ranks: int) -> int:
    """Bytes the analysis of `expected_ranks` workers' capture may take at its peak."""
    return MEMORY_BASE + MEMORY_PER_WORKER * expected_ranks


def sized_for_workers(resources: Mapping[str, Any], expected_ranks: int | None) -> dict[str, Any]:
    """`resources` as configured while memory_needed(expected_ranks) fits their memory limit;
    past it, the memory request and limit both become that need, so that a job of 1,000,000
    workers is not OOM-killed at the 4 Gi default (enough, by this estimate, for ~190,000) and
    its pod is placed where the memory is."""
    sized = copy.deepcopy(dict(resources))
    limit = (sized.get("limits") or {}).get("memory")
    if not expected_ranks or limit is None:
        return sized
    needed = memory_needed(expected_ranks)
    if _quantity(limit) >= needed:
        return sized
    quantity = f"{math.ceil(needed / 1024**2)}Mi"
    for kind in ("requests", "limits"):
        values = dict(sized.get(kind) or {})
        configured = values.get("memory")
        if configured is None or _quantity(configured) < needed:
            values["memory"] = quantity
        sized[kind] = values
    return sized


def job_name(name: str, uid: str) -> str:
    """Unique per PerfDiagnosis object (a re-created one of the same name gets a new Job), and a
    valid label value (Job names become pod labels)."""
    suffix = f"-{uid[:8]}-analyze"
    return f"{name[: MAX_NAME - len(suffix)].rstrip('-.')}{suffix}"


def analyzer_job(
    diagnosis: Mapping[str, Any],
    *,
    prefix: str,
    expected_ranks: int | None,
    image: str,
    storage_secret: str,
    deadline_seconds: int,
    ttl_seconds: int,
    thresholds: Mapping[str, Any] | None = None,
    resources: Mapping[str, Any] | None = None,
    storage_endpoint: str | None = None,
    storage_region: str | None = None,
) -> dict[str, Any]:
    """`thresholds`: the diagnosis' spec.analysis (set fields only), passed as --thresholds;
    `resources`: the container's (default ANALYZER_RESOURCES), its memory raised for the workers
    (sized_for_workers); `storage_endpoint`/`_region`: the
    operator's S3 endpoint and region, set as AWS_ENDPOINT_URL / AWS_REGION (over the Secret's)."""
    meta = diagnosis["metadata"]
    labels = {
        "app.kubernetes.io/name": "perfdiag",
        "app.kubernetes.io/component": "analyzer",
        DIAGNOSIS_LABEL: meta["name"],
    }
    args = ["analyze", prefix, "--quiet"]
    if expected_ranks:
        args += ["--expected-ranks", str(expected_ranks)]
    if thresholds:
        args += ["--thresholds", json.dumps(dict(thresholds), sort_keys=True)]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(meta["name"], meta["uid"]),
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": deadline_seconds,
            "ttlSecondsAfterFinished": ttl_seconds,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": ANALYZER_CONTAINER,
                            "image": image,
                            "args": args,
                            "env": storage_env(storage_endpoint, storage_region),
                            "envFrom": [{"secretRef": {"name": storage_secret, "optional": True}}],
                            "resources": sized_for_workers(
                                resources or ANALYZER_RESOURCES, expected_ranks
                            ),
                        }
                    ],
                },
            },
        },
    }


JobOutcome = Literal["running", "succeeded", "failed"]


@dataclass(frozen=True)
class JobState:
    outcome: JobOutcome
    reason: str = ""
    message: str = ""
    started: datetime | None = None  # status.startTime
    finished: datetime | None = None  # completionTime, else when the Failed condition came


def _time(value: Any) -> datetime | None:
    """An RFC 3339 time of the API (`2026-11-26T10:00:00Z`), None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def job_state(job: Mapping[str, Any]) -> JobState:
    """Running, succeeded or failed (with the Job controller's reason and message), and when it
    started and ended."""
    status = job.get("status") or {}
    started = _time(status.get("startTime"))
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        ended = _time(status.get("completionTime")) or _time(cond.get("lastTransitionTime"))
        if cond.get("type") == "Complete":
            return JobState("succeeded", started=started, finished=ended)
        if cond.get("type") == "Failed":
            return JobState(
                "failed",
                str(cond.get("reason") or "Failed"),
                str(cond.get("message") or ""),
                started=started,
                finished=ended,
            )
    return JobState("running", started=started)
