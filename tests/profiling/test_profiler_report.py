"""Golden tests: ProfilerReport (runs every profiler rule; fires at the end if any found issues)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sysbatches import T0, const, run, series
from trainguard.format.system import InitInfo
from trainguard.rules.profiler import ProfilerReport


def make(**params: str) -> ProfilerReport:
    return ProfilerReport(ProfilerReport.Config.model_validate(params))


def test_prefixed_parameters_reach_the_sub_rules() -> None:
    rule = make(CPUBottleneck_threshold="30", StepOutlier_n_outliers="5", StepOutlier_mode="None")
    assert rule.rules["CPUBottleneck"].config.threshold == 30.0
    assert rule.rules["StepOutlier"].config.n_outliers == 5
    assert rule.rules["IOBottleneck"].config.threshold == 50.0


@pytest.mark.parametrize(
    "params",
    [
        {"CPUBottleneck_treshold": "1"},
        {"Nope_threshold": "1"},
        {"threshold": "1"},
        {"CPUBottleneck_threshold": "x"},
    ],
)
def test_bad_parameters_are_errors(params: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        make(**params)


def test_collects_sub_rule_findings_and_fires_at_the_end() -> None:
    rule = make()
    batches = series(1600, cpu=const(95.0), gpu=lambda i: ((5.0, 40.0),))
    state = rule.initial_state()
    for b in batches:
        state, found = rule.update(state, b)
        assert found == []
    assert set(state.findings) == {"CPUBottleneck", "LowGPUUtilization"}
    assert state.findings["CPUBottleneck"].step == 1099
    assert state.findings["CPUBottleneck"].time == batches[54].end_time
    final = rule.finish(state)
    assert len(final) == 1 and final[0].rule == "ProfilerReport"
    assert "CPUBottleneck (step 1099)" in final[0].message
    results = {r.name: r for r in rule.results(state)}
    assert results["CPUBottleneck"].status == "IssuesFound"
    assert results["IOBottleneck"].status == "NoIssuesFound"
    assert "note" in results["Dataloader"].notes
    assert "node-a" in results["OverallSystemUsage"].notes


def test_healthy_job_does_not_fire() -> None:
    rule = make()
    _, found = run(rule, series(600, cpu=const(50.0), gpu=lambda i: ((90.0, 60.0),)))
    assert found == []


def test_check_clock_forwards_to_max_initialization_time() -> None:
    rule = make()
    state, _ = rule.update(rule.initial_state(), series(1, init=InitInfo(hook_start=T0), step_s=None)[0])
    state.states["MaxInitializationTime"]["first_step_start"] = None
    state, found = rule.check_clock(state, T0 + 3600)
    assert found == [] and "MaxInitializationTime" in state.findings
    assert len(rule.finish(state)) == 1


def test_evaluate_per_worker_matches_the_services_one_state_per_worker() -> None:
    from trainguard.rules.profiler import evaluate_per_worker

    healthy = series(1400, cpu=const(50.0), gpu=lambda i: ((90.0, 60.0),), worker=0)
    starved = series(1400, cpu=const(95.0), gpu=lambda i: ((5.0, 60.0),), worker=1, host="node-b")
    shuffled = [b for pair in zip(starved, healthy, strict=True) for b in pair]
    results = {r.name: r for r in evaluate_per_worker(shuffled)}
    cpu = results["CPUBottleneck"]
    assert cpu.status == "IssuesFound" and cpu.finding is not None
    assert cpu.finding.message.startswith("worker 1: ") and cpu.finding.step == 1099
    # one GPU per worker: GPUs of different workers are not compared (as in the service)
    assert results["LoadBalancing"].status == "NoIssuesFound"
    assert "fewer than two GPUs" in results["LoadBalancing"].notes["note"]
    # delivery order across workers does not change the verdicts
    again = {r.name: r for r in evaluate_per_worker(list(reversed(shuffled)))}
    assert {n: r.status for n, r in again.items()} == {n: r.status for n, r in results.items()}
    assert evaluate_per_worker([])[0].name == "CPUBottleneck"
