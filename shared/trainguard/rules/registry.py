"""The explicit rule registry: every rule class, by SageMaker name. No import-time magic.

A rule missing here does not exist; ``tests/rules/test_registry.py`` fails when a rule
module is not registered, has no golden test, or is missing from ``trainguard rules``.

Kinds (``Rule.kind``): "model" rules are driven by ``update`` per step; "clock" rules
(StalledTrainingRule) also need ``check(state, now)`` from a timer; "cross-job" rules
(SimilarAcrossRuns) need ``compare(state, step, other_step)`` with another job's step;
"report" rules (CreateXgboostReport) never fire.
"""

from __future__ import annotations

from typing import Any

from trainguard.rules.all_zero import AllZero
from trainguard.rules.base import AnyRule, Rule
from trainguard.rules.check_input_images import CheckInputImages
from trainguard.rules.class_imbalance import ClassImbalance
from trainguard.rules.confusion import Confusion
from trainguard.rules.create_xgboost_report import CreateXgboostReport
from trainguard.rules.data_not_normalized import DataNotNormalized
from trainguard.rules.dead_relu import DeadRelu
from trainguard.rules.exploding_tensor import ExplodingTensor
from trainguard.rules.feature_importance_overweight import FeatureImportanceOverweight
from trainguard.rules.gradient_norm_ratio import GradientNormRatio
from trainguard.rules.loss_converged import LossConverged
from trainguard.rules.loss_divergence import LossDivergence
from trainguard.rules.loss_not_decreasing import LossNotDecreasing
from trainguard.rules.nlp_sequence_ratio import NLPSequenceRatio
from trainguard.rules.oscillating_loss import OscillatingLoss
from trainguard.rules.overfit import Overfit
from trainguard.rules.overtraining import Overtraining
from trainguard.rules.poor_weight_initialization import PoorWeightInitialization
from trainguard.rules.saturated_activation import SaturatedActivation
from trainguard.rules.similar_across_runs import SimilarAcrossRuns
from trainguard.rules.stalled_training import StalledTrainingRule
from trainguard.rules.tensor_variance import TensorVariance
from trainguard.rules.tree_depth import TreeDepth
from trainguard.rules.unchanged_tensor import UnchangedTensor
from trainguard.rules.vanishing_gradient import VanishingGradient
from trainguard.rules.weight_update_ratio import WeightUpdateRatio

_ALL: tuple[type[Rule[Any, Any]], ...] = (
    # SageMaker's default-style model rules (issue 3)
    LossNotDecreasing,
    VanishingGradient,
    ExplodingTensor,
    DeadRelu,
    Overfit,
    # the other SageMaker model rules (issue 4)
    Overtraining,
    SaturatedActivation,
    PoorWeightInitialization,
    WeightUpdateRatio,
    AllZero,
    UnchangedTensor,
    TensorVariance,
    ClassImbalance,
    Confusion,
    CheckInputImages,
    NLPSequenceRatio,
    FeatureImportanceOverweight,
    TreeDepth,
    CreateXgboostReport,
    SimilarAcrossRuns,
    StalledTrainingRule,
    # trainguard additions
    OscillatingLoss,
    DataNotNormalized,
    GradientNormRatio,
    LossDivergence,
    # opt-in: early stopping's signal, never in the default rules
    LossConverged,
)

RULES: dict[str, type[Rule[Any, Any]]] = {cls.name: cls for cls in _ALL}

#: rules that can find issues (the stack alarms on each); "report" rules never fire
CHECKING_RULES: tuple[str, ...] = tuple(name for name, cls in RULES.items() if cls.kind != "report")


def builtin_rules() -> dict[str, type[AnyRule]]:
    """Every built-in rule by name: the model rules (``RULES``), then the system (profiler) rules."""
    from trainguard.rules.profiler import PROFILER_RULES

    return {**RULES, **PROFILER_RULES}
