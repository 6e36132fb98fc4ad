"""The demo's scenario list and how a verdict is judged against the injected fault."""

from __future__ import annotations

from typing import Any

from perfdiag.local.demo.scenarios import SCENARIOS, TRAIN_SCRIPT, judge


def test_the_required_scenarios_exist() -> None:
    assert {"healthy", "python-hotspot", "compute-straggler", "dataloader-stall"} <= set(SCENARIOS)
    assert TRAIN_SCRIPT.is_file()


def test_list(cli: Any) -> None:
    code, out, _ = cli("demo", "--list")
    assert code == 0
    for scenario in SCENARIOS.values():
        assert f"{scenario.name}" in out and scenario.description in out


def test_bad_scenario_and_rank(cli: Any) -> None:
    code, _, err = cli("demo", "nope")
    assert code == 2 and "unknown scenario 'nope'" in err
    code, _, err = cli("demo", "healthy", "--rank", "4")
    assert code == 2 and "--rank 4" in err


def test_judge_fault(make_verdict: Any, finding: Any) -> None:
    scenario = SCENARIOS["python-hotspot"]
    good = make_verdict(findings=[finding([2], "python"), finding([1], "cpu_op", 0.1)])
    assert judge(scenario, good, 2, 0.05).matches
    assert "tokenize" in judge(scenario, good, 2, 0.05).explanation
    assert not judge(scenario, good, 1, 0.05).matches
    wrong_category = make_verdict(findings=[finding([2], "cpu_op")])
    assert not judge(scenario, wrong_category, 2, 0.05).matches
    several = make_verdict(findings=[finding([2, 3], "python")])
    assert not judge(scenario, several, 2, 0.05).matches
    assert not judge(scenario, make_verdict(status="healthy"), 2, 0.05).matches


def test_judge_healthy(make_verdict: Any, finding: Any) -> None:
    scenario = SCENARIOS["healthy"]
    assert judge(scenario, make_verdict(status="healthy"), 2, 0.05).matches
    below = make_verdict(status="healthy", findings=[finding([1], severity=0.01)])
    assert judge(scenario, below, 2, 0.05).matches
    above = make_verdict(findings=[finding([1], severity=0.2)])
    judgement = judge(scenario, above, 2, 0.05)
    assert not judgement.matches and "degraded" in judgement.explanation
