"""The PerfDiagnosis custom resource (docs/design.md §3): spec and status as pydantic models.

These models are the single source of the CRD: `perfdiag crd` renders crds/perfdiagnosis.yaml
from them (perfdiag.api.crd), so descriptions, defaults, bounds and the CEL rules the API server
enforces are all written here. Field names are snake_case in Python and camelCase on the wire.

Every CEL rule has a Python twin (a model validator) so a manifest the API server rejects is
also rejected by `PerfDiagnosisSpec.model_validate`; tests/api/ keeps the two in agreement.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic.alias_generators import to_camel

from perfdiag.api.plan import MAX_CAPTURE_STEPS, Activity
from perfdiag.api.thresholds import ExpectedRanges, Thresholds
from perfdiag.api.trigger import (
    DEFAULT_BASELINE_STEPS,
    MAX_BASELINE_STEPS,
    MAX_PERCENT,
    MIN_BASELINE_STEPS,
    Slowdown,
    SlowdownRule,
)
from perfdiag.api.verdict import FindingCategory, FindingKind, VerdictStatus

GROUP = "perfdiag.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PerfDiagnosis"
PLURAL = "perfdiagnoses"
SINGULAR = "perfdiagnosis"
SHORT_NAMES = ("pdiag",)
CATEGORIES = ("perfdiag",)

TargetKind = Literal["PyTorchJob", "TrainJob", "Pods"]
Phase = Literal["Pending", "Watching", "Capturing", "Analyzing", "Succeeded", "Failed"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})
ConditionStatus = Literal["True", "False", "Unknown"]

# RFC 1123 subdomain: what Kubernetes accepts as an object name.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# metav1.Condition's reason pattern.
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
MAX_TIMEOUT_SECONDS = 86_400
ALL_ACTIVITIES: tuple[Activity, ...] = ("cpu", "cuda")
MAX_LIST = 64  # bounds on lists and maps keep the CEL cost estimate of equality rules small


def cel(
    rule: str, message: str, field_path: str | None = None, reason: str | None = None
) -> dict[str, str]:
    """One entry of x-kubernetes-validations."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class CrdModel(BaseModel):
    """camelCase on the wire, snake_case in Python; both accepted when validating."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON object as the API server stores it (camelCase, unset optionals left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ----------------------------------------------------------------------------------- spec ----


class LabelSelectorRequirement(CrdModel):
    """A label selector requirement (as in metav1.LabelSelectorRequirement)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.operator in ['In', 'NotIn'] ? size(self.values) > 0 : size(self.values) == 0",
                "values must be non-empty for operators In and NotIn, and empty for Exists and "
                "DoesNotExist",
                ".values",
            )
        )
    )

    key: str = Field(min_length=1, max_length=317, description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the key relates to the values: In, NotIn, Exists or DoesNotExist."
    )
    values: list[str] = Field(
        default_factory=list,
        max_length=MAX_LIST,
        description="Label values; non-empty for In and NotIn, empty for Exists and DoesNotExist.",
        json_schema_extra={"default": [], "items": {"type": "string", "maxLength": 63}},
    )

    @model_validator(mode="after")
    def _values_match_operator(self) -> LabelSelectorRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise ValueError(
                "values must be non-empty for operators In and NotIn, and empty for Exists and "
                "DoesNotExist"
            )
        return self


class LabelSelector(CrdModel):
    """A label query over the pods of the diagnosis' namespace (as metav1.LabelSelector)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "size(self.matchLabels) + size(self.matchExpressions) > 0",
                "spec.target.selector must not be empty: an empty selector matches every pod in "
                "the namespace",
            )
        )
    )

    match_labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_LIST,
        description="Labels a pod must carry, with these values.",
        json_schema_extra={
            "default": {},
            "additionalProperties": {"type": "string", "maxLength": 63},
        },
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list,
        max_length=MAX_LIST,
        description="Requirements a pod's labels must satisfy, all of them.",
        json_schema_extra={"default": []},
    )

    @model_validator(mode="after")
    def _not_empty(self) -> LabelSelector:
        if not self.match_labels and not self.match_expressions:
            raise ValueError(
                "spec.target.selector must not be empty: an empty selector matches every pod in "
                "the namespace"
            )
        return self


TARGET_NAME_REQUIRED = (
    "spec.target.name is required: the name of the PyTorchJob or TrainJob (or, for kind Pods, "
    "a pod name or spec.target.selector)"
)
TARGET_NAME_OR_SELECTOR = "spec.target.name and spec.target.selector are mutually exclusive"
TARGET_SELECTOR_PODS_ONLY = (
    "spec.target.selector is only allowed for kind Pods; a PyTorchJob or TrainJob is named by "
    "spec.target.name"
)


class Target(CrdModel):
    """The training job to diagnose: a PyTorchJob (Kubeflow training-operator v1), a TrainJob
    (Kubeflow Trainer v2) or plain pods, in the namespace of this PerfDiagnosis."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.name) || has(self.selector)",
                TARGET_NAME_REQUIRED,
                ".name",
                "FieldValueRequired",
            ),
            cel(
                "!(has(self.name) && has(self.selector))",
                TARGET_NAME_OR_SELECTOR,
                ".selector",
                "FieldValueForbidden",
            ),
            cel(
                "self.kind == 'Pods' || !has(self.selector)",
                TARGET_SELECTOR_PODS_ONLY,
                ".selector",
                "FieldValueForbidden",
            ),
        )
    )

    kind: TargetKind = Field(
        description=(
            "Kind of the target: PyTorchJob (kubeflow.org/v1; pods labelled "
            "training.kubeflow.org/job-name), TrainJob (trainer.kubeflow.org/v1alpha1; pods "
            "labelled jobset.sigs.k8s.io/jobset-name, replicated job 'node') or Pods (pods "
            "chosen by name or by selector)."
        )
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description=(
            "Name of the PyTorchJob or TrainJob; for kind Pods, the name of a single pod. "
            "Exactly one of name and selector is set."
        ),
    )
    selector: LabelSelector | None = Field(
        default=None,
        description="For kind Pods: the label selector choosing the training pods.",
    )

    @model_validator(mode="after")
    def _name_or_selector(self) -> Target:
        if self.name is None and self.selector is None:
            raise ValueError(TARGET_NAME_REQUIRED)
        if self.name is not None and self.selector is not None:
            raise ValueError(TARGET_NAME_OR_SELECTOR)
        if self.selector is not None and self.kind != "Pods":
            raise ValueError(TARGET_SELECTOR_PODS_ONLY)
        return self


class Capture(CrdModel):
    """What to record on every worker during the synchronized window."""

    steps: int = Field(
        default=10,
        ge=1,
        le=MAX_CAPTURE_STEPS,
        description=(
            "Training steps (optimizer steps) to profile on every rank, after one warm-up step. "
            f"1 to {MAX_CAPTURE_STEPS}."
        ),
    )
    activities: list[Activity] = Field(
        default_factory=lambda: list(ALL_ACTIVITIES),
        min_length=1,
        max_length=2,
        description=(
            "torch.profiler activities: cpu and/or cuda (cuda is skipped on ranks without a GPU)."
        ),
        json_schema_extra={"default": ["cpu", "cuda"], "x-kubernetes-list-type": "set"},
    )
    python_stacks: bool = Field(
        default=False,
        description="Record Python call stacks with the events (more detail, more overhead).",
    )
    timeout_seconds: int = Field(
        default=600,
        ge=10,
        le=MAX_TIMEOUT_SECONDS,
        description=(
            "How long the capture may take, from the plan reaching the workers to the last "
            "worker's upload; workers that have not reported by then are counted as missing "
            "(a stuck worker is a finding, not an error)."
        ),
    )
    keep_raw_events: bool = Field(
        default=False,
        description=(
            "Upload every worker's raw events (events.parquet) besides its behavior summary, for "
            "timelines and re-analysis; much larger than the summaries."
        ),
    )

    @model_validator(mode="after")
    def _distinct_activities(self) -> Capture:
        if len(set(self.activities)) != len(self.activities):
            raise ValueError("spec.capture.activities must not repeat an activity")
        return self


class SecretReference(CrdModel):
    """A Secret in the namespace of the PerfDiagnosis."""

    name: str = Field(
        min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="Name of the Secret."
    )


STORAGE_UNSUPPORTED = (
    "spec.storage is not supported for Kubernetes captures yet: the agents write to the "
    "operator's storage (PERFDIAG_STORAGE, set when the pods were injected); remove spec.storage"
)


class StorageOverride(CrdModel):
    """Reserved: where this diagnosis would store its capture instead of the operator's
    storage. Not supported yet: the API server refuses it."""

    bucket: str = Field(
        min_length=3,
        max_length=63,
        pattern=r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$",
        description="S3 bucket name.",
    )
    prefix: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=r"^[^/].*$",
        description=(
            "Key prefix inside the bucket (no leading '/'); the capture goes under "
            "<prefix>/<namespace>/<name>-<uid>/. Default: perfdiag."
        ),
    )
    secret_ref: SecretReference | None = Field(
        default=None,
        description=(
            "Secret holding the S3 endpoint and credentials as the standard variables "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION), given to "
            "the agents and the analyzer. Default: the operator's own storage credentials."
        ),
    )


def _unset_fields(
    model: type[BaseModel],
    name: str,
    doc: str,
    nested: dict[type[BaseModel], type[CrdModel]] | None = None,
) -> type[CrdModel]:
    """The CRD model `name` with the fields of `model` (same names, bounds and descriptions),
    optional and without a default: the analyzer applies its own default to what is unset. A
    field holding a model of `nested` holds that model's CRD model instead."""
    fields: dict[str, Any] = {}
    for field, info in model.model_fields.items():
        annotation: Any = info.annotation
        if nested and annotation in nested:
            annotation, description = nested[annotation], info.description
        else:
            description = f"{info.description} Analyzer default when unset."
        # The bounds as Field's arguments (annotated_types names them alike: ge, gt, le…).
        bounds = {key: value for item in info.metadata for key, value in asdict(item).items()}
        fields[field] = (annotation | None, Field(None, description=description, **bounds))
    return create_model(name, __base__=CrdModel, __doc__=doc, __module__=__name__, **fields)


ExpectedRangesOverride = _unset_fields(
    ExpectedRanges,
    "ExpectedRangesOverride",
    """Upper bounds of β (fraction of window time on the critical path) per category; a
    category above its bound on most ranks is a job-wide expected_range finding. 1 means no
    bound. The fields of perfdiag.api.thresholds.ExpectedRanges, each optional.""",
)

if TYPE_CHECKING:  # the fields are made at run time: statically, the model without them
    _AnalysisFields = CrdModel
else:
    _AnalysisFields = _unset_fields(
        Thresholds,
        "AnalysisFields",
        "The fields of perfdiag.api.thresholds.Thresholds, each optional.",
        {ExpectedRanges: ExpectedRangesOverride},
    )


class Analysis(_AnalysisFields):
    """Thresholds of the analysis: the fields of perfdiag.api.thresholds.Thresholds, each
    optional; an unset field uses the analyzer's default."""

    def thresholds(self) -> Thresholds:
        """The thresholds the analyzer applies: these, and its defaults for the unset ones."""
        return Thresholds.model_validate(self.to_wire())


class SlowdownTrigger(CrdModel):
    """Capture when the job slows down: its step time (the slowest rank's mean over the last
    baselineSteps steps, without the longest of them) is `percent` above its shortest recent
    value in two consecutive reports. Mirrors perfdiag.api.trigger.SlowdownRule."""

    percent: float = Field(
        gt=0.0,
        le=MAX_PERCENT,
        description=(
            "How much slower than the baseline, in percent, fires the capture: 5 = a step 5% "
            f"longer. Above 0, at most {MAX_PERCENT:g}."
        ),
    )
    baseline_steps: int = Field(
        default=DEFAULT_BASELINE_STEPS,
        ge=MIN_BASELINE_STEPS,
        le=MAX_BASELINE_STEPS,
        description=(
            "Steps per mean step time (the baseline's and the current one's); the baseline is "
            f"the shortest mean of the last 20 × baselineSteps steps. {MIN_BASELINE_STEPS} to "
            f"{MAX_BASELINE_STEPS}."
        ),
    )

    def rule(self) -> SlowdownRule:
        return SlowdownRule(percent=self.percent, baseline_steps=self.baseline_steps)


class Trigger(CrdModel):
    """When to capture, instead of at once: the operator watches the job's step time and
    captures when the rule fires (phase Watching until then)."""

    slowdown: SlowdownTrigger = Field(description="Capture on a slowdown of the job's steps.")


class PerfDiagnosisSpec(CrdModel):
    """A one-shot request: profile every worker of the target for a short synchronized window,
    then compare the workers and name the slow or stuck rank, function and cause."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.target == oldSelf.target",
                "spec.target is immutable after creation; create a new PerfDiagnosis instead",
                ".target",
            ),
            cel(
                "self.capture == oldSelf.capture",
                "spec.capture is immutable after creation; create a new PerfDiagnosis instead",
                ".capture",
            ),
            # The agents' storage is fixed when the webhook injects the pods, so a per-diagnosis
            # override cannot be honoured: refused here rather than accepted and stalled.
            cel("!has(self.storage)", STORAGE_UNSUPPORTED, ".storage", "FieldValueForbidden"),
            cel(
                "has(self.trigger) == has(oldSelf.trigger) && "
                "(!has(self.trigger) || self.trigger == oldSelf.trigger)",
                "spec.trigger is immutable after creation; create a new PerfDiagnosis instead",
                ".trigger",
            ),
        )
    )

    target: Target = Field(description="The training job to diagnose. Immutable.")
    capture: Capture = Field(
        default_factory=Capture,
        description="What to record during the window. Immutable.",
        json_schema_extra={"default": {}},
    )
    storage: StorageOverride | None = Field(
        default=None,
        description=(
            "Reserved for an override of the operator's storage. Not supported yet: refused by "
            "the API server (the agents write to the operator's storage, set when the pods were "
            "injected)."
        ),
    )
    trigger: Trigger | None = Field(
        default=None,
        description=(
            "Capture when the job slows down rather than at once (phase Watching until then). "
            "Unset: capture at once. Immutable."
        ),
    )
    analysis: Analysis = Field(
        default_factory=Analysis,
        description="Analysis thresholds; unset fields use the analyzer's defaults.",
        json_schema_extra={"default": {}},
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description=(
            "Delete this PerfDiagnosis this many seconds after it succeeded or failed (its "
            "artifacts in storage are kept). Unset: keep it."
        ),
    )

    @model_validator(mode="after")
    def _no_storage_override(self) -> PerfDiagnosisSpec:
        if self.storage is not None:
            raise ValueError(STORAGE_UNSUPPORTED)
        return self


# --------------------------------------------------------------------------------- status ----


class StatusModel(CrdModel):
    """Status is read back from the API server: tolerate fields a newer operator wrote."""

    model_config = ConfigDict(extra="ignore")


class Condition(StatusModel):
    """A condition in the shape of metav1.Condition."""

    type: str = Field(
        min_length=1,
        max_length=316,
        description=(
            "Ready, Reconciling, Stalled (kstatus), or a domain condition such as TargetResolved."
        ),
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="The .metadata.generation whose handling set the condition (the operator "
        "judges every condition again for each generation it handles).",
    )
    last_transition_time: datetime = Field(
        description="When the condition last changed from one status to another."
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON,
        description="CamelCase reason of the last transition, for machines.",
    )
    message: str = Field(default="", max_length=32768, description="Details, for people.")


class TargetStatus(StatusModel):
    """What the target resolved to."""

    selector: str | None = Field(
        default=None,
        description="Label selector of the target pods (kubectl get pods -l '<selector>').",
    )
    pods: int = Field(default=0, ge=0, description="Target pods found (not yet finished).")


class WorkersStatus(StatusModel):
    """Progress of the workers (ranks) in the capture."""

    expected: int | None = Field(
        default=None, ge=0, description="Ranks expected to take part, once known."
    )
    captured: int = Field(default=0, ge=0, description="Ranks whose capture is in storage.")
    missing: int = Field(
        default=0, ge=0, description="Ranks that did not capture by the end of the window."
    )
    reporting: int = Field(
        default=0,
        ge=0,
        description="Ranks whose agent has reported so far (expected - reporting have not).",
    )
    failed: list[int] = Field(
        default_factory=list, description="Ranks whose capture failed (see their status.json)."
    )
    stuck: list[int] = Field(
        default_factory=list,
        description="Ranks whose training step stopped advancing during the window (all ranks "
        "are then asked for their Python stacks, and the verdict says why).",
    )


class WindowStatus(StatusModel):
    """The capture window."""

    plan_id: str | None = Field(default=None, description="Id of the plan sent to the workers.")
    start_step: int | None = Field(default=None, ge=0, description="First profiled step.")
    steps: int | None = Field(default=None, ge=0, description="Steps profiled.")
    deadline: datetime | None = Field(default=None, description="The plan's deadline.")
    start_time: datetime | None = Field(default=None, description="When the plan was sent.")
    completion_time: datetime | None = Field(
        default=None, description="When the last worker finished its window."
    )


class FindingSummary(StatusModel):
    """One finding of the verdict, without its evidence (that is in verdict.json)."""

    kind: FindingKind = Field(
        description="slow_worker, slow_node, function_anomaly, expected_range, hang, hardware "
        "or imbalance."
    )
    category: FindingCategory = Field(description="Taxonomy category of the cause.")
    function: str | None = Field(default=None, description="The function involved, if any.")
    ranks: list[int] = Field(default_factory=list, description="Global ranks concerned.")
    node: str | None = Field(
        default=None,
        max_length=253,
        description="The node a slow_node finding names (added in v1; absent otherwise).",
    )
    severity: float = Field(ge=0.0, le=1.0, description="Estimated fraction of step time lost.")
    message: str = Field(description="What is wrong, where, how sure, what to check next.")


MAX_STATUS_FINDINGS = 5
"""Findings (and observations) of the verdict copied into the status; the rest are in
verdict.json."""
MAX_CULPRITS_TEXT = 256
"""Room for perfdiag.api.ranks.format_runs' longest text (its runs are cut with a count)."""


class VerdictStatusSummary(StatusModel):
    """The verdict, short; the full one is artifacts.verdict."""

    status: VerdictStatus = Field(description="healthy, degraded, hang or incomplete.")
    summary: str = Field(description="One sentence a person can act on.")
    top_findings: list[FindingSummary] = Field(
        default_factory=list,
        max_length=MAX_STATUS_FINDINGS,
        description="Most severe findings first.",
    )
    culprit_ranks: list[int] = Field(default_factory=list, description="Ranks to look at.")
    culprits: str | None = Field(
        default=None,
        max_length=MAX_CULPRITS_TEXT,
        description=(
            "culpritRanks as runs of consecutive ranks ('3', '0-3,7'; a long list is cut with "
            "its count of ranks): the Culprits column of kubectl get -o wide."
        ),
    )
    culprit_pods: list[str] = Field(default_factory=list, description="Pods of those ranks.")
    observations: list[FindingSummary] = Field(
        default_factory=list,
        max_length=MAX_STATUS_FINDINGS,
        description=(
            "Whole-job efficiency observations (kind expected_range: every rank alike spends "
            "more of its step in a category than a well-running job), most severe first: "
            "advice about the job as a whole, never a culprit nor a reason for degraded."
        ),
    )


class FiredSlowdown(StatusModel, Slowdown):
    """The slowdown that fired the capture (also the capture's trigger.json, and the verdict's
    trigger)."""

    model_config = ConfigDict(extra="ignore")


class StepTime(StatusModel):
    """The job's step time reported at a step."""

    step: int = Field(ge=0, description="The job's step.")
    step_ms: float = Field(ge=0.0, description="Its step time, ms.")


MAX_BASELINE_CANDIDATES = 32
"""Candidates for the baseline kept in status.watch (the rule's state; beyond, the oldest go)."""


class WatchStatus(StatusModel):
    """The slowdown watch (spec.trigger): the job's step time against its baseline; without
    a trigger, the step rate measured before the capture (step, stepsPerSecond)."""

    plan_id: str | None = Field(
        default=None, description="Id of the watch plan sent to the workers."
    )
    start_time: datetime | None = Field(default=None, description="When the watch plan was sent.")
    reporting: int = Field(
        default=0, ge=0, description="Ranks whose step times reached the operator."
    )
    step: int | None = Field(
        default=None, ge=0, description="The job's furthest step in the latest report."
    )
    step_ms: float | None = Field(
        default=None,
        ge=0.0,
        description=(
            "The job's current step time, ms: the slowest rank's mean over the last "
            "baselineSteps steps, without the longest of them."
        ),
    )
    rank: int | None = Field(default=None, ge=0, description="The slowest rank.")
    baseline_step_ms: float | None = Field(
        default=None, ge=0.0, description="The baseline: the shortest recent step time, ms."
    )
    baseline_step: int | None = Field(
        default=None, ge=0, description="The step at which the baseline was reported."
    )
    over: int = Field(
        default=0, ge=0, description="Consecutive reports over the threshold (2 fire it)."
    )
    rule_step: int | None = Field(
        default=None, ge=0, description="The step of the last report the rule judged."
    )
    candidates: list[StepTime] = Field(
        default_factory=list,
        max_length=MAX_BASELINE_CANDIDATES,
        description=(
            "The rule's state: the reports that may still become the baseline (ascending step "
            "times, in step order; the first is the baseline)."
        ),
    )
    rate_step: int | None = Field(
        default=None, ge=0, description="The step seen at rateTime (for the step rate)."
    )
    rate_time: datetime | None = Field(default=None, description="When rateStep was seen.")
    steps_per_second: float | None = Field(
        default=None, ge=0.0, description="The job's step rate, once known."
    )
    slowdown: FiredSlowdown | None = Field(
        default=None, description="The slowdown that fired the capture, once it fired."
    )


class AnalysisStatus(StatusModel):
    """The thresholds the analyzer Job was given: spec.analysis when the Job was created. A
    verdict is judged once; a later change of spec.analysis does not judge it again (condition
    ThresholdsApplied)."""

    generation: int = Field(
        ge=0, description="The .metadata.generation whose spec.analysis the analyzer Job got."
    )
    thresholds: dict[str, Any] = Field(
        default_factory=dict,
        description="That spec.analysis (its set fields; the analyzer's defaults for the rest).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class Artifacts(StatusModel):
    """Where the capture and the results are (URIs: s3://bucket/key or a path)."""

    prefix: str | None = Field(default=None, description="The capture's storage prefix.")
    verdict: str | None = Field(default=None, description="verdict.json.")
    report: str | None = Field(default=None, description="report.html.")
    timeline: str | None = Field(default=None, description="timeline.json.gz.")


class PerfDiagnosisStatus(StatusModel):
    """Observed state, written by the operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation this status was computed for."
    )
    phase: Phase = Field(
        default="Pending",
        description=(
            "Pending, Watching (spec.trigger: waiting for a slowdown; without a trigger: "
            "measuring the step rate before the capture), Capturing, Analyzing, "
            "Succeeded or Failed. Never goes backwards."
        ),
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Reconciling and Stalled (kstatus semantics) and domain conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    target: TargetStatus | None = Field(default=None, description="What the target resolved to.")
    workers: WorkersStatus | None = Field(default=None, description="Workers of the capture.")
    watch: WatchStatus | None = Field(
        default=None,
        description=(
            "The slowdown watch (spec.trigger), or the step rate measured before a one-shot "
            "capture."
        ),
    )
    window: WindowStatus | None = Field(default=None, description="The capture window.")
    analysis: AnalysisStatus | None = Field(
        default=None, description="The thresholds the analyzer Job was given, once it was."
    )
    verdict: VerdictStatusSummary | None = Field(default=None, description="The verdict, short.")
    artifacts: Artifacts | None = Field(default=None, description="URIs of the results.")
    start_time: datetime | None = Field(default=None, description="When reconciling started.")
    completion_time: datetime | None = Field(
        default=None, description="When the diagnosis succeeded or failed."
    )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class PerfDiagnosis(CrdModel):
    """PerfDiagnosis finds out why a distributed PyTorch training job is slow or stuck while it
    runs: it profiles all workers for a short synchronized window, compares them, and names the
    slow or stuck rank, function and likely cause. Read the result with
    `kubectl get pdiag` / `kubectl describe pdiag NAME`."""

    model_config = ConfigDict(extra="ignore")

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: PerfDiagnosisSpec
    status: PerfDiagnosisStatus | None = None
