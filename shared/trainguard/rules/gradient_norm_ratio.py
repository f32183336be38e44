"""GradientNormRatio (AUTOTRAINER): first-layer vs last-layer gradient norms."""

from __future__ import annotations

from pydantic import model_validator

from trainguard.rules._common import NameList, NonNegative, RegexList, finite, select, tensor_input
from trainguard.rules.base import (
    Coverage,
    Finding,
    Rule,
    RuleConfig,
    RuleInput,
    RuleState,
    StepData,
    TensorView,
    fmt,
)


class GradientNormRatioConfig(RuleConfig):
    #: None (and no tensor_regex): the ``gradients`` collection
    collection_names: NameList = None
    tensor_regex: RegexList = None
    vanishing_ratio: NonNegative = 1e-3
    vanishing_norm: NonNegative = 1e-4
    exploding_ratio: NonNegative = 70.0

    @model_validator(mode="after")
    def _ordered(self) -> GradientNormRatioConfig:
        if self.vanishing_ratio >= self.exploding_ratio:
            raise ValueError("vanishing_ratio must be below exploding_ratio")
        return self


class GradientNormRatioState(RuleState):
    steps_judged: int = 0
    tensors_seen: int = 0


class GradientNormRatio(Rule[GradientNormRatioConfig, GradientNormRatioState]):
    """Fires on a vanishing gradient (``||g_first|| / ||g_last|| < vanishing_ratio`` and
    ``||g_first|| < vanishing_norm``) or an exploding one (the ratio > ``exploding_ratio``).

    After AUTOTRAINER's gradient checks. Reads the ``l2`` statistic of the gradient tensors
    (``gradients`` collection, or ``collection_names``/``tensor_regex``) per step and
    worker. First and last layer: the first and last selected tensor in the order the hook
    wrote them, which is the model's parameter order (the hook keeps it). Choice: when any
    selected name contains "weight", biases and other parameters are left out (AUTOTRAINER
    compares weight gradients); a zero last-layer norm skips the step.
    """

    name = "GradientNormRatio"
    Config = GradientNormRatioConfig
    State = GradientNormRatioState
    summary = "The first layer's gradient norm is vanishing or exploding relative to the last layer's."
    advice = (
        "Vanishing: use residual connections, normalisation, ReLU-family activations and a better "
        "initialisation. Exploding: clip gradients and lower the learning rate."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return (
            tensor_input(
                cfg.collection_names,
                cfg.tensor_regex,
                ("l2",),
                default_collections=("gradients",),
                what=None if cfg.collection_names or cfg.tensor_regex else "gradients",
            ),
        )

    def coverage(self, state: GradientNormRatioState) -> Coverage:
        reason = ""
        if state.tensors_seen:
            reason = (
                f"{state.tensors_seen:,} gradient tensors arrived, but no step had two with a finite 'l2' "
                "statistic and a non-zero last-layer norm on one worker"
            )
        return self.covered(
            state.steps_judged,
            "first/last-layer gradient ratios",
            received=[state.tensors_seen],
            reason=reason,
        )

    def update(
        self, state: GradientNormRatioState, step: StepData
    ) -> tuple[GradientNormRatioState, list[Finding]]:
        cfg = self.config
        by_worker: dict[tuple[int, str], list[TensorView]] = {}
        for view, stats in select(
            step, cfg.collection_names, cfg.tensor_regex, default_collections=("gradients",)
        ):
            state.tensors_seen += 1
            if stats.l2 is None:
                continue  # not computed: not a layer this step can compare
            by_worker.setdefault((view.worker, view.mode), []).append(view)
        for (worker, mode), views in by_worker.items():
            weights = [v for v in views if "weight" in v.name]
            chosen = weights or views
            if len(chosen) < 2:
                continue
            first, last = chosen[0], chosen[-1]
            assert first.stats is not None and last.stats is not None
            g_first, g_last = first.stats.l2, last.stats.l2
            if g_first is None or g_last is None or not (finite(g_first) and finite(g_last)) or g_last == 0:
                continue
            state.steps_judged += 1
            ratio = g_first / g_last
            pair = (
                f"||{first.name}||/||{last.name}|| = {fmt(g_first)}/{fmt(g_last)} = {fmt(ratio)} "
                f"(worker {worker}, {mode})"
            )
            if ratio < cfg.vanishing_ratio and g_first < cfg.vanishing_norm:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: vanishing gradient: {pair} < "
                        f"vanishing_ratio={fmt(cfg.vanishing_ratio)} "
                        f"and ||{first.name}|| < vanishing_norm={fmt(cfg.vanishing_norm)}.",
                        tensor=first.name,
                        value=ratio,
                        threshold=cfg.vanishing_ratio,
                    )
                ]
            if ratio > cfg.exploding_ratio:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: exploding gradient: {pair} > "
                        f"exploding_ratio={fmt(cfg.exploding_ratio)}.",
                        tensor=first.name,
                        value=ratio,
                        threshold=cfg.exploding_ratio,
                    )
                ]
        return state, []
