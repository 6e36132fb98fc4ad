"""The target pods as the operator keeps them between reading and deciding: only what its
decisions read (targets.py, injection.py, coordination.py), in the pod's own JSON shape.

A listed pod is several KB of JSON (managed fields, the injected containers, volumes, status);
at 10,000 pods a pass that kept them whole held hundreds of MB. A slim pod keeps its name, uid,
deletion mark, phase, perfdiag's annotations, the training container's rank count variable and
the agent containers' POD_UID and PERFDIAG_PLAN_SUCCESSORS variables (whether its agent reads
the pod's plan from storage, and the watch plan's successor).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfdiag.api.plan import PLAN_SUCCESSORS_ENV
from perfdiag.operator.injection import AGENT_CONTAINER, POD_UID_ENV, training_container_index
from perfdiag.operator.settings import DIAGNOSIS_ANNOTATION, INJECTED_ANNOTATION, PLAN_ANNOTATION

NPROC_ENV = "PET_NPROC_PER_NODE"  # the training operator's ranks per pod (from nprocPerNode)
KEPT_ANNOTATIONS = (PLAN_ANNOTATION, DIAGNOSIS_ANNOTATION, INJECTED_ANNOTATION)
AGENT_ENV = (POD_UID_ENV, PLAN_SUCCESSORS_ENV)  # which ways the pod's agent follows its plan


def _container(container: Mapping[str, Any], *env: str, keep_value: bool) -> dict[str, Any]:
    """A container's name and its variables named `env` it has (without their values unless
    `keep_value`)."""
    found = [var for var in container.get("env") or [] if var.get("name") in env]
    kept = [dict(var) if keep_value else {"name": var.get("name")} for var in found]
    return {"name": container.get("name"), "env": kept}


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """`pod` with only the fields the operator's decisions read."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    containers = list(spec.get("containers") or [])
    kept: list[dict[str, Any]] = []
    if containers:
        training = containers[training_container_index(containers)]
        kept.append(_container(training, NPROC_ENV, keep_value=True))
    kept += [
        _container(c, *AGENT_ENV, keep_value=False)
        for c in containers
        if c.get("name") == AGENT_CONTAINER
    ]
    agents = [
        _container(c, *AGENT_ENV, keep_value=False)
        for c in spec.get("initContainers") or []
        if c.get("name") == AGENT_CONTAINER
    ]
    slim_meta: dict[str, Any] = {
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "annotations": {k: annotations[k] for k in KEPT_ANNOTATIONS if k in annotations},
    }
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    return {
        "metadata": slim_meta,
        "spec": {"containers": kept, "initContainers": agents},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }
