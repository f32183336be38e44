"""Alert texts: a readable email and a one-message SMS, from a rule-status event.

Only what the event knows is written, and all of it: the step as the global step and, when
the event carries it, the loop's own step of that mode (EVAL passes advance the global step,
so "TRAIN step 62" is what the training loop printed); the measured value as a person says
it: "loss is NaN" when it is not a finite number (``ValueText``), else the number with the
threshold when there is one. Long texts are shortened at a word, with an ellipsis.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from trainguard.engine.events import RuleStatusDetail
from trainguard.rules.base import fmt
from trainguard.text import ascii_text, printable, shorten

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
    """``64 (global), TRAIN step 62``, or ``64 (global)`` when the event does not know the mode."""
    if detail.Mode is not None and detail.ModeStep is not None:
        return f"{detail.Step} (global), {detail.Mode} step {detail.ModeStep}"
    return f"{detail.Step} (global)"


_NON_FINITE = {"nan": "NaN", "-nan": "NaN", "inf": "inf", "+inf": "inf", "-inf": "-inf"}


def measured_text(detail: RuleStatusDetail) -> str | None:
    """The measured value as a person says it: ``12 (threshold 10)``, ``loss is NaN``; None
    if nothing was measured. A threshold beside a non-finite value says nothing."""
    if detail.Value is not None:
        threshold = f" (threshold {fmt(detail.Threshold)})" if detail.Threshold is not None else ""
        return f"{fmt(detail.Value)}{threshold}"
    if detail.ValueText is None:
        return None
    word = _NON_FINITE.get(detail.ValueText.strip().lower(), detail.ValueText)
    return f"{detail.Tensor or 'the value'} is {word}"


def _sms_value(detail: RuleStatusDetail) -> str:
    if detail.Value is not None:
        what = detail.Tensor or "value"
        threshold = f", threshold {fmt(detail.Threshold)}" if detail.Threshold is not None else ""
        return f": {what} {fmt(detail.Value)}{threshold}"
    measured = measured_text(detail)
    return f": {measured}" if measured is not None else ""


def render(detail: RuleStatusDetail) -> Alert:
    """The alert texts. Every name and detail comes from the job: control characters and
    terminal escapes are shown escaped (``trainguard.text.printable``), never sent raw."""
    detail = _printable(detail)
    job, rule, status = detail.TrainingJobName, detail.RuleConfigurationName, detail.RuleEvaluationStatus
    when = dt.datetime.fromtimestamp(detail.LastModifiedTime, tz=dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    subject = shorten(ascii_text(f"trainguard: {rule} {status} in {job}"), SUBJECT_MAX_CHARS, "...")
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
        lines.append(f"Measured:      {measured}")
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
    at = f" at step {step_text(detail)}" if detail.Step is not None else ""
    # "..." not "…": one character outside GSM-7 would halve what one SMS holds
    sms = shorten(f"trainguard {job}: {rule} {status}{at}{_sms_value(detail)}", SMS_MAX_CHARS, "...")
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
