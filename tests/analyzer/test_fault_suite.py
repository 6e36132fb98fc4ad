"""A fast subset of the fault suite (benchmarks/fault_suite.py): real DDP jobs over gloo on CPU
with an injected fault, run through `perfdiag run` as a user runs them, and the verdict judged:
every culprit named (nobody else), with its category and the user's own function."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfdiag_testing.fault_suite import CLASSES, FaultClass, run_class

FAST = [c for c in CLASSES if c.fast]


def test_the_fast_subset_covers_a_healthy_job_and_each_kind_of_cause() -> None:
    names = {c.name for c in FAST}
    assert {"healthy", "python-hotspot", "compute", "sleep"} <= names
    assert len(CLASSES) >= 20


@pytest.mark.timeout(400)
@pytest.mark.parametrize("fault_class", FAST, ids=[c.name for c in FAST])
def test_perfdiag_run_diagnoses_the_injected_fault(fault_class: FaultClass, tmp_path: Path) -> None:
    outcome = run_class(fault_class, tmp_path / fault_class.name, timeout_s=300)
    assert outcome.right, f"{outcome.why} (status {outcome.status}; top: {outcome.top})"
