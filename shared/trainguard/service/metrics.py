"""CloudWatch metrics through EMF (Powertools Metrics): the job's scalars and rule statuses.

Per evaluated step: each scalar (``TRAIN.loss``, ``EVAL.accuracy``...) with the job as
dimension, timestamped with the step's wall time, so a dashboard shows training curves
for every job. Per status transition: a count named after the new status
(``IssuesFound``, ``Error``...) by rule name — the stack alarms on these per rule — and by
job and rule configuration.

Exactly these dimension sets — ``[TrainingJobName]``, ``[RuleName]``,
``[TrainingJobName, RuleConfigurationName]`` — are what the stack's alarms and dashboard
query (``DIMENSION_SETS``). Powertools adds a ``service`` dimension to every metric when
``POWERTOOLS_SERVICE_NAME`` is set (the stack sets it for the logs), which would make every
series invisible to them; each metrics object is therefore created with ``service=""``.
"""

from __future__ import annotations

import math
import os
from typing import Any

from trainguard.engine.model import Transition
from trainguard.service.settings import Env

NAMESPACE_DEFAULT = "trainguard"
#: the dimension sets published; infra/observability.py queries exactly these
JOB_DIMENSIONS = ("TrainingJobName",)
RULE_DIMENSIONS = ("RuleName",)
JOB_RULE_DIMENSIONS = ("TrainingJobName", "RuleConfigurationName")
DIMENSION_SETS = (JOB_DIMENSIONS, RULE_DIMENSIONS, JOB_RULE_DIMENSIONS)


def _namespace() -> str:
    return os.environ.get(Env.POWERTOOLS_METRICS_NAMESPACE, NAMESPACE_DEFAULT)


def _metrics(namespace: str) -> Any:
    from aws_lambda_powertools.metrics import EphemeralMetrics

    # service="" (not None, which falls back to POWERTOOLS_SERVICE_NAME): no "service" dimension
    return EphemeralMetrics(namespace=namespace, service="")


def publish(
    job: str, scalars: list[tuple[int, float, dict[str, float]]], transitions: list[Transition]
) -> None:
    from aws_lambda_powertools.metrics import MetricUnit

    namespace = _namespace()
    for step, wall_time, values in scalars:
        finite = {k: v for k, v in values.items() if math.isfinite(v)}
        if not finite:
            continue
        metrics = _metrics(namespace)
        metrics.add_dimension(name="TrainingJobName", value=job)
        for name, value in finite.items():
            metrics.add_metric(name=name[:255], unit=MetricUnit.NoUnit, value=value)
        metrics.add_metadata(key="Step", value=step)
        metrics.set_timestamp(int(wall_time * 1000))
        metrics.flush_metrics()
    for transition in transitions:
        record = transition.record
        by_rule = _metrics(namespace)
        by_rule.add_dimension(name="RuleName", value=record.rule[:250] or "unknown")
        by_rule.add_metric(name=record.status, unit=MetricUnit.Count, value=1)
        by_rule.flush_metrics()
        by_job = _metrics(namespace)
        by_job.add_dimension(name="TrainingJobName", value=job)
        by_job.add_dimension(name="RuleConfigurationName", value=record.name[:250])
        by_job.add_metric(name=record.status, unit=MetricUnit.Count, value=1)
        by_job.add_metadata(key="Step", value=record.step)
        by_job.flush_metrics()
