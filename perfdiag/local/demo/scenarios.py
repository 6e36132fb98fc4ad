"""Demo scenarios: which fault `train.py` injects, and the diagnosis that matches it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfdiag.api import Verdict
from perfdiag.api.verdict import FindingCategory

TRAIN_SCRIPT = Path(__file__).with_name("train.py")
DEFAULT_SCENARIO = "python-hotspot"
DEFAULT_FAULT_RANK = 2
DEFAULT_RANKS = 4
SLOWDOWN_STEP = 100
"""In the `slowdown` scenario the fault rank turns slow from this step on."""
SLOWDOWN_TRIGGER_PERCENT = 10.0


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    category: FindingCategory | None
    """The category of the top finding; None for a healthy run (no finding expected)."""
    on_slowdown: float | None = None
    """Captured by the slowdown trigger at this percentage (`perfdiag run --on-slowdown`)."""

    @property
    def healthy(self) -> bool:
        return self.category is None


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy", "no fault: every rank does the same work", None),
        Scenario(
            "python-hotspot",
            "one rank runs a pure-Python tokenizer loop on every batch",
            "python",
        ),
        Scenario(
            "compute-straggler",
            "one rank does extra matrix multiplications (aten work) every step",
            "cpu_op",
        ),
        Scenario(
            "slowdown",
            f"one rank turns slow at step {SLOWDOWN_STEP} (a Python hotspot); the slowdown "
            f"trigger ({SLOWDOWN_TRIGGER_PERCENT:g}%) captures it",
            "python",
            on_slowdown=SLOWDOWN_TRIGGER_PERCENT,
        ),
        Scenario(
            "dataloader-stall",
            "one rank's Dataset.__getitem__ is slow (a simulated slow read)",
            "dataloader",
        ),
    )
}


@dataclass(frozen=True)
class Judgement:
    matches: bool
    explanation: str


def judge(
    scenario: Scenario, verdict: Verdict, fault_rank: int, report_severity: float
) -> Judgement:
    """Does the verdict name the injected fault (rank and category), or, for `healthy`, report
    nothing?"""
    reported = [f for f in verdict.findings if f.severity >= report_severity]
    if scenario.healthy:
        if verdict.status == "healthy" and not reported:
            return Judgement(True, "no fault was injected and none was reported")
        what = (
            f"{reported[0].kind} on ranks {reported[0].ranks} ({reported[0].category})"
            if reported
            else "no finding"
        )
        return Judgement(
            False, f"no fault was injected, but the verdict is {verdict.status}: {what}"
        )
    expected = f"rank {fault_rank}, category {scenario.category}"
    if scenario.on_slowdown is not None and verdict.trigger is None:
        return Judgement(False, "the capture was not fired by the slowdown trigger")
    if not verdict.findings:
        return Judgement(
            False, f"the injected fault ({expected}) was not found: status {verdict.status}"
        )
    top = verdict.findings[0]
    found = f"ranks {top.ranks}, category {top.category}"
    if (
        verdict.status == "degraded"
        and top.ranks == [fault_rank]
        and top.category == scenario.category
    ):
        where = f" in {top.function}" if top.function else ""
        return Judgement(True, f"the top finding names the injected fault: {found}{where}")
    return Judgement(
        False,
        f"the top finding ({found}, status {verdict.status}) does not name the injected fault "
        f"({expected})",
    )
