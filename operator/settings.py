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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import kopf
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from perfdiag import __version__
from perfdiag.api.validation import validation_problems

PREFIX = "perfdiag.io"
FINALIZER = f"{PREFIX}/finalizer"
DIFFBASE_KEY = "last-handled-configuration"
PLAN_ANNOTATION = (
    f"{PREFIX}/plan"  # on target pods: the Plan JSON the hooks read (docs/design.md §3)
)
INJECT_LABEL = f"{PREFIX}/inject"  # "true" on a pod (template): the webhook injects perfdiag
INJECTED_ANNOTATION = f"{PREFIX}/injected"  # set by the webhook: the perfdiag version injected
COMPONENT = "perfdiag-operator"

RECHECK_ENV = "PERFDIAG_RECHECK_SECONDS"
DEFAULT_RECHECK_SECONDS = 15.0
CAPTURE_LEAD_ENV = "PERFDIAG_CAPTURE_LEAD_SECONDS"
DEFAULT_CAPTURE_LEAD_SECONDS = 90.0
"""How far ahead of the ranks a capture window begins (a triggered one, and a one-shot one whose
step rate was measured), in seconds at the job's step rate: the kubelet rewrites a pod's
downward-API file (where the hooks read the plan) at its periodic sync, within about a minute of
the annotation changing, and the step counts the operator saw are a few seconds old (the
agents' uploads, the recheck)."""
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


@dataclass(frozen=True)
class WebhookConfig:
    """Where the pod mutating webhook is served (kopf.WebhookServer) and how the API server
    reaches it. Unset port: no webhook is served by this operator process."""

    port: int
    cert_file: Path
    key_file: Path
    ca_file: Path | None = None  # the CA the API server verifies us with (caBundle)
    addr: str = "0.0.0.0"  # listening address
    host: str | None = None  # host name or address in the webhook URL; default: addr
    configuration: str = "perfdiag.io"  # name of the MutatingWebhookConfiguration kopf manages
    # False (PERFDIAG_WEBHOOK_MANAGE=false, the Helm chart): someone else owns the configuration
    # and kopf must not create or patch one (the chart's RBAC does not allow it).
    manage: bool = True


@dataclass(frozen=True)
class OperatorConfig:
    """What `perfdiag operator` flags (or PERFDIAG_* variables under `kopf run`) set."""

    recheck_seconds: float = DEFAULT_RECHECK_SECONDS
    image: str = DEFAULT_IMAGE  # the perfdiag image: init container, agent sidecar, analyzer Job
    storage: str | None = None  # default storage root, s3://bucket/prefix (PERFDIAG_STORAGE)
    storage_secret: str = DEFAULT_STORAGE_SECRET  # Secret (per namespace) with the AWS_* vars
    # S3 endpoint and region given to the agents and the analyzer Job (PERFDIAG_STORAGE_ENDPOINT,
    # PERFDIAG_STORAGE_REGION), so the namespaces' Secrets need only the credentials.
    storage_endpoint: str | None = None
    storage_region: str | None = None
    webhook: WebhookConfig | None = None
    agent_resources: Resources = field(default_factory=lambda: DEFAULT_AGENT_RESOURCES)
    analyzer_resources: Resources = field(default_factory=lambda: DEFAULT_ANALYZER_RESOURCES)
    analyzer_deadline_seconds: int = 900
    analyzer_ttl_seconds: int = 3600
    capture_lead_seconds: float = DEFAULT_CAPTURE_LEAD_SECONDS  # the capture window's lead

    @classmethod
    def from_env(cls) -> OperatorConfig:
        env = os.environ
        config = cls()
        raw = env.get(RECHECK_ENV)
        if raw is not None:
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{RECHECK_ENV}={raw!r} is not a number of seconds") from None
            if not 0.1 <= value <= 3600:
                raise ValueError(f"{RECHECK_ENV}={raw!r}: expected 0.1 to 3600 seconds")
            config = replace(config, recheck_seconds=value)
        raw = env.get(CAPTURE_LEAD_ENV)
        if raw is not None:
            try:
                lead = float(raw)
            except ValueError:
                raise ValueError(f"{CAPTURE_LEAD_ENV}={raw!r} is not a number of seconds") from None
            if not 0 <= lead <= 3600:
                raise ValueError(f"{CAPTURE_LEAD_ENV}={raw!r}: expected 0 to 3600 seconds")
            config = replace(config, capture_lead_seconds=lead)
        if env.get("PERFDIAG_IMAGE"):
            config = replace(config, image=env["PERFDIAG_IMAGE"])
        if env.get("PERFDIAG_STORAGE"):
            config = replace(config, storage=env["PERFDIAG_STORAGE"].rstrip("/"))
        if env.get("PERFDIAG_STORAGE_SECRET"):
            config = replace(config, storage_secret=env["PERFDIAG_STORAGE_SECRET"])
        if env.get("PERFDIAG_STORAGE_ENDPOINT"):
            config = replace(config, storage_endpoint=env["PERFDIAG_STORAGE_ENDPOINT"])
        if env.get("PERFDIAG_STORAGE_REGION"):
            config = replace(config, storage_region=env["PERFDIAG_STORAGE_REGION"])
        if env.get("PERFDIAG_AGENT_RESOURCES"):
            agent = _resources("PERFDIAG_AGENT_RESOURCES", env["PERFDIAG_AGENT_RESOURCES"])
            config = replace(config, agent_resources=agent)
        if env.get("PERFDIAG_ANALYZER_RESOURCES"):
            analyzer = _resources("PERFDIAG_ANALYZER_RESOURCES", env["PERFDIAG_ANALYZER_RESOURCES"])
            config = replace(config, analyzer_resources=analyzer)
        if env.get(DEADLINE_ENV):
            deadline = _bounded_int(DEADLINE_ENV, env[DEADLINE_ENV], 1, 7 * 86400)
            config = replace(config, analyzer_deadline_seconds=deadline)
        if env.get(TTL_ENV):
            config = replace(
                config, analyzer_ttl_seconds=_bounded_int(TTL_ENV, env[TTL_ENV], 0, 30 * 86400)
            )
        return replace(config, webhook=_webhook_from_env())


DEADLINE_ENV = "PERFDIAG_ANALYZER_DEADLINE_SECONDS"
TTL_ENV = "PERFDIAG_ANALYZER_TTL_SECONDS"
_INT = TypeAdapter(int)


def _resources(variable: str, raw: str) -> Resources:
    try:
        return Resources.model_validate_json(raw)
    except ValidationError as exc:
        raise ValueError(
            f"{variable}={raw!r} is not a resources object "
            f'({{"requests": {{...}}, "limits": {{...}}}}): {validation_problems(exc, limit=3)}'
        ) from None


def _bounded_int(variable: str, raw: str, low: int, high: int) -> int:
    try:
        value = _INT.validate_json(raw.strip())
    except ValidationError:
        raise ValueError(f"{variable}={raw!r} is not a whole number of seconds") from None
    if not low <= value <= high:
        raise ValueError(f"{variable}={raw!r}: expected {low} to {high} seconds")
    return value


def _webhook_from_env() -> WebhookConfig | None:
    """PERFDIAG_WEBHOOK_PORT (0: any free port), _CERT, _KEY, optional _CA, _ADDR, _HOST."""
    env = os.environ
    port = env.get("PERFDIAG_WEBHOOK_PORT")
    if port is None:
        return None
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"PERFDIAG_WEBHOOK_PORT={port!r} is not a port number")
    cert, key = env.get("PERFDIAG_WEBHOOK_CERT"), env.get("PERFDIAG_WEBHOOK_KEY")
    if not cert or not key:
        raise ValueError(
            "PERFDIAG_WEBHOOK_PORT is set: PERFDIAG_WEBHOOK_CERT and PERFDIAG_WEBHOOK_KEY must "
            "name the webhook's TLS certificate and key files"
        )
    ca = env.get("PERFDIAG_WEBHOOK_CA")
    manage = env.get("PERFDIAG_WEBHOOK_MANAGE", "true").strip().lower()
    if manage not in ("true", "false"):
        raise ValueError(f"PERFDIAG_WEBHOOK_MANAGE={manage!r}: expected true or false")
    return WebhookConfig(
        port=int(port),
        cert_file=Path(cert),
        key_file=Path(key),
        ca_file=Path(ca) if ca else None,
        addr=env.get("PERFDIAG_WEBHOOK_ADDR", "0.0.0.0"),
        host=env.get("PERFDIAG_WEBHOOK_HOST") or None,
        manage=manage == "true",
    )


def configure(settings: kopf.OperatorSettings) -> None:
    """Apply perfdiag's kopf settings (called from the startup handler)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key=DIFFBASE_KEY
    )
    # kopf's own log lines ("Handler ... succeeded") are not posted as Events; the operator posts
    # its transitions itself (perfdiag.operator.kube.post_event), and kopf's errors still go out.
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
