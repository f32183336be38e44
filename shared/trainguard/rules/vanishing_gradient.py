"""VanishingGradient: a gradient tensor's mean absolute value fell below a threshold."""

from __future__ import annotations

from trainguard.rules._common import NonNegative, finite, missing_statistic
from trainguard.rules._structure import BY_CONSTRUCTION, structural, structural_reason
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt


class VanishingGradientConfig(RuleConfig):
    threshold: NonNegative = 1e-7


class VanishingGradientState(RuleState):
    #: gradient tensors examined so far (0 at the end: the job saved no gradients)
    tensors_checked: int = 0
    #: gradient tensors received (with or without the statistic)
    tensors_seen: int = 0
    #: of those, zero by the model's construction (the manifest's structure): not judged
    structural: int = 0


class VanishingGradient(Rule[VanishingGradientConfig, VanishingGradientState]):
    """Fires when ``mean(abs(g)) < threshold`` for any gradient tensor of any worker.

    Reads the ``mean_abs`` statistic of every tensor in the ``gradients`` collection, in every
    mode. Choices: empty tensors and tensors without statistics are skipped; a NaN or
    infinite ``mean_abs`` is ExplodingTensor's business and does not fire here; an all-zero
    gradient (mean_abs 0) fires, as in SageMaker. Gradients that are zero by the model's
    construction (the manifest's structure: a bias feeding BatchNorm, an attention key bias,
    ``trainguard.rules._structure``) are not judged: they fired at step 0 on every healthy
    network with such a layer (issue 17).
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
        reason = missing_statistic(state.tensors_seen, "gradient tensors", "mean_abs")
        if state.structural and state.structural == state.tensors_seen:
            reason = structural_reason(state.structural, "gradient tensors")
        return self.covered(
            state.tensors_checked, "gradient tensors", received=[state.tensors_seen], reason=reason
        )

    def update(
        self, state: VanishingGradientState, step: StepData
    ) -> tuple[VanishingGradientState, list[Finding]]:
        threshold = self.config.threshold
        for view in step.tensors(collections=["gradients"]):
            state.tensors_seen += 1
            if structural(step.structure, view.name, BY_CONSTRUCTION):
                state.structural += 1
                continue
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
