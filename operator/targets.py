"""Target resolution: which pods a PerfDiagnosis is about (docs/design.md §2).

Pure functions decide from what was read (the job object, the pods); `TargetReader` in
perfdiag.operator.kube does the reading. Pod labels:
  PyTorchJob v1 (training-operator): training.kubeflow.org/job-name=<name>,
      training.kubeflow.org/operator-name=pytorchjob-controller
  TrainJob v2 (Trainer, through JobSet): jobset.sigs.k8s.io/jobset-name=<name>,
      jobset.sigs.k8s.io/replicatedjob-name=node (the training nodes, not the initializers)
  Pods: a label selector, or one pod by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from perfdiag.api.diagnosis import LabelSelector, Target, TargetKind


@dataclass(frozen=True)
class JobKind:
    """A training-job custom resource whose pods can be targeted."""

    kind: str
    group: str
    version: str
    plural: str
    pod_labels: tuple[tuple[str, str | None], ...]  # (key, value); None → the job's name
    finished_conditions: tuple[str, ...]  # condition types that mean the job is over

    def labels_for(self, name: str) -> dict[str, str]:
        return {key: name if value is None else value for key, value in self.pod_labels}


PYTORCHJOB = JobKind(
    kind="PyTorchJob",
    group="kubeflow.org",
    version="v1",
    plural="pytorchjobs",
    pod_labels=(
        ("training.kubeflow.org/job-name", None),
        ("training.kubeflow.org/operator-name", "pytorchjob-controller"),
    ),
    finished_conditions=("Succeeded", "Failed"),
)
TRAINJOB = JobKind(
    kind="TrainJob",
    group="trainer.kubeflow.org",
    version="v1alpha1",
    plural="trainjobs",
    pod_labels=(
        ("jobset.sigs.k8s.io/jobset-name", None),
        ("jobset.sigs.k8s.io/replicatedjob-name", "node"),
    ),
    finished_conditions=("Complete", "Failed"),
)
JOB_KINDS: dict[TargetKind, JobKind] = {"PyTorchJob": PYTORCHJOB, "TrainJob": TRAINJOB}

TargetState = Literal["found", "waiting_for_pods", "not_found", "finished"]
# What became of the lookup of the job object (or of the single pod, for kind Pods with a name).
Lookup = Literal["found", "missing", "kind_not_installed"]


@dataclass(frozen=True)
class TargetObservation:
    """What the target is right now; the input of the status computation."""

    state: TargetState
    reason: str  # CamelCase, becomes the TargetResolved condition's reason
    message: str
    selector: str | None  # label selector of the target pods, when there is one
    pods: tuple[str, ...] = ()  # names of live target pods, sorted


def format_selector(selector: LabelSelector | Mapping[str, str]) -> str:
    """The label-selector string (`kubectl get pods -l ...`) of a selector or a label dict."""
    if not isinstance(selector, LabelSelector):
        return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
    parts = [f"{key}={value}" for key, value in sorted(selector.match_labels.items())]
    for req in selector.match_expressions:
        if req.operator == "In":
            parts.append(f"{req.key} in ({','.join(req.values)})")
        elif req.operator == "NotIn":
            parts.append(f"{req.key} notin ({','.join(req.values)})")
        elif req.operator == "Exists":
            parts.append(req.key)
        else:
            parts.append(f"!{req.key}")
    return ",".join(parts)


def pod_selector(target: Target) -> str | None:
    """The label selector of the target's pods; None for one pod named directly."""
    if target.kind == "Pods":
        return format_selector(target.selector) if target.selector is not None else None
    assert target.name is not None  # the model guarantees it for job kinds
    return format_selector(JOB_KINDS[target.kind].labels_for(target.name))


def describe(target: Target) -> str:
    """How messages name the target: 'PyTorchJob bert', 'pod w-0', 'pods app=bert'."""
    if target.kind == "Pods":
        if target.name is not None:
            return f"pod {target.name}"
        return f"pods matching {pod_selector(target)!r}"
    return f"{target.kind} {target.name}"


def is_live(pod: Mapping[str, Any]) -> bool:
    """A pod that may still run ranks: not finished, not being deleted."""
    phase = (pod.get("status") or {}).get("phase")
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return phase not in ("Succeeded", "Failed") and not deleting


def finished_condition(job: Mapping[str, Any], kind: JobKind) -> str | None:
    """The condition type (e.g. Succeeded) saying the job is over, or None while it runs."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in kind.finished_conditions and cond.get("status") == "True":
            return str(cond["type"])
    return None


def observe(
    target: Target,
    *,
    lookup: Lookup,
    job: Mapping[str, Any] | None = None,
    pods: Sequence[Mapping[str, Any]] = (),
) -> TargetObservation:
    """Decide the target's state.

    lookup: result of reading the job object (kinds PyTorchJob/TrainJob) or the named pod (kind
    Pods with a name; then `pods` is that pod); for a Pods selector there is nothing to look up
    and lookup is "found". pods: the pods matching the selector.
    """
    selector = pod_selector(target)
    what = describe(target)
    if lookup == "kind_not_installed":
        kind = JOB_KINDS[target.kind]
        return TargetObservation(
            "not_found",
            "TargetNotFound",
            f"{what} not found: the {kind.kind} kind ({kind.plural}.{kind.group}/{kind.version}) "
            "is not installed in this cluster",
            selector,
        )
    if lookup == "missing":
        return TargetObservation("not_found", "TargetNotFound", f"{what} not found", selector)

    if target.kind in JOB_KINDS and job is not None:
        over = finished_condition(job, JOB_KINDS[target.kind])
        if over is not None:
            return TargetObservation(
                "finished",
                "TargetFinished",
                f"{what} has already finished ({over}); there is nothing left to diagnose",
                selector,
            )

    live = tuple(sorted(str(p["metadata"]["name"]) for p in pods if is_live(p)))
    if target.kind == "Pods" and target.name is not None and not live:
        return TargetObservation(
            "finished",
            "TargetFinished",
            f"{what} has already finished; there is nothing left to diagnose",
            selector,
        )
    if not live:
        if target.kind == "Pods":
            return TargetObservation(
                "not_found", "TargetNotFound", f"no running pods match {selector!r}", selector
            )
        return TargetObservation(
            "waiting_for_pods",
            "WaitingForPods",
            f"{what} exists but has no running pods yet (selector {selector!r})",
            selector,
        )
    noun = "pod" if len(live) == 1 else "pods"
    return TargetObservation(
        "found", "TargetFound", f"{what}: {len(live)} {noun} found", selector, live
    )
