"""No silent passes: a rule that checked nothing ends Error, and NoIssuesFound says how much.

Every built-in rule is driven through the real evaluator (manifest, steps in order, end
marker): on a job that saves nothing it reads it must end ``Error`` with what was missing and
how to save it, never ``NoIssuesFound``; on a job that saves everything (``fulljobs``) its
healthy scenario ends ``NoIssuesFound`` with a count of what it checked. While the job runs
it stays ``InProgress``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from fulljobs import job
from rulejobs import JOB, M, header, step_data, tensor
from test_reads import SCENARIOS
from trainguard.engine.evaluator import advance, apply_end, apply_manifest
from trainguard.engine.model import JobState, RuleRecord, StepArrival
from trainguard.format import documents as d
from trainguard.rules.base import StepData
from trainguard.rules.registry import RULES

NOW = 1_800_000_000.0


def evaluate(
    name: str, steps: list[StepData], params: dict[str, str] | None = None, *, ended: bool = True
) -> RuleRecord:
    """The rule's record after the evaluator ran the job (one worker)."""
    entry = {"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name, **(params or {})}}
    manifest = d.Manifest(job=JOB, created=NOW, hook_version="test", world_size=1, rules=[entry])
    state = apply_manifest(JobState(job=JOB), manifest, NOW).state
    arrivals, prev = [], None
    for sd in steps:
        h = sd.workers[0].model_copy(update={"prev_step": prev})
        arrivals.append(StepArrival(sd.step, 0, prev, h))
        prev = sd.step
    state = advance(state, arrivals, NOW, max_steps=None).state
    if ended:
        marker = d.EndMarker(job=JOB, worker=0, world_size=1, last_step=prev, wall_time=NOW)
        state = apply_end(state, marker).state
        state = advance(state, [], NOW).state
    return state.rule(name)


def nothing_it_reads(name: str, params: dict[str, str]) -> list[StepData]:
    """Steps that hold data, but none of what the rule reads (an empty step for the greedy ones)."""
    from rulejobs import make

    rule = make(name, **params)
    unrelated = {"other/thing": tensor([[1.0, 2.0], [3.0, 4.0]], ["nothing_a_rule_reads"])}
    candidate = [step_data(s, tensors=unrelated) for s in range(40)]
    reads_it = any(
        item.selects("other/thing", ["nothing_a_rule_reads"], "TRAIN", scalar=False) for item in rule.reads()
    )
    return [StepData.from_headers([header(s, {"TRAIN": M(s)})]) for s in range(40)] if reads_it else candidate


def params_of(name: str) -> dict[str, str]:
    return SCENARIOS[name][0][0]


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_rule_that_saw_nothing_ends_error_not_no_issues_found(name: str) -> None:
    params = params_of(name)
    steps = nothing_it_reads(name, params)
    running = evaluate(name, steps, params, ended=False)
    assert running.status == "InProgress", running.details
    record = evaluate(name, steps, params)
    if name == "StalledTrainingRule":
        # it reads no tensor: the steps' write times are its input, and it timed them
        assert record.status == "NoIssuesFound" and "timed 40 steps' write times" in record.details
        return
    assert record.status == "Error", f"{name}: {record.status} {record.details}"
    assert record.details.startswith("RuleInputMissing: ") and f"in {len(steps)} steps" in record.details
    assert "saw no" in record.details or "no " in record.details, record.details


@pytest.mark.parametrize("name", sorted(RULES))
def test_no_issues_found_says_how_much_was_checked(name: str) -> None:
    params = params_of(name)
    record = evaluate(name, job(()), params)
    if name == "SimilarAcrossRuns":  # compares with another job: nothing to compare with here
        assert record.status == "Error" and "no step of job other-job" in record.details
        return
    assert record.status == "NoIssuesFound", f"{name}: {record.details}"
    count = record.details.split(f"the rule {name} ", 1)[1].split(" ", 2)[1]
    assert int(count.replace(",", "")) > 0, record.details


def test_a_job_that_ends_with_no_step_is_not_a_pass() -> None:
    record = evaluate("VanishingGradient", [])
    assert record.status == "Error"
    assert record.details == (
        "RuleInputMissing: VanishingGradient saw no gradients in 0 steps: the hook saved none; "
        "call hook.register_module(model) or include the 'gradients' collection "
        "(include_collections=[..., 'gradients'])."
    )


def test_saturated_activation_with_the_default_collections() -> None:
    # what a hook with its default collections saves: losses, weights, biases, gradients, relu outputs
    full = job(())
    keep = {"fc1.weight", "fc1.bias", "gradient/fc1.weight", "fc1/relu_output"}

    def default_hook(sd: StepData) -> StepData:
        h = sd.workers[0]
        modes = {
            m: r.model_copy(update={"tensors": {n: t for n, t in r.tensors.items() if n in keep}})
            for m, r in h.modes.items()
        }
        return StepData.from_headers([h.model_copy(update={"modes": modes})])

    record = evaluate("SaturatedActivation", [default_hook(s) for s in full])
    assert record.status == "Error"
    assert "saw no tanh/sigmoid inputs in 60 steps: the hook saved none" in record.details
    assert "'tanh_input', 'sigmoid_input'" in record.details
    assert evaluate("SaturatedActivation", full).status == "NoIssuesFound"


def test_loss_not_decreasing_after_16_eval_steps_while_train_losses_were_nan() -> None:
    steps: list[StepData] = []
    for s in range(337):
        steps.append(StepData.from_headers([header(len(steps), {"TRAIN": M(s, {"loss": math.nan})})]))
        if s == 20:
            for e in range(16):
                steps.append(StepData.from_headers([header(len(steps), {"EVAL": M(e, {"loss": 0.5})})]))
    record = evaluate("LossNotDecreasing", steps)
    assert record.status == "IssuesFound" and record.tensor == "TRAIN loss"
    # and with finite, decreasing TRAIN losses the rule says what it compared
    fine = [
        StepData.from_headers([h.model_copy(update={"modes": _finite(h)})])
        for h in (s.workers[0] for s in steps)
    ]
    record = evaluate("LossNotDecreasing", fine)
    assert record.status == "NoIssuesFound" and "compared 6 windows of TRAIN loss" in record.details


def _finite(h: d.StepHeader) -> dict[str, Any]:
    out = {}
    for m, r in h.modes.items():
        if m == "TRAIN":
            r = r.model_copy(
                update={
                    "scalars": {"loss": d.ScalarRecord(value=1.0 / (1 + r.mode_step), collections=["losses"])}
                }
            )
        out[m] = r
    return out


def test_check_input_images_with_the_mxnet_default_regex() -> None:
    full = job((), steps=200)
    mxnet = {"regex": ".*hybridsequential0_input_0", "threshold_samples": "20"}
    record = evaluate("CheckInputImages", full, mxnet)
    assert record.status == "Error"
    assert "saw no tensors matching '.*hybridsequential0_input_0'" in record.details
    # trainguard's default selection finds the images the hook saves (model_input_0)
    record = evaluate("CheckInputImages", full, {"threshold_samples": "20"})
    assert record.status == "NoIssuesFound" and "over 800 images" in record.details
