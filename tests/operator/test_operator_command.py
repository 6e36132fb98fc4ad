"""`perfdiag operator` refuses to start without credentials (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfdiag.cli import main as cli_main


def test_no_credentials_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert cli_main(["operator", "--namespace", "x"]) == 1
    err = capsys.readouterr().err
    assert "no Kubernetes credentials" in err and str(tmp_path / "missing") in err


def test_bad_recheck_interval(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["operator", "--recheck-seconds", "0"]) == 1
    assert "--recheck-seconds" in capsys.readouterr().err
    monkeypatch.setenv("PERFDIAG_RECHECK_SECONDS", "never")
    assert cli_main(["operator"]) == 1
    assert "PERFDIAG_RECHECK_SECONDS" in capsys.readouterr().err
