"""kopf settings: perfdiag's own finalizer and annotation prefixes, not kopf's defaults."""

from __future__ import annotations

import os

import kopf
import pytest

from perfdiag.operator.settings import DEFAULT_IMAGE, OperatorConfig, configure, configure_webhook


def test_kopf_bookkeeping_lives_under_perfdiag_io() -> None:
    settings = kopf.OperatorSettings()
    assert settings.persistence.finalizer.startswith("kopf.zalando.org/")  # what we replace
    configure(settings)
    assert settings.persistence.finalizer == "perfdiag.io/finalizer"
    progress = settings.persistence.progress_storage
    diffbase = settings.persistence.diffbase_storage
    assert isinstance(progress, kopf.AnnotationsProgressStorage)
    assert isinstance(diffbase, kopf.AnnotationsDiffBaseStorage)
    assert progress.prefix == "perfdiag.io"
    assert diffbase.prefix == "perfdiag.io"
    assert diffbase.key == "last-handled-configuration"


def test_operator_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERFDIAG_RECHECK_SECONDS", raising=False)
    assert OperatorConfig.from_env().recheck_seconds == 15.0
    monkeypatch.setenv("PERFDIAG_RECHECK_SECONDS", "2.5")
    assert OperatorConfig.from_env().recheck_seconds == 2.5
    for bad in ("soon", "0", "99999"):
        monkeypatch.setenv("PERFDIAG_RECHECK_SECONDS", bad)
        with pytest.raises(ValueError, match="PERFDIAG_RECHECK_SECONDS"):
            OperatorConfig.from_env()


def test_storage_image_and_webhook_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("PERFDIAG_STORAGE", "PERFDIAG_IMAGE", "PERFDIAG_WEBHOOK_PORT"):
        monkeypatch.delenv(key, raising=False)
    config = OperatorConfig.from_env()
    assert config.storage is None and config.webhook is None
    assert config.image.startswith("ghcr.io/perfdiag/perfdiag:")
    monkeypatch.setenv("PERFDIAG_STORAGE", "s3://b/p/")
    monkeypatch.setenv("PERFDIAG_IMAGE", "img:1")
    monkeypatch.setenv("PERFDIAG_WEBHOOK_PORT", "9443")
    with pytest.raises(ValueError, match="PERFDIAG_WEBHOOK_CERT"):
        OperatorConfig.from_env()
    monkeypatch.setenv("PERFDIAG_WEBHOOK_CERT", "/tls/tls.crt")
    monkeypatch.setenv("PERFDIAG_WEBHOOK_KEY", "/tls/tls.key")
    config = OperatorConfig.from_env()
    assert (config.storage, config.image) == ("s3://b/p", "img:1")
    assert config.webhook is not None
    assert (config.webhook.port, str(config.webhook.cert_file)) == (9443, "/tls/tls.crt")
    monkeypatch.setenv("PERFDIAG_WEBHOOK_PORT", "https")
    with pytest.raises(ValueError, match=r"PERFDIAG_WEBHOOK_PORT='https': .*valid integer"):
        OperatorConfig.from_env()
    monkeypatch.setenv("PERFDIAG_WEBHOOK_PORT", "65536")
    with pytest.raises(ValueError, match=r"PERFDIAG_WEBHOOK_PORT='65536': .*65535"):
        OperatorConfig.from_env()


def test_empty_or_unrelated_variables_leave_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty variable counts as unset; names are case-sensitive; the webhook's other
    variables without a port serve no webhook."""
    for key in [k for k in os.environ if k.startswith("PERFDIAG_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PERFDIAG_RECHECK_SECONDS", "")
    monkeypatch.setenv("PERFDIAG_STORAGE", "")
    monkeypatch.setenv("perfdiag_image", "lower:case")
    monkeypatch.setenv("PERFDIAG_WEBHOOK_ADDR", "127.0.0.1")
    config = OperatorConfig.from_env()
    assert (config.recheck_seconds, config.storage, config.webhook) == (15.0, None, None)
    assert config.image == DEFAULT_IMAGE


def test_every_problem_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFDIAG_RECHECK_SECONDS", "soon")
    monkeypatch.setenv("PERFDIAG_CAPTURE_LEAD_SECONDS", "-1")
    monkeypatch.setenv("PERFDIAG_WEBHOOK_PORT", "9443")
    monkeypatch.delenv("PERFDIAG_WEBHOOK_CERT", raising=False)
    monkeypatch.delenv("PERFDIAG_WEBHOOK_KEY", raising=False)
    with pytest.raises(ValueError) as caught:
        OperatorConfig.from_env()
    message = str(caught.value)
    assert "PERFDIAG_RECHECK_SECONDS='soon': Input should be a valid number" in message
    assert (
        "PERFDIAG_CAPTURE_LEAD_SECONDS='-1': Input should be greater than or equal to 0" in message
    )
    assert "PERFDIAG_WEBHOOK_CERT is not set (the webhook's TLS certificate file" in message
    assert "PERFDIAG_WEBHOOK_KEY is not set" in message


CHART_ENV = {
    # What charts/perfdiag/templates/deployment.yaml renders from its default values.
    "PERFDIAG_AGENT_RESOURCES": '{"limits":{"memory":"1Gi"},"requests":{"cpu":"100m","memory":"256Mi"}}',
    "PERFDIAG_ANALYZER_RESOURCES": '{"limits":{"memory":"4Gi"},"requests":{"cpu":1,"memory":"1Gi"}}',
    "PERFDIAG_ANALYZER_DEADLINE_SECONDS": "1200",
    "PERFDIAG_ANALYZER_TTL_SECONDS": "60",
    "PERFDIAG_STORAGE_ENDPOINT": "http://minio.minio:9000",
    "PERFDIAG_STORAGE_REGION": "eu-west-1",
    "PERFDIAG_AGENT_PLAN_POLL_SECONDS": "5",
}


def test_resources_limits_and_endpoint_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in CHART_ENV:
        monkeypatch.delenv(key, raising=False)
    defaults = OperatorConfig.from_env()
    assert defaults.agent_resources.to_wire()["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert (defaults.analyzer_deadline_seconds, defaults.analyzer_ttl_seconds) == (900, 3600)
    assert defaults.storage_endpoint is None
    for key, value in CHART_ENV.items():
        monkeypatch.setenv(key, value)
    config = OperatorConfig.from_env()
    assert config.agent_resources.to_wire() == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert config.analyzer_resources.to_wire() == {
        "requests": {"cpu": "1", "memory": "1Gi"},  # quantities are strings on the wire
        "limits": {"memory": "4Gi"},
    }
    assert (config.analyzer_deadline_seconds, config.analyzer_ttl_seconds) == (1200, 60)
    assert (config.storage_endpoint, config.storage_region) == (
        "http://minio.minio:9000",
        "eu-west-1",
    )


def test_the_capture_lead_covers_the_agents_plan_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slower plan poll (a large job's request budget) lengthens the lead with it; a poll the
    hooks' trust in the agent's copy cannot cover is refused."""
    monkeypatch.delenv("PERFDIAG_CAPTURE_LEAD_SECONDS", raising=False)
    monkeypatch.delenv("PERFDIAG_AGENT_PLAN_POLL_SECONDS", raising=False)
    assert OperatorConfig.from_env().effective_capture_lead == 10.0
    monkeypatch.setenv("PERFDIAG_AGENT_PLAN_POLL_SECONDS", "20")
    assert OperatorConfig.from_env().effective_capture_lead == 25.0
    monkeypatch.setenv("PERFDIAG_CAPTURE_LEAD_SECONDS", "40")
    assert OperatorConfig.from_env().effective_capture_lead == 40.0
    monkeypatch.setenv("PERFDIAG_AGENT_PLAN_POLL_SECONDS", "60")
    with pytest.raises(ValueError, match="PERFDIAG_AGENT_PLAN_POLL_SECONDS='60'"):
        OperatorConfig.from_env()


@pytest.mark.parametrize(
    ("variable", "value", "complaint"),
    [
        ("PERFDIAG_AGENT_RESOURCES", "{not json", "PERFDIAG_AGENT_RESOURCES"),
        ("PERFDIAG_AGENT_RESOURCES", '{"request": {"cpu": "1"}}', "request"),
        ("PERFDIAG_ANALYZER_RESOURCES", '{"limits": {"memory": ["4Gi"]}}', "limits.memory"),
        ("PERFDIAG_ANALYZER_DEADLINE_SECONDS", "15m", "PERFDIAG_ANALYZER_DEADLINE_SECONDS"),
        ("PERFDIAG_ANALYZER_DEADLINE_SECONDS", "0", "greater than or equal to 1"),
        ("PERFDIAG_ANALYZER_TTL_SECONDS", "-1", "PERFDIAG_ANALYZER_TTL_SECONDS"),
    ],
)
def test_bad_chart_values_are_named(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, complaint: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=complaint) as caught:
        OperatorConfig.from_env()
    assert variable in str(caught.value)


def test_webhook_manage_false_leaves_the_configuration_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PERFDIAG_WEBHOOK_PORT", "9443")
    monkeypatch.setenv("PERFDIAG_WEBHOOK_CERT", "/tls/tls.crt")
    monkeypatch.setenv("PERFDIAG_WEBHOOK_KEY", "/tls/tls.key")
    monkeypatch.delenv("PERFDIAG_WEBHOOK_MANAGE", raising=False)
    managed = OperatorConfig.from_env().webhook
    assert managed is not None and managed.manage
    settings = kopf.OperatorSettings()
    configure_webhook(settings, managed)
    assert settings.admission.managed == "perfdiag.io"
    monkeypatch.setenv("PERFDIAG_WEBHOOK_MANAGE", "false")
    chart = OperatorConfig.from_env().webhook
    assert chart is not None and not chart.manage
    settings = kopf.OperatorSettings()
    configure_webhook(settings, chart)
    assert settings.admission.managed is None
    assert isinstance(settings.admission.server, kopf.WebhookServer)  # still served
    monkeypatch.setenv("PERFDIAG_WEBHOOK_MANAGE", "no")
    with pytest.raises(ValueError, match="PERFDIAG_WEBHOOK_MANAGE"):
        OperatorConfig.from_env()
