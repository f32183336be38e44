"""The deployment's CloudWatch dashboard and the rule-outcome alarms users subscribe to.

What the functions publish (``trainguard.service.metrics``, EMF, namespace
``POWERTOOLS_METRICS_NAMESPACE``): per evaluated step each scalar of the job (``TRAIN.loss``,
``EVAL.accuracy``...) with dimension ``TrainingJobName``; per rule status transition a
``Count`` named after the new status (``IssuesFound``, ``Error``...) with dimension
``RuleName``, and again with ``TrainingJobName`` + ``RuleConfigurationName``.

Rule alarms go to their own topic, not to the ops topic (DLQs, function errors: the platform
team's pager) nor to the alert topic (its subscriptions filter on the ``actions`` message
attribute, which alarm notifications never carry, so they would all be dropped). The people
who want "tell me when any job's VanishingGradient fires" are ML users, not operators.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from trainguard.engine.events import Status
from trainguard.rules.registry import CHECKING_RULES
from trainguard.service.metrics import JOB_DIMENSIONS, RULE_DIMENSIONS

if TYPE_CHECKING:  # infra.stack imports this module
    from infra.stack import TrainguardStack

#: the status whose count each built-in rule gets an alarm on
ISSUES = "IssuesFound"
#: the status alarmed on once, across every rule (built-in, profiler and custom)
ERROR = "Error"
assert {ISSUES, ERROR} <= set(typing.get_args(Status))
#: the training scalars the dashboard graphs for every job (any scalar can be added the same way)
TRAINING_SCALARS = ("TRAIN.loss", "EVAL.loss")
PERIOD = Duration.minutes(1)


def rule_alarm_name(stack: Stack, rule: str) -> str:
    """``<stack>-rule-<RuleName>-IssuesFound``: stable, so a subscription can filter on it."""
    return f"{stack.stack_name}-rule-{rule}-{ISSUES}"


def error_alarm_name(stack: Stack) -> str:
    return f"{stack.stack_name}-rules-{ERROR}"


def search(namespace: str, dimensions: tuple[str, ...], metric: str, statistic: str) -> str:
    """A SEARCH expression over exactly this dimension set (the schema in braces)."""
    schema = ",".join((namespace, *dimensions))
    return f"SEARCH('{{{schema}}} MetricName=\"{metric}\"', '{statistic}', {int(PERIOD.to_seconds())})"


def error_query(namespace: str) -> str:
    """Metrics Insights: the Error count summed over every RuleName-only series.

    SCHEMA(ns, RuleName) matches exactly that dimension set, so the per-job copies
    (TrainingJobName + RuleConfigurationName) are not counted twice. A SEARCH expression
    cannot back an alarm and metric math allows only 10 metrics: this query can.
    """
    # constants of this module and the stack, not input: no injection
    return f'SELECT SUM("{ERROR}") FROM SCHEMA("{namespace}", {", ".join(RULE_DIMENSIONS)})'  # noqa: S608


# ----------------------------------------------------------------------------- alarms


def rule_alarm_topic(stack: Stack, key: kms.IKey, emails: typing.Iterable[str]) -> sns.Topic:
    topic = sns.Topic(
        stack,
        "RuleAlarmTopic",
        display_name="trainguard rule alarms",
        master_key=key,
        enforce_ssl=True,
    )
    for email in emails:  # no filter policy: alarm notifications carry no message attributes
        topic.add_subscription(subs.EmailSubscription(email))
    CfnOutput(
        stack,
        "RuleAlarmTopicArn",
        value=topic.topic_arn,
        description="Subscribe here for rule IssuesFound/Error alarms (filter on AlarmName in the body)",
    )
    return topic


def build_rule_alarms(stack: TrainguardStack, topic: sns.ITopic, namespace: str) -> dict[str, cw.Alarm]:
    """One alarm per built-in rule on its IssuesFound count, and one on Error across all rules.

    Alarm actions only: with missing data not breaching, an alarm returns to OK a minute
    after the issue, and an OK mail per issue would double the noise.
    """
    action = cw_actions.SnsAction(topic)
    alarms: dict[str, cw.Alarm] = {}
    for rule in CHECKING_RULES:
        alarm = cw.Alarm(
            stack,
            f"Rule{rule}IssuesFoundAlarm",
            alarm_name=rule_alarm_name(stack, rule),
            alarm_description=(
                f"trainguard: the built-in rule {rule} found issues in a training job (any job; "
                "the job is in the rule's alert and on the bus)"
            ),
            metric=cw.Metric(
                namespace=namespace,
                metric_name=ISSUES,
                dimensions_map={RULE_DIMENSIONS[0]: rule},
                statistic="Sum",
                period=PERIOD,
            ),
            threshold=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(action)
        alarms[rule] = alarm
    errors = cw.Alarm(
        stack,
        "RulesErrorAlarm",
        alarm_name=error_alarm_name(stack),
        alarm_description=(
            "trainguard: a rule (any rule, custom ones included) could not be evaluated and is in Error"
        ),
        metric=cw.MathExpression(
            expression=error_query(namespace),
            period=PERIOD,
            label="Error statuses, all rules",
            using_metrics={},
        ),
        threshold=1,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        evaluation_periods=1,
        datapoints_to_alarm=1,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )
    errors.add_alarm_action(action)
    alarms[ERROR] = errors
    return alarms


# ----------------------------------------------------------------------------- dashboard


def _search_graph(title: str, expression: str, *, stacked: bool = False, width: int = 12) -> cw.GraphWidget:
    return cw.GraphWidget(
        title=title,
        left=[cw.MathExpression(expression=expression, period=PERIOD, label="", using_metrics={})],
        stacked=stacked,
        width=width,
        height=6,
    )


def _lines(title: str, metrics: list[cw.IMetric], width: int = 8, **kwargs: typing.Any) -> cw.GraphWidget:
    return cw.GraphWidget(title=title, left=metrics, width=width, height=6, **kwargs)


def build_dashboard(stack: TrainguardStack, namespace: str) -> cw.Dashboard:
    header = (
        "# trainguard\n"
        f"Rule outcomes and training curves come from the functions' EMF metrics (namespace "
        f"`{namespace}`); the pipeline rows from Lambda, SQS and EventBridge."
    )
    functions = stack.functions
    rule_outcomes: list[cw.IWidget] = [
        _search_graph(
            f"{ISSUES} by rule (count per minute)",
            search(namespace, RULE_DIMENSIONS, ISSUES, "Sum"),
            stacked=True,
        ),
        _search_graph(
            f"{ERROR} by rule (count per minute)",
            search(namespace, RULE_DIMENSIONS, ERROR, "Sum"),
            stacked=True,
        ),
    ]
    rule_alarm_list: list[cw.IAlarm] = list(stack.rule_alarms.values())
    alarm_status = cw.AlarmStatusWidget(
        title="Rule alarms (IssuesFound per built-in rule, Error across rules)",
        alarms=rule_alarm_list,
        width=24,
        height=4,
    )
    scalars = [
        _search_graph(
            f"{name} by training job (average per minute)",
            search(namespace, JOB_DIMENSIONS, name, "Average"),
        )
        for name in TRAINING_SCALARS
    ]
    evaluate = functions.get("evaluate")
    duration: list[cw.IMetric] = (
        [
            evaluate.metric_duration(statistic="p50", period=PERIOD, label="evaluate p50"),
            evaluate.metric_duration(statistic="p95", period=PERIOD, label="evaluate p95"),
        ]
        if evaluate is not None
        else []
    )
    per_function = [
        _lines("evaluate duration (ms)", duration),
        _lines(
            "Invocations per function",
            [
                fn.metric_invocations(period=PERIOD, statistic="Sum", label=fid)
                for fid, fn in functions.items()
            ],
        ),
        _lines(
            "Errors per function",
            [fn.metric_errors(period=PERIOD, statistic="Sum", label=fid) for fid, fn in functions.items()],
        ),
        _lines(
            "Throttles per function",
            [fn.metric_throttles(period=PERIOD, statistic="Sum", label=fid) for fid, fn in functions.items()],
        ),
    ]
    queues = []
    for qid, queue in stack.queues.items():
        queues.append(
            cw.GraphWidget(
                title=f"{qid} queue: age of oldest message (s) / visible messages",
                left=[
                    queue.metric_approximate_age_of_oldest_message(
                        period=PERIOD, statistic="Maximum", label="age of oldest (s)"
                    )
                ],
                right=[
                    queue.metric_approximate_number_of_messages_visible(
                        period=PERIOD, statistic="Maximum", label="visible"
                    )
                ],
                width=8,
                height=6,
            )
        )
    dlqs = _lines(
        "Dead-letter queue depths",
        [
            dlq.metric_approximate_number_of_messages_visible(period=PERIOD, statistic="Maximum", label=name)
            for name, dlq in stack.dlqs.items()
        ],
    )
    failed: list[cw.IMetric] = [
        cw.Metric(
            namespace="AWS/Events",
            metric_name="FailedInvocations",
            # rules on a custom bus report EventBusName + RuleName; default-bus rules RuleName only
            dimensions_map={"EventBusName": stack.bus.event_bus_name, "RuleName": rule.rule_name},
            statistic="Sum",
            period=PERIOD,
            label=f"bus rule {rid}",
        )
        for rid, rule in stack.rules.items()
    ]
    failed += [
        cw.Metric(
            namespace="AWS/Events",
            metric_name="FailedInvocations",
            dimensions_map={"RuleName": rule.rule_name},
            statistic="Sum",
            period=PERIOD,
            label=f"schedule {fid}",
        )
        for fid, rule in stack.schedules.items()
    ]
    eventbridge = _lines("EventBridge failed invocations per rule", failed)
    dashboard = cw.Dashboard(
        stack,
        "Dashboard",
        dashboard_name=stack.stack_name,
        default_interval=Duration.hours(3),
        widgets=[
            [cw.TextWidget(markdown=header, width=24, height=2)],
            [cw.TextWidget(markdown="## Rule outcomes", width=24, height=1)],
            rule_outcomes,
            [alarm_status],
            [cw.TextWidget(markdown="## Training scalars", width=24, height=1)],
            scalars,
            [cw.TextWidget(markdown="## Pipeline health", width=24, height=1)],
            per_function[:3],
            [per_function[3], *queues, dlqs],
            [eventbridge],
        ],
    )
    CfnOutput(stack, "DashboardName", value=stack.stack_name, description="The CloudWatch dashboard")
    return dashboard
