"""Everything one analysis found, as the verdict, the report and the timeline read it."""

from __future__ import annotations

from dataclasses import dataclass

from perfdiag.analyzer.compare.collectives import CollectiveAnalysis
from perfdiag.analyzer.compare.features import Features, StepTimes
from perfdiag.analyzer.compare.outliers import Deviations
from perfdiag.analyzer.compare.peers import PeerGroups
from perfdiag.analyzer.findings.fusion import Fusion
from perfdiag.analyzer.findings.reported import Reported
from perfdiag.analyzer.findings.rules import RangeViolation
from perfdiag.analyzer.load.capture import Capture, Notes
from perfdiag.analyzer.load.workers import WorkerAccount
from perfdiag.analyzer.signals.hardware import ResourceAnomaly
from perfdiag.api.thresholds import Thresholds


@dataclass(frozen=True)
class Analysis:
    """Everything the verdict and the report are made from."""

    capture: Capture
    thresholds: Thresholds
    account: WorkerAccount
    steps: StepTimes
    features: Features
    groups: PeerGroups
    deviations: Deviations
    anomalies: list[ResourceAnomaly]
    fusion: Fusion
    violations: list[RangeViolation]
    reported: list[Reported]
    observations: list[Reported]
    """Whole-job efficiency against expected ranges: shown, never a reason for `degraded`."""
    below_threshold: list[Reported]
    has_gpu: bool
    notes: Notes
    """What the analysis could not use or left out, as its stages said it: the report's notes
    (`shown`) and verdict.json's (`inputs`). The timeline's reads may still add to them, so the
    verdict is built from the analysis last (analyzer/report/verdict.py `verdict_of`)."""
    host_note: str | None
    """The host's CPU condition that names no rank, said in the verdict's summary too."""
    collectives: CollectiveAnalysis | None = None
