"""CreateXgboostReport (XGBoost): SageMaker's report "rule" — a report, not a check.

Accepted in a job's DebugRuleConfigurations so SageMaker configs keep working: it never
fires and ends NoIssuesFound. The report itself (metrics over rounds, feature importance,
tree depth, confusion matrix or residuals) is written to ``report/xgboost-report.html``
by ``trainguard report`` and by the stack's report function when the job ends.
"""

from __future__ import annotations

from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData


class CreateXgboostReportConfig(RuleConfig):
    pass


class CreateXgboostReportState(RuleState):
    steps_seen: int = 0
    #: steps that held XGBoost data (metrics, importances or trees)
    steps_with_data: int = 0


class CreateXgboostReport(Rule[CreateXgboostReportConfig, CreateXgboostReportState]):
    """Never fires; counts the steps it saw. The XGBoost report is produced at job end."""

    name = "CreateXgboostReport"
    Config = CreateXgboostReportConfig
    State = CreateXgboostReportState
    summary = "Writes the XGBoost training report when the job ends (never fires)."
    #: a report, not a check: no IssuesFound alarm is created for it
    kind = "report"
    advice = "Open report/xgboost-report.html next to the job's data."

    def reads(self) -> tuple[RuleInput, ...]:
        # what the report shows; none is needed for the rule's status
        return (
            RuleInput("XGBoost metrics", collections=("metrics",), scalars=True, required=False),
            RuleInput(
                "feature importances", collections=("feature_importance",), scalars=True, required=False
            ),
            RuleInput("XGBoost trees", collections=("trees",), statistics=("numel", "max"), required=False),
        )

    def coverage(self, state: CreateXgboostReportState) -> Coverage:
        return self.covered(
            state.steps_with_data,
            "steps of XGBoost data for the report",
            "collected",
            received=[state.steps_with_data] * 3,
        )

    def update(
        self, state: CreateXgboostReportState, step: StepData
    ) -> tuple[CreateXgboostReportState, list[Finding]]:
        state.steps_seen += 1
        inputs = self.reads()
        scalars = any(
            i.selects(name, s.collections, mode, scalar=True)
            for mode, name, _, s in step.scalars()
            for i in inputs
        )
        if scalars or any(True for i in inputs if not i.scalars for _ in step.select(i)):
            state.steps_with_data += 1
        return state, []
