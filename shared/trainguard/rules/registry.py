"""The explicit rule registry: every rule class, by SageMaker name. No import-time magic.

A rule missing here does not exist; ``tests/rules/test_registry.py`` fails when a rule
module is not registered, has no golden test, or is missing from ``trainguard rules``.
"""

from __future__ import annotations

from typing import Any

from trainguard.rules.base import Rule
from trainguard.rules.dead_relu import DeadRelu
from trainguard.rules.exploding_tensor import ExplodingTensor
from trainguard.rules.loss_not_decreasing import LossNotDecreasing
from trainguard.rules.overfit import Overfit
from trainguard.rules.vanishing_gradient import VanishingGradient

_ALL: tuple[type[Rule[Any, Any]], ...] = (
    LossNotDecreasing,
    VanishingGradient,
    ExplodingTensor,
    DeadRelu,
    Overfit,
)

RULES: dict[str, type[Rule[Any, Any]]] = {cls.name: cls for cls in _ALL}
