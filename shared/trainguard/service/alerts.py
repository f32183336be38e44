"""Alert texts: a readable email and a one-message SMS, from a rule-status event.

Only what the event knows is written, and all of it: the step as the global step and, when
the event carries it, the loop's own step of that mode (EVAL passes advance the global step,
so "TRAIN step 62" is what the training loop printed); the measured value even when it is
not a finite number (``ValueText``: "inf", "nan"), with the threshold when there is one.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from trainguard.engine.events import RuleStatusDetail
from trainguard.rules.base import fmt
from trainguard.text import ascii_text, printable

SMS_MAX_CHARS = 140  # one SMS (SNS bills 140 bytes per message)
SUBJECT_MAX_CHARS = 100  # SNS email subject limit


@dataclass(frozen=True)
class Alert:
    subject: str
    email: str
    sms: str


def _advice(rule_name: str) -> str:
    from trainguard.rules.plugins import rule_class

    cls = rule_class(rule_name)  # built-in or custom (TRAINGUARD_RULE_MODULES)
    return (
        cls.advice
        if cls is not None and cls.advice
        else "Inspect the job's saved data with trainguard.create_trial."
    )


def step_text(detail: RuleStatusDetail) -> str:
    """``64 (global step; TRAIN step 62)``, or ``64 (global step)`` when the mode is not known."""
    if detail.Mode is not None and detail.ModeStep is not None:
        return f"{detail.Step} (global step; {detail.Mode} step {detail.ModeStep})"
    return f"{detail.Step} (global step)"


def measured_text(detail: RuleStatusDetail) -> str | None:
    """The measured value: the number, or its text when it was not finite; None if not measured."""
    if detail.Value is not None:
        return fmt(detail.Value)
    return detail.ValueText


def render(detail: RuleStatusDetail) -> Alert:
    """The alert texts. Every name and detail comes from the job: control characters and
    terminal escapes are shown escaped (``trainguard.text.printable``), never sent raw."""
    detail = _printable(detail)
    job, rule, status = detail.TrainingJobName, detail.RuleConfigurationName, detail.RuleEvaluationStatus
    when = dt.datetime.fromtimestamp(detail.LastModifiedTime, tz=dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    subject = ascii_text(f"trainguard: {rule} {status} in {job}")[:SUBJECT_MAX_CHARS]
    lines = [
        f"Training job:  {job}",
        f"Rule:          {rule} ({detail.RuleName})",
        f"Status:        {status}" + (f" (was {detail.PreviousStatus})" if detail.PreviousStatus else ""),
        f"Time:          {when}",
    ]
    if detail.Step is not None:
        lines.append(f"Step:          {step_text(detail)}")
    if detail.Tensor:
        lines.append(f"Tensor:        {detail.Tensor}")
    measured = measured_text(detail)
    if measured is not None:
        threshold = f" (threshold {fmt(detail.Threshold)})" if detail.Threshold is not None else ""
        lines.append(f"Measured:      {measured}{threshold}")
    elif detail.Threshold is not None:
        lines.append(f"Threshold:     {fmt(detail.Threshold)}")
    lines += ["", detail.StatusDetails, ""]
    if status == "Error":
        lines.append("What to do: fix the rule configuration or the data named above; the other rules go on.")
    else:
        lines.append(f"What to do: {_advice(detail.RuleName)}")
    if "StopTraining" in detail.Actions:
        lines.append("This rule's StopTraining action is stopping the job.")
    lines += ["", f"Event id: {detail.EventId}", "Other rules of this job:"]
    lines += [
        f"  - {e.RuleConfigurationName}: {e.RuleEvaluationStatus}" for e in detail.DebugRuleEvaluationStatuses
    ]
    at = f" step {detail.Step}" if detail.Step is not None else ""
    if detail.Step is not None and detail.Mode is not None and detail.ModeStep is not None:
        at += f" ({detail.Mode} {detail.ModeStep})"
    value = ""
    if measured is not None:
        value = f" {measured}" + (f">{fmt(detail.Threshold)}" if detail.Threshold is not None else "")
    sms = f"trainguard {job}: {rule} {status}{at}{value}"
    if len(sms) > SMS_MAX_CHARS:
        sms = sms[: SMS_MAX_CHARS - 3] + "..."
    return Alert(subject, "\n".join(lines), sms)


def _printable(detail: RuleStatusDetail) -> RuleStatusDetail:
    entries = [
        e.model_copy(update={"RuleConfigurationName": printable(e.RuleConfigurationName)})
        for e in detail.DebugRuleEvaluationStatuses
    ]
    return detail.model_copy(
        update={
            "TrainingJobName": printable(detail.TrainingJobName),
            "RuleConfigurationName": printable(detail.RuleConfigurationName),
            "RuleName": printable(detail.RuleName),
            "Tensor": printable(detail.Tensor) if detail.Tensor is not None else None,
            "StatusDetails": printable(detail.StatusDetails),
            "EventId": printable(detail.EventId),
            "ValueText": printable(detail.ValueText) if detail.ValueText is not None else None,
            "DebugRuleEvaluationStatuses": entries,
        }
    )
