"""kopf settings: perfdiag's own finalizer and annotation prefixes, not kopf's defaults."""

from __future__ import annotations

import kopf
import pytest

from perfdiag.operator.settings import OperatorConfig, configure


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
    with pytest.raises(ValueError, match="not a port number"):
        OperatorConfig.from_env()
