"""SaturatedActivation: too many tanh/sigmoid units of a layer are saturated."""

from __future__ import annotations

import math

from pydantic import model_validator

from trainguard.rules._common import Finite, NameList, Percent, RegexList, missing_statistic
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt
from trainguard.rules.dead_relu import inactive_share

#: SageMaker's default ``tensor_regex`` (one regex, two alternatives): the hook's
#: ``tanh_input`` and ``sigmoid_input`` collections
DEFAULT_REGEX = ".*tanh_input|.*sigmoid_input"


class SaturatedActivationConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = (DEFAULT_REGEX,)
    threshold_tanh_min: Finite = -9.4999
    threshold_tanh_max: Finite = 9.4999
    threshold_sigmoid_min: Finite = -23.0
    threshold_sigmoid_max: Finite = 16.99999
    threshold_inactivity: Percent = 1.0
    threshold_layer: Percent = 50.0

    @model_validator(mode="after")
    def _ordered(self) -> SaturatedActivationConfig:
        if self.threshold_tanh_min >= self.threshold_tanh_max:
            raise ValueError("threshold_tanh_min must be below threshold_tanh_max")
        if self.threshold_sigmoid_min >= self.threshold_sigmoid_max:
            raise ValueError("threshold_sigmoid_min must be below threshold_sigmoid_max")
        return self


class SaturatedActivationState(RuleState):
    layers_checked: int = 0
    #: layers skipped because the hook's band differs from the configured one
    band_mismatches: int = 0
    tensors_seen: int = 0


class SaturatedActivation(Rule[SaturatedActivationConfig, SaturatedActivationState]):
    """Fires when, in one layer, more than ``threshold_layer`` % of units are saturated.

    Reads ``stats.unit_in_band`` (per unit: fraction of samples whose input lies inside
    ``stats.band``) of tensors chosen by ``collection_names``/``tensor_regex`` (default: tanh
    and sigmoid inputs). A unit is saturated when its input is inside the non-saturated band
    in less than ``threshold_inactivity`` % of the samples (DeadRelu's logic on the band).

    Choices: the band is tanh's when "tanh" is in the tensor name, else sigmoid's; a tensor is
    judged only when the hook measured exactly that band (``stats.band`` equal to the
    configured thresholds, 1e-6 relative), since per-unit fractions cannot be re-derived
    for another band (counted in ``band_mismatches``); one batch per step and worker.
    The default ``tensor_regex`` is SageMaker's string, one regex with two alternatives.
    """

    name = "SaturatedActivation"
    Config = SaturatedActivationConfig
    State = SaturatedActivationState
    summary = "More than threshold_layer % of a layer's tanh/sigmoid units are saturated."
    advice = (
        "Normalise the layer inputs (batch/layer norm), use a smaller weight initialisation or "
        "learning rate, or switch to non-saturating activations."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        regex = tuple(cfg.tensor_regex or ())
        source = ("tanh_input", "sigmoid_input") if regex == (DEFAULT_REGEX,) else ()
        return (
            RuleInput(
                "tanh/sigmoid inputs",
                collections=tuple(dict.fromkeys((*(cfg.collection_names or ()), *source))),
                regex=regex,
                statistics=("unit_in_band", "band"),
            ),
        )

    def coverage(self, state: SaturatedActivationState) -> Coverage:
        reason = missing_statistic(state.tensors_seen, "tensors", "unit_in_band")
        if state.band_mismatches:
            reason = (
                f"{state.band_mismatches:,} activation inputs were measured with a band other than "
                "the configured thresholds (set the hook's tanh_input/sigmoid_input unit_band to them)"
            )
        return self.covered(
            state.layers_checked, "activation layer inputs", received=[state.tensors_seen], reason=reason
        )

    def update(
        self, state: SaturatedActivationState, step: StepData
    ) -> tuple[SaturatedActivationState, list[Finding]]:
        cfg = self.config
        for view in step.select(self.reads()[0]):
            state.tensors_seen += 1
            stats = view.stats
            if stats is None or not stats.unit_in_band or stats.band is None:
                continue
            if "tanh" in view.name:
                band = (cfg.threshold_tanh_min, cfg.threshold_tanh_max)
            else:
                band = (cfg.threshold_sigmoid_min, cfg.threshold_sigmoid_max)
            if not all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(stats.band, band, strict=True)):
                state.band_mismatches += 1
                continue
            state.layers_checked += 1
            share = inactive_share(stats.unit_in_band, cfg.threshold_inactivity)
            if share > cfg.threshold_layer:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: {fmt(share)}% of the {len(stats.unit_in_band)} units of {view.name} "
                        f"(worker {view.worker}, {view.mode}) have inputs inside [{fmt(band[0])}, "
                        f"{fmt(band[1])}] "
                        f"in less than {fmt(cfg.threshold_inactivity)}% of samples; "
                        f"threshold_layer={fmt(cfg.threshold_layer)}%.",
                        tensor=view.name,
                        value=share,
                        threshold=cfg.threshold_layer,
                    )
                ]
        return state, []
