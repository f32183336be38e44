"""What ``trainguard rules`` prints: every registered rule, its kind, summary and parameters.

Per parameter: trainguard's default, SageMaker's documented default (``—`` for a parameter
SageMaker does not have) and, where they differ, why. An explicitly given SageMaker parameter
keeps its documented meaning; the differences are what trainguard does when it is not given.
Custom rules (``trainguard.rules.plugins``, from ``TRAINGUARD_RULE_MODULES``) are listed after
the built-in model rules, with the module they come from.
"""

from __future__ import annotations

from typing import Any, TypedDict

from trainguard.rules.base import AnyRule
from trainguard.rules.plugins import load_plugins
from trainguard.rules.registry import RULES

#: not a SageMaker parameter (or not a SageMaker rule)
NOT_SAGEMAKER = "—"

#: rule -> parameter -> (SageMaker's documented default, why trainguard's differs)
DEPARTURES: dict[str, dict[str, tuple[str, str]]] = {
    "LossNotDecreasing": {
        "num_steps": (
            "10",
            "None = 50 training steps, compared as block means. SageMaker compares two saved losses "
            "num_steps apart; at its 500-step save cadence they were 500+ steps apart, with a loss "
            "every step 10 steps is mini-batch noise. Given, it is training steps between checks.",
        ),
        "diff_percent": (
            "0.0",
            "None = the noise-aware stall test (4 blocks within 4.5 x their robust noise, never fell "
            "or stopped at once); SageMaker's 0 fired on converged models' fluctuation and missed a "
            "learning rate cut 1e6-fold. Given, it is SageMaker's block comparison.",
        ),
        "horizon": (NOT_SAGEMAKER, "Blocks of a plateau after its first (4 blocks: 200 training steps)."),
        "increase_threshold_percent": (
            "5 (later documentation only)",
            "Off unless given: it belongs to the later documentation, whose diff_percent (0.1) and "
            "mode (GLOBAL) defaults trainguard does not use; its 5% branch alarmed on 60 of 100 "
            "healthy runs.",
        ),
    },
    "Overtraining": {
        "patience_train": (
            "5",
            "None = the training loss is not judged. SageMaker's 5 saved steps were 2,500 training "
            "steps at its 500-step cadence; with a loss every step it fired at step 5 on every run. "
            "Given, it counts training steps on a smoothed loss.",
        ),
        "patience_validation": ("10", "Counts evaluations (validation passes), not EVAL batches."),
        "delta": (
            "0.1",
            "None = delta_percent (relative). SageMaker's delta is absolute, in loss units; given, "
            "it keeps that meaning.",
        ),
        "delta_percent": (
            NOT_SAGEMAKER,
            "None (and delta None) = the validation loss judged against its own noise: the median "
            "of 3 evaluations below the best by one robust noise; the TRAIN loss (patience_train) "
            "on 1% of its best. Given, an improvement relative to the best loss.",
        ),
    },
    "Overfit": {
        "patience": (
            "1",
            "None = 3 consecutive evaluations: one validation pass over the ratio fired on 98 of 100 "
            "healthy runs.",
        ),
        "start_step": ("0", "Counts training steps, not saved or global steps."),
        "ratio_threshold": (
            "0.1",
            "None = the noise-aware test (validation loss and gap each 3 x their noise above the best "
            "evaluation, training loss lower); the relative ratio fired on healthy gaps at near-zero "
            "training loss (0.144 vs 0.065). Given, it is SageMaker's ratio.",
        ),
    },
    "AllZero": {
        "collection_names": (
            "None (one of collection_names, tensor_regex is required)",
            "Neither given = the weights (every tensor fired on labels and masks; weights, biases "
            "and gradients on zero-initialised biases: 13 of 54 clean runs of the accuracy "
            "benchmark's dev split, weights alone 0 with the same recall).",
        ),
    },
    "UnchangedTensor": {
        "collection_names": (
            "None (one of collection_names, tensor_regex is required)",
            "Neither given = weights, biases and gradients (every tensor fired on inputs that repeat).",
        ),
    },
    "WeightUpdateRatio": {
        "large_threshold": (
            "10",
            "None (and small_threshold None) = each tensor's ratio against its own running level: "
            "10x above or 100x below it for 2 saves in a row (a 30x learning-rate blow-up gave "
            "ratios of 3-7, a 1e6-fold collapse 8.8e-7: both inside SageMaker's bounds). Either "
            "given = SageMaker's check, the other at its SageMaker default.",
        ),
        "small_threshold": ("1e-8", "See large_threshold."),
    },
    "TensorVariance": {
        "max_threshold": (
            "None",
            "Neither threshold given = max 10 and min 1e-5 on weights of 2+ dimensions (SageMaker's "
            "defaults can never fire); one given keeps SageMaker's meaning for both.",
        ),
        "min_threshold": ("None", "See max_threshold."),
    },
    "CheckInputImages": {
        "regex": (
            ".*hybridsequential0_input_0",
            "None = image-shaped tensors of the inputs collection: SageMaker's default is MXNet "
            "Gluon's name, which no trainguard hook writes.",
        ),
    },
    "NLPSequenceRatio": {
        "token_thresholds_percent": (
            "50.0",
            "70: short sequences are half padding in healthy batches; on the accuracy benchmark's "
            "dev split 50% fired on 6 more unharmed (near-miss) runs than 70%, with the same recall "
            "(docs/accuracy.md).",
        ),
        "tensor_regex": (
            ".*embedding0_input_0",
            "None = integer tensors of the inputs collection (token ids): SageMaker's default is "
            "MXNet Gluon's name, which no trainguard hook writes.",
        ),
    },
    "Confusion": {
        "min_diag": (
            "0.9",
            "None = the relative test (a class recalled significantly below 0.9 x the other classes); "
            "either threshold given = SageMaker's absolute test on the column-normalised matrix.",
        ),
        "max_off_diag": ("0.1", "See min_diag."),
        "mode": (NOT_SAGEMAKER, "EVAL: one matrix per validation pass (None: every step, as SageMaker)."),
        "start_step": (NOT_SAGEMAKER, "None = the first validation pass is a warm-up and not judged."),
    },
    "ClassImbalance": {
        "argmax": (
            "False",
            "None = argmax when the predictions are scores of shape (N, C) next to N labels.",
        ),
        "mode": (
            NOT_SAGEMAKER,
            "None = EVAL labels once any were saved, else TRAIN, over the last `samples` labels "
            "(the whole job's counts fired on 7-8 of 10 clean runs).",
        ),
    },
    "PoorWeightInitialization": {
        "steps": ("10", "Counts training steps from the first, not saved steps."),
    },
    "DeadRelu": {
        "threshold_layer": (
            "50.0",
            "70: on the accuracy benchmark's dev split 50% fired on 5 of 54 clean runs and missed 2 "
            "of 3 dead layers (alerting early, on the healthy prefix); 70% caught all 3 with no "
            "clean-run alarm (docs/accuracy.md).",
        ),
        "mode": (
            NOT_SAGEMAKER,
            "None = TRAIN and GLOBAL batches: a small EVAL batch made 53% of a healthy CNN's units "
            "look dead.",
        ),
    },
}
#: trainguard rules that SageMaker does not have
TRAINGUARD_ONLY = {
    "OscillatingLoss",
    "DataNotNormalized",
    "GradientNormRatio",
    "LossDivergence",
    "LossConverged",
}


class ParameterRow(TypedDict):
    name: str
    #: trainguard's default as SageMaker would pass it ("None", "10"); None for a required one
    default: str | None
    #: SageMaker's documented default, or "—"
    sagemaker: str
    #: why they differ ("" when they do not)
    why: str


class RuleRow(TypedDict):
    name: str
    #: "model", "clock", "cross-job" (see ``registry``) or "profiler"
    kind: str
    summary: str
    advice: str
    #: the rule's test and its false-alarm budget ("" where the rule does not state them)
    method: str
    false_alarm_budget: str
    #: parameter -> default as SageMaker would pass it ("None", "10", "True", "a,b");
    #: None for a required parameter
    parameters: dict[str, str | None]
    required: list[str]
    #: per parameter: trainguard's default, SageMaker's, and why they differ
    details: list[ParameterRow]
    #: "trainguard" for a built-in rule, else the custom rule's module
    source: str


def sagemaker_string(value: Any) -> str:
    """A default value written the way it appears in ``RuleParameters``."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def describe_rules(*, profiler: bool = True) -> list[RuleRow]:
    """One row per registered rule: the model rules in registry order, the custom rules of
    ``TRAINGUARD_RULE_MODULES``, then (``profiler``) the profiler rules of
    ``trainguard.rules.profiler.PROFILER_RULES``."""
    from trainguard.rules.profiler import PROFILER_RULES

    plugins = load_plugins()
    registries: list[dict[str, type[AnyRule]]] = [dict(RULES), dict(plugins.custom)]
    if profiler:
        registries.append(dict(PROFILER_RULES))
    rows: list[RuleRow] = []
    for name, cls in ((n, c) for registry in registries for n, c in registry.items()):
        params: dict[str, str | None] = {}
        required: list[str] = []
        details: list[ParameterRow] = []
        custom = name in plugins.origins
        for field_name, info in cls.Config.model_fields.items():
            default = None if info.is_required() else sagemaker_string(info.default)
            params[field_name] = default
            if default is None:
                required.append(field_name)
            sagemaker, why = DEPARTURES.get(name, {}).get(field_name, (default or "required", ""))
            if custom or name in TRAINGUARD_ONLY:
                sagemaker, why = NOT_SAGEMAKER, ""
            details.append(ParameterRow(name=field_name, default=default, sagemaker=sagemaker, why=why))
        rows.append(
            RuleRow(
                name=name,
                kind=cls.kind,
                summary=cls.summary,
                advice=cls.advice,
                method=getattr(cls, "method", ""),
                false_alarm_budget=getattr(cls, "false_alarm_budget", ""),
                parameters=params,
                required=required,
                details=details,
                source=plugins.origins.get(name, "trainguard"),
            )
        )
    return rows
