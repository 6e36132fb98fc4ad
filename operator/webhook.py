"""The pod mutating webhook (kopf on.mutate, served by kopf.WebhookServer; see
perfdiag.operator.settings.configure_webhook). The decisions are in perfdiag.operator.injection.

Only pods labelled perfdiag.io/inject="true" are sent to it (the MutatingWebhookConfiguration's
objectSelector, which kopf builds from `labels`), only on CREATE. failurePolicy is Ignore
(`ignore_failures`): an operator that is down or broken never blocks a training pod, which then
simply runs without perfdiag (a PerfDiagnosis on it says so). The configuration is persistent:
kopf keeps it when the operator stops, so a restart does not open a window of un-injected pods
beyond the restart itself.

The handler fails open itself too: an injection that raises admits the pod unchanged (kopf
would answer an exception with a denial, which failurePolicy does not cover), logged and
counted in perfdiag_webhook_fail_open_total{reason="InjectionError"}; so is a pod admitted while
the operator has no storage (reason NoStorage). Every admission is counted by its result in
perfdiag_webhook_admissions_total (perfdiag.operator.metrics).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from perfdiag.operator.injection import InjectionConfig, inject
from perfdiag.operator.metrics import OperatorMetrics
from perfdiag.operator.settings import INJECT_LABEL, OperatorConfig

log = logging.getLogger("perfdiag.operator.webhook")


def injection_config(config: OperatorConfig) -> InjectionConfig:
    return InjectionConfig(
        image=config.image,
        storage=config.storage,
        storage_secret=config.storage_secret,
        resources=config.agent_resources.to_wire(),
        storage_endpoint=config.storage_endpoint,
        storage_region=config.storage_region,
        plan_poll_seconds=config.agent_plan_poll_seconds,
    )


@kopf.on.mutate(
    "v1",
    "pods",
    id="inject.pods",
    operations=["CREATE"],
    labels={INJECT_LABEL: "true"},
    ignore_failures=True,
    persistent=True,
    side_effects=False,
)
def inject_pod(body: kopf.Body, patch: kopf.Patch, memo: Any, dryrun: bool, **_: Any) -> None:
    config: OperatorConfig = memo.get("config") or OperatorConfig.from_env()
    metrics: OperatorMetrics | None = memo.get("metrics")
    meta = body.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName', '')}<generated>"
    if not config.storage:
        log.warning("PERFDIAG_STORAGE is not set: pods are not injected (no storage for agents)")
        _count(metrics, "no_storage", "NoStorage")
        return
    try:
        changes = inject(dict(body), injection_config(config))
    except Exception:
        log.exception(
            "injecting perfdiag into pod %s/%s failed: admitted without perfdiag",
            meta.get("namespace"),
            name,
        )
        _count(metrics, "error", "InjectionError")
        return
    if changes is None:
        _count(metrics, "already_injected")
        return
    for key, value in changes.items():
        patch[key] = value
    _count(metrics, "injected")
    if not dryrun:
        log.info("injected perfdiag into pod %s/%s", meta.get("namespace"), name)


def _count(metrics: OperatorMetrics | None, result: str, fail_open: str | None = None) -> None:
    if metrics is None:
        return
    metrics.admitted(result)
    if fail_open is not None:
        metrics.failed_open(fail_open)
