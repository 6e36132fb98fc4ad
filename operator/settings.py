"""kopf settings and the operator's own configuration.

Everything kopf writes on objects lives under perfdiag.io/, not kopf's defaults
(kopf.zalando.org/...): the finalizer, the handlers' progress annotations and the diff base
(the last handled spec). A cluster can then tell perfdiag's bookkeeping from other kopf
operators', and `kubectl get pdiag -o yaml` shows one prefix.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, ClassVar

import kopf
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import from_json
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from perfdiag import __version__

PREFIX = "perfdiag.io"
FINALIZER = f"{PREFIX}/finalizer"
DIFFBASE_KEY = "last-handled-configuration"
PLAN_ANNOTATION = (
    f"{PREFIX}/plan"  # on target pods: the Plan JSON the hooks read (docs/design.md §3)
)
DIAGNOSIS_ANNOTATION = f"{PREFIX}/diagnosis"  # beside the plan: which PerfDiagnosis wrote it
INJECT_LABEL = f"{PREFIX}/inject"  # "true" on a pod (template): the webhook injects perfdiag
INJECTED_ANNOTATION = f"{PREFIX}/injected"  # set by the webhook: the perfdiag version injected
COMPONENT = "perfdiag-operator"

RECHECK_ENV = "PERFDIAG_RECHECK_SECONDS"
DEFAULT_RECHECK_SECONDS = 15.0
RECHECK_SECONDS_RANGE = (0.1, 3600.0)  # also of `perfdiag operator --recheck-seconds`
CAPTURE_LEAD_ENV = "PERFDIAG_CAPTURE_LEAD_SECONDS"
DEFAULT_CAPTURE_LEAD_SECONDS = 10.0
"""How far ahead of the ranks a capture window begins (a triggered one, and a one-shot one whose
step rate was measured), in seconds at the job's step rate, counted from the ranks' step as the
operator extrapolates it to now; at least the agents' plan poll + PLAN_DELIVERY_MARGIN_SECONDS
(OperatorConfig.effective_capture_lead). It covers the plan's way to the hooks of pods whose
agent follows the pod's plan in storage (injection.follows_pod_plan): the operator's writes of
the pods' plan objects (concurrent, well under a second for 1,000 pods), the agent's read every
AGENT_PLAN_POLL seconds (collector/pod_plan.py), the hook's poll every 0.5 s, with a margin for
a loaded node."""
AGENT_PLAN_POLL_ENV = "PERFDIAG_AGENT_PLAN_POLL_SECONDS"
DEFAULT_AGENT_PLAN_POLL_SECONDS = 5.0
"""Seconds between two reads of its pod's plan by each injected agent (`perfdiag agent
--plan-poll`): one small GET per pod each time, diagnosis or not, so pods / poll requests a
second on the storage (1,000 pods: 200/s). Raise it for large jobs; the lead follows. At most
20 s: the hooks trust the agent's copy for spool.AGENT_PLAN_FRESH_S (30 s) after a read."""
PLAN_DELIVERY_MARGIN_SECONDS = 5.0
"""The lead beyond the agents' plan poll: the operator's writes, the hook's poll, a loaded node."""
KUBELET_CAPTURE_LEAD_SECONDS = 90.0
"""The lead when some target pod's agent does not follow its plan in storage (injected by an
earlier perfdiag): the plan then reaches those hooks only when the kubelet rewrites the
downward-API file, which it does on the pod's update within about a second when its
event-driven remount works, and otherwise at its periodic resync of the pod: `syncFrequency`
(1 m by default) with a jitter factor of 0.5, 60–90 s (docs/operator.md, "How the plan reaches
the ranks")."""
DEADLINE_ENV = "PERFDIAG_ANALYZER_DEADLINE_SECONDS"
TTL_ENV = "PERFDIAG_ANALYZER_TTL_SECONDS"
METRICS_PORT_ENV = "PERFDIAG_METRICS_PORT"
METRICS_ADDR_ENV = "PERFDIAG_METRICS_ADDR"
WEBHOOK_ENV = "PERFDIAG_WEBHOOK"
"""The webhook's variables are PERFDIAG_WEBHOOK_<key>, a key per WebhookConfig field (its alias)."""
DEFAULT_IMAGE = f"ghcr.io/perfdiag/perfdiag:{__version__}"
DEFAULT_STORAGE_SECRET = "perfdiag-storage"


class Resources(BaseModel):
    """A container's resources (core/v1 ResourceRequirements: requests and limits), as the chart
    renders them into PERFDIAG_AGENT_RESOURCES / PERFDIAG_ANALYZER_RESOURCES (JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: dict[str, str | int | float] = Field(default_factory=dict)
    limits: dict[str, str | int | float] = Field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {}
        for key, values in (("requests", self.requests), ("limits", self.limits)):
            if values:
                wire[key] = {name: str(value) for name, value in values.items()}
        return wire


DEFAULT_AGENT_RESOURCES = Resources(
    requests={"cpu": "100m", "memory": "256Mi"}, limits={"memory": "1Gi"}
)
DEFAULT_ANALYZER_RESOURCES = Resources(
    requests={"cpu": "500m", "memory": "512Mi"}, limits={"memory": "4Gi"}
)


def _json_text(value: Any) -> Any:
    """A variable's JSON text parsed, so that pydantic reports a problem inside it by its path."""
    return from_json(value) if isinstance(value, str) else value


def _true_or_false(value: Any) -> Any:
    """Only `true` or `false` (any case): pydantic's bool would also take yes/no/on/off/1/0."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word not in ("true", "false"):
            raise ValueError("expected true or false")
        return word == "true"
    return value


ResourcesJson = Annotated[Resources, NoDecode, BeforeValidator(_json_text)]
TrueOrFalse = Annotated[bool, BeforeValidator(_true_or_false)]


class WebhookConfig(BaseModel):
    """Where the pod mutating webhook is served (kopf.WebhookServer) and how the API server
    reaches it: PERFDIAG_WEBHOOK_PORT (0: any free port), _CERT, _KEY, optional _CA, _ADDR,
    _HOST, _MANAGE. Unset port: no webhook is served by this operator process."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    port: int = Field(ge=0, le=65535, validation_alias="PORT")
    cert_file: Path = Field(
        validation_alias="CERT",
        description="the webhook's TLS certificate file, needed with PERFDIAG_WEBHOOK_PORT",
    )
    key_file: Path = Field(
        validation_alias="KEY",
        description="the webhook's TLS key file, needed with PERFDIAG_WEBHOOK_PORT",
    )
    # The CA the API server verifies us with (caBundle).
    ca_file: Path | None = Field(None, validation_alias="CA")
    addr: str = Field("0.0.0.0", validation_alias="ADDR")  # listening address
    # Host name or address in the webhook URL; default: addr.
    host: str | None = Field(None, validation_alias="HOST")
    # False (PERFDIAG_WEBHOOK_MANAGE=false, the Helm chart): someone else owns the configuration
    # and kopf must not create or patch one (the chart's RBAC does not allow it).
    manage: TrueOrFalse = Field(True, validation_alias="MANAGE")
    configuration: ClassVar[str] = "perfdiag.io"  # the MutatingWebhookConfiguration kopf manages


class OperatorConfig(BaseSettings):
    """What `perfdiag operator` flags or the PERFDIAG_* variables (also under `kopf run`) set:
    each field reads the variable its alias names; an empty variable counts as unset."""

    model_config = SettingsConfigDict(
        frozen=True,
        case_sensitive=True,
        env_ignore_empty=True,
        env_nested_delimiter="_",  # PERFDIAG_WEBHOOK_PORT is the webhook's PORT
    )

    recheck_seconds: float = Field(
        DEFAULT_RECHECK_SECONDS,
        ge=RECHECK_SECONDS_RANGE[0],
        le=RECHECK_SECONDS_RANGE[1],
        validation_alias=RECHECK_ENV,
    )
    # The perfdiag image: init container, agent sidecar, analyzer Job.
    image: str = Field(DEFAULT_IMAGE, validation_alias="PERFDIAG_IMAGE")
    # Default storage root, s3://bucket/prefix.
    storage: str | None = Field(None, validation_alias="PERFDIAG_STORAGE")
    # Secret (per namespace) with the AWS_* variables.
    storage_secret: str = Field(DEFAULT_STORAGE_SECRET, validation_alias="PERFDIAG_STORAGE_SECRET")
    # S3 endpoint and region given to the agents and the analyzer Job, so the namespaces'
    # Secrets need only the credentials.
    storage_endpoint: str | None = Field(None, validation_alias="PERFDIAG_STORAGE_ENDPOINT")
    storage_region: str | None = Field(None, validation_alias="PERFDIAG_STORAGE_REGION")
    webhook: WebhookConfig | None = Field(None, validation_alias=WEBHOOK_ENV)
    agent_resources: ResourcesJson = Field(
        DEFAULT_AGENT_RESOURCES, validation_alias="PERFDIAG_AGENT_RESOURCES"
    )
    analyzer_resources: ResourcesJson = Field(
        DEFAULT_ANALYZER_RESOURCES, validation_alias="PERFDIAG_ANALYZER_RESOURCES"
    )
    analyzer_deadline_seconds: int = Field(900, ge=1, le=7 * 86400, validation_alias=DEADLINE_ENV)
    analyzer_ttl_seconds: int = Field(3600, ge=0, le=30 * 86400, validation_alias=TTL_ENV)
    # The capture window's lead.
    capture_lead_seconds: float = Field(
        DEFAULT_CAPTURE_LEAD_SECONDS, ge=0, le=3600, validation_alias=CAPTURE_LEAD_ENV
    )
    agent_plan_poll_seconds: float = Field(
        DEFAULT_AGENT_PLAN_POLL_SECONDS, ge=0.1, le=20, validation_alias=AGENT_PLAN_POLL_ENV
    )
    # Prometheus metrics at http://<addr>:<port>/metrics (perfdiag.operator.metrics); unset
    # port: none served, 0: any free port.
    metrics_port: int | None = Field(None, ge=0, le=65535, validation_alias=METRICS_PORT_ENV)
    metrics_addr: str = Field("0.0.0.0", validation_alias=METRICS_ADDR_ENV)

    @property
    def effective_capture_lead(self) -> float:
        """The capture lead, at least what the agents' plan poll needs."""
        return max(
            self.capture_lead_seconds,
            self.agent_plan_poll_seconds + PLAN_DELIVERY_MARGIN_SECONDS,
        )

    @field_validator("storage")
    @classmethod
    def _no_trailing_slash(cls, storage: str | None) -> str | None:
        return storage.rstrip("/") if storage else storage

    @field_validator("webhook", mode="before")
    @classmethod
    def _served_with_a_port(cls, webhook: Any) -> Any:
        """PERFDIAG_WEBHOOK_* without PERFDIAG_WEBHOOK_PORT: no webhook (its other variables
        only say how to serve one)."""
        return None if isinstance(webhook, dict) and "PORT" not in webhook else webhook

    @classmethod
    def from_env(cls) -> OperatorConfig:
        """The configuration the environment sets; a ValueError naming each bad variable."""
        try:
            return cls()
        except ValidationError as exc:
            raise ValueError(_explain(exc)) from None


def _explain(exc: ValidationError) -> str:
    """Each bad variable once, with its value and what is wrong in it, then the missing ones."""
    bad: dict[str, list[str]] = {}
    unset = []
    for error in exc.errors():
        variable, field, path = _variable_of(error["loc"])
        if error["type"] == "missing":
            why = f" ({field.description})" if field is not None and field.description else ""
            unset.append(f"{variable} is not set{why}")
        else:
            where = f"{'.'.join(str(part) for part in path)}: " if path else ""
            message = error["msg"].removeprefix("Value error, ")
            bad.setdefault(variable, []).append(f"{where}{message}")
    values = [f"{name}={os.environ.get(name)!r}: {'; '.join(found)}" for name, found in bad.items()]
    return "; ".join([*values, *unset])


def _variable_of(loc: tuple[int | str, ...]) -> tuple[str, FieldInfo | None, list[int | str]]:
    """The variable an error's location stands for, its field, and the path inside its value."""
    first, *path = loc
    field = OperatorConfig.model_fields.get(str(first))  # else `first` is the variable already
    variable = str(field.validation_alias) if field is not None else str(first)
    if variable == WEBHOOK_ENV and path:  # PERFDIAG_WEBHOOK_<key>
        key = str(path.pop(0))
        fields = WebhookConfig.model_fields.values()
        return (
            f"{variable}_{key}",
            next((f for f in fields if f.validation_alias == key), None),
            path,
        )
    return variable, field, path


def configure(settings: kopf.OperatorSettings) -> None:
    """Apply perfdiag's kopf settings (called from the startup handler)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key=DIFFBASE_KEY
    )
    # kopf's own log lines ("Handler ... succeeded") are not posted as Events; the operator posts
    # its transitions itself (perfdiag.operator.kube.Kube.post_event), and kopf's errors still go out.
    settings.posting.level = logging.WARNING
    # Reconnect watches regularly so a silently dropped connection is noticed within minutes.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330


def configure_webhook(settings: kopf.OperatorSettings, webhook: WebhookConfig) -> None:
    """Serve the admission webhooks with TLS and, unless `webhook.manage` is off, let kopf keep
    the MutatingWebhookConfiguration `webhook.configuration` pointing at this server (created if
    absent). Off (the Helm chart): kopf touches no configuration; without that, kopf would try to
    create one, get 403 Forbidden from the chart's RBAC and stop the operator."""
    settings.admission.server = kopf.WebhookServer(
        addr=webhook.addr,
        port=webhook.port or None,
        host=webhook.host,
        certfile=str(webhook.cert_file),
        pkeyfile=str(webhook.key_file),
        cafile=str(webhook.ca_file) if webhook.ca_file else None,
    )
    settings.admission.managed = webhook.configuration if webhook.manage else None


class _NoWebhookServer:
    """An admission "server" that serves nothing: kopf refuses to run with admission handlers
    and no server, and an operator process without webhook settings (e.g. one replica of
    several, or the tests of the PerfDiagnosis handlers alone) must still run."""

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        await asyncio.Event().wait()  # forever (cancelled when the operator stops)
        yield {}


def configure_without_webhook(settings: kopf.OperatorSettings) -> None:
    settings.admission.server = _NoWebhookServer()
    settings.admission.managed = None
