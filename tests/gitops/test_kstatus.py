"""Flux (kstatus) reads every PerfDiagnosis state the way docs/gitops.md says."""

from __future__ import annotations

import pytest

from perfdiag_testing import kstatus
from tests.gitops.phases import CASES, Case


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kstatus_classifies_each_state(case: Case) -> None:
    assert kstatus.compute(case.obj()).status == case.kstatus


def test_observed_generation_behind_is_in_progress_whatever_the_conditions() -> None:
    failed = next(c for c in CASES if c.name == "failed, analyzer failed")
    obj = failed.obj()
    assert kstatus.compute(obj).status == "Failed"
    obj["metadata"]["generation"] = 2
    result = kstatus.compute(obj)
    assert result.status == "InProgress"
    assert "generation is 2, but latest observed generation is 1" in result.message


def test_stalled_message_is_reported() -> None:
    stalled = next(c for c in CASES if c.name == "pending, target not found")
    assert kstatus.compute(stalled.obj()).message == "TargetNotFound message"
