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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import kopf

from perfdiag import __version__

PREFIX = "perfdiag.io"
FINALIZER = f"{PREFIX}/finalizer"
DIFFBASE_KEY = "last-handled-configuration"
PLAN_ANNOTATION = f"{PREFIX}/plan"  # on target pods: the Plan JSON the hooks read (DESIGN.md §3)
INJECT_LABEL = f"{PREFIX}/inject"  # "true" on a pod (template): the webhook injects perfdiag
INJECTED_ANNOTATION = f"{PREFIX}/injected"  # set by the webhook: the perfdiag version injected
COMPONENT = "perfdiag-operator"

RECHECK_ENV = "PERFDIAG_RECHECK_SECONDS"
DEFAULT_RECHECK_SECONDS = 15.0
DEFAULT_IMAGE = f"ghcr.io/perfdiag/perfdiag:{__version__}"
DEFAULT_STORAGE_SECRET = "perfdiag-storage"


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


@dataclass(frozen=True)
class OperatorConfig:
    """What `perfdiag operator` flags (or PERFDIAG_* variables under `kopf run`) set."""

    recheck_seconds: float = DEFAULT_RECHECK_SECONDS
    image: str = DEFAULT_IMAGE  # the perfdiag image: init container, agent sidecar, analyzer Job
    storage: str | None = None  # default storage root, s3://bucket/prefix (PERFDIAG_STORAGE)
    storage_secret: str = DEFAULT_STORAGE_SECRET  # Secret (per namespace) with the AWS_* vars
    webhook: WebhookConfig | None = None
    analyzer_deadline_seconds: int = 900
    analyzer_ttl_seconds: int = 3600

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
        if env.get("PERFDIAG_IMAGE"):
            config = replace(config, image=env["PERFDIAG_IMAGE"])
        if env.get("PERFDIAG_STORAGE"):
            config = replace(config, storage=env["PERFDIAG_STORAGE"].rstrip("/"))
        if env.get("PERFDIAG_STORAGE_SECRET"):
            config = replace(config, storage_secret=env["PERFDIAG_STORAGE_SECRET"])
        return replace(config, webhook=_webhook_from_env())


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
    return WebhookConfig(
        port=int(port),
        cert_file=Path(cert),
        key_file=Path(key),
        ca_file=Path(ca) if ca else None,
        addr=env.get("PERFDIAG_WEBHOOK_ADDR", "0.0.0.0"),
        host=env.get("PERFDIAG_WEBHOOK_HOST") or None,
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
    """Serve the admission webhooks with TLS and let kopf keep the MutatingWebhookConfiguration
    `webhook.configuration` pointing at this server (created if absent)."""
    settings.admission.server = kopf.WebhookServer(
        addr=webhook.addr,
        port=webhook.port or None,
        host=webhook.host,
        certfile=str(webhook.cert_file),
        pkeyfile=str(webhook.key_file),
        cafile=str(webhook.ca_file) if webhook.ca_file else None,
    )
    settings.admission.managed = webhook.configuration


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
