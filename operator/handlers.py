"""kopf handlers for PerfDiagnosis. Thin: each hands the object to the Reconciler.

Start with `perfdiag operator`, or `kopf run -m perfdiag.operator.handlers --all-namespaces`.

- create / update of the spec / resume (operator start): reconcile now.
- A recheck loop reconciles every unfinished diagnosis every PERFDIAG_RECHECK_SECONDS, so a
  missing target that appears later is found (and a TTL is enforced). It reads a kopf index,
  not kopf timers: kopf puts a finalizer on every object a timer or daemon serves, and a
  finalizer without a running operator blocks deletion forever.
- The finalizer (perfdiag.io/finalizer) is only on objects that have something to clean up
  when deleted (status.needs_cleanup: a capture or an analysis in progress); deleting one
  removes its plan from the target pods and deletes its analyzer Job.
- The pod mutating webhook (perfdiag.operator.webhook) is served when PERFDIAG_WEBHOOK_PORT is
  set (settings.configure_webhook).
- Prometheus metrics (perfdiag.operator.metrics) are served at /metrics on PERFDIAG_METRICS_PORT
  when it is set; the per-diagnosis gauges are read at each scrape from a kopf index of every
  PerfDiagnosis (kept by kopf from its watch: nothing is remembered between scrapes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from pydantic import ValidationError

from perfdiag.api.diagnosis import GROUP, PLURAL, VERSION, PerfDiagnosisSpec, PerfDiagnosisStatus
from perfdiag.operator import settings as operator_settings
from perfdiag.operator import webhook  # noqa: F401  (registers the pod mutating webhook)
from perfdiag.operator.kube import Kube, NoCredentials, new_api_client
from perfdiag.operator.metrics import DiagnosesCollector, DiagnosisView, OperatorMetrics, view_of
from perfdiag.operator.metrics_server import MetricsServer
from perfdiag.operator.reconcile import Reconciler
from perfdiag.operator.status import needs_cleanup, needs_recheck

log = logging.getLogger("perfdiag.operator")
RESOURCE = (GROUP, VERSION, PLURAL)


def _status(status: Mapping[str, Any] | None) -> PerfDiagnosisStatus | None:
    if not status:
        return None
    try:
        return PerfDiagnosisStatus.model_validate(dict(status))
    except ValidationError:
        return None


def _spec(spec: Mapping[str, Any] | None) -> PerfDiagnosisSpec | None:
    try:
        return PerfDiagnosisSpec.model_validate(dict(spec or {}))
    except ValidationError:
        return None


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: its service account; elsewhere: $KUBECONFIG, read when the operator starts."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(
        **kwargs
    ) or kopf.login_with_kubeconfig(**kwargs)
    return info


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, **kwargs: Any) -> None:
    operator_settings.configure(settings)
    diagnoses_to_recheck: kopf.Index[None, tuple[str, str]] = kwargs["diagnoses_to_recheck"]
    diagnoses: kopf.Index[None, DiagnosisView] = kwargs["diagnosis_views"]
    config = memo.get("config") or operator_settings.OperatorConfig.from_env()
    if config.webhook is not None:
        operator_settings.configure_webhook(settings, config.webhook)
    else:
        operator_settings.configure_without_webhook(settings)
        log.warning(
            "no pod webhook served by this operator (PERFDIAG_WEBHOOK_PORT unset): new pods are "
            "not injected unless another process serves it"
        )
    try:
        api_client = new_api_client()
    except NoCredentials as exc:
        raise kopf.PermanentError(str(exc)) from exc  # retrying will not make credentials appear
    metrics = OperatorMetrics()
    metrics.registry.register(DiagnosesCollector(lambda: list(diagnoses.get(None, ()))))
    if config.metrics_port is not None:
        server = MetricsServer(metrics.registry, config.metrics_addr, config.metrics_port)
        await server.start()
        memo["metrics_server"] = server
        log.info("serving Prometheus metrics at %s", server.url)
    reconciler = Reconciler(Kube(api_client), config, metrics=metrics)
    memo["config"] = config
    memo["metrics"] = metrics
    memo["reconciler"] = reconciler
    memo["recheck_task"] = asyncio.create_task(
        _recheck_forever(diagnoses_to_recheck, reconciler, config.recheck_seconds)
    )
    log.info("perfdiag operator started; rechecking every %gs", config.recheck_seconds)


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    task = memo.get("recheck_task")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    server = memo.get("metrics_server")
    if server is not None:
        await server.stop()


async def _recheck_forever(
    index: kopf.Index[None, tuple[str, str]], reconciler: Reconciler, interval: float
) -> None:
    while True:
        await asyncio.sleep(interval)
        for namespace, name in sorted(set(index.get(None, ()))):
            try:
                await asyncio.to_thread(reconciler.reconcile, namespace, name)
            except Exception:  # one object's trouble must not stop the loop for the others
                log.exception("recheck of %s/%s failed", namespace, name)


def _should_recheck(spec: Mapping[str, Any], status: Mapping[str, Any], **_: Any) -> bool:
    return needs_recheck(_status(status), _spec(spec))


@kopf.index(*RESOURCE, when=_should_recheck)
def diagnoses_to_recheck(namespace: str | None, name: str, **_: Any) -> tuple[str, str]:
    return (namespace or "", name)


@kopf.index(*RESOURCE)
def diagnosis_views(
    namespace: str | None,
    name: str,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    **_: Any,
) -> DiagnosisView:
    """Every PerfDiagnosis as the metrics show it (perfdiag.operator.metrics)."""
    return view_of(namespace or "", name, spec, status)


@kopf.on.create(*RESOURCE)
def on_create(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    memo["reconciler"].reconcile(namespace or "", name)


@kopf.on.update(*RESOURCE, field="spec")
def on_spec_update(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    memo["reconciler"].reconcile(namespace or "", name)


@kopf.on.resume(*RESOURCE)
def on_resume(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    memo["reconciler"].reconcile(namespace or "", name)


def _has_cleanup(status: Mapping[str, Any], **_: Any) -> bool:
    return needs_cleanup(_status(status))


@kopf.on.delete(*RESOURCE, when=_has_cleanup)
def on_delete(
    namespace: str | None,
    name: str,
    uid: str,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    memo: Any,
    logger: Any,
    **_: Any,
) -> None:
    removed = memo["reconciler"].cleanup(namespace or "", name, uid, _status(status), _spec(spec))
    logger.info("removed the plan from %d target pod(s); analyzer Job deleted", removed)
