"""FeatureImportanceOverweight (XGBoost): a few features carry almost all the importance."""

from __future__ import annotations

from trainguard.rules._common import PositiveInt, Probability, RegexList, finite
from trainguard.rules.base import (
    Coverage,
    Finding,
    Rule,
    RuleConfig,
    RuleInput,
    RuleState,
    StepData,
    compiled,
    fmt,
)

#: SageMaker's default: the scalars the XGBoost hook saves in ``feature_importance``
DEFAULT_REGEX = ".*feature_importance/weight"


class FeatureImportanceOverweightConfig(RuleConfig):
    threshold: Probability = 0.8
    nfeatures: PositiveInt = 3
    tensor_regex: RegexList = (DEFAULT_REGEX,)


class FeatureImportanceOverweightState(RuleState):
    steps_judged: int = 0
    #: importances received (scalars, or tensor elements)
    importances_seen: int = 0


class FeatureImportanceOverweight(Rule[FeatureImportanceOverweightConfig, FeatureImportanceOverweightState]):
    """Fires when the ``nfeatures`` largest normalised feature importances sum to > ``threshold``.

    Reads, per step, worker and mode, every scalar or tensor matching ``tensor_regex``
    (smdebug's XGBoost hook saves one per feature: ``feature_importance/weight/f0``...): a
    scalar's value, a tensor's ``values`` (all elements) or, for a one-element tensor, its
    mean. Importances are normalised by their sum.

    Choices: a step is judged only when it has more than ``nfeatures`` features with a
    positive total (with ``nfeatures`` or fewer the top ones always hold 100%); negative or
    non-finite importances are ignored.
    """

    name = "FeatureImportanceOverweight"
    Config = FeatureImportanceOverweightConfig
    State = FeatureImportanceOverweightState
    summary = "The top nfeatures features hold more than threshold of the total importance."
    advice = (
        "Check for target leakage in the dominant features, add regularisation "
        "(colsample_bytree, subsample, max_depth) or engineer more informative features."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        regex = tuple(self.config.tensor_regex or ())
        source = ("feature_importance",) if regex == (DEFAULT_REGEX,) else ()
        # importances arrive as scalars (the XGBoost hook) or as tensors: either suffices
        return (
            RuleInput("feature importances", collections=source, regex=regex, scalars=True, required=False),
            RuleInput(
                "feature importances saved as tensors",
                regex=regex,
                statistics=("numel", "mean", "values"),
                required=False,
            ),
        )

    def coverage(self, state: FeatureImportanceOverweightState) -> Coverage:
        reason = ""
        if state.importances_seen:
            reason = (
                f"{state.importances_seen:,} importances arrived, but no step had more than "
                f"nfeatures={self.config.nfeatures} features with a positive total"
            )
        return self.covered(
            state.steps_judged,
            "steps of feature importances",
            "judged",
            received=[state.importances_seen] * 2,
            reason=reason,
        )

    def update(
        self, state: FeatureImportanceOverweightState, step: StepData
    ) -> tuple[FeatureImportanceOverweightState, list[Finding]]:
        cfg = self.config
        groups: dict[tuple[int, str], dict[str, float]] = {}
        patterns = cfg.tensor_regex or ()
        source = set(self.reads()[0].collections)
        for mode, name, worker, sc in step.scalars():
            if source.intersection(sc.collections) or any(compiled(p).match(name) for p in patterns):
                groups.setdefault((worker, mode), {})[name] = sc.value
        for view in step.select(self.reads()[1]):
            stats = view.stats
            if stats is None:
                continue
            group = groups.setdefault((view.worker, view.mode), {})
            if stats.values is not None:
                for i, v in enumerate(stats.values):
                    group[f"{view.name}[{i}]"] = v
            elif stats.numel == 1 and stats.mean is not None:
                group[view.name] = stats.mean
        state.importances_seen += sum(len(g) for g in groups.values())
        for (worker, group_mode), importances in sorted(groups.items()):
            valid = {k: v for k, v in importances.items() if finite(v) and v >= 0}
            total = sum(valid.values())
            if len(valid) <= cfg.nfeatures or total <= 0:
                continue
            state.steps_judged += 1
            top = sorted(valid.items(), key=lambda kv: (-kv[1], kv[0]))[: cfg.nfeatures]
            share = sum(v for _, v in top) / total
            if share > cfg.threshold:
                names = ", ".join(k for k, _ in top)
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: the top {cfg.nfeatures} of {len(valid)} features ({names}) "
                        f"hold {fmt(share)} of "
                        f"the importance (worker {worker}, {group_mode}) > threshold={fmt(cfg.threshold)}.",
                        tensor=top[0][0],
                        value=share,
                        threshold=cfg.threshold,
                    )
                ]
        return state, []
