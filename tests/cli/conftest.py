"""Helpers for the CLI's fast tests (no training is started here)."""

from __future__ import annotations

from typing import Any

import pytest

from perfdiag.api import Finding, StepTimes, Verdict, WindowInfo, WorkerInfo


def _make_verdict(
    status: str = "degraded",
    findings: list[dict[str, Any]] | None = None,
    per_rank: dict[str, float] | None = None,
    missing: tuple[int, ...] = (),
) -> Verdict:
    per_rank = per_rank or {"0": 20.0, "1": 20.5, "2": 31.0, "3": 19.8}
    return Verdict.model_validate(
        {
            "status": status,
            "summary": "Rank 2 is 52% slower than its peers: python function tokenize.",
            "window": WindowInfo(
                start_step=12,
                steps=10,
                step_time_ms=StepTimes(median=20.2, max=max(per_rank.values()), per_rank=per_rank),
            ),
            "workers": [
                WorkerInfo(rank=int(r), state="missing" if int(r) in missing else "ok")
                for r in per_rank
            ],
            "findings": [Finding.model_validate(f) for f in findings or []],
        }
    )


def _finding(
    ranks: list[int], category: str = "python", severity: float = 0.3, **extra: Any
) -> dict[str, Any]:
    return {
        "kind": extra.pop("kind", "slow_worker"),
        "category": category,
        "function": extra.pop("function", "train.py(40): tokenize"),
        "ranks": ranks,
        "severity": severity,
        "message": extra.pop("message", "rank is slow"),
        **extra,
    }


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    """Run `perfdiag ARGV` in-process: (exit code, stdout, stderr)."""
    from perfdiag.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse usage errors and --help
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(name="make_verdict")
def make_verdict_fixture() -> Any:
    """Build a Verdict: make_verdict(status=..., findings=[finding(...)], per_rank=..., missing=...)."""
    return _make_verdict


@pytest.fixture(name="finding")
def finding_fixture() -> Any:
    """Build a finding dict: finding(ranks, category="python", severity=0.3, **fields)."""
    return _finding
