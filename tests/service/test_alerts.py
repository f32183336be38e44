"""Alert texts say the global step and the loop's own mode step, and every detail is filled."""

from __future__ import annotations

import json
import math

from trainguard.engine.evaluator import build_event
from trainguard.engine.events import RuleStatusDetail
from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob
from trainguard.format import documents as d
from trainguard.local.synthetic import SyntheticJob
from trainguard.service.alerts import render


def detail(**changes) -> RuleStatusDetail:
    base = {
        "EventId": "job-1/ExplodingTensor/2",
        "TrainingJobName": "job-1",
        "RuleConfigurationName": "ExplodingTensor",
        "RuleName": "ExplodingTensor",
        "RuleEvaluationStatus": "IssuesFound",
        "PreviousStatus": "InProgress",
        "StatusDetails": "ExplodingTensor: scalar loss (worker 0, TRAIN) is inf (threshold: finite).",
        "LastModifiedTime": 1_790_000_000.0,
        "Step": 64,
        "Tensor": "loss",
        "Actions": ["Email", "SMS"],
    }
    return RuleStatusDetail.model_validate(base | changes)


def test_the_step_is_global_and_the_mode_step_is_the_loops():
    alert = render(detail(Mode="TRAIN", ModeStep=62, ValueText="inf", Threshold=0.0))
    assert "Step:          64 (global), TRAIN step 62" in alert.email
    assert "Measured:      loss is inf\n" in alert.email and "(threshold 0)" not in alert.email
    assert "n/a" not in alert.email
    assert (
        alert.sms
        == "trainguard job-1: ExplodingTensor IssuesFound at step 64 (global), TRAIN step 62: loss is inf"
    )


def test_values_read_as_a_person_says_them():
    alert = render(detail(Mode="TRAIN", ModeStep=174, Step=181, ValueText="nan", Threshold=0.0))
    assert "Measured:      loss is NaN" in alert.email
    assert alert.sms.endswith("at step 181 (global), TRAIN step 174: loss is NaN")
    assert "nan>0" not in alert.sms and ">" not in alert.sms
    alert = render(detail(Tensor=None, ValueText="-inf"))
    assert "Measured:      the value is -inf" in alert.email


def test_long_texts_are_shortened_at_a_word_with_an_ellipsis():
    long_job = "job " + "word " * 40
    alert = render(detail(TrainingJobName=long_job.strip().replace(" ", "-"), Mode="TRAIN", ModeStep=3))
    assert len(alert.sms) <= 140 and alert.sms.endswith("...")
    alert = render(
        detail(RuleConfigurationName="LossNotDecreasing", RuleName="LossNotDecreasing", Value=1.4015,
               Threshold=1.385, Tensor="EVAL loss", Mode="TRAIN", ModeStep=79, Step=83,
               TrainingJobName="a-rather-long-training-job-name-for-the-character-level-gru-2026-12-02")
    )  # fmt: skip
    assert len(alert.sms) <= 140
    body = alert.sms.removesuffix("...")
    assert alert.sms.endswith("...") and body == alert.sms[: len(body)]
    # cut between words: what precedes the ellipsis is a whole word of the full text
    full = (
        "trainguard a-rather-long-training-job-name-for-the-character-level-gru-2026-12-02: "
        "LossNotDecreasing IssuesFound at step 83 (global), TRAIN step 79: EVAL loss 1.4015, threshold 1.385"
    )
    assert full.startswith(body) and full[len(body)] in " ,:"
    subject = render(detail(TrainingJobName="j" * 120)).subject
    assert len(subject) <= 100 and subject.endswith("...")


def test_without_a_mode_step_the_step_says_it_is_global_and_nothing_is_n_a():
    alert = render(detail(Value=None, Threshold=None))
    assert "Step:          64 (global)\n" in alert.email
    assert "Measured" not in alert.email and "n/a" not in alert.email
    alert = render(detail(Value=None, Threshold=50.0))
    assert "Threshold:     50" in alert.email and "Measured" not in alert.email
    alert = render(detail(Value=12.0, Threshold=10.0, Mode="EVAL", ModeStep=3))
    assert "Measured:      12 (threshold 10)" in alert.email
    assert alert.sms.endswith("at step 64 (global), EVAL step 3: loss 12, threshold 10")


class EvalEveryThird(SyntheticJob):
    """A loop that evaluates after every third TRAIN step: EVAL passes advance the global step."""

    def header(self, step: int, worker: int, prev: int | None, now: float) -> d.StepHeader:
        header = super().header(step, worker, prev, now)
        if step % 4 == 3:  # global steps 3, 7, 11, ...: EVAL number step // 4
            modes = {"EVAL": d.ModeRecord(mode_step=step // 4, scalars={"loss": _loss(0.5)})}
        else:  # the TRAIN steps: global step minus the EVAL steps before it
            train = header.modes["TRAIN"].model_copy(
                update={"mode_step": step - step // 4, "scalars": {"loss": _loss(self.loss(step, worker))}}
            )
            modes = {"TRAIN": train}
        return header.model_copy(update={"modes": modes})


def _loss(value: float) -> d.ScalarRecord:
    return d.ScalarRecord(value=value, collections=["losses"])


def test_the_event_carries_the_mode_step_and_the_non_finite_value(tmp_path):
    job = EvalEveryThird(
        "mode-steps",
        steps=list(range(20)),
        loss=lambda step, worker: math.inf if step >= 13 else 1.0 / (1 + step),
        rules=[
            {
                "RuleConfigurationName": "ExplodingTensor",
                "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
            }
        ],
    )
    folder = tmp_path / job.job
    for rel, body in job.objects().items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(body)
    result = replay(LocalJob.open(folder))
    fired = next(t for t in result.transitions if t.record.status == "IssuesFound")
    event = build_event(result.state, fired)
    assert (event.Step, event.Mode, event.ModeStep) == (13, "TRAIN", 10)
    assert event.Value is None and event.ValueText == "inf"
    # the event stays JSON (no bare Infinity) and reads back
    again = RuleStatusDetail.model_validate(json.loads(event.model_dump_json()))
    assert again == event
    assert "Step:          13 (global), TRAIN step 10" in render(again).email
    assert "Measured:      loss is inf" in render(again).email


def test_a_rule_that_fires_after_its_step_has_passed_still_names_the_mode_step(tmp_path):
    """LossNotDecreasing judges a window when a later step closes it: the event keeps both steps."""
    job = EvalEveryThird(
        "flat-loss",
        steps=list(range(80)),
        loss=lambda step, worker: 1.0,
        rules=[
            {
                "RuleConfigurationName": "LossNotDecreasing",
                "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "num_steps": "10", "mode": "TRAIN"},
            }
        ],
    )
    folder = tmp_path / job.job
    for rel, body in job.objects().items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(body)
    result = replay(LocalJob.open(folder))
    fired = next(t for t in result.transitions if t.record.status == "IssuesFound")
    event = build_event(result.state, fired)
    assert event.Mode == "TRAIN" and event.ModeStep is not None
    assert event.Step is not None and event.Step - event.Step // 4 == event.ModeStep  # the loop's count
    email = render(event).email
    assert f"Step:          {event.Step} (global), TRAIN step {event.ModeStep}" in email
    assert f"training steps {event.ModeStep - 9}-{event.ModeStep}" in email or f"-{event.ModeStep}" in email
