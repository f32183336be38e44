"""DeadRelu: too many ReLU units of a layer are (almost) never active."""

from __future__ import annotations

from trainguard.format.documents import Mode
from trainguard.rules._common import Percent, Regex, missing_statistic
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: SageMaker's default ``tensor_regex``: the names of the hook's ``relu_output`` collection
DEFAULT_REGEX = ".*relu_output"


class DeadReluConfig(RuleConfig):
    tensor_regex: Regex = DEFAULT_REGEX
    threshold_inactivity: Percent = 1.0
    #: SageMaker: 50 (see ``trainguard.rules.catalog.DEPARTURES``)
    threshold_layer: Percent = 70.0
    #: trainguard: the mode judged (None: TRAIN and GLOBAL, see the rule's docstring)
    mode: Mode | None = None


class DeadReluState(RuleState):
    #: layers examined so far; 0 at the end means no tensor carried ``unit_active``
    layers_checked: int = 0
    #: tensors matching the regex (with or without ``unit_active``)
    tensors_seen: int = 0


def inactive_share(unit_fractions: list[float], threshold_percent: float) -> float:
    """Percent of units whose fraction (0..1) is below ``threshold_percent`` %."""
    if not unit_fractions:
        return 0.0
    below = sum(1 for f in unit_fractions if f * 100.0 < threshold_percent)
    return 100.0 * below / len(unit_fractions)


class DeadRelu(Rule[DeadReluConfig, DeadReluState]):
    """Fires when, in one layer, more than ``threshold_layer`` % of the units are dead.

    Reads ``stats.unit_active`` (per unit: the fraction of the batch's samples in which the
    unit is > 0) of tensors matching ``tensor_regex`` (with the default regex, also every
    tensor of the hook's ``relu_output`` collection, which that regex stands for). A unit is
    dead when it is active in less than ``threshold_inactivity`` % of the samples.

    ``mode`` (trainguard): None judges TRAIN and GLOBAL batches. An EVAL batch is often small
    (a few samples per step) and run under ``no_grad`` in eval mode: at the first evaluation of
    a healthy CNN, 53% of a ReLU layer's units were active in under 1% of its samples (15 of
    100 clean runs alarmed, issue 10). Give ``mode`` EVAL to judge evaluations.

    Choices: each step, worker and layer is judged on its own batch (no accumulation across
    steps, so one unlucky batch of a tiny size can fire; the hook reports ``samples``);
    tensors without ``unit_active`` are skipped (their statistics cannot tell units apart).
    """

    name = "DeadRelu"
    Config = DeadReluConfig
    State = DeadReluState
    summary = "More than threshold_layer % of a layer's ReLU units are inactive."
    advice = (
        "Lower the learning rate, use LeakyReLU/ELU/GELU, check the weight initialisation and "
        "bias init (small positive), and normalise the inputs."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        regex = self.config.tensor_regex
        # the default regex names the relu_output collection's tensors: turn that collection on
        source = ("relu_output",) if regex == DEFAULT_REGEX else ()
        modes: tuple[Mode, ...] = (self.config.mode,) if self.config.mode else ("TRAIN", "GLOBAL")
        return (
            RuleInput(
                "ReLU outputs", collections=source, regex=(regex,), statistics=("unit_active",), modes=modes
            ),
        )

    def coverage(self, state: DeadReluState) -> Coverage:
        return self.covered(
            state.layers_checked,
            "ReLU layer outputs",
            received=[state.tensors_seen],
            reason=missing_statistic(state.tensors_seen, "tensors", "unit_active"),
        )

    def update(self, state: DeadReluState, step: StepData) -> tuple[DeadReluState, list[Finding]]:
        cfg = self.config
        for view in step.select(self.reads()[0]):
            state.tensors_seen += 1
            stats = view.stats
            if stats is None or not stats.unit_active:
                continue
            state.layers_checked += 1
            share = inactive_share(stats.unit_active, cfg.threshold_inactivity)
            if share > cfg.threshold_layer:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: {fmt(share)}% of the {len(stats.unit_active)} units of {view.name} "
                        f"(worker {view.worker}, {view.mode}) are active in less than "
                        f"{fmt(cfg.threshold_inactivity)}% of samples; "
                        f"threshold_layer={fmt(cfg.threshold_layer)}%.",
                        tensor=view.name,
                        value=share,
                        threshold=cfg.threshold_layer,
                    )
                ]
        return state, []
