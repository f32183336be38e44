"""VanishingGradient: a gradient tensor's mean absolute value fell below a threshold."""

from __future__ import annotations

from trainguard.rules._common import NonNegative, finite, missing_statistic
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt


class VanishingGradientConfig(RuleConfig):
    threshold: NonNegative = 1e-7


class VanishingGradientState(RuleState):
    #: gradient tensors examined so far (0 at the end: the job saved no gradients)
    tensors_checked: int = 0
    #: gradient tensors received (with or without the statistic)
    tensors_seen: int = 0


class VanishingGradient(Rule[VanishingGradientConfig, VanishingGradientState]):
    """Fires when ``mean(abs(g)) < threshold`` for any gradient tensor of any worker.

    Reads the ``mean_abs`` statistic of every tensor in the ``gradients`` collection, in every
    mode. Choices: empty tensors and tensors without statistics are skipped; a NaN or
    infinite ``mean_abs`` is ExplodingTensor's business and does not fire here; an all-zero
    gradient (mean_abs 0) fires, as in SageMaker.
    """

    name = "VanishingGradient"
    Config = VanishingGradientConfig
    State = VanishingGradientState
    summary = "A gradient's mean absolute value fell below threshold: the gradient vanished."
    advice = (
        "Use ReLU-family activations, residual connections or normalisation layers, a better "
        "weight initialisation (He/Xavier), or a higher learning rate; check that every layer "
        "is connected to the loss."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        return (RuleInput("gradients", collections=("gradients",), statistics=("numel", "mean_abs")),)

    def coverage(self, state: VanishingGradientState) -> Coverage:
        return self.covered(
            state.tensors_checked,
            "gradient tensors",
            received=[state.tensors_seen],
            reason=missing_statistic(state.tensors_seen, "gradient tensors", "mean_abs"),
        )

    def update(
        self, state: VanishingGradientState, step: StepData
    ) -> tuple[VanishingGradientState, list[Finding]]:
        threshold = self.config.threshold
        for view in step.tensors(collections=["gradients"]):
            state.tensors_seen += 1
            stats = view.stats
            if stats is None or not stats.numel or stats.mean_abs is None or not finite(stats.mean_abs):
                continue
            state.tensors_checked += 1
            if stats.mean_abs < threshold:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: gradient {view.name} (worker {view.worker}, {view.mode}) has "
                        f"mean(abs)={fmt(stats.mean_abs)} < threshold={fmt(threshold)}.",
                        tensor=view.name,
                        value=stats.mean_abs,
                        threshold=threshold,
                    )
                ]
        return state, []
